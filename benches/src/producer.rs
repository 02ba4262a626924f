//! One producer actor: a thread with its own io_uring runtime and connection, sending the same
//! prepared batch to its partition on the open-loop schedule with up to `in_flight_max` requests
//! outstanding, and recording each batch's produce→ack latency from its intended send time.
//!
//! It owns its connection, its histogram and its series; it shares only the live counters the
//! progress line reads. It builds its request body once and reuses it for every send.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use shoal_client::{Client, ClientConfig, ClientError};
use shoal_engine::protocol::{Operation, Partitioning, Produce, ProduceReply, Writer};

use crate::schedule::Schedule;
use crate::stats::{Latency, Series};

/// What one producer does.
#[derive(Clone, Debug)]
pub struct ProducerSpec {
    /// Actor index.
    pub actor: usize,
    /// Server addresses.
    pub seeds: Vec<String>,
    /// Target.
    pub stream: String,
    /// Target.
    pub topic: String,
    /// How the batches pick their partition.
    pub partitioning: Partitioning,
    /// The batch sent every time (a Kafka RecordBatch v2).
    pub batch: Arc<Vec<u8>>,
    /// Messages in the batch.
    pub messages_per_batch: u64,
    /// Payload bytes in the batch (values only).
    pub payload_bytes: u64,
    /// Requests outstanding at most.
    pub in_flight_max: usize,
    /// Open-loop interval between sends (`None`: unlimited).
    pub interval_ns: Option<u64>,
    /// Samples before this time (since the run's start) are warm-up: sent, not measured.
    pub warmup_ns: u64,
    /// Stop sending at this time since the start...
    pub stop_ns: u64,
    /// ...or after this many batches, whichever comes first.
    pub batches_max: u64,
    /// CPU to pin the thread to.
    pub cpu: Option<usize>,
    /// The run's common start.
    pub start: Instant,
    /// Live counters for the progress line.
    pub live: Arc<Live>,
}

/// Counters every actor adds to while running.
#[derive(Debug, Default)]
pub struct Live {
    /// Messages acknowledged.
    pub messages: AtomicU64,
    /// Payload bytes acknowledged.
    pub bytes: AtomicU64,
    /// The worst actor's p99 over its last whole second, in microseconds.
    pub p99_us: AtomicU64,
}

/// What one producer measured.
#[derive(Debug, Default)]
pub struct ProducerResult {
    /// Actor index.
    pub actor: usize,
    /// The partitions its acknowledgements named.
    pub partitions: Vec<u32>,
    /// Latency of measured sends (after warm-up).
    pub latency: Latency,
    /// Per-second series (whole run, warm-up included).
    pub series: Series,
    /// Measured messages and bytes (acknowledged, intended after warm-up).
    pub messages: u64,
    /// See `messages`.
    pub bytes: u64,
    /// Every message acknowledged, warm-up included (what the server stored from this actor).
    pub messages_total: u64,
    /// First and last measured acknowledgement, since the start.
    pub measured_from_ns: u64,
    /// See `measured_from_ns`.
    pub measured_to_ns: u64,
    /// Errors by kind.
    pub errors: BTreeMap<String, u64>,
}

/// Runs one producer to its end on the calling thread.
pub fn run(spec: ProducerSpec) -> Result<ProducerResult, String> {
    if let Some(cpu) = spec.cpu
        && !core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
    {
        return Err(format!("producer {}: cannot pin to CPU {cpu}", spec.actor));
    }
    let mut runtime = shoal_client::runtime().map_err(|e| format!("io_uring runtime: {e}"))?;
    runtime.block_on(produce(spec))
}

fn error_kind(error: &ClientError) -> String {
    match error.code() {
        Some(code) => format!("{code:?}"),
        None => match error {
            ClientError::Timeout => "Timeout".into(),
            ClientError::Closed => "Closed".into(),
            ClientError::Io(_) => "Io".into(),
            _ => "Protocol".into(),
        },
    }
}

async fn produce(spec: ProducerSpec) -> Result<ProducerResult, String> {
    let config = ClientConfig {
        in_flight_max: spec.in_flight_max,
        client_name: format!("shoal-bench/producer-{}", spec.actor),
        ..ClientConfig::with_seeds(spec.seeds.clone())
    };
    let mut client = Client::connect(config).await.map_err(|e| format!("connect: {e}"))?;
    let mut body = Vec::with_capacity(spec.batch.len() + 600);
    let request = Produce {
        stream: spec.stream.clone(),
        topic: spec.topic.clone(),
        partitioning: spec.partitioning.clone(),
    };
    let mut writer = Writer::new();
    request.encode_prefix(&mut writer);
    body.extend_from_slice(&writer.finish());
    let prefix_len = body.len();
    body.extend_from_slice(&spec.batch);
    let (prefix, batch) = body.split_at(prefix_len);

    let mut result = ProducerResult { actor: spec.actor, ..ProducerResult::default() };
    let mut schedule = Schedule::new(0, spec.interval_ns);
    let mut outstanding: VecDeque<(u64, u64)> = VecDeque::with_capacity(spec.in_flight_max);
    let mut second_latency = Latency::new();
    let mut second_index = 0;
    let now_ns = || spec.start.elapsed().as_nanos() as u64;
    loop {
        let now = now_ns();
        let sending = now < spec.stop_ns && schedule.sent() < spec.batches_max;
        if !sending && outstanding.is_empty() {
            break;
        }
        if sending && client.has_room() && schedule.is_due(now) {
            let intended = schedule.take(now);
            match client.submit(Operation::Produce, &[prefix, batch]).await {
                Ok(request) => outstanding.push_back((request, intended)),
                Err(error) => {
                    *result.errors.entry(error_kind(&error)).or_default() += 1;
                    // The connection is gone, and with it every outstanding request.
                    outstanding.clear();
                }
            }
            continue;
        }
        if outstanding.is_empty() {
            // Nothing to collect: wait for the next intended send.
            monoio::time::sleep(Duration::from_nanos(schedule.wait_ns(now))).await;
            continue;
        }
        let reply = client.receive().await;
        let done = now_ns();
        let Some((request, intended)) = outstanding.pop_front() else { continue };
        match reply {
            Ok(reply) if reply.request == request => match reply.result {
                Ok(body) => {
                    let Ok(produced) = ProduceReply::decode(&body) else {
                        *result.errors.entry("Protocol".into()).or_default() += 1;
                        continue;
                    };
                    let latency_us = (done - intended) / 1_000;
                    let messages = u64::from(produced.record_count);
                    result.messages_total += messages;
                    if !result.partitions.contains(&produced.partition) {
                        result.partitions.push(produced.partition);
                    }
                    result.series.record(done, messages, spec.payload_bytes, latency_us);
                    spec.live.messages.fetch_add(messages, Ordering::Relaxed);
                    spec.live.bytes.fetch_add(spec.payload_bytes, Ordering::Relaxed);
                    if intended >= spec.warmup_ns {
                        result.latency.record_us(latency_us);
                        result.messages += messages;
                        result.bytes += spec.payload_bytes;
                        if result.measured_from_ns == 0 {
                            result.measured_from_ns = intended;
                        }
                        result.measured_to_ns = done;
                    }
                    let index = done / 1_000_000_000;
                    if index != second_index {
                        let p99 = second_latency.summary().p99;
                        spec.live.p99_us.fetch_max(p99, Ordering::Relaxed);
                        second_latency = Latency::new();
                        second_index = index;
                    }
                    second_latency.record_us(latency_us);
                }
                Err(error) => *result.errors.entry(error_kind(&error)).or_default() += 1,
            },
            Ok(_) => *result.errors.entry("Protocol".into()).or_default() += 1,
            Err(error) => {
                *result.errors.entry(error_kind(&error)).or_default() += 1;
                outstanding.clear();
            }
        }
    }
    Ok(result)
}
