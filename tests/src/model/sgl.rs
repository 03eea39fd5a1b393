//! Walking a command's SGL as a controller does (NVMe Base Specification
//! 2.0, "Scatter Gather List (SGL)"), written independently of the driver's
//! builder so that the two check each other.
//!
//! - SGL1 (DPTR) is a Data Block, a Segment or a Last Segment descriptor.
//! - A segment is an array of 16-byte descriptors (its length a non-zero
//!   multiple of 16) and "a Qword aligned data structure": a (Last) Segment
//!   descriptor whose Address is not qword aligned is refused (Invalid SGL
//!   Segment Descriptor; QEMU does not check, other controllers may read the
//!   descriptors shifted). In a Segment's segment only the last descriptor may be
//!   a (Last) Segment descriptor, pointing at the next one; a Last Segment's
//!   segment holds Data Blocks only.
//! - With SGLS bits 1:0 = 10b every Data Block address and length must be
//!   dword aligned.
//! - The Data Blocks must cover the transfer exactly.

use super::memory::{DmaFault, IovaTable};
use super::prp::Segment;
use super::status::Status;

/// Why an SGL cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SglError {
    /// The status to complete the command with.
    Status(Status),
    /// Reading a segment faulted.
    Dma(DmaFault),
}

/// SGL Descriptor Type Invalid.
const TYPE_INVALID: Status = Status::new(0, 0x11);
/// Invalid SGL Segment Descriptor.
const SEGMENT_INVALID: Status = Status::new(0, 0x0d);
/// Data SGL Length Invalid.
const LENGTH_INVALID: Status = Status::new(0, 0x0f);
/// Invalid Number of SGL Descriptors.
const NUMBER_INVALID: Status = Status::new(0, 0x0e);

fn fail(s: Status) -> SglError {
    SglError::Status(s.with_dnr())
}

/// The data pieces SGL1 (`dptr`: the DPTR's two qwords) describes for a
/// transfer of `len` bytes; `dword_aligned` is SGLS bits 1:0 = 10b.
pub(crate) fn segments(
    mem: &IovaTable,
    dptr: [u64; 2],
    len: usize,
    dword_aligned: bool,
) -> Result<Vec<Segment>, SglError> {
    let mut out: Vec<Segment> = Vec::new();
    let mut covered = 0usize;
    // Empty Data Blocks move nothing: allow a few, so a hostile list cannot
    // keep the walk reading without end.
    let mut empty = 0usize;
    let mut data = |addr: u64, n: u32, out: &mut Vec<Segment>| -> Result<(), SglError> {
        if dword_aligned && (addr | u64::from(n)) & 3 != 0 {
            return Err(fail(LENGTH_INVALID));
        }
        if n == 0 {
            empty += 1;
            return if empty > 1024 {
                Err(fail(NUMBER_INVALID))
            } else {
                Ok(())
            };
        }
        covered += n as usize;
        if covered > len || addr.checked_add(u64::from(n)).is_none() {
            return Err(fail(LENGTH_INVALID));
        }
        out.push((addr, n as usize));
        Ok(())
    };
    let id = (dptr[1] >> 56) as u8;
    let (mut addr, mut seg_len, mut last) = match id {
        0x00 => {
            data(dptr[0], dptr[1] as u32, &mut out)?;
            return finish(out, len);
        }
        0x20 => (dptr[0], dptr[1] as u32, false),
        0x30 => (dptr[0], dptr[1] as u32, true),
        _ => return Err(fail(TYPE_INVALID)),
    };
    // Each segment must move at least one byte or end the list: bound the
    // walk by the transfer length (a loop of segments would not terminate).
    for _ in 0..=len {
        if seg_len == 0 || seg_len % 16 != 0 || addr & 7 != 0 {
            return Err(fail(SEGMENT_INVALID));
        }
        let n = seg_len / 16;
        let mut next = None;
        for i in 0..n {
            let at = addr.wrapping_add(u64::from(i) * 16);
            let lo = mem.read_u64(at).map_err(SglError::Dma)?;
            let hi = mem.read_u64(at.wrapping_add(8)).map_err(SglError::Dma)?;
            match (hi >> 56) as u8 {
                0x00 => data(lo, hi as u32, &mut out)?,
                0x20 | 0x30 if !last && i + 1 == n => {
                    next = Some((lo, hi as u32, (hi >> 56) == 0x30))
                }
                0x20 | 0x30 => return Err(fail(NUMBER_INVALID)),
                _ => return Err(fail(TYPE_INVALID)),
            }
        }
        match next {
            Some((a, l, is_last)) => (addr, seg_len, last) = (a, l, is_last),
            None if last => return finish(out, len),
            None => return Err(fail(SEGMENT_INVALID)),
        }
    }
    Err(fail(SEGMENT_INVALID))
}

fn finish(out: Vec<Segment>, len: usize) -> Result<Vec<Segment>, SglError> {
    if out.iter().map(|s| s.1).sum::<usize>() == len {
        Ok(out)
    } else {
        Err(fail(LENGTH_INVALID))
    }
}
