//! The queue pairs' clock for command timeouts: the CPU time-stamp counter,
//! calibrated once per process, because in the emulated guest a
//! clock_gettime costs about 1 us. Falls back to `Instant` (nanoseconds) where
//! the TSC is unusable.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use upnvme_dma::tsc;

enum Source {
    /// RDTSC at this many ticks per second.
    Tsc(f64),
    /// Nanoseconds since this instant.
    Instant(Instant),
}

fn source() -> &'static Source {
    static SOURCE: OnceLock<Source> = OnceLock::new();
    SOURCE.get_or_init(|| match tsc::calibrate(Duration::from_millis(20)) {
        Some(hz) => Source::Tsc(hz),
        None => Source::Instant(Instant::now()),
    })
}

/// Now, in ticks.
#[inline]
pub(crate) fn now() -> u64 {
    match source() {
        Source::Tsc(_) => tsc::rdtsc(),
        Source::Instant(t0) => t0.elapsed().as_nanos() as u64,
    }
}

/// `d` in ticks.
pub(crate) fn ticks(d: Duration) -> u64 {
    match source() {
        Source::Tsc(hz) => (d.as_secs_f64() * hz) as u64,
        Source::Instant(_) => d.as_nanos().min(u64::MAX as u128) as u64,
    }
}

/// `t` ticks as a duration (the inverse of [`ticks`]).
pub(crate) fn ticks_to_duration(t: u64) -> Duration {
    match source() {
        Source::Tsc(hz) => Duration::from_secs_f64(t as f64 / hz),
        Source::Instant(_) => Duration::from_nanos(t),
    }
}
