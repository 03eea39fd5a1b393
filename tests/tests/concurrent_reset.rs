//! Resets from another thread while a queue pair runs a verified closed loop
//! (the host-side twin of the guest test
//! `reliability::resets_from_another_thread_end_every_command_once`): every
//! command ends exactly once, with its buffer, the loop never stalls, and no
//! doorbell is written for a queue the reset deleted.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{config_one_ns, open, opts};
use upnvme::Device as _;
use upnvme::{IoCommand, QueuePairOptions};
use upnvme_tests::ModelController;

#[test]
fn resets_from_another_thread_end_every_command_once() {
    let m = ModelController::new(config_one_ns(512, 4096));
    let c = open(
        &m,
        upnvme::ControllerOptions {
            shadow_doorbells: true,
            ..opts()
        },
    );
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let depth = 32usize.min(qp.max_depth() as usize);
    let total = 400_000u64;
    let stop = AtomicBool::new(false);
    // Stops the resetter however this thread leaves the scope (a failed
    // assertion must fail the test, not leave the scope waiting forever).
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let resets = std::thread::scope(|s| {
        let resetter = s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
                c.reset().expect("reset from the management thread");
                n += 1;
            }
            n
        });
        let _stop = StopOnDrop(&stop);
        let mut pool: Vec<_> = (0..depth).map(|_| c.alloc_dma(512).unwrap()).collect();
        let mut results = HashMap::new();
        let mut next = 0u64;
        let start = Instant::now();
        while next < total || pool.len() < depth {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "stalled: next {next}, {} back, {} buffers home, in flight {}, {:?}",
                results.len(),
                pool.len(),
                qp.in_flight(),
                qp.stats()
            );
            while next < total
                && let Some(buf) = pool.pop()
            {
                let cmd = IoCommand::Write {
                    ns: &ns,
                    slba: next % 4096,
                    blocks: 1,
                };
                if let Err(e) = qp.submit(cmd, Some(buf), next) {
                    panic!("submit {next}: {}", qp.describe(e.reason));
                }
                next += 1;
            }
            qp.process_completions(u32::MAX, |_, cpl| {
                pool.push(cpl.buffer.expect("every completion returns its buffer"));
                assert!(results.insert(cpl.tag, cpl.result).is_none(), "twice");
            })
            .unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        assert_eq!(results.len() as u64, total);
        resetter.join().expect("resetter")
    });
    eprintln!("{resets} resets");
    assert!(resets > 0);
    // No doorbell for a queue a reset deleted or a controller it disabled:
    // the reset's "resetting" bit stops the pair from the first deletion to
    // the new generation (without it: 5522 such doorbells in 5690 resets).
    // What is left is a pair thread preempted between its last state check
    // and its doorbell store for the whole deletion — seen once in 8495
    // resets on a loaded machine, 179 in 8464 (2.1%) with two compilers
    // running beside the test on two cores — which the controller ignores
    // (or reports as an invalid doorbell write). The bound (5%) stays far
    // below what a missing "resetting" bit gives (97%). Anything else is a
    // bug.
    let v = m.violations();
    let stale = |s: &String| {
        s.contains("but the queue does not exist")
            || s.contains("while the controller is not ready")
    };
    assert!(
        v.iter().all(stale),
        "not a stale doorbell: {:?}",
        v.iter().find(|s| !stale(s))
    );
    assert!(
        (v.len() as u64) * 20 <= resets,
        "{} doorbells for deleted queues in {resets} resets, first: {:?}",
        v.len(),
        v.first()
    );
    drop(qp);
    c.close().unwrap();
}

/// Another thread resets a fatally failed controller while a blocking read
/// waits on a pair: the read's CSTS look can still see CSTS.CFS while that
/// reset disables the controller (held here 300 ms at its CC.EN = 0). One
/// fatal status, one reset: the blocking wait must not reset the controller
/// the first reset brought back (from a review: it did, and commands
/// submitted in between ended as `ControllerReset` for nothing).
#[test]
fn a_fatal_status_read_during_a_reset_does_not_reset_the_controller_again() {
    use std::sync::Arc;
    #[derive(Clone)]
    struct SlowDisable {
        model: ModelController,
        armed: Arc<AtomicBool>,
    }
    impl common::Hooks for SlowDisable {
        fn model(&self) -> &ModelController {
            &self.model
        }
        fn write32(&self, offset: usize, value: u32) {
            if offset == common::reg::CC
                && value & 1 == 0
                && self.armed.swap(false, Ordering::SeqCst)
            {
                std::thread::sleep(Duration::from_millis(300));
            }
            self.model.write32(offset, value)
        }
    }
    let m = ModelController::new(config_one_ns(4096, 256));
    let armed = Arc::new(AtomicBool::new(false));
    let dev = common::Front(SlowDisable {
        model: m.clone(),
        armed: armed.clone(),
    });
    let c = Arc::new(upnvme::Controller::with_device(dev, opts()).unwrap());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(16),
            command_timeout: None,
            // Looks at CSTS every 20 ms while it waits.
            backoff: upnvme::Backoff {
                spin_polls: 0,
                sleep: Some(Duration::from_millis(20)),
            },
            ..Default::default()
        })
        .unwrap();
    m.inject(upnvme_tests::Fault::DelayCompletion {
        on: upnvme_tests::Match::Opcode {
            qid: qp.qid(),
            opcode: 0x02,
        },
        doorbells: None,
    });
    let buf = c.alloc_dma(4096).unwrap();
    let waiter = std::thread::spawn(move || {
        let r = qp.read_blocking(&ns, 0, 1, buf, Duration::from_secs(10));
        (r.map(drop).map_err(|f| f.error.to_string()), qp)
    });
    // The read is waiting for its held completion.
    std::thread::sleep(Duration::from_millis(100));
    let before = c.resets();
    armed.store(true, Ordering::SeqCst);
    m.set_fatal();
    c.reset().expect("the application's reset");
    let (r, qp) = waiter.join().unwrap();
    drop(qp);
    assert_eq!(
        c.resets() - before,
        1,
        "one fatal status, one reset: the blocking wait reset the controller again ({r:?})"
    );
}
