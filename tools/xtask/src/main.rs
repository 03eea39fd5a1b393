//! `cargo xtask`: upnvme's QEMU test bed.
//!
//! - `cargo xtask vm [OPTIONS] -- COMMAND...` boots a fresh guest with emulated NVMe
//!   controllers behind an emulated IOMMU, binds them to vfio-pci, runs COMMAND and exits
//!   with its status (failing on IOMMU faults).
//! - `cargo xtask test` runs the host tests, then the guest integration tests in several
//!   guest configurations.
//! - `cargo xtask perf [ARGS...]` runs `upnvme perf ARGS...` in the default guest.
//!
//! See docs/testbed.md.

mod cli;
mod console;
mod deps;
mod elf;
mod guest_build;
mod guest_init;
mod initramfs;
mod kernel;
mod paths;
mod proc;
mod qemu;
mod test;
mod vm;

use clap::Parser;

use crate::cli::{Cli, Command, shell_quote};

fn main() {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Vm(v) => vm::vm(&v.vm, &v.command.join(" ")),
        Command::Test(t) => test::test(t),
        Command::Perf(p) => {
            let mut command = String::from("upnvme perf");
            for a in &p.args {
                command.push(' ');
                command.push_str(&shell_quote(a));
            }
            vm::vm(&p.vm, &command)
        }
    };
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            e.downcast_ref::<vm::Failure>()
                .map_or(vm::EXIT_BED, |f| f.code)
        }
    };
    std::process::exit(code);
}
