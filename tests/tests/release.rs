//! The kernel asks for the device back (VFIO's device request, raised before
//! a removal or an unbind; here the model raises it): the controller's
//! watcher releases the device without waiting for the application — CC.EN
//! = 0 first, then the device's release (no DMA, the device closed) — and
//! every command in flight ends exactly once with `ControllerRemoved`, with
//! its buffer.

mod common;

use std::time::{Duration, Instant};

use common::{config_one_ns, open, opts, submit_reads};
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
