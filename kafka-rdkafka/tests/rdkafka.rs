//! librdkafka (the `rdkafka` crate, librdkafka built from its bundled source) against the real
//! `shoal`: a topic created through Kafka's CreateTopics with rdkafka's admin client; 100,000
//! distinct 100-byte messages, each with its own key, produced to one partition with
//! `enable.idempotence=true` (so the producer asks InitProducerId and numbers its batches),
//! `compression.type=zstd` (batches stored as sent, compressed) and `acks=all`; every delivery
//! report succeeds, at offsets 0..99,999 in send order; then a consumer assigned partition 0
//! from the beginning reads all 100,000 back in order, each with its key and payload.
//!
//! Every loop is bounded by [`DEADLINE`]; the server is killed when its guard drops.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use shoal_testkit::ShoalProcess;

/// How long the server may take to start, and the test once it has.
const DEADLINE: Duration = Duration::from_secs(60);

const MESSAGES: usize = 100_000;
const MESSAGE_BYTES: usize = 100;
const TOPIC: &str = "rdkafka";

/// Message `i`'s key.
fn key(i: usize) -> String {
    format!("key-{i}")
}

/// Message `i`'s payload: [`MESSAGE_BYTES`] bytes, its number first, then bytes that differ
/// from message to message (so zstd has something to do, but not everything).
fn payload(i: usize) -> Vec<u8> {
    let mut payload = format!("message {i:06} ").into_bytes();
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while payload.len() < MESSAGE_BYTES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        payload.push(b'a' + (x % 16) as u8);
    }
    payload
}

/// The `shoal` binary of this build: the one beside this test executable (`cargo test
/// --workspace` builds it), or — when this crate's tests were built alone (`cargo test -p
/// shoal-kafka-rdkafka` builds no other package's binary) — the one `cargo build -p
/// shoal-server` builds now, with the test profile, into the same target directory.
fn shoal_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    shoal_testkit::shoal_binary_beside(&exe)
        .unwrap_or_else(|_| build_binary("shoal-server", "shoal"))
}

/// Builds binary `bin` of `package` (cargo prints nothing but its JSON messages, which name
/// the executable) and returns its path.
fn build_binary(package: &str, bin: &str) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let mut command = Command::new(cargo);
    command
        .args(["build", "--profile", "test", "--message-format", "json", "-p", package])
        .args(["--bin", bin, "--manifest-path"])
        .arg(manifest)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    eprintln!("building {bin}: {command:?}");
    let child = command.spawn().expect("cargo runs");
    // A cold build of the server takes minutes on two cores.
    let output = shoal_testkit::output_within(child, Duration::from_secs(1200), "cargo build");
    assert!(output.status.success(), "{command:?} failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter(|message| message["target"]["name"] == bin)
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("{command:?} named no executable {bin}"))
}

/// One shard, the small profile, ephemeral ports, the Kafka listener on.
fn start(dir: &Path) -> ShoalProcess {
    let mut command = ShoalProcess::command(&shoal_binary(), dir);
    command.args(["--shards", "1", "--profile", "small", "--cpus", "none"]);
    ShoalProcess::start(command, DEADLINE).unwrap_or_else(|error| panic!("{error}"))
}

/// A server (see [`start`]) with `topic` of `partitions` partitions created through Kafka's
/// CreateTopics, and its Kafka address.
fn start_with_topic(dir: &Path, topic: &str, partitions: i32) -> (ShoalProcess, String) {
    let server = start(dir);
    let bootstrap = server.kafka().expect("Kafka listener on").to_string();
    let created = shoal_kafka_rdkafka::create_topic(
        &bootstrap,
        topic,
        partitions,
        "replicated",
        Duration::from_secs(10),
    );
    assert_eq!(created, Ok(true));
    (server, bootstrap)
}

/// What each delivery report said, in the order they came: the message's number and its
/// offset, or the error. It also prints librdkafka's log lines and errors (shown when the test
/// fails, or with `--nocapture`).
#[derive(Default)]
struct Reports(Mutex<Vec<(usize, Report)>>);

/// A delivery report: the message's partition and offset, or the error.
type Report = Result<(i32, i64), String>;

impl ClientContext for Reports {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, line: &str) {
        eprintln!("librdkafka {level:?} {facility}: {line}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        eprintln!("librdkafka error: {error}: {reason}");
    }
}

impl ConsumerContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, i: usize) {
        let report = match result {
            Ok(message) => Ok((message.partition(), message.offset())),
            Err((error, _)) => Err(error.to_string()),
        };
        self.0.lock().unwrap().push((i, report));
    }
}

/// The sum of metric `name`'s series whose labels contain `label` ("" for all).
fn metric(server: &ShoalProcess, name: &str, label: &str) -> u64 {
    let page = shoal_testkit::metrics_page(server.metrics().expect("metrics on")).expect("page");
    page.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")) && line.contains(label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A client of `bootstrap`; `RDKAFKA_DEBUG` (librdkafka's `debug` contexts, e.g.
/// `protocol,msg`) turns its debug log on.
fn config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap).set_log_level(RDKafkaLogLevel::Warning);
    if let Ok(debug) = std::env::var("RDKAFKA_DEBUG") {
        config.set("debug", debug).set_log_level(RDKafkaLogLevel::Debug);
    }
    config
}

fn produce(bootstrap: &str, started: Instant) {
    let producer: BaseProducer<Reports> = config(bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("compression.type", "zstd")
        // librdkafka's default linger; every message stays queued until delivered.
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", MESSAGES.to_string())
        // Batches within the small profile's 60 KiB `message_size_bytes_max` (librdkafka bounds
        // a batch by its size before compression).
        .set("batch.size", "50000")
        .set("message.timeout.ms", "30000")
        .create_with_context(Reports::default())
        .expect("producer");
    for i in 0..MESSAGES {
        let (key, payload) = (key(i), payload(i));
        let mut record =
            BaseRecord::with_opaque_to(TOPIC, i).partition(0).key(&key).payload(&payload);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    assert!(started.elapsed() < DEADLINE, "queue still full at message {i}");
                    record = back;
                    producer.poll(Duration::from_millis(10));
                }
                Err((error, _)) => panic!("send {i}: {error}"),
            }
        }
        producer.poll(Duration::ZERO);
    }
    let left = DEADLINE.saturating_sub(started.elapsed());
    producer.flush(left).expect("every message delivered or failed within the deadline");
    // Delivery reports are served by poll; flush waits for librdkafka's count only.
    while producer.context().0.lock().unwrap().len() < MESSAGES {
        assert!(started.elapsed() < DEADLINE, "delivery reports missing");
        producer.poll(Duration::from_millis(10));
    }
    let reports = std::mem::take(&mut *producer.context().0.lock().unwrap());
    assert_eq!(reports.len(), MESSAGES);
    for (order, (i, report)) in reports.into_iter().enumerate() {
        assert_eq!(report, Ok((0, i as i64)), "message {i}'s delivery report");
        assert_eq!(i, order, "delivery report {order} is message {i}'s");
    }
}

fn consume(bootstrap: &str, started: Instant) {
    let consumer: BaseConsumer<Reports> = config(bootstrap)
        // Assigned, not subscribed: the group is never joined, and nothing is committed.
        .set("group.id", "rdkafka-test")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create_with_context(Reports::default())
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(TOPIC, 0, Offset::Beginning).unwrap();
    consumer.assign(&assignment).expect("assigned");
    let mut next = 0;
    while next < MESSAGES {
        assert!(started.elapsed() < DEADLINE, "consumed {next} of {MESSAGES} messages");
        let Some(message) = consumer.poll(Duration::from_millis(100)) else { continue };
        let message = message.unwrap_or_else(|error| panic!("consume at {next}: {error}"));
        assert_eq!((message.partition(), message.offset()), (0, next as i64));
        assert_eq!(message.key(), Some(key(next).as_bytes()), "key at {next}");
        assert_eq!(message.payload(), Some(&payload(next)[..]), "payload at {next}");
        next += 1;
    }
}

#[test]
fn rdkafka_produces_100k_idempotent_zstd_messages_and_consumes_them_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (server, bootstrap) = start_with_topic(dir.path(), TOPIC, 1);
    produce(&bootstrap, started);
    let init_producer_id =
        metric(&server, "shoal_kafka_requests_total", "api=\"init_producer_id\"");
    assert!(init_producer_id >= 1, "the idempotent producer asked for a producer id");
    consume(&bootstrap, started);
    // The batches are stored as zstd compressed them: the partition holds fewer bytes than the
    // payloads alone.
    let stored = metric(&server, "shoal_partition_size_bytes", "topic=\"rdkafka\"");
    assert!(stored > 0 && stored < (MESSAGES * MESSAGE_BYTES) as u64, "{stored} bytes stored");
    eprintln!(
        "{MESSAGES} messages ({stored} bytes stored) produced and consumed in {:?}",
        started.elapsed()
    );
}

/// `shoal-kafka-bench --client wire`'s producer: every batch it sends is acknowledged, stored
/// once at the offsets its sequence gives it, and holds its messages as built; its consumer
/// reads every one back.
#[test]
fn the_wire_producer_writes_idempotent_batches_that_are_stored_as_sent() {
    const WIRE_TOPIC: &str = "wire";
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (_server, bootstrap) = start_with_topic(dir.path(), WIRE_TOPIC, 2);
    // Small batches for a short while: a bounded footprint.
    let window = 0..Duration::from_millis(300).as_nanos() as u64;
    let run = shoal_kafka_rdkafka::wire::run(
        &bootstrap,
        WIRE_TOPIC,
        &[0, 1],
        100,
        10_000,
        Instant::now(),
        window,
    )
    .expect("the wire producer runs");
    assert_eq!((run.errors, run.first_error.as_deref()), (0, None));
    assert!(run.batch_messages > 1 && run.batch_bytes <= 10_000, "{run:?}");
    assert!(run.batches_acked >= 2, "{} batches", run.batches_acked);
    // Round-robin over two partitions: each holds its share, dense from 0.
    let consumer: BaseConsumer<Reports> = config(&bootstrap)
        .set("group.id", "wire-test")
        .set("enable.auto.commit", "false")
        .create_with_context(Reports::default())
        .expect("consumer");
    let mut held = 0;
    for partition in [0, 1] {
        let batches = run.batches_acked / 2 + (run.batches_acked % 2) * (1 - partition as u64);
        let (low, high) = consumer
            .fetch_watermarks(WIRE_TOPIC, partition, Duration::from_secs(10))
            .expect("watermarks");
        assert_eq!((low, high), (0, (batches * u64::from(run.batch_messages)) as i64));
        held += high;
    }
    // The library-less consumer reads both partitions to their ends: every record, once.
    let read = shoal_kafka_rdkafka::wire::consume(&bootstrap, WIRE_TOPIC, &[0, 1])
        .expect("the wire consumer runs");
    assert_eq!(read.records, held as u64);
    assert_eq!(read.batch_bytes, run.batches_acked * run.batch_bytes as u64);
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(WIRE_TOPIC, 1, Offset::Beginning).unwrap();
    consumer.assign(&assignment).expect("assigned");
    let mut next = 0;
    let wanted = u64::from(run.batch_messages).min(held as u64) as i64;
    while next < wanted {
        assert!(started.elapsed() < DEADLINE, "consumed {next} of {wanted}");
        let Some(message) = consumer.poll(Duration::from_millis(100)) else { continue };
        let message = message.unwrap_or_else(|error| panic!("consume at {next}: {error}"));
        assert_eq!(message.offset(), next);
        let payload: Vec<u8> = (0..100).map(|i| b'a' + (i % 26) as u8).collect();
        assert_eq!(message.payload(), Some(&payload[..]));
        next += 1;
    }
}
