//! Guest tests of the I/O queue pairs against QEMU's controller: data verified
//! byte for byte, every command kind, batching, back-pressure, queue limits.

use std::collections::HashMap;
use std::time::Duration;

use upnvme::{
    Completion, Controller, ControllerOptions, CqHeadPolicy, DsmRange, Error, IoCommand, Namespace,
    QueuePairOptions, Reject, SqAnnounce,
};

const T: Duration = Duration::from_secs(10);

fn devices() -> Vec<String> {
    std::env::var("UPNVME_VM_DEVICES")
        .expect("UPNVME_VM_DEVICES not set: run inside `cargo xtask vm`")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn open() -> Controller {
    Controller::open(&devices()[0], ControllerOptions::default()).unwrap()
}

/// A controller with shadow doorbells (Doorbell Buffer Config, which QEMU's
/// controller offers; off by default): for the tests of the EventIdx and the
/// announcement modes, and of the pair option that turns the EventIdx off.
fn open_with_doorbell_buffer() -> Controller {
    let c = Controller::open(
        &devices()[0],
        ControllerOptions {
            shadow_doorbells: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(c.shadow_doorbells());
    c
}

/// The CQ head policies the integrity tests run under: adaptive moderation
/// (the default), moderation off (one write per reap batch), and adaptive with
/// a small batch limit.
const POLICIES: [CqHeadPolicy; 3] = [
    CqHeadPolicy::Adaptive { batch: 0 },
    CqHeadPolicy::EveryReap,
    CqHeadPolicy::Adaptive { batch: 5 },
];

/// `n` queue entries, or CAP.MQES + 1 when the controller allows fewer
/// (the small-queues configuration runs with `--mqes 16`).
fn entries(c: &Controller, n: u32) -> u32 {
    n.min(c.cap().max_queue_entries())
}

/// A deterministic pattern for (lba, byte offset, seed).
fn pattern(seed: u64, lba: u64, len: usize) -> Vec<u8> {
    let mut x = seed ^ (lba.wrapping_mul(0x9e37_79b9_7f4a_7c15)) ^ 0x2545_f491_4f6c_dd1d;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn hello_world_round_trip() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let buf = c.alloc_dma(lba).unwrap();
    buf.write_bytes(0, b"Hello world!\n").unwrap();
    let buf = qp.write_blocking(&ns, 0, 1, buf, T).unwrap();
    buf.fill(0, buf.len(), 0xaa).unwrap();
    let buf = qp.read_blocking(&ns, 0, 1, buf, T).unwrap();
    let mut back = [0u8; 13];
    buf.read_bytes(0, &mut back).unwrap();
    assert_eq!(&back, b"Hello world!\n");
    let s = qp.stats();
    assert_eq!(s.submissions, 2);
    assert_eq!(s.completions, 2);
}

/// Writes then reads back many transfers of mixed sizes (1 block up to MDTS,
/// exercising one-page, two-page and PRP-list transfers) at depth.
#[test]
fn verified_mixed_sizes_at_depth() {
    let c = open();
    for (i, policy) in POLICIES.into_iter().enumerate() {
        verified_mixed_sizes_with(&c, policy, 0x1000 * i as u64);
    }
}

fn verified_mixed_sizes_with(c: &Controller, policy: CqHeadPolicy, seed_base: u64) {
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            cq_head_policy: policy,
            ..Default::default()
        })
        .unwrap();
    let max_blocks = (qp.max_transfer() / lba) as u32;
    let sizes: Vec<u32> = [1, 2, 3, 8, 9, 16, 31, 64, 100, max_blocks]
        .into_iter()
        .filter(|&b| b >= 1 && b <= max_blocks)
        .collect();
    // Lay the transfers out back to back.
    let mut layout = Vec::new();
    let mut lba_next = 16u64;
    for round in 0..6 {
        for &b in &sizes {
            if lba_next + b as u64 > ns.lba_count() {
                lba_next = 16;
            }
            layout.push((lba_next, b, seed_base + round as u64));
            lba_next += b as u64;
        }
    }
    let depth = 16usize.min(qp.max_depth() as usize);
    // Write phase.
    let mut expected: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut i = 0;
    let mut inflight = 0;
    let mut done = Vec::new();
    while i < layout.len() || inflight > 0 {
        while inflight < depth && i < layout.len() {
            let (slba, b, seed) = layout[i];
            let data = pattern(seed, slba, b as usize * lba);
            let buf = c.alloc_dma(data.len()).unwrap();
            buf.write_bytes(0, &data).unwrap();
            expected.insert(slba, data);
            qp.submit(
                IoCommand::Write {
                    ns: &ns,
                    slba,
                    blocks: b,
                },
                Some(buf),
                i as u64,
            )
            .unwrap();
            inflight += 1;
            i += 1;
        }
        qp.process_completions(64, |_, cpl: Completion| {
            assert!(cpl.is_ok(), "write {} failed: {:?}", cpl.tag, cpl.result);
            done.push(cpl.tag);
            inflight -= 1;
        })
        .unwrap();
    }
    done.sort();
    assert_eq!(
        done,
        (0..layout.len() as u64).collect::<Vec<_>>(),
        "each write completes exactly once"
    );
    // Read phase, verify byte for byte (the later writes to an LBA win, and
    // the layout never overlaps within one pass of `sizes` but may across
    // rounds; `expected` keeps the last data per starting LBA, so compare
    // only the final round's extents).
    let last_round = seed_base + 5;
    let mut mismatches = 0;
    for &(slba, b, seed) in layout.iter().filter(|l| l.2 == last_round) {
        let buf = c.alloc_dma(b as usize * lba).unwrap();
        let buf = qp.read_blocking(&ns, slba, b, buf, T).unwrap();
        let got = buf.to_vec();
        if got[..b as usize * lba] != pattern(seed, slba, b as usize * lba)[..] {
            mismatches += 1;
        }
    }
    assert_eq!(mismatches, 0, "with {policy:?}");
}

#[test]
fn unaligned_buffers_are_not_possible_and_prp_lists_work_at_mdts() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let max = qp.max_transfer();
    let blocks = (max / lba) as u32;
    let data = pattern(7, 100, max);
    let buf = c.alloc_dma(max).unwrap();
    buf.write_bytes(0, &data).unwrap();
    qp.write_blocking(&ns, 100, blocks, buf, T).unwrap();
    let buf = c.alloc_dma(max).unwrap();
    let buf = qp.read_blocking(&ns, 100, blocks, buf, T).unwrap();
    assert!(
        buf.to_vec() == data,
        "MDTS-sized transfer through a PRP list"
    );
    // One block more than MDTS goes as two commands.
    let data = pattern(8, 300, max + lba);
    let buf = c.alloc_dma(max + lba).unwrap();
    buf.write_bytes(0, &data).unwrap();
    qp.write_blocking(&ns, 300, blocks + 1, buf, T).unwrap();
    let buf = qp
        .read_blocking(&ns, 300, blocks + 1, c.alloc_dma(max + lba).unwrap(), T)
        .unwrap();
    assert!(
        buf.to_vec()[..data.len()] == data[..],
        "MDTS + 1 block, split"
    );
}

/// Transfers above MDTS (split.rs): written and read back byte exact through
/// QEMU, as PRP Lists and as SGLs, from a slice at an offset, with one
/// completion each; the IOMMU fault count (checked by the harness) says
/// every piece's DMA stayed inside its buffer.
#[test]
fn transfers_above_mdts_are_split_and_byte_exact() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    for (i, sgl) in [upnvme::SglMode::Never, upnvme::SglMode::Auto]
        .into_iter()
        .enumerate()
    {
        let mut qp = c
            .io_queue_pair(QueuePairOptions {
                sgl,
                ..Default::default()
            })
            .unwrap();
        let max = qp.max_transfer();
        let len = 3 * max + 5 * lba;
        let blocks = (len / lba) as u32;
        let slba = 1000 + i as u64 * u64::from(blocks);
        let data = pattern(9 + i as u64, slba, len);
        // From 2 blocks into a larger buffer.
        let off = 2 * lba;
        let wbuf = c.alloc_dma(len + 4 * lba).unwrap();
        wbuf.write_bytes(off, &data).unwrap();
        let before = qp.stats();
        qp.submit_io(
            IoCommand::Write {
                ns: &ns,
                slba,
                blocks,
            },
            upnvme::IoData::slice(wbuf, off, len),
            1,
        )
        .unwrap();
        let mut done: Vec<Completion> = Vec::new();
        for _ in 0..10_000_000 {
            if !done.is_empty() {
                break;
            }
            qp.process_completions(u32::MAX, |_, c| done.push(c))
                .unwrap();
        }
        assert_eq!(done.len(), 1, "one completion for the whole write");
        assert!(done[0].is_ok(), "{:?}", done[0].result);
        let after = qp.stats();
        assert_eq!(after.completions - before.completions, 4, "four commands");
        let rbuf = qp
            .read_blocking(&ns, slba, blocks, c.alloc_dma(len).unwrap(), T)
            .unwrap();
        assert!(rbuf.to_vec()[..len] == data[..], "{sgl:?}: byte exact");
    }
}

#[test]
fn every_command_kind() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let data = pattern(3, 500, 4 * lba);
    let buf = c.alloc_dma(4 * lba).unwrap();
    buf.write_bytes(0, &data).unwrap();
    let buf = qp.write_blocking(&ns, 500, 4, buf, T).unwrap();
    // Compare equal data: success; different: Compare Failure.
    let buf = qp
        .execute_blocking(
            IoCommand::Compare {
                ns: &ns,
                slba: 500,
                blocks: 4,
            },
            Some(buf),
            T,
        )
        .unwrap()
        .unwrap();
    buf.write_bytes(0, &[!data[0]]).unwrap();
    let e = qp
        .execute_blocking(
            IoCommand::Compare {
                ns: &ns,
                slba: 500,
                blocks: 4,
            },
            Some(buf),
            T,
        )
        .unwrap_err();
    assert!(e.to_string().contains("Compare Failure"), "{e}");
    let buf = e.buffer.expect("buffer back after an error status");
    // Flush.
    qp.execute_blocking(IoCommand::Flush { ns: &ns }, None, T)
        .unwrap();
    // Write Zeroes: the blocks read back as zeroes.
    qp.execute_blocking(
        IoCommand::WriteZeroes {
            ns: &ns,
            slba: 500,
            blocks: 2,
            deallocate: false,
        },
        None,
        T,
    )
    .unwrap();
    let buf = qp.read_blocking(&ns, 500, 4, buf, T).unwrap();
    let got = buf.to_vec();
    assert!(got[..2 * lba].iter().all(|&b| b == 0), "write zeroes");
    assert_eq!(
        &got[2 * lba..4 * lba],
        &data[2 * lba..4 * lba],
        "blocks after the zeroed range untouched"
    );
    // Deallocate (DSM): completes successfully; QEMU reads deallocated blocks as zeroes.
    let ranges = [
        DsmRange {
            cattr: 0,
            nlb: 2,
            slba: 502,
        },
        DsmRange {
            cattr: 0,
            nlb: 1,
            slba: 700,
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
    // Out-of-range LBAs and absent namespaces are refused before any I/O.
    let e = qp
        .submit(
            IoCommand::Read {
                ns: &ns,
                slba: ns.lba_count(),
                blocks: 1,
            },
            Some(buf),
            0,
        )
        .unwrap_err();
    assert_eq!(e.reason, Reject::LbaRange, "{e}");
    assert!(e.to_string().contains("outside the namespace"), "{e}");
    // An absent namespace has no handle to put in a command...
    let absent = c.namespace(99).unwrap_err();
    assert!(
        matches!(absent, Error::NoSuchNamespace { nsid: 99, .. }),
        "{absent}"
    );
    // ...and a handle this controller did not hand out (NSID 99) is refused,
    // buffer back.
    let stray = Namespace::from_identify(99, ns.identify().clone()).expect("a usable LBA format");
    let e = qp
        .submit(
            IoCommand::Read {
                ns: &stray,
                slba: 0,
                blocks: 1,
            },
            e.buffer,
            0,
        )
        .unwrap_err();
    assert_eq!(e.reason, Reject::ForeignNamespace, "{e}");
    assert!(e.buffer.is_some());
}

/// QEMU's controller reports the NVM Command Set's size limits (Identify
/// CNS 06h, CSI 00h: VSL 7 by default, a DMRSL from its block layer's
/// request limit); the driver reads them at bring-up, and a Deallocate
/// within DMRSL runs. (Beyond it QEMU skips the range and still reports
/// success; the driver cuts such a range into ranges within DMRSL,
/// `split.rs` on the host: the bed's disk is smaller than QEMU's DMRSL.)
#[test]
fn the_controllers_nvm_size_limits_are_read_at_bring_up() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let l = c.nvm_limits();
    assert_ne!(l.vsl, 0, "{l:?}");
    assert_ne!(l.dmrsl, 0, "{l:?}");
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let nlb = l.dmrsl.min(8);
    let ranges = [DsmRange {
        cattr: 0,
        nlb,
        slba: 0,
    }];
    qp.execute_blocking(
        IoCommand::Deallocate {
            ns: &ns,
            ranges: &ranges,
        },
        None,
        T,
    )
    .unwrap_or_else(|e| panic!("Deallocate of {nlb} blocks: {e}"));
}

/// QEMU 10.0.2 executes Verify but leaves ONCS bit 7 clear: the typed
/// command is refused as unsupported (nothing sent), and docs/io.md's way
/// around it — a raw SQE with opcode 0Ch — completes with success. (On a
/// QEMU that sets the bit, the typed command completes too.)
#[test]
fn verify_is_refused_without_oncs_bit_7_and_goes_raw() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let typed = IoCommand::Verify {
        ns: &ns,
        slba: 0,
        blocks: 8,
    };
    if c.identify().oncs & (1 << 7) == 0 {
        let r = qp.submit(typed, None, 1).unwrap_err();
        assert_eq!(r.reason, Reject::Unsupported { command: "Verify" });
    } else {
        qp.execute_blocking(typed, None, T).unwrap();
    }
    let mut sqe = upnvme::Sqe::default();
    sqe.set_opcode(0x0c);
    sqe.set_nsid(ns.id());
    sqe.set_cdw(12, 8 - 1); // NLB, 0-based; SLBA (CDW10-11) 0
    let raw = IoCommand::Raw {
        ns: &ns,
        sqe: &sqe,
        data_len: 0,
    };
    qp.execute_blocking(raw, None, T)
        .unwrap_or_else(|e| panic!("raw Verify: {e}"));
}

#[test]
fn batch_submit_rings_once_and_full_queue_pushes_back() {
    let c = open_with_doorbell_buffer();
    for (event_idx, announce) in [
        (false, SqAnnounce::Batch),
        (true, SqAnnounce::Batch),
        (true, SqAnnounce::EachCommand),
        // The default: never 32 deep on this 8-entry pair, so per batch.
        (true, SqAnnounce::DEEP),
        (true, SqAnnounce::WhenDeep { in_flight: 4 }),
    ] {
        batch_with(&c, event_idx, announce);
    }
}

/// Seven queued reads, an eighth refused with its buffer, one `ring`. With
/// MMIO doorbells (`event_idx` off) the batch costs one SQ tail write at
/// `ring`; with the EventIdx in use and the default `SqAnnounce::Batch`,
/// one shadow update at `ring` (over MMIO too when QEMU asks: at most one);
/// with `SqAnnounce::EachCommand` `queue` announced each command already
/// (shadow update and EventIdx check, MMIO only when QEMU asked for it) and
/// `ring` has nothing left; with `SqAnnounce::WhenDeep { in_flight: 4 }` the
/// fourth to seventh are announced at `queue` (the fourth's update covers
/// the first three) and `ring` has nothing left either.
fn batch_with(c: &Controller, event_idx: bool, announce: SqAnnounce) {
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(8),
            cq_entries: Some(16),
            shadow_doorbells: event_idx,
            sq_announce: announce,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(qp.max_depth(), 7);
    for i in 0..7u64 {
        let b = c.alloc_dma(lba).unwrap();
        qp.queue(
            IoCommand::Read {
                ns: &ns,
                slba: i,
                blocks: 1,
            },
            Some(b),
            i,
        )
        .unwrap();
    }
    // The eighth is refused at once, buffer returned.
    let b = c.alloc_dma(lba).unwrap();
    let e = qp
        .queue(
            IoCommand::Read {
                ns: &ns,
                slba: 0,
                blocks: 1,
            },
            Some(b),
            99,
        )
        .unwrap_err();
    assert!(
        matches!(qp.describe(e.reason), Error::QueueFull { .. }),
        "{e}"
    );
    assert!(e.buffer.is_some());
    let before = qp.stats();
    qp.ring();
    let after = qp.stats();
    assert_eq!(after.submissions - before.submissions, 7);
    let mmio = after.sq_doorbell_mmio - before.sq_doorbell_mmio;
    // Announced at `queue`: every command from this depth on (1: all).
    let from = match (event_idx, announce) {
        (true, SqAnnounce::EachCommand) => Some(1),
        (true, SqAnnounce::WhenDeep { in_flight }) if in_flight <= 7 => Some(in_flight.max(1)),
        _ => None,
    };
    if let Some(from) = from {
        assert!(qp.shadow_doorbells());
        assert_eq!(
            before.sq_shadow_updates,
            7 - u64::from(from) + 1,
            "{announce:?}: {before:?}"
        );
        assert!(before.sq_doorbell_mmio <= 7, "{before:?}");
        assert_eq!(
            after,
            before_with_submissions(before, 7),
            "ring had nothing left"
        );
    } else if event_idx {
        assert!(qp.shadow_doorbells());
        assert_eq!(
            (before.sq_shadow_updates, before.sq_doorbell_mmio),
            (0, 0),
            "nothing before ring: {before:?}"
        );
        assert_eq!(after.sq_shadow_updates, 1, "one shadow update: {after:?}");
        assert_eq!(
            mmio + after.mmio_skipped_by_event_idx - before.mmio_skipped_by_event_idx,
            1,
            "written over MMIO or skipped by the EventIdx: {after:?}"
        );
    } else {
        assert_eq!(
            before.sq_doorbell_mmio, 0,
            "nothing before ring: {before:?}"
        );
        assert_eq!(mmio, 1, "one SQ doorbell write for the batch");
    }
    let mut got = Vec::new();
    let start = std::time::Instant::now();
    while got.len() < 7 && start.elapsed() < T {
        qp.process_completions(3, |_, c| got.push(c.tag)).unwrap();
    }
    got.sort();
    assert_eq!(got, (0..7).collect::<Vec<_>>());
}

/// `s` with `n` more submissions counted (what `ring` adds when it has no
/// doorbell left to write).
fn before_with_submissions(mut s: upnvme::QueueStats, n: u64) -> upnvme::QueueStats {
    s.submissions += n;
    s
}

#[test]
fn cq_head_policies_and_reap_on_submit_all_complete_everything() {
    let c = open_with_doorbell_buffer();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    for (policy, reap, shadow) in [
        (CqHeadPolicy::Adaptive { batch: 0 }, false, true),
        (CqHeadPolicy::Adaptive { batch: 0 }, false, false),
        (CqHeadPolicy::Adaptive { batch: 4 }, true, false),
        (CqHeadPolicy::EveryReap, true, true),
    ] {
        let mut qp = c
            .io_queue_pair(QueuePairOptions {
                entries: Some(entries(&c, 16)),
                cq_entries: Some(entries(&c, 20)),
                cq_head_policy: policy,
                reap_on_submit: reap,
                shadow_doorbells: shadow,
                ..Default::default()
            })
            .unwrap();
        let mut bufs: Vec<_> = (0..8).map(|_| c.alloc_dma(lba).unwrap()).collect();
        let mut completed = 0u64;
        let mut submitted = 0u64;
        let total = 600u64;
        let start = std::time::Instant::now();
        while completed < total {
            assert!(
                start.elapsed() < T * 3,
                "stalled at {completed}/{total} with {policy:?}"
            );
            while submitted < total
                && let Some(b) = bufs.pop()
            {
                qp.submit(
                    IoCommand::Read {
                        ns: &ns,
                        slba: submitted % 64,
                        blocks: 1,
                    },
                    Some(b),
                    submitted,
                )
                .unwrap();
                submitted += 1;
            }
            qp.process_completions(u32::MAX, |_, cpl| {
                assert!(cpl.is_ok());
                bufs.push(cpl.buffer.unwrap());
                completed += 1;
            })
            .unwrap();
        }
        let s = qp.stats();
        assert_eq!(s.completions, total);
        eprintln!("{policy:?} reap_on_submit={reap} shadow={shadow}: {s:?}");
        if policy == (CqHeadPolicy::Adaptive { batch: 0 }) {
            assert!(
                s.cq_doorbell_mmio < total / 2,
                "adaptive moderation writes the CQ head rarely: {s:?}"
            );
        }
    }
}

#[test]
fn queue_pairs_are_limited_by_what_was_granted() {
    let c = Controller::open(
        &devices()[0],
        ControllerOptions {
            io_queues: 3,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(c.granted_io_queues(), 3);
    let pairs: Vec<_> = (0..3)
        .map(|_| c.io_queue_pair(QueuePairOptions::default()).unwrap())
        .collect();
    let e = c.io_queue_pair(QueuePairOptions::default()).unwrap_err();
    assert!(matches!(e, Error::NoQueuesLeft { granted: 3, .. }), "{e}");
    drop(pairs);
    // Dropping deleted the queues: the IDs can be used again.
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    qp.read_blocking(&ns, 0, 1, c.alloc_dma(lba).unwrap(), T)
        .unwrap();
    // Entries beyond CAP.MQES+1 are refused.
    let mqes = c.cap().max_queue_entries();
    let e = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(mqes + 1),
            ..Default::default()
        })
        .unwrap_err();
    assert!(e.to_string().contains("CAP.MQES"), "{e}");
}

#[test]
fn queue_pairs_work_from_several_threads() {
    let c = std::sync::Arc::new(open());
    let lba = c.namespace(1).unwrap().lba_size() as usize;
    let handles: Vec<_> = (0..2u64)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let ns = c.namespace(1).unwrap().clone();
                let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
                for i in 0..50u64 {
                    let slba = 1000 + t * 100 + i;
                    let data = pattern(t, slba, lba);
                    let b = c.alloc_dma(lba).unwrap();
                    b.write_bytes(0, &data).unwrap();
                    let b = qp.write_blocking(&ns, slba, 1, b, T).unwrap();
                    b.fill(0, lba, 0).unwrap();
                    let b = qp.read_blocking(&ns, slba, 1, b, T).unwrap();
                    assert!(b.to_vec()[..lba] == data[..]);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// Each namespace of each controller gets its own data; nothing leaks across.
#[test]
fn io_to_several_namespaces() {
    for dev in devices() {
        let c = Controller::open(&dev, ControllerOptions::default()).unwrap();
        let nss: Vec<_> = c.namespaces().to_vec();
        let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
        // Same LBA on every namespace, different data.
        for ns in &nss {
            let lba = ns.lba_size() as usize;
            let data = pattern(ns.id() as u64 * 1000, 42, 4 * lba);
            let b = c.alloc_dma(4 * lba).unwrap();
            b.write_bytes(0, &data).unwrap();
            qp.write_blocking(ns, 42, 4, b, T).unwrap();
        }
        for ns in &nss {
            let lba = ns.lba_size() as usize;
            let b = qp
                .read_blocking(ns, 42, 4, c.alloc_dma(4 * lba).unwrap(), T)
                .unwrap();
            assert!(
                b.to_vec()[..4 * lba] == pattern(ns.id() as u64 * 1000, 42, 4 * lba)[..],
                "namespace {} on {dev}",
                ns.id()
            );
        }
        drop(qp);
        c.close().unwrap();
    }
}

/// Write Zeroes and Deallocate read back as the namespace says (DLFEAT bits
/// 2:0: 001b = deallocated blocks read as zeroes, 010b = as ones).
#[test]
fn write_zeroes_and_deallocate_read_back_as_dlfeat_says() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let fill = |qp: &mut upnvme::IoQueuePair, slba: u64| {
        let b = c.alloc_dma(8 * lba).unwrap();
        b.fill(0, 8 * lba, 0x5a).unwrap();
        qp.write_blocking(&ns, slba, 8, b, T).unwrap();
    };
    let read = |qp: &mut upnvme::IoQueuePair, slba: u64| -> Vec<u8> {
        let b = qp
            .read_blocking(&ns, slba, 8, c.alloc_dma(8 * lba).unwrap(), T)
            .unwrap();
        b.to_vec()[..8 * lba].to_vec()
    };
    fill(&mut qp, 2000);
    qp.execute_blocking(
        IoCommand::WriteZeroes {
            ns: &ns,
            slba: 2000,
            blocks: 8,
            deallocate: true,
        },
        None,
        T,
    )
    .unwrap();
    assert!(
        read(&mut qp, 2000).iter().all(|&b| b == 0),
        "Write Zeroes reads back zeroes"
    );
    fill(&mut qp, 3000);
    let ranges = [DsmRange {
        cattr: 0,
        nlb: 8,
        slba: 3000,
    }];
    qp.execute_blocking(
        IoCommand::Deallocate {
            ns: &ns,
            ranges: &ranges,
        },
        None,
        T,
    )
    .unwrap();
    // Deallocate is advisory (NVMe 2.0, Dataset Management: the controller
    // "may" deallocate; QEMU ignores it when its drive has no discard=unmap):
    // each block reads back either as before or as DLFEAT says.
    let got = read(&mut qp, 3000);
    let dealloc_value = match ns.identify().dlfeat_read_value() {
        1 => Some(0u8),
        2 => Some(0xff),
        _ => None,
    };
    for (i, block) in got.chunks(lba).enumerate() {
        let kept = block.iter().all(|&b| b == 0x5a);
        let deallocated = dealloc_value.is_some_and(|v| block.iter().all(|&b| b == v));
        assert!(
            kept || deallocated,
            "block {i} after Deallocate is neither the old data nor the DLFEAT value"
        );
    }
}

/// A Deallocate of 600 ranges (CDW10.NR holds 256) goes to QEMU as three
/// Dataset Management commands (driver/src/qpair/split.rs) and completes
/// once; every listed block reads back as before or as DLFEAT says (the
/// deallocation is advisory), and every block between them keeps its data.
#[test]
fn a_deallocate_of_600_ranges_goes_as_three_commands_and_completes_once() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let (start, blocks) = (4000u64, 1200usize);
    let data: Vec<u8> = (0..blocks * lba).map(|i| (i / lba) as u8 | 1).collect();
    // In pieces of 100 blocks: one command each on every configuration
    // (the small-queue one splits less deep).
    let chunk = 100usize;
    let mut b = c.alloc_dma(chunk * lba).unwrap();
    for (i, d) in data.chunks(chunk * lba).enumerate() {
        b.write_bytes(0, d).unwrap();
        let slba = start + (i * chunk) as u64;
        b = qp.write_blocking(&ns, slba, chunk as u32, b, T).unwrap();
    }
    let ranges: Vec<DsmRange> = (0..600)
        .map(|i| DsmRange {
            cattr: 0,
            nlb: 1,
            slba: start + 2 * i,
        })
        .collect();
    let before = qp.stats().submissions;
    qp.execute_blocking(
        IoCommand::Deallocate {
            ns: &ns,
            ranges: &ranges,
        },
        None,
        T,
    )
    .unwrap();
    assert_eq!(qp.stats().submissions - before, 3, "three commands");
    let mut got = Vec::with_capacity(blocks * lba);
    for i in 0..blocks / chunk {
        let slba = start + (i * chunk) as u64;
        b = qp.read_blocking(&ns, slba, chunk as u32, b, T).unwrap();
        got.extend_from_slice(&b.to_vec()[..chunk * lba]);
    }
    let dealloc_value = match ns.identify().dlfeat_read_value() {
        1 => Some(0u8),
        2 => Some(0xff),
        _ => None,
    };
    for (i, block) in got[..blocks * lba].chunks(lba).enumerate() {
        let kept = block == &data[i * lba..(i + 1) * lba];
        if i % 2 == 1 {
            assert!(kept, "block {i} between the ranges changed");
        } else {
            let deallocated = dealloc_value.is_some_and(|v| block.iter().all(|&x| x == v));
            assert!(
                kept || deallocated,
                "block {i} after Deallocate is neither the old data nor the DLFEAT value"
            );
        }
    }
}

/// Write Zeroes above the 65536 blocks of CDW12.NLB goes to QEMU as pieces
/// of at most 65536 (driver/src/qpair/split.rs) and completes once: the
/// blocks at the pieces' edges read back as zeroes, byte for byte, and their
/// neighbours outside the range keep their data. It needs a namespace of
/// more than 150,100 blocks: the lba512-every-reap configuration (256 MiB of
/// 512-byte blocks); on the 4 KiB configurations (65536 blocks) it says so
/// and returns.
#[test]
fn write_zeroes_above_65536_blocks_goes_as_pieces_and_reads_back_zeroes() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let (slba, blocks) = (20_000u64, 150_000u32);
    let end = slba + u64::from(blocks);
    if ns.lba_count() < end + 8 {
        eprintln!(
            "write_zeroes_above_65536_blocks: namespace of {} blocks, too small here",
            ns.lba_count()
        );
        return;
    }
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // Four blocks around each edge: the range's start and end, and where
    // the second and third pieces start.
    let edges = [slba - 2, slba + 65_536 - 2, slba + 131_072 - 2, end - 2];
    for &e in &edges {
        let b = c.alloc_dma(4 * lba).unwrap();
        b.write_bytes(0, &pattern(e, 77, 4 * lba)).unwrap();
        qp.write_blocking(&ns, e, 4, b, T).unwrap();
    }
    let before = qp.stats().submissions;
    qp.execute_blocking(
        IoCommand::WriteZeroes {
            ns: &ns,
            slba,
            blocks,
            deallocate: false,
        },
        None,
        T,
    )
    .unwrap();
    assert_eq!(qp.stats().submissions - before, 3, "three commands");
    for &e in &edges {
        let b = qp
            .read_blocking(&ns, e, 4, c.alloc_dma(4 * lba).unwrap(), T)
            .unwrap();
        let got = b.to_vec();
        let old = pattern(e, 77, 4 * lba);
        for i in 0..4usize {
            let at = e + i as u64;
            let block = &got[i * lba..(i + 1) * lba];
            if (slba..end).contains(&at) {
                assert!(block.iter().all(|&x| x == 0), "block {at} zeroed");
            } else {
                assert!(block == &old[i * lba..(i + 1) * lba], "block {at} kept");
            }
        }
    }
}

/// Integrity at every depth from 1 to the queue's maximum, with a per-run salt
/// and a per-pass stamp, through at least three wraps of the SQ and CQ — under
/// every CQ head policy (moderation on and off), with a 64/96-entry pair and
/// with the default sizes (both capped by CAP.MQES: the small-queues
/// configuration runs with `--mqes 16`).
#[test]
fn integrity_at_depths_up_to_the_queue_size() {
    let c = open();
    let salt = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut run = 0u64;
    for sizes in [Some((64, 96)), None] {
        for policy in POLICIES {
            let (sq, cq) = match sizes {
                Some((sq, cq)) => (Some(entries(&c, sq)), Some(entries(&c, cq))),
                None => (None, None),
            };
            let qp = c
                .io_queue_pair(QueuePairOptions {
                    entries: sq,
                    cq_entries: cq,
                    cq_head_policy: policy,
                    ..Default::default()
                })
                .unwrap();
            eprintln!(
                "integrity: SQ {} / CQ {} entries, {policy:?}",
                qp.sq_entries(),
                qp.cq_entries()
            );
            integrity_at_depths(&c, qp, salt ^ (run << 48));
            run += 1;
        }
    }
}

fn integrity_at_depths(c: &Controller, mut qp: upnvme::IoQueuePair, salt: u64) {
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let max = qp.max_depth() as usize;
    let mut depths: Vec<usize> = [1usize, 2, 7, 16, max]
        .into_iter()
        .filter(|&d| d <= max)
        .collect();
    depths.dedup();
    // At least three wraps of the SQ over all passes.
    let n = (256u64).max(4 * qp.sq_entries() as u64 / depths.len() as u64);
    let mut submitted_total = 0u64;
    for (pass, &depth) in depths.iter().enumerate() {
        let seed = salt ^ ((pass as u64) << 56);
        let mut bufs: Vec<_> = (0..depth).map(|_| c.alloc_dma(lba).unwrap()).collect();
        let mut next = 0u64;
        let mut done = 0u64;
        let start = std::time::Instant::now();
        while done < n {
            assert!(start.elapsed() < T * 3, "stalled at depth {depth}");
            while next < n
                && let Some(b) = bufs.pop()
            {
                b.write_bytes(0, &pattern(seed, next, lba)).unwrap();
                qp.submit(
                    IoCommand::Write {
                        ns: &ns,
                        slba: 5000 + next,
                        blocks: 1,
                    },
                    Some(b),
                    next,
                )
                .unwrap();
                next += 1;
            }
            qp.process_completions(u32::MAX, |_, cpl| {
                assert!(cpl.is_ok(), "{:?}", cpl.result);
                bufs.push(cpl.buffer.unwrap());
                done += 1;
            })
            .unwrap();
        }
        submitted_total += n;
        // Read back at the same depth.
        let mut bufs: Vec<_> = (0..depth).map(|_| c.alloc_dma(lba).unwrap()).collect();
        let (mut next, mut done, mut bad) = (0u64, 0u64, 0u64);
        while done < n {
            while next < n
                && let Some(b) = bufs.pop()
            {
                qp.submit(
                    IoCommand::Read {
                        ns: &ns,
                        slba: 5000 + next,
                        blocks: 1,
                    },
                    Some(b),
                    next,
                )
                .unwrap();
                next += 1;
            }
            qp.process_completions(u32::MAX, |_, cpl| {
                let b = cpl.buffer.unwrap();
                if b.to_vec()[..lba] != pattern(seed, cpl.tag, lba)[..] {
                    bad += 1;
                }
                bufs.push(b);
                done += 1;
            })
            .unwrap();
        }
        submitted_total += n;
        assert_eq!(bad, 0, "mismatches at depth {depth}");
    }
    let wraps = submitted_total / qp.sq_entries() as u64;
    assert!(wraps >= 3, "{wraps} SQ wraps");
    let s = qp.stats();
    assert_eq!(s.completions, submitted_total, "exactly once: {s:?}");
}

/// Closed loops in which the completion callback submits the next command
/// on the same pair (`process_completions(max, |qp, c| qp.submit(..))`), at
/// depth 1 and 32, mixing reads and writes, with buffers from a `DmaPool`,
/// every read verified byte for byte against the last write of its LBA; then
/// every LBA is read back once more. Also the lending form,
/// `next_completion`, at depth 1.
#[test]
fn completion_callbacks_resubmit_closed_loops() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let salt = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    for (round, depth) in [1u32, 32].into_iter().enumerate() {
        let mut qp = c
            .io_queue_pair(QueuePairOptions {
                entries: Some(entries(&c, 64)),
                cq_entries: Some(entries(&c, 128)),
                ..Default::default()
            })
            .unwrap();
        let depth = depth.min(qp.max_depth());
        let mut pool = c.dma_pool(lba, depth as usize).unwrap();
        // Each tag owns LBAS_PER_TAG blocks, so its commands never overlap
        // another tag's and its own run one at a time.
        const LBAS_PER_TAG: u64 = 8;
        let base = 20_000 + round as u64 * 1000;
        let seed = salt ^ ((round as u64) << 56);
        // version[lba]: the stamp of the last completed write (0: none yet).
        let mut version: HashMap<u64, u64> = HashMap::new();
        // In flight per tag: (lba, Some(version) for a write, None for a read).
        let mut pending: Vec<(u64, Option<u64>)> = vec![(0, None); depth as usize];
        let mut rng = seed | 1;
        let mut step = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let (mut done, mut bad, mut failed, mut reads, mut writes) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut next_version = 1u64;
        let total = 4000u64;
        // What the tag does next: write a new version, or read an LBA of its
        // own that was written (a write when none was yet).
        let mut plan = |tag: u64,
                        buf: &upnvme::DmaBuffer,
                        version: &HashMap<u64, u64>,
                        r: u64|
         -> (u64, Option<u64>) {
            let lba_no = base + tag * LBAS_PER_TAG + r % LBAS_PER_TAG;
            if r.is_multiple_of(3) || !version.contains_key(&lba_no) {
                let v = next_version;
                next_version += 1;
                buf.write_bytes(0, &pattern(seed ^ v, lba_no, lba)).unwrap();
                (lba_no, Some(v))
            } else {
                buf.fill(0, lba, 0xee).unwrap();
                (lba_no, None)
            }
        };
        fn cmd(ns: &Namespace, (slba, w): (u64, Option<u64>)) -> IoCommand<'_> {
            match w {
                Some(_) => IoCommand::Write {
                    ns,
                    slba,
                    blocks: 1,
                },
                None => IoCommand::Read {
                    ns,
                    slba,
                    blocks: 1,
                },
            }
        }
        for tag in 0..depth as u64 {
            let buf = pool.get().expect("the pool holds one buffer per tag");
            pending[tag as usize] = plan(tag, &buf, &version, step());
            qp.submit(cmd(&ns, pending[tag as usize]), Some(buf), tag)
                .unwrap();
        }
        let start = std::time::Instant::now();
        let mut in_flight = depth as u64;
        while in_flight > 0 {
            assert!(start.elapsed() < T * 3, "stalled at depth {depth}");
            let lending = depth == 1 && done % 2 == 1;
            let mut on_completion =
                |qp: &mut upnvme::IoQueuePair, cpl: Completion, ns: &Namespace| {
                    let tag = cpl.tag;
                    let buf = cpl.buffer.expect("the buffer comes back");
                    let (lba_no, w) = pending[tag as usize];
                    if cpl.result.is_err() {
                        failed += 1;
                    }
                    match w {
                        Some(v) => {
                            version.insert(lba_no, v);
                            writes += 1;
                        }
                        None => {
                            let v = version[&lba_no];
                            if buf.to_vec()[..lba] != pattern(seed ^ v, lba_no, lba)[..] {
                                bad += 1;
                            }
                            reads += 1;
                        }
                    }
                    done += 1;
                    if done + in_flight - 1 < total {
                        // The next command, from inside the completion.
                        pending[tag as usize] = plan(tag, &buf, &version, step());
                        qp.submit(cmd(ns, pending[tag as usize]), Some(buf), tag)
                            .expect("resubmitting from the callback");
                    } else {
                        in_flight -= 1;
                        pool.put(buf).expect("the buffer is the pool's");
                    }
                };
            if lending {
                // The lending form: the caller holds the pair between
                // completions.
                if let Some(cpl) = qp.next_completion().unwrap() {
                    on_completion(&mut qp, cpl, &ns);
                }
            } else {
                qp.process_completions(u32::MAX, |qp, cpl| on_completion(qp, cpl, &ns))
                    .unwrap();
            }
        }
        assert_eq!(failed, 0, "errors at depth {depth}");
        assert_eq!(bad, 0, "mismatches at depth {depth}");
        assert_eq!(done, total, "exactly once at depth {depth}");
        assert!(
            reads > 0 && writes > 0,
            "mixed: {reads} reads, {writes} writes"
        );
        assert_eq!(
            pool.available(),
            depth as usize,
            "every buffer back in the pool"
        );
        // Every LBA once more, through the blocking path.
        let mut buf = c.alloc_dma(lba).unwrap();
        for (&lba_no, &v) in &version {
            buf = qp.read_blocking(&ns, lba_no, 1, buf, T).unwrap();
            assert_eq!(
                buf.to_vec()[..lba],
                pattern(seed ^ v, lba_no, lba)[..],
                "LBA {lba_no} at depth {depth}"
            );
        }
        let s = qp.stats();
        assert_eq!(s.completions, total + version.len() as u64, "{s:?}");
        eprintln!(
            "callback loop: depth {depth}: {reads} reads + {writes} writes verified, {} LBAs re-read",
            version.len()
        );
    }
}

#[test]
fn close_hands_back_every_command_once_even_mid_flight() {
    let c = open();
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(entries(&c, 64)),
            ..Default::default()
        })
        .unwrap();
    let n = u64::from(qp.max_depth().min(32));
    for tag in 0..n {
        let buf = c.alloc_dma(lba).unwrap();
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
    // No wait at all: whatever the device has not completed is deleted with
    // the queues and still comes back, once, with its buffer.
    let mut got = qp.close(Duration::ZERO);
    got.sort_by_key(|c| c.tag);
    assert_eq!(
        got.iter().map(|c| c.tag).collect::<Vec<_>>(),
        (0..n).collect::<Vec<_>>()
    );
    for c in &got {
        assert!(c.buffer.is_some(), "tag {} without its buffer", c.tag);
        assert!(
            matches!(c.result, Ok(_) | Err(upnvme::IoError::QueueDeleted)),
            "tag {}: {:?}",
            c.tag,
            c.result
        );
    }
    // The controller is fine afterwards.
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    qp.read_blocking(&ns, 0, 1, c.alloc_dma(lba).unwrap(), T)
        .unwrap();
}
