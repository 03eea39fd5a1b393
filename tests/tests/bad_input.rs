//! The bad-input table (docs/bad-input.md), host side: every invalid argument
//! and environment the library can meet outside a VFIO guest, each asserting
//! the error variant and the exact text a user sees. Environments that need a
//! real IOMMU, VFIO or hugepage pool (group already open, no hugepages at
//! all) and the `upnvme` tool are covered by the guest tests the table names.
//!
//! The VFIO / sysfs rows run against a fake sysfs tree (as dma/src/pci.rs
//! does): `VfioNvme::open` checks sysfs before it touches /dev/vfio, so each
//! setup mistake is reported from the tree alone.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{T, assert_clean, config_one_ns, open, opts, setup};
use upnvme::dma::{DmaAllocator, DmaMapper, PciAddress, Sysfs};
use upnvme::{
    Controller, ControllerOptions, DmaBuffer, DsmAttributes, DsmRange, Error, IoCommand,
    IoQueuePair, Namespace, PageBacking, QueuePairOptions, RangeCommand, Reject, VfioNvme,
};
use upnvme_dma::DmaError;
use upnvme_tests::{Fault, Match, ModelConfig, ModelController, NamespaceConfig};

type Pair = IoQueuePair<ModelController>;
type Ctrl = Controller<ModelController>;

/// Namespace 1 of these tests: 1000 blocks of 4 KiB.
const BLOCKS: u64 = 1000;

fn read(ns: &Namespace, slba: u64, blocks: u32) -> IoCommand<'_> {
    IoCommand::Read { ns, slba, blocks }
}

/// The handle of namespace 1 of `c`.
fn ns1<D: upnvme::Device>(c: &Controller<D>) -> Namespace {
    c.namespace(1).unwrap().clone()
}

/// A controller with namespace 1 (1000 × 4 KiB, MDTS 7 = 512 KiB) and a
/// default queue pair.
fn pair() -> (ModelController, Ctrl, Pair) {
    let (m, c) = setup(config_one_ns(4096, BLOCKS));
    let qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    (m, c, qp)
}

/// Submits `cmd` with a buffer of `len` bytes (none for 0), expects it to be
/// refused before the device saw it, with the buffer handed back; returns
/// the reason and the error it describes (what a user sees).
fn refused(
    m: &ModelController,
    c: &Ctrl,
    qp: &mut Pair,
    cmd: IoCommand<'_>,
    len: usize,
) -> (Reject, Error) {
    let fetched = m.commands_fetched();
    let buf = (len > 0).then(|| c.alloc_dma(len).unwrap());
    let iova = buf.as_ref().map(DmaBuffer::iova);
    let f = qp.submit(cmd, buf, 7).unwrap_err();
    assert_eq!(
        f.buffer.as_ref().map(DmaBuffer::iova),
        iova,
        "{cmd:?}: the buffer comes back"
    );
    assert_eq!(m.commands_fetched(), fetched, "{cmd:?} reached the device");
    assert_eq!(qp.in_flight(), 0);
    (f.reason, qp.describe(f.reason))
}

// ------------------------------------------------------------- sysfs / VFIO

/// A fake sysfs tree in a fresh temporary directory, removed on drop.
struct FakeSysfs {
    root: PathBuf,
}

impl FakeSysfs {
    fn new(name: &str) -> FakeSysfs {
        let root =
            std::env::temp_dir().join(format!("upnvme-bad-input-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        FakeSysfs { root }
    }

    /// A PCI function with its class, bound driver and IOMMU group.
    fn device(&self, addr: &str, class: &str, driver: Option<&str>, group: Option<u32>) {
        let root = &self.root;
        let dir = root.join("bus/pci/devices").join(addr);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("class"), format!("{class}\n")).unwrap();
        fs::write(dir.join("vendor"), "0x1b36\n").unwrap();
        fs::write(dir.join("device"), "0x0010\n").unwrap();
        if let Some(d) = driver {
            let ddir = root.join("bus/pci/drivers").join(d);
            fs::create_dir_all(&ddir).unwrap();
            symlink(&ddir, dir.join("driver")).unwrap();
        }
        if let Some(g) = group {
            let gdir = root.join("kernel/iommu_groups").join(g.to_string());
            fs::create_dir_all(gdir.join("devices")).unwrap();
            symlink(&gdir, dir.join("iommu_group")).unwrap();
            symlink(&dir, gdir.join("devices").join(addr)).unwrap();
        }
    }

    fn sysfs(&self) -> Sysfs {
        Sysfs::at(&self.root)
    }

    fn path(&self) -> &Path {
        &self.root
    }
}

impl Drop for FakeSysfs {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// What opening `addr` through the library's VFIO path says.
fn open_fake(s: &FakeSysfs, addr: &str) -> Error {
    let a: PciAddress = addr.parse().unwrap();
    match VfioNvme::open(&a, PageBacking::Small4K, &s.sysfs()) {
        Ok(_) => panic!("{addr} opened"),
        Err(e) => Error::from(e),
    }
}

#[test]
fn malformed_pci_address() {
    let shape = "expected DOMAIN:BUS:DEVICE.FUNCTION such as 0000:00:04.0 (see `upnvme list`)";
    for (input, reason) in [
        ("", "missing '.FUNCTION'"),
        ("00:04", "missing '.FUNCTION'"),
        (
            "1:2:3:4.0",
            "expected two or three ':'-separated fields before '.'",
        ),
        ("123456789:00:04.0", "domain is not a 32-bit hex number"),
        ("0000:zz:04.0", "bus is not an 8-bit hex number"),
        ("0000:00:20.0", "device is not a hex number 0..1f"),
        ("0000:00:04.8", "function is not a number 0..7"),
    ] {
        let e = Controller::open(input, ControllerOptions::default()).unwrap_err();
        assert!(
            matches!(e, Error::Dma(DmaError::InvalidPciAddress { .. })),
            "{input:?}: {e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!("invalid PCI address '{input}': {reason}; {shape}")
        );
    }
}

#[test]
fn nonexistent_pci_address() {
    // The real sysfs: no machine has a PCI domain ffff with this function.
    let e = Controller::open("ffff:ff:1f.7", ControllerOptions::default()).unwrap_err();
    assert!(
        matches!(e, Error::Dma(DmaError::NoSuchDevice { .. })),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "no PCI device at ffff:ff:1f.7 (no /sys/bus/pci/devices/ffff:ff:1f.7); run `upnvme list` to see the NVMe controllers on this machine"
    );
    // The short form names the same device with domain 0.
    let s = FakeSysfs::new("nodev");
    let e = open_fake(&s, "00:1f.0");
    assert_eq!(
        e.to_string(),
        format!(
            "no PCI device at 0000:00:1f.0 (no {}/bus/pci/devices/0000:00:1f.0); run `upnvme list` to see the NVMe controllers on this machine",
            s.path().display()
        )
    );
}

#[test]
fn pci_device_that_is_not_nvme() {
    let s = FakeSysfs::new("notnvme");
    s.device("0000:00:06.0", "0x020000", Some("vfio-pci"), Some(5));
    let e = open_fake(&s, "0000:00:06.0");
    assert!(
        matches!(
            e,
            Error::Dma(DmaError::NotNvme {
                class: 0x02_0000,
                ..
            })
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "PCI device 0000:00:06.0 has class 0x020000, not an NVMe controller (class 0x010802); run `upnvme list` to find one"
    );
}

#[test]
fn nvme_device_bound_to_another_driver() {
    let s = FakeSysfs::new("nvmedrv");
    s.device("0000:00:05.0", "0x010802", Some("nvme"), Some(4));
    let e = open_fake(&s, "0000:00:05.0");
    assert!(
        matches!(e, Error::Dma(DmaError::NotBoundToVfio { driver: Some(ref d), .. }) if d == "nvme"),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "PCI device 0000:00:05.0 is bound to driver 'nvme'; bind it to vfio-pci with `upnvme setup bind 0000:00:05.0` (or: echo vfio-pci > /sys/bus/pci/devices/0000:00:05.0/driver_override; echo 0000:00:05.0 > /sys/bus/pci/devices/0000:00:05.0/driver/unbind; echo 0000:00:05.0 > /sys/bus/pci/drivers_probe)"
    );
}

#[test]
fn nvme_device_bound_to_no_driver() {
    let s = FakeSysfs::new("unbound");
    s.device("0000:00:09.0", "0x010802", None, Some(7));
    let e = open_fake(&s, "0000:00:09.0");
    assert!(
        matches!(e, Error::Dma(DmaError::NotBoundToVfio { driver: None, .. })),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "PCI device 0000:00:09.0 is not bound to any driver; bind it to vfio-pci with `upnvme setup bind 0000:00:09.0` (or: echo vfio-pci > /sys/bus/pci/devices/0000:00:09.0/driver_override; echo 0000:00:09.0 > /sys/bus/pci/devices/0000:00:09.0/driver/unbind; echo 0000:00:09.0 > /sys/bus/pci/drivers_probe)"
    );
}

#[test]
fn nvme_device_without_iommu_group() {
    let s = FakeSysfs::new("nogroup");
    s.device("0000:00:07.0", "0x010802", Some("vfio-pci"), None);
    let e = open_fake(&s, "0000:00:07.0");
    assert!(
        matches!(e, Error::Dma(DmaError::NoIommuGroup { .. })),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "PCI device 0000:00:07.0 has no IOMMU group: the IOMMU is disabled; enable VT-d/AMD-Vi in firmware and boot with intel_iommu=on (or amd_iommu=on) iommu=pt"
    );
}

#[test]
fn iommu_group_that_is_not_viable() {
    let s = FakeSysfs::new("notviable");
    s.device("0000:00:08.0", "0x010802", Some("vfio-pci"), Some(6));
    // Two more functions in the group: one bound to a host driver blocks it,
    // one without a driver does not.
    let root = s.path().to_path_buf();
    for (addr, driver) in [("0000:00:08.1", Some("xhci_hcd")), ("0000:00:08.2", None)] {
        let dir = root.join("bus/pci/devices").join(addr);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("class"), "0x0c0330\n").unwrap();
        fs::write(dir.join("vendor"), "0x8086\n").unwrap();
        fs::write(dir.join("device"), "0x1234\n").unwrap();
        if let Some(d) = driver {
            let ddir = root.join("bus/pci/drivers").join(d);
            fs::create_dir_all(&ddir).unwrap();
            symlink(&ddir, dir.join("driver")).unwrap();
        }
        symlink(&dir, root.join("kernel/iommu_groups/6/devices").join(addr)).unwrap();
    }
    let e = open_fake(&s, "0000:00:08.0");
    assert!(
        matches!(
            e,
            Error::Dma(DmaError::GroupNotViable {
                group: 6,
                ref others,
                ..
            }) if others.len() == 1
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "IOMMU group 6 of 0000:00:08.0 is not viable: 0000:00:08.1 (bound to xhci_hcd) must also be bound to vfio-pci (or unbound) before the group can be used; `upnvme setup bind <address>` for each (see `upnvme setup status`)"
    );
}

#[test]
fn vfio_group_node_missing() {
    // Everything sysfs says is right, but /dev/vfio/<group> does not exist
    // (vfio-pci not loaded, or this machine has no such group).
    let group = 4242;
    if Path::new(&format!("/dev/vfio/{group}")).exists() {
        eprintln!("skipped: /dev/vfio/{group} exists here");
        return;
    }
    let s = FakeSysfs::new("nonode");
    s.device("0000:00:04.0", "0x010802", Some("vfio-pci"), Some(group));
    let e = open_fake(&s, "0000:00:04.0");
    assert!(matches!(e, Error::Dma(DmaError::GroupOpen { .. })), "{e:?}");
    assert_eq!(
        e.to_string(),
        "cannot open /dev/vfio/4242: No such file or directory (os error 2); the vfio-pci module is not loaded or the device is not bound to it (`upnvme setup bind <address>`)"
    );
}

// ------------------------------------------------------------- DMA memory

/// A mapper for host memory nobody will DMA to (the tests only need the
/// allocation paths): the model's IOMMU table, with no controller running.
fn no_device() -> Arc<dyn DmaMapper> {
    let m = ModelController::new(ModelConfig::default());
    upnvme::Device::dma_mapper(&m).expect("the model maps memory")
}

fn hugepage_counts() -> (u64, u64) {
    let read = |f: &str| {
        fs::read_to_string(format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{f}"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    (read("free_hugepages"), read("nr_hugepages"))
}

#[test]
fn too_few_hugepages() {
    // One 2 MiB hugepage more than are free now (not more than the
    // machine's memory, which is refused before any hugepage is asked for:
    // `memory.rs::a_mapping_larger_than_the_machines_memory_is_refused`).
    let bytes = (hugepage_counts().0 as usize + 1) * (2 << 20);
    let alloc = DmaAllocator::new(no_device(), PageBacking::Huge2M);
    let e = Error::from(alloc.alloc(bytes).unwrap_err());
    let (free, total) = hugepage_counts();
    let need = (bytes / (2 << 20)) as u64;
    let suggest = total + need.saturating_sub(free).max(1);
    assert!(
        matches!(
            e,
            Error::Dma(DmaError::HugepagesUnavailable { page_kib: 2048, .. })
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "cannot map {bytes} bytes of 2048 KiB hugepages ({free} of {total} free): reserve more with `echo {suggest} > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages` or `upnvme setup hugepages {suggest}` (or set PageBacking::Small4K to opt in to 4 KiB pages)"
        )
    );
}

#[test]
fn zero_length_dma_allocation() {
    let (m, c) = setup(ModelConfig::default());
    let e = c.alloc_dma(0).unwrap_err();
    assert!(
        matches!(e, Error::Dma(DmaError::InvalidAllocation(_))),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "invalid DMA allocation: zero-length buffer: ask for at least 1 byte"
    );
    // A length that cannot be rounded up to pages says why, not only the
    // number (a review).
    let e = c.alloc_dma(usize::MAX).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "invalid DMA allocation: {} bytes cannot be rounded up to whole 4 KiB pages (beyond \
             the address space): ask for less",
            usize::MAX
        )
    );
    drop(c);
    assert_clean(&m);
}

/// The memory API's refusals name the caller's own figures and a remedy (a
/// review found a carve overflow naming offset 0, and IOVA exhaustion with
/// no way out).
#[test]
fn memory_refusals_name_the_callers_figures_and_a_remedy() {
    let (_m, c) = setup(ModelConfig::default());
    let reg = c
        .register_memory(upnvme::memmap2::MmapMut::map_anon(64 << 10).unwrap())
        .unwrap();
    let e = reg.buffer(8192, usize::MAX).unwrap_err();
    assert!(
        matches!(e, upnvme::CarveError::OutOfRange { offset: 8192, .. }),
        "{e}"
    );
    let m = ModelController::new(ModelConfig::default());
    let c = open(&m, opts());
    m.limit_iova_window(0);
    let e = c.alloc_dma(4 << 20).unwrap_err().to_string();
    assert!(
        e.starts_with("no free IOVA space for a region of ")
            && e.contains("drop DMA buffers and pools that are no longer needed"),
        "{e}"
    );
}

#[test]
fn dma_buffer_access_past_its_end() {
    let (m, c) = setup(ModelConfig::default());
    let buf = c.alloc_dma(4096).unwrap();
    let e = Error::from(buf.write_bytes(4090, &[0u8; 8]).unwrap_err());
    assert_eq!(
        e.to_string(),
        "access of 8 bytes at offset 4090 is outside a 4096-byte DMA buffer"
    );
    let e = Error::from(buf.read_u64(usize::MAX - 2).unwrap_err());
    assert!(
        matches!(e, Error::Dma(DmaError::OutOfBounds { .. })),
        "{e:?}"
    );
    drop(c);
    assert_clean(&m);
}

#[test]
fn data_buffer_not_dword_aligned() {
    // alloc_dma only hands out page-aligned buffers; a piece of one at an
    // odd offset cannot be described by a PRP (bits 1:0 of PRP1
    // must be zero) and is refused before the device sees it.
    let (m, c, mut qp) = pair();
    let ns = ns1(&c);
    // The second piece of a split at 4098 bytes starts 2 bytes past a dword.
    let odd = c
        .alloc_dma(3 * 4096)
        .unwrap()
        .split(4098)
        .unwrap()
        .swap_remove(1);
    assert_eq!(odd.iova() % 4, 2);
    let iova = odd.iova();
    let fetched = m.commands_fetched();
    let f = qp.submit(read(&ns, 0, 1), Some(odd), 1).unwrap_err();
    // The buffer handed back is the unaligned one.
    assert_eq!(
        f.buffer.as_ref().map(DmaBuffer::iova),
        Some(iova),
        "buffer handed back"
    );
    assert_eq!(m.commands_fetched(), fetched);
    assert_eq!(qp.in_flight(), 0);
    assert_eq!(f.reason, Reject::Misaligned);
    let e = qp.describe(f.reason);
    assert!(
        matches!(e, Error::Rejected(r) if r.is_invalid_argument()),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "invalid argument: the data does not start dword aligned (the buffer's IOVA, e.g. a piece of DmaBuffer::split at an odd offset, plus any slice offset), which PRP1 and MPTR require: split buffers and start slices at multiples of 4 bytes"
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

// ------------------------------------------------------------- namespaces

/// A handle of namespace `nsid` that belongs to no controller: built from
/// `c`'s Identify Namespace data, as an application could, with any NSID.
fn unadopted(c: &Ctrl, nsid: u32) -> Namespace {
    Namespace::from_identify(nsid, ns1(c).identify().clone()).unwrap()
}

/// The text of a refused handle of another controller.
const FOREIGN: &str = "invalid argument: the namespace handle belongs to another controller: take it from this pair's controller";

#[test]
fn namespace_that_is_not_active() {
    let (m, c, mut qp) = pair();
    let e = c.namespace(2).unwrap_err();
    assert!(matches!(e, Error::NoSuchNamespace { nsid: 2, .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "namespace 2 is not active on model (active: [1])"
    );
    // A handle cannot name a namespace this controller lacks: namespace 2 of
    // another controller (and even its namespace 1) is refused by the pair.
    let (m2, c2) = setup(ModelConfig {
        namespaces: vec![
            NamespaceConfig {
                nsid: 1,
                lba_size: 4096,
                blocks: BLOCKS,
                ..NamespaceConfig::default()
            },
            NamespaceConfig {
                nsid: 2,
                lba_size: 4096,
                blocks: BLOCKS,
                ..NamespaceConfig::default()
            },
        ],
        ..Default::default()
    });
    for nsid in [2, 1] {
        let other = c2.namespace(nsid).unwrap().clone();
        let (r, e) = refused(&m, &c, &mut qp, read(&other, 0, 1), 4096);
        assert_eq!(r, Reject::ForeignNamespace, "nsid {nsid}");
        assert!(
            matches!(e, Error::Rejected(r) if r.is_invalid_argument()),
            "{e:?}"
        );
        assert_eq!(e.to_string(), FOREIGN);
    }
    // So is a handle that belongs to no controller.
    let (r, _) = refused(&m, &c, &mut qp, read(&unadopted(&c, 2), 0, 1), 4096);
    assert_eq!(r, Reject::ForeignNamespace);
    drop(c2);
    assert_clean(&m2);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn namespace_id_zero() {
    let (m, c, mut qp) = pair();
    let e = c.namespace(0).unwrap_err();
    assert!(matches!(e, Error::NoSuchNamespace { nsid: 0, .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "namespace 0 is not active on model (active: [1])"
    );
    // A hand-made handle with NSID 0 never reaches the device.
    let ns0 = unadopted(&c, 0);
    let (r, e) = refused(&m, &c, &mut qp, IoCommand::Flush { ns: &ns0 }, 0);
    assert_eq!(r, Reject::ForeignNamespace);
    assert_eq!(e.to_string(), FOREIGN);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn broadcast_namespace_id() {
    // NSID FFFFFFFFh addresses every namespace; the I/O path takes one
    // namespace at a time, so no handle names it, and a hand-made one is
    // refused for every command (Flush too).
    let (m, c, mut qp) = pair();
    let e = c.namespace(u32::MAX).unwrap_err();
    assert!(
        matches!(e, Error::NoSuchNamespace { nsid: u32::MAX, .. }),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "namespace 4294967295 is not active on model (active: [1])"
    );
    let all = unadopted(&c, u32::MAX);
    for cmd in [
        IoCommand::Flush { ns: &all },
        IoCommand::Write {
            ns: &all,
            slba: 0,
            blocks: 1,
        },
    ] {
        let (r, e) = refused(&m, &c, &mut qp, cmd, 4096);
        assert_eq!(r, Reject::ForeignNamespace, "{cmd:?}");
        assert_eq!(e.to_string(), FOREIGN);
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
}

// ------------------------------------------------------------- LBA ranges

/// The text of a refused LBA range.
const OUTSIDE: &str = "invalid argument: the LBA range is outside the namespace (NSZE)";

#[test]
fn lba_range_past_the_end() {
    let (m, c, mut qp) = pair();
    let ns = ns1(&c);
    for (slba, blocks) in [(BLOCKS, 1), (BLOCKS - 1, 2)] {
        let (r, e) = refused(&m, &c, &mut qp, read(&ns, slba, blocks), 8192);
        assert_eq!(r, Reject::LbaRange, "{slba}..+{blocks}");
        assert!(
            matches!(e, Error::Rejected(r) if r.is_invalid_argument()),
            "{e:?}"
        );
        assert_eq!(e.to_string(), OUTSIDE);
    }
    // The last block itself is inside.
    let buf = c.alloc_dma(4096).unwrap();
    qp.read_blocking(&ns, BLOCKS - 1, 1, buf, T).unwrap();
    // Write Zeroes checks its range the same way.
    let wz = IoCommand::WriteZeroes {
        ns: &ns,
        slba: 999,
        blocks: 2,
        deallocate: false,
    };
    let (r, e) = refused(&m, &c, &mut qp, wz, 0);
    assert_eq!(r, Reject::LbaRange);
    assert_eq!(e.to_string(), OUTSIDE);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn lba_range_that_overflows_u64() {
    let (m, c, mut qp) = pair();
    let ns = ns1(&c);
    let (r, e) = refused(&m, &c, &mut qp, read(&ns, u64::MAX, 2), 8192);
    assert_eq!(r, Reject::LbaRange);
    assert_eq!(e.to_string(), OUTSIDE);
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn zero_blocks() {
    let (m, c, mut qp) = pair();
    let ns = ns1(&c);
    let (r, e) = refused(&m, &c, &mut qp, read(&ns, 0, 0), 4096);
    assert_eq!(r, Reject::BlockCount { blocks: 0 });
    assert_eq!(
        e.to_string(),
        "invalid argument: block count 0: must be 1..=65536"
    );
    let wz = IoCommand::WriteZeroes {
        ns: &ns,
        slba: 0,
        blocks: 0,
        deallocate: true,
    };
    let (r, e) = refused(&m, &c, &mut qp, wz, 0);
    assert_eq!(r, Reject::BlockCount { blocks: 0 });
    assert_eq!(
        e.to_string(),
        "invalid argument: block count 0: must be 1..=65536"
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// NLB is a 16-bit, 0-based field: a Write Zeroes above 65536 blocks is
/// split (tests/tests/split.rs), but not into more commands than the pair's
/// depth.
#[test]
fn more_than_65536_blocks() {
    // A namespace the command lies inside (the model stores only what is
    // written): outside it, the range is what is refused (row 18).
    let (m, c) = setup(config_one_ns(4096, 1 << 26));
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ns = ns1(&c);
    let blocks = (qp.max_depth() + 1) * 65_536;
    let wz = IoCommand::WriteZeroes {
        ns: &ns,
        slba: 0,
        blocks,
        deallocate: false,
    };
    let (r, e) = refused(&m, &c, &mut qp, wz, 0);
    assert_eq!(r, Reject::BlockCount { blocks });
    assert_eq!(
        e.to_string(),
        format!(
            "invalid argument: block count {blocks}: one command carries 1..=65536 (a Read, \
             Write, Compare, Verify, Write Zeroes or Write Uncorrectable above that is split, \
             into at most the queue pair's depth of commands)"
        )
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

// ------------------------------------------------------------- sizes

#[test]
fn buffer_too_small() {
    let (m, c, mut qp) = pair();
    let ns = ns1(&c);
    let (r, e) = refused(&m, &c, &mut qp, read(&ns, 0, 2), 4096);
    assert_eq!(r, Reject::BufferTooSmall { need: 8192 });
    assert!(
        matches!(e, Error::Rejected(r) if r.is_invalid_argument()),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "invalid argument: the transfer needs 8192 bytes; the buffer is smaller"
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// An Identify Namespace page for namespace 1: `BLOCKS` blocks of 4 KiB
/// whose only LBA format has `ms` metadata bytes, `flbas` and `dps` as given.
fn identify_ns_with_metadata(ms: u16, flbas: u8, dps: u8) -> Vec<u8> {
    let mut p = vec![0u8; 4096];
    for off in [0, 8, 16] {
        p[off..off + 8].copy_from_slice(&BLOCKS.to_le_bytes()); // NSZE, NCAP, NUSE
    }
    p[26] = flbas;
    p[29] = dps;
    let lbaf0 = u32::from(ms) | 12 << 16; // MS, LBADS 12 (4 KiB)
    p[128..132].copy_from_slice(&lbaf0.to_le_bytes());
    p
}

#[test]
fn metadata_and_protection_refusals_say_what_is_wrong() {
    // PI Type 1 in 4 metadata bytes: no tuple fits, no transfer can be
    // described; the data commands are refused, the others run.
    let m = ModelController::new(config_one_ns(4096, BLOCKS));
    m.set_identify_data(0, 1, Some(identify_ns_with_metadata(4, 0x10, 1)));
    let c = open(&m, opts());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ns = ns1(&c);
    assert_eq!(ns.metadata_size(), 4);
    for cmd in [
        read(&ns, 0, 1),
        IoCommand::Write {
            ns: &ns,
            slba: 0,
            blocks: 1,
        },
    ] {
        let (r, e) = refused(&m, &c, &mut qp, cmd, 8192);
        assert!(matches!(r, Reject::MetadataFormat(l) if l.ms == 4), "{r:?}");
        assert!(matches!(e, Error::Rejected(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "command refused: the namespace's LBA format (4 metadata bytes per block, extended \
             LBA, protection information type 1 (16-bit guard) in the last 8 bytes) carries protection \
             information in fewer than 8 metadata bytes, which no transfer can describe: select \
             another LBA format with Format NVM (`upnvme format`)"
        );
    }
    qp.execute_blocking(IoCommand::Flush { ns: &ns }, None, T)
        .unwrap();
    drop(qp);
    drop(c);
    assert_clean(&m);

    // A separate-metadata namespace: Read without its metadata buffer.
    let m = ModelController::new(config_one_ns(4096, BLOCKS));
    m.set_identify_data(0, 1, Some(identify_ns_with_metadata(8, 0, 0)));
    let c = open(&m, opts());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ns = ns1(&c);
    let (r, e) = refused(&m, &c, &mut qp, read(&ns, 0, 2), 8192);
    assert_eq!(r, Reject::MetadataBuffer { need: 16 });
    assert_eq!(
        e.to_string(),
        "invalid argument: the namespace keeps metadata in a separate buffer: pass one of at \
         least 16 bytes (blocks × metadata size) with IoData::metadata"
    );
    // Protection fields without PI in the format.
    let f = qp
        .submit_io(
            read(&ns, 0, 1),
            upnvme::IoData::buffer(c.alloc_dma(4096).unwrap())
                .metadata(c.alloc_dma(8).unwrap())
                .protection(upnvme::Protection::CHECK),
            1,
        )
        .unwrap_err();
    assert_eq!(
        qp.describe(f.reason).to_string(),
        "invalid argument: protection information does not apply: the namespace's format has no \
         protection information (Identify Namespace DPS = 0)"
    );
    assert!(
        f.buffer.is_some() && f.metadata.is_some(),
        "the memory comes back"
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn missing_data_buffer() {
    let (m, c, mut qp) = pair();
    let ns = ns1(&c);
    for cmd in [
        read(&ns, 0, 1),
        IoCommand::Write {
            ns: &ns,
            slba: 0,
            blocks: 1,
        },
        IoCommand::Compare {
            ns: &ns,
            slba: 0,
            blocks: 1,
        },
    ] {
        let (r, e) = refused(&m, &c, &mut qp, cmd, 0);
        assert_eq!(r, Reject::NoBuffer, "{cmd:?}");
        assert!(
            matches!(e, Error::Rejected(r) if r.is_invalid_argument()),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "invalid argument: the command needs a data buffer",
            "{cmd:?}"
        );
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
}

const TOO_LARGE: &str = "a transfer of {} bytes exceeds the maximum per command (MDTS, at most 4 MiB) and cannot be split into at most queue-depth commands of whole blocks (raw commands are never split); submit it in parts";

#[test]
fn transfer_above_mdts() {
    // A pair 2 deep takes a transfer of up to two MDTS-sized commands
    // (split.rs); three do not fit in it, ever.
    let (m, c) = setup(config_one_ns(4096, BLOCKS));
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(3),
            ..Default::default()
        })
        .unwrap();
    let ns = ns1(&c);
    assert_eq!(qp.max_transfer(), 512 << 10, "MDTS 7 with 4 KiB pages");
    assert_eq!(qp.max_depth(), 2);
    let (r, e) = refused(&m, &c, &mut qp, read(&ns, 0, 257), 257 * 4096);
    assert_eq!(r, Reject::TransferTooLarge { bytes: 1_052_672 });
    assert!(
        matches!(e, Error::Rejected(r) if r.is_invalid_argument()),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!("invalid argument: {}", TOO_LARGE.replace("{}", "1052672"))
    );
    // MDTS itself is one command, twice MDTS two.
    for (blocks, commands) in [(128u32, 1u64), (256, 2)] {
        let fetched = m.commands_fetched();
        let buf = c.alloc_dma(blocks as usize * 4096).unwrap();
        qp.read_blocking(&ns, 0, blocks, buf, T).unwrap();
        assert_eq!(m.commands_fetched() - fetched, commands, "{blocks} blocks");
    }
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn transfer_above_the_queue_pairs_cap() {
    // MDTS 0 (no limit) or a large MDTS: a queue pair still takes at most
    // 4 MiB per command (its PRP list pages are preallocated per slot), and
    // says so. Controller::max_transfer_bytes reports the same capped limit.
    // Above it a transfer is split (split.rs): as many commands as the
    // pair's depth at most.
    for mdts in [0u8, 12] {
        let (m, c) = setup(ModelConfig {
            mdts,
            ..config_one_ns(4096, 4096)
        });
        let ns = ns1(&c);
        let mut qp = c
            .io_queue_pair(QueuePairOptions {
                entries: Some(2),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(qp.max_transfer(), 4 << 20, "MDTS {mdts}");
        // The controller reports the per-command limit its queue pairs apply.
        assert_eq!(c.max_transfer_bytes(), Some(4 << 20), "MDTS {mdts}");
        let (r, e) = refused(&m, &c, &mut qp, read(&ns, 0, 1025), 1025 * 4096);
        assert_eq!(r, Reject::TransferTooLarge { bytes: 4_198_400 });
        assert_eq!(
            e.to_string(),
            format!("invalid argument: {}", TOO_LARGE.replace("{}", "4198400"))
        );
        // 4 MiB itself works.
        let buf = c.alloc_dma(4 << 20).unwrap();
        qp.read_blocking(&ns, 0, 1024, buf, T).unwrap();
        drop(qp);
        drop(c);
        assert_clean(&m);
    }
}

#[test]
fn log_page_length_not_a_dword_multiple() {
    let (m, c) = setup(ModelConfig::default());
    for len in [0, 3, 514] {
        let e = c.get_log_page(0x02, u32::MAX, len, 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("invalid argument: log page length {len} must be a non-zero multiple of 4")
        );
    }
    assert!(c.failure().is_none(), "an argument error fails nothing");
    drop(c);
    assert_clean(&m);
}

#[test]
fn admin_data_above_mdts() {
    let (m, c) = setup(ModelConfig::default());
    let fetched = m.commands_fetched();
    let sqe = upnvme::Sqe::get_log_page(0x02, u32::MAX, (1 << 20) / 4, 0, false);
    let e = c.admin_passthrough(sqe, 1 << 20, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid argument: admin data of 1048576 bytes exceeds the transfer limit (524288 bytes)"
    );
    assert_eq!(m.commands_fetched(), fetched);
    drop(c);
    assert_clean(&m);
}

// ------------------------------------------------------------- depths and queues

#[test]
fn more_commands_than_the_queue_holds() {
    // A queue of 4 entries holds 3 commands; completions not yet reaped
    // still count.
    let (m, c) = setup(config_one_ns(4096, BLOCKS));
    let mut qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(4),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(qp.max_depth(), 3);
    let ns = ns1(&c);
    for i in 0..3 {
        let buf = c.alloc_dma(4096).unwrap();
        qp.submit(read(&ns, i, 1), Some(buf), i).unwrap();
    }
    let fetched = m.commands_fetched();
    let buf = c.alloc_dma(4096).unwrap();
    let f = qp.submit(read(&ns, 3, 1), Some(buf), 3).unwrap_err();
    assert!(f.buffer.is_some(), "buffer handed back");
    assert_eq!(f.reason, Reject::QueueFull);
    let e = qp.describe(f.reason);
    assert!(matches!(e, Error::QueueFull { qid: 1 }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "I/O queue 1 is full: reap completions (process_completions) before submitting more"
    );
    assert_eq!(m.commands_fetched(), fetched);
    // Reaping makes room again.
    assert_eq!(
        qp.process_completions(u32::MAX, |_, c| assert!(c.is_ok()))
            .unwrap(),
        3
    );
    qp.submit(read(&ns, 3, 1), f.buffer, 3).unwrap();
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn every_granted_queue_pair_in_use() {
    let (m, c) = setup(ModelConfig {
        max_ioqpairs: 2,
        ..Default::default()
    });
    assert_eq!(c.granted_io_queues(), 2);
    let a = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let b = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let e = c.io_queue_pair(QueuePairOptions::default()).unwrap_err();
    assert!(matches!(e, Error::NoQueuesLeft { granted: 2, .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "controller model has no I/O queue left: all 2 granted queue pairs are in use (ask for more with ControllerOptions::io_queues, or drop a queue pair)"
    );
    // Dropping one gives its queue ID back.
    drop(a);
    let a = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    drop((a, b));
    drop(c);
    assert_clean(&m);
}

#[test]
fn queue_entries_outside_2_to_mqes() {
    let (m, c) = setup(ModelConfig {
        mqes: 63,
        ..Default::default()
    });
    let queues = m.commands_fetched();
    for (entries, cq_entries, text) in [
        (
            Some(0),
            None,
            "queue entries of 0: must be 2..=64 (CAP.MQES + 1)",
        ),
        (
            Some(1),
            None,
            "queue entries of 1: must be 2..=64 (CAP.MQES + 1)",
        ),
        (
            Some(65),
            None,
            "queue entries of 65: must be 2..=64 (CAP.MQES + 1)",
        ),
        (
            Some(8),
            Some(1),
            "completion queue entries of 1: must be 2..=64 (CAP.MQES + 1)",
        ),
        (
            Some(8),
            Some(65),
            "completion queue entries of 65: must be 2..=64 (CAP.MQES + 1)",
        ),
    ] {
        let e = c
            .io_queue_pair(QueuePairOptions {
                entries,
                cq_entries,
                ..Default::default()
            })
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert_eq!(e.to_string(), format!("invalid argument: {text}"));
    }
    assert_eq!(m.commands_fetched(), queues, "no queue was created");
    // A CQ smaller than the SQ is allowed (the specification allows it) and
    // bounds the depth: at most cq_entries - 1 commands in flight.
    let qp = c
        .io_queue_pair(QueuePairOptions {
            entries: Some(8),
            cq_entries: Some(4),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        (qp.sq_entries(), qp.cq_entries(), qp.max_depth()),
        (8, 4, 3)
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn out_of_range_controller_options_are_clamped() {
    // Counts in ControllerOptions are requests: out-of-range values are
    // clamped to what the controller and the spec allow, not errors.
    let m = ModelController::new(ModelConfig {
        mqes: 15,
        ..Default::default()
    });
    for (admin, io_queues, want_admin, want_io) in
        [(0, 0, 2, 1), (1, 1, 2, 1), (100_000, 500, 16, 64)]
    {
        let c = open(
            &m,
            ControllerOptions {
                admin_queue_entries: admin,
                io_queues,
                ..opts()
            },
        );
        assert_eq!(
            c.admin_queue_entries(),
            want_admin,
            "admin_queue_entries {admin}"
        );
        assert_eq!(c.granted_io_queues(), want_io, "io_queues {io_queues}");
        c.close().unwrap();
    }
    assert_clean(&m);
}

/// A bound of zero on a wait is refused, not taken (a review: each was
/// accepted; a zero shutdown bound disabled the controller without waiting
/// for its shutdown, a zero command timeout aborted every command a scan
/// found in flight). `None` keeps the defaults; positive bounds are taken.
#[test]
fn zero_timeouts_are_refused() {
    let m = ModelController::new(ModelConfig::default());
    let zero = Some(Duration::ZERO);
    for (o, text) in [
        (
            ControllerOptions {
                admin_timeout: zero,
                ..opts()
            },
            "invalid argument: ControllerOptions::admin_timeout of 0: every admin command would \
             time out before the controller could answer; pass None for max(CAP.TO, 5 s), or a \
             positive duration",
        ),
        (
            ControllerOptions {
                ready_timeout: zero,
                ..opts()
            },
            "invalid argument: ControllerOptions::ready_timeout of 0: bring-up and every reset \
             would time out before CSTS.RDY could change; pass None for CAP.TO, or a positive \
             duration",
        ),
        (
            ControllerOptions {
                shutdown_timeout: zero,
                ..opts()
            },
            "invalid argument: ControllerOptions::shutdown_timeout of 0: close would disable the \
             controller without waiting for its shutdown, and data in its volatile write cache \
             could be lost; pass None for RTD3E clamped to 5-60 s, or a positive duration",
        ),
    ] {
        let e = Controller::with_device(m.clone(), o.clone()).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert_eq!(e.to_string(), text);
        // Refused before the device is opened or touched.
        let e = Controller::open("0000:zz:04.0", o).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    }
    assert_eq!(m.commands_fetched(), 0, "nothing reached the model");
    assert_eq!(m.cc() & 1, 0, "the controller was never enabled");

    let c = open(&m, opts());
    let fetched = m.commands_fetched();
    let e = c
        .io_queue_pair(QueuePairOptions {
            command_timeout: zero,
            ..Default::default()
        })
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "invalid argument: QueuePairOptions::command_timeout of 0: every command still in flight \
         at the first timeout scan would be aborted (and the controller reset); pass None to \
         disable command timeouts, or a positive duration (the default is 30 s)"
    );
    assert_eq!(m.commands_fetched(), fetched, "no queue was created");
    // An admin passthrough with a timeout of zero would be sent and given
    // up at once (its memory quarantined, its result lost): refused.
    let e = c
        .admin_passthrough_with_timeout(
            upnvme_queues::Sqe::identify(upnvme_queues::cns::CONTROLLER, 0, 0),
            4096,
            None,
            Duration::ZERO,
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "invalid argument: admin command 0x06 through admin_passthrough_with_timeout: a timeout \
         of zero would give the command up as soon as it is sent; pass the time it may take \
         (admin_passthrough uses ControllerOptions::admin_timeout)"
    );
    assert_eq!(m.commands_fetched(), fetched, "nothing was sent");
    // The smallest positive bounds are taken.
    let tiny = Some(Duration::from_nanos(1));
    let qp = c
        .io_queue_pair(QueuePairOptions {
            command_timeout: tiny,
            ..Default::default()
        })
        .unwrap();
    drop(qp);
    drop(c);
    let c = open(
        &m,
        ControllerOptions {
            shutdown_timeout: Some(Duration::from_secs(1)),
            ..opts()
        },
    );
    c.close().unwrap();
    assert_clean(&m);
}

// ------------------------------------------------------------- Dataset Management

#[test]
fn dataset_management_range_count() {
    let (m, c, mut qp) = pair();
    let ns = ns1(&c);
    // No range; more than 256 ranges that are one integral dataset (IDR),
    // which several commands would not be (a Deallocate of 257 goes as
    // two: split.rs).
    for n in [0usize, 257] {
        let ranges = vec![
            DsmRange {
                cattr: 0,
                nlb: 1,
                slba: 0,
            };
            n
        ];
        let cmd = IoCommand::DatasetManagement {
            ns: &ns,
            ranges: &ranges,
            attributes: DsmAttributes {
                integral_read: true,
                ..DsmAttributes::default()
            },
        };
        let (r, e) = refused(&m, &c, &mut qp, cmd, 0);
        assert_eq!(
            r,
            Reject::RangeCount {
                command: RangeCommand::DatasetManagement,
                ranges: n as u32,
                max: 256,
            }
        );
        let more = if n > 256 {
            " per command; more go as several commands (at most the queue pair's depth of them) \
             unless Integral Dataset attributes (IDR, IDW) are set"
        } else {
            ""
        };
        assert_eq!(
            e.to_string(),
            format!("invalid argument: Dataset Management with {n} ranges: must be 1..=256{more}")
        );
    }
    // 256 ranges are fine.
    let ranges: Vec<DsmRange> = (0..256)
        .map(|i| DsmRange {
            cattr: 0,
            nlb: 1,
            slba: i,
        })
        .collect();
    let cmd = IoCommand::Deallocate {
        ns: &ns,
        ranges: &ranges,
    };
    qp.execute_blocking(cmd, None, T).unwrap();
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn dataset_management_range_outside_the_namespace() {
    let (m, c, mut qp) = pair();
    let ns = ns1(&c);
    let ranges = [
        DsmRange {
            cattr: 0,
            nlb: 1,
            slba: 0,
        },
        DsmRange {
            cattr: 0,
            nlb: 5,
            slba: 998,
        },
    ];
    let cmd = IoCommand::Deallocate {
        ns: &ns,
        ranges: &ranges,
    };
    let (r, e) = refused(&m, &c, &mut qp, cmd, 0);
    assert_eq!(r, Reject::LbaRange);
    assert_eq!(e.to_string(), OUTSIDE);
    let ranges = [DsmRange {
        cattr: 0,
        nlb: 0,
        slba: 0,
    }];
    let cmd = IoCommand::Deallocate {
        ns: &ns,
        ranges: &ranges,
    };
    let (r, e) = refused(&m, &c, &mut qp, cmd, 0);
    assert_eq!(r, Reject::BlockCount { blocks: 0 });
    assert_eq!(
        e.to_string(),
        "invalid argument: block count 0: must be 1..=65536"
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

// ------------------------------------------------------------- closed handles

#[test]
fn queue_pair_calls_after_close() {
    let (m, c, mut qp) = pair();
    let ns = ns1(&c);
    let buf = c.alloc_dma(4096).unwrap();
    c.close().unwrap();
    let fetched = m.commands_fetched();
    let doorbells = m.total_doorbell_writes();
    let closed = "controller model is closed";
    // submit and queue: refused, buffer back.
    let f = qp.submit(read(&ns, 0, 1), Some(buf), 1).unwrap_err();
    assert_eq!(f.reason, Reject::Unusable);
    let e = qp.describe(f.reason);
    assert!(matches!(e, Error::Closed { .. }), "{e:?}");
    assert_eq!(e.to_string(), closed);
    assert!(f.buffer.is_some());
    let f = qp.queue(read(&ns, 0, 1), f.buffer, 1).unwrap_err();
    assert_eq!(f.reason, Reject::Unusable);
    assert_eq!(qp.describe(f.reason).to_string(), closed);
    // Blocking helpers.
    let f = qp
        .read_blocking(&ns, 0, 1, f.buffer.unwrap(), T)
        .unwrap_err();
    assert_eq!(f.error.to_string(), closed);
    assert!(f.buffer.is_some());
    // process_completions: not an empty queue forever.
    let e = qp.process_completions(8, |_, _| {}).unwrap_err();
    assert_eq!(e.to_string(), closed);
    // ring() is a no-op.
    qp.ring();
    // Dropping the pair sends no Delete I/O SQ/CQ to the disabled controller.
    drop(qp);
    assert_eq!(m.commands_fetched(), fetched, "admin commands after close");
    assert_eq!(
        m.total_doorbell_writes(),
        doorbells,
        "doorbells after close"
    );
    assert_clean(&m);
}

#[test]
fn admin_calls_after_close_are_not_expressible() {
    // `Controller::close(self)` consumes the handle, so admin calls after it
    // do not compile; what remains reachable is a queue pair, whose own admin
    // commands (re-creating its queues after a reset) must not be sent.
    let (m, c, mut qp) = pair();
    c.reset().unwrap();
    c.close().unwrap();
    let fetched = m.commands_fetched();
    let e = qp.process_completions(8, |_, _| {}).unwrap_err();
    assert_eq!(e.to_string(), "controller model is closed");
    assert_eq!(
        m.commands_fetched(),
        fetched,
        "Create I/O CQ/SQ after close"
    );
    drop(qp);
    assert_clean(&m);
}

// ------------------------------------------------------------- failed controllers

#[test]
fn calls_on_a_failed_controller() {
    let (m, c, mut qp) = pair();
    // The device completes with an unknown command identifier.
    assert!(m.post_raw_completion(qp.qid(), [0, 0, 1 << 16, 0x00ff]));
    let e = qp.process_completions(8, |_, _| {}).unwrap_err();
    assert!(matches!(e, Error::DeviceFault { .. }), "{e:?}");
    let fault = e.to_string();
    assert!(
        fault.starts_with("controller model misbehaved: queue 1: ")
            && fault
                .ends_with("; the controller is marked failed (Controller::reset brings it back)"),
        "{fault}"
    );
    let failed = format!(
        "controller model has failed earlier ({fault}) and accepts no more commands until Controller::reset"
    );
    assert_eq!(c.failure().as_deref(), Some(fault.as_str()));
    let ns = ns1(&c);
    let buf = c.alloc_dma(4096).unwrap();
    let f = qp.submit(read(&ns, 0, 1), Some(buf), 1).unwrap_err();
    assert_eq!(f.reason, Reject::Unusable);
    let e = qp.describe(f.reason);
    assert!(matches!(e, Error::ControllerFailed { .. }), "{e:?}");
    assert_eq!(e.to_string(), failed);
    assert!(f.buffer.is_some());
    assert_eq!(
        qp.process_completions(8, |_, _| {})
            .unwrap_err()
            .to_string(),
        failed
    );
    assert_eq!(c.smart_log().unwrap_err().to_string(), failed);
    assert_eq!(c.identify_controller().unwrap_err().to_string(), failed);
    assert_eq!(
        c.io_queue_pair(QueuePairOptions::default())
            .unwrap_err()
            .to_string(),
        failed
    );
    // A reset puts it back in service; the pair re-creates its queues at its
    // next call.
    c.reset().unwrap();
    assert!(c.failure().is_none());
    let buf = c.alloc_dma(4096).unwrap();
    qp.read_blocking(&ns, 0, 1, buf, T).unwrap();
    drop(qp);
    c.close().unwrap();
    let _ = m.take_violations();
    assert_eq!(m.dma_faults(), 0);
}

#[test]
fn device_gone() {
    let m = ModelController::new(ModelConfig::default());
    m.unplug();
    let e = Controller::with_device(m.clone(), opts()).unwrap_err();
    assert!(matches!(e, Error::ControllerGone { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "controller model is gone (register reads return all ones): hot-removed, reset by someone else, or its PCI link is down; if the link comes back (a recovered PCIe error) Controller::reset re-initialises it, otherwise drop the controller with its queue pairs and DMA memory and open it again once the device is back (`upnvme setup status` lists it)"
    );
    // Gone after bring-up: every call says so.
    let (m, c, mut qp) = pair();
    m.unplug();
    let gone = "controller model is gone (register reads return all ones): hot-removed, reset by someone else, or its PCI link is down; if the link comes back (a recovered PCIe error) Controller::reset re-initialises it, otherwise drop the controller with its queue pairs and DMA memory and open it again once the device is back (`upnvme setup status` lists it)";
    assert_eq!(c.status().unwrap_err().to_string(), gone);
    let buf = c.alloc_dma(4096).unwrap();
    let f = qp
        .read_blocking(&ns1(&c), 0, 1, buf, Duration::from_secs(5))
        .unwrap_err();
    assert_eq!(f.error.to_string(), gone);
    assert!(f.buffer.is_none(), "the device may still own the buffer");
    let e = c.smart_log().unwrap_err();
    assert!(matches!(e, Error::ControllerFailed { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "controller model has failed earlier ({gone}) and accepts no more commands until Controller::reset"
        )
    );
    drop(qp);
    assert_eq!(c.close().unwrap_err().to_string(), gone);
}

#[test]
fn controller_fatal_status() {
    let fatal = "controller model reports Controller Fatal Status (CSTS.CFS); it must be reset (after an admin command the driver has reset it already; otherwise Controller::reset does)";
    let m = ModelController::new(ModelConfig::default());
    m.set_fatal();
    let e = Controller::with_device(m.clone(), opts()).unwrap_err();
    assert!(matches!(e, Error::ControllerFatal { .. }), "{e:?}");
    assert_eq!(e.to_string(), fatal);
    // Fatal after bring-up: reported, and a reset recovers.
    let (m, c) = setup(ModelConfig::default());
    m.set_fatal();
    let e = c.status().unwrap_err();
    assert!(matches!(e, Error::ControllerFatal { .. }), "{e:?}");
    assert_eq!(e.to_string(), fatal);
    c.reset().unwrap();
    c.status().unwrap();
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn a_reset_whose_enable_times_out_leaves_the_controller_disabled() {
    // The new admin queue's memory is freed when the enable fails: the
    // controller must not be left enabled with ASQ/ACQ pointing at it.
    let m = ModelController::new(ModelConfig::default());
    let c = Controller::with_device(
        m.clone(),
        ControllerOptions {
            ready_timeout: Some(Duration::from_millis(100)),
            ..opts()
        },
    )
    .unwrap();
    m.inject(Fault::NeverReady);
    let e = c.reset().unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert_eq!(m.cc() & 1, 0, "CC.EN cleared again after the failed enable");
    assert!(c.failure().is_some());
    let _ = c.close();
}

#[test]
fn controller_that_never_becomes_ready() {
    let m = ModelController::new(ModelConfig::default());
    m.inject(Fault::NeverReady);
    let e = Controller::with_device(
        m.clone(),
        ControllerOptions {
            ready_timeout: Some(Duration::from_millis(100)),
            ..opts()
        },
    )
    .unwrap_err();
    let Error::Timeout { ref what, after } = e else {
        panic!("expected Timeout, got {e:?}");
    };
    assert_eq!(
        what,
        "CSTS.RDY = 1 after CC.EN = 1 on model (bring-up step Enable)"
    );
    assert!(after >= Duration::from_millis(100));
    assert_eq!(
        e.to_string(),
        format!(
            "timed out after {} ms waiting for CSTS.RDY = 1 after CC.EN = 1 on model (bring-up step Enable)",
            after.as_millis()
        )
    );
    assert_eq!(m.cc() & 1, 0, "left disabled");
    assert_clean(&m);
}

#[test]
fn blocking_call_that_times_out() {
    let (m, c, mut qp) = pair();
    m.inject(Fault::DelayCompletion {
        on: Match::Queue(qp.qid()),
        doorbells: None,
    });
    let buf = c.alloc_dma(4096).unwrap();
    let f = qp
        .read_blocking(&ns1(&c), 0, 1, buf, Duration::from_millis(50))
        .unwrap_err();
    let Error::Timeout { ref what, after } = f.error else {
        panic!("expected Timeout, got {:?}", f.error);
    };
    assert_eq!(what, "Read on queue 1");
    assert_eq!(
        f.error.to_string(),
        format!(
            "timed out after {} ms waiting for Read on queue 1",
            after.as_millis()
        )
    );
    assert!(f.buffer.is_none(), "kept until the completion arrives");
    m.release_delayed();
    let mut back = None;
    qp.process_completions(8, |_, c| back = c.buffer).unwrap();
    assert!(back.is_some());
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn controller_without_64_byte_sqes() {
    // A controller whose Identify says SQES/CQES cannot be 64/16 bytes.
    let m = ModelController::new(ModelConfig::default());
    let c = open(&m, opts());
    let mut page = c.identify_raw(0x01, 0).unwrap();
    c.close().unwrap();
    page[512] = 0x77; // SQES: at least 128-byte entries
    m.set_identify_data(0x01, 0, Some(page));
    let e = Controller::with_device(m.clone(), opts()).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "controller model is not supported: SQES 0x77 / CQES 0x44 do not allow 64-byte SQEs and 16-byte CQEs"
    );
    assert_eq!(m.cc() & 1, 0, "left disabled");
    assert_clean(&m);
}

#[test]
fn submit_right_after_a_reset() {
    // After Controller::reset the queue pair's queues no longer exist on the
    // controller. A command submitted after the reset must run on re-created
    // queues: no doorbell for a queue that does not exist, no
    // ControllerReset for a command the reset never saw.
    let (m, c, mut qp) = pair();
    let ns = ns1(&c);
    c.reset().unwrap();
    let buf = c.alloc_dma(4096).unwrap();
    let r = qp.read_blocking(&ns, 0, 1, buf, T);
    assert_eq!(m.take_violations(), Vec::<String>::new());
    r.unwrap();
    // The same after a device fault and the reset that clears it.
    assert!(m.post_raw_completion(qp.qid(), [0, 0, 1 << 16, 0x00ff]));
    assert!(qp.process_completions(8, |_, _| {}).is_err());
    c.reset().unwrap();
    let buf = c.alloc_dma(4096).unwrap();
    qp.read_blocking(&ns, 0, 1, buf, T).unwrap();
    drop(qp);
    drop(c);
    let _ = m.take_violations();
    assert_eq!(m.dma_faults(), 0);
}

#[test]
fn commands_queued_before_a_reset_are_not_rung_after_it() {
    // queue() writes an SQE, a reset deletes the queue, ring() announces the
    // command: nothing may reach the deleted queue's doorbell; the command
    // completes once, with ControllerReset and its buffer.
    let (m, c, mut qp) = pair();
    let ns = ns1(&c);
    let buf = c.alloc_dma(4096).unwrap();
    qp.queue(read(&ns, 0, 1), Some(buf), 5).unwrap();
    c.reset().unwrap();
    qp.ring();
    assert_eq!(m.take_violations(), Vec::<String>::new());
    let mut got = Vec::new();
    qp.process_completions(8, |_, c| got.push(c)).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].tag, 5);
    assert!(matches!(
        got[0].result,
        Err(upnvme::IoError::ControllerReset)
    ));
    assert!(got[0].buffer.is_some());
    drop(qp);
    drop(c);
    assert_clean(&m);
}

/// A command that moves no data (Flush) may carry a slice nobody can
/// describe: its buffer rides along and comes back, and the offset is never
/// added up into an overflow (a panic in a debug build before).
#[test]
fn a_flush_with_an_undescribable_slice_completes_and_returns_its_buffer() {
    let (m, c) = setup(config_one_ns(4096, BLOCKS));
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ns = ns1(&c);
    qp.submit_io(
        IoCommand::Flush { ns: &ns },
        upnvme::IoData::slice(c.alloc_dma(4096).unwrap(), usize::MAX, 1),
        7,
    )
    .unwrap();
    let mut done = None;
    let start = std::time::Instant::now();
    while done.is_none() {
        assert!(start.elapsed() < T, "the Flush did not complete");
        qp.process_completions(1, |_, cpl| done = Some(cpl))
            .unwrap();
    }
    let done = done.unwrap();
    assert_eq!(done.tag, 7);
    assert!(done.result.is_ok(), "{:?}", done.result);
    assert!(done.buffer.is_some());
    drop(qp);
    assert_clean(&m);
}

/// Rows 71–76: the data path's refusals (slices, vectors, SGLs, optional
/// commands, flags, raw commands), each with its memory handed back and
/// the exact text a user sees.
#[test]
fn data_path_refusals_say_what_is_wrong() {
    let (m, c) = setup(ModelConfig {
        oncs: 0,
        ..config_one_ns(4096, BLOCKS)
    });
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let ns = ns1(&c);
    let fetched = m.commands_fetched();
    let text = |qp: &Pair, r: Reject| qp.describe(r).to_string();
    // 71: a slice outside its buffer.
    let r = qp
        .submit_io(
            read(&ns, 0, 1),
            upnvme::IoData::slice(c.alloc_dma(4096).unwrap(), 4000, 4096),
            1,
        )
        .unwrap_err();
    assert!(r.buffer.is_some());
    assert_eq!(
        text(&qp, r.reason),
        "invalid argument: the slice of 4096 bytes at offset 4000 does not lie inside its buffer \
         of 4096 bytes (a slice needs 1 or more bytes inside the buffer)"
    );
    // 72: a vector PRPs cannot describe, on a controller without SGLs.
    let mut v = upnvme::IoVec::new();
    v.push(c.alloc_dma(4096).unwrap(), 0, 1000).unwrap();
    v.push(c.alloc_dma(4096).unwrap(), 0, 3096).unwrap();
    let r = qp
        .submit_io(read(&ns, 0, 1), upnvme::IoData::vectored(v), 1)
        .unwrap_err();
    assert_eq!(r.segments.as_ref().map(upnvme::IoVec::len), Some(2));
    assert_eq!(
        text(&qp, r.reason),
        "command refused: the memory cannot be described to this controller: PRPs need a \
         dword-aligned start and page-aligned inner boundaries between segments, and SGLs are \
         not supported (Identify Controller SGLS), disabled (SglMode::Never) or require \
         dword-aligned segment addresses and lengths"
    );
    // 73: more segments than a command's list holds (text only: the model
    // above has no SGLs, the variant is reached in vectored.rs).
    assert_eq!(
        text(&qp, Reject::TooManySegments { segments: 288 }),
        "invalid argument: the vector's 288 segments need more list descriptors than a command \
         holds: merge segments or split the transfer"
    );
    // 74: an optional command the controller does not advertise.
    let r = qp
        .submit_io(
            IoCommand::Verify {
                ns: &ns,
                slba: 0,
                blocks: 1,
            },
            upnvme::IoData::none(),
            1,
        )
        .unwrap_err();
    assert_eq!(
        text(&qp, r.reason),
        "command refused: the controller does not support Verify (Identify Controller ONCS); \
         nothing was sent"
    );
    // 75: FUA on a command without CDW12 flags.
    let r = qp
        .submit_io(
            IoCommand::Flush { ns: &ns },
            upnvme::IoData::none().flags(upnvme::IoFlags::FUA),
            1,
        )
        .unwrap_err();
    assert_eq!(
        text(&qp, r.reason),
        "invalid argument: FUA and Limited Retry apply to Read, Write, Compare, Write Zeroes, \
         Verify and Copy only"
    );
    // 76: a raw command with a metadata pointer.
    let mut sqe = upnvme::Sqe::read(1, 0, 1);
    sqe.dw[4] = 0x1000;
    let r = qp
        .submit_io(
            IoCommand::Raw {
                ns: &ns,
                sqe: &sqe,
                data_len: 4096,
            },
            upnvme::IoData::buffer(c.alloc_dma(4096).unwrap()),
            1,
        )
        .unwrap_err();
    assert!(r.buffer.is_some());
    assert_eq!(
        text(&qp, r.reason),
        "invalid argument: the raw command cannot be sent: it has a metadata pointer (MPTR): \
         pass the metadata with the command instead"
    );
    assert_eq!(m.commands_fetched(), fetched, "nothing reached the device");
    assert_clean(&m);
}

#[test]
fn an_active_namespace_the_driver_cannot_use_says_why_and_the_others_work() {
    // Namespace 2's Identify names LBA format 5 of a namespace with one
    // format (FLBAS beyond NLBAF): bring-up goes on with namespace 1, and
    // asking for namespace 2 says what is wrong with it instead of "not
    // active".
    let m = ModelController::new(ModelConfig {
        namespaces: vec![
            NamespaceConfig {
                nsid: 1,
                ..NamespaceConfig::default()
            },
            NamespaceConfig {
                nsid: 2,
                ..NamespaceConfig::default()
            },
        ],
        ..ModelConfig::default()
    });
    let c = open(&m, opts());
    let (_, mut id) = c
        .admin_passthrough(upnvme::Sqe::identify(0, 2, 0), 4096, None)
        .unwrap();
    drop(c);
    id[25] = 0; // NLBAF: one format
    id[26] = 5; // FLBAS: format 5
    m.set_identify_data(0, 2, Some(id));
    let c = open(&m, opts());
    assert_eq!(c.namespaces().len(), 1);
    assert!(c.namespace(1).is_ok());
    let e = c.namespace(2).unwrap_err();
    assert!(
        matches!(e, Error::UnusableNamespace { nsid: 2, .. }),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "namespace 2 on model is active but upnvme cannot use it: FLBAS names LBA format 5, beyond \
         the 1 it has (NLBAF 0); format it with one of its LBA formats (Controller::format_nvm, \
         `upnvme format`)"
    );
    // Formatting it is the way out: its Identify data is read again for
    // the checks (an LBA format beyond NLBAF is refused before sending), and
    // after the format the namespace is usable.
    let mut c = c;
    let fetched = m.commands_fetched();
    let e = c.format_nvm(2, &upnvme::FormatNvm::lbaf(3)).unwrap_err();
    assert!(e.to_string().contains("LBA format 3 does not exist"), "{e}");
    assert_eq!(m.commands_fetched(), fetched + 1, "only its Identify");
    assert_eq!(m.recent_commands().last().unwrap().1[0], 0x06, "Identify");
    let ns2 = c.format_nvm(2, &upnvme::FormatNvm::lbaf(0)).unwrap();
    assert_eq!(ns2.lba_size(), 512);
    assert_eq!(c.namespace(2).unwrap().id(), 2);
    assert_eq!(c.namespaces().len(), 2);
    drop(c);
    assert_clean(&m);
}

/// Identify Namespace fields a controller may get wrong, each judged on its
/// own (a review): FLBAS bits 6:5 with 16 formats or fewer are ignored, as
/// the specification says (before, a namespace of 8 formats with bit 5 set
/// was "format 20, beyond the 8 it has"); LBADS below 9 or above 31 (up to
/// 255, which would overflow any shift), NSZE blocks beyond 2^64 bytes
/// (before: accepted, `size_bytes` saturated at u64::MAX) and a reserved
/// ELBAF.PIF make the namespace unusable with why and what to do; a
/// reserved PI type (DPS bits 2:0 above 3) has no PI format.
#[test]
fn identify_namespace_fields_are_checked_one_by_one() {
    let two = || ModelConfig {
        elbas: true,
        namespaces: vec![
            NamespaceConfig {
                nsid: 1,
                ..NamespaceConfig::default()
            },
            NamespaceConfig {
                nsid: 2,
                ..NamespaceConfig::default()
            },
        ],
        ..ModelConfig::default()
    };
    let m = ModelController::new(two());
    let c = open(&m, opts());
    let (_, id) = c
        .admin_passthrough(upnvme::Sqe::identify(0, 2, 0), 4096, None)
        .unwrap();
    drop(c);
    // The model's namespace: 8 formats (NLBAF 7), format 4 (4 KiB).
    assert_eq!((id[25], id[26]), (7, 4));
    let unusable = |page: Vec<u8>, cns: u8| {
        m.set_identify_data(cns, 2, Some(page));
        let c = open(&m, opts());
        assert!(c.namespace(1).is_ok(), "the other namespace works");
        let e = c.namespace(2).unwrap_err();
        assert!(
            matches!(e, Error::UnusableNamespace { nsid: 2, .. }),
            "{e:?}"
        );
        m.set_identify_data(cns, 2, None);
        e.to_string()
    };

    // FLBAS bits 6:5 set, 8 formats: format 4 all the same.
    let mut page = id.clone();
    page[26] = 0x60 | 4;
    m.set_identify_data(0, 2, Some(page));
    let c = open(&m, opts());
    let ns = c.namespace(2).unwrap();
    assert_eq!((ns.lba_size(), ns.lba_count()), (4096, 16384));
    drop(c);
    m.set_identify_data(0, 2, None);

    // LBADS outside 9..=31, up to 255.
    for lbads in [0u8, 8, 32, 63, 64, 255] {
        let mut page = id.clone();
        page[128 + 4 * 4 + 2] = lbads;
        assert_eq!(
            unusable(page, 0),
            format!(
                "namespace 2 on model is active but upnvme cannot use it: its LBA format 4 has \
                 LBADS {lbads}, outside 9..=31 (512 B to 2 GiB blocks); format it with another \
                 LBA format first (Controller::format_nvm, `upnvme format`)"
            )
        );
    }

    // NSZE blocks beyond 2^64 bytes.
    let mut page = id.clone();
    page[0..8].copy_from_slice(&(u64::MAX / 4096 + 1).to_le_bytes());
    assert_eq!(
        unusable(page, 0),
        "namespace 2 on model is active but upnvme cannot use it: its Identify Namespace reports \
         NSZE 4503599627370496 blocks of 4096 bytes, more than 2^64 bytes: the controller's data \
         is not plausible; Controller::refresh_namespaces reads it again"
    );
    // The largest NSZE that fits is a namespace.
    let mut page = id.clone();
    page[0..8].copy_from_slice(&(u64::MAX / 4096).to_le_bytes());
    m.set_identify_data(0, 2, Some(page));
    let c = open(&m, opts());
    assert_eq!(c.namespace(2).unwrap().size_bytes(), u64::MAX / 4096 * 4096);
    drop(c);
    m.set_identify_data(0, 2, None);

    // A reserved ELBAF.PIF (11b) for the current format (ELBAF4, CNS 05h
    // bytes 31:28).
    let mut page = vec![0u8; 4096];
    page[28..32].copy_from_slice(&(3u32 << 7).to_le_bytes());
    assert_eq!(
        unusable(page, 0x05),
        "namespace 2 on model is active but upnvme cannot use it: the protection information \
         format of its LBA format 4 (ELBAF.PIF 3) is reserved; format it with another LBA \
         format (Controller::format_nvm, `upnvme format`)"
    );

    // DPS type 5 (reserved) with 8 metadata bytes: usable for I/O without
    // protection fields, but no PI format to build tuples by.
    let mut page = id.clone();
    page[26] = 5; // format 5: 4 KiB + 8 bytes
    page[29] = 5;
    m.set_identify_data(0, 2, Some(page));
    let c = open(&m, opts());
    let ns = c.namespace(2).unwrap();
    assert_eq!(ns.metadata_layout().map(|l| l.pi_type), Some(5));
    assert_eq!(ns.pi_format(), None);
    drop(c);
    m.set_identify_data(0, 2, None);
    assert_clean(&m);
}

/// A namespace whose Identify the controller refuses with a status, and a
/// PI namespace whose guard size cannot be known (CTRATT.ELBAS set but
/// Identify CNS 05h refused), are unusable with the reason; the other
/// namespaces work.
#[test]
fn an_identify_refused_for_one_namespace_leaves_the_others_usable() {
    let ns = |nsid, ms, pi_type| NamespaceConfig {
        nsid,
        ms,
        extended: true,
        pi_type,
        ..NamespaceConfig::default()
    };
    let m = ModelController::new(ModelConfig {
        elbas: true,
        namespaces: vec![ns(1, 8, 1), ns(2, 0, 0), ns(3, 0, 0)],
        ..ModelConfig::default()
    });
    m.inject(Fault::Status {
        on: Match::Identify { cns: 0x05, nsid: 1 },
        status: upnvme_tests::Status::INVALID_FIELD.with_dnr(),
    });
    m.inject(Fault::Status {
        on: Match::Identify { cns: 0x00, nsid: 3 },
        status: upnvme_tests::Status::INVALID_FIELD.with_dnr(),
    });
    let c = open(&m, opts());
    assert_eq!(c.namespaces().len(), 1);
    assert!(c.namespace(2).is_ok());
    let e = c.namespace(1).unwrap_err();
    assert!(
        matches!(e, Error::UnusableNamespace { nsid: 1, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("refused Identify CNS 05h"), "{e}");
    let e = c.namespace(3).unwrap_err();
    assert!(
        e.to_string().starts_with(
            "namespace 3 on model is active but upnvme cannot use it: Identify Namespace failed"
        ),
        "{e}"
    );
    drop(c);
    // Without the faults all three are usable.
    let c = open(&m, opts());
    assert_eq!(c.namespaces().len(), 3);
    drop(c);
    assert_clean(&m);
}

/// A namespace the Active Namespace ID list names while its Identify
/// Namespace reports NSZE 0 (detached meanwhile, or a controller that
/// contradicts itself) is explained as that: not "active but … no longer
/// active" from `namespace`, and not "not active (active: [])" from
/// `format_nvm`, as a review found.
#[test]
fn a_listed_namespace_whose_identify_reports_nsze_0_is_explained_truthfully() {
    let m = ModelController::new(ModelConfig {
        namespaces: vec![
            NamespaceConfig {
                nsid: 1,
                ..NamespaceConfig::default()
            },
            NamespaceConfig {
                nsid: 2,
                ..NamespaceConfig::default()
            },
        ],
        ..ModelConfig::default()
    });
    m.set_identify_data(0, 2, Some(vec![0; 4096]));
    let mut c = Controller::with_device(m.clone(), opts()).unwrap();
    let e = c.namespace(2).unwrap_err();
    assert_eq!(
        e.to_string(),
        "namespace 2 on model is active but upnvme cannot use it: its Identify Namespace reports \
         NSZE 0 (detached or deleted after the Active Namespace ID list was read); \
         Controller::refresh_namespaces reads the list again"
    );
    let e = c.format_nvm(2, &upnvme::FormatNvm::lbaf(0)).unwrap_err();
    assert!(
        matches!(e, Error::UnusableNamespace { nsid: 2, .. }),
        "{e:?}"
    );
    assert!(
        e.to_string().contains(
            "the Active Namespace ID list names it, but its Identify Namespace reports NSZE 0"
        ),
        "{e}"
    );
    // A namespace that is not in the list is "not active", with the list.
    let e = c.format_nvm(3, &upnvme::FormatNvm::lbaf(0)).unwrap_err();
    assert!(
        matches!(&e, Error::NoSuchNamespace { nsid: 3, active, .. } if active == &[1, 2]),
        "{e:?}"
    );
}
