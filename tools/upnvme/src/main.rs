//! `upnvme`: the command-line face of the upnvme driver, in nvme-cli's spirit.
//!
//! Subcommands: `perf` (4 KiB round-trip latency and IOPS), `list`,
//! `identify`, `smart-log`, `setup`.

mod perf;
mod rw;
mod setup;
mod show;

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use upnvme::{Controller, ControllerOptions, PageBacking};

/// A userspace, polled NVMe driver: inspect and set up controllers bound to vfio-pci.
#[derive(Parser, Debug)]
#[command(name = "upnvme", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure I/O latency and IOPS (spdk_nvme_perf-compatible flags).
    Perf(perf::PerfArgs),
    /// List every NVMe controller on the PCI bus with its driver, and (for
    /// vfio-bound ones) model, serial, namespaces and capacity.
    List,
    /// Show Identify Controller and Identify Namespace data.
    Identify {
        #[command(flatten)]
        dev: DeviceArgs,
        /// Show only this namespace (default: the controller and every namespace).
        #[arg(short, long)]
        nsid: Option<u32>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the SMART / Health Information log page.
    SmartLog {
        #[command(flatten)]
        dev: DeviceArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Read logical blocks to a file (default: stdout), byte-exact.
    Read {
        #[command(flatten)]
        dev: DeviceArgs,
        #[command(flatten)]
        range: BlockRange,
        /// Output file (default: stdout).
        #[arg(long)]
        data: Option<std::path::PathBuf>,
    },
    /// Write logical blocks from a file (default: stdin), byte-exact: the input
    /// must hold exactly block-count x LBA-size bytes.
    Write {
        #[command(flatten)]
        dev: DeviceArgs,
        #[command(flatten)]
        range: BlockRange,
        /// Input file (default: stdin).
        #[arg(long)]
        data: Option<std::path::PathBuf>,
    },
    /// Bind NVMe controllers to vfio-pci and reserve hugepages (run as root).
    Setup {
        /// Controllers to bind (default: every NVMe controller on the PCI bus;
        /// careful on a machine that boots from NVMe).
        devices: Vec<String>,
        /// 2 MiB hugepages to reserve.
        #[arg(long, default_value_t = 512)]
        hugepages: u64,
        /// Give the controllers back to the kernel's nvme driver instead.
        #[arg(long)]
        reset: bool,
    },
}

/// Which blocks of which namespace.
#[derive(clap::Args, Debug)]
struct BlockRange {
    /// Namespace ID.
    #[arg(short, long, default_value_t = 1)]
    nsid: u32,
    /// First logical block.
    #[arg(short, long, default_value_t = 0)]
    start_block: u64,
    /// Number of logical blocks.
    #[arg(short = 'c', long, default_value_t = 1)]
    block_count: u64,
}

/// Which controller to open.
#[derive(clap::Args, Debug)]
struct DeviceArgs {
    /// PCI address of the controller (default: the only vfio-bound NVMe controller).
    #[arg(short, long)]
    device: Option<String>,
    /// Use 4 KiB pages instead of hugepages for DMA memory.
    #[arg(long)]
    no_hugepages: bool,
}

impl DeviceArgs {
    fn open(&self) -> Result<Controller> {
        let addr = match &self.device {
            Some(d) => d.clone(),
            None => default_device()?,
        };
        let options = ControllerOptions {
            page_backing: if self.no_hugepages {
                PageBacking::Small4K
            } else {
                PageBacking::Huge2M
            },
            ..Default::default()
        };
        Controller::open(&addr, options).with_context(|| format!("opening {addr}"))
    }
}

/// The only vfio-bound NVMe controller, or an error listing the candidates.
fn default_device() -> Result<String> {
    let all = upnvme::list_controllers()?;
    let vfio: Vec<_> = all
        .iter()
        .filter(|f| f.driver.as_deref() == Some("vfio-pci"))
        .collect();
    match vfio.as_slice() {
        [one] => Ok(one.address.to_string()),
        [] => {
            let others: Vec<String> = all
                .iter()
                .map(|f| {
                    format!(
                        "{} ({})",
                        f.address,
                        f.driver.as_deref().unwrap_or("no driver")
                    )
                })
                .collect();
            if others.is_empty() {
                bail!("no NVMe controller found on the PCI bus")
            }
            bail!(
                "no NVMe controller is bound to vfio-pci; found {}; bind one with `upnvme setup <address>`",
                others.join(", ")
            )
        }
        many => bail!(
            "several vfio-bound NVMe controllers ({}); choose one with --device",
            many.iter()
                .map(|f| f.address.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Perf(a) => {
            if perf::run(a)? {
                Ok(())
            } else {
                Err(anyhow::anyhow!(VerifyFailed))
            }
        }
        Command::List => show::list(),
        Command::Identify { dev, nsid, json } => {
            let c = dev.open()?;
            if json {
                show::identify_json(&c, nsid)?;
            } else {
                show::identify(&c, nsid)?;
            }
            c.close()?;
            Ok(())
        }
        Command::SmartLog { dev, json } => {
            let c = dev.open()?;
            show::smart_log(&c, json)?;
            c.close()?;
            Ok(())
        }
        Command::Read { dev, range, data } => {
            let c = dev.open()?;
            rw::read(
                &c,
                range.nsid,
                range.start_block,
                range.block_count,
                data.as_deref(),
            )?;
            c.close()?;
            Ok(())
        }
        Command::Write { dev, range, data } => {
            let c = dev.open()?;
            rw::write(
                &c,
                range.nsid,
                range.start_block,
                range.block_count,
                data.as_deref(),
            )?;
            c.close()?;
            Ok(())
        }
        Command::Setup {
            devices,
            hugepages,
            reset,
        } => setup::run(&devices, hugepages, reset),
    }
}

/// `--verify` found mismatches (the count was printed with the report).
#[derive(Debug)]
struct VerifyFailed;

impl std::fmt::Display for VerifyFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("verification found mismatching blocks")
    }
}

impl std::error::Error for VerifyFailed {}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("upnvme: {e:#}");
            if e.downcast_ref::<perf::UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
