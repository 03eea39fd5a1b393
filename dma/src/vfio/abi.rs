//! The subset of the kernel's VFIO ioctl ABI (`include/uapi/linux/vfio.h`) that
//! upnvme uses. All VFIO ioctls are `_IO(VFIO_TYPE, VFIO_BASE + n)` with
//! `VFIO_TYPE = ';'` and `VFIO_BASE = 100`; arguments carry their own `argsz`.

#![allow(missing_docs)]

const fn io(nr: u64) -> u64 {
    ((b';' as u64) << 8) | (100 + nr)
}

pub const VFIO_GET_API_VERSION: u64 = io(0);
pub const VFIO_CHECK_EXTENSION: u64 = io(1);
pub const VFIO_SET_IOMMU: u64 = io(2);
pub const VFIO_GROUP_GET_STATUS: u64 = io(3);
pub const VFIO_GROUP_SET_CONTAINER: u64 = io(4);
pub const VFIO_GROUP_GET_DEVICE_FD: u64 = io(6);
pub const VFIO_DEVICE_GET_INFO: u64 = io(7);
pub const VFIO_DEVICE_GET_REGION_INFO: u64 = io(8);
pub const VFIO_DEVICE_GET_IRQ_INFO: u64 = io(9);
pub const VFIO_DEVICE_SET_IRQS: u64 = io(10);
pub const VFIO_DEVICE_RESET: u64 = io(11);
pub const VFIO_IOMMU_GET_INFO: u64 = io(12);
pub const VFIO_IOMMU_MAP_DMA: u64 = io(13);
pub const VFIO_IOMMU_UNMAP_DMA: u64 = io(14);

pub const VFIO_API_VERSION: i32 = 0;
pub const VFIO_TYPE1V2_IOMMU: u64 = 3;

pub const VFIO_GROUP_FLAGS_VIABLE: u32 = 1 << 0;

pub const VFIO_DEVICE_FLAGS_PCI: u32 = 1 << 1;
pub const VFIO_DEVICE_FLAGS_RESET: u32 = 1 << 0;

pub const VFIO_REGION_INFO_FLAG_READ: u32 = 1 << 0;
pub const VFIO_REGION_INFO_FLAG_WRITE: u32 = 1 << 1;
pub const VFIO_REGION_INFO_FLAG_MMAP: u32 = 1 << 2;

pub const VFIO_PCI_BAR0_REGION_INDEX: u32 = 0;
pub const VFIO_PCI_CONFIG_REGION_INDEX: u32 = 7;
/// `VFIO_PCI_REQ_IRQ_INDEX`: the device request "interrupt" (the kernel asks
/// the user to release the device: removal, unbind).
pub const VFIO_PCI_REQ_IRQ_INDEX: u32 = 4;
pub const VFIO_IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
pub const VFIO_IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;

pub const VFIO_IOMMU_INFO_CAPS: u32 = 1 << 1;
pub const VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE: u16 = 1;

pub const VFIO_DMA_MAP_FLAG_READ: u32 = 1 << 0;
pub const VFIO_DMA_MAP_FLAG_WRITE: u32 = 1 << 1;

#[repr(C)]
#[derive(Default)]
pub struct GroupStatus {
    pub argsz: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(Default)]
pub struct DeviceInfo {
    pub argsz: u32,
    pub flags: u32,
    pub num_regions: u32,
    pub num_irqs: u32,
}

#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
pub struct RegionInfo {
    pub argsz: u32,
    pub flags: u32,
    pub index: u32,
    pub cap_offset: u32,
    pub size: u64,
    pub offset: u64,
}

/// `struct vfio_iommu_type1_info` (the fixed head; capabilities follow in the
/// same buffer at `cap_offset`).
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct IommuInfo {
    pub argsz: u32,
    pub flags: u32,
    pub iova_pgsizes: u64,
    pub cap_offset: u32,
    pub pad: u32,
}

#[repr(C)]
#[derive(Default)]
pub struct DmaMap {
    pub argsz: u32,
    pub flags: u32,
    pub vaddr: u64,
    pub iova: u64,
    pub size: u64,
}

#[repr(C)]
#[derive(Default)]
pub struct DmaUnmap {
    pub argsz: u32,
    pub flags: u32,
    pub iova: u64,
    pub size: u64,
}

/// `struct vfio_irq_info`.
#[repr(C)]
#[derive(Default)]
pub struct IrqInfo {
    pub argsz: u32,
    pub flags: u32,
    pub index: u32,
    pub count: u32,
}

/// `struct vfio_irq_set` with one eventfd as its data.
#[repr(C)]
#[derive(Default)]
pub struct IrqSetEventfd {
    pub argsz: u32,
    pub flags: u32,
    pub index: u32,
    pub start: u32,
    pub count: u32,
    pub fd: i32,
}

const _: () = assert!(std::mem::size_of::<IrqInfo>() == 16);
const _: () = assert!(std::mem::size_of::<IrqSetEventfd>() == 24);
const _: () = assert!(std::mem::size_of::<RegionInfo>() == 32);
const _: () = assert!(std::mem::size_of::<IommuInfo>() == 24);
const _: () = assert!(std::mem::size_of::<DmaMap>() == 32);
const _: () = assert!(std::mem::size_of::<DmaUnmap>() == 24);
