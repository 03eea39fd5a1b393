//! Validation of `upnvme perf`'s flags against the machine and the controller,
//! as pure functions so that host tests can cover every bad input.
//!
//! [`check_args`] needs nothing but the flags and the cores present, and runs
//! before the controller is opened; [`validate`] adds the checks against what
//! the controller reported ([`DeviceFacts`]) and returns the [`Plan`] the
//! workers run. Every failure is a [`UsageError`]: one line, exit status 2,
//! before any I/O is issued.

use upnvme::{CqHeadPolicy, QueuePairOptions, SglMode};

use super::args::{PerfArgs, parse_cores};
use super::worker::NsPlan;
use crate::usage::UsageError;
use crate::usage::usage;

/// One active namespace as Identify Namespace describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NsFacts {
    /// Namespace ID.
    pub nsid: u32,
    /// Bytes per logical block.
    pub lba_size: u32,
    /// Logical blocks in the namespace (NSZE).
    pub blocks: u64,
    /// The metadata layout of its LBA format; `None` without metadata.
    pub metadata: Option<upnvme::MetadataLayout>,
}

/// What the opened controller reported that the flags are checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFacts {
    /// The controller's PCI address (for messages).
    pub device: String,
    /// Active namespaces, in NSID order.
    pub namespaces: Vec<NsFacts>,
    /// The maximum data transfer in bytes (from MDTS), `None` without a limit.
    pub max_transfer: Option<usize>,
    /// The raw MDTS field (for messages).
    pub mdts: u8,
    /// Entries a queue may have: CAP.MQES + 1.
    pub max_queue_entries: u32,
    /// I/O queue pairs the controller granted (Set Features Number of Queues).
    pub granted_queue_pairs: u32,
}

impl DeviceFacts {
    /// Reads the facts from an open controller.
    pub fn of(ctrl: &upnvme::Controller, device: &str) -> DeviceFacts {
        DeviceFacts {
            device: device.to_string(),
            namespaces: ctrl
                .namespaces()
                .iter()
                .map(|n| NsFacts {
                    nsid: n.id(),
                    lba_size: n.lba_size(),
                    blocks: n.lba_count(),
                    metadata: n.metadata_layout(),
                })
                .collect(),
            max_transfer: ctrl.max_transfer_bytes(),
            mdts: ctrl.identify().mdts,
            max_queue_entries: ctrl.cap().max_queue_entries(),
            granted_queue_pairs: u32::from(ctrl.granted_io_queues()),
        }
    }
}

/// The flags' device-independent meaning, after [`check_args`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgPlan {
    /// Cores to run one pinned worker on each, sorted.
    pub cores: Vec<usize>,
    /// Percentage of reads (100 for read workloads, 0 for write workloads).
    pub read_percent: u8,
}

/// What the workers run, after [`validate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Cores, one pinned worker each.
    pub cores: Vec<usize>,
    /// Percentage of reads.
    pub read_percent: u8,
    /// Namespaces, one queue pair per (namespace, core).
    pub namespaces: Vec<NsPlan>,
    /// Submission queue entries per queue pair.
    pub sq_entries: u32,
    /// Completion queue entries per queue pair.
    pub cq_entries: u32,
}

/// The checks that need no controller: depth, size, run length, cores,
/// `--verify` on a workload that writes. `cores_present` are the IDs of the
/// cores this process may run on.
pub fn check_args(a: &PerfArgs, cores_present: &[usize]) -> Result<ArgPlan, UsageError> {
    if a.depth == 0 {
        return Err(usage("queue depth (-q) must be at least 1"));
    }
    if a.io_size == 0 {
        return Err(usage("I/O size (-o) must be at least one block"));
    }
    if a.seconds == 0 && a.io_count.is_none() {
        return Err(usage(
            "run time (-t) must be at least 1 second (or use --io-count)",
        ));
    }
    if a.io_count == Some(0) {
        return Err(usage("--io-count must be at least 1"));
    }
    if let Some(n) = a.io_count
        && n < u64::from(a.depth)
    {
        return Err(usage(format!(
            "--io-count {n} is below the queue depth {d}: each queue pair keeps {d} I/Os in flight; use --io-count {d} or more, or -q {n}",
            d = a.depth
        )));
    }
    if a.read_mix > 100 {
        // clap's range check normally catches this first.
        return Err(usage(format!(
            "read percentage (-M) {} is above 100",
            a.read_mix
        )));
    }
    a.sq_announce_policy().map_err(UsageError)?;
    let cores = parse_cores(&a.cores).map_err(UsageError)?;
    if let Some(bad) = cores.iter().find(|c| !cores_present.contains(c)) {
        return Err(usage(format!(
            "core {bad} is not available (cores present: {cores_present:?})"
        )));
    }
    let read_percent = a.workload.read_percent(a.read_mix);
    if a.verify && read_percent == 100 {
        return Err(usage(
            "--verify needs a workload that writes (write, randwrite, rw, randrw)",
        ));
    }
    Ok(ArgPlan {
        cores,
        read_percent,
    })
}

/// Every check of the flags: [`check_args`], then against the controller —
/// namespace present, I/O size a multiple of the LBA size and within the
/// namespace, a block within MDTS (a larger I/O is split into commands of at
/// most MDTS), `--queue-entries` within CAP.MQES + 1, the depth (times the
/// commands per I/O) fitting the queue, enough granted queue pairs.
pub fn validate(
    a: &PerfArgs,
    dev: &DeviceFacts,
    cores_present: &[usize],
) -> Result<Plan, UsageError> {
    let ArgPlan {
        cores,
        read_percent,
    } = check_args(a, cores_present)?;
    let addr = &dev.device;
    let chosen: Vec<NsFacts> = match a.nsid {
        Some(n) => match dev.namespaces.iter().find(|ns| ns.nsid == n) {
            Some(ns) => vec![*ns],
            None => {
                let active: Vec<u32> = dev.namespaces.iter().map(|n| n.nsid).collect();
                return Err(usage(format!(
                    "namespace {n} is not active on {addr} (active: {active:?})"
                )));
            }
        },
        None => dev.namespaces.clone(),
    };
    if chosen.is_empty() {
        return Err(usage(format!("{addr} has no active namespace")));
    }
    let mut namespaces = Vec::with_capacity(chosen.len());
    // Commands per I/O: 1 up to MDTS, more above (the library splits).
    let mut pieces = 1u32;
    for ns in &chosen {
        let (n, lba) = (ns.nsid, ns.lba_size as usize);
        if a.pi.is_some() && ns.metadata.is_none_or(|l| l.pi_type == 0) {
            let others = chosen
                .iter()
                .filter(|o| o.metadata.is_some_and(|l| l.pi_type != 0))
                .map(|o| o.nsid.to_string())
                .collect::<Vec<_>>();
            let hint = if others.is_empty() {
                String::new()
            } else {
                format!(
                    "; run on the namespaces that have it with -n {}",
                    others.join(",")
                )
            };
            return Err(usage(format!(
                "-e (protection information) needs a namespace formatted with PI; namespace {n} \
                 has none (`upnvme identify -H` shows DPS; `upnvme format --pi` sets it){hint}"
            )));
        }
        if a.pi.is_some_and(|p| p.check_ref_tag) && ns.metadata.is_some_and(|l| l.pi_type == 3) {
            return Err(usage(format!(
                "namespace {n} has Type 3 protection, which has no reference tag to check: leave \
                 REFTAG out of -e PRCHK"
            )));
        }
        if lba == 0 || !a.io_size.is_multiple_of(lba) {
            return Err(usage(format!(
                "I/O size {} is not a multiple of namespace {n}'s LBA size {lba}",
                a.io_size
            )));
        }
        let size = ns.blocks.saturating_mul(lba as u64);
        if a.io_size as u64 > size {
            return Err(usage(format!(
                "I/O size {} is larger than namespace {n} ({size} bytes)",
                a.io_size
            )));
        }
        // Above MDTS the library splits each I/O into commands of whole
        // blocks (at most MDTS each; on an extended-LBA format the
        // interleaved metadata moves in the data buffer and counts too).
        let stride = super::metadata::data_stride(ns.lba_size, ns.metadata, a.pi);
        if let Some(max) = dev.max_transfer {
            let per = max / stride;
            if per == 0 {
                return Err(usage(format!(
                    "a block of namespace {n} moves {stride} bytes, more than the controller's maximum transfer of {max} bytes (MDTS {})",
                    dev.mdts
                )));
            }
            pieces = pieces.max((a.io_size / lba).div_ceil(per) as u32);
        }
        namespaces.push(NsPlan {
            nsid: n,
            lba_size: ns.lba_size,
            blocks: ns.blocks,
            metadata: ns.metadata,
        });
    }
    let mqes = dev.max_queue_entries;
    if let Some(e) = a.queue_entries
        && !(2..=mqes).contains(&e)
    {
        return Err(usage(format!(
            "--queue-entries {e}: must be 2..={mqes} (CAP.MQES + 1)"
        )));
    }
    // Commands in flight at once: every I/O's pieces.
    let commands = a.depth.saturating_mul(pieces);
    let sq_entries = a
        .queue_entries
        .unwrap_or_else(|| commands.saturating_add(1).max(256).min(mqes));
    if commands >= sq_entries {
        if pieces > 1 {
            return Err(usage(format!(
                "queue depth {} with I/Os of {} bytes, each {pieces} commands of at most {} bytes (MDTS {}), keeps {commands} commands in flight: more than a queue of {sq_entries} entries holds (at most {}); the controller allows {mqes} entries",
                a.depth,
                a.io_size,
                dev.max_transfer.unwrap_or(0),
                dev.mdts,
                sq_entries - 1
            )));
        }
        return Err(usage(format!(
            "queue depth {} does not fit a queue of {sq_entries} entries (at most {}); the controller allows {mqes} entries",
            a.depth,
            sq_entries - 1
        )));
    }
    let pairs = cores.len() * namespaces.len();
    if pairs > dev.granted_queue_pairs as usize {
        return Err(usage(format!(
            "{pairs} queue pairs needed ({} cores x {} namespaces) but the controller granted {}",
            cores.len(),
            namespaces.len(),
            dev.granted_queue_pairs
        )));
    }
    Ok(Plan {
        cores,
        read_percent,
        namespaces,
        sq_entries,
        cq_entries: sq_entries.saturating_mul(2).min(mqes).max(sq_entries),
    })
}

/// `--sgl` / `--prp` / neither.
pub fn sgl_mode(a: &PerfArgs) -> SglMode {
    if a.sgl {
        SglMode::Always
    } else if a.prp {
        SglMode::Never
    } else {
        SglMode::Auto
    }
}

/// The queue pair options of every job: the queue sizes of `plan` and
/// what the flags ask for (doorbells, CQ head policy, data pointer, SQ
/// announcement).
pub fn queue_pair_options(a: &PerfArgs, plan: &Plan) -> anyhow::Result<QueuePairOptions> {
    let policy = if a.cq_head_every_reap {
        CqHeadPolicy::EveryReap
    } else {
        CqHeadPolicy::default()
    };
    Ok(QueuePairOptions {
        entries: Some(plan.sq_entries),
        cq_entries: Some(plan.cq_entries),
        shadow_doorbells: !a.no_shadow_doorbell,
        reap_on_submit: a.reap_on_submit,
        cq_head_policy: policy,
        sgl: sgl_mode(a),
        sq_announce: a
            .sq_announce_policy()
            .map_err(|e| anyhow::anyhow!(e))?
            .unwrap_or_default(),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cli, Command, exit_status};
    use clap::Parser;

    /// The QEMU test bed's default controller: one 4 KiB-block namespace of
    /// 1 GiB, MDTS 7 (512 KiB), 2048 queue entries, 64 queue pairs.
    fn qemu() -> DeviceFacts {
        DeviceFacts {
            device: "0000:00:04.0".into(),
            namespaces: vec![NsFacts {
                nsid: 1,
                lba_size: 4096,
                blocks: 262_144,
                metadata: None,
            }],
            max_transfer: Some(512 * 1024),
            mdts: 7,
            max_queue_entries: 2048,
            granted_queue_pairs: 64,
        }
    }

    const CORES: [usize; 2] = [0, 1];

    /// `upnvme perf ARGS…` as clap parses it.
    fn parse(args: &[&str]) -> Result<PerfArgs, clap::Error> {
        let argv = ["upnvme", "perf"].iter().chain(args).copied();
        match Cli::try_parse_from(argv)?.command {
            Command::Perf(a) => Ok(a),
            c => panic!("parsed as {c:?}"),
        }
    }

    /// `--prp` reaches the queue pairs (it was only reported: the I/O went
    /// out with SGLs on an SGL-capable controller while the report said
    /// "prp").
    #[test]
    fn the_data_pointer_flags_reach_the_queue_pairs() {
        for (args, want) in [
            (&["--prp"][..], SglMode::Never),
            (&["--sgl"][..], SglMode::Always),
            (&[][..], SglMode::Auto),
        ] {
            let a = parse(args).unwrap();
            let plan = validate(&a, &qemu(), &CORES).unwrap();
            let qp = queue_pair_options(&a, &plan).unwrap();
            assert_eq!(qp.sgl, want, "{args:?}");
            assert_eq!(sgl_mode(&a), want);
            assert_eq!(qp.entries, Some(plan.sq_entries));
        }
    }

    #[test]
    fn sq_announce_flag_is_typed() {
        use super::super::args::Announce;
        assert_eq!(parse(&[]).unwrap().sq_announce, None);
        let a = parse(&["--doorbell-buffer", "--sq-announce", "each"]).unwrap();
        assert_eq!(a.sq_announce, Some(Announce::Each));
        assert_eq!(
            upnvme::SqAnnounce::from(Announce::Each),
            upnvme::SqAnnounce::EachCommand
        );
        assert_eq!(
            parse(&["--doorbell-buffer", "--sq-announce", "batch"])
                .unwrap()
                .sq_announce,
            Some(Announce::Batch)
        );
        assert!(parse(&["--doorbell-buffer", "--sq-announce", "sometimes"]).is_err());
        let deep = |args: &[&str]| {
            let args: Vec<&str> = ["--doorbell-buffer"].iter().chain(args).copied().collect();
            parse(&args).unwrap().sq_announce_policy()
        };
        assert_eq!(
            deep(&["--sq-announce", "deep"]),
            Ok(Some(upnvme::SqAnnounce::DEEP))
        );
        assert_eq!(
            deep(&["--sq-announce-deep", "16"]),
            Ok(Some(upnvme::SqAnnounce::WhenDeep { in_flight: 16 }))
        );
        assert_eq!(
            deep(&["--sq-announce", "deep", "--sq-announce-deep", "8"]),
            Ok(Some(upnvme::SqAnnounce::WhenDeep { in_flight: 8 }))
        );
        assert!(deep(&["--sq-announce", "each", "--sq-announce-deep", "8"]).is_err());
        assert!(parse(&["--doorbell-buffer", "--sq-announce-deep", "0"]).is_err());
        assert_eq!(deep(&[]), Ok(None));
        // MMIO doorbells (the default) announce per batch and write every
        // update: the flags would change nothing, so they need the doorbell
        // buffer.
        for args in [
            &["--sq-announce", "each"][..],
            &["--sq-announce-deep", "8"][..],
            &["--no-shadow-doorbell"][..],
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::MissingRequiredArgument,
                "{e}"
            );
            assert!(e.to_string().contains("--doorbell-buffer"), "{e}");
        }
    }

    /// The usage error `args` get against `dev`, after checking that it is
    /// one (exit status 2).
    fn bad(args: &[&str], dev: &DeviceFacts) -> String {
        let a = parse(args).unwrap_or_else(|e| panic!("{args:?} does not parse: {e}"));
        let e = validate(&a, dev, &CORES).expect_err("accepted");
        assert_eq!(exit_status(&anyhow::Error::from(e.clone())), 2, "{args:?}");
        e.0
    }

    /// clap's error for `args`, after checking that it is a usage error (exit 2).
    fn clap_bad(args: &[&str]) -> String {
        let e = parse(args).expect_err("parsed");
        assert_eq!(e.exit_code(), 2, "{args:?}: {e}");
        e.to_string()
    }

    #[test]
    fn defaults_are_spdk_like() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.depth, 1);
        assert_eq!(a.io_size, 4096);
        assert_eq!(a.workload, super::super::args::Workload::Randread);
        assert_eq!(a.read_mix, 50);
        assert_eq!(a.seconds, 5);
        assert_eq!(a.io_count, None);
        assert_eq!(a.cores, "0");
        assert_eq!(a.nsid, None);
        assert_eq!(a.warmup, 1);
        assert_eq!(a.latency, 0);
        assert!(!a.reap_on_submit && !a.no_shadow_doorbell && !a.cq_head_every_reap);
        assert!(!a.json && !a.transport_stats && !a.verify && !a.no_hugepages);
        let p = validate(&a, &qemu(), &CORES).unwrap();
        assert_eq!(
            p,
            Plan {
                cores: vec![0],
                read_percent: 100,
                namespaces: vec![NsPlan {
                    nsid: 1,
                    lba_size: 4096,
                    blocks: 262_144,
                    metadata: None,
                }],
                sq_entries: 256,
                cq_entries: 512,
            }
        );
    }

    #[test]
    fn every_flag_parses() {
        let a = parse(&[
            "-q",
            "32",
            "-o",
            "8192",
            "-w",
            "randrw",
            "-M",
            "70",
            "-t",
            "3",
            "--io-count",
            "100",
            "-c",
            "0x3",
            "-n",
            "1",
            "--warmup",
            "0",
            "--reap-on-submit",
            "--doorbell-buffer",
            "--no-shadow-doorbell",
            "--cq-head-every-reap",
            "--queue-entries",
            "64",
            "-d",
            "0000:00:04.0",
            "-LL",
            "--transport-stats",
            "--json",
            "--histogram-csv",
            "/tmp/h.csv",
            "--verify",
            "--no-hugepages",
            "--seed",
            "7",
        ])
        .unwrap();
        assert_eq!(
            (a.depth, a.io_size, a.read_mix, a.seconds),
            (32, 8192, 70, 3)
        );
        assert_eq!((a.io_count, a.nsid, a.warmup), (Some(100), Some(1), 0));
        assert_eq!(a.latency, 2);
        assert_eq!(a.queue_entries, Some(64));
        assert_eq!(a.device.as_deref(), Some("0000:00:04.0"));
        assert_eq!(a.seed, Some(7));
        assert!(a.reap_on_submit && a.no_shadow_doorbell && a.cq_head_every_reap);
        assert!(a.transport_stats && a.json && a.verify && a.no_hugepages);
        let p = validate(&a, &qemu(), &CORES).unwrap();
        assert_eq!(p.cores, [0, 1]);
        assert_eq!(p.read_percent, 70);
        assert_eq!((p.sq_entries, p.cq_entries), (64, 128));
        // Long spellings, and -L twice as two flags.
        let a = parse(&[
            "--queue-depth",
            "4",
            "--io-size",
            "4096",
            "--workload",
            "write",
            "--rwmixread",
            "10",
            "--time",
            "2",
            "--core-mask",
            "0-1",
            "--nsid",
            "1",
            "--device",
            "00:04.0",
            "-L",
            "-L",
        ])
        .unwrap();
        assert_eq!(a.latency, 2);
        let p = validate(&a, &qemu(), &CORES).unwrap();
        assert_eq!(p.read_percent, 0, "-M only matters for rw/randrw");
        assert_eq!(p.cores, [0, 1]);
    }

    #[test]
    fn unknown_workload() {
        let e = clap_bad(&["-w", "sideways"]);
        assert!(
            e.contains("invalid value 'sideways' for '--workload <WORKLOAD>'"),
            "{e}"
        );
        assert!(
            e.contains("[possible values: read, write, randread, randwrite, rw, randrw]"),
            "{e}"
        );
    }

    #[test]
    fn read_percentage_above_100() {
        let e = clap_bad(&["-w", "rw", "-M", "101"]);
        assert!(
            e.contains("invalid value '101' for '--rwmixread <READ_MIX>': 101 is not in 0..=100"),
            "{e}"
        );
        // Built without clap, the same check holds.
        let mut a = parse(&["-w", "rw"]).unwrap();
        a.read_mix = 150;
        let e = validate(&a, &qemu(), &CORES).unwrap_err();
        assert_eq!(e.0, "read percentage (-M) 150 is above 100");
    }

    #[test]
    fn not_a_number() {
        let e = clap_bad(&["-q", "deep"]);
        assert!(e.contains("invalid value 'deep' for '--queue-depth"), "{e}");
        let e = clap_bad(&["-q", "-1"]);
        assert!(e.contains("-1"), "{e}");
    }

    #[test]
    fn depth_zero() {
        assert_eq!(
            bad(&["-q", "0"], &qemu()),
            "queue depth (-q) must be at least 1"
        );
    }

    #[test]
    fn depth_larger_than_the_queue_allows() {
        assert_eq!(
            bad(&["-q", "5000"], &qemu()),
            "queue depth 5000 does not fit a queue of 2048 entries (at most 2047); the controller allows 2048 entries"
        );
        // The deepest that fits, and one more.
        let a = parse(&["-q", "2047"]).unwrap();
        let p = validate(&a, &qemu(), &CORES).unwrap();
        assert_eq!((p.sq_entries, p.cq_entries), (2048, 2048));
        assert_eq!(
            bad(&["-q", "2048"], &qemu()),
            "queue depth 2048 does not fit a queue of 2048 entries (at most 2047); the controller allows 2048 entries"
        );
        // With an explicit queue size.
        assert_eq!(
            bad(&["-q", "64", "--queue-entries", "64"], &qemu()),
            "queue depth 64 does not fit a queue of 64 entries (at most 63); the controller allows 2048 entries"
        );
        // A small-MQES controller (the test bed's --mqes 31).
        let small = DeviceFacts {
            max_queue_entries: 32,
            ..qemu()
        };
        assert_eq!(
            bad(&["-q", "32"], &small),
            "queue depth 32 does not fit a queue of 32 entries (at most 31); the controller allows 32 entries"
        );
        let p = validate(&parse(&["-q", "31"]).unwrap(), &small, &CORES).unwrap();
        assert_eq!((p.sq_entries, p.cq_entries), (32, 32));
    }

    #[test]
    fn size_zero_or_not_a_multiple_of_the_lba_size() {
        assert_eq!(
            bad(&["-o", "0"], &qemu()),
            "I/O size (-o) must be at least one block"
        );
        assert_eq!(
            bad(&["-o", "1000"], &qemu()),
            "I/O size 1000 is not a multiple of namespace 1's LBA size 4096"
        );
        assert_eq!(
            bad(&["-o", "6144"], &qemu()),
            "I/O size 6144 is not a multiple of namespace 1's LBA size 4096"
        );
        // 512-byte blocks take 512-byte multiples.
        let lba512 = DeviceFacts {
            namespaces: vec![NsFacts {
                nsid: 1,
                lba_size: 512,
                blocks: 2_097_152,
                metadata: None,
            }],
            ..qemu()
        };
        validate(&parse(&["-o", "1536"]).unwrap(), &lba512, &CORES).unwrap();
        assert_eq!(
            bad(&["-o", "1000"], &lba512),
            "I/O size 1000 is not a multiple of namespace 1's LBA size 512"
        );
    }

    #[test]
    fn size_above_mdts() {
        // Above MDTS each I/O goes as several commands (the library splits
        // it): the queue is sized for all of them.
        let p = validate(
            &parse(&["-o", "1048576", "-q", "32"]).unwrap(),
            &qemu(),
            &CORES,
        )
        .unwrap();
        assert_eq!(p.sq_entries, 256);
        let p = validate(
            &parse(&["-o", "2097152", "-q", "128"]).unwrap(),
            &qemu(),
            &CORES,
        )
        .unwrap();
        assert_eq!(p.sq_entries, 513, "128 I/Os x 4 commands + 1");
        assert_eq!(
            bad(
                &["-o", "1048576", "-q", "8", "--queue-entries", "16"],
                &qemu()
            ),
            "queue depth 8 with I/Os of 1048576 bytes, each 2 commands of at most 524288 bytes (MDTS 7), keeps 16 commands in flight: more than a queue of 16 entries holds (at most 15); the controller allows 2048 entries"
        );
        validate(&parse(&["-o", "524288"]).unwrap(), &qemu(), &CORES).unwrap();
        // 4096 + 8 extended: 128 blocks move 525312 bytes, above 512 KiB:
        // two commands (127 blocks and 1).
        let extended = DeviceFacts {
            namespaces: vec![NsFacts {
                metadata: Some(upnvme::MetadataLayout {
                    ms: 8,
                    extended: true,
                    pi_type: 0,
                    pi_first: false,
                    pif: upnvme::pi::Pif::Guard16,
                    sts: 0,
                }),
                ..qemu().namespaces[0]
            }],
            ..qemu()
        };
        let p = validate(
            &parse(&["-o", "524288", "-q", "255"]).unwrap(),
            &extended,
            &CORES,
        )
        .unwrap();
        assert_eq!(p.sq_entries, 511, "255 I/Os x 2 commands + 1");
        // A block larger than MDTS cannot be split.
        let tiny = DeviceFacts {
            max_transfer: Some(4096),
            mdts: 0,
            ..extended
        };
        assert_eq!(
            bad(&["-o", "4096"], &tiny),
            "a block of namespace 1 moves 4104 bytes, more than the controller's maximum transfer of 4096 bytes (MDTS 0)"
        );
    }

    #[test]
    fn size_above_the_namespace() {
        let tiny = DeviceFacts {
            namespaces: vec![NsFacts {
                nsid: 1,
                lba_size: 4096,
                blocks: 2,
                metadata: None,
            }],
            ..qemu()
        };
        assert_eq!(
            bad(&["-o", "12288"], &tiny),
            "I/O size 12288 is larger than namespace 1 (8192 bytes)"
        );
    }

    #[test]
    fn core_not_present() {
        assert_eq!(
            bad(&["-c", "9"], &qemu()),
            "core 9 is not available (cores present: [0, 1])"
        );
        assert_eq!(
            bad(&["-c", "0x4"], &qemu()),
            "core 2 is not available (cores present: [0, 1])"
        );
        assert_eq!(
            bad(&["-c", "0x0"], &qemu()),
            "core mask '0x0' selects no core"
        );
        assert_eq!(
            bad(&["-c", "a"], &qemu()),
            "core list 'a': 'a' is not a core number"
        );
        assert_eq!(
            bad(&["-c", "3-1"], &qemu()),
            "core list '3-1': range 3-1 is backwards"
        );
        assert_eq!(
            bad(&["-c", "0xzz"], &qemu()),
            "core mask '0xzz' is not hexadecimal"
        );
    }

    #[test]
    fn namespace_absent() {
        assert_eq!(
            bad(&["-n", "77"], &qemu()),
            "namespace 77 is not active on 0000:00:04.0 (active: [1])"
        );
        let empty = DeviceFacts {
            namespaces: Vec::new(),
            ..qemu()
        };
        assert_eq!(bad(&[], &empty), "0000:00:04.0 has no active namespace");
    }

    #[test]
    fn run_length() {
        assert_eq!(
            bad(&["-t", "0"], &qemu()),
            "run time (-t) must be at least 1 second (or use --io-count)"
        );
        assert_eq!(
            bad(&["--io-count", "0"], &qemu()),
            "--io-count must be at least 1"
        );
        assert_eq!(
            bad(&["--io-count", "2", "-q", "8"], &qemu()),
            "--io-count 2 is below the queue depth 8: each queue pair keeps 8 I/Os in flight; use --io-count 8 or more, or -q 2"
        );
        // -t 0 is fine when the run is bounded by --io-count.
        validate(
            &parse(&["-t", "0", "--io-count", "10"]).unwrap(),
            &qemu(),
            &CORES,
        )
        .unwrap();
    }

    #[test]
    fn queue_entries_out_of_range() {
        assert_eq!(
            bad(&["--queue-entries", "1"], &qemu()),
            "--queue-entries 1: must be 2..=2048 (CAP.MQES + 1)"
        );
        assert_eq!(
            bad(&["--queue-entries", "4096"], &qemu()),
            "--queue-entries 4096: must be 2..=2048 (CAP.MQES + 1)"
        );
        let p = validate(&parse(&["--queue-entries", "2"]).unwrap(), &qemu(), &CORES).unwrap();
        assert_eq!((p.sq_entries, p.cq_entries), (2, 4));
    }

    #[test]
    fn too_many_queue_pairs() {
        let two_ns = DeviceFacts {
            namespaces: vec![
                NsFacts {
                    nsid: 1,
                    lba_size: 4096,
                    blocks: 1024,
                    metadata: None,
                },
                NsFacts {
                    nsid: 2,
                    lba_size: 4096,
                    blocks: 1024,
                    metadata: None,
                },
            ],
            granted_queue_pairs: 3,
            ..qemu()
        };
        assert_eq!(
            bad(&["-c", "0,1"], &two_ns),
            "4 queue pairs needed (2 cores x 2 namespaces) but the controller granted 3"
        );
        // One namespace on two cores fits.
        let p = validate(&parse(&["-c", "0,1", "-n", "2"]).unwrap(), &two_ns, &CORES).unwrap();
        assert_eq!(p.namespaces.len(), 1);
        assert_eq!(p.namespaces[0].nsid, 2);
    }

    #[test]
    fn verify_on_read_workloads() {
        for w in ["read", "randread"] {
            assert_eq!(
                bad(&["-w", w, "--verify"], &qemu()),
                "--verify needs a workload that writes (write, randwrite, rw, randrw)"
            );
        }
        // -M 100 makes rw read-only too.
        assert_eq!(
            bad(&["-w", "rw", "-M", "100", "--verify"], &qemu()),
            "--verify needs a workload that writes (write, randwrite, rw, randrw)"
        );
        for w in ["write", "randwrite", "rw", "randrw"] {
            validate(&parse(&["-w", w, "--verify"]).unwrap(), &qemu(), &CORES).unwrap();
        }
    }

    #[test]
    fn device_free_checks_come_first() {
        // check_args alone (before the controller is opened) catches these.
        for (args, msg) in [
            (&["-q", "0"][..], "queue depth (-q) must be at least 1"),
            (
                &["-c", "9"],
                "core 9 is not available (cores present: [0, 1])",
            ),
            (
                &["-w", "read", "--verify"],
                "--verify needs a workload that writes (write, randwrite, rw, randrw)",
            ),
        ] {
            let a = parse(args).unwrap();
            assert_eq!(check_args(&a, &CORES).unwrap_err().0, msg);
        }
        // When several things are wrong, the device-free one is reported.
        assert_eq!(
            bad(&["-q", "0", "-n", "77"], &qemu()),
            "queue depth (-q) must be at least 1"
        );
    }
}
