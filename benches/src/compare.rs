//! `shoal-bench compare A.json B.json`: two reports side by side, with B / A ratios, for the
//! figures that decide a comparison (throughput and the main latency's percentiles).
//!
//! It reads only the report files it is given; a key missing from one side prints as "-".

use serde_json::Value;

/// The figures compared, as (label, JSON pointer).
const FIGURES: [(&str, &str); 10] = [
    ("throughput MB/s", "/throughput_mb_s"),
    ("throughput msg/s", "/throughput_msg_s"),
    ("latency p50 µs", "/latency_us/p50"),
    ("latency p90 µs", "/latency_us/p90"),
    ("latency p99 µs", "/latency_us/p99"),
    ("latency p99.9 µs", "/latency_us/p999"),
    ("latency p99.99 µs", "/latency_us/p9999"),
    ("latency max µs", "/latency_us/max"),
    ("latency mean µs", "/latency_us/mean"),
    ("samples", "/latency_us/count"),
];

/// The comparison table of two reports.
pub fn compare(a: &Value, b: &Value) -> String {
    let mut text = String::new();
    let describe = |r: &Value| {
        format!(
            "{} {}, {} producers, {} consumers",
            r["mode"].as_str().unwrap_or("?"),
            r["parameters"]["durability"].as_str().unwrap_or("?"),
            r["parameters"]["producers"],
            r["parameters"]["consumers"]
        )
    };
    text.push_str(&format!("A: {}\nB: {}\n\n", describe(a), describe(b)));
    text.push_str(&format!("{:<20} {:>14} {:>14} {:>9}\n", "", "A", "B", "B / A"));
    for (label, pointer) in FIGURES {
        let (x, y) = (
            a.pointer(pointer).and_then(Value::as_f64),
            b.pointer(pointer).and_then(Value::as_f64),
        );
        let cell = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        let ratio = match (x, y) {
            (Some(x), Some(y)) if x != 0.0 => format!("{:.2}", y / x),
            _ => "-".to_string(),
        };
        text.push_str(&format!("{label:<20} {:>14} {:>14} {ratio:>9}\n", cell(x), cell(y)));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn compare_prints_ratios_and_tolerates_missing_keys() {
        let a = json!({"mode": "produce", "throughput_mb_s": 100.0, "latency_us": {"p99": 2000}});
        let b = json!({"mode": "produce", "throughput_mb_s": 150.0, "latency_us": {"p99": 1000}});
        let table = compare(&a, &b);
        assert!(table.contains("throughput MB/s"), "{table}");
        let line = |label: &str| table.lines().find(|l| l.starts_with(label)).unwrap().to_string();
        assert!(line("throughput MB/s").trim_end().ends_with("1.50"), "{table}");
        assert!(line("latency p99 µs").trim_end().ends_with("0.50"), "{table}");
        assert!(line("latency p50 µs").trim_end().ends_with('-'), "{table}");
    }
}
