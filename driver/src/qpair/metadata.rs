//! Data commands on LBA formats with metadata, and End-to-end Data
//! Protection (NVM Command Set Specification 1.0, §5.2 and the Read, Write,
//! Compare, Verify and Write Zeroes commands).
//!
//! What a command transfers on such a namespace (Identify Namespace FLBAS
//! bit 4, LBAF.MS, DPS), and therefore what the driver describes:
//! - **extended LBA** (FLBAS bit 4 set): each block's MS metadata bytes
//!   follow its data in the data buffer, so the data pointer describes
//!   `blocks × (LBA size + MS)` bytes; no MPTR;
//! - **separate metadata** (FLBAS bit 4 clear): the data pointer describes
//!   `blocks × LBA size` bytes and MPTR a contiguous `blocks × MS`-byte
//!   metadata buffer, which the command must bring;
//! - with protection information and PRACT set on a format whose metadata
//!   is exactly the PI tuple (8 bytes with the 16-bit guard, 16 with the
//!   32- or 64-bit guard of ELBAF.PIF), the controller inserts (writes) or
//!   strips (reads) the tuple: no metadata moves, in either layout.
//!
//! Every other combination is refused before submission with a typed
//! [`Reject`], so the device never moves a byte the command did not
//! describe. This path is taken only for such namespaces, or when a
//! command brings metadata or protection fields: the plain path pays one
//! branch for it.

use upnvme_queues::pi::{PRINFO_SHIFT, Pif};
use upnvme_queues::sqe::{Sqe, io_qwords};

use super::command::Protection;
use super::submit::{Data, MdMem, Mem, Rw};
use super::{IoCommand, IoQueuePair};
use crate::device::Device;
use crate::error::Reject;
use crate::namespace::{MetadataLayout, Namespace};

/// SQE qwords 1 (CDW2, CDW3) and 7 (CDW14, CDW15) of a protected command:
/// the (expected) initial reference tag — by default the lower 32 (16-bit
/// guard) or 48 (64-bit guard) bits of SLBA, as Type 1 requires — and the
/// application tag and its mask. With a 64-bit guard the 48-bit tag is
/// split: bits 31:0 in CDW14, bits 47:32 in CDW3 bits 15:0 (NVM Command Set
/// 1.0, "Command Dword 2 and Command Dword 3" and "Command Dword 14": the
/// storage and reference space, here without storage tag). A tag wider
/// than the format's is refused.
fn tag_qwords(p: &Protection, slba: u64, layout: MetadataLayout) -> Result<(u64, u64), Reject> {
    let max = layout.pif.ref_tag_max();
    let tag = p.ref_tag.unwrap_or(slba & max);
    if tag > max {
        return Err(Reject::ProtectionNotApplicable(
            "the reference tag is wider than the format's (32 bits with a 16-bit guard, 48 with a 64-bit guard)",
        ));
    }
    // Type 1's reference tag is the LBA's lower bits: the controller fails
    // any other with Invalid Protection Information when it checks it, and
    // with PRACT on a write it would store tags that every later checked
    // read of those blocks fails.
    if layout.pi_type == 1 && tag != slba & max {
        return Err(Reject::ProtectionNotApplicable(
            "Type 1 protection takes the reference tag from the LBA: leave ref_tag None (or the SLBA's lower 32 bits, 48 with a 64-bit guard)",
        ));
    }
    let cdw3 = tag >> 32;
    let cdw14 = tag & 0xffff_ffff;
    let cdw15 = u64::from(p.app_tag_mask) << 16 | u64::from(p.app_tag);
    Ok((cdw3 << 32, cdw14 | cdw15 << 32))
}

/// Refuses protection fields on a namespace without protection
/// information, and a reference tag check on Type 3, which has no
/// reference tag to check (NVM Command Set 1.0 §5.2.1.3; the controller
/// would fail it with Invalid Protection Information).
fn pi_applies(ns: &Namespace, protection: Option<Protection>) -> Result<(), Reject> {
    let Some(p) = protection else {
        return Ok(());
    };
    let layout = ns.metadata_layout_always();
    if layout.pi_type != 0 && layout.pif == Pif::Guard32 {
        return Err(Reject::ProtectionNotApplicable(
            "the namespace's format has a 32-bit guard (ELBAF.PIF 01b), which upnvme does not build commands for",
        ));
    }
    if layout.pi_type != 0 && layout.sts != 0 {
        return Err(Reject::ProtectionNotApplicable(
            "the namespace's format has storage tags (ELBAF.STS non-zero), which upnvme does not build commands for",
        ));
    }
    match layout.pi_type {
        0 => Err(Reject::ProtectionNotApplicable(
            "the namespace's format has no protection information (Identify Namespace DPS = 0)",
        )),
        3 if p.check_ref_tag => Err(Reject::ProtectionNotApplicable(
            "Type 3 protection has no reference tag to check: clear check_ref_tag",
        )),
        1..=3 => Ok(()),
        _ => Err(Reject::ProtectionNotApplicable(
            "the namespace's protection type is reserved (Identify Namespace DPS bits 2:0 above 3)",
        )),
    }
}

/// Whether a Read, Write or Compare moves metadata between host and
/// controller: unless the format has none, or PRACT lets the controller
/// insert and strip a PI tuple that is all the metadata there is.
pub(super) fn metadata_moves(layout: MetadataLayout, p: &Protection) -> bool {
    let ms = usize::from(layout.ms);
    ms != 0 && !(layout.pi_type != 0 && p.pract && ms == layout.pif.tuple_size())
}

/// Per logical block of a Read, Write or Compare: the bytes its data
/// pointer moves (the LBA data size, plus the metadata with an extended-LBA
/// format) and the bytes of its separate metadata buffer.
pub(super) fn bytes_per_block(ns: &Namespace, protection: Option<Protection>) -> (usize, usize) {
    let lba = 1usize << ns.lba_shift();
    if !ns.has_metadata() {
        return (lba, 0);
    }
    let layout = ns.metadata_layout_always();
    let ms = usize::from(layout.ms);
    match (
        metadata_moves(layout, &protection.unwrap_or_default()),
        layout.extended,
    ) {
        (true, true) => (lba + ms, 0),
        (true, false) => (lba, ms),
        (false, _) => (lba, 0),
    }
}

/// The reference tag of the part of a command that starts `blocks` blocks
/// after its first: Types 1 and 2 increment it per block (modulo the tag's
/// width), Type 3 has none to increment. `None` (taken from the SLBA) stays
/// `None`.
pub(super) fn ref_tag_after(ns: &Namespace, tag: Option<u64>, blocks: u64) -> Option<u64> {
    let layout = ns.metadata_layout_always();
    match tag {
        Some(t) if matches!(layout.pi_type, 1 | 2) => {
            Some(t.wrapping_add(blocks) & layout.pif.ref_tag_max())
        }
        other => other,
    }
}

/// The reference tag a split's pieces start from ([`ref_tag_after`] then
/// advances it per piece): on Type 3, whose tag does not advance per block,
/// `None` (the SLBA's lower bits) is resolved against the whole command's
/// SLBA, so that every piece carries the tag one command would have stored
/// in every block (each piece's own SLBA would make what lands on the medium
/// depend on MDTS). Types 1 and 2 keep `None`: each piece's SLBA is then its
/// own tag, as one command's would advance.
pub(super) fn split_ref_tag(ns: &Namespace, tag: Option<u64>, slba: u64) -> Option<u64> {
    let layout = ns.metadata_layout_always();
    match tag {
        None if layout.pi_type == 3 => Some(slba & layout.pif.ref_tag_max()),
        other => other,
    }
}

/// A metadata buffer usable as MPTR: dword aligned (NVMe Base 2.0,
/// "Metadata Pointer": with PSDT 00b or 01b MPTR is a dword-aligned
/// address of one contiguous buffer).
fn mptr(md: MdMem) -> Result<u64, Reject> {
    if md.iova & 3 != 0 {
        return Err(Reject::Misaligned);
    }
    Ok(md.iova)
}

impl<D: Device> IoQueuePair<D> {
    /// Read, Write or Compare on a namespace with metadata, or with a
    /// metadata buffer or protection fields.
    #[cold]
    #[inline(never)]
    pub(super) fn build_rw_md(
        &self,
        ns: &Namespace,
        rw: Rw,
        mem: Mem<'_>,
        metadata: Option<MdMem>,
        protection: Option<Protection>,
    ) -> Result<([u64; 8], Data), Reject> {
        let layout = ns.metadata_layout_always();
        pi_applies(ns, protection)?;
        let tuple = layout.pif.tuple_size();
        if layout.pi_type != 0 && usize::from(layout.ms) < tuple {
            return Err(Reject::MetadataFormat(layout));
        }
        let p = protection.unwrap_or_default();
        let blocks = rw.blocks as usize;
        let ms = usize::from(layout.ms);
        let md_moves = metadata_moves(layout, &p);
        let mut bytes = blocks << ns.lba_shift();
        let mut q2 = 0;
        match (md_moves, layout.extended, metadata) {
            (true, true, None) => bytes += blocks * ms,
            (true, false, Some(md)) => {
                let need = blocks * ms;
                if md.len < need {
                    return Err(Reject::MetadataBuffer { need: need as u64 });
                }
                q2 = mptr(md)?;
            }
            (true, false, None) => {
                return Err(Reject::MetadataBuffer {
                    need: (blocks * ms) as u64,
                });
            }
            (false, _, None) => {}
            (_, _, Some(_)) => return Err(Reject::MetadataNotApplicable),
        }
        let data = self.data_for(bytes, mem)?;
        let cdw12 = (rw.blocks - 1) | rw.flags.cdw12() | u32::from(p.prinfo()) << PRINFO_SHIFT;
        let mut q = io_qwords(rw.op, 0, ns.id(), 0, 0, rw.slba, cdw12);
        q[2] = q2;
        if protection.is_some() {
            (q[1], q[7]) = tag_qwords(&p, rw.slba, layout)?;
        }
        Ok((q, data))
    }

    /// Any other command with a metadata buffer or protection fields: Verify
    /// and Write Zeroes take protection fields (Write Zeroes PRACT only), a
    /// raw command takes a metadata buffer (its MPTR); everything else
    /// refuses them.
    #[cold]
    #[inline(never)]
    pub(super) fn build_other_md(
        &self,
        cmd: &IoCommand<'_>,
        mem: Mem<'_>,
        flags: super::IoFlags,
        metadata: Option<MdMem>,
        protection: Option<Protection>,
    ) -> Result<([u64; 8], Data), Reject> {
        let ns = cmd.namespace();
        if let IoCommand::Raw { sqe, data_len, .. } = *cmd {
            if protection.is_some() {
                return Err(Reject::ProtectionNotApplicable(
                    "a raw command carries its own PRINFO and tags in its CDW12, CDW14 and CDW15",
                ));
            }
            return self.build_raw(ns, sqe, data_len, mem, flags, metadata);
        }
        let (mut q, data) = self.build(cmd, mem, flags, None, None)?;
        match *cmd {
            IoCommand::Verify { slba, .. } | IoCommand::WriteZeroes { slba, .. } => {
                if metadata.is_some() {
                    return Err(Reject::MetadataNotApplicable);
                }
                pi_applies(ns, protection)?;
                let Some(p) = protection else {
                    return Ok((q, data));
                };
                if matches!(cmd, IoCommand::WriteZeroes { .. }) && p.checks() {
                    return Err(Reject::ProtectionNotApplicable(
                        "Write Zeroes takes PRACT only: it has no data to check (PRCHK must be 0)",
                    ));
                }
                q[6] |= u64::from(p.prinfo()) << PRINFO_SHIFT;
                (q[1], q[7]) = tag_qwords(&p, slba, ns.metadata_layout_always())?;
                Ok((q, data))
            }
            _ if metadata.is_some() => Err(Reject::MetadataNotApplicable),
            _ => Err(Reject::ProtectionNotApplicable(
                "only Read, Write, Compare, Verify and Write Zeroes have protection fields",
            )),
        }
    }

    /// A raw I/O command ([`IoCommand::Raw`]): the caller's opcode and
    /// command dwords, the driver's NSID, CID, data pointer and MPTR (from
    /// the metadata buffer, if one is passed). The data pointer describes
    /// what the SQE moves where the driver can tell (below), else
    /// `data_len` bytes.
    ///
    /// For the commands whose transfer the driver can work out from the
    /// SQE, it checks that what it describes covers what the controller
    /// will move — otherwise the controller would take what lies past the
    /// described memory as further PRP entries or data: Read, Write and
    /// Compare (CDW12.NLB blocks of data, with metadata as the format and
    /// PRINFO.PRACT say, see the module doc), Dataset Management, Copy
    /// (Descriptor Formats 0h and 1h) and the four Reservation commands.
    /// Any other opcode moves what the caller says it moves: the device is
    /// trusted to transfer exactly `data_len` bytes for it.
    #[cold]
    #[inline(never)]
    pub(super) fn build_raw(
        &self,
        ns: &Namespace,
        sqe: &Sqe,
        data_len: usize,
        mem: Mem<'_>,
        flags: super::IoFlags,
        metadata: Option<MdMem>,
    ) -> Result<([u64; 8], Data), Reject> {
        super::submit::no_flags(flags)?;
        if sqe.dw[0] >> 8 & 0x3 != 0 {
            return Err(Reject::RawCommand("a fused command (CDW0.FUSE non-zero)"));
        }
        if sqe.dw[4] != 0 || sqe.dw[5] != 0 {
            return Err(Reject::RawCommand(
                "a metadata pointer (MPTR): pass the metadata with the command instead",
            ));
        }
        let op = (sqe.dw[0] & 0xff) as u8;
        let (need, md_need) = raw_transfer(ns, op, sqe);
        if data_len < need {
            return Err(Reject::BufferTooSmall { need: need as u64 });
        }
        let md = match (md_need, metadata) {
            (Some(n), Some(md)) if md.len < n => {
                return Err(Reject::MetadataBuffer { need: n as u64 });
            }
            (Some(n), None) => return Err(Reject::MetadataBuffer { need: n as u64 }),
            (_, md) => md,
        };
        let mut q = sqe.to_qwords();
        // Opcode only from CDW0; NSID from the handle; MPTR and the data
        // pointer are the driver's.
        q[0] = u64::from(op) | u64::from(ns.id()) << 32;
        q[2] = md.map_or(Ok(0), mptr)?;
        q[3] = 0;
        q[4] = 0;
        // Describe what the command moves when the SQE says, not the
        // (larger) `data_len`: a PRP2 is a data page or a list pointer by
        // the transfer's own length (NVMe 2.0 §4.3.1), so a list built for
        // more than two pages under a transfer of two would have the
        // controller move data into the list page; an SGL Data Block
        // longer than the transfer is Data SGL Length Invalid without
        // SGLS bit 18.
        let bytes = if need > 0 { need } else { data_len };
        if bytes == 0 {
            return Ok((q, Data::None));
        }
        let data = self.data_for(bytes, mem)?;
        Ok((q, data))
    }
}

/// What a raw command of opcode `op` moves, when the driver can tell from
/// its SQE: the bytes its data pointer must cover, and the bytes of a
/// separate metadata buffer it needs (`None`: none). Unknown opcodes: 0
/// and `None` (the caller's `data_len` is taken as it is).
fn raw_transfer(ns: &Namespace, op: u8, sqe: &Sqe) -> (usize, Option<usize>) {
    use upnvme_queues::sqe::opcode::nvm;
    match op {
        nvm::READ | nvm::WRITE | nvm::COMPARE => {
            let cdw12 = sqe.dw[12];
            let blocks = (cdw12 & 0xffff) as usize + 1;
            let layout = ns.metadata_layout_always();
            let ms = usize::from(layout.ms);
            // PRINFO.PRACT (CDW12 bit 29) on a format whose metadata is just
            // the PI tuple: the controller inserts or strips it.
            let pract = (cdw12 >> (PRINFO_SHIFT + 3)) & 1 == 1;
            let md_moves =
                ms != 0 && !(layout.pi_type != 0 && pract && ms == layout.pif.tuple_size());
            let data = blocks << ns.lba_shift();
            match (md_moves, layout.extended) {
                (true, true) => (data + blocks * ms, None),
                (true, false) => (data, Some(blocks * ms)),
                (false, _) => (data, None),
            }
        }
        // CDW10.NR + 1 ranges of 16 bytes.
        nvm::DATASET_MANAGEMENT => (((sqe.dw[10] & 0xff) as usize + 1) * 16, None),
        // CDW12.NR + 1 source range entries of Descriptor Format 0h or 2h
        // (32 bytes) or 1h or 3h (40 bytes); other formats are the caller's.
        nvm::COPY => match (sqe.dw[12] >> 8) & 0xf {
            0 | 2 => (((sqe.dw[12] & 0xff) as usize + 1) * 32, None),
            1 | 3 => (((sqe.dw[12] & 0xff) as usize + 1) * 40, None),
            _ => (0, None),
        },
        // The reservation data structures: CRKEY and NRKEY / PRKEY, CRKEY
        // alone; Reservation Report returns CDW10.NUMD + 1 dwords.
        nvm::RESERVATION_REGISTER | nvm::RESERVATION_ACQUIRE => (16, None),
        nvm::RESERVATION_RELEASE => (8, None),
        nvm::RESERVATION_REPORT => ((sqe.dw[10] as usize + 1) * 4, None),
        _ => (0, None),
    }
}
