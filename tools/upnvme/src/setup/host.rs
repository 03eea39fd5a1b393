//! What `upnvme setup` reads about the machine: the IOMMU, the NVMe
//! controllers with their drivers, IOMMU groups and block devices (and who
//! uses those), and the hugepage pools.
//!
//! Everything is read below a sysfs root and a procfs root held by [`Host`],
//! so host tests build a fake tree in a temporary directory.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use upnvme::dma::pci::{NVME_CLASS, PciAddress, PciFunction, Sysfs};

/// The roots of sysfs and procfs (normally `/sys` and `/proc`).
#[derive(Clone, Debug)]
pub struct Host {
    sys: PathBuf,
    proc_root: PathBuf,
    /// Where device nodes are (`/dev`; a fake tree's in tests).
    dev: PathBuf,
    /// Whether the kernel holds a block device node exclusively
    /// ([`claimed_by_kernel`]; replaced in tests).
    claim_probe: fn(&Path) -> bool,
}

/// Whether the kernel refuses an exclusive open of the block device at
/// `node` (`open(O_RDONLY | O_EXCL)` fails with EBUSY): a mounted file
/// system in any mount namespace, an active swap area or a stacked device
/// claims it. The probe's own descriptor is closed at once.
pub fn claimed_by_kernel(node: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(node)
    {
        Ok(_) => false,
        Err(e) => e.raw_os_error() == Some(libc::EBUSY),
    }
}

/// The IOMMU as the kernel shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IommuState {
    /// Entries of `/sys/kernel/iommu_groups` (0 when the IOMMU is off).
    pub groups: usize,
    /// IOMMU-related words of the kernel command line (`intel_iommu=on`, …).
    pub cmdline: Vec<String>,
}

impl IommuState {
    /// Whether the IOMMU is on: it has put devices into groups.
    pub fn enabled(&self) -> bool {
        self.groups > 0
    }

    /// Whether the kernel command line turns an IOMMU driver on:
    /// `intel_iommu=` or `amd_iommu=` with `on` among its comma-separated
    /// values (`intel_iommu=on,sm_on`).
    pub fn asked(&self) -> bool {
        self.cmdline.iter().any(|w| {
            ["intel_iommu=", "amd_iommu="].iter().any(|p| {
                w.strip_prefix(p)
                    .is_some_and(|v| v.split(',').any(|o| o == "on"))
            })
        })
    }

    /// What to do when it is off (empty when it is on).
    pub fn advice(&self) -> Option<String> {
        if self.enabled() {
            return None;
        }
        Some(if self.asked() {
            format!(
                "the kernel command line asks for the IOMMU ({}) but there are no IOMMU groups: enable VT-d (Intel) or AMD-Vi/IOMMU (AMD) in the firmware setup and reboot",
                self.cmdline.join(" ")
            )
        } else {
            "the IOMMU is off: enable VT-d/AMD-Vi in the firmware setup and boot with `intel_iommu=on iommu=pt` (Intel) or `amd_iommu=on iommu=pt` (AMD) on the kernel command line".to_string()
        })
    }
}

/// A process, for "in use by" messages.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProcUser {
    /// Process ID.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`).
    pub comm: String,
}

impl std::fmt::Display for ProcUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} ({})", self.pid, self.comm)
    }
}

/// A namespace block device of a controller driven by the kernel, or one of
/// its partitions, and whatever uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockDevice {
    /// Kernel name, e.g. `nvme0n1` or `nvme0n1p2`.
    pub name: String,
    /// The namespace it belongs to (its own name for a namespace).
    pub namespace: String,
    /// `major:minor`.
    pub dev: Option<String>,
    /// Where it is mounted.
    pub mounts: Vec<String>,
    /// Whether it is an active swap area.
    pub swap: bool,
    /// Devices stacked on it (device mapper, MD RAID, bcache: `holders/`).
    pub holders: Vec<String>,
    /// Processes that have `/dev/NAME` open.
    pub open_by: Vec<ProcUser>,
    /// The kernel refuses an exclusive open of `/dev/NAME`
    /// ([`claimed_by_kernel`]).
    pub claimed: bool,
    /// Kernel users that hold it without a file descriptor, a `holders/`
    /// link or an exclusive claim: loop devices over it, nvmet exports.
    pub kernel_users: Vec<KernelUser>,
}

/// Something in the kernel that uses a block device or a controller's
/// character device and that neither a process's file descriptor, a
/// mount, a `holders/` link nor an exclusive claim shows: the device is
/// opened without an exclusive claim, by the kernel itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelUser {
    /// A loop device (`loopN`) whose backing file it is
    /// (`/sys/block/loopN/loop/backing_file`).
    Loop(String),
    /// An enabled namespace of the kernel's NVMe-oF target exporting it
    /// (`/sys/kernel/config/nvmet/subsystems/SUBSYS/namespaces/N`).
    NvmetNamespace {
        /// The subsystem's NQN.
        subsystem: String,
        /// The namespace's directory name (its NSID).
        namespace: String,
    },
    /// An enabled passthru subsystem of the kernel's NVMe-oF target on a
    /// controller's `/dev/nvmeX` (`…/subsystems/SUBSYS/passthru`).
    NvmetPassthru {
        /// The subsystem's NQN.
        subsystem: String,
    },
}

/// Where the kernel's NVMe-oF target is configured (below the sysfs root).
const NVMET_SUBSYSTEMS: &str = "kernel/config/nvmet/subsystems";

impl KernelUser {
    /// A short name for JSON: `loop0`, `nvmet:NQN/namespaces/1`,
    /// `nvmet:NQN/passthru`.
    pub fn id(&self) -> String {
        match self {
            KernelUser::Loop(l) => l.clone(),
            KernelUser::NvmetNamespace {
                subsystem,
                namespace,
            } => format!("nvmet:{subsystem}/namespaces/{namespace}"),
            KernelUser::NvmetPassthru { subsystem } => format!("nvmet:{subsystem}/passthru"),
        }
    }

    /// Why the device `node` (`nvme0n1`, `/dev/nvme0`) must not be taken
    /// from the kernel, and what to do.
    pub fn advice(&self, node: &str) -> String {
        const LOSE: &str = "the hosts connected to it would lose it";
        match self {
            KernelUser::Loop(l) => format!(
                "{node} backs the loop device /dev/{l}: detach it first (`losetup -d /dev/{l}`)"
            ),
            KernelUser::NvmetNamespace {
                subsystem,
                namespace,
            } => format!(
                "{node} is exported by the kernel's NVMe-oF target (nvmet subsystem {subsystem}, namespace {namespace}): {LOSE}; disable the export first (`echo 0 > /sys/{NVMET_SUBSYSTEMS}/{subsystem}/namespaces/{namespace}/enable`)"
            ),
            KernelUser::NvmetPassthru { subsystem } => format!(
                "{node} is exported by the kernel's NVMe-oF target (nvmet passthru subsystem {subsystem}): {LOSE}; disable the export first (`echo 0 > /sys/{NVMET_SUBSYSTEMS}/{subsystem}/passthru/enable`)"
            ),
        }
    }
}

impl BlockDevice {
    /// Why binding its controller away from the kernel would break something,
    /// each with what to do (empty when it is unused).
    pub fn uses(&self) -> Vec<String> {
        let mut out = Vec::new();
        for m in &self.mounts {
            if m == "/" {
                out.push(format!(
                    "{} is mounted at / (the root file system): this controller holds the running system; never bind it",
                    self.name
                ));
            } else {
                out.push(format!(
                    "{} is mounted at {m}: unmount it first (`umount {m}`)",
                    self.name
                ));
            }
        }
        if self.swap {
            out.push(format!(
                "{} is an active swap area: turn it off first (`swapoff /dev/{}`)",
                self.name, self.name
            ));
        }
        if !self.holders.is_empty() {
            out.push(format!(
                "{} is held by {} (LVM, dm-crypt, MD RAID or another stacked device): deactivate that first (`dmsetup remove`, `vgchange -an`, `mdadm --stop`, `cryptsetup close`)",
                self.name,
                self.holders.join(", ")
            ));
        }
        for k in &self.kernel_users {
            out.push(k.advice(&self.name));
        }
        if self.claimed
            && self.mounts.is_empty()
            && !self.swap
            && self.holders.is_empty()
            && self.open_by.is_empty()
            && self.kernel_users.is_empty()
        {
            // Claimed, and nothing this mount namespace shows says by what.
            out.push(format!(
                "/dev/{} is claimed by the kernel (an exclusive open fails with EBUSY) although no mount, swap area, stacked device or process here uses it: most likely a file system mounted in another mount namespace (a container, or a service with private mounts); unmount it there first",
                self.name
            ));
        }
        if !self.open_by.is_empty() {
            out.push(open_by_advice(&self.name, "", &self.open_by));
        }
        out
    }
}

/// "pid 1 (a), pid 2 (b)".
pub fn pids(users: &[ProcUser]) -> String {
    let who: Vec<String> = users.iter().map(|p| p.to_string()).collect();
    who.join(", ")
}

/// "that process" or "those processes", for `n` of them.
pub fn those_processes(n: usize) -> &'static str {
    if n == 1 {
        "that process"
    } else {
        "those processes"
    }
}

/// "/dev/NAME is open by pid … (comm)…: stop that process first", with
/// `why` after the processes.
fn open_by_advice(name: &str, why: &str, users: &[ProcUser]) -> String {
    format!(
        "/dev/{name} is open by {}{why}: stop {} first",
        pids(users),
        those_processes(users.len())
    )
}

/// Another PCI function of a controller's IOMMU group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMember {
    /// Its address.
    pub address: String,
    /// Its driver, if any.
    pub driver: Option<String>,
    /// Its network interfaces that are up (`net/IFNAME/operstate`, also
    /// below a virtio device).
    pub interfaces_up: Vec<String>,
    /// Its mounted block devices (a storage controller's disks and
    /// partitions, an NVMe controller's namespaces), as "sda2 mounted at /".
    pub mounted: Vec<String>,
}

impl GroupMember {
    /// What taking it from its driver would cut this machine off from, with
    /// the consequence, as "ADDRESS carries …: moving it to vfio-pci …"
    /// (empty when nothing the machine depends on runs through it).
    pub fn vital(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.interfaces_up.is_empty() {
            let n = self.interfaces_up.len();
            out.push(format!(
                "{} carries the network interface{} {} which {} up: moving it to vfio-pci cuts this machine off",
                self.address,
                if n == 1 { "" } else { "s" },
                self.interfaces_up.join(", "),
                if n == 1 { "is" } else { "are" }
            ));
        }
        if !self.mounted.is_empty() {
            out.push(format!(
                "{} carries {}: moving it to vfio-pci pulls {} from under the running system",
                self.address,
                self.mounted.join(", "),
                if self.mounted.len() == 1 {
                    "that file system"
                } else {
                    "those file systems"
                }
            ));
        }
        out
    }
}

/// One NVMe controller and everything `setup` decides on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerInfo {
    /// Address, class, IDs, driver, IOMMU group.
    pub function: PciFunction,
    /// `driver_override`, if set.
    pub driver_override: Option<String>,
    /// `sriov_numvfs`: the SR-IOV virtual functions enabled on it (0 for
    /// none, or a function without SR-IOV).
    pub sriov_numvfs: u32,
    /// The other functions of its IOMMU group.
    pub group_members: Vec<GroupMember>,
    /// Those of them that keep the group from being usable through VFIO
    /// (bound to a host driver), as "address (bound to driver)".
    pub blockers: Vec<String>,
    /// Namespace block devices and partitions (only while a kernel driver
    /// drives the controller).
    pub block_devices: Vec<BlockDevice>,
    /// Processes holding the VFIO group (`/dev/vfio/GROUP`) open.
    pub group_users: Vec<ProcUser>,
    /// The kernel driver's character devices that some process has open —
    /// the controller's `/dev/nvmeX` (admin passthrough: nvme-cli, smartd)
    /// and the namespaces' generic `/dev/ngXnY` (passthrough I/O: fio's
    /// io_uring_cmd engine, xNVMe) — each with those processes (only while
    /// a kernel driver drives the controller).
    pub char_users: Vec<(String, Vec<ProcUser>)>,
    /// The function's VFIO device cdevs (`vfio/devices/vfioX` below /dev,
    /// sysfs `vfio-dev/vfioX`: the iommufd interface) that some process has
    /// open, each with those processes.
    pub cdev_users: Vec<(String, Vec<ProcUser>)>,
    /// The function's uio nodes (`uioN` below /dev, sysfs `uio/uioN`: bound
    /// to uio_pci_generic or igb_uio, as SPDK and DPDK use them) that some
    /// process has open, each with those processes.
    pub uio_users: Vec<(String, Vec<ProcUser>)>,
    /// The kernel driver's character devices (`nvmeX`) that the kernel
    /// itself uses ([`KernelUser::NvmetPassthru`]), each with that user.
    pub char_kernel_users: Vec<(String, KernelUser)>,
}

impl ControllerInfo {
    /// Its address.
    pub fn address(&self) -> PciAddress {
        self.function.address
    }

    /// Its driver, or `None`.
    pub fn driver(&self) -> Option<&str> {
        self.function.driver.as_deref()
    }

    /// Whether every other device of its IOMMU group allows VFIO use.
    pub fn group_viable(&self) -> bool {
        self.function.iommu_group.is_some() && self.blockers.is_empty()
    }

    /// Whether it sits behind an Intel VMD endpoint: Linux numbers the PCI
    /// domains of VMD's buses from 10000h. The VMD endpoint does the DMA of
    /// every device behind it, so such a controller cannot be assigned to
    /// vfio-pci on its own.
    pub fn behind_vmd(&self) -> bool {
        self.address().domain >= 0x1_0000
    }

    /// Why vfio-pci will not take it while SR-IOV is on (`None`: SR-IOV is
    /// off, or it is on vfio-pci already): vfio-pci refuses a physical
    /// function with virtual functions enabled (EBUSY), and taking it from
    /// its driver first would only shut the controller down under them.
    pub fn sriov_blocker(&self) -> Option<String> {
        if self.sriov_numvfs == 0 || self.driver() == Some("vfio-pci") {
            return None;
        }
        let a = self.address();
        Some(format!(
            "SR-IOV is enabled with {} virtual function{}, and vfio-pci refuses a physical function with virtual functions enabled: stop what uses them and disable them first (`echo 0 > /sys/bus/pci/devices/{a}/sriov_numvfs`)",
            self.sriov_numvfs,
            if self.sriov_numvfs == 1 { "" } else { "s" }
        ))
    }

    /// Why its IOMMU group keeps it from VFIO, and what to do (`None`: the
    /// group is viable or it has none). A blocker that carries a network
    /// interface that is up or a mounted file system is named with what
    /// moving it would cut off, and not offered for unbinding.
    pub fn group_advice(&self) -> Option<String> {
        if self.blockers.is_empty() {
            return None;
        }
        let g = self.function.iommu_group.unwrap_or_default();
        let (vital, plain): (Vec<&String>, Vec<&String>) = self
            .blockers
            .iter()
            .partition(|b| !self.blocker_vital(b).is_empty());
        if vital.is_empty() {
            return Some(format!(
                "IOMMU group {g} is not viable: {} must be bound to vfio-pci or unbound too",
                self.blockers.join(", ")
            ));
        }
        let why = self.vital_blockers();
        let also = if plain.is_empty() {
            String::new()
        } else {
            let p: Vec<&str> = plain.iter().map(|b| b.as_str()).collect();
            format!(
                " (the group also holds {}, which would have to leave their drivers too)",
                p.join(", ")
            )
        };
        Some(format!(
            "IOMMU group {g} is not viable: {}; leave {} where {}: use {} through the kernel's nvme driver, or move it to a slot with an IOMMU group of its own{also}",
            why.join("; "),
            if vital.len() == 1 {
                "that device"
            } else {
                "those devices"
            },
            if vital.len() == 1 {
                "it is"
            } else {
                "they are"
            },
            self.address()
        ))
    }

    /// What the machine depends on that runs through the blockers of its
    /// IOMMU group ([`GroupMember::vital`]).
    pub fn vital_blockers(&self) -> Vec<String> {
        self.blockers
            .iter()
            .flat_map(|b| self.blocker_vital(b))
            .collect()
    }

    /// [`GroupMember::vital`] of the member a blocker ("ADDRESS (bound to
    /// DRIVER)") names.
    fn blocker_vital(&self, blocker: &str) -> Vec<String> {
        self.group_members
            .iter()
            .find(|m| blocker.split(' ').next() == Some(m.address.as_str()))
            .map(GroupMember::vital)
            .unwrap_or_default()
    }

    /// Who uses it when [`ControllerInfo::in_use`] is not empty: "the
    /// kernel", or "a userspace driver through uio_pci_generic".
    pub fn used_by(&self) -> String {
        if self.uio_users.is_empty() {
            "the kernel".to_string()
        } else {
            format!(
                "a userspace driver through {}",
                self.driver().unwrap_or("uio")
            )
        }
    }

    /// Why the controller or its namespaces are in use (empty when they are
    /// not): the kernel's block and character devices, or a uio node open
    /// by a userspace driver.
    pub fn in_use(&self) -> Vec<String> {
        let mut out: Vec<String> = self.block_devices.iter().flat_map(|b| b.uses()).collect();
        for (name, k) in &self.char_kernel_users {
            out.push(k.advice(&format!("/dev/{name}")));
        }
        for (name, users) in &self.char_users {
            out.push(open_by_advice(
                name,
                " (passthrough through the kernel's driver)",
                users,
            ));
        }
        for (name, users) in &self.uio_users {
            out.push(open_by_advice(
                name,
                &format!(
                    " (a userspace driver such as SPDK or DPDK, through {})",
                    self.driver().unwrap_or("uio")
                ),
                users,
            ));
        }
        out
    }

    /// Every process holding it through VFIO: its group `/dev/vfio/GROUP`
    /// or its device cdev `/dev/vfio/devices/vfioX`.
    pub fn vfio_users(&self) -> Vec<ProcUser> {
        let mut out = self.group_users.clone();
        out.extend(self.cdev_users.iter().flat_map(|(_, u)| u.iter().cloned()));
        out.sort();
        out.dedup();
        out
    }

    /// Whether `upnvme` can open it now.
    pub fn ready(&self) -> bool {
        self.driver() == Some("vfio-pci") && self.group_viable()
    }
}

/// One hugepage pool (`/sys/kernel/mm/hugepages/hugepages-<size>kB`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugePool {
    /// Page size in KiB.
    pub size_kib: u64,
    /// `nr_hugepages`: pages reserved.
    pub reserved: u64,
    /// `free_hugepages`: reserved and not mapped by anyone.
    pub free: u64,
    /// `surplus_hugepages`: allocated beyond the reservation (overcommit).
    pub surplus: u64,
}

/// A hugepage size for humans: `2 MiB`, `1 GiB`, `64 KiB`.
pub fn size_name(kib: u64) -> String {
    if kib >= 1 << 20 && kib.is_multiple_of(1 << 20) {
        format!("{} GiB", kib >> 20)
    } else if kib >= 1 << 10 && kib.is_multiple_of(1 << 10) {
        format!("{} MiB", kib >> 10)
    } else {
        format!("{kib} KiB")
    }
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn read_u64(p: &Path) -> u64 {
    read_trim(p).and_then(|s| s.parse().ok()).unwrap_or(0)
}

fn link_name(p: &Path) -> Option<String> {
    fs::read_link(p)
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

fn dir_names(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Undoes the octal escapes of /proc/mounts, mountinfo and swaps (`\040` is a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `nvme<X>c<Y>n<Z>` (a multipath controller path) to its head `nvme<X>n<Z>`.
fn multipath_head(name: &str) -> Option<String> {
    let rest = name.strip_prefix("nvme")?;
    let (x, rest) = rest.split_once('c')?;
    let (y, z) = rest.split_once('n')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(x) && digits(y) && digits(z)).then(|| format!("nvme{x}n{z}"))
}

/// Whether `name` is `<prefix><X>n<Z>` with decimal X and Z.
fn is_namespace_node(name: &str, prefix: &str) -> bool {
    let Some(rest) = name.strip_prefix(prefix) else {
        return false;
    };
    let Some((x, z)) = rest.split_once('n') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(x) && digits(z)
}

/// Whether `name` is `<prefix><N>` with decimal N (`nvme0`, `uio1`, `vfio2`).
fn is_numbered(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

/// The entries of the directories named `class` (`net`, `block`) at most
/// `depth` levels below `dir`, as (name, path): the class devices of a PCI
/// function, which sit right below it (`net/eth0`) or below its children
/// (`virtio0/net/eth0`, `ata1/host0/target0:0:0/0:0:0:0/block/sda`).
/// Symbolic links (`driver`, `subsystem`, `iommu_group` …) are not followed.
fn class_devices(dir: &Path, class: &str, depth: u32) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // A bridge's directory holds the functions below it: theirs are not
        // its own.
        if !e.file_type().is_ok_and(|t| t.is_dir()) || name.parse::<PciAddress>().is_ok() {
            continue;
        }
        if name == class {
            out.extend(dir_names(&e.path()).into_iter().map(|n| {
                let p = e.path().join(&n);
                (n, p)
            }));
        } else if depth > 1 {
            out.extend(class_devices(&e.path(), class, depth - 1));
        }
    }
    out.sort();
    out
}

/// A disk (or namespace) `disk` at sysfs directory `dir` and its
/// partitions: (name, disk name, sysfs directory), partitions first.
fn with_partitions(disk: &str, dir: &Path) -> Vec<(String, String, PathBuf)> {
    let mut out: Vec<(String, String, PathBuf)> = dir_names(dir)
        .into_iter()
        .filter(|part| part.starts_with(disk) && dir.join(part).join("partition").exists())
        .map(|part| {
            let p = dir.join(&part);
            (part, disk.to_string(), p)
        })
        .collect();
    out.push((disk.to_string(), disk.to_string(), dir.to_path_buf()));
    out
}

/// Whether `name` is a namespace's generic character device `ng<X>n<Z>`.
fn is_generic_namespace(name: &str) -> bool {
    is_namespace_node(name, "ng")
}

/// Whether `name` is a namespace block device `nvme<X>n<Z>`.
fn is_namespace(name: &str) -> bool {
    is_namespace_node(name, "nvme")
}

/// One mounted file system: `major:minor`, source and mount point.
struct Mount {
    dev: String,
    source: String,
    point: String,
}

impl Default for Host {
    fn default() -> Self {
        Host::at("/sys", "/proc")
    }
}

impl Host {
    /// A host whose sysfs is at `sys` and procfs at `proc_root`.
    pub fn at(sys: impl Into<PathBuf>, proc_root: impl Into<PathBuf>) -> Host {
        Host {
            sys: sys.into(),
            proc_root: proc_root.into(),
            dev: PathBuf::from("/dev"),
            claim_probe: claimed_by_kernel,
        }
    }

    /// The same host with its device nodes under `dev` (tests).
    #[cfg(test)]
    pub fn with_dev(mut self, dev: impl Into<PathBuf>) -> Host {
        self.dev = dev.into();
        self
    }

    /// A path below the device node directory (`vfio/3` gives `/dev/vfio/3`).
    pub fn dev_path(&self, rel: &str) -> PathBuf {
        self.dev.join(rel)
    }

    /// The same host with `probe` instead of [`claimed_by_kernel`].
    #[cfg(test)]
    pub fn with_claim_probe(self, probe: fn(&Path) -> bool) -> Host {
        Host {
            claim_probe: probe,
            ..self
        }
    }

    /// The library's view of the same sysfs.
    pub fn sysfs(&self) -> Sysfs {
        Sysfs::at(&self.sys)
    }

    /// A path below the sysfs root (`rel` without a leading `/`).
    pub fn sys_path(&self, rel: &str) -> PathBuf {
        self.sys.join(rel)
    }

    /// `/sys/bus/pci/devices/ADDR`.
    pub fn device_dir(&self, addr: &PciAddress) -> PathBuf {
        self.sysfs().device_dir(addr)
    }

    /// Whether a PCI driver is registered (module loaded or built in).
    pub fn driver_loaded(&self, name: &str) -> bool {
        self.sys.join("bus/pci/drivers").join(name).is_dir()
    }

    /// IOMMU groups and the kernel command line's IOMMU words.
    pub fn iommu(&self) -> IommuState {
        let groups = dir_names(&self.sys.join("kernel/iommu_groups")).len();
        let cmdline = read_trim(&self.proc_root.join("cmdline"))
            .unwrap_or_default()
            .split_whitespace()
            .filter(|w| {
                w.starts_with("intel_iommu=")
                    || w.starts_with("amd_iommu=")
                    || w.starts_with("iommu=")
                    || w.starts_with("iommu.")
                    || w.starts_with("vfio")
            })
            .map(str::to_string)
            .collect();
        IommuState { groups, cmdline }
    }

    /// Hugepage pools, smallest size first.
    pub fn hugepage_pools(&self) -> Vec<HugePool> {
        let base = self.sys.join("kernel/mm/hugepages");
        let mut v: Vec<HugePool> = dir_names(&base)
            .iter()
            .filter_map(|n| {
                let kib = n
                    .strip_prefix("hugepages-")?
                    .strip_suffix("kB")?
                    .parse()
                    .ok()?;
                let d = base.join(n);
                Some(HugePool {
                    size_kib: kib,
                    reserved: read_u64(&d.join("nr_hugepages")),
                    free: read_u64(&d.join("free_hugepages")),
                    surplus: read_u64(&d.join("surplus_hugepages")),
                })
            })
            .collect();
        v.sort_by_key(|p| p.size_kib);
        v
    }

    /// The pool directory of one page size.
    pub fn hugepage_dir(&self, size_kib: u64) -> PathBuf {
        self.sys
            .join("kernel/mm/hugepages")
            .join(format!("hugepages-{size_kib}kB"))
    }

    /// `MemFree` of /proc/meminfo in KiB, if readable.
    pub fn mem_free_kib(&self) -> Option<u64> {
        self.meminfo_kib("MemFree:")
    }

    /// `MemAvailable` of /proc/meminfo in KiB (what the kernel estimates it
    /// can give to new allocations, reclaimable caches included), if readable.
    pub fn mem_available_kib(&self) -> Option<u64> {
        self.meminfo_kib("MemAvailable:")
    }

    /// One `Key: N kB` line of /proc/meminfo.
    fn meminfo_kib(&self, key: &str) -> Option<u64> {
        let text = fs::read_to_string(self.proc_root.join("meminfo")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
    }

    /// Every NVMe controller, sorted by address.
    pub fn controllers(&self) -> Result<Vec<ControllerInfo>> {
        let functions = self.sysfs().nvme_controllers()?;
        let ctx = self.usage_context(&functions);
        Ok(functions.into_iter().map(|f| self.info(f, &ctx)).collect())
    }

    /// One controller; an error that says what to do when `addr` is not an
    /// NVMe controller.
    pub fn controller(&self, addr: &PciAddress) -> Result<ControllerInfo> {
        let f = self.sysfs().function(addr)?;
        if f.class != NVME_CLASS {
            anyhow::bail!(
                "PCI device {addr} has class 0x{:06x}, not an NVMe controller (class 0x010802); upnvme setup only binds NVMe controllers (run `upnvme setup status` to see them)",
                f.class
            );
        }
        let ctx = self.usage_context(std::slice::from_ref(&f));
        Ok(self.info(f, &ctx))
    }

    /// Mounts, swaps and open files, read once for many controllers.
    fn usage_context(&self, functions: &[PciFunction]) -> UsageContext {
        let mounts = self.mounts();
        let swaps = self.swaps();
        let mut targets: Vec<PathBuf> = Vec::new();
        let mut blocks = BTreeMap::new();
        let mut nodes = BTreeMap::new();
        for f in functions {
            let b = self.block_dirs(&f.address);
            for (name, _, _) in &b {
                targets.push(PathBuf::from("/dev").join(name));
            }
            let n = DevNodes {
                chars: self.char_names(&f.address),
                cdevs: self.numbered_nodes(&f.address, "vfio-dev", "vfio", "vfio/devices/"),
                uio: self.numbered_nodes(&f.address, "uio", "uio", ""),
            };
            for name in n.chars.iter().chain(&n.cdevs).chain(&n.uio) {
                targets.push(PathBuf::from("/dev").join(name));
            }
            nodes.insert(f.address, n);
            if let Some(g) = f.iommu_group {
                targets.push(PathBuf::from(format!("/dev/vfio/{g}")));
            }
            blocks.insert(f.address, b);
        }
        let users = if targets.is_empty() {
            BTreeMap::new()
        } else {
            self.fd_users(&targets)
        };
        UsageContext {
            mounts,
            swaps,
            kernel_refs: self.kernel_refs(),
            users,
            blocks,
            nodes,
            claim_probe: self.claim_probe,
        }
    }

    /// The devices the kernel itself holds open without an exclusive claim,
    /// each with its user: the backing files of loop devices, and the
    /// devices of enabled nvmet namespaces and passthru subsystems.
    fn kernel_refs(&self) -> Vec<(KernelUser, String)> {
        let mut out = Vec::new();
        let block = self.sys.join("block");
        for l in dir_names(&block) {
            if is_numbered(&l, "loop")
                && let Some(f) = read_trim(&block.join(&l).join("loop/backing_file"))
                && !f.is_empty()
            {
                out.push((KernelUser::Loop(l), f));
            }
        }
        let enabled = |d: &Path| {
            (read_trim(&d.join("enable")).as_deref() == Some("1"))
                .then(|| read_trim(&d.join("device_path")))
                .flatten()
                .filter(|p| !p.is_empty())
        };
        let subsystems = self.sys.join(NVMET_SUBSYSTEMS);
        for s in dir_names(&subsystems) {
            let sdir = subsystems.join(&s);
            for n in dir_names(&sdir.join("namespaces")) {
                if let Some(p) = enabled(&sdir.join("namespaces").join(&n)) {
                    let k = KernelUser::NvmetNamespace {
                        subsystem: s.clone(),
                        namespace: n,
                    };
                    out.push((k, p));
                }
            }
            if let Some(p) = enabled(&sdir.join("passthru")) {
                out.push((KernelUser::NvmetPassthru { subsystem: s }, p));
            }
        }
        out
    }

    /// The device nodes (below /dev) of the entries `<prefix><N>` of the
    /// function's sysfs directory `sub`, spelled `<dev_dir><prefix><N>`:
    /// `uio/uio0` gives `uio0`, `vfio-dev/vfio0` with `vfio/devices/` gives
    /// `vfio/devices/vfio0`.
    fn numbered_nodes(
        &self,
        addr: &PciAddress,
        sub: &str,
        prefix: &str,
        dev_dir: &str,
    ) -> Vec<String> {
        dir_names(&self.device_dir(addr).join(sub))
            .into_iter()
            .filter(|n| is_numbered(n, prefix))
            .map(|n| format!("{dev_dir}{n}"))
            .collect()
    }

    /// A member of an IOMMU group, with what the machine runs through it.
    fn group_member(&self, address: String, ctx: &UsageContext) -> GroupMember {
        let dir = self.sys.join("bus/pci/devices").join(&address);
        let interfaces_up = class_devices(&dir, "net", 3)
            .into_iter()
            .filter(|(_, p)| read_trim(&p.join("operstate")).as_deref() == Some("up"))
            .map(|(n, _)| n)
            .collect();
        let disks = class_devices(&dir, "block", 7)
            .into_iter()
            .flat_map(|(disk, p)| with_partitions(&disk, &p));
        let namespaces = address
            .parse()
            .map(|a| self.block_dirs(&a))
            .unwrap_or_default();
        let mut mounted = Vec::new();
        for (name, _, p) in disks.chain(namespaces) {
            for point in ctx.mounts_of(&name, &p) {
                mounted.push(if point == "/" {
                    format!("{name} mounted at / (the root file system)")
                } else {
                    format!("{name} mounted at {point}")
                });
            }
        }
        GroupMember {
            driver: link_name(&dir.join("driver")),
            address,
            interfaces_up,
            mounted,
        }
    }

    fn info(&self, f: PciFunction, ctx: &UsageContext) -> ControllerInfo {
        let dir = self.device_dir(&f.address);
        let driver_override =
            read_trim(&dir.join("driver_override")).filter(|s| !s.is_empty() && s != "(null)");
        let sriov_numvfs = read_trim(&dir.join("sriov_numvfs"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let (group_members, blockers) = match f.iommu_group {
            Some(g) => {
                let gdir = self
                    .sys
                    .join("kernel/iommu_groups")
                    .join(g.to_string())
                    .join("devices");
                let me = f.address.to_string();
                let members = dir_names(&gdir)
                    .into_iter()
                    .filter(|n| *n != me)
                    .map(|n| self.group_member(n, ctx))
                    .collect();
                (members, self.sysfs().group_blockers(g, &f.address))
            }
            None => (Vec::new(), Vec::new()),
        };
        let block_devices = ctx
            .blocks
            .get(&f.address)
            .map(|b| {
                b.iter()
                    .map(|(name, namespace, path)| ctx.block_device(name, namespace, path))
                    .collect()
            })
            .unwrap_or_default();
        let group_users = f
            .iommu_group
            .and_then(|g| ctx.users.get(&PathBuf::from(format!("/dev/vfio/{g}"))))
            .cloned()
            .unwrap_or_default();
        let opened = |which: fn(&DevNodes) -> &Vec<String>| {
            ctx.nodes
                .get(&f.address)
                .map_or_else(Vec::new, |n| ctx.opened(which(n)))
        };
        let char_users = opened(|n| &n.chars);
        let cdev_users = opened(|n| &n.cdevs);
        let uio_users = opened(|n| &n.uio);
        let char_kernel_users = ctx
            .nodes
            .get(&f.address)
            .map(|n| {
                n.chars
                    .iter()
                    .flat_map(|name| {
                        ctx.kernel_users_of(&PathBuf::from("/dev").join(name))
                            .into_iter()
                            .map(|k| (name.clone(), k))
                    })
                    .collect()
            })
            .unwrap_or_default();
        ControllerInfo {
            function: f,
            driver_override,
            sriov_numvfs,
            group_members,
            blockers,
            block_devices,
            group_users,
            char_users,
            cdev_users,
            uio_users,
            char_kernel_users,
        }
    }

    /// Namespace block devices of a kernel-driven controller and their
    /// partitions: (name, namespace name, sysfs directory).
    fn block_dirs(&self, addr: &PciAddress) -> Vec<(String, String, PathBuf)> {
        let nvme = self.device_dir(addr).join("nvme");
        let mut out = Vec::new();
        for ctrl in dir_names(&nvme) {
            let cdir = nvme.join(&ctrl);
            for entry in dir_names(&cdir) {
                let ns_dir = if is_namespace(&entry) {
                    (entry.clone(), cdir.join(&entry))
                } else if let Some(head) = multipath_head(&entry) {
                    (head.clone(), self.sys.join("block").join(&head))
                } else {
                    continue;
                };
                let (ns, dir) = ns_dir;
                if out.iter().any(|(n, _, _)| *n == ns) {
                    continue;
                }
                out.extend(with_partitions(&ns, &dir));
            }
        }
        out.sort();
        out
    }

    /// The kernel driver's character devices of a controller: its own
    /// `nvmeX` and its namespaces' generic `ngXnY` (sysfs `nvme/nvmeX/`).
    fn char_names(&self, addr: &PciAddress) -> Vec<String> {
        let nvme = self.device_dir(addr).join("nvme");
        let mut out = Vec::new();
        for ctrl in dir_names(&nvme) {
            if is_numbered(&ctrl, "nvme") {
                for e in dir_names(&nvme.join(&ctrl)) {
                    if is_generic_namespace(&e) {
                        out.push(e);
                    } else if let Some(head) = multipath_head(&e) {
                        // A multipath head's generic device hangs off the
                        // subsystem, not the controller.
                        let ng = head.replacen("nvme", "ng", 1);
                        if self.sys.join("class/nvme-generic").join(&ng).exists() {
                            out.push(ng);
                        }
                    }
                }
                out.push(ctrl);
            }
        }
        out.sort();
        out.dedup();
        out
    }

    fn mounts(&self) -> Vec<Mount> {
        if let Ok(text) = fs::read_to_string(self.proc_root.join("self/mountinfo")) {
            return text
                .lines()
                .filter_map(|l| {
                    let (left, right) = l.split_once(" - ")?;
                    let f: Vec<&str> = left.split_whitespace().collect();
                    let source = right.split_whitespace().nth(1)?;
                    Some(Mount {
                        dev: f.get(2)?.to_string(),
                        point: unescape(f.get(4)?),
                        source: unescape(source),
                    })
                })
                .collect();
        }
        fs::read_to_string(self.proc_root.join("mounts"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                Some(Mount {
                    dev: String::new(),
                    source: unescape(f.next()?),
                    point: unescape(f.next()?),
                })
            })
            .collect()
    }

    fn swaps(&self) -> Vec<String> {
        fs::read_to_string(self.proc_root.join("swaps"))
            .unwrap_or_default()
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next().map(unescape))
            .collect()
    }

    /// The processes (other than this one) that hold the VFIO group file
    /// `group` (`/dev/vfio/<N>`) busy: those with it open, and those with
    /// the VFIO device cdev (`/dev/vfio/devices/vfioX`, the iommufd
    /// interface) of one of the group's devices open — the kernel refuses
    /// the group's open with EBUSY then too.
    pub fn group_holders(&self, group: &Path) -> Vec<ProcUser> {
        let mut targets = vec![group.to_path_buf()];
        let number = group.file_name().and_then(|n| n.to_str());
        if let Some(g) = number.filter(|n| n.parse::<u32>().is_ok()) {
            let devices = self.sys.join("kernel/iommu_groups").join(g).join("devices");
            for d in dir_names(&devices) {
                if let Ok(a) = d.parse::<PciAddress>() {
                    targets.extend(
                        self.numbered_nodes(&a, "vfio-dev", "vfio", "vfio/devices/")
                            .into_iter()
                            .map(|n| PathBuf::from("/dev").join(n)),
                    );
                }
            }
        }
        let mut out: Vec<ProcUser> = Vec::new();
        for users in self.fd_users(&targets).into_values() {
            for u in users {
                if !out.contains(&u) {
                    out.push(u);
                }
            }
        }
        out
    }

    /// For each of `targets`, the processes with an open file descriptor on it:
    /// by the path the descriptor names, or — for a descriptor on a device
    /// node under another name (a container's `--device` node, a raw-block
    /// volume) — by the device it opened (kind and number, `st_rdev`).
    /// Only descriptors naming a path below `/dev` are looked at that way
    /// (devtmpfs or a container's tmpfs: a `stat` of them cannot block, as
    /// one of a hung network file system's could).
    fn fd_users(&self, targets: &[PathBuf]) -> BTreeMap<PathBuf, Vec<ProcUser>> {
        let mut out: BTreeMap<PathBuf, Vec<ProcUser>> = BTreeMap::new();
        let me = std::process::id();
        let by_device: Vec<(DeviceId, &PathBuf)> = targets
            .iter()
            .filter_map(|t| {
                let rel = t.strip_prefix("/dev").ok()?;
                Some((device_id(&fs::metadata(self.dev.join(rel)).ok()?)?, t))
            })
            .collect();
        let same_device = |fd: &Path, named: &Path| {
            if by_device.is_empty() || !named.starts_with("/dev") {
                return None;
            }
            let id = device_id(&fs::metadata(fd).ok()?)?;
            by_device.iter().find(|(d, _)| *d == id).map(|(_, t)| *t)
        };
        for pid in dir_names(&self.proc_root) {
            let Ok(pid_n) = pid.parse::<u32>() else {
                continue;
            };
            if pid_n == me && self.proc_root == Path::new("/proc") {
                continue;
            }
            let fd_dir = self.proc_root.join(&pid).join("fd");
            let Ok(fds) = fs::read_dir(&fd_dir) else {
                continue;
            };
            for fd in fds.flatten() {
                let Ok(t) = fs::read_link(fd.path()) else {
                    continue;
                };
                if let Some(target) = targets
                    .iter()
                    .find(|x| **x == t)
                    .or_else(|| same_device(&fd.path(), &t))
                {
                    let comm = read_trim(&self.proc_root.join(&pid).join("comm"))
                        .unwrap_or_else(|| "?".into());
                    let users = out.entry(target.clone()).or_default();
                    let u = ProcUser { pid: pid_n, comm };
                    if !users.contains(&u) {
                        users.push(u);
                    }
                }
            }
        }
        out
    }
}

/// A device node's identity: block or character, and its number.
type DeviceId = (bool, u64);

/// The identity of the device node `m` describes (`None`: not a device node).
fn device_id(m: &fs::Metadata) -> Option<DeviceId> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let t = m.file_type();
    (t.is_block_device() || t.is_char_device()).then(|| (t.is_block_device(), m.rdev()))
}

/// A controller's device nodes other than block devices (names below /dev).
struct DevNodes {
    /// The kernel driver's character devices (`nvme0`, `ng0n1`).
    chars: Vec<String>,
    /// VFIO device cdevs (`vfio/devices/vfio0`).
    cdevs: Vec<String>,
    /// uio nodes (`uio0`).
    uio: Vec<String>,
}

/// What is mounted, swapped on and open on the machine.
struct UsageContext {
    mounts: Vec<Mount>,
    swaps: Vec<String>,
    /// [`Host::kernel_refs`].
    kernel_refs: Vec<(KernelUser, String)>,
    users: BTreeMap<PathBuf, Vec<ProcUser>>,
    blocks: BTreeMap<PciAddress, Vec<(String, String, PathBuf)>>,
    nodes: BTreeMap<PciAddress, DevNodes>,
    claim_probe: fn(&Path) -> bool,
}

/// Whether a mount source or swap file names the device node `node`; a
/// source such as /dev/disk/by-uuid/… is a symlink to the node.
fn names_node(s: &str, node: &Path) -> bool {
    Path::new(s) == node || (s.starts_with("/dev/") && fs::canonicalize(s).is_ok_and(|c| c == node))
}

impl UsageContext {
    /// Those of `names` (below /dev) that some process has open, each with
    /// those processes.
    fn opened(&self, names: &[String]) -> Vec<(String, Vec<ProcUser>)> {
        names
            .iter()
            .filter_map(|name| {
                let users = self.users.get(&PathBuf::from("/dev").join(name))?;
                (!users.is_empty()).then(|| (name.clone(), users.clone()))
            })
            .collect()
    }

    /// The kernel users of the device node `node` ([`Host::kernel_refs`]).
    fn kernel_users_of(&self, node: &Path) -> Vec<KernelUser> {
        self.kernel_refs
            .iter()
            .filter(|(_, p)| names_node(p, node))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Where the block device `name` (sysfs directory `dir`) is mounted, by
    /// `major:minor` and by source.
    fn mounts_of(&self, name: &str, dir: &Path) -> Vec<String> {
        let dev = read_trim(&dir.join("dev"));
        let node = PathBuf::from("/dev").join(name);
        let mut mounts: Vec<String> = self
            .mounts
            .iter()
            .filter(|m| dev.as_deref() == Some(m.dev.as_str()) || names_node(&m.source, &node))
            .map(|m| m.point.clone())
            .collect();
        mounts.sort();
        mounts.dedup();
        mounts
    }

    fn block_device(&self, name: &str, namespace: &str, dir: &Path) -> BlockDevice {
        let dev = read_trim(&dir.join("dev"));
        let node = PathBuf::from("/dev").join(name);
        BlockDevice {
            name: name.to_string(),
            namespace: namespace.to_string(),
            mounts: self.mounts_of(name, dir),
            swap: self.swaps.iter().any(|s| names_node(s, &node)),
            holders: dir_names(&dir.join("holders")),
            open_by: self.users.get(&node).cloned().unwrap_or_default(),
            claimed: (self.claim_probe)(&node),
            kernel_users: self.kernel_users_of(&node),
            dev,
        }
    }
}

/// Which of `infos` match `wanted` addresses (all when empty); an unknown or
/// non-NVMe address is an error that says what to do.
pub fn resolve_targets(host: &Host, wanted: &[String]) -> Result<Vec<ControllerInfo>> {
    if wanted.is_empty() {
        return host.controllers();
    }
    let mut out: Vec<ControllerInfo> = Vec::new();
    for w in wanted {
        let addr: PciAddress = w.parse().map_err(anyhow::Error::from)?;
        if out.iter().any(|c| c.address() == addr) {
            continue;
        }
        out.push(
            host.controller(&addr)
                .with_context(|| format!("checking {addr}"))?,
        );
    }
    Ok(out)
}

#[cfg(test)]
pub mod fake {
    //! A fake sysfs + procfs tree for host tests.

    use std::fs;
    use std::os::unix::fs::symlink;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::Host;

    /// A temporary directory holding `sys/` and `proc/`, removed on drop.
    pub struct Tree {
        /// The directory.
        pub root: PathBuf,
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    impl Tree {
        /// An empty tree.
        pub fn new() -> Tree {
            static N: AtomicU32 = AtomicU32::new(0);
            let root = std::env::temp_dir().join(format!(
                "upnvme-cli-fake-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&root);
            fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
            fs::create_dir_all(root.join("sys/kernel/iommu_groups")).unwrap();
            fs::create_dir_all(root.join("proc")).unwrap();
            Tree { root }
        }

        /// The host over this tree.
        /// The tree as a host; no block device claimed (the real probe
        /// would look at this machine's /dev).
        pub fn host(&self) -> Host {
            Host::at(self.root.join("sys"), self.root.join("proc"))
                .with_dev(self.root.join("dev"))
                .with_claim_probe(|_| false)
        }

        /// Writes `text` to `rel` (below the tree), creating directories.
        pub fn write(&self, rel: &str, text: &str) {
            let p = self.root.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }

        /// A PCI function.
        pub fn device(&self, addr: &str, class: &str, driver: Option<&str>, group: Option<u32>) {
            let sys = self.root.join("sys");
            let dir = sys.join("bus/pci/devices").join(addr);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("class"), format!("{class}\n")).unwrap();
            fs::write(dir.join("vendor"), "0x1b36\n").unwrap();
            fs::write(dir.join("device"), "0x0010\n").unwrap();
            fs::write(dir.join("driver_override"), "(null)\n").unwrap();
            if let Some(d) = driver {
                let ddir = sys.join("bus/pci/drivers").join(d);
                fs::create_dir_all(&ddir).unwrap();
                symlink(&ddir, dir.join("driver")).unwrap();
            }
            if let Some(g) = group {
                let gdir = sys.join("kernel/iommu_groups").join(g.to_string());
                fs::create_dir_all(gdir.join("devices")).unwrap();
                symlink(&gdir, dir.join("iommu_group")).unwrap();
                symlink(&dir, gdir.join("devices").join(addr)).unwrap();
            }
        }

        /// A namespace block device `nvme<ctrl>n<ns>` (with `partitions`
        /// partitions) of the kernel-driven controller at `addr`; returns the
        /// namespace's sysfs directory.
        pub fn namespace(&self, addr: &str, ctrl: u32, ns: u32, partitions: u32) -> PathBuf {
            let cdir = self
                .root
                .join("sys/bus/pci/devices")
                .join(addr)
                .join("nvme")
                .join(format!("nvme{ctrl}"));
            let name = format!("nvme{ctrl}n{ns}");
            let dir = cdir.join(&name);
            fs::create_dir_all(dir.join("holders")).unwrap();
            fs::write(dir.join("dev"), format!("259:{}\n", ns * 10)).unwrap();
            for p in 1..=partitions {
                let pdir = dir.join(format!("{name}p{p}"));
                fs::create_dir_all(pdir.join("holders")).unwrap();
                fs::write(pdir.join("partition"), format!("{p}\n")).unwrap();
                fs::write(pdir.join("dev"), format!("259:{}\n", ns * 10 + p)).unwrap();
            }
            dir
        }

        /// A process with `files` open.
        pub fn process(&self, pid: u32, comm: &str, files: &[&str]) {
            let dir = self.root.join("proc").join(pid.to_string());
            fs::create_dir_all(dir.join("fd")).unwrap();
            fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
            for (i, f) in files.iter().enumerate() {
                symlink(Path::new(f), dir.join("fd").join((i + 3).to_string())).unwrap();
            }
        }

        /// A hugepage pool.
        pub fn hugepages(&self, size_kib: u64, nr: u64, free: u64) {
            let d = format!("sys/kernel/mm/hugepages/hugepages-{size_kib}kB");
            self.write(&format!("{d}/nr_hugepages"), &format!("{nr}\n"));
            self.write(&format!("{d}/free_hugepages"), &format!("{free}\n"));
            self.write(&format!("{d}/surplus_hugepages"), "0\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::Tree;
    use super::*;

    #[test]
    fn names_of_block_devices() {
        assert!(is_namespace("nvme0n1"));
        assert!(is_namespace("nvme12n3"));
        assert!(!is_namespace("nvme0n1p1"));
        assert!(!is_namespace("nvme0c1n1"));
        assert!(!is_namespace("nvme0"));
        assert_eq!(multipath_head("nvme0c1n3").as_deref(), Some("nvme0n3"));
        assert_eq!(multipath_head("nvme0n1"), None);
        assert_eq!(unescape(r"/mnt/my\040disk"), "/mnt/my disk");
        assert_eq!(unescape(r"a\\b"), r"a\\b");
        assert_eq!(size_name(2048), "2 MiB");
        assert_eq!(size_name(1048576), "1 GiB");
        assert_eq!(size_name(64), "64 KiB");
    }

    #[test]
    fn iommu_state_and_advice() {
        let t = Tree::new();
        t.write("proc/cmdline", "BOOT_IMAGE=/vmlinuz ro quiet\n");
        let s = t.host().iommu();
        assert!(!s.enabled());
        assert!(s.advice().unwrap().contains("intel_iommu=on iommu=pt"));
        t.write(
            "proc/cmdline",
            "BOOT_IMAGE=/vmlinuz intel_iommu=on iommu=pt quiet\n",
        );
        let s = t.host().iommu();
        assert_eq!(s.cmdline, ["intel_iommu=on", "iommu=pt"]);
        assert!(s.advice().unwrap().contains("firmware"), "{:?}", s.advice());
        t.device("0000:00:04.0", "0x010802", Some("vfio-pci"), Some(3));
        let s = t.host().iommu();
        assert!(s.enabled());
        assert_eq!(s.groups, 1);
        assert_eq!(s.advice(), None);
    }

    /// Options take comma-separated values (`intel_iommu=on,sm_on`): `on`
    /// among them asks for the IOMMU, and the advice with no groups is the
    /// firmware, not the command line.
    #[test]
    fn iommu_options_with_comma_separated_values_ask_for_the_iommu() {
        let t = Tree::new();
        for (words, asked) in [
            ("intel_iommu=on", true),
            ("intel_iommu=on,sm_on iommu=pt", true),
            ("intel_iommu=sm_on,on", true),
            ("amd_iommu=on,fullflush", true),
            ("intel_iommu=sm_on", false),
            ("intel_iommu=off", false),
            ("intel_iommu=onx", false),
        ] {
            t.write(
                "proc/cmdline",
                &format!("BOOT_IMAGE=/vmlinuz {words} quiet\n"),
            );
            let s = t.host().iommu();
            let a = s.advice().unwrap();
            assert_eq!(
                a.starts_with("the kernel command line asks for the IOMMU"),
                asked,
                "{words}: {a}"
            );
        }
    }

    #[test]
    fn controllers_groups_and_viability() {
        let t = Tree::new();
        t.device("0000:00:04.0", "0x010802", Some("vfio-pci"), Some(3));
        t.device("0000:00:05.0", "0x010802", Some("nvme"), Some(4));
        t.device("0000:00:08.0", "0x010802", Some("vfio-pci"), Some(6));
        t.device("0000:00:08.1", "0x0c0330", Some("xhci_hcd"), Some(6));
        t.device("0000:00:08.2", "0x0c0330", None, Some(6));
        t.device("0000:00:09.0", "0x010802", None, None);
        t.device("0000:00:1f.0", "0x060100", Some("lpc_ich"), Some(9));
        t.write(
            "sys/bus/pci/devices/0000:00:04.0/driver_override",
            "vfio-pci\n",
        );
        let cs = t.host().controllers().unwrap();
        let addrs: Vec<String> = cs.iter().map(|c| c.address().to_string()).collect();
        assert_eq!(
            addrs,
            [
                "0000:00:04.0",
                "0000:00:05.0",
                "0000:00:08.0",
                "0000:00:09.0"
            ]
        );
        assert!(cs[0].ready());
        assert_eq!(cs[0].driver_override.as_deref(), Some("vfio-pci"));
        assert_eq!(cs[1].driver_override, None);
        assert!(!cs[1].ready() && cs[1].group_viable());
        assert!(!cs[2].group_viable());
        assert_eq!(cs[2].blockers, ["0000:00:08.1 (bound to xhci_hcd)"]);
        assert_eq!(
            cs[2].group_members,
            [
                GroupMember {
                    address: "0000:00:08.1".into(),
                    driver: Some("xhci_hcd".into()),
                    interfaces_up: vec![],
                    mounted: vec![],
                },
                GroupMember {
                    address: "0000:00:08.2".into(),
                    driver: None,
                    interfaces_up: vec![],
                    mounted: vec![],
                }
            ]
        );
        assert!(!cs[3].group_viable(), "no IOMMU group is not viable");
        let e = t
            .host()
            .controller(&"0000:00:1f.0".parse().unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("not an NVMe controller"), "{e:#}");
        let e = resolve_targets(&t.host(), &["0000:00:1e.0".into()]).unwrap_err();
        assert!(
            format!("{e:#}").contains("no PCI device at 0000:00:1e.0"),
            "{e:#}"
        );
        let e = resolve_targets(&t.host(), &["00:04".into()]).unwrap_err();
        assert!(format!("{e:#}").contains("invalid PCI address"), "{e:#}");
        let r = resolve_targets(&t.host(), &["00:04.0".into(), "0000:00:04.0".into()]).unwrap();
        assert_eq!(r.len(), 1, "duplicates are folded");
    }

    #[test]
    fn a_namespace_the_kernel_claims_for_no_visible_reason_is_in_use() {
        let t = Tree::new();
        t.device("0000:00:05.0", "0x010802", Some("nvme"), Some(4));
        t.namespace("0000:00:05.0", 0, 1, 0);
        t.namespace("0000:00:05.0", 0, 2, 0);
        let addr = "0000:00:05.0".parse().unwrap();
        // nvme0n2 is claimed (a mount in another mount namespace); nvme0n1
        // is not.
        fn probe(node: &Path) -> bool {
            node == Path::new("/dev/nvme0n2")
        }
        let c = t.host().controller(&addr).unwrap();
        assert!(c.in_use().is_empty(), "{:?}", c.in_use());
        let c = t.host().with_claim_probe(probe).controller(&addr).unwrap();
        assert_eq!(
            c.in_use(),
            [
                "/dev/nvme0n2 is claimed by the kernel (an exclusive open fails with EBUSY) although no mount, swap area, stacked device or process here uses it: most likely a file system mounted in another mount namespace (a container, or a service with private mounts); unmount it there first"
            ]
        );
        // A visible reason is reported instead, not beside it.
        t.write(
            "proc/swaps",
            "Filename\tType\tSize\tUsed\tPriority\n/dev/nvme0n2\tpartition\t1024\t0\t-2\n",
        );
        let c = t.host().with_claim_probe(probe).controller(&addr).unwrap();
        assert_eq!(
            c.in_use(),
            ["nvme0n2 is an active swap area: turn it off first (`swapoff /dev/nvme0n2`)"]
        );
    }

    #[test]
    fn namespaces_in_use_are_found_with_the_reason() {
        let t = Tree::new();
        t.device("0000:00:05.0", "0x010802", Some("nvme"), Some(4));
        t.namespace("0000:00:05.0", 0, 1, 2);
        t.namespace("0000:00:05.0", 0, 2, 0);
        let ns3 = t.namespace("0000:00:05.0", 0, 3, 0);
        let host = t.host();
        let addr = "0000:00:05.0".parse().unwrap();

        // Nothing uses them yet.
        let c = host.controller(&addr).unwrap();
        let names: Vec<&str> = c.block_devices.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(
            names,
            ["nvme0n1", "nvme0n1p1", "nvme0n1p2", "nvme0n2", "nvme0n3"]
        );
        assert_eq!(c.block_devices[1].namespace, "nvme0n1");
        assert!(c.in_use().is_empty(), "{:?}", c.in_use());

        // Mounted by major:minor (mountinfo), by name (/dev/nvme0n2), swap,
        // a holder, an open file.
        t.write(
            "proc/self/mountinfo",
            "22 1 259:12 / / rw,relatime - ext4 /dev/root rw\n\
             23 22 259:11 / /boot\\040efi rw - vfat /dev/nvme0n1p1 rw\n\
             24 22 0:45 / /data rw - btrfs /dev/nvme0n2 rw\n\
             25 22 0:5 / /dev rw - devtmpfs udev rw\n",
        );
        t.write(
            "proc/swaps",
            "Filename\tType\tSize\tUsed\tPriority\n/dev/nvme0n3\tpartition\t1024\t0\t-2\n",
        );
        fs::create_dir_all(ns3.join("holders/dm-0")).unwrap();
        t.process(4242, "qemu-system-x86", &["/dev/null", "/dev/nvme0n3"]);
        let c = host.controller(&addr).unwrap();
        let uses = c.in_use();
        assert_eq!(
            uses,
            [
                "nvme0n1p1 is mounted at /boot efi: unmount it first (`umount /boot efi`)",
                "nvme0n1p2 is mounted at / (the root file system): this controller holds the running system; never bind it",
                "nvme0n2 is mounted at /data: unmount it first (`umount /data`)",
                "nvme0n3 is an active swap area: turn it off first (`swapoff /dev/nvme0n3`)",
                "nvme0n3 is held by dm-0 (LVM, dm-crypt, MD RAID or another stacked device): deactivate that first (`dmsetup remove`, `vgchange -an`, `mdadm --stop`, `cryptsetup close`)",
                "/dev/nvme0n3 is open by pid 4242 (qemu-system-x86): stop that process first",
            ]
        );
    }

    #[test]
    fn mounts_fall_back_to_proc_mounts() {
        let t = Tree::new();
        t.device("0000:00:05.0", "0x010802", Some("nvme"), Some(4));
        t.namespace("0000:00:05.0", 1, 1, 0);
        t.write(
            "proc/mounts",
            "/dev/nvme1n1 /srv ext4 rw 0 0\nproc /proc proc rw 0 0\n",
        );
        let c = t
            .host()
            .controller(&"0000:00:05.0".parse().unwrap())
            .unwrap();
        assert_eq!(c.block_devices[0].mounts, ["/srv"]);
    }

    #[test]
    fn multipath_heads_are_checked() {
        let t = Tree::new();
        t.device("0000:00:05.0", "0x010802", Some("nvme"), Some(4));
        let cdir = t.root.join("sys/bus/pci/devices/0000:00:05.0/nvme/nvme0");
        fs::create_dir_all(cdir.join("nvme0c0n1")).unwrap();
        t.write("sys/block/nvme0n1/dev", "259:0\n");
        t.write(
            "proc/swaps",
            "Filename Type Size Used Priority\n/dev/nvme0n1 partition 1 0 -2\n",
        );
        let c = t
            .host()
            .controller(&"0000:00:05.0".parse().unwrap())
            .unwrap();
        assert_eq!(c.block_devices.len(), 1);
        assert_eq!(c.block_devices[0].name, "nvme0n1");
        assert!(c.block_devices[0].swap);
    }

    /// With native NVMe multipath the controller's directory holds the
    /// hidden path `nvme0c0n1`; the head's generic device `ng0n1` sits
    /// below the subsystem. A process doing passthrough I/O on it keeps
    /// the controller in use like one on a path's `ngXnY`.
    #[test]
    fn a_process_on_a_multipath_heads_generic_device_is_found() {
        let t = Tree::new();
        t.device("0000:00:05.0", "0x010802", Some("nvme"), Some(4));
        let cdir = t.root.join("sys/bus/pci/devices/0000:00:05.0/nvme/nvme0");
        fs::create_dir_all(cdir.join("nvme0c0n1")).unwrap();
        t.write("sys/block/nvme0n1/dev", "259:0\n");
        t.write("sys/class/nvme-generic/ng0n1/dev", "242:0\n");
        t.process(600, "fio", &["/dev/ng0n1"]);
        let c = t
            .host()
            .controller(&"0000:00:05.0".parse().unwrap())
            .unwrap();
        assert_eq!(
            c.in_use(),
            [
                "/dev/ng0n1 is open by pid 600 (fio) (passthrough through the kernel's driver): stop that process first"
            ]
        );
    }

    #[test]
    fn vfio_group_users_are_found() {
        let t = Tree::new();
        t.device("0000:00:04.0", "0x010802", Some("vfio-pci"), Some(3));
        t.process(77, "upnvme", &["/dev/vfio/vfio", "/dev/vfio/3"]);
        t.process(78, "sh", &["/dev/vfio/4"]);
        let host = t.host();
        let c = host.controller(&"0000:00:04.0".parse().unwrap()).unwrap();
        assert_eq!(
            c.group_users,
            [ProcUser {
                pid: 77,
                comm: "upnvme".into()
            }]
        );
        assert_eq!(c.group_users[0].to_string(), "pid 77 (upnvme)");
    }

    /// A group the kernel refuses as busy names who holds it: through
    /// the group file, or through a member's VFIO device cdev (iommufd;
    /// before, only the group file's users were looked for, and a process
    /// on the cdev was "another process").
    #[test]
    fn group_holders_include_the_members_vfio_device_cdevs() {
        let t = Tree::new();
        t.device("0000:00:04.0", "0x010802", Some("vfio-pci"), Some(3));
        t.device("0000:00:05.0", "0x010802", Some("vfio-pci"), Some(3));
        t.device("0000:00:06.0", "0x010802", Some("vfio-pci"), Some(4));
        t.write(
            "sys/bus/pci/devices/0000:00:05.0/vfio-dev/vfio1/dev",
            "511:1\n",
        );
        t.write(
            "sys/bus/pci/devices/0000:00:06.0/vfio-dev/vfio2/dev",
            "511:2\n",
        );
        t.process(41, "spdk_nvme_perf", &["/dev/vfio/devices/vfio1"]);
        t.process(42, "other", &["/dev/vfio/devices/vfio2"]);
        t.process(43, "upnvme", &["/dev/vfio/3"]);
        let names: Vec<String> = t
            .host()
            .group_holders(Path::new("/dev/vfio/3"))
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(names, ["pid 43 (upnvme)", "pid 41 (spdk_nvme_perf)"]);
        let names: Vec<String> = t
            .host()
            .group_holders(Path::new("/dev/vfio/4"))
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(names, ["pid 42 (other)"]);
    }

    /// A process holding a controller's device open under another name
    /// (a container's `--device` node) is found by the device it opened.
    /// The fake `/dev/nvme0` is a link to the real `/dev/null` (a device
    /// node every machine has, so the test needs no mknod), and the
    /// process's descriptor names `/dev/null`: before, only the path was
    /// compared and the controller looked unused.
    #[test]
    fn a_device_open_under_another_name_is_found_by_its_number() {
        let t = Tree::new();
        t.device("0000:00:04.0", "0x010802", Some("nvme"), Some(3));
        t.write("sys/bus/pci/devices/0000:00:04.0/nvme/nvme0/dev", "240:0\n");
        fs::create_dir_all(t.root.join("dev")).unwrap();
        std::os::unix::fs::symlink("/dev/null", t.root.join("dev/nvme0")).unwrap();
        t.process(61, "containerd-shim", &["/dev/null"]);
        t.process(62, "other", &["/dev/zero"]);
        let host = t.host();
        let users = host.fd_users(&[PathBuf::from("/dev/nvme0")]);
        let names: Vec<String> = users
            .get(Path::new("/dev/nvme0"))
            .map(|u| u.iter().map(ToString::to_string).collect())
            .unwrap_or_default();
        assert_eq!(names, ["pid 61 (containerd-shim)"]);
        // A target that is not a device node here is matched by path only.
        assert!(host.fd_users(&[PathBuf::from("/dev/nvme9")]).is_empty());
    }

    #[test]
    fn hugepage_pools_and_meminfo() {
        let t = Tree::new();
        t.hugepages(1048576, 0, 0);
        t.hugepages(2048, 128, 120);
        t.write(
            "proc/meminfo",
            "MemTotal: 1000 kB\nMemFree:   5120 kB\nMemAvailable:   8192 kB\n",
        );
        let host = t.host();
        let p = host.hugepage_pools();
        assert_eq!(
            p,
            [
                HugePool {
                    size_kib: 2048,
                    reserved: 128,
                    free: 120,
                    surplus: 0
                },
                HugePool {
                    size_kib: 1048576,
                    reserved: 0,
                    free: 0,
                    surplus: 0
                }
            ]
        );
        assert_eq!(host.mem_free_kib(), Some(5120));
        assert_eq!(host.mem_available_kib(), Some(8192));
    }
}
