//! Issue 7 on the model: command timeouts (Abort, then reset), explicit and
//! automatic controller resets, and what a queue pair sees — every command
//! completes exactly once, buffers come back only when the device is done, and
//! the handle works again afterwards.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{T, assert_clean, buffer_with, config_one_ns, open, opts, pattern, read_back};
use upnvme::{Completion, Error, IoCommand, IoError, IoQueuePair, Namespace, QueuePairOptions};
use upnvme_tests::{Fault, Match, ModelController};

const READ: u8 = 0x02;

fn qp_opts(timeout_ms: u64) -> QueuePairOptions {
    QueuePairOptions {
        entries: Some(16),
        command_timeout: Some(Duration::from_millis(timeout_ms)),
        ..Default::default()
    }
}

/// Submits a one-block read of LBA 0 into a new buffer, with `tag`.
fn submit_read(
    c: &upnvme::Controller<ModelController>,
    qp: &mut IoQueuePair<ModelController>,
    ns: &Namespace,
    tag: u64,
) {
    let cmd = IoCommand::Read {
        ns,
        slba: 0,
        blocks: 1,
    };
    qp.submit(cmd, Some(c.alloc_dma(4096).unwrap()), tag)
        .unwrap();
}

/// Polls until `n` completions arrived (bounded).
fn collect<D: upnvme::Device>(qp: &mut IoQueuePair<D>, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let start = Instant::now();
    while out.len() < n {
        assert!(
            start.elapsed() < T * 2,
            "only {} of {n} completions",
            out.len()
        );
        match qp.process_completions(u32::MAX, |_, c| out.push(c)) {
            Ok(_) => {}
            Err(e) => panic!("process_completions: {e}"),
        }
    }
    out
}

#[test]
fn overdue_command_is_aborted_and_completes_once_as_timed_out() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(50)).unwrap();
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode {
            qid: qp.qid(),
            opcode: READ,
        },
        doorbells: None,
    });
    let b = c.alloc_dma(4096).unwrap();
    qp.submit(
        IoCommand::Read {
            ns: &ns,
            slba: 3,
            blocks: 1,
        },
        Some(b),
        11,
    )
    .unwrap();
    let done = collect(&mut qp, 1);
    assert_eq!(done[0].tag, 11);
    assert_eq!(done[0].result, Err(IoError::TimedOut));
    assert!(
        done[0].buffer.is_some(),
        "the aborted command's buffer comes back"
    );
    assert_eq!(qp.stats().aborts, 1);
    assert_eq!(c.resets(), 0, "the Abort was enough");
    // The pair keeps working.
    let b = qp
        .read_blocking(&ns, 3, 1, c.alloc_dma(4096).unwrap(), T)
        .unwrap();
    drop(b);
    drop(qp);
    assert_clean(&m);
}

#[test]
fn lost_completion_leads_to_reset_and_exactly_once_completion() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(50)).unwrap();
    // Data written before the trouble must survive the reset.
    let data = pattern(5, 4096);
    qp.write_blocking(&ns, 7, 1, buffer_with(&c, &data), T)
        .unwrap();
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: qp.qid(),
        opcode: READ,
    }));
    for i in 0..4u64 {
        let b = c.alloc_dma(4096).unwrap();
        qp.submit(
            IoCommand::Read {
                ns: &ns,
                slba: i,
                blocks: 1,
            },
            Some(b),
            i,
        )
        .unwrap();
    }
    let done = collect(&mut qp, 4);
    let tags: HashSet<u64> = done.iter().map(|c| c.tag).collect();
    assert_eq!(tags.len(), 4, "each command completed exactly once");
    assert!(done.iter().all(|c| c.buffer.is_some()));
    let lost: Vec<_> = done.iter().filter(|c| c.result.is_err()).collect();
    assert_eq!(lost.len(), 1, "{done:?}");
    assert_eq!(lost[0].result, Err(IoError::TimedOut));
    assert_eq!(
        c.resets(),
        1,
        "the Abort could not find the lost command: reset"
    );
    assert_eq!(qp.stats().timeout_resets, 1);
    // After the reset the same handle works and the data is intact.
    let b = qp
        .read_blocking(&ns, 7, 1, c.alloc_dma(4096).unwrap(), T)
        .unwrap();
    assert_eq!(read_back(&b, 4096), data);
    // Nothing more arrives later.
    std::thread::sleep(Duration::from_millis(120));
    let mut late = 0;
    qp.process_completions(u32::MAX, |_, _| late += 1).unwrap();
    assert_eq!(late, 0);
    drop(qp);
    assert!(m.take_violations().iter().all(|v| !v.contains("CQ full")));
    assert_eq!(m.dma_faults(), 0);
}

#[test]
fn explicit_reset_ends_in_flight_commands_once_and_pairs_recover() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut a = c.io_queue_pair(qp_opts(60_000)).unwrap();
    let mut b = c.io_queue_pair(qp_opts(60_000)).unwrap();
    for i in 0..3u64 {
        m.inject(Fault::DelayCompletion {
            on: Match::Queue(a.qid()),
            doorbells: None,
        });
        a.submit(
            IoCommand::Read {
                ns: &ns,
                slba: i,
                blocks: 1,
            },
            Some(c.alloc_dma(4096).unwrap()),
            i,
        )
        .unwrap();
    }
    // Queued but never rung: also ended by the reset.
    b.queue(
        IoCommand::Read {
            ns: &ns,
            slba: 9,
            blocks: 1,
        },
        Some(c.alloc_dma(4096).unwrap()),
        99,
    )
    .unwrap();
    c.reset().unwrap();
    assert_eq!(c.resets(), 1);
    let done = collect(&mut a, 3);
    assert!(
        done.iter()
            .all(|x| x.result == Err(IoError::ControllerReset) && x.buffer.is_some())
    );
    let done_b = collect(&mut b, 1);
    assert_eq!(done_b[0].tag, 99);
    assert_eq!(done_b[0].result, Err(IoError::ControllerReset));
    // Both pairs work again under their old queue IDs.
    for qp in [&mut a, &mut b] {
        let data = pattern(qp.qid() as u64, 4096);
        qp.write_blocking(&ns, 20 + qp.qid() as u64, 1, buffer_with(&c, &data), T)
            .unwrap();
        let r = qp
            .read_blocking(&ns, 20 + qp.qid() as u64, 1, c.alloc_dma(4096).unwrap(), T)
            .unwrap();
        assert_eq!(read_back(&r, 4096), data);
    }
    // Released delayed completions from before the reset never surface.
    m.release_delayed();
    let mut late = 0;
    a.process_completions(u32::MAX, |_, _| late += 1).unwrap();
    assert_eq!(late, 0);
    drop((a, b));
    assert_clean(&m);
}

#[test]
fn fatal_status_mid_io_resets_automatically() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(60_000)).unwrap();
    m.inject(Fault::FatalOn(Match::Opcode {
        qid: qp.qid(),
        opcode: READ,
    }));
    let e = qp
        .read_blocking(
            &ns,
            0,
            1,
            c.alloc_dma(4096).unwrap(),
            Duration::from_secs(30),
        )
        .unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::Io {
                error: IoError::ControllerReset,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.buffer.is_some(),
        "the controller was disabled: the buffer is back"
    );
    assert_eq!(c.resets(), 1);
    qp.read_blocking(&ns, 0, 1, c.alloc_dma(4096).unwrap(), T)
        .unwrap();
    drop(qp);
    assert_eq!(m.dma_faults(), 0);
}

/// The timeout scan finds a command overdue on a controller that turned
/// fatal (CSTS.CFS): it resets the controller once, sends no Abort, and the
/// command ends as TimedOut with its buffer. (A review found the scan
/// sending an Abort to the fatal controller, whose admin path reset it,
/// and then resetting it a second time: other pairs' commands submitted
/// between the two were ended for nothing.) The polled path's own CSTS
/// check (once per 100 ms) may see CFS first: then the command ends as
/// ControllerReset, with the same one reset and no Abort.
#[test]
fn a_fatal_controller_found_by_the_timeout_scan_is_reset_once() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(50)).unwrap();
    m.inject(Fault::FatalOn(Match::Opcode {
        qid: qp.qid(),
        opcode: READ,
    }));
    submit_read(&c, &mut qp, &ns, 7);
    let got = collect(&mut qp, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].tag, 7);
    assert!(
        matches!(
            got[0].result,
            Err(IoError::TimedOut | IoError::ControllerReset)
        ),
        "{:?}",
        got[0].result
    );
    assert!(
        got[0].buffer.is_some(),
        "the controller was disabled: the buffer is back"
    );
    assert_eq!(c.resets(), 1);
    assert_eq!(qp.stats().aborts, 0, "no Abort to a fatal controller");
    qp.read_blocking(&ns, 0, 1, c.alloc_dma(4096).unwrap(), T)
        .unwrap();
    drop(qp);
    assert_eq!(m.dma_faults(), 0);
}

/// `close` reaps between Delete I/O SQ and Delete I/O CQ; when that reap's
/// timeout scan resets the controller (here: a read whose completion is
/// lost, aborted without answer, overdue twice), the reset deleted both
/// queues. The close hands the read back once and leaves no queue behind,
/// and the queue ID is free again. (A review found the reap re-creating
/// the queues there: the Delete CQ was then refused, the queues stayed live
/// on the controller, their memory quarantined and the ID held.)
#[test]
fn a_reset_inside_close_leaves_no_queue_behind() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(50)).unwrap();
    let qid = qp.qid();
    m.inject(Fault::DropCompletion(Match::Queue(qid)));
    submit_read(&c, &mut qp, &ns, 9);
    let poll = |qp: &mut IoQueuePair<ModelController>| {
        qp.process_completions(u32::MAX, |_, c| panic!("unexpected completion {c:?}"))
            .unwrap();
    };
    // The scan aborts it; the model answers "not aborted", so it stays out.
    let start = Instant::now();
    while qp.stats().aborts == 0 {
        assert!(start.elapsed() < T, "no Abort");
        poll(&mut qp);
    }
    // The scan runs on every 1024th poll: leave the next one to the reap
    // between the deletions (the close's drain polls once before them).
    while qp.stats().polls % 1024 != 1022 {
        poll(&mut qp);
    }
    // Overdue twice over by then: that scan resets the controller.
    std::thread::sleep(Duration::from_millis(150));
    let resets = c.resets();
    let out = qp.close(Duration::ZERO);
    assert_eq!(
        c.resets(),
        resets + 1,
        "the scan inside close reset the controller"
    );
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].tag, 9);
    assert!(out[0].buffer.is_some(), "disabled: the buffer is back");
    assert!(!m.queue_exists(qid), "queue {qid} left behind");
    let again = c.io_queue_pair(qp_opts(50)).unwrap();
    assert_eq!(again.qid(), qid, "the queue ID is free again");
    drop(again);
    assert_eq!(m.dma_faults(), 0);
}

/// A blocking read whose completion is lost: the timeout scan inside the
/// blocking wait aborts it, then resets the controller. The reset ends the
/// command, and the blocking call returns that ending (TimedOut, with the
/// buffer) instead of waiting for its own deadline and returning a bare
/// Timeout without the buffer.
#[test]
fn blocking_call_ended_by_a_reset_returns_its_buffer() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(50)).unwrap();
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: qp.qid(),
        opcode: READ,
    }));
    let start = Instant::now();
    let e = qp
        .read_blocking(&ns, 3, 1, c.alloc_dma(4096).unwrap(), T)
        .unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::Io {
                error: IoError::TimedOut,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.buffer.is_some(),
        "the controller was disabled: buffer back"
    );
    assert!(start.elapsed() < T, "ended by the reset, not the deadline");
    assert_eq!(c.resets(), 1);
    // Exactly once: nothing surfaces later.
    let mut late = 0;
    qp.process_completions(u32::MAX, |_, _| late += 1).unwrap();
    assert_eq!(late, 0);
    qp.read_blocking(&ns, 3, 1, c.alloc_dma(4096).unwrap(), T)
        .unwrap();
    drop(qp);
    assert_eq!(m.dma_faults(), 0);
}

const DELETE_IO_SQ: u8 = 0x00;
const DELETE_IO_CQ: u8 = 0x04;
const IDENTIFY: u8 = 0x06;

/// Admin opcodes the model fetched from index `from` of its command log on.
fn admin_opcodes_since(m: &ModelController, from: usize) -> Vec<u8> {
    m.commands_seen()[from..]
        .iter()
        .filter(|(sqid, _, _)| *sqid == 0)
        .map(|(_, opcode, _)| *opcode)
        .collect()
}

fn read_cmd(ns: &Namespace, slba: u64) -> IoCommand<'_> {
    IoCommand::Read {
        ns,
        slba,
        blocks: 1,
    }
}

/// A reset of a working controller deletes every I/O SQ, then every I/O CQ,
/// before CC.EN = 0 (Identify Controller is the first command after it); the
/// command the deletion aborted still ends exactly once, as ControllerReset,
/// with its buffer.
#[test]
fn reset_deletes_io_queues_first_and_their_commands_end_once() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut a = c.io_queue_pair(qp_opts(60_000)).unwrap();
    let mut b = c.io_queue_pair(qp_opts(60_000)).unwrap();
    m.inject(Fault::DelayCompletion {
        on: Match::Queue(a.qid()),
        doorbells: None,
    });
    a.submit(read_cmd(&ns, 1), Some(c.alloc_dma(4096).unwrap()), 7)
        .unwrap();
    assert_eq!(m.delayed_completions(), 1);
    let from = m.commands_seen().len();
    c.reset().unwrap();
    let ops = admin_opcodes_since(&m, from);
    assert_eq!(
        &ops[..5],
        &[
            DELETE_IO_SQ,
            DELETE_IO_SQ,
            DELETE_IO_CQ,
            DELETE_IO_CQ,
            IDENTIFY
        ],
        "admin commands of the reset: {ops:02x?}"
    );
    assert_eq!(m.delayed_completions(), 0, "the SQ deletion ended it");
    let done = collect(&mut a, 1);
    assert_eq!(done[0].tag, 7);
    assert_eq!(done[0].result, Err(IoError::ControllerReset));
    assert!(done[0].buffer.is_some());
    let mut late = 0;
    a.process_completions(u32::MAX, |_, _| late += 1).unwrap();
    assert_eq!(late, 0, "exactly once");
    for qp in [&mut a, &mut b] {
        qp.read_blocking(&ns, 2, 1, c.alloc_dma(4096).unwrap(), T)
            .unwrap();
    }
    drop((a, b));
    assert_clean(&m);
}

/// A pair that reaps a completion with Command Aborted due to SQ Deletion
/// while no reset, close or pair close of the driver's deleted anything
/// (the controller's own doing) reports the status as the controller gave
/// it: a reset that did not happen is not claimed (a review). During a
/// reset, what its deletions post reads as ControllerReset, like the
/// commands the reset itself ends (`concurrent_reset.rs`, the guest's
/// `reliability::resets_from_another_thread_end_every_command_once`).
#[test]
fn completion_aborted_by_sq_deletion_without_a_reset_reads_as_its_status() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(60_000)).unwrap();
    m.inject(Fault::DropCompletion(Match::Queue(qp.qid())));
    qp.submit(read_cmd(&ns, 4), Some(c.alloc_dma(4096).unwrap()), 21)
        .unwrap();
    let &(sqid, _, cid) = m.commands_seen().last().unwrap();
    assert_eq!(sqid, qp.qid());
    // DW2: SQ head 1 (one command fetched), SQ id; DW3: CID, status SCT 0h /
    // SC 08h (Command Aborted due to SQ Deletion).
    let dw2 = 1 | (u32::from(sqid) << 16);
    let dw3 = u32::from(cid) | (0x08 << 17);
    assert!(m.post_raw_completion(qp.qid(), [0, 0, dw2, dw3]));
    let done = collect(&mut qp, 1);
    assert_eq!(done[0].tag, 21);
    match done[0].result {
        Err(IoError::Status(s)) => assert_eq!((s.sct(), s.sc()), (0, 0x08)),
        ref other => panic!("{other:?}"),
    }
    assert!(done[0].buffer.is_some());
    qp.read_blocking(&ns, 4, 1, c.alloc_dma(4096).unwrap(), T)
        .unwrap();
    drop(qp);
    assert_clean(&m);
}

/// A controller that never answers Delete I/O Submission Queue is disabled
/// after one admin timeout: the reset neither hangs nor fails, sends no
/// further deletion, and the pair works afterwards.
#[test]
fn reset_does_not_wait_forever_for_a_deletion() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let options = upnvme::ControllerOptions {
        admin_timeout: Some(Duration::from_millis(200)),
        ..opts()
    };
    let c = open(&m, options);
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(60_000)).unwrap();
    m.inject(Fault::DelayCompletion {
        on: Match::Queue(qp.qid()),
        doorbells: None,
    });
    qp.submit(read_cmd(&ns, 5), Some(c.alloc_dma(4096).unwrap()), 3)
        .unwrap();
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: 0,
        opcode: DELETE_IO_SQ,
    }));
    let from = m.commands_seen().len();
    let start = Instant::now();
    c.reset().unwrap();
    assert!(start.elapsed() < T, "bounded by the admin timeout");
    let ops = admin_opcodes_since(&m, from);
    assert_eq!(&ops[..2], &[DELETE_IO_SQ, IDENTIFY], "{ops:02x?}");
    let done = collect(&mut qp, 1);
    assert_eq!(done[0].result, Err(IoError::ControllerReset));
    assert!(done[0].buffer.is_some());
    qp.read_blocking(&ns, 5, 1, c.alloc_dma(4096).unwrap(), T)
        .unwrap();
    drop(qp);
    assert_clean(&m);
}

/// A fatally failed controller (CSTS.CFS) gets no admin commands before the
/// reset's CC.EN = 0: it would not answer them.
#[test]
fn reset_of_a_fatal_controller_deletes_nothing_first() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(60_000)).unwrap();
    m.set_fatal();
    let from = m.commands_seen().len();
    let start = Instant::now();
    c.reset().unwrap();
    assert!(start.elapsed() < T);
    let ops = admin_opcodes_since(&m, from);
    assert_eq!(ops.first(), Some(&IDENTIFY), "{ops:02x?}");
    qp.read_blocking(&ns, 6, 1, c.alloc_dma(4096).unwrap(), T)
        .unwrap();
    drop(qp);
    assert_clean(&m);
}

#[test]
fn an_abort_that_gets_no_answer_resets_the_controller_and_the_command_completes_once() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(
        &m,
        upnvme::ControllerOptions {
            admin_timeout: Some(Duration::from_millis(300)),
            ..opts()
        },
    );
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(50)).unwrap();
    // Two reads' completions are lost, and so is the first Abort's (admin
    // opcode 08h): the Abort times out and the controller is marked failed.
    // (One fault per command: a fault matches every command it can.)
    let next = m.commands_fetched();
    for n in [next, next + 1] {
        m.inject(Fault::DropCompletion(Match::Nth(n)));
    }
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: 0,
        opcode: 0x08,
    }));
    for tag in [21, 22] {
        let b = c.alloc_dma(4096).unwrap();
        qp.submit(
            IoCommand::Read {
                ns: &ns,
                slba: 1,
                blocks: 1,
            },
            Some(b),
            tag,
        )
        .unwrap();
    }
    // Without the reset the pair would answer ControllerFailed from here
    // on and the commands (and their buffers) would never come back. The
    // second was overdue too but got no Abort (none gets through): it is
    // timed out as well, not "reset".
    let mut done = collect(&mut qp, 2);
    done.sort_by_key(|c| c.tag);
    assert_eq!((done[0].tag, done[1].tag), (21, 22));
    for d in &done {
        assert_eq!(d.result, Err(IoError::TimedOut), "tag {}", d.tag);
        assert!(d.buffer.is_some());
    }
    assert_eq!(qp.stats().aborts, 1);
    assert_eq!(c.resets(), 1);
    assert_eq!(qp.stats().timeout_resets, 1);
    let data = pattern(9, 4096);
    qp.write_blocking(&ns, 5, 1, buffer_with(&c, &data), T)
        .unwrap();
    let back = qp
        .read_blocking(&ns, 5, 1, c.alloc_dma(4096).unwrap(), T)
        .unwrap();
    assert_eq!(read_back(&back, 4096), data);
    drop(qp);
    assert_clean(&m);
}

#[test]
fn an_abort_that_meets_a_fatal_controller_sends_no_more_aborts_and_both_end_as_timed_out() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(50)).unwrap();
    // Two reads' completions are lost; the first Abort makes the controller
    // fatal, so the admin path resets it in the middle of the timeout scan.
    let next = m.commands_fetched();
    for n in [next, next + 1] {
        m.inject(Fault::DropCompletion(Match::Nth(n)));
    }
    m.inject(Fault::FatalOn(Match::Opcode {
        qid: 0,
        opcode: 0x08,
    }));
    for tag in [31, 32] {
        let b = c.alloc_dma(4096).unwrap();
        qp.submit(
            IoCommand::Read {
                ns: &ns,
                slba: 1,
                blocks: 1,
            },
            Some(b),
            tag,
        )
        .unwrap();
    }
    let mut done = collect(&mut qp, 2);
    done.sort_by_key(|c| c.tag);
    assert_eq!((done[0].tag, done[1].tag), (31, 32));
    for d in &done {
        // Both were overdue: timed out, not "reset".
        assert_eq!(d.result, Err(IoError::TimedOut), "tag {}", d.tag);
        assert!(d.buffer.is_some());
    }
    // No second Abort went to the new controller, for a queue it does not
    // have.
    assert_eq!(qp.stats().aborts, 1);
    assert_eq!(c.resets(), 1);
    qp.read_blocking(&ns, 3, 1, c.alloc_dma(4096).unwrap(), T)
        .unwrap();
    drop(qp);
    assert_clean(&m);
}

#[test]
fn a_pair_dropped_while_a_reset_removes_its_queues_frees_its_memory() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    // (The pair is dropped without a poll: no timeout scan runs. A command
    // timeout of 0, which this test took before, is refused now.)
    let mut qp = c.io_queue_pair(qp_opts(30_000)).unwrap();
    let b = c.alloc_dma(4096).unwrap();
    let iova = b.iova();
    m.inject(Fault::DelayCompletion {
        on: Match::Queue(qp.qid()),
        doorbells: None,
    });
    qp.submit(read_cmd(&ns, 1), Some(b), 1).unwrap();
    // The drop's Delete I/O SQ meets a fatal controller: the admin path
    // resets it, which removes the queues (CC.EN = 0) — the deletion itself
    // fails, but nothing can reach the pair's memory any more.
    m.inject(Fault::FatalOn(Match::Opcode {
        qid: 0,
        opcode: DELETE_IO_SQ,
    }));
    drop(qp);
    assert_eq!(c.resets(), 1);
    // Its memory is handed out again (first fit: among the next few pages).
    let again: Vec<_> = (0..64).map(|_| c.alloc_dma(4096).unwrap()).collect();
    assert!(
        again.iter().any(|b| b.iova() == iova),
        "the in-flight buffer was freed, not quarantined until the next disable"
    );
    drop(again);
    assert_eq!(m.release_delayed(), 0, "the reset ended the held read");
    c.close().unwrap();
    assert_clean(&m);
}

/// A blocking wait that backs off with a sleep still ends at its timeout:
/// with the checks counted in polls (every 1024), a 20 ms sleep made a
/// 100 ms timeout end after about 20 s.
#[test]
fn a_sleeping_blocking_wait_ends_at_its_timeout() {
    // 20 ms sleeps, and a back-off sleep longer than the whole wait (an
    // hour: each sleep is cut to what is left of the timeout).
    for sleep in [Duration::from_millis(20), Duration::from_secs(3600)] {
        sleeping_blocking_wait_ends_at_its_timeout(sleep);
    }
}

fn sleeping_blocking_wait_ends_at_its_timeout(sleep: Duration) {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            backoff: upnvme::Backoff {
                spin_polls: 10,
                sleep: Some(sleep),
            },
            command_timeout: None,
            ..Default::default()
        })
        .unwrap();
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode {
            qid: qp.qid(),
            opcode: READ,
        },
        doorbells: None,
    });
    let start = Instant::now();
    let e = qp
        .read_blocking(
            &ns,
            2,
            1,
            c.alloc_dma(4096).unwrap(),
            Duration::from_millis(100),
        )
        .unwrap_err();
    let took = start.elapsed();
    assert!(matches!(e.error, Error::Timeout { .. }), "{e:?}");
    // A bound on correctness, not on speed: the timeout plus a few sleeps,
    // far below 1024 sleeps.
    assert!(took < Duration::from_secs(5), "the wait took {took:?}");
    // The command is still in flight; released, it completes once.
    m.release_delayed();
    let done = collect(&mut qp, 1);
    assert!(done[0].result.is_ok(), "{:?}", done[0].result);
    drop(qp);
    assert_clean(&m);
}

/// `next_completion` returns a completion it reaped even when the periodic
/// timeout scan of the same call fails (here: the reset it starts never
/// sees CSTS.RDY); the error comes with the next call.
#[test]
fn next_completion_keeps_a_completion_reaped_in_a_call_whose_timeout_scan_fails() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(
        &m,
        upnvme::ControllerOptions {
            ready_timeout: Some(Duration::from_millis(200)),
            ..opts()
        },
    );
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(1)).unwrap();
    let read = |slba| IoCommand::Read {
        ns: &ns,
        slba,
        blocks: 1,
    };
    // A is lost: the first scan stamps it, the second aborts it (the Abort
    // finds nothing to abort), the third resets the controller.
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: qp.qid(),
        opcode: READ,
    }));
    qp.submit(read(1), Some(c.alloc_dma(4096).unwrap()), 1)
        .unwrap();
    let poll_to = |qp: &mut IoQueuePair<ModelController>, polls: u64| {
        while qp.stats().polls < polls {
            assert!(qp.next_completion().unwrap().is_none());
        }
    };
    poll_to(&mut qp, 1024);
    std::thread::sleep(Duration::from_millis(5));
    poll_to(&mut qp, 2048);
    assert_eq!(qp.stats().aborts, 1);
    std::thread::sleep(Duration::from_millis(5));
    // B is held back until the poll of the third scan.
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode {
            qid: qp.qid(),
            opcode: READ,
        },
        doorbells: None,
    });
    qp.submit(read(2), Some(c.alloc_dma(4096).unwrap()), 2)
        .unwrap();
    poll_to(&mut qp, 3071);
    m.inject(Fault::NeverReady);
    m.release_delayed();
    // The 3072nd poll reaps B, then its scan resets the controller, which
    // fails: B comes back all the same, with its buffer.
    let b = qp
        .next_completion()
        .unwrap()
        .expect("B, reaped in this call");
    assert_eq!(b.tag, 2);
    assert!(b.result.is_ok(), "{:?}", b.result);
    assert!(b.buffer.is_some());
    // A, ended by the reset (the controller was disabled), completes once;
    // then the failed re-enable is reported.
    let a = qp
        .next_completion()
        .unwrap()
        .expect("A, ended by the reset");
    assert_eq!((a.tag, a.result), (1, Err(IoError::TimedOut)));
    assert!(a.buffer.is_some());
    assert!(qp.next_completion().is_err());
    drop(qp);
    assert_eq!(m.dma_faults(), 0);
}

/// A blocking call whose command the timeout reset ends, when the queues'
/// re-creation after that reset is refused once: the call returns its own
/// command's end (TimedOut or ControllerReset) with the buffer, not the
/// Create error while the completion with the buffer waits parked; the next
/// reap re-creates the queues.
#[test]
fn a_blocking_call_ended_by_a_timeout_reset_gets_its_buffer_even_if_re_creation_fails() {
    const CREATE_IO_CQ: u8 = 0x05;
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(16),
            command_timeout: Some(Duration::from_millis(30)),
            ..Default::default()
        })
        .unwrap();
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: qp.qid(),
        opcode: READ,
    }));
    m.inject(Fault::Status {
        on: Match::Opcode {
            qid: 0,
            opcode: CREATE_IO_CQ,
        },
        status: upnvme_tests::Status::INTERNAL_ERROR,
    });
    let f = qp
        .read_blocking(&ns, 1, 1, c.alloc_dma(4096).unwrap(), T)
        .expect_err("the read was lost");
    assert_eq!(c.resets(), 1);
    assert!(
        matches!(
            f.error,
            Error::Io {
                error: IoError::TimedOut | IoError::ControllerReset,
                ..
            }
        ),
        "{}",
        f.error
    );
    assert!(f.buffer.is_some(), "the buffer comes back with the call");
    // The next blocking call re-creates the queues and works.
    let buf = qp.read_blocking(&ns, 2, 1, f.buffer.unwrap(), T).unwrap();
    assert_eq!(buf.len(), 4096);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// After a reset, Create I/O SQ is refused and the Delete I/O CQ that
/// should undo the CQ is refused too: the CQ may stay on the controller.
/// The pair then deletes what may be left before creating again (before,
/// every poll sent a Create I/O CQ the controller refused because the CQ
/// existed, and reported an empty queue), and a poll that could not
/// re-create says why.
#[test]
fn a_re_creation_that_left_its_cq_deletes_it_before_creating_again() {
    const CREATE_IO_SQ: u8 = 0x01;
    const CREATE_IO_CQ: u8 = 0x05;
    let m = ModelController::new(config_one_ns(4096, 1024));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    c.reset().unwrap();
    let on = |opcode| Match::Opcode { qid: 0, opcode };
    m.inject(Fault::Status {
        on: on(CREATE_IO_SQ),
        status: upnvme_tests::Status::INTERNAL_ERROR,
    });
    m.inject(Fault::Status {
        on: on(DELETE_IO_CQ),
        status: upnvme_tests::Status::INTERNAL_ERROR,
    });
    let e = qp.process_completions(u32::MAX, |_, _| {}).unwrap_err();
    assert!(
        e.to_string().contains("Create I/O Submission Queue"),
        "the poll says why: {e}"
    );
    let before = m.commands_seen().len();
    for _ in 0..100 {
        qp.process_completions(u32::MAX, |_, _| {}).unwrap();
    }
    let creates = m.commands_seen()[before..]
        .iter()
        .filter(|(q, op, _)| *q == 0 && *op == CREATE_IO_CQ)
        .count();
    assert_eq!(
        creates, 1,
        "re-created once, after deleting the leftover CQ"
    );
    let buf = qp
        .read_blocking(&ns, 0, 1, c.alloc_dma(4096).unwrap(), T)
        .unwrap();
    drop(buf);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// After a reset the controller keeps refusing Create I/O CQ. The pair tries
/// again at once three times, then waits between tries (1, 2, 4, ... ms, at
/// most 100 ms) instead of sending a Create I/O CQ per poll (before: one per
/// call, millions a second for a polling application); polls and submits
/// in between say why and when it tries again, without a command. Once the
/// controller accepts, the pair works again; a new reset starts over.
#[test]
fn a_re_creation_that_keeps_failing_waits_between_tries() {
    const CREATE_IO_CQ: u8 = 0x05;
    const TEXT: &str = "I/O queue pair 1 of model has no queues since a controller reset: \
        re-creating them failed 3 time(s) in a row (last: Create I/O Completion Queue 1 (after \
        reset) failed with NVMe status: Internal Error (sct 0x0, sc 0x06)); the next submit or \
        poll tries again";
    let m = ModelController::new(config_one_ns(4096, 1024));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // Faults are one-shot (and all that match apply to one command): the
    // next Create I/O CQ is refused.
    let refuse = || {
        if m.pending_faults().is_empty() {
            m.inject(Fault::Status {
                on: Match::Opcode {
                    qid: 0,
                    opcode: CREATE_IO_CQ,
                },
                status: upnvme_tests::Status::INTERNAL_ERROR,
            });
        }
    };
    let creates_since = |from: usize| {
        admin_opcodes_since(&m, from)
            .iter()
            .filter(|&&op| op == CREATE_IO_CQ)
            .count()
    };
    c.reset().unwrap();
    let start = m.commands_seen().len();
    for tries in 1..=3 {
        refuse();
        let e = qp.process_completions(u32::MAX, |_, _| {}).unwrap_err();
        assert!(
            e.to_string().contains("Create I/O Completion Queue"),
            "try {tries} says why: {e}"
        );
        assert_eq!(creates_since(start), tries, "tries 1-3 are made at once");
    }
    // Inside the wait: no command, the last failure and the wait. (On a
    // machine slow enough to let the 1 ms wait pass between two calls, a
    // call tries again and fails with the refusal itself.)
    let mut calls = 0;
    let e = loop {
        refuse();
        match qp.process_completions(u32::MAX, |_, _| {}).unwrap_err() {
            e @ Error::QueuesNotRecreated { .. } => break e,
            Error::Command { .. } if calls < 1000 => calls += 1,
            other => panic!("expected QueuesNotRecreated, got {other:?}"),
        }
    };
    let failures = creates_since(start) as u32;
    let Error::QueuesNotRecreated {
        qid,
        failures: f,
        ref cause,
        retry_in,
        ..
    } = e
    else {
        unreachable!()
    };
    assert_eq!(qid, qp.qid());
    assert_eq!(f, failures, "every try counted");
    assert!(cause.contains("Internal Error"), "{cause}");
    assert!(retry_in <= Duration::from_millis(100), "{retry_in:?}");
    let text = e.to_string();
    let expected = TEXT.replace("3 time(s)", &format!("{failures} time(s)"));
    assert!(
        text == expected || text.starts_with(&format!("{expected} after ")),
        "{text}"
    );
    let r = qp
        .submit(read_cmd(&ns, 0), Some(c.alloc_dma(4096).unwrap()), 1)
        .unwrap_err();
    let e = qp.describe(r.reason);
    let failures = creates_since(start) as u32;
    assert!(
        matches!(e, Error::QueuesNotRecreated { failures: f, .. } if f == failures),
        "a submit says the same: {e:?}"
    );
    assert!(r.buffer.is_some(), "the refused buffer comes back");
    // 60 ms of polling as fast as it goes: at most a handful of tries (the
    // waits are 1, 2, 4, 8, 16, 32 ms from the fourth failure on), not one
    // per poll.
    let before = creates_since(start);
    let t0 = Instant::now();
    let mut polls = 0u64;
    while t0.elapsed() < Duration::from_millis(60) {
        refuse();
        assert!(qp.process_completions(u32::MAX, |_, _| {}).is_err());
        polls += 1;
    }
    let tries = creates_since(start) - before;
    assert!(polls > 20, "the polls did not wait: {polls}");
    assert!(tries <= 8, "{tries} tries in {polls} polls over 60 ms");
    // The controller accepts again: within the longest wait the pair has
    // its queues back, and reads work.
    m.clear_faults();
    let t0 = Instant::now();
    while qp.process_completions(u32::MAX, |_, _| {}).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(1), "no re-creation");
    }
    let buf = qp
        .read_blocking(&ns, 0, 1, c.alloc_dma(4096).unwrap(), T)
        .unwrap();
    // A new reset starts over: its first failure is retried at the next
    // poll, with no wait.
    c.reset().unwrap();
    refuse();
    let start = m.commands_seen().len();
    assert!(qp.process_completions(u32::MAX, |_, _| {}).is_err());
    qp.process_completions(u32::MAX, |_, _| {}).unwrap();
    assert_eq!(creates_since(start), 2);
    let buf = qp.read_blocking(&ns, 1, 1, buf, T).unwrap();
    drop(buf);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// Polls `process_completions` until `want` completions came back, an
/// error, or `limit` passed.
fn poll_for(
    qp: &mut IoQueuePair<ModelController>,
    want: usize,
    limit: Duration,
) -> (Vec<Completion>, Option<Error>) {
    let start = Instant::now();
    let mut out = Vec::new();
    while start.elapsed() < limit && out.len() < want {
        if let Err(e) = qp.process_completions(u32::MAX, |_, c| out.push(c)) {
            return (out, Some(e));
        }
    }
    (out, None)
}

/// An application that only polls (the perf, fio and C path) notices a
/// controller that sets CSTS.CFS within about 100 ms, as the blocking helpers
/// do — not at its command timeout (60 s here), or never without one: the
/// controller is reset and the command ends once, with its buffer.
#[test]
fn the_polled_path_resets_a_fatal_controller_without_waiting_for_the_timeout() {
    for timeout in [Some(Duration::from_secs(60)), None] {
        let m = ModelController::new(config_one_ns(4096, 256));
        let c = open(&m, opts());
        let ns = c.namespace(1).unwrap().clone();
        let mut qp = c
            .io_queue_pair(QueuePairOptions {
                entries: Some(16),
                command_timeout: timeout,
                ..Default::default()
            })
            .unwrap();
        m.inject(Fault::DelayCompletion {
            on: Match::Opcode {
                qid: qp.qid(),
                opcode: READ,
            },
            doorbells: None,
        });
        submit_read(&c, &mut qp, &ns, 7);
        m.set_fatal();
        let (done, err) = poll_for(&mut qp, 1, T);
        assert!(err.is_none(), "{timeout:?}: {err:?}");
        assert_eq!(done.len(), 1, "{timeout:?}: no completion within {T:?}");
        assert_eq!(done[0].tag, 7);
        assert!(
            matches!(done[0].result, Err(IoError::ControllerReset)),
            "{:?}",
            done[0].result
        );
        assert!(done[0].buffer.is_some());
        assert_eq!(c.resets(), 1);
        // The pair works on the reset controller.
        submit_read(&c, &mut qp, &ns, 8);
        let (done, err) = poll_for(&mut qp, 1, T);
        assert!(
            err.is_none() && done.len() == 1 && done[0].is_ok(),
            "{err:?}"
        );
        drop(qp);
        drop(c);
        assert_clean(&m);
    }
}

/// The same with the device gone (CSTS reads all ones) and no command
/// timeout: the poll fails with ControllerGone instead of returning
/// `Ok(0)` for ever; the buffer stays with the pair (the device may still
/// own it).
#[test]
fn the_polled_path_reports_a_vanished_controller_without_a_command_timeout() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(16),
            command_timeout: None,
            ..Default::default()
        })
        .unwrap();
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode {
            qid: qp.qid(),
            opcode: READ,
        },
        doorbells: None,
    });
    submit_read(&c, &mut qp, &ns, 7);
    m.unplug();
    let (done, err) = poll_for(&mut qp, 1, T);
    assert!(done.is_empty());
    assert!(
        matches!(err, Some(Error::ControllerGone { .. })),
        "no error within {T:?}: {err:?}"
    );
    // Later calls keep failing; nothing is delivered.
    let (done, err) = poll_for(&mut qp, 1, Duration::from_millis(50));
    assert!(done.is_empty() && err.is_some(), "{err:?}");
}

/// A reset after the driver marked the controller failed (here a corrupt
/// CID on pair A) while the controller still runs and pair B's command sits
/// in it: the reset deletes the I/O queues before CC.EN = 0, as a healthy
/// reset does — disabling with live SQs is the order that crashes QEMU's
/// hw/nvme (DESIGN.md) — and both pairs end their commands once.
#[test]
fn a_reset_after_a_driver_detected_fault_deletes_the_queues_first() {
    const DELETE_IO_SQ: u8 = 0x00;
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let o = QueuePairOptions {
        entries: Some(16),
        ..Default::default()
    };
    let mut a = c.io_queue_pair(o.clone()).unwrap();
    let mut b = c.io_queue_pair(o).unwrap();
    m.inject(Fault::DelayCompletion {
        on: Match::Queue(b.qid()),
        doorbells: None,
    });
    submit_read(&c, &mut b, &ns, 1);
    m.inject(Fault::CorruptCid {
        on: Match::Queue(a.qid()),
        xor: 0x0003,
    });
    submit_read(&c, &mut a, &ns, 2);
    assert!(a.process_completions(u32::MAX, |_, _| {}).is_err());
    assert!(c.failure().is_some());
    assert_eq!(
        m.delayed_completions(),
        1,
        "B's command is at the controller"
    );
    let from = m.commands_seen().len();
    c.reset().unwrap();
    let admin: Vec<u8> = m.commands_seen()[from..]
        .iter()
        .filter(|(q, _, _)| *q == 0)
        .map(|(_, op, _)| *op)
        .collect();
    assert_eq!(
        admin.first(),
        Some(&DELETE_IO_SQ),
        "the reset's admin commands: {admin:02x?}"
    );
    let (done, err) = poll_for(&mut b, 1, T);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(done.len(), 1);
    assert!(done[0].buffer.is_some());
    drop((a, b));
    drop(c);
    assert_clean(&m);
}

/// A blocking call keeps to its own timeout when the pair's command timeout
/// is shorter and the Abort gets no answer: the recovery (Abort, wait up to
/// the admin timeout, reset) does not run inside a wait that has less than
/// an admin timeout left, and the pair's next call recovers the command.
#[test]
fn a_blocking_call_keeps_to_its_timeout_when_the_abort_gets_no_answer() {
    const ABORT: u8 = 0x08;
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(20)).unwrap();
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: qp.qid(),
        opcode: READ,
    }));
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: 0,
        opcode: ABORT,
    }));
    let timeout = Duration::from_millis(300);
    let start = Instant::now();
    let cmd = IoCommand::Read {
        ns: &ns,
        slba: 0,
        blocks: 1,
    };
    let f = qp
        .execute_blocking(cmd, Some(c.alloc_dma(4096).unwrap()), timeout)
        .unwrap_err();
    let took = start.elapsed();
    assert!(matches!(f.error, Error::Timeout { .. }), "{}", f.error);
    // Well under the admin timeout the Abort would have waited (opts()).
    assert!(took < Duration::from_secs(1), "took {took:?}");
    // The pair's later polls recover it: Abort (no answer), reset, and the
    // command comes back once, timed out, with its buffer.
    let (done, err) = poll_for(&mut qp, 1, Duration::from_secs(20));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(done.len(), 1);
    assert!(
        matches!(done[0].result, Err(IoError::TimedOut)),
        "{:?}",
        done[0].result
    );
    assert!(done[0].buffer.is_some());
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// The timeout scan's Abort inside a blocking call waits for the admin lock
/// only while the call's timeout leaves room for it: another thread holds
/// the lock for a Get Log Page with Retain Asynchronous Event clear (waited
/// for under the lock, up to its own 30 s timeout) whose completion the
/// model holds back. The blocking read (1 s, its completion lost, a 20 ms
/// command timeout, a 300 ms admin timeout) must still end at about 1 s
/// with `Timeout`, not when the holder lets go (from a review: the Abort
/// waited on `Mutex::lock`, and the call overran its timeout by as long
/// as the other thread kept the lock). The pair's later polls then abort
/// the command and reset, and it comes back once with its buffer.
#[test]
fn a_blocking_call_keeps_to_its_timeout_while_another_thread_holds_the_admin_lock() {
    const GET_LOG_PAGE: u8 = 0x02;
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(
        &m,
        upnvme::ControllerOptions {
            admin_timeout: Some(Duration::from_millis(300)),
            ..opts()
        },
    );
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(20)).unwrap();
    m.inject(Fault::DelayCompletion {
        on: Match::Opcode {
            qid: 0,
            opcode: GET_LOG_PAGE,
        },
        doorbells: None,
    });
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: qp.qid(),
        opcode: READ,
    }));
    let (took, f) = std::thread::scope(|s| {
        let holder = s.spawn(|| {
            // Error Information log, one page, RAE clear.
            let sqe = upnvme_queues::Sqe::get_log_page(0x01, 0xffff_ffff, 1024, 0, false);
            c.admin_passthrough_with_timeout(sqe, 4096, None, Duration::from_secs(30))
        });
        let start = Instant::now();
        while m.delayed_completions() < 1 {
            assert!(
                start.elapsed() < T,
                "the Get Log Page never reached the model"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let reader = s.spawn(|| {
            let start = Instant::now();
            let cmd = read_cmd(&ns, 0);
            let f = qp
                .execute_blocking(
                    cmd,
                    Some(c.alloc_dma(4096).unwrap()),
                    Duration::from_secs(1),
                )
                .unwrap_err();
            (start.elapsed(), f)
        });
        // Let the holder go after 8 s at the latest, so that a call that
        // overruns still returns (and the test fails on its time).
        let start = Instant::now();
        while !reader.is_finished() && start.elapsed() < Duration::from_secs(8) {
            std::thread::sleep(Duration::from_millis(5));
        }
        m.release_delayed();
        holder.join().unwrap().expect("the Get Log Page");
        reader.join().unwrap()
    });
    assert!(matches!(f.error, Error::Timeout { .. }), "{}", f.error);
    assert!(f.buffer.is_none());
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // Recovered by the pair's next polls: Abort, reset, TimedOut once.
    let (done, err) = poll_for(&mut qp, 1, Duration::from_secs(20));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].result, Err(IoError::TimedOut));
    assert!(done[0].buffer.is_some());
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A loop of `next_completion` with `reap_on_submit`: every resubmission
/// parks the next completion, so each call is served from the parked ones
/// alone. It must still count as a poll: a command the controller lost
/// times out (Abort, then `TimedOut`) while the others keep completing
/// (from a review: the periodic work was counted only where the CQ was
/// looked at, and 18 360 completions went by in 1 s — 50 command timeouts —
/// with no scan and no Abort).
#[test]
fn a_lost_command_times_out_while_parked_completions_keep_flowing() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            reap_on_submit: true,
            ..qp_opts(20)
        })
        .unwrap();
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: qp.qid(),
        opcode: READ,
    }));
    // Tag 0 is the lost one; 1..4 cycle.
    for tag in 0..4u64 {
        submit_read(&c, &mut qp, &ns, tag);
    }
    let start = Instant::now();
    let mut lost_back = None;
    let mut cycled = 0u64;
    while start.elapsed() < Duration::from_secs(5) {
        match qp.next_completion().expect("next_completion") {
            Some(done) if done.tag == 0 => {
                lost_back = Some(done.result);
                break;
            }
            Some(done) => {
                cycled += 1;
                qp.submit(read_cmd(&ns, 0), done.buffer, done.tag).unwrap();
            }
            None => {}
        }
    }
    assert_eq!(
        lost_back,
        Some(Err(IoError::TimedOut)),
        "the lost command never timed out ({cycled} others completed meanwhile)"
    );
    assert!(cycled > 0, "the others did not keep completing");
}

/// `k` calls of `process_completions` that find nothing (a completion is
/// a failure): each counts as a poll, every 1024th runs the timeout scan.
fn empty_polls(qp: &mut IoQueuePair<ModelController>, k: u32) {
    for _ in 0..k {
        let n = qp
            .process_completions(u32::MAX, |_, c| panic!("unexpected {c:?}"))
            .unwrap();
        assert_eq!(n, 0);
    }
}

/// Abort commands the model fetched so far.
fn aborts_sent(m: &ModelController) -> usize {
    admin_opcodes_since(m, 0)
        .iter()
        .filter(|&&op| op == 0x08)
        .count()
}

/// Two commands completed well within their 50 ms timeout, but the host
/// looked 60 ms later, one completion per call: the scan that follows the
/// first reap must not abort the second, whose completion is already in
/// the CQ (from a review: an Abort went out for it).
#[test]
fn no_abort_is_sent_for_a_command_whose_completion_is_already_in_the_cq() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(50)).unwrap();
    let n0 = m.commands_fetched();
    for n in n0..n0 + 2 {
        m.inject(Fault::DelayCompletion {
            on: Match::Nth(n),
            doorbells: None,
        });
    }
    qp.submit(read_cmd(&ns, 0), Some(c.alloc_dma(4096).unwrap()), 1)
        .unwrap();
    qp.submit(read_cmd(&ns, 1), Some(c.alloc_dma(4096).unwrap()), 2)
        .unwrap();
    // The first periodic run (poll 1024) stamps both.
    empty_polls(&mut qp, 1024);
    assert_eq!(qp.stats().polls % 1024, 0);
    empty_polls(&mut qp, 1023);
    // The device completes both now, well within the 50 ms timeout...
    assert_eq!(m.release_delayed(), 2, "both completions posted");
    // ...and the host looks 60 ms later (preempted, busy elsewhere).
    std::thread::sleep(Duration::from_millis(60));
    let before = aborts_sent(&m);
    // Poll 2048: reaps one completion, then the periodic scan runs.
    let first = qp.next_completion().unwrap().expect("a completion");
    let second = qp.next_completion().unwrap().expect("a completion");
    assert!(first.result.is_ok() && second.result.is_ok());
    assert_eq!(
        aborts_sent(&m) - before,
        0,
        "an Abort went out for a command whose completion was already posted \
         (stats.aborts = {})",
        qp.stats().aborts
    );
}

/// A reset for a lost command must not turn the successes already posted
/// in the CQ for other commands into `ControllerReset` (from a review: tag
/// 12 had succeeded and was reported as reset).
#[test]
fn a_timeout_reset_does_not_discard_a_success_already_in_the_cq() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(50)).unwrap();
    // X: lost by the controller.
    m.inject(Fault::DropCompletion(Match::Nth(m.commands_fetched())));
    qp.submit(read_cmd(&ns, 0), Some(c.alloc_dma(4096).unwrap()), 10)
        .unwrap();
    empty_polls(&mut qp, 1024); // scan 1 stamps X
    std::thread::sleep(Duration::from_millis(60));
    empty_polls(&mut qp, 1024); // scan 2 aborts X (not found)
    assert_eq!(qp.stats().aborts, 1);
    // A and B: held, then completed successfully by the device.
    let n0 = m.commands_fetched();
    for n in n0..n0 + 2 {
        m.inject(Fault::DelayCompletion {
            on: Match::Nth(n),
            doorbells: None,
        });
    }
    qp.submit(read_cmd(&ns, 1), Some(c.alloc_dma(4096).unwrap()), 11)
        .unwrap();
    qp.submit(read_cmd(&ns, 2), Some(c.alloc_dma(4096).unwrap()), 12)
        .unwrap();
    empty_polls(&mut qp, 1023);
    std::thread::sleep(Duration::from_millis(60)); // X is now past 2 x timeout
    assert_eq!(m.release_delayed(), 2);
    // Poll 3072: reaps A, then scan 3 resets for X.
    let mut got = vec![qp.next_completion().unwrap().expect("A")];
    while got.len() < 3 {
        if let Some(c) = qp.next_completion().unwrap() {
            got.push(c);
        }
    }
    let results: Vec<_> = got.iter().map(|c| (c.tag, c.result)).collect();
    eprintln!("{results:?}, resets {}", c.resets());
    assert_eq!(c.resets(), 1);
    for c in &got {
        if c.tag != 10 {
            assert_eq!(
                c.result,
                Ok(0),
                "tag {} completed successfully (its completion was in the CQ before the \
                 reset) but is reported {:?}",
                c.tag,
                c.result
            );
        }
    }
}

/// The same when the reset comes from an Abort that got no answer: the
/// Abort's wait (up to the admin timeout) gives other commands time to
/// complete, and the reset that follows in the same scan must not turn
/// those successes, posted in the CQ before it, into `ControllerReset`
/// (from a review: the scan reaped before its Aborts, not after them).
#[test]
fn a_reset_after_an_unanswered_abort_does_not_discard_a_success_posted_meanwhile() {
    const ABORT: u8 = 0x08;
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(
        &m,
        upnvme::ControllerOptions {
            admin_timeout: Some(Duration::from_millis(300)),
            ..opts()
        },
    );
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(50)).unwrap();
    // X: lost by the controller.
    m.inject(Fault::DropCompletion(Match::Nth(m.commands_fetched())));
    qp.submit(read_cmd(&ns, 0), Some(c.alloc_dma(4096).unwrap()), 10)
        .unwrap();
    empty_polls(&mut qp, 1024); // scan 1 stamps X
    std::thread::sleep(Duration::from_millis(60));
    // B: completed by the device at the next doorbell write anywhere —
    // the Abort's SQ tail doorbell — so while the Abort waits for an
    // answer that never comes.
    m.inject(Fault::DelayCompletion {
        on: Match::Nth(m.commands_fetched()),
        doorbells: Some(1),
    });
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: 0,
        opcode: ABORT,
    }));
    qp.submit(read_cmd(&ns, 1), Some(c.alloc_dma(4096).unwrap()), 11)
        .unwrap();
    // Scan 2: X is overdue, its Abort gets no answer, the controller is
    // reset.
    let (mut got, err) = poll_for(&mut qp, 2, T);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(c.resets(), 1);
    assert_eq!(qp.stats().aborts, 1);
    got.sort_by_key(|c| c.tag);
    let results: Vec<_> = got.iter().map(|c| (c.tag, c.result)).collect();
    assert_eq!(
        results,
        vec![(10, Err(IoError::TimedOut)), (11, Ok(0))],
        "tag 11 completed successfully during the Abort's wait (its completion was in the \
         CQ before the reset)"
    );
    assert!(got.iter().all(|c| c.buffer.is_some()));
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// Two commands overdue, and the device vanishes with the first one's
/// Abort: the second Abort is never sent (the admin path refuses a
/// controller it found gone), so it is not counted either, and the scan
/// says the controller is gone instead of reporting success; the commands
/// keep their buffers (the device may still own them). Before, the scan
/// went on "sending" Aborts into the refusal and counted each in
/// `QueueStats::aborts` (from a review).
#[test]
fn aborts_that_a_vanished_controller_never_got_are_not_counted() {
    const ABORT: u8 = 0x08;
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(qp_opts(50)).unwrap();
    let n0 = m.commands_fetched();
    for n in n0..n0 + 2 {
        m.inject(Fault::DropCompletion(Match::Nth(n)));
    }
    m.inject(Fault::UnplugOn(Match::Opcode {
        qid: 0,
        opcode: ABORT,
    }));
    for tag in [1, 2] {
        submit_read(&c, &mut qp, &ns, tag);
    }
    empty_polls(&mut qp, 1024); // scan 1 stamps both
    std::thread::sleep(Duration::from_millis(60));
    empty_polls(&mut qp, 1023);
    // Scan 2: both overdue; the first Abort meets the unplug.
    let err = qp
        .process_completions(u32::MAX, |_, c| panic!("unexpected {c:?}"))
        .expect_err("the controller is gone");
    assert!(matches!(err, Error::ControllerGone { .. }), "{err}");
    assert_eq!(aborts_sent(&m), 1);
    assert_eq!(
        qp.stats().aborts,
        1,
        "an Abort the controller never got was counted"
    );
    assert_eq!(qp.in_flight(), 2, "the device may still own their buffers");
}

/// The same when the reset itself fails after it disabled the controller
/// (here CSTS.RDY never comes back): the reset ended the command — nothing
/// can reach its buffer — so the blocking call returns it, timed out, with
/// its buffer, instead of a bare error whose command surfaced only at a
/// later poll (from a review).
#[test]
fn a_blocking_call_ended_by_a_timeout_reset_gets_its_buffer_even_if_the_reset_then_fails() {
    let m = ModelController::new(config_one_ns(4096, 256));
    let c = open(
        &m,
        upnvme::ControllerOptions {
            ready_timeout: Some(Duration::from_millis(300)),
            ..opts()
        },
    );
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(16),
            command_timeout: Some(Duration::from_millis(30)),
            ..Default::default()
        })
        .unwrap();
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: qp.qid(),
        opcode: READ,
    }));
    // The timeout reset's CC.EN = 1 never brings CSTS.RDY.
    m.inject(Fault::NeverReady);
    let f = qp
        .read_blocking(&ns, 1, 1, c.alloc_dma(4096).unwrap(), T)
        .expect_err("the read was lost");
    assert_eq!(c.resets(), 1, "the reset disabled the controller");
    assert!(
        matches!(
            f.error,
            Error::Io {
                error: IoError::TimedOut,
                ..
            }
        ),
        "{}",
        f.error
    );
    assert!(f.buffer.is_some(), "the buffer comes back with the call");
    // Delivered once: nothing surfaces later; the failure is the next
    // call's answer.
    let mut late = 0;
    let r = qp.process_completions(u32::MAX, |_, _| late += 1);
    assert_eq!(late, 0);
    assert!(r.is_err(), "{r:?}");
    drop(qp);
    assert_eq!(m.dma_faults(), 0);
}
