//! `cargo xtask bench` and `cargo xtask cost`: upnvme side by side with the raw
//! floor and the kernel's polled path in one guest boot, and the driver's CPU
//! work per I/O on the host. See docs/benchmarks.md.
//!
//! The bench boots ONE guest (with `--kernel-nvme`: a vfio-bound controller for
//! upnvme and the raw floor, a kernel-nvme controller with poll queues for fio,
//! same backing configuration) and runs a generated script ([`contenders`])
//! that runs every contender once per round, rounds interleaved. The guest
//! sends each run's JSON, gzipped and base64-encoded between markers, on a
//! second serial port that QEMU writes to a host file; progress lines go to a
//! third serial port that QEMU writes to its stderr. The console stays silent,
//! so `--json` can print one clean document on stdout.

mod contenders;
mod cost;
mod docs;
pub(crate) mod fio;
mod plot;
mod png;
mod results;
mod summary;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

use crate::cli::{Size, VmArgs};
use crate::paths::Paths;
use crate::vm::Bed;

/// `cargo xtask bench`.
#[derive(Debug, Args)]
pub struct BenchCmd {
    /// Which contenders run: `options` (upnvme's doorbell and reaping options at QD 1, 4
    /// and 32 beside the raw floor and the kernel, 28 contenders, ~11 min at the defaults),
    /// `sweep` (upnvme's defaults, the raw floor and io_uring at QD 1-128 for 4 KiB reads,
    /// and 16/64/128 KiB at QD 1 and 16; 36 contenders, ~15 min) or `all` (both, 57
    /// contenders, ~23 min).
    #[arg(long, value_enum, default_value_t = contenders::Set::All)]
    pub set: contenders::Set,
    /// Interleaved rounds; each runs every contender once.
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(3..=100))]
    pub rounds: u32,
    /// Measured seconds per run (after a 1-second warm-up), the same for every contender.
    #[arg(long, value_name = "S", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub seconds: u64,
    /// Print one JSON document (rows with medians and spread, targets) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Do not write docs/benchmarks.md and its plots (docs/latency.png, docs/iops-depth.png,
    /// docs/iops-size.png).
    #[arg(long)]
    pub no_write_docs: bool,
    /// Use the guest binaries that are already built (target/guest) instead of building them.
    #[arg(long)]
    pub no_build: bool,
    /// Kill the guest after this many seconds (default: derived from rounds and seconds).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Show the QEMU command line and the guest kernel's boot log.
    #[arg(long, short)]
    pub verbose: bool,
    /// Summarise an earlier run's results file (target/xtask/bench/results.txt) instead
    /// of booting a guest.
    #[arg(long, value_name = "FILE", hide = true)]
    pub from_results: Option<PathBuf>,
}

/// `cargo xtask cost`.
#[derive(Debug, Args)]
pub struct CostCmd {
    /// I/Os in the smaller of the two runs (the other runs twice as many).
    #[arg(short = 'n', long = "ios", value_name = "N", default_value_t = 100_000)]
    pub n: u64,
    /// Do not write the result into docs/benchmarks.md.
    #[arg(long)]
    pub no_write_docs: bool,
    /// Print one JSON document `{"rows": [{"name": "read-4k", "instructions_per_io": N, ...}, ...]}`.
    #[arg(long)]
    pub json: bool,
    /// Measure only this row (read-4k, write-4k, read-64k or read-4k-qd32); docs are then not written.
    #[arg(long, value_name = "NAME")]
    pub row: Option<String>,
}

/// Guest memory: the hugepages, fio's ~90 MB of libraries (twice: archive and
/// unpacked) and room to spare.
const GUEST_MEM: u64 = 1536 << 20;

/// Facts about the host and the run, for the report.
fn host_meta(cmd: &BenchCmd, qemu: &str) -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, v)| v.trim())
        })
        .unwrap_or("unknown")
        .to_string();
    let cores = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let mut command = String::from("cargo xtask bench");
    for a in std::env::args().skip(2) {
        command.push(' ');
        command.push_str(&crate::cli::shell_quote(&a));
    }
    json!({
        "command": command,
        "date": docs::now_utc(),
        "host_cpu": model,
        "host_cores": cores,
        "load_before": loadavg(),
        "host_idle": host_idle(),
        "qemu": qemu,
        "rounds": cmd.rounds,
        "seconds": cmd.seconds,
        "set": cmd.set.name(),
        "warmup_seconds": contenders::WARMUP,
    })
}

/// The host's idle policy: the cpuidle driver and governor and, where the
/// haltpoll governor's module is loaded, its `guest_halt_poll_ns` (reported
/// whichever governor is active). It moved the raw floor's QD1 p50 under TCG
/// by about 40% and upnvme's not at all (docs/benchmarks.md, "Where the QD1
/// round trip goes").
fn host_idle() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let mut parts = Vec::new();
    if let Some(d) = read("/sys/devices/system/cpu/cpuidle/current_driver") {
        parts.push(format!("cpuidle driver {d}"));
    }
    if let Some(g) = read("/sys/devices/system/cpu/cpuidle/current_governor") {
        parts.push(format!("governor {g}"));
    }
    if let Some(ns) = read("/sys/module/haltpoll/parameters/guest_halt_poll_ns") {
        parts.push(format!("guest_halt_poll_ns {ns}"));
    }
    if parts.is_empty() {
        "no cpuidle information".into()
    } else {
        parts.join(", ")
    }
}

/// The host's 1/5/15-minute load averages.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Runs the guest, returns (results port text, meta, guest exit status, DMAR faults).
fn run_guest(
    cmd: &BenchCmd,
    dir: &Path,
    all: &[contenders::Contender],
) -> Result<(String, Value, i32, u32)> {
    let results = dir.join("results.txt");
    let script = dir.join("bench.sh");
    for p in [&results, &script] {
        if p.to_string_lossy().contains(',') {
            bail!(
                "{} contains a comma, which QEMU's -serial file: cannot take; set CARGO_TARGET_DIR elsewhere",
                p.display()
            );
        }
    }
    let fio_files = fio::stage()?;
    std::fs::write(
        &script,
        contenders::guest_script(all, cmd.rounds as usize, cmd.seconds),
    )
    .with_context(|| format!("writing {}", script.display()))?;
    let _ = std::fs::remove_file(&results);
    let bed = Bed::prepare(cmd.no_build)?;
    let mut meta = host_meta(cmd, &bed.caps().version);

    let runs = all.len() as u64 * u64::from(cmd.rounds);
    let per_run = cmd.seconds + contenders::WARMUP + 10;
    let mut vm = VmArgs {
        kernel_nvme: true,
        mem: Size(GUEST_MEM),
        no_build: true,
        verbose: cmd.verbose,
        timeout: cmd.timeout.unwrap_or(300 + runs * per_run),
        ..VmArgs::default()
    };
    vm.put = fio_files.iter().map(fio::GuestFile::put_spec).collect();
    vm.put.push(format!("{}:/root/bench.sh", script.display()));
    vm.qemu_arg = vec![
        "-serial".into(),
        format!("file:{}", results.display()),
        "-serial".into(),
        "file:/dev/stderr".into(),
    ];
    eprintln!(
        "xtask: bench: {} rounds x {} contenders x {} s (+{} s warm-up) in one guest; progress below, \
         results in {}",
        cmd.rounds,
        all.len(),
        cmd.seconds,
        contenders::WARMUP,
        results.display()
    );
    let outcome = bed.run(&vm, "sh /root/bench.sh", false)?;
    meta["load_after"] = json!(loadavg());
    meta["guest_seconds"] = json!(outcome.elapsed.as_secs_f64().round() as u64);
    let text = std::fs::read_to_string(&results)
        .with_context(|| format!("reading {}", results.display()))?;
    std::fs::write(dir.join("meta.json"), serde_json::to_string_pretty(&meta)?)?;
    Ok((text, meta, outcome.status, outcome.dmar_faults))
}

/// `cargo xtask bench`.
pub fn bench(cmd: &BenchCmd) -> Result<i32> {
    let started = Instant::now();
    let paths = Paths::discover();
    let dir = paths.cache.join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (text, mut meta, status, dmar, all) = match &cmd.from_results {
        Some(f) => {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            let meta = f
                .parent()
                .map(|d| d.join("meta.json"))
                .and_then(|m| std::fs::read_to_string(m).ok())
                .and_then(|m| serde_json::from_str(&m).ok())
                .unwrap_or_else(|| host_meta(cmd, "unknown"));
            // The run's own set; runs before `--set` existed ran the options set.
            let set = meta["set"]
                .as_str()
                .map_or(Some(contenders::Set::Options), contenders::Set::from_name)
                .unwrap_or(cmd.set);
            (text, meta, 0, 0, set.contenders())
        }
        None => {
            let all = cmd.set.contenders();
            let (text, meta, status, dmar) = run_guest(cmd, &dir, &all)?;
            (text, meta, status, dmar, all)
        }
    };
    // The run's own parameters (they differ from the flags' defaults with --from-results).
    let rounds = meta["rounds"].as_u64().unwrap_or(u64::from(cmd.rounds));
    let seconds = meta["seconds"].as_u64().unwrap_or(cmd.seconds);
    let collected = results::parse_port(&text, &all);
    let summary = summary::summarise(&all, &collected.runs);
    let wall = started.elapsed().as_secs_f64();
    if cmd.from_results.is_none() {
        meta["wall_seconds"] = json!(wall.round() as u64);
        let _ = std::fs::write(dir.join("meta.json"), serde_json::to_string_pretty(&meta)?);
    }
    meta["guest"] = json!(collected.info);

    if cmd.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&summary.json(meta.clone()))?
        );
    } else {
        println!(
            "\nMedians over {} rounds (min–max over rounds), random reads, {} s per run:\n",
            rounds, seconds
        );
        print!("{}", summary.table());
        let sweep = summary.sweep_text();
        if !sweep.is_empty() {
            println!();
            print!("{sweep}");
        }
        println!("\nTargets (upnvme in its default configuration):\n");
        print!("{}", summary.targets_text());
    }
    for (id, round, why) in &summary.failures {
        eprintln!("xtask: bench: {id} round {round} failed: {why}");
    }

    // A run with IOMMU faults or missing results must not replace the
    // committed figures.
    let expected = all.len() * rounds as usize;
    let measured: usize = summary.rows.iter().map(|r| r.ok).sum();
    let sound = dmar == 0 && status == 0 && measured >= expected;
    if !cmd.no_write_docs && !sound {
        eprintln!(
            "xtask: bench: docs/benchmarks.md and the plots are left as they were (see below)"
        );
    }
    if !cmd.no_write_docs && sound {
        let md = paths.root.join("docs/benchmarks.md");
        let png = paths.root.join("docs/latency.png");
        let lines: Vec<plot::Line> = all
            .iter()
            .filter(|c| c.qd == 1 && c.io_bytes == contenders::BS_4K)
            .map(|c| plot::Line {
                label: c.label.clone(),
                points: summary::cdf(&c.id, &collected.runs),
            })
            .collect();
        let title = format!(
            "4 KiB random reads at QD1: latency CDF ({} rounds x {} s, QEMU TCG guest)",
            rounds, seconds
        );
        match plot::latency_cdf(&lines, &title, &png) {
            Ok(()) => eprintln!("xtask: wrote {}", png.display()),
            Err(e) => eprintln!("xtask: warning: no latency plot: {e:#}"),
        }
        for (name, result) in sweep_plots(&summary, &paths.root.join("docs"), (rounds, seconds)) {
            match result {
                Ok(p) => eprintln!("xtask: wrote {}", p.display()),
                Err(e) => eprintln!("xtask: warning: no {name} plot: {e:#}"),
            }
        }
        docs::write_block(
            &md,
            docs::BENCH_BLOCK,
            &bench_markdown(&summary, &meta, (rounds, seconds)),
        )?;
        eprintln!("xtask: wrote {}", md.display());
    }
    eprintln!("xtask: bench finished in {wall:.0} s");
    if dmar > 0 {
        eprintln!("xtask: error: the guest kernel logged {dmar} IOMMU (DMAR) fault(s)");
        return Ok(1);
    }
    if status != 0 || measured < expected {
        eprintln!(
            "xtask: error: {measured} of {expected} runs produced results (guest script status {status})"
        );
        return Ok(1);
    }
    Ok(0)
}

/// docs/iops-depth.png and docs/iops-size.png, when the run had a sweep:
/// (plot name, path written or why not).
fn sweep_plots(
    s: &summary::Summary,
    docs: &Path,
    (rounds, seconds): (u64, u64),
) -> Vec<(&'static str, Result<PathBuf>)> {
    use contenders::{BS_4K, FioEngine, Kind, UPNVME_DEFAULT};
    let uring = Kind::Fio(FioEngine::IoUringHipri);
    let pts = |v: Vec<(u32, f64)>| v.into_iter().map(|(x, y)| (f64::from(x), y)).collect();
    let mut out = Vec::new();
    if s.depths().len() >= 2 {
        let lines = [
            ("upnvme", UPNVME_DEFAULT),
            ("raw floor", Kind::RawFloor),
            ("kernel io_uring hipri", uring),
        ]
        .map(|(label, kind)| plot::Line {
            label: label.into(),
            points: pts(summary::series(&s.rows, kind, BS_4K)),
        });
        let path = docs.join("iops-depth.png");
        let title = format!(
            "4 KiB random reads: IOPS against queue depth ({rounds} rounds x {seconds} s, QEMU TCG guest)"
        );
        let r = plot::iops(
            &lines,
            &title,
            "queue depth (log scale)",
            &|v| format!("{v:.0}"),
            plot::Legend::UpperLeft,
            &path,
        );
        out.push(("depth", r.map(|()| path)));
    }
    let mut qds: Vec<u32> = s.sizes().into_iter().map(|p| p.1).collect();
    qds.dedup();
    if !qds.is_empty() {
        let mut lines = Vec::new();
        for qd in qds {
            for (label, kind) in [("upnvme", UPNVME_DEFAULT), ("kernel io_uring hipri", uring)] {
                lines.push(plot::Line {
                    label: format!("{label} QD{qd}"),
                    points: pts(summary::size_series(&s.rows, kind, qd)),
                });
            }
        }
        let path = docs.join("iops-size.png");
        let title = format!(
            "Random reads: IOPS against I/O size ({rounds} rounds x {seconds} s, QEMU TCG guest)"
        );
        let r = plot::iops(
            &lines,
            &title,
            "I/O size (KiB, log scale)",
            &|v| format!("{:.0}", v / 1024.0),
            plot::Legend::UpperRight,
            &path,
        );
        out.push(("size", r.map(|()| path)));
    }
    out
}

/// The generated part of docs/benchmarks.md.
fn bench_markdown(s: &summary::Summary, meta: &Value, (rounds, seconds): (u64, u64)) -> String {
    let m = |k: &str| match &meta[k] {
        Value::String(v) => v.clone(),
        Value::Null => "?".into(),
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => {
            format!("{:.0}", n.as_f64().unwrap_or_default())
        }
        v => v.to_string(),
    };
    let g = |k: &str| meta["guest"][k].as_str().unwrap_or("?").to_string();
    let mut o = format!(
        "Latest run: `{command}` (set `{set}`) on {date}, {wall} s wall time ({guest_s} s in the guest).\n\n\
         - Host: {cpu}, {cores} cores; load average {load0} before, {load1} after; idle: {idle}.\n\
         - QEMU {qemu} (TCG), 2 vCPUs; guest Linux {kernel}; {fio}.\n\
         - One vfio-bound controller (upnvme, raw floor) and one controller left to the \
           kernel's nvme driver with poll_queues={pq} (`{kdev}`, io_poll={io_poll}); each has one \
           256 MiB namespace of 4096-byte blocks on a sparse file, `cache=unsafe,aio=io_uring`.\n\
         - {rounds} interleaved rounds (each runs every contender once, in an order rotated per \
           round) x {secs} s measured after a {warm} s warm-up; every program is pinned to vCPU 0; \
           upnvme and the raw floor time I/O with the TSC, fio with `--clocksource=cpu`.\n\
         - Latency is the full round trip (upnvme: submit to reap; fio: `lat_ns`, submission \
           to completion). Figures are medians over the rounds, (min–max) across rounds; ratios \
           are of medians against kernel io_uring hipri and the raw floor at the same depth and \
           I/O size, where those ran: at QD1 of mean latency (lower is better), deeper of IOPS \
           (higher is better). Doorbell MMIO/IO \
           counts SQ tail plus CQ head MMIO writes.\n\n",
        command = m("command"),
        set = meta["set"].as_str().unwrap_or("options"),
        date = m("date"),
        wall = m("wall_seconds"),
        guest_s = m("guest_seconds"),
        cpu = m("host_cpu"),
        cores = m("host_cores"),
        load0 = m("load_before"),
        load1 = m("load_after"),
        idle = m("host_idle"),
        qemu = m("qemu"),
        kernel = g("kernel"),
        fio = g("fio"),
        pq = g("poll_queues"),
        kdev = g("kernel_device"),
        io_poll = g("io_poll"),
        rounds = rounds,
        secs = seconds,
        warm = contenders::WARMUP,
    );
    o.push_str(&s.table());
    let sweep = s.sweep_text();
    if !sweep.is_empty() {
        o.push('\n');
        o.push_str(&sweep);
        if !s.depths().is_empty() {
            o.push_str("\n![IOPS against queue depth](iops-depth.png)\n");
        }
        if !s.sizes().is_empty() {
            o.push_str("\n![IOPS against I/O size](iops-size.png)\n");
        }
    }
    o.push_str("\nTargets, judged on upnvme in its default configuration (reap_on_submit off, MMIO doorbells only, adaptive CQ head):\n\n");
    o.push_str(&s.targets_text());
    if !s.failures.is_empty() {
        o.push_str("\nFailed runs:\n\n");
        for (id, round, why) in &s.failures {
            o.push_str(&format!("- {id}, round {round}: {why}\n"));
        }
    }
    o.push_str("\n![Latency CDF of the QD1 contenders](latency.png)\n");
    o
}

/// `cargo xtask cost`.
pub fn cost(cmd: &CostCmd) -> Result<i32> {
    let mut rows = Vec::new();
    for (name, _) in cost::ROWS {
        if cmd.row.as_deref().is_some_and(|r| r != name) {
            continue;
        }
        rows.push(cost::measure(cmd.n, name)?);
    }
    if rows.is_empty() {
        anyhow::bail!(
            "no cost row named {:?}: the rows are {}",
            cmd.row,
            cost::ROWS.map(|(n, _)| n).join(", ")
        );
    }
    if cmd.json {
        let doc = serde_json::json!({ "rows": rows.iter().map(|r| r.json()).collect::<Vec<_>>() });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for c in &rows {
            println!(
                "{}: {:.1} instructions per I/O (submit + reap, model excluded; ({} - {}) / {}){}",
                c.name,
                c.per_io,
                c.totals.1,
                c.totals.0,
                c.n,
                match (c.target(), c.met()) {
                    (Some(t), Some(true)) => format!("; target <= {t:.0}: met"),
                    (Some(t), _) => format!("; target <= {t:.0}: not met"),
                    (None, _) => String::new(),
                }
            );
            if let Some(h) = c.harness_per_io {
                println!(
                    "  of which the harness's own lines (tests/examples/io_cost.rs): {h:.1}; driver: {:.1}",
                    c.per_io - h
                );
            }
        }
        if let Some(c) = rows.first() {
            println!("where the {} instructions go:", c.name);
            for t in &c.top {
                println!("{:>10.1}  {}", t.per_io, t.name);
            }
        }
    }
    if !cmd.no_write_docs && cmd.row.is_none() {
        let md = Paths::discover().root.join("docs/benchmarks.md");
        docs::write_block(
            &md,
            docs::COST_BLOCK,
            &cost::markdown(&rows, &docs::now_utc()),
        )?;
        eprintln!("xtask: wrote {}", md.display());
    }
    Ok(0)
}
