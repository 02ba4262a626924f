//! Real Kafka clients against the real binary: kcat (librdkafka 2.0.2) and kafka-python list the
//! Kafka topics and their partitions' leaders through Metadata, and produce (acks=all); what
//! they were acknowledged is read back over the native protocol. The clients are installed by
//! `scripts/kafka-clients` (pinned versions; `.ci/run` calls it first). Without them a test
//! says loudly that it skipped — except under `CI=true`, where a missing client fails the run.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use shoal_proto::Durability;
use shoal_proto::protocol::FetchFrom;

use common::{DEADLINE, Raw, ShoalProcess};

/// The client program at `path`, or `None` (after saying so) when it is not installed.
fn client(path: PathBuf, name: &str) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    let message =
        format!("{name} is not installed at {}: run scripts/kafka-clients", path.display());
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{message}");
    eprintln!("SKIPPED: {message}");
    None
}

/// The Python of the virtual environment `scripts/kafka-clients` installed kafka-python in.
fn kafka_python() -> Option<PathBuf> {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.kafka-clients/venv");
    client(venv.join("bin/python"), "kafka-python")
}

/// A server with the Kafka stream's topic `orders` of 3 partitions.
fn server_with_topic(dir: &std::path::Path) -> ShoalProcess {
    let server = common::start(dir, 2);
    let mut raw = Raw::connect(server.native(), 1);
    raw.create_stream("kafka").ok();
    raw.create_topic("kafka", "orders", 3, Durability::Replicated).ok();
    server
}

fn run(command: &mut Command) -> String {
    run_with_input(command, b"")
}

/// Runs `command` with `input` on its stdin, bounded by the tests' deadline; its stdout.
fn run_with_input(command: &mut Command, input: &[u8]) -> String {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    child.stdin.take().expect("stdin").write_all(input).expect("input written");
    let output = shoal_testkit::output_within(child, DEADLINE, "a Kafka client");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?} failed: {stderr}", command);
    String::from_utf8(output.stdout).expect("UTF-8")
}

#[test]
fn kcat_lists_the_kafka_topics_and_their_leaders() {
    let Some(kcat) = client(PathBuf::from("/usr/bin/kcat"), "kcat") else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_topic(dir.path());
    let kafka = server.kafka().unwrap();
    let listing = run(Command::new(kcat).args(["-b", kafka, "-L", "-J", "-m", "30"]));
    let listing: serde_json::Value = serde_json::from_str(&listing).expect(&listing);
    assert_eq!(listing["brokers"][0]["name"], kafka, "{listing}");
    let topics = listing["topics"].as_array().unwrap();
    assert_eq!(topics.len(), 1, "{listing}");
    assert_eq!(topics[0]["topic"], "orders");
    let partitions = topics[0]["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), 3);
    assert!(partitions.iter().all(|p| p["leader"] == 0), "{listing}");
}

/// The values of partition `partition` of the Kafka topic `orders`, read over the native
/// protocol.
fn values(server: &ShoalProcess, partition: u32) -> Vec<Vec<u8>> {
    let mut raw = Raw::connect(server.native(), 2);
    let (_, records) = raw.fetch("kafka", "orders", partition, FetchFrom::Offset(0), 10_000);
    records.into_iter().map(|(_, value)| value).collect()
}

#[test]
fn kcat_produces_and_consumes_in_order() {
    let Some(kcat) = client(PathBuf::from("/usr/bin/kcat"), "kcat") else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_topic(dir.path());
    let kafka = server.kafka().unwrap();
    let lines: String = (0..500).map(|i| format!("message-{i}\n")).collect();
    // librdkafka's defaults: acks=all, batching; -p 2 names the partition.
    run_with_input(
        Command::new(&kcat).args(["-b", kafka, "-P", "-t", "orders", "-p", "2"]),
        lines.as_bytes(),
    );
    let expected: Vec<Vec<u8>> = (0..500).map(|i| format!("message-{i}").into_bytes()).collect();
    assert_eq!(values(&server, 2), expected, "stored as produced");
    // From the beginning to the end of the partition (-e exits there).
    let consumed = run(Command::new(&kcat).args([
        "-b",
        kafka,
        "-C",
        "-t",
        "orders",
        "-p",
        "2",
        "-o",
        "beginning",
        "-e",
        "-f",
        "%o %s\n",
    ]));
    let expected: String = (0..500).map(|i| format!("{i} message-{i}\n")).collect();
    assert_eq!(consumed, expected);
}

#[test]
fn kafka_python_sees_the_kafka_topics_and_their_partitions() {
    let Some(python) = kafka_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_topic(dir.path());
    let script = r#"
import json, sys
from kafka import KafkaConsumer
consumer = KafkaConsumer(bootstrap_servers=sys.argv[1], request_timeout_ms=20000)
topics = sorted(consumer.topics())
print(json.dumps({"topics": topics, "orders": sorted(consumer.partitions_for_topic("orders"))}))
consumer.close()
"#;
    let out = run(Command::new(python).args(["-c", script, server.kafka().unwrap()]));
    let seen: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    assert_eq!(seen["topics"], serde_json::json!(["orders"]));
    assert_eq!(seen["orders"], serde_json::json!([0, 1, 2]));
}

#[test]
fn kafka_python_produces_idempotently_with_acks_all_and_every_acknowledged_offset_holds_its_message()
 {
    let Some(python) = kafka_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_topic(dir.path());
    let script = r#"
import json, sys
from kafka import KafkaProducer
producer = KafkaProducer(bootstrap_servers=sys.argv[1], acks="all", linger_ms=5, enable_idempotence=True)
futures = [producer.send("orders", value=b"value-%d" % i, partition=1) for i in range(1000)]
producer.flush()
print(json.dumps([f.get(timeout=30).offset for f in futures]))
producer.close()
"#;
    let out = run(Command::new(&python).args(["-c", script, server.kafka().unwrap()]));
    let offsets: Vec<u64> = serde_json::from_str(out.trim()).expect(&out);
    assert_eq!(offsets, (0..1000).collect::<Vec<u64>>());
    // Idempotence on: the producer asked for its id (and every batch carries it).
    let page = shoal_testkit::metrics_page(server.metrics().unwrap()).unwrap();
    let asked: u64 = page
        .lines()
        .filter(|line| line.contains("api=\"init_producer_id\""))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(asked >= 1, "no InitProducerId request\n{page}");
    let stored = values(&server, 1);
    assert_eq!(stored.len(), 1000);
    for (offset, value) in offsets.iter().zip(&stored) {
        assert_eq!(value, format!("value-{offset}").as_bytes());
    }
    // And a kafka-python consumer reads them back from the beginning, in order.
    let script = r#"
import json, sys
from kafka import KafkaConsumer, TopicPartition
consumer = KafkaConsumer(bootstrap_servers=sys.argv[1], enable_auto_commit=False)
partition = TopicPartition("orders", 1)
consumer.assign([partition])
consumer.seek_to_beginning(partition)
seen = []
for _ in range(200):
    for records in consumer.poll(timeout_ms=500).values():
        seen += [[r.offset, r.value.decode()] for r in records]
    if len(seen) >= 1000:
        break
print(json.dumps(seen))
consumer.close()
"#;
    let out = run(Command::new(&python).args(["-c", script, server.kafka().unwrap()]));
    let seen: Vec<(u64, String)> = serde_json::from_str(out.trim()).expect(&out);
    let expected: Vec<(u64, String)> = (0..1000).map(|i| (i, format!("value-{i}"))).collect();
    assert_eq!(seen, expected);
}
