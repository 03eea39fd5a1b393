//! Guest tests of the `upnvme` tool: every subcommand against the emulated
//! controllers — `setup status|bind|unbind|hugepages` (including the
//! refusals), `list`, `identify` (fields equal the VM options), `smart-log`,
//! `error-log`, `fw-log`, `get-feature -H`,
//! `read`/`write` byte-exact through files, `perf` with and without each
//! option (text, `--json` with the documented fields, `--histogram-csv`),
//! `--verify` finding no mismatch, SIGINT/SIGTERM ending a run early with its
//! report and a clean shutdown, and bad input answered with its exact text
//! and exit status 2 before any I/O.
//!
//! Tests that move a controller between drivers or change hugepages put the
//! machine back as they found it, also when they fail (drop guards).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn upnvme(args: &[&str]) -> Output {
    Command::new("upnvme")
        .args(args)
        .output()
        .expect("upnvme is on the guest's PATH (cargo xtask vm puts it there)")
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set: run inside `cargo xtask vm`"))
}

fn env_u64(name: &str) -> u64 {
    env(name)
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number"))
}

/// The vfio-bound controllers, in order.
fn devices() -> Vec<String> {
    env("UPNVME_VM_DEVICES")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn device() -> String {
    devices().into_iter().next().expect("a device")
}

/// The controller the kernel's nvme driver drives (`--kernel-nvme`).
fn kernel_nvme() -> Option<String> {
    std::env::var("UPNVME_VM_KERNEL_NVME")
        .ok()
        .filter(|k| !k.is_empty())
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        stdout(o),
        stderr(o)
    );
    stdout(o)
}

/// Asserts exit status `code` and returns stderr.
fn fails(o: &Output, code: i32) -> String {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        stdout(o),
        stderr(o)
    );
    stderr(o)
}

fn json(o: &Output) -> Value {
    let out = ok(o);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not one JSON document ({e}):\n{out}"))
}

/// This process's command name, as `upnvme setup` reports it.
fn my_comm() -> String {
    fs::read_to_string("/proc/self/comm")
        .unwrap()
        .trim()
        .to_string()
}

fn pci_dir(addr: &str) -> PathBuf {
    Path::new("/sys/bus/pci/devices").join(addr)
}

/// The driver `addr` is bound to, if any.
fn driver_of(addr: &str) -> Option<String> {
    fs::read_link(pci_dir(addr).join("driver"))
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

fn iommu_group(addr: &str) -> u32 {
    fs::read_link(pci_dir(addr).join("iommu_group"))
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .parse()
        .unwrap()
}

/// Binds `addr` to vfio-pci through sysfs (no upnvme involved), waiting for it.
fn force_vfio(addr: &str) {
    if driver_of(addr).as_deref() == Some("vfio-pci") {
        return;
    }
    let dir = pci_dir(addr);
    let _ = fs::write(dir.join("driver_override"), "vfio-pci");
    if driver_of(addr).is_some() {
        let _ = fs::write(dir.join("driver/unbind"), addr);
    }
    let _ = fs::write("/sys/bus/pci/drivers_probe", addr);
    wait_for_driver(addr, Some("vfio-pci"));
}

fn wait_for_driver(addr: &str, want: Option<&str>) -> Option<String> {
    let start = Instant::now();
    loop {
        let d = driver_of(addr);
        if d.as_deref() == want || start.elapsed() > Duration::from_secs(5) {
            return d;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Puts the vfio-bound controllers back on vfio-pci when dropped.
struct RebindAll;

impl Drop for RebindAll {
    fn drop(&mut self) {
        for d in devices() {
            force_vfio(&d);
        }
    }
}

/// Sets a hugepage pool back to its size when dropped.
struct RestoreHugepages {
    path: PathBuf,
    before: String,
}

impl RestoreHugepages {
    fn new(size_kib: u64) -> Option<RestoreHugepages> {
        let path = PathBuf::from(format!(
            "/sys/kernel/mm/hugepages/hugepages-{size_kib}kB/nr_hugepages"
        ));
        let before = fs::read_to_string(&path).ok()?.trim().to_string();
        Some(RestoreHugepages { path, before })
    }

    fn now(&self) -> u64 {
        fs::read_to_string(&self.path)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for RestoreHugepages {
    fn drop(&mut self) {
        let _ = fs::write(&self.path, &self.before);
    }
}

/// Block devices (namespaces) of the kernel-driven controller at `addr`, sorted.
fn namespaces_of(addr: &str) -> Vec<String> {
    let nvme = pci_dir(addr).join("nvme");
    let mut out = Vec::new();
    for c in fs::read_dir(&nvme).unwrap().flatten() {
        for e in fs::read_dir(c.path()).unwrap().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let rest = n.strip_prefix("nvme").unwrap_or("");
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            let Some((x, z)) = rest.split_once('n') else {
                continue;
            };
            if digits(x) && digits(z) {
                out.push(n);
            } else if let Some((x, y)) = x.split_once('c')
                && digits(x)
                && digits(y)
                && digits(z)
            {
                // A shared namespace (QEMU 10's nvme-ns defaults to shared=on)
                // under the kernel's native multipath: the controller holds the
                // hidden path `nvme<X>c<Y>n<Z>`, the block device is the head
                // `nvme<X>n<Z>`.
                let head = format!("nvme{x}n{z}");
                if !out.contains(&head) {
                    out.push(head);
                }
            }
        }
    }
    out.sort();
    out
}

/// NVM read + write commands the controller has completed (SMART log).
fn io_commands(dev: &str) -> u128 {
    let v = json(&upnvme(&["smart-log", "-d", dev, "--json"]));
    let n = |k: &str| v[k].as_str().unwrap().parse::<u128>().unwrap();
    n("host_read_commands") + n("host_write_commands")
}

// ---------------------------------------------------------------- read/write

#[test]
fn write_then_read_is_byte_exact() {
    let dev = device();
    let lba = env_u64("UPNVME_VM_LBA_SIZE") as usize;
    let blocks = 300usize; // more than one MDTS-sized chunk at 512-byte blocks
    let data: Vec<u8> = (0..blocks * lba)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    fs::write("/tmp/in.bin", &data).unwrap();
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
    assert!(fs::read("/tmp/out.bin").unwrap() == data);
    // To stdout as well.
    let o = upnvme(&["read", "-d", &dev, "-s", "34", "-c", "2"]);
    ok(&o);
    assert!(o.stdout == data[lba..3 * lba], "read to stdout");
    // Short input is an error, not silent padding.
    fs::write("/tmp/short.bin", &data[..lba + 1]).unwrap();
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
    let err = fails(&o, 2);
    assert_eq!(
        err.trim(),
        format!(
            "upnvme: input /tmp/short.bin holds {} bytes; writing 2 blocks takes exactly {} (2 x {lba}); nothing was written",
            lba + 1,
            2 * lba
        )
    );
    // So is a longer one, and nothing is written either.
    fs::write("/tmp/long.bin", vec![0xa5u8; 4 * lba]).unwrap();
    let o = upnvme(&[
        "write",
        "-d",
        &dev,
        "-s",
        "33",
        "-c",
        "2",
        "--data",
        "/tmp/long.bin",
    ]);
    let err = fails(&o, 2);
    assert!(err.contains(&format!("holds {} bytes", 4 * lba)), "{err}");
    let o = upnvme(&["read", "-d", &dev, "-s", "33", "-c", "2"]);
    ok(&o);
    assert!(o.stdout == data[..2 * lba], "blocks 33-34 unchanged");
}

/// `upnvme copy`: a Copy moves its ranges in order, and with --snsids a
/// cross-namespace Copy (Descriptor Format 2h; from namespace 2 where the
/// configuration has one of the same format, else from namespace 1 itself)
/// does the same, byte for byte; lists of different lengths and a range
/// outside the namespace are usage errors (exit 2), nothing sent.
#[test]
fn copy_moves_ranges_within_and_across_namespaces() {
    let dev = device();
    let lba = env_u64("UPNVME_VM_LBA_SIZE") as usize;
    let id = json(&upnvme(&["identify", "-d", &dev, "--json"]));
    let oncs = id["controller"]["oncs"].as_u64().unwrap();
    let ocfs = id["controller"]["ocfs"].as_u64().unwrap();
    let data: Vec<u8> = (0..4 * lba).map(|i| (i * 13 + i / lba) as u8).collect();
    fs::write("/tmp/copy-in.bin", &data).unwrap();
    ok(&upnvme(&[
        "write",
        "-d",
        &dev,
        "-s",
        "60000",
        "-c",
        "4",
        "--data",
        "/tmp/copy-in.bin",
    ]));
    let copy = [
        "copy",
        "-d",
        &dev,
        "--sdlba",
        "60100",
        "-s",
        "60002,60000",
        "-b",
        "2,2",
    ];
    if oncs & (1 << 8) == 0 {
        let err = fails(&upnvme(&copy), 2);
        assert!(err.contains("does not support Copy"), "{err}");
        return;
    }
    let out = ok(&upnvme(&copy));
    assert!(out.contains("copied 4 blocks from 2 range(s)"), "{out}");
    let back = upnvme(&["read", "-d", &dev, "-s", "60100", "-c", "4"]);
    ok(&back);
    let mut want = data[2 * lba..].to_vec();
    want.extend_from_slice(&data[..2 * lba]);
    assert!(back.stdout == want, "Copy moved other bytes");
    // Cross-namespace: namespace 1's own range first (QEMU 10.0.2 reads a
    // range whose SNSID is the destination's from the namespace named
    // before it; see vectored::a_cross_namespace_copy_moves_blocks_between_namespaces).
    let other = match id["namespaces"].as_array() {
        Some(nss)
            if nss.iter().any(|n| {
                n["nsid"] == 2
                    && n["lba_size"] == id["namespaces"][0]["lba_size"]
                    && n["metadata_size"] == id["namespaces"][0]["metadata_size"]
            }) =>
        {
            "2"
        }
        _ => "1",
    };
    if other == "2" {
        ok(&upnvme(&[
            "write",
            "-d",
            &dev,
            "-n",
            "2",
            "-s",
            "60000",
            "-c",
            "4",
            "--data",
            "/tmp/copy-in.bin",
        ]));
    }
    let cross = [
        "copy",
        "-d",
        &dev,
        "--sdlba",
        "60200",
        "-s",
        "60000,60003",
        "-b",
        "1,1",
        "-N",
    ];
    let snsids = format!("1,{other}");
    let mut cross = cross.to_vec();
    cross.push(&snsids);
    if ocfs & 0b100 == 0 {
        let err = fails(&upnvme(&cross), 2);
        assert!(err.contains("Copy Descriptor Format 2h"), "{err}");
    } else {
        ok(&upnvme(&cross));
        let back = upnvme(&["read", "-d", &dev, "-s", "60200", "-c", "2"]);
        ok(&back);
        let mut want = data[..lba].to_vec();
        want.extend_from_slice(&data[3 * lba..]);
        assert!(
            back.stdout == want,
            "the cross-namespace Copy from {other} moved other bytes"
        );
    }
    // Bad input: exit 2 (refused before anything is sent).
    let err = fails(
        &upnvme(&["copy", "-d", &dev, "--sdlba", "0", "-s", "1,2", "-b", "1"]),
        2,
    );
    assert!(
        err.contains("--slbs names 2 ranges and --blocks 1"),
        "{err}"
    );
    let nsze = id["namespaces"][0]["nsze"].as_u64().unwrap().to_string();
    let err = fails(
        &upnvme(&["copy", "-d", &dev, "--sdlba", &nsze, "-s", "0", "-b", "1"]),
        2,
    );
    assert!(err.contains("Copy"), "{err}");
}

// ---------------------------------------------------------------- identify, list, smart-log

/// `upnvme io-passthru`: a raw Write (01h) from a file lands on the blocks
/// (`upnvme read` gives them back), a raw Read (02h) brings them back raw
/// on stdout, an opcode the controller lacks fails with its status (exit
/// 1), and a Read whose data length is shorter than its NLB, or no
/// namespace, is refused (exit 2, nothing sent).
#[test]
fn io_passthru_moves_blocks_and_reports_statuses() {
    let dev = device();
    let lba = env_u64("UPNVME_VM_LBA_SIZE") as usize;
    let data: Vec<u8> = (0..2 * lba).map(|i| (i * 7 + i / lba) as u8).collect();
    fs::write("/tmp/io-passthru.bin", &data).unwrap();
    // Write (01h): SLBA 60400 in CDW10, NLB 1 (0-based: two blocks).
    let out = ok(&upnvme(&[
        "io-passthru",
        "-d",
        &dev,
        "-n",
        "1",
        "-O",
        "0x01",
        "--cdw10",
        "60400",
        "--cdw12",
        "1",
        "-i",
        "/tmp/io-passthru.bin",
    ]));
    assert!(
        out.starts_with("I/O command 0x01: Successful Completion"),
        "{out}"
    );
    let o = upnvme(&["read", "-d", &dev, "-s", "60400", "-c", "2"]);
    ok(&o);
    assert!(o.stdout == data, "the raw Write's blocks");
    // Read (02h), raw on stdout, the report on stderr.
    let len = (2 * lba).to_string();
    let o = upnvme(&[
        "io-passthru",
        "-d",
        &dev,
        "-n",
        "1",
        "-O",
        "0x02",
        "--cdw10",
        "60400",
        "--cdw12",
        "1",
        "-l",
        &len,
        "-b",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stdout == data, "the raw Read's data");
    assert!(
        stderr(&o).contains("Successful Completion"),
        "{}",
        stderr(&o)
    );
    // An opcode QEMU does not have: its status, exit 1.
    let err = fails(
        &upnvme(&["io-passthru", "-d", &dev, "-n", "1", "-O", "0xc4"]),
        1,
    );
    assert!(err.contains("Invalid Command Opcode"), "{err}");
    // Refused, nothing sent: a data length shorter than NLB moves; no -n.
    let short = lba.to_string();
    let err = fails(
        &upnvme(&[
            "io-passthru",
            "-d",
            &dev,
            "-n",
            "1",
            "-O",
            "0x02",
            "--cdw10",
            "60400",
            "--cdw12",
            "1",
            "-l",
            &short,
        ]),
        2,
    );
    assert!(
        err.contains(&format!("the transfer needs {} bytes", 2 * lba)),
        "{err}"
    );
    let err = fails(&upnvme(&["io-passthru", "-d", &dev, "-O", "0x00"]), 2);
    assert!(err.contains("pass -n NSID"), "{err}");
}

/// `upnvme admin-passthru`: Identify Controller back raw, a log page as a
/// hex dump, Get Features' dword 0, a data structure sent to the controller
/// and read back, an NVMe error status (exit 1) and a refused command
/// (exit 2, nothing sent).
#[test]
fn admin_passthru_moves_data_both_ways_and_reports_statuses() {
    let dev = device();
    // Identify Controller (06h, CNS 01h), raw: 4096 bytes on stdout.
    let o = upnvme(&[
        "admin-passthru",
        "-d",
        &dev,
        "-O",
        "0x06",
        "--cdw10",
        "1",
        "-l",
        "4096",
        "-b",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout.len(), 4096);
    let text = |r: std::ops::Range<usize>| String::from_utf8_lossy(&o.stdout[r]).trim().to_string();
    assert_eq!(text(24..64), "QEMU NVMe Ctrl");
    assert_eq!(text(4..24), format!("{}0", env("UPNVME_VM_SERIAL_PREFIX")));
    assert!(
        stderr(&o).contains("Successful Completion"),
        "{}",
        stderr(&o)
    );

    // SMART / Health Information (Get Log Page 02h, 128 dwords, RAE set):
    // the report line and a hex dump of 512 bytes.
    let out = ok(&upnvme(&[
        "admin-passthru",
        "-d",
        &dev,
        "-O",
        "0x02",
        "-n",
        "0xffffffff",
        "--cdw10",
        "0x007f8002",
        "-l",
        "512",
    ]));
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("admin command 0x02: Successful Completion"),
        "{out}"
    );
    assert_eq!(lines.len(), 2 + 32, "{out}");
    assert!(lines[2].starts_with("0000: "), "{out}");
    assert!(lines[33].starts_with("01f0: "), "{out}");

    // Get Features Number of Queues (0Ah, FID 07h): dword 0, no data.
    let out = ok(&upnvme(&[
        "admin-passthru",
        "-d",
        &dev,
        "-O",
        "0x0a",
        "--cdw10",
        "7",
    ]));
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(!out.contains("dword 0 0x00000000"), "{out}");

    // Host Behavior Support (FID 16h, 512 bytes): read it, send it back
    // unchanged (Set Features, 09h: host to controller), read it again.
    let get_hbs = |file: &str| {
        let o = upnvme(&[
            "admin-passthru",
            "-d",
            &dev,
            "-O",
            "0x0a",
            "--cdw10",
            "0x16",
            "-l",
            "512",
            "-b",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        fs::write(file, &o.stdout).unwrap();
        o.stdout
    };
    let hbs = get_hbs("/tmp/hbs.bin");
    assert_eq!(hbs.len(), 512);
    ok(&upnvme(&[
        "admin-passthru",
        "-d",
        &dev,
        "-O",
        "0x09",
        "--cdw10",
        "0x16",
        "-i",
        "/tmp/hbs.bin",
    ]));
    assert_eq!(get_hbs("/tmp/hbs2.bin"), hbs);

    // An NVMe error status: Get Features of a reserved FID.
    let o = upnvme(&[
        "admin-passthru",
        "-d",
        &dev,
        "-O",
        "0x0a",
        "--cdw10",
        "0xee",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("Invalid Field"), "{}", stderr(&o));
    // A command the driver owns: Create I/O Completion Queue.
    let o = upnvme(&["admin-passthru", "-d", &dev, "-O", "0x05"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("io_queue_pair"), "{}", stderr(&o));
}

/// `upnvme get-feature` / `set-feature` / `get-log`: a feature's value
/// (Temperature Threshold changed and put back), a data-structure feature
/// as a hex dump and sent back with --data, a log page, and the refusals
/// (exit 2, nothing sent).
#[test]
fn get_feature_set_feature_and_get_log_as_nvme_cli() {
    let dev = device();
    let value = |out: &str| -> u32 {
        let hex = out.trim().rsplit("value:0x").next().unwrap();
        u32::from_str_radix(&hex[..8], 16).unwrap_or_else(|e| panic!("{out}: {e}"))
    };
    let out = ok(&upnvme(&["get-feature", "-d", &dev, "-f", "7"]));
    assert!(
        out.starts_with("get-feature:0x07 (Number of Queues), Current value:0x"),
        "{out}"
    );
    // Temperature Threshold (04h): set, read back, put back.
    let before = value(&ok(&upnvme(&["get-feature", "-d", &dev, "-f", "4"])));
    let new = if before & 0xffff == 0x160 {
        0x161
    } else {
        0x160
    };
    let out = ok(&upnvme(&[
        "set-feature",
        "-d",
        &dev,
        "-f",
        "4",
        "-V",
        &format!("{new:#x}"),
    ]));
    assert!(
        out.starts_with("set-feature:0x04 (Temperature Threshold)"),
        "{out}"
    );
    let out = ok(&upnvme(&["get-feature", "-d", &dev, "-f", "4"]));
    assert_eq!(value(&out) & 0xffff, new, "{out}");
    ok(&upnvme(&[
        "set-feature",
        "-d",
        &dev,
        "-f",
        "4",
        "-V",
        &format!("{before:#x}"),
    ]));
    assert_eq!(
        value(&ok(&upnvme(&["get-feature", "-d", &dev, "-f", "4"]))),
        before
    );
    // Host Behavior Support (16h): 512 bytes, as a hex dump; raw, sent back.
    let out = ok(&upnvme(&["get-feature", "-d", &dev, "-f", "0x16"]));
    assert_eq!(out.lines().count(), 2 + 32, "{out}");
    let o = upnvme(&["get-feature", "-d", &dev, "-f", "0x16", "-b"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout.len(), 512);
    fs::write("/tmp/hbs-feature.bin", &o.stdout).unwrap();
    let out = ok(&upnvme(&[
        "set-feature",
        "-d",
        &dev,
        "-f",
        "0x16",
        "--data",
        "/tmp/hbs-feature.bin",
    ]));
    assert!(
        out.starts_with("set-feature:0x16 (Host Behavior Support)"),
        "{out}"
    );
    // SMART / Health Information: 512 bytes.
    let out = ok(&upnvme(&["get-log", "-d", &dev, "-i", "2", "-l", "512"]));
    assert!(out.starts_with("Device log page 0x02, 512 bytes"), "{out}");
    assert_eq!(out.lines().count(), 2 + 32, "{out}");
    // In pieces of 128 bytes (four Get Log Page commands at increasing
    // offsets): the same bytes as one command reads (Power On Hours and
    // Unsafe Shutdowns, bytes 128..160, left out: they may move).
    let raw = |extra: &[&str]| {
        let mut args = vec!["get-log", "-d", dev.as_str(), "-i", "2", "-l", "512", "-b"];
        args.extend_from_slice(extra);
        let o = upnvme(&args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        o.stdout
    };
    let (whole, pieces) = (raw(&[]), raw(&["--xfer-len", "128"]));
    assert_eq!((whole.len(), pieces.len()), (512, 512));
    assert_eq!(whole[..128], pieces[..128]);
    assert_eq!(whole[160..], pieces[160..]);
    // Refusals: a length not in dwords, a non-zero Keep Alive Timeout, a
    // data structure without its data.
    for (args, says) in [
        (vec!["get-log", "-i", "2", "-l", "510"], "multiple of 4"),
        (vec!["set-feature", "-f", "0x0f", "-V", "5"], "Keep Alive"),
        (
            vec!["set-feature", "-f", "0x16"],
            "pass it with --data FILE",
        ),
    ] {
        let mut all = args.clone();
        all.extend(["-d", dev.as_str()]);
        let o = upnvme(&all);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
}

/// `get-feature -H`: Number of Queues decoded into counts that cover the
/// I/O queue pairs the driver was granted (and no more than the VM's
/// max_ioqpairs); Temperature Threshold in kelvin and °C, matching the raw
/// value; Host Behavior Support's bytes in words instead of a hex dump;
/// Select 3 as capabilities; -H with -b is a usage error.
#[test]
fn get_feature_human_readable_decodes_the_values() {
    let dev = device();
    let max_pairs = env_u64("UPNVME_VM_MAX_IOQPAIRS");
    let granted = json(&upnvme(&["identify", "-d", &dev, "--json"]))["granted_io_queue_pairs"]
        .as_u64()
        .unwrap();
    let raw_value = |out: &str| -> u32 {
        let first = out.lines().next().unwrap();
        let hex = first.rsplit("value:0x").next().unwrap();
        u32::from_str_radix(&hex[..8], 16).unwrap_or_else(|e| panic!("{out}: {e}"))
    };
    let out = ok(&upnvme(&["get-feature", "-d", &dev, "-f", "7", "-H"]));
    assert!(
        out.starts_with("get-feature:0x07 (Number of Queues), Current value:0x"),
        "{out}"
    );
    let v = raw_value(&out);
    let (nsqa, ncqa) = (u64::from(v & 0xffff), u64::from(v >> 16));
    for want in [
        format!(
            "  Number of I/O Completion Queues Allocated (NCQA): {ncqa} ({} queues)",
            ncqa + 1
        ),
        format!(
            "  Number of I/O Submission Queues Allocated (NSQA): {nsqa} ({} queues)",
            nsqa + 1
        ),
    ] {
        assert!(
            out.lines().any(|l| l == want),
            "{want:?} missing from\n{out}"
        );
    }
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(nsqa.min(ncqa) + 1 >= granted, "granted {granted}: {out}");
    assert!(
        nsqa.max(ncqa) < max_pairs,
        "max_ioqpairs {max_pairs}: {out}"
    );

    let out = ok(&upnvme(&["get-feature", "-d", &dev, "-f", "4", "-H"]));
    let k = raw_value(&out) & 0xffff;
    for want in [
        format!(
            "  Temperature Threshold (TMPTH): {k} K ({} °C)",
            i64::from(k) - 273
        ),
        "  Threshold Temperature Select (TMPSEL): 0 (Composite Temperature)".to_string(),
        "  Threshold Type Select (THSEL): 0 (Over Temperature Threshold)".to_string(),
    ] {
        assert!(
            out.lines().any(|l| l == want),
            "{want:?} missing from\n{out}"
        );
    }

    let out = ok(&upnvme(&["get-feature", "-d", &dev, "-f", "0x16", "-H"]));
    assert!(
        out.lines()
            .any(|l| l.starts_with("  Advanced Command Retry Enable (ACRE): ")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("  LBA Format Extension Enable (LBAFEE): ")),
        "{out}"
    );
    // Decoded instead of the 32-line hex dump.
    assert!(out.lines().count() <= 5, "{out}");

    let out = ok(&upnvme(&["get-feature", "-d", &dev, "-f", "0x0b", "-H"]));
    assert!(
        out.lines()
            .any(|l| l.starts_with("  [ 8] Namespace Attribute Notices (NAN): ")),
        "{out}"
    );

    let out = ok(&upnvme(&[
        "get-feature",
        "-d",
        &dev,
        "-f",
        "7",
        "-s",
        "3",
        "-H",
    ]));
    assert!(
        out.starts_with("get-feature:0x07 (Number of Queues), Supported capabilities value:0x"),
        "{out}"
    );
    assert!(out.contains("\n  [0] saveable: "), "{out}");

    let err = fails(
        &upnvme(&["get-feature", "-d", &dev, "-f", "7", "-H", "-b"]),
        2,
    );
    assert!(err.contains("cannot be used with"), "{err}");
}

/// `error-log`: QEMU keeps ELPE + 1 entries and records no errors in them
/// (its Error Information log is all zeros), so every entry read is
/// skipped as not valid (Error Count 0); `-e` reads fewer. `fw-log`:
/// QEMU's AFI is 01h (slot 1 active, nothing at the next reset) and slot
/// 1 carries a revision; FR is Identify Controller's. (QEMU reports "1.0"
/// in FRS1 but its own version in FR, so the two are not compared.)
#[test]
fn error_log_and_fw_log() {
    let dev = device();
    let id = json(&upnvme(&["identify", "-d", &dev, "--json"]));
    let elpe = id["controller"]["elpe"].as_u64().unwrap();
    let v = json(&upnvme(&["error-log", "-d", &dev, "--json"]));
    assert_eq!(v["device"], dev.as_str());
    assert_eq!(v["elpe"], elpe);
    assert_eq!(v["entries_read"], elpe + 1, "{v}");
    assert_eq!(v["entries"], serde_json::json!([]), "{v}");
    let t = ok(&upnvme(&["error-log", "-d", &dev]));
    assert_eq!(
        t,
        format!(
            "Error Information log of {dev}: {} entries read (Identify Controller ELPE {elpe}: \
             the controller keeps {}), 0 in use\n",
            elpe + 1,
            elpe + 1
        )
    );
    let v = json(&upnvme(&["error-log", "-d", &dev, "-e", "1", "--json"]));
    assert_eq!(v["entries_read"], 1, "{v}");
    let err = fails(&upnvme(&["error-log", "-d", &dev, "-e", "0"]), 2);
    assert!(err.contains("1 to 256 entries"), "{err}");

    let fr = id["controller"]["fr"].as_str().unwrap().to_string();
    let v = json(&upnvme(&["fw-log", "-d", &dev, "--json"]));
    assert_eq!(v["device"], dev.as_str());
    assert_eq!(v["afi"], 1, "{v}");
    assert_eq!(v["active_slot"], 1, "{v}");
    assert_eq!(v["next_reset_slot"], Value::Null, "{v}");
    assert_eq!(v["frmw"], id["controller"]["frmw"]);
    assert_eq!(v["fr"], fr.as_str());
    let slots = v["slots"].as_array().unwrap();
    assert_eq!(slots[0]["slot"], 1, "{v}");
    let rev = slots[0]["revision"].as_str().unwrap().to_string();
    assert!(!rev.is_empty() && rev.trim() == rev, "{v}");
    let t = ok(&upnvme(&["fw-log", "-d", &dev]));
    for want in [
        format!("Firmware Slot Information log of {dev}"),
        "  afi   : 0x01 (active slot 1, next reset: none)".to_string(),
        format!("  frs1  : {rev} (active)"),
        format!("  fr    : {fr}"),
    ] {
        assert!(t.lines().any(|l| l == want), "{want:?} missing from\n{t}");
    }
}

#[test]
fn identify_fields_equal_the_vm_options() {
    let prefix = env("UPNVME_VM_SERIAL_PREFIX");
    let mdts = env_u64("UPNVME_VM_MDTS");
    let mqes = env_u64("UPNVME_VM_MQES");
    let namespaces = env_u64("UPNVME_VM_NAMESPACES");
    let lba = env_u64("UPNVME_VM_LBA_SIZE");
    let disk = env_u64("UPNVME_VM_DISK_SIZE");
    let max_pairs = env_u64("UPNVME_VM_MAX_IOQPAIRS");
    for (i, dev) in devices().iter().enumerate() {
        let v = json(&upnvme(&["identify", "-d", dev, "--json"]));
        assert_eq!(v["device"], dev.as_str());
        let c = &v["controller"];
        assert_eq!(c["mn"], "QEMU NVMe Ctrl");
        assert_eq!(c["sn"], format!("{prefix}{i}"), "serial of {dev}");
        assert_eq!(c["mdts"], mdts, "MDTS of {dev}");
        assert!(c["nn"].as_u64().unwrap() >= namespaces, "{c}");
        assert_eq!(v["registers"]["mqes"], mqes, "CAP.MQES of {dev}");
        assert_eq!(
            v["registers"]["max_queue_entries"],
            mqes + 1,
            "CAP.MQES + 1 of {dev}"
        );
        let cap_hex = v["registers"]["cap_hex"].as_str().unwrap();
        assert_eq!(
            u64::from_str_radix(cap_hex.trim_start_matches("0x"), 16).unwrap(),
            v["registers"]["cap"].as_u64().unwrap(),
            "{cap_hex}"
        );
        assert_eq!(v["max_transfer_bytes"], 4096u64 << mdts);
        // CRDT1..3 and OCFS as Identify Controller reports them.
        assert_eq!(c["crdt"].as_array().map(Vec::len), Some(3), "{c}");
        assert!(c["ocfs"].is_u64(), "{c}");
        let granted = v["granted_io_queue_pairs"].as_u64().unwrap();
        assert!((1..=max_pairs).contains(&granted), "granted {granted}");
        // The admin SQ is in memory mapped read-only for the device.
        let ro = &v["read_only_memory"];
        assert_eq!(ro["state"], "enforced", "{ro}");
        assert_eq!(ro["allocations"], 0, "{ro}");
        let ns = v["namespaces"].as_array().unwrap();
        assert_eq!(ns.len() as u64, namespaces, "namespaces of {dev}");
        for (k, n) in ns.iter().enumerate() {
            assert_eq!(n["nsid"], k as u64 + 1);
            assert_eq!(n["lba_size"], lba, "LBA size of {dev} ns {}", k + 1);
            assert_eq!(n["size_bytes"], disk, "size of {dev} ns {}", k + 1);
            assert_eq!(n["nsze"], disk / lba);
        }
        // The text form shows the same.
        let t = ok(&upnvme(&["identify", "-d", dev]));
        assert!(t.contains(&format!("  sn      : {prefix}{i}\n")), "{t}");
        assert!(t.contains("  mn      : QEMU NVMe Ctrl\n"), "{t}");
        assert!(t.contains("  crdt    : "), "{t}");
        assert!(
            t.contains("  SQs and list pages      : read-only for the device\n"),
            "{t}"
        );
        assert!(t.contains(&format!("  mdts    : {mdts} (")), "{t}");
        // QEMU's MDTS (7: 512 KiB) is below the driver's 4 MiB cap.
        if mdts != 0 && 4096u64 << mdts <= 4 << 20 {
            let size = 4096u64 << mdts;
            let human = if size >= 1 << 20 {
                format!("{:.2} MiB", size as f64 / f64::from(1 << 20))
            } else {
                format!("{:.2} KiB", size as f64 / 1024.0)
            };
            assert!(
                t.contains(&format!("  mdts    : {mdts} ({human} max transfer)\n")),
                "{t}"
            );
        }
        assert!(
            t.contains(&format!("mqes {mqes}: {} entries", mqes + 1)),
            "{t}"
        );
        assert_eq!(t.matches("\nNamespace ").count() as u64, namespaces, "{t}");
        assert!(t.contains(&format!("  lba size: {lba} bytes")), "{t}");
        // One namespace only.
        let v = json(&upnvme(&["identify", "-d", dev, "--nsid", "1", "--json"]));
        assert_eq!(v["namespaces"].as_array().unwrap().len(), 1);
        let t = ok(&upnvme(&["identify", "-d", dev, "--nsid", "1"]));
        assert!(t.starts_with("Namespace 1\n"), "{t}");
    }
}

/// `identify -H`: the capability fields in words, text and JSON alike, and
/// true to QEMU's controller (SGLs without alignment requirement, Doorbell
/// Buffer Config, the LBA format in use).
#[test]
fn identify_human_readable_decodes_the_capabilities() {
    let dev = device();
    let lba = env_u64("UPNVME_VM_LBA_SIZE");
    let t = ok(&upnvme(&["identify", "-d", &dev, "-H"]));
    for want in [
        "  oacs    : 0x",
        "[ 8] Doorbell Buffer Config: supported",
        "  oncs    : 0x",
        "[ 2] Dataset Management: supported",
        "[1:0] SGLs for NVM commands: supported, no alignment or granularity requirement",
        "[15:8] SGL Descriptor Threshold: not reported",
        "  ocfs    : 0x",
        "[ 0] Copy Format 0h (16-bit guard protection information): supported",
        "  vwc     : 0x",
        "  dps     : 0x",
        "[2:0] protection information: protection information disabled",
    ] {
        assert!(t.contains(want), "{want:?} missing from\n{t}");
    }
    assert!(
        t.contains(&format!("data {lba} bytes, metadata 0 bytes")) && t.contains("(in use)"),
        "{t}"
    );
    let v = json(&upnvme(&["identify", "-d", &dev, "--json", "-H"]));
    let d = &v["controller"]["decoded"];
    assert_eq!(d["oncs"]["value"], v["controller"]["oncs"]);
    assert_eq!(
        d["sgls"]["decoded"][0],
        "[1:0] SGLs for NVM commands: supported, no alignment or granularity requirement"
    );
    let ns = &v["namespaces"][0]["decoded"];
    assert!(
        ns["lbaf"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().contains("(in use)"))
    );
    assert!(ns["flbas"]["decoded"][0].is_string());
}

#[test]
fn list_and_smart_log() {
    let prefix = env("UPNVME_VM_SERIAL_PREFIX");
    let namespaces = env_u64("UPNVME_VM_NAMESPACES");
    let out = ok(&upnvme(&["list"]));
    for (i, dev) in devices().iter().enumerate() {
        let line = out
            .lines()
            .find(|l| l.starts_with(dev.as_str()))
            .unwrap_or_else(|| panic!("{dev} missing from\n{out}"));
        assert!(line.contains("vfio-pci"), "{line}");
        assert!(line.contains("QEMU NVMe Ctrl"), "{line}");
        assert!(line.contains(&format!("{prefix}{i}")), "{line}");
        assert!(
            line.split_whitespace().any(|w| w == namespaces.to_string()),
            "{line}"
        );
    }
    if let Some(k) = kernel_nvme() {
        let line = out.lines().find(|l| l.starts_with(&k)).unwrap();
        assert!(line.contains("nvme"), "{line}");
    }
    let dev = device();
    let v = json(&upnvme(&["smart-log", "-d", &dev, "--json"]));
    assert!(v["temperature_kelvin"].as_u64().unwrap() > 200);
    assert_eq!(v["critical_warning"], 0);
    let t = ok(&upnvme(&["smart-log", "-d", &dev]));
    assert!(t.contains("temperature"), "{t}");
    assert!(t.contains("host_read_commands"), "{t}");
}

#[test]
fn default_device_is_the_only_vfio_bound_controller() {
    let o = upnvme(&["identify", "--json"]);
    match devices().as_slice() {
        [one] => assert_eq!(json(&o)["device"], one.as_str()),
        many => {
            let err = fails(&o, 1);
            assert_eq!(
                err.trim(),
                format!(
                    "upnvme: several vfio-bound NVMe controllers ({}); choose one with --device",
                    many.join(", ")
                )
            );
        }
    }
}

// ---------------------------------------------------------------- setup

#[test]
fn setup_status_describes_the_test_bed() {
    let devs = devices();
    let kernel = kernel_nvme();
    let text = ok(&upnvme(&["setup", "status"]));
    assert!(text.starts_with("IOMMU: on, "), "{text}");
    assert!(text.contains("intel_iommu=on"), "{text}");
    assert!(text.contains("Drivers: vfio-pci loaded"), "{text}");
    assert!(text.contains("\n  2 MiB "), "{text}");
    for d in &devs {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(d.as_str()))
            .unwrap_or_else(|| panic!("{d} missing:\n{text}"));
        assert!(line.contains("vfio-pci"), "{line}");
        assert!(line.contains(" yes    yes "), "viable and ready: {line}");
    }

    let v = json(&upnvme(&["setup", "status", "--json"]));
    assert_eq!(v["iommu"]["enabled"], true);
    assert!(v["iommu"]["groups"].as_u64().unwrap() >= devs.len() as u64);
    assert_eq!(v["iommu"]["advice"], Value::Null);
    assert_eq!(v["drivers"]["vfio-pci"], true);
    assert_eq!(v["drivers"]["nvme"], kernel.is_some());
    let pools = v["hugepages"].as_array().unwrap();
    let two_mib = pools.iter().find(|p| p["size_kib"] == 2048).unwrap();
    assert_eq!(two_mib["reserved"], env_u64("UPNVME_VM_HUGEPAGES"));
    assert!(two_mib["free"].as_u64().unwrap() > 0);
    let ctrls = v["controllers"].as_array().unwrap();
    assert_eq!(ctrls.len(), devs.len() + usize::from(kernel.is_some()));
    for d in &devs {
        let c = ctrls.iter().find(|c| c["address"] == d.as_str()).unwrap();
        assert_eq!(c["driver"], "vfio-pci");
        assert_eq!(c["driver_override"], "vfio-pci");
        assert_eq!(c["iommu_group"], iommu_group(d));
        assert_eq!(c["group_viable"], true);
        assert_eq!(c["ready"], true);
        assert_eq!(c["vendor"], "1b36");
        assert_eq!(c["advice"], Value::Null);
        assert!(c["block_devices"].as_array().unwrap().is_empty());
    }
    if let Some(k) = &kernel {
        let c = ctrls.iter().find(|c| c["address"] == k.as_str()).unwrap();
        assert_eq!(c["driver"], "nvme");
        assert_eq!(c["ready"], false);
        assert_eq!(c["group_viable"], true);
        let names: Vec<&str> = c["block_devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, namespaces_of(k));
        assert_eq!(names.len() as u64, env_u64("UPNVME_VM_NAMESPACES"));
        assert!(c["in_use"].as_array().unwrap().is_empty());
        assert_eq!(
            c["advice"],
            format!("{k}: bind it with `upnvme setup bind {k}`")
        );
    }
}

#[test]
fn setup_unbind_and_bind_round_trip() {
    let _restore = RebindAll;
    let devs = devices();
    let dev = devs.last().unwrap().clone();
    let kernel = kernel_nvme();
    let group = iommu_group(&dev);

    // While a process holds the VFIO group, unbind refuses and changes nothing.
    let held = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/dev/vfio/{group}"))
        .unwrap();
    let err = fails(&upnvme(&["setup", "unbind", &dev]), 1);
    assert_eq!(
        err.trim(),
        format!(
            "upnvme: refusing to unbind {dev}: its VFIO group /dev/vfio/{group} is open by pid {} ({}) (unbinding would wait until it is closed); stop that process first, then run `upnvme setup unbind {dev}` again; nothing was changed",
            std::process::id(),
            my_comm()
        )
    );
    assert_eq!(driver_of(&dev).as_deref(), Some("vfio-pci"));
    drop(held);

    // Unbind: to nvme when the kernel's driver is loaded, else to no driver.
    let out = ok(&upnvme(&["setup", "unbind", &dev]));
    let want = kernel.as_ref().map(|_| "nvme");
    assert_eq!(wait_for_driver(&dev, want).as_deref(), want, "{out}");
    let override_now = fs::read_to_string(pci_dir(&dev).join("driver_override")).unwrap();
    assert_eq!(override_now.trim(), "(null)", "driver_override cleared");
    match want {
        Some(d) => assert_eq!(out.trim(), format!("{dev}: vfio-pci -> {d}")),
        None => assert_eq!(
            out.trim(),
            format!(
                "{dev}: vfio-pci -> no driver: the kernel's nvme driver is not loaded; load it (`modprobe nvme`) and run `upnvme setup unbind {dev}` again to hand the controller to it"
            )
        ),
    }
    // upnvme cannot open it now, and says how to fix that.
    let err = fails(&upnvme(&["identify", "-d", &dev]), 1);
    assert!(err.contains("upnvme setup"), "{err}");
    let v = json(&upnvme(&["setup", "status", "--json"]));
    let c = v["controllers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["address"] == dev.as_str())
        .unwrap()
        .clone();
    assert_eq!(c["ready"], false);
    assert_eq!(
        c["advice"],
        format!("{dev}: bind it with `upnvme setup bind {dev}`")
    );

    // Bind it back, twice: the second is a no-op.
    let out = ok(&upnvme(&["setup", "bind", &dev]));
    assert_eq!(
        out.trim(),
        format!(
            "{dev}: {} -> vfio-pci (IOMMU group {group}, /dev/vfio/{group})",
            want.unwrap_or("no driver")
        )
    );
    assert_eq!(driver_of(&dev).as_deref(), Some("vfio-pci"));
    let out = ok(&upnvme(&["setup", "bind", &dev]));
    assert_eq!(
        out.trim(),
        format!("{dev}: already bound to vfio-pci (IOMMU group {group})")
    );
    let v = json(&upnvme(&["identify", "-d", &dev, "--json"]));
    assert_eq!(
        v["controller"]["sn"],
        format!("{}{}", env("UPNVME_VM_SERIAL_PREFIX"), devs.len() - 1)
    );

    // Without addresses (only where no kernel controller would be taken too):
    // unbind every vfio-bound controller, then bind them all back.
    if kernel.is_none() {
        let out = ok(&upnvme(&["setup", "unbind"]));
        for d in &devs {
            assert!(
                out.contains(&format!("{d}: vfio-pci -> no driver")),
                "{out}"
            );
            assert_eq!(driver_of(d), None);
        }
        let out = ok(&upnvme(&["setup", "bind"]));
        for d in &devs {
            assert!(
                out.contains(&format!("{d}: no driver -> vfio-pci")),
                "{out}"
            );
            assert_eq!(driver_of(d).as_deref(), Some("vfio-pci"));
        }
        let out = ok(&upnvme(&["setup", "bind"]));
        assert_eq!(out.lines().count(), devs.len(), "{out}");
        assert!(out.lines().all(|l| l.contains("already bound")), "{out}");
    }
    for d in &devs {
        ok(&upnvme(&["smart-log", "-d", d]));
    }
}

/// Turns a swap area off when dropped.
struct SwapOff(String);

impl Drop for SwapOff {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(&self.0).status();
    }
}

/// Unmounts when dropped.
struct Unmount(&'static str);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0).status();
    }
}

#[test]
fn setup_bind_refuses_namespaces_in_use() {
    let Some(k) = kernel_nvme() else {
        // Only the --kernel-nvme configuration has namespaces the kernel uses.
        return;
    };
    let _restore = RebindAll;
    let ns = namespaces_of(&k);
    assert!(ns.len() >= 2, "{ns:?}");
    let (n1, n2) = (ns[0].clone(), ns[1].clone());
    let refused = |reason: &str| {
        format!(
            "upnvme: refusing to bind {k} to vfio-pci: its namespaces are in use, and binding would pull them from under their users: {reason}; then run `upnvme setup bind {k}` again; nothing was changed"
        )
    };

    // Swap on the first namespace.
    let dev1 = format!("/dev/{n1}");
    let st = Command::new("mkswap").arg(&dev1).output().unwrap();
    assert!(st.status.success(), "mkswap: {}", stderr(&st));
    let st = Command::new("swapon").arg(&dev1).output().unwrap();
    assert!(st.status.success(), "swapon: {}", stderr(&st));
    let swap = SwapOff(dev1.clone());
    let err = fails(&upnvme(&["setup", "bind", &k]), 1);
    assert_eq!(
        err.trim(),
        refused(&format!(
            "{n1} is an active swap area: turn it off first (`swapoff {dev1}`)"
        ))
    );
    assert_eq!(driver_of(&k).as_deref(), Some("nvme"));
    // Several addresses: one refusal changes nothing for the others either.
    let dev = devices()[0].clone();
    let err = fails(&upnvme(&["setup", "bind", &dev, &k]), 1);
    assert!(err.contains("nothing was changed"), "{err}");
    // Without addresses, the controller in use is skipped and the rest bound.
    let out = ok(&upnvme(&["setup", "bind"]));
    assert!(
        out.contains(&format!(
            "{k}: skipped, in use: {n1} is an active swap area"
        )),
        "{out}"
    );
    for d in devices() {
        assert!(
            out.contains(&format!("{d}: already bound to vfio-pci")),
            "{out}"
        );
    }
    assert_eq!(driver_of(&k).as_deref(), Some("nvme"));
    // status shows why.
    let v = json(&upnvme(&["setup", "status", "--json"]));
    let c = v["controllers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["address"] == k.as_str())
        .unwrap()
        .clone();
    assert_eq!(c["block_devices"][0]["swap"], true);
    assert_eq!(c["in_use"].as_array().unwrap().len(), 1);
    let text = ok(&upnvme(&["setup", "status"]));
    assert!(text.contains(&format!("{n1} (in use)")), "{text}");
    drop(swap);

    // Open by a process (this test).
    let held = fs::File::open(format!("/dev/{n2}")).unwrap();
    let err = fails(&upnvme(&["setup", "bind", &k]), 1);
    assert_eq!(
        err.trim(),
        refused(&format!(
            "/dev/{n2} is open by pid {} ({}): stop that process first",
            std::process::id(),
            my_comm()
        ))
    );
    drop(held);

    // Mounted. The test bed's kernel has no disk file system loaded, so this
    // mounts a tmpfs whose source is the namespace's device node: the mount
    // table then names the block device exactly as for a real file system.
    fs::create_dir_all("/tmp/mnt-in-use").unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", &format!("/dev/{n2}"), "/tmp/mnt-in-use"])
        .output()
        .unwrap();
    assert!(st.status.success(), "mount: {}", stderr(&st));
    let mounted = Unmount("/tmp/mnt-in-use");
    let err = fails(&upnvme(&["setup", "bind", &k]), 1);
    assert_eq!(
        err.trim(),
        refused(&format!(
            "{n2} is mounted at /tmp/mnt-in-use: unmount it first (`umount /tmp/mnt-in-use`)"
        ))
    );
    drop(mounted);
    assert_eq!(driver_of(&k).as_deref(), Some("nvme"));
}

#[test]
fn setup_rejects_what_is_not_an_nvme_controller() {
    let err = fails(&upnvme(&["setup", "bind", "0000:00:00.0"]), 1);
    assert!(
        err.contains("PCI device 0000:00:00.0 has class 0x060000, not an NVMe controller"),
        "{err}"
    );
    let err = fails(&upnvme(&["setup", "unbind", "0000:00:1e.6"]), 1);
    assert!(err.contains("no PCI device at 0000:00:1e.6"), "{err}");
    // A malformed address is a usage error.
    let err = fails(&upnvme(&["setup", "bind", "00:04"]), 2);
    assert!(err.contains("invalid PCI address '00:04'"), "{err}");
    // The old form is a usage error.
    let err = fails(&upnvme(&["setup", &device()]), 2);
    assert!(err.contains("unrecognized subcommand"), "{err}");
    fails(&upnvme(&["setup"]), 2);
}

/// A perf run whose buffers do not fit the reserved hugepages says what the
/// whole run needs, so one `upnvme setup hugepages N` with the figure it
/// gives is enough (the library's own figure covers the one buffer that
/// failed: a retry per buffer).
#[test]
fn perf_short_of_hugepages_sizes_the_advice_for_the_whole_run() {
    // 128 commands in flight need a queue of more than 128 entries.
    let mqes: u32 = std::env::var("UPNVME_VM_MQES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2047);
    if mqes < 128 {
        eprintln!("skipped: CAP.MQES {mqes} holds no queue depth of 128");
        return;
    }
    let pool = RestoreHugepages::new(2048).unwrap();
    let free = |p: &RestoreHugepages| -> u64 {
        let dir = p.path.parent().unwrap();
        fs::read_to_string(dir.join("free_hugepages"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    // 16 MiB free: enough to bring the controller up, not for 32 MiB of
    // buffers (-q 128 x 256 KiB).
    let in_use = pool.now() - free(&pool);
    fs::write(&pool.path, (in_use + 8).to_string()).unwrap();
    let dev = device();
    // One namespace: one queue pair, whatever the configuration has.
    let args = [
        "perf", "-d", &dev, "-n", "1", "-q", "128", "-o", "262144", "-t", "1", "--warmup", "0",
    ];
    let err = fails(&upnvme(&args), 1);
    assert!(
        err.contains(
            "this run needs about 32 MiB of buffers (1 queue pair(s) x -q 128 x 262144 bytes)"
        ),
        "{err}"
    );
    let want = err
        .rsplit("`upnvme setup hugepages ")
        .next()
        .and_then(|t| t.split('`').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no hugepage count in: {err}"));
    assert!(want >= in_use + 16, "{want} cannot hold 32 MiB more: {err}");
    ok(&upnvme(&["setup", "hugepages", &want.to_string()]));
    let out = ok(&upnvme(&args));
    assert!(out.contains("IOPS"), "{out}");
    drop(pool);
}

#[test]
fn setup_hugepages_reserves_and_reports() {
    let pool = RestoreHugepages::new(2048).unwrap();
    let before = pool.now();
    let raised = (before + 2).to_string();
    let out = ok(&upnvme(&["setup", "hugepages", &raised]));
    assert_eq!(pool.now(), before + 2);
    assert!(
        out.starts_with(&format!("2 MiB hugepages: {} reserved (", before + 2)),
        "{out}"
    );
    assert!(
        out.trim_end()
            .ends_with(&format!("asked for {raised}, was {before}")),
        "{out}"
    );
    let out = ok(&upnvme(&[
        "setup",
        "hugepages",
        &before.to_string(),
        "--size",
        "2M",
    ]));
    assert_eq!(pool.now(), before, "{out}");
    let v = json(&upnvme(&["setup", "status", "--json"]));
    let p = v["hugepages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["size_kib"] == 2048)
        .unwrap()
        .clone();
    assert_eq!(p["reserved"], before);

    // A count beyond the guest's memory (a typo) is refused before the
    // kernel is asked, so it cannot take every free page.
    let err = fails(&upnvme(&["setup", "hugepages", "100000000"]), 2);
    assert!(err.contains("are more than this system can give"), "{err}");
    assert_eq!(pool.now(), before);

    // A 1 GiB page cannot be carved out of this 1 GiB guest at run time: it is
    // refused as more than the guest has available (exit 2), or, when the
    // kernel estimates enough, the error says how many the kernel gave and
    // what to do (exit 1).
    let giant = RestoreHugepages::new(1 << 20);
    let o = upnvme(&["setup", "hugepages", "1", "--size", "1G"]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    if giant.is_none() {
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("offers no 1 GiB hugepages"), "{err}");
    } else if o.status.code() == Some(2) {
        assert!(
            err.starts_with(
                "upnvme: 1 1 GiB hugepages (1024 MiB) are more than this system can give"
            ),
            "{err}"
        );
    } else {
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.starts_with("upnvme: only 0 of 1 1 GiB hugepages could be reserved"),
            "{err}"
        );
        assert!(err.contains("`hugepagesz=1G hugepages=1`"), "{err}");
    }
    drop(giant);
    // A size the kernel does not offer.
    let err = fails(&upnvme(&["setup", "hugepages", "1", "--size", "4M"]), 1);
    assert!(
        err.starts_with("upnvme: the kernel offers no 4 MiB hugepages; sizes offered: 2 MiB"),
        "{err}"
    );
    fails(&upnvme(&["setup", "hugepages", "1", "--size", "4X"]), 2);
}

// ---------------------------------------------------------------- perf

/// `upnvme perf -d DEV --io-count 200 --warmup 0 EXTRA…`.
fn perf(extra: &[&str]) -> Output {
    let dev = device();
    let mut args = vec!["perf", "-d", &dev, "--io-count", "200", "--warmup", "0"];
    args.extend_from_slice(extra);
    upnvme(&args)
}

fn perf_json(extra: &[&str]) -> Value {
    let mut args = extra.to_vec();
    args.push("--json");
    let v = json(&perf(&args));
    let jobs = v["jobs"].as_array().unwrap();
    assert!(!jobs.is_empty());
    for j in jobs {
        assert_eq!(j["ios"], 200, "{extra:?}: {j}");
        assert_eq!(j["errors"], 0, "{extra:?}: {j}");
    }
    v
}

/// The fields docs/perf.md documents, all present.
fn assert_documented_fields(v: &Value) {
    for k in [
        "device",
        "interrupted",
        "model",
        "workload",
        "read_percent",
        "io_size",
        "queue_depth",
        "seconds",
        "warmup_seconds",
        "io_count",
        "cores",
        "sq_entries",
        "cq_entries",
        "seed",
        "reap_on_submit",
        "ring_per_io",
        "shadow_doorbells",
        "data_pointer",
        "doorbell_buffer",
        "cq_head_policy",
        "tsc_hz",
        "jobs",
        "total",
        "histogram_us_count",
        "verify",
        "verify_error",
        "verify_mismatches",
    ] {
        assert!(v.get(k).is_some(), "{k} missing from {v}");
    }
    let latency = |l: &Value| {
        for k in ["mean_us", "min_us", "max_us", "stdev_us"] {
            assert!(l[k].is_number(), "{k} in {l}");
        }
        for p in [
            "p1", "p10", "p50", "p90", "p99", "p99.9", "p99.99", "p99.999",
        ] {
            assert!(l["percentiles_us"][p].as_f64().unwrap() > 0.0, "{p} in {l}");
        }
    };
    let transport = |t: &Value| {
        for k in [
            "submissions",
            "completions",
            "polls",
            "idle_polls",
            "sq_doorbell_mmio",
            "cq_doorbell_mmio",
            "sq_shadow_updates",
            "cq_shadow_updates",
            "cq_doorbell_skipped",
            "mmio_skipped_by_event_idx",
        ] {
            assert!(t[k].is_u64(), "{k} in {t}");
        }
        for k in ["mmio_per_io", "sq_mmio_per_io", "cq_mmio_per_io"] {
            assert!(t[k].is_number(), "{k} in {t}");
        }
    };
    for j in v["jobs"].as_array().unwrap() {
        for k in [
            "core",
            "nsid",
            "ios",
            "errors",
            "seconds",
            "iops",
            "mib_per_s",
        ] {
            assert!(j[k].is_number(), "{k} in {j}");
        }
        latency(&j["latency"]);
        transport(&j["transport"]);
    }
    let t = &v["total"];
    for k in ["ios", "errors", "iops", "mib_per_s"] {
        assert!(t[k].is_number(), "{k} in {t}");
    }
    latency(&t["latency"]);
    transport(&t["transport"]);
    let h = v["histogram_us_count"].as_array().unwrap();
    let n: u64 = h.iter().map(|b| b[1].as_u64().unwrap()).sum();
    assert_eq!(n, t["ios"].as_u64().unwrap(), "histogram counts every I/O");
}

#[test]
fn perf_json_has_the_documented_fields() {
    let dev = device();
    let namespaces = env_u64("UPNVME_VM_NAMESPACES");
    let v = perf_json(&["-q", "2", "--seed", "42"]);
    assert_documented_fields(&v);
    assert_eq!(v["device"], dev.as_str());
    assert_eq!(v["model"], "QEMU NVMe Ctrl");
    assert_eq!(v["workload"], "randread");
    assert_eq!(v["read_percent"], 100);
    assert_eq!(v["io_size"], 4096);
    assert_eq!(v["queue_depth"], 2);
    assert_eq!(v["seconds"], 0);
    assert_eq!(v["warmup_seconds"], 0);
    assert_eq!(v["io_count"], 200);
    assert_eq!(v["cores"], serde_json::json!([0]));
    assert_eq!(v["seed"], 42);
    assert_eq!(v["reap_on_submit"], false);
    assert_eq!(v["data_pointer"], "auto");
    assert_eq!(v["cq_head_policy"], "adaptive");
    assert_eq!(v["verify_mismatches"], Value::Null);
    assert_eq!(v["verify"], Value::Null);
    assert!(v["tsc_hz"].as_f64().unwrap() > 1e8);
    // One job per namespace on core 0; every I/O counted once.
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.len() as u64, namespaces);
    assert_eq!(v["total"]["ios"], 200 * namespaces);
    assert!(v["total"]["transport"]["completions"].as_u64().unwrap() >= 200 * namespaces);
}

#[test]
fn perf_runs_with_and_without_each_option() {
    let mqes = env_u64("UPNVME_VM_MQES");
    let namespaces = env_u64("UPNVME_VM_NAMESPACES");

    // Without any option.
    let base = perf_json(&[]);
    assert_eq!(base["reap_on_submit"], false);
    assert_eq!(base["cq_head_policy"], "adaptive");
    // The library's default: MMIO doorbells only, no Doorbell Buffer Config.
    assert_eq!(base["shadow_doorbells"], false, "{base}");
    assert_eq!(base["doorbell_buffer"], false, "{base}");
    // MMIO doorbells announce once per batch, whatever `SqAnnounce` says.
    assert_eq!(base["sq_announce"], "batch", "{base}");
    assert_eq!(base["total"]["transport"]["sq_shadow_updates"], 0);
    assert_eq!(base["total"]["transport"]["mmio_skipped_by_event_idx"], 0);
    // The buffer on request, where the controller offers it (QEMU's does).
    let buffered = perf_json(&["--doorbell-buffer"]);
    let has_dbbc = buffered["doorbell_buffer"].as_bool().unwrap();
    assert_eq!(buffered["shadow_doorbells"], has_dbbc, "{buffered}");
    if has_dbbc {
        let t = &buffered["total"]["transport"];
        assert!(t["sq_shadow_updates"].as_u64().unwrap() > 0, "{t}");
    }
    let err = fails(&perf(&["--doorbell-buffer", "--no-doorbell-buffer"]), 2);
    assert!(err.contains("cannot be used with"), "{err}");
    // MMIO doorbells already write every update: --no-shadow-doorbell
    // alone would change nothing.
    let err = fails(&perf(&["--no-shadow-doorbell"]), 2);
    assert!(err.contains("--doorbell-buffer"), "{err}");

    // Each transport option, on its own.
    let v = perf_json(&["--reap-on-submit"]);
    assert_eq!(v["reap_on_submit"], true);
    let v = perf_json(&["--doorbell-buffer", "--no-shadow-doorbell"]);
    assert_eq!(v["shadow_doorbells"], false);
    assert_eq!(v["doorbell_buffer"], has_dbbc, "{v}");
    // No MMIO write is skipped because of the EventIdx.
    assert_eq!(
        v["total"]["transport"]["mmio_skipped_by_event_idx"], 0,
        "{v}"
    );
    let v = perf_json(&["--cq-head-every-reap"]);
    assert_eq!(v["cq_head_policy"], "every-reap");
    assert_eq!(v["total"]["transport"]["cq_doorbell_skipped"], 0, "{v}");

    // Every workload, with -M for the mixed ones.
    for (w, reads) in [
        ("read", 100),
        ("write", 0),
        ("randread", 100),
        ("randwrite", 0),
        ("rw", 30),
        ("randrw", 30),
    ] {
        let v = perf_json(&["-w", w, "-M", "30"]);
        assert_eq!(v["workload"], w);
        assert_eq!(v["read_percent"], reads, "{w}");
    }

    // Two cores (the guest has two vCPUs): one job per (namespace, core).
    let v = perf_json(&["-c", "0,1"]);
    assert_eq!(v["cores"], serde_json::json!([0, 1]));
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.len() as u64, 2 * namespaces);
    assert!(jobs.iter().any(|j| j["core"] == 1));
    let v = perf_json(&["-c", "0x3", "-n", "1"]);
    assert_eq!(v["jobs"].as_array().unwrap().len(), 2);

    // Queue size and depth, within what the controller allows.
    let entries = 64.min(mqes + 1);
    let e = entries.to_string();
    let depth = (entries - 1).to_string();
    let v = perf_json(&["--queue-entries", &e, "-q", &depth]);
    assert_eq!(v["sq_entries"], entries);
    assert_eq!(v["queue_depth"], entries - 1);
    // Larger I/Os (two blocks of 4 KiB), a fixed seed, 4 KiB-page DMA memory.
    let v = perf_json(&["-o", "8192", "--seed", "7", "--no-hugepages"]);
    assert_eq!(v["io_size"], 8192);
    assert_eq!(v["seed"], 7);
    // Above MDTS: every I/O two commands (the library splits it and
    // completes it once), verified, with the queue sized for the pieces.
    let two = (2u64 << (12 + env_u64("UPNVME_VM_MDTS"))).to_string();
    let v = perf_json(&[
        "-o", &two, "-q", "4", "-w", "randrw", "-M", "50", "--verify",
    ]);
    assert_eq!(v["io_size"].to_string(), two);
    assert!(v["sq_entries"].as_u64().unwrap() > 8, "{v}");

    // Text output: rows, -L percentiles, -LL histogram, transport statistics.
    let out = ok(&perf(&[]));
    assert!(out.contains("NSID 1 from core  0"), "{out}");
    assert!(out.contains("\nTotal "), "{out}");
    assert!(!out.contains("99.99000%"), "{out}");
    assert!(!out.contains("sq_mmio"), "{out}");
    let out = ok(&perf(&["-L"]));
    for p in [
        "1.00000%",
        "10.00000%",
        "50.00000%",
        "90.00000%",
        "99.00000%",
        "99.90000%",
        "99.99000%",
        "99.99900%",
    ] {
        assert!(out.contains(p), "{p}: {out}");
    }
    assert!(!out.contains("Range in us"), "{out}");
    let out = ok(&perf(&["-LL"]));
    assert!(out.contains("99.99900%"), "{out}");
    assert!(out.contains("Range in us"), "{out}");
    assert!(out.contains("Latency histogram"), "{out}");
    let out = ok(&perf(&["--transport-stats"]));
    for k in [
        "polls",
        "idle_polls",
        "sq_mmio",
        "cq_mmio",
        "sq_shadow",
        "ei_skipped",
        "sq/io",
        "cq/io",
        "mmio/io",
        "Driver call time",
        "submit_us/io",
        "reap_us/completion",
    ] {
        assert!(out.contains(k), "{k}: {out}");
    }
    // Call timing: only with --transport-stats; every measured command was
    // submitted and reaped by a timed call, each taking some time.
    let v = perf_json(&[]);
    assert_eq!(v["total"].get("call_timing"), Some(&Value::Null), "{v}");
    for j in v["jobs"].as_array().unwrap() {
        assert_eq!(j.get("call_timing"), Some(&Value::Null), "{j}");
    }
    let v = perf_json(&["--transport-stats", "-q", "4"]);
    let jobs = v["jobs"].as_array().unwrap();
    let per_job = jobs.iter().map(|j| (&j["call_timing"], 200));
    let total = (&v["total"]["call_timing"], 200 * jobs.len() as u64);
    for (t, ios) in per_job.chain([total]) {
        assert_eq!(t["reaped"], ios, "{t}");
        assert_eq!(t["submitted"], ios, "{t}");
        assert!(t["submit_us_per_io"].as_f64().unwrap() > 0.0, "{t}");
        assert!(t["reap_us_per_completion"].as_f64().unwrap() > 0.0, "{t}");
    }
    let out = ok(&perf(&[
        "--reap-on-submit",
        "--doorbell-buffer",
        "--no-shadow-doorbell",
        "--cq-head-every-reap",
    ]));
    assert!(
        out.contains(
            "reap_on_submit on, shadow doorbells mmio (buffer kept current), CQ head every-reap, SQ doorbell per batch"
        ),
        "{out}"
    );
    // Without the Doorbell Buffer Config every doorbell is MMIO and no shadow
    // value is written.
    let v = perf_json(&["--no-doorbell-buffer"]);
    assert_eq!(v["shadow_doorbells"], false, "{v}");
    assert_eq!(v["doorbell_buffer"], false, "{v}");
    let t = &v["total"]["transport"];
    assert_eq!(t["sq_shadow_updates"], 0, "{t}");
    assert_eq!(t["cq_shadow_updates"], 0, "{t}");
    assert!(t["sq_doorbell_mmio"].as_u64().unwrap() > 0, "{t}");
    let out = ok(&perf(&["--no-doorbell-buffer"]));
    assert!(out.contains("shadow doorbells off"), "{out}");
    // --ring-per-io with MMIO doorbells: one SQ tail MMIO write per I/O;
    // batched resubmission writes at most that many.
    let v = perf_json(&["--ring-per-io", "-q", "4"]);
    assert_eq!(v["ring_per_io"], true, "{v}");
    let t = &v["total"]["transport"];
    assert_eq!(t["sq_doorbell_mmio"], t["submissions"], "{t}");
    let v = perf_json(&["-q", "4"]);
    assert_eq!(v["ring_per_io"], false, "{v}");
    let t = &v["total"]["transport"];
    assert!(
        t["sq_doorbell_mmio"].as_u64() <= t["submissions"].as_u64(),
        "{t}"
    );
    // With the doorbell buffer and its EventIdx and `--sq-announce each` every command
    // is announced as it is queued, batched or not (so is each command of
    // `--ring-per-io`); by default (`deep:65`, per batch up to 64 in flight)
    // once per batch of resubmissions.
    // MMIO writes only where QEMU asked for them.
    for extra in [
        &["-q", "4", "--doorbell-buffer", "--sq-announce", "each"][..],
        &["-q", "4", "--doorbell-buffer", "--ring-per-io"][..],
        &["-q", "4", "--doorbell-buffer"][..],
    ] {
        let v = perf_json(extra);
        let t = &v["total"]["transport"];
        let batch = extra.len() == 3;
        // The default (`deep:65`) is per batch at QD4.
        let announce = if extra.contains(&"each") {
            "each"
        } else {
            "deep:65"
        };
        assert_eq!(v["sq_announce"], announce, "{v}");
        if batch {
            let (updates, submissions) = (
                t["sq_shadow_updates"].as_u64().unwrap(),
                t["submissions"].as_u64().unwrap(),
            );
            assert!(updates > 0 && updates <= submissions, "{extra:?}: {t}");
        } else {
            assert_eq!(t["sq_shadow_updates"], t["submissions"], "{extra:?}: {t}");
        }
        assert_eq!(
            t["sq_doorbell_mmio"].as_u64().unwrap()
                + t["mmio_skipped_by_event_idx"].as_u64().unwrap(),
            t["sq_shadow_updates"].as_u64().unwrap() + t["cq_shadow_updates"].as_u64().unwrap()
                - t["cq_doorbell_mmio"].as_u64().unwrap(),
            "{extra:?}: every SQ shadow update either wrote MMIO or was skipped: {t}"
        );
    }
    assert!(ok(&perf(&["--ring-per-io"])).contains("SQ doorbell per I/O"));
    // A reader that went away (`| head`) ends the run quietly with the
    // SIGPIPE status, without a panic: the pipe's read end is closed before
    // perf writes its report.
    let dev = device();
    let mut child = Command::new("upnvme")
        .args(["perf", "-d", &dev, "--io-count", "2000", "--warmup", "0"])
        .args(["-q", "4", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(141), "{err}");
    assert!(err.is_empty(), "{err}");
    // A time-bounded run (-t) works as well.
    let dev = device();
    let out = ok(&upnvme(&[
        "perf", "-d", &dev, "-t", "1", "--warmup", "0", "-q", "4",
    ]));
    assert!(out.contains("Total"), "{out}");
}

/// A first SIGINT or SIGTERM ends `perf` early but cleanly: the report
/// covers what ran, the controller is shut down (it opens again), and the
/// exit status is 128 + the signal.
#[test]
fn perf_reports_and_shuts_down_when_interrupted() {
    let dev = device();
    // (signal, exit status, --json, --warmup, depth: 1 has its own loop)
    for (sig, code, json, warmup, depth) in [
        ("INT", 130, false, "0", "8"),
        ("TERM", 143, true, "0", "8"),
        ("INT", 130, false, "60", "8"),
        ("TERM", 143, true, "0", "1"),
        ("INT", 130, false, "60", "1"),
    ] {
        let mut args = vec![
            "perf", "-d", &dev, "-q", depth, "-t", "60", "--warmup", warmup,
        ];
        if depth == "1" {
            // One namespace: the depth-1 loop (with several, the batch loop).
            args.extend(["-n", "1"]);
        }
        if json {
            args.push("--json");
        }
        let child = Command::new("upnvme")
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("upnvme is on the guest's PATH");
        // Well past bring-up: the handlers are installed before the device opens.
        std::thread::sleep(Duration::from_secs(2));
        let pid = child.id().to_string();
        if sig == "INT" && warmup == "0" {
            // Meanwhile the controller is this run's: another upnvme says
            // who holds it, as `setup status` would.
            let held = format!("pid {pid} (upnvme)");
            let err = fails(&upnvme(&["identify", "-d", &dev]), 1);
            assert!(err.contains(&format!("; held by {held}")), "{err}");
            let out = ok(&upnvme(&["list"]));
            assert!(out.contains(&format!("(in use by {held})")), "{out}");
        }
        let kill = Command::new("kill")
            .args(["-s", sig, &pid])
            .status()
            .unwrap();
        assert!(kill.success());
        // Collect the output on another thread (the JSON document is larger
        // than a pipe buffer), with a deadline.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(child.wait_with_output()));
        let o = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(o) => o.unwrap(),
            Err(_) => {
                let _ = Command::new("kill").args(["-9", &pid]).status();
                panic!("perf did not end within 30 s of SIG{sig}");
            }
        };
        let err = fails(&o, code);
        assert!(err.contains(&format!("interrupted by SIG{sig}")), "{err}");
        if json {
            let v: Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
            assert_eq!(v["interrupted"], format!("SIG{sig}"));
            assert!(v["total"]["ios"].as_u64().unwrap() > 0, "{v}");
            assert_eq!(v["total"]["errors"], 0);
            assert!(v["jobs"][0]["seconds"].as_f64().unwrap() < 30.0);
        } else if warmup != "0" {
            let out = stdout(&o);
            assert!(
                out.contains(&format!(
                    "interrupted by SIG{sig} during the warm-up: nothing was measured"
                )),
                "{out}"
            );
        } else {
            let out = stdout(&o);
            assert!(
                out.contains(&format!("interrupted by SIG{sig} after")),
                "{out}"
            );
            assert!(out.contains("Total"), "{out}");
        }
    }
    // Shut down cleanly: the controller opens again at once.
    ok(&upnvme(&["identify", "-d", &dev]));
}

#[test]
fn perf_histogram_csv() {
    let path = "/tmp/upnvme-hist.csv";
    let _ = fs::remove_file(path);
    let v = perf_json(&["--histogram-csv", path]);
    let csv = fs::read_to_string(path).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("bucket_us,count"));
    let mut total = 0u64;
    let mut rows = 0;
    for l in lines {
        let (b, c) = l.split_once(',').unwrap_or_else(|| panic!("{l}"));
        assert!(b.parse::<f64>().unwrap() > 0.0, "{l}");
        total += c.parse::<u64>().unwrap();
        rows += 1;
    }
    assert!(rows > 0, "{csv}");
    assert_eq!(total, v["total"]["ios"].as_u64().unwrap());
    // Also next to the text report.
    fs::remove_file(path).unwrap();
    ok(&perf(&["--histogram-csv", path]));
    assert!(fs::metadata(path).unwrap().len() > "bucket_us,count\n".len() as u64);
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
    for (w, mix) in [("write", "0"), ("rw", "30"), ("randrw", "70")] {
        let v = perf_json(&["-w", w, "-M", mix, "-q", "4", "--verify", "-c", "0,1"]);
        assert_eq!(v["verify_mismatches"], 0, "{w}");
        assert_eq!(v["verify"], "complete", "{w}");
        assert_eq!(v["verify_error"], Value::Null, "{w}");
    }
    // Depth 1 on one namespace runs its own loop.
    let v = perf_json(&["-w", "randrw", "-M", "50", "--verify", "-n", "1"]);
    assert_eq!(v["verify_mismatches"], 0, "{v}");
}

/// `--sgl` (every I/O's data pointer an SGL Data Block) and `--prp` (PRP
/// Lists beyond two pages), verified, for 4 KiB and for 128 KiB.
#[test]
fn perf_sgl_and_prp_verify() {
    for (flag, name) in [("--sgl", "sgl"), ("--prp", "prp")] {
        for size in ["4096", "131072"] {
            let v = perf_json(&[
                "-w", "randrw", "-M", "50", "-o", size, "-q", "8", "--verify", flag, "-n", "1",
            ]);
            assert_eq!(v["data_pointer"], name);
            assert_eq!(v["verify_mismatches"], 0, "{flag} {size}: {v}");
        }
        let out = ok(&perf(&[flag, "-n", "1"]));
        assert!(out.contains(&format!("data pointer {name}")), "{out}");
    }
}

/// A timed run with a warm-up, through both of perf's loops (depth 1 on one
/// namespace has its own): the window lasts what was asked, every I/O in it
/// is counted once, and the call timing covers what was submitted.
#[test]
fn perf_timed_run_with_warmup_at_each_loop() {
    let dev = device();
    for depth in ["1", "4"] {
        let o = upnvme(&[
            "perf",
            "-d",
            &dev,
            "-n",
            "1",
            "-q",
            depth,
            "-t",
            "1",
            "--warmup",
            "1",
            "--transport-stats",
            "--json",
        ]);
        let v = json(&o);
        assert_eq!(v["warmup_seconds"], 1, "{v}");
        let t = &v["total"];
        let ios = t["ios"].as_u64().unwrap();
        assert!(ios > 0, "depth {depth}: {t}");
        assert_eq!(t["errors"], 0, "depth {depth}: {t}");
        let secs = v["jobs"][0]["seconds"].as_f64().unwrap();
        assert!((0.9..2.0).contains(&secs), "depth {depth}: {secs} s: {v}");
        // The histogram holds exactly the I/Os counted.
        let hist: u64 = v["histogram_us_count"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b[1].as_u64().unwrap())
            .sum();
        assert_eq!(hist, ios, "depth {depth}: {v}");
        let c = &t["call_timing"];
        assert_eq!(c["reaped"].as_u64().unwrap(), ios, "depth {depth}: {t}");
        assert_eq!(t["transport"]["completions"], ios, "depth {depth}: {t}");
        let submitted = c["submitted"].as_u64().unwrap();
        let d: u64 = depth.parse().unwrap();
        if d == 1 {
            // The completion that ends the warm-up belongs to it; every
            // command submitted after it completes in the window.
            assert_eq!(submitted, ios, "depth {depth}: {t}");
        } else {
            // The commands in flight when the warm-up ended complete in the
            // window but were submitted before it.
            assert!(
                submitted <= ios && ios - submitted <= d,
                "depth {depth}: {t}"
            );
        }

        // --io-count with a warm-up: exactly that many I/Os after it.
        let v = json(&upnvme(&[
            "perf",
            "-d",
            &dev,
            "-n",
            "1",
            "-q",
            depth,
            "--io-count",
            "300",
            "--warmup",
            "1",
            "--json",
        ]));
        assert_eq!(v["total"]["ios"], 300, "depth {depth}: {v}");
        assert_eq!(v["total"]["errors"], 0, "depth {depth}: {v}");
    }
}

/// Bad input: the exact one-line text of docs/bad-input.md, exit status 2
/// for perf's checks (1 for the other subcommands), and nothing reaches the
/// controller.
#[test]
fn bad_input_texts_and_exit_codes() {
    let dev = device();
    let lba = env_u64("UPNVME_VM_LBA_SIZE");
    let mdts = env_u64("UPNVME_VM_MDTS");
    let entries = env_u64("UPNVME_VM_MQES") + 1;
    let smp = env_u64("UPNVME_VM_SMP");
    let nsze = env_u64("UPNVME_VM_DISK_SIZE") / lba;
    let active: Vec<u64> = (1..=env_u64("UPNVME_VM_NAMESPACES")).collect();
    let cores: Vec<u64> = (0..smp).collect();
    let max = 4096u64 << mdts;
    let too_big = (2 * max).to_string();
    let before = io_commands(&dev);

    let perf_cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["-q", "0"],
            "queue depth (-q) must be at least 1".into(),
        ),
        (
            vec!["-q", "5000"],
            format!(
                "queue depth 5000 does not fit a queue of {entries} entries (at most {}); the controller allows {entries} entries",
                entries - 1
            ),
        ),
        (
            vec!["-o", "0"],
            "I/O size (-o) must be at least one block".into(),
        ),
        (
            vec!["-o", "1000"],
            format!("I/O size 1000 is not a multiple of namespace 1's LBA size {lba}"),
        ),
        (
            // Above MDTS each I/O is two commands: 8 deep needs 16 in flight.
            vec!["-o", &too_big, "-q", "8", "--queue-entries", "16"],
            format!(
                "queue depth 8 with I/Os of {too_big} bytes, each 2 commands of at most {max} bytes (MDTS {mdts}), keeps 16 commands in flight: more than a queue of 16 entries holds (at most 15); the controller allows {entries} entries"
            ),
        ),
        (
            vec!["-c", "9"],
            format!("core 9 is not available (cores present: {cores:?})"),
        ),
        (vec!["-c", "0x0"], "core mask '0x0' selects no core".into()),
        (
            vec!["-c", "a"],
            "core list 'a': 'a' is not a core number".into(),
        ),
        (
            vec!["-c", "3-1"],
            "core list '3-1': range 3-1 is backwards".into(),
        ),
        (
            vec!["-n", "77"],
            format!("namespace 77 is not active on {dev} (active: {active:?})"),
        ),
        (
            vec!["--queue-entries", "1"],
            format!("--queue-entries 1: must be 2..={entries} (CAP.MQES + 1)"),
        ),
        (
            vec!["-w", "randread", "--verify"],
            "--verify needs a workload that writes (write, randwrite, rw, randrw)".into(),
        ),
        (
            vec!["-t", "0"],
            "run time (-t) must be at least 1 second (or use --io-count)".into(),
        ),
        (
            vec!["--io-count", "0"],
            "--io-count must be at least 1".into(),
        ),
        (
            vec!["--io-count", "2", "-q", "8"],
            "--io-count 2 is below the queue depth 8: each queue pair keeps 8 I/Os in flight; use --io-count 8 or more, or -q 2".into(),
        ),
    ];
    for (args, msg) in &perf_cases {
        let mut all = vec!["perf", "-d", &dev];
        all.extend_from_slice(args);
        let err = fails(&upnvme(&all), 2);
        assert_eq!(err.trim(), format!("upnvme: {msg}"), "{args:?}");
    }
    // clap's own checks.
    let err = fails(&upnvme(&["perf", "-d", &dev, "-w", "sideways"]), 2);
    assert!(
        err.starts_with("error: invalid value 'sideways' for '--workload <WORKLOAD>'"),
        "{err}"
    );
    assert!(
        err.contains("[possible values: read, write, randread, randwrite, rw, randrw]"),
        "{err}"
    );
    let err = fails(&upnvme(&["perf", "-d", &dev, "-M", "101"]), 2);
    assert!(
        err.starts_with(
            "error: invalid value '101' for '--rwmixread <READ_MIX>': 101 is not in 0..=100"
        ),
        "{err}"
    );
    // None of that issued a read or a write.
    assert_eq!(
        io_commands(&dev),
        before,
        "bad input reached the controller"
    );

    // read / write input: usage errors (exit 2), as perf's.
    let s = nsze.to_string();
    let err = fails(&upnvme(&["read", "-d", &dev, "-s", &s, "-c", "1"]), 2);
    assert_eq!(
        err.trim(),
        format!("upnvme: blocks {nsze}..+1 are outside namespace 1 ({nsze} blocks)")
    );
    let err = fails(
        &upnvme(&[
            "write",
            "-d",
            &dev,
            "-s",
            "18446744073709551615",
            "-c",
            "2",
            "--data",
            "/dev/null",
        ]),
        2,
    );
    assert_eq!(
        err.trim(),
        format!("upnvme: blocks 18446744073709551615..+2 are outside namespace 1 ({nsze} blocks)")
    );
    let err = fails(&upnvme(&["read", "-d", &dev, "-c", "0"]), 2);
    assert_eq!(err.trim(), "upnvme: --block-count must be at least 1");
    let err = fails(&upnvme(&["read", "-d", &dev, "-n", "9"]), 2);
    assert_eq!(
        err.trim(),
        format!("upnvme: namespace 9 is not active on {dev} (active: {active:?})")
    );
    // The same for identify (text and JSON) and format: exit 2 as for read.
    for args in [
        &["identify", "-d", &dev, "-n", "9"][..],
        &["identify", "-d", &dev, "-n", "9", "--json"][..],
        &["format", "-d", &dev, "-n", "9", "--lbaf", "0"][..],
    ] {
        let err = fails(&upnvme(args), 2);
        assert!(err.contains("namespace 9 is not active"), "{args:?}: {err}");
    }
    // A short or unpadded address is spelled the one way in perf's report.
    let short = dev.trim_start_matches("0000:").to_string();
    let v: Value = serde_json::from_str(&ok(&upnvme(&[
        "perf",
        "-d",
        &short,
        "--io-count",
        "16",
        "--warmup",
        "0",
        "--json",
    ])))
    .unwrap();
    assert_eq!(v["device"], dev.as_str(), "{v}");
    // Protection fields on a namespace without protection information: a
    // usage error before the output file is created.
    let out = "/tmp/upnvme-pi-refused.bin";
    let _ = std::fs::remove_file(out);
    let err = fails(
        &upnvme(&["read", "-d", &dev, "--prinfo", "8", "--data", out]),
        2,
    );
    assert_eq!(
        err.trim(),
        "upnvme: namespace 1 has no protection information (Identify Namespace DPS type 0): \
         leave out --prinfo, --ref-tag, --app-tag and --app-tag-mask"
    );
    assert!(!std::path::Path::new(out).exists(), "{out} was created");
    // Bad addresses.
    // Malformed: a usage error (exit 2) from the argument parser, before any
    // device is touched.
    let err = fails(&upnvme(&["identify", "-d", "00:04"]), 2);
    assert!(
        err.contains(
            "invalid value '00:04' for '--device <DEVICE>': invalid PCI address '00:04': missing '.FUNCTION'; expected"
        ),
        "{err}"
    );
    let err = fails(&upnvme(&["smart-log", "-d", "0000:00:1e.6"]), 1);
    assert!(
        err.starts_with("upnvme: opening 0000:00:1e.6: no PCI device at 0000:00:1e.6 ("),
        "{err}"
    );
    let err = fails(&upnvme(&["identify", "-d", "0000:00:00.0"]), 1);
    assert!(
        err.starts_with("upnvme: opening 0000:00:00.0: PCI device 0000:00:00.0 has class 0x060000, not an NVMe controller ("),
        "{err}"
    );
    // --help and --version are not errors.
    assert!(ok(&upnvme(&["--version"])).starts_with("upnvme "));
    assert!(ok(&upnvme(&["perf", "--help"])).contains("--queue-depth"));
}

/// The raw floor loop (the benchmark's baseline) runs, reads without errors,
/// and reports its submit time with `--time-calls` (and only then); its
/// `--driver` mode runs the same loop through the queue pair API.
#[test]
fn rawfloor_runs_and_times_its_submissions() {
    let dev = device();
    let rawfloor = |args: &[&str]| {
        Command::new("upnvme-rawfloor")
            .args(args)
            .output()
            .expect("upnvme-rawfloor is on the guest's PATH")
    };
    let base = ["-d", dev.as_str(), "-t", "1", "--warmup", "0", "--json"];
    let v = json(&rawfloor(
        &[&base[..], &["--driver", "--time-calls"]].concat(),
    ));
    let t = &v["total"];
    assert!(t["ios"].as_u64().unwrap() > 0, "{t}");
    assert_eq!(t["errors"], 0, "{t}");
    assert_eq!(t["call_timing"]["submitted"], t["ios"], "{t}");
    // The driver's doorbell economy: one SQ tail write per read, the CQ head
    // rarely (adaptive moderation).
    let sq = t["transport"]["sq_doorbell_mmio"].as_u64().unwrap();
    let cq = t["transport"]["cq_doorbell_mmio"].as_u64().unwrap();
    assert!(sq > 0 && sq <= t["ios"].as_u64().unwrap(), "{t}");
    assert!(cq < sq, "{t}");
    let err = fails(
        &rawfloor(&[&base[..], &["--driver", "-q", "4"]].concat()),
        1,
    );
    assert!(err.contains("--driver runs at depth 1"), "{err}");
    for depth in ["1", "4"] {
        let run = |extra: &[&str]| {
            let mut args = vec!["-d", dev.as_str(), "-q", depth, "-t", "1", "--warmup", "0"];
            args.extend_from_slice(extra);
            args.push("--json");
            let o = Command::new("upnvme-rawfloor")
                .args(&args)
                .output()
                .expect("upnvme-rawfloor is on the guest's PATH");
            json(&o)
        };
        let v = run(&[]);
        let t = &v["total"];
        assert_eq!(v["queue_depth"], depth.parse::<u64>().unwrap(), "{v}");
        assert!(t["ios"].as_u64().unwrap() > 0, "{t}");
        assert_eq!(t["errors"], 0, "{t}");
        assert_eq!(t.get("call_timing"), Some(&Value::Null), "{t}");
        for extra in [
            &["--time-calls"][..],
            &["--time-calls", "--sq-first", "--resubmit-delay-ns", "1000"][..],
        ] {
            let v = run(extra);
            let c = &v["total"]["call_timing"];
            assert_eq!(v["total"]["errors"], 0, "{extra:?}: {v}");
            // Every completion but the last `depth` was followed by a timed
            // resubmission; the first `depth` submissions were timed too.
            assert_eq!(c["submitted"], v["total"]["ios"], "{extra:?}: {c}");
            assert!(c["submit_us_per_io"].as_f64().unwrap() > 0.0, "{c}");
        }
    }
}
