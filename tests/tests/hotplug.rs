//! `upnvme::watch()`: vfio-bound NVMe controllers appearing and disappearing,
//! on a fake sysfs tree (the guest test `removal::*` sees the real ones).

use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;

use upnvme::dma::{PciAddress, Sysfs};
use upnvme::hotplug::{HotplugEvent, Watcher};

struct Tree(PathBuf);

impl Tree {
    fn new() -> Tree {
        let root = std::env::temp_dir().join(format!("upnvme-hotplug-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        Tree(root)
    }

    fn add(&self, addr: &str, class: &str, driver: &str) {
        let dir = self.0.join("bus/pci/devices").join(addr);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("class"), format!("{class}\n")).unwrap();
        fs::write(dir.join("vendor"), "0x1b36\n").unwrap();
        fs::write(dir.join("device"), "0x0010\n").unwrap();
        let ddir = self.0.join("bus/pci/drivers").join(driver);
        fs::create_dir_all(&ddir).unwrap();
        let _ = fs::remove_file(dir.join("driver"));
        symlink(&ddir, dir.join("driver")).unwrap();
    }

    fn remove(&self, addr: &str) {
        fs::remove_dir_all(self.0.join("bus/pci/devices").join(addr)).unwrap();
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn a(s: &str) -> PciAddress {
    s.parse().unwrap()
}

#[test]
fn controllers_bound_to_vfio_come_and_go() {
    let t = Tree::new();
    t.add("0000:00:04.0", "0x010802", "vfio-pci");
    t.add("0000:00:05.0", "0x010802", "nvme");
    t.add("0000:00:06.0", "0x020000", "vfio-pci"); // not NVMe
    let mut w = Watcher::with_sysfs(Sysfs::at(&t.0));
    // The first poll reports what is there (as SPDK's probe does).
    assert_eq!(
        w.poll().unwrap(),
        [HotplugEvent::Attached(a("0000:00:04.0"))]
    );
    assert_eq!(w.poll().unwrap(), []);
    // Removed; another one bound to vfio-pci.
    t.remove("0000:00:04.0");
    t.add("0000:00:05.0", "0x010802", "vfio-pci");
    assert_eq!(
        w.poll().unwrap(),
        [
            HotplugEvent::Removed(a("0000:00:04.0")),
            HotplugEvent::Attached(a("0000:00:05.0"))
        ]
    );
    // Back, and `wait` returns as soon as it sees it.
    t.add("0000:00:04.0", "0x010802", "vfio-pci");
    assert_eq!(
        w.wait(std::time::Duration::from_secs(2)).unwrap(),
        [HotplugEvent::Attached(a("0000:00:04.0"))]
    );
    assert_eq!(
        w.controllers().collect::<Vec<_>>(),
        [a("0000:00:04.0"), a("0000:00:05.0")]
    );
    // Bound back to the kernel driver: gone for VFIO users.
    t.add("0000:00:05.0", "0x010802", "nvme");
    assert_eq!(
        w.wait(std::time::Duration::from_secs(2)).unwrap(),
        [HotplugEvent::Removed(a("0000:00:05.0"))]
    );
}
