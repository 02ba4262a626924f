//! `shoal-bench` end to end: a 2-second run against a real server, whose JSON report must be
//! well formed and whose acknowledged message count must equal what the server stored; and a
//! short run with `--spawn-server`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use shoal_testkit::ShoalProcess;

const DEADLINE: Duration = Duration::from_secs(120);

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shoal-bench"))
}

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// `Command::output` bounded by [`DEADLINE`].
fn output_within(command: &mut Command) -> Output {
    let child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("runs");
    shoal_testkit::output_within(child, DEADLINE, "shoal-bench")
}

/// `shoal --config configs/test.toml --data-dir DIR`, killed when dropped.
fn start_server(dir: &Path) -> ShoalProcess {
    let bench = Path::new(env!("CARGO_BIN_EXE_shoal-bench"));
    let binary = shoal_testkit::shoal_binary_beside(bench).unwrap_or_else(|e| panic!("{e}"));
    let mut command = Command::new(binary);
    command.arg("--config").arg(repo_file("configs/test.toml")).arg("--data-dir").arg(dir);
    command.stderr(Stdio::null());
    ShoalProcess::start(command, DEADLINE).unwrap_or_else(|error| panic!("{error}"))
}

fn status(address: &str) -> serde_json::Value {
    let mut runtime = shoal_client::runtime().expect("runtime");
    runtime.block_on(async {
        let config = shoal_client::ClientConfig::with_seeds([address]);
        let mut client = shoal_client::Client::connect(config).await.expect("connects");
        serde_json::from_str(&client.status().await.expect("status")).expect("JSON")
    })
}

/// Runs `shoal-bench ARGS --quiet --json DIR/NAME.json`, which must succeed; the report and
/// what it printed.
fn run_json(dir: &Path, name: &str, args: &[&str]) -> (serde_json::Value, String) {
    let json = dir.join(format!("{name}.json"));
    let mut command = bench();
    command.args(args).args(["--quiet", "--json", json.to_str().unwrap()]);
    let output = output_within(&mut command);
    assert!(output.status.success(), "{name}: {}", String::from_utf8_lossy(&output.stderr));
    let report = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).expect("JSON");
    (report, String::from_utf8_lossy(&output.stdout).into_owned())
}

fn check_report(report: &serde_json::Value) {
    for key in ["throughput_mb_s", "throughput_msg_s"] {
        assert!(report[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {}", report[key]);
    }
    for key in ["p50", "p99", "p999", "p9999", "max"] {
        assert!(report["latency_us"][key].as_u64().is_some_and(|v| v > 0), "latency_us.{key}");
    }
    let latency = &report["latency_us"];
    assert!(latency["p50"].as_u64() <= latency["p99"].as_u64());
    assert!(latency["p99"].as_u64() <= latency["max"].as_u64());
    assert!(report["time_series"].as_array().is_some_and(|s| !s.is_empty()));
    assert!(report["environment"]["cores"].as_u64().is_some_and(|c| c > 0));
    assert!(report["server"]["shards"].as_u64().is_some_and(|s| s > 0));
    assert_eq!(report["errors"], serde_json::json!({}));
}

#[test]
fn a_two_second_run_reports_what_the_server_stored() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path());
    let address = server.native();
    let (report, printed) = run_json(
        dir.path(),
        "report",
        &[
            "produce",
            "--server",
            address,
            "--producers",
            "2",
            "--messages-per-batch",
            "100",
            "--message-size",
            "50..150",
            "--duration",
            "2",
            "--warmup",
            "0.5",
        ],
    );
    check_report(&report);
    assert_eq!(report["actors"].as_array().unwrap().len(), 2);
    let stored: u64 = status(address)["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["stream"] == "bench-0")
        .map(|p| p["next_offset"].as_u64().unwrap())
        .sum();
    assert_eq!(report["messages_acked_total"].as_u64(), Some(stored), "acknowledged = stored");
    assert!(printed.contains("throughput:"));
}

#[test]
fn spawn_server_runs_a_local_server_for_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = repo_file("configs/test.toml");
    let (report, _) = run_json(
        dir.path(),
        "report",
        &[
            "produce",
            "--spawn-server",
            config.to_str().unwrap(),
            "--messages",
            "5000",
            "--messages-per-batch",
            "50",
            "--message-size",
            "10",
            "--warmup",
            "0",
            "--rate",
            "20000msg/s",
            "--durability",
            "persisted",
        ],
    );
    check_report(&report);
    assert_eq!(report["messages_acked_total"], 5000);
    assert_eq!(report["parameters"]["durability"], "persisted");
}

#[test]
fn connect_owner_puts_every_actor_on_the_shard_that_owns_its_partition() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("two-shards.toml");
    std::fs::write(
        &config,
        "shards = 2\ncpus = \"none\"\nprofile = \"small\"\n\
         [network]\nshard_listen = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let args = |connect: &'static str| {
        [
            "e2e",
            "--spawn-server",
            config.to_str().unwrap(),
            "--producers",
            "2",
            "--consumers",
            "2",
            "--connect",
            connect,
            "--duration",
            "1",
            "--warmup",
            "0.2",
            "--rate",
            "1MB/s",
            "--messages-per-batch",
            "20",
            "--message-size",
            "16",
        ]
        .map(str::to_string)
    };
    let (owner, _) = run_json(
        dir.path(),
        "owner",
        &args("owner").iter().map(String::as_str).collect::<Vec<_>>(),
    );
    check_report(&owner);
    assert_eq!(owner["parameters"]["connect"], "owner");
    assert_eq!(owner["parameters"]["connections_on_owner_shard"], 4, "2 producers, 2 consumers");
    for actor in owner["actors"].as_array().unwrap() {
        assert_eq!(actor["on_owner_shard"], true, "{actor}");
    }
    assert_eq!(owner["messages_consumed_total"], owner["messages_acked_total"]);
    // The default leaves each connection where the kernel put it.
    let (any, _) =
        run_json(dir.path(), "any", &args("any").iter().map(String::as_str).collect::<Vec<_>>());
    check_report(&any);
    assert_eq!(any["parameters"]["connect"], "any");
    assert!(any["parameters"]["connections_on_owner_shard"].as_u64().is_some_and(|n| n <= 4));
}

#[test]
fn bad_arguments_exit_2_with_a_usage_error() {
    let output = output_within(bench().args(["produce", "--producers", "none"]));
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("error: ") && stderr.contains("--producers"), "{stderr}");
}

#[test]
fn consume_reads_back_what_produce_stored_and_e2e_consumes_what_it_produces() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path());
    let address = server.native();
    let common = ["--server", address, "--messages-per-batch", "100", "--message-size", "64"];
    let produce =
        [&common[..], &["--producers", "2", "--messages", "20000", "--warmup", "0"]].concat();
    let (produced, _) = run_json(dir.path(), "produce", &[&["produce"], &produce[..]].concat());
    assert_eq!(produced["messages_acked_total"], 20000);

    let consume =
        [&common[..], &["--consumers", "2", "--messages", "20000", "--warmup", "0"]].concat();
    let (consumed, _) = run_json(dir.path(), "consume", &[&["consume"], &consume[..]].concat());
    check_report(&consumed);
    assert_eq!(consumed["messages_consumed_total"], 20000);
    assert_eq!(consumed["latency_kind"], "poll");

    // A consumer group shares the partitions and, auto-committing, reads each message once.
    let group = [
        &common[..],
        &["--consumers", "2", "--group", "g", "--messages", "20000", "--warmup", "0"],
        &["--duration", "5"],
    ]
    .concat();
    let (grouped, _) = run_json(dir.path(), "group", &[&["consume"], &group[..]].concat());
    assert_eq!(grouped["messages_consumed_total"], 20000, "every message, once");
    assert_eq!(grouped["errors"], serde_json::json!({}));

    let e2e = [
        &common[..],
        &["--duration", "1", "--warmup", "0.2", "--rate", "2MB/s", "--stream-prefix", "e2e"],
    ]
    .concat();
    let (both, _) = run_json(dir.path(), "e2e", &[&["e2e"], &e2e[..]].concat());
    check_report(&both);
    assert_eq!(both["latency_kind"], "end_to_end_per_message");
    assert_eq!(both["messages_consumed_total"], both["messages_acked_total"], "all consumed");
}
