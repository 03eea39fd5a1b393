//! `upnvme perf`: 4 KiB round-trip latency and IOPS, measured the way
//! spdk_nvme_perf does (closed loop per queue pair, latency from just before
//! submission to the reap of the completion), with fio-like readability.

pub mod args;
mod interrupt;
mod latency;
mod metadata;
pub mod plan;
mod report;
mod worker;

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use upnvme::dma::tsc;
use upnvme::{Controller, ControllerOptions, PageBacking, QueuePairOptions};

pub use args::PerfArgs;
pub use interrupt::Interrupted;
use plan::{DeviceFacts, check_args, validate};
use worker::{JobResult, WorkerPlan};

/// The IDs of the cores this process may run on.
pub fn cores_present() -> Vec<usize> {
    core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect()
}

/// Runs `upnvme perf`; returns whether verification (if any) found no mismatch.
pub fn run(a: PerfArgs) -> Result<bool> {
    // Checks that need no device come before opening it.
    let present = cores_present();
    check_args(&a, &present)?;
    // Opened now (filled after the run): a path that cannot be written is a
    // usage error before any I/O, not a failure after the run. A run that
    // fails leaves an existing file as it was and removes one it created.
    let mut csv = a
        .histogram_csv
        .as_deref()
        .map(report::CsvReservation::open)
        .transpose()?;
    // From here on a first SIGINT/SIGTERM ends the run early but cleanly.
    let stop = Arc::new(AtomicBool::new(false));
    let interrupt = interrupt::Interrupt::watch(&stop)?;

    let addr = match &a.device {
        Some(d) => d.clone(),
        None => crate::default_device()?,
    };
    let ctrl = Controller::open(
        &addr,
        ControllerOptions {
            page_backing: if a.no_hugepages {
                PageBacking::Small4K
            } else {
                PageBacking::Huge2M
            },
            shadow_doorbells: a.doorbell_buffer,
            ..Default::default()
        },
    )
    .with_context(|| format!("opening {addr}"))?;

    // Checks against the device, still before any I/O.
    let plan = validate(&a, &DeviceFacts::of(&ctrl, &addr), &present)?;
    let qp = plan::queue_pair_options(&a, &plan)?;
    let (cores, namespaces, read_percent) = (plan.cores, plan.namespaces, plan.read_percent);

    // Calibrated on the first worker's core: a thread that moved between
    // the two ends would difference two CPUs' counters, which need not agree
    // where the kernel marks the TSC unstable (as in the QEMU guest). If the
    // pinning fails, the worker's own pinning reports it.
    let core0 = cores.first().copied();
    let tsc_hz = std::thread::scope(|s| {
        s.spawn(|| {
            if let Some(id) = core0 {
                let _ = core_affinity::set_for_current(core_affinity::CoreId { id });
            }
            tsc::calibrate(Duration::from_millis(100))
        })
        .join()
    })
    .ok()
    .flatten()
    .ok_or_else(|| anyhow!("the CPU time-stamp counter does not advance"))?;
    let ticks = |s: u64| (s as f64 * tsc_hz) as u64;
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            // 53 bits: the JSON report's integer stays exact in every JSON
            // reader (doubles), so `--seed` can repeat the run.
            & ((1 << 53) - 1)
    });
    if let Some(sig) = interrupt.signal() {
        // Interrupted during bring-up: no I/O at all.
        drop(ctrl);
        return Err(anyhow!(Interrupted(sig, interrupt::Reported::Nothing)));
    }
    let ctrl = Arc::new(ctrl);
    let mut handles = Vec::new();
    let mut progress = Vec::new();
    // The workers start their I/O together, once every one is set up (as
    // spdk_nvme_perf's barrier): each counts itself here when ready, or when
    // its setup failed.
    let start = worker::StartLine::new(cores.len());
    for (index, &core) in cores.iter().enumerate() {
        let plan = WorkerPlan {
            core,
            index,
            namespaces: namespaces.clone(),
            depth: a.depth,
            io_size: a.io_size,
            read_percent,
            random: a.workload.random(),
            warmup_ticks: ticks(a.warmup),
            run_ticks: ticks(a.seconds),
            io_count: a.io_count,
            ns_per_tick: 1e9 / tsc_hz,
            verify: a.verify,
            continue_on_error: a.continue_on_error,
            ring_per_io: a.ring_per_io,
            time_calls: a.transport_stats,
            seed,
            qp: qp.clone(),
            protection: a.pi,
            run_pairs: cores.len() * namespaces.len(),
        };
        let p = Arc::new(AtomicU64::new(0));
        progress.push(p.clone());
        let (c, s, line) = (ctrl.clone(), stop.clone(), start.clone());
        handles.push(
            std::thread::Builder::new()
                .name(format!("upnvme-perf-{core}"))
                .spawn(move || {
                    let r = worker::run(c, plan, p, s.clone(), line);
                    if r.is_err() {
                        // A worker that failed (its setup: queue pair,
                        // buffers) ends the run: the others stop too
                        // instead of running out their time for a report
                        // that is then not printed.
                        s.store(true, Ordering::Relaxed);
                    }
                    r
                })
                .context("spawning a worker")?,
        );
    }

    // Live progress, one line per second, only on a terminal and without --json.
    let live = std::io::stderr().is_terminal() && !a.json;
    let started = Instant::now();
    let (mut last, mut last_at) = (0u64, started);
    let mut next = Duration::from_secs(1);
    // Whether a progress line is on stderr (ended with a newline after).
    let mut progress_shown = false;
    while handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(100));
        let now = Instant::now();
        if live && now - started >= next {
            // The rate over the time since the last line, however late the
            // sleep made this one.
            let total: u64 = progress.iter().map(|p| p.load(Ordering::Relaxed)).sum();
            let secs = (now - last_at).as_secs_f64();
            eprint!(
                "\r[{:>4}s] {:>10} I/Os, {:>10.0} IOPS   ",
                (now - started).as_secs(),
                total,
                (total - last) as f64 / secs
            );
            let _ = std::io::stderr().flush();
            progress_shown = true;
            (last, last_at) = (total, now);
            while next <= now - started {
                next += Duration::from_secs(1);
            }
        }
    }
    if progress_shown {
        eprintln!();
    }
    let mut jobs: Vec<JobResult> = Vec::new();
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(r)) => jobs.extend(r),
            Ok(Err(e)) => {
                stop.store(true, Ordering::Relaxed);
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(anyhow!("a worker thread panicked"));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    if jobs.is_empty()
        && let Some(sig) = interrupt.signal()
    {
        // Stopped before the first I/O (the workers send none then).
        drop(jobs);
        drop(ctrl);
        return Err(anyhow!(Interrupted(sig, interrupt::Reported::Nothing)));
    }
    jobs.sort_by_key(|j| (j.nsid, j.core));
    if a.verify {
        // Several cores on one namespace stamp the same pattern into the
        // same blocks: each block is read back (and counted) once.
        merge_written(&mut jobs);
    }
    let removed_after = jobs
        .iter()
        .filter_map(|j| j.removed_after)
        .min_by(|x, y| x.total_cmp(y));
    let removed_ios: u64 = jobs.iter().map(|j| j.removed_ios).sum();

    // Nothing to read back from a controller that was taken away.
    // A verification that cannot finish (a read-back that fails without
    // --continue-on-error) still leaves the measured run's report: it is
    // printed first, and the error is the exit status.
    // Taken before the read-back: a signal during it leaves the measured
    // run complete (the exit status still says a signal came, below).
    let interrupted = interrupt.signal();
    let (mismatches, verify_error) = if a.verify && removed_after.is_none() {
        match verify(&ctrl, &mut jobs, seed, &qp, a.continue_on_error, a.pi) {
            Ok(m) => (Some(m), None),
            Err(e) => (None, Some(e)),
        }
    } else {
        (None, None)
    };
    let info = report::RunInfo {
        interrupted: interrupted.map(interrupt::name),
        device: addr.clone(),
        model: ctrl.identify().mn.clone(),
        workload: a.workload.name(),
        read_percent,
        io_size: a.io_size,
        depth: a.depth,
        seconds: if a.io_count.is_some() { 0 } else { a.seconds },
        warmup: a.warmup,
        reap_on_submit: a.reap_on_submit,
        ring_per_io: a.ring_per_io,
        // What the pairs do: the announcement mode applies with shadow
        // doorbells and the EventIdx only; MMIO doorbells announce per batch.
        sq_announce: if ctrl.shadow_doorbells() && !a.no_shadow_doorbell {
            qp.sq_announce
        } else {
            upnvme::SqAnnounce::Batch
        },
        sgl: plan::sgl_mode(&a),
        shadow: ctrl.shadow_doorbells() && !a.no_shadow_doorbell,
        doorbell_buffer: ctrl.shadow_doorbells(),
        cq_policy: if a.cq_head_every_reap {
            "every-reap".into()
        } else {
            "adaptive".into()
        },
        tsc_hz,
        io_count: a.io_count,
        cores: cores.clone(),
        queue_entries: (plan.sq_entries, plan.cq_entries),
        seed,
    };
    if a.json {
        // What happened to the read-back: not asked for (null), finished,
        // cut short by an error (named), or impossible after a removal.
        let verify = match (&verify_error, mismatches) {
            (Some(e), _) => Some(report::VerifyState::Incomplete(format!("{e:#}"))),
            (None, Some(m)) => Some(report::VerifyState::Complete { mismatches: m }),
            (None, None) if a.verify => Some(report::VerifyState::NotRun),
            (None, None) => None,
        };
        let doc = report::json_doc(&info, &jobs, verify.as_ref())?;
        outln!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        out!(
            "{}",
            report::text(&info, &jobs, a.latency, a.transport_stats)?
        );
        if let Some(m) = mismatches {
            let blocks: u64 = jobs
                .iter()
                .flat_map(|j| j.written.iter().map(|e| e.1 as u64))
                .sum();
            let unreadable: u64 = jobs.iter().map(|j| j.unreadable).sum();
            if unreadable > 0 {
                outln!(
                    "verify: {} blocks read back, {m} mismatches; {unreadable} blocks could not be read (counted, not compared: --continue-on-error)",
                    blocks - unreadable
                );
            } else {
                outln!("verify: {blocks} blocks read back, {m} mismatches");
            }
        }
    }
    if let Some(r) = csv.take() {
        r.fill(&jobs)?;
    }
    if let Some(e) = verify_error {
        return Err(e.context("the run's report is above; its verification did not finish"));
    }
    let errors: u64 = jobs.iter().map(|j| j.errors).sum::<u64>();
    let by_status = report::errors_by_status(&jobs);
    drop(jobs);
    if let Ok(c) = Arc::try_unwrap(ctrl) {
        // After a release on request there is nothing left to shut down.
        let closed = c.close();
        if removed_after.is_none() {
            closed?;
        }
    }
    if let Some(t) = removed_after {
        return Err(anyhow!(
            "controller {addr} was removed at +{t:.1} s (the kernel asked for it back: device \
             removal or vfio-pci unbind) and released; {removed_ios} I/Os in flight ended with \
             the removal error{}; the report above covers the run until then",
            if errors > 0 {
                format!(", {errors} others with an error status")
            } else {
                String::new()
            }
        ));
    }
    // A failure outranks the interruption: exit 1 for errors or mismatches
    // even when a signal cut the run short (with --continue-on-error the
    // errors were counted and reported, and do not fail the run).
    if errors > 0 && !a.continue_on_error {
        return Err(anyhow!(
            "{errors} I/Os completed with an error status ({}); the run stopped at the first \
             (--continue-on-error runs on and counts them)",
            by_status
                .iter()
                .map(|(k, n)| format!("{k}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if mismatches.unwrap_or(0) > 0 {
        return Ok(false);
    }
    // Also a signal that came after the workers stopped (during --verify,
    // the report or the shutdown): the run finished, the exit status says a
    // signal asked to stop.
    if let Some(sig) = interrupt.signal() {
        return Err(anyhow!(Interrupted(sig, interrupt::Reported::Results)));
    }
    Ok(true)
}

/// Puts every namespace's written extents into its first job (`jobs`
/// sorted by NSID), each once: jobs on several cores may have written the
/// same blocks. See [`merge_extents`].
fn merge_written(jobs: &mut [JobResult]) {
    let mut i = 0;
    while i < jobs.len() {
        let nsid = jobs[i].nsid;
        let end = i + jobs[i..].iter().take_while(|j| j.nsid == nsid).count();
        let per_job: Vec<_> = jobs[i..end]
            .iter_mut()
            .map(|j| {
                (
                    std::mem::take(&mut j.written),
                    std::mem::take(&mut j.write_failed),
                )
            })
            .collect();
        jobs[i].written = merge_extents(per_job);
        i = end;
    }
}

/// Blocks as (slba, blocks).
type Extent = (u64, u32);

/// The extents of one namespace to read back, from each job's (written,
/// failed) extents: every extent some job wrote successfully last, once —
/// except, with several jobs, those any job's write failed on. A job's own
/// later success already undoes its own failure (its record is of its last
/// write), but across jobs the order is unknown: another core's failed write
/// may have come after the success and left the blocks in any state, and
/// comparing them would report a false mismatch.
fn merge_extents(per_job: Vec<(Vec<Extent>, Vec<Extent>)>) -> Vec<Extent> {
    let several = per_job.len() > 1;
    let mut failed: Vec<Extent> = Vec::new();
    let mut all: Vec<Extent> = Vec::new();
    for (written, write_failed) in per_job {
        all.extend(written);
        if several {
            failed.extend(write_failed);
        }
    }
    all.sort_unstable();
    all.dedup();
    failed.sort_unstable();
    all.retain(|e| failed.binary_search(e).is_err());
    all
}

/// Reads back every stamped extent and counts blocks that differ.
fn verify(
    ctrl: &Controller,
    jobs: &mut [JobResult],
    seed: u64,
    qp: &QueuePairOptions,
    continue_on_error: bool,
    pi: Option<upnvme::Protection>,
) -> Result<u64> {
    let mut q = ctrl.io_queue_pair(QueuePairOptions {
        reap_on_submit: false,
        ..qp.clone()
    })?;
    let mut total = 0;
    for j in jobs.iter_mut() {
        let ns = ctrl.namespace(j.nsid)?;
        let lba = ns.lba_size() as usize;
        let stride = metadata::data_stride(ns.lba_size(), ns.metadata_layout(), pi);
        let mut want = vec![0u8; lba];
        let mut got = vec![0u8; lba];
        for &(slba, blocks) in &j.written {
            let io = metadata::read_memory(ctrl, ns, blocks, pi)?;
            let cmd = upnvme::IoCommand::Read { ns, slba, blocks };
            let c = metadata::run_one(&mut q, cmd, io)?;
            let b = match (c.result, c.buffer) {
                (Ok(_), Some(b)) => b,
                // --continue-on-error: an unreadable extent (a media error)
                // is counted, not compared; the rest is still verified.
                (Err(_), _) if continue_on_error => {
                    j.unreadable += u64::from(blocks);
                    continue;
                }
                (Err(e), _) => return Err(anyhow!("verify read at LBA {slba}: {e}")),
                (Ok(_), None) => return Err(anyhow!("verify read at LBA {slba}: no buffer back")),
            };
            for i in 0..blocks as u64 {
                worker::stamp(&mut want, seed, j.nsid, slba + i);
                b.read_bytes(i as usize * stride, &mut got)?;
                if want != got {
                    j.mismatches += 1;
                }
            }
        }
        total += j.mismatches;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::merge_extents;

    #[test]
    fn extents_written_by_several_jobs_are_read_back_once() {
        let merged = merge_extents(vec![
            (vec![(0, 8), (16, 8)], vec![]),
            (vec![(16, 8), (8, 8)], vec![]),
        ]);
        assert_eq!(merged, vec![(0, 8), (8, 8), (16, 8)]);
    }

    /// `--verify --continue-on-error` on two cores: core 0 wrote blocks 8–15
    /// successfully, core 1's write of them failed (perhaps later). They are
    /// not compared (before, the union of the successes read them back and
    /// reported a false mismatch when the failed write had left them torn).
    #[test]
    fn a_write_that_failed_on_another_job_is_not_read_back() {
        let merged = merge_extents(vec![
            (vec![(0, 8), (8, 8)], vec![]),
            (vec![(16, 8)], vec![(8, 8)]),
        ]);
        assert_eq!(merged, vec![(0, 8), (16, 8)]);
    }

    /// One job: its record is of its last write, so a failure followed by a
    /// success of its own is read back.
    #[test]
    fn one_jobs_own_later_success_is_read_back() {
        let merged = merge_extents(vec![(vec![(8, 8)], vec![(8, 8)])]);
        assert_eq!(merged, vec![(8, 8)]);
    }
}
