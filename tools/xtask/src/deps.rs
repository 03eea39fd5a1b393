//! Host dependencies: finding programs and installing missing Debian packages with apt-get.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::{elf, proc};

/// The host programs the test bed runs.
#[derive(Debug, Clone)]
pub struct HostTools {
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    /// A statically linked busybox (the guest's whole userland).
    pub busybox: PathBuf,
}

/// Finds an executable named `name` on PATH (and in the sbin directories, which root's
/// PATH may lack).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(
            [
                "/usr/local/sbin",
                "/usr/local/bin",
                "/usr/sbin",
                "/usr/bin",
                "/sbin",
                "/bin",
            ]
            .map(PathBuf::from),
        )
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// True when this process runs as root (effective UID 0).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// Finds a statically linked busybox (Debian's busybox-static installs /bin/busybox).
fn find_static_busybox() -> Option<PathBuf> {
    ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(PathBuf::from)
        .chain(find_program("busybox"))
        .find(|p| {
            std::fs::read(p)
                .ok()
                .and_then(|d| elf::is_static(&d).ok())
                .unwrap_or(false)
        })
}

/// Makes sure QEMU and a static busybox are present, installing them with apt-get if not.
pub fn ensure_host_tools() -> Result<HostTools> {
    let find = || (find_program("qemu-system-x86_64"), find_static_busybox());
    let (mut qemu, mut busybox) = find();
    let mut missing = Vec::new();
    if qemu.is_none() {
        missing.push("qemu-system-x86");
    }
    if busybox.is_none() {
        missing.push("busybox-static");
    }
    if qemu.is_none() && install_backported_qemu() {
        missing.retain(|p| *p != "qemu-system-x86");
        qemu = find_program("qemu-system-x86_64");
    }
    if !missing.is_empty() {
        apt_install(&missing)?;
        (qemu, busybox) = find();
    }
    let qemu = qemu.context(
        "qemu-system-x86_64 is still missing after installing qemu-system-x86; install QEMU \
         (7.2 or later) so that qemu-system-x86_64 is on PATH",
    )?;
    let busybox = busybox.context(
        "no statically linked busybox found after installing busybox-static (looked at \
         /bin/busybox and /usr/bin/busybox)",
    )?;
    Ok(HostTools { qemu, busybox })
}

/// On Debian 12 as root: QEMU from bookworm-backports (10.x), as `.ci/run`
/// installs it — Debian 12's own is 7.2, which lacks `-device nvme,mqes=`
/// (the small-queues configuration) and whose figures differ from the
/// benchmarks' (docs/benchmarks.md, QEMU 10.0.2). Adds the backports source
/// when it is missing. False when this is not such a machine or the install
/// fails (the caller then installs the distribution's QEMU).
fn install_backported_qemu() -> bool {
    let bookworm = std::fs::read_to_string("/etc/os-release")
        .is_ok_and(|t| t.lines().any(|l| l == "VERSION_CODENAME=bookworm"));
    if !bookworm || !is_root() || find_program("apt-get").is_none() {
        return false;
    }
    let listed = ["/etc/apt/sources.list"]
        .into_iter()
        .map(PathBuf::from)
        .chain(
            std::fs::read_dir("/etc/apt/sources.list.d")
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok().map(|e| e.path())),
        )
        .any(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains("bookworm-backports")));
    if !listed
        && std::fs::write(
            "/etc/apt/sources.list.d/bookworm-backports.sources",
            "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\n\
             Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
        )
        .is_err()
    {
        return false;
    }
    eprintln!("xtask: installing qemu-system-x86 from bookworm-backports with apt-get");
    let ok = apt_update().is_ok() && {
        let mut c = apt_get();
        c.args([
            "install",
            "-y",
            "--no-install-recommends",
            "-t",
            "bookworm-backports",
            "qemu-system-x86",
        ]);
        proc::run_checked(&mut c, APT_TIMEOUT).is_ok()
    };
    if !ok {
        eprintln!(
            "xtask: notice: QEMU from bookworm-backports could not be installed; installing Debian's own"
        );
    }
    ok && find_program("qemu-system-x86_64").is_some()
}

/// How long apt-get may take for one install or download.
const APT_TIMEOUT: Duration = Duration::from_secs(20 * 60);

fn apt_get() -> Command {
    let mut c = Command::new("apt-get");
    c.env("DEBIAN_FRONTEND", "noninteractive")
        // Wait for a concurrent apt/dpkg instead of failing at once.
        .args(["-o", "DPkg::Lock::Timeout=300"]);
    c
}

/// Runs `apt-get update`.
pub fn apt_update() -> Result<()> {
    eprintln!("xtask: apt-get update");
    proc::run_checked(apt_get().arg("update"), APT_TIMEOUT)?;
    Ok(())
}

/// Installs Debian packages with `apt-get install -y`, running `apt-get update` first only
/// when the install fails.
pub fn apt_install(pkgs: &[&str]) -> Result<()> {
    let list = pkgs.join(" ");
    if find_program("apt-get").is_none() {
        bail!(
            "missing host packages ({list}) and apt-get is not available: install QEMU \
             (qemu-system-x86_64) and a static busybox with your distribution's package manager"
        );
    }
    if !is_root() {
        bail!(
            "missing host packages: run `sudo apt-get install -y {list}` (or run cargo xtask as root)"
        );
    }
    eprintln!("xtask: installing {list} with apt-get");
    let install = || {
        let mut c = apt_get();
        c.args(["install", "-y", "--no-install-recommends"])
            .args(pkgs);
        proc::run_checked(&mut c, APT_TIMEOUT)
    };
    if install().is_err() {
        apt_update()?;
        install().with_context(|| format!("cannot install {list} with apt-get"))?;
    }
    Ok(())
}

/// Downloads the .deb of `pkg` into `dir` with `apt-get download` and returns its path.
pub fn apt_download(pkg: &str, dir: &Path) -> Result<PathBuf> {
    if find_program("apt-get").is_none() {
        bail!("apt-get is not available to download {pkg}");
    }
    std::fs::create_dir_all(dir)?;
    let download = || {
        let mut c = apt_get();
        c.args(["download", pkg]).current_dir(dir);
        proc::run_checked(&mut c, APT_TIMEOUT)
    };
    if download().is_err() {
        apt_update()?;
        download().with_context(|| format!("cannot download {pkg} with apt-get"))?;
    }
    let prefix = format!("{pkg}_");
    std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            let n = p.file_name().unwrap_or_default().to_string_lossy();
            n.starts_with(&prefix) && n.ends_with(".deb")
        })
        .with_context(|| {
            format!(
                "apt-get download {pkg} left no {prefix}*.deb in {}",
                dir.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_sh() {
        assert!(find_program("sh").is_some());
        assert!(find_program("surely-no-such-program-xyz").is_none());
    }
}
