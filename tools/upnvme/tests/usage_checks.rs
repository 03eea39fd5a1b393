//! `upnvme`'s argument checks that run before any device is opened, on a
//! host without an NVMe controller: each case is refused (or passes) before
//! the tool looks for a device.

use std::process::{Command, Output};

fn upnvme(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_upnvme"))
        .args(args)
        .output()
        .expect("run upnvme")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// README.md's perf example with protection information and `--verify`
/// passes perf's own checks (it names a workload that writes; `--verify`
/// refuses read-only ones): whatever fails on this host, it is not that.
#[test]
fn readme_perf_pi_verify_example_passes_the_argument_checks() {
    let o = upnvme(&[
        "perf",
        "-w",
        "randwrite",
        "-e",
        "PRACT=1,PRCHK=GUARD",
        "--verify",
    ]);
    let err = stderr(&o);
    assert!(
        !err.contains("--verify needs a workload that writes"),
        "exit {:?}: {err}",
        o.status.code()
    );
    // The check this example once failed is there.
    let o = upnvme(&["perf", "-e", "PRACT=1,PRCHK=GUARD", "--verify"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--verify needs a workload that writes"));
}

/// A malformed `-d` is a usage error (exit 2, the argument parser's
/// message) for perf as for the other subcommands.
#[test]
fn a_malformed_device_address_is_a_usage_error_for_every_subcommand() {
    for sub in ["identify", "perf", "smart-log", "error-log", "fw-log"] {
        let o = upnvme(&[sub, "-d", "00:04"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{sub} -d 00:04: {err}");
        assert!(
            err.contains("invalid value '00:04' for '--device <DEVICE>'"),
            "{sub}: {err}"
        );
    }
}

/// `--histogram-csv` in a directory that does not exist is refused before
/// the run (and before the device is looked for), not after it.
#[test]
fn an_unwritable_histogram_csv_is_refused_before_the_run() {
    let o = upnvme(&[
        "perf",
        "--histogram-csv",
        "/nonexistent-dir/h.csv",
        "-d",
        "0000:00:00.0",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--histogram-csv /nonexistent-dir/h.csv: cannot create it"),
        "{err}"
    );
}

/// A run that fails before it measures anything (here: no controller at the
/// address) leaves an existing `--histogram-csv` file as it was and removes
/// one it created.
#[test]
fn a_failed_run_keeps_an_existing_histogram_csv_and_removes_a_new_one() {
    let dir = std::env::temp_dir().join(format!("upnvme-csv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let old = dir.join("old.csv");
    std::fs::write(&old, "bucket_us,count\n1.000,5\n").expect("write old csv");
    let new = dir.join("new.csv");
    for path in [&old, &new] {
        let p = path.to_str().expect("utf-8 temp path");
        let o = upnvme(&["perf", "--histogram-csv", p, "-d", "0000:ff:1f.7"]);
        assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    assert_eq!(
        std::fs::read_to_string(&old).expect("old csv still there"),
        "bucket_us,count\n1.000,5\n"
    );
    assert!(!new.exists(), "a failed run left {}", new.display());
    std::fs::remove_dir_all(&dir).expect("remove temp dir");
}

/// Arguments refused at parse time (exit 2) that once passed: a seed a JSON
/// reader could not hold exactly, an empty or repeated `-e` spec, and a
/// format timeout of 0 (it failed at once, after the command was sent).
#[test]
fn perf_and_format_arguments_refused_at_parse_time() {
    for args in [
        &["perf", "--seed", "9007199254740992"][..],
        &["perf", "-e", ""][..],
        &["perf", "-e", "PRACT=1,PRACT=0"][..],
        &["format", "-n", "1", "--lbaf", "0", "--timeout", "0"][..],
    ] {
        let o = upnvme(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
    let o = upnvme(&["perf", "-e", "PRACT=1,pract=0"]);
    assert!(stderr(&o).contains("PRACT given twice"), "{}", stderr(&o));
}

/// `error-log -e` outside 1..=256 (a controller keeps ELPE + 1 entries,
/// ELPE a byte) is refused with exit status 2 before any device is sought.
#[test]
fn error_log_entries_out_of_range_are_usage_errors() {
    for bad in ["0", "257", "0x101", "many"] {
        let o = upnvme(&["error-log", "-e", bad]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "-e {bad}: {err}");
        assert!(err.contains("--log-entries"), "-e {bad}: {err}");
    }
}
