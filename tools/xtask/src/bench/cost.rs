//! `cargo xtask cost`: the driver's own CPU work per 4 KiB I/O (submit + reap),
//! counted in instructions with callgrind against the in-memory controller model,
//! excluding the model's own work. Deterministic: no guest, no timing.
//!
//! The program is `tests/examples/io_cost.rs`. Callgrind collects only inside its
//! `one_io` function (one submit + reap) and outside its `Meter` device wrapper
//! (the model behind never-inlined register accessors): `--toggle-collect`
//! flips collection on entry to and exit from each. Runs of `N` and `2N` I/Os
//! are subtracted and divided by `N`, which leaves exactly the per-I/O cost.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::{deps, paths::Paths, proc};

/// The callgrind options that separate the driver's work from the model's.
pub const TOGGLES: [&str; 2] = ["--toggle-collect=*one_io*", "--toggle-collect=*Meter*"];
/// The rows `cargo xtask cost` measures: (name, target in instructions per
/// I/O). Issue 14: `read-4k` at most 150, `write-4k` within 10% of it,
/// `read-64k` (PRP1 and a PRP List) at most 250. `read-4k-qd32` (the
/// callback resubmitting at depth 32, the resubmissions announced once per
/// reap) has no target: it watches the depth path, which the QD1 rows never
/// take (a completion reaped while commands wait for their doorbell).
pub const ROWS: [(&str, Option<f64>); 4] = [
    ("read-4k", Some(150.0)),
    ("write-4k", Some(165.0)),
    ("read-64k", Some(250.0)),
    ("read-4k-qd32", None),
];

/// The row that keeps commands in flight, and its depth (tests/examples/io_cost.rs).
const DEPTH_ROW: &str = "read-4k-qd32";
const DEPTH_ROW_QD: u64 = 32;

/// The target of `row` (instructions per I/O), if it has one.
pub fn target(row: &str) -> Option<f64> {
    ROWS.iter().find(|(n, _)| *n == row).and_then(|(_, t)| *t)
}

/// One function's share of the per-I/O cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    /// Instructions per I/O (self cost).
    pub per_io: f64,
    /// `file:function` as callgrind_annotate names it.
    pub name: String,
}

/// The measurement of one row.
#[derive(Debug, Clone)]
pub struct Cost {
    /// The workload (`read-4k`, `write-4k`, `read-64k`).
    pub name: String,
    /// I/Os in the smaller run.
    pub n: u64,
    /// Instructions collected in the runs of `n` and `2n` I/Os.
    pub totals: (u64, u64),
    /// Instructions per I/O: (totals.1 - totals.0) / n.
    pub per_io: f64,
    /// Of those, the instructions of the harness's own lines (io_cost.rs: the loop,
    /// the completion callback, its checks), `None` without callgrind_annotate.
    pub harness_per_io: Option<f64>,
    /// Where they go (self cost per I/O, from the difference of the two runs,
    /// biggest first).
    pub top: Vec<Share>,
    /// The commands, for the record.
    pub commands: Vec<String>,
}

/// Builds the example, runs it under callgrind for `n` and `2n` I/Os of
/// `workload`.
pub fn measure(n: u64, workload: &str) -> Result<Cost> {
    if n < 1000 {
        bail!("-n must be at least 1000");
    }
    // The depth row's fixed parts (the primed round, the last partial round
    // and the drain) are the same in the runs of n and 2n I/Os only when n
    // is a whole number of rounds.
    let n = if workload == DEPTH_ROW {
        n.div_ceil(DEPTH_ROW_QD) * DEPTH_ROW_QD
    } else {
        n
    };
    let valgrind = match deps::find_program("valgrind") {
        Some(v) => v,
        None => {
            deps::apt_install(&["valgrind"])?;
            deps::find_program("valgrind").context("valgrind is missing after installing it")?
        }
    };
    let paths = Paths::discover();
    eprintln!("xtask: building tests/examples/io_cost.rs (release)");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let build = [
        "build",
        "--release",
        "-p",
        "upnvme-tests",
        "--example",
        "io_cost",
    ];
    proc::run_inherited(
        Command::new(&cargo).args(build).current_dir(&paths.root),
        crate::guest_build::BUILD_TIMEOUT,
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|t| !t.is_empty())
        .map_or_else(|| paths.root.join("target"), PathBuf::from);
    let exe = target.join("release/examples/io_cost");
    let dir = paths.cache.join("cost");
    std::fs::create_dir_all(&dir)?;
    let mut commands = vec![format!("cargo {}", build.join(" "))];
    let mut totals = Vec::new();
    let mut lists = Vec::new();
    for count in [n, 2 * n] {
        let out = dir.join(format!("callgrind.{workload}.{count}.out"));
        let mut cmd = Command::new(&valgrind);
        cmd.arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .args(TOGGLES)
            .arg(&exe)
            .arg(count.to_string())
            .arg(workload);
        commands.push(proc::describe(&cmd));
        eprintln!("xtask: {}", proc::describe(&cmd));
        proc::run_checked(&mut cmd, Duration::from_secs(60 * 60))?;
        let text =
            std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
        totals.push(
            callgrind_total(&text)
                .with_context(|| format!("no totals line in {}", out.display()))?,
        );
        let mut annotate = Command::new("callgrind_annotate");
        annotate.arg("--threshold=100").arg(&out);
        match proc::run_checked(&mut annotate, Duration::from_secs(300)) {
            Ok(o) => lists.push(functions(&String::from_utf8_lossy(&o.stdout))),
            Err(e) => eprintln!("xtask: warning: callgrind_annotate failed: {e:#}"),
        }
    }
    // Paths relative to the workspace and the toolchain's library, for the report.
    let root = format!("{}/", paths.root.display());
    let commands = commands.iter().map(|c| c.replace(&root, "")).collect();
    let (t1, t2) = (totals[0], totals[1]);
    let per_io = t2.saturating_sub(t1) as f64 / n as f64;
    let (top, harness_per_io) = match &lists[..] {
        [small, large] => {
            let mut diff: Vec<Share> = large
                .iter()
                .map(|(name, ir)| {
                    let before = small.iter().find(|(m, _)| m == name).map_or(0, |(_, v)| *v);
                    Share {
                        per_io: (*ir as f64 - before as f64) / n as f64,
                        name: short_name(name),
                    }
                })
                .collect();
            diff.sort_by(|a, b| b.per_io.total_cmp(&a.per_io));
            let harness = diff
                .iter()
                .filter(|s| s.name.contains(HARNESS_FILE))
                .map(|s| s.per_io)
                .sum();
            diff.truncate(15);
            (diff, Some(harness))
        }
        _ => (Vec::new(), None),
    };
    Ok(Cost {
        name: workload.to_string(),
        n,
        totals: (t1, t2),
        per_io,
        harness_per_io,
        top,
        commands,
    })
}

/// `name` with `/rustc/<commit>/library/` shortened to `std:`.
fn short_name(name: &str) -> String {
    match (name.find("/rustc/"), name.find("/library/")) {
        (Some(a), Some(b)) if a < b => {
            format!("{}std:{}", &name[..a], &name[b + "/library/".len()..])
        }
        _ => name.to_string(),
    }
}

/// The harness's source file, as callgrind_annotate names it.
const HARNESS_FILE: &str = "examples/io_cost.rs:";

/// The `totals:` (or `summary:`) line of a callgrind output file.
pub fn callgrind_total(text: &str) -> Option<u64> {
    text.lines()
        .rev()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Every `Ir file:function` entry of callgrind_annotate's function list (self cost).
pub fn functions(annotate: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut in_list = false;
    for line in annotate.lines() {
        if line.contains("file:function") {
            in_list = true;
            continue;
        }
        if !in_list || line.starts_with("---") {
            continue;
        }
        let t = line.trim();
        if t.is_empty() {
            if !out.is_empty() {
                break;
            }
            continue;
        }
        let Some((num, rest)) = t.split_once(' ') else {
            continue;
        };
        let Ok(ir) = num.replace(',', "").parse::<u64>() else {
            continue;
        };
        // "(12.34%)  file:function [object]"
        let name = rest
            .trim()
            .split_once(')')
            .map_or(rest, |(_, n)| n)
            .trim()
            .split(" [")
            .next()
            .unwrap_or_default()
            .to_string();
        out.push((name, ir));
    }
    out
}

impl Cost {
    /// The row's target (instructions per I/O), if it has one.
    pub fn target(&self) -> Option<f64> {
        target(&self.name)
    }

    /// Whether the row meets its target (`None` without one).
    pub fn met(&self) -> Option<bool> {
        self.target().map(|t| self.per_io <= t)
    }

    /// The row as JSON for `cargo xtask cost --json`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "instructions_per_io": (self.per_io * 10.0).round() / 10.0,
            "harness_per_io": self.harness_per_io,
            "target": self.target(),
            "met": self.met(),
            "ios": self.n,
            "totals": [self.totals.0, self.totals.1],
            "top": self.top.iter().map(|t| serde_json::json!({"name": t.name, "instructions_per_io": t.per_io})).collect::<Vec<_>>(),
        })
    }
}

/// The Markdown block for docs/benchmarks.md: one table row per workload,
/// then where the `read-4k` instructions go.
pub fn markdown(rows: &[Cost], date: &str) -> String {
    let mut s = format!(
        "Measured {date} with `cargo xtask cost -n {n}` (instructions per I/O, submit + reap, \
         the model excluded, the harness's own lines included):\n\n\
         | workload | instructions/IO | of which harness | target | met |\n|---|---:|---:|---:|---|\n",
        n = rows.first().map_or(0, |r| r.n)
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {:.0} | {} | {} | {} |\n",
            r.name,
            r.per_io,
            r.harness_per_io.map_or("–".into(), |h| format!("{h:.0}")),
            r.target().map_or("–".into(), |t| format!("≤ {t:.0}")),
            match r.met() {
                Some(true) => "**met**",
                Some(false) => "**not met**",
                None => "–",
            }
        ));
    }
    if let Some(r) = rows.first() {
        s.push_str(&format!(
            "\n({t2} − {t1}) instructions / {n} I/Os for `{name}`. The program is \
             tests/examples/io_cost.rs (release build, shadow doorbells off so every doorbell \
             reaches the model at once, default queue pair options); callgrind collects only \
             inside `one_io` (one submit + reap; for `read-4k-qd32`, `one_io_round`: one reap and \
             the callback's resubmissions) and outside the `Meter` device wrapper around \
             the model. The commands:\n\n```sh\n{cmds}\n```\n",
            t1 = r.totals.0,
            t2 = r.totals.1,
            n = r.n,
            name = r.name,
            cmds = r.commands.join("\n"),
        ));
        if !r.top.is_empty() {
            s.push_str(&format!(
                "\nWhere the `{}` instructions go (self cost per I/O, difference of the two runs' \
                 `callgrind_annotate` lists: the source file of the instructions and the \
                 function they were compiled into, inlined code included):\n\n\
                 | instructions/IO | file:function |\n|---:|---|\n",
                r.name
            ));
            for t in &r.top {
                s.push_str(&format!("| {:.1} | `{}` |\n", t.per_io, t.name));
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_line() {
        assert_eq!(
            callgrind_total("events: Ir\nsummary: 123\ntotals: 123\n"),
            Some(123)
        );
        assert_eq!(callgrind_total("events: Ir\n"), None);
    }

    #[test]
    fn annotate_list() {
        let text = "--------\nIr                   file:function\n--------\n\
                    17,774,236 (24.13%)  /w/driver/src/qpair/mod.rs:io_cost::one_io\n\
                     5,353,000 ( 7.27%)  /w/tests/examples/io_cost.rs:io_cost::one_io [/w/io_cost]\n\
                    \n-- Auto-annotated source: x\n";
        let f = functions(text);
        assert_eq!(
            f,
            [
                (
                    "/w/driver/src/qpair/mod.rs:io_cost::one_io".to_string(),
                    17_774_236
                ),
                (
                    "/w/tests/examples/io_cost.rs:io_cost::one_io".to_string(),
                    5_353_000
                ),
            ]
        );
        assert!(f[1].0.contains(HARNESS_FILE));
        assert_eq!(
            short_name("/rustc/59807616e1fa/library/core/src/ptr/mod.rs:f"),
            "std:core/src/ptr/mod.rs:f"
        );
    }
}
