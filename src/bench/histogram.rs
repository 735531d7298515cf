//! Latency histograms, shared by the tasks that record into them.

use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;

/// The longest latency told apart: longer ones count as this (1 hour, in µs).
const HIGHEST_US: u64 = 3_600_000_000;

/// Latencies in microseconds, kept in an HdrHistogram (the `hdrhistogram`
/// crate, a port of Gil Tene's HdrHistogram): 3 significant digits (0.1 %)
/// from 1 µs to 1 hour, in a fixed amount of memory (a few hundred KB)
/// whatever the count, so a 10-minute soak recording tens of millions of
/// samples stays flat. Longer values count as an hour. The maximum is exact.
pub struct Hist(Mutex<Inner>);

struct Inner {
    h: Histogram<u64>,
    max_us: u64,
}

/// Percentiles in milliseconds; `None` when nothing was recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Percentiles {
    pub count: u64,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
    pub max: Option<f64>,
}

impl Default for Hist {
    fn default() -> Self {
        let h = Histogram::new_with_bounds(1, HIGHEST_US, 3).expect("valid histogram bounds");
        Hist(Mutex::new(Inner { h, max_us: 0 }))
    }
}

impl Hist {
    pub fn record_us(&self, us: u64) {
        let mut g = self.0.lock().expect("poisoned");
        g.h.saturating_record(us);
        g.max_us = g.max_us.max(us);
    }

    pub fn record(&self, d: Duration) {
        self.record_us(d.as_micros().min(u128::from(u64::MAX)) as u64);
    }

    /// p50, p90, p99, p99.9 and the maximum, in ms. A percentile is the
    /// highest value of its bucket, so within 0.1 % above the true value
    /// (and never above the maximum).
    pub fn percentiles(&self) -> Percentiles {
        let g = self.0.lock().expect("poisoned");
        let count = g.h.len();
        if count == 0 {
            return Percentiles::default();
        }
        let ms = |us: u64| Some(us as f64 / 1000.0);
        let at = |q: f64| ms(g.h.value_at_quantile(q).min(g.max_us));
        Percentiles {
            count,
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            p999: at(0.999),
            max: ms(g.max_us),
        }
    }

    /// A copy of what was recorded so far, for [`Hist::p50_since`].
    pub fn snapshot(&self) -> Histogram<u64> {
        self.0.lock().expect("poisoned").h.clone()
    }

    /// The p50, in ms, of what was recorded since `before` (a snapshot of
    /// this histogram); `None` when nothing was.
    pub fn p50_since(&self, before: &Histogram<u64>) -> Option<f64> {
        let mut since = self.snapshot();
        since.subtract(before).ok()?;
        (!since.is_empty()).then(|| since.value_at_quantile(0.5) as f64 / 1000.0)
    }

    #[cfg(test)]
    fn buckets(&self) -> usize {
        self.0.lock().expect("poisoned").h.distinct_values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: Option<f64>, want: f64) -> bool {
        got.is_some_and(|g| (g - want).abs() <= want * 0.002 + 0.001)
    }

    #[test]
    fn percentiles_and_fixed_memory() {
        let s = Hist::default();
        assert_eq!(s.percentiles(), Percentiles::default());
        let buckets = s.buckets();
        // 1 µs .. 200 ms in steps of 20 µs.
        for us in (1..=200_000).step_by(20) {
            s.record_us(us);
        }
        s.record_us(90_000_000);
        s.record_us(u64::MAX); // beyond the range: counted as an hour
        let p = s.percentiles();
        assert_eq!(p.count, 10_002);
        assert!(close(p.p50, 100.0), "{p:?}");
        assert!(close(p.p90, 180.0), "{p:?}");
        assert!(close(p.p99, 198.0), "{p:?}");
        assert!(close(p.p999, 199.8), "{p:?}");
        assert_eq!(p.max, Some(u64::MAX as f64 / 1000.0));
        // The memory does not grow with the count or the range of values.
        assert_eq!(s.buckets(), buckets);

        let small = Hist::default();
        small.record(Duration::from_micros(1234));
        let p = small.percentiles();
        assert_eq!(
            (p.p50, p.p99, p.max),
            (Some(1.234), Some(1.234), Some(1.234))
        );
    }

    #[test]
    fn p50_since_a_snapshot_counts_only_what_came_after() {
        let s = Hist::default();
        for _ in 0..1000 {
            s.record_us(1_000);
        }
        let before = s.snapshot();
        assert_eq!(s.p50_since(&before), None);
        for _ in 0..10 {
            s.record_us(50_000);
        }
        // The whole run's p50 is still 1 ms; the interval's is 50 ms.
        assert!(close(s.percentiles().p50, 1.0));
        assert!(
            close(s.p50_since(&before), 50.0),
            "{:?}",
            s.p50_since(&before)
        );
    }
}
