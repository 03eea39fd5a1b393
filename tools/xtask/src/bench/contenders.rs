//! The contenders of `cargo xtask bench` and the guest script that runs them in
//! interleaved rounds.

use std::fmt::Write as _;

/// How a contender is run and how its output is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `upnvme perf` on the vfio-bound controller.
    Upnvme {
        /// `--reap-on-submit`.
        reap_on_submit: bool,
        /// How shadow doorbells are used.
        shadow: Shadow,
        /// `--cq-head-every-reap` (CQ head moderation off).
        every_reap: bool,
        /// `--ring-per-io` (one SQ doorbell per I/O instead of per batch).
        ring_per_io: bool,
    },
    /// `upnvme-rawfloor` on the vfio-bound controller.
    RawFloor,
    /// `upnvme-rawfloor --sq-first`: the same loop with the CQ head doorbell
    /// written after the next SQ tail doorbell.
    RawFloorSqFirst,
    /// `upnvme-rawfloor --driver`: the depth-1 closed loop through upnvme's
    /// queue pair API (`submit`, then `process_completions(1, ..)`).
    DriverLoop,
    /// fio on the kernel's nvme driver.
    Fio(FioEngine),
}

/// Shadow doorbell modes of `upnvme perf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shadow {
    /// Doorbell Buffer Config active and the EventIdx may skip MMIO writes
    /// (`--doorbell-buffer`).
    On,
    /// Doorbell Buffer Config active, every update also written over MMIO
    /// (`--doorbell-buffer --no-shadow-doorbell`).
    NoEventIdx,
    /// No Doorbell Buffer Config at all: MMIO doorbells only (the default).
    Off,
}

/// The fio profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FioEngine {
    /// io_uring with `hipri` (completions polled on the poll queues).
    IoUringHipri,
    /// pvsync2 (preadv2) with `hipri` (RWF_HIPRI).
    Pvsync2Hipri,
    /// libaio (interrupt-driven).
    Libaio,
}

/// One contender: a program, a configuration, a depth and an I/O size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contender {
    /// Stable identifier (no spaces), used in the result markers:
    /// `<configuration>-qd<depth>` for 4 KiB reads,
    /// `<configuration>-<KiB>k-qd<depth>` for other sizes.
    pub id: String,
    /// Name in tables and plots.
    pub label: String,
    /// Outstanding I/Os.
    pub qd: u32,
    /// Bytes per I/O (random reads).
    pub io_bytes: u32,
    /// What runs.
    pub kind: Kind,
}

/// The I/O size of every contender of the options set and of the depth sweep.
pub const BS_4K: u32 = 4096;

impl Contender {
    fn new(kind: Kind, qd: u32) -> Self {
        Self::sized(kind, qd, BS_4K)
    }

    /// A contender reading `io_bytes` per I/O. The raw floor reads 4 KiB only.
    fn sized(kind: Kind, qd: u32, io_bytes: u32) -> Self {
        debug_assert!(
            io_bytes == BS_4K
                || !matches!(
                    kind,
                    Kind::RawFloor | Kind::RawFloorSqFirst | Kind::DriverLoop
                ),
            "the raw floor reads 4 KiB"
        );
        let (id, label) = match kind {
            Kind::Upnvme {
                reap_on_submit,
                shadow,
                every_reap,
                ring_per_io,
            } => {
                let mut id = String::from("upnvme");
                let mut label = String::from("upnvme");
                let mut extra = Vec::new();
                if ring_per_io {
                    id.push_str("-perio");
                    extra.push("SQ doorbell per I/O");
                }
                if reap_on_submit {
                    id.push_str("-ros");
                    extra.push("reap_on_submit");
                }
                match shadow {
                    Shadow::Off => {}
                    Shadow::On => {
                        id.push_str("-dbbuf");
                        extra.push("doorbell buffer");
                    }
                    Shadow::NoEventIdx => {
                        id.push_str("-noshadow");
                        extra.push("doorbell buffer, no EventIdx");
                    }
                }
                if every_reap {
                    id.push_str("-everyreap");
                    extra.push("CQ head every reap");
                }
                if !extra.is_empty() {
                    label = format!("upnvme ({})", extra.join(", "));
                }
                (id, label)
            }
            Kind::RawFloor => ("rawfloor".into(), "raw floor".into()),
            Kind::RawFloorSqFirst => (
                "rawfloor-sqfirst".into(),
                "raw floor (SQ tail first)".into(),
            ),
            Kind::DriverLoop => ("driverloop".into(), "upnvme minimal loop".into()),
            Kind::Fio(FioEngine::IoUringHipri) => {
                ("fio-io_uring-hipri".into(), "kernel io_uring hipri".into())
            }
            Kind::Fio(FioEngine::Pvsync2Hipri) => {
                ("fio-pvsync2-hipri".into(), "kernel pvsync2 hipri".into())
            }
            Kind::Fio(FioEngine::Libaio) => ("fio-libaio".into(), "kernel libaio".into()),
        };
        let size = if io_bytes == BS_4K {
            String::new()
        } else {
            format!("-{}k", io_bytes / 1024)
        };
        Contender {
            id: format!("{id}{size}-qd{qd}"),
            label,
            qd,
            io_bytes,
            kind,
        }
    }

    /// The I/O size as text: `4 KiB`, `128 KiB`.
    pub fn size_text(&self) -> String {
        format!("{} KiB", self.io_bytes / 1024)
    }

    /// True for upnvme perf in its default configuration (reap_on_submit off,
    /// MMIO doorbells only, adaptive CQ head): the configuration the targets
    /// are judged on (at any depth and size).
    pub fn is_upnvme_default(&self) -> bool {
        self.kind == UPNVME_DEFAULT
    }

    /// The shell command that runs this contender for `seconds` (plus a
    /// 1-second warm-up) and prints one JSON document on stdout.
    pub fn command(&self, seconds: u64) -> String {
        match self.kind {
            Kind::Upnvme {
                reap_on_submit,
                shadow,
                every_reap,
                ring_per_io,
            } => {
                let mut c = format!(
                    "upnvme perf -d \"$DEV\" -q {} -o {} -w randread -t {seconds} --warmup {WARMUP} --json",
                    self.qd, self.io_bytes
                );
                if reap_on_submit {
                    c.push_str(" --reap-on-submit");
                }
                match shadow {
                    Shadow::Off => {}
                    Shadow::On => c.push_str(" --doorbell-buffer"),
                    Shadow::NoEventIdx => c.push_str(" --doorbell-buffer --no-shadow-doorbell"),
                }
                if every_reap {
                    c.push_str(" --cq-head-every-reap");
                }
                if ring_per_io {
                    c.push_str(" --ring-per-io");
                }
                c
            }
            Kind::RawFloor => format!(
                "upnvme-rawfloor -d \"$DEV\" -q {} -t {seconds} --warmup {WARMUP} --json",
                self.qd
            ),
            Kind::DriverLoop => format!(
                "upnvme-rawfloor -d \"$DEV\" -q {} -t {seconds} --warmup {WARMUP} --json --driver",
                self.qd
            ),
            Kind::RawFloorSqFirst => format!(
                "upnvme-rawfloor -d \"$DEV\" -q {} -t {seconds} --warmup {WARMUP} --json --sq-first",
                self.qd
            ),
            Kind::Fio(engine) => {
                let engine_opts = match engine {
                    // Fixed buffers and registered files: the kernel's best
                    // polled path (as t/io_uring runs it).
                    FioEngine::IoUringHipri => {
                        "--ioengine=io_uring --hipri=1 --fixedbufs=1 --registerfiles=1"
                    }
                    FioEngine::Pvsync2Hipri => "--ioengine=pvsync2 --hipri=1",
                    FioEngine::Libaio => "--ioengine=libaio",
                };
                format!(
                    "fio --name=bench --filename=\"$KDEV\" --direct=1 --rw=randread --bs={} \
                     {engine_opts} --iodepth={} --time_based=1 --runtime={seconds} \
                     --ramp_time={WARMUP} --cpus_allowed=0 --clocksource=cpu --norandommap=1 \
                     --randrepeat=0 --lat_percentiles=1 --percentile_list={} --output-format=json",
                    self.io_bytes,
                    self.qd,
                    FIO_PERCENTILES
                        .iter()
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(":")
                )
            }
        }
    }
}

/// Warm-up seconds of every contender (results discarded).
pub const WARMUP: u64 = 1;

/// The percentiles fio reports (fio 3.33 keeps at most 20), the points of its
/// latency CDF.
pub const FIO_PERCENTILES: [f64; 20] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 75.0, 80.0, 85.0, 90.0, 95.0, 97.5, 99.0,
    99.5, 99.9, 99.95, 99.99,
];

/// upnvme perf's defaults.
pub const UPNVME_DEFAULT: Kind = Kind::Upnvme {
    reap_on_submit: false,
    shadow: Shadow::Off,
    every_reap: false,
    ring_per_io: false,
};

/// The upnvme configurations: the default, then one option changed at a time.
pub const UPNVME_VARIANTS: [Kind; 5] = [
    UPNVME_DEFAULT,
    Kind::Upnvme {
        reap_on_submit: true,
        shadow: Shadow::Off,
        every_reap: false,
        ring_per_io: false,
    },
    Kind::Upnvme {
        reap_on_submit: false,
        shadow: Shadow::On,
        every_reap: false,
        ring_per_io: false,
    },
    Kind::Upnvme {
        reap_on_submit: false,
        shadow: Shadow::NoEventIdx,
        every_reap: false,
        ring_per_io: false,
    },
    Kind::Upnvme {
        reap_on_submit: false,
        shadow: Shadow::Off,
        every_reap: true,
        ring_per_io: false,
    },
];

/// One SQ doorbell per I/O, as an application calling `submit` for every
/// command does, with MMIO doorbells (the default) and with the doorbell
/// buffer (where the EventIdx can save MMIO writes). Run at QD > 1 only (at
/// QD1 every batch is one I/O).
pub const UPNVME_PER_IO: [Kind; 2] = [
    Kind::Upnvme {
        reap_on_submit: false,
        shadow: Shadow::Off,
        every_reap: false,
        ring_per_io: true,
    },
    Kind::Upnvme {
        reap_on_submit: false,
        shadow: Shadow::On,
        every_reap: false,
        ring_per_io: true,
    },
];

/// The options set, in the order of the first round: the upnvme variants at
/// depths 1, 4 and 32 (the shadow doorbell question is per depth) and the
/// one-doorbell-per-I/O pair at 4 and 32, the minimal driver loop at 1, the
/// raw floor in both doorbell orders and io_uring at 1 and 32, the other
/// kernel profiles at 1.
pub fn options() -> Vec<Contender> {
    let mut v = Vec::new();
    for qd in [1, 4, 32] {
        for kind in UPNVME_VARIANTS {
            v.push(Contender::new(kind, qd));
        }
        if qd > 1 {
            for kind in UPNVME_PER_IO {
                v.push(Contender::new(kind, qd));
            }
        }
        if qd == 1 {
            v.push(Contender::new(Kind::DriverLoop, qd));
        }
        if qd != 4 {
            v.push(Contender::new(Kind::RawFloor, qd));
            v.push(Contender::new(Kind::RawFloorSqFirst, qd));
            v.push(Contender::new(Kind::Fio(FioEngine::IoUringHipri), qd));
        }
    }
    v.push(Contender::new(Kind::Fio(FioEngine::Pvsync2Hipri), 1));
    v.push(Contender::new(Kind::Fio(FioEngine::Libaio), 1));
    v
}

/// The depths of the sweep (4 KiB random reads).
pub const SWEEP_DEPTHS: [u32; 8] = [1, 2, 4, 8, 16, 32, 64, 128];
/// The I/O sizes of the sweep, in bytes, each at [`SIZE_DEPTHS`].
pub const SWEEP_SIZES: [u32; 4] = [4 << 10, 16 << 10, 64 << 10, 128 << 10];
/// The depths at which every size of [`SWEEP_SIZES`] runs.
pub const SIZE_DEPTHS: [u32; 2] = [1, 16];

/// The sweep set: upnvme in its default configuration, the raw floor and
/// kernel io_uring hipri at every depth of [`SWEEP_DEPTHS`] (4 KiB), then
/// upnvme and io_uring at every size of [`SWEEP_SIZES`] above 4 KiB at
/// [`SIZE_DEPTHS`] (the raw floor reads 4 KiB only).
pub fn sweep() -> Vec<Contender> {
    let uring = Kind::Fio(FioEngine::IoUringHipri);
    let mut v = Vec::new();
    for qd in SWEEP_DEPTHS {
        for kind in [UPNVME_DEFAULT, Kind::RawFloor, uring] {
            v.push(Contender::new(kind, qd));
        }
    }
    for bs in SWEEP_SIZES.into_iter().filter(|&b| b != BS_4K) {
        for qd in SIZE_DEPTHS {
            for kind in [UPNVME_DEFAULT, uring] {
                v.push(Contender::sized(kind, qd, bs));
            }
        }
    }
    v
}

/// Which contenders `cargo xtask bench` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Set {
    /// The options set and the sweep (each contender once).
    #[default]
    All,
    /// upnvme's doorbell and reaping options at QD 1, 4 and 32, the raw floor
    /// in both doorbell orders and the kernel's polled and interrupt paths.
    Options,
    /// upnvme's defaults, the raw floor and io_uring at QD 1–128, and I/O sizes
    /// 4–128 KiB at QD 1 and 16.
    Sweep,
}

impl Set {
    /// The set's name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Set::All => "all",
            Set::Options => "options",
            Set::Sweep => "sweep",
        }
    }

    /// Parses [`Set::name`] (for an earlier run's meta.json).
    pub fn from_name(name: &str) -> Option<Set> {
        [Set::All, Set::Options, Set::Sweep]
            .into_iter()
            .find(|s| s.name() == name)
    }

    /// The set's contenders, each once, in the order of the first round.
    pub fn contenders(self) -> Vec<Contender> {
        match self {
            Set::Options => options(),
            Set::Sweep => sweep(),
            Set::All => {
                let mut v = options();
                for c in sweep() {
                    if !v.iter().any(|o| o.id == c.id) {
                        v.push(c);
                    }
                }
                v
            }
        }
    }
}

/// The order of round `r` (0-based): the contender list rotated by `r` places,
/// so that no contender always runs right after the same neighbour or at the
/// same point of the boot.
pub fn round_order(contenders: &[Contender], r: usize) -> Vec<&Contender> {
    let n = contenders.len();
    (0..n).map(|i| &contenders[(i + r) % n]).collect()
}

/// Marker that starts one result on the results port:
/// `BENCH-RESULT <id> <round> <exit status>`, then the gzipped, base64-encoded
/// output, then [`RESULT_END`].
pub const RESULT: &str = "BENCH-RESULT";
/// Ends one result.
pub const RESULT_END: &str = "BENCH-RESULT-END";
/// Guest facts: `BENCH-INFO <key> <value...>`.
pub const INFO: &str = "BENCH-INFO";
/// The guest's serial port that carries results (QEMU writes it to a host file).
pub const RESULTS_TTY: &str = "/dev/ttyS1";
/// The guest's serial port for progress lines (QEMU writes it to its stderr).
pub const PROGRESS_TTY: &str = "/dev/ttyS2";

/// The busybox shell script that runs `rounds` interleaved rounds of every
/// contender, each for `seconds`, in one guest boot.
pub fn guest_script(contenders: &[Contender], rounds: usize, seconds: u64) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"#!/bin/sh
# Generated by `cargo xtask bench` (tools/xtask/src/bench/contenders.rs).
# Progress goes to {PROGRESS_TTY} (QEMU's stderr), results to {RESULTS_TTY} (a host file);
# nothing is printed on the console.
stty -F {RESULTS_TTY} raw -echo clocal 2>/dev/null
stty -F {PROGRESS_TTY} raw -echo clocal 2>/dev/null
exec 3>{PROGRESS_TTY}
exec 1>&3 2>&3
say() {{ echo "bench: $*" >&3; }}
info() {{ echo "{INFO} $*" > {RESULTS_TTY}; }}
DEV=${{UPNVME_VM_DEVICES%% *}}
KCTRL=$(ls /sys/bus/pci/devices/$UPNVME_VM_KERNEL_NVME/nvme/ 2>/dev/null | head -n 1)
KDEV=/dev/${{KCTRL}}n1
export DEV KDEV
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu/ceph
if [ -z "$DEV" ] || [ ! -b "$KDEV" ]; then
    say "setup failed: vfio controller '$DEV', kernel namespace '$KDEV'"
    exit 2
fi
info kernel $(uname -r)
info fio $(fio --version 2>&1 | head -n 1)
info io_poll $(cat /sys/block/${{KCTRL}}n1/queue/io_poll 2>/dev/null)
info poll_queues $UPNVME_VM_KERNEL_NVME_POLL_QUEUES
info vfio_device $DEV
info kernel_device $KDEV
info cpus $(nproc)
say "upnvme on $DEV, kernel nvme on $KDEV (io_poll $(cat /sys/block/${{KCTRL}}n1/queue/io_poll 2>/dev/null)); {rounds} rounds of {n} runs, {seconds} s each"
failed=0
run() {{
    id=$1; r=$2; shift 2
    start=$(cut -d' ' -f1 /proc/uptime)
    sh -c "$*" > /tmp/out.json 2> /tmp/err.txt
    st=$?
    end=$(cut -d' ' -f1 /proc/uptime)
    if [ $st -ne 0 ]; then
        failed=$((failed + 1))
        say "round $r: $id FAILED (exit status $st): $(tail -n 3 /tmp/err.txt | tr '\n' ' ')"
        cat /tmp/err.txt >> /tmp/out.json
    else
        say "round $r: $id done ($start - $end s)"
    fi
    {{
        echo "{RESULT} $id $r $st"
        gzip -c /tmp/out.json | base64
        echo "{RESULT_END}"
    }} > {RESULTS_TTY}
}}
"#,
        n = contenders.len(),
    );
    for r in 0..rounds {
        for c in round_order(contenders, r) {
            let _ = writeln!(
                s,
                "run {} {} '{}'",
                c.id,
                r + 1,
                c.command(seconds).replace('\'', r"'\''")
            );
        }
    }
    s.push_str("say \"finished, $failed failed run(s)\"\nexit $failed\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Contender> {
        options()
    }

    #[test]
    fn sets() {
        let sweep = sweep();
        assert_eq!(sweep.len(), 8 * 3 + 3 * 2 * 2);
        let ids: std::collections::BTreeSet<_> = sweep.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids.len(), sweep.len(), "ids are unique");
        for qd in SWEEP_DEPTHS {
            for id in ["upnvme", "rawfloor", "fio-io_uring-hipri"] {
                assert!(ids.contains(format!("{id}-qd{qd}").as_str()), "{id} {qd}");
            }
        }
        for id in [
            "upnvme-128k-qd16",
            "fio-io_uring-hipri-16k-qd1",
            "upnvme-64k-qd1",
        ] {
            assert!(ids.contains(id), "{id}");
        }
        assert!(
            !ids.iter()
                .any(|i| i.starts_with("rawfloor-") && i.contains("k-qd"))
        );
        assert!(
            sweep
                .iter()
                .all(|c| c.kind != Kind::RawFloor || c.io_bytes == BS_4K)
        );
        let c = sweep.iter().find(|c| c.id == "upnvme-128k-qd16").unwrap();
        assert!(c.is_upnvme_default() && c.size_text() == "128 KiB");
        let cmd = c.command(5);
        assert!(cmd.contains("-q 16 -o 131072 -w randread"), "{cmd}");
        let cmd = sweep
            .iter()
            .find(|c| c.id == "fio-io_uring-hipri-64k-qd16")
            .unwrap()
            .command(5);
        assert!(
            cmd.contains("--bs=65536") && cmd.contains("--iodepth=16"),
            "{cmd}"
        );

        let every = Set::All.contenders();
        let ids: std::collections::BTreeSet<_> = every.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids.len(), every.len(), "ids are unique");
        // The sweep shares upnvme, the raw floor and io_uring at QD 1 and 32
        // and upnvme at QD4 with the options set.
        assert_eq!(every.len(), options().len() + sweep.len() - 7);
        assert_eq!(every[..options().len()], options()[..]);
        for s in [Set::All, Set::Options, Set::Sweep] {
            assert_eq!(Set::from_name(s.name()), Some(s));
        }
        assert_eq!(Set::default(), Set::All);
    }

    #[test]
    fn contender_set() {
        let all = all();
        assert_eq!(all.len(), 5 * 3 + 2 * 2 + 1 + 3 * 2 + 2);
        let ids: std::collections::BTreeSet<_> = all.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids.len(), all.len(), "ids are unique");
        assert!(ids.contains("upnvme-qd1"));
        assert!(ids.contains("upnvme-noshadow-qd32"));
        assert!(ids.contains("upnvme-dbbuf-qd4"));
        assert!(ids.contains("upnvme-everyreap-qd1"));
        assert!(ids.contains("rawfloor-qd32"));
        assert!(ids.contains("rawfloor-sqfirst-qd1"));
        assert!(ids.contains("fio-io_uring-hipri-qd32"));
        assert!(ids.contains("fio-pvsync2-hipri-qd1"));
        assert!(ids.contains("fio-libaio-qd1"));
        assert!(all.iter().all(|c| !c.id.contains(' ')));
        assert_eq!(all.iter().filter(|c| c.is_upnvme_default()).count(), 3);
    }

    #[test]
    fn commands() {
        let all = all();
        let find = |id: &str| all.iter().find(|c| c.id == id).unwrap().command(5);
        let c = find("upnvme-noshadow-qd32");
        assert!(c.contains("-q 32") && c.contains("-t 5") && c.contains("--json"));
        assert!(!c.contains("--reap-on-submit") && c.contains("--no-shadow-doorbell"));
        assert!(c.contains("--doorbell-buffer"));
        assert!(find("upnvme-ros-qd4").contains("--reap-on-submit"));
        assert!(find("upnvme-dbbuf-qd1").contains("--doorbell-buffer"));
        assert!(find("upnvme-everyreap-qd32").contains("--cq-head-every-reap"));
        let c = find("upnvme-perio-dbbuf-qd32");
        assert!(c.contains("--ring-per-io") && c.contains("--doorbell-buffer"));
        let c = find("upnvme-perio-qd32");
        assert!(c.contains("--ring-per-io") && !c.contains("--doorbell-buffer"));
        assert!(!all.iter().any(|c| c.id == "upnvme-perio-qd1"));
        let c = find("upnvme-qd1");
        for flag in [
            "--reap-on-submit",
            "--no-shadow",
            "--doorbell-buffer",
            "--no-doorbell",
            "--cq-head",
        ] {
            assert!(!c.contains(flag), "{c}");
        }
        let c = find("fio-io_uring-hipri-qd1");
        assert!(c.contains("--ioengine=io_uring --hipri=1") && c.contains("--iodepth=1"));
        assert!(c.contains("--runtime=5") && c.contains("--output-format=json"));
        assert!(find("fio-libaio-qd1").contains("--ioengine=libaio"));
        assert!(find("rawfloor-qd1").starts_with("upnvme-rawfloor"));
        assert!(!find("rawfloor-qd1").contains("--sq-first"));
        let c = find("driverloop-qd1");
        assert!(c.starts_with("upnvme-rawfloor") && c.contains("-q 1") && c.contains("--driver"));
        assert!(!all.iter().any(|c| c.id == "driverloop-qd32"));
        let c = find("rawfloor-sqfirst-qd32");
        assert!(
            c.starts_with("upnvme-rawfloor") && c.contains("-q 32") && c.contains("--sq-first")
        );
    }

    #[test]
    fn rounds_rotate() {
        let all = all();
        let r0: Vec<_> = round_order(&all, 0).iter().map(|c| c.id.clone()).collect();
        let r1: Vec<_> = round_order(&all, 1).iter().map(|c| c.id.clone()).collect();
        assert_eq!(r0[1], r1[0]);
        assert_eq!(r0[0], *r1.last().unwrap());
        let script = guest_script(&all, 3, 5);
        assert_eq!(script.matches("\nrun ").count(), 3 * all.len());
        assert!(script.contains("run upnvme-qd1 1 'upnvme perf -d \"$DEV\" -q 1"));
    }
}
