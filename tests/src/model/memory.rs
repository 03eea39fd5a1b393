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
    maps: BTreeMap<u64, Arc<HostMemory>>,
}

/// IOVA → host memory table; the [`DmaMapper`] of the model's DMA allocator.
pub(crate) struct IovaTable {
    inner: Mutex<Table>,
}

impl IovaTable {
    /// An empty table.
    pub fn new() -> Self {
        IovaTable {
            inner: Mutex::new(Table {
                next: IOVA_BASE,
                maps: BTreeMap::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The mapping holding `[iova, iova + len)` entirely, with the offset of
    /// `iova` inside it.
    fn resolve(
        &self,
        iova: u64,
        len: usize,
        write: bool,
    ) -> Result<(Arc<HostMemory>, usize), DmaFault> {
        let fault = DmaFault { iova, len, write };
        let t = self.lock();
        let (&base, mem) = t.maps.range(..=iova).next_back().ok_or(fault)?;
        let off = usize::try_from(iova - base).map_err(|_| fault)?;
        match off.checked_add(len) {
            Some(end) if end <= mem.len() => Ok((mem.clone(), off)),
            _ => Err(fault),
        }
    }

    /// Copies `dst.len()` bytes from IOVA `iova` (a device read).
    pub fn read(&self, iova: u64, dst: &mut [u8]) -> Result<(), DmaFault> {
        let (mem, off) = self.resolve(iova, dst.len(), false)?;
        mem.read_bytes(off, dst).map_err(|_| DmaFault {
            iova,
            len: dst.len(),
            write: false,
        })
    }

    /// Copies `src` to IOVA `iova` (a device write).
    pub fn write(&self, iova: u64, src: &[u8]) -> Result<(), DmaFault> {
        let (mem, off) = self.resolve(iova, src.len(), true)?;
        mem.write_bytes(off, src).map_err(|_| DmaFault {
            iova,
            len: src.len(),
            write: true,
        })
    }

    /// Reads a little-endian dword with acquire ordering: every host store
    /// made before the host's release store of this word (a shadow doorbell
    /// update after writing submission queue entries) is visible afterwards.
    pub fn read_u32_acquire(&self, iova: u64) -> Result<u32, DmaFault> {
        let (mem, off) = self.resolve(iova, 4, false)?;
        mem.load_acquire_u32(off).map_err(|_| DmaFault {
            iova,
            len: 4,
            write: false,
        })
    }

    /// Writes a little-endian dword with release ordering: every earlier
    /// write of the model to host memory is visible before it (the CQE phase
    /// dword, event index entries).
    pub fn write_u32_release(&self, iova: u64, value: u32) -> Result<(), DmaFault> {
        let (mem, off) = self.resolve(iova, 4, true)?;
        mem.store_release_u32(off, value).map_err(|_| DmaFault {
            iova,
            len: 4,
            write: true,
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
        t.next = span;
        t.maps.insert(iova, mem.clone());
        Ok(iova)
    }

    fn unmap(&self, iova: u64, _len: usize) {
        self.lock().maps.remove(&iova);
    }
}
