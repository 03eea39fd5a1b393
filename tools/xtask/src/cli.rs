//! Command-line interface of `cargo xtask`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::builder::TypedValueParser as _;
use clap::{Args, Parser, Subcommand};

/// `cargo xtask`: upnvme's QEMU test bed.
#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "upnvme's QEMU test bed: boots a guest with emulated NVMe controllers behind an \
             emulated IOMMU, binds them to vfio-pci and runs upnvme's programs inside",
    after_help = "See docs/testbed.md for details and examples."
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run COMMAND with `sh -c` inside a fresh guest and exit with its status.
    ///
    /// Example: cargo xtask vm --controllers 2 -- 'ls /dev/vfio'
    Vm(VmCmd),
    /// Run the host tests, then the guest integration tests in several guest configurations.
    Test(TestCmd),
    /// Boot the default guest and run `upnvme perf ARGS...` inside it.
    Perf(PerfCmd),
    /// Benchmark upnvme against the raw floor and the kernel's polled path in one guest
    /// boot; writes docs/benchmarks.md and its plots (docs/latency.png, docs/iops-depth.png,
    /// docs/iops-size.png).
    Bench(crate::bench::BenchCmd),
    /// Count the driver's instructions per 4 KiB I/O (submit + reap) with callgrind
    /// against the in-memory controller model.
    Cost(crate::bench::CostCmd),
    /// Build the C API (libupnvme_c) and install upnvme.h, the libraries and upnvme.pc
    /// under a prefix.
    Capi(crate::capi::CapiCmd),
    /// Run fio with upnvme's ioengine inside a guest: `cargo xtask fio -- --name=v --rw=randread`.
    /// Builds (once) the fio that loads the engine from the distribution's source package.
    Fio(crate::fio_engine::FioCmd),
}

/// `cargo xtask vm`.
#[derive(Debug, Args)]
pub struct VmCmd {
    /// Guest configuration.
    #[command(flatten)]
    pub vm: VmArgs,
    /// The command to run in the guest; the words are joined with spaces and given to `sh -c`.
    #[arg(
        value_name = "COMMAND",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<String>,
}

/// `cargo xtask test`.
#[derive(Debug, Args)]
pub struct TestCmd {
    /// Run only the host tests (`cargo test --workspace`).
    #[arg(long, conflicts_with = "guest_only")]
    pub host_only: bool,
    /// Run only the guest integration tests.
    #[arg(long)]
    pub guest_only: bool,
    /// Use the guest binaries that are already built (target/guest) instead of building them.
    #[arg(long)]
    pub no_build: bool,
    /// Show the guest kernel's boot log and the QEMU command lines.
    #[arg(long, short)]
    pub verbose: bool,
    /// Kill a guest that has not powered off after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    pub timeout: u64,
    /// Only run the guest configurations whose name contains this string (e.g. `lba512`).
    #[arg(long, value_name = "NAME")]
    pub config: Option<String>,
    /// Extra arguments for the guest test binary (libtest filters and flags), after `--`.
    #[arg(last = true, value_name = "TEST_ARGS")]
    pub test_args: Vec<String>,
}

/// `cargo xtask perf`.
#[derive(Debug, Args)]
pub struct PerfCmd {
    /// Guest configuration.
    #[command(flatten)]
    pub vm: VmArgs,
    /// Arguments for `upnvme perf` (put them after `--` if they look like xtask options).
    #[arg(
        value_name = "ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub args: Vec<String>,
}

/// A size in bytes, written as a number with an optional binary suffix (K, M, G, T).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl std::str::FromStr for Size {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        parse_size(s).map(Size)
    }
}

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const UNITS: [(u64, &str); 4] = [
            (1 << 40, "T"),
            (1 << 30, "G"),
            (1 << 20, "M"),
            (1 << 10, "K"),
        ];
        for (unit, suffix) in UNITS {
            if self.0 >= unit && self.0.is_multiple_of(unit) {
                return write!(f, "{}{suffix}", self.0 / unit);
            }
        }
        write!(f, "{}", self.0)
    }
}

/// Parses `4096`, `512K`, `256M`, `1G`, `1GiB`, `2T` (binary units) into bytes.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    if num.is_empty() {
        bail!("invalid size {s:?}: expected a number with an optional K/M/G/T suffix, e.g. 256M");
    }
    let n: u64 = num.parse().with_context(|| format!("invalid size {s:?}"))?;
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => bail!("invalid size {s:?}: unknown suffix {suffix:?} (use K, M, G or T)"),
    };
    n.checked_mul(1u64 << shift)
        .with_context(|| format!("size {s:?} is too large"))
}

/// Everything that describes one guest: hardware, backing files, and how to run it.
#[derive(Debug, Clone, Args)]
pub struct VmArgs {
    /// Number of NVMe controllers bound to vfio-pci (PCI addresses 0000:00:04.0, 0000:00:05.0, ...).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(0..=16))]
    pub controllers: u32,
    /// Namespaces per controller (NSIDs 1..=N, one backing file each).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=32))]
    pub namespaces: u32,
    /// Raw backing file of controller 0 / namespace 1; created at --disk-size if missing and
    /// kept after exit. Other namespaces get temporary files.
    #[arg(long, value_name = "FILE")]
    pub disk: Option<PathBuf>,
    /// Size of every namespace's backing file (K/M/G suffixes). Default 256M, or the size of
    /// an existing --disk file.
    #[arg(long, value_name = "SIZE")]
    pub disk_size: Option<Size>,
    /// Logical (and physical) block size of every namespace.
    #[arg(long, value_name = "BYTES", default_value_t = 4096,
          value_parser = clap::builder::PossibleValuesParser::new(["512", "4096"])
              .map(|s| s.parse::<u32>().expect("validated")))]
    pub lba_size: u32,
    /// Metadata bytes per logical block of controller 0's namespace 1 (QEMU nvme-ns `ms`;
    /// 0 = none). The namespace then holds `disk size / (LBA size + ms)` blocks.
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    pub ms: u16,
    /// With --ms: 1 = metadata at the end of each block (extended LBA, FLBAS bit 4),
    /// 0 = a separate metadata buffer (QEMU nvme-ns `mset`).
    #[arg(long, value_name = "0|1", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=1))]
    pub mset: u8,
    /// With --ms 8 or more: end-to-end protection information type of namespace 1 (QEMU
    /// nvme-ns `pi`; 0 = none).
    #[arg(long, value_name = "0|1|2|3", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=3))]
    pub pi: u8,
    /// With --pi: 1 = protection information in the first 8 bytes of the metadata, 0 = in
    /// the last 8 (QEMU nvme-ns `pil`).
    #[arg(long, value_name = "0|1", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=1))]
    pub pil: u8,
    /// With --pi: the guard size of namespace 1's protection information, 0 = 16-bit, 2 =
    /// 64-bit with a 48-bit reference tag (QEMU nvme-ns `pif`; needs --ms 16 or more). The
    /// driver sets Host Behavior Support LBAFEE, without which QEMU refuses I/O to it.
    #[arg(long, value_name = "0|2", default_value_t = 0,
          value_parser = clap::builder::PossibleValuesParser::new(["0", "2"])
              .map(|s| s.parse::<u8>().expect("validated")))]
    pub pif: u8,
    /// Put the vfio-bound controllers behind hot-pluggable `pcie-root-port`s (of N
    /// controllers, controller i is then 0000:0{N-i}:00.0: the guest numbers the ports' buses
    /// from the last down) with their images as -blockdev nodes, so they can be removed
    /// and re-added while COMMAND runs (implied by --unplug and --replug).
    #[arg(long)]
    pub hotplug: bool,
    /// Remove controller CTRL (0-based) SECONDS after COMMAND started, through QEMU's QMP
    /// `device_del` (the guest's pciehp then removes it; under a second here); repeatable.
    #[arg(long, value_name = "CTRL@SECONDS")]
    pub unplug: Vec<String>,
    /// Add controller CTRL and its namespaces back SECONDS after COMMAND started (QMP
    /// `device_add`); repeatable.
    #[arg(long, value_name = "CTRL@SECONDS")]
    pub replug: Vec<String>,
    /// Make reads of these logical blocks of controller 0's namespace 1 fail (QEMU's blkdebug
    /// driver under the backing file: the controller completes them with Unrecovered Read
    /// Error, SCT 2h / SC 81h). Comma-separated LBAs in units of --lba-size.
    #[arg(long, value_name = "LBA[,LBA...]", value_delimiter = ',')]
    pub inject_read_error: Vec<u64>,
    /// Maximum data transfer size as a power of two of the minimum page size (QEMU's `mdts`;
    /// QEMU's default is 7, i.e. 512 KiB).
    #[arg(long, value_name = "N")]
    pub mdts: Option<u8>,
    /// Maximum queue entries, zero-based as in CAP.MQES (QEMU's `mqes`; QEMU 8.2 and later).
    #[arg(long, value_name = "N")]
    pub mqes: Option<u16>,
    /// Maximum number of I/O queue pairs per controller (QEMU's `max_ioqpairs`).
    #[arg(long, value_name = "N")]
    pub max_ioqpairs: Option<u32>,
    /// Number of guest vCPUs.
    #[arg(long, value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub smp: u32,
    /// Guest memory (K/M/G suffixes).
    #[arg(long, value_name = "SIZE", default_value = "1G")]
    pub mem: Size,
    /// Number of 2 MiB hugepages reserved in the guest.
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub hugepages: u32,
    /// Kill the guest (and fail) if it has not powered off after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    pub timeout: u64,
    /// Restart a guest that has not started COMMAND after this many seconds (a stuck
    /// boot; up to 3 attempts).
    #[arg(long, value_name = "SECS", default_value_t = 90,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub boot_timeout: u64,
    /// Add one more controller (0000:00:03.0) that stays with the kernel's nvme driver,
    /// loaded with poll queues, for comparisons.
    #[arg(long)]
    pub kernel_nvme: bool,
    /// Copy a host file into the guest (repeatable). GUESTPATH defaults to `/bin/<basename>`.
    #[arg(long, value_name = "HOSTFILE[:GUESTPATH]")]
    pub put: Vec<String>,
    /// Extra argument passed verbatim to QEMU (repeatable), e.g. --qemu-arg=-d --qemu-arg=guest_errors.
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    pub qemu_arg: Vec<String>,
    /// Do not fail when the guest kernel logged IOMMU (DMAR) faults.
    #[arg(long)]
    pub allow_dma_faults: bool,
    /// Pin the guest's vCPU 0 (where `upnvme perf -c 0` polls) to host CPU 0 and every other
    /// QEMU thread (main loop and device model, I/O workers, other vCPUs) to the remaining
    /// host CPUs, so the polling vCPU and the emulated controller never share a host core.
    /// For benchmarks; needs 2 or more host CPUs and `taskset`.
    #[arg(long)]
    pub pin_vcpu0: bool,
    /// Use the guest binaries that are already built (target/guest) instead of building them.
    #[arg(long)]
    pub no_build: bool,
    /// Boot the compressed bzImage through the BIOS instead of the uncompressed vmlinux via PVH.
    #[arg(long)]
    pub bzimage: bool,
    /// Show the QEMU command line and the guest kernel's full boot log.
    #[arg(long, short)]
    pub verbose: bool,
}

impl Default for VmArgs {
    fn default() -> Self {
        Self::parse_from_args(std::iter::empty::<&str>()).expect("defaults parse")
    }
}

impl VmArgs {
    /// Parses VM options from words such as `["--lba-size", "512"]`.
    pub fn parse_from_args<I, S>(words: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString> + Clone,
    {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            vm: VmArgs,
        }
        let argv = std::iter::once(std::ffi::OsString::from("vm"))
            .chain(words.into_iter().map(Into::into));
        Ok(Wrapper::try_parse_from(argv)?.vm)
    }
}

/// A `--put` request: copy `host` to `guest` (absolute path) in the initramfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutFile {
    /// File on the host.
    pub host: PathBuf,
    /// Absolute path in the guest.
    pub guest: String,
}

/// Parses `HOSTFILE[:GUESTPATH]`.
pub fn parse_put(spec: &str) -> Result<PutFile> {
    let (host, guest) = match spec.split_once(':') {
        Some((h, g)) => (h, Some(g)),
        None => (spec, None),
    };
    if host.is_empty() {
        bail!("--put {spec:?}: the host file is empty");
    }
    let host = PathBuf::from(host);
    let base = host
        .file_name()
        .with_context(|| format!("--put {spec:?}: {} has no file name", host.display()))?
        .to_string_lossy()
        .into_owned();
    let guest = match guest {
        None | Some("") => format!("/bin/{base}"),
        Some(g) if !g.starts_with('/') => {
            bail!(
                "--put {spec:?}: the guest path must be absolute, e.g. {}:/bin/{base}",
                host.display()
            )
        }
        Some(g) if g.ends_with('/') => format!("{g}{base}"),
        Some(g) => g.to_string(),
    };
    Ok(PutFile { host, guest })
}

/// Quotes a word for a POSIX shell.
pub fn shell_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512K").unwrap(), 512 << 10);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("2t").unwrap(), 2 << 40);
        assert!(parse_size("M").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert_eq!(Size(256 << 20).to_string(), "256M");
        assert_eq!(Size(1 << 30).to_string(), "1G");
        assert_eq!(Size(1000).to_string(), "1000");
    }

    #[test]
    fn puts() {
        assert_eq!(
            parse_put("target/foo").unwrap(),
            PutFile {
                host: "target/foo".into(),
                guest: "/bin/foo".into()
            }
        );
        assert_eq!(
            parse_put("a/b:/usr/local/bin/c").unwrap().guest,
            "/usr/local/bin/c"
        );
        assert_eq!(parse_put("a/b:/opt/").unwrap().guest, "/opt/b");
        assert!(parse_put("a/b:relative").is_err());
        assert!(parse_put(":/x").is_err());
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("abc"), "abc");
        assert_eq!(shell_quote("--test-threads=1"), "--test-threads=1");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn vm_args_defaults_and_parsing() {
        let d = VmArgs::default();
        assert_eq!(d.controllers, 1);
        assert_eq!(d.namespaces, 1);
        assert_eq!(d.lba_size, 4096);
        assert_eq!(d.mem, Size(1 << 30));
        let a =
            VmArgs::parse_from_args(["--lba-size", "512", "--controllers", "2", "--mqes", "32"])
                .unwrap();
        assert_eq!((a.lba_size, a.controllers, a.mqes), (512, 2, Some(32)));
        assert!(VmArgs::parse_from_args(["--lba-size", "1024"]).is_err());
    }

    #[test]
    fn vm_command_words() {
        let cli = Cli::try_parse_from([
            "cargo xtask",
            "vm",
            "--controllers",
            "2",
            "--",
            "ls",
            "-l",
            "/dev/vfio",
        ])
        .unwrap();
        let Command::Vm(v) = cli.command else {
            panic!("not vm")
        };
        assert_eq!(v.vm.controllers, 2);
        assert_eq!(v.command, ["ls", "-l", "/dev/vfio"]);
        let cli = Cli::try_parse_from(["cargo xtask", "vm", "exit 7"]).unwrap();
        let Command::Vm(v) = cli.command else {
            panic!("not vm")
        };
        assert_eq!(v.command, ["exit 7"]);
        assert!(Cli::try_parse_from(["cargo xtask", "vm"]).is_err());
    }

    #[test]
    fn perf_args() {
        let cli = Cli::try_parse_from(["cargo xtask", "perf", "--smp", "3", "-q", "32", "-t", "5"])
            .unwrap();
        let Command::Perf(p) = cli.command else {
            panic!("not perf")
        };
        assert_eq!(p.vm.smp, 3);
        assert_eq!(p.args, ["-q", "32", "-t", "5"]);
        let cli = Cli::try_parse_from(["cargo xtask", "perf", "--", "--verbose"]).unwrap();
        let Command::Perf(p) = cli.command else {
            panic!("not perf")
        };
        assert!(!p.vm.verbose);
        assert_eq!(p.args, ["--verbose"]);
    }
}
