//! The data `upnvme admin-passthru` and `set-feature` send, read before
//! the device is looked for (on a host without an NVMe controller a run
//! that gets past its input ends with exit 1 at the open). From the
//! thirty-eighth session's reviews: the tools read stdin (and `-i`,
//! `--data`) to the end before comparing with the length, so a producer
//! that kept its end open (`yes |`, a FIFO, `/dev/zero`) made them wait for
//! ever, their buffer growing; `-i -` without a length sent no data at all.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// `-l 4096`: 4096 bytes are taken from a pipe that holds 8 KiB and stays
/// open (nvme-cli reads `data_len` bytes too); the tool goes on to the
/// device.
#[test]
fn admin_passthru_reads_data_len_bytes_of_stdin_not_to_end_of_file() {
    // Firmware Image Download (11h: host to controller), 1024 dwords.
    let out = run_bounded(
        &[
            "admin-passthru",
            "-d",
            "0000:ff:1f.7",
            "-O",
            "0x11",
            "--cdw10",
            "1023",
            "-l",
            "4096",
        ],
        Some(&[0x5a; 8192]),
    )
    .expect("admin-passthru -l 4096 still reading stdin after 10 s with 8192 bytes there");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `-i /dev/zero -l 4096` takes 4096 bytes of a file without an end;
/// without `-l` such a file is refused (exit 2), since its length is not
/// the data's.
#[test]
fn a_file_without_an_end_needs_a_data_length_and_gives_only_that() {
    let args = [
        "admin-passthru",
        "-d",
        "0000:ff:1f.7",
        "-O",
        "0x11",
        "--cdw10",
        "1023",
        "-i",
        "/dev/zero",
    ];
    let o = run_bounded(&args, None).expect("still running after 10 s");
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("is not a regular file: pass --data-len"),
        "{err}"
    );
    // With the length: past the input to the (absent) device.
    let mut with_len = args.to_vec();
    with_len.extend(["-l", "4096"]);
    let o = run_bounded(&with_len, None).expect("still running after 10 s");
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Runs `upnvme args`, feeding `stdin_bytes` through a pipe kept open;
/// `None` when it was still running after 10 s (then killed).
fn run_bounded(args: &[&str], stdin_bytes: Option<&[u8]>) -> Option<Output> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_upnvme"))
        .args(args)
        .stdin(if stdin_bytes.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run upnvme");
    let mut stdin = child.stdin.take();
    if let (Some(s), Some(b)) = (stdin.as_mut(), stdin_bytes) {
        // A run that refuses its arguments exits without reading stdin:
        // the write then finds the pipe closed (EPIPE), which is that
        // outcome, not a failure of the test (it failed so once under
        // load, the refusal winning the race against the write).
        if let Err(e) = s.write_all(b) {
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe,
                "write the data: {e}"
            );
        }
    }
    let start = Instant::now();
    let done = loop {
        if child.try_wait().expect("wait").is_some() {
            break true;
        }
        if start.elapsed() > Duration::from_secs(10) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if !done {
        child.kill().expect("kill");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("collect");
    done.then_some(out)
}

/// `set-feature -f 0x0e --data -`: Timestamp's 8 bytes from a pipe that
/// stays open; the tool goes on to the device.
#[test]
fn set_feature_data_from_stdin_takes_the_structure_not_to_end_of_file() {
    let out = run_bounded(
        &[
            "set-feature",
            "-d",
            "0000:ff:1f.7",
            "-f",
            "0x0e",
            "--data",
            "-",
        ],
        Some(&[0u8; 8]),
    );
    let out = out.expect("set-feature --data - still reading stdin after 10 s");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `set-feature --data FIFO`: a named pipe whose writer put the 8 bytes
/// there and keeps it open.
#[test]
fn set_feature_data_from_a_file_without_an_end_ends() {
    let dir = std::env::temp_dir().join(format!("upnvme-data-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("timestamp");
    let _ = std::fs::remove_file(&fifo);
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success()
    );
    let path = fifo.to_str().unwrap().to_string();
    let done = std::sync::Arc::new(AtomicBool::new(false));
    // The writer opens the FIFO (waiting for the reader), writes 8 bytes
    // and keeps it open until the tool is done (at most 15 s).
    let writer = std::thread::spawn({
        let (fifo, done) = (fifo.clone(), done.clone());
        move || {
            let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
            w.write_all(&[0u8; 8]).unwrap();
            let start = Instant::now();
            while !done.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(15) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    });
    let out = run_bounded(
        &[
            "set-feature",
            "-d",
            "0000:ff:1f.7",
            "-f",
            "0x0e",
            "--data",
            &path,
        ],
        None,
    );
    done.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let out = out.expect("set-feature --data FIFO still reading after 10 s");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `admin-passthru -i -` without `--data-len` (a vendor write opcode, C1h):
/// refused (exit 2), since stdin has no length of its own — it went on to
/// the device without reading any of it, the command sent with no data.
#[test]
fn input_from_stdin_without_a_length_is_refused() {
    let out = run_bounded(
        &[
            "admin-passthru",
            "-d",
            "0000:ff:1f.7",
            "-O",
            "0xc1",
            "-i",
            "-",
        ],
        Some(&[0x5a; 4096]),
    )
    .expect("admin-passthru -i - still running after 10 s");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stdin has no length of its own"), "{err}");
}

/// `get-log --ot --lpo 1`: with Offset Type set the offset is an entry
/// index, which need not be a multiple of 4 (it was refused as unaligned).
#[test]
fn an_entry_index_need_not_be_a_multiple_of_four() {
    let out = Command::new(env!("CARGO_BIN_EXE_upnvme"))
        .args([
            "get-log",
            "-d",
            "0000:ff:1f.7",
            "-i",
            "0x0d",
            "-l",
            "512",
            "--ot",
            "--lpo",
            "1",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run upnvme");
    assert_eq!(
        out.status.code(),
        Some(1),
        "get-log --ot --lpo 1 (entry index 1) was refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `set-feature -l 512` without `--data` (a vendor feature): refused; it
/// went on with no data pointer, the controller reading from IOVA 0.
#[test]
fn a_data_length_without_data_is_not_dropped() {
    let out = Command::new(env!("CARGO_BIN_EXE_upnvme"))
        .args([
            "set-feature",
            "-d",
            "0000:ff:1f.7",
            // A vendor-specific feature with a 512-byte structure.
            "-f",
            "0xc0",
            "-l",
            "512",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run upnvme");
    assert_eq!(
        out.status.code(),
        Some(2),
        "set-feature -f 0xc0 -l 512 without --data went on to the device (it would send Set \
         Features with no data pointer): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Lengths no admin command moves are refused before anything is
/// allocated (exit 2): `admin-passthru -l 0xffffffffffff -i f` aborted
/// ("memory allocation of 281474976710655 bytes failed", exit 134) padding
/// the file's data to it, `-l 0xfffffffffffffff0` panicked ("capacity
/// overflow", exit 101), `set-feature --data f -l 0xffffffffffff` aborted
/// the same way, and `get-log -l 0xfffffffffffffffc` panicked once the
/// controller was open. A regular file above the limit without `-l` is
/// refused unread. The limit itself (513 pages of 4 KiB) goes on to the
/// (absent) device: exit 1.
#[test]
fn lengths_no_memory_or_command_can_hold_are_refused_not_aborted() {
    let dir = std::env::temp_dir().join(format!("upnvme-data-len-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let small = dir.join("small.bin");
    std::fs::write(&small, b"hi\n").unwrap();
    let small = small.to_str().unwrap().to_string();
    let big = dir.join("big.bin");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(3 << 20)
        .unwrap();
    let big = big.to_str().unwrap().to_string();
    let dev = ["-d", "0000:ff:1f.7"];
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(dev);
        run_bounded(&all, None).unwrap_or_else(|| panic!("{args:?} still running after 10 s"))
    };
    for (args, says) in [
        (
            &[
                "admin-passthru",
                "-O",
                "0x11",
                "-l",
                "0xffffffffffff",
                "-i",
                &small,
            ][..],
            "more than an admin command moves through upnvme",
        ),
        (
            &[
                "admin-passthru",
                "-O",
                "0x11",
                "-l",
                "0xfffffffffffffff0",
                "-i",
                &small,
            ],
            "more than an admin command moves through upnvme",
        ),
        (
            &[
                "admin-passthru",
                "-O",
                "0x11",
                "-l",
                "2101252",
                "-i",
                &small,
            ],
            "at most 2101248",
        ),
        (
            &[
                "set-feature",
                "-f",
                "0x16",
                "-l",
                "0xffffffffffff",
                "--data",
                &small,
            ],
            "more than an admin command moves through upnvme",
        ),
        (
            &["get-feature", "-f", "0xc0", "-l", "0xffffffffffff"],
            "more than an admin command moves through upnvme",
        ),
        (
            &["get-log", "-i", "2", "-l", "0xfffffffffffffffc"],
            "cannot hold a log of 18446744073709551612 bytes in memory",
        ),
        (
            &["admin-passthru", "-O", "0xc1", "-i", &big],
            "holds 3145728 bytes, more than an admin command moves",
        ),
        // An I/O command moves up to 4 MiB (not an admin command's 2101248).
        (
            &[
                "io-passthru",
                "-n",
                "1",
                "-O",
                "0x01",
                "-l",
                "4194308",
                "-i",
                &small,
            ],
            "more than an I/O command moves through upnvme: at most 4194304",
        ),
        (
            &[
                "io-passthru",
                "-n",
                "1",
                "-O",
                "0x02",
                "-l",
                "0xffffffffffff",
            ],
            "more than an I/O command moves through upnvme",
        ),
    ] {
        let o = run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let o = run(&[
        "admin-passthru",
        "-O",
        "0x11",
        "-l",
        "2101248",
        "-i",
        &small,
    ]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // What an I/O command may move gets past the checks to the device
    // (which this address does not name: exit 1).
    for args in [
        &["io-passthru", "-n", "1", "-O", "0x01", "-i", &big][..],
        &[
            "io-passthru",
            "-n",
            "1",
            "-O",
            "0x01",
            "-l",
            "4194304",
            "-i",
            &small,
        ],
    ] {
        let o = run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(!err.contains("more than"), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
