//! The C API's queue-pair glue (driver/capi/src/qpair.rs) re-entered from
//! its callbacks, on the in-memory model: a nested call that unwound leaves
//! the pair refusing work, `upnvme_qpair_in_flight` counts a command until
//! its callback ran (destroy's endings included), and a batch's callbacks
//! resubmit without allocating. (From the thirty-seventh session's review:
//! each test failed on the code before its fix.)
//!
//! `Qpair::new`, `upnvme_buf::new` and the extern functions' handle types
//! are either crate-private or fixed to `VfioNvme`, so an integration test
//! cannot drive them with `upnvme_tests::ModelController` through the
//! library crate. The crate's own modules are therefore compiled into this
//! test crate with `#[path]` (the very same source files, unchanged), which
//! makes their `pub(crate)` items reachable here. The `crate::...` paths
//! inside them resolve to these module declarations.
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

use std::ffi::{CStr, c_int, c_void};

use upnvme::dma::alloc_count::{CountingAllocator, count};
use upnvme::{Controller, QueuePairOptions};
use upnvme_tests::{Fault, Match, ModelController};

use buf::upnvme_buf;
use common::model;
use qpair::{Cmd, Qpair, upnvme_cpl};
use status::*;

/// Counts this thread's heap allocations inside `count(..)` (the design's
/// "the hot path allocates nothing").
#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn pair(
    c: &Controller<ModelController>,
    entries: u32,
    delay_doorbell: bool,
) -> Box<Qpair<ModelController>> {
    let qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(entries),
            ..Default::default()
        })
        .unwrap();
    let mut q = Box::new(Qpair::new(
        qp,
        std::sync::Arc::new(std::sync::Mutex::new(c.namespaces().to_vec())),
    ));
    q.set_delay_doorbell(delay_doorbell);
    q
}

fn handle(c: &Controller<ModelController>, len: usize) -> *mut upnvme_buf {
    Box::into_raw(Box::new(upnvme_buf::new(
        c.alloc_dma(len).unwrap(),
        std::ptr::null(),
    )))
}

fn free(b: *mut upnvme_buf) {
    // SAFETY: a live handle of the test, not in flight, freed once.
    let h = unsafe { Box::from_raw(b) };
    assert!(h.busy().is_none(), "freeing a handle that is in flight");
}

fn last_error() -> String {
    // SAFETY: this thread's NUL-terminated message.
    unsafe { CStr::from_ptr(status::last_error()) }
        .to_string_lossy()
        .into_owned()
}

const READ: Cmd<'static> = Cmd::Read { slba: 0, blocks: 1 };

// ---------------------------------------------------------------------
// Finding: a poison left by a nested call that unwound is cleared by the
// outer `process_completions`.
// ---------------------------------------------------------------------

struct Nested {
    qp: *mut Qpair<ModelController>,
    nested_rc: Vec<c_int>,
}

/// What a nested `upnvme_read` / `upnvme_qpair_process_completions` from
/// the callback does when the library panics inside it: `Qpair::submit`
/// (or `deliver`) sets `poisoned` before calling the library and the
/// unwinding skips the line that clears it; the entry point's `guard`
/// turns the panic into `UPNVME_EINTERNAL`. Simulated with the crate's own
/// test hook (`Qpair::poison`) inside the real `guard`.
unsafe extern "C" fn nested_unwind_cb(arg: *mut c_void, _cpl: *const upnvme_cpl) {
    // SAFETY: the test's `Nested`, alive for the whole test.
    let n = unsafe { &mut *arg.cast::<Nested>() };
    let qp = n.qp;
    let rc = status::guard(|| {
        // SAFETY: the pair is live; `deliver` holds no reference to it
        // while this callback runs.
        unsafe { (*qp).poison() };
        panic!("simulated internal error inside a nested submission");
    });
    n.nested_rc.push(rc);
}

/// docs/capi.md: "A queue pair whose submission failed that way refuses
/// further work (UPNVME_EINTERNAL, whether the library queued that command
/// is unknown); destroy it". When the failing submission was made from a
/// completion callback, the outer `deliver` loop (qpair.rs:716/724) sets
/// `poisoned = true` / `false` around its next reap and so clears the
/// poison: the pair goes on taking work, and `upnvme_qpair_destroy` then
/// waits for a slot that no completion will ever free (EBUSY for good).
#[test]
fn a_nested_call_that_unwound_leaves_the_pair_refusing_work() {
    let (m, c) = model();
    let mut qp = pair(&c, 8, false);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let b = handle(&c, 512);
    let mut n = Nested {
        qp: qpp,
        nested_rc: Vec::new(),
    };
    let arg: *mut Nested = &mut n;
    // SAFETY: live pair and handle; no callback runs.
    let rc = unsafe { qp.submit(1, READ, b, Some(nested_unwind_cb), arg.cast()) };
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    // SAFETY: live pair, this thread's.
    let done = unsafe { Qpair::process_completions(qpp, 0) };
    assert_eq!(done, 1, "{}", last_error());
    assert_eq!(n.nested_rc, vec![UPNVME_EINTERNAL]);
    // The nested call failed with an internal error: the pair must now
    // refuse work (ring, submit, process completions: UPNVME_EINTERNAL).
    // SAFETY: live pair, this thread's.
    let ring = unsafe { Qpair::ring(qpp) };
    // SAFETY: live pair, this thread's.
    let poll = unsafe { Qpair::process_completions(qpp, 0) };
    assert_eq!(
        (ring, poll),
        (UPNVME_EINTERNAL, UPNVME_EINTERNAL),
        "the pair took work again after a nested call unwound inside it"
    );
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::end_for_destroy(qpp) }, UPNVME_OK);
    drop(qp);
    free(b);
    let _ = c.close();
    assert_eq!(m.dma_faults(), 0);
}

// ---------------------------------------------------------------------
// Finding: `upnvme_qpair_in_flight` says 0 while destroy's ended commands
// still wait for their callbacks.
// ---------------------------------------------------------------------

struct Seen {
    qp: *mut Qpair<ModelController>,
    /// `upnvme_qpair_in_flight` (lib.rs:835 is `outstanding()`) as each
    /// callback saw it, with the callback's status.
    in_flight: Vec<(c_int, u32)>,
}

unsafe extern "C" fn in_flight_cb(arg: *mut c_void, cpl: *const upnvme_cpl) {
    // SAFETY: the test's `Seen`, alive for the whole test.
    let s = unsafe { &mut *arg.cast::<Seen>() };
    // SAFETY: valid for the call.
    let status = unsafe { (*cpl).status };
    // SAFETY: the pair is live while its callbacks run; what
    // `upnvme_qpair_in_flight` reads (a shared look).
    let n = unsafe { (*s.qp).outstanding() };
    s.in_flight.push((status, n));
}

/// Header, `upnvme_qpair_in_flight`: "Commands submitted on the pair whose
/// callback has not run yet". During ordinary delivery the first of two
/// callbacks sees 1 (the other is still to come). When destroy ends the
/// commands of a vanished device (qpair.rs:388-393), every slot goes back to
/// `free` before the first callback runs, so the first callback sees 0 with
/// one callback still to run: an application that frees its shared state
/// when `in_flight` reaches 0 then has the next callback use freed memory.
#[test]
fn in_flight_counts_ended_commands_until_their_callbacks_ran() {
    // Ordinary delivery (a delayed-doorbell pair reaps both in one batch).
    let (m, c) = model();
    let mut qp = pair(&c, 8, true);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let bufs = [handle(&c, 512), handle(&c, 512)];
    let mut s = Seen {
        qp: qpp,
        in_flight: Vec::new(),
    };
    let arg: *mut Seen = &mut s;
    for b in bufs {
        // SAFETY: live pair and handle; no callback runs.
        let rc = unsafe { qp.submit(1, READ, b, Some(in_flight_cb), arg.cast()) };
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
    }
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::ring(qpp) }, UPNVME_OK);
    while s.in_flight.len() < 2 {
        // SAFETY: live pair, this thread's.
        assert!(unsafe { Qpair::process_completions(qpp, 0) } >= 0);
    }
    assert_eq!(s.in_flight, vec![(UPNVME_OK, 1), (UPNVME_OK, 0)]);
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::end_for_destroy(qpp) }, UPNVME_OK);
    drop(qp);

    // The same two commands ended by destroy (the device vanished).
    let mut qp = pair(&c, 8, false);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    s.qp = qpp;
    s.in_flight.clear();
    m.inject(Fault::UnplugOn(Match::Queue(qp.qp.qid())));
    for b in bufs {
        // SAFETY: live pair and handle; no callback runs.
        let rc = unsafe { qp.submit(1, READ, b, Some(in_flight_cb), arg.cast()) };
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
    }
    assert!(c.smart_log().is_err(), "the device is gone");
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::end_for_destroy(qpp) }, UPNVME_OK);
    drop(qp);
    for b in bufs {
        free(b);
    }
    assert_eq!(
        s.in_flight,
        vec![(UPNVME_ENODEV, 1), (UPNVME_ENODEV, 0)],
        "upnvme_qpair_in_flight during destroy's ENODEV callbacks"
    );
}

// ---------------------------------------------------------------------
// Finding: the per-command context slab grows past the pair's depth (an
// allocation on the submission path).
// ---------------------------------------------------------------------

struct Grow {
    qp: *mut Qpair<ModelController>,
    /// (return code, heap allocations) of each submission from a callback.
    submits: Vec<(c_int, u64)>,
    max_outstanding: u32,
}

unsafe extern "C" fn two_flushes_cb(arg: *mut c_void, _cpl: *const upnvme_cpl) {
    // SAFETY: the test's `Grow`, alive for the whole test.
    let g = unsafe { &mut *arg.cast::<Grow>() };
    if !g.submits.is_empty() {
        return;
    }
    for _ in 0..2 {
        // SAFETY: the pair is live; `deliver` holds no reference to it
        // while this callback runs.
        let q = unsafe { &mut *g.qp };
        // SAFETY: no buffer (null), no callback.
        let (rc, allocs) = count(|| unsafe {
            q.submit(
                1,
                Cmd::Flush,
                std::ptr::null_mut(),
                None,
                std::ptr::null_mut(),
            )
        });
        g.submits.push((rc, allocs));
        // SAFETY: as above.
        g.max_outstanding = g.max_outstanding.max(unsafe { (*g.qp).outstanding() });
    }
}

/// The per-command context lives in a slab preallocated to the pair's depth
/// plus one reap batch (DESIGN.md, "The C ABI"), and the hot path allocates
/// nothing: on a pair with `delay_doorbell` the reap takes up to 32
/// completions before their callbacks run, and their commands still hold
/// their slots while the library already takes new ones, so a callback's
/// resubmissions need slots beyond the depth (the first version's slab was
/// the depth alone: the submission reallocated it).
#[test]
fn submissions_from_a_batch_callback_stay_within_the_preallocated_slab() {
    let (m, c) = model();
    let mut qp = pair(&c, 4, true);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let depth = qp.qp.max_depth();
    assert_eq!(depth, 3);
    let bufs: Vec<_> = (0..depth).map(|_| handle(&c, 512)).collect();
    let mut g = Grow {
        qp: qpp,
        submits: Vec::new(),
        max_outstanding: 0,
    };
    let arg: *mut Grow = &mut g;
    for &b in &bufs {
        // SAFETY: live pair and handle; no callback runs.
        let rc = unsafe { qp.submit(1, READ, b, Some(two_flushes_cb), arg.cast()) };
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
    }
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::ring(qpp) }, UPNVME_OK);
    for _ in 0..100 {
        // SAFETY: live pair, this thread's.
        assert!(unsafe { Qpair::process_completions(qpp, 0) } >= 0);
        if qp.outstanding() == 0 {
            break;
        }
    }
    assert_eq!(qp.outstanding(), 0);
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::end_for_destroy(qpp) }, UPNVME_OK);
    drop(qp);
    for b in bufs {
        free(b);
    }
    let _ = c.close();
    assert_eq!(m.dma_faults(), 0);
    assert_eq!(
        g.submits.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![UPNVME_OK; 2],
        "both submissions accepted by the library"
    );
    assert_eq!(
        g.submits.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![0, 0],
        "heap allocations of the callback's two submissions (in flight peaked at {})",
        g.max_outstanding
    );
    assert!(
        g.max_outstanding > depth,
        "the test no longer reaches the case it is for: commands whose callbacks have not run \
         yet beside the library's full depth ({} <= {depth})",
        g.max_outstanding
    );
    assert_eq!(
        g.submits.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![0, 0],
        "heap allocations per submission from the callback (queued, no doorbell)"
    );
}
