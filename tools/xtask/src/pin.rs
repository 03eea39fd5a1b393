//! `--pin-vcpu0`: keep the guest's vCPU 0 and the emulated device off each other's host core.
//!
//! Under TCG the guest's polling vCPU is a host thread that never sleeps, and QEMU's main
//! loop (which runs the NVMe controller model) and its io_uring workers are more host
//! threads. On a 2-core host at large transfers they are three busy threads on two cores,
//! and the scheduler's split between them moves every throughput figure (measured in
//! docs/benchmarks.md, "Twenty-seventh session"). Pinning vCPU 0 to host CPU 0 and every
//! other QEMU thread to the remaining CPUs gives the driver under test one core and the
//! device the rest, whatever the driver does.
//!
//! QEMU names its vCPU threads `CPU <n>/TCG` (or `/KVM`) when started with
//! `-name debug-threads=on`, which the caller adds. The pinner looks at the process's
//! threads every [`PERIOD`] (workers come and go) and pins each new one with `taskset`,
//! again if its name changed since (a thread seen before QEMU named it).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Result, bail};

/// How often the thread list is read again.
const PERIOD: Duration = Duration::from_millis(100);

/// The QEMU argument that names the vCPU threads.
pub const QEMU_ARGS: [&str; 2] = ["-name", "debug-threads=on"];

/// Checks that the host has a CPU for vCPU 0 and at least one for the rest.
pub fn check_host(host_cpus: usize) -> Result<()> {
    if host_cpus < 2 {
        bail!(
            "--pin-vcpu0 needs at least 2 host CPUs (this host has {host_cpus}): vCPU 0 gets CPU 0 and QEMU's other threads the rest; drop --pin-vcpu0"
        );
    }
    Ok(())
}

/// The host CPU list (taskset -c syntax) for the QEMU thread named `comm`.
pub fn cpu_list(comm: &str, host_cpus: usize) -> String {
    if is_vcpu0(comm) {
        "0".to_string()
    } else if host_cpus <= 2 {
        "1".to_string()
    } else {
        format!("1-{}", host_cpus - 1)
    }
}

/// True for the thread of guest vCPU 0 (`CPU 0/TCG`, `CPU 0/KVM`).
fn is_vcpu0(comm: &str) -> bool {
    comm.trim_end()
        .strip_prefix("CPU 0/")
        .is_some_and(|accel| !accel.is_empty())
}

/// Pins the threads of a process until dropped (or until the process is gone).
pub struct Pinner {
    stop: Arc<AtomicBool>,
}

impl Pinner {
    /// Starts pinning the threads of process `pid`.
    pub fn start(pid: u32, host_cpus: usize) -> Pinner {
        let stop = Arc::new(AtomicBool::new(false));
        spawn(pid, host_cpus, Arc::clone(&stop));
        Pinner { stop }
    }
}

impl Drop for Pinner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Pins the threads of process `pid` until `stop` is set or the process is gone.
fn spawn(pid: u32, host_cpus: usize, stop: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        // Thread → the name it was pinned under: a thread seen before QEMU
        // named it (`CPU 0/TCG`) is pinned again once the name changes.
        let mut pinned: HashMap<u32, String> = HashMap::new();
        let mut warned = false;
        let tasks = format!("/proc/{pid}/task");
        while !stop.load(Ordering::Relaxed) {
            let Ok(dir) = std::fs::read_dir(&tasks) else {
                return;
            };
            for entry in dir.flatten() {
                let Some(tid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|s| s.parse::<u32>().ok())
                else {
                    continue;
                };
                let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else {
                    continue;
                };
                if pinned.get(&tid) == Some(&comm) {
                    continue;
                }
                let cpus = cpu_list(&comm, host_cpus);
                match set_affinity(tid, &cpus) {
                    Ok(()) => {
                        pinned.insert(tid, comm);
                    }
                    Err(e) if !warned && Path::new(&tasks).join(tid.to_string()).exists() => {
                        eprintln!(
                            "xtask: warning: --pin-vcpu0 could not pin QEMU thread {tid} ({}): {e}",
                            comm.trim_end()
                        );
                        warned = true;
                    }
                    Err(_) => {}
                }
            }
            std::thread::sleep(PERIOD);
        }
    });
}

/// `taskset -p -c CPUS TID`.
fn set_affinity(tid: u32, cpus: &str) -> Result<()> {
    let out = Command::new("taskset")
        .args(["-p", "-c", cpus, &tid.to_string()])
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        bail!(
            "taskset -p -c {cpus} {tid}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vcpu0_gets_cpu0_and_everything_else_the_rest() {
        assert_eq!(cpu_list("CPU 0/TCG\n", 2), "0");
        assert_eq!(cpu_list("CPU 0/KVM", 8), "0");
        assert_eq!(cpu_list("CPU 1/TCG\n", 2), "1");
        assert_eq!(cpu_list("CPU 10/TCG", 16), "1-15");
        assert_eq!(cpu_list("qemu-system-x86\n", 2), "1");
        assert_eq!(cpu_list("iou-wrk-1234", 4), "1-3");
        assert_eq!(cpu_list("CPU 0/", 4), "1-3");
    }

    #[test]
    fn one_host_cpu_is_refused() {
        let e = check_host(1).unwrap_err().to_string();
        assert!(e.contains("at least 2 host CPUs"), "{e}");
        check_host(2).unwrap();
    }

    #[test]
    fn pins_the_threads_of_a_live_process() {
        // Needs a second CPU and taskset; skip quietly where the host has neither.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cpus < 2 || Command::new("taskset").arg("-V").output().is_err() {
            return;
        }
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let pinner = Pinner::start(child.id(), cpus);
        let want = cpu_list("sleep", cpus);
        let mut got = String::new();
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(20));
            let out = Command::new("taskset")
                .args(["-p", "-c", &child.id().to_string()])
                .output()
                .unwrap();
            got = String::from_utf8_lossy(&out.stdout).to_string();
            if got.trim_end().ends_with(&format!(": {want}")) {
                break;
            }
        }
        drop(pinner);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            got.trim_end().ends_with(&format!(": {want}")),
            "sleep's affinity after pinning: {got:?}, want {want}"
        );
    }
}
