//! Review of 675cc90 (application admin commands waited for without the
//! admin lock): the admin queue's command identifiers are now shared by as
//! many application commands as there are threads calling
//! `admin_passthrough` / `set_features`. Before, the caller held the lock
//! for the whole command, so at most one of them was in flight; now each
//! thread's command holds a CID until it completes. When they are all
//! taken, `AdminQueue::submit` answers `Error::DeviceFault` ("held by
//! commands the controller has not completed (timed-out commands and
//! Asynchronous Event Requests); reset the controller") and `with_admin`
//! marks the controller failed — every waiter, and every later admin
//! command or queue pair, then fails until a reset, although the device did
//! nothing wrong.

mod common;

use std::time::{Duration, Instant};

use common::{T, open, opts};
use upnvme::{Controller, ControllerOptions};
use upnvme_queues::{Sqe, cns};
use upnvme_tests::{Fault, Match, ModelController};

const IDENTIFY: u8 = 0x06;
const PAGE: usize = 4096;

fn identify_controller(c: &Controller<ModelController>) -> upnvme::Result<Vec<u8>> {
    c.admin_passthrough_with_timeout(
        Sqe::identify(cns::CONTROLLER, 0, 0),
        PAGE,
        None,
        Duration::from_secs(5),
    )
    .map(|(_, data)| data)
}

fn wait_held(m: &ModelController, n: usize) {
    let start = Instant::now();
    while m.delayed_completions() < n {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "passthrough {n} did not reach the controller"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `held` threads each have an Identify outstanding (the model holds their
/// completions); then this thread sends one more admin command.
fn run(options: ControllerOptions, held: usize) {
    let m = ModelController::new(Default::default());
    let c = open(&m, options);
    std::thread::scope(|s| {
        let mut threads = Vec::new();
        for i in 0..held {
            m.inject(Fault::DelayCompletion {
                on: Match::Opcode {
                    qid: 0,
                    opcode: IDENTIFY,
                },
                doorbells: None,
            });
            threads.push(s.spawn(|| identify_controller(&c)));
            wait_held(&m, i + 1);
        }
        // One more admin command while they are outstanding.
        let more = c.get_features(0x07, 0, 0);
        let failure_then = c.failure();
        m.release_delayed();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(
            failure_then.is_none(),
            "{held} application admin commands in flight marked the controller failed: \
             {failure_then:?}; the extra Get Features answered {more:?}"
        );
        for (i, r) in results.iter().enumerate() {
            assert!(r.is_ok(), "passthrough {i}: {r:?}");
        }
        more.expect("Get Features with the passthroughs outstanding");
    });
    c.get_features(0x07, 0, 0).expect("Get Features afterwards");
    let _ = T;
}

/// Defaults (32 admin entries: 31 CIDs, 4 of them AERs): 27 threads with
/// a long admin command each leave none for anyone else.
#[test]
fn many_threads_passthrough_do_not_fail_the_controller() {
    run(
        ControllerOptions {
            shadow_doorbells: false,
            ..opts()
        },
        27,
    );
}

/// A small admin queue (8 entries: 7 CIDs, 4 AERs): three threads.
#[test]
fn three_threads_passthrough_on_a_small_admin_queue_do_not_fail_the_controller() {
    run(
        ControllerOptions {
            shadow_doorbells: false,
            admin_queue_entries: 8,
            ..opts()
        },
        3,
    );
}
