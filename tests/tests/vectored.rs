//! Host tests of buffer slices, vectored I/O and SGLs against the model: byte
//! exact against what the model stored, with the encoding the driver chose
//! (PRP or SGL, counted by the model), every refusal handing the memory
//! back, and the model's own SGL walker checking the driver's lists.

mod common;

use common::{T, assert_clean, buffer_with, config_one_ns, pattern, read_back, run_io, setup};
use upnvme::{Controller, Error, IoCommand, IoData, IoVec, QueuePairOptions, Reject, SglMode};
use upnvme_tests::{ModelConfig, ModelController};

/// A model with one namespace of 512-byte blocks and the given SGLS.
fn model_with_sgls(sgls: u32) -> (ModelController, Controller<ModelController>) {
    setup(ModelConfig {
        sgls,
        ..config_one_ns(512, 8192)
    })
}

/// Data transfers (PRP, SGL) the model walked since `base`.
fn encodings(m: &ModelController, base: (u64, u64)) -> (u64, u64) {
    let (p, s) = m.transfers_by_encoding();
    (p - base.0, s - base.1)
}

/// A vector over fresh buffers: for each (buffer length, offset, length).
fn vector(c: &Controller<ModelController>, layout: &[(usize, usize, usize)]) -> IoVec {
    let mut v = IoVec::with_capacity(layout.len());
    for &(size, off, len) in layout {
        let b = c.alloc_dma(size).unwrap();
        b.fill(0, size, 0xa5).unwrap();
        v.push(b, off, len).unwrap();
    }
    v
}

/// Writes `data` across the vector's segments in order.
fn scatter(v: &IoVec, data: &[u8]) {
    let mut at = 0;
    for s in v.segments() {
        let n = s.len().min(data.len() - at);
        s.buffer()
            .write_bytes(s.offset(), &data[at..at + n])
            .unwrap();
        at += n;
    }
}

/// The vector's bytes, in order.
fn gather(v: &IoVec) -> Vec<u8> {
    let mut out = Vec::new();
    for s in v.segments() {
        let mut b = vec![0u8; s.len()];
        s.buffer().read_bytes(s.offset(), &mut b).unwrap();
        out.extend_from_slice(&b);
    }
    out
}

#[test]
fn slices_read_and_write_inside_a_larger_buffer() {
    let (m, c) = model_with_sgls(0);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let base = m.transfers_by_encoding();
    for (offset, blocks) in [(4usize, 1u32), (512, 8), (4092, 9), (1000, 17)] {
        let data = pattern(offset as u64, blocks as usize * 512);
        let buf = c.alloc_dma(offset + data.len() + 4096).unwrap();
        let size = buf.len();
        buf.fill(0, buf.len(), 0x5a).unwrap();
        buf.write_bytes(offset, &data).unwrap();
        let cmd = IoCommand::Write {
            ns: &ns,
            slba: 100,
            blocks,
        };
        let done = run_io(&mut qp, cmd, IoData::slice(buf, offset, data.len()));
        assert!(done.is_ok(), "{:?}", done.result);
        assert_eq!(m.namespace_data(1, 100, u64::from(blocks)), data);
        // The whole buffer came back.
        let buf = done.buffer.unwrap();
        assert_eq!(buf.len(), size);
        // Read it back into another place of the same buffer: the bytes
        // around the slice stay untouched.
        buf.fill(0, buf.len(), 0).unwrap();
        let at = offset + 8;
        let cmd = IoCommand::Read {
            ns: &ns,
            slba: 100,
            blocks,
        };
        let done = run_io(&mut qp, cmd, IoData::slice(buf, at, data.len()));
        assert!(done.is_ok());
        let buf = done.buffer.unwrap();
        let all = read_back(&buf, buf.len());
        assert_eq!(&all[at..at + data.len()], &data[..]);
        assert!(all[..at].iter().all(|&b| b == 0));
        assert!(all[at + data.len()..].iter().all(|&b| b == 0));
    }
    assert_eq!(encodings(&m, base).1, 0, "no SGL on a controller without");
    assert_clean(&m);
}

#[test]
fn slice_refusals_hand_the_buffer_back() {
    let (m, c) = model_with_sgls(0);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let base = m.transfers_by_encoding();
    let fetched = m.commands_fetched();
    let read = IoCommand::Read {
        ns: &ns,
        slba: 0,
        blocks: 2,
    };
    let cases = [
        (
            4000usize,
            8192usize,
            Reject::SliceOutOfBounds {
                offset: 4000,
                len: 8192,
                size: 8192,
            },
        ),
        (
            0,
            0,
            Reject::SliceOutOfBounds {
                offset: 0,
                len: 0,
                size: 8192,
            },
        ),
        (0, 512, Reject::BufferTooSmall { need: 1024 }),
        // As long as no buffer can be (`usize::MAX` once meant "to the end
        // of the buffer", and the slice went through; found in review).
        (
            0,
            usize::MAX,
            Reject::SliceOutOfBounds {
                offset: 0,
                len: (usize::MAX - 1) as u64,
                size: 8192,
            },
        ),
        // Not dword aligned, no SGL support: PRP1 cannot carry it.
        (2, 1024, Reject::Misaligned),
    ];
    for (off, len, want) in cases {
        let buf = c.alloc_dma(8192).unwrap();
        let r = qp
            .submit_io(read, IoData::slice(buf, off, len), 1)
            .unwrap_err();
        assert_eq!(r.reason, want, "slice {off}+{len}");
        assert_eq!(r.buffer.map(|b| b.len()), Some(8192));
    }
    assert_eq!(qp.in_flight(), 0);
    assert_eq!(m.commands_fetched(), fetched, "nothing was sent");
    assert_eq!(encodings(&m, base), (0, 0));
    assert_clean(&m);
}

#[test]
fn vector_with_page_aligned_boundaries_goes_as_prps() {
    // Without SGL support (with it, Auto prefers an SGL: see below).
    let (m, c) = model_with_sgls(0);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let base = m.transfers_by_encoding();
    // First segment ends on a page, the middle ones are whole pages, the
    // last ends anywhere: PRP1 + list.
    let layouts: [&[(usize, usize, usize)]; 3] = [
        &[(4096, 3072, 1024), (4096, 0, 4096)],
        &[
            (8192, 512, 7680),
            (8192, 0, 8192),
            (4096, 0, 4096),
            (4096, 0, 1536),
        ],
        &[(4096, 4092, 4), (12288, 0, 12288), (4096, 0, 508)],
    ];
    let mut slba = 0u64;
    for layout in layouts {
        let v = vector(&c, layout);
        let bytes = v.total_len();
        let blocks = (bytes / 512) as u32;
        let data = pattern(slba + 1, bytes);
        scatter(&v, &data);
        let (prp0, sgl0) = encodings(&m, base);
        let cmd = IoCommand::Write {
            ns: &ns,
            slba,
            blocks,
        };
        let done = run_io(&mut qp, cmd, IoData::vectored(v));
        assert!(done.is_ok(), "{:?}", done.result);
        assert_eq!(encodings(&m, base), (prp0 + 1, sgl0), "PRPs for {layout:?}");
        assert_eq!(m.namespace_data(1, slba, u64::from(blocks)), data);
        // Read back through the same vector, cleared.
        let v = done.segments.expect("the vector comes back");
        assert_eq!(v.len(), layout.len());
        for s in v.segments() {
            s.buffer().fill(s.offset(), s.len(), 0).unwrap();
        }
        let cmd = IoCommand::Read {
            ns: &ns,
            slba,
            blocks,
        };
        let done = run_io(&mut qp, cmd, IoData::vectored(v));
        assert!(done.is_ok());
        assert_eq!(gather(&done.segments.unwrap()), data);
        slba += u64::from(blocks);
    }
    assert_clean(&m);
}

#[test]
fn vector_with_odd_boundaries_goes_as_an_sgl_byte_exact() {
    let (m, c) = model_with_sgls(1);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let base = m.transfers_by_encoding();
    // Mixed sizes and odd (even single-byte) offsets: only an SGL can.
    let write_layout: &[(usize, usize, usize)] = &[
        (4096, 3, 517),
        (8192, 1001, 6000),
        (4096, 4095, 1),
        (4096, 0, 4096),
        (65536, 12345, 33418),
    ];
    let v = vector(&c, write_layout);
    let bytes = v.total_len();
    assert_eq!(bytes % 512, 0);
    let blocks = (bytes / 512) as u32;
    let data = pattern(99, bytes);
    scatter(&v, &data);
    let cmd = IoCommand::Write {
        ns: &ns,
        slba: 40,
        blocks,
    };
    let done = run_io(&mut qp, cmd, IoData::vectored(v));
    assert!(done.is_ok(), "{:?}", done.result);
    assert_eq!(encodings(&m, base).1, 1);
    assert_eq!(m.namespace_data(1, 40, u64::from(blocks)), data);
    // Read into a differently cut vector.
    let read_layout: &[(usize, usize, usize)] = &[
        (4096, 1, 1),
        (4096, 7, 4000),
        (200_000, 333, bytes - 4001 - 10),
        (4096, 100, 10),
    ];
    let v = vector(&c, read_layout);
    let cmd = IoCommand::Read {
        ns: &ns,
        slba: 40,
        blocks,
    };
    let done = run_io(&mut qp, cmd, IoData::vectored(v));
    assert!(done.is_ok(), "{:?}", done.result);
    assert_eq!(encodings(&m, base).1, 2);
    let v = done.segments.unwrap();
    assert_eq!(gather(&v), data);
    // The bytes around each segment are untouched.
    for (s, &(size, off, len)) in v.segments().iter().zip(read_layout) {
        let all = read_back(s.buffer(), size);
        assert!(all[..off].iter().all(|&b| b == 0xa5));
        assert!(all[off + len..].iter().all(|&b| b == 0xa5));
    }
    assert_clean(&m);
}

#[test]
fn auto_prefers_an_sgl_beyond_two_pages_where_the_controller_has_one() {
    let (m, c) = model_with_sgls(1);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let base = m.transfers_by_encoding();
    // Up to two pages: PRP1/PRP2 inline. Beyond: one SGL Data Block.
    for (blocks, want) in [(8u32, (1, 0)), (16, (2, 0)), (17, (2, 1)), (1024, (2, 2))] {
        let data = pattern(u64::from(blocks), blocks as usize * 512);
        let buf = buffer_with(&c, &data);
        qp.write_blocking(&ns, 0, blocks, buf, T).unwrap();
        assert_eq!(encodings(&m, base), want, "{blocks} blocks");
    }
    // A page-aligned vector goes as an SGL too.
    let v = vector(&c, &[(4096, 0, 4096), (4096, 0, 1024)]);
    let done = run_io(
        &mut qp,
        IoCommand::Read {
            ns: &ns,
            slba: 0,
            blocks: 10,
        },
        IoData::vectored(v),
    );
    assert!(done.is_ok());
    assert_eq!(encodings(&m, base), (2, 3));
    assert_clean(&m);
}

#[test]
fn auto_keeps_vectors_above_the_sgl_descriptor_threshold_on_prps() {
    // SGLS: supported, SDT (bits 15:8) 2 descriptors per command.
    let (m, c) = model_with_sgls(0x0201);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let base = m.transfers_by_encoding();
    let mut slba = 0u64;
    // (layout, the transfer goes as an SGL)
    type Case<'a> = (&'a [(usize, usize, usize)], bool);
    let cases: [Case<'_>; 4] = [
        // Two pieces: at the threshold, an SGL.
        (&[(4096, 0, 4096), (4096, 0, 1024)], true),
        // Three page-aligned pieces: above it, and PRPs can: PRPs.
        (&[(4096, 0, 4096), (4096, 0, 4096), (4096, 0, 512)], false),
        // Three pieces PRPs cannot describe (an odd inner boundary): an
        // SGL all the same.
        (&[(4096, 0, 1000), (4096, 0, 3096), (4096, 0, 512)], true),
        // One contiguous buffer beyond two pages: one descriptor, an SGL.
        (&[(16384, 0, 12288)], true),
    ];
    for (layout, sgl) in cases {
        let v = vector(&c, layout);
        let bytes = v.total_len();
        let blocks = (bytes / 512) as u32;
        let data = pattern(slba + 7, bytes);
        scatter(&v, &data);
        let (prp0, sgl0) = encodings(&m, base);
        let done = run_io(
            &mut qp,
            IoCommand::Write {
                ns: &ns,
                slba,
                blocks,
            },
            IoData::vectored(v),
        );
        assert!(done.is_ok(), "{layout:?}: {:?}", done.result);
        let want = if sgl {
            (prp0, sgl0 + 1)
        } else {
            (prp0 + 1, sgl0)
        };
        assert_eq!(encodings(&m, base), want, "{layout:?}");
        assert_eq!(m.namespace_data(1, slba, u64::from(blocks)), data);
        slba += u64::from(blocks);
    }
    // SglMode::Always ignores the threshold.
    let mut always = c
        .io_queue_pair(QueuePairOptions {
            sgl: SglMode::Always,
            ..QueuePairOptions::default()
        })
        .unwrap();
    let v = vector(&c, &[(4096, 0, 4096), (4096, 0, 4096), (4096, 0, 512)]);
    let (prp0, sgl0) = encodings(&m, base);
    let done = run_io(
        &mut always,
        IoCommand::Read {
            ns: &ns,
            slba: 8,
            blocks: 17,
        },
        IoData::vectored(v),
    );
    assert!(done.is_ok(), "{:?}", done.result);
    assert_eq!(encodings(&m, base), (prp0, sgl0 + 1));
    assert_clean(&m);
}

#[test]
fn a_vector_longer_than_the_transfer_uses_only_what_it_needs() {
    let (m, c) = model_with_sgls(1);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let base = m.transfers_by_encoding();
    let v = vector(&c, &[(4096, 1, 700), (4096, 5, 4000), (4096, 0, 4096)]);
    let cmd = IoCommand::Read {
        ns: &ns,
        slba: 0,
        blocks: 2,
    };
    m.write_namespace_data(1, 0, &pattern(5, 1024));
    let done = run_io(&mut qp, cmd, IoData::vectored(v));
    assert!(done.is_ok(), "{:?}", done.result);
    let v = done.segments.unwrap();
    assert_eq!(gather(&v)[..1024], pattern(5, 1024)[..]);
    // The third segment was not part of the transfer.
    let third = read_back(v.segments()[2].buffer(), 4096);
    assert!(third.iter().all(|&b| b == 0xa5));
    assert_eq!(encodings(&m, base), (0, 1), "odd offsets: an SGL");
    assert_clean(&m);
}

#[test]
fn sgl_lists_fill_the_slot_page_and_refuse_beyond() {
    let (m, c) = model_with_sgls(1);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let base = m.transfers_by_encoding();
    // 256 segments of 16 bytes at odd dword offsets: one full list page.
    let one = c.alloc_dma(256 * 32).unwrap();
    let pieces = one.split(32).unwrap();
    let mut v = IoVec::with_capacity(256);
    for p in pieces {
        v.push(p, 4, 16).unwrap();
    }
    let data = pattern(3, 4096);
    scatter(&v, &data);
    let cmd = IoCommand::Write {
        ns: &ns,
        slba: 8,
        blocks: 8,
    };
    let done = run_io(&mut qp, cmd, IoData::vectored(v));
    assert!(done.is_ok(), "{:?}", done.result);
    assert_eq!(m.namespace_data(1, 8, 8), data);
    assert_eq!(done.segments.map(|v| v.len()), Some(256));
    // 9 blocks over 16-byte segments need 288 descriptors: more than the
    // slot's list page holds (256 with MDTS 512 KiB).
    let mut w = IoVec::with_capacity(300);
    for b in c
        .alloc_dma(300 * 16)
        .unwrap()
        .split(16)
        .unwrap()
        .into_iter()
        .take(300)
    {
        w.push_buffer(b);
    }
    let cmd = IoCommand::Write {
        ns: &ns,
        slba: 8,
        blocks: 9,
    };
    let r = qp.submit_io(cmd, IoData::vectored(w), 1).unwrap_err();
    assert_eq!(r.reason, Reject::TooManySegments { segments: 288 });
    assert_eq!(r.segments.map(|v| v.len()), Some(300));
    assert_eq!(qp.in_flight(), 0);
    assert_eq!(encodings(&m, base), (0, 1));
    assert_clean(&m);
}

#[test]
fn without_sgl_support_an_odd_vector_is_refused_with_its_buffers() {
    let (m, c) = model_with_sgls(0);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let base = m.transfers_by_encoding();
    let v = vector(&c, &[(4096, 0, 1000), (4096, 0, 24)]);
    let r = qp
        .submit_io(
            IoCommand::Read {
                ns: &ns,
                slba: 0,
                blocks: 2,
            },
            IoData::vectored(v),
            1,
        )
        .unwrap_err();
    assert_eq!(r.reason, Reject::NotDescribable);
    assert_eq!(r.segments.map(|v| v.len()), Some(2));
    // SglMode::Always cannot be had without support.
    let e = c
        .io_queue_pair(QueuePairOptions {
            sgl: SglMode::Always,
            ..Default::default()
        })
        .unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("SGLS"), "{e}");
    assert_eq!(encodings(&m, base), (0, 0));
    assert_clean(&m);
}

/// A vector no slot could help (PRPs cannot describe it, no SGLs) is
/// `NotDescribable` on a full pair too, not `QueueFull` — which would send
/// the caller to reap and retry for the same refusal. With SGLs usable the
/// full pair says `QueueFull` (whether an SGL fits is known only in a slot).
#[test]
fn a_full_pair_refuses_an_undescribable_vector_as_such() {
    for (sgls, want) in [(0, Reject::NotDescribable), (1, Reject::QueueFull)] {
        let (m, c) = model_with_sgls(sgls);
        let ns = c.namespace(1).unwrap().clone();
        let mut qp = c
            .io_queue_pair(QueuePairOptions {
                entries: Some(4),
                ..Default::default()
            })
            .unwrap();
        let held = fill(&c, &ns, &mut qp);
        let v = vector(&c, &[(4096, 0, 1000), (4096, 0, 24)]);
        let r = qp
            .submit_io(
                IoCommand::Read {
                    ns: &ns,
                    slba: 0,
                    blocks: 2,
                },
                IoData::vectored(v),
                99,
            )
            .unwrap_err();
        assert_eq!(r.reason, want, "SGLS {sgls}");
        assert_eq!(r.segments.map(|v| v.len()), Some(2));
        drain(&mut qp, held);
        assert_clean(&m);
    }
}

/// The same for a vector above MDTS (split into several commands): with a
/// free slot or none, `NotDescribable` when a child cannot be described
/// (the split path refused for room before it looked at the children).
#[test]
fn a_full_pair_refuses_an_undescribable_split_vector_as_such() {
    let (m, c) = model_with_sgls(0);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(4),
            ..Default::default()
        })
        .unwrap();
    // 1000 + 24 + 1 MiB: above the model's MDTS (512 KiB), and the
    // 1000-byte piece's end is no page boundary.
    let layout: &[(usize, usize, usize)] = &[(4096, 0, 1000), (4096, 0, 24), (1 << 20, 0, 1 << 20)];
    let cmd = IoCommand::Read {
        ns: &ns,
        slba: 0,
        blocks: ((1000 + 24 + (1 << 20)) / 512) as u32,
    };
    let r = qp
        .submit_io(cmd, IoData::vectored(vector(&c, layout)), 98)
        .unwrap_err();
    assert_eq!(r.reason, Reject::NotDescribable, "with room");
    let held = fill(&c, &ns, &mut qp);
    let r = qp
        .submit_io(cmd, IoData::vectored(vector(&c, layout)), 99)
        .unwrap_err();
    assert_eq!(r.reason, Reject::NotDescribable, "on a full pair");
    assert_eq!(r.segments.map(|v| v.len()), Some(3));
    drain(&mut qp, held);
    assert_clean(&m);
}

/// Fills the pair with one-page reads (until `QueueFull`); returns how many.
fn fill(
    c: &Controller<ModelController>,
    ns: &upnvme::Namespace,
    qp: &mut upnvme::IoQueuePair<ModelController>,
) -> u64 {
    let read = IoCommand::Read {
        ns,
        slba: 0,
        blocks: 8,
    };
    let mut tag = 0;
    loop {
        match qp.submit_io(read, IoData::buffer(c.alloc_dma(4096).unwrap()), tag) {
            Ok(_) => tag += 1,
            Err(r) => {
                assert_eq!(r.reason, Reject::QueueFull);
                return tag;
            }
        }
        assert!(tag < 64, "the pair never filled");
    }
}

/// Reaps `n` successful completions.
fn drain(qp: &mut upnvme::IoQueuePair<ModelController>, n: u64) {
    let mut done = 0;
    while done < n {
        qp.process_completions(u32::MAX, |_, c| {
            assert!(c.result.is_ok(), "{c:?}");
            done += 1;
        })
        .unwrap();
    }
}

#[test]
fn sgl_never_refuses_what_prps_cannot_describe() {
    let (m, c) = model_with_sgls(1);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            sgl: SglMode::Never,
            ..Default::default()
        })
        .unwrap();
    let base = m.transfers_by_encoding();
    let v = vector(&c, &[(4096, 0, 1000), (4096, 0, 24)]);
    let read = IoCommand::Read {
        ns: &ns,
        slba: 0,
        blocks: 2,
    };
    let r = qp.submit_io(read, IoData::vectored(v), 1).unwrap_err();
    assert_eq!(r.reason, Reject::NotDescribable);
    let buf = c.alloc_dma(4096).unwrap();
    let r = qp
        .submit_io(read, IoData::slice(buf, 2, 1024), 1)
        .unwrap_err();
    assert_eq!(r.reason, Reject::Misaligned);
    assert_eq!(encodings(&m, base), (0, 0));
    assert_clean(&m);
}

#[test]
fn sgl_always_sends_every_transfer_as_an_sgl() {
    let (m, c) = model_with_sgls(1);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            sgl: SglMode::Always,
            ..Default::default()
        })
        .unwrap();
    let base = m.transfers_by_encoding();
    assert_eq!(qp.sgl_mode(), SglMode::Always);
    let mut sent = 0;
    for blocks in [1u32, 8, 9, 64, 1024] {
        let data = pattern(u64::from(blocks), blocks as usize * 512);
        let buf = buffer_with(&c, &data);
        let buf = qp.write_blocking(&ns, 0, blocks, buf, T).unwrap();
        buf.fill(0, buf.len(), 0).unwrap();
        let buf = qp.read_blocking(&ns, 0, blocks, buf, T).unwrap();
        assert_eq!(read_back(&buf, data.len()), data);
        // Page-aligned vectors too.
        let v = vector(&c, &[(4096, 0, 4096), (4096, 0, 512)]);
        let done = run_io(
            &mut qp,
            IoCommand::Read {
                ns: &ns,
                slba: 0,
                blocks: 9,
            },
            IoData::vectored(v),
        );
        assert!(done.is_ok());
        sent += 3;
        assert_eq!(encodings(&m, base), (0, sent));
    }
    assert_clean(&m);
}

#[test]
fn auto_uses_an_sgl_for_a_buffer_prp1_cannot_start() {
    let (m, c) = model_with_sgls(1);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let base = m.transfers_by_encoding();
    let data = pattern(11, 1536);
    let buf = c.alloc_dma(8192).unwrap();
    buf.write_bytes(1, &data).unwrap();
    let done = run_io(
        &mut qp,
        IoCommand::Write {
            ns: &ns,
            slba: 3,
            blocks: 3,
        },
        IoData::slice(buf, 1, 1536),
    );
    assert!(done.is_ok(), "{:?}", done.result);
    assert_eq!(encodings(&m, base), (0, 1));
    assert_eq!(m.namespace_data(1, 3, 3), data);
    assert_clean(&m);
}

#[test]
fn dword_aligned_sgl_support_refuses_odd_pieces() {
    let (m, c) = model_with_sgls(2);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let base = m.transfers_by_encoding();
    let read = IoCommand::Read {
        ns: &ns,
        slba: 0,
        blocks: 2,
    };
    let v = vector(&c, &[(4096, 1, 1000), (4096, 0, 24)]);
    let r = qp.submit_io(read, IoData::vectored(v), 1).unwrap_err();
    assert_eq!(r.reason, Reject::NotDescribable);
    // Dword-aligned pieces are fine.
    let data = pattern(2, 1024);
    m.write_namespace_data(1, 0, &data);
    let v = vector(&c, &[(4096, 4, 1000), (4096, 8, 24)]);
    let done = run_io(&mut qp, read, IoData::vectored(v));
    assert!(done.is_ok(), "{:?}", done.result);
    assert_eq!(gather(&done.segments.unwrap()), data);
    assert_eq!(encodings(&m, base), (0, 1));
    assert_clean(&m);
}

#[test]
fn iovec_push_refuses_ranges_outside_the_buffer() {
    let (_m, c) = model_with_sgls(0);
    let mut v = IoVec::new();
    let e = v.push(c.alloc_dma(4096).unwrap(), 4000, 200).unwrap_err();
    assert_eq!((e.offset, e.len, e.size), (4000, 200, 4096));
    assert_eq!(e.buffer.len(), 4096);
    assert!(v.push(c.alloc_dma(4096).unwrap(), 0, 0).is_err());
    assert!(v.is_empty());
    v.push(c.alloc_dma(4096).unwrap(), 4095, 1).unwrap();
    assert_eq!(v.total_len(), 1);
}
