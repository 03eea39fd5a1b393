//! Transfers above MDTS (driver/src/qpair/split.rs): a Read, Write or
//! Compare of one buffer larger than one command may carry goes to the
//! device as several commands and comes back as one completion — byte
//! exact, with the first child error, exactly once through a reset and a
//! close, all or nothing when refused, and with metadata and protection
//! information cut at the same block boundaries.

mod common;

use std::time::{Duration, Instant};

use common::{
    T, assert_clean, buffer_with, fetched_since, pattern, read_back, run_io, setup, wait_one,
};
use upnvme::{
    Completion, DsmAttributes, DsmRange, IoCommand, IoData, IoError, Protection, QueuePairOptions,
    RangeCommand, Reject, Status,
};
use upnvme_tests::{Fault, Match, ModelConfig, NamespaceConfig};

const BS: usize = 512;
const BLOCKS: u64 = 4096;
/// MDTS 1 with 4 KiB pages: 8 KiB, 16 blocks of 512 bytes per command.
const PER: u64 = 16;

fn config(ms: u16, extended: bool, pi_type: u8) -> ModelConfig {
    ModelConfig {
        mdts: 1,
        namespaces: vec![NamespaceConfig {
            lba_size: BS as u32,
            blocks: BLOCKS,
            ms,
            extended,
            pi_type,
            ..NamespaceConfig::default()
        }],
        oncs: ModelConfig::ONCS_COMPARE,
        ..ModelConfig::default()
    }
}

/// A pair of 4 SQ and CQ entries: a depth of 3.
fn depth_3_pair(
    c: &upnvme::Controller<upnvme_tests::ModelController>,
) -> upnvme::IoQueuePair<upnvme_tests::ModelController> {
    let qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(4),
            cq_entries: Some(4),
            ..QueuePairOptions::default()
        })
        .unwrap();
    assert_eq!(qp.max_depth(), 3);
    qp
}

fn write(ns: &upnvme::Namespace, slba: u64, blocks: u32) -> IoCommand<'_> {
    IoCommand::Write { ns, slba, blocks }
}

fn read(ns: &upnvme::Namespace, slba: u64, blocks: u32) -> IoCommand<'_> {
    IoCommand::Read { ns, slba, blocks }
}

#[test]
fn a_write_and_a_read_above_mdts_go_as_pieces_and_come_back_once_byte_exact() {
    let (m, c) = setup(config(0, false, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    assert_eq!(qp.max_transfer(), PER as usize * BS);
    let blocks = 7 * PER as u32 + 5;
    let data = pattern(9, blocks as usize * BS);
    let seen = m.commands_fetched();
    let w = run_io(
        &mut qp,
        write(&ns, 100, blocks),
        buffer_with(&c, &data).into(),
    );
    assert!(w.is_ok(), "{:?}", w.result);
    assert_eq!(m.namespace_data(1, 100, u64::from(blocks)), data);
    let want: Vec<(u64, u32)> = (0..8)
        .map(|i| (100 + i * PER, if i < 7 { PER as u32 } else { 5 }))
        .collect();
    assert_eq!(
        fetched_since(&m, qp.qid(), seen),
        want,
        "pieces in LBA order"
    );
    // Read it back into a slice of a larger buffer (offset 1 KiB).
    let big = c.alloc_dma(blocks as usize * BS + 4096).unwrap();
    let r = run_io(
        &mut qp,
        read(&ns, 100, blocks),
        IoData::slice(big, 1024, blocks as usize * BS),
    );
    assert!(r.is_ok(), "{:?}", r.result);
    let back = r.buffer.expect("the buffer comes back");
    let mut got = vec![0u8; data.len()];
    back.read_bytes(1024, &mut got).unwrap();
    assert_eq!(got, data);
    // Nothing else comes: one completion per command the caller submitted.
    assert_eq!(
        qp.process_completions(u32::MAX, |_, c| panic!("extra completion {}", c.tag))
            .unwrap(),
        0
    );
    // Children are commands in the counters.
    assert_eq!(qp.stats().completions, 16);
    assert_eq!(qp.stats().submissions, 16);
    // The blocking helpers split too.
    let buf = c.alloc_dma(blocks as usize * BS).unwrap();
    let buf = qp.read_blocking(&ns, 100, blocks, buf, T).unwrap();
    assert_eq!(read_back(&buf, data.len()), data);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn a_failing_piece_fails_the_whole_once_and_the_buffer_comes_back() {
    let (m, c) = setup(config(0, false, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // The third piece fails with Unrecovered Read Error.
    m.inject(Fault::Status {
        on: Match::Nth(m.commands_fetched() + 2),
        status: upnvme_tests::Status::new(2, 0x81),
    });
    let status = Status::new(2, 0x81);
    let buf = c.alloc_dma(4 * PER as usize * BS).unwrap();
    let iova = buf.iova();
    let r = run_io(&mut qp, read(&ns, 0, 4 * PER as u32), buf.into());
    assert_eq!(r.result, Err(IoError::Status(status)));
    assert_eq!(r.buffer.map(|b| b.iova()), Some(iova));
    assert_eq!(qp.in_flight(), 0);
    assert_eq!(
        qp.process_completions(u32::MAX, |_, c| panic!("extra completion {}", c.tag))
            .unwrap(),
        0
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn a_reset_and_a_close_end_a_split_in_flight_once() {
    let (m, c) = setup(config(0, false, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // Reset: the second of three pieces is held back, the others complete.
    m.inject(Fault::DelayCompletion {
        on: Match::Nth(m.commands_fetched() + 1),
        doorbells: None,
    });
    let buf = c.alloc_dma(3 * PER as usize * BS).unwrap();
    qp.submit(read(&ns, 0, 3 * PER as u32), Some(buf), 11)
        .unwrap();
    let mut got: Vec<Completion> = Vec::new();
    for _ in 0..100 {
        qp.process_completions(u32::MAX, |_, c| got.push(c))
            .unwrap();
    }
    assert!(got.is_empty(), "no completion while a piece is out");
    assert_eq!(qp.in_flight(), 1);
    c.reset().unwrap();
    let done = wait_one(&mut qp);
    assert_eq!(done.tag, 11);
    assert_eq!(done.result, Err(IoError::ControllerReset));
    assert!(done.buffer.is_some());
    assert_eq!(
        qp.process_completions(u32::MAX, |_, c| panic!("extra completion {}", c.tag))
            .unwrap(),
        0
    );
    // Close: every piece held back, the deletion ends them.
    for i in 0..2 {
        m.inject(Fault::DelayCompletion {
            on: Match::Nth(m.commands_fetched() + i),
            doorbells: None,
        });
    }
    let buf = c.alloc_dma(2 * PER as usize * BS).unwrap();
    qp.submit(read(&ns, 0, 2 * PER as u32), Some(buf), 12)
        .unwrap();
    qp.process_completions(u32::MAX, |_, _| panic!("nothing is back"))
        .unwrap();
    let out = qp.close(std::time::Duration::from_millis(20));
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].tag, 12);
    assert!(out[0].result.is_err());
    assert!(out[0].buffer.is_some());
    drop(c);
    assert_clean(&m);
}

#[test]
fn a_split_is_queued_whole_or_not_at_all() {
    let (m, c) = setup(config(0, false, 0));
    let ns = c.namespace(1).unwrap().clone();
    // 4 deep.
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(5),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(qp.max_depth(), 4);
    // Two single commands in flight: a three-piece split does not fit now.
    m.inject(Fault::DelayCompletion {
        on: Match::Nth(m.commands_fetched()),
        doorbells: None,
    });
    m.inject(Fault::DelayCompletion {
        on: Match::Nth(m.commands_fetched() + 1),
        doorbells: None,
    });
    for t in 0..2 {
        qp.submit(read(&ns, 0, 1), Some(c.alloc_dma(BS).unwrap()), t)
            .unwrap();
    }
    let fetched = m.commands_fetched();
    let buf = c.alloc_dma(3 * PER as usize * BS).unwrap();
    let f = qp
        .submit(read(&ns, 0, 3 * PER as u32), Some(buf), 9)
        .unwrap_err();
    assert_eq!(f.reason, Reject::QueueFull);
    assert!(f.buffer.is_some(), "QueueFull hands the buffer back");
    assert_eq!(m.commands_fetched(), fetched, "nothing of it was sent");
    assert_eq!(qp.in_flight(), 2);
    // A piece that would run past the namespace refuses the whole, up front.
    let f = qp
        .submit(
            read(&ns, BLOCKS - 2 * PER, 2 * PER as u32 + 1),
            Some(c.alloc_dma((2 * PER as usize + 1) * BS).unwrap()),
            9,
        )
        .unwrap_err();
    assert_eq!(f.reason, Reject::LbaRange);
    // A buffer too small for the last piece: refused whole.
    let f = qp
        .submit_io(
            read(&ns, 0, 2 * PER as u32),
            IoData::slice(
                c.alloc_dma(2 * PER as usize * BS).unwrap(),
                0,
                2 * PER as usize * BS - BS,
            ),
            9,
        )
        .unwrap_err();
    // The need named is the whole transfer's, not the last piece's share.
    assert_eq!(
        f.reason,
        Reject::BufferTooSmall {
            need: 2 * PER * BS as u64
        }
    );
    assert_eq!(m.commands_fetched(), fetched);
    // More pieces than the pair is deep: never.
    let f = qp
        .submit(
            read(&ns, 0, 5 * PER as u32),
            Some(c.alloc_dma(5 * PER as usize * BS).unwrap()),
            9,
        )
        .unwrap_err();
    assert_eq!(
        f.reason,
        Reject::TransferTooLarge {
            bytes: 5 * PER * BS as u64
        }
    );
    m.release_delayed();
    let mut n = 0;
    while n < 2 {
        n += qp
            .process_completions(u32::MAX, |_, c| assert!(c.is_ok()))
            .unwrap();
    }
    // Now it fits.
    let c3 = run_io(
        &mut qp,
        read(&ns, 0, 3 * PER as u32),
        c.alloc_dma(3 * PER as usize * BS).unwrap().into(),
    );
    assert!(c3.is_ok());
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn more_than_65536_blocks_are_split_too() {
    // MDTS 0 (no limit): the pair's 4 MiB cap, 8192 blocks of 512 bytes;
    // 65537 blocks are above NLB's 16 bits as well.
    let (m, c) = setup(ModelConfig {
        mdts: 0,
        namespaces: vec![NamespaceConfig {
            lba_size: BS as u32,
            blocks: 70_000,
            ..NamespaceConfig::default()
        }],
        ..ModelConfig::default()
    });
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let blocks = 65_537u32;
    let data = pattern(3, blocks as usize * BS);
    let seen = m.commands_fetched();
    let w = run_io(
        &mut qp,
        write(&ns, 1, blocks),
        buffer_with(&c, &data).into(),
    );
    assert!(w.is_ok(), "{:?}", w.result);
    let p = fetched_since(&m, qp.qid(), seen);
    assert_eq!(p.len(), 9);
    assert_eq!(p[8], (1 + 8 * 8192, 1));
    assert_eq!(m.namespace_data(1, 1, u64::from(blocks)), data);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn extended_lba_pieces_carry_their_metadata_and_type_1_tags() {
    // 512 + 8 bytes per block, Type 1: 8192 / 520 = 15 blocks per piece.
    let (m, c) = setup(config(8, true, 1));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let blocks = 40u32;
    let data = pattern(5, blocks as usize * BS);
    let seen = m.commands_fetched();
    // PRACT: the controller generates each block's PI (Type 1: its LBA as
    // reference tag); the host sends data only.
    let w = run_io(
        &mut qp,
        write(&ns, 7, blocks),
        IoData::buffer(buffer_with(&c, &data)).protection(Protection::PRACT),
    );
    assert!(w.is_ok(), "{:?}", w.result);
    assert_eq!(
        fetched_since(&m, qp.qid(), seen),
        vec![(7, 16), (23, 16), (39, 8)],
        "PRACT with 8-byte metadata moves no metadata: 16 blocks per piece"
    );
    assert_eq!(m.namespace_data(1, 7, u64::from(blocks)), data);
    // Read data and PI (no PRACT): 520 bytes per block, 15 per piece; the
    // reference tag each piece expects is its own SLBA, checked.
    let seen = m.commands_fetched();
    let check = Protection {
        pract: false,
        check_guard: true,
        check_app_tag: false,
        check_ref_tag: true,
        ref_tag: None,
        app_tag: 0,
        app_tag_mask: 0,
    };
    let r = run_io(
        &mut qp,
        read(&ns, 7, blocks),
        IoData::buffer(c.alloc_dma(blocks as usize * 520).unwrap()).protection(check),
    );
    assert!(r.is_ok(), "{:?}", r.result);
    assert_eq!(
        fetched_since(&m, qp.qid(), seen),
        vec![(7, 15), (22, 15), (37, 10)]
    );
    let back = read_back(&r.buffer.unwrap(), blocks as usize * 520);
    for (i, block) in back.chunks(520).enumerate() {
        assert_eq!(&block[..BS], &data[i * BS..(i + 1) * BS], "block {i}");
        // PI tuple (16-bit guard): guard, application tag, reference tag.
        let ref_tag = u32::from_be_bytes(block[BS + 4..BS + 8].try_into().unwrap());
        assert_eq!(
            u64::from(ref_tag),
            7 + i as u64,
            "block {i}'s reference tag"
        );
    }
    // An explicit Type 1 tag that is not the SLBA is refused whole.
    let f = qp
        .submit_io(
            read(&ns, 7, blocks),
            IoData::buffer(c.alloc_dma(blocks as usize * 520).unwrap()).protection(Protection {
                ref_tag: Some(8),
                ..check
            }),
            1,
        )
        .unwrap_err();
    assert!(
        matches!(f.reason, Reject::ProtectionNotApplicable(_)),
        "{:?}",
        f.reason
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn separate_metadata_is_cut_with_the_data() {
    let (m, c) = setup(config(16, false, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let blocks = 3 * PER as u32 + 3;
    let data = pattern(6, blocks as usize * BS);
    let md = pattern(7, blocks as usize * 16);
    let w = run_io(
        &mut qp,
        write(&ns, 0, blocks),
        IoData::buffer(buffer_with(&c, &data)).metadata(buffer_with(&c, &md)),
    );
    assert!(w.is_ok(), "{:?}", w.result);
    assert!(w.metadata.is_some(), "the metadata buffer comes back");
    assert_eq!(m.namespace_data(1, 0, u64::from(blocks)), data);
    assert_eq!(m.namespace_metadata(1, 0, u64::from(blocks)), md);
    let r = run_io(
        &mut qp,
        read(&ns, 0, blocks),
        IoData::buffer(c.alloc_dma(data.len()).unwrap()).metadata(c.alloc_dma(md.len()).unwrap()),
    );
    assert!(r.is_ok(), "{:?}", r.result);
    assert_eq!(read_back(&r.buffer.unwrap(), data.len()), data);
    assert_eq!(read_back(&r.metadata.unwrap(), md.len()), md);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// The bytes of every segment of a vector, in order.
fn vector_bytes(v: &upnvme::IoVec) -> Vec<u8> {
    v.segments()
        .iter()
        .flat_map(|s| {
            let mut b = vec![0u8; s.len()];
            s.buffer().read_bytes(s.offset(), &mut b).unwrap();
            b
        })
        .collect()
}

#[test]
fn a_vector_above_mdts_is_cut_across_its_segments() {
    // SGLs: segments of any length; the children's boundaries fall inside
    // segments (8 KiB per child, segments of 3000, 5000, 700, ... bytes).
    let (m, c) = setup(ModelConfig {
        sgls: 1,
        ..config(0, false, 0)
    });
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let blocks = 3 * PER as u32 + 7;
    let total = blocks as usize * BS;
    let data = pattern(11, total);
    let lens = [3000usize, 5000, 700, 9000, 4];
    let mut v = upnvme::IoVec::new();
    let mut at = 0;
    for len in lens.iter().cycle() {
        if at == total {
            break;
        }
        let len = (*len).min(total - at);
        v.push(buffer_with(&c, &data[at..at + len]), 0, len)
            .unwrap();
        at += len;
    }
    let seen = m.commands_fetched();
    let w = run_io(&mut qp, write(&ns, 50, blocks), IoData::vectored(v));
    assert!(w.is_ok(), "{:?}", w.result);
    assert!(w.segments.is_some(), "the vector comes back");
    assert_eq!(m.namespace_data(1, 50, u64::from(blocks)), data);
    assert_eq!(
        fetched_since(&m, qp.qid(), seen),
        vec![(50, 16), (66, 16), (82, 16), (98, 7)]
    );
    // Read back through another vector cut differently.
    let mut r = upnvme::IoVec::new();
    let mut at = 0;
    for len in [12_288usize, 1024, 4096].iter().cycle() {
        if at == total {
            break;
        }
        let len = (*len).min(total - at);
        r.push(c.alloc_dma(len + 512).unwrap(), 512, len).unwrap();
        at += len;
    }
    let back = run_io(&mut qp, read(&ns, 50, blocks), IoData::vectored(r));
    assert!(back.is_ok(), "{:?}", back.result);
    assert_eq!(vector_bytes(&back.segments.unwrap()), data);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn a_vector_split_that_prps_cannot_describe_is_refused_whole() {
    // No SGLs: a child whose part of the vector has an inner boundary off a
    // page refuses the whole split, after the earlier children took slots
    // and list pages: they are released and nothing reaches the device.
    let (m, c) = setup(config(0, false, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let blocks = 2 * PER as u32;
    // Child 1 (bytes 8192..16384) holds the boundary at 12000.
    let mut v = upnvme::IoVec::new();
    v.push(c.alloc_dma(12_000).unwrap(), 0, 12_000).unwrap();
    v.push(c.alloc_dma(4384).unwrap(), 0, 4384).unwrap();
    let fetched = m.commands_fetched();
    let f = qp
        .submit_io(read(&ns, 0, blocks), IoData::vectored(v), 3)
        .unwrap_err();
    assert_eq!(f.reason, Reject::NotDescribable);
    assert_eq!(f.segments.map(|v| v.segments().len()), Some(2));
    assert_eq!(m.commands_fetched(), fetched);
    assert_eq!(qp.in_flight(), 0, "the first child's slot was released");
    // Page-aligned inner boundaries split fine.
    let mut v = upnvme::IoVec::new();
    v.push(c.alloc_dma(12_288).unwrap(), 0, 12_288).unwrap();
    v.push(c.alloc_dma(4096).unwrap(), 0, 4096).unwrap();
    let r = run_io(&mut qp, read(&ns, 0, blocks), IoData::vectored(v));
    assert!(r.is_ok(), "{:?}", r.result);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn splits_waiting_for_one_piece_each_do_not_block_a_new_one() {
    // 4 deep: splits A and B each wait for their second piece (held back),
    // two slots are free, so a third two-piece split fits — every split
    // waiting holds at least one slot, so the parent table must hold as
    // many splits as the pair is deep, not half.
    let (m, c) = setup(config(0, false, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(5),
            ..Default::default()
        })
        .unwrap();
    let first = m.commands_fetched();
    for n in [1, 3] {
        m.inject(Fault::DelayCompletion {
            on: Match::Nth(first + n),
            doorbells: None,
        });
    }
    let two = 2 * PER as u32;
    for tag in [1, 2] {
        qp.submit(
            read(&ns, 0, two),
            Some(c.alloc_dma(two as usize * BS).unwrap()),
            tag,
        )
        .unwrap();
        qp.process_completions(u32::MAX, |_, c| panic!("{} is not back yet", c.tag))
            .unwrap();
    }
    assert_eq!(qp.in_flight(), 2);
    qp.submit(
        read(&ns, 0, two),
        Some(c.alloc_dma(two as usize * BS).unwrap()),
        3,
    )
    .unwrap();
    m.release_delayed();
    let mut tags = Vec::new();
    for _ in 0..1000 {
        qp.process_completions(u32::MAX, |_, c| {
            assert!(c.is_ok(), "{:?}", c.result);
            tags.push(c.tag);
        })
        .unwrap();
        if tags.len() == 3 {
            break;
        }
    }
    tags.sort();
    assert_eq!(tags, vec![1, 2, 3]);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A Read or Write above 65536 blocks is refused for its block count before
/// its buffer is measured, then split: a buffer too small for the whole is
/// refused with the whole's need (it was refused by the first piece that did
/// not fit, with that piece's share: "the transfer needs 524288 bytes" for a
/// 32 MiB buffer, found in review).
#[test]
fn a_split_refusal_for_a_small_buffer_names_the_whole_transfers_need() {
    let (_m, c) = setup(common::config_one_ns(512, 100_000));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let blocks = 70_000u32;
    let buf = c.alloc_dma(32 << 20).unwrap();
    let read = IoCommand::Read {
        ns: &ns,
        slba: 0,
        blocks,
    };
    let r = qp.submit(read, Some(buf), 1).unwrap_err();
    let len = r.buffer.as_ref().unwrap().len() as u64;
    let msg = qp.describe(r.reason).to_string();
    assert_eq!(
        r.reason,
        Reject::BufferTooSmall {
            need: u64::from(blocks) * 512
        },
        "buffer of {len} bytes refused with: {msg}"
    );
}

/// The same for a separate metadata buffer: a 300000-byte metadata buffer
/// for 70000 blocks with 8 bytes each (560000 needed) is refused with the
/// whole's need (it was one piece's share, 8192, less than was passed).
#[test]
fn a_split_refusal_for_a_small_metadata_buffer_names_the_whole_need() {
    let (_m, c) = setup(ModelConfig {
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size: 512,
            blocks: 100_000,
            ms: 8,
            extended: false,
            ..NamespaceConfig::default()
        }],
        ..ModelConfig::default()
    });
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let blocks = 70_000u32;
    let data = c.alloc_dma(blocks as usize * 512).unwrap();
    let md = c.alloc_dma(300_000).unwrap();
    let read = IoCommand::Read {
        ns: &ns,
        slba: 0,
        blocks,
    };
    let r = qp
        .submit_io(read, IoData::buffer(data).metadata(md), 1)
        .unwrap_err();
    let md_len = r.metadata.as_ref().unwrap().len() as u64;
    let msg = qp.describe(r.reason).to_string();
    assert_eq!(
        r.reason,
        Reject::MetadataBuffer {
            need: u64::from(blocks) * 8
        },
        "metadata buffer of {md_len} bytes refused with: {msg}"
    );
}

/// More than 65536 blocks in more pieces than the pair is deep: refused as
/// too large to split, not with "block count …: must be 1..=65536", which
/// reads as if a split never happened.
#[test]
fn a_block_count_beyond_what_the_pair_can_split_says_transfer_too_large() {
    let (_m, c) = setup(common::config_one_ns(512, 1 << 20));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(4),
            ..QueuePairOptions::default()
        })
        .unwrap();
    let blocks = 70_000u32;
    let pieces = u64::from(blocks).div_ceil((qp.max_transfer() / 512) as u64);
    assert!(pieces > u64::from(qp.max_depth()), "{pieces} pieces");
    let r = qp
        .submit(
            read(&ns, 0, blocks),
            Some(c.alloc_dma(blocks as usize * 512).unwrap()),
            1,
        )
        .unwrap_err();
    assert_eq!(
        r.reason,
        Reject::TransferTooLarge {
            bytes: u64::from(blocks) * 512
        }
    );
    assert!(r.buffer.is_some());
}

/// A command outside the namespace that would also need more pieces than the
/// pair holds is refused as outside the namespace (`LbaRange`, what one
/// command of it would get), not as too large to split: no depth would make
/// it run. With and without data; nothing sent, the buffer back.
#[test]
fn a_split_outside_the_namespace_says_lba_range_before_its_size() {
    // A Read above 65536 blocks (the only way one reaches the split with a
    // range that is also outside: below that, the range is checked first).
    {
        let (m, c) = setup(common::config_one_ns(512, 64));
        let ns = c.namespace(1).unwrap().clone();
        let mut qp = depth_3_pair(&c);
        let seen = m.commands_fetched();
        let blocks = 70_000u32;
        let pieces = u64::from(blocks).div_ceil((qp.max_transfer() / 512) as u64);
        assert!(pieces > u64::from(qp.max_depth()), "{pieces} pieces");
        let r = qp
            .submit(
                read(&ns, 0, blocks),
                Some(c.alloc_dma(blocks as usize * 512).unwrap()),
                1,
            )
            .unwrap_err();
        assert_eq!(r.reason, Reject::LbaRange);
        assert!(r.buffer.is_some());
        assert_eq!(m.commands_fetched(), seen, "nothing sent");
        drop(qp);
        drop(c);
        assert_clean(&m);
    }
    let (m, c) = setup(no_data_config(4096, 64, 1, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = depth_3_pair(&c);
    let seen = m.commands_fetched();
    let wz = IoCommand::WriteZeroes {
        ns: &ns,
        slba: 1,
        blocks: 4 * 65_536,
        deallocate: false,
    };
    assert_eq!(
        qp.submit_io(wz, IoData::none(), 1).unwrap_err().reason,
        Reject::LbaRange
    );
    // Past the end by its start alone, with a count a split would carry.
    let verify = IoCommand::Verify {
        ns: &ns,
        slba: u64::MAX - 1,
        blocks: 7,
    };
    assert_eq!(
        qp.submit_io(verify, IoData::none(), 1).unwrap_err().reason,
        Reject::LbaRange
    );
    assert_eq!(m.commands_fetched(), seen, "nothing sent");
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A model of one namespace of `lba_size`-byte blocks with Verify, Write
/// Zeroes and Write Uncorrectable, and the given size limits.
fn no_data_config(lba_size: u32, blocks: u64, vsl: u8, wzsl: u8) -> ModelConfig {
    ModelConfig {
        namespaces: vec![NamespaceConfig {
            lba_size,
            blocks,
            ..NamespaceConfig::default()
        }],
        oncs: ModelConfig::ONCS_VERIFY
            | ModelConfig::ONCS_WRITE_ZEROES
            | ModelConfig::ONCS_WRITE_UNCORRECTABLE,
        nvm_limits: upnvme_tests::NvmLimitsConfig {
            vsl,
            wzsl,
            ..Default::default()
        },
        ..ModelConfig::default()
    }
}

/// VSL and WZSL (Identify CNS 06h) bound one Verify and one Write Zeroes;
/// beyond them the pair sends pieces within the limit, in LBA order, and
/// hands back one completion — the blocks outside the range untouched.
#[test]
fn verify_and_write_zeroes_beyond_their_size_limits_go_as_pieces_within_them() {
    // 8 KiB per Verify (two 4 KiB blocks), 16 KiB per Write Zeroes (four).
    let (m, c) = setup(no_data_config(4096, 64, 1, 2));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let data = pattern(11, 16 * 4096);
    qp.write_blocking(&ns, 0, 16, buffer_with(&c, &data), T)
        .unwrap();
    let seen = m.commands_fetched();
    let wz = run_io(
        &mut qp,
        IoCommand::WriteZeroes {
            ns: &ns,
            slba: 2,
            blocks: 11,
            deallocate: false,
        },
        IoData::none(),
    );
    assert!(wz.is_ok(), "{:?}", wz.result);
    assert_eq!(
        fetched_since(&m, qp.qid(), seen),
        vec![(2, 4), (6, 4), (10, 3)],
        "Write Zeroes pieces of at most WZSL"
    );
    let mut want = data.clone();
    want[2 * 4096..13 * 4096].fill(0);
    assert_eq!(
        m.namespace_data(1, 0, 16),
        want,
        "blocks 2..13 zeroed, no other"
    );
    let seen = m.commands_fetched();
    let v = run_io(
        &mut qp,
        IoCommand::Verify {
            ns: &ns,
            slba: 0,
            blocks: 7,
        },
        IoData::none(),
    );
    assert!(v.is_ok(), "{:?}", v.result);
    assert_eq!(
        fetched_since(&m, qp.qid(), seen),
        vec![(0, 2), (2, 2), (4, 2), (6, 1)],
        "Verify pieces of at most VSL"
    );
    // The blocking helper splits too; one completion per command.
    qp.execute_blocking(
        IoCommand::Verify {
            ns: &ns,
            slba: 20,
            blocks: 5,
        },
        None,
        T,
    )
    .unwrap();
    assert_eq!(
        qp.process_completions(u32::MAX, |_, c| panic!("extra completion {}", c.tag))
            .unwrap(),
        0
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A piece of a split Verify that fails fails the whole, once: the result
/// is the first piece error (Unrecovered Read Error on a block marked with
/// a split Write Uncorrectable of more than 65536 blocks).
#[test]
fn write_uncorrectable_above_65536_blocks_is_split_and_a_failing_verify_piece_fails_the_whole() {
    let (m, c) = setup(no_data_config(512, 140_000, 1, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let seen = m.commands_fetched();
    let wu = run_io(
        &mut qp,
        IoCommand::WriteUncorrectable {
            ns: &ns,
            slba: 1000,
            blocks: 70_000,
        },
        IoData::none(),
    );
    assert!(wu.is_ok(), "{:?}", wu.result);
    assert_eq!(
        fetched_since(&m, qp.qid(), seen),
        vec![(1000, 65_536), (66_536, 4464)]
    );
    // VSL 1: 16 blocks of 512 bytes per Verify. Blocks 0..999 are fine,
    // 1000 on are not: the pieces from 992 fail.
    let v = run_io(
        &mut qp,
        IoCommand::Verify {
            ns: &ns,
            slba: 960,
            blocks: 64,
        },
        IoData::none(),
    );
    assert_eq!(
        v.result,
        Err(IoError::Status(Status::new(2, 0x81))),
        "the first failing piece's status"
    );
    assert!(v.buffer.is_none());
    // Before the marked range, and after it, Verify passes.
    for slba in [0, 71_000] {
        let v = run_io(
            &mut qp,
            IoCommand::Verify {
                ns: &ns,
                slba,
                blocks: 40,
            },
            IoData::none(),
        );
        assert!(v.is_ok(), "Verify at {slba}: {:?}", v.result);
    }
    assert_eq!(qp.in_flight(), 0);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// Write Zeroes of more than 65536 blocks (no WZSL) goes as pieces of 65536;
/// the blocks at the pieces' edges read back as zeroes, their neighbours
/// outside the range keep their data.
#[test]
fn write_zeroes_above_65536_blocks_zeroes_every_piece() {
    let (m, c) = setup(no_data_config(512, 200_000, 0, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let edges = [8u64, 65_544, 131_080, 150_008];
    for &e in &edges {
        let data = pattern(e, 4 * BS);
        qp.write_blocking(&ns, e, 4, buffer_with(&c, &data), T)
            .unwrap();
    }
    let seen = m.commands_fetched();
    let (slba, blocks) = (10u64, 150_000u32);
    let wz = run_io(
        &mut qp,
        IoCommand::WriteZeroes {
            ns: &ns,
            slba,
            blocks,
            deallocate: true,
        },
        IoData::none(),
    );
    assert!(wz.is_ok(), "{:?}", wz.result);
    assert_eq!(
        fetched_since(&m, qp.qid(), seen),
        vec![(10, 65_536), (65_546, 65_536), (131_082, 18_928)]
    );
    let end = slba + u64::from(blocks);
    for &e in &edges {
        let got = m.namespace_data(1, e, 4);
        let before = pattern(e, 4 * BS);
        for b in 0..4u64 {
            let lba = e + b;
            let block = &got[b as usize * BS..(b as usize + 1) * BS];
            if (slba..end).contains(&lba) {
                assert!(block.iter().all(|&x| x == 0), "block {lba} zeroed");
            } else {
                assert_eq!(
                    block,
                    &before[b as usize * BS..(b as usize + 1) * BS],
                    "block {lba} outside the range kept"
                );
            }
        }
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// More pieces than the pair's depth: refused whole with the command's own
/// reason (the size limit: there is no transfer to name), nothing sent.
#[test]
fn a_command_without_data_needing_more_pieces_than_the_depth_keeps_its_reason() {
    // 2^20 blocks: the Write Zeroes of 4 × 65536 blocks below lies inside.
    let (m, c) = setup(no_data_config(4096, 1 << 20, 1, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = depth_3_pair(&c);
    let seen = m.commands_fetched();
    let verify = |blocks| IoCommand::Verify {
        ns: &ns,
        slba: 0,
        blocks,
    };
    let r = qp.submit_io(verify(7), IoData::none(), 1).unwrap_err();
    assert_eq!(
        r.reason,
        Reject::SizeLimit {
            limit: upnvme::NvmLimit::Verify,
            max: 2
        }
    );
    assert_eq!(m.commands_fetched(), seen, "nothing sent");
    // Three pieces fit.
    assert!(run_io(&mut qp, verify(6), IoData::none()).is_ok());
    // Above 65536 blocks with more pieces than the depth: the block count.
    let wz = IoCommand::WriteZeroes {
        ns: &ns,
        slba: 0,
        blocks: 4 * 65_536,
        deallocate: false,
    };
    let r = qp.submit_io(wz, IoData::none(), 1).unwrap_err();
    assert_eq!(r.reason, Reject::BlockCount { blocks: 4 * 65_536 });
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// Write Zeroes with PRACT on a Type 1 namespace, beyond WZSL: each piece
/// carries its own reference tag (the command's plus the blocks before
/// it), so the controller stores each block's LBA as its tag, and a read
/// that checks the tags passes.
#[test]
fn write_zeroes_pieces_with_pract_carry_their_reference_tags() {
    // 512 + 8 bytes per block, interleaved, Type 1; WZSL 1: 8 KiB, 15
    // blocks per Write Zeroes (the limit counts interleaved metadata).
    let (m, c) = setup(ModelConfig {
        nvm_limits: upnvme_tests::NvmLimitsConfig {
            wzsl: 1,
            ..Default::default()
        },
        oncs: ModelConfig::ONCS_WRITE_ZEROES,
        ..config(8, true, 1)
    });
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // PRACT without checks (Write Zeroes has no data to check).
    let generate = Protection {
        check_guard: false,
        check_ref_tag: false,
        ..Protection::PRACT
    };
    let check = Protection::CHECK;
    // The tag from the SLBA, then an explicit one (Type 1: the SLBA's).
    for (slba, ref_tag) in [(7u64, None), (100, Some(100))] {
        let blocks = 40u32;
        let seen = m.commands_fetched();
        let wz = run_io(
            &mut qp,
            IoCommand::WriteZeroes {
                ns: &ns,
                slba,
                blocks,
                deallocate: false,
            },
            IoData::none().protection(Protection {
                ref_tag,
                ..generate
            }),
        );
        assert!(wz.is_ok(), "{:?}", wz.result);
        assert_eq!(
            fetched_since(&m, qp.qid(), seen),
            vec![(slba, 15), (slba + 15, 15), (slba + 30, 10)]
        );
        let r = run_io(
            &mut qp,
            read(&ns, slba, blocks),
            IoData::buffer(c.alloc_dma(blocks as usize * 520).unwrap()).protection(check),
        );
        assert!(r.is_ok(), "checked read after {ref_tag:?}: {:?}", r.result);
        let back = read_back(&r.buffer.unwrap(), blocks as usize * 520);
        for (i, block) in back.chunks(520).enumerate() {
            assert!(block[..BS].iter().all(|&b| b == 0), "block {i} zeroed");
            let tag = u32::from_be_bytes(block[BS + 4..BS + 8].try_into().unwrap());
            assert_eq!(u64::from(tag), slba + i as u64, "block {i}'s reference tag");
        }
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A Write Zeroes above 65536 blocks whose pieces are bounded by WZSL (16
/// blocks) needs more pieces than the depth: it is refused with the limit
/// that bounds the pieces (`SizeLimit`, WZSL, `max` 16), not with the
/// block count (a review found that refusal).
#[test]
fn a_write_zeroes_needing_more_pieces_than_the_depth_names_the_limit_that_bounds_them() {
    let (_m, c) = setup(no_data_config(512, 200_000, 0, 1));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let depth = qp.max_depth();
    assert!(depth >= 2);
    let r = qp
        .submit_io(
            IoCommand::WriteZeroes {
                ns: &ns,
                slba: 0,
                blocks: 70_000,
                deallocate: false,
            },
            IoData::none(),
            1,
        )
        .unwrap_err();
    eprintln!("depth {depth}: {:?}: {}", r.reason, r.reason);
    assert_eq!(
        r.reason,
        Reject::SizeLimit {
            limit: upnvme::NvmLimit::WriteZeroes,
            max: 16
        }
    );
}

/// A split Verify with a buffer passed hands the buffer back once;
/// with a metadata buffer it is refused whole and both come back.
#[test]
fn a_split_verify_hands_its_buffer_back_and_a_metadata_buffer_is_refused_whole() {
    let (m, c) = setup(no_data_config(4096, 64, 1, 1));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let seen = m.commands_fetched();
    let done = run_io(
        &mut qp,
        IoCommand::Verify {
            ns: &ns,
            slba: 0,
            blocks: 7,
        },
        IoData::buffer(c.alloc_dma(4096).unwrap()),
    );
    assert!(done.is_ok(), "{:?}", done.result);
    assert!(done.buffer.is_some(), "buffer back");
    assert_eq!(m.commands_fetched() - seen, 4);
    let r = qp
        .submit_io(
            IoCommand::Verify {
                ns: &ns,
                slba: 0,
                blocks: 7,
            },
            IoData::buffer(c.alloc_dma(4096).unwrap()).metadata(c.alloc_dma(4096).unwrap()),
            1,
        )
        .unwrap_err();
    assert_eq!(r.reason, Reject::MetadataNotApplicable);
    assert!(r.buffer.is_some() && r.metadata.is_some());
    assert_eq!(qp.in_flight(), 0);
}

/// Probe: Write Zeroes with PRACT on Type 3 and on Type 2 (64-bit guard,
/// explicit tag) beyond WZSL; then the stored tags are read back raw.
#[test]
fn split_pract_write_zeroes_stores_what_one_command_would_for_types_1_to_3_and_both_guards() {
    for (pi_type, pif, ms, ref_tag) in [
        (3u8, 0u8, 8u16, None),
        (3, 0, 8, Some(0x1234)),
        (2, 0, 8, Some(0xffff_fff0)),
        (2, 2, 16, Some(0xffff_ffff_fff0)),
        (1, 2, 16, None),
    ] {
        let (m, c) = setup(ModelConfig {
            elbas: pif != 0,
            namespaces: vec![NamespaceConfig {
                lba_size: 512,
                blocks: 4096,
                ms,
                extended: true,
                pi_type,
                pif,
                ..NamespaceConfig::default()
            }],
            oncs: ModelConfig::ONCS_WRITE_ZEROES | ModelConfig::ONCS_VERIFY,
            nvm_limits: upnvme_tests::NvmLimitsConfig {
                wzsl: 1,
                vsl: 1,
                ..Default::default()
            },
            ..ModelConfig::default()
        });
        let ns = c.namespace(1).unwrap().clone();
        let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
        let slba = 100u64;
        let blocks = 40u32;
        // The same Write Zeroes as one command (no limit): what it stores.
        let one = {
            let (m1, c1) = setup(ModelConfig {
                nvm_limits: Default::default(),
                ..m.config()
            });
            let ns1 = c1.namespace(1).unwrap().clone();
            let mut q1 = c1.io_queue_pair(QueuePairOptions::default()).unwrap();
            let wz = run_io(
                &mut q1,
                IoCommand::WriteZeroes {
                    ns: &ns1,
                    slba,
                    blocks,
                    deallocate: false,
                },
                IoData::none().protection(Protection {
                    pract: true,
                    check_guard: false,
                    check_app_tag: false,
                    check_ref_tag: false,
                    ref_tag,
                    app_tag: 0x55,
                    app_tag_mask: 0,
                }),
            );
            assert!(wz.is_ok(), "{:?}", wz.result);
            m1.namespace_metadata(1, slba, u64::from(blocks))
        };
        let wz = run_io(
            &mut qp,
            IoCommand::WriteZeroes {
                ns: &ns,
                slba,
                blocks,
                deallocate: false,
            },
            IoData::none().protection(Protection {
                pract: true,
                check_guard: false,
                check_app_tag: false,
                check_ref_tag: false,
                ref_tag,
                app_tag: 0x55,
                app_tag_mask: 0,
            }),
        );
        assert!(wz.is_ok(), "type {pi_type} pif {pif}: {:?}", wz.result);
        let split = m.namespace_metadata(1, slba, u64::from(blocks));
        assert_eq!(
            split, one,
            "type {pi_type} pif {pif} {ref_tag:?}: metadata differs from one command's"
        );
        // A checked Verify, split too.
        let v = run_io(
            &mut qp,
            IoCommand::Verify {
                ns: &ns,
                slba,
                blocks,
            },
            IoData::none().protection(Protection {
                pract: false,
                check_guard: true,
                check_app_tag: true,
                check_ref_tag: pi_type != 3,
                ref_tag,
                app_tag: 0x55,
                app_tag_mask: 0xffff,
            }),
        );
        assert!(v.is_ok(), "verify type {pi_type} pif {pif}: {:?}", v.result);
    }
}

/// Probe: a split Write Zeroes in flight when the controller is reset ends
/// once (ControllerReset), and the pair carries on.
#[test]
fn a_split_write_zeroes_cut_by_a_reset_ends_once() {
    let (m, c) = setup(no_data_config(4096, 64, 0, 1));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode {
            qid: qp.qid(),
            opcode: 0x08,
        },
        doorbells: None,
    });
    qp.submit_io(
        IoCommand::WriteZeroes {
            ns: &ns,
            slba: 0,
            blocks: 9,
            deallocate: false,
        },
        IoData::buffer(c.alloc_dma(4096).unwrap()),
        42,
    )
    .unwrap();
    let mut got = Vec::new();
    for _ in 0..1000 {
        qp.process_completions(u32::MAX, |_, cpl| got.push(cpl))
            .unwrap();
    }
    assert!(got.is_empty(), "one piece is held");
    c.reset().unwrap();
    for _ in 0..1000 {
        let _ = qp.process_completions(u32::MAX, |_, cpl| got.push(cpl));
    }
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].tag, 42);
    assert_eq!(got[0].result, Err(IoError::ControllerReset));
    assert!(got[0].buffer.is_some());
    let w = buffer_with(&c, &pattern(1, 4096));
    qp.write_blocking(&ns, 0, 1, w, T).unwrap();
}

// ------------------------------------------------------- Dataset Management

fn dsm_config(blocks: u64, dmrl: u8, dmrsl: u32, dmsl: u64) -> ModelConfig {
    ModelConfig {
        namespaces: vec![NamespaceConfig {
            lba_size: BS as u32,
            blocks,
            ..NamespaceConfig::default()
        }],
        oncs: ModelConfig::ONCS_DSM,
        nvm_limits: upnvme_tests::NvmLimitsConfig {
            dmrl,
            dmrsl,
            dmsl,
            ..Default::default()
        },
        ..ModelConfig::default()
    }
}

fn range(slba: u64, nlb: u32) -> DsmRange {
    DsmRange {
        cattr: 0,
        nlb,
        slba,
    }
}

/// The Dataset Management commands queue `qid` fetched since `from`: NR + 1
/// of each (the ranges themselves are checked by the model, which records a
/// command beyond DMRL, DMRSL or DMSL as a violation, and by what is
/// deallocated).
fn dsm_sent(m: &upnvme_tests::ModelController, qid: u16, from: u64) -> Vec<u32> {
    let n = (m.commands_fetched() - from) as usize;
    let recent = m.recent_commands();
    recent[recent.len() - n..]
        .iter()
        .filter(|(q, sqe)| *q == qid && sqe[0] == 0x09)
        .map(|(_, sqe)| u32::from(sqe[40]) + 1)
        .collect()
}

/// Blocks `[slba, slba + n)` read back as zeros (deallocated) or as `data`'s.
fn expect_blocks(m: &upnvme_tests::ModelController, data: &[u8], zeroed: &[(u64, u32)]) {
    let blocks = data.len() / BS;
    let now = m.namespace_data(1, 0, blocks as u64);
    for b in 0..blocks {
        let z = zeroed
            .iter()
            .any(|&(s, n)| (s..s + u64::from(n)).contains(&(b as u64)));
        let want = if z {
            vec![0u8; BS]
        } else {
            data[b * BS..(b + 1) * BS].to_vec()
        };
        assert!(
            now[b * BS..(b + 1) * BS] == want[..],
            "block {b}: {}",
            if z { "not deallocated" } else { "deallocated" }
        );
    }
}

/// A Deallocate beyond DMRL, DMRSL and DMSL goes as Dataset Management
/// commands within all three (a range above DMRSL, or above what is left of
/// DMSL in its command, goes on as further ranges), in order, with one
/// completion; every listed block is deallocated and no other. Before, it
/// was refused with the limit.
#[test]
fn a_deallocate_beyond_dmrl_dmrsl_and_dmsl_goes_as_commands_within_them() {
    let (m, c) = setup(dsm_config(128, 2, 8, 12));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let data = pattern(3, 64 * BS);
    qp.write_blocking(&ns, 0, 64, buffer_with(&c, &data), T)
        .unwrap();
    let ranges = [range(0, 20), range(30, 3), range(40, 1), range(50, 5)];
    let seen = m.commands_fetched();
    let done = run_io(
        &mut qp,
        IoCommand::Deallocate {
            ns: &ns,
            ranges: &ranges,
        },
        IoData::none(),
    );
    assert!(done.is_ok(), "{:?}", done.result);
    // (0,8) (8,4) | (12,8) (30,3) | (40,1) (50,5)
    assert_eq!(dsm_sent(&m, qp.qid(), seen), vec![2, 2, 2]);
    expect_blocks(&m, &data, &ranges.map(|r| (r.slba, r.nlb)));
    assert_eq!(qp.in_flight(), 0);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// More than 256 ranges (CDW10.NR is 8 bits): as several commands of at
/// most 256 ranges. A Dataset Management with attributes but no Integral
/// Dataset ones goes the same way.
#[test]
fn a_deallocate_of_more_than_256_ranges_goes_as_several_commands() {
    let (m, c) = setup(dsm_config(2048, 0, 0, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let data = pattern(4, 1300 * BS);
    qp.write_blocking(&ns, 0, 1300, buffer_with(&c, &data), T)
        .unwrap();
    let ranges: Vec<DsmRange> = (0..600).map(|i| range(2 * i, 1)).collect();
    let seen = m.commands_fetched();
    let done = run_io(
        &mut qp,
        IoCommand::DatasetManagement {
            ns: &ns,
            ranges: &ranges,
            attributes: DsmAttributes {
                deallocate: true,
                ..Default::default()
            },
        },
        IoData::none(),
    );
    assert!(done.is_ok(), "{:?}", done.result);
    assert_eq!(dsm_sent(&m, qp.qid(), seen), vec![256, 256, 88]);
    let zeroed: Vec<(u64, u32)> = ranges.iter().map(|r| (r.slba, r.nlb)).collect();
    expect_blocks(&m, &data, &zeroed);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// All or nothing: a range of 0 blocks, or outside the namespace, anywhere
/// in the list refuses the whole with its reason; more commands than the
/// pair's depth keep the original reason (a range of 100,000 blocks under a
/// DMRSL of 1 is not cut into 100,000 ranges first); Integral Dataset
/// attributes keep the refusal. Nothing is sent in any of these.
#[test]
fn a_dataset_management_split_is_refused_whole() {
    let (m, c) = setup(dsm_config(200_000, 0, 1, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = depth_3_pair(&c);
    let seen = m.commands_fetched();
    let dealloc = |ranges| IoCommand::Deallocate { ns: &ns, ranges };
    let refused = |qp: &mut upnvme::IoQueuePair<upnvme_tests::ModelController>, cmd| {
        qp.submit_io(cmd, IoData::none(), 1).unwrap_err().reason
    };
    let zero = [range(0, 1), range(5, 1), range(9, 0)];
    assert_eq!(
        refused(&mut qp, dealloc(&zero)),
        Reject::BlockCount { blocks: 0 }
    );
    let outside = [range(0, 1), range(5, 1), range(199_999, 2)];
    assert_eq!(refused(&mut qp, dealloc(&outside)), Reject::LbaRange);
    let huge = [range(0, 100_000)];
    assert_eq!(
        refused(&mut qp, dealloc(&huge)),
        Reject::SizeLimit {
            limit: upnvme::NvmLimit::DsmRangeBlocks,
            max: 1
        }
    );
    let many: Vec<DsmRange> = (0..769).map(|i| range(i, 1)).collect();
    assert_eq!(
        refused(&mut qp, dealloc(&many)),
        Reject::RangeCount {
            command: RangeCommand::DatasetManagement,
            ranges: 769,
            max: 256
        },
        "the reason the whole was refused for"
    );
    let integral = IoCommand::DatasetManagement {
        ns: &ns,
        ranges: &huge,
        attributes: DsmAttributes {
            integral_read: true,
            ..Default::default()
        },
    };
    assert!(matches!(
        refused(&mut qp, integral),
        Reject::SizeLimit { .. }
    ));
    assert_eq!(m.commands_fetched(), seen, "nothing sent");
    // Three commands fit the depth: 768 ranges of one block.
    let fits: Vec<DsmRange> = (0..768).map(|i| range(i, 1)).collect();
    assert!(run_io(&mut qp, dealloc(&fits), IoData::none()).is_ok());
    assert_eq!(dsm_sent(&m, qp.qid(), seen), vec![256, 256, 256]);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A failing command of a split Dataset Management fails the whole, once.
#[test]
fn a_failing_dataset_management_piece_fails_the_whole_once() {
    let (m, c) = setup(dsm_config(2048, 0, 0, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ranges: Vec<DsmRange> = (0..300).map(|i| range(i, 1)).collect();
    let second = m.commands_fetched() + 1;
    m.inject(Fault::Status {
        on: Match::Nth(second),
        status: upnvme_tests::Status::INTERNAL_ERROR,
    });
    let cmd = IoCommand::Deallocate {
        ns: &ns,
        ranges: &ranges,
    };
    qp.submit_io(cmd, IoData::none(), 42).unwrap();
    let done: Completion = wait_one(&mut qp);
    assert_eq!(done.tag, 42);
    match done.result {
        Err(IoError::Status(s)) => assert_eq!(s, Status::new(0, 0x06)),
        other => panic!("{other:?}"),
    }
    let mut more = 0;
    for _ in 0..10 {
        more += qp.process_completions(u32::MAX, |_, _| {}).unwrap();
    }
    assert_eq!(more, 0, "delivered twice");
    drop(qp);
    drop(c);
    assert_clean(&m);
}

// --------------------------------- Dataset Management: edges and faults
// (From the thirty-seventh session's review of the split; the first three
// tests below failed on its first version.)

fn ones(n: u64) -> Vec<DsmRange> {
    (0..n).map(|i| range(2 * i, 1)).collect()
}

fn poll_for(
    qp: &mut upnvme::IoQueuePair<upnvme_tests::ModelController>,
    n: usize,
    limit: Duration,
) -> (Vec<Completion>, Option<upnvme::Error>) {
    let mut out = Vec::new();
    let start = Instant::now();
    while out.len() < n && start.elapsed() < limit {
        if let Err(e) = qp.process_completions(u32::MAX, |_, c| out.push(c)) {
            return (out, Some(e));
        }
    }
    (out, None)
}

/// `build_other_md` builds the command without metadata first, so
/// a Deallocate of more than 256 ranges with a metadata buffer is refused
/// as a whole for `RangeCount` (not `MetadataNotApplicable`); `may_split`
/// accepts that; the children carry the command's metadata buffer so that
/// their own build refuses it, as for the same Deallocate of 200 ranges
/// (the first version gave them none: the split was sent, the buffer
/// silently ignored).
#[test]
fn a_split_deallocate_refuses_a_metadata_buffer_as_one_command_does() {
    let (m, c) = setup(dsm_config(2048, 0, 0, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let small = ones(200);
    let r = qp
        .submit_io(
            IoCommand::Deallocate {
                ns: &ns,
                ranges: &small,
            },
            IoData::none().metadata(c.alloc_dma(4096).unwrap()),
            1,
        )
        .unwrap_err();
    assert_eq!(r.reason, Reject::MetadataNotApplicable);
    let seen = m.commands_fetched();
    let many = ones(300);
    let r = qp.submit_io(
        IoCommand::Deallocate {
            ns: &ns,
            ranges: &many,
        },
        IoData::none().metadata(c.alloc_dma(4096).unwrap()),
        2,
    );
    match r {
        Err(r) => assert_eq!(r.reason, Reject::MetadataNotApplicable),
        Ok(()) => {
            let done = wait_one(&mut qp);
            panic!(
                "a 300-range Deallocate with a metadata buffer was sent as {} commands \
                 (result {:?}); 200 ranges with the same buffer are refused",
                m.commands_fetched() - seen,
                done.result
            );
        }
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// As above with protection fields: refused `ProtectionNotApplicable`
/// (the first version dropped them).
#[test]
fn a_split_deallocate_refuses_protection_as_one_command_does() {
    let (m, c) = setup(dsm_config(2048, 0, 0, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let p = Protection {
        pract: true,
        ..Protection::default()
    };
    let small = ones(200);
    let r = qp
        .submit_io(
            IoCommand::Deallocate {
                ns: &ns,
                ranges: &small,
            },
            IoData::none().protection(p),
            1,
        )
        .unwrap_err();
    assert!(
        matches!(r.reason, Reject::ProtectionNotApplicable(_)),
        "{:?}",
        r.reason
    );
    let many = ones(300);
    let r = qp.submit_io(
        IoCommand::Deallocate {
            ns: &ns,
            ranges: &many,
        },
        IoData::none().protection(p),
        2,
    );
    if r.is_ok() {
        let _ = wait_one(&mut qp);
    }
    assert!(
        matches!(&r, Err(r) if matches!(r.reason, Reject::ProtectionNotApplicable(_))),
        "300 ranges with PRACT: {:?} (200 ranges: ProtectionNotApplicable)",
        r.as_ref().map_err(|e| e.reason)
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A split refused for needing more commands than the pair's depth names
/// the limit that made them so many: 300 ranges of 4 blocks under DMRSL 1
/// on a pair of depth 3 need 1200 one-block ranges, 5 commands, while 300
/// ranges alone would fit 2. The first version answered the whole's first
/// refusal, `RangeCount { ranges: 300, max: 256 }`, whose message says
/// "more go as several commands" — wrong here; it is DMRSL.
#[test]
fn a_split_refused_for_dmrsl_does_not_blame_the_range_count() {
    let (m, c) = setup(dsm_config(4096, 0, 1, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = depth_3_pair(&c);
    let ranges: Vec<DsmRange> = (0..300).map(|i| range(8 * i, 4)).collect();
    let seen = m.commands_fetched();
    let r = qp
        .submit_io(
            IoCommand::Deallocate {
                ns: &ns,
                ranges: &ranges,
            },
            IoData::none(),
            1,
        )
        .unwrap_err();
    assert_eq!(m.commands_fetched(), seen, "nothing sent");
    assert_eq!(
        r.reason,
        Reject::SizeLimit {
            limit: upnvme::NvmLimit::DsmRangeBlocks,
            max: 1
        },
        "300 ranges fit 2 commands on a depth of 3; the cause is DMRSL 1 (1200 ranges)"
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

// ---------------------------------------------------------------- faults

/// Two split Deallocates and a plain one queued back to back, rung once:
/// every child's range list is in its own slot's list page (no child's
/// list overwritten by another's): exactly the listed blocks deallocated.
#[test]
fn queued_dsm_splits_keep_their_range_lists_apart() {
    let (m, c) = setup(dsm_config(4096, 0, 0, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let data = pattern(9, 4096 * BS);
    for chunk in 0..8u64 {
        let part = &data[chunk as usize * 512 * BS..(chunk as usize + 1) * 512 * BS];
        qp.write_blocking(&ns, chunk * 512, 512, buffer_with(&c, part), T)
            .unwrap();
    }
    // Disjoint sets: even blocks of 0..1200, blocks 1601,1604,... , 3000..3100.
    let a: Vec<DsmRange> = (0..600).map(|i| range(2 * i, 1)).collect();
    let b: Vec<DsmRange> = (0..400).map(|i| range(1601 + 3 * i, 1)).collect();
    let p = [range(3000, 100)];
    for (ranges, tag) in [(&a[..], 1u64), (&b[..], 2), (&p[..], 3)] {
        qp.queue_io(
            IoCommand::Deallocate { ns: &ns, ranges },
            IoData::none(),
            tag,
        )
        .unwrap();
    }
    qp.ring();
    let (got, err) = poll_for(&mut qp, 3, T);
    assert!(err.is_none(), "{err:?}");
    let mut tags: Vec<u64> = got.iter().map(|c| c.tag).collect();
    tags.sort();
    assert_eq!(tags, vec![1, 2, 3]);
    assert!(got.iter().all(Completion::is_ok), "{got:?}");
    let now = m.namespace_data(1, 0, 4096);
    let all: Vec<&DsmRange> = a.iter().chain(&b).chain(&p).collect();
    for blk in 0..4096u64 {
        let z = all
            .iter()
            .any(|r| (r.slba..r.slba + u64::from(r.nlb)).contains(&blk));
        let at = blk as usize * BS..(blk as usize + 1) * BS;
        if z {
            assert!(
                now[at].iter().all(|&x| x == 0),
                "block {blk} not deallocated"
            );
        } else {
            assert_eq!(now[at.clone()], data[at], "block {blk} deallocated");
        }
    }
    let (more, _) = poll_for(&mut qp, 1, Duration::from_millis(50));
    assert!(more.is_empty(), "delivered twice: {more:?}");
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A pair of 16 entries whose commands time out after 30 ms.
fn timeout_30ms_pair(
    c: &upnvme::Controller<upnvme_tests::ModelController>,
) -> upnvme::IoQueuePair<upnvme_tests::ModelController> {
    c.io_queue_pair(QueuePairOptions {
        entries: Some(16),
        command_timeout: Some(Duration::from_millis(30)),
        ..Default::default()
    })
    .unwrap()
}

/// A held DSM child: after the command timeout it is aborted and the whole
/// completes once as TimedOut.
#[test]
fn a_held_dsm_child_times_out_once() {
    let (m, c) = setup(dsm_config(2048, 0, 0, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = timeout_30ms_pair(&c);
    m.inject(Fault::DelayCompletion {
        on: Match::Nth(m.commands_fetched() + 1),
        doorbells: None,
    });
    let many = ones(600);
    qp.submit_io(
        IoCommand::Deallocate {
            ns: &ns,
            ranges: &many,
        },
        IoData::none(),
        5,
    )
    .unwrap();
    let (got, err) = poll_for(&mut qp, 1, Duration::from_secs(5));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].tag, 5);
    assert_eq!(got[0].result, Err(IoError::TimedOut));
    let (more, err) = poll_for(&mut qp, 1, Duration::from_millis(100));
    assert!(more.is_empty() && err.is_none(), "{more:?} {err:?}");
    assert_eq!(qp.in_flight(), 0);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A lost DSM child: Abort not answered, reset; the whole completes once,
/// and a following split works.
#[test]
fn a_lost_dsm_child_resets_and_completes_once() {
    let (m, c) = setup(dsm_config(2048, 0, 0, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = timeout_30ms_pair(&c);
    m.inject(Fault::DropCompletion(Match::Nth(m.commands_fetched() + 2)));
    let many = ones(600);
    let cmd = IoCommand::Deallocate {
        ns: &ns,
        ranges: &many,
    };
    qp.submit_io(cmd, IoData::none(), 5).unwrap();
    let (got, err) = poll_for(&mut qp, 1, Duration::from_secs(5));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].result.is_err());
    assert_eq!(c.resets(), 1);
    let (more, err) = poll_for(&mut qp, 1, Duration::from_millis(100));
    assert!(more.is_empty() && err.is_none(), "{more:?} {err:?}");
    assert!(run_io(&mut qp, cmd, IoData::none()).is_ok());
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A reset while a split DSM has a child held ends the whole once with
/// ControllerReset; close with a held DSM child delivers it once.
#[test]
fn dsm_split_cut_by_a_reset_or_a_close_ends_once() {
    let (m, c) = setup(dsm_config(2048, 0, 0, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    m.inject(Fault::DelayCompletion {
        on: Match::Nth(m.commands_fetched() + 2),
        doorbells: None,
    });
    let many = ones(600);
    let cmd = IoCommand::Deallocate {
        ns: &ns,
        ranges: &many,
    };
    qp.submit_io(cmd, IoData::none(), 5).unwrap();
    let (got, _) = poll_for(&mut qp, 1, Duration::from_millis(50));
    assert!(got.is_empty(), "{got:?}");
    c.reset().unwrap();
    let (got, err) = poll_for(&mut qp, 1, T);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].result, Err(IoError::ControllerReset));
    let (more, _) = poll_for(&mut qp, 1, Duration::from_millis(50));
    assert!(more.is_empty(), "{more:?}");
    // Close with a held child.
    m.inject(Fault::DelayCompletion {
        on: Match::Nth(m.commands_fetched() + 1),
        doorbells: None,
    });
    qp.submit_io(cmd, IoData::none(), 6).unwrap();
    let out = qp.close(Duration::from_millis(30));
    assert_eq!(out.iter().filter(|c| c.tag == 6).count(), 1, "{out:?}");
    drop(c);
    assert_clean(&m);
}

/// IDW set: more than 256 ranges stay refused with RangeCount, nothing
/// sent; a DSM with attributes but no integral ones splits; 0-block and
/// out-of-namespace pieces are refused whole; a range ending at the last
/// LBA is cut exactly (no overflow).
#[test]
fn dsm_split_refusals_and_edges() {
    let (m, c) = setup(dsm_config(1 << 20, 0, 7, 0));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let seen = m.commands_fetched();
    let many = ones(300);
    let r = qp
        .submit_io(
            IoCommand::DatasetManagement {
                ns: &ns,
                ranges: &many,
                attributes: DsmAttributes {
                    integral_write: true,
                    ..Default::default()
                },
            },
            IoData::none(),
            1,
        )
        .unwrap_err();
    assert!(matches!(r.reason, Reject::RangeCount { ranges: 300, .. }));
    // Last LBA, beyond DMRSL: cut into ranges of 7 up to the end.
    let end = [range((1 << 20) - 20, 20)];
    let r = qp
        .submit_io(
            IoCommand::Deallocate {
                ns: &ns,
                ranges: &end,
            },
            IoData::none(),
            2,
        )
        .map(|()| wait_one(&mut qp));
    assert!(r.as_ref().is_ok_and(Completion::is_ok), "{r:?}");
    let past = [range((1 << 20) - 20, 21)];
    let r = qp
        .submit_io(
            IoCommand::Deallocate {
                ns: &ns,
                ranges: &past,
            },
            IoData::none(),
            3,
        )
        .unwrap_err();
    assert_eq!(r.reason, Reject::LbaRange);
    let wrap = [range(u64::MAX - 3, 20)];
    let r = qp
        .submit_io(
            IoCommand::Deallocate {
                ns: &ns,
                ranges: &wrap,
            },
            IoData::none(),
            4,
        )
        .unwrap_err();
    assert_eq!(r.reason, Reject::LbaRange);
    let mut wrap_many = ones(300);
    wrap_many.push(range(u64::MAX - 3, 20));
    let r = qp
        .submit_io(
            IoCommand::Deallocate {
                ns: &ns,
                ranges: &wrap_many,
            },
            IoData::none(),
            5,
        )
        .unwrap_err();
    assert_eq!(r.reason, Reject::LbaRange);
    let sent = m.commands_fetched() - seen;
    assert_eq!(
        sent, 1,
        "only the in-range split was sent (as one command of 3 ranges)"
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// As above for DMSL: one range of 8 blocks under DMSL 2 needs 4 commands,
/// one more than a depth of 3 holds: refused for DMSL, nothing sent; 6
/// blocks go as 3.
#[test]
fn a_split_refused_for_dmsl_names_dmsl() {
    let (m, c) = setup(dsm_config(4096, 0, 0, 2));
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = depth_3_pair(&c);
    let seen = m.commands_fetched();
    let eight = [range(0, 8)];
    let r = qp
        .submit_io(
            IoCommand::Deallocate {
                ns: &ns,
                ranges: &eight,
            },
            IoData::none(),
            1,
        )
        .unwrap_err();
    assert_eq!(
        r.reason,
        Reject::SizeLimit {
            limit: upnvme::NvmLimit::DsmBlocks,
            max: 2
        }
    );
    assert_eq!(m.commands_fetched(), seen, "nothing sent");
    let six = [range(0, 6)];
    let cmd = IoCommand::Deallocate {
        ns: &ns,
        ranges: &six,
    };
    assert!(run_io(&mut qp, cmd, IoData::none()).is_ok());
    assert_eq!(dsm_sent(&m, qp.qid(), seen), vec![1, 1, 1]);
    drop(qp);
    drop(c);
    assert_clean(&m);
}
