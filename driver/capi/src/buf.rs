//! DMA buffer handles (`upnvme_buf`) and pools (`upnvme_pool`).
//!
//! A handle owns one [`DmaBuffer`] while the application holds it. Submitting
//! a command moves the buffer out of the handle into the command (the handle
//! is then *in flight*: its data must not be touched, it cannot be freed or
//! submitted again); the completion moves it back before the callback runs.
//! So the Rust ownership rule — one owner, the device's while a command runs
//! — holds across the ABI, checked at run time.

use std::ffi::c_void;

use upnvme::{DmaBuffer, DmaPool};

/// A DMA buffer handle. Opaque to C.
#[derive(Debug)]
pub struct upnvme_buf {
    /// The buffer; `None` while a command owns it (or when the driver kept
    /// it after a command ended in a way the device might still use it).
    pub(crate) buf: Option<DmaBuffer>,
    /// A command owns the buffer now.
    pub(crate) inflight: bool,
    /// Its address and length, kept for `upnvme_buf_data` while in flight.
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    pub(crate) iova: u64,
    /// The pool it came from (null: none), for `upnvme_pool_put`.
    pub(crate) pool: *const c_void,
    /// Back in its pool's spare list (given back with `upnvme_pool_put`):
    /// the pool owns the handle now, and every call that takes a handle
    /// refuses it (it can only be a use after the put).
    pub(crate) spare: bool,
}

impl upnvme_buf {
    /// A handle owning `b`.
    pub(crate) fn new(b: DmaBuffer, pool: *const c_void) -> upnvme_buf {
        upnvme_buf {
            ptr: b.as_ptr(),
            len: b.len(),
            iova: b.iova(),
            buf: Some(b),
            inflight: false,
            pool,
            spare: false,
        }
    }

    /// Refills a recycled handle with `b`.
    pub(crate) fn refill(&mut self, b: DmaBuffer) {
        self.ptr = b.as_ptr();
        self.len = b.len();
        self.iova = b.iova();
        self.buf = Some(b);
        self.spare = false;
    }

    /// The end of a command that owned the buffer: the buffer comes back,
    /// or `None` when the driver kept it (the device might still use it;
    /// it is freed when the controller is disabled). A kept buffer's
    /// address, length and IOVA are cleared, so `upnvme_buf_data` gives
    /// NULL rather than memory the handle no longer owns.
    pub(crate) fn settle(&mut self, b: Option<DmaBuffer>) {
        if b.is_none() {
            self.ptr = std::ptr::null_mut();
            self.len = 0;
            self.iova = 0;
        }
        self.buf = b;
        self.inflight = false;
    }

    /// Why this handle cannot be used now, if it cannot: in a command, or
    /// back in its pool.
    pub(crate) fn busy(&self) -> Option<(std::ffi::c_int, &'static str)> {
        if self.spare {
            return Some((
                crate::status::UPNVME_EINVAL,
                "the buffer was given back to its pool (upnvme_pool_put): get a new one",
            ));
        }
        self.inflight.then_some((
            crate::status::UPNVME_EBUSY,
            "the buffer belongs to a command in flight: wait for its completion",
        ))
    }
}

/// A pool of equal DMA buffers with O(1) get and put and no allocation after
/// creation: the buffers and their handles are made up front. Opaque to C.
#[derive(Debug)]
pub struct upnvme_pool {
    pub(crate) pool: DmaPool,
    /// Handles not handed out (empty, `buf: None`); capacity = count.
    /// Raw (from `Box::into_raw`), not `Box`: C may still hold a stale
    /// pointer to a handle given back, and the library reads it to refuse
    /// the use; a `Box` here would assert uniqueness that read violates.
    pub(crate) spare: Vec<std::ptr::NonNull<upnvme_buf>>,
}

impl Drop for upnvme_pool {
    fn drop(&mut self) {
        for h in self.spare.drain(..) {
            // SAFETY: made by `Box::into_raw`, owned by the pool (spare).
            drop(unsafe { Box::from_raw(h.as_ptr()) });
        }
    }
}

impl upnvme_pool {
    /// Wraps `pool`, making one handle per buffer.
    pub(crate) fn new(pool: DmaPool) -> Box<upnvme_pool> {
        let n = pool.capacity();
        let mut p = Box::new(upnvme_pool {
            pool,
            spare: Vec::with_capacity(n),
        });
        let me: *const c_void = (&*p as *const upnvme_pool).cast();
        for _ in 0..n {
            let h = Box::into_raw(Box::new(upnvme_buf {
                buf: None,
                inflight: false,
                ptr: std::ptr::null_mut(),
                len: 0,
                iova: 0,
                pool: me,
                spare: true,
            }));
            // SAFETY: not null (from `Box::into_raw`).
            p.spare.push(unsafe { std::ptr::NonNull::new_unchecked(h) });
        }
        p
    }

    /// A buffer in a handle, or `None` when all are handed out.
    pub(crate) fn get(&mut self) -> Option<*mut upnvme_buf> {
        let b = self.pool.get()?;
        match self.spare.pop() {
            Some(h) => {
                // SAFETY: a spare handle, owned by the pool; no reference
                // to it is live (C only holds raw pointers).
                unsafe { (*h.as_ptr()).refill(b) };
                Some(h.as_ptr())
            }
            // Cannot happen (one handle per buffer); give the buffer back.
            None => {
                let _ = self.pool.put(b);
                None
            }
        }
    }

    /// Takes back a handle this pool handed out; `Err` hands it back when it
    /// is not this pool's or is in flight.
    ///
    /// # Safety
    /// `hp` is a live handle made by `Box::into_raw`, not referenced
    /// elsewhere during the call; on `Ok` the pool owns it.
    pub(crate) unsafe fn put(&mut self, hp: *mut upnvme_buf) -> Result<(), ()> {
        // SAFETY: the caller's contract.
        let h = unsafe { &mut *hp };
        if h.pool != (self as *const upnvme_pool).cast()
            || self.spare.len() >= self.spare.capacity()
        {
            return Err(());
        }
        if h.busy().is_some() {
            return Err(());
        }
        let Some(b) = h.buf.take() else {
            return Err(());
        };
        match self.pool.put(b) {
            Ok(()) => {
                h.ptr = std::ptr::null_mut();
                h.len = 0;
                h.iova = 0;
                h.spare = true;
                // SAFETY: not null (a live handle).
                self.spare
                    .push(unsafe { std::ptr::NonNull::new_unchecked(hp) });
                Ok(())
            }
            Err(back) => {
                h.buf = Some(back.0);
                Err(())
            }
        }
    }
}
