//! Return codes of the C API, the per-thread last-error message, and the
//! guard that keeps panics from crossing the ABI.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use upnvme::dma::DmaError;
use upnvme::{Error, IoError, Reject};

/// Success.
pub const UPNVME_OK: c_int = 0;
/// An argument is invalid (a null pointer, a bad NSID, an LBA range outside
/// the namespace, a buffer too small, ...): `upnvme_last_error()` says which.
pub const UPNVME_EINVAL: c_int = -22;
/// No DMA memory: no hugepages free, or no IOVA space left. (The process
/// heap running out aborts, as Rust's allocation failure does.)
pub const UPNVME_ENOMEM: c_int = -12;
/// Busy for now, retry: the queue pair is full (reap completions first), or
/// other threads' admin commands hold every admin command identifier
/// (`upnvme_ctrl_admin_passthru`: nothing was sent).
pub const UPNVME_EAGAIN: c_int = -11;
/// The object is in use: a buffer owned by a command in flight, a queue pair
/// with commands in flight or destroyed from inside its own callback, or
/// (from `upnvme_qpair_create`) every I/O queue the controller granted is
/// taken by another pair.
pub const UPNVME_EBUSY: c_int = -16;
/// No such (NVMe) device, or the controller is failed, closed or gone.
pub const UPNVME_ENODEV: c_int = -19;
/// The command completed with an NVMe error status (see `sct`/`sc` of the
/// completion).
pub const UPNVME_EIO: c_int = -5;
/// The command or a wait timed out.
pub const UPNVME_ETIMEDOUT: c_int = -110;
/// The command was ended by a controller reset; it may or may not have taken
/// effect.
pub const UPNVME_ECANCELED: c_int = -125;
/// Not supported (e.g. data commands on a namespace with metadata).
pub const UPNVME_ENOTSUP: c_int = -95;
/// Setup failed: the device is not bound to vfio-pci, no IOMMU group, the
/// group is not viable or cannot be opened, a DMA mapping failed (the message
/// says what to fix).
pub const UPNVME_ESETUP: c_int = -1000;
/// A bug inside the library (a Rust panic, caught at the ABI boundary).
pub const UPNVME_EINTERNAL: c_int = -1001;

/// A thread's last error message: made for the error, or a fixed text
/// (recorded without allocating, for refusals that are a normal step of a
/// loop, e.g. an empty pool).
enum LastError {
    Owned(CString),
    Fixed(&'static CStr),
}

thread_local! {
    static LAST_ERROR: RefCell<LastError> = const { RefCell::new(LastError::Fixed(c"")) };
}

/// Records `msg` as this thread's last error and returns `code`.
pub(crate) fn fail(code: c_int, msg: impl std::fmt::Display) -> c_int {
    let text = msg.to_string().replace('\0', " ");
    let c = CString::new(text).unwrap_or_default();
    // `try_with`: during the thread's teardown the slot may be gone, and a
    // panic here (outside the entry points' catch_unwind) would abort.
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = LastError::Owned(c));
    code
}

/// Records the fixed `msg` as this thread's last error, without allocating,
/// and returns `code`: for a refusal that is part of a normal loop (an
/// empty pool), whose call is documented to allocate nothing.
pub(crate) fn fail_fixed(code: c_int, msg: &'static CStr) -> c_int {
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = LastError::Fixed(msg));
    code
}

/// This thread's last error message (empty when none, and during the
/// thread's teardown, when its slot is gone).
pub(crate) fn last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|e| match &*e.borrow() {
            LastError::Owned(c) => c.as_ptr(),
            LastError::Fixed(c) => c.as_ptr(),
        })
        .unwrap_or(c"".as_ptr())
}

/// The code of a library error, with its text recorded as the last error.
pub(crate) fn fail_error(e: &Error) -> c_int {
    fail(error_code(e), e)
}

/// The code of a library error, recording nothing (for a call that goes on
/// and may still succeed: a succeeding call leaves the last error alone).
pub(crate) fn error_code(e: &Error) -> c_int {
    match e {
        Error::InvalidArgument(_) | Error::NoSuchNamespace { .. } => UPNVME_EINVAL,
        Error::UnusableNamespace { .. } => UPNVME_ENOTSUP,
        Error::Unsupported { .. } => UPNVME_ENOTSUP,
        Error::QueueFull { .. } => UPNVME_EAGAIN,
        // The same code as the refusal of a submission (`reject_code`).
        Error::Rejected(r) => reject_code(*r),
        Error::Command { .. } => UPNVME_EIO,
        Error::Timeout { .. } => UPNVME_ETIMEDOUT,
        Error::Io { error, .. } => io_error_code(error),
        Error::ControllerGone { .. }
        | Error::ControllerFatal { .. }
        | Error::DeviceFault { .. }
        | Error::ControllerFailed { .. }
        | Error::QueuesNotRecreated { .. }
        | Error::ControllerRemoved { .. }
        | Error::Closed { .. } => UPNVME_ENODEV,
        Error::NoQueuesLeft { .. } => UPNVME_EBUSY,
        // Nothing was sent; a retry may succeed.
        Error::AdminBusy { .. } => UPNVME_EAGAIN,
        Error::Dma(DmaError::HugepagesUnavailable { .. } | DmaError::IovaExhausted { .. }) => {
            UPNVME_ENOMEM
        }
        Error::Dma(DmaError::NoSuchDevice { .. } | DmaError::NotNvme { .. }) => UPNVME_ENODEV,
        Error::Dma(
            DmaError::InvalidPciAddress { .. }
            | DmaError::OutOfBounds { .. }
            | DmaError::Misaligned { .. }
            | DmaError::InvalidAllocation(_),
        ) => UPNVME_EINVAL,
        _ => UPNVME_ESETUP,
    }
}

/// The code of a command's failure (the completion's `status`).
pub(crate) fn io_error_code(e: &IoError) -> c_int {
    match e {
        IoError::Status(_) => UPNVME_EIO,
        IoError::ControllerFailed | IoError::ControllerRemoved => UPNVME_ENODEV,
        IoError::ControllerReset | IoError::QueueDeleted => UPNVME_ECANCELED,
        IoError::TimedOut => UPNVME_ETIMEDOUT,
        _ => UPNVME_EIO,
    }
}

/// The code of a refusal.
pub(crate) fn reject_code(r: Reject) -> c_int {
    match r {
        Reject::QueueFull => UPNVME_EAGAIN,
        Reject::Unusable => UPNVME_ENODEV,
        // Not a bad argument: the controller lacks the command (ONCS) or
        // cannot be given the memory (no SGLs), or the format is unusable.
        Reject::MetadataFormat(_)
        | Reject::Unsupported { .. }
        | Reject::CopyFormat { .. }
        | Reject::NotDescribable => UPNVME_ENOTSUP,
        _ => UPNVME_EINVAL,
    }
}

/// Runs `f`, turning a panic into [`UPNVME_EINTERNAL`] (no unwinding into C).
pub(crate) fn guard(f: impl FnOnce() -> c_int) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(c) => c,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            fail(
                UPNVME_EINTERNAL,
                format!("internal error in libupnvme_c (please report it): {what}"),
            )
        }
    }
}

/// Runs `f`, returning `default` if it panics (for the functions whose
/// result is a value rather than a code).
pub(crate) fn guard_or<T>(default: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        fail(
            UPNVME_EINTERNAL,
            "internal error in libupnvme_c (please report it)",
        );
        default
    })
}

/// An options struct the C caller fills: its first field is its `size`
/// (u32), and `BOOLS` lists the byte offsets of its `bool` fields.
///
/// # Safety
/// `BOOLS` must name every `bool` field of the type (by `offset_of!`), and
/// every other field must be valid for any bit pattern (integers).
pub(crate) unsafe trait CallerOptions: Copy + Default {
    /// Offsets of the `bool` fields.
    const BOOLS: &'static [usize];
}

/// Reads an options struct whose first field is its `size` as the caller
/// compiled it: only that many bytes are read over the defaults, so a program
/// built against an older, shorter struct stays sound. A `bool` field the
/// caller left with any byte other than 0 or 1 (a struct cleared with
/// `memset(&o, 0xff, ...)`, an uninitialised field) reads as true: its byte
/// is normalised before the bytes become a Rust value, where 0 and 1 are the
/// only valid `bool`s.
///
/// # Safety
/// `p` is null or points to at least `(*p).size` readable bytes (and at
/// least 4).
pub(crate) unsafe fn read_sized<T: CallerOptions>(p: *const T) -> Result<T, c_int> {
    let mut out = std::mem::MaybeUninit::new(T::default());
    if p.is_null() {
        return Ok(T::default());
    }
    // SAFETY: the first field of every options struct is its u32 size, and
    // `p` points to at least 4 readable bytes (the caller's contract).
    let size = unsafe { p.cast::<u32>().read_unaligned() } as usize;
    if size < 4 {
        // A struct the caller filled without `*_opts_init` (`= {.entries =
        // 64}` leaves `size` 0): reading none of it would drop every field
        // the caller set without a word.
        return Err(fail(
            UPNVME_EINVAL,
            format!(
                "an options struct with size {size}: fill it with its *_opts_default or \
                 *_opts_init function (which set size) before setting fields, or pass NULL for \
                 the defaults"
            ),
        ));
    }
    let n = size.min(std::mem::size_of::<T>());
    let dst = out.as_mut_ptr().cast::<u8>();
    // SAFETY: `n` bytes are readable at `p` (the caller's contract) and
    // writable in `out`; the copy is of bytes into a `MaybeUninit`, so no
    // Rust value exists yet.
    unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), dst, n) };
    for &off in T::BOOLS {
        let b = dst.wrapping_add(off);
        // SAFETY: `off` is a field offset inside `T` (the trait's contract),
        // so `b` is inside `out`; the byte is initialised (the default's, or
        // the caller's just copied over it).
        let v = unsafe { b.read() };
        // SAFETY: as above.
        unsafe { b.write(u8::from(v != 0)) };
    }
    // SAFETY: every byte of every field is initialised (from the default,
    // then the caller's bytes); integers are valid for any bits, and each
    // `bool` field holds 0 or 1 now (the trait's contract names them all).
    Ok(unsafe { out.assume_init() })
}

/// Writes the defaults `v` into the caller's options struct of `size` bytes
/// (`sizeof` as the caller's header has it): at most that many bytes, and
/// the struct's `size` field as what was written. `UPNVME_EINVAL` for a
/// NULL struct or one too small for its `size` field.
///
/// # Safety
/// `p` is null or valid for writes of `size` bytes.
pub(crate) unsafe fn write_sized<T: CallerOptions>(p: *mut T, size: usize, v: T) -> c_int {
    if p.is_null() || size < std::mem::size_of::<u32>() {
        return fail(
            UPNVME_EINVAL,
            "options: NULL, or a size smaller than the struct's size field",
        );
    }
    let n = size.min(std::mem::size_of::<T>());
    let src = std::ptr::addr_of!(v).cast::<u8>();
    // SAFETY: `n` bytes are readable in `v` (n <= its size) and writable at
    // `p` (the caller's contract: `size` bytes, n <= size); the regions are
    // distinct (`v` is ours).
    unsafe { std::ptr::copy_nonoverlapping(src, p.cast::<u8>(), n) };
    // SAFETY: the first field of every options struct is its u32 size, and
    // `size >= 4` bytes are writable at `p`.
    unsafe { p.cast::<u32>().write_unaligned(n as u32) };
    UPNVME_OK
}

/// Static text for a code.
pub(crate) fn strerror(code: c_int) -> &'static std::ffi::CStr {
    match code {
        UPNVME_OK => c"success",
        UPNVME_EINVAL => c"invalid argument",
        UPNVME_ENOMEM => c"out of (DMA) memory",
        UPNVME_EAGAIN => c"busy: a full queue pair (reap completions) or every admin command identifier taken; retry",
        UPNVME_EBUSY => c"in use",
        UPNVME_ENODEV => c"no such device, or the controller failed, closed or gone",
        UPNVME_EIO => c"command failed with an NVMe status",
        UPNVME_ETIMEDOUT => c"timed out",
        UPNVME_ECANCELED => c"ended by a controller reset",
        UPNVME_ENOTSUP => c"not supported",
        UPNVME_ESETUP => c"setup failed (VFIO, IOMMU, sysfs or permissions)",
        UPNVME_EINTERNAL => c"internal error",
        _ => c"unknown error code",
    }
}

/// Writes `s` and its NUL into the caller's `buf` of `len` bytes.
/// `UPNVME_EINVAL` (nothing written) for a NULL `buf` or a `len` that does
/// not hold `s` and the NUL.
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
pub(crate) unsafe fn write_c_str(buf: *mut c_char, len: usize, s: &str) -> c_int {
    if buf.is_null() || len <= s.len() || s.contains('\0') {
        return fail(
            UPNVME_EINVAL,
            format!(
                "a buffer of {len} bytes{}: it needs {} (the text and its NUL)",
                if buf.is_null() { " at NULL" } else { "" },
                s.len() + 1
            ),
        );
    }
    let dst = buf.cast::<u8>();
    // SAFETY: `s.len() + 1 <= len` bytes are writable at `buf` (the
    // caller's contract); `s` is ours, so the regions are distinct.
    unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), dst, s.len()) };
    // SAFETY: byte `s.len()` is inside the `len` writable bytes (checked).
    unsafe { dst.wrapping_add(s.len()).write(0) };
    UPNVME_OK
}
