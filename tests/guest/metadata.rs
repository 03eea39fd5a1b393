//! Namespaces whose LBA format carries metadata (`cargo xtask vm --ms 8 --mset 1 --pi 1`,
//! the `metadata-pi` configuration of `cargo xtask test`): data and metadata round trips
//! in both layouts (extended LBA and a separate MPTR buffer), protection information of
//! Types 1–3 in the first or last 8 bytes (host-built and PRACT), the typed end-to-end
//! check errors, and Format NVM between those formats and back. The bed fails the run on
//! any IOMMU fault, so every transfer was described exactly.
//!
//! Every test here returns at once when namespace 1 has no metadata
//! (`UPNVME_VM_NS1_MS=0`): the other configurations.

use std::time::{Duration, Instant};

use upnvme::{
    Completion, Controller, ControllerOptions, DmaBuffer, FormatNvm, IoCommand, IoData, IoError,
    IoQueuePair, IoVec, Namespace, PiCheck, Protection, QueuePairOptions,
};

use crate::vm::{device, env_u64, upnvme};
use upnvme::pi::Pif;

const T: Duration = Duration::from_secs(10);

/// Namespace 1's metadata bytes per block in this guest, `None` without.
fn ns1_ms() -> Option<u16> {
    let ms = env_u64("UPNVME_VM_NS1_MS") as u16;
    if ms == 0 {
        eprintln!("namespace 1 has no metadata in this guest: nothing to check here");
    }
    (ms != 0).then_some(ms)
}

/// Polls `qp` for the completion of one submitted command (bounded).
fn wait(qp: &mut IoQueuePair) -> Completion {
    let until = Instant::now() + T;
    while Instant::now() < until {
        if let Some(c) = qp.next_completion().unwrap() {
            return c;
        }
    }
    panic!("no completion within {T:?}");
}

/// Submits and waits; panics if refused.
fn run(qp: &mut IoQueuePair, cmd: IoCommand<'_>, io: IoData) -> Completion {
    if let Err(r) = qp.submit_io(cmd, io, 1) {
        panic!("{} refused: {}", cmd.name(), r.reason);
    }
    wait(qp)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

fn bytes_of(b: &DmaBuffer, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    b.read_bytes(0, &mut v).unwrap();
    v
}

fn filled(c: &Controller, data: &[u8]) -> DmaBuffer {
    let b = c.alloc_dma(data.len()).unwrap();
    b.write_bytes(0, data).unwrap();
    b
}

/// The memory of one transfer of `blocks` blocks on `ns`: one buffer with
/// data and metadata interleaved (extended LBA), or a data buffer and a
/// metadata buffer.
fn memory(c: &Controller, ns: &Namespace, data: &[u8], md: &[u8]) -> IoData {
    let (bs, ms) = (ns.lba_size() as usize, usize::from(ns.metadata_size()));
    if ns.metadata_layout().unwrap().extended {
        let host: Vec<u8> = data
            .chunks(bs)
            .zip(md.chunks(ms))
            .flat_map(|(d, m)| d.iter().chain(m).copied())
            .collect();
        IoData::buffer(filled(c, &host))
    } else {
        IoData::buffer(filled(c, data)).metadata(filled(c, md))
    }
}

/// Data and metadata of a completed read made with [`memory`].
fn split_back(ns: &Namespace, comp: &Completion, blocks: usize) -> (Vec<u8>, Vec<u8>) {
    let (bs, ms) = (ns.lba_size() as usize, usize::from(ns.metadata_size()));
    let buf = comp.buffer.as_ref().unwrap();
    if ns.metadata_layout().unwrap().extended {
        let host = bytes_of(buf, blocks * (bs + ms));
        let d = host
            .chunks(bs + ms)
            .flat_map(|b| b[..bs].to_vec())
            .collect();
        let m = host
            .chunks(bs + ms)
            .flat_map(|b| b[bs..].to_vec())
            .collect();
        (d, m)
    } else {
        (
            bytes_of(buf, blocks * bs),
            bytes_of(comp.metadata.as_ref().unwrap(), blocks * ms),
        )
    }
}

/// Byte-exact data and metadata round trips on namespace 1 as formatted
/// now; with PI also host-built tuples checked by the controller, PRACT
/// insert/strip, Verify, and a corrupted guard and reference tag giving
/// their typed errors. 0 DMAR faults is the bed's check.
fn round_trip(c: &Controller, ns: &Namespace) {
    let layout = ns.metadata_layout().unwrap();
    let what = format!("{layout}");
    let (bs, ms) = (ns.lba_size() as usize, usize::from(layout.ms));
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let (slba, n) = (64u64, 5usize);
    let data = pattern(layout.ms as u8, n * bs);
    let mut md = pattern(0x5a, n * ms);
    // Type 3 has no reference tag to check (the driver refuses the bit).
    let check = Protection {
        check_app_tag: true,
        check_ref_tag: layout.pi_type != 3,
        app_tag: 0x0bee,
        app_tag_mask: 0xffff,
        ..Protection::CHECK
    };
    let fmt = ns.pi_format();
    if let Some(f) = fmt {
        assert!(f.protect(&data, &mut md, 0x0bee, slba), "{what}");
    }
    let prot = |io: IoData| {
        if fmt.is_some() {
            io.protection(check)
        } else {
            io
        }
    };
    let write = IoCommand::Write {
        ns,
        slba,
        blocks: n as u32,
    };
    let read = IoCommand::Read {
        ns,
        slba,
        blocks: n as u32,
    };
    let w = run(&mut qp, write, prot(memory(c, ns, &data, &md)));
    assert!(w.is_ok(), "{what}: write {:?}", w.result);
    let blank = (vec![0u8; n * bs], vec![0u8; n * ms]);
    let r = run(&mut qp, read, prot(memory(c, ns, &blank.0, &blank.1)));
    assert!(r.is_ok(), "{what}: read {:?}", r.result);
    let (d, m) = split_back(ns, &r, n);
    assert!(d == data, "{what}: data differs");
    assert!(m == md, "{what}: metadata differs");
    // Above MDTS (split.rs): two commands' worth of blocks and three more,
    // cut at the same block boundaries in data, metadata and reference
    // tags (host-built tuples run on across the pieces and are checked).
    let stride = bs + if layout.extended { ms } else { 0 };
    let big = 2 * qp.max_transfer() / stride + 3;
    let bslba = 4096u64;
    let bdata = pattern(0x77, big * bs);
    let mut bmd = pattern(0x1c, big * ms);
    if let Some(f) = fmt {
        assert!(f.protect(&bdata, &mut bmd, 0x0bee, bslba), "{what}");
    }
    let (bw, br) = (
        IoCommand::Write {
            ns,
            slba: bslba,
            blocks: big as u32,
        },
        IoCommand::Read {
            ns,
            slba: bslba,
            blocks: big as u32,
        },
    );
    let w = run(&mut qp, bw, prot(memory(c, ns, &bdata, &bmd)));
    assert!(w.is_ok(), "{what}: split write {:?}", w.result);
    let (z, zm) = (vec![0u8; big * bs], vec![0u8; big * ms]);
    let r = run(&mut qp, br, prot(memory(c, ns, &z, &zm)));
    assert!(r.is_ok(), "{what}: split read {:?}", r.result);
    let (d, m) = split_back(ns, &r, big);
    assert!(d == bdata, "{what}: split data differs");
    assert!(m == bmd, "{what}: split metadata differs");
    if layout.extended {
        // The same read into a vector of odd pieces (an SGL where QEMU
        // offers SGLs, as it does).
        let total = n * (bs + ms);
        let mut v = IoVec::new();
        for (i, len) in [4usize, 1000, 3, total - 1007].into_iter().enumerate() {
            v.push(c.alloc_dma(len + 4 * i).unwrap(), 4 * i, len)
                .unwrap();
        }
        let r = run(&mut qp, read, prot(IoData::vectored(v)));
        assert!(r.is_ok(), "{what}: vectored read {:?}", r.result);
        let back: Vec<u8> = r
            .segments
            .unwrap()
            .segments()
            .iter()
            .flat_map(|s| {
                let mut b = vec![0u8; s.len()];
                s.buffer().read_bytes(s.offset(), &mut b).unwrap();
                b
            })
            .collect();
        let expect: Vec<u8> = data
            .chunks(bs)
            .zip(md.chunks(ms))
            .flat_map(|(d, m)| d.iter().chain(m).copied())
            .collect();
        assert!(back == expect, "{what}: the vectored read differs");
    }
    let Some(_) = fmt else { return };
    // Verify checks the stored tuples.
    let verify = IoCommand::Verify {
        ns,
        slba,
        blocks: n as u32,
    };
    if c.identify().oncs & (1 << 7) != 0 {
        let v = run(&mut qp, verify, IoData::none().protection(check));
        assert!(v.is_ok(), "{what}: verify {:?}", v.result);
    }
    // One flipped data byte: the controller's guard check refuses it.
    let mut bad = data.clone();
    bad[bs + 100] ^= 0x10;
    let e = run(&mut qp, write, prot(memory(c, ns, &bad, &md)));
    assert!(
        matches!(
            e.result,
            Err(IoError::Protection {
                check: PiCheck::Guard,
                ..
            })
        ),
        "{what}: {:?}",
        e.result
    );
    // Tuples tagged for other blocks (Types 1 and 2 count the tag).
    if layout.pi_type != 3 {
        let mut shifted = md.clone();
        fmt.unwrap().protect(&data, &mut shifted, 0x0bee, slba + 1);
        let e = run(&mut qp, write, prot(memory(c, ns, &data, &shifted)));
        assert!(
            matches!(
                e.result,
                Err(IoError::Protection {
                    check: PiCheck::ReferenceTag,
                    ..
                })
            ),
            "{what}: {:?}",
            e.result
        );
    }
    // PRACT: the controller builds the tuples; with metadata that is just
    // the tuple (8 bytes, or 16 with a 64-bit guard) only the data moves.
    let tuple = layout.pif.tuple_size();
    let pract = Protection {
        app_tag: 0x0bee,
        check_ref_tag: layout.pi_type != 3,
        ..Protection::PRACT
    };
    let data2 = pattern(0x33, n * bs);
    let io = if ms == tuple {
        IoData::buffer(filled(c, &data2))
    } else {
        memory(c, ns, &data2, &md)
    };
    let w = run(&mut qp, write, io.protection(pract));
    assert!(w.is_ok(), "{what}: PRACT write {:?}", w.result);
    let io = if ms == tuple {
        IoData::buffer(c.alloc_dma(n * bs).unwrap())
    } else {
        memory(c, ns, &blank.0, &blank.1)
    };
    let r = run(&mut qp, read, io.protection(pract));
    assert!(r.is_ok(), "{what}: PRACT read {:?}", r.result);
    let got = if ms == tuple {
        bytes_of(r.buffer.as_ref().unwrap(), n * bs)
    } else {
        split_back(ns, &r, n).0
    };
    assert!(got == data2, "{what}: PRACT read returned other data");
    // Without PRACT the generated tuples come to the host and hold.
    let r = run(&mut qp, read, prot(memory(c, ns, &blank.0, &blank.1)));
    assert!(r.is_ok(), "{what}: {:?}", r.result);
    let (d, m) = split_back(ns, &r, n);
    assert!(d == data2, "{what}: data differs");
    let f = fmt.unwrap();
    for (i, chunk) in m.chunks(ms).enumerate() {
        let t = f.tuple(chunk).unwrap();
        let before = if f.first {
            &[][..]
        } else {
            &chunk[..ms - tuple]
        };
        assert_eq!(
            t.guard,
            f.guard_of(&d[i * bs..(i + 1) * bs], before),
            "{what}"
        );
        assert_eq!(t.app_tag, 0x0bee);
    }
}

/// The LBAF index of 4 KiB blocks with `ms` metadata bytes.
fn lbaf_with(ns: &Namespace, ms: u16) -> u8 {
    ns.identify()
        .lbaf
        .iter()
        .position(|f| f.lbads == 12 && f.ms == ms)
        .unwrap_or_else(|| panic!("QEMU offers 4096 + {ms}")) as u8
}

#[test]
fn metadata_round_trips_in_every_layout_with_pi_and_format_nvm() {
    let Some(ms) = ns1_ms() else { return };
    let mut c = Controller::open(&device(), ControllerOptions::default()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let layout = ns
        .metadata_layout()
        .expect("namespace 1 reports its metadata");
    assert_eq!(layout.ms, ms);
    assert_eq!(layout.extended, env_u64("UPNVME_VM_NS1_MSET") == 1);
    assert_eq!(u64::from(layout.pi_type), env_u64("UPNVME_VM_NS1_PI"));
    // QEMU's nvme-ns `pif` (0 or 2), reported through CNS 05h once the
    // driver set Host Behavior Support LBAFEE.
    assert_eq!(
        layout.pif,
        Pif::from_elbaf((env_u64("UPNVME_VM_NS1_PIF") as u32) << 7).unwrap()
    );
    // QEMU stores the metadata after the data in the backing file:
    // NSZE = file size / (LBA size + MS).
    let lba = u64::from(ns.lba_size());
    assert_eq!(
        ns.lba_count(),
        env_u64("UPNVME_VM_DISK_SIZE") / (lba + u64::from(ms))
    );
    round_trip(&c, &ns);
    let original = FormatNvm {
        extended: layout.extended,
        pi_type: layout.pi_type,
        pi_first: layout.pi_first,
        ..FormatNvm::lbaf(lbaf_with(&ns, ms))
    };
    let formats = [
        FormatNvm {
            extended: false,
            ..FormatNvm::lbaf(lbaf_with(&ns, 16))
        },
        FormatNvm {
            pi_type: 1,
            // A 64-bit guard's tuple needs 16 bytes.
            ..FormatNvm::lbaf(lbaf_with(&ns, layout.pif.tuple_size() as u16))
        },
        FormatNvm {
            extended: true,
            pi_type: 3,
            pi_first: true,
            ..FormatNvm::lbaf(lbaf_with(&ns, 16))
        },
        FormatNvm {
            pi_type: 2,
            // QEMU 10.0.2 reports the 64-bit guard (ELBAF.PIF) only for the
            // format nvme-ns was configured with, yet checks every format's
            // PI with it; a later QEMU reports it for every format with 16
            // or more metadata bytes. So with a 64-bit guard the formats
            // here stay on the configured one.
            ..FormatNvm::lbaf(lbaf_with(
                &ns,
                if layout.pif == Pif::Guard16 { 64 } else { ms },
            ))
        },
    ];
    let mut old = ns;
    for f in formats {
        let fresh = c.format_nvm(1, &f).unwrap();
        assert!(old.is_stale());
        let l = fresh.metadata_layout().unwrap();
        assert_eq!(
            (l.extended, l.pi_type, l.pi_first),
            (f.extended, f.pi_type, f.pi_first)
        );
        round_trip(&c, &fresh);
        old = fresh;
    }
    // Back to the configured format for the tests that follow.
    let back = c.format_nvm(1, &original).unwrap();
    assert_eq!(back.metadata_layout(), Some(layout));
    // Last (this test runs after the tool's, which formats too): blocks the
    // bed finds in namespace 1's backing file after the run. `cargo xtask
    // test` checks their data at LBA × 4096 and their metadata after the
    // data region (tools/xtask/src/test.rs, `metadata_backing`, with the
    // same formulas). Blocks 100–101 go as one buffer, 102–103 as an SGL
    // vector of odd sizes at odd dword offsets, 104–105 as a PRP vector of
    // page-aligned pieces.
    let ms = usize::from(ms);
    let host_of = |first: u64| -> Vec<u8> {
        (first..first + 2)
            .flat_map(|b| {
                let d = (0..4096usize).map(move |i| (b as usize * 31 + i * 7 + 1) as u8);
                let m = (0..ms).map(move |j| (0xa0 + b as usize * 5 + j) as u8);
                d.chain(m)
            })
            .collect()
    };
    let write = |slba: u64| IoCommand::Write {
        ns: &back,
        slba,
        blocks: 2,
    };
    let vector = |host: &[u8], pieces: &[(usize, usize)]| {
        let mut v = IoVec::new();
        let mut at = 0;
        for &(off, len) in pieces {
            let b = c.alloc_dma(off + len).unwrap();
            b.write_bytes(off, &host[at..at + len]).unwrap();
            v.push(b, off, len).unwrap();
            at += len;
        }
        assert_eq!(at, host.len());
        IoData::vectored(v)
    };
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let w = run(&mut qp, write(100), IoData::buffer(filled(&c, &host_of(0))));
    assert!(w.is_ok(), "the last write: {:?}", w.result);
    let h = host_of(2);
    let odd = [(4, 1000), (12, 3), (8, 5000), (0, h.len() - 6003)];
    let w = run(&mut qp, write(102), vector(&h, &odd));
    assert!(w.is_ok(), "the SGL vector write: {:?}", w.result);
    assert!(c.sgl_support().supported(), "QEMU offers SGLs");
    drop(qp);
    let mut prp = c
        .io_queue_pair(QueuePairOptions {
            sgl: upnvme::SglMode::Never,
            ..QueuePairOptions::default()
        })
        .unwrap();
    let h = host_of(4);
    let aligned = [(0, 4096), (0, 4096), (0, h.len() - 8192)];
    let w = run(&mut prp, write(104), vector(&h, &aligned));
    assert!(w.is_ok(), "the PRP vector write: {:?}", w.result);
    drop(prp);
    // Namespace 2, without metadata, is untouched by all of it.
    let ns2 = c.namespace(2).unwrap().clone();
    assert!(ns2.metadata_layout().is_none());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let data = pattern(9, 4 * ns2.lba_size() as usize);
    qp.write_blocking(&ns2, 8, 4, filled(&c, &data), T).unwrap();
    let r = qp
        .read_blocking(&ns2, 8, 4, c.alloc_dma(data.len()).unwrap(), T)
        .unwrap();
    assert_eq!(bytes_of(&r, data.len()), data);
}

/// `upnvme perf --verify` of a read/write mix on namespace 1 (16 KiB,
/// depth 8) with `extra` flags: must pass with 0 mismatches.
///
/// Sequential (`-w rw`), so no two commands in flight touch the same
/// blocks: QEMU stores a command's data and its metadata in two steps
/// (hw/nvme/dif.c: the data write's callback writes the metadata), so a
/// checked read racing a write of the same blocks may see new data with
/// the old tuple. A guard error seen once in CI with `randrw` was most
/// likely that race.
fn perf_verify(dev: &str, extra: &[&str]) {
    let mut args = vec![
        "perf",
        "-d",
        dev,
        "-n",
        "1",
        "-q",
        "8",
        "-o",
        "16384",
        "-w",
        "rw",
        "-M",
        "50",
        "--verify",
        "--io-count",
        "2000",
    ];
    args.extend_from_slice(extra);
    let o = upnvme(&args);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "perf {extra:?}: {}{out}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains(", 0 mismatches"), "perf {extra:?}: {out}");
}

fn ok(o: &std::process::Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn metadata_namespace_read_write_and_format_in_the_tool() {
    let Some(ms) = ns1_ms() else { return };
    let dev = device();
    // The indices of QEMU's 4096 + 16 and 4096 + ms formats (the tool needs
    // the device to itself: the library's handle is closed first).
    let (lbaf16, lbaf_now, pif) = {
        let c = Controller::open(&dev, ControllerOptions::default()).unwrap();
        let ns = c.namespace(1).unwrap().clone();
        let pif = ns.metadata_layout().unwrap().pif;
        (lbaf_with(&ns, 16), lbaf_with(&ns, ms), pif)
    };
    let tuple = pif.tuple_size();
    let (bs, n) = (4096usize, 2usize);
    let data = pattern(0x21, n * bs);
    let md = pattern(0x42, n * usize::from(ms));
    std::fs::write("/tmp/md-data.bin", &data).unwrap();
    std::fs::write("/tmp/md-meta.bin", &md).unwrap();
    let range = [
        "-d",
        &dev,
        "--nsid",
        "1",
        "--start-block",
        "16",
        "--block-count",
        "2",
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        range.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let run = |sub: &str, extra: &[&str]| {
        let mut a = vec![sub.to_string()];
        a.extend(with(extra));
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        upnvme(&refs)
    };
    // Without --metadata the tool says what the format needs (a usage
    // error: exit status 2, before any I/O).
    let o = run("write", &["--data", "/tmp/md-data.bin"]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--metadata") && err.contains("metadata bytes per block"),
        "{err}"
    );
    // Data and metadata files in, the same out (PRINFO 0: no checks).
    let o = run(
        "write",
        &[
            "--data",
            "/tmp/md-data.bin",
            "--metadata",
            "/tmp/md-meta.bin",
        ],
    );
    ok(&o, "write --metadata");
    let o = run(
        "read",
        &[
            "--data",
            "/tmp/md-out.bin",
            "--metadata",
            "/tmp/md-mout.bin",
        ],
    );
    ok(&o, "read --metadata");
    assert_eq!(std::fs::read("/tmp/md-out.bin").unwrap(), data);
    assert_eq!(std::fs::read("/tmp/md-mout.bin").unwrap(), md);
    if env_u64("UPNVME_VM_NS1_PI") != 0 && usize::from(ms) == tuple {
        // PRACT: the controller generates the PI; a checked read returns it.
        let o = run("write", &["--data", "/tmp/md-data.bin", "--prinfo", "8"]);
        ok(&o, "write --prinfo 8");
        let o = run(
            "read",
            &[
                "--data",
                "/tmp/md-out.bin",
                "--metadata",
                "/tmp/md-mout.bin",
                "--prinfo",
                "5",
            ],
        );
        ok(&o, "read --prinfo 5");
        assert_eq!(std::fs::read("/tmp/md-out.bin").unwrap(), data);
        let meta = std::fs::read("/tmp/md-mout.bin").unwrap();
        for (i, t) in meta.chunks(tuple).enumerate() {
            let t = upnvme::pi::PiTuple::decode(pif, t).unwrap();
            let block = &data[i * bs..(i + 1) * bs];
            let guard = match pif {
                Pif::Guard64 => upnvme::pi::guard64(block, &[]),
                _ => u64::from(upnvme::pi::guard(block, &[])),
            };
            assert_eq!(t.guard, guard);
            assert_eq!(t.ref_tag, 16 + i as u64);
        }
        if env_u64("UPNVME_VM_NS1_PI") != 3 {
            // More blocks than one command moves (MDTS, 512 KiB here): the
            // tool splits the transfer, and each chunk's reference tag is
            // the given one plus the blocks before it (Type 1: its LBA).
            let big = pattern(0x5a, 300 * bs);
            std::fs::write("/tmp/md-big.bin", &big).unwrap();
            let chunked = |sub: &str, file: &str, prinfo: &str| {
                upnvme(&[
                    sub,
                    "-d",
                    &dev,
                    "--nsid",
                    "1",
                    "--start-block",
                    "16",
                    "--block-count",
                    "300",
                    "--data",
                    file,
                    "--prinfo",
                    prinfo,
                    "--ref-tag",
                    "16",
                ])
            };
            ok(
                &chunked("write", "/tmp/md-big.bin", "9"),
                "write --ref-tag 16 over several commands",
            );
            ok(
                &chunked("read", "/tmp/md-big-out.bin", "9"),
                "read --ref-tag 16 over several commands",
            );
            assert_eq!(std::fs::read("/tmp/md-big-out.bin").unwrap(), big);
        }
    }
    // perf --verify on the metadata format with each -e mode, then plain
    // (which writes metadata unchecked: the checked runs come first, since
    // their reads check whatever an earlier run left).
    if env_u64("UPNVME_VM_NS1_PI") != 0 {
        let reftag = if env_u64("UPNVME_VM_NS1_PI") == 3 {
            ""
        } else {
            "|REFTAG"
        };
        perf_verify(&dev, &["-e", &format!("PRACT=1,PRCHK=GUARD{reftag}")]);
        perf_verify(&dev, &["-e", &format!("PRACT=0,PRCHK=GUARD{reftag}")]);
    }
    perf_verify(&dev, &[]);
    // Format to 4096 + 16 with a separate buffer, and back.
    let l16 = lbaf16.to_string();
    let o = upnvme(&["format", "-d", &dev, "-n", "1", "--lbaf", &l16, "--ms", "0"]);
    ok(&o, "format");
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("16 metadata bytes per block, separate metadata buffer"),
        "{out}"
    );
    perf_verify(&dev, &[]);
    // And Type 2 in the first 8 of 16 separate bytes, with host-built PI.
    let o = upnvme(&[
        "format", "-d", &dev, "-n", "1", "--lbaf", &l16, "--ms", "0", "--pi", "2", "--pil", "1",
    ]);
    ok(&o, "format --pi 2");
    if pif == Pif::Guard64 {
        // Blocks not written since the Format NVM read back as zero data
        // with a zero tuple unless QEMU's block status calls them zero
        // (hw/nvme/dif.c then reports an all-ones tuple: checks disabled).
        // A zero tuple passes a 16-bit guard check (the CRC-16 of zeroes is
        // 0) but not a 64-bit one, so the checked runs below would fail on
        // reads ahead of their writes: PRACT writes over their whole range
        // (2000 sequential 16 KiB I/Os from block 0) first.
        let o = upnvme(&[
            "perf",
            "-d",
            &dev,
            "-n",
            "1",
            "-q",
            "8",
            "-o",
            "16384",
            "-w",
            "write",
            "--io-count",
            "2000",
            "-e",
            "PRACT=1",
        ]);
        ok(&o, "PRACT fill after format --pi 2");
    }
    // REFTAG too: blocks not written since this Format NVM read with QEMU's
    // all-ones tuple (checks off) because the bed's drive has discard=unmap;
    // without it their zero tuple failed the reference tag check
    // (docs/io.md, "After a Format NVM").
    perf_verify(&dev, &["-e", "PRACT=0,PRCHK=GUARD|REFTAG|APPTAG"]);
    perf_verify(&dev, &["-e", "PRACT=1,PRCHK=GUARD"]);
    // Extended LBA without PI.
    let o = upnvme(&["format", "-d", &dev, "-n", "1", "--lbaf", &l16, "--ms", "1"]);
    ok(&o, "format --ms 1");
    perf_verify(&dev, &[]);
    let (mset, pi, pil) = (
        env_u64("UPNVME_VM_NS1_MSET").to_string(),
        env_u64("UPNVME_VM_NS1_PI").to_string(),
        env_u64("UPNVME_VM_NS1_PIL").to_string(),
    );
    let now = lbaf_now.to_string();
    let o = upnvme(&[
        "format", "-d", &dev, "-n", "1", "--lbaf", &now, "--ms", &mset, "--pi", &pi, "--pil", &pil,
    ]);
    ok(&o, "format back");
    // Namespace 2 (no metadata) still verifies.
    let o = upnvme(&[
        "perf",
        "-d",
        &dev,
        "-n",
        "2",
        "-q",
        "8",
        "-o",
        "16384",
        "-w",
        "randrw",
        "-M",
        "50",
        "--verify",
        "--io-count",
        "2000",
    ]);
    ok(&o, "perf on namespace 2");
}

/// A Copy on namespace 1 as the configuration formats it (8 bytes of Type 1
/// PI with the 16-bit guard in `metadata-pi`, 16 bytes with the 64-bit guard
/// in `metadata-pi64`): the data and the metadata of two source ranges land
/// at the destination byte for byte. QEMU refuses a Copy whose Descriptor
/// Format does not match the format's guard (Invalid Format): Format 0h and
/// 32-byte ranges with the 16-bit guard, Format 1h and 40-byte ranges with
/// the 64-bit one — so this fails if the driver picks the wrong one.
#[test]
fn a_copy_on_the_metadata_namespace_moves_data_and_metadata() {
    if ns1_ms().is_none() {
        return;
    }
    let c = Controller::open(&device(), ControllerOptions::default()).unwrap();
    assert!(
        c.identify().oncs & (1 << 8) != 0,
        "QEMU's controller offers Copy (ONCS bit 8)"
    );
    let ns = c.namespace(1).unwrap().clone();
    let (bs, ms) = (ns.lba_size() as usize, usize::from(ns.metadata_size()));
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // Two extents with valid protection information (checked by nothing
    // here: no PRCHK bits, so the tuples are plain bytes to the Copy).
    let mut all = (Vec::new(), Vec::new());
    for (slba, blocks, seed) in [(300u64, 3usize, 0x31u8), (310, 2, 0x47)] {
        let data = pattern(seed, blocks * bs);
        let mut md = pattern(seed ^ 0xff, blocks * ms);
        if let Some(f) = ns.pi_format() {
            assert!(f.protect(&data, &mut md, 0x0c0f, slba));
        }
        let write = IoCommand::Write {
            ns: &ns,
            slba,
            blocks: blocks as u32,
        };
        let w = run(&mut qp, write, memory(&c, &ns, &data, &md));
        assert!(w.is_ok(), "write {:?}", w.result);
        all.0.extend_from_slice(&data);
        all.1.extend_from_slice(&md);
    }
    let ranges = [
        upnvme::CopyRange {
            slba: 300,
            blocks: 3,
        },
        upnvme::CopyRange {
            slba: 310,
            blocks: 2,
        },
    ];
    let copy = IoCommand::Copy {
        ns: &ns,
        sdlba: 400,
        ranges: &ranges,
    };
    let done = run(&mut qp, copy, IoData::none());
    assert!(done.is_ok(), "Copy {:?}", done.result);
    let read = IoCommand::Read {
        ns: &ns,
        slba: 400,
        blocks: 5,
    };
    let blank = (vec![0u8; 5 * bs], vec![0u8; 5 * ms]);
    let r = run(&mut qp, read, memory(&c, &ns, &blank.0, &blank.1));
    assert!(r.is_ok(), "read {:?}", r.result);
    let (d, m) = split_back(&ns, &r, 5);
    assert!(d == all.0, "the Copy moved other data");
    assert!(m == all.1, "the Copy moved other metadata");
    // The copied tuples carry the source blocks' reference tags: rewrite the
    // destination with tags of its own, so that later tests reading the
    // namespace with REFTAG checks (perf -e in the tool test) find valid PI.
    let mut md = pattern(0x99, 5 * ms);
    if let Some(f) = ns.pi_format() {
        assert!(f.protect(&all.0, &mut md, 0x0c0f, 400));
    }
    let write = IoCommand::Write {
        ns: &ns,
        slba: 400,
        blocks: 5,
    };
    let w = run(&mut qp, write, memory(&c, &ns, &all.0, &md));
    assert!(w.is_ok(), "rewrite {:?}", w.result);
}

/// Runs the C example `metadata_c` (driver/capi/examples/metadata.c) on
/// namespaces 1 and 2; its standard output.
fn metadata_c() -> String {
    let o = std::process::Command::new("metadata_c")
        .args([device().as_str(), "1", "2"])
        .output()
        .expect("metadata_c is on the guest's PATH (cargo xtask builds it)");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {out}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Formats namespace 1 as `f` through the Rust library (the C example then
/// opens the controller itself); the new layout.
fn format_ns1(f: &FormatNvm) -> upnvme::MetadataLayout {
    let mut c = Controller::open(&device(), ControllerOptions::default()).unwrap();
    let ns = c.format_nvm(1, f).unwrap();
    let l = ns.metadata_layout().expect("metadata in the new format");
    c.close().unwrap();
    l
}

/// Formats namespace 1 back to its configured format when a test fails
/// between its formats (so that the configuration's later tests, and the
/// bed's check of the backing file, meet the format they expect). Without
/// a panic of its own: it runs while one unwinds.
struct FormatBack(FormatNvm);

impl Drop for FormatBack {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let back = Controller::open(&device(), ControllerOptions::default())
            .map_err(|e| e.to_string())
            .and_then(|mut c| {
                let r = c
                    .format_nvm(1, &self.0)
                    .map(drop)
                    .map_err(|e| e.to_string());
                let _ = c.close();
                r
            });
        if let Err(e) = back {
            eprintln!("namespace 1 could not be formatted back after the failure: {e}");
        }
    }
}

/// The C API's metadata and protection information (`upnvme_read_ext`,
/// `upnvme_write_ext`, `upnvme_write_zeroes_ext`, `struct upnvme_io_ext`):
/// the example runs on namespace 1 as configured (extended LBA, PI Type 1),
/// then formatted with a separate metadata buffer and the tuple first, then
/// with separate metadata and no protection information, and namespace 1
/// is formatted back. In each, what the example prints is what the Rust
/// library reads of the format, so a step it skips fails the test; its
/// transfers are checked by the bed's IOMMU fault count.
#[test]
fn metadata_from_c_in_both_layouts_with_and_without_pi() {
    let Some(ms) = ns1_ms() else { return };
    let (layout, original, lbaf) = {
        let c = Controller::open(&device(), ControllerOptions::default()).unwrap();
        let ns = c.namespace(1).unwrap().clone();
        let l = ns
            .metadata_layout()
            .expect("namespace 1 reports its metadata");
        let lbaf = lbaf_with(&ns, ms);
        let original = FormatNvm {
            extended: l.extended,
            pi_type: l.pi_type,
            pi_first: l.pi_first,
            ..FormatNvm::lbaf(lbaf)
        };
        c.close().unwrap();
        (l, original, lbaf)
    };
    let guard = layout.pif.guard_bits();
    let lines = |l: &upnvme::MetadataLayout| {
        let head = format!(
            "namespace 1: 4096-byte blocks with {ms} bytes of metadata, {}, PI type {}",
            if l.extended {
                "extended LBA"
            } else {
                "separate buffer"
            },
            l.pi_type
        );
        if l.pi_type == 0 {
            return vec![
                format!("{head}\n"),
                "namespace 1: 4 blocks of data and metadata written and read back equal".into(),
            ];
        }
        let stripped = usize::from(ms) == l.pif.tuple_size();
        vec![
            format!(
                "{head} ({guard}-bit guard, tuple in the {} bytes)",
                if l.pi_first { "first" } else { "last" }
            ),
            "namespace 1: 4 blocks written with PRACT, read back with their tuples: each \
             reference tag is its LBA"
                .into(),
            format!(
                "namespace 1: read with PRACT, {}",
                if stripped {
                    "the controller checked and stripped the tuples"
                } else {
                    "checked"
                }
            ),
            "namespace 1: a wrong reference tag is End-to-end Reference Tag Check Error \
             (sct 2 sc 0x84)"
                .into(),
            "namespace 1: Write Zeroes with PRACT reads back as checked zeroes".into(),
        ]
    };
    let check = |l: &upnvme::MetadataLayout| {
        let out = metadata_c();
        for line in lines(l) {
            assert!(out.contains(&line), "{line:?} not in:\n{out}");
        }
        assert!(
            out.contains("namespace 2: no metadata in its format, nothing to show"),
            "{out}"
        );
    };
    check(&layout);
    let _back = FormatBack(original);
    let separate_first = FormatNvm {
        extended: false,
        pi_type: 1,
        pi_first: true,
        ..FormatNvm::lbaf(lbaf)
    };
    let l = format_ns1(&separate_first);
    assert_eq!((l.extended, l.pi_type, l.pi_first), (false, 1, true));
    check(&l);
    let plain = FormatNvm {
        extended: false,
        ..FormatNvm::lbaf(lbaf)
    };
    let l = format_ns1(&plain);
    assert_eq!((l.extended, l.pi_type), (false, 0));
    check(&l);
    // Back to the configured format for the tests that follow.
    assert_eq!(format_ns1(&original), layout);
}
