//! Tests of `upnvme setup` (bind, unbind, hugepages, status) and of the
//! sysfs checks of `upnvme::dma::pci` it relies on, against fake sysfs and
//! procfs trees (from a review; run with `cargo test -p upnvme-cli --bin
//! upnvme setup::bind_tests`). A child module of `setup`, since `bind`,
//! `unbind`, `undo_bind` and `hugepages` are private to it.
//!
//! The actions write to sysfs attributes that the kernel acts on. Here a
//! small fake kernel ([`Kernel`]) stands behind them: `drivers_probe` and
//! every `drivers/<d>/unbind` are FIFOs read by a thread that moves the
//! device's `driver` link as the kernel would (probe honours
//! `driver_override`; without one, the nvme driver takes an NVMe class
//! device; vfio-pci has no ID table), and log what they did. Nothing here
//! touches the machine's /sys, /dev or /proc: the fake kernel also creates
//! the group's node under the tree's `dev/vfio/` when it binds vfio-pci,
//! which `bind_one` waits (up to 2 s) to see.

use std::fs;
use std::os::unix::fs::{OpenOptionsExt, symlink};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::host::fake::Tree;
use super::host::{Host, HugePool};
use super::*;
use upnvme::dma::pci::{PciAddress, Sysfs};

const NVME: &str = "0x010802";

/// How the fake kernel misbehaves.
#[derive(Default)]
struct Behaviour {
    /// Drivers whose probe fails (the device stays without a driver).
    refuse: Vec<String>,
    /// The device is hot-removed when a driver lets go of it.
    vanish_on_unbind: bool,
    /// When the device at the address is probed, the file (below the
    /// tree) gets the text: something else on the machine acting meanwhile.
    after_probe: Option<(String, std::path::PathBuf, String)>,
}

/// A fake kernel behind the fake sysfs attributes `setup` writes.
///
/// One thread holds every FIFO open for reading (non-blocking, with a
/// write end of its own so that an empty FIFO reads as "nothing yet", not
/// as end of file): a writer's `write` returns as soon as its bytes are in
/// the pipe. Ordering: whatever `setup` wrote to an `unbind` before it
/// wrote to `drivers_probe` is in that FIFO by the time the probe is read,
/// and the thread acts on the unbinds first, so the kernel's synchronous
/// order is kept (a probe never overtakes the unbind written before it).
struct Kernel {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    log: Arc<Mutex<Vec<String>>>,
    behaviour: Arc<Mutex<Behaviour>>,
}

fn mkfifo(p: &Path) {
    let _ = fs::remove_file(p);
    let st = Command::new("mkfifo").arg(p).status().expect("run mkfifo");
    assert!(st.success(), "mkfifo {}", p.display());
}

/// A FIFO's read end (non-blocking) and a write end that keeps it open.
fn fifo_ends(p: &Path) -> (fs::File, fs::File) {
    mkfifo(p);
    let r = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
        .unwrap();
    let w = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
        .unwrap();
    (r, w)
}

/// The addresses written to a FIFO since the last call (writes of
/// `0000:00:05.0` may arrive concatenated: 12 characters each).
fn take_addresses(r: &mut fs::File) -> Vec<String> {
    use std::io::Read as _;
    let mut text = String::new();
    let mut buf = [0u8; 512];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(_) => break,
        }
    }
    let text: String = text.split_whitespace().collect();
    text.as_bytes()
        .chunks(12)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect()
}

fn link_basename(p: &Path) -> Option<String> {
    fs::read_link(p)
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

fn do_unbind(sys: &Path, d: &str, addr: &str, beh: &Mutex<Behaviour>) -> String {
    let dev = sys.join("bus/pci/devices").join(addr);
    if link_basename(&dev.join("driver")).as_deref() != Some(d) {
        return format!("unbind {d} {addr}: ENODEV");
    }
    let _ = fs::remove_file(dev.join("driver"));
    if d == "nvme" {
        let _ = fs::remove_dir_all(dev.join("nvme"));
    }
    if beh.lock().unwrap().vanish_on_unbind {
        let _ = fs::remove_dir_all(&dev);
        format!("unbind {d} {addr}; {addr} removed")
    } else {
        format!("unbind {d} {addr}")
    }
}

fn do_probe(sys: &Path, addr: &str, beh: &Mutex<Behaviour>) -> String {
    let dev = sys.join("bus/pci/devices").join(addr);
    if !dev.exists() {
        return format!("probe {addr}: no such device");
    }
    if let Some(d) = link_basename(&dev.join("driver")) {
        return format!("probe {addr}: already on {d}");
    }
    let over = fs::read_to_string(dev.join("driver_override"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let class = fs::read_to_string(dev.join("class"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let cand = if over.is_empty() || over == "(null)" {
        (class == NVME).then(|| "nvme".to_string())
    } else {
        Some(over)
    };
    match cand {
        Some(c)
            if sys.join("bus/pci/drivers").join(&c).is_dir()
                && !beh.lock().unwrap().refuse.contains(&c) =>
        {
            symlink(sys.join("bus/pci/drivers").join(&c), dev.join("driver")).unwrap();
            // vfio-pci's group node appears with the binding.
            if c == "vfio-pci"
                && let (Some(root), Some(g)) =
                    (sys.parent(), link_basename(&dev.join("iommu_group")))
            {
                let node = root.join("dev/vfio").join(g);
                fs::create_dir_all(node.parent().unwrap()).unwrap();
                fs::write(node, "").unwrap();
            }
            format!("probe {addr} -> {c}")
        }
        c => format!("probe {addr}: no driver took it ({c:?})"),
    }
}

impl Kernel {
    /// Registers `drivers` (directories with an `unbind` FIFO) and the
    /// bus's `drivers_probe` FIFO.
    fn start(t: &Tree, drivers: &[&str]) -> Kernel {
        let sys = t.root.join("sys");
        let log = Arc::new(Mutex::new(Vec::new()));
        let behaviour = Arc::new(Mutex::new(Behaviour::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut unbinds = Vec::new();
        for d in drivers {
            let ddir = sys.join("bus/pci/drivers").join(d);
            fs::create_dir_all(&ddir).unwrap();
            unbinds.push((d.to_string(), fifo_ends(&ddir.join("unbind"))));
        }
        let mut probe = fifo_ends(&sys.join("bus/pci/drivers_probe"));
        let (l, b, s) = (Arc::clone(&log), Arc::clone(&behaviour), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let drain = |unbinds: &mut Vec<(String, (fs::File, fs::File))>| {
                for (d, (r, _)) in unbinds.iter_mut() {
                    for a in take_addresses(r) {
                        let e = do_unbind(&sys, d, &a, &b);
                        l.lock().unwrap().push(e);
                    }
                }
            };
            while !s.load(Ordering::Relaxed) {
                drain(&mut unbinds);
                let probes = take_addresses(&mut probe.0);
                if !probes.is_empty() {
                    // Unbinds written before these probes are in their FIFOs now.
                    drain(&mut unbinds);
                    for a in probes {
                        let e = do_probe(&sys, &a, &b);
                        l.lock().unwrap().push(e);
                        if let Some((at, file, text)) = &b.lock().unwrap().after_probe
                            && *at == a
                        {
                            fs::write(file, text).unwrap();
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Kernel {
            stop,
            thread: Some(thread),
            log,
            behaviour,
        }
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn clear_log(&self) {
        self.log.lock().unwrap().clear();
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn driver_of(t: &Tree, a: &str) -> Option<String> {
    link_basename(&t.root.join("sys/bus/pci/devices").join(a).join("driver"))
}

fn override_of(t: &Tree, a: &str) -> String {
    fs::read_to_string(
        t.root
            .join("sys/bus/pci/devices")
            .join(a)
            .join("driver_override"),
    )
    .unwrap()
}

// ---------------------------------------------------------------------------
// IOMMU groups

/// A PCIe root port without ACS shares its IOMMU group with the endpoint
/// below it; the port stays on `pcieport`. The kernel counts that group as
/// viable (a bridge is not a DMA master: before 5.19 `vfio_dev_driver_allowed`
/// lets any non-type-0 header through, since 5.19 pcieport has
/// `driver_managed_dma`), so the NVMe controller is usable through VFIO. The
/// sysfs check must agree, or `Controller::open` refuses it with
/// `GroupNotViable` and `setup status` tells the user to take the root port
/// away from pcieport.
#[test]
fn a_bridge_on_pcieport_in_the_group_does_not_make_it_unviable() {
    let t = Tree::new();
    t.device("0000:00:1c.0", "0x060400", Some("pcieport"), Some(12));
    t.device("0000:02:00.0", NVME, Some("vfio-pci"), Some(12));
    let s = Sysfs::at(t.root.join("sys"));
    assert_eq!(
        s.group_blockers(12, &addr("0000:02:00.0")),
        Vec::<String>::new(),
        "a bridge bound to pcieport does not keep the group from VFIO"
    );
    assert_eq!(s.check_vfio_ready(&addr("0000:02:00.0")).ok(), Some(12));
    let c = t.host().controller(&addr("0000:02:00.0")).unwrap();
    assert!(c.group_viable() && c.ready(), "{:?}", c.blockers);
}

/// Endpoints of the group bound to a host driver do block it, whatever the
/// driver's name looks like; only vfio-pci, pci-stub and no driver are
/// allowed (exact names, not prefixes). The library names each blocker.
#[test]
fn group_members_on_host_drivers_block_and_are_named_exactly() {
    let t = Tree::new();
    t.device("0000:00:08.0", NVME, Some("vfio-pci"), Some(6));
    t.device("0000:00:08.1", "0x0c0330", Some("pci-stubby"), Some(6));
    t.device("0000:00:08.2", "0x0c0330", Some("pci-stub"), Some(6));
    t.device("0000:00:08.3", "0x0c0330", None, Some(6));
    t.device("0000:00:08.4", "0x0c0330", Some("vfio-pci"), Some(6));
    t.device("0000:00:08.5", "0x0c0330", Some("vfio"), Some(6));
    let s = Sysfs::at(t.root.join("sys"));
    let e = s.check_vfio_ready(&addr("0000:00:08.0")).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(&e, upnvme::dma::DmaError::GroupNotViable { group: 6, others, .. }
            if others == &["0000:00:08.1 (bound to pci-stubby)", "0000:00:08.5 (bound to vfio)"]),
        "{msg}"
    );
    let c = t.host().controller(&addr("0000:00:08.0")).unwrap();
    assert!(!c.ready());
    assert_eq!(c.group_members.len(), 5);
}

// ---------------------------------------------------------------------------
// PCI addresses

/// Uppercase hex, the short form without a domain, unpadded fields and
/// surrounding whitespace all name the same sysfs directory (lowercase,
/// padded), and `resolve_targets` folds them into one target.
#[test]
fn address_spellings_normalise_to_the_sysfs_name_and_fold() {
    for s in [
        "0000:3B:00.0",
        "3b:00.0",
        "3B:0.0",
        "0:3b:0.0",
        " 0000:3b:00.0\n",
    ] {
        assert_eq!(addr(s).to_string(), "0000:3b:00.0", "{s:?}");
    }
    assert_eq!(addr("ABCD:ff:1f.7").to_string(), "abcd:ff:1f.7");
    let t = Tree::new();
    t.device("0000:3b:00.0", NVME, Some("nvme"), Some(3));
    t.device("0001:3b:00.0", NVME, Some("nvme"), Some(4));
    let r = resolve_targets(
        &t.host(),
        &[
            "0000:3B:00.0".into(),
            "3b:00.0".into(),
            "0001:3b:00.0".into(),
        ],
    )
    .unwrap();
    let got: Vec<String> = r.iter().map(|c| c.address().to_string()).collect();
    assert_eq!(
        got,
        ["0000:3b:00.0", "0001:3b:00.0"],
        "another domain is another device"
    );
}

/// Intel VMD puts the NVMe controllers behind it in PCI domains above
/// 0xffff (`10000:e1:00.0` in sysfs and `lspci -D`). `setup status` must
/// not claim there is no NVMe controller on such a machine.
#[test]
fn a_controller_in_a_domain_above_ffff_is_listed() {
    let t = Tree::new();
    t.device("10000:e1:00.0", NVME, Some("nvme"), None);
    let cs = t.host().controllers().unwrap();
    assert_eq!(
        cs.len(),
        1,
        "sysfs has 10000:e1:00.0, an NVMe controller behind VMD; setup status shows none"
    );
}

// ---------------------------------------------------------------------------
// In use

/// A process doing I/O through the namespace's generic character device
/// (`/dev/ng0n1`: fio's io_uring_cmd engine, xNVMe, nvme-cli passthru)
/// loses its device when the controller is bound away, like one holding
/// `/dev/nvme0n1`; `bind` must refuse it and name the process.
#[test]
fn a_process_on_the_generic_char_device_keeps_the_controller_in_use() {
    let t = Tree::new();
    t.device("0000:00:05.0", NVME, Some("nvme"), Some(4));
    t.namespace("0000:00:05.0", 0, 1, 0);
    // The generic device sits beside the block device under nvme/nvme0.
    t.write(
        "sys/bus/pci/devices/0000:00:05.0/nvme/nvme0/ng0n1/dev",
        "242:0\n",
    );
    t.process(555, "fio", &["/dev/ng0n1"]);
    let host = t.host();
    let c = host.controller(&addr("0000:00:05.0")).unwrap();
    let r = bind_refusal(&c, &host.iommu());
    assert!(
        r.as_deref()
            .is_some_and(|r| r.contains("ng0n1") && r.contains("pid 555 (fio)")),
        "bind would pull /dev/ng0n1 from under pid 555: refusal {r:?}"
    );
}

/// The root file system on LVM on a partition: nothing is mounted from the
/// NVMe device itself, its partition is held by dm-0. `bind` refuses it
/// with the reason, and a refusal of one address changes nothing for the
/// others named with it (no attribute written, no unbind, no probe).
#[test]
fn a_refusal_of_one_address_changes_nothing_for_any() {
    let t = Tree::new();
    t.device("0000:00:05.0", NVME, Some("nvme"), Some(4));
    t.device("0000:00:06.0", NVME, Some("nvme"), Some(5));
    let ns = t.namespace("0000:00:05.0", 0, 1, 3);
    fs::create_dir_all(ns.join("nvme0n1p3/holders/dm-0")).unwrap();
    t.write(
        "proc/self/mountinfo",
        "22 1 253:0 / / rw,relatime - ext4 /dev/mapper/vg-root rw\n",
    );
    let k = Kernel::start(&t, &["nvme", "vfio-pci"]);
    let host = t.host();
    let e = bind(&host, &["0000:00:06.0".into(), "0000:00:05.0".into()]).unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("nvme0n1p3 is held by dm-0") && msg.ends_with("; nothing was changed"),
        "{msg}"
    );
    assert_eq!(k.log(), Vec::<String>::new());
    assert_eq!(override_of(&t, "0000:00:06.0"), "(null)\n");
    assert_eq!(driver_of(&t, "0000:00:06.0").as_deref(), Some("nvme"));
    assert_eq!(driver_of(&t, "0000:00:05.0").as_deref(), Some("nvme"));
}

/// `bind` without addresses skips a controller whose namespace is mounted
/// (and does not write to it at all) and binds the free one.
#[test]
fn bind_without_addresses_skips_what_is_in_use_and_binds_the_rest() {
    let t = Tree::new();
    t.device("0000:00:05.0", NVME, Some("nvme"), Some(4));
    t.device("0000:00:06.0", NVME, Some("nvme"), Some(5));
    t.namespace("0000:00:05.0", 0, 1, 1);
    t.namespace("0000:00:06.0", 1, 1, 0);
    t.write(
        "proc/self/mountinfo",
        "22 1 259:11 / / rw - ext4 /dev/nvme0n1p1 rw\n",
    );
    let k = Kernel::start(&t, &["nvme", "vfio-pci"]);
    bind(&t.host(), &[]).unwrap();
    assert_eq!(driver_of(&t, "0000:00:05.0").as_deref(), Some("nvme"));
    assert_eq!(override_of(&t, "0000:00:05.0"), "(null)\n");
    assert_eq!(driver_of(&t, "0000:00:06.0").as_deref(), Some("vfio-pci"));
    assert_eq!(
        k.log(),
        ["unbind nvme 0000:00:06.0", "probe 0000:00:06.0 -> vfio-pci"]
    );
}

// ---------------------------------------------------------------------------
// bind and unbind: idempotence, reversal, failures

/// bind, bind again, unbind, unbind again: the second of each changes
/// nothing (no unbind, no probe), and unbind undoes bind (driver nvme,
/// driver_override cleared).
#[test]
fn bind_and_unbind_are_idempotent_and_unbind_reverses_bind() {
    let t = Tree::new();
    t.device("0000:00:05.0", NVME, Some("nvme"), Some(4));
    let k = Kernel::start(&t, &["nvme", "vfio-pci"]);
    let host = t.host();
    let a = ["0000:00:05.0".to_string()];
    bind(&host, &a).unwrap();
    assert_eq!(driver_of(&t, &a[0]).as_deref(), Some("vfio-pci"));
    assert_eq!(override_of(&t, &a[0]).trim(), "vfio-pci");
    assert_eq!(
        k.log(),
        ["unbind nvme 0000:00:05.0", "probe 0000:00:05.0 -> vfio-pci"]
    );
    k.clear_log();
    // The override as the kernel shows it (with its newline): not rewritten.
    fs::write(
        t.root
            .join("sys/bus/pci/devices/0000:00:05.0/driver_override"),
        "vfio-pci\n",
    )
    .unwrap();
    bind(&host, &a).unwrap();
    assert_eq!(k.log(), Vec::<String>::new());
    assert_eq!(
        override_of(&t, &a[0]),
        "vfio-pci\n",
        "rewritten although already set"
    );

    unbind(&host, &[]).unwrap();
    assert_eq!(driver_of(&t, &a[0]).as_deref(), Some("nvme"));
    assert_eq!(override_of(&t, &a[0]).trim(), "");
    assert_eq!(
        k.log(),
        ["unbind vfio-pci 0000:00:05.0", "probe 0000:00:05.0 -> nvme"]
    );
    k.clear_log();
    t.write(
        "sys/bus/pci/devices/0000:00:05.0/driver_override",
        "(null)\n",
    );
    unbind(&host, &a).unwrap();
    unbind(&host, &[]).unwrap();
    assert_eq!(k.log(), Vec::<String>::new());
}

/// vfio-pci does not take the controller: bind puts it back on nvme with
/// its driver_override as before and says so; with two addresses, the one
/// on vfio-pci before the failure is named (as already there: this bind
/// did not move it, so no command to hand it back).
#[test]
fn a_bind_vfio_pci_refuses_puts_the_controller_back_and_names_what_stays_bound() {
    let t = Tree::new();
    t.device("0000:00:04.0", NVME, Some("nvme"), Some(3));
    t.device("0000:00:05.0", NVME, Some("nvme"), Some(4));
    let k = Kernel::start(&t, &["nvme", "vfio-pci"]);
    let host = t.host();
    // Refused only for the second controller: the fake kernel refuses by
    // driver, so the first is bound before the refusal is switched on.
    bind(&host, &["0000:00:04.0".into()]).unwrap();
    k.behaviour.lock().unwrap().refuse.push("vfio-pci".into());
    let c = host.controller(&addr("0000:00:05.0")).unwrap();
    let e = bind_one(&host, &c).unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.starts_with("0000:00:05.0 did not bind to vfio-pci")
            && msg.ends_with("; nothing was changed (0000:00:05.0 is on nvme again)"),
        "{msg}"
    );
    assert_eq!(driver_of(&t, "0000:00:05.0").as_deref(), Some("nvme"));
    assert_eq!(override_of(&t, "0000:00:05.0").trim(), "");
    // The same through `bind` with both addresses (the first already bound).
    let e = bind(&host, &["0000:00:04.0".into(), "0000:00:05.0".into()]).unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains(
            "\ndone before this failure: 0000:00:04.0 (already on vfio-pci)\nfailed: 0000:00:05.0"
        ),
        "{msg}"
    );
    assert_eq!(driver_of(&t, "0000:00:05.0").as_deref(), Some("nvme"));
}

/// The controller is on nvme with a stale `driver_override` of vfio-pci
/// (the first step of docs/setup.md's "By hand" done, not the rest; or a
/// `driverctl` leftover). vfio-pci then refuses it. Undoing the bind must
/// not leave it without any driver: it was on nvme, it should be on nvme
/// again (the override it had can be put back once nvme holds it).
#[test]
fn a_failed_bind_over_a_stale_vfio_override_does_not_leave_the_controller_driverless() {
    let t = Tree::new();
    t.device("0000:00:05.0", NVME, Some("nvme"), Some(4));
    t.write(
        "sys/bus/pci/devices/0000:00:05.0/driver_override",
        "vfio-pci\n",
    );
    let k = Kernel::start(&t, &["nvme", "vfio-pci"]);
    k.behaviour.lock().unwrap().refuse.push("vfio-pci".into());
    let host = t.host();
    let c = host.controller(&addr("0000:00:05.0")).unwrap();
    let e = bind_one(&host, &c).unwrap_err();
    assert_eq!(
        driver_of(&t, "0000:00:05.0").as_deref(),
        Some("nvme"),
        "left without a driver; error: {e:#}; kernel log: {:?}",
        k.log()
    );
}

/// The controller is hot-removed while bind moves it. The error must say
/// so instead of sending the user to `upnvme setup unbind`, which can only
/// answer "no PCI device".
#[test]
fn a_controller_that_vanishes_during_bind_is_reported_gone() {
    let t = Tree::new();
    t.device("0000:00:05.0", NVME, Some("nvme"), Some(4));
    let k = Kernel::start(&t, &["nvme", "vfio-pci"]);
    k.behaviour.lock().unwrap().vanish_on_unbind = true;
    let host = t.host();
    let c = host.controller(&addr("0000:00:05.0")).unwrap();
    let e = bind_one(&host, &c).unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        (msg.contains("no longer") || msg.contains("disappeared") || msg.contains("gone"))
            && !msg.contains("`upnvme setup unbind 0000:00:05.0` clears it"),
        "{msg}"
    );
}

/// Without the nvme driver, unbind leaves the controller without a driver,
/// says to `modprobe nvme` and run it again with the address; doing so
/// hands it to nvme. Without addresses the driverless controller is not a
/// target any more (nothing is bound to vfio-pci).
#[test]
fn unbind_without_nvme_says_how_to_finish_and_finishing_works() {
    let t = Tree::new();
    t.device("0000:00:05.0", NVME, Some("vfio-pci"), Some(4));
    t.write(
        "sys/bus/pci/devices/0000:00:05.0/driver_override",
        "vfio-pci\n",
    );
    let k = Kernel::start(&t, &["vfio-pci"]);
    let host = t.host();
    unbind(&host, &[]).unwrap();
    assert_eq!(driver_of(&t, "0000:00:05.0"), None);
    assert_eq!(override_of(&t, "0000:00:05.0").trim(), "");
    // `modprobe nvme`.
    fs::create_dir_all(t.root.join("sys/bus/pci/drivers/nvme")).unwrap();
    k.clear_log();
    unbind(&host, &[]).unwrap();
    assert_eq!(k.log(), Vec::<String>::new());
    unbind(&host, &["0000:00:05.0".into()]).unwrap();
    assert_eq!(driver_of(&t, "0000:00:05.0").as_deref(), Some("nvme"));
    assert_eq!(k.log(), ["probe 0000:00:05.0 -> nvme"]);
}

/// unbind refuses while a process holds the VFIO group open and changes
/// nothing, for every address given.
#[test]
fn unbind_refuses_an_open_group_and_changes_nothing() {
    let t = Tree::new();
    t.device("0000:00:04.0", NVME, Some("vfio-pci"), Some(3));
    t.device("0000:00:05.0", NVME, Some("vfio-pci"), Some(4));
    t.process(77, "upnvme", &["/dev/vfio/vfio", "/dev/vfio/4"]);
    let k = Kernel::start(&t, &["nvme", "vfio-pci"]);
    let e = unbind(&t.host(), &[]).unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("/dev/vfio/4 is open by pid 77 (upnvme)")
            && msg.ends_with("nothing was changed"),
        "{msg}"
    );
    assert_eq!(k.log(), Vec::<String>::new());
    assert_eq!(driver_of(&t, "0000:00:04.0").as_deref(), Some("vfio-pci"));
    assert_eq!(override_of(&t, "0000:00:04.0"), "(null)\n");
}

// ---------------------------------------------------------------------------
// Hugepages

fn hugepage_file(t: &Tree, kib: u64, f: &str) -> String {
    fs::read_to_string(
        t.root
            .join(format!("sys/kernel/mm/hugepages/hugepages-{kib}kB/{f}")),
    )
    .unwrap()
}

/// `status` with every 2 MiB page reserved and in use suggests a count to
/// reserve: that count must add pages. `upnvme setup hugepages 512` with
/// 1024 reserved lowers the reservation instead.
#[test]
fn status_never_suggests_a_hugepage_count_below_the_reservation() {
    let t = Tree::new();
    t.hugepages(2048, 1024, 0);
    let text = Status::read(&t.host()).unwrap().text();
    let line = text
        .lines()
        .find(|l| l.contains("no free 2 MiB hugepage"))
        .unwrap_or_else(|| panic!("{text}"));
    let n: u64 = line
        .split("upnvme setup hugepages ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(n > 1024, "{line}: 1024 are reserved already");
}

/// A size the kernel does not offer is an error listing the sizes offered
/// (with the pdpe1gb hint for 1 GiB); nothing is written.
#[test]
fn hugepages_of_a_size_not_offered_lists_the_sizes_offered() {
    let t = Tree::new();
    t.hugepages(2048, 4, 4);
    let e = hugepages(&t.host(), 2, 1 << 20).unwrap_err();
    assert_eq!(
        format!("{e:#}"),
        "the kernel offers no 1 GiB hugepages (1 GiB pages need a CPU with the pdpe1gb flag); sizes offered: 2 MiB"
    );
    let t = Tree::new();
    let e = hugepages(&t.host(), 2, 2048).unwrap_err();
    assert!(format!("{e:#}").ends_with("none (a kernel without CONFIG_HUGETLBFS)"));
}

/// A request beyond MemAvailable + reserved is a usage error (exit 2) and
/// the pool is not written; the same count twice and a lower count pass
/// and write the count as a decimal number.
#[test]
fn hugepages_checks_before_writing_and_is_idempotent() {
    let t = Tree::new();
    t.hugepages(2048, 100, 100);
    t.hugepages(1 << 20, 0, 0);
    t.write(
        "proc/meminfo",
        "MemTotal: 4000000 kB\nMemFree: 1100000 kB\nMemAvailable: 1024000 kB\n",
    );
    let host = t.host();
    let e = hugepages(&host, 601, 2048).unwrap_err();
    assert!(
        e.downcast_ref::<crate::usage::UsageError>().is_some(),
        "{e:#}"
    );
    assert!(format!("{e:#}").contains("ask for at most 600"), "{e:#}");
    assert_eq!(hugepage_file(&t, 2048, "nr_hugepages"), "100\n");
    hugepages(&host, 600, 2048).unwrap();
    assert_eq!(hugepage_file(&t, 2048, "nr_hugepages"), "600");
    hugepages(&host, 600, 2048).unwrap();
    hugepages(&host, 10, 2048).unwrap();
    assert_eq!(hugepage_file(&t, 2048, "nr_hugepages"), "10");
    // 1 GiB pages: 1000 MiB available gives no whole page.
    let e = hugepages(&host, 1, 1 << 20).unwrap_err();
    assert!(format!("{e:#}").contains("ask for at most 0"), "{e:#}");
    assert_eq!(hugepage_file(&t, 1 << 20, "nr_hugepages"), "0\n");
}

/// The arithmetic holds at the edges of u64: no overflow, no wrap into a
/// small number that would pass.
#[test]
fn hugepage_arithmetic_at_the_edges() {
    let gib = 1u64 << 20;
    let e = hugepage_request_check(u64::MAX, 2048, 0, Some(u64::MAX)).unwrap_err();
    assert!(
        e.contains(&format!("ask for at most {}", u64::MAX / 2048)),
        "{e}"
    );
    assert!(
        e.contains(&format!("({} MiB)", u128::from(u64::MAX) * 2048 / 1024)),
        "{e}"
    );
    assert_eq!(
        hugepage_request_check(u64::MAX, gib, u64::MAX - 1, Some(gib)),
        Ok(())
    );
    assert_eq!(
        hugepage_request_check(5, gib, 7, Some(0)),
        Ok(()),
        "lowering"
    );
    let big = HugePool {
        size_kib: gib,
        reserved: u64::MAX,
        free: 0,
        surplus: 0,
    };
    let note = hugepage_verdict(1, gib, u64::MAX, &big, Ok(u64::MAX), Some(u64::MAX))
        .unwrap()
        .unwrap();
    assert!(
        note.starts_with(&format!("{} 1 GiB hugepages", u64::MAX - 1)),
        "{note}"
    );
}

/// `Host` reads sysfs values the way the kernel writes them: trailing
/// newlines, `(null)` for no override, an empty override, missing files.
#[test]
fn sysfs_contents_with_newlines_nulls_and_missing_files() {
    let t = Tree::new();
    t.device("0000:00:05.0", NVME, Some("nvme"), Some(4));
    let host: Host = t.host();
    let over = |s: &str| {
        t.write("sys/bus/pci/devices/0000:00:05.0/driver_override", s);
        host.controller(&addr("0000:00:05.0"))
            .unwrap()
            .driver_override
    };
    assert_eq!(over("(null)\n"), None);
    assert_eq!(over("\n"), None);
    assert_eq!(over("vfio-pci\n"), Some("vfio-pci".into()));
    fs::remove_file(
        t.root
            .join("sys/bus/pci/devices/0000:00:05.0/driver_override"),
    )
    .unwrap();
    assert_eq!(
        host.controller(&addr("0000:00:05.0"))
            .unwrap()
            .driver_override,
        None
    );
    // A device whose class cannot be read is named in the error.
    fs::remove_file(t.root.join("sys/bus/pci/devices/0000:00:05.0/class")).unwrap();
    let e = host.controller(&addr("0000:00:05.0")).unwrap_err();
    assert!(format!("{e:#}").contains("0000:00:05.0/class"), "{e:#}");
    assert!(host.controllers().unwrap().is_empty());
}

// ---------------------------------------------------------------------------
// Userspace drivers: uio, the VFIO device cdev (iommufd)

/// SPDK or DPDK drives a controller through uio_pci_generic (or igb_uio)
/// and holds its `/dev/uioN` (sysfs `uio/uioN` of the function). Taking
/// the controller away pulls it from under that process: `bind` (and
/// `unbind` with its address) must refuse and name the process, and status
/// say so. One that nobody holds is bound, also without addresses; status
/// shows its driver.
#[test]
fn a_controller_held_through_uio_is_in_use_and_a_free_one_is_bound() {
    let t = Tree::new();
    t.device("0000:00:05.0", NVME, Some("uio_pci_generic"), Some(4));
    t.device("0000:00:06.0", NVME, Some("igb_uio"), Some(5));
    t.write("sys/bus/pci/devices/0000:00:05.0/uio/uio0/dev", "243:0\n");
    t.write("sys/bus/pci/devices/0000:00:06.0/uio/uio1/dev", "243:1\n");
    t.process(555, "spdk_tgt", &["/dev/hugepages/x", "/dev/uio0"]);
    let k = Kernel::start(&t, &["nvme", "vfio-pci", "uio_pci_generic", "igb_uio"]);
    let host = t.host();
    let c = host.controller(&addr("0000:00:05.0")).unwrap();
    let r = bind_refusal(&c, &host.iommu()).unwrap_or_default();
    assert_eq!(
        r,
        "refusing to bind 0000:00:05.0 to vfio-pci: a userspace driver uses it through uio_pci_generic, and binding would pull the device from under it: /dev/uio0 is open by pid 555 (spdk_tgt) (a userspace driver such as SPDK or DPDK, through uio_pci_generic): stop that process first; then run `upnvme setup bind 0000:00:05.0` again"
    );
    let r = unbind_refusal(&c).unwrap_or_default();
    assert!(
        r.contains("/dev/uio0 is open by pid 555 (spdk_tgt)"),
        "unbind would pull it from under spdk_tgt too: {r:?}"
    );
    let text = Status::read(&host).unwrap().text();
    assert!(
        text.contains("0000:00:05.0: in use by a userspace driver through uio_pci_generic, leave it there or free it first: /dev/uio0 is open by pid 555 (spdk_tgt)"),
        "{text}"
    );
    assert!(
        text.contains("0000:00:06.0: on igb_uio, which no process holds: bind it with `upnvme setup bind 0000:00:06.0`"),
        "{text}"
    );
    assert!(
        text.contains("  0000:00:05.0  1b36:0010  uio_pci_generic -             4 yes"),
        "the Driver column fits the driver: {text}"
    );
    let e = bind(&host, &["0000:00:05.0".into()]).unwrap_err();
    assert!(format!("{e:#}").ends_with("; nothing was changed"), "{e:#}");
    assert_eq!(k.log(), Vec::<String>::new());
    // Without addresses the held one is skipped, the free one bound.
    bind(&host, &[]).unwrap();
    assert_eq!(
        driver_of(&t, "0000:00:05.0").as_deref(),
        Some("uio_pci_generic")
    );
    assert_eq!(driver_of(&t, "0000:00:06.0").as_deref(), Some("vfio-pci"));
    assert_eq!(
        k.log(),
        [
            "unbind igb_uio 0000:00:06.0",
            "probe 0000:00:06.0 -> vfio-pci"
        ]
    );
}

/// A VMM or userspace driver on the iommufd interface opens the function's
/// VFIO device cdev (`/dev/vfio/devices/vfioX`, sysfs `vfio-dev/vfioX`),
/// not the group: `unbind` must refuse it as it refuses an open group, and
/// status name the process.
#[test]
fn a_process_on_the_vfio_device_cdev_holds_the_controller_like_the_group() {
    let t = Tree::new();
    t.device("0000:00:04.0", NVME, Some("vfio-pci"), Some(3));
    t.device("0000:00:05.0", NVME, Some("vfio-pci"), Some(4));
    t.write(
        "sys/bus/pci/devices/0000:00:04.0/vfio-dev/vfio0/dev",
        "511:0\n",
    );
    t.write(
        "sys/bus/pci/devices/0000:00:05.0/vfio-dev/vfio1/dev",
        "511:1\n",
    );
    t.process(
        88,
        "qemu-system-x86",
        &["/dev/iommu", "/dev/vfio/devices/vfio0"],
    );
    let k = Kernel::start(&t, &["nvme", "vfio-pci"]);
    let host = t.host();
    let c = host.controller(&addr("0000:00:04.0")).unwrap();
    assert_eq!(
        unbind_refusal(&c).as_deref(),
        Some(
            "refusing to unbind 0000:00:04.0: its VFIO device /dev/vfio/devices/vfio0 is open by pid 88 (qemu-system-x86) (unbinding would wait until it is closed); stop that process first, then run `upnvme setup unbind 0000:00:04.0` again"
        )
    );
    let e = unbind(&host, &[]).unwrap_err();
    let msg = format!("{e:#}");
    assert!(msg.ends_with("nothing was changed"), "{msg}");
    assert_eq!(k.log(), Vec::<String>::new());
    assert_eq!(driver_of(&t, "0000:00:05.0").as_deref(), Some("vfio-pci"));
    let s = Status::read(&host).unwrap();
    let text = s.text();
    assert!(
        text.contains("0000:00:04.0: open by pid 88 (qemu-system-x86)"),
        "{text}"
    );
    assert!(!text.contains("0000:00:05.0: open by"), "{text}");
}

// ---------------------------------------------------------------------------
// Several addresses: what moved when one fails

/// Controllers 04.0, 05.0 and 06.0 (IOMMU groups 3 to 5) on `driver`;
/// 05.0's driver_override cannot be written (a directory stands where the
/// attribute was), so moving it fails.
fn three_with_a_stuck_middle(t: &Tree, driver: &str) {
    for (a, g) in [
        ("0000:00:04.0", 3),
        ("0000:00:05.0", 4),
        ("0000:00:06.0", 5),
    ] {
        t.device(a, NVME, Some(driver), Some(g));
    }
    let over = t
        .root
        .join("sys/bus/pci/devices/0000:00:05.0/driver_override");
    fs::remove_file(&over).unwrap();
    fs::create_dir(&over).unwrap();
}

/// The progress lines of a multi-address bind or unbind that failed at
/// 05.0: what was done before, the failure, what was not tried.
#[track_caller]
fn assert_progress(msg: &str, done: &str, not_tried: &str) {
    assert!(
        msg.contains(&format!("\ndone before this failure: {done}")),
        "{msg}"
    );
    assert!(
        msg.contains("\nfailed: 0000:00:05.0 (the error above)"),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("\nnot tried, left as they were: {not_tried}")),
        "{msg}"
    );
}

/// `unbind A B C` where B fails (its driver_override cannot be written):
/// A has moved, C was not tried. The error must say so, with the commands
/// that undo A and finish the rest.
#[test]
fn a_multi_address_unbind_that_fails_half_way_names_what_moved_and_what_did_not() {
    let t = Tree::new();
    three_with_a_stuck_middle(&t, "vfio-pci");
    let _k = Kernel::start(&t, &["nvme", "vfio-pci"]);
    let all: Vec<String> = ["0000:00:04.0", "0000:00:05.0", "0000:00:06.0"]
        .map(String::from)
        .to_vec();
    let e = unbind(&t.host(), &all).unwrap_err();
    assert_progress(
        &format!("{e:#}"),
        "0000:00:04.0 (vfio-pci -> nvme); `upnvme setup bind 0000:00:04.0` undoes it",
        "0000:00:06.0 (on vfio-pci); `upnvme setup unbind 0000:00:05.0 0000:00:06.0` finishes once the failure is fixed",
    );
    assert_eq!(driver_of(&t, "0000:00:04.0").as_deref(), Some("nvme"));
    assert_eq!(driver_of(&t, "0000:00:06.0").as_deref(), Some("vfio-pci"));
}

/// The same for `bind A B C D`: A was already on vfio-pci (not moved, not
/// undone), B moved, C failed, D untouched.
#[test]
fn a_multi_address_bind_that_fails_half_way_names_what_moved_and_what_did_not() {
    let t = Tree::new();
    t.device("0000:00:03.0", NVME, Some("vfio-pci"), Some(2));
    three_with_a_stuck_middle(&t, "nvme");
    let _k = Kernel::start(&t, &["nvme", "vfio-pci"]);
    let all: Vec<String> = [
        "0000:00:03.0",
        "0000:00:04.0",
        "0000:00:05.0",
        "0000:00:06.0",
    ]
    .map(String::from)
    .to_vec();
    let e = bind(&t.host(), &all).unwrap_err();
    assert_progress(
        &format!("{e:#}"),
        "0000:00:03.0 (already on vfio-pci), 0000:00:04.0 (nvme -> vfio-pci); `upnvme setup unbind 0000:00:04.0` undoes it",
        "0000:00:06.0 (on nvme); `upnvme setup bind 0000:00:05.0 0000:00:06.0` finishes once the failure is fixed",
    );
    assert_eq!(driver_of(&t, "0000:00:04.0").as_deref(), Some("vfio-pci"));
    assert_eq!(driver_of(&t, "0000:00:06.0").as_deref(), Some("nvme"));
}

// ---------------------------------------------------------------------------
// IOMMU group blockers the machine depends on; Intel VMD

/// The controller's IOMMU group also holds the NIC carrying the network and
/// the SATA controller of the root file system (and an NVMe controller with
/// /home). The advice must not say to unbind those: it says what they
/// carry. A NIC whose interface is down, and a USB controller, are plain
/// blockers.
#[test]
fn group_blockers_carrying_the_network_or_a_mounted_disk_are_named_as_such() {
    let t = Tree::new();
    let dev = |a: &str| format!("sys/bus/pci/devices/{a}");
    t.device("0000:00:03.0", NVME, Some("nvme"), Some(1));
    t.device("0000:00:03.1", "0x020000", Some("e1000e"), Some(1));
    t.write(
        &format!("{}/net/eth0/operstate", dev("0000:00:03.1")),
        "up\n",
    );
    t.device("0000:00:03.2", "0x010601", Some("ahci"), Some(1));
    let sda = format!(
        "{}/ata1/host0/target0:0:0/0:0:0:0/block/sda",
        dev("0000:00:03.2")
    );
    t.write(&format!("{sda}/dev"), "8:0\n");
    t.write(&format!("{sda}/sda2/partition"), "2\n");
    t.write(&format!("{sda}/sda2/dev"), "8:2\n");
    t.device("0000:00:03.3", "0x020000", Some("virtio-pci"), Some(1));
    t.write(
        &format!("{}/virtio0/net/eth1/operstate", dev("0000:00:03.3")),
        "down\n",
    );
    t.device("0000:00:03.4", "0x0c0330", Some("xhci_hcd"), Some(1));
    t.write(
        "proc/self/mountinfo",
        "22 1 8:2 / / rw - ext4 /dev/sda2 rw\n",
    );
    let s = Status::read(&t.host()).unwrap();
    let text = s.text();
    assert!(
        text.contains("0000:00:03.1 carries the network interface eth0 which is up: moving it to vfio-pci cuts this machine off"),
        "{text}"
    );
    assert!(
        text.contains("0000:00:03.2 carries sda2 mounted at / (the root file system): moving it to vfio-pci pulls that file system from under the running system"),
        "{text}"
    );
    assert!(
        !text.contains("0000:00:03.1 (bound to e1000e), 0000:00:03.2 (bound to ahci)")
            && !text.contains("must be bound to vfio-pci or unbound too"),
        "no unbind advice for the NIC and the root disk: {text}"
    );
    assert!(
        text.contains("0000:00:03.3 (bound to virtio-pci), 0000:00:03.4 (bound to xhci_hcd)"),
        "{text}"
    );
    assert!(
        text.contains("leave those devices where they are: use 0000:00:03.0 through the kernel's nvme driver, or move it to a slot with an IOMMU group of its own"),
        "{text}"
    );
    assert!(
        !text.contains("bind it with `upnvme setup bind 0000:00:03.0`"),
        "binding cannot make the group viable: {text}"
    );
    let v = s.json();
    let vital = v["controllers"][0]["group_blockers_vital"]
        .as_array()
        .unwrap();
    assert_eq!(vital.len(), 2, "{vital:?}");
    // An NVMe blocker with a mounted namespace is named likewise.
    let t = Tree::new();
    t.device("0000:00:04.0", NVME, Some("nvme"), Some(2));
    t.device("0000:00:04.1", NVME, Some("nvme"), Some(2));
    t.namespace("0000:00:04.1", 1, 1, 0);
    t.write(
        "proc/self/mountinfo",
        "23 22 259:10 / /home rw - xfs /dev/nvme1n1 rw\n",
    );
    let c = t.host().controller(&addr("0000:00:04.0")).unwrap();
    let a = Status::read(&t.host())
        .unwrap()
        .advice(&c)
        .unwrap_or_default();
    assert!(
        a.contains("0000:00:04.1 carries nvme1n1 mounted at /home: moving it to vfio-pci pulls that file system from under the running system"),
        "{a}"
    );
    // Interfaces down, nothing mounted: the plain advice.
    t.write("proc/self/mountinfo", "");
    let c = t.host().controller(&addr("0000:00:04.0")).unwrap();
    let a = Status::read(&t.host())
        .unwrap()
        .advice(&c)
        .unwrap_or_default();
    assert!(
        a.contains("IOMMU group 2 is not viable: 0000:00:04.1 (bound to nvme) must be bound to vfio-pci or unbound too"),
        "{a}"
    );
}

/// Intel VMD: a controller in PCI domain 10000h or above sits behind the
/// VMD endpoint, which owns its DMA; it cannot go to vfio-pci on its own.
/// status marks it, `bind` refuses it (with its address) or skips it
/// (without), and nothing is written.
#[test]
fn a_controller_behind_intel_vmd_is_marked_and_not_bound() {
    let t = Tree::new();
    t.device("10000:e1:00.0", NVME, Some("nvme"), Some(7));
    t.device("0000:00:05.0", NVME, Some("vfio-pci"), Some(4));
    let k = Kernel::start(&t, &["nvme", "vfio-pci"]);
    let host = t.host();
    let c = host.controller(&addr("10000:e1:00.0")).unwrap();
    let r = bind_refusal(&c, &host.iommu()).unwrap_or_default();
    assert!(
        r.starts_with("refusing to bind 10000:e1:00.0 to vfio-pci: it is behind Intel VMD: not assignable to vfio-pci on its own"),
        "{r}"
    );
    let e = bind(&host, &["10000:e1:00.0".into()]).unwrap_err();
    assert!(format!("{e:#}").contains("behind Intel VMD"), "{e:#}");
    bind(&host, &[]).unwrap();
    assert_eq!(k.log(), Vec::<String>::new());
    assert_eq!(driver_of(&t, "10000:e1:00.0").as_deref(), Some("nvme"));
    assert_eq!(override_of(&t, "10000:e1:00.0"), "(null)\n");
    let s = Status::read(&host).unwrap();
    let text = s.text();
    assert!(
        text.contains("10000:e1:00.0: behind Intel VMD: not assignable to vfio-pci on its own"),
        "{text}"
    );
    assert_eq!(s.json()["controllers"][1]["behind_vmd"], true, "{text}");
}

/// A kernel that reserves at most 300 pages, whatever is written.
fn kernel_gives_at_most_300(path: &Path, value: &str) -> anyhow::Result<()> {
    let asked: u64 = value.trim().parse()?;
    fs::write(path, format!("{}\n", asked.min(300)))?;
    Ok(())
}

/// `hugepages 1000` with 100 reserved, and the kernel finds 300 pages in
/// all: a failed command changes nothing, so the reservation goes back to
/// 100 (not 300 left behind), and the error says how many the kernel could
/// give, the free memory, and how to keep those. A shortfall below what
/// was reserved writes nothing back.
#[test]
fn a_partly_granted_hugepage_request_is_given_back() {
    let t = Tree::new();
    t.hugepages(2048, 100, 100);
    t.write(
        "proc/meminfo",
        "MemTotal: 8000000 kB\nMemFree: 614400 kB\nMemAvailable: 4000000 kB\n",
    );
    let host = t.host();
    let e = reserve_hugepages(&host, 1000, 2048, kernel_gives_at_most_300).unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.starts_with("only 300 of 1000 2 MiB hugepages could be reserved: the kernel found no more free, contiguous, aligned 2 MiB blocks (600 MiB of memory are free in all); nothing was changed (100 reserved, as before);"),
        "{msg}"
    );
    assert!(
        msg.contains("keep the 300 the kernel could give with `upnvme setup hugepages 300`"),
        "{msg}"
    );
    assert_eq!(hugepage_file(&t, 2048, "nr_hugepages").trim(), "100");
    // Asking for what the kernel can give keeps it.
    reserve_hugepages(&host, 300, 2048, kernel_gives_at_most_300).unwrap();
    assert_eq!(hugepage_file(&t, 2048, "nr_hugepages").trim(), "300");
}

// ---------------------------------------------------------------------------
// Kernel users that neither a process, a mount, a holder nor an exclusive
// claim shows

/// The kernel's NVMe-oF target (nvmet) exporting a namespace over the
/// network, and a loop device over a partition, hold the block device
/// without a file descriptor, a `holders/` link or an exclusive claim (both
/// open it non-exclusively). Binding the controller away pulls the storage
/// from under the remote hosts and under what is on the loop device:
/// `bind` must refuse and say how to stop them. nvmet's passthru target on
/// the controller's `/dev/nvmeX` likewise. A disabled nvmet namespace and a
/// loop device over something else do not count.
#[test]
fn an_nvmet_export_or_a_loop_device_keeps_the_controller_in_use() {
    let t = Tree::new();
    t.device("0000:00:05.0", NVME, Some("nvme"), Some(4));
    t.device("0000:00:06.0", NVME, Some("nvme"), Some(5));
    t.device("0000:00:07.0", NVME, Some("nvme"), Some(6));
    t.namespace("0000:00:05.0", 0, 1, 0);
    t.namespace("0000:00:06.0", 1, 1, 2);
    t.namespace("0000:00:07.0", 2, 1, 0);
    let ns = "sys/kernel/config/nvmet/subsystems/nqn.2024-01.io.test:a/namespaces";
    t.write(&format!("{ns}/1/device_path"), "/dev/nvme0n1\n");
    t.write(&format!("{ns}/1/enable"), "1\n");
    t.write(&format!("{ns}/2/device_path"), "/dev/nvme2n1\n");
    t.write(&format!("{ns}/2/enable"), "0\n");
    t.write("sys/block/loop0/loop/backing_file", "/dev/nvme1n1p2\n");
    t.write("sys/block/loop1/loop/backing_file", "/srv/disk.img\n");
    let k = Kernel::start(&t, &["nvme", "vfio-pci"]);
    let host = t.host();
    let iommu = host.iommu();
    let c = host.controller(&addr("0000:00:05.0")).unwrap();
    let r = bind_refusal(&c, &iommu).unwrap_or_default();
    assert!(
        r.contains("nvme0n1 is exported by the kernel's NVMe-oF target (nvmet subsystem nqn.2024-01.io.test:a, namespace 1)"),
        "{r:?}"
    );
    let c = host.controller(&addr("0000:00:06.0")).unwrap();
    let r = bind_refusal(&c, &iommu).unwrap_or_default();
    assert!(
        r.contains(
            "nvme1n1p2 backs the loop device /dev/loop0: detach it first (`losetup -d /dev/loop0`)"
        ),
        "{r:?}"
    );
    let c = host.controller(&addr("0000:00:07.0")).unwrap();
    assert_eq!(bind_refusal(&c, &iommu), None, "a disabled nvmet namespace");
    // nvmet passthru of the controller itself.
    let pt = "sys/kernel/config/nvmet/subsystems/nqn.2024-01.io.test:pt/passthru";
    t.write(&format!("{pt}/device_path"), "/dev/nvme2\n");
    t.write(&format!("{pt}/enable"), "1\n");
    t.write("sys/bus/pci/devices/0000:00:07.0/nvme/nvme2/dev", "240:2\n");
    let c = host.controller(&addr("0000:00:07.0")).unwrap();
    let r = bind_refusal(&c, &iommu).unwrap_or_default();
    assert!(
        r.contains("/dev/nvme2 is exported by the kernel's NVMe-oF target (nvmet passthru subsystem nqn.2024-01.io.test:pt)"),
        "{r:?}"
    );
    // Without addresses all three are skipped; nothing is written.
    bind(&host, &[]).unwrap();
    assert_eq!(k.log(), Vec::<String>::new());
    let s = Status::read(&host).unwrap();
    let v = s.json();
    assert_eq!(
        v["controllers"][1]["block_devices"][2]["kernel_users"][0],
        "loop0"
    );
}

/// A physical function with SR-IOV virtual functions enabled
/// (`sriov_numvfs` > 0): vfio-pci refuses to bind it ("Cannot bind to PF
/// with SR-IOV enabled", EBUSY), so `bind` used to take it from nvme (a
/// controller shutdown under the VFs that depend on it), watch vfio-pci
/// refuse, and probe nvme again. It must refuse before touching anything,
/// say to disable the VFs, and skip the function without addresses. One
/// on vfio-pci already (VFs enabled through vfio-pci) is left alone.
#[test]
fn a_physical_function_with_vfs_enabled_is_refused_before_anything_is_written() {
    let t = Tree::new();
    t.device("0000:00:05.0", NVME, Some("nvme"), Some(4));
    t.write("sys/bus/pci/devices/0000:00:05.0/sriov_numvfs", "2\n");
    t.device("0000:00:06.0", NVME, Some("vfio-pci"), Some(5));
    t.write("sys/bus/pci/devices/0000:00:06.0/sriov_numvfs", "1\n");
    t.device("0000:00:07.0", NVME, Some("nvme"), Some(6));
    t.write("sys/bus/pci/devices/0000:00:07.0/sriov_numvfs", "0\n");
    let k = Kernel::start(&t, &["nvme", "vfio-pci"]);
    let host = t.host();
    let c = host.controller(&addr("0000:00:05.0")).unwrap();
    let r = bind_refusal(&c, &host.iommu()).unwrap_or_default();
    assert!(
        r.starts_with(
            "refusing to bind 0000:00:05.0 to vfio-pci: SR-IOV is enabled with 2 virtual functions"
        ) && r.contains("echo 0 > /sys/bus/pci/devices/0000:00:05.0/sriov_numvfs"),
        "{r:?}"
    );
    let e = bind(&host, &["0000:00:05.0".into()]).unwrap_err();
    assert!(format!("{e:#}").ends_with("nothing was changed"), "{e:#}");
    assert_eq!(k.log(), Vec::<String>::new());
    assert_eq!(override_of(&t, "0000:00:05.0"), "(null)\n");
    // Without addresses: skipped; the others bound (or left as they are).
    bind(&host, &[]).unwrap();
    assert_eq!(driver_of(&t, "0000:00:05.0").as_deref(), Some("nvme"));
    assert_eq!(
        k.log(),
        ["unbind nvme 0000:00:07.0", "probe 0000:00:07.0 -> vfio-pci"]
    );
    let s = Status::read(&host).unwrap();
    let text = s.text();
    assert!(
        text.contains("0000:00:05.0: SR-IOV is enabled with 2 virtual functions"),
        "{text}"
    );
    assert!(
        !text.contains("bind it with `upnvme setup bind 0000:00:05.0`"),
        "{text}"
    );
    assert_eq!(s.json()["controllers"][0]["sriov_numvfs"], 2);
}

/// `bind A B`: both free when bind checks them, but B's partition is
/// mounted while A is being moved (an administrator in another shell, a
/// mount unit). The check must be made again right before B is moved,
/// not only once for all at the start: B stays on nvme, and the error says
/// why, that A moved and how to undo it.
#[test]
fn a_controller_that_comes_into_use_while_an_earlier_one_moves_is_not_bound() {
    let t = Tree::new();
    t.device("0000:00:04.0", NVME, Some("nvme"), Some(3));
    t.device("0000:00:05.0", NVME, Some("nvme"), Some(4));
    t.namespace("0000:00:05.0", 1, 1, 1);
    t.write("proc/self/mountinfo", "");
    let k = Kernel::start(&t, &["nvme", "vfio-pci"]);
    k.behaviour.lock().unwrap().after_probe = Some((
        "0000:00:04.0".into(),
        t.root.join("proc/self/mountinfo"),
        "23 22 259:11 / /data rw - ext4 /dev/nvme1n1p1 rw\n".into(),
    ));
    let e = bind(&t.host(), &["0000:00:04.0".into(), "0000:00:05.0".into()]).unwrap_err();
    let msg = format!("{e:#}");
    assert_eq!(
        driver_of(&t, "0000:00:05.0").as_deref(),
        Some("nvme"),
        "bound away while mounted at /data: {msg}; {:?}",
        k.log()
    );
    assert_eq!(override_of(&t, "0000:00:05.0"), "(null)\n");
    assert!(
        msg.contains("nvme1n1p1 is mounted at /data")
            && msg.contains("\ndone before this failure: 0000:00:04.0 (nvme -> vfio-pci)"),
        "{msg}"
    );
}

/// A namespace the kernel claims for no visible reason is "(in use)" in
/// the text; the JSON must say so for that block device too, not only in
/// the controller's `in_use` sentences.
#[test]
fn status_json_says_which_block_device_is_claimed() {
    let t = Tree::new();
    t.device("0000:00:05.0", NVME, Some("nvme"), Some(4));
    t.namespace("0000:00:05.0", 0, 1, 0);
    t.namespace("0000:00:05.0", 0, 2, 0);
    let host = t
        .host()
        .with_claim_probe(|n| n == Path::new("/dev/nvme0n2"));
    let s = Status::read(&host).unwrap();
    assert!(
        s.text().contains("nvme0n1 nvme0n2 (in use)"),
        "{}",
        s.text()
    );
    let v = s.json();
    let b = &v["controllers"][0]["block_devices"];
    assert_eq!(b[0]["claimed"], false, "{b}");
    assert_eq!(b[1]["claimed"], true, "{b}");
}

/// A bind whose group node never appears says so, and names the iommufd-only
/// kernel when the function has a VFIO device cdev instead (before, `bind`
/// printed `/dev/vfio/N` as if it existed and `Controller::open` failed later
/// without a word about why).
#[test]
fn a_group_node_that_never_appears_is_explained() {
    let t = Tree::new();
    t.device("0000:00:04.0", NVME, Some("vfio-pci"), Some(3));
    let host = t.host();
    let a = addr("0000:00:04.0");
    let e = group_node_after_bind(&host, &a, 3, Duration::ZERO).unwrap_err();
    assert!(e.contains("vfio/3 did not appear within 0 s"), "{e}");
    assert!(e.contains("cannot open it until it exists"), "{e}");
    t.write(
        "sys/bus/pci/devices/0000:00:04.0/vfio-dev/vfio0/dev",
        "511:0\n",
    );
    let e = group_node_after_bind(&host, &a, 3, Duration::ZERO).unwrap_err();
    assert!(
        e.contains("has the VFIO device cdev") && e.contains("vfio/devices/vfio0"),
        "{e}"
    );
    assert!(e.contains("CONFIG_VFIO_GROUP"), "{e}");
    t.write("dev/vfio/3", "");
    let node = group_node_after_bind(&host, &a, 3, Duration::ZERO).unwrap();
    assert!(node.ends_with("dev/vfio/3"), "{}", node.display());
}
