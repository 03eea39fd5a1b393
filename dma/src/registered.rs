//! Application-owned memory registered for DMA: an application hands a
//! mapping it made (an anonymous hugepage mapping, a hugetlbfs or shmem file
//! it mapped) to the driver **by value**, the driver maps it into the
//! device's IOMMU and carves [`DmaBuffer`]s from it, and gives the mapping
//! back only when no buffer of it is left.
//!
//! # Why this is sound without `unsafe` in the application
//!
//! - **Ownership moves in.** [`RegisteredMemory::new`] takes the
//!   `memmap2::MmapMut` by value and keeps it inside the [`HostMemory`] that
//!   the IOMMU mapping and every buffer share (`Arc`). Safe code can no
//!   longer reach the `MmapMut`, so it can neither unmap the pages nor form
//!   a `&[u8]`/`&mut [u8]` over memory the device may write; the CPU reaches
//!   the bytes only through [`DmaBuffer`]'s bounds-checked copy, volatile
//!   and atomic accessors, as for any other DMA memory.
//! - **Buffers never overlap.** Carving ([`RegisteredMemory::alloc`],
//!   [`RegisteredMemory::buffer`]) reserves whole 4 KiB pages from a free
//!   list; a page is in at most one live buffer, and goes back when that
//!   buffer (with every piece split from it, and any quarantine of it) is
//!   dropped. So two buffers — which may live on two threads — never alias.
//! - **The memory outlives every buffer.** Each buffer holds the
//!   registration's root (`Arc<DmaPages>`), dropped as the buffer's last
//!   field, after its memory and region handles. A buffer inside a command
//!   belongs to that command until its completion (or until the controller
//!   is disabled, for a timed-out one), so the device is done with a page
//!   before it can be returned.
//! - **Handing back is checked, not assumed.** [`RegisteredMemory::unregister`]
//!   succeeds only when the root is unique (`Arc::try_unwrap`: no buffer of
//!   any kind is alive), then removes the IOMMU mapping, then takes the
//!   `MmapMut` out of the now-unique [`HostMemory`]. Otherwise the
//!   registration comes back in [`UnregisterError::StillInUse`].
//! - **Dropping it is always sound.** Dropping a [`RegisteredMemory`] with
//!   buffers alive only drops its handles: the last buffer to go unmaps the
//!   IOMMU mapping, then drops the `MmapMut`, which unmaps the pages.
//!
//! A file mapping's own contract stays the application's: `memmap2` makes
//! creating one `unsafe` because another party truncating or rewriting the
//! file changes the memory underneath. Device DMA still lands in the pages
//! VFIO pinned; a CPU access beyond a truncated file's end raises SIGBUS.
//!
//! ```no_run
//! # fn f(mapper: std::sync::Arc<dyn upnvme_dma::DmaMapper>) -> Result<(), Box<dyn std::error::Error>> {
//! use upnvme_dma::RegisteredMemory;
//! let mapping = memmap2::MmapOptions::new().len(2 << 20).huge(Some(21)).map_anon()?;
//! let reg = RegisteredMemory::new(mapping, mapper)?;
//! let buf = reg.alloc(4096)?;           // a DmaBuffer like any other
//! buf.write_bytes(0, b"hello")?;
//! drop(buf);
//! let mapping = reg.unregister()?;      // the MmapMut, with what was written
//! assert_eq!(&mapping[..5], b"hello");
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use memmap2::MmapMut;

use crate::PAGE_SIZE;
use crate::alloc::give_back;
use crate::error::DmaError;
use crate::memory::{DmaBuffer, DmaMapper, DmaPages, DmaRegion, HostMemory, PageBacking};

/// Why an application's mapping could not be registered for DMA (the
/// `reason` of a [`RegisterError`]). Each says what is wrong and how to fix
/// it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterFailure {
    /// The mapping has no bytes.
    #[error(
        "the mapping is empty (0 bytes): map at least one 4 KiB page (a multiple of 2 MiB for 2 MiB hugepages) before registering it"
    )]
    Empty,
    /// The mapping does not start on a 4 KiB page.
    #[error(
        "the mapping starts at {vaddr:#x}, not on a 4 KiB page: the IOMMU maps whole pages; map the file at an offset that is a multiple of 4096 (memmap2 `MmapOptions::offset`), or map it whole"
    )]
    NotPageAligned {
        /// The mapping's first address.
        vaddr: usize,
    },
    /// The mapping's length is not whole 4 KiB pages.
    #[error(
        "the mapping is {len} bytes, not a multiple of 4096: the IOMMU maps whole pages; map {rounded} bytes instead (a multiple of 2 MiB for 2 MiB hugepages)"
    )]
    LengthNotPageMultiple {
        /// The mapping's length.
        len: usize,
        /// The length rounded up to whole pages.
        rounded: usize,
    },
    /// The mapping is larger than any IOVA range the IOMMU offers: it can
    /// never be mapped as one piece.
    #[error(
        "the mapping is {len} bytes, larger than the largest IOVA range the IOMMU offers ({largest} bytes; valid ranges {ranges}): register it as several smaller mappings"
    )]
    LargerThanIovaWindow {
        /// The mapping's length.
        len: usize,
        /// Size of the largest valid IOVA range.
        largest: u64,
        /// The valid ranges, formatted.
        ranges: String,
    },
    /// The IOVA space is currently too full for the mapping.
    #[error(
        "no free IOVA space for the {len}-byte mapping inside the IOMMU's valid ranges {ranges}: unregister memory that is no longer needed, or register a smaller mapping"
    )]
    IovaExhausted {
        /// The mapping's length.
        len: usize,
        /// The valid ranges, formatted.
        ranges: String,
    },
    /// `madvise(MADV_DONTFORK)` refused the mapping (the kernel does not
    /// allow it on device mappings, VM_IO / VM_PFNMAP, or on a range that
    /// is not wholly mapped).
    #[error(
        "the kernel refused to keep the application's memory out of forked children: {0}; register ordinary memory the process mapped itself (anonymous, hugetlbfs, shmem/tmpfs), not a device mapping (a BAR, /dev/mem), in one piece"
    )]
    DontFork(#[source] DmaError),
    /// The IOMMU (VFIO_IOMMU_MAP_DMA) refused the mapping.
    #[error(
        "the IOMMU refused to map the application's memory: {0}; the mapping must be pinnable: anonymous memory (hugepages or not), or a hugetlbfs or shmem/tmpfs file mapped shared (the kernel refuses long-term pins of writable mappings of files on ordinary filesystems)"
    )]
    Map(#[source] DmaError),
    /// The device has no IOMMU mapper for foreign memory.
    #[error(
        "device {device} cannot map application memory for DMA (its Device implementation offers no DMA mapper); use Controller::alloc_dma instead"
    )]
    Unsupported {
        /// The device's name.
        device: String,
    },
}

/// A refused registration: why ([`RegisterError::reason`]), and the
/// application's mapping back ([`RegisterError::into_mapping`]), untouched.
#[derive(Debug, thiserror::Error)]
#[error("cannot register memory for DMA: {reason}")]
pub struct RegisterError {
    reason: RegisterFailure,
    mapping: Option<MmapMut>,
}

impl RegisterError {
    /// A refusal of `mapping` for `reason`.
    pub fn new(reason: RegisterFailure, mapping: MmapMut) -> Self {
        RegisterError {
            reason,
            mapping: Some(mapping),
        }
    }

    /// Why the registration was refused.
    pub fn reason(&self) -> &RegisterFailure {
        &self.reason
    }

    /// The mapping that was to be registered. `None` only if a device
    /// mapper kept a handle of the memory after failing to map it (then the
    /// memory is unmapped when that handle goes).
    pub fn into_mapping(self) -> Option<MmapMut> {
        self.mapping
    }
}

/// Why [`RegisteredMemory::alloc`] or [`RegisteredMemory::buffer`] gave no
/// buffer. Each says what to do instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CarveError {
    /// A buffer of no bytes was asked for.
    #[error("a DMA buffer of 0 bytes: ask for at least 1 byte")]
    ZeroLength,
    /// The offset is not on a 4 KiB page.
    #[error(
        "offset {offset} is not a multiple of 4096: buffers carved from registered memory start on a 4 KiB page; carve at {aligned} and use IoData::slice for I/O at a dword offset inside the buffer"
    )]
    Unaligned {
        /// The offset asked for.
        offset: usize,
        /// The page boundary below it.
        aligned: usize,
    },
    /// The range does not lie inside the registration.
    #[error(
        "{len} bytes at offset {offset} do not fit in the {size}-byte registration: ask for a range inside it"
    )]
    OutOfRange {
        /// The offset asked for.
        offset: usize,
        /// The length asked for.
        len: usize,
        /// The registration's size.
        size: usize,
    },
    /// Some of the pages are in a buffer that is still alive.
    #[error(
        "bytes {offset}..{end} (whole pages) overlap a DMA buffer carved from this registration that is still alive: drop that buffer first, or carve other pages ({free} bytes free)"
    )]
    Overlaps {
        /// The offset asked for.
        offset: usize,
        /// End of the pages the buffer would need.
        end: usize,
        /// Bytes currently free in the registration.
        free: usize,
    },
    /// No free run of pages is long enough.
    #[error(
        "no free run of {pages_len} bytes (whole 4 KiB pages) in the {size}-byte registration ({free} bytes free, largest run {largest}): drop buffers carved from it, or register more memory"
    )]
    NoSpace {
        /// The length asked for, rounded up to whole pages.
        pages_len: usize,
        /// The registration's size.
        size: usize,
        /// Bytes currently free.
        free: usize,
        /// The longest free run.
        largest: usize,
    },
}

/// Why [`RegisteredMemory::unregister`] did not hand the mapping back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UnregisterError {
    /// Buffers carved from the registration are still alive (the device
    /// may still be using them); the registration comes back unchanged.
    #[error(
        "{buffers} DMA buffer(s) carved from this registration are still alive (counting a split buffer, a pool made from one, and a buffer a timed-out command still holds, as one each): drop them — a buffer inside a command comes back with its completion — then call unregister again with the registration this error hands back (UnregisterError::into_registration)"
    )]
    StillInUse {
        /// Buffers still alive.
        buffers: usize,
        /// The registration, unchanged.
        registration: RegisteredMemory,
    },
    /// The IOMMU mapping is gone but something else still holds the memory
    /// (a device mapper that kept a handle after unmapping): it cannot be
    /// handed back. It is unmapped from the process when that holder drops it.
    #[error(
        "the {len}-byte registration was unmapped from the IOMMU, but its memory is still held by the device's mapper, so it cannot be handed back; it is unmapped when the mapper lets go (a DmaMapper must drop its handles in unmap)"
    )]
    Retained {
        /// The registration's size.
        len: usize,
    },
    /// The IOMMU did not confirm the mapping removed
    /// (VFIO_IOMMU_UNMAP_DMA failed or unmapped less than the whole
    /// registration): the device may still reach the pages, so they are
    /// not handed back as a writable mapping. The process's mapping is
    /// dropped; the pages stay pinned for the device until its VFIO
    /// container closes.
    #[error(
        "the {len}-byte registration could not be unmapped from the IOMMU (the device may still reach it), so it is not handed back; its process mapping was dropped and the device keeps its pages pinned until the VFIO container closes: close the controller and drop every buffer, pool and registration of it to release them"
    )]
    StillMapped {
        /// The registration's size.
        len: usize,
    },
}

impl UnregisterError {
    /// The registration, when it came back ([`UnregisterError::StillInUse`]).
    pub fn into_registration(self) -> Option<RegisteredMemory> {
        match self {
            UnregisterError::StillInUse { registration, .. } => Some(registration),
            UnregisterError::Retained { .. } | UnregisterError::StillMapped { .. } => None,
        }
    }
}

/// An application's memory mapping, owned by the driver and mapped for the
/// device's DMA until [`RegisteredMemory::unregister`] hands it back.
///
/// Carve [`DmaBuffer`]s from it with [`RegisteredMemory::alloc`] (first
/// fit) or [`RegisteredMemory::buffer`] (at an offset); they work like any
/// other buffer (submit, slices, `IoVec` segments, `DmaPool::new`), keep the
/// registration's memory alive, and never overlap. Unlike
/// `Controller::alloc_dma`'s buffers they are **not zeroed**: they show
/// what the mapping holds (the application may have filled it before
/// registering it). See the [module documentation](self) for the ownership
/// argument.
///
/// `Send` and `Sync`: carving takes a lock (registration is setup, not the
/// I/O path), so threads may share one registration.
pub struct RegisteredMemory {
    region: DmaRegion,
    /// Spans the whole registration without access to it; every carved
    /// buffer holds a clone, so `strong_count - 1` is the live buffers.
    root: Arc<DmaPages>,
    /// Free page runs (offset, len), sorted, never adjacent.
    free: Arc<Mutex<Vec<(usize, usize)>>>,
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<RegisteredMemory>();
    send_sync::<UnregisterError>();
    send_sync::<RegisterError>();
};

impl fmt::Debug for RegisteredMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredMemory")
            .field("iova", &format_args!("{:#x}", self.iova()))
            .field("len", &self.len())
            .field("page_size", &self.page_size())
            .field("live_buffers", &self.live_buffers())
            .field("free_bytes", &self.free_bytes())
            .finish()
    }
}

impl RegisteredMemory {
    /// Registers `mapping` for DMA through `mapper` (the VFIO container the
    /// controller's own memory is mapped in; `Controller::register_memory`
    /// passes it). The mapping must be non-empty, start on a 4 KiB page and
    /// be whole 4 KiB pages long; it is mapped at one contiguous IOVA range
    /// allocated inside the IOMMU's valid ranges, aligned to 2 MiB when the
    /// memory is whole 2 MiB (or 1 GiB) hugepages (less when it is shorter:
    /// to the largest power of two its address and length are multiples
    /// of). On any refusal the mapping comes back in the error.
    pub fn new(mapping: MmapMut, mapper: Arc<dyn DmaMapper>) -> Result<Self, RegisterError> {
        let len = mapping.len();
        let vaddr = mapping.as_ptr() as usize;
        if len == 0 {
            return Err(RegisterError::new(RegisterFailure::Empty, mapping));
        }
        if !vaddr.is_multiple_of(PAGE_SIZE) || vaddr == 0 {
            return Err(RegisterError::new(
                RegisterFailure::NotPageAligned { vaddr },
                mapping,
            ));
        }
        if !len.is_multiple_of(PAGE_SIZE) {
            let rounded = len.div_ceil(PAGE_SIZE).saturating_mul(PAGE_SIZE);
            return Err(RegisterError::new(
                RegisterFailure::LengthNotPageMultiple { len, rounded },
                mapping,
            ));
        }
        let ranges = mapper.iova_ranges();
        if let Some(largest) = ranges
            .iter()
            .filter(|r| r.end >= r.start)
            .map(|r| (r.end - r.start).saturating_add(1))
            .max()
            && len as u64 > largest
        {
            return Err(RegisterError::new(
                RegisterFailure::LargerThanIovaWindow {
                    len,
                    largest,
                    ranges: format_ranges(&ranges),
                },
                mapping,
            ));
        }
        // One read of smaps for both the backing and the fork flag.
        let entry = smaps_entry(vaddr);
        let backing = match entry.as_deref().and_then(kernel_page_size) {
            Some(s) if s == PageBacking::Huge1G.page_size() => PageBacking::Huge1G,
            Some(s) if s == PageBacking::Huge2M.page_size() => PageBacking::Huge2M,
            _ => PageBacking::Small4K,
        };
        // As the driver's own DMA memory (`memory::dont_fork`): a child
        // made by fork does not inherit it; undone when the mapping is
        // handed back.
        // The whole VMA: the kernel rounded a hugetlb mapping up to whole
        // hugepages, and madvise of `len` bytes would have to split it off
        // a hugepage boundary (EINVAL).
        let vma_len = len.next_multiple_of(backing.page_size());
        // Whether a fork inherits it now (smaps VmFlags without `dc`): what
        // the hand-back restores.
        let inherited = inherited_by_fork(entry.as_deref());
        if let Err(e) = crate::memory::advise_fork(
            std::ptr::NonNull::new(vaddr as *mut u8).expect("checked non-zero above"),
            vma_len,
            false,
            "the registered mapping",
        ) {
            return Err(RegisterError::new(RegisterFailure::DontFork(e), mapping));
        }
        let mem = HostMemory::adopt(mapping, backing, inherited)
            .map_err(|m| RegisterError::new(RegisterFailure::NotPageAligned { vaddr: 0 }, m))?;
        let region = match DmaRegion::map_memory(mem, mapper) {
            Ok(r) => r,
            Err((e, mem)) => {
                let reason = match e {
                    DmaError::IovaExhausted { ranges, .. } => {
                        RegisterFailure::IovaExhausted { len, ranges }
                    }
                    other => RegisterFailure::Map(other),
                };
                return Err(RegisterError {
                    reason,
                    mapping: HostMemory::into_mapping(mem).ok(),
                });
            }
        };
        let root = match DmaBuffer::new(region.clone(), 0, len, None) {
            Ok(b) => Arc::new(b.into_pages()),
            // Cannot happen (0..len is the region); give everything back.
            Err(e) => {
                let mapping = region
                    .unmap_into_memory()
                    .ok()
                    .flatten()
                    .and_then(|m| HostMemory::into_mapping(m).ok());
                return Err(RegisterError {
                    reason: RegisterFailure::Map(e),
                    mapping,
                });
            }
        };
        let mut free = Vec::with_capacity(2);
        free.push((0, len));
        Ok(RegisteredMemory {
            region,
            root,
            free: Arc::new(Mutex::new(free)),
        })
    }

    /// Size of the registration in bytes (the mapping's length).
    pub fn len(&self) -> usize {
        self.region.len()
    }

    /// Always false: empty mappings are refused.
    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }

    /// IOVA of the registration's first byte; byte `i` is at `iova() + i`.
    pub fn iova(&self) -> u64 {
        self.region.iova()
    }

    /// What the kernel backs the mapping with (from `/proc/self/smaps`'s
    /// KernelPageSize): 2 MiB or 1 GiB hugepages, or 4 KiB pages
    /// (`PageBacking::Small4K`, also when it could not be told).
    pub fn backing(&self) -> PageBacking {
        self.region.memory().backing()
    }

    /// Size of the pages backing the mapping ([`RegisteredMemory::backing`]).
    pub fn page_size(&self) -> usize {
        self.backing().page_size()
    }

    /// Buffers carved from this registration that are still alive (a split
    /// buffer or a pool made from one counts once).
    pub fn live_buffers(&self) -> usize {
        Arc::strong_count(&self.root).saturating_sub(1)
    }

    /// Bytes not in any live buffer.
    pub fn free_bytes(&self) -> usize {
        self.lock().iter().map(|&(_, l)| l).sum()
    }

    /// A buffer of `len` bytes at the lowest free run of whole 4 KiB pages
    /// that holds it (the buffer starts on a page; its pages, `len` rounded
    /// up to 4 KiB, are reserved until it is dropped). Not zeroed.
    pub fn alloc(&self, len: usize) -> Result<DmaBuffer, CarveError> {
        let pages_len = self.pages_len(0, len)?;
        let mut free = self.lock();
        let Some(i) = free.iter().position(|&(_, l)| l >= pages_len) else {
            return Err(CarveError::NoSpace {
                pages_len,
                size: self.len(),
                free: free.iter().map(|&(_, l)| l).sum(),
                largest: free.iter().map(|&(_, l)| l).max().unwrap_or(0),
            });
        };
        let (off, l) = free[i];
        if l == pages_len {
            free.remove(i);
        } else {
            free[i] = (off + pages_len, l - pages_len);
        }
        self.finish_carve(free, off, len, pages_len)
    }

    /// A buffer of `len` bytes at `offset` of the registration: `offset`
    /// on a 4 KiB page, the range inside the registration, and its pages
    /// (`len` rounded up to 4 KiB) in no live buffer. Not zeroed: it shows
    /// what the mapping holds there.
    pub fn buffer(&self, offset: usize, len: usize) -> Result<DmaBuffer, CarveError> {
        let pages_len = self.pages_len(offset, len)?;
        if !offset.is_multiple_of(PAGE_SIZE) {
            return Err(CarveError::Unaligned {
                offset,
                aligned: offset - offset % PAGE_SIZE,
            });
        }
        let size = self.len();
        let Some(end) = offset.checked_add(pages_len).filter(|&e| e <= size) else {
            return Err(CarveError::OutOfRange { offset, len, size });
        };
        let mut free = self.lock();
        let Some(i) = free.iter().position(|&(o, l)| o <= offset && end <= o + l) else {
            return Err(CarveError::Overlaps {
                offset,
                end,
                free: free.iter().map(|&(_, l)| l).sum(),
            });
        };
        let (o, l) = free[i];
        let before = (o, offset - o);
        let after = (end, o + l - end);
        match (before.1 > 0, after.1 > 0) {
            (true, true) => {
                free[i] = before;
                free.insert(i + 1, after);
            }
            (true, false) => free[i] = before,
            (false, true) => free[i] = after,
            (false, false) => {
                free.remove(i);
            }
        }
        self.finish_carve(free, offset, len, pages_len)
    }

    /// Unregisters the memory and hands the mapping back, with whatever the
    /// device and the CPU wrote into it: only when no buffer carved from it
    /// is alive, after the device's IOMMU mapping is removed. With buffers
    /// alive the registration comes back in
    /// [`UnregisterError::StillInUse`], unchanged and still mapped.
    pub fn unregister(self) -> Result<MmapMut, UnregisterError> {
        let RegisteredMemory { region, root, free } = self;
        match Arc::try_unwrap(root) {
            // No buffer holds the root any more: each drops it as its last
            // field, after its memory and region handles, so the root's
            // pages held the only other handle of the region.
            Ok(pages) => drop(pages),
            Err(root) => {
                return Err(UnregisterError::StillInUse {
                    buffers: Arc::strong_count(&root).saturating_sub(1),
                    registration: RegisteredMemory { region, root, free },
                });
            }
        }
        let len = region.len();
        let mem = region
            .unmap_into_memory()
            .map_err(|_| UnregisterError::Retained { len })?
            .ok_or(UnregisterError::StillMapped { len })?;
        HostMemory::into_mapping(mem).map_err(|_| UnregisterError::Retained { len })
    }

    /// `len` rounded up to whole pages, refusing 0 and overflow; `offset`
    /// is the caller's, for the error (`alloc`'s search starts at 0).
    fn pages_len(&self, offset: usize, len: usize) -> Result<usize, CarveError> {
        if len == 0 {
            return Err(CarveError::ZeroLength);
        }
        len.checked_next_multiple_of(PAGE_SIZE)
            .ok_or(CarveError::OutOfRange {
                offset,
                len,
                size: self.len(),
            })
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(usize, usize)>> {
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes the buffer over the pages `offset..offset + pages_len`, already
    /// taken out of `free`.
    fn finish_carve(
        &self,
        mut free: MutexGuard<'_, Vec<(usize, usize)>>,
        offset: usize,
        len: usize,
        pages_len: usize,
    ) -> Result<DmaBuffer, CarveError> {
        // `k` live buffers leave at most `k + 1` free runs: reserve that
        // now, so a buffer's drop never allocates. The new buffer's hold on
        // the root is taken under the lock, so a carve in another thread
        // counts it (two carves that both counted before either took its
        // hold would each reserve one run too few).
        let parent = self.root.clone();
        let want = self.live_buffers() + 1;
        let runs = free.len();
        free.reserve(want.saturating_sub(runs));
        drop(free);
        let weak: Weak<Mutex<Vec<(usize, usize)>>> = Arc::downgrade(&self.free);
        let release = Box::new(move |_: &DmaRegion, off: usize, _: usize| {
            if let Some(free) = weak.upgrade() {
                let mut f = free.lock().unwrap_or_else(PoisonError::into_inner);
                give_back(&mut f, off, pages_len);
            }
        });
        match DmaBuffer::new(self.region.clone(), offset, len, Some(release)) {
            Ok(b) => Ok(b.with_parent(parent)),
            // Cannot happen (the range was checked against the region);
            // the pages go back.
            Err(_) => {
                give_back(&mut self.lock(), offset, pages_len);
                Err(CarveError::OutOfRange {
                    offset,
                    len,
                    size: self.len(),
                })
            }
        }
    }
}

fn format_ranges(ranges: &[crate::IovaRange]) -> String {
    ranges
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The KernelPageSize line's value of an smaps entry, in bytes.
fn kernel_page_size(entry: &str) -> Option<usize> {
    let v = field(entry, "KernelPageSize:")?;
    let kib = v.trim().strip_suffix("kB")?.trim().parse::<usize>().ok()?;
    kib.checked_mul(1024)
}

/// Whether a fork inherits the mapping of an smaps entry: its VmFlags lack
/// `dc` (VM_DONTCOPY). True when the flags cannot be read.
fn inherited_by_fork(entry: Option<&str>) -> bool {
    !entry
        .and_then(|e| field(e, "VmFlags:"))
        .is_some_and(|f| f.split_whitespace().any(|flag| flag == "dc"))
}

/// The `/proc/self/smaps` entry (the lines after its address line) of the
/// mapping containing `vaddr`; None when it cannot be read. One read of the
/// file, which the kernel builds by walking every mapping's page tables:
/// callers take every field they need from one entry.
pub(crate) fn smaps_entry(vaddr: usize) -> Option<String> {
    entry_in(&std::fs::read_to_string("/proc/self/smaps").ok()?, vaddr)
}

/// The entry of `smaps` (the file's text) for the mapping containing
/// `vaddr`.
fn entry_in(smaps: &str, vaddr: usize) -> Option<String> {
    let mut entry: Option<String> = None;
    for line in smaps.lines() {
        let head = line.split(' ').next().unwrap_or("");
        if let Some((a, b)) = head.split_once('-')
            && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
        {
            if entry.is_some() {
                break;
            }
            if a <= vaddr && vaddr < b {
                entry = Some(String::new());
            }
            continue;
        }
        if let Some(e) = entry.as_mut() {
            e.push_str(line);
            e.push('\n');
        }
    }
    entry
}

/// The value of `name` (with its colon, e.g. `"VmFlags:"`) in an smaps
/// entry.
fn field<'a>(entry: &'a str, name: &str) -> Option<&'a str> {
    entry.lines().find_map(|l| l.strip_prefix(name))
}

/// The value of `name` in the `/proc/self/smaps` entry of the mapping
/// containing `vaddr` (None when it cannot be read).
#[cfg(test)]
pub(crate) fn smaps_field(vaddr: usize, name: &str) -> Option<String> {
    field(&smaps_entry(vaddr)?, name).map(str::to_string)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The entry ends at the next mapping's address line: no field of a
    /// neighbour is taken for the mapping's own.
    #[test]
    fn an_smaps_entry_is_its_own_lines_only() {
        let smaps = "\
7f0000000000-7f0000200000 rw-p 00000000 00:0f 1 /anon_hugepage (deleted)
Size:               2048 kB
KernelPageSize:     2048 kB
VmFlags: rd wr mr mw me sd ht dc
7f0000200000-7f0000201000 rw-p 00000000 00:00 0
Size:                  4 kB
VmFlags: rd wr mr mw me ac sd
";
        let e = entry_in(smaps, 0x7f00_0000_1000).unwrap();
        assert_eq!(kernel_page_size(&e), Some(2 << 20));
        assert!(!inherited_by_fork(Some(&e)));
        // The next mapping has no KernelPageSize line of its own.
        let e = entry_in(smaps, 0x7f00_0020_0000).unwrap();
        assert_eq!(kernel_page_size(&e), None);
        assert!(inherited_by_fork(Some(&e)));
        assert!(entry_in(smaps, 0x7f00_0030_0000).is_none());
        assert!(inherited_by_fork(None));
    }
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Hands out fake IOVAs, counts live mappings, keeps no handle.
    struct FakeMapper {
        next: AtomicU64,
        live: AtomicU64,
        /// Report every unmap as not confirmed (an IOMMU that refused).
        refuse_unmap: std::sync::atomic::AtomicBool,
    }
    // SAFETY: no device is behind this test mapper: nothing can reach the
    // memory it "maps", so every promise of the trait holds trivially.
    unsafe impl DmaMapper for FakeMapper {
        fn map(&self, mem: &Arc<HostMemory>) -> Result<u64, DmaError> {
            self.live.fetch_add(1, Ordering::SeqCst);
            Ok(self.next.fetch_add(mem.len() as u64, Ordering::SeqCst))
        }
        fn unmap(&self, _m: crate::memory::Unmapping<'_>) -> bool {
            self.live.fetch_sub(1, Ordering::SeqCst);
            !self.refuse_unmap.load(Ordering::SeqCst)
        }
    }

    fn mapper() -> Arc<FakeMapper> {
        Arc::new(FakeMapper {
            next: AtomicU64::new(0x4000_0000),
            live: AtomicU64::new(0),
            refuse_unmap: std::sync::atomic::AtomicBool::new(false),
        })
    }

    #[test]
    fn carve_write_unregister_round_trip() {
        let m = mapper();
        let mut mapping = MmapMut::map_anon(64 << 10).unwrap();
        mapping[8192..8197].copy_from_slice(b"early");
        let reg = RegisteredMemory::new(mapping, m.clone()).unwrap();
        assert_eq!(m.live.load(Ordering::SeqCst), 1);
        let a = reg.alloc(100).unwrap();
        assert_eq!((a.len(), a.iova()), (100, reg.iova()));
        let b = reg.buffer(8192, 4096).unwrap();
        let mut early = [0; 5];
        b.read_bytes(0, &mut early).unwrap();
        assert_eq!(&early, b"early", "not zeroed: the application's data");
        assert_eq!(b.iova(), reg.iova() + 8192);
        a.write_bytes(0, b"through a buffer").unwrap();
        assert_eq!(reg.live_buffers(), 2);
        // Overlaps are refused; the free pages around them are not.
        assert!(matches!(
            reg.buffer(8192, 1),
            Err(CarveError::Overlaps { .. })
        ));
        assert!(matches!(reg.buffer(0, 1), Err(CarveError::Overlaps { .. })));
        let c = reg.buffer(4096, 4096).unwrap();
        assert_eq!(reg.alloc(4096).unwrap().iova(), reg.iova() + 12288);
        // Splitting keeps the registration busy until every piece is gone.
        let pieces = c.split(512).unwrap();
        drop((a, b));
        let reg = match reg.unregister() {
            Err(UnregisterError::StillInUse {
                buffers,
                registration,
            }) => {
                assert_eq!(buffers, 1);
                registration
            }
            other => panic!("{other:?}"),
        };
        drop(pieces);
        assert_eq!(reg.free_bytes(), 64 << 10);
        let mapping = reg.unregister().unwrap();
        assert_eq!(&mapping[..16], b"through a buffer");
        assert_eq!(m.live.load(Ordering::SeqCst), 0, "IOMMU mapping removed");
    }

    /// Whether a fork's child would not inherit the mapping at `vaddr`
    /// (smaps VmFlags `dc`, VM_DONTCOPY).
    pub(crate) fn not_inherited_by_fork(vaddr: usize) -> bool {
        smaps_field(vaddr, "VmFlags:")
            .expect("smaps lists the mapping")
            .split_whitespace()
            .any(|f| f == "dc")
    }

    /// A 2 MiB-hugepage mapping whose length is whole 4 KiB pages but not
    /// whole hugepages (the kernel rounds the VMA up) registers: MADV_DONTFORK
    /// covers the whole VMA (madvise of its `len()` bytes would have to
    /// split the hugetlb VMA off a hugepage boundary, which the kernel
    /// refuses with EINVAL). Skipped without a free hugepage.
    #[test]
    fn a_hugepage_mapping_of_whole_small_pages_registers() {
        let Ok(mapping) = memmap2::MmapOptions::new()
            .len(4096)
            .huge(Some(21))
            .map_anon()
        else {
            eprintln!("no free 2 MiB hugepage: skipped");
            return;
        };
        let reg = RegisteredMemory::new(mapping, mapper());
        assert!(reg.is_ok(), "{:?}", reg.err().map(|e| e.to_string()));
    }

    #[test]
    fn a_mapping_the_application_kept_from_forks_stays_so_when_handed_back() {
        let mapping = MmapMut::map_anon(64 << 10).unwrap();
        mapping.advise(memmap2::Advice::DontFork).unwrap();
        let vaddr = mapping.as_ptr() as usize;
        let reg = RegisteredMemory::new(mapping, mapper()).unwrap();
        let mapping = reg.unregister().unwrap();
        assert_eq!(mapping.as_ptr() as usize, vaddr);
        assert!(
            not_inherited_by_fork(vaddr),
            "the application's MADV_DONTFORK"
        );
    }

    #[test]
    fn a_registered_mapping_is_not_inherited_by_fork_until_handed_back() {
        let m = mapper();
        let mapping = MmapMut::map_anon(64 << 10).unwrap();
        let vaddr = mapping.as_ptr() as usize;
        assert!(!not_inherited_by_fork(vaddr), "an ordinary mapping");
        let reg = RegisteredMemory::new(mapping, m).unwrap();
        assert!(
            not_inherited_by_fork(vaddr),
            "MADV_DONTFORK while registered"
        );
        let mapping = reg.unregister().unwrap();
        assert_eq!(mapping.as_ptr() as usize, vaddr);
        assert!(
            !not_inherited_by_fork(vaddr),
            "as the application mapped it"
        );
    }

    #[test]
    fn bad_input_is_refused_with_the_mapping_back() {
        let m = mapper();
        let e = RegisteredMemory::new(MmapMut::map_anon(0).unwrap(), m.clone()).unwrap_err();
        assert!(matches!(e.reason(), RegisterFailure::Empty), "{e}");
        let e = RegisteredMemory::new(MmapMut::map_anon(5000).unwrap(), m.clone()).unwrap_err();
        assert!(e.to_string().contains("map 8192 bytes instead"), "{e}");
        assert_eq!(e.into_mapping().map(|m| m.len()), Some(5000));
        // A file mapped at an offset inside a page starts inside a page.
        let path = std::env::temp_dir().join(format!("upnvme-reg-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(3 * 4096).unwrap();
        std::fs::remove_file(&path).unwrap();
        // SAFETY: the file is this test's own, unlinked, and neither
        // truncated nor written by anyone while the mapping exists.
        let at_100 = unsafe {
            memmap2::MmapOptions::new()
                .offset(100)
                .len(8192)
                .map_mut(&file)
        };
        let e = RegisteredMemory::new(at_100.unwrap(), m.clone()).unwrap_err();
        assert!(
            matches!(e.reason(), RegisterFailure::NotPageAligned { vaddr } if vaddr % 4096 == 100),
            "{e}"
        );
        assert!(e.to_string().contains("multiple of 4096"), "{e}");
        assert_eq!(m.live.load(Ordering::SeqCst), 0, "nothing mapped");
        let reg = RegisteredMemory::new(MmapMut::map_anon(16384).unwrap(), m.clone()).unwrap();
        assert_eq!(reg.backing(), PageBacking::Small4K);
        assert_eq!(reg.alloc(0).unwrap_err(), CarveError::ZeroLength);
        assert!(matches!(
            reg.buffer(100, 8),
            Err(CarveError::Unaligned { aligned: 0, .. })
        ));
        assert!(matches!(
            reg.buffer(12288, 4097),
            Err(CarveError::OutOfRange { .. })
        ));
        assert!(matches!(
            reg.buffer(usize::MAX - 4095, 1),
            Err(CarveError::OutOfRange { .. })
        ));
        assert!(matches!(
            reg.alloc(usize::MAX),
            Err(CarveError::OutOfRange { .. })
        ));
        let all = reg.alloc(16384).unwrap();
        assert!(matches!(reg.alloc(1), Err(CarveError::NoSpace { .. })));
        // Dropping the registration first is sound: the last buffer unmaps.
        drop(reg);
        assert_eq!(m.live.load(Ordering::SeqCst), 1);
        all.write_u64(0, 7).unwrap();
        drop(all);
        assert_eq!(m.live.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_registration_the_iommu_did_not_unmap_is_not_handed_back() {
        let m = mapper();
        let reg = RegisteredMemory::new(MmapMut::map_anon(16 << 10).unwrap(), m.clone()).unwrap();
        drop(reg.alloc(4096).unwrap());
        m.refuse_unmap.store(true, Ordering::SeqCst);
        match reg.unregister() {
            Err(UnregisterError::StillMapped { len }) => assert_eq!(len, 16 << 10),
            other => panic!("expected StillMapped, got {other:?}"),
        }
        assert_eq!(m.live.load(Ordering::SeqCst), 0, "unmapped once, not twice");
    }
}
