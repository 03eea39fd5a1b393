//! `IoQueuePair::close` hands back every command not yet delivered, exactly
//! once, with its buffer: completed ones with their result, ones the queue
//! deletion aborted with the controller's status, and (were any left) the
//! rest with `IoError::QueueDeleted`.

mod common;

use std::time::Duration;

use common::{assert_clean, config_one_ns, open, opts, submit_reads};
use upnvme::QueuePairOptions;
use upnvme_tests::{Fault, Match, ModelController};

#[test]
fn close_delivers_completed_commands_once() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    let c = open(&m, opts());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    submit_reads(&c, &mut qp, 4);
    let mut got = qp.close(Duration::from_secs(2));
    got.sort_by_key(|c| c.tag);
    assert_eq!(got.iter().map(|c| c.tag).collect::<Vec<_>>(), [0, 1, 2, 3]);
    for c in &got {
        assert!(c.result.is_ok(), "{c:?}");
        assert!(c.buffer.is_some());
    }
    drop(c);
    assert_clean(&m);
}

#[test]
fn close_hands_back_commands_the_device_holds_after_deleting_the_queues() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    let c = open(&m, opts());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    for _ in 0..3 {
        m.inject(Fault::DelayCompletion {
            on: Match::Queue(1),
            doorbells: None,
        });
    }
    submit_reads(&c, &mut qp, 5);
    let mut got = qp.close(Duration::from_millis(50));
    got.sort_by_key(|c| c.tag);
    assert_eq!(
        got.iter().map(|c| c.tag).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4],
        "every command exactly once: {got:?}"
    );
    assert!(got.iter().all(|c| c.buffer.is_some()), "with its buffer");
    // Four completed normally (the three faults all match the first command
    // fetched); the held one ended with the deletion (the model completes it
    // with Command Aborted due to SQ Deletion).
    assert_eq!(
        got.iter().filter(|c| c.result.is_ok()).count(),
        4,
        "{got:?}"
    );
    assert_eq!(got[0].result, Err(upnvme::IoError::QueueDeleted));
    drop(c);
    assert_clean(&m);
}
