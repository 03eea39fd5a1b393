//! `upnvme setup`: bind NVMe controllers to vfio-pci (or back to nvme) and
//! reserve hugepages — the steps every error message of the library points to.

use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use upnvme::PciAddress;

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// Binds `devices` (all NVMe controllers when empty) to vfio-pci, or to nvme
/// with `reset`, and reserves `hugepages` 2 MiB pages.
pub fn run(devices: &[String], hugepages: u64, reset: bool) -> Result<()> {
    let targets: Vec<PciAddress> = if devices.is_empty() {
        upnvme::list_controllers()?
            .into_iter()
            .map(|f| f.address)
            .collect()
    } else {
        devices
            .iter()
            .map(|d| d.parse::<PciAddress>().map_err(anyhow::Error::from))
            .collect::<Result<_>>()?
    };
    if targets.is_empty() {
        bail!("no NVMe controller found on the PCI bus");
    }
    let driver = if reset { "nvme" } else { "vfio-pci" };
    // Load the modules if modprobe exists (built-in or already loaded is fine).
    let _ = Command::new("modprobe").arg(driver).status();
    for addr in &targets {
        bind(addr, driver, reset)?;
        println!("{addr}: bound to {driver}");
    }
    if !reset {
        let now: u64 = fs::read_to_string(NR_HUGEPAGES)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if now < hugepages {
            fs::write(NR_HUGEPAGES, hugepages.to_string())
                .with_context(|| format!("writing {NR_HUGEPAGES} (are you root?)"))?;
        }
        let got: u64 = fs::read_to_string(NR_HUGEPAGES)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        println!("hugepages: {got} x 2 MiB reserved");
        if got < hugepages {
            bail!(
                "only {got} of {hugepages} hugepages could be reserved (memory fragmented?); try again after boot or add hugepages={hugepages} to the kernel command line"
            );
        }
    }
    Ok(())
}

fn bind(addr: &PciAddress, driver: &str, reset: bool) -> Result<()> {
    let dev = Path::new("/sys/bus/pci/devices").join(addr.to_string());
    if !dev.exists() {
        bail!("no PCI device at {addr}");
    }
    let current = fs::read_link(dev.join("driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().to_string()));
    if current.as_deref() == Some(driver) {
        return Ok(());
    }
    let over = if reset { "\n" } else { driver };
    fs::write(dev.join("driver_override"), over)
        .with_context(|| format!("writing driver_override of {addr} (are you root?)"))?;
    if current.is_some() {
        fs::write(dev.join("driver/unbind"), addr.to_string())
            .with_context(|| format!("unbinding {addr}"))?;
    }
    fs::write("/sys/bus/pci/drivers_probe", addr.to_string())
        .with_context(|| format!("probing {addr}"))?;
    let now = fs::read_link(dev.join("driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().to_string()));
    if now.as_deref() != Some(driver) {
        bail!(
            "{addr} did not bind to {driver} (now: {}); is the {driver} module available? (`modprobe {driver}`)",
            now.as_deref().unwrap_or("no driver")
        );
    }
    Ok(())
}
