//! The shadow doorbell (Doorbell Buffer Config) path and the doorbell / CQ
//! head policies: the need-event arithmetic at every wrap, stale
//! shadow/EventIdx values across qid reuse and resets, Doorbell Buffer
//! Config failures, and a controller that runs concurrently with the host
//! (QEMU's `nvme_process_sq` order: EventIdx written, then the shadow tail
//! read again) instead of inside the MMIO write. From a review (thirty-fifth
//! session) that found no driver bug here.
//!
//! Why the threaded harness: the synchronous model processes inside each
//! MMIO write and then sets the EventIdx to the tail it just read, so the
//! driver's next update always passes it and is always written over MMIO —
//! with that model alone the skipping path (the one that can lose a
//! doorbell) runs only where a test freezes the EventIdx. A controller on
//! its own thread, woken only by MMIO writes, lets the EventIdx lag as
//! QEMU's does (tens of thousands of skipped writes per run here).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::{Front, Hooks, T, assert_clean, config_one_ns, opts};
use upnvme::{
    Controller, ControllerOptions, CqHeadPolicy, Device, DmaBuffer, IoCommand, IoQueuePair,
    QueuePairOptions, SqAnnounce,
};
use upnvme_queues::need_mmio;
use upnvme_tests::{Fault, Match, ModelConfig, ModelController, Status};

const BS: usize = 512;

// ---------------------------------------------------------------------
// 1. The need-event comparison against a ring-index oracle.
// ---------------------------------------------------------------------

/// The oracle: the update from `old` to `old + k` (mod `n`, 1 <= k < n)
/// passes exactly the slots old, old+1, ..., old+k-1 (mod n); the
/// controller asked to be told once the doorbell moves past `ei`.
fn passes(n: u32, old: u32, k: u32, ei: u32) -> bool {
    (0..k).any(|i| (old + i) % n == ei)
}

#[test]
fn need_mmio_matches_a_ring_oracle_for_every_size_and_wrap() {
    // Small rings exhaustively (every old, every step, every EventIdx).
    for n in [2u32, 3, 5, 7, 10, 13, 16, 17, 31] {
        for old in 0..n {
            for k in 1..n {
                let new = (old + k) % n;
                for ei in 0..n {
                    assert_eq!(
                        need_mmio(ei as u16, new as u16, old as u16),
                        passes(n, old, k, ei),
                        "n {n} old {old} new {new} ei {ei}"
                    );
                }
            }
        }
    }
    // Large rings (up to 65536 entries, not powers of two among them):
    // every EventIdx for a sample of (old, step) pairs around the wrap.
    for n in [255u32, 1000, 4097, 65535, 65536] {
        let olds = [0, 1, n / 2, n - 2, n - 1];
        let steps = [1, 2, n / 3, n - 2, n - 1];
        for &old in &olds {
            for &k in &steps {
                if k == 0 || k >= n {
                    continue;
                }
                let new = (old + k) % n;
                for ei in (0..n).step_by(if n > 5000 { 7 } else { 1 }).chain([
                    old,
                    new,
                    (new + n - 1) % n,
                    (old + n - 1) % n,
                ]) {
                    assert_eq!(
                        need_mmio(ei as u16, new as u16, old as u16),
                        passes_fast(n, old, k, ei),
                        "n {n} old {old} new {new} ei {ei}"
                    );
                }
            }
        }
    }
}

/// [`passes`] in O(1): `ei` is at most `k - 1` slots past `old`.
fn passes_fast(n: u32, old: u32, k: u32, ei: u32) -> bool {
    (ei + n - old) % n < k
}

// ---------------------------------------------------------------------
// 2. The driver at wraps of rings that are not powers of two, and of a
//    65536-entry ring (16-bit tail wrap), against a frozen (lagging)
//    EventIdx: every tail update whose window holds the EventIdx is
//    written over MMIO, the others only to the shadow buffer.
// ---------------------------------------------------------------------

fn model_with(mqes: u16) -> ModelController {
    ModelController::new(ModelConfig {
        mqes,
        ..config_one_ns(BS as u32, 1024)
    })
}

fn shadow_controller(m: &ModelController) -> Controller<ModelController> {
    Controller::with_device(m.clone(), opts()).unwrap()
}

fn read<D: Device>(qp: &mut IoQueuePair<D>, ns: &upnvme::Namespace, buf: DmaBuffer, tag: u64) {
    qp.submit(
        IoCommand::Read {
            ns,
            slba: tag % 1024,
            blocks: 1,
        },
        Some(buf),
        tag,
    )
    .unwrap();
}

/// QD1 reads through `submit`; when a completion does not come, the test
/// plays a controller that polls the shadow buffer (`process_shadow`) and
/// counts it. Returns the number of such polls needed.
fn qd1_with_polls(
    m: &ModelController,
    c: &Controller<ModelController>,
    qp: &mut IoQueuePair<ModelController>,
    n: u64,
) -> u64 {
    let ns = c.namespace(1).unwrap().clone();
    let mut buf = Some(c.alloc_dma(BS).unwrap());
    let mut polls = 0;
    for i in 0..n {
        read(qp, &ns, buf.take().unwrap(), i);
        let mut tries = 0;
        while buf.is_none() {
            qp.process_completions(1, |_, cpl| {
                assert!(cpl.is_ok(), "{cpl:?}");
                assert_eq!(cpl.tag, i);
                buf = cpl.buffer;
            })
            .unwrap();
            if buf.is_none() {
                tries += 1;
                if tries > 2 {
                    m.process_shadow();
                    polls += 1;
                    tries = 0;
                    // A doorbell no controller poll finds is lost: fail,
                    // do not spin.
                    assert!(polls < 100_000, "read {i} never completes");
                }
            }
        }
    }
    polls
}

#[test]
fn frozen_event_idx_at_wraps_of_rings_that_are_not_powers_of_two() {
    for (sq, cq, warm) in [
        (7u32, 13u32, 3u64),
        (5, 5, 4),
        (13, 7, 0),
        (1000, 1999, 998),
    ] {
        let m = model_with(2047);
        let c = shadow_controller(&m);
        let mut qp = c
            .io_queue_pair(QueuePairOptions {
                entries: Some(sq),
                cq_entries: Some(cq),
                command_timeout: None,
                ..Default::default()
            })
            .unwrap();
        let qid = qp.qid();
        // Warm up with the EventIdx live, then freeze it where it is: the
        // SQ EventIdx is then `warm % sq` for the rest of the run.
        qd1_with_polls(&m, &c, &mut qp, warm);
        m.freeze_event_idx(true);
        let ei = (warm % u64::from(sq)) as u32;
        let before = qp.stats();
        let n = 5 * u64::from(sq) + 3;
        qd1_with_polls(&m, &c, &mut qp, n);
        let st = qp.stats();
        // The oracle: tail t -> t+1 for t = warm .. warm+n-1 (mod sq); MMIO
        // exactly when t == ei.
        let expected = (0..n)
            .filter(|i| ((warm + i) % u64::from(sq)) as u32 == ei)
            .count() as u64;
        assert_eq!(
            st.sq_doorbell_mmio - before.sq_doorbell_mmio,
            expected,
            "sq {sq} cq {cq}: SQ MMIO writes against the oracle"
        );
        assert_eq!(st.sq_shadow_updates - before.sq_shadow_updates, n);
        assert_eq!(
            m.sq_state(qid).unwrap().tail,
            ((warm + n) % u64::from(sq)) as u32
        );
        m.freeze_event_idx(false);
        drop(qp);
        drop(c);
        assert_clean(&m);
    }
}

/// A 65536-entry SQ (CAP.MQES = FFFFh): the 16-bit tail wraps from 65535
/// to 0 with the EventIdx frozen just behind the wrap.
#[test]
fn a_65536_entry_queue_wraps_its_16_bit_tail_with_a_lagging_event_idx() {
    let m = model_with(65535);
    let c = shadow_controller(&m);
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(65536),
            cq_entries: Some(65536),
            command_timeout: None,
            cq_head_policy: CqHeadPolicy::Adaptive { batch: 4096 },
            ..Default::default()
        })
        .unwrap();
    let qid = qp.qid();
    let warm = 65534u64;
    qd1_with_polls(&m, &c, &mut qp, warm);
    assert_eq!(m.sq_state(qid).unwrap().tail, 65534);
    m.freeze_event_idx(true); // SQ EventIdx 65534
    let before = qp.stats();
    let n = 8u64;
    qd1_with_polls(&m, &c, &mut qp, n);
    let st = qp.stats();
    // 65534 -> 65535 passes 65534: MMIO; the rest (65535 -> 0 -> 1 ...) do not.
    assert_eq!(st.sq_doorbell_mmio - before.sq_doorbell_mmio, 1);
    assert_eq!(m.sq_state(qid).unwrap().tail, 6);
    m.freeze_event_idx(false);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

// ---------------------------------------------------------------------
// 3. Stale shadow / EventIdx values: a qid reused by a new pair, and the
//    same pair's queues re-created after a reset. The EventIdx is frozen
//    before the new queues exist, so whatever the host left in the buffer
//    is what it sees: a stale EventIdx (900) would make the first command
//    skip its MMIO write and sit unfetched (QEMU fetches only on the MMIO
//    write); a stale shadow tail (900 >= 16 entries) is a model violation
//    (QEMU would loop on it: `nvme_update_sq_tail` takes the value
//    unchecked).
// ---------------------------------------------------------------------

fn run_to_tail(
    m: &ModelController,
    c: &Controller<ModelController>,
    entries: u32,
    n: u64,
) -> IoQueuePair<ModelController> {
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(entries),
            command_timeout: None,
            ..Default::default()
        })
        .unwrap();
    qd1_with_polls(m, c, &mut qp, n);
    qp
}

#[test]
fn a_reused_qid_starts_from_zeroed_shadow_and_event_idx_slots() {
    let m = model_with(2047);
    let c = shadow_controller(&m);
    let qp = run_to_tail(&m, &c, 1000, 900);
    let qid = qp.qid();
    assert_eq!(m.sq_state(qid).unwrap().tail, 900);
    drop(qp);
    m.freeze_event_idx(true);
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(16),
            command_timeout: None,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(qp.qid(), qid, "the freed qid is handed out again");
    let polls = qd1_with_polls(&m, &c, &mut qp, 1);
    assert_eq!(
        polls, 0,
        "the first command needed a shadow poll: stale EventIdx"
    );
    assert_eq!(qp.stats().sq_doorbell_mmio, 1);
    m.freeze_event_idx(false);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn queues_recreated_after_a_reset_start_from_zeroed_slots() {
    let m = model_with(2047);
    let c = shadow_controller(&m);
    let mut qp = run_to_tail(&m, &c, 1000, 900);
    let qid = qp.qid();
    c.reset().unwrap();
    m.freeze_event_idx(true);
    let polls = qd1_with_polls(&m, &c, &mut qp, 1);
    assert_eq!(polls, 0, "stale EventIdx after the reset");
    assert_eq!(m.sq_state(qid).unwrap().tail, 1);
    m.freeze_event_idx(false);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

// ---------------------------------------------------------------------
// 4. Doorbell Buffer Config failures.
// ---------------------------------------------------------------------

const DBBC: u8 = 0x7c;

#[test]
fn dbbc_refused_at_bring_up_falls_back_to_mmio() {
    let m = model_with(2047);
    m.inject(Fault::Status {
        on: Match::Opcode {
            qid: 0,
            opcode: DBBC,
        },
        status: Status::INVALID_FIELD,
    });
    let c = shadow_controller(&m);
    assert!(!c.shadow_doorbells());
    assert!(m.shadow_config().is_none());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    assert!(!qp.shadow_doorbells());
    qd1_with_polls(&m, &c, &mut qp, 100);
    let st = qp.stats();
    assert_eq!((st.sq_shadow_updates, st.sq_doorbell_mmio), (0, 100));
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn dbbc_unanswered_at_bring_up_fails_the_open_cleanly() {
    let m = model_with(2047);
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: 0,
        opcode: DBBC,
    }));
    let r = Controller::with_device(
        m.clone(),
        ControllerOptions {
            admin_timeout: Some(Duration::from_millis(300)),
            ..opts()
        },
    );
    assert!(r.is_err());
    // The model did configure the buffers (it executed the command): the
    // driver kept them until the controller was disabled.
    assert!(m.cc() & 1 == 0, "disabled before the buffers were freed");
    assert_clean(&m);
}

/// A controller that took Doorbell Buffer Config at bring-up and refuses it
/// after a reset: the controller no longer reads the shadow buffer or
/// writes the EventIdx, so a pair that kept skipping MMIO writes on the
/// EventIdx's word would lose doorbells. The reset succeeds with MMIO
/// doorbells, as a bring-up that is refused does: every pair (those that
/// existed, re-created after the reset, and new ones) rings MMIO only, and
/// a later reset that the controller accepts the command in turns the
/// shadow doorbells on again for all of them. (Before, the reset failed and
/// left the controller failed.)
#[test]
fn dbbc_refused_after_a_reset_falls_back_to_mmio_until_a_reset_takes_it() {
    let m = model_with(2047);
    let c = shadow_controller(&m);
    assert!(c.shadow_doorbells());
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            command_timeout: None,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(qd1_with_polls(&m, &c, &mut qp, 10), 0);
    assert!(qp.shadow_doorbells());
    m.inject(Fault::Status {
        on: Match::Opcode {
            qid: 0,
            opcode: DBBC,
        },
        status: Status::INVALID_FIELD,
    });
    c.reset().unwrap();
    assert!(!c.shadow_doorbells());
    assert!(m.shadow_config().is_none());
    // The freeze makes any update that trusted the EventIdx a lost
    // doorbell: with shadow doorbells off nothing reads it.
    m.freeze_event_idx(true);
    let before = qp.stats();
    assert_eq!(qd1_with_polls(&m, &c, &mut qp, 100), 0);
    let after = qp.stats();
    assert!(!qp.shadow_doorbells());
    assert_eq!(after.sq_shadow_updates, before.sq_shadow_updates);
    assert_eq!(after.sq_doorbell_mmio - before.sq_doorbell_mmio, 100);
    // A pair created now starts with MMIO doorbells.
    let mut fresh = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    assert!(!fresh.shadow_doorbells());
    assert_eq!(qd1_with_polls(&m, &c, &mut fresh, 20), 0);
    assert_eq!(fresh.stats().sq_shadow_updates, 0);
    m.freeze_event_idx(false);

    // The next reset's Doorbell Buffer Config is taken: shadow doorbells
    // for both pairs again.
    c.reset().unwrap();
    assert!(c.shadow_doorbells());
    assert!(m.shadow_config().is_some());
    for p in [&mut qp, &mut fresh] {
        let before = p.stats();
        assert_eq!(qd1_with_polls(&m, &c, p, 20), 0);
        assert!(p.shadow_doorbells());
        assert_eq!(p.stats().sq_shadow_updates - before.sq_shadow_updates, 20);
    }
    drop(fresh);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

// ---------------------------------------------------------------------
// 5. A controller running on its own thread, as QEMU's: an MMIO doorbell
//    write only wakes it (the value is not used: with Doorbell Buffer
//    Config active QEMU reads the shadow tail in `nvme_process_sq`);
//    awake, it reads the shadow buffer, processes, writes the EventIdx
//    (the tail it read) and reads the shadow again, sleeping only when
//    nothing moved (`nvme_update_sq_eventidx` then `nvme_update_sq_tail`).
//    It never polls on its own: a doorbell the host skipped wrongly is a
//    hang, which the deadline turns into a failure.
// ---------------------------------------------------------------------

#[derive(Default)]
struct Wake {
    kicked: Mutex<bool>,
    cv: Condvar,
}

/// The device the driver sees: the model, with the I/O queues' MMIO
/// doorbells turned into wake-ups of the controller thread.
#[derive(Clone)]
struct Threaded {
    model: ModelController,
    wake: Arc<Wake>,
    intercept: Arc<AtomicBool>,
    io_mmio: Arc<AtomicU64>,
    /// Lose the I/O MMIO doorbell writes from this (1-based) one on: 0
    /// loses none (to show that the controller thread never looks at the
    /// shadow buffer on its own, so a missing wake-up is a failure).
    lose: u64,
}

impl Hooks for Threaded {
    fn model(&self) -> &ModelController {
        &self.model
    }
    fn write32(&self, offset: usize, value: u32) {
        if self.intercept.load(Ordering::SeqCst) && offset >= 0x1000 && (offset - 0x1000) / 8 != 0 {
            let n = self.io_mmio.fetch_add(1, Ordering::SeqCst) + 1;
            if self.lose != 0 && n >= self.lose {
                return;
            }
            let mut k = self.wake.kicked.lock().unwrap();
            *k = true;
            self.wake.cv.notify_one();
            return;
        }
        self.model.write32(offset, value);
    }
}

/// xorshift for the controller's lag.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn spin(iters: u64) {
    for _ in 0..iters {
        std::hint::spin_loop();
    }
}

/// The controller thread: see the section comment. `lag` bounds the spin
/// after each wake-up and between passes (the window in which the host
/// finds an EventIdx that lags). `one_pass`: a single pass per wake-up,
/// no re-reads (for the lost-doorbell run: while the host keeps the
/// shadow tail moving during each pass — a loaded machine — the re-reads
/// can carry every later command without a wake-up, and the lost
/// doorbells went unnoticed in one CI run).
fn controller_thread(
    m: ModelController,
    wake: Arc<Wake>,
    stop: Arc<AtomicBool>,
    qid: u16,
    lag: u64,
    seed: u64,
    one_pass: bool,
) -> u64 {
    let mut x = seed | 1;
    let mut passes = 0;
    loop {
        {
            let mut k = wake.kicked.lock().unwrap();
            while !*k && !stop.load(Ordering::SeqCst) {
                k = wake.cv.wait(k).unwrap();
            }
            if stop.load(Ordering::SeqCst) {
                return passes;
            }
            *k = false;
        }
        if lag > 0 {
            spin(next(&mut x) % lag);
        }
        let tails = |m: &ModelController| {
            (
                m.sq_state(qid).map(|s| s.tail),
                m.cq_state(qid).map(|c| c.head),
            )
        };
        let mut last = tails(&m);
        loop {
            // EventIdx store (end of the previous pass) before the shadow
            // load of this one, as the host fences its shadow store before
            // its EventIdx load.
            fence(Ordering::SeqCst);
            m.process_shadow();
            passes += 1;
            let now = tails(&m);
            if now == last || one_pass {
                break;
            }
            last = now;
            if lag > 0 {
                spin(next(&mut x) % lag);
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Run {
    sq: u32,
    cq: u32,
    depth: u32,
    announce: SqAnnounce,
    policy: CqHeadPolicy,
    reap_on_submit: bool,
    /// Resubmit with `queue` from the callback and `ring` after each reap
    /// (else `submit` from the callback).
    batch: bool,
    lag: u64,
    ios: u64,
    /// The controller on its own thread (else inside the MMIO write, as
    /// the model normally runs).
    threaded: bool,
    /// See [`Threaded::lose`].
    lose: u64,
    deadline: Duration,
}

struct Outcome {
    skipped: u64,
    sq_mmio: u64,
    cq_mmio: u64,
    /// "CQ full" violations (see `threaded_run`).
    cq_full: usize,
}

fn threaded_run(r: Run) -> Outcome {
    let m = model_with(2047);
    let dev = Threaded {
        model: m.clone(),
        wake: Arc::default(),
        intercept: Arc::default(),
        io_mmio: Arc::default(),
        lose: r.lose,
    };
    let c = Controller::with_device(Front(dev.clone()), opts()).unwrap();
    assert!(c.shadow_doorbells());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(r.sq),
            cq_entries: Some(r.cq),
            sq_announce: r.announce,
            cq_head_policy: r.policy,
            reap_on_submit: r.reap_on_submit,
            command_timeout: None,
            ..Default::default()
        })
        .unwrap();
    let qid = qp.qid();
    dev.intercept.store(r.threaded, Ordering::SeqCst);
    let stop = Arc::new(AtomicBool::new(false));
    let th = {
        let (m, wake, stop) = (m.clone(), dev.wake.clone(), stop.clone());
        let (lag, seed) = (r.lag, u64::from(r.sq) * 31 + u64::from(r.depth));
        let one_pass = r.lose != 0;
        std::thread::spawn(move || controller_thread(m, wake, stop, qid, lag, seed, one_pass))
    };
    let mut issued = 0u64;
    let mut done = 0u64;
    for _ in 0..r.depth {
        let b = c.alloc_dma(BS).unwrap();
        if r.batch {
            qp.queue(
                IoCommand::Read {
                    ns: &ns,
                    slba: issued % 1024,
                    blocks: 1,
                },
                Some(b),
                issued,
            )
            .unwrap();
        } else {
            read(&mut qp, &ns, b, issued);
        }
        issued += 1;
    }
    qp.ring();
    let deadline = Instant::now() + r.deadline;
    while done < r.ios {
        if Instant::now() > deadline {
            let st = qp.stats();
            let sq = m.sq_state(qid);
            let cq = m.cq_state(qid);
            stop.store(true, Ordering::SeqCst);
            dev.wake.cv.notify_one();
            panic!(
                "{r:?}: hang after {done} of {} completions ({} in flight); model SQ {sq:?} CQ {cq:?}; stats {st:?}; violations {:?}",
                r.ios,
                issued - done,
                m.violations()
            );
        }
        qp.process_completions(u32::MAX, |qp, cpl| {
            assert!(cpl.is_ok(), "{cpl:?}");
            done += 1;
            if issued < r.ios {
                let b = cpl.buffer.expect("a read's buffer");
                let cmd = IoCommand::Read {
                    ns: &ns,
                    slba: issued % 1024,
                    blocks: 1,
                };
                let res = if r.batch {
                    qp.queue(cmd, Some(b), issued)
                } else {
                    qp.submit(cmd, Some(b), issued)
                };
                res.unwrap_or_else(|e| panic!("{r:?}: resubmission refused: {:?}", e.reason));
                issued += 1;
            }
        })
        .unwrap();
        if r.batch {
            qp.ring();
        }
    }
    stop.store(true, Ordering::SeqCst);
    {
        let _k = dev.wake.kicked.lock().unwrap();
        dev.wake.cv.notify_one();
    }
    let passes = th.join().unwrap();
    assert_eq!(passes > 0, r.threaded);
    dev.intercept.store(false, Ordering::SeqCst);
    let st = qp.stats();
    if r.threaded {
        assert_eq!(
            st.sq_doorbell_mmio + st.cq_doorbell_mmio,
            dev.io_mmio.load(Ordering::SeqCst)
        );
    }
    drop(qp);
    drop(c);
    // With the controller on its own thread the model's wake reads every
    // shadow CQ head before the shadow SQ tails and posts with that head
    // (tests/src/model/shadow.rs `read_shadow`), where QEMU reads the head
    // again before each post (`nvme_post_cqes`). A host that writes its
    // CQ head and then submits between those two reads makes the model
    // post against a stale head: "CQ full" there is the harness's, and the
    // same configurations run with the synchronous model must be clean.
    let (full, other): (Vec<String>, Vec<String>) = m
        .take_violations()
        .into_iter()
        .partition(|v| v.starts_with(&format!("CQ {qid} full")));
    assert_eq!(other, Vec::<String>::new(), "{r:?}: model violations");
    if !r.threaded {
        assert_eq!(
            full,
            Vec::<String>::new(),
            "{r:?}: CQ full with a synchronous controller"
        );
    }
    assert_clean(&m);
    Outcome {
        skipped: st.mmio_skipped_by_event_idx,
        sq_mmio: st.sq_doorbell_mmio,
        cq_mmio: st.cq_doorbell_mmio,
        cq_full: full.len(),
    }
}

fn runs() -> Vec<Run> {
    let base = Run {
        sq: 7,
        cq: 13,
        depth: 6,
        announce: SqAnnounce::EachCommand,
        policy: CqHeadPolicy::default(),
        reap_on_submit: false,
        batch: false,
        lag: 2000,
        ios: 4000,
        threaded: true,
        lose: 0,
        deadline: Duration::from_secs(20),
    };
    vec![
        base,
        Run { depth: 1, ..base },
        Run {
            batch: true,
            announce: SqAnnounce::Batch,
            ..base
        },
        Run {
            batch: true,
            announce: SqAnnounce::WhenDeep { in_flight: 3 },
            ..base
        },
        Run {
            reap_on_submit: true,
            ..base
        },
        Run {
            policy: CqHeadPolicy::EveryReap,
            ..base
        },
        Run {
            policy: CqHeadPolicy::Adaptive { batch: 3 },
            batch: true,
            ..base
        },
        Run {
            sq: 13,
            cq: 7,
            depth: 6,
            ..base
        },
        Run {
            sq: 5,
            cq: 5,
            depth: 4,
            reap_on_submit: true,
            ..base
        },
        Run {
            sq: 1000,
            cq: 1999,
            depth: 64,
            batch: true,
            announce: SqAnnounce::WhenDeep { in_flight: 33 },
            ios: 20000,
            ..base
        },
        Run {
            sq: 1000,
            cq: 1001,
            depth: 999,
            batch: true,
            ios: 20000,
            ..base
        },
        Run {
            sq: 2048,
            cq: 2048,
            depth: 300,
            ios: 20000,
            lag: 0,
            ..base
        },
    ]
}

#[test]
fn a_concurrently_running_controller_never_misses_a_doorbell() {
    let mut skipped = 0;
    for r in runs() {
        let o = threaded_run(r);
        eprintln!(
            "{r:?}: sq mmio {} cq mmio {} skipped {} cq-full (harness) {}",
            o.sq_mmio, o.cq_mmio, o.skipped, o.cq_full
        );
        skipped += o.skipped;
    }
    assert!(
        skipped > 0,
        "the EventIdx never let an MMIO write be skipped: nothing tested"
    );
}

/// The harness has teeth: the controller thread only works when woken, so
/// MMIO doorbell writes that do not reach it are a hang it reports.
#[test]
fn the_threaded_harness_reports_a_lost_doorbell_as_a_hang() {
    let base = runs()[1];
    assert_eq!(base.depth, 1);
    let r = std::panic::catch_unwind(|| {
        threaded_run(Run {
            lose: 101,
            deadline: Duration::from_secs(2),
            ..base
        })
    });
    let msg = match r {
        Ok(_) => panic!("a lost doorbell went unnoticed"),
        Err(e) => e.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    assert!(msg.contains("hang after"), "{msg}");
}

/// The same configurations with the model processing inside the MMIO
/// write: no violation at all (in particular the CQ is never found full).
#[test]
fn the_same_runs_with_a_synchronous_controller_are_clean() {
    for r in runs() {
        let o = threaded_run(Run {
            threaded: false,
            ..r
        });
        assert_eq!(o.cq_full, 0);
    }
}

// ---------------------------------------------------------------------
// 6. An MMIO doorbell wakes its own queue only, as in QEMU.
// ---------------------------------------------------------------------

/// QEMU reads an I/O SQ's shadow tail only in `nvme_process_sq` of that
/// SQ, scheduled by that SQ's MMIO doorbell (or its own timer); an admin
/// doorbell processes the admin SQ. The model used to read every shadow
/// doorbell and process every SQ at any MMIO doorbell write, so a command
/// announced only in the shadow buffer was picked up at an unrelated
/// doorbell (here an admin command's): a skipped SQ MMIO write the EventIdx
/// did not allow would have gone unnoticed by any test that writes another
/// doorbell before it waits.
#[test]
fn an_unrelated_admin_doorbell_does_not_fetch_a_shadow_only_io_command() {
    let m = model_with(2047);
    let c = shadow_controller(&m);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(16),
            sq_announce: SqAnnounce::EachCommand,
            command_timeout: None,
            ..Default::default()
        })
        .unwrap();
    let qid = qp.qid();
    // EventIdx 0; the first command's MMIO write (0 -> 1) is due, the
    // second's (1 -> 2) is skipped: the second is in the shadow only.
    m.freeze_event_idx(true);
    for tag in 0..2 {
        read(&mut qp, &ns, c.alloc_dma(BS).unwrap(), tag);
    }
    assert_eq!(qp.stats().mmio_skipped_by_event_idx, 1);
    assert_eq!(
        m.sq_state(qid).unwrap().tail,
        1,
        "the shadow-only command is not fetched yet"
    );
    // An admin command: QEMU would not look at SQ `qid` here.
    c.get_features(0x07, 0, 0).unwrap();
    let tail = m.sq_state(qid).unwrap().tail;
    m.freeze_event_idx(false);
    m.process_shadow();
    let mut got = 0;
    let start = Instant::now();
    while got < 2 && start.elapsed() < T {
        got += qp.process_completions(u32::MAX, |_, _| {}).unwrap();
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
    assert_eq!(
        tail, 1,
        "an admin doorbell made the model fetch an I/O command announced only in the shadow buffer (QEMU: only SQ {qid}'s own doorbell does)"
    );
}
