//! A BAR mapping the kernel revokes under the driver: surprise removal, a
//! reset of the function, or PCI Command.MSE cleared make vfio-pci zap the
//! process's BAR0 mapping, and the next register or doorbell access raises
//! SIGBUS instead of reaching the device. A driver that dies of it cannot
//! tell its application that the device is gone.
//!
//! A process-wide SIGBUS handler, installed when the first BAR is mapped,
//! looks up the faulting address among the live BAR mappings. If it lies in
//! one, the handler maps private anonymous memory filled with all ones over
//! that whole mapping (`MAP_FIXED`) and returns: the faulting access runs
//! again and reads all ones (what a PCI master abort reads), later writes land
//! in that memory, and the driver reports the device as gone
//! (`ControllerGone`, from an all-ones CSTS) like any other vanished device.
//! Any other SIGBUS goes to the handler that was installed before, or gets
//! the default action. SPDK handles a removed device the same way.
//!
//! An application that installs its own SIGBUS handler after opening a
//! controller replaces this one; it should chain to the previous handler.

use std::ffi::c_void;
use std::sync::Once;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// How many BAR mappings can be watched at once.
const SLOTS: usize = 64;
const PAGE_SHIFT: u32 = 12;

/// Live mappings, one per slot: `(start >> 12) << 28 | (len >> 12)`; 0 = free.
/// One atomic word per mapping, so the handler never sees half an update.
static REGIONS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
/// Accesses answered with all ones since the process started.
static REVOKED: AtomicU64 = AtomicU64::new(0);
/// The SIGBUS action in place before ours (null until installed).
static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
static INSTALL: Once = Once::new();

/// An SA_SIGINFO signal handler.
type SigInfoHandler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void);

/// Number of BAR accesses that faulted because the kernel had revoked the
/// mapping, and were answered with all ones, since the process started.
pub fn revoked_accesses() -> u64 {
    REVOKED.load(Ordering::Relaxed)
}

fn pack(start: usize, len: usize) -> Option<u64> {
    let (s, l) = (
        (start >> PAGE_SHIFT) as u64,
        len.div_ceil(1 << PAGE_SHIFT) as u64,
    );
    (start % (1 << PAGE_SHIFT) == 0 && s < (1 << 36) && l > 0 && l < (1 << 28))
        .then_some((s << 28) | l)
}

fn unpack(v: u64) -> (usize, usize) {
    (
        ((v >> 28) as usize) << PAGE_SHIFT,
        ((v & ((1 << 28) - 1)) as usize) << PAGE_SHIFT,
    )
}

/// Watches the BAR mapping at `start` (page aligned, `len` bytes): installs
/// the handler on first use. Returns false, and leaves the mapping
/// unprotected, when it cannot be watched (no free slot, or the handler could
/// not be installed).
pub(crate) fn watch(start: *mut u8, len: usize) -> bool {
    INSTALL.call_once(install);
    if PREVIOUS.load(Ordering::Acquire).is_null() {
        return false;
    }
    let Some(v) = pack(start as usize, len) else {
        return false;
    };
    REGIONS.iter().any(|slot| {
        slot.compare_exchange(0, v, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })
}

/// Stops watching the mapping at `start`; called before it is unmapped.
pub(crate) fn unwatch(start: *mut u8) {
    for slot in &REGIONS {
        let v = slot.load(Ordering::Acquire);
        if v != 0 && unpack(v).0 == start as usize {
            let _ = slot.compare_exchange(v, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

fn install() {
    // SAFETY: `sigaction` structs are plain C data for which all zeroes is a
    // valid value (empty mask, no flags, SIG_DFL).
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction = on_sigbus as SigInfoHandler as usize;
    new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: `new.sa_mask` is a valid sigset_t owned by this frame.
    unsafe { libc::sigemptyset(&mut new.sa_mask) };
    // SAFETY: both pointers are to valid sigaction structs of this frame; the
    // handler is an `extern "C"` function with the SA_SIGINFO signature.
    if unsafe { libc::sigaction(libc::SIGBUS, &new, &mut old) } == 0 {
        // Leaked on purpose: the handler may read it until the process ends.
        PREVIOUS.store(Box::into_raw(Box::new(old)), Ordering::Release);
    }
}

/// The SIGBUS handler. Only async-signal-safe work: atomic loads, mmap,
/// memset, sigaction, raise.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: for an SA_SIGINFO handler the kernel passes a valid siginfo.
    let info_ref = unsafe { &*info };
    // SAFETY: `si_addr` reads the union member that holds the faulting
    // address of a memory fault (meaningless, but harmless, for a kill).
    let addr = unsafe { info_ref.si_addr() } as usize;
    for slot in &REGIONS {
        let v = slot.load(Ordering::Acquire);
        if v == 0 {
            continue;
        }
        let (start, len) = unpack(v);
        if addr < start || addr - start >= len {
            continue;
        }
        // SAFETY: `start..start + len` is a BAR mapping this crate created
        // and still owns (`unwatch` runs before its munmap); replacing its
        // pages with private anonymous memory affects no other mapping, and
        // no Rust reference points into it (BAR accesses are volatile through
        // raw pointers).
        let p = unsafe {
            libc::mmap(
                start as *mut c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            // SAFETY: `p` is the fresh `len`-byte anonymous mapping just made.
            unsafe { libc::memset(p, 0xff, len) };
            REVOKED.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    forward(sig, info, ctx);
}

/// Hands a SIGBUS that is not ours to the previous action, or ends the
/// process as the default action would.
fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let prev = PREVIOUS.load(Ordering::Acquire);
    if !prev.is_null() {
        // SAFETY: set once from a leaked Box and never freed or written again.
        let prev = unsafe { &*prev };
        let handler = prev.sa_sigaction;
        if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous action was installed with SA_SIGINFO, so
                // `handler` is a function of this signature.
                let f: SigInfoHandler = unsafe { std::mem::transmute(handler) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a handler installed without SA_SIGINFO takes the
                // signal number only.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
                f(sig);
            }
            return;
        }
    }
    // SAFETY: all-zero sigaction = SIG_DFL with an empty mask.
    let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    dfl.sa_sigaction = libc::SIG_DFL;
    // SAFETY: restores the default action from a valid struct.
    unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
    // SAFETY: re-raises: the signal is blocked inside this handler, so it is
    // delivered (and ends the process) as soon as the handler returns.
    unsafe { libc::raise(sig) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips_page_aligned_mappings() {
        for (s, l) in [(0x7f00_0000_0000usize, 0x4000usize), (0x1000, 0x1000)] {
            assert_eq!(unpack(pack(s, l).unwrap()), (s, l));
        }
        assert_eq!(unpack(pack(0x2000, 0x1001).unwrap()), (0x2000, 0x2000));
        assert!(pack(0x1001, 0x1000).is_none(), "unaligned start");
        assert!(pack(0x1000, 0).is_none(), "empty");
    }

    /// A real mapping revoked under the process: mprotect(PROT_NONE) turns
    /// accesses into SIGSEGV, not SIGBUS, so the handler is exercised with a
    /// file mapping beyond the end of its file, which raises SIGBUS as a
    /// zapped BAR does.
    #[test]
    fn access_beyond_a_revoked_mapping_reads_all_ones() {
        let path = std::env::temp_dir().join(format!("upnvme-sigbus-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.set_len(0x2000).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of a file this test owns.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                0x2000,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let p = p.cast::<u8>();
        assert!(watch(p, 0x2000));
        // Truncating the file revokes the pages: the next access is SIGBUS.
        f.set_len(0).unwrap();
        let before = revoked_accesses();
        // SAFETY: inside the live mapping; volatile, as for a BAR.
        let q = unsafe { p.add(0x1000) }.cast::<u32>();
        // SAFETY: see above.
        let v = unsafe { q.read_volatile() };
        assert_eq!(v, u32::MAX);
        assert_eq!(revoked_accesses(), before + 1);
        unwatch(p);
        // SAFETY: unmaps the mapping made above.
        unsafe { libc::munmap(p.cast(), 0x2000) };
        let _ = std::fs::remove_file(&path);
    }
}
