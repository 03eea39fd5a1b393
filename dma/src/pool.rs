//! [`DmaPool`]: a per-thread pool of fixed-size DMA buffers with O(1) get
//! and put, no lock and no allocation after it is made.
//!
//! The pool carves one buffer (the slab, from the allocator) into `count`
//! buffers of `len` bytes, each starting on a 4 KiB page, so a buffer of up
//! to 8 KiB needs no PRP list. Handing a buffer out moves it out of the
//! pool; a command that uses it owns it (it moved into the command), so it
//! cannot be put back while the device may still touch it — that is the
//! type system's doing, not a runtime check:
//!
//! ```compile_fail,E0382
//! # fn f(pool: &mut upnvme_dma::DmaPool, keep: &mut Vec<upnvme_dma::DmaBuffer>) {
//! let buf = pool.get().unwrap();
//! keep.push(buf);          // e.g. moved into a submitted command
//! let _ = pool.put(buf);   // error[E0382]: use of moved value
//! # }
//! ```
//!
//! Buffers are not zeroed when they come back: a buffer from [`DmaPool::get`]
//! holds whatever its last user (or the device) left in it. A new pool's
//! buffers hold what its slab held: zeros for `Controller::dma_pool` (whose
//! slab comes zeroed from the allocator), the application's bytes for a
//! pool over registered memory. A pool buffer that is dropped instead of put back
//! is gone from the pool (its pages return to the allocator with the slab,
//! once the pool and all its buffers are gone).

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::PAGE_SIZE;
use crate::error::DmaError;
use crate::memory::DmaBuffer;

/// A pool of `count` DMA buffers of `len` bytes each. `Send`, not `Sync`:
/// one thread gets and puts, like the queue pair it feeds.
pub struct DmaPool {
    free: Vec<DmaBuffer>,
    id: u64,
    len: usize,
    count: usize,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for DmaPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaPool")
            .field("buffer_len", &self.len)
            .field("count", &self.count)
            .field("available", &self.free.len())
            .finish()
    }
}

/// Why [`DmaPool::put`] refused a buffer (it comes back in the error).
#[derive(Debug)]
pub struct NotFromThisPool(pub DmaBuffer);

impl std::fmt::Display for NotFromThisPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the DMA buffer at IOVA {:#x} was not handed out by this pool",
            self.0.iova()
        )
    }
}

impl std::error::Error for NotFromThisPool {}

impl DmaPool {
    /// The pool's buffer stride for buffers of `len` bytes: whole 4 KiB pages.
    pub fn stride(len: usize) -> Option<usize> {
        len.checked_next_multiple_of(PAGE_SIZE)
    }

    /// The slab a pool of `count` buffers of `len` bytes needs:
    /// `count` × [`DmaPool::stride`]`(len)` bytes (each buffer starts on a
    /// 4 KiB page). An error that says what to change when there can be no
    /// such pool (no buffers, buffers of 0 bytes, or more bytes than the
    /// address space holds).
    pub fn slab_len(len: usize, count: usize) -> Result<usize, DmaError> {
        if len == 0 {
            return Err(DmaError::InvalidAllocation(format!(
                "a pool of {count} buffers of 0 bytes: ask for buffers of at least 1 byte"
            )));
        }
        if count == 0 {
            return Err(DmaError::InvalidAllocation(format!(
                "a pool of 0 buffers of {len} bytes: ask for at least one buffer"
            )));
        }
        Self::stride(len)
            .and_then(|s| s.checked_mul(count))
            .ok_or_else(|| {
                DmaError::InvalidAllocation(format!(
                    "a pool of {count} buffers of {len} bytes (each on its own whole 4 KiB pages) \
                     needs more bytes than the address space holds: ask for fewer or smaller \
                     buffers"
                ))
            })
    }

    /// Carves `slab` (at least [`DmaPool::slab_len`]`(len, count)` bytes,
    /// starting on a 4 KiB page) into `count` buffers of `len` bytes.
    pub fn new(slab: DmaBuffer, len: usize, count: usize) -> Result<DmaPool, DmaError> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let need = Self::slab_len(len, count)?;
        let stride = need / count;
        if !slab.iova().is_multiple_of(PAGE_SIZE as u64) {
            return Err(DmaError::InvalidAllocation(format!(
                "a pool's slab must start on a 4 KiB page; this one starts at IOVA {:#x} \
                 (allocate it with `alloc_dma`, or split it at a page multiple)",
                slab.iova()
            )));
        }
        if need > slab.len() {
            return Err(DmaError::InvalidAllocation(format!(
                "a pool of {count} buffers of {len} bytes needs a slab of {need} bytes \
                 ({count} × {stride}: each buffer starts on a 4 KiB page); this one has {}: \
                 carve a slab of at least {need} bytes, or ask for fewer buffers",
                slab.len()
            )));
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let slab = Arc::new(slab.into_pages());
        let mut free = Vec::with_capacity(count);
        // Pushed in reverse so that `get` hands out the lowest IOVA first.
        for i in (0..count).rev() {
            free.push(DmaBuffer::carve(&slab, i * stride, len, id)?);
        }
        Ok(DmaPool {
            free,
            id,
            len,
            count,
            _not_sync: PhantomData,
        })
    }

    /// A buffer, or `None` when all are handed out. O(1), no lock, no
    /// allocation, no zeroing.
    #[inline]
    pub fn get(&mut self) -> Option<DmaBuffer> {
        self.free.pop()
    }

    /// Puts a buffer this pool handed out back. O(1), never allocates (the
    /// pool's capacity is its count). A buffer from elsewhere is refused and
    /// handed back.
    #[inline]
    pub fn put(&mut self, buf: DmaBuffer) -> Result<(), NotFromThisPool> {
        if buf.pool_id() != self.id || self.free.len() >= self.count {
            return Err(NotFromThisPool(buf));
        }
        self.free.push(buf);
        Ok(())
    }

    /// Buffers in the pool now.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Buffers the pool was made with.
    pub fn capacity(&self) -> usize {
        self.count
    }

    /// Bytes per buffer.
    pub fn buffer_len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_mapper::buffer_at;

    fn slab(len: usize) -> DmaBuffer {
        buffer_at(0x20_0000, len)
    }

    #[test]
    fn get_put_exhaustion_and_foreign_buffers() {
        let mut p = DmaPool::new(slab(4 * 8192), 5000, 4).unwrap();
        assert_eq!(p.available(), 4);
        let bufs: Vec<_> = (0..4).map(|_| p.get().unwrap()).collect();
        assert!(p.get().is_none(), "exhausted");
        assert_eq!(bufs[0].iova(), 0x20_0000);
        assert_eq!(bufs[1].iova(), 0x20_0000 + 8192, "page-aligned stride");
        assert!(bufs.iter().all(|b| b.len() == 5000));
        for b in bufs {
            p.put(b).unwrap();
        }
        let mut other = DmaPool::new(slab(4096), 4096, 1).unwrap();
        let b = other.get().unwrap();
        let back = p.put(b).unwrap_err();
        other.put(back.0).unwrap();
        assert!(p.put(slab(4096)).is_err(), "a buffer from no pool");
        assert!(DmaPool::new(slab(4096), 4096, 2).is_err(), "slab too small");
        assert!(DmaPool::new(slab(4096), 0, 1).is_err());
    }

    /// Each impossible pool is refused with what to change, not only the
    /// numbers asked for.
    #[test]
    fn impossible_pools_say_what_to_change() {
        let cases: [(usize, usize, usize, &str); 5] = [
            (0, 4, 4096, "ask for buffers of at least 1 byte"),
            (4096, 0, 4096, "ask for at least one buffer"),
            (usize::MAX, 1, 4096, "ask for fewer or smaller buffers"),
            (4096, usize::MAX, 4096, "ask for fewer or smaller buffers"),
            (5000, 2, 8192, "needs a slab of 16384 bytes (2 × 8192"),
        ];
        for (len, count, slab_len, fix) in cases {
            let e = DmaPool::new(slab(slab_len), len, count).unwrap_err();
            assert!(e.to_string().contains(fix), "({len}, {count}): {e}");
            assert!(matches!(e, DmaError::InvalidAllocation(_)), "{e:?}");
        }
        assert_eq!(DmaPool::slab_len(5000, 3).unwrap(), 3 * 8192);
        assert_eq!(DmaPool::slab_len(4096, 2).unwrap(), 8192);
    }

    #[test]
    fn a_slab_off_a_page_is_refused() {
        // A piece split off at 4196 bytes starts inside a page: its buffers
        // would not start on pages (one 4 KiB buffer would need PRP2).
        let mut pieces = slab(4 * 4096).split(4196).unwrap();
        let off = pieces.remove(1);
        assert_eq!(off.iova() % 4096, 4196 % 4096);
        let e = DmaPool::new(off, 4096, 1).unwrap_err();
        assert!(e.to_string().contains("4 KiB page"), "{e}");
        let on = slab(4 * 4096).split(8192).unwrap().remove(1);
        assert!(DmaPool::new(on, 4096, 2).is_ok(), "a piece split at a page");
    }

    #[test]
    fn a_buffer_whose_pages_are_kept_does_not_go_back() {
        // Quarantined pages (the device may still use them) must not be
        // handed to the pool's next user.
        let mut p = DmaPool::new(slab(4 * 4096), 4096, 4).unwrap();
        let mut b = p.get().unwrap();
        let kept = b.detach_pages();
        assert!(p.put(b).is_err(), "refused: its pages are kept");
        drop(kept);
        assert_eq!(p.available(), 3);
    }

    #[test]
    fn data_survives_reuse() {
        let mut p = DmaPool::new(slab(4096), 4096, 1).unwrap();
        let b = p.get().unwrap();
        b.write_u32(0, 0xfeed).unwrap();
        p.put(b).unwrap();
        assert_eq!(p.get().unwrap().read_u32(0).unwrap(), 0xfeed, "not zeroed");
    }
}
