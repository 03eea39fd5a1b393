//! Hot-plugging controllers while COMMAND runs (`--unplug CTRL@SECONDS`,
//! `--replug CTRL@SECONDS`): QEMU's QMP socket, driven from a host thread.
//!
//! Hot-pluggable controllers sit behind `pcie-root-port`s (q35's root bus
//! has no hotplug), their namespaces' images are `-blockdev` nodes (which,
//! unlike `-drive`, outlive an unplugged device, so a replug can attach them
//! again). `device_del` makes QEMU press the slot's attention button: the
//! guest's pciehp waits its 5 s before powering the slot off, then removes
//! the device — which asks vfio-pci's user for it back. `device_add` puts
//! the controller and its namespaces back; the guest's pciehp enumerates it.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// What to do to a controller, and when (seconds after COMMAND started).
#[derive(Debug, Clone, PartialEq)]
pub struct Action {
    /// Seconds after COMMAND started.
    pub at: Duration,
    /// Controller index (0 = the first vfio-bound one).
    pub ctrl: u32,
    /// Unplug (`device_del`) or replug (`device_add`).
    pub replug: bool,
}

/// Parses `CTRL@SECONDS` (e.g. `0@5`, `1@2.5`).
pub fn parse(spec: &str, replug: bool) -> Result<Action> {
    let Some((c, t)) = spec.split_once('@') else {
        bail!("`{spec}`: expected CTRL@SECONDS, e.g. 0@5");
    };
    let ctrl: u32 = c
        .parse()
        .with_context(|| format!("`{spec}`: the controller index `{c}` is not a number"))?;
    let secs: f64 = t
        .parse()
        .with_context(|| format!("`{spec}`: `{t}` is not a number of seconds"))?;
    if !secs.is_finite() || secs < 0.0 {
        bail!("`{spec}`: the time must be a non-negative number of seconds");
    }
    Ok(Action {
        at: Duration::from_secs_f64(secs),
        ctrl,
        replug,
    })
}

/// The QMP commands of one action: arguments of `device_del`, or the
/// `device_add`s of a controller and its namespaces.
#[derive(Debug, Clone)]
pub struct Step {
    /// When (after COMMAND started).
    pub at: Duration,
    /// What it does, for the log.
    pub what: String,
    /// `{"execute": ...}` documents, sent in order.
    pub commands: Vec<String>,
    /// A device ID that must be gone before the commands are sent: a
    /// replug waits (up to [`GONE_WAIT`]) until the guest finished the
    /// unplug. `device_del` only starts it (the guest's pciehp waits 5 s,
    /// then the driver must let go); a `device_add` before it is done fails
    /// ("permission conflict" on the image, which the old device still
    /// holds), and one racing the teardown has crashed QEMU's TCG
    /// (`iotlb_to_section` assertion).
    pub wait_gone: Option<String>,
}

/// How long a replug waits for the unplugged device to be gone.
const GONE_WAIT: Duration = Duration::from_secs(60);

/// Runs `steps` (sorted by time) against the QMP socket at `sock` from a
/// thread: each once `booted` is set and its time has come. Failures are
/// printed (the guest command then sees no hotplug and says so).
pub fn spawn(sock: PathBuf, booted: Arc<AtomicBool>, steps: Vec<Step>) {
    if steps.is_empty() {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("xtask-qmp".into())
        .spawn(move || {
            while !booted.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let start = Instant::now();
            for s in steps {
                if let Some(wait) = s.at.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
                if let Some(id) = &s.wait_gone {
                    let since = Instant::now();
                    loop {
                        match present(&sock, id) {
                            Ok(false) => break,
                            Ok(true) if since.elapsed() < GONE_WAIT => {
                                std::thread::sleep(Duration::from_millis(200));
                            }
                            Ok(true) => {
                                eprintln!(
                                    "xtask: {id} still present {GONE_WAIT:?} after its unplug; {} anyway",
                                    s.what
                                );
                                break;
                            }
                            Err(e) => {
                                eprintln!("xtask: QMP qom-list failed: {e:#}");
                                break;
                            }
                        }
                    }
                    if since.elapsed() > Duration::from_millis(250) {
                        eprintln!(
                            "xtask: +{:.1} s: waited {:.1} s for {id}'s unplug to finish",
                            start.elapsed().as_secs_f64(),
                            since.elapsed().as_secs_f64()
                        );
                    }
                }
                match run(&sock, &s.commands) {
                    Ok(()) => eprintln!(
                        "xtask: +{:.1} s: {} (QMP)",
                        start.elapsed().as_secs_f64(),
                        s.what
                    ),
                    Err(e) => eprintln!("xtask: QMP {} failed: {e:#}", s.what),
                }
            }
        });
}

/// One QMP connection, capabilities negotiated.
struct Session {
    w: UnixStream,
    r: BufReader<UnixStream>,
}

impl Session {
    /// Connects to `sock`, reads the greeting and negotiates capabilities.
    fn open(sock: &Path) -> Result<Session> {
        let stream = UnixStream::connect(sock)
            .with_context(|| format!("connecting to QMP at {}", sock.display()))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut s = Session {
            w: stream.try_clone()?,
            r: BufReader::new(stream),
        };
        let mut greeting = String::new();
        s.r.read_line(&mut greeting)
            .context("reading the QMP greeting")?;
        s.ask(r#"{"execute":"qmp_capabilities"}"#)?;
        Ok(s)
    }

    /// Sends `cmd` and returns its `return` value (events in between are
    /// skipped; an `error` fails).
    fn ask(&mut self, cmd: &str) -> Result<serde_json::Value> {
        self.w.write_all(cmd.as_bytes())?;
        self.w.write_all(b"\n")?;
        let mut line = String::new();
        loop {
            line.clear();
            if self.r.read_line(&mut line)? == 0 {
                bail!("QMP closed the connection after {cmd}");
            }
            let v: serde_json::Value = serde_json::from_str(line.trim())
                .with_context(|| format!("QMP answered {}", line.trim()))?;
            if let Some(ret) = v.get("return") {
                return Ok(ret.clone());
            }
            if v.get("error").is_some() {
                bail!("{cmd}: {}", line.trim());
            }
        }
    }
}

/// Sends each command in turn, each waiting for its `return`.
fn run(sock: &Path, commands: &[String]) -> Result<()> {
    let mut s = Session::open(sock)?;
    for c in commands {
        s.ask(c)?;
    }
    Ok(())
}

/// Whether a device with ID `id` is still attached (listed under
/// `/machine/peripheral`, QOM's home of devices created with an ID).
fn present(sock: &Path, id: &str) -> Result<bool> {
    let list = Session::open(sock)?
        .ask(r#"{"execute":"qom-list","arguments":{"path":"/machine/peripheral"}}"#)?;
    Ok(listed(&list, id))
}

/// Whether a `qom-list` answer names `id`.
fn listed(list: &serde_json::Value, id: &str) -> bool {
    list.as_array().is_some_and(|a| {
        a.iter()
            .any(|p| p.get("name").and_then(|n| n.as_str()) == Some(id))
    })
}

/// A JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// `{"execute":"device_del","arguments":{"id":ID}}`.
pub fn device_del(id: &str) -> String {
    format!(
        r#"{{"execute":"device_del","arguments":{{"id":{}}}}}"#,
        json_str(id)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_present_while_qom_lists_it() {
        let list: serde_json::Value = serde_json::from_str(
            r#"[{"name":"type","type":"string"},{"name":"c0","type":"child<nvme>"},{"name":"rp0","type":"child<pcie-root-port>"}]"#,
        )
        .unwrap();
        assert!(listed(&list, "c0"));
        assert!(!listed(&list, "c1"));
        assert!(!listed(&serde_json::Value::Null, "c0"));
    }

    #[test]
    fn specs_and_commands() {
        assert_eq!(
            parse("1@2.5", false).unwrap(),
            Action {
                at: Duration::from_millis(2500),
                ctrl: 1,
                replug: false
            }
        );
        assert!(parse("1", true).is_err());
        assert!(parse("x@1", true).is_err());
        assert!(parse("0@-1", true).is_err());
        assert_eq!(
            device_del("c0"),
            r#"{"execute":"device_del","arguments":{"id":"c0"}}"#
        );
        assert_eq!(
            device_del("c\"0"),
            r#"{"execute":"device_del","arguments":{"id":"c\"0"}}"#
        );
    }
}
