//! The C API in the guest: `hello_world_c` (driver/capi/examples/hello_world.c,
//! compiled by `cargo xtask` against the installed header and static library
//! through pkg-config) reads Identify Controller through the admin
//! passthrough, writes a string from a buffer, reads it back from inside the
//! write's completion callback, and prints it.

use std::process::Command;

use crate::vm::device;

#[test]
fn c_hello_world_prints_what_it_wrote_and_read_back() {
    let dev = device();
    let o = Command::new("hello_world_c")
        .arg(&dev)
        .output()
        .expect("hello_world_c is on the guest's PATH (cargo xtask builds it)");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {out}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains(&format!("Attached to {dev}")), "{out}");
    // Identify Controller through upnvme_ctrl_admin_passthru.
    assert!(out.contains("Controller: QEMU NVMe Ctrl"), "{out}");
    assert!(out.ends_with("Hello world!\n"), "{out}");
}

#[test]
fn c_hello_world_reports_a_bad_address_with_its_fix() {
    let o = Command::new("hello_world_c")
        .arg("0000:00:1f.7")
        .output()
        .expect("hello_world_c is on the guest's PATH");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(
            "upnvme_ctrl_open failed (no such device, or the controller failed, closed or gone)"
        ),
        "{err}"
    );
    assert!(err.contains("0000:00:1f.7"), "{err}");
}

/// The Rust example (driver/examples/hello_world.rs), which README.md runs
/// with `cargo xtask vm -- hello_world`: installed in the guest, it finds the
/// only vfio-bound controller by itself.
#[test]
fn rust_hello_world_example_runs_as_the_readme_says() {
    let o = Command::new("hello_world")
        .output()
        .expect("hello_world is on the guest's PATH (cargo xtask builds the examples)");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    if o.status.code() == Some(1) && err.contains("usage: hello_world PCI_ADDRESS") {
        // More than one vfio-bound controller in this configuration: the
        // example asks for the address, as its usage line says.
        let o = Command::new("hello_world").arg(device()).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(out.ends_with("Hello world!\n"), "{out}");
        return;
    }
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {out}\nstderr: {err}",
        o.status.code()
    );
    assert!(out.contains(&format!("Attached to {}", device())), "{out}");
    assert!(out.ends_with("Hello world!\n"), "{out}");
}

/// `admin_c` (driver/capi/examples/admin.c): Identify through the admin
/// passthrough, Get Features' dword 0, an error status in `cpl`, the SMART
/// log, a reset with a queue pair carrying on across it, and a Format NVM of
/// namespace 1 to the format it has (`upnvme_ctrl_format_nvm`).
#[test]
fn c_admin_example_identifies_resets_and_formats() {
    let dev = device();
    let o = Command::new("admin_c")
        .args([dev.as_str(), "--format-same", "1"])
        .output()
        .expect("admin_c is on the guest's PATH (cargo xtask builds it)");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {out}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("model: QEMU NVMe Ctrl"), "{out}");
    assert!(out.contains("reserved feature: "), "{out}");
    assert!(
        out.contains("sct 0 sc 0x02"),
        "Invalid Field in Command: {out}"
    );
    assert!(out.contains("reset: the pair carried on"), "{out}");
    let lba = std::env::var("UPNVME_VM_LBA_SIZE").expect("UPNVME_VM_LBA_SIZE");
    assert!(
        out.contains("format: namespace 1: LBA format")
            && out.contains(&format!("{lba}-byte blocks")),
        "{out}"
    );
    assert!(
        out.contains("format: the pair read namespace 1 after it"),
        "{out}"
    );
}

/// `commands_c` (driver/capi/examples/commands.c): `upnvme_copy` within
/// namespace 1 (two ranges, reversed) and, where the configuration has a
/// namespace 2 of the same format and the controller enabled Format 2h, from
/// namespace 2 into namespace 1; a raw Read and an unknown opcode through
/// `upnvme_io_passthru`; `upnvme_compare` of equal and of different
/// data (Compare Failure); `upnvme_verify` and `upnvme_write_uncorrectable`
/// where the controller reports them (else their refusals). The program reads the
/// copies back and compares them byte for byte. What it should find is read
/// here first, through the Rust library, so a path silently skipped fails
/// the test.
#[test]
fn c_commands_example_copies_compares_and_verifies() {
    let dev = device();
    let (oncs, cross) = {
        let c = upnvme::Controller::open(&dev, upnvme::ControllerOptions::default()).unwrap();
        let ns1 = c.namespace(1).unwrap();
        let cross = c.namespace(2).is_ok_and(|n| {
            n.lba_size() == ns1.lba_size()
                && n.metadata_size() == 0
                && ns1.metadata_size() == 0
                && n.lba_count() >= 60_016
        }) && c.identify().ocfs & c.copy_formats_enabled() & (1 << 2) != 0;
        let oncs = c.identify().oncs;
        c.close().unwrap();
        (oncs, cross)
    };
    let o = Command::new("commands_c")
        .arg(&dev)
        .output()
        .expect("commands_c is on the guest's PATH (cargo xtask builds it)");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {out}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    // QEMU 10.0.2's controller reports Copy (ONCS bit 8) and Compare (0),
    // not Verify (7) or Write Uncorrectable (1).
    assert_eq!(oncs & 0x101, 0x101, "ONCS {oncs:#x}: {out}");
    for line in [
        "copy: 2 ranges within namespace 1, 4 blocks of",
        "io passthru: a raw Read matched, opcode 0xc4 is Invalid Command Opcode (sct 0 sc 0x01)",
        "compare: equal blocks match, a changed byte is Compare Failure (sct 2 sc 0x85)",
    ] {
        assert!(out.contains(line), "{line}: {out}");
    }
    let verify = if oncs & (1 << 7) != 0 {
        "verify: 4 blocks read and checked on the controller"
    } else {
        "verify: not supported (ONCS bit 7 clear), refused"
    };
    assert!(out.contains(verify), "{out}");
    let wu = if oncs & (1 << 1) != 0 {
        "write uncorrectable: the block failed a Read (sct 2 sc 0x81) until written"
    } else {
        "write uncorrectable: not supported (ONCS bit 1 clear), refused"
    };
    assert!(out.contains(wu), "{out}");
    let across = "copy: namespace 1 and namespace 2 into namespace 1, 4 blocks, read back equal";
    assert_eq!(out.contains(across), cross, "{out}");
}
