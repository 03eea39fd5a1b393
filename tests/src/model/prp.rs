//! Walking a command's data pointer as a controller does (NVMe Base
//! Specification 2.0, "Physical Region Page Entry and List"), with the memory page size from CC.MPS.
//!
//! - PRP1 points at the first byte; its offset into the memory page must be
//!   dword aligned (bits 1:0 clear).
//! - If the data ends inside or at the end of PRP1's page, PRP2 is unused.
//! - If it ends inside the next page, PRP2 points at that page (offset 0).
//! - Otherwise PRP2 points at a PRP List (qword aligned, any offset). The list
//!   runs to the end of its memory page; when more entries are needed than fit,
//!   the last entry of the page points at the next list page instead of data.
//! - Every data entry after PRP1 must have offset 0.
//!
//! An offset rule broken is "PRP Offset Invalid"; a list that cannot be read
//! is a DMA fault.

use super::memory::{DmaFault, IovaTable};

/// Why a data pointer cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PrpError {
    /// An entry's offset breaks an alignment rule (status PRP Offset Invalid).
    Offset {
        /// The offending entry.
        entry: u64,
    },
    /// Reading a PRP list faulted.
    Dma(DmaFault),
}

/// A contiguous piece of the transfer: IOVA and length.
pub(crate) type Segment = (u64, usize);

/// The segments `[prp1, prp2]` describe for a transfer of `len` bytes with a
/// memory page size of `page` bytes (a power of two, at least 4096). Only
/// the segments covering the first `need` bytes are produced (and only the
/// list entries they need are read), but the layout — whether PRP2 is a data
/// page or a list — follows from `len`.
pub(crate) fn segments(
    mem: &IovaTable,
    prp1: u64,
    prp2: u64,
    len: usize,
    need: usize,
    page: u64,
) -> Result<Vec<Segment>, PrpError> {
    let mask = page - 1;
    if len == 0 || need == 0 {
        return Ok(Vec::new());
    }
    if prp1 & 0x3 != 0 {
        return Err(PrpError::Offset { entry: prp1 });
    }
    let len = len as u64;
    let first = (page - (prp1 & mask)).min(len);
    let mut segs = vec![(prp1, first as usize)];
    let mut rest = len - first;
    let mut covered = first;
    let need = need as u64;
    if rest == 0 || covered >= need {
        return Ok(segs);
    }
    if rest <= page {
        if prp2 & mask != 0 {
            return Err(PrpError::Offset { entry: prp2 });
        }
        segs.push((prp2, rest as usize));
        return Ok(segs);
    }
    // PRP2 is a PRP List pointer.
    let mut list = prp2;
    if list & 0x7 != 0 {
        return Err(PrpError::Offset { entry: list });
    }
    loop {
        let in_page = (page - (list & mask)) / 8;
        let needed = rest.div_ceil(page);
        let chained = needed > in_page;
        if chained && in_page < 2 {
            // A list page with room for nothing but the chain pointer would
            // let a hostile list loop forever without moving any data.
            return Err(PrpError::Offset { entry: list });
        }
        let data_entries = if chained { in_page - 1 } else { needed };
        for i in 0..data_entries {
            let entry = mem
                .read_u64(list.wrapping_add(i * 8))
                .map_err(PrpError::Dma)?;
            if entry & mask != 0 {
                return Err(PrpError::Offset { entry });
            }
            let n = rest.min(page);
            segs.push((entry, n as usize));
            rest -= n;
            covered += n;
            if covered >= need {
                return Ok(segs);
            }
        }
        if !chained {
            return Ok(segs);
        }
        let next = mem
            .read_u64(list.wrapping_add((in_page - 1) * 8))
            .map_err(PrpError::Dma)?;
        // The chain pointer is a PRP entry inside a list: offset 0 (as
        // QEMU's nvme_map_prp), unlike PRP2's list pointer.
        if next & mask != 0 {
            return Err(PrpError::Offset { entry: next });
        }
        list = next;
    }
}
