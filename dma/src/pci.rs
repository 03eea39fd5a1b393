//! PCI addresses and sysfs: find NVMe controllers, check that one is ready for
//! VFIO, and explain precisely what is wrong when it is not.
//!
//! All paths hang off a [`Sysfs`] root so that host tests can build a fake tree.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::error::DmaError;

/// PCI class code of an NVM Express I/O controller: mass storage (0x01),
/// non-volatile memory controller (0x08), NVM Express programming interface (0x02).
pub const NVME_CLASS: u32 = 0x01_08_02;

/// A PCI function address, `DOMAIN:BUS:DEVICE.FUNCTION` (e.g. `0000:00:04.0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddress {
    /// PCI segment (domain): 16 bits from the firmware's tables, but Linux
    /// numbers the domains it creates above them — those of Intel VMD
    /// start at 10000h — so up to 32.
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number, 0..=31.
    pub device: u8,
    /// Function number, 0..=7.
    pub function: u8,
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for PciAddress {
    type Err = DmaError;

    /// Parses `DDDD:BB:DD.F` or the short form `BB:DD.F` (domain 0).
    fn from_str(s: &str) -> Result<Self, DmaError> {
        let bad = |reason| DmaError::InvalidPciAddress {
            input: s.to_string(),
            reason,
        };
        let t = s.trim();
        let (head, function) = t
            .rsplit_once('.')
            .ok_or_else(|| bad("missing '.FUNCTION'"))?;
        let parts: Vec<&str> = head.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, dev] => (*d, *b, *dev),
            [b, dev] => ("0", *b, *dev),
            _ => return Err(bad("expected two or three ':'-separated fields before '.'")),
        };
        let hex = |v: &str, max: u32, what| {
            if v.is_empty() || v.len() > 8 {
                return Err(bad(what));
            }
            u32::from_str_radix(v, 16)
                .ok()
                .filter(|n| *n <= max)
                .ok_or_else(|| bad(what))
        };
        Ok(PciAddress {
            domain: hex(domain, u32::MAX, "domain is not a 32-bit hex number")?,
            bus: hex(bus, 0xff, "bus is not an 8-bit hex number")? as u8,
            device: hex(device, 0x1f, "device is not a hex number 0..1f")? as u8,
            function: hex(function, 7, "function is not a number 0..7")? as u8,
        })
    }
}

/// Where sysfs is mounted (normally `/sys`); tests point it at a fake tree.
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs {
            root: PathBuf::from("/sys"),
        }
    }
}

/// What sysfs says about one PCI function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciFunction {
    /// Its address.
    pub address: PciAddress,
    /// Class code (base, sub, programming interface).
    pub class: u32,
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// Name of the bound driver, if any.
    pub driver: Option<String>,
    /// IOMMU group number, if the IOMMU is on.
    pub iommu_group: Option<u32>,
}

impl Sysfs {
    /// A sysfs rooted somewhere else (for tests).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Sysfs { root: root.into() }
    }

    /// The sysfs root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `/sys/bus/pci/devices/<addr>`.
    pub fn device_dir(&self, addr: &PciAddress) -> PathBuf {
        self.root.join("bus/pci/devices").join(addr.to_string())
    }

    /// Reads what sysfs knows of `addr`.
    pub fn function(&self, addr: &PciAddress) -> Result<PciFunction, DmaError> {
        let dir = self.device_dir(addr);
        if !dir.exists() {
            return Err(DmaError::NoSuchDevice {
                address: addr.to_string(),
                path: dir,
            });
        }
        let read_hex = |name: &str| -> Result<u32, DmaError> {
            let p = dir.join(name);
            let s = fs::read_to_string(&p).map_err(|e| DmaError::Sys {
                what: format!("reading {}", p.display()),
                os_error: e,
            })?;
            let s = s.trim().trim_start_matches("0x");
            u32::from_str_radix(s, 16).map_err(|_| DmaError::Sys {
                what: format!("parsing {}", p.display()),
                os_error: std::io::Error::new(std::io::ErrorKind::InvalidData, s.to_string()),
            })
        };
        let class = read_hex("class")?;
        let vendor = read_hex("vendor")? as u16;
        let device = read_hex("device")? as u16;
        let driver = link_basename(&dir.join("driver"));
        let iommu_group = link_basename(&dir.join("iommu_group")).and_then(|g| g.parse().ok());
        Ok(PciFunction {
            address: *addr,
            class,
            vendor,
            device,
            driver,
            iommu_group,
        })
    }

    /// Every PCI function of class NVMe, sorted by address.
    pub fn nvme_controllers(&self) -> Result<Vec<PciFunction>, DmaError> {
        let dir = self.root.join("bus/pci/devices");
        let entries = fs::read_dir(&dir).map_err(|e| DmaError::Sys {
            what: format!("listing {}", dir.display()),
            os_error: e,
        })?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Ok(addr) = name.to_string_lossy().parse::<PciAddress>() else {
                continue;
            };
            if let Ok(f) = self.function(&addr)
                && f.class == NVME_CLASS
            {
                out.push(f);
            }
        }
        out.sort_by_key(|f| f.address);
        Ok(out)
    }

    /// Checks that `addr` is an NVMe controller bound to vfio-pci whose IOMMU
    /// group is viable, and returns the group number.
    pub fn check_vfio_ready(&self, addr: &PciAddress) -> Result<u32, DmaError> {
        let f = self.function(addr)?;
        if f.class != NVME_CLASS {
            return Err(DmaError::NotNvme {
                address: addr.to_string(),
                class: f.class,
            });
        }
        if f.driver.as_deref() != Some("vfio-pci") {
            return Err(DmaError::NotBoundToVfio {
                address: addr.to_string(),
                driver: f.driver,
            });
        }
        let group = f.iommu_group.ok_or_else(|| DmaError::NoIommuGroup {
            address: addr.to_string(),
        })?;
        let others = self.group_blockers(group, addr);
        if !others.is_empty() {
            return Err(DmaError::GroupNotViable {
                address: addr.to_string(),
                group,
                others,
            });
        }
        Ok(group)
    }

    /// Devices of `group` other than `addr` that are bound to a driver other
    /// than vfio-pci (or pci-stub), formatted as "address (driver)". Bridges
    /// (PCI class 0604h, 0607h, 0609h: a type 1 or 2 configuration header)
    /// never block, whatever drives them: the kernel lets a group with a
    /// root port bound to `pcieport` be used through VFIO (before Linux 5.19
    /// VFIO allowed any device without a type 0 header; since, `pcieport`
    /// declares that it manages no DMA), and a root port without ACS shares
    /// its group with the controller below it.
    pub fn group_blockers(&self, group: u32, addr: &PciAddress) -> Vec<String> {
        let dir = self
            .root
            .join("kernel/iommu_groups")
            .join(group.to_string())
            .join("devices");
        let mut out = Vec::new();
        if let Ok(entries) = fs::read_dir(&dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if name == addr.to_string() {
                    continue;
                }
                if is_bridge(&e.path()) {
                    continue;
                }
                let driver = link_basename(&e.path().join("driver"));
                match driver.as_deref() {
                    None | Some("vfio-pci") | Some("pci-stub") => {}
                    Some(d) => out.push(format!("{name} (bound to {d})")),
                }
            }
        }
        out.sort();
        out
    }
}

/// Whether the PCI function at sysfs directory `dir` is a bridge, by its
/// class code (`class`: base class 06h, sub-class 04h PCI-to-PCI, 07h
/// CardBus, 09h semi-transparent PCI-to-PCI).
fn is_bridge(dir: &Path) -> bool {
    fs::read_to_string(dir.join("class"))
        .ok()
        .and_then(|c| u32::from_str_radix(c.trim().trim_start_matches("0x"), 16).ok())
        .is_some_and(|c| matches!(c >> 8, 0x0604 | 0x0607 | 0x0609))
}

fn link_basename(p: &Path) -> Option<String> {
    fs::read_link(p)
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn parses_long_and_short_forms() {
        let a: PciAddress = "0000:00:04.0".parse().unwrap();
        assert_eq!(a.to_string(), "0000:00:04.0");
        let b: PciAddress = "3a:1f.7".parse().unwrap();
        assert_eq!(b.to_string(), "0000:3a:1f.7");
    }

    #[test]
    fn a_domain_above_ffff_as_intel_vmd_numbers_them() {
        let a: PciAddress = "10000:e1:00.0".parse().unwrap();
        assert_eq!(a.domain, 0x10000);
        assert_eq!(a.to_string(), "10000:e1:00.0");
    }

    #[test]
    fn rejects_malformed_addresses() {
        for bad in [
            "",
            "00:04",
            "0000:00:20.0",
            "0000:00:04.8",
            "zz:00.0",
            "1:2:3:4.0",
            "123456789:00:04.0",
        ] {
            let e = bad.parse::<PciAddress>().unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains("invalid PCI address"), "{bad}: {msg}");
            assert!(msg.contains("0000:00:04.0"), "{bad}: {msg}");
        }
    }

    /// Builds a fake sysfs device.
    fn fake_dev(root: &Path, addr: &str, class: &str, driver: Option<&str>, group: Option<u32>) {
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

    fn tmp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("upnvme-sysfs-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn sysfs_checks_explain_each_failure() {
        let root = tmp("checks");
        fake_dev(&root, "0000:00:04.0", "0x010802", Some("vfio-pci"), Some(3));
        fake_dev(&root, "0000:00:05.0", "0x010802", Some("nvme"), Some(4));
        fake_dev(&root, "0000:00:06.0", "0x020000", Some("vfio-pci"), Some(5));
        fake_dev(&root, "0000:00:07.0", "0x010802", Some("vfio-pci"), None);
        fake_dev(&root, "0000:00:08.0", "0x010802", Some("vfio-pci"), Some(6));
        fake_dev(&root, "0000:00:08.1", "0x0c0330", Some("xhci_hcd"), Some(6));
        fake_dev(&root, "0000:00:09.0", "0x010802", None, Some(7));
        let s = Sysfs::at(&root);
        let a = |s: &str| s.parse::<PciAddress>().unwrap();

        assert_eq!(s.check_vfio_ready(&a("0000:00:04.0")).unwrap(), 3);
        let e = s.check_vfio_ready(&a("0000:00:05.0")).unwrap_err();
        assert!(matches!(e, DmaError::NotBoundToVfio { driver: Some(ref d), .. } if d == "nvme"));
        assert!(
            e.to_string().contains("upnvme setup bind 0000:00:05.0"),
            "{e}"
        );
        let e = s.check_vfio_ready(&a("0000:00:06.0")).unwrap_err();
        assert!(
            matches!(
                e,
                DmaError::NotNvme {
                    class: 0x020000,
                    ..
                }
            ),
            "{e}"
        );
        let e = s.check_vfio_ready(&a("0000:00:07.0")).unwrap_err();
        assert!(matches!(e, DmaError::NoIommuGroup { .. }));
        assert!(e.to_string().contains("intel_iommu=on"));
        let e = s.check_vfio_ready(&a("0000:00:08.0")).unwrap_err();
        assert!(
            e.to_string().contains("0000:00:08.1 (bound to xhci_hcd)"),
            "{e}"
        );
        let e = s.check_vfio_ready(&a("0000:00:09.0")).unwrap_err();
        assert!(e.to_string().contains("not bound to any driver"), "{e}");
        let e = s.check_vfio_ready(&a("0000:00:1f.0")).unwrap_err();
        assert!(matches!(e, DmaError::NoSuchDevice { .. }));

        let list = s.nvme_controllers().unwrap();
        let addrs: Vec<String> = list.iter().map(|f| f.address.to_string()).collect();
        assert_eq!(
            addrs,
            [
                "0000:00:04.0",
                "0000:00:05.0",
                "0000:00:07.0",
                "0000:00:08.0",
                "0000:00:09.0"
            ]
        );
        fs::remove_dir_all(&root).unwrap();
    }
}
