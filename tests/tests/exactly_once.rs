//! Exactly-once completion and the CQ-full rule under random interleavings
//! (issues 4 and 8): a property test drives one queue pair with random
//! submit / queue / ring / process_completions(max) / blocking calls and
//! controller resets (what is in flight then ends once, with success or
//! `ControllerReset`, and the pair carries on), transfers above MDTS that
//! go as two commands and complete once (split.rs), random
//! SQ and CQ sizes 2..=64, shadow doorbells on and off (controller and pair),
//! `reap_on_submit` on and off, and every CQ head policy. Every accepted
//! command must complete exactly once with its tag and its buffer, QueueFull
//! must hand the buffer back, the data on the namespace must be what the last
//! write in submission order put there (except where a write a reset ended
//! may or may not have landed), the driver's counters must agree with
//! the model's, and the model must never see a full CQ with commands
//! outstanding (no violations). A deterministic sweep keeps every queue size
//! at full depth through several wraparounds.

mod common;

use std::collections::HashSet;

use common::{T, assert_clean, buffer_with, config_one_ns, open, opts, pattern};
use proptest::prelude::*;
use upnvme::{
    BLOCKING_TAG, Completion, Controller, ControllerOptions, CqHeadPolicy, Error, IoCommand,
    IoQueuePair, QueuePairOptions, Reject,
};
use upnvme_tests::ModelController;

const LBAS: u64 = 32;
const BS: usize = 512;

#[derive(Clone, Copy, Debug)]
enum Op {
    Submit {
        write: bool,
        lba: u64,
    },
    Queue {
        write: bool,
        lba: u64,
    },
    Ring,
    Process(u32),
    Blocking {
        write: bool,
        lba: u64,
    },
    /// A controller reset (`Controller::reset`): what is in flight ends
    /// once, with `IoError::ControllerReset`, and the pair carries on.
    Reset,
    /// A transfer of 17..=32 blocks, above MDTS (16 blocks): two commands,
    /// one completion; `queue` instead of `submit` when `queued`.
    Big {
        write: bool,
        lba: u64,
        blocks: u32,
        queued: bool,
    },
}

#[derive(Clone, Copy, Debug)]
struct Setup {
    sq: u32,
    cq: u32,
    ctrl_shadow: bool,
    pair_shadow: bool,
    reap_on_submit: bool,
    policy: CqHeadPolicy,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<bool>(), 0..LBAS).prop_map(|(write, lba)| Op::Submit { write, lba }),
        4 => (any::<bool>(), 0..LBAS).prop_map(|(write, lba)| Op::Queue { write, lba }),
        2 => Just(Op::Ring),
        4 => (1u32..10).prop_map(Op::Process),
        1 => (any::<bool>(), 0..LBAS).prop_map(|(write, lba)| Op::Blocking { write, lba }),
        1 => Just(Op::Reset),
        2 => (any::<bool>(), 17u32..=32, any::<bool>(), 0u64..16).prop_map(
            |(write, blocks, queued, lba)| Op::Big {
                write,
                lba: lba.min(LBAS - u64::from(blocks)),
                blocks,
                queued,
            }
        ),
    ]
}

fn policy() -> impl Strategy<Value = CqHeadPolicy> {
    prop_oneof![
        Just(CqHeadPolicy::EveryReap),
        (0u32..6).prop_map(|batch| CqHeadPolicy::Adaptive { batch }),
    ]
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        2u32..=64,
        2u32..=64,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        policy(),
    )
        .prop_map(
            |(sq, cq, ctrl_shadow, pair_shadow, reap_on_submit, policy)| Setup {
                sq,
                cq,
                ctrl_shadow,
                pair_shadow,
                reap_on_submit,
                policy,
            },
        )
}

/// MDTS 1: 8 KiB, 16 blocks per command.
const MDTS_BLOCKS: u32 = 16;

fn controller(shadow: bool) -> (ModelController, Controller<ModelController>) {
    let m = ModelController::new(upnvme_tests::ModelConfig {
        mdts: 1,
        ..config_one_ns(BS as u32, LBAS)
    });
    let c = open(
        &m,
        ControllerOptions {
            shadow_doorbells: shadow,
            ..opts()
        },
    );
    (m, c)
}

fn pair(c: &Controller<ModelController>, s: &Setup) -> IoQueuePair<ModelController> {
    c.io_queue_pair(QueuePairOptions {
        entries: Some(s.sq),
        cq_entries: Some(s.cq),
        shadow_doorbells: s.pair_shadow,
        reap_on_submit: s.reap_on_submit,
        cq_head_policy: s.policy,
        ..Default::default()
    })
    .unwrap()
}

/// The test's book of what is outstanding and what must be on the media.
struct Book {
    outstanding: HashSet<u64>,
    /// Commands in flight when a reset came: they end with
    /// `ControllerReset` (or completed before it, with success).
    cut: HashSet<u64>,
    /// (the write's pattern seed, the LBA's index in it).
    last_write: [Option<(u64, usize)>; LBAS as usize],
    /// LBAs a write ended by a reset may or may not have reached.
    uncertain: [bool; LBAS as usize],
    /// Completions that were `ControllerReset` (no CQE: not in the pair's
    /// completion count).
    reset_ended: u64,
    /// Commands accepted, counted as the device sees them (a split counts
    /// its children).
    accepted: u64,
    /// Tags of splits, and whether a reset cut one (how many of its
    /// children ended without a CQE is then unknown).
    splits: HashSet<u64>,
    split_cut: bool,
    /// Commands `queue`d and not yet announced by a doorbell (a `submit`,
    /// `ring`, poll or blocking call announces them).
    unannounced: u64,
    /// Commands a reset ended before any doorbell announced them: accepted,
    /// but never submitted to the device.
    never_announced: u64,
    next: u64,
}

impl Book {
    fn complete(&mut self, c: Completion) {
        assert_ne!(c.tag, BLOCKING_TAG, "no blocking call timed out");
        assert!(
            self.outstanding.remove(&c.tag),
            "tag {} completed twice or never submitted",
            c.tag
        );
        let cut = self.cut.remove(&c.tag);
        if c.result == Err(upnvme::IoError::ControllerReset) {
            if self.splits.contains(&c.tag) {
                self.split_cut = true;
            } else {
                self.reset_ended += 1;
            }
        }
        assert!(
            c.result.is_ok() || (cut && c.result == Err(upnvme::IoError::ControllerReset)),
            "tag {}: {:?}",
            c.tag,
            c.result
        );
        let b = c.buffer.expect("the buffer comes back with the completion");
        assert!(b.len() >= BS);
    }
}

fn run(s: Setup, ops: &[Op]) {
    let (m, c) = controller(s.ctrl_shadow);
    let mut qp = pair(&c, &s);
    let qid = qp.qid();
    let max_depth = qp.max_depth();
    assert_eq!(max_depth, (s.sq - 1).min(s.cq - 1));
    let mut book = Book {
        outstanding: HashSet::new(),
        cut: HashSet::new(),
        last_write: [None; LBAS as usize],
        uncertain: [false; LBAS as usize],
        reset_ended: 0,
        accepted: 0,
        splits: HashSet::new(),
        split_cut: false,
        unannounced: 0,
        never_announced: 0,
        next: 0,
    };
    let mut resets = 0u32;
    let ns = c.namespace(1).unwrap().clone();
    let ns = &ns;
    let cmd = move |write: bool, lba: u64| {
        if write {
            IoCommand::Write {
                ns,
                slba: lba,
                blocks: 1,
            }
        } else {
            IoCommand::Read {
                ns,
                slba: lba,
                blocks: 1,
            }
        }
    };
    for &o in ops {
        match o {
            Op::Submit { write, lba } | Op::Queue { write, lba } => {
                let tag = book.next;
                book.next += 1;
                let buf = buffer_with(&c, &pattern(tag, BS));
                let r = match o {
                    Op::Submit { .. } => qp.submit(cmd(write, lba), Some(buf), tag),
                    _ => qp.queue(cmd(write, lba), Some(buf), tag),
                };
                match r {
                    Ok(()) => {
                        book.outstanding.insert(tag);
                        book.accepted += 1;
                        match o {
                            Op::Submit { .. } => book.unannounced = 0,
                            _ => book.unannounced += 1,
                        }
                        if write {
                            book.last_write[lba as usize] = Some((tag, 0));
                            book.uncertain[lba as usize] = false;
                        }
                    }
                    Err(f) => {
                        assert_eq!(f.reason, Reject::QueueFull, "{:?}", f.reason);
                        assert!(
                            matches!(qp.describe(f.reason), Error::QueueFull { qid: q } if q == qid),
                            "{:?}",
                            qp.describe(f.reason)
                        );
                        assert!(f.buffer.is_some(), "QueueFull hands the buffer back");
                        assert!(
                            !book.outstanding.is_empty(),
                            "QueueFull with nothing undelivered"
                        );
                    }
                }
            }
            Op::Ring => {
                qp.ring();
                book.unannounced = 0;
            }
            Op::Big {
                write,
                lba,
                blocks,
                queued,
            } => {
                let tag = book.next;
                book.next += 1;
                let len = blocks as usize * BS;
                let buf = buffer_with(&c, &pattern(tag, len));
                let cmd = if write {
                    IoCommand::Write {
                        ns,
                        slba: lba,
                        blocks,
                    }
                } else {
                    IoCommand::Read {
                        ns,
                        slba: lba,
                        blocks,
                    }
                };
                let r = if queued {
                    qp.queue(cmd, Some(buf), tag)
                } else {
                    qp.submit(cmd, Some(buf), tag)
                };
                let pieces = u64::from(blocks.div_ceil(MDTS_BLOCKS));
                match r {
                    Ok(()) => {
                        assert!(u64::from(max_depth) >= pieces);
                        book.outstanding.insert(tag);
                        book.splits.insert(tag);
                        book.accepted += pieces;
                        if queued {
                            book.unannounced += pieces;
                        } else {
                            book.unannounced = 0;
                        }
                        if write {
                            for i in 0..blocks as usize {
                                book.last_write[lba as usize + i] = Some((tag, i));
                                book.uncertain[lba as usize + i] = false;
                            }
                        }
                    }
                    Err(f) => {
                        assert!(f.buffer.is_some(), "a refusal hands the buffer back");
                        if u64::from(max_depth) < pieces {
                            assert_eq!(f.reason, Reject::TransferTooLarge { bytes: len as u64 });
                        } else {
                            assert_eq!(f.reason, Reject::QueueFull, "{:?}", f.reason);
                            assert!(!book.outstanding.is_empty());
                        }
                    }
                }
            }
            Op::Reset => {
                c.reset().unwrap();
                resets += 1;
                book.never_announced += std::mem::take(&mut book.unannounced);
                for &t in &book.outstanding {
                    book.cut.insert(t);
                }
                for (lba, w) in book.last_write.iter().enumerate() {
                    if w.is_some_and(|(t, _)| book.outstanding.contains(&t)) {
                        book.uncertain[lba] = true;
                    }
                }
            }
            Op::Process(max) => {
                let mut got = Vec::new();
                let n = qp.process_completions(max, |_, c| got.push(c)).unwrap();
                book.unannounced = 0;
                assert_eq!(n as usize, got.len());
                assert!(n <= max);
                for c in got {
                    book.complete(c);
                }
            }
            Op::Blocking { write, lba } => {
                let seed = book.next;
                book.next += 1;
                let buf = buffer_with(&c, &pattern(seed, BS));
                match qp.execute_blocking(cmd(write, lba), Some(buf), T) {
                    Ok(b) => {
                        // Its doorbell announced what was queued before it.
                        book.unannounced = 0;
                        assert!(b.is_some());
                        book.accepted += 1;
                        if write {
                            book.last_write[lba as usize] = Some((seed, 0));
                            book.uncertain[lba as usize] = false;
                        }
                    }
                    Err(f) => {
                        // Refused before any doorbell.
                        assert!(matches!(f.error, Error::QueueFull { .. }), "{:?}", f.error);
                        assert!(f.buffer.is_some());
                    }
                }
            }
        }
        assert!(qp.in_flight() <= max_depth);
    }
    // Drain.
    for _ in 0..10_000 {
        if book.outstanding.is_empty() {
            break;
        }
        let mut got = Vec::new();
        qp.process_completions(u32::MAX, |_, c| got.push(c))
            .unwrap();
        for c in got {
            book.complete(c);
        }
    }
    assert!(
        book.outstanding.is_empty(),
        "never completed: {:?}",
        book.outstanding
    );
    assert_eq!(qp.in_flight(), 0);
    assert_eq!(
        qp.process_completions(u32::MAX, |_, c| panic!("extra completion {}", c.tag))
            .unwrap(),
        0
    );
    // Media content: the last write of each LBA in submission order.
    for (lba, w) in book.last_write.iter().enumerate() {
        if book.uncertain[lba] {
            continue;
        }
        if let Some((seed, i)) = w {
            let whole = pattern(*seed, (i + 1) * BS);
            assert_eq!(
                m.namespace_data(1, lba as u64, 1),
                whole[i * BS..],
                "LBA {lba}"
            );
        }
    }
    // Counters agree with the device's.
    let st = qp.stats();
    // Every accepted command announced to the device is counted, also
    // those a `submit`'s doorbell announced just before a reset.
    assert_eq!(
        st.submissions,
        book.accepted - book.never_announced,
        "resets: {resets}"
    );
    if book.split_cut {
        // A split a reset ended may have had children complete before it.
        assert!(st.completions + book.reset_ended <= book.accepted);
    } else {
        assert_eq!(st.completions + book.reset_ended, book.accepted);
    }
    let (sq_db, cq_db) = m.doorbell_writes(qid);
    assert_eq!(st.sq_doorbell_mmio, sq_db, "SQ doorbell MMIO writes");
    assert_eq!(st.cq_doorbell_mmio, cq_db, "CQ doorbell MMIO writes");
    if !(s.ctrl_shadow && s.pair_shadow) {
        assert_eq!(st.mmio_skipped_by_event_idx, 0);
    }
    if !s.ctrl_shadow {
        assert_eq!(st.sq_shadow_updates + st.cq_shadow_updates, 0);
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_command_completes_exactly_once(
        s in setup(),
        ops in proptest::collection::vec(op(), 1..160),
    ) {
        run(s, &ops);
    }
}

/// Keeps the pair at full depth for three wraparounds of the larger ring,
/// reaping in small batches, for every SQ size 2..=64 and a CQ that is the
/// same size, twice the size (capped) or minimal.
#[test]
fn full_depth_through_wraparounds_at_every_size() {
    let (m, c) = controller(false);
    for sq in 2u32..=64 {
        for cq in [sq, (2 * sq).min(64), 2] {
            for policy in [
                CqHeadPolicy::Adaptive { batch: 0 },
                CqHeadPolicy::Adaptive { batch: 3 },
                CqHeadPolicy::EveryReap,
            ] {
                let s = Setup {
                    sq,
                    cq,
                    ctrl_shadow: false,
                    pair_shadow: false,
                    reap_on_submit: false,
                    policy,
                };
                let (sq0, cq0) = m.doorbell_writes(1);
                let ns = c.namespace(1).unwrap().clone();
                let mut qp = pair(&c, &s);
                assert_eq!(qp.qid(), 1);
                let depth = qp.max_depth() as u64;
                let total = 3 * u64::from(sq.max(cq)) + depth;
                let mut done = HashSet::new();
                let mut next = 0u64;
                let mut reap = 1u32;
                while (done.len() as u64) < total {
                    while next < total && u64::from(qp.in_flight()) < depth {
                        let buf = c.alloc_dma(BS).unwrap();
                        qp.submit(
                            IoCommand::Read {
                                ns: &ns,
                                slba: next % LBAS,
                                blocks: 1,
                            },
                            Some(buf),
                            next,
                        )
                        .unwrap();
                        next += 1;
                    }
                    qp.process_completions(reap, |_, c| {
                        assert!(c.is_ok());
                        assert!(done.insert(c.tag), "tag {} twice", c.tag);
                    })
                    .unwrap();
                    reap = reap % 3 + 1;
                }
                let st = qp.stats();
                let (sq1, cq1) = m.doorbell_writes(1);
                drop(qp);
                assert_eq!(st.completions, total);
                assert_eq!(
                    (st.sq_doorbell_mmio, st.cq_doorbell_mmio),
                    (sq1 - sq0, cq1 - cq0)
                );
                assert_eq!(
                    m.violations(),
                    Vec::<String>::new(),
                    "SQ {sq} CQ {cq} {policy:?}"
                );
            }
        }
    }
    drop(c);
    assert_clean(&m);
}
