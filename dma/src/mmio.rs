//! BAR0 mapped into the process: the NVMe controller registers (NVMe Base
//! Specification 2.0, §3.1 "Register Definition") and doorbells.
//!
//! Accesses are volatile, naturally aligned and bounds-checked. An access outside
//! the BAR behaves like a PCI master abort: reads return all ones and writes are
//! dropped. The driver already treats an all-ones CSTS as "device gone", so a
//! wrong offset can never touch memory outside the mapping and never panics.

use std::ptr::NonNull;

use crate::error::DmaError;

/// A memory-mapped PCI BAR. Unmapped on drop.
#[derive(Debug)]
pub struct Bar {
    ptr: NonNull<u8>,
    len: usize,
    /// Watched by the SIGBUS handler (see sigbus.rs).
    watched: bool,
}

// SAFETY: the mapping is owned by this value and lives until it is dropped;
// no reference into it is formed: every access is a bounds-checked, aligned
// 32-bit volatile access through a raw pointer, valid from any thread.
unsafe impl Send for Bar {}
// SAFETY: every method takes `&self`. While the mapping is the device's
// registers, concurrent accesses are MMIO that the device orders, outside
// Rust's memory model. Once `retire` or the SIGBUS handler replaced it with
// private all-ones memory (sigbus.rs), it is ordinary memory: two threads
// accessing the same word there, one of them writing, would be a data race
// in Rust's model. Accepted, not excluded: stable Rust has no volatile
// atomic access for MMIO; aligned 32-bit volatile accesses do not tear on the
// supported targets, and that memory holds nothing but all ones and what the
// driver wrote after the device was gone. (`read64`/`write64` are two
// accesses each, not one 64-bit access.)
unsafe impl Sync for Bar {}

impl Bar {
    /// Maps `len` bytes of `fd` at `offset` (a VFIO device region).
    pub(crate) fn map(fd: i32, offset: u64, len: usize, what: &str) -> Result<Bar, DmaError> {
        if len < 0x1000 {
            return Err(DmaError::Bar {
                address: what.to_string(),
                reason: format!("{len} bytes is smaller than the 4 KiB NVMe register file"),
            });
        }
        let off = libc::off_t::try_from(offset).map_err(|_| DmaError::Bar {
            address: what.to_string(),
            reason: format!("region offset 0x{offset:x} does not fit off_t"),
        })?;
        // SAFETY: a shared mapping of a device region at an address chosen by the
        // kernel; it aliases no Rust object; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                off,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(DmaError::MapBar {
                address: what.to_string(),
                os_error: std::io::Error::last_os_error(),
            });
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| DmaError::Bar {
            address: what.to_string(),
            reason: "mmap returned null".into(),
        })?;
        // A revoked mapping (surprise removal) then reads all ones instead of
        // raising SIGBUS; see sigbus.rs.
        let watched = crate::sigbus::watch(ptr.as_ptr(), len);
        // Owned from here: dropping `bar` unmaps (and unwatches) on error.
        let bar = Bar { ptr, len, watched };
        crate::memory::dont_fork(ptr, len, "BAR0")?;
        Ok(bar)
    }

    /// Size of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether an access after the kernel revoked this mapping (surprise
    /// removal) reads all ones instead of raising SIGBUS: true unless the
    /// SIGBUS handler could not watch it (see [`crate::sigbus`]).
    pub fn revocation_safe(&self) -> bool {
        self.watched
    }

    #[inline(always)]
    fn at(&self, offset: usize, size: usize) -> Option<*mut u8> {
        (offset.is_multiple_of(size) && offset.checked_add(size).is_some_and(|e| e <= self.len))
            .then(|| self.ptr.as_ptr().wrapping_add(offset))
    }

    /// Volatile 32-bit register read; all ones outside the BAR.
    #[inline]
    pub fn read32(&self, offset: usize) -> u32 {
        match self.at(offset, 4) {
            // SAFETY: in bounds of the live mapping and 4-byte aligned (checked).
            Some(p) => u32::from_le(unsafe { p.cast::<u32>().read_volatile() }),
            None => u32::MAX,
        }
    }

    /// Volatile 32-bit register write, ordered after every earlier store to
    /// memory (so an SQE written before a doorbell is visible to the device
    /// when it sees the doorbell). Dropped outside the BAR.
    #[inline]
    pub fn write32(&self, offset: usize, value: u32) {
        if let Some(p) = self.at(offset, 4) {
            // Orders earlier (normal and volatile) stores before the MMIO store,
            // for the compiler and the CPU (see `barrier`).
            crate::barrier::dma_wmb();
            // SAFETY: in bounds of the live mapping and 4-byte aligned (checked).
            unsafe { p.cast::<u32>().write_volatile(value.to_le()) };
        }
    }

    /// Volatile 64-bit register read, as two 32-bit reads (low dword first),
    /// which every controller must accept (NVMe 2.0 §3.1.2 allows 32-bit
    /// access to 64-bit registers); all ones outside the BAR.
    #[inline]
    pub fn read64(&self, offset: usize) -> u64 {
        if !offset.is_multiple_of(8) {
            return u64::MAX;
        }
        let lo = self.read32(offset) as u64;
        let hi = self.read32(offset.wrapping_add(4)) as u64;
        lo | (hi << 32)
    }

    /// Volatile 64-bit register write as two 32-bit writes, low dword first.
    #[inline]
    pub fn write64(&self, offset: usize, value: u64) {
        if !offset.is_multiple_of(8) {
            return;
        }
        self.write32(offset, value as u32);
        self.write32(offset + 4, (value >> 32) as u32);
    }
}

impl Bar {
    /// Replaces the mapping with all-ones memory (what a removed device
    /// reads): from now on reads return all ones and writes reach nothing,
    /// and the device file is no longer referenced by the mapping, so the
    /// kernel can complete a removal. Returns false if the replacement could
    /// not be mapped (the mapping is then unchanged).
    pub fn retire(&self) -> bool {
        crate::sigbus::retire(self.ptr.as_ptr(), self.len)
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if self.watched {
            crate::sigbus::unwatch(self.ptr.as_ptr());
        }
        // SAFETY: unmaps exactly the mapping created in `map` (or the all-ones
        // memory the SIGBUS handler put in its place); no reference into it
        // exists.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
