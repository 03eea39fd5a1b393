//! Format NVM waited for without holding the admin lock
//! (`Inner::execute_detached`, `AdminQueue::start_detached` /
//! `detached_outcome`, the reset epoch): what ends the wait, and that the
//! format's own completion reaches it. From the thirty-seventh session's
//! review; `a_format_completion_reaped_before_two_resets_is_not_lost` and
//! `a_fatal_status_during_a_format_ends_it_with_controller_reset_as_documented`
//! failed on the first version.

mod common;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use common::{Front, Hooks, open, opts, read_back};
use upnvme::{Controller, ControllerOptions, Device, FormatNvm, IoError, QueuePairOptions};
use upnvme_tests::{Fault, Match, ModelConfig, ModelController, NamespaceConfig};

const CSTS: usize = 0x1c;
const CSTS_CFS: u32 = 1 << 1;
const FORMAT_NVM: u8 = 0x80;
const CREATE_IO_CQ: u8 = 0x05;

/// Two namespaces of 512-byte blocks (4096 each).
fn cfg_two_512() -> ModelConfig {
    let one = NamespaceConfig {
        nsid: 1,
        lba_size: 512,
        blocks: 4096,
        ..NamespaceConfig::default()
    };
    ModelConfig {
        namespaces: vec![one, NamespaceConfig { nsid: 2, ..one }],
        ..ModelConfig::default()
    }
}

fn mmio_opts() -> ControllerOptions {
    ControllerOptions {
        shadow_doorbells: false,
        ..opts()
    }
}

fn hold_format(m: &ModelController) {
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode {
            qid: 0,
            opcode: FORMAT_NVM,
        },
        doorbells: None,
    });
}

fn wait_held(m: &ModelController, n: usize) {
    let start = Instant::now();
    while m.delayed_completions() < n {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no Format NVM reached the controller"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

type FormatThread<D> = std::thread::JoinHandle<(Controller<D>, upnvme::Result<upnvme::Namespace>)>;

fn start_format<D: Device>(mut c: Controller<D>, timeout: Duration) -> FormatThread<D> {
    std::thread::spawn(move || {
        let r = c.format_nvm(
            1,
            &FormatNvm {
                timeout: Some(timeout),
                ..FormatNvm::lbaf(4)
            },
        );
        (c, r)
    })
}

// --------------------------------------------------------------------------
// A device in front of the model that plays a script on the CSTS reads of
// one thread (the queue pair's owner):
//   step 1: CSTS reads with CFS set (once): the pair's polled CSTS check
//           resets the controller (reset #1);
//   step 2: reset #1's first CSTS read (under the admin lock, before its
//           reap): the model posts the held Format NVM completion first, so
//           reset #1 reaps it (epoch E) and keeps it for the waiter;
//   step 3: (two-reset script only) the first CSTS read while a completion
//           is held again — the pair's re-creation after reset #1, whose
//           Create I/O CQ completion the model holds — reads CFS:
//           `with_admin` resets again (reset #2), right away.
// The Format NVM's waiter (another thread) reads CSTS unchanged.
// --------------------------------------------------------------------------

#[derive(Clone)]
struct Script {
    model: ModelController,
    target: Arc<Mutex<Option<ThreadId>>>,
    step: Arc<AtomicU8>,
    two_resets: bool,
}

impl Script {
    fn csts(&self) -> u32 {
        let v = self.model.read32(CSTS);
        let mine = *self.target.lock().unwrap() == Some(std::thread::current().id());
        if !mine {
            return v;
        }
        match self.step.load(Ordering::SeqCst) {
            1 => {
                self.step.store(2, Ordering::SeqCst);
                v | CSTS_CFS
            }
            2 => {
                self.step.store(3, Ordering::SeqCst);
                assert_eq!(
                    self.model.release_delayed(),
                    1,
                    "the Format NVM's completion"
                );
                v
            }
            3 if self.two_resets && self.model.delayed_completions() > 0 => {
                self.step.store(4, Ordering::SeqCst);
                v | CSTS_CFS
            }
            _ => v,
        }
    }
}

impl Hooks for Script {
    fn model(&self) -> &ModelController {
        &self.model
    }
    fn read32(&self, offset: usize) -> u32 {
        if offset == CSTS {
            return self.csts();
        }
        self.model.read32(offset)
    }
}

/// Runs the script: a Format NVM whose completion is held; once held, the
/// pair (this thread) re-creates its queues, then sees CFS, resets (the
/// reset reaps the format's completion), and with `two_resets` resets once
/// more right after. Returns the format's result and the resets counted.
fn run_script(two_resets: bool) -> (upnvme::Result<upnvme::Namespace>, u64) {
    let m = ModelController::new(cfg_two_512());
    let dev = Script {
        model: m.clone(),
        target: Arc::new(Mutex::new(None)),
        step: Arc::new(AtomicU8::new(0)),
        two_resets,
    };
    let c = Controller::with_device(Front(dev.clone()), mmio_opts()).unwrap();
    let two = c.namespace(2).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            command_timeout: None,
            ..QueuePairOptions::default()
        })
        .unwrap();
    let buf = c.alloc_dma(4096).unwrap();
    hold_format(&m);
    let fmt = start_format(c, Duration::from_secs(20));
    wait_held(&m, 1);
    // The format's own reset (a pair exists) is behind us: re-create now.
    let buf = qp
        .write_blocking(&two, 0, 8, buf, Duration::from_secs(2))
        .expect("I/O on namespace 2 during the format");
    // A read the controller loses keeps a command in flight, so that the
    // polled path reads CSTS (every 100 ms with commands in flight).
    m.inject(Fault::DropCompletion(Match::Queue(qp.qid())));
    qp.submit(
        upnvme::IoCommand::Read {
            ns: &two,
            slba: 0,
            blocks: 8,
        },
        Some(buf),
        1,
    )
    .unwrap();
    if two_resets {
        m.inject(Fault::DelayCompletion {
            on: Match::Opcode {
                qid: 0,
                opcode: CREATE_IO_CQ,
            },
            doorbells: None,
        });
    }
    *dev.target.lock().unwrap() = Some(std::thread::current().id());
    dev.step.store(1, Ordering::SeqCst);
    let start = Instant::now();
    while !fmt.is_finished() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the format never ended"
        );
        let _ = qp.process_completions(u32::MAX, |_, _| {});
        std::thread::sleep(Duration::from_micros(50));
    }
    let (c, r) = fmt.join().unwrap();
    assert!(
        dev.step.load(Ordering::SeqCst) >= 3,
        "the script did not run"
    );
    if two_resets {
        assert_eq!(dev.step.load(Ordering::SeqCst), 4, "no second reset");
    }
    let resets = c.resets();
    drop(qp);
    drop(c);
    (r, resets)
}

/// Control: the Format NVM's completion is posted, reaped by a reset on
/// the pair's thread (epoch E), and kept over that reset for the waiter:
/// the format returns its own (successful) completion.
#[test]
fn a_format_completion_reaped_before_one_reset_reaches_its_waiter() {
    let (r, resets) = run_script(false);
    // The format's own reset, and the pair's.
    assert_eq!(resets, 2);
    let ns = r.expect("the format completed, and its completion was reaped");
    assert_eq!(ns.lba_size(), 4096);
}

/// The same, with a second reset right after the first (before the
/// waiter's next look, 200 µs later): the completion the driver reaped is
/// kept while its waiter waits (the first version kept only completions
/// reaped in the current epoch, so the format that succeeded ended with
/// ControllerReset).
/// (Timing: the second reset must win the admin lock against the waiter at
/// two unlock points; the pair's thread re-locks within microseconds, the
/// waiter sleeps in the futex. Twenty rounds make a chance win of the
/// waiter in every round practically impossible.)
#[test]
fn a_format_completion_reaped_before_two_resets_is_not_lost() {
    for round in 0..20 {
        let (r, resets) = run_script(true);
        assert_eq!(resets, 3, "round {round}");
        match r {
            Ok(ns) => assert_eq!(ns.lba_size(), 4096),
            Err(e) => panic!(
                "round {round}: the Format NVM completed with success and the driver reaped \
                 its completion before any reset, yet format_nvm returned {e:?}"
            ),
        }
    }
}

/// A reset meanwhile — "an automatic one after a fatal status" included —
/// ends the wait with `Error::Io { ControllerReset }`, also when the waiter
/// itself sees CSTS.CFS (every 16th look) and `with_admin` resets (the
/// first version returned `ControllerFatal` there, and read CSTS before
/// reaping, so a completion already in the CQ was not looked at).
#[test]
fn a_fatal_status_during_a_format_ends_it_with_controller_reset_as_documented() {
    let m = ModelController::new(cfg_two_512());
    let c = open(&m, mmio_opts());
    let qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    hold_format(&m);
    let fmt = start_format(c, Duration::from_secs(20));
    wait_held(&m, 1);
    m.set_fatal();
    let t = Instant::now();
    let (c, r) = fmt.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(c.resets() >= 2, "the fatal status was answered by a reset");
    assert!(c.failure().is_none(), "{:?}", c.failure());
    drop(qp);
    drop(c);
    match r {
        Err(upnvme::Error::Io {
            error: IoError::ControllerReset,
            ..
        }) => {}
        other => panic!("documented: Io {{ ControllerReset }}; got {other:?}"),
    }
}

// ------------------------------------------------------ other endings

/// Surprise removal during the wait: bounded (CSTS every 16th look),
/// ControllerGone, controller failed.
#[test]
fn an_unplug_during_a_format_ends_the_wait_promptly() {
    let m = ModelController::new(cfg_two_512());
    let c = open(&m, mmio_opts());
    hold_format(&m);
    let fmt = start_format(c, Duration::from_secs(20));
    wait_held(&m, 1);
    m.unplug();
    let t = Instant::now();
    let (c, r) = fmt.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(
        matches!(r, Err(upnvme::Error::ControllerGone { .. })),
        "{r:?}"
    );
    assert!(c.failure().is_some());
    drop(c);
}

/// The kernel's release request during the wait: ControllerRemoved at the
/// next look (the release thread takes no admin lock).
#[test]
fn a_release_request_during_a_format_ends_the_wait() {
    let m = ModelController::new(cfg_two_512());
    m.offer_release_request();
    let c = open(&m, mmio_opts());
    hold_format(&m);
    let fmt = start_format(c, Duration::from_secs(20));
    wait_held(&m, 1);
    m.request_release();
    let t = Instant::now();
    let (c, r) = fmt.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(
        matches!(r, Err(upnvme::Error::ControllerRemoved { .. })),
        "{r:?}"
    );
    assert!(m.is_released());
    drop(c);
}

/// No answer within the format's timeout: Timeout, controller failed; its
/// late completion, reaped by the next reset in the old epoch, is never
/// taken for the next format (a fresh admin queue hands the same CID out
/// again).
#[test]
fn a_timed_out_format_fails_the_controller_and_its_late_completion_is_not_taken_later() {
    let m = ModelController::new(cfg_two_512());
    let c = open(&m, mmio_opts());
    hold_format(&m);
    let t = Instant::now();
    let fmt = start_format(c, Duration::from_millis(300));
    let (mut c, r) = fmt.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(matches!(r, Err(upnvme::Error::Timeout { .. })), "{r:?}");
    assert!(c.failure().is_some());
    // The late completion (success) is posted; the reset reaps it.
    assert_eq!(m.release_delayed(), 1);
    c.reset().unwrap();
    // The next format is refused by the controller: its own status, not
    // the old command's success.
    m.inject(Fault::Status {
        on: Match::Opcode {
            qid: 0,
            opcode: FORMAT_NVM,
        },
        status: upnvme_tests::Status::INTERNAL_ERROR,
    });
    let r = c.format_nvm(1, &FormatNvm::lbaf(0));
    assert!(
        matches!(r, Err(upnvme::Error::Command { .. })),
        "the next format took another command's completion: {r:?}"
    );
    drop(c);
}

/// I/O on namespace 2 while the format runs, then the format completes:
/// namespace 2's data intact, the format's result its own.
#[test]
fn io_on_another_namespace_during_a_format_and_its_own_completion() {
    let m = ModelController::new(cfg_two_512());
    let c = open(&m, mmio_opts());
    let two = c.namespace(2).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let buf = c.alloc_dma(4096).unwrap();
    hold_format(&m);
    let fmt = start_format(c, Duration::from_secs(20));
    wait_held(&m, 1);
    let data: Vec<u8> = (0..4096).map(|i| (i * 13) as u8).collect();
    buf.write_bytes(0, &data).unwrap();
    let mut buf = qp
        .write_blocking(&two, 16, 8, buf, Duration::from_secs(2))
        .unwrap();
    for _ in 0..20 {
        buf.fill(0, 4096, 0).unwrap();
        buf = qp
            .read_blocking(&two, 16, 8, buf, Duration::from_secs(2))
            .unwrap();
        assert_eq!(read_back(&buf, 4096), data);
    }
    assert_eq!(m.delayed_completions(), 1);
    m.release_delayed();
    let (c, r) = fmt.join().unwrap();
    assert_eq!(r.unwrap().lba_size(), 4096);
    drop(qp);
    drop(c);
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

// ---------------------------------------------------------------------------
// A long Format NVM does not hold the admin queue: a pair on another thread
// re-creates its queues after the format's reset and runs I/O on another
// namespace while the format is still in the controller's hands. Before, the
// Format NVM held the admin lock for its whole run, and the pair's next
// call waited for it (up to the format's timeout).
// ---------------------------------------------------------------------------

#[test]
fn a_pair_runs_io_on_another_namespace_while_a_format_nvm_is_outstanding() {
    let m = ModelController::new(cfg_two_512());
    let c = open(&m, mmio_opts());
    let two = c.namespace(2).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let buf = c.alloc_dma(4096).unwrap();
    // The controller holds the Format NVM's completion until released.
    hold_format(&m);
    let fmt = start_format(c, Duration::from_secs(3));
    wait_held(&m, 1);
    // The format's reset deleted the pair's queues: this call re-creates
    // them (admin commands) and then writes and reads namespace 2.
    let t = Instant::now();
    let data: Vec<u8> = (0..4096).map(|i| (i * 7) as u8).collect();
    buf.write_bytes(0, &data).unwrap();
    let buf = qp
        .write_blocking(&two, 8, 8, buf, Duration::from_secs(2))
        .expect("write on namespace 2 during the format");
    buf.fill(0, 4096, 0).unwrap();
    let buf = qp
        .read_blocking(&two, 8, 8, buf, Duration::from_secs(2))
        .expect("read on namespace 2 during the format");
    let took = t.elapsed();
    assert_eq!(read_back(&buf, 4096), data);
    assert_eq!(
        m.delayed_completions(),
        1,
        "the Format NVM ended before the pair's I/O did ({took:?}): the pair waited for it"
    );
    m.release_delayed();
    let (c, r) = fmt.join().unwrap();
    let new = r.expect("format");
    assert_eq!(new.lba_size(), 4096);
    drop(qp);
    drop(c);
    assert!(m.violations().is_empty(), "{:?}", m.violations());
    assert_eq!(m.dma_faults(), 0);
}

/// A controller reset on another thread while the Format NVM is outstanding
/// (here: a pair's timeout recovery — a read whose completion is lost,
/// aborted without answer, then a reset) ends the format's wait with
/// `IoError::ControllerReset` instead of leaving it to its timeout; the
/// namespace is read again all the same (the model ran the format before it
/// held the completion: 4096-byte blocks now).
#[test]
fn a_reset_while_a_format_nvm_is_outstanding_ends_its_wait() {
    let m = ModelController::new(cfg_two_512());
    let c = open(&m, mmio_opts());
    let two = c.namespace(2).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            command_timeout: Some(Duration::from_millis(50)),
            ..QueuePairOptions::default()
        })
        .unwrap();
    let buf = c.alloc_dma(4096).unwrap();
    hold_format(&m);
    let fmt = start_format(c, Duration::from_secs(20));
    wait_held(&m, 1);
    m.inject(upnvme_tests::Fault::DropCompletion(
        upnvme_tests::Match::Queue(qp.qid()),
    ));
    let t = Instant::now();
    let r = qp.read_blocking(&two, 0, 8, buf, Duration::from_secs(5));
    assert!(r.is_err(), "the lost read completed");
    let (c, r) = fmt.join().unwrap();
    let waited = t.elapsed();
    match r {
        Err(upnvme::Error::Io {
            error: IoError::ControllerReset,
            ..
        }) => {}
        other => panic!("format after {waited:?}: {other:?}"),
    }
    assert!(
        waited < Duration::from_secs(10),
        "the format waited for its timeout ({waited:?})"
    );
    assert_eq!(c.namespace(1).unwrap().lba_size(), 4096, "read again");
    drop(qp);
    drop(c);
    assert_eq!(m.dma_faults(), 0);
}

/// On a small admin queue (6 entries: 3 event requests and the driver's two
/// identifiers leave none for the application) the Format NVM, the driver's
/// own command, still waits without the admin lock: a pair re-creates its
/// queues and writes namespace 2 meanwhile (a review found the format
/// waiting under the lock there, the pair's write timing out behind it).
#[test]
fn a_pair_runs_io_on_another_namespace_during_a_format_on_a_six_entry_admin_queue() {
    let m = ModelController::new(cfg_two_512());
    let c = open(
        &m,
        ControllerOptions {
            admin_queue_entries: 6,
            ..mmio_opts()
        },
    );
    let two = c.namespace(2).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let buf = c.alloc_dma(4096).unwrap();
    hold_format(&m);
    let fmt = start_format(c, Duration::from_secs(3));
    wait_held(&m, 1);
    let data: Vec<u8> = (0..4096).map(|i| (i * 7) as u8).collect();
    buf.write_bytes(0, &data).unwrap();
    let buf = qp
        .write_blocking(&two, 8, 8, buf, Duration::from_secs(2))
        .expect("a write on namespace 2 during the format");
    assert_eq!(m.delayed_completions(), 1, "the format ended first");
    m.release_delayed();
    let (c, f) = fmt.join().unwrap();
    f.expect("the format");
    drop(buf);
    drop(qp);
    drop(c);
}

// ---------------------------------------------------------------------------
// The two halves (`format_nvm_run` with `&self`, `format_nvm_finish` with
// `&mut self`): while one thread's format waits, other threads use the same
// controller — admin commands, Identify Namespace of the namespace being
// formatted — and the finish reads the namespace again.
// ---------------------------------------------------------------------------

#[test]
fn other_threads_use_the_controller_while_format_nvm_run_waits() {
    let m = ModelController::new(cfg_two_512());
    let mut c = open(&m, mmio_opts());
    let old = c.namespace(1).unwrap().clone();
    hold_format(&m);
    let run = std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            c.format_nvm_run(
                1,
                &FormatNvm {
                    timeout: Some(Duration::from_secs(20)),
                    ..FormatNvm::lbaf(4)
                },
            )
        });
        wait_held(&m, 1);
        // The same controller, shared, while the format is outstanding.
        for _ in 0..5 {
            assert_eq!(c.identify_controller().unwrap().sn, c.identify().sn);
            // The model formats at fetch and holds only the completion:
            // Identify already shows 512 blocks of 4096 bytes.
            let ns = c.identify_namespace(1).unwrap();
            assert_eq!(ns.nsze, 512);
        }
        assert!(
            old.is_stale(),
            "the handle was not retired before the command"
        );
        assert_eq!(m.delayed_completions(), 1);
        m.release_delayed();
        waiter.join().unwrap()
    });
    assert_eq!(run.nsid(), 1);
    assert!(run.succeeded());
    // Until the finish, the retired handle is what the controller lists.
    assert!(c.namespace(1).unwrap().is_stale());
    let fresh = c.format_nvm_finish(run).unwrap();
    assert_eq!(fresh.lba_size(), 4096);
    assert!(!fresh.is_stale());
    assert_eq!(c.namespace(1).unwrap().lba_size(), 4096);
    assert_eq!(c.namespace(2).unwrap().lba_size(), 512);
    assert!(m.violations().is_empty(), "{:?}", m.violations());
}

/// A run handed to another controller's finish is refused and changes
/// nothing there; it is consumed, so its own controller's handle stays
/// retired until a namespace refresh reads it again.
#[test]
fn format_nvm_finish_refuses_a_run_of_another_controller() {
    let (m1, m2) = (
        ModelController::new(cfg_two_512()),
        ModelController::new(cfg_two_512()),
    );
    let (mut c1, mut c2) = (open(&m1, mmio_opts()), open(&m2, mmio_opts()));
    let run = c1.format_nvm_run(1, &FormatNvm::lbaf(4));
    let e = c2.format_nvm_finish(run).unwrap_err();
    assert!(
        matches!(&e, upnvme::Error::InvalidArgument(s) if s.contains("format_nvm_run")),
        "{e}"
    );
    assert_eq!(c2.namespace(1).unwrap().lba_size(), 512);
    assert!(!c2.namespace(1).unwrap().is_stale());
    // The run was consumed: c1's handle stays retired until a refresh.
    assert!(c1.namespace(1).unwrap().is_stale());
    c1.refresh_namespaces().unwrap();
    assert_eq!(c1.namespace(1).unwrap().lba_size(), 4096);
}

/// Checks that refuse the format retire nothing: the finish returns the
/// refusal and the handle stays current.
#[test]
fn a_refused_format_nvm_run_retires_nothing() {
    let m = ModelController::new(cfg_two_512());
    let mut c = open(&m, mmio_opts());
    let run = c.format_nvm_run(1, &FormatNvm::lbaf(15));
    assert!(!run.succeeded());
    assert!(!c.namespace(1).unwrap().is_stale());
    let e = c.format_nvm_finish(run).unwrap_err();
    assert!(matches!(e, upnvme::Error::InvalidArgument(_)), "{e}");
    assert!(!c.namespace(1).unwrap().is_stale());
    assert_eq!(c.namespace(1).unwrap().lba_size(), 512);
}
