//! # upnvme-dma: the only crate of upnvme that contains `unsafe`
//!
//! Everything that touches memory the compiler cannot see through lives here, each
//! `unsafe` block with a `// SAFETY:` argument:
//!
//! - [`pci`]: PCI addresses and the sysfs checks that turn a wrong setup into an
//!   error that says how to fix it (device absent, not NVMe, bound to another
//!   driver, IOMMU off, group not viable).
//! - [`vfio`]: the VFIO container (Type1v2 IOMMU), group and device file
//!   descriptors, PCI configuration space, the IOMMU's valid IOVA ranges and DMA
//!   map/unmap — a thin layer of our own over the kernel's ioctl ABI
//!   (`linux/vfio.h`), every call checked.
//! - [`mmio`]: BAR0 mapped into the process with bounds-checked volatile 32/64-bit
//!   register accessors.
//! - [`memory`]: hugepage-backed (2 MiB or 1 GiB, or an explicit opt-in to 4 KiB
//!   pages) DMA memory, populated and locked, and [`DmaBuffer`], through which the
//!   CPU reads and writes device-visible memory by copy, volatile or atomic access
//!   only — never through a Rust reference.
//! - [`iova`]: allocation of I/O virtual addresses inside the ranges the IOMMU
//!   reports as valid.
//! - [`alloc`]: a page-granular allocator that carves DMA regions into buffers.
//! - [`pool`]: per-thread pools of fixed-size buffers (O(1) get/put).
//! - [`registered`]: memory the application mapped (a `memmap2::MmapMut`),
//!   owned by the driver while registered for DMA and carved into buffers.
//! - [`queue_memory`]: the SQ/CQ ring accessors of the I/O hot path.
//! - [`list_pages`]: the per-command list pages (PRP Lists, SGL segments,
//!   ranges), one area per tracker slot, with the hot path's PRP List writer.
//! - [`barrier`]: CPU–device ordering (before a doorbell, after a Phase Tag,
//!   between a shadow doorbell and its EventIdx), per architecture.

#![allow(unsafe_code)]

pub mod alloc;
pub mod alloc_count;
pub mod barrier;
pub mod error;
pub mod iova;
pub mod list_pages;
pub mod memory;
pub mod mmio;
pub mod pci;
pub mod pool;
pub mod queue_memory;
pub mod registered;
pub mod shared_words;
pub mod sigbus;
#[cfg(test)]
mod test_mapper;
pub mod tsc;
pub mod vfio;

pub use alloc::{DmaAllocator, DmaMapper, Fallbacks};
pub use error::DmaError;
pub use iova::{IovaAllocator, IovaRange};
pub use list_pages::ListPages;
/// The `memmap2` crate whose `MmapMut` [`RegisteredMemory`] takes, re-exported
/// so applications use the same version.
pub use memmap2;
pub use memory::{DeviceAccess, DmaBuffer, DmaPages, DmaRegion, PageBacking, Unmapping};
pub use mmio::Bar;
pub use pci::{PciAddress, Sysfs};
pub use pool::{DmaPool, NotFromThisPool};
pub use queue_memory::{CqMemory, CqSlot, SqMemory};
pub use registered::{
    CarveError, RegisterError, RegisterFailure, RegisteredMemory, UnregisterError,
};
pub use shared_words::SharedWords;
pub use vfio::{DeviceRequest, VfioContainer, VfioDevice};

/// Size of the pages the allocator hands out and the NVMe memory page size the
/// driver configures (`CC.MPS` = 0, 4 KiB).
pub const PAGE_SIZE: usize = 4096;
