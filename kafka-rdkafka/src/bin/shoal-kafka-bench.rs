//! `shoal-kafka-bench`: Kafka produce load through librdkafka, as a Kafka user's producer runs
//! by default — `linger.ms=5`, `batch.size` 1 MiB, `acks=all`, `enable.idempotence=true`,
//! no compression — against any Kafka listener (Shoal's, for `scripts/bench-kafka`).
//!
//! `--producers P` threads each own an rdkafka `ThreadedProducer` (its own librdkafka client and
//! connection, and a thread serving its delivery reports) and write messages of `--message-size`
//! bytes round-robin over their partitions (producer p takes the partitions q with q % P = p, or
//! partition p % N when there are fewer partitions than producers) as fast as the producer's
//! queue takes them: a full queue (librdkafka's default bounds, 100,000 messages or 1 GiB, or
//! `--queue-kbytes`) is waited out in short sleeps. Each message's latency is from its send being
//! accepted to its delivery report, so at full load it is mostly the time spent in that queue. Deliveries reported
//! within `--duration` seconds after `--warmup` are counted; the report (`--json`) has the fields
//! of `shoal-bench --json` that `scripts/bench-kafka` reads: `throughput_mb_s` (payload bytes,
//! 10⁶ per MB), `throughput_msg_s`, `latency_us` (`p50`, `p99`, `max`, ...), `errors`; and
//! librdkafka's mean batch (`batch_messages_avg`, `batch_bytes_avg`, from its statistics).
//!
//! `--client wire` sends the same requests without librdkafka (`shoal_kafka_rdkafka::wire`),
//! so the listener's cost shows apart from the library's; its latency is per batch.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use rdkafka::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::statistics::Statistics;
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(
    name = "shoal-kafka-bench",
    max_term_width = 100,
    about = "Kafka produce load through librdkafka: throughput and per-message delivery latency."
)]
struct Cli {
    /// The Kafka listener (bootstrap.servers).
    #[arg(long)]
    bootstrap: String,
    /// The topic written to.
    #[arg(long, default_value = "bench")]
    topic: String,
    /// The topic's partitions (written round-robin, shared out among the producers).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..))]
    partitions: i32,
    /// Producer threads, each with its own librdkafka producer.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    producers: u32,
    /// Bytes of each message's value (no key).
    #[arg(long, default_value_t = 1000)]
    message_size: usize,
    /// Seconds measured, after the warm-up.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of load before the measured window.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// `linger.ms`.
    #[arg(long, default_value_t = 5)]
    linger_ms: u32,
    /// `batch.size` in bytes.
    #[arg(long, default_value_t = 1_048_576)]
    batch_size: u32,
    /// `queue.buffering.max.kbytes`, with no bound on the messages: what each producer may
    /// hold unacknowledged. Without it, librdkafka's defaults (100,000 messages, 1 GiB).
    #[arg(long)]
    queue_kbytes: Option<u32>,
    /// Create the topic through Kafka's CreateTopics first, unless it exists.
    #[arg(long)]
    create_topic: bool,
    /// The created topic's `shoal.durability` (`replicated` or `persisted`).
    #[arg(long, default_value = "replicated")]
    durability: String,
    /// Where to write the JSON report.
    #[arg(long)]
    json: Option<PathBuf>,
    /// `librdkafka`, or `wire`: the same requests without a client library (`--linger-ms`,
    /// `--batch-size` and `--queue-kbytes` do not apply; batches are filled to 10^6 bytes,
    /// 5 in flight), to measure the listener apart from librdkafka's cost.
    #[arg(long, value_enum, default_value_t = Client::Librdkafka)]
    client: Client,
    /// Read instead of write (`--client wire` only): `--producers` consumers each read their
    /// partitions from offset 0 to the end they had, Fetch after Fetch; the report's
    /// `throughput_mb_s` counts `--message-size` bytes per record.
    #[arg(long)]
    consume: bool,
}

/// Which Kafka producer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Client {
    Librdkafka,
    Wire,
}

/// How long a producer waits before it sends again into a full queue.
const QUEUE_FULL_WAIT: Duration = Duration::from_micros(500);

/// Largest latency recorded, in microseconds (as `shoal-bench`).
const LATENCY_US_MAX: u64 = 3_600_000_000;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid bounds")
}

/// What one producer measured.
struct Tally {
    /// Delivery latencies of the messages reported within the window, in µs.
    latency: Histogram<u64>,
    /// Messages reported delivered within the window.
    messages: u64,
    /// Failed deliveries, at any time.
    errors: u64,
    first_error: Option<String>,
    /// librdkafka's mean batch size and message count, one sample per statistics report
    /// within the window.
    batch_bytes: Vec<i64>,
    batch_messages: Vec<i64>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            latency: histogram(),
            messages: 0,
            errors: 0,
            first_error: None,
            batch_bytes: Vec::new(),
            batch_messages: Vec::new(),
        }
    }
}

/// One producer's context: where delivery reports and statistics are tallied.
struct Meter {
    start: Instant,
    topic: String,
    /// The measured window, in nanoseconds since `start`.
    window: std::ops::Range<u64>,
    tally: Mutex<Tally>,
}

impl Meter {
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
}

impl ClientContext for Meter {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, line: &str) {
        eprintln!("librdkafka {level:?} {facility}: {line}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        eprintln!("librdkafka error: {error}: {reason}");
    }

    fn stats(&self, statistics: Statistics) {
        if !self.window.contains(&self.now_ns()) {
            return;
        }
        if let Some(topic) = statistics.topics.get(&self.topic)
            && topic.batchcnt.cnt > 0
        {
            let mut tally = self.tally.lock().unwrap();
            tally.batch_bytes.push(topic.batchsize.avg);
            tally.batch_messages.push(topic.batchcnt.avg);
        }
    }
}

impl ProducerContext for Meter {
    /// When the send was accepted, in nanoseconds since `start`.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, sent_ns: usize) {
        let now = self.now_ns();
        let mut tally = self.tally.lock().unwrap();
        match result {
            Ok(_) if self.window.contains(&now) => {
                tally.messages += 1;
                let us = now.saturating_sub(sent_ns as u64) / 1000;
                tally.latency.saturating_record(us.clamp(1, LATENCY_US_MAX));
            }
            Ok(_) => {}
            Err((error, _)) => {
                tally.errors += 1;
                tally.first_error.get_or_insert_with(|| error.to_string());
            }
        }
    }
}

/// Producer `index`'s partitions.
fn partitions_of(index: u32, producers: u32, partitions: i32) -> Vec<i32> {
    if partitions as u32 >= producers {
        (0..partitions).filter(|q| *q as u32 % producers == index).collect()
    } else {
        vec![(index % partitions as u32) as i32]
    }
}

/// Runs one library-less producer (`--client wire`) until the window ends; each batch's
/// latency is from its send to its response.
fn produce_wire(
    cli: &Cli,
    index: u32,
    start: Instant,
    window: std::ops::Range<u64>,
) -> Result<Tally, String> {
    let partitions = partitions_of(index, cli.producers, cli.partitions);
    let run = shoal_kafka_rdkafka::wire::run(
        &cli.bootstrap,
        &cli.topic,
        &partitions,
        cli.message_size,
        shoal_kafka_rdkafka::wire::BATCH_BYTES_MAX,
        start,
        window,
    )
    .map_err(|e| format!("producer {index}: {e}"))?;
    let mut tally = Tally::new();
    for acked in &run.acked {
        tally.messages += u64::from(acked.messages);
        let us = acked.acked_ns.saturating_sub(acked.sent_ns) / 1000;
        tally.latency.saturating_record(us.clamp(1, LATENCY_US_MAX));
    }
    tally.errors = run.errors;
    tally.first_error = run.first_error;
    tally.batch_bytes.push(run.batch_bytes as i64);
    tally.batch_messages.push(i64::from(run.batch_messages));
    Ok(tally)
}

/// Runs one producer until the window ends, then flushes it.
fn produce(
    cli: &Cli,
    index: u32,
    start: Instant,
    window: std::ops::Range<u64>,
) -> Result<Tally, String> {
    let tally = Mutex::new(Tally::new());
    let meter = Meter { start, topic: cli.topic.clone(), window: window.clone(), tally };
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &cli.bootstrap)
        .set("client.id", format!("shoal-kafka-bench-{index}"))
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("compression.type", "none")
        .set("linger.ms", cli.linger_ms.to_string())
        .set("batch.size", cli.batch_size.to_string())
        .set("statistics.interval.ms", "1000")
        .set_log_level(RDKafkaLogLevel::Warning);
    if let Some(kbytes) = cli.queue_kbytes {
        // The byte bound rules: librdkafka's own ceiling of messages.
        config
            .set("queue.buffering.max.kbytes", kbytes.to_string())
            .set("queue.buffering.max.messages", "2147483647");
    }
    let producer: ThreadedProducer<Meter> =
        config.create_with_context(meter).map_err(|e| format!("producer {index}: {e}"))?;
    let partitions = partitions_of(index, cli.producers, cli.partitions);
    let payload: Vec<u8> = (0..cli.message_size).map(|i| b'a' + (i % 26) as u8).collect();
    let end = window.end;
    let mut next = 0;
    loop {
        // One clock read per message: its send time, which also ends the run.
        let sent = start.elapsed().as_nanos() as u64;
        if sent >= end {
            break;
        }
        let partition = partitions[next % partitions.len()];
        let record: BaseRecord<'_, (), [u8], usize> =
            BaseRecord::with_opaque_to(&cli.topic, sent as usize)
                .partition(partition)
                .payload(&payload);
        match producer.send(record) {
            Ok(()) => next += 1,
            // Sleeping, not polling: the producer's own thread serves the delivery reports, and
            // rdkafka's `poll` spins through the last millisecond of its timeout (it hands
            // librdkafka whole milliseconds), which on two cores takes the CPU the broker
            // threads and the server need.
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                std::thread::sleep(QUEUE_FULL_WAIT);
            }
            Err((error, _)) => return Err(format!("producer {index}: send: {error}")),
        }
    }
    // What is still queued is delivered (or fails) within librdkafka's message timeout; its
    // reports fall after the window and are counted only if they fail.
    producer.flush(Duration::from_secs(60)).map_err(|e| format!("producer {index}: flush: {e}"))?;
    // The delivery reports of the last deliveries wait in the queue until its thread polls.
    let drained = Instant::now() + Duration::from_secs(10);
    while producer.in_flight_count() > 0 && Instant::now() < drained {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(std::mem::replace(&mut *producer.context().tally.lock().unwrap(), Tally::new()))
}

/// `latency_us` as `shoal-bench` writes it.
fn latency_json(h: &Histogram<u64>) -> Value {
    let at = |q: f64| if h.is_empty() { 0 } else { h.value_at_quantile(q) };
    let round = |x: f64| (x * 10.0).round() / 10.0;
    json!({
        "count": h.len(),
        "p50": at(0.50),
        "p90": at(0.90),
        "p95": at(0.95),
        "p99": at(0.99),
        "p999": at(0.999),
        "p9999": at(0.9999),
        "max": if h.is_empty() { 0 } else { h.max() },
        "mean": if h.is_empty() { 0.0 } else { round(h.mean()) },
        "stdev": if h.is_empty() { 0.0 } else { round(h.stdev()) },
    })
}

fn mean(samples: &[i64]) -> Option<f64> {
    (!samples.is_empty()).then(|| samples.iter().sum::<i64>() as f64 / samples.len() as f64)
}

/// `--consume`: every consumer's read, then the report.
fn consume(cli: &Cli) -> ExitCode {
    if cli.client != Client::Wire {
        eprintln!("shoal-kafka-bench: --consume needs --client wire");
        return ExitCode::from(2);
    }
    let reads: Vec<Result<shoal_kafka_rdkafka::wire::WireRead, String>> =
        std::thread::scope(|scope| {
            let threads: Vec<_> = (0..cli.producers)
                .map(|index| {
                    let partitions = partitions_of(index, cli.producers, cli.partitions);
                    scope.spawn(move || {
                        shoal_kafka_rdkafka::wire::consume(&cli.bootstrap, &cli.topic, &partitions)
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().expect("consumer thread")).collect()
        });
    let (mut records, mut batch_bytes, mut fetches, mut seconds) = (0u64, 0u64, 0u64, 0f64);
    for read in reads {
        match read {
            Ok(read) => {
                records += read.records;
                batch_bytes += read.batch_bytes;
                fetches += read.fetches;
                seconds = seconds.max(read.elapsed.as_secs_f64());
            }
            Err(error) => {
                eprintln!("shoal-kafka-bench: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    let seconds = seconds.max(1e-9);
    let bytes = records * cli.message_size as u64;
    let rate = |amount: f64| ((amount / seconds) * 100.0).round() / 100.0;
    let report = json!({
        "mode": "consume",
        "client": "wire (no client library)",
        "parameters": { "consumers": cli.producers, "partitions": cli.partitions,
                        "topic": cli.topic, "message_bytes": cli.message_size },
        "measured_s": seconds,
        "messages": records,
        "bytes": bytes,
        "batch_bytes": batch_bytes,
        "fetches": fetches,
        "throughput_msg_s": rate(records as f64),
        "throughput_mb_s": rate(bytes as f64 / 1e6),
    });
    println!(
        "kafka consume (wire): {} consumers, {} partitions: {records} records in {seconds:.2} s, \
         {} MB/s, {fetches} fetches",
        cli.producers, cli.partitions, report["throughput_mb_s"]
    );
    if let Some(path) = &cli.json {
        let text = serde_json::to_string_pretty(&report).expect("JSON");
        if let Err(error) = std::fs::write(path, text + "\n") {
            eprintln!("shoal-kafka-bench: {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if records == 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !(cli.duration > 0.0 && cli.warmup >= 0.0 && cli.duration + cli.warmup < 1e6) {
        eprintln!("shoal-kafka-bench: --duration must be positive and --warmup not negative");
        return ExitCode::from(2);
    }
    if cli.consume {
        return consume(&cli);
    }
    if cli.create_topic {
        let created = shoal_kafka_rdkafka::create_topic(
            &cli.bootstrap,
            &cli.topic,
            cli.partitions,
            &cli.durability,
            Duration::from_secs(10),
        );
        match created {
            Ok(true) => eprintln!("created topic {} ({} partitions)", cli.topic, cli.partitions),
            Ok(false) => eprintln!("topic {} exists", cli.topic),
            Err(error) => {
                eprintln!("shoal-kafka-bench: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    let window_start = Duration::from_secs_f64(cli.warmup).as_nanos() as u64;
    let window =
        window_start..window_start + Duration::from_secs_f64(cli.duration).as_nanos() as u64;
    let start = Instant::now();
    let results: Vec<Result<Tally, String>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..cli.producers)
            .map(|index| {
                let (cli, window) = (&cli, window.clone());
                scope.spawn(move || match cli.client {
                    Client::Librdkafka => produce(cli, index, start, window),
                    Client::Wire => produce_wire(cli, index, start, window),
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("producer thread")).collect()
    });
    let mut latency = histogram();
    let (mut messages, mut errors, mut first_error) = (0, 0, None);
    let (mut batch_bytes, mut batch_messages) = (Vec::new(), Vec::new());
    for result in results {
        let tally = match result {
            Ok(tally) => tally,
            Err(error) => {
                eprintln!("shoal-kafka-bench: {error}");
                return ExitCode::FAILURE;
            }
        };
        latency.add(&tally.latency).expect("same bounds");
        messages += tally.messages;
        errors += tally.errors;
        first_error = first_error.or(tally.first_error);
        batch_bytes.extend(tally.batch_bytes);
        batch_messages.extend(tally.batch_messages);
    }
    let seconds = cli.duration;
    let bytes = messages * cli.message_size as u64;
    let rate = |amount: f64| ((amount / seconds) * 100.0).round() / 100.0;
    let (_, version) = rdkafka::util::get_rdkafka_version();
    let (client, latency_kind) = match cli.client {
        Client::Librdkafka => {
            (format!("librdkafka {version}"), "send_to_delivery_report_per_message")
        }
        Client::Wire => ("wire (no client library)".to_string(), "send_to_response_per_batch"),
    };
    let report = json!({
        "mode": "produce",
        "client": client,
        "parameters": {
            "producers": cli.producers,
            "partitions": cli.partitions,
            "topic": cli.topic,
            "message_bytes": cli.message_size,
            "linger_ms": cli.linger_ms,
            "batch_size": cli.batch_size,
            "queue_kbytes": cli.queue_kbytes,
            "acks": "all",
            "enable_idempotence": true,
            "compression": "none",
            "duration_s": cli.duration,
            "warmup_s": cli.warmup,
        },
        "measured_s": seconds,
        "messages": messages,
        "bytes": bytes,
        "throughput_msg_s": rate(messages as f64),
        "throughput_mb_s": rate(bytes as f64 / 1e6),
        "latency_kind": latency_kind,
        "latency_us": latency_json(&latency),
        "batch_bytes_avg": mean(&batch_bytes),
        "batch_messages_avg": mean(&batch_messages),
        "errors": errors,
        "first_error": first_error,
    });
    let l = &report["latency_us"];
    println!(
        "kafka produce ({client}): {} producers, {} partitions, {} B messages, \
         linger {} ms, batch.size {} B: {} MB/s, {} msg/s, latency ({latency_kind}) p50 {} / p99 \
         {} / max {} µs, batches of {:.0} messages ({:.0} B) on average, {errors} errors",
        cli.producers,
        cli.partitions,
        cli.message_size,
        cli.linger_ms,
        cli.batch_size,
        report["throughput_mb_s"],
        report["throughput_msg_s"],
        l["p50"],
        l["p99"],
        l["max"],
        mean(&batch_messages).unwrap_or(0.0),
        mean(&batch_bytes).unwrap_or(0.0),
    );
    if let Some(path) = &cli.json {
        let text = serde_json::to_string_pretty(&report).expect("JSON");
        if let Err(error) = std::fs::write(path, text + "\n") {
            eprintln!("shoal-kafka-bench: {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if errors > 0 || messages == 0 {
        eprintln!(
            "shoal-kafka-bench: {errors} failed deliveries (first: {first_error:?}), {messages} measured"
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn producers_share_out_the_partitions() {
        assert_eq!(partitions_of(0, 2, 2), [0]);
        assert_eq!(partitions_of(1, 2, 2), [1]);
        assert_eq!(partitions_of(0, 2, 5), [0, 2, 4]);
        assert_eq!(partitions_of(1, 2, 5), [1, 3]);
        // Fewer partitions than producers: they share.
        assert_eq!(partitions_of(2, 3, 2), [0]);
        assert_eq!(partitions_of(0, 1, 3), [0, 1, 2]);
    }
}
