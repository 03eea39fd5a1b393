//! Shadow doorbells (Doorbell Buffer Config, NVMe Base Specification 2.0,
//! §5.8): the Shadow Doorbell buffer the host writes its SQ tails and CQ
//! heads into, and the EventIdx buffer through which the controller tells
//! the host which updates need an MMIO doorbell write. Entries sit at the
//! doorbell register's index: SQ y tail at `(2y) * (4 << CAP.DSTRD)`, CQ y
//! head at `(2y + 1) * (4 << CAP.DSTRD)`. As in QEMU, only I/O queues use
//! them; the EventIdx is set to the SQ tail consumed and the CQ head seen.

use super::memory::DmaFault;
use super::state::{Shadow, State};

impl State {
    /// Shadow doorbell buffer entry for doorbell `index` (2y for SQ y tail,
    /// 2y+1 for CQ y head), if inside the one-page buffer.
    fn shadow_slot(&self, base: u64, index: u64) -> Option<u64> {
        let off = index.checked_mul(self.stride())?;
        (off + 4 <= self.regs.page_size()).then(|| base.wrapping_add(off))
    }

    /// Reads the shadow CQ heads of every I/O queue, then the shadow SQ
    /// tails — every I/O SQ's when polled (`mmio` None), only the written
    /// SQ's after an MMIO SQ tail doorbell (the admin queue always uses MMIO
    /// doorbells, as in QEMU). The
    /// shadow value wins over an MMIO value written just before (as in
    /// QEMU), but a disagreement is recorded: with Doorbell Buffer Config
    /// active the host must update the shadow doorbell first (§5.8).
    pub(super) fn read_shadow(&mut self, sh: Shadow, mmio: Option<(u16, bool, u32)>) {
        let cqids: Vec<u16> = self.cqs.keys().copied().filter(|&q| q != 0).collect();
        for qid in cqids {
            let Some(at) = self.shadow_slot(sh.db, 2 * u64::from(qid) + 1) else {
                continue;
            };
            let read = self.mem.read_u32_acquire(at);
            self.check_mmio_matches_shadow(mmio, qid, true, &read);
            match read {
                Ok(v) if self.cqs.get(&qid).is_some_and(|c| c.head != v) => {
                    self.set_cq_head(qid, v, "shadow doorbell");
                }
                Ok(_) => {}
                Err(f) => self.dma_fault(f, "shadow doorbell read"),
            }
        }
        // SQ tails: every one when polled, only the doorbell's own SQ after
        // an MMIO write (none after a CQ head write), as QEMU reads an SQ's
        // shadow tail only when that SQ is processed.
        let sqids: Vec<u16> = self
            .sqs
            .keys()
            .copied()
            .filter(|&q| q != 0)
            .filter(|&q| mmio.is_none_or(|(m, is_cq, _)| !is_cq && m == q))
            .collect();
        for qid in sqids {
            let Some(at) = self.shadow_slot(sh.db, 2 * u64::from(qid)) else {
                continue;
            };
            let read = self.mem.read_u32_acquire(at);
            self.check_mmio_matches_shadow(mmio, qid, false, &read);
            match read {
                Ok(v) if self.sqs.get(&qid).is_some_and(|s| s.tail != v) => {
                    self.set_sq_tail(qid, v, "shadow doorbell");
                }
                Ok(_) => {}
                Err(f) => self.dma_fault(f, "shadow doorbell read"),
            }
        }
    }

    fn check_mmio_matches_shadow(
        &mut self,
        mmio: Option<(u16, bool, u32)>,
        qid: u16,
        is_cq: bool,
        shadow: &Result<u32, DmaFault>,
    ) {
        if let (Some((q, c, v)), Ok(sv)) = (mmio, shadow)
            && q == qid
            && c == is_cq
            && v != *sv
        {
            let what = if is_cq { "CQ head" } else { "SQ tail" };
            self.violation(format!(
                "{what} doorbell of queue {qid} written with {v} over MMIO while its shadow doorbell holds {sv}: with Doorbell Buffer Config active the shadow doorbell must be updated first"
            ));
        }
    }

    /// Writes each I/O queue's EventIdx: the SQ tail consumed and the CQ head
    /// observed (QEMU's rule).
    pub(super) fn write_event_idx(&mut self, sh: Shadow) {
        let mut writes = Vec::new();
        for (&qid, sq) in self.sqs.iter().filter(|(q, _)| **q != 0) {
            if let Some(at) = self.shadow_slot(sh.ei, 2 * u64::from(qid)) {
                writes.push((at, sq.tail));
            }
        }
        for (&qid, cq) in self.cqs.iter().filter(|(q, _)| **q != 0) {
            if let Some(at) = self.shadow_slot(sh.ei, 2 * u64::from(qid) + 1) {
                writes.push((at, cq.head));
            }
        }
        for (at, v) in writes {
            if let Err(f) = self.mem.write_u32_release(at, v) {
                self.dma_fault(f, "EventIdx write");
            }
        }
    }

    /// Enables shadow doorbells and seeds the buffers with the current
    /// values of existing I/O queues (as QEMU does).
    pub(super) fn configure_shadow(&mut self, sh: Shadow) {
        self.shadow = Some(sh);
        let mut writes = Vec::new();
        for (&qid, sq) in self.sqs.iter().filter(|(q, _)| **q != 0) {
            writes.push((2 * u64::from(qid), sq.tail));
        }
        for (&qid, cq) in self.cqs.iter().filter(|(q, _)| **q != 0) {
            writes.push((2 * u64::from(qid) + 1, cq.head));
        }
        for (index, v) in writes {
            for base in [sh.db, sh.ei] {
                if let Some(at) = self.shadow_slot(base, index)
                    && let Err(f) = self.mem.write_u32_release(at, v)
                {
                    self.dma_fault(f, "shadow buffer initialisation");
                }
            }
        }
    }
}
