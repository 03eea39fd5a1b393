//! The plain data command, compiled on its own: a Read or Write of one
//! buffer (whole, or a slice of it) on a namespace without metadata, with no
//! vector, no metadata buffer and no protection fields — the I/O nearly
//! every application issues.
//!
//! It checks everything the general path (`submit.rs`) checks for such a
//! command: the pair's state word, the namespace handle (this controller's,
//! not retired), the buffer's IOMMU mapping (this controller's), the LBA
//! range and NLB, the buffer's room for the transfer,
//! MDTS, the depth with parked completions, and the tracker free stack.
//! When a check does not pass (or the command is not plain), the command
//! goes to the general path untouched, which checks again and refuses with
//! the reason, or catches up with a reset first. So the refusals and their
//! reasons are the general path's, and this path adds no case of its own:
//! it only leaves out the branches, registers and stores that a vector, a
//! metadata buffer or protection information would need.

use upnvme_queues::sgl::PSDT_SGL_MPTR_ADDRESS;
use upnvme_queues::sqe::{io_qwords, opcode::nvm};

use super::iodata::IoData;
use super::submit::{check_range, slice_room};
use super::{IoCommand, IoQueuePair};
use crate::device::Device;
use crate::error::{Reject, Rejected};

/// A Read or Write that passed the plain path's checks: what the SQE needs.
#[derive(Clone, Copy)]
pub(super) struct Plain {
    op: u8,
    nsid: u32,
    slba: u64,
    /// CDW12: NLB (0-based) and the flags.
    cdw12: u32,
    /// Bytes transferred.
    bytes: usize,
}

impl<D: Device> IoQueuePair<D> {
    /// `Some` when `cmd` with `io` is a plain Read or Write (see the module
    /// docs) that every check lets through now; `None` sends it to the
    /// general path.
    #[inline(always)]
    pub(super) fn plain(&self, cmd: &IoCommand<'_>, io: &IoData) -> Option<Plain> {
        let (op, ns, slba, blocks) = match *cmd {
            IoCommand::Read { ns, slba, blocks } => (nvm::READ, ns, slba, blocks),
            IoCommand::Write { ns, slba, blocks } => (nvm::WRITE, ns, slba, blocks),
            _ => return None,
        };
        let buf = io.buffer.as_ref()?;
        let len = buf.len();
        if buf.domain() != self.domain {
            return None;
        }
        if io.segments.is_some() || io.metadata.is_some() || io.protection.is_some() {
            return None;
        }
        if !self.current()
            || !ns.is_plain_for(self.instance)
            || check_range(ns, slba, blocks).is_err()
        {
            return None;
        }
        // A multiply: a shift by a loaded count needs CL, which costs the
        // register shuffling around it (measured: 5 instructions).
        let bytes = blocks as usize * ns.lba_size() as usize;
        let room = slice_room(len, io.offset, io.limit).ok()?;
        if room < bytes || bytes > self.max_transfer {
            return None;
        }
        // Completions parked in `ready` count against the depth too (see
        // `queue_sqe_with`).
        if !self.ready.is_empty()
            && self.trackers.in_flight() + self.ready.len() as u32 >= self.max_depth
        {
            return None;
        }
        Some(Plain {
            op,
            nsid: ns.id(),
            slba,
            // CDW12.NLB is 0-based (`check_range` refused 0 blocks).
            cdw12: (blocks - 1) | io.flags.cdw12(),
            bytes,
        })
    }

    /// Queues a command [`IoQueuePair::plain`] let through: tracker, data
    /// pointer, SQE, and (announcing at once) the shadow doorbell. Returns
    /// the slot; the only refusals left are a full tracker stack and a data
    /// pointer the slot's list page cannot hold.
    #[inline(always)]
    pub(super) fn queue_plain(&mut self, p: Plain, io: IoData, tag: u64) -> Result<u16, Rejected> {
        let IoData {
            buffer,
            offset,
            flags,
            ..
        } = io;
        debug_assert!(flags.cdw12() == p.cdw12 & 0xc000_0000);
        let iova = buffer.as_ref().map_or(0, |b| b.iova()) + offset as u64;
        // The tracker before the SQE and the doorbell (see the module docs
        // of `qpair`). Its vector and metadata are `None` already: every
        // path that frees a slot takes them.
        let Some((cid, t)) = self.trackers.alloc_mut() else {
            return Err(Rejected::with_memory(Reject::QueueFull, buffer, None, None));
        };
        debug_assert!(!t.extras && t.segments.is_none() && t.metadata.is_none());
        t.tag = tag;
        // Every path that frees a slot took its buffer, so there is nothing
        // to drop here (and were one left, leaking it would be the safe side:
        // the device might still own it).
        let old = std::mem::replace(&mut t.buffer, buffer);
        debug_assert!(old.is_none());
        std::mem::forget(old);
        t.stamp = 0;
        t.aborted = false;
        // Where `push` below puts the SQE (a retried push after `sq_full`
        // too: a push always takes the tail slot).
        t.sq_pos = self.sq_ring.tail();
        let slot = cid.slot;
        // CQ space for this command before anything announces it.
        self.cq_space_for_submit();
        // PRP1 alone, or PRP1 and PRP2, for one or two memory pages (NVMe 2.0
        // §4.3.1); [iova, iova + bytes) lies inside the buffer's IOVA range,
        // so nothing overflows.
        let (prp1, prp2, sgl) = match self.inline_prp(iova, p.bytes) {
            Some((prp1, prp2)) => (prp1, prp2, false),
            None => match self.place_contiguous(iova, p.bytes, slot) {
                Ok(d) => d,
                Err(reason) => return Err(self.unqueue(slot, reason)),
            },
        };
        let pos = match self.sq_ring.push() {
            Some(pos) => pos,
            None => self.sq_full(slot)?,
        };
        let mut q = io_qwords(p.op, cid.value, p.nsid, prp1, prp2, p.slba, p.cdw12);
        q[0] |= u64::from(sgl) * u64::from(PSDT_SGL_MPTR_ADDRESS);
        self.write_sqe_and_announce(pos, &q, slot)
    }
}
