//! The kernel's release request (VFIO device request) seen through the C
//! API, while C threads are inside its calls: `process_completions`, a
//! submission, a callback that submits, `upnvme_ctrl_admin_passthru`,
//! `upnvme_ctrl_format_nvm`, `upnvme_ctrl_reset`, `upnvme_qpair_destroy`
//! and `upnvme_ctrl_close`. Properties: every command ends exactly once
//! through its callback (ENODEV-class), every buffer handle comes back once
//! (and with its memory when the release confirmed that DMA stopped), no
//! call hangs, no panic reaches the ABI (`UPNVME_EINTERNAL`), no doorbell
//! reaches the controller after the release's CC.EN = 0, and the return
//! codes are the documented ones.
//!
//! As in tests/reentry.rs, the crate's modules are compiled in with
//! `#[path]` so that `Ctrl` and `Qpair` (the handles behind `upnvme_ctrl` and
//! `upnvme_qpair`) run on the in-memory model; each `c_*` helper below is the
//! body of the extern "C" function of lib.rs of the same name, inside the
//! same panic guard. The device in front of the model (`Trap`) can hold the
//! release right after its CC.EN = 0 (as a controller slow to report
//! CSTS.RDY = 0 would) and records every register write that reaches the
//! controller from then until the device is released.
//!
//! Every test runs inside `bounded`: a hang fails it.
#![allow(dead_code, missing_docs, non_camel_case_types)]
// `Vec<Box<Arg>>`: each `cb_arg` needs an address that stays put.
#![allow(clippy::vec_box)]

#[path = "../src/buf.rs"]
pub mod buf;
#[path = "../src/ctrl.rs"]
pub mod ctrl;
#[path = "../src/qpair.rs"]
pub mod qpair;
#[path = "../src/status.rs"]
pub mod status;

use std::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use upnvme::dma::{DmaError, DmaMapper};
use upnvme::{Controller, Device, DmaBuffer};
use upnvme_tests::{Fault, Match, ModelConfig, ModelController, NamespaceConfig};

use buf::{upnvme_buf, upnvme_pool};
use ctrl::{Ctrl, upnvme_admin_cmd, upnvme_admin_cpl, upnvme_format};
use qpair::{Cmd, Qpair, upnvme_cpl, upnvme_qpair_opts};
use status::*;

// ---------------------------------------------------------------------------
// Register offsets and opcodes.
// ---------------------------------------------------------------------------

const CC: usize = 0x14;
const DOORBELLS: usize = 0x1000;
/// Admin SQ tail and CQ head doorbells (CAP.DSTRD = 0).
const ADMIN_SQ_DB: usize = 0x1000;
const ADMIN_CQ_DB: usize = 0x1004;
const OP_READ: u8 = 0x02;
const OP_IDENTIFY: u8 = 0x06;
const OP_FORMAT_NVM: u8 = 0x80;
const OP_DELETE_IO_SQ: u8 = 0x00;

// ---------------------------------------------------------------------------
// Panics on the library's release thread (no `catch_unwind` there: one would
// leave the release unfinished and the controller's users hanging).
// ---------------------------------------------------------------------------

static RELEASE_THREAD_PANICS: AtomicU32 = AtomicU32::new(0);

fn watch_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some("upnvme-release") {
                RELEASE_THREAD_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            prev(info);
        }));
    });
}

/// Runs `f` on a thread of its own and fails if it does not end within
/// `limit` (a hang fails the test instead of blocking it).
fn bounded(limit: Duration, f: impl FnOnce() + Send + 'static) {
    watch_panics();
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(limit) {
        Ok(()) => h.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(h.join().unwrap_err())
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("the test did not end within {limit:?}: a call hangs")
        }
    }
    assert_eq!(
        RELEASE_THREAD_PANICS.load(Ordering::SeqCst),
        0,
        "the upnvme-release thread panicked"
    );
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn on_release_thread() -> bool {
    std::thread::current().name() == Some("upnvme-release")
}

fn thread_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("(unnamed)")
        .to_string()
}

// ---------------------------------------------------------------------------
// The device: the model behind a trap.
// ---------------------------------------------------------------------------

type Pred = Box<dyn Fn(usize, u32) -> bool + Send + Sync>;
type Action = Box<dyn FnOnce() + Send>;

struct Armed {
    pred: Pred,
    action: Action,
}

#[derive(Default)]
struct TrapState {
    /// The release's CC.EN = 0 waits (after reaching the model) until `go`.
    hold: AtomicBool,
    go: AtomicBool,
    /// The release thread wrote CC.EN = 0.
    disabled_by_release: AtomicBool,
    /// Register writes that reached the controller after the release's
    /// CC.EN = 0 and before the device was released: doorbells, and CC
    /// with EN = 1 (the controller enabled again under the release).
    late: Mutex<Vec<String>>,
    /// Run once, right after the first 32-bit write that matches.
    after_write: Mutex<Vec<Armed>>,
    /// `release` returns false and CC.EN = 0 is ignored once set.
    stubborn: AtomicBool,
}

#[derive(Clone)]
struct Trap {
    model: ModelController,
    st: Arc<TrapState>,
}

impl Trap {
    fn new(model: &ModelController) -> Trap {
        Trap {
            model: model.clone(),
            st: Arc::default(),
        }
    }

    /// Holds the next release right after its CC.EN = 0 until `go`.
    fn hold_release(&self) {
        self.st.hold.store(true, Ordering::SeqCst);
    }

    fn go(&self) {
        self.st.go.store(true, Ordering::SeqCst);
    }

    /// Lets the held release go on after `d`, from another thread.
    fn go_after(&self, d: Duration) -> std::thread::JoinHandle<()> {
        let t = self.clone();
        std::thread::spawn(move || {
            std::thread::sleep(d);
            t.go();
        })
    }

    fn disabled_by_release(&self) -> bool {
        self.st.disabled_by_release.load(Ordering::SeqCst)
    }

    /// Asks for the release and waits until it wrote CC.EN = 0 (it is held
    /// there when `hold_release` was called).
    fn request_and_wait_for_disable(&self) {
        self.model.request_release();
        wait_until("the release's CC.EN = 0", Duration::from_secs(3), || {
            self.disabled_by_release()
        });
    }

    fn late(&self) -> Vec<String> {
        self.st.late.lock().unwrap().clone()
    }

    fn arm_after_write(
        &self,
        pred: impl Fn(usize, u32) -> bool + Send + Sync + 'static,
        action: impl FnOnce() + Send + 'static,
    ) {
        self.st.after_write.lock().unwrap().push(Armed {
            pred: Box::new(pred),
            action: Box::new(action),
        });
    }

    fn take_after(&self, o: usize, v: u32) -> Option<Action> {
        let mut g = self.st.after_write.lock().unwrap();
        let i = g.iter().position(|a| (a.pred)(o, v))?;
        Some(g.remove(i).action)
    }
}

impl Device for Trap {
    fn read32(&self, offset: usize) -> u32 {
        self.model.read32(offset)
    }
    fn write32(&self, offset: usize, value: u32) {
        let release = on_release_thread();
        if release && offset == CC && value & 1 == 0 && self.st.stubborn.load(Ordering::SeqCst) {
            self.st.disabled_by_release.store(true, Ordering::SeqCst);
            return;
        }
        if !release
            && self.st.disabled_by_release.load(Ordering::SeqCst)
            && !self.model.is_released()
            && (offset >= DOORBELLS || (offset == CC && value & 1 == 1))
        {
            self.st.late.lock().unwrap().push(format!(
                "{} write {value:#x} at {offset:#x} from thread {}",
                if offset >= DOORBELLS {
                    "doorbell"
                } else {
                    "CC (EN = 1)"
                },
                thread_name()
            ));
        }
        self.model.write32(offset, value);
        if release && offset == CC && value & 1 == 0 {
            self.st.disabled_by_release.store(true, Ordering::SeqCst);
            if self.st.hold.load(Ordering::SeqCst) {
                let start = Instant::now();
                while !self.st.go.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(4)
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        if let Some(a) = self.take_after(offset, value) {
            a();
        }
    }
    fn read64(&self, offset: usize) -> u64 {
        self.model.read64(offset)
    }
    fn write64(&self, offset: usize, value: u64) {
        self.model.write64(offset, value)
    }
    fn bar_len(&self) -> usize {
        self.model.bar_len()
    }
    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer, DmaError> {
        self.model.alloc_dma(len)
    }
    fn alloc_dma_device_read_only(&self, len: usize) -> Result<DmaBuffer, DmaError> {
        self.model.alloc_dma_device_read_only(len)
    }
    fn read_only_memory(&self) -> upnvme::ReadOnlyMemory {
        self.model.read_only_memory()
    }
    fn name(&self) -> String {
        self.model.name()
    }
    fn dma_mapper(&self) -> Option<Arc<dyn DmaMapper>> {
        self.model.dma_mapper()
    }
    fn release_request(&self) -> Option<Arc<dyn upnvme::ReleaseRequest>> {
        self.model.release_request()
    }
    fn release(&self) -> bool {
        if self.st.stubborn.load(Ordering::SeqCst) {
            return false;
        }
        self.model.release()
    }
}

// ---------------------------------------------------------------------------
// The C entry points (lib.rs bodies, on `Trap`).
// ---------------------------------------------------------------------------

type H = Ctrl<Trap>;
type Q = Qpair<Trap>;

struct SendPtr<T>(*mut T);
// SAFETY: the tests hand each pointer to one thread at a time (a queue pair
// is used by one thread at a time; a controller handle by any).
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}

fn last_error() -> String {
    // SAFETY: this thread's NUL-terminated message.
    unsafe { CStr::from_ptr(status::last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A model with one namespace of 1024 blocks of 4 KiB.
fn model() -> ModelController {
    let m = ModelController::new(ModelConfig {
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size: 4096,
            blocks: 1024,
            ..NamespaceConfig::default()
        }],
        ..Default::default()
    });
    m.offer_release_request();
    m
}

/// `upnvme_ctrl_open` on the trap: MMIO doorbells (every doorbell is a
/// register write the trap sees), 2 s bounds.
fn c_open(trap: &Trap) -> *mut H {
    let c = Controller::with_device(trap.clone(), upnvme_tests::host_options())
        .expect("bring-up on the model");
    Box::into_raw(Box::new(Ctrl::new(c)))
}

/// `upnvme_ctrl_close`.
fn c_close(h: *mut H) -> c_int {
    guard(|| {
        // SAFETY: from `c_open`, given up here, no call on it running.
        let h = unsafe { Box::from_raw(h) };
        match h.into_controller().map(Controller::close) {
            Some(Err(e)) => fail_error(&e),
            _ => UPNVME_OK,
        }
    })
}

fn opts(delay_doorbell: bool) -> upnvme_qpair_opts {
    upnvme_qpair_opts {
        delay_doorbell,
        ..Default::default()
    }
}

/// `upnvme_qpair_create`.
fn c_qpair_create(h: *mut H, o: upnvme_qpair_opts) -> Result<*mut Q, c_int> {
    let mut out: *mut Q = std::ptr::null_mut();
    let rc = guard(|| {
        // SAFETY: live handle.
        let h = unsafe { &*h };
        let Some(c) = h.get() else {
            return fail(UPNVME_EINVAL, "the controller is closed");
        };
        match c.io_queue_pair(o.to_options()) {
            Ok(qp) => {
                let mut qp = Qpair::new(qp, h.nss.clone());
                qp.set_delay_doorbell(o.delay_doorbell);
                out = Box::into_raw(Box::new(qp));
                UPNVME_OK
            }
            Err(e) => fail_error(&e),
        }
    });
    if rc == UPNVME_OK { Ok(out) } else { Err(rc) }
}

/// `upnvme_qpair_destroy`.
fn c_qpair_destroy(qp: *mut Q) -> c_int {
    guard(|| {
        // SAFETY: live, this thread's.
        let rc = unsafe { Qpair::end_for_destroy(qp) };
        if rc != UPNVME_OK {
            return rc;
        }
        // SAFETY: made by `Box::into_raw`, given up.
        drop(unsafe { Box::from_raw(qp) });
        UPNVME_OK
    })
}

/// `upnvme_qpair_process_completions`.
fn c_process(qp: *mut Q, max: u32) -> c_int {
    // SAFETY: live, this thread's.
    guard(|| unsafe { Qpair::process_completions(qp, max) })
}

/// `upnvme_qpair_ring`.
fn c_ring(qp: *mut Q) -> c_int {
    // SAFETY: live, this thread's.
    guard(|| unsafe { Qpair::ring(qp) })
}

/// `upnvme_qpair_in_flight`.
fn c_in_flight(qp: *mut Q) -> u32 {
    // SAFETY: live.
    unsafe { (*qp).outstanding() }
}

/// `upnvme_read` (block `slba`, one block).
fn c_read(qp: *mut Q, buf: *mut upnvme_buf, slba: u64, arg: *mut c_void) -> c_int {
    c_submit(qp, Cmd::Read { slba, blocks: 1 }, buf, Some(record_cb), arg)
}

fn c_submit(
    qp: *mut Q,
    cmd: Cmd<'_>,
    buf: *mut upnvme_buf,
    cb: qpair::upnvme_cmd_cb,
    arg: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: live, this thread's; no reference is held across callbacks.
        let Some(q) = (unsafe { qp.as_mut() }) else {
            return fail(UPNVME_EINVAL, "the queue pair handle is NULL");
        };
        // SAFETY: `buf` null or live.
        unsafe { q.submit(1, cmd, buf, cb, arg) }
    })
}

/// `upnvme_buf_alloc`.
fn c_buf_alloc(h: *mut H, len: usize) -> *mut upnvme_buf {
    // SAFETY: live handle.
    let c = unsafe { &*h }.get().expect("open");
    let b = c.alloc_dma(len).expect("alloc_dma");
    Box::into_raw(Box::new(upnvme_buf::new(b, std::ptr::null())))
}

/// `upnvme_buf_free`.
fn c_buf_free(b: *mut upnvme_buf) -> c_int {
    guard(|| {
        // SAFETY: null or live.
        let Some(h) = (unsafe { b.as_ref() }) else {
            return UPNVME_OK;
        };
        if let Some((code, why)) = h.busy() {
            return fail(code, why);
        }
        // SAFETY: made by `Box::into_raw`, given up.
        drop(unsafe { Box::from_raw(b) });
        UPNVME_OK
    })
}

/// `upnvme_buf_data`.
fn c_buf_data(b: *mut upnvme_buf) -> *mut u8 {
    // SAFETY: live.
    unsafe { (*b).ptr }
}

fn c_buf_busy(b: *mut upnvme_buf) -> bool {
    // SAFETY: live.
    unsafe { (*b).inflight }
}

/// `upnvme_pool_put`.
fn c_pool_put(p: *mut upnvme_pool, b: *mut upnvme_buf) -> c_int {
    guard(|| {
        // SAFETY: live pool and handle.
        let p = unsafe { &mut *p };
        // SAFETY: live handle.
        let h = unsafe { &*b };
        if let Some((code, why)) = h.busy() {
            return fail(code, why);
        }
        if h.buf.is_none() {
            return fail(UPNVME_EINVAL, "kept by the driver");
        }
        // SAFETY: a handle of this pool, given up on success.
        match unsafe { p.put(b) } {
            Ok(()) => UPNVME_OK,
            Err(()) => fail(UPNVME_EINVAL, "not this pool's"),
        }
    })
}

/// `upnvme_ctrl_admin_passthru` (data copied as lib.rs does).
fn c_admin_passthru(
    h: *mut H,
    cmd: &upnvme_admin_cmd,
    data: &mut Vec<u8>,
) -> (c_int, upnvme_admin_cpl) {
    let mut cpl = upnvme_admin_cpl::default();
    // SAFETY: live handle.
    let rc = guard(|| unsafe { &*h }.admin_passthru_c(cmd, data, &mut cpl));
    (rc, cpl)
}

/// `upnvme_ctrl_format_nvm`.
fn c_format(h: *mut H, nsid: u32, f: &upnvme_format) -> c_int {
    // SAFETY: live handle.
    guard(|| match unsafe { &*h }.format_nvm(nsid, f) {
        Ok(()) => UPNVME_OK,
        Err(e) => fail_error(&e),
    })
}

/// `upnvme_ctrl_reset`.
fn c_reset(h: *mut H) -> c_int {
    // SAFETY: live handle.
    guard(|| match unsafe { &*h }.reset() {
        Ok(()) => UPNVME_OK,
        Err(e) => fail_error(&e),
    })
}

// ---------------------------------------------------------------------------
// Callbacks.
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Done {
    id: u64,
    status: c_int,
    /// `cpl->buf`.
    buf: usize,
    /// `upnvme_buf_data(cpl->buf)` is not NULL.
    data: bool,
    /// The handle still marked in flight during its callback.
    busy: bool,
}

#[derive(Default)]
struct Sink {
    done: Mutex<Vec<Done>>,
}

impl Sink {
    fn done(&self) -> Vec<Done> {
        self.done.lock().unwrap().clone()
    }
}

/// A command's `cb_arg`.
struct Arg {
    sink: Arc<Sink>,
    id: u64,
}

fn arg(sink: &Arc<Sink>, id: u64, keep: &mut Vec<Box<Arg>>) -> *mut c_void {
    let mut a = Box::new(Arg {
        sink: sink.clone(),
        id,
    });
    let p: *mut Arg = &mut *a;
    keep.push(a);
    p.cast()
}

fn record(a: &Arg, cpl: &upnvme_cpl) {
    let b = cpl.buf;
    let (data, busy) = if b.is_null() {
        (false, false)
    } else {
        (!c_buf_data(b).is_null(), c_buf_busy(b))
    };
    a.sink.done.lock().unwrap().push(Done {
        id: a.id,
        status: cpl.status,
        buf: b as usize,
        data,
        busy,
    });
}

unsafe extern "C" fn record_cb(arg: *mut c_void, cpl: *const upnvme_cpl) {
    // SAFETY: an `Arg` the test keeps alive; `cpl` valid for the call.
    let a = unsafe { &*arg.cast::<Arg>() };
    // SAFETY: valid for the call.
    let cpl = unsafe { &*cpl };
    record(a, cpl);
}

/// The next command fetched from SQ `qid` is executed, its completion held.
fn hold_next(m: &ModelController, qid: u16) {
    m.inject(Fault::DelayCompletion {
        on: Match::Queue(qid),
        doorbells: None,
    });
}

fn qid(qp: *mut Q) -> u16 {
    // SAFETY: live.
    unsafe { (*qp).qp.qid() }
}

/// Submits one-block reads with fresh 4 KiB handles, ids `ids`, each held by
/// the controller; returns each id with its handle.
fn held_reads(
    m: &ModelController,
    h: *mut H,
    qp: *mut Q,
    sink: &Arc<Sink>,
    keep: &mut Vec<Box<Arg>>,
    ids: std::ops::Range<u64>,
) -> Vec<(u64, *mut upnvme_buf)> {
    let before = m.delayed_completions();
    let n = ids.end - ids.start;
    let mut bufs = Vec::new();
    for id in ids {
        hold_next(m, qid(qp));
        let b = c_buf_alloc(h, 4096);
        let rc = c_read(qp, b, id, arg(sink, id, keep));
        assert_eq!(rc, UPNVME_OK, "{}", last_error());
        c_ring(qp);
        bufs.push((id, b));
    }
    assert_eq!(m.delayed_completions(), before + n as usize, "all held");
    bufs
}

/// Polls (bounded) until `process_completions` returns `UPNVME_ENODEV`;
/// asserts no call returned anything but a count or ENODEV.
fn poll_until_enodev(qp: *mut Q) {
    let start = Instant::now();
    loop {
        let rc = c_process(qp, 0);
        if rc == UPNVME_ENODEV {
            return;
        }
        assert!(rc >= 0, "process_completions: {rc} ({})", last_error());
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "process_completions never said ENODEV after the release"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Each id once, with ENODEV (or one of `also`), its own handle back with
/// its memory and no longer in flight.
#[track_caller]
fn assert_each_once(done: &[Done], bufs: &[(u64, *mut upnvme_buf)], also: &[c_int]) {
    let mut ids: Vec<u64> = done.iter().map(|d| d.id).collect();
    ids.sort_unstable();
    let mut want: Vec<u64> = bufs.iter().map(|b| b.0).collect();
    want.sort_unstable();
    assert_eq!(ids, want, "each command's callback exactly once: {done:?}");
    for d in done {
        assert!(
            d.status == UPNVME_ENODEV || also.contains(&d.status),
            "id {}: status {} ({done:?})",
            d.id,
            d.status
        );
        let (_, b) = bufs.iter().find(|b| b.0 == d.id).unwrap();
        assert_eq!(d.buf, *b as usize, "id {}: cpl->buf is its handle", d.id);
        assert!(
            d.data,
            "id {}: the handle came back without memory although the release stopped DMA",
            d.id
        );
        assert!(!d.busy, "id {}: still in flight inside its callback", d.id);
    }
}

#[track_caller]
fn assert_clean(m: &ModelController, trap: &Trap) {
    assert_eq!(
        trap.late(),
        Vec::<String>::new(),
        "writes that reached the controller after the release's CC.EN = 0"
    );
    assert_eq!(m.violations(), Vec::<String>::new(), "model violations");
    assert_eq!(m.dma_faults(), 0);
}

/// Every DMA buffer the test allocated is freed (bounded wait: a release
/// frees memory from its own thread).
#[track_caller]
fn assert_memory_freed(m: &ModelController) {
    wait_until("the memory to be freed", Duration::from_secs(2), || {
        m.live_dma_buffers() == 0
    });
}

/// `upnvme_ctrl_close` once the release has begun: `UPNVME_OK` or
/// `UPNVME_ENODEV`, nothing else.
#[track_caller]
fn assert_closes(h: *mut H) {
    let rc = c_close(h);
    assert!(
        rc == UPNVME_OK || rc == UPNVME_ENODEV,
        "close: {rc} ({})",
        last_error()
    );
}

/// Runs `call` (a C entry point that waits for an admin command with
/// `opcode`) on a thread of its own, holds that command's completion and
/// requests the release once the controller fetched it. Returns the call's
/// code and message, after asserting that it returned promptly (within 3 s,
/// not at its own bound).
#[track_caller]
fn admin_cut_by_release(
    m: &ModelController,
    opcode: u8,
    call: impl FnOnce() -> c_int + Send,
) -> (c_int, String) {
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode { qid: 0, opcode },
        doorbells: None,
    });
    let fetched = || {
        m.commands_seen()
            .iter()
            .filter(|c| c.0 == 0 && c.1 == opcode)
            .count()
    };
    let start = Instant::now();
    let out = std::thread::scope(|s| {
        let t = s.spawn(move || (call(), last_error()));
        wait_until("the held admin command", Duration::from_secs(3), || {
            fetched() == 1
        });
        m.request_release();
        t.join().unwrap()
    });
    let took = start.elapsed();
    assert!(took < Duration::from_secs(3), "returned after {took:?}");
    out
}

/// A controller on the trap with one pair (doorbells at once) and `reads`
/// one-block reads the controller holds, ids `0..reads`.
struct Bed {
    m: ModelController,
    trap: Trap,
    h: *mut H,
    qp: *mut Q,
    sink: Arc<Sink>,
    keep: Vec<Box<Arg>>,
    bufs: Vec<(u64, *mut upnvme_buf)>,
}

fn bed(reads: u64) -> Bed {
    let m = model();
    let trap = Trap::new(&m);
    let h = c_open(&trap);
    let qp = c_qpair_create(h, opts(false)).unwrap();
    let sink = Arc::new(Sink::default());
    let mut keep = Vec::new();
    let bufs = held_reads(&m, h, qp, &sink, &mut keep, 0..reads);
    Bed {
        m,
        trap,
        h,
        qp,
        sink,
        keep,
        bufs,
    }
}

impl Bed {
    /// After the release: the pair says ENODEV; each held read ended once
    /// (ENODEV, or one of `also`) with its handle and memory; the pair is
    /// destroyed and the handles freed.
    #[track_caller]
    fn end_reads(&self, also: &[c_int]) {
        poll_until_enodev(self.qp);
        assert_each_once(&self.sink.done(), &self.bufs, also);
        assert_eq!(c_qpair_destroy(self.qp), UPNVME_OK, "{}", last_error());
        self.free_handles();
    }

    #[track_caller]
    fn free_handles(&self) {
        for &(id, b) in &self.bufs {
            assert_eq!(c_buf_free(b), UPNVME_OK, "id {id}: {}", last_error());
        }
    }
}

// ---------------------------------------------------------------------------
// process_completions across a release.
// ---------------------------------------------------------------------------

/// A C thread polling while the release runs (held 150 ms after its CC.EN =
/// 0): its polls return 0 and run no callback meanwhile, then every
/// command in flight (plain handles and pool handles) ends once with
/// `UPNVME_ENODEV` and its handle, with memory; later polls say ENODEV,
/// destroy and close succeed, every handle is freed or put back once, no
/// memory is left, no doorbell reached the disabled controller.
#[test]
fn polling_across_a_release_ends_every_command_once_with_its_handle() {
    bounded(Duration::from_secs(10), || {
        let Bed {
            m,
            trap,
            h,
            qp,
            sink,
            mut keep,
            mut bufs,
        } = bed(3);
        // Two pool handles, one held and one completed but not yet reaped.
        let pool = {
            // SAFETY: live handle.
            let c = unsafe { &*h }.get().unwrap();
            Box::into_raw(upnvme_pool::new(c.dma_pool(4096, 2).unwrap()))
        };
        // SAFETY: live pool.
        let p1 = unsafe { (*pool).get() }.unwrap();
        // SAFETY: live pool.
        let p2 = unsafe { (*pool).get() }.unwrap();
        hold_next(&m, qid(qp));
        assert_eq!(c_read(qp, p1, 10, arg(&sink, 10, &mut keep)), UPNVME_OK);
        assert_eq!(c_read(qp, p2, 11, arg(&sink, 11, &mut keep)), UPNVME_OK);
        bufs.push((10, p1));
        bufs.push((11, p2));
        assert_eq!(c_in_flight(qp), 5);

        trap.hold_release();
        trap.request_and_wait_for_disable();
        for _ in 0..200 {
            let rc = c_process(qp, 0);
            assert_eq!(rc, 0, "a poll during the release: {rc} ({})", last_error());
        }
        assert!(sink.done().is_empty(), "a callback ran during the release");
        let g = trap.go_after(Duration::from_millis(150));
        poll_until_enodev(qp);
        g.join().unwrap();
        assert!(m.is_released());
        // The command whose completion was posted before the release may
        // report either.
        let done = sink.done();
        assert_each_once(&done, &bufs, &[]);
        assert_eq!(c_in_flight(qp), 0);
        // Once more: nothing is delivered twice.
        for _ in 0..50 {
            assert_eq!(c_process(qp, 0), UPNVME_ENODEV);
        }
        assert_eq!(sink.done().len(), 5);
        // A submission afterwards: refused, the handle stays the caller's.
        let (_, b0) = bufs[0];
        assert_eq!(c_read(qp, b0, 0, arg(&sink, 99, &mut keep)), UPNVME_ENODEV);
        assert!(!c_buf_data(b0).is_null() && !c_buf_busy(b0));
        assert_eq!(c_qpair_destroy(qp), UPNVME_OK, "{}", last_error());
        for &(id, b) in &bufs {
            let rc = if id >= 10 {
                c_pool_put(pool, b)
            } else {
                c_buf_free(b)
            };
            assert_eq!(rc, UPNVME_OK, "id {id}: {}", last_error());
        }
        assert_closes(h);
        // SAFETY: made by `Box::into_raw`.
        drop(unsafe { Box::from_raw(pool) });
        assert_eq!(sink.done().len(), 5);
        assert_clean(&m, &trap);
        assert_memory_freed(&m);
    });
}

// ---------------------------------------------------------------------------
// Submissions inside the release's window.
// ---------------------------------------------------------------------------

/// Submissions from two C threads while the release is held after its
/// CC.EN = 0: a read on a plain pair, a queued read, a Flush and a Write
/// Zeroes on a pair that delays its doorbell (then `upnvme_qpair_ring`).
/// Each waits for the release's end and is refused with `UPNVME_ENODEV`;
/// the read handles stay the caller's with their memory; no callback runs;
/// no doorbell reaches the disabled controller.
#[test]
fn submissions_during_the_release_are_refused_with_enodev_and_keep_their_handles() {
    bounded(Duration::from_secs(10), || {
        let m = model();
        let trap = Trap::new(&m);
        let h = c_open(&trap);
        let qa = SendPtr(c_qpair_create(h, opts(false)).unwrap());
        let qb = SendPtr(c_qpair_create(h, opts(true)).unwrap());
        let sink = Arc::new(Sink::default());
        let ba = SendPtr(c_buf_alloc(h, 4096));
        let bb = SendPtr(c_buf_alloc(h, 4096));
        let sa = sink.clone();
        let sb = sink.clone();
        trap.hold_release();
        trap.request_and_wait_for_disable();
        let g = trap.go_after(Duration::from_millis(150));
        let start = Instant::now();
        let (ra, rb) = std::thread::scope(|s| {
            let ta = s.spawn(move || {
                let (qa, ba) = (qa, ba);
                let mut keep = Vec::new();
                let rc = c_read(qa.0, ba.0, 0, arg(&sa, 0, &mut keep));
                (rc, last_error())
            });
            let tb = s.spawn(move || {
                let (qb, bb) = (qb, bb);
                let mut keep = Vec::new();
                let r1 = c_read(qb.0, bb.0, 1, arg(&sb, 1, &mut keep));
                let r2 = c_submit(
                    qb.0,
                    Cmd::Flush,
                    std::ptr::null_mut(),
                    Some(record_cb),
                    arg(&sb, 2, &mut keep),
                );
                let r3 = c_submit(
                    qb.0,
                    Cmd::WriteZeroes {
                        slba: 0,
                        blocks: 1,
                        deallocate: false,
                    },
                    std::ptr::null_mut(),
                    Some(record_cb),
                    arg(&sb, 3, &mut keep),
                );
                let r4 = c_ring(qb.0);
                (vec![r1, r2, r3, r4], last_error())
            });
            (ta.join().unwrap(), tb.join().unwrap())
        });
        g.join().unwrap();
        let waited = start.elapsed();
        assert_eq!(ra.0, UPNVME_ENODEV, "read during the release: {}", ra.1);
        assert_eq!(
            rb.0,
            vec![UPNVME_ENODEV, UPNVME_ENODEV, UPNVME_ENODEV, UPNVME_OK],
            "queued read, flush, write zeroes, ring during the release: {}",
            rb.1
        );
        assert!(
            waited >= Duration::from_millis(100),
            "refused before the release ended ({waited:?})"
        );
        for b in [ba.0, bb.0] {
            assert!(!c_buf_busy(b), "a refused command's handle is in flight");
            assert!(
                !c_buf_data(b).is_null(),
                "a refused command's handle lost its memory"
            );
        }
        for q in [qa.0, qb.0] {
            assert_eq!(c_in_flight(q), 0);
            assert_eq!(c_process(q, 0), UPNVME_ENODEV);
            assert_eq!(c_qpair_destroy(q), UPNVME_OK);
        }
        assert!(
            sink.done().is_empty(),
            "a refused command's callback ran: {:?}",
            sink.done()
        );
        assert_eq!(c_buf_free(ba.0), UPNVME_OK);
        assert_eq!(c_buf_free(bb.0), UPNVME_OK);
        assert_closes(h);
        assert_clean(&m, &trap);
        assert_memory_freed(&m);
    });
}

// ---------------------------------------------------------------------------
// A callback that submits (and reaps) across the release.
// ---------------------------------------------------------------------------

struct Loop {
    qp: *mut Q,
    trap: Trap,
    sink: Arc<Sink>,
    /// Return codes of the callbacks' resubmissions, by id.
    resubmits: Mutex<Vec<(u64, c_int)>>,
    /// The nested `process_completions` from the first callback.
    nested: Mutex<Vec<c_int>>,
    /// Handles freed from inside their callback, by id.
    freed: Mutex<Vec<(u64, c_int)>>,
}

struct LoopArg {
    l: *const Loop,
    id: u64,
}

/// Id 0 (completed before the release): starts the release, holds it after
/// its CC.EN = 0 for 100 ms, resubmits its own handle meanwhile (waits for
/// the release, refused), then reaps from inside the callback. Every other
/// id (ended by the release): resubmits its handle (refused at once), then
/// frees it inside the callback.
unsafe extern "C" fn loop_cb(arg: *mut c_void, cpl: *const upnvme_cpl) {
    // SAFETY: a `LoopArg` the test keeps alive; `cpl` valid for the call.
    let a = unsafe { &*arg.cast::<LoopArg>() };
    // SAFETY: valid for the call.
    let cpl = unsafe { &*cpl };
    // SAFETY: the test's `Loop`, alive for the whole test.
    let l = unsafe { &*a.l };
    record(
        &Arg {
            sink: l.sink.clone(),
            id: a.id,
        },
        cpl,
    );
    if a.id == 0 && cpl.status == UPNVME_OK {
        l.trap.hold_release();
        l.trap.request_and_wait_for_disable();
        let g = l.trap.go_after(Duration::from_millis(100));
        let start = Instant::now();
        let during = c_submit(
            l.qp,
            Cmd::Read { slba: 6, blocks: 1 },
            cpl.buf,
            Some(loop_cb),
            arg,
        );
        let waited = start.elapsed();
        g.join().unwrap();
        l.resubmits.lock().unwrap().push((0, during));
        assert!(
            during != UPNVME_ENODEV || waited >= Duration::from_millis(80),
            "refused before the release ended ({waited:?})"
        );
        let n = c_process(l.qp, 0);
        l.nested.lock().unwrap().push(n);
    } else {
        let again = c_submit(
            l.qp,
            Cmd::Read { slba: 5, blocks: 1 },
            cpl.buf,
            Some(loop_cb),
            arg,
        );
        l.resubmits.lock().unwrap().push((a.id, again));
        if again != UPNVME_OK {
            let rc = c_buf_free(cpl.buf);
            l.freed.lock().unwrap().push((a.id, rc));
        }
    }
}

fn callback_loop(delay_doorbell: bool) {
    let m = model();
    let trap = Trap::new(&m);
    let h = c_open(&trap);
    let qp = c_qpair_create(h, opts(delay_doorbell)).unwrap();
    let sink = Arc::new(Sink::default());
    let l = Box::new(Loop {
        qp,
        trap: trap.clone(),
        sink: sink.clone(),
        resubmits: Mutex::default(),
        nested: Mutex::default(),
        freed: Mutex::default(),
    });
    let mut args = Vec::new();
    let mut bufs = Vec::new();
    // Ids 1 and 2 are held by the controller; id 0 completes at once.
    for id in [1u64, 2, 0] {
        if id != 0 {
            hold_next(&m, qid(qp));
        }
        let b = c_buf_alloc(h, 4096);
        let mut a = Box::new(LoopArg { l: &*l, id });
        let p: *mut LoopArg = &mut *a;
        args.push(a);
        assert_eq!(
            c_submit(
                qp,
                Cmd::Read {
                    slba: id,
                    blocks: 1
                },
                b,
                Some(loop_cb),
                p.cast()
            ),
            UPNVME_OK,
            "{}",
            last_error()
        );
        assert_eq!(c_ring(qp), UPNVME_OK);
        bufs.push((id, b));
    }
    wait_until("the held reads", Duration::from_secs(2), || {
        m.delayed_completions() == 2
    });
    // One call: id 0's callback runs, and inside it the release, a
    // submission during it and a nested reap (ids 1 and 2's callbacks).
    let first = c_process(qp, 0);
    assert!(
        first >= 1,
        "process_completions: {first} ({})",
        last_error()
    );
    poll_until_enodev(qp);
    let done = sink.done();
    let mut ids: Vec<u64> = done.iter().map(|d| d.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![0, 1, 2], "each callback once: {done:?}");
    for d in &done {
        let want = if d.id == 0 { UPNVME_OK } else { UPNVME_ENODEV };
        assert_eq!(d.status, want, "{done:?}");
        assert!(d.data && !d.busy, "{d:?}");
    }
    let resubmits = l.resubmits.lock().unwrap().clone();
    let mut r = resubmits.clone();
    r.sort_unstable();
    assert_eq!(
        r,
        vec![(0, UPNVME_ENODEV), (1, UPNVME_ENODEV), (2, UPNVME_ENODEV)],
        "submissions from the callbacks during and after the release"
    );
    let (_, b0) = bufs[2];
    assert!(
        !c_buf_busy(b0) && !c_buf_data(b0).is_null(),
        "id 0's handle after its refusal"
    );
    let mut freed = l.freed.lock().unwrap().clone();
    freed.sort_unstable();
    assert_eq!(
        freed,
        vec![(1, UPNVME_OK), (2, UPNVME_OK)],
        "handles freed in their callbacks"
    );
    assert_eq!(l.nested.lock().unwrap().clone(), vec![2], "the nested reap");
    assert_eq!(c_in_flight(qp), 0);
    assert_eq!(c_qpair_destroy(qp), UPNVME_OK, "{}", last_error());
    assert_eq!(c_buf_free(b0), UPNVME_OK, "{}", last_error());
    assert_closes(h);
    assert_eq!(sink.done().len(), 3, "a callback after the end");
    drop(args);
    drop(l);
    assert_clean(&m, &trap);
    assert_memory_freed(&m);
}

/// docs/capi.md: callbacks may submit on the pair. A callback that runs
/// before the release (a success) starts it, submits while the release is
/// held after its CC.EN = 0 (waits, `UPNVME_ENODEV`, its handle back), and
/// reaps from inside the callback; the callbacks of the commands the
/// release ended resubmit (`UPNVME_ENODEV`) and free their handles inside
/// the callback. Each command ends once; no doorbell after the disable.
#[test]
fn a_callback_that_submits_and_reaps_across_the_release() {
    bounded(Duration::from_secs(10), || callback_loop(false));
}

/// The same on a pair that delays its doorbell (the reap's end rings what
/// the callbacks queued).
#[test]
fn a_callback_that_submits_and_reaps_across_the_release_delayed_doorbell() {
    bounded(Duration::from_secs(10), || callback_loop(true));
}

// ---------------------------------------------------------------------------
// Admin passthrough.
// ---------------------------------------------------------------------------

fn identify_cmd(timeout_ms: u32) -> upnvme_admin_cmd {
    upnvme_admin_cmd {
        opcode: OP_IDENTIFY,
        cdw10: 0x01,
        timeout_ms,
        ..Default::default()
    }
}

/// An admin passthrough waiting for a held Identify when the kernel's
/// request comes: returns `UPNVME_ENODEV` promptly (not at its 4 s bound),
/// `cpl` zero, the caller's data untouched; the next passthrough and
/// `upnvme_qpair_create` say ENODEV at once.
#[test]
fn an_admin_passthru_waiting_at_a_release_returns_enodev_promptly() {
    bounded(Duration::from_secs(10), || {
        let m = model();
        let trap = Trap::new(&m);
        let h = SendPtr(c_open(&trap));
        m.inject(Fault::DelayCompletion {
            on: Match::Identify { cns: 1, nsid: 0 },
            doorbells: None,
        });
        let start = Instant::now();
        let (rc, cpl, data, msg) = std::thread::scope(|s| {
            let t = s.spawn(move || {
                let h = h;
                let mut data = vec![0x5au8; 4096];
                let (rc, cpl) = c_admin_passthru(h.0, &identify_cmd(4000), &mut data);
                (rc, cpl, data, last_error())
            });
            wait_until("the held Identify", Duration::from_secs(2), || {
                m.delayed_completions() == 1
            });
            m.request_release();
            t.join().unwrap()
        });
        let took = start.elapsed();
        assert_eq!(rc, UPNVME_ENODEV, "{msg}");
        assert!(took < Duration::from_secs(2), "took {took:?}");
        assert_eq!((cpl.dw0, cpl.dw1, cpl.sct, cpl.sc), (0, 0, 0, 0));
        assert!(data.iter().all(|&b| b == 0x5a), "data written on failure");
        let (rc, _) = c_admin_passthru(h.0, &identify_cmd(0), &mut vec![0; 4096]);
        assert_eq!(rc, UPNVME_ENODEV, "{}", last_error());
        assert_eq!(c_qpair_create(h.0, opts(false)).err(), Some(UPNVME_ENODEV));
        assert_closes(h.0);
        assert_clean(&m, &trap);
    });
}

/// An admin passthrough whose completion the controller posted right
/// before the release's CC.EN = 0 (the release is requested from the
/// command's own SQ tail doorbell write, and held after its disable): the
/// waiter's next look reaps the completion. The command did complete, so
/// `UPNVME_OK` (or ENODEV) is fine — but the reap's admin CQ head doorbell
/// must not reach the controller the release disabled.
#[test]
fn an_admin_completion_reaped_after_the_releases_disable_rings_no_doorbell() {
    bounded(Duration::from_secs(10), || {
        let m = model();
        let trap = Trap::new(&m);
        let h = SendPtr(c_open(&trap));
        {
            let trap2 = trap.clone();
            trap.arm_after_write(
                |o, _| o == ADMIN_SQ_DB && thread_name() == "passthru",
                move || {
                    // The Identify has been executed and its completion
                    // posted; the waiter has not looked yet.
                    trap2.hold_release();
                    trap2.request_and_wait_for_disable();
                    let _ = trap2.go_after(Duration::from_millis(150));
                },
            );
        }
        let (rc, msg) = std::thread::Builder::new()
            .name("passthru".into())
            .spawn(move || {
                let h = h;
                let mut data = vec![0u8; 4096];
                let (rc, _) = c_admin_passthru(h.0, &identify_cmd(3000), &mut data);
                (rc, last_error())
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(trap.disabled_by_release(), "the trap never fired");
        wait_until("the release", Duration::from_secs(3), || m.is_released());
        assert!(
            rc == UPNVME_OK || rc == UPNVME_ENODEV,
            "passthru: {rc} ({msg})"
        );
        let late = trap.late();
        assert_closes(h.0);
        assert_eq!(
            late,
            Vec::<String>::new(),
            "a doorbell reached the controller after the release's CC.EN = 0 \
             (admin CQ head doorbell is {ADMIN_CQ_DB:#x})"
        );
        assert_eq!(m.violations(), Vec::<String>::new());
    });
}

// ---------------------------------------------------------------------------
// Format NVM.
// ---------------------------------------------------------------------------

/// `upnvme_ctrl_format_nvm` with a queue pair (so it resets the controller
/// first) waiting for its held Format NVM when the kernel's request comes:
/// ENODEV promptly; the pair's commands end once (ECANCELED from the
/// format's reset, or ENODEV) with their handles; afterwards, as
/// docs/capi.md says ("later calls fail with it"), a submission on the
/// pair is refused with `UPNVME_ENODEV`.
#[test]
fn a_format_cut_by_a_release_returns_enodev_and_later_calls_say_enodev() {
    bounded(Duration::from_secs(10), || {
        let mut b = bed(2);
        let h = SendPtr(b.h);
        let (rc, msg) = admin_cut_by_release(&b.m, OP_FORMAT_NVM, move || {
            let h = h;
            let f = upnvme_format {
                timeout_ms: 4000,
                ..Default::default()
            };
            c_format(h.0, 1, &f)
        });
        assert_eq!(rc, UPNVME_ENODEV, "format cut by the release: {msg}");
        poll_until_enodev(b.qp);
        assert_each_once(&b.sink.done(), &b.bufs, &[UPNVME_ECANCELED]);
        let (_, b0) = b.bufs[0];
        let rc = c_read(b.qp, b0, 0, arg(&b.sink, 50, &mut b.keep));
        let msg = last_error();
        assert!(!c_buf_busy(b0) && !c_buf_data(b0).is_null());
        assert_eq!(c_qpair_destroy(b.qp), UPNVME_OK);
        b.free_handles();
        let _ = c_close(b.h);
        assert_clean(&b.m, &b.trap);
        assert_eq!(
            rc, UPNVME_ENODEV,
            "a submission after a format cut by the release: {msg}"
        );
    });
}

// ---------------------------------------------------------------------------
// Controller reset.
// ---------------------------------------------------------------------------

/// `upnvme_ctrl_reset` called while the release is under way (held after
/// its CC.EN = 0): it returns `UPNVME_ENODEV` (header: "removed"), promptly;
/// the pair's commands end once with their handles — and the reset does not
/// enable the controller the release just disabled again, nor ring its
/// doorbells (the release's purpose is to stop the device).
#[test]
fn a_reset_during_the_release_does_not_bring_the_controller_back() {
    bounded(Duration::from_secs(10), || {
        let b = bed(2);
        b.trap.hold_release();
        b.trap.request_and_wait_for_disable();
        // Let go at the latest after 2 s, should the reset wait for the
        // release; normally right after the reset returns.
        let g = b.trap.go_after(Duration::from_secs(2));
        let start = Instant::now();
        let rc = c_reset(b.h);
        let msg = last_error();
        let took = start.elapsed();
        b.trap.go();
        let t = Instant::now();
        wait_until("the release", Duration::from_secs(3), || b.m.is_released());
        let release_took = t.elapsed();
        g.join().unwrap();
        b.end_reads(&[UPNVME_ECANCELED]);
        let _ = c_close(b.h);
        assert_eq!(rc, UPNVME_ENODEV, "reset during the release: {msg}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        let late = b.trap.late();
        assert!(
            late.is_empty(),
            "the reset (returned {rc} after {took:?}) wrote to the controller the release \
             had disabled; the release, let go then, took {release_took:?} more: {late:?}"
        );
        assert_clean(&b.m, &b.trap);
    });
}

/// The release arrives while `upnvme_ctrl_reset` waits for its Delete I/O
/// SQ: the reset returns `UPNVME_ENODEV` promptly and the pair's commands
/// end once with their handles.
#[test]
fn a_release_during_a_resets_queue_deletion_returns_enodev() {
    bounded(Duration::from_secs(10), || {
        let b = bed(2);
        let h = SendPtr(b.h);
        let (rc, msg) = admin_cut_by_release(&b.m, OP_DELETE_IO_SQ, move || {
            let h = h;
            c_reset(h.0)
        });
        assert_eq!(rc, UPNVME_ENODEV, "{msg}");
        b.end_reads(&[UPNVME_ECANCELED]);
        let _ = c_close(b.h);
        assert_clean(&b.m, &b.trap);
    });
}

// ---------------------------------------------------------------------------
// Destroy and close.
// ---------------------------------------------------------------------------

/// `upnvme_qpair_destroy` while the release is held after its CC.EN = 0:
/// `UPNVME_EBUSY` (the commands will end; no callback runs yet, nothing is
/// freed); retried after the release it runs each callback once with
/// `UPNVME_ENODEV` and the handle with its memory, and deletes the pair.
#[test]
fn destroy_during_the_release_is_busy_then_ends_each_command_once() {
    bounded(Duration::from_secs(10), || {
        let b = bed(3);
        b.trap.hold_release();
        b.trap.request_and_wait_for_disable();
        for _ in 0..20 {
            assert_eq!(c_qpair_destroy(b.qp), UPNVME_EBUSY, "{}", last_error());
        }
        assert!(b.sink.done().is_empty());
        assert_eq!(c_in_flight(b.qp), 3);
        b.trap.go();
        let start = Instant::now();
        loop {
            let rc = c_qpair_destroy(b.qp);
            if rc == UPNVME_OK {
                break;
            }
            assert_eq!(rc, UPNVME_EBUSY, "{}", last_error());
            assert!(
                start.elapsed() < Duration::from_secs(3),
                "destroy stays busy"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_each_once(&b.sink.done(), &b.bufs, &[]);
        b.free_handles();
        assert_closes(b.h);
        assert_clean(&b.m, &b.trap);
        assert_memory_freed(&b.m);
    });
}

/// `upnvme_ctrl_close` while the release is held after its CC.EN = 0, with
/// a pair outliving the close: the close returns promptly (OK or ENODEV);
/// the pair's commands end once with ENODEV and their handles; no doorbell
/// reaches the controller.
#[test]
fn close_during_the_release_ends_the_pairs_commands_once() {
    bounded(Duration::from_secs(10), || {
        let b = bed(3);
        b.trap.hold_release();
        b.trap.request_and_wait_for_disable();
        let g = b.trap.go_after(Duration::from_millis(150));
        let start = Instant::now();
        assert_closes(b.h);
        assert!(start.elapsed() < Duration::from_secs(3));
        g.join().unwrap();
        b.end_reads(&[]);
        assert_clean(&b.m, &b.trap);
        assert_memory_freed(&b.m);
    });
}

/// `upnvme_ctrl_close` cut by the release right at its shutdown
/// notification (CC.SHN): the close returns promptly (OK or ENODEV), the
/// pair outliving it ends its commands once with their handles.
#[test]
fn close_cut_by_a_release_at_its_shutdown_notification() {
    bounded(Duration::from_secs(10), || {
        let b = bed(2);
        {
            let m2 = b.m.clone();
            b.trap.arm_after_write(
                |o, v| o == CC && (v >> 14) & 3 != 0 && !on_release_thread(),
                move || {
                    m2.request_release();
                    wait_until("the release", Duration::from_secs(3), || m2.is_released());
                    std::thread::sleep(Duration::from_millis(30));
                },
            );
        }
        let start = Instant::now();
        assert_closes(b.h);
        assert!(start.elapsed() < Duration::from_secs(4));
        assert!(b.m.is_released(), "the trap never fired");
        // The shutdown deleted the pair's SQ first (its held reads may end
        // as "aborted due to SQ deletion", UPNVME_ECANCELED).
        b.end_reads(&[UPNVME_ECANCELED]);
        assert_clean(&b.m, &b.trap);
        assert_memory_freed(&b.m);
    });
}

/// A release that cannot be confirmed (the controller ignores CC.EN = 0
/// and the device cannot be released): nothing the device may still write
/// comes back. `process_completions` says ENODEV and runs no callback;
/// destroy ends each command once with ENODEV and a handle without memory
/// (`upnvme_buf_data` NULL), which frees once; no callback comes later.
#[test]
fn an_unconfirmed_release_hands_back_handles_without_memory_once() {
    bounded(Duration::from_secs(10), || {
        // The bed (and with it the callbacks' arguments) lives to the end.
        let b = bed(2);
        let (m, trap, sink) = (b.m.clone(), b.trap.clone(), b.sink.clone());
        let (h, qp, bufs) = (b.h, b.qp, b.bufs.clone());
        trap.st.stubborn.store(true, Ordering::SeqCst);
        m.request_release();
        let start = Instant::now();
        loop {
            let rc = c_process(qp, 0);
            if rc == UPNVME_ENODEV {
                break;
            }
            assert_eq!(rc, 0, "{}", last_error());
            assert!(start.elapsed() < Duration::from_secs(3), "never ENODEV");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(sink.done().is_empty(), "{:?}", sink.done());
        assert_eq!(c_qpair_destroy(qp), UPNVME_OK, "{}", last_error());
        let done = sink.done();
        let mut ids: Vec<u64> = done.iter().map(|d| d.id).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![0, 1], "{done:?}");
        for d in &done {
            assert_eq!(d.status, UPNVME_ENODEV);
            assert!(!d.data && !d.busy, "{d:?}");
        }
        for (_, b) in bufs {
            assert!(c_buf_data(b).is_null());
            assert_eq!(c_buf_free(b), UPNVME_OK);
        }
        let _ = c_close(h);
        assert_eq!(sink.done().len(), 2);
    });
}

// ---------------------------------------------------------------------------
// Queued commands (delay_doorbell) and the release.
// ---------------------------------------------------------------------------

struct Batch {
    qp: *mut Q,
    trap: Trap,
    sink: Arc<Sink>,
    resubmits: Mutex<Vec<(u64, c_int)>>,
    /// Every `BatchArg` made (freed at the end of the test).
    args: Mutex<Vec<usize>>,
}

struct BatchArg {
    b: *const Batch,
    id: u64,
}

/// Id 1: queues its handle again as id 11 (no doorbell yet: the pair delays
/// it to the end of the reap). Id 2: starts the release and leaves it held
/// after its CC.EN = 0. Id 11: records.
unsafe extern "C" fn batch_cb(arg: *mut c_void, cpl: *const upnvme_cpl) {
    // SAFETY: a `BatchArg` the test keeps alive; `cpl` valid for the call.
    let a = unsafe { &*arg.cast::<BatchArg>() };
    // SAFETY: valid for the call.
    let cpl = unsafe { &*cpl };
    // SAFETY: the test's `Batch`, alive for the whole test.
    let b = unsafe { &*a.b };
    record(
        &Arg {
            sink: b.sink.clone(),
            id: a.id,
        },
        cpl,
    );
    match a.id {
        1 => {
            let again = Box::into_raw(Box::new(BatchArg { b: a.b, id: 11 }));
            b.args.lock().unwrap().push(again as usize);
            let rc = c_submit(
                b.qp,
                Cmd::Read {
                    slba: 11,
                    blocks: 1,
                },
                cpl.buf,
                Some(batch_cb),
                again.cast(),
            );
            b.resubmits.lock().unwrap().push((11, rc));
        }
        2 => {
            b.trap.hold_release();
            b.trap.request_and_wait_for_disable();
        }
        _ => {}
    }
}

/// A pair with `delay_doorbell`: a callback queues a command (announced at
/// the reap's end), the next callback of the same batch starts the release
/// (held after its CC.EN = 0). The reap's closing ring, and an explicit
/// `upnvme_qpair_ring` during the window, write no doorbell; after the
/// release the queued command's callback runs once with `UPNVME_ENODEV` and
/// its handle, with memory.
#[test]
fn queued_commands_are_not_announced_into_the_release() {
    bounded(Duration::from_secs(10), || {
        let m = model();
        let trap = Trap::new(&m);
        let h = c_open(&trap);
        let qp = c_qpair_create(h, opts(true)).unwrap();
        let sink = Arc::new(Sink::default());
        let batch = Box::new(Batch {
            qp,
            trap: trap.clone(),
            sink: sink.clone(),
            resubmits: Mutex::default(),
            args: Mutex::default(),
        });
        let mut bufs = Vec::new();
        for id in [1u64, 2] {
            let b = c_buf_alloc(h, 4096);
            let a = Box::into_raw(Box::new(BatchArg { b: &*batch, id }));
            batch.args.lock().unwrap().push(a as usize);
            assert_eq!(
                c_submit(
                    qp,
                    Cmd::Read {
                        slba: id,
                        blocks: 1
                    },
                    b,
                    Some(batch_cb),
                    a.cast()
                ),
                UPNVME_OK
            );
            bufs.push((id, b));
        }
        assert_eq!(c_ring(qp), UPNVME_OK);
        let n = c_process(qp, 0);
        assert_eq!(n, 2, "{}", last_error());
        assert!(trap.disabled_by_release());
        assert_eq!(
            batch.resubmits.lock().unwrap().clone(),
            vec![(11, UPNVME_OK)]
        );
        // Inside the window: the explicit ring and polls announce nothing.
        assert_eq!(c_ring(qp), UPNVME_OK);
        for _ in 0..50 {
            assert_eq!(c_process(qp, 0), 0);
        }
        assert_eq!(
            trap.late(),
            Vec::<String>::new(),
            "a doorbell in the window"
        );
        trap.go();
        poll_until_enodev(qp);
        let done = sink.done();
        let mut ids: Vec<u64> = done.iter().map(|d| d.id).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![1, 2, 11], "{done:?}");
        let d11 = done.iter().find(|d| d.id == 11).unwrap();
        assert_eq!(d11.status, UPNVME_ENODEV);
        assert_eq!(d11.buf, bufs[0].1 as usize);
        assert!(d11.data && !d11.busy, "{d11:?}");
        assert_eq!(c_qpair_destroy(qp), UPNVME_OK);
        for (_, b) in &bufs {
            assert_eq!(c_buf_free(*b), UPNVME_OK);
        }
        let _ = c_close(h);
        for a in batch.args.lock().unwrap().drain(..) {
            // SAFETY: made by `Box::into_raw` above; no callback runs any more.
            drop(unsafe { Box::from_raw(a as *mut BatchArg) });
        }
        drop(batch);
        assert_clean(&m, &trap);
        assert_memory_freed(&m);
    });
}

/// An admin passthrough that started before the request and whose bound
/// runs out while the release holds the controller disabled is named as the
/// removal (ENODEV), not a timeout that marks the controller failed and
/// advises a reset (it said ETIMEDOUT with that advice before). Nothing is
/// marked failed inside the window: the pair's poll stays quiet, and the
/// release's end delivers each command once, ENODEV, with its memory (DMA
/// stopped); the handles free once and no memory is left once everything
/// is closed.
#[test]
fn an_admin_timeout_inside_the_release_window_is_named_as_the_removal() {
    bounded(Duration::from_secs(10), || {
        // The bed (and with it the callbacks' arguments) lives to the end.
        let b = bed(2);
        let (m, trap, sink) = (b.m.clone(), b.trap.clone(), b.sink.clone());
        let (h, qp, bufs) = (b.h, b.qp, b.bufs.clone());
        let h = SendPtr(h);
        m.inject(Fault::DelayCompletion {
            on: Match::Identify { cns: 1, nsid: 0 },
            doorbells: None,
        });
        let (rc, msg) = std::thread::scope(|s| {
            let t = s.spawn(move || {
                let h = h;
                let mut data = vec![0u8; 4096];
                let (rc, _) = c_admin_passthru(h.0, &identify_cmd(300), &mut data);
                (rc, last_error())
            });
            wait_until("the held Identify", Duration::from_secs(2), || {
                m.delayed_completions() == 3
            });
            trap.hold_release();
            trap.request_and_wait_for_disable();
            t.join().unwrap()
        });
        assert_eq!(rc, UPNVME_ENODEV, "passthru: {rc} ({msg})");
        // Nothing marked failed: the window's poll delivers nothing.
        assert_eq!(c_process(qp, 0), 0, "{}", last_error());
        assert!(sink.done().is_empty());
        trap.go();
        wait_until("the release", Duration::from_secs(3), || m.is_released());
        let start = Instant::now();
        while sink.done().len() < 2 && start.elapsed() < Duration::from_secs(3) {
            let _ = c_process(qp, 0);
        }
        std::thread::sleep(Duration::from_millis(50));
        let _ = c_process(qp, 0);
        let done = sink.done();
        let mut ids: Vec<u64> = done.iter().map(|d| d.id).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![0, 1], "each callback once: {done:?}");
        for d in &done {
            assert_eq!(d.status, UPNVME_ENODEV);
            assert!(d.data && !d.busy, "{d:?}");
            assert_eq!(d.buf, bufs[d.id as usize].1 as usize);
        }
        assert_eq!(c_qpair_destroy(qp), UPNVME_OK, "{}", last_error());
        for (_, b) in bufs {
            assert_eq!(c_buf_free(b), UPNVME_OK);
        }
        let _ = c_close(h.0);
        assert_clean(&m, &trap);
        assert_memory_freed(&m);
    });
}

/// `upnvme_ctrl_close` whose first queue deletion (Delete I/O SQ, before its
/// shutdown notification) the controller completes right before the
/// release's CC.EN = 0 (the release is requested from that command's SQ tail
/// doorbell write and held after its disable): the close returns promptly
/// (OK or ENODEV) — and, as for every other path, writes no doorbell into
/// the controller the release disabled (neither the reap's admin CQ head nor
/// the next deletion's SQ tail).
#[test]
fn a_close_whose_queue_deletion_meets_the_release_rings_no_doorbell() {
    bounded(Duration::from_secs(10), || {
        let m = model();
        let trap = Trap::new(&m);
        let h = SendPtr(c_open(&trap));
        let qp = c_qpair_create(h.0, opts(false)).unwrap();
        {
            let trap2 = trap.clone();
            trap.arm_after_write(
                |o, _| o == ADMIN_SQ_DB && thread_name() == "closer",
                move || {
                    trap2.hold_release();
                    trap2.request_and_wait_for_disable();
                    let _ = trap2.go_after(Duration::from_millis(150));
                },
            );
        }
        let start = Instant::now();
        let (rc, msg) = std::thread::Builder::new()
            .name("closer".into())
            .spawn(move || {
                let h = h;
                (c_close(h.0), last_error())
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "{:?}",
            start.elapsed()
        );
        assert!(trap.disabled_by_release(), "the trap never fired");
        assert!(
            rc == UPNVME_OK || rc == UPNVME_ENODEV,
            "close: {rc} ({msg})"
        );
        wait_until("the release", Duration::from_secs(3), || m.is_released());
        let late = trap.late();
        assert_eq!(c_process(qp, 0), UPNVME_ENODEV);
        assert_eq!(c_qpair_destroy(qp), UPNVME_OK);
        assert_eq!(
            late,
            Vec::<String>::new(),
            "writes that reached the controller after the release's CC.EN = 0"
        );
        assert_eq!(m.violations(), Vec::<String>::new());
    });
}
