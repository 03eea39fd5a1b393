//! `upnvme perf` flags (spdk_nvme_perf-compatible where they overlap) and the
//! core list syntax; [`super::plan`] validates them.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// `--sq-announce`: when queued resubmissions are announced (shadow
/// doorbells).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Announce {
    /// Each command at once (`SqAnnounce::EachCommand`).
    Each,
    /// Once per batch (`SqAnnounce::Batch`).
    Batch,
    /// Per batch below `--sq-announce-deep` commands in flight (default 65),
    /// each command at once from there on (`SqAnnounce::WhenDeep`).
    Deep,
}

impl Announce {
    /// The library's policy for this flag, with `deep` the
    /// `--sq-announce-deep` depth (`SqAnnounce::DEEP`'s when `None`).
    pub fn policy(self, deep: Option<u16>) -> upnvme::SqAnnounce {
        match (self, deep) {
            (Announce::Each, _) => upnvme::SqAnnounce::EachCommand,
            (Announce::Batch, _) => upnvme::SqAnnounce::Batch,
            (Announce::Deep, None) => upnvme::SqAnnounce::DEEP,
            (Announce::Deep, Some(in_flight)) => upnvme::SqAnnounce::WhenDeep { in_flight },
        }
    }
}

impl PerfArgs {
    /// The announcement policy the flags ask for (`None`: the library's
    /// default); `--sq-announce-deep` with `each` or `batch` is a usage error.
    pub fn sq_announce_policy(&self) -> Result<Option<upnvme::SqAnnounce>, String> {
        match (self.sq_announce, self.sq_announce_deep) {
            (None, None) => Ok(None),
            (Some(a), None) => Ok(Some(a.policy(None))),
            (None | Some(Announce::Deep), Some(n)) => Ok(Some(Announce::Deep.policy(Some(n)))),
            (Some(a), Some(_)) => Err(format!(
                "--sq-announce-deep goes with --sq-announce deep, not {}",
                if a == Announce::Each { "each" } else { "batch" }
            )),
        }
    }
}

impl From<Announce> for upnvme::SqAnnounce {
    fn from(a: Announce) -> upnvme::SqAnnounce {
        a.policy(None)
    }
}

/// The I/O pattern (`-w`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    Randread,
    /// Random writes.
    Randwrite,
    /// Sequential mix of reads and writes (`-M` percent reads).
    Rw,
    /// Random mix of reads and writes (`-M` percent reads).
    Randrw,
}

impl Workload {
    /// Whether LBAs are chosen at random.
    pub fn random(self) -> bool {
        matches!(
            self,
            Workload::Randread | Workload::Randwrite | Workload::Randrw
        )
    }

    /// Percentage of reads.
    pub fn read_percent(self, mix: u8) -> u8 {
        match self {
            Workload::Read | Workload::Randread => 100,
            Workload::Write | Workload::Randwrite => 0,
            Workload::Rw | Workload::Randrw => mix,
        }
    }

    /// The spelling used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Read => "read",
            Workload::Write => "write",
            Workload::Randread => "randread",
            Workload::Randwrite => "randwrite",
            Workload::Rw => "rw",
            Workload::Randrw => "randrw",
        }
    }
}

/// Flags of `upnvme perf`.
#[derive(Args, Debug, Clone)]
pub struct PerfArgs {
    /// Queue depth per queue pair (outstanding I/Os; one pair per namespace
    /// and core).
    #[arg(short = 'q', long = "queue-depth", default_value_t = 1)]
    pub depth: u32,
    /// I/O size in bytes (a multiple of the LBA size; above MDTS the
    /// library splits each I/O into several commands).
    #[arg(short = 'o', long = "io-size", default_value_t = 4096)]
    pub io_size: usize,
    /// I/O pattern.
    #[arg(short = 'w', long = "workload", value_enum, default_value_t = Workload::Randread)]
    pub workload: Workload,
    /// Percentage of reads for rw/randrw.
    #[arg(short = 'M', long = "rwmixread", default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub read_mix: u8,
    /// Run time in seconds (after the warm-up).
    #[arg(short = 't', long = "time", default_value_t = 5)]
    pub seconds: u64,
    /// Stop after this many I/Os per queue pair instead of after -t seconds.
    #[arg(long = "io-count")]
    pub io_count: Option<u64>,
    /// Cores to run workers on: a list ("0,2-3") or a hex mask ("0x3").
    /// One worker thread per core, pinned, each with its own queue pair.
    /// Unlike spdk_nvme_perf's -c, a number without "0x" is a core, not a
    /// mask ("-c 3" is core 3; SPDK's "-c 3" is "-c 0x3").
    #[arg(short = 'c', long = "core-mask", default_value = "0")]
    pub cores: String,
    /// Namespace ID, decimal or 0x-prefixed hex (default: every active
    /// namespace; one queue pair per namespace and core).
    #[arg(short = 'n', long = "nsid", value_parser = crate::rw::number::<u32>)]
    pub nsid: Option<u32>,
    /// Warm-up seconds before measuring (I/O runs, results are discarded).
    #[arg(long = "warmup", default_value_t = 1)]
    pub warmup: u64,
    /// Reap completions right after every submit (the opportunistic reap).
    #[arg(long = "reap-on-submit")]
    pub reap_on_submit: bool,
    /// With `--doorbell-buffer`: do not let shadow doorbells skip MMIO
    /// writes (the Doorbell Buffer Config stays active and its values
    /// current; every update is MMIO too). Needs `--doorbell-buffer`: MMIO
    /// doorbells, the default, already write every update.
    #[arg(long = "no-shadow-doorbell", requires = "doorbell_buffer")]
    pub no_shadow_doorbell: bool,
    /// Set up shadow doorbells (Doorbell Buffer Config at bring-up, where
    /// the controller offers it; `ControllerOptions::shadow_doorbells`),
    /// instead of the library's default of MMIO doorbells only.
    #[arg(long = "doorbell-buffer", conflicts_with = "no_doorbell_buffer")]
    pub doorbell_buffer: bool,
    /// MMIO doorbells only, no Doorbell Buffer Config: the library's
    /// default (kept so that scripts written when the buffer was the
    /// default still say what they mean).
    #[arg(long = "no-doorbell-buffer")]
    pub no_doorbell_buffer: bool,
    /// Ring the SQ tail doorbell for every I/O (`submit`), as an application
    /// submitting one command at a time would, instead of once per batch of
    /// resubmissions (`queue` + `ring`, spdk_nvme_perf's way).
    #[arg(long = "ring-per-io")]
    pub ring_per_io: bool,
    /// When queued resubmissions are announced with shadow doorbells:
    /// `each` (every command at once, through the shadow tail and the
    /// EventIdx), `batch` (one shadow tail update per batch) or `deep` (per
    /// batch at shallow depths, each command from `--sq-announce-deep`
    /// commands in flight on); default: the library's (`SqAnnounce::default()`).
    /// Needs `--doorbell-buffer`: MMIO doorbells announce once per batch.
    #[arg(long = "sq-announce", value_enum, requires = "doorbell_buffer")]
    pub sq_announce: Option<Announce>,
    /// With `--sq-announce deep` (implied when given alone): commands in flight
    /// from which each command is announced at once. Needs `--doorbell-buffer`.
    #[arg(long = "sq-announce-deep", value_name = "N", requires = "doorbell_buffer",
          value_parser = clap::value_parser!(u16).range(1..))]
    pub sq_announce_deep: Option<u16>,
    /// Data pointers as SGLs for every I/O (one Data Block descriptor, also
    /// within two pages); needs a controller with SGL support (Identify
    /// Controller SGLS). Default: the library's choice (PRP1/PRP2 within two
    /// pages, an SGL beyond where supported).
    #[arg(long = "sgl", conflicts_with = "prp")]
    pub sgl: bool,
    /// Data pointers as PRPs only (PRP Lists beyond two pages).
    #[arg(long = "prp")]
    pub prp: bool,
    /// End-to-end protection of every I/O on a namespace formatted with
    /// protection information, as spdk_nvme_perf's -e:
    /// `PRACT=0|1,PRCHK=GUARD|REFTAG|APPTAG`. With PRACT=1 the controller
    /// builds the PI on writes (and strips it on reads when the metadata is just the PI tuple);
    /// with PRACT=0 perf builds it before each write.
    #[arg(short = 'e', long = "pi", value_parser = super::metadata::parse_pi)]
    pub pi: Option<upnvme::Protection>,
    /// Write the CQ head doorbell after every reap batch instead of the
    /// adaptive moderation.
    #[arg(long = "cq-head-every-reap")]
    pub cq_head_every_reap: bool,
    /// Submission queue entries per queue pair (default: the commands in
    /// flight plus one, at least 256, at most CAP.MQES + 1).
    #[arg(long = "queue-entries")]
    pub queue_entries: Option<u32>,
    /// PCI address of the controller (default: the only vfio-bound NVMe controller).
    #[arg(long = "device", short = 'd', value_parser = crate::pci_address)]
    pub device: Option<String>,
    /// -L: latency percentiles; -LL: plus a histogram table.
    #[arg(short = 'L', action = clap::ArgAction::Count)]
    pub latency: u8,
    /// Print polls, idle polls and doorbell writes per core, and time the
    /// driver's submit and reap calls (two TSC reads around each).
    #[arg(long = "transport-stats")]
    pub transport_stats: bool,
    /// Print one JSON document with everything instead of the tables.
    #[arg(long = "json")]
    pub json: bool,
    /// Write the latency histogram as `bucket_us,count` rows to FILE.
    #[arg(long = "histogram-csv")]
    pub histogram_csv: Option<PathBuf>,
    /// For write workloads: stamp every block, read everything written back at
    /// the end and count mismatches (non-zero exit on any).
    #[arg(long = "verify")]
    pub verify: bool,
    /// Run on past I/O errors (e.g. media errors) and count them by status, as
    /// spdk_nvme_perf's -Q; exit 0 when nothing else failed. Without it the run
    /// stops at the first failed I/O and exits 1.
    #[arg(short = 'Q', long = "continue-on-error")]
    pub continue_on_error: bool,
    /// Use 4 KiB pages instead of hugepages for DMA memory.
    #[arg(long = "no-hugepages")]
    pub no_hugepages: bool,
    /// Seed of the random LBA generator (default: from the clock), below
    /// 2^53 so that the JSON report's integer is exact in every JSON reader.
    #[arg(long = "seed", value_parser = clap::value_parser!(u64).range(..(1u64 << 53)))]
    pub seed: Option<u64>,
}

/// The highest core ID a core list may name (Linux's default NR_CPUS
/// limit is 8192; a list is expanded into memory before it is checked
/// against the machine).
const MAX_CORE: usize = 8191;

/// Parses "0,2-3" or "0x3" into sorted, de-duplicated core IDs.
pub fn parse_cores(s: &str) -> Result<Vec<usize>, String> {
    let s = s.trim();
    let mut out = Vec::new();
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        // Any length (taskset's masks are not limited to 128 bits): digit i
        // from the right holds cores 4i..4i+3.
        if hex.is_empty() {
            return Err(format!("core mask '{s}' is not hexadecimal"));
        }
        let hex = hex.trim_start_matches('0');
        for (i, ch) in hex.chars().rev().enumerate() {
            let nibble = ch
                .to_digit(16)
                .ok_or_else(|| format!("core mask '{s}' is not hexadecimal"))?;
            for bit in 0..4 {
                if nibble & (1 << bit) != 0 {
                    let core = 4 * i + bit;
                    if core > MAX_CORE {
                        return Err(format!(
                            "core mask '{s}' names core {core}, beyond the highest core ID \
                             supported ({MAX_CORE})"
                        ));
                    }
                    out.push(core);
                }
            }
        }
        if out.is_empty() {
            return Err(format!("core mask '{s}' selects no core"));
        }
        out.sort_unstable();
    } else {
        for part in s.split(',') {
            let part = part.trim();
            let num = |t: &str| {
                t.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("core list '{s}': '{t}' is not a core number"))
            };
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if a > b {
                        return Err(format!("core list '{s}': range {a}-{b} is backwards"));
                    }
                    if b > MAX_CORE {
                        return Err(format!(
                            "core list '{s}': core {b} is above {MAX_CORE} (no machine has that many)"
                        ));
                    }
                    out.extend(a..=b);
                }
                None => {
                    let c = num(part)?;
                    if c > MAX_CORE {
                        return Err(format!(
                            "core list '{s}': core {c} is above {MAX_CORE} (no machine has that many)"
                        ));
                    }
                    out.push(c)
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_lists_and_masks() {
        assert_eq!(parse_cores("0").unwrap(), vec![0]);
        assert_eq!(parse_cores("0x3").unwrap(), vec![0, 1]);
        assert_eq!(parse_cores("0,2-3,2").unwrap(), vec![0, 2, 3]);
        assert!(parse_cores("0x0").is_err());
        assert!(parse_cores("a").is_err());
        // A huge range is refused before it is expanded (it aborted the
        // process: capacity overflow, or terabytes of core IDs).
        assert!(parse_cores("0-18446744073709551615").is_err());
        assert!(parse_cores("0-1000000000000").is_err());
        assert!(parse_cores("9000").is_err());
        assert_eq!(parse_cores("8190-8191").unwrap(), vec![8190, 8191]);
        // Masks of any length, as taskset takes them (a 33-digit mask said
        // "not hexadecimal": it was parsed as a u128).
        let wide = format!("0x1{}", "0".repeat(40));
        assert_eq!(parse_cores(&wide).unwrap(), vec![160]);
        assert_eq!(
            parse_cores("0x000000000000000000000000000000000003").unwrap(),
            vec![0, 1]
        );
        assert_eq!(
            parse_cores(&format!("0x1{}", "0".repeat(2048))).unwrap_err(),
            format!(
                "core mask '0x1{}' names core 8192, beyond the highest core ID supported (8191)",
                "0".repeat(2048)
            )
        );
        assert_eq!(
            parse_cores("0x").unwrap_err(),
            "core mask '0x' is not hexadecimal"
        );
        assert_eq!(
            parse_cores("0x00").unwrap_err(),
            "core mask '0x00' selects no core"
        );
        assert_eq!(parse_cores("0x8001").unwrap(), vec![0, 15]);
        assert!(parse_cores("3-1").is_err());
        assert!(parse_cores("0xzz").is_err());
    }

    #[test]
    fn workload_read_percent() {
        assert_eq!(Workload::Randread.read_percent(30), 100);
        assert_eq!(Workload::Write.read_percent(30), 0);
        assert_eq!(Workload::Randrw.read_percent(30), 30);
        assert!(Workload::Randrw.random());
        assert!(!Workload::Rw.random());
    }
}
