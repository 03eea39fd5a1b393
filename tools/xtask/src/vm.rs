//! `cargo xtask vm`: prepares everything a guest needs and runs one command in it.

use std::fs;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};

use crate::cli::{self, VmArgs};
use crate::console::ConsoleReport;
use crate::deps::{self, HostTools};
use crate::guest_build::{self, GuestBinary};
use crate::guest_init::{self, GuestEnv, paths as gpaths};
use crate::initramfs::CpioWriter;
use crate::kernel::{self, GuestKernel};
use crate::paths::Paths;
use crate::proc;
use crate::qemu::{self, ControllerSpec, QemuCaps};

/// Exit code when the guest timed out (as GNU timeout).
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit code when the bed itself failed (setup, panic, QEMU missing, ...).
pub const EXIT_BED: i32 = 125;

/// A failure with a specific exit code for `cargo xtask`.
#[derive(Debug)]
pub struct Failure {
    /// The process exit code.
    pub code: i32,
    /// What went wrong and what to do about it.
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

fn failure(code: i32, message: impl Into<String>) -> anyhow::Error {
    Failure {
        code,
        message: message.into(),
    }
    .into()
}

/// Serial numbers: controller i is `UPNVME{i}`, the kernel's is `UPNVMEK`.
pub const SERIAL_PREFIX: &str = "UPNVME";
/// PCI slot of the first vfio controller; controller i sits at slot `FIRST_SLOT + i`.
const FIRST_SLOT: u32 = 4;
/// PCI slot of the `--kernel-nvme` controller.
const KERNEL_NVME_SLOT: u32 = 3;
/// Hugepage size in the guest (x86-64 default).
const HUGEPAGE_BYTES: u64 = 2 << 20;
/// Guest memory to leave free beside the hugepages and the initramfs.
const MIN_FREE_MEM: u64 = 192 << 20;
/// Default namespace size.
const DEFAULT_DISK_SIZE: u64 = 256 << 20;
/// Boot attempts before giving up.
const BOOT_ATTEMPTS: u32 = 3;
/// Bumped when the base initramfs layout changes.
const BASE_FORMAT: u32 = 1;

/// Result of one guest run that got as far as COMMAND's exit status.
#[derive(Debug, Clone)]
pub struct VmOutcome {
    /// COMMAND's exit status.
    pub status: i32,
    /// IOMMU faults in the guest kernel log, those a test provoked on purpose excepted.
    pub dmar_faults: u32,
    /// IOMMU faults a test provoked on purpose (`UPNVME_VM_EXPECTED_DMAR`).
    pub expected_dmar_faults: u32,
    /// The kernel log lines reporting them.
    pub dmar_lines: Vec<String>,
    /// COMMAND's output lines (when captured).
    pub command_lines: Vec<String>,
    /// Wall time of the QEMU run.
    pub elapsed: Duration,
}

/// What every guest run needs: host tools, the guest kernel, QEMU's capabilities and the
/// guest programs.
pub struct Bed {
    paths: Paths,
    tools: HostTools,
    kernel: GuestKernel,
    caps: QemuCaps,
    binaries: Vec<GuestBinary>,
}

impl Bed {
    /// Installs/fetches what is missing, and builds the guest programs unless `no_build`.
    pub fn prepare(no_build: bool) -> Result<Self> {
        let paths = Paths::discover();
        fs::create_dir_all(&paths.cache)
            .with_context(|| format!("creating {}", paths.cache.display()))?;
        remove_stale_run_dirs(&paths.cache);
        let tools = deps::ensure_host_tools().map_err(|e| failure(EXIT_BED, format!("{e:#}")))?;
        let kernel = kernel::ensure(&paths.cache, &tools.busybox)?;
        let caps = QemuCaps::probe(&tools.qemu, &paths.cache)?;
        let binaries = if no_build {
            guest_build::prebuilt(&paths)?
        } else {
            guest_build::build(&paths)?
        };
        Ok(Self {
            paths,
            tools,
            kernel,
            caps,
            binaries,
        })
    }

    /// QEMU's capabilities.
    pub fn caps(&self) -> &QemuCaps {
        &self.caps
    }

    /// Boots a guest configured by `args`, runs `command` with `sh -c`, and returns its
    /// outcome. Timeouts, kernel panics and setup failures are [`Failure`]s; DMAR faults are
    /// reported in the outcome for the caller to judge.
    pub fn run(&self, args: &VmArgs, command: &str, capture: bool) -> Result<VmOutcome> {
        let run_dir = RunDir::create(&self.paths.cache)?;
        let plan = self.plan(args, &run_dir.path)?;
        let initrd = run_dir.path.join("initrd.cpio");
        let nonce = nonce();
        self.write_initrd(&initrd, args, &plan.env, command, &nonce)?;
        let initrd_size = fs::metadata(&initrd)?.len();
        let reserved = u64::from(args.hugepages) * HUGEPAGE_BYTES;
        if reserved + 2 * initrd_size + MIN_FREE_MEM > args.mem.0 {
            bail!(
                "--mem {} is too small for {} hugepages ({} MiB) and a {} MiB initramfs: raise --mem or lower --hugepages",
                args.mem,
                args.hugepages,
                reserved >> 20,
                initrd_size >> 20
            );
        }

        let (kernel_image, bios) = self.boot_files(args);
        // oops=panic: an oops in a kernel thread (pciehp, vfio-pci's
        // release, the nvme driver) kills only that thread and would leave
        // the run green; as a panic the console reader reports it.
        // log_buf_len: the IOMMU fault count is read from the kernel log
        // after COMMAND; a log that wraps loses records (the guest init
        // then reports it and the run is a bed failure).
        let mut append = format!(
            "console=ttyS0 intel_iommu=on panic=-1 oops=panic log_buf_len=16M hugepages={}",
            args.hugepages
        );
        if !args.verbose {
            append.push_str(" quiet loglevel=3");
        }
        let mut qargs = qemu::machine_args(args.smp, args.mem.0 >> 20);
        if let Some(bios) = bios {
            qargs.extend(["-bios".into(), bios.display().to_string()]);
        }
        qargs.extend(["-kernel".into(), kernel_image.display().to_string()]);
        qargs.extend(["-initrd".into(), initrd.display().to_string()]);
        qargs.extend(["-append".into(), append]);
        let aio = if self.caps.io_uring {
            "io_uring"
        } else {
            "threads"
        };
        for c in &plan.controllers {
            qargs.extend(c.args(aio));
        }
        let steps = hotplug_steps(args, &plan.controllers)?;
        let qmp = (!steps.is_empty()).then(|| {
            let sock = run_dir.path.join("qmp.sock");
            qargs.extend([
                "-qmp".into(),
                format!("unix:{},server=on,wait=off", sock.display()),
            ]);
            (sock, steps)
        });
        let pin_vcpu0 = if args.pin_vcpu0 {
            let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            crate::pin::check_host(host_cpus)?;
            qargs.extend(crate::pin::QEMU_ARGS.map(String::from));
            Some(host_cpus)
        } else {
            None
        };
        qargs.extend(args.qemu_arg.iter().cloned());

        let n = plan.env.controllers;
        eprintln!(
            "xtask: booting QEMU {} / Linux {} ({} controller{} x {} namespace{}, {} B blocks{}){}",
            self.caps.version,
            self.kernel.release,
            n,
            if n == 1 { "" } else { "s" },
            args.namespaces,
            if args.namespaces == 1 { "" } else { "s" },
            args.lba_size,
            if args.kernel_nvme {
                ", +1 kernel nvme"
            } else {
                ""
            },
            if args.verbose {
                ""
            } else {
                "; --verbose shows the boot log"
            },
        );
        if args.verbose {
            eprintln!(
                "xtask: {} {}",
                self.tools.qemu.display(),
                qargs
                    .iter()
                    .map(|a| cli::shell_quote(a))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
        let opts = qemu::RunOptions {
            nonce,
            verbose: args.verbose,
            capture,
            timeout: Duration::from_secs(args.timeout),
            boot_timeout: Duration::from_secs(args.boot_timeout),
            dir: run_dir.path.clone(),
            qmp,
            pin_vcpu0,
        };
        let mut attempt = 1;
        let run = loop {
            let run = qemu::run(&self.tools.qemu, &qargs, &opts)?;
            // A stall seen after BEGIN was read is no stall: COMMAND started
            // and must not run twice.
            if !run.boot_stalled || run.report.begun {
                break run;
            }
            let log = Vec::from(run.report.boot_log).join("\n");
            let log = if log.is_empty() {
                "  (the guest printed nothing; --verbose shows the kernel log)".to_string()
            } else {
                proc::tail_lines(&log, 10)
            };
            let msg = format!(
                "the guest did not finish booting within {} s (attempt {attempt} of {BOOT_ATTEMPTS}); last boot lines:\n{log}",
                args.boot_timeout
            );
            if attempt == BOOT_ATTEMPTS {
                return Err(failure(EXIT_BED, msg));
            }
            eprintln!("xtask: {msg}\nxtask: retrying the boot (COMMAND has not started)");
            attempt += 1;
        };
        drop(run_dir);
        judge(
            run.report,
            run.timed_out,
            run.status,
            &run.stderr,
            run.crash.as_deref(),
            args.timeout,
            run.elapsed,
        )
    }

    /// The kernel image and firmware: the uncompressed vmlinux through PVH (with qboot as
    /// the BIOS when present) unless `--bzimage` or no vmlinux could be extracted.
    fn boot_files(&self, args: &VmArgs) -> (PathBuf, Option<PathBuf>) {
        match (&self.kernel.vmlinux, args.bzimage) {
            (Some(vmlinux), false) => {
                let qboot = ["/usr/share/qemu/qboot.rom", "/usr/share/qboot/bios.bin"]
                    .into_iter()
                    .map(PathBuf::from)
                    .find(|p| p.exists());
                (vmlinux.clone(), qboot)
            }
            _ => (self.kernel.vmlinuz.clone(), None),
        }
    }

    /// Validates `args` against QEMU and creates the backing files.
    fn plan(&self, args: &VmArgs, run_dir: &Path) -> Result<Plan> {
        let caps = &self.caps;
        for (flag, prop, given) in [
            ("--mdts", "mdts", args.mdts.is_some()),
            ("--mqes", "mqes", args.mqes.is_some()),
            (
                "--max-ioqpairs",
                "max_ioqpairs",
                args.max_ioqpairs.is_some(),
            ),
        ] {
            if given && !caps.has_nvme_prop(prop) {
                return Err(failure(
                    EXIT_BED,
                    format!(
                        "{flag}: QEMU {} has no `{prop}` property on -device nvme (see `qemu-system-x86_64 -device nvme,help`); \
                         use a newer QEMU or drop {flag}",
                        caps.version
                    ),
                ));
            }
        }
        let mdts = args
            .mdts
            .map(u32::from)
            .or(caps.nvme_default("mdts"))
            .unwrap_or(7);
        // QEMU's CAP.MQES is 0x7ff unless a version with the `mqes` property says otherwise.
        let mqes = args
            .mqes
            .map(u32::from)
            .or(caps.nvme_default("mqes"))
            .unwrap_or(0x7ff);
        let max_ioqpairs = args
            .max_ioqpairs
            .or(caps.nvme_default("max_ioqpairs"))
            .unwrap_or(64);
        if args.mqes == Some(0) {
            bail!("--mqes is zero-based like CAP.MQES and must be at least 1");
        }
        if max_ioqpairs == 0 {
            bail!("--max-ioqpairs must be at least 1");
        }
        let disk_size = disk_size(args)?;
        let lba = u64::from(args.lba_size);
        if disk_size == 0 || disk_size % lba != 0 {
            bail!(
                "the namespace size ({disk_size} bytes) must be a non-zero multiple of --lba-size {lba}"
            );
        }

        if args.pi != 0 && args.ms < 8 {
            bail!(
                "--pi {} needs at least 8 metadata bytes per block (--ms 8 or more)",
                args.pi
            );
        }
        if args.pif != 0 && (args.pi == 0 || args.ms < 16) {
            bail!(
                "--pif {} (a 64-bit guard) needs --pi 1|2|3 and at least 16 metadata bytes per block (--ms 16 or more)",
                args.pif
            );
        }
        if args.ms == 0 && (args.mset != 0 || args.pil != 0) {
            bail!("--mset and --pil describe metadata: give --ms BYTES too");
        }
        let hotplug = args.hotplug || !args.unplug.is_empty() || !args.replug.is_empty();
        if hotplug && (args.namespaces != 1 || args.ms != 0 || !args.inject_read_error.is_empty()) {
            bail!(
                "--hotplug (and --unplug/--replug) work with one namespace per controller and without \
                 --ms or --inject-read-error: QEMU cannot hot-add namespaces to a controller, so a \
                 hot-pluggable controller carries its namespace itself"
            );
        }
        let mut ns1_props = vec![];
        if args.ms != 0 {
            ns1_props.push(("ms".to_string(), args.ms.to_string()));
            ns1_props.push(("mset".to_string(), args.mset.to_string()));
            if args.pi != 0 {
                ns1_props.push(("pi".to_string(), args.pi.to_string()));
                ns1_props.push(("pil".to_string(), args.pil.to_string()));
                if args.pif != 0 {
                    ns1_props.push(("pif".to_string(), args.pif.to_string()));
                }
            }
        }
        let mut props = vec![];
        if caps.has_nvme_prop("mdts") {
            props.push(("mdts".to_string(), mdts.to_string()));
        }
        if caps.has_nvme_prop("max_ioqpairs") {
            props.push(("max_ioqpairs".to_string(), max_ioqpairs.to_string()));
        }
        if let Some(m) = args.mqes {
            props.push(("mqes".to_string(), m.to_string()));
        }
        let mut controllers = Vec::new();
        for c in 0..args.controllers {
            let namespaces = (1..=args.namespaces)
                .map(|ns| match (&args.disk, c, ns) {
                    (Some(disk), 0, 1) => prepare_user_disk(disk, disk_size),
                    _ => temp_disk(&run_dir.join(format!("c{c}n{ns}.img")), disk_size),
                })
                .collect::<Result<Vec<_>>>()?;
            let mut p = vec![("serial".to_string(), format!("{SERIAL_PREFIX}{c}"))];
            p.extend(props.iter().cloned());
            controllers.push(ControllerSpec {
                id: format!("c{c}"),
                slot: FIRST_SLOT + c,
                props: p,
                namespaces,
                lba_size: args.lba_size,
                ns1_props: if c == 0 { ns1_props.clone() } else { vec![] },
                root_port: hotplug.then_some(crate::qemu::RootPort {
                    index: c,
                    bus: args.controllers - c,
                }),
                ns1_read_error_sectors: if c == 0 {
                    args.inject_read_error
                        .iter()
                        .map(|lba| lba * u64::from(args.lba_size / 512))
                        .collect()
                } else {
                    vec![]
                },
            });
        }
        let devices = controllers
            .iter()
            .map(ControllerSpec::pci_address)
            .collect();
        let kernel_nvme = if args.kernel_nvme {
            let namespaces = (1..=args.namespaces)
                .map(|ns| temp_disk(&run_dir.join(format!("kn{ns}.img")), disk_size))
                .collect::<Result<Vec<_>>>()?;
            let mut p = vec![("serial".to_string(), format!("{SERIAL_PREFIX}K"))];
            p.extend(props.iter().cloned());
            let k = ControllerSpec {
                id: "ck".into(),
                slot: KERNEL_NVME_SLOT,
                props: p,
                namespaces,
                lba_size: args.lba_size,
                ns1_props: vec![],
                ns1_read_error_sectors: vec![],
                root_port: None,
            };
            let addr = k.pci_address();
            controllers.push(k);
            Some(addr)
        } else {
            None
        };
        let term = if std::io::stdout().is_terminal() {
            std::env::var("TERM").unwrap_or_else(|_| "linux".into())
        } else {
            "dumb".into()
        };
        let env = GuestEnv {
            controllers: args.controllers,
            namespaces: args.namespaces,
            lba_size: args.lba_size,
            ns1_ms: args.ms,
            ns1_mset: args.mset,
            ns1_pi: args.pi,
            ns1_pil: args.pil,
            ns1_pif: args.pif,
            ns1_read_errors: args.inject_read_error.clone(),
            hotplug: args
                .unplug
                .iter()
                .map(|u| format!("unplug:{u}"))
                .chain(args.replug.iter().map(|r| format!("replug:{r}")))
                .collect::<Vec<_>>()
                .join(" "),
            mdts,
            mqes,
            max_ioqpairs,
            disk_size,
            hugepages: args.hugepages,
            serial_prefix: SERIAL_PREFIX.into(),
            devices,
            kernel_nvme,
            kernel_nvme_poll_queues: args.smp.min(max_ioqpairs.saturating_sub(1)).max(1),
            smp: args.smp,
            term,
        };
        Ok(Plan { env, controllers })
    }

    /// The cached base archive: busybox and the kernel modules.
    fn base_initramfs(&self) -> Result<PathBuf> {
        let bb = fs::metadata(&self.tools.busybox)?;
        let mtime = bb
            .modified()?
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let key = format!(
            "{BASE_FORMAT}-{}-{}-{}",
            self.kernel.package,
            bb.len(),
            mtime
        );
        let dir = self.paths.cache.join("initramfs");
        let file = dir.join(format!("base-{:016x}.cpio", fnv1a(key.as_bytes())));
        if file.exists() {
            return Ok(file);
        }
        fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!("base.{}.tmp", std::process::id()));
        let mut w = CpioWriter::new(std::io::BufWriter::new(fs::File::create(&tmp)?));
        for d in [
            "bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "tmp", "root", "lib",
        ] {
            w.dir(d)?;
        }
        w.char_device("dev/console", 0o600, 5, 1)?;
        w.char_device("dev/null", 0o666, 1, 3)?;
        w.host_file("bin/busybox", &self.tools.busybox)?;
        w.symlink("bin/sh", "busybox")?;
        for m in self
            .kernel
            .vfio_modules
            .iter()
            .chain(&self.kernel.nvme_modules)
        {
            w.host_file(
                &format!("{}/{m}.ko", gpaths::MODULES),
                &self.kernel.module_path(m),
            )?;
        }
        w.file(
            gpaths::VFIO_ORDER,
            0o644,
            (self.kernel.vfio_modules.join("\n") + "\n").as_bytes(),
        )?;
        w.file(
            gpaths::NVME_ORDER,
            0o644,
            (self.kernel.nvme_modules.join("\n") + "\n").as_bytes(),
        )?;
        w.finish()?;
        fs::rename(&tmp, &file)?;
        Ok(file)
    }

    /// Writes base + per-run archive to `path`.
    fn write_initrd(
        &self,
        path: &Path,
        args: &VmArgs,
        env: &GuestEnv,
        command: &str,
        nonce: &str,
    ) -> Result<()> {
        let base = self.base_initramfs()?;
        fs::copy(&base, path).with_context(|| format!("copying {}", base.display()))?;
        let file = fs::OpenOptions::new().append(true).open(path)?;
        let mut w = CpioWriter::new(std::io::BufWriter::new(file));
        w.file("init", 0o755, guest_init::init_script().as_bytes())?;
        w.file(gpaths::ENV, 0o644, env.env_file().as_bytes())?;
        w.file(gpaths::COMMAND, 0o644, command.as_bytes())?;
        w.file(gpaths::NONCE, 0o600, nonce.as_bytes())?;
        for b in &self.binaries {
            w.host_file(&b.guest, &b.host)?;
        }
        for spec in &args.put {
            let put = cli::parse_put(spec)?;
            w.host_file(&put.guest, &put.host)
                .with_context(|| format!("--put {spec}"))?;
        }
        w.finish()?;
        Ok(())
    }
}

/// A validated guest configuration.
/// The QMP steps of `--unplug` / `--replug`, sorted by time.
fn hotplug_steps(args: &VmArgs, controllers: &[ControllerSpec]) -> Result<Vec<crate::qmp::Step>> {
    let mut steps = Vec::new();
    let actions = args
        .unplug
        .iter()
        .map(|u| crate::qmp::parse(u, false))
        .chain(args.replug.iter().map(|r| crate::qmp::parse(r, true)));
    for a in actions {
        let a = a?;
        let Some(c) = controllers
            .iter()
            .filter(|c| c.root_port.is_some())
            .nth(a.ctrl as usize)
        else {
            bail!(
                "--{} {}: there is no hot-pluggable controller {} (--controllers {})",
                if a.replug { "replug" } else { "unplug" },
                a.ctrl,
                a.ctrl,
                args.controllers
            );
        };
        steps.push(crate::qmp::Step {
            at: a.at,
            what: format!(
                "{} controller {} ({})",
                if a.replug { "device_add" } else { "device_del" },
                a.ctrl,
                c.pci_address()
            ),
            commands: if a.replug {
                c.replug_commands()
            } else {
                vec![crate::qmp::device_del(&c.id)]
            },
            wait_gone: a.replug.then(|| c.id.clone()),
        });
    }
    steps.sort_by_key(|s| s.at);
    Ok(steps)
}

struct Plan {
    env: GuestEnv,
    controllers: Vec<ControllerSpec>,
}

/// The namespace size: --disk-size, else the size of an existing --disk, else 256 MiB.
fn disk_size(args: &VmArgs) -> Result<u64> {
    let existing = match &args.disk {
        Some(d) if d.exists() => Some(
            fs::metadata(d)
                .with_context(|| format!("--disk {}", d.display()))?
                .len(),
        ),
        _ => None,
    };
    match (args.disk_size, existing) {
        (Some(s), Some(e)) if s.0 != e => bail!(
            "--disk {} exists with {e} bytes but --disk-size asks for {}; drop --disk-size or use another file",
            args.disk.as_ref().expect("exists").display(),
            s.0
        ),
        (Some(s), _) => Ok(s.0),
        (None, Some(e)) => Ok(e),
        (None, None) => Ok(DEFAULT_DISK_SIZE),
    }
}

/// Creates --disk at `size` if missing; returns its absolute path.
fn prepare_user_disk(path: &Path, size: u64) -> Result<PathBuf> {
    if !path.exists() {
        temp_disk(path, size).with_context(|| format!("creating --disk {}", path.display()))?;
        eprintln!("xtask: created {} ({size} bytes)", path.display());
    }
    fs::canonicalize(path).with_context(|| format!("--disk {}", path.display()))
}

/// Creates a sparse file of `size` bytes.
fn temp_disk(path: &Path, size: u64) -> Result<PathBuf> {
    fs::File::create(path)
        .and_then(|f| f.set_len(size))
        .with_context(|| format!("creating {}", path.display()))?;
    Ok(path.to_path_buf())
}

/// Turns the console report into an outcome or a [`Failure`].
fn judge(
    report: ConsoleReport,
    timed_out: bool,
    status: Option<std::process::ExitStatus>,
    stderr: &str,
    crash: Option<&str>,
    timeout_secs: u64,
    elapsed: Duration,
) -> Result<VmOutcome> {
    // "\nlast boot log lines: ..." (empty when the guest printed nothing).
    let boot_log = || {
        if report.boot_log.is_empty() {
            String::new()
        } else {
            let text = Vec::from(report.boot_log.clone()).join("\n");
            format!(
                "\nlast boot log lines (--verbose shows all):\n{}",
                proc::tail_lines(&text, 40)
            )
        }
    };
    if let Some(p) = &report.panic {
        let context = if report.begun {
            "while COMMAND was running (its output, with the kernel's report, is above)".to_string()
        } else {
            format!("while booting{}", boot_log())
        };
        return Err(failure(
            EXIT_BED,
            format!("the guest kernel panicked: {p}\n{context}"),
        ));
    }
    if timed_out {
        let stage = if !report.begun {
            "while booting (the guest never started COMMAND)"
        } else if !report.ended {
            "while COMMAND was running"
        } else {
            "after COMMAND finished"
        };
        let mut msg = format!(
            "the guest did not finish within {timeout_secs} s {stage}; QEMU was killed (raise --timeout if COMMAND is slow)"
        );
        if !report.begun {
            msg.push_str(&boot_log());
        }
        return Err(failure(EXIT_TIMEOUT, msg));
    }
    if let Some(reason) = &report.setup_failure {
        return Err(failure(
            EXIT_BED,
            format!("guest setup failed: {reason}{}", boot_log()),
        ));
    }
    let qemu_status = status.map_or("killed".to_string(), |s| s.to_string());
    let mut qemu_said = if stderr.trim().is_empty() {
        String::new()
    } else {
        format!("\nQEMU said:\n{}", proc::tail_lines(stderr, 10))
    };
    if let Some(c) = crash {
        qemu_said.push('\n');
        qemu_said.push_str(c);
    }
    if !report.begun {
        return Err(failure(
            EXIT_BED,
            format!(
                "QEMU stopped ({qemu_status}) before the guest ran COMMAND{qemu_said}{}",
                boot_log()
            ),
        ));
    }
    let Some(exit) = report.exit_status.filter(|_| report.ended) else {
        return Err(failure(
            EXIT_BED,
            format!(
                "QEMU stopped ({qemu_status}) before the guest reported COMMAND's exit status{qemu_said}"
            ),
        ));
    };
    // QEMU dying of a signal or failing after the guest reported: the emulator
    // crashed (perhaps on a state COMMAND left the device in, as QEMU 10.0.2's
    // use-after-free on CC.EN = 0 did) or shut down uncleanly. Either way the run
    // did not end as a healthy one does. `None` (QEMU killed because the guest did
    // not power off within the grace period) is not a failure of COMMAND.
    if let Some(s) = status.filter(|s| !s.success()) {
        return Err(failure(
            EXIT_BED,
            format!(
                "QEMU stopped ({s}) after the guest reported COMMAND's exit status {exit}: the \
                 emulator crashed or failed while shutting down, so the run cannot be trusted{qemu_said}"
            ),
        ));
    }
    // No count from the guest, no fault check: a bed failure, not "0".
    if report.guest_dmar_faults.is_none() {
        return Err(failure(
            EXIT_BED,
            "the guest did not report its IOMMU fault count (the UPNVME-DMAR-FAULTS line is \
             missing or unreadable): the run's DMA cannot be vouched for"
                .to_string(),
        ));
    }
    if let Some(oldest) = &report.dmesg_lost {
        return Err(failure(
            EXIT_BED,
            format!(
                "the guest's kernel log lost its oldest lines during the run (it now starts with \
                 {oldest:?}, not the boot banner): IOMMU fault records may be gone, so the run's \
                 DMA cannot be vouched for. The log was cleared (dmesg -c) or wrapped: the guest \
                 boots with log_buf_len=16M, so COMMAND (or the kernel on its behalf) logged more \
                 than 16 MiB; make it log less or split the run"
            ),
        ));
    }
    let dmar_faults = report.dmar_faults();
    Ok(VmOutcome {
        status: exit,
        dmar_faults,
        expected_dmar_faults: report.expected_dmar_faults(),
        dmar_lines: report
            .dmar_fault_lines()
            .into_iter()
            .map(str::to_string)
            .collect(),
        command_lines: report.command_lines,
        elapsed,
    })
}

/// `cargo xtask vm`: runs `command`, returns the exit code for xtask.
pub fn vm(args: &VmArgs, command: &str) -> Result<i32> {
    let bed = Bed::prepare(args.no_build)?;
    let outcome = bed.run(args, command, false)?;
    exit_code(&outcome, args.allow_dma_faults)
}

/// Applies the DMAR policy to an outcome: faults fail the run unless allowed.
pub fn exit_code(outcome: &VmOutcome, allow_dma_faults: bool) -> Result<i32> {
    let secs = outcome.elapsed.as_secs_f64();
    if outcome.dmar_faults > 0 {
        let lines = outcome
            .dmar_lines
            .iter()
            .take(20)
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n");
        let msg = format!(
            "the guest kernel logged {} IOMMU (DMAR) fault(s): a device DMA hit an unmapped or read-only IOVA \
             (the device may still report success, so this log is the only trace):\n{lines}",
            outcome.dmar_faults
        );
        if !allow_dma_faults {
            let code = if outcome.status != 0 {
                outcome.status
            } else {
                1
            };
            return Err(failure(code, msg));
        }
        eprintln!("xtask: warning (--allow-dma-faults): {msg}");
    }
    eprintln!(
        "xtask: guest exited with status {} after {secs:.1} s, {} DMAR fault(s)",
        outcome.status, outcome.dmar_faults
    );
    Ok(outcome.status)
}

/// A per-run directory under target/xtask, removed when dropped.
struct RunDir {
    path: PathBuf,
}

impl RunDir {
    fn create(cache: &Path) -> Result<Self> {
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let path = cache.join(format!("run-{}-{stamp}", std::process::id()));
        fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Removes run directories left by xtask processes that no longer exist (e.g. after Ctrl-C).
fn remove_stale_run_dirs(cache: &Path) {
    let Ok(entries) = fs::read_dir(cache) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("run-").and_then(|r| r.split('-').next()) else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// A per-run marker nonce.
fn nonce() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{:016x}",
        fnv1a(format!("{t}-{}-{n}", std::process::id()).as_bytes())
    )
}

/// FNV-1a, for cache keys and nonces (not for security).
fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(exit: Option<i32>, dmesg: &[&str]) -> ConsoleReport {
        ConsoleReport {
            begun: true,
            ended: exit.is_some(),
            exit_status: exit,
            guest_dmar_faults: Some(0),
            dmesg: dmesg.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn code(e: anyhow::Error) -> i32 {
        e.downcast_ref::<Failure>().map(|f| f.code).unwrap_or(-1)
    }

    #[test]
    fn judging() {
        let ok = judge(
            report(Some(7), &[]),
            false,
            None,
            "",
            None,
            600,
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!((ok.status, ok.dmar_faults), (7, 0));
        assert_eq!(exit_code(&ok, false).unwrap(), 7);

        // No fault count from the guest is a bed failure, not zero faults.
        let unknown = ConsoleReport {
            guest_dmar_faults: None,
            ..report(Some(0), &[])
        };
        let e = judge(unknown, false, None, "", None, 600, Duration::ZERO).unwrap_err();
        assert_eq!(code(e), EXIT_BED);

        // A kernel log that wrapped may have lost fault records: a bed failure too.
        let wrapped = ConsoleReport {
            dmesg_lost: Some("[  901.2] vfio-pci 0000:00:04.0: enabling device".into()),
            ..report(Some(0), &[])
        };
        let e = judge(wrapped, false, None, "", None, 600, Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("lost its oldest lines"), "{e}");
        assert_eq!(code(e), EXIT_BED);

        let fault = "DMAR: [DMA Write NO_PASID] Request device [00:04.0] fault addr 0x1000 [fault reason 0x05] PTE Write access is not set";
        let bad = judge(
            report(Some(0), &[fault]),
            false,
            None,
            "",
            None,
            600,
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(bad.dmar_faults, 1);
        let e = exit_code(&bad, false).unwrap_err();
        assert_eq!(code(e), 1);
        assert_eq!(exit_code(&bad, true).unwrap(), 0);
        let bad3 = judge(
            report(Some(3), &[fault]),
            false,
            None,
            "",
            None,
            600,
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(code(exit_code(&bad3, false).unwrap_err()), 3);

        let e = judge(report(None, &[]), true, None, "", None, 5, Duration::ZERO).unwrap_err();
        assert_eq!(code(e), EXIT_TIMEOUT);
        let mut r = report(None, &[]);
        r.panic = Some("Kernel panic - not syncing: x".into());
        assert_eq!(
            code(judge(r, false, None, "", None, 5, Duration::ZERO).unwrap_err()),
            EXIT_BED
        );
        let mut r = report(None, &[]);
        r.begun = false;
        r.setup_failure = Some("cannot bind".into());
        let e = judge(r, false, None, "", None, 5, Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("cannot bind"));
        assert_eq!(code(e), EXIT_BED);
        assert_eq!(
            code(judge(report(None, &[]), false, None, "", None, 5, Duration::ZERO).unwrap_err()),
            EXIT_BED
        );
    }

    #[test]
    fn qemu_failing_after_the_report_fails_the_run() {
        use std::os::unix::process::ExitStatusExt;
        // SIGABRT (an assertion in the emulator) after the guest reported 0.
        let aborted = std::process::ExitStatus::from_raw(6);
        let e = judge(
            report(Some(0), &[]),
            false,
            Some(aborted),
            "qemu-system-x86_64: ../hw/nvme/ctrl.c:1234: assertion failed",
            Some("QEMU's backtrace (core dump removed):\n#0 abort"),
            600,
            Duration::ZERO,
        )
        .unwrap_err();
        let msg = e.to_string();
        assert_eq!(code(e), EXIT_BED);
        assert!(
            msg.contains("after the guest reported COMMAND's exit status 0"),
            "{msg}"
        );
        assert!(
            msg.contains("assertion failed") && msg.contains("backtrace"),
            "{msg}"
        );
        // A non-zero exit of QEMU itself (exit code 1) fails the run too.
        let failed = std::process::ExitStatus::from_raw(1 << 8);
        let e = judge(
            report(Some(0), &[]),
            false,
            Some(failed),
            "",
            None,
            600,
            Duration::ZERO,
        )
        .unwrap_err();
        assert_eq!(code(e), EXIT_BED);
        // A clean power-off, or QEMU killed after the grace period, is fine.
        let clean = std::process::ExitStatus::from_raw(0);
        for status in [Some(clean), None] {
            let ok = judge(
                report(Some(3), &[]),
                false,
                status,
                "",
                None,
                600,
                Duration::ZERO,
            )
            .unwrap();
            assert_eq!(ok.status, 3);
        }
    }

    #[test]
    fn disk_sizes() {
        let mut a = VmArgs::default();
        assert_eq!(disk_size(&a).unwrap(), DEFAULT_DISK_SIZE);
        a.disk_size = Some(cli::Size(1 << 20));
        assert_eq!(disk_size(&a).unwrap(), 1 << 20);
        let f = std::env::temp_dir().join(format!("xtask-disk-{}", std::process::id()));
        fs::File::create(&f).unwrap().set_len(8192).unwrap();
        a.disk = Some(f.clone());
        assert!(disk_size(&a).is_err());
        a.disk_size = None;
        assert_eq!(disk_size(&a).unwrap(), 8192);
        fs::remove_file(f).unwrap();
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce(), nonce());
        assert_eq!(nonce().len(), 16);
    }
}
