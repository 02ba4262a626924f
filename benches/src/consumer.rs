//! One consumer actor: a thread with its own io_uring runtime and connection, fetching one
//! partition from a start position — or, with a consumer group, joining it and polling its
//! share of the partitions from the group's stored offsets with auto-commit — recording each
//! poll's latency (request → reply) and, in the `e2e` mode, each message's end-to-end latency
//! (consumed − produced, from the wall-clock send time the producer stamped into the first 8
//! bytes of every message).
//!
//! It owns its connection, histograms and series; it shares only the live counters.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use shoal_client::{
    Assignment, Client, ClientConfig, ClientError, ConsumerId, ErrorCode, Fetch, FetchFrom,
    Fetched, GroupMember, GroupRef, JoinGroup, Membership, PartitionRef, Poll,
};

use crate::actor::{Tally, Target, connect, run_pinned};
use crate::producer::{Live, error_kind, wall_ns};
use crate::stats::{Latency, Series};

/// Pause before polling again after the connection failed.
const RETRY_PAUSE: Duration = Duration::from_millis(1);
/// Longest one fetch waits at the end of the partition for new data (long-poll): the server
/// answers as soon as a write commits, so this only bounds an idle poll.
const WAIT_MS_MAX: u64 = 500;
/// A group member's session timeout.
const SESSION_TIMEOUT_MS: u32 = 10_000;
/// Time between a group member's heartbeats.
const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(2_500);

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
    /// Source (unused with a group).
    pub partition: u32,
    /// Consume as a member of this consumer group: its share of the topic's partitions, from
    /// the group's stored offsets, each poll auto-committing what it returned.
    pub group: Option<String>,
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

/// Where a consumer's batches come from.
enum Source {
    /// One partition, from a position the consumer keeps.
    Partition(FetchFrom),
    /// A consumer group's share, from the group's stored offsets.
    Group(GroupMemberState),
}

struct GroupMemberState {
    member: GroupMember,
    assignment: Assignment,
    /// The next assigned partition to poll (round-robin over the share).
    next: usize,
    last_heartbeat: Instant,
}

impl Source {
    /// One poll; `wait_ms_max` bounds a long-poll at the end of the data. `None`: a group
    /// member polled nothing (it has no share and waited a while, or took a new share).
    async fn poll(
        &mut self,
        client: &mut Client,
        spec: &ConsumerSpec,
        wait_ms_max: u32,
    ) -> Result<Option<Fetched>, ClientError> {
        match self {
            Source::Partition(from) => {
                let fetch = Fetch {
                    stream: spec.stream.clone(),
                    topic: spec.topic.clone(),
                    partition: spec.partition,
                    from: *from,
                    bytes_max: spec.fetch_bytes_max,
                    count_max: spec.fetch_count_max,
                    wait_ms_max,
                };
                client.fetch(&fetch).await.map(Some)
            }
            Source::Group(state) => {
                if state.last_heartbeat.elapsed() >= HEARTBEAT_INTERVAL {
                    state.assignment = client.heartbeat(&state.member).await?;
                    state.last_heartbeat = Instant::now();
                }
                let partitions = &state.assignment.partitions;
                let Some(&partition) = partitions.get(state.next % partitions.len().max(1)) else {
                    // No share (more members than partitions): idle until the next heartbeat.
                    monoio::time::sleep(
                        HEARTBEAT_INTERVAL
                            .min(Duration::from_millis(u64::from(wait_ms_max.max(1)))),
                    )
                    .await;
                    return Ok(None);
                };
                state.next = state.next.wrapping_add(1);
                let poll = Poll {
                    partition: PartitionRef {
                        stream: spec.stream.clone(),
                        topic: spec.topic.clone(),
                        partition,
                    },
                    consumer: ConsumerId::group(state.member.group.group.clone()),
                    membership: Membership {
                        member: state.member.member.clone(),
                        generation: state.assignment.generation,
                    },
                    bytes_max: spec.fetch_bytes_max,
                    count_max: spec.fetch_count_max,
                    // Each partition of the share gets its turn: only a member with a single
                    // partition long-polls.
                    wait_ms_max: if partitions.len() == 1 { wait_ms_max } else { 0 },
                    auto_commit: true,
                };
                match client.poll(&poll).await {
                    // A rebalance moved the share: take the new one (not an error of the run).
                    Err(ClientError::Server {
                        code: ErrorCode::StaleGeneration | ErrorCode::NotAssigned,
                        ..
                    }) => {
                        state.assignment = client.heartbeat(&state.member).await?;
                        state.last_heartbeat = Instant::now();
                        Ok(None)
                    }
                    polled => polled.map(Some),
                }
            }
        }
    }

    /// After a poll that returned messages up to `last`.
    fn advance(&mut self, last: u64) {
        if let Source::Partition(from) = self {
            *from = FetchFrom::Offset(last + 1);
        }
    }

    /// After a poll that returned nothing: a symbolic start becomes the end it found.
    fn settle(&mut self, next_offset: u64) {
        if let Source::Partition(from @ (FetchFrom::Last | FetchFrom::First)) = self {
            *from = FetchFrom::Offset(next_offset);
        }
    }
}

async fn consume(spec: ConsumerSpec) -> Result<ConsumerResult, String> {
    let config = ClientConfig {
        client_name: format!("shoal-bench/consumer-{}", spec.actor),
        reply_size_bytes_max: spec.fetch_bytes_max as usize + (4 << 20),
        ..ClientConfig::with_seeds(spec.seeds.clone())
    };
    // A group member polls whatever share it is given, so only a one-partition consumer has an
    // owning shard to connect to.
    let target = spec.group.is_none().then(|| Target {
        stream: &spec.stream,
        topic: &spec.topic,
        partition: spec.partition,
    });
    let (mut client, on_owner) = connect(config, target, spec.connect_to_owner, None)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut result = ConsumerResult {
        actor: spec.actor,
        partition: spec.partition,
        on_owner,
        ..Default::default()
    };
    let mut source = match &spec.group {
        None => Source::Partition(spec.from),
        Some(group) => {
            let group = GroupRef {
                stream: spec.stream.clone(),
                topic: spec.topic.clone(),
                group: group.clone(),
            };
            let join = JoinGroup {
                group: group.clone(),
                member: String::new(),
                session_timeout_ms: SESSION_TIMEOUT_MS,
            };
            let assignment =
                client.join_group(&join).await.map_err(|e| format!("joining the group: {e}"))?;
            let member = GroupMember { group, member: assignment.member.clone() };
            Source::Group(GroupMemberState {
                member,
                assignment,
                next: 0,
                last_heartbeat: Instant::now(),
            })
        }
    };
    let now_ns = || spec.start.elapsed().as_nanos() as u64;
    while now_ns() < spec.stop_ns && result.tally.messages_total < spec.messages_max {
        // Long-poll at the end of the data, but never much past the run's end.
        let wait_ms_max = (spec.stop_ns.saturating_sub(now_ns()) / 1_000_000).min(WAIT_MS_MAX);
        let asked = now_ns();
        let fetched = match source.poll(&mut client, &spec, wait_ms_max as u32).await {
            Ok(Some(fetched)) => fetched,
            Ok(None) => continue,
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
                source.advance(last);
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
            _ => source.settle(fetched.reply.next_offset),
        }
    }
    if let Source::Group(state) = &source {
        // Hands the share over at once rather than after the session timeout.
        let _ = client.leave_group(&state.member).await;
    }
    Ok(result)
}
