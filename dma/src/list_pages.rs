//! The per-command list pages of a queue pair: one area of whole memory
//! pages per tracker slot, where a command's PRP List, SGL segments or
//! Dataset Management ranges are written before its SQE points there.
//!
//! As for the rings (`queue_memory`), the bounds are established once, when
//! the accessor is made: the slot count, the area size and the base pointer
//! never change, so the hot path's PRP List (a run of page addresses, NVMe
//! 2.0 §4.3.1 "Physical Region Page Entry and List") is written with one
//! compare of the slot and one of the entry count, then plain volatile
//! stores. The other writers (vectors, SGL segments, ranges) go through
//! [`ListPages::write_u64_run`] and [`ListPages::write_bytes`], which check
//! the write against the slot's own area (a list never spills into the
//! neighbouring slot's, whatever its caller computed) and then use the
//! buffer's bounds-checked accessors.

use std::ptr::NonNull;

use crate::error::DmaError;
use crate::memory::{DmaBuffer, DmaPages};

/// `slots` areas of `area_bytes` each, one per tracker slot.
#[derive(Debug)]
pub struct ListPages {
    base: NonNull<u8>,
    slots: u32,
    area_bytes: usize,
    buf: DmaBuffer,
}

// SAFETY: `base` points into `buf`'s mapping, which `buf` keeps alive; it is
// only used for volatile stores inside the areas checked against `slots`
// and `area_bytes`. Not `Sync` (no `&self` access from two threads).
unsafe impl Send for ListPages {}

impl ListPages {
    /// Takes `buf` as `slots` areas of `area_bytes` (a positive multiple of
    /// the memory page, so that every area starts on a page like its IOVA).
    /// Fails when there are no slots, the buffer is smaller, or it does not
    /// start on a page.
    pub fn new(buf: DmaBuffer, slots: u32, area_bytes: usize) -> Result<ListPages, DmaError> {
        let (base, len) = buf.raw();
        let need = (slots as usize).checked_mul(area_bytes);
        if slots == 0
            || area_bytes == 0
            || !area_bytes.is_multiple_of(crate::PAGE_SIZE)
            || need.is_none_or(|n| n > len)
            || !(base.as_ptr() as usize).is_multiple_of(8)
            || !buf.iova().is_multiple_of(crate::PAGE_SIZE as u64)
        {
            return Err(DmaError::OutOfBounds {
                what: "list pages (slots x whole pages per slot, page-aligned)",
                offset: 0,
                len: need.unwrap_or(usize::MAX),
                size: len,
            });
        }
        Ok(ListPages {
            base,
            slots,
            area_bytes,
            buf,
        })
    }

    /// Bytes per slot.
    #[inline]
    pub fn area_bytes(&self) -> usize {
        self.area_bytes
    }

    /// Offset of `slot`'s area in [`ListPages::buffer`] and its IOVA (not
    /// checked: a slot past the end gives an address no write accepts;
    /// wrapping, so that it never panics).
    #[inline(always)]
    pub fn area(&self, slot: u16) -> (usize, u64) {
        let offset = usize::from(slot).wrapping_mul(self.area_bytes);
        (offset, self.buf.iova().wrapping_add(offset as u64))
    }

    /// The buffer behind the areas (for the bounds-checked writers).
    #[inline]
    pub fn buffer(&self) -> &DmaBuffer {
        &self.buf
    }

    /// Keeps the pages out of the allocator (and mapped) until the returned
    /// value is dropped (a quarantine: the controller may still read a
    /// list). There is no `&mut` access to the buffer itself: replacing it
    /// would leave the cached base pointer on pages that are no longer these.
    pub fn detach_pages(&mut self) -> DmaPages {
        self.buf.detach_pages()
    }

    /// Writes `count` little-endian 64-bit values at the start of `slot`'s
    /// area: `first`, `first + step`, `first + 2 × step`, … (a PRP List of
    /// consecutive pages). Returns false, and writes nothing, when `slot`
    /// is not a slot or the run does not fit its area.
    ///
    /// The stores are plain volatile ones: the doorbell write that
    /// announces the command orders them (as for [`crate::SqMemory::write_sqe`]).
    #[inline(always)]
    pub fn write_steps(&self, slot: u16, count: usize, first: u64, step: u64) -> bool {
        if u32::from(slot) >= self.slots || count > self.area_bytes / 8 {
            return false;
        }
        let p = self
            .base
            .as_ptr()
            .wrapping_add(usize::from(slot) * self.area_bytes)
            .cast::<u64>();
        let mut v = first;
        for i in 0..count {
            // SAFETY: `slot < slots` and `slots * area_bytes <= len` (checked
            // at creation), and `i < count <= area_bytes / 8`: the qword lies
            // inside the slot's area of the live mapping; the base is 8-byte
            // aligned and `area_bytes` a multiple of the page, so it is
            // aligned.
            unsafe { p.wrapping_add(i).write_volatile(v.to_le()) };
            v = v.wrapping_add(step);
        }
        true
    }

    /// `Ok(offset in the buffer)` when `len` bytes at `offset` lie inside
    /// `slot`'s area, else why not.
    fn in_area(&self, slot: u16, offset: usize, len: usize) -> Result<usize, DmaError> {
        match offset.checked_add(len) {
            Some(end) if u32::from(slot) < self.slots && end <= self.area_bytes => {
                Ok(usize::from(slot) * self.area_bytes + offset)
            }
            _ => Err(DmaError::OutOfBounds {
                what: "list area (one tracker slot's list pages)",
                offset,
                len,
                size: if u32::from(slot) < self.slots {
                    self.area_bytes
                } else {
                    0
                },
            }),
        }
    }

    /// Writes `count` little-endian 64-bit values at the start of `slot`'s
    /// area, the `i`-th being `value(i)` (a PRP List or SGL segments built
    /// elsewhere). Fails, and writes nothing, when `slot` is not a slot or
    /// the run does not fit inside its area.
    pub fn write_u64_run(
        &self,
        slot: u16,
        count: usize,
        value: impl FnMut(usize) -> u64,
    ) -> Result<(), DmaError> {
        let at = self.in_area(slot, 0, count.saturating_mul(8))?;
        self.buf.write_u64_run(at, count, value)
    }

    /// Copies `src` to byte `offset` of `slot`'s area (Dataset Management
    /// and Copy ranges). Fails, and writes nothing, when `slot` is not a
    /// slot or the bytes do not fit inside its area.
    pub fn write_bytes(&self, slot: u16, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        let at = self.in_area(slot, offset, src.len())?;
        self.buf.write_bytes(at, src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_mapper::buffer_at;

    #[test]
    fn a_run_lands_in_its_slot_and_nothing_else_is_touched() {
        let lists = ListPages::new(buffer_at(0x20_0000, 3 * 4096), 3, 4096).unwrap();
        assert_eq!(lists.area(2), (8192, 0x20_0000 + 8192));
        assert!(lists.write_steps(1, 15, 0x5000, 0x1000));
        let b = lists.buffer();
        for i in 0..15 {
            assert_eq!(
                b.read_u64(4096 + i * 8).unwrap(),
                0x5000 + i as u64 * 0x1000
            );
        }
        assert_eq!(b.read_u64(4096 + 15 * 8).unwrap(), 0, "one past the run");
        assert_eq!(b.read_u64(4096 - 8).unwrap(), 0, "the slot before");
        // The whole area, and not one entry more; slots past the end.
        assert!(lists.write_steps(2, 512, 7, 0));
        assert_eq!(b.read_u64(3 * 4096 - 8).unwrap(), 7);
        assert!(!lists.write_steps(0, 513, 1, 1));
        assert!(!lists.write_steps(3, 1, 1, 1));
        assert_eq!(b.read_u64(0).unwrap(), 0, "a refused run writes nothing");
    }

    #[test]
    fn the_checked_writers_stay_inside_their_slots_area() {
        let lists = ListPages::new(buffer_at(0x20_0000, 3 * 4096), 3, 4096).unwrap();
        let b = lists.buffer();
        // A whole area, and its last bytes.
        lists.write_u64_run(1, 512, |i| i as u64 + 1).unwrap();
        assert_eq!(b.read_u64(4096).unwrap(), 1);
        assert_eq!(b.read_u64(2 * 4096 - 8).unwrap(), 512);
        lists.write_bytes(0, 4096 - 16, &[0xab; 16]).unwrap();
        assert_eq!(b.read_u64(4096 - 8).unwrap(), 0xabab_abab_abab_abab);
        // Runs that fit the buffer but not the slot's area: refused, nothing
        // written into the neighbour (slot 1 still holds its values).
        assert!(lists.write_u64_run(0, 513, |_| 0xdead).is_err());
        assert!(lists.write_bytes(0, 4096 - 8, &[0xcd; 16]).is_err());
        assert!(lists.write_bytes(0, usize::MAX, &[1]).is_err());
        assert!(lists.write_u64_run(0, usize::MAX, |_| 0xdead).is_err());
        assert_eq!(b.read_u64(0).unwrap(), 0, "a refused run writes nothing");
        assert_eq!(b.read_u64(4096).unwrap(), 1, "the next slot untouched");
        assert_eq!(b.read_u64(4096 - 8).unwrap(), 0xabab_abab_abab_abab);
        // No slot 3.
        assert!(lists.write_u64_run(3, 1, |_| 1).is_err());
        assert!(lists.write_bytes(3, 0, &[1]).is_err());
    }

    #[test]
    fn the_areas_must_fit_and_be_whole_pages() {
        assert!(ListPages::new(buffer_at(0x20_0000, 8192), 3, 4096).is_err());
        assert!(ListPages::new(buffer_at(0x20_0000, 8192), 1, 2048).is_err());
        assert!(ListPages::new(buffer_at(0x20_0000, 8192), 1, 0).is_err());
        assert!(
            ListPages::new(buffer_at(0x20_0000, 8192), 0, 4096).is_err(),
            "no slots"
        );
        assert!(
            ListPages::new(buffer_at(0x20_0000, 8192), 0, usize::MAX & !0xfff).is_err(),
            "no slots, an area larger than the buffer"
        );
        assert!(ListPages::new(buffer_at(0x20_0000, 8192), 1, 8192).is_ok());
        let region = crate::memory::DmaRegion::new(
            8192,
            crate::memory::PageBacking::Small4K,
            std::sync::Arc::new(crate::test_mapper::FixedIova(0x20_0000)),
        )
        .unwrap();
        let off_page = DmaBuffer::new(region, 2048, 6144, None).unwrap();
        assert!(ListPages::new(off_page, 1, 4096).is_err(), "not on a page");
    }
}
