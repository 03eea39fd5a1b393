//! One worker per core: pinned, its own queue pair per namespace, a closed loop
//! of `depth` I/Os per namespace, latency from just before submission to the
//! moment the completion is reaped, in TSC ticks converted to nanoseconds.
//! The loop takes no lock and allocates nothing once it runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::{Context, Result, bail};
use upnvme::dma::tsc::rdtsc;
use upnvme::{
    Controller, DmaBuffer, IoCommand, IoData, IoError, IoQueuePair, Namespace, QueuePairOptions,
    QueueStats, Reject,
};

use super::latency::Latencies;

/// What one worker does.
#[derive(Clone, Debug)]
pub struct WorkerPlan {
    /// Core to pin to.
    pub core: usize,
    /// Index among workers (seeds and sequential offsets).
    pub index: usize,
    /// Namespaces, each with its own queue pair.
    pub namespaces: Vec<NsPlan>,
    /// Outstanding I/Os per namespace.
    pub depth: u32,
    /// Bytes per I/O.
    pub io_size: usize,
    /// Percent reads.
    pub read_percent: u8,
    /// Random LBAs.
    pub random: bool,
    /// TSC ticks of warm-up.
    pub warmup_ticks: u64,
    /// TSC ticks of measurement (ignored with `io_count`).
    pub run_ticks: u64,
    /// I/Os per namespace instead of a duration.
    pub io_count: Option<u64>,
    /// Nanoseconds per TSC tick.
    pub ns_per_tick: f64,
    /// Stamp written blocks for --verify.
    pub verify: bool,
    /// Keep going after failed I/Os (`--continue-on-error`); otherwise the
    /// first one ends the run.
    pub continue_on_error: bool,
    /// `--ring-per-io`: `submit` (queue + ring) every I/O instead of one ring
    /// per batch.
    pub ring_per_io: bool,
    /// `--transport-stats`: also time the driver calls ([`CallTiming`]).
    pub time_calls: bool,
    /// RNG seed.
    pub seed: u64,
    /// Queue pair options.
    pub qp: QueuePairOptions,
    /// `-e`: the protection fields of every command.
    pub protection: Option<upnvme::Protection>,
    /// Queue pairs of the whole run (workers × namespaces): the hugepage
    /// advice sizes the run, not one buffer.
    pub run_pairs: usize,
}

/// A namespace as the worker needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NsPlan {
    /// NSID.
    pub nsid: u32,
    /// Bytes per LBA.
    pub lba_size: u32,
    /// Blocks in the namespace.
    pub blocks: u64,
    /// The metadata layout of its LBA format (`None`: no metadata).
    pub metadata: Option<upnvme::MetadataLayout>,
}

/// Time spent inside the driver's calls over the measured window
/// (`--transport-stats`): where a round trip's time goes on the host side.
///
/// Each figure is two TSC reads around the call, so it includes the reads'
/// own cost, and some reads sit inside the round trips they time (in the
/// batch loop one after each `queue` and two around each `ring`; at depth 1
/// one before every poll and one after each `submit`). Without
/// `--transport-stats` nothing is stamped. With a warm-up, `submitted` counts
/// the submissions after it, so it differs from the I/Os completed in the
/// window by the commands in flight when the warm-up ended.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CallTiming {
    /// Nanoseconds inside `queue`/`submit` and the `ring` after each batch:
    /// SQE build, CID and PRP work, the SQ tail doorbell writes and the
    /// bookkeeping after them (timeout stamps, counters; with
    /// `--reap-on-submit`, also the reap that follows the doorbell).
    pub submit_ns: f64,
    /// Commands submitted by those calls.
    pub submitted: u64,
    /// Nanoseconds inside the `process_completions` calls that reaped at
    /// least one completion: CQE checks, command ID lookup, perf's callback
    /// (a TSC read and keeping the completion; in the batch loop also the
    /// latency record, unless the reap emptied the queue) and the CQ head
    /// update when one is due.
    pub reap_ns: f64,
    /// Completions those calls reaped.
    pub reaped: u64,
}

impl CallTiming {
    /// Mean nanoseconds of submit work per command, if any was submitted.
    pub fn submit_ns_per_io(&self) -> Option<f64> {
        (self.submitted > 0).then(|| self.submit_ns / self.submitted as f64)
    }

    /// Mean nanoseconds of reap work per completion, if any was reaped.
    pub fn reap_ns_per_completion(&self) -> Option<f64> {
        (self.reaped > 0).then(|| self.reap_ns / self.reaped as f64)
    }

    /// Adds another job's timing (for the total row).
    pub fn add(&mut self, o: &CallTiming) {
        self.submit_ns += o.submit_ns;
        self.submitted += o.submitted;
        self.reap_ns += o.reap_ns;
        self.reaped += o.reaped;
    }
}

/// TSC ticks and counts behind [`CallTiming`], kept by the loop.
#[derive(Clone, Copy, Debug, Default)]
struct CallTicks {
    submit: u64,
    submitted: u64,
    reap: u64,
    reaped: u64,
}

/// What one (namespace, core) job measured.
pub struct JobResult {
    /// Core.
    pub core: usize,
    /// NSID.
    pub nsid: u32,
    /// I/Os completed in the measured window.
    pub ios: u64,
    /// Bytes moved in the measured window.
    pub bytes: u64,
    /// Measured seconds.
    pub seconds: f64,
    /// Latencies of the successful I/Os.
    pub lat: Latencies,
    /// Completions with an error (not counting those the controller's
    /// removal ended: `removed_ios`).
    pub errors: u64,
    /// Queue pair counters over the measured window.
    pub stats: QueueStats,
    /// Time inside the driver's calls (with `--transport-stats`).
    pub timing: Option<CallTiming>,
    /// Blocks that were stamped, as (slba, blocks) extents, for --verify.
    pub written: Vec<(u64, u32)>,
    /// Extents a write of this job failed on, whatever came after it
    /// (--verify --continue-on-error): another job's successful write of the
    /// same blocks does not make them readable back, since the failed write
    /// may have come later and left them in any state.
    pub write_failed: Vec<(u64, u32)>,
    /// Verification mismatches (filled in by the verify pass).
    pub mismatches: u64,
    /// Blocks the verify pass could not read (`--continue-on-error` only).
    pub unreadable: u64,
    /// I/Os ended because the kernel asked for the controller back.
    pub removed_ios: u64,
    /// Seconds after the worker started at which its controller was
    /// released on the kernel's request (`None`: it was not).
    pub removed_after: Option<f64>,
    /// Failed I/Os by what ended them (the NVMe status name, or the driver's
    /// reason), in order of first appearance.
    pub errors_by_status: Vec<(String, u64)>,
}

struct Job {
    qp: IoQueuePair,
    /// Everything else: what the completion callback works on while the
    /// queue pair is borrowed by `process_completions`.
    w: Work,
}

/// A job's workload state and counters.
struct Work {
    ns: NsPlan,
    /// The handle the commands name the namespace by.
    handle: Namespace,
    start: Vec<u64>,
    lat: Latencies,
    ios: u64,
    bytes: u64,
    errors: u64,
    /// Completions that ended with `IoError::ControllerRemoved`.
    removed_ios: u64,
    /// The controller was released on the kernel's request.
    removed: bool,
    /// Failed I/Os by status (cold: only touched on an error).
    errors_by_status: Vec<(String, u64)>,
    /// A failed I/O ended the run (without `--continue-on-error`).
    stopped_by_error: bool,
    submitted: u64,
    in_flight: u32,
    next_seq: u64,
    io_blocks: u32,
    slots: u64,
    /// `--verify`: the slots whose last write completed successfully (one
    /// bit each), the only ones read back at the end.
    written: SlotBits,
    /// `--verify`: the slots a write failed on (`--continue-on-error`; cold,
    /// so a list, not a second bitmap of every slot).
    write_failed: Vec<u64>,
    /// `--verify`: per tag, the slot + 1 of the write in flight under it
    /// (0: a read, or none).
    write_slot: Vec<u64>,
    /// `--verify`: one block's stamp, built before each write (no
    /// allocation in the completion callback).
    stamp_block: Vec<u8>,
    /// A refusal met inside the completion callback (reported after it).
    refused: Option<Reject>,
    /// Completions of the current poll recorded in the measured window.
    reaped_in_window: u64,
    ticks: CallTicks,
    /// Metadata and protection (`None` on a namespace without metadata).
    md: Option<Box<super::metadata::MdWork>>,
}

/// One bit per I/O slot (`--verify`'s record of what was written): a
/// namespace of 2^32 slots takes 512 MiB, not 4 GiB.
#[derive(Debug, Default)]
struct SlotBits(Vec<u64>);

impl SlotBits {
    fn new(slots: u64) -> SlotBits {
        SlotBits(vec![0; slots.div_ceil(64) as usize])
    }

    fn set(&mut self, slot: u64, value: bool) {
        if let Some(w) = self.0.get_mut((slot / 64) as usize) {
            let bit = 1u64 << (slot % 64);
            if value {
                *w |= bit;
            } else {
                *w &= !bit;
            }
        }
    }

    /// The slots set, ascending.
    fn ones(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.iter().enumerate().flat_map(|(i, &w)| {
            (0..64)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| i as u64 * 64 + b)
        })
    }
}

/// Where the workers wait for each other before their first I/O, so that
/// their measured windows cover the same time (a worker whose setup took
/// longer would otherwise run its window later, and the total — summed I/Os
/// over the longest window — would read low: 2% with two cores and
/// `--io-count`, measured). A worker counts itself once, ready or failed
/// ([`Arrival`]); the wait also ends when the run is stopped, and is bounded.
#[derive(Clone)]
pub struct StartLine {
    arrived: Arc<std::sync::atomic::AtomicUsize>,
    workers: usize,
}

impl StartLine {
    /// A start line for `workers` workers.
    pub fn new(workers: usize) -> StartLine {
        StartLine {
            arrived: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            workers,
        }
    }

    /// Waits until every worker has arrived (or failed), the run is stopped,
    /// or 60 s have passed (a worker stuck in its setup must not hold the
    /// others for ever; they then start without it).
    fn wait_for_all(&self, stop: &AtomicBool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while self.arrived.load(Ordering::Acquire) < self.workers
            && !stop.load(Ordering::Relaxed)
            && std::time::Instant::now() < deadline
        {
            std::thread::yield_now();
        }
    }
}

/// One worker's arrival at the [`StartLine`]: counted by `arrive`, or when
/// dropped (the worker's setup failed and it returns early).
struct Arrival<'a> {
    line: &'a StartLine,
    arrived: bool,
}

impl Arrival<'_> {
    fn arrive(&mut self) {
        if !self.arrived {
            self.arrived = true;
            self.line.arrived.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        self.arrive();
    }
}

/// `--transport-stats` for one poll that reaped: the reap's ticks and the
/// ring's. The poll's `process_completions` ran from `t_reap` to `t_ring`,
/// with `inside` ticks of it spent in the callbacks' `queue`/`submit`
/// calls; the ring ran from `t_ring` to `t_end`, after that interval, so it
/// is not taken out of the reap (it was, and the reap read 0 at depth).
fn poll_ticks(t_reap: u64, t_ring: u64, t_end: u64, inside: u64) -> (u64, u64) {
    (
        t_ring.saturating_sub(t_reap).saturating_sub(inside),
        t_end.saturating_sub(t_ring),
    )
}

/// `x` as an xorshift state: unchanged unless 0 (a fixed point). Every bit
/// of the seed counts (`… | 1` on the whole, as before, made seeds 2k and
/// 2k + 1 give the same LBAs and stamps).
fn xorshift_state(x: u64) -> u64 {
    if x == 0 { 0x9e37_79b9_7f4a_7c15 } else { x }
}

/// xorshift64*: cheap, good enough for LBA choice.
#[inline]
fn next_rand(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// `x` mapped onto `0..n` by a multiply (the high 64 bits of `x × n`), not a
/// division: under TCG a 64-bit `div` is a helper call, and this runs in
/// the completion callback, between seeing a completion and ringing for its
/// replacement.
#[inline]
fn below(x: u64, n: u64) -> u64 {
    ((u128::from(x) * u128::from(n)) >> 64) as u64
}

/// The verification stamp of one block: deterministic in (seed, nsid, lba).
pub fn stamp(buf: &mut [u8], seed: u64, nsid: u32, lba: u64) {
    // Every bit of the NSID counts (a shift would drop the high ones:
    // namespaces 1 and 65537 would stamp alike).
    let mut x = xorshift_state(
        seed ^ u64::from(nsid).wrapping_mul(0xd6e8_feb8_6659_fd93)
            ^ lba.wrapping_mul(0x9e37_79b9_7f4a_7c15),
    );
    for chunk in buf.chunks_mut(8) {
        let v = next_rand(&mut x).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    // The LBA itself at the start makes misplaced blocks obvious in a dump.
    if buf.len() >= 8 {
        buf[..8].copy_from_slice(&lba.to_le_bytes());
    }
}

impl Job {
    fn new(ctrl: &Controller, plan: &WorkerPlan, ns: NsPlan) -> Result<(Job, Vec<DmaBuffer>)> {
        let handle = ctrl.namespace(ns.nsid)?.clone();
        let qp = ctrl
            .io_queue_pair(plan.qp.clone())
            .with_context(|| format!("creating a queue pair on core {}", plan.core))?;
        if plan.depth > qp.max_depth() {
            bail!(
                "queue depth {} exceeds what a queue pair of {} entries holds ({}); use --queue-entries {}",
                plan.depth,
                qp.sq_entries(),
                qp.max_depth(),
                plan.depth + 1
            );
        }
        let io_blocks = (plan.io_size / ns.lba_size as usize) as u32;
        let stride = super::metadata::data_stride(ns.lba_size, ns.metadata, plan.protection);
        let per_io = io_blocks as usize * stride;
        let mut bufs = Vec::with_capacity(plan.depth as usize);
        for i in 0..plan.depth as usize {
            match ctrl.alloc_dma(per_io) {
                Ok(b) => bufs.push(b),
                Err(upnvme::Error::Dma(e)) => {
                    return Err(match hugepage_advice(&e, plan, per_io, i) {
                        Some(advice) => anyhow::anyhow!(advice),
                        None => upnvme::Error::Dma(e).into(),
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
        let md = super::metadata::MdWork::new(
            ctrl,
            ns.lba_size,
            ns.metadata,
            plan.protection,
            plan.depth,
            io_blocks,
        )?;
        let slots = ns.blocks / io_blocks as u64;
        let lat = Latencies::new()?;
        Ok((
            Job {
                qp,
                w: Work {
                    ns,
                    handle,
                    start: vec![0; plan.depth as usize],
                    lat,
                    ios: 0,
                    bytes: 0,
                    errors: 0,
                    removed_ios: 0,
                    removed: false,
                    errors_by_status: Vec::new(),
                    stopped_by_error: false,
                    submitted: 0,
                    in_flight: 0,
                    next_seq: (plan.index as u64 * 7919) % slots.max(1),
                    io_blocks,
                    slots,
                    written: SlotBits::new(if plan.verify { slots } else { 0 }),
                    write_failed: Vec::new(),
                    write_slot: if plan.verify {
                        vec![0; plan.depth as usize]
                    } else {
                        Vec::new()
                    },
                    stamp_block: if plan.verify {
                        vec![0; ns.lba_size as usize]
                    } else {
                        Vec::new()
                    },
                    refused: None,
                    reaped_in_window: 0,
                    ticks: CallTicks::default(),
                    md,
                },
            },
            bufs,
        ))
    }

    /// The warm-up is over: what was counted so far is dropped; the
    /// commands in flight count as submitted in the measured window.
    fn start_window(&mut self) {
        self.w.start_window();
        self.qp.reset_stats();
    }

    /// One look at the CQ. Each completion is resubmitted from inside the
    /// callback, before anything is recorded: the next command's doorbell
    /// (at depth 1, or with `--ring-per-io`) or its SQE (otherwise: the batch
    /// is rung once after the reap, as spdk_nvme_perf's delayed submission
    /// does; with the EventIdx in use `queue` announces each at once) comes
    /// first, the counters after it, and the latency records after the
    /// batch's doorbell. Each
    /// completion's own TSC stamp decides whether the warm-up or the run is
    /// over: the completion that ends the warm-up still belongs to it, its
    /// resubmission to the window. Returns the completions reaped and
    /// whether this poll ended the warm-up.
    #[inline]
    fn poll(
        &mut self,
        plan: &WorkerPlan,
        rng: &mut u64,
        clock: &mut RunClock,
        stop: &AtomicBool,
    ) -> Result<(u64, bool)> {
        let t_reap = if plan.time_calls { rdtsc() } else { 0 };
        let submit_ticks_before = self.w.ticks.submit;
        let w = &mut self.w;
        let mut warmup_ended = false;
        // The batch's latencies, put into the histogram after its doorbell:
        // the record's floating-point work would otherwise lengthen the
        // turnaround from seeing the completions to ringing for their
        // replacements, and at QD2 that decides QEMU's fast mode (docs/
        // benchmarks.md, "Thirty-fifth session"). A batch larger than the
        // array records the rest in the callback. Each latency is still
        // measured at the callback's first instruction.
        let mut deferred = [0u64; DEFERRED_RECORDS];
        let mut n_deferred = 0usize;
        // At most what is in flight can complete: at depth 1 the reap then
        // stops after the one completion instead of looking at the next CQ
        // entry too.
        let ios = self.qp.process_completions(w.in_flight, |qp, c| {
            let seen = rdtsc();
            let ticks = seen.saturating_sub(w.start[c.tag as usize]);
            w.in_flight -= 1;
            // Before the resubmission below reuses the tag.
            w.settle_write(c.tag, c.result.is_ok());
            let ends_warmup = clock.warmup_ends(seen, stop);
            if ends_warmup {
                // This completion is the warm-up's last: what was
                // counted so far is dropped, the resubmission below is
                // the window's first.
                w.start_window();
                qp.reset_stats();
                warmup_ended = true;
            }
            let time_up = clock.time_up(seen, stop);
            if c.result == Err(IoError::ControllerRemoved) {
                // Not an I/O error: the controller was taken away; the run
                // ends and reports the removal.
                w.removed = true;
            } else if let Err(e) = &c.result {
                w.count_error(e);
                if !plan.continue_on_error {
                    // Every job of every worker stops submitting.
                    w.stopped_by_error = true;
                    stop.store(true, Ordering::Relaxed);
                }
            }
            let more = !w.stopped_by_error
                && !w.removed
                && match plan.io_count {
                    // The count applies to the measured window only.
                    Some(n) => !time_up && (!clock.measuring || w.submitted < n),
                    None => !time_up,
                };
            if let (Some(m), Some(b)) = (w.md.as_mut(), c.metadata) {
                m.put_back(c.tag, b);
            }
            if let (true, Some(buf)) = (more, c.buffer) {
                let ring = plan.depth == 1;
                if let Err(r) = w.submit(qp, plan, rng, buf, c.tag, ring) {
                    w.refused.get_or_insert(r);
                }
            }
            // Bookkeeping, after the resubmission. Only a successful I/O
            // counts toward IOPS, bandwidth and latency (a failed one is an
            // error, a removed one a removed I/O).
            if clock.measuring && !ends_warmup {
                if c.result.is_ok() {
                    if let Some(d) = deferred.get_mut(n_deferred) {
                        *d = ticks;
                        n_deferred += 1;
                    } else {
                        w.lat.record(((ticks as f64) * plan.ns_per_tick) as u64);
                    }
                    w.ios += 1;
                    w.bytes += plan.io_size as u64;
                }
                w.reaped_in_window += 1;
            }
            let removed = c.result == Err(IoError::ControllerRemoved);
            w.errors += u64::from(c.result.is_err() && !removed);
            w.removed_ios += u64::from(removed);
        });
        let record = |w: &mut Work, deferred: &[u64]| {
            for &t in deferred {
                w.lat.record(((t as f64) * plan.ns_per_tick) as u64);
            }
        };
        let ios = match ios {
            Ok(n) => n,
            // Released on the kernel's request: this job is over, the run
            // reports. The call may have delivered completions and then
            // failed (the periodic CSTS check, a later CQ look), with the
            // commands the release ended still parked in the pair.
            Err(upnvme::Error::ControllerRemoved { .. }) => {
                record(&mut self.w, &deferred[..n_deferred]);
                self.end_removed();
                return Ok((0, false));
            }
            Err(e) => return Err(anyhow::Error::new(e).context("reaping completions")),
        };
        if ios == 0 {
            return Ok((0, false));
        }
        // One SQ doorbell for everything queued from this batch (nothing is
        // left when each was announced already).
        if plan.time_calls {
            let t_ring = rdtsc();
            self.qp.ring();
            let t_end = rdtsc();
            let w = &mut self.w;
            let (reap, ring) = poll_ticks(
                t_reap,
                t_ring,
                t_end,
                w.ticks.submit.saturating_sub(submit_ticks_before),
            );
            w.ticks.reap += reap;
            w.ticks.submit += ring;
            w.ticks.reaped += std::mem::take(&mut w.reaped_in_window);
        } else {
            self.qp.ring();
            self.w.reaped_in_window = 0;
        }
        record(&mut self.w, &deferred[..n_deferred]);
        if let Some(r) = self.w.refused.take() {
            let e = self.qp.describe(r);
            if matches!(e, upnvme::Error::ControllerRemoved { .. }) {
                // Released on the kernel's request while resubmitting (the
                // submission waited for the release to end).
                self.end_removed();
                return Ok((u64::from(ios), warmup_ended));
            }
            bail!("a resubmission was refused: {e}");
        }
        Ok((u64::from(ios), warmup_ended))
    }
}

impl Job {
    /// The controller was released on the kernel's request: delivers the
    /// commands the release ended, parked in the pair (the library hands
    /// them out with the next `process_completions`, also once it reports
    /// the removal) — counted as removed I/Os — and ends the job.
    #[cold]
    fn end_removed(&mut self) {
        let w = &mut self.w;
        let _ = self.qp.process_completions(u32::MAX, |_, c| {
            let removed = c.result == Err(IoError::ControllerRemoved);
            w.errors += u64::from(c.result.is_err() && !removed);
            w.removed_ios += u64::from(removed);
        });
        self.w.removed = true;
        self.w.in_flight = 0;
    }
}

impl Work {
    /// Counts a failed I/O under its status (cold path).
    #[cold]
    #[inline(never)]
    fn count_error(&mut self, e: &IoError) {
        let key = match e {
            IoError::Status(s) => format!("{} (sct {:#x}, sc {:#x})", s.name(), s.sct(), s.sc()),
            other => other.to_string(),
        };
        match self.errors_by_status.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => self.errors_by_status.push((key, 1)),
        }
    }

    /// `--verify`: the command under `tag` completed (`ok`: successfully).
    /// A write's slot is read back at the end if it succeeded; after a
    /// failed write the slot's content is unknown and it is not.
    fn settle_write(&mut self, tag: u64, ok: bool) {
        if let Some(w) = self.write_slot.get_mut(tag as usize) {
            let slot = std::mem::take(w);
            if slot != 0 {
                self.written.set(slot - 1, ok);
                if !ok {
                    self.write_failed.push(slot - 1);
                }
            }
        }
    }

    /// The warm-up is over (see [`Job::start_window`]; the caller resets the
    /// queue pair's counters).
    fn start_window(&mut self) {
        self.lat.reset();
        self.ios = 0;
        self.bytes = 0;
        self.submitted = self.in_flight as u64;
        self.ticks = CallTicks::default();
        self.reaped_in_window = 0;
    }

    /// Queues one I/O with `buf` under `tag` on `qp`. With `ring` (or
    /// `--ring-per-io`) its SQ doorbell is written at once; otherwise the
    /// caller rings once for the batch.
    #[inline]
    fn submit(
        &mut self,
        qp: &mut IoQueuePair,
        plan: &WorkerPlan,
        rng: &mut u64,
        buf: DmaBuffer,
        tag: u64,
        ring: bool,
    ) -> std::result::Result<(), Reject> {
        let slot = if plan.random {
            below(next_rand(rng), self.slots)
        } else {
            let s = self.next_seq;
            self.next_seq = if s + 1 >= self.slots { 0 } else { s + 1 };
            s
        };
        let slba = slot * self.io_blocks as u64;
        let read = match plan.read_percent {
            100 => true,
            0 => false,
            p => (next_rand(rng) % 100) < p as u64,
        };
        let (nsid, ns) = (self.ns.nsid, &self.handle);
        let blocks = self.io_blocks;
        let cmd = if read {
            IoCommand::Read { ns, slba, blocks }
        } else {
            if plan.verify {
                let lba = self.ns.lba_size as usize;
                let stride = self.md.as_ref().map_or(lba, |m| m.stride());
                for b in 0..blocks as u64 {
                    stamp(&mut self.stamp_block, plan.seed, nsid, slba + b);
                    if buf
                        .write_bytes(b as usize * stride, &self.stamp_block)
                        .is_err()
                    {
                        return Err(Reject::BufferTooSmall {
                            need: (blocks as u64) * lba as u64,
                        });
                    }
                }
                // Read back at the end only once it completed successfully
                // (`settle_write`).
                if let Some(w) = self.write_slot.get_mut(tag as usize) {
                    *w = slot + 1;
                }
            }
            IoCommand::Write { ns, slba, blocks }
        };
        // The latency clock starts before the metadata and a write's
        // host-built protection information (`-e PRACT=0`: a CRC per block)
        // are prepared, as spdk_nvme_perf stamps `submit_tsc` before its
        // `spdk_dif_generate`.
        let start = rdtsc();
        let io = match self.md.as_mut() {
            None => IoData::from(Some(buf)),
            Some(m) => m.io(buf, tag, slba, blocks, !read),
        };
        self.start[tag as usize] = start;
        // `--transport-stats` times the driver's call alone.
        let t_call = if plan.time_calls { rdtsc() } else { start };
        let queued = if ring || plan.ring_per_io {
            qp.submit_io(cmd, io, tag)
        } else {
            // Queued only: the caller rings once for the whole batch.
            qp.queue_io(cmd, io, tag)
        };
        if plan.time_calls {
            self.ticks.submit += rdtsc().saturating_sub(t_call);
            self.ticks.submitted += 1;
        }
        queued.map_err(|r| r.reason)?;
        self.submitted += 1;
        self.in_flight += 1;
        Ok(())
    }
}

/// Empty polls between two reads of the clock (warm-up end, run end, stop
/// flag). Under emulation a TSC read is a helper call; natively 64 empty
/// polls take well under a microsecond.
const IDLE_CLOCK_POLLS: u32 = 64;

/// Latencies of one reap batch put into the histogram after its SQ
/// doorbell (see `Job::poll`).
const DEFERRED_RECORDS: usize = 16;

/// The advice for a run whose buffers do not fit the reserved hugepages,
/// sized for the whole run (every queue pair's `depth` buffers of `per_io`
/// bytes) rather than for the one allocation that failed: with the
/// library's per-allocation figure, `perf -q 1024 -o 65536` took a retry per
/// buffer. `done` buffers of this pair are allocated; what the run still
/// needs is counted from there (other workers' progress is counted as still
/// needed: the figure errs high, never low). `None` for other DMA errors.
fn hugepage_advice(
    e: &upnvme::dma::DmaError,
    plan: &WorkerPlan,
    per_io: usize,
    done: usize,
) -> Option<String> {
    let upnvme::dma::DmaError::HugepagesUnavailable {
        page_kib,
        free,
        total,
        suggest,
        sysctl,
        ..
    } = e
    else {
        return None;
    };
    let page = (*page_kib as u64).max(1) * 1024;
    let run_bytes = plan.run_pairs as u64 * u64::from(plan.depth) * per_io as u64;
    let left = run_bytes.saturating_sub(done as u64 * per_io as u64);
    // Pages in use now, plus what the run still needs, plus one page of
    // queue memory and rounding per queue pair.
    let want =
        (total.saturating_sub(*free) + left.div_ceil(page) + plan.run_pairs as u64).max(*suggest);
    Some(format!(
        "{e}; this run needs about {} MiB of buffers ({} queue pair(s) x -q {} x {} bytes) \
         besides queue memory: reserve about {want} with `upnvme setup hugepages {want}` \
         (or `echo {want} > {sysctl}`), or run with --no-hugepages",
        run_bytes.div_ceil(1 << 20),
        plan.run_pairs,
        plan.depth,
        per_io
    ))
}

/// Runs one worker to completion.
pub fn run(
    ctrl: Arc<Controller>,
    plan: WorkerPlan,
    progress: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    start: StartLine,
) -> Result<Vec<JobResult>> {
    // Counted at the start line however this worker's setup ends.
    let mut arrival = Arrival {
        line: &start,
        arrived: false,
    };
    if !core_affinity::set_for_current(core_affinity::CoreId { id: plan.core }) {
        bail!("could not pin a worker to core {}", plan.core);
    }
    let mut jobs = Vec::new();
    let mut pools = Vec::new();
    for ns in &plan.namespaces {
        let (job, bufs) = Job::new(&ctrl, &plan, *ns)?;
        jobs.push(job);
        pools.push(bufs);
    }
    arrival.arrive();
    start.wait_for_all(&stop);
    if stop.load(Ordering::Relaxed) {
        // A signal, or another worker's failed setup, before the first I/O:
        // none is sent (a write workload would otherwise write).
        return Ok(Vec::new());
    }
    // One generator per job, from the seed, the worker and the namespace:
    // a job's LBA sequence does not depend on the order in which the
    // worker's other jobs complete (`--seed` reproduces every namespace's).
    let mut rngs: Vec<u64> = jobs
        .iter()
        .map(|j| {
            xorshift_state(
                plan.seed
                    ^ (plan.index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    ^ u64::from(j.w.ns.nsid).wrapping_mul(0xd6e8_feb8_6659_fd93),
            )
        })
        .collect();
    for ((job, bufs), rng) in jobs.iter_mut().zip(pools).zip(rngs.iter_mut()) {
        for (tag, buf) in bufs.into_iter().enumerate() {
            job.w
                .submit(&mut job.qp, &plan, rng, buf, tag as u64, false)
                .map_err(|r| anyhow::anyhow!("{}", job.qp.describe(r)))?;
        }
        let t_ring = rdtsc();
        job.qp.ring();
        if plan.time_calls {
            job.w.ticks.submit += rdtsc().saturating_sub(t_ring);
        }
    }

    let t_start = rdtsc();
    let mut clock = RunClock::start(&plan, t_start);
    let mut done = Progress {
        shared: &progress,
        total: 0,
        published: 0,
    };
    run_loop(&mut jobs, &plan, &mut rngs, &mut clock, &stop, &mut done)?;
    progress.store(done.total, Ordering::Relaxed);
    let removed_after = jobs
        .iter()
        .any(|j| j.w.removed)
        .then(|| rdtsc().saturating_sub(t_start) as f64 * plan.ns_per_tick / 1e9);
    if removed_after.is_some() {
        // Every worker stops: the controller is gone for all of them.
        stop.store(true, Ordering::Relaxed);
    }
    let (measuring, ns_per_tick) = (clock.measuring, plan.ns_per_tick);
    // Stopped (by a signal) before the warm-up ended: nothing was measured.
    let seconds = if measuring {
        (rdtsc().saturating_sub(clock.t_measure)) as f64 * ns_per_tick / 1e9
    } else {
        0.0
    };
    Ok(jobs
        .into_iter()
        .map(|Job { mut qp, w: mut j }| {
            if !measuring {
                j.lat.reset();
                j.ios = 0;
                j.bytes = 0;
                qp.reset_stats();
                j.ticks = CallTicks::default();
            }
            let timing = plan.time_calls.then_some(CallTiming {
                submit_ns: j.ticks.submit as f64 * ns_per_tick,
                submitted: j.ticks.submitted,
                reap_ns: j.ticks.reap as f64 * ns_per_tick,
                reaped: j.ticks.reaped,
            });
            let written = if plan.verify {
                j.written
                    .ones()
                    .map(|s| (s * j.io_blocks as u64, j.io_blocks))
                    .collect()
            } else {
                Vec::new()
            };
            let mut failed = std::mem::take(&mut j.write_failed);
            failed.sort_unstable();
            failed.dedup();
            let write_failed = failed
                .into_iter()
                .map(|s| (s * j.io_blocks as u64, j.io_blocks))
                .collect();
            JobResult {
                core: plan.core,
                nsid: j.ns.nsid,
                ios: j.ios,
                bytes: j.bytes,
                seconds,
                lat: j.lat,
                errors: j.errors,
                removed_ios: j.removed_ios,
                removed_after,
                errors_by_status: std::mem::take(&mut j.errors_by_status),
                stats: qp.stats(),
                timing,
                written,
                write_failed,
                mismatches: 0,
                unreadable: 0,
            }
        })
        .collect())
}

/// The run's clock: the warm-up, then the measured window (or, with
/// `--io-count`, until every job has submitted its count).
struct RunClock {
    warm_end: u64,
    run_ticks: u64,
    count_mode: bool,
    measuring: bool,
    /// TSC when the measured window began.
    t_measure: u64,
    /// TSC when it ends (`u64::MAX` until the warm-up is over).
    end: u64,
}

impl RunClock {
    fn start(plan: &WorkerPlan, t0: u64) -> RunClock {
        let measuring = plan.warmup_ticks == 0;
        RunClock {
            warm_end: t0.saturating_add(plan.warmup_ticks),
            run_ticks: plan.run_ticks,
            count_mode: plan.io_count.is_some(),
            measuring,
            t_measure: t0,
            end: if measuring {
                t0.saturating_add(plan.run_ticks)
            } else {
                u64::MAX
            },
        }
    }

    /// True when the reading `now` ends the warm-up (the measured window
    /// starts at `now`). Not once a signal asked to stop: a window made of
    /// the drain alone would be no measurement.
    fn warmup_ends(&mut self, now: u64, stop: &AtomicBool) -> bool {
        if self.measuring || now < self.warm_end || stop.load(Ordering::Relaxed) {
            return false;
        }
        self.measuring = true;
        self.t_measure = now;
        self.end = now.saturating_add(self.run_ticks);
        true
    }

    /// No more submissions: the window is over, or a signal asked to stop.
    fn time_up(&self, now: u64, stop: &AtomicBool) -> bool {
        (!self.count_mode && self.measuring && now >= self.end) || stop.load(Ordering::Relaxed)
    }
}

/// I/Os completed, published to the progress line every 256.
struct Progress<'a> {
    shared: &'a AtomicU64,
    total: u64,
    published: u64,
}

impl Progress<'_> {
    #[inline]
    fn add(&mut self, n: u64) {
        self.total += n;
        // Completions come in batches, so `total` steps over exact
        // multiples: publish whenever 256 more have been done.
        if self.total - self.published >= 256 {
            self.shared.store(self.total, Ordering::Relaxed);
            self.published = self.total;
        }
    }
}

/// The closed loop, at every depth: poll each job's CQ in turn; every
/// completion is resubmitted from inside its callback ([`Job::poll`]).
fn run_loop(
    jobs: &mut [Job],
    plan: &WorkerPlan,
    rngs: &mut [u64],
    clock: &mut RunClock,
    stop: &AtomicBool,
    done: &mut Progress<'_>,
) -> Result<()> {
    let mut idle_polls = 0u32;
    loop {
        // Whether the run is over is checked after every poll that reaped
        // something and every IDLE_CLOCK_POLLS empty polls: an empty poll is
        // then only a look at each CQ. The warm-up's end and the window's
        // end are decided inside each poll by the completions' own TSC
        // stamps (there is always a command in flight until the end).
        if idle_polls.is_multiple_of(IDLE_CLOCK_POLLS) {
            let now = rdtsc();
            let time_up = clock.time_up(now, stop);
            // Done when nothing is in flight and nothing more may be
            // submitted (the count applies to the measured window only).
            let count_left = |j: &Job| match plan.io_count {
                Some(n) => {
                    !time_up && !j.w.stopped_by_error && (!clock.measuring || j.w.submitted < n)
                }
                None => false,
            };
            let finished = jobs.iter().all(|j| j.w.in_flight == 0 && !count_left(j));
            if finished {
                return Ok(());
            }
        }
        if jobs.iter().any(|j| j.w.removed) {
            return Ok(());
        }
        let mut reaped = 0u64;
        for i in 0..jobs.len() {
            let (n, ended) = jobs[i].poll(plan, &mut rngs[i], clock, stop)?;
            reaped += n;
            if ended {
                // The other jobs' windows start now too.
                for (j, job) in jobs.iter_mut().enumerate() {
                    if j != i {
                        job.start_window();
                    }
                }
            }
        }
        if reaped == 0 {
            idle_polls = idle_polls.wrapping_add(1);
        } else {
            idle_polls = 0;
            done.add(reaped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        Arrival, SlotBits, StartLine, below, next_rand, poll_ticks, stamp, xorshift_state,
    };
    use std::sync::atomic::AtomicBool;

    /// The start line opens when every worker arrived — a worker whose
    /// setup failed counts when its `Arrival` drops — or when the run stops.
    #[test]
    fn the_start_line_waits_for_every_worker_ready_or_failed() {
        let line = StartLine::new(3);
        let stop = AtomicBool::new(false);
        let t = std::time::Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut a = Arrival {
                    line: &line,
                    arrived: false,
                };
                a.arrive();
                a.arrive(); // counted once
            });
            s.spawn(|| {
                // A failed setup: dropped without `arrive`.
                let _a = Arrival {
                    line: &line,
                    arrived: false,
                };
            });
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(50));
                let mut a = Arrival {
                    line: &line,
                    arrived: false,
                };
                a.arrive();
            });
            line.wait_for_all(&stop);
            assert_eq!(line.arrived.load(std::sync::atomic::Ordering::SeqCst), 3);
        });
        assert!(t.elapsed() < std::time::Duration::from_secs(30));
        // A stopped run does not wait for workers that never come.
        let line = StartLine::new(2);
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        line.wait_for_all(&stop);
    }

    /// A poll reaping for 1000 ticks, 600 of them in resubmissions, then a
    /// ring of 400: the reap is 400 and the ring 400 (the ring used to be
    /// taken out of the reap as well, leaving 0).
    #[test]
    fn a_polls_ring_is_not_taken_out_of_its_reap() {
        assert_eq!(poll_ticks(1000, 2000, 2400, 600), (400, 400));
        // Clock steps backwards read as 0, not a wrap.
        assert_eq!(poll_ticks(2000, 1000, 900, 0), (0, 0));
    }

    /// The LBA slot from a random word: always below the slot count, and
    /// every slot of a small range reached.
    #[test]
    fn below_stays_in_range_and_covers_it() {
        for n in [1u64, 2, 3, 1000, 1 << 40, u64::MAX] {
            for x in [0u64, 1, 12345, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
                assert!(below(x, n) < n, "below({x}, {n})");
            }
        }
        // Every slot of a small range is hit by the generator.
        let mut seen = [false; 7];
        let mut x = xorshift_state(42);
        for _ in 0..1000 {
            seen[below(next_rand(&mut x), 7) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s), "{seen:?}");
    }

    /// Every seed bit counts: seeds 2k and 2k + 1 stamp different data.
    #[test]
    fn neighbouring_seeds_stamp_different_blocks() {
        let (mut a, mut b) = (vec![0u8; 4096], vec![0u8; 4096]);
        for seed in [0u64, 2, 1 << 40, u64::MAX - 1] {
            stamp(&mut a, seed, 1, 7);
            stamp(&mut b, seed + 1, 1, 7);
            assert_ne!(a, b, "seeds {seed} and {}", seed + 1);
            assert_eq!(a[..8], 7u64.to_le_bytes(), "the LBA leads the block");
        }
    }

    /// Every NSID bit counts: namespaces 1 and 65537 stamp different data
    /// (the NSID once entered shifted by 48, which dropped its high bits).
    #[test]
    fn the_verify_stamp_tells_every_namespace_apart() {
        let (mut a, mut b) = (vec![0u8; 4096], vec![0u8; 4096]);
        for high in [1u32 << 16, 1 << 31] {
            stamp(&mut a, 1234, 1, 77);
            stamp(&mut b, 1234, 1 | high, 77);
            assert_ne!(a, b, "namespaces 1 and {} stamp LBA 77 alike", 1 | high);
        }
    }

    #[test]
    fn slots_set_cleared_and_listed() {
        let mut b = SlotBits::new(130);
        for s in [0, 63, 64, 129] {
            b.set(s, true);
        }
        b.set(63, false);
        b.set(500, true); // beyond: ignored
        assert_eq!(b.ones().collect::<Vec<_>>(), vec![0, 64, 129]);
    }
}
