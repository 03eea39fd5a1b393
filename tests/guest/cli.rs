//! Guest tests of the `upnvme` tool: read/write byte-exact, perf output (text
//! and JSON), identify/smart-log JSON, and bad input answered with exit
//! status 2 before any I/O.

use std::process::{Command, Output};

fn upnvme(args: &[&str]) -> Output {
    Command::new("upnvme")
        .args(args)
        .output()
        .expect("upnvme is on the guest's PATH (cargo xtask vm puts it there)")
}

fn device() -> String {
    std::env::var("UPNVME_VM_DEVICES")
        .expect("run inside cargo xtask vm")
        .split_whitespace()
        .next()
        .expect("a device")
        .to_string()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).to_string()
}

#[test]
fn write_then_read_is_byte_exact() {
    let dev = device();
    let lba: usize = std::env::var("UPNVME_VM_LBA_SIZE")
        .unwrap()
        .parse()
        .unwrap();
    let blocks = 300usize; // more than one MDTS-sized chunk at 512-byte blocks
    let data: Vec<u8> = (0..blocks * lba)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    std::fs::write("/tmp/in.bin", &data).unwrap();
    let count = blocks.to_string();
    ok(&upnvme(&[
        "write",
        "-d",
        &dev,
        "-s",
        "33",
        "-c",
        &count,
        "--data",
        "/tmp/in.bin",
    ]));
    ok(&upnvme(&[
        "read",
        "-d",
        &dev,
        "-s",
        "33",
        "-c",
        &count,
        "--data",
        "/tmp/out.bin",
    ]));
    assert!(std::fs::read("/tmp/out.bin").unwrap() == data);
    // Short input is an error, not silent padding.
    std::fs::write("/tmp/short.bin", &data[..lba + 1]).unwrap();
    let o = upnvme(&[
        "write",
        "-d",
        &dev,
        "-s",
        "33",
        "-c",
        "2",
        "--data",
        "/tmp/short.bin",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("input ended"));
}

#[test]
fn perf_reports_rows_and_json() {
    let dev = device();
    let out = ok(&upnvme(&[
        "perf",
        "-d",
        &dev,
        "-q",
        "4",
        "-t",
        "1",
        "--warmup",
        "0",
        "-L",
        "--transport-stats",
    ]));
    assert!(out.contains("Total"), "{out}");
    assert!(out.contains("NSID 1 from core  0"), "{out}");
    assert!(out.contains("99.90000%"), "{out}");
    assert!(out.contains("sq_mmio"), "{out}");
    let out = ok(&upnvme(&[
        "perf",
        "-d",
        &dev,
        "-q",
        "2",
        "--io-count",
        "500",
        "--warmup",
        "0",
        "--json",
    ]));
    let v: serde_json::Value =
        serde_json::from_str(&out).expect("perf --json prints one JSON document");
    // With --io-count every I/O is counted: each job does exactly 500.
    let jobs = v["jobs"].as_array().unwrap();
    for j in jobs {
        assert_eq!(j["ios"], 500, "{j}");
    }
    assert!(
        v["total"]["latency"]["percentiles_us"]["p50"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(v["total"]["transport"]["completions"].as_u64().unwrap() >= 500);
}

#[test]
fn perf_verify_counts_no_mismatch() {
    let dev = device();
    let out = ok(&upnvme(&[
        "perf",
        "-d",
        &dev,
        "-w",
        "randwrite",
        "-q",
        "8",
        "--io-count",
        "2000",
        "--warmup",
        "0",
        "--verify",
        "-n",
        "1",
    ]));
    assert!(out.contains(" 0 mismatches"), "{out}");
}

#[test]
fn perf_bad_input_exits_2_before_io() {
    let dev = device();
    for args in [
        vec!["perf", "-d", &dev, "-q", "0"],
        vec!["perf", "-d", &dev, "-w", "sideways"],
        vec!["perf", "-d", &dev, "-o", "1000"],
        vec!["perf", "-d", &dev, "-o", "16777216"],
        vec!["perf", "-d", &dev, "-c", "9"],
        vec!["perf", "-d", &dev, "-n", "77"],
        vec!["perf", "-d", &dev, "-q", "5000"],
        vec!["perf", "-d", &dev, "--queue-entries", "1"],
        vec!["perf", "-d", &dev, "-w", "randread", "--verify"],
    ] {
        let o = upnvme(&args);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.trim().is_empty(), "{args:?} printed why");
    }
}

#[test]
fn identify_and_smart_log_json() {
    let dev = device();
    let v: serde_json::Value =
        serde_json::from_str(&ok(&upnvme(&["identify", "-d", &dev, "--json"]))).unwrap();
    assert_eq!(v["controller"]["mn"], "QEMU NVMe Ctrl");
    assert!(!v["namespaces"].as_array().unwrap().is_empty());
    let v: serde_json::Value =
        serde_json::from_str(&ok(&upnvme(&["smart-log", "-d", &dev, "--json"]))).unwrap();
    assert!(v["temperature_kelvin"].as_u64().unwrap() > 200);
    let out = ok(&upnvme(&["list"]));
    assert!(out.contains(&dev) && out.contains("vfio-pci"), "{out}");
}
