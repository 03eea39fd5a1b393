//! Host memory the device can reach: hugepage mappings, their IOVA, and the
//! buffer type through which the CPU touches them.
//!
//! The rule of this module: **no plain Rust reference (`&T`, `&mut T`) ever
//! points into memory the device may write.** The CPU reads and writes it by
//! copy (`read_bytes`, `write_bytes`), by volatile access (`read_u32`,
//! `write_u64`, ...), or by an atomic acquire load or release store
//! (`load_acquire_u32`, used for the completion queue entry's phase word),
//! whose `&AtomicU32` (from `AtomicU32::from_ptr`) lives for that one access. Every access is bounds-checked and returns an error
//! instead of touching memory outside the mapping.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
#[cfg(feature = "emulation")]
use std::sync::atomic::AtomicU8;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::DmaError;

/// What backs DMA memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PageBacking {
    /// 2 MiB hugepages (the default): physically contiguous per page, never
    /// swapped or migrated; `/proc/sys/vm/nr_hugepages` must reserve them.
    #[default]
    Huge2M,
    /// 1 GiB hugepages (`/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages`).
    Huge1G,
    /// Ordinary 4 KiB pages, locked with `MAP_LOCKED`. An explicit opt-in for
    /// machines without hugepages: VFIO pins them, so DMA is still correct, but
    /// IOTLB reach is worse.
    Small4K,
}

impl PageBacking {
    /// Size of one page of this backing.
    pub fn page_size(self) -> usize {
        match self {
            PageBacking::Huge2M => 2 << 20,
            PageBacking::Huge1G => 1 << 30,
            PageBacking::Small4K => 4096,
        }
    }

    fn hugepage_dir(self) -> Option<&'static str> {
        match self {
            PageBacking::Huge2M => Some("/sys/kernel/mm/hugepages/hugepages-2048kB"),
            PageBacking::Huge1G => Some("/sys/kernel/mm/hugepages/hugepages-1048576kB"),
            PageBacking::Small4K => None,
        }
    }
}

/// A mapping of host memory the device may reach, unmapped on drop. It has no
/// IOVA of its own: see [`DmaRegion`].
///
/// Either a private anonymous mapping made here ([`HostMemory::map`]:
/// populated and locked), or a mapping an application made and handed over
/// by value (`HostMemory::adopt`, behind [`crate::RegisteredMemory`]): then
/// the `memmap2::MmapMut` lives inside this value, so nothing outside can
/// unmap it, and it is handed back only when this value is the last handle
/// (`HostMemory::into_mapping`).
///
/// It is shared (`Arc`) between the [`DmaRegion`] that maps it for the device
/// and, in tests, an emulated device that reads and writes it as the device
/// would.
pub struct HostMemory {
    ptr: NonNull<u8>,
    len: usize,
    backing: PageBacking,
    owner: Owner,
}

/// Who unmaps a [`HostMemory`]'s pages.
enum Owner {
    /// Mapped by [`HostMemory::map`]: `munmap` on drop.
    Anonymous,
    /// An application's mapping: dropping the `MmapMut` unmaps it.
    /// `inherited`: a fork inherited it before registration (MADV_DONTFORK
    /// clear), so handing it back clears the advice again.
    Mapping {
        mapping: memmap2::MmapMut,
        inherited: bool,
    },
    /// The application's mapping was handed back ([`HostMemory::into_mapping`]);
    /// nothing to unmap.
    Returned,
}

// SAFETY: `HostMemory` owns its mapping exclusively (made here, or the
// application's `MmapMut` moved in by value and kept in `owner` until the
// last handle is gone) and never hands out a reference into it. Without the
// `emulation` feature none of its methods touches the memory (the host's
// accesses are `DmaBuffer`'s, through a buffer one thread owns); with it, the
// device-side accessors are atomic, and their races are the emulated
// device's to avoid (see that `impl` block).
unsafe impl Send for HostMemory {}
// SAFETY: as for `Send`: every method takes `&self`, and only the
// `emulation` accessors touch the memory, atomically and within bounds.
unsafe impl Sync for HostMemory {}

impl fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMemory")
            .field("vaddr", &format_args!("{:#x}", self.ptr.as_ptr() as usize))
            .field("len", &self.len)
            .field("backing", &self.backing)
            .finish()
    }
}

/// `madvise(MADV_DONTFORK)` on a mapping the device reads or writes (DMA
/// memory, BAR0): a child process made by `fork` does not inherit it.
/// Without it, the private pages would be shared copy-on-write with the
/// child, and the first store by either side after the fork could move the
/// parent's page away from the physical page the IOMMU maps (kernels since
/// 5.8 copy pinned pages eagerly for the child instead — at the price of
/// copying all of the DMA memory, hugepages included, into every child, which
/// may fail for want of free hugepages); a child writing BAR0 would ring the
/// parent's doorbells. A child cannot use the driver either way: VFIO
/// container and device belong to the process that opened them.
pub(crate) fn dont_fork(ptr: NonNull<u8>, len: usize, what: &str) -> Result<(), DmaError> {
    advise_fork(ptr, len, false, what)
}

/// MADV_DONTFORK (`inherit` false) or MADV_DOFORK (`inherit` true) of
/// `ptr..ptr + len`, a mapping this crate made or holds by value (an
/// adopted `MmapMut`, including the rest of its last hugepage).
pub(crate) fn advise_fork(
    ptr: NonNull<u8>,
    len: usize,
    inherit: bool,
    what: &str,
) -> Result<(), DmaError> {
    let (advice, name) = if inherit {
        (libc::MADV_DOFORK, "MADV_DOFORK")
    } else {
        (libc::MADV_DONTFORK, "MADV_DONTFORK")
    };
    // SAFETY: `ptr..ptr + len` lies in one mapping this crate owns (see
    // above); the advice changes only whether a future fork copies it — no
    // page, permission or address changes for this process.
    let rc = unsafe { libc::madvise(ptr.as_ptr().cast(), len, advice) };
    if rc != 0 {
        return Err(DmaError::last_os(format!(
            "madvise({name}) of {len} bytes of {what}"
        )));
    }
    Ok(())
}

/// The machine's physical memory in bytes (`None` when the kernel does not
/// say).
fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf reads a system value; it has no memory effects and no
    // preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let (pages, page) = (u64::try_from(pages).ok()?, u64::try_from(page).ok()?);
    pages.checked_mul(page).filter(|&b| b > 0)
}

impl HostMemory {
    /// Maps `len` bytes (rounded up to the backing's page size), zeroed,
    /// populated and locked.
    pub fn map(len: usize, backing: PageBacking) -> Result<Arc<HostMemory>, DmaError> {
        if len == 0 {
            return Err(DmaError::InvalidAllocation(
                "zero-length mapping: ask for at least 1 byte".into(),
            ));
        }
        let page = backing.page_size();
        let len = len
            .checked_next_multiple_of(page)
            .ok_or_else(|| DmaError::InvalidAllocation(crate::alloc::too_large(len, page)))?;
        // Pinned RAM, populated at once: more than the machine has would
        // only end in the OOM killer (4 KiB pages as root, where
        // RLIMIT_MEMLOCK does not stop it) or in advice to reserve more
        // hugepages than there is memory.
        if let Some(ram) = physical_memory()
            && len as u64 > ram
        {
            return Err(DmaError::InvalidAllocation(format!(
                "{len} bytes is more than this machine's memory ({ram} bytes): DMA memory is \
                 pinned RAM; ask for less (a large transfer can go in parts, or as a vector \
                 of smaller buffers)"
            )));
        }
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
        match backing {
            PageBacking::Huge2M => flags |= libc::MAP_HUGETLB | libc::MAP_HUGE_2MB,
            PageBacking::Huge1G => flags |= libc::MAP_HUGETLB | libc::MAP_HUGE_1GB,
            PageBacking::Small4K => flags |= libc::MAP_LOCKED,
        }
        // SAFETY: an anonymous mapping at an address of the kernel's choosing
        // cannot alias any existing Rust object; the result is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let err = std::io::Error::last_os_error();
            return Err(match backing.hugepage_dir() {
                // ENOMEM: too few free hugepages of that size. Anything else
                // (EINVAL: the kernel has no pages of that size) is not cured
                // by reserving more.
                Some(dir) if err.raw_os_error() == Some(libc::ENOMEM) => {
                    hugepage_error(len, page, dir)
                }
                Some(dir) => DmaError::Sys {
                    what: format!(
                        "mmap of {len} bytes of {} KiB hugepages (does {dir} exist? the kernel \
                         may not offer pages of that size; choose another PageBacking)",
                        page / 1024
                    ),
                    os_error: err,
                },
                None => DmaError::Sys {
                    what: format!("mmap of {len} locked bytes (check `ulimit -l`)"),
                    os_error: err,
                },
            });
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| DmaError::Sys {
            what: "mmap returned a null mapping".into(),
            os_error: std::io::Error::from(std::io::ErrorKind::Other),
        })?;
        // Owned from here: dropping `mem` unmaps on every error path below.
        let mem = Arc::new(HostMemory {
            ptr,
            len,
            backing,
            owner: Owner::Anonymous,
        });
        dont_fork(ptr, len, "DMA memory")?;
        Ok(mem)
    }

    /// Takes ownership of an application's mapping. The caller
    /// ([`crate::RegisteredMemory`]) has checked that it is non-empty, starts
    /// on a 4 KiB page and is whole pages long; `backing` is what the kernel
    /// says backs it.
    ///
    /// From here on the only way to the mapping's bytes is this value's
    /// bounds-checked accessors (and the device's DMA): the `MmapMut` is not
    /// reachable, so no `&[u8]`/`&mut [u8]` of it can exist while the device
    /// may write it.
    /// `inherited`: whether a fork inherited the mapping before its
    /// registration advised MADV_DONTFORK (restored when handed back).
    pub(crate) fn adopt(
        mut mapping: memmap2::MmapMut,
        backing: PageBacking,
        inherited: bool,
    ) -> Result<Arc<HostMemory>, memmap2::MmapMut> {
        // A raw pointer taken from the mapping. memmap2 gives `MmapMut` no
        // raw-pointer accessor, so this goes through its `DerefMut`: a
        // `&mut [u8]` over the mapping lives for this one call, before the
        // mapping is registered with the IOMMU (no device can write it yet),
        // and none is formed after. Moving the `MmapMut` below moves its
        // handle, not the mapped pages, so the pointer stays valid for as
        // long as `owner` holds it.
        let Some(ptr) = NonNull::new(mapping.as_mut_ptr()) else {
            return Err(mapping);
        };
        let len = mapping.len();
        Ok(Arc::new(HostMemory {
            ptr,
            len,
            backing,
            owner: Owner::Mapping { mapping, inherited },
        }))
    }

    /// Hands an adopted application mapping back, if `this` is its last
    /// handle (otherwise `this` comes back unchanged). Every pointer this
    /// memory's users derived from it died with their handles, so the
    /// application may form references into it again. A mapping made by
    /// [`HostMemory::map`] is never handed out.
    pub(crate) fn into_mapping(this: Arc<HostMemory>) -> Result<memmap2::MmapMut, Arc<HostMemory>> {
        if !matches!(this.owner, Owner::Mapping { .. }) {
            return Err(this);
        }
        let mut mem = Arc::try_unwrap(this)?;
        match std::mem::replace(&mut mem.owner, Owner::Returned) {
            Owner::Mapping { mapping, inherited } => {
                // As the application mapped it: inherited by a fork again
                // if it was before (registration set MADV_DONTFORK on the
                // whole VMA; an application that had set it keeps it).
                // Best effort: a refusal leaves a mapping a child does not
                // inherit, nothing worse.
                if inherited {
                    let _ = advise_fork(
                        mem.ptr,
                        mem.len.next_multiple_of(mem.backing.page_size()),
                        true,
                        "the registered mapping",
                    );
                }
                Ok(mapping)
            }
            // Checked above, and `owner` never changes while shared.
            other => {
                mem.owner = other;
                Err(Arc::new(mem))
            }
        }
    }

    /// The IOVA alignment that lets the IOMMU use its largest pages for this
    /// memory: the backing's page size, at most 2 MiB, and no more than the
    /// address and length are aligned to.
    pub fn iova_align(&self) -> usize {
        let natural = 1usize << (self.vaddr() | self.len).trailing_zeros().min(21);
        self.backing
            .page_size()
            .min(2 << 20)
            .min(natural)
            .max(crate::PAGE_SIZE)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: mappings are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What backs this memory.
    pub fn backing(&self) -> PageBacking {
        self.backing
    }

    /// The process virtual address, for handing to the IOMMU (VFIO_IOMMU_MAP_DMA).
    pub fn vaddr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Start of the mapping.
    #[inline(always)]
    fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

/// The device side of an emulated controller (feature `emulation`, for
/// tests): an in-memory device model reads and writes the memory it was
/// given through these, as a real device does by DMA.
///
/// They are `unsafe`: a device emulated in Rust is inside Rust's memory
/// model, where a write may race only with an atomic access of its own size.
/// A real device's DMA is not; the driver's accesses (volatile copies and
/// stores, 32-bit atomics for the words both sides poll) are right for it,
/// and an emulated device is sound only if it touches memory when the
/// driver's protocol hands it over.
///
/// # Safety (every method)
///
/// No access by another thread to any of the bytes accessed may race with
/// this one, except a 32-bit atomic access of the same aligned word racing
/// with [`HostMemory::load_acquire_u32`] or [`HostMemory::store_release_u32`].
/// An emulated device meets this by following the protocol: submission
/// queue entries only after their doorbell, a command's data and PRP/SGL
/// lists only while the command is in flight, completion queue slots only
/// after the host released them (CQ head), and 32-bit atomics for the words
/// both sides access at once (shadow doorbells, event indexes, the
/// completion queue entry's phase dword).
#[cfg(feature = "emulation")]
impl HostMemory {
    #[inline(always)]
    fn check(&self, offset: usize, len: usize, align: usize) -> Result<*mut u8, DmaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len && offset.is_multiple_of(align) => {
                // The pointer arithmetic itself is safe (wrapping_add); it stays
                // inside the mapping because of the check above.
                Ok(self.ptr.as_ptr().wrapping_add(offset))
            }
            Some(end) if end <= self.len => Err(DmaError::Misaligned {
                what: "DMA mapping",
                offset,
                len,
                align,
            }),
            _ => Err(DmaError::OutOfBounds {
                what: "DMA mapping",
                offset,
                len,
                size: self.len,
            }),
        }
    }

    /// Atomic 32-bit load with acquire ordering: every read of this memory that
    /// follows observes what the device wrote before this word. Used for the
    /// completion queue entry's status/phase dword before reading the rest.
    #[inline]
    ///
    /// # Safety
    ///
    /// As for every method of this block (above).
    pub unsafe fn load_acquire_u32(&self, offset: usize) -> Result<u32, DmaError> {
        let p = self.check(offset, 4, 4)?;
        // SAFETY: `p` is inside the live mapping, 4-byte aligned, and valid for
        // the lifetime of `self`; the `&AtomicU32` exists only for this one
        // load. Racing accesses are 32-bit atomics (the caller's contract).
        let v = unsafe { AtomicU32::from_ptr(p.cast::<u32>()) }.load(Ordering::Acquire);
        crate::barrier::dma_rmb();
        Ok(u32::from_le(v))
    }

    /// Atomic 32-bit store with release ordering: all earlier stores to this
    /// memory are visible before it (shadow doorbell updates).
    #[inline]
    ///
    /// # Safety
    ///
    /// As for every method of this block (above).
    pub unsafe fn store_release_u32(&self, offset: usize, value: u32) -> Result<(), DmaError> {
        let p = self.check(offset, 4, 4)?;
        crate::barrier::dma_wmb();
        // SAFETY: as in `load_acquire_u32`: in bounds, aligned, and racing
        // accesses are 32-bit atomics (the caller's contract).
        unsafe { AtomicU32::from_ptr(p.cast::<u32>()) }.store(value.to_le(), Ordering::Release);
        Ok(())
    }

    /// Copies `src` into the mapping at `offset` (byte by byte, atomically).
    ///
    /// # Safety
    ///
    /// As for every method of this block (above).
    pub unsafe fn write_bytes(&self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        let p = self.check(offset, src.len(), 1)?;
        for (i, &b) in src.iter().enumerate() {
            // SAFETY: `p + i` is inside the live mapping (the whole range was
            // checked); the `&AtomicU8` lives for this one store; nothing
            // races with it (the caller's contract).
            unsafe { AtomicU8::from_ptr(p.wrapping_add(i)) }.store(b, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Copies from the mapping at `offset` into `dst` (byte by byte, atomically).
    ///
    /// # Safety
    ///
    /// As for every method of this block (above).
    pub unsafe fn read_bytes(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        let p = self.check(offset, dst.len(), 1)?;
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: as in `write_bytes`.
            *d = unsafe { AtomicU8::from_ptr(p.wrapping_add(i)) }.load(Ordering::Relaxed);
        }
        Ok(())
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // The IOMMU mapping (if any) was removed first by `DmaRegion`'s drop,
        // which holds an `Arc` to this memory.
        match self.owner {
            // SAFETY: `ptr`/`len` describe exactly the mapping created in
            // `map`, and no reference into it can outlive `self`.
            Owner::Anonymous => unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) },
            // The application's mapping: the `MmapMut` field unmaps it when
            // it is dropped right after this; no pointer into it outlives
            // `self`.
            Owner::Mapping { .. } | Owner::Returned => 0,
        };
    }
}

fn hugepage_error(bytes: usize, page: usize, dir: &str) -> DmaError {
    let read = |f: &str| {
        std::fs::read_to_string(format!("{dir}/{f}"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let free = read("free_hugepages");
    let total = read("nr_hugepages");
    let need = bytes.div_ceil(page) as u64;
    DmaError::HugepagesUnavailable {
        bytes,
        page_kib: page / 1024,
        free,
        total,
        // Enough for this request on top of what is free now; at least one
        // more page than reserved (the free count may already have been
        // enough, the pages fragmented or taken meanwhile).
        suggest: total + need.saturating_sub(free).max(1),
        sysctl: format!("{dir}/nr_hugepages"),
    }
}

/// What a device may do with a mapping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceAccess {
    /// Read and write (data buffers, completion queues, anything the
    /// controller writes).
    #[default]
    ReadWrite,
    /// Read only (submission queues, PRP Lists, SGL segments): a device write
    /// is an IOMMU fault (VFIO_DMA_MAP_FLAG_READ without _WRITE).
    ReadOnly,
}

/// Something that makes [`HostMemory`] reachable by a device and returns its
/// IOVA: the VFIO container, or an emulated controller in tests.
///
/// Only a [`DmaRegion`] removes a mapping, when its last handle goes: the
/// [`Unmapping`] that [`DmaMapper::unmap`] takes cannot be made outside this
/// crate, nor kept beyond the call, so no other code can unmap memory a
/// buffer still uses (its IOVA would be handed out again, and two buffers
/// would share one device address).
///
/// # Safety
///
/// The crate hands memory back to safe code on the mapper's word: an
/// application's registered memory ([`crate::RegisteredMemory`]) returns
/// as a plain `MmapMut` when its registration is refused or undone, and
/// freed pages go back to the allocator. An implementation therefore
/// promises, for memory a device can reach through it:
/// - [`DmaMapper::map`] and [`DmaMapper::map_device_read_only`] that return
///   `Err` leave nothing mapped and keep no handle of `mem`;
/// - a live mapping's IOVA range overlaps no other live mapping's;
/// - [`DmaMapper::unmap`] returns `true` only when no device can reach the
///   memory any more and the mapper keeps no handle (`Arc`) of it, and it
///   removes only a mapping it made ([`Unmapping::made_by`]).
///
/// A mapper with no device behind it (a test's) meets this trivially.
///
/// ```compile_fail
/// // A mapper is an `unsafe impl`: safe code cannot promise the above (one
/// // that said "unmapped" while the IOMMU still mapped the memory would get
/// // registered memory handed back under a live device mapping).
/// use std::sync::Arc;
/// use upnvme_dma::{DmaError, DmaMapper, Unmapping, memory::HostMemory};
/// struct Liar;
/// impl DmaMapper for Liar {
///     fn map(&self, _mem: &Arc<HostMemory>) -> Result<u64, DmaError> {
///         Ok(0x1000_0000)
///     }
///     fn unmap(&self, _mapping: Unmapping<'_>) -> bool {
///         true
///     }
/// }
/// ```
pub unsafe trait DmaMapper: Send + Sync {
    /// Maps `mem` for device reads and writes; returns the IOVA of its first
    /// byte. A live mapping's IOVA range must not overlap any other live
    /// mapping's.
    fn map(&self, mem: &Arc<HostMemory>) -> Result<u64, DmaError>;
    /// Maps `mem` for device reads only (a device write to it is an IOMMU
    /// fault): for memory the controller only ever reads — submission
    /// queues, PRP Lists, SGL segments. A device that rewrote such memory
    /// could change a command after the driver checked it (the CID of an
    /// SQE not yet announced, a list's addresses). The default maps it
    /// like [`DmaMapper::map`], for a mapper that cannot restrict access.
    fn map_device_read_only(&self, mem: &Arc<HostMemory>) -> Result<u64, DmaError> {
        self.map(mem)
    }
    /// Removes the mapping made by [`DmaMapper::map`] or
    /// [`DmaMapper::map_device_read_only`]. When it returns, the
    /// device can no longer reach the memory, and the mapper holds no
    /// handle (`Arc`) of it any more: an application's registered memory is
    /// handed back only when nothing else holds it
    /// ([`crate::RegisteredMemory::unregister`]). Returns whether the
    /// mapping is gone; when the mapper cannot be sure (the IOMMU refused),
    /// it returns false and keeps the IOVA range reserved (never hands it
    /// out again), and the memory is never handed back to an application.
    fn unmap(&self, mapping: Unmapping<'_>) -> bool;
    /// The IOVA ranges this mapper allocates from (empty when it does not
    /// know them): lets a registration that can never fit be refused with
    /// a message saying so.
    fn iova_ranges(&self) -> Vec<crate::IovaRange> {
        Vec::new()
    }
}

/// The mapping [`DmaMapper::unmap`] removes: made only by this crate, when
/// the last handle of a [`DmaRegion`] goes away, and valid for that call
/// only (its lifetime): a mapper cannot keep one and hand it, later, to
/// another mapper that happens to live at the same address.
///
/// ```compile_fail
/// // Code outside the crate cannot name a mapping to remove.
/// let m = upnvme_dma::Unmapping { iova: 0x1000, len: 4096 };
/// ```
///
/// ```compile_fail
/// // Nor keep one beyond the call.
/// use std::sync::Mutex;
/// use upnvme_dma::Unmapping;
/// static KEPT: Mutex<Option<Unmapping<'static>>> = Mutex::new(None);
/// fn keep(m: Unmapping<'_>) {
///     *KEPT.lock().unwrap() = Some(m);
/// }
/// ```
#[derive(Debug)]
pub struct Unmapping<'a> {
    iova: u64,
    len: usize,
    /// Address of the mapper that made the mapping (the data pointer of
    /// the region's `Arc<dyn DmaMapper>`), alive for the whole call.
    mapper: usize,
    /// Ties the value to the region's drop that made it.
    call: std::marker::PhantomData<&'a ()>,
}

impl Unmapping<'_> {
    /// Whether `mapper` made this mapping. A mapper must refuse (return
    /// false from [`DmaMapper::unmap`]) an `Unmapping` another mapper
    /// handed on: one mapper's region could otherwise remove a live mapping
    /// of another at the same IOVA, and that IOVA would be handed out again
    /// while a buffer still uses it.
    pub fn made_by<M: DmaMapper + ?Sized>(&self, mapper: &M) -> bool {
        self.mapper == (mapper as *const M).cast::<()>() as usize
    }

    /// IOVA of the mapping's first byte (what [`DmaMapper::map`] returned).
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Length of the mapping in bytes (the memory's length).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: mappings are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

struct RegionInner {
    mem: Arc<HostMemory>,
    iova: u64,
    mapper: Arc<dyn DmaMapper>,
    /// `unmap_into_memory` removed the mapping already.
    unmapped: bool,
}

impl RegionInner {
    /// Removes the device's mapping; whether it is gone.
    fn unmap(&mut self) -> bool {
        self.unmapped = true;
        self.mapper.unmap(Unmapping {
            iova: self.iova,
            len: self.mem.len(),
            mapper: Arc::as_ptr(&self.mapper).cast::<()>() as usize,
            call: std::marker::PhantomData,
        })
    }
}

impl Drop for RegionInner {
    fn drop(&mut self) {
        // The device must lose access before the memory is returned to the
        // OS. If the IOMMU refuses, the pages stay pinned for the device by
        // the kernel; the process's mapping of them goes, and no Rust value
        // refers to them any more.
        if !self.unmapped {
            let _ = self.unmap();
        }
    }
}

/// Host memory mapped for the device at a known IOVA; unmapped (IOMMU first,
/// then the memory) when the last handle goes away.
#[derive(Clone)]
pub struct DmaRegion {
    inner: Arc<RegionInner>,
}

impl fmt::Debug for DmaRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaRegion")
            .field("iova", &format_args!("{:#x}", self.inner.iova))
            .field("len", &self.inner.mem.len())
            .finish()
    }
}

/// Why an IOVA a mapper returned for `len` bytes cannot be used: not
/// page-aligned (the PRP and queue arithmetic relies on it), or its end not
/// representable (`iova + len` would overflow).
fn unusable_iova(iova: u64, len: usize) -> Option<DmaError> {
    let aligned = iova.is_multiple_of(crate::PAGE_SIZE as u64);
    if aligned && iova.checked_add(len as u64).is_some() {
        return None;
    }
    Some(DmaError::InvalidAllocation(format!(
        "the DMA mapper returned IOVA {iova:#x} for {len} bytes: {}",
        if aligned {
            "the mapping would run past the end of the address space"
        } else {
            "not aligned to a 4 KiB page"
        }
    )))
}

impl DmaRegion {
    /// Maps `len` bytes of `backing` memory and makes it device-visible through
    /// `mapper`.
    pub fn new(
        len: usize,
        backing: PageBacking,
        mapper: Arc<dyn DmaMapper>,
    ) -> Result<DmaRegion, DmaError> {
        DmaRegion::new_with(len, backing, mapper, DeviceAccess::ReadWrite)
    }

    /// Like [`DmaRegion::new`], with the device's access to the region
    /// chosen.
    pub fn new_with(
        len: usize,
        backing: PageBacking,
        mapper: Arc<dyn DmaMapper>,
        access: DeviceAccess,
    ) -> Result<DmaRegion, DmaError> {
        let mem = HostMemory::map(len, backing)?;
        let iova = match access {
            DeviceAccess::ReadWrite => mapper.map(&mem)?,
            DeviceAccess::ReadOnly => mapper.map_device_read_only(&mem)?,
        };
        let region = DmaRegion {
            inner: Arc::new(RegionInner {
                mem,
                iova,
                mapper,
                unmapped: false,
            }),
        };
        match unusable_iova(iova, region.len()) {
            // Dropping the region removes the mapping again.
            Some(e) => Err(e),
            None => Ok(region),
        }
    }

    /// IOVA of the first byte.
    pub fn iova(&self) -> u64 {
        self.inner.iova
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.mem.len()
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.inner.mem.is_empty()
    }

    /// The host memory behind the region.
    pub fn memory(&self) -> &Arc<HostMemory> {
        &self.inner.mem
    }

    /// Which IOMMU mapping the region lives in: the address of its
    /// [`DmaMapper`]. Two regions have the same domain exactly when one
    /// mapper (one VFIO container, one device's address space) maps both;
    /// the region keeps its mapper alive, so the value is not reused while
    /// it lives.
    pub fn domain(&self) -> usize {
        Arc::as_ptr(&self.inner.mapper).cast::<()>() as usize
    }

    /// Whether `other` is a handle of this same region (not merely one at
    /// the same IOVA).
    pub(crate) fn same(&self, other: &DmaRegion) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Makes existing host memory device-visible through `mapper`.
    pub(crate) fn map_memory(
        mem: Arc<HostMemory>,
        mapper: Arc<dyn DmaMapper>,
    ) -> Result<DmaRegion, (DmaError, Arc<HostMemory>)> {
        match mapper.map(&mem) {
            Ok(iova) => match unusable_iova(iova, mem.len()) {
                None => Ok(DmaRegion {
                    inner: Arc::new(RegionInner {
                        mem,
                        iova,
                        mapper,
                        unmapped: false,
                    }),
                }),
                Some(e) => {
                    let gone = mapper.unmap(Unmapping {
                        iova,
                        len: mem.len(),
                        mapper: Arc::as_ptr(&mapper).cast::<()>() as usize,
                        call: std::marker::PhantomData,
                    });
                    if !gone {
                        // Still mapped: one handle is never dropped, so the
                        // memory can never be handed back to the application.
                        std::mem::forget(mem.clone());
                    }
                    Err((e, mem))
                }
            },
            Err(e) => Err((e, mem)),
        }
    }

    /// If this is the region's last handle: removes the device's mapping
    /// (the IOMMU's, through the mapper) and returns the host memory, which
    /// the device can no longer reach — or `None` when the mapper could not
    /// confirm the mapping gone (the memory must then never be handed back
    /// to an application; it is dropped). Otherwise the region comes back.
    pub(crate) fn unmap_into_memory(self) -> Result<Option<Arc<HostMemory>>, DmaRegion> {
        let mut inner = Arc::try_unwrap(self.inner).map_err(|inner| DmaRegion { inner })?;
        let gone = inner.unmap();
        let mem = inner.mem.clone();
        // `RegionInner`'s drop drops its own `Arc` of the memory.
        drop(inner);
        Ok(gone.then_some(mem))
    }
}

/// Called when a [`DmaBuffer`] is dropped with its region, offset and length.
pub type ReleaseFn = Box<dyn FnOnce(&DmaRegion, usize, usize) + Send + Sync>;

/// A page-aligned slice of a [`DmaRegion`]: the unit of DMA memory the driver
/// and its users work with (queues, PRP lists, I/O data).
///
/// Every page of a buffer has a known IOVA ([`DmaBuffer::iova_at`]); the whole
/// buffer is contiguous in IOVA space. Offsets in all accessors are relative to
/// the start of the buffer and bounds-checked against its length.
///
/// The handle is one pointer (the state lives in one heap block made when the
/// buffer is made), so moving a buffer into a command and back out with its
/// completion copies 8 bytes and touches no reference count; `Option<DmaBuffer>`
/// is 8 bytes too.
///
/// `Send` but not `Sync`: its copies and volatile accesses are not atomic, so
/// a buffer has one user at a time (it moves between threads with its
/// command). Memory several threads share is a [`crate::SharedWords`].
///
/// ```compile_fail
/// fn shared<T: Sync>(_: &T) {}
/// # fn f(b: &upnvme_dma::DmaBuffer) {
/// shared(b); // error: `DmaBuffer` cannot be shared between threads
/// # }
/// ```
pub struct DmaBuffer {
    inner: Box<BufferInner>,
}

struct BufferInner {
    /// The buffer's first byte inside `mem` (`mem.base() + offset`).
    base: NonNull<u8>,
    len: usize,
    /// IOVA of the first byte (`region.iova() + offset`).
    iova: u64,
    /// Which [`crate::DmaPool`] the buffer belongs to (0: none).
    pool: u64,
    /// The region's [`DmaRegion::domain`], kept here for the I/O path's
    /// one-load check.
    domain: usize,
    offset: usize,
    mem: Arc<HostMemory>,
    region: DmaRegion,
    release: Option<ReleaseFn>,
    /// The buffer this one is carved from (pool buffers keep their slab's
    /// pages out of the allocator until the last of them is gone).
    parent: Option<Arc<DmaPages>>,
}

// SAFETY: `base` points into `mem`, which the buffer keeps alive (`Arc`);
// it is never turned into a Rust reference, and every access through it is
// one of `DmaBuffer`'s bounds-checked volatile, atomic or copy operations (or
// of the ring and list accessors that own a buffer), made by the one thread
// that holds the buffer (`DmaBuffer` is not `Sync`), so moving it to another
// thread moves that access. The other fields are `Send` themselves.
unsafe impl Send for BufferInner {}
const _: () = {
    const fn send<T: Send>() {}
    send::<DmaBuffer>();
};

// Not `Sync`: `DmaBuffer`'s copies and volatile accesses are not atomic, so
// two threads holding `&DmaBuffer` could race on the same bytes. One owner
// thread at a time (the buffer moves, with its command, between threads);
// memory several threads share goes through `SharedWords` (atomic only).

impl fmt::Debug for DmaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBuffer")
            .field("iova", &format_args!("{:#x}", self.iova()))
            .field("len", &self.inner.len)
            .finish()
    }
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release(&self.region, self.offset, self.len);
        }
    }
}

/// The pages of a DMA buffer, kept out of the allocator (and mapped for the
/// device) without any way to read or write them: what is quarantined while
/// the device may still access memory, and what the pieces of a split buffer
/// or a pool share. Dropping it returns the pages.
pub struct DmaPages {
    _inner: Box<BufferInner>,
}

// SAFETY: a `DmaPages` gives no access to the memory at all (no method reads
// or writes it), so sharing it between threads cannot race; dropping it runs
// the allocator's release, which is `Send + Sync`.
unsafe impl Sync for DmaPages {}

impl fmt::Debug for DmaPages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaPages")
            .field("iova", &format_args!("{:#x}", self._inner.iova))
            .field("len", &self._inner.len)
            .finish()
    }
}

/// The error of an in-bounds access at a misaligned address (cold: off
/// the accessors' path).
#[cold]
#[inline(never)]
fn misaligned(offset: usize, len: usize, align: usize) -> DmaError {
    DmaError::Misaligned {
        what: "DMA buffer",
        offset,
        len,
        align,
    }
}

impl DmaBuffer {
    /// A buffer over `len` bytes of `region` at `offset`; `release` runs on drop
    /// (the allocator's way to take the pages back). Crate-private: a second
    /// buffer over memory another handle (or the device) owns would alias it;
    /// outside this crate buffers come from the allocator, a pool or
    /// [`DmaBuffer::split`].
    pub(crate) fn new(
        region: DmaRegion,
        offset: usize,
        len: usize,
        release: Option<ReleaseFn>,
    ) -> Result<DmaBuffer, DmaError> {
        if offset.checked_add(len).is_none_or(|end| end > region.len()) || len == 0 {
            return Err(DmaError::OutOfBounds {
                what: "DMA region",
                offset,
                len,
                size: region.len(),
            });
        }
        let mem = region.memory().clone();
        // Inside the mapping (checked above): wrapping_add is exact here.
        let base = NonNull::new(mem.base().wrapping_add(offset)).ok_or(DmaError::OutOfBounds {
            what: "DMA region",
            offset,
            len,
            size: region.len(),
        })?;
        Ok(DmaBuffer {
            inner: Box::new(BufferInner {
                base,
                len,
                iova: region.iova() + offset as u64,
                pool: 0,
                domain: region.domain(),
                offset,
                mem,
                region,
                release,
                parent: None,
            }),
        })
    }

    /// A view of `len` bytes at `offset` of `parent`, keeping `parent` (and
    /// so its pages) alive; tagged as belonging to pool `pool`.
    pub(crate) fn carve(
        parent: &Arc<DmaPages>,
        offset: usize,
        len: usize,
        pool: u64,
    ) -> Result<DmaBuffer, DmaError> {
        let p = &parent._inner;
        let start = p.offset.checked_add(offset);
        if offset.checked_add(len).is_none_or(|end| end > p.len) || len == 0 || start.is_none() {
            return Err(DmaError::OutOfBounds {
                what: "DMA buffer",
                offset,
                len,
                size: p.len,
            });
        }
        let mut b = DmaBuffer::new(p.region.clone(), p.offset + offset, len, None)?;
        b.inner.pool = pool;
        b.inner.parent = Some(parent.clone());
        Ok(b)
    }

    /// Splits the buffer into consecutive, disjoint buffers of `len` bytes
    /// (the last one shorter when `len` does not divide the length), in
    /// address order. Each keeps the original's pages alive; they return to
    /// the allocator when the last piece is dropped. Since the pieces do not
    /// overlap, each can be owned by a different command at the same time
    /// (e.g. fio's one I/O memory area, one piece per `io_u`).
    pub fn split(self, len: usize) -> Result<Vec<DmaBuffer>, DmaError> {
        if len == 0 {
            return Err(DmaError::InvalidAllocation(
                "a DMA buffer split into pieces of 0 bytes".into(),
            ));
        }
        let total = self.inner.len;
        let parent = Arc::new(self.into_pages());
        (0..total.div_ceil(len))
            .map(|i| {
                let off = i * len;
                DmaBuffer::carve(&parent, off, len.min(total - off), 0)
            })
            .collect()
    }

    /// The address of the buffer's first byte in this process, for code that
    /// must hand the memory to a foreign API (the C ABI crate). Obtaining it
    /// is safe; reading or writing through it is `unsafe` and sound only while
    /// this handle is held (not moved into a command) and within `len()`.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.base.as_ptr()
    }

    /// The pool this buffer belongs to (0: none).
    #[inline]
    pub(crate) fn pool_id(&self) -> u64 {
        self.inner.pool
    }

    /// A [`DmaPages`] that keeps this buffer's pages out of the allocator
    /// (and mapped) until it is dropped, whatever happens to the buffer:
    /// the pages' ownership becomes shared between `self` and the returned
    /// value, and they go back only when both are gone. `DmaPages` gives no
    /// access to the memory, so this makes no second accessor of it. Used
    /// to quarantine memory the device may still access while its accessor
    /// (a queue's ring, a pair's PRP List pages) goes away.
    ///
    /// ```
    /// # fn f(a: &upnvme_dma::DmaAllocator) -> Result<(), upnvme_dma::DmaError> {
    /// let mut buf = a.alloc(4096)?;
    /// drop(buf.detach_pages());
    /// // Still this buffer's: the allocator hands out other pages.
    /// assert_ne!(a.alloc(4096)?.iova(), buf.iova());
    /// # Ok(()) }
    /// ```
    pub fn detach_pages(&mut self) -> DmaPages {
        let i = &mut *self.inner;
        let view = |release, parent| BufferInner {
            base: i.base,
            len: i.len,
            iova: i.iova,
            pool: 0,
            domain: i.domain,
            offset: i.offset,
            mem: i.mem.clone(),
            region: i.region.clone(),
            release,
            parent,
        };
        // The pages' owner (the allocator's release and the parent this
        // buffer kept alive), shared by the buffer and the returned pages.
        let owner = Arc::new(DmaPages {
            _inner: Box::new(view(i.release.take(), i.parent.take())),
        });
        let pages = DmaPages {
            _inner: Box::new(view(None, Some(owner.clone()))),
        };
        i.parent = Some(owner);
        // No longer a pool's: its pages are kept (quarantined) by `pages`,
        // and a pool would hand them to its next user.
        i.pool = 0;
        pages
    }

    /// Makes this buffer keep `parent` alive until it is dropped (after its
    /// memory and region handles: `parent` is `BufferInner`'s last field).
    /// [`crate::RegisteredMemory`] counts its live buffers by its root's
    /// reference count.
    pub(crate) fn with_parent(mut self, parent: Arc<DmaPages>) -> DmaBuffer {
        self.inner.parent = Some(parent);
        self
    }

    /// The buffer's pages without access to them: they go back to their
    /// allocator when the returned value is dropped.
    pub fn into_pages(self) -> DmaPages {
        DmaPages { _inner: self.inner }
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Always false: buffers are never empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// IOVA of the first byte.
    #[inline]
    pub fn iova(&self) -> u64 {
        self.inner.iova
    }

    /// The IOMMU mapping the buffer lives in ([`DmaRegion::domain`]): a
    /// device reaches the buffer at [`DmaBuffer::iova`] only if it uses
    /// this mapping. Buffers of two controllers have different domains.
    #[inline]
    pub fn domain(&self) -> usize {
        self.inner.domain
    }

    /// IOVA of byte `offset` (which may equal `len()`, one past the end).
    #[inline]
    pub fn iova_at(&self, offset: usize) -> Option<u64> {
        (offset <= self.inner.len).then(|| self.iova() + offset as u64)
    }

    /// Pointer to byte `offset` for an access of `len` bytes aligned to
    /// `align` (a power of two): every accessor's single bounds check. It
    /// is against the buffer only; the buffer lies inside its mapping
    /// (`new` checks `offset + len <= region.len()`, the mapping's length),
    /// so no second check against the mapping is needed.
    #[inline(always)]
    pub(crate) fn ptr(&self, offset: usize, len: usize, align: usize) -> Result<*mut u8, DmaError> {
        let i = &*self.inner;
        match offset.checked_add(len) {
            Some(end) if end <= i.len => {
                let p = i.base.as_ptr().wrapping_add(offset);
                if (p as usize) & (align - 1) == 0 {
                    // Stays inside the mapping (see above); wrapping_add is exact.
                    return Ok(p);
                }
                Err(misaligned(offset, len, align))
            }
            _ => Err(DmaError::OutOfBounds {
                what: "DMA buffer",
                offset,
                len,
                size: i.len,
            }),
        }
    }

    /// Volatile little-endian 16-bit read.
    #[inline]
    pub fn read_u16(&self, offset: usize) -> Result<u16, DmaError> {
        let p = self.ptr(offset, 2, 2)?;
        // SAFETY: `p` is inside the live mapping (kept alive by the buffer's
        // `Arc<HostMemory>`) and 2-byte aligned, both checked by `ptr`.
        Ok(u16::from_le(unsafe { p.cast::<u16>().read_volatile() }))
    }
    /// Volatile little-endian 16-bit write.
    #[inline]
    pub fn write_u16(&self, offset: usize, v: u16) -> Result<(), DmaError> {
        let p = self.ptr(offset, 2, 2)?;
        // SAFETY: as in `read_u16`: inside the live mapping and 2-byte
        // aligned, both checked by `ptr`.
        unsafe { p.cast::<u16>().write_volatile(v.to_le()) };
        Ok(())
    }
    /// Volatile little-endian 32-bit read.
    #[inline]
    pub fn read_u32(&self, offset: usize) -> Result<u32, DmaError> {
        let p = self.ptr(offset, 4, 4)?;
        // SAFETY: `p` is inside the live mapping (kept alive by the buffer's
        // `Arc<HostMemory>`) and 4-byte aligned, both checked by `ptr`.
        Ok(u32::from_le(unsafe { p.cast::<u32>().read_volatile() }))
    }
    /// Volatile little-endian 32-bit write.
    #[inline]
    pub fn write_u32(&self, offset: usize, v: u32) -> Result<(), DmaError> {
        let p = self.ptr(offset, 4, 4)?;
        // SAFETY: as in `read_u32`.
        unsafe { p.cast::<u32>().write_volatile(v.to_le()) };
        Ok(())
    }
    /// Volatile little-endian 64-bit read.
    #[inline]
    pub fn read_u64(&self, offset: usize) -> Result<u64, DmaError> {
        let p = self.ptr(offset, 8, 8)?;
        // SAFETY: in bounds and 8-byte aligned (checked by `ptr`), inside the
        // live mapping.
        Ok(u64::from_le(unsafe { p.cast::<u64>().read_volatile() }))
    }
    /// Volatile little-endian 64-bit write.
    #[inline]
    pub fn write_u64(&self, offset: usize, v: u64) -> Result<(), DmaError> {
        let p = self.ptr(offset, 8, 8)?;
        // SAFETY: as in `read_u64`.
        unsafe { p.cast::<u64>().write_volatile(v.to_le()) };
        Ok(())
    }
    /// Writes `count` consecutive little-endian 64-bit values starting at
    /// `offset`, the `i`-th being `value(i)`, with one bounds check for the
    /// whole run (PRP List entries).
    #[inline]
    pub fn write_u64_run(
        &self,
        offset: usize,
        count: usize,
        mut value: impl FnMut(usize) -> u64,
    ) -> Result<(), DmaError> {
        let Some(bytes) = count.checked_mul(8) else {
            return Err(DmaError::OutOfBounds {
                what: "DMA buffer",
                offset,
                len: usize::MAX,
                size: self.inner.len,
            });
        };
        let p = self.ptr(offset, bytes, 8)?.cast::<u64>();
        for i in 0..count {
            let q = p.wrapping_add(i);
            // SAFETY: the whole run `offset..offset + 8 * count` is inside
            // the live mapping and 8-byte aligned (checked once by `ptr`).
            unsafe { q.write_volatile(value(i).to_le()) };
        }
        Ok(())
    }
    /// Atomic acquire load of a 32-bit word (see `HostMemory::load_acquire_u32`).
    #[inline]
    pub fn load_acquire_u32(&self, offset: usize) -> Result<u32, DmaError> {
        let p = self.ptr(offset, 4, 4)?;
        // SAFETY: in bounds and aligned (checked by `ptr`), valid while `self`
        // lives; the `&AtomicU32` exists only for this one load (an atomic
        // view of shared memory, what `AtomicU32::from_ptr` is for).
        let v = unsafe { AtomicU32::from_ptr(p.cast::<u32>()) }.load(Ordering::Acquire);
        crate::barrier::dma_rmb();
        Ok(u32::from_le(v))
    }
    /// Atomic release store of a 32-bit word.
    #[inline]
    pub fn store_release_u32(&self, offset: usize, v: u32) -> Result<(), DmaError> {
        let p = self.ptr(offset, 4, 4)?;
        crate::barrier::dma_wmb();
        // SAFETY: as in `load_acquire_u32`.
        unsafe { AtomicU32::from_ptr(p.cast::<u32>()) }.store(v.to_le(), Ordering::Release);
        Ok(())
    }
    /// Copies `src` into the buffer at `offset`.
    #[inline]
    pub fn write_bytes(&self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        let p = self.ptr(offset, src.len(), 1)?;
        // SAFETY: the destination range is inside the live mapping (checked
        // by `ptr`); `src` is a Rust slice and cannot overlap device memory,
        // since no Rust reference into a mapping is ever created.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
        Ok(())
    }
    /// Copies from the buffer at `offset` into `dst`.
    #[inline]
    pub fn read_bytes(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        let p = self.ptr(offset, dst.len(), 1)?;
        // SAFETY: the source range is inside the live mapping (checked by
        // `ptr`); `dst` is a Rust slice that cannot overlap the mapping (no
        // references into it exist).
        unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
    /// Sets `len` bytes at `offset` to `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), DmaError> {
        let p = self.ptr(offset, len, 1)?;
        // SAFETY: the range is inside the live mapping (checked by `ptr`).
        unsafe { std::ptr::write_bytes(p, byte, len) };
        Ok(())
    }
    /// Copies the whole buffer into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.inner.len];
        // In bounds by construction.
        let _ = self.read_bytes(0, &mut v);
        v
    }

    /// The raw pointer to the buffer's first byte and its length, for the
    /// queue memory accessors of this crate (never exposed as a reference).
    #[inline]
    pub(crate) fn raw(&self) -> (NonNull<u8>, usize) {
        (self.inner.base, self.inner.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mapping larger than the machine's memory is refused before mmap,
    /// with what to do, for every backing (not populated until the OOM
    /// killer stops it, nor answered with a hugepage count to reserve).
    /// The behaviour before cannot be shown safely: with 4 KiB pages as root
    /// it was the OOM killer.
    #[test]
    fn a_mapping_larger_than_the_machines_memory_is_refused() {
        let ram = physical_memory().expect("sysconf reports the memory");
        let len = usize::try_from(ram).unwrap() * 2;
        for backing in [
            PageBacking::Small4K,
            PageBacking::Huge2M,
            PageBacking::Huge1G,
        ] {
            let Err(e) = HostMemory::map(len, backing) else {
                panic!("{backing:?}: mapped {len} bytes");
            };
            let m = e.to_string();
            assert!(m.contains("more than this machine's memory"), "{m}");
            assert!(m.contains("ask for less"), "{m}");
        }
    }

    #[test]
    fn dma_memory_is_not_inherited_by_fork() {
        let mem = HostMemory::map(8192, PageBacking::Small4K).unwrap();
        assert!(crate::registered::tests::not_inherited_by_fork(
            mem.ptr.as_ptr() as usize
        ));
    }
}
