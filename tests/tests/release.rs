//! The kernel asks for the device back (VFIO's device request, raised before
//! a removal or an unbind; here the model raises it): the controller's
//! watcher releases the device without waiting for the application — CC.EN
//! = 0 first, then the device's release (no DMA, the device closed) — and
//! every command in flight ends exactly once with `ControllerRemoved`, with
//! its buffer.

mod common;

use std::time::{Duration, Instant};

use common::{Front, Unstoppable, config_one_ns, open, opts, submit_reads};
use upnvme::{Error, IoCommand, IoError, QueuePairOptions, Reject};
use upnvme_tests::{Fault, Match, ModelController};

fn wait_released(m: &ModelController) -> Duration {
    let start = Instant::now();
    while !m.is_released() {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "the device was not released within 2 s of the request"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    start.elapsed()
}

#[test]
fn a_release_request_ends_every_command_once_with_its_buffer() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    for _ in 0..4 {
        m.inject(Fault::DelayCompletion {
            on: Match::Queue(1),
            doorbells: None,
        });
    }
    submit_reads(&c, &mut qp, 4);
    assert_eq!(qp.in_flight(), 4);
    m.request_release();
    wait_released(&m);
    assert!(m.disabled_before_release(), "CC.EN = 0 before the release");

    let mut ended = Vec::new();
    let start = Instant::now();
    while ended.len() < 4 && start.elapsed() < Duration::from_secs(5) {
        let _ = qp.process_completions(u32::MAX, |_, c| {
            assert_eq!(c.result, Err(IoError::ControllerRemoved), "tag {}", c.tag);
            assert!(
                c.buffer.is_some(),
                "tag {} comes back with its buffer",
                c.tag
            );
            ended.push(c.tag);
        });
    }
    ended.sort();
    assert_eq!(ended, [0, 1, 2, 3], "each command ends exactly once");
    assert_eq!(qp.in_flight(), 0);
    // Nothing more is delivered, and new commands are refused with the reason.
    let mut more = 0;
    let err = qp
        .process_completions(u32::MAX, |_, _| more += 1)
        .unwrap_err();
    assert_eq!(more, 0);
    assert!(matches!(err, Error::ControllerRemoved { .. }), "{err:?}");
    let f = qp
        .submit(
            IoCommand::Read {
                ns: &ns,
                slba: 0,
                blocks: 1,
            },
            Some(c.alloc_dma(4096).unwrap()),
            9,
        )
        .unwrap_err();
    assert_eq!(f.reason, Reject::Unusable);
    assert!(f.buffer.is_some());
    assert_eq!(
        qp.describe(f.reason).to_string(),
        "controller model was released because the kernel asked for it (device removal or vfio-pci unbind); open it again once it is back (`upnvme setup bind`)"
    );
    drop(qp);
    drop(c);
}

#[test]
fn an_idle_controller_is_released_without_any_call() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = open(&m, opts());
    m.request_release();
    wait_released(&m);
    assert!(matches!(
        c.identify_namespace(1),
        Err(Error::ControllerRemoved { .. })
    ));
    drop(c);
}

#[test]
fn without_a_request_nothing_is_released() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = open(&m, opts());
    std::thread::sleep(Duration::from_millis(300));
    assert!(!m.is_released());
    drop(c);
    // Dropped without a request: the watcher ends, nothing is released.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!m.is_released());
}

#[test]
fn a_closed_controller_whose_pairs_live_on_is_still_released() {
    // The queue pair keeps the controller (and so the device file) alive
    // after `close`: the kernel's request must still get the device back.
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = open(&m, opts());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    c.close().unwrap();
    assert!(!m.is_released(), "closing alone gives nothing back");
    m.request_release();
    wait_released(&m);
    let err = qp.process_completions(u32::MAX, |_, _| {}).unwrap_err();
    assert!(matches!(err, Error::ControllerRemoved { .. }), "{err:?}");
    drop(qp);
}

/// A release request for a controller that neither disables (CSTS.RDY
/// stays 1) nor can be released: nothing the device may still write is
/// handed back — the command stays in flight with its buffer, and the
/// pair's queue memory is kept — so the late completion the model posts
/// afterwards lands in memory nobody was given again.
#[test]
fn an_unconfirmed_release_hands_back_nothing_the_device_may_still_write() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let dev = Unstoppable::new(&m);
    let stubborn = dev.stubborn.clone();
    let c = upnvme::Controller::with_device(Front(dev), opts()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(2),
            cq_entries: Some(256),
            ..Default::default()
        })
        .unwrap();
    m.inject(Fault::DelayCompletion {
        on: Match::Queue(qp.qid()),
        doorbells: None,
    });
    qp.read(&ns, 0, 1, c.alloc_dma(4096).unwrap(), 5).unwrap();
    stubborn.store(true, std::sync::atomic::Ordering::SeqCst);
    m.request_release();
    // Until the release has run (the pair then reports the controller
    // unusable): nothing comes back meanwhile or after.
    let mut back = Vec::new();
    let start = Instant::now();
    let mut r = Ok(0);
    while start.elapsed() < Duration::from_secs(10) {
        r = qp.process_completions(u32::MAX, |_, c| back.push(c));
        if r.is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(matches!(r, Err(Error::ControllerRemoved { .. })), "{r:?}");
    for _ in 0..10 {
        let _ = qp.process_completions(u32::MAX, |_, c| back.push(c));
    }
    assert_eq!(m.csts() & 1, 1, "the controller never disabled");
    assert!(
        back.iter().all(|c| c.buffer.is_none()),
        "a buffer came back while the device may still write it"
    );
    assert_eq!(qp.in_flight(), 1, "the command stays in flight");
    drop(qp);
    // Memory handed out again: marked, and checked after the late CQE.
    let bufs: Vec<_> = (0..64)
        .map(|_| {
            let b = c.alloc_dma(4096).unwrap();
            b.write_bytes(0, &[0xa5; 4096]).unwrap();
            b
        })
        .collect();
    assert_eq!(
        m.release_delayed(),
        1,
        "the model posts its late completion"
    );
    let touched = bufs
        .iter()
        .filter(|b| b.to_vec().iter().any(|&x| x != 0xa5))
        .count();
    assert_eq!(touched, 0, "the device wrote into memory handed out again");
}

/// `Controller::reset` on a controller the kernel asked back says
/// `ControllerRemoved` (how to get the device back), as every other call
/// does, not `Closed` (the application never closed it).
#[test]
fn reset_after_a_removal_says_removed() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = open(&m, opts());
    m.request_release();
    let start = Instant::now();
    while !m.is_released() {
        assert!(start.elapsed() < Duration::from_secs(2), "not released");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(matches!(
        c.identify_controller(),
        Err(Error::ControllerRemoved { .. })
    ));
    let r = c.reset();
    assert!(
        matches!(r, Err(Error::ControllerRemoved { .. })),
        "reset after a removal: {r:?}"
    );
}

/// An admin command waiting for its completion when the kernel asks for the
/// device back meets the released device's all-ones registers: it ends with
/// `ControllerRemoved`, as every later call does (it said `ControllerGone`,
/// "hot-removed, reset by someone else, or its PCI link is down").
#[test]
fn an_admin_command_in_flight_at_a_release_ends_with_controller_removed() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = open(&m, opts());
    // The next Get Log Page is held by the controller.
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode {
            qid: 0,
            opcode: 0x02,
        },
        doorbells: None,
    });
    let r = std::thread::scope(|s| {
        let waiter = s.spawn(|| c.smart_log());
        let start = Instant::now();
        while !m
            .commands_seen()
            .iter()
            .any(|&(q, op, _)| q == 0 && op == 0x02)
        {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "no Get Log Page seen"
            );
            std::thread::yield_now();
        }
        m.request_release();
        wait_released(&m);
        waiter.join().unwrap()
    });
    assert!(
        matches!(r, Err(Error::ControllerRemoved { .. })),
        "an admin command cut by the release: {r:?}"
    );
}

/// A Controller::reset in progress (its Identify Controller held by the
/// controller) when the kernel asks for the device back ends with
/// `ControllerRemoved` too (the reset runs its admin commands outside
/// `with_admin`; a review found it said `ControllerGone`).
#[test]
fn a_reset_cut_by_a_release_ends_with_controller_removed() {
    let m = ModelController::new(common::config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = common::open(&m, common::opts());
    let seen_before = m
        .commands_seen()
        .iter()
        .filter(|&&(q, op, _)| q == 0 && op == 0x06)
        .count();
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode {
            qid: 0,
            opcode: 0x06,
        },
        doorbells: None,
    });
    let r = std::thread::scope(|s| {
        let waiter = s.spawn(|| c.reset());
        let start = Instant::now();
        while m
            .commands_seen()
            .iter()
            .filter(|&&(q, op, _)| q == 0 && op == 0x06)
            .count()
            == seen_before
        {
            assert!(start.elapsed() < Duration::from_secs(5), "no Identify seen");
            std::thread::yield_now();
        }
        m.request_release();
        wait_released(&m);
        waiter.join().unwrap()
    });
    assert!(
        matches!(r, Err(Error::ControllerRemoved { .. })),
        "a reset cut by the release: {r:?}"
    );
}

/// A poll whose namespace check (every poll checks with `async_events: 0`)
/// is cut by a release: the next call says `ControllerRemoved`.
#[test]
fn a_blind_check_cut_by_a_release_ends_with_controller_removed() {
    let m = ModelController::new(common::config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = common::open(
        &m,
        upnvme::ControllerOptions {
            async_events: 0,
            ..common::opts()
        },
    );
    m.inject(Fault::DelayCompletion {
        on: Match::Identify { cns: 0, nsid: 1 },
        doorbells: None,
    });
    let r = std::thread::scope(|s| {
        let waiter = s.spawn(|| c.poll_async_events());
        let start = Instant::now();
        while m.delayed_completions() == 0 {
            assert!(start.elapsed() < Duration::from_secs(5), "no Identify held");
            std::thread::yield_now();
        }
        m.request_release();
        wait_released(&m);
        waiter.join().unwrap()
    });
    // The cut check keeps its events (`Ok`) or names the release; either
    // way the next call says what happened.
    assert!(
        matches!(r, Ok(_) | Err(Error::ControllerRemoved { .. })),
        "a poll cut by the release: {r:?}"
    );
    let next = c.poll_async_events();
    assert!(
        matches!(next, Err(Error::ControllerRemoved { .. })),
        "the call after the release: {next:?}"
    );
}
