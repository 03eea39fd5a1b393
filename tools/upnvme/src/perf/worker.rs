//! One worker per core: pinned, its own queue pair per namespace, a closed loop
//! of `depth` I/Os per namespace, latency from just before submission to the
//! moment the completion is reaped, in TSC ticks converted to nanoseconds.
//! The loop takes no lock and allocates nothing once it runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use upnvme::dma::tsc::rdtsc;
use upnvme::{
    Completion, Controller, DmaBuffer, IoCommand, IoQueuePair, QueuePairOptions, QueueStats,
};

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
    /// `--ring-per-io`: `submit` (queue + ring) every I/O instead of one ring
    /// per batch.
    pub ring_per_io: bool,
    /// `--transport-stats`: also time the driver calls ([`CallTiming`]).
    pub time_calls: bool,
    /// RNG seed.
    pub seed: u64,
    /// Queue pair options.
    pub qp: QueuePairOptions,
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
}

/// Time spent inside the driver's calls over the measured window
/// (`--transport-stats`): where a round trip's time goes on the host side.
///
/// Each figure is two TSC reads around the call, so it includes the reads'
/// own cost, and the reads sit inside the round trips they time (three more
/// per I/O: one after `queue`, two around `ring`). Without
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
    /// (a TSC read, the histogram record and a push) and the CQ head update
    /// when one is due.
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
    /// Latency histogram in nanoseconds.
    pub hist: Histogram<u64>,
    /// Completions with an error status.
    pub errors: u64,
    /// Queue pair counters over the measured window.
    pub stats: QueueStats,
    /// Time inside the driver's calls (with `--transport-stats`).
    pub timing: Option<CallTiming>,
    /// Blocks that were stamped, as (slba, blocks) extents, for --verify.
    pub written: Vec<(u64, u32)>,
    /// Verification mismatches (filled in by the verify pass).
    pub mismatches: u64,
}

struct Job {
    ns: NsPlan,
    qp: IoQueuePair,
    start: Vec<u64>,
    hist: Histogram<u64>,
    ios: u64,
    bytes: u64,
    errors: u64,
    submitted: u64,
    in_flight: u32,
    next_seq: u64,
    io_blocks: u32,
    slots: u64,
    written: Vec<bool>,
    done: Vec<Completion>,
    ticks: CallTicks,
}

/// xorshift64*: cheap, good enough for LBA choice.
#[inline]
fn next_rand(x: &mut u64) -> u64 {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// The verification stamp of one block: deterministic in (seed, nsid, lba).
pub fn stamp(buf: &mut [u8], seed: u64, nsid: u32, lba: u64) {
    let mut x = seed ^ ((nsid as u64) << 48) ^ lba.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
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
        let bufs = (0..plan.depth)
            .map(|_| ctrl.alloc_dma(plan.io_size))
            .collect::<Result<Vec<_>, _>>()?;
        let io_blocks = (plan.io_size / ns.lba_size as usize) as u32;
        let slots = ns.blocks / io_blocks as u64;
        let hist = Histogram::new_with_bounds(1, 60_000_000_000, 3)?;
        Ok((
            Job {
                ns,
                qp,
                start: vec![0; plan.depth as usize],
                hist,
                ios: 0,
                bytes: 0,
                errors: 0,
                submitted: 0,
                in_flight: 0,
                next_seq: (plan.index as u64 * 7919) % slots.max(1),
                io_blocks,
                slots,
                written: if plan.verify {
                    vec![false; slots as usize]
                } else {
                    Vec::new()
                },
                done: Vec::with_capacity(plan.depth as usize),
                ticks: CallTicks::default(),
            },
            bufs,
        ))
    }

    /// Queues one I/O with `buf` under `tag` (the doorbell is rung once per
    /// batch by the caller, as spdk_nvme_perf's delayed submission does).
    #[inline]
    fn submit(&mut self, plan: &WorkerPlan, rng: &mut u64, buf: DmaBuffer, tag: u64) -> Result<()> {
        let slot = if plan.random {
            next_rand(rng) % self.slots
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
        let nsid = self.ns.nsid;
        let blocks = self.io_blocks;
        let cmd = if read {
            IoCommand::Read { nsid, slba, blocks }
        } else {
            if plan.verify {
                let lba = self.ns.lba_size as usize;
                let mut block = vec![0u8; lba];
                for b in 0..blocks as u64 {
                    stamp(&mut block, plan.seed, nsid, slba + b);
                    buf.write_bytes(b as usize * lba, &block)?;
                }
                self.written[slot as usize] = true;
            }
            IoCommand::Write { nsid, slba, blocks }
        };
        let start = rdtsc();
        self.start[tag as usize] = start;
        let queued = if plan.ring_per_io {
            self.qp.submit(cmd, Some(buf), tag)
        } else {
            // Queued only: the caller rings once for the whole batch.
            self.qp.queue(cmd, Some(buf), tag)
        };
        if plan.time_calls {
            self.ticks.submit += rdtsc().saturating_sub(start);
            self.ticks.submitted += 1;
        }
        queued.map_err(|e| anyhow::anyhow!("{e}"))?;
        self.submitted += 1;
        self.in_flight += 1;
        Ok(())
    }
}

/// Runs one worker to completion.
pub fn run(
    ctrl: Arc<Controller>,
    plan: WorkerPlan,
    progress: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> Result<Vec<JobResult>> {
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
    let mut rng = plan.seed ^ (plan.index as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for (job, bufs) in jobs.iter_mut().zip(pools) {
        for (tag, buf) in bufs.into_iter().enumerate() {
            job.submit(&plan, &mut rng, buf, tag as u64)?;
        }
        let t_ring = rdtsc();
        job.qp.ring();
        if plan.time_calls {
            job.ticks.submit += rdtsc().saturating_sub(t_ring);
        }
    }

    let t0 = rdtsc();
    let warm_end = t0 + plan.warmup_ticks;
    let mut measuring = plan.warmup_ticks == 0;
    let mut t_measure = t0;
    let mut end = if measuring {
        t0 + plan.run_ticks
    } else {
        u64::MAX
    };
    let count_mode = plan.io_count.is_some();
    let mut finished = false;
    let mut total_done = 0u64;
    let mut published = 0u64;
    let ns_per_tick = plan.ns_per_tick;

    while !finished {
        let now = rdtsc();
        if !measuring && now >= warm_end {
            measuring = true;
            t_measure = now;
            end = now + plan.run_ticks;
            for job in &mut jobs {
                job.hist.reset();
                job.ios = 0;
                job.bytes = 0;
                job.submitted = job.in_flight as u64;
                job.qp.reset_stats();
                job.ticks = CallTicks::default();
            }
        }
        let time_up = (!count_mode && measuring && now >= end) || stop.load(Ordering::Relaxed);
        finished = true;
        for job in &mut jobs {
            let mut done = std::mem::take(&mut job.done);
            let start = &job.start;
            let hist = &mut job.hist;
            let mut ios = 0u64;
            let mut errors = 0u64;
            let t_reap = if plan.time_calls { rdtsc() } else { 0 };
            job.qp
                .process_completions(u32::MAX, |c| {
                    let ticks = rdtsc().saturating_sub(start[c.tag as usize]);
                    hist.saturating_record(((ticks as f64) * ns_per_tick) as u64);
                    ios += 1;
                    if c.result.is_err() {
                        errors += 1;
                    }
                    done.push(c);
                })
                .context("reaping completions")?;
            if plan.time_calls && ios > 0 {
                job.ticks.reap += rdtsc().saturating_sub(t_reap);
                job.ticks.reaped += ios;
            }
            if measuring {
                job.ios += ios;
                job.bytes += ios * plan.io_size as u64;
            }
            job.errors += errors;
            job.in_flight -= ios as u32;
            total_done += ios;
            for c in done.drain(..) {
                let more = match plan.io_count {
                    Some(n) => job.submitted < n && !time_up,
                    None => !time_up,
                };
                if let (true, Some(buf)) = (more, c.buffer) {
                    job.submit(&plan, &mut rng, buf, c.tag)?;
                }
            }
            // One SQ doorbell for everything resubmitted from this batch.
            if plan.time_calls && ios > 0 {
                let t_ring = rdtsc();
                job.qp.ring();
                job.ticks.submit += rdtsc().saturating_sub(t_ring);
            } else {
                job.qp.ring();
            }
            job.done = done;
            if job.in_flight > 0
                || (count_mode && !time_up && job.submitted < plan.io_count.unwrap_or(0))
            {
                finished = false;
            }
        }
        // Completions come in batches, so `total_done` steps over exact
        // multiples: publish whenever 256 more have been done.
        if total_done - published >= 256 {
            progress.store(total_done, Ordering::Relaxed);
            published = total_done;
        }
    }
    progress.store(total_done, Ordering::Relaxed);
    // Stopped (by a signal) before the warm-up ended: nothing was measured.
    let seconds = if measuring {
        (rdtsc().saturating_sub(t_measure)) as f64 * ns_per_tick / 1e9
    } else {
        0.0
    };
    Ok(jobs
        .into_iter()
        .map(|mut j| {
            if !measuring {
                j.hist.reset();
                j.ios = 0;
                j.bytes = 0;
                j.qp.reset_stats();
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
                    .iter()
                    .enumerate()
                    .filter(|(_, w)| **w)
                    .map(|(s, _)| (s as u64 * j.io_blocks as u64, j.io_blocks))
                    .collect()
            } else {
                Vec::new()
            };
            JobResult {
                core: plan.core,
                nsid: j.ns.nsid,
                ios: j.ios,
                bytes: j.bytes,
                seconds,
                hist: j.hist,
                errors: j.errors,
                stats: j.qp.stats(),
                timing,
                written,
                mismatches: 0,
            }
        })
        .collect())
}
