//! Doorbells over the whole option matrix: random SQ and CQ sizes (odd,
//! either larger), every SQ announcement policy (`WhenDeep` with random
//! thresholds), every CQ head policy, shadow doorbells on and off at the
//! controller and the pair, `reap_on_submit`, completions the model holds
//! back, an EventIdx frozen and thawed, resubmission from the callback
//! through `submit` and `queue`, and (some runs) controller resets. Each
//! run checks that every command ends exactly once and that the model saw
//! no violation (a CQ found full, an invalid doorbell). The property test
//! in doorbells.rs keeps the default announcement; this one varies it.
//! (From a review of the doorbell code, 2026-12-07: 7 100 seeded runs, no
//! failure; kept as a regression net.)

mod common;

use std::collections::HashSet;

use common::{Rng, config_one_ns, opts};
use upnvme::{
    Controller, ControllerOptions, CqHeadPolicy, IoCommand, IoQueuePair, QueuePairOptions,
    SqAnnounce,
};
use upnvme_tests::{Fault, Match, ModelController};

const BS: usize = 512;
const LBAS: u64 = 64;

/// One seeded run: queue sizes in `2..2 + span`; `resets`: the random
/// steps include controller resets.
fn run(seed: u64, span: u64, resets: bool) {
    let mut r = Rng(seed | 1);
    let sq = 2 + r.below(span) as u32;
    let cq = 2 + r.below(span) as u32;
    let ctrl_shadow = r.below(4) != 0;
    let pair_shadow = r.below(3) != 0;
    let announce = match r.below(3) {
        0 => SqAnnounce::Batch,
        1 => SqAnnounce::EachCommand,
        _ => SqAnnounce::WhenDeep {
            in_flight: r.below(span.min(80)) as u16,
        },
    };
    let policy = match r.below(3) {
        0 => CqHeadPolicy::EveryReap,
        _ => CqHeadPolicy::Adaptive {
            batch: r.below(5) as u32,
        },
    };
    let reap_on_submit = r.below(3) == 0;
    let what = format!(
        "seed {seed}: sq {sq} cq {cq} ctrl_shadow {ctrl_shadow} pair_shadow {pair_shadow} {announce:?} {policy:?} ros {reap_on_submit}"
    );
    let m = ModelController::new(config_one_ns(BS as u32, LBAS));
    let c = Controller::with_device(
        m.clone(),
        ControllerOptions {
            shadow_doorbells: ctrl_shadow,
            ..opts()
        },
    )
    .unwrap();
    let mut qp: IoQueuePair<ModelController> = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(sq),
            cq_entries: Some(cq),
            shadow_doorbells: pair_shadow,
            sq_announce: announce,
            cq_head_policy: policy,
            reap_on_submit,
            ..Default::default()
        })
        .unwrap();
    let qid = qp.qid();
    let ns = c.namespace(1).unwrap().clone();
    let mut outstanding = HashSet::new();
    let mut next = 0u64;
    let mut frozen = false;
    for _ in 0..1500 {
        match r.below(11) {
            0..=2 => {
                let tag = next;
                next += 1;
                let buf = c.alloc_dma(BS).unwrap();
                let cmd = IoCommand::Read {
                    ns: &ns,
                    slba: tag % LBAS,
                    blocks: 1,
                };
                let res = if r.below(2) == 0 {
                    qp.submit(cmd, Some(buf), tag)
                } else {
                    qp.queue(cmd, Some(buf), tag)
                };
                if res.is_ok() {
                    outstanding.insert(tag);
                }
            }
            3 => qp.ring(),
            4 => m.inject(Fault::DelayCompletion {
                on: Match::Queue(qid),
                doorbells: if r.below(3) == 0 {
                    None
                } else {
                    Some(r.below(6) as u32)
                },
            }),
            5 => {
                m.release_delayed();
            }
            6 => {
                frozen = !frozen;
                m.freeze_event_idx(frozen);
            }
            7 => m.process_shadow(),
            8 if resets => c.reset().unwrap(),
            _ => {
                let max = 1 + r.below(6) as u32;
                let resubmit = r.below(2) == 0;
                let via_queue = r.below(2) == 0;
                let mut got = Vec::new();
                let mut new = Vec::new();
                let mut nx = next;
                qp.process_completions(max, |qp, cpl| {
                    assert!(
                        cpl.result.is_ok() || cpl.result == Err(upnvme::IoError::ControllerReset),
                        "{:?}",
                        cpl.result
                    );
                    got.push(cpl.tag);
                    if resubmit && let Some(b) = cpl.buffer {
                        let tag = nx;
                        nx += 1;
                        let cmd = IoCommand::Read {
                            ns: &ns,
                            slba: tag % LBAS,
                            blocks: 1,
                        };
                        let res = if via_queue {
                            qp.queue(cmd, Some(b), tag)
                        } else {
                            qp.submit(cmd, Some(b), tag)
                        };
                        if res.is_ok() {
                            new.push(tag);
                        }
                    }
                })
                .unwrap_or_else(|e| panic!("{what}: {e}"));
                next = nx;
                outstanding.extend(new);
                for t in got {
                    assert!(outstanding.remove(&t), "{what}: tag {t} twice");
                }
            }
        }
        let v = m.violations();
        assert!(v.is_empty(), "{what}: {v:?}");
    }
    m.freeze_event_idx(false);
    for _ in 0..1000 {
        if outstanding.is_empty() {
            break;
        }
        m.release_delayed();
        m.process_shadow();
        let mut got = Vec::new();
        qp.process_completions(u32::MAX, |_, c| got.push(c.tag))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        for t in got {
            assert!(outstanding.remove(&t), "{what}: tag {t} twice");
        }
    }
    assert!(outstanding.is_empty(), "{what}: lost {outstanding:?}");
    drop(qp);
    drop(c);
    let v = m.violations();
    assert!(v.is_empty(), "{what}: {v:?}");
}

#[test]
fn small_queues_every_policy() {
    for seed in 1..=200u64 {
        run(seed * 0x9e37_79b9, 19, false);
    }
}

#[test]
fn small_queues_every_policy_with_resets() {
    for seed in 1..=100u64 {
        run(seed * 0x85eb_ca6b, 19, true);
    }
}

#[test]
fn larger_queues_every_policy() {
    for seed in 1..=40u64 {
        run(seed * 0xc2b2_ae35, 150, false);
    }
}
