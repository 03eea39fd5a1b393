//! A counting global allocator for tests of the invariant "the hot path
//! allocates nothing". It lives here because implementing `GlobalAlloc` needs
//! `unsafe`, and this is the only crate allowed to contain it.
//!
//! ```ignore
//! #[global_allocator]
//! static A: upnvme_dma::alloc_count::CountingAllocator = upnvme_dma::alloc_count::CountingAllocator;
//! let (_, allocations) = upnvme_dma::alloc_count::count(|| hot_path());
//! ```
//! Counting is per thread; [`excluded`] leaves out work that is not the code
//! under test (e.g. an emulated device's own work inside register accesses).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static EXCLUDED: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting allocations made by threads inside [`count`].
pub struct CountingAllocator;

fn note() {
    // `try_with`: the allocator may run while thread locals are torn down.
    let counting = COUNTING.try_with(|c| c.get()).unwrap_or(false);
    let excluded = EXCLUDED.try_with(|d| d.get()).unwrap_or(true);
    if counting && !excluded {
        let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
    }
}

// SAFETY: every method forwards to the system allocator with the caller's
// arguments unchanged, so the GlobalAlloc contract is the system allocator's;
// the bookkeeping touches only const-initialised thread locals and never
// allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` and returns its result with the number of heap allocations this
/// thread made meanwhile (outside [`excluded`] sections). Counts only when
/// [`CountingAllocator`] is the global allocator.
pub fn count<R>(f: impl FnOnce() -> R) -> (R, u64) {
    ALLOCS.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    (r, ALLOCS.with(|a| a.get()))
}

/// Runs `f` with allocation counting paused on this thread.
pub fn excluded<R>(f: impl FnOnce() -> R) -> R {
    let was = EXCLUDED.with(|d| d.replace(true));
    let r = f();
    EXCLUDED.with(|d| d.set(was));
    r
}
