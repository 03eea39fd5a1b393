//! End-to-end Data Protection as a controller does it (NVM Command Set
//! Specification 1.0, §5.2), written for the model from the specification
//! and kept apart from the driver's own `upnvme_queues::pi`: PRACT
//! generation, PRCHK checks with the Type 1/2/3 tag rules, and the
//! checks-disabled escape (Application Tag FFFFh; for Type 3 also
//! Reference Tag FFFFFFFFh).

use crc::{CRC_16_T10_DIF, Crc};

use super::status::Status;
use super::storage::Namespace;

/// End-to-end Guard Check Error (Media and Data Integrity Errors, 82h).
pub(crate) const GUARD_ERROR: Status = Status::new(2, 0x82);
/// End-to-end Application Tag Check Error (83h).
pub(crate) const APP_TAG_ERROR: Status = Status::new(2, 0x83);
/// End-to-end Reference Tag Check Error (84h).
pub(crate) const REF_TAG_ERROR: Status = Status::new(2, 0x84);
/// Invalid Protection Information (Command Specific Status, 81h).
pub(crate) const INVALID_PI: Status = Status::new(1, 0x81);

const PRACT: u8 = 0x8;
const PRCHK_GUARD: u8 = 0x4;
const PRCHK_APP: u8 = 0x2;
const PRCHK_REF: u8 = 0x1;

const CRC16: Crc<u16> = Crc::<u16>::new(&CRC_16_T10_DIF);

/// The protection fields of one command: PRINFO (CDW12 29:26), the initial
/// reference tag (CDW14), application tag and mask (CDW15).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PiFields {
    pub prinfo: u8,
    pub ref_tag: u32,
    pub app_tag: u16,
    pub app_mask: u16,
}

impl PiFields {
    /// PRACT set.
    pub fn pract(&self) -> bool {
        self.prinfo & PRACT != 0
    }

    /// Any PRCHK bit set.
    pub fn checks(&self) -> bool {
        self.prinfo & (PRCHK_GUARD | PRCHK_APP | PRCHK_REF) != 0
    }
}

/// The guard of a block: CRC-16 (T10 DIF) over its data and, with the PI in
/// the last 8 metadata bytes, the metadata before it.
fn guard(data: &[u8], before: &[u8]) -> u16 {
    let mut d = CRC16.digest();
    d.update(data);
    d.update(before);
    d.finalize()
}

/// Type 1 with a reference tag check: the initial tag must be the lower 32
/// bits of SLBA, or the command is invalid; Type 3 has no reference tag to
/// check (as QEMU: Invalid Protection Information, without DNR).
pub(crate) fn check_prinfo(ns: &Namespace, f: &PiFields, slba: u64) -> Result<(), Status> {
    if ns.cfg.pi_type == 1 && f.prinfo & PRCHK_REF != 0 && slba as u32 != f.ref_tag {
        return Err(INVALID_PI.with_dnr());
    }
    if ns.cfg.pi_type == 3 && f.prinfo & PRCHK_REF != 0 {
        return Err(INVALID_PI);
    }
    Ok(())
}

/// Writes a PI tuple into each block's metadata (PRACT on a write).
pub(crate) fn generate(ns: &Namespace, data: &[u8], meta: &mut [u8], f: &PiFields) {
    let (bs, ms) = (ns.lba_size(), ns.ms());
    let Some(at) = ns.pi_offset() else { return };
    let mut tag = f.ref_tag;
    for (block, md) in data.chunks_exact(bs).zip(meta.chunks_exact_mut(ms)) {
        let g = guard(block, if ns.cfg.pi_first { &[] } else { &md[..at] });
        md[at..at + 2].copy_from_slice(&g.to_be_bytes());
        md[at + 2..at + 4].copy_from_slice(&f.app_tag.to_be_bytes());
        md[at + 4..at + 8].copy_from_slice(&tag.to_be_bytes());
        if ns.cfg.pi_type != 3 {
            tag = tag.wrapping_add(1);
        }
    }
}

/// Checks each block's PI tuple against PRCHK and the expected tags.
pub(crate) fn check(ns: &Namespace, data: &[u8], meta: &[u8], f: &PiFields) -> Result<(), Status> {
    let (bs, ms) = (ns.lba_size(), ns.ms());
    let Some(at) = ns.pi_offset() else {
        return Ok(());
    };
    let mut tag = f.ref_tag;
    for (block, md) in data.chunks_exact(bs).zip(meta.chunks_exact(ms)) {
        let g = u16::from_be_bytes([md[at], md[at + 1]]);
        let app = u16::from_be_bytes([md[at + 2], md[at + 3]]);
        let rt = u32::from_be_bytes([md[at + 4], md[at + 5], md[at + 6], md[at + 7]]);
        let disabled = app == 0xffff && (ns.cfg.pi_type != 3 || rt == 0xffff_ffff);
        if !disabled {
            let before = if ns.cfg.pi_first { &[][..] } else { &md[..at] };
            if f.prinfo & PRCHK_GUARD != 0 && g != guard(block, before) {
                return Err(GUARD_ERROR);
            }
            if f.prinfo & PRCHK_APP != 0 && app & f.app_mask != f.app_tag & f.app_mask {
                return Err(APP_TAG_ERROR);
            }
            if f.prinfo & PRCHK_REF != 0 && rt != tag {
                return Err(REF_TAG_ERROR);
            }
        }
        if ns.cfg.pi_type != 3 {
            tag = tag.wrapping_add(1);
        }
    }
    Ok(())
}

/// Splits an extended-LBA transfer into data and metadata.
pub(crate) fn split(host: &[u8], bs: usize, ms: usize) -> (Vec<u8>, Vec<u8>) {
    let mut data = Vec::with_capacity(host.len());
    let mut meta = Vec::new();
    for block in host.chunks_exact(bs + ms) {
        data.extend_from_slice(&block[..bs]);
        meta.extend_from_slice(&block[bs..]);
    }
    (data, meta)
}

/// Interleaves data and metadata into an extended-LBA transfer.
pub(crate) fn interleave(data: &[u8], meta: &[u8], bs: usize, ms: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + meta.len());
    for (d, m) in data.chunks_exact(bs).zip(meta.chunks_exact(ms)) {
        out.extend_from_slice(d);
        out.extend_from_slice(m);
    }
    out
}
