//! `cargo xtask`: upnvme's QEMU test bed.
//!
//! - `cargo xtask vm [OPTIONS] -- COMMAND...` boots a fresh guest with emulated NVMe
//!   controllers behind an emulated IOMMU, binds them to vfio-pci, runs COMMAND and exits
//!   with its status (failing on IOMMU faults).
//! - `cargo xtask test` runs the host tests, then the guest integration tests in several
//!   guest configurations.
//! - `cargo xtask perf [ARGS...]` runs `upnvme perf ARGS...` in the default guest.
//! - `cargo xtask bench` compares upnvme with the raw floor and the kernel's polled path
//!   in one guest boot; `cargo xtask cost` counts the driver's instructions per I/O.
//!
//! See docs/testbed.md.

mod bench;
mod capi;
mod cli;
mod console;
mod crash;
mod deps;
mod elf;
mod fio_engine;
mod guest_build;
mod guest_init;
mod initramfs;
mod kernel;
mod paths;
mod pin;
mod proc;
mod qemu;
mod qmp;
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
            // The README's main job: with no arguments, the 4 KiB QD1 round-trip
            // report with percentiles.
            let defaults = ["-q", "1", "-o", "4096", "-w", "randread", "-t", "10", "-L"];
            let args: Vec<String> = if p.args.is_empty() {
                defaults.iter().map(|s| s.to_string()).collect()
            } else {
                p.args.clone()
            };
            for a in &args {
                command.push(' ');
                command.push_str(&shell_quote(a));
            }
            vm::vm(&p.vm, &command)
        }
        Command::Bench(b) => bench::bench(b),
        Command::Cost(c) => bench::cost(c),
        Command::Capi(c) => capi::capi(c),
        Command::Fio(f) => fio_engine::fio(f),
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
