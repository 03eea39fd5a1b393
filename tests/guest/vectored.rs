//! Guest tests of buffer slices, vectored I/O and SGLs against QEMU's
//! controller. Every transfer is checked byte for byte through a second,
//! independent encoding (a vector written by SGL is read back through plain
//! PRPs into one buffer, and the other way round), and the harness fails the
//! run on any IOMMU fault: a segment the driver described wrongly would show
//! up as a DMAR fault or as wrong bytes.

use std::time::Duration;

use upnvme::{
    Completion, Controller, ControllerOptions, IoCommand, IoData, IoQueuePair, IoVec, Namespace,
    QueuePairOptions, SglMode,
};

const T: Duration = Duration::from_secs(10);

fn open() -> Controller {
    Controller::open(&crate::vm::device(), ControllerOptions::default()).unwrap()
}

/// xorshift bytes for `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn wait_one(qp: &mut IoQueuePair) -> Completion {
    let start = std::time::Instant::now();
    loop {
        if let Some(c) = qp.next_completion().unwrap() {
            return c;
        }
        assert!(start.elapsed() < T, "no completion within {T:?}");
    }
}

fn run(qp: &mut IoQueuePair, cmd: IoCommand<'_>, io: IoData) -> Completion {
    if let Err(r) = qp.submit_io(cmd, io, 1) {
        panic!("{} refused: {}", cmd.name(), r.reason);
    }
    let c = wait_one(qp);
    assert!(c.is_ok(), "{} failed: {:?}", cmd.name(), c.result);
    c
}

/// A vector over fresh buffers, one per (offset, length), each buffer
/// filled with 0xa5 around its segment.
fn vector(c: &Controller, layout: &[(usize, usize)]) -> IoVec {
    let mut v = IoVec::with_capacity(layout.len());
    for &(off, len) in layout {
        let b = c.alloc_dma(off + len).unwrap();
        b.fill(0, b.len(), 0xa5).unwrap();
        v.push(b, off, len).unwrap();
    }
    v
}

fn scatter(v: &IoVec, data: &[u8]) {
    let mut at = 0;
    for s in v.segments() {
        s.buffer()
            .write_bytes(s.offset(), &data[at..at + s.len()])
            .unwrap();
        at += s.len();
    }
}

fn gather(v: &IoVec) -> Vec<u8> {
    let mut out = Vec::new();
    for s in v.segments() {
        let mut b = vec![0u8; s.len()];
        s.buffer().read_bytes(s.offset(), &mut b).unwrap();
        out.extend_from_slice(&b);
    }
    out
}

/// Cuts `total` bytes into segments of mixed sizes at mixed offsets (some
/// not dword aligned when `bytes_ok`), deterministic for `seed`.
fn odd_layout(seed: u64, total: usize, bytes_ok: bool) -> Vec<(usize, usize)> {
    let mut x = seed | 1;
    let mut next = |m: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x as usize) % m
    };
    let mut out = Vec::new();
    let mut left = total;
    while left > 0 {
        let unit = if bytes_ok { 1 } else { 4 };
        let len = ((1 + next(9000)) * unit).min(left);
        let len = if left - len < unit { left } else { len };
        let off = next(4096) / unit * unit;
        out.push((off, len));
        left -= len;
    }
    out
}

/// Writes through `write_layout`, reads back through one PRP buffer and
/// through `read_layout`; all three must agree.
fn round_trip(
    c: &Controller,
    qp: &mut IoQueuePair,
    ns: &Namespace,
    slba: u64,
    seed: u64,
    write_layout: &[(usize, usize)],
    read_layout: &[(usize, usize)],
) {
    let total: usize = write_layout.iter().map(|l| l.1).sum();
    assert_eq!(total, read_layout.iter().map(|l| l.1).sum::<usize>());
    let blocks = (total / ns.lba_size() as usize) as u32;
    let data = pattern(seed, total);
    let v = vector(c, write_layout);
    scatter(&v, &data);
    run(
        qp,
        IoCommand::Write { ns, slba, blocks },
        IoData::vectored(v),
    );
    // Independent check: a plain read (PRPs, one buffer).
    let buf = c.alloc_dma(total).unwrap();
    let buf = qp.read_blocking(ns, slba, blocks, buf, T).unwrap();
    let mut back = vec![0u8; total];
    buf.read_bytes(0, &mut back).unwrap();
    assert!(
        back == data,
        "vectored write of {write_layout:?} stored other bytes"
    );
    // And a vectored read, cut differently.
    let v = vector(c, read_layout);
    let done = run(
        qp,
        IoCommand::Read { ns, slba, blocks },
        IoData::vectored(v),
    );
    let v = done.segments.expect("the vector comes back");
    assert!(
        gather(&v) == data,
        "vectored read of {read_layout:?} got other bytes"
    );
    // Nothing outside the segments was written.
    for (s, &(off, len)) in v.segments().iter().zip(read_layout) {
        let mut all = vec![0u8; s.buffer().len()];
        s.buffer().read_bytes(0, &mut all).unwrap();
        assert!(
            all[..off].iter().all(|&b| b == 0xa5),
            "bytes before a segment"
        );
        assert!(
            all[off + len..].iter().all(|&b| b == 0xa5),
            "bytes after a segment"
        );
    }
}

#[test]
fn qemu_reports_sgl_support() {
    let c = open();
    assert!(
        c.sgl_support().supported(),
        "QEMU's controller advertises SGLs (SGLS {:#x}); the SGL tests rely on it",
        c.identify().sgls
    );
}

#[test]
fn sgl_vectors_with_odd_offsets_and_sizes_round_trip() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let max = qp.max_transfer();
    let mut slba = 64u64;
    for (i, blocks) in [1usize, 2, 7, 16, 33].into_iter().enumerate() {
        let total = (blocks * lba).min(max);
        let seed = 100 + i as u64;
        // Byte-granular pieces (SGLS 01b: no alignment requirement).
        let bytes_ok = c.sgl_support() == upnvme::SglSupport::Unaligned;
        let w = odd_layout(seed, total, bytes_ok);
        let r = odd_layout(seed * 7, total, bytes_ok);
        round_trip(&c, &mut qp, &ns, slba, seed, &w, &r);
        slba += (total / lba) as u64;
    }
}

#[test]
fn prp_vectors_with_page_aligned_boundaries_round_trip() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            // PRPs only: a layout PRPs cannot carry would be refused.
            sgl: SglMode::Never,
            ..Default::default()
        })
        .unwrap();
    // First segment ends on a page, middle ones are whole pages, the last
    // ends anywhere: PRP1 and a PRP List across several buffers.
    let layouts: [&[(usize, usize)]; 3] = [
        &[(4096 - lba, lba), (0, 4096)],
        &[
            (4096 - 2 * lba.min(2048), 2 * lba.min(2048)),
            (0, 8192),
            (0, 4096 * 5),
            (0, lba),
        ],
        &[(0, 4096), (0, 4096), (0, 4096), (0, 4096)],
    ];
    let mut slba = 1024u64;
    for (i, l) in layouts.iter().enumerate() {
        let total: usize = l.iter().map(|x| x.1).sum();
        assert_eq!(total % lba, 0);
        let same: Vec<(usize, usize)> = l.to_vec();
        round_trip(&c, &mut qp, &ns, slba, 200 + i as u64, l, &same);
        slba += (total / lba) as u64;
    }
}

#[test]
fn sgl_always_verified_at_depth_for_every_size() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            sgl: SglMode::Always,
            ..Default::default()
        })
        .unwrap();
    let max_blocks = (qp.max_transfer() / lba) as u32;
    let sizes: Vec<u32> = [1, 2, 3, 8, 9, 31, 64, max_blocks]
        .into_iter()
        .filter(|&b| b <= max_blocks)
        .collect();
    let depth = 8usize.min(qp.max_depth() as usize);
    let mut layout = Vec::new();
    let mut next = 4096u64;
    for round in 0..3u64 {
        for &b in &sizes {
            layout.push((next, b, round));
            next += u64::from(b);
        }
    }
    assert!(next <= ns.lba_count());
    for write in [true, false] {
        let mut i = 0;
        let mut inflight = 0;
        while i < layout.len() || inflight > 0 {
            while inflight < depth && i < layout.len() {
                let (slba, blocks, seed) = layout[i];
                let len = blocks as usize * lba;
                let buf = c.alloc_dma(len).unwrap();
                let cmd = if write {
                    buf.write_bytes(0, &pattern(seed ^ slba, len)).unwrap();
                    IoCommand::Write {
                        ns: &ns,
                        slba,
                        blocks,
                    }
                } else {
                    IoCommand::Read {
                        ns: &ns,
                        slba,
                        blocks,
                    }
                };
                qp.submit(cmd, Some(buf), i as u64).unwrap();
                inflight += 1;
                i += 1;
            }
            qp.process_completions(64, |_, cpl| {
                assert!(cpl.is_ok(), "{:?}", cpl.result);
                inflight -= 1;
                if !write {
                    let (slba, blocks, seed) = layout[cpl.tag as usize];
                    let len = blocks as usize * lba;
                    let mut got = vec![0u8; len];
                    cpl.buffer.unwrap().read_bytes(0, &mut got).unwrap();
                    assert!(got == pattern(seed ^ slba, len), "SGL read at {slba}");
                }
            })
            .unwrap();
        }
    }
}

#[test]
fn slices_at_dword_and_byte_offsets() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // Dword offsets go as PRPs; the byte offset needs an SGL (Auto).
    for (i, (offset, blocks)) in [(4usize, 1usize), (4092, 3), (12, 9), (1, 2), (4095, 5)]
        .into_iter()
        .enumerate()
    {
        let len = blocks * lba;
        let slba = 8192 + 64 * i as u64;
        let data = pattern(300 + i as u64, len);
        let buf = c.alloc_dma(offset + len + 100).unwrap();
        buf.fill(0, buf.len(), 0x11).unwrap();
        buf.write_bytes(offset, &data).unwrap();
        let blocks = blocks as u32;
        let done = run(
            &mut qp,
            IoCommand::Write {
                ns: &ns,
                slba,
                blocks,
            },
            IoData::slice(buf, offset, len),
        );
        let buf = done.buffer.unwrap();
        let plain = qp
            .read_blocking(&ns, slba, blocks, c.alloc_dma(len).unwrap(), T)
            .unwrap();
        let mut back = vec![0u8; len];
        plain.read_bytes(0, &mut back).unwrap();
        assert!(back == data, "slice write at offset {offset}");
        buf.fill(0, buf.len(), 0x22).unwrap();
        let at = offset + 8;
        let done = run(
            &mut qp,
            IoCommand::Read {
                ns: &ns,
                slba,
                blocks,
            },
            IoData::slice(buf, at, len),
        );
        let buf = done.buffer.unwrap();
        let mut all = vec![0u8; buf.len()];
        buf.read_bytes(0, &mut all).unwrap();
        assert!(all[at..at + len] == data[..], "slice read at offset {at}");
        assert!(all[..at].iter().all(|&b| b == 0x22));
        assert!(all[at + len..].iter().all(|&b| b == 0x22));
    }
}

#[test]
fn a_full_list_page_of_sgl_descriptors() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // 256 Data Blocks (one 4 KiB list page of descriptors), each of the
    // same size, at offsets 4 bytes into 64-byte pieces of one buffer.
    let total = lba * (4096 / lba).max(1);
    let each = total / 256;
    let mut v = IoVec::with_capacity(256);
    let pieces = c.alloc_dma(256 * 64).unwrap().split(64).unwrap();
    for p in pieces.into_iter().take(256) {
        v.push(p, 4, each).unwrap();
    }
    let data = pattern(77, total);
    scatter(&v, &data);
    let blocks = (total / lba) as u32;
    let done = run(
        &mut qp,
        IoCommand::Write {
            ns: &ns,
            slba: 16384,
            blocks,
        },
        IoData::vectored(v),
    );
    assert_eq!(done.segments.map(|v| v.len()), Some(256));
    let buf = qp
        .read_blocking(&ns, 16384, blocks, c.alloc_dma(total).unwrap(), T)
        .unwrap();
    let mut back = vec![0u8; total];
    buf.read_bytes(0, &mut back).unwrap();
    assert!(back == data);
}

/// Whether Identify Controller ONCS has `bit`.
fn oncs(c: &Controller, bit: u16) -> bool {
    c.identify().oncs & (1 << bit) != 0
}

#[test]
fn fua_and_limited_retry_round_trip() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    for (i, flags) in [
        upnvme::IoFlags::FUA,
        upnvme::IoFlags {
            fua: true,
            limited_retry: true,
        },
    ]
    .into_iter()
    .enumerate()
    {
        let slba = 20_000 + 8 * i as u64;
        let data = pattern(500 + i as u64, 2 * lba);
        let buf = c.alloc_dma(data.len()).unwrap();
        buf.write_bytes(0, &data).unwrap();
        let w = IoCommand::Write {
            ns: &ns,
            slba,
            blocks: 2,
        };
        let done = run(&mut qp, w, IoData::buffer(buf).flags(flags));
        let buf = done.buffer.unwrap();
        buf.fill(0, buf.len(), 0).unwrap();
        let r = IoCommand::Read {
            ns: &ns,
            slba,
            blocks: 2,
        };
        let done = run(&mut qp, r, IoData::buffer(buf).flags(flags));
        let mut back = vec![0u8; data.len()];
        done.buffer.unwrap().read_bytes(0, &mut back).unwrap();
        assert!(back == data, "FUA round trip {flags:?}");
    }
}

/// Verify, Copy and Write Uncorrectable where QEMU's controller advertises
/// them (ONCS bits 7, 8 and 1), the typed refusal where it does not.
#[test]
fn verify_copy_and_write_uncorrectable_or_their_refusal() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let a = pattern(600, 3 * lba);
    let b = pattern(601, 2 * lba);
    for (slba, d) in [(30_000u64, &a), (30_100, &b)] {
        let buf = c.alloc_dma(d.len()).unwrap();
        buf.write_bytes(0, d).unwrap();
        qp.write_blocking(&ns, slba, (d.len() / lba) as u32, buf, T)
            .unwrap();
    }
    let verify = IoCommand::Verify {
        ns: &ns,
        slba: 30_000,
        blocks: 3,
    };
    if oncs(&c, 7) {
        run(&mut qp, verify, IoData::none());
    } else {
        let r = qp.submit_io(verify, IoData::none(), 1).unwrap_err();
        assert_eq!(r.reason, upnvme::Reject::Unsupported { command: "Verify" });
    }
    let ranges = [
        upnvme::CopyRange {
            slba: 30_100,
            blocks: 2,
        },
        upnvme::CopyRange {
            slba: 30_000,
            blocks: 3,
        },
    ];
    let copy = IoCommand::Copy {
        ns: &ns,
        sdlba: 30_200,
        ranges: &ranges,
    };
    if oncs(&c, 8) {
        run(&mut qp, copy, IoData::none());
        let buf = qp
            .read_blocking(&ns, 30_200, 5, c.alloc_dma(5 * lba).unwrap(), T)
            .unwrap();
        let mut back = vec![0u8; 5 * lba];
        buf.read_bytes(0, &mut back).unwrap();
        let mut want = b.clone();
        want.extend_from_slice(&a);
        assert!(back == want, "Copy moved other bytes");
    } else {
        let r = qp.submit_io(copy, IoData::none(), 1).unwrap_err();
        assert_eq!(r.reason, upnvme::Reject::Unsupported { command: "Copy" });
    }
    let wu = IoCommand::WriteUncorrectable {
        ns: &ns,
        slba: 30_300,
        blocks: 1,
    };
    if oncs(&c, 1) {
        run(&mut qp, wu, IoData::none());
        let e = qp
            .read_blocking(&ns, 30_300, 1, c.alloc_dma(lba).unwrap(), T)
            .unwrap_err();
        assert!(e.to_string().contains("Unrecovered"), "{e}");
    } else {
        let r = qp.submit_io(wu, IoData::none(), 1).unwrap_err();
        assert_eq!(
            r.reason,
            upnvme::Reject::Unsupported {
                command: "Write Uncorrectable"
            }
        );
    }
}

/// A cross-namespace Copy (Copy Descriptor Format 2h, NVMe 2.1) where QEMU
/// reports it (OCFS bit 2; QEMU 10.0 reports 0Fh): the driver enabled it at
/// bring-up (Host Behavior Support CDFE), and blocks of namespace 1 and of
/// namespace 2 (where the configuration has one of the same format, else of
/// namespace 1 itself) land in namespace 1 in order, byte for byte. Without
/// OCFS bit 2 or Copy, the typed refusal.
#[test]
fn a_cross_namespace_copy_moves_blocks_between_namespaces() {
    let c = open();
    let ns1 = c.namespace(1).unwrap().clone();
    let other = c
        .namespace(2)
        .ok()
        .filter(|n| n.lba_size() == ns1.lba_size() && n.metadata_layout() == ns1.metadata_layout())
        .cloned()
        .unwrap_or_else(|| ns1.clone());
    let lba = ns1.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let a = pattern(810, 3 * lba);
    let b = pattern(811, 2 * lba);
    for (ns, slba, d) in [(&other, 40_000u64, &a), (&ns1, 40_100, &b)] {
        let buf = c.alloc_dma(d.len()).unwrap();
        buf.write_bytes(0, d).unwrap();
        qp.write_blocking(ns, slba, (d.len() / lba) as u32, buf, T)
            .unwrap();
    }
    // Namespace 1's own range first: QEMU 10.0.2 reads every range after
    // one of another namespace from that namespace, even one whose SNSID is
    // the destination's (hw/nvme/ctrl.c, nvme_do_copy keeps the last source
    // namespace when SNSID equals the command's NSID; seen here as blocks
    // [a0, a1, a2, zeros, zeros] with the other order). The model test
    // `a_cross_namespace_copy_moves_blocks_of_another_namespace` covers
    // that order.
    let sources = [
        upnvme::CopySource {
            ns: &ns1,
            slba: 40_100,
            blocks: 2,
        },
        upnvme::CopySource {
            ns: &other,
            slba: 40_001,
            blocks: 2,
        },
        upnvme::CopySource {
            ns: &other,
            slba: 40_000,
            blocks: 1,
        },
    ];
    let copy = IoCommand::CrossNamespaceCopy {
        ns: &ns1,
        sdlba: 40_200,
        sources: &sources,
    };
    if !oncs(&c, 8) {
        let r = qp.submit_io(copy, IoData::none(), 1).unwrap_err();
        assert_eq!(r.reason, upnvme::Reject::Unsupported { command: "Copy" });
        return;
    }
    // Format 3h on a 32- or 64-bit guard destination, else 2h.
    let wide = ns1
        .metadata_layout()
        .is_some_and(|l| l.pif != upnvme::pi::Pif::Guard16);
    let format = if wide { 3 } else { 2 };
    if c.identify().ocfs & (1 << format) == 0 {
        let r = qp.submit_io(copy, IoData::none(), 1).unwrap_err();
        assert_eq!(r.reason, upnvme::Reject::CopyFormat { format });
        return;
    }
    run(&mut qp, copy, IoData::none());
    let buf = qp
        .read_blocking(&ns1, 40_200, 5, c.alloc_dma(5 * lba).unwrap(), T)
        .unwrap();
    let mut back = vec![0u8; 5 * lba];
    buf.read_bytes(0, &mut back).unwrap();
    let mut want = b.clone();
    want.extend_from_slice(&a[lba..]);
    want.extend_from_slice(&a[..lba]);
    let blocks: Vec<&str> = back
        .chunks(lba)
        .map(|blk| {
            if let Some(i) = a.chunks(lba).position(|x| x == blk) {
                ["a0", "a1", "a2"][i]
            } else if let Some(i) = b.chunks(lba).position(|x| x == blk) {
                ["b0", "b1"][i]
            } else if blk.iter().all(|&x| x == 0) {
                "zeros"
            } else {
                "other"
            }
        })
        .collect();
    assert!(
        back == want,
        "the cross-namespace Copy from namespace {} moved other bytes: blocks {blocks:?}",
        other.id()
    );
}

/// A Copy within the namespace's limits (Identify Namespace MSRC, MSSRL,
/// MCL; QEMU's nvme-ns reports 127, 128 and 128 unless configured) moves
/// its ranges, and one beyond each limit is refused by the pair before
/// QEMU would answer Command Size Limit Exceeded.
#[test]
fn a_copy_up_to_the_namespaces_limits_goes_and_beyond_them_is_refused() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    if !oncs(&c, 8) {
        let one = [upnvme::CopyRange { slba: 0, blocks: 1 }];
        let copy = IoCommand::Copy {
            ns: &ns,
            sdlba: 10,
            ranges: &one,
        };
        let r = qp.submit_io(copy, IoData::none(), 1).unwrap_err();
        assert_eq!(r.reason, upnvme::Reject::Unsupported { command: "Copy" });
        return;
    }
    let id = ns.identify();
    let (ranges_max, mssrl, mcl) = (usize::from(id.msrc) + 1, u32::from(id.mssrl), id.mcl);
    assert!(
        mssrl > 0 && mcl > 0,
        "QEMU supports Copy but reports MSSRL {mssrl}, MCL {mcl}"
    );
    let lba = ns.lba_size() as usize;
    let src = 50_000u64;
    // Ranges of at most MSSRL blocks, at most MSRC + 1 of them, MCL blocks
    // in all when that fits (else as many as they can hold).
    let total = mcl.min(mssrl * ranges_max.min(128) as u32).min(1024);
    let mut ranges = Vec::new();
    let mut at = 0u32;
    while at < total {
        let n = mssrl.min(total - at);
        ranges.push(upnvme::CopyRange {
            slba: src + u64::from(at),
            blocks: n,
        });
        at += n;
    }
    ranges.reverse();
    let data = pattern(700, total as usize * lba);
    for (i, chunk) in data.chunks(16 * lba).enumerate() {
        let buf = c.alloc_dma(chunk.len()).unwrap();
        buf.write_bytes(0, chunk).unwrap();
        let blocks = (chunk.len() / lba) as u32;
        qp.write_blocking(&ns, src + 16 * i as u64, blocks, buf, T)
            .unwrap();
    }
    let dst = src + 2048;
    let copy = IoCommand::Copy {
        ns: &ns,
        sdlba: dst,
        ranges: &ranges,
    };
    run(&mut qp, copy, IoData::none());
    let mut want = Vec::with_capacity(data.len());
    for r in &ranges {
        let off = (r.slba - src) as usize * lba;
        want.extend_from_slice(&data[off..off + r.blocks as usize * lba]);
    }
    let mut back = Vec::with_capacity(data.len());
    for i in 0..total.div_ceil(16) {
        let blocks = 16.min(total - 16 * i);
        let buf = qp
            .read_blocking(
                &ns,
                dst + 16 * u64::from(i),
                blocks,
                c.alloc_dma(blocks as usize * lba).unwrap(),
                T,
            )
            .unwrap();
        let mut part = vec![0u8; blocks as usize * lba];
        buf.read_bytes(0, &mut part).unwrap();
        back.extend_from_slice(&part);
    }
    assert!(
        back == want,
        "the Copy of {total} blocks in {} ranges moved other bytes",
        ranges.len()
    );
    // One block more than a range may hold, than a Copy may cover, one
    // range more than MSRC allows: refused, nothing sent.
    let refused = |qp: &mut IoQueuePair, ranges: &[upnvme::CopyRange]| {
        let copy = IoCommand::Copy {
            ns: &ns,
            sdlba: dst,
            ranges,
        };
        qp.submit_io(copy, IoData::none(), 1).unwrap_err().reason
    };
    let long = [upnvme::CopyRange {
        slba: src,
        blocks: mssrl + 1,
    }];
    assert_eq!(
        refused(&mut qp, &long),
        upnvme::Reject::SizeLimit {
            limit: upnvme::NvmLimit::CopyRangeBlocks,
            max: u64::from(mssrl)
        }
    );
    if mcl < mssrl * ranges_max.min(128) as u32 {
        let mut over = Vec::new();
        let mut left = mcl + 1;
        while left > 0 {
            let n = mssrl.min(left);
            over.push(upnvme::CopyRange {
                slba: src,
                blocks: n,
            });
            left -= n;
        }
        assert_eq!(
            refused(&mut qp, &over),
            upnvme::Reject::SizeLimit {
                limit: upnvme::NvmLimit::CopyBlocks,
                max: u64::from(mcl)
            }
        );
    }
    if ranges_max < 128 {
        let many = vec![
            upnvme::CopyRange {
                slba: src,
                blocks: 1
            };
            ranges_max + 1
        ];
        assert_eq!(
            refused(&mut qp, &many),
            upnvme::Reject::RangeCount {
                command: upnvme::RangeCommand::Copy,
                ranges: ranges_max as u32 + 1,
                max: ranges_max as u32
            }
        );
    }
}

#[test]
fn a_raw_write_and_read_through_the_driver_data_pointer() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let data = pattern(700, 3 * lba);
    let buf = c.alloc_dma(data.len() + 64).unwrap();
    buf.write_bytes(64, &data).unwrap();
    let sqe = upnvme::Sqe::write(ns.id(), 31_000, 3);
    let cmd = IoCommand::Raw {
        ns: &ns,
        sqe: &sqe,
        data_len: data.len(),
    };
    run(&mut qp, cmd, IoData::slice(buf, 64, data.len()));
    let sqe = upnvme::Sqe::read(ns.id(), 31_000, 3);
    let v = vector(&c, &[(3, lba + 1), (0, 2 * lba - 1)]);
    let cmd = IoCommand::Raw {
        ns: &ns,
        sqe: &sqe,
        data_len: data.len(),
    };
    let done = run(&mut qp, cmd, IoData::vectored(v));
    assert!(gather(&done.segments.unwrap()) == data);
}

/// Vectors above MDTS (split.rs): cut into commands of at most MDTS whose
/// boundaries fall inside segments, each an SGL; written, read back plain
/// and through another vector, byte exact, nothing outside a segment
/// touched (and the harness's IOMMU fault count stays 0).
#[test]
fn sgl_vectors_above_mdts_are_split_and_round_trip() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let total = 2 * qp.max_transfer() + 3 * lba;
    let layout = |lens: &[usize], offs: &[usize]| {
        let mut out = Vec::new();
        let mut left = total;
        for (i, &len) in lens.iter().cycle().enumerate() {
            if left == 0 {
                break;
            }
            let len = len.min(left);
            out.push((offs[i % offs.len()], len));
            left -= len;
        }
        out
    };
    let w = layout(&[50_004, 65_000, 33_332, 70_000], &[0, 4, 100, 2048]);
    let r = layout(&[81_920, 12_004, 99_996], &[8, 0, 512]);
    round_trip(&c, &mut qp, &ns, 4096, 900, &w, &r);
}
