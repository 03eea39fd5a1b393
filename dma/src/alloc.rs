//! A page-granular allocator that carves device-mapped regions into
//! [`DmaBuffer`]s. Not on the I/O path: queues, PRP list pages and I/O buffers
//! are allocated once and reused; a dropped buffer's pages come back here.
//!
//! Regions of the standard size (2 MiB, or one page of a larger backing)
//! stay mapped while the allocator lives and serve later allocations. A
//! region made larger than that for one big allocation is unmapped when
//! its last buffer goes: its hugepages and IOVA range go back to the
//! system rather than staying pinned for an allocation that may never come
//! again.

use std::sync::{Arc, Mutex};

use crate::PAGE_SIZE;
use crate::error::DmaError;
pub use crate::memory::DmaMapper;
use crate::memory::{DeviceAccess, DmaBuffer, DmaRegion, PageBacking};

struct Region {
    region: DmaRegion,
    /// Free page runs as (offset, len), sorted by offset, never adjacent.
    /// `k` live buffers leave at most `k + 1` runs, and the capacity is
    /// raised to that on every allocation, so freeing never allocates.
    free: Vec<(usize, usize)>,
    /// Buffers handed out from this region and not yet dropped.
    live: usize,
    /// Larger than a standard region (made for one allocation that did not
    /// fit one): unmapped when `live` falls to 0.
    oversized: bool,
}

struct State {
    /// The mapped regions; `None` where an oversized region was unmapped
    /// (the slot is reused by the next new region, so indices held by
    /// live buffers stay valid).
    regions: Vec<Option<Region>>,
    /// Allocations [`DmaAllocator::alloc_or`] served from its fallback.
    fallbacks: u64,
    /// Why the most recent of them could not come from here.
    fallback_reason: Option<String>,
}

/// What [`DmaAllocator::fallbacks`] reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fallbacks {
    /// Allocations served by the fallback allocator.
    pub count: u64,
    /// Why the most recent of them could not come from this allocator
    /// (`None` when none did).
    pub last_reason: Option<String>,
}

/// Hands out page-aligned [`DmaBuffer`]s from hugepage regions mapped through a
/// [`DmaMapper`], mapping a new region when the existing ones are full.
#[derive(Clone)]
pub struct DmaAllocator {
    mapper: Arc<dyn DmaMapper>,
    backing: PageBacking,
    access: DeviceAccess,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for DmaAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let regions = self.regions();
        f.debug_struct("DmaAllocator")
            .field("backing", &self.backing)
            .field("access", &self.access)
            .field("regions", &regions)
            .finish()
    }
}

impl DmaAllocator {
    /// An allocator drawing memory of `backing` mapped through `mapper`.
    pub fn new(mapper: Arc<dyn DmaMapper>, backing: PageBacking) -> Self {
        DmaAllocator::with_access(mapper, backing, DeviceAccess::ReadWrite)
    }

    /// An allocator whose regions the device may only access as `access`
    /// says (e.g. [`DeviceAccess::ReadOnly`] for submission queues and PRP
    /// and SGL lists). Its regions are its own: memory of the two kinds never
    /// shares a mapping.
    pub fn with_access(
        mapper: Arc<dyn DmaMapper>,
        backing: PageBacking,
        access: DeviceAccess,
    ) -> Self {
        DmaAllocator {
            mapper,
            backing,
            access,
            state: Arc::new(Mutex::new(State {
                regions: Vec::new(),
                fallbacks: 0,
                fallback_reason: None,
            })),
        }
    }

    /// The device's access to this allocator's memory.
    pub fn access(&self) -> DeviceAccess {
        self.access
    }

    /// [`DmaAllocator::alloc`] from this allocator, or, when that fails (no
    /// hugepage free for a new region, an IOMMU that refuses the mapping),
    /// from `fallback`: for memory whose restricted access is a protection,
    /// not a requirement (a read-only SQ falls back to a read-write one
    /// rather than failing the queue's creation).
    ///
    /// Each allocation served by `fallback` is counted, with the reason,
    /// so the protection's absence can be seen
    /// ([`DmaAllocator::fallbacks`]).
    pub fn alloc_or(&self, len: usize, fallback: &DmaAllocator) -> Result<DmaBuffer, DmaError> {
        self.alloc(len).or_else(|e| {
            let b = fallback.alloc(len)?;
            if let Ok(mut state) = self.state.lock() {
                state.fallbacks += 1;
                state.fallback_reason = Some(e.to_string());
            }
            Ok(b)
        })
    }

    /// How many allocations [`DmaAllocator::alloc_or`] served from its
    /// fallback since this allocator was made, and why the most recent
    /// could not come from this allocator.
    pub fn fallbacks(&self) -> Fallbacks {
        self.state
            .lock()
            .map(|s| Fallbacks {
                count: s.fallbacks,
                last_reason: s.fallback_reason.clone(),
            })
            .unwrap_or_default()
    }

    /// The page backing of new regions.
    pub fn backing(&self) -> PageBacking {
        self.backing
    }

    /// Allocates a zeroed buffer of `len` bytes rounded up to whole 4 KiB pages,
    /// aligned to 4 KiB and contiguous in IOVA space.
    pub fn alloc(&self, len: usize) -> Result<DmaBuffer, DmaError> {
        if len == 0 {
            return Err(DmaError::InvalidAllocation(
                "zero-length buffer: ask for at least 1 byte".into(),
            ));
        }
        let len = len
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or_else(|| DmaError::InvalidAllocation(too_large(len, PAGE_SIZE)))?;
        let mut state = self
            .state
            .lock()
            .map_err(|_| DmaError::InvalidAllocation(POISONED.into()))?;
        let found = state.regions.iter_mut().enumerate().find_map(|(index, r)| {
            let r = r.as_mut()?;
            let i = r.free.iter().position(|&(_, l)| l >= len)?;
            let (off, l) = r.free[i];
            if l == len {
                r.free.remove(i);
            } else {
                r.free[i] = (off + len, l - len);
            }
            r.live += 1;
            let want = r.live + 1;
            r.free.reserve(want.saturating_sub(r.free.len()));
            Some((r.region.clone(), off, index))
        });
        let (region, offset, index, fresh) = match found {
            Some((region, offset, index)) => {
                drop(state);
                (region, offset, index, false)
            }
            None => {
                // Mapped without the lock: a new region can take long (the
                // pages are populated, the IOMMU mapped — up to a gigabyte),
                // and other threads' allocations from the regions already
                // mapped need not wait for it. Two threads missing at once each map
                // one; both regions serve later allocations.
                drop(state);
                // At least one backing page, and at least 2 MiB so 4 KiB-backed
                // allocators do not map (and IOMMU-map) page by page.
                let standard = self.backing.page_size().max(2 << 20);
                let size = len.max(standard);
                let region =
                    DmaRegion::new_with(size, self.backing, self.mapper.clone(), self.access)?;
                let mut free = Vec::new();
                if region.len() > len {
                    free.push((len, region.len() - len));
                }
                free.reserve(2);
                let mut state = self
                    .state
                    .lock()
                    .map_err(|_| DmaError::InvalidAllocation(POISONED.into()))?;
                let entry = Region {
                    region: region.clone(),
                    free,
                    live: 1,
                    oversized: len > standard,
                };
                // The first slot an unmapped region left, else a new one.
                let index = match state.regions.iter().position(Option::is_none) {
                    Some(i) => {
                        state.regions[i] = Some(entry);
                        i
                    }
                    None => {
                        state.regions.push(Some(entry));
                        state.regions.len() - 1
                    }
                };
                drop(state);
                (region, 0, index, true)
            }
        };
        let weak = Arc::downgrade(&self.state);
        let buf = DmaBuffer::new(
            region,
            offset,
            len,
            Some(Box::new(move |region: &DmaRegion, off, l| {
                // A region leaves its slot only when its last buffer is
                // gone, so the index found at allocation still names this
                // region (a free is one lookup, not a scan of every
                // region); `same` makes sure of it.
                let Some(state) = weak.upgrade() else { return };
                let Ok(mut s) = state.lock() else { return };
                let Some(slot) = s.regions.get_mut(index) else {
                    return;
                };
                let retire = match slot {
                    Some(r) if r.region.same(region) => {
                        r.live = r.live.saturating_sub(1);
                        give_back(&mut r.free, off, l);
                        r.live == 0 && r.oversized
                    }
                    _ => return,
                };
                let retired = if retire { slot.take() } else { None };
                drop(s);
                // Dropped after the lock: the IOMMU unmap and munmap happen
                // when the last handle goes (the buffer being dropped holds
                // one until just after this returns), never under the lock.
                drop(retired);
            })),
        )?;
        // A new region's pages come zeroed from the kernel (anonymous
        // mappings); only reused ones are cleared.
        if !fresh {
            buf.fill(0, len, 0)?;
        }
        Ok(buf)
    }

    /// Number of regions mapped now (an oversized region no longer
    /// counts once its last buffer is gone).
    pub fn regions(&self) -> usize {
        self.state
            .lock()
            .map(|s| s.regions.iter().flatten().count())
            .unwrap_or(0)
    }

    /// Buffers handed out and not yet dropped (pages kept by a
    /// [`crate::DmaPages`] count until it goes too).
    pub fn live_buffers(&self) -> usize {
        self.state
            .lock()
            .map(|s| s.regions.iter().flatten().map(|r| r.live).sum())
            .unwrap_or(0)
    }

    /// Bytes currently free across all regions.
    pub fn free_bytes(&self) -> usize {
        self.state
            .lock()
            .map(|s| {
                s.regions
                    .iter()
                    .flatten()
                    .flat_map(|r| r.free.iter().map(|&(_, l)| l))
                    .sum()
            })
            .unwrap_or(0)
    }
}

/// Returns the run (off, len) to the sorted free list, merged with the runs
/// it touches: a binary search and at most one insert or remove, within the
/// capacity reserved at allocation (no sort, no allocation).
pub(crate) fn give_back(free: &mut Vec<(usize, usize)>, off: usize, len: usize) {
    let i = free.partition_point(|&(o, _)| o < off);
    let joins_prev = i > 0 && free[i - 1].0 + free[i - 1].1 == off;
    let joins_next = i < free.len() && off + len == free[i].0;
    match (joins_prev, joins_next) {
        (true, true) => {
            free[i - 1].1 += len + free[i].1;
            free.remove(i);
        }
        (true, false) => free[i - 1].1 += len,
        (false, true) => free[i] = (off, len + free[i].1),
        (false, false) => free.insert(i, (off, len)),
    }
}

/// The refusal of a length that cannot be rounded up to whole pages.
pub(crate) fn too_large(len: usize, page: usize) -> String {
    format!(
        "{len} bytes cannot be rounded up to whole {} KiB pages (beyond the address space): \
         ask for less",
        page / 1024
    )
}

/// The refusal once a panic left the allocator's lock poisoned: its state
/// may be half updated, so it hands out nothing more. (Nothing that can
/// panic runs under the lock today — regions are mapped outside it — so
/// this is a guard, not an expected path.)
pub(crate) const POISONED: &str = "the allocator is unusable: a thread panicked while it held \
     the allocator's lock, so its memory is kept and no more is handed out; open the controller \
     again";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::HostMemory;
    use crate::test_mapper::FixedIova;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Hands out fake IOVAs and counts maps/unmaps.
    struct FakeMapper {
        next: AtomicU64,
        live: AtomicU64,
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
            true
        }
    }

    #[test]
    fn carves_reuses_and_unmaps() {
        let mapper = Arc::new(FakeMapper {
            next: AtomicU64::new(0x10_0000_0000),
            live: AtomicU64::new(0),
        });
        let a = DmaAllocator::new(mapper.clone(), PageBacking::Small4K);
        let b1 = a.alloc(100).unwrap();
        let b2 = a.alloc(8192).unwrap();
        assert_eq!(b1.len(), 4096);
        assert_eq!(b1.iova() % 4096, 0);
        assert_eq!(b2.iova(), b1.iova() + 4096);
        assert_eq!(a.regions(), 1);
        b2.write_u64(8, 0x1122_3344_5566_7788).unwrap();
        assert_eq!(b2.read_u64(8).unwrap(), 0x1122_3344_5566_7788);
        assert_eq!(b2.read_u32(12).unwrap(), 0x1122_3344);
        // Inside but misaligned, and outside: each says which.
        assert_eq!(
            b2.read_u32(2).unwrap_err().to_string(),
            "access of 4 bytes at offset 2 of a DMA buffer is not 4-byte aligned"
        );
        assert_eq!(
            b2.write_u64(8188, 0).unwrap_err().to_string(),
            "access of 8 bytes at offset 8188 is outside a 8192-byte DMA buffer"
        );
        assert!(matches!(
            b2.write_u64_run(4, 2, |_| 0),
            Err(DmaError::Misaligned { align: 8, .. })
        ));
        assert!(matches!(
            b2.write_u64_run(8, usize::MAX / 4, |_| 0),
            Err(DmaError::OutOfBounds { .. })
        ));
        assert!(b2.read_u32(8190).is_err());
        assert!(b2.write_bytes(8000, &[0; 200]).is_err());
        let before = a.free_bytes();
        drop(b2);
        assert_eq!(a.free_bytes(), before + 8192);
        let b3 = a.alloc(8192).unwrap();
        assert_eq!(b3.to_vec(), vec![0; 8192], "reused pages are zeroed");
        let big = a.alloc(3 << 20).unwrap();
        assert_eq!(a.regions(), 2);
        // Out-of-order frees merge back into one run, without allocating.
        let parts: Vec<_> = (0..6).map(|_| a.alloc(4096).unwrap()).collect();
        let free_before = a.free_bytes();
        let mut parts: Vec<Option<DmaBuffer>> = parts.into_iter().map(Some).collect();
        for i in [1, 3, 5, 0, 4, 2] {
            parts[i] = None;
        }
        assert_eq!(a.free_bytes(), free_before + 6 * 4096);
        let whole = a.alloc(6 * 4096).unwrap();
        assert_eq!(a.regions(), 2, "the merged run is reused");
        drop(whole);
        drop((b1, b3, big));
        drop(a);
        assert_eq!(
            mapper.live.load(Ordering::SeqCst),
            0,
            "every region unmapped"
        );
    }

    fn fake() -> Arc<FakeMapper> {
        Arc::new(FakeMapper {
            next: AtomicU64::new(0x10_0000_0000),
            live: AtomicU64::new(0),
        })
    }

    /// A mapper whose second and later maps wait until released: a region
    /// being mapped for a long time (a gigabyte populated and IOMMU-mapped).
    struct SlowMapper {
        next: AtomicU64,
        maps: AtomicU64,
        entered: std::sync::mpsc::SyncSender<()>,
        release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    }
    // SAFETY: no device is behind this test mapper: nothing can reach the
    // memory it "maps", so every promise of the trait holds trivially.
    unsafe impl DmaMapper for SlowMapper {
        fn map(&self, mem: &Arc<HostMemory>) -> Result<u64, DmaError> {
            if self.maps.fetch_add(1, Ordering::SeqCst) > 0 {
                let _ = self.entered.send(());
                let _ = self
                    .release
                    .lock()
                    .unwrap()
                    .recv_timeout(std::time::Duration::from_secs(30));
            }
            Ok(0x10_0000_0000 + self.next.fetch_add(mem.len() as u64, Ordering::SeqCst))
        }
        fn unmap(&self, _m: crate::memory::Unmapping<'_>) -> bool {
            true
        }
    }

    #[test]
    fn allocations_from_mapped_regions_do_not_wait_for_a_new_region_being_mapped() {
        use std::time::Duration;
        let (entered_tx, entered) = std::sync::mpsc::sync_channel(1);
        let (release, release_rx) = std::sync::mpsc::channel();
        let a = Arc::new(DmaAllocator::new(
            Arc::new(SlowMapper {
                next: AtomicU64::new(0),
                maps: AtomicU64::new(0),
                entered: entered_tx,
                release: std::sync::Mutex::new(release_rx),
            }),
            PageBacking::Small4K,
        ));
        let first = a.alloc(4096).unwrap();
        // Another thread needs a new region; its mapping stalls.
        let big = {
            let a = a.clone();
            std::thread::spawn(move || a.alloc(3 << 20))
        };
        entered
            .recv_timeout(Duration::from_secs(10))
            .expect("the second map call starts");
        // Meanwhile a small allocation fits the first region and must not
        // wait for that mapping (it did when regions were mapped under the
        // allocator's lock).
        let (tx, small) = std::sync::mpsc::channel();
        {
            let a = a.clone();
            std::thread::spawn(move || {
                let _ = tx.send(a.alloc(8192).map(|b| (b.iova(), b.to_vec())));
            });
        }
        let got = small.recv_timeout(Duration::from_secs(5));
        release.send(()).unwrap();
        let (iova, bytes) = got
            .expect("an allocation from a mapped region waited for another region's mapping")
            .unwrap();
        assert_eq!(iova, first.iova() + 4096);
        assert!(bytes.iter().all(|&b| b == 0));
        let big = big.join().unwrap().unwrap();
        assert!(
            big.to_vec().iter().all(|&b| b == 0),
            "a new region is zeroed"
        );
        assert_eq!(a.regions(), 2);
    }

    /// Records which of the two map calls each mapping came through;
    /// refuses read-only mappings when `refuse_read_only`.
    #[derive(Default)]
    struct AccessMapper {
        next: AtomicU64,
        read_only: std::sync::Mutex<Vec<bool>>,
        refuse_read_only: bool,
    }
    // SAFETY: no device is behind this test mapper: nothing can reach the
    // memory it "maps", so every promise of the trait holds trivially.
    unsafe impl DmaMapper for AccessMapper {
        fn map(&self, mem: &Arc<HostMemory>) -> Result<u64, DmaError> {
            self.read_only.lock().unwrap().push(false);
            Ok(0x10_0000_0000 + self.next.fetch_add(mem.len() as u64, Ordering::SeqCst))
        }
        fn map_device_read_only(&self, mem: &Arc<HostMemory>) -> Result<u64, DmaError> {
            if self.refuse_read_only {
                return Err(DmaError::InvalidAllocation("read-only refused".into()));
            }
            self.read_only.lock().unwrap().push(true);
            Ok(0x10_0000_0000 + self.next.fetch_add(mem.len() as u64, Ordering::SeqCst))
        }
        fn unmap(&self, _m: crate::memory::Unmapping<'_>) -> bool {
            true
        }
    }

    #[test]
    fn a_read_only_allocator_maps_its_own_regions_read_only() {
        let mapper = Arc::new(AccessMapper::default());
        let rw = DmaAllocator::new(mapper.clone(), PageBacking::Small4K);
        let ro =
            DmaAllocator::with_access(mapper.clone(), PageBacking::Small4K, DeviceAccess::ReadOnly);
        assert_eq!(
            (rw.access(), ro.access()),
            (DeviceAccess::ReadWrite, DeviceAccess::ReadOnly)
        );
        let (a, b) = (rw.alloc(4096).unwrap(), ro.alloc(4096).unwrap());
        let c = ro.alloc(3 << 20).unwrap();
        assert_eq!(*mapper.read_only.lock().unwrap(), [false, true, true]);
        // Never one region for both kinds: each allocator carves its own.
        assert_eq!((rw.regions(), ro.regions()), (1, 2));
        assert_ne!(a.iova(), b.iova());
        drop((a, b, c));
    }

    #[test]
    fn alloc_or_takes_the_fallback_only_when_the_first_allocator_fails() {
        for refuse_read_only in [false, true] {
            let mapper = Arc::new(AccessMapper {
                refuse_read_only,
                ..Default::default()
            });
            let rw = DmaAllocator::new(mapper.clone(), PageBacking::Small4K);
            let ro = DmaAllocator::with_access(
                mapper.clone(),
                PageBacking::Small4K,
                DeviceAccess::ReadOnly,
            );
            let b = ro.alloc_or(4096, &rw).unwrap();
            assert_eq!(*mapper.read_only.lock().unwrap(), [!refuse_read_only]);
            let (from_ro, from_rw) = (ro.live_buffers(), rw.live_buffers());
            assert_eq!(
                (from_ro, from_rw),
                if refuse_read_only { (0, 1) } else { (1, 0) }
            );
            let f = ro.fallbacks();
            if refuse_read_only {
                assert_eq!(f.count, 1);
                assert!(f.last_reason.is_some_and(|w| !w.is_empty()));
            } else {
                assert_eq!(f, Fallbacks::default());
            }
            assert_eq!(rw.fallbacks(), Fallbacks::default());
            drop(b);
        }
    }

    #[test]
    fn detached_pages_stay_out_of_the_allocator_while_the_buffer_lives() {
        let a = DmaAllocator::new(fake(), PageBacking::Small4K);
        let mut buf = a.alloc(4096).unwrap();
        let free = a.free_bytes();
        drop(buf.detach_pages());
        // The buffer still reads and writes its pages: nobody else may get them.
        assert_eq!(
            a.free_bytes(),
            free,
            "pages returned while the buffer lives"
        );
        let other = a.alloc(4096).unwrap();
        assert_ne!(other.iova(), buf.iova());
        buf.write_u64(0, 7).unwrap();
        assert_eq!(other.read_u64(0).unwrap(), 0);
        // The detached pages outlive the buffer, and both must go.
        let pages = buf.detach_pages();
        drop(buf);
        assert_eq!(a.free_bytes(), free - 4096, "`other` and the pages");
        drop(pages);
        assert_eq!(
            a.free_bytes(),
            free,
            "the pages return when the last owner goes"
        );
        // `into_pages` hands the ownership over whole.
        let b = a.alloc(8192).unwrap();
        let pages = b.into_pages();
        assert_eq!(a.free_bytes(), free - 8192);
        drop(pages);
        assert_eq!(a.free_bytes(), free);
        drop(other);
    }

    /// A region made for one allocation larger than a standard region goes
    /// back (IOMMU unmap, munmap) with its last buffer, whoever holds it
    /// last (a split piece, detached pages); standard regions stay for
    /// reuse. Its slot serves the next new region, and a free of a buffer
    /// of another region in that slot is not confused with it.
    #[test]
    fn an_oversized_region_is_unmapped_with_its_last_buffer() {
        let mapper = fake();
        let a = DmaAllocator::new(mapper.clone(), PageBacking::Small4K);
        let live = || mapper.live.load(Ordering::SeqCst);
        let small = a.alloc(4096).unwrap();
        let big = a.alloc((3 << 20) + 100).unwrap();
        assert_eq!((a.regions(), live()), (2, 2));
        assert_eq!(big.len(), (3 << 20) + 4096);
        let mut pieces = big.split(1 << 20).unwrap();
        let kept = pieces[3].detach_pages();
        let last = pieces.pop().unwrap();
        drop(pieces);
        assert_eq!(live(), 2, "a piece still holds the region");
        drop(last);
        assert_eq!(live(), 2, "detached pages still hold the region");
        assert_eq!(a.live_buffers(), 2);
        drop(kept);
        assert_eq!((a.regions(), live(), a.live_buffers()), (1, 1, 1));
        // The standard region stays mapped without buffers, for reuse.
        let iova = small.iova();
        drop(small);
        assert_eq!((a.regions(), live()), (1, 1));
        assert_eq!(a.alloc(4096).unwrap().iova(), iova);
        // Big allocations again: the freed slot is reused, and each region
        // goes with its own buffer.
        let b1 = a.alloc(4 << 20).unwrap();
        let b2 = a.alloc(5 << 20).unwrap();
        assert_eq!((a.regions(), live()), (3, 3));
        drop(b1);
        assert_eq!((a.regions(), live()), (2, 2));
        let b3 = a.alloc(3 << 20).unwrap();
        assert_eq!((a.regions(), live()), (3, 3));
        drop(b2);
        assert_eq!((a.regions(), live()), (2, 2));
        b3.write_u64(8, 1).unwrap();
        drop(b3);
        assert_eq!((a.regions(), live()), (1, 1));
        drop(a);
        assert_eq!(live(), 0);
    }

    #[test]
    fn pages_return_to_their_own_region_even_when_iovas_repeat() {
        let a = DmaAllocator::new(Arc::new(FixedIova(0x20_0000)), PageBacking::Small4K);
        let whole = a.alloc(2 << 20).unwrap(); // fills the first region
        let small = a.alloc(4096).unwrap(); // a second region, same IOVA
        assert_eq!(a.regions(), 2);
        drop(small);
        let next = a.alloc(4096).unwrap();
        let (w, n) = (whole.as_ptr() as usize, next.as_ptr() as usize);
        assert!(
            n + 4096 <= w || w + (2 << 20) <= n,
            "a new buffer overlaps a live one: its pages went back to the wrong region"
        );
    }

    #[test]
    fn a_mapper_iova_that_is_misaligned_or_too_high_is_refused() {
        for iova in [0x20_0800, !0xfff_u64] {
            let a = DmaAllocator::new(Arc::new(FixedIova(iova)), PageBacking::Small4K);
            let e = a.alloc(4096).unwrap_err();
            assert!(
                e.to_string().contains(&format!("{iova:#x}")),
                "{iova:#x}: {e}"
            );
        }
    }
}
