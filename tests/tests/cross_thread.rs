//! Where threads meet (in-memory model): a Format NVM or a reset on one
//! thread against commands a queue pair on another thread has queued, or
//! is announcing; a release request during a doorbell write; pairs dropped
//! under concurrent resets; a reset that panics. From a concurrency review
//! (thirty-fifth session): the two Format NVM tests and the panic test
//! failed before the fixes (Format NVM resets the controller first while
//! any pair exists; a reset clears its "resetting" bit however it ends).

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::{Front, Hooks, open, opts, read_back};
use upnvme::{
    Completion, Controller, ControllerOptions, Device, DmaBuffer, FormatNvm, IoCommand, IoError,
    QueuePairOptions, Reject,
};
use upnvme_tests::{ModelConfig, ModelController, NamespaceConfig};

/// One namespace of 512-byte blocks; the model's LBA format 4 is 4096 bytes.
fn cfg_512() -> ModelConfig {
    ModelConfig {
        namespaces: vec![NamespaceConfig {
            nsid: 1,
            lba_size: 512,
            blocks: 4096,
            ..NamespaceConfig::default()
        }],
        ..ModelConfig::default()
    }
}

/// MMIO doorbells only, so every SQ tail update is one `write32`.
fn mmio_opts() -> ControllerOptions {
    ControllerOptions {
        shadow_doorbells: false,
        ..opts()
    }
}

/// Polls until one completion arrives (bounded).
fn wait_completion<D: Device>(qp: &mut upnvme::IoQueuePair<D>) -> Completion {
    let start = Instant::now();
    loop {
        if let Some(c) = qp.next_completion().expect("next_completion") {
            return c;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no completion within 5 s"
        );
        std::thread::yield_now();
    }
}

/// A 4 KiB DMA buffer split into eight 512-byte pieces: disjoint buffers
/// that different owners may hold at once (`DmaBuffer::split`'s contract).
fn eight_pieces<D: Device>(c: &Controller<D>) -> Vec<DmaBuffer> {
    let pieces = c.alloc_dma(4096).unwrap().split(512).unwrap();
    assert_eq!(pieces.len(), 8);
    pieces
}

// ---------------------------------------------------------------------------
// A device in front of the model that can hold one doorbell write: the thread
// that writes it has passed every check of `submit` (including the state-word
// check right before the doorbell) and is "preempted" inside the write, as a
// thread can be at any instruction; or that panics once in a CC write.
// ---------------------------------------------------------------------------

#[derive(Default)]
struct GateState {
    /// BAR offset of the doorbell to hold (usize::MAX: none). One-shot.
    armed: AtomicUsize,
    /// 0 idle, 1 a writer waits at the gate, 2 released.
    phase: Mutex<u8>,
    /// Panic once on the next CC write (a `Device` implementation bug, or
    /// any panic inside `reset_locked`). One-shot.
    panic_on_cc: AtomicBool,
    cv: Condvar,
}

#[derive(Clone)]
struct Gate {
    model: ModelController,
    g: Arc<GateState>,
}

impl Gate {
    fn new(model: ModelController) -> Gate {
        let g = Arc::new(GateState::default());
        g.armed.store(usize::MAX, Ordering::SeqCst);
        Gate { model, g }
    }
    fn arm(&self, offset: usize) {
        *self.g.phase.lock().unwrap() = 0;
        self.g.armed.store(offset, Ordering::SeqCst);
    }
    /// Waits until a writer is held at the gate.
    fn wait_held(&self) {
        let p = self.g.phase.lock().unwrap();
        let (p, t) = self
            .g
            .cv
            .wait_timeout_while(p, Duration::from_secs(5), |p| *p != 1)
            .unwrap();
        assert!(!t.timed_out() && *p == 1, "no writer reached the gate");
    }
    fn open(&self) {
        *self.g.phase.lock().unwrap() = 2;
        self.g.cv.notify_all();
    }
}

impl Hooks for Gate {
    fn model(&self) -> &ModelController {
        &self.model
    }
    fn write32(&self, offset: usize, value: u32) {
        if offset == 0x14 && self.g.panic_on_cc.swap(false, Ordering::SeqCst) {
            panic!("injected panic in a CC write");
        }
        if self
            .g
            .armed
            .compare_exchange(offset, usize::MAX, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            let mut p = self.g.phase.lock().unwrap();
            *p = 1;
            self.g.cv.notify_all();
            let (p, _) = self
                .g
                .cv
                .wait_timeout_while(p, Duration::from_secs(10), |p| *p != 2)
                .unwrap();
            drop(p);
        }
        self.model.write32(offset, value);
    }
}

/// BAR offset of I/O SQ `qid`'s tail doorbell.
fn sq_tail_doorbell(m: &ModelController, qid: u16) -> usize {
    let dstrd = (m.read64(0) >> 32) & 0xf;
    0x1000 + (2 * qid as usize) * (4usize << dstrd)
}

// ---------------------------------------------------------------------------
// Format NVM on one thread against commands a pair on another thread has
// already checked against the old geometry. Before the fix, a command queued
// before the format and announced after it ran with the NEW LBA size, and
// the device wrote past the command's buffer into memory another owner held.
// ---------------------------------------------------------------------------

/// Thread B queues a one-block Read of 512-byte-block
/// namespace 1 into a 512-byte piece of a split buffer; the main thread
/// formats the namespace to 4096-byte blocks (`format_nvm` returns Ok and
/// retires the old handle); B then rings. The queued SQE says "NLB 0",
/// which the controller would now take as 4096 bytes, over the pieces the
/// main thread owns: the format's reset must end the command first.
#[test]
fn a_format_on_another_thread_ends_a_queued_read_before_it_can_overrun_its_buffer() {
    let m = ModelController::new(cfg_512());
    let mut c = open(&m, mmio_opts());
    let old = c.namespace(1).unwrap().clone();
    let mut pieces = eight_pieces(&c);
    let mine = pieces.remove(1);
    mine.fill(0, 512, 0xa5).unwrap();
    let theirs = pieces.remove(0);
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();

    let (to_main, from_b) = mpsc::channel::<()>();
    let (to_b, from_main) = mpsc::channel::<()>();
    let b = std::thread::spawn(move || {
        qp.queue(
            IoCommand::Read {
                ns: &old,
                slba: 0,
                blocks: 1,
            },
            Some(theirs),
            1,
        )
        .expect("queued while the handle is current");
        to_main.send(()).unwrap();
        from_main.recv().unwrap();
        // The format has returned on the other thread; the handle is stale.
        assert!(old.is_stale());
        qp.ring();
        let done = wait_completion(&mut qp);
        drop(qp);
        done
    });
    from_b.recv().unwrap();
    let new = c.format_nvm(1, &FormatNvm::lbaf(4)).expect("format");
    assert_eq!(new.lba_size(), 4096);
    to_b.send(()).unwrap();
    let done = b.join().unwrap();

    let after = read_back(&mine, 512);
    assert!(
        after.iter().all(|&b| b == 0xa5),
        "the device wrote into a buffer the command does not own (first bytes {:02x?}); the \
         queued Read ended with {:?}",
        &after[..8],
        done.result
    );
    assert!(
        matches!(done.result, Err(IoError::ControllerReset)),
        "a command sized by a geometry a returned Format NVM retired ended with {:?}",
        done.result
    );
    assert!(
        done.buffer.is_some(),
        "the buffer comes back with the command"
    );
}

/// The `submit` form: B's `submit` passes every check (the handle current,
/// the state word unchanged) and is held inside its SQ doorbell write — a
/// preemption at that instruction. The format runs and returns on the main
/// thread; B's doorbell store then lands on a queue the format's reset
/// deleted, and the old-geometry Read never runs.
#[test]
fn a_format_between_a_submissions_checks_and_its_doorbell_does_not_run_the_old_command() {
    let m = ModelController::new(cfg_512());
    let gate = Gate::new(m.clone());
    let mut c = Controller::with_device(Front(gate.clone()), mmio_opts()).unwrap();
    let old = c.namespace(1).unwrap().clone();
    let mut pieces = eight_pieces(&c);
    let mine = pieces.remove(1);
    mine.fill(0, 512, 0xa5).unwrap();
    let theirs = pieces.remove(0);
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    gate.arm(sq_tail_doorbell(&m, qp.qid()));

    let b = std::thread::spawn(move || {
        qp.read(&old, 0, 1, theirs, 1).expect("submitted");
        let done = wait_completion(&mut qp);
        drop(qp);
        done
    });
    gate.wait_held();
    let new = c.format_nvm(1, &FormatNvm::lbaf(4)).expect("format");
    assert_eq!(new.lba_size(), 4096);
    gate.open();
    let done = b.join().unwrap();

    let after = read_back(&mine, 512);
    assert!(
        after.iter().all(|&b| b == 0xa5),
        "the device wrote into a buffer the command does not own (first bytes {:02x?}); the \
         Read ended with {:?}",
        &after[..8],
        done.result
    );
    assert!(
        matches!(done.result, Err(IoError::ControllerReset)),
        "the held command ended with {:?}",
        done.result
    );
    assert!(
        done.buffer.is_some(),
        "the buffer comes back with the command"
    );
    // The late doorbell named a queue the reset deleted: nothing ran, and
    // the model saw no DMA. (The write itself is the one thing it records:
    // a preempted thread's doorbell cannot be taken back, after a format's
    // reset as after any other.)
    assert_eq!(
        m.violations(),
        ["SQ 1 tail doorbell written (1) but the queue does not exist"]
    );
    assert_eq!(m.dma_faults(), 0, "DMA faults: {:?}", m.dma_fault_log());
}

// ---------------------------------------------------------------------------
// Behaviour that was already right, kept pinned.
// ---------------------------------------------------------------------------

/// `retire()`/`is_stale()` are Relaxed, which is enough: a
/// submission that happens-after `format_nvm` returned (here through a
/// channel) reads the `true` the format stored before it (write-read
/// coherence), on the plain path (`plain_key`) and the general path
/// (`retired`) alike.
#[test]
fn a_submission_after_a_format_returned_on_another_thread_is_refused_as_stale() {
    let m = ModelController::new(cfg_512());
    let mut c = open(&m, opts());
    let old = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let bufs: Vec<DmaBuffer> = (0..2).map(|_| c.alloc_dma(4096).unwrap()).collect();
    let (tx, rx) = mpsc::channel::<()>();
    let b = std::thread::spawn(move || {
        rx.recv().unwrap();
        let mut reasons = Vec::new();
        for (i, buf) in bufs.into_iter().enumerate() {
            // Plain path (a Read of a whole buffer) and general path
            // (a Write Zeroes is not plain).
            let cmd = if i == 0 {
                IoCommand::Read {
                    ns: &old,
                    slba: 0,
                    blocks: 1,
                }
            } else {
                IoCommand::WriteZeroes {
                    ns: &old,
                    slba: 0,
                    blocks: 1,
                    deallocate: false,
                }
            };
            let r = qp.submit(cmd, Some(buf), i as u64).unwrap_err();
            reasons.push(r.reason);
        }
        reasons
    });
    c.format_nvm(1, &FormatNvm::lbaf(4)).unwrap();
    tx.send(()).unwrap();
    let reasons = b.join().unwrap();
    assert_eq!(
        reasons,
        vec![Reject::StaleNamespace { nsid: 1 }; 2],
        "both paths see the retirement"
    );
}

/// A reset on another thread
/// does fence commands queued before it: `ring` finds the state word changed
/// and ends them with `ControllerReset` (buffers back) instead of announcing
/// them to the re-enabled controller.
#[test]
fn a_reset_on_another_thread_ends_commands_queued_before_it() {
    let m = ModelController::new(cfg_512());
    let c = open(&m, mmio_opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let buf = c.alloc_dma(512).unwrap();
    qp.queue(
        IoCommand::Read {
            ns: &ns,
            slba: 0,
            blocks: 1,
        },
        Some(buf),
        1,
    )
    .unwrap();
    let fetched = m.commands_fetched();
    let c = Arc::new(c);
    let c2 = c.clone();
    std::thread::spawn(move || c2.reset().unwrap())
        .join()
        .unwrap();
    let after_reset = m.commands_fetched();
    qp.ring();
    let done = wait_completion(&mut qp);
    assert_eq!(done.result, Err(IoError::ControllerReset));
    assert!(done.buffer.is_some());
    // Only the pair's own re-creation (2 admin commands) was fetched since.
    assert!(
        m.commands_fetched() - after_reset <= 2,
        "{fetched} {after_reset}"
    );
    drop(qp);
    common::assert_clean(&m);
}

/// A submission held inside its doorbell write while the
/// kernel's release request is served on the watcher thread: the release
/// disables the controller and releases the device, the late doorbell
/// reaches a device that no longer fetches, and the command ends exactly
/// once with `ControllerRemoved` and its buffer.
#[test]
fn a_release_during_a_doorbell_write_ends_the_command_once_with_its_buffer() {
    let m = ModelController::new(cfg_512());
    m.offer_release_request();
    let gate = Gate::new(m.clone());
    let c = Controller::with_device(Front(gate.clone()), mmio_opts()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let buf = c.alloc_dma(512).unwrap();
    buf.fill(0, 512, 0x5a).unwrap();
    gate.arm(sq_tail_doorbell(&m, qp.qid()));
    let b = std::thread::spawn(move || {
        qp.read(&ns, 0, 1, buf, 9).expect("submitted");
        let start = Instant::now();
        let mut out = Vec::new();
        while out.is_empty() && start.elapsed() < Duration::from_secs(5) {
            let _ = qp.process_completions(u32::MAX, |_, c| out.push(c));
        }
        // Nothing more comes.
        for _ in 0..1000 {
            let _ = qp.process_completions(u32::MAX, |_, c| out.push(c));
        }
        out
    });
    gate.wait_held();
    m.request_release();
    let start = Instant::now();
    while !m.is_released() {
        assert!(start.elapsed() < Duration::from_secs(3));
        std::thread::sleep(Duration::from_millis(2));
    }
    // Let the state word update land too.
    std::thread::sleep(Duration::from_millis(20));
    gate.open();
    let out = b.join().unwrap();
    assert_eq!(out.len(), 1, "exactly once");
    assert_eq!(out[0].tag, 9);
    assert_eq!(out[0].result, Err(IoError::ControllerRemoved));
    let back = out[0].buffer.as_ref().expect("with its buffer");
    assert!(
        read_back(back, 512).iter().all(|&b| b == 0x5a),
        "the released device did not run the late command"
    );
    drop(c);
}

/// A pair dropped on one thread while another thread resets
/// the controller in a loop: every drop either deletes its queues or finds
/// them gone with the reset, queue IDs are never lost or shared, and the
/// model sees no DMA fault (no freed ring or buffer reached by the device).
#[test]
fn pairs_created_and_dropped_under_concurrent_resets_keep_qids_and_memory_straight() {
    let m = ModelController::new(ModelConfig {
        max_ioqpairs: 4,
        ..cfg_512()
    });
    let c = Arc::new(open(&m, mmio_opts()));
    let stop = Arc::new(AtomicBool::new(false));
    let resetter = {
        let (c, stop) = (c.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                c.reset().unwrap();
                n += 1;
                std::thread::sleep(Duration::from_micros(300));
            }
            n
        })
    };
    let workers: Vec<_> = (0..3)
        .map(|w| {
            let c = c.clone();
            std::thread::spawn(move || {
                let ns = c.namespace(1).unwrap().clone();
                let start = Instant::now();
                let mut made = 0u32;
                while start.elapsed() < Duration::from_millis(600) {
                    let mut qp = match c.io_queue_pair(QueuePairOptions::default()) {
                        Ok(qp) => qp,
                        Err(e) => panic!("worker {w}: {e}"),
                    };
                    made += 1;
                    for i in 0..4u64 {
                        let buf = c.alloc_dma(512).unwrap();
                        let _ = qp.read(&ns, i, 1, buf, i);
                    }
                    let _ = qp.process_completions(u32::MAX, |_, _| {});
                    // Dropped with commands possibly in flight.
                    drop(qp);
                }
                made
            })
        })
        .collect();
    let made: u32 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    let resets = resetter.join().unwrap();
    assert!(made > 0 && resets > 0);
    // Every qid is free again: as many pairs as granted can be made.
    let pairs: Vec<_> = (0..c.granted_io_queues())
        .map(|_| c.io_queue_pair(QueuePairOptions::default()).unwrap())
        .collect();
    drop(pairs);
    assert_eq!(m.dma_faults(), 0, "{:?}", m.dma_fault_log());
}

// ---------------------------------------------------------------------------
// A panic inside a reset. Before the fix it left STATE_RESETTING set for
// good, and every submission on every other thread then spun in
// `wait_for_reset` for ever (a hang, where the design promises a refusal).
// ---------------------------------------------------------------------------

/// A reset that panics (caught by the caller, as the C API's `catch_unwind`
/// does at every entry point) must still clear STATE_RESETTING and leave
/// the controller failed: a submission on another thread is refused instead
/// of looping in `Inner::wait_for_reset` for ever.
#[test]
fn a_panic_inside_a_reset_leaves_the_controller_failed_not_other_threads_hanging() {
    let m = ModelController::new(cfg_512());
    let bomb = Gate::new(m.clone());
    let c = Arc::new(Controller::with_device(Front(bomb.clone()), mmio_opts()).unwrap());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    bomb.g.panic_on_cc.store(true, Ordering::SeqCst);
    let c2 = c.clone();
    let caught = std::thread::spawn(move || {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c2.reset())).is_err()
    })
    .join()
    .unwrap();
    assert!(caught, "the injected panic happened inside the reset");
    let buf = c.alloc_dma(512).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = qp.read(&ns, 0, 1, buf, 1).map_err(|r| r.reason);
        let _ = tx.send(r);
        // Keep the pair alive on this thread.
        std::mem::forget(qp);
    });
    match rx.recv_timeout(Duration::from_secs(3)) {
        Ok(r) => assert!(
            r.is_err(),
            "submission on a controller whose reset panicked: {r:?}"
        ),
        Err(_) => panic!(
            "a submission on another thread still spins after 3 s: STATE_RESETTING was left \
             set by the panicking reset (Inner::wait_for_reset never returns)"
        ),
    }
}

/// A format with no queue pair resets nothing; with a pair it resets once,
/// and the pair — which had nothing in flight — carries on with the new
/// handle (its queues re-created at its next call), reading back what it
/// wrote after the format.
#[test]
fn a_format_resets_the_controller_only_while_a_queue_pair_exists() {
    let m = ModelController::new(cfg_512());
    let mut c = open(&m, mmio_opts());
    c.format_nvm(1, &FormatNvm::lbaf(4)).expect("format");
    assert_eq!(c.resets(), 0, "no pair: nothing to stop, no reset");

    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ns = c.format_nvm(1, &FormatNvm::lbaf(0)).expect("format");
    assert_eq!(c.resets(), 1, "a pair exists: one reset before the command");
    assert_eq!(ns.lba_size(), 512);
    let t = Duration::from_secs(5);
    let buf = c.alloc_dma(512).unwrap();
    buf.fill(0, 512, 0x5a).unwrap();
    let buf = qp
        .write_blocking(&ns, 7, 1, buf, t)
        .expect("write after the format");
    buf.fill(0, 512, 0).unwrap();
    let buf = qp
        .read_blocking(&ns, 7, 1, buf, t)
        .expect("read after the format");
    assert!(read_back(&buf, 512).iter().all(|&b| b == 0x5a));
    drop(qp);
    common::assert_clean(&m);
}
