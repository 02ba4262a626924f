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

/// A kafka-python consumer group of two members shares the partitions, commits, and when one
/// member leaves the other takes its partitions over from their committed offsets; a consumer
/// that read everything and committed has no lag (its own commits do not count).
#[test]
fn kafka_python_group_rebalances_when_a_member_leaves_and_resumes_from_committed_offsets() {
    let Some(python) = kafka_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_topic(dir.path());
    let script = r#"
import json, sys, time
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
bootstrap = sys.argv[1]
producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
def produce(first, count):
    for i in range(first, first + count):
        producer.send("orders", value=b"v%d" % i, partition=i % 3)
    producer.flush()
produce(0, 300)

def member():
    return KafkaConsumer("orders", bootstrap_servers=bootstrap, group_id="g1",
                         enable_auto_commit=False, auto_offset_reset="earliest",
                         session_timeout_ms=6000, heartbeat_interval_ms=500)

def parts(consumer):
    return sorted(tp.partition for tp in consumer.assignment())

class Reader:
    """What a member read of each partition since its assignment last changed."""
    def __init__(self, consumer):
        self.consumer, self.assigned, self.offsets, self.values = consumer, [], {}, {}
    def poll(self):
        records = self.consumer.poll(timeout_ms=200)
        if parts(self.consumer) != self.assigned:
            self.assigned, self.offsets, self.values = parts(self.consumer), {}, {}
        for tp, batch in records.items():
            for r in batch:
                self.offsets.setdefault(tp.partition, []).append(r.offset)
                self.values.setdefault(tp.partition, []).append(r.value.decode())
    def read_to(self, end):
        return all(self.offsets.get(p, [-1])[-1] >= end - 1 for p in self.assigned)

def until(what, step, seconds=90):
    deadline = time.time() + seconds
    while time.time() < deadline:
        step()
        if what():
            return
    raise SystemExit("timed out waiting for " + what.__doc__)

a, b = Reader(member()), Reader(member())
def shared():
    """two members sharing all three partitions, each having read its partitions to the end"""
    return (a.assigned and b.assigned and sorted(a.assigned + b.assigned) == [0, 1, 2]
            and a.read_to(100) and b.read_to(100))
until(shared, lambda: (a.poll(), b.poll()))
shared_a, shared_b = a.assigned, b.assigned
a.consumer.commit()
b.consumer.commit()

b.consumer.close()
def took_over():
    """the remaining member holding all three partitions"""
    return a.assigned == [0, 1, 2]
until(took_over, a.poll)
produce(300, 30)
def read_new():
    """the remaining member having read the new messages"""
    return sum(len(v) for v in a.values.values()) >= 30
until(read_new, a.poll)
read_after = {p: a.values.get(p, []) for p in range(3)}
a.consumer.commit()
a.consumer.close()

probe = KafkaConsumer(bootstrap_servers=bootstrap, group_id="g1", enable_auto_commit=False)
tps = [TopicPartition("orders", p) for p in range(3)]
ends = probe.end_offsets(tps)
lag = {tp.partition: ends[tp] - probe.committed(tp) for tp in tps}
probe.close()
print(json.dumps({"a": shared_a, "b": shared_b, "read_after": read_after, "lag": lag}))
"#;
    let out = run(Command::new(&python).args(["-c", script, server.kafka().unwrap()]));
    let seen: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    // The two members shared the partitions (checked in the script); the one left took over
    // the other's partitions where that one had committed, so it read exactly the new messages
    // there, as on its own partitions.
    assert!(!seen["b"].as_array().unwrap().is_empty(), "{seen}");
    for partition in 0..3 {
        let expected: Vec<String> =
            (300..330).filter(|i| i % 3 == partition).map(|i| format!("v{i}")).collect();
        assert_eq!(
            seen["read_after"][partition.to_string()],
            serde_json::json!(expected),
            "{seen}"
        );
    }
    assert_eq!(seen["lag"], serde_json::json!({"0": 0, "1": 0, "2": 0}), "{seen}");
}
