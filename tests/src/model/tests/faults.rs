//! Fault injection: every fault does what it says, once.

use upnvme::Device;

use super::{Host, Sqe, pattern, rw};
use crate::model::{Fault, Match, Status};

fn flush() -> Sqe {
    Sqe::new(0x00).nsid(1)
}

/// Abort (§5.1) of (sqid, cid): returns the Abort's dword 0.
fn abort(h: &mut Host, sqid: u16, cid: u16) -> u32 {
    let c = h.admin(Sqe::new(0x08).cdw(10, u32::from(cid) << 16 | u32::from(sqid)));
    assert_eq!(c.status, Status::SUCCESS);
    c.dw0
}

#[test]
fn dropped_completion_is_never_posted_and_cannot_be_aborted() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 8);
    let buf = h.buffer(4096);
    buf.write_bytes(0, &pattern(4096, 5)).unwrap();
    h.m.inject(Fault::DropCompletion(Match::Opcode {
        qid: 1,
        opcode: 0x01,
    }));
    let cid = io.push(rw(0x01, 3, 1, buf.iova(), 0));
    io.ring_sq(&h.m);
    assert!(io.poll().is_none());
    assert_eq!(
        h.m.namespace_data(1, 3, 1),
        pattern(4096, 5),
        "the write happened"
    );
    assert_eq!(h.m.dropped_completions(), vec![(1, cid)]);
    assert_eq!(abort(&mut h, 1, cid), 1, "not aborted");
    // The queue keeps working.
    let c = io.call(&h.m, flush());
    assert_eq!(c.status, Status::SUCCESS);
    assert!(h.m.pending_faults().is_empty());
    h.assert_clean();
}

#[test]
fn delayed_completion_released_explicitly_by_doorbells_or_abort() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 8);
    h.m.inject(Fault::DelayCompletion {
        on: Match::Queue(1),
        doorbells: None,
    });
    let late = io.push(flush());
    io.ring_sq(&h.m);
    assert!(io.poll().is_none());
    assert_eq!(h.m.delayed_completions(), 1);
    // Later commands overtake it.
    let c = io.call(&h.m, flush());
    assert_ne!(c.cid, late);
    assert_eq!(h.m.release_delayed(), 1);
    let c = io.poll().unwrap();
    assert_eq!((c.cid, c.status), (late, Status::SUCCESS));
    io.ring_cq(&h.m);

    // Released after two further doorbell writes.
    h.m.inject(Fault::DelayCompletion {
        on: Match::Queue(1),
        doorbells: Some(2),
    });
    let late = io.push(flush());
    io.ring_sq(&h.m);
    assert!(io.poll().is_none());
    h.m.write32(io.cq_doorbell(), io.head); // 1st
    assert!(io.poll().is_none());
    h.m.write32(io.cq_doorbell(), io.head); // 2nd
    assert_eq!(io.poll().map(|c| c.cid), Some(late));
    io.ring_cq(&h.m);

    // Aborted while held: completes with Command Abort Requested.
    h.m.inject(Fault::DelayCompletion {
        on: Match::Queue(1),
        doorbells: None,
    });
    let late = io.push(flush());
    io.ring_sq(&h.m);
    assert_eq!(abort(&mut h, 1, late), 0, "aborted");
    let c = io.poll().unwrap();
    assert_eq!((c.cid, c.status), (late, Status::ABORT_REQUESTED));
    io.ring_cq(&h.m);
    assert_eq!(h.m.delayed_completions(), 0);
    h.assert_clean();
}

#[test]
fn deleting_an_sq_aborts_its_delayed_commands() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 8);
    h.m.inject(Fault::DelayCompletion {
        on: Match::Queue(1),
        doorbells: None,
    });
    let late = io.push(flush());
    io.ring_sq(&h.m);
    let c = h.admin(Sqe::new(0x00).cdw(10, 1));
    assert_eq!(c.status, Status::SUCCESS);
    let c = io.poll().unwrap();
    assert_eq!((c.cid, c.status), (late, Status::ABORTED_SQ_DELETION));
    io.ring_cq(&h.m);
    assert_eq!(h.admin(Sqe::new(0x04).cdw(10, 1)).status, Status::SUCCESS);
    h.assert_clean();
}

#[test]
fn duplicate_corrupt_cid_bad_head_wrong_phase_and_status() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 16);

    h.m.inject(Fault::DuplicateCompletion(Match::Queue(1)));
    let cid = io.push(flush());
    io.ring_sq(&h.m);
    let a = io.poll().unwrap();
    let b = io.poll().unwrap();
    assert_eq!((a.cid, b.cid), (cid, cid));
    assert!(io.poll().is_none());
    io.ring_cq(&h.m);

    h.m.inject(Fault::CorruptCid {
        on: Match::Queue(1),
        xor: 0x8000,
    });
    let cid = io.push(flush());
    io.ring_sq(&h.m);
    assert_eq!(io.poll().unwrap().cid, cid ^ 0x8000);

    h.m.inject(Fault::BadSqHead {
        on: Match::Queue(1),
        sqhd: 999,
    });
    io.push(flush());
    io.ring_sq(&h.m);
    assert_eq!(io.poll().unwrap().sqhd, 999);

    h.m.inject(Fault::Status {
        on: Match::Opcode {
            qid: 1,
            opcode: 0x02,
        },
        status: Status::INTERNAL_ERROR,
    });
    let buf = h.buffer(4096);
    buf.fill(0, 4096, 0x5a).unwrap();
    io.push(rw(0x02, 0, 1, buf.iova(), 0));
    io.ring_sq(&h.m);
    assert_eq!(io.poll().unwrap().status, Status::INTERNAL_ERROR);
    assert_eq!(buf.to_vec(), vec![0x5a; 4096], "not executed");
    io.ring_cq(&h.m);

    h.m.inject(Fault::WrongPhase(Match::Queue(1)));
    let slot = io.head;
    let cid = io.push(flush());
    io.ring_sq(&h.m);
    assert!(io.poll().is_none(), "looks stale");
    let raw = io.peek(slot);
    assert_eq!((raw.cid, raw.phase), (cid, !io.phase));
    h.assert_clean();
}

#[test]
fn nth_command_match() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 8);
    let n = h.m.commands_fetched();
    h.m.inject(Fault::Status {
        on: Match::Nth(n + 1),
        status: Status::INTERNAL_ERROR,
    });
    assert_eq!(io.call(&h.m, flush()).status, Status::SUCCESS);
    assert_eq!(io.call(&h.m, flush()).status, Status::INTERNAL_ERROR);
    assert_eq!(io.call(&h.m, flush()).status, Status::SUCCESS);
    h.assert_clean();
}

#[test]
fn fatal_status_stops_the_controller_until_reset() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 8);
    h.m.inject(Fault::FatalOn(Match::Nth(h.m.commands_fetched() + 1)));
    io.push(flush());
    io.push(flush());
    io.push(flush());
    io.ring_sq(&h.m);
    assert_eq!(io.poll().map(|c| c.status), Some(Status::SUCCESS));
    assert!(io.poll().is_none(), "nothing after the fatal error");
    assert_eq!(h.m.read32(0x1c) & 2, 2, "CSTS.CFS");
    // Doorbells to a failed controller are ignored, not violations.
    io.push(flush());
    io.ring_sq(&h.m);
    assert!(io.poll().is_none());
    // Reset clears it.
    h.m.write32(0x14, 0);
    assert_eq!(h.m.read32(0x1c), 0);
    h.assert_clean();

    let h = Host::new();
    h.m.set_fatal();
    assert_eq!(h.m.read32(0x1c), 3, "RDY and CFS");
}

#[test]
fn unplugged_device_reads_all_ones_and_goes_silent() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 8);
    h.m.inject(Fault::UnplugOn(Match::Queue(1)));
    io.push(flush());
    io.ring_sq(&h.m);
    assert!(io.poll().is_none());
    assert!(h.m.is_unplugged());
    assert_eq!(h.m.read32(0x1c), u32::MAX);
    assert_eq!(h.m.read64(0), u64::MAX);
    assert_eq!(h.m.csts(), u32::MAX);
    h.m.write32(0x14, 0);
    assert_eq!(h.m.cc() & 1, 1, "writes ignored");
    h.m.raise_async_event(0, 1, 2);
    assert_eq!(h.m.release_delayed(), 0);
    assert!(h.m.alloc_dma(4096).is_ok(), "host memory still allocates");
    h.assert_clean();
}

#[test]
fn async_events() {
    let mut h = Host::new();
    // AERL = 3: four requests are held, the fifth fails.
    let cids: Vec<u16> = (0..4).map(|_| h.admin.push(Sqe::new(0x0c))).collect();
    h.admin.ring_sq(&h.m);
    assert!(h.admin.poll().is_none());
    assert_eq!(h.m.outstanding_async_requests(), 4);
    let c = h.admin(Sqe::new(0x0c));
    assert_eq!(c.status, Status::AER_LIMIT_EXCEEDED);

    h.m.raise_async_event(1, 0x01, 0x02); // SMART / health: temperature
    let c = h.admin.poll().unwrap();
    assert_eq!(
        (c.cid, c.status, c.dw0),
        (cids[0], Status::SUCCESS, 0x02_01_01)
    );
    h.admin.ring_cq(&h.m);
    // Abort one: its completion is posted before the Abort's own.
    let abort_cid = h
        .admin
        .push(Sqe::new(0x08).cdw(10, u32::from(cids[1]) << 16));
    h.admin.ring_sq(&h.m);
    let c = h.admin.poll().unwrap();
    assert_eq!((c.cid, c.status), (cids[1], Status::ABORT_REQUESTED));
    let c = h.admin.poll().unwrap();
    assert_eq!((c.cid, c.status, c.dw0), (abort_cid, Status::SUCCESS, 0));
    h.admin.ring_cq(&h.m);
    assert_eq!(h.m.outstanding_async_requests(), 2);

    // An event with no request outstanding waits for one.
    let mut h2 = Host::new();
    h2.m.raise_async_event(2, 0, 0x03);
    let c = h2.admin(Sqe::new(0x0c));
    assert_eq!(c.dw0, 0x03_00_02);
    h.assert_clean();
    h2.assert_clean();
}

#[test]
fn raw_completions_and_identify_overrides() {
    let mut h = Host::new();
    let mut io = h.create_pair(1, 4);
    // Any CID/SQ head/status, posted with the current phase.
    assert!(h.m.post_raw_completion(1, [7, 0, 0xffff_0123, 0xbeef | 0x4002 << 17]));
    let c = io.poll().unwrap();
    assert_eq!((c.dw0, c.sqhd, c.sqid, c.cid), (7, 0x123, 0xffff, 0xbeef));
    assert_eq!(c.status, Status(0x4002));
    assert!(h.m.post_raw_completion(1, [0; 4]));
    assert!(h.m.post_raw_completion(1, [0; 4]));
    assert!(!h.m.post_raw_completion(1, [0; 4]), "CQ full");
    assert!(!h.m.post_raw_completion(9, [0; 4]), "no such CQ");
    assert!(h.m.violations().is_empty());

    h.m.set_identify_data(1, 0, Some(vec![0xab; 10]));
    let buf = h.buffer(4096);
    let c = h.admin(Sqe::new(0x06).prp1(buf.iova()).cdw(10, 1));
    assert_eq!(c.status, Status::SUCCESS);
    let page = buf.to_vec();
    assert_eq!((page[9], page[10]), (0xab, 0));
    h.m.set_identify_data(1, 0, None);
    h.admin(Sqe::new(0x06).prp1(buf.iova()).cdw(10, 1));
    assert_eq!(buf.to_vec()[512], 0x66);
    h.assert_clean();
}
