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

/// close() while another thread resets: every command submitted comes
/// back exactly once, whichever way the race goes (before, a reset between
/// close's reading of the generation and its Delete left close without the
/// commands, and the pair's drop then freed their buffers unseen).
#[test]
fn close_racing_a_reset_delivers_every_command() {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;
    let m = upnvme_tests::ModelController::new(common::config_one_ns(4096, 1024));
    let c = common::open(&m, common::opts());
    let stop = AtomicBool::new(false);
    let (lost, rounds) = std::thread::scope(|s| {
        let resetter = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let _ = c.reset();
            }
        });
        let (mut lost, mut rounds) = (0u64, 0u64);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(3) {
            let Ok(mut qp) = c.io_queue_pair(QueuePairOptions::default()) else {
                continue;
            };
            m.clear_faults();
            for _ in 0..2 {
                m.inject(upnvme_tests::Fault::DelayCompletion {
                    on: upnvme_tests::Match::Queue(qp.qid()),
                    doorbells: None,
                });
            }
            let ns = c.namespace(1).unwrap().clone();
            let mut sent = 0u64;
            for tag in 0..4u64 {
                if qp
                    .read(&ns, tag, 1, c.alloc_dma(4096).unwrap(), tag)
                    .is_ok()
                {
                    sent += 1;
                }
            }
            let got = qp.close(Duration::ZERO);
            let tags: HashSet<u64> = got.iter().map(|c| c.tag).collect();
            assert_eq!(tags.len(), got.len(), "twice: {got:?}");
            assert!(got.iter().all(|c| c.buffer.is_some()), "{got:?}");
            lost += sent - got.len() as u64;
            rounds += 1;
        }
        stop.store(true, Ordering::Relaxed);
        resetter.join().unwrap();
        (lost, rounds)
    });
    assert!(rounds > 10, "{rounds} rounds");
    assert_eq!(
        lost, 0,
        "commands lost by close() racing a reset ({rounds} rounds)"
    );
}

/// close(timeout)'s drain keeps to its timeout when the pair's command
/// timeout recovery would wait longer: a read whose completion the model
/// lost is overdue after 20 ms, and the Abort for it gets no answer either
/// (a 10 s admin timeout). A 200 ms close must go on to the queue deletion
/// at about 200 ms and hand the read back once, with its buffer — not wait
/// out the Abort first (from a review: the drain's `process_completions`
/// ran the timeout scan with no regard for close's timeout, and the close
/// took the whole admin timeout).
#[test]
fn close_keeps_to_its_timeout_when_an_abort_would_wait_longer() {
    use std::time::Instant;
    const READ: u8 = 0x02;
    const ABORT: u8 = 0x08;
    let m = ModelController::new(config_one_ns(4096, 1024));
    let c = open(
        &m,
        upnvme::ControllerOptions {
            admin_timeout: Some(Duration::from_secs(10)),
            ..opts()
        },
    );
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            command_timeout: Some(Duration::from_millis(20)),
            ..Default::default()
        })
        .unwrap();
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: qp.qid(),
        opcode: READ,
    }));
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: 0,
        opcode: ABORT,
    }));
    submit_reads(&c, &mut qp, 1);
    let start = Instant::now();
    let got = qp.close(Duration::from_millis(200));
    let took = start.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].tag, 0);
    assert!(got[0].buffer.is_some());
    m.clear_faults();
    drop(c);
    assert_clean(&m);
}
