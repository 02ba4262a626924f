//! Latency histograms and throughput series: HDR histograms in microseconds (3 significant
//! digits, 1 µs to 1 hour), merged across actors before any percentile is taken — percentiles
//! are computed over the pooled samples, never averaged across actors.
//!
//! It owns recording, merging and summarising; it never reads a clock (times are passed in).

use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// Largest latency recorded, in microseconds (larger values are clamped to it).
const LATENCY_US_MAX: u64 = 3_600_000_000;

/// A latency histogram in microseconds.
#[derive(Clone, Debug)]
pub struct Latency {
    histogram: Histogram<u64>,
}

impl Default for Latency {
    fn default() -> Self {
        Latency::new()
    }
}

impl Latency {
    /// An empty histogram.
    pub fn new() -> Latency {
        let histogram = Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid bounds");
        Latency { histogram }
    }

    /// Records one latency.
    pub fn record_us(&mut self, us: u64) {
        self.histogram.saturating_record(us.clamp(1, LATENCY_US_MAX));
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &Latency) {
        self.histogram.add(&other.histogram).expect("same bounds");
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// The summary figures.
    pub fn summary(&self) -> Summary {
        let h = &self.histogram;
        let at = |q: f64| if h.is_empty() { 0 } else { h.value_at_quantile(q) };
        Summary {
            count: h.len(),
            p50: at(0.50),
            p90: at(0.90),
            p95: at(0.95),
            p99: at(0.99),
            p999: at(0.999),
            p9999: at(0.9999),
            max: if h.is_empty() { 0 } else { h.max() },
            mean: if h.is_empty() { 0.0 } else { h.mean() },
            stdev: if h.is_empty() { 0.0 } else { h.stdev() },
        }
    }

    /// The distribution as `[value_us, count]` pairs, one per recorded bucket (for reports).
    pub fn distribution(&self) -> Vec<(u64, u64)> {
        self.histogram
            .iter_recorded()
            .map(|v| (v.value_iterated_to(), v.count_since_last_iteration()))
            .collect()
    }
}

/// Percentiles and moments of a latency histogram, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 95th percentile.
    pub p95: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// 99.99th percentile (quote it only with at least 10⁵ samples).
    pub p9999: u64,
    /// Largest.
    pub max: u64,
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub stdev: f64,
}

impl Summary {
    /// The report's `latency_us` object.
    pub fn to_json(&self) -> Value {
        json!({
            "count": self.count,
            "p50": self.p50,
            "p90": self.p90,
            "p95": self.p95,
            "p99": self.p99,
            "p999": self.p999,
            "p9999": self.p9999,
            "max": self.max,
            "mean": (self.mean * 10.0).round() / 10.0,
            "stdev": (self.stdev * 10.0).round() / 10.0,
        })
    }
}

/// One second of an actor's run (or of the whole run, once merged).
#[derive(Clone, Debug, Default)]
pub struct Second {
    /// Messages acknowledged in this second.
    pub messages: u64,
    /// Payload bytes acknowledged in this second.
    pub bytes: u64,
    /// Latencies of the sends acknowledged in this second.
    pub latency: Latency,
}

/// Per-second figures, indexed by whole seconds since the run's start.
#[derive(Clone, Debug, Default)]
pub struct Series {
    /// Second `i` of the run.
    pub seconds: Vec<Second>,
}

impl Series {
    /// Records an acknowledgement at `at_ns` since the start.
    pub fn record(&mut self, at_ns: u64, messages: u64, bytes: u64, latency_us: u64) {
        let index = (at_ns / 1_000_000_000) as usize;
        if self.seconds.len() <= index {
            self.seconds.resize_with(index + 1, Second::default);
        }
        let second = &mut self.seconds[index];
        second.messages += messages;
        second.bytes += bytes;
        second.latency.record_us(latency_us);
    }

    /// Adds another actor's series.
    pub fn merge(&mut self, other: &Series) {
        if self.seconds.len() < other.seconds.len() {
            self.seconds.resize_with(other.seconds.len(), Second::default);
        }
        for (mine, theirs) in self.seconds.iter_mut().zip(&other.seconds) {
            mine.messages += theirs.messages;
            mine.bytes += theirs.bytes;
            mine.latency.merge(&theirs.latency);
        }
    }

    /// The report's `time_series`.
    pub fn to_json(&self) -> Value {
        let seconds: Vec<Value> = self
            .seconds
            .iter()
            .enumerate()
            .map(|(index, second)| {
                let summary = second.latency.summary();
                json!({
                    "second": index,
                    "throughput_msg_s": second.messages,
                    "throughput_mb_s": second.bytes as f64 / 1e6,
                    "p50_us": summary.p50,
                    "p99_us": summary.p99,
                    "max_us": summary.max,
                })
            })
            .collect();
        Value::Array(seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_percentiles_come_from_pooled_samples_not_averages() {
        // Actor a: 99 fast sends; actor b: 1 slow one. Averaging each actor's p99 would say
        // (1 + 1000) / 2; the pooled p99 is 1, and the pooled max 1000.
        let mut a = Latency::new();
        for _ in 0..99 {
            a.record_us(1);
        }
        let mut b = Latency::new();
        b.record_us(1000);
        let mut pooled = Latency::new();
        pooled.merge(&a);
        pooled.merge(&b);
        let summary = pooled.summary();
        assert_eq!(summary.count, 100);
        assert_eq!(summary.p99, 1);
        assert_eq!(summary.max, 1000);
        assert!(summary.p999 >= 999, "{summary:?}");
    }

    #[test]
    fn stats_merge_is_exact_and_keeps_precision() {
        let mut merged = Latency::new();
        let mut parts = Vec::new();
        for actor in 0..4u64 {
            let mut latency = Latency::new();
            for i in 0..1000u64 {
                latency.record_us(1 + actor * 1000 + i);
            }
            merged.merge(&latency);
            parts.push(latency);
        }
        let mut all = Latency::new();
        for value in 1..=4000u64 {
            all.record_us(value);
        }
        assert_eq!(merged.summary(), all.summary());
        // Three significant digits: within 0.1%.
        let p50 = merged.summary().p50 as f64;
        assert!((p50 - 2000.0).abs() / 2000.0 < 0.002, "{p50}");
        assert_eq!(Latency::new().summary(), Summary::default());
        // Out-of-range values are clamped, not lost.
        let mut clamped = Latency::new();
        clamped.record_us(0);
        clamped.record_us(u64::MAX);
        assert_eq!(clamped.count(), 2);
    }

    #[test]
    fn stats_series_merge_by_second() {
        let mut a = Series::default();
        a.record(100, 10, 1000, 5);
        a.record(1_500_000_000, 10, 1000, 7);
        let mut b = Series::default();
        b.record(2_000_000_000, 1, 1, 9);
        a.merge(&b);
        assert_eq!(a.seconds.len(), 3);
        assert_eq!(a.seconds[1].messages, 10);
        assert_eq!(a.seconds[2].latency.summary().max, 9);
        assert_eq!(a.to_json().as_array().unwrap().len(), 3);
    }
}
