//! `upnvme`: the command-line face of the upnvme driver, in nvme-cli's spirit.
//!
//! Subcommands: `perf` (4 KiB round-trip latency and IOPS), `list`,
//! `identify`, `smart-log`, `error-log`, `fw-log`, `get-log`,
//! `get-feature`, `set-feature`, `read`,
//! `write`, `copy`, `format`, `admin-passthru`, `io-passthru`,
//! `setup status|bind|unbind|hugepages`.

/// `print!` that returns an error instead of panicking when stdout is gone
/// (`upnvme perf --json | head`): use inside functions returning `Result`.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)?
    }};
}

/// `println!` counterpart of [`out!`].
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?
    }};
}

mod copy;
mod decode;
mod feature;
mod feature_decode;
mod logs;
mod passthru;
mod perf;
mod rw;
mod setup;
mod show;
mod usage;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use upnvme::dma::pci::PciFunction;
use upnvme::{Controller, ControllerOptions, PageBacking};

/// A userspace, polled NVMe driver: inspect and set up controllers bound to vfio-pci.
#[derive(Parser, Debug)]
#[command(name = "upnvme", version)]
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
        /// Show only this namespace (default: the controller and every
        /// namespace), decimal or 0x-prefixed hex.
        #[arg(short, long, value_parser = rw::number::<u32>)]
        nsid: Option<u32>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Decode every capability field in words (OACS, ONCS, SGLS, VWC, LBA
        /// formats, DPC/DPS, ...), as nvme-cli's `id-ctrl -H` / `id-ns -H`;
        /// with --json under "decoded".
        #[arg(short = 'H', long = "human-readable")]
        human: bool,
    },
    /// Show the SMART / Health Information log page.
    SmartLog {
        #[command(flatten)]
        dev: DeviceArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the Error Information log (Log Identifier 01h), as nvme-cli's
    /// error-log: each entry in use decoded (Status Field by name, Parameter
    /// Error Location as byte and bit, ...); entries whose Error Count is 0
    /// (not valid) are skipped.
    ErrorLog(logs::ErrorLogArgs),
    /// Show the Firmware Slot Information log (Log Identifier 03h), as
    /// nvme-cli's fw-log: the active slot, the slot activated at the next
    /// reset, each slot's firmware revision, and Identify Controller FRMW.
    FwLog(logs::FwLogArgs),
    /// Read logical blocks to a file (default: stdout), byte-exact.
    Read {
        #[command(flatten)]
        dev: DeviceArgs,
        #[command(flatten)]
        range: BlockRange,
        /// Output file (default, or "-": stdout).
        #[arg(long)]
        data: Option<std::path::PathBuf>,
        #[command(flatten)]
        md: rw::MetadataArgs,
    },
    /// Write logical blocks from a file (default: stdin), byte-exact: the input
    /// must hold exactly block-count x LBA-size bytes.
    Write {
        #[command(flatten)]
        dev: DeviceArgs,
        #[command(flatten)]
        range: BlockRange,
        /// Input file (default, or "-": stdin).
        #[arg(long)]
        data: Option<std::path::PathBuf>,
        #[command(flatten)]
        md: rw::MetadataArgs,
    },
    /// Copy logical blocks inside the device (Copy, opcode 19h), as
    /// nvme-cli's copy: the source ranges, in order, to consecutive blocks
    /// from --sdlba; with --snsids, from other namespaces (a cross-namespace
    /// Copy).
    Copy {
        #[command(flatten)]
        dev: DeviceArgs,
        #[command(flatten)]
        args: copy::CopyArgs,
    },
    /// Format a namespace (Format NVM): choose its LBA format (index from
    /// `upnvme identify -H`), metadata layout and protection information.
    /// Erases the namespace's data.
    Format {
        #[command(flatten)]
        dev: DeviceArgs,
        /// Namespace ID, decimal or 0x-prefixed hex.
        #[arg(short, long, default_value_t = 1, value_parser = rw::number::<u32>)]
        nsid: u32,
        /// LBA format index (Identify Namespace LBAF).
        #[arg(short = 'l', long)]
        lbaf: u8,
        /// Metadata setting: 1 = extended LBA (metadata after each block's
        /// data), 0 = a separate metadata buffer.
        #[arg(short = 'm', long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..2))]
        ms: u8,
        /// Protection information type: 0 (none) to 3.
        #[arg(short = 'i', long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..4))]
        pi: u8,
        /// Protection information location: 1 = first 8 metadata bytes,
        /// 0 = last 8.
        #[arg(short = 'p', long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..2))]
        pil: u8,
        /// Secure erase setting: 0 none, 1 user data erase, 2 cryptographic erase.
        #[arg(short = 's', long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..3))]
        ses: u8,
        /// Seconds to wait for the command (a secure erase of a large drive
        /// takes minutes). Default 600, as nvme-cli's.
        #[arg(long, default_value_t = 600,
              value_parser = clap::value_parser!(u64).range(1..))]
        timeout: u64,
    },
    /// Show a feature's value (Get Features), as nvme-cli's get-feature:
    /// dword 0 and, for the features that have one, the data structure.
    GetFeature(feature::GetFeatureArgs),
    /// Set a feature (Set Features), as nvme-cli's set-feature: the value
    /// (dword 11), or the data structure with --data.
    SetFeature(feature::SetFeatureArgs),
    /// Read a log page (Get Log Page), as nvme-cli's get-log: a hex dump,
    /// or raw with -b.
    GetLog(feature::GetLogArgs),
    /// Send an admin command, as nvme-cli's admin-passthru: Identify, Get /
    /// Set Features, Get Log Page, Device Self-test, Firmware Image Download
    /// / Commit, Security Send / Receive, Sanitize, vendor-specific. The
    /// commands the driver owns (queue creation and deletion, Asynchronous
    /// Event Request, Doorbell Buffer Config, Format NVM (`upnvme format`
    /// sends it), Namespace Management / Attachment) are refused.
    AdminPassthru(passthru::AdminPassthruArgs),
    /// Send an I/O command, as nvme-cli's io-passthru: any opcode (vendor
    /// specific, or an NVM command without its own subcommand) to namespace
    /// -n on a new I/O queue pair; data from a file or back to stdout, as
    /// admin-passthru. Not split: at most the controller's MDTS.
    IoPassthru(passthru::IoPassthruArgs),
    /// Prepare the machine (run as root): `status` shows the IOMMU, the NVMe
    /// controllers with their drivers and IOMMU groups, and the hugepages;
    /// `bind` / `unbind` move controllers between vfio-pci and the kernel's
    /// nvme driver; `hugepages` reserves hugepages.
    Setup(setup::SetupArgs),
}

/// Which blocks of which namespace.
#[derive(clap::Args, Debug)]
struct BlockRange {
    /// Namespace ID, decimal or 0x-prefixed hex.
    #[arg(short, long, default_value_t = 1, value_parser = rw::number::<u32>)]
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
    #[arg(short, long, value_parser = pci_address)]
    device: Option<String>,
    /// Use 4 KiB pages instead of hugepages for DMA memory.
    #[arg(long)]
    no_hugepages: bool,
}

/// Checks the shape of a PCI address at parse time, so a malformed one is a
/// usage error (exit status 2) like any other bad argument, and spells it
/// the one way every report uses (`0000:00:04.0` for `00:04.0`).
pub(crate) fn pci_address(s: &str) -> std::result::Result<String, String> {
    s.parse::<upnvme::PciAddress>()
        .map(|a| a.to_string())
        .map_err(|e| e.to_string())
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
    Ok(choose_device(&upnvme::list_controllers()?)?)
}

/// Picks the controller to use when `--device` is not given: the only NVMe
/// controller bound to vfio-pci. With none or several, the error lists the
/// candidates and says what to do.
fn choose_device(all: &[PciFunction]) -> Result<String, DeviceChoiceError> {
    let vfio: Vec<&PciFunction> = all
        .iter()
        .filter(|f| f.driver.as_deref() == Some("vfio-pci"))
        .collect();
    match vfio.as_slice() {
        [one] => Ok(one.address.to_string()),
        [] if all.is_empty() => Err(DeviceChoiceError(
            "no NVMe controller found on the PCI bus".into(),
        )),
        [] => {
            let found: Vec<String> = all
                .iter()
                .map(|f| {
                    format!(
                        "{} ({})",
                        f.address,
                        f.driver.as_deref().unwrap_or("no driver")
                    )
                })
                .collect();
            Err(DeviceChoiceError(format!(
                "no NVMe controller is bound to vfio-pci; found {}; bind one with `upnvme setup bind <address>`",
                found.join(", ")
            )))
        }
        many => Err(DeviceChoiceError(format!(
            "several vfio-bound NVMe controllers ({}); choose one with --device",
            many.iter()
                .map(|f| f.address.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// No `--device` and no single vfio-bound controller to default to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DeviceChoiceError(String);

impl std::fmt::Display for DeviceChoiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DeviceChoiceError {}

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
        Command::AdminPassthru(a) => passthru::run(&a),
        Command::IoPassthru(a) => passthru::run_io(&a),
        Command::GetFeature(a) => feature::get(&a),
        Command::SetFeature(a) => feature::set(&a),
        Command::GetLog(a) => feature::get_log(&a),
        Command::ErrorLog(a) => logs::error_log(&a),
        Command::FwLog(a) => logs::fw_log(&a),
        Command::Identify {
            dev,
            nsid,
            json,
            human,
        } => {
            let c = dev.open()?;
            if json {
                show::identify_json(&c, nsid, human)?;
            } else {
                show::identify(&c, nsid, human)?;
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
        Command::Copy { dev, args } => {
            let c = dev.open()?;
            copy::copy(&c, &args)?;
            c.close()?;
            Ok(())
        }
        Command::Read {
            dev,
            range,
            data,
            md,
        } => {
            let c = dev.open()?;
            rw::read(
                &c,
                range.nsid,
                range.start_block,
                range.block_count,
                rw::file_or_std(data.as_deref()),
                &md,
            )?;
            c.close()?;
            Ok(())
        }
        Command::Write {
            dev,
            range,
            data,
            md,
        } => {
            let c = dev.open()?;
            rw::write(
                &c,
                range.nsid,
                range.start_block,
                range.block_count,
                rw::file_or_std(data.as_deref()),
                &md,
            )?;
            c.close()?;
            Ok(())
        }
        Command::Format {
            dev,
            nsid,
            lbaf,
            ms,
            pi,
            pil,
            ses,
            timeout,
        } => {
            let mut c = dev.open()?;
            let f = upnvme::FormatNvm {
                lbaf,
                extended: ms == 1,
                pi_type: pi,
                pi_first: pil == 1,
                secure_erase: match ses {
                    1 => upnvme::SecureErase::UserData,
                    2 => upnvme::SecureErase::Cryptographic,
                    _ => upnvme::SecureErase::None,
                },
                timeout: Some(Duration::from_secs(timeout)),
            };
            let ns = c
                .format_nvm(nsid, &f)
                .map_err(usage::no_such_namespace_is_usage)?;
            let layout = ns
                .metadata_layout()
                .map_or_else(|| "no metadata".to_string(), |l| l.to_string());
            outln!(
                "namespace {nsid} formatted: LBA format {lbaf}, {} blocks of {} bytes, {layout}",
                ns.lba_count(),
                ns.lba_size()
            );
            c.close()?;
            Ok(())
        }
        Command::Setup(a) => setup::run(a),
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

/// The exit status of a failed run: 2 for bad input found before any I/O
/// (`perf`'s checks), 128 + the signal for a `perf` run a signal cut short
/// (after its report), 1 for everything else.
fn exit_status(e: &anyhow::Error) -> u8 {
    if e.downcast_ref::<usage::UsageError>().is_some() {
        2
    } else if let Some(perf::Interrupted(sig, _)) = e.downcast_ref::<perf::Interrupted>() {
        (128 + sig) as u8
    } else {
        1
    }
}

/// The VFIO group node another process holds open (EBUSY), if that is `e`.
pub(crate) fn busy_group(e: &upnvme::Error) -> Option<std::path::PathBuf> {
    match e {
        upnvme::Error::Dma(upnvme::dma::DmaError::GroupOpen { path, os_error, .. })
            if os_error.raw_os_error() == Some(libc::EBUSY) =>
        {
            Some(path.clone())
        }
        _ => None,
    }
}

/// True when writing to stdout failed because its reader closed the pipe.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            // 2 for usage errors, 0 for --help and --version.
            return ExitCode::from(e.exit_code() as u8);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => {
            // The reader went away (`| head`): stop quietly, with the status a
            // shell shows for a program ended by SIGPIPE.
            ExitCode::from(141)
        }
        Err(e) => {
            eprintln!("upnvme: {e:#}{}", busy_group_holders(&e));
            ExitCode::from(exit_status(&e))
        }
    }
}

/// For a controller whose VFIO group another process holds open (EBUSY),
/// who that is, as `upnvme setup status` shows it: "; held by pid N (comm)".
fn busy_group_holders(e: &anyhow::Error) -> String {
    let Some(path) = e
        .chain()
        .find_map(|c| c.downcast_ref::<upnvme::Error>().and_then(busy_group))
    else {
        return String::new();
    };
    let holders = setup::host::Host::default().group_holders(&path);
    if holders.is_empty() {
        return String::new();
    }
    format!(
        "; held by {}",
        holders
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use upnvme::PciAddress;

    fn function(addr: &str, driver: Option<&str>) -> PciFunction {
        PciFunction {
            address: addr.parse::<PciAddress>().unwrap(),
            class: upnvme::dma::pci::NVME_CLASS,
            vendor: 0x1b36,
            device: 0x0010,
            driver: driver.map(str::to_string),
            iommu_group: Some(3),
        }
    }

    #[test]
    fn default_device_is_the_only_vfio_bound_controller() {
        let none = choose_device(&[]).unwrap_err();
        assert_eq!(none.to_string(), "no NVMe controller found on the PCI bus");

        let unbound = choose_device(&[
            function("0000:00:05.0", Some("nvme")),
            function("0000:00:06.0", None),
        ])
        .unwrap_err();
        assert_eq!(
            unbound.to_string(),
            "no NVMe controller is bound to vfio-pci; found 0000:00:05.0 (nvme), 0000:00:06.0 (no driver); bind one with `upnvme setup bind <address>`"
        );

        let one = choose_device(&[
            function("0000:00:04.0", Some("vfio-pci")),
            function("0000:00:05.0", Some("nvme")),
        ]);
        assert_eq!(one, Ok("0000:00:04.0".to_string()));

        let several = choose_device(&[
            function("0000:00:04.0", Some("vfio-pci")),
            function("0000:00:05.0", Some("nvme")),
            function("0000:00:06.0", Some("vfio-pci")),
        ])
        .unwrap_err();
        assert_eq!(
            several.to_string(),
            "several vfio-bound NVMe controllers (0000:00:04.0, 0000:00:06.0); choose one with --device"
        );
        // Not a usage error: exit status 1.
        assert_eq!(exit_status(&anyhow::Error::from(several)), 1);
    }

    #[test]
    fn every_subcommand_parses() {
        for args in [
            &["upnvme", "list"][..],
            &[
                "upnvme",
                "identify",
                "-d",
                "0000:00:04.0",
                "--nsid",
                "1",
                "--json",
            ],
            &["upnvme", "smart-log", "--json"],
            &["upnvme", "error-log"],
            &[
                "upnvme",
                "error-log",
                "-d",
                "0000:00:04.0",
                "-e",
                "4",
                "--json",
            ],
            &["upnvme", "error-log", "--log-entries", "0x40"],
            &["upnvme", "fw-log"],
            &["upnvme", "fw-log", "-d", "00:04.0", "--json"],
            &["upnvme", "get-feature", "-f", "7", "-H"],
            &[
                "upnvme",
                "get-feature",
                "-f",
                "0x04",
                "--cdw11",
                "0x100000",
                "--human-readable",
            ],
            &[
                "upnvme",
                "get-feature",
                "-f",
                "0x0c",
                "-s",
                "3",
                "-H",
                "-n",
                "0x1",
            ],
            &[
                "upnvme", "read", "-n", "1", "-s", "8", "-c", "2", "--data", "f",
            ],
            &["upnvme", "write", "-d", "00:04.0", "--no-hugepages"],
            &["upnvme", "setup", "status", "--json"],
            &["upnvme", "setup", "bind"],
            &["upnvme", "setup", "bind", "0000:00:04.0", "0000:00:05.0"],
            &["upnvme", "setup", "unbind", "0000:00:04.0"],
            &["upnvme", "setup", "hugepages", "512"],
            &["upnvme", "setup", "hugepages", "2", "--size", "1G"],
            &["upnvme", "perf"],
        ] {
            Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
        let Command::Setup(s) = Cli::try_parse_from(["upnvme", "setup", "hugepages", "3"])
            .unwrap()
            .command
        else {
            panic!("not setup")
        };
        assert!(matches!(
            s.command,
            setup::SetupCommand::Hugepages {
                count: 3,
                size: 2048
            }
        ));
    }

    /// Every `-n` / `--nsid` / `--namespace-id` takes decimal or 0x hex.
    #[test]
    fn copy_takes_comma_separated_ranges() {
        let cli = Cli::try_parse_from([
            "upnvme", "copy", "--sdlba", "0x10", "-s", "1,0x20", "-b", "3,4", "-N", "2,1",
        ])
        .unwrap();
        let Command::Copy { args, .. } = cli.command else {
            panic!("{:?}", cli.command)
        };
        assert_eq!(
            (args.nsid, args.sdlba, args.slbs, args.blocks, args.snsids),
            (1, 16, vec![1, 32], vec![3, 4], Some(vec![2, 1]))
        );
        let missing = Cli::try_parse_from(["upnvme", "copy", "--sdlba", "0", "-s", "1"]);
        assert!(missing.is_err(), "--blocks is required");
    }

    #[test]
    fn namespace_ids_take_hex_everywhere() {
        let nsid_of = |args: &[&str]| -> u32 {
            match Cli::try_parse_from(args)
                .unwrap_or_else(|e| panic!("{args:?}: {e}"))
                .command
            {
                Command::Identify { nsid, .. } => nsid.unwrap(),
                Command::Read { range, .. } | Command::Write { range, .. } => range.nsid,
                Command::Format { nsid, .. } => nsid,
                Command::Perf(p) => p.nsid.unwrap(),
                c => panic!("{c:?}"),
            }
        };
        assert_eq!(nsid_of(&["upnvme", "identify", "-n", "0x10"]), 16);
        assert_eq!(nsid_of(&["upnvme", "identify", "--nsid", "3"]), 3);
        assert_eq!(nsid_of(&["upnvme", "read", "-n", "0x2"]), 2);
        assert_eq!(nsid_of(&["upnvme", "write", "--nsid", "0XA"]), 10);
        assert_eq!(nsid_of(&["upnvme", "format", "-n", "0x1", "-l", "0"]), 1);
        assert_eq!(nsid_of(&["upnvme", "perf", "-n", "0xffffffff"]), u32::MAX);
        for args in [
            &["upnvme", "identify", "-n", "0x100000000"][..],
            &["upnvme", "read", "-n", "x1"],
            &["upnvme", "perf", "-n", "-1"],
        ] {
            let e = Cli::try_parse_from(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
    }

    /// `get-feature -H` decodes; with `-b` (raw bytes) it is refused.
    #[test]
    fn get_feature_human_readable_flag() {
        let Command::GetFeature(_) =
            Cli::try_parse_from(["upnvme", "get-feature", "-f", "4", "-H"])
                .unwrap()
                .command
        else {
            panic!("not get-feature")
        };
        let e = Cli::try_parse_from(["upnvme", "get-feature", "-f", "4", "-H", "-b"]).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
    }

    #[test]
    fn setup_misuse_is_a_usage_error() {
        for args in [
            &["upnvme", "setup"][..],
            &["upnvme", "setup", "0000:00:04.0"],
            &["upnvme", "setup", "--hugepages", "512"],
            &["upnvme", "setup", "hugepages"],
            &["upnvme", "setup", "hugepages", "-1"],
            &["upnvme", "setup", "hugepages", "2", "--size", "3X"],
        ] {
            let e = Cli::try_parse_from(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}: {e}");
        }
    }
}
