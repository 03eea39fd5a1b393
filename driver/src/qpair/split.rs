//! Transfers larger than one command may carry: a Read, Write or Compare of
//! one buffer (whole, or a slice) or of a vector above the controller's
//! MDTS, or above the 65536 blocks of CDW12.NLB, is split into child
//! commands, and the caller gets one completion for the whole when the last
//! child ends. So is a Verify, Write Zeroes or Write Uncorrectable above
//! its size limit (VSL, WZSL, WUSL) or 65536 blocks: children of at most
//! the limit's blocks, without data. And a Deallocate, or a Dataset
//! Management without Integral Dataset attributes, of more than 256 ranges
//! or beyond DMRL, DMRSL or DMSL: children carrying the ranges in order,
//! each within the three limits ([`cut_ranges`]).
//!
//! - **Where the split happens.** Only after the command was refused as it
//!   is (`build` answered [`Reject::TransferTooLarge`], a
//!   [`Reject::SizeLimit`] of VSL, WZSL, WUSL, DMRL, DMRSL or DMSL,
//!   [`Reject::BlockCount`] above 65536 blocks, or [`Reject::RangeCount`]
//!   above 256 ranges): the plain path and every command that fits pay
//!   nothing for it.
//! - **The pieces.** Each child moves at most `MDTS / bytes per block`
//!   whole blocks (and at most 65536), in LBA order; child *i* starts at
//!   block `b` of the command: SLBA + b, the data at buffer (or vector)
//!   offset `b × bytes per block` (an extended-LBA format counts its
//!   interleaved metadata; a child's part of a vector may start and end
//!   inside segments), a separate metadata buffer at `b × MS`, and a given
//!   reference tag plus `b` on Types 1 and 2 (NVM Command Set 1.0 §5.2.1.3:
//!   the tag increments per block). Each child is checked by the same
//!   `build` as any command, so a split refuses exactly what the pieces
//!   would refuse on their own.
//! - **All or nothing.** Every child is checked, and the free CID slots
//!   counted; then every child takes its slot and gets its data pointer
//!   (a refusal releases the slots taken); only then are the SQEs written.
//!   A refused split queued nothing and hands everything back
//!   ([`Reject::QueueFull`] when the slots are not free now;
//!   [`Reject::LbaRange`] for a range outside the namespace; the original
//!   reason when the split can never fit: more children than the pair's
//!   depth, a block larger than MDTS, or a block size that would start a
//!   child off a dword boundary; the placement's reason, e.g. a part of a
//!   vector PRPs cannot describe).
//! - **One completion.** A child's tracker holds no memory: the parent
//!   (here) holds the tag, the buffer or vector and the metadata buffer, and is handed
//!   back when the last child's slot is released — by a reap, a reset, a
//!   close — so the buffer goes back only when the device can reach none of
//!   it. The result is the first child error seen (a media error in one
//!   piece fails the whole), else `Ok` with the dword 0 of the child that
//!   completed last (not necessarily the last in LBA order).
//!   Children are counted as commands in [`crate::QueueStats`].

use upnvme_dma::DmaBuffer;

use super::IoQueuePair;
use super::command::{Completion, IoCommand};
use super::iodata::{IoData, IoVec};
use super::metadata::{bytes_per_block, ref_tag_after, split_ref_tag};
use super::submit::{MdMem, Mem, slice_room};
use crate::device::Device;
use crate::error::{IoError, NvmLimit, RangeCommand, Reject, Rejected};
use upnvme_queues::DsmRange;

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
    segments: Option<IoVec>,
    metadata: Option<DmaBuffer>,
    /// Children not ended yet.
    remaining: u32,
    /// The first child error.
    error: Option<IoError>,
    /// Dword 0 of the child that succeeded last (in completion order).
    dw0: u32,
}

/// The split commands of a pair: a slab whose capacity (the pair's depth:
/// a split waiting for a child holds at least that child's slot) is
/// reserved at the first split, so later splits allocate nothing.
#[derive(Debug, Default)]
pub(super) struct Splits {
    parents: Vec<Option<Parent>>,
    free: Vec<u16>,
    /// The children of the split being queued, between taking their slots
    /// and writing their SQEs: (slot, CID, SQE). Kept for its capacity.
    staged: Vec<(u16, u16, [u64; 8])>,
}

impl Splits {
    /// Takes `parent` in; hands it back when no entry is free.
    fn alloc(&mut self, max_depth: u32, parent: Parent) -> Result<u16, Parent> {
        if self.parents.is_empty() {
            let n = max_depth.max(1) as usize;
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

    /// Takes split `index` out and frees its entry.
    fn release(&mut self, index: u16) -> Option<Parent> {
        let p = self.parents.get_mut(usize::from(index))?.take()?;
        self.free.push(index);
        Some(p)
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
            .flat_map(|p| {
                p.buffer
                    .into_iter()
                    .chain(p.segments.into_iter().flat_map(IoVec::into_buffers))
                    .chain(p.metadata)
            })
    }
}

/// `io` handed back with `reason`.
fn refused(reason: Reject, io: IoData) -> Rejected {
    Rejected::with_memory(reason, io.buffer, io.segments, io.metadata)
}

/// Whether `cmd`'s refusal for `reason` is one a split may cure: a Read,
/// Write or Compare with memory above MDTS or 65536 blocks; a Verify,
/// Write Zeroes or Write Uncorrectable above its size limit (VSL, WZSL,
/// WUSL) or 65536 blocks.
pub(super) fn may_split(reason: Reject, cmd: &IoCommand<'_>, io: &IoData) -> bool {
    let above_nlb = matches!(reason, Reject::BlockCount { blocks } if u64::from(blocks) > MAX_NLB);
    match cmd {
        IoCommand::Read { .. } | IoCommand::Write { .. } | IoCommand::Compare { .. } => {
            (above_nlb || matches!(reason, Reject::TransferTooLarge { .. }))
                && (io.buffer.is_some() || io.segments.is_some())
        }
        IoCommand::Verify { .. }
        | IoCommand::WriteZeroes { .. }
        | IoCommand::WriteUncorrectable { .. } => {
            above_nlb
                || matches!(
                    reason,
                    Reject::SizeLimit {
                        limit: NvmLimit::Verify
                            | NvmLimit::WriteZeroes
                            | NvmLimit::WriteUncorrectable,
                        ..
                    }
                )
        }
        // Dataset Management: more than 256 ranges, or beyond DMRL, DMRSL
        // or DMSL — unless its ranges are one integral dataset (IDR, IDW),
        // which commands of their own would no longer be.
        IoCommand::Deallocate { .. } => dsm_split_reason(reason),
        IoCommand::DatasetManagement { attributes, .. } => {
            !attributes.integral_read && !attributes.integral_write && dsm_split_reason(reason)
        }
        _ => false,
    }
}

/// Whether a Dataset Management refusal is one a split may cure.
fn dsm_split_reason(reason: Reject) -> bool {
    matches!(
        reason,
        Reject::RangeCount {
            command: RangeCommand::DatasetManagement,
            ranges: 1..,
            ..
        } | Reject::SizeLimit {
            limit: NvmLimit::DsmRanges | NvmLimit::DsmRangeBlocks | NvmLimit::DsmBlocks,
            ..
        }
    )
}

/// The size limit of a Verify, Write Zeroes or Write Uncorrectable (`None`
/// for a command that moves data).
fn no_data_limit(cmd: &IoCommand<'_>) -> Option<NvmLimit> {
    match cmd {
        IoCommand::Verify { .. } => Some(NvmLimit::Verify),
        IoCommand::WriteZeroes { .. } => Some(NvmLimit::WriteZeroes),
        IoCommand::WriteUncorrectable { .. } => Some(NvmLimit::WriteUncorrectable),
        _ => None,
    }
}

/// Child `i`'s command and memory.
struct Child<'a> {
    cmd: IoCommand<'a>,
    mem: Mem<'a>,
    md: Option<MdMem>,
    protection: Option<super::Protection>,
    /// Where its data starts: the buffer offset, or the vector offset.
    offset: usize,
}

/// How the children of one split are cut: `per` blocks each from `slba`.
#[derive(Clone, Copy)]
struct Cut<'a> {
    cmd: IoCommand<'a>,
    ns: &'a crate::namespace::Namespace,
    slba: u64,
    blocks: u64,
    per: u64,
    block_bytes: usize,
    md_bytes: usize,
    /// The command moves no data (Verify, Write Zeroes, Write
    /// Uncorrectable): its children get no memory.
    no_data: bool,
    /// The buffer's length (`None`: the data is a vector).
    len: Option<usize>,
    offset: usize,
    limit: usize,
    md: Option<MdMem>,
    protection: Option<super::Protection>,
}

impl<'a> Cut<'a> {
    /// Child `i`; `segments` is the vector when the data is one.
    fn child(&self, i: u32, segments: Option<&'a IoVec>) -> Child<'a> {
        let b = u64::from(i) * self.per;
        let n = self.per.min(self.blocks - b) as u32;
        let slba = self.slba + b;
        let ns = self.ns;
        let blocks = n;
        let cmd = match self.cmd {
            IoCommand::Read { .. } => IoCommand::Read { ns, slba, blocks },
            IoCommand::Write { .. } => IoCommand::Write { ns, slba, blocks },
            IoCommand::Compare { .. } => IoCommand::Compare { ns, slba, blocks },
            IoCommand::Verify { .. } => IoCommand::Verify { ns, slba, blocks },
            IoCommand::WriteZeroes { deallocate, .. } => IoCommand::WriteZeroes {
                ns,
                slba,
                blocks,
                deallocate,
            },
            // `queue_split` takes no other command.
            _ => IoCommand::WriteUncorrectable { ns, slba, blocks },
        };
        // Saturating: out of range means `build` refuses the child.
        let skip = (b as usize).saturating_mul(self.block_bytes);
        let (mem, offset) = match self.len {
            _ if self.no_data => {
                let mem = Mem {
                    buffer: None,
                    offset: 0,
                    limit: usize::MAX,
                    segments: None,
                };
                (mem, 0)
            }
            Some(len) => {
                let offset = self.offset.saturating_add(skip);
                let limit = if self.limit == usize::MAX {
                    usize::MAX
                } else {
                    self.limit.saturating_sub(skip)
                };
                let mem = Mem {
                    buffer: Some(len),
                    offset,
                    limit,
                    segments: None,
                };
                (mem, offset)
            }
            // The vector from `skip` on: `build` checks its total length,
            // the caller checked that every child's part lies inside it.
            None => {
                let mem = Mem {
                    buffer: None,
                    offset: 0,
                    limit: usize::MAX,
                    segments,
                };
                (mem, skip)
            }
        };
        let md_skip = (b as usize).saturating_mul(self.md_bytes);
        Child {
            cmd,
            mem,
            md: self.md.map(|m| MdMem {
                iova: m.iova.wrapping_add(md_skip as u64),
                len: m.len.saturating_sub(md_skip),
            }),
            protection: self.protection.map(|p| super::Protection {
                ref_tag: ref_tag_after(ns, p.ref_tag, b),
                ..p
            }),
            offset,
        }
    }
}

/// A Dataset Management's ranges cut into commands: `ranges` in order, the
/// commands' ends in it (command *i* carries `ranges[ends[i-1]..ends[i]]`).
struct RangeCut<'a> {
    ns: &'a crate::namespace::Namespace,
    /// `None`: a Deallocate.
    attributes: Option<super::command::DsmAttributes>,
    ranges: Vec<DsmRange>,
    ends: Vec<usize>,
    /// The command's metadata buffer and protection fields, given to every
    /// child: a Dataset Management refuses them, and a split must refuse
    /// what one command would (the whole was refused for its range count
    /// before they were looked at).
    md: Option<MdMem>,
    protection: Option<super::Protection>,
}

/// How a split command is cut.
enum Pieces<'a> {
    /// Into block counts (data, Verify, Write Zeroes, Write Uncorrectable).
    Blocks(Cut<'a>),
    /// Into range lists (Dataset Management).
    Ranges(RangeCut<'a>),
}

impl<'a> Pieces<'a> {
    /// Child `i`; `segments` is the vector when the data is one.
    fn child<'s>(&'s self, i: u32, segments: Option<&'s IoVec>) -> Child<'s> {
        match self {
            Pieces::Blocks(cut) => cut.child(i, segments),
            Pieces::Ranges(cut) => {
                let i = i as usize;
                let start = if i == 0 { 0 } else { cut.ends[i - 1] };
                let ranges = &cut.ranges[start..cut.ends[i]];
                let ns = cut.ns;
                let cmd = match cut.attributes {
                    None => IoCommand::Deallocate { ns, ranges },
                    Some(attributes) => IoCommand::DatasetManagement {
                        ns,
                        ranges,
                        attributes,
                    },
                };
                Child {
                    cmd,
                    mem: Mem {
                        buffer: None,
                        offset: 0,
                        limit: usize::MAX,
                        segments: None,
                    },
                    md: cut.md,
                    protection: cut.protection,
                    offset: 0,
                }
            }
        }
    }
}

/// Dataset Management's limits for one command: ranges (DMRL, and 256),
/// blocks per range (DMRSL), blocks in all ranges (DMSL).
#[derive(Clone, Copy)]
struct DsmCaps {
    ranges: usize,
    range_blocks: u32,
    blocks: u64,
}

/// `ranges` cut into Dataset Management commands within `caps`, in order:
/// a range beyond DMRSL, or beyond what is left of DMSL in its command,
/// goes on as further ranges of the same Context Attributes. Returns how
/// many commands, `None` when more than `max_commands` would be needed
/// (the count stops there: a range of 2^32 − 1 blocks under a DMRSL of 1
/// is not walked to its end). With `out`, the pieces and each command's
/// end in them are written too (only after a count that fits, so nothing
/// is allocated for a refusal). A range of 0 blocks is kept as it is
/// (`build` refuses it).
fn cut_ranges(
    ranges: &[DsmRange],
    caps: DsmCaps,
    max_commands: usize,
    mut out: Option<(&mut Vec<DsmRange>, &mut Vec<usize>)>,
) -> Option<usize> {
    let (mut commands, mut pieces) = (0usize, 0usize);
    let (mut count, mut total) = (0usize, 0u64);
    for r in ranges {
        let (mut slba, mut left) = (r.slba, r.nlb);
        loop {
            if count == caps.ranges || (count > 0 && total >= caps.blocks) {
                commands += 1;
                if commands >= max_commands {
                    return None;
                }
                if let Some((_, ends)) = out.as_mut() {
                    ends.push(pieces);
                }
                (count, total) = (0, 0);
            }
            let room = u32::try_from(caps.blocks - total).unwrap_or(u32::MAX);
            let nlb = left.min(caps.range_blocks).min(room);
            if let Some((cut, _)) = out.as_mut() {
                cut.push(DsmRange {
                    cattr: r.cattr,
                    nlb,
                    slba,
                });
            }
            pieces += 1;
            count += 1;
            total += u64::from(nlb);
            slba = slba.saturating_add(u64::from(nlb));
            left -= nlb;
            if left == 0 {
                break;
            }
        }
    }
    if count > 0 {
        commands += 1;
        if let Some((_, ends)) = out.as_mut() {
            ends.push(pieces);
        }
    }
    (commands <= max_commands).then_some(commands)
}

impl<D: Device> IoQueuePair<D> {
    /// A Dataset Management refused as a whole for `reason` (see
    /// [`may_split`]) as several, all or none: its ranges cut by
    /// [`cut_ranges`] under the controller's DMRL, DMRSL and DMSL, at most
    /// the pair's depth of commands (beyond: `reason`, nothing sent).
    fn queue_dsm_split(
        &mut self,
        cmd: IoCommand<'_>,
        io: IoData,
        tag: u64,
        reason: Reject,
    ) -> Result<Key, Rejected> {
        let (ns, ranges, attributes) = match cmd {
            IoCommand::Deallocate { ns, ranges } => (ns, ranges, None),
            IoCommand::DatasetManagement {
                ns,
                ranges,
                attributes,
            } => (ns, ranges, Some(attributes)),
            _ => return Err(refused(reason, io)),
        };
        let (max_ranges, range_blocks, blocks) = self.limits.dsm_caps();
        let caps = DsmCaps {
            ranges: max_ranges.min(super::submit::MAX_DSM_RANGES),
            range_blocks,
            blocks,
        };
        let depth = self.max_depth as usize;
        if cut_ranges(ranges, caps, depth, None).is_none() {
            // More commands than the pair holds: the limit that made them
            // so many is the reason — the range count alone, else DMRSL,
            // else DMSL (the whole's first refusal may name another).
            let unbounded = DsmCaps {
                range_blocks: u32::MAX,
                blocks: u64::MAX,
                ..caps
            };
            let reason = if cut_ranges(ranges, unbounded, depth, None).is_none() {
                reason
            } else if cut_ranges(
                ranges,
                DsmCaps {
                    blocks: u64::MAX,
                    ..caps
                },
                depth,
                None,
            )
            .is_none()
            {
                Reject::SizeLimit {
                    limit: NvmLimit::DsmRangeBlocks,
                    max: u64::from(caps.range_blocks),
                }
            } else {
                Reject::SizeLimit {
                    limit: NvmLimit::DsmBlocks,
                    max: caps.blocks,
                }
            };
            return Err(refused(reason, io));
        }
        let (mut ranges_cut, mut ends) = (Vec::new(), Vec::new());
        cut_ranges(ranges, caps, depth, Some((&mut ranges_cut, &mut ends)));
        let ranges = ranges_cut;
        let k = ends.len() as u32;
        let pieces = Pieces::Ranges(RangeCut {
            ns,
            attributes,
            ranges,
            ends,
            md: io.metadata.as_ref().map(|m| MdMem {
                iova: m.iova(),
                len: m.len(),
            }),
            protection: io.protection,
        });
        self.queue_pieces(&pieces, k, io, tag)
    }

    /// Splits `cmd` (refused as a whole for `reason`, see [`may_split`])
    /// into child commands and queues them, all or none. Returns the key.
    ///
    /// Three steps: every child is built (checked); then each gets its CID
    /// slot, tracker and data pointer (PRP List or SGL in its slot's list
    /// page) — a refusal here releases the slots taken, nothing was
    /// written to the SQ; only then are the SQEs written. So a refused
    /// split sent nothing, whatever refused it.
    #[cold]
    #[inline(never)]
    pub(super) fn queue_split(
        &mut self,
        cmd: IoCommand<'_>,
        io: IoData,
        tag: u64,
        reason: Reject,
    ) -> Result<Key, Rejected> {
        let refuse = |reason: Reject, io: IoData| Err(refused(reason, io));
        if matches!(
            cmd,
            IoCommand::Deallocate { .. } | IoCommand::DatasetManagement { .. }
        ) {
            return self.queue_dsm_split(cmd, io, tag, reason);
        }
        let (ns, slba, blocks) = match cmd {
            IoCommand::Read { ns, slba, blocks }
            | IoCommand::Write { ns, slba, blocks }
            | IoCommand::Compare { ns, slba, blocks }
            | IoCommand::Verify { ns, slba, blocks }
            | IoCommand::WriteZeroes {
                ns, slba, blocks, ..
            }
            | IoCommand::WriteUncorrectable { ns, slba, blocks } => (ns, slba, u64::from(blocks)),
            _ => return refuse(reason, io),
        };
        // Outside the namespace is the first thing to say: the refusal
        // below for more pieces than the pair holds would otherwise name
        // the size of a command that could never run at any depth.
        if slba
            .checked_add(blocks)
            .is_none_or(|end| end > ns.lba_count())
        {
            return refuse(Reject::LbaRange, io);
        }
        let no_data = no_data_limit(&cmd);
        let (block_bytes, md_bytes, per) = match no_data {
            // No memory to cut: each child covers at most what the size
            // limit allows (and 65536 blocks). Whatever memory came with the
            // command (a metadata buffer, which `build` refuses for these,
            // or a buffer they do not use) stays with the parent.
            Some(limit) => {
                let per = self
                    .limits
                    .max_blocks(limit, ns)
                    .unwrap_or(MAX_NLB)
                    .min(MAX_NLB);
                (0, 0, per)
            }
            None => {
                let (block_bytes, md_bytes) = bytes_per_block(ns, io.protection);
                // `per` = 0: one block is above MDTS. A block size that is
                // not a multiple of 4 would start children off the dword
                // alignment PRPs and MPTR need.
                if block_bytes % 4 != 0 || md_bytes % 4 != 0 {
                    return refuse(reason, io);
                }
                let per = (self.max_transfer / block_bytes).min(MAX_NLB as usize) as u64;
                (block_bytes, md_bytes, per)
            }
        };
        if per == 0 {
            return refuse(reason, io);
        }
        let k = blocks.div_ceil(per);
        let need = (blocks as usize).saturating_mul(block_bytes);
        if k > u64::from(self.max_depth) {
            // More pieces than the pair holds: too large to split here,
            // whatever refused it as a whole (a block count above 65536
            // included, which a split would otherwise carry). A command
            // without data has no transfer to name: the size limit when it
            // bounds the pieces, else the block count.
            return match no_data {
                Some(limit) if per < MAX_NLB => refuse(Reject::SizeLimit { limit, max: per }, io),
                Some(_) => refuse(
                    Reject::BlockCount {
                        blocks: blocks as u32,
                    },
                    io,
                ),
                None => refuse(Reject::TransferTooLarge { bytes: need as u64 }, io),
            };
        }
        let k = k as u32;
        // The whole transfer is measured before the children: a refusal for
        // the block count came before the memory was, and a child that does
        // not fit would name its own share as the need.
        // A command without data has nothing to measure.
        let room = match (no_data, io.segments.as_ref(), io.buffer.as_ref()) {
            (None, Some(v), _) => Ok(v.total_len()),
            (None, None, Some(b)) => slice_room(b.len(), io.offset, io.limit),
            _ => Ok(need),
        };
        match room {
            Err(e) => return refuse(e, io),
            Ok(room) if room < need => {
                return refuse(Reject::BufferTooSmall { need: need as u64 }, io);
            }
            Ok(_) => {}
        }
        if md_bytes > 0 {
            let md_need = (blocks as usize).saturating_mul(md_bytes);
            if io.metadata.as_ref().is_none_or(|m| m.len() < md_need) {
                return refuse(
                    Reject::MetadataBuffer {
                        need: md_need as u64,
                    },
                    io,
                );
            }
        }
        let cut = Cut {
            cmd,
            ns,
            slba,
            blocks,
            per,
            block_bytes,
            md_bytes,
            no_data: no_data.is_some(),
            len: if io.segments.is_some() {
                None
            } else {
                io.buffer.as_ref().map(DmaBuffer::len)
            },
            offset: io.offset,
            limit: io.limit,
            md: io.metadata.as_ref().map(|m| MdMem {
                iova: m.iova(),
                len: m.len(),
            }),
            protection: io.protection.map(|p| super::Protection {
                ref_tag: split_ref_tag(ns, p.ref_tag, slba),
                ..p
            }),
        };
        self.queue_pieces(&Pieces::Blocks(cut), k, io, tag)
    }

    /// Queues the `k` children of `pieces`, all or none (the steps of
    /// [`IoQueuePair::queue_split`]); the parent holds `io`'s memory.
    fn queue_pieces(
        &mut self,
        pieces: &Pieces<'_>,
        k: u32,
        io: IoData,
        tag: u64,
    ) -> Result<Key, Rejected> {
        let flags = io.flags;
        // 1. Every child is checked before anything is taken (and before
        // the room: a command no room would help is refused as what it is).
        for i in 0..k {
            let c = pieces.child(i, io.segments.as_ref());
            if let Err(r) = self.build(&c.cmd, c.mem, flags, c.md, c.protection) {
                return Err(refused(r, io));
            }
        }
        // Room in the SQ for every child too, so that writing them below
        // cannot fail halfway (after the head inference of
        // `sq_push_when_full` when the SQ looks short).
        if self.sq_ring.free_slots() < k {
            self.settle_sq_head(0);
        }
        if self.trackers.free_slots() < k
            || self.sq_ring.free_slots() < k
            || (!self.ready.is_empty()
                && self.trackers.in_flight() + self.ready.len() as u32 + k > self.max_depth)
        {
            let reason = (0..k)
                .map(|i| {
                    let c = pieces.child(i, io.segments.as_ref());
                    match self.build(&c.cmd, c.mem, flags, c.md, c.protection) {
                        Ok((_, data)) => self.full_refusal(&data, io.segments.as_ref(), c.offset),
                        Err(r) => r,
                    }
                })
                .find(|r| *r != Reject::QueueFull)
                .unwrap_or(Reject::QueueFull);
            return Err(refused(reason, io));
        }
        let base = io.buffer.as_ref().map_or(0, DmaBuffer::iova);
        let segments = io.segments;
        let parent = Parent {
            tag,
            buffer: io.buffer,
            segments: None,
            metadata: io.metadata,
            remaining: k,
            error: None,
            dw0: 0,
        };
        let index = match self.splits.alloc(self.max_depth, parent) {
            Ok(index) => index,
            // Cannot happen (every live split holds at least one of the
            // `max_depth` slots, and this one needs free slots too);
            // refused like a full queue if it did.
            Err(p) => {
                return Err(Rejected::with_memory(
                    Reject::QueueFull,
                    p.buffer,
                    segments,
                    p.metadata,
                ));
            }
        };
        // 2. Slots, trackers and data pointers.
        let mut staged = std::mem::take(&mut self.splits.staged);
        staged.clear();
        staged.reserve(k as usize);
        let mut failure = None;
        for i in 0..k {
            let c = pieces.child(i, segments.as_ref());
            match self.stage_child(&c, flags, base, segments.as_ref(), index) {
                Ok(s) => staged.push(s),
                Err(r) => {
                    failure = Some(r);
                    break;
                }
            }
        }
        if let Some(r) = failure {
            for &(slot, ..) in &staged {
                let _ = self.unqueue(slot, r);
            }
            self.splits.staged = staged;
            let (buffer, metadata) = match self.splits.release(index) {
                Some(p) => (p.buffer, p.metadata),
                None => (None, None),
            };
            return Err(Rejected::with_memory(r, buffer, segments, metadata));
        }
        if let Some(p) = self.splits.parents[usize::from(index)].as_mut() {
            p.segments = segments;
        }
        // 3. The SQEs, in LBA order.
        let mut written = 0u32;
        for &(slot, cid, q) in &staged {
            self.cq_space_for_submit();
            let Some(pos) = self.sq_ring.push() else {
                let _ = self.unqueue(slot, Reject::QueueFull);
                break;
            };
            if let Some(t) = self.trackers.get_mut(slot) {
                t.sq_pos = pos;
            }
            let q = [
                q[0] | u64::from(cid) << 16,
                q[1],
                q[2],
                q[3],
                q[4],
                q[5],
                q[6],
                q[7],
            ];
            if self.write_sqe_and_announce(pos, &q, slot).is_err() {
                break;
            }
            written += 1;
        }
        if written < k {
            // Cannot happen (the slots were counted and the SQ has room for
            // every one of them); if it did, the children not written are
            // released, those written are commands the device may run: the
            // split ends with them, as failed, and the pair takes no more
            // commands (as `write_sqe_and_announce` does).
            for &(slot, ..) in &staged[written as usize + 1..] {
                let _ = self.unqueue(slot, Reject::QueueFull);
            }
            self.set_failed();
            if let Some(p) = self.splits.parents[usize::from(index)].as_mut() {
                p.remaining = written;
                p.error = Some(IoError::ControllerFailed);
            }
        }
        self.splits.staged = staged;
        // The caller counts the command it queued; the other children are
        // counted as submissions with the next `ring` (`pending`).
        self.pending += written.saturating_sub(1);
        if written == 0 {
            let p = self.splits.release(index);
            let (buffer, segments, metadata) = match p {
                Some(p) => (p.buffer, p.segments, p.metadata),
                None => (None, None, None),
            };
            return Err(Rejected::with_memory(
                Reject::Unusable,
                buffer,
                segments,
                metadata,
            ));
        }
        Ok(SPLIT_KEY | Key::from(index))
    }

    /// Step 2 for child `c` of split `index`: CID slot, tracker and data
    /// pointer. Returns the slot, the CID and the SQE (CID still to fill).
    fn stage_child(
        &mut self,
        c: &Child<'_>,
        flags: super::IoFlags,
        base: u64,
        segments: Option<&IoVec>,
        index: u16,
    ) -> Result<(u16, u16, [u64; 8]), Reject> {
        let (q, data) = self.build(&c.cmd, c.mem, flags, c.md, c.protection)?;
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
        let placed = match (data, segments) {
            (super::submit::Data::Buffer(bytes), None) => {
                let iova = base.wrapping_add(c.offset as u64);
                match self.inline_prp(iova, bytes) {
                    Some((prp1, prp2)) => Ok((prp1, prp2, false)),
                    None => self.place_contiguous(iova, bytes, slot),
                }
            }
            (super::submit::Data::Vector(bytes), Some(v)) => {
                self.place_vector(v, c.offset, bytes, slot)
            }
            (super::submit::Data::None, _) => Ok((0, 0, false)),
            (super::submit::Data::Ranges, _) => match c.cmd {
                IoCommand::Deallocate { ranges, .. }
                | IoCommand::DatasetManagement { ranges, .. } => {
                    self.place_ranges(ranges, slot).map(|prp1| (prp1, 0, false))
                }
                _ => Err(Reject::NotDescribable),
            },
            _ => Err(Reject::NotDescribable),
        };
        let (prp1, prp2, sgl) = match placed {
            Ok(d) => d,
            Err(r) => {
                let _ = self.unqueue(slot, r);
                return Err(r);
            }
        };
        let psdt = u64::from(sgl) * u64::from(upnvme_queues::sgl::PSDT_SGL_MPTR_ADDRESS);
        Ok((
            slot,
            cid.value,
            [q[0] | psdt, q[1], q[2], prp1, prp2, q[5], q[6], q[7]],
        ))
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
        let p = self.splits.release(i as u16)?;
        Some((
            SPLIT_KEY | i as Key,
            Completion {
                tag: p.tag,
                result: match p.error {
                    Some(e) => Err(e),
                    None => Ok(p.dw0),
                },
                buffer: p.buffer,
                segments: p.segments,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `cut_ranges` against its definition, over pseudo-random lists and
    /// limits: the pieces of each range, in order, cover it exactly;
    /// every command is within the three limits; `None` exactly when more
    /// than `max_commands` commands are needed.
    #[test]
    fn cut_ranges_covers_every_range_within_every_limit() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..20_000 {
            let ranges: Vec<DsmRange> = (0..1 + next(12))
                .map(|i| DsmRange {
                    cattr: i as u32,
                    nlb: next(40) as u32,
                    slba: next(1000),
                })
                .collect();
            let max_ranges = 1 + next(4) as usize;
            let max_range = 1 + next(16) as u32;
            let max_total = 1 + next(30);
            let max_commands = 1 + next(20) as usize;
            let caps = DsmCaps {
                ranges: max_ranges,
                range_blocks: max_range,
                blocks: max_total,
            };
            let got = cut_ranges(&ranges, caps, max_commands, None);
            let (mut out, mut ends) = (Vec::new(), Vec::new());
            let all = cut_ranges(&ranges, caps, usize::MAX, Some((&mut out, &mut ends)))
                .expect("no command bound");
            assert_eq!(all, ends.len());
            assert_eq!(got.is_none(), all > max_commands);
            if let Some(k) = got {
                assert_eq!(k, all);
            }
            assert_eq!(*ends.last().unwrap(), out.len());
            let mut start = 0;
            for &end in &ends {
                let cmd = &out[start..end];
                assert!(!cmd.is_empty() && cmd.len() <= max_ranges);
                assert!(cmd.iter().all(|r| r.nlb <= max_range));
                assert!(cmd.iter().map(|r| u64::from(r.nlb)).sum::<u64>() <= max_total);
                start = end;
            }
            // Each range's pieces: consecutive, same attributes, its blocks.
            let mut at = out.iter();
            for r in &ranges {
                let (mut slba, mut left) = (r.slba, r.nlb);
                loop {
                    let p = at.next().expect("a piece per range");
                    assert_eq!((p.slba, p.cattr), (slba, r.cattr));
                    slba += u64::from(p.nlb);
                    left -= p.nlb;
                    if left == 0 {
                        break;
                    }
                    assert!(p.nlb > 0);
                }
            }
            assert!(at.next().is_none());
        }
    }
}
