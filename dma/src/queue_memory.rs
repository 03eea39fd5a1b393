//! Accessors for the memory of one submission or completion queue: the
//! hot path's only view of its rings.
//!
//! A queue is a [`DmaBuffer`] of `entries` fixed-size slots (64-byte SQEs,
//! 16-byte CQEs; NVMe 2.0 §4.1, CC.IOSQES = 6 and CC.IOCQES = 4). The bounds
//! are established once, when the accessor is made: the entry count and the
//! base pointer never change, so an access is one compare of the slot index
//! with the entry count (no length arithmetic, no `Result` with an error to
//! build), and the SQE is written straight into its slot with eight 64-bit
//! volatile stores. No plain reference into the ring is ever formed (the
//! CQE's dword 3 is read through a one-access `&AtomicU32`).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::DmaError;
use crate::memory::{DmaBuffer, DmaPages};

/// Bytes per submission queue entry (CC.IOSQES = 6).
pub const SQE_BYTES: usize = 64;
/// Bytes per completion queue entry (CC.IOCQES = 4).
pub const CQE_BYTES: usize = 16;

fn check(buf: &DmaBuffer, entries: u32, entry_bytes: usize) -> Result<NonNull<u8>, DmaError> {
    let (base, len) = buf.raw();
    let need = (entries as usize).checked_mul(entry_bytes);
    // The controller takes a queue's base from its IOVA (PRP1 of Create I/O
    // SQ/CQ, ASQ/ACQ), which must be page-aligned (offset 0, CC.MPS =
    // 4 KiB): a queue carved at an offset inside a page would be placed at
    // the page's start by the device, over whatever lies before it.
    if entries == 0
        || need.is_none_or(|n| n > len)
        || !(base.as_ptr() as usize).is_multiple_of(entry_bytes)
        || !buf.iova().is_multiple_of(crate::PAGE_SIZE as u64)
    {
        return Err(DmaError::OutOfBounds {
            what: "queue memory (entries x entry size, page-aligned)",
            offset: 0,
            len: need.unwrap_or(usize::MAX),
            size: len,
        });
    }
    Ok(base)
}

/// The memory of one submission queue: `entries` 64-byte slots.
#[derive(Debug)]
pub struct SqMemory {
    base: NonNull<u8>,
    entries: u32,
    buf: DmaBuffer,
}

// SAFETY: `base` points into `buf`'s mapping, which `buf` keeps alive; it is
// only used for volatile stores and loads inside the slots checked against
// `entries`. The type is not `Sync` (no `&self` access from two threads).
unsafe impl Send for SqMemory {}

impl SqMemory {
    /// Takes `buf` as the memory of a queue of `entries` SQEs. Fails if the
    /// buffer is too small or does not start on a page (its IOVA).
    pub fn new(buf: DmaBuffer, entries: u32) -> Result<SqMemory, DmaError> {
        let base = check(&buf, entries, SQE_BYTES)?;
        Ok(SqMemory { base, entries, buf })
    }

    /// Number of slots.
    #[inline]
    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// The buffer behind the queue (its IOVA goes into Create I/O SQ).
    #[inline]
    pub fn buffer(&self) -> &DmaBuffer {
        &self.buf
    }

    /// Keeps the queue's pages out of the allocator (and mapped) until the
    /// returned value is dropped, even after this accessor is gone: the
    /// quarantine of a queue the controller may still use (see
    /// [`DmaBuffer::detach_pages`]). There is no `&mut` access to the
    /// buffer itself: replacing it would leave the cached base pointer on
    /// pages that are no longer the queue's.
    pub fn detach_pages(&mut self) -> DmaPages {
        self.buf.detach_pages()
    }

    /// The first byte of SQE slot `index`, or `None` when `index` is not a
    /// slot. The slot's 64 bytes then lie inside the live mapping
    /// (`entries * 64 <= len`, checked at creation) and start 64-byte
    /// aligned (the base is).
    #[inline(always)]
    fn slot(&self, index: u32) -> Option<*mut u8> {
        (index < self.entries).then(|| self.base.as_ptr().wrapping_add(index as usize * SQE_BYTES))
    }

    /// Writes one SQE into slot `index` with eight 64-bit volatile stores:
    /// `q[i]` holds command dwords `2i` (low half) and `2i + 1` (high half),
    /// as `Sqe::to_qwords` lays them out. Returns false (and writes nothing)
    /// when `index` is not a slot of this queue.
    ///
    /// The stores are plain (not release): the doorbell write that announces
    /// the entry orders them (`Device::write32`, or the release store and
    /// fence of a shadow doorbell update).
    #[inline(always)]
    pub fn write_sqe(&self, index: u32, q: &[u64; 8]) -> bool {
        let Some(p) = self.slot(index) else {
            return false;
        };
        let p = p.cast::<u64>();
        for (i, v) in q.iter().enumerate() {
            let qw = p.wrapping_add(i);
            // SAFETY: `index < entries` and `entries * 64 <= len` (checked at
            // creation), so the eight qwords of the slot lie inside the live
            // mapping; the base is 64-byte aligned, so each qword is aligned.
            unsafe { qw.write_volatile(v.to_le()) };
        }
        true
    }

    /// Command Dword 0 of the SQE in slot `index` as last written by
    /// [`SqMemory::write_sqe`] (one volatile load; the controller only reads
    /// submission queue memory), or `None` when `index` is not a slot. For
    /// the reap's check that a completion does not name a command queued
    /// but not yet announced (which command a slot holds).
    #[inline]
    pub fn read_cdw0(&self, index: u32) -> Option<u32> {
        let p = self.slot(index)?.cast::<u32>();
        // SAFETY: `index < entries` and `entries * 64 <= len` (checked at
        // creation): the slot's first dword lies inside the live mapping,
        // and the base is 64-byte aligned. Volatile: device-visible memory,
        // no reference formed.
        Some(u32::from_le(unsafe { p.read_volatile() }))
    }
}

/// One CQE slot of a [`CqMemory`], checked once by [`CqMemory::load_dw3`]:
/// reading its dwords needs no further bounds check. Borrows the queue, so
/// it cannot outlive the mapping.
#[derive(Debug)]
pub struct CqSlot<'a> {
    /// Dword 0 of the slot (inside the mapping, 16-byte aligned).
    p: *mut u32,
    _queue: std::marker::PhantomData<&'a CqMemory>,
}

impl CqSlot<'_> {
    /// Dword 0 (command specific result).
    #[inline(always)]
    pub fn dw0(&self) -> u32 {
        // SAFETY: `p` is dword 0 of a slot inside the live mapping (checked
        // when the slot was made; the borrow keeps the queue alive).
        u32::from_le(unsafe { self.p.read_volatile() })
    }

    /// Dword 2 (SQ Identifier, SQ Head Pointer).
    #[inline(always)]
    pub fn dw2(&self) -> u32 {
        // SAFETY: as in `dw0`; dword 2 of the same 16-byte slot.
        u32::from_le(unsafe { self.p.wrapping_add(2).read_volatile() })
    }
}

/// The memory of one completion queue: `entries` 16-byte slots.
#[derive(Debug)]
pub struct CqMemory {
    base: NonNull<u8>,
    entries: u32,
    buf: DmaBuffer,
}

// SAFETY: as for `SqMemory`: `base` points into `buf`'s live mapping and is
// only used for atomic or volatile loads, and (`zero`) atomic stores, inside
// checked slots. Not `Sync`.
unsafe impl Send for CqMemory {}

impl CqMemory {
    /// Takes `buf` as the memory of a queue of `entries` CQEs. Fails if the
    /// buffer is too small or does not start on a page (its IOVA).
    pub fn new(buf: DmaBuffer, entries: u32) -> Result<CqMemory, DmaError> {
        let base = check(&buf, entries, CQE_BYTES)?;
        Ok(CqMemory { base, entries, buf })
    }

    /// Number of slots.
    #[inline]
    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// The buffer behind the queue.
    #[inline]
    pub fn buffer(&self) -> &DmaBuffer {
        &self.buf
    }

    /// Keeps the queue's pages out of the allocator (and mapped) until the
    /// returned value is dropped, even after this accessor is gone: the
    /// quarantine of a queue the controller may still use (see
    /// [`DmaBuffer::detach_pages`]). There is no `&mut` access to the
    /// buffer itself: replacing it would leave the cached base pointer on
    /// pages that are no longer the queue's.
    pub fn detach_pages(&mut self) -> DmaPages {
        self.buf.detach_pages()
    }

    #[inline(always)]
    fn dword(&self, index: u32, dw: usize) -> Option<*mut u32> {
        if index >= self.entries {
            return None;
        }
        Some(
            self.base
                .as_ptr()
                .wrapping_add(index as usize * CQE_BYTES + (dw & 3) * 4)
                .cast::<u32>(),
        )
    }

    /// Dword 3 of the CQE in slot `index` (status, phase tag, CID), loaded
    /// with acquire ordering, and the slot, through which the other dwords
    /// are read without a second check: they are at least as new as dword 3.
    /// `None` when `index` is not a slot of this queue.
    #[inline(always)]
    pub fn load_dw3(&self, index: u32) -> Option<(u32, CqSlot<'_>)> {
        let p = self.dword(index, 0)?;
        // SAFETY: the slot is inside the mapping (checked against `entries`,
        // which fits it) and 16-byte aligned, so its dword 3 is in bounds and
        // 4-byte aligned; the `&AtomicU32` exists only for this one load, an
        // atomic view of memory the device writes.
        let v = unsafe { AtomicU32::from_ptr(p.wrapping_add(3)) }.load(Ordering::Acquire);
        crate::barrier::dma_rmb();
        Some((
            u32::from_le(v),
            CqSlot {
                p,
                _queue: std::marker::PhantomData,
            },
        ))
    }

    /// Dword `dw` (0..=3) of the CQE in slot `index`, a volatile load.
    /// `None` when `index` is not a slot of this queue.
    #[inline]
    pub fn read_dw(&self, index: u32, dw: usize) -> Option<u32> {
        let p = self.dword(index, dw)?;
        // SAFETY: inside the slot (checked), 4-byte aligned, live mapping.
        Some(u32::from_le(unsafe { p.read_volatile() }))
    }

    /// Zeroes every entry (after a reset: stale entries would look new to
    /// a restarted phase). Atomic stores, so a device that still wrote would
    /// race on values, not on Rust's memory model.
    pub fn zero(&self) {
        for i in 0..self.entries {
            for dw in 0..4 {
                if let Some(p) = self.dword(i, dw) {
                    // SAFETY: inside the slot (checked), aligned, atomic store.
                    unsafe { AtomicU32::from_ptr(p) }.store(0, Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_mapper::buffer_at;

    fn buffer(len: usize) -> DmaBuffer {
        buffer_at(0x10_0000, len)
    }

    #[test]
    fn sqe_lands_in_its_slot_and_out_of_range_is_refused() {
        let sq = SqMemory::new(buffer(4096), 4).unwrap();
        let mut q = [0u64; 8];
        for (i, d) in q.iter_mut().enumerate() {
            *d = 0x1000_0000_2000_0000 + i as u64;
        }
        assert!(sq.write_sqe(3, &q));
        assert!(!sq.write_sqe(4, &q));
        for (i, v) in q.iter().enumerate() {
            assert_eq!(sq.buffer().read_u32(3 * 64 + i * 8).unwrap(), *v as u32);
            assert_eq!(
                sq.buffer().read_u32(3 * 64 + i * 8 + 4).unwrap(),
                (*v >> 32) as u32
            );
            assert_eq!(sq.buffer().read_u64(2 * 64 + i * 8).unwrap(), 0);
        }
        assert!(SqMemory::new(buffer(4096), 65).is_err());
    }

    #[test]
    fn a_queue_must_start_on_a_page() {
        // A 64-byte-aligned piece inside a page: the controller would place
        // the queue at the page's start, over the piece before it.
        let pieces = buffer(8192).split(64).unwrap();
        assert!(SqMemory::new(pieces.into_iter().nth(1).unwrap(), 1).is_err());
        let pieces = buffer(8192).split(16).unwrap();
        assert!(CqMemory::new(pieces.into_iter().nth(1).unwrap(), 1).is_err());
        let pieces = buffer(8192).split(4096).unwrap();
        for p in pieces {
            assert!(SqMemory::new(p, 64).is_ok(), "page-aligned pieces are fine");
        }
    }

    #[test]
    fn cqe_dwords() {
        let cq = CqMemory::new(buffer(4096), 8).unwrap();
        cq.buffer().write_u32(5 * 16 + 12, 0xdead_0001).unwrap();
        cq.buffer().write_u32(5 * 16, 7).unwrap();
        cq.buffer().write_u32(5 * 16 + 8, 0x0001_0002).unwrap();
        let (dw3, slot) = cq.load_dw3(5).unwrap();
        assert_eq!(dw3, 0xdead_0001);
        assert_eq!((slot.dw0(), slot.dw2()), (7, 0x0001_0002));
        assert_eq!(cq.read_dw(5, 0), Some(7));
        assert!(cq.load_dw3(8).is_none());
        cq.zero();
        assert_eq!(cq.load_dw3(5).map(|(d, _)| d), Some(0));
        assert!(CqMemory::new(buffer(4096), 257).is_err());
    }
}
