//! Test support: a [`DmaMapper`] that maps every region at one fixed IOVA
//! (no device behind it), for the unit tests of this crate's accessors.

use std::sync::Arc;

use crate::error::DmaError;
use crate::memory::{DmaBuffer, DmaMapper, DmaRegion, HostMemory, PageBacking, Unmapping};

/// Maps every region at the IOVA it holds: a mapper may hand out one IOVA
/// twice, and the allocator must still tell its regions apart.
pub(crate) struct FixedIova(pub(crate) u64);

// SAFETY: no device is behind this test mapper: nothing can reach the
// memory it "maps", so every promise of the trait holds trivially.
unsafe impl DmaMapper for FixedIova {
    fn map(&self, _mem: &Arc<HostMemory>) -> Result<u64, DmaError> {
        Ok(self.0)
    }
    fn unmap(&self, _m: Unmapping<'_>) -> bool {
        true
    }
}

/// A buffer over the whole of a fresh `len`-byte region mapped at `iova`.
pub(crate) fn buffer_at(iova: u64, len: usize) -> DmaBuffer {
    let r = DmaRegion::new(len, PageBacking::Small4K, Arc::new(FixedIova(iova))).unwrap();
    DmaBuffer::new(r, 0, len, None).unwrap()
}
