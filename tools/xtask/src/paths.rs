//! Where the workspace, its target directory and the test bed's cache live.

use std::path::PathBuf;

/// Directories the test bed uses, all under Cargo's target directory (CARGO_TARGET_DIR,
/// or target/ in the workspace).
#[derive(Debug, Clone)]
pub struct Paths {
    /// The workspace root (holds Cargo.toml).
    pub root: PathBuf,
    /// Cargo's target directory (host builds).
    pub target: PathBuf,
    /// The bed's cache: target/xtask (kernel, initramfs base, QEMU probe results, run dirs).
    pub cache: PathBuf,
    /// Target directory for the static guest builds: target/guest (kept apart so that the
    /// guest's RUSTFLAGS do not invalidate host builds).
    pub guest_target: PathBuf,
}

impl Paths {
    /// Finds the workspace from this crate's location (tools/xtask).
    pub fn discover() -> Self {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .nth(2)
            .expect("tools/xtask lies two levels below the workspace root")
            .to_path_buf();
        let target = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(t) if !t.is_empty() => {
                let t = PathBuf::from(t);
                if t.is_absolute() {
                    t
                } else {
                    std::env::current_dir().map(|d| d.join(&t)).unwrap_or(t)
                }
            }
            _ => root.join("target"),
        };
        Self {
            cache: target.join("xtask"),
            guest_target: target.join("guest"),
            target,
            root,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_root() {
        let p = Paths::discover();
        assert!(p.root.join("Cargo.toml").exists());
        assert!(p.root.join("tools/xtask/Cargo.toml").exists());
        assert!(p.cache.ends_with("xtask"));
    }
}
