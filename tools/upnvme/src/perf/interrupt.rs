//! SIGINT and SIGTERM during `upnvme perf`, as spdk_nvme_perf handles Ctrl-C:
//! the first signal ends the run early — workers stop submitting, reap what is
//! in flight, the results measured so far are reported (and `--verify` reads
//! back what was written), the controller is shut down cleanly — and the
//! process then exits with 128 + the signal number. A second signal ends the
//! process at once with the signal's default action.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use anyhow::{Context, Result};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::flag;

/// Which signal, if any, asked the run to end.
pub struct Interrupt {
    signal: Arc<AtomicUsize>,
}

impl Interrupt {
    /// Installs the handlers: SIGINT or SIGTERM sets `stop` (the workers'
    /// shared flag) and records the signal; the next one takes the default
    /// action.
    pub fn watch(stop: &Arc<AtomicBool>) -> Result<Self> {
        let signal = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(AtomicBool::new(false));
        for sig in [SIGINT, SIGTERM] {
            // Registered first, so it sees `seen` as the previous signal left it.
            flag::register_conditional_default(sig, seen.clone())
                .and_then(|_| flag::register(sig, seen.clone()))
                .and_then(|_| flag::register(sig, stop.clone()))
                .and_then(|_| flag::register_usize(sig, signal.clone(), sig as usize))
                .with_context(|| format!("installing a handler for signal {sig}"))?;
        }
        Ok(Self { signal })
    }

    /// The signal that ended the run early, if one did.
    pub fn signal(&self) -> Option<i32> {
        match self.signal.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as i32),
        }
    }
}

/// The signal's name for messages ("SIGINT", "SIGTERM", or its number).
pub fn name(signal: i32) -> String {
    match signal {
        SIGINT => "SIGINT".into(),
        SIGTERM => "SIGTERM".into(),
        s => format!("signal {s}"),
    }
}

/// `upnvme perf` ended early by a signal (the signal number, and whether a
/// report was printed): exit status 128 + the signal number, as a shell
/// reports a program the signal killed.
#[derive(Debug)]
pub struct Interrupted(pub i32, pub Reported);

/// Whether an interrupted run printed its report first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    /// The signal came during bring-up: no I/O was issued, nothing printed.
    Nothing,
    /// The report of the time the run ran is above.
    Results,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.1 {
            Reported::Nothing => write!(
                f,
                "interrupted by {} during bring-up: no I/O was issued",
                name(self.0)
            ),
            Reported::Results => write!(
                f,
                "interrupted by {}: the run was cut short; the results above cover the time it ran",
                name(self.0)
            ),
        }
    }
}

impl std::error::Error for Interrupted {}
