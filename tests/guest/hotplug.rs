//! QEMU hot-unplugs and re-plugs a controller while it is in use
//! (`cargo xtask vm --hotplug --unplug 0@4 --replug 0@14`, the `hotplug`
//! configuration of `cargo xtask test`): `device_del` makes the guest's pciehp
//! remove the device, which asks the driver for it back; perf reports the
//! removal and exits 1; after `device_add` the device is enumerated again,
//! `upnvme setup bind` gives it to vfio-pci, the monitor reports it, and the
//! same process opens it and moves data.
//!
//! Returns at once in guests without a hotplug schedule
//! (`UPNVME_VM_HOTPLUG` empty).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use upnvme::{Controller, ControllerOptions, HotplugEvent, QueuePairOptions};

use crate::vm::device;

fn schedule() -> String {
    let s = std::env::var("UPNVME_VM_HOTPLUG").unwrap_or_default();
    if s.is_empty() {
        eprintln!("no hotplug schedule in this guest: nothing to check here");
    }
    s
}

#[test]
fn hotplug_device_del_releases_the_device_and_device_add_brings_it_back() {
    let s = schedule();
    if s.is_empty() {
        return;
    }
    assert!(
        s.contains("unplug:0@") && s.contains("replug:0@"),
        "this test wants controller 0 unplugged and replugged: {s}"
    );
    let dev = device();
    let addr: upnvme::PciAddress = dev.parse().unwrap();
    let mut watcher = upnvme::watch();
    assert!(
        watcher
            .poll()
            .unwrap()
            .contains(&HotplugEvent::Attached(addr))
    );
    // Runs into the unplug (the whole 60 s would mean it never came).
    let t = Instant::now();
    let o = Command::new("upnvme")
        .args(["perf", "-d", &dev, "-q", "32", "-t", "60", "--warmup", "1"])
        .output()
        .expect("upnvme is on the guest's PATH");
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("perf ended after {:?}: {err}", t.elapsed());
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("controller {dev} was removed at +")),
        "{err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(40),
        "perf ran into its own end: {err}"
    );
    let gone = watcher.wait(Duration::from_secs(10)).unwrap();
    assert_eq!(gone, [HotplugEvent::Removed(addr)]);

    // device_add: the guest enumerates it again (no driver claims it here).
    let sysfs = Path::new("/sys/bus/pci/devices").join(&dev);
    let start = Instant::now();
    while !sysfs.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "{dev} did not come back after the replug"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = Command::new("upnvme")
        .args(["setup", "bind", &dev])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let back = watcher.wait(Duration::from_secs(10)).unwrap();
    assert_eq!(back, [HotplugEvent::Attached(addr)]);
    let c = Controller::open(&dev, ControllerOptions::default()).unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let len = ns.lba_size() as usize;
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let w = c.alloc_dma(len).unwrap();
    w.fill(0, len, 0x3c).unwrap();
    let t = Duration::from_secs(10);
    qp.write_blocking(&ns, 11, 1, w, t).unwrap();
    let r = qp
        .read_blocking(&ns, 11, 1, c.alloc_dma(len).unwrap(), t)
        .unwrap();
    assert!(r.to_vec()[..len].iter().all(|&b| b == 0x3c));
}
