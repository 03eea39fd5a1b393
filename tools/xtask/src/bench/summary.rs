//! From runs to rows: medians over rounds, spread, ratios, the targets,
//! the table and the JSON document.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

use super::contenders::{BS_4K, Contender, FioEngine, Kind, UPNVME_DEFAULT};
use super::results::{Cdf, Metrics, RunResult};

/// Median and range of one figure over the rounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    /// Median over the rounds (mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Stat {
    /// The statistic of `values`; `None` when empty.
    pub fn of(values: &[f64]) -> Option<Stat> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Stat {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }
}

/// One contender's summary.
#[derive(Debug, Clone)]
pub struct Row {
    /// The contender.
    pub contender: Contender,
    /// Runs attempted.
    pub runs: usize,
    /// Runs that produced a measurement.
    pub ok: usize,
    /// Mean latency (us).
    pub mean_us: Stat,
    /// Median latency (us).
    pub p50_us: Stat,
    /// 99th percentile latency (us).
    pub p99_us: Stat,
    /// IOPS.
    pub iops: Stat,
    /// MMIO doorbell writes (SQ + CQ) per I/O, for upnvme and the raw floor.
    pub mmio_per_io: Option<Stat>,
    /// Median SQ tail and CQ head MMIO writes per I/O.
    pub sq_cq_mmio_per_io: Option<(f64, f64)>,
    /// QD1: mean / kernel io_uring hipri QD1 mean; QD32: IOPS / kernel io_uring hipri QD32 IOPS.
    pub vs_io_uring: Option<f64>,
    /// QD1: mean / raw floor QD1 mean; QD32: IOPS / raw floor QD32 IOPS.
    pub vs_floor: Option<f64>,
}

/// A target from the benchmark issues, judged on the medians.
#[derive(Debug, Clone)]
pub struct Target {
    /// What is required.
    pub name: String,
    /// The measured figure (upnvme in its default configuration).
    pub measured: Option<f64>,
    /// The limit.
    pub limit: f64,
    /// True when the measured figure must be at most the limit (else at least).
    pub at_most: bool,
    /// The best upnvme configuration on this figure, and its value.
    pub best: Option<(String, f64)>,
}

impl Target {
    /// Whether the target is met (`None` without a measurement).
    pub fn met(&self) -> Option<bool> {
        self.measured.map(|m| {
            if self.at_most {
                m <= self.limit
            } else {
                m >= self.limit
            }
        })
    }
}

/// The results of a bench run.
#[derive(Debug, Clone)]
pub struct Summary {
    /// One row per contender, in contender order.
    pub rows: Vec<Row>,
    /// The targets.
    pub targets: Vec<Target>,
    /// Runs that failed: (id, round, why).
    pub failures: Vec<(String, usize, String)>,
}

fn stat_of(ms: &[&Metrics], f: impl Fn(&Metrics) -> f64) -> Stat {
    Stat::of(&ms.iter().map(|m| f(m)).collect::<Vec<_>>()).unwrap_or(Stat {
        median: f64::NAN,
        min: f64::NAN,
        max: f64::NAN,
    })
}

/// Summarises `runs` of `contenders`.
pub fn summarise(contenders: &[Contender], runs: &[RunResult]) -> Summary {
    let mut rows: Vec<Row> = contenders
        .iter()
        .map(|c| {
            let mine: Vec<&RunResult> = runs.iter().filter(|r| r.id == c.id).collect();
            let ms: Vec<&Metrics> = mine.iter().filter_map(|r| r.metrics.as_ref()).collect();
            let mmio: Vec<f64> = ms
                .iter()
                .filter_map(|m| Some(m.sq_mmio_per_io? + m.cq_mmio_per_io?))
                .collect();
            Row {
                contender: c.clone(),
                runs: mine.len(),
                ok: ms.len(),
                mean_us: stat_of(&ms, |m| m.mean_us),
                p50_us: stat_of(&ms, |m| m.p50_us),
                p99_us: stat_of(&ms, |m| m.p99_us),
                iops: stat_of(&ms, |m| m.iops),
                mmio_per_io: Stat::of(&mmio),
                sq_cq_mmio_per_io: Stat::of(
                    &ms.iter()
                        .filter_map(|m| m.sq_mmio_per_io)
                        .collect::<Vec<_>>(),
                )
                .zip(Stat::of(
                    &ms.iter()
                        .filter_map(|m| m.cq_mmio_per_io)
                        .collect::<Vec<_>>(),
                ))
                .map(|(sq, cq)| (sq.median, cq.median)),
                vs_io_uring: None,
                vs_floor: None,
            }
        })
        .collect();
    let find = |rows: &[Row], kind: Kind, qd: u32, bs: u32| row_at(rows, kind, qd, bs).cloned();
    let uring = Kind::Fio(FioEngine::IoUringHipri);
    // Ratios against io_uring hipri and the raw floor at the same depth and
    // size, where those ran: mean latency at QD1, IOPS deeper.
    let refs: Vec<(Option<Row>, Option<Row>)> = rows
        .iter()
        .map(|r| {
            let (qd, bs) = (r.contender.qd, r.contender.io_bytes);
            (
                find(&rows, uring, qd, bs),
                find(&rows, Kind::RawFloor, qd, bs),
            )
        })
        .collect();
    for (r, (u, f)) in rows.iter_mut().zip(refs) {
        if r.ok == 0 {
            continue;
        }
        let ratio = |other: &Row| {
            if r.contender.qd == 1 {
                r.mean_us.median / other.mean_us.median
            } else {
                r.iops.median / other.iops.median
            }
        };
        r.vs_io_uring = u.as_ref().map(ratio);
        r.vs_floor = f.as_ref().map(ratio);
    }
    let (u1, u32_) = (find(&rows, uring, 1, BS_4K), find(&rows, uring, 32, BS_4K));
    let f1 = find(&rows, Kind::RawFloor, 1, BS_4K);
    let targets = targets(&rows, u1.as_ref(), u32_.as_ref(), f1.as_ref());
    let failures = runs
        .iter()
        .filter(|r| r.metrics.is_none())
        .map(|r| {
            (
                r.id.clone(),
                r.round,
                r.error.clone().unwrap_or_else(|| "no result".into()),
            )
        })
        .collect();
    Summary {
        rows,
        targets,
        failures,
    }
}

fn targets(rows: &[Row], u1: Option<&Row>, u32_: Option<&Row>, f1: Option<&Row>) -> Vec<Target> {
    let upnvme = |qd: u32| {
        rows.iter()
            .filter(move |r| matches!(r.contender.kind, Kind::Upnvme { .. }))
            .filter(move |r| r.contender.qd == qd && r.contender.io_bytes == BS_4K && r.ok > 0)
    };
    let default = |qd: u32| upnvme(qd).find(|r| r.contender.is_upnvme_default());
    // The figure for the default configuration and the best configuration.
    let judge = |qd: u32, f: &dyn Fn(&Row) -> Option<f64>, lower_is_better: bool| {
        let measured = default(qd).and_then(f);
        let best = upnvme(qd)
            .filter_map(|r| Some((r.contender.label.clone(), f(r)?)))
            .reduce(|a, b| if (b.1 < a.1) == lower_is_better { b } else { a });
        (measured, best)
    };
    let mut t = Vec::new();
    let mut push = |name: &str, limit: f64, at_most: bool, (measured, best)| {
        t.push(Target {
            name: name.into(),
            measured,
            limit,
            at_most,
            best,
        })
    };
    push(
        "QD1 mean latency / kernel io_uring hipri QD1 mean (issue 6)",
        0.35,
        true,
        judge(1, &|r| Some(r.mean_us.median / u1?.mean_us.median), true),
    );
    push(
        "QD1 mean latency / raw floor QD1 mean (issue 6)",
        1.05,
        true,
        judge(1, &|r| Some(r.mean_us.median / f1?.mean_us.median), true),
    );
    push(
        "QD32 IOPS / kernel io_uring hipri QD32 IOPS (issue 6)",
        9.0,
        false,
        judge(32, &|r| Some(r.iops.median / u32_?.iops.median), false),
    );
    push(
        "QD1 p50 latency / raw floor QD1 p50 (issue 8)",
        0.5,
        true,
        judge(1, &|r| Some(r.p50_us.median / f1?.p50_us.median), true),
    );
    push(
        "QD1 MMIO doorbell writes per I/O (issue 8)",
        1.1,
        true,
        judge(1, &|r| r.mmio_per_io.map(|s| s.median), true),
    );
    push(
        "QD32 MMIO doorbell writes per I/O (issue 8)",
        0.1,
        true,
        judge(32, &|r| r.mmio_per_io.map(|s| s.median), true),
    );
    // Issue 18: IOPS non-decreasing in depth. The figure is the worst ratio of
    // a depth's IOPS to the best IOPS of any smaller depth (1.0 when every
    // step gains); "within noise" is taken as a 5% dip.
    let depths = series(rows, UPNVME_DEFAULT, BS_4K);
    if depths.len() >= 3 {
        let mut best = 0f64;
        let mut worst = f64::INFINITY;
        for &(_, iops) in &depths {
            if best > 0.0 {
                worst = worst.min(iops / best);
            }
            best = best.max(iops);
        }
        push(
            "upnvme IOPS non-decreasing in depth, 4 KiB: worst IOPS / best IOPS at a smaller depth (issue 18)",
            0.95,
            false,
            (Some(worst.min(1.0)), None),
        );
    }
    t
}

/// The row of `kind` at depth `qd` and I/O size `bs`, if it measured anything.
fn row_at(rows: &[Row], kind: Kind, qd: u32, bs: u32) -> Option<&Row> {
    rows.iter().find(|r| {
        r.contender.kind == kind && r.contender.qd == qd && r.contender.io_bytes == bs && r.ok > 0
    })
}

/// (queue depth, median IOPS) of `kind` at I/O size `bs`, by depth.
pub fn series(rows: &[Row], kind: Kind, bs: u32) -> Vec<(u32, f64)> {
    let mut v: Vec<(u32, f64)> = rows
        .iter()
        .filter(|r| r.contender.kind == kind && r.contender.io_bytes == bs && r.ok > 0)
        .map(|r| (r.contender.qd, r.iops.median))
        .collect();
    v.sort_by_key(|p| p.0);
    v
}

/// (I/O bytes, median IOPS) of `kind` at depth `qd`, by size.
pub fn size_series(rows: &[Row], kind: Kind, qd: u32) -> Vec<(u32, f64)> {
    let mut v: Vec<(u32, f64)> = rows
        .iter()
        .filter(|r| r.contender.kind == kind && r.contender.qd == qd && r.ok > 0)
        .map(|r| (r.contender.io_bytes, r.iops.median))
        .collect();
    v.sort_by_key(|p| p.0);
    v
}

fn fmt_stat(s: &Stat, digits: usize) -> String {
    if s.median.is_nan() {
        return "–".into();
    }
    format!("{:.d$} ({:.d$}–{:.d$})", s.median, s.min, s.max, d = digits)
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("–".into(), |r| format!("{r:.2}x"))
}

impl Summary {
    /// The results table (Markdown, readable as plain text).
    pub fn table(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "| contender | QD | I/O | mean µs | p50 µs | p99 µs | IOPS | doorbell MMIO/IO (SQ + CQ) | vs io_uring hipri | vs raw floor |"
        );
        let _ = writeln!(o, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in &self.rows {
            let runs = if r.ok == r.runs {
                String::new()
            } else {
                format!(" ({} of {} runs)", r.ok, r.runs)
            };
            let _ = writeln!(
                o,
                "| {}{runs} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.contender.label,
                r.contender.qd,
                r.contender.size_text(),
                fmt_stat(&r.mean_us, 1),
                fmt_stat(&r.p50_us, 1),
                fmt_stat(&r.p99_us, 1),
                fmt_stat(&r.iops, 0),
                r.sq_cq_mmio_per_io
                    .map_or("–".into(), |(sq, cq)| format!("{sq:.3} + {cq:.3}")),
                fmt_ratio(r.vs_io_uring),
                fmt_ratio(r.vs_floor),
            );
        }
        o
    }

    /// The depths at which upnvme's default configuration ran 4 KiB reads.
    pub fn depths(&self) -> Vec<u32> {
        series(&self.rows, UPNVME_DEFAULT, BS_4K)
            .into_iter()
            .map(|p| p.0)
            .collect()
    }

    /// The (size, depth) points at which upnvme's default configuration ran
    /// more than one size, by depth then size.
    pub fn sizes(&self) -> Vec<(u32, u32)> {
        let mut qds: Vec<u32> = self
            .rows
            .iter()
            .filter(|r| {
                r.contender.is_upnvme_default() && r.contender.io_bytes != BS_4K && r.ok > 0
            })
            .map(|r| r.contender.qd)
            .collect();
        qds.sort_unstable();
        qds.dedup();
        qds.into_iter()
            .flat_map(|qd| {
                size_series(&self.rows, UPNVME_DEFAULT, qd)
                    .into_iter()
                    .map(move |(bs, _)| (bs, qd))
            })
            .collect()
    }

    /// The sweep as two Markdown tables (IOPS against depth, IOPS and MiB/s
    /// against size); empty when the run had no sweep.
    pub fn sweep_text(&self) -> String {
        let uring = Kind::Fio(FioEngine::IoUringHipri);
        let row = |kind: Kind, qd: u32, bs: u32| row_at(&self.rows, kind, qd, bs);
        let iops = |r: Option<&Row>| r.map_or("–".into(), |r| fmt_stat(&r.iops, 0));
        let ratio = |a: Option<&Row>, b: Option<&Row>| {
            fmt_ratio(a.zip(b).map(|(a, b)| a.iops.median / b.iops.median))
        };
        let mut o = String::new();
        let depths = self.depths();
        if depths.len() >= 2 {
            o.push_str(
                "IOPS against queue depth, 4 KiB random reads (medians, min–max over rounds):\n\n",
            );
            o.push_str("| QD | upnvme | raw floor | kernel io_uring hipri | upnvme / raw floor | upnvme / io_uring |\n");
            o.push_str("|---:|---:|---:|---:|---:|---:|\n");
            for qd in depths {
                let (u, f, k) = (
                    row(UPNVME_DEFAULT, qd, BS_4K),
                    row(Kind::RawFloor, qd, BS_4K),
                    row(uring, qd, BS_4K),
                );
                let _ = writeln!(
                    o,
                    "| {qd} | {} | {} | {} | {} | {} |",
                    iops(u),
                    iops(f),
                    iops(k),
                    ratio(u, f),
                    ratio(u, k)
                );
            }
        }
        let sizes = self.sizes();
        if !sizes.is_empty() {
            let mib = |r: Option<&Row>, bs: u32| {
                r.map_or("–".into(), |r| {
                    format!(
                        "{:.0}",
                        r.iops.median * f64::from(bs) / f64::from(1u32 << 20)
                    )
                })
            };
            o.push_str("\nIOPS and MiB/s against I/O size, random reads (medians, min–max over rounds):\n\n");
            o.push_str("| I/O | QD | upnvme IOPS | upnvme MiB/s | io_uring hipri IOPS | io_uring MiB/s | upnvme / io_uring |\n");
            o.push_str("|---:|---:|---:|---:|---:|---:|---:|\n");
            for (bs, qd) in sizes {
                let (u, k) = (row(UPNVME_DEFAULT, qd, bs), row(uring, qd, bs));
                let _ = writeln!(
                    o,
                    "| {} KiB | {qd} | {} | {} | {} | {} | {} |",
                    bs / 1024,
                    iops(u),
                    mib(u, bs),
                    iops(k),
                    mib(k, bs),
                    ratio(u, k)
                );
            }
        }
        o
    }

    /// The targets as a Markdown list.
    pub fn targets_text(&self) -> String {
        let mut o = String::new();
        for t in &self.targets {
            let verdict = match t.met() {
                Some(true) => "**met**",
                Some(false) => "**not met**",
                None => "not measured",
            };
            let _ = write!(
                o,
                "- {}: target {} {}; upnvme (default) {} — {verdict}",
                t.name,
                if t.at_most { "≤" } else { "≥" },
                t.limit,
                t.measured.map_or("–".into(), |m| format!("{m:.3}")),
            );
            if let Some((label, v)) = &t.best {
                let _ = write!(o, "; best configuration: {label} {v:.3}");
            }
            o.push('\n');
        }
        o
    }

    /// The `--json` document.
    pub fn json(&self, meta: Value) -> Value {
        let spread = |s: &Stat| json!([finite(s.min), finite(s.max)]);
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "contender": r.contender.label,
                    "id": r.contender.id,
                    "qd": r.contender.qd,
                    "io_bytes": r.contender.io_bytes,
                    "runs": r.runs,
                    "ok_runs": r.ok,
                    "mean_us": finite(r.mean_us.median),
                    "p50_us": finite(r.p50_us.median),
                    "p99_us": finite(r.p99_us.median),
                    "iops": finite(r.iops.median),
                    "spread": {
                        "mean_us": spread(&r.mean_us),
                        "p50_us": spread(&r.p50_us),
                        "p99_us": spread(&r.p99_us),
                        "iops": spread(&r.iops),
                    },
                    "doorbell_mmio_per_io": r.mmio_per_io.map(|s| s.median),
                    "sq_doorbell_mmio_per_io": r.sq_cq_mmio_per_io.map(|m| m.0),
                    "cq_doorbell_mmio_per_io": r.sq_cq_mmio_per_io.map(|m| m.1),
                    "vs_kernel_io_uring_hipri": r.vs_io_uring,
                    "vs_raw_floor": r.vs_floor,
                })
            })
            .collect();
        let targets: Vec<Value> = self
            .targets
            .iter()
            .map(|t| {
                json!({
                    "target": t.name,
                    "limit": t.limit,
                    "at_most": t.at_most,
                    "measured": t.measured,
                    "met": t.met(),
                    "best": t.best.as_ref().map(|(l, v)| json!({"contender": l, "value": v})),
                })
            })
            .collect();
        let failures: Vec<Value> = self
            .failures
            .iter()
            .map(|(id, r, e)| json!({"id": id, "round": r, "error": e}))
            .collect();
        let uring = Kind::Fio(FioEngine::IoUringHipri);
        let at = |kind: Kind, qd: u32, bs: u32| {
            row_at(&self.rows, kind, qd, bs).map(|r| finite(r.iops.median))
        };
        let depth: Vec<Value> = self
            .depths()
            .into_iter()
            .map(|qd| {
                json!({
                    "qd": qd,
                    "io_bytes": BS_4K,
                    "upnvme_iops": at(UPNVME_DEFAULT, qd, BS_4K),
                    "raw_floor_iops": at(Kind::RawFloor, qd, BS_4K),
                    "io_uring_hipri_iops": at(uring, qd, BS_4K),
                })
            })
            .collect();
        let size: Vec<Value> = self
            .sizes()
            .into_iter()
            .map(|(bs, qd)| {
                json!({
                    "qd": qd,
                    "io_bytes": bs,
                    "upnvme_iops": at(UPNVME_DEFAULT, qd, bs),
                    "io_uring_hipri_iops": at(uring, qd, bs),
                })
            })
            .collect();
        json!({
            "meta": meta,
            "rows": rows,
            "sweep": {"depth": depth, "size": size},
            "targets": targets,
            "failed_runs": failures,
        })
    }
}

fn finite(v: f64) -> Value {
    if v.is_finite() { json!(v) } else { Value::Null }
}

/// The aggregated latency CDF of a contender over all its rounds, as
/// (latency µs, fraction of I/Os at or below) points: HDR histograms are
/// summed; fio's percentile points are medians over the rounds.
pub fn cdf(id: &str, runs: &[RunResult]) -> Vec<(f64, f64)> {
    let ms: Vec<&Metrics> = runs
        .iter()
        .filter(|r| r.id == id)
        .filter_map(|r| r.metrics.as_ref())
        .collect();
    let mut buckets: BTreeMap<u64, u64> = BTreeMap::new();
    let mut pcts: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for m in ms {
        match &m.cdf {
            Cdf::Histogram(h) => {
                for (v, c) in h {
                    // Keyed in nanoseconds (the histogram's unit).
                    *buckets.entry((v * 1000.0).round() as u64).or_default() += c;
                }
            }
            Cdf::Percentiles(p) => {
                for (q, v) in p {
                    pcts.entry((q * 1000.0).round() as u64)
                        .or_default()
                        .push(*v);
                }
            }
        }
    }
    if !buckets.is_empty() {
        let total: u64 = buckets.values().sum();
        let mut cum = 0u64;
        return buckets
            .into_iter()
            .map(|(ns, c)| {
                cum += c;
                (ns as f64 / 1000.0, cum as f64 / total.max(1) as f64)
            })
            .collect();
    }
    pcts.into_iter()
        .filter_map(|(q, vs)| Some((Stat::of(&vs)?.median, q as f64 / 100_000.0)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::contenders;

    fn metrics(mean: f64, iops: f64, mmio: Option<f64>) -> Metrics {
        Metrics {
            mean_us: mean,
            p50_us: mean * 0.8,
            p99_us: mean * 3.0,
            iops,
            errors: 0,
            sq_mmio_per_io: mmio,
            cq_mmio_per_io: mmio.map(|_| 0.0),
            cdf: Cdf::Histogram(vec![(mean, 10)]),
        }
    }

    fn run(id: &str, round: usize, m: Option<Metrics>) -> RunResult {
        RunResult {
            id: id.into(),
            round,
            status: if m.is_some() { 0 } else { 1 },
            error: m.is_none().then(|| "boom".into()),
            metrics: m,
        }
    }

    #[test]
    fn stats() {
        let s = Stat::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Stat::of(&[1.0, 4.0]).unwrap().median, 2.5);
        assert!(Stat::of(&[]).is_none());
    }

    #[test]
    fn rows_ratios_and_targets() {
        let all = contenders::Set::Options.contenders();
        let mut runs = Vec::new();
        for r in 1..=3 {
            let k = r as f64;
            runs.push(run(
                "upnvme-qd1",
                r,
                Some(metrics(20.0 + k, 40e3, Some(1.0))),
            ));
            runs.push(run("rawfloor-qd1", r, Some(metrics(30.0, 30e3, Some(2.0)))));
            runs.push(run(
                "fio-io_uring-hipri-qd1",
                r,
                Some(metrics(80.0, 12e3, None)),
            ));
            runs.push(run(
                "upnvme-qd32",
                r,
                Some(metrics(200.0, 150e3, Some(0.05))),
            ));
            runs.push(run(
                "upnvme-ros-qd32",
                r,
                Some(metrics(190.0, 160e3, Some(0.05))),
            ));
            runs.push(run(
                "fio-io_uring-hipri-qd32",
                r,
                Some(metrics(2000.0, 15e3, None)),
            ));
        }
        runs.push(run("fio-libaio-qd1", 1, None));
        let s = summarise(&all, &runs);
        let row = |id: &str| s.rows.iter().find(|r| r.contender.id == id).unwrap();
        let u = row("upnvme-qd1");
        assert_eq!((u.ok, u.mean_us.median, u.mean_us.min), (3, 22.0, 21.0));
        assert!((u.vs_io_uring.unwrap() - 22.0 / 80.0).abs() < 1e-9);
        assert!((u.vs_floor.unwrap() - 22.0 / 30.0).abs() < 1e-9);
        assert!((row("upnvme-qd32").vs_io_uring.unwrap() - 10.0).abs() < 1e-9);
        assert_eq!(row("fio-libaio-qd1").ok, 0);
        assert_eq!(s.failures.len(), 1);
        let t = &s.targets;
        assert_eq!(t[0].met(), Some(true)); // 0.275 <= 0.35
        assert_eq!(t[1].met(), Some(true)); // 0.73 <= 1.05
        assert_eq!(t[2].met(), Some(true)); // 10 >= 9
        let best = t[2].best.as_ref().unwrap();
        assert!(best.0.contains("reap_on_submit") && (best.1 - 160.0 / 15.0).abs() < 1e-9);
        assert_eq!(t[4].measured, Some(1.0));
        assert_eq!(t[5].met(), Some(true));
        let table = s.table();
        assert!(table.contains("| upnvme | 1 | 4 KiB | 22.0 (21.0–23.0) |"));
        assert!(table.contains("kernel libaio (0 of 1 runs)"));
        let j = s.json(json!({}));
        assert_eq!(j["rows"][0]["mean_us"], 22.0);
        assert_eq!(j["rows"][0]["spread"]["mean_us"], json!([21.0, 23.0]));
        assert!(s.targets_text().contains("**met**"));
    }

    #[test]
    fn sweep_tables_and_monotonic_target() {
        let all = contenders::Set::All.contenders();
        let mut runs = Vec::new();
        // upnvme dips at QD8 (90k after 100k at QD4).
        let up = [(1, 50e3), (2, 80e3), (4, 100e3), (8, 90e3), (16, 120e3)];
        for r in 1..=3 {
            for (qd, iops) in up {
                runs.push(run(
                    &format!("upnvme-qd{qd}"),
                    r,
                    Some(metrics(20.0, iops, Some(1.0))),
                ));
                runs.push(run(
                    &format!("fio-io_uring-hipri-qd{qd}"),
                    r,
                    Some(metrics(80.0, iops / 4.0, None)),
                ));
            }
            runs.push(run("rawfloor-qd2", r, Some(metrics(30.0, 40e3, Some(2.0)))));
            runs.push(run(
                "upnvme-128k-qd16",
                r,
                Some(metrics(200.0, 8192.0, Some(1.0))),
            ));
            runs.push(run(
                "fio-io_uring-hipri-128k-qd16",
                r,
                Some(metrics(400.0, 4096.0, None)),
            ));
        }
        let s = summarise(&all, &runs);
        assert_eq!(s.depths(), vec![1, 2, 4, 8, 16]);
        assert_eq!(s.sizes(), vec![(4096, 16), (131072, 16)]);
        let mono = s.targets.last().unwrap();
        assert!(mono.name.contains("non-decreasing"));
        assert!((mono.measured.unwrap() - 0.9).abs() < 1e-9);
        assert_eq!(mono.met(), Some(false));
        let row = |id: &str| s.rows.iter().find(|r| r.contender.id == id).unwrap();
        // QD > 1: IOPS ratios at the same depth and size.
        assert!((row("upnvme-qd2").vs_floor.unwrap() - 2.0).abs() < 1e-9);
        assert!((row("upnvme-128k-qd16").vs_io_uring.unwrap() - 2.0).abs() < 1e-9);
        let text = s.sweep_text();
        assert!(text.contains("| 8 | 90000 (90000–90000) | – |"), "{text}");
        assert!(
            text.contains("| 128 KiB | 16 | 8192 (8192–8192) | 1024 |"),
            "{text}"
        );
        let j = s.json(json!({}));
        assert_eq!(j["sweep"]["depth"][3]["qd"], 8);
        assert_eq!(j["sweep"]["depth"][3]["upnvme_iops"], 90e3);
        assert_eq!(j["sweep"]["size"][1]["io_bytes"], 131072);
        assert_eq!(j["sweep"]["size"][1]["io_uring_hipri_iops"], 4096.0);
        // The options set alone has no sweep and no monotonic target.
        let s = summarise(&contenders::Set::Options.contenders(), &runs);
        assert!(!s.targets.iter().any(|t| t.name.contains("non-decreasing")));
        assert!(s.sizes().is_empty());
    }

    #[test]
    fn cdfs() {
        let mut a = metrics(10.0, 1.0, None);
        a.cdf = Cdf::Histogram(vec![(10.0, 1), (20.0, 1)]);
        let mut b = a.clone();
        b.cdf = Cdf::Histogram(vec![(20.0, 2)]);
        let runs = vec![run("x", 1, Some(a)), run("x", 2, Some(b))];
        assert_eq!(cdf("x", &runs), vec![(10.0, 0.25), (20.0, 1.0)]);
        let mut f = metrics(10.0, 1.0, None);
        f.cdf = Cdf::Percentiles(vec![(50.0, 30.0), (99.0, 90.0)]);
        let runs = vec![run("f", 1, Some(f))];
        assert_eq!(cdf("f", &runs), vec![(30.0, 0.5), (90.0, 0.99)]);
    }
}
