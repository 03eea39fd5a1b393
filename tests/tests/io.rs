//! Host tests of the I/O queue pairs against the model: byte-exact reads and
//! writes from one block to MDTS (PRP one page, two pages, lists, chained
//! lists) on 512- and 4096-byte LBAs, every command (Compare success and
//! failure, Write Zeroes, Dataset Management deallocate, Flush), argument
//! errors that hand the buffer back, device errors with the buffer, QueueFull
//! at max_depth, batching, Create CQ with IEN = 0, Delete SQ then CQ on drop,
//! qid reuse, NoQueuesLeft, one queue pair per thread.

mod common;

use std::time::{Duration, Instant};

use common::{T, admin_op, assert_clean, buffer_with, config_one_ns, pattern, read_back, setup};
use upnvme::{
    Completion, Controller, DsmRange, Error, IoCommand, IoData, IoError, IoQueuePair, Namespace,
    QueuePairOptions, RangeCommand, Reject,
};
use upnvme_tests::{Fault, Match, ModelConfig, ModelController, NamespaceConfig, Status};

/// Polls until one completion arrives (bounded).
fn wait_one(qp: &mut IoQueuePair<ModelController>) -> Completion {
    for _ in 0..1_000_000 {
        let mut got = None;
        qp.process_completions(1, |_, c| got = Some(c)).unwrap();
        if let Some(c) = got {
            return c;
        }
    }
    panic!("no completion");
}

fn two_ns() -> ModelConfig {
    ModelConfig {
        namespaces: vec![
            NamespaceConfig {
                nsid: 1,
                lba_size: 512,
                blocks: 16384,
                ..NamespaceConfig::default()
            },
            NamespaceConfig {
                nsid: 2,
                lba_size: 4096,
                blocks: 4096,
                ..NamespaceConfig::default()
            },
        ],
        ..Default::default()
    }
}

#[test]
fn read_write_byte_exact_one_block_to_mdts() {
    let (m, c) = setup(two_ns());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    assert_eq!(qp.max_transfer(), 4096 << 7);
    // (nsid, block counts): one page, page crossing, two pages, PRP lists, MDTS.
    let cases: [(u32, &[u32]); 2] = [
        (1, &[1, 7, 8, 9, 16, 17, 24, 100, 512, 1023, 1024]),
        (2, &[1, 2, 3, 4, 31, 64, 127, 128]),
    ];
    let mut seed = 0;
    for (nsid, sizes) in cases {
        let ns = c.namespace(nsid).unwrap().clone();
        let lba = ns.lba_size() as usize;
        let mut slba = 0u64;
        for &blocks in sizes {
            seed += 1;
            let len = blocks as usize * lba;
            let data = pattern(seed, len);
            let buf = buffer_with(&c, &data);
            let buf = qp.write_blocking(&ns, slba, blocks, buf, T).unwrap();
            // Independent check: what the model stored.
            assert_eq!(
                m.namespace_data(nsid, slba, blocks as u64),
                data,
                "ns {nsid} write of {blocks} blocks"
            );
            buf.fill(0, buf.len(), 0xee).unwrap();
            let buf = qp.read_blocking(&ns, slba, blocks, buf, T).unwrap();
            assert_eq!(
                read_back(&buf, len),
                data,
                "ns {nsid} read of {blocks} blocks"
            );
            slba += blocks as u64;
        }
    }
    let s = qp.stats();
    let total: usize = cases.iter().map(|c| c.1.len()).sum();
    assert_eq!(s.submissions, 2 * total as u64);
    assert_eq!(s.completions, 2 * total as u64);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn read_into_a_larger_buffer_leaves_the_rest_alone() {
    let (m, c) = setup(config_one_ns(512, 4096));
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let data = pattern(3, 3 * 512);
    m.write_namespace_data(1, 10, &data);
    let buf = c.alloc_dma(3 * 4096).unwrap();
    buf.fill(0, buf.len(), 0x5a).unwrap();
    let buf = qp.read_blocking(&ns, 10, 3, buf, T).unwrap();
    let all = read_back(&buf, 3 * 4096);
    assert_eq!(&all[..1536], &data[..]);
    assert!(
        all[1536..].iter().all(|&b| b == 0x5a),
        "no write past the transfer"
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn chained_prp_lists_beyond_one_list_page() {
    // MDTS 10: 4 MiB = 1024 pages, more than one PRP list page holds (512).
    let (m, c) = setup(ModelConfig {
        mdts: 10,
        ..Default::default()
    });
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(4),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(qp.max_transfer(), 4 << 20);
    let ns = c.namespace(1).unwrap().clone();
    for (i, blocks) in [513u32, 1024].into_iter().enumerate() {
        let len = blocks as usize * 4096;
        let data = pattern(100 + i as u64, len);
        let buf = buffer_with(&c, &data);
        let buf = qp.write_blocking(&ns, 0, blocks, buf, T).unwrap();
        assert_eq!(m.namespace_data(1, 0, blocks as u64), data);
        buf.fill(0, len, 0).unwrap();
        let buf = qp.read_blocking(&ns, 0, blocks, buf, T).unwrap();
        assert_eq!(read_back(&buf, len), data);
    }
    // Exactly MDTS from a dword offset inside the first page: 1025 memory
    // pages, PRP1 and 1024 entries over three chained list pages (511 +
    // pointer, 511 + pointer, 2). Read into a slice of a larger buffer,
    // then checked byte for byte with the bytes around it untouched.
    let len = 4 << 20;
    let data = pattern(300, len);
    m.write_namespace_data(1, 64, &data);
    for offset in [4usize, 2048, 4092] {
        let buf = c.alloc_dma(len + 8192).unwrap();
        buf.fill(0, len + 8192, 0xee).unwrap();
        let cmd = upnvme::IoCommand::Read {
            ns: &ns,
            slba: 64,
            blocks: 1024,
        };
        let done = common::run_io(&mut qp, cmd, upnvme::IoData::slice(buf, offset, len));
        assert!(done.is_ok(), "offset {offset}: {:?}", done.result);
        let back = read_back(done.buffer.as_ref().unwrap(), len + 8192);
        assert!(back[..offset].iter().all(|&b| b == 0xee), "offset {offset}");
        assert!(back[offset..offset + len] == data[..], "offset {offset}");
        assert!(
            back[offset + len..].iter().all(|&b| b == 0xee),
            "offset {offset}"
        );
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn unlimited_mdts_is_capped_by_the_driver() {
    let (m, c) = setup(ModelConfig {
        mdts: 0,
        ..Default::default()
    });
    assert_eq!(
        c.max_transfer_bytes(),
        Some(4 << 20),
        "MDTS 0: the driver's per-command cap"
    );
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(2),
            ..Default::default()
        })
        .unwrap();
    let cap = qp.max_transfer();
    assert!(cap >= 1 << 20, "cap {cap}");
    let blocks = (cap / 4096) as u32;
    let data = pattern(9, cap);
    let buf = buffer_with(&c, &data);
    let ns = c.namespace(1).unwrap().clone();
    qp.write_blocking(&ns, 0, blocks, buf, T).unwrap();
    assert_eq!(m.namespace_data(1, 0, blocks as u64), data);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn compare_success_and_failure() {
    let (m, c) = setup(config_one_ns(512, 1024));
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let data = pattern(5, 4 * 512);
    m.write_namespace_data(1, 40, &data);
    let buf = buffer_with(&c, &data);
    let ns = c.namespace(1).unwrap().clone();
    let cmp = IoCommand::Compare {
        ns: &ns,
        slba: 40,
        blocks: 4,
    };
    let buf = qp
        .execute_blocking(cmp, Some(buf), T)
        .unwrap()
        .expect("buffer back");
    // One byte differs: Compare Failure, buffer handed back.
    buf.write_bytes(1000, &[!data[1000]]).unwrap();
    let f = qp.execute_blocking(cmp, Some(buf), T).unwrap_err();
    match &f.error {
        Error::Command { command, status } => {
            assert_eq!(command, "Compare");
            assert!(status.is_compare_failure(), "{status}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        f.error.to_string().contains("Compare Failure"),
        "{}",
        f.error
    );
    let buf = f.buffer.expect("buffer back after an NVMe error");
    // Same through the asynchronous path: the status arrives with the tag.
    qp.submit(cmp, Some(buf), 77).unwrap();
    let cpl = wait_one(&mut qp);
    assert_eq!(cpl.tag, 77);
    match cpl.result {
        Err(IoError::Status(s)) => assert!(s.is_compare_failure()),
        other => panic!("{other:?}"),
    }
    assert!(cpl.buffer.is_some());
    // The queue keeps working after an error.
    let buf = cpl.buffer.unwrap();
    buf.write_bytes(1000, &[data[1000]]).unwrap();
    qp.execute_blocking(cmp, Some(buf), T).unwrap();
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn write_zeroes_deallocate_and_flush() {
    let (m, c) = setup(config_one_ns(4096, 256));
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let data = pattern(11, 64 * 4096);
    let buf = buffer_with(&c, &data);
    let buf = qp.write_blocking(&ns, 0, 64, buf, T).unwrap();
    assert_eq!(m.allocated_blocks(1), 64);

    // Write Zeroes without and with DEAC.
    for (slba, deallocate) in [(0u64, false), (8, true)] {
        let r = qp
            .execute_blocking(
                IoCommand::WriteZeroes {
                    ns: &ns,
                    slba,
                    blocks: 4,
                    deallocate,
                },
                None,
                T,
            )
            .unwrap();
        assert!(r.is_none());
        assert!(m.namespace_data(1, slba, 4).iter().all(|&b| b == 0));
    }
    assert_eq!(m.allocated_blocks(1), 56);
    // Blocks next to the zeroed ones are untouched.
    assert_eq!(m.namespace_data(1, 4, 4), data[4 * 4096..8 * 4096]);

    // Dataset Management, deallocate, three ranges.
    let ranges = [
        DsmRange {
            cattr: 0,
            nlb: 2,
            slba: 20,
        },
        DsmRange {
            cattr: 0,
            nlb: 10,
            slba: 30,
        },
        DsmRange {
            cattr: 0,
            nlb: 1,
            slba: 63,
        },
    ];
    qp.execute_blocking(
        IoCommand::Deallocate {
            ns: &ns,
            ranges: &ranges,
        },
        None,
        T,
    )
    .unwrap();
    assert_eq!(m.allocated_blocks(1), 56 - 13);
    let buf = qp.read_blocking(&ns, 0, 64, buf, T).unwrap();
    let back = read_back(&buf, 64 * 4096);
    for lba in 0..64usize {
        let blk = &back[lba * 4096..(lba + 1) * 4096];
        let zeroed = lba < 4
            || (8..12).contains(&lba)
            || (20..22).contains(&lba)
            || (30..40).contains(&lba)
            || lba == 63;
        if zeroed {
            assert!(blk.iter().all(|&b| b == 0), "LBA {lba} reads zeros");
        } else {
            assert_eq!(blk, &data[lba * 4096..(lba + 1) * 4096], "LBA {lba}");
        }
    }

    // Flush, with a buffer that is handed back untouched.
    let extra = c.alloc_dma(4096).unwrap();
    let back = qp
        .execute_blocking(IoCommand::Flush { ns: &ns }, Some(extra), T)
        .unwrap();
    assert!(back.is_some(), "an unused buffer comes back too");
    let ops: Vec<u8> = m
        .commands_seen()
        .iter()
        .filter(|s| s.0 == qp.qid())
        .map(|s| s.1)
        .collect();
    use common::io_op::*;
    assert_eq!(
        ops,
        vec![WRITE, WRITE_ZEROES, WRITE_ZEROES, DSM, READ, FLUSH]
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn argument_errors_return_the_buffer_and_send_nothing() {
    fn read(ns: &Namespace, slba: u64, blocks: u32) -> IoCommand<'_> {
        IoCommand::Read { ns, slba, blocks }
    }
    let (m, c) = setup(config_one_ns(4096, 1000));
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    // No handle names an inactive namespace; one of another controller is
    // refused by the pair.
    let e = c.namespace(7).unwrap_err();
    assert!(matches!(e, Error::NoSuchNamespace { nsid: 7, .. }), "{e:?}");
    assert!(e.to_string().contains("namespace 7"), "{e}");
    let (m2, c2) = setup(config_one_ns(4096, 1000));
    let foreign = c2.namespace(1).unwrap().clone();
    let before = m.commands_fetched();
    let cases: Vec<(IoCommand<'_>, usize, Reject, &str)> = vec![
        (
            read(&ns, 999, 2),
            2 * 4096,
            Reject::LbaRange,
            "outside the namespace",
        ),
        (
            read(&ns, u64::MAX, 1),
            4096,
            Reject::LbaRange,
            "outside the namespace",
        ),
        (
            read(&ns, 0, 0),
            4096,
            Reject::BlockCount { blocks: 0 },
            "block count 0",
        ),
        (
            read(&foreign, 0, 1),
            4096,
            Reject::ForeignNamespace,
            "another controller",
        ),
        (
            read(&ns, 0, 2),
            4096,
            Reject::BufferTooSmall { need: 8192 },
            "needs 8192 bytes",
        ),
    ];
    for (cmd, len, want, what) in cases {
        let buf = c.alloc_dma(len).unwrap();
        let iova = buf.iova();
        for how in 0..3 {
            let buf = c.alloc_dma(len).unwrap();
            let (error, buffer) = match how {
                0 | 1 => {
                    let f = if how == 0 {
                        qp.submit(cmd, Some(buf), 1).unwrap_err()
                    } else {
                        qp.queue(cmd, Some(buf), 1).unwrap_err()
                    };
                    assert_eq!(f.reason, want, "{cmd:?} (how {how})");
                    (qp.describe(f.reason), f.buffer)
                }
                _ => {
                    let f = qp.execute_blocking(cmd, Some(buf), T).unwrap_err();
                    (f.error, f.buffer)
                }
            };
            assert!(
                matches!(error, Error::Rejected(r) if r.is_invalid_argument()),
                "{cmd:?}: {error:?}"
            );
            assert!(
                error.to_string().contains(what),
                "{cmd:?}: {error} (wanted {what})"
            );
            assert!(buffer.is_some(), "{cmd:?}: buffer handed back");
        }
        let f = qp.submit(cmd, Some(buf), 1).unwrap_err();
        assert_eq!(f.buffer.unwrap().iova(), iova, "the same buffer");
    }
    // Missing buffer for a data command.
    let f = qp.submit(read(&ns, 0, 1), None, 1).unwrap_err();
    assert_eq!(f.reason, Reject::NoBuffer);
    let e = qp.describe(f.reason);
    assert!(
        matches!(e, Error::Rejected(r) if r.is_invalid_argument()),
        "{e:?}"
    );
    assert!(e.to_string().contains("needs a data buffer"), "{e}");
    assert!(f.buffer.is_none());
    // DSM with no range / 257 ranges of 0 blocks (more than 256 go as
    // several commands, each checked: refused whole) / a range outside.
    for (ranges, want) in [
        (
            vec![],
            Reject::RangeCount {
                command: RangeCommand::DatasetManagement,
                ranges: 0,
                max: 256,
            },
        ),
        (
            vec![DsmRange::default(); 257],
            Reject::BlockCount { blocks: 0 },
        ),
        (
            vec![DsmRange {
                cattr: 0,
                nlb: 5,
                slba: 998,
            }],
            Reject::LbaRange,
        ),
    ] {
        let f = qp
            .submit(
                IoCommand::Deallocate {
                    ns: &ns,
                    ranges: &ranges,
                },
                None,
                2,
            )
            .unwrap_err();
        assert_eq!(f.reason, want);
        let e = qp.describe(f.reason);
        assert!(
            matches!(e, Error::Rejected(r) if r.is_invalid_argument()),
            "{e:?}"
        );
    }
    // Nothing reached the device, nothing is in flight, the pair still works.
    assert_eq!(m.commands_fetched(), before);
    assert_eq!(qp.in_flight(), 0);
    let buf = c.alloc_dma(4096).unwrap();
    qp.read_blocking(&ns, 999, 1, buf, T).unwrap();
    drop(qp);
    drop(c);
    assert_clean(&m);
    drop(c2);
    assert_clean(&m2);
}

#[test]
fn device_errors_complete_with_status_and_buffer() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let qid = qp.qid();
    let ns = c.namespace(1).unwrap().clone();
    // LBA Out of Range reported by the device (the driver's own check passed).
    m.inject(Fault::Status {
        on: Match::Queue(qid),
        status: Status::LBA_OUT_OF_RANGE.with_dnr(),
    });
    let buf = c.alloc_dma(4096).unwrap();
    let iova = buf.iova();
    let f = qp.read_blocking(&ns, 0, 1, buf, T).unwrap_err();
    match &f.error {
        Error::Command { command, status } => {
            assert_eq!(command, "Read");
            assert!(status.is_lba_out_of_range() && status.dnr());
        }
        other => panic!("{other:?}"),
    }
    assert!(f.error.to_string().contains("LBA Out of Range"));
    assert_eq!(f.buffer.expect("buffer").iova(), iova);
    // Asynchronous path: Invalid Namespace on a write, tag and buffer kept.
    m.inject(Fault::Status {
        on: Match::Queue(qid),
        status: Status::INVALID_NAMESPACE.with_dnr(),
    });
    let buf = c.alloc_dma(4096).unwrap();
    qp.submit(
        IoCommand::Write {
            ns: &ns,
            slba: 0,
            blocks: 1,
        },
        Some(buf),
        0xabc,
    )
    .unwrap();
    let cpl = wait_one(&mut qp);
    assert_eq!(cpl.tag, 0xabc);
    assert!(!cpl.is_ok());
    assert!(matches!(cpl.result, Err(IoError::Status(s)) if s.sc() == 0x0b));
    assert!(cpl.buffer.is_some());
    // Nothing was written by the failed command.
    assert_eq!(m.allocated_blocks(1), 0);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A failed completion's CRD (Command Retry Delay) reaches the application
/// in its status, and `IdentifyController::retry_delay` turns it into the
/// wait the controller's CRDT asks for; DNR means no retry at all.
#[test]
fn a_failed_completion_says_when_to_retry() {
    let (m, c) = setup(ModelConfig {
        crdt: [3, 0, 12],
        ..ModelConfig::default()
    });
    assert_eq!(c.identify().crdt, [3, 0, 12]);
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let qid = qp.qid();
    let ns = c.namespace(1).unwrap().clone();
    // Namespace Not Ready (SCT 0h, SC 82h) with CRD 1 and with CRD 3, then
    // with DNR set.
    let cases = [
        (Status(0x0082 | 1 << 11), Some(Duration::from_millis(300))),
        (Status(0x0082 | 3 << 11), Some(Duration::from_millis(1200))),
        (Status(0x0082), Some(Duration::ZERO)),
        (Status(0x0082 | 1 << 11).with_dnr(), None),
    ];
    for (status, delay) in cases {
        m.inject(Fault::Status {
            on: Match::Queue(qid),
            status,
        });
        let buf = c.alloc_dma(4096).unwrap();
        let f = qp.read_blocking(&ns, 0, 1, buf, T).unwrap_err();
        let Error::Command { status: s, .. } = &f.error else {
            panic!("{:?}", f.error);
        };
        assert_eq!(s.0, status.0, "{status:?}");
        assert_eq!(c.identify().retry_delay(*s), delay, "{status:?}");
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn queue_full_at_max_depth_returns_at_once_with_the_buffer() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(4),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(qp.max_depth(), 3);
    let ns = c.namespace(1).unwrap().clone();
    let cmd = IoCommand::Write {
        ns: &ns,
        slba: 0,
        blocks: 1,
    };
    for tag in 0..3 {
        let buf = c.alloc_dma(4096).unwrap();
        qp.submit(cmd, Some(buf), tag).unwrap();
    }
    assert_eq!(qp.in_flight(), 3);
    let start = Instant::now();
    for how in 0..3 {
        let buf = c.alloc_dma(4096).unwrap();
        let (error, buffer) = match how {
            0 | 1 => {
                let f = if how == 0 {
                    qp.submit(cmd, Some(buf), 9).unwrap_err()
                } else {
                    qp.queue(cmd, Some(buf), 9).unwrap_err()
                };
                assert_eq!(f.reason, Reject::QueueFull, "how {how}");
                (qp.describe(f.reason), f.buffer)
            }
            _ => {
                let f = qp.write_blocking(&ns, 0, 1, buf, T).unwrap_err();
                (f.error, f.buffer)
            }
        };
        assert!(
            matches!(error, Error::QueueFull { qid } if qid == qp.qid()),
            "{error:?}"
        );
        assert!(error.to_string().contains("process_completions"));
        assert!(buffer.is_some());
    }
    assert!(start.elapsed() < Duration::from_millis(500), "never blocks");
    // Reap, and there is room again.
    let mut tags = Vec::new();
    qp.process_completions(u32::MAX, |_, c| tags.push(c.tag))
        .unwrap();
    tags.sort_unstable();
    assert_eq!(tags, vec![0, 1, 2]);
    let buf = c.alloc_dma(4096).unwrap();
    qp.write_blocking(&ns, 0, 1, buf, T).unwrap();
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn batch_of_queued_commands_rings_once() {
    let (m, c) = setup(config_one_ns(512, 4096));
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            shadow_doorbells: false,
            ..Default::default()
        })
        .unwrap();
    let qid = qp.qid();
    let ns = c.namespace(1).unwrap().clone();
    let (sq0, _) = m.doorbell_writes(qid);
    for i in 0..16u64 {
        let data = pattern(i, 512);
        let buf = buffer_with(&c, &data);
        qp.queue(
            IoCommand::Write {
                ns: &ns,
                slba: i,
                blocks: 1,
            },
            Some(buf),
            i,
        )
        .unwrap();
    }
    // Nothing announced yet: the device has not seen a thing.
    assert_eq!(m.doorbell_writes(qid).0, sq0);
    assert_eq!(m.allocated_blocks(1), 0);
    qp.ring();
    assert_eq!(m.doorbell_writes(qid).0, sq0 + 1, "one SQ doorbell for 16");
    assert_eq!(m.sq_state(qid).unwrap().tail, 16);
    qp.ring(); // nothing new: no write
    assert_eq!(m.doorbell_writes(qid).0, sq0 + 1);
    let mut tags = Vec::new();
    qp.process_completions(u32::MAX, |_, c| {
        assert!(c.is_ok());
        tags.push(c.tag)
    })
    .unwrap();
    assert_eq!(tags, (0..16).collect::<Vec<_>>(), "in submission order");
    // process_completions announces queued commands itself.
    let buf = c.alloc_dma(512).unwrap();
    qp.queue(
        IoCommand::Read {
            ns: &ns,
            slba: 3,
            blocks: 1,
        },
        Some(buf),
        99,
    )
    .unwrap();
    let cpl = wait_one(&mut qp);
    assert_eq!(cpl.tag, 99);
    assert_eq!(read_back(&cpl.buffer.unwrap(), 512), pattern(3, 512));
    assert_eq!(m.doorbell_writes(qid).0, sq0 + 2);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn process_completions_caps_the_batch() {
    let (m, c) = setup(config_one_ns(512, 4096));
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    for i in 0..10u64 {
        let buf = c.alloc_dma(512).unwrap();
        qp.queue(
            IoCommand::Read {
                ns: &ns,
                slba: i,
                blocks: 1,
            },
            Some(buf),
            i,
        )
        .unwrap();
    }
    qp.ring();
    let mut seen = Vec::new();
    for want in [3u32, 3, 3, 3, 3] {
        let n = qp
            .process_completions(want, |_, c| seen.push(c.tag))
            .unwrap();
        assert!(n <= want);
    }
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    assert_eq!(
        qp.process_completions(3, |_, _| panic!("nothing left"))
            .unwrap(),
        0
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn drop_deletes_sq_then_cq_and_qids_are_reused() {
    let (m, c) = setup(ModelConfig {
        max_ioqpairs: 2,
        ..Default::default()
    });
    let a = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let b = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    assert_eq!((a.qid(), b.qid()), (1, 2));
    // Interrupts disabled on both completion queues.
    assert_eq!(m.cq_interrupts_enabled(1), Some(false));
    assert_eq!(m.cq_interrupts_enabled(2), Some(false));
    assert_eq!(m.sq_state(1).unwrap().cqid, 1);
    match c.io_queue_pair(QueuePairOptions::default()) {
        Err(e @ Error::NoQueuesLeft { granted: 2, .. }) => {
            assert!(e.to_string().contains("drop a queue pair"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    let seen = m.commands_seen().len();
    drop(a);
    let after: Vec<(u8, u16)> = m.commands_seen()[seen..]
        .iter()
        .map(|&(q, op, _)| (op, q))
        .collect();
    assert_eq!(
        after,
        vec![(admin_op::DELETE_IO_SQ, 0), (admin_op::DELETE_IO_CQ, 0)]
    );
    assert!(!m.queue_exists(1));
    assert!(m.queue_exists(2));
    // qid 1 is reused, and works.
    let mut a = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    assert_eq!(a.qid(), 1);
    let buf = c.alloc_dma(4096).unwrap();
    a.write_blocking(c.namespace(1).unwrap(), 0, 1, buf, T)
        .unwrap();
    drop(b);
    drop(a);
    assert!(!m.queue_exists(1) && !m.queue_exists(2));
    drop(c);
    assert_clean(&m);
}

#[test]
fn reused_qid_starts_fresh_with_shadow_doorbells() {
    let (m, c) = setup(config_one_ns(512, 4096));
    assert!(c.shadow_doorbells());
    let ns = c.namespace(1).unwrap().clone();
    for round in 0..3u64 {
        let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
        assert_eq!(qp.qid(), 1);
        // Leave the rings at odd positions before dropping.
        for i in 0..(5 + round) {
            let data = pattern(round * 100 + i, 512);
            let buf = buffer_with(&c, &data);
            qp.write_blocking(&ns, i, 1, buf, T).unwrap();
            assert_eq!(m.namespace_data(1, i, 1), data);
        }
    }
    drop(c);
    assert_clean(&m);
}

#[test]
fn drop_with_commands_in_flight_is_clean() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let qid = qp.qid();
    let ns = c.namespace(1).unwrap().clone();
    let next = m.commands_fetched();
    m.inject(Fault::DelayCompletion {
        on: Match::Nth(next),
        doorbells: None,
    });
    m.inject(Fault::DropCompletion(Match::Nth(next + 1)));
    for tag in 0..3 {
        let buf = c.alloc_dma(4096).unwrap();
        qp.submit(
            IoCommand::Read {
                ns: &ns,
                slba: tag,
                blocks: 1,
            },
            Some(buf),
            tag,
        )
        .unwrap();
    }
    assert_eq!(m.delayed_completions(), 1);
    assert_eq!(m.dropped_completions().len(), 1);
    // Delete SQ aborts the delayed command (its completion is posted into
    // the CQ, which still exists) and forgets the lost one; then Delete CQ.
    drop(qp);
    assert!(!m.queue_exists(qid));
    assert_eq!(m.delayed_completions(), 0);
    assert!(c.failure().is_none());
    drop(c);
    assert_clean(&m);
}

#[test]
fn queue_pairs_on_their_own_threads() {
    let (m, c) = setup(ModelConfig {
        namespaces: vec![
            NamespaceConfig {
                nsid: 1,
                lba_size: 512,
                blocks: 8192,
                ..NamespaceConfig::default()
            },
            NamespaceConfig {
                nsid: 2,
                lba_size: 4096,
                blocks: 1024,
                ..NamespaceConfig::default()
            },
        ],
        ..Default::default()
    });
    let c: &Controller<ModelController> = &c;
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
            s.spawn(move || {
                let nsid = 1 + (t % 2) as u32;
                let ns = c.namespace(nsid).unwrap().clone();
                let lba = if nsid == 1 { 512 } else { 4096 };
                for i in 0..50u64 {
                    let slba = t * 100 + i;
                    let data = pattern(t << 32 | i, lba);
                    let buf = buffer_with(c, &data);
                    let buf = qp.write_blocking(&ns, slba, 1, buf, T).unwrap();
                    buf.fill(0, lba, 0).unwrap();
                    let buf = qp.read_blocking(&ns, slba, 1, buf, T).unwrap();
                    assert_eq!(read_back(&buf, lba), data);
                }
                assert_eq!(qp.stats().completions, 100);
            });
        }
    });
    assert!(c.failure().is_none());
    assert_clean(&m);
}

/// Each controller has its own IOMMU mapping, and two of them hand out the
/// same IOVAs: a buffer of one, submitted on a pair of the other, would
/// make that device read or write whatever it has at the address (another
/// buffer, its rings). The pair refuses it before the device sees it.
#[test]
fn a_buffer_of_another_controller_is_refused() {
    let (m1, c1) = setup(config_one_ns(512, 64));
    let (m2, c2) = setup(config_one_ns(512, 64));
    let ns2 = c2.namespace(1).unwrap().clone();
    m2.write_namespace_data(1, 0, &pattern(7, 4096));
    // The same allocations on both: the same IOVAs.
    let b1 = c1.alloc_dma(4096).unwrap();
    let b2 = c2.alloc_dma(4096).unwrap();
    assert_eq!(b1.iova(), b2.iova(), "the two mappings use the same IOVAs");
    let mut qp2 = c2.io_queue_pair(QueuePairOptions::default()).unwrap();
    assert_ne!(b1.domain(), b2.domain());
    let fetched = m2.commands_fetched();
    // The plain path hands it to the general path, which says why.
    let f = qp2.read_blocking(&ns2, 0, 8, b1, T).unwrap_err();
    assert!(
        f.error
            .to_string()
            .contains("mapped for another controller"),
        "{}",
        f.error
    );
    let b1 = f.buffer.expect("the refused buffer comes back");
    let read8 = IoCommand::Read {
        ns: &ns2,
        slba: 0,
        blocks: 8,
    };
    let r = qp2.submit_io(read8, IoData::buffer(b1), 1).unwrap_err();
    assert_eq!(r.reason, Reject::ForeignBuffer);
    // A vector with one foreign segment.
    let mut v = upnvme::IoVec::new();
    v.push(c2.alloc_dma(4096).unwrap(), 0, 2048).unwrap();
    v.push(r.buffer.unwrap(), 0, 2048).unwrap();
    let r = qp2.submit_io(read8, IoData::vectored(v), 1).unwrap_err();
    assert_eq!(r.reason, Reject::ForeignBuffer);
    assert!(r.segments.is_some(), "the vector comes back");
    assert_eq!(m2.commands_fetched(), fetched, "nothing reached the device");
    assert_eq!(
        read_back(&b2, 4096),
        vec![0; 4096],
        "the other buffer is untouched"
    );
    // Its own buffers work.
    let got = qp2.read_blocking(&ns2, 0, 8, b2, T).unwrap();
    assert_eq!(read_back(&got, 4096), pattern(7, 4096));
    drop(qp2);
    assert_clean(&m1);
    assert_clean(&m2);
}
