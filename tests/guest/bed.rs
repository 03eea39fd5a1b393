//! Tests that prove the test bed itself: the guest `cargo xtask vm` booted matches the
//! options it was given (exported as `UPNVME_VM_*`), the controllers are bound to
//! vfio-pci behind IOMMU groups, and hugepages are reserved.
//!
//! Namespaces of a vfio-pci controller are invisible to the kernel, so sysfs cannot
//! count them; these tests check the namespace count, block size and size through the
//! `--kernel-nvme` controller when there is one, and leave the vfio controllers'
//! namespaces to the driver's identify tests.

use std::fs;
use std::path::{Path, PathBuf};

/// PCI class of an NVMe controller, as sysfs prints it.
const NVME_CLASS: &str = "0x010802";

/// The guest as `cargo xtask vm` describes it.
#[derive(Debug)]
struct Vm {
    controllers: usize,
    namespaces: usize,
    lba_size: u64,
    disk_size: u64,
    hugepages: u64,
    serial_prefix: String,
    devices: Vec<String>,
    kernel_nvme: Option<String>,
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the guest tests inside the test bed (cargo xtask test)")
    })
}

fn num(name: &str) -> u64 {
    let v = var(name);
    v.parse()
        .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
}

fn vm() -> Vm {
    assert_eq!(var("UPNVME_VM"), "1", "not inside the test bed");
    let kernel_nvme = var("UPNVME_VM_KERNEL_NVME");
    Vm {
        controllers: num("UPNVME_VM_CONTROLLERS") as usize,
        namespaces: num("UPNVME_VM_NAMESPACES") as usize,
        lba_size: num("UPNVME_VM_LBA_SIZE"),
        disk_size: num("UPNVME_VM_DISK_SIZE"),
        hugepages: num("UPNVME_VM_HUGEPAGES"),
        serial_prefix: var("UPNVME_VM_SERIAL_PREFIX"),
        devices: var("UPNVME_VM_DEVICES")
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        kernel_nvme: (!kernel_nvme.is_empty()).then_some(kernel_nvme),
    }
}

fn pci_device(addr: &str) -> PathBuf {
    Path::new("/sys/bus/pci/devices").join(addr)
}

fn read_trimmed(p: &Path) -> String {
    fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
        .trim()
        .to_string()
}

/// The last component of a sysfs symlink (driver name, IOMMU group number).
fn link_name(p: &Path) -> String {
    let target = fs::read_link(p).unwrap_or_else(|e| panic!("readlink {}: {e}", p.display()));
    target
        .file_name()
        .unwrap_or_else(|| {
            panic!(
                "{} -> {} has no last component",
                p.display(),
                target.display()
            )
        })
        .to_string_lossy()
        .into_owned()
}

/// PCI addresses of all NVMe-class devices, sorted.
fn nvme_class_devices() -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir("/sys/bus/pci/devices")
        .expect("reading /sys/bus/pci/devices")
        .map(|e| e.expect("directory entry"))
        .filter(|e| read_trimmed(&e.path().join("class")) == NVME_CLASS)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A numeric field of /proc/meminfo.
fn meminfo(field: &str) -> u64 {
    let text = read_trimmed(Path::new("/proc/meminfo"));
    let line = text
        .lines()
        .find(|l| l.split(':').next() == Some(field))
        .unwrap_or_else(|| panic!("{field} missing from /proc/meminfo"));
    line.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("cannot parse {line:?}"))
}

#[test]
fn environment_describes_the_configured_controllers() {
    let vm = vm();
    assert_eq!(
        vm.devices.len(),
        vm.controllers,
        "UPNVME_VM_DEVICES vs UPNVME_VM_CONTROLLERS"
    );
    assert!(vm.namespaces >= 1);
    assert!(
        matches!(vm.lba_size, 512 | 4096),
        "lba size {}",
        vm.lba_size
    );
    assert_eq!(vm.disk_size % vm.lba_size, 0);
    assert!(!vm.serial_prefix.is_empty());
    for name in ["UPNVME_VM_MDTS", "UPNVME_VM_MQES", "UPNVME_VM_MAX_IOQPAIRS"] {
        assert!(num(name) > 0, "{name} must be positive");
    }
}

#[test]
fn controllers_are_bound_to_vfio_pci() {
    let vm = vm();
    for addr in &vm.devices {
        let dev = pci_device(addr);
        assert!(dev.exists(), "controller {addr} is not on the PCI bus");
        assert_eq!(
            read_trimmed(&dev.join("class")),
            NVME_CLASS,
            "{addr} is not an NVMe controller"
        );
        assert_eq!(
            link_name(&dev.join("driver")),
            "vfio-pci",
            "{addr} is not bound to vfio-pci"
        );
        assert_eq!(read_trimmed(&dev.join("driver_override")), "vfio-pci");
    }
}

#[test]
fn each_controller_has_its_own_vfio_group_node() {
    let vm = vm();
    assert!(
        Path::new("/dev/vfio/vfio").exists(),
        "/dev/vfio/vfio (the container) is missing"
    );
    let mut groups = Vec::new();
    for addr in &vm.devices {
        let group = link_name(&pci_device(addr).join("iommu_group"));
        let node = Path::new("/dev/vfio").join(&group);
        assert!(node.exists(), "{} for {addr} is missing", node.display());
        // Opening the group proves it exists in the VFIO driver and is free (it is
        // exclusive: this fails with EBUSY while another process holds it).
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&node)
            .unwrap_or_else(|e| panic!("opening {} for {addr}: {e}", node.display()));
        groups.push(group);
    }
    groups.sort();
    groups.dedup();
    assert_eq!(
        groups.len(),
        vm.devices.len(),
        "controllers share IOMMU groups: {groups:?}"
    );
}

#[test]
fn hugepages_are_reserved() {
    let vm = vm();
    let reserved: u64 = read_trimmed(Path::new("/proc/sys/vm/nr_hugepages"))
        .parse()
        .expect("nr_hugepages");
    assert_eq!(reserved, vm.hugepages, "reserved hugepages");
    assert_eq!(meminfo("HugePages_Total"), vm.hugepages);
    assert!(meminfo("HugePages_Free") > 0, "no free hugepages");
    assert_eq!(meminfo("Hugepagesize"), 2048, "hugepage size in KiB");
    let mounts = read_trimmed(Path::new("/proc/mounts"));
    assert!(
        mounts
            .lines()
            .any(|l| l.split_whitespace().nth(2) == Some("hugetlbfs")),
        "no hugetlbfs mounted:\n{mounts}"
    );
}

#[test]
fn nvme_controller_count_matches_the_options() {
    let vm = vm();
    let mut expected: Vec<String> = vm.devices.clone();
    expected.extend(vm.kernel_nvme.clone());
    expected.sort();
    let found = nvme_class_devices();
    assert_eq!(
        found.len(),
        vm.controllers + usize::from(vm.kernel_nvme.is_some()),
        "number of NVMe controllers on the PCI bus: {found:?}"
    );
    assert_eq!(found, expected, "NVMe controllers on the PCI bus");
}

#[test]
fn kernel_nvme_controller_matches_the_options() {
    let vm = vm();
    let Some(addr) = vm.kernel_nvme else {
        // Without --kernel-nvme no controller may be left to the kernel.
        for d in nvme_class_devices() {
            assert_eq!(link_name(&pci_device(&d).join("driver")), "vfio-pci", "{d}");
        }
        return;
    };
    let dev = pci_device(&addr);
    assert_eq!(
        link_name(&dev.join("driver")),
        "nvme",
        "{addr} is not driven by the kernel"
    );
    let ctrls: Vec<PathBuf> = fs::read_dir(dev.join("nvme"))
        .expect("the kernel controller has no nvme/ directory")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(ctrls.len(), 1, "{ctrls:?}");
    assert_eq!(
        read_trimmed(&ctrls[0].join("serial")),
        format!("{}K", vm.serial_prefix)
    );
    let ctrl = ctrls[0].file_name().unwrap().to_string_lossy().into_owned();
    // Namespace block devices: nvme<ctrl>n<nsid> (ns heads under multipath share the number).
    let mut namespaces: Vec<String> = fs::read_dir("/sys/block")
        .expect("/sys/block")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.strip_prefix(&ctrl)
                .and_then(|r| r.strip_prefix('n'))
                .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    namespaces.sort();
    assert_eq!(
        namespaces.len(),
        vm.namespaces,
        "namespaces of {ctrl}: {namespaces:?}"
    );
    for ns in &namespaces {
        let q = Path::new("/sys/block").join(ns);
        let lbs: u64 = read_trimmed(&q.join("queue/logical_block_size"))
            .parse()
            .unwrap();
        assert_eq!(lbs, vm.lba_size, "{ns} logical block size");
        let sectors: u64 = read_trimmed(&q.join("size")).parse().unwrap();
        assert_eq!(sectors * 512, vm.disk_size, "{ns} size");
        assert!(Path::new("/dev").join(ns).exists(), "/dev/{ns} is missing");
    }
    let poll_queues = read_trimmed(Path::new("/sys/module/nvme/parameters/poll_queues"));
    assert!(
        poll_queues.parse::<u32>().unwrap() >= 1,
        "nvme poll_queues={poll_queues}"
    );
}
