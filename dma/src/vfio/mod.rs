//! VFIO: container (Type1v2 IOMMU), group, device, PCI configuration space and
//! IOMMU DMA mappings — a thin, fully checked layer over the kernel ABI in
//! [`abi`].
//!
//! Ownership: a [`VfioDevice`] holds an `Arc<VfioContainer>`; the container owns
//! the group file descriptor, so the IOMMU context stays alive as long as any
//! device or DMA region (whose mapper is the container) still needs it. Drop
//! order inside [`VfioDevice`]: bus mastering off, BAR unmapped, device fd closed.

pub mod abi;

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::error::DmaError;
use crate::iova::{IovaAllocator, IovaRange};
use crate::memory::{DmaMapper, HostMemory};
use crate::mmio::Bar;
use crate::pci::{PciAddress, Sysfs};

/// PCI configuration space: Command register offset.
pub const PCI_COMMAND: u64 = 0x04;
/// The x86 interrupt address window (first and last byte): DMA writes there
/// are MSI messages, so no IOVA may fall in it.
const MSI_WINDOW: (u64, u64) = (0xfee0_0000, 0xfeef_ffff);
/// Command register: Memory Space Enable.
pub const PCI_COMMAND_MEMORY: u16 = 1 << 1;
/// Command register: Bus Master Enable.
pub const PCI_COMMAND_MASTER: u16 = 1 << 2;
/// Command register: Interrupt Disable (INTx).
pub const PCI_COMMAND_INTX_DISABLE: u16 = 1 << 10;

/// `ioctl(fd, req, arg)` for a request that takes a pointer to a structure.
///
/// # Safety
/// `T` must be the `#[repr(C)]` argument structure of exactly the layout the
/// kernel expects for `req` (see [`abi`]), with its `argsz` (when it has one)
/// set to its size: the kernel reads and writes up to that many bytes through
/// the pointer, which a wrong type would turn into an out-of-bounds access.
unsafe fn ioctl_ptr<T>(
    fd: &impl AsRawFd,
    req: u64,
    arg: &mut T,
    what: &str,
) -> Result<i32, DmaError> {
    // SAFETY: `arg` is a live, exclusively borrowed argument structure of the
    // layout the kernel expects for `req`, with its `argsz` set (the
    // caller's contract); the kernel writes at most `argsz` bytes.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg as *mut T) };
    if r < 0 {
        return Err(DmaError::last_os(what));
    }
    Ok(r)
}

fn ioctl_val(fd: &impl AsRawFd, req: u64, arg: libc::c_ulong, what: &str) -> Result<i32, DmaError> {
    // SAFETY: `req` takes an integer argument (or none), so no memory is passed.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg) };
    if r < 0 {
        return Err(DmaError::last_os(what));
    }
    Ok(r)
}

/// A VFIO container with the Type1v2 IOMMU set, owning one group, and the IOVA
/// allocator for its address space. It is the [`DmaMapper`] of the device's
/// DMA memory.
#[derive(Debug)]
pub struct VfioContainer {
    container: OwnedFd,
    _group: OwnedFd,
    group_id: u32,
    iova: Mutex<IovaAllocator>,
    pgsizes: u64,
}

impl VfioContainer {
    /// Opens a new container, attaches `group` and sets the Type1v2 IOMMU.
    fn open_with_group(group: OwnedFd, group_id: u32) -> Result<Arc<VfioContainer>, DmaError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/vfio/vfio")
            .map_err(|e| DmaError::GroupOpen {
                path: PathBuf::from("/dev/vfio/vfio"),
                os_error: e,
                hint: "load the VFIO modules (`modprobe vfio-pci`) and run as root",
            })?;
        let container = OwnedFd::from(file);
        let v = ioctl_val(
            &container,
            abi::VFIO_GET_API_VERSION,
            0,
            "VFIO_GET_API_VERSION",
        )?;
        if v != abi::VFIO_API_VERSION {
            return Err(DmaError::Unsupported {
                what: format!("API version {v}"),
            });
        }
        let ok = ioctl_val(
            &container,
            abi::VFIO_CHECK_EXTENSION,
            abi::VFIO_TYPE1V2_IOMMU as _,
            "VFIO_CHECK_EXTENSION",
        )?;
        if ok == 0 {
            return Err(DmaError::Unsupported {
                what: "the Type1v2 IOMMU".into(),
            });
        }
        let mut cfd: i32 = container.as_raw_fd();
        // SAFETY: VFIO_GROUP_SET_CONTAINER takes a pointer to the container's
        // fd, an i32.
        unsafe {
            ioctl_ptr(
                &group,
                abi::VFIO_GROUP_SET_CONTAINER,
                &mut cfd,
                "VFIO_GROUP_SET_CONTAINER",
            )
        }?;
        ioctl_val(
            &container,
            abi::VFIO_SET_IOMMU,
            abi::VFIO_TYPE1V2_IOMMU as _,
            "VFIO_SET_IOMMU",
        )
        .map_err(|e| match e {
            DmaError::Sys { os_error, .. } => DmaError::SetIommu { os_error },
            other => other,
        })?;
        let (ranges, pgsizes) = iommu_info(&container)?;
        Ok(Arc::new(VfioContainer {
            container,
            _group: group,
            group_id,
            iova: Mutex::new(IovaAllocator::new(ranges)),
            pgsizes,
        }))
    }

    /// The IOMMU group number.
    pub fn group_id(&self) -> u32 {
        self.group_id
    }

    /// The valid IOVA ranges the IOMMU reported.
    pub fn iova_ranges(&self) -> Vec<IovaRange> {
        self.iova
            .lock()
            .map(|a| a.ranges().to_vec())
            .unwrap_or_default()
    }

    /// Bitmap of IOMMU page sizes supported (VFIO_IOMMU_GET_INFO iova_pgsizes).
    pub fn iova_pgsizes(&self) -> u64 {
        self.pgsizes
    }
}

/// Reads the IOMMU's page sizes and valid IOVA ranges, following the
/// capability chain (VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE).
fn iommu_info(container: &OwnedFd) -> Result<(Vec<IovaRange>, u64), DmaError> {
    let mut head = abi::IommuInfo {
        argsz: std::mem::size_of::<abi::IommuInfo>() as u32,
        ..Default::default()
    };
    // SAFETY: the argument is `abi`'s structure for VFIO_IOMMU_GET_INFO, argsz set.
    unsafe {
        ioctl_ptr(
            container,
            abi::VFIO_IOMMU_GET_INFO,
            &mut head,
            "VFIO_IOMMU_GET_INFO",
        )
    }?;
    let pgsizes = head.iova_pgsizes;
    let full = (head.argsz as usize).max(std::mem::size_of::<abi::IommuInfo>());
    let fallback = fallback_iova_ranges();
    if head.flags & abi::VFIO_IOMMU_INFO_CAPS == 0 || full <= std::mem::size_of::<abi::IommuInfo>()
    {
        return Ok((fallback, pgsizes));
    }
    // u64 words keep the buffer 8-byte aligned for the kernel's structures.
    let mut buf = vec![0u64; full.div_ceil(8)];
    let bytes_len = buf.len() * 8;
    let hdr = abi::IommuInfo {
        argsz: full as u32,
        ..Default::default()
    };
    // SAFETY: `buf` is at least `size_of::<IommuInfo>()` bytes and 8-byte
    // aligned; we write the header as a plain value.
    unsafe { buf.as_mut_ptr().cast::<abi::IommuInfo>().write(hdr) };
    // SAFETY: the buffer is `full` bytes long (argsz), writable and aligned; the
    // kernel fills at most argsz bytes.
    let r = unsafe {
        libc::ioctl(
            container.as_raw_fd(),
            abi::VFIO_IOMMU_GET_INFO as _,
            buf.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(DmaError::last_os("VFIO_IOMMU_GET_INFO (capabilities)"));
    }
    let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let rd32 = |o: usize| {
        bytes
            .get(o..o + 4)
            .map(|b| u32::from_ne_bytes(b.try_into().unwrap_or([0; 4])))
    };
    let rd16 = |o: usize| {
        bytes
            .get(o..o + 2)
            .map(|b| u16::from_ne_bytes(b.try_into().unwrap_or([0; 2])))
    };
    let rd64 = |o: usize| {
        bytes
            .get(o..o + 8)
            .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])))
    };
    let mut off = rd32(16).unwrap_or(0) as usize; // cap_offset
    let mut hops = 0;
    while off != 0 && off + 8 <= bytes_len && hops < 64 {
        hops += 1;
        let id = rd16(off).unwrap_or(0);
        let next = rd32(off + 4).unwrap_or(0) as usize;
        if id == abi::VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE {
            // At most what the kernel's buffer can hold (16 bytes a range).
            let n =
                (rd32(off + 8).unwrap_or(0) as usize).min(bytes_len.saturating_sub(off + 16) / 16);
            let mut ranges = Vec::with_capacity(n);
            for i in 0..n {
                let base = off + 16 + i * 16;
                if let (Some(start), Some(end)) = (rd64(base), rd64(base + 8)) {
                    ranges.push(IovaRange { start, end });
                }
            }
            if !ranges.is_empty() {
                return Ok((ranges, pgsizes));
            }
        }
        off = next;
    }
    Ok((fallback, pgsizes))
}

// SAFETY: `map_flags` returns `Err` either before VFIO_IOMMU_MAP_DMA (no
// IOVA space, or a poisoned IOVA lock: nothing mapped) or when it failed,
// after giving the IOVA back (the kernel undoes a failed map: nothing
// mapped), and keeps no handle of `mem` either way; IOVAs come from the container's own allocator, which never
// hands out a live range twice; `unmap_mapping` refuses a mapping another
// mapper made (`made_by`) and returns true only when the kernel reports the
// whole range unmapped (the IOMMU no longer translates it), otherwise it
// keeps the range reserved and returns false.
unsafe impl DmaMapper for VfioContainer {
    fn map(&self, mem: &Arc<HostMemory>) -> Result<u64, DmaError> {
        self.map_flags(
            mem,
            abi::VFIO_DMA_MAP_FLAG_READ | abi::VFIO_DMA_MAP_FLAG_WRITE,
        )
    }

    fn map_device_read_only(&self, mem: &Arc<HostMemory>) -> Result<u64, DmaError> {
        // The IOMMU page table entries get the read permission only: a
        // device write there faults (DMAR: [DMA Write] ... in the kernel log).
        self.map_flags(mem, abi::VFIO_DMA_MAP_FLAG_READ)
    }

    fn iova_ranges(&self) -> Vec<IovaRange> {
        VfioContainer::iova_ranges(self)
    }

    fn unmap(&self, mapping: crate::memory::Unmapping<'_>) -> bool {
        self.unmap_mapping(mapping)
    }
}

impl VfioContainer {
    /// VFIO_IOMMU_MAP_DMA of `mem` at a fresh IOVA with `flags` (the
    /// device's read and write permissions).
    fn map_flags(&self, mem: &Arc<HostMemory>, flags: u32) -> Result<u64, DmaError> {
        let len = mem.len();
        let align = mem.iova_align() as u64;
        let iova = self
            .iova
            .lock()
            .map_err(|_| {
                DmaError::InvalidAllocation(
                    "the IOVA allocator is unusable: a thread panicked while it held its lock; \
                     open the controller again"
                        .into(),
                )
            })?
            .alloc(len as u64, align)?;
        let mut m = abi::DmaMap {
            argsz: std::mem::size_of::<abi::DmaMap>() as u32,
            flags,
            vaddr: mem.vaddr() as u64,
            iova,
            size: len as u64,
        };
        // SAFETY: the argument is `abi`'s structure for VFIO_IOMMU_MAP_DMA, argsz set.
        let mapped = unsafe { ioctl_ptr(&self.container, abi::VFIO_IOMMU_MAP_DMA, &mut m, "map") };
        if let Err(e) = mapped {
            if let Ok(mut a) = self.iova.lock() {
                a.free(iova, len as u64);
            }
            let os_error = match e {
                DmaError::Sys { os_error, .. } => os_error,
                other => std::io::Error::other(other.to_string()),
            };
            return Err(DmaError::MapDma {
                iova,
                size: len,
                os_error,
            });
        }
        Ok(iova)
    }

    /// VFIO_IOMMU_UNMAP_DMA of a mapping this container made.
    fn unmap_mapping(&self, mapping: crate::memory::Unmapping<'_>) -> bool {
        if !mapping.made_by(self) {
            // Another mapper's region handed its `Unmapping` on: removing a
            // mapping of ours at that IOVA would free it for reuse while a
            // buffer still uses it.
            return false;
        }
        let (iova, len) = (mapping.iova(), mapping.len());
        let mut u = abi::DmaUnmap {
            argsz: std::mem::size_of::<abi::DmaUnmap>() as u32,
            flags: 0,
            iova,
            size: len as u64,
        };
        // SAFETY: the argument is `abi`'s structure for VFIO_IOMMU_UNMAP_DMA, argsz set.
        let r = unsafe { ioctl_ptr(&self.container, abi::VFIO_IOMMU_UNMAP_DMA, &mut u, "unmap") };
        // The IOVA range is reused only when the kernel confirmed the whole
        // mapping gone (`size` comes back as the bytes unmapped). Otherwise
        // the range stays reserved for the container's life: a new mapping
        // there would fail with EEXIST, or share device addresses with
        // whatever is still mapped.
        let gone = r.is_ok() && u.size == len as u64;
        if gone && let Ok(mut a) = self.iova.lock() {
            a.free(iova, len as u64);
        }
        gone
    }
}

/// An opened VFIO PCI device: configuration space, BAR0 mapping, and the
/// container that maps its DMA memory.
#[derive(Debug)]
pub struct VfioDevice {
    address: PciAddress,
    bar0: Bar,
    /// The device file; `None` once [`VfioDevice::release`] gave it back.
    device: RwLock<Option<File>>,
    /// What the release that closed the device file returned.
    dma_stopped: AtomicBool,
    config_offset: u64,
    /// Size of the configuration space region (`VFIO_PCI_CONFIG_REGION_INDEX`).
    config_size: u64,
    container: Arc<VfioContainer>,
}

impl VfioDevice {
    /// Opens `address` (checked through `sysfs` first so that every setup
    /// mistake is reported with its fix), enables memory space and bus
    /// mastering, disables INTx, and maps BAR0.
    pub fn open(address: &PciAddress, sysfs: &Sysfs) -> Result<VfioDevice, DmaError> {
        let group_id = sysfs.check_vfio_ready(address)?;
        let path = PathBuf::from(format!("/dev/vfio/{group_id}"));
        let group = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| {
                let hint = match e.raw_os_error() {
                    Some(libc::EBUSY) => {
                        "the group is already open: another process uses this device, or this process does (another Controller of it, or DMA buffers, pools or registered memory of a closed Controller of it, which keep its VFIO container and group open: drop or unregister them first)"
                    }
                    Some(libc::ENOENT) => {
                        "the vfio-pci module is not loaded or the device is not bound to it (`upnvme setup bind <address>`)"
                    }
                    Some(libc::EACCES) | Some(libc::EPERM) => {
                        "permission denied: run as root or give your user the group file (chown)"
                    }
                    _ => "check that the device is bound to vfio-pci (`upnvme list`)",
                };
                DmaError::GroupOpen {
                    path: path.clone(),
                    os_error: e,
                    hint,
                }
            })?;
        let group = OwnedFd::from(group);
        let mut status = abi::GroupStatus {
            argsz: std::mem::size_of::<abi::GroupStatus>() as u32,
            flags: 0,
        };
        // SAFETY: the argument is `abi`'s structure for VFIO_GROUP_GET_STATUS, argsz set.
        unsafe {
            ioctl_ptr(
                &group,
                abi::VFIO_GROUP_GET_STATUS,
                &mut status,
                "VFIO_GROUP_GET_STATUS",
            )
        }?;
        if status.flags & abi::VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(DmaError::GroupNotViable {
                address: address.to_string(),
                group: group_id,
                others: sysfs.group_blockers(group_id, address),
            });
        }
        let container = VfioContainer::open_with_group(group, group_id)?;
        let name = CString::new(address.to_string()).map_err(|_| DmaError::InvalidPciAddress {
            input: address.to_string(),
            reason: "contains NUL",
        })?;
        // SAFETY: `name` is a valid NUL-terminated string that outlives the call;
        // the kernel only reads it.
        let fd = unsafe {
            libc::ioctl(
                container._group.as_raw_fd(),
                abi::VFIO_GROUP_GET_DEVICE_FD as _,
                name.as_ptr(),
            )
        };
        if fd < 0 {
            return Err(DmaError::GetDeviceFd {
                address: address.to_string(),
                os_error: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: `fd` is a fresh file descriptor returned by the kernel that
        // nothing else owns.
        let device = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut info = abi::DeviceInfo {
            argsz: std::mem::size_of::<abi::DeviceInfo>() as u32,
            ..Default::default()
        };
        // SAFETY: the argument is `abi`'s structure for VFIO_DEVICE_GET_INFO, argsz set.
        unsafe {
            ioctl_ptr(
                &device,
                abi::VFIO_DEVICE_GET_INFO,
                &mut info,
                "VFIO_DEVICE_GET_INFO",
            )
        }?;
        if info.flags & abi::VFIO_DEVICE_FLAGS_PCI == 0
            || info.num_regions <= abi::VFIO_PCI_CONFIG_REGION_INDEX
        {
            return Err(DmaError::Unsupported {
                what: format!("{address} as a PCI device (flags 0x{:x})", info.flags),
            });
        }
        let config = region_info(&device, abi::VFIO_PCI_CONFIG_REGION_INDEX)?;
        let bar = region_info(&device, abi::VFIO_PCI_BAR0_REGION_INDEX)?;
        if bar.flags & abi::VFIO_REGION_INFO_FLAG_MMAP == 0 || bar.size == 0 {
            return Err(DmaError::Bar {
                address: address.to_string(),
                reason: format!(
                    "region flags 0x{:x}, size {}: not mappable",
                    bar.flags, bar.size
                ),
            });
        }
        let bar_len = usize::try_from(bar.size).map_err(|_| DmaError::Bar {
            address: address.to_string(),
            reason: "too large".into(),
        })?;
        let bar0 = Bar::map(
            device.as_raw_fd(),
            bar.offset,
            bar_len,
            &address.to_string(),
        )?;
        let dev = VfioDevice {
            address: *address,
            bar0,
            device: RwLock::new(Some(device)),
            dma_stopped: AtomicBool::new(false),
            config_offset: config.offset,
            config_size: config.size,
            container,
        };
        let cmd = dev.config_read16(PCI_COMMAND)?;
        dev.config_write16(
            PCI_COMMAND,
            cmd | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER | PCI_COMMAND_INTX_DISABLE,
        )?;
        Ok(dev)
    }

    /// The device's PCI address.
    pub fn address(&self) -> PciAddress {
        self.address
    }

    /// BAR0, the controller's registers.
    pub fn bar0(&self) -> &Bar {
        &self.bar0
    }

    /// The container (the DMA mapper for this device).
    pub fn container(&self) -> &Arc<VfioContainer> {
        &self.container
    }

    /// Runs `f` on the device file, or fails once it was released.
    fn with_file<T>(
        &self,
        what: impl FnOnce() -> String,
        f: impl FnOnce(&File) -> std::io::Result<T>,
    ) -> Result<T, DmaError> {
        let guard = self.device.read().unwrap_or_else(|p| p.into_inner());
        let r = match guard.as_ref() {
            Some(file) => f(file),
            None => Err(std::io::Error::from_raw_os_error(libc::ENODEV)),
        };
        r.map_err(|e| DmaError::Sys {
            what: what(),
            os_error: e,
        })
    }

    /// Reads `buf.len()` bytes of configuration space at `offset`. A range
    /// past the configuration space region is refused (`OutOfBounds`)
    /// rather than read from another region of the device file.
    pub fn config_read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let at = self.config_at(offset, buf.len(), "config space read")?;
        self.with_file(
            || format!("config space read at 0x{offset:x} of {}", self.address),
            |f| f.read_exact_at(buf, at),
        )
    }

    /// Writes `buf` to configuration space at `offset` (refused past the
    /// configuration space region, as for [`VfioDevice::config_read`]).
    pub fn config_write(&self, offset: u64, buf: &[u8]) -> Result<(), DmaError> {
        let at = self.config_at(offset, buf.len(), "config space write")?;
        self.with_file(
            || format!("config space write at 0x{offset:x} of {}", self.address),
            |f| f.write_all_at(buf, at),
        )
    }

    /// The file offset of `len` bytes at `offset` in configuration space.
    fn config_at(&self, offset: u64, len: usize, what: &'static str) -> Result<u64, DmaError> {
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > self.config_size)
        {
            return Err(DmaError::OutOfBounds {
                what,
                offset: usize::try_from(offset).unwrap_or(usize::MAX),
                len,
                size: usize::try_from(self.config_size).unwrap_or(usize::MAX),
            });
        }
        Ok(self.config_offset + offset)
    }

    /// Registers an eventfd for the device request (`VFIO_PCI_REQ_IRQ_INDEX`):
    /// the kernel signals it when it wants the device back (removal of the
    /// device, unbinding vfio-pci) and, without one registered, blocks that
    /// request until the process closes the device. `Unsupported` when the
    /// device has no request IRQ.
    pub fn request_notifier(&self) -> Result<DeviceRequest, DmaError> {
        let mut info = abi::IrqInfo {
            argsz: std::mem::size_of::<abi::IrqInfo>() as u32,
            index: abi::VFIO_PCI_REQ_IRQ_INDEX,
            ..Default::default()
        };
        let guard = self.device.read().unwrap_or_else(|p| p.into_inner());
        let Some(file) = guard.as_ref() else {
            return Err(DmaError::Unsupported {
                what: format!(
                    "a device request channel for {} after its release",
                    self.address
                ),
            });
        };
        // SAFETY: the argument is `abi`'s structure for VFIO_DEVICE_GET_IRQ_INFO, argsz set.
        unsafe {
            ioctl_ptr(
                file,
                abi::VFIO_DEVICE_GET_IRQ_INFO,
                &mut info,
                "VFIO_DEVICE_GET_IRQ_INFO",
            )
        }?;
        if info.count == 0 {
            return Err(DmaError::Unsupported {
                what: format!("a device request IRQ on {}", self.address),
            });
        }
        // SAFETY: no pointers are passed; the result is checked.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(DmaError::last_os("eventfd for the VFIO device request"));
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(efd) };
        let mut set = abi::IrqSetEventfd {
            argsz: std::mem::size_of::<abi::IrqSetEventfd>() as u32,
            flags: abi::VFIO_IRQ_SET_DATA_EVENTFD | abi::VFIO_IRQ_SET_ACTION_TRIGGER,
            index: abi::VFIO_PCI_REQ_IRQ_INDEX,
            start: 0,
            count: 1,
            fd: fd.as_raw_fd(),
        };
        // SAFETY: the argument is `abi`'s structure for VFIO_DEVICE_SET_IRQS, argsz set.
        unsafe {
            ioctl_ptr(
                file,
                abi::VFIO_DEVICE_SET_IRQS,
                &mut set,
                "VFIO_DEVICE_SET_IRQS (device request)",
            )
        }?;
        Ok(DeviceRequest { fd })
    }

    /// Gives the device back to the kernel: bus mastering off (no DMA from
    /// here on), BAR0 replaced by all-ones memory (register accesses from any
    /// thread keep working and read "device gone"), and the device file
    /// closed, which lets a removal or unbind the kernel is waiting on
    /// complete. Idempotent; configuration space accesses fail afterwards.
    ///
    /// Returns whether the device can no longer reach memory: Bus Master
    /// Enable read back clear, or the device file really closed — vfio-pci's
    /// release of its last open file clears Bus Master Enable itself and
    /// resets the function before `close` returns, but only if nothing else
    /// holds the file: BAR0's mapping does until it is replaced, so a BAR
    /// that could not be replaced (and a Bus Master Enable that could not be
    /// cleared) makes this false.
    pub fn release(&self) -> bool {
        let bus_master_off = self
            .config_read16(PCI_COMMAND)
            .and_then(|cmd| self.config_write16(PCI_COMMAND, cmd & !PCI_COMMAND_MASTER))
            .and_then(|()| self.config_read16(PCI_COMMAND))
            .is_ok_and(|cmd| cmd & PCI_COMMAND_MASTER == 0);
        let bar_gone = self.bar0.retire();
        let mut guard = self.device.write().unwrap_or_else(|p| p.into_inner());
        match guard.take() {
            Some(file) => {
                drop(file);
                let stopped = bus_master_off || bar_gone;
                self.dma_stopped.store(stopped, Ordering::Release);
                stopped
            }
            // Released before: its answer stands (configuration space is
            // gone now, and the BAR was replaced then).
            None => self.dma_stopped.load(Ordering::Acquire),
        }
    }

    /// Whether [`VfioDevice::release`] gave the device back.
    pub fn is_released(&self) -> bool {
        self.device
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Reads a little-endian 16-bit configuration register.
    pub fn config_read16(&self, offset: u64) -> Result<u16, DmaError> {
        let mut b = [0; 2];
        self.config_read(offset, &mut b)?;
        Ok(u16::from_le_bytes(b))
    }

    /// Writes a little-endian 16-bit configuration register.
    pub fn config_write16(&self, offset: u64, v: u16) -> Result<(), DmaError> {
        self.config_write(offset, &v.to_le_bytes())
    }

    /// Reads a little-endian 32-bit configuration register.
    pub fn config_read32(&self, offset: u64) -> Result<u32, DmaError> {
        let mut b = [0; 4];
        self.config_read(offset, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
}

impl Drop for VfioDevice {
    fn drop(&mut self) {
        // Belt and braces after the driver's shutdown: with bus mastering off the
        // device cannot DMA at all, whatever state it is in.
        if let Ok(cmd) = self.config_read16(PCI_COMMAND) {
            let _ = self.config_write16(PCI_COMMAND, cmd & !PCI_COMMAND_MASTER);
        }
    }
}

/// The eventfd the kernel signals when it asks for the device back (see
/// [`VfioDevice::request_notifier`]).
#[derive(Debug)]
pub struct DeviceRequest {
    fd: OwnedFd,
}

impl DeviceRequest {
    /// Waits up to `timeout` for the request; true when it came (the
    /// counter is consumed).
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd of this frame.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n <= 0 || pfd.revents & libc::POLLIN == 0 {
            return false;
        }
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64 of this frame (the eventfd
        // counter); the descriptor is non-blocking.
        let r = unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut v).cast(), 8) };
        r == 8
    }
}

fn region_info(device: &File, index: u32) -> Result<abi::RegionInfo, DmaError> {
    let mut info = abi::RegionInfo {
        argsz: std::mem::size_of::<abi::RegionInfo>() as u32,
        index,
        ..Default::default()
    };
    // SAFETY: the argument is `abi`'s structure for VFIO_DEVICE_GET_REGION_INFO, argsz set.
    unsafe {
        ioctl_ptr(
            device,
            abi::VFIO_DEVICE_GET_REGION_INFO,
            &mut info,
            "VFIO_DEVICE_GET_REGION_INFO",
        )
    }?;
    if info.flags & (abi::VFIO_REGION_INFO_FLAG_READ | abi::VFIO_REGION_INFO_FLAG_WRITE) == 0 {
        return Err(DmaError::Unsupported {
            what: format!("region {index} without read/write access"),
        });
    }
    Ok(info)
}

/// The usable IOVA ranges when the kernel does not report them (no
/// `VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE`).
fn fallback_iova_ranges() -> Vec<IovaRange> {
    // Without the capability (old kernels): the low 39 bits, the narrowest
    // address width an IOMMU here offers (QEMU's intel-iommu default), so an
    // IOVA handed out fits whatever the IOMMU is — less the x86 interrupt
    // (MSI) window at FEE0_0000h–FEEF_FFFFh, which those kernels did not
    // keep out of a mapping: a device write there is taken as an interrupt
    // message, not DMA (newer kernels leave it out of the reported ranges).
    vec![
        IovaRange {
            start: 0,
            end: MSI_WINDOW.0 - 1,
        },
        IovaRange {
            start: MSI_WINDOW.1 + 1,
            end: (1u64 << 39) - 1,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_ranges_leave_out_the_msi_window() {
        let r = fallback_iova_ranges();
        assert!(!r.is_empty());
        for x in &r {
            assert!(x.start <= x.end);
            assert!(
                x.end < MSI_WINDOW.0 || x.start > MSI_WINDOW.1,
                "{x} overlaps FEE0_0000h–FEEF_FFFFh"
            );
            assert!(x.end < 1 << 39, "{x} is wider than 39 bits");
        }
        // Everything else below 2^39 stays usable.
        let total: u64 = r.iter().map(|x| x.end - x.start + 1).sum();
        assert_eq!(total, (1 << 39) - (MSI_WINDOW.1 - MSI_WINDOW.0 + 1));
    }
}
