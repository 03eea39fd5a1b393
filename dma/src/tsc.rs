//! The CPU's time-stamp counter: the cheap clock for per-I/O latency.
//!
//! In the 2-vCPU QEMU guest the kernel marks the TSC unstable and
//! clock_gettime falls back to the emulated HPET (about 1 us per call, more
//! than the I/O path itself), so latency is measured with RDTSC and converted
//! with a frequency calibrated once against the monotonic clock.

use std::time::{Duration, Instant};

/// Reads the time-stamp counter (RDTSC). Returns 0 on non-x86-64 targets.
#[inline(always)]
pub fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC has no memory effects and no preconditions; it exists
        // on every x86-64 CPU.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// Ticks per second of [`rdtsc`], measured over `over` against `Instant`.
/// Returns `None` when the counter does not advance (or is unavailable).
pub fn calibrate(over: Duration) -> Option<f64> {
    let t0 = Instant::now();
    let c0 = rdtsc();
    std::thread::sleep(over);
    let c1 = rdtsc();
    let dt = t0.elapsed().as_secs_f64();
    let ticks = c1.checked_sub(c0)?;
    (ticks > 0 && dt > 0.0).then(|| ticks as f64 / dt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsc_advances_and_calibrates() {
        let a = rdtsc();
        let b = rdtsc();
        assert!(b >= a);
        let hz = calibrate(Duration::from_millis(20)).unwrap();
        // Any plausible clock: 10 MHz .. 100 GHz.
        assert!((1e7..1e11).contains(&hz), "{hz}");
    }
}
