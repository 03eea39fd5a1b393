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
}

impl fmt::Display for DmaFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DMA {} fault at IOVA {:#x} ({} bytes): not mapped",
            if self.write { "write" } else { "read" },
            self.iova,
            self.len
        )
    }
}

struct Table {
    next: u64,
    /// Last IOVA the table may hand out ([`IovaTable::limit_window`]).
    end: u64,
    maps: BTreeMap<u64, Arc<HostMemory>>,
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
}

impl IovaTable {
    /// An empty table.
    pub fn new() -> Self {
        IovaTable {
            inner: Mutex::new(Table {
                next: IOVA_BASE,
                end: u64::MAX,
                maps: BTreeMap::new(),
            }),
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
        let fault = DmaFault { iova, len, write };
        let t = self.lock();
        let (&base, mem) = t.maps.range(..=iova).next_back().ok_or(fault)?;
        let off = usize::try_from(iova - base).map_err(|_| fault)?;
        match off.checked_add(len) {
            Some(end) if end <= mem.len() => access(mem, off).map_err(|_| fault),
            _ => Err(fault),
        }
    }

    /// Copies `dst.len()` bytes from IOVA `iova` (a device read).
    pub fn read(&self, iova: u64, dst: &mut [u8]) -> Result<(), DmaFault> {
        self.access(iova, dst.len(), false, |mem, off| mem.read_bytes(off, dst))
    }

    /// Copies `src` to IOVA `iova` (a device write).
    pub fn write(&self, iova: u64, src: &[u8]) -> Result<(), DmaFault> {
        self.access(iova, src.len(), true, |mem, off| mem.write_bytes(off, src))
    }

    /// Reads a little-endian dword with acquire ordering: every host store
    /// made before the host's release store of this word (a shadow doorbell
    /// update after writing submission queue entries) is visible afterwards.
    pub fn read_u32_acquire(&self, iova: u64) -> Result<u32, DmaFault> {
        self.access(iova, 4, false, |mem, off| mem.load_acquire_u32(off))
    }

    /// Writes a little-endian dword with release ordering: every earlier
    /// write of the model to host memory is visible before it (the CQE phase
    /// dword, event index entries).
    pub fn write_u32_release(&self, iova: u64, value: u32) -> Result<(), DmaFault> {
        self.access(iova, 4, true, |mem, off| mem.store_release_u32(off, value))
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

    /// Lets the table hand out only `bytes` more of IOVA space (counted
    /// from the next free IOVA, guard gaps included), as an IOMMU with a
    /// small address width would; reported through
    /// [`DmaMapper::iova_ranges`].
    pub fn limit_window(&self, bytes: u64) {
        let mut t = self.lock();
        t.end = t.next.saturating_add(bytes).saturating_sub(1);
    }
}

impl DmaMapper for IovaTable {
    fn map(&self, mem: &Arc<HostMemory>) -> Result<u64, DmaError> {
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
        t.maps.insert(iova, mem.clone());
        Ok(iova)
    }

    fn unmap(&self, mapping: upnvme_dma::Unmapping) -> bool {
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
