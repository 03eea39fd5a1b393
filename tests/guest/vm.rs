//! What the test bed tells the guest tests (`UPNVME_VM_*`) and how they run
//! the tool: shared by the guest test modules.

use std::process::{Command, Output};

/// The value of `name`, which `cargo xtask vm` exports.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set: run inside `cargo xtask vm`"))
}

/// `name` as a number.
pub fn env_u64(name: &str) -> u64 {
    env(name)
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number"))
}

/// The PCI address of the first vfio-bound controller.
pub fn device() -> String {
    env("UPNVME_VM_DEVICES")
        .split_whitespace()
        .next()
        .expect("a vfio-bound controller")
        .to_string()
}

/// Runs the `upnvme` tool with `args`.
pub fn upnvme(args: &[&str]) -> Output {
    Command::new("upnvme")
        .args(args)
        .output()
        .expect("upnvme is on the guest's PATH (cargo xtask vm puts it there)")
}
