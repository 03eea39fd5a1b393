//! Submission: checks, the SQE written straight into its slot, the data
//! pointer (PRP1/PRP2 from a branch for one or two pages; a PRP List or an
//! SGL in the slot's preallocated pages for more, for vectors and for what
//! PRPs cannot describe), the SQ tail doorbell, then the bookkeeping.
//!
//! Why the SQ is never found full: a command occupies an SQ slot from the
//! moment it is written until the controller fetches it, and a completion
//! can only be posted for a fetched command, whose SQHD is then past it. So
//! the slots between the host's view of the SQ head (the SQHD of the newest
//! completion) and the tail hold commands that are not yet reaped, at most
//! `max_depth <= entries - 1` of them (the tracker free stack refuses more):
//! the slot at the tail is always free. `SqRing::push` still checks, as a
//! belt against a device whose SQHD lags its completions.

use upnvme_dma::DmaBuffer;
use upnvme_queues::pi::Pif;
use upnvme_queues::prp::{build_contiguous, build_list};
use upnvme_queues::sgl::{self, PSDT_SGL_MPTR_ADDRESS};
use upnvme_queues::sqe::{io_qwords, opcode::nvm};
use upnvme_queues::{DsmRange, Sqe};

use super::command::{CopyRange, DsmAttributes, IoFlags, Protection};
use super::iodata::{IoData, IoVec};
use super::split::{Key, may_split};
use super::{IoCommand, IoQueuePair, PAGE, SglMode};
use crate::device::Device;
use crate::error::{NvmLimit, RangeCommand, Reject, Rejected};
use crate::namespace::Namespace;

/// Most ranges a Dataset Management command carries (NR is 8 bits, 0-based).
pub(super) const MAX_DSM_RANGES: usize = 256;
/// Most source ranges the driver sends in one Copy with entries of
/// `entry` bytes: as many as fill the one 4 KiB page PRP1 points at, 128
/// Format 0h or 102 Format 1h entries (the spec allows 256; the
/// namespace's MSRC may allow fewer: [`copy_limits`]).
const fn max_copy_ranges(entry: usize) -> usize {
    PAGE / entry
}

/// The Copy Descriptor Format (CDW12 bits 11:8) a Copy to `ns` uses and
/// the size of one of its source range entries: Format 0h (32 bytes) on a
/// format with the 16-bit guard protection information format (ELBAF.PIF
/// 00b), Format 1h (40 bytes) on one with a 32- or 64-bit guard, as the
/// NVM Command Set requires (the controller fails the other pairing with
/// Invalid Format).
fn copy_format(ns: &Namespace) -> (u32, usize) {
    match ns.metadata_layout_always().pif {
        Pif::Guard16 => (0, CopyRange::SIZE),
        Pif::Guard32 | Pif::Guard64 => (1, CopyRange::SIZE_FORMAT_1),
    }
}

/// Identify Controller ONCS bits (Optional NVM Command Support).
const ONCS_COMPARE: u16 = 1 << 0;
const ONCS_WRITE_UNCORRECTABLE: u16 = 1 << 1;
const ONCS_DSM: u16 = 1 << 2;
pub(super) const ONCS_WRITE_ZEROES: u16 = 1 << 3;
pub(super) const ONCS_VERIFY: u16 = 1 << 7;
const ONCS_COPY: u16 = 1 << 8;

/// Refuses flags on a command whose CDW12 has no FUA/LR bits.
#[inline(always)]
pub(super) fn no_flags(flags: IoFlags) -> Result<(), Reject> {
    if flags != IoFlags::NONE {
        return Err(Reject::FlagsNotApplicable);
    }
    Ok(())
}

/// What the data pointer of a command describes.
pub(super) enum Data {
    None,
    /// `bytes` of the command's buffer, from the slice's offset.
    Buffer(usize),
    /// The first `bytes` of the command's vector.
    Vector(usize),
    /// The Dataset Management range list.
    Ranges,
    /// The Copy source range list.
    CopyRanges,
}

/// A command's data pointer: DPTR's two qwords and whether it is an SGL
/// (CDW0.PSDT).
type Dptr = (u64, u64, bool);

#[inline(always)]
pub(super) fn check_range(ns: &Namespace, slba: u64, blocks: u32) -> Result<(), Reject> {
    if blocks.wrapping_sub(1) >= 0x1_0000 {
        return Err(Reject::BlockCount { blocks });
    }
    match slba.checked_add(blocks as u64) {
        Some(end) if end <= ns.lba_count() => Ok(()),
        _ => Err(Reject::LbaRange),
    }
}

/// Why a namespace handle is refused: another controller's, or retired by
/// Format NVM.
#[cold]
#[inline(never)]
fn namespace_refused(ns: &Namespace, instance: u64) -> Reject {
    if ns.controller() != instance {
        Reject::ForeignNamespace
    } else {
        Reject::StaleNamespace { nsid: ns.id() }
    }
}

/// The memory a command's data pointer may describe (from [`IoData`]);
/// passed by value, so the hot path keeps it in registers.
#[derive(Clone, Copy)]
pub(super) struct Mem<'a> {
    /// The length of the command's buffer, if it has one.
    pub(super) buffer: Option<usize>,
    /// Where the data starts in `buffer`.
    pub(super) offset: usize,
    /// Bytes of `buffer` from `offset` the data may use (`usize::MAX`: to
    /// the end).
    pub(super) limit: usize,
    pub(super) segments: Option<&'a IoVec>,
}

/// The separate metadata buffer of a command: where it is and how long.
#[derive(Clone, Copy)]
pub(super) struct MdMem {
    pub(super) iova: u64,
    pub(super) len: usize,
}

/// A Read, Write or Compare as the SQE carries it.
#[derive(Clone, Copy)]
pub(super) struct Rw {
    pub(super) op: u8,
    pub(super) slba: u64,
    pub(super) blocks: u32,
    pub(super) flags: IoFlags,
}

impl<D: Device> IoQueuePair<D> {
    /// Submits one command and rings the doorbell. `buffer` is required for
    /// Read, Write and Compare (at least `blocks × LBA size` bytes) and ignored
    /// (handed back with the completion) otherwise. The completion carries
    /// `tag` and the buffer.
    ///
    /// A refused command (full queue, bad arguments, unusable controller) is
    /// returned at once with its buffer ([`Rejected`]); nothing reached the
    /// device. May be called from inside the callback of
    /// [`IoQueuePair::process_completions`].
    #[inline(always)]
    pub fn submit(
        &mut self,
        cmd: IoCommand<'_>,
        buffer: Option<DmaBuffer>,
        tag: u64,
    ) -> Result<(), Rejected> {
        self.submit_io(cmd, IoData::from(buffer), tag)
    }

    /// [`IoQueuePair::submit`] with the command's memory described by
    /// [`IoData`]: a whole buffer, a slice of one ([`IoData::slice`]) or a
    /// vector of segments ([`IoData::vectored`]). Everything passed comes
    /// back with the completion (or the refusal).
    #[inline(always)]
    pub fn submit_io(&mut self, cmd: IoCommand<'_>, io: IoData, tag: u64) -> Result<(), Rejected> {
        // `queue_sqe`, its two paths taken apart: the plain path's outcome
        // stays in registers.
        match self.plain(&cmd, &io) {
            Some(p) => {
                self.queue_plain(p, io, tag)?;
            }
            None => {
                self.queue_sqe_general(cmd, io, tag)?;
            }
        }
        // The doorbell first (nothing to do if `queue_sqe` announced it
        // through the shadow doorbell), then the bookkeeping. Checked once
        // more: never a doorbell for queues a reset (from another thread)
        // deleted since `queue_sqe` looked; the command then ends with the
        // reset, once.
        if self.current() {
            self.ring_sq_now();
        } else {
            self.pending += 1;
            self.ring_refused();
            return Ok(());
        }
        self.stats.submissions += 1;
        if self.reap_on_submit {
            self.park_posted();
        }
        Ok(())
    }

    /// Reads `blocks` logical blocks at `slba` of `ns` into `buffer`
    /// (`submit` of [`IoCommand::Read`]).
    #[inline(always)]
    pub fn read(
        &mut self,
        ns: &Namespace,
        slba: u64,
        blocks: u32,
        buffer: DmaBuffer,
        tag: u64,
    ) -> Result<(), Rejected> {
        self.submit(IoCommand::Read { ns, slba, blocks }, Some(buffer), tag)
    }

    /// Writes `blocks` logical blocks at `slba` of `ns` from `buffer`
    /// (`submit` of [`IoCommand::Write`]).
    #[inline(always)]
    pub fn write(
        &mut self,
        ns: &Namespace,
        slba: u64,
        blocks: u32,
        buffer: DmaBuffer,
        tag: u64,
    ) -> Result<(), Rejected> {
        self.submit(IoCommand::Write { ns, slba, blocks }, Some(buffer), tag)
    }

    /// Writes one command into the SQ for a batch: several `queue` calls
    /// followed by one [`IoQueuePair::ring`]. Per batch
    /// ([`crate::SqAnnounce::Batch`], and the default up to 64 commands in
    /// flight) nothing is announced until `ring`
    /// writes the SQ tail once for the whole batch (with shadow doorbells:
    /// one shadow tail update, over MMIO too when the EventIdx asks). With
    /// [`crate::SqAnnounce::EachCommand`] (or [`crate::SqAnnounce::WhenDeep`]
    /// with that many commands in flight) and the EventIdx in use, `queue`
    /// announces the command at once through the shadow doorbell (an MMIO
    /// write only when the controller's EventIdx asks for one), so the device
    /// may start, or even finish, before `ring`; `ring` then only does the
    /// bookkeeping. `process_completions` and the blocking helpers ring
    /// pending commands first.
    #[inline]
    pub fn queue(
        &mut self,
        cmd: IoCommand<'_>,
        buffer: Option<DmaBuffer>,
        tag: u64,
    ) -> Result<(), Rejected> {
        self.queue_io(cmd, IoData::from(buffer), tag)
    }

    /// [`IoQueuePair::queue`] with the memory described by [`IoData`].
    #[inline]
    pub fn queue_io(&mut self, cmd: IoCommand<'_>, io: IoData, tag: u64) -> Result<(), Rejected> {
        self.queue_sqe(cmd, io, tag)?;
        self.pending += 1;
        Ok(())
    }

    /// Announces every queued command not yet announced with one SQ tail
    /// doorbell write (nothing is left when `queue` announced each command,
    /// see [`IoQueuePair::queue`]), then (with `reap_on_submit`) reaps what
    /// is ready.
    #[inline]
    pub fn ring(&mut self) {
        if !self.current() {
            self.ring_refused();
            return;
        }
        self.ring_sq_now();
        // Bookkeeping after the doorbell.
        self.stats.submissions += u64::from(std::mem::take(&mut self.pending));
        if self.reap_on_submit {
            self.park_posted();
        }
    }

    /// Writes the SQ tail doorbell (shadow + EventIdx, or MMIO) for
    /// everything queued.
    #[inline(always)]
    pub(super) fn ring_sq_now(&mut self) {
        let Some(tail) = self.sq_ring.commit() else {
            return;
        };
        let shadow = self.ctrl.shadow().map(|s| (&s.doorbells, &s.event_idx));
        self.doorbells
            .ring_sq(self.ctrl.dev(), shadow, tail, &mut self.stats);
    }

    /// `reap_on_submit`: reaps what is ready right after the doorbell, for
    /// the next `process_completions` to deliver. Also the timeout scan's
    /// first step (recovery.rs): what is posted is not overdue.
    #[inline(never)]
    pub(super) fn park_posted(&mut self) {
        let mut n = 0;
        while let Ok(Some(sc)) = self.reap_one() {
            self.ready.push_back(sc);
            n += 1;
        }
        if n > 0 && self.cq_head_due_after_reap() {
            self.commit_cq_head();
        }
    }

    /// Checks the command, takes a CID, fills the tracker, writes the SQE
    /// and (announcing at once) the shadow doorbell. Returns the slot.
    ///
    /// A command with a metadata buffer or protection fields takes an
    /// out-of-line copy of the same code; everything else is compiled
    /// without them, so the hot path keeps no register or branch for them.
    #[inline(always)]
    pub(super) fn queue_sqe(
        &mut self,
        cmd: IoCommand<'_>,
        io: IoData,
        tag: u64,
    ) -> Result<Key, Rejected> {
        if let Some(p) = self.plain(&cmd, &io) {
            return self.queue_plain(p, io, tag).map(Key::from);
        }
        self.queue_sqe_general(cmd, io, tag)
    }

    /// Whether every buffer of a command lives in this controller's IOMMU
    /// mapping ([`DmaBuffer::domain`]): a buffer of another controller has
    /// an IOVA that means something else here (another buffer, this pair's
    /// rings) or nothing.
    #[inline(always)]
    fn maps(&self, buffer: Option<&DmaBuffer>, v: Option<&IoVec>, md: Option<&DmaBuffer>) -> bool {
        let ours = |b: &DmaBuffer| b.domain() == self.domain;
        buffer.is_none_or(ours)
            && md.is_none_or(ours)
            && v.is_none_or(|v| v.segments().iter().all(|s| ours(s.buffer())))
    }

    /// Everything the plain path (plain.rs) does not take: other commands,
    /// vectors, metadata and protection, and every refusal.
    #[inline(never)]
    fn queue_sqe_general(
        &mut self,
        cmd: IoCommand<'_>,
        io: IoData,
        tag: u64,
    ) -> Result<Key, Rejected> {
        if io.metadata.is_some() || io.protection.is_some() {
            return self.queue_sqe_md(cmd, io, tag);
        }
        self.queue_sqe_with::<false>(cmd, io, tag)
    }

    /// [`IoQueuePair::queue_sqe`] for commands with metadata or protection.
    #[cold]
    #[inline(never)]
    fn queue_sqe_md(&mut self, cmd: IoCommand<'_>, io: IoData, tag: u64) -> Result<Key, Rejected> {
        self.queue_sqe_with::<true>(cmd, io, tag)
    }

    /// The body of [`IoQueuePair::queue_sqe`]; with `MD` false the caller
    /// guarantees `io` has neither a metadata buffer nor protection fields.
    #[inline(always)]
    fn queue_sqe_with<const MD: bool>(
        &mut self,
        cmd: IoCommand<'_>,
        io: IoData,
        tag: u64,
    ) -> Result<Key, Rejected> {
        let IoData {
            buffer,
            offset,
            limit,
            segments,
            flags,
            metadata,
            protection,
        } = io;
        let (metadata, protection) = if MD {
            (metadata, protection)
        } else {
            (None, None)
        };
        if !self.current()
            && let Err(reason) = self.resync_for_submit()
        {
            return Err(Rejected::with_memory(reason, buffer, segments, metadata));
        }
        if !self.maps(buffer.as_ref(), segments.as_ref(), metadata.as_ref()) {
            return Err(Rejected::with_memory(
                Reject::ForeignBuffer,
                buffer,
                segments,
                metadata,
            ));
        }
        let mem = Mem {
            buffer: buffer.as_ref().map(DmaBuffer::len),
            offset,
            limit,
            segments: segments.as_ref(),
        };
        let md = metadata.as_ref().map(|m| MdMem {
            iova: m.iova(),
            len: m.len(),
        });
        let (q, data) = match self.build(&cmd, mem, flags, md, protection) {
            Ok(x) => x,
            Err(reason) => {
                let io = IoData {
                    buffer,
                    offset,
                    limit,
                    segments,
                    flags,
                    metadata,
                    protection,
                };
                // Too large for one command: as several (split.rs).
                if may_split(reason, &cmd, &io) {
                    return self.queue_split(cmd, io, tag, reason);
                }
                return Err(Rejected::with_memory(
                    reason,
                    io.buffer,
                    io.segments,
                    io.metadata,
                ));
            }
        };
        // Completions parked in `ready` count against the depth too, so that
        // queue never grows beyond its preallocated capacity.
        if !self.ready.is_empty()
            && self.trackers.in_flight() + self.ready.len() as u32 >= self.max_depth
        {
            return Err(Rejected::with_memory(
                self.full_refusal(&data, segments.as_ref(), 0),
                buffer,
                segments,
                metadata,
            ));
        }
        // The data pointer of one or two memory pages needs no slot: PRP1 is
        // the buffer, PRP2 0 or the second page's address (NVMe 2.0 §4.3.1).
        // For a command that moves data, [iova, iova + bytes) lies inside
        // the buffer's IOVA range (its slice was checked). A command that
        // moves none (Flush, Write Zeroes, ...) may carry a buffer whose
        // slice nobody checked: its sum is unused, so it wraps rather than
        // overflows. Anything else goes to the slot's list page below.
        let iova = buffer
            .as_ref()
            .map_or(0, |b| b.iova())
            .wrapping_add(offset as u64);
        let (mut prp1, mut prp2, mut placed) = (0u64, 0u64, true);
        match data {
            Data::Buffer(bytes) => match self.inline_prp(iova, bytes) {
                Some(d) => (prp1, prp2) = d,
                None => placed = false,
            },
            Data::Vector(_) | Data::Ranges | Data::CopyRanges => placed = false,
            Data::None => {}
        }
        // The tracker before the SQE and the doorbell (see the module docs).
        let Some((cid, t)) = self.trackers.alloc_mut() else {
            let reason = self.full_refusal(&data, segments.as_ref(), 0);
            return Err(Rejected::with_memory(reason, buffer, segments, metadata));
        };
        t.tag = tag;
        t.buffer = buffer;
        t.extras = segments.is_some() || metadata.is_some();
        if segments.is_some() {
            t.segments = segments;
        }
        if metadata.is_some() {
            t.metadata = metadata;
        }
        t.stamp = 0;
        t.aborted = false;
        // Where `push` below puts the SQE (see `queue_plain`).
        t.sq_pos = self.sq_ring.tail();
        let slot = cid.slot;
        // CQ space for this command before anything announces it.
        self.cq_space_for_submit();
        let mut sgl = false;
        if !placed {
            match self.place_slow(&cmd, &data, iova, slot) {
                Ok((d0, d1, s)) => (prp1, prp2, sgl) = (d0, d1, s),
                Err(reason) => return Err(self.unqueue(slot, reason)),
            }
        }
        let pos = match self.sq_ring.push() {
            Some(pos) => pos,
            None => self.sq_full(slot)?,
        };
        let psdt = u64::from(sgl) * u64::from(PSDT_SGL_MPTR_ADDRESS);
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
        self.write_sqe_and_announce(pos, &q, slot).map(Key::from)
    }

    /// Stores the SQE of the command in `slot` into SQ slot `pos` and, with
    /// `SqAnnounce::EachCommand` (or `WhenDeep` at its depth), announces it.
    /// Returns the slot.
    #[inline(always)]
    pub(super) fn write_sqe_and_announce(
        &mut self,
        pos: u16,
        q: &[u64; 8],
        slot: u16,
    ) -> Result<u16, Rejected> {
        if !self.sq.write_sqe(u32::from(pos), q) {
            // Cannot happen (pos < entries); if it did, the slot would hold
            // garbage and must never be announced: fail the pair (no doorbell
            // is ever written for it again) and hand the command back — the
            // device never saw it, so its CID is free and its buffer the
            // caller's.
            self.set_failed();
            return Err(self.unqueue(slot, Reject::Unusable));
        }
        // As in `submit`: no doorbell for queues a reset deleted meanwhile.
        if self.trackers.free_slots() < self.announce_free_below && self.current() {
            self.ring_sq_now();
        }
        Ok(slot)
    }

    /// Why a command that finds the pair full is refused: `QueueFull`
    /// (retry after a reap), unless no free slot would help — a vector that
    /// PRPs cannot describe where no SGL may carry it (the controller has
    /// none, or [`SglMode::Never`]) is `NotDescribable` whether a slot is
    /// free or not, and retrying it on `QueueFull` would only earn that
    /// refusal later. (Whether an SGL could carry a vector is known only
    /// once its list is built in a slot: with SGLs usable, `QueueFull`.)
    /// `offset`: where the command's data starts in the vector (a split's
    /// child, split.rs; 0 otherwise).
    #[cold]
    #[inline(never)]
    pub(super) fn full_refusal(
        &self,
        data: &Data,
        segments: Option<&IoVec>,
        offset: usize,
    ) -> Reject {
        if let (Data::Vector(bytes), Some(v)) = (data, segments) {
            let sgl_usable = self.sgl_mode != SglMode::Never && self.sgl.supported();
            let count = v.pieces_at(offset, *bytes).count();
            let prp_ok = self.sgl_mode != SglMode::Always
                && prp_describable(v.pieces_at(offset, *bytes), count);
            if !sgl_usable && !prp_ok {
                return Reject::NotDescribable;
            }
        }
        Reject::QueueFull
    }

    /// Takes back a command that was given a CID but not written to the SQ.
    #[cold]
    #[inline(never)]
    pub(super) fn unqueue(&mut self, slot: u16, reason: Reject) -> Rejected {
        let (buffer, segments, metadata) = match self.trackers.get_mut(slot) {
            Some(t) => t.take_memory(),
            None => (None, None, None),
        };
        let _ = self.trackers.cancel(slot);
        Rejected::with_memory(reason, buffer, segments, metadata)
    }

    /// The data pointer that needs the slot's list page: a PRP List, an SGL,
    /// or the Dataset Management ranges.
    #[inline(never)]
    fn place_slow(
        &mut self,
        cmd: &IoCommand<'_>,
        data: &Data,
        iova: u64,
        slot: u16,
    ) -> Result<Dptr, Reject> {
        match (data, cmd) {
            (Data::Buffer(bytes), _) => self.place_contiguous(iova, *bytes, slot),
            (Data::Vector(bytes), _) => {
                // The vector is in the slot's tracker already: borrowed out
                // for the walk, put back whatever the outcome.
                let Some(v) = self.trackers.get_mut(slot).and_then(|t| t.segments.take()) else {
                    return Err(Reject::NoBuffer);
                };
                let r = self.place_vector(&v, 0, *bytes, slot);
                if let Some(t) = self.trackers.get_mut(slot) {
                    t.segments = Some(v);
                }
                r
            }
            (Data::Ranges, IoCommand::Deallocate { ranges, .. })
            | (Data::Ranges, IoCommand::DatasetManagement { ranges, .. }) => {
                self.place_ranges(ranges, slot).map(|prp1| (prp1, 0, false))
            }
            (Data::CopyRanges, IoCommand::Copy { ns, ranges, .. }) => self
                .place_copy_list(ns, ranges.len(), |i| ranges[i].to_le_bytes_format_1(), slot)
                .map(|prp1| (prp1, 0, false)),
            (Data::CopyRanges, IoCommand::CrossNamespaceCopy { ns, sources, .. }) => self
                .place_copy_list(
                    ns,
                    sources.len(),
                    |i| sources[i].to_le_bytes_format_3(),
                    slot,
                )
                .map(|prp1| (prp1, 0, false)),
            _ => Ok((0, 0, false)),
        }
    }

    /// PRP1 and PRP2 for a contiguous transfer of one or two memory pages
    /// that needs no list (NVMe 2.0 §4.3.1 "Physical Region Page Entry and
    /// List": PRP1 dword aligned, PRP2 0 or the second page's base), or
    /// `None` when it must go to [`Self::place_contiguous`] (more pages, an
    /// unaligned start, or [`SglMode::Always`], which sets `inline_prp_end`
    /// to 0). The caller guarantees `[iova, iova + bytes)` lies inside one
    /// buffer's IOVA range, so nothing overflows.
    #[inline(always)]
    pub(super) fn inline_prp(&self, iova: u64, bytes: usize) -> Option<(u64, u64)> {
        let end = (iova as usize & (PAGE - 1)) + bytes;
        if iova & 3 == 0 && end <= self.inline_prp_end {
            let prp2 = if end > PAGE {
                (iova & !(PAGE as u64 - 1)) + PAGE as u64
            } else {
                0
            };
            Some((iova, prp2))
        } else {
            None
        }
    }

    /// A contiguous transfer that PRP1/PRP2 alone cannot carry (more than
    /// two memory pages, or a start PRP1 cannot take), or that
    /// [`SglMode::Always`] sends here: one SGL Data Block in DPTR wherever
    /// the controller supports SGLs and the mode allows — under QEMU that
    /// beats a PRP List for 64–128 KiB transfers by 5–39 % (docs/benchmarks.md,
    /// "PRP or SGL") — else a PRP List.
    #[inline(always)]
    pub(super) fn place_contiguous(
        &mut self,
        iova: u64,
        bytes: usize,
        slot: u16,
    ) -> Result<Dptr, Reject> {
        if self.sgl_mode != SglMode::Never && self.sgl.supported() {
            match sgl::build([(iova, bytes)], 1, self.sgl, &mut [], PAGE, |_| 0) {
                Ok((d, _)) => {
                    let q = d.to_qwords();
                    return Ok((q[0], q[1], true));
                }
                Err(_) if self.sgl_mode == SglMode::Auto => {}
                Err(_) => return Err(Reject::NotDescribable),
            }
        }
        let (prp1, prp2) = self.place_prp_list(iova, bytes, slot)?;
        Ok((prp1, prp2, false))
    }

    /// A vector: an SGL where the controller supports SGLs and the mode
    /// allows; PRPs when every inner boundary is page aligned and the mode
    /// allows (also when an SGL was not possible, with [`SglMode::Auto`]);
    /// a refusal otherwise. With [`SglMode::Auto`], a vector of more
    /// pieces (Data Block descriptors) than the controller's SGL Descriptor
    /// Threshold (Identify Controller SGLS SDT: beyond it "the performance
    /// of the controller may be reduced") goes as PRPs where they can
    /// describe it, and as an SGL only where they cannot.
    ///
    /// `offset` skips that many bytes of the vector first (a split's child,
    /// split.rs; 0 otherwise).
    pub(super) fn place_vector(
        &mut self,
        v: &IoVec,
        offset: usize,
        bytes: usize,
        slot: u16,
    ) -> Result<Dptr, Reject> {
        let count = v.pieces_at(offset, bytes).count();
        let prp_ok =
            self.sgl_mode != SglMode::Always && prp_describable(v.pieces_at(offset, bytes), count);
        let above_threshold = self.sgl_mode == SglMode::Auto && count > self.sgl_threshold;
        if self.sgl_mode != SglMode::Never && self.sgl.supported() && !(above_threshold && prp_ok) {
            match self.place_vector_sgl(v, offset, bytes, count, slot) {
                Ok(d) => return Ok(d),
                Err(_) if prp_ok => {}
                Err(e) => return Err(e),
            }
        }
        if prp_ok {
            return self.place_vector_prp(v, offset, bytes, count, slot);
        }
        Err(Reject::NotDescribable)
    }

    /// A vector's PRP1 and PRP List (the caller checked `prp_describable`).
    fn place_vector_prp(
        &mut self,
        v: &IoVec,
        offset: usize,
        bytes: usize,
        count: usize,
        slot: u16,
    ) -> Result<Dptr, Reject> {
        let list_iova = self.list_iova(slot);
        let mut pieces = v.pieces_at(offset, bytes);
        let Some((first, first_len)) = pieces.next() else {
            return Err(Reject::NoBuffer);
        };
        // PRP1 is the first byte; every further page of the first piece and
        // every page of the others is an entry (NVMe 2.0 §4.3.1).
        let first_pages = upnvme_queues::prp::data_pages(first, first_len, PAGE);
        let rest = pieces
            .flat_map(|(iova, len)| (0..len.div_ceil(PAGE)).map(move |i| iova + (i * PAGE) as u64));
        let mut entries = first_pages.chain(rest);
        let e0 = entries.next();
        let e1 = entries.next();
        match (e0, e1) {
            (None, _) => Ok((first, 0, false)),
            (Some(p), None) => Ok((first, p, false)),
            (Some(p), Some(q)) => {
                let all = [p, q].into_iter().chain(entries);
                let n = build_list(all, &mut self.prp_scratch, PAGE, |i| {
                    list_iova + (i * PAGE) as u64
                })
                .map_err(|_| Reject::TooManySegments {
                    segments: count as u32,
                })?;
                let scratch = &self.prp_scratch[..n];
                self.lists
                    .write_u64_run(slot, n, |i| scratch[i])
                    .map_err(|_| Reject::TooManySegments {
                        segments: count as u32,
                    })?;
                Ok((first, list_iova, false))
            }
        }
    }

    /// A vector's SGL in the slot's list pages.
    fn place_vector_sgl(
        &mut self,
        v: &IoVec,
        offset: usize,
        bytes: usize,
        count: usize,
        slot: u16,
    ) -> Result<Dptr, Reject> {
        let list_iova = self.list_iova(slot);
        let (sgl1, slots) = sgl::build(
            v.pieces_at(offset, bytes),
            count,
            self.sgl,
            &mut self.prp_scratch,
            PAGE,
            |i| list_iova + (i * PAGE) as u64,
        )
        .map_err(|e| match e {
            sgl::SglError::ListTooSmall { .. } => Reject::TooManySegments {
                segments: count as u32,
            },
            _ => Reject::NotDescribable,
        })?;
        let scratch = &self.prp_scratch[..2 * slots];
        self.lists
            .write_u64_run(slot, 2 * slots, |i| scratch[i])
            .map_err(|_| Reject::TooManySegments {
                segments: count as u32,
            })?;
        let q = sgl1.to_qwords();
        Ok((q[0], q[1], true))
    }

    /// The SQE of `cmd` as qwords (CID and data pointer still to fill) and
    /// what its data pointer describes, or why the command is refused.
    #[inline(always)]
    pub(super) fn build(
        &self,
        cmd: &IoCommand<'_>,
        mem: Mem<'_>,
        flags: IoFlags,
        metadata: Option<MdMem>,
        protection: Option<Protection>,
    ) -> Result<([u64; 8], Data), Reject> {
        let ns = cmd.namespace();
        if ns.controller() != self.instance || ns.is_stale() {
            return Err(namespace_refused(ns, self.instance));
        }
        let extras = metadata.is_some() | protection.is_some();
        match *cmd {
            IoCommand::Read { slba, blocks, .. }
            | IoCommand::Write { slba, blocks, .. }
            | IoCommand::Compare { slba, blocks, .. } => {
                check_range(ns, slba, blocks)?;
                let op = match cmd {
                    IoCommand::Read { .. } => nvm::READ,
                    IoCommand::Write { .. } => nvm::WRITE,
                    _ => {
                        self.oncs_check(ONCS_COMPARE, "Compare")?;
                        nvm::COMPARE
                    }
                };
                if ns.has_metadata() | extras {
                    let rw = Rw {
                        op,
                        slba,
                        blocks,
                        flags,
                    };
                    return self.build_rw_md(ns, rw, mem, metadata, protection);
                }
                let bytes = (blocks as usize) << ns.lba_shift();
                let data = self.data_for(bytes, mem)?;
                // CDW12.NLB is 0-based.
                let q = io_qwords(op, 0, ns.id(), 0, 0, slba, (blocks - 1) | flags.cdw12());
                Ok((q, data))
            }
            _ if extras => self.build_other_md(cmd, mem, flags, metadata, protection),
            IoCommand::Flush { .. } => {
                no_flags(flags)?;
                Ok((Sqe::flush(ns.id()).to_qwords(), Data::None))
            }
            IoCommand::WriteZeroes {
                slba,
                blocks,
                deallocate,
                ..
            } => {
                self.oncs_check(ONCS_WRITE_ZEROES, "Write Zeroes")?;
                check_range(ns, slba, blocks)?;
                self.limits.blocks(NvmLimit::WriteZeroes, ns, blocks)?;
                let mut sqe = Sqe::write_zeroes(ns.id(), slba, blocks, deallocate);
                sqe.dw[12] |= flags.cdw12();
                Ok((sqe.to_qwords(), Data::None))
            }
            IoCommand::Deallocate { ranges, .. } => {
                let attributes = DsmAttributes {
                    deallocate: true,
                    ..DsmAttributes::default()
                };
                self.build_dsm(ns, ranges, attributes, flags)
            }
            IoCommand::DatasetManagement {
                ranges, attributes, ..
            } => self.build_dsm(ns, ranges, attributes, flags),
            IoCommand::Verify { slba, blocks, .. } => {
                self.oncs_check(ONCS_VERIFY, "Verify")?;
                check_range(ns, slba, blocks)?;
                self.limits.blocks(NvmLimit::Verify, ns, blocks)?;
                let q = io_qwords(
                    nvm::VERIFY,
                    0,
                    ns.id(),
                    0,
                    0,
                    slba,
                    (blocks - 1) | flags.cdw12(),
                );
                Ok((q, Data::None))
            }
            IoCommand::WriteUncorrectable { slba, blocks, .. } => {
                self.oncs_check(ONCS_WRITE_UNCORRECTABLE, "Write Uncorrectable")?;
                no_flags(flags)?;
                check_range(ns, slba, blocks)?;
                self.limits
                    .blocks(NvmLimit::WriteUncorrectable, ns, blocks)?;
                let q = io_qwords(nvm::WRITE_UNCORRECTABLE, 0, ns.id(), 0, 0, slba, blocks - 1);
                Ok((q, Data::None))
            }
            IoCommand::Copy { sdlba, ranges, .. } => {
                self.oncs_check(ONCS_COPY, "Copy")?;
                let own = copy_limits(ns);
                let total = self.check_copy_ranges(
                    ns,
                    ranges.len(),
                    ranges.iter().map(|r| Ok((r.slba, r.blocks, own))),
                )?;
                match sdlba.checked_add(total) {
                    Some(end) if end <= ns.lba_count() => {}
                    _ => return Err(Reject::LbaRange),
                }
                // A controller that reports its Copy formats (OCFS) without
                // the one the namespace's guard needs would fail the command
                // with Invalid Format: refused here, nothing sent. (OCFS 0:
                // not reported, the command goes.)
                let format = copy_format(ns).0;
                let ocfs = self.ctrl.ocfs();
                if ocfs != 0 && ocfs & (1 << format) == 0 {
                    return Err(Reject::CopyFormat {
                        format: format as u8,
                    });
                }
                // CDW12: NR (bits 7:0, 0-based), Descriptor Format (bits
                // 11:8), FUA and LR.
                let cdw12 = (ranges.len() as u32 - 1) | format << 8 | flags.cdw12();
                let q = io_qwords(nvm::COPY, 0, ns.id(), 0, 0, sdlba, cdw12);
                Ok((q, Data::CopyRanges))
            }
            IoCommand::CrossNamespaceCopy { sdlba, sources, .. } => {
                self.oncs_check(ONCS_COPY, "Copy")?;
                // Every source a current handle of this controller, its
                // range inside its namespace and within that namespace's
                // MSSRL (the controller reads it from the source, as QEMU's
                // nvme_do_copy does); MSRC and MCL are the destination's.
                let instance = self.instance;
                let total = self.check_copy_ranges(
                    ns,
                    sources.len(),
                    sources.iter().map(|s| {
                        if s.ns.controller() != instance || s.ns.is_stale() {
                            return Err(namespace_refused(s.ns, instance));
                        }
                        Ok((s.slba, s.blocks, copy_limits(s.ns)))
                    }),
                )?;
                match sdlba.checked_add(total) {
                    Some(end) if end <= ns.lba_count() => {}
                    _ => return Err(Reject::LbaRange),
                }
                // Formats 2h and 3h go only where the controller reports
                // them (OCFS; unlike 0h, "not reported" is not assumed) and
                // the driver enabled them (Host Behavior Support CDFE): a
                // controller fails them with Invalid Field otherwise.
                let format = copy_format(ns).0 + 2;
                if self.ctrl.ocfs() & self.ctrl.copy_formats_enabled() & (1 << format) == 0 {
                    return Err(Reject::CopyFormat {
                        format: format as u8,
                    });
                }
                let cdw12 = (sources.len() as u32 - 1) | format << 8 | flags.cdw12();
                let q = io_qwords(nvm::COPY, 0, ns.id(), 0, 0, sdlba, cdw12);
                Ok((q, Data::CopyRanges))
            }
            IoCommand::Raw { sqe, data_len, .. } => {
                self.build_raw(ns, sqe, data_len, mem, flags, None)
            }
        }
    }

    /// What the data pointer of a `bytes`-long transfer describes, checked
    /// against the memory passed and MDTS.
    #[inline(always)]
    pub(super) fn data_for(&self, bytes: usize, mem: Mem<'_>) -> Result<Data, Reject> {
        let data = match (mem.buffer, mem.segments) {
            (Some(len), _) => {
                let room = slice_room(len, mem.offset, mem.limit)?;
                if room < bytes {
                    return Err(Reject::BufferTooSmall { need: bytes as u64 });
                }
                Data::Buffer(bytes)
            }
            (None, Some(v)) => {
                if v.total_len() < bytes {
                    return Err(Reject::BufferTooSmall { need: bytes as u64 });
                }
                Data::Vector(bytes)
            }
            (None, None) => return Err(Reject::NoBuffer),
        };
        if bytes > self.max_transfer {
            return Err(Reject::TransferTooLarge {
                bytes: bytes as u64,
            });
        }
        Ok(data)
    }

    /// Dataset Management: 1..=256 ranges inside the namespace, each of
    /// 1..=2^32 - 1 blocks (a 32-bit Length), with CDW11's attributes.
    fn build_dsm(
        &self,
        ns: &Namespace,
        ranges: &[DsmRange],
        attributes: DsmAttributes,
        flags: IoFlags,
    ) -> Result<([u64; 8], Data), Reject> {
        self.oncs_check(ONCS_DSM, "Dataset Management")?;
        no_flags(flags)?;
        if ranges.is_empty() || ranges.len() > MAX_DSM_RANGES {
            return Err(Reject::RangeCount {
                command: RangeCommand::DatasetManagement,
                ranges: ranges.len().min(u32::MAX as usize) as u32,
                max: MAX_DSM_RANGES as u32,
            });
        }
        for r in ranges {
            if r.nlb == 0 {
                return Err(Reject::BlockCount { blocks: 0 });
            }
            match r.slba.checked_add(u64::from(r.nlb)) {
                Some(end) if end <= ns.lba_count() => {}
                _ => return Err(Reject::LbaRange),
            }
        }
        self.limits.dsm(ranges)?;
        let mut sqe = Sqe::dataset_management(ns.id(), ranges.len() as u32, false);
        sqe.dw[11] = attributes.cdw11();
        Ok((sqe.to_qwords(), Data::Ranges))
    }

    /// The IOVA where slot `slot`'s list pages start (PRP Lists, SGL
    /// segments, DSM and Copy ranges); they are written through the list
    /// pages' own writers, which keep to the slot's area.
    #[inline(always)]
    fn list_iova(&self, slot: u16) -> u64 {
        self.lists.area(slot).1
    }

    /// Refuses a command the controller does not advertise in ONCS.
    #[inline(always)]
    pub(super) fn oncs_check(&self, bit: u16, command: &'static str) -> Result<(), Reject> {
        if self.oncs & bit == 0 {
            return Err(Reject::Unsupported { command });
        }
        Ok(())
    }

    /// PRP1 and a PRP List in the slot's list pages, for a transfer of more
    /// than two memory pages; returns (PRP1, PRP2).
    ///
    /// The common case inline: a dword-aligned start and a list that fits
    /// one list page, whose entries are consecutive pages — one run of
    /// stores through the list pages' accessor (bounds checked once per
    /// run). Everything else takes the general planner.
    #[inline(always)]
    fn place_prp_list(&mut self, iova: u64, bytes: usize, slot: u16) -> Result<(u64, u64), Reject> {
        let page = PAGE as u64;
        // PRP1 covers up to the end of the first memory page; the list holds
        // the start of every further page (NVMe 2.0 §4.3.1).
        let first_end = (iova & !(page - 1)) + page;
        let rest = ((iova as usize & (PAGE - 1)) + bytes).div_ceil(PAGE) - 1;
        // `rest >= 2`: with one further page PRP2 is that page, not a list
        // (callers come here only past two pages; a shorter transfer takes
        // the general planner's answer instead of a list). At most one list
        // page: a longer list chains (its last entry points to the next page).
        if iova & 3 == 0
            && (2..=PAGE / 8).contains(&rest)
            && self.lists.write_steps(slot, rest, first_end, page)
        {
            return Ok((iova, self.lists.area(slot).1));
        }
        self.place_prp_list_general(iova, bytes, slot)
    }

    /// [`IoQueuePair::place_prp_list`] for chained list pages (more than
    /// 2 MiB) or a refusal: the general planner says which.
    #[cold]
    #[inline(never)]
    fn place_prp_list_general(
        &mut self,
        iova: u64,
        bytes: usize,
        slot: u16,
    ) -> Result<(u64, u64), Reject> {
        let list_iova = self.list_iova(slot);
        let prps = build_contiguous(iova, bytes, PAGE, &mut self.prp_scratch, |i| {
            list_iova + (i * PAGE) as u64
        })
        .map_err(|_| Reject::Misaligned)?;
        let scratch = &self.prp_scratch[..prps.list_len];
        self.lists
            .write_u64_run(slot, scratch.len(), |i| scratch[i])
            .map_err(|_| Reject::TransferTooLarge {
                bytes: bytes as u64,
            })?;
        Ok((prps.prp1, prps.prp2))
    }

    /// Dataset Management ranges in the slot's list page; returns PRP1,
    /// which points there.
    #[inline(never)]
    pub(super) fn place_ranges(&mut self, ranges: &[DsmRange], slot: u16) -> Result<u64, Reject> {
        let list_iova = self.list_iova(slot);
        for (i, r) in ranges.iter().enumerate() {
            self.lists
                .write_bytes(slot, i * 16, &r.to_le_bytes())
                .map_err(|_| Reject::RangeCount {
                    command: RangeCommand::DatasetManagement,
                    ranges: ranges.len() as u32,
                    max: MAX_DSM_RANGES as u32,
                })?;
        }
        Ok(list_iova)
    }
}

/// Bytes a slice of `limit` bytes at `offset` leaves for the transfer in a
/// buffer of `len` bytes (`limit == usize::MAX`: to the end).
#[inline(always)]
pub(super) fn slice_room(len: usize, offset: usize, limit: usize) -> Result<usize, Reject> {
    if limit == usize::MAX {
        return len.checked_sub(offset).ok_or(Reject::SliceOutOfBounds {
            offset: offset as u64,
            len: 0,
            size: len as u64,
        });
    }
    match offset.checked_add(limit) {
        Some(end) if end <= len && limit > 0 => Ok(limit),
        _ => Err(Reject::SliceOutOfBounds {
            offset: offset as u64,
            len: limit as u64,
            size: len as u64,
        }),
    }
}

/// True when PRPs can describe the pieces (NVMe 2.0 §4.3.1): the first
/// starts dword aligned, every later one starts on a memory page, every
/// earlier one ends on one.
fn prp_describable(pieces: impl Iterator<Item = (u64, usize)>, count: usize) -> bool {
    let mask = PAGE as u64 - 1;
    pieces.enumerate().all(|(i, (iova, len))| {
        let start_ok = if i == 0 {
            iova & 3 == 0
        } else {
            iova & mask == 0
        };
        let end_ok = i + 1 == count || (iova + len as u64) & mask == 0;
        start_ok && end_ok
    })
}

impl<D: Device> IoQueuePair<D> {
    /// `count` Copy source range entries in the slot's list page; returns
    /// PRP1, which points there. `entry_at(i)` is entry `i`'s 40-byte image
    /// (Format 1h/3h), of which the first 32 bytes are the Format 0h/2h
    /// entry: the destination `ns`'s guard chooses how many are written.
    #[inline(never)]
    fn place_copy_list(
        &mut self,
        ns: &Namespace,
        count: usize,
        entry_at: impl Fn(usize) -> [u8; 40],
        slot: u16,
    ) -> Result<u64, Reject> {
        let list_iova = self.list_iova(slot);
        let entry = copy_format(ns).1;
        let refused = Reject::RangeCount {
            command: RangeCommand::Copy,
            ranges: count as u32,
            max: max_copy_ranges(entry) as u32,
        };
        if count * entry > PAGE {
            return Err(refused);
        }
        for i in 0..count {
            self.lists
                .write_bytes(slot, i * entry, &entry_at(i)[..entry])
                .map_err(|_| refused)?;
        }
        Ok(list_iova)
    }
}

impl<D: Device> IoQueuePair<D> {
    /// Checks a Copy's source ranges against the destination `ns`'s limits
    /// (the range count against MSRC, the blocks in all against MCL) and
    /// each range against its own namespace and MSSRL: `ranges` yields, per
    /// range, its SLBA, block count and its source namespace's limits, or
    /// why that source is refused. Returns the blocks in all.
    fn check_copy_ranges<'n>(
        &self,
        ns: &Namespace,
        count: usize,
        ranges: impl Iterator<Item = Result<(u64, u32, CopyLimits<'n>), Reject>>,
    ) -> Result<u64, Reject> {
        let limits = copy_limits(ns);
        if count == 0 || count > limits.ranges {
            return Err(Reject::RangeCount {
                command: RangeCommand::Copy,
                ranges: count.min(u32::MAX as usize) as u32,
                max: limits.ranges as u32,
            });
        }
        let mut total = 0u64;
        for r in ranges {
            let (slba, blocks, source) = r?;
            check_range(source.ns, slba, blocks)?;
            if source.range_blocks != 0 && blocks > source.range_blocks {
                return Err(Reject::SizeLimit {
                    limit: NvmLimit::CopyRangeBlocks,
                    max: u64::from(source.range_blocks),
                });
            }
            total += u64::from(blocks);
        }
        if limits.blocks != 0 && total > u64::from(limits.blocks) {
            return Err(Reject::SizeLimit {
                limit: NvmLimit::CopyBlocks,
                max: u64::from(limits.blocks),
            });
        }
        Ok(total)
    }
}

/// A namespace's Copy limits (Identify Namespace): what the pair checks
/// before it sends a Copy.
#[derive(Clone, Copy)]
struct CopyLimits<'n> {
    /// The namespace.
    ns: &'n Namespace,
    /// Source ranges per command: MSRC + 1, at most [`max_copy_ranges`].
    ranges: usize,
    /// MSSRL: logical blocks per source range (0: not reported).
    range_blocks: u32,
    /// MCL: logical blocks in all source ranges (0: not reported).
    blocks: u32,
}

/// The Copy limits of `ns`. A controller that supports Copy reports MSSRL
/// and MCL non-zero (NVM Command Set Specification, Identify Namespace); one
/// that reports MSSRL, MCL and MSRC all zero has not filled them in, and
/// only the command's own format limits apply (its status says the rest).
fn copy_limits(ns: &Namespace) -> CopyLimits<'_> {
    let id = ns.identify();
    let max = max_copy_ranges(copy_format(ns).1);
    if id.mssrl == 0 && id.mcl == 0 && id.msrc == 0 {
        return CopyLimits {
            ns,
            ranges: max,
            range_blocks: 0,
            blocks: 0,
        };
    }
    CopyLimits {
        ns,
        ranges: (usize::from(id.msrc) + 1).min(max),
        range_blocks: u32::from(id.mssrl),
        blocks: id.mcl,
    }
}
