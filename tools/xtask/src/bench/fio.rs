//! fio for the guest: the distribution's dynamically linked fio, with every
//! shared library `ldd` lists and the dynamic loader, copied into the guest at
//! the same paths (the guest has no libc of its own).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::{deps, proc};

/// A host file and where it goes in the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestFile {
    /// The file on the host (symlinks are followed when copying).
    pub host: PathBuf,
    /// Its absolute path in the guest.
    pub guest: String,
}

impl GuestFile {
    /// The `--put HOST:GUEST` spec of this file.
    pub fn put_spec(&self) -> String {
        format!("{}:{}", self.host.display(), self.guest)
    }
}

/// Finds fio on the host, installing Debian's `fio` package with apt-get when it
/// is missing, and returns fio plus its loader and libraries as guest files.
pub fn stage() -> Result<Vec<GuestFile>> {
    let fio = match deps::find_program("fio") {
        Some(f) => f,
        None => {
            deps::apt_install(&["fio"]).context("fio is needed for the kernel contenders")?;
            deps::find_program("fio").context("fio is still missing after `apt-get install fio`")?
        }
    };
    stage_program(&fio, "/usr/bin/fio")
}

/// A dynamically linked program (or shared object) and every library `ldd`
/// lists for it, including the loader, as guest files: the program at
/// `guest`, the libraries at their host paths.
pub fn stage_program(exe: &Path, guest: &str) -> Result<Vec<GuestFile>> {
    let mut files = vec![GuestFile {
        host: exe.to_path_buf(),
        guest: guest.into(),
    }];
    files.extend(stage_libraries(exe)?);
    if !files.iter().any(|f| f.guest.contains("ld-linux")) {
        bail!(
            "ldd {} named no dynamic loader (ld-linux*); is it dynamically linked for x86-64?",
            exe.display()
        );
    }
    Ok(files)
}

/// The libraries `ldd` lists for `exe`, at their host paths.
pub fn stage_libraries(exe: &Path) -> Result<Vec<GuestFile>> {
    let out = proc::run_checked(Command::new("ldd").arg(exe), Duration::from_secs(60))
        .with_context(|| format!("listing the libraries of {} with ldd", exe.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut files = Vec::new();
    for lib in parse_ldd(&text)? {
        if !lib.exists() {
            bail!(
                "{} (needed by {}) does not exist",
                lib.display(),
                exe.display()
            );
        }
        files.push(GuestFile {
            guest: lib.display().to_string(),
            host: lib,
        });
    }
    Ok(files)
}

/// The absolute library paths in `ldd` output: `libz.so.1 => /lib/.../libz.so.1 (0x…)`
/// lines and the loader's `/lib64/ld-linux-x86-64.so.2 (0x…)` line; the vDSO has no
/// file. A library ldd could not find is an error.
pub fn parse_ldd(text: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.contains("not found") {
            bail!("ldd: {line}");
        }
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            let p = Path::new(p).to_path_buf();
            if !libs.contains(&p) {
                libs.push(p);
            }
        }
    }
    Ok(libs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007f0d)\n\
                    \tlibceph-common.so.2 => /usr/lib/x86_64-linux-gnu/ceph/libceph-common.so.2 (0x1)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f0d946e5000)\n";
        let libs = parse_ldd(text).unwrap();
        assert_eq!(
            libs,
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libz.so.1"),
                PathBuf::from("/usr/lib/x86_64-linux-gnu/ceph/libceph-common.so.2"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(parse_ldd("\tlibfoo.so.1 => not found\n").is_err());
    }

    #[test]
    fn put_specs() {
        let f = GuestFile {
            host: "/usr/bin/fio".into(),
            guest: "/usr/bin/fio".into(),
        };
        assert_eq!(f.put_spec(), "/usr/bin/fio:/usr/bin/fio");
    }
}
