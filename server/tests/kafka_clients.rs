//! Real Kafka clients against the real binary: kcat (librdkafka 2.0.2), kafka-python,
//! confluent-kafka (Python, on the librdkafka its wheel bundles) and KafkaJS list the Kafka
//! topics, produce (acks=all, idempotently where the client can), consume from the beginning and
//! run consumer groups that rebalance and resume from their committed offsets; what they were
//! acknowledged is read back over the native protocol. The clients are installed by
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

/// The virtual environment's Python when confluent-kafka is installed in it.
fn confluent_kafka() -> Option<PathBuf> {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.kafka-clients/venv");
    // Any Python of the venv (`lib/python3.X`): the package is where pip put it.
    let package = std::fs::read_dir(venv.join("lib"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("site-packages/confluent_kafka"))
        .find(|package| package.exists())
        .unwrap_or_else(|| venv.join("lib/python3/site-packages/confluent_kafka"));
    client(package, "confluent-kafka")?;
    Some(venv.join("bin/python"))
}

/// `node` with KafkaJS (from `scripts/kafka-clients`) on its module path, or `None` when node or
/// KafkaJS is not installed. The tests add `-e SCRIPT` and the script's arguments
/// (`process.argv[1..]`).
fn kafkajs() -> Option<Command> {
    let modules =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.kafka-clients/node/node_modules");
    let node = client(PathBuf::from("/usr/bin/node"), "node")?;
    client(modules.join("kafkajs/package.json"), "KafkaJS")?;
    let mut command = Command::new(node);
    command
        .env("NODE_PATH", modules)
        // KafkaJS warns on stderr that its default partitioner changed in 2.0; every message
        // here names its partition.
        .env("KAFKAJS_NO_PARTITIONER_WARNING", "1");
    Some(command)
}

/// How many InitProducerId requests the server was asked (idempotent producers ask first).
fn init_producer_id_requests(server: &ShoalProcess) -> u64 {
    let page = shoal_testkit::metrics_page(server.metrics().unwrap()).unwrap();
    page.lines()
        .filter(|line| line.contains("api=\"init_producer_id\""))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
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

/// A client's script printed the offsets its 1,000 idempotent sends to partition 1 were
/// acknowledged at: they are 0–999 in order, the producer asked for its id (InitProducerId),
/// and each offset holds its message `value-OFFSET`, read back over the native protocol.
fn check_acknowledged_idempotently(server: &ShoalProcess, out: &str) {
    let offsets: Vec<u64> = serde_json::from_str(out.trim()).expect(out);
    assert_eq!(offsets, (0..1000).collect::<Vec<u64>>());
    assert!(init_producer_id_requests(server) >= 1, "idempotence on: the producer asks its id");
    let stored = values(server, 1);
    assert_eq!(stored.len(), 1000);
    for (offset, value) in offsets.iter().zip(&stored) {
        assert_eq!(value, format!("value-{offset}").as_bytes());
    }
}

/// A group script's result (`{"b": [...], "read_after": {P: [...]}, "lag": {P: N}}`): the two
/// members shared the partitions (checked in the script); the one left took over the other's
/// partitions where that one had committed, so on every partition it read exactly the 30 new
/// messages `v300`…`v329` that fall there; and the group's lag is 0 everywhere.
fn check_group_takeover(out: &str) {
    let seen: serde_json::Value = serde_json::from_str(out.trim()).expect(out);
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
    check_acknowledged_idempotently(&server, &out);
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
    check_group_takeover(&out);
}

#[test]
fn confluent_kafka_produces_idempotently_with_acks_all_and_consumes_from_the_beginning() {
    let Some(python) = confluent_kafka() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_topic(dir.path());
    // Delivery reports come in order per partition; each names the offset acknowledged.
    let script = r#"
import json, sys
from confluent_kafka import Producer
acked, errors = [], []
def report(err, msg):
    if err is not None:
        errors.append(str(err))
    else:
        acked.append(msg.offset())
producer = Producer({"bootstrap.servers": sys.argv[1], "enable.idempotence": True, "acks": "all",
                     "linger.ms": 5, "message.timeout.ms": 30000})
for i in range(1000):
    producer.produce("orders", value=b"value-%d" % i, partition=1, on_delivery=report)
    producer.poll(0)
left = producer.flush(30)
if left or errors:
    raise SystemExit("%d not delivered, errors %s" % (left, errors[:5]))
print(json.dumps(acked))
"#;
    let out = run(Command::new(&python).args(["-c", script, server.kafka().unwrap()]));
    check_acknowledged_idempotently(&server, &out);
    // A consumer assigned the partition from the beginning (no group management) reads them
    // back in order.
    let script = r#"
import json, sys, time
from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING
consumer = Consumer({"bootstrap.servers": sys.argv[1], "group.id": "reader",
                     "enable.auto.commit": False})
consumer.assign([TopicPartition("orders", 1, OFFSET_BEGINNING)])
seen, deadline = [], time.time() + 30
while len(seen) < 1000 and time.time() < deadline:
    for m in consumer.consume(num_messages=500, timeout=0.5):
        if m.error():
            raise SystemExit(str(m.error()))
        seen.append([m.offset(), m.value().decode()])
consumer.close()
print(json.dumps(seen))
"#;
    let out = run(Command::new(&python).args(["-c", script, server.kafka().unwrap()]));
    let seen: Vec<(u64, String)> = serde_json::from_str(out.trim()).expect(&out);
    let expected: Vec<(u64, String)> = (0..1000).map(|i| (i, format!("value-{i}"))).collect();
    assert_eq!(seen, expected);

    // DeleteRecords through the admin client: the low watermark moves to 600, and a consumer
    // from the beginning starts there.
    let script = r#"
import json, sys, time
from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING
from confluent_kafka.admin import AdminClient
admin = AdminClient({"bootstrap.servers": sys.argv[1]})
deleted = admin.delete_records([TopicPartition("orders", 1, 600)])
low = list(deleted.values())[0].result(timeout=30).low_watermark
consumer = Consumer({"bootstrap.servers": sys.argv[1], "group.id": "reader",
                     "enable.auto.commit": False})
watermarks = consumer.get_watermark_offsets(TopicPartition("orders", 1), timeout=10)
consumer.assign([TopicPartition("orders", 1, OFFSET_BEGINNING)])
first, deadline = None, time.time() + 30
while first is None and time.time() < deadline:
    m = consumer.poll(0.5)
    if m is not None and m.error() is None:
        first = [m.offset(), m.value().decode()]
consumer.close()
print(json.dumps({"low": low, "watermarks": list(watermarks), "first": first}))
"#;
    let out = run(Command::new(&python).args(["-c", script, server.kafka().unwrap()]));
    let seen: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    assert_eq!(seen["low"], 600, "{seen}");
    assert_eq!(seen["watermarks"][0], 600, "{seen}");
    assert_eq!(seen["first"], serde_json::json!([600, "value-600"]), "{seen}");
}

/// The confluent-kafka version of the kafka-python group test below, with the partition
/// assignment strategy `strategy`: two members share the partitions and commit; one leaves
/// (LeaveGroup on close) and the other takes its partitions over from the committed offsets;
/// lag 0 at the end.
fn confluent_kafka_group_rebalances_and_resumes(strategy: &str) {
    let Some(python) = confluent_kafka() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_topic(dir.path());
    let script = r#"
import json, sys, time
from confluent_kafka import Consumer, Producer, TopicPartition
bootstrap, strategy = sys.argv[1], sys.argv[2]
producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
def produce(first, count):
    for i in range(first, first + count):
        producer.produce("orders", value=b"v%d" % i, partition=i % 3)
    if producer.flush(30):
        raise SystemExit("messages not delivered")
produce(0, 300)

class Reader:
    """A member of g1, and what it read of each partition since its assignment last changed.
    The rebalance callbacks run inside poll(), before any message of the new assignment is
    returned; an eager strategy revokes everything and assigns the whole new share, a
    cooperative one moves only the partitions that change hands."""
    def __init__(self):
        self.assigned, self.offsets, self.values = set(), {}, {}
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g1",
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                  "partition.assignment.strategy": strategy,
                                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
        self.consumer.subscribe(["orders"], on_assign=self.on_assign, on_revoke=self.on_revoke,
                                on_lost=self.on_revoke)
    def changed(self):
        self.offsets, self.values = {}, {}
    def on_assign(self, consumer, partitions):
        self.assigned |= {tp.partition for tp in partitions}
        self.changed()
    def on_revoke(self, consumer, partitions):
        self.assigned -= {tp.partition for tp in partitions}
        self.changed()
    def poll(self):
        """Up to 500 messages: the first waited for up to 0.1 s, then those already fetched."""
        for timeout in [0.1] + [0] * 499:
            m = self.consumer.poll(timeout)
            if m is None:
                return
            if m.error():
                raise SystemExit(str(m.error()))
            self.offsets.setdefault(m.partition(), []).append(m.offset())
            self.values.setdefault(m.partition(), []).append(m.value().decode())
    def read_to(self, end):
        return all(self.offsets.get(p, [-1])[-1] >= end - 1 for p in self.assigned)

def until(what, step, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        step()
        if what():
            return
    raise SystemExit("timed out waiting for " + what.__doc__)

a, b = Reader(), Reader()
def shared():
    """two members sharing all three partitions, each having read its partitions to the end"""
    return (a.assigned and b.assigned and sorted(a.assigned | b.assigned) == [0, 1, 2]
            and not a.assigned & b.assigned and a.read_to(100) and b.read_to(100))
until(shared, lambda: (a.poll(), b.poll()))
shared_a, shared_b = sorted(a.assigned), sorted(b.assigned)
# The stored offsets: one past the last message each member's poll returned.
a.consumer.commit(asynchronous=False)
b.consumer.commit(asynchronous=False)

b.consumer.close()
def took_over():
    """the remaining member holding all three partitions"""
    return a.assigned == {0, 1, 2}
until(took_over, a.poll)
produce(300, 30)
def read_new():
    """the remaining member having read the new messages"""
    return sum(len(v) for v in a.values.values()) >= 30
until(read_new, a.poll)
read_after = {p: a.values.get(p, []) for p in range(3)}
a.consumer.commit(asynchronous=False)
a.consumer.close()

probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "g1", "enable.auto.commit": False})
committed = probe.committed([TopicPartition("orders", p) for p in range(3)], timeout=10)
lag = {tp.partition: probe.get_watermark_offsets(tp, timeout=10)[1] - tp.offset
       for tp in committed}
probe.close()
print(json.dumps({"a": shared_a, "b": shared_b, "read_after": read_after, "lag": lag}))
"#;
    let out = run(Command::new(&python).args(["-c", script, server.kafka().unwrap(), strategy]));
    check_group_takeover(&out);
}

/// librdkafka's default strategies (`range,roundrobin`): eager rebalancing, every member gives
/// up all its partitions at each rebalance.
#[test]
fn confluent_kafka_group_rebalances_when_a_member_leaves_and_resumes_from_committed_offsets() {
    confluent_kafka_group_rebalances_and_resumes("range,roundrobin");
}

/// KIP-429's incremental rebalancing over the classic protocol: the remaining member keeps its
/// partitions and is given the leaver's.
#[test]
fn confluent_kafka_cooperative_group_takes_over_the_leavers_partitions_from_committed_offsets() {
    confluent_kafka_group_rebalances_and_resumes("cooperative-sticky");
}

#[test]
fn kafkajs_produces_idempotently_with_acks_all_and_consumes_from_the_beginning() {
    let Some(mut produce) = kafkajs() else { return };
    let mut consume = kafkajs().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_topic(dir.path());
    // 20 sends of 50 messages, one at a time (an idempotent KafkaJS producer allows one request
    // in flight); each answers the base offset of its batch.
    let script = r#"
const { Kafka, logLevel } = require('kafkajs')
const kafka = new Kafka({ clientId: 'shoal-test', brokers: [process.argv[1]], logLevel: logLevel.WARN })
async function main() {
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 })
  await producer.connect()
  const offsets = []
  for (let first = 0; first < 1000; first += 50) {
    const messages = []
    for (let i = first; i < first + 50; i++) messages.push({ value: `value-${i}`, partition: 1 })
    const [result] = await producer.send({ topic: 'orders', acks: -1, messages })
    if (result.errorCode !== 0 || result.partition !== 1) throw new Error(JSON.stringify(result))
    for (let j = 0; j < 50; j++) offsets.push(Number(result.baseOffset) + j)
  }
  await producer.disconnect()
  console.log(JSON.stringify(offsets))
}
main().catch(error => { console.error(error); process.exit(1) })
"#;
    let out = run(produce.args(["-e", script, server.kafka().unwrap()]));
    check_acknowledged_idempotently(&server, &out);
    // KafkaJS consumes through a group only: a new group reads from the beginning
    // (`fromBeginning`, auto.offset.reset=earliest). `maxWaitTimeInMs` bounds the fetch
    // `disconnect` waits for.
    let script = r#"
const { Kafka, logLevel } = require('kafkajs')
const kafka = new Kafka({ clientId: 'shoal-test', brokers: [process.argv[1]], logLevel: logLevel.WARN })
async function main() {
  const consumer = kafka.consumer({ groupId: 'reader', sessionTimeout: 6000, heartbeatInterval: 500,
                                    maxWaitTimeInMs: 500 })
  await consumer.connect()
  await consumer.subscribe({ topic: 'orders', fromBeginning: true })
  const seen = []
  await consumer.run({ autoCommit: false, eachMessage: async ({ partition, message }) => {
    seen.push([partition, Number(message.offset), message.value.toString()])
  } })
  const deadline = Date.now() + 30000
  while (seen.length < 1000) {
    if (Date.now() > deadline) throw new Error(`read ${seen.length} of 1000 messages`)
    await new Promise(resolve => setTimeout(resolve, 20))
  }
  await consumer.disconnect()
  console.log(JSON.stringify(seen))
}
main().catch(error => { console.error(error); process.exit(1) })
"#;
    let out = run(consume.args(["-e", script, server.kafka().unwrap()]));
    let seen: Vec<(u32, u64, String)> = serde_json::from_str(out.trim()).expect(&out);
    let expected: Vec<(u32, u64, String)> =
        (0..1000).map(|i| (1, i, format!("value-{i}"))).collect();
    assert_eq!(seen, expected);
}

/// The KafkaJS version of the kafka-python group test: KafkaJS's round-robin assignment (eager),
/// offsets committed explicitly with `commitOffsets`, the leaver's `disconnect` a LeaveGroup,
/// the lag read through KafkaJS's admin client (OffsetFetch and ListOffsets).
#[test]
fn kafkajs_group_rebalances_when_a_member_leaves_and_resumes_from_committed_offsets() {
    let Some(mut node) = kafkajs() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_topic(dir.path());
    let script = r#"
const { Kafka, logLevel } = require('kafkajs')
const topic = 'orders'
const kafka = new Kafka({ clientId: 'shoal-test', brokers: [process.argv[1]], logLevel: logLevel.WARN })
async function until(what, description, seconds = 30) {
  const deadline = Date.now() + seconds * 1000
  while (!what()) {
    if (Date.now() > deadline) throw new Error('timed out waiting for ' + description)
    await new Promise(resolve => setTimeout(resolve, 20))
  }
}
const producer = kafka.producer()
async function produce(first, count) {
  const messages = []
  for (let i = first; i < first + count; i++) messages.push({ value: `v${i}`, partition: i % 3 })
  await producer.send({ topic, acks: -1, messages })
}

// A member of g1, and what it read of each partition since its assignment last changed:
// GROUP_JOIN is emitted after each sync, before the new generation's first fetch.
async function member() {
  const m = { assigned: [], offsets: {}, values: {} }
  m.consumer = kafka.consumer({ groupId: 'g1', sessionTimeout: 6000, heartbeatInterval: 500,
                                rebalanceTimeout: 10000, maxWaitTimeInMs: 500 })
  m.consumer.on(m.consumer.events.GROUP_JOIN, ({ payload }) => {
    m.assigned = (payload.memberAssignment[topic] || []).slice().sort()
    m.offsets = {}
    m.values = {}
  })
  await m.consumer.connect()
  await m.consumer.subscribe({ topic, fromBeginning: true })
  await m.consumer.run({ autoCommit: false, eachMessage: async ({ partition, message }) => {
    ;(m.offsets[partition] ||= []).push(Number(message.offset))
    ;(m.values[partition] ||= []).push(message.value.toString())
  } })
  return m
}
const readTo = (m, end) => m.assigned.every(p => (m.offsets[p] || [-1]).at(-1) >= end - 1)
// Commits, for each partition read, the offset after the last message read.
const commit = m => m.consumer.commitOffsets(Object.entries(m.offsets).map(([partition, offsets]) =>
  ({ topic, partition: Number(partition), offset: String(offsets.at(-1) + 1) })))

async function main() {
  await producer.connect()
  await produce(0, 300)
  const a = await member(), b = await member()
  await until(() => a.assigned.length && b.assigned.length
    && [...a.assigned, ...b.assigned].sort().join() === '0,1,2' && readTo(a, 100) && readTo(b, 100),
    'two members sharing all three partitions, each having read its partitions to the end')
  const [sharedA, sharedB] = [a.assigned, b.assigned]
  await commit(a)
  await commit(b)

  await b.consumer.disconnect()
  await until(() => a.assigned.join() === '0,1,2', 'the remaining member holding all three partitions')
  await produce(300, 30)
  await until(() => Object.values(a.values).flat().length >= 30, 'the remaining member having read the new messages')
  const readAfter = {}
  for (let p = 0; p < 3; p++) readAfter[p] = a.values[p] || []
  await commit(a)
  await a.consumer.disconnect()
  await producer.disconnect()

  const admin = kafka.admin()
  await admin.connect()
  const [committed] = await admin.fetchOffsets({ groupId: 'g1', topics: [topic] })
  const ends = await admin.fetchTopicOffsets(topic)
  await admin.disconnect()
  const lag = {}
  for (const { partition, high } of ends)
    lag[partition] = Number(high) - Number(committed.partitions.find(c => c.partition === partition).offset)
  console.log(JSON.stringify({ a: sharedA, b: sharedB, read_after: readAfter, lag }))
}
main().catch(error => { console.error(error); process.exit(1) })
"#;
    let out = run(node.args(["-e", script, server.kafka().unwrap()]));
    check_group_takeover(&out);
}

/// A confluent-kafka producer with acks=all and idempotence survives `kill -9` of its
/// partition's primary on a three-node cluster: it follows NOT_LEADER_OR_FOLLOWER through
/// Metadata to the new leader, every message is acknowledged, and each acknowledged message
/// reads back at its offset exactly once. The script creates the topic (CreateTopics to the
/// controller), kills the leader it finds in Metadata (the PIDs are its arguments) with
/// messages in flight, and reads the partition back through the new leader.
#[test]
fn confluent_kafka_producer_with_acks_all_survives_kill_9_of_the_partition_leader() {
    let Some(python) = confluent_kafka() else { return };
    let root = tempfile::tempdir().unwrap();
    let plan = shoal_testkit::ClusterPlan::small(
        env!("CARGO_BIN_EXE_shoal").into(),
        root.path(),
        3,
        DEADLINE,
    );
    let mut cluster = shoal_testkit::ShoalCluster::start(plan).unwrap_or_else(|e| panic!("{e}"));
    let pids: Vec<String> =
        cluster.nodes.iter().map(|node| node.pid().expect("running").to_string()).collect();
    let script = r#"
import json, os, signal, sys, time
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
bootstrap, pids = sys.argv[1], [int(p) for p in sys.argv[2].split(",")]
admin = AdminClient({"bootstrap.servers": bootstrap})
topic = NewTopic("orders", num_partitions=1, replication_factor=-1,
                 config={"shoal.durability": "persisted"})
deadline = time.time() + 30
while True:
    try:
        admin.create_topics([topic])["orders"].result(timeout=10)
        break
    except Exception as error:  # the cluster may still be electing its metadata primary
        # An earlier attempt whose answer was an error (a timeout, a primary changing) may
        # have created the topic all the same, as with Kafka: a retry then finds it.
        reason = error.args[0] if error.args else None
        if isinstance(reason, KafkaError) and reason.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            break
        if time.time() > deadline:
            raise
        time.sleep(0.2)

producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                     "linger.ms": 5, "message.timeout.ms": 45000})
acked, failed = {}, []
def report(error, message):
    if error is None:
        acked[message.value().decode()] = message.offset()
    else:
        failed.append(str(error))
def send(first, count):
    for i in range(first, first + count):
        while True:
            try:
                producer.produce("orders", value=b"m%d" % i, partition=0, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)

deadline = time.time() + 30
leader = -1
while leader < 0:
    # A node that has not applied the creation yet answers the topic unknown: ask again.
    partition = producer.list_topics("orders", timeout=10).topics["orders"].partitions.get(0)
    leader = partition.leader if partition is not None else -1
    if time.time() > deadline:
        raise SystemExit("no leader for orders/0")
send(0, 300)
producer.flush(30)
send(300, 40)
os.kill(pids[leader], signal.SIGKILL)
send(340, 260)
left = producer.flush(45)

consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check",
                     "enable.auto.commit": False})
consumer.assign([TopicPartition("orders", 0, 0)])
stored, deadline = [], time.time() + 30
while len(stored) < len(acked) and time.time() < deadline:
    message = consumer.poll(0.5)
    if message is not None and message.error() is None:
        stored.append([message.offset(), message.value().decode()])
consumer.close()
print(json.dumps({"killed": leader, "left": left, "failed": failed, "acked": acked,
                  "stored": stored}))
"#;
    let out =
        run(Command::new(&python).args(["-c", script, &cluster.kafka_servers(), &pids.join(",")]));
    let seen: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    let killed = seen["killed"].as_u64().expect("a leader was killed") as usize;
    assert!(!cluster.nodes[killed].is_running(), "the script killed node {killed}, the leader");
    let survivors = (0..3).filter(|&node| cluster.nodes[node].is_running()).count();
    assert_eq!(survivors, 2);
    assert_eq!((&seen["left"], &seen["failed"]), (&serde_json::json!(0), &serde_json::json!([])));
    let acked = seen["acked"].as_object().unwrap();
    assert_eq!(acked.len(), 600, "every message acknowledged");
    // Stored exactly once each, dense from 0, and every acknowledged message where its
    // acknowledgement said.
    let stored: Vec<(u64, String)> = serde_json::from_value(seen["stored"].clone()).unwrap();
    let offsets: Vec<u64> = stored.iter().map(|(offset, _)| *offset).collect();
    assert_eq!(offsets, (0..600).collect::<Vec<u64>>(), "{seen}");
    for (offset, value) in &stored {
        assert_eq!(acked[value].as_u64(), Some(*offset), "{value}");
    }
}
