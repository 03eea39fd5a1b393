//! Media errors injected under namespace 1 (`cargo xtask vm --inject-read-error
//! LBA,...`, QEMU's blkdebug; the `media-errors` configuration of `cargo xtask
//! test`): reads of those blocks complete with Unrecovered Read Error (SCT 2h,
//! SC 81h). `upnvme read` names it; `upnvme perf` stops at the first failed
//! I/O and exits 1, or with `--continue-on-error` runs on and counts them by
//! status; other blocks still read back what was written.
//!
//! Every test here returns at once when no error is injected
//! (`UPNVME_VM_NS1_READ_ERRORS` empty).

use std::time::Duration;

use upnvme::{Controller, ControllerOptions, IoError, QueuePairOptions};

use crate::vm::{device, upnvme};

fn error_lbas() -> Vec<u64> {
    let v: Vec<u64> = std::env::var("UPNVME_VM_NS1_READ_ERRORS")
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("LBAs in UPNVME_VM_NS1_READ_ERRORS"))
        .collect();
    if v.is_empty() {
        eprintln!("no read errors injected in this guest: nothing to check here");
    }
    v
}

#[test]
fn media_error_reads_fail_with_their_status_and_others_verify() {
    let lbas = error_lbas();
    let Some(&bad) = lbas.first() else { return };
    let c = Controller::open(&device(), ControllerOptions::default()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let len = ns.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let t = Duration::from_secs(10);
    let f = qp
        .read_blocking(&ns, bad, 1, c.alloc_dma(len).unwrap(), t)
        .unwrap_err();
    let text = f.error.to_string();
    assert!(
        text.contains("Unrecovered Read Error (sct 0x2, sc 0x81)"),
        "{text}"
    );
    assert!(f.buffer.is_some(), "the buffer comes back with the error");
    // A good block next to it: written and read back byte for byte.
    let good = (0..ns.lba_count()).find(|l| !lbas.contains(l)).unwrap();
    let w = c.alloc_dma(len).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i * 13 + 5) as u8).collect();
    w.write_bytes(0, &data).unwrap();
    qp.write_blocking(&ns, good, 1, w, t).unwrap();
    let r = qp
        .read_blocking(&ns, good, 1, c.alloc_dma(len).unwrap(), t)
        .unwrap();
    assert_eq!(r.to_vec()[..len], data[..]);
    // The asynchronous path reports the same status.
    let _ = qp.read(&ns, bad, 1, c.alloc_dma(len).unwrap(), 5);
    let mut seen = None;
    while seen.is_none() {
        qp.process_completions(1, |_, c| seen = Some(c)).unwrap();
    }
    let c = seen.unwrap();
    assert!(matches!(c.result, Err(IoError::Status(s)) if s.sct() == 2 && s.sc() == 0x81));
}

#[test]
fn media_error_read_cli_names_the_status() {
    let lbas = error_lbas();
    let Some(&bad) = lbas.first() else { return };
    let o = upnvme(&["read", "-d", &device(), "--start-block", &bad.to_string()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("Unrecovered Read Error (sct 0x2, sc 0x81)"),
        "{err}"
    );
}

#[test]
fn media_error_perf_stops_at_the_first_or_counts_them_with_continue_on_error() {
    if error_lbas().is_empty() {
        return;
    }
    let dev = device();
    // Without --continue-on-error: stops, exits 1, says why.
    let o = upnvme(&["perf", "-d", &dev, "-q", "8", "-w", "randread", "-t", "20"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("completed with an error status (Unrecovered Read Error"),
        "{err}"
    );
    assert!(err.contains("the run stopped at the first"), "{err}");
    // With it: runs the whole time, counts them by status, exits 0.
    let o = upnvme(&[
        "perf",
        "-d",
        &dev,
        "-q",
        "8",
        "-w",
        "randread",
        "-t",
        "2",
        "--continue-on-error",
        "--json",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let total = &v["total"];
    let errors = total["errors"].as_u64().unwrap();
    assert!(
        errors > 0,
        "random reads over a small namespace hit the bad blocks: {out}"
    );
    let by = total["errors_by_status"].as_array().unwrap();
    assert_eq!(by.len(), 1, "{by:?}");
    assert_eq!(
        by[0]["status"].as_str().unwrap(),
        "Unrecovered Read Error (sct 0x2, sc 0x81)"
    );
    assert_eq!(by[0]["count"].as_u64().unwrap(), errors);
    assert!(
        total["ios"].as_u64().unwrap() > errors,
        "other reads went on"
    );
}

#[test]
fn media_error_perf_verify_with_continue_on_error_checks_the_rest_byte_for_byte() {
    if error_lbas().is_empty() {
        return;
    }
    let o = upnvme(&[
        "perf",
        "-d",
        &device(),
        "-q",
        "8",
        "-w",
        "randrw",
        "-M",
        "50",
        "-t",
        "2",
        "--verify",
        "--continue-on-error",
        "--json",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{out}");
    // I/O to the bad blocks failed and was counted (blkdebug's rule, armed by
    // the first read there, fails writes to those sectors too: Write Fault),
    // so they are never stamped and the verify pass compares the rest.
    assert!(v["total"]["errors"].as_u64().unwrap() > 0, "{out}");
    assert!(v["verify_unreadable_blocks"].as_u64().is_some(), "{out}");
}

/// `upnvme read` stopped by a media error after some chunks says what its
/// output holds, and the file holds exactly that: the blocks before the
/// failed chunk.
#[test]
fn media_error_read_that_stops_says_what_the_output_holds() {
    let mut lbas = error_lbas();
    lbas.sort_unstable();
    let Some(&last) = lbas.last() else { return };
    let start = if lbas.len() > 1 {
        lbas[lbas.len() - 2] + 1
    } else {
        0
    };
    let count = last - start + 1;
    let path = "/tmp/media-error-read.bin";
    let o = upnvme(&[
        "read",
        "-d",
        &device(),
        "-s",
        &start.to_string(),
        "-c",
        &count.to_string(),
        "--data",
        path,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("Unrecovered Read Error"), "{err}");
    let held = std::fs::metadata(path).unwrap().len();
    let c = Controller::open(&device(), ControllerOptions::default()).unwrap();
    let lba = u64::from(c.namespace(1).unwrap().lba_size());
    drop(c);
    let done = held / lba;
    assert_eq!(held % lba, 0, "{held} bytes");
    assert!(done < count, "{done} of {count} blocks");
    let said = if done == 0 {
        format!("nothing was written to {path}")
    } else {
        format!(
            "{path} holds LBAs {start}..={} ({done} blocks), nothing from LBA {} on",
            start + done - 1,
            start + done
        )
    };
    assert!(err.contains(&said), "{err}\nexpected: {said}");
}
