//! The queue engine: doorbell writes (NVMe Base Specification 2.0: SQyTDBL,
//! Submission Queue y Tail Doorbell, and CQyHDBL, Completion Queue y Head
//! Doorbell) and their rules, then fetching and executing commands. Shadow
//! doorbells are in `shadow`, completion posting in `post`.
//!
//! Everything happens synchronously inside the doorbell write that makes it
//! due: the model is a controller that fetches, executes and completes
//! instantly, except where a fault holds a completion back or the
//! completion queue is full.

use super::command::{Command, SQE_SIZE};
use super::state::{Completion, ParkedAer, State};
use super::status::Status;

/// What executing a command produced.
pub(crate) enum Outcome {
    /// Complete now with this status and dword 0.
    Done(Status, u32),
    /// An Asynchronous Event Request: completes when an event occurs.
    Parked,
}

impl Outcome {
    /// Successful completion with dword 0 = `dw0`.
    pub fn ok(dw0: u32) -> Outcome {
        Outcome::Done(Status::SUCCESS, dw0)
    }

    /// Completion with an error status.
    pub fn err(status: Status) -> Outcome {
        Outcome::Done(status, 0)
    }
}

impl State {
    /// True when the host may ring doorbells: enabled, ready, not shut down.
    fn accepting(&self) -> bool {
        self.regs.cc & 1 != 0 && self.regs.rdy && !self.shut_down
    }

    /// An MMIO write to the doorbell area at BAR0 offset `offset`.
    pub fn doorbell(&mut self, offset: usize, value: u32) {
        let stride = self.stride();
        let rel = (offset - super::regs::DOORBELLS) as u64;
        if !rel.is_multiple_of(stride) {
            self.violation(format!(
                "write of {value:#x} at {offset:#x}: not a doorbell (stride {stride})"
            ));
            return;
        }
        let index = rel / stride;
        let Ok(qid) = u16::try_from(index / 2) else {
            self.violation(format!(
                "doorbell write at {offset:#x}: queue id out of range"
            ));
            return;
        };
        let is_cq = index % 2 == 1;
        let counts = self.stats.doorbells.entry(qid).or_default();
        if is_cq {
            counts.1 += 1;
        } else {
            counts.0 += 1;
        }
        self.stats.doorbell_total += 1;
        if self.fatal {
            // A failed controller ignores doorbells; the host learns about it
            // from CSTS.CFS, so this is not the host's fault.
            return;
        }
        if !self.accepting() {
            self.violation(format!(
                "{} doorbell of queue {qid} written ({value}) while the controller is not ready (CC {:#x}, CSTS {:#x})",
                if is_cq { "CQ head" } else { "SQ tail" },
                self.regs.cc,
                self.csts_peek()
            ));
            return;
        }
        let Ok(v) = u16::try_from(value) else {
            self.violation(format!(
                "doorbell of queue {qid} written with {value:#x}: bits 31:16 are reserved"
            ));
            return;
        };
        if is_cq {
            self.set_cq_head(qid, u32::from(v), "doorbell");
        } else {
            self.set_sq_tail(qid, u32::from(v), "doorbell");
        }
        self.wake_after(Some((qid, is_cq, u32::from(v))));
    }

    /// A new SQ tail from the host; recorded and ignored when invalid.
    pub(super) fn set_sq_tail(&mut self, qid: u16, tail: u32, how: &str) {
        let Some(sq) = self.sqs.get_mut(&qid) else {
            self.violation(format!(
                "SQ {qid} tail {how} written ({tail}) but the queue does not exist"
            ));
            return;
        };
        if tail >= sq.size {
            let size = sq.size;
            self.violation(format!(
                "SQ {qid} tail {how} {tail} beyond the queue size ({size} entries)"
            ));
            return;
        }
        sq.tail = tail;
    }

    /// A new CQ head from the host; recorded and ignored when invalid, and
    /// completions held for lack of space are posted.
    pub(super) fn set_cq_head(&mut self, qid: u16, head: u32, how: &str) {
        let Some(cq) = self.cqs.get_mut(&qid) else {
            self.violation(format!(
                "CQ {qid} head {how} written ({head}) but the queue does not exist"
            ));
            return;
        };
        if head >= cq.size {
            let size = cq.size;
            self.violation(format!(
                "CQ {qid} head {how} {head} beyond the queue size ({size} entries)"
            ));
            return;
        }
        let advance = (head + cq.size - cq.head) % cq.size;
        if advance > cq.posted() {
            let (old, tail) = (cq.head, cq.tail);
            self.violation(format!(
                "CQ {qid} head {how} {head} releases entries not yet posted (head was {old}, next post at {tail})"
            ));
            return;
        }
        cq.head = head;
        self.flush_backlog(qid);
    }

    /// The controller wakes up after a doorbell write (or when a test polls
    /// the shadow doorbells): reads the shadow doorbells, posts delayed
    /// completions that are due, processes every submission queue.
    pub fn wake(&mut self) {
        self.wake_after(None);
    }

    /// [`State::wake`] after an MMIO doorbell write of `mmio` = (queue,
    /// is CQ head, value). As in QEMU, an MMIO write wakes its own queue
    /// only: an SQ tail doorbell fetches from that SQ (its shadow tail read
    /// first), a CQ head doorbell frees that CQ's space (held completions
    /// are posted); other SQs' shadow tails are not read, so a command
    /// announced only in the shadow — an MMIO write wrongly skipped — stays
    /// unfetched until its own doorbell (or `process_shadow`, the explicit
    /// poll of every queue). The shadow CQ heads are read at every wake, as
    /// QEMU reads a CQ's before it posts to it.
    fn wake_after(&mut self, mmio: Option<(u16, bool, u32)>) {
        if self.gone || self.fatal {
            return;
        }
        let shadow = self.shadow;
        if let Some(sh) = shadow {
            self.read_shadow(sh, mmio);
        }
        self.release_due();
        match mmio {
            None => self.process_all(),
            Some((qid, false, _)) => self.process_sq(qid),
            Some((_, true, _)) => {}
        }
        if let Some(sh) = shadow
            && !self.event_idx_frozen
        {
            self.write_event_idx(sh);
        }
    }

    /// Fetches and executes everything between each SQ's head and tail,
    /// admin queue first.
    fn process_all(&mut self) {
        let qids: Vec<u16> = self.sqs.keys().copied().collect();
        for qid in qids {
            self.process_sq(qid);
        }
    }

    fn process_sq(&mut self, qid: u16) {
        loop {
            if self.gone || self.fatal || self.shut_down {
                return;
            }
            let Some(sq) = self.sqs.get_mut(&qid) else {
                return;
            };
            if sq.head == sq.tail {
                return;
            }
            let at = sq
                .base
                .wrapping_add(u64::from(sq.head).wrapping_mul(SQE_SIZE));
            sq.head = (sq.head + 1) % sq.size;
            let head = sq.head;
            let mut raw = [0u8; 64];
            if let Err(f) = self.mem.read(at, &mut raw) {
                self.dma_fault(f, &format!("SQ {qid} entry fetch"));
                continue;
            }
            self.execute(qid, head, Command::new(raw));
        }
    }

    /// [`Fault::RewriteSqe`](super::Fault::RewriteSqe): the slot just
    /// fetched (the one before the new head `sqhd`) written back with the
    /// CID inverted — a DMA write, which faults where the SQ is mapped for
    /// device reads only.
    fn rewrite_sqe(&mut self, sqid: u16, sqhd: u32, cmd: &Command) {
        let Some(sq) = self.sqs.get(&sqid) else {
            return;
        };
        let slot = (sqhd + sq.size - 1) % sq.size;
        let at = sq.base.wrapping_add(u64::from(slot).wrapping_mul(SQE_SIZE));
        let mut raw = *cmd.raw();
        raw[2] ^= 0xff;
        raw[3] ^= 0xff;
        if let Err(f) = self.mem.write(at, &raw) {
            self.dma_fault(f, &format!("SQ {sqid} entry rewrite"));
        }
    }

    /// Executes one fetched command and delivers its completion.
    fn execute(&mut self, sqid: u16, sqhd: u32, cmd: Command) {
        let (opcode, cid) = (cmd.opcode(), cmd.cid());
        let index = self.stats.fetched;
        self.stats.fetched += 1;
        if self.stats.seen.len() < super::state::MAX_SEEN {
            self.stats.seen.push((sqid, opcode, cid));
        }
        if self.stats.recent.len() == super::state::RECENT_SQES {
            self.stats.recent.pop_front();
        }
        self.stats.recent.push_back((sqid, *cmd.raw()));
        let plan = self.faults.plan_for(sqid, &cmd, index);
        if plan.rewrite_sqe {
            self.rewrite_sqe(sqid, sqhd, &cmd);
        }
        if let Some((nsid, to)) = plan.change_namespace {
            self.change_namespace(nsid, to);
        }
        if plan.unplug {
            self.gone = true;
            return;
        }
        if plan.fatal {
            self.fatal = true;
            return;
        }
        let cqid = self.sqs.get(&sqid).map_or(0, |s| s.cqid);
        if self.cid_outstanding(sqid, cid) {
            self.violation(format!(
                "SQ {sqid}: command identifier {cid:#06x} (opcode {opcode:#04x}) reused while a command with it is still outstanding"
            ));
        }
        let outcome = if let Some(status) = plan.status {
            Outcome::err(status)
        } else if cmd.fuse() != 0 {
            // FUSES = 0: fused operations are not supported.
            Outcome::err(Status::INVALID_FIELD.with_dnr())
        } else if sqid == 0 && cmd.psdt() != 0 {
            // SGLs shall not be used for Admin commands over PCIe (as
            // QEMU's nvme_admin_cmd: Invalid Field).
            self.violation(format!(
                "admin opcode {opcode:#04x} CID {cid:#06x} with PSDT {:#04b}: SGLs shall not be used for Admin commands",
                cmd.psdt()
            ));
            Outcome::err(Status::INVALID_FIELD.with_dnr())
        } else if sqid == 0 {
            self.admin(&cmd)
        } else {
            self.io(&cmd)
        };
        match outcome {
            Outcome::Parked => self.aers.push(ParkedAer { cid, plan }),
            Outcome::Done(status, dw0) => {
                if !status.is_success() && plan.status.is_none() {
                    self.errors.record(sqid, cid, status, cmd.nsid());
                }
                self.deliver(Completion {
                    sqid,
                    cqid,
                    cid,
                    dw0,
                    sqhd_hint: sqhd,
                    status,
                    plan,
                });
            }
        }
    }
}
