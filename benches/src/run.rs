//! A whole run of any mode (`produce`, `consume`, `e2e`): prepares the streams and topics,
//! builds the batch once, starts one pinned thread per producer and per consumer, shows a live
//! progress line on a terminal, and pools what the actors measured into one report.
//!
//! It owns the run's shape (which actor targets which partition, warm-up, end) and the report;
//! the actors own the measuring.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shoal_client::{
    BatchBuilder, Client, ClientConfig, CreateTopic, Durability, FetchFrom, Partitioning,
};

use crate::actor::Tally;
use crate::consumer::{self, ConsumerResult, ConsumerSpec};

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

/// Which shard an actor's connection lands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connect {
    /// The seed address: with several shards the kernel spreads connections over them
    /// (`SO_REUSEPORT`), and a request for another shard's partition is forwarded there.
    Any,
    /// The own listener of the shard that owns the actor's partition (pinned placement; the
    /// server needs `[network] shard_listen`), so nothing is forwarded.
    Owner,
}

/// What a run does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Producers only; the main latency is produce→ack per batch.
    Produce,
    /// Consumers only, reading what is stored; the main latency is the poll's.
    Consume,
    /// Producers and consumers at once; the main latency is end to end per message.
    EndToEnd,
    /// Producers and consumers at once in the ratio given by their counts; the main figures are
    /// the producers', the consumers' are reported beside them.
    Mixed,
}

/// Everything a run was asked for.
#[derive(Clone, Debug)]
pub struct Options {
    /// The mode.
    pub mode: Mode,
    /// Consumer actors (`consume`, `e2e`).
    pub consumers: usize,
    /// Where consumers start in the `consume` mode.
    pub from: FetchFrom,
    /// Consumers join this consumer group (per topic) and poll their share from its stored
    /// offsets, auto-committing, instead of each fetching one partition.
    pub group: Option<String>,
    /// Bytes per poll at most.
    pub fetch_bytes_max: u32,
    /// Messages per poll at most.
    pub fetch_count_max: u32,
    /// Server addresses.
    pub seeds: Vec<String>,
    /// Start a local server with this config instead.
    pub spawn_server: Option<PathBuf>,
    /// Start a local cluster of this many nodes for the run (`spawn_server` is then their
    /// config).
    pub spawn_cluster: Option<u8>,
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
    /// Where actors connect.
    pub connect: Connect,
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
    /// Size-based retention per partition of the topics created (None: the server's default).
    /// A run that writes more than the disk holds needs it: at 2 GB/s a 35 s run writes 70 GB.
    pub retention_bytes: Option<u64>,
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

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: Mode::Produce,
            consumers: 1,
            from: FetchFrom::First,
            group: None,
            fetch_bytes_max: 1 << 20,
            fetch_count_max: 10_000,
            seeds: vec!["127.0.0.1:7070".into()],
            spawn_server: None,
            spawn_cluster: None,
            producers: 1,
            streams: 1,
            topics: 1,
            partitions: 0,
            placement: Placement::Pinned,
            connect: Connect::Any,
            message_bytes: (1000, 1000),
            messages_per_batch: 1000,
            duration: Duration::from_secs(10),
            messages: 0,
            rate: None,
            durability: Durability::Replicated,
            retention_bytes: None,
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

fn stream_name(options: &Options, index: usize) -> String {
    format!("{}-{index}", options.stream_prefix)
}

fn topic_name(index: usize) -> String {
    format!("topic-{index}")
}

/// Runs the mode and returns the report.
pub fn run(options: &Options) -> Result<Value, String> {
    if options.messages_per_batch == 0 {
        return Err("messages per batch must be at least 1".into());
    }
    let producers = if options.mode == Mode::Consume { 0 } else { options.producers };
    let consumers = if options.mode == Mode::Produce { 0 } else { options.consumers };
    if producers + consumers == 0 {
        return Err("the run needs at least one producer or consumer".into());
    }
    let spawned = match (options.spawn_cluster, &options.spawn_server) {
        (Some(nodes), config) => Some(SpawnedServer::start_cluster(nodes, config.as_deref())?),
        (None, Some(config)) => Some(SpawnedServer::start(config)?),
        (None, None) => None,
    };
    let seeds = match &spawned {
        Some(server) => server.addresses.clone(),
        None => options.seeds.clone(),
    };
    let targets = options.streams.max(1) * options.topics.max(1);
    let producers_per_topic = producers.max(consumers).div_ceil(targets) as u32;
    let partitions =
        if options.partitions == 0 { producers_per_topic.max(1) } else { options.partitions };
    let server_status = prepare(&seeds, options, partitions)?;

    let (batch, payload_bytes) = build_batch(options.messages_per_batch, options.message_bytes);
    let interval_ns = options.rate.map(|rate| {
        rate.batch_interval_ns(producers.max(1), options.messages_per_batch, payload_bytes as usize)
    });
    let warmup_ns = options.warmup.as_nanos() as u64;
    let stop_ns = warmup_ns + options.duration.as_nanos() as u64;
    let batches_total = if options.messages == 0 {
        u64::MAX
    } else {
        options.messages.div_ceil(options.messages_per_batch as u64)
    };
    let plan = Plan {
        options,
        seeds,
        targets,
        partitions,
        producers,
        batch: Arc::new(batch),
        payload_bytes,
        interval_ns,
        warmup_ns,
        stop_ns,
        start: Instant::now(),
        live: Arc::new(Live::default()),
    };
    let mut cpus = Vec::new();
    let mut threads = Vec::new();
    for actor in 0..producers {
        let spec = plan.producer(actor, batches_total);
        cpus.push(spec.cpu);
        threads.push(std::thread::spawn(move || producer::run(spec).map(Actor::Producer)));
    }
    let messages_per_consumer = if options.messages == 0 {
        u64::MAX
    } else {
        options.messages.div_ceil(consumers.max(1) as u64)
    };
    for actor in 0..consumers {
        let spec = plan.consumer(actor, messages_per_consumer, &server_status);
        cpus.push(spec.cpu);
        threads.push(std::thread::spawn(move || consumer::run(spec).map(Actor::Consumer)));
    }
    let (live, start) = (&plan.live, plan.start);
    progress(options, live, start, &threads);
    let mut producer_results = Vec::new();
    let mut consumer_results = Vec::new();
    for thread in threads {
        match thread.join().map_err(|_| "an actor panicked".to_string())?? {
            Actor::Producer(result) => producer_results.push(result),
            Actor::Consumer(result) => consumer_results.push(result),
        }
    }
    let elapsed = start.elapsed();
    drop(spawned);
    let run = Finished {
        producers: producer_results,
        consumers: consumer_results,
        payload_bytes,
        partitions,
        cpus,
        elapsed,
    };
    Ok(report(options, &run, server_status))
}

/// What every actor of a run shares, and how each one's spec is drawn from it.
struct Plan<'a> {
    options: &'a Options,
    seeds: Vec<String>,
    /// Stream and topic pairs the actors spread over.
    targets: usize,
    partitions: u32,
    producers: usize,
    batch: Arc<Vec<u8>>,
    payload_bytes: u64,
    interval_ns: Option<u64>,
    warmup_ns: u64,
    stop_ns: u64,
    start: Instant,
    live: Arc<Live>,
}

impl Plan<'_> {
    /// The CPU the `index`th actor (producers first, then consumers) is pinned to, if any.
    fn cpu(&self, index: usize) -> Option<usize> {
        let cpus = &self.options.cpus;
        (!cpus.is_empty()).then(|| cpus[index % cpus.len()])
    }

    /// Producer `actor`'s spec: its topic, partitioning and share of `batches_total`.
    fn producer(&self, actor: usize, batches_total: u64) -> ProducerSpec {
        let options = self.options;
        let (targets, producers) = (self.targets, self.producers);
        let target = actor % targets;
        let partitioning = match options.placement {
            Placement::Pinned => Partitioning::Explicit((actor / targets) as u32 % self.partitions),
            Placement::Balanced => Partitioning::Balanced,
            Placement::Keyed => Partitioning::Key(format!("producer-{actor}").into_bytes()),
        };
        let batches_max = batches_total / producers as u64
            + u64::from((actor as u64) < batches_total % producers as u64);
        ProducerSpec {
            actor,
            seeds: self.seeds.clone(),
            stream: stream_name(options, target % options.streams.max(1)),
            topic: topic_name(target / options.streams.max(1)),
            partitioning,
            batch: Arc::clone(&self.batch),
            messages_per_batch: options.messages_per_batch as u64,
            payload_bytes: self.payload_bytes,
            in_flight_max: options.in_flight_max.max(1),
            interval_ns: self.interval_ns,
            warmup_ns: self.warmup_ns,
            stop_ns: self.stop_ns,
            batches_max,
            cpu: self.cpu(actor),
            start: self.start,
            live: Arc::clone(&self.live),
            stamp: options.mode == Mode::EndToEnd,
            connect_to_owner: options.connect == Connect::Owner,
        }
    }

    /// Consumer `actor`'s spec: its partition, where it starts and when it stops.
    fn consumer(&self, actor: usize, messages_max: u64, server_status: &Value) -> ConsumerSpec {
        let options = self.options;
        let target = actor % self.targets;
        let stream = stream_name(options, target % options.streams.max(1));
        let topic = topic_name(target / options.streams.max(1));
        let partition = (actor / self.targets) as u32 % self.partitions;
        // In `e2e` and `mixed`, consumers start at the end the partition had before the run, so
        // that they read what this run's producers send.
        let from = match options.mode {
            Mode::EndToEnd | Mode::Mixed => {
                FetchFrom::Offset(next_offset(server_status, &stream, &topic, partition))
            }
            _ => options.from,
        };
        ConsumerSpec {
            actor,
            seeds: self.seeds.clone(),
            stream,
            topic,
            partition,
            group: options.group.clone(),
            from,
            fetch_bytes_max: options.fetch_bytes_max,
            fetch_count_max: options.fetch_count_max,
            end_to_end: options.mode == Mode::EndToEnd,
            warmup_ns: self.warmup_ns,
            // Consumers of an `e2e` run drain what the producers sent in their last moments.
            stop_ns: match options.mode {
                Mode::EndToEnd | Mode::Mixed => self.stop_ns + 1_000_000_000,
                Mode::Produce | Mode::Consume => self.stop_ns,
            },
            messages_max,
            cpu: self.cpu(self.producers + actor),
            start: self.start,
            live: Arc::clone(&self.live),
            connect_to_owner: options.connect == Connect::Owner,
        }
    }
}

/// What an actor thread returns.
enum Actor {
    Producer(ProducerResult),
    Consumer(ConsumerResult),
}

/// Everything the actors of a run measured.
struct Finished {
    producers: Vec<ProducerResult>,
    consumers: Vec<ConsumerResult>,
    payload_bytes: u64,
    partitions: u32,
    cpus: Vec<Option<usize>>,
    elapsed: Duration,
}

/// A partition's log end offset in a status report (0 when absent).
fn next_offset(status: &Value, stream: &str, topic: &str, partition: u32) -> u64 {
    status["partitions"]
        .as_array()
        .and_then(|all| {
            all.iter().find(|p| {
                p["stream"] == stream && p["topic"] == topic && p["partition"] == partition
            })
        })
        .and_then(|p| p["next_offset"].as_u64())
        .unwrap_or(0)
}

/// Creates the streams and topics (existing ones are reused) and returns the server's status.
fn prepare(seeds: &[String], options: &Options, partitions: u32) -> Result<Value, String> {
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
                    retention_bytes: options.retention_bytes,
                    ..CreateTopic::default()
                };
                match client.create_topic(&create).await {
                    Ok(()) => {}
                    Err(e) if e.code() == Some(shoal_client::ErrorCode::TopicExists) => {}
                    Err(e) => return Err(format!("creating topic {name}/{}: {e}", create.topic)),
                }
            }
        }
        wait_topics_known(&client.nodes(), options).await?;
        let status = client.status().await.map_err(|e| format!("status: {e}"))?;
        serde_json::from_str(&status).map_err(|e| format!("status JSON: {e}"))
    })
}

/// How long every node of a cluster may take to learn the topics the setup created.
const TOPICS_KNOWN_TIME_MAX: Duration = Duration::from_secs(10);

/// Waits until every node of a cluster that is up knows every topic the run uses: a node learns a new
/// topic when its metadata replica hears of the commit, and an actor that started first would
/// count `TopicNotFound` errors against the run (errors a Kafka client would retry). Each node's
/// own status report says what it knows (a topic description comes from the metadata primary).
async fn wait_topics_known(nodes: &[String], options: &Options) -> Result<(), String> {
    if nodes.len() <= 1 {
        return Ok(());
    }
    let deadline = Instant::now() + TOPICS_KNOWN_TIME_MAX;
    for node in nodes {
        let config = ClientConfig {
            client_name: "shoal-bench/setup".into(),
            ..ClientConfig::with_seeds(vec![node.clone()])
        };
        // A node that is down is skipped: it learns the topics when it is back, and no actor
        // is sent to a node that is down (none leads a partition).
        let Ok(mut client) = Client::connect(config).await else { continue };
        loop {
            let status = client.status().await.map_err(|e| format!("{node}: status: {e}"))?;
            let status: Value =
                serde_json::from_str(&status).map_err(|e| format!("status JSON: {e}"))?;
            let knows = |stream: &str, topic: &str| {
                status["partitions"].as_array().is_some_and(|all| {
                    all.iter().any(|p| p["stream"] == stream && p["topic"] == topic)
                })
            };
            let missing = (0..options.streams.max(1))
                .flat_map(|s| (0..options.topics.max(1)).map(move |t| (s, t)))
                .map(|(s, t)| (stream_name(options, s), topic_name(t)))
                .find(|(stream, topic)| !knows(stream, topic));
            let Some((stream, topic)) = missing else { break };
            if Instant::now() >= deadline {
                return Err(format!("{node} never learned {stream}/{topic}"));
            }
            monoio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// Prints the live progress line once a second on a terminal, until every actor is done.
fn progress(
    options: &Options,
    live: &Live,
    start: Instant,
    threads: &[std::thread::JoinHandle<Result<Actor, String>>],
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

/// Pooled figures of one side (producers or consumers).
#[derive(Default)]
struct Side {
    latency: Latency,
    series: Series,
    tally: Tally,
    actors: Vec<Value>,
}

impl Side {
    /// Adds one actor: its figures to the pool, its own line to `actors`.
    fn add(&mut self, series: &Series, tally: &Tally, mut line: Value) {
        self.series.merge(series);
        self.tally.merge(tally);
        if let (Some(line), Value::Object(throughput)) =
            (line.as_object_mut(), tally.throughput_json())
        {
            line.extend(throughput);
            line.insert("errors".into(), json!(tally.errors));
        }
        self.actors.push(line);
    }
}

fn report(options: &Options, run: &Finished, server_status: Value) -> Value {
    let mut produced = Side::default();
    for result in &run.producers {
        produced.latency.merge(&result.latency);
        let line = json!({
            "actor": result.actor,
            "role": "producer",
            "partitions": result.partitions,
            "on_owner_shard": result.on_owner,
            "latency_us": result.latency.summary().to_json(),
            "write_stall_ms": result.stall_ns as f64 / 1e6,
            "write_stall_end_s": result.stall_end_ns as f64 / 1e9,
        });
        produced.add(&result.series, &result.tally, line);
    }
    let mut consumed = Side::default();
    let mut end_to_end = Latency::new();
    for result in &run.consumers {
        consumed.latency.merge(&result.poll_latency);
        end_to_end.merge(&result.end_to_end);
        let line = json!({
            "actor": result.actor,
            "role": "consumer",
            "partitions": [result.partition],
            "on_owner_shard": result.on_owner,
            "poll_latency_us": result.poll_latency.summary().to_json(),
            "end_to_end_latency_us": result.end_to_end.summary().to_json(),
        });
        consumed.add(&result.series, &result.tally, line);
    }
    let mut both = produced.tally.clone();
    both.merge(&consumed.tally);
    let (main, main_latency, latency_kind, mode) = match options.mode {
        Mode::Produce => (&produced, &produced.latency, "produce_to_ack_per_batch", "produce"),
        Mode::Consume => (&consumed, &consumed.latency, "poll", "consume"),
        Mode::EndToEnd => (&consumed, &end_to_end, "end_to_end_per_message", "e2e"),
        Mode::Mixed => (&produced, &produced.latency, "produce_to_ack_per_batch", "mixed"),
    };
    let mut server = server_status;
    if let Some(object) = server.as_object_mut() {
        object.remove("partitions");
    }
    let main_throughput = main.tally.throughput_json();
    let actors: Vec<Value> = produced.actors.iter().chain(&consumed.actors).cloned().collect();
    json!({
        "mode": mode,
        "parameters": {
            "seeds": options.seeds,
            "spawned_server": options.spawn_server.as_ref().map(|p| p.display().to_string()),
            "spawned_cluster_nodes": options.spawn_cluster,
            "producers": run.producers.len(),
            "consumers": run.consumers.len(),
            "streams": options.streams,
            "topics": options.topics,
            "partitions": run.partitions,
            "placement": format!("{:?}", options.placement).to_lowercase(),
            "connect": format!("{:?}", options.connect).to_lowercase(),
            "connections_on_owner_shard": run
                .producers
                .iter()
                .map(|p| p.on_owner)
                .chain(run.consumers.iter().map(|c| c.on_owner))
                .filter(|on| *on == Some(true))
                .count(),
            "message_bytes_min": options.message_bytes.0,
            "message_bytes_max": options.message_bytes.1,
            "messages_per_batch": options.messages_per_batch,
            "batch_payload_bytes": run.payload_bytes,
            "duration_s": options.duration.as_secs_f64(),
            "messages_limit": options.messages,
            "rate": options.rate.map(|r| format!("{r:?}")),
            "durability": options.durability.as_str(),
            "in_flight_max": options.in_flight_max,
            "warmup_s": options.warmup.as_secs_f64(),
            "fetch_bytes_max": options.fetch_bytes_max,
            "fetch_count_max": options.fetch_count_max,
        },
        "environment": crate::environment::describe(&run.cpus),
        "server": server,
        "elapsed_s": run.elapsed.as_secs_f64(),
        "measured_s": main.tally.seconds(),
        "messages": main.tally.messages,
        "messages_acked_total": produced.tally.messages_total,
        "messages_consumed_total": consumed.tally.messages_total,
        "bytes": main.tally.bytes,
        "throughput_msg_s": main_throughput["throughput_msg_s"],
        "throughput_mb_s": main_throughput["throughput_mb_s"],
        "latency_kind": latency_kind,
        "latency_us": main_latency.summary().to_json(),
        "latency_distribution_us": main_latency.distribution(),
        "produce_latency_us": produced.latency.summary().to_json(),
        "poll_latency_us": consumed.latency.summary().to_json(),
        "end_to_end_latency_us": end_to_end.summary().to_json(),
        "produced": produced.tally.throughput_json(),
        "consumed": consumed.tally.throughput_json(),
        "actors": actors,
        "time_series": main.series.to_json(),
        "errors": both.errors,
        "retries": 0,
        "write_stall_ms": run.producers.iter().map(|p| p.stall_ns).max().unwrap_or(0) as f64 / 1e6,
    })
}

/// The human summary of a report.
pub fn summary_text(report: &Value) -> String {
    let latency = &report["latency_us"];
    let mut text = String::new();
    let p = &report["parameters"];
    text.push_str(&format!(
        "{}: {} producers, {} consumers, {} × {}–{} B messages per batch, {}, in flight {}\n",
        report["mode"].as_str().unwrap_or("?"),
        p["producers"],
        p["consumers"],
        p["messages_per_batch"],
        p["message_bytes_min"],
        p["message_bytes_max"],
        p["durability"].as_str().unwrap_or("?"),
        p["in_flight_max"]
    ));
    text.push_str(&format!(
        "throughput: {:.1} MB/s, {:.0} msg/s over {:.1} s ({} measured; {} acknowledged, {} consumed in all)\n",
        report["throughput_mb_s"].as_f64().unwrap_or(0.0),
        report["throughput_msg_s"].as_f64().unwrap_or(0.0),
        report["measured_s"].as_f64().unwrap_or(0.0),
        report["messages"],
        report["messages_acked_total"],
        report["messages_consumed_total"],
    ));
    text.push_str(&format!("latency ({}, µs):\n", report["latency_kind"].as_str().unwrap_or("?")));
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
    if let Some(stall) = report["write_stall_ms"].as_f64()
        && report["parameters"]["producers"].as_u64().unwrap_or(0) > 0
    {
        text.push_str(&format!(
            "write stall (longest gap between a producer's acknowledgements): {stall:.1} ms\n"
        ));
    }
    if let Some(errors) = report["errors"].as_object()
        && !errors.is_empty()
    {
        text.push_str(&format!("errors: {}\n", report["errors"]));
    }
    text
}
