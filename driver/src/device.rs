//! The device abstraction the driver is written against: a register file
//! (BAR0) plus a way to get DMA memory the device can reach.
//!
//! Two implementations exist: [`VfioNvme`] (a real or QEMU-emulated controller
//! through VFIO) and the in-memory controller model in the `upnvme-tests` crate,
//! which reads commands from the real submission queue memory and writes real
//! completion entries — so host tests and the guest run the same driver code.

use std::sync::Arc;
use std::time::Duration;

use upnvme_dma::{
    DeviceAccess, DeviceRequest, DmaAllocator, DmaBuffer, DmaError, DmaMapper, PageBacking,
    PciAddress, Sysfs, VfioDevice,
};

/// A channel on which the kernel (or a test's device) asks for the device
/// back: VFIO's device request, raised before a removal or an unbind.
pub trait ReleaseRequest: Send + Sync {
    /// Waits up to `timeout`; true when the request came.
    fn wait(&self, timeout: Duration) -> bool;
}

impl ReleaseRequest for DeviceRequest {
    fn wait(&self, timeout: Duration) -> bool {
        DeviceRequest::wait(self, timeout)
    }
}

/// Registers and DMA memory of one NVMe controller.
///
/// Register accessors are infallible by design: like a PCI master abort, an
/// access the implementation cannot perform reads all ones and drops writes.
/// The driver treats an all-ones `CSTS` as "device gone" on every wait.
pub trait Device: Send + Sync + 'static {
    /// Reads a 32-bit register of BAR0 at `offset`.
    fn read32(&self, offset: usize) -> u32;
    /// Writes a 32-bit register (or doorbell) of BAR0 at `offset`. Every store to
    /// DMA memory made before the call is visible to the device before the write.
    fn write32(&self, offset: usize, value: u32);
    /// Reads a 64-bit register (`CAP`, `ASQ`, `ACQ`).
    fn read64(&self, offset: usize) -> u64;
    /// Writes a 64-bit register (`ASQ`, `ACQ`).
    fn write64(&self, offset: usize, value: u64);
    /// Size of BAR0 in bytes; doorbells beyond it do not exist.
    fn bar_len(&self) -> usize;
    /// Allocates zeroed, page-aligned DMA memory of at least `len` bytes.
    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer, DmaError>;
    /// Like [`Device::alloc_dma`], for memory the controller only reads:
    /// submission queues (the admin SQ and I/O SQs) and the pages of PRP
    /// Lists and SGL segments. Where the IOMMU allows it the memory is
    /// mapped without write permission, so a device cannot rewrite a command
    /// after the driver wrote and checked it. Never for memory a command
    /// makes the device write (a Read's data): that write would fault. The
    /// default: [`Device::alloc_dma`].
    fn alloc_dma_device_read_only(&self, len: usize) -> Result<DmaBuffer, DmaError> {
        self.alloc_dma(len)
    }
    /// Whether the memory of [`Device::alloc_dma_device_read_only`] is
    /// mapped read-only for the device. The default:
    /// [`ReadOnlyMemory::NotOffered`] (the default allocation is
    /// [`Device::alloc_dma`]'s). A `Device` that wraps another and forwards
    /// `alloc_dma_device_read_only` must forward this too, or it reports
    /// `NotOffered` for memory that is read-only.
    fn read_only_memory(&self) -> ReadOnlyMemory {
        ReadOnlyMemory::NotOffered
    }
    /// A name for messages: the PCI address, or "model".
    fn name(&self) -> String;
    /// What maps memory the application owns for this device's DMA
    /// ([`crate::Controller::register_memory`]): the same IOMMU mapper (and
    /// IOVA space) as [`Device::alloc_dma`]'s memory. `None` (the default):
    /// the device cannot take application memory.
    fn dma_mapper(&self) -> Option<Arc<dyn DmaMapper>> {
        None
    }
    /// The channel on which the device may be asked back, if it has one
    /// (VFIO's device request). The controller watches it from a thread of
    /// its own and releases the device when it fires.
    fn release_request(&self) -> Option<Arc<dyn ReleaseRequest>> {
        None
    }
    /// Gives the device back: no DMA from here on, register accesses read
    /// all ones and writes are dropped, and the kernel's handle is closed.
    /// Called once the controller has ended its use of the device, and when
    /// bring-up or shutdown could not disable a controller (CC.EN = 0 never
    /// brought CSTS.RDY = 0): memory the controller was given (the admin
    /// queue, quarantined buffers) is freed only when this returns true.
    ///
    /// Returns whether the device can no longer reach memory. The default
    /// does nothing and returns false (such memory is then leaked, never
    /// handed out again).
    fn release(&self) -> bool {
        false
    }
}

/// How the memory a controller only reads — submission queues, PRP Lists,
/// SGL segments, Dataset Management and Copy ranges — is mapped
/// ([`crate::Controller::read_only_memory`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadOnlyMemory {
    /// All of it is mapped without the device's write permission: a device
    /// cannot rewrite a command after the driver wrote and checked it.
    Enforced,
    /// `allocations` of it (counted since the controller was opened: the
    /// admin path's PRP List pages add one per command that needs one)
    /// came from read-write memory, because read-only
    /// memory could not be had (`reason`, the most recent: no free 2 MiB
    /// hugepage for its region, or an IOMMU that refused the mapping). The
    /// driver works as before; those SQs and list pages are not protected
    /// from device writes. Reserving one more hugepage
    /// (`upnvme setup --hugepages N`) restores the protection for
    /// controllers opened afterwards.
    FellBack {
        /// Allocations served read-write.
        allocations: u64,
        /// Why the most recent could not be read-only.
        reason: String,
    },
    /// The device cannot restrict its access to memory (the [`Device`]
    /// default): all of it is read-write.
    NotOffered,
}

impl ReadOnlyMemory {
    /// From [`upnvme_dma::DmaAllocator::fallbacks`] of a read-only
    /// allocator whose fallback is read-write.
    pub fn from_fallbacks(f: upnvme_dma::Fallbacks) -> Self {
        if f.count == 0 {
            ReadOnlyMemory::Enforced
        } else {
            ReadOnlyMemory::FellBack {
                allocations: f.count,
                reason: f.last_reason.unwrap_or_default(),
            }
        }
    }
}

impl std::fmt::Display for ReadOnlyMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadOnlyMemory::Enforced => f.write_str("read-only for the device"),
            ReadOnlyMemory::FellBack {
                allocations,
                reason,
            } => write!(
                f,
                "read-write for the device in {allocations} allocation(s): {reason}"
            ),
            ReadOnlyMemory::NotOffered => f.write_str("read-write (the device cannot restrict it)"),
        }
    }
}

/// An NVMe controller reached through VFIO: BAR0 registers and hugepage DMA
/// memory mapped in the device's IOMMU container.
#[derive(Debug)]
pub struct VfioNvme {
    // Field order is drop order: DMA memory first (it holds the container), then
    // the device (bus mastering off, BAR unmapped).
    alloc: DmaAllocator,
    /// Memory the device only reads (SQs, PRP and SGL lists), mapped
    /// without write permission; 2 MiB pages (4 KiB with `Small4K`).
    alloc_read_only: DmaAllocator,
    device: VfioDevice,
    /// The device request eventfd, when the kernel offers one.
    request: Option<Arc<DeviceRequest>>,
}

impl VfioNvme {
    /// Opens the controller at `address` (which must be bound to vfio-pci) with
    /// DMA memory of the given page backing.
    pub fn open(
        address: &PciAddress,
        backing: PageBacking,
        sysfs: &Sysfs,
    ) -> Result<Self, DmaError> {
        let device = VfioDevice::open(address, sysfs)?;
        let mapper: Arc<dyn DmaMapper> = device.container().clone();
        let alloc = DmaAllocator::new(mapper.clone(), backing);
        // Read-only memory is small (SQs, list pages): 2 MiB pages even when
        // buffers use 1 GiB ones, so it never costs a second 1 GiB page.
        let read_only_backing = match backing {
            PageBacking::Small4K => PageBacking::Small4K,
            PageBacking::Huge2M | PageBacking::Huge1G => PageBacking::Huge2M,
        };
        let alloc_read_only =
            DmaAllocator::with_access(mapper, read_only_backing, DeviceAccess::ReadOnly);
        // Without a registered request channel the kernel blocks a removal
        // or unbind until the process closes the device; a device without
        // one (an old kernel) still works, it just cannot be asked back.
        let request = device.request_notifier().ok().map(Arc::new);
        Ok(VfioNvme {
            alloc,
            alloc_read_only,
            device,
            request,
        })
    }

    /// The underlying VFIO device (configuration space access).
    pub fn vfio(&self) -> &VfioDevice {
        &self.device
    }
}

impl Device for VfioNvme {
    #[inline]
    fn read32(&self, offset: usize) -> u32 {
        self.device.bar0().read32(offset)
    }
    #[inline]
    fn write32(&self, offset: usize, value: u32) {
        self.device.bar0().write32(offset, value)
    }
    #[inline]
    fn read64(&self, offset: usize) -> u64 {
        self.device.bar0().read64(offset)
    }
    #[inline]
    fn write64(&self, offset: usize, value: u64) {
        self.device.bar0().write64(offset, value)
    }
    fn bar_len(&self) -> usize {
        self.device.bar0().len()
    }
    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer, DmaError> {
        self.alloc.alloc(len)
    }
    fn alloc_dma_device_read_only(&self, len: usize) -> Result<DmaBuffer, DmaError> {
        // The protection is worth a 2 MiB page, not a failed open: without
        // one free (or with an IOMMU that refuses read-only mappings), the
        // memory comes from the read-write allocator, as before.
        self.alloc_read_only.alloc_or(len, &self.alloc)
    }
    fn read_only_memory(&self) -> ReadOnlyMemory {
        ReadOnlyMemory::from_fallbacks(self.alloc_read_only.fallbacks())
    }
    fn name(&self) -> String {
        self.device.address().to_string()
    }
    fn dma_mapper(&self) -> Option<Arc<dyn DmaMapper>> {
        Some(self.device.container().clone())
    }
    fn release_request(&self) -> Option<Arc<dyn ReleaseRequest>> {
        self.request.clone().map(|r| r as Arc<dyn ReleaseRequest>)
    }
    fn release(&self) -> bool {
        self.device.release()
    }
}
