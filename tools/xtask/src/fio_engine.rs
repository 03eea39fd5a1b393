//! upnvme's fio ioengine (tools/fio/upnvme_fio.c) and the fio that loads it,
//! and `cargo xtask fio [FIO ARGS]`.
//!
//! fio loads an external engine only if the engine's `FIO_IOOPS_VERSION`
//! matches, and its structures depend on the `config-host.h` fio's configure
//! wrote, while fio installs no headers. So the engine is built against the
//! source tree of the very fio that loads it: the distribution's source
//! package of the installed fio version (`apt-get source fio=VERSION`, with a
//! `deb-src` entry added when there is none), configured and built once,
//! cached under target/xtask/fio/VERSION/. The guest gets that fio, the
//! engine and the libraries both need.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::bench::fio::{GuestFile, stage_libraries, stage_program};
use crate::cli::{VmArgs, shell_quote};
use crate::paths::Paths;
use crate::{capi, deps, proc, vm};

/// Where the engine is in the guest.
pub const GUEST_ENGINE: &str = "/usr/lib/upnvme/upnvme_fio.so";
/// Where the fio built from source is in the guest.
pub const GUEST_FIO: &str = "/usr/bin/fio";
const BUILD_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// `cargo xtask fio`.
#[derive(Debug, Args)]
pub struct FioCmd {
    /// Guest configuration.
    #[command(flatten)]
    pub vm: VmArgs,
    /// Arguments for fio, after `--` (the engine, `--thread=1` and, when no
    /// `--filename` is given, namespace 1 of the only vfio-bound controller
    /// are filled in).
    #[arg(
        value_name = "FIO_ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub args: Vec<String>,
}

/// Runs fio with the upnvme engine inside a guest; returns its exit status.
pub fn fio(cmd: &FioCmd) -> Result<i32> {
    let paths = Paths::discover();
    let files = stage(&paths)?;
    let mut vm = cmd.vm.clone();
    vm.put.extend(files.iter().map(GuestFile::put_spec));
    vm::vm(&vm, &guest_command(&cmd.args))
}

/// The guest command line: `fio --ioengine=external:ENGINE --thread=1 ARGS`.
pub fn guest_command(args: &[String]) -> String {
    let mut c = format!("{GUEST_FIO} --ioengine=external:{GUEST_ENGINE} --thread=1");
    for a in args {
        c.push(' ');
        c.push_str(&shell_quote(a));
    }
    c
}

/// Builds (once) fio and the engine and returns what the guest needs.
pub fn stage(paths: &Paths) -> Result<Vec<GuestFile>> {
    let tree = fio_tree(paths)?;
    let engine = build_engine(paths, &tree)?;
    let mut files = stage_program(&tree.join("fio"), GUEST_FIO)?;
    files.push(GuestFile {
        host: engine.clone(),
        guest: GUEST_ENGINE.into(),
    });
    for lib in stage_libraries(&engine)? {
        if !files.iter().any(|f| f.guest == lib.guest) {
            files.push(lib);
        }
    }
    Ok(files)
}

/// The installed fio's Debian version (installing fio when missing).
fn installed_fio_version() -> Result<String> {
    if deps::find_program("fio").is_none() {
        deps::apt_install(&["fio"]).context("fio is needed for the fio engine")?;
    }
    let mut q = Command::new("dpkg-query");
    q.args(["-W", "-f=${Version}", "fio"]);
    let out = proc::run_checked(&mut q, Duration::from_secs(30))
        .context("asking dpkg for the installed fio version")?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if v.is_empty() {
        bail!("dpkg reports no version for fio; install it with `apt-get install fio`");
    }
    Ok(v)
}

/// Makes sure apt has a `deb-src` entry for this system's Debian suite.
fn ensure_deb_src() -> Result<()> {
    let lists = ["/etc/apt/sources.list"]
        .into_iter()
        .map(PathBuf::from)
        .chain(
            std::fs::read_dir("/etc/apt/sources.list.d")
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path()),
        );
    for l in lists {
        let text = std::fs::read_to_string(&l).unwrap_or_default();
        if text.lines().any(|line| {
            line.trim_start().starts_with("deb-src")
                || line.contains("Types: deb-src")
                || line.contains("Types: deb deb-src")
        }) {
            return Ok(());
        }
    }
    let release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let suite = release
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|s| s.trim_matches('"').to_string())
        .filter(|s| !s.is_empty())
        .context("no VERSION_CODENAME in /etc/os-release: add a deb-src entry for fio by hand")?;
    if !deps::is_root() {
        bail!(
            "apt has no deb-src entry to fetch fio's source from: add one for {suite} \
             (or run cargo xtask as root)"
        );
    }
    let file = "/etc/apt/sources.list.d/upnvme-deb-src.sources";
    eprintln!("xtask: adding {file} (deb-src for {suite}) to fetch fio's source package");
    std::fs::write(
        file,
        format!(
            "Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: {suite}\n\
             Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        ),
    )
    .with_context(|| format!("writing {file}"))?;
    deps::apt_update()
}

/// The configured and built fio source tree of the installed version.
fn fio_tree(paths: &Paths) -> Result<PathBuf> {
    let version = installed_fio_version()?;
    let dir = paths.cache.join("fio").join(&version);
    let upstream = version.split('-').next().unwrap_or(&version);
    let tree = dir.join(format!("fio-{upstream}"));
    if tree.join("fio").exists() && tree.join("config-host.h").exists() {
        return Ok(tree);
    }
    std::fs::create_dir_all(&dir)?;
    if !tree.exists() {
        ensure_deb_src()?;
        if deps::find_program("dpkg-source").is_none() {
            deps::apt_install(&["dpkg-dev"]).context("dpkg-dev unpacks fio's source package")?;
        }
        eprintln!(
            "xtask: fetching fio {version}'s source package into {}",
            dir.display()
        );
        let mut get = Command::new("apt-get");
        get.current_dir(&dir)
            .args(["source", "--only-source"])
            .arg(format!("fio={version}"));
        proc::run_checked(&mut get, BUILD_TIMEOUT).with_context(|| {
            format!("`apt-get source fio={version}` (is a deb-src entry configured?)")
        })?;
        if !tree.exists() {
            bail!("apt-get source fio did not unpack into {}", tree.display());
        }
    }
    eprintln!(
        "xtask: building fio {version} from source (once) in {}",
        tree.display()
    );
    let mut conf = Command::new("./configure");
    conf.current_dir(&tree).arg("--disable-native");
    proc::run_checked(&mut conf, BUILD_TIMEOUT).context("configuring fio")?;
    let mut make = Command::new("make");
    make.current_dir(&tree)
        .arg(format!(
            "-j{}",
            std::thread::available_parallelism().map_or(2, |n| n.get())
        ))
        .arg("fio");
    proc::run_checked(&mut make, BUILD_TIMEOUT).context("building fio")?;
    Ok(tree)
}

/// The compiler flags of an engine built against the fio tree `tree` (fio's
/// own: its Makefile's CPPFLAGS and the configure output it includes first).
pub fn engine_cflags(tree: &Path) -> Vec<String> {
    vec![
        "-std=gnu11".into(),
        "-O2".into(),
        "-fPIC".into(),
        "-D_GNU_SOURCE".into(),
        "-D_LARGEFILE_SOURCE".into(),
        "-D_FILE_OFFSET_BITS=64".into(),
        "-DFIO_INTERNAL".into(),
        "-include".into(),
        tree.join("config-host.h").display().to_string(),
        format!("-I{}", tree.display()),
    ]
}

/// Builds tools/fio/upnvme_fio.c against `tree` and the host's libupnvme_c
/// (installed into target/xtask/fio/capi) into a shared object.
fn build_engine(paths: &Paths, tree: &Path) -> Result<PathBuf> {
    let lib_dir = capi::build_host(paths)?;
    let prefix = paths.cache.join("fio").join("capi");
    capi::install(paths, &lib_dir, &prefix)?;
    let out = paths.cache.join("fio").join("upnvme_fio.so");
    let src = paths.root.join("tools/fio/upnvme_fio.c");
    let mut cc = Command::new("cc");
    cc.args(engine_cflags(tree))
        .args([
            "-Wall",
            "-Wextra",
            "-Wno-unused-parameter",
            "-Wno-sign-compare",
            "-Werror",
        ])
        .args(["-shared", "-o"])
        .arg(&out)
        .arg(&src)
        .args(capi::pkg_config_flags(&prefix, &["--cflags"])?)
        // The engine exports only what fio looks up (`ioengine`), not the
        // thousands of Rust symbols the static library brings.
        .arg("-Wl,--exclude-libs,ALL")
        // Never unloaded: fio drops its last reference to the engine when
        // the last job ends, right after the job's cleanup closed its
        // controllers, while each controller's release watcher thread (in
        // the library linked in here) may still be asleep in its 100 ms
        // poll — unmapped, it would wake into freed code.
        .arg("-Wl,-z,nodelete")
        .arg(prefix.join("lib/libupnvme_c.a"))
        .args(capi::PRIVATE_LIBS.split_whitespace())
        .arg("-lgcc_s");
    proc::run_checked(&mut cc, BUILD_TIMEOUT).context("building the fio engine")?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line() {
        let c = guest_command(&[
            "--name=v".into(),
            "--filename=traddr=0000.00.04.0 ns=1".into(),
        ]);
        assert!(c.starts_with(
            "/usr/bin/fio --ioengine=external:/usr/lib/upnvme/upnvme_fio.so --thread=1 --name=v "
        ));
        assert!(c.contains("'--filename=traddr=0000.00.04.0 ns=1'"), "{c}");
    }
}
