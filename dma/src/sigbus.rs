//! A BAR mapping the kernel revokes under the driver: surprise removal, a
//! reset of the function, or PCI Command.MSE cleared make vfio-pci zap the
//! process's BAR0 mapping, and the next register or doorbell access raises
//! SIGBUS instead of reaching the device. A driver that dies of it cannot
//! tell its application that the device is gone.
//!
//! A process-wide SIGBUS handler, installed when the first BAR is mapped,
//! looks up the faulting address among the live BAR mappings. If it lies in
//! one, the handler maps a memfd prepared when the BAR was mapped, already
//! filled with all ones, privately over that whole mapping (`MAP_FIXED`, one
//! atomic replacement: no thread ever sees anything but the device or all
//! ones) and returns: the faulting access runs again and reads all ones (what
//! a PCI master abort reads), later writes land in private copies, and the
//! driver reports the device as gone (`ControllerGone`, from an all-ones
//! CSTS) like any other vanished device. Only a kernel-generated fault
//! (`si_code` BUS_ADRERR, which is what a zapped mapping raises) is handled;
//! any other SIGBUS goes to the handler that was installed before, or gets
//! the default action; one that does not come back by itself when the
//! handler returns (sent, or an asynchronous BUS_MCEERR_AO) is raised again
//! under the default action. SPDK handles a removed device the same way.
//!
//! Why a fault's address is safe to act on: the kernel raises it on the
//! faulting thread while that thread is inside a volatile access through a
//! live `&Bar`, so the mapping cannot be unmapped (`Bar::drop` needs the
//! `Bar` itself) until the handler returns.
//!
//! Watching is best effort: with more than [`SLOTS`] BARs mapped at once, or
//! when a memfd cannot be made, a BAR is mapped unwatched
//! ([`crate::Bar::revocation_safe`] says which).
//!
//! An application that installs its own SIGBUS handler after opening a
//! controller replaces this one; it should chain to the previous handler.

use std::ffi::c_void;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};

/// How many BAR mappings can be watched at once.
pub const SLOTS: usize = 64;
const PAGE_SHIFT: u32 = 12;
/// `Slot::region` while a slot is being filled in.
const CLAIMED: u64 = u64::MAX;

/// A watched mapping.
struct Slot {
    /// `(start >> 12) << 28 | (len >> 12)`; 0 = free, [`CLAIMED`] = being set up.
    /// One atomic word per mapping, so the handler never sees half of one.
    region: AtomicU64,
    /// The all-ones memfd to map over it (valid while `region` names it).
    fd: AtomicI32,
}

static SLOT_TABLE: [Slot; SLOTS] = [const {
    Slot {
        region: AtomicU64::new(0),
        fd: AtomicI32::new(-1),
    }
}; SLOTS];
/// Mappings replaced with all ones since the process started.
static REVOKED: AtomicU64 = AtomicU64::new(0);
/// The SIGBUS action in place before ours (null until installed).
static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
/// Set once a previous action installed with `SA_RESETHAND` ran: from then
/// on a SIGBUS that is not ours gets the default action, as it would have
/// without this handler.
static PREVIOUS_SPENT: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();
/// Set once this module's handler is the SIGBUS action (`install`'s second
/// `sigaction` succeeded): only then is a mapping watched. `PREVIOUS` is
/// published before that call and so says nothing about its outcome.
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// An SA_SIGINFO signal handler.
type SigInfoHandler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void);

/// Number of revoked BAR mappings the handler replaced with all ones since
/// the process started (one per mapping, however many accesses then read
/// the all-ones memory).
pub fn revoked_mappings() -> u64 {
    REVOKED.load(Ordering::Relaxed)
}

fn pack(start: usize, len: usize) -> Option<u64> {
    let (s, l) = (
        (start >> PAGE_SHIFT) as u64,
        len.div_ceil(1 << PAGE_SHIFT) as u64,
    );
    // 47-bit user addresses: the packed value is never CLAIMED.
    (start.is_multiple_of(1 << PAGE_SHIFT) && s < (1 << 35) && l > 0 && l < (1 << 28))
        .then_some((s << 28) | l)
}

fn unpack(v: u64) -> (usize, usize) {
    (
        ((v >> 28) as usize) << PAGE_SHIFT,
        ((v & ((1 << 28) - 1)) as usize) << PAGE_SHIFT,
    )
}

/// A memfd of `len` bytes (rounded up to pages), every byte 0xFF.
fn all_ones_memfd(len: usize) -> Option<i32> {
    let len = len.div_ceil(1 << PAGE_SHIFT) << PAGE_SHIFT;
    // SAFETY: a NUL-terminated name and valid flags; the result is checked.
    let fd = unsafe { libc::memfd_create(c"upnvme-bar-gone".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let page = [0xffu8; 1 << PAGE_SHIFT];
    let mut off = 0;
    while off < len {
        // SAFETY: writes from a live local buffer of the length given.
        let n = unsafe { libc::pwrite(fd, page.as_ptr().cast(), page.len(), off as libc::off_t) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            // SAFETY: closes the fd made above, used nowhere else.
            unsafe { libc::close(fd) };
            return None;
        }
        off += n as usize;
    }
    Some(fd)
}

/// Watches the BAR mapping at `start` (page aligned, `len` bytes): installs
/// the handler on first use and prepares its all-ones replacement. Returns
/// false, and leaves the mapping unwatched, when that is not possible.
pub(crate) fn watch(start: *mut u8, len: usize) -> bool {
    INSTALL.call_once(install);
    if !INSTALLED.load(Ordering::Acquire) {
        return false;
    }
    let Some(v) = pack(start as usize, len) else {
        return false;
    };
    let Some(slot) = SLOT_TABLE.iter().find(|s| {
        s.region
            .compare_exchange(0, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) else {
        return false;
    };
    let Some(fd) = all_ones_memfd(len) else {
        slot.region.store(0, Ordering::Release);
        return false;
    };
    slot.fd.store(fd, Ordering::Relaxed);
    // Publishes the fd with the region.
    slot.region.store(v, Ordering::Release);
    true
}

/// Replaces the mapping at `start` (`len` bytes, page aligned) with all-ones
/// memory now, as the handler does on a fault: the driver giving the device
/// back. Uses the mapping's prepared memfd when it is watched, else makes
/// one. Returns false if no replacement could be mapped.
pub(crate) fn retire(start: *mut u8, len: usize) -> bool {
    let watched = SLOT_TABLE.iter().find_map(|slot| {
        let v = slot.region.load(Ordering::Acquire);
        (v != 0 && v != CLAIMED && unpack(v).0 == start as usize)
            .then(|| slot.fd.load(Ordering::Relaxed))
            .filter(|fd| *fd >= 0)
    });
    let (fd, own) = match watched {
        Some(fd) => (fd, false),
        None => match all_ones_memfd(len) {
            Some(fd) => (fd, true),
            None => return false,
        },
    };
    // SAFETY: `start..start + len` is a live BAR mapping this crate made (the
    // caller holds its `Bar`); replacing its pages in one MAP_FIXED call
    // affects no other mapping and no Rust reference points into it (accesses
    // are volatile through raw pointers, so a concurrent access sees either
    // the device or all ones). `fd` is a memfd of at least `len` bytes.
    let p = unsafe {
        libc::mmap(
            start.cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    if own {
        // SAFETY: the memfd made above, used nowhere else (the mapping keeps
        // its own reference).
        unsafe { libc::close(fd) };
    }
    p != libc::MAP_FAILED
}

/// Stops watching the mapping at `start`; called before it is unmapped.
pub(crate) fn unwatch(start: *mut u8) {
    for slot in &SLOT_TABLE {
        let v = slot.region.load(Ordering::Acquire);
        if v != 0 && v != CLAIMED && unpack(v).0 == start as usize {
            let fd = slot.fd.swap(-1, Ordering::Relaxed);
            slot.region.store(0, Ordering::Release);
            if fd >= 0 {
                // SAFETY: the memfd `watch` made for this mapping; no one else
                // uses it (a fault on this mapping cannot be in progress: see
                // the module docs).
                unsafe { libc::close(fd) };
            }
        }
    }
}

fn install() {
    // SAFETY: `sigaction` structs are plain C data for which all zeroes is a
    // valid value (empty mask, no flags, SIG_DFL).
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // The previous action is read and published before this handler is
    // installed: a SIGBUS on another thread in between must find it (with
    // `PREVIOUS` still null the handler would fall back to SIG_DFL and the
    // application's own handler would be lost).
    // SAFETY: a null new action only reads the current one into `old`.
    if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) } != 0 {
        return;
    }
    // Leaked on purpose: the handler may read it until the process ends.
    PREVIOUS.store(Box::into_raw(Box::new(old)), Ordering::Release);
    // SAFETY: see above.
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction = on_sigbus as SigInfoHandler as usize;
    new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: `new.sa_mask` is a valid sigset_t owned by this frame.
    unsafe { libc::sigemptyset(&mut new.sa_mask) };
    // SAFETY: a valid sigaction struct of this frame; the handler is an
    // `extern "C"` function with the SA_SIGINFO signature.
    if unsafe { libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut()) } == 0 {
        // SAFETY: registers a plain `extern "C"` function with no
        // arguments, run in the child of a fork.
        unsafe { libc::pthread_atfork(None, None, Some(forget_in_child)) };
        INSTALLED.store(true, Ordering::Release);
    }
}

/// In a fork's child: BAR mappings are MADV_DONTFORK, so the watched
/// ranges are holes there that the child may map something else into (a
/// range the all-ones file already replaced after a revocation is
/// inherited as that copy instead — not the device, so harmless); a
/// SIGBUS in that must not be "handled" by mapping all ones over it. Only
/// atomic stores and close (async-signal-safe, as a child of a
/// multithreaded fork requires).
extern "C" fn forget_in_child() {
    for slot in &SLOT_TABLE {
        slot.region.store(0, Ordering::Release);
        let fd = slot.fd.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: the child's copy of a memfd `watch` made; nothing else
            // in the child uses it now that its slot is free.
            unsafe { libc::close(fd) };
        }
    }
}

/// The SIGBUS handler. Only async-signal-safe work (atomic loads, and the
/// raw system calls mmap, sigaction and raise), and errno is preserved.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let errno = Errno::save();
    // SAFETY: for an SA_SIGINFO handler the kernel passes a valid siginfo.
    let info_ref = unsafe { &*info };
    let code = info_ref.si_code;
    if !(code == libc::BUS_ADRERR && replace_mapping(info_ref)) {
        forward(sig, code, info, ctx);
    }
    errno.restore();
}

/// The thread's errno, kept across the handler's system calls.
struct Errno(libc::c_int);

impl Errno {
    fn location() -> *mut libc::c_int {
        // SAFETY: returns the calling thread's errno location; no arguments.
        unsafe { libc::__errno_location() }
    }

    fn save() -> Self {
        // SAFETY: the thread's own errno location, valid while it runs.
        Errno(unsafe { *Self::location() })
    }

    fn restore(self) {
        // SAFETY: as in `save`.
        unsafe { *Self::location() = self.0 };
    }
}

/// For a fault inside a watched mapping: maps its all-ones memfd over it.
fn replace_mapping(info: &libc::siginfo_t) -> bool {
    // SAFETY: for a kernel-generated memory fault (BUS_ADRERR, checked by the
    // caller) the union holds the faulting address.
    let addr = unsafe { info.si_addr() } as usize;
    for slot in &SLOT_TABLE {
        let v = slot.region.load(Ordering::Acquire);
        if v == 0 || v == CLAIMED {
            continue;
        }
        let (start, len) = unpack(v);
        if addr < start || addr - start >= len {
            continue;
        }
        let fd = slot.fd.load(Ordering::Relaxed);
        // SAFETY: `start..start + len` is a live BAR mapping this crate made
        // (a fault in it means a `&Bar` access is in progress on this thread,
        // so it cannot be unmapped meanwhile); replacing its pages affects no
        // other mapping, and no Rust reference points into it (BAR accesses
        // are volatile through raw pointers). `fd` is its prepared memfd of
        // at least `len` bytes.
        let p = unsafe {
            libc::mmap(
                start as *mut c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED,
                fd,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            REVOKED.fetch_add(1, Ordering::Relaxed);
            return true;
        }
    }
    false
}

/// Hands a SIGBUS that is not ours to the previous action, or gets the
/// default action for it.
fn forward(sig: libc::c_int, code: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let prev = PREVIOUS.load(Ordering::Acquire);
    if !prev.is_null() {
        // SAFETY: set once from a leaked Box and never freed or written again.
        let prev = unsafe { &*prev };
        let handler = prev.sa_sigaction;
        if handler == libc::SIG_IGN && !refaults(code) {
            // A SIGBUS someone sent, or an asynchronous machine-check notice
            // (BUS_MCEERR_AO), to a process that ignored SIGBUS.
            return;
        }
        let spent =
            prev.sa_flags & libc::SA_RESETHAND != 0 && PREVIOUS_SPENT.swap(true, Ordering::AcqRel);
        if handler != libc::SIG_DFL && handler != libc::SIG_IGN && !spent {
            // The previous action's mask is blocked while it runs, as the
            // kernel would have blocked it (SIGBUS itself is blocked already
            // unless that action asked for SA_NODEFER, which only matters
            // for a nested SIGBUS).
            // SAFETY: all-zero is a valid (empty) sigset_t.
            let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
            // SAFETY: valid sets; pthread_sigmask is async-signal-safe.
            unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &prev.sa_mask, &mut old) };
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
            // SAFETY: restores the mask saved above.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
            if !refaults(code) {
                // A handler that restores the default action and returns
                // (Rust's own stack-overflow handler, installed in every Rust
                // program, does so for any SIGBUS it does not own) expects
                // the fault to come back: a signal that does not must be
                // raised again to get that default action.
                // SAFETY: all-zero is a valid sigaction to read into.
                let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
                // SAFETY: a null new action only reads the current one.
                let read = unsafe { libc::sigaction(sig, std::ptr::null(), &mut now) };
                if read == 0 && now.sa_sigaction == libc::SIG_DFL {
                    // SAFETY: raise is async-signal-safe.
                    unsafe { libc::raise(sig) };
                }
            }
            return;
        }
    }
    // SAFETY: all-zero sigaction = SIG_DFL with an empty mask.
    let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    dfl.sa_sigaction = libc::SIG_DFL;
    // SAFETY: restores the default action from a valid struct.
    unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
    if !refaults(code) {
        // Sent, or an asynchronous notice such as BUS_MCEERR_AO (a memory
        // error found in the background): nothing runs again to raise it
        // anew, so deliver it again, now with the default action (blocked
        // inside this handler, so it arrives when the handler returns).
        // SAFETY: raise is async-signal-safe.
        unsafe { libc::raise(sig) };
    }
    // A fault: returning runs the access again, and the kernel raises it
    // anew, with its own address and code, under the default action.
}

/// Whether a SIGBUS of this `si_code` comes back by itself when the handler
/// returns: the synchronous faults (misaligned access, nonexistent physical
/// address, object error such as a truncated file, and a machine check on the
/// access itself) re-run the faulting instruction. A signal sent with
/// `kill`/`sigqueue` (code ≤ 0) or an asynchronous notice (BUS_MCEERR_AO,
/// or a code this list does not know) does not.
fn refaults(code: libc::c_int) -> bool {
    matches!(
        code,
        libc::BUS_ADRALN | libc::BUS_ADRERR | libc::BUS_OBJERR | libc::BUS_MCEERR_AR
    )
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
        let before = revoked_mappings();
        // SAFETY: inside the live mapping; volatile, as for a BAR.
        let q = unsafe { p.add(0x1000) }.cast::<u32>();
        // SAFETY: see above.
        let v = unsafe { q.read_volatile() };
        assert_eq!(v, u32::MAX);
        assert_eq!(revoked_mappings(), before + 1);
        // The whole mapping was replaced at once, and stays writable (a
        // doorbell write after the removal lands in a private copy).
        // SAFETY: inside the mapping, now the private all-ones copy.
        let first = unsafe { p.cast::<u32>().read_volatile() };
        assert_eq!(first, u32::MAX);
        // SAFETY: as above.
        unsafe { p.cast::<u32>().write_volatile(7) };
        // SAFETY: as above.
        let back = unsafe { p.cast::<u32>().read_volatile() };
        assert_eq!(back, 7);
        assert_eq!(revoked_mappings(), before + 1, "one fault, one replacement");
        unwatch(p);
        // SAFETY: unmaps the mapping made above.
        unsafe { libc::munmap(p.cast(), 0x2000) };
        let _ = std::fs::remove_file(&path);
    }

    /// MADV_DONTFORK leaves a hole in a fork's child where BAR0 was, and
    /// the child inherits the SIGBUS handler: the slot table naming that
    /// range is cleared in the child, so a mapping of the child's own that
    /// lands in the hole and faults (a truncated file) gets the SIGBUS it
    /// should, instead of all-ones memory over it and its neighbours.
    #[test]
    fn a_forks_child_keeps_its_own_sigbus() {
        use std::os::fd::AsRawFd;
        let dir = std::env::temp_dir();
        let pid = std::process::id();
        let bar_path = dir.join(format!("upnvme-review-bar-{pid}"));
        let child_path = dir.join(format!("upnvme-review-child-{pid}"));
        let open = |p: &std::path::Path, len: u64| {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(p)
                .unwrap();
            f.set_len(len).unwrap();
            f
        };
        let bar_file = open(&bar_path, 0x4000);
        let child_file = open(&child_path, 0x1000);
        // SAFETY: a fresh shared mapping of a file this test owns.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                0x4000,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                bar_file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let p = p.cast::<u8>();
        // What `Bar::map` does.
        assert!(watch(p, 0x4000));
        crate::memory::dont_fork(std::ptr::NonNull::new(p).unwrap(), 0x4000, "BAR0").unwrap();
        let cfd = child_file.as_raw_fd();
        // SAFETY: the child does only async-signal-safe calls, then _exit.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // The hole is unmapped in the child: MAP_FIXED_NOREPLACE checks.
            let q = p.wrapping_add(0x1000);
            // SAFETY: a new shared mapping of the child's own file at a free
            // address (refused, not replacing anything, if it is not free).
            let a = unsafe {
                libc::mmap(
                    p.cast(),
                    0x1000,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
                    cfd,
                    0,
                )
            };
            if a != p.cast() {
                // SAFETY: ends the child at once (async-signal-safe).
                unsafe { libc::_exit(3) };
            }
            // SAFETY: as above, anonymous memory beside it.
            let b = unsafe {
                libc::mmap(
                    q.cast(),
                    0x3000,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if b != q.cast() {
                // SAFETY: ends the child at once (async-signal-safe).
                unsafe { libc::_exit(4) };
            }
            // SAFETY: `q` is the child's anonymous mapping made just above.
            unsafe { q.write_volatile(0x11) };
            // SAFETY: truncates the child's own file (its mapping at `p`
            // now faults).
            unsafe { libc::ftruncate(cfd, 0) };
            // A SIGBUS of the child's own: it should die of it.
            // SAFETY: `p` is the child's file mapping made above.
            let v = unsafe { p.cast::<u32>().read_volatile() };
            // SAFETY: `q` is the child's anonymous mapping.
            let other = unsafe { q.read_volatile() };
            let code = if v == u32::MAX && other == 0xff {
                10
            } else {
                11
            };
            // SAFETY: ends the child at once (async-signal-safe).
            unsafe { libc::_exit(code) };
        }
        assert!(child > 0);
        let mut status = 0;
        // SAFETY: waits for the child made above.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        unwatch(p);
        // SAFETY: unmaps the mapping made above.
        unsafe { libc::munmap(p.cast(), 0x4000) };
        let _ = std::fs::remove_file(&bar_path);
        let _ = std::fs::remove_file(&child_path);
        let exited = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS,
            "the child was not killed by its own SIGBUS: exit code {exited:?} \
             (10: its file mapping read all ones and its anonymous page next to \
             it was replaced by all ones)"
        );
    }

    /// An asynchronous SIGBUS that is not ours (BUS_MCEERR_AO: the kernel
    /// found a memory error in the background) is not raised again by
    /// anything re-running, so the handler must deliver it again under the
    /// previous (here default) action: the process dies of it, rather than
    /// running on with the handler gone (a later revoked BAR would then kill
    /// it instead of reading all ones). In a child, as the signal is fatal.
    #[test]
    fn an_asynchronous_machine_check_keeps_its_default_action() {
        INSTALL.call_once(install);
        // SAFETY: the child does only async-signal-safe calls, then _exit.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: all-zero is a valid siginfo_t to fill in.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            info.si_signo = libc::SIGBUS;
            info.si_code = libc::BUS_MCEERR_AO;
            // SAFETY: getpid and gettid take nothing and cannot fail.
            let pid = unsafe { libc::getpid() };
            // SAFETY: as above.
            let tid = unsafe { libc::gettid() };
            // SAFETY: queues SIGBUS with that code to this thread; the
            // kernel copies `info`. A positive si_code is refused only for a
            // signal sent to another process, not to oneself.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_rt_tgsigqueueinfo,
                    pid,
                    tid,
                    libc::SIGBUS,
                    &info as *const libc::siginfo_t,
                )
            };
            // SAFETY: ends the child at once (async-signal-safe): 5 if the
            // signal could not be sent, 10 if it was survived.
            unsafe { libc::_exit(if r == 0 { 10 } else { 5 }) };
        }
        assert!(child > 0);
        let mut status = 0;
        // SAFETY: waits for the child made above.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        let exited = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS,
            "the child survived a BUS_MCEERR_AO SIGBUS: exit code {exited:?} \
             (10: survived, 5: could not send it)"
        );
    }

    #[test]
    fn only_synchronous_faults_refault() {
        for c in [
            libc::BUS_ADRALN,
            libc::BUS_ADRERR,
            libc::BUS_OBJERR,
            libc::BUS_MCEERR_AR,
        ] {
            assert!(refaults(c), "{c}");
        }
        for c in [libc::BUS_MCEERR_AO, 0, libc::SI_QUEUE, libc::SI_TKILL, 99] {
            assert!(!refaults(c), "{c}");
        }
    }
}
