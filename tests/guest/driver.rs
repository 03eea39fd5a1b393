//! Guest tests of the driver core: open, bring-up, identify, namespaces, logs,
//! shutdown and re-open, two controllers at once, and the setup errors a user
//! can meet — against QEMU's emulated NVMe controller through VFIO.

use std::fs;
use std::time::Duration;

use upnvme::dma::DmaError;
use upnvme::{Controller, ControllerOptions, Error};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set: run inside `cargo xtask vm`"))
}

fn env_u64(name: &str) -> u64 {
    env(name)
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number"))
}

/// The vfio-bound controllers, in order.
fn devices() -> Vec<String> {
    env("UPNVME_VM_DEVICES")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn open(addr: &str) -> Controller {
    Controller::open(addr, ControllerOptions::default())
        .unwrap_or_else(|e| panic!("open {addr}: {e}"))
}

#[test]
fn identify_matches_vm_configuration() {
    let prefix = env("UPNVME_VM_SERIAL_PREFIX");
    let mdts = env_u64("UPNVME_VM_MDTS");
    for (i, addr) in devices().iter().enumerate() {
        let c = open(addr);
        let id = c.identify();
        assert_eq!(id.mn, "QEMU NVMe Ctrl", "model number of {addr}");
        assert_eq!(id.sn, format!("{prefix}{i}"), "serial of {addr}");
        assert_eq!(id.mdts as u64, mdts, "MDTS of {addr}");
        assert_eq!(c.max_transfer_bytes(), Some(4096usize << mdts));
        assert!(c.granted_io_queues() >= 1);
        assert!(c.version().major() >= 1);
        // Re-reading Identify Controller returns the same data as bring-up.
        let again = c.identify_controller().unwrap();
        assert_eq!(again.sn, id.sn);
        assert_eq!(again.nn, id.nn);
        c.close().unwrap();
    }
}

#[test]
fn namespaces_match_vm_configuration() {
    let per_ctrl = env_u64("UPNVME_VM_NAMESPACES") as usize;
    let lba = env_u64("UPNVME_VM_LBA_SIZE") as u32;
    let disk = env_u64("UPNVME_VM_DISK_SIZE");
    for addr in devices() {
        let c = open(&addr);
        let ns = c.namespaces();
        assert_eq!(ns.len(), per_ctrl, "namespaces on {addr}");
        for (i, n) in ns.iter().enumerate() {
            assert_eq!(n.id(), i as u32 + 1);
            assert_eq!(n.lba_size(), lba, "LBA size of ns {} on {addr}", n.id());
            assert_eq!(n.size_bytes(), disk, "size of ns {} on {addr}", n.id());
            assert_eq!(n.lba_count(), disk / lba as u64);
            assert_eq!(n.metadata_size(), 0);
        }
        let ids = c.active_namespace_ids(0).unwrap();
        assert_eq!(ids, (1..=per_ctrl as u32).collect::<Vec<_>>());
        // An inactive NSID is a typed error.
        let e = c.namespace(per_ctrl as u32 + 7).unwrap_err();
        assert!(matches!(e, Error::NoSuchNamespace { .. }), "{e}");
        c.close().unwrap();
    }
}

#[test]
fn smart_and_logs_are_readable() {
    let c = open(&devices()[0]);
    let smart = c.smart_log().unwrap();
    // QEMU reports a plausible temperature (it defaults to 323 K = 50 C... or
    // whatever it was told); zero would mean we parsed the wrong bytes.
    assert!(
        (200..400).contains(&smart.temperature_kelvin),
        "temperature {} K",
        smart.temperature_kelvin
    );
    assert_eq!(smart.critical_warning, 0);
    c.error_log(4).unwrap();
    let fw = c.firmware_slot_log().unwrap();
    assert!(
        fw.afi & 0x7 >= 1,
        "an active firmware slot: afi 0x{:x}",
        fw.afi
    );
    // Features: the number of queues read back matches what was granted.
    let nq = c.get_features(0x07, 0, 0).unwrap();
    assert!((nq & 0xffff) + 1 >= c.granted_io_queues() as u32);
    // An invalid Get Features FID is a typed NVMe status error, and the
    // controller stays usable.
    let e = c.get_features(0xee, 0, 0).unwrap_err();
    assert!(matches!(e, Error::Command { .. }), "{e}");
    assert!(e.to_string().contains("Invalid Field"), "{e}");
    c.smart_log().unwrap();
    c.close().unwrap();
}

/// Admin passthrough commands are waited for without holding the admin
/// queue (`Inner::execute_detached`): data comes back whole through the
/// IOMMU while another thread's pair runs I/O and its own admin commands.
#[test]
fn admin_passthrough_data_is_whole_while_other_threads_run_io_and_admin_commands() {
    use upnvme::{QueuePairOptions, Sqe};
    let c = open(&devices()[0]);
    let identify = || {
        c.admin_passthrough(Sqe::identify(0x01, 0, 0), 4096, None)
            .unwrap_or_else(|e| panic!("Identify Controller through the passthrough: {e}"))
            .1
    };
    let reference = identify();
    // Serial Number (bytes 4..24) and Model Number (24..64), space padded.
    let text =
        |r: std::ops::Range<usize>| String::from_utf8_lossy(&reference[r]).trim().to_string();
    assert_eq!(text(4..24), c.identify().sn);
    assert_eq!(text(24..64), c.identify().mn);
    let ns = c.namespace(1).unwrap().clone();
    let lba = ns.lba_size() as usize;
    std::thread::scope(|s| {
        let io = s.spawn(|| {
            let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
            let mut buf = c.alloc_dma(lba).unwrap();
            for i in 0..200u64 {
                let data: Vec<u8> = (0..lba).map(|b| (b as u64 ^ (i * 31)) as u8).collect();
                buf.write_bytes(0, &data).unwrap();
                buf = qp
                    .write_blocking(&ns, i, 1, buf, Duration::from_secs(10))
                    .unwrap();
                buf.fill(0, lba, 0).unwrap();
                buf = qp
                    .read_blocking(&ns, i, 1, buf, Duration::from_secs(10))
                    .unwrap();
                let mut back = vec![0u8; lba];
                buf.read_bytes(0, &mut back).unwrap();
                assert_eq!(back, data, "block {i}");
            }
        });
        let admin = s.spawn(|| {
            for _ in 0..50 {
                c.get_features(0x07, 0, 0).unwrap();
                c.smart_log().unwrap();
            }
        });
        for i in 0..100 {
            assert!(identify() == reference, "Identify Controller {i} differs");
            // SMART / Health Information with RAE set (a detached wait too).
            let (_, smart) = c
                .admin_passthrough(
                    Sqe::get_log_page(0x02, 0xffff_ffff, 128, 0, true),
                    512,
                    None,
                )
                .unwrap();
            let kelvin = u16::from_le_bytes([smart[1], smart[2]]);
            assert!((200..400).contains(&kelvin), "temperature {kelvin} K");
        }
        io.join().unwrap();
        admin.join().unwrap();
    });
    c.close().unwrap();
}

#[test]
fn shutdown_completes_and_reopen_works() {
    let addr = &devices()[0];
    for _ in 0..3 {
        let c = open(addr);
        assert!(c.status().unwrap().rdy());
        // close() waits for CSTS.SHST = complete and then CSTS.RDY = 0; it fails
        // with a typed timeout otherwise.
        c.close().unwrap();
    }
    // Drop shuts down too, and the next open succeeds right after.
    drop(open(addr));
    let c = open(addr);
    assert_eq!(c.identify().mn, "QEMU NVMe Ctrl");
}

#[test]
fn two_controllers_in_one_process() {
    let devs = devices();
    if devs.len() < 2 {
        eprintln!("single-controller configuration: covered by the two-controller run");
        return;
    }
    let a = open(&devs[0]);
    let b = Controller::open(
        &devs[1],
        ControllerOptions {
            admin_queue_entries: 8,
            shadow_doorbells: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_ne!(a.identify().sn, b.identify().sn);
    assert_eq!(b.admin_queue_entries(), 8);
    // QEMU's controller offers Doorbell Buffer Config: on where asked for,
    // off by default.
    assert!(b.shadow_doorbells());
    assert!(!a.shadow_doorbells());
    a.smart_log().unwrap();
    b.smart_log().unwrap();
    a.close().unwrap();
    b.close().unwrap();
}

/// Each controller has its own VFIO container and IOVA space: a buffer of
/// one, submitted on a pair of the other, is refused before the device sees
/// it (its IOVA would name the other's memory, or nothing: an IOMMU fault
/// the command would not report). The harness checks for DMAR faults.
#[test]
fn a_buffer_of_one_controller_is_refused_on_the_other() {
    let devs = devices();
    if devs.len() < 2 {
        eprintln!("single-controller configuration: covered by the two-controller run");
        return;
    }
    let a = open(&devs[0]);
    let b = open(&devs[1]);
    let ns = b.namespace(1).unwrap().clone();
    let mut qp = b
        .io_queue_pair(upnvme::QueuePairOptions::default())
        .unwrap();
    let lba = ns.lba_size() as usize;
    let foreign = a.alloc_dma(lba).unwrap();
    foreign.fill(0, lba, 0xa5).unwrap();
    eprintln!(
        "IOVA of a's buffer {:#x}; of b's first buffer {:#x}",
        foreign.iova(),
        b.alloc_dma(lba).unwrap().iova()
    );
    let t = Duration::from_secs(10);
    let f = qp.write_blocking(&ns, 0, 1, foreign, t).unwrap_err();
    assert!(
        f.error
            .to_string()
            .contains("mapped for another controller"),
        "{}",
        f.error
    );
    let foreign = f.buffer.expect("the refused buffer comes back");
    // b's own memory carries the same bytes.
    let own = b.alloc_dma(lba).unwrap();
    own.write_bytes(0, &foreign.to_vec()).unwrap();
    qp.write_blocking(&ns, 0, 1, own, t).unwrap();
    let back = qp
        .read_blocking(&ns, 0, 1, b.alloc_dma(lba).unwrap(), t)
        .unwrap();
    assert!(back.to_vec().iter().all(|&x| x == 0xa5));
    drop(qp);
    a.close().unwrap();
    b.close().unwrap();
}

#[test]
fn async_event_polling_is_quiet_when_nothing_happened() {
    let c = open(&devices()[0]);
    for _ in 0..10 {
        assert!(c.poll_async_events().unwrap().is_empty());
    }
    c.close().unwrap();
}

/// QEMU offers Namespace Attribute Notices (OAES bit 8): the driver turns
/// them on at bring-up and again after a reset (which sets features back),
/// and the controller keeps them.
#[test]
fn namespace_attribute_notices_are_on_after_bring_up_and_after_a_reset() {
    const ASYNC_EVENT_CONFIG: u8 = 0x0b;
    let c = open(&devices()[0]);
    assert!(c.identify().oaes_namespace_attribute_notices());
    let aec = c.get_features(ASYNC_EVENT_CONFIG, 0, 0).unwrap();
    assert_ne!(aec & (1 << 8), 0, "AEC {aec:#x} after bring-up");
    c.reset().unwrap();
    let aec = c.get_features(ASYNC_EVENT_CONFIG, 0, 0).unwrap();
    assert_ne!(aec & (1 << 8), 0, "AEC {aec:#x} after a reset");
    assert!(c.poll_async_events().unwrap().is_empty());
    c.close().unwrap();
}

#[test]
fn the_same_controller_cannot_be_opened_twice() {
    let addr = &devices()[0];
    let a = open(addr);
    let e = Controller::open(addr, ControllerOptions::default()).unwrap_err();
    assert!(e.to_string().contains("already open"), "{e}");
    a.close().unwrap();
}

/// DMA memory of a closed controller keeps its VFIO container (and group)
/// open: opening the device again fails until it is gone, and the error
/// names it rather than only "another Controller".
#[test]
fn a_buffer_of_a_closed_controller_keeps_the_device_open_and_the_error_says_so() {
    let addr = &devices()[0];
    let a = open(addr);
    let buf = a.alloc_dma(4096).unwrap();
    a.close().unwrap();
    let e = Controller::open(addr, ControllerOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("already open") && msg.contains("DMA buffers, pools or registered memory"),
        "{msg}"
    );
    buf.write_u32(0, 7).unwrap();
    drop(buf);
    open(addr).close().unwrap();
}

#[test]
fn bad_addresses_are_explained() {
    let e = Controller::open("00:04", ControllerOptions::default()).unwrap_err();
    assert!(
        matches!(e, Error::Dma(DmaError::InvalidPciAddress { .. })),
        "{e}"
    );
    let e = Controller::open("0000:00:1e.6", ControllerOptions::default()).unwrap_err();
    assert!(
        matches!(e, Error::Dma(DmaError::NoSuchDevice { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("upnvme list"), "{e}");
    // The q35 host bridge is a PCI device but not an NVMe controller.
    let e = Controller::open("0000:00:00.0", ControllerOptions::default()).unwrap_err();
    assert!(matches!(e, Error::Dma(DmaError::NotNvme { .. })), "{e}");
}

#[test]
fn device_bound_to_another_driver_is_explained() {
    if let Ok(k) = std::env::var("UPNVME_VM_KERNEL_NVME")
        && !k.is_empty()
    {
        let e = Controller::open(&k, ControllerOptions::default()).unwrap_err();
        assert!(
            matches!(e, Error::Dma(DmaError::NotBoundToVfio { driver: Some(ref d), .. }) if d == "nvme"),
            "{e}"
        );
        assert!(e.to_string().contains("upnvme setup"), "{e}");
    }
    // Unbind a controller from vfio-pci, check the error, and bind it back.
    let addr = &devices()[0];
    fs::write("/sys/bus/pci/drivers/vfio-pci/unbind", addr).unwrap();
    let e = Controller::open(addr, ControllerOptions::default()).unwrap_err();
    let rebind = fs::write("/sys/bus/pci/drivers_probe", addr);
    assert!(
        matches!(e, Error::Dma(DmaError::NotBoundToVfio { driver: None, .. })),
        "{e}"
    );
    assert!(e.to_string().contains("vfio-pci"), "{e}");
    rebind.unwrap();
    std::thread::sleep(Duration::from_millis(50));
    open(addr).close().unwrap();
}

#[test]
fn missing_hugepages_are_explained() {
    let path = "/proc/sys/vm/nr_hugepages";
    let before = fs::read_to_string(path).unwrap();
    fs::write(path, "0").unwrap();
    let r = Controller::open(&devices()[0], ControllerOptions::default());
    fs::write(path, before.trim()).unwrap();
    let e = r.unwrap_err();
    assert!(
        matches!(e, Error::Dma(DmaError::HugepagesUnavailable { .. })),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains("nr_hugepages"), "{msg}");
    // One hugepage is enough to open, create a pair and read, as it was
    // before the SQs and list pages got read-only memory of their own: the
    // admin CQ takes the page, and the read-only allocations, finding none
    // free, fall back to the read-write region.
    fs::write(path, "1").unwrap();
    let one = (|| -> Result<upnvme::ReadOnlyMemory, Error> {
        let c = Controller::open(&devices()[0], ControllerOptions::default())?;
        let ns = c.namespace(1)?.clone();
        let mut qp = c.io_queue_pair(Default::default())?;
        let buf = c.alloc_dma(4096)?;
        qp.read_blocking(&ns, 0, 1, buf, Duration::from_secs(5))
            .map_err(|f| f.error)?;
        drop(qp);
        let ro = c.read_only_memory();
        c.close()?;
        Ok(ro)
    })();
    fs::write(path, before.trim()).unwrap();
    // The fallback is reported, with its reason.
    match one.expect("open, a queue pair and a read with one hugepage") {
        upnvme::ReadOnlyMemory::FellBack {
            allocations,
            reason,
        } => {
            assert!(
                allocations >= 2,
                "the admin SQ and the I/O SQ: {allocations}"
            );
            assert!(reason.contains("hugepage"), "{reason}");
        }
        other => panic!("want FellBack, got {other:?}"),
    }
    // With hugepages back, the same open works, read-only memory and all.
    let c = open(&devices()[0]);
    assert_eq!(c.read_only_memory(), upnvme::ReadOnlyMemory::Enforced);
    c.close().unwrap();
    // And the documented 4 KiB opt-in works without hugepages.
    fs::write(path, "0").unwrap();
    let r = Controller::open(
        &devices()[0],
        ControllerOptions {
            page_backing: upnvme::PageBacking::Small4K,
            ..Default::default()
        },
    );
    fs::write(path, before.trim()).unwrap();
    let c = r.unwrap();
    c.smart_log().unwrap();
    c.close().unwrap();
}

/// A BAR the kernel revokes under a running driver (as on surprise removal:
/// here by clearing PCI Command.MSE through VFIO, which makes vfio-pci zap
/// the BAR mapping) must read as a vanished device, not kill the process
/// with SIGBUS: the driver's handler maps all-ones memory over the BAR, and
/// the driver reports `ControllerGone`. The controller opens again afterwards
/// (vfio-pci re-enables memory decoding when the device is opened).
#[test]
fn revoked_bar_reads_as_gone_instead_of_sigbus() {
    let addr = devices().into_iter().next().expect("a device");
    let c = open(&addr);
    let mut qp = c
        .io_queue_pair(upnvme::QueuePairOptions::default())
        .unwrap();
    let ns = c.namespace(1).unwrap().clone();
    let buf = c.alloc_dma(4096).unwrap();
    let buf = qp
        .read_blocking(&ns, 0, 1, buf, Duration::from_secs(10))
        .unwrap();
    let before = upnvme::dma::sigbus::revoked_mappings();
    let vfio = c.device().vfio();
    let cmd = vfio.config_read16(0x04).unwrap();
    vfio.config_write16(0x04, cmd & !0x0002).unwrap(); // Command.MSE = 0
    let e = qp
        .read_blocking(&ns, 0, 1, buf, Duration::from_secs(10))
        .unwrap_err();
    assert!(
        matches!(e.error, Error::ControllerGone { .. }),
        "want ControllerGone, got {e}"
    );
    assert!(
        upnvme::dma::sigbus::revoked_mappings() > before,
        "the access faulted and was answered with all ones"
    );
    let r = c.reset();
    assert!(matches!(r, Err(Error::ControllerGone { .. })), "{r:?}");
    drop(qp);
    drop(c);
    let c = open(&addr);
    assert!(!c.identify().sn.is_empty());
    c.close().unwrap();
}
