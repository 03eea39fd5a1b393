//! Resets from another thread while a queue pair runs a verified closed loop
//! (the host-side twin of the guest test
//! `reliability::resets_from_another_thread_end_every_command_once`): every
//! command ends exactly once, with its buffer, and the loop never stalls.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{config_one_ns, open, opts};
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
    drop(qp);
    c.close().unwrap();
}
