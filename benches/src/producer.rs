//! One producer actor: a thread with its own io_uring runtime and connection, sending the same
//! prepared batch to its partition on the open-loop schedule with up to `in_flight_max` requests
//! outstanding, and recording each batch's produce→ack latency from its intended send time.
//!
//! It owns its connection, its histogram and its series; it shares only the live counters the
//! progress line reads. It builds its request body once and reuses it for every send.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use shoal_client::{Client, ClientConfig, ClientError};
use shoal_engine::protocol::{Operation, Partitioning, Produce, ProduceReply, Writer};

use crate::actor::{Tally, run_pinned};
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
    /// Stamp every message with its send time (the `e2e` mode).
    pub stamp: bool,
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
    /// Messages acknowledged (measured: intended after warm-up; in all: what the server stored
    /// from this actor), the window from the first measured send to the last acknowledgement,
    /// errors.
    pub tally: Tally,
}

/// Runs one producer to its end on the calling thread.
pub fn run(spec: ProducerSpec) -> Result<ProducerResult, String> {
    let (actor, cpu) = (spec.actor, spec.cpu);
    run_pinned(cpu, produce(spec)).map_err(|e| format!("producer {actor}: {e}"))
}

/// Nanoseconds since the Unix epoch (the one clock producers and consumers share for the
/// end-to-end latency; both run on this machine).
pub fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Where in a Kafka v2 batch the CRC-32C sits and where the bytes it covers start.
const BATCH_CRC_POS: usize = 17;
const BATCH_ATTRIBUTES_POS: usize = 21;

/// The positions of every message value of `batch` that can hold an 8-byte stamp.
pub fn stamp_positions(batch: &[u8]) -> Result<Vec<usize>, String> {
    let records = shoal_engine::batch::records(batch).map_err(|e| format!("batch: {e}"))?;
    let mut positions = Vec::new();
    for record in records {
        let record = record.map_err(|e| format!("batch: {e}"))?;
        let value = record.value.unwrap_or_default();
        if value.len() < 8 {
            return Err("end-to-end latency needs messages of at least 8 bytes".into());
        }
        positions.push(value.as_ptr() as usize - batch.as_ptr() as usize);
    }
    Ok(positions)
}

/// Writes the send time into every message of `batch` and reseals its CRC.
fn stamp(batch: &mut [u8], positions: &[usize], now_wall_ns: u64) {
    for &position in positions {
        batch[position..position + 8].copy_from_slice(&now_wall_ns.to_le_bytes());
    }
    let crc = crc32c::crc32c(&batch[BATCH_ATTRIBUTES_POS..]);
    batch[BATCH_CRC_POS..BATCH_CRC_POS + 4].copy_from_slice(&crc.to_be_bytes());
}

/// An error's kind, as the report counts it.
pub fn error_kind(error: &ClientError) -> String {
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
    let positions = if spec.stamp { stamp_positions(&spec.batch)? } else { Vec::new() };

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
            if spec.stamp {
                stamp(&mut body[prefix_len..], &positions, wall_ns());
            }
            let (prefix, batch) = body.split_at(prefix_len);
            match client.submit(Operation::Produce, &[prefix, batch]).await {
                Ok(request) => outstanding.push_back((request, intended)),
                Err(error) => {
                    result.tally.error(error_kind(&error));
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
                        result.tally.error("Protocol");
                        continue;
                    };
                    let latency_us = (done - intended) / 1_000;
                    let messages = u64::from(produced.record_count);
                    result.tally.moved(messages);
                    if !result.partitions.contains(&produced.partition) {
                        result.partitions.push(produced.partition);
                    }
                    result.series.record(done, messages, spec.payload_bytes, latency_us);
                    spec.live.messages.fetch_add(messages, Ordering::Relaxed);
                    spec.live.bytes.fetch_add(spec.payload_bytes, Ordering::Relaxed);
                    if intended >= spec.warmup_ns {
                        result.latency.record_us(latency_us);
                        result.tally.measured(intended, done, messages, spec.payload_bytes);
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
                Err(error) => result.tally.error(error_kind(&error)),
            },
            Ok(_) => result.tally.error("Protocol"),
            Err(error) => {
                result.tally.error(error_kind(&error));
                outstanding.clear();
            }
        }
    }
    Ok(result)
}
