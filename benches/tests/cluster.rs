//! `shoal-bench` against three real nodes: a producer whose partition's primary is killed
//! (`kill -9`) mid-run follows the new primary and is acknowledged again; the report counts
//! the redirects and the write stall, and no reply is paired with the wrong request.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use shoal_testkit::{ClusterPlan, ShoalCluster, metrics_page};

const DEADLINE: Duration = Duration::from_secs(120);

/// The run: a warm-up second, then `SECONDS` measured; the kill comes in the measured part,
/// leaving several heartbeat timeouts for the failover before sending ends.
const SECONDS: u64 = 10;

fn cluster(dir: &Path) -> ShoalCluster {
    let bench = Path::new(env!("CARGO_BIN_EXE_shoal-bench"));
    let binary = shoal_testkit::shoal_binary_beside(bench).unwrap_or_else(|e| panic!("{e}"));
    ShoalCluster::start(ClusterPlan::small(binary, dir, 3, DEADLINE))
        .unwrap_or_else(|error| panic!("{error}"))
}

/// The node whose metrics page says it leads topic-0/0 and has stored records of it, if any.
fn primary_with_records(cluster: &ShoalCluster) -> Option<usize> {
    (0..cluster.nodes.len()).find(|&node| {
        let Some(page) = cluster.nodes[node].metrics().and_then(metrics_page) else {
            return false;
        };
        let of_partition = |line: &&str| line.contains("topic=\"topic-0\",partition=\"0\"}");
        let value = |name: &str| {
            page.lines()
                .filter(of_partition)
                .find(|line| line.starts_with(name))
                .and_then(|line| line.rsplit_once(' ')?.1.parse::<u64>().ok())
        };
        value("shoal_partition_primary{") == Some(1)
            && value("shoal_partition_next_offset{").is_some_and(|offset| offset > 0)
    })
}

#[test]
fn a_producer_follows_a_killed_primary_and_is_acknowledged_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = cluster(dir.path());
    let json = dir.path().join("report.json");
    let bench = Command::new(env!("CARGO_BIN_EXE_shoal-bench"))
        .args(["produce", "--server", &cluster.servers(), "--producers", "1", "--partitions", "1"])
        .args(["--messages-per-batch", "10", "--message-size", "100", "--in-flight", "4"])
        .args(["--warmup", "1", "--duration", &SECONDS.to_string(), "--quiet"])
        .args(["--json", json.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("shoal-bench runs");
    let started = Instant::now();
    let killed = loop {
        if let Some(node) = primary_with_records(&cluster) {
            cluster.nodes[node].kill_9();
            break node;
        }
        assert!(started.elapsed() < DEADLINE, "the producer never wrote to topic-0/0");
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = shoal_testkit::output_within(bench, DEADLINE, "shoal-bench");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).expect("JSON");
    let errors = &report["errors"];
    assert!(errors.get("Protocol").is_none(), "replies paired with the wrong request: {errors}");
    // The stall ended with an acknowledgement from the new primary, not with the run.
    let producer = &report["actors"][0];
    let stall_end_s = producer["write_stall_end_s"].as_f64().expect("a stall end");
    let last_second = report["time_series"].as_array().and_then(|s| s.last()).cloned();
    let acknowledged_at_the_end =
        last_second.as_ref().and_then(|s| s["throughput_msg_s"].as_f64()).is_some_and(|m| m > 0.0);
    assert!(
        acknowledged_at_the_end,
        "nothing acknowledged after the failover (stall ended at {stall_end_s} s): {report}"
    );
    eprintln!("write stall after killing node {killed}: {} ms", producer["write_stall_ms"]);
}
