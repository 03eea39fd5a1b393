//! Doorbell Buffer Config across resets (a reset whose Doorbell Buffer Config
//! is refused comes back with MMIO doorbells, and every pair follows the
//! mode) and the I/O CQ's head across wraps: CQ head doorbell values of 2-
//! and 65536-entry queues, a reset with entries unconsumed in an odd lap.
//! From the thirty-ninth session's review (written for a CQ cursor in the
//! dma crate that was measured and reverted; they hold for `CqRing`).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Access, Front, Hooks, Spy, assert_clean, config_one_ns, opts, reg};
use upnvme::{
    Controller, ControllerOptions, Device, IoCommand, IoError, IoQueuePair, QueuePairOptions,
    SqAnnounce,
};
use upnvme_tests::{Fault, Match, ModelConfig, ModelController, Status};

const BS: usize = 512;
const DBBC: u8 = 0x7c;

fn model_with(mqes: u16) -> ModelController {
    ModelController::new(ModelConfig {
        mqes,
        ..config_one_ns(BS as u32, 1024)
    })
}

fn refuse_next_dbbc(m: &ModelController) {
    m.inject(Fault::Status {
        on: Match::Opcode {
            qid: 0,
            opcode: DBBC,
        },
        status: Status::INVALID_FIELD,
    });
}

/// QD1 reads with NO shadow polling: a doorbell skipped on an EventIdx the
/// controller does not write is a command that never completes, reported
/// as a failure after a bounded number of polls. Returns the completions'
/// results.
fn qd1_strict<D: Device>(c: &Controller<D>, qp: &mut IoQueuePair<D>, n: u64) -> Result<(), String> {
    let ns = c.namespace(1).unwrap().clone();
    let mut buf = Some(c.alloc_dma(BS).unwrap());
    for i in 0..n {
        qp.submit(
            IoCommand::Read {
                ns: &ns,
                slba: i % 1024,
                blocks: 1,
            },
            buf.take(),
            i,
        )
        .map_err(|r| format!("read {i} refused: {}", qp.describe(r.reason)))?;
        let mut polls = 0u32;
        while buf.is_none() {
            let mut bad = None;
            qp.process_completions(1, |_, cpl| {
                if cpl.tag != i || cpl.result.is_err() {
                    bad = Some(format!("{cpl:?}"));
                }
                buf = cpl.buffer;
            })
            .map_err(|e| format!("read {i}: {e}"))?;
            if let Some(b) = bad {
                return Err(format!("read {i}: unexpected completion {b}"));
            }
            polls += 1;
            if polls > 10_000 {
                return Err(format!("read {i} never completes (lost doorbell?)"));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------
// 1. CQ head doorbell values through the driver (MMIO only, recorded).
// ---------------------------------------------------------------------

fn cq_head_writes(log: &[Access], qid: u16) -> Vec<u32> {
    // DSTRD 0 in the model: CQ y head doorbell at 0x1000 + (2y + 1) * 4.
    let off = reg::DOORBELLS + (2 * qid as usize + 1) * 4;
    log.iter()
        .filter_map(|a| match *a {
            Access::W32(o, v) if o == off => Some(v),
            _ => None,
        })
        .collect()
}

/// A controller on MMIO doorbells behind a recording [`Spy`] and a pair of
/// `sq` / `cq` entries; the log starts empty after the pair's creation.
fn spied_pair(m: &ModelController, sq: u32, cq: u32) -> (Spy, Controller<Spy>, IoQueuePair<Spy>) {
    let spy = Spy::new(m.clone());
    let c = Controller::with_device(
        spy.clone(),
        ControllerOptions {
            shadow_doorbells: false,
            ..opts()
        },
    )
    .unwrap();
    let qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(sq),
            cq_entries: Some(cq),
            command_timeout: None,
            ..Default::default()
        })
        .unwrap();
    spy.clear();
    (spy, c, qp)
}

/// A 2-entry CQ at QD1 (slack 0: the head is written after every
/// completion) writes 1, 0, 1, 0, ... for a thousand wraps; the model sees
/// no CQ violation.
#[test]
fn two_entry_cq_head_doorbell_alternates_over_many_wraps() {
    let m = model_with(2047);
    let (spy, c, mut qp) = spied_pair(&m, 2, 2);
    qd1_strict(&c, &mut qp, 2001).unwrap();
    let w = cq_head_writes(&spy.log(), qp.qid());
    assert_eq!(w.len(), 2001);
    for (i, v) in w.iter().enumerate() {
        assert_eq!(*v, ((i + 1) % 2) as u32, "write {i}");
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A 65536-entry CQ with a 2-entry SQ (slack 65534): the adaptive
/// rule writes the head once per 65535 completions, with 65535 (the
/// largest 16-bit value) first and 65534 after the wrap.
#[test]
fn a_65536_entry_cq_writes_head_65535_then_65534() {
    let m = model_with(65535);
    let (spy, c, mut qp) = spied_pair(&m, 2, 65536);
    qd1_strict(&c, &mut qp, 2 * 65535 + 3).unwrap();
    let w = cq_head_writes(&spy.log(), qp.qid());
    assert_eq!(w, vec![65535, 65534]);
    let st = m.cq_state(qp.qid()).unwrap();
    assert_eq!(st.head, 65534);
    assert_eq!(st.tail, (2 * 65535 + 3) % 65536);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

// ---------------------------------------------------------------------
// 2. Reset while CQ entries are unconsumed, in an odd lap (phase 0).
// ---------------------------------------------------------------------

/// The CQ is in its second lap (expected phase 0) with completions
/// posted but not reaped when the controller is reset: each ends once as
/// ControllerReset (none delivered from the stale CQ), and the re-created
/// CQ starts at slot 0 expecting phase 1 (else the next read would hang or
/// a stale entry be taken).
#[test]
fn reset_with_unconsumed_entries_in_an_odd_lap_restarts_the_cursor() {
    for shadow in [false, true] {
        let m = model_with(2047);
        let c = Controller::with_device(
            m.clone(),
            ControllerOptions {
                shadow_doorbells: shadow,
                ..opts()
            },
        )
        .unwrap();
        let mut qp = c
            .io_queue_pair(QueuePairOptions {
                entries: Some(8),
                cq_entries: Some(5),
                command_timeout: None,
                reap_on_submit: false,
                ..Default::default()
            })
            .unwrap();
        qd1_strict(&c, &mut qp, 7).unwrap();
        let ns = c.namespace(1).unwrap().clone();
        for t in 100..103u64 {
            qp.submit(
                IoCommand::Read {
                    ns: &ns,
                    slba: t,
                    blocks: 1,
                },
                Some(c.alloc_dma(BS).unwrap()),
                t,
            )
            .unwrap();
        }
        // Reap one of the three (the others stay in the CQ).
        let mut got = Vec::new();
        qp.process_completions(1, |_, cpl| got.push((cpl.tag, cpl.result)))
            .unwrap();
        assert_eq!(got.len(), 1);
        assert!(got[0].1.is_ok());
        c.reset().unwrap();
        let mut ended = Vec::new();
        for _ in 0..1000 {
            qp.process_completions(u32::MAX, |_, cpl| ended.push((cpl.tag, cpl.result)))
                .unwrap();
            if ended.len() >= 2 {
                break;
            }
        }
        ended.sort_by_key(|e| e.0);
        assert_eq!(ended.len(), 2, "shadow {shadow}: {ended:?}");
        for (_, r) in &ended {
            assert_eq!(*r, Err(IoError::ControllerReset), "shadow {shadow}");
        }
        qd1_strict(&c, &mut qp, 23).unwrap();
        // Nothing more comes.
        assert_eq!(qp.process_completions(u32::MAX, |_, _| {}).unwrap(), 0);
        drop(qp);
        drop(c);
        assert_clean(&m);
    }
}

// ---------------------------------------------------------------------
// 3. Doorbell Buffer Config refused after a reset: the mode of each pair.
// ---------------------------------------------------------------------

/// A pair announcing each command through the shadow doorbell
/// (`SqAnnounce::EachCommand`) before the refusal stops doing so after it
/// (`queue` then `ring` still completes with no shadow update and no shadow
/// poll), and announces each command again once a later reset takes DBBC.
#[test]
fn each_command_announcement_follows_the_doorbell_mode_across_resets() {
    let m = model_with(2047);
    let c = Controller::with_device(m.clone(), opts()).unwrap();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            sq_announce: SqAnnounce::EachCommand,
            command_timeout: None,
            ..Default::default()
        })
        .unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let batch = |qp: &mut IoQueuePair<ModelController>, base: u64| -> Result<(), String> {
        for t in base..base + 4 {
            qp.queue(
                IoCommand::Read {
                    ns: &ns,
                    slba: t % 1024,
                    blocks: 1,
                },
                Some(c.alloc_dma(BS).unwrap()),
                t,
            )
            .map_err(|r| qp.describe(r.reason).to_string())?;
        }
        qp.ring();
        let mut n = 0;
        for _ in 0..10_000 {
            qp.process_completions(u32::MAX, |_, cpl| {
                assert!(cpl.result.is_ok(), "{cpl:?}");
                n += 1;
            })
            .map_err(|e| e.to_string())?;
            if n == 4 {
                return Ok(());
            }
        }
        Err(format!("{n} of 4 completed"))
    };
    batch(&mut qp, 0).unwrap();
    assert!(qp.stats().sq_shadow_updates >= 4);
    refuse_next_dbbc(&m);
    c.reset().unwrap();
    assert!(!c.shadow_doorbells());
    m.freeze_event_idx(true);
    // The first call after the reset re-creates the queues.
    qd1_strict(&c, &mut qp, 1).unwrap();
    let before = qp.stats();
    batch(&mut qp, 10).unwrap();
    let after = qp.stats();
    assert_eq!(after.sq_shadow_updates, before.sq_shadow_updates);
    assert_eq!(after.cq_shadow_updates, before.cq_shadow_updates);
    assert_eq!(
        after.mmio_skipped_by_event_idx,
        before.mmio_skipped_by_event_idx
    );
    m.freeze_event_idx(false);
    c.reset().unwrap();
    assert!(c.shadow_doorbells());
    qd1_strict(&c, &mut qp, 1).unwrap();
    let before = qp.stats();
    batch(&mut qp, 20).unwrap();
    assert_eq!(qp.stats().sq_shadow_updates - before.sq_shadow_updates, 4);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A hook that, at the reset's Doorbell Buffer Config doorbell write (admin
/// SQ tail), lets another thread start creating a pair: its creation runs
/// between reset steps and waits for the admin lock.
struct GateOnAdminDoorbell {
    model: ModelController,
    armed: Arc<AtomicBool>,
    fired: Arc<AtomicU32>,
    go: Arc<Mutex<Option<std::sync::mpsc::Sender<()>>>>,
}

impl Hooks for GateOnAdminDoorbell {
    fn model(&self) -> &ModelController {
        &self.model
    }
    fn write32(&self, offset: usize, value: u32) {
        if offset == reg::DOORBELLS
            && self.armed.load(Ordering::SeqCst)
            && self.fired.fetch_add(1, Ordering::SeqCst) == 0
            && let Some(tx) = self.go.lock().unwrap().take()
        {
            let _ = tx.send(());
            // Give the other thread time to get into its creation.
            std::thread::sleep(Duration::from_millis(50));
        }
        self.model.write32(offset, value)
    }
}

/// A pair whose creation starts while a reset (whose DBBC is
/// refused) runs waits for the reset and comes up with MMIO doorbells; it
/// never trusts the (zeroed, no longer written) EventIdx.
#[test]
fn a_pair_created_during_a_reset_that_refuses_dbbc_rings_mmio() {
    let m = model_with(2047);
    let armed = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let hooks = GateOnAdminDoorbell {
        model: m.clone(),
        armed: armed.clone(),
        fired: Arc::new(AtomicU32::new(0)),
        go: Arc::new(Mutex::new(Some(tx))),
    };
    let c = Controller::with_device(Front(hooks), opts()).unwrap();
    assert!(c.shadow_doorbells());
    refuse_next_dbbc(&m);
    std::thread::scope(|s| {
        let c = &c;
        let creator = s.spawn(move || {
            rx.recv_timeout(Duration::from_secs(10))
                .expect("reset started");
            let mut qp = c
                .io_queue_pair(QueuePairOptions {
                    command_timeout: None,
                    ..Default::default()
                })
                .unwrap();
            let mmio = !qp.shadow_doorbells();
            let r = qd1_strict(c, &mut qp, 50);
            (mmio, r)
        });
        armed.store(true, Ordering::SeqCst);
        c.reset().unwrap();
        let (mmio, r) = creator.join().unwrap();
        assert!(!c.shadow_doorbells());
        assert!(
            mmio,
            "pair created during the refusing reset uses shadow doorbells"
        );
        r.unwrap();
    });
    drop(c);
    assert_clean(&m);
}

/// Resets on another thread that alternately refuse and take
/// Doorbell Buffer Config while pairs are created, used at QD1 (no shadow
/// polling: a skipped doorbell is a hang) and dropped on this thread.
#[test]
fn pairs_created_while_resets_toggle_dbbc_never_lose_a_doorbell() {
    let m = model_with(2047);
    let c = Controller::with_device(m.clone(), opts()).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let resetter = s.spawn(|| {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) && n < 200 {
                if n.is_multiple_of(2) {
                    refuse_next_dbbc(&m);
                }
                c.reset().expect("reset");
                n += 1;
                std::thread::sleep(Duration::from_micros(300));
            }
            n
        });
        let start = Instant::now();
        let mut rounds = 0;
        while start.elapsed() < Duration::from_secs(4) && !resetter.is_finished() {
            let mut qp = match c.io_queue_pair(QueuePairOptions {
                command_timeout: None,
                ..Default::default()
            }) {
                Ok(qp) => qp,
                Err(e) => panic!("pair: {e}"),
            };
            let ns = c.namespace(1).unwrap().clone();
            for i in 0..20u64 {
                let mut buf = Some(c.alloc_dma(BS).unwrap());
                let mut done = false;
                if let Err(r) = qp.submit(
                    IoCommand::Read {
                        ns: &ns,
                        slba: i,
                        blocks: 1,
                    },
                    buf.take(),
                    i,
                ) {
                    // Refused (reset in between, re-creation failed): fine.
                    let _ = qp.describe(r.reason);
                    continue;
                }
                // Bounded by time, not by a poll count: under load the
                // resetting thread may hold the controller for longer than
                // a count of polls lasts (seen with 200,000 polls at a load
                // average of 5-6 on 2 cores).
                let wait = Instant::now();
                while wait.elapsed() < Duration::from_secs(5) {
                    // An error (a reset in between) is tried again; a
                    // completion may be ControllerReset; a lost doorbell
                    // is the failure.
                    let _ = qp.process_completions(1, |_, cpl| {
                        assert!(
                            matches!(cpl.result, Ok(_) | Err(IoError::ControllerReset)),
                            "{cpl:?}"
                        );
                        done = true;
                    });
                    if done {
                        break;
                    }
                }
                assert!(
                    done,
                    "round {rounds} read {i} never completed: {:?}",
                    qp.stats()
                );
            }
            drop(qp);
            rounds += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let n = resetter.join().unwrap();
        assert!(n > 0 && rounds > 0);
        // As in concurrent_reset.rs: a pair thread preempted between its
        // state check and its doorbell store may write a doorbell for a
        // queue the reset deleted (known, bounded); nothing else.
        let v = m.violations();
        let stale = |s: &String| {
            s.contains("but the queue does not exist")
                || s.contains("while the controller is not ready")
        };
        assert!(v.iter().all(stale), "{:?}", v.iter().find(|s| !stale(s)));
        assert!(
            (v.len() as u32) * 20 <= n,
            "{} stale doorbells in {n} resets",
            v.len()
        );
        eprintln!("{n} resets, {rounds} pairs, {} stale doorbells", v.len());
    });
    drop(c);
    assert_eq!(m.dma_faults(), 0);
}

// ---------------------------------------------------------------------
// 4. `Controller::shadow_doorbells()` after a reset that did not send DBBC.
// ---------------------------------------------------------------------

/// A reset whose Doorbell Buffer Config gets no answer fails (the
/// controller is marked failed), and `shadow_doorbells()` says false: the
/// last enable never took the command. (Before the fix `shadow_on` kept the
/// previous generation's value when a reset failed before or at DBBC.)
#[test]
fn shadow_doorbells_is_false_after_a_reset_whose_dbbc_got_no_answer() {
    let m = model_with(2047);
    let c = Controller::with_device(
        m.clone(),
        ControllerOptions {
            admin_timeout: Some(Duration::from_millis(300)),
            ..opts()
        },
    )
    .unwrap();
    assert!(c.shadow_doorbells());
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: 0,
        opcode: DBBC,
    }));
    assert!(c.reset().is_err());
    assert!(
        !c.shadow_doorbells(),
        "the last enable's Doorbell Buffer Config was never answered"
    );
}

/// A reset that fails before it gets to Doorbell Buffer Config (Identify
/// Controller refused) re-enabled the controller (CC.EN 0 -> 1 cleared
/// DBBC) and never sent the command: `shadow_doorbells()` says false (it
/// said true before the fix).
#[test]
fn shadow_doorbells_is_false_after_a_reset_that_failed_before_dbbc() {
    let m = model_with(2047);
    let c = Controller::with_device(m.clone(), opts()).unwrap();
    assert!(c.shadow_doorbells());
    m.inject(Fault::Status {
        on: Match::Identify { cns: 1, nsid: 0 },
        status: Status::INVALID_FIELD,
    });
    assert!(c.reset().is_err());
    assert!(m.shadow_config().is_none(), "the model has no DBBC now");
    assert!(
        !c.shadow_doorbells(),
        "no Doorbell Buffer Config since the last enable"
    );
}

/// After a reset that refuses Doorbell Buffer Config, the pair's
/// first re-creation is refused too (Create I/O CQ fails with a status), so
/// its doorbell mode is not updated then; the retry that succeeds takes
/// MMIO doorbells, and CQ heads go over MMIO through many wraps of a small
/// CQ (a CQ head left in the shadow buffer would fill the CQ: a hang).
#[test]
fn a_failed_recreation_after_a_refused_dbbc_still_ends_in_mmio_mode() {
    let m = model_with(2047);
    let c = Controller::with_device(m.clone(), opts()).unwrap();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(3),
            cq_entries: Some(4),
            command_timeout: None,
            ..Default::default()
        })
        .unwrap();
    qd1_strict(&c, &mut qp, 9).unwrap();
    assert!(qp.shadow_doorbells());
    refuse_next_dbbc(&m);
    c.reset().unwrap();
    m.inject(Fault::Status {
        on: Match::Opcode {
            qid: 0,
            opcode: common::admin_op::CREATE_IO_CQ,
        },
        status: Status::INVALID_FIELD,
    });
    m.freeze_event_idx(true);
    // The first call meets the refused re-creation.
    assert!(qp.process_completions(u32::MAX, |_, _| {}).is_err());
    let before = qp.stats();
    qd1_strict(&c, &mut qp, 41).unwrap();
    assert!(!qp.shadow_doorbells());
    let after = qp.stats();
    assert_eq!(after.sq_shadow_updates, before.sq_shadow_updates);
    assert_eq!(after.cq_shadow_updates, before.cq_shadow_updates);
    assert!(after.cq_doorbell_mmio > before.cq_doorbell_mmio);
    m.freeze_event_idx(false);
    drop(qp);
    drop(c);
    assert_clean(&m);
}
