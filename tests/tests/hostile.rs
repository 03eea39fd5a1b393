//! Hostile and failing devices (issue 7 preview, design "The device is
//! untrusted input"): corrupted CIDs (unknown slot, stale generation),
//! duplicate completions, SQ heads out of range, completions with the wrong
//! phase, hand-made garbage completions on I/O and admin queues, a controller
//! that turns fatal or disappears mid-I/O, and blocking helpers that time
//! out. Each must give a typed error — never a panic, never a hang — leave
//! the controller failed where the device broke the protocol, and never hand
//! a buffer out twice or while the device may still write it.

mod common;

use std::time::{Duration, Instant};

use common::{T, admin_op, assert_clean, open, opts, read_back, setup};
use upnvme::{
    BLOCKING_TAG, Completion, Controller, ControllerOptions, Error, IoCommand, IoQueuePair,
    Namespace, QueuePairOptions, Reject, SqAnnounce,
};
use upnvme_tests::{Fault, Match, ModelConfig, ModelController};

fn read(ns: &Namespace, slba: u64) -> IoCommand<'_> {
    IoCommand::Read {
        ns,
        slba,
        blocks: 1,
    }
}

/// The handle of namespace 1 of `c`.
fn ns1(c: &Controller<ModelController>) -> Namespace {
    c.namespace(1).unwrap().clone()
}

/// A pair with 3 tracker slots (2 slot bits in the CID).
fn small_pair(c: &Controller<ModelController>) -> IoQueuePair<ModelController> {
    c.io_queue_pair(QueuePairOptions {
        entries: Some(4),
        cq_entries: Some(8),
        ..Default::default()
    })
    .unwrap()
}

/// A pair of `entries` SQ entries (and twice as many CQ entries) whose
/// queued commands wait for `ring` or the next reap: commands can be queued
/// but not yet announced.
fn batch_pair(c: &Controller<ModelController>, entries: u32) -> IoQueuePair<ModelController> {
    c.io_queue_pair(QueuePairOptions {
        entries: Some(entries),
        cq_entries: Some(2 * entries),
        sq_announce: SqAnnounce::Batch,
        ..Default::default()
    })
    .unwrap()
}

/// Asserts `r` is the DeviceFault of a completion for a command queued but
/// not yet announced (naming `cid`, when given), and that it failed the pair
/// and the controller; then closes.
fn assert_unannounced_fault(
    r: upnvme::Result<u32>,
    cid: Option<u16>,
    m: &ModelController,
    c: Controller<ModelController>,
    mut qp: IoQueuePair<ModelController>,
) {
    match r {
        Err(Error::DeviceFault { what, .. }) => {
            assert!(what.contains("not yet announced"), "{what}");
            if let Some(cid) = cid {
                assert!(what.contains(&format!("cid {cid:#06x}")), "{what}");
            }
        }
        other => panic!("expected DeviceFault, got {other:?}"),
    }
    assert_failed_everywhere(&c, &mut qp);
    drop(qp);
    c.close().unwrap();
    let _ = m.take_violations();
}

/// Collects whatever `process_completions` delivers plus its result.
fn process(qp: &mut IoQueuePair<ModelController>) -> (Vec<Completion>, upnvme::Result<u32>) {
    let mut got = Vec::new();
    let r = qp.process_completions(u32::MAX, |_, c| got.push(c));
    (got, r)
}

/// After a protocol violation: the pair, the controller's admin path and new
/// queue pairs all refuse with ControllerFailed, quickly.
fn assert_failed_everywhere(
    c: &Controller<ModelController>,
    qp: &mut IoQueuePair<ModelController>,
) {
    let start = Instant::now();
    assert!(c.failure().is_some());
    let ns = ns1(c);
    let buf = c.alloc_dma(4096).unwrap();
    let f = qp.submit(read(&ns, 0), Some(buf), 1).unwrap_err();
    assert_eq!(f.reason, Reject::Unusable);
    let e = qp.describe(f.reason);
    assert!(matches!(e, Error::ControllerFailed { .. }), "{e:?}");
    assert!(f.buffer.is_some(), "the refused buffer comes back");
    let buf = c.alloc_dma(4096).unwrap();
    let f = qp.read_blocking(&ns, 0, 1, buf, T).unwrap_err();
    assert!(
        matches!(f.error, Error::ControllerFailed { .. }),
        "{:?}",
        f.error
    );
    assert!(f.buffer.is_some());
    let (got, r) = process(qp);
    assert!(got.is_empty());
    assert!(matches!(r, Err(Error::ControllerFailed { .. })), "{r:?}");
    let r = c.get_features(0x07, 0, 0);
    assert!(matches!(r, Err(Error::ControllerFailed { .. })), "{r:?}");
    let r = c.io_queue_pair(QueuePairOptions::default());
    assert!(matches!(r, Err(Error::ControllerFailed { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[test]
fn corrupt_cid_unknown_slot_is_a_device_fault() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = small_pair(&c);
    // CID 0 (slot 0) becomes 3: slot 3 does not exist (3 slots).
    m.inject(Fault::CorruptCid {
        on: Match::Queue(qp.qid()),
        xor: 0x3,
    });
    let buf = c.alloc_dma(4096).unwrap();
    qp.submit(read(&ns1(&c), 0), Some(buf), 10).unwrap();
    let (got, r) = process(&mut qp);
    assert!(got.is_empty(), "nothing delivered for an unknown CID");
    match r {
        Err(Error::DeviceFault { what, .. }) => {
            assert!(what.contains("0x0003"), "{what}");
            assert!(what.contains("no tracker slot"), "{what}");
        }
        other => panic!("expected DeviceFault, got {other:?}"),
    }
    assert_failed_everywhere(&c, &mut qp);
    drop(qp);
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn corrupt_cid_stale_generation_is_a_device_fault() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = small_pair(&c);
    // Generation bits start above the 2 slot bits.
    m.inject(Fault::CorruptCid {
        on: Match::Queue(qp.qid()),
        xor: 1 << 2,
    });
    let buf = c.alloc_dma(4096).unwrap();
    qp.submit(read(&ns1(&c), 0), Some(buf), 10).unwrap();
    let (got, r) = process(&mut qp);
    assert!(got.is_empty());
    match r {
        Err(e @ Error::DeviceFault { .. }) => {
            let text = e.to_string();
            assert!(text.contains("stale"), "{text}");
            assert!(text.contains("marked failed"), "{text}");
        }
        other => panic!("expected DeviceFault, got {other:?}"),
    }
    assert_failed_everywhere(&c, &mut qp);
    drop(qp);
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn stale_cid_of_a_reused_slot_is_caught() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = small_pair(&c);
    // Complete a command on slot 0 normally, so slot 0's generation moves on.
    let buf = c.alloc_dma(4096).unwrap();
    let buf = qp.read_blocking(&ns1(&c), 0, 1, buf, T).unwrap();
    // The next command on slot 0 completes with the previous generation's CID.
    let old_gen_xor = 1 << 2;
    m.inject(Fault::CorruptCid {
        on: Match::Queue(qp.qid()),
        xor: old_gen_xor,
    });
    qp.submit(read(&ns1(&c), 1), Some(buf), 11).unwrap();
    let (got, r) = process(&mut qp);
    assert!(got.is_empty());
    assert!(matches!(r, Err(Error::DeviceFault { .. })), "{r:?}");
    drop(qp);
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn duplicate_completion_is_delivered_once_then_fails() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = small_pair(&c);
    m.inject(Fault::DuplicateCompletion(Match::Queue(qp.qid())));
    let buf = c.alloc_dma(4096).unwrap();
    let iova = buf.iova();
    qp.submit(read(&ns1(&c), 0), Some(buf), 42).unwrap();
    let (got, r) = process(&mut qp);
    // The genuine completion is delivered, once, with its buffer ...
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].tag, 42);
    assert!(got[0].is_ok());
    assert_eq!(got[0].buffer.as_ref().map(|b| b.iova()), Some(iova));
    // ... the copy is a protocol violation.
    match r {
        Err(Error::DeviceFault { what, .. }) => {
            assert!(what.contains("no command in flight"), "{what}")
        }
        other => panic!("expected DeviceFault, got {other:?}"),
    }
    assert_failed_everywhere(&c, &mut qp);
    drop(qp);
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn duplicate_completion_in_a_blocking_call_is_a_typed_error() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = small_pair(&c);
    m.inject(Fault::DuplicateCompletion(Match::Queue(qp.qid())));
    let buf = c.alloc_dma(4096).unwrap();
    let start = Instant::now();
    let f = qp.read_blocking(&ns1(&c), 0, 1, buf, T).unwrap_err();
    assert!(
        matches!(f.error, Error::DeviceFault { .. }),
        "{:?}",
        f.error
    );
    assert!(start.elapsed() < Duration::from_secs(1));
    let (got, r) = process(&mut qp);
    assert!(got.is_empty(), "no completion handed out a second time");
    assert!(matches!(r, Err(Error::ControllerFailed { .. })), "{r:?}");
    drop(qp);
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn sq_head_out_of_range_is_a_device_fault() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = small_pair(&c);
    m.inject(Fault::BadSqHead {
        on: Match::Queue(qp.qid()),
        sqhd: 1000,
    });
    let buf = c.alloc_dma(4096).unwrap();
    qp.submit(read(&ns1(&c), 0), Some(buf), 1).unwrap();
    let (got, r) = process(&mut qp);
    assert!(got.is_empty());
    match r {
        Err(Error::DeviceFault { what, .. }) => assert!(what.contains("1000"), "{what}"),
        other => panic!("expected DeviceFault, got {other:?}"),
    }
    assert_failed_everywhere(&c, &mut qp);
    drop(qp);
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn sq_head_moving_backwards_is_a_device_fault() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = small_pair(&c);
    for i in 0..2 {
        let buf = c.alloc_dma(4096).unwrap();
        qp.read_blocking(&ns1(&c), i, 1, buf, T).unwrap();
    }
    // The SQ head is 2 now; a completion claiming head 0 moves it backwards.
    m.inject(Fault::BadSqHead {
        on: Match::Queue(qp.qid()),
        sqhd: 0,
    });
    let buf = c.alloc_dma(4096).unwrap();
    let f = qp.read_blocking(&ns1(&c), 0, 1, buf, T).unwrap_err();
    assert!(
        matches!(f.error, Error::DeviceFault { .. }),
        "{:?}",
        f.error
    );
    drop(qp);
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn wrong_phase_completion_is_invisible_and_times_out() {
    // What happens: the entry carries the old phase, so the driver cannot
    // tell it from a stale slot and never consumes it; every later entry
    // lies behind it, so the queue pair stalls. The blocking call ends with
    // Timeout (the device may still own the buffer: None); the controller is
    // not failed, and deleting the queue pair (Delete SQ/CQ) works.
    let (m, c) = setup(ModelConfig::default());
    let mut qp = small_pair(&c);
    let qid = qp.qid();
    m.inject(Fault::WrongPhase(Match::Queue(qid)));
    let buf = c.alloc_dma(4096).unwrap();
    let start = Instant::now();
    let f = qp
        .read_blocking(&ns1(&c), 0, 1, buf, Duration::from_millis(200))
        .unwrap_err();
    let took = start.elapsed();
    assert!(matches!(f.error, Error::Timeout { .. }), "{:?}", f.error);
    assert!(f.buffer.is_none(), "the device may still own the buffer");
    assert!(took >= Duration::from_millis(200) && took < Duration::from_secs(3));
    assert_eq!(qp.in_flight(), 1);
    // The model posted it (tail moved) but the driver saw nothing.
    assert_eq!(m.cq_state(qid).unwrap().tail, 1);
    let (got, r) = process(&mut qp);
    assert!(got.is_empty());
    assert_eq!(r.unwrap(), 0);
    assert!(c.failure().is_none());
    drop(qp);
    assert!(!m.queue_exists(qid));
    drop(c);
    assert_clean(&m);
}

#[test]
fn garbage_completions_on_an_io_queue() {
    // (what the entry says, what the fault message must mention)
    let cases: [([u32; 4], &str); 4] = [
        // CID 0x0002 while nothing is in flight.
        ([0, 0, 1 << 16, 0x0002], "no command in flight"),
        // Names SQ 9 on CQ 1.
        ([0, 0, 9 << 16, 0x0000], "names SQ 9"),
        // Every bit set.
        ([u32::MAX; 4], "SQ"),
        // Plausible entry with an SQ head beyond anything submitted.
        ([0, 0, 1 << 16 | 3, 0x0000], "queue 1"),
    ];
    for (dwords, what) in cases {
        let (m, c) = setup(ModelConfig::default());
        let mut qp = small_pair(&c);
        assert_eq!(qp.qid(), 1);
        assert!(m.post_raw_completion(1, dwords));
        let (got, r) = process(&mut qp);
        assert!(got.is_empty(), "{dwords:x?}");
        match r {
            Err(Error::DeviceFault { what: w, .. }) => {
                assert!(w.contains(what), "{dwords:x?}: {w}")
            }
            other => panic!("{dwords:x?}: expected DeviceFault, got {other:?}"),
        }
        assert_failed_everywhere(&c, &mut qp);
        drop(qp);
        c.close().unwrap();
        assert_clean(&m);
    }
}

#[test]
fn garbage_completion_while_commands_are_in_flight_keeps_their_buffers() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = small_pair(&c);
    let qid = qp.qid();
    // One command held by the device, then a forged entry in front of its
    // completion.
    m.inject(Fault::DelayCompletion {
        on: Match::Queue(qid),
        doorbells: None,
    });
    let buf = c.alloc_dma(4096).unwrap();
    qp.submit(read(&ns1(&c), 0), Some(buf), 5).unwrap();
    assert!(m.post_raw_completion(qid, [0, 0, u32::from(qid) << 16 | 1, 0x0003]));
    let (got, r) = process(&mut qp);
    assert!(got.is_empty());
    assert!(matches!(r, Err(Error::DeviceFault { .. })), "{r:?}");
    // The real completion arrives later: the failed pair hands nothing out
    // (the device was untrustworthy; the buffer stays quarantined).
    assert_eq!(m.release_delayed(), 1);
    let (got, r) = process(&mut qp);
    assert!(got.is_empty(), "no buffer handed out after the fault");
    assert!(r.is_err());
    drop(qp);
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn garbage_completion_on_the_admin_queue() {
    let (m, c) = setup(ModelConfig::default());
    // CID 0xffff names no admin tracker slot (AERs hold slots 0..3).
    assert!(m.post_raw_completion(0, [0, 0, 0, 0xffff]));
    let r = c.get_features(0x07, 0, 0);
    assert!(matches!(r, Err(Error::DeviceFault { .. })), "{r:?}");
    let r = c.smart_log();
    assert!(matches!(r, Err(Error::ControllerFailed { .. })), "{r:?}");
    let r = c.poll_async_events();
    assert!(matches!(r, Err(Error::ControllerFailed { .. })), "{r:?}");
    c.close().unwrap();
    assert_clean(&m);

    // An admin completion naming an I/O SQ.
    let (m, c) = setup(ModelConfig::default());
    assert!(m.post_raw_completion(0, [0, 0, 1 << 16, 0x0000]));
    let r = c.poll_async_events();
    match r {
        Err(Error::DeviceFault { what, .. }) => assert!(what.contains("names SQ 1"), "{what}"),
        other => panic!("{other:?}"),
    }
    c.close().unwrap();
    assert_clean(&m);
}

/// How a blocking call that was cut short by a dead controller may end: a
/// typed error, and the buffer back only when the device can no longer
/// reach it (the controller was reset), never while it may still write it.
fn check_cut_short(f: &upnvme::IoFailure) {
    let text = f.error.to_string();
    let reset = text.contains("reset");
    match &f.error {
        Error::Timeout { .. }
        | Error::ControllerFatal { .. }
        | Error::ControllerGone { .. }
        | Error::ControllerFailed { .. } => {
            assert!(
                f.buffer.is_none(),
                "{text}: the device may still own the buffer"
            )
        }
        _ if reset => assert!(f.buffer.is_some(), "{text}: reset → buffer back"),
        other => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn fatal_mid_io_blocking_call_returns_an_error_without_hanging() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let buf = c.alloc_dma(4096).unwrap();
    let buf = qp.read_blocking(&ns1(&c), 0, 1, buf, T).unwrap();
    // The controller dies when the next command is fetched.
    m.inject(Fault::FatalOn(Match::Queue(qp.qid())));
    let timeout = Duration::from_millis(300);
    let start = Instant::now();
    let f = qp.read_blocking(&ns1(&c), 1, 1, buf, timeout).unwrap_err();
    let took = start.elapsed();
    assert!(took < timeout + Duration::from_secs(2), "took {took:?}");
    check_cut_short(&f);
    // The controller is either out of service (CFS seen on the admin path) or
    // was reset and works again; either way nothing hangs.
    let start = Instant::now();
    match c.get_features(0x07, 0, 0) {
        Ok(_) => assert!(m.csts() & 2 == 0, "working again only after a reset"),
        Err(Error::ControllerFatal { .. } | Error::ControllerFailed { .. }) => {
            let r = c.get_features(0x07, 0, 0);
            assert!(matches!(r, Err(Error::ControllerFailed { .. })), "{r:?}");
        }
        Err(e) => panic!("{e:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(2));
    drop(qp);
    // close() resets a fatal controller (CFS cleared); it reopens.
    c.close().unwrap();
    assert_eq!(m.csts() & 2, 0);
    let c = open(&m, opts());
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn fatal_mid_io_is_detected_before_the_timeout() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let buf = c.alloc_dma(4096).unwrap();
    m.inject(Fault::DelayCompletion {
        on: Match::Queue(qp.qid()),
        doorbells: None,
    });
    let m2 = m.clone();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        m2.set_fatal();
    });
    let start = Instant::now();
    let f = qp
        .read_blocking(&ns1(&c), 0, 1, buf, Duration::from_secs(10))
        .unwrap_err();
    let took = start.elapsed();
    killer.join().unwrap();
    assert!(
        took < Duration::from_secs(2),
        "took {took:?}: waited for the timeout"
    );
    assert!(!matches!(f.error, Error::Timeout { .. }), "{:?}", f.error);
    check_cut_short(&f);
    drop(qp);
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn unplug_mid_io_blocking_call_returns_an_error_without_hanging() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    m.inject(Fault::UnplugOn(Match::Queue(qp.qid())));
    let buf = c.alloc_dma(4096).unwrap();
    let timeout = Duration::from_millis(300);
    let start = Instant::now();
    let f = qp.read_blocking(&ns1(&c), 0, 1, buf, timeout).unwrap_err();
    assert!(start.elapsed() < timeout + Duration::from_secs(2));
    check_cut_short(&f);
    assert!(f.buffer.is_none(), "a removed device is never reset");
    assert!(m.is_unplugged());
    // The admin path reports the device gone (or the failure that says so).
    let r = c.smart_log();
    match &r {
        Err(Error::ControllerGone { .. }) => {}
        Err(e @ Error::ControllerFailed { .. }) => {
            assert!(e.to_string().contains("gone"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    let r = c.smart_log();
    assert!(matches!(r, Err(Error::ControllerFailed { .. })), "{r:?}");
    let buf = c.alloc_dma(4096).unwrap();
    let f = qp.submit(read(&ns1(&c), 0), Some(buf), 1).unwrap_err();
    assert_eq!(f.reason, Reject::Unusable);
    let e = qp.describe(f.reason);
    assert!(
        matches!(
            e,
            Error::ControllerFailed { .. } | Error::ControllerGone { .. }
        ),
        "{e:?}"
    );
    assert!(f.buffer.is_some());
    drop(qp);
    // Shutting down a device that is gone reports it, without hanging.
    let start = Instant::now();
    let r = c.close();
    assert!(matches!(r, Err(Error::ControllerGone { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_clean(&m);
}

#[test]
fn unplug_mid_io_is_detected_before_the_timeout() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    m.inject(Fault::UnplugOn(Match::Queue(qp.qid())));
    let buf = c.alloc_dma(4096).unwrap();
    let start = Instant::now();
    let f = qp
        .read_blocking(&ns1(&c), 0, 1, buf, Duration::from_secs(10))
        .unwrap_err();
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "took {took:?}: waited for the timeout"
    );
    assert!(
        matches!(f.error, Error::ControllerGone { .. }),
        "{:?}",
        f.error
    );
    assert!(f.buffer.is_none());
    let buf = c.alloc_dma(4096).unwrap();
    let f = qp.submit(read(&ns1(&c), 0), Some(buf), 1).unwrap_err();
    assert_eq!(f.reason, Reject::Unusable);
    let e = qp.describe(f.reason);
    assert!(matches!(e, Error::ControllerFailed { .. }), "{e:?}");
    assert!(f.buffer.is_some(), "the refused buffer comes back");
    drop(qp);
    let _ = c.close();
    assert_clean(&m);
}

#[test]
fn blocking_timeout_keeps_the_buffer_until_the_completion_surfaces() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let data = common::pattern(77, 4096);
    m.write_namespace_data(1, 9, &data);
    m.inject(Fault::DelayCompletion {
        on: Match::Queue(qp.qid()),
        doorbells: None,
    });
    let buf = c.alloc_dma(4096).unwrap();
    let iova = buf.iova();
    let start = Instant::now();
    let f = qp
        .read_blocking(&ns1(&c), 9, 1, buf, Duration::from_millis(100))
        .unwrap_err();
    let took = start.elapsed();
    match &f.error {
        Error::Timeout { what, after } => {
            assert!(what.contains("Read"), "{what}");
            assert!(*after >= Duration::from_millis(100));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(f.buffer.is_none(), "the device may still write the buffer");
    assert_eq!(qp.in_flight(), 1);
    // A timeout is not a device fault: the pair and the controller go on.
    assert!(c.failure().is_none());
    let (got, r) = process(&mut qp);
    assert!(got.is_empty());
    assert_eq!(r.unwrap(), 0);
    // Other commands still complete while the late one is outstanding.
    let b2 = c.alloc_dma(4096).unwrap();
    qp.read_blocking(&ns1(&c), 9, 1, b2, T).unwrap();
    // The late completion surfaces once, with the blocking tag and the buffer
    // (holding the data the device wrote).
    assert_eq!(m.release_delayed(), 1);
    let (mut got, r) = process(&mut qp);
    assert_eq!(r.unwrap(), 1);
    let cpl = got.pop().unwrap();
    assert_eq!(cpl.tag, BLOCKING_TAG);
    assert!(cpl.is_ok());
    let b = cpl
        .buffer
        .expect("the buffer comes back with the completion");
    assert_eq!(b.iova(), iova);
    assert_eq!(read_back(&b, 4096), data);
    assert_eq!(qp.in_flight(), 0);
    let (got, r) = process(&mut qp);
    assert!(got.is_empty());
    assert_eq!(r.unwrap(), 0);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn lost_completion_times_out_and_is_cleaned_up_by_queue_deletion() {
    let (m, c) = setup(ModelConfig::default());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let qid = qp.qid();
    m.inject(Fault::DropCompletion(Match::Queue(qid)));
    let buf = c.alloc_dma(4096).unwrap();
    let f = qp
        .write_blocking(&ns1(&c), 0, 1, buf, Duration::from_millis(100))
        .unwrap_err();
    assert!(matches!(f.error, Error::Timeout { .. }), "{:?}", f.error);
    assert!(f.buffer.is_none());
    assert_eq!(m.dropped_completions().len(), 1);
    // Deleting the SQ makes the controller forget the command.
    drop(qp);
    assert!(m.dropped_completions().is_empty());
    assert!(!m.queue_exists(qid));
    drop(c);
    assert_clean(&m);
}

#[test]
fn many_hostile_completions_never_panic() {
    // A sweep of forged entries at random-looking values, each on a fresh
    // controller with commands in flight: always a typed result.
    let mut x = 0x1234_5678_9abc_def0u64;
    for _ in 0..40 {
        let (m, c) = setup(ModelConfig::default());
        let mut qp = small_pair(&c);
        let qid = qp.qid();
        m.inject(Fault::DelayCompletion {
            on: Match::Queue(qid),
            doorbells: None,
        });
        let buf = c.alloc_dma(4096).unwrap();
        qp.submit(read(&ns1(&c), 0), Some(buf), 1).unwrap();
        let mut words = [0u32; 4];
        for w in &mut words {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *w = x as u32;
        }
        assert!(m.post_raw_completion(qid, words));
        let mut delivered = 0;
        let r = qp.process_completions(u32::MAX, |_, cpl| {
            delivered += 1;
            assert_eq!(cpl.tag, 1);
        });
        match r {
            Ok(n) => assert_eq!(n, delivered),
            Err(Error::DeviceFault { .. }) => assert_eq!(delivered, 0),
            Err(e) => panic!("{words:x?}: {e:?}"),
        }
        m.release_delayed();
        let _ = qp.process_completions(u32::MAX, |_, cpl| {
            delivered += 1;
            assert_eq!(cpl.tag, 1);
        });
        assert!(delivered <= 1, "{words:x?}: delivered {delivered} times");
        drop(qp);
        let _ = c.close();
        // Forged entries may leave the CQ looking fuller than the driver
        // accounted for; that is the fault's doing, not the driver's.
        let _ = m.take_violations();
        assert_eq!(m.dma_faults(), 0);
    }
}

#[test]
fn admin_command_on_a_fatal_controller_does_not_wait_for_its_timeout() {
    let m = ModelController::new(ModelConfig::default());
    let c = open(
        &m,
        ControllerOptions {
            admin_timeout: Some(Duration::from_secs(30)),
            ..opts()
        },
    );
    m.inject(Fault::FatalOn(Match::Opcode {
        qid: 0,
        opcode: admin_op::GET_LOG_PAGE,
    }));
    let start = Instant::now();
    let r = c.smart_log();
    assert!(matches!(r, Err(Error::ControllerFatal { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(2));
    c.close().unwrap();
    assert_clean(&m);
}

/// A pair dropped while the device may still DMA (its controller failed, so
/// the queues cannot be deleted) keeps every buffer its commands hold out of
/// the allocator — the vector's buffers and the separate metadata buffer as
/// well as the data buffer — until the controller is disabled.
#[test]
fn dropping_a_failed_pair_quarantines_vector_and_metadata_buffers_too() {
    let (m, c) = setup(ModelConfig {
        namespaces: vec![upnvme_tests::NamespaceConfig {
            lba_size: 512,
            blocks: 1024,
            ms: 8,
            extended: false,
            ..Default::default()
        }],
        sgls: 1,
        ..ModelConfig::default()
    });
    let ns = ns1(&c);
    let mut qp = small_pair(&c);
    let qid = qp.qid();
    let hold = || {
        m.inject(Fault::DelayCompletion {
            on: Match::Queue(qid),
            doorbells: None,
        })
    };
    hold();
    let (data, md) = (c.alloc_dma(512).unwrap(), c.alloc_dma(8).unwrap());
    let mut held = vec![(data.iova(), data.len()), (md.iova(), md.len())];
    qp.submit_io(read(&ns, 0), upnvme::IoData::buffer(data).metadata(md), 1)
        .unwrap();
    let mut v = upnvme::IoVec::new();
    for _ in 0..2 {
        let b = c.alloc_dma(256).unwrap();
        held.push((b.iova(), b.len()));
        v.push_buffer(b);
    }
    let md2 = c.alloc_dma(8).unwrap();
    held.push((md2.iova(), md2.len()));
    hold();
    qp.submit_io(read(&ns, 8), upnvme::IoData::vectored(v).metadata(md2), 2)
        .unwrap();
    // A forged entry: the controller is failed, the two commands stay with
    // the device.
    assert!(m.post_raw_completion(qid, [0, 0, u32::from(qid) << 16 | 1, 0x0003]));
    let (got, r) = process(&mut qp);
    assert!(
        got.is_empty(),
        "{:?}",
        got.iter().map(|c| (c.tag, &c.result)).collect::<Vec<_>>()
    );
    assert!(matches!(r, Err(Error::DeviceFault { .. })), "{r:?}");
    drop(qp);
    // None of the memory the device may still write is handed out again.
    let fresh: Vec<_> = [8usize, 256, 512]
        .iter()
        .flat_map(|&len| (0..8).map(move |_| len))
        .map(|len| c.alloc_dma(len).unwrap())
        .collect();
    for b in &fresh {
        for &(iova, len) in &held {
            let overlap = b.iova() < iova + len as u64 && iova < b.iova() + b.len() as u64;
            assert!(
                !overlap,
                "buffer at {:#x} (+{}) overlaps quarantined {iova:#x} (+{len})",
                b.iova(),
                b.len()
            );
        }
    }
    drop(fresh);
    c.close().unwrap();
    assert_eq!(
        m.release_delayed(),
        0,
        "the disabled controller posts nothing"
    );
}

/// A command queued from the callback but not yet announced (no SQ Tail
/// doorbell covers it) cannot have been fetched: a completion naming its
/// CID is a device fault, and its buffer does not go back (the device would
/// run the command once a doorbell announced it, into memory the caller
/// owned again).
#[test]
fn a_completion_for_a_command_not_yet_announced_is_a_device_fault() {
    let (m, c) = setup(ModelConfig::default());
    let ns = ns1(&c);
    let mut qp = batch_pair(&c, 4);
    let qid = qp.qid();
    let a = c.alloc_dma(4096).unwrap();
    qp.submit(read(&ns, 0), Some(a), 1).unwrap();
    let mut b = Some(c.alloc_dma(4096).unwrap());
    let mut got = Vec::new();
    let r = qp.process_completions(u32::MAX, |qp, cpl| {
        if cpl.tag == 1 {
            // B takes tracker slot 0 again, next generation: with 3 slots
            // (2 slot bits) its CID is 4. It sits in SQ slot 1, past the
            // committed tail 1, unannounced. The forged completion says SQ
            // head 1 (everything announced was fetched) and names CID 4.
            qp.queue(read(&ns, 1), b.take(), 2).unwrap();
            assert!(m.post_raw_completion(qid, [0, 0, (u32::from(qid) << 16) | 1, 4]));
        }
        got.push(cpl.tag);
    });
    assert_eq!(got, vec![1], "B must not be delivered");
    assert_unannounced_fault(r, None, &m, c, qp);
}

/// The same check at depth: while the callback's resubmissions wait for
/// their doorbell, completions of announced commands are still delivered,
/// and a forged one naming the second of three unannounced commands is
/// still caught (the check looks the CID's tracker up, so it costs one
/// lookup per completion, not one per queued command).
#[test]
fn at_depth_a_completion_for_an_unannounced_command_is_caught_and_the_rest_delivered() {
    let (m, c) = setup(ModelConfig::default());
    let ns = ns1(&c);
    let mut qp = batch_pair(&c, 8);
    let qid = qp.qid();
    for tag in 1..=3 {
        let a = c.alloc_dma(4096).unwrap();
        qp.submit(read(&ns, tag), Some(a), tag).unwrap();
    }
    let mut bs: Vec<_> = (0..3).map(|_| Some(c.alloc_dma(4096).unwrap())).collect();
    let mut got = Vec::new();
    let r = qp.process_completions(u32::MAX, |qp, cpl| {
        if cpl.tag == 1 {
            // 7 tracker slots (3 slot bits). B1 takes slot 0 again, next
            // generation (CID 8); B2 and B3 take the unused slots 3 and 4
            // (CIDs 3 and 4), in SQ slots 3, 4 and 5, past the committed
            // tail 3. The forged completion says SQ head 3 and names B2.
            for (i, b) in bs.iter_mut().enumerate() {
                qp.queue(read(&ns, 10 + i as u64), b.take(), 10 + i as u64)
                    .unwrap();
            }
            assert!(m.post_raw_completion(qid, [0, 0, (u32::from(qid) << 16) | 3, 3]));
        }
        got.push(cpl.tag);
    });
    assert_eq!(got, vec![1, 2, 3], "the announced commands, not B2");
    assert_unannounced_fault(r, Some(0x0003), &m, c, qp);
}

/// The unannounced-command check must not mistake an old command for a new
/// one: A stays in flight (its completion held back) while the SQ wraps
/// around and its SQ slot takes E, queued but not yet announced. A's late
/// completion is A's, and is delivered; E goes on after its doorbell.
#[test]
fn a_late_completion_whose_sq_slot_now_holds_an_unannounced_command_is_delivered() {
    let (m, c) = setup(ModelConfig::default());
    let ns = ns1(&c);
    m.write_namespace_data(1, 7, &[0xe7; 4096]);
    let mut qp = batch_pair(&c, 4);
    let qid = qp.qid();
    m.inject(Fault::DelayCompletion {
        on: Match::Queue(qid),
        doorbells: None,
    });
    // A in SQ slot 0, held back; B and C in slots 1 and 2, completed.
    qp.submit(read(&ns, 0), Some(c.alloc_dma(4096).unwrap()), 1)
        .unwrap();
    for tag in 2..=3 {
        qp.submit(read(&ns, tag), Some(c.alloc_dma(4096).unwrap()), tag)
            .unwrap();
        let mut got = Vec::new();
        while got.is_empty() {
            qp.process_completions(u32::MAX, |_, cpl| got.push(cpl.tag))
                .unwrap();
        }
        assert_eq!(got, vec![tag]);
    }
    // D in slot 3; in its completion E is queued into slot 0 (the SQ
    // wrapped), unannounced, and A's completion is posted.
    qp.submit(read(&ns, 4), Some(c.alloc_dma(4096).unwrap()), 4)
        .unwrap();
    let mut e = Some(c.alloc_dma(4096).unwrap());
    let mut got = Vec::new();
    let mut bufs = Vec::new();
    while !got.contains(&1) {
        qp.process_completions(u32::MAX, |qp, cpl| {
            if cpl.tag == 4 {
                qp.queue(read(&ns, 7), e.take(), 5).unwrap();
                assert_eq!(m.release_delayed(), 1);
            }
            got.push(cpl.tag);
            bufs.push((cpl.tag, cpl.buffer));
        })
        .unwrap();
    }
    assert_eq!(got, vec![4, 1], "A's completion is A's");
    assert!(c.failure().is_none());
    // E is announced by the next reap and completes with its data.
    let mut e_buf = None;
    while e_buf.is_none() {
        qp.process_completions(u32::MAX, |_, cpl| {
            assert_eq!(cpl.tag, 5);
            cpl.result.unwrap();
            e_buf = cpl.buffer;
        })
        .unwrap();
    }
    assert_eq!(read_back(&e_buf.unwrap(), 4096), vec![0xe7; 4096]);
    drop(bufs);
    drop(qp);
    c.close().unwrap();
    assert!(m.take_violations().is_empty());
}

/// The check covers the other two places that record an SQE's slot: a
/// split's children (each pushed after all are staged), and a command
/// pushed by the retry after the SQ looked full (`sq_full`).
#[test]
fn a_completion_for_an_unannounced_split_child_is_a_device_fault() {
    let (m, c) = setup(ModelConfig {
        mdts: 1, // 8 KiB per command: a 12 KiB read is a split of 2
        ..ModelConfig::default()
    });
    let ns = ns1(&c);
    let mut qp = batch_pair(&c, 8);
    let qid = qp.qid();
    qp.submit(read(&ns, 0), Some(c.alloc_dma(4096).unwrap()), 1)
        .unwrap();
    let mut b = Some(c.alloc_dma(3 * 4096).unwrap());
    let mut got = Vec::new();
    let r = qp.process_completions(u32::MAX, |qp, cpl| {
        if cpl.tag == 1 {
            // The children take tracker slot 0 again (CID 8) and slot 1
            // (CID 1), in SQ slots 1 and 2, unannounced; the forged
            // completion names the second child.
            let cmd = IoCommand::Read {
                ns: &ns,
                slba: 4,
                blocks: 3,
            };
            qp.queue(cmd, b.take(), 2).unwrap();
            assert!(m.post_raw_completion(qid, [0, 0, (u32::from(qid) << 16) | 1, 1]));
        }
        got.push(cpl.tag);
    });
    assert_eq!(got, vec![1]);
    assert_unannounced_fault(r, Some(0x0001), &m, c, qp);
}

/// See above: the command the retried push put into the SQ.
#[test]
fn a_completion_for_a_command_pushed_after_the_sq_looked_full_is_checked_too() {
    let (m, c) = setup(ModelConfig::default());
    let ns = ns1(&c);
    let mut qp = batch_pair(&c, 4);
    let qid = qp.qid();
    // Three completions that leave the SQ head at 0: head 0, tail 3.
    for lba in 0..2 {
        m.inject(Fault::BadSqHead {
            on: Match::Queue(qid),
            sqhd: 0,
        });
        qp.read_blocking(&ns, lba, 1, c.alloc_dma(4096).unwrap(), T)
            .unwrap();
    }
    m.inject(Fault::BadSqHead {
        on: Match::Queue(qid),
        sqhd: 0,
    });
    qp.submit(read(&ns, 2), Some(c.alloc_dma(4096).unwrap()), 1)
        .unwrap();
    let mut b = Some(c.alloc_dma(4096).unwrap());
    let mut got = Vec::new();
    let r = qp.process_completions(u32::MAX, |qp, cpl| {
        if cpl.tag == 1 {
            // The SQ looks full; every announced command has completed, so
            // the retried push puts B into slot 3 (CID 0Ch), unannounced.
            qp.queue(read(&ns, 3), b.take(), 2).unwrap();
            assert!(m.post_raw_completion(qid, [0, 0, (u32::from(qid) << 16) | 3, 0xc]));
        }
        got.push(cpl.tag);
    });
    assert_eq!(got, vec![1]);
    assert_unannounced_fault(r, Some(0x000c), &m, c, qp);
}

/// A device whose completions never move the SQ head (SQHD always 0, which
/// is the head the host knows, so each is accepted) would leave the SQ
/// "full" with nothing in flight, refusing every command for ever. Every
/// command the pair announced has completed, so the controller fetched them
/// all: the pair takes the SQ as consumed, and single commands and a split
/// go on (the split used to fail the pair halfway and return `Ok`).
#[test]
fn an_sq_head_that_never_moves_does_not_fill_the_queue() {
    let (m, c) = setup(ModelConfig {
        mdts: 1, // 8 KiB per command: a 12 KiB read is a split of 2
        ..ModelConfig::default()
    });
    let ns = ns1(&c);
    m.write_namespace_data(1, 5, &[0x5a; 4096]);
    let mut qp = small_pair(&c);
    let qid = qp.qid();
    for lba in 0..3 {
        m.inject(Fault::BadSqHead {
            on: Match::Queue(qid),
            sqhd: 0,
        });
        let buf = c.alloc_dma(4096).unwrap();
        qp.read_blocking(&ns, lba, 1, buf, T).unwrap();
    }
    // Head 0, tail 3 of 4 entries: the SQ ring is full, nothing in flight.
    assert_eq!(qp.in_flight(), 0);
    let buf = c.alloc_dma(4096).unwrap();
    let buf = qp.read_blocking(&ns, 5, 1, buf, T).unwrap();
    assert_eq!(read_back(&buf, 4096), vec![0x5a; 4096]);
    assert!(c.failure().is_none());
    // Again two stuck completions, then a split of 2 with one SQ slot free
    // by the head the device reported.
    for lba in 0..2 {
        m.inject(Fault::BadSqHead {
            on: Match::Queue(qid),
            sqhd: 0,
        });
        let buf = c.alloc_dma(4096).unwrap();
        qp.read_blocking(&ns, lba, 1, buf, T).unwrap();
    }
    let buf = c.alloc_dma(3 * 4096).unwrap();
    let buf = qp.read_blocking(&ns, 3, 3, buf, T).unwrap();
    assert_eq!(read_back(&buf, 3 * 4096)[2 * 4096..], [0x5a; 4096]);
    assert!(c.failure().is_none(), "{:?}", c.failure());
    drop(qp);
    c.close().unwrap();
    assert_clean(&m);
}

/// A frozen SQHD with completions already waiting in the CQ: three reads
/// complete, each reporting head 0; the first one's callback queues a
/// fourth while the other two are still to be reaped. The SQ looks full
/// (head 0, tail 3 of 4) and the pair does not infer the head: the two
/// waiting completions carry an SQHD taken before any inference, which new
/// SQEs in the freed slots would make ambiguous. The fourth read is refused
/// as `QueueFull` — a refusal, not a `DeviceFault` (a review found a first
/// version that inferred here failing the controller on the next
/// completion) — and goes in once the others are reaped.
#[test]
fn a_frozen_sq_head_with_completions_waiting_refuses_and_does_not_fault() {
    let (m, c) = setup(ModelConfig::default());
    let ns = ns1(&c);
    let mut qp = batch_pair(&c, 4);
    let qid = qp.qid();
    assert!(m.freeze_sq_head(qid, true));
    for lba in 0..3 {
        qp.submit(read(&ns, lba), Some(c.alloc_dma(4096).unwrap()), lba)
            .unwrap();
    }
    let mut extra = Some(c.alloc_dma(4096).unwrap());
    let mut got = Vec::new();
    let mut refusals = 0;
    let r = qp.process_completions(u32::MAX, |qp, cpl| {
        if cpl.tag == 0 {
            // Two announced reads are still out (their completions wait).
            assert_eq!(qp.in_flight(), 2);
            let b = extra.take();
            let e = qp.queue(read(&ns, 3), b, 3).unwrap_err();
            assert!(matches!(e.reason, Reject::QueueFull), "{e:?}");
            refusals += 1;
            extra = e.buffer;
        }
        assert!(cpl.result.is_ok(), "{:?}", cpl.result);
        got.push(cpl.tag);
    });
    r.unwrap();
    assert_eq!((refusals, got.len()), (1, 3), "{got:?}");
    assert!(c.failure().is_none(), "{:?}", c.failure());
    // Every announced command is reaped now: the SQ has room again.
    let buf = qp
        .read_blocking(&ns, 3, 1, extra.take().unwrap(), T)
        .expect("the fourth read, once the others are reaped");
    drop(buf);
    assert!(c.failure().is_none(), "{:?}", c.failure());
    drop(qp);
    c.close().unwrap();
    assert_clean(&m);
}

/// A controller with an 8-entry admin queue whose SQ head the model keeps
/// where it is from now on, and the number of AERs outstanding (at least 2).
fn frozen_admin_sq_head() -> (ModelController, Controller<ModelController>, usize) {
    let m = ModelController::new(ModelConfig::default());
    let c = open(
        &m,
        ControllerOptions {
            admin_queue_entries: 8,
            ..opts()
        },
    );
    assert!(m.freeze_sq_head(0, true));
    let aers = m.outstanding_async_requests();
    assert!(aers >= 2, "{aers} AERs outstanding");
    (m, c, aers)
}

/// The admin queue follows the I/O queues' rule: a device whose admin SQHD
/// never moves (with Asynchronous Event Requests outstanding, which stay in
/// flight) does not run the admin queue out of room. Before, the admin
/// queue refused every command after `entries − 1` of them as "admin queue
/// full", an `InvalidArgument` that blamed the caller.
#[test]
fn an_admin_sq_head_that_never_moves_does_not_fill_the_admin_queue() {
    let (m, c, aers) = frozen_admin_sq_head();
    // Three times round the 8-entry ring, AERs outstanding all along.
    for i in 0..24 {
        c.identify_controller()
            .unwrap_or_else(|e| panic!("admin command {i}: {e}"));
    }
    assert!(c.failure().is_none(), "{:?}", c.failure());
    assert_eq!(m.outstanding_async_requests(), aers);
    assert!(m.freeze_sq_head(0, false));
    c.identify_controller().unwrap();
    c.close().unwrap();
    assert_clean(&m);
}

/// With the admin SQHD frozen, asynchronous events keep coming: each is
/// reaped and its request re-posted, at every fill level of the admin ring,
/// and admin commands go on between them.
#[test]
fn an_admin_sq_head_that_never_moves_keeps_async_events_flowing() {
    let (m, c, aers) = frozen_admin_sq_head();
    for i in 0..24u8 {
        // SMART / Health (type 1); reading log 02h unmasks the type again.
        m.raise_async_event(1, i, 0x02);
        let events = c
            .poll_async_events()
            .unwrap_or_else(|e| panic!("event {i}: {e}"));
        assert_eq!(events.len(), 1, "event {i}: {events:?}");
        c.smart_log()
            .unwrap_or_else(|e| panic!("admin command after event {i}: {e}"));
    }
    assert!(c.failure().is_none(), "{:?}", c.failure());
    // Every request came back (re-posted at the latest by the last poll).
    c.poll_async_events().unwrap();
    assert_eq!(m.outstanding_async_requests(), aers);
    assert!(m.freeze_sq_head(0, false));
    c.close().unwrap();
    assert_clean(&m);
}

/// The controller only reads submission queues: the driver maps them
/// without the device's write permission. A device that writes back a
/// command it fetched (the model, here on an I/O read's SQE and on an
/// Identify's admin SQE) takes a DMA fault instead — what an IOMMU does —
/// and the command runs as it was written. Were the SQ writable, a device
/// could rewrite a queued command's CID after the driver's checks read it
/// (the unannounced-completion check reads it back from the SQ).
#[test]
fn a_device_cannot_rewrite_a_submission_queue_entry() {
    let (m, c) = setup(ModelConfig::default());
    let ns = ns1(&c);
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    m.inject(Fault::RewriteSqe(Match::Queue(1)));
    let buf = qp
        .read_blocking(&ns, 0, 1, c.alloc_dma(4096).unwrap(), T)
        .expect("the read runs as written");
    drop(buf);
    m.inject(Fault::RewriteSqe(Match::Queue(0)));
    c.identify_controller()
        .expect("the Identify runs as written");
    let log = m.dma_fault_log();
    assert_eq!(m.dma_faults(), 2, "{log:?}");
    for (entry, q) in log.iter().zip([1, 0]) {
        assert!(
            entry.starts_with(&format!("SQ {q} entry rewrite: DMA write fault"))
                && entry.ends_with("mapped for device reads only"),
            "{log:?}"
        );
    }
    drop(qp);
    drop(c);
    assert_eq!(m.violations(), Vec::<String>::new());
}

/// What the device may write, by the memory's use: the SQs and every list
/// page (PRP Lists, Dataset Management ranges) read-only; the CQ and the data
/// buffers read-write.
#[test]
fn submission_queues_and_list_pages_are_mapped_for_device_reads_only() {
    use upnvme::dma::DeviceAccess::{ReadOnly, ReadWrite};
    let (m, c) = setup(ModelConfig::default());
    let ns = ns1(&c);
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // 64 KiB: PRP1 and a PRP List (the model has no SGLs).
    let buf = qp
        .read_blocking(&ns, 0, 16, c.alloc_dma(16 * 4096).unwrap(), T)
        .unwrap();
    let ranges = [upnvme::DsmRange {
        cattr: 0,
        nlb: 1,
        slba: 3,
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
    let qword = |sqe: &[u8; 64], at: usize| u64::from_le_bytes(sqe[at..at + 8].try_into().unwrap());
    let (prp1, prp2) = (24, 32);
    let cmds = m.recent_commands();
    let find = |qid: u16, opcode: u8| {
        cmds.iter()
            .rev()
            .find(|(q, sqe)| *q == qid && sqe[0] == opcode)
            .map(|(_, sqe)| *sqe)
            .unwrap_or_else(|| panic!("no opcode {opcode:#04x} on queue {qid}"))
    };
    // Create I/O CQ (05h) and Create I/O SQ (01h): the queues' bases.
    assert_eq!(
        m.device_access(qword(&find(0, 0x05), prp1)),
        Some(ReadWrite)
    );
    assert_eq!(m.device_access(qword(&find(0, 0x01), prp1)), Some(ReadOnly));
    // The read (02h): its data read-write, its PRP List read-only.
    let read = find(1, 0x02);
    assert_eq!(qword(&read, prp1), buf.iova());
    assert_eq!(m.device_access(qword(&read, prp1)), Some(ReadWrite));
    assert_eq!(m.device_access(qword(&read, prp2)), Some(ReadOnly));
    // Dataset Management (09h): its ranges read-only.
    assert_eq!(m.device_access(qword(&find(1, 0x09), prp1)), Some(ReadOnly));
    assert_eq!(c.read_only_memory(), upnvme::ReadOnlyMemory::Enforced);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// Where read-only memory cannot be had (here an IOMMU that refuses the
/// mapping) the SQs and list pages come from read-write memory and the
/// driver works as before — and says so: `Controller::read_only_memory`
/// counts the allocations and gives the reason.
#[test]
fn read_only_memory_that_falls_back_is_reported() {
    use upnvme::dma::DeviceAccess::ReadWrite;
    let (m, c) = setup(ModelConfig {
        refuse_read_only_mappings: true,
        ..ModelConfig::default()
    });
    let ns = ns1(&c);
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    m.write_namespace_data(1, 0, &[0x3c; 16 * 4096]);
    let buf = qp
        .read_blocking(&ns, 0, 16, c.alloc_dma(16 * 4096).unwrap(), T)
        .unwrap();
    assert_eq!(read_back(&buf, 16 * 4096), vec![0x3c; 16 * 4096]);
    let create_sq = m
        .recent_commands()
        .into_iter()
        .rev()
        .find(|(q, sqe)| *q == 0 && sqe[0] == 0x01)
        .map(|(_, sqe)| u64::from_le_bytes(sqe[24..32].try_into().unwrap()))
        .expect("a Create I/O SQ");
    assert_eq!(m.device_access(create_sq), Some(ReadWrite));
    match c.read_only_memory() {
        upnvme::ReadOnlyMemory::FellBack {
            allocations,
            reason,
        } => {
            // The admin SQ, the I/O SQ and its list pages at least.
            assert!(allocations >= 3, "{allocations}");
            assert!(reason.contains("refuses read-only mappings"), "{reason}");
        }
        other => panic!("want FellBack, got {other:?}"),
    }
    assert!(c.read_only_memory().to_string().starts_with("read-write"));
    drop(qp);
    drop(c);
    assert_clean(&m);
}
