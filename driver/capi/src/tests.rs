//! The C API's logic on the in-memory controller model: callbacks that
//! resubmit on their own pair, buffer ownership across the ABI, refusals
//! that hand the buffer back, pools, and the panic guard.

use std::ffi::{CStr, c_int, c_void};
use std::time::Duration;

use upnvme::{Controller, QueuePairOptions};
use upnvme_tests::{ModelConfig, ModelController, NamespaceConfig};

use crate::buf::{upnvme_buf, upnvme_pool};
use crate::qpair::{Cmd, Qpair, upnvme_cpl};
use crate::status::*;
use crate::{upnvme_buf_data, upnvme_buf_free, upnvme_last_error};

const BLOCKS: u64 = 256;

/// One namespace of `BLOCKS` 512-byte blocks.
fn one_ns() -> ModelConfig {
    ModelConfig {
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size: 512,
            blocks: BLOCKS,
            ..NamespaceConfig::default()
        }],
        ..Default::default()
    }
}

fn model() -> (ModelController, Controller<ModelController>) {
    model_with(one_ns())
}

fn model_with(cfg: ModelConfig) -> (ModelController, Controller<ModelController>) {
    let m = ModelController::new(cfg);
    let c = Controller::with_device(m.clone(), upnvme_tests::host_options()).unwrap();
    (m, c)
}

fn pair(c: &Controller<ModelController>, entries: u32) -> Box<Qpair<ModelController>> {
    let qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(entries),
            ..Default::default()
        })
        .unwrap();
    Box::new(Qpair::new(
        qp,
        std::sync::Arc::new(std::sync::Mutex::new(c.namespaces().to_vec())),
    ))
}

/// A pair of `entries` made as `upnvme_qpair_create` makes it: sharing the
/// handle's namespace list (a refresh or Format NVM on the handle reaches
/// it).
fn shared_pair(h: &crate::Ctrl<ModelController>, entries: u32) -> Box<Qpair<ModelController>> {
    let qp = h
        .get()
        .unwrap()
        .io_queue_pair(QueuePairOptions {
            entries: Some(entries),
            ..Default::default()
        })
        .unwrap();
    Box::new(Qpair::new(qp, h.nss.clone()))
}

fn handle<D: upnvme::Device>(c: &Controller<D>, len: usize) -> *mut upnvme_buf {
    Box::into_raw(Box::new(upnvme_buf::new(
        c.alloc_dma(len).unwrap(),
        std::ptr::null(),
    )))
}

/// Reaps `qp` until `count_cb` recorded `want` statuses in `seen` (at most
/// 5 s). `seen` is read through its pointer between reaps, never borrowed
/// while callbacks write through it.
fn reap_until(qp: *mut Qpair<ModelController>, seen: *const Vec<c_int>, want: usize) {
    let start = std::time::Instant::now();
    // SAFETY: the test's vector, alive; no callback runs while it is read.
    while unsafe { (*seen).len() } < want && start.elapsed() < Duration::from_secs(5) {
        // SAFETY: a live pair of this thread.
        let n = unsafe { Qpair::process_completions(qp, 0) };
        assert!(n >= 0, "{}", last_error());
    }
}

fn last_error() -> String {
    // SAFETY: a NUL-terminated string owned by this thread's slot.
    unsafe { CStr::from_ptr(upnvme_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A closed loop driven from the callbacks: each write's callback reads the
/// block back into the same buffer, each read's callback checks it and
/// writes the next block.
struct Loop {
    qp: *mut Qpair<ModelController>,
    next_lba: u64,
    writes_left: u64,
    done: u64,
    bad: u64,
    failed: u64,
}

/// Per-buffer state: which block it holds and whether a read is due.
struct Slot {
    lp: *mut Loop,
    lba: u64,
    reading: bool,
}

fn pattern(lba: u64) -> u8 {
    (lba as u8).wrapping_mul(31).wrapping_add(7)
}

unsafe extern "C" fn loop_cb(arg: *mut c_void, cpl: *const upnvme_cpl) {
    // SAFETY: `arg` is a live `Slot` of the test; the loop and the pair
    // are alive for the whole test.
    let s = unsafe { &mut *arg.cast::<Slot>() };
    // SAFETY: valid for the call.
    let cpl = unsafe { &*cpl };
    // SAFETY: as above.
    let lp = unsafe { &mut *s.lp };
    if cpl.status != UPNVME_OK {
        lp.failed += 1;
        return;
    }
    // SAFETY: `cpl.buf` is the handle, the application's again.
    let data = unsafe { upnvme_buf_data(cpl.buf) }.cast::<u8>();
    if s.reading {
        // SAFETY: the buffer is 512 bytes and ours now.
        let got = unsafe { std::slice::from_raw_parts(data, 512) };
        if got.iter().any(|&b| b != pattern(s.lba)) {
            lp.bad += 1;
        }
        lp.done += 1;
        if lp.writes_left == 0 {
            return;
        }
        lp.writes_left -= 1;
        s.lba = lp.next_lba % BLOCKS;
        lp.next_lba += 1;
        s.reading = false;
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(data, pattern(s.lba), 512) };
        let cmd = Cmd::Write {
            slba: s.lba,
            blocks: 1,
        };
        // SAFETY: the pair is live; no reference to it is held by
        // `process_completions` while this callback runs.
        let q = unsafe { &mut *lp.qp };
        // SAFETY: the handle is live and ours again.
        let rc = unsafe { q.submit(1, cmd, cpl.buf, Some(loop_cb), arg) };
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
    } else {
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(data, 0, 512) };
        s.reading = true;
        let cmd = Cmd::Read {
            slba: s.lba,
            blocks: 1,
        };
        // SAFETY: as above.
        let q = unsafe { &mut *lp.qp };
        // SAFETY: as above.
        let rc = unsafe { q.submit(1, cmd, cpl.buf, Some(loop_cb), arg) };
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
        // Nested: process completions from inside a callback.
        // SAFETY: as above.
        let n = unsafe { Qpair::process_completions(lp.qp, 1) };
        assert!(n >= 0, "{}", last_error());
    }
}

#[test]
fn callbacks_resubmit_and_nest_with_byte_exact_data() {
    for depth in [1u64, 7] {
        let (m, c) = model();
        let qp = Box::into_raw(pair(&c, 8));
        // Reached through this raw pointer only (the callbacks hold copies).
        let lp: *mut Loop = Box::into_raw(Box::new(Loop {
            qp,
            next_lba: 0,
            writes_left: 200,
            done: 0,
            bad: 0,
            failed: 0,
        }));
        let slots: *mut Vec<Slot> = Box::into_raw(Box::new(
            (0..depth)
                .map(|_| Slot {
                    lp,
                    lba: 0,
                    reading: false,
                })
                .collect(),
        ));
        let bufs: Vec<*mut upnvme_buf> = (0..depth).map(|_| handle(&c, 512)).collect();
        for (i, &b) in bufs.iter().enumerate() {
            // SAFETY: the test's live loop; no callback runs here.
            let l = unsafe { &mut *lp };
            // SAFETY: the test's live slots; no callback runs here.
            let s = unsafe { &mut (&mut *slots)[i] };
            s.lba = l.next_lba;
            l.next_lba += 1;
            l.writes_left -= 1;
            // SAFETY: a live handle of this test.
            let data = unsafe { upnvme_buf_data(b) }.cast::<u8>();
            // SAFETY: its 512 bytes, not in flight.
            unsafe { std::ptr::write_bytes(data, pattern(s.lba), 512) };
            let cmd = Cmd::Write {
                slba: s.lba,
                blocks: 1,
            };
            let arg: *mut Slot = s;
            // SAFETY: live pair; no callback runs here.
            let q = unsafe { &mut *qp };
            // SAFETY: live handle.
            let rc = unsafe { q.submit(1, cmd, b, Some(loop_cb), arg.cast()) };
            assert_eq!(rc, UPNVME_OK, "{}", last_error());
        }
        let start = std::time::Instant::now();
        // SAFETY: live pair (the test's), read between calls.
        while unsafe { (*qp).qp.in_flight() } > 0 {
            // SAFETY: live pair, this thread's.
            let n = unsafe { Qpair::process_completions(qp, 0) };
            assert!(n >= 0, "{}", last_error());
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the loop stalled"
            );
        }
        // SAFETY: made by Box::into_raw above; no callback runs any more.
        let l = unsafe { Box::from_raw(lp) };
        // SAFETY: as above.
        drop(unsafe { Box::from_raw(slots) });
        assert_eq!((l.done, l.bad, l.failed), (200, 0, 0), "depth {depth}");
        for b in bufs {
            // SAFETY: live handles, no longer in flight.
            assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
        }
        // SAFETY: made by Box::into_raw above.
        drop(unsafe { Box::from_raw(qp) });
        drop(c);
        assert_eq!(m.violations(), Vec::<String>::new());
        assert_eq!(m.dma_faults(), 0);
    }
}

unsafe extern "C" fn count_cb(arg: *mut c_void, cpl: *const upnvme_cpl) {
    // SAFETY: `arg` is the test's counter.
    let n = unsafe { &mut *arg.cast::<Vec<c_int>>() };
    // SAFETY: valid for the call.
    let cpl = unsafe { &*cpl };
    n.push(cpl.status);
}

/// `upnvme_read_flags` / `upnvme_write_flags`: the C flags word becomes
/// CDW12 FUA (bit 30) and LR (bit 31) of the command the controller
/// fetches; an undefined bit is refused before anything is sent; the other
/// commands' CDW12 carries no flag.
#[test]
fn per_command_flags_reach_cdw12_and_unknown_bits_are_refused() {
    use crate::{UPNVME_IO_FUA, UPNVME_IO_LIMITED_RETRY};
    assert_eq!(crate::io_flags(0), Some(upnvme::IoFlags::NONE));
    assert_eq!(crate::io_flags(UPNVME_IO_FUA), Some(upnvme::IoFlags::FUA));
    assert_eq!(
        crate::io_flags(UPNVME_IO_FUA | UPNVME_IO_LIMITED_RETRY).map(|f| f.cdw12()),
        Some(3 << 30)
    );
    for bad in [4, 1 << 31, UPNVME_IO_FUA | 8] {
        assert_eq!(crate::io_flags(bad), None, "{bad:#x}");
        // Refused before the pair is looked at (a NULL one here).
        // SAFETY: null handles; nothing is dereferenced for a refused word.
        let rc = unsafe {
            crate::upnvme_write_flags(
                std::ptr::null_mut(),
                1,
                std::ptr::null_mut(),
                0,
                1,
                bad,
                None,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, UPNVME_EINVAL);
        assert!(last_error().contains("are not defined"), "{}", last_error());
    }
    let (m, c) = model();
    let mut qp = pair(&c, 8);
    let b = handle(&c, 4096);
    let mut seen: Vec<c_int> = Vec::new();
    let arg: *mut Vec<c_int> = &mut seen;
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let last = |m: &ModelController| m.last_io_cdw12().expect("an I/O command");
    let cases = [
        (
            Cmd::Write { slba: 2, blocks: 1 },
            upnvme::IoFlags::FUA,
            (0x01, 1 << 30),
        ),
        (
            Cmd::Read { slba: 2, blocks: 1 },
            crate::io_flags(UPNVME_IO_FUA | UPNVME_IO_LIMITED_RETRY).unwrap(),
            (0x02, 3 << 30),
        ),
        (
            Cmd::Read { slba: 2, blocks: 1 },
            upnvme::IoFlags::NONE,
            (0x02, 0),
        ),
    ];
    for (cmd, flags, want) in cases {
        let before = seen.len();
        // SAFETY: live pair and handle.
        let rc = unsafe {
            qp.submit_with(
                1,
                cmd,
                crate::Ext::flags(flags),
                b,
                Some(count_cb),
                arg.cast(),
            )
        };
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
        reap_until(qpp, arg, before + 1);
        assert_eq!(last(&m), want, "{cmd:?} {flags:?}");
    }
    assert_eq!(seen, vec![UPNVME_OK; 3]);
    // SAFETY: ours.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    drop(qp);
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

#[test]
fn a_buffer_in_flight_cannot_be_submitted_or_freed_and_refusals_hand_it_back() {
    let (m, c) = model();
    let mut qp = pair(&c, 8);
    let b = handle(&c, 4096);
    let mut seen: Vec<c_int> = Vec::new();
    let arg: *mut Vec<c_int> = &mut seen;
    let read = Cmd::Read { slba: 0, blocks: 8 };
    // Refused before the device: range past the end. The buffer stays ours.
    let past = Cmd::Read {
        slba: BLOCKS - 1,
        blocks: 2,
    };
    // SAFETY: live handle.
    let rc = unsafe { qp.submit(1, past, b, Some(count_cb), arg.cast()) };
    assert_eq!(rc, UPNVME_EINVAL);
    assert_eq!(
        last_error(),
        "invalid argument: the LBA range is outside the namespace (NSZE)"
    );
    // SAFETY: live handle, not in use elsewhere.
    let h = unsafe { &*b };
    assert!(!h.inflight && h.buf.is_some());
    // An unknown namespace.
    // SAFETY: live handle.
    let rc = unsafe { qp.submit(9, read, b, None, std::ptr::null_mut()) };
    assert_eq!(rc, UPNVME_EINVAL);
    assert!(last_error().contains("namespace 9"), "{}", last_error());
    // No buffer for a read.
    // SAFETY: null is allowed.
    let rc = unsafe { qp.submit(1, read, std::ptr::null_mut(), None, std::ptr::null_mut()) };
    assert_eq!(rc, UPNVME_EINVAL);

    // SAFETY: live handle.
    let rc = unsafe { qp.submit(1, read, b, Some(count_cb), arg.cast()) };
    assert_eq!(rc, UPNVME_OK);
    // In flight: a second submission and a free are refused.
    // SAFETY: live handle.
    let rc = unsafe { qp.submit(1, read, b, None, std::ptr::null_mut()) };
    assert_eq!(rc, UPNVME_EBUSY);
    // SAFETY: live handle; refused, so still live.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_EBUSY);
    assert!(last_error().contains("in flight"), "{}", last_error());
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    // SAFETY: live pair, this thread's.
    while unsafe { Qpair::process_completions(qpp, 0) } == 0 {}
    assert_eq!(seen, vec![UPNVME_OK]);
    // A command without data, and Dataset Management with a bad count.
    // SAFETY: no buffer needed.
    let rc = unsafe {
        qp.submit(
            1,
            Cmd::Flush,
            std::ptr::null_mut(),
            Some(count_cb),
            arg.cast(),
        )
    };
    assert_eq!(rc, UPNVME_OK);
    let none = Cmd::Deallocate { ranges: &[] };
    // SAFETY: no buffer needed.
    let rc = unsafe { qp.submit(1, none, std::ptr::null_mut(), None, std::ptr::null_mut()) };
    assert_eq!(rc, UPNVME_EINVAL);
    // SAFETY: live pair.
    while unsafe { Qpair::process_completions(qpp, 0) } == 0 {}
    assert_eq!(seen, vec![UPNVME_OK, UPNVME_OK]);
    // SAFETY: live handle, back from its command.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    drop(qp);
    drop(c);
    assert_eq!(m.dma_faults(), 0);
}

#[test]
fn pools_hand_out_and_take_back_their_own_buffers_only() {
    let (_m, c) = model();
    let mut p = upnvme_pool::new(c.dma_pool(4096, 3).unwrap());
    let a = p.get().unwrap();
    let b = p.get().unwrap();
    let d = p.get().unwrap();
    assert!(p.get().is_none(), "three buffers, then none");
    // SAFETY: live handles.
    assert_ne!(unsafe { (*a).iova }, unsafe { (*b).iova });
    let mut other = upnvme_pool::new(c.dma_pool(4096, 1).unwrap());
    // SAFETY: live handles of the test, given up on Ok.
    unsafe { other.put(a) }.unwrap_err();
    // SAFETY: as above.
    unsafe { p.put(a) }.unwrap();
    // SAFETY: as above.
    unsafe { p.put(b) }.unwrap();
    // SAFETY: as above.
    unsafe { p.put(d) }.unwrap();
    assert_eq!(p.pool.available(), 3);
    assert!(p.get().is_some());
}

/// Counts this thread's heap allocations inside `count(..)`; otherwise the
/// system allocator.
#[global_allocator]
static GLOBAL: upnvme::dma::alloc_count::CountingAllocator =
    upnvme::dma::alloc_count::CountingAllocator;

/// `upnvme_pool_get` and `upnvme_pool_put` allocate nothing, as docs/capi.md
/// says — also the `get` that finds the pool empty, the normal end of a
/// "get until NULL" loop (it recorded its message by formatting a new
/// string each time). The message is still there afterwards.
#[test]
fn pool_get_and_put_allocate_nothing_even_on_an_empty_pool() {
    let (_m, c) = model();
    let p = Box::into_raw(upnvme_pool::new(c.dma_pool(4096, 2).unwrap()));
    // Earlier errors' message, replaced below (and this thread's slot made).
    fail(UPNVME_EINVAL, "an earlier error");
    let (rounds, n) = upnvme::dma::alloc_count::count(|| {
        let mut rounds = 0;
        for _ in 0..100 {
            // SAFETY: a live pool, this thread's.
            let get = || unsafe { crate::upnvme_pool_get(p) };
            let (a, b, none) = (get(), get(), get());
            assert!(!a.is_null() && !b.is_null() && none.is_null());
            for h in [a, b] {
                // SAFETY: live pool, a handle from it, not in flight.
                assert_eq!(unsafe { crate::upnvme_pool_put(p, h) }, UPNVME_OK);
            }
            rounds += 1;
        }
        rounds
    });
    assert_eq!(rounds, 100);
    assert_eq!(n, 0, "allocations in pool get/put");
    assert!(
        last_error().contains("the pool is empty"),
        "{}",
        last_error()
    );
    // SAFETY: a live pool, not used afterwards.
    unsafe { crate::upnvme_pool_destroy(p) };
}

/// A submission refused because the queue is full (the back-pressure every
/// submission loop meets, UPNVME_EAGAIN) records its message without
/// allocating (before: a formatted String and CString per refusal).
#[test]
fn a_full_queue_refusal_allocates_nothing() {
    let (_m, c) = model();
    let mut qp = pair(&c, 4);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let flush = |q: &mut Qpair<ModelController>| {
        // SAFETY: a command without data, no callback.
        unsafe {
            q.submit(
                1,
                Cmd::Flush,
                std::ptr::null_mut(),
                None,
                std::ptr::null_mut(),
            )
        }
    };
    for round in 0..3 {
        for _ in 0..3 {
            assert_eq!(flush(&mut qp), UPNVME_OK);
        }
        // Earlier errors' message, replaced below.
        fail(UPNVME_EINVAL, "an earlier error");
        let (rc, n) = upnvme::dma::alloc_count::count(|| flush(&mut qp));
        assert_eq!(rc, UPNVME_EAGAIN);
        assert!(last_error().contains("queue is full"), "{}", last_error());
        // The first round may grow the C side's slot lists.
        if round > 0 {
            assert_eq!(n, 0, "allocations in a refused submission");
        }
        let mut reaped = 0;
        while reaped < 3 {
            // SAFETY: live pair, this thread's.
            reaped += unsafe { Qpair::process_completions(qpp, 0) };
        }
    }
}

#[test]
fn a_handle_given_back_to_its_pool_is_refused_everywhere() {
    let (m, c) = model();
    let mut qp = pair(&c, 8);
    let p = Box::into_raw(upnvme_pool::new(c.dma_pool(4096, 2).unwrap()));
    // SAFETY: a live pool, this thread's.
    let b = unsafe { crate::upnvme_pool_get(p) };
    assert!(!b.is_null());
    // SAFETY: live pool, handle from it.
    assert_eq!(unsafe { crate::upnvme_pool_put(p, b) }, UPNVME_OK);
    // `b` is the pool's again (a use after the put, but the pool keeps the
    // handle alive, so it is detected instead of freeing what the pool lists).
    // SAFETY: the handle's memory is alive (in the pool's spare list).
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_EINVAL);
    assert!(
        last_error().contains("given back to its pool"),
        "{}",
        last_error()
    );
    // SAFETY: as above.
    assert_eq!(unsafe { crate::upnvme_pool_put(p, b) }, UPNVME_EINVAL);
    let read = Cmd::Read { slba: 0, blocks: 8 };
    // SAFETY: as above.
    let rc = unsafe { qp.submit(1, read, b, None, std::ptr::null_mut()) };
    assert_eq!(rc, UPNVME_EINVAL);
    // SAFETY: as above.
    assert!(unsafe { upnvme_buf_data(b) }.is_null());
    // The pool still has both buffers and hands the handle out again.
    // SAFETY: live pool.
    assert_eq!(unsafe { crate::upnvme_pool_available(p) }, 2);
    // SAFETY: live pool.
    let x = unsafe { crate::upnvme_pool_get(p) };
    // SAFETY: live pool.
    let y = unsafe { crate::upnvme_pool_get(p) };
    assert!(!x.is_null() && !y.is_null() && (x == b || y == b));
    // SAFETY: a handed-out handle: usable again.
    let rc = unsafe { qp.submit(1, read, b, None, std::ptr::null_mut()) };
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    // SAFETY: live pair, this thread's.
    while unsafe { Qpair::process_completions(qpp, 0) } == 0 {}
    for h in [x, y] {
        // SAFETY: live pool and handle.
        assert_eq!(unsafe { crate::upnvme_pool_put(p, h) }, UPNVME_OK);
    }
    // SAFETY: live pool, given up.
    unsafe { crate::upnvme_pool_destroy(p) };
    drop(qp);
    drop(c);
    assert_eq!(m.dma_faults(), 0);
}

#[test]
fn a_buffer_the_driver_keeps_has_no_data_pointer_afterwards() {
    let (_m, c) = model();
    let b = handle(&c, 4096);
    // SAFETY: a live handle, this test's only reference to it.
    let h = unsafe { &mut *b };
    let data = h.buf.take();
    h.inflight = true;
    assert!(data.is_some());
    // The command ended without the buffer (the device might still use it).
    h.settle(None);
    assert!(h.buf.is_none() && !h.inflight);
    // SAFETY: as above.
    let data = unsafe { upnvme_buf_data(b) };
    // SAFETY: as above.
    let len = unsafe { crate::upnvme_buf_len(b) };
    // SAFETY: as above.
    let iova = unsafe { crate::upnvme_buf_iova(b) };
    assert!(data.is_null(), "no pointer to memory the handle lost");
    assert_eq!((len, iova), (0, 0));
    // SAFETY: as above; freed once.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
}

/// Tries to submit a read on the pair behind `arg` from inside the callback
/// (refused while the pair is being destroyed), then records the status.
struct Ending {
    qp: *mut Qpair<ModelController>,
    seen: Vec<(c_int, bool)>,
    resubmit: Vec<c_int>,
}

unsafe extern "C" fn ending_cb(arg: *mut c_void, cpl: *const upnvme_cpl) {
    // SAFETY: `arg` is the test's `Ending`, alive for the whole test.
    let e = unsafe { &mut *arg.cast::<Ending>() };
    // SAFETY: valid for the call.
    let cpl = unsafe { &*cpl };
    // SAFETY: the handle is the application's again.
    let no_data = unsafe { upnvme_buf_data(cpl.buf) }.is_null();
    e.seen.push((cpl.status, no_data));
    let read = Cmd::Read { slba: 0, blocks: 8 };
    // SAFETY: the pair is alive while its callbacks run; no reference to
    // it is held by the caller.
    let q = unsafe { &mut *e.qp };
    // SAFETY: a live handle.
    e.resubmit
        .push(unsafe { q.submit(1, read, cpl.buf, None, std::ptr::null_mut()) });
}

#[test]
fn a_pair_whose_device_vanished_can_be_destroyed_and_each_command_ends_once() {
    let (m, c) = model();
    let mut qp = pair(&c, 8);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let bufs = [handle(&c, 4096), handle(&c, 4096)];
    let mut e = Ending {
        qp: qpp,
        seen: Vec::new(),
        resubmit: Vec::new(),
    };
    let arg: *mut Ending = &mut e;
    // While the controller works, destroy waits for commands in flight.
    m.inject(upnvme_tests::Fault::DelayCompletion {
        on: upnvme_tests::Match::Queue(qp.qp.qid()),
        doorbells: None,
    });
    let read = Cmd::Read { slba: 0, blocks: 8 };
    // SAFETY: live handle and pair.
    let rc = unsafe { qp.submit(1, read, bufs[0], Some(ending_cb), arg.cast()) };
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::end_for_destroy(qpp) }, UPNVME_EBUSY);
    assert!(last_error().contains("in flight"), "{}", last_error());
    // The device vanishes with a second command in flight; the admin path
    // finds it gone. Completions can never come now.
    m.inject(upnvme_tests::Fault::UnplugOn(upnvme_tests::Match::Queue(
        qp.qp.qid(),
    )));
    // SAFETY: live handle and pair.
    let rc = unsafe { qp.submit(1, read, bufs[1], Some(ending_cb), arg.cast()) };
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    assert!(c.smart_log().is_err());
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::process_completions(qpp, 0) }, UPNVME_ENODEV);
    assert_eq!(qp.qp.in_flight(), 2);
    // Destroy ends both, once each, with ENODEV and no data pointer; the
    // pair refuses the callbacks' submissions.
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::end_for_destroy(qpp) }, UPNVME_OK);
    assert_eq!(e.seen, vec![(UPNVME_ENODEV, true); 2]);
    assert_eq!(e.resubmit, vec![UPNVME_ENODEV; 2]);
    for b in bufs {
        // SAFETY: live handles, no longer in flight; freed once.
        assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    }
    drop(qp);
    let _ = c.close();
    assert_eq!(m.dma_faults(), 0);
}

/// A poisoned pair (a submission unwound) is destroyed without running its
/// commands' callbacks; the buffer handles of those commands come back
/// empty and not in flight, so the caller can free them (they stayed in
/// flight for ever before: `upnvme_buf_free` said EBUSY).
#[test]
fn destroying_a_poisoned_pair_hands_its_buffer_handles_back_empty() {
    let (m, c) = model();
    let mut qp = pair(&c, 8);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let b = handle(&c, 4096);
    m.inject(upnvme_tests::Fault::DelayCompletion {
        on: upnvme_tests::Match::Queue(qp.qp.qid()),
        doorbells: None,
    });
    // SAFETY: live handle and pair; no callback.
    let rc = unsafe {
        qp.submit(
            1,
            Cmd::Read { slba: 0, blocks: 8 },
            b,
            None,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    // SAFETY: the test's live handle.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_EBUSY, "in flight");
    qp.poison();
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::end_for_destroy(qpp) }, UPNVME_OK);
    // SAFETY: the test's live handle.
    assert!(unsafe { upnvme_buf_data(b) }.is_null());
    // SAFETY: as above; freed once.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    drop(qp);
    let _ = c.close();
    assert_eq!(m.dma_faults(), 0);
}

/// A destroy that succeeds leaves the thread's last error message as it
/// was, though it met (and handled) a controller that cannot take commands
/// on the way: a C caller's pointer from `upnvme_last_error` stays valid
/// until a call fails.
#[test]
fn a_destroy_that_succeeds_keeps_the_last_error_message() {
    let (m, c) = model();
    let mut qp = pair(&c, 8);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let b = handle(&c, 4096);
    m.inject(upnvme_tests::Fault::UnplugOn(upnvme_tests::Match::Queue(
        qp.qp.qid(),
    )));
    // SAFETY: live handle and pair; no callback.
    let rc = unsafe {
        qp.submit(
            1,
            Cmd::Read { slba: 0, blocks: 8 },
            b,
            None,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    assert!(c.smart_log().is_err());
    crate::status::fail(UPNVME_EINVAL, "the caller's last error");
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::end_for_destroy(qpp) }, UPNVME_OK);
    assert_eq!(last_error(), "the caller's last error");
    // SAFETY: the test's live handle, no longer in flight; freed once.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    drop(qp);
    let _ = c.close();
    assert_eq!(m.dma_faults(), 0);
}

#[test]
fn a_panic_becomes_an_error_code_with_a_message() {
    let rc = guard(|| panic!("boom"));
    assert_eq!(rc, UPNVME_EINTERNAL);
    assert!(last_error().contains("boom"), "{}", last_error());
    // SAFETY: static strings.
    let s = unsafe { CStr::from_ptr(crate::upnvme_strerror(UPNVME_EAGAIN)) };
    assert_eq!(
        s.to_str().unwrap(),
        "busy: a full queue pair (reap completions) or every admin command identifier taken; retry"
    );
}

#[test]
fn options_are_read_only_as_far_as_the_callers_struct_goes() {
    use crate::upnvme_qpair_opts;
    // A caller compiled against a struct of 8 bytes (size, entries): the
    // fields after it keep their defaults.
    let mut o = upnvme_qpair_opts {
        size: 8,
        entries: 64,
        shadow_doorbells: false,
        reap_on_submit: true,
        command_timeout_ms: 5,
        sq_announce_each_command: true,
        delay_doorbell: true,
    };
    // SAFETY: `o` is readable for its whole size.
    let r = unsafe { read_sized(&o) }.unwrap();
    assert!(!r.delay_doorbell, "beyond the caller's size: the default");
    let d = upnvme_qpair_opts::default();
    assert_eq!(r.entries, 64);
    assert_eq!(
        (
            r.shadow_doorbells,
            r.reap_on_submit,
            r.command_timeout_ms,
            r.sq_announce_each_command
        ),
        (
            d.shadow_doorbells,
            d.reap_on_submit,
            d.command_timeout_ms,
            d.sq_announce_each_command
        )
    );
    // A caller from before `delay_doorbell` (its struct ends there).
    o.size = std::mem::offset_of!(upnvme_qpair_opts, delay_doorbell) as u32;
    // SAFETY: as above.
    let r = unsafe { read_sized(&o) }.unwrap();
    assert!(r.sq_announce_each_command && !r.delay_doorbell);
    o.size = std::mem::size_of::<upnvme_qpair_opts>() as u32;
    // SAFETY: as above.
    let r = unsafe { read_sized(&o) }.unwrap();
    assert!(r.reap_on_submit && !r.shadow_doorbells && r.delay_doorbell);
    assert!(r.sq_announce_each_command && !d.sq_announce_each_command);
    assert_eq!(r.to_options().sq_announce, upnvme::SqAnnounce::EachCommand);
    assert_eq!(d.to_options().sq_announce, upnvme::SqAnnounce::DEEP);
    // NULL: the defaults.
    // SAFETY: null is allowed.
    let r = unsafe { read_sized::<upnvme_qpair_opts>(std::ptr::null()) }.unwrap();
    assert_eq!(r.entries, 0);
    // Size 0 (a struct set up without `upnvme_qpair_opts_init`): refused,
    // not read as "nothing" with the caller's fields dropped.
    o.size = 0;
    // SAFETY: as above.
    assert_eq!(unsafe { read_sized(&o) }.unwrap_err(), UPNVME_EINVAL);
    assert!(last_error().contains("*_opts_init"), "{}", last_error());
}

#[test]
fn option_bools_with_any_nonzero_byte_read_as_true() {
    use crate::{upnvme_ctrl_opts, upnvme_qpair_opts};
    use std::mem::{offset_of, size_of};
    // A C caller that cleared the struct with memset(0xff) and set its size.
    let mut raw = [0xffu8; size_of::<upnvme_qpair_opts>()];
    raw[..4].copy_from_slice(&(size_of::<upnvme_qpair_opts>() as u32).to_ne_bytes());
    raw[offset_of!(upnvme_qpair_opts, reap_on_submit)] = 0x02;
    // SAFETY: `raw` holds the struct's size in its first 4 bytes and is
    // readable for that many; `read_sized` copies bytes, not a value.
    let r = unsafe { read_sized(raw.as_ptr().cast::<upnvme_qpair_opts>()) }.unwrap();
    // SAFETY: the three fields are bools in `r` (a Rust value now); their
    // bytes are what `read_sized` stored.
    let p = (&raw const r).cast::<u8>();
    let byte_at = |off: usize| {
        // SAFETY: `off` is a field offset inside `r`, a live, initialised
        // value; reading one byte of it as u8 is always valid.
        unsafe { p.wrapping_add(off).read() }
    };
    let bytes = [
        byte_at(offset_of!(upnvme_qpair_opts, shadow_doorbells)),
        byte_at(offset_of!(upnvme_qpair_opts, reap_on_submit)),
        byte_at(offset_of!(upnvme_qpair_opts, sq_announce_each_command)),
    ];
    assert_eq!(bytes, [1, 1, 1], "bool bytes normalised to 1");
    assert_eq!(r.entries, u32::MAX);
    let mut raw = [0xffu8; size_of::<upnvme_ctrl_opts>()];
    raw[..4].copy_from_slice(&(size_of::<upnvme_ctrl_opts>() as u32).to_ne_bytes());
    raw[offset_of!(upnvme_ctrl_opts, shadow_doorbells)] = 0;
    // SAFETY: as above.
    let c = unsafe { read_sized(raw.as_ptr().cast::<upnvme_ctrl_opts>()) }.unwrap();
    // SAFETY: as above.
    let b = (&raw const c)
        .cast::<u8>()
        .wrapping_add(offset_of!(upnvme_ctrl_opts, no_hugepages));
    // SAFETY: a byte of `c`, a live, initialised value.
    let b = unsafe { b.read() };
    assert_eq!(b, 1);
    assert!(c.no_hugepages && !c.shadow_doorbells);
}

/// Records each completion's status and, the first time, tries to free the
/// buffer handle of another command of the same batch.
struct FreeOther {
    other: *mut upnvme_buf,
    seen: Vec<c_int>,
    free_rc: Vec<c_int>,
}

unsafe extern "C" fn free_other_cb(arg: *mut c_void, cpl: *const upnvme_cpl) {
    // SAFETY: `arg` is the test's `FreeOther`, alive for the whole test.
    let f = unsafe { &mut *arg.cast::<FreeOther>() };
    // SAFETY: valid for the call.
    f.seen.push(unsafe { (*cpl).status });
    if f.free_rc.is_empty() {
        // SAFETY: a handle of the test, live (the call must refuse it while
        // its command has not ended).
        f.free_rc.push(unsafe { upnvme_buf_free(f.other) });
    }
}

#[test]
fn destroy_keeps_each_ended_buffer_in_flight_until_its_own_callback() {
    let (m, c) = model();
    let mut qp = pair(&c, 8);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let bufs = [handle(&c, 4096), handle(&c, 4096)];
    let mut f = FreeOther {
        other: bufs[1],
        seen: Vec::new(),
        free_rc: Vec::new(),
    };
    let arg: *mut FreeOther = &mut f;
    m.inject(upnvme_tests::Fault::UnplugOn(upnvme_tests::Match::Queue(
        qp.qp.qid(),
    )));
    let read = Cmd::Read { slba: 0, blocks: 8 };
    for b in bufs {
        // SAFETY: live handle and pair.
        let rc = unsafe { qp.submit(1, read, b, Some(free_other_cb), arg.cast()) };
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
    }
    assert!(c.smart_log().is_err(), "the device is gone");
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::end_for_destroy(qpp) }, UPNVME_OK);
    assert_eq!(f.seen, vec![UPNVME_ENODEV; 2]);
    // The first callback could not free the second command's handle: that
    // command had not ended yet (freed, its callback would have got a
    // dangling pointer).
    assert_eq!(f.free_rc, vec![UPNVME_EBUSY]);
    for b in bufs {
        // SAFETY: live handles, their commands ended; freed once.
        assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    }
    drop(qp);
    assert_eq!(m.dma_faults(), 0);
}

/// Three reads whose completions the model holds back, each counted into
/// `seen` by `count_cb`; returns their buffer handles.
fn three_held_reads(
    m: &ModelController,
    c: &Controller<ModelController>,
    qp: &mut Qpair<ModelController>,
    seen: &mut Vec<c_int>,
) -> [*mut upnvme_buf; 3] {
    for _ in 0..3 {
        m.inject(upnvme_tests::Fault::DelayCompletion {
            on: upnvme_tests::Match::Queue(qp.qp.qid()),
            doorbells: None,
        });
    }
    let bufs = [handle(c, 4096), handle(c, 4096), handle(c, 4096)];
    let arg: *mut Vec<c_int> = seen;
    let read = Cmd::Read { slba: 0, blocks: 8 };
    for b in bufs {
        // SAFETY: live handle and pair.
        let rc = unsafe { qp.submit(1, read, b, Some(count_cb), arg.cast()) };
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
    }
    bufs
}

#[test]
fn destroy_delivers_completions_the_library_parked_after_a_close() {
    let (m, c) = model();
    let mut qp = pair(&c, 8);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let mut seen: Vec<c_int> = Vec::new();
    let bufs = three_held_reads(&m, &c, &mut qp, &mut seen);
    // Closing the controller ends the three; one poll delivers one and the
    // library parks the other two (its own in-flight count is then 0).
    c.close().unwrap();
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::process_completions(qpp, 1) }, 1);
    assert_eq!(qp.qp.in_flight(), 0);
    // SAFETY: a live pair.
    assert_eq!(unsafe { crate::upnvme_qpair_in_flight(qpp.cast()) }, 2);
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::end_for_destroy(qpp) }, UPNVME_OK);
    assert_eq!(seen.len(), 3, "every callback ran: {seen:?}");
    assert!(seen.iter().all(|&s| s != UPNVME_OK), "{seen:?}");
    for b in bufs {
        // SAFETY: live handles, their commands ended; freed once.
        assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    }
    drop(qp);
    assert_eq!(m.dma_faults(), 0);
}

/// A poll whose callbacks ran returns their count even when the
/// controller turns out closed after them; the error is the next call's
/// (before, the call returned `UPNVME_ENODEV` after running the callbacks,
/// so a caller such as fio could not tell which commands had ended).
#[test]
fn callbacks_that_ran_are_counted_and_the_error_comes_next() {
    let (m, c) = model();
    let mut qp = pair(&c, 8);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let mut seen: Vec<c_int> = Vec::new();
    let bufs = three_held_reads(&m, &c, &mut qp, &mut seen);
    c.close().unwrap();
    // SAFETY: live pair, this thread's.
    let rc = unsafe { Qpair::process_completions(qpp, 0) };
    assert_eq!(rc, 3, "the count of callbacks run: {seen:?}");
    assert_eq!(seen.len(), 3);
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::process_completions(qpp, 0) }, UPNVME_ENODEV);
    for b in bufs {
        // SAFETY: live handles, their commands ended; freed once.
        assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    }
    drop(qp);
    assert_eq!(m.dma_faults(), 0);
}

/// Resubmits the same read from its own callback while `left` lasts.
struct Forever {
    qp: *mut Qpair<ModelController>,
    left: u32,
    ran: u32,
}

unsafe extern "C" fn forever_cb(arg: *mut c_void, cpl: *const upnvme_cpl) {
    // SAFETY: `arg` is the test's `Forever`, alive for the whole test.
    let f = unsafe { &mut *arg.cast::<Forever>() };
    f.ran += 1;
    if f.left == 0 {
        return;
    }
    f.left -= 1;
    // SAFETY: the pair is alive while its callbacks run.
    let q = unsafe { &mut *f.qp };
    let read = Cmd::Read { slba: 0, blocks: 1 };
    // SAFETY: valid for the call.
    let buf = unsafe { (*cpl).buf };
    // SAFETY: the handle is the application's again; resubmitted at once.
    let rc = unsafe { q.submit(1, read, buf, Some(forever_cb), arg) };
    assert_eq!(rc, UPNVME_OK);
}

#[test]
fn process_completions_zero_runs_at_most_the_pairs_depth_per_call() {
    let (m, c) = model();
    let mut qp = pair(&c, 8);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let depth = qp.qp.max_depth();
    let mut f = Forever {
        qp: qpp,
        left: 10_000,
        ran: 0,
    };
    let arg: *mut Forever = &mut f;
    let b = handle(&c, 4096);
    let read = Cmd::Read { slba: 0, blocks: 1 };
    // SAFETY: live handle and pair.
    let rc = unsafe { qp.submit(1, read, b, Some(forever_cb), arg.cast()) };
    assert_eq!(rc, UPNVME_OK);
    // The model completes each resubmission at once: without a cap one
    // call would run all 10 000 callbacks.
    // SAFETY: live pair, this thread's.
    let n = unsafe { Qpair::process_completions(qpp, 0) };
    assert!(
        n >= 1 && n as u32 <= depth,
        "{n} callbacks in one call (depth {depth})"
    );
    // Drain.
    // SAFETY: the test's `Forever`; no callback runs now.
    unsafe { (*arg).left = 0 };
    // SAFETY: a live pair.
    while unsafe { crate::upnvme_qpair_in_flight(qpp.cast()) } > 0 {
        // SAFETY: live pair, this thread's.
        assert!(unsafe { Qpair::process_completions(qpp, 0) } >= 0);
    }
    // SAFETY: live handle, its command ended; freed once.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    drop(qp);
    assert_eq!(m.dma_faults(), 0);
}

#[test]
fn unsupported_commands_and_metadata_namespaces_are_enotsup() {
    let (m, c) = model_with(ModelConfig {
        oncs: 0,
        namespaces: vec![
            NamespaceConfig {
                nsid: 1,
                lba_size: 512,
                blocks: BLOCKS,
                ..NamespaceConfig::default()
            },
            NamespaceConfig {
                nsid: 2,
                lba_size: 512,
                blocks: BLOCKS,
                ms: 8,
                extended: true,
                ..NamespaceConfig::default()
            },
        ],
        ..Default::default()
    });
    let mut qp = pair(&c, 8);
    let ranges = [crate::qpair::upnvme_range { slba: 0, blocks: 8 }];
    let dsm = Cmd::Deallocate { ranges: &ranges };
    // SAFETY: no buffer.
    let rc = unsafe { qp.submit(1, dsm, std::ptr::null_mut(), None, std::ptr::null_mut()) };
    assert_eq!(rc, UPNVME_ENOTSUP, "{}", last_error());
    let b = handle(&c, 8 * 520);
    let read = Cmd::Read { slba: 0, blocks: 8 };
    // SAFETY: live handle.
    let rc = unsafe { qp.submit(2, read, b, None, std::ptr::null_mut()) };
    assert_eq!(rc, UPNVME_ENOTSUP);
    assert!(last_error().contains("has metadata"), "{}", last_error());
    // SAFETY: live handle, never submitted; freed once.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    drop(qp);
    assert_eq!(m.dma_faults(), 0);
}

#[test]
fn putting_back_a_pool_buffer_the_driver_kept_says_to_free_it() {
    let (_m, c) = model();
    let p = Box::into_raw(upnvme_pool::new(c.dma_pool(4096, 2).unwrap()));
    // SAFETY: a live pool, this thread's.
    let b = unsafe { crate::upnvme_pool_get(p) };
    assert!(!b.is_null());
    // SAFETY: a live handle, this test's only reference to it.
    let h = unsafe { &mut *b };
    let _kept = h.buf.take();
    h.inflight = true;
    // The command ended without the buffer (the device might still use it).
    h.settle(None);
    // SAFETY: live pool and handle.
    assert_eq!(unsafe { crate::upnvme_pool_put(p, b) }, UPNVME_EINVAL);
    assert!(last_error().contains("upnvme_buf_free"), "{}", last_error());
    // SAFETY: the handle is still the caller's; freed once.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    // SAFETY: made by Box::into_raw above.
    drop(unsafe { Box::from_raw(p) });
}

#[test]
fn a_panic_inside_submit_leaves_the_handle_freeable_without_memory() {
    let (_m, c) = model();
    let b = handle(&c, 4096);
    // What `submit` does up to the library call, then a panic.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let guard = crate::qpair::Unwound([b, std::ptr::null_mut()]);
        // SAFETY: the test's live handle; no other reference to it now.
        let taken = unsafe { (*b).buf.take() };
        assert!(taken.is_some());
        let _keep = (guard, taken);
        panic!("inside the library");
    }));
    assert!(r.is_err());
    // SAFETY: the test's live handle.
    let h = unsafe { &*b };
    assert!(h.buf.is_none() && !h.inflight);
    // SAFETY: as above.
    assert!(unsafe { upnvme_buf_data(b) }.is_null());
    // SAFETY: as above; freed once.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
}

#[test]
fn opts_init_writes_no_more_than_the_callers_struct() {
    use crate::qpair::upnvme_qpair_opts;
    // A caller built against the struct before `sq_announce_each_command`:
    // its struct ends there; the byte after it is someone else's.
    let old = std::mem::offset_of!(upnvme_qpair_opts, sq_announce_each_command);
    let mut mem = [0xa5u8; 64];
    let p = mem.as_mut_ptr().cast::<upnvme_qpair_opts>();
    // SAFETY: `old` bytes of `mem` are writable.
    assert_eq!(unsafe { crate::upnvme_qpair_opts_init(p, old) }, UPNVME_OK);
    assert!(
        mem[old..].iter().all(|&b| b == 0xa5),
        "wrote past the caller's struct"
    );
    assert_eq!(
        u32::from_ne_bytes(mem[..4].try_into().unwrap()) as usize,
        old
    );
    // Read back as the library reads a caller's struct: the fields it
    // holds are the defaults, the missing one the default too.
    // SAFETY: `mem` holds at least `size` readable bytes.
    let o = unsafe { crate::status::read_sized(p) }.unwrap();
    let d = upnvme_qpair_opts::default();
    assert_eq!(
        (
            o.entries,
            o.shadow_doorbells,
            o.command_timeout_ms,
            o.sq_announce_each_command
        ),
        (
            d.entries,
            d.shadow_doorbells,
            d.command_timeout_ms,
            d.sq_announce_each_command
        )
    );
    // The whole struct, and the refusals.
    let mut full = [0u8; std::mem::size_of::<upnvme_qpair_opts>()];
    let fp = full.as_mut_ptr().cast::<upnvme_qpair_opts>();
    // SAFETY: the whole struct is writable.
    let rc = unsafe { crate::upnvme_qpair_opts_init(fp, std::mem::size_of::<upnvme_qpair_opts>()) };
    assert_eq!(rc, UPNVME_OK);
    assert_eq!(
        u32::from_ne_bytes(full[..4].try_into().unwrap()) as usize,
        std::mem::size_of::<upnvme_qpair_opts>()
    );
    // SAFETY: NULL is refused before any write.
    let rc = unsafe { crate::upnvme_qpair_opts_init(std::ptr::null_mut(), 20) };
    assert_eq!(rc, UPNVME_EINVAL);
    // SAFETY: too small for the size field: refused before any write.
    let rc = unsafe { crate::upnvme_ctrl_opts_init(fp.cast(), 2) };
    assert_eq!(rc, UPNVME_EINVAL);
}

/// Records the status of each completion.
unsafe extern "C" fn status_cb(arg: *mut c_void, cpl: *const upnvme_cpl) {
    // SAFETY: valid for the call.
    let cpl = unsafe { &*cpl };
    // SAFETY: `arg` is the test's Vec, alive for the whole test and not
    // otherwise borrowed while the pair runs callbacks.
    let seen = unsafe { &mut *arg.cast::<Vec<(c_int, *mut upnvme_buf)>>() };
    seen.push((cpl.status, cpl.buf));
}

#[test]
fn a_namespace_changed_elsewhere_is_refused_until_the_refresh_then_used_with_its_new_geometry() {
    let (m, c) = model();
    let h = crate::Ctrl::new(c);
    let mut q = shared_pair(&h, 8);
    // Another host formats namespace 1 to 4 KiB blocks.
    m.change_namespace(
        1,
        Some(NamespaceConfig {
            nsid: 1,
            lba_size: 4096,
            blocks: 32,
            ..NamespaceConfig::default()
        }),
    );
    let mut ev = [crate::upnvme_async_event::default(); 4];
    assert_eq!(h.poll_events(&mut ev).unwrap(), 1);
    assert_eq!(
        (ev[0].event_type, ev[0].event_info, ev[0].log_page),
        (2, 0, 4)
    );
    // One "512-byte" block would move 4096 bytes: refused.
    let b = handle(&h.get().unwrap(), 4096);
    let read = Cmd::Read { slba: 0, blocks: 1 };
    // SAFETY: a live handle.
    let rc = unsafe { q.submit(1, read, b, None, std::ptr::null_mut()) };
    assert_eq!(rc, UPNVME_EINVAL);
    assert!(
        last_error().contains("formatted or changed"),
        "{}",
        last_error()
    );
    // After the refresh the pair takes the new handle: 4096 bytes per block.
    assert_eq!(h.refresh().unwrap().changed, vec![1]);
    assert_eq!(h.ns_info(1).unwrap().lba_size, 4096);
    m.write_namespace_data(1, 2, &[0x5a; 4096]);
    let mut seen: Vec<(c_int, *mut upnvme_buf)> = Vec::new();
    let read = Cmd::Read { slba: 2, blocks: 1 };
    // SAFETY: a live handle; `seen` outlives the pair's callbacks.
    let rc = unsafe {
        q.submit(
            1,
            read,
            b,
            Some(status_cb),
            (&mut seen as *mut Vec<(c_int, *mut upnvme_buf)>).cast(),
        )
    };
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    for _ in 0..1000 {
        // SAFETY: the pair is alive and not otherwise borrowed.
        unsafe { Qpair::process_completions(&mut *q, 0) };
        if !seen.is_empty() {
            break;
        }
    }
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, UPNVME_OK);
    // SAFETY: the handle is the test's again.
    let data = unsafe { upnvme_buf_data(b) };
    // SAFETY: 4096 bytes of the live buffer.
    let got = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), 4096) };
    assert!(got.iter().all(|&x| x == 0x5a));
    // SAFETY: freed once.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    // More events than the array holds are handed out over two calls.
    // (Two types: a controller masks a type it reported until its log is
    // read.)
    m.raise_async_event(1, 0, 2);
    m.raise_async_event(0, 0, 1);
    let mut one = [crate::upnvme_async_event::default(); 1];
    let mut got = 0;
    for _ in 0..3 {
        got += h.poll_events(&mut one).unwrap();
    }
    assert_eq!(got, 2);
    drop(q);
    assert_eq!(m.dma_faults(), 0);
}

/// A namespace changed inside an automatic controller reset (a queue
/// pair's recovery) raises no notice. The next
/// `upnvme_ctrl_poll_async_events` retires its handle (the pairs refuse it
/// with "formatted or changed") and hands out a Namespace Attribute Changed
/// event of its own, so an application that follows the documented
/// protocol (refresh on that event) refreshes.
#[test]
fn a_namespace_changed_inside_an_automatic_reset_is_announced() {
    use upnvme_tests::{Fault, Match};
    let (m, c) = model();
    let h = crate::Ctrl::new(c);
    let mut rust_pair = h
        .get()
        .unwrap()
        .io_queue_pair(QueuePairOptions::default())
        .unwrap();
    m.inject(Fault::FatalOn(Match::Opcode {
        qid: rust_pair.qid(),
        opcode: 0x02,
    }));
    m.inject(Fault::ChangeNamespaceOn {
        on: Match::Identify { cns: 1, nsid: 0 },
        nsid: 1,
        to: Some(NamespaceConfig {
            nsid: 1,
            lba_size: 4096,
            blocks: 32,
            ..NamespaceConfig::default()
        }),
    });
    let ns = h.get().unwrap().namespace(1).unwrap().clone();
    let buf = h.get().unwrap().alloc_dma(512).unwrap();
    assert!(
        rust_pair
            .read_blocking(&ns, 0, 1, buf, Duration::from_secs(30))
            .is_err()
    );
    assert_eq!(h.get().unwrap().resets(), 1);
    drop(rust_pair);
    let mut q = Box::new(Qpair::new(
        h.get()
            .unwrap()
            .io_queue_pair(QueuePairOptions {
                entries: Some(8),
                ..Default::default()
            })
            .unwrap(),
        h.nss.clone(),
    ));
    let mut ev = [crate::upnvme_async_event::default(); 4];
    let n = h.poll_events(&mut ev).unwrap();
    let b = handle(&h.get().unwrap(), 4096);
    // SAFETY: a live handle.
    let rc = unsafe {
        q.submit(
            1,
            Cmd::Read { slba: 0, blocks: 1 },
            b,
            None,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, UPNVME_EINVAL, "the handle was retired by the poll");
    assert!(
        last_error().contains("formatted or changed"),
        "{}",
        last_error()
    );
    // SAFETY: refused: the handle is the test's again.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    assert!(
        ev[..n]
            .iter()
            .any(|e| (e.event_type, e.event_info) == (2, 0)),
        "the poll that retired namespace 1 handed out {n} events: nothing tells the \
         application to call upnvme_ctrl_refresh_namespaces"
    );
    drop(q);
    drop(h);
}

mod send_sync {
    #[allow(dead_code)]
    fn send<T: Send>() {}
    #[allow(dead_code)]
    fn sync<T: Sync>() {}
    #[test]
    fn inner_types_cross_threads() {
        send::<upnvme::IoQueuePair<upnvme::VfioNvme>>();
        send::<upnvme::DmaBuffer>();
        send::<upnvme::DmaPool>();
        send::<crate::ctrl::Ctrl<upnvme::VfioNvme>>();
        sync::<crate::ctrl::Ctrl<upnvme::VfioNvme>>();
        sync::<upnvme::Controller<upnvme::VfioNvme>>();
    }
}

#[test]
fn huge_lengths_from_c_are_refused() {
    let (_m, c) = model();
    for len in [
        0usize,
        usize::MAX,
        usize::MAX - 4095,
        usize::MAX / 2 + 1,
        1 << 62,
        isize::MAX as usize,
    ] {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            c.alloc_dma(len).map(|b| b.len())
        }));
        assert!(matches!(r, Ok(Err(_))), "alloc_dma({len:#x}) -> {r:?}");
    }
    for (len, count) in [
        (usize::MAX, 1usize),
        (usize::MAX - 4095, 1),
        (4096, usize::MAX),
        (1, usize::MAX / 4096 + 1),
        (4096, 1 << 40),
        (0, 1),
        (1, 0),
    ] {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            c.dma_pool(len, count).map(|p| p.capacity())
        }));
        assert!(
            matches!(r, Ok(Err(_))),
            "dma_pool({len:#x}, {count:#x}) -> {r:?}"
        );
    }
    let b = handle(&c, 8192);
    let mut pieces = [std::ptr::null_mut(); 4];
    let mut n = 0usize;
    for pl in [usize::MAX, 8193, 1 << 40] {
        // SAFETY: live handle, arrays valid.
        let rc = unsafe { crate::upnvme_buf_split(b, pl, pieces.as_mut_ptr(), 0, &mut n) };
        assert_eq!(rc, UPNVME_EINVAL, "split({pl:#x}): {}", last_error());
    }
    // SAFETY: live handle, not in flight.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
}

struct CloseIn {
    ctrl: Option<Controller<ModelController>>,
    qp: *mut Qpair<ModelController>,
    seen: Vec<c_int>,
    destroy_rc: Vec<c_int>,
}

unsafe extern "C" fn close_in_cb(arg: *mut c_void, cpl: *const upnvme_cpl) {
    // SAFETY: the test's CloseIn.
    let s = unsafe { &mut *arg.cast::<CloseIn>() };
    // SAFETY: valid for the call.
    s.seen.push(unsafe { (*cpl).status });
    // SAFETY: valid for the call.
    let buf = unsafe { (*cpl).buf };
    // SAFETY: the handle is ours again.
    assert_eq!(unsafe { upnvme_buf_free(buf) }, UPNVME_OK);
    if let Some(c) = s.ctrl.take() {
        let _ = c.close();
    }
    // SAFETY: live pair, this thread's.
    s.destroy_rc.push(unsafe { Qpair::end_for_destroy(s.qp) });
}

#[test]
fn a_callback_may_close_the_controller_and_free_its_buffer() {
    let (m, c) = model();
    let mut qp = pair(&c, 8);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let bufs = [handle(&c, 4096), handle(&c, 4096), handle(&c, 4096)];
    let mut s = CloseIn {
        ctrl: None,
        qp: qpp,
        seen: vec![],
        destroy_rc: vec![],
    };
    let arg: *mut CloseIn = &mut s;
    for _ in 0..2 {
        m.inject(upnvme_tests::Fault::DelayCompletion {
            on: upnvme_tests::Match::Queue(qp.qp.qid()),
            doorbells: None,
        });
    }
    let read = Cmd::Read { slba: 0, blocks: 8 };
    // first completes; the next two are held
    for b in bufs {
        // SAFETY: live handle and pair.
        let rc = unsafe { qp.submit(1, read, b, Some(close_in_cb), arg.cast()) };
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
    }
    s.ctrl = Some(c);
    let mut rcs = vec![];
    for _ in 0..4 {
        // SAFETY: live pair, this thread's.
        rcs.push(unsafe { Qpair::process_completions(qpp, 0) });
    }
    assert_eq!(rcs.iter().filter(|&&r| r > 0).count(), 1, "{rcs:?}");
    // SAFETY: live pair, this thread's.
    let rc = unsafe { Qpair::end_for_destroy(qpp) };
    assert_eq!(rc, UPNVME_OK);
    assert_eq!(s.seen.len(), 3);
    drop(qp);
    assert_eq!(m.dma_faults(), 0);
}

#[test]
fn a_buffer_of_another_controller_is_refused_and_handed_back() {
    let (ma, a) = model();
    let (mb, b) = model();
    let mut qp = pair(&b, 8);
    let h = handle(&a, 4096);
    let read = Cmd::Read { slba: 0, blocks: 8 };
    // SAFETY: live handle and pair.
    let rc = unsafe { qp.submit(1, read, h, None, std::ptr::null_mut()) };
    assert_eq!(rc, UPNVME_EINVAL, "{}", last_error());
    // SAFETY: live handle: the refusal handed the buffer back.
    assert!(!unsafe { upnvme_buf_data(h) }.is_null());
    // SAFETY: live, not in flight.
    assert_eq!(unsafe { upnvme_buf_free(h) }, UPNVME_OK);
    drop(qp);
    assert_eq!(ma.dma_faults() + mb.dma_faults(), 0);
}

#[test]
fn duplicate_and_corrupt_completions_through_the_capi_fail_cleanly() {
    use upnvme_tests::{Fault, Match};
    for fault in 0..3 {
        let (m, c) = model();
        let mut qp = pair(&c, 8);
        let qpp: *mut Qpair<ModelController> = &mut *qp;
        let mut seen: Vec<c_int> = Vec::new();
        let arg: *mut Vec<c_int> = &mut seen;
        let f = match fault {
            0 => Fault::DuplicateCompletion(Match::Queue(qp.qp.qid())),
            1 => Fault::CorruptCid {
                on: Match::Queue(qp.qp.qid()),
                xor: 0x8000,
            },
            _ => Fault::CorruptCid {
                on: Match::Queue(qp.qp.qid()),
                xor: 0x0001,
            },
        };
        m.inject(f);
        let bufs = [handle(&c, 4096), handle(&c, 4096), handle(&c, 4096)];
        let read = Cmd::Read { slba: 0, blocks: 8 };
        let mut submitted = 0;
        for b in bufs {
            // SAFETY: live handle and pair.
            let rc = unsafe { qp.submit(1, read, b, Some(count_cb), arg.cast()) };
            submitted += usize::from(rc == UPNVME_OK);
            // SAFETY: live pair.
            let pc = unsafe { Qpair::process_completions(qpp, 0) };
            // Once the controller failed, submissions are refused and the
            // buffer stays the caller's.
            assert!(rc == UPNVME_OK || rc < 0, "{rc}");
            let _ = pc;
        }
        for _ in 0..3 {
            // SAFETY: live pair.
            let _ = unsafe { Qpair::process_completions(qpp, 0) };
        }
        // SAFETY: live pair.
        let rc = unsafe { Qpair::end_for_destroy(qpp) };
        assert_eq!(rc, UPNVME_OK, "fault {fault}: {}", last_error());
        assert_eq!(
            seen.len(),
            submitted,
            "fault {fault}: each callback exactly once"
        );
        for b in bufs {
            // SAFETY: live handles, none in flight after the destroy.
            assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK, "fault {fault}");
        }
        drop(qp);
        let _ = m.take_violations();
    }
}

#[test]
fn the_refresh_may_run_while_other_threads_use_the_controller_handle() {
    let (m, c) = model_with(ModelConfig {
        namespaces: vec![
            NamespaceConfig {
                nsid: 1,
                lba_size: 512,
                blocks: BLOCKS,
                ..NamespaceConfig::default()
            },
            NamespaceConfig {
                nsid: 2,
                lba_size: 512,
                blocks: BLOCKS,
                ..NamespaceConfig::default()
            },
        ],
        ..Default::default()
    });
    let h = crate::Ctrl::new(c);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // Two threads read geometry, poll events and allocate through the
        // handle while the main thread changes namespace 2 and refreshes.
        for _ in 0..2 {
            s.spawn(|| {
                let mut calls = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || calls < 50 {
                    let info = h.ns_info(1).unwrap();
                    assert_eq!(info.lba_size, 512, "namespace 1 never changes");
                    // Namespace 2 is either geometry, or absent mid-change.
                    if let Ok(two) = h.ns_info(2) {
                        assert!([512, 4096].contains(&two.lba_size));
                    }
                    let mut ev = [crate::upnvme_async_event::default(); 4];
                    h.poll_events(&mut ev).unwrap();
                    drop(h.get().unwrap().alloc_dma(4096).unwrap());
                    calls += 1;
                }
            });
        }
        for round in 0..20u32 {
            let lba_size = if round % 2 == 0 { 4096 } else { 512 };
            m.change_namespace(
                2,
                Some(NamespaceConfig {
                    nsid: 2,
                    lba_size,
                    blocks: BLOCKS * 512 / u64::from(lba_size),
                    ..NamespaceConfig::default()
                }),
            );
            let changes = h.refresh().unwrap();
            assert_eq!(changes.changed, vec![2], "round {round}");
            assert_eq!(h.ns_info(2).unwrap().lba_size, lba_size);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    drop(h.into_controller());
    assert!(m.pending_faults().is_empty());
}

/// A pair whose queues could not be re-created after a reset cannot take
/// commands now: `UPNVME_ENODEV`, with the library's text (why, and when it
/// tries again) as the last error.
#[test]
fn queues_not_recreated_is_enodev_with_its_reason() {
    let e = upnvme::Error::QueuesNotRecreated {
        device: "model".into(),
        qid: 1,
        failures: 4,
        cause: "Create I/O Completion Queue 1 (after reset) failed".into(),
        retry_in: Duration::from_millis(2),
    };
    assert_eq!(fail_error(&e), UPNVME_ENODEV);
    let text = last_error();
    assert!(
        text.contains("re-creating them failed 4 time(s)") && text.contains("after 2 ms"),
        "{text}"
    );
}

/// Destroy with one completion already reaped (parked by `reap_on_submit`)
/// and one command the device, now gone, will never complete: the parked
/// one is delivered, and the stuck one ends with `UPNVME_ENODEV` in the same
/// call — not `UPNVME_EBUSY`, whose advice (process completions until none
/// is left) could never be followed.
#[test]
fn destroy_delivers_parked_completions_then_ends_what_cannot_complete() {
    use upnvme_tests::{Fault, Match};
    let (m, c) = model();
    let qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(8),
            reap_on_submit: true,
            ..Default::default()
        })
        .unwrap();
    let mut qp = Box::new(Qpair::new(
        qp,
        std::sync::Arc::new(std::sync::Mutex::new(c.namespaces().to_vec())),
    ));
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let mut seen: Vec<c_int> = Vec::new();
    let arg: *mut Vec<c_int> = &mut seen;
    m.inject(Fault::DelayCompletion {
        on: Match::Queue(qp.qp.qid()),
        doorbells: None,
    });
    let bufs = [handle(&c, 4096), handle(&c, 4096)];
    let read = Cmd::Read { slba: 0, blocks: 8 };
    for b in bufs {
        // SAFETY: live pair and handle of this test; the callback and its
        // argument outlive the pair.
        let rc = unsafe { qp.submit(1, read, b, Some(count_cb), arg.cast()) };
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
    }
    assert_eq!(qp.outstanding(), 2);
    m.unplug();
    // The library learns the device is gone (here from an admin command).
    assert!(c.smart_log().is_err());
    // SAFETY: live pair, no callback running.
    let rc = unsafe { Qpair::end_for_destroy(qpp) };
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    assert_eq!(
        seen,
        vec![UPNVME_OK, UPNVME_ENODEV],
        "parked first, then the end"
    );
    drop(qp);
    for b in bufs {
        // SAFETY: handles of this test, no longer in flight.
        assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    }
    drop(c);
}

#[test]
fn a_c_string_is_written_with_its_nul_or_refused_whole() {
    let mut buf = [0x55 as std::ffi::c_char; 8];
    // SAFETY: 8 writable bytes.
    let rc = unsafe { write_c_str(buf.as_mut_ptr(), 8, "abc") };
    assert_eq!(rc, UPNVME_OK);
    // SAFETY: written with its NUL just above.
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) };
    assert_eq!(text.to_str(), Ok("abc"));
    assert_eq!(buf[4], 0x55, "nothing past the NUL");
    let mut short = [0x55 as std::ffi::c_char; 3];
    // SAFETY: 3 writable bytes.
    let rc = unsafe { write_c_str(short.as_mut_ptr(), 3, "abc") };
    assert_eq!(rc, UPNVME_EINVAL);
    assert!(short.iter().all(|&b| b == 0x55), "nothing written");
    assert!(last_error().contains("needs 4"), "{}", last_error());
    // SAFETY: NULL is refused before any write.
    let rc = unsafe { write_c_str(std::ptr::null_mut(), 8, "abc") };
    assert_eq!(rc, UPNVME_EINVAL);
}

#[test]
fn the_default_address_is_the_one_open_null_would_take_or_why_there_is_none() {
    let mut buf = [0 as std::ffi::c_char; 13];
    // SAFETY: NULL is refused before any write.
    let rc = unsafe { crate::upnvme_ctrl_default_addr(std::ptr::null_mut(), 13) };
    assert_eq!(rc, UPNVME_EINVAL);
    // SAFETY: a length below 13 is refused before any write.
    let rc = unsafe { crate::upnvme_ctrl_default_addr(buf.as_mut_ptr(), 12) };
    assert_eq!(rc, UPNVME_EINVAL);
    assert!(
        last_error().contains("UPNVME_PCI_ADDR_SIZE (17)"),
        "{}",
        last_error()
    );
    // What is bound depends on the machine; the answer must be the one
    // `upnvme_ctrl_open(NULL, ...)` acts on.
    // SAFETY: 13 writable bytes.
    let rc = unsafe { crate::upnvme_ctrl_default_addr(buf.as_mut_ptr(), 13) };
    match crate::only_vfio_controller() {
        Ok(addr) => {
            assert_eq!(rc, UPNVME_OK);
            // SAFETY: written with its NUL.
            let text = unsafe { CStr::from_ptr(buf.as_ptr()) };
            assert_eq!(text.to_str(), Ok(&*addr));
        }
        Err(why) => {
            assert_eq!(rc, UPNVME_ENODEV);
            assert_eq!(last_error(), why);
        }
    }
}

/// Counts completions; each first completion resubmits one read from its
/// callback (on a pair with the doorbell delayed, that one waits for the
/// doorbell `process_completions` writes at its end).
struct Batch {
    qp: *mut Qpair<ModelController>,
    done: u32,
    resubmit: u32,
}

/// Completions counted so far (read between `process_completions` calls).
fn batch_done(arg: *mut Batch) -> u32 {
    // SAFETY: the test's live `Batch`; no callback runs during the read.
    unsafe { (*arg).done }
}

unsafe extern "C" fn batch_cb(arg: *mut c_void, cpl: *const upnvme_cpl) {
    // SAFETY: `arg` is the test's live `Batch`; the pair outlives it.
    let b = unsafe { &mut *arg.cast::<Batch>() };
    // SAFETY: valid for the call.
    let cpl = unsafe { &*cpl };
    assert_eq!(cpl.status, UPNVME_OK, "{}", last_error());
    b.done += 1;
    if b.resubmit > 0 {
        b.resubmit -= 1;
        // SAFETY: the pair is live; `process_completions` holds no
        // reference to it while this callback runs.
        let q = unsafe { &mut *b.qp };
        let read = Cmd::Read { slba: 3, blocks: 1 };
        // SAFETY: the handle is ours again.
        let rc = unsafe { q.submit(1, read, cpl.buf, Some(batch_cb), arg) };
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
    }
}

/// `upnvme_qpair_opts.delay_doorbell`: four submissions write their SQEs
/// without a doorbell (the controller fetches nothing), one
/// `upnvme_qpair_ring` announces all four with one SQ doorbell write, and
/// what the callbacks submit goes out with one write at the end of
/// `process_completions`. Without the option each submission rings.
#[test]
fn a_delayed_doorbell_announces_each_batch_with_one_write() {
    let (m, c) = model();
    let mut qp = pair(&c, 16);
    qp.set_delay_doorbell(true);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let qid = qp.qp.qid();
    let mut b = Batch {
        qp: qpp,
        done: 0,
        resubmit: 4,
    };
    let arg: *mut Batch = &mut b;
    let bufs: Vec<_> = (0..4).map(|_| handle(&c, 512)).collect();
    let (fetched, (sq_writes, _)) = (m.commands_fetched(), m.doorbell_writes(qid));
    for (i, &h) in bufs.iter().enumerate() {
        let read = Cmd::Read {
            slba: i as u64,
            blocks: 1,
        };
        // SAFETY: live handle and pair.
        let rc = unsafe { qp.submit(1, read, h, Some(batch_cb), arg.cast()) };
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
    }
    assert_eq!(m.commands_fetched(), fetched, "nothing announced yet");
    assert_eq!(m.doorbell_writes(qid).0, sq_writes);
    // SAFETY: a live pair, this thread's.
    assert_eq!(unsafe { Qpair::ring(qpp) }, UPNVME_OK);
    assert_eq!(m.commands_fetched(), fetched + 4);
    assert_eq!(
        m.doorbell_writes(qid).0,
        sq_writes + 1,
        "one write for four"
    );
    // A ring with nothing waiting writes nothing.
    // SAFETY: as above.
    assert_eq!(unsafe { Qpair::ring(qpp) }, UPNVME_OK);
    assert_eq!(m.doorbell_writes(qid).0, sq_writes + 1);
    // The four callbacks each resubmit; the four go out with one write
    // before `process_completions` returns.
    // SAFETY: live pair, this thread's.
    let n = unsafe { Qpair::process_completions(qpp, 4) };
    assert_eq!(n, 4, "{}", last_error());
    assert_eq!(m.commands_fetched(), fetched + 8);
    assert_eq!(m.doorbell_writes(qid).0, sq_writes + 2);
    while batch_done(arg) < 8 {
        // SAFETY: as above.
        assert!(unsafe { Qpair::process_completions(qpp, 0) } >= 0);
    }
    // Submitted and not rung, then reaped: process_completions announces
    // what waits before it looks.
    // SAFETY: live handle (its command ended) and pair.
    let rc = unsafe {
        qp.submit(
            1,
            Cmd::Read { slba: 9, blocks: 1 },
            bufs[0],
            Some(batch_cb),
            arg.cast(),
        )
    };
    assert_eq!(rc, UPNVME_OK);
    while batch_done(arg) < 9 {
        // SAFETY: as above.
        assert!(unsafe { Qpair::process_completions(qpp, 0) } >= 0);
    }
    for h in bufs {
        // SAFETY: live handles, their commands ended; each freed once.
        assert_eq!(unsafe { upnvme_buf_free(h) }, UPNVME_OK);
    }
    // Without the option: a doorbell write per submission.
    qp.set_delay_doorbell(false);
    let h = handle(&c, 512);
    let before = m.doorbell_writes(qid).0;
    // SAFETY: as above.
    unsafe { (*arg).resubmit = 0 };
    // SAFETY: live handle and pair.
    let rc = unsafe {
        qp.submit(
            1,
            Cmd::Read { slba: 1, blocks: 1 },
            h,
            Some(batch_cb),
            arg.cast(),
        )
    };
    assert_eq!(rc, UPNVME_OK);
    assert_eq!(m.doorbell_writes(qid).0, before + 1);
    while batch_done(arg) < 10 {
        // SAFETY: as above.
        assert!(unsafe { Qpair::process_completions(qpp, 0) } >= 0);
    }
    // SAFETY: live handle, its command ended.
    assert_eq!(unsafe { upnvme_buf_free(h) }, UPNVME_OK);
    drop(qp);
    assert_eq!(m.dma_faults(), 0);
}

/// `upnvme_write_zeroes` beyond the controller's WZSL: the library sends it
/// as pieces within the limit, and the C callback runs once, with success,
/// after every block is zeroed.
#[test]
fn write_zeroes_beyond_wzsl_completes_once_with_every_block_zeroed() {
    let (m, c) = model_with(ModelConfig {
        oncs: ModelConfig::ONCS_WRITE_ZEROES,
        // 8 KiB per Write Zeroes: 16 blocks of 512 bytes.
        nvm_limits: upnvme_tests::NvmLimitsConfig {
            wzsl: 1,
            ..Default::default()
        },
        ..one_ns()
    });
    m.write_namespace_data(1, 0, &[0xa5u8; 64 * 512]);
    let mut qp = pair(&c, 8);
    let mut seen: Vec<c_int> = Vec::new();
    let arg: *mut Vec<c_int> = &mut seen;
    let seen_before = m.commands_fetched();
    let wz = Cmd::WriteZeroes {
        slba: 4,
        blocks: 50,
        deallocate: false,
    };
    // SAFETY: no buffer needed.
    let rc = unsafe { qp.submit(1, wz, std::ptr::null_mut(), Some(count_cb), arg.cast()) };
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    // SAFETY: live pair, this thread's.
    while unsafe { Qpair::process_completions(qpp, 0) } == 0 {}
    // SAFETY: as above; nothing more comes.
    assert_eq!(unsafe { Qpair::process_completions(qpp, 0) }, 0);
    assert_eq!(seen, vec![UPNVME_OK], "one callback");
    assert_eq!(
        m.commands_fetched() - seen_before,
        4,
        "pieces of at most 16 blocks"
    );
    let got = m.namespace_data(1, 0, 64);
    for (lba, block) in got.chunks(512).enumerate() {
        let zeroed = (4..54).contains(&lba);
        assert!(
            block.iter().all(|&b| b == if zeroed { 0 } else { 0xa5 }),
            "block {lba}"
        );
    }
    drop(qp);
    drop(c);
    assert_eq!(m.dma_faults(), 0);
}

/// A Firmware Activation Starting notice masks the namespace notice until
/// its log (03h) is read: meanwhile each poll checks every namespace; the
/// C API's Get Log Page (RAE clear) ends that, after which a poll sends no
/// admin command.
#[test]
fn reading_a_notices_log_ends_the_per_poll_namespace_checks() {
    let (m, c) = model();
    let h = crate::Ctrl::new(c);
    m.raise_async_event(2, 0x01, 0x03);
    let mut ev = [crate::upnvme_async_event::default(); 4];
    assert_eq!(h.poll_events(&mut ev).unwrap(), 1);
    assert_eq!(
        (ev[0].event_type, ev[0].event_info, ev[0].log_page),
        (2, 1, 3)
    );
    let before = m.commands_fetched();
    assert_eq!(h.poll_events(&mut ev).unwrap(), 0);
    assert!(m.commands_fetched() > before, "the namespaces are checked");
    let data = h.get_log_page(ev[0].log_page, 0xffff_ffff, 512, 0).unwrap();
    assert_eq!(data.len(), 512);
    // One last check when the mask ends (a controller may have dropped a
    // namespace notice meanwhile), then none.
    let before = m.commands_fetched();
    assert_eq!(h.poll_events(&mut ev).unwrap(), 0);
    assert!(
        m.commands_fetched() > before,
        "the check when the mask ended"
    );
    let before = m.commands_fetched();
    assert_eq!(h.poll_events(&mut ev).unwrap(), 0);
    assert_eq!(
        m.commands_fetched(),
        before,
        "no checks once the log is read"
    );
}

/// `upnvme_deallocate` of more than 256 ranges (one command's NR holds
/// 256): the library sends several Dataset Management commands and the C
/// callback runs once, with success, after every listed block is
/// deallocated and no other (before, the C layer refused more than 256).
#[test]
fn deallocate_of_more_than_256_ranges_completes_once() {
    let (m, c) = model_with(ModelConfig {
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size: 512,
            blocks: 1024,
            ..NamespaceConfig::default()
        }],
        oncs: ModelConfig::ONCS_DSM,
        ..Default::default()
    });
    m.write_namespace_data(1, 0, &[0xa5u8; 1024 * 512]);
    let mut qp = pair(&c, 8);
    let ranges: Vec<crate::qpair::upnvme_range> = (0..300)
        .map(|i| crate::qpair::upnvme_range {
            slba: 3 * i,
            blocks: 2,
        })
        .collect();
    let mut seen: Vec<c_int> = Vec::new();
    let arg: *mut Vec<c_int> = &mut seen;
    let seen_before = m.commands_fetched();
    let dsm = Cmd::Deallocate { ranges: &ranges };
    // SAFETY: no buffer needed.
    let rc = unsafe { qp.submit(1, dsm, std::ptr::null_mut(), Some(count_cb), arg.cast()) };
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    // SAFETY: live pair, this thread's.
    while unsafe { Qpair::process_completions(qpp, 0) } == 0 {}
    // SAFETY: as above; nothing more comes.
    assert_eq!(unsafe { Qpair::process_completions(qpp, 0) }, 0);
    assert_eq!(seen, vec![UPNVME_OK], "one callback");
    assert_eq!(m.commands_fetched() - seen_before, 2, "256 + 44 ranges");
    let got = m.namespace_data(1, 0, 1024);
    for (lba, block) in got.chunks(512).enumerate() {
        let gone = lba < 900 && lba % 3 != 2;
        assert!(
            block.iter().all(|&b| b == if gone { 0 } else { 0xa5 }),
            "block {lba}"
        );
    }
    drop(qp);
    drop(c);
    assert_eq!(m.dma_faults(), 0);
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

/// `upnvme_ctrl_admin_passthru`: data moves in the direction the opcode's
/// bits 1:0 give — Identify (10b) comes back whole, Set Features Host
/// Behavior Support (01b) reaches the controller — and a command without
/// data returns completion dword 0.
#[test]
fn admin_passthru_moves_data_in_the_opcodes_direction() {
    let (m, c) = model_with(ModelConfig {
        elbas: true,
        ..ModelConfig::default()
    });
    let reference = c
        .admin_passthrough(upnvme::Sqe::identify(0x01, 0, 0), 4096, None)
        .unwrap()
        .1;
    let queues = c.get_features(0x07, 0, 0).unwrap();
    let h = crate::Ctrl::new(c);
    let mut cpl = crate::upnvme_admin_cpl::default();

    // Identify Controller (06h: controller to host).
    let mut page = vec![0xa5u8; 4096];
    let identify = crate::upnvme_admin_cmd {
        opcode: 0x06,
        cdw10: 0x01,
        ..Default::default()
    };
    assert_eq!(
        h.admin_passthru_c(&identify, &mut page, &mut cpl),
        UPNVME_OK
    );
    assert_eq!(page, reference);
    // More room than the command moves: what it moved comes back, no more.
    let mut roomy = vec![0xa5u8; 6144];
    assert_eq!(
        h.admin_passthru_c(&identify, &mut roomy, &mut cpl),
        UPNVME_OK
    );
    assert_eq!(roomy, reference);

    // Get Features Number of Queues (0Ah, no data): dword 0.
    let get = crate::upnvme_admin_cmd {
        opcode: 0x0a,
        cdw10: 0x07,
        ..Default::default()
    };
    assert_eq!(
        h.admin_passthru_c(&get, &mut Vec::new(), &mut cpl),
        UPNVME_OK
    );
    assert_eq!(cpl.dw0, queues);

    // Set Features Host Behavior Support (09h: host to controller), LBAFEE
    // kept set (the driver enabled it) and ACRE set.
    let mut hbs = vec![0u8; 512];
    hbs[0] = 1;
    hbs[2] = 1;
    let set = crate::upnvme_admin_cmd {
        opcode: 0x09,
        cdw10: 0x16,
        ..Default::default()
    };
    let sent = hbs.clone();
    assert_eq!(h.admin_passthru_c(&set, &mut hbs, &mut cpl), UPNVME_OK);
    assert_eq!(m.host_behavior(), Some(sent.clone()));
    // Sent only: the caller's memory is left as it was.
    assert_eq!(hbs, sent);
    drop(h);
    assert_eq!(m.dma_faults(), 0);
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

/// An NVMe error status is `UPNVME_EIO` with the status in `cpl`; data on a
/// no-data opcode, and the commands the library owns, are `UPNVME_EINVAL`
/// with nothing sent; a held command's bound (`timeout_ms`) is kept.
#[test]
fn admin_passthru_reports_statuses_and_refusals() {
    let (m, c) = model();
    let h = crate::Ctrl::new(c);
    let mut cpl = crate::upnvme_admin_cpl::default();
    // Get Features of a reserved FID: Invalid Field in Command (0/02h).
    let bad = crate::upnvme_admin_cmd {
        opcode: 0x0a,
        cdw10: 0xee,
        ..Default::default()
    };
    assert_eq!(
        h.admin_passthru_c(&bad, &mut Vec::new(), &mut cpl),
        UPNVME_EIO
    );
    assert_eq!((cpl.sct, cpl.sc), (0, 0x02), "{cpl:?}");
    assert!(last_error().contains("Invalid Field"), "{}", last_error());

    let fetched = m.commands_fetched();
    // Keep Alive (18h: 00b) with data.
    let keep_alive = crate::upnvme_admin_cmd {
        opcode: 0x18,
        ..Default::default()
    };
    let mut page = vec![0u8; 4096];
    assert_eq!(
        h.admin_passthru_c(&keep_alive, &mut page, &mut cpl),
        UPNVME_EINVAL
    );
    assert!(
        last_error().contains("bits 1:0 are 00b"),
        "{}",
        last_error()
    );
    // Create I/O Completion Queue (05h) is the library's.
    let create = crate::upnvme_admin_cmd {
        opcode: 0x05,
        ..Default::default()
    };
    assert_eq!(
        h.admin_passthru_c(&create, &mut Vec::new(), &mut cpl),
        UPNVME_EINVAL
    );
    // Identify with too little room for its 4096 bytes.
    let identify = crate::upnvme_admin_cmd {
        opcode: 0x06,
        cdw10: 0x01,
        ..Default::default()
    };
    assert_eq!(
        h.admin_passthru_c(&identify, &mut vec![0; 512], &mut cpl),
        UPNVME_EINVAL
    );
    assert_eq!(m.commands_fetched(), fetched, "a refused command was sent");

    // A command the controller holds ends at its own bound.
    m.inject(upnvme_tests::Fault::DelayCompletion {
        on: upnvme_tests::Match::Opcode {
            qid: 0,
            opcode: 0x06,
        },
        doorbells: None,
    });
    let held = crate::upnvme_admin_cmd {
        timeout_ms: 30,
        ..identify
    };
    let t = std::time::Instant::now();
    assert_eq!(
        h.admin_passthru_c(&held, &mut page, &mut cpl),
        UPNVME_ETIMEDOUT
    );
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "waited {:?}: the command's 30 ms bound was not used",
        t.elapsed()
    );
}

/// `upnvme_ctrl_reset` brings a failed controller back: an admin command
/// without an answer failed it (every call then `UPNVME_ENODEV`); after the
/// reset admin commands work and a pair created before it runs I/O again.
#[test]
fn a_reset_brings_a_failed_controller_back_and_pairs_keep_working() {
    let (m, c) = model();
    let mut qp = pair(&c, 8);
    let h = crate::Ctrl::new(c);
    let mut cpl = crate::upnvme_admin_cpl::default();
    let mut page = vec![0u8; 4096];
    m.inject(upnvme_tests::Fault::DropCompletion(
        upnvme_tests::Match::Opcode {
            qid: 0,
            opcode: 0x06,
        },
    ));
    let identify = crate::upnvme_admin_cmd {
        opcode: 0x06,
        cdw10: 0x01,
        timeout_ms: 30,
        ..Default::default()
    };
    assert_eq!(
        h.admin_passthru_c(&identify, &mut page, &mut cpl),
        UPNVME_ETIMEDOUT
    );
    let again = crate::upnvme_admin_cmd {
        timeout_ms: 0,
        ..identify
    };
    assert_eq!(
        h.admin_passthru_c(&again, &mut page, &mut cpl),
        UPNVME_ENODEV
    );
    assert!(last_error().contains("reset"), "{}", last_error());

    assert_eq!(h.reset().map_err(|e| e.to_string()), Ok(()));
    assert_eq!(h.admin_passthru_c(&again, &mut page, &mut cpl), UPNVME_OK);
    // The pair re-creates its queues and runs a read.
    let b = handle(h.get().as_deref().unwrap(), 512);
    let mut seen: Vec<c_int> = Vec::new();
    let arg: *mut Vec<c_int> = &mut seen;
    // SAFETY: live pair and handle.
    let rc = unsafe {
        qp.submit(
            1,
            Cmd::Read { slba: 0, blocks: 1 },
            b,
            Some(count_cb),
            arg.cast(),
        )
    };
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    reap_until(&mut *qp, arg, 1);
    assert_eq!(seen, vec![UPNVME_OK]);
    // SAFETY: the handle is ours again.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    drop(qp);
    drop(h);
    assert_eq!(m.dma_faults(), 0);
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

/// `upnvme_ctrl_format_nvm`: namespace 1 (512-byte blocks) goes to LBA
/// format 4 (4096 bytes); `ns_get_info` and a pair created before see the
/// new geometry; out-of-range fields and a format the namespace lacks are
/// refused with nothing sent.
#[test]
fn format_nvm_changes_the_geometry_the_pairs_use() {
    let (m, c) = model();
    let h = crate::Ctrl::new(c);
    let mut qp = shared_pair(&h, 8);
    assert_eq!(h.ns_info(1).unwrap().lba_size, 512);
    let fetched = m.commands_fetched();
    for bad in [
        crate::upnvme_format {
            pi: 4,
            ..Default::default()
        },
        crate::upnvme_format {
            mset: 2,
            ..Default::default()
        },
        crate::upnvme_format {
            ses: 3,
            ..Default::default()
        },
        crate::upnvme_format {
            lbaf: 9,
            ..Default::default()
        },
    ] {
        let e = h.format_nvm(1, &bad).unwrap_err();
        assert!(
            matches!(e, upnvme::Error::InvalidArgument(_)),
            "{bad:?}: {e}"
        );
    }
    assert_eq!(
        m.commands_fetched(),
        fetched,
        "a refused format sent something"
    );

    h.format_nvm(
        1,
        &crate::upnvme_format {
            lbaf: 4,
            ..Default::default()
        },
    )
    .unwrap();
    let info = h.ns_info(1).unwrap();
    assert_eq!((info.lba_size, info.blocks), (4096, BLOCKS * 512 / 4096));
    // The pair created before writes one 4096-byte block and reads it back.
    let b = handle(h.get().as_deref().unwrap(), 4096);
    // SAFETY: a live handle.
    let data = unsafe { upnvme_buf_data(b) }.cast::<u8>();
    // SAFETY: the handle's 4096 bytes, ours (nothing in flight).
    unsafe { std::ptr::write_bytes(data, 0x5c, 4096) };
    let mut seen: Vec<c_int> = Vec::new();
    let arg: *mut Vec<c_int> = &mut seen;
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    for cmd in [
        Cmd::Write { slba: 3, blocks: 1 },
        Cmd::Read { slba: 3, blocks: 1 },
    ] {
        let before = seen.len();
        if let Cmd::Read { .. } = cmd {
            // SAFETY: as above.
            unsafe { std::ptr::write_bytes(data, 0, 4096) };
        }
        // SAFETY: live pair and handle.
        let rc = unsafe { qp.submit(1, cmd, b, Some(count_cb), arg.cast()) };
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
        reap_until(qpp, arg, before + 1);
    }
    assert_eq!(seen, vec![UPNVME_OK, UPNVME_OK]);
    // SAFETY: the handle's 4096 bytes, ours again.
    let back = unsafe { std::slice::from_raw_parts(data, 4096) };
    assert!(back.iter().all(|&x| x == 0x5c));
    // SAFETY: ours.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    drop(qp);
    drop(h);
    assert_eq!(m.dma_faults(), 0);
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

/// `upnvme_ctrl_format_nvm` holds the handle's write lock only to read the
/// namespaces again: while the Format NVM is outstanding (held by the
/// model), other threads' calls on the handle — `ns_get_info`, an admin
/// passthrough of Identify Namespace (its FPI), the namespace list — run.
/// Before, each waited for the whole format (up to its timeout).
#[test]
fn calls_on_the_handle_go_on_while_a_format_nvm_is_outstanding() {
    let (m, h) = during_a_held_format(|_, h| {
        // Each of these waited for the format before (a write lock held
        // throughout): here the format is still held by the model.
        // The handle retired, its geometry as it was until the format ends.
        assert_eq!(h.ns_info(1).unwrap().lba_size, 512);
        let cmd = crate::upnvme_admin_cmd {
            opcode: 0x06,
            nsid: 1,
            cdw10: 0x00,
            ..Default::default()
        };
        let mut data = vec![0u8; 4096];
        let mut cpl = crate::upnvme_admin_cpl::default();
        assert_eq!(
            h.admin_passthru_c(&cmd, &mut data, &mut cpl),
            UPNVME_OK,
            "{}",
            last_error()
        );
        let ids: Vec<u32> = h
            .get()
            .unwrap()
            .namespaces()
            .iter()
            .map(|n| n.id())
            .collect();
        assert_eq!(ids, vec![1]);
    });
    assert_eq!(h.ns_info(1).unwrap().lba_size, 4096);
    drop(h);
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

/// Runs `during` on this thread while another formats namespace 1 of a
/// fresh model's handle to LBA format 4 through `Ctrl::format_nvm`, with
/// the Format NVM held by the model until `during` returns (asserting it is
/// still held then); the format must then succeed. Returns the model and
/// the handle.
fn during_a_held_format(
    during: impl for<'s, 'e> FnOnce(&'s std::thread::Scope<'s, 'e>, &'e crate::Ctrl<ModelController>),
) -> (ModelController, crate::Ctrl<ModelController>) {
    use upnvme_tests::{Fault, Match};
    let (m, c) = model();
    let h = crate::Ctrl::new(c);
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode {
            qid: 0,
            opcode: 0x80,
        },
        doorbells: None,
    });
    std::thread::scope(|s| {
        let hr = &h;
        let format = s.spawn(move || {
            hr.format_nvm(
                1,
                &crate::upnvme_format {
                    lbaf: 4,
                    timeout_ms: 20_000,
                    ..Default::default()
                },
            )
        });
        let start = std::time::Instant::now();
        while m.delayed_completions() == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "no Format NVM reached the controller"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        during(s, hr);
        assert_eq!(m.delayed_completions(), 1, "the format ended early");
        m.release_delayed();
        format.join().unwrap().unwrap();
    });
    (m, h)
}

/// A namespace refresh asked for while a Format NVM is outstanding waits
/// for the format without queuing for the write lock: `ns_get_info` on a
/// third thread still runs (std's `RwLock` admits no reader while a writer
/// waits, so a refresh queued behind the format's read lock held every call
/// on the handle for the whole format — from a review).
#[test]
fn a_refresh_during_a_format_nvm_does_not_hold_the_other_calls() {
    let (m, h) = during_a_held_format(|s, h| {
        let refresh = s.spawn(move || h.refresh());
        std::thread::sleep(Duration::from_millis(100));
        let (tx, rx) = std::sync::mpsc::channel();
        let info = s.spawn(move || {
            let r = h.ns_info(1).map(|i| i.lba_size);
            tx.send(()).unwrap();
            r
        });
        let answered = rx.recv_timeout(Duration::from_secs(2)).is_ok();
        assert!(
            answered,
            "upnvme_ns_get_info waited for the whole Format NVM behind a queued refresh"
        );
        // Both end once the format is let go; the scope joins them.
        std::mem::drop((refresh, info));
    });
    assert_eq!(h.ns_info(1).unwrap().lba_size, 4096);
    drop(h);
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

/// Reserved bytes must be 0: refused with nothing sent (a later version
/// may give them a meaning).
#[test]
fn admin_structs_with_reserved_bytes_or_oversized_data_are_refused() {
    let (m, c) = model();
    let h = crate::Ctrl::new(c);
    let fetched = m.commands_fetched();
    let mut cpl = crate::upnvme_admin_cpl::default();
    let cmd = crate::upnvme_admin_cmd {
        opcode: 0x0a,
        cdw10: 0x07,
        rsvd: [0, 1, 0],
        ..Default::default()
    };
    assert_eq!(
        h.admin_passthru_c(&cmd, &mut Vec::new(), &mut cpl),
        UPNVME_EINVAL
    );
    assert!(last_error().contains("rsvd must be 0"), "{}", last_error());
    let fmt = crate::upnvme_format {
        rsvd: [1, 0, 0],
        ..Default::default()
    };
    let e = h.format_nvm(1, &fmt).unwrap_err();
    assert!(e.to_string().contains("rsvd must be 0"), "{e}");
    assert_eq!(m.commands_fetched(), fetched, "a refused command was sent");
    drop(h);
}

/// A controller refusing a pair's re-creation after a reset (Create I/O CQ
/// failing with a status): `upnvme_qpair_process_completions` says
/// `UPNVME_ENODEV` with the reason in the message, as docs/capi.md
/// promises, from the first refusal on — not `UPNVME_EIO`, which names a
/// completion's NVMe status and comes with no completion here; then, once
/// the controller accepts, the pair works again.
#[test]
fn a_refused_re_creation_is_enodev_from_the_first_try() {
    const CREATE_IO_CQ: u8 = 0x05;
    let (m, c) = model();
    let mut qp = pair(&c, 8);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    c.reset().unwrap();
    let mut codes = vec![];
    for _ in 0..3 {
        m.inject(upnvme_tests::Fault::Status {
            on: upnvme_tests::Match::Opcode {
                qid: 0,
                opcode: CREATE_IO_CQ,
            },
            status: upnvme_tests::Status::INTERNAL_ERROR,
        });
        // SAFETY: a live pair of this thread.
        codes.push(unsafe { Qpair::process_completions(qpp, 0) });
        assert!(
            last_error().contains("Create I/O Completion Queue"),
            "{}",
            last_error()
        );
    }
    assert_eq!(codes, vec![UPNVME_ENODEV; 3]);
    assert!(m.pending_faults().is_empty());
    // The controller accepts again: the pair re-creates its queues (after
    // the rate limit's wait) and reads.
    let b = handle(&c, 512);
    let mut seen: Vec<c_int> = Vec::new();
    let arg: *mut Vec<c_int> = &mut seen;
    let start = std::time::Instant::now();
    loop {
        // SAFETY: live pair and handle.
        let rc = unsafe {
            qp.submit(
                1,
                Cmd::Read { slba: 0, blocks: 1 },
                b,
                Some(count_cb),
                arg.cast(),
            )
        };
        if rc == UPNVME_OK {
            break;
        }
        assert_eq!(rc, UPNVME_ENODEV, "{}", last_error());
        assert!(start.elapsed() < Duration::from_secs(5));
        // SAFETY: a live pair of this thread.
        let n = unsafe { Qpair::process_completions(qpp, 0) };
        assert!(n == 0 || n == UPNVME_ENODEV, "{n}: {}", last_error());
        std::thread::sleep(Duration::from_millis(1));
    }
    reap_until(qpp, arg, 1);
    assert_eq!(seen, vec![UPNVME_OK]);
    // SAFETY: the handle is ours again.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    drop(qp);
    assert_eq!(m.dma_faults(), 0);
}

/// `upnvme_ctrl_default_addr` said 13 bytes held every address, but a
/// controller behind Intel VMD has a PCI domain of 10000h and above (five
/// digits or more, up to eight): a C program that sized its buffer as the
/// header said got `UPNVME_EINVAL` there. `UPNVME_PCI_ADDR_SIZE` holds the
/// longest one, and a 13-byte buffer is refused whole for a longer address,
/// with the size it needs.
#[test]
fn the_default_address_buffer_size_holds_a_vmd_domain() {
    let vmd = upnvme::PciAddress {
        domain: 0x1_0000,
        bus: 0xe1,
        device: 0,
        function: 0,
    }
    .to_string();
    let longest = upnvme::PciAddress {
        domain: u32::MAX,
        bus: 0xff,
        device: 0x1f,
        function: 7,
    }
    .to_string();
    assert_eq!(vmd, "10000:e1:00.0");
    assert!(
        vmd.len() + 1 > 13,
        "13 bytes do not hold {vmd:?} and its NUL"
    );
    assert_eq!(longest.len() + 1, crate::UPNVME_PCI_ADDR_SIZE);
    let mut buf = [0x55 as std::ffi::c_char; crate::UPNVME_PCI_ADDR_SIZE];
    // SAFETY: 13 of the array's writable bytes.
    let rc = unsafe { write_c_str(buf.as_mut_ptr(), 13, &vmd) };
    assert_eq!(rc, UPNVME_EINVAL);
    assert!(last_error().contains("needs 14"), "{}", last_error());
    assert!(buf.iter().all(|&b| b == 0x55), "nothing written");
    // SAFETY: the array's writable bytes.
    let rc = unsafe { write_c_str(buf.as_mut_ptr(), buf.len(), &longest) };
    assert_eq!(rc, UPNVME_OK);
}

/// The options structs' sizes, pinned: a field added later must start at
/// or past these (an old program's `size` is its `sizeof`, tail padding
/// included, so a field placed in that padding would be read from the old
/// program's padding bytes; `upnvme_qpair_opts.delay_doorbell` was added
/// that way, at offset 17 of a 20-byte struct). Grow the struct past them
/// and update the numbers here.
#[test]
fn options_struct_sizes_are_pinned() {
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<crate::upnvme_ctrl_opts>(), 12);
    assert_eq!(size_of::<crate::upnvme_qpair_opts>(), 20);
    assert_eq!(offset_of!(crate::upnvme_qpair_opts, delay_doorbell), 17);
}

/// A ring that unwinds (a panic inside the library's doorbell write, here
/// the device's) poisons the pair, as a submission or a reap that unwinds
/// does: the doorbell may not have reached the device, so the queued
/// commands may never complete, and a destroy waiting for them would say
/// `UPNVME_EBUSY` for ever. Before, the pair took more work and destroy
/// kept the command in flight.
#[test]
fn a_ring_that_unwinds_poisons_the_pair() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    /// The model, with a panic on any doorbell write while armed.
    struct PanicOnDoorbell {
        m: ModelController,
        armed: Arc<AtomicBool>,
    }
    impl upnvme::Device for PanicOnDoorbell {
        fn read32(&self, offset: usize) -> u32 {
            self.m.read32(offset)
        }
        fn write32(&self, offset: usize, value: u32) {
            if offset >= 0x1000 && self.armed.load(Ordering::SeqCst) {
                panic!("a doorbell write unwinds");
            }
            self.m.write32(offset, value)
        }
        fn read64(&self, offset: usize) -> u64 {
            self.m.read64(offset)
        }
        fn write64(&self, offset: usize, value: u64) {
            self.m.write64(offset, value)
        }
        fn bar_len(&self) -> usize {
            self.m.bar_len()
        }
        fn alloc_dma(&self, len: usize) -> Result<upnvme::DmaBuffer, upnvme::dma::DmaError> {
            self.m.alloc_dma(len)
        }
        fn name(&self) -> String {
            self.m.name()
        }
    }
    let m = ModelController::new(one_ns());
    let armed = Arc::new(AtomicBool::new(false));
    let dev = PanicOnDoorbell {
        m: m.clone(),
        armed: armed.clone(),
    };
    let c = Controller::with_device(dev, upnvme_tests::host_options()).unwrap();
    let qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(8),
            ..Default::default()
        })
        .unwrap();
    let mut qp = Box::new(Qpair::new(
        qp,
        std::sync::Arc::new(std::sync::Mutex::new(c.namespaces().to_vec())),
    ));
    qp.set_delay_doorbell(true);
    let qpp: *mut Qpair<PanicOnDoorbell> = &mut *qp;
    let b = handle(&c, 4096);
    // SAFETY: live handle and pair; no callback.
    let rc = unsafe {
        qp.submit(
            1,
            Cmd::Read { slba: 0, blocks: 8 },
            b,
            None,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    armed.store(true, Ordering::SeqCst);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: live pair, this thread's.
        unsafe { Qpair::ring(qpp) }
    }));
    assert!(r.is_err(), "the doorbell write unwound");
    armed.store(false, Ordering::SeqCst);
    let b2 = handle(&c, 4096);
    // SAFETY: as above.
    let rc = unsafe {
        qp.submit(
            1,
            Cmd::Read { slba: 8, blocks: 8 },
            b2,
            None,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(
        rc, UPNVME_EINTERNAL,
        "a pair whose ring unwound takes no more work"
    );
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::end_for_destroy(qpp) }, UPNVME_OK);
    for h in [b, b2] {
        // SAFETY: the test's live handles, not in flight; freed once.
        assert_eq!(unsafe { upnvme_buf_free(h) }, UPNVME_OK);
    }
    drop(qp);
    let _ = c.close();
}

/// A command the controller lost, its Abort answered "not aborted", and the
/// timeout reset that follows fails after disabling the controller
/// (CSTS.RDY never comes back): `upnvme_qpair_process_completions` says
/// `UPNVME_ENODEV` (the controller failed), as documented — it said
/// `UPNVME_ETIMEDOUT`, a code it does not document, and
/// `upnvme_qpair_destroy` answered such a pair `UPNVME_EBUSY` ("process
/// completions until none is left") — and the command's callback runs
/// once, `UPNVME_ETIMEDOUT`, with its buffer (from a review).
#[test]
fn a_poll_whose_timeout_reset_fails_says_enodev() {
    let m = ModelController::new(one_ns());
    let c = Controller::with_device(
        m.clone(),
        upnvme::ControllerOptions {
            ready_timeout: Some(Duration::from_millis(300)),
            ..upnvme_tests::host_options()
        },
    )
    .unwrap();
    let lib = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(8),
            command_timeout: Some(Duration::from_millis(20)),
            ..Default::default()
        })
        .unwrap();
    let mut qp = Box::new(Qpair::new(
        lib,
        std::sync::Arc::new(std::sync::Mutex::new(c.namespaces().to_vec())),
    ));
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    m.inject(upnvme_tests::Fault::DropCompletion(
        upnvme_tests::Match::Queue(qp.qp.qid()),
    ));
    m.inject(upnvme_tests::Fault::NeverReady);
    let b = handle(&c, 512);
    let mut seen: Vec<c_int> = Vec::new();
    let arg: *mut Vec<c_int> = &mut seen;
    // SAFETY: live pair and handle.
    let rc = unsafe {
        qp.submit(
            1,
            Cmd::Read { slba: 0, blocks: 1 },
            b,
            Some(count_cb),
            arg.cast(),
        )
    };
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    let start = std::time::Instant::now();
    let mut codes = Vec::new();
    // SAFETY: the test's vector; no callback runs while it is read.
    while unsafe { (*arg).is_empty() } && start.elapsed() < Duration::from_secs(5) {
        // SAFETY: a live pair of this thread.
        let n = unsafe { Qpair::process_completions(qpp, 0) };
        if n < 0 {
            codes.push(n);
        }
    }
    assert_eq!(c.resets(), 1, "the timeout reset disabled the controller");
    assert_eq!(seen, vec![UPNVME_ETIMEDOUT], "the lost command ends once");
    assert!(
        codes.iter().all(|&n| n == UPNVME_ENODEV),
        "the poll returned {codes:?} (ENODEV = {UPNVME_ENODEV})"
    );
    // SAFETY: a live pair of this thread.
    assert_eq!(unsafe { Qpair::process_completions(qpp, 0) }, UPNVME_ENODEV);
    // SAFETY: the handle is ours again, with its buffer.
    assert!(!unsafe { upnvme_buf_data(b) }.is_null());
    // SAFETY: freed once.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::end_for_destroy(qpp) }, UPNVME_OK);
    drop(qp);
    assert_eq!(m.dma_faults(), 0);
}

/// Two namespaces of 1024 512-byte blocks on a controller with Copy and
/// every Copy Descriptor Format (OCFS 0Fh), or the formats in `ocfs`.
fn copy_config(ocfs: u16) -> ModelConfig {
    let ns = NamespaceConfig {
        nsid: 1,
        lba_size: 512,
        blocks: 1024,
        ..NamespaceConfig::default()
    };
    ModelConfig {
        namespaces: vec![ns, NamespaceConfig { nsid: 2, ..ns }],
        oncs: ModelConfig::ONCS_COPY,
        ocfs,
        ..Default::default()
    }
}

/// One `Cmd::Copy` on `qp`, reaped; the callback's status.
fn copy_c(
    qp: &mut Qpair<ModelController>,
    nsid: u32,
    sdlba: u64,
    ranges: &[crate::qpair::upnvme_copy_range],
) -> c_int {
    let mut seen: Vec<c_int> = Vec::new();
    let arg: *mut Vec<c_int> = &mut seen;
    let cmd = Cmd::Copy { sdlba, ranges };
    // SAFETY: no buffer; `seen` outlives the reap below.
    let rc = unsafe { qp.submit(nsid, cmd, std::ptr::null_mut(), Some(count_cb), arg.cast()) };
    if rc != UPNVME_OK {
        return rc;
    }
    let qpp: *mut Qpair<ModelController> = qp;
    reap_until(qpp, &seen, 1);
    seen[0]
}

fn range(slba: u64, blocks: u32, snsid: u32) -> crate::qpair::upnvme_copy_range {
    crate::qpair::upnvme_copy_range {
        slba,
        blocks,
        snsid,
    }
}

/// `upnvme_copy`: ranges of the destination namespace only (SNSID 0 or its
/// own NSID) go as a Copy with Format 0h, which needs no Host Behavior
/// Support; a list naming another namespace goes as Format 2h, each entry
/// carrying its SNSID, and the blocks land in order, byte for byte.
/// `upnvme_ctrl_info` reports OCFS and the CDFE the library enabled.
#[test]
fn copy_moves_ranges_within_and_across_namespaces() {
    let (m, c) = model_with(copy_config(0xf));
    let a = (0..3 * 512)
        .map(|i| (i * 7 % 251) as u8)
        .collect::<Vec<_>>();
    let b = (0..2 * 512)
        .map(|i| (i * 11 % 241) as u8)
        .collect::<Vec<_>>();
    m.write_namespace_data(1, 100, &b);
    m.write_namespace_data(2, 300, &a);
    let h = crate::Ctrl::new(c);
    let info = h.info().unwrap();
    assert_eq!((info.ocfs, info.cdfe), (0xf, 0b1100));
    let mut qp = shared_pair(&h, 8);

    // Within namespace 1: SNSID 0 and SNSID 1 both mean namespace 1.
    let within = [range(101, 1, 0), range(100, 1, 1)];
    assert_eq!(
        copy_c(&mut qp, 1, 200, &within),
        UPNVME_OK,
        "{}",
        last_error()
    );
    let (opcode, cdw12) = m.last_io_cdw12().unwrap();
    assert_eq!((opcode, cdw12 & 0xff, (cdw12 >> 8) & 0xf), (0x19, 1, 0));
    let mut want = b[512..].to_vec();
    want.extend_from_slice(&b[..512]);
    assert_eq!(m.namespace_data(1, 200, 2), want);

    // Across: namespace 2's blocks, then namespace 1's.
    let across = [range(300, 3, 2), range(100, 2, 0)];
    assert_eq!(
        copy_c(&mut qp, 1, 400, &across),
        UPNVME_OK,
        "{}",
        last_error()
    );
    let (opcode, cdw12) = m.last_io_cdw12().unwrap();
    assert_eq!((opcode, cdw12 & 0xff, (cdw12 >> 8) & 0xf), (0x19, 1, 2));
    let mut want = a.clone();
    want.extend_from_slice(&b);
    assert_eq!(m.namespace_data(1, 400, 5), want);
    drop(qp);
    drop(h);
    assert_eq!(m.dma_faults(), 0);
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

/// What `upnvme_copy` refuses before anything is sent, each with its code
/// and a message that names the limit: NULL or no ranges, a source
/// namespace the controller does not have, more ranges than one command
/// carries, a range past the source's end, a cross-namespace Copy where the
/// controller lacks Format 2h (ENOTSUP) and a controller without Copy.
#[test]
fn copy_refusals_name_what_is_wrong_and_send_nothing() {
    // NULL ranges and count 0: refused before the pair is looked at.
    // SAFETY: a NULL array is refused before any read.
    let rc = unsafe {
        crate::upnvme_copy(
            std::ptr::null_mut(),
            1,
            0,
            std::ptr::null(),
            1,
            None,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, UPNVME_EINVAL);
    assert!(
        last_error().contains("ranges must be non-NULL"),
        "{}",
        last_error()
    );
    let one = range(0, 1, 0);
    // SAFETY: count 0 is refused before any read.
    let rc = unsafe {
        crate::upnvme_copy(
            std::ptr::null_mut(),
            1,
            0,
            &one,
            0,
            None,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, UPNVME_EINVAL);
    assert!(
        last_error().contains("count at least 1"),
        "{}",
        last_error()
    );
    // More than one Copy carries: refused before a range is read.
    let many = [one; 129];
    // SAFETY: `many` is valid for 129 reads; refused before any.
    let rc = unsafe {
        crate::upnvme_copy(
            std::ptr::null_mut(),
            1,
            0,
            many.as_ptr(),
            129,
            None,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, UPNVME_EINVAL);
    assert!(last_error().contains("at most 128"), "{}", last_error());

    let (m, c) = model_with(copy_config(0x3));
    let h = crate::Ctrl::new(c);
    assert_eq!(h.info().unwrap().cdfe, 0, "no Format 2h/3h to enable");
    let mut qp = shared_pair(&h, 8);
    let before = m.commands_fetched();
    assert_eq!(copy_c(&mut qp, 1, 0, &[range(0, 1, 7)]), UPNVME_EINVAL);
    assert!(
        last_error().contains("Copy source range 0: namespace 7 (snsid) is not an active"),
        "{}",
        last_error()
    );
    let many: Vec<_> = (0..129).map(|i| range(i, 1, 0)).collect();
    assert_eq!(copy_c(&mut qp, 1, 500, &many), UPNVME_EINVAL);
    assert!(last_error().contains("128"), "{}", last_error());
    assert_eq!(copy_c(&mut qp, 1, 0, &[range(1020, 8, 2)]), UPNVME_EINVAL);
    assert_eq!(copy_c(&mut qp, 1, 0, &[range(0, 1, 2)]), UPNVME_ENOTSUP);
    assert!(last_error().contains("2h"), "{}", last_error());
    assert_eq!(m.commands_fetched(), before, "nothing sent");
    drop(qp);
    drop(h);

    let (m, c) = model_with(ModelConfig {
        oncs: 0,
        ..copy_config(0xf)
    });
    let mut qp = pair(&c, 8);
    let before = m.commands_fetched();
    assert_eq!(copy_c(&mut qp, 1, 0, &[range(0, 1, 0)]), UPNVME_ENOTSUP);
    assert_eq!(m.commands_fetched(), before, "nothing sent");
}

/// Keeps a copy of each completion.
unsafe extern "C" fn cpl_cb(arg: *mut c_void, cpl: *const upnvme_cpl) {
    // SAFETY: valid for the call.
    let cpl = unsafe { *cpl };
    // SAFETY: `arg` is the test's Vec, alive and not otherwise borrowed
    // while the pair runs callbacks.
    unsafe { (*arg.cast::<Vec<upnvme_cpl>>()).push(cpl) };
}

/// One command through `Qpair::submit`, reaped: its completion.
fn one_cmd(
    qp: &mut Qpair<ModelController>,
    cmd: Cmd<'_>,
    buf: *mut upnvme_buf,
) -> Result<upnvme_cpl, c_int> {
    let mut seen: Vec<upnvme_cpl> = Vec::new();
    let arg: *mut Vec<upnvme_cpl> = &mut seen;
    // SAFETY: `buf` null or a live handle of the test; `seen` outlives the
    // reap below.
    let rc = unsafe { qp.submit(1, cmd, buf, Some(cpl_cb), arg.cast()) };
    if rc != UPNVME_OK {
        return Err(rc);
    }
    let qpp: *mut Qpair<ModelController> = qp;
    let start = std::time::Instant::now();
    while seen.is_empty() && start.elapsed() < Duration::from_secs(5) {
        // SAFETY: a live pair of this thread.
        assert!(unsafe { Qpair::process_completions(qpp, 0) } >= 0);
    }
    assert_eq!(seen.len(), 1, "one completion");
    Ok(seen[0])
}

/// `upnvme_compare`, `upnvme_verify` and `upnvme_write_uncorrectable`:
/// Compare of equal data succeeds and of different data fails with
/// Compare Failure (SCT 2h, SC 85h) in `cpl`, handing the buffer back
/// either way; Verify of readable blocks succeeds, and after Write
/// Uncorrectable of one of them fails (Unrecovered Read Error, 2h/81h), as
/// does a Read of it. Compare without a buffer is refused; a controller
/// without the commands refuses each with `UPNVME_ENOTSUP`, nothing sent.
#[test]
fn compare_verify_and_write_uncorrectable_from_c() {
    let (m, c) = model_with(ModelConfig {
        oncs: ModelConfig::ONCS_COMPARE
            | ModelConfig::ONCS_VERIFY
            | ModelConfig::ONCS_WRITE_UNCORRECTABLE,
        ..one_ns()
    });
    let data: Vec<u8> = (0..4 * 512).map(|i| (i * 13 % 253) as u8).collect();
    m.write_namespace_data(1, 10, &data);
    let mut qp = pair(&c, 8);
    let b = handle(&c, 4 * 512);
    let fill = |bytes: &[u8]| {
        // SAFETY: `b` is a live handle.
        let to = unsafe { upnvme_buf_data(b) }.cast::<u8>();
        // SAFETY: `b` is not in flight and has 4 × 512 bytes of memory at
        // `to`, which no Rust reference covers; `bytes` is at most that long.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), to, bytes.len()) }
    };
    fill(&data);
    let compare = Cmd::Compare {
        slba: 10,
        blocks: 4,
    };
    let cpl = one_cmd(&mut qp, compare, b).unwrap();
    assert_eq!((cpl.status, cpl.buf), (UPNVME_OK, b));
    let mut other = data.clone();
    other[1500] ^= 1;
    fill(&other);
    let cpl = one_cmd(&mut qp, compare, b).unwrap();
    assert_eq!(
        (cpl.status, cpl.sct, cpl.sc, cpl.buf),
        (UPNVME_EIO, 2, 0x85, b)
    );
    assert_eq!(
        one_cmd(&mut qp, compare, std::ptr::null_mut()).unwrap_err(),
        UPNVME_EINVAL
    );
    assert!(last_error().contains("need a buffer"), "{}", last_error());

    let verify = Cmd::Verify {
        slba: 10,
        blocks: 4,
    };
    assert_eq!(
        one_cmd(&mut qp, verify, std::ptr::null_mut())
            .unwrap()
            .status,
        UPNVME_OK
    );
    let wu = Cmd::WriteUncorrectable {
        slba: 12,
        blocks: 1,
    };
    assert_eq!(
        one_cmd(&mut qp, wu, std::ptr::null_mut()).unwrap().status,
        UPNVME_OK
    );
    let cpl = one_cmd(&mut qp, verify, std::ptr::null_mut()).unwrap();
    assert_eq!((cpl.status, cpl.sct, cpl.sc), (UPNVME_EIO, 2, 0x81));
    let read = Cmd::Read {
        slba: 12,
        blocks: 1,
    };
    let cpl = one_cmd(&mut qp, read, b).unwrap();
    assert_eq!((cpl.status, cpl.sct, cpl.sc), (UPNVME_EIO, 2, 0x81));
    // SAFETY: live, no longer in flight; freed once.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    drop(qp);
    drop(c);
    assert_eq!(m.dma_faults(), 0);
    assert!(m.violations().is_empty(), "{:?}", m.violations());

    let (m, c) = model_with(ModelConfig {
        oncs: 0,
        ..one_ns()
    });
    let mut qp = pair(&c, 8);
    let b = handle(&c, 512);
    let before = m.commands_fetched();
    for (cmd, buf) in [
        (Cmd::Compare { slba: 0, blocks: 1 }, b),
        (Cmd::Verify { slba: 0, blocks: 1 }, std::ptr::null_mut()),
        (
            Cmd::WriteUncorrectable { slba: 0, blocks: 1 },
            std::ptr::null_mut(),
        ),
    ] {
        assert_eq!(
            one_cmd(&mut qp, cmd, buf).unwrap_err(),
            UPNVME_ENOTSUP,
            "{cmd:?}"
        );
    }
    assert_eq!(m.commands_fetched(), before, "nothing sent");
    // SAFETY: live, handed back by the refusal; freed once.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
}

/// An I/O passthrough command (`upnvme_io_passthru`'s `Cmd::Raw`) for
/// namespace 1: `opcode` with CDW10–12 as given.
fn raw(opcode: u8, cdw10: u32, cdw12: u32, data_len: usize) -> Cmd<'static> {
    Cmd::Raw {
        sqe: upnvme::Sqe::passthrough(opcode, 1, [0, 0], [cdw10, 0, cdw12, 0, 0, 0]),
        data_len,
    }
}

/// `upnvme_io_passthru`: a raw Read (02h) brings the blocks into the
/// buffer, a raw Write (01h) puts the buffer's bytes on the blocks, a Flush
/// (00h) goes without data, and an opcode the controller lacks completes
/// with its status (Invalid Command Opcode) in `cpl`; the buffer comes back
/// with each completion. A Read whose `data_len` is shorter than its NLB
/// moves is refused (nothing sent) and hands the buffer back.
#[test]
fn io_passthru_moves_data_in_the_commands_direction() {
    let (m, c) = model();
    let data: Vec<u8> = (0..1024).map(|i| (i * 29 % 251) as u8).collect();
    m.write_namespace_data(1, 20, &data);
    let mut qp = pair(&c, 8);
    let b = handle(&c, 1024);
    let cpl = one_cmd(&mut qp, raw(0x02, 20, 1, 1024), b).unwrap();
    assert_eq!((cpl.status, cpl.buf), (UPNVME_OK, b));
    let mut back = vec![0u8; 1024];
    // SAFETY: `b` is a live handle.
    let from = unsafe { upnvme_buf_data(b) }.cast::<u8>().cast_const();
    // SAFETY: `b` is not in flight and has 1024 bytes of memory at `from`,
    // which no Rust reference covers; `back` is our own.
    unsafe { std::ptr::copy_nonoverlapping(from, back.as_mut_ptr(), 1024) };
    assert_eq!(back, data);

    let cpl = one_cmd(&mut qp, raw(0x01, 40, 1, 1024), b).unwrap();
    assert_eq!(cpl.status, UPNVME_OK);
    assert_eq!(m.namespace_data(1, 40, 2), data);
    let cpl = one_cmd(&mut qp, raw(0x00, 0, 0, 0), std::ptr::null_mut()).unwrap();
    assert_eq!(cpl.status, UPNVME_OK);
    let cpl = one_cmd(&mut qp, raw(0xc4, 0, 0, 0), std::ptr::null_mut()).unwrap();
    assert_eq!((cpl.status, cpl.sct, cpl.sc), (UPNVME_EIO, 0, 0x01));

    let before = m.commands_fetched();
    let short = one_cmd(&mut qp, raw(0x02, 20, 1, 512), b).unwrap_err();
    assert_eq!(short, UPNVME_EINVAL, "{}", last_error());
    assert_eq!(m.commands_fetched(), before, "nothing sent");
    // SAFETY: live, handed back by the refusal; freed once.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    drop(qp);
    drop(c);
    assert_eq!(m.dma_faults(), 0);
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

/// What `upnvme_io_passthru` refuses before it looks at the pair: a NULL
/// command, a non-zero `rsvd`, a data length without a buffer and a buffer
/// without a data length.
#[test]
fn io_passthru_refuses_malformed_calls_first() {
    let cmd = crate::upnvme_io_cmd {
        opcode: 0x02,
        nsid: 1,
        ..Default::default()
    };
    let call = |cmd: *const crate::upnvme_io_cmd, buf: *mut upnvme_buf, len: usize| {
        // SAFETY: every call below is refused before the NULL pair or the
        // (never dereferenced) buffer pointer is used; `cmd` is NULL or
        // valid for a read.
        unsafe {
            crate::upnvme_io_passthru(
                std::ptr::null_mut(),
                cmd,
                buf,
                len,
                None,
                std::ptr::null_mut(),
            )
        }
    };
    assert_eq!(
        call(std::ptr::null(), std::ptr::null_mut(), 0),
        UPNVME_EINVAL
    );
    assert!(last_error().contains("cmd is NULL"), "{}", last_error());
    let bad = crate::upnvme_io_cmd {
        rsvd: [0, 1, 0],
        ..cmd
    };
    assert_eq!(call(&bad, std::ptr::null_mut(), 0), UPNVME_EINVAL);
    assert!(last_error().contains("rsvd"), "{}", last_error());
    assert_eq!(call(&cmd, std::ptr::null_mut(), 512), UPNVME_EINVAL);
    assert!(last_error().contains("buf is NULL"), "{}", last_error());
    let not_a_handle = std::ptr::NonNull::<upnvme_buf>::dangling().as_ptr();
    assert_eq!(call(&cmd, not_a_handle, 0), UPNVME_EINVAL);
    assert!(last_error().contains("data_len 0"), "{}", last_error());
    // Well formed: refused for the NULL pair only.
    assert_eq!(call(&cmd, std::ptr::null_mut(), 0), UPNVME_EINVAL);
    assert!(
        last_error().contains("queue pair handle is NULL"),
        "{}",
        last_error()
    );
}

/// `upnvme_io_passthru` of a data command on a namespace with separate
/// metadata (a buffer the C API has no way to pass) is refused, nothing
/// sent; on an extended-LBA namespace the data length covers the metadata
/// interleaved with each block.
#[test]
fn io_passthru_and_metadata_formats() {
    let ns = |nsid, extended| NamespaceConfig {
        nsid,
        lba_size: 512,
        blocks: BLOCKS,
        ms: 8,
        extended,
        ..NamespaceConfig::default()
    };
    let (m, c) = model_with(ModelConfig {
        namespaces: vec![ns(1, false), ns(2, true)],
        ..Default::default()
    });
    let mut qp = pair(&c, 8);
    let b = handle(&c, 2 * 520);
    let before = m.commands_fetched();
    let rc = one_cmd(&mut qp, raw(0x02, 0, 0, 512), b).unwrap_err();
    assert_eq!(rc, UPNVME_EINVAL, "{}", last_error());
    assert!(last_error().contains("separate buffer"), "{}", last_error());
    assert_eq!(m.commands_fetched(), before, "nothing sent");
    let read2 = Cmd::Raw {
        sqe: upnvme::Sqe::passthrough(0x02, 2, [0, 0], [0, 0, 1, 0, 0, 0]),
        data_len: 2 * 520,
    };
    let mut seen: Vec<upnvme_cpl> = Vec::new();
    let arg: *mut Vec<upnvme_cpl> = &mut seen;
    // SAFETY: `b` live and not in flight; `seen` outlives the reap.
    let rc = unsafe { qp.submit(2, read2, b, Some(cpl_cb), arg.cast()) };
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    while seen.is_empty() {
        // SAFETY: a live pair of this thread.
        assert!(unsafe { Qpair::process_completions(qpp, 0) } >= 0);
    }
    assert_eq!((seen[0].status, seen[0].buf), (UPNVME_OK, b));
    // SAFETY: live, back from its command; freed once.
    assert_eq!(unsafe { upnvme_buf_free(b) }, UPNVME_OK);
    drop(qp);
    drop(c);
    assert_eq!(m.dma_faults(), 0);
}

/// A Copy's sources are checked against the very namespace list the
/// command is built from. Range 0's namespace 2 is in the pair's list; range
/// 1's namespace 3 is not, so the pair takes the controller's current list —
/// in which (another thread's refresh having detached it meanwhile, as the
/// shared list below stands for) namespace 2 is gone. The Copy must then be
/// refused naming namespace 2, not sent with range 0 read from the
/// destination namespace instead.
#[test]
fn a_copy_source_dropped_by_the_refresh_a_later_source_needs_is_refused() {
    let ns = NamespaceConfig {
        nsid: 1,
        lba_size: 512,
        blocks: 1024,
        ..NamespaceConfig::default()
    };
    let (m, c) = model_with(ModelConfig {
        namespaces: vec![
            ns,
            NamespaceConfig { nsid: 2, ..ns },
            NamespaceConfig { nsid: 3, ..ns },
        ],
        oncs: ModelConfig::ONCS_COPY,
        ocfs: 0xf,
        ..Default::default()
    });
    m.write_namespace_data(1, 0, &[0x11; 512]);
    m.write_namespace_data(2, 0, &[0x22; 512]);
    m.write_namespace_data(3, 0, &[0x33; 512]);
    let all = c.namespaces().to_vec();
    let shared = std::sync::Arc::new(std::sync::Mutex::new(vec![all[0].clone(), all[1].clone()]));
    let qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(8),
            ..Default::default()
        })
        .unwrap();
    let mut qp = Box::new(Qpair::new(qp, shared.clone()));
    // The controller's list now: namespace 2 gone, namespace 3 listed.
    *shared.lock().unwrap() = vec![all[0].clone(), all[2].clone()];
    let before = m.commands_fetched();
    let rc = copy_c(&mut qp, 1, 100, &[range(0, 1, 2), range(0, 1, 3)]);
    assert_eq!(
        rc,
        UPNVME_EINVAL,
        "sent; namespace 1 at 100 now holds {:02x?}",
        &m.namespace_data(1, 100, 1)[..4]
    );
    assert!(
        last_error().contains("Copy source range 0: namespace 2 (snsid) is not an active"),
        "{}",
        last_error()
    );
    assert_eq!(m.commands_fetched(), before, "nothing sent");
    drop(qp);
    drop(c);
    assert_eq!(m.dma_faults(), 0);
}

/// A namespace of 512-byte blocks with `ms` bytes of metadata, separate or
/// extended, with protection information of `pi_type` (0: none).
fn md_ns(nsid: u32, ms: u16, extended: bool, pi_type: u8) -> NamespaceConfig {
    NamespaceConfig {
        nsid,
        lba_size: 512,
        blocks: BLOCKS,
        ms,
        extended,
        pi_type,
        ..NamespaceConfig::default()
    }
}

/// A `upnvme_io_ext` with `pi` bits and a metadata handle.
fn ext(pi: u32, md: *mut upnvme_buf) -> crate::upnvme_io_ext {
    crate::upnvme_io_ext {
        pi,
        md,
        ..Default::default()
    }
}

/// One command with `ext` (as the `_ext` functions build it) on namespace
/// `nsid`, reaped: its completion, or the refusal's code.
fn one_ext(
    qp: &mut Qpair<ModelController>,
    nsid: u32,
    cmd: Cmd<'_>,
    e: &crate::upnvme_io_ext,
    buf: *mut upnvme_buf,
) -> Result<upnvme_cpl, c_int> {
    // SAFETY: the test's struct, valid for its size.
    let x = unsafe { crate::ext_of(e) }?;
    let mut seen: Vec<upnvme_cpl> = Vec::new();
    let arg: *mut Vec<upnvme_cpl> = &mut seen;
    // SAFETY: `buf` and `e.md` null or live handles of the test; `seen`
    // outlives the reap below.
    let rc = unsafe { qp.submit_with(nsid, cmd, x, buf, Some(cpl_cb), arg.cast()) };
    if rc != UPNVME_OK {
        return Err(rc);
    }
    let qpp: *mut Qpair<ModelController> = qp;
    let start = std::time::Instant::now();
    while seen.is_empty() && start.elapsed() < Duration::from_secs(5) {
        // SAFETY: a live pair of this thread.
        assert!(unsafe { Qpair::process_completions(qpp, 0) } >= 0);
    }
    Ok(seen.pop().expect("no completion in 5 s"))
}

/// The bytes of a handle's buffer.
fn bytes(b: *mut upnvme_buf, len: usize) -> Vec<u8> {
    // SAFETY: a live handle of the test, not in flight: its buffer is there
    // and at least `len` long (the tests' own sizes).
    let h = unsafe { &*b };
    let mut v = vec![0; len];
    h.buf.as_ref().unwrap().read_bytes(0, &mut v).unwrap();
    v
}

/// Whether a handle holds its memory and no command holds it: back from its
/// command, or never taken.
fn settled(h: *mut upnvme_buf) -> bool {
    // SAFETY: a live handle of the test, not borrowed elsewhere.
    let r = unsafe { &*h };
    // SAFETY: as above.
    let data = unsafe { upnvme_buf_data(h) };
    r.buf.is_some() && !r.inflight && !data.is_null()
}

/// Fills a handle's buffer with `data` from its first byte.
fn fill(b: *mut upnvme_buf, data: &[u8]) {
    // SAFETY: as in `bytes`.
    let h = unsafe { &mut *b };
    h.buf.as_mut().unwrap().write_bytes(0, data).unwrap();
}

/// `upnvme_write_ext` / `upnvme_read_ext` on a namespace with separate
/// metadata: the metadata buffer carries each block's metadata to and from
/// the controller, both handles come back in the completion (`cpl.buf`,
/// `cpl.md`), and the plain functions still refuse the namespace, naming
/// the `_ext` functions.
#[test]
fn ext_moves_separate_metadata_and_hands_both_buffers_back() {
    let (m, c) = model_with(ModelConfig {
        namespaces: vec![md_ns(1, 16, false, 0)],
        ..Default::default()
    });
    let mut qp = pair(&c, 8);
    let b = handle(&c, 4096);
    let md = handle(&c, 4096);
    let data: Vec<u8> = (0..1024).map(|i| (i * 7 + 3) as u8).collect();
    let meta: Vec<u8> = (0..32).map(|i| 0xa0 ^ i as u8).collect();
    fill(b, &data);
    fill(md, &meta);
    let write = Cmd::Write { slba: 9, blocks: 2 };
    let cpl = one_ext(&mut qp, 1, write, &ext(0, md), b).unwrap();
    assert_eq!((cpl.status, cpl.buf, cpl.md), (UPNVME_OK, b, md));
    assert_eq!(m.namespace_data(1, 9, 2), data);
    assert_eq!(m.namespace_metadata(1, 9, 2), meta);
    fill(b, &[0; 1024]);
    fill(md, &[0; 32]);
    let read = Cmd::Read { slba: 9, blocks: 2 };
    let cpl = one_ext(&mut qp, 1, read, &ext(0, md), b).unwrap();
    assert_eq!((cpl.status, cpl.buf, cpl.md), (UPNVME_OK, b, md));
    assert_eq!(bytes(b, 1024), data);
    assert_eq!(bytes(md, 32), meta);
    assert!(settled(b) && settled(md));
    // A Compare of the same data and metadata succeeds.
    let compare = Cmd::Compare { slba: 9, blocks: 2 };
    let cpl = one_ext(&mut qp, 1, compare, &ext(0, md), b).unwrap();
    assert_eq!(cpl.status, UPNVME_OK);
    // The plain read: refused, pointing at the _ext functions.
    // SAFETY: live handle.
    let rc = unsafe { qp.submit(1, read, b, None, std::ptr::null_mut()) };
    assert_eq!(rc, UPNVME_ENOTSUP);
    assert!(last_error().contains("upnvme_read_ext"), "{}", last_error());
    // With NULL ext the library asks for the metadata buffer.
    let before = m.commands_fetched();
    // SAFETY: NULL ext.
    let x = unsafe { crate::ext_of(std::ptr::null()) }.unwrap();
    // SAFETY: live handle.
    let rc = unsafe { qp.submit_with(1, read, x, b, None, std::ptr::null_mut()) };
    assert_eq!(rc, UPNVME_EINVAL, "{}", last_error());
    assert_eq!(m.commands_fetched(), before, "nothing sent");
    assert!(settled(b), "handed back by the refusal");
    for h in [b, md] {
        // SAFETY: live handles, not in flight; freed once.
        assert_eq!(unsafe { upnvme_buf_free(h) }, UPNVME_OK);
    }
    drop(qp);
    drop(c);
    assert_eq!(m.dma_faults(), 0);
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

/// Protection information through `upnvme_io_ext.pi`: PRACT on a write
/// makes the controller generate each block's tuple (8-byte metadata: the
/// buffer carries data only, no `md`); a read with the checks and a
/// metadata buffer gets the tuples, whose reference tag is the LBA; a read
/// expecting another reference tag fails with Reference Tag Check Error
/// (2h/84h); Verify checks without data; Write Zeroes with PRACT leaves
/// valid tuples.
#[test]
fn ext_protection_fields_reach_the_controller() {
    let (m, c) = model_with(ModelConfig {
        namespaces: vec![md_ns(1, 8, false, 1)],
        oncs: ModelConfig::default().oncs | 1 << 7 | 1 << 3,
        ..Default::default()
    });
    let mut qp = pair(&c, 8);
    let b = handle(&c, 4096);
    let md = handle(&c, 4096);
    let data: Vec<u8> = (0..1024).map(|i| (i * 13 + 1) as u8).collect();
    fill(b, &data);
    let checks = crate::UPNVME_PI_CHECK_GUARD | crate::UPNVME_PI_CHECK_REF_TAG;
    let write = Cmd::Write {
        slba: 40,
        blocks: 2,
    };
    let pract = ext(crate::UPNVME_PI_PRACT | checks, std::ptr::null_mut());
    let cpl = one_ext(&mut qp, 1, write, &pract, b).unwrap();
    assert_eq!((cpl.status, cpl.md), (UPNVME_OK, std::ptr::null_mut()));
    assert_eq!(m.namespace_data(1, 40, 2), data);
    let read = Cmd::Read {
        slba: 40,
        blocks: 2,
    };
    fill(b, &[0; 1024]);
    let cpl = one_ext(&mut qp, 1, read, &ext(checks, md), b).unwrap();
    assert_eq!((cpl.status, cpl.md), (UPNVME_OK, md), "{cpl:?}");
    assert_eq!(bytes(b, 1024), data);
    let tuples = bytes(md, 16);
    for (i, t) in tuples.chunks(8).enumerate() {
        // Type 1: the reference tag (bytes 7:4, big-endian) is the LBA.
        assert_eq!(&t[4..8], &(40 + i as u32).to_be_bytes(), "block {i}");
    }
    // PRACT on the read: checked and stripped, no metadata buffer.
    let cpl = one_ext(&mut qp, 1, read, &pract, b).unwrap();
    assert_eq!(cpl.status, UPNVME_OK);
    // An expected reference tag that is not the one written: Type 1 takes
    // only the LBA's, so the library refuses it; a Reference Tag Check
    // Error needs a block whose tag is wrong.
    let mut wrong = ext(checks | crate::UPNVME_PI_REF_TAG, md);
    wrong.ref_tag = 41;
    assert_eq!(
        one_ext(&mut qp, 1, read, &wrong, b).unwrap_err(),
        UPNVME_EINVAL
    );
    let mut bad = tuples.clone();
    bad[4..8].copy_from_slice(&7u32.to_be_bytes());
    fill(md, &bad);
    // Written without checks (the controller stores what it is given) ...
    let cpl = one_ext(&mut qp, 1, write, &ext(0, md), b).unwrap();
    assert_eq!(cpl.status, UPNVME_OK);
    // ... then read with the reference tag check.
    let cpl = one_ext(&mut qp, 1, read, &ext(checks, md), b).unwrap();
    assert_eq!(
        (cpl.status, cpl.sct, cpl.sc),
        (UPNVME_EIO, 2, 0x84),
        "{cpl:?}"
    );
    assert_eq!((cpl.buf, cpl.md), (b, md));
    // Verify with the check finds the same block; without checks it passes.
    let verify = Cmd::Verify {
        slba: 40,
        blocks: 2,
    };
    let v = ext(crate::UPNVME_PI_CHECK_REF_TAG, std::ptr::null_mut());
    let cpl = one_ext(&mut qp, 1, verify, &v, std::ptr::null_mut()).unwrap();
    assert_eq!((cpl.status, cpl.sct, cpl.sc), (UPNVME_EIO, 2, 0x84));
    let cpl = one_ext(
        &mut qp,
        1,
        verify,
        &ext(0, std::ptr::null_mut()),
        std::ptr::null_mut(),
    )
    .unwrap();
    assert_eq!(cpl.status, UPNVME_OK);
    // Verify takes no metadata buffer.
    assert_eq!(
        one_ext(&mut qp, 1, verify, &ext(0, md), std::ptr::null_mut()).unwrap_err(),
        UPNVME_EINVAL
    );
    assert!(settled(md), "handed back by the refusal");
    // Write Zeroes with PRACT: zeroed blocks with valid tuples.
    let wz = Cmd::WriteZeroes {
        slba: 40,
        blocks: 2,
        deallocate: false,
    };
    let p = ext(crate::UPNVME_PI_PRACT, std::ptr::null_mut());
    let cpl = one_ext(&mut qp, 1, wz, &p, std::ptr::null_mut()).unwrap();
    assert_eq!(cpl.status, UPNVME_OK);
    let cpl = one_ext(&mut qp, 1, read, &ext(checks, md), b).unwrap();
    assert_eq!(cpl.status, UPNVME_OK, "{cpl:?}");
    assert_eq!(bytes(b, 1024), vec![0; 1024]);
    // PRCHK on Write Zeroes is refused (no data to check).
    let p = ext(crate::UPNVME_PI_PRACT | checks, std::ptr::null_mut());
    assert_eq!(
        one_ext(&mut qp, 1, wz, &p, std::ptr::null_mut()).unwrap_err(),
        UPNVME_EINVAL
    );
    for h in [b, md] {
        // SAFETY: live handles, not in flight; freed once.
        assert_eq!(unsafe { upnvme_buf_free(h) }, UPNVME_OK);
    }
    drop(qp);
    drop(c);
    assert_eq!(m.dma_faults(), 0);
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

/// On an extended-LBA namespace the data buffer carries each block's
/// metadata after its data and no metadata buffer is taken; a buffer sized
/// for data only is refused. Refusals hand both handles back untouched.
#[test]
fn ext_extended_lba_and_refusals_keep_the_handles() {
    let (m, c) = model_with(ModelConfig {
        namespaces: vec![md_ns(1, 8, true, 0), md_ns(2, 0, false, 0)],
        ..Default::default()
    });
    let mut qp = pair(&c, 8);
    let b = handle(&c, 4096);
    let md = handle(&c, 4096);
    let blocks: Vec<u8> = (0..1040).map(|i| (i * 5 + 11) as u8).collect();
    fill(b, &blocks);
    let write = Cmd::Write { slba: 3, blocks: 2 };
    let none = ext(0, std::ptr::null_mut());
    let cpl = one_ext(&mut qp, 1, write, &none, b).unwrap();
    assert_eq!(cpl.status, UPNVME_OK);
    assert_eq!(
        m.namespace_data(1, 3, 2),
        [&blocks[..512], &blocks[520..1032]].concat()
    );
    assert_eq!(
        m.namespace_metadata(1, 3, 2),
        [&blocks[512..520], &blocks[1032..1040]].concat()
    );
    fill(b, &[0; 1040]);
    let read = Cmd::Read { slba: 3, blocks: 2 };
    let cpl = one_ext(&mut qp, 1, read, &none, b).unwrap();
    assert_eq!(cpl.status, UPNVME_OK);
    assert_eq!(bytes(b, 1040), blocks);
    let before = m.commands_fetched();
    // A metadata buffer where the metadata is in the blocks.
    assert_eq!(
        one_ext(&mut qp, 1, read, &ext(0, md), b).unwrap_err(),
        UPNVME_EINVAL
    );
    assert!(settled(b) && settled(md));
    // A metadata buffer on a namespace without metadata.
    assert_eq!(
        one_ext(&mut qp, 2, read, &ext(0, md), b).unwrap_err(),
        UPNVME_EINVAL
    );
    assert!(settled(b) && settled(md));
    // Protection fields on a namespace without protection information.
    let pi = ext(crate::UPNVME_PI_CHECK_GUARD, std::ptr::null_mut());
    assert_eq!(
        one_ext(&mut qp, 1, read, &pi, b).unwrap_err(),
        UPNVME_EINVAL
    );
    // One handle as both buffers.
    assert_eq!(
        one_ext(&mut qp, 1, read, &ext(0, b), b).unwrap_err(),
        UPNVME_EINVAL
    );
    assert!(last_error().contains("two buffers"), "{}", last_error());
    assert!(settled(b));
    // Unknown bits, a size below 4.
    assert_eq!(
        one_ext(&mut qp, 1, read, &ext(1 << 5, std::ptr::null_mut()), b).unwrap_err(),
        UPNVME_EINVAL
    );
    let mut unknown_flag = none;
    unknown_flag.flags = 1 << 2;
    assert_eq!(
        one_ext(&mut qp, 1, read, &unknown_flag, b).unwrap_err(),
        UPNVME_EINVAL
    );
    let mut zero = none;
    zero.size = 0;
    assert_eq!(
        one_ext(&mut qp, 1, read, &zero, b).unwrap_err(),
        UPNVME_EINVAL
    );
    assert!(
        last_error().contains("upnvme_io_ext.size is 0"),
        "{}",
        last_error()
    );
    assert_eq!(m.commands_fetched(), before, "nothing sent");
    // A metadata handle in flight is refused before anything is taken.
    // SAFETY: the test's handle, no other reference.
    unsafe { (*md).inflight = true };
    assert_eq!(
        one_ext(&mut qp, 2, read, &ext(0, md), b).unwrap_err(),
        UPNVME_EBUSY
    );
    assert!(settled(b));
    // SAFETY: as above.
    unsafe { (*md).inflight = false };
    for h in [b, md] {
        // SAFETY: live handles, not in flight; freed once.
        assert_eq!(unsafe { upnvme_buf_free(h) }, UPNVME_OK);
    }
    drop(qp);
    drop(c);
    assert_eq!(m.dma_faults(), 0);
}

/// A size-versioned `upnvme_io_ext`: a `size` below this first version's
/// is refused (read as far as it says, it could end inside `md`, a pointer
/// half the caller's bytes); a larger one, from a newer header, is read up
/// to this version's end.
#[test]
fn ext_size_below_the_first_version_is_refused() {
    #[repr(C)]
    struct Newer {
        e: crate::upnvme_io_ext,
        later: u64,
    }
    let mut n = Newer {
        e: ext(
            crate::UPNVME_PI_PRACT | crate::UPNVME_PI_REF_TAG | crate::UPNVME_PI_CHECK_APP_TAG,
            std::ptr::null_mut(),
        ),
        later: u64::MAX,
    };
    for size in [4, 12, 16, 31] {
        n.e.size = size;
        // SAFETY: the test's struct, valid for its whole size.
        let rc = unsafe { crate::ext_of(&n.e) }.unwrap_err();
        assert_eq!(rc, UPNVME_EINVAL);
        assert!(
            last_error().contains("below the struct's 32 bytes"),
            "{}",
            last_error()
        );
    }
    n.e.size = std::mem::size_of::<Newer>() as u32;
    n.e.flags = crate::UPNVME_IO_FUA;
    n.e.ref_tag = 77;
    n.e.app_tag = 0x1234;
    n.e.app_tag_mask = 0xff00;
    // SAFETY: valid for its `size` (the whole `Newer`).
    let x = unsafe { crate::ext_of(&n.e) }.unwrap();
    assert_eq!(x.flags, upnvme::IoFlags::FUA);
    assert!(x.metadata_aware && x.md.is_null());
    assert_eq!(
        x.protection.unwrap(),
        upnvme::Protection {
            pract: true,
            check_guard: false,
            check_app_tag: true,
            check_ref_tag: false,
            ref_tag: Some(77),
            app_tag: 0x1234,
            app_tag_mask: 0xff00,
        }
    );
    // NULL: nothing added, but namespaces with metadata are taken.
    // SAFETY: NULL.
    let x = unsafe { crate::ext_of(std::ptr::null()) }.unwrap();
    assert!(x.protection.is_none() && x.md.is_null() && x.metadata_aware);
}

/// `upnvme_ns_info` reports where the protection information tuple sits
/// and its guard size.
#[test]
fn ns_info_reports_the_pi_tuple_layout() {
    let first = NamespaceConfig {
        pi_first: true,
        ..md_ns(2, 16, false, 2)
    };
    let (_m, c) = model_with(ModelConfig {
        namespaces: vec![md_ns(1, 8, true, 1), first, md_ns(3, 8, false, 0)],
        ..Default::default()
    });
    let h = crate::Ctrl::new(c);
    let i = h.ns_info(1).unwrap();
    assert_eq!((i.pi_type, i.pi_first, i.pi_guard_bits), (1, false, 16));
    let i = h.ns_info(2).unwrap();
    assert_eq!((i.pi_type, i.pi_first, i.pi_guard_bits), (2, true, 16));
    let i = h.ns_info(3).unwrap();
    assert_eq!((i.pi_type, i.pi_first, i.pi_guard_bits), (0, false, 0));
}

/// Submits one command with `e` on namespace 1 without reaping it; the
/// completions go to `seen` (`cpl_cb`).
fn submit_ext(
    qp: &mut Qpair<ModelController>,
    cmd: Cmd<'_>,
    e: &crate::upnvme_io_ext,
    buf: *mut upnvme_buf,
    cb: crate::upnvme_cmd_cb,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: the test's struct, valid for its size.
    let x = match unsafe { crate::ext_of(e) } {
        Ok(x) => x,
        Err(rc) => return rc,
    };
    // SAFETY: `buf` and `e.md` null or live handles of the test; `arg`
    // outlives the pair's callbacks.
    unsafe { qp.submit_with(1, cmd, x, buf, cb, arg) }
}

/// Whether a handle is empty and free: not in flight, no memory (its
/// command ended without handing the memory back), so it can be freed.
fn emptied(h: *mut upnvme_buf) -> bool {
    // SAFETY: a live handle of the test, not borrowed elsewhere.
    let r = unsafe { &*h };
    // SAFETY: as above.
    let data = unsafe { upnvme_buf_data(h) };
    r.buf.is_none() && !r.inflight && data.is_null() && r.len == 0
}

/// A metadata handle in flight is refused by everything that would free,
/// give back, split or reuse it — `upnvme_buf_free`, `upnvme_pool_put`,
/// `upnvme_buf_split`, another command as its data or metadata buffer —
/// and each refusal leaves the other handle it was given as it was; back
/// from its command, the pool takes it. A piece of a split buffer serves as
/// a metadata buffer when it starts dword aligned, and is refused (both
/// handles handed back) when it does not.
#[test]
fn a_metadata_handle_in_flight_is_refused_everywhere_and_pieces_serve_as_one() {
    let (m, c) = model_with(ModelConfig {
        namespaces: vec![md_ns(1, 16, false, 0)],
        ..Default::default()
    });
    let mut qp = pair(&c, 8);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let b = handle(&c, 4096);
    let b2 = handle(&c, 4096);
    let mut p = upnvme_pool::new(c.dma_pool(4096, 2).unwrap());
    let pp: *mut upnvme_pool = &mut *p;
    let md = p.get().unwrap();
    let mut seen: Vec<upnvme_cpl> = Vec::new();
    let arg: *mut Vec<upnvme_cpl> = &mut seen;
    let read = Cmd::Read { slba: 0, blocks: 2 };
    let rc = submit_ext(&mut qp, read, &ext(0, md), b, Some(cpl_cb), arg.cast());
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    // SAFETY: the test's live handle and pool.
    assert_eq!(unsafe { crate::upnvme_pool_put(pp, md) }, UPNVME_EBUSY);
    // SAFETY: as above; refused, so still live.
    assert_eq!(unsafe { upnvme_buf_free(md) }, UPNVME_EBUSY);
    let mut pieces = [std::ptr::null_mut(); 8];
    let mut n = 0usize;
    // SAFETY: as above; `pieces` holds 8, `n` is writable.
    let rc = unsafe { crate::upnvme_buf_split(md, 512, pieces.as_mut_ptr(), 8, &mut n) };
    assert_eq!(rc, UPNVME_EBUSY);
    // As another command's data buffer, and as its metadata buffer.
    // SAFETY: NULL.
    let x = unsafe { crate::ext_of(std::ptr::null()) }.unwrap();
    // SAFETY: live handles of the test.
    let rc = unsafe { qp.submit_with(1, read, x, md, None, std::ptr::null_mut()) };
    assert_eq!(rc, UPNVME_EBUSY);
    let rc = submit_ext(&mut qp, read, &ext(0, md), b2, None, std::ptr::null_mut());
    assert_eq!(rc, UPNVME_EBUSY);
    assert!(
        settled(b2),
        "the data buffer of the refusal is the caller's"
    );
    let start = std::time::Instant::now();
    while seen.is_empty() && start.elapsed() < Duration::from_secs(5) {
        // SAFETY: a live pair of this thread.
        assert!(unsafe { Qpair::process_completions(qpp, 0) } >= 0);
    }
    assert_eq!(
        (seen[0].status, seen[0].buf, seen[0].md),
        (UPNVME_OK, b, md)
    );
    assert!(settled(md) && settled(b));
    // SAFETY: back from its command; given up to the pool.
    assert_eq!(unsafe { crate::upnvme_pool_put(pp, md) }, UPNVME_OK);
    // Pieces of 36 bytes: the second starts at 36 (dword aligned), the
    // third at 72; pieces of 34: the second at 34 (not aligned).
    for (len, ok) in [(36, true), (34, false)] {
        let whole = handle(&c, 4096);
        let mut pieces = vec![std::ptr::null_mut(); 4096usize.div_ceil(len)];
        let mut n = 0usize;
        // SAFETY: a live handle; `pieces` holds `n` slots.
        let rc = unsafe {
            crate::upnvme_buf_split(whole, len, pieces.as_mut_ptr(), pieces.len(), &mut n)
        };
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
        let piece = pieces[1];
        let r = one_ext(&mut qp, 1, read, &ext(0, piece), b);
        if ok {
            let cpl = r.unwrap();
            assert_eq!((cpl.status, cpl.md), (UPNVME_OK, piece));
        } else {
            assert_eq!(r.unwrap_err(), UPNVME_EINVAL);
            assert!(last_error().contains("dword aligned"), "{}", last_error());
        }
        assert!(settled(piece) && settled(b));
        for h in pieces {
            // SAFETY: live pieces, not in flight; freed once.
            assert_eq!(unsafe { upnvme_buf_free(h) }, UPNVME_OK);
        }
    }
    for h in [b, b2] {
        // SAFETY: live handles, not in flight; freed once.
        assert_eq!(unsafe { upnvme_buf_free(h) }, UPNVME_OK);
    }
    drop(qp);
    drop(p);
    drop(c);
    assert_eq!(m.dma_faults(), 0);
}

/// What the callbacks of commands ended by a destroy saw, and what freeing
/// another command's metadata handle from the first of them gave.
struct EndedExt {
    other_md: *mut upnvme_buf,
    seen: Vec<(c_int, *mut upnvme_buf, *mut upnvme_buf, bool, bool)>,
    free_rc: Vec<c_int>,
}

unsafe extern "C" fn ended_ext_cb(arg: *mut c_void, cpl: *const upnvme_cpl) {
    // SAFETY: `arg` is the test's `EndedExt`, alive for the whole test.
    let e = unsafe { &mut *arg.cast::<EndedExt>() };
    // SAFETY: valid for the call.
    let cpl = unsafe { *cpl };
    // SAFETY: the handle is the application's again (live).
    let inflight = unsafe { (*cpl.md).inflight };
    // SAFETY: as above.
    let data = unsafe { upnvme_buf_data(cpl.md) };
    e.seen
        .push((cpl.status, cpl.buf, cpl.md, inflight, data.is_null()));
    if e.free_rc.is_empty() {
        // SAFETY: a live handle of the test (refused while its command has
        // not ended).
        e.free_rc.push(unsafe { upnvme_buf_free(e.other_md) });
    }
}

/// Commands with a metadata buffer that can never complete (the device is
/// gone) end at destroy: each callback gets both handles back, not in
/// flight and without memory; until its own callback a command's metadata
/// handle stays in flight (an earlier callback cannot free it); afterwards
/// every handle can be freed.
#[test]
fn destroy_ends_commands_with_both_handles_back_empty() {
    let (m, c) = model_with(ModelConfig {
        namespaces: vec![md_ns(1, 16, false, 0)],
        ..Default::default()
    });
    let mut qp = pair(&c, 8);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let bufs = [handle(&c, 4096), handle(&c, 4096)];
    let mds = [handle(&c, 4096), handle(&c, 4096)];
    let mut e = EndedExt {
        other_md: mds[1],
        seen: Vec::new(),
        free_rc: Vec::new(),
    };
    let arg: *mut EndedExt = &mut e;
    m.inject(upnvme_tests::Fault::UnplugOn(upnvme_tests::Match::Queue(
        qp.qp.qid(),
    )));
    let read = Cmd::Read { slba: 0, blocks: 2 };
    for (b, md) in bufs.into_iter().zip(mds) {
        let rc = submit_ext(
            &mut qp,
            read,
            &ext(0, md),
            b,
            Some(ended_ext_cb),
            arg.cast(),
        );
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
    }
    assert!(c.smart_log().is_err(), "the device is gone");
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::end_for_destroy(qpp) }, UPNVME_OK);
    assert_eq!(
        e.seen,
        vec![
            (UPNVME_ENODEV, bufs[0], mds[0], false, true),
            (UPNVME_ENODEV, bufs[1], mds[1], false, true),
        ]
    );
    assert_eq!(e.free_rc, vec![UPNVME_EBUSY]);
    for h in bufs.into_iter().chain(mds) {
        assert!(emptied(h));
        // SAFETY: live handles, their commands ended; freed once.
        assert_eq!(unsafe { upnvme_buf_free(h) }, UPNVME_OK);
    }
    drop(qp);
    drop(c);
    assert_eq!(m.dma_faults(), 0);
}

/// A poisoned pair's commands end at destroy without their callbacks; the
/// metadata handle comes back empty and freeable, as the data handle does.
#[test]
fn destroying_a_poisoned_pair_hands_back_the_metadata_handle_empty() {
    let (m, c) = model_with(ModelConfig {
        namespaces: vec![md_ns(1, 16, false, 0)],
        ..Default::default()
    });
    let mut qp = pair(&c, 8);
    let qpp: *mut Qpair<ModelController> = &mut *qp;
    let b = handle(&c, 4096);
    let md = handle(&c, 4096);
    m.inject(upnvme_tests::Fault::DelayCompletion {
        on: upnvme_tests::Match::Queue(qp.qp.qid()),
        doorbells: None,
    });
    let read = Cmd::Read { slba: 0, blocks: 2 };
    let rc = submit_ext(&mut qp, read, &ext(0, md), b, None, std::ptr::null_mut());
    assert_eq!(rc, UPNVME_OK, "{}", last_error());
    // SAFETY: the test's live handle.
    assert_eq!(unsafe { upnvme_buf_free(md) }, UPNVME_EBUSY, "in flight");
    qp.poison();
    // SAFETY: live pair, this thread's.
    assert_eq!(unsafe { Qpair::end_for_destroy(qpp) }, UPNVME_OK);
    for h in [b, md] {
        assert!(emptied(h));
        // SAFETY: live handles, no longer in flight; freed once.
        assert_eq!(unsafe { upnvme_buf_free(h) }, UPNVME_OK);
    }
    drop(qp);
    let _ = c.close();
    assert_eq!(m.dma_faults(), 0);
}

/// A submission that unwinds with both buffers taken settles both handles
/// without memory (the guard `submit_with` arms for the two).
#[test]
fn a_panic_inside_submit_leaves_both_handles_freeable_without_memory() {
    let (_m, c) = model();
    let b = handle(&c, 4096);
    let md = handle(&c, 4096);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let guard = crate::qpair::Unwound([b, md]);
        // SAFETY: the test's live handles; no other reference to them now.
        let taken = (unsafe { (*b).buf.take() }, unsafe { (*md).buf.take() });
        assert!(taken.0.is_some() && taken.1.is_some());
        let _keep = (guard, taken);
        panic!("inside the library");
    }));
    assert!(r.is_err());
    for h in [b, md] {
        assert!(emptied(h));
        // SAFETY: as above; freed once.
        assert_eq!(unsafe { upnvme_buf_free(h) }, UPNVME_OK);
    }
}

/// `upnvme_io_passthru_ext`: a raw Read on a namespace with separate
/// metadata takes the metadata buffer (MPTR) and hands it back in
/// `cpl->md`; PI bits and flags in `ext` are refused (a raw command carries
/// its own), both handles handed back. A Write through `_ext` above MDTS is
/// split, the metadata buffer with it, and completes once.
#[test]
fn io_passthru_ext_carries_the_metadata_buffer_and_splits_keep_it() {
    let (m, c) = model_with(ModelConfig {
        namespaces: vec![md_ns(1, 8, false, 0)],
        mdts: 1,
        ..Default::default()
    });
    let mut qp = pair(&c, 8);
    let b = handle(&c, 64 * 512);
    let md = handle(&c, 4096);
    let data: Vec<u8> = (0..64 * 512).map(|i| (i * 7 + 3) as u8).collect();
    let meta: Vec<u8> = (0..64 * 8).map(|i| (i * 3 + 1) as u8).collect();
    fill(b, &data);
    fill(md, &meta);
    let write = Cmd::Write {
        slba: 10,
        blocks: 64,
    };
    let cpl = one_ext(&mut qp, 1, write, &ext(0, md), b).unwrap();
    assert_eq!((cpl.status, cpl.buf, cpl.md), (UPNVME_OK, b, md));
    assert_eq!(m.namespace_data(1, 10, 64), data);
    assert_eq!(m.namespace_metadata(1, 10, 64), meta);
    fill(md, &[0; 512]);
    // Raw Read of blocks 10 and 11 (CDW10 SLBA, CDW12 NLB 1).
    let raw_read = Cmd::Raw {
        sqe: upnvme::Sqe::passthrough(0x02, 1, [0, 0], [10, 0, 1, 0, 0, 0]),
        data_len: 1024,
    };
    let cpl = one_ext(&mut qp, 1, raw_read, &ext(0, md), b).unwrap();
    assert_eq!((cpl.status, cpl.buf, cpl.md), (UPNVME_OK, b, md));
    assert_eq!(bytes(md, 16), meta[..16]);
    let pi = ext(crate::UPNVME_PI_CHECK_GUARD, md);
    assert_eq!(
        one_ext(&mut qp, 1, raw_read, &pi, b).unwrap_err(),
        UPNVME_EINVAL
    );
    let mut fua = ext(0, md);
    fua.flags = crate::UPNVME_IO_FUA;
    assert_eq!(
        one_ext(&mut qp, 1, raw_read, &fua, b).unwrap_err(),
        UPNVME_EINVAL
    );
    assert!(settled(b) && settled(md));
    for h in [b, md] {
        // SAFETY: live handles, not in flight; freed once.
        assert_eq!(unsafe { upnvme_buf_free(h) }, UPNVME_OK);
    }
    drop(qp);
    drop(c);
    assert_eq!(m.dma_faults(), 0);
}
