//! The model's IOMMU: it hands out fake I/O virtual addresses for host memory
//! the driver maps, and resolves IOVAs back to that memory when the model
//! performs "DMA". An access to an IOVA range that is not mapped is a DMA
//! fault — what the guest kernel logs as `DMAR: [DMA Read/Write] fault addr`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use upnvme_dma::DmaError;
use upnvme_dma::memory::{DmaMapper, HostMemory};

/// First IOVA handed out (above 4 GiB, so 32-bit truncation bugs fault).
const IOVA_BASE: u64 = 0x1_0000_0000;
/// Alignment of every mapping, and an unmapped guard gap of at least this
/// much between mappings, so off-the-end accesses fault.
const IOVA_ALIGN: u64 = 2 << 20;

/// A failed DMA access: the IOVA range is not (entirely) mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DmaFault {
    /// First IOVA of the access.
    pub iova: u64,
    /// Length of the access in bytes.
    pub len: usize,
    /// True for a device write (to host memory), false for a read.
    pub write: bool,
    /// The range is mapped, for device reads only (a write was refused).
    pub read_only: bool,
}

impl fmt::Display for DmaFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DMA {} fault at IOVA {:#x} ({} bytes): {}",
            if self.write { "write" } else { "read" },
            self.iova,
            self.len,
            if self.read_only {
                "mapped for device reads only"
            } else {
                "not mapped"
            }
        )
    }
}

struct Table {
    next: u64,
    /// Last IOVA the table may hand out ([`IovaTable::limit_window`]).
    end: u64,
    /// Each mapping's memory, and whether the device may only read it
    /// ([`DmaMapper::map_device_read_only`]).
    maps: BTreeMap<u64, (Arc<HostMemory>, bool)>,
}

/// IOVA → host memory table; the [`DmaMapper`] of the model's DMA allocator
/// and of memory the application registers.
///
/// As [`DmaMapper::unmap`] requires, no handle of a mapping's memory
/// outlives its unmap: every DMA access resolves and copies under the
/// table's lock, so once `unmap` has taken the entry out, the model can
/// neither reach the memory nor hold it (an application's registered
/// mapping can then be handed back).
pub(crate) struct IovaTable {
    inner: Mutex<Table>,
    /// Refuse read-only mappings ([`super::ModelConfig::refuse_read_only_mappings`]).
    refuse_read_only: bool,
}

impl IovaTable {
    /// An empty table.
    pub fn new(refuse_read_only: bool) -> Self {
        IovaTable {
            inner: Mutex::new(Table {
                next: IOVA_BASE,
                end: u64::MAX,
                maps: BTreeMap::new(),
            }),
            refuse_read_only,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `access` on the mapping holding `[iova, iova + len)` entirely,
    /// at the offset of `iova` inside it, under the table's lock (so no
    /// handle of the memory escapes, and an unmap waits for the access).
    fn access<R>(
        &self,
        iova: u64,
        len: usize,
        write: bool,
        access: impl FnOnce(&HostMemory, usize) -> Result<R, DmaError>,
    ) -> Result<R, DmaFault> {
        let fault = DmaFault {
            iova,
            len,
            write,
            read_only: false,
        };
        let t = self.lock();
        let (&base, (mem, read_only)) = t.maps.range(..=iova).next_back().ok_or(fault)?;
        let off = usize::try_from(iova - base).map_err(|_| fault)?;
        match off.checked_add(len) {
            Some(end) if end <= mem.len() => {
                if write && *read_only {
                    return Err(DmaFault {
                        read_only: true,
                        ..fault
                    });
                }
                access(mem, off).map_err(|_| fault)
            }
            _ => Err(fault),
        }
    }

    // The one place outside dma/ with `unsafe`: the model is a device
    // emulated in Rust, so its DMA is inside Rust's memory model, and each
    // access must not race with the host's (docs/DESIGN.md, "Escape
    // hatches"). The model's callers of these four keep the driver's
    // protocol: submission queue entries are read after their doorbell
    // (the host writes only slots past the tail it announced), data, PRP
    // and SGL lists and metadata only for a command in flight (whose
    // buffers the host gave up until its completion), completion queue
    // slots are written only once the host released them through the CQ
    // head (a full CQ makes the model wait), and the words both sides poll
    // (shadow doorbells, event indexes, the CQE phase dword) with 32-bit
    // atomics, as the driver does. Calls come from the host's own thread
    // (a doorbell write or register read), under the model's state lock.

    /// Copies `dst.len()` bytes from IOVA `iova` (a device read).
    #[allow(unsafe_code)]
    pub fn read(&self, iova: u64, dst: &mut [u8]) -> Result<(), DmaFault> {
        // SAFETY: a device read of memory the protocol hands the device
        // (see above): no host access races with it.
        self.access(iova, dst.len(), false, |mem, off| unsafe {
            mem.read_bytes(off, dst)
        })
    }

    /// Copies `src` to IOVA `iova` (a device write).
    #[allow(unsafe_code)]
    pub fn write(&self, iova: u64, src: &[u8]) -> Result<(), DmaFault> {
        // SAFETY: a device write of memory the protocol hands the device
        // (see above): no host access races with it.
        self.access(iova, src.len(), true, |mem, off| unsafe {
            mem.write_bytes(off, src)
        })
    }

    /// Reads a little-endian dword with acquire ordering: every host store
    /// made before the host's release store of this word (a shadow doorbell
    /// update after writing submission queue entries) is visible afterwards.
    #[allow(unsafe_code)]
    pub fn read_u32_acquire(&self, iova: u64) -> Result<u32, DmaFault> {
        // SAFETY: a word both sides access at once (shadow doorbell, event
        // index), which the host accesses only with 32-bit atomics.
        self.access(iova, 4, false, |mem, off| unsafe {
            mem.load_acquire_u32(off)
        })
    }

    /// Writes a little-endian dword with release ordering: every earlier
    /// write of the model to host memory is visible before it (the CQE phase
    /// dword, event index entries).
    #[allow(unsafe_code)]
    pub fn write_u32_release(&self, iova: u64, value: u32) -> Result<(), DmaFault> {
        // SAFETY: the CQE phase dword or an event index: the host reads it
        // only with 32-bit atomic loads while the model may write it.
        self.access(iova, 4, true, |mem, off| unsafe {
            mem.store_release_u32(off, value)
        })
    }

    /// Reads a little-endian qword (a PRP entry).
    pub fn read_u64(&self, iova: u64) -> Result<u64, DmaFault> {
        let mut b = [0u8; 8];
        self.read(iova, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Number of live mappings.
    pub fn mappings(&self) -> usize {
        self.lock().maps.len()
    }

    /// Whether `iova` lies in a mapping, and if so whether the device may
    /// only read it (`Some(true)`).
    pub fn read_only_at(&self, iova: u64) -> Option<bool> {
        let t = self.lock();
        let (&base, (mem, read_only)) = t.maps.range(..=iova).next_back()?;
        (iova - base < mem.len() as u64).then_some(*read_only)
    }

    /// Lets the table hand out only `bytes` more of IOVA space (counted
    /// from the next free IOVA, guard gaps included), as an IOMMU with a
    /// small address width would; reported through
    /// [`DmaMapper::iova_ranges`].
    pub fn limit_window(&self, bytes: u64) {
        let mut t = self.lock();
        t.end = t.next.saturating_add(bytes).saturating_sub(1);
    }
}

// The model's fifth escape hatch (see its device accesses above): the
// trait's promises are what the table does.
// SAFETY: `insert` fails before it records anything, and keeps `mem` only
// in the table; IOVAs only grow (`next`), with a guard gap, so no two live
// mappings overlap; `unmap` refuses another mapper's mapping and returns
// true after the entry (and its `Arc`) left the table — the model reaches
// host memory only through the table, so it cannot reach that memory any
// more.
#[allow(unsafe_code)]
unsafe impl DmaMapper for IovaTable {
    fn map(&self, mem: &Arc<HostMemory>) -> Result<u64, DmaError> {
        self.insert(mem, false)
    }

    fn map_device_read_only(&self, mem: &Arc<HostMemory>) -> Result<u64, DmaError> {
        if self.refuse_read_only {
            return Err(DmaError::InvalidAllocation(
                "the model's IOMMU refuses read-only mappings (ModelConfig::refuse_read_only_mappings)"
                    .into(),
            ));
        }
        self.insert(mem, true)
    }

    fn unmap(&self, mapping: upnvme_dma::Unmapping<'_>) -> bool {
        if !mapping.made_by(self) {
            return false;
        }
        // Take the entry out under the lock, drop the handle after it.
        let mem = self.lock().maps.remove(&mapping.iova());
        drop(mem);
        true
    }

    fn iova_ranges(&self) -> Vec<upnvme_dma::IovaRange> {
        let end = self.lock().end;
        vec![upnvme_dma::IovaRange {
            start: IOVA_BASE,
            end,
        }]
    }
}

impl IovaTable {
    /// Maps `mem` at the next free IOVA, for device reads only when
    /// `read_only`.
    fn insert(&self, mem: &Arc<HostMemory>, read_only: bool) -> Result<u64, DmaError> {
        let mut t = self.lock();
        let iova = t.next;
        let span = (mem.len() as u64)
            .checked_next_multiple_of(IOVA_ALIGN)
            .and_then(|s| s.checked_add(IOVA_ALIGN))
            .and_then(|s| iova.checked_add(s))
            .ok_or_else(|| DmaError::InvalidAllocation("model IOVA space exhausted".into()))?;
        if iova.saturating_add(mem.len() as u64).saturating_sub(1) > t.end {
            return Err(DmaError::IovaExhausted {
                size: mem.len(),
                ranges: format!("[{IOVA_BASE:#x}..={:#x}]", t.end),
            });
        }
        t.next = span;
        t.maps.insert(iova, (mem.clone(), read_only));
        Ok(iova)
    }
}
