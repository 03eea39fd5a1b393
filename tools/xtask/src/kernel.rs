//! The guest kernel: the image behind Debian's `linux-image-amd64`, downloaded once with
//! `apt-get download`, reduced to the kernel image and the few modules the bed loads, and
//! cached under target/xtask/kernel/.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::{deps, elf, proc};

/// The meta package whose dependency names the kernel image package.
const META_PACKAGE: &str = "linux-image-amd64";

/// VFIO modules to load, in a valid order; `true` means the module (or a built-in
/// equivalent) must exist. vfio_virqfd was merged into vfio in Linux 6.2.
const VFIO_ROOTS: &[(&str, bool)] = &[
    ("irqbypass", false),
    ("vfio", true),
    ("vfio_iommu_type1", true),
    ("vfio_virqfd", false),
    ("vfio_pci_core", false),
    ("vfio_pci", true),
];

/// The kernel's own NVMe driver, for `--kernel-nvme`.
const NVME_ROOTS: &[(&str, bool)] = &[("nvme_core", true), ("nvme", true)];

/// A cached guest kernel.
#[derive(Debug, Clone)]
pub struct GuestKernel {
    /// The kernel release (`uname -r`), e.g. `6.1.0-57-amd64`.
    pub release: String,
    /// The Debian package it came from, e.g. `linux-image-6.1.0-57-amd64_6.1.192-3`.
    pub package: String,
    /// The compressed bzImage.
    pub vmlinuz: PathBuf,
    /// The uncompressed ELF kernel with a PVH entry note, when it could be extracted.
    pub vmlinux: Option<PathBuf>,
    /// Directory holding `<module>.ko` files.
    pub module_dir: PathBuf,
    /// VFIO module names in insmod order.
    pub vfio_modules: Vec<String>,
    /// nvme module names in insmod order.
    pub nvme_modules: Vec<String>,
}

impl GuestKernel {
    /// Loads a complete cache directory.
    fn load(dir: &Path) -> Result<Self> {
        if !dir.join("complete").exists() {
            bail!("incomplete kernel cache {}", dir.display());
        }
        let read = |f: &str| -> Result<String> {
            Ok(fs::read_to_string(dir.join(f))
                .with_context(|| format!("reading {}", dir.join(f).display()))?
                .trim()
                .to_string())
        };
        let words = |s: String| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        let vmlinux = dir.join("vmlinux");
        Ok(Self {
            release: read("release")?,
            package: read("package")?,
            vmlinuz: dir.join("vmlinuz"),
            vmlinux: vmlinux.exists().then_some(vmlinux),
            module_dir: dir.join("modules"),
            vfio_modules: words(read("vfio.order")?),
            nvme_modules: words(read("nvme.order")?),
        })
    }

    /// Path of module `name`.
    pub fn module_path(&self, name: &str) -> PathBuf {
        self.module_dir.join(format!("{name}.ko"))
    }
}

/// Returns the cached guest kernel, downloading and extracting it on first use.
///
/// Once cached, no apt command runs: delete target/xtask/kernel to pick up a newer kernel.
pub fn ensure(cache: &Path, busybox: &Path) -> Result<GuestKernel> {
    let root = cache.join("kernel");
    let current = root.join("current");
    if let Ok(name) = fs::read_to_string(&current) {
        match GuestKernel::load(&root.join(name.trim())) {
            Ok(k) => return Ok(k),
            Err(e) => eprintln!("xtask: ignoring the kernel cache: {e:#}"),
        }
    }
    fs::create_dir_all(&root)?;
    let pkg = resolve_image_package()?;
    eprintln!("xtask: fetching the guest kernel ({pkg}) with apt-get download");
    let work = root.join(format!("work-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let result = build_cache(&pkg, &work, &root, busybox);
    let _ = fs::remove_dir_all(&work);
    let dir_name = result?;
    fs::write(root.join("current.tmp"), &dir_name)?;
    fs::rename(root.join("current.tmp"), &current)?;
    GuestKernel::load(&root.join(&dir_name))
}

/// Finds the versioned image package behind `linux-image-amd64`.
fn resolve_image_package() -> Result<String> {
    if deps::find_program("apt-cache").is_none() {
        bail!(
            "apt-cache is not available: the bed takes its guest kernel from Debian's {META_PACKAGE}"
        );
    }
    let query = || -> Result<Option<String>> {
        let out = proc::run_captured(
            Command::new("apt-cache").args(["depends", META_PACKAGE]),
            Duration::from_secs(120),
        )?;
        Ok(parse_depends(&String::from_utf8_lossy(&out.stdout)))
    };
    if let Some(p) = query()? {
        return Ok(p);
    }
    deps::apt_update()?;
    query()?.with_context(|| {
        format!("`apt-cache depends {META_PACKAGE}` names no linux-image package: are Debian's apt sources configured?")
    })
}

/// Extracts the first `Depends: linux-image-…` package name from `apt-cache depends` output.
fn parse_depends(text: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| l.trim().trim_start_matches('|').strip_prefix("Depends:"))
        .map(str::trim)
        .find(|p| p.starts_with("linux-image-") && !p.starts_with('<'))
        .map(str::to_string)
}

/// Downloads and extracts `pkg` into a new cache directory under `root`; returns its name.
fn build_cache(pkg: &str, work: &Path, root: &Path, busybox: &Path) -> Result<String> {
    let deb = deps::apt_download(pkg, work)?;
    let deb_name = deb
        .file_stem()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let tree = work.join("tree");
    proc::run_checked(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree),
        Duration::from_secs(600),
    )?;
    let _ = fs::remove_file(&deb);

    let (release, modroot) = find_module_root(&tree)?;
    let vmlinuz = ["boot", "usr/lib/linux", "usr/lib/modules"]
        .iter()
        .map(|d| tree.join(d).join(format!("vmlinuz-{release}")))
        .chain(std::iter::once(modroot.join("vmlinuz")))
        .find(|p| p.exists())
        .with_context(|| format!("{pkg} contains no vmlinuz-{release}"))?;

    let out = work.join("out");
    let modules_out = out.join("modules");
    fs::create_dir_all(&modules_out)?;
    fs::copy(&vmlinuz, out.join("vmlinuz"))?;

    let index = index_modules(&modroot.join("kernel"))?;
    let builtin = builtin_modules(&modroot);
    let mut contents: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut deps_of = |name: &str| -> Result<Option<Vec<String>>> {
        let Some(path) = index.get(name) else {
            return Ok(None);
        };
        if !contents.contains_key(name) {
            let data = read_module(path, busybox)?;
            contents.insert(name.to_string(), data);
        }
        Ok(Some(modinfo_depends(&contents[name])))
    };
    let vfio = load_order(VFIO_ROOTS, &builtin, &mut deps_of)?;
    let nvme = load_order(NVME_ROOTS, &builtin, &mut deps_of)?;
    for name in vfio.iter().chain(&nvme) {
        fs::write(modules_out.join(format!("{name}.ko")), &contents[name])?;
    }
    fs::write(out.join("vfio.order"), vfio.join("\n") + "\n")?;
    fs::write(out.join("nvme.order"), nvme.join("\n") + "\n")?;
    fs::write(out.join("release"), format!("{release}\n"))?;
    fs::write(out.join("package"), format!("{deb_name}\n"))?;

    let bzimage = fs::read(&vmlinuz)?;
    match extract_vmlinux(&bzimage, work, busybox) {
        Ok(vmlinux) => fs::write(out.join("vmlinux"), vmlinux)?,
        Err(e) => eprintln!("xtask: note: booting the compressed kernel (no PVH vmlinux: {e:#})"),
    }
    fs::write(out.join("complete"), "")?;

    let final_dir = root.join(&deb_name);
    let _ = fs::remove_dir_all(&final_dir);
    fs::rename(&out, &final_dir)?;
    eprintln!(
        "xtask: cached kernel {release} in {} (modules: {})",
        final_dir.display(),
        vfio.iter()
            .chain(&nvme)
            .cloned()
            .collect::<Vec<_>>()
            .join(" ")
    );
    Ok(deb_name)
}

/// Finds `lib/modules/<release>` (or `usr/lib/modules/<release>`) in an extracted package.
fn find_module_root(tree: &Path) -> Result<(String, PathBuf)> {
    for base in ["lib/modules", "usr/lib/modules"] {
        let Ok(entries) = fs::read_dir(tree.join(base)) else {
            continue;
        };
        for e in entries.flatten() {
            if e.path().join("kernel").is_dir() {
                return Ok((e.file_name().to_string_lossy().into_owned(), e.path()));
            }
        }
    }
    bail!("no lib/modules/<release>/kernel directory in the kernel package")
}

/// Canonical module name: the file name without `.ko*`, with `-` as `_`.
fn module_name(file_name: &str) -> Option<String> {
    let (stem, compression) = file_name.split_once(".ko")?;
    if !matches!(compression, "" | ".xz" | ".zst" | ".gz") {
        return None;
    }
    Some(stem.replace('-', "_"))
}

/// Maps module names to files under `dir`, recursively.
fn index_modules(dir: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let mut index = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let e = e?;
            let p = e.path();
            if e.file_type()?.is_dir() {
                stack.push(p);
            } else if let Some(name) = module_name(&e.file_name().to_string_lossy()) {
                index.insert(name, p);
            }
        }
    }
    Ok(index)
}

/// Names of modules built into the kernel (modules.builtin).
fn builtin_modules(modroot: &Path) -> BTreeSet<String> {
    fs::read_to_string(modroot.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| module_name(l.rsplit('/').next().unwrap_or(l)))
        .collect()
}

/// Reads a module file, decompressing .ko.xz / .ko.zst / .ko.gz on the host (busybox insmod
/// in the guest may not decompress).
fn read_module(path: &Path, busybox: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let data = if name.ends_with(".ko") {
        fs::read(path)?
    } else {
        let raw = fs::read(path)?;
        let (data, ok) = decompress(&raw, path, busybox)?;
        if !ok {
            bail!("cannot decompress {}", path.display());
        }
        data
    };
    elf::check_x86_64(&data)
        .with_context(|| format!("{} is not a kernel module", path.display()))?;
    Ok(data)
}

/// Compression formats a bzImage payload or a module may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compression {
    Xz,
    Zstd,
    Gzip,
}

fn detect_compression(data: &[u8]) -> Option<Compression> {
    if data.starts_with(b"\xfd7zXZ\0") {
        Some(Compression::Xz)
    } else if data.starts_with(b"\x28\xb5\x2f\xfd") {
        Some(Compression::Zstd)
    } else if data.starts_with(b"\x1f\x8b") {
        Some(Compression::Gzip)
    } else {
        None
    }
}

/// Decompresses `data` (which lives in, or is written next to, `path`) with a host tool,
/// falling back to busybox for xz and gzip. Returns the output and whether the tool
/// reported success (trailing data after the stream makes xz complain).
fn decompress(data: &[u8], path: &Path, busybox: &Path) -> Result<(Vec<u8>, bool)> {
    let kind = detect_compression(data)
        .with_context(|| format!("{}: unknown compression", path.display()))?;
    let (tool, applet) = match kind {
        Compression::Xz => ("xz", "xzcat"),
        Compression::Zstd => ("zstd", ""),
        Compression::Gzip => ("gzip", "zcat"),
    };
    let mut cmd = match (deps::find_program(tool), applet) {
        (Some(t), _) => {
            let mut c = Command::new(t);
            c.args(["-d", "-c", "-q"]);
            c
        }
        (None, "") => bail!(
            "{} is {kind:?}-compressed and `{tool}` is not installed",
            path.display()
        ),
        (None, applet) => {
            let mut c = Command::new(busybox);
            c.arg(applet);
            c
        }
    };
    let out = proc::run_captured(cmd.arg(path), Duration::from_secs(300))?;
    Ok((out.stdout, out.status.success()))
}

/// The `depends=` list from a module's .modinfo section.
fn modinfo_depends(module: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"\0depends=";
    let Some(pos) = module.windows(KEY.len()).position(|w| w == KEY) else {
        return Vec::new();
    };
    let value = &module[pos + KEY.len()..];
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end])
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.replace('-', "_"))
        .collect()
}

/// Orders `roots` and their dependencies for insmod (dependencies first). `deps_of` returns
/// a module's dependencies, or `None` when the kernel has no such module file. Built-in
/// modules are skipped; a missing optional root is skipped, a missing required one is an error.
fn load_order(
    roots: &[(&str, bool)],
    builtin: &BTreeSet<String>,
    deps_of: &mut dyn FnMut(&str) -> Result<Option<Vec<String>>>,
) -> Result<Vec<String>> {
    fn visit(
        name: &str,
        required: bool,
        builtin: &BTreeSet<String>,
        deps_of: &mut dyn FnMut(&str) -> Result<Option<Vec<String>>>,
        visiting: &mut Vec<String>,
        order: &mut Vec<String>,
    ) -> Result<()> {
        if order.iter().any(|m| m == name) || builtin.contains(name) {
            return Ok(());
        }
        if visiting.iter().any(|m| m == name) {
            bail!(
                "module dependency cycle: {} -> {name}",
                visiting.join(" -> ")
            );
        }
        match deps_of(name)? {
            None if required => {
                bail!("the guest kernel has no module {name} (neither a file nor built in)")
            }
            None => Ok(()),
            Some(deps) => {
                visiting.push(name.to_string());
                for d in deps {
                    visit(&d, true, builtin, deps_of, visiting, order)?;
                }
                visiting.pop();
                order.push(name.to_string());
                Ok(())
            }
        }
    }
    let mut order = Vec::new();
    for &(root, required) in roots {
        visit(
            root,
            required,
            builtin,
            deps_of,
            &mut Vec::new(),
            &mut order,
        )?;
    }
    Ok(order)
}

/// Extracts the uncompressed ELF kernel from a bzImage and checks that QEMU can boot it
/// through PVH.
fn extract_vmlinux(bzimage: &[u8], work: &Path, busybox: &Path) -> Result<Vec<u8>> {
    let payload = bzimage_payload(bzimage)?;
    let tmp = work.join("payload");
    fs::write(&tmp, payload)?;
    let (vmlinux, _) = decompress(payload, &tmp, busybox)?;
    let _ = fs::remove_file(&tmp);
    // The build appends the uncompressed size (little-endian u32) to the payload.
    let expected = payload
        .len()
        .checked_sub(4)
        .map(|o| u32::from_le_bytes(payload[o..].try_into().expect("4 bytes")) as usize);
    if expected != Some(vmlinux.len()) {
        bail!(
            "decompressed kernel has {} bytes, the bzImage announces {:?}",
            vmlinux.len(),
            expected
        );
    }
    if !elf::has_pvh_note(&vmlinux)? {
        bail!("the kernel has no PVH entry note (CONFIG_PVH is off)");
    }
    Ok(vmlinux)
}

/// The compressed kernel inside a bzImage (boot protocol 2.08+: payload_offset/length).
fn bzimage_payload(b: &[u8]) -> Result<&[u8]> {
    if b.len() < 0x250 || b.get(0x202..0x206) != Some(b"HdrS") {
        bail!("not a bzImage (no HdrS header)");
    }
    let version = u16::from_le_bytes([b[0x206], b[0x207]]);
    if version < 0x208 {
        bail!("boot protocol {version:#x} has no payload fields");
    }
    let setup_sects = match b[0x1f1] {
        0 => 4,
        n => usize::from(n),
    };
    let word = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes")) as usize;
    let start = (setup_sects + 1) * 512 + word(0x248);
    let len = word(0x24c);
    b.get(start..start + len)
        .context("bzImage payload out of bounds")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_parsing() {
        let text = "linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n";
        assert_eq!(
            parse_depends(text).as_deref(),
            Some("linux-image-6.1.0-57-amd64")
        );
        let text = "linux-image-amd64\n |Depends: linux-image-6.12.1-amd64\n  Depends: foo\n";
        assert_eq!(
            parse_depends(text).as_deref(),
            Some("linux-image-6.12.1-amd64")
        );
        assert_eq!(
            parse_depends("W: Unable to locate package linux-image-amd64\n"),
            None
        );
    }

    #[test]
    fn module_names() {
        assert_eq!(
            module_name("vfio-pci-core.ko").as_deref(),
            Some("vfio_pci_core")
        );
        assert_eq!(module_name("nvme.ko.xz").as_deref(), Some("nvme"));
        assert_eq!(module_name("nvme.ko.zst").as_deref(), Some("nvme"));
        assert_eq!(module_name("modules.order"), None);
        assert_eq!(module_name("foo.kobj"), None);
    }

    #[test]
    fn modinfo() {
        let m = b"\x7fELF....\0license=GPL\0depends=vfio-pci-core,vfio\0name=vfio_pci\0";
        assert_eq!(modinfo_depends(m), ["vfio_pci_core", "vfio"]);
        assert!(modinfo_depends(b"\0license=GPL\0depends=\0name=vfio\0").is_empty());
        assert!(modinfo_depends(b"nothing").is_empty());
    }

    #[test]
    fn ordering() {
        // The real 6.1 dependency graph.
        let graph: BTreeMap<&str, &[&str]> = [
            ("irqbypass", &[][..]),
            ("vfio", &[]),
            ("vfio_iommu_type1", &["vfio"]),
            ("vfio_virqfd", &[]),
            ("vfio_pci_core", &["vfio", "vfio_virqfd", "irqbypass"]),
            ("vfio_pci", &["vfio_pci_core", "vfio"]),
            ("nvme", &["nvme_core"]),
            ("nvme_core", &["t10_pi"]),
            ("t10_pi", &["crc_t10dif", "crc64_rocksoft"]),
            ("crc_t10dif", &["crct10dif_common"]),
            ("crct10dif_common", &[]),
            ("crc64_rocksoft", &["crc64"]),
            ("crc64", &[]),
        ]
        .into_iter()
        .collect();
        let mut deps = |n: &str| {
            Ok(graph
                .get(n)
                .map(|d| d.iter().map(|s| s.to_string()).collect()))
        };
        let none = BTreeSet::new();
        let vfio = load_order(VFIO_ROOTS, &none, &mut deps).unwrap();
        assert_eq!(
            vfio,
            [
                "irqbypass",
                "vfio",
                "vfio_iommu_type1",
                "vfio_virqfd",
                "vfio_pci_core",
                "vfio_pci"
            ]
        );
        let nvme = load_order(NVME_ROOTS, &none, &mut deps).unwrap();
        assert_eq!(
            nvme,
            [
                "crct10dif_common",
                "crc_t10dif",
                "crc64",
                "crc64_rocksoft",
                "t10_pi",
                "nvme_core",
                "nvme"
            ]
        );
        // Built-in modules are skipped, missing optional roots too.
        let builtin: BTreeSet<String> = ["vfio".to_string()].into();
        let mut no_virqfd = |n: &str| {
            Ok((n != "vfio_virqfd")
                .then(|| {
                    graph
                        .get(n)
                        .map(|d| d.iter().map(|s| s.to_string()).collect())
                })
                .flatten()
                .map(|v: Vec<String>| v.into_iter().filter(|d| d != "vfio_virqfd").collect()))
        };
        let vfio = load_order(VFIO_ROOTS, &builtin, &mut no_virqfd).unwrap();
        assert_eq!(
            vfio,
            ["irqbypass", "vfio_iommu_type1", "vfio_pci_core", "vfio_pci"]
        );
        // A missing required module is an error.
        let mut empty = |_: &str| Ok(None);
        assert!(load_order(VFIO_ROOTS, &none, &mut empty).is_err());
    }

    #[test]
    fn payload_bounds() {
        let mut b = vec![0u8; 4096];
        b[0x1f1] = 1;
        b[0x202..0x206].copy_from_slice(b"HdrS");
        b[0x206..0x208].copy_from_slice(&0x20fu16.to_le_bytes());
        b[0x248..0x24c].copy_from_slice(&16u32.to_le_bytes());
        b[0x24c..0x250].copy_from_slice(&8u32.to_le_bytes());
        b[1024 + 16..1024 + 24].copy_from_slice(b"PAYLOAD!");
        assert_eq!(bzimage_payload(&b).unwrap(), b"PAYLOAD!");
        b[0x24c..0x250].copy_from_slice(&8000u32.to_le_bytes());
        assert!(bzimage_payload(&b).is_err());
        assert!(bzimage_payload(&[0u8; 1024]).is_err());
    }
}
