//! [`SharedWords`]: DMA memory that several threads use at the same time,
//! through atomic 32-bit accesses only — the Doorbell Buffer Config shadow
//! doorbell and EventIdx buffers, where each queue pair (on its own thread)
//! stores its own doorbell words and reads its EventIdx, and a controller
//! reset zeroes them all.
//!
//! A [`DmaBuffer`] is `!Sync` because its copies and volatile accesses are
//! not atomic; this wrapper is `Sync` because it has no such accessor: two
//! threads touching the same word get one value or the other, never a data
//! race.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::DmaError;
use crate::memory::DmaBuffer;

/// A DMA buffer shared between threads through atomic word accesses only.
#[derive(Debug)]
pub struct SharedWords {
    buf: DmaBuffer,
}

// SAFETY: every method that reaches the memory is a single atomic access
// (`AtomicU32::from_ptr` on an in-bounds, aligned word), so concurrent calls
// from several threads cannot race; the buffer's non-atomic accessors are
// not reachable through this type.
unsafe impl Sync for SharedWords {}

impl SharedWords {
    /// Wraps `buf` (its length is used in whole 32-bit words).
    pub fn new(buf: DmaBuffer) -> SharedWords {
        SharedWords { buf }
    }

    /// IOVA of the first byte.
    pub fn iova(&self) -> u64 {
        self.buf.iova()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Always false: buffers are never empty.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Acquire load of the little-endian word at `offset` (4-byte aligned).
    #[inline]
    pub fn load_acquire_u32(&self, offset: usize) -> Result<u32, DmaError> {
        self.buf.load_acquire_u32(offset)
    }

    /// Relaxed load of the little-endian word at `offset` (an error when
    /// the word is not inside the buffer or not 4-byte aligned in memory).
    #[inline]
    pub fn load_u32(&self, offset: usize) -> Result<u32, DmaError> {
        let p = self.word(offset)?;
        // SAFETY: in bounds and aligned (checked by `word`); the `&AtomicU32`
        // lives for this one load.
        let v = unsafe { AtomicU32::from_ptr(p) }.load(Ordering::Relaxed);
        Ok(u32::from_le(v))
    }

    /// Release store of the little-endian word at `offset`.
    #[inline]
    pub fn store_release_u32(&self, offset: usize, value: u32) -> Result<(), DmaError> {
        self.buf.store_release_u32(offset, value)
    }

    /// Sets every word to 0, one atomic store each (release: a device that
    /// reads a zero also sees what was written before).
    pub fn zero(&self) -> Result<(), DmaError> {
        for off in (0..self.buf.len() / 4).map(|w| w * 4) {
            self.buf.store_release_u32(off, 0)?;
        }
        Ok(())
    }

    /// The word at `offset`, checked once: inside the buffer and 4-byte
    /// aligned in memory (the address, not just the offset: a buffer split
    /// at an odd length starts off a word boundary).
    #[inline]
    fn word(&self, offset: usize) -> Result<*mut u32, DmaError> {
        if let Some(end) = offset.checked_add(4)
            && end <= self.buf.len()
        {
            // Inside the buffer (checked), so inside its live mapping.
            let p = self.buf.as_ptr().wrapping_add(offset);
            if (p as usize).is_multiple_of(4) {
                return Ok(p.cast::<u32>());
            }
        }
        Err(DmaError::OutOfBounds {
            what: "shared DMA words (inside the buffer, 4-byte aligned in memory)",
            offset,
            len: 4,
            size: self.buf.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::DmaAllocator;
    use crate::memory::PageBacking;
    use crate::test_mapper::FixedIova;
    use std::sync::Arc;

    #[test]
    fn words_must_be_aligned_in_memory_not_just_by_offset() {
        let a = DmaAllocator::new(Arc::new(FixedIova(0x10_0000)), PageBacking::Small4K);
        let mut pieces = a.alloc(8192).unwrap().split(4097).unwrap();
        let odd = SharedWords::new(pieces.pop().unwrap());
        assert_eq!(odd.iova() % 4, 1);
        // Offset 0 is a multiple of 4 but its address is not: refused.
        assert!(odd.load_u32(0).is_err());
        assert!(odd.store_release_u32(0, 1).is_err());
        assert!(odd.load_acquire_u32(0).is_err());
        // Offset 3 is the first word-aligned address.
        odd.store_release_u32(3, 0xa5a5_0001).unwrap();
        assert_eq!(odd.load_u32(3).unwrap(), 0xa5a5_0001);
        assert!(odd.load_u32(odd.len() - 3).is_err(), "past the end");
        let even = SharedWords::new(pieces.pop().unwrap());
        even.store_release_u32(4, 9).unwrap();
        assert_eq!(even.load_u32(4).unwrap(), 9);
        assert!(even.load_u32(2).is_err());
    }
}
