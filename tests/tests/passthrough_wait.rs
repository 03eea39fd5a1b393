//! Admin commands the application sends through `admin_passthrough` are
//! waited for without holding the admin lock (`Inner::execute_detached`):
//! a long one (a Firmware Commit, a vendor's command) no longer stops other
//! threads' admin commands, a queue pair's queue re-creation or a reset.
//! The command's data buffer stays with the admin queue while the device
//! may use it, and comes back with the completion. Before, the caller held
//! the lock for the whole command: `other_admin_commands_run_while_a_passthrough_is_outstanding`,
//! `a_pair_recreates_its_queues_while_a_passthrough_is_outstanding` and
//! `a_reset_ends_an_outstanding_passthrough_with_controller_reset` failed
//! then (each waited for the passthrough's timeout).

mod common;

use std::time::{Duration, Instant};

use common::{T, assert_clean, open, opts, read_back};
use upnvme::{Controller, ControllerOptions, Error, IoError, QueuePairOptions};
use upnvme_queues::{Sqe, cns};
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
    let start = Instant::now();
    while m.delayed_completions() < 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the passthrough command did not reach the controller"
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
