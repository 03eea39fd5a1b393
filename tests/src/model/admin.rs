//! Admin command set (NVMe Base Specification 2.0, §5): dispatch, queue
//! management (Create/Delete I/O Submission and Completion Queue, §5.4-§5.7),
//! Abort (§5.1), Asynchronous Event Request (§5.2), Keep Alive and
//! Doorbell Buffer Config (§5.8). Identify, features and log pages have their
//! own modules.

use super::command::{Command, admin_op};
use super::config::NamespaceConfig;
use super::engine::Outcome;
use super::state::{CompQueue, Completion, Shadow, State, SubQueue};
use super::status::Status;

impl State {
    /// Executes an admin command fetched from the admin submission queue.
    pub(crate) fn admin(&mut self, cmd: &Command) -> Outcome {
        match cmd.opcode() {
            admin_op::DELETE_IO_SQ => self.delete_io_sq(cmd),
            admin_op::CREATE_IO_SQ => self.create_io_sq(cmd),
            admin_op::GET_LOG_PAGE => self.get_log_page(cmd),
            admin_op::DELETE_IO_CQ => self.delete_io_cq(cmd),
            admin_op::CREATE_IO_CQ => self.create_io_cq(cmd),
            admin_op::IDENTIFY => self.identify(cmd),
            admin_op::ABORT => self.abort(cmd),
            admin_op::SET_FEATURES => self.set_features(cmd),
            admin_op::GET_FEATURES => self.get_features(cmd),
            admin_op::ASYNC_EVENT_REQUEST => self.async_event_request(),
            admin_op::KEEP_ALIVE if self.cfg.keep_alive => Outcome::ok(0),
            admin_op::DOORBELL_BUFFER_CONFIG if self.cfg.oacs_dbbc => {
                self.doorbell_buffer_config(cmd)
            }
            admin_op::FORMAT_NVM => self.format_nvm(cmd),
            _ => Outcome::err(Status::INVALID_OPCODE.with_dnr()),
        }
    }

    /// Format NVM: CDW10 LBAFL (3:0), MSET (4), PI (7:5), PIL (8), SES
    /// (11:9), LBAFU (13:12); NSID one namespace or FFFFFFFFh for all. The
    /// data is erased (reads as zeros afterwards) and Identify Namespace
    /// reports the new format. Invalid Format (Command Specific 0Ah) for a
    /// format index past NLBAF, PI without room for the 8-byte tuple, a PI
    /// type or location the namespace's DPC does not offer, or a Secure
    /// Erase Setting other than 0 or 1.
    fn format_nvm(&mut self, cmd: &Command) -> Outcome {
        const INVALID_FORMAT: Status = Status::new(1, 0x0a);
        let cdw10 = cmd.cdw(10);
        let lbaf = (cdw10 & 0xf | (cdw10 >> 12 & 0x3) << 4) as usize;
        let (mset, pi, pil, ses) = (
            cdw10 >> 4 & 1 != 0,
            (cdw10 >> 5 & 0x7) as u8,
            cdw10 >> 8 & 1 != 0,
            cdw10 >> 9 & 0x7,
        );
        let Some(&(lba_size, ms)) = NamespaceConfig::LBA_FORMATS.get(lbaf) else {
            return Outcome::err(INVALID_FORMAT.with_dnr());
        };
        if pi > 3 || (pi != 0 && ms < 8) || ses > 1 {
            return Outcome::err(INVALID_FORMAT.with_dnr());
        }
        let nsid = cmd.nsid();
        let targets: Vec<usize> = if nsid == 0xffff_ffff {
            (0..self.namespaces.len()).collect()
        } else {
            match self.namespace(nsid) {
                // FNA bit 0: formatting one namespace formats them all.
                Some(_) if self.cfg.fna & 1 != 0 => (0..self.namespaces.len()).collect(),
                Some(i) => vec![i],
                None => return Outcome::err(Status::INVALID_NAMESPACE.with_dnr()),
            }
        };
        // PI type and location must be among those the namespace reports
        // (DPC bits 2:0 the types, bit 3 first, bit 4 last 8 bytes).
        let location = if pil { 1 << 3 } else { 1 << 4 };
        if pi != 0
            && targets.iter().any(|&i| {
                let dpc = self.namespaces[i].cfg.dpc;
                dpc & (1 << (pi - 1)) == 0 || dpc & location == 0
            })
        {
            return Outcome::err(INVALID_FORMAT.with_dnr());
        }
        for i in targets {
            let ns = &mut self.namespaces[i];
            // The capacity in bytes stays; the block count follows the new
            // LBA size (QEMU keeps the data + metadata image size).
            let bytes = ns.cfg.blocks * (u64::from(ns.cfg.lba_size) + u64::from(ns.cfg.ms));
            let cfg = NamespaceConfig {
                lba_size,
                ms,
                extended: mset,
                pi_type: pi,
                pi_first: pil,
                blocks: bytes / (u64::from(lba_size) + u64::from(ms)),
                ..ns.cfg
            };
            let id = ns.cfg.nsid;
            ns.format(cfg);
            // Whatever a test made its Identify Namespace say is replaced by
            // the new format's.
            self.identify_overrides.remove(&(0, id));
        }
        Outcome::ok(0)
    }

    /// Highest I/O SQ and CQ identifiers the host may create: what Set
    /// Features — Number of Queues granted, or `max_ioqpairs` before that.
    fn max_qids(&self) -> (u32, u32) {
        match self.features.granted {
            Some((nsqa, ncqa)) => (u32::from(nsqa) + 1, u32::from(ncqa) + 1),
            None => (
                u32::from(self.cfg.max_ioqpairs),
                u32::from(self.cfg.max_ioqpairs),
            ),
        }
    }

    /// Validates QSIZE (CDW10 bits 31:16, 0-based) against CAP.MQES.
    fn queue_size(&self, cdw10: u32) -> Option<u32> {
        let size = (cdw10 >> 16) + 1;
        (2..=u32::from(self.cfg.mqes) + 1)
            .contains(&size)
            .then_some(size)
    }

    /// Create I/O Completion Queue (§5.4): CDW10 QID (15:0), QSIZE (31:16);
    /// CDW11 PC (bit 0), IEN (bit 1), IV (31:16); PRP1 = queue base.
    fn create_io_cq(&mut self, cmd: &Command) -> Outcome {
        let (cdw10, cdw11) = (cmd.cdw(10), cmd.cdw(11));
        let qid = (cdw10 & 0xffff) as u16;
        let (pc, ien, iv) = (cdw11 & 1 != 0, cdw11 & 2 != 0, cdw11 >> 16);
        if qid == 0 || u32::from(qid) > self.max_qids().1 || self.cqs.contains_key(&qid) {
            return Outcome::err(Status::INVALID_QID.with_dnr());
        }
        let Some(size) = self.queue_size(cdw10) else {
            return Outcome::err(Status::INVALID_QUEUE_SIZE.with_dnr());
        };
        let base = cmd.prp1();
        if base == 0 || !base.is_multiple_of(self.regs.page_size()) {
            return Outcome::err(Status::PRP_OFFSET_INVALID.with_dnr());
        }
        if !pc {
            // CAP.CQR = 1: queues must be physically contiguous.
            return Outcome::err(Status::INVALID_FIELD.with_dnr());
        }
        // The vector is checked whether or not interrupts are enabled (as
        // QEMU, against its MSI-X table).
        if iv > u32::from(self.cfg.max_ioqpairs) {
            return Outcome::err(Status::INVALID_INTERRUPT_VECTOR.with_dnr());
        }
        self.queues_created = true;
        self.cqs.insert(qid, CompQueue::new(base, size, ien));
        Outcome::ok(0)
    }

    /// Create I/O Submission Queue (§5.5): CDW10 QID, QSIZE; CDW11 PC (bit
    /// 0), QPRIO (2:1), CQID (31:16); PRP1 = queue base.
    fn create_io_sq(&mut self, cmd: &Command) -> Outcome {
        let (cdw10, cdw11) = (cmd.cdw(10), cmd.cdw(11));
        let qid = (cdw10 & 0xffff) as u16;
        let cqid = (cdw11 >> 16) as u16;
        if cqid == 0 || !self.cqs.contains_key(&cqid) {
            return Outcome::err(Status::CQ_INVALID.with_dnr());
        }
        if qid == 0 || u32::from(qid) > self.max_qids().0 || self.sqs.contains_key(&qid) {
            return Outcome::err(Status::INVALID_QID.with_dnr());
        }
        let Some(size) = self.queue_size(cdw10) else {
            return Outcome::err(Status::INVALID_QUEUE_SIZE.with_dnr());
        };
        let base = cmd.prp1();
        if base == 0 || !base.is_multiple_of(self.regs.page_size()) {
            return Outcome::err(Status::PRP_OFFSET_INVALID.with_dnr());
        }
        if cdw11 & 1 == 0 {
            return Outcome::err(Status::INVALID_FIELD.with_dnr());
        }
        self.sqs.insert(
            qid,
            SubQueue {
                base,
                size,
                head: 0,
                tail: 0,
                frozen_head: None,
                cqid,
            },
        );
        Outcome::ok(0)
    }

    /// Delete I/O Submission Queue (§5.7): delayed completions of its
    /// commands are posted with Command Aborted due to SQ Deletion (as QEMU
    /// aborts outstanding requests); dropped ones are forgotten.
    fn delete_io_sq(&mut self, cmd: &Command) -> Outcome {
        let qid = (cmd.cdw(10) & 0xffff) as u16;
        if qid == 0 || !self.sqs.contains_key(&qid) {
            return Outcome::err(Status::INVALID_QID.with_dnr());
        }
        // The SQ's head when it goes: what the aborted completions report as
        // SQHD (the queue no longer exists when they are written).
        let head = self.sqs.remove(&qid).map_or(0, |s| s.head);
        self.dropped.retain(|&(s, _)| s != qid);
        let (aborted, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.c.sqid == qid);
        self.held = keep;
        for h in aborted {
            self.post(Completion {
                status: Status::ABORTED_SQ_DELETION,
                dw0: 0,
                plan: Default::default(),
                sqhd_hint: head,
                ..h.c
            });
        }
        Outcome::ok(0)
    }

    /// Delete I/O Completion Queue (§5.6): refused with Invalid Queue
    /// Deletion while an I/O SQ still completes to it.
    fn delete_io_cq(&mut self, cmd: &Command) -> Outcome {
        let qid = (cmd.cdw(10) & 0xffff) as u16;
        if qid == 0 || !self.cqs.contains_key(&qid) {
            return Outcome::err(Status::INVALID_QID.with_dnr());
        }
        if self.sqs.values().any(|s| s.cqid == qid) {
            return Outcome::err(Status::INVALID_QUEUE_DELETION.with_dnr());
        }
        self.cqs.remove(&qid);
        Outcome::ok(0)
    }

    /// Abort (§5.1): CDW10 SQID (15:0), CID (31:16). A command whose
    /// completion is delayed, or an outstanding Asynchronous Event Request,
    /// completes with Command Abort Requested and the Abort reports dword 0
    /// bit 0 = 0; anything else (already completed, or dropped by a fault)
    /// reports bit 0 = 1, "not aborted".
    fn abort(&mut self, cmd: &Command) -> Outcome {
        let cdw10 = cmd.cdw(10);
        let (sqid, cid) = ((cdw10 & 0xffff) as u16, (cdw10 >> 16) as u16);
        if let Some(i) = self
            .held
            .iter()
            .position(|h| h.c.sqid == sqid && h.c.cid == cid)
        {
            let h = self.held.remove(i);
            self.post(Completion {
                status: Status::ABORT_REQUESTED,
                dw0: 0,
                plan: Default::default(),
                ..h.c
            });
            return Outcome::ok(0);
        }
        if sqid == 0
            && let Some(i) = self.aers.iter().position(|a| a.cid == cid)
        {
            self.aers.remove(i);
            self.post(Completion {
                sqid: 0,
                cqid: 0,
                cid,
                dw0: 0,
                sqhd_hint: 0,
                status: Status::ABORT_REQUESTED,
                plan: Default::default(),
            });
            return Outcome::ok(0);
        }
        Outcome::ok(1)
    }

    /// Asynchronous Event Request (§5.2): completes at once with a queued
    /// event, otherwise stays outstanding; more than AERL + 1 outstanding is
    /// Asynchronous Event Request Limit Exceeded.
    fn async_event_request(&mut self) -> Outcome {
        if let Some(event) = self.take_unmasked_event() {
            return Outcome::ok(event);
        }
        if self.aers.len() > usize::from(self.cfg.aerl) {
            return Outcome::err(Status::AER_LIMIT_EXCEEDED);
        }
        Outcome::Parked
    }

    /// Doorbell Buffer Config (§5.8): PRP1 = Shadow Doorbell buffer, PRP2 =
    /// EventIdx buffer, each one memory page, page aligned.
    fn doorbell_buffer_config(&mut self, cmd: &Command) -> Outcome {
        let (db, ei) = (cmd.prp1(), cmd.prp2());
        let page = self.regs.page_size();
        if db == 0 || ei == 0 || db % page != 0 || ei % page != 0 {
            return Outcome::err(Status::INVALID_FIELD.with_dnr());
        }
        self.configure_shadow(Shadow { db, ei });
        Outcome::ok(0)
    }
}
