//! What the report says about the machine: CPU model, core count, kernel. Read from `/proc`;
//! missing files give "unknown", never an error.

use serde_json::{Value, json};

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split(':').nth(1))
                .map(|model| model.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|text| text.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The machine, and which CPUs the bench's actors were pinned to.
pub fn describe(bench_cpus: &[Option<usize>]) -> Value {
    json!({
        "cpu_model": cpu_model(),
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "kernel": kernel(),
        "bench_cpus": bench_cpus,
    })
}
