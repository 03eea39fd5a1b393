//! QEMU: probing what the installed version supports, building the command line, and
//! running a guest with its console streamed through [`Console`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::console::{Console, ConsoleReport};
use crate::proc;

/// What the installed QEMU supports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuCaps {
    /// The version number, e.g. `7.2.22`.
    pub version: String,
    /// Properties of `-device nvme`, with their defaults where QEMU states one.
    pub nvme_props: BTreeMap<String, Option<String>>,
    /// Whether `-drive …,aio=io_uring` works here.
    pub io_uring: bool,
}

impl QemuCaps {
    /// True when `-device nvme` has property `name`.
    pub fn has_nvme_prop(&self, name: &str) -> bool {
        self.nvme_props.contains_key(name)
    }

    /// The default of an integer nvme property.
    pub fn nvme_default(&self, name: &str) -> Option<u32> {
        self.nvme_props.get(name)?.as_deref()?.parse().ok()
    }

    /// Probes `qemu` (results cached in `cache/qemu-caps`, keyed by binary and version).
    pub fn probe(qemu: &Path, cache: &Path) -> Result<Self> {
        let out = proc::run_checked(Command::new(qemu).arg("--version"), Duration::from_secs(30))?;
        let version_line = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        let key = format!("{} {version_line}", qemu.display());
        let cache_file = cache.join("qemu-caps");
        if let Ok(text) = std::fs::read_to_string(&cache_file)
            && let Some(caps) = Self::from_cache(&text, &key)
        {
            return Ok(caps);
        }
        let version = version_line
            .split_whitespace()
            .skip_while(|w| *w != "version")
            .nth(1)
            .unwrap_or("unknown")
            .to_string();
        let help = proc::run_checked(
            Command::new(qemu).args(["-device", "nvme,help"]),
            Duration::from_secs(30),
        )?;
        let nvme_props = parse_device_help(&String::from_utf8_lossy(&help.stdout));
        if !nvme_props.contains_key("serial") {
            bail!(
                "{} does not list the nvme device's properties; is it QEMU 7.2 or later?",
                qemu.display()
            );
        }
        let io_uring = probe_io_uring(qemu, cache)?;
        let caps = Self {
            version,
            nvme_props,
            io_uring,
        };
        std::fs::create_dir_all(cache)?;
        std::fs::write(&cache_file, caps.to_cache(&key))?;
        Ok(caps)
    }

    fn to_cache(&self, key: &str) -> String {
        let mut s = format!(
            "key {key}\nversion {}\nio_uring {}\n",
            self.version,
            u8::from(self.io_uring)
        );
        for (k, v) in &self.nvme_props {
            let _ = writeln!(s, "nvme {k} {}", v.as_deref().unwrap_or(""));
        }
        s
    }

    fn from_cache(text: &str, key: &str) -> Option<Self> {
        let mut lines = text.lines();
        if lines.next()?.strip_prefix("key ")? != key {
            return None;
        }
        let version = lines.next()?.strip_prefix("version ")?.to_string();
        let io_uring = lines.next()?.strip_prefix("io_uring ")? == "1";
        let mut nvme_props = BTreeMap::new();
        for l in lines {
            let rest = l.strip_prefix("nvme ")?;
            let (k, v) = rest.split_once(' ').unwrap_or((rest, ""));
            nvme_props.insert(k.to_string(), (!v.is_empty()).then(|| v.to_string()));
        }
        Some(Self {
            version,
            nvme_props,
            io_uring,
        })
    }
}

/// Parses `qemu -device X,help`: `  name=<type> - description (default: value)`.
fn parse_device_help(text: &str) -> BTreeMap<String, Option<String>> {
    text.lines()
        .filter(|l| l.starts_with("  "))
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once('=')?;
            let default = rest.split_once("(default: ").map(|(_, d)| {
                d.trim_end()
                    .trim_end_matches(')')
                    .trim_matches('"')
                    .to_string()
            });
            Some((name.trim().to_string(), default))
        })
        .collect()
}

/// Tries to open a drive with `aio=io_uring` (some QEMU builds or sandboxes lack it).
fn probe_io_uring(qemu: &Path, cache: &Path) -> Result<bool> {
    std::fs::create_dir_all(cache)?;
    let img = cache.join(format!("probe-{}.img", std::process::id()));
    std::fs::File::create(&img)?.set_len(1 << 20)?;
    let mut child = Command::new(qemu)
        .args([
            "-machine",
            "none",
            "-nodefaults",
            "-display",
            "none",
            "-monitor",
            "stdio",
            "-drive",
        ])
        .arg(format!(
            "file={},if=none,id=d0,format=raw,cache=unsafe,aio=io_uring",
            img.display()
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", qemu.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"quit\n");
    }
    let mut stderr = child.stderr.take().expect("piped");
    let err_reader = proc::background(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = proc::wait_timeout(&mut child, Duration::from_secs(30))?;
    let err = err_reader.wait(proc::PIPE_GRACE).unwrap_or_default();
    let _ = std::fs::remove_file(&img);
    let ok = status.is_some_and(|s| s.success());
    if !ok {
        eprintln!(
            "xtask: notice: this QEMU cannot use aio=io_uring ({}); the bed uses aio=threads",
            err.trim()
        );
    }
    Ok(ok)
}

/// One NVMe controller on the guest's PCI bus.
#[derive(Debug, Clone)]
pub struct ControllerSpec {
    /// QEMU device id (namespaces attach to it).
    pub id: String,
    /// PCI slot on bus 0.
    pub slot: u32,
    /// `-device nvme` properties besides id and addr (serial, mdts, ...).
    pub props: Vec<(String, String)>,
    /// Backing file of each namespace (NSID = index + 1).
    pub namespaces: Vec<PathBuf>,
    /// Logical and physical block size.
    pub lba_size: u32,
    /// Extra `nvme-ns` properties of namespace 1 (metadata and protection
    /// information: ms, mset, pi, pil).
    pub ns1_props: Vec<(String, String)>,
    /// 512-byte sectors of namespace 1 whose reads fail (blkdebug).
    pub ns1_read_error_sectors: Vec<u64>,
    /// Behind a hot-pluggable `pcie-root-port` (at this spec's slot), its
    /// images `-blockdev` nodes; `None`: an integrated endpoint on the root
    /// bus.
    pub root_port: Option<RootPort>,
}

/// A controller's hot-pluggable root port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RootPort {
    /// Its number N (`rpN`; controller N sits behind it).
    pub index: u32,
    /// The secondary bus the guest gives it, where the controller is
    /// `0000:{bus}:00.0`: the guest's firmware numbers the root ports' buses
    /// from the last slot down (measured: with three controllers,
    /// controller 0 at bus 3, controller 2 at bus 1), so
    /// `controllers - index`.
    pub bus: u32,
}

impl ControllerSpec {
    /// The guest's PCI address of this controller: on the root bus at its
    /// slot, or the only function of its root port's secondary bus
    /// ([`RootPort::bus`]: the guest numbers those from the last port down).
    pub fn pci_address(&self) -> String {
        match self.root_port {
            Some(rp) => format!("0000:{:02x}:00.0", rp.bus),
            None => pci_address(self.slot),
        }
    }

    /// The `nvme` device's properties (id, placement, serial, ...).
    fn nvme_props(&self) -> Vec<(String, String)> {
        let mut p = vec![("id".to_string(), self.id.clone())];
        match self.root_port {
            Some(RootPort { index: n, .. }) => {
                // QEMU cannot hot-add an nvme-ns to a realized controller,
                // so a hot-pluggable controller carries its one namespace
                // itself (the nvme device's own drive, NSID 1).
                p.push(("bus".into(), format!("rp{n}")));
                p.push(("drive".into(), format!("{}n1", self.id)));
                p.push(("logical_block_size".into(), self.lba_size.to_string()));
                p.push(("physical_block_size".into(), self.lba_size.to_string()));
            }
            None => p.push(("addr".into(), format!("{:#x}", self.slot))),
        }
        p.extend(self.props.iter().cloned());
        p
    }

    /// The `nvme-ns` properties of namespace `nsid` (1-based).
    fn ns_props(&self, nsid: usize) -> Vec<(String, String)> {
        let mut p = vec![
            ("drive".to_string(), format!("{}n{nsid}", self.id)),
            ("bus".into(), self.id.clone()),
            ("nsid".into(), nsid.to_string()),
            ("logical_block_size".into(), self.lba_size.to_string()),
            ("physical_block_size".into(), self.lba_size.to_string()),
        ];
        if nsid == 1 {
            p.extend(self.ns1_props.iter().cloned());
        }
        p
    }

    /// The QMP `device_add` that puts the controller (with its namespace)
    /// back (numbers as JSON numbers, as QMP's strict typing wants).
    pub fn replug_commands(&self) -> Vec<String> {
        let typed = |props: Vec<(String, String)>| {
            let mut m = serde_json::Map::new();
            for (k, v) in props {
                let val = match v.parse::<u64>() {
                    Ok(n) if k != "serial" && k != "id" => serde_json::Value::from(n),
                    _ => serde_json::Value::from(v),
                };
                m.insert(k, val);
            }
            m
        };
        let mut dev = typed(self.nvme_props());
        dev.insert("driver".into(), "nvme".into());
        vec![serde_json::json!({"execute": "device_add", "arguments": dev}).to_string()]
    }

    /// The QEMU arguments for the controller and its namespaces.
    pub fn args(&self, aio: &str) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(RootPort { index: n, .. }) = self.root_port {
            a.push("-device".into());
            a.push(format!(
                "pcie-root-port,id=rp{n},chassis={},slot={},bus=pcie.0,addr={:#x}",
                n + 1,
                n + 1,
                self.slot
            ));
        }
        let mut dev = String::from("nvme");
        for (k, v) in self.nvme_props() {
            let _ = write!(dev, ",{k}={v}");
        }
        a.extend(["-device".to_string(), dev]);
        for (i, file) in self.namespaces.iter().enumerate() {
            let nsid = i + 1;
            let drive = format!("{}n{nsid}", self.id);
            if self.root_port.is_some() {
                // A -blockdev node outlives an unplugged device (a -drive is
                // deleted with it), so a replug can attach it again.
                a.push("-blockdev".into());
                a.push(format!(
                    "driver=raw,node-name={drive},file.driver=file,file.filename={},file.aio={aio},cache.no-flush=on",
                    qemu_escape(&file.to_string_lossy())
                ));
            } else if nsid == 1 && !self.ns1_read_error_sectors.is_empty() {
                a.push("-drive".into());
                // blkdebug between the raw format layer and the file: reads of
                // the listed sectors fail with EIO, which the controller
                // reports as Unrecovered Read Error (the raw layer must sit
                // above blkdebug, or no event fires).
                let mut d = format!("if=none,id={drive},driver=raw,file.driver=blkdebug");
                for (i, s) in self.ns1_read_error_sectors.iter().enumerate() {
                    let _ = write!(
                        d,
                        ",file.inject-error.{i}.event=read_aio,file.inject-error.{i}.errno=5,file.inject-error.{i}.sector={s}"
                    );
                }
                let _ = write!(
                    d,
                    ",file.image.driver=file,file.image.filename={},file.image.aio={aio},cache.no-flush=on",
                    qemu_escape(&file.to_string_lossy())
                );
                a.push(d);
            } else {
                // discard=unmap: a Format NVM or a Deallocate frees the blocks
                // in the image, so QEMU sees them as zeroed afterwards and
                // returns its all-ones protection information tuple for them
                // (checks off) as for a fresh image, instead of the zero tuple
                // a reference tag check then fails (docs/io.md).
                a.push("-drive".into());
                a.push(format!(
                    "file={},if=none,id={drive},format=raw,cache=unsafe,discard=unmap,aio={aio}",
                    qemu_escape(&file.to_string_lossy())
                ));
            }
            if self.root_port.is_some() {
                continue; // the controller's own namespace (see nvme_props)
            }
            let mut ns = String::from("nvme-ns");
            for (k, v) in self.ns_props(nsid) {
                let _ = write!(ns, ",{k}={v}");
            }
            a.push("-device".into());
            a.push(ns);
        }
        a
    }
}

/// `0000:00:SS.0` for a slot on bus 0.
pub fn pci_address(slot: u32) -> String {
    format!("0000:00:{slot:02x}.0")
}

/// Escapes a value for QEMU's comma-separated option syntax.
fn qemu_escape(v: &str) -> String {
    v.replace(',', ",,")
}

/// The fixed part of the command line: machine with an interrupt-remapping IOMMU
/// (required for VFIO), TCG, serial console on stdio, no reboot (a panic ends QEMU).
pub fn machine_args(smp: u32, mem_mib: u64) -> Vec<String> {
    [
        "-machine",
        "q35,kernel-irqchip=split",
        "-accel",
        "tcg",
        "-cpu",
        "max",
        "-device",
        "intel-iommu,intremap=on",
        "-m",
        &format!("{mem_mib}M"),
        "-smp",
        &smp.to_string(),
        "-nographic",
        "-nodefaults",
        "-no-user-config",
        "-serial",
        "stdio",
        "-no-reboot",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// How a guest run ended.
#[derive(Debug)]
pub struct QemuRun {
    /// What the console showed.
    pub report: ConsoleReport,
    /// QEMU's exit status (`None` when it was killed).
    pub status: Option<ExitStatus>,
    /// The guest did not finish within the timeout and QEMU was killed.
    pub timed_out: bool,
    /// The guest did not reach its init's first report within the boot timeout and QEMU
    /// was killed (COMMAND never started, so the boot can be retried).
    pub boot_stalled: bool,
    /// QEMU's stderr.
    pub stderr: String,
    /// Wall time from QEMU's start to its end.
    pub elapsed: Duration,
    /// When QEMU died of a signal: its backtrace from the core dump, or where
    /// the dump went (see crash.rs).
    pub crash: Option<String>,
}

/// How one QEMU run is watched.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// This run's console marker nonce.
    pub nonce: String,
    /// Print the boot log too.
    pub verbose: bool,
    /// Keep COMMAND's output lines in the report.
    pub capture: bool,
    /// Kill QEMU after this long.
    pub timeout: Duration,
    /// Kill QEMU if COMMAND has not started (and setup has not failed) after this long.
    pub boot_timeout: Duration,
    /// QEMU's working directory (the run directory: a core dump lands there).
    pub dir: PathBuf,
    /// The QMP socket and the hotplug steps to run through it.
    pub qmp: Option<(PathBuf, Vec<crate::qmp::Step>)>,
    /// `--pin-vcpu0`: the host's CPU count, for [`crate::pin`].
    pub pin_vcpu0: Option<usize>,
}

/// Seconds the guest may take to power off after reporting COMMAND's exit status.
const POWEROFF_GRACE: Duration = Duration::from_secs(20);

/// Runs QEMU with `args`, streaming the console to stdout through [`Console`]; kills QEMU
/// after the timeout, when the boot stalls, or when the guest reported its exit status but
/// does not power off.
pub fn run(qemu: &Path, args: &[String], opts: &RunOptions) -> Result<QemuRun> {
    let start = Instant::now();
    let started_wall = std::time::SystemTime::now();
    let mut child = Command::new(qemu)
        .args(args)
        .current_dir(&opts.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", qemu.display()))?;
    crate::crash::allow_core_dump(child.id());
    let exited = Arc::new(AtomicBool::new(false));
    let booted = Arc::new(AtomicBool::new(false));
    if let Some((sock, steps)) = &opts.qmp {
        crate::qmp::spawn(sock.clone(), Arc::clone(&booted), steps.clone());
    }
    // Stops pinning when this function returns, however it does: after QEMU is
    // reaped its PID may belong to another process.
    let pinner = opts
        .pin_vcpu0
        .map(|host_cpus| crate::pin::Pinner::start(child.id(), host_cpus));
    let mut stdout = child.stdout.take().expect("piped");
    let console_thread = {
        let (exited, booted) = (Arc::clone(&exited), Arc::clone(&booted));
        let (nonce, verbose, capture) = (opts.nonce.clone(), opts.verbose, opts.capture);
        proc::background(move || -> std::io::Result<ConsoleReport> {
            let out = std::io::BufWriter::new(std::io::stdout());
            let mut console = Console::new(out, &nonce, verbose, capture);
            let mut buf = [0u8; 8192];
            loop {
                let n = match stdout.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                console.feed(&buf[..n])?;
                if console.booted() {
                    booted.store(true, Ordering::Relaxed);
                }
                if console.exited() {
                    exited.store(true, Ordering::Relaxed);
                }
            }
            Ok(console.finish()?.1)
        })
    };
    let stderr = child.stderr.take().expect("piped");
    let stderr_thread = proc::background(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            eprintln!("{line}");
            all.push_str(&line);
            all.push('\n');
        }
        all
    });

    let deadline = start + opts.timeout;
    let boot_deadline = start + opts.boot_timeout;
    let mut poweroff_deadline = None;
    let (mut timed_out, mut boot_stalled) = (false, false);
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        let now = Instant::now();
        if exited.load(Ordering::Relaxed) && poweroff_deadline.is_none() {
            poweroff_deadline = Some(now + POWEROFF_GRACE);
        }
        let overdue = poweroff_deadline.is_some_and(|d| now >= d);
        let stalled = now >= boot_deadline && !booted.load(Ordering::Relaxed);
        if now >= deadline || overdue || stalled {
            if overdue {
                eprintln!("xtask: the guest did not power off; stopping QEMU");
            } else if stalled && now < deadline {
                boot_stalled = true;
            } else {
                timed_out = true;
            }
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    drop(pinner);
    let report = console_thread
        .wait(proc::PIPE_GRACE)
        .context("the guest console reader did not finish")?
        .context("reading the guest console")?;
    let stderr = stderr_thread.wait(proc::PIPE_GRACE).unwrap_or_default();
    let crash = status
        .filter(|s| std::os::unix::process::ExitStatusExt::signal(s).is_some())
        .and_then(|_| crate::crash::diagnose(qemu, child.id(), &opts.dir, started_wall));
    Ok(QemuRun {
        report,
        status,
        timed_out,
        boot_stalled,
        stderr,
        elapsed: start.elapsed(),
        crash,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELP: &str = "nvme options:\n  addr=<int32>           - Slot and optional function number, example: 06.0 or 06 (default: -1)\n  max_ioqpairs=<uint32>  -  (default: 64)\n  mdts=<uint8>           -  (default: 7)\n  serial=<str>\n  write-cache=<OnOffAuto> - on/off/auto (default: \"auto\")\n";

    #[test]
    fn device_help() {
        let p = parse_device_help(HELP);
        assert_eq!(p["mdts"].as_deref(), Some("7"));
        assert_eq!(p["max_ioqpairs"].as_deref(), Some("64"));
        assert_eq!(p["serial"], None);
        assert_eq!(p["write-cache"].as_deref(), Some("auto"));
        assert!(!p.contains_key("mqes"));
    }

    #[test]
    fn caps_cache_roundtrip() {
        let caps = QemuCaps {
            version: "7.2.22".into(),
            nvme_props: parse_device_help(HELP),
            io_uring: true,
        };
        let text = caps.to_cache("/usr/bin/qemu QEMU emulator version 7.2.22");
        assert_eq!(
            QemuCaps::from_cache(&text, "/usr/bin/qemu QEMU emulator version 7.2.22"),
            Some(caps.clone())
        );
        assert_eq!(
            QemuCaps::from_cache(&text, "/usr/bin/qemu QEMU emulator version 10.0.0"),
            None
        );
        assert_eq!(caps.nvme_default("mdts"), Some(7));
        assert!(caps.has_nvme_prop("serial"));
    }

    #[test]
    fn controller_args() {
        let c = ControllerSpec {
            id: "c0".into(),
            slot: 4,
            props: vec![
                ("serial".into(), "UPNVME0".into()),
                ("mdts".into(), "7".into()),
            ],
            namespaces: vec!["/t/a,b.img".into(), "/t/c.img".into()],
            lba_size: 512,
            ns1_props: vec![("ms".into(), "8".into()), ("mset".into(), "1".into())],
            ns1_read_error_sectors: vec![],
            root_port: None,
        };
        assert_eq!(c.pci_address(), "0000:00:04.0");
        assert_eq!(
            c.args("io_uring"),
            [
                "-device",
                "nvme,id=c0,addr=0x4,serial=UPNVME0,mdts=7",
                "-drive",
                "file=/t/a,,b.img,if=none,id=c0n1,format=raw,cache=unsafe,discard=unmap,aio=io_uring",
                "-device",
                "nvme-ns,drive=c0n1,bus=c0,nsid=1,logical_block_size=512,physical_block_size=512,ms=8,mset=1",
                "-drive",
                "file=/t/c.img,if=none,id=c0n2,format=raw,cache=unsafe,discard=unmap,aio=io_uring",
                "-device",
                "nvme-ns,drive=c0n2,bus=c0,nsid=2,logical_block_size=512,physical_block_size=512",
            ]
        );
        assert_eq!(pci_address(0x1d), "0000:00:1d.0");
    }
}
