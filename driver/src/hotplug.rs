//! A hotplug monitor in the spirit of `spdk_nvme_probe`'s attach and remove
//! callbacks: [`watch`] reports NVMe controllers bound to vfio-pci as they
//! appear (a rescan, a `device_add`, `upnvme setup bind`) and disappear (a
//! removal, an unbind), so an application can open them again.
//!
//! How it sees them: each [`Watcher::poll`] scans sysfs
//! (`/sys/bus/pci/devices`: class 0x010802, driver vfio-pci) and compares the
//! set with the previous scan. No netlink socket (and no `unsafe`) is needed;
//! a scan reads a few sysfs files per PCI function, so poll at human rates
//! (the [`Watcher::wait`] helper polls every 50 ms). A controller that goes
//! and comes back between two polls is reported as neither.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use upnvme_dma::{PciAddress, Sysfs};

use crate::error::Result;

/// What changed between two scans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HotplugEvent {
    /// An NVMe controller is now bound to vfio-pci: it can be opened.
    Attached(PciAddress),
    /// A controller that was bound to vfio-pci is gone or bound elsewhere.
    Removed(PciAddress),
}

/// Watches the vfio-bound NVMe controllers (see the module docs).
#[derive(Debug)]
pub struct Watcher {
    sysfs: Sysfs,
    known: BTreeSet<PciAddress>,
}

/// A watcher of this machine's sysfs. The controllers bound to vfio-pci now
/// are reported as [`HotplugEvent::Attached`] by the first poll, as SPDK's
/// probe reports the ones present.
pub fn watch() -> Watcher {
    Watcher::with_sysfs(Sysfs::default())
}

impl Watcher {
    /// A watcher of the sysfs tree `sysfs` (tests use a fake one).
    pub fn with_sysfs(sysfs: Sysfs) -> Watcher {
        Watcher {
            sysfs,
            known: BTreeSet::new(),
        }
    }

    /// The controllers bound to vfio-pci at the last poll.
    pub fn controllers(&self) -> impl Iterator<Item = PciAddress> + '_ {
        self.known.iter().copied()
    }

    /// Scans once; returns what appeared and disappeared since the last scan
    /// (removals first, each in address order).
    pub fn poll(&mut self) -> Result<Vec<HotplugEvent>> {
        let now: BTreeSet<PciAddress> = self
            .sysfs
            .nvme_controllers()?
            .into_iter()
            .filter(|f| f.driver.as_deref() == Some("vfio-pci"))
            .map(|f| f.address)
            .collect();
        let mut events: Vec<HotplugEvent> = self
            .known
            .difference(&now)
            .map(|a| HotplugEvent::Removed(*a))
            .collect();
        events.extend(
            now.difference(&self.known)
                .map(|a| HotplugEvent::Attached(*a)),
        );
        self.known = now;
        Ok(events)
    }

    /// Polls every 50 ms until something changes or `timeout` passes (then
    /// returns no events).
    pub fn wait(&mut self, timeout: Duration) -> Result<Vec<HotplugEvent>> {
        let start = Instant::now();
        loop {
            let e = self.poll()?;
            let waited = start.elapsed();
            if !e.is_empty() || waited >= timeout {
                return Ok(e);
            }
            // At most what is left: the last look comes at the timeout,
            // not up to one interval after it.
            std::thread::sleep(Duration::from_millis(50).min(timeout - waited));
        }
    }
}
