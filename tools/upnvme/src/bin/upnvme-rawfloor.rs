//! `upnvme-rawfloor`: the barest polled NVMe read loop that can exist, a
//! bench-only program that shows what upnvme's abstractions cost.
//!
//! [`Controller::open`] is used for bring-up only (with shadow doorbells off,
//! so the controller reads doorbells from MMIO alone). The program then creates
//! its own I/O completion/submission queue pair with raw admin commands on a
//! queue ID no queue pair uses, and per I/O does exactly this, directly against
//! the mapped BAR and DMA memory:
//!
//! 1. one 64-byte SQE write into the submission queue memory,
//! 2. one SQ tail doorbell write (MMIO),
//! 3. a spin on the phase bit of the next completion entry (acquire load; no
//!    PAUSE, no clock read per poll),
//! 4. one CQ head doorbell write (MMIO).
//!
//! With `--sq-first` the CQ head doorbell of step 4 is written after the
//! next command's SQ tail doorbell instead of before it (the order upnvme's
//! rule prescribes), still one of each per I/O: the two floors tell the
//! doorbell count from the doorbell order.
//!
//! No command-ID table, no PRP building beyond PRP1, no statistics, no
//! validation of the completion beyond its status. At depth > 1 it submits
//! `depth` reads and resubmits one per completion (same four steps). Latency
//! runs from just before the SQE write to the moment the phase bit is seen,
//! as in `upnvme perf`, timed with the TSC.
//!
//! `--driver` runs the same closed loop through upnvme's public queue pair
//! API instead, at depth 1, with the driver's defaults (shadow doorbells,
//! adaptive CQ head): `IoQueuePair::submit` of one read, then
//! `process_completions(1, ..)` in a tight spin until it is back. It is the
//! library's own QD1 round trip with the simplest application loop around
//! it, for comparison with `upnvme perf -q 1` (whose loop does more).
//!
//! `--json` prints the same fields as `upnvme perf --json` (the `total` object,
//! `histogram_us_count`), so `cargo xtask bench` parses both the same way.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use upnvme::dma::tsc::{self, rdtsc};
use upnvme::queues::regs::{cq_head_doorbell, sq_tail_doorbell};
use upnvme::{Controller, ControllerOptions, Device, DmaBuffer, IoCommand, QueuePairOptions, Sqe};

/// Percentiles reported in JSON (as `upnvme perf`): label in percent, and
/// the quantile as its own literal (see `upnvme perf`'s report.rs: `99.9 /
/// 100.0` rounds to the rank above p99.9).
const PERCENTILES: [(f64, f64); 8] = [
    (1.0, 0.01),
    (10.0, 0.1),
    (50.0, 0.5),
    (90.0, 0.9),
    (99.0, 0.99),
    (99.9, 0.999),
    (99.99, 0.9999),
    (99.999, 0.99999),
];
/// Bytes per I/O.
const IO_SIZE: usize = 4096;
/// A submission queue entry's size.
const SQE_BYTES: usize = 64;
/// A completion queue entry's size.
const CQE_BYTES: usize = 16;
/// How long the loop waits for one completion before giving up.
const COMPLETION_TIMEOUT: Duration = Duration::from_secs(10);

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "upnvme-rawfloor",
    about = "The barest polled 4 KiB random-read loop (one SQE write, one SQ doorbell, spin on \
             the phase bit, one CQ doorbell per I/O), for comparison with upnvme perf"
)]
struct Args {
    /// Controller (PCI address) bound to vfio-pci; default: the only one.
    #[arg(short = 'd', long = "device", value_name = "BDF")]
    device: Option<String>,
    /// Outstanding reads.
    #[arg(short = 'q', long = "queue-depth", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=65535))]
    depth: u32,
    /// Measured seconds, after the warm-up.
    #[arg(short = 't', long = "time", default_value_t = 5)]
    seconds: u64,
    /// Warm-up seconds (I/O whose latency is discarded).
    #[arg(long, default_value_t = 1)]
    warmup: u64,
    /// Namespace to read from, decimal or 0x-prefixed hex.
    #[arg(short = 'n', long = "nsid", default_value_t = 1, value_parser = nsid)]
    nsid: u32,
    /// Core to pin the loop to.
    #[arg(short = 'c', long = "core", default_value_t = 0)]
    core: usize,
    /// Seed of the random LBA sequence.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// Print one JSON document (the fields of `upnvme perf --json`).
    #[arg(long)]
    json: bool,
    /// Also time each submission, from the start stamp to after the SQ tail
    /// doorbell write (one more TSC read per I/O), as `upnvme perf
    /// --transport-stats` times its submit calls.
    #[arg(long = "time-calls")]
    time_calls: bool,
    /// Write each CQ head doorbell after the resubmission's SQ tail doorbell
    /// (SQ tail first) instead of right after the completion is seen.
    #[arg(long = "sq-first")]
    sq_first: bool,
    /// Run the loop through upnvme's queue pair API (depth 1 only) instead
    /// of raw queues; see the program's documentation.
    #[arg(long = "driver")]
    driver: bool,
    /// Busy-wait this many nanoseconds before each submission (after the
    /// completion that frees its slot was seen, before the start stamp; the
    /// first `depth` submissions wait too): how much the device's latency
    /// depends on how soon the host comes back.
    #[arg(long = "resubmit-delay-ns", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000_000))]
    resubmit_delay_ns: u64,
}

/// xorshift64*, as `upnvme perf` uses for LBA choice.
#[inline(always)]
/// `--nsid`: decimal or 0x-prefixed hexadecimal, as `upnvme`'s `-n`.
fn nsid(s: &str) -> std::result::Result<u32, String> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse::<u32>(),
    }
    .map_err(|e| format!("'{s}' is not a decimal or 0x-prefixed hexadecimal namespace ID: {e}"))
}

fn next_rand(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// The only controller bound to vfio-pci.
fn default_device() -> Result<String> {
    let vfio: Vec<String> = upnvme::list_controllers()?
        .into_iter()
        .filter(|f| f.driver.as_deref() == Some("vfio-pci"))
        .map(|f| f.address.to_string())
        .collect();
    match vfio.as_slice() {
        [one] => Ok(one.clone()),
        [] => {
            bail!(
                "no NVMe controller is bound to vfio-pci; bind one with `upnvme setup bind <address>`"
            )
        }
        many => bail!(
            "several vfio-bound NVMe controllers ({}); choose one with --device",
            many.join(", ")
        ),
    }
}

/// What the loop measured.
struct Measured {
    ios: u64,
    errors: u64,
    seconds: f64,
    hist: Histogram<u64>,
    /// With `--time-calls`: (nanoseconds from the start stamps to after the
    /// SQ doorbell writes, submissions) over the measured window.
    submit: Option<(f64, u64)>,
    /// SQ tail and CQ head doorbell MMIO writes in the measured window.
    mmio: (u64, u64),
}

/// What [`Window::complete`] made of one completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Still warming up.
    Warming,
    /// This completion ended the warm-up: counters kept so far are void.
    WarmupEnded,
    /// Counted in the measured window; `last` once the window is over.
    Measured { last: bool },
}

/// The warm-up and the measured window, and the latencies and errors
/// counted in it, shared by the raw loop and `--driver`.
struct Window {
    hist: Histogram<u64>,
    ns_per_tick: f64,
    run_ticks: u64,
    warm_end: u64,
    measuring: bool,
    t_measure: u64,
    end: u64,
    ios: u64,
    errors: u64,
}

impl Window {
    /// Starts the warm-up (or, with none, the measured window) now.
    fn start(a: &Args, tsc_hz: f64, ns_per_tick: f64) -> Result<Window> {
        let warmup_ticks = (a.warmup as f64 * tsc_hz) as u64;
        let run_ticks = (a.seconds as f64 * tsc_hz) as u64;
        let t0 = rdtsc();
        let measuring = warmup_ticks == 0;
        Ok(Window {
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3)?,
            ns_per_tick,
            run_ticks,
            warm_end: t0 + warmup_ticks,
            measuring,
            t_measure: t0,
            end: if measuring { t0 + run_ticks } else { u64::MAX },
            ios: 0,
            errors: 0,
        })
    }

    /// Accounts one completion seen at TSC `seen` of a command stamped at
    /// `start`.
    fn complete(&mut self, start: u64, seen: u64, failed: bool) -> Step {
        if self.measuring {
            let ns = seen.saturating_sub(start) as f64 * self.ns_per_tick;
            self.hist.saturating_record(ns as u64);
            self.ios += 1;
            self.errors += u64::from(failed);
            Step::Measured {
                last: seen >= self.end,
            }
        } else if seen >= self.warm_end {
            self.measuring = true;
            self.t_measure = seen;
            self.end = seen + self.run_ticks;
            Step::WarmupEnded
        } else {
            Step::Warming
        }
    }

    /// What was measured, with `submit` and `mmio` from the loop.
    fn finish(self, submit: Option<(f64, u64)>, mmio: (u64, u64)) -> Measured {
        let seconds = rdtsc().saturating_sub(self.t_measure) as f64 * self.ns_per_tick / 1e9;
        Measured {
            ios: self.ios,
            errors: self.errors,
            seconds,
            hist: self.hist,
            submit,
            mmio,
        }
    }
}

/// The queue pair the loop owns, created with raw admin commands.
struct RawQueues {
    qid: u16,
    sq: DmaBuffer,
    cq: DmaBuffer,
    sq_entries: u32,
    cq_entries: u32,
    sq_db: usize,
    cq_db: usize,
}

impl RawQueues {
    /// Creates I/O CQ `qid` (no interrupts) and I/O SQ `qid` bound to it.
    fn create(ctrl: &Controller, qid: u16, entries: u32) -> Result<Self> {
        let sq = ctrl.alloc_dma(entries as usize * SQE_BYTES)?;
        let cq = ctrl.alloc_dma(entries as usize * CQE_BYTES)?;
        let dstrd = ctrl.cap().dstrd();
        ctrl.admin_passthrough_raw(
            Sqe::create_io_cq(qid, entries, cq.iova(), false, 0),
            0,
            None,
        )
        .with_context(|| format!("Create I/O Completion Queue {qid}"))?;
        if let Err(e) =
            ctrl.admin_passthrough_raw(Sqe::create_io_sq(qid, entries, sq.iova(), qid, 0), 0, None)
        {
            let _ = ctrl.admin_passthrough_raw(Sqe::delete_io_cq(qid), 0, None);
            return Err(e).with_context(|| format!("Create I/O Submission Queue {qid}"));
        }
        Ok(RawQueues {
            qid,
            sq,
            cq,
            sq_entries: entries,
            cq_entries: entries,
            sq_db: sq_tail_doorbell(qid, dstrd),
            cq_db: cq_head_doorbell(qid, dstrd),
        })
    }

    /// Deletes the SQ, then the CQ.
    fn delete(self, ctrl: &Controller) -> Result<()> {
        ctrl.admin_passthrough_raw(Sqe::delete_io_sq(self.qid), 0, None)
            .with_context(|| format!("Delete I/O Submission Queue {}", self.qid))?;
        ctrl.admin_passthrough_raw(Sqe::delete_io_cq(self.qid), 0, None)
            .with_context(|| format!("Delete I/O Completion Queue {}", self.qid))?;
        Ok(())
    }
}

/// The loop's state: ring positions, buffers, start stamps.
struct Floor<'a> {
    dev: &'a upnvme::VfioNvme,
    q: &'a RawQueues,
    bufs: Vec<DmaBuffer>,
    start: Vec<u64>,
    sq_tail: u32,
    cq_head: u32,
    phase: u32,
    nsid: u32,
    blocks: u32,
    slots: u64,
    rng: u64,
    /// `--time-calls`: accumulate submit ticks and count.
    time_calls: bool,
    /// `--resubmit-delay-ns` in TSC ticks.
    delay_ticks: u64,
    submit_ticks: u64,
    submitted: u64,
}

impl Floor<'_> {
    /// Writes one read SQE with CID `cid` at the tail and rings the SQ doorbell.
    #[inline(always)]
    fn submit(&mut self, cid: u16) -> Result<()> {
        let slba = (next_rand(&mut self.rng) % self.slots) * u64::from(self.blocks);
        let mut sqe = Sqe::read(self.nsid, slba, self.blocks);
        sqe.set_cid(cid);
        sqe.set_prp1(self.bufs[cid as usize].iova());
        if self.delay_ticks > 0 {
            // `--resubmit-delay-ns`: the host's turnaround, made longer on
            // purpose (before the start stamp: not part of the latency).
            let t = rdtsc();
            while rdtsc().wrapping_sub(t) < self.delay_ticks {}
        }
        let start = rdtsc();
        self.start[cid as usize] = start;
        self.q
            .sq
            .write_bytes(self.sq_tail as usize * SQE_BYTES, &sqe.to_le_bytes())?;
        self.sq_tail += 1;
        if self.sq_tail == self.q.sq_entries {
            self.sq_tail = 0;
        }
        // `write32` orders the SQE stores before the doorbell store.
        self.dev.write32(self.q.sq_db, self.sq_tail);
        if self.time_calls {
            self.submit_ticks += rdtsc().saturating_sub(start);
            self.submitted += 1;
        }
        Ok(())
    }

    /// Spins on the next CQE's phase bit, consumes the entry (the CQ head
    /// doorbell is the caller's, [`Floor::ring_cq`]), and returns its dword 3
    /// (CID, phase, status) and the TSC when the phase bit was seen. Fails
    /// after [`COMPLETION_TIMEOUT`] without one (the clock is read only every
    /// 2^20 empty polls).
    #[inline(always)]
    fn reap(&mut self, timeout_ticks: u64) -> Result<(u32, u64)> {
        let off = self.cq_head as usize * CQE_BYTES + 12;
        let mut spins = 0u32;
        let mut deadline = 0u64;
        let dw3 = loop {
            let dw3 = self.q.cq.load_acquire_u32(off)?;
            if (dw3 >> 16) & 1 == self.phase {
                break dw3;
            }
            spins = spins.wrapping_add(1);
            if spins & 0xf_ffff == 0 {
                let now = rdtsc();
                if deadline == 0 {
                    deadline = now + timeout_ticks;
                } else if now > deadline {
                    bail!(
                        "no completion on queue {} within {} s",
                        self.q.qid,
                        COMPLETION_TIMEOUT.as_secs()
                    );
                }
            }
        };
        let seen = rdtsc();
        self.cq_head += 1;
        if self.cq_head == self.q.cq_entries {
            self.cq_head = 0;
            self.phase ^= 1;
        }
        Ok((dw3, seen))
    }

    /// Writes the CQ head doorbell with every entry reaped so far.
    #[inline(always)]
    fn ring_cq(&mut self) {
        self.dev.write32(self.q.cq_db, self.cq_head);
    }
}

fn run(a: &Args) -> Result<Value> {
    ensure!(a.depth >= 1, "queue depth (-q) must be at least 1");
    ensure!(a.seconds >= 1, "run time (-t) must be at least 1 second");
    ensure!(
        !a.driver || (a.depth == 1 && !a.sq_first),
        "--driver runs at depth 1 and has no --sq-first (the driver orders its doorbells itself)"
    );
    let addr = match &a.device {
        Some(d) => d.clone(),
        None => default_device()?,
    };
    if !core_affinity::set_for_current(core_affinity::CoreId { id: a.core }) {
        bail!("could not pin to core {}", a.core);
    }
    let ctrl = Controller::open(
        &addr,
        if a.driver {
            // The driver as an application gets it.
            ControllerOptions::default()
        } else {
            ControllerOptions {
                // MMIO doorbells only: with Doorbell Buffer Config active, the
                // controller would read tails and heads from the shadow buffer.
                shadow_doorbells: false,
                async_events: 0,
                ..Default::default()
            }
        },
    )
    .with_context(|| format!("opening {addr}"))?;
    let ns = ctrl.namespace(a.nsid)?;
    let lba = ns.lba_size() as usize;
    // The floor's reads describe 4 KiB of data and no metadata: on a format
    // with metadata the controller would move more (extended LBA) or write
    // the metadata to MPTR 0.
    ensure!(
        ns.metadata_layout().is_none(),
        "namespace {} has metadata ({}); the raw floor reads only formats without it",
        a.nsid,
        ns.metadata_layout()
            .map_or_else(String::new, |l| l.to_string())
    );
    ensure!(
        IO_SIZE.is_multiple_of(lba),
        "namespace {} has {lba}-byte blocks; 4096 is not a multiple",
        a.nsid
    );
    let blocks = (IO_SIZE / lba) as u32;
    let slots = ns.lba_count() / u64::from(blocks);
    ensure!(slots > 0, "namespace {} is smaller than 4 KiB", a.nsid);
    let max_entries = ctrl.cap().max_queue_entries();
    // A CQ of `entries` holds `entries - 1` completions. With `--sq-first`
    // one reaped entry waits for its doorbell while `depth` commands are
    // outstanding, so the CQ needs one entry more. (`depth` is at most 65535.)
    let needed = a.depth + 1 + u32::from(a.sq_first);
    let entries = (2 * a.depth).clamp(64, 1024).max(needed).min(max_entries);
    ensure!(
        needed <= entries,
        "queue depth {} needs {needed} queue entries, more than the controller's {max_entries}",
        a.depth
    );
    // The highest granted queue ID: no queue pair of this process uses it.
    let qid = ctrl.granted_io_queues();
    ensure!(qid >= 1, "the controller granted no I/O queue");
    let tsc_hz = tsc::calibrate(Duration::from_millis(100)).context("the TSC does not advance")?;
    let ns_per_tick = 1e9 / tsc_hz;

    if a.driver {
        let m = measure_driver(&ctrl, a, blocks, slots, tsc_hz, ns_per_tick)?;
        ctrl.close()?;
        return Ok(doc(a, &addr, &m));
    }
    let q = RawQueues::create(&ctrl, qid, entries)?;
    let result = measure(&ctrl, &q, a, blocks, slots, tsc_hz, ns_per_tick);
    let deleted = q.delete(&ctrl);
    let m = result?;
    deleted?;
    ctrl.close()?;
    Ok(doc(a, &addr, &m))
}

/// Runs the warm-up and the measured window.
fn measure(
    ctrl: &Controller,
    q: &RawQueues,
    a: &Args,
    blocks: u32,
    slots: u64,
    tsc_hz: f64,
    ns_per_tick: f64,
) -> Result<Measured> {
    let bufs = (0..a.depth)
        .map(|_| ctrl.alloc_dma(IO_SIZE))
        .collect::<Result<Vec<_>, _>>()?;
    let mut f = Floor {
        dev: ctrl.device(),
        q,
        bufs,
        start: vec![0; a.depth as usize],
        sq_tail: 0,
        cq_head: 0,
        phase: 1,
        nsid: a.nsid,
        blocks,
        slots,
        rng: a.seed | 1,
        time_calls: a.time_calls,
        delay_ticks: (a.resubmit_delay_ns as f64 / ns_per_tick) as u64,
        submit_ticks: 0,
        submitted: 0,
    };
    let timeout_ticks = (COMPLETION_TIMEOUT.as_secs_f64() * tsc_hz) as u64;

    for cid in 0..a.depth as u16 {
        f.submit(cid)?;
    }
    let mut w = Window::start(a, tsc_hz, ns_per_tick)?;
    let mut in_flight = a.depth;
    let mut stopping = false;
    while in_flight > 0 {
        let (dw3, now) = f.reap(timeout_ticks)?;
        if !a.sq_first {
            f.ring_cq();
        }
        let cid = dw3 as u16;
        ensure!(
            cid < a.depth as u16,
            "completion with unknown CID {cid} on queue {}",
            q.qid
        );
        in_flight -= 1;
        match w.complete(f.start[cid as usize], now, dw3 >> 17 != 0) {
            Step::Measured { last } => stopping |= last,
            Step::WarmupEnded => {
                f.submit_ticks = 0;
                f.submitted = 0;
            }
            Step::Warming => {}
        }
        if !stopping {
            f.submit(cid)?;
            in_flight += 1;
        }
        // SQ tail first: the CQ never fills meanwhile: it has room for the
        // one reaped entry not yet acknowledged plus `depth` outstanding
        // commands (checked in `run`).
        if a.sq_first {
            f.ring_cq();
        }
    }
    let submit = a
        .time_calls
        .then_some((f.submit_ticks as f64 * ns_per_tick, f.submitted));
    let ios = w.ios;
    Ok(w.finish(submit, (ios, ios)))
}

/// `--driver`: the depth-1 closed loop through [`upnvme::IoQueuePair`]:
/// `submit`, then `process_completions(1, ..)` until the read is back.
fn measure_driver(
    ctrl: &Controller,
    a: &Args,
    blocks: u32,
    slots: u64,
    tsc_hz: f64,
    ns_per_tick: f64,
) -> Result<Measured> {
    let ns = ctrl.namespace(a.nsid)?;
    let mut qp = ctrl.io_queue_pair(QueuePairOptions::default())?;
    let mut buf = Some(ctrl.alloc_dma(IO_SIZE)?);
    let mut rng = a.seed | 1;
    let timeout_ticks = (COMPLETION_TIMEOUT.as_secs_f64() * tsc_hz) as u64;
    let delay_ticks = (a.resubmit_delay_ns as f64 / ns_per_tick) as u64;
    let mut w = Window::start(a, tsc_hz, ns_per_tick)?;
    let (mut submit_ticks, mut submitted) = (0u64, 0u64);
    loop {
        let slba = (next_rand(&mut rng) % slots) * u64::from(blocks);
        if delay_ticks > 0 {
            let t = rdtsc();
            while rdtsc().wrapping_sub(t) < delay_ticks {}
        }
        let start = rdtsc();
        qp.submit(IoCommand::Read { ns, slba, blocks }, buf.take(), 0)
            .map_err(|f| anyhow::anyhow!("submitting a read: {}", qp.describe(f.reason)))?;
        if a.time_calls {
            submit_ticks += rdtsc().saturating_sub(start);
            submitted += 1;
        }
        let (mut seen, mut ok, mut back) = (0u64, false, false);
        let mut spins = 0u32;
        let mut deadline = 0u64;
        while !back {
            qp.process_completions(1, |_, c| {
                seen = rdtsc();
                ok = c.is_ok();
                buf = c.buffer;
                back = true;
            })?;
            spins = spins.wrapping_add(1);
            if !back && spins & 0xf_ffff == 0 {
                let now = rdtsc();
                if deadline == 0 {
                    deadline = now + timeout_ticks;
                } else if now > deadline {
                    bail!("no completion within {} s", COMPLETION_TIMEOUT.as_secs());
                }
            }
        }
        ensure!(buf.is_some(), "the completion did not return the buffer");
        match w.complete(start, seen, !ok) {
            Step::Measured { last: true } => break,
            Step::Measured { last: false } | Step::Warming => {}
            Step::WarmupEnded => {
                qp.reset_stats();
                submit_ticks = 0;
                submitted = 0;
            }
        }
    }
    let s = qp.stats();
    let submit = a
        .time_calls
        .then_some((submit_ticks as f64 * ns_per_tick, submitted));
    Ok(w.finish(submit, (s.sq_doorbell_mmio, s.cq_doorbell_mmio)))
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// The JSON document, with `upnvme perf --json`'s field names.
fn doc(a: &Args, device: &str, m: &Measured) -> Value {
    let h = &m.hist;
    let empty = h.is_empty();
    let pct: serde_json::Map<String, Value> = PERCENTILES
        .iter()
        .map(|(p, q)| (format!("p{p}"), json!(us(h.value_at_quantile(*q)))))
        .collect();
    let iops = m.ios as f64 / m.seconds.max(1e-9);
    let hist: Vec<Value> = h
        .iter_recorded()
        .map(|v| json!([us(v.value_iterated_to()), v.count_at_value()]))
        .collect();
    json!({
        "program": "upnvme-rawfloor",
        "device": device,
        "workload": "randread",
        "read_percent": 100,
        "io_size": IO_SIZE,
        "queue_depth": a.depth,
        "seconds": a.seconds,
        "warmup_seconds": a.warmup,
        "total": {
            "ios": m.ios,
            "errors": m.errors,
            "iops": iops,
            "mib_per_s": iops * IO_SIZE as f64 / (1024.0 * 1024.0),
            "latency": {
                "mean_us": if empty { 0.0 } else { h.mean() / 1000.0 },
                "min_us": if empty { 0.0 } else { us(h.min()) },
                "max_us": if empty { 0.0 } else { us(h.max()) },
                "stdev_us": h.stdev() / 1000.0,
                "percentiles_us": pct,
            },
            "transport": {
                "sq_doorbell_mmio": m.mmio.0,
                "cq_doorbell_mmio": m.mmio.1,
                "mmio_per_io": (m.mmio.0 + m.mmio.1) as f64 / m.ios.max(1) as f64,
                "sq_mmio_per_io": m.mmio.0 as f64 / m.ios.max(1) as f64,
                "cq_mmio_per_io": m.mmio.1 as f64 / m.ios.max(1) as f64,
            },
            "call_timing": match m.submit {
                None => Value::Null,
                Some((ns, n)) => json!({
                    "submitted": n,
                    "submit_us_per_io": (n > 0).then(|| ns / n as f64 / 1000.0),
                }),
            },
        },
        "histogram_us_count": hist,
    })
}

fn main() {
    let a = Args::parse();
    match run(&a) {
        Ok(d) => {
            if a.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&d).expect("JSON values serialise")
                );
            } else {
                let t = &d["total"];
                let l = &t["latency"];
                println!(
                    "upnvme-rawfloor: randread 4096 B, depth {}: {:.2} IOPS, mean {:.2} us, p50 {:.2} us, p99 {:.2} us, {} errors",
                    a.depth,
                    t["iops"].as_f64().unwrap_or(0.0),
                    l["mean_us"].as_f64().unwrap_or(0.0),
                    l["percentiles_us"]["p50"].as_f64().unwrap_or(0.0),
                    l["percentiles_us"]["p99"].as_f64().unwrap_or(0.0),
                    t["errors"]
                );
                if let Some(us) = t["call_timing"]["submit_us_per_io"].as_f64() {
                    let what = if a.driver {
                        "IoQueuePair::submit"
                    } else {
                        "SQE write + SQ doorbell"
                    };
                    println!("upnvme-rawfloor: submit ({what}) {us:.3} us per I/O");
                }
            }
            if d["total"]["errors"].as_u64().unwrap_or(0) > 0 {
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("upnvme-rawfloor: error: {e:#}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `-n` takes hex as `upnvme`'s subcommands do.
    #[test]
    fn nsid_is_decimal_or_hex() {
        assert_eq!(nsid("0x10"), Ok(16));
        assert_eq!(nsid("0XFFFFFFFF"), Ok(u32::MAX));
        assert_eq!(nsid("7"), Ok(7));
        assert!(nsid("0x1_0000_0000").is_err());
        assert!(nsid("0x100000000").is_err());
        assert!(nsid("-1").is_err());
        let a = Args::try_parse_from(["upnvme-rawfloor", "-n", "0x2"]).unwrap();
        assert_eq!(a.nsid, 2);
        let e = Args::try_parse_from(["upnvme-rawfloor", "--nsid", "two"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }
}
