//! Release on the kernel's request and removal while the application works
//! (from a review; four of these failed before the release's `STATE_RELEASING`
//! bit and the release-aware waits): a release
//! requested while another thread is inside a blocking helper, a poll's
//! timeout scan, a reset or a close; removal (all-ones registers) at every
//! step of bring-up and of queue creation; a callback that submits after
//! the device is gone; drop orders of pair, controller and buffers; handles
//! that outlive their controller.
//!
//! Every wait here is bounded: a hang fails the test instead of blocking.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Front, Hooks, Unstoppable, admin_op, config_one_ns, io_op, open, opts, reg};
use upnvme::{Controller, ControllerOptions, Error, IoError, QueuePairOptions, Reject};
use upnvme_tests::{Fault, Match, ModelController};

// ---------------------------------------------------------------------------
// A device in front of the model that can run an action at one exact
// register access (before or after it reaches the model), and whose
// `release` can take as long as VFIO's (closing the device file makes
// vfio-pci reset the function before `close` returns).
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Acc {
    W32(usize, u32),
    W64(usize, u64),
}

type Pred = Box<dyn Fn(Acc) -> bool + Send + Sync>;
type Action = Box<dyn FnOnce() + Send>;

struct Armed {
    pred: Pred,
    action: Action,
    after: bool,
}

#[derive(Clone)]
struct Trap {
    model: ModelController,
    armed: Arc<Mutex<Option<Armed>>>,
    release_delay: Arc<Mutex<Duration>>,
    /// MMIO writes to the doorbell area (from 1000h), whatever the model
    /// does with them (a released model ignores, and does not count, them).
    doorbells: Arc<AtomicU32>,
    /// Holds `Device::release` before it reaches the model (see
    /// [`Gate`]).
    gate: Arc<Gate>,
    /// Set: `Device::release` refuses (returns false, the model keeps
    /// running): a device that cannot be released.
    refuse_release: Arc<AtomicBool>,
}

/// With `hold` set, `Device::release` sets `entered` and waits (at most
/// 3 s) for `go` before the model is released: the window in which the
/// driver has decided to let the device go and the device still runs.
#[derive(Default)]
struct Gate {
    hold: AtomicBool,
    entered: AtomicBool,
    go: AtomicBool,
}

impl Trap {
    fn new(model: &ModelController) -> Trap {
        Trap {
            model: model.clone(),
            armed: Arc::default(),
            release_delay: Arc::default(),
            doorbells: Arc::default(),
            gate: Arc::default(),
            refuse_release: Arc::default(),
        }
    }

    /// Runs `action` once, at the first access `pred` matches: before it
    /// reaches the model, or after with `after`.
    fn arm(
        &self,
        after: bool,
        pred: impl Fn(Acc) -> bool + Send + Sync + 'static,
        action: impl FnOnce() + Send + 'static,
    ) {
        *self.armed.lock().unwrap() = Some(Armed {
            pred: Box::new(pred),
            action: Box::new(action),
            after,
        });
    }

    fn fired(&self) -> bool {
        self.armed.lock().unwrap().is_none()
    }

    fn slow_release(&self, d: Duration) {
        *self.release_delay.lock().unwrap() = d;
    }

    /// The armed action for `a`, if it matches (taken: runs once). The
    /// lock is not held while the action runs.
    fn take(&self, a: Acc, after: bool) -> Option<Action> {
        let mut g = self.armed.lock().unwrap();
        if g.as_ref().is_some_and(|x| x.after == after && (x.pred)(a)) {
            return g.take().map(|x| x.action);
        }
        None
    }

    fn around(&self, a: Acc, forward: impl FnOnce()) {
        if let Some(act) = self.take(a, false) {
            act();
        }
        forward();
        if let Some(act) = self.take(a, true) {
            act();
        }
    }
}

impl Hooks for Trap {
    fn model(&self) -> &ModelController {
        &self.model
    }
    fn write32(&self, o: usize, v: u32) {
        if o >= reg::DOORBELLS {
            self.doorbells.fetch_add(1, Ordering::SeqCst);
        }
        self.around(Acc::W32(o, v), || self.model.write32(o, v));
    }
    fn write64(&self, o: usize, v: u64) {
        self.around(Acc::W64(o, v), || self.model.write64(o, v));
    }
    fn release(&self) -> bool {
        if self.gate.hold.load(Ordering::SeqCst) {
            self.gate.entered.store(true, Ordering::SeqCst);
            let start = Instant::now();
            while !self.gate.go.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(3) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if self.refuse_release.load(Ordering::SeqCst) {
            return false;
        }
        let r = self.model.release();
        let d = *self.release_delay.lock().unwrap();
        std::thread::sleep(d);
        r
    }
}

use upnvme::Device as _;

fn on_release_thread() -> bool {
    std::thread::current().name() == Some("upnvme-release")
}

fn not_on_release_thread() -> bool {
    !on_release_thread()
}

/// Raises the kernel's request and waits (bounded) until the driver released
/// the device and finished its state update.
fn release_now(m: &ModelController) {
    m.request_release();
    let start = Instant::now();
    while !m.is_released() {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "the device was not released within 3 s of the request"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // The state word update follows `Device::release` at once.
    std::thread::sleep(Duration::from_millis(50));
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn fetched_io(m: &ModelController, qid: u16, opcode: u8) -> usize {
    m.commands_seen()
        .iter()
        .filter(|&&(q, op, _)| q == qid && op == opcode)
        .count()
}

/// The next command fetched from SQ `qid` is held by the controller (one
/// fault per command: faults matching one command are all consumed by it).
fn hold_next(m: &ModelController, qid: u16) {
    m.inject(Fault::DelayCompletion {
        on: Match::Queue(qid),
        doorbells: None,
    });
}

/// One-block reads of namespace 1 at LBA = tag, each held by the controller.
fn held_reads<D: upnvme::Device>(
    m: &ModelController,
    c: &Controller<D>,
    qp: &mut upnvme::IoQueuePair<D>,
    tags: std::ops::Range<u64>,
) {
    let ns = c.namespace(1).unwrap().clone();
    let before = m.delayed_completions();
    let n = tags.end - tags.start;
    for t in tags {
        hold_next(m, qp.qid());
        qp.read(&ns, t, 1, c.alloc_dma(4096).unwrap(), t).unwrap();
    }
    assert_eq!(m.delayed_completions(), before + n as usize, "all held");
}
/// Holds the release on the kernel's request right after its CC.EN = 0 has
/// reached the controller (as a controller slow to report CSTS.RDY = 0
/// would) until the second flag is set, or 3 s; the first flag says the
/// hold began.
fn hold_release_after_disable(trap: &Trap) -> (Arc<AtomicBool>, Arc<AtomicBool>) {
    let disabled = Arc::new(AtomicBool::new(false));
    let go_on = Arc::new(AtomicBool::new(false));
    {
        let (disabled, go_on) = (disabled.clone(), go_on.clone());
        trap.arm(
            true,
            |a| matches!(a, Acc::W32(o, v) if o == reg::CC && v & 1 == 0) && on_release_thread(),
            move || {
                disabled.store(true, Ordering::SeqCst);
                let start = Instant::now();
                while !go_on.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(3) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            },
        );
    }
    (disabled, go_on)
}

fn mmio_opts() -> ControllerOptions {
    ControllerOptions {
        shadow_doorbells: false,
        ..opts()
    }
}

fn is_removed_error(e: &Error) -> bool {
    matches!(
        e,
        Error::ControllerRemoved { .. }
            | Error::Io {
                error: IoError::ControllerRemoved,
                ..
            }
    )
}

/// Polls `qp` (bounded) until `want` completions came, then a little more
/// to catch any duplicate; returns them.
fn collect(
    qp: &mut upnvme::IoQueuePair<impl upnvme::Device>,
    want: usize,
) -> Vec<upnvme::Completion> {
    let mut out = Vec::new();
    let start = Instant::now();
    while out.len() < want && start.elapsed() < Duration::from_secs(4) {
        let _ = qp.process_completions(u32::MAX, |_, c| out.push(c));
    }
    for _ in 0..2000 {
        let _ = qp.process_completions(u32::MAX, |_, c| out.push(c));
    }
    out
}

fn assert_each_once_with_buffer(out: &[upnvme::Completion], tags: &[u64]) {
    let mut got: Vec<u64> = out.iter().map(|c| c.tag).collect();
    got.sort_unstable();
    let mut want = tags.to_vec();
    want.sort_unstable();
    assert_eq!(got, want, "each command ends exactly once: {out:?}");
    for c in out {
        assert!(
            c.buffer.is_some(),
            "tag {} came back without its buffer",
            c.tag
        );
    }
}

// ---------------------------------------------------------------------------
// Release while another thread works.
// ---------------------------------------------------------------------------

/// A blocking read waiting for a held completion when the kernel asks for
/// the device back. `Device::release` takes a while (VFIO: closing the
/// device file resets the function before `close` returns), and BAR0 reads
/// all ones from its start; the state word is updated only after it. The
/// blocking wait must not report that window as a surprise removal
/// (`ControllerGone`, buffer kept): the release ends the command with
/// `ControllerRemoved` and hands its buffer back, as the polled path does
/// (`check_csts_while_polling` knows the release; the blocking helper's own
/// CSTS check does not).
#[test]
fn a_blocking_read_cut_by_a_slow_release_ends_as_removed_with_its_buffer() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let trap = Trap::new(&m);
    trap.slow_release(Duration::from_millis(400));
    let c = Controller::with_device(Front(trap.clone()), opts()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            command_timeout: None,
            ..Default::default()
        })
        .unwrap();
    let qid = qp.qid();
    hold_next(&m, qid);
    let buf = c.alloc_dma(4096).unwrap();
    let start = Instant::now();
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            wait_until("the read to be fetched", Duration::from_secs(3), || {
                fetched_io(&m, qid, io_op::READ) == 1
            });
            m.request_release();
        });
        qp.read_blocking(&ns, 0, 1, buf, Duration::from_secs(4))
    });
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "ran into its timeout"
    );
    let f = r.expect_err("the read cannot succeed");
    // Let the release finish, then look at what the pair still owes.
    std::thread::sleep(Duration::from_millis(600));
    let late = collect(&mut qp, 1);
    assert!(
        is_removed_error(&f.error) && f.buffer.is_some(),
        "blocking read cut by the release: error {:?}, buffer back: {}; delivered later: {:?}",
        f.error,
        f.buffer.is_some(),
        late.iter().map(|c| (c.tag, c.result)).collect::<Vec<_>>()
    );
    assert!(late.is_empty(), "ended twice: {late:?}");
    assert_eq!(qp.in_flight(), 0);
}

/// The same window seen by a poll's command timeout scan: an overdue
/// command while BAR0 already reads all ones from the release. The poll's
/// own CSTS check leaves it to the release (`is_removed`), but the timeout
/// scan's check fails the call with `ControllerGone`, "hot-removed, reset
/// by someone else, or its PCI link is down", for a device the driver
/// itself released on the kernel's request.
#[test]
fn an_overdue_command_during_a_slow_release_is_not_reported_as_gone() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let trap = Trap::new(&m);
    trap.slow_release(Duration::from_millis(500));
    let c = Controller::with_device(Front(trap.clone()), opts()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            command_timeout: Some(Duration::from_millis(20)),
            ..Default::default()
        })
        .unwrap();
    hold_next(&m, qp.qid());
    qp.read(&ns, 0, 1, c.alloc_dma(4096).unwrap(), 3).unwrap();
    m.request_release();
    // The model is released (BAR reads all ones); the driver's state word
    // is updated only once `release` returns, 500 ms later.
    wait_until("the release", Duration::from_secs(3), || m.is_released());
    let mut errors = Vec::new();
    let mut out = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(300) {
        if let Err(e) = qp.process_completions(u32::MAX, |_, c| out.push(c)) {
            errors.push(e);
        }
    }
    std::thread::sleep(Duration::from_millis(400));
    out.extend(collect(&mut qp, 1 - out.len().min(1)));
    let gone: Vec<_> = errors
        .iter()
        .filter(|e| matches!(e, Error::ControllerGone { .. }))
        .collect();
    assert!(
        gone.is_empty(),
        "the driver's own release reported as a vanished device: {:?}",
        gone.first()
    );
    assert_each_once_with_buffer(&out, &[3]);
    assert_eq!(out[0].result, Err(IoError::ControllerRemoved));
}

/// The release disables the controller (CC.EN = 0, which deletes every
/// queue) before it releases the device, and waits up to 500 ms for
/// CSTS.RDY = 0 meanwhile; the state word changes only at its end. A pair
/// that submits in between rings the SQ tail doorbell of a queue the
/// controller no longer has (the model records it as a doorbell written
/// while the controller is not ready). A reset sets `STATE_RESETTING` before
/// its deletions for exactly this reason; the release sets nothing.
#[test]
fn no_doorbell_reaches_the_controller_the_release_disabled() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let trap = Trap::new(&m);
    let c = Controller::with_device(Front(trap.clone()), mmio_opts()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let (disabled, go_on) = hold_release_after_disable(&trap);
    m.request_release();
    wait_until("CC.EN = 0 from the release", Duration::from_secs(3), || {
        disabled.load(Ordering::SeqCst)
    });
    // The release goes on 100 ms later; the submission in between waits for
    // it (the releasing bit) instead of ringing a disabled controller.
    let releaser = {
        let go_on = go_on.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            go_on.store(true, Ordering::SeqCst);
        })
    };
    let submitted = qp.read(&ns, 0, 1, c.alloc_dma(4096).unwrap(), 1);
    let violations = m.take_violations();
    releaser.join().unwrap();
    wait_until("the release", Duration::from_secs(3), || m.is_released());
    // Refused once the release is over, with its buffer: the controller is
    // gone.
    match submitted {
        Ok(()) => panic!("a submission accepted after the release disabled the controller"),
        Err(r) => {
            assert!(r.buffer.is_some(), "the refused submission's buffer");
            assert!(
                matches!(qp.describe(r.reason), Error::ControllerRemoved { .. }),
                "the refusal names the removal"
            );
        }
    }
    assert_eq!(collect(&mut qp, 0).len(), 0, "nothing was in flight");
    assert_eq!(
        violations,
        Vec::<String>::new(),
        "a doorbell reached the controller after the release's CC.EN = 0"
    );
}

/// A release inside a completion callback, which then submits again on the
/// pair and reaps from inside the callback: the submission is refused with
/// its buffer (no doorbell), the nested reap neither panics nor delivers a
/// command twice, and every command in flight ends exactly once with
/// `ControllerRemoved` and its buffer.
#[test]
fn a_callback_that_submits_and_reaps_after_a_release_loses_nothing() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let trap = Trap::new(&m);
    let c = Controller::with_device(Front(trap.clone()), opts()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // Tag 0 completes at once; tags 1..=3 are held by the controller.
    qp.read(&ns, 0, 1, c.alloc_dma(4096).unwrap(), 0).unwrap();
    held_reads(&m, &c, &mut qp, 1..4);
    let mut delivered = Vec::new();
    let mut refusals = 0;
    let mut doorbells_at_release = None;
    let start = Instant::now();
    while delivered.len() < 4 && start.elapsed() < Duration::from_secs(4) {
        let _ = qp.process_completions(u32::MAX, |qp, c| {
            if c.tag == 0 {
                assert_eq!(c.result, Ok(0));
                release_now(&m);
                doorbells_at_release = Some(trap.doorbells.load(Ordering::SeqCst));
                // Resubmit the buffer: refused, and handed back.
                let buf = c.buffer.expect("its buffer");
                match qp.read(&ns, 9, 1, buf, 100) {
                    Ok(()) => panic!("a read was accepted by a released controller"),
                    Err(r) => {
                        assert_eq!(r.reason, Reject::Unusable);
                        assert!(r.buffer.is_some(), "refusal keeps the buffer");
                        refusals += 1;
                    }
                }
                // Reap from inside the callback.
                let mut inner = Vec::new();
                let _ = qp.process_completions(u32::MAX, |_, c| inner.push(c));
                delivered.push((0, Ok(0), true));
                delivered.extend(
                    inner
                        .into_iter()
                        .map(|c| (c.tag, c.result, c.buffer.is_some())),
                );
            } else {
                delivered.push((c.tag, c.result, c.buffer.is_some()));
            }
        });
    }
    for _ in 0..1000 {
        let _ = qp.process_completions(u32::MAX, |_, c| {
            delivered.push((c.tag, c.result, c.buffer.is_some()))
        });
    }
    assert_eq!(refusals, 1);
    let mut tags: Vec<u64> = delivered.iter().map(|d| d.0).collect();
    tags.sort_unstable();
    assert_eq!(tags, [0, 1, 2, 3], "each once: {delivered:?}");
    for &(tag, result, buffer) in &delivered {
        assert!(buffer, "tag {tag} without its buffer");
        if tag != 0 {
            assert_eq!(result, Err(IoError::ControllerRemoved), "tag {tag}");
        }
    }
    assert_eq!(qp.in_flight(), 0);
    drop(qp);
    drop(c);
    assert_eq!(
        Some(trap.doorbells.load(Ordering::SeqCst)),
        doorbells_at_release,
        "a doorbell written after the release"
    );
    assert_eq!(m.violations(), Vec::<String>::new());
}

/// A release that lands while `Controller::reset` runs on another thread,
/// right when the reset writes the new admin queue's address (after its
/// disable and generation bump): the reset ends with `ControllerRemoved`,
/// the pair's commands end once each with their buffers, later calls say
/// `ControllerRemoved`, and nothing breaks a rule of the model.
#[test]
fn a_release_inside_a_resets_re_enable_ends_everything_once() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let trap = Trap::new(&m);
    let c = Controller::with_device(Front(trap.clone()), opts()).unwrap();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    held_reads(&m, &c, &mut qp, 0..4);
    {
        let m = m.clone();
        trap.arm(
            false,
            |a| matches!(a, Acc::W64(o, _) if o == reg::ASQ) && not_on_release_thread(),
            move || release_now(&m),
        );
    }
    let start = Instant::now();
    let r = c.reset();
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "reset took too long"
    );
    assert!(trap.fired(), "the reset never re-enabled");
    assert!(
        matches!(r, Err(Error::ControllerRemoved { .. })),
        "reset cut by a release: {r:?}"
    );
    let out = collect(&mut qp, 4);
    assert_each_once_with_buffer(&out, &[0, 1, 2, 3]);
    for c in &out {
        assert!(
            matches!(
                c.result,
                Err(IoError::ControllerRemoved | IoError::ControllerReset)
            ),
            "{c:?}"
        );
    }
    let e = qp.process_completions(u32::MAX, |_, _| {}).unwrap_err();
    assert!(matches!(e, Error::ControllerRemoved { .. }), "{e:?}");
    assert!(matches!(
        c.identify_controller(),
        Err(Error::ControllerRemoved { .. })
    ));
    drop(qp);
    drop(c);
    assert_eq!(m.violations(), Vec::<String>::new());
}

/// A release that starts inside `Controller::reset` after the reset's last
/// look at the release flag and before its CC.EN = 1 (here: at the new
/// admin queue's address; the release takes no lock). The release finds the
/// controller disabled by the reset, writes nothing and goes on to
/// `Device::release` (held here before the device is let go); the reset's
/// CC.EN = 1 then enables the controller again under the release. The reset
/// must disable it again before it returns `ControllerRemoved` — else the
/// controller runs on a fresh admin queue until `Device::release` (and on a
/// device that cannot be released, for good) — and send it no command.
#[test]
fn a_release_between_a_resets_last_check_and_its_enable_leaves_the_controller_disabled() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let trap = Trap::new(&m);
    let c = Controller::with_device(Front(trap.clone()), mmio_opts()).unwrap();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    held_reads(&m, &c, &mut qp, 0..2);
    trap.gate.hold.store(true, Ordering::SeqCst);
    // Commands the controller fetched before the reset's new admin queue.
    let before_enable = Arc::new(AtomicU32::new(0));
    {
        let (m, gate, before) = (m.clone(), trap.gate.clone(), before_enable.clone());
        trap.arm(
            false,
            |a| matches!(a, Acc::W64(o, _) if o == reg::ASQ) && not_on_release_thread(),
            move || {
                before.store(m.commands_seen().len() as u32, Ordering::SeqCst);
                m.request_release();
                wait_until(
                    "the release's Device::release",
                    Duration::from_secs(3),
                    || gate.entered.load(Ordering::SeqCst),
                );
            },
        );
    }
    let r = c.reset();
    assert!(trap.fired(), "the reset never re-enabled");
    let en = m.read32(reg::CC) & 1;
    let sent: Vec<_> = m.commands_seen()[before_enable.load(Ordering::SeqCst) as usize..].to_vec();
    trap.gate.go.store(true, Ordering::SeqCst);
    wait_until("the release", Duration::from_secs(3), || m.is_released());
    assert!(
        matches!(r, Err(Error::ControllerRemoved { .. })),
        "reset cut by a release: {r:?}"
    );
    assert_eq!(
        en, 0,
        "the reset left the controller enabled under the release"
    );
    assert!(
        sent.iter().all(|&(q, _, _)| q != 0),
        "admin commands sent into the release: {sent:?}"
    );
    let out = collect(&mut qp, 2);
    assert_each_once_with_buffer(&out, &[0, 1]);
    drop(qp);
    drop(c);
    assert_eq!(m.violations(), Vec::<String>::new());
}

/// Runs `call` with a release on request raised right after the first CC
/// write (from another thread than the release's) whose value `cc_matches`,
/// waiting there until the release's CC.EN = 0 reached the model; returns
/// what `call` returned and how long it took.
fn release_after_cc_write<T>(
    trap: &Trap,
    cc_matches: impl Fn(u32) -> bool + Send + Sync + 'static,
    call: impl FnOnce() -> T,
) -> (T, Duration) {
    let m = trap.model.clone();
    trap.arm(
        true,
        move |a| {
            matches!(a, Acc::W32(o, v) if o == reg::CC && cc_matches(v)) && not_on_release_thread()
        },
        move || {
            m.request_release();
            wait_until("the release's CC.EN = 0", Duration::from_secs(3), || {
                m.read32(reg::CC) & 1 == 0
            });
        },
    );
    let start = Instant::now();
    let r = call();
    let took = start.elapsed();
    assert!(trap.fired(), "the CC write never came");
    (r, took)
}

/// `what`, cut by a release whose CC.EN = 0 made its register wait
/// hopeless, ended with `ControllerRemoved` before its `bound`, and the
/// controller is disabled.
fn assert_cut_short(
    what: &str,
    r: upnvme::Result<()>,
    took: Duration,
    bound: Duration,
    m: &ModelController,
) {
    assert!(
        matches!(r, Err(Error::ControllerRemoved { .. })),
        "{what} cut by a release: {r:?}"
    );
    assert!(took < bound, "{what} waited out its bound ({took:?})");
    assert_eq!(m.read32(reg::CC) & 1, 0, "the controller was left enabled");
}

/// A release that lands while a reset waits for CSTS.RDY = 1 after its
/// CC.EN = 1, on a device that cannot be released (`Device::release`
/// returns false: the registers stay live). The release's CC.EN = 0 means
/// CSTS.RDY = 1 never comes: the reset must see the release and end with
/// `ControllerRemoved` at once — before, it waited out the ready timeout
/// (2 s here) and reported a timeout. The controller stays disabled and the
/// pair's commands end once each.
#[test]
fn a_release_while_a_reset_waits_for_ready_ends_the_wait() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let trap = Trap::new(&m);
    trap.refuse_release.store(true, Ordering::SeqCst);
    let options = mmio_opts();
    let ready_timeout = options.ready_timeout.unwrap();
    let c = Controller::with_device(Front(trap.clone()), options).unwrap();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    held_reads(&m, &c, &mut qp, 0..2);
    let (r, took) = release_after_cc_write(&trap, |v| v & 1 == 1, || c.reset());
    assert_cut_short("the reset", r, took, ready_timeout, &m);
    // The release ends when its state update is done: then the pair ends
    // its commands.
    wait_until("the release", Duration::from_secs(3), || {
        matches!(
            c.identify_controller(),
            Err(Error::ControllerRemoved { .. })
        )
    });
    let out = collect(&mut qp, 2);
    assert_each_once_with_buffer(&out, &[0, 1]);
    drop(qp);
    drop(c);
    assert_eq!(m.violations(), Vec::<String>::new());
}

/// A release while a reset waits for its Delete I/O Submission Queue: the
/// reset gives up promptly with `ControllerRemoved` and the pair's commands
/// end once each.
#[test]
fn a_release_during_a_resets_queue_deletion_ends_everything_once() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = open(&m, opts());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    held_reads(&m, &c, &mut qp, 0..2);
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode {
            qid: 0,
            opcode: admin_op::DELETE_IO_SQ,
        },
        doorbells: None,
    });
    let deletes_before = fetched_io(&m, 0, admin_op::DELETE_IO_SQ);
    let start = Instant::now();
    let r = std::thread::scope(|s| {
        let resetter = s.spawn(|| c.reset());
        wait_until("the Delete I/O SQ", Duration::from_secs(3), || {
            fetched_io(&m, 0, admin_op::DELETE_IO_SQ) > deletes_before
        });
        release_now(&m);
        resetter.join().unwrap()
    });
    assert!(start.elapsed() < Duration::from_secs(4));
    assert!(
        matches!(r, Err(Error::ControllerRemoved { .. })),
        "reset cut by a release: {r:?}"
    );
    let out = collect(&mut qp, 2);
    assert_each_once_with_buffer(&out, &[0, 1]);
    assert_eq!(m.violations(), Vec::<String>::new());
}

/// `Controller::close` when the kernel's request comes in the middle of its
/// shutdown (right before CC.SHN): the close reports the removal (as the
/// reset and the admin path do), not a vanished device.
#[test]
fn a_close_cut_by_a_release_names_the_removal() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let trap = Trap::new(&m);
    let c = Controller::with_device(Front(trap.clone()), opts()).unwrap();
    {
        let m = m.clone();
        trap.arm(
            false,
            |a| {
                matches!(a, Acc::W32(o, v) if o == reg::CC && (v >> 14) & 3 != 0)
                    && not_on_release_thread()
            },
            move || release_now(&m),
        );
    }
    let start = Instant::now();
    let r = c.close();
    assert!(start.elapsed() < Duration::from_secs(4));
    assert!(trap.fired(), "no shutdown notification was written");
    assert!(
        matches!(r, Ok(()) | Err(Error::ControllerRemoved { .. })),
        "close cut by a release: {r:?}"
    );
}

/// The same release, seen by the reset's ready wait before its CC.EN = 0
/// reaches a controller that is not ready yet (the release sets its flag
/// first, then reads CSTS and CC; held here for 200 ms at its CC write,
/// standing in for a window of microseconds): the reset's disable, which
/// waits for CSTS.RDY = 1 before clearing CC.EN, must stop waiting when it
/// reads CC.EN = 0 back — before, it waited out the ready timeout (2 s).
#[test]
fn a_release_seen_before_its_cc_write_does_not_hold_the_resets_disable() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let trap = Trap::new(&m);
    trap.refuse_release.store(true, Ordering::SeqCst);
    let options = mmio_opts();
    let ready_timeout = options.ready_timeout.unwrap();
    let c = Controller::with_device(Front(trap.clone()), options).unwrap();
    let _qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // Not ready after the reset's CC.EN = 1.
    m.inject(Fault::NeverReady);
    let held = Arc::new(AtomicBool::new(false));
    {
        let (m, inner, held) = (m.clone(), trap.clone(), held.clone());
        trap.arm(
            true,
            |a| {
                matches!(a, Acc::W32(o, v) if o == reg::CC && v & 1 == 1) && not_on_release_thread()
            },
            move || {
                let h = held.clone();
                // The release's CC.EN = 0, held before it reaches the model.
                inner.arm(
                    false,
                    |a| {
                        matches!(a, Acc::W32(o, v) if o == reg::CC && v & 1 == 0)
                            && on_release_thread()
                    },
                    move || {
                        h.store(true, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(200));
                    },
                );
                m.request_release();
                wait_until("the release's CC write", Duration::from_secs(3), || {
                    held.load(Ordering::SeqCst)
                });
            },
        );
    }
    let start = Instant::now();
    let r = c.reset();
    let took = start.elapsed();
    assert!(trap.fired(), "the CC write never came");
    assert_cut_short("the reset", r, took, ready_timeout, &m);
}

/// A release while `close()` waits for CSTS.SHST = "shutdown processing
/// complete" (held back here), on a device that cannot be released: the
/// release's CC.EN = 0 ends the shutdown, so SHST never reports it
/// complete. The close must see the release and say `ControllerRemoved`
/// at once — before, it waited out the shutdown timeout (2 s here) and
/// reported a timeout.
#[test]
fn a_release_while_close_waits_for_the_shutdown_ends_the_wait() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let trap = Trap::new(&m);
    trap.refuse_release.store(true, Ordering::SeqCst);
    let options = opts();
    let shutdown_timeout = options.shutdown_timeout.unwrap();
    let c = Controller::with_device(Front(trap.clone()), options).unwrap();
    m.inject(Fault::NeverShutdownComplete);
    let (r, took) = release_after_cc_write(&trap, |v| (v >> 14) & 3 != 0, || c.close());
    assert_cut_short("the close", r, took, shutdown_timeout, &m);
    assert_eq!(m.violations(), Vec::<String>::new());
}

/// A pair closed while its Delete I/O SQ waits and the kernel's request
/// comes: the close returns every command once, with its buffer, promptly.
#[test]
fn a_pair_close_cut_by_a_release_returns_every_command_once() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = open(&m, opts());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    held_reads(&m, &c, &mut qp, 0..3);
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode {
            qid: 0,
            opcode: admin_op::DELETE_IO_SQ,
        },
        doorbells: None,
    });
    let start = Instant::now();
    let out = std::thread::scope(|s| {
        let closer = s.spawn(move || qp.close(Duration::ZERO));
        wait_until("the Delete I/O SQ", Duration::from_secs(3), || {
            fetched_io(&m, 0, admin_op::DELETE_IO_SQ) > 0
        });
        release_now(&m);
        closer.join().unwrap()
    });
    assert!(start.elapsed() < Duration::from_secs(4));
    assert_each_once_with_buffer(&out, &[0, 1, 2]);
    for c in &out {
        assert_eq!(c.result, Err(IoError::ControllerRemoved), "{c:?}");
    }
    assert_eq!(m.violations(), Vec::<String>::new());
}

/// A pair being created (its Create I/O Completion Queue held) when the
/// kernel's request comes: creation fails with `ControllerRemoved`
/// promptly, and nothing is left behind once the controller goes.
#[test]
fn a_release_during_queue_creation_fails_it_cleanly() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = open(&m, opts());
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode {
            qid: 0,
            opcode: admin_op::CREATE_IO_CQ,
        },
        doorbells: None,
    });
    let start = Instant::now();
    let r = std::thread::scope(|s| {
        let creator = s.spawn(|| c.io_queue_pair(QueuePairOptions::default()).map(|_| ()));
        wait_until("the Create I/O CQ", Duration::from_secs(3), || {
            fetched_io(&m, 0, admin_op::CREATE_IO_CQ) > 0
        });
        release_now(&m);
        creator.join().unwrap()
    });
    assert!(start.elapsed() < Duration::from_secs(4));
    assert!(
        matches!(r, Err(Error::ControllerRemoved { .. })),
        "creation cut by the release: {r:?}"
    );
    drop(c);
    assert_eq!(m.live_dma_buffers(), 0, "memory left behind");
    assert_eq!(m.violations(), Vec::<String>::new());
}

// ---------------------------------------------------------------------------
// Surprise removal (registers read all ones) during bring-up and creation.
// ---------------------------------------------------------------------------

/// The device vanishes at each admin command of bring-up in turn (the
/// model's `UnplugOn` the n-th command fetched): bring-up fails with
/// `ControllerGone` (or, where the vanishing command is not waited for,
/// succeeds and the next call fails), within a bound, without a panic, and
/// leaves no DMA memory behind once everything is dropped.
#[test]
fn a_removal_at_any_bring_up_command_fails_cleanly() {
    // Commands bring-up fetches (the shutdown's deletions come after).
    let m0 = ModelController::new(config_one_ns(4096, 1024));
    let c0 = open(&m0, opts());
    let n = m0.commands_fetched();
    drop(c0);
    assert!(n >= 5, "bring-up sent {n} commands");
    for k in 0..n {
        let m = ModelController::new(config_one_ns(4096, 1024));
        m.inject(Fault::UnplugOn(Match::Nth(k)));
        let start = Instant::now();
        let r = Controller::with_device(m.clone(), opts());
        let took = start.elapsed();
        assert!(took < Duration::from_secs(3), "command {k}: took {took:?}");
        match r {
            Err(Error::ControllerGone { .. }) => {}
            Err(e) => panic!("removal at bring-up command {k}: {e:?}"),
            Ok(c) => {
                assert!(
                    c.identify_controller().is_err(),
                    "command {k}: a vanished controller answered"
                );
                assert!(c.io_queue_pair(QueuePairOptions::default()).is_err());
                drop(c);
            }
        }
        assert!(m.is_unplugged(), "command {k}: the fault never fired");
        assert_eq!(m.live_dma_buffers(), 0, "command {k}: memory left behind");
        assert_eq!(m.violations(), Vec::<String>::new(), "command {k}");
    }
}

/// Registers read all ones right after bring-up writes CC.EN = 1 (the
/// device vanished mid-enable): `ControllerGone`, promptly.
#[test]
fn a_removal_right_after_cc_enable_fails_bring_up_promptly() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    let trap = Trap::new(&m);
    {
        let m = m.clone();
        trap.arm(
            true,
            |a| matches!(a, Acc::W32(o, v) if o == reg::CC && v & 1 == 1),
            move || m.unplug(),
        );
    }
    let start = Instant::now();
    let r = Controller::with_device(Front(trap.clone()), opts());
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(trap.fired());
    assert!(
        matches!(r, Err(Error::ControllerGone { .. })),
        "{:?}",
        r.map(|_| ())
    );
    assert_eq!(m.live_dma_buffers(), 0);
}

/// The device vanishes when the controller fetches Create I/O CQ, then
/// (another model) Create I/O SQ: creation fails with `ControllerGone`
/// promptly; the queue ID and memory are not lost for good, and the
/// controller refuses further work.
#[test]
fn a_removal_during_queue_creation_fails_cleanly() {
    for opcode in [admin_op::CREATE_IO_CQ, admin_op::CREATE_IO_SQ] {
        let m = ModelController::new(config_one_ns(4096, 1024));
        let c = open(&m, opts());
        m.inject(Fault::UnplugOn(Match::Opcode { qid: 0, opcode }));
        let start = Instant::now();
        let r = c.io_queue_pair(QueuePairOptions::default());
        assert!(start.elapsed() < Duration::from_secs(3));
        assert!(
            matches!(r, Err(Error::ControllerGone { .. })),
            "opcode {opcode:#x}: {:?}",
            r.map(|_| ())
        );
        assert!(c.io_queue_pair(QueuePairOptions::default()).is_err());
        let closed = c.close();
        assert!(closed.is_err(), "closing a vanished controller: {closed:?}");
        assert_eq!(m.live_dma_buffers(), 0, "opcode {opcode:#x}");
        assert_eq!(m.violations(), Vec::<String>::new());
    }
}

/// Surprise removal (no release) with commands in flight, then the
/// application closes the pair and drops everything: no buffer comes back
/// (the device may still own them), nothing panics or hangs, and the
/// memory is freed once the controller's drop released the device.
#[test]
fn a_surprise_removal_keeps_buffers_until_the_device_is_released() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    let c = open(&m, opts());
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            command_timeout: None,
            ..Default::default()
        })
        .unwrap();
    held_reads(&m, &c, &mut qp, 0..2);
    m.unplug();
    // The polled path notices within its CSTS interval (100 ms).
    let start = Instant::now();
    let err = loop {
        match qp.process_completions(u32::MAX, |_, c| panic!("delivered {c:?}")) {
            Err(e) => break e,
            Ok(_) => assert!(start.elapsed() < Duration::from_secs(2), "never noticed"),
        }
    };
    assert!(matches!(err, Error::ControllerGone { .. }), "{err:?}");
    let start = Instant::now();
    let out = qp.close(Duration::from_millis(50));
    assert!(start.elapsed() < Duration::from_secs(3));
    assert!(
        out.iter().all(|c| c.buffer.is_none()),
        "a buffer the vanished device may own came back: {out:?}"
    );
    drop(c);
    assert_eq!(m.live_dma_buffers(), 0);
}

// ---------------------------------------------------------------------------
// Drop order, handles that outlive their controller.
// ---------------------------------------------------------------------------

/// The `Controller` dropped first: the pair keeps working; dropping the pair
/// then shuts the controller down (CC.EN = 0), and no rule is broken.
#[test]
fn a_pair_outliving_its_dropped_controller_works_then_shuts_it_down() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let buf = c.alloc_dma(4096).unwrap();
    drop(c);
    assert_eq!(m.cc() & 1, 1, "the pair keeps the controller up");
    let buf = qp
        .read_blocking(&ns, 0, 1, buf, Duration::from_secs(2))
        .expect("I/O after the controller handle is gone");
    drop(qp);
    assert_eq!(m.cc() & 1, 0, "the last handle shut the controller down");
    // The buffer outlives both.
    buf.write_bytes(0, &[1, 2, 3]).unwrap();
    drop(buf);
    assert_eq!(m.live_dma_buffers(), 0);
    common::assert_clean(&m);
}

/// A pair that outlives `Controller::close`: its commands end once with
/// their buffers, later calls say `Closed`, a submission is refused with
/// its buffer, its close and drop ring no doorbell of the shut-down
/// controller.
#[test]
fn a_pair_outliving_a_closed_controller_ends_its_commands_once() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    let c = open(&m, mmio_opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let qid = qp.qid();
    held_reads(&m, &c, &mut qp, 0..3);
    let spare = c.alloc_dma(4096).unwrap();
    c.close().unwrap();
    let db = m.doorbell_writes(qid);
    let out = collect(&mut qp, 3);
    assert_each_once_with_buffer(&out, &[0, 1, 2]);
    for c in &out {
        assert!(c.result.is_err(), "{c:?}");
    }
    let e = qp.process_completions(u32::MAX, |_, _| {}).unwrap_err();
    assert!(matches!(e, Error::Closed { .. }), "{e:?}");
    let r = qp.read(&ns, 0, 1, spare, 5).unwrap_err();
    assert_eq!(r.reason, Reject::Unusable);
    assert!(r.buffer.is_some());
    assert!(qp.close(Duration::ZERO).is_empty());
    assert_eq!(m.doorbell_writes(qid), db, "a doorbell after the close");
    common::assert_clean(&m);
}

/// Pool buffers in flight at a release come back with the removal and go
/// back into the pool; the pool and its buffers outlive the pair and the
/// controller; the memory is freed when the last of them goes.
#[test]
fn pool_buffers_outstanding_at_a_release_come_back_and_outlive_everything() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut pool = c.dma_pool(4096, 4).unwrap();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    for t in 0..3u64 {
        let b = pool.get().unwrap();
        hold_next(&m, qp.qid());
        qp.read(&ns, t, 1, b, t).unwrap();
    }
    let kept = pool.get().unwrap();
    assert_eq!(pool.available(), 0);
    release_now(&m);
    let out = collect(&mut qp, 3);
    assert_each_once_with_buffer(&out, &[0, 1, 2]);
    for c in out {
        assert_eq!(c.result, Err(IoError::ControllerRemoved));
        pool.put(c.buffer.unwrap()).expect("back into its pool");
    }
    assert_eq!(pool.available(), 3);
    drop(qp);
    drop(c);
    // Everything the application holds still works.
    kept.write_bytes(0, &[7; 16]).unwrap();
    pool.put(kept).unwrap();
    let b = pool.get().unwrap();
    b.write_bytes(0, &[9; 4096]).unwrap();
    drop(b);
    drop(pool);
    assert_eq!(m.live_dma_buffers(), 0);
}

/// An `AdminHandle` and a namespace handle that outlive their controller:
/// after a release the handle says `ControllerRemoved`; once the controller
/// is dropped it says `Closed`; the namespace handle is refused by another
/// controller's pair (with the buffer back), and a release followed by a
/// second close/drop does nothing more.
#[test]
fn handles_outliving_their_controller_fail_cleanly() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = open(&m, opts());
    let h = c.admin_handle();
    let ns = c.namespace(1).unwrap().clone();
    let identify = upnvme_queues::Sqe::identify(1, 0, 0);
    h.admin_passthrough(identify, 4096, None)
        .expect("works before");
    release_now(&m);
    let r = h.admin_passthrough(identify, 4096, None);
    assert!(
        matches!(r, Err(Error::ControllerRemoved { .. })),
        "{:?}",
        r.map(|_| ())
    );
    let closed = c.close();
    assert!(
        matches!(closed, Ok(()) | Err(Error::ControllerRemoved { .. })),
        "{closed:?}"
    );
    let r = h.admin_passthrough(identify, 4096, None);
    assert!(
        matches!(r, Err(Error::Closed { .. })),
        "{:?}",
        r.map(|_| ())
    );

    let m2 = ModelController::new(config_one_ns(4096, 1024));
    let c2 = open(&m2, opts());
    let mut qp2 = c2.io_queue_pair(QueuePairOptions::default()).unwrap();
    let r = qp2
        .read(&ns, 0, 1, c2.alloc_dma(4096).unwrap(), 1)
        .unwrap_err();
    assert_eq!(r.reason, Reject::ForeignNamespace);
    assert!(r.buffer.is_some());
    assert_eq!(qp2.in_flight(), 0);
    drop(qp2);
    drop(c2);
    common::assert_clean(&m2);
    assert_eq!(m.live_dma_buffers(), 0);
}

/// A release with reads parked by `reap_on_submit` (completed, not yet
/// delivered) and others held: every command is delivered exactly once —
/// the parked ones with their success, the held ones with
/// `ControllerRemoved`.
#[test]
fn parked_completions_survive_a_release_exactly_once() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            reap_on_submit: true,
            ..Default::default()
        })
        .unwrap();
    // Tags 0, 1 complete at once (parked by the next submits' reaps);
    // tags 2, 3 are held.
    qp.read(&ns, 0, 1, c.alloc_dma(4096).unwrap(), 0).unwrap();
    qp.read(&ns, 1, 1, c.alloc_dma(4096).unwrap(), 1).unwrap();
    held_reads(&m, &c, &mut qp, 2..4);
    release_now(&m);
    let out = collect(&mut qp, 4);
    assert_each_once_with_buffer(&out, &[0, 1, 2, 3]);
    for c in &out {
        if c.tag >= 2 {
            assert_eq!(c.result, Err(IoError::ControllerRemoved), "{c:?}");
        } else {
            assert_eq!(c.result, Ok(0), "{c:?}");
        }
    }
}

/// Repeated closing and dropping after a release: `IoQueuePair::close`
/// hands each command back once, the controller's `close` and the last
/// drop do not hang, panic or touch the device, and a second pair made
/// after the release is refused.
#[test]
fn closing_and_dropping_after_a_release_is_quiet() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = open(&m, opts());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let mut qp_b = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    held_reads(&m, &c, &mut qp, 0..2);
    release_now(&m);
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let out = qp.close(Duration::from_secs(1));
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_each_once_with_buffer(&out, &[0, 1]);
    drop(out);
    assert!(matches!(
        c.io_queue_pair(QueuePairOptions::default()),
        Err(Error::ControllerRemoved { .. })
    ));
    let e = qp_b
        .process_completions(u32::MAX, |_, _| {
            calls.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap_err();
    assert!(matches!(e, Error::ControllerRemoved { .. }), "{e:?}");
    assert!(qp_b.close(Duration::ZERO).is_empty());
    assert_eq!(calls.load(Ordering::Relaxed), 0);
    let start = Instant::now();
    let r = c.close();
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(
        matches!(r, Ok(()) | Err(Error::ControllerRemoved { .. })),
        "{r:?}"
    );
    assert_eq!(m.live_dma_buffers(), 0);
    assert_eq!(m.violations(), Vec::<String>::new());
}

/// A transfer above MDTS (split into several commands, some held by the
/// controller) in flight at a release: one completion for the whole
/// transfer, `ControllerRemoved`, with its buffer.
#[test]
fn a_split_transfer_in_flight_at_a_release_ends_once() {
    let m = ModelController::new(upnvme_tests::ModelConfig {
        mdts: 1, // 8 KiB
        ..config_one_ns(4096, 1024)
    });
    m.offer_release_request();
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // The second and fourth pieces of 4 are held.
    let first = m.commands_fetched();
    for i in [1, 3] {
        m.inject(Fault::DelayCompletion {
            on: Match::Nth(first + i),
            doorbells: None,
        });
    }
    qp.read(&ns, 0, 8, c.alloc_dma(32 * 1024).unwrap(), 77)
        .unwrap();
    assert_eq!(m.commands_fetched() - first, 4, "split in 4");
    assert_eq!(m.delayed_completions(), 2);
    release_now(&m);
    let out = collect(&mut qp, 1);
    assert_each_once_with_buffer(&out, &[77]);
    assert_eq!(out[0].result, Err(IoError::ControllerRemoved));
    assert_eq!(qp.in_flight(), 0);
}

/// A pair re-creating its queues after a reset (its Create I/O CQ held)
/// when the kernel's request comes: the commands the reset ended are
/// delivered once each (`ControllerReset`, with their buffers), the
/// re-creation ends promptly, later calls say `ControllerRemoved`, and the
/// pair's drop leaves nothing behind.
#[test]
fn a_release_during_a_pairs_re_creation_after_a_reset_loses_nothing() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let c = open(&m, opts());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    held_reads(&m, &c, &mut qp, 0..2);
    c.reset().unwrap();
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode {
            qid: 0,
            opcode: admin_op::CREATE_IO_CQ,
        },
        doorbells: None,
    });
    let creates = fetched_io(&m, 0, admin_op::CREATE_IO_CQ);
    let start = Instant::now();
    let (first, out) = std::thread::scope(|s| {
        s.spawn(|| {
            wait_until(
                "the re-creation's Create I/O CQ",
                Duration::from_secs(3),
                || fetched_io(&m, 0, admin_op::CREATE_IO_CQ) > creates,
            );
            release_now(&m);
        });
        let mut out = Vec::new();
        let first = qp.process_completions(u32::MAX, |_, c| out.push(c));
        (first, out)
    });
    assert!(start.elapsed() < Duration::from_secs(4));
    let mut out = out;
    out.extend(collect(&mut qp, 2 - out.len().min(2)));
    assert!(first.is_ok() || out.len() == 2, "{first:?}");
    assert_each_once_with_buffer(&out, &[0, 1]);
    for c in &out {
        assert_eq!(c.result, Err(IoError::ControllerReset), "{c:?}");
    }
    let e = qp.process_completions(u32::MAX, |_, _| {}).unwrap_err();
    assert!(matches!(e, Error::ControllerRemoved { .. }), "{e:?}");
    drop(out);
    drop(qp);
    drop(c);
    assert_eq!(m.live_dma_buffers(), 0);
    assert_eq!(m.violations(), Vec::<String>::new());
}

/// An admin command held by a device that neither disables nor can be
/// released when the kernel's request comes, then the controller dropped:
/// the admin queue's memory (where the late completion lands) is never
/// handed out again.
#[test]
fn an_unconfirmed_release_then_drop_keeps_the_admin_queue_out_of_use() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let dev = Unstoppable::new(&m);
    let stubborn = dev.stubborn.clone();
    let c = Controller::with_device(Front(dev), opts()).unwrap();
    let h = c.admin_handle();
    m.inject(Fault::DelayCompletion {
        on: Match::Identify { cns: 1, nsid: 0 },
        doorbells: None,
    });
    let identify = upnvme_queues::Sqe::identify(1, 0, 0);
    let start = Instant::now();
    let r = std::thread::scope(|s| {
        let w = s.spawn(|| {
            h.admin_passthrough_with_timeout(identify, 4096, None, Duration::from_millis(800))
        });
        wait_until("the held Identify", Duration::from_secs(3), || {
            m.delayed_completions() == 1
        });
        stubborn.store(true, Ordering::SeqCst);
        m.request_release();
        w.join().unwrap()
    });
    assert!(start.elapsed() < Duration::from_secs(4));
    assert!(r.is_err(), "{:?}", r.map(|_| ()));
    // Until the release is over (its 500 ms wait for CSTS.RDY = 0).
    wait_until("the release to end", Duration::from_secs(3), || {
        matches!(
            c.identify_controller(),
            Err(Error::ControllerRemoved { .. })
        )
    });
    std::thread::sleep(Duration::from_millis(700));
    drop(c);
    let bufs: Vec<_> = (0..64)
        .map(|_| {
            let b = m.alloc_dma(4096).unwrap();
            b.write_bytes(0, &[0xa5; 4096]).unwrap();
            b
        })
        .collect();
    assert_eq!(m.release_delayed(), 1, "the late completion is posted");
    let touched = bufs
        .iter()
        .filter(|b| b.to_vec().iter().any(|&x| x != 0xa5))
        .count();
    assert_eq!(touched, 0, "the device wrote into memory handed out again");
}

/// An admin command whose bound runs out while a release holds the
/// controller disabled (its completion never comes) says `ControllerRemoved`
/// — what every later call says — not a timeout that marks the controller
/// failed and advises `Controller::reset` (the C review's finding: the
/// passthrough answered `UPNVME_ETIMEDOUT` with that advice).
#[test]
fn an_admin_command_timing_out_during_a_release_names_the_removal() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let trap = Trap::new(&m);
    let c = Controller::with_device(Front(trap.clone()), mmio_opts()).unwrap();
    let (disabled, go_on) = hold_release_after_disable(&trap);
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode {
            qid: 0,
            opcode: admin_op::GET_FEATURES,
        },
        doorbells: None,
    });
    let before = fetched_io(&m, 0, admin_op::GET_FEATURES);
    let r = std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            c.admin_passthrough_with_timeout(
                upnvme::Sqe::get_features(upnvme::queues::feature::NUMBER_OF_QUEUES, 0, 0),
                0,
                None,
                Duration::from_millis(300),
            )
        });
        wait_until("the Get Features", Duration::from_secs(3), || {
            fetched_io(&m, 0, admin_op::GET_FEATURES) > before
        });
        m.request_release();
        wait_until("CC.EN = 0 from the release", Duration::from_secs(3), || {
            disabled.load(Ordering::SeqCst)
        });
        let r = waiter.join().unwrap();
        go_on.store(true, Ordering::SeqCst);
        r
    });
    assert!(
        matches!(r, Err(Error::ControllerRemoved { .. })),
        "an admin command cut by a release: {r:?}"
    );
    wait_until("the release", Duration::from_secs(3), || m.is_released());
}

/// A `Device::release` that panics (on the release thread): the
/// controller ends closed and failed, and a submission that comes after is
/// refused at once — before (a review), "releasing" stayed set and it
/// waited for the release's end for ever.
#[test]
fn a_panicking_release_does_not_leave_submissions_waiting_for_ever() {
    #[derive(Clone)]
    struct PanickingRelease {
        model: ModelController,
        entered: Arc<AtomicBool>,
    }
    impl common::Hooks for PanickingRelease {
        fn model(&self) -> &ModelController {
            &self.model
        }
        fn release(&self) -> bool {
            self.entered.store(true, Ordering::SeqCst);
            panic!("Device::release panicked (test)");
        }
    }
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let entered = Arc::new(AtomicBool::new(false));
    let dev = Front(PanickingRelease {
        model: m.clone(),
        entered: entered.clone(),
    });
    let c = Controller::with_device(dev, opts()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let buf = c.alloc_dma(4096).unwrap();
    m.request_release();
    wait_until("the release", Duration::from_secs(3), || {
        entered.load(Ordering::SeqCst)
    });
    std::thread::sleep(Duration::from_millis(100));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let read = upnvme::IoCommand::Read {
            ns: &ns,
            slba: 0,
            blocks: 1,
        };
        let r = qp.submit(read, Some(buf), 1);
        let _ = tx.send(r.map_err(|r| r.reason));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(3))
        .expect("a submission after a panicked release has not returned within 3 s");
    assert_eq!(r, Err(Reject::Unusable));
}

/// A pair closed while a release is under way (held in `Device::release`,
/// as VFIO's close of the device file is while it resets the function):
/// the close's Delete I/O SQ is refused at once (the release flag), and the
/// release has not yet ended the commands. The close must wait for the
/// release's end and hand back every command once, with its buffer, as
/// `ControllerRemoved` — before (a review), it returned nothing and the
/// pair's drop quarantined the buffers: three commands never ended.
#[test]
fn a_pair_close_during_a_slow_release_returns_every_command_once() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.offer_release_request();
    let trap = Trap::new(&m);
    let c = Controller::with_device(Front(trap.clone()), opts()).unwrap();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    held_reads(&m, &c, &mut qp, 0..3);
    trap.gate.hold.store(true, Ordering::SeqCst);
    m.request_release();
    wait_until(
        "the release's Device::release",
        Duration::from_secs(3),
        || trap.gate.entered.load(Ordering::SeqCst),
    );
    let start = Instant::now();
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            trap.gate.go.store(true, Ordering::SeqCst);
        });
        qp.close(Duration::ZERO)
    });
    assert!(start.elapsed() < Duration::from_secs(4));
    assert_each_once_with_buffer(&out, &[0, 1, 2]);
    for c in &out {
        assert_eq!(c.result, Err(IoError::ControllerRemoved), "{c:?}");
    }
    drop(out);
    drop(c);
    assert_eq!(m.live_dma_buffers(), 0);
    assert_eq!(m.violations(), Vec::<String>::new());
}

/// An admin command held by the controller when the kernel asks for it
/// back, on a device the release disables (CSTS.RDY = 0) but cannot give
/// back (`Device::release` false: its registers stay live instead of
/// reading all ones). No completion can come from a disabled controller:
/// the waiter ends promptly with `ControllerRemoved` — the synchronous
/// path (Identify Controller, under the admin lock) and the detached one
/// (an application's passthrough) alike — instead of waiting out its
/// bound (here 10 s; by default the controller's admin timeout).
#[test]
fn an_admin_wait_ends_once_the_release_disabled_the_controller() {
    for detached in [false, true] {
        let m = ModelController::new(config_one_ns(4096, 1024));
        m.offer_release_request();
        let trap = Trap::new(&m);
        trap.refuse_release.store(true, Ordering::SeqCst);
        let c = Controller::with_device(
            Front(trap.clone()),
            ControllerOptions {
                admin_timeout: Some(Duration::from_secs(10)),
                ..opts()
            },
        )
        .unwrap();
        m.inject(Fault::DelayCompletion {
            on: Match::Identify { cns: 1, nsid: 0 },
            doorbells: None,
        });
        let start = Instant::now();
        let r = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                if detached {
                    c.admin_passthrough(upnvme_queues::Sqe::identify(1, 0, 0), 4096, None)
                        .map(drop)
                } else {
                    c.identify_controller().map(drop)
                }
            });
            wait_until("the held Identify", Duration::from_secs(3), || {
                m.delayed_completions() == 1
            });
            m.request_release();
            waiter.join().unwrap()
        });
        let took = start.elapsed();
        assert!(
            matches!(r, Err(Error::ControllerRemoved { .. })),
            "detached {detached}: {r:?}"
        );
        assert!(
            took < Duration::from_secs(3),
            "detached {detached}: the wait took {took:?} after the release disabled the controller"
        );
        assert_eq!(m.read32(reg::CSTS) & 1, 0, "the release disabled it");
        drop(c);
        assert_eq!(m.violations(), Vec::<String>::new());
    }
}
