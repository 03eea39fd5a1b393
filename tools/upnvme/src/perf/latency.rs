//! The latencies of a job's successful I/Os: a histogram with three
//! significant digits for the percentiles, and the exact sum, minimum and
//! maximum for the Average / min / max columns, as `spdk_nvme_perf` keeps
//! them (its columns are exact; a histogram's mean, min and max would be up
//! to 0.1% off).

use anyhow::{Context, Result};
use hdrhistogram::Histogram;

/// Latencies in nanoseconds.
#[derive(Clone, Debug)]
pub struct Latencies {
    /// For the percentiles and the histogram table.
    pub hist: Histogram<u64>,
    sum_ns: u128,
    min_ns: u64,
    max_ns: u64,
}

/// The largest latency the histogram tracks (60 s); a longer one counts at
/// it there, and exactly in the sum and the maximum.
const HIGHEST_NS: u64 = 60_000_000_000;

impl Latencies {
    /// None recorded yet.
    pub fn new() -> Result<Latencies> {
        Ok(Latencies {
            hist: Histogram::new_with_bounds(1, HIGHEST_NS, 3)?,
            sum_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
        })
    }

    /// Records one I/O's latency.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.hist.saturating_record(ns);
        self.sum_ns += u128::from(ns);
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Forgets every latency (the warm-up's).
    pub fn reset(&mut self) {
        self.hist.reset();
        self.sum_ns = 0;
        self.min_ns = u64::MAX;
        self.max_ns = 0;
    }

    /// Adds `other`'s latencies to these.
    pub fn add(&mut self, other: &Latencies) -> Result<()> {
        self.hist.add(&other.hist).context("merging histograms")?;
        self.sum_ns += other.sum_ns;
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
        Ok(())
    }

    /// Whether none was recorded.
    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// The latency at quantile `q` in nanoseconds (nearest rank): the upper
    /// edge of its histogram bucket, at most 1/1024 high, but never above
    /// the exact maximum (the top percentiles of a short run are often the
    /// maximum's bucket, whose edge lies above it). 0 when empty.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.is_empty() {
            0
        } else {
            self.hist.value_at_quantile(q).min(self.max_ns)
        }
    }

    /// The exact mean in microseconds (0 when empty).
    pub fn mean_us(&self) -> f64 {
        match self.hist.len() {
            0 => 0.0,
            n => self.sum_ns as f64 / n as f64 / 1000.0,
        }
    }

    /// The exact minimum in microseconds (0 when empty).
    pub fn min_us(&self) -> f64 {
        if self.is_empty() {
            0.0
        } else {
            self.min_ns as f64 / 1000.0
        }
    }

    /// The exact maximum in microseconds (0 when empty).
    pub fn max_us(&self) -> f64 {
        if self.is_empty() {
            0.0
        } else {
            self.max_ns as f64 / 1000.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Latencies;

    /// 10 001, 10 002 and 10 010 ns fall into 3-digit buckets 8 ns wide:
    /// the histogram's mean, min and max are off; these are exact, also
    /// after a merge, and a reset forgets them.
    #[test]
    fn mean_min_and_max_are_exact_where_the_histogram_rounds() {
        let mut a = Latencies::new().unwrap();
        a.record(10_001);
        a.record(10_002);
        let mut b = Latencies::new().unwrap();
        b.record(10_010);
        assert_ne!(a.hist.min(), 10_001, "the histogram rounds here");
        a.add(&b).unwrap();
        assert_eq!(a.min_us(), 10.001);
        assert_eq!(a.max_us(), 10.010);
        assert!((a.mean_us() - (10_001.0 + 10_002.0 + 10_010.0) / 3.0 / 1000.0).abs() < 1e-12);
        assert_eq!(a.hist.len(), 3);
        a.reset();
        assert!(a.is_empty());
        assert_eq!((a.mean_us(), a.min_us(), a.max_us()), (0.0, 0.0, 0.0));
        // An empty job merged in changes nothing.
        b.add(&Latencies::new().unwrap()).unwrap();
        assert_eq!((b.min_us(), b.max_us()), (10.010, 10.010));
    }
}
