//! I/O virtual address allocation inside the ranges the IOMMU reports as valid
//! (VFIO_IOMMU_GET_INFO, capability VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE).
//!
//! QEMU 7.2's intel-iommu translates only 39 address bits by default, so fixed
//! high IOVAs fail there; allocating from the reported ranges works everywhere.

use std::fmt;

use crate::error::DmaError;

/// An inclusive range of valid IOVAs, as VFIO reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IovaRange {
    /// First valid IOVA.
    pub start: u64,
    /// Last valid IOVA (inclusive).
    pub end: u64,
}

impl fmt::Display for IovaRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[0x{:x}..=0x{:x}]", self.start, self.end)
    }
}

/// Hands out aligned IOVA blocks from the valid ranges; freed blocks are reused.
///
/// IOVA 0 is never handed out: a zero PRP is a classic sign of an uninitialised
/// command, and keeping it unmapped turns such a bug into a DMAR fault.
#[derive(Debug)]
pub struct IovaAllocator {
    ranges: Vec<IovaRange>,
    /// Index of the range the bump pointer is in.
    current: usize,
    /// Next free IOVA in `ranges[current]`.
    next: u64,
    /// Freed blocks (iova, len), sorted, disjoint and merged where they
    /// touch; reused first-fit.
    free: Vec<(u64, u64)>,
}

/// Lowest IOVA handed out.
const MIN_IOVA: u64 = 1 << 21;
/// IOVAs from here up are never handed out (2^63: far above any IOMMU's
/// address width, 39 to 57 bits).
const MAX_IOVA: u64 = 1 << 63;

impl IovaAllocator {
    /// An allocator over `ranges` (in any order; overlapping or adjacent
    /// ranges are merged, so no address is reachable twice). What it keeps
    /// ([`IovaAllocator::ranges`]) is what it hands out: the ranges cut to
    /// 2 MiB ..= 2^63 - 1.
    pub fn new(mut ranges: Vec<IovaRange>) -> Self {
        // Nothing at or above `MAX_IOVA`: a block's end (`iova + len`) is
        // then always representable, so freeing it and a buffer's
        // `iova + offset` arithmetic never overflow. Nothing below
        // `MIN_IOVA` either, so the ranges reported say what can be had
        // (a registration larger than any of them is refused as such).
        for r in &mut ranges {
            r.start = r.start.max(MIN_IOVA);
            r.end = r.end.min(MAX_IOVA - 1);
        }
        ranges.retain(|r| r.end >= r.start);
        ranges.sort_by_key(|r| r.start);
        let mut merged: Vec<IovaRange> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                Some(last) if r.start <= last.end.saturating_add(1) => {
                    last.end = last.end.max(r.end);
                }
                _ => merged.push(r),
            }
        }
        let next = merged.first().map_or(0, |r| r.start);
        IovaAllocator {
            ranges: merged,
            current: 0,
            next,
            free: Vec::new(),
        }
    }

    /// The ranges this allocator draws from (those it was given, cut to
    /// what it hands out, merged).
    pub fn ranges(&self) -> &[IovaRange] {
        &self.ranges
    }

    /// Allocates `size` bytes aligned to `align` (a power of two).
    pub fn alloc(&mut self, size: u64, align: u64) -> Result<u64, DmaError> {
        if size == 0 || !align.is_power_of_two() {
            return Err(DmaError::InvalidAllocation(format!(
                "IOVA block of {size} bytes aligned to {align}"
            )));
        }
        if let Some(iova) = self.take_free(size, align) {
            return Ok(iova);
        }
        while self.current < self.ranges.len() {
            let r = self.ranges[self.current];
            let start = self.next.max(r.start).max(MIN_IOVA);
            if let Some(aligned) = start.checked_add(align - 1).map(|v| v & !(align - 1))
                && let Some(last) = aligned.checked_add(size - 1)
                && last <= r.end
            {
                // The alignment gap stays usable (a later, smaller
                // allocation takes it from the free list).
                if aligned > start {
                    self.insert_free(start, aligned - start);
                }
                self.next = last.wrapping_add(1);
                if last == u64::MAX {
                    self.current += 1;
                }
                return Ok(aligned);
            }
            // Moving on to the next range: this one's tail stays usable.
            // (`r.end` < `MAX_IOVA`: no overflow.)
            self.current += 1;
            if let Some(n) = self.ranges.get(self.current) {
                self.next = n.start;
            }
            if start <= r.end {
                self.insert_free(start, r.end - start + 1);
                // The tail may have merged with a block freed earlier into
                // one that holds the request.
                if let Some(iova) = self.take_free(size, align) {
                    return Ok(iova);
                }
            }
        }
        Err(DmaError::IovaExhausted {
            size: size as usize,
            ranges: self
                .ranges
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// First fit among the freed blocks, at the first aligned address
    /// inside one; what is left before and after stays free.
    fn take_free(&mut self, size: u64, align: u64) -> Option<u64> {
        let (i, aligned, end) = self.free.iter().enumerate().find_map(|(i, &(iova, len))| {
            let aligned = iova.checked_add(align - 1)? & !(align - 1);
            let end = iova + len; // freed blocks never wrap (see `free`)
            (aligned.checked_add(size)? <= end).then_some((i, aligned, end))
        })?;
        let iova = self.free[i].0;
        let after = (aligned + size, end - (aligned + size));
        match (aligned > iova, after.1 > 0) {
            (true, true) => {
                self.free[i].1 = aligned - iova;
                self.free.insert(i + 1, after);
            }
            (true, false) => self.free[i].1 = aligned - iova,
            (false, true) => self.free[i] = after,
            (false, false) => {
                self.free.remove(i);
            }
        }
        Some(aligned)
    }

    /// Returns a block to the allocator; it merges with the free blocks it
    /// touches, so blocks freed one by one serve a larger allocation again.
    /// A block of 0 bytes, one that wraps around the address space, one
    /// that overlaps a block already free (a double free), or one that
    /// reaches outside the space handed out so far (never allocated: kept,
    /// it would be handed out twice) is ignored.
    pub fn free(&mut self, iova: u64, size: u64) {
        if self.handed_out(iova, size) {
            self.insert_free(iova, size);
        }
    }

    /// Whether `iova..iova + size` lies inside one range, in the part of
    /// it the bump pointer has passed (every block outside that part is
    /// still to be handed out, not free to be given back).
    fn handed_out(&self, iova: u64, size: u64) -> bool {
        let Some(last) = size.checked_sub(1).and_then(|s| iova.checked_add(s)) else {
            return false;
        };
        let k = self.ranges.partition_point(|r| r.end < iova);
        let Some(r) = self.ranges.get(k) else {
            return false;
        };
        r.start <= iova && last <= r.end && (k < self.current || last < self.next)
    }

    /// Puts a block on the free list, merged with its neighbours; a block
    /// of 0 bytes, one that wraps, or one that overlaps a free block is
    /// ignored.
    fn insert_free(&mut self, iova: u64, size: u64) {
        let Some(end) = iova.checked_add(size).filter(|_| size != 0) else {
            return;
        };
        let i = self.free.partition_point(|&(o, _)| o < iova);
        let prev_end = i.checked_sub(1).map(|p| self.free[p].0 + self.free[p].1);
        if prev_end.is_some_and(|e| e > iova) || self.free.get(i).is_some_and(|n| n.0 < end) {
            return;
        }
        let joins_prev = prev_end == Some(iova);
        let joins_next = self.free.get(i).is_some_and(|n| n.0 == end);
        match (joins_prev, joins_next) {
            (true, true) => {
                self.free[i - 1].1 += size + self.free[i].1;
                self.free.remove(i);
            }
            (true, false) => self.free[i - 1].1 += size,
            (false, true) => self.free[i] = (iova, size + self.free[i].1),
            (false, false) => self.free.insert(i, (iova, size)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_gaps_and_range_tails_are_used_later() {
        let ranges = vec![
            IovaRange {
                start: MIN_IOVA,
                end: (7 << 20) - 1,
            },
            IovaRange {
                start: 1 << 30,
                end: (1 << 31) - 1,
            },
        ];
        let mut a = IovaAllocator::new(ranges);
        // 4 KiB at 2 MiB, then 2 MiB aligned to 2 MiB at 4 MiB: the gap
        // 2 MiB + 4 KiB .. 4 MiB is free.
        assert_eq!(a.alloc(4096, 4096).unwrap(), MIN_IOVA);
        assert_eq!(a.alloc(2 << 20, 2 << 20).unwrap(), 4 << 20);
        assert_eq!(a.alloc(4096, 4096).unwrap(), MIN_IOVA + 4096);
        // 2 MiB more does not fit in the first range's last 1 MiB (6..7
        // MiB, nor in the gap): it comes from the second range, and the
        // first range's tail is free.
        assert_eq!(a.alloc(2 << 20, 2 << 20).unwrap(), 1 << 30);
        assert_eq!(a.alloc(1 << 20, 1 << 20).unwrap(), 3 << 20, "the gap");
        assert_eq!(a.alloc(1 << 20, 1 << 20).unwrap(), 6 << 20, "the tail");
        assert_eq!(a.alloc(4096, 4096).unwrap(), MIN_IOVA + 8192, "the gap");
        // What is left of the first range: 2 MiB + 12 KiB .. 3 MiB.
        assert_eq!(a.alloc((1 << 20) - 12288, 4096).unwrap(), MIN_IOVA + 12288);
        assert_eq!(a.alloc(4096, 4096).unwrap(), (1 << 30) + (2 << 20));
    }

    /// A range tail pushed by a failing bump merges with a block freed
    /// earlier into one that holds the request: the same call takes it (the
    /// free list is searched again).
    #[test]
    fn a_tail_merged_with_a_freed_block_serves_the_allocation() {
        let mut a = IovaAllocator::new(vec![IovaRange {
            start: MIN_IOVA,
            end: (8 << 20) - 1,
        }]);
        let x = a.alloc(4 << 20, 4096).unwrap();
        assert_eq!(x, MIN_IOVA);
        a.free(x, 4 << 20);
        // 2..6 MiB free (freed), 6..8 MiB never handed out: 6 MiB free,
        // contiguous.
        let first = a.alloc(6 << 20, 4096);
        assert_eq!(first.ok(), Some(MIN_IOVA), "the space is there");
    }

    #[test]
    fn stays_inside_reported_ranges() {
        // QEMU 7.2 intel-iommu: 39-bit address width, minus the MSI window.
        let ranges = vec![
            IovaRange {
                start: 0,
                end: 0xfedf_ffff,
            },
            IovaRange {
                start: 0xfef0_0000,
                end: (1 << 39) - 1,
            },
        ];
        let mut a = IovaAllocator::new(ranges.clone());
        let mut got = Vec::new();
        for _ in 0..3000 {
            let iova = a.alloc(2 << 20, 2 << 20).unwrap();
            assert!(iova >= MIN_IOVA);
            assert_eq!(iova % (2 << 20), 0);
            let end = iova + (2 << 20) - 1;
            assert!(
                ranges.iter().any(|r| iova >= r.start && end <= r.end),
                "{iova:x}"
            );
            got.push(iova);
        }
        let mut sorted = got.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), got.len(), "no block handed out twice");
    }

    #[test]
    fn exhaustion_is_an_error_and_free_blocks_are_reused() {
        let mut a = IovaAllocator::new(vec![IovaRange {
            start: 0x20_0000,
            end: 0x5f_ffff,
        }]);
        let x = a.alloc(0x20_0000, 0x20_0000).unwrap();
        let y = a.alloc(0x20_0000, 0x20_0000).unwrap();
        assert_ne!(x, y);
        let e = a.alloc(0x20_0000, 0x20_0000).unwrap_err();
        assert!(e.to_string().contains("no free IOVA space"), "{e}");
        a.free(x, 0x20_0000);
        assert_eq!(a.alloc(0x1000, 0x1000).unwrap(), x);
        assert_eq!(a.alloc(0x1000, 0x1000).unwrap(), x + 0x1000);
        assert!(a.alloc(0, 4096).is_err());
    }

    #[test]
    fn range_ending_at_top_of_address_space() {
        // A range reaching 2^64 - 1 is cut below 2^63: a block ending at
        // 2^64 could not be freed (its end overflows), and is not handed out.
        let mut a = IovaAllocator::new(vec![IovaRange {
            start: u64::MAX - 0x3f_ffff,
            end: u64::MAX,
        }]);
        assert!(a.ranges().is_empty());
        assert!(a.alloc(0x20_0000, 0x20_0000).is_err());
        let top = MAX_IOVA - 0x40_0000;
        let mut a = IovaAllocator::new(vec![IovaRange {
            start: top,
            end: u64::MAX,
        }]);
        let x = a.alloc(0x20_0000, 0x20_0000).unwrap();
        let y = a.alloc(0x20_0000, 0x20_0000).unwrap();
        assert_eq!(y + 0x20_0000, MAX_IOVA, "the last block ends at 2^63");
        assert!(a.alloc(0x20_0000, 0x20_0000).is_err());
        // Freed, the top block is handed out again.
        a.free(y, 0x20_0000);
        assert_eq!(a.alloc(0x20_0000, 0x20_0000).unwrap(), y);
        assert_ne!(x, y);
    }

    #[test]
    fn overlapping_ranges_never_hand_out_an_address_twice() {
        let mut a = IovaAllocator::new(vec![
            IovaRange {
                start: 0x20_0000,
                end: 0x7f_ffff,
            },
            IovaRange {
                start: 0x40_0000,
                end: 0x9f_ffff,
            },
        ]);
        assert_eq!(a.ranges().len(), 1);
        let got: Vec<u64> = (0..4)
            .map(|_| a.alloc(0x20_0000, 0x20_0000).unwrap())
            .collect();
        let mut sorted = got.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 4, "{got:x?}");
        assert!(a.alloc(0x20_0000, 0x20_0000).is_err());
    }

    /// A free of space never handed out (beyond the bump pointer, in a
    /// range not reached yet, outside every range, straddling a range's
    /// end) is ignored: kept, that space would be handed out twice, once
    /// from the free list and once by the bump pointer.
    #[test]
    fn a_free_of_space_never_handed_out_is_ignored() {
        let ranges = vec![
            IovaRange {
                start: 0,
                end: (8 << 20) - 1,
            },
            IovaRange {
                start: 1 << 30,
                end: (1 << 30) + (8 << 20) - 1,
            },
        ];
        let mut a = IovaAllocator::new(ranges);
        // The part below 2 MiB is never handed out, and not reported.
        assert_eq!(a.ranges()[0].start, MIN_IOVA);
        let x = a.alloc(0x20_0000, 0x1000).unwrap();
        assert_eq!(x, MIN_IOVA);
        a.free(x + 0x20_0000, 0x1000); // above the bump pointer
        a.free(1 << 30, 0x1000); // a range not reached yet
        a.free(0x1000, 0x1000); // below 2 MiB
        a.free(1 << 29, 0x1000); // between the ranges
        a.free((8 << 20) - 0x1000, 0x2000); // past a range's end
        a.free(x, 0); // nothing
        a.free(u64::MAX - 0xfff, 0x1000); // beyond every range
        // Every later block is distinct: nothing was handed out twice.
        let mut got = vec![x];
        while let Ok(iova) = a.alloc(0x1000, 0x1000) {
            got.push(iova);
        }
        let n = got.len();
        got.sort_unstable();
        got.dedup();
        assert_eq!(got.len(), n, "an IOVA handed out twice");
        // 6 MiB of the first range and 8 MiB of the second: 4 KiB blocks,
        // after the first 2 MiB block.
        assert_eq!(n, 1 + ((6 << 20) - 0x20_0000 + (8 << 20)) / 0x1000);
        // A block really handed out (in a range already left behind) still
        // comes back.
        a.free(x, 0x20_0000);
        assert_eq!(a.alloc(0x20_0000, 0x20_0000).unwrap(), x);
    }

    #[test]
    fn freed_neighbours_merge_and_double_frees_are_ignored() {
        let mut a = IovaAllocator::new(vec![IovaRange {
            start: 0x20_0000,
            end: 0x5f_ffff,
        }]);
        let x = a.alloc(0x20_0000, 0x20_0000).unwrap();
        let y = a.alloc(0x20_0000, 0x20_0000).unwrap();
        assert_eq!(y, x + 0x20_0000);
        a.free(y, 0x20_0000);
        a.free(x, 0x20_0000);
        a.free(x, 0x1000); // already free: ignored
        // The two halves serve one 4 MiB block again, and nothing else fits.
        assert_eq!(a.alloc(0x40_0000, 0x20_0000).unwrap(), x);
        assert!(a.alloc(0x1000, 0x1000).is_err());
        a.free(x, 0x40_0000);
        // An aligned block inside a free one that starts unaligned.
        assert_eq!(a.alloc(0x1000, 0x1000).unwrap(), x);
        assert_eq!(a.alloc(0x20_0000, 0x20_0000).unwrap(), x + 0x20_0000);
        assert_eq!(a.alloc(0x1000, 0x1000).unwrap(), x + 0x1000);
    }
}
