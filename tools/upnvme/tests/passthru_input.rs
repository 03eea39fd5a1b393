//! `upnvme admin-passthru`'s input, before it looks for the device (on a
//! host without an NVMe controller: the run ends with exit 1 at the open).
//! From the thirty-eighth session's review: the tool read stdin (and `-i`)
//! to the end before comparing with `-l`, so a producer that kept its end
//! open (`yes |`, `-i /dev/zero`) made it wait for ever, its buffer growing.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `-l 4096`: 4096 bytes are taken from a pipe that holds 8 KiB and stays
/// open (nvme-cli reads `data_len` bytes too); the tool goes on to the
/// device.
#[test]
fn admin_passthru_reads_data_len_bytes_of_stdin_not_to_end_of_file() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_upnvme"))
        .args([
            "admin-passthru",
            "-d",
            "0000:ff:1f.7",
            // Firmware Image Download (11h: host to controller), 1024 dwords.
            "-O",
            "0x11",
            "--cdw10",
            "1023",
            "-l",
            "4096",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run upnvme");
    let mut stdin = child.stdin.take().expect("stdin piped");
    stdin.write_all(&[0x5a; 8192]).expect("write the data");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if start.elapsed() > Duration::from_secs(10) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if status.is_none() {
        child.kill().expect("kill");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("collect");
    assert!(
        status.is_some(),
        "upnvme admin-passthru -l 4096 was still reading stdin after 10 s with 8192 bytes \
         there (stderr: {})",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `-i /dev/zero -l 4096` takes 4096 bytes of a file without an end;
/// without `-l` such a file is refused (exit 2), since its length is not
/// the data's.
#[test]
fn a_file_without_an_end_needs_a_data_length_and_gives_only_that() {
    let run = |extra: &[&str]| {
        let mut args = vec![
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
        args.extend_from_slice(extra);
        let mut child = Command::new(env!("CARGO_BIN_EXE_upnvme"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run upnvme");
        let start = Instant::now();
        while child.try_wait().expect("wait").is_none() {
            if start.elapsed() > Duration::from_secs(10) {
                child.kill().expect("kill");
                panic!("upnvme {args:?} still running after 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().expect("collect")
    };
    let o = run(&[]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("is not a regular file: pass --data-len"),
        "{err}"
    );
    // With the length: past the input to the (absent) device.
    let o = run(&["-l", "4096"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
