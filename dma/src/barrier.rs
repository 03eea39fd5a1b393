//! Ordering between the CPU and the device, for the three points where the
//! NVMe queue protocol needs it:
//!
//! - [`dma_wmb`]: stores to DMA memory (an SQE, a PRP List, an SGL) are
//!   visible to the device before a later store that tells it to look —
//!   the SQ Tail doorbell (an MMIO write) or the shadow doorbell (a store
//!   to DMA memory the controller reads; NVMe 2.0 §5.8, Doorbell Buffer
//!   Config).
//! - [`dma_rmb`]: after the CQE's Phase Tag was seen new, the loads of the
//!   entry's other dwords are not satisfied before it.
//! - [`dma_mb`]: a store (the shadow doorbell) is visible before a later
//!   load (the EventIdx the controller wrote) is satisfied.
//!
//! A language fence does not order against a device on every architecture:
//! on AArch64 `fence(Release)` is `dmb ish`, whose shareability domain need
//! not include the device, so the stores of an SQE could reach the
//! controller after its doorbell. There these are `dmb` over the Outer
//! Shareable domain (`oshst`, `oshld`, `osh`), the barriers Linux's arm64
//! `dma_wmb()`, `dma_rmb()` and `__iowmb()` use for DMA-coherent devices. On
//! x86-64 (stores are not reordered with earlier stores, write-back or
//! uncached; loads not with earlier loads) the first two only restrain the
//! compiler and the third is `fence(SeqCst)`, emitted as a locked `or` of a
//! stack word: a full StoreLoad barrier for write-back memory shared with
//! a coherent device (Linux's `smp_mb` is the same). Elsewhere each is a sequentially
//! consistent fence: correct wherever the device is cache-coherent with the
//! CPU's inner domain, and the strongest the language offers.

#[cfg(not(target_arch = "aarch64"))]
use std::sync::atomic::{Ordering, fence};

/// Every earlier store to memory is visible to the device before any later
/// store (to memory or to a device register).
#[inline(always)]
pub fn dma_wmb() {
    #[cfg(target_arch = "x86_64")]
    std::sync::atomic::compiler_fence(Ordering::Release);
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dmb oshst` only orders memory accesses; it reads and writes
    // no register or memory the compiler allocates (no `nomem`: it is also a
    // compiler barrier for memory accesses).
    unsafe {
        std::arch::asm!("dmb oshst", options(nostack, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    fence(Ordering::SeqCst);
}

/// No later load from memory is satisfied before the earlier loads (the
/// Phase Tag that said a completion queue entry is new).
#[inline(always)]
pub fn dma_rmb() {
    #[cfg(target_arch = "x86_64")]
    std::sync::atomic::compiler_fence(Ordering::Acquire);
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as in `dma_wmb`: a barrier instruction, no operands.
    unsafe {
        std::arch::asm!("dmb oshld", options(nostack, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    fence(Ordering::SeqCst);
}

/// Every earlier store is visible to the device before any later load is
/// satisfied (a shadow doorbell written, then the EventIdx read).
#[inline(always)]
pub fn dma_mb() {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as in `dma_wmb`: a barrier instruction, no operands.
    unsafe {
        std::arch::asm!("dmb osh", options(nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "aarch64"))]
    fence(Ordering::SeqCst);
}
