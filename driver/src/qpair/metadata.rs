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
//!   is exactly the 8-byte PI tuple, the controller inserts (writes) or
//!   strips (reads) the tuple: no metadata moves, in either layout.
//!
//! Every other combination is refused before submission with a typed
//! [`Reject`], so the device never moves a byte the command did not
//! describe. This path is taken only for such namespaces, or when a
//! command brings metadata or protection fields: the plain path pays one
//! branch for it.

use upnvme_queues::pi::{PI_TUPLE_SIZE, PRINFO_SHIFT};
use upnvme_queues::sqe::io_qwords;

use super::command::Protection;
use super::submit::{Data, MdMem, Mem, Rw};
use super::{IoCommand, IoQueuePair};
use crate::device::Device;
use crate::error::Reject;
use crate::namespace::Namespace;

/// CDW14 and CDW15 (the second half of SQE qword 7) of a protected command:
/// the (expected) initial reference tag — by default the lower 32 bits of
/// SLBA, as Type 1 requires — and the application tag and its mask.
fn tag_dwords(p: &Protection, slba: u64) -> u64 {
    let cdw14 = p.ref_tag.unwrap_or(slba as u32);
    let cdw15 = u32::from(p.app_tag_mask) << 16 | u32::from(p.app_tag);
    u64::from(cdw14) | u64::from(cdw15) << 32
}

/// Refuses protection fields on a namespace without protection
/// information, and a reference tag check on Type 3, which has no
/// reference tag to check (NVM Command Set 1.0 §5.2.1.3; the controller
/// would fail it with Invalid Protection Information).
fn pi_applies(ns: &Namespace, protection: Option<Protection>) -> Result<(), Reject> {
    let Some(p) = protection else {
        return Ok(());
    };
    match ns.metadata_layout_always().pi_type {
        0 => Err(Reject::ProtectionNotApplicable(
            "the namespace's format has no protection information (Identify Namespace DPS = 0)",
        )),
        3 if p.check_ref_tag => Err(Reject::ProtectionNotApplicable(
            "Type 3 protection has no reference tag to check: clear check_ref_tag",
        )),
        _ => Ok(()),
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
        if layout.pi_type != 0 && usize::from(layout.ms) < PI_TUPLE_SIZE {
            return Err(Reject::MetadataFormat(layout));
        }
        let p = protection.unwrap_or_default();
        let blocks = rw.blocks as usize;
        let ms = usize::from(layout.ms);
        // Metadata moves unless there is none, or PRACT lets the controller
        // insert and strip a PI tuple that is all the metadata there is.
        let md_moves = ms != 0 && !(layout.pi_type != 0 && p.pract && ms == PI_TUPLE_SIZE);
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
            q[7] = tag_dwords(&p, rw.slba);
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
                q[7] = tag_dwords(&p, slba);
                Ok((q, data))
            }
            IoCommand::Raw { .. } => {
                if protection.is_some() {
                    return Err(Reject::ProtectionNotApplicable(
                        "a raw command carries its own PRINFO and tags in its CDW12, CDW14 and CDW15",
                    ));
                }
                if let Some(md) = metadata {
                    q[2] = mptr(md)?;
                }
                Ok((q, data))
            }
            _ if metadata.is_some() => Err(Reject::MetadataNotApplicable),
            _ => Err(Reject::ProtectionNotApplicable(
                "only Read, Write, Compare, Verify and Write Zeroes have protection fields",
            )),
        }
    }
}
