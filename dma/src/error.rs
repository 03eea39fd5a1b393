//! Errors of the DMA/VFIO layer. Every setup error names the cause and the
//! command that fixes it.

use std::io;
use std::path::PathBuf;

/// What went wrong while opening a device, mapping memory or talking to VFIO.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DmaError {
    /// The PCI address string could not be parsed.
    #[error(
        "invalid PCI address '{input}': {reason}; expected DOMAIN:BUS:DEVICE.FUNCTION such as 0000:00:04.0 (see `upnvme list`)"
    )]
    InvalidPciAddress {
        /// What the caller passed.
        input: String,
        /// Why it is not an address.
        reason: &'static str,
    },
    /// No device with this address exists.
    #[error(
        "no PCI device at {address} (no {path}); run `upnvme list` to see the NVMe controllers on this machine"
    )]
    NoSuchDevice {
        /// The address asked for.
        address: String,
        /// The sysfs path that is missing.
        path: PathBuf,
    },
    /// The device exists but is not an NVMe controller.
    #[error(
        "PCI device {address} has class 0x{class:06x}, not an NVMe controller (class 0x010802); run `upnvme list` to find one"
    )]
    NotNvme {
        /// The address asked for.
        address: String,
        /// Its class code (base class, subclass, programming interface).
        class: u32,
    },
    /// The device is bound to a driver other than vfio-pci (or to none).
    #[error(
        "PCI device {address} is {}; bind it to vfio-pci with `upnvme setup bind {address}` (or: echo vfio-pci > /sys/bus/pci/devices/{address}/driver_override; echo {address} > /sys/bus/pci/devices/{address}/driver/unbind; echo {address} > /sys/bus/pci/drivers_probe)",
        match .driver { Some(d) => format!("bound to driver '{d}'"), None => "not bound to any driver".to_string() }
    )]
    NotBoundToVfio {
        /// The address asked for.
        address: String,
        /// The driver it is bound to, if any.
        driver: Option<String>,
    },
    /// The device has no IOMMU group: the IOMMU is off or absent.
    #[error(
        "PCI device {address} has no IOMMU group: the IOMMU is disabled; enable VT-d/AMD-Vi in firmware and boot with intel_iommu=on (or amd_iommu=on) iommu=pt"
    )]
    NoIommuGroup {
        /// The address asked for.
        address: String,
    },
    /// Other devices of the IOMMU group are not bound to vfio-pci.
    #[error(
        "IOMMU group {group} of {address} is not viable: {} must also be bound to vfio-pci (or unbound) before the group can be used; `upnvme setup bind <address>` for each (see `upnvme setup status`)",
        .others.join(", ")
    )]
    GroupNotViable {
        /// The address asked for.
        address: String,
        /// The group number.
        group: u32,
        /// The other devices of the group and their drivers.
        others: Vec<String>,
    },
    /// The VFIO group character device could not be opened.
    #[error("cannot open {path}: {os_error}; {hint}")]
    GroupOpen {
        /// /dev/vfio/N.
        path: PathBuf,
        /// The OS error.
        os_error: io::Error,
        /// How to fix it.
        hint: &'static str,
    },
    /// Not enough hugepages for a DMA region.
    #[error(
        "cannot map {bytes} bytes of {page_kib} KiB hugepages ({free} of {total} free): reserve more with `echo {suggest} > {sysctl}` or `upnvme setup hugepages {suggest}` (or set PageBacking::Small4K to opt in to 4 KiB pages)"
    )]
    HugepagesUnavailable {
        /// Bytes requested.
        bytes: usize,
        /// Hugepage size in KiB.
        page_kib: usize,
        /// Free hugepages of that size.
        free: u64,
        /// Reserved hugepages of that size.
        total: u64,
        /// A total that would satisfy the request.
        suggest: u64,
        /// Where to write it.
        sysctl: String,
    },
    /// The IOMMU refused a mapping; the message names the fix for its
    /// errno (ENOMEM: the locked-memory limit; ENOSPC: the container's
    /// mapping count; EINVAL: alignment or range; EEXIST: an IOVA in use).
    #[error(
        "VFIO_IOMMU_MAP_DMA of {size} bytes at IOVA 0x{iova:x} failed: {os_error}; {}",
        map_dma_hint(os_error)
    )]
    MapDma {
        /// IOVA asked for.
        iova: u64,
        /// Size asked for.
        size: usize,
        /// The OS error.
        os_error: io::Error,
    },
    /// No IOVA space left in the ranges the IOMMU reported.
    #[error(
        "no free IOVA space for a region of {size} bytes inside the IOMMU's valid ranges {ranges}: unregister application memory that is no longer needed, drop DMA buffers and pools that are no longer needed (a region made larger than the standard 2 MiB, or one 1 GiB page with PageBacking::Huge1G, for one allocation is unmapped with its last buffer; standard regions stay mapped for reuse), or use smaller buffers"
    )]
    IovaExhausted {
        /// Bytes requested.
        size: usize,
        /// The ranges, formatted.
        ranges: String,
    },
    /// A VFIO ioctl or other system call failed.
    #[error("{what} failed: {os_error}")]
    Sys {
        /// Which call, on what.
        what: String,
        /// The OS error.
        os_error: io::Error,
    },
    /// VFIO_SET_IOMMU refused the Type1v2 IOMMU for the container.
    #[error(
        "VFIO_SET_IOMMU (Type1v2) failed: {os_error}; {}",
        set_iommu_hint(os_error)
    )]
    SetIommu {
        /// The OS error.
        os_error: io::Error,
    },
    /// VFIO_GROUP_GET_DEVICE_FD refused to open the device; the message
    /// names the cause its errno stands for.
    #[error(
        "VFIO_GROUP_GET_DEVICE_FD for {address} failed: {os_error}; {}",
        get_device_fd_hint(os_error)
    )]
    GetDeviceFd {
        /// The device.
        address: String,
        /// The OS error.
        os_error: io::Error,
    },
    /// mmap of BAR0's VFIO region failed; the message names the likely
    /// cause for its errno.
    #[error(
        "mmap of BAR0 of {address} failed: {os_error}; {}",
        map_bar_hint(os_error)
    )]
    MapBar {
        /// The device.
        address: String,
        /// The OS error.
        os_error: io::Error,
    },
    /// The kernel's VFIO lacks something upnvme needs.
    #[error(
        "VFIO does not support {what}; upnvme needs Linux >= 4.x with vfio_iommu_type1 loaded (`modprobe vfio-pci`)"
    )]
    Unsupported {
        /// The missing feature.
        what: String,
    },
    /// The device's BAR0 is not usable.
    #[error("BAR0 of {address} is not usable: {reason}")]
    Bar {
        /// The device.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An access outside a DMA buffer or BAR was attempted.
    #[error("access of {len} bytes at offset {offset} is outside a {size}-byte {what}")]
    OutOfBounds {
        /// "DMA buffer" or "BAR".
        what: &'static str,
        /// Offset of the access.
        offset: usize,
        /// Length of the access.
        len: usize,
        /// Size of the object.
        size: usize,
    },
    /// An access inside a DMA buffer or mapping at an address not aligned
    /// to the access's size.
    #[error("access of {len} bytes at offset {offset} of a {what} is not {align}-byte aligned")]
    Misaligned {
        /// "DMA buffer" or "DMA mapping".
        what: &'static str,
        /// Offset of the access.
        offset: usize,
        /// Length of the access.
        len: usize,
        /// The alignment the access needs.
        align: usize,
    },
    /// A zero-length or otherwise invalid allocation request.
    #[error("invalid DMA allocation: {0}")]
    InvalidAllocation(String),
}

/// How to fix a VFIO_IOMMU_MAP_DMA refusal, by errno (the causes are
/// vfio_iommu_type1's `vfio_dma_do_map` and `vfio_pin_pages_remote`).
fn map_dma_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOMEM) | Some(libc::EPERM) => {
            "pinning the memory exceeded the locked-memory limit (RLIMIT_MEMLOCK): raise it \
             (`ulimit -l unlimited`, LimitMEMLOCK=infinity for a systemd service) or run as root"
        }
        Some(libc::ENOSPC) => {
            "the VFIO container holds as many DMA mappings as vfio_iommu_type1 allows \
             (module parameter dma_entry_limit, 65535 by default): register fewer, larger \
             mappings, or raise it (`echo N > /sys/module/vfio_iommu_type1/parameters/\
             dma_entry_limit`, effective for containers opened afterwards)"
        }
        Some(libc::EINVAL) => {
            "the address, IOVA or size is not a multiple of the IOMMU's smallest page \
             (VFIO_IOMMU_GET_INFO iova_pgsizes, VfioContainer::iova_pgsizes), or the IOVA lies \
             outside its valid ranges: map memory in whole IOMMU pages"
        }
        Some(libc::EEXIST) => {
            "that IOVA range is already mapped in this container (an IOVA handed out twice: \
             a bug in the DMA mapper, please report it)"
        }
        _ => {
            "the kernel log (`dmesg`, vfio_iommu_type1) may say why the memory could not be pinned"
        }
    }
}

/// How to fix a VFIO_SET_IOMMU refusal: EPERM is vfio_iommu_type1's
/// refusal of a group whose MSIs are not isolated (no interrupt
/// remapping) while `allow_unsafe_interrupts` is off.
fn set_iommu_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EPERM) => {
            "the platform has no interrupt remapping, which VFIO requires (the kernel log \
             says \"No interrupt remapping support\"): enable it in the firmware (VT-d / \
             AMD-Vi with interrupt remapping; `intremap=on` for QEMU's intel-iommu), or, \
             accepting that the device can then raise arbitrary interrupts, load \
             vfio_iommu_type1 with allow_unsafe_interrupts=1"
        }
        _ => "the kernel log (`dmesg`, vfio_iommu_type1) says why the IOMMU was refused",
    }
}

/// What a VFIO_GROUP_GET_DEVICE_FD refusal means, by errno (Linux's
/// `vfio_group_ioctl_get_device_fd` and `vfio_device_open`).
fn get_device_fd_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENODEV) => {
            "the group has no such device bound to vfio-pci (it was unbound or removed \
             meanwhile): `upnvme setup bind ADDRESS` binds it, `upnvme setup status` shows \
             where it is"
        }
        Some(libc::EBUSY) => {
            "the device is open already through its VFIO device cdev \
             (/dev/vfio/devices/vfioX, the iommufd interface: a VMM or another userspace \
             driver); `upnvme list` names the process holding it; stop it first"
        }
        Some(libc::EPERM) | Some(libc::EACCES) => {
            "not permitted: a group in VFIO's no-IOMMU mode needs CAP_SYS_RAWIO; run as root"
        }
        _ => {
            "vfio-pci could not enable the device; the kernel log (`dmesg | grep -i vfio`) \
             says why (a device that fails to reset or is in a low-power state)"
        }
    }
}

/// What a refused mmap of BAR0 means, by errno.
fn map_bar_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EINVAL) => {
            "vfio-pci refused to map the whole BAR: kernels before 4.16 exclude the page \
             holding the MSI-X table (which NVMe controllers often place in BAR0) from \
             mappings; use Linux 4.16 or later"
        }
        Some(libc::ENOMEM) | Some(libc::EAGAIN) => {
            "the process's address space or memory map count is exhausted \
             (vm.max_map_count): release memory or raise the limit"
        }
        _ => "the kernel log (`dmesg | grep -i vfio`) may say why",
    }
}

impl DmaError {
    /// Builds [`DmaError::Sys`] from the last OS error.
    pub(crate) fn last_os(what: impl Into<String>) -> Self {
        DmaError::Sys {
            what: what.into(),
            os_error: io::Error::last_os_error(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// EPERM from VFIO_SET_IOMMU is the missing interrupt remapping: the
    /// message gives the firmware fix and the module parameter, not only
    /// the QEMU option (before, "VFIO_SET_IOMMU (Type1v2); on QEMU the
    /// intel-iommu needs intremap=on failed: …").
    #[test]
    fn a_refused_set_iommu_says_how_to_get_interrupt_remapping() {
        let m = DmaError::SetIommu {
            os_error: io::Error::from_raw_os_error(libc::EPERM),
        }
        .to_string();
        assert!(m.starts_with("VFIO_SET_IOMMU (Type1v2) failed: "), "{m}");
        for fix in ["firmware", "intremap=on", "allow_unsafe_interrupts=1"] {
            assert!(m.contains(fix), "{fix} missing: {m}");
        }
        let m = DmaError::SetIommu {
            os_error: io::Error::from_raw_os_error(libc::ENODEV),
        }
        .to_string();
        assert!(m.contains("dmesg") && !m.contains("firmware"), "{m}");
    }

    /// VFIO_GROUP_GET_DEVICE_FD and the BAR0 mmap name the cause of their
    /// errno (before, only "… failed: Device or resource busy").
    #[test]
    fn a_refused_device_open_or_bar_mapping_says_why() {
        let open = |errno| {
            DmaError::GetDeviceFd {
                address: "0000:00:04.0".into(),
                os_error: io::Error::from_raw_os_error(errno),
            }
            .to_string()
        };
        let m = open(libc::EBUSY);
        assert!(
            m.starts_with("VFIO_GROUP_GET_DEVICE_FD for 0000:00:04.0 failed: "),
            "{m}"
        );
        assert!(
            m.contains("/dev/vfio/devices/vfioX") && m.contains("upnvme list"),
            "{m}"
        );
        let m = open(libc::ENODEV);
        assert!(
            m.contains("upnvme setup bind") && !m.contains("iommufd"),
            "{m}"
        );
        let m = open(libc::EPERM);
        assert!(m.contains("CAP_SYS_RAWIO"), "{m}");
        assert!(open(libc::EIO).contains("dmesg"));
        let bar = |errno| {
            DmaError::MapBar {
                address: "0000:00:04.0".into(),
                os_error: io::Error::from_raw_os_error(errno),
            }
            .to_string()
        };
        let m = bar(libc::EINVAL);
        assert!(
            m.starts_with("mmap of BAR0 of 0000:00:04.0 failed: "),
            "{m}"
        );
        assert!(m.contains("MSI-X") && m.contains("4.16"), "{m}");
        assert!(bar(libc::ENOMEM).contains("max_map_count"));
    }

    fn map_dma(errno: i32) -> String {
        DmaError::MapDma {
            iova: 0x20_0000,
            size: 4096,
            os_error: io::Error::from_raw_os_error(errno),
        }
        .to_string()
    }

    /// Each errno VFIO_IOMMU_MAP_DMA returns has its own cause, and the
    /// message names that one's fix (the locked-memory limit cures ENOMEM
    /// only).
    #[test]
    fn a_refused_dma_mapping_says_the_fix_for_its_errno() {
        let m = map_dma(libc::ENOMEM);
        assert!(m.contains("ulimit -l"), "{m}");
        let m = map_dma(libc::ENOSPC);
        assert!(m.contains("dma_entry_limit"), "{m}");
        assert!(!m.contains("ulimit"), "{m}");
        let m = map_dma(libc::EINVAL);
        assert!(m.contains("iova_pgsizes"), "{m}");
        assert!(!m.contains("ulimit"), "{m}");
        let m = map_dma(libc::EEXIST);
        assert!(m.contains("already mapped"), "{m}");
        assert!(!m.contains("ulimit"), "{m}");
    }
}
