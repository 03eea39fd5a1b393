//! `upnvme setup status|bind|unbind|hugepages`: what SPDK's `setup.sh` does,
//! for upnvme — show whether the machine is ready (IOMMU, drivers, IOMMU
//! groups, hugepages), bind NVMe controllers to vfio-pci (never one whose
//! namespaces are in use), give them back to the kernel's nvme driver, and
//! reserve hugepages. Every refusal says why and what to do.

pub mod host;

use std::fmt::Write as _;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use host::{
    ControllerInfo, Host, HugePool, ProcUser, pids, resolve_targets, size_name, those_processes,
};

/// `upnvme setup`.
#[derive(Args, Debug)]
#[command(subcommand_required = true, arg_required_else_help = true)]
pub struct SetupArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: SetupCommand,
}

/// The `setup` subcommands.
#[derive(Subcommand, Debug)]
pub enum SetupCommand {
    /// Show the IOMMU state, every NVMe controller with its driver, IOMMU group
    /// (and whether the group is viable) and block devices, and the hugepage
    /// reservation of every page size.
    Status {
        /// Print one JSON document instead of the tables.
        #[arg(long)]
        json: bool,
    },
    /// Bind NVMe controllers to vfio-pci (loads the vfio-pci module if needed).
    /// Refuses a controller whose namespaces are mounted, used as swap,
    /// stacked on (LVM, RAID, dm-crypt) or open. Binding a controller that is
    /// already bound is a no-op.
    Bind {
        /// PCI addresses (default: every NVMe controller whose namespaces are
        /// not in use).
        #[arg(value_name = "ADDRESS", value_parser = crate::pci_address)]
        devices: Vec<String>,
    },
    /// Give NVMe controllers back to the kernel's nvme driver (clears
    /// driver_override and re-probes). Refuses a controller that a process has
    /// open through VFIO.
    Unbind {
        /// PCI addresses (default: every NVMe controller bound to vfio-pci).
        #[arg(value_name = "ADDRESS", value_parser = crate::pci_address)]
        devices: Vec<String>,
    },
    /// Reserve COUNT hugepages of a size in total (writes nr_hugepages) and
    /// report what the kernel gave. All or nothing: when the kernel reserves
    /// fewer than COUNT (memory too fragmented or too small), the previous
    /// count is written back and the command fails, saying how many the
    /// kernel could give, how much memory is free, and what to do (asking
    /// for that many keeps them).
    Hugepages {
        /// Pages to have reserved (0 releases the reservation).
        count: u64,
        /// Page size: 2M or 1G (any size the kernel offers, e.g. 2048k).
        #[arg(long, default_value = "2M", value_parser = parse_page_size)]
        size: u64,
    },
}

/// Parses a page size (`2M`, `1G`, `2048k`, `1GiB`, `2097152`) into KiB.
pub fn parse_page_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size such as 2M or 1G"))?;
    let kib = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => {
            if !n.is_multiple_of(1024) {
                return Err(format!("'{s}' is not a whole number of KiB"));
            }
            Some(n / 1024)
        }
        "k" | "kb" | "kib" => Some(n),
        "m" | "mb" | "mib" => n.checked_mul(1024),
        "g" | "gb" | "gib" => n.checked_mul(1024 * 1024),
        _ => return Err(format!("'{s}': unknown unit '{unit}' (use K, M or G)")),
    }
    .ok_or_else(|| format!("'{s}' is too large for a page size"))?;
    if kib == 0 {
        return Err(format!("'{s}' is not a page size"));
    }
    Ok(kib)
}

/// What a controller behind Intel VMD is, for status and `bind`.
const VMD: &str = "behind Intel VMD: not assignable to vfio-pci on its own";

/// What to do about a controller behind Intel VMD.
const VMD_FIX: &str = "the VMD endpoint (its buses are the PCI domains from 10000 up) does the DMA of every device behind it; to use the controller with upnvme, turn VMD off for its ports in the firmware setup (Intel VMD / RST), which puts it in PCI domain 0000 as an ordinary PCIe function, or leave it to the kernel's nvme driver";

/// Whether `driver` is a uio driver SPDK and DPDK use (`/dev/uioN`).
fn is_uio(driver: &str) -> bool {
    matches!(driver, "uio_pci_generic" | "igb_uio")
}

/// Runs `upnvme setup …` on this machine.
pub fn run(args: SetupArgs) -> Result<()> {
    let host = Host::default();
    match args.command {
        SetupCommand::Status { json } => {
            let s = Status::read(&host)?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&s.json())?);
            } else {
                out!("{}", s.text());
            }
            Ok(())
        }
        SetupCommand::Bind { devices } => bind(&host, &devices),
        SetupCommand::Unbind { devices } => unbind(&host, &devices),
        SetupCommand::Hugepages { count, size } => hugepages(&host, count, size),
    }
}

/// Everything `setup status` shows.
pub struct Status {
    /// The IOMMU.
    pub iommu: host::IommuState,
    /// Whether the vfio-pci driver is registered.
    pub vfio_pci: bool,
    /// Whether the kernel's nvme driver is registered.
    pub nvme: bool,
    /// The NVMe controllers.
    pub controllers: Vec<ControllerInfo>,
    /// The hugepage pools.
    pub hugepages: Vec<HugePool>,
}

impl Status {
    /// Reads the machine.
    pub fn read(host: &Host) -> Result<Status> {
        Ok(Status {
            iommu: host.iommu(),
            vfio_pci: host.driver_loaded("vfio-pci"),
            nvme: host.driver_loaded("nvme"),
            controllers: host.controllers()?,
            hugepages: host.hugepage_pools(),
        })
    }

    /// What to do about one controller (`None` when upnvme can use it).
    fn advice(&self, c: &ControllerInfo) -> Option<String> {
        let a = c.address();
        if c.behind_vmd() {
            return Some(format!("{a}: {VMD}; {VMD_FIX}"));
        }
        if c.function.iommu_group.is_none() {
            return Some(format!("{a}: no IOMMU group; see the IOMMU line above"));
        }
        let uses = c.in_use();
        if !uses.is_empty() {
            return Some(format!(
                "{a}: in use by {}, leave it there or free it first: {}",
                c.used_by(),
                uses.join("; ")
            ));
        }
        let mut notes = Vec::new();
        match c.driver() {
            Some("vfio-pci") => {}
            _ if c.sriov_blocker().is_some() => notes.extend(c.sriov_blocker()),
            // Its group cannot become viable: binding would not help.
            _ if !c.vital_blockers().is_empty() => {}
            Some(d) if is_uio(d) => {
                notes.push(format!(
                    "on {d}, which no process holds: bind it with `upnvme setup bind {a}`"
                ));
            }
            _ => notes.push(format!("bind it with `upnvme setup bind {a}`")),
        }
        notes.extend(c.group_advice());
        let users = c.vfio_users();
        if !users.is_empty() {
            notes.push(format!("open by {}", pids(&users)));
        }
        (!notes.is_empty()).then(|| format!("{a}: {}", notes.join("; ")))
    }

    /// The human-readable report.
    pub fn text(&self) -> String {
        let mut o = String::new();
        let i = &self.iommu;
        let cmdline = if i.cmdline.is_empty() {
            "no IOMMU options on the kernel command line".to_string()
        } else {
            format!("kernel command line: {}", i.cmdline.join(" "))
        };
        if i.enabled() {
            let groups = if i.groups == 1 { "group" } else { "groups" };
            let _ = writeln!(o, "IOMMU: on, {} {groups} ({cmdline})", i.groups);
        } else {
            let _ = writeln!(o, "IOMMU: off ({cmdline})");
            if let Some(a) = i.advice() {
                let _ = writeln!(o, "  {a}");
            }
        }
        let loaded = |b: bool| if b { "loaded" } else { "not loaded" };
        let _ = writeln!(
            o,
            "Drivers: vfio-pci {}, nvme {}",
            loaded(self.vfio_pci),
            loaded(self.nvme)
        );
        let _ = writeln!(o);
        let _ = writeln!(o, "Hugepages:");
        if self.hugepages.is_empty() {
            let _ = writeln!(o, "  (none: the kernel has no hugetlb support)");
        } else {
            let _ = writeln!(
                o,
                "  {:<8} {:>9} {:>9} {:>9}",
                "Size", "Reserved", "Free", "Surplus"
            );
            for p in &self.hugepages {
                let _ = writeln!(
                    o,
                    "  {:<8} {:>9} {:>9} {:>9}",
                    size_name(p.size_kib),
                    p.reserved,
                    p.free,
                    p.surplus
                );
            }
            if let Some(p) = self
                .hugepages
                .iter()
                .find(|p| p.size_kib == 2048 && p.free == 0)
            {
                // A count is the new total, not an addition: never below
                // what is reserved (that would give pages back), and 512
                // (1 GiB) more than now, at least 512.
                let _ = writeln!(
                    o,
                    "  no free 2 MiB hugepage: reserve more with `upnvme setup hugepages {}`",
                    p.reserved.saturating_add(512).max(512)
                );
            }
        }
        let _ = writeln!(o);
        let _ = writeln!(o, "NVMe controllers:");
        if self.controllers.is_empty() {
            let _ = writeln!(o, "  (none on the PCI bus)");
            return o;
        }
        // Wide enough for the longest driver (uio_pci_generic) or override.
        let width = |name: fn(&ControllerInfo) -> Option<&str>| {
            self.controllers
                .iter()
                .filter_map(name)
                .map(str::len)
                .fold(9, usize::max)
        };
        let dw = width(|c| c.driver());
        let ow = width(|c| c.driver_override.as_deref());
        let _ = writeln!(
            o,
            "  {:<13} {:<10} {:<dw$} {:<ow$} {:>5} {:<6} {:<6} Block devices",
            "Address", "Vendor:ID", "Driver", "Override", "Group", "Viable", "Ready"
        );
        for c in &self.controllers {
            let f = &c.function;
            let blocks: Vec<String> = c
                .block_devices
                .iter()
                .map(|b| {
                    if b.uses().is_empty() {
                        b.name.clone()
                    } else {
                        format!("{} (in use)", b.name)
                    }
                })
                .collect();
            let _ = writeln!(
                o,
                "  {:<13} {:<10} {:<dw$} {:<ow$} {:>5} {:<6} {:<6} {}",
                f.address.to_string(),
                format!("{:04x}:{:04x}", f.vendor, f.device),
                f.driver.as_deref().unwrap_or("none"),
                c.driver_override.as_deref().unwrap_or("-"),
                f.iommu_group
                    .map_or_else(|| "-".to_string(), |g| g.to_string()),
                if c.group_viable() { "yes" } else { "no" },
                if c.ready() { "yes" } else { "no" },
                if blocks.is_empty() {
                    "-".to_string()
                } else {
                    blocks.join(" ")
                }
            );
        }
        let mut groups = Vec::new();
        for c in &self.controllers {
            if !c.group_members.is_empty() {
                let m: Vec<String> = c
                    .group_members
                    .iter()
                    .map(|m| {
                        format!(
                            "{} ({})",
                            m.address,
                            m.driver.as_deref().unwrap_or("no driver")
                        )
                    })
                    .collect();
                groups.push(format!(
                    "  group {} of {} also holds {}",
                    c.function.iommu_group.unwrap_or_default(),
                    c.address(),
                    m.join(", ")
                ));
            }
        }
        if !groups.is_empty() {
            let _ = writeln!(o);
            let _ = writeln!(o, "IOMMU groups shared with other devices:");
            for g in groups {
                let _ = writeln!(o, "{g}");
            }
        }
        let advice: Vec<String> = self
            .controllers
            .iter()
            .filter_map(|c| self.advice(c))
            .collect();
        if !advice.is_empty() {
            let _ = writeln!(o);
            let _ = writeln!(o, "To do:");
            for a in advice {
                let _ = writeln!(o, "  {a}");
            }
        }
        o
    }

    /// The JSON document (fields documented in docs/setup.md).
    pub fn json(&self) -> Value {
        let controllers: Vec<Value> = self
            .controllers
            .iter()
            .map(|c| {
                let f = &c.function;
                json!({
                    "address": f.address.to_string(),
                    "vendor": format!("{:04x}", f.vendor),
                    "device": format!("{:04x}", f.device),
                    "driver": f.driver,
                    "driver_override": c.driver_override,
                    "sriov_numvfs": c.sriov_numvfs,
                    "iommu_group": f.iommu_group,
                    "group_members": c.group_members.iter().map(|m| json!({
                        "address": m.address,
                        "driver": m.driver,
                    })).collect::<Vec<_>>(),
                    "group_viable": c.group_viable(),
                    "group_blockers": c.blockers,
                    "group_open_by": users_json(&c.group_users),
                    "group_blockers_vital": c.vital_blockers(),
                    "behind_vmd": c.behind_vmd(),
                    "block_devices": c.block_devices.iter().map(|b| json!({
                        "name": b.name,
                        "namespace": b.namespace,
                        "mounts": b.mounts,
                        "swap": b.swap,
                        "holders": b.holders,
                        "open_by": users_json(&b.open_by),
                        "claimed": b.claimed,
                        "kernel_users": b.kernel_users.iter().map(|k| k.id()).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>(),
                    "char_devices_open_by": nodes_json(&c.char_users),
                    "vfio_devices_open_by": nodes_json(&c.cdev_users),
                    "uio_open_by": nodes_json(&c.uio_users),
                    "char_devices_kernel_users": c.char_kernel_users.iter().map(|(name, k)| json!({
                        "name": name,
                        "user": k.id(),
                    })).collect::<Vec<_>>(),
                    "in_use": c.in_use(),
                    "ready": c.ready(),
                    "advice": self.advice(c),
                })
            })
            .collect();
        json!({
            "iommu": {
                "enabled": self.iommu.enabled(),
                "groups": self.iommu.groups,
                "cmdline": self.iommu.cmdline,
                "advice": self.iommu.advice(),
            },
            "drivers": {
                "vfio-pci": self.vfio_pci,
                "nvme": self.nvme,
            },
            "controllers": controllers,
            "hugepages": self.hugepages.iter().map(|p| json!({
                "size_kib": p.size_kib,
                "reserved": p.reserved,
                "free": p.free,
                "surplus": p.surplus,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Processes as JSON: `[{"pid", "comm"}]`.
fn users_json(users: &[ProcUser]) -> Value {
    users
        .iter()
        .map(|u| json!({"pid": u.pid, "comm": u.comm}))
        .collect()
}

/// Device nodes with the processes that have them open, as JSON:
/// `[{"name", "open_by"}]`.
fn nodes_json(nodes: &[(String, Vec<ProcUser>)]) -> Value {
    nodes
        .iter()
        .map(|(name, users)| json!({"name": name, "open_by": users_json(users)}))
        .collect()
}

/// Why `bind` must not touch `c`, with what to do (`None`: go ahead).
pub fn bind_refusal(c: &ControllerInfo, iommu: &host::IommuState) -> Option<String> {
    let a = c.address();
    if c.behind_vmd() {
        return Some(format!(
            "refusing to bind {a} to vfio-pci: it is {VMD}; {VMD_FIX}"
        ));
    }
    let uses = c.in_use();
    if !uses.is_empty() {
        let what = if c.uio_users.is_empty() {
            "its namespaces are in use, and binding would pull them from under their users"
                .to_string()
        } else {
            format!(
                "a userspace driver uses it through {}, and binding would pull the device from under it",
                c.driver().unwrap_or("uio")
            )
        };
        return Some(format!(
            "refusing to bind {a} to vfio-pci: {what}: {}; then run `upnvme setup bind {a}` again",
            uses.join("; ")
        ));
    }
    if let Some(why) = c.sriov_blocker() {
        return Some(format!(
            "refusing to bind {a} to vfio-pci: {why}; then run `upnvme setup bind {a}` again"
        ));
    }
    if c.function.iommu_group.is_none() {
        let why = iommu
            .advice()
            .unwrap_or_else(|| format!("{a} is not in an IOMMU group"));
        return Some(format!(
            "refusing to bind {a} to vfio-pci: it has no IOMMU group, so vfio-pci cannot take it; {why}"
        ));
    }
    None
}

/// Why `unbind` must not touch `c` (`None`: go ahead): a process holding
/// its VFIO group or device cdev (the kernel would wait for it), or its uio
/// node (it would lose the device).
pub fn unbind_refusal(c: &ControllerInfo) -> Option<String> {
    const WAIT: &str = "unbinding would wait until it is closed";
    let mut held: Vec<(String, &[ProcUser], String)> = Vec::new();
    if !c.group_users.is_empty() {
        let g = c.function.iommu_group.unwrap_or_default();
        held.push((
            format!("its VFIO group /dev/vfio/{g}"),
            &c.group_users,
            WAIT.into(),
        ));
    }
    for (name, users) in &c.cdev_users {
        held.push((format!("its VFIO device /dev/{name}"), users, WAIT.into()));
    }
    for (name, users) in &c.uio_users {
        held.push((
            format!("/dev/{name}"),
            users,
            format!(
                "a userspace driver through {}: unbinding would pull the device from under it",
                c.driver().unwrap_or("uio")
            ),
        ));
    }
    if held.is_empty() {
        return None;
    }
    let a = c.address();
    let mut all: Vec<&ProcUser> = held.iter().flat_map(|(_, u, _)| u.iter()).collect();
    all.sort();
    all.dedup();
    let what: Vec<String> = held
        .iter()
        .map(|(node, users, why)| format!("{node} is open by {} ({why})", pids(users)))
        .collect();
    Some(format!(
        "refusing to unbind {a}: {}; stop {} first, then run `upnvme setup unbind {a}` again",
        what.join("; "),
        those_processes(all.len())
    ))
}

/// Writes a sysfs attribute; permission problems say to run as root.
fn write_attr(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).map_err(|e| {
        if matches!(e.kind(), ErrorKind::PermissionDenied) || e.raw_os_error() == Some(1) {
            anyhow!(
                "writing {value:?} to {}: {e}; run upnvme setup as root (sudo)",
                path.display()
            )
        } else {
            anyhow!("writing {value:?} to {}: {e}", path.display())
        }
    })
}

/// The driver of `addr` now, waiting up to `wait` for it to become `want`.
fn driver_after(
    host: &Host,
    c: &ControllerInfo,
    want: Option<&str>,
    wait: Duration,
) -> Option<String> {
    let link = host.device_dir(&c.address()).join("driver");
    let start = Instant::now();
    loop {
        let now = fs::read_link(&link)
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
        if now.as_deref() == want || start.elapsed() >= wait {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Loads the vfio-pci driver if it is not registered.
fn ensure_vfio_pci(host: &Host) -> Result<()> {
    if host.driver_loaded("vfio-pci") {
        return Ok(());
    }
    let why = match Command::new("modprobe").arg("vfio-pci").output() {
        Ok(o) if o.status.success() => String::new(),
        Ok(o) => format!(
            "`modprobe vfio-pci` failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("modprobe could not be run ({e})"),
    };
    if host.driver_loaded("vfio-pci") {
        return Ok(());
    }
    bail!(
        "the vfio-pci driver is not available{}{why}; load it (`modprobe vfio-pci`, as root) or use a kernel built with CONFIG_VFIO_PCI",
        if why.is_empty() { "" } else { ": " }
    )
}

/// `upnvme setup bind [ADDRESS…]`.
fn bind(host: &Host, wanted: &[String]) -> Result<()> {
    let targets = resolve_targets(host, wanted)?;
    if targets.is_empty() {
        bail!("no NVMe controller found on the PCI bus (run `upnvme setup status`)");
    }
    let iommu = host.iommu();
    let mut go = Vec::new();
    let mut refusals = Vec::new();
    for c in targets {
        // Without addresses, controllers in use (by the kernel or a
        // userspace driver) and those behind VMD are skipped.
        let a = c.address();
        if wanted.is_empty() && c.behind_vmd() {
            outln!("{a}: skipped, {VMD}");
            continue;
        }
        if wanted.is_empty() && !c.in_use().is_empty() {
            outln!("{a}: skipped, in use: {}", c.in_use().join("; "));
            continue;
        }
        if wanted.is_empty()
            && let Some(why) = c.sriov_blocker()
        {
            outln!("{a}: skipped, {why}");
            continue;
        }
        match bind_refusal(&c, &iommu) {
            None => go.push(c),
            Some(r) => refusals.push(r),
        }
    }
    if !refusals.is_empty() {
        bail!("{}; nothing was changed", refusals.join("\n"));
    }
    if go.iter().any(|c| c.driver() != Some("vfio-pci")) {
        ensure_vfio_pci(host)?;
    }
    // What a failure undoes concerns its controller only: the error says
    // what was done before it and what was not tried. Each controller is
    // read and checked again right before it moves: moving those before it
    // takes seconds, in which its namespaces may have come into use.
    each_in_turn(&go, ["bind", "unbind"], "vfio-pci", |c| {
        let now = host.controller(&c.address())?;
        if let Some(r) = bind_refusal(&now, &iommu) {
            bail!("{r} (it came into use after `bind` started; it was left as it was)");
        }
        bind_one(host, &now)
    })
}

/// Where a controller is: "on nvme", "no driver".
fn place(c: &ControllerInfo) -> String {
    c.driver()
        .map_or("no driver".to_string(), |d| format!("on {d}"))
}

/// Runs `one` on each of `targets` in turn (`verbs`: the command and the
/// one that undoes it, e.g. `["bind", "unbind"]`), stopping at the first
/// failure. `one` says what it did ("nvme -> vfio-pci"), or `None` when the
/// controller was on `goal` already. A failure with other targets named
/// lists, below its error, those done before it (with the command that
/// moves back the ones that moved), the one that failed, and those not
/// tried (with the command that finishes the job).
fn each_in_turn(
    targets: &[ControllerInfo],
    verbs: [&str; 2],
    goal: &str,
    mut one: impl FnMut(&ControllerInfo) -> Result<Option<String>>,
) -> Result<()> {
    let [verb, undo] = verbs;
    let mut done: Vec<String> = Vec::new();
    let mut moved: Vec<String> = Vec::new();
    for (i, c) in targets.iter().enumerate() {
        let a = c.address().to_string();
        let e = match one(c) {
            Ok(Some(what)) => {
                done.push(format!("{a} ({what})"));
                moved.push(a);
                continue;
            }
            Ok(None) => {
                done.push(format!("{a} (already on {goal})"));
                continue;
            }
            Err(e) => e,
        };
        let rest = &targets[i + 1..];
        if done.is_empty() && rest.is_empty() {
            return Err(e);
        }
        let mut msg = format!("{e:#}");
        if !done.is_empty() {
            let _ = write!(msg, "\ndone before this failure: {}", done.join(", "));
            if !moved.is_empty() {
                let _ = write!(
                    msg,
                    "; `upnvme setup {undo} {}` undoes {}",
                    moved.join(" "),
                    if moved.len() == 1 { "it" } else { "them" }
                );
            }
        }
        let _ = write!(msg, "\nfailed: {a} (the error above)");
        if !rest.is_empty() {
            let left: Vec<String> = rest
                .iter()
                .map(|r| format!("{} ({})", r.address(), place(r)))
                .collect();
            let again: Vec<String> = std::iter::once(a)
                .chain(rest.iter().map(|r| r.address().to_string()))
                .collect();
            let _ = write!(
                msg,
                "\nnot tried, left as they were: {}; `upnvme setup {verb} {}` finishes once the failure is fixed",
                left.join(", "),
                again.join(" ")
            );
        }
        bail!("{msg}");
    }
    Ok(())
}

/// Binds one controller to vfio-pci: `Some("nvme -> vfio-pci")`, or `None`
/// when it was bound already.
fn bind_one(host: &Host, c: &ControllerInfo) -> Result<Option<String>> {
    let a = c.address();
    let dir = host.device_dir(&a);
    let group = c.function.iommu_group.unwrap_or_default();
    let viability = c.group_advice().map_or(String::new(), |g| {
        format!("\n  warning: {g}; until then upnvme cannot open {a}")
    });
    if c.driver_override.as_deref() != Some("vfio-pci") {
        // Also for a bound controller: the override keeps it on vfio-pci
        // across a re-probe.
        write_attr(&dir.join("driver_override"), "vfio-pci")?;
    }
    if c.driver() == Some("vfio-pci") {
        outln!("{a}: already bound to vfio-pci (IOMMU group {group}){viability}");
        return Ok(None);
    }
    if let Some(d) = c.driver()
        && d != "vfio-pci"
        && let Err(e) = write_attr(&dir.join("driver/unbind"), &a.to_string())
    {
        let undo = undo_bind(host, c);
        return Err(e.context(format!("unbinding {a} from {d}{undo}")));
    }
    let probe = write_attr(&host.sys_path("bus/pci/drivers_probe"), &a.to_string());
    let now = driver_after(host, c, Some("vfio-pci"), Duration::from_secs(2));
    if now.as_deref() != Some("vfio-pci") {
        let undo = undo_bind(host, c);
        let why = probe.err().map_or(String::new(), |e| format!(" ({e})"));
        bail!("{a} did not bind to vfio-pci{why}; the kernel log (`dmesg | tail`) says why{undo}",);
    }
    let node = match group_node_after_bind(host, &a, group, Duration::from_secs(2)) {
        Ok(node) => node.display().to_string(),
        Err(warning) => format!("no group node\n  warning: {warning}"),
    };
    let moved = format!("{} -> vfio-pci", c.driver().unwrap_or("no driver"));
    outln!("{a}: {moved} (IOMMU group {group}, {node}){viability}");
    Ok(Some(moved))
}

/// Waits up to `wait` for the VFIO group's device node (`/dev/vfio/GROUP`),
/// which appears with a controller's binding to vfio-pci. Its absence is
/// explained: upnvme opens a controller through its group (the VFIO
/// container interface), so without the node it cannot open it. A kernel
/// built with iommufd but without `CONFIG_VFIO_GROUP` gives the device only
/// its cdev (`/dev/vfio/devices/vfioX`, sysfs `vfio-dev/vfioX`).
fn group_node_after_bind(
    host: &Host,
    a: &upnvme::PciAddress,
    group: u32,
    wait: Duration,
) -> std::result::Result<PathBuf, String> {
    let node = host.dev_path(&format!("vfio/{group}"));
    let start = Instant::now();
    while !node.exists() && start.elapsed() < wait {
        std::thread::sleep(Duration::from_millis(20));
    }
    if node.exists() {
        return Ok(node);
    }
    let cdevs: Vec<String> = fs::read_dir(host.device_dir(a).join("vfio-dev"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("vfio"))
                .map(|n| {
                    host.dev_path(&format!("vfio/devices/{n}"))
                        .display()
                        .to_string()
                })
                .collect()
        })
        .unwrap_or_default();
    let waited = wait.as_secs_f64();
    Err(if cdevs.is_empty() {
        format!(
            "{} did not appear within {waited:.0} s; upnvme opens {a} through that node, so it \
             cannot open it until it exists (check `ls -l /dev/vfio` and the kernel log, \
             `dmesg | grep -i vfio`; a system without devtmpfs needs udev to create it)",
            node.display()
        )
    } else {
        format!(
            "{} did not appear within {waited:.0} s, but {a} has the VFIO device cdev {}: this \
             kernel offers only the iommufd interface (built without CONFIG_VFIO_GROUP), and \
             upnvme opens controllers through the VFIO group; use a kernel with \
             CONFIG_VFIO_GROUP=y (and CONFIG_VFIO_CONTAINER=y or IOMMUFD_VFIO_CONTAINER=y)",
            node.display(),
            cdevs.join(", ")
        )
    })
}

/// Puts a controller whose binding to vfio-pci failed back as it was:
/// its previous `driver_override` (none: cleared), and, when it was left
/// without a driver, a re-probe that hands it back to its previous driver —
/// with the override naming that driver during the probe, since the old
/// override may itself be what keeps the kernel from giving it back (a
/// stale `vfio-pci`, when vfio-pci is what refused it), then the old
/// override again. Returns what the controller is now, for the error text.
fn undo_bind(host: &Host, c: &ControllerInfo) -> String {
    let a = c.address();
    let dir = host.device_dir(&a);
    if !dir.exists() {
        return format!(
            "; {a} is gone from the PCI bus (removed during the bind): there is nothing left to undo (`upnvme setup status` lists it again once it is back)"
        );
    }
    // An empty line clears driver_override.
    let old = c.driver_override.as_deref().unwrap_or("\n");
    let set_back = |what: &str| {
        write_attr(&dir.join("driver_override"), what).map_err(|e| {
            if dir.exists() {
                format!(
                    "; its driver_override could not be set back ({e}): `upnvme setup unbind {a}` clears it"
                )
            } else {
                format!("; {a} is gone from the PCI bus (removed during the bind)")
            }
        })
    };
    let mut now = driver_after(host, c, c.driver(), Duration::ZERO);
    if now.is_none()
        && let Some(was) = c.driver()
    {
        // The probe goes to the old driver whatever the old override says.
        if let Err(why) = set_back(was) {
            return why;
        }
        let _ = write_attr(&host.sys_path("bus/pci/drivers_probe"), &a.to_string());
        now = driver_after(host, c, Some(was), Duration::from_secs(5));
    }
    if let Err(why) = set_back(old) {
        return why;
    }
    match (now.as_deref(), c.driver()) {
        (d, was) if d == was => format!(
            "; nothing was changed ({a} is on {} again)",
            d.unwrap_or("no driver")
        ),
        (d, was) => format!(
            "; {a} was on {}, is now on {} (its driver_override is set back); `upnvme setup unbind {a}` hands it to the kernel's nvme driver",
            was.unwrap_or("no driver"),
            d.unwrap_or("no driver")
        ),
    }
}

/// `upnvme setup unbind [ADDRESS…]`.
fn unbind(host: &Host, wanted: &[String]) -> Result<()> {
    let mut targets = resolve_targets(host, wanted)?;
    if wanted.is_empty() {
        targets.retain(|c| {
            c.driver() == Some("vfio-pci") || c.driver_override.as_deref() == Some("vfio-pci")
        });
        if targets.is_empty() {
            outln!("no NVMe controller is bound to vfio-pci; nothing to do");
            return Ok(());
        }
    }
    let refusals: Vec<String> = targets.iter().filter_map(unbind_refusal).collect();
    if !refusals.is_empty() {
        bail!("{}; nothing was changed", refusals.join("\n"));
    }
    let nvme_loaded = host.driver_loaded("nvme");
    // Checked again right before each moves (see `bind`).
    each_in_turn(&targets, ["unbind", "bind"], "nvme", |c| {
        let now = host.controller(&c.address())?;
        if let Some(r) = unbind_refusal(&now) {
            bail!("{r} (it came into use after `unbind` started; it was left as it was)");
        }
        unbind_one(host, &now, nvme_loaded)
    })
}

/// Gives one controller to the kernel's nvme driver (none when it is not
/// loaded): `Some("vfio-pci -> nvme")`, or `None` when it was there already.
fn unbind_one(host: &Host, c: &ControllerInfo, nvme_loaded: bool) -> Result<Option<String>> {
    let a = c.address();
    let dir = host.device_dir(&a);
    if c.driver() == Some("nvme") && c.driver_override.is_none() {
        outln!("{a}: already bound to nvme");
        return Ok(None);
    }
    // An empty line clears driver_override.
    write_attr(&dir.join("driver_override"), "\n")?;
    if let Some(d) = c.driver()
        && d != "nvme"
    {
        write_attr(&dir.join("driver/unbind"), &a.to_string())
            .with_context(|| format!("unbinding {a} from {d}"))?;
    }
    write_attr(&host.sys_path("bus/pci/drivers_probe"), &a.to_string())?;
    let want = nvme_loaded.then_some("nvme");
    let now = driver_after(host, c, want, Duration::from_secs(5));
    let from = c.driver().unwrap_or("no driver");
    match now.as_deref() {
        Some(d) => outln!("{a}: {from} -> {d}"),
        None if !nvme_loaded => outln!(
            "{a}: {from} -> no driver: the kernel's nvme driver is not loaded; load it (`modprobe nvme`) and run `upnvme setup unbind {a}` again to hand the controller to it"
        ),
        None => bail!(
            "{a}: {from} -> no driver: the nvme driver did not take it; the kernel log (`dmesg | tail`) says why"
        ),
    }
    Ok(Some(format!(
        "{from} -> {}",
        now.as_deref().unwrap_or("no driver")
    )))
}

/// `upnvme setup hugepages COUNT [--size S]`.
fn hugepages(host: &Host, count: u64, size_kib: u64) -> Result<()> {
    reserve_hugepages(host, count, size_kib, write_attr)
}

/// [`hugepages`] writing `nr_hugepages` with `write` (host tests stand in
/// for a kernel that reserves fewer pages than asked).
fn reserve_hugepages(
    host: &Host,
    count: u64,
    size_kib: u64,
    write: fn(&Path, &str) -> Result<()>,
) -> Result<()> {
    let name = size_name(size_kib);
    let dir = host.hugepage_dir(size_kib);
    if !dir.is_dir() {
        let sizes: Vec<String> = host
            .hugepage_pools()
            .iter()
            .map(|p| size_name(p.size_kib))
            .collect();
        let hint = if size_kib == 1 << 20 {
            " (1 GiB pages need a CPU with the pdpe1gb flag)"
        } else {
            ""
        };
        bail!(
            "the kernel offers no {name} hugepages{hint}; sizes offered: {}",
            if sizes.is_empty() {
                "none (a kernel without CONFIG_HUGETLBFS)".to_string()
            } else {
                sizes.join(", ")
            }
        );
    }
    let before = host
        .hugepage_pools()
        .into_iter()
        .find(|p| p.size_kib == size_kib);
    let was = before.as_ref().map_or(0, |b| b.reserved);
    hugepage_request_check(count, size_kib, was, host.mem_available_kib())
        .map_err(crate::usage::usage)?;
    let nr = dir.join("nr_hugepages");
    let pool = || {
        host.hugepage_pools()
            .into_iter()
            .find(|p| p.size_kib == size_kib)
            .ok_or_else(|| anyhow!("{} disappeared", dir.display()))
    };
    write(&nr, &count.to_string())?;
    let after = pool()?;
    let mut now = Ok(after.reserved);
    if after.reserved < count {
        if after.reserved != was {
            // All or nothing: give back what a short grant took.
            now = write(&nr, &was.to_string())
                .and_then(|()| pool())
                .map(|p| p.reserved)
                .map_err(|e| format!("{e:#}"));
        }
    } else {
        outln!(
            "{name} hugepages: {} reserved ({} free), asked for {count}{}",
            after.reserved,
            after.free,
            before.map_or(String::new(), |b| format!(", was {}", b.reserved))
        );
    }
    match hugepage_verdict(count, size_kib, was, &after, now, host.mem_free_kib()) {
        Ok(Some(note)) => {
            outln!("{note}");
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => Err(anyhow!(e)),
    }
}

/// Whether asking for `asked` pages could leave the system without memory:
/// the kernel reserves all it can find, so a request beyond what is
/// available (`MemAvailable` plus the pages already reserved) would take
/// every free page and leave programs to the OOM killer — refused, with the
/// most that can be asked. A request that lowers the reservation, or one on
/// a host whose /proc/meminfo cannot be read, passes.
pub fn hugepage_request_check(
    asked: u64,
    size_kib: u64,
    reserved: u64,
    mem_available_kib: Option<u64>,
) -> Result<(), String> {
    let Some(available) = mem_available_kib else {
        return Ok(());
    };
    if asked <= reserved {
        return Ok(());
    }
    let most = reserved.saturating_add(available / size_kib);
    if asked <= most {
        return Ok(());
    }
    let name = size_name(size_kib);
    let mib = |pages: u64| u128::from(pages) * u128::from(size_kib) / 1024;
    Err(format!(
        "{asked} {name} hugepages ({} MiB) are more than this system can give: {} MiB are available \
         (MemAvailable) and {reserved} pages ({} MiB) are reserved already, so the kernel would take \
         every free page and leave programs to the OOM killer; ask for at most {most}, less to leave \
         memory for programs{}",
        mib(asked),
        available / 1024,
        mib(reserved),
        if size_kib == 2048 {
            " (a queue pair needs one or two 2 MiB pages, see docs/setup.md)"
        } else {
            ""
        },
    ))
}

/// A page size as `--size` and `hugepagesz=` spell it: `2M`, `1G`, `64K`.
fn size_flag(kib: u64) -> String {
    size_name(kib).replace(' ', "").replace("iB", "")
}

/// Whether the kernel gave the `asked` pages (`was` reserved before, `got`
/// the pool after the request): a note when it kept more; when it gave
/// fewer, an error with how many, the free memory, what became of the
/// reservation (`now`: the count after `was` was written back, or why that
/// failed) and what to do.
pub fn hugepage_verdict(
    asked: u64,
    size_kib: u64,
    was: u64,
    got: &HugePool,
    now: Result<u64, String>,
    mem_free_kib: Option<u64>,
) -> Result<Option<String>, String> {
    let name = size_name(size_kib);
    if got.reserved < asked {
        let free = mem_free_kib.map_or(String::new(), |k| {
            format!(" ({} MiB of memory are free in all)", k / 1024)
        });
        let boot = if size_kib == 2048 {
            format!("`hugepages={asked}`")
        } else {
            format!("`hugepagesz={} hugepages={asked}`", size_flag(size_kib))
        };
        let flag = if size_kib == 2048 {
            String::new()
        } else {
            format!(" --size {}", size_flag(size_kib))
        };
        let outcome = match now {
            Ok(n) if n == was => format!("nothing was changed ({was} reserved, as before)"),
            Ok(n) => format!(
                "setting the reservation back to {was} left {n} reserved (`upnvme setup hugepages {was}{flag}` tries again)"
            ),
            Err(e) => format!(
                "{} stay reserved: setting the reservation back to {was} failed ({e}); `upnvme setup hugepages {was}{flag}` tries again",
                got.reserved
            ),
        };
        let take = if got.reserved > was {
            format!(
                ", keep the {} the kernel could give with `upnvme setup hugepages {}{flag}`",
                got.reserved, got.reserved
            )
        } else {
            String::new()
        };
        return Err(format!(
            "only {} of {asked} {name} hugepages could be reserved: the kernel found no more free, contiguous, aligned {name} blocks{free}; {outcome}; free memory (stop programs, `echo 3 > /proc/sys/vm/drop_caches`, `echo 1 > /proc/sys/vm/compact_memory`) and run `upnvme setup hugepages {asked}{flag}` again{take}, or reserve them at boot with {boot} on the kernel command line",
            got.reserved,
        ));
    }
    if got.reserved > asked {
        return Ok(Some(format!(
            "{} {name} hugepages are still mapped by running programs and are released when those exit",
            got.reserved - asked
        )));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::host::fake::Tree;
    use super::*;

    #[test]
    fn page_sizes() {
        assert_eq!(parse_page_size("2M"), Ok(2048));
        assert_eq!(parse_page_size("2m"), Ok(2048));
        assert_eq!(parse_page_size("1G"), Ok(1 << 20));
        assert_eq!(parse_page_size("1GiB"), Ok(1 << 20));
        assert_eq!(parse_page_size("2048k"), Ok(2048));
        assert_eq!(parse_page_size("2097152"), Ok(2048));
        assert!(parse_page_size("2X").unwrap_err().contains("unknown unit"));
        assert!(parse_page_size("M").is_err());
        assert!(parse_page_size("0M").is_err());
        assert!(parse_page_size("1000").is_err());
        assert!(
            parse_page_size("18014398509481984G")
                .unwrap_err()
                .contains("too large")
        );
        assert!(
            parse_page_size("18014398509481984M")
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn a_hugepage_request_beyond_the_available_memory_is_refused() {
        // Lowering, or no /proc/meminfo: nothing to check.
        assert_eq!(hugepage_request_check(10, 2048, 100, Some(0)), Ok(()));
        assert_eq!(hugepage_request_check(1 << 40, 2048, 0, None), Ok(()));
        // 100 reserved + 1000 MiB available = 600 pages of 2 MiB at most.
        assert_eq!(
            hugepage_request_check(600, 2048, 100, Some(1000 * 1024)),
            Ok(())
        );
        let e = hugepage_request_check(601, 2048, 100, Some(1000 * 1024)).unwrap_err();
        assert!(
            e.starts_with("601 2 MiB hugepages (1202 MiB) are more than"),
            "{e}"
        );
        assert!(e.contains("1000 MiB are available"), "{e}");
        assert!(
            e.contains("100 pages (200 MiB) are reserved already"),
            "{e}"
        );
        assert!(e.contains("ask for at most 600"), "{e}");
        // A typo'd count of 1 GiB pages.
        let e = hugepage_request_check(4096, 1 << 20, 0, Some(8 << 20)).unwrap_err();
        assert!(e.contains("ask for at most 8"), "{e}");
    }

    #[test]
    fn hugepage_verdicts() {
        let pool = |reserved| HugePool {
            size_kib: 2048,
            reserved,
            free: reserved,
            surplus: 0,
        };
        assert_eq!(
            hugepage_verdict(128, 2048, 0, &pool(128), Ok(128), None),
            Ok(None)
        );
        let e = hugepage_verdict(1000, 2048, 100, &pool(300), Ok(100), Some(10240)).unwrap_err();
        assert_eq!(
            e,
            "only 300 of 1000 2 MiB hugepages could be reserved: the kernel found no more free, contiguous, aligned 2 MiB blocks (10 MiB of memory are free in all); nothing was changed (100 reserved, as before); free memory (stop programs, `echo 3 > /proc/sys/vm/drop_caches`, `echo 1 > /proc/sys/vm/compact_memory`) and run `upnvme setup hugepages 1000` again, keep the 300 the kernel could give with `upnvme setup hugepages 300`, or reserve them at boot with `hugepages=1000` on the kernel command line"
        );
        // Writing the old count back failed, or left another count.
        let e = hugepage_verdict(1000, 2048, 100, &pool(300), Err("EIO".into()), None).unwrap_err();
        assert!(
            e.contains("; 300 stay reserved: setting the reservation back to 100 failed (EIO); `upnvme setup hugepages 100` tries again;"),
            "{e}"
        );
        let e = hugepage_verdict(1000, 2048, 100, &pool(300), Ok(120), None).unwrap_err();
        assert!(
            e.contains("; setting the reservation back to 100 left 120 reserved"),
            "{e}"
        );
        let g = HugePool {
            size_kib: 1 << 20,
            reserved: 0,
            free: 0,
            surplus: 0,
        };
        let e = hugepage_verdict(2, 1 << 20, 0, &g, Ok(0), None).unwrap_err();
        assert!(e.starts_with("only 0 of 2 1 GiB hugepages"), "{e}");
        assert!(
            e.contains("nothing was changed (0 reserved, as before)"),
            "{e}"
        );
        assert!(!e.contains("keep the"), "{e}");
        assert!(e.contains("`upnvme setup hugepages 2 --size 1G`"), "{e}");
        assert!(e.contains("`hugepagesz=1G hugepages=2`"), "{e}");
        let note = hugepage_verdict(0, 2048, 10, &pool(4), Ok(4), None)
            .unwrap()
            .unwrap();
        assert!(
            note.contains("4 2 MiB hugepages are still mapped"),
            "{note}"
        );
    }

    #[test]
    fn refusals_say_why_and_what_to_do() {
        let t = Tree::new();
        t.device("0000:00:04.0", "0x010802", Some("vfio-pci"), Some(3));
        t.device("0000:00:05.0", "0x010802", Some("nvme"), Some(4));
        t.device("0000:00:06.0", "0x010802", Some("nvme"), Some(5));
        t.device("0000:00:09.0", "0x010802", None, None);
        t.namespace("0000:00:05.0", 0, 1, 1);
        t.namespace("0000:00:06.0", 1, 1, 0);
        t.write(
            "proc/self/mountinfo",
            "23 22 259:11 / /home rw - ext4 /dev/nvme0n1p1 rw\n",
        );
        t.process(99, "upnvme", &["/dev/vfio/3"]);
        let host = t.host();
        let cs = host.controllers().unwrap();
        let iommu = host.iommu();
        // Bound to vfio-pci, nothing mounted: bind is fine, unbind is not while open.
        assert_eq!(bind_refusal(&cs[0], &iommu), None);
        assert_eq!(
            unbind_refusal(&cs[0]).unwrap(),
            "refusing to unbind 0000:00:04.0: its VFIO group /dev/vfio/3 is open by pid 99 (upnvme) (unbinding would wait until it is closed); stop that process first, then run `upnvme setup unbind 0000:00:04.0` again"
        );
        // A mounted partition.
        assert_eq!(
            bind_refusal(&cs[1], &iommu).unwrap(),
            "refusing to bind 0000:00:05.0 to vfio-pci: its namespaces are in use, and binding would pull them from under their users: nvme0n1p1 is mounted at /home: unmount it first (`umount /home`); then run `upnvme setup bind 0000:00:05.0` again"
        );
        assert_eq!(unbind_refusal(&cs[1]), None);
        // Kernel-driven but unused: fine.
        assert_eq!(bind_refusal(&cs[2], &iommu), None);
        // No IOMMU group.
        let r = bind_refusal(&cs[3], &iommu).unwrap();
        assert!(
            r.starts_with("refusing to bind 0000:00:09.0 to vfio-pci: it has no IOMMU group"),
            "{r}"
        );
    }

    #[test]
    fn one_iommu_group_is_one_group() {
        let t = Tree::new();
        t.write("proc/cmdline", "intel_iommu=on\n");
        t.device("0000:00:04.0", "0x010802", Some("vfio-pci"), Some(3));
        let text = Status::read(&t.host()).unwrap().text();
        assert!(text.contains("IOMMU: on, 1 group (kernel"), "{text}");
    }

    #[test]
    fn status_text_and_json() {
        let t = Tree::new();
        t.write("proc/cmdline", "console=ttyS0 intel_iommu=on quiet\n");
        t.device("0000:00:04.0", "0x010802", Some("vfio-pci"), Some(3));
        t.write(
            "sys/bus/pci/devices/0000:00:04.0/driver_override",
            "vfio-pci\n",
        );
        t.device("0000:00:05.0", "0x010802", Some("nvme"), Some(4));
        t.device("0000:00:05.1", "0x0c0330", Some("xhci_hcd"), Some(4));
        t.namespace("0000:00:05.0", 0, 1, 0);
        t.write(
            "proc/swaps",
            "Filename Type\n/dev/nvme0n1 partition 1 0 -2\n",
        );
        t.hugepages(2048, 128, 126);
        t.hugepages(1 << 20, 0, 0);
        let s = Status::read(&t.host()).unwrap();
        let text = s.text();
        assert!(
            text.contains("IOMMU: on, 2 groups (kernel command line: intel_iommu=on)"),
            "{text}"
        );
        assert!(
            text.contains("Drivers: vfio-pci loaded, nvme loaded"),
            "{text}"
        );
        assert!(text.contains("2 MiB          128       126"), "{text}");
        assert!(text.contains("1 GiB"), "{text}");
        assert!(
            text.contains("0000:00:04.0  1b36:0010  vfio-pci  vfio-pci      3 yes    yes    -"),
            "{text}"
        );
        assert!(
            text.contains(
                "0000:00:05.0  1b36:0010  nvme      -             4 no     no     nvme0n1 (in use)"
            ),
            "{text}"
        );
        assert!(
            text.contains("group 4 of 0000:00:05.0 also holds 0000:00:05.1 (xhci_hcd)"),
            "{text}"
        );
        assert!(text.contains("swapoff /dev/nvme0n1"), "{text}");
        let v = s.json();
        assert_eq!(v["iommu"]["enabled"], true);
        assert_eq!(v["iommu"]["groups"], 2);
        assert_eq!(v["drivers"]["vfio-pci"], true);
        assert_eq!(v["hugepages"][0]["size_kib"], 2048);
        assert_eq!(v["hugepages"][0]["reserved"], 128);
        assert_eq!(v["hugepages"][0]["free"], 126);
        let c = &v["controllers"][0];
        assert_eq!(c["address"], "0000:00:04.0");
        assert_eq!(c["driver"], "vfio-pci");
        assert_eq!(c["iommu_group"], 3);
        assert_eq!(c["group_viable"], true);
        assert_eq!(c["ready"], true);
        assert_eq!(c["advice"], Value::Null);
        let c = &v["controllers"][1];
        assert_eq!(c["group_viable"], false);
        assert_eq!(c["group_blockers"][0], "0000:00:05.1 (bound to xhci_hcd)");
        assert_eq!(c["block_devices"][0]["name"], "nvme0n1");
        assert_eq!(c["block_devices"][0]["swap"], true);
        assert_eq!(c["in_use"].as_array().unwrap().len(), 1);

        // IOMMU off.
        let t = Tree::new();
        t.write("proc/cmdline", "quiet\n");
        t.device("0000:00:09.0", "0x010802", None, None);
        let s = Status::read(&t.host()).unwrap();
        let text = s.text();
        assert!(text.contains("IOMMU: off"), "{text}");
        assert!(text.contains("intel_iommu=on iommu=pt"), "{text}");
        assert!(text.contains("0000:00:09.0: no IOMMU group"), "{text}");
        assert_eq!(s.json()["iommu"]["enabled"], false);
    }

    /// A bind that fails half way sets `driver_override` back: here the
    /// old driver's `unbind` cannot be written (a directory in the fake
    /// sysfs), and then the probe (likewise), so the controller stays on
    /// nvme and must not keep an override that would send it to vfio-pci
    /// at its next probe.
    #[test]
    fn a_failed_bind_sets_driver_override_back() {
        let t = Tree::new();
        t.device("0000:00:05.0", "0x010802", Some("nvme"), Some(4));
        fs::create_dir_all(t.root.join("sys/bus/pci/drivers/nvme/unbind")).unwrap();
        let host = t.host();
        let addr: upnvme::PciAddress = "0000:00:05.0".parse().unwrap();
        let c = host.controller(&addr).unwrap();
        let e = bind_one(&host, &c).unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.starts_with(
                "unbinding 0000:00:05.0 from nvme; nothing was changed (0000:00:05.0 is on nvme again): writing"
            ),
            "{text}"
        );
        let over = t
            .root
            .join("sys/bus/pci/devices/0000:00:05.0/driver_override");
        assert_eq!(fs::read_to_string(&over).unwrap(), "\n");

        // The old driver lets go, but the probe fails: set back again.
        fs::remove_dir(t.root.join("sys/bus/pci/drivers/nvme/unbind")).unwrap();
        fs::create_dir_all(t.root.join("sys/bus/pci/drivers_probe")).unwrap();
        let c = host.controller(&addr).unwrap();
        let e = bind_one(&host, &c).unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.starts_with("0000:00:05.0 did not bind to vfio-pci (writing")
                && text.ends_with("nothing was changed (0000:00:05.0 is on nvme again)"),
            "{text}"
        );
        assert_eq!(fs::read_to_string(&over).unwrap(), "\n");
        // An override the controller had before is put back as it was.
        fs::write(&over, "nvme\n").unwrap();
        let c = host.controller(&addr).unwrap();
        assert_eq!(c.driver_override.as_deref(), Some("nvme"));
        assert!(bind_one(&host, &c).is_err());
        assert_eq!(fs::read_to_string(&over).unwrap(), "nvme");
    }
}

#[cfg(test)]
mod bind_tests;
