//! The `produce` mode end to end: prepares the streams and topics, builds the batch once, starts
//! one pinned thread per producer, shows a live progress line on a terminal, and pools what the
//! actors measured into one report.
//!
//! It owns the run's shape (which actor targets which partition, warm-up, end) and the report;
//! the actors own the measuring.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shoal_client::{BatchBuilder, Client, ClientConfig, CreateTopic, Durability, Partitioning};

use crate::producer::{self, Live, ProducerResult, ProducerSpec};
use crate::schedule::Rate;
use crate::server::SpawnedServer;
use crate::stats::{Latency, Series};

/// How producers pick partitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Each producer on its own partition.
    Pinned,
    /// The server balances each producer's batches.
    Balanced,
    /// Kafka's key partitioner, one key per producer.
    Keyed,
}

/// Everything `shoal-bench produce` was asked for.
#[derive(Clone, Debug)]
pub struct ProduceOptions {
    /// Server addresses.
    pub seeds: Vec<String>,
    /// Start a local server with this config instead.
    pub spawn_server: Option<PathBuf>,
    /// Producer actors.
    pub producers: usize,
    /// Streams the producers spread over.
    pub streams: usize,
    /// Topics per stream.
    pub topics: usize,
    /// Partitions per topic (0: as many as the producers on it).
    pub partitions: u32,
    /// Partition choice.
    pub placement: Placement,
    /// Message size range in bytes (inclusive).
    pub message_bytes: (usize, usize),
    /// Messages per batch.
    pub messages_per_batch: usize,
    /// Measured duration after warm-up (unless `messages` ends the run first).
    pub duration: Duration,
    /// Total messages to send over all producers (0: no limit).
    pub messages: u64,
    /// Open-loop rate limit.
    pub rate: Option<Rate>,
    /// Durability of the topics created.
    pub durability: Durability,
    /// Batches in flight per producer.
    pub in_flight_max: usize,
    /// Warm-up before measuring.
    pub warmup: Duration,
    /// CPU of each producer thread (empty: not pinned).
    pub cpus: Vec<usize>,
    /// Stream name prefix.
    pub stream_prefix: String,
    /// Print the progress line even when stderr is not a terminal (never: false).
    pub progress: bool,
}

impl Default for ProduceOptions {
    fn default() -> Self {
        ProduceOptions {
            seeds: vec!["127.0.0.1:7070".into()],
            spawn_server: None,
            producers: 1,
            streams: 1,
            topics: 1,
            partitions: 0,
            placement: Placement::Pinned,
            message_bytes: (1000, 1000),
            messages_per_batch: 1000,
            duration: Duration::from_secs(10),
            messages: 0,
            rate: None,
            durability: Durability::Replicated,
            in_flight_max: 8,
            warmup: Duration::from_secs(1),
            cpus: Vec::new(),
            stream_prefix: "bench".into(),
            progress: true,
        }
    }
}

/// The batch every producer sends: `messages` records whose sizes step through the range
/// deterministically; returns the batch and its payload bytes.
fn build_batch(messages: usize, (low, high): (usize, usize)) -> (Vec<u8>, u64) {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut builder = BatchBuilder::new(now_ms);
    let mut payload = 0;
    let value = vec![b'x'; high.max(1)];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..messages {
        let size = if high > low {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            low + (state % (high - low + 1) as u64) as usize
        } else {
            low
        };
        builder.push(now_ms, None, Some(&value[..size]), &[]);
        payload += size as u64;
    }
    (builder.build().to_vec(), payload)
}

fn stream_name(options: &ProduceOptions, index: usize) -> String {
    format!("{}-{index}", options.stream_prefix)
}

fn topic_name(index: usize) -> String {
    format!("topic-{index}")
}

/// Runs `produce` and returns the report.
pub fn produce(options: &ProduceOptions) -> Result<Value, String> {
    if options.producers == 0 || options.messages_per_batch == 0 {
        return Err("producers and messages per batch must be at least 1".into());
    }
    let spawned = match &options.spawn_server {
        Some(config) => Some(SpawnedServer::start(config)?),
        None => None,
    };
    let seeds = match &spawned {
        Some(server) => vec![server.address.clone()],
        None => options.seeds.clone(),
    };
    let targets = options.streams.max(1) * options.topics.max(1);
    let producers_per_topic = options.producers.div_ceil(targets) as u32;
    let partitions =
        if options.partitions == 0 { producers_per_topic.max(1) } else { options.partitions };
    let server_status = prepare(&seeds, options, partitions)?;

    let (batch, payload_bytes) = build_batch(options.messages_per_batch, options.message_bytes);
    let batch = Arc::new(batch);
    let interval_ns = options.rate.map(|rate| {
        rate.batch_interval_ns(
            options.producers,
            options.messages_per_batch,
            payload_bytes as usize,
        )
    });
    let warmup_ns = options.warmup.as_nanos() as u64;
    let stop_ns = warmup_ns + options.duration.as_nanos() as u64;
    let batches_total = if options.messages == 0 {
        u64::MAX
    } else {
        options.messages.div_ceil(options.messages_per_batch as u64)
    };
    let live = Arc::new(Live::default());
    let start = Instant::now();
    let mut cpus = Vec::new();
    let mut threads = Vec::new();
    for actor in 0..options.producers {
        let target = actor % targets;
        let partitioning = match options.placement {
            Placement::Pinned => Partitioning::Explicit((actor / targets) as u32 % partitions),
            Placement::Balanced => Partitioning::Balanced,
            Placement::Keyed => Partitioning::Key(format!("producer-{actor}").into_bytes()),
        };
        let cpu = (!options.cpus.is_empty()).then(|| options.cpus[actor % options.cpus.len()]);
        cpus.push(cpu);
        let batches_max = batches_total / options.producers as u64
            + u64::from((actor as u64) < batches_total % options.producers as u64);
        let spec = ProducerSpec {
            actor,
            seeds: seeds.clone(),
            stream: stream_name(options, target % options.streams.max(1)),
            topic: topic_name(target / options.streams.max(1)),
            partitioning,
            batch: Arc::clone(&batch),
            messages_per_batch: options.messages_per_batch as u64,
            payload_bytes,
            in_flight_max: options.in_flight_max.max(1),
            interval_ns,
            warmup_ns,
            stop_ns,
            batches_max,
            cpu,
            start,
            live: Arc::clone(&live),
        };
        threads.push(std::thread::spawn(move || producer::run(spec)));
    }
    progress(options, &live, start, &threads);
    let mut results = Vec::new();
    for thread in threads {
        results.push(thread.join().map_err(|_| "a producer panicked".to_string())??);
    }
    let elapsed = start.elapsed();
    drop(spawned);
    Ok(report(options, &results, payload_bytes, partitions, &cpus, server_status, elapsed))
}

/// Creates the streams and topics (existing ones are reused) and returns the server's status.
fn prepare(seeds: &[String], options: &ProduceOptions, partitions: u32) -> Result<Value, String> {
    let mut runtime = shoal_client::runtime().map_err(|e| format!("io_uring runtime: {e}"))?;
    runtime.block_on(async {
        let config = ClientConfig {
            client_name: "shoal-bench/setup".into(),
            ..ClientConfig::with_seeds(seeds.to_vec())
        };
        let mut client = Client::connect(config).await.map_err(|e| format!("connect: {e}"))?;
        for stream in 0..options.streams.max(1) {
            let name = stream_name(options, stream);
            match client.create_stream(&name).await {
                Ok(()) => {}
                Err(e) if e.code() == Some(shoal_client::ErrorCode::StreamExists) => {}
                Err(e) => return Err(format!("creating stream {name}: {e}")),
            }
            for topic in 0..options.topics.max(1) {
                let create = CreateTopic {
                    stream: name.clone(),
                    topic: topic_name(topic),
                    partitions,
                    durability: Some(options.durability),
                    ..CreateTopic::default()
                };
                match client.create_topic(&create).await {
                    Ok(()) => {}
                    Err(e) if e.code() == Some(shoal_client::ErrorCode::TopicExists) => {}
                    Err(e) => return Err(format!("creating topic {name}/{}: {e}", create.topic)),
                }
            }
        }
        let status = client.status().await.map_err(|e| format!("status: {e}"))?;
        serde_json::from_str(&status).map_err(|e| format!("status JSON: {e}"))
    })
}

/// Prints the live progress line once a second on a terminal, until every actor is done.
fn progress(
    options: &ProduceOptions,
    live: &Live,
    start: Instant,
    threads: &[std::thread::JoinHandle<Result<ProducerResult, String>>],
) {
    let terminal = options.progress && std::io::stderr().is_terminal();
    let mut last = (0u64, 0u64, start);
    while !threads.iter().all(|t| t.is_finished()) {
        std::thread::sleep(Duration::from_millis(100));
        let now = Instant::now();
        if !terminal || now.duration_since(last.2) < Duration::from_secs(1) {
            continue;
        }
        let messages = live.messages.load(Ordering::Relaxed);
        let bytes = live.bytes.load(Ordering::Relaxed);
        let seconds = now.duration_since(last.2).as_secs_f64();
        let p99 = live.p99_us.swap(0, Ordering::Relaxed);
        eprint!(
            "\r{:>5.1}s  {:>9.1} MB/s  {:>11.0} msg/s  p99 {:>8} µs   ",
            now.duration_since(start).as_secs_f64(),
            (bytes - last.1) as f64 / 1e6 / seconds,
            (messages - last.0) as f64 / seconds,
            p99
        );
        let _ = std::io::stderr().flush();
        last = (messages, bytes, now);
    }
    if terminal {
        eprintln!();
    }
}

fn report(
    options: &ProduceOptions,
    results: &[ProducerResult],
    payload_bytes: u64,
    partitions: u32,
    cpus: &[Option<usize>],
    server_status: Value,
    elapsed: Duration,
) -> Value {
    let mut latency = Latency::new();
    let mut series = Series::default();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let (mut messages, mut bytes, mut messages_total) = (0u64, 0u64, 0u64);
    let (mut from, mut to) = (u64::MAX, 0u64);
    let mut actors = Vec::new();
    for result in results {
        latency.merge(&result.latency);
        series.merge(&result.series);
        for (kind, count) in &result.errors {
            *errors.entry(kind.clone()).or_default() += count;
        }
        messages += result.messages;
        bytes += result.bytes;
        messages_total += result.messages_total;
        if result.messages > 0 {
            from = from.min(result.measured_from_ns);
            to = to.max(result.measured_to_ns);
        }
        let window = (result.measured_to_ns.saturating_sub(result.measured_from_ns)) as f64 / 1e9;
        actors.push(json!({
            "actor": result.actor,
            "partitions": result.partitions,
            "messages": result.messages,
            "throughput_msg_s": rate(result.messages as f64, window),
            "throughput_mb_s": rate(result.bytes as f64 / 1e6, window),
            "latency_us": result.latency.summary().to_json(),
            "errors": result.errors,
        }));
    }
    let window = if to > from { (to - from) as f64 / 1e9 } else { 0.0 };
    let summary = latency.summary();
    let mut server = server_status;
    if let Some(object) = server.as_object_mut() {
        object.remove("partitions");
    }
    json!({
        "mode": "produce",
        "parameters": {
            "seeds": options.seeds,
            "spawned_server": options.spawn_server.as_ref().map(|p| p.display().to_string()),
            "producers": options.producers,
            "streams": options.streams,
            "topics": options.topics,
            "partitions": partitions,
            "placement": format!("{:?}", options.placement).to_lowercase(),
            "message_bytes_min": options.message_bytes.0,
            "message_bytes_max": options.message_bytes.1,
            "messages_per_batch": options.messages_per_batch,
            "batch_payload_bytes": payload_bytes,
            "duration_s": options.duration.as_secs_f64(),
            "messages_limit": options.messages,
            "rate": options.rate.map(|r| format!("{r:?}")),
            "durability": match options.durability {
                Durability::Replicated => "replicated",
                Durability::Persisted => "persisted",
            },
            "in_flight_max": options.in_flight_max,
            "warmup_s": options.warmup.as_secs_f64(),
        },
        "environment": crate::environment::describe(cpus),
        "server": server,
        "elapsed_s": elapsed.as_secs_f64(),
        "measured_s": window,
        "messages": messages,
        "messages_acked_total": messages_total,
        "bytes": bytes,
        "throughput_msg_s": rate(messages as f64, window),
        "throughput_mb_s": rate(bytes as f64 / 1e6, window),
        "latency_kind": "produce_to_ack_per_batch",
        "latency_us": summary.to_json(),
        "latency_distribution_us": latency.distribution(),
        "actors": actors,
        "time_series": series.to_json(),
        "errors": errors,
        "retries": 0,
    })
}

fn rate(amount: f64, seconds: f64) -> f64 {
    if seconds > 0.0 { ((amount / seconds) * 100.0).round() / 100.0 } else { 0.0 }
}

/// The human summary of a report.
pub fn summary_text(report: &Value) -> String {
    let latency = &report["latency_us"];
    let mut text = String::new();
    let p = &report["parameters"];
    text.push_str(&format!(
        "produce: {} producers, {} × {}–{} B messages per batch, {}, in flight {}\n",
        p["producers"],
        p["messages_per_batch"],
        p["message_bytes_min"],
        p["message_bytes_max"],
        p["durability"].as_str().unwrap_or("?"),
        p["in_flight_max"]
    ));
    text.push_str(&format!(
        "throughput: {:.1} MB/s, {:.0} msg/s over {:.1} s ({} messages measured, {} acknowledged in all)\n",
        report["throughput_mb_s"].as_f64().unwrap_or(0.0),
        report["throughput_msg_s"].as_f64().unwrap_or(0.0),
        report["measured_s"].as_f64().unwrap_or(0.0),
        report["messages"],
        report["messages_acked_total"],
    ));
    text.push_str("latency (produce→ack per batch, µs):\n");
    text.push_str("  p50      p90      p95      p99      p99.9    p99.99   max      mean     stdev    samples\n");
    let cell = |key: &str| format!("{:<9}", latency[key].to_string());
    text.push_str(&format!(
        "  {}{}{}{}{}{}{}{}{}{}\n",
        cell("p50"),
        cell("p90"),
        cell("p95"),
        cell("p99"),
        cell("p999"),
        cell("p9999"),
        cell("max"),
        cell("mean"),
        cell("stdev"),
        latency["count"]
    ));
    if let Some(errors) = report["errors"].as_object()
        && !errors.is_empty()
    {
        text.push_str(&format!("errors: {}\n", report["errors"]));
    }
    text
}
