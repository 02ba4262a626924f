//! One consumer actor: a thread with its own io_uring runtime and connection, fetching one
//! partition from a start position, recording each poll's latency (request → reply) and, in the
//! `e2e` mode, each message's end-to-end latency (consumed − produced, from the wall-clock send
//! time the producer stamped into the first 8 bytes of every message).
//!
//! It owns its connection, histograms and series; it shares only the live counters.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use shoal_client::{ClientConfig, ClientError, Fetch, FetchFrom};

use crate::actor::{Tally, Target, connect, run_pinned};
use crate::producer::{Live, error_kind, wall_ns};
use crate::stats::{Latency, Series};

/// Pause before polling again after the connection failed.
const RETRY_PAUSE: Duration = Duration::from_millis(1);
/// Longest one fetch waits at the end of the partition for new data (long-poll): the server
/// answers as soon as a write commits, so this only bounds an idle poll.
const WAIT_MS_MAX: u64 = 500;

/// What one consumer does.
#[derive(Clone, Debug)]
pub struct ConsumerSpec {
    /// Actor index.
    pub actor: usize,
    /// Server addresses.
    pub seeds: Vec<String>,
    /// Source.
    pub stream: String,
    /// Source.
    pub topic: String,
    /// Source.
    pub partition: u32,
    /// Where to start.
    pub from: FetchFrom,
    /// Bytes per poll at most.
    pub fetch_bytes_max: u32,
    /// Messages per poll at most (whole batches).
    pub fetch_count_max: u32,
    /// Read the producers' send stamps (the `e2e` mode).
    pub end_to_end: bool,
    /// Samples before this time are warm-up.
    pub warmup_ns: u64,
    /// Stop at this time since the start...
    pub stop_ns: u64,
    /// ...or after this many messages, whichever comes first.
    pub messages_max: u64,
    /// CPU to pin the thread to.
    pub cpu: Option<usize>,
    /// The run's common start.
    pub start: Instant,
    /// Live counters for the progress line.
    pub live: Arc<Live>,
    /// Connect to the shard that owns the partition (`--connect owner`).
    pub connect_to_owner: bool,
}

/// What one consumer measured.
#[derive(Debug, Default)]
pub struct ConsumerResult {
    /// Actor index.
    pub actor: usize,
    /// Its partition.
    pub partition: u32,
    /// Whether its connection was served by the shard owning its partition (`None`: the server
    /// names no shards).
    pub on_owner: Option<bool>,
    /// Poll latency of measured polls that returned data.
    pub poll_latency: Latency,
    /// End-to-end latency of measured batches (`e2e` mode).
    pub end_to_end: Latency,
    /// Per-second series.
    pub series: Series,
    /// Messages consumed (measured: polls after warm-up; in all: warm-up included), the window
    /// of the measured polls, errors.
    pub tally: Tally,
}

/// Runs one consumer to its end on the calling thread.
pub fn run(spec: ConsumerSpec) -> Result<ConsumerResult, String> {
    let (actor, cpu) = (spec.actor, spec.cpu);
    run_pinned(cpu, consume(spec)).map_err(|e| format!("consumer {actor}: {e}"))
}

async fn consume(spec: ConsumerSpec) -> Result<ConsumerResult, String> {
    let config = ClientConfig {
        client_name: format!("shoal-bench/consumer-{}", spec.actor),
        reply_size_bytes_max: spec.fetch_bytes_max as usize + (4 << 20),
        ..ClientConfig::with_seeds(spec.seeds.clone())
    };
    let target = Target { stream: &spec.stream, topic: &spec.topic, partition: spec.partition };
    let (mut client, on_owner) = connect(config, Some(target), spec.connect_to_owner)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut result = ConsumerResult {
        actor: spec.actor,
        partition: spec.partition,
        on_owner,
        ..Default::default()
    };
    let mut from = spec.from;
    let now_ns = || spec.start.elapsed().as_nanos() as u64;
    while now_ns() < spec.stop_ns && result.tally.messages_total < spec.messages_max {
        let fetch = Fetch {
            stream: spec.stream.clone(),
            topic: spec.topic.clone(),
            partition: spec.partition,
            from,
            bytes_max: spec.fetch_bytes_max,
            count_max: spec.fetch_count_max,
            // Long-poll at the end of the partition, but never much past the run's end.
            wait_ms_max: (spec.stop_ns.saturating_sub(now_ns()) / 1_000_000).min(WAIT_MS_MAX)
                as u32,
        };
        let asked = now_ns();
        let fetched = match client.fetch(&fetch).await {
            Ok(fetched) => fetched,
            Err(error) => {
                result.tally.error(error_kind(&error));
                if matches!(error, ClientError::Io(_) | ClientError::Closed) {
                    monoio::time::sleep(RETRY_PAUSE).await;
                }
                continue;
            }
        };
        let done = now_ns();
        let consumed_wall_ns = wall_ns();
        let (mut messages, mut bytes) = (0u64, 0u64);
        let mut last_offset = None;
        for record in fetched.records() {
            let Ok(record) = record else {
                result.tally.error("Protocol");
                break;
            };
            let value = record.value.unwrap_or_default();
            messages += 1;
            bytes += value.len() as u64;
            if spec.end_to_end
                && asked >= spec.warmup_ns
                && let Some(stamp) = value.first_chunk::<8>().map(|s| u64::from_le_bytes(*s))
                && stamp > 0
            {
                result.end_to_end.record_us(consumed_wall_ns.saturating_sub(stamp) / 1_000);
            }
            last_offset = Some(record.offset);
        }
        match last_offset.or(fetched.end_offset().map(|end| end.saturating_sub(1))) {
            Some(last) if messages > 0 => {
                from = FetchFrom::Offset(last + 1);
                result.tally.moved(messages);
                spec.live.messages.fetch_add(messages, Ordering::Relaxed);
                spec.live.bytes.fetch_add(bytes, Ordering::Relaxed);
                let latency_us = (done - asked) / 1_000;
                result.series.record(done, messages, bytes, latency_us);
                if asked >= spec.warmup_ns {
                    result.poll_latency.record_us(latency_us);
                    result.tally.measured(asked, done, messages, bytes);
                }
            }
            _ => {
                // Nothing new: keep the position (resolved to an offset once known).
                if let FetchFrom::Last | FetchFrom::First = from {
                    from = FetchFrom::Offset(fetched.reply.next_offset);
                }
            }
        }
    }
    Ok(result)
}
