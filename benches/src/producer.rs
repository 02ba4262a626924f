//! One producer actor: a thread with its own io_uring runtime and connection, sending the same
//! prepared batch to its partition on the open-loop schedule with up to `in_flight_max` requests
//! outstanding, and recording each batch's produce→ack latency from its intended send time.
//! The connection is split ([`Client::into_split`]): a send that is due goes out while earlier
//! replies are still awaited, so a slow reply delays no later send, and the last stretch of each
//! wait is spent yielding rather than on the runtime's millisecond timer.
//!
//! It owns its connection, its histogram and its series; it shares only the live counters the
//! progress line reads. It builds its request body once and reuses it for every send.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use shoal_client::{Client, ClientConfig, ClientError, ReplyReceiver, RequestSender};
use shoal_proto::protocol::{Operation, Partitioning, Produce, ProduceReply, Writer};

use crate::actor::{Tally, Target, connect, run_pinned};
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
    /// Connect to the shard that owns the partition (`--connect owner`).
    pub connect_to_owner: bool,
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
    /// Whether its (last) connection was served by the shard owning its partition (`None`: not
    /// one partition, or the server names no shards).
    pub on_owner: Option<bool>,
    /// Latency of measured sends (after warm-up).
    pub latency: Latency,
    /// Per-second series (whole run, warm-up included).
    pub series: Series,
    /// Messages acknowledged (measured: intended after warm-up; in all: what the server stored
    /// from this actor), the window from the first measured send to the last acknowledgement,
    /// errors.
    pub tally: Tally,
    /// The write stall: the longest time, after warm-up, between two acknowledgements (or from
    /// the last one to the end of sending), in nanoseconds — what a failover costs this producer.
    pub stall_ns: u64,
    /// When the stall's gap ended, since the run's start (nanoseconds).
    pub stall_end_ns: u64,
    /// The last acknowledgement, since the run's start (0: none yet).
    last_ack_ns: u64,
}

/// Runs one producer to its end on the calling thread.
pub fn run(spec: ProducerSpec) -> Result<ProducerResult, String> {
    let (actor, cpu) = (spec.actor, spec.cpu);
    run_pinned(cpu, produce(spec)).map_err(|e| format!("producer {actor}: {e}"))
}

/// How much earlier than a send's intended time the timer is asked to wake: the runtime's timer
/// has a granularity of a millisecond, so the rest of the wait is spent yielding.
const TIMER_SLACK_NS: u64 = 1_500_000;

/// Waits about `wait_ns`: on the timer for all but the last [`TIMER_SLACK_NS`], by yielding for
/// the rest (the caller re-checks the schedule after each return).
async fn wait_for(wait_ns: u64) {
    if wait_ns > TIMER_SLACK_NS {
        monoio::time::sleep(Duration::from_nanos(wait_ns - TIMER_SLACK_NS)).await;
    } else {
        yield_now().await;
    }
}

/// Lets the thread's other tasks run once.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|context| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            context.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await;
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
    let records = shoal_proto::batch::records(batch).map_err(|e| format!("batch: {e}"))?;
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
    let crc = shoal_proto::checksum::crc32c(&batch[BATCH_ATTRIBUTES_POS..]);
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
    let mut body = RequestBody::new(&spec)?;

    let state = RefCell::new(State {
        result: ProducerResult { actor: spec.actor, ..ProducerResult::default() },
        outstanding: VecDeque::with_capacity(spec.in_flight_max),
        second_latency: Latency::new(),
        second_index: 0,
        sending_done: false,
        connection_failed: false,
        redirect: None,
        not_primary: false,
    });
    let mut schedule = Schedule::new(0, spec.interval_ns);
    let replied = Signal::default();
    let sent = Signal::default();
    let target = match spec.partitioning {
        Partitioning::Explicit(partition) => {
            Some(Target { stream: &spec.stream, topic: &spec.topic, partition })
        }
        _ => None,
    };
    let connecting = connect(config.clone(), target.clone(), spec.connect_to_owner, None);
    let (first, on_owner) = connecting.await.map_err(|e| format!("connect: {e}"))?;
    state.borrow_mut().result.on_owner = on_owner;
    let mut client: Option<Client> = Some(first);
    // Connections in a row that ended in `NotPrimary` without an acknowledgement: while a view
    // change is under way every node names a primary that is gone, and reconnecting at once
    // would spin on the CPUs the view change needs. Backs off from 10 ms, doubling to 80 ms
    // (as Kafka clients back off with `retry.backoff.ms` before refreshing metadata).
    let mut redirects_unanswered: u32 = 0;
    let mut acked_before = 0;
    while sending(&spec, &schedule) {
        let redirect = {
            let mut state = state.borrow_mut();
            let acked = state.result.tally.messages_total;
            let unanswered = std::mem::take(&mut state.not_primary) && acked == acked_before;
            redirects_unanswered = if unanswered { redirects_unanswered + 1 } else { 0 };
            acked_before = acked;
            state.redirect.take()
        };
        if redirects_unanswered > 0 {
            let backoff_ms = 10 << (redirects_unanswered - 1).min(3);
            monoio::time::sleep(Duration::from_millis(backoff_ms)).await;
        }
        let connected = match client.take() {
            Some(client) => client.into_split().await,
            None => match connect(config.clone(), target.clone(), spec.connect_to_owner, redirect)
                .await
            {
                Ok((client, on_owner)) => {
                    state.borrow_mut().result.on_owner = on_owner;
                    client.into_split().await
                }
                Err(error) => Err(error),
            },
        };
        let (mut requests, mut replies) = match connected {
            Ok(halves) => halves,
            Err(error) => {
                state.borrow_mut().result.tally.error(error_kind(&error));
                // The server is unreachable: retry, without spinning, until the run ends.
                monoio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        {
            let mut state = state.borrow_mut();
            // A request the sender was still submitting when the last connection failed was
            // queued after the receiver cleared the queue: it will never be answered here, and
            // left in, it would pair every reply of this connection with the request before.
            state.outstanding.clear();
            state.connection_failed = false;
            state.sending_done = false;
        }
        let send =
            send_loop(&spec, &state, &mut schedule, &mut requests, &replied, &sent, &mut body);
        let receive = receive_loop(&spec, &state, &mut replies, &replied, &sent);
        monoio::join!(send, receive);
    }
    let mut state = state.into_inner();
    // A producer stalled until the end stalled for that long too.
    let end = (spec.start.elapsed().as_nanos() as u64).min(spec.stop_ns);
    note_ack(&spec, &mut state.result, end);
    Ok(state.result)
}

/// Extends the write stall with the gap up to an acknowledgement at `done` (counting from the
/// end of warm-up).
fn note_ack(spec: &ProducerSpec, result: &mut ProducerResult, done: u64) {
    let since = result.last_ack_ns.max(spec.warmup_ns);
    if done > since && done - since > result.stall_ns {
        result.stall_ns = done - since;
        result.stall_end_ns = done;
    }
    result.last_ack_ns = result.last_ack_ns.max(done);
}

/// The produce request sent every time: the encoded prefix, then the prepared batch.
struct RequestBody {
    bytes: Vec<u8>,
    prefix_len: usize,
    /// Where the batch's message values can take a send-time stamp (`e2e` only).
    stamp_positions: Vec<usize>,
}

impl RequestBody {
    fn new(spec: &ProducerSpec) -> Result<RequestBody, String> {
        let mut bytes = Vec::with_capacity(spec.batch.len() + 600);
        let request = Produce {
            stream: spec.stream.clone(),
            topic: spec.topic.clone(),
            partitioning: spec.partitioning.clone(),
        };
        let mut writer = Writer::new();
        request.encode_prefix(&mut writer);
        bytes.extend_from_slice(&writer.finish());
        let prefix_len = bytes.len();
        bytes.extend_from_slice(&spec.batch);
        let stamp_positions = if spec.stamp { stamp_positions(&spec.batch)? } else { Vec::new() };
        Ok(RequestBody { bytes, prefix_len, stamp_positions })
    }

    /// The request's two parts, the batch stamped with the send time first when `stamp`.
    fn parts(&mut self, stamp_now: bool) -> [&[u8]; 2] {
        if stamp_now {
            stamp(&mut self.bytes[self.prefix_len..], &self.stamp_positions, wall_ns());
        }
        let (prefix, batch) = self.bytes.split_at(self.prefix_len);
        [prefix, batch]
    }
}

/// What a producer's sending and receiving halves share.
struct State {
    result: ProducerResult,
    /// Requests sent and not yet answered: (request number, intended send time).
    outstanding: VecDeque<(u64, u64)>,
    second_latency: Latency,
    second_index: u64,
    /// The sender has stopped (the run ended or the connection failed).
    sending_done: bool,
    /// The connection failed: both halves stop, and every outstanding request is lost.
    connection_failed: bool,
    /// The primary a `NotPrimary` named: the next connection goes there first.
    redirect: Option<String>,
    /// The connection ended in `NotPrimary`.
    not_primary: bool,
}

fn sending(spec: &ProducerSpec, schedule: &Schedule) -> bool {
    (spec.start.elapsed().as_nanos() as u64) < spec.stop_ns && schedule.sent() < spec.batches_max
}

/// Sends on the open-loop schedule, whatever the replies are doing, while the connection has
/// room; stops when the run ends or the connection failed.
async fn send_loop(
    spec: &ProducerSpec,
    state: &RefCell<State>,
    schedule: &mut Schedule,
    requests: &mut RequestSender,
    replied: &Signal,
    sent: &Signal,
    body: &mut RequestBody,
) {
    let now_ns = || spec.start.elapsed().as_nanos() as u64;
    while sending(spec, schedule) && !state.borrow().connection_failed {
        let now = now_ns();
        if !requests.has_room() {
            replied.wait().await;
            continue;
        }
        if !schedule.is_due(now) {
            wait_for(schedule.wait_ns(now)).await;
            continue;
        }
        let intended = schedule.take(now);
        match requests.submit(Operation::Produce, &body.parts(spec.stamp)).await {
            Ok(request) => {
                state.borrow_mut().outstanding.push_back((request, intended));
                sent.raise();
            }
            Err(error) => {
                let mut state = state.borrow_mut();
                state.result.tally.error(error_kind(&error));
                state.connection_failed = true;
            }
        }
    }
    state.borrow_mut().sending_done = true;
    sent.raise();
}

/// Collects replies in order and records each one's latency from its intended send time; ends
/// once the sender stopped and nothing is outstanding, or the connection failed.
async fn receive_loop(
    spec: &ProducerSpec,
    state: &RefCell<State>,
    replies: &mut ReplyReceiver,
    replied: &Signal,
    sent: &Signal,
) {
    loop {
        let idle = {
            let mut state = state.borrow_mut();
            if state.connection_failed {
                // The connection is gone, and with it every outstanding request.
                state.outstanding.clear();
                break;
            }
            if state.outstanding.is_empty() && state.sending_done {
                break;
            }
            state.outstanding.is_empty()
        };
        if idle {
            sent.wait().await;
            continue;
        }
        let reply = replies.receive().await;
        let done = spec.start.elapsed().as_nanos() as u64;
        let mut guard = state.borrow_mut();
        let state = &mut *guard;
        let Some((request, intended)) = state.outstanding.pop_front() else { continue };
        replied.raise();
        match reply {
            Ok(reply) if reply.request == request => match reply.result {
                Ok(body) => {
                    let Ok(produced) = ProduceReply::decode(&body) else {
                        state.result.tally.error("Protocol");
                        continue;
                    };
                    record(spec, state, &produced, intended, done);
                }
                Err(ClientError::NotPrimary(redirect)) => {
                    // In a cluster the partition moved: this connection leads nowhere now.
                    state.result.tally.error("NotPrimary");
                    state.redirect = (!redirect.address.is_empty()).then_some(redirect.address);
                    state.not_primary = true;
                    state.connection_failed = true;
                }
                Err(error) => state.result.tally.error(error_kind(&error)),
            },
            Ok(_) => state.result.tally.error("Protocol"),
            Err(error) => {
                state.result.tally.error(error_kind(&error));
                state.connection_failed = true;
            }
        }
    }
    replied.raise();
}

/// Records one acknowledged batch.
fn record(
    spec: &ProducerSpec,
    state: &mut State,
    produced: &ProduceReply,
    intended: u64,
    done: u64,
) {
    note_ack(spec, &mut state.result, done);
    let result = &mut state.result;
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
    if index != state.second_index {
        let p99 = state.second_latency.summary().p99;
        spec.live.p99_us.fetch_max(p99, Ordering::Relaxed);
        state.second_latency = Latency::new();
        state.second_index = index;
    }
    state.second_latency.record_us(latency_us);
}

/// A one-task wake-up between the two halves: `raise` wakes the task waiting in `wait` (or lets
/// its next `wait` return at once).
#[derive(Default)]
struct Signal {
    raised: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Signal {
    fn raise(&self) {
        self.raised.set(true);
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }

    async fn wait(&self) {
        std::future::poll_fn(|context| {
            if self.raised.replace(false) {
                Poll::Ready(())
            } else {
                *self.waker.borrow_mut() = Some(context.waker().clone());
                Poll::Pending
            }
        })
        .await;
    }
}
