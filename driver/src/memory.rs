//! Application-owned memory for DMA: [`Controller::register_memory`].
//!
//! An application that already has the memory its data lives in — an
//! anonymous hugepage mapping, a hugetlbfs or shmem file it mapped — hands
//! that `memmap2::MmapMut` to the controller by value and gets a
//! [`RegisteredMemory`]: the mapping is mapped into the controller's IOMMU
//! (the VFIO container and IOVA space of [`Controller::alloc_dma`]'s
//! memory), and [`DmaBuffer`](crate::DmaBuffer)s carved from it work like any
//! other (`submit`, `IoData::slice`, `IoVec` segments, `DmaPool::new`).
//! [`RegisteredMemory::unregister`] hands the mapping back, with what the
//! device wrote into it, once no buffer of it is alive; until then no safe
//! code can unmap it or form a reference into it. The argument is in
//! [`upnvme_dma::registered`]; usage in docs/memory.md.

use crate::controller::Controller;
use crate::device::Device;
use upnvme_dma::memmap2::MmapMut;
use upnvme_dma::{RegisterError, RegisterFailure, RegisteredMemory};

impl<D: Device> Controller<D> {
    /// Registers an application's memory mapping for this controller's DMA
    /// and takes ownership of it until [`RegisteredMemory::unregister`]
    /// hands it back.
    ///
    /// The mapping must be non-empty, start on a 4 KiB page and be whole
    /// 4 KiB pages long (any mapping `memmap2` makes at file offset 0 or a
    /// page multiple, of a page-multiple length); it must be pinnable by
    /// VFIO: anonymous memory (`MmapOptions::map_anon`, with
    /// `.huge(Some(21))` for 2 MiB hugepages), or a hugetlbfs or
    /// shmem/tmpfs file mapped shared. It gets one contiguous IOVA range
    /// inside the IOMMU's valid ranges. Every refusal is a
    /// [`RegisterError`] that says what is wrong and how to fix it, and
    /// hands the mapping back ([`RegisterError::into_mapping`]).
    ///
    /// The memory stays mapped for the device until it is unregistered or,
    /// if the registration is dropped instead, until its last buffer is
    /// dropped. Registering is setup work (a system call, a scan of
    /// `/proc/self/smaps`), not for the I/O path.
    ///
    /// ```no_run
    /// use upnvme::memmap2::MmapOptions;
    /// use upnvme::{Controller, ControllerOptions, QueuePairOptions};
    ///
    /// let ctrl = Controller::open("0000:00:04.0", ControllerOptions::default())?;
    /// let ns = ctrl.namespace(1)?.clone();
    /// let mapping = MmapOptions::new().len(2 << 20).huge(Some(21)).map_anon()?;
    /// let reg = ctrl.register_memory(mapping)?;
    /// let buf = reg.alloc(4096)?;
    /// let mut qp = ctrl.io_queue_pair(QueuePairOptions::default())?;
    /// let buf = qp.read_blocking(&ns, 0, 1, buf, std::time::Duration::from_secs(5))?;
    /// drop(buf);
    /// let mapping = reg.unregister()?; // block 0 is in mapping[..4096]
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn register_memory(&self, mapping: MmapMut) -> Result<RegisteredMemory, RegisterError> {
        match self.inner.dev().dma_mapper() {
            Some(mapper) => RegisteredMemory::new(mapping, mapper),
            None => Err(RegisterError::new(
                RegisterFailure::Unsupported {
                    device: self.device_name().to_string(),
                },
                mapping,
            )),
        }
    }
}
