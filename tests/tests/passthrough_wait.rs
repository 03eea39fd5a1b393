//! Admin commands the application sends through `admin_passthrough` are
//! waited for without holding the admin lock (`Inner::execute_detached`):
//! a long one (a Firmware Commit, a vendor's command) no longer stops other
//! threads' admin commands, a queue pair's queue re-creation or a reset.
//! The command's data buffer (and PRP List page) stays with the admin queue
//! while the device may use them, and comes back with the completion.
//! Before, the caller held the lock for the whole command:
//! `other_admin_commands_run_while_a_passthrough_is_outstanding`,
//! `a_pair_recreates_its_queues_while_a_passthrough_is_outstanding` and
//! `a_reset_ends_an_outstanding_passthrough_with_controller_reset` failed
//! then (each waited for the passthrough's timeout).
//!
//! From the thirty-eighth session's review of the first version (which
//! failed each of these): as many application commands as threads hold
//! command identifiers now, so they may not take the driver's own (the
//! event requests it keeps posted, two for its commands) — the first
//! version ran the queue out of identifiers and failed the controller;
//! a controller marked failed by something else while a command is out
//! does not end its wait (the first version dropped a completion that had
//! come and answered `ControllerFailed`).

mod common;

use std::time::{Duration, Instant};

use common::{T, assert_clean, open, opts, read_back};
use upnvme::{Controller, ControllerOptions, Error, IoError, QueuePairOptions};
use upnvme_queues::{Sqe, cns};

const GET_LOG_PAGE: u8 = 0x02;
use upnvme_tests::{Fault, Match, ModelController};

const IDENTIFY: u8 = 0x06;
const PAGE: usize = 4096;

fn mmio_opts() -> ControllerOptions {
    ControllerOptions {
        shadow_doorbells: false,
        ..opts()
    }
}

/// The model holds the completion of the next admin command `opcode`
/// until `release_delayed`.
fn hold(m: &ModelController, opcode: u8) {
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode { qid: 0, opcode },
        doorbells: None,
    });
}

fn wait_held(m: &ModelController) {
    wait_held_n(m, 1);
}

/// Waits until the model holds `n` completions.
fn wait_held_n(m: &ModelController, n: usize) {
    let start = Instant::now();
    while m.delayed_completions() < n {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the passthrough command did not reach the controller ({} of {n} held)",
            m.delayed_completions()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Identify Controller through the passthrough, bounded by `timeout`.
fn identify_controller(
    c: &Controller<ModelController>,
    timeout: Duration,
) -> upnvme::Result<Vec<u8>> {
    c.admin_passthrough_with_timeout(Sqe::identify(cns::CONTROLLER, 0, 0), PAGE, None, timeout)
        .map(|(_, data)| data)
}

#[test]
fn other_admin_commands_run_while_a_passthrough_is_outstanding() {
    let m = ModelController::new(Default::default());
    let c = open(&m, mmio_opts());
    // The reference: the same command answered at once.
    let expected = identify_controller(&c, T).unwrap();
    assert_eq!(expected.len(), PAGE);
    hold(&m, IDENTIFY);
    std::thread::scope(|s| {
        let held = s.spawn(|| identify_controller(&c, Duration::from_secs(3)));
        wait_held(&m);
        // Admin commands of this thread go through meanwhile.
        let t = Instant::now();
        c.get_features(0x07, 0, 0)
            .expect("Get Features while the passthrough is outstanding");
        c.get_log_page(0x02, 0xffff_ffff, 512, 0)
            .expect("Get Log Page while the passthrough is outstanding");
        assert_eq!(
            m.delayed_completions(),
            1,
            "the passthrough ended before the other admin commands did ({:?}): they waited for it",
            t.elapsed()
        );
        m.release_delayed();
        // Its data came back whole once it completed.
        assert_eq!(
            held.join().unwrap().expect("the held passthrough"),
            expected
        );
    });
    drop(c);
    assert_clean(&m);
}

#[test]
fn a_pair_recreates_its_queues_while_a_passthrough_is_outstanding() {
    let m = ModelController::new(Default::default());
    let c = open(&m, mmio_opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let data: Vec<u8> = (0..PAGE).map(|i| (i * 11) as u8).collect();
    let buf = c.alloc_dma(PAGE).unwrap();
    buf.write_bytes(0, &data).unwrap();
    hold(&m, IDENTIFY);
    std::thread::scope(|s| {
        let held = s.spawn(|| identify_controller(&c, Duration::from_secs(3)));
        wait_held(&m);
        // A reset from this thread deletes the pair's queues; it is not
        // the passthrough's business, so it runs (and ends the passthrough's
        // wait, see below). The pair's next call re-creates its queues
        // through the admin queue.
        c.reset()
            .expect("reset while the passthrough is outstanding");
        let buf = qp
            .write_blocking(&ns, 0, 1, buf, Duration::from_secs(2))
            .expect("write after the re-creation");
        buf.fill(0, PAGE, 0).unwrap();
        let buf = qp
            .read_blocking(&ns, 0, 1, buf, Duration::from_secs(2))
            .expect("read after the re-creation");
        assert_eq!(read_back(&buf, PAGE), data);
        let r = held.join().unwrap();
        assert!(
            matches!(
                r,
                Err(Error::Io {
                    error: IoError::ControllerReset,
                    ..
                })
            ),
            "{r:?}"
        );
    });
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn a_reset_ends_an_outstanding_passthrough_with_controller_reset() {
    let m = ModelController::new(Default::default());
    let c = open(&m, mmio_opts());
    let before = m.live_dma_buffers();
    hold(&m, IDENTIFY);
    std::thread::scope(|s| {
        let held = s.spawn(|| identify_controller(&c, Duration::from_secs(3)));
        wait_held(&m);
        let t = Instant::now();
        c.reset().expect("reset");
        let r = held.join().unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the passthrough's wait outlived the reset by {:?}",
            t.elapsed()
        );
        assert!(
            matches!(
                r,
                Err(Error::Io {
                    error: IoError::ControllerReset,
                    ..
                })
            ),
            "{r:?}"
        );
    });
    // The command's buffer went when the reset disabled the controller.
    assert_eq!(m.live_dma_buffers(), before);
    // The controller is usable, and the completion the reset dropped is
    // not handed to the next command.
    assert_eq!(identify_controller(&c, T).unwrap().len(), PAGE);
    drop(c);
    assert_clean(&m);
}

#[test]
fn a_timed_out_passthrough_keeps_its_buffer_until_the_controller_is_disabled() {
    let m = ModelController::new(Default::default());
    let c = open(&m, mmio_opts());
    let before = m.live_dma_buffers();
    hold(&m, IDENTIFY);
    let r = identify_controller(&c, Duration::from_millis(50));
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    // The device may still write the page: the admin queue keeps it.
    assert_eq!(m.live_dma_buffers(), before + 1);
    // A timed-out admin command fails the controller until a reset.
    assert!(c.get_features(0x07, 0, 0).is_err());
    c.reset().expect("reset");
    assert_eq!(m.live_dma_buffers(), before);
    assert_eq!(identify_controller(&c, T).unwrap().len(), PAGE);
    drop(c);
    assert_clean(&m);
}

/// Error Information log (LID 01h), three pages with RAE set: detached,
/// with a PRP List.
fn error_log_rae(c: &Controller<ModelController>, timeout: Duration) -> upnvme::Result<Vec<u8>> {
    let sqe = Sqe::get_log_page(0x01, 0xffff_ffff, (3 * PAGE / 4) as u32, 0, true);
    c.admin_passthrough_with_timeout(sqe, 3 * PAGE, None, timeout)
        .map(|(_, d)| d)
}

#[test]
fn a_timed_out_three_page_passthrough_keeps_buffer_and_prp_list_until_the_reset() {
    let m = ModelController::new(Default::default());
    let c = open(&m, mmio_opts());
    let before = m.live_dma_buffers();
    hold(&m, GET_LOG_PAGE);
    let r = error_log_rae(&c, Duration::from_millis(50));
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    // The data buffer and the PRP List page.
    assert_eq!(m.live_dma_buffers(), before + 2);
    // Its completion arriving now changes nothing the device may use.
    m.release_delayed();
    c.reset().expect("reset");
    assert_eq!(m.live_dma_buffers(), before);
    assert_eq!(error_log_rae(&c, T).unwrap().len(), 3 * PAGE);
    assert_eq!(m.live_dma_buffers(), before);
    drop(c);
    assert_clean(&m);
}

#[test]
fn a_reset_ending_a_three_page_passthrough_frees_buffer_and_list() {
    let m = ModelController::new(Default::default());
    let c = open(&m, mmio_opts());
    let before = m.live_dma_buffers();
    hold(&m, GET_LOG_PAGE);
    std::thread::scope(|s| {
        let held = s.spawn(|| error_log_rae(&c, Duration::from_secs(3)));
        wait_held(&m);
        assert_eq!(m.live_dma_buffers(), before + 2);
        c.reset().expect("reset");
        let r = held.join().unwrap();
        assert!(
            matches!(
                r,
                Err(Error::Io {
                    error: IoError::ControllerReset,
                    ..
                })
            ),
            "{r:?}"
        );
    });
    assert_eq!(m.live_dma_buffers(), before);
    drop(c);
    assert_clean(&m);
}

#[test]
fn a_three_page_completion_reaped_by_another_thread_comes_back_whole() {
    let m = ModelController::new(Default::default());
    let c = open(&m, mmio_opts());
    let expected = error_log_rae(&c, T).unwrap();
    let before = m.live_dma_buffers();
    hold(&m, GET_LOG_PAGE);
    std::thread::scope(|s| {
        let held = s.spawn(|| error_log_rae(&c, Duration::from_secs(3)));
        wait_held(&m);
        m.release_delayed();
        // This thread's commands reap it (the waiter may, too).
        for _ in 0..20 {
            c.get_features(0x07, 0, 0).unwrap();
        }
        assert_eq!(held.join().unwrap().unwrap(), expected);
    });
    assert_eq!(m.live_dma_buffers(), before);
    drop(c);
    assert_clean(&m);
}

// ---------------------------------------------------------------------------
// Command identifiers: application commands do not take the driver's own.
// ---------------------------------------------------------------------------

/// An 8-entry admin queue: 7 command identifiers, 4 Asynchronous Event
/// Requests and 2 for the driver's commands leave one for an application
/// command at a time; the others wait for it (nothing sent), and the
/// driver's commands — a Get Features, a queue pair's Create I/O CQ/SQ —
/// and the event requests go on.
#[test]
fn application_commands_beyond_the_drivers_reserve_wait_for_an_identifier() {
    let m = ModelController::new(Default::default());
    let c = open(
        &m,
        ControllerOptions {
            admin_queue_entries: 8,
            ..mmio_opts()
        },
    );
    let aers = m.outstanding_async_requests();
    assert_eq!(aers, 4);
    hold(&m, IDENTIFY);
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..3)
            .map(|_| s.spawn(|| identify_controller(&c, Duration::from_secs(5))))
            .collect();
        wait_held(&m);
        let fetched = m.commands_fetched();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            m.commands_fetched(),
            fetched,
            "a second application command took an identifier the driver keeps"
        );
        c.get_features(0x07, 0, 0)
            .expect("Get Features with an application command outstanding");
        let mut qp = c
            .io_queue_pair(QueuePairOptions::default())
            .expect("a pair");
        let ns = c.namespace(1).unwrap().clone();
        let buf = qp
            .read_blocking(&ns, 0, 1, c.alloc_dma(PAGE).unwrap(), T)
            .expect("I/O");
        drop(buf);
        // An event completes one request; the poll posts it again.
        m.raise_async_event(1, 0, 0x02);
        assert_eq!(c.poll_async_events().expect("poll").len(), 1);
        assert_eq!(m.outstanding_async_requests(), aers);
        assert!(c.failure().is_none(), "{:?}", c.failure());
        m.release_delayed();
        for t in threads {
            assert_eq!(t.join().unwrap().expect("passthrough").len(), PAGE);
        }
        drop(qp);
    });
    assert!(c.failure().is_none(), "{:?}", c.failure());
    drop(c);
    assert_clean(&m);
}

/// The default admin queue (32 entries): 25 application commands at once,
/// and two more wait without failing anything.
#[test]
fn many_threads_of_application_commands_do_not_fail_the_controller() {
    let m = ModelController::new(Default::default());
    let c = open(&m, mmio_opts());
    let aers = m.outstanding_async_requests();
    let room = 31 - aers - 2;
    std::thread::scope(|s| {
        let mut threads = Vec::new();
        for i in 0..room {
            // A fault matches one command: held one at a time.
            hold(&m, IDENTIFY);
            threads.push(s.spawn(|| identify_controller(&c, Duration::from_secs(5))));
            wait_held_n(&m, i + 1);
        }
        // Two more find every shareable identifier taken and wait.
        for _ in 0..2 {
            threads.push(s.spawn(|| identify_controller(&c, Duration::from_secs(5))));
        }
        let fetched = m.commands_fetched();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(m.commands_fetched(), fetched, "beyond the reserve");
        c.get_features(0x07, 0, 0)
            .expect("Get Features with every shareable identifier taken");
        assert!(c.failure().is_none(), "{:?}", c.failure());
        m.release_delayed();
        for (i, t) in threads.into_iter().enumerate() {
            assert!(t.join().unwrap().is_ok(), "passthrough {i}");
        }
    });
    assert!(c.failure().is_none(), "{:?}", c.failure());
    c.get_features(0x07, 0, 0).expect("Get Features afterwards");
    drop(c);
    assert_clean(&m);
}

/// An application command that finds no identifier within its bound is a
/// timeout of its own: nothing was sent, the controller stays usable.
#[test]
fn an_application_command_that_gets_no_identifier_in_time_leaves_the_controller_usable() {
    let m = ModelController::new(Default::default());
    let c = open(
        &m,
        ControllerOptions {
            admin_queue_entries: 8,
            ..mmio_opts()
        },
    );
    hold(&m, IDENTIFY);
    std::thread::scope(|s| {
        let held = s.spawn(|| identify_controller(&c, Duration::from_secs(5)));
        wait_held(&m);
        let r = identify_controller(&c, Duration::from_millis(30));
        match &r {
            Err(e @ Error::AdminBusy { .. }) => {
                let text = e.to_string();
                assert!(text.contains("the controller is fine"), "{text}");
                // The command named once (a review found it twice).
                assert!(
                    text.starts_with("admin command 0x06 on controller"),
                    "{text}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(c.failure().is_none(), "{:?}", c.failure());
        m.release_delayed();
        held.join().unwrap().expect("the held passthrough");
    });
    c.get_features(0x07, 0, 0).expect("usable");
    drop(c);
    assert_clean(&m);
}

/// The smallest admin queue (2 entries: one identifier, no event
/// requests): nothing to share, so an application command is waited for
/// under the lock, and another admin command waits for it instead of
/// finding no identifier (the first version failed the controller).
#[test]
fn on_a_two_entry_admin_queue_application_commands_wait_under_the_lock() {
    let m = ModelController::new(Default::default());
    let c = open(
        &m,
        ControllerOptions {
            admin_queue_entries: 2,
            ..mmio_opts()
        },
    );
    hold(&m, IDENTIFY);
    std::thread::scope(|s| {
        let held = s.spawn(|| identify_controller(&c, Duration::from_secs(5)));
        wait_held(&m);
        let releaser = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            m.release_delayed()
        });
        c.get_features(0x07, 0, 0)
            .expect("Get Features after the held command");
        assert_eq!(releaser.join().unwrap(), 1);
        held.join().unwrap().expect("the held passthrough");
    });
    assert!(c.failure().is_none(), "{:?}", c.failure());
    drop(c);
    assert_clean(&m);
}

// ---------------------------------------------------------------------------
// A controller marked failed by a queue pair (which does so without the
// admin lock) while an application command is out: the command's
// completion, posted after, is still its answer (the looks do not consult
// the failure mark; under the lock, before, the waiter got it too).
// ---------------------------------------------------------------------------

#[test]
fn a_passthrough_that_completed_is_answered_even_if_a_pair_failed_the_controller_meanwhile() {
    let m = ModelController::new(Default::default());
    let c = open(&m, mmio_opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // Queues created now, before the passthrough.
    let buf = c.alloc_dma(PAGE).unwrap();
    let buf = qp.read_blocking(&ns, 0, 1, buf, T).unwrap();
    let expected = identify_controller(&c, T).unwrap();
    hold(&m, IDENTIFY);
    std::thread::scope(|s| {
        let held = s.spawn(|| identify_controller(&c, Duration::from_secs(3)));
        wait_held(&m);
        // The pair sees a broken completion (a stale CID): the controller
        // is marked failed.
        m.inject(Fault::CorruptCid {
            on: Match::Queue(qp.qid()),
            xor: 0x8000,
        });
        let r = qp.read_blocking(&ns, 0, 1, buf, Duration::from_secs(1));
        assert!(
            matches!(&r, Err(f) if matches!(f.error, Error::DeviceFault { .. })),
            "{:?}",
            r.as_ref().err().map(|f| f.to_string())
        );
        assert!(c.failure().is_some());
        // The passthrough's command completes.
        assert_eq!(m.release_delayed(), 1);
        let r = held.join().unwrap();
        match r {
            Ok(data) => assert_eq!(data, expected),
            Err(e) => panic!(
                "the passthrough's command completed successfully, yet the caller was told: {e}"
            ),
        }
    });
    drop(qp);
    drop(c);
}

/// An `AdminHandle` sends admin commands without borrowing the controller:
/// a held one is outstanding while the controller is borrowed mutably for
/// a namespace refresh; after `close` the handle's calls say so.
#[test]
fn an_admin_handle_waits_without_borrowing_the_controller() {
    let m = ModelController::new(Default::default());
    let mut c = open(&m, mmio_opts());
    let admin = c.admin_handle();
    let expected = identify_controller(&c, T).unwrap();
    hold(&m, IDENTIFY);
    let held = std::thread::spawn({
        let admin = admin.clone();
        move || {
            admin
                .admin_passthrough(Sqe::identify(cns::CONTROLLER, 0, 0), PAGE, None)
                .map(|(_, d)| d)
        }
    });
    wait_held(&m);
    c.refresh_namespaces()
        .expect("a refresh with a passthrough outstanding");
    m.release_delayed();
    assert_eq!(held.join().unwrap().unwrap(), expected);
    c.close().unwrap();
    let r = admin.admin_passthrough(Sqe::get_features(0x07, 0, 0), 0, None);
    assert!(matches!(r, Err(Error::Closed { .. })), "{r:?}");
}

/// A handle's command outstanding when the controller is closed ends with
/// `Closed` (not `ControllerReset`, which invites a retry: a review).
#[test]
fn a_handle_command_in_flight_at_close_is_told_closed() {
    let m = ModelController::new(Default::default());
    let c = open(&m, mmio_opts());
    let admin = c.admin_handle();
    hold(&m, IDENTIFY);
    let held = std::thread::spawn({
        let admin = admin.clone();
        move || {
            admin.admin_passthrough_with_timeout(
                Sqe::identify(cns::CONTROLLER, 0, 0),
                PAGE,
                None,
                Duration::from_secs(3),
            )
        }
    });
    wait_held(&m);
    c.close().expect("close");
    let r = held.join().unwrap();
    assert!(
        matches!(r, Err(Error::Closed { .. })),
        "a command in flight when the controller was closed was told: {:?}",
        r.map(|_| ()).map_err(|e| e.to_string())
    );
}

/// An `AdminHandle` does not keep the controller alive: dropping the
/// `Controller` (no queue pair left) shuts it down (a review found the
/// first version, holding the shared state, kept it enabled and the device
/// open), and the handle's calls say it is closed.
#[test]
fn dropping_the_controller_shuts_it_down_with_no_pair_left() {
    let m = ModelController::new(Default::default());
    let c = open(&m, mmio_opts());
    let admin = c.admin_handle();
    drop(c);
    let cc = m.cc();
    let up = cc & 1 == 1 && (cc >> 14) & 3 == 0;
    // The handle still sends commands to it.
    let still = admin.admin_passthrough(Sqe::identify(cns::CONTROLLER, 0, 0), PAGE, None);
    assert!(
        !up,
        "the Controller was dropped (no queue pair) but the controller is still enabled \
         (CC = {cc:#x})"
    );
    assert!(matches!(still, Err(Error::Closed { .. })), "{still:?}");
}

/// `get_features` / `set_features` refuse the features whose value is a
/// data structure (they have no data pointer): Namespace Admin Label (1Fh,
/// 256 bytes) too (a review found it sent, the controller moving its label
/// through IOVA 0).
#[test]
fn get_features_refuses_namespace_admin_label() {
    let m = ModelController::new(Default::default());
    let c = open(&m, opts());
    let r = c.get_features(0x1f, 0, 0);
    assert!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "Get Features FID 1Fh (a 256-byte structure) was sent without a data pointer: {r:?}"
    );
    let r = c.set_features(0x1f, 0, false);
    assert!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "Set Features FID 1Fh (a 256-byte structure) was sent without a data pointer: {r:?}"
    );
}

/// The bound of an application command's completion runs from its
/// submission: time spent waiting for a free identifier (nothing sent)
/// does not count (a review found it did: a command sent late in its bound
/// timed out and failed the controller that had had it for a fraction of
/// it).
#[test]
fn a_command_sent_after_waiting_for_an_identifier_gets_its_whole_bound() {
    let m = ModelController::new(Default::default());
    // 8 entries: one application command at a time.
    let c = open(
        &m,
        ControllerOptions {
            admin_queue_entries: 8,
            ..mmio_opts()
        },
    );
    hold(&m, IDENTIFY);
    std::thread::scope(|s| {
        let first = s.spawn(|| identify_controller(&c, Duration::from_secs(5)));
        wait_held(&m);
        // The second command's own completion is held too, for 150 ms of
        // its 600 ms bound, after 500 ms waiting for an identifier.
        hold(&m, IDENTIFY);
        let second = s.spawn(|| identify_controller(&c, Duration::from_millis(600)));
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(m.release_delayed(), 1);
        wait_held(&m);
        std::thread::sleep(Duration::from_millis(150));
        m.release_delayed();
        first.join().unwrap().expect("the first command");
        let r = second.join().unwrap();
        assert!(r.is_ok(), "{r:?}");
        assert!(c.failure().is_none(), "{:?}", c.failure());
    });
    drop(c);
    assert_clean(&m);
}

/// A controller that reports AERL 3 (four Asynchronous Event Requests) but
/// takes one ends the other three with Asynchronous Event Request Limit
/// Exceeded. The identifiers kept for them are given up: on an 8-entry
/// admin queue three application commands run at once (with four kept for
/// requests that will never be posted, one did), and an event's re-post
/// posts the one request the controller takes, not four again (three of
/// which it would refuse once more).
#[test]
fn event_requests_the_controller_refuses_give_their_identifiers_back() {
    const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    // The Identify Controller page of a model with AERL 3...
    let page = {
        let probe = ModelController::new(Default::default());
        let c = open(&probe, mmio_opts());
        identify_controller(&c, T).expect("identify")
    };
    assert_eq!(page[259], 3, "AERL");
    // ...on a model that takes one request (AERL 0).
    let m = ModelController::new(upnvme_tests::ModelConfig {
        aerl: 0,
        ..Default::default()
    });
    m.set_identify_data(cns::CONTROLLER, 0, Some(page));
    let c = open(
        &m,
        ControllerOptions {
            admin_queue_entries: 8,
            ..mmio_opts()
        },
    );
    // Bring-up posted four; three came back refused (seen at a poll).
    assert!(c.poll_async_events().expect("poll").is_empty());
    assert_eq!(m.outstanding_async_requests(), 1);
    let aers_sent = |m: &ModelController| {
        m.commands_seen()
            .iter()
            .filter(|&&(qid, op, _)| qid == 0 && op == ASYNC_EVENT_REQUEST)
            .count()
    };
    assert_eq!(aers_sent(&m), 4);
    std::thread::scope(|s| {
        let mut threads = Vec::new();
        for i in 0..3 {
            // A fault matches one command: held one at a time.
            hold(&m, IDENTIFY);
            threads.push(s.spawn(|| identify_controller(&c, Duration::from_secs(5))));
            wait_held_n(&m, i + 1);
        }
        m.release_delayed();
        for t in threads {
            assert_eq!(t.join().unwrap().expect("passthrough").len(), PAGE);
        }
    });
    // An event completes the one request; the poll posts one again.
    m.raise_async_event(1, 0, 0x02);
    assert_eq!(c.poll_async_events().expect("poll").len(), 1);
    assert_eq!(m.outstanding_async_requests(), 1);
    assert_eq!(aers_sent(&m), 5, "only the request the controller takes");
    assert!(c.failure().is_none(), "{:?}", c.failure());
    drop(c);
    assert_clean(&m);
}
