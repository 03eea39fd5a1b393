//! Transfers larger than one command may carry: a Read, Write or Compare of
//! one buffer (whole, or a slice) above the controller's MDTS, or above the
//! 65536 blocks of CDW12.NLB, is split into child commands, and the caller
//! gets one completion for the whole when the last child ends.
//!
//! - **Where the split happens.** Only after the command was refused as it
//!   is (`build` answered [`Reject::TransferTooLarge`], or
//!   [`Reject::BlockCount`] above 65536 blocks): the plain path and every
//!   command that fits pay nothing for it.
//! - **The pieces.** Each child moves at most `MDTS / bytes per block`
//!   whole blocks (and at most 65536), in LBA order; child *i* starts at
//!   block `b` of the command: SLBA + b, the data at buffer offset
//!   `b × bytes per block` (an extended-LBA format counts its interleaved
//!   metadata), a separate metadata buffer at `b × MS`, and a given
//!   reference tag plus `b` on Types 1 and 2 (NVM Command Set 1.0 §5.2.1.3:
//!   the tag increments per block). Each child is checked by the same
//!   `build` as any command, so a split refuses exactly what the pieces
//!   would refuse on their own.
//! - **All or nothing.** Every child is checked, and the free CID slots
//!   counted, before the first is written: a refused split queued nothing
//!   and hands everything back ([`Reject::QueueFull`] when the slots are
//!   not free now; the original reason when the split can never fit:
//!   more children than the pair's depth, a block larger than MDTS, or a
//!   block size that would start a child off a dword boundary).
//! - **One completion.** A child's tracker holds no memory: the parent
//!   (here) holds the tag, the buffer and the metadata buffer, and is handed
//!   back when the last child's slot is released — by a reap, a reset, a
//!   close — so the buffer goes back only when the device can reach none of
//!   it. The result is the first child error seen (a media error in one
//!   piece fails the whole), else `Ok` with the last child's dword 0.
//!   Children are counted as commands in [`crate::QueueStats`].

use upnvme_dma::DmaBuffer;

use super::command::{Completion, IoCommand};
use super::iodata::IoData;
use super::metadata::{bytes_per_block, ref_tag_after};
use super::submit::{MdMem, Mem};
use super::{IoQueuePair, PAGE};
use crate::device::Device;
use crate::error::{IoError, Reject, Rejected};

/// What identifies a command until its completion is handed out: its CID
/// slot, or `SPLIT_KEY | index` for a split command (slots are below
/// 10000h).
pub(super) type Key = u32;

/// The key bit of a split command.
pub(super) const SPLIT_KEY: Key = 1 << 16;

/// Most blocks one command moves (CDW12.NLB is 16 bits, 0-based).
const MAX_NLB: u64 = 0x1_0000;

/// A split command until its last child ends.
#[derive(Debug)]
struct Parent {
    tag: u64,
    buffer: Option<DmaBuffer>,
    metadata: Option<DmaBuffer>,
    /// Children not ended yet.
    remaining: u32,
    /// The first child error.
    error: Option<IoError>,
    /// Dword 0 of the last child that succeeded.
    dw0: u32,
}

/// The split commands of a pair: a slab whose capacity (half the pair's
/// depth: every split has at least two children) is reserved at the first
/// split, so later splits allocate nothing.
#[derive(Debug, Default)]
pub(super) struct Splits {
    parents: Vec<Option<Parent>>,
    free: Vec<u16>,
}

impl Splits {
    /// Takes `parent` in; hands it back when no entry is free.
    fn alloc(&mut self, max_depth: u32, parent: Parent) -> Result<u16, Parent> {
        if self.parents.is_empty() {
            let n = (max_depth / 2).max(1) as usize;
            self.parents.reserve_exact(n);
            self.parents.resize_with(n, || None);
            self.free = (0..n as u16).rev().collect();
        }
        let Some(i) = self.free.pop() else {
            return Err(parent);
        };
        self.parents[usize::from(i)] = Some(parent);
        Ok(i)
    }

    /// Whether split `index` still waits for a child.
    pub(super) fn is_live(&self, index: u16) -> bool {
        matches!(self.parents.get(usize::from(index)), Some(Some(_)))
    }

    /// Every buffer the parents hold (for a pair whose queues may outlive
    /// it: the device may still reach them).
    pub(super) fn take_buffers(&mut self) -> impl Iterator<Item = DmaBuffer> + '_ {
        self.parents
            .iter_mut()
            .filter_map(Option::take)
            .flat_map(|p| p.buffer.into_iter().chain(p.metadata))
    }
}

/// Whether a refusal of a Read, Write or Compare of one buffer is one a
/// split may cure.
pub(super) fn may_split(reason: Reject, io: &IoData) -> bool {
    let size = match reason {
        Reject::TransferTooLarge { .. } => true,
        Reject::BlockCount { blocks } => u64::from(blocks) > MAX_NLB,
        _ => false,
    };
    size && io.buffer.is_some() && io.segments.is_none()
}

/// Child `i`'s command and memory.
struct Child<'a> {
    cmd: IoCommand<'a>,
    mem: Mem<'a>,
    md: Option<MdMem>,
    protection: Option<super::Protection>,
    /// Buffer offset of its data.
    offset: usize,
}

impl<D: Device> IoQueuePair<D> {
    /// Splits `cmd` (refused as a whole for `reason`, see [`may_split`])
    /// into child commands and queues them, all or none. Returns the key.
    #[cold]
    #[inline(never)]
    pub(super) fn queue_split(
        &mut self,
        cmd: IoCommand<'_>,
        io: IoData,
        tag: u64,
        reason: Reject,
    ) -> Result<Key, Rejected> {
        let refuse = |reason: Reject, io: IoData| {
            Err(Rejected::with_memory(
                reason,
                io.buffer,
                io.segments,
                io.metadata,
            ))
        };
        let (ns, slba, blocks) = match cmd {
            IoCommand::Read { ns, slba, blocks }
            | IoCommand::Write { ns, slba, blocks }
            | IoCommand::Compare { ns, slba, blocks } => (ns, slba, u64::from(blocks)),
            _ => return refuse(reason, io),
        };
        let Some(len) = io.buffer.as_ref().map(DmaBuffer::len) else {
            return refuse(reason, io);
        };
        let (block_bytes, md_bytes) = bytes_per_block(ns, io.protection);
        let per = (self.max_transfer / block_bytes).min(MAX_NLB as usize) as u64;
        // `per` = 0: one block is above MDTS. A block size that is not a
        // multiple of 4 would start children off the dword alignment PRPs
        // and MPTR need.
        if per == 0 || block_bytes % 4 != 0 || md_bytes % 4 != 0 {
            return refuse(reason, io);
        }
        let k = blocks.div_ceil(per);
        if k > u64::from(self.max_depth) {
            return refuse(reason, io);
        }
        let k = k as u32;
        if self.trackers.free_slots() < k
            || (!self.ready.is_empty()
                && self.trackers.in_flight() + self.ready.len() as u32 + k > self.max_depth)
        {
            return refuse(Reject::QueueFull, io);
        }
        let (io_offset, io_limit, io_protection, flags) =
            (io.offset, io.limit, io.protection, io.flags);
        let md_mem = io.metadata.as_ref().map(|m| MdMem {
            iova: m.iova(),
            len: m.len(),
        });
        let child = |i: u32| -> Child<'_> {
            let b = u64::from(i) * per;
            let n = per.min(blocks - b) as u32;
            let cmd = match cmd {
                IoCommand::Read { ns, .. } => IoCommand::Read {
                    ns,
                    slba: slba + b,
                    blocks: n,
                },
                IoCommand::Write { ns, .. } => IoCommand::Write {
                    ns,
                    slba: slba + b,
                    blocks: n,
                },
                _ => IoCommand::Compare {
                    ns,
                    slba: slba + b,
                    blocks: n,
                },
            };
            // In bounds of `usize`: the children's data lies inside the
            // buffer (each is checked by `build`); saturating otherwise, so
            // that `build` refuses it.
            let skip = (b as usize).saturating_mul(block_bytes);
            let offset = io_offset.saturating_add(skip);
            let limit = if io_limit == usize::MAX {
                usize::MAX
            } else {
                io_limit.saturating_sub(skip)
            };
            let md_skip = (b as usize).saturating_mul(md_bytes);
            Child {
                cmd,
                mem: Mem {
                    buffer: Some(len),
                    offset,
                    limit,
                    segments: None,
                },
                md: md_mem.map(|m| MdMem {
                    iova: m.iova.wrapping_add(md_skip as u64),
                    len: m.len.saturating_sub(md_skip),
                }),
                protection: io_protection.map(|p| super::Protection {
                    ref_tag: ref_tag_after(ns, p.ref_tag, b),
                    ..p
                }),
                offset,
            }
        };
        // Every child is checked before any is written.
        for i in 0..k {
            let c = child(i);
            if let Err(r) = self.build(&c.cmd, c.mem, flags, c.md, c.protection) {
                return refuse(r, io);
            }
        }
        let base = io.buffer.as_ref().map_or(0, DmaBuffer::iova);
        let parent = Parent {
            tag,
            buffer: io.buffer,
            metadata: io.metadata,
            remaining: 0,
            error: None,
            dw0: 0,
        };
        let index = match self.splits.alloc(self.max_depth, parent) {
            Ok(index) => index,
            // Cannot happen (a live split holds at least two of the
            // `max_depth` slots); refused like a full queue if it did.
            Err(p) => {
                return Err(Rejected::with_memory(
                    Reject::QueueFull,
                    p.buffer,
                    None,
                    p.metadata,
                ));
            }
        };
        let mut queued = 0u32;
        let mut failure = None;
        for i in 0..k {
            let c = child(i);
            match self.queue_child(&c, flags, base, index) {
                Ok(()) => queued += 1,
                Err(r) => {
                    failure = Some(r);
                    break;
                }
            }
        }
        let p = self.splits.parents[usize::from(index)]
            .as_mut()
            .expect("allocated above");
        p.remaining = queued;
        // The caller counts the command it queued; the other children are
        // counted as submissions with the next `ring` (`pending`).
        self.pending += queued.saturating_sub(1);
        match failure {
            None => Ok(SPLIT_KEY | Key::from(index)),
            Some(r) if queued == 0 => {
                let p = self.splits.parents[usize::from(index)]
                    .take()
                    .expect("allocated above");
                self.splits.free.push(index);
                Err(Rejected::with_memory(r, p.buffer, None, p.metadata))
            }
            Some(_) => {
                // Cannot happen (every child was checked and the slots
                // counted); if it did, the children already written are
                // commands the device may run: the split ends with them, as
                // failed, and the pair takes no more commands (as
                // `write_sqe_and_announce` does).
                p.error = Some(IoError::ControllerFailed);
                self.set_failed();
                Ok(SPLIT_KEY | Key::from(index))
            }
        }
    }

    /// Queues child `c` of split `index`: tracker, data pointer, SQE.
    fn queue_child(
        &mut self,
        c: &Child<'_>,
        flags: super::IoFlags,
        base: u64,
        index: u16,
    ) -> Result<(), Reject> {
        let (q, data) = self.build(&c.cmd, c.mem, flags, c.md, c.protection)?;
        let super::submit::Data::Buffer(bytes) = data else {
            return Err(Reject::NotDescribable);
        };
        let Some((cid, t)) = self.trackers.alloc_mut() else {
            return Err(Reject::QueueFull);
        };
        t.tag = u64::from(index);
        t.child = true;
        // The reap takes the cold path (`extras`) for a child.
        t.extras = true;
        t.stamp = 0;
        t.aborted = false;
        let slot = cid.slot;
        self.cq_space_for_submit();
        let iova = base.wrapping_add(c.offset as u64);
        let end = (iova as usize & (PAGE - 1)) + bytes;
        let (prp1, prp2, sgl) = if iova & 3 == 0 && end <= self.inline_prp_end {
            let prp2 = if end > PAGE {
                (iova & !(PAGE as u64 - 1)) + PAGE as u64
            } else {
                0
            };
            (iova, prp2, false)
        } else {
            match self.place_contiguous(iova, bytes, slot) {
                Ok(d) => d,
                Err(r) => return Err(self.unqueue(slot, r).reason),
            }
        };
        let Some(pos) = self.sq_ring.push() else {
            return Err(self.unqueue(slot, Reject::QueueFull).reason);
        };
        let psdt = u64::from(sgl) * u64::from(upnvme_queues::sgl::PSDT_SGL_MPTR_ADDRESS);
        let q = [
            q[0] | u64::from(cid.value) << 16 | psdt,
            q[1],
            q[2],
            prp1,
            prp2,
            q[5],
            q[6],
            q[7],
        ];
        self.write_sqe_and_announce(pos, &q, slot)
            .map(|_| ())
            .map_err(|r| r.reason)
    }

    /// Counts the end of a child of split `index` with `result`; when it was
    /// the last, the split's completion (the caller's tag, buffer and
    /// metadata buffer; the first child error, else success).
    #[cold]
    #[inline(never)]
    pub(super) fn end_child(
        &mut self,
        index: u64,
        result: Result<u32, IoError>,
    ) -> Option<(Key, Completion)> {
        let i = usize::try_from(index).ok()?;
        let p = self.splits.parents.get_mut(i)?.as_mut()?;
        match result {
            Ok(dw0) => p.dw0 = dw0,
            Err(e) => {
                if p.error.is_none() {
                    p.error = Some(e);
                }
            }
        }
        p.remaining = p.remaining.saturating_sub(1);
        if p.remaining > 0 {
            return None;
        }
        let p = self.splits.parents[i].take()?;
        self.splits.free.push(i as u16);
        Some((
            SPLIT_KEY | i as Key,
            Completion {
                tag: p.tag,
                result: match p.error {
                    Some(e) => Err(e),
                    None => Ok(p.dw0),
                },
                buffer: p.buffer,
                segments: None,
                metadata: p.metadata,
            },
        ))
    }

    /// Whether the command with `key` has not been handed out yet (its CID
    /// slot in flight, or its split waiting for a child).
    pub(super) fn key_in_flight(&self, key: Key) -> bool {
        if key & SPLIT_KEY != 0 {
            self.splits.is_live((key & !SPLIT_KEY) as u16)
        } else {
            self.trackers.is_in_flight(key as u16)
        }
    }
}
