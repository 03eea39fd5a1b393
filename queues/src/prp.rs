//! Physical Region Page entries and lists (NVMe Base Specification 2.0, §4.3
//! "Physical Region Page Entry and List").
//!
//! Rules implemented here:
//! - PRP1 (DPTR.PRP1) may carry any dword-aligned offset into its memory page
//!   (bits 1:0 zero); the data runs to the end of that page.
//! - When the transfer ends within the next page, PRP2 is that page's
//!   address (offset 0).
//! - Otherwise PRP2 is a PRP List pointer (qword aligned, may have an offset).
//!   Each list entry is a page-aligned data page. A list fills its memory page
//!   to the end; when more entries follow, the last entry of that page instead
//!   points to the next list page ("chaining"). A page whose last slot is
//!   exactly the last data entry holds that entry, not a pointer. That chain
//!   pointer is itself an entry of a PRP List, and "PRP entries contained
//!   within a PRP List shall have a memory page offset of 0h": only the first
//!   list page (PRP2's) may start at an offset, every later one starts on a
//!   page (QEMU fails another with PRP Offset Invalid).
//!
//! Everything is pure arithmetic over IOVAs: the driver copies the resulting
//! list entries into DMA memory. [`decode`] is the device's view (used by
//! controller models and by the property tests to check that every byte of a
//! transfer is described exactly once).

use core::fmt;

/// Smallest memory page size (CC.MPS = 0): 4 KiB.
pub const MIN_PAGE_SIZE: usize = 4096;
/// Largest memory page size (CC.MPS = 15): 128 MiB.
pub const MAX_PAGE_SIZE: usize = 1 << 27;
/// Size of one PRP entry in bytes.
pub const PRP_ENTRY_SIZE: usize = 8;

/// Errors from planning, building or decoding PRPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrpError {
    /// The transfer length is zero (commands without data use no PRPs).
    ZeroLength,
    /// The page size is not a power of two in 4 KiB..=128 MiB.
    InvalidPageSize(usize),
    /// PRP1 is not dword aligned (bits 1:0 must be zero).
    Prp1Unaligned(u64),
    /// A PRP2 data pointer or a PRP List entry is not page aligned.
    PageUnaligned(u64),
    /// A PRP List pointer (PRP2 or a chain pointer) is not qword aligned.
    ListUnaligned(u64),
    /// `iova + len` overflows the 64-bit address space.
    Overflow,
    /// The caller's list buffer has fewer entries than the list needs.
    ListTooSmall {
        /// Entries available in the caller's buffer.
        available: usize,
    },
    /// While decoding: a list entry could not be read (not mapped).
    MissingListEntry(u64),
    /// While decoding: the list chains more often than the transfer could
    /// need (a loop in the chain pointers).
    ChainLoop,
}

impl fmt::Display for PrpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PrpError::ZeroLength => f.write_str("PRP transfer of zero bytes"),
            PrpError::InvalidPageSize(ps) => write!(
                f,
                "memory page size {ps} is not a power of two between 4 KiB and 128 MiB"
            ),
            PrpError::Prp1Unaligned(a) => {
                write!(f, "PRP1 {a:#x} is not dword aligned")
            }
            PrpError::PageUnaligned(a) => write!(f, "PRP entry {a:#x} is not page aligned"),
            PrpError::ListUnaligned(a) => {
                write!(f, "PRP List pointer {a:#x} is not qword aligned")
            }
            PrpError::Overflow => f.write_str("PRP transfer wraps the 64-bit address space"),
            PrpError::ListTooSmall { available } => write!(
                f,
                "PRP list needs more than the {available} entries provided (transfer too large \
                 for the tracker's list pages; check MDTS)"
            ),
            PrpError::MissingListEntry(a) => write!(f, "PRP List entry at {a:#x} is unreadable"),
            PrpError::ChainLoop => f.write_str("PRP List chain pointers loop"),
        }
    }
}

impl std::error::Error for PrpError {}

fn check_page_size(page_size: usize) -> Result<(), PrpError> {
    if page_size.is_power_of_two() && (MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&page_size) {
        Ok(())
    } else {
        Err(PrpError::InvalidPageSize(page_size))
    }
}

/// Number of memory pages the byte range `[iova, iova + len)` touches.
/// Returns 0 when `len` is 0 or `page_size` is not a power of two.
pub fn prp_pages(iova: u64, len: usize, page_size: usize) -> usize {
    if len == 0 || !page_size.is_power_of_two() {
        return 0;
    }
    let shift = page_size.trailing_zeros();
    let offset = u128::from(iova) & (page_size as u128 - 1);
    let pages = (offset + len as u128 + page_size as u128 - 1) >> shift;
    usize::try_from(pages).unwrap_or(usize::MAX)
}

/// How a transfer is described in the command's Data Pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrpLayout {
    /// The data fits in PRP1's page; PRP2 is unused (0).
    One {
        /// DPTR.PRP1.
        prp1: u64,
    },
    /// The data spans exactly two pages: PRP2 is the second page.
    Two {
        /// DPTR.PRP1.
        prp1: u64,
        /// DPTR.PRP2, the (page-aligned) second page.
        prp2: u64,
    },
    /// Three or more pages: PRP2 must point to a PRP List holding
    /// `list_entries` data-page entries (chain pointers not counted; see
    /// [`list_slots`]).
    List {
        /// DPTR.PRP1.
        prp1: u64,
        /// Number of data pages after the first, i.e. list entries.
        list_entries: usize,
    },
}

/// Plans the Data Pointer for a buffer that is contiguous in IOVA space
/// starting at `first_iova` (dword aligned) and `len` bytes long.
pub fn plan(first_iova: u64, len: usize, page_size: usize) -> Result<PrpLayout, PrpError> {
    check_page_size(page_size)?;
    if len == 0 {
        return Err(PrpError::ZeroLength);
    }
    if first_iova & 3 != 0 {
        return Err(PrpError::Prp1Unaligned(first_iova));
    }
    // The last byte must be addressable.
    (len as u64 - 1)
        .checked_add(first_iova)
        .ok_or(PrpError::Overflow)?;
    let pages = prp_pages(first_iova, len, page_size);
    let page_base = first_iova & !(page_size as u64 - 1);
    Ok(match pages {
        1 => PrpLayout::One { prp1: first_iova },
        2 => PrpLayout::Two {
            prp1: first_iova,
            prp2: page_base + page_size as u64,
        },
        n => PrpLayout::List {
            prp1: first_iova,
            list_entries: n - 1,
        },
    })
}

/// Number of 8-byte slots a list of `list_entries` entries occupies when
/// every list page is a whole, page-aligned page: data entries plus one chain
/// pointer per additional list page. Returns 0 for 0 entries or an invalid
/// page size.
pub fn list_slots(list_entries: usize, page_size: usize) -> usize {
    let pages = list_pages(list_entries, page_size);
    if pages == 0 {
        0
    } else {
        list_entries + pages - 1
    }
}

/// Number of page-aligned list pages needed for `list_entries` entries: one
/// page holds `page_size / 8` entries, or that many minus one plus a chain
/// pointer when more follow. Returns 0 for 0 entries or an invalid page size.
pub fn list_pages(list_entries: usize, page_size: usize) -> usize {
    if list_entries == 0 || check_page_size(page_size).is_err() {
        return 0;
    }
    let per_page = page_size / PRP_ENTRY_SIZE;
    if list_entries <= per_page {
        1
    } else {
        // p pages hold p * (per_page - 1) + 1 entries.
        (list_entries - 1).div_ceil(per_page - 1)
    }
}

/// Iterator over the page-aligned IOVAs of the data pages after the first
/// of a contiguous buffer: the entries of its PRP2 / PRP List. See [`data_pages`].
#[derive(Clone, Debug)]
pub struct DataPages {
    next: u64,
    remaining: usize,
    page_size: u64,
}

impl Iterator for DataPages {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.remaining == 0 {
            return None;
        }
        let v = self.next;
        self.remaining -= 1;
        match self.next.checked_add(self.page_size) {
            Some(n) => self.next = n,
            None => self.remaining = 0,
        }
        Some(v)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

/// The data pages after the first of the IOVA-contiguous buffer
/// `[first_iova, first_iova + len)`. Empty for invalid inputs.
pub fn data_pages(first_iova: u64, len: usize, page_size: usize) -> DataPages {
    let pages = prp_pages(first_iova, len, page_size);
    let ps = page_size as u64;
    let start = (first_iova & !ps.wrapping_sub(1)).checked_add(ps);
    match start {
        Some(next) if pages > 1 => DataPages {
            next,
            remaining: pages - 1,
            page_size: ps,
        },
        _ => DataPages {
            next: 0,
            remaining: 0,
            page_size: ps,
        },
    }
}

/// Writes a PRP List into `out` and returns the number of slots used.
///
/// - `page_iovas`: the list's data entries in order (page aligned), i.e. the
///   data pages after the first.
/// - `out`: the list memory as one flat array of entries: list page 0's
///   slots, then list page 1's, and so on (exactly the layout of a
///   contiguous list region, which the driver copies in page by page).
/// - `list_page_iova(i)`: the IOVA of list page `i`'s first slot: page 0's
///   (what PRP2 must hold) qword aligned, at any offset in its page; every
///   later page's page aligned, since the chain pointer to it is a PRP List
///   entry, whose offset must be 0h ([`PrpError::PageUnaligned`] otherwise).
///   A list page holds slots up to the end of its memory page, so a
///   page-aligned list page has `page_size / 8` slots.
///
/// When more entries remain than fit in a list page, its last slot receives
/// `list_page_iova(i + 1)` (the chain pointer). No allocation.
pub fn build_list<I, F>(
    page_iovas: I,
    out: &mut [u64],
    page_size: usize,
    mut list_page_iova: F,
) -> Result<usize, PrpError>
where
    I: IntoIterator<Item = u64>,
    F: FnMut(usize) -> u64,
{
    check_page_size(page_size)?;
    let mask = page_size as u64 - 1;
    let mut it = page_iovas.into_iter();
    let mut pending = it.next();
    if pending.is_none() {
        return Ok(0);
    }
    let mut put = |idx: usize, v: u64| -> Result<(), PrpError> {
        let available = out.len();
        let slot = out
            .get_mut(idx)
            .ok_or(PrpError::ListTooSmall { available })?;
        *slot = v;
        Ok(())
    };
    let slots_in = |base: u64| -> Result<usize, PrpError> {
        if base & 7 != 0 {
            return Err(PrpError::ListUnaligned(base));
        }
        Ok((page_size - (base & mask) as usize) / PRP_ENTRY_SIZE)
    };

    let mut page = 0usize;
    let mut cap = slots_in(list_page_iova(0))?;
    let mut k = 0usize; // slot index within the current list page
    let mut written = 0usize;
    while let Some(entry) = pending {
        if entry & mask != 0 {
            return Err(PrpError::PageUnaligned(entry));
        }
        pending = it.next();
        // On the last slot of a list page with more entries to come: chain.
        // Only page 0 may be short (an offset into its page); every later
        // one is a whole page of at least 512 slots, so this runs at most
        // once per entry.
        while k + 1 == cap && pending.is_some() {
            page += 1;
            let next = list_page_iova(page);
            // The chain pointer is a PRP List entry: offset 0h.
            if next & mask != 0 {
                return Err(PrpError::PageUnaligned(next));
            }
            let next_cap = slots_in(next)?;
            put(written, next)?;
            written += 1;
            cap = next_cap;
            k = 0;
        }
        put(written, entry)?;
        written += 1;
        k += 1;
    }
    Ok(written)
}

/// The Data Pointer values of a built transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prps {
    /// DPTR.PRP1.
    pub prp1: u64,
    /// DPTR.PRP2 (0, the second page, or the PRP List pointer).
    pub prp2: u64,
    /// Slots of the caller's list buffer that were written (0 without a list);
    /// copy `list[..list_len]` into the list pages' DMA memory.
    pub list_len: usize,
}

/// The I/O fast path of [`plan`] for 4 KiB memory pages (CC.MPS = 0): PRP1
/// and PRP2 of a transfer that touches one or two pages (NVMe 2.0 §4.3.1:
/// PRP2 is 0 for one page, the second page's address for two), or `None`
/// when it needs a PRP List or is not a valid transfer (`len` 0, PRP1 not
/// dword aligned, or the last byte beyond the address space) — then use
/// [`build_contiguous`], which says why.
#[inline(always)]
pub fn prp_pair_4k(first_iova: u64, len: usize) -> Option<(u64, u64)> {
    const PS: u64 = 4096;
    // `len` in 1..=2 pages (so the sums below cannot overflow), PRP1 dword
    // aligned, the transfer within two pages, the last byte addressable.
    let len = len as u64;
    if len.wrapping_sub(1) >= 2 * PS || first_iova & 3 != 0 || first_iova > u64::MAX - (len - 1) {
        return None;
    }
    let end = (first_iova & (PS - 1)) + len;
    if end > 2 * PS {
        return None;
    }
    let prp2 = if end > PS {
        (first_iova & !(PS - 1)) + PS
    } else {
        0
    };
    Some((first_iova, prp2))
}

/// Plans and builds PRPs for an IOVA-contiguous buffer in one step: PRP1 and
/// PRP2 for the command, and the PRP List (if any) written into `list` (see
/// [`build_list`] for `list` and `list_page_iova`).
pub fn build_contiguous<F>(
    first_iova: u64,
    len: usize,
    page_size: usize,
    list: &mut [u64],
    mut list_page_iova: F,
) -> Result<Prps, PrpError>
where
    F: FnMut(usize) -> u64,
{
    match plan(first_iova, len, page_size)? {
        PrpLayout::One { prp1 } => Ok(Prps {
            prp1,
            prp2: 0,
            list_len: 0,
        }),
        PrpLayout::Two { prp1, prp2 } => Ok(Prps {
            prp1,
            prp2,
            list_len: 0,
        }),
        PrpLayout::List { prp1, .. } => {
            let prp2 = list_page_iova(0);
            let list_len = build_list(
                data_pages(first_iova, len, page_size),
                list,
                page_size,
                list_page_iova,
            )?;
            Ok(Prps {
                prp1,
                prp2,
                list_len,
            })
        }
    }
}

/// One contiguous piece of a transfer as the controller sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrpSegment {
    /// Bus address of the piece.
    pub iova: u64,
    /// Length in bytes.
    pub len: usize,
}

/// Walks PRP1/PRP2 (and the PRP List through `read_entry`, which returns the
/// 8-byte entry stored at an IOVA) the way a controller does, returning the
/// data segments in transfer order. Every input is validated, including
/// chain loops, so a controller model can feed it host memory safely.
/// Allocates the result: not for the host's hot path.
pub fn decode<F>(
    prp1: u64,
    prp2: u64,
    len: usize,
    page_size: usize,
    mut read_entry: F,
) -> Result<Vec<PrpSegment>, PrpError>
where
    F: FnMut(u64) -> Option<u64>,
{
    check_page_size(page_size)?;
    if len == 0 {
        return Err(PrpError::ZeroLength);
    }
    if prp1 & 3 != 0 {
        return Err(PrpError::Prp1Unaligned(prp1));
    }
    let ps = page_size as u64;
    let mask = ps - 1;
    let first_len = (ps - (prp1 & mask)).min(len as u64) as usize;
    let mut segs = vec![PrpSegment {
        iova: prp1,
        len: first_len,
    }];
    let mut remaining = len - first_len;
    if remaining == 0 {
        return Ok(segs);
    }
    if remaining <= page_size {
        if prp2 & mask != 0 {
            return Err(PrpError::PageUnaligned(prp2));
        }
        segs.push(PrpSegment {
            iova: prp2,
            len: remaining,
        });
        return Ok(segs);
    }
    let total_entries = remaining.div_ceil(page_size);
    let mut hops_left = total_entries;
    let mut ptr = prp2;
    while remaining > 0 {
        if ptr & 7 != 0 {
            return Err(PrpError::ListUnaligned(ptr));
        }
        let slots_left = (ps - (ptr & mask)) / PRP_ENTRY_SIZE as u64;
        let entries_needed = remaining.div_ceil(page_size);
        let value = read_entry(ptr).ok_or(PrpError::MissingListEntry(ptr))?;
        if slots_left == 1 && entries_needed > 1 {
            if hops_left == 0 {
                return Err(PrpError::ChainLoop);
            }
            // A chain pointer is an entry of the list: offset 0h (unlike
            // PRP2's list pointer).
            if value & mask != 0 {
                return Err(PrpError::PageUnaligned(value));
            }
            hops_left -= 1;
            ptr = value;
            continue;
        }
        if value & mask != 0 {
            return Err(PrpError::PageUnaligned(value));
        }
        let l = remaining.min(page_size);
        segs.push(PrpSegment {
            iova: value,
            len: l,
        });
        remaining -= l;
        ptr = ptr.checked_add(8).ok_or(PrpError::Overflow)?;
    }
    Ok(segs)
}

/// Maximum Data Transfer Size in bytes from Identify Controller MDTS (a power
/// of two in units of the minimum memory page size, CAP.MPSMIN). MDTS 0 means
/// no limit and returns `None`; so does a limit too large for `usize`.
pub fn max_transfer(mdts: u8, mpsmin_page: usize) -> Option<usize> {
    if mdts == 0 {
        return None;
    }
    1usize
        .checked_shl(u32::from(mdts))
        .and_then(|m| m.checked_mul(mpsmin_page))
}

#[cfg(test)]
mod tests {
    #[test]
    fn pair_fast_path_reaches_the_last_byte_of_the_address_space() {
        // The last byte at u64::MAX is addressable, as `plan` agrees.
        assert!(plan(u64::MAX - 3, 4, 4096).is_ok());
        assert_eq!(prp_pair_4k(u64::MAX - 3, 4), Some((u64::MAX - 3, 0)));
        assert_eq!(
            prp_pair_4k(u64::MAX - 4095, 4096),
            Some((u64::MAX - 4095, 0))
        );
        assert_eq!(prp_pair_4k(u64::MAX - 4095, 4097), None);
    }

    use super::*;
    use std::collections::HashMap;

    const PS: usize = 4096;

    #[test]
    fn pages() {
        assert_eq!(prp_pages(0, 4096, PS), 1);
        assert_eq!(prp_pages(0, 4097, PS), 2);
        assert_eq!(prp_pages(4092, 8, PS), 2);
        assert_eq!(prp_pages(4092, 4, PS), 1);
        assert_eq!(prp_pages(512, 8192, PS), 3);
        assert_eq!(prp_pages(0, 0, PS), 0);
        assert_eq!(prp_pages(0, 10, 3000), 0);
        assert_eq!(prp_pages(u64::MAX - 3, usize::MAX, PS), (1 << 52) + 1);
    }

    #[test]
    fn plans() {
        assert_eq!(plan(0x1000, 4096, PS), Ok(PrpLayout::One { prp1: 0x1000 }));
        assert_eq!(plan(0x1200, 512, PS), Ok(PrpLayout::One { prp1: 0x1200 }));
        assert_eq!(
            plan(0x1200, 4096, PS),
            Ok(PrpLayout::Two {
                prp1: 0x1200,
                prp2: 0x2000
            })
        );
        assert_eq!(
            plan(0x1000, 8192, PS),
            Ok(PrpLayout::Two {
                prp1: 0x1000,
                prp2: 0x2000
            })
        );
        assert_eq!(
            plan(0x1004, 8192, PS),
            Ok(PrpLayout::List {
                prp1: 0x1004,
                list_entries: 2
            })
        );
        assert_eq!(plan(0x1002, 8, PS), Err(PrpError::Prp1Unaligned(0x1002)));
        assert_eq!(plan(0x1000, 0, PS), Err(PrpError::ZeroLength));
        assert_eq!(plan(0, 1, 1000), Err(PrpError::InvalidPageSize(1000)));
        assert_eq!(plan(0, 1, 2048), Err(PrpError::InvalidPageSize(2048)));
        assert_eq!(plan(u64::MAX - 3, 8, PS), Err(PrpError::Overflow));
        assert!(plan(u64::MAX - 3, 4, PS).is_ok());
    }

    #[test]
    fn list_page_counts() {
        assert_eq!(list_pages(0, PS), 0);
        assert_eq!(list_pages(1, PS), 1);
        assert_eq!(list_pages(512, PS), 1);
        assert_eq!(list_pages(513, PS), 2);
        assert_eq!(list_pages(1023, PS), 2);
        assert_eq!(list_pages(1024, PS), 3);
        assert_eq!(list_slots(512, PS), 512);
        assert_eq!(list_slots(513, PS), 514);
    }

    #[test]
    fn chain_exactly_full_page_has_no_pointer() {
        // 512 list entries fit exactly in one 4 KiB list page.
        let mut out = vec![0u64; 1024];
        let n = build_list((1..=512u64).map(|i| i << 12), &mut out, PS, |i| {
            0x10_0000 + (i as u64) * 4096
        })
        .unwrap();
        assert_eq!(n, 512);
        assert_eq!(out[511], 512 << 12);
        // 513 entries: slot 511 chains, page 1 holds the last two.
        let n = build_list((1..=513u64).map(|i| i << 12), &mut out, PS, |i| {
            0x10_0000 + (i as u64) * 4096
        })
        .unwrap();
        assert_eq!(n, 514);
        assert_eq!(out[510], 511 << 12);
        assert_eq!(out[511], 0x10_1000);
        assert_eq!(out[512], 512 << 12);
        assert_eq!(out[513], 513 << 12);
    }

    #[test]
    fn list_with_offset_pointer() {
        // List starts 16 bytes before the end of its page: 2 slots there.
        let base = 0x20_0ff0u64;
        let mut out = vec![0u64; 8];
        let n = build_list([0x1000u64, 0x2000, 0x3000], &mut out, PS, |i| {
            if i == 0 { base } else { 0x20_1000 }
        })
        .unwrap();
        assert_eq!(&out[..n], &[0x1000, 0x20_1000, 0x2000, 0x3000]);
    }

    #[test]
    fn build_errors() {
        let mut out = vec![0u64; 2];
        assert_eq!(
            build_list([0x1000u64, 0x2000, 0x3000], &mut out, PS, |_| 0x9000),
            Err(PrpError::ListTooSmall { available: 2 })
        );
        assert_eq!(
            build_list([0x1001u64], &mut out, PS, |_| 0x9000),
            Err(PrpError::PageUnaligned(0x1001))
        );
        assert_eq!(
            build_list([0x1000u64], &mut out, PS, |_| 0x9004),
            Err(PrpError::ListUnaligned(0x9004))
        );
        assert_eq!(build_list([], &mut out, PS, |_| 0x9000), Ok(0));
        // A single-slot first list page chains at once; the next list page
        // must then be a whole page (a chain pointer has offset 0h), so
        // single-slot pages cannot follow one another.
        let mut big = vec![0u64; 64];
        assert_eq!(
            build_list([0x1000u64, 0x2000], &mut big, PS, |_| 0x9ff8),
            Err(PrpError::PageUnaligned(0x9ff8))
        );
        let n = build_list([0x1000u64, 0x2000], &mut big, PS, |i| {
            if i == 0 { 0x9ff8 } else { 0xa000 }
        })
        .unwrap();
        assert_eq!(&big[..n], &[0xa000, 0x1000, 0x2000]);
    }

    /// The chain pointer at the end of a list page is a PRP List entry, so
    /// its offset must be 0h (NVMe 2.0 §4.3.1; QEMU's nvme_map_prp fails
    /// another with PRP Offset Invalid). Only PRP2's list pointer may carry
    /// an offset. The builder refuses a later list page off a page, and the
    /// device's walk refuses such a chain pointer.
    #[test]
    fn a_chain_pointer_is_a_list_entry_with_offset_0() {
        let entries = (1..=513u64).map(|i| i << 12);
        let mut out = vec![0u64; 1024];
        assert_eq!(
            build_list(entries.clone(), &mut out, PS, |i| 0x10_0000
                + (i as u64) * 0x1008),
            Err(PrpError::PageUnaligned(0x10_1008))
        );
        // PRP2 itself at an offset is fine: its page chains to a whole page.
        let n = build_list(entries, &mut out, PS, |i| {
            if i == 0 { 0x10_0ff0 } else { 0x20_0000 }
        })
        .unwrap();
        assert_eq!(&out[..3], &[1 << 12, 0x20_0000, 2 << 12]);
        assert_eq!(n, 514);
        // The device's view: a list page whose chain slot points 8 bytes
        // into a page is refused, whatever that page holds.
        let mut mem: HashMap<u64, u64> = (0..511u64)
            .map(|j| (0x80_0000 + 8 * j, (j + 2) << 12))
            .collect();
        mem.insert(0x80_0ff8, 0x90_0008);
        for j in 0..8u64 {
            mem.insert(0x90_0008 + 8 * j, (600 + j) << 12);
            mem.insert(0x90_0000 + 8 * j, (700 + j) << 12);
        }
        let len = 514 * PS;
        assert_eq!(
            decode(0x1000, 0x80_0000, len, PS, |a| mem.get(&a).copied()),
            Err(PrpError::PageUnaligned(0x90_0008))
        );
        mem.insert(0x80_0ff8, 0x90_0000);
        let segs = decode(0x1000, 0x80_0000, len, PS, |a| mem.get(&a).copied()).unwrap();
        assert_eq!(segs.len(), 514);
        assert_eq!(segs[512].iova, 700 << 12);
    }

    #[test]
    fn contiguous_and_decode() {
        let mut list = vec![0u64; 600];
        let p = build_contiguous(0x10_0200, 3 * PS, PS, &mut list, |i| {
            0x80_0000 + i as u64 * 4096
        })
        .unwrap();
        assert_eq!(p.prp1, 0x10_0200);
        assert_eq!(p.prp2, 0x80_0000);
        assert_eq!(p.list_len, 3);
        assert_eq!(&list[..3], &[0x10_1000, 0x10_2000, 0x10_3000]);
        let mem: HashMap<u64, u64> = (0..p.list_len)
            .map(|j| (0x80_0000 + 8 * j as u64, list[j]))
            .collect();
        let segs = decode(p.prp1, p.prp2, 3 * PS, PS, |a| mem.get(&a).copied()).unwrap();
        assert_eq!(segs.len(), 4);
        assert_eq!(
            segs[0],
            PrpSegment {
                iova: 0x10_0200,
                len: 0xe00
            }
        );
        assert_eq!(
            segs[3],
            PrpSegment {
                iova: 0x10_3000,
                len: 0x200
            }
        );
    }

    #[test]
    fn decode_rejects_hostile_lists() {
        // A chain pointer that points to itself: off a page, so refused
        // as an entry; a page-aligned loop moves a page of entries per hop
        // and ends with the transfer.
        let segs = decode(0x1000, 0x5ff8, 600 * PS, PS, |_| Some(0x5ff8));
        assert_eq!(segs, Err(PrpError::PageUnaligned(0x5ff8)));
        let segs = decode(0x1000, 0x5ff8, 600 * PS, PS, |_| Some(0x5000)).unwrap();
        assert_eq!(segs.len(), 600);
        assert_eq!(
            decode(0x1000, 0x5000, 3 * PS, PS, |_| None),
            Err(PrpError::MissingListEntry(0x5000))
        );
        assert_eq!(
            decode(0x1000, 0x5004, 3 * PS, PS, |_| None),
            Err(PrpError::ListUnaligned(0x5004))
        );
        assert_eq!(
            decode(0x1000, 0x2008, 2 * PS, PS, |_| None),
            Err(PrpError::PageUnaligned(0x2008))
        );
        assert_eq!(
            decode(0x1000, 0x5000, 3 * PS, PS, |_| Some(0x123)),
            Err(PrpError::PageUnaligned(0x123))
        );
        assert_eq!(
            decode(0x1001, 0, 1, PS, |_| None),
            Err(PrpError::Prp1Unaligned(0x1001))
        );
    }

    #[test]
    fn mdts() {
        assert_eq!(max_transfer(0, 4096), None);
        assert_eq!(max_transfer(5, 4096), Some(128 * 1024));
        assert_eq!(max_transfer(9, 4096), Some(2 * 1024 * 1024));
        assert_eq!(max_transfer(255, 4096), None);
        assert_eq!(max_transfer(63, 4096), None);
    }
}
