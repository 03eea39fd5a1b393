//! Calls on one controller handle from several threads, on the in-memory
//! model. The crate's modules are compiled in with `#[path]`, as in
//! tests/reentry.rs, so that `Ctrl` (the handle behind `upnvme_ctrl`) can be
//! driven with `ModelController`. From the thirty-eighth session's review of
//! `upnvme_ctrl_admin_passthru`: a refresh queued for the handle's write
//! lock behind a long passthrough held every other call up (std's `RwLock`
//! lets no reader in while a writer waits); a passthrough now waits with an
//! `AdminHandle`, holding nothing.
#![allow(dead_code, missing_docs, non_camel_case_types)]

#[path = "../src/buf.rs"]
pub mod buf;
#[path = "../src/ctrl.rs"]
pub mod ctrl;
#[path = "../src/qpair.rs"]
pub mod qpair;
#[path = "../src/status.rs"]
pub mod status;

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use upnvme_tests::{Fault, Match};

use common::model;
use ctrl::{Ctrl, upnvme_admin_cmd, upnvme_admin_cpl};
use status::*;

/// A long passthrough (its completion held) is in flight; a refresh waits
/// to run; a Get Features the controller answers at once is not held up
/// behind either.
#[test]
fn a_pending_refresh_does_not_make_other_admin_calls_wait_for_a_long_passthru() {
    let (m, c) = model();
    let h = Ctrl::new(c);
    // Identify Controller: executed, its completion held back (a long
    // command: a Firmware Commit with activation, a vendor command).
    m.inject(Fault::DelayCompletion {
        on: Match::Identify { cns: 0x01, nsid: 0 },
        doorbells: None,
    });
    let long = upnvme_admin_cmd {
        opcode: 0x06,
        cdw10: 0x01,
        timeout_ms: 4000,
        ..Default::default()
    };
    let quick = upnvme_admin_cmd {
        opcode: 0x0a,
        cdw10: 0x07,
        timeout_ms: 4000,
        ..Default::default()
    };
    let fetched = m.commands_fetched();
    let waited = std::thread::scope(|s| {
        let long_thread = s.spawn(|| {
            let mut page = vec![0u8; 4096];
            let mut cpl = upnvme_admin_cpl::default();
            h.admin_passthru_c(&long, &mut page, &mut cpl)
        });
        // The long command is on the controller.
        let t = Instant::now();
        while m.commands_fetched() == fetched && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            m.commands_fetched() > fetched,
            "the long command was not sent"
        );
        let refresh_thread = s.spawn(|| h.refresh().map(|_| ()));
        // The refresh is waiting for the write lock.
        std::thread::sleep(Duration::from_millis(200));
        // Whatever happens below, the long command completes after 1.5 s.
        let releaser = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(1500));
            m.release_delayed()
        });
        let t = Instant::now();
        let mut cpl = upnvme_admin_cpl::default();
        let rc = h.admin_passthru_c(&quick, &mut Vec::new(), &mut cpl);
        let waited = t.elapsed();
        assert_eq!(rc, UPNVME_OK);
        releaser.join().unwrap();
        assert_eq!(long_thread.join().unwrap(), UPNVME_OK);
        refresh_thread.join().unwrap().unwrap();
        waited
    });
    assert!(
        waited < Duration::from_millis(500),
        "a Get Features the controller answers at once waited {waited:?} behind a refresh \
         that waits for a long passthrough"
    );
}

/// Three threads send Get Features (Number of Queues) back to back for 4 s;
/// a refresh asked for after 100 ms runs within a second (each call takes
/// microseconds), not only once they stop (a first fix of the test above,
/// which tried the write lock in a loop, starved it so: a review).
#[test]
fn a_refresh_runs_while_three_threads_keep_calling() {
    let (_m, c) = model();
    let h = Ctrl::new(c);
    let stop = AtomicBool::new(false);
    let calls = AtomicU64::new(0);
    let quick = upnvme_admin_cmd {
        opcode: 0x0a,
        cdw10: 0x07,
        ..Default::default()
    };
    let (refresh_took, readers_ran) = std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                let t = Instant::now();
                while !stop.load(Ordering::Relaxed) && t.elapsed() < Duration::from_secs(4) {
                    let mut cpl = upnvme_admin_cpl::default();
                    assert_eq!(
                        h.admin_passthru_c(&quick, &mut Vec::new(), &mut cpl),
                        UPNVME_OK
                    );
                    calls.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        h.refresh().unwrap();
        let took = t.elapsed();
        stop.store(true, Ordering::Relaxed);
        (took, calls.load(Ordering::Relaxed))
    });
    assert!(
        refresh_took < Duration::from_secs(1),
        "upnvme_ctrl_refresh_namespaces waited {refresh_took:?} while three threads made \
         {readers_ran} short admin calls (they stop after 4 s)"
    );
}
