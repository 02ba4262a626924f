//! `--html FILE`: a self-contained report page (no scripts, no external files, opens offline)
//! with the summary table and three charts drawn as inline SVG here: throughput over time,
//! latency percentiles over time, and the latency distribution (percentile spectrum).
//!
//! It renders from the JSON report alone, so any saved report can be drawn again; it escapes
//! every string it copies from the report.

use std::fmt::Write;

use serde_json::Value;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 300.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 45.0;

/// One line of a chart.
struct Line {
    name: String,
    color: &'static str,
    points: Vec<(f64, f64)>,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A readable number for an axis.
fn tick_label(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.1}M", value / 1e6)
    } else if value >= 1e4 {
        format!("{:.0}k", value / 1e3)
    } else if value >= 100.0 || value == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

/// An SVG line chart; `x_labels` maps an x value to its tick text.
fn chart(title: &str, y_label: &str, lines: &[Line], x_ticks: &[(f64, String)]) -> String {
    let all = lines.iter().flat_map(|l| l.points.iter());
    let (mut x_max, mut y_max) = (0.0f64, 0.0f64);
    let mut x_min = f64::MAX;
    for &(x, y) in all {
        x_min = x_min.min(x);
        x_max = x_max.max(x);
        y_max = y_max.max(y);
    }
    if x_min == f64::MAX {
        x_min = 0.0;
    }
    if x_max <= x_min {
        x_max = x_min + 1.0;
    }
    let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let sx = |x: f64| LEFT + (x - x_min) / (x_max - x_min) * plot_w;
    let sy = |y: f64| TOP + plot_h - y / y_max * plot_h;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        svg,
        r#"<text x="{LEFT}" y="18" font-size="13" font-weight="bold">{}</text>"#,
        escape(title)
    );
    let _ = write!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>"##
    );
    for i in 0..=4 {
        let y = y_max * f64::from(i) / 4.0;
        let py = sy(y);
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" x2="{}" y1="{py:.1}" y2="{py:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 5.0,
            py + 4.0,
            tick_label(y)
        );
    }
    for (x, label) in x_ticks {
        if *x < x_min || *x > x_max {
            continue;
        }
        let px = sx(*x);
        let _ = write!(
            svg,
            r##"<line x1="{px:.1}" x2="{px:.1}" y1="{TOP}" y2="{}" stroke="#eee"/><text x="{px:.1}" y="{}" text-anchor="middle">{}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 15.0,
            escape(label)
        );
    }
    let _ = write!(
        svg,
        r#"<text x="14" y="{}" transform="rotate(-90 14 {})" text-anchor="middle">{}</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0,
        escape(y_label)
    );
    for (index, line) in lines.iter().enumerate() {
        let points: Vec<String> =
            line.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y))).collect();
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.8" points="{}"/>"#,
            line.color,
            points.join(" ")
        );
        let lx = LEFT + 10.0 + 130.0 * index as f64;
        let ly = HEIGHT - 10.0;
        let _ = write!(
            svg,
            r#"<rect x="{lx}" y="{}" width="12" height="3" fill="{}"/><text x="{}" y="{ly}">{}</text>"#,
            ly - 4.0,
            line.color,
            lx + 16.0,
            escape(&line.name)
        );
    }
    svg.push_str("</svg>");
    svg
}

fn seconds_ticks(last: f64) -> Vec<(f64, String)> {
    let step = (last / 10.0).ceil().max(1.0);
    let mut ticks = Vec::new();
    let mut x = 0.0;
    while x <= last {
        ticks.push((x, format!("{x:.0} s")));
        x += step;
    }
    ticks
}

/// The percentile spectrum of a `[value, count]` distribution: x = −log10(1 − q), so 90%, 99%,
/// 99.9% … are evenly spaced.
fn spectrum(distribution: &[Value]) -> Vec<(f64, f64)> {
    let pairs: Vec<(f64, f64)> = distribution
        .iter()
        .filter_map(|pair| Some((pair.get(0)?.as_f64()?, pair.get(1)?.as_f64()?)))
        .collect();
    let total: f64 = pairs.iter().map(|p| p.1).sum();
    if total == 0.0 {
        return Vec::new();
    }
    let mut seen = 0.0;
    let mut points = vec![(0.0, pairs.first().map_or(0.0, |p| p.0))];
    for (value, count) in pairs {
        seen += count;
        let q = (seen / total).min(1.0 - 1e-7);
        points.push((-(1.0 - q).log10(), value));
    }
    points
}

/// The report page.
pub fn render(report: &Value) -> String {
    let series = report["time_series"].as_array().cloned().unwrap_or_default();
    let point = |key: &str| -> Vec<(f64, f64)> {
        series.iter().filter_map(|s| Some((s["second"].as_f64()?, s[key].as_f64()?))).collect()
    };
    let last = series.len().saturating_sub(1) as f64;
    let throughput = chart(
        "Throughput over time",
        "MB/s",
        &[Line { name: "MB/s".into(), color: "#1f77b4", points: point("throughput_mb_s") }],
        &seconds_ticks(last),
    );
    let percentiles = chart(
        "Latency percentiles over time",
        "µs",
        &[
            Line { name: "p50".into(), color: "#2ca02c", points: point("p50_us") },
            Line { name: "p99".into(), color: "#ff7f0e", points: point("p99_us") },
            Line { name: "max".into(), color: "#d62728", points: point("max_us") },
        ],
        &seconds_ticks(last),
    );
    let distribution = report["latency_distribution_us"].as_array().cloned().unwrap_or_default();
    let spectrum_ticks: Vec<(f64, String)> = ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"]
        .iter()
        .enumerate()
        .map(|(i, label)| (i as f64, (*label).to_string()))
        .collect();
    let latency_kind = report["latency_kind"].as_str().unwrap_or("latency");
    let spectrum_chart = chart(
        &format!("Latency distribution ({latency_kind})"),
        "µs",
        &[Line { name: "latency".into(), color: "#9467bd", points: spectrum(&distribution) }],
        &spectrum_ticks,
    );
    let mut rows = String::new();
    let mut row = |name: &str, value: &Value| {
        let text = match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let _ = write!(rows, "<tr><th>{}</th><td>{}</td></tr>", escape(name), escape(&text));
    };
    row("mode", &report["mode"]);
    row("throughput MB/s", &report["throughput_mb_s"]);
    row("throughput msg/s", &report["throughput_msg_s"]);
    for key in ["p50", "p90", "p95", "p99", "p999", "p9999", "max", "mean", "stdev", "count"] {
        row(&format!("latency {key} (µs)"), &report["latency_us"][key]);
    }
    if let Some(parameters) = report["parameters"].as_object() {
        for (key, value) in parameters {
            row(key, value);
        }
    }
    if let Some(environment) = report["environment"].as_object() {
        for (key, value) in environment {
            row(key, value);
        }
    }
    row("server shards", &report["server"]["shards"]);
    row("errors", &report["errors"]);
    format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>shoal-bench {mode}</title>\
         <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}\
         th,td{{text-align:left;padding:2px 12px;border-bottom:1px solid #eee}}</style></head>\
         <body><h1>shoal-bench: {mode}</h1>{throughput}<br>{percentiles}<br>{spectrum_chart}\
         <h2>Summary</h2><table>{rows}</table></body></html>\n",
        mode = escape(report["mode"].as_str().unwrap_or("?")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn html_is_self_contained_and_escapes_report_strings() {
        let report = json!({
            "mode": "produce",
            "throughput_mb_s": 12.5,
            "latency_kind": "produce_to_ack_per_batch",
            "latency_us": {"p50": 10, "p99": 50, "max": 90},
            "time_series": [
                {"second": 0, "throughput_mb_s": 10.0, "p50_us": 10, "p99_us": 40, "max_us": 80},
                {"second": 1, "throughput_mb_s": 15.0, "p50_us": 11, "p99_us": 50, "max_us": 90}
            ],
            "latency_distribution_us": [[10, 50], [50, 49], [90, 1]],
            "parameters": {"seeds": ["<script>"]},
        });
        let page = render(&report);
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert_eq!(page.matches("<svg").count(), 3);
        assert_eq!(page.matches("<polyline").count(), 5);
        assert!(!page.contains("<script"), "report strings are escaped");
        for external in ["src=", "href=", "<link", "@import"] {
            assert!(!page.contains(external), "no external resources: {external}");
        }
        // The spectrum ends at the largest value.
        let points = spectrum(report["latency_distribution_us"].as_array().unwrap());
        assert_eq!(points.last().map(|p| p.1), Some(90.0));
        assert!(points.windows(2).all(|w| w[0].0 <= w[1].0));
    }
}
