//! QEMU dying of a signal: find its core dump and put gdb's backtrace into the
//! error, so a crash of the emulator (in CI, say) is diagnosed from the log
//! alone. This is how QEMU 10.0.2's use-after-free on CC.EN = 0 with live I/O
//! queues was found (`nvme_rw_complete_cb`, docs/testbed.md).
//!
//! QEMU runs with RLIMIT_CORE raised (`prlimit`) and its working directory in
//! the run directory, so with the default `core_pattern` (`core`) the dump
//! lands there and is removed with it. With a pattern that is an absolute
//! path, the newest matching file there is used; with a pipe (systemd-coredump,
//! apport) the message says where the dump went.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use crate::proc;

/// Frames of the backtrace to show.
const FRAMES: usize = 12;

/// Lets QEMU (process `pid`) write a core dump of any size. Best effort.
pub fn allow_core_dump(pid: u32) {
    let _ = proc::run_captured(
        Command::new("prlimit").args(["--pid", &pid.to_string(), "--core=unlimited"]),
        Duration::from_secs(10),
    );
}

/// What is known about QEMU's crash (process `pid`, started at `started`, its
/// working directory `dir`): the backtrace, or where the core went and how
/// to read it. `None` when no dump can be found.
pub fn diagnose(qemu: &Path, pid: u32, dir: &Path, started: SystemTime) -> Option<String> {
    let pattern = fs::read_to_string("/proc/sys/kernel/core_pattern").ok()?;
    let pattern = pattern.trim();
    if let Some(handler) = pattern.strip_prefix('|') {
        return Some(format!(
            "QEMU dumped core to `{handler}` (e.g. `coredumpctl gdb {pid}` reads it)"
        ));
    }
    let core = find_core(pattern, pid, dir, started)?;
    let bt = backtrace(qemu, &core);
    let keep = std::env::var_os("UPNVME_KEEP_CORE").is_some() || bt.is_none();
    let fate = if keep {
        // Out of the run directory, which is removed after the run.
        let core = match (core.strip_prefix(dir), dir.parent()) {
            (Ok(_), Some(up)) => {
                let to = up.join(format!("core.qemu.{pid}"));
                fs::rename(&core, &to).map(|()| to).unwrap_or(core)
            }
            _ => core,
        };
        format!("kept at {}", core.display())
    } else {
        let _ = fs::remove_file(&core);
        "removed; set UPNVME_KEEP_CORE=1 to keep it".to_string()
    };
    Some(match bt {
        Some(frames) => format!("QEMU's backtrace (core dump {fate}):\n{frames}"),
        None => format!(
            "QEMU dumped core ({fate}); `gdb -batch -ex bt {} CORE` shows where",
            qemu.display()
        ),
    })
}

/// The core file `pattern` gives for `pid`: in `dir` for a relative pattern,
/// else where the pattern says; a file named by the pattern's literal prefix,
/// written after `started`, the newest if several.
fn find_core(pattern: &str, pid: u32, dir: &Path, started: SystemTime) -> Option<PathBuf> {
    let expanded = pattern.replace("%p", &pid.to_string());
    let path = Path::new(&expanded);
    let (where_, name) = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => (
            parent.to_path_buf(),
            path.file_name()?.to_string_lossy().into_owned(),
        ),
        None => (dir.to_path_buf(), expanded.clone()),
    };
    let prefix = name.split('%').next().unwrap_or("core").to_string();
    fs::read_dir(&where_)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            let t = m.modified().ok()?;
            (m.is_file() && t >= started).then(|| (t, e.path()))
        })
        .max()
        .map(|(_, p)| p)
}

/// gdb's backtrace of the crashing thread, `FRAMES` frames, or `None`
/// without gdb.
fn backtrace(qemu: &Path, core: &Path) -> Option<String> {
    let out = proc::run_captured(
        Command::new("gdb")
            .args(["-batch", "-nx", "-ex", &format!("bt {FRAMES}")])
            .arg(qemu)
            .arg(core),
        Duration::from_secs(120),
    )
    .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut frames: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| format!("  {l}"))
        .collect();
    // gdb shows frame #0 once when it loads the core, then again in `bt`.
    frames.dedup();
    (!frames.is_empty()).then(|| frames.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_newest_core_by_pattern() {
        let dir = std::env::temp_dir().join(format!("xtask-crash-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let started = SystemTime::now() - Duration::from_secs(1);
        fs::write(dir.join("core"), b"x").unwrap();
        fs::write(dir.join("initrd.cpio"), b"y").unwrap();
        assert_eq!(find_core("core", 42, &dir, started), Some(dir.join("core")));
        let abs = format!("{}/core.%e.%p", dir.display());
        fs::write(dir.join("core.qemu-system-x86.42"), b"z").unwrap();
        let found = find_core(&abs, 42, &dir, started).unwrap();
        assert!(
            found
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("core")
        );
        assert_eq!(
            find_core(
                "core",
                42,
                &dir,
                SystemTime::now() + Duration::from_secs(60)
            ),
            None
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
