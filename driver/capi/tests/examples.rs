//! The C example driver/capi/examples/commands.c on the host, linked against
//! tests/stub/upnvme_stub.c (a stand-in for libupnvme_c with one namespace
//! in memory): the paths the guest's QEMU controller never takes — a
//! controller without Compare, a command that never completes — which
//! `cargo xtask test` (guest capi.rs) cannot reach.

use std::path::PathBuf;
use std::process::{Command, Output};

/// commands.c and the stub, compiled once per test into the temp dir.
fn build(name: &str) -> PathBuf {
    let dir = env!("CARGO_MANIFEST_DIR");
    let out = std::env::temp_dir().join(format!("upnvme-examples-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let exe = out.join(name);
    let o = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-O0"])
        .arg("-fno-omit-frame-pointer")
        .arg(format!("-I{dir}/include"))
        .arg(format!("{dir}/examples/commands.c"))
        .arg(format!("{dir}/tests/stub/upnvme_stub.c"))
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("the C compiler runs (Rust itself links with cc)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    exe
}

fn run(exe: &PathBuf, env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut c = Command::new(exe);
    for (k, v) in env {
        c.env(k, v);
    }
    let Output {
        status,
        stdout,
        stderr,
    } = c.output().unwrap();
    (
        status.code(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// With Copy and Compare the example runs through (the stub is usable);
/// without Compare (ONCS bit 0 clear) or Copy (bit 8) it meets and reports
/// the refusal, as it does for Verify and Write Uncorrectable, instead of
/// failing.
#[test]
fn commands_c_takes_a_controller_without_compare() {
    let exe = build("commands_compare");
    let (code, out, err) = run(&exe, &[("STUB_ONCS", "101")]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("compare: equal blocks match, a changed byte is Compare Failure"),
        "{out}"
    );
    let (code, out, err) = run(&exe, &[("STUB_ONCS", "100")]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("compare: not supported (ONCS bit 0 clear), refused"),
        "{out}"
    );
    // Without Copy either: the refusal, then the other steps on blocks
    // written instead.
    let (code, out, err) = run(&exe, &[("STUB_ONCS", "1")]);
    assert_eq!(code, Some(0), "{out}{err}");
    for line in [
        "copy: not supported (ONCS bit 8 clear), refused",
        "io passthru: a raw Read matched",
        "compare: equal blocks match",
    ] {
        assert!(out.contains(line), "{line}: {out}");
    }
}

/// A command that does not complete within the example's 10 s: it gives
/// up, and its callback, run with `UPNVME_ENODEV` when the pair is
/// destroyed after the close, writes into memory that is still the
/// example's (before, a `struct done` in a function that had returned).
#[test]
fn commands_c_outlives_a_command_that_never_completes() {
    let exe = build("commands_hang");
    let (code, out, err) = run(&exe, &[("STUB_HANG", "1"), ("STUB_ONCS", "101")]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(!err.contains("stack frame that has returned"), "{err}");
    assert!(err.contains("upnvme_write failed"), "{err}");
}
