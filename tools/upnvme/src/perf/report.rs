//! Output of `upnvme perf`: spdk_nvme_perf-style tables, percentiles, a
//! histogram, transport statistics, JSON and CSV.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use upnvme::QueueStats;

use super::latency::Latencies;
use super::worker::{CallTiming, JobResult};

/// Percentiles printed by -L (as spdk_nvme_perf's summary): the label in
/// percent and the quantile, written as its own literal. `99.9 / 100.0` is
/// 0.9990000000000001, and the histogram rounds `q × count` up, so for a
/// count that is a multiple of 1000 the division reported the rank above
/// p99.9 (the maximum for `--io-count 1000`); the literals are exact ranks
/// for every count up to 10⁶.
pub const PERCENTILES: [(f64, f64); 8] = [
    (1.0, 0.01),
    (10.0, 0.1),
    (50.0, 0.5),
    (90.0, 0.9),
    (99.0, 0.99),
    (99.9, 0.999),
    (99.99, 0.9999),
    (99.999, 0.99999),
];

/// The run's parameters, for headers and JSON.
pub struct RunInfo {
    /// The signal that ended the run early ("SIGINT", "SIGTERM"), if any.
    pub interrupted: Option<String>,
    /// Controller address.
    pub device: String,
    /// Model number.
    pub model: String,
    /// Workload name.
    pub workload: &'static str,
    /// Percent reads.
    pub read_percent: u8,
    /// Bytes per I/O.
    pub io_size: usize,
    /// Depth per (namespace, core).
    pub depth: u32,
    /// Seconds requested (or 0 in count mode).
    pub seconds: u64,
    /// Warm-up seconds.
    pub warmup: u64,
    /// reap_on_submit.
    pub reap_on_submit: bool,
    /// `--ring-per-io`: one SQ doorbell per I/O instead of per batch.
    pub ring_per_io: bool,
    /// `--sq-announce`: how queued commands are announced (shadow doorbells).
    pub sq_announce: upnvme::SqAnnounce,
    /// `--sgl` / `--prp`: the data pointer policy.
    pub sgl: upnvme::SglMode,
    /// Shadow doorbells active and allowed to skip MMIO.
    pub shadow: bool,
    /// Doorbell Buffer Config active on the controller (shadow values kept
    /// current even when `shadow` is off).
    pub doorbell_buffer: bool,
    /// CQ head policy name.
    pub cq_policy: String,
    /// Measured TSC frequency.
    pub tsc_hz: f64,
    /// `--io-count`: I/Os per queue pair instead of a duration.
    pub io_count: Option<u64>,
    /// Cores that ran a worker.
    pub cores: Vec<usize>,
    /// Submission / completion queue entries per queue pair.
    pub queue_entries: (u32, u32),
    /// Seed of the LBA generator and the verification stamps.
    pub seed: u64,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

struct Row {
    iops: f64,
    mibs: f64,
    avg: f64,
    min: f64,
    max: f64,
}

fn row(ios: u64, bytes: u64, seconds: f64, l: &Latencies) -> Row {
    let s = seconds.max(1e-9);
    Row {
        iops: ios as f64 / s,
        mibs: bytes as f64 / s / (1024.0 * 1024.0),
        avg: l.mean_us(),
        min: l.min_us(),
        max: l.max_us(),
    }
}

/// Merges the jobs' latencies.
pub fn total_latencies(jobs: &[JobResult]) -> Result<Latencies> {
    let mut t = Latencies::new()?;
    for j in jobs {
        t.add(&j.lat)?;
    }
    Ok(t)
}

/// The human-readable report.
pub fn text(info: &RunInfo, jobs: &[JobResult], latency: u8, transport: bool) -> Result<String> {
    let mut o = String::new();
    let total = total_latencies(jobs)?;
    let ios: u64 = jobs.iter().map(|j| j.ios).sum();
    let bytes: u64 = jobs.iter().map(|j| j.bytes).sum();
    let secs = jobs.iter().map(|j| j.seconds).fold(0.0, f64::max);
    writeln!(
        o,
        "upnvme perf: {} {}% reads, {} B I/Os, depth {} per queue pair, reap_on_submit {}, shadow doorbells {}, CQ head {}, SQ doorbell per {}, announce {}, data pointer {}, seed {}",
        info.workload,
        info.read_percent,
        info.io_size,
        info.depth,
        if info.reap_on_submit { "on" } else { "off" },
        match (info.shadow, info.doorbell_buffer) {
            (true, _) => "on",
            (false, true) => "mmio (buffer kept current)",
            (false, false) => "off",
        },
        info.cq_policy,
        if info.ring_per_io { "I/O" } else { "batch" },
        announce_name(info.sq_announce),
        sgl_name(info.sgl),
        info.seed
    )?;
    match &info.interrupted {
        Some(sig) if ios == 0 && secs == 0.0 => writeln!(
            o,
            "interrupted by {sig} during the warm-up: nothing was measured"
        )?,
        Some(sig) => writeln!(
            o,
            "interrupted by {sig} after {secs:.1} s of measurement: the figures cover that time"
        )?,
        None => {}
    }
    writeln!(
        o,
        "========================================================"
    )?;
    writeln!(o, "{:>94}", "Latency(us)")?;
    writeln!(
        o,
        "{:<50}: {:>10} {:>10} {:>10} {:>10} {:>10}",
        "Device Information", "IOPS", "MiB/s", "Average", "min", "max"
    )?;
    for j in jobs {
        let r = row(j.ios, j.bytes, j.seconds, &j.lat);
        let name = format!(
            "PCIE ({}) NSID {} from core {:>2}",
            info.device, j.nsid, j.core
        );
        writeln!(
            o,
            "{:<50}: {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
            name, r.iops, r.mibs, r.avg, r.min, r.max
        )?;
    }
    writeln!(
        o,
        "========================================================"
    )?;
    let r = row(ios, bytes, secs, &total);
    writeln!(
        o,
        "{:<50}: {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
        "Total", r.iops, r.mibs, r.avg, r.min, r.max
    )?;
    let errors: u64 = jobs.iter().map(|j| j.errors).sum();
    if errors > 0 {
        writeln!(o, "I/O errors: {errors}")?;
        for (k, n) in errors_by_status(jobs) {
            writeln!(o, "  {k}: {n}")?;
        }
    }
    if latency >= 1 {
        writeln!(o)?;
        writeln!(o, "Summary latency data for all namespaces and cores:")?;
        writeln!(
            o,
            "================================================================================="
        )?;
        for (p, q) in PERCENTILES {
            writeln!(o, "{:>10.5}% : {:>12.3}us", p, us(total.quantile_ns(q)))?;
        }
    }
    if latency >= 2 {
        writeln!(o)?;
        writeln!(o, "Latency histogram for all namespaces and cores:")?;
        writeln!(
            o,
            "=============================================================================="
        )?;
        writeln!(o, "       Range in us     Cumulative    IO count")?;
        let n = total.hist.len().max(1) as f64;
        let mut cum = 0u64;
        let mut lo = 0u64;
        for v in total.hist.iter_log(1000, 1.25) {
            let c = v.count_since_last_iteration();
            if c == 0 {
                lo = v.value_iterated_to();
                continue;
            }
            cum += c;
            writeln!(
                o,
                "{:>10.3} - {:>10.3}: {:>9.4}%  ({:>9})",
                us(lo),
                us(v.value_iterated_to()),
                cum as f64 * 100.0 / n,
                c
            )?;
            lo = v.value_iterated_to();
        }
    }
    if transport {
        writeln!(o)?;
        writeln!(o, "Transport statistics (per namespace and core):")?;
        writeln!(
            o,
            "{:<18} {:>12} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8}",
            "core/nsid",
            "polls",
            "idle_polls",
            "completions",
            "sq_mmio",
            "cq_mmio",
            "sq_shadow",
            "cq_shadow",
            "cq_skipped",
            "ei_skipped",
            "sq/io",
            "cq/io",
            "mmio/io"
        )?;
        let mut sum = QueueStats::default();
        for j in jobs {
            sum.add(&j.stats);
            write_stats(
                &mut o,
                &format!("core {} nsid {}", j.core, j.nsid),
                &j.stats,
            )?;
        }
        write_stats(&mut o, "total", &sum)?;
        write_timing(&mut o, jobs)?;
    }
    Ok(o)
}

/// The driver-call timing table (`--transport-stats`): mean microseconds
/// inside the submit calls per command and inside the reaping calls per
/// completion. Skipped when no job timed its calls.
fn write_timing(o: &mut String, jobs: &[JobResult]) -> Result<()> {
    if jobs.iter().all(|j| j.timing.is_none()) {
        return Ok(());
    }
    writeln!(o)?;
    writeln!(
        o,
        "Driver call time (two TSC reads around each call; submit = queue/submit + ring, \
         reap = process_completions calls that reaped):"
    )?;
    writeln!(
        o,
        "{:<18} {:>16} {:>18}",
        "core/nsid", "submit_us/io", "reap_us/completion"
    )?;
    let mut sum = CallTiming::default();
    for j in jobs {
        if let Some(t) = &j.timing {
            sum.add(t);
            write_timing_row(o, &format!("core {} nsid {}", j.core, j.nsid), t)?;
        }
    }
    write_timing_row(o, "total", &sum)
}

fn write_timing_row(o: &mut String, name: &str, t: &CallTiming) -> Result<()> {
    let f = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |ns| format!("{:.3}", ns / 1000.0));
    writeln!(
        o,
        "{:<18} {:>16} {:>18}",
        name,
        f(t.submit_ns_per_io()),
        f(t.reap_ns_per_completion())
    )?;
    Ok(())
}

fn timing_json(t: Option<&CallTiming>) -> Value {
    match t {
        None => Value::Null,
        Some(t) => json!({
            "submitted": t.submitted,
            "submit_us_per_io": t.submit_ns_per_io().map(|ns| ns / 1000.0),
            "reaped": t.reaped,
            "reap_us_per_completion": t.reap_ns_per_completion().map(|ns| ns / 1000.0),
        }),
    }
}

fn write_stats(o: &mut String, name: &str, s: &QueueStats) -> Result<()> {
    writeln!(
        o,
        "{:<18} {:>12} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8.3} {:>8.3} {:>8.3}",
        name,
        s.polls,
        s.idle_polls,
        s.completions,
        s.sq_doorbell_mmio,
        s.cq_doorbell_mmio,
        s.sq_shadow_updates,
        s.cq_shadow_updates,
        s.cq_doorbell_skipped,
        s.mmio_skipped_by_event_idx,
        s.sq_mmio_per_io(),
        s.cq_mmio_per_io(),
        s.mmio_per_io()
    )?;
    Ok(())
}

fn stats_json(s: &QueueStats) -> Value {
    json!({
        "submissions": s.submissions,
        "completions": s.completions,
        "polls": s.polls,
        "idle_polls": s.idle_polls,
        "sq_doorbell_mmio": s.sq_doorbell_mmio,
        "cq_doorbell_mmio": s.cq_doorbell_mmio,
        "sq_shadow_updates": s.sq_shadow_updates,
        "cq_shadow_updates": s.cq_shadow_updates,
        "cq_doorbell_skipped": s.cq_doorbell_skipped,
        "mmio_skipped_by_event_idx": s.mmio_skipped_by_event_idx,
        "mmio_per_io": s.mmio_per_io(),
        "sq_mmio_per_io": s.sq_mmio_per_io(),
        "cq_mmio_per_io": s.cq_mmio_per_io(),
    })
}

fn latency_json(l: &Latencies) -> Value {
    let pct: serde_json::Map<String, Value> = PERCENTILES
        .iter()
        .map(|(p, q)| (format!("p{p}"), json!(us(l.quantile_ns(*q)))))
        .collect();
    json!({
        "mean_us": l.mean_us(),
        "min_us": l.min_us(),
        "max_us": l.max_us(),
        "stdev_us": l.hist.stdev() / 1000.0,
        "percentiles_us": pct,
    })
}

/// What `--verify`'s read-back came to, for the JSON report.
pub enum VerifyState {
    /// Every stamped block was read back and compared.
    Complete {
        /// Blocks whose contents differ from their stamp.
        mismatches: u64,
    },
    /// A read-back failed (without `--continue-on-error`); the error.
    Incomplete(String),
    /// No read-back: the controller was removed during the run.
    NotRun,
}

/// The JSON report's `verify`, `verify_mismatches` and `verify_error`.
fn verify_fields(verify: Option<&VerifyState>) -> (Option<&str>, Option<u64>, Option<&str>) {
    match verify {
        None => (None, None, None),
        Some(VerifyState::Complete { mismatches }) => (Some("complete"), Some(*mismatches), None),
        Some(VerifyState::Incomplete(e)) => (Some("incomplete"), None, Some(e.as_str())),
        Some(VerifyState::NotRun) => (Some("not-run"), None, None),
    }
}

/// The run's JSON document; `verify` is `None` without `--verify`.
pub fn json_doc(info: &RunInfo, jobs: &[JobResult], verify: Option<&VerifyState>) -> Result<Value> {
    let (verify_name, mismatches, verify_error) = verify_fields(verify);
    let total = total_latencies(jobs)?;
    let ios: u64 = jobs.iter().map(|j| j.ios).sum();
    let bytes: u64 = jobs.iter().map(|j| j.bytes).sum();
    let secs = jobs.iter().map(|j| j.seconds).fold(0.0, f64::max);
    let r = row(ios, bytes, secs, &total);
    let mut sum = QueueStats::default();
    let mut timing: Option<CallTiming> = None;
    let rows: Vec<Value> = jobs
        .iter()
        .map(|j| {
            sum.add(&j.stats);
            if let Some(t) = &j.timing {
                timing.get_or_insert_with(CallTiming::default).add(t);
            }
            let r = row(j.ios, j.bytes, j.seconds, &j.lat);
            json!({
                "core": j.core,
                "nsid": j.nsid,
                "ios": j.ios,
                "errors": j.errors,
                "seconds": j.seconds,
                "iops": r.iops,
                "mib_per_s": r.mibs,
                "latency": latency_json(&j.lat),
                "transport": stats_json(&j.stats),
                "call_timing": timing_json(j.timing.as_ref()),
            })
        })
        .collect();
    let hist: Vec<Value> = total
        .hist
        .iter_recorded()
        .map(|v| json!([us(v.value_iterated_to()), v.count_at_value()]))
        .collect();
    Ok(json!({
        "device": info.device,
        "interrupted": info.interrupted,
        "model": info.model,
        "workload": info.workload,
        "read_percent": info.read_percent,
        "io_size": info.io_size,
        "queue_depth": info.depth,
        "seconds": info.seconds,
        "warmup_seconds": info.warmup,
        "reap_on_submit": info.reap_on_submit,
        "ring_per_io": info.ring_per_io,
        "sq_announce": announce_name(info.sq_announce),
        "shadow_doorbells": info.shadow,
        "data_pointer": sgl_name(info.sgl),
        "doorbell_buffer": info.doorbell_buffer,
        "cq_head_policy": info.cq_policy,
        "tsc_hz": info.tsc_hz,
        "io_count": info.io_count,
        "cores": info.cores,
        "sq_entries": info.queue_entries.0,
        "cq_entries": info.queue_entries.1,
        "seed": info.seed,
        "jobs": rows,
        "total": {
            "ios": ios,
            "errors": jobs.iter().map(|j| j.errors).sum::<u64>(),
            "errors_by_status": errors_by_status(jobs)
                .into_iter()
                .map(|(k, n)| json!({"status": k, "count": n}))
                .collect::<Vec<_>>(),
            "iops": r.iops,
            "mib_per_s": r.mibs,
            "latency": latency_json(&total),
            "transport": stats_json(&sum),
            "call_timing": timing_json(timing.as_ref()),
        },
        "histogram_us_count": hist,
        "verify": verify_name,
        "verify_error": verify_error,
        "verify_mismatches": mismatches,
        "verify_unreadable_blocks": jobs.iter().map(|j| j.unreadable).sum::<u64>(),
    }))
}

/// The `--histogram-csv` file, opened for writing before the run and filled
/// after it. Opening neither truncates an existing file nor leaves a new one
/// behind when the run fails: dropped unfilled, it removes the file only if
/// it created it.
pub struct CsvReservation {
    path: PathBuf,
    file: std::fs::File,
    created: bool,
}

impl CsvReservation {
    /// Opens (creating if missing, not truncating) `path`; a path that cannot
    /// be written is a usage error (exit status 2).
    pub fn open(path: &Path) -> Result<Self> {
        let existed = path.exists();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| {
                crate::usage::usage(format!(
                    "--histogram-csv {}: cannot create it: {e}",
                    path.display()
                ))
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            created: !existed,
        })
    }

    /// Replaces the file's contents with the run's `bucket_us,count` rows.
    pub fn fill(mut self, jobs: &[JobResult]) -> Result<()> {
        let total = total_latencies(jobs)?;
        let mut s = String::from("bucket_us,count\n");
        for v in total.hist.iter_recorded() {
            writeln!(s, "{:.3},{}", us(v.value_iterated_to()), v.count_at_value())?;
        }
        let written = self
            .file
            .set_len(0)
            .and_then(|()| std::io::Write::write_all(&mut &self.file, s.as_bytes()));
        // Filled (or failed while filling): from here on the file is the
        // run's, not a leftover to remove.
        self.created = false;
        written.with_context(|| format!("writing {}", self.path.display()))
    }
}

impl Drop for CsvReservation {
    fn drop(&mut self) {
        if self.created {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Failed I/Os of all jobs by status, in order of first appearance.
pub fn errors_by_status(jobs: &[JobResult]) -> Vec<(String, u64)> {
    let mut all: Vec<(String, u64)> = Vec::new();
    for (k, n) in jobs.iter().flat_map(|j| j.errors_by_status.iter()) {
        match all.iter_mut().find(|(a, _)| a == k) {
            Some((_, m)) => *m += n,
            None => all.push((k.clone(), *n)),
        }
    }
    all
}

/// The data pointer policy as the report names it.
/// `each`, `batch` or `deep:N` (header and JSON).
fn announce_name(a: upnvme::SqAnnounce) -> String {
    match a {
        upnvme::SqAnnounce::EachCommand => "each".into(),
        upnvme::SqAnnounce::Batch => "batch".into(),
        upnvme::SqAnnounce::WhenDeep { in_flight } => format!("deep:{in_flight}"),
    }
}

fn sgl_name(m: upnvme::SglMode) -> &'static str {
    match m {
        upnvme::SglMode::Auto => "auto",
        upnvme::SglMode::Always => "sgl",
        upnvme::SglMode::Never => "prp",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// p99.9 of 99 900 I/Os at 1 ns and 100 at 2 ns is 1 ns (the rank is
    /// exactly 99 900): `99.9 / 100.0` rounded up to the next rank.
    #[test]
    fn percentiles_are_exact_ranks_for_whole_counts() {
        let mut h = Latencies::new().unwrap();
        for _ in 0..99_900 {
            h.record(1000);
        }
        for _ in 0..100 {
            h.record(2000);
        }
        let j = latency_json(&h);
        assert_eq!(j["percentiles_us"]["p99.9"], 1.0);
        assert_eq!(j["percentiles_us"]["p99.99"], 2.0);
        let mut h = Latencies::new().unwrap();
        // 1..=1000 ns: below 2048, every value is its own bucket.
        for v in 1..=1000u64 {
            h.record(v);
        }
        let j = latency_json(&h);
        assert_eq!(j["percentiles_us"]["p99.9"], 0.999, "not the maximum");
        assert_eq!(j["percentiles_us"]["p50"], 0.5);
    }

    /// A percentile is its bucket's upper edge, but never above the exact
    /// maximum: one I/O of 10 001 ns (a bucket 8 ns wide, 10 000..=10 007)
    /// reported a p50 of 10.007 us beside a max of 10.001 us, and every
    /// short run's top percentiles sat above its max the same way.
    #[test]
    fn percentiles_never_exceed_the_exact_maximum() {
        let mut h = Latencies::new().unwrap();
        h.record(10_001);
        let j = latency_json(&h);
        assert_eq!(j["max_us"], 10.001);
        for (p, _) in PERCENTILES {
            assert_eq!(j["percentiles_us"][format!("p{p}")], 10.001, "p{p}");
        }
        // 1000 I/Os, the last one slow: p99.99 and p99.999 are that one, at
        // most the maximum; the text report says the same.
        let mut h = Latencies::new().unwrap();
        for _ in 0..999 {
            h.record(5_000);
        }
        h.record(123_456);
        let j = latency_json(&h);
        assert_eq!(j["percentiles_us"]["p99.999"], 123.456);
        // Below the maximum a percentile stays its bucket's upper edge
        // (5 000 ns lies in a bucket 4 ns wide).
        assert_eq!(j["percentiles_us"]["p99.9"], 5.003);
    }

    /// Without `--verify` the three fields are null; a read-back that could
    /// not finish says so with its error instead of a null count that reads
    /// like "no `--verify`".
    #[test]
    fn the_verify_fields_tell_every_outcome_apart() {
        assert_eq!(verify_fields(None), (None, None, None));
        assert_eq!(
            verify_fields(Some(&VerifyState::Complete { mismatches: 3 })),
            (Some("complete"), Some(3), None)
        );
        let e = VerifyState::Incomplete("verify read at LBA 7: Unrecovered Read Error".into());
        assert_eq!(
            verify_fields(Some(&e)),
            (
                Some("incomplete"),
                None,
                Some("verify read at LBA 7: Unrecovered Read Error")
            )
        );
        assert_eq!(
            verify_fields(Some(&VerifyState::NotRun)),
            (Some("not-run"), None, None)
        );
    }
}
