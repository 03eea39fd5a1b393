//! End-to-end Data Protection as a controller does it (NVM Command Set
//! Specification 1.0, §5.2), written for the model from the specification
//! and kept apart from the driver's own `upnvme_queues::pi`: PRACT
//! generation, PRCHK checks with the Type 1/2/3 tag rules, and the
//! checks-disabled escape (Application Tag FFFFh; for Type 3 also an
//! all-ones Reference Tag); the 16-bit guard (8-byte tuple) and the 64-bit
//! guard of the Extended LBA Formats (16-byte tuple: CRC-64 NVMe guard,
//! Application Tag, 48-bit Reference Tag whose bits 47:32 come from CDW3).

use crc::{CRC_16_T10_DIF, CRC_64_NVME, Crc};

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
const CRC64: Crc<u64> = Crc::<u64>::new(&CRC_64_NVME);

/// The protection fields of one command: PRINFO (CDW12 29:26), the initial
/// reference tag (CDW14, and CDW3 bits 15:0 for a 64-bit guard),
/// application tag and mask (CDW15).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PiFields {
    pub prinfo: u8,
    pub ref_tag: u32,
    pub ref_tag_upper: u16,
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

/// The guard of a block: CRC-16 (T10 DIF) or, with a 64-bit guard, CRC-64
/// (NVMe) over its data and, with the PI in the last metadata bytes, the
/// metadata before it.
fn guard(ns: &Namespace, data: &[u8], before: &[u8]) -> u64 {
    if ns.cfg.pif == 2 {
        let mut d = CRC64.digest();
        d.update(data);
        d.update(before);
        d.finalize()
    } else {
        let mut d = CRC16.digest();
        d.update(data);
        d.update(before);
        u64::from(d.finalize())
    }
}

/// The width mask of the namespace's reference tag: 32 or 48 bits.
fn tag_mask(ns: &Namespace) -> u64 {
    if ns.cfg.pif == 2 {
        (1 << 48) - 1
    } else {
        u64::from(u32::MAX)
    }
}

/// The command's initial reference tag in the namespace's width.
fn initial_tag(ns: &Namespace, f: &PiFields) -> u64 {
    if ns.cfg.pif == 2 {
        u64::from(f.ref_tag) | u64::from(f.ref_tag_upper) << 32
    } else {
        u64::from(f.ref_tag)
    }
}

/// Writes a tuple (guard, application tag, reference tag) at `md[at..]`.
fn put_tuple(ns: &Namespace, md: &mut [u8], at: usize, guard: u64, app: u16, tag: u64) {
    if ns.cfg.pif == 2 {
        md[at..at + 8].copy_from_slice(&guard.to_be_bytes());
        md[at + 8..at + 10].copy_from_slice(&app.to_be_bytes());
        md[at + 10..at + 16].copy_from_slice(&tag.to_be_bytes()[2..]);
    } else {
        md[at..at + 2].copy_from_slice(&(guard as u16).to_be_bytes());
        md[at + 2..at + 4].copy_from_slice(&app.to_be_bytes());
        md[at + 4..at + 8].copy_from_slice(&(tag as u32).to_be_bytes());
    }
}

/// Reads the tuple at `md[at..]`: (guard, application tag, reference tag).
fn get_tuple(ns: &Namespace, md: &[u8], at: usize) -> (u64, u16, u64) {
    let be = |b: &[u8]| b.iter().fold(0u64, |a, &x| a << 8 | u64::from(x));
    if ns.cfg.pif == 2 {
        (
            be(&md[at..at + 8]),
            be(&md[at + 8..at + 10]) as u16,
            be(&md[at + 10..at + 16]),
        )
    } else {
        (
            be(&md[at..at + 2]),
            be(&md[at + 2..at + 4]) as u16,
            be(&md[at + 4..at + 8]),
        )
    }
}

/// Type 1 with a reference tag check: the initial tag must be the lower 32
/// (48 with a 64-bit guard) bits of SLBA, or the command is invalid; Type 3
/// has no reference tag to check (as QEMU: Invalid Protection Information,
/// without DNR).
pub(crate) fn check_prinfo(ns: &Namespace, f: &PiFields, slba: u64) -> Result<(), Status> {
    if ns.cfg.pi_type == 1 && f.prinfo & PRCHK_REF != 0 && slba & tag_mask(ns) != initial_tag(ns, f)
    {
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
    let mut tag = initial_tag(ns, f);
    for (block, md) in data.chunks_exact(bs).zip(meta.chunks_exact_mut(ms)) {
        let g = guard(ns, block, if ns.cfg.pi_first { &[] } else { &md[..at] });
        put_tuple(ns, md, at, g, f.app_tag, tag);
        if ns.cfg.pi_type != 3 {
            tag = tag.wrapping_add(1) & tag_mask(ns);
        }
    }
}

/// Checks each block's PI tuple against PRCHK and the expected tags.
pub(crate) fn check(ns: &Namespace, data: &[u8], meta: &[u8], f: &PiFields) -> Result<(), Status> {
    let (bs, ms) = (ns.lba_size(), ns.ms());
    let Some(at) = ns.pi_offset() else {
        return Ok(());
    };
    let mut tag = initial_tag(ns, f);
    for (block, md) in data.chunks_exact(bs).zip(meta.chunks_exact(ms)) {
        let (g, app, rt) = get_tuple(ns, md, at);
        let disabled = app == 0xffff && (ns.cfg.pi_type != 3 || rt == tag_mask(ns));
        if !disabled {
            let before = if ns.cfg.pi_first { &[][..] } else { &md[..at] };
            if f.prinfo & PRCHK_GUARD != 0 && g != guard(ns, block, before) {
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
            tag = tag.wrapping_add(1) & tag_mask(ns);
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
