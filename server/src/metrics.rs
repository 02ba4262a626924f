//! The server's metrics: per-shard counters and latency histograms, the snapshot each shard
//! answers a scrape with, and the Prometheus text page shard 0 renders from them
//! (`docs/metrics.md` lists every metric).
//!
//! It owns [`ShardMetrics`] — plain `Cell`s that a shard's loop and its connection tasks, which
//! all run on the shard's one thread, update in place: no atomic, no lock and no allocation on
//! the request path — and the scrape: the [`Exporter`] sends `Work::Metrics` to every shard's
//! inbox, each shard copies its counters and reads its engine and replicas into a
//! [`ShardSnapshot`] (the only time they are read), and the exporter renders the page from the
//! snapshots, the configuration and the published catalog. It never touches another shard's
//! state, never blocks a shard's loop (a scrape is one more inbox item) and never speaks HTTP
//! (`http` does).

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_engine::cache::CacheCounters;
use shoal_engine::shard::ShardCounters;
use shoal_engine::storage::Storage;
use shoal_kafka::kafka_protocol::messages::ApiKey;
use shoal_proto::protocol::{ErrorCode, Operation};
use shoal_replication::{
    Clock, Node, NodeCounters, ReplicaCounters, ReplicaState, Status, TICK_MS, Transport,
};

use crate::bus::BusCounters;
use crate::config::{self, Config};
use crate::http::{self, HttpStats};
use crate::metadata::{Catalog, Published};
use crate::shard::{Mesh, Work};

/// Operation and error codes counted one by one; a code at or past this (or one the build does
/// not know) is counted as `unknown`. New codes below it need no change here: their labels come
/// from their enums' names.
pub const CODE_SLOTS: usize = 64;

/// Upper bounds of the latency histograms' buckets, in nanoseconds: 1, 2.5 and 5 per decade from
/// 10 µs to 10 s — log-spaced, so the relative resolution is the same for a 50 µs fetch from the
/// ring and a 50 ms synced produce. Values above the last land in `+Inf` only.
pub const LATENCY_BOUNDS_NS: [u64; 19] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

const BUCKETS: usize = LATENCY_BOUNDS_NS.len() + 1;

/// How long a scrape waits for the shards' snapshots; a shard that has not answered by then is
/// shown as `shoal_shard_scrape_ok 0` and its other series are left out of that page.
pub const SCRAPE_TIME_MAX: Duration = Duration::from_secs(5);

/// A latency histogram with fixed buckets ([`LATENCY_BOUNDS_NS`]), on one thread.
#[derive(Debug)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last is above every bound.
    buckets: [Cell<u64>; BUCKETS],
    sum_ns: Cell<u64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { buckets: std::array::from_fn(|_| Cell::new(0)), sum_ns: Cell::new(0) }
    }
}

impl Histogram {
    /// Records one observation.
    pub fn record(&self, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let bucket = &self.buckets[bucket_of(ns)];
        bucket.set(bucket.get() + 1);
        self.sum_ns.set(self.sum_ns.get().saturating_add(ns));
    }

    fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: std::array::from_fn(|index| self.buckets[index].get()),
            sum_ns: self.sum_ns.get(),
        }
    }
}

/// The bucket of an observation of `ns` nanoseconds: the first whose bound is at least `ns`
/// (Prometheus buckets are `le`, less than or equal).
fn bucket_of(ns: u64) -> usize {
    LATENCY_BOUNDS_NS.partition_point(|&bound| bound < ns)
}

/// A histogram's figures at a scrape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Observations per bucket, not cumulative; the last is above every bound.
    pub buckets: [u64; BUCKETS],
    pub sum_ns: u64,
}

impl HistogramSnapshot {
    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// One shard's request-path counters, shared (`Rc`) by the shard's loop and the connection tasks
/// it runs. Only that thread touches them; a scrape reads a copy ([`ShardSnapshot`]).
#[derive(Debug)]
pub struct ShardMetrics {
    connections_open: Cell<u64>,
    connections_accepted: Cell<u64>,
    connections_refused: Cell<u64>,
    connections_idle_closed: Cell<u64>,
    /// Requests decoded, by operation code (slot 0: past [`CODE_SLOTS`]).
    requests: [Cell<u64>; CODE_SLOTS],
    /// Error replies written, by error code (slot 0: past [`CODE_SLOTS`]).
    errors: [Cell<u64>; CODE_SLOTS],
    /// Requests handed to another shard's inbox (the owner of what they name).
    requests_forwarded: Cell<u64>,
    /// Kafka requests decoded, by API key (slot 0 past [`CODE_SLOTS`] is never hit: key 0 is
    /// Produce, so keys at or past the bound and negative ones count in `kafka_requests_other`).
    kafka_requests: [Cell<u64>; CODE_SLOTS],
    kafka_requests_other: Cell<u64>,
    /// Kafka requests answered with an error (or closing their connection), by API key as
    /// `kafka_requests` counts them.
    kafka_errors: [Cell<u64>; CODE_SLOTS],
    kafka_errors_other: Cell<u64>,
    /// Kafka requests answered, from header decoded to response encoded, per served API (in
    /// `shoal_kafka::SERVED` order).
    kafka_latency: Vec<Histogram>,
    /// Kafka connections closed for what their client sent.
    kafka_connections_closed: Cell<u64>,
    received_bytes: Cell<u64>,
    sent_bytes: Cell<u64>,
    produce_latency: Histogram,
    fetch_latency: Histogram,
    retention_segments: Cell<u64>,
    retention_bytes: Cell<u64>,
    /// Shard 0: the op the newest metadata snapshot covers (saved or restored).
    metadata_snapshot_op: Cell<u64>,
    /// Shard 0: metadata snapshots saved since start.
    metadata_snapshots: Cell<u64>,
    /// Shard 0: metadata ops replayed from the log at start-up (past the snapshot).
    metadata_replayed_ops: Cell<u64>,
    /// Shard 0: admin requests answered from the client table without entering the log.
    metadata_duplicates: Cell<u64>,
    /// Machine states handed to a replica for a peer's state transfer, and those refused.
    transfer_states_served: Cell<u64>,
    transfer_states_refused: Cell<u64>,
    /// Machine states a peer's transfer carried that this shard installed, and those that did
    /// not decode.
    transfer_states_installed: Cell<u64>,
    transfer_states_unusable: Cell<u64>,
}

impl Default for ShardMetrics {
    fn default() -> Self {
        let cell = |_| Cell::new(0);
        ShardMetrics {
            connections_open: Cell::new(0),
            connections_accepted: Cell::new(0),
            connections_refused: Cell::new(0),
            connections_idle_closed: Cell::new(0),
            requests: std::array::from_fn(cell),
            errors: std::array::from_fn(cell),
            requests_forwarded: Cell::new(0),
            kafka_requests: std::array::from_fn(cell),
            kafka_requests_other: Cell::new(0),
            kafka_errors: std::array::from_fn(cell),
            kafka_errors_other: Cell::new(0),
            kafka_latency: shoal_kafka::SERVED.iter().map(|_| Histogram::default()).collect(),
            kafka_connections_closed: Cell::new(0),
            received_bytes: Cell::new(0),
            sent_bytes: Cell::new(0),
            produce_latency: Histogram::default(),
            fetch_latency: Histogram::default(),
            retention_segments: Cell::new(0),
            retention_bytes: Cell::new(0),
            metadata_snapshot_op: Cell::new(0),
            metadata_snapshots: Cell::new(0),
            metadata_replayed_ops: Cell::new(0),
            metadata_duplicates: Cell::new(0),
            transfer_states_served: Cell::new(0),
            transfer_states_refused: Cell::new(0),
            transfer_states_installed: Cell::new(0),
            transfer_states_unusable: Cell::new(0),
        }
    }
}

fn add(cell: &Cell<u64>, n: u64) {
    cell.set(cell.get().wrapping_add(n));
}

fn slot(code: u32) -> usize {
    usize::try_from(code).ok().filter(|&code| code < CODE_SLOTS).unwrap_or(0)
}

impl ShardMetrics {
    /// A connection was accepted; it counts as open until the returned guard drops.
    pub fn connection_opened(self: &Rc<Self>) -> OpenConnection {
        add(&self.connections_accepted, 1);
        add(&self.connections_open, 1);
        OpenConnection(Rc::clone(self))
    }

    /// A connection was refused at the node's connection bound.
    pub fn connection_refused(&self) {
        add(&self.connections_refused, 1);
    }

    /// A client connection was closed for staying silent past `[network] idle_timeout_ms`.
    pub fn idle_connection_closed(&self) {
        add(&self.connections_idle_closed, 1);
    }

    /// A request with this operation code was decoded.
    pub fn request(&self, operation: u32) {
        add(&self.requests[slot(operation)], 1);
    }

    /// A Kafka request with this API key was decoded.
    pub fn kafka_request(&self, api_key: i16) {
        match usize::try_from(api_key) {
            Ok(key) if key < CODE_SLOTS => add(&self.kafka_requests[key], 1),
            _ => add(&self.kafka_requests_other, 1),
        }
    }

    /// A Kafka request was answered (`error`: with an error, or by closing its connection),
    /// `elapsed` after its header was decoded (not timed when it closed the connection).
    pub fn kafka_answered(&self, api_key: i16, error: bool, elapsed: Option<Duration>) {
        if error {
            match usize::try_from(api_key) {
                Ok(key) if key < CODE_SLOTS => add(&self.kafka_errors[key], 1),
                _ => add(&self.kafka_errors_other, 1),
            }
        }
        let served = shoal_kafka::SERVED.iter().position(|s| s.key as i16 == api_key);
        if let (Some(index), Some(elapsed)) = (served, elapsed) {
            self.kafka_latency[index].record(elapsed);
        }
    }

    /// A Kafka connection was closed for what its client sent.
    pub fn kafka_connection_refused(&self) {
        add(&self.kafka_connections_closed, 1);
    }

    /// A request was handed to another shard, which owns what it names.
    pub fn forwarded(&self) {
        add(&self.requests_forwarded, 1);
    }

    /// A reply was written: its error code (`0`: success) and, for a successful produce or
    /// fetch, the time since its request was decoded.
    pub fn replied(&self, operation: u32, error: u32, received: Instant) {
        if error != 0 {
            add(&self.errors[slot(error)], 1);
            return;
        }
        if operation == Operation::Produce as u32 {
            self.produce_latency.record(received.elapsed());
        } else if operation == Operation::Fetch as u32 || operation == Operation::Poll as u32 {
            self.fetch_latency.record(received.elapsed());
        }
    }

    /// Bytes read from clients (frames).
    pub fn received(&self, bytes: usize) {
        add(&self.received_bytes, bytes as u64);
    }

    /// Bytes written to clients (frames).
    pub fn sent(&self, bytes: usize) {
        add(&self.sent_bytes, bytes as u64);
    }

    /// Shard 0 rebuilt the metadata state from the snapshot at `snapshot_op` (0: none) and
    /// `replayed_ops` ops of the log past it.
    pub fn metadata_recovered(&self, snapshot_op: u64, replayed_ops: u64) {
        self.metadata_snapshot_op.set(snapshot_op);
        self.metadata_replayed_ops.set(replayed_ops);
    }

    /// Shard 0 saved a metadata snapshot at `op`.
    pub fn metadata_snapshot_saved(&self, op: u64) {
        self.metadata_snapshot_op.set(op);
        add(&self.metadata_snapshots, 1);
    }

    /// Shard 0 answered a retried admin request from the client table.
    pub fn metadata_duplicate(&self) {
        add(&self.metadata_duplicates, 1);
    }

    /// The shard's machine gave its state for a peer's transfer (or could not: `served` false).
    pub fn driver_state_served(&self, served: bool) {
        add(if served { &self.transfer_states_served } else { &self.transfer_states_refused }, 1);
    }

    /// The shard installed the machine state a peer's transfer carried (or found it unusable).
    pub fn driver_state_installed(&self, installed: bool) {
        let cell = if installed {
            &self.transfer_states_installed
        } else {
            &self.transfer_states_unusable
        };
        add(cell, 1);
    }

    /// A retention pass deleted this much.
    pub fn retention(&self, segments: usize, bytes: u64) {
        add(&self.retention_segments, segments as u64);
        add(&self.retention_bytes, bytes);
    }
}

/// Counts one connection as open while it lives.
pub struct OpenConnection(Rc<ShardMetrics>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        let open = &self.0.connections_open;
        open.set(open.get().saturating_sub(1));
    }
}

/// One partition group's figures at a scrape.
#[derive(Clone, Debug, Default)]
pub struct GroupFigures {
    pub group: u64,
    pub first_offset: u64,
    /// The log end offset: the offset the next message gets.
    pub next_offset: u64,
    /// The offset after the last committed message: consumers read below it.
    pub committed_offset: u64,
    pub commit_op: u64,
    pub view: u64,
    /// The replica's status: 0 normal, 1 view change, 2 recovering.
    pub status: u64,
    /// 1 if the replica is its view's serving primary.
    pub primary: bool,
    pub segments: u64,
    pub size_bytes: u64,
    /// The group stopped serving (storage damage or an I/O error).
    pub failed: bool,
    /// Members in the group's in-sync set, when this shard's replica is the group's primary
    /// (only the primary knows its backups' progress).
    pub in_sync_replicas: Option<u64>,
    /// Every member (the primary included) as the primary sees it, when this shard's replica
    /// is the group's primary; empty otherwise.
    pub members: Vec<MemberFigures>,
}

/// One member of a group, as the group's primary sees it.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemberFigures {
    /// Its index in the group.
    pub replica: u8,
    /// Milliseconds since it was last caught up (0 for the primary).
    pub lag_ms: u64,
    /// 0 in sync (the primary included), 1 lagging, 2 dead.
    pub state: u64,
    /// Ops its acknowledgements trail the primary's head.
    pub lag_ops: u64,
}

/// What a shard answers a scrape with: a plain copy, sent across threads.
#[derive(Clone, Debug)]
pub struct ShardSnapshot {
    pub shard: u32,
    pub connections_open: u64,
    pub connections_accepted: u64,
    pub connections_refused: u64,
    pub connections_idle_closed: u64,
    pub requests: [u64; CODE_SLOTS],
    pub errors: [u64; CODE_SLOTS],
    pub requests_forwarded: u64,
    pub kafka_requests: [u64; CODE_SLOTS],
    pub kafka_requests_other: u64,
    pub kafka_errors: [u64; CODE_SLOTS],
    pub kafka_errors_other: u64,
    /// Per served API, in `shoal_kafka::SERVED` order.
    pub kafka_latency: Vec<HistogramSnapshot>,
    pub kafka_connections_closed: u64,
    pub received_bytes: u64,
    pub sent_bytes: u64,
    pub produce_latency: HistogramSnapshot,
    pub fetch_latency: HistogramSnapshot,
    pub retention_segments: u64,
    pub retention_bytes: u64,
    pub metadata_snapshot_op: u64,
    pub metadata_snapshots: u64,
    pub metadata_replayed_ops: u64,
    pub metadata_duplicates: u64,
    pub transfer_states_served: u64,
    pub transfer_states_refused: u64,
    pub transfer_states_installed: u64,
    pub transfer_states_unusable: u64,
    /// Summed over the shard's groups: backups their primary here flagged lagging, dead, and
    /// back in sync.
    pub backups_flagged_lagging: u64,
    pub backups_flagged_dead: u64,
    pub backups_back_in_sync: u64,
    /// Summed over the shard's groups: prepares its backups asked peers for, and repair rounds
    /// that ended without progress (the next asked another peer).
    pub repair_prepares_requested: u64,
    pub repair_rounds_unanswered: u64,
    pub repair_rounds_extended: u64,
    /// The engine's I/O counters.
    pub engine: ShardCounters,
    /// The node layer's counters.
    pub node: NodeCounters,
    pub ring_bytes: u64,
    pub chunks_allocated: u64,
    pub ready_space_bytes: u64,
    pub batch_cache_bytes: u64,
    pub batch_cache: CacheCounters,
    /// Heap allocations by the shard's thread since it started.
    pub allocations: u64,
    pub groups: Vec<GroupFigures>,
    /// The replica bus, by peer node (this node's own entry left out).
    pub bus_peers: Vec<BusPeerFigures>,
    /// Connections to the bus port refused at the handshake.
    pub bus_connections_refused: u64,
    /// Frames rejected on established links.
    pub bus_frames_rejected: u64,
}

/// One peer's bus link, as a scrape saw it.
#[derive(Clone, Copy, Debug, Default)]
pub struct BusPeerFigures {
    pub peer: u8,
    pub connected: bool,
    pub reconnects: u64,
    pub sent_bytes: u64,
    pub sent_packets: u64,
    pub received_bytes: u64,
    pub received_packets: u64,
    pub dropped_packets: u64,
    pub queued_bytes: u64,
}

/// Reads a shard's figures: its counters, its engine's and replicas', and each group's committed
/// end as the loop tracks it. Called by the shard's loop when a scrape asks (`Work::Metrics`).
pub fn snapshot<S: Storage, T: Transport, C: Clock>(
    shard: u32,
    metrics: &ShardMetrics,
    node: &Node<S, T, C>,
    committed_end: &HashMap<u64, u64>,
    bus: &BusCounters,
) -> ShardSnapshot {
    let mut groups = Vec::new();
    let mut replicas = ReplicaCounters::default();
    for group in node.group_ids() {
        if let Some(counters) = node.replica(group).map(|replica| replica.counters()) {
            replicas.backups_lagging += counters.backups_lagging;
            replicas.backups_dead += counters.backups_dead;
            replicas.backups_back_in_sync += counters.backups_back_in_sync;
            replicas.repairs_requested += counters.repairs_requested;
            replicas.repair_rounds_unanswered += counters.repair_rounds_unanswered;
            replicas.repair_rounds_extended += counters.repair_rounds_extended;
        }
        let failed = node.group_failure(group).is_some();
        let status = node.group_status(group);
        let (commit_op, view) =
            status.as_ref().map_or((0, 0), |status| (status.commit, u64::from(status.view)));
        let committed_offset = committed_end.get(&group).copied().unwrap_or(0);
        let mut figures =
            GroupFigures { group, commit_op, committed_offset, view, failed, ..Default::default() };
        if let Some(status) = &status {
            figures.status = match status.status {
                Status::Normal => 0,
                Status::ViewChange => 1,
                Status::Recovering => 2,
                Status::Removed => 3,
            };
            figures.primary = status.primary;
        }
        if let Some(status) = status.filter(|status| status.primary) {
            figures.in_sync_replicas = Some(status.in_sync().len() as u64);
            figures.members = status
                .replicas
                .iter()
                .map(|p| MemberFigures {
                    replica: p.replica,
                    // The replica counts ticks; the shard's loop ticks every TICK_MS.
                    lag_ms: p.lag_ticks * TICK_MS,
                    state: match p.state {
                        ReplicaState::Primary | ReplicaState::InSync => 0,
                        ReplicaState::Lagging => 1,
                        ReplicaState::Dead => 2,
                    },
                    lag_ops: status.head.saturating_sub(p.acknowledged_op),
                })
                .collect();
        }
        if let Some(log) = node.log_stats(group) {
            figures.first_offset = log.first_offset;
            figures.next_offset = log.next_offset;
            figures.segments = log.segments as u64;
            figures.size_bytes = log.size_bytes;
            figures.failed |= node.log_fault(group).is_some();
        }
        groups.push(figures);
    }
    let (cache_bytes, cache_counters) = node.batch_cache();
    ShardSnapshot {
        shard,
        connections_open: metrics.connections_open.get(),
        connections_accepted: metrics.connections_accepted.get(),
        connections_refused: metrics.connections_refused.get(),
        connections_idle_closed: metrics.connections_idle_closed.get(),
        requests: std::array::from_fn(|index| metrics.requests[index].get()),
        errors: std::array::from_fn(|index| metrics.errors[index].get()),
        requests_forwarded: metrics.requests_forwarded.get(),
        kafka_requests: std::array::from_fn(|index| metrics.kafka_requests[index].get()),
        kafka_requests_other: metrics.kafka_requests_other.get(),
        kafka_errors: std::array::from_fn(|index| metrics.kafka_errors[index].get()),
        kafka_errors_other: metrics.kafka_errors_other.get(),
        kafka_latency: metrics.kafka_latency.iter().map(Histogram::snapshot).collect(),
        kafka_connections_closed: metrics.kafka_connections_closed.get(),
        received_bytes: metrics.received_bytes.get(),
        sent_bytes: metrics.sent_bytes.get(),
        produce_latency: metrics.produce_latency.snapshot(),
        fetch_latency: metrics.fetch_latency.snapshot(),
        retention_segments: metrics.retention_segments.get(),
        metadata_snapshot_op: metrics.metadata_snapshot_op.get(),
        metadata_snapshots: metrics.metadata_snapshots.get(),
        metadata_replayed_ops: metrics.metadata_replayed_ops.get(),
        metadata_duplicates: metrics.metadata_duplicates.get(),
        transfer_states_served: metrics.transfer_states_served.get(),
        transfer_states_refused: metrics.transfer_states_refused.get(),
        transfer_states_installed: metrics.transfer_states_installed.get(),
        transfer_states_unusable: metrics.transfer_states_unusable.get(),
        backups_flagged_lagging: replicas.backups_lagging,
        backups_flagged_dead: replicas.backups_dead,
        backups_back_in_sync: replicas.backups_back_in_sync,
        repair_prepares_requested: replicas.repairs_requested,
        repair_rounds_unanswered: replicas.repair_rounds_unanswered,
        repair_rounds_extended: replicas.repair_rounds_extended,
        retention_bytes: metrics.retention_bytes.get(),
        engine: node.engine_counters(),
        ring_bytes: node.ring_bytes() as u64,
        chunks_allocated: node.chunks_allocated() as u64,
        ready_space_bytes: node.ready_space_bytes(),
        batch_cache_bytes: cache_bytes as u64,
        batch_cache: cache_counters,
        node: node.counters(),
        allocations: crate::alloc::allocations_on_this_thread(),
        groups,
        bus_peers: bus_figures(bus, node.node_index()),
        bus_connections_refused: bus.connections_refused.get(),
        bus_frames_rejected: bus.frames_rejected.get(),
    }
}

/// Every peer's link figures (this node has no link to itself).
fn bus_figures(bus: &BusCounters, own: u8) -> Vec<BusPeerFigures> {
    (0..bus.peers.len() as u8)
        .filter(|&peer| peer != own && bus.peers[usize::from(peer)].known.get())
        .map(|peer| {
            let p = &bus.peers[peer as usize];
            BusPeerFigures {
                peer,
                connected: p.connected.get(),
                reconnects: p.reconnects.get(),
                sent_bytes: p.sent_bytes.get(),
                sent_packets: p.sent_packets.get(),
                received_bytes: p.received_bytes.get(),
                received_packets: p.received_packets.get(),
                dropped_packets: p.dropped_packets.get(),
                queued_bytes: p.queued_bytes.get(),
            }
        })
        .collect()
}

/// The bytes of every group's segments, for telling what a retention pass deleted (nothing is
/// appended while the pass runs: appends happen only in the shard loop's I/O rounds).
pub fn stored_bytes<S: Storage, T: Transport, C: Clock>(node: &Node<S, T, C>) -> u64 {
    let groups = node.group_ids();
    groups.iter().filter_map(|&group| node.log_stats(group)).map(|log| log.size_bytes).sum()
}

/// The metrics page: scrapes every shard through its inbox and renders what they answered.
pub struct Exporter {
    pub config: Arc<Config>,
    pub mesh: Mesh,
    pub published: Arc<Published>,
}

impl http::Page for Exporter {
    async fn render(&self, http: HttpStats) -> String {
        let shards = scrape(&self.mesh, SCRAPE_TIME_MAX).await;
        let mut catalog = Arc::new(Catalog::new(self.config.shards, 0));
        self.published.refresh(&mut catalog);
        render(&self.config, &catalog, &shards, &http)
    }
}

/// Asks every shard for its snapshot and waits for the answers until `time_max` has passed;
/// `None` for a shard that did not answer in time (or has stopped).
pub async fn scrape(mesh: &Mesh, time_max: Duration) -> Vec<Option<ShardSnapshot>> {
    let deadline = Instant::now() + time_max;
    let mut answers = Vec::with_capacity(mesh.len());
    for inbox in mesh.iter() {
        let (reply, answer) = flume::bounded(1);
        let left = deadline.saturating_duration_since(Instant::now());
        // A full inbox is waited on (within the deadline) rather than skipped: a busy shard is
        // the one worth seeing.
        let sent = monoio::time::timeout(left, inbox.send_async(Work::Metrics { reply })).await;
        answers.push(matches!(sent, Ok(Ok(()))).then_some(answer));
    }
    let mut snapshots = Vec::with_capacity(answers.len());
    for answer in answers {
        let snapshot = match answer {
            Some(answer) => {
                let left = deadline.saturating_duration_since(Instant::now());
                monoio::time::timeout(left, answer.recv_async()).await.ok().and_then(Result::ok)
            }
            None => None,
        };
        snapshots.push(snapshot);
    }
    snapshots
}

/// The Prometheus text page (format 0.0.4): every family once, with its `# HELP` and `# TYPE`.
/// `shards[i]` is shard i's snapshot (`None`: it did not answer); the configuration gauges come
/// from `config` and the partitions' names from `catalog`.
pub fn render(
    config: &Config,
    catalog: &Catalog,
    shards: &[Option<ShardSnapshot>],
    http: &HttpStats,
) -> String {
    let mut page = Page::default();
    let answered: Vec<&ShardSnapshot> = shards.iter().flatten().collect();
    render_build_and_scrape(&mut page, shards);
    render_per_shard(&mut page, &answered);
    render_requests(&mut page, &answered);
    render_shard_config(&mut page, config);
    render_groups(&mut page, catalog, &answered);
    render_bus(&mut page, &answered);
    render_http(&mut page, http);
    page.text
}

/// The build and, per shard, whether it answered this scrape.
fn render_build_and_scrape(page: &mut Page, shards: &[Option<ShardSnapshot>]) {
    page.family("shoal_build_info", Kind::Gauge, "Always 1; the version label names the build.");
    page.sample("shoal_build_info", &[("version", env!("CARGO_PKG_VERSION"))], 1);

    page.family(
        "shoal_shard_scrape_ok",
        Kind::Gauge,
        "1 if the shard answered this scrape in time; without it, its other series are missing.",
    );
    for (index, snapshot) in shards.iter().enumerate() {
        let shard = index.to_string();
        page.sample("shoal_shard_scrape_ok", &[("shard", &shard)], u64::from(snapshot.is_some()));
    }
}

/// One series per answering shard for each of the shard's own figures (a flat table).
fn render_per_shard(page: &mut Page, answered: &[&ShardSnapshot]) {
    type Figure = fn(&ShardSnapshot) -> u64;
    let per_shard: [(&str, Kind, &str, Figure); 65] = [
        (
            "shoal_connections_open",
            Kind::Gauge,
            "Client connections (native and Kafka) the shard serves now.",
            |s| s.connections_open,
        ),
        (
            "shoal_connections_accepted_total",
            Kind::Counter,
            "Client connections (native and Kafka) the shard accepted and served.",
            |s| s.connections_accepted,
        ),
        (
            "shoal_connections_refused_total",
            Kind::Counter,
            "Client connections (native and Kafka) refused at network.connections_max.",
            |s| s.connections_refused,
        ),
        (
            "shoal_connections_idle_closed_total",
            Kind::Counter,
            "Client connections (native and Kafka) closed after network.idle_timeout_ms of silence.",
            |s| s.connections_idle_closed,
        ),
        (
            "shoal_kafka_connections_closed_total",
            Kind::Counter,
            "Kafka connections the shard closed for what their client sent (a malformed or \
             oversized frame, an API or version not served).",
            |s| s.kafka_connections_closed,
        ),
        (
            "shoal_requests_forwarded_total",
            Kind::Counter,
            "Requests the shard's connections handed to another shard, the owner of what they \
             name.",
            |s| s.requests_forwarded,
        ),
        (
            "shoal_network_received_bytes_total",
            Kind::Counter,
            "Bytes of request frames read from the shard's connections.",
            |s| s.received_bytes,
        ),
        (
            "shoal_network_sent_bytes_total",
            Kind::Counter,
            "Bytes of reply frames written to the shard's connections.",
            |s| s.sent_bytes,
        ),
        (
            "shoal_ring_memory_bytes",
            Kind::Gauge,
            "Bytes held by the shard's prepare rings (bounded by ring_budget_bytes).",
            |s| s.ring_bytes,
        ),
        (
            "shoal_write_buffer_chunks",
            Kind::Gauge,
            "Write-buffer chunks the shard has allocated, of any size class (their memory is \
             bounded by chunks_max x chunk_size_bytes).",
            |s| s.chunks_allocated,
        ),
        (
            "shoal_ready_space_bytes",
            Kind::Gauge,
            "Disk space the shard's partitions hold ready ahead of their data (bounded by \
             ready_budget_bytes).",
            |s| s.ready_space_bytes,
        ),
        (
            "shoal_batch_cache_bytes",
            Kind::Gauge,
            "Bytes of batches the shard's batch cache holds for consumers behind the rings \
             (bounded by batch_cache_bytes).",
            |s| s.batch_cache_bytes,
        ),
        (
            "shoal_batch_cache_hits_total",
            Kind::Counter,
            "Offset reads served from the batch cache.",
            |s| s.batch_cache.hits,
        ),
        (
            "shoal_batch_cache_hit_bytes_total",
            Kind::Counter,
            "Bytes of batches served from the batch cache.",
            |s| s.batch_cache.hit_bytes,
        ),
        (
            "shoal_batch_cache_misses_total",
            Kind::Counter,
            "Offset reads that found their start neither in a ring nor in the batch cache and \
             read the disk.",
            |s| s.batch_cache.misses,
        ),
        (
            "shoal_batch_cache_evicted_bytes_total",
            Kind::Counter,
            "Bytes the batch cache let go to make room.",
            |s| s.batch_cache.evicted_bytes,
        ),
        (
            "shoal_read_ahead_reads_total",
            Kind::Counter,
            "Read-ahead disk reads started for consumers reading in order.",
            |s| s.batch_cache.reads_ahead,
        ),
        (
            "shoal_groups",
            Kind::Gauge,
            "Groups (partition replicas, the metadata group included) the shard holds.",
            |s| s.groups.len() as u64,
        ),
        (
            "shoal_flush_cycles_total",
            Kind::Counter,
            "Flush cycles the shard's engine completed.",
            |s| s.engine.flushes,
        ),
        ("shoal_checkpoints_total", Kind::Counter, "Group checkpoints the shard recorded.", |s| {
            s.engine.checkpoints
        }),
        (
            "shoal_superblock_writes_total",
            Kind::Counter,
            "Superblock versions the shard wrote (every copy synced).",
            |s| s.engine.superblock_writes,
        ),
        ("shoal_io_rounds_total", Kind::Counter, "I/O rounds the shard's node layer ran.", |s| {
            s.node.io_rounds
        }),
        (
            "shoal_storage_full_rounds_total",
            Kind::Counter,
            "I/O rounds cut short by a full disk (retried).",
            |s| s.node.storage_full_rounds,
        ),
        (
            "shoal_append_backpressure_total",
            Kind::Counter,
            "Appends the engine refused for lack of room and retried after a flush.",
            |s| s.node.append_backpressure,
        ),
        (
            "shoal_appends_waiting_rounds_total",
            Kind::Counter,
            "I/O rounds in which an append a bound still refused after settling waited (retried).",
            |s| s.node.appends_waiting_rounds,
        ),
        ("shoal_groups_failed_total", Kind::Counter, "Groups stopped by an engine failure.", |s| {
            s.node.groups_failed
        }),
        (
            "shoal_primaries_returned_total",
            Kind::Counter,
            "Hand-overs the shard began to give a group back to its home node, in sync again.",
            |s| s.node.primaries_returned,
        ),
        (
            "shoal_shutdown_hand_overs_total",
            Kind::Counter,
            "Hand-overs the shard began while stopping (controlled shutdown).",
            |s| s.node.shutdown_hand_overs,
        ),
        (
            "shoal_shutdown_groups_without_peer_total",
            Kind::Counter,
            "Groups a stopping shard led but found no peer in sync to hand to (per attempt).",
            |s| s.node.shutdown_groups_without_peer,
        ),
        (
            "shoal_backups_flagged_lagging_total",
            Kind::Counter,
            "Backups this shard's primaries flagged lagging: heard from, not caught up within \
             replica_lag_time_max_ms (from in sync, or from dead when one answers again).",
            |s| s.backups_flagged_lagging,
        ),
        (
            "shoal_backups_flagged_dead_total",
            Kind::Counter,
            "Backups this shard's primaries flagged dead: silent for replica_lag_time_max_ms.",
            |s| s.backups_flagged_dead,
        ),
        (
            "shoal_backups_back_in_sync_total",
            Kind::Counter,
            "Lagging or dead backups this shard's primaries saw in sync again.",
            |s| s.backups_back_in_sync,
        ),
        (
            "shoal_repair_rounds_total",
            Kind::Counter,
            "Repair and state transfer rounds the shard granted its backups (each asks one \
             peer for a run of prepares or one piece of a state).",
            |s| s.node.repair_rounds_granted,
        ),
        (
            "shoal_repair_prepares_requested_total",
            Kind::Counter,
            "Prepares this shard's backups asked peers for in repair rounds.",
            |s| s.repair_prepares_requested,
        ),
        (
            "shoal_repair_rounds_unanswered_total",
            Kind::Counter,
            "Repair rounds that ended without progress, so the next asked another peer.",
            |s| s.repair_rounds_unanswered,
        ),
        (
            "shoal_repair_rounds_extended_total",
            Kind::Counter,
            "Repair rounds given another interval at their deadline because answers were still \
             arriving (instead of asking again for what was on its way).",
            |s| s.repair_rounds_extended,
        ),
        (
            "shoal_repair_rounds_deferred_total",
            Kind::Counter,
            "Ticks on which a due repair round waited for a later tick's ration.",
            |s| s.node.repair_rounds_deferred,
        ),
        (
            "shoal_repair_prepares_served_from_ring_total",
            Kind::Counter,
            "Prepares the shard served to repairing peers from memory (the prepare ring).",
            |s| s.node.prepares_served_from_ring,
        ),
        (
            "shoal_repair_prepares_served_from_disk_total",
            Kind::Counter,
            "Prepares the shard served to repairing peers from its segment files.",
            |s| s.node.prepares_served_from_disk,
        ),
        (
            "shoal_repair_disk_reads_total",
            Kind::Counter,
            "Disk reads the shard ran for repairing peers (each reads a run of consecutive \
             prepares one peer asked for, beside the shard's loop).",
            |s| s.node.serve_disk_reads,
        ),
        (
            "shoal_repair_ranges_evicted_total",
            Kind::Counter,
            "Repair requests for ops retention had removed here (the peer then needs another \
             replica, or a state transfer).",
            |s| s.node.ranges_evicted_sent,
        ),
        (
            "shoal_transfers_installed_total",
            Kind::Counter,
            "Group logs this shard replaced by a state transfer from a peer.",
            |s| s.node.transfers_installed,
        ),
        (
            "shoal_transfer_states_served_total",
            Kind::Counter,
            "Machine states (offsets, metadata) this shard gave for a peer's state transfer.",
            |s| s.transfer_states_served,
        ),
        (
            "shoal_transfer_states_refused_total",
            Kind::Counter,
            "Peers' state transfers this shard's machine could not give its state for.",
            |s| s.transfer_states_refused,
        ),
        (
            "shoal_transfer_states_installed_total",
            Kind::Counter,
            "Machine states from a peer's state transfer that this shard installed.",
            |s| s.transfer_states_installed,
        ),
        (
            "shoal_transfer_states_unusable_total",
            Kind::Counter,
            "Machine states from a peer's state transfer that did not decode (kept its own).",
            |s| s.transfer_states_unusable,
        ),
        (
            "shoal_allocations_total",
            Kind::Counter,
            "Heap allocations made by the shard's thread.",
            |s| s.allocations,
        ),
        (
            "shoal_metadata_snapshot_op",
            Kind::Gauge,
            "Shard 0: the metadata op the newest metadata snapshot covers (0 elsewhere).",
            |s| s.metadata_snapshot_op,
        ),
        (
            "shoal_metadata_snapshots_total",
            Kind::Counter,
            "Shard 0: metadata snapshots saved since the server started.",
            |s| s.metadata_snapshots,
        ),
        (
            "shoal_metadata_replayed_ops",
            Kind::Gauge,
            "Shard 0: metadata ops replayed from the log at start-up, past the snapshot.",
            |s| s.metadata_replayed_ops,
        ),
        (
            "shoal_metadata_duplicate_requests_total",
            Kind::Counter,
            "Shard 0: retried admin requests answered with their original reply from the \
             client table.",
            |s| s.metadata_duplicates,
        ),
        (
            "shoal_retention_deleted_segments_total",
            Kind::Counter,
            "Segments the shard's retention passes deleted.",
            |s| s.retention_segments,
        ),
        (
            "shoal_retention_deleted_bytes_total",
            Kind::Counter,
            "Bytes of segments the shard's retention passes deleted.",
            |s| s.retention_bytes,
        ),
        (
            "shoal_retention_recycled_segments_total",
            Kind::Counter,
            "Of the segments retention deleted, those whose file became the next segment's.",
            |s| s.engine.segments_recycled,
        ),
        (
            "shoal_ring_bytes_taken_back_total",
            Kind::Counter,
            "Bytes of written prepares other partitions' rings gave back to the shard's ring \
             budget for an append whose own ring had none left to evict.",
            |s| s.engine.ring_bytes_taken_back,
        ),
        (
            "shoal_write_chunks_taken_total",
            Kind::Counter,
            "Write-buffer chunks partitions took from the shard's pool: one per chunk a busy \
             partition fills, and one per batch of a partition that goes idle between batches.",
            |s| s.engine.write_chunks_taken,
        ),
        (
            "shoal_write_chunk_bytes_allocated_total",
            Kind::Counter,
            "Bytes of new write-buffer memory the shard's pool allocated. It grows while the \
             pool reaches the memory the rings and the batch cache hold, then stays: chunks are \
             reused. Steady growth means the pool keeps trading memory between chunk sizes.",
            |s| s.engine.write_chunk_bytes_allocated,
        ),
        (
            "shoal_ring_take_back_scans_total",
            Kind::Counter,
            "Walks over the other partitions' rings for room in the shard's ring budget (at \
             most one per flush while the budget holds only unwritten prepares).",
            |s| s.engine.ring_take_back_scans,
        ),
        ("shoal_journal_syncs_total", Kind::Counter, "fdatasyncs of the shard journal.", |s| {
            s.engine.journal_syncs
        }),
        (
            "shoal_segment_syncs_total",
            Kind::Counter,
            "fdatasyncs of segment files (checkpoints and rolls).",
            |s| s.engine.segment_syncs,
        ),
        (
            "shoal_direct_syncs_total",
            Kind::Counter,
            "Direct-path persisted jobs: one partition's segment writes and sync, with a sync mark.",
            |s| s.engine.direct_syncs,
        ),
        (
            "shoal_zero_steps_total",
            Kind::Counter,
            "Steps of space ahead of a direct-path partition's tail written with zeros and synced beside its appends.",
            |s| s.engine.zero_steps,
        ),
        (
            "shoal_filesystem_syncs_total",
            Kind::Counter,
            "File-system syncs (syncfs) that made a flush cycle's direct-path jobs durable at once.",
            |s| s.engine.filesystem_syncs,
        ),
        (
            "shoal_journal_written_bytes_total",
            Kind::Counter,
            "Bytes written to the shard journal.",
            |s| s.engine.journal_bytes_written,
        ),
        (
            "shoal_segment_written_bytes_total",
            Kind::Counter,
            "Bytes written to segment files (data and zeros).",
            |s| s.engine.segment_bytes_written,
        ),
    ];
    for (name, kind, help, figure) in per_shard {
        page.family(name, kind, help);
        for snapshot in answered {
            page.sample(name, &[("shard", &snapshot.shard.to_string())], figure(snapshot));
        }
    }
}

/// The replica bus: per (shard, peer) link figures, and what the bus ports refused.
fn render_bus(page: &mut Page, answered: &[&ShardSnapshot]) {
    type Figure = fn(&BusPeerFigures) -> u64;
    let per_peer: [(&str, Kind, &str, Figure); 8] = [
        (
            "shoal_bus_connected",
            Kind::Gauge,
            "1 while the shard's link to the peer node is up (handshake done).",
            |p| u64::from(p.connected),
        ),
        (
            "shoal_bus_reconnects_total",
            Kind::Counter,
            "Links to the peer established again after the first.",
            |p| p.reconnects,
        ),
        ("shoal_bus_sent_bytes_total", Kind::Counter, "Bytes written to the peer.", |p| {
            p.sent_bytes
        }),
        ("shoal_bus_sent_packets_total", Kind::Counter, "Packets written to the peer.", |p| {
            p.sent_packets
        }),
        ("shoal_bus_received_bytes_total", Kind::Counter, "Bytes read from the peer.", |p| {
            p.received_bytes
        }),
        ("shoal_bus_received_packets_total", Kind::Counter, "Packets read from the peer.", |p| {
            p.received_packets
        }),
        (
            "shoal_bus_dropped_packets_total",
            Kind::Counter,
            "Packets dropped: the peer's send queue or the shard's inbox was full, or the peer's \
             link was down (VSR resends and repairs).",
            |p| p.dropped_packets,
        ),
        (
            "shoal_bus_queued_bytes",
            Kind::Gauge,
            "Bytes of packets waiting in the peer's send queue.",
            |p| p.queued_bytes,
        ),
    ];
    for (name, kind, help, figure) in per_peer {
        page.family(name, kind, help);
        for snapshot in answered {
            let shard = snapshot.shard.to_string();
            for peer in &snapshot.bus_peers {
                let labels = [("shard", shard.as_str()), ("peer", &peer.peer.to_string())];
                page.sample(name, &labels, figure(peer));
            }
        }
    }
    type ShardFigure = fn(&ShardSnapshot) -> u64;
    let per_shard: [(&str, &str, ShardFigure); 2] = [
        (
            "shoal_bus_connections_refused_total",
            "Connections to the shard's bus port closed at the handshake (bad bytes, another \
             cluster or layout, or silence).",
            |s| s.bus_connections_refused,
        ),
        (
            "shoal_bus_frames_rejected_total",
            "Frames on established links that failed the header checks (the link was closed).",
            |s| s.bus_frames_rejected,
        ),
    ];
    for (name, help, figure) in per_shard {
        page.family(name, Kind::Counter, help);
        for snapshot in answered {
            page.sample(name, &[("shard", &snapshot.shard.to_string())], figure(snapshot));
        }
    }
}

/// Requests and errors by operation and code, and the produce and fetch latency histograms.
fn render_requests(page: &mut Page, answered: &[&ShardSnapshot]) {
    let operations = code_labels(|code| Operation::from_u32(code).map(|op| format!("{op:?}")));
    page.family(
        "shoal_requests_total",
        Kind::Counter,
        "Requests decoded on the shard's connections, by operation.",
    );
    for snapshot in answered {
        let shard = snapshot.shard.to_string();
        for (label, count) in by_label(&operations, &snapshot.requests) {
            page.sample("shoal_requests_total", &[("shard", &shard), ("operation", label)], count);
        }
    }
    // Only the served APIs get a series of their own: a page of 60 zero series per shard helps
    // no one, and a key a client sent that is not served is what `other` is for.
    let apis = code_labels(|code| {
        let key = ApiKey::try_from(i16::try_from(code).ok()?).ok()?;
        shoal_kafka::served(key).map(|_| format!("{key:?}"))
    });
    // Each counter by served API; keys not served (or past the slots) together as `other`.
    type ByApi = fn(&ShardSnapshot) -> (&[u64; CODE_SLOTS], u64);
    let by_api: [(&str, &str, ByApi); 2] = [
        (
            "shoal_kafka_requests_total",
            "Kafka requests decoded on the shard's connections, by API.",
            |s| (&s.kafka_requests, s.kafka_requests_other),
        ),
        (
            "shoal_kafka_request_errors_total",
            "Kafka requests answered with an error (top-level or for any partition or topic) or \
             refused by closing their connection, by API.",
            |s| (&s.kafka_errors, s.kafka_errors_other),
        ),
    ];
    for (name, help, counts) in by_api {
        page.family(name, Kind::Counter, help);
        for snapshot in answered {
            let shard = snapshot.shard.to_string();
            let (by_key, other) = counts(snapshot);
            for (label, count) in by_label(&apis, by_key) {
                let (label, count) =
                    if label == "unknown" { ("other", count + other) } else { (label, count) };
                page.sample(name, &[("shard", &shard), ("api", label)], count);
            }
        }
    }
    page.family(
        "shoal_kafka_request_latency_seconds",
        Kind::Histogram,
        "Kafka requests answered on the shard's connections, by API: from the request's header \
         decoded to its response encoded (a produce's commit and a fetch's wait included).",
    );
    for snapshot in answered {
        let shard = snapshot.shard.to_string();
        for (served, histogram) in shoal_kafka::SERVED.iter().zip(&snapshot.kafka_latency) {
            let api = snake_case(&format!("{:?}", served.key));
            let labels = [("shard", shard.as_str()), ("api", api.as_str())];
            page.histogram_labelled("shoal_kafka_request_latency_seconds", &labels, histogram);
        }
    }
    let codes = code_labels(|code| ErrorCode::from_u32(code).map(|error| format!("{error:?}")));
    page.family(
        "shoal_request_errors_total",
        Kind::Counter,
        "Error replies written on the shard's connections, by error code.",
    );
    for snapshot in answered {
        let shard = snapshot.shard.to_string();
        for (label, count) in by_label(&codes, &snapshot.errors) {
            let labels = [("shard", shard.as_str()), ("code", label)];
            page.sample("shoal_request_errors_total", &labels, count);
        }
    }

    type Latency = fn(&ShardSnapshot) -> &HistogramSnapshot;
    let histograms: [(&str, &str, Latency); 2] = [
        (
            "shoal_produce_latency_seconds",
            "Successful produce requests on the shard's connections: from the request decoded \
             to its reply ready to write.",
            |s| &s.produce_latency,
        ),
        (
            "shoal_fetch_latency_seconds",
            "Successful fetch and poll requests on the shard's connections: from the request \
             decoded to its reply ready to write.",
            |s| &s.fetch_latency,
        ),
    ];
    for (name, help, histogram) in histograms {
        page.family(name, Kind::Histogram, help);
        for snapshot in answered {
            page.histogram(name, &snapshot.shard.to_string(), histogram(snapshot));
        }
    }
}

/// Every shard's settings as gauges, and the CPUs its threads are bound to.
fn render_shard_config(page: &mut Page, config: &Config) {
    for (key, _) in config::shard_settings(&config.shard[0]) {
        let name = format!("shoal_shard_config_{key}");
        let help = format!("The shard's {key} setting ([shard], or its [shard.N] override).");
        page.family(&name, Kind::Gauge, &help);
        for (index, settings) in config.shard.iter().enumerate() {
            let value = config::shard_settings(settings)
                .find(|&(name, _)| name == key)
                .map_or(0, |(_, value)| value);
            page.sample(&name, &[("shard", &index.to_string())], value);
        }
    }
    // The CPUs a shard's threads are bound to: only for the shards that are (an absent series
    // means "not pinned", which no number could say).
    type Cpu = fn(&config::ShardSettings) -> Option<usize>;
    let cpus: [(&str, &str, Cpu); 2] = [
        ("shoal_shard_config_cpu", "The CPU the shard's thread is pinned to.", |s| s.cpu),
        ("shoal_shard_config_sqpoll_cpu", "The CPU the shard's SQPOLL thread is bound to.", |s| {
            s.tuning.sqpoll_cpu
        }),
    ];
    for (name, help, cpu) in cpus {
        page.family(name, Kind::Gauge, help);
        for (index, settings) in config.shard.iter().enumerate() {
            if let Some(cpu) = cpu(settings) {
                page.sample(name, &[("shard", &index.to_string())], cpu);
            }
        }
    }
}

/// Per-group figures with the partition's names, and lag and the in-sync set where this node
/// leads.
fn render_groups(page: &mut Page, catalog: &Catalog, answered: &[&ShardSnapshot]) {
    let names: HashMap<u64, (String, String, String)> = catalog
        .partition_infos()
        .into_iter()
        .map(|(stream, topic, info)| (info.group, (stream, topic, info.partition.to_string())))
        .collect();
    let unnamed = (String::new(), String::new(), String::new());
    type GroupFigure = fn(&GroupFigures) -> u64;
    let per_group: [(&str, &str, GroupFigure); 10] = [
        (
            "shoal_partition_next_offset",
            "The partition's log end offset: the offset its next message gets.",
            |g| g.next_offset,
        ),
        (
            "shoal_partition_committed_offset",
            "The offset after the partition's last committed message: consumers read below it.",
            |g| g.committed_offset,
        ),
        (
            "shoal_partition_first_offset",
            "The oldest offset the partition still holds (retention moves it).",
            |g| g.first_offset,
        ),
        ("shoal_partition_commit_op", "The highest op the partition's group committed.", |g| {
            g.commit_op
        }),
        ("shoal_partition_view", "The view the partition's replica is in.", |g| g.view),
        (
            "shoal_partition_status",
            "The partition's replica: 0 normal, 1 in a view change, 2 recovering (restarted, \
             waiting for its view's primary).",
            |g| g.status,
        ),
        ("shoal_partition_primary", "1 if this node's replica leads the partition's group.", |g| {
            u64::from(g.primary)
        }),
        ("shoal_partition_segments", "Segment files the partition holds.", |g| g.segments),
        ("shoal_partition_size_bytes", "Bytes of records in the partition's segments.", |g| {
            g.size_bytes
        }),
        (
            "shoal_partition_failed",
            "1 if the partition stopped serving (storage damage or an I/O error).",
            |g| u64::from(g.failed),
        ),
    ];
    for (name, help, figure) in per_group {
        page.family(name, Kind::Gauge, help);
        for snapshot in answered {
            let shard = snapshot.shard.to_string();
            for group in &snapshot.groups {
                let (stream, topic, partition) = names.get(&group.group).unwrap_or(&unnamed);
                let id = group.group.to_string();
                let labels = [
                    ("shard", shard.as_str()),
                    ("group", id.as_str()),
                    ("stream", stream.as_str()),
                    ("topic", topic.as_str()),
                    ("partition", partition.as_str()),
                ];
                page.sample(name, &labels, figure(group));
            }
        }
    }

    // Lag and the in-sync set (DESIGN.md §4): only the primary knows them, so a group has these
    // series on the shard of its primary only.
    let group_labels = |shard: &str, group: &GroupFigures| -> Vec<(&'static str, String)> {
        let (stream, topic, partition) = names.get(&group.group).unwrap_or(&unnamed);
        vec![
            ("shard", shard.to_string()),
            ("group", group.group.to_string()),
            ("stream", stream.clone()),
            ("topic", topic.clone()),
            ("partition", partition.clone()),
        ]
    };
    page.family(
        "shoal_group_in_sync_replicas",
        Kind::Gauge,
        "Members of the group's in-sync set (the primary and every backup neither lagging nor \
         dead), on the shard of the group's primary.",
    );
    for snapshot in answered {
        let shard = snapshot.shard.to_string();
        for group in &snapshot.groups {
            if let Some(in_sync) = group.in_sync_replicas {
                let labels = group_labels(&shard, group);
                page.sample("shoal_group_in_sync_replicas", &borrowed(&labels), in_sync);
            }
        }
    }
    type Member = fn(&MemberFigures) -> u64;
    let per_member: [(&str, &str, Member); 3] = [
        (
            "shoal_group_replica_lag_ms",
            "Milliseconds since the member was last caught up with the primary's head (0 for the \
             primary), on the shard of the group's primary.",
            |m| m.lag_ms,
        ),
        (
            "shoal_group_replica_state",
            "The member as the group's primary sees it: 0 in sync (the primary too), 1 lagging \
             (heard from, not caught up within replica_lag_time_max_ms), 2 dead (silent that \
             long); on the shard of the group's primary.",
            |m| m.state,
        ),
        (
            "shoal_group_replica_lag_ops",
            "Ops the member's acknowledgements trail the primary's head (0 for the primary), on \
             the shard of the group's primary.",
            |m| m.lag_ops,
        ),
    ];
    for (name, help, figure) in per_member {
        page.family(name, Kind::Gauge, help);
        for snapshot in answered {
            let shard = snapshot.shard.to_string();
            for group in &snapshot.groups {
                for member in &group.members {
                    let mut labels = group_labels(&shard, group);
                    labels.push(("replica", member.replica.to_string()));
                    page.sample(name, &borrowed(&labels), figure(member));
                }
            }
        }
    }
    page.family(
        "shoal_out_of_sync_replicas",
        Kind::Gauge,
        "Members lagging or dead, summed over the groups the shard leads: the figure to alert on \
         (0 when every group this node leads has every replica in sync).",
    );
    for snapshot in answered {
        let out_of_sync: u64 = snapshot
            .groups
            .iter()
            .map(|g| g.members.iter().filter(|m| m.state != 0).count() as u64)
            .sum();
        page.sample(
            "shoal_out_of_sync_replicas",
            &[("shard", &snapshot.shard.to_string())],
            out_of_sync,
        );
    }
}

/// The metrics endpoint's own responses and refused connections.
fn render_http(page: &mut Page, http: &HttpStats) {
    page.family(
        "shoal_metrics_http_responses_total",
        Kind::Counter,
        "Responses of the metrics endpoint before this one, by status code.",
    );
    for (status, count) in http::STATUSES.iter().zip(http.responses) {
        let code = status.code().to_string();
        page.sample("shoal_metrics_http_responses_total", &[("code", &code)], count);
    }
    page.family(
        "shoal_metrics_http_connections_refused_total",
        Kind::Counter,
        "Metrics connections closed unanswered because the endpoint served its maximum.",
    );
    page.sample("shoal_metrics_http_connections_refused_total", &[], http.connections_refused);
}

/// Owned label values as the pairs [`Page::sample`] takes.
fn borrowed<'a>(labels: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    labels.iter().map(|(label, value)| (*label, value.as_str())).collect()
}

/// The label of every code below [`CODE_SLOTS`] that `name` knows, in `snake_case`; the others
/// (and slot 0) are counted together as `unknown`.
fn code_labels(name: impl Fn(u32) -> Option<String>) -> Vec<Option<String>> {
    (0..CODE_SLOTS as u32).map(|code| name(code).map(|name| snake_case(&name))).collect()
}

/// Each known code's count under its label, then `unknown` with every other code's.
fn by_label<'a>(
    labels: &'a [Option<String>],
    counts: &[u64; CODE_SLOTS],
) -> impl Iterator<Item = (&'a str, u64)> {
    let unknown: u64 =
        labels.iter().zip(counts).filter(|(label, _)| label.is_none()).map(|(_, n)| n).sum();
    let known = labels.iter().zip(counts).filter_map(|(label, &n)| Some((label.as_deref()?, n)));
    known.chain(std::iter::once(("unknown", unknown)))
}

/// `CreateStream` → `create_stream`.
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (index, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if index > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// A metric family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A page of the text format being written.
#[derive(Default)]
struct Page {
    text: String,
}

impl Page {
    /// Starts a family: its `# HELP` and `# TYPE` lines.
    fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {}", Escaped::help(help));
        let _ = writeln!(self.text, "# TYPE {name} {}", kind.as_str());
    }

    /// One sample line.
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl fmt::Display) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (index, (label, value)) in labels.iter().enumerate() {
                if index > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{label}=\"{}\"", Escaped::label(value));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    /// A histogram's samples: cumulative buckets ending with `+Inf`, then `_sum` and `_count`.
    fn histogram(&mut self, name: &str, shard: &str, histogram: &HistogramSnapshot) {
        self.histogram_labelled(name, &[("shard", shard)], histogram);
    }

    /// [`Page::histogram`] with `labels` (the bucket's `le` after them).
    fn histogram_labelled(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        histogram: &HistogramSnapshot,
    ) {
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        for (index, count) in histogram.buckets.iter().enumerate() {
            cumulative += count;
            let le = LATENCY_BOUNDS_NS.get(index).map_or("+Inf".to_string(), |&ns| seconds(ns));
            let mut with_le = labels.to_vec();
            with_le.push(("le", &le));
            self.sample(&bucket, &with_le, cumulative);
        }
        let sum = histogram.sum_ns as f64 / 1e9;
        self.sample(&format!("{name}_sum"), labels, sum);
        self.sample(&format!("{name}_count"), labels, histogram.count());
    }
}

/// `ns` nanoseconds as exact decimal seconds (`10000` → `0.00001`), with no float rounding.
fn seconds(ns: u64) -> String {
    let whole = ns / 1_000_000_000;
    let fraction = ns % 1_000_000_000;
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:09}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// Text escaped for the text format: in a label value `\`, `"` and newline; in help text `\`
/// and newline.
struct Escaped<'a> {
    text: &'a str,
    quotes: bool,
}

impl<'a> Escaped<'a> {
    fn label(text: &'a str) -> Self {
        Escaped { text, quotes: true }
    }

    fn help(text: &'a str) -> Self {
        Escaped { text, quotes: false }
    }
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.text.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '"' if self.quotes => f.write_str("\\\"")?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_at_or_above_them() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(10_000), 0, "a bound is inclusive (le)");
        assert_eq!(bucket_of(10_001), 1);
        assert_eq!(bucket_of(1_000_000_000), 15);
        assert_eq!(bucket_of(10_000_000_000), 18);
        assert_eq!(bucket_of(10_000_000_001), 19, "past the last bound: +Inf only");
        assert_eq!(bucket_of(u64::MAX), 19);
        assert!(LATENCY_BOUNDS_NS.windows(2).all(|pair| pair[0] < pair[1]));

        let histogram = Histogram::default();
        for micros in [5, 10, 11, 2_000_000, 20_000_000] {
            histogram.record(Duration::from_micros(micros));
        }
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.count(), 5);
        assert_eq!(snapshot.buckets[0], 2);
        assert_eq!(snapshot.buckets[1], 1);
        assert_eq!(snapshot.buckets[16], 1, "2 s is in le=2.5");
        assert_eq!(snapshot.buckets[19], 1);
        assert_eq!(snapshot.sum_ns, 22_000_026_000);
        histogram.record(Duration::MAX);
        assert_eq!(histogram.snapshot().sum_ns, u64::MAX, "the sum saturates");
    }

    #[test]
    fn a_histogram_renders_cumulative_buckets_ending_in_inf_equal_to_count() {
        let histogram = Histogram::default();
        for micros in [5, 300, 300, 20_000_000] {
            histogram.record(Duration::from_micros(micros));
        }
        let mut page = Page::default();
        page.histogram("h_seconds", "0", &histogram.snapshot());
        let lines: Vec<&str> = page.text.lines().collect();
        assert_eq!(lines[0], "h_seconds_bucket{shard=\"0\",le=\"0.00001\"} 1");
        assert_eq!(lines[4], "h_seconds_bucket{shard=\"0\",le=\"0.00025\"} 1");
        assert_eq!(lines[5], "h_seconds_bucket{shard=\"0\",le=\"0.0005\"} 3");
        assert_eq!(lines[18], "h_seconds_bucket{shard=\"0\",le=\"10\"} 3");
        assert_eq!(lines[19], "h_seconds_bucket{shard=\"0\",le=\"+Inf\"} 4");
        assert_eq!(lines[20], "h_seconds_sum{shard=\"0\"} 20.000605");
        assert_eq!(lines[21], "h_seconds_count{shard=\"0\"} 4");
        assert_eq!(lines.len(), 22);
    }

    #[test]
    fn seconds_are_exact_decimals() {
        assert_eq!(seconds(10_000), "0.00001");
        assert_eq!(seconds(2_500_000), "0.0025");
        assert_eq!(seconds(1_000_000_000), "1");
        assert_eq!(seconds(2_500_000_000), "2.5");
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut page = Page::default();
        page.family("m", Kind::Gauge, "a \\ b\nc \"q\"");
        page.sample("m", &[("a", "x\\y\"z\nw"), ("b", "")], 7);
        assert_eq!(
            page.text,
            "# HELP m a \\\\ b\\nc \"q\"\n# TYPE m gauge\nm{a=\"x\\\\y\\\"z\\nw\",b=\"\"} 7\n"
        );
    }

    #[test]
    fn codes_are_labelled_by_name_and_the_rest_counted_as_unknown() {
        assert_eq!(snake_case("CreateStream"), "create_stream");
        assert_eq!(snake_case("Hello"), "hello");
        let metrics = Rc::new(ShardMetrics::default());
        metrics.request(Operation::Produce as u32);
        metrics.request(Operation::Produce as u32);
        metrics.request(0);
        metrics.request(CODE_SLOTS as u32 - 1);
        metrics.request(u32::MAX);
        let labels = code_labels(|code| Operation::from_u32(code).map(|op| format!("{op:?}")));
        let requests: [u64; CODE_SLOTS] = std::array::from_fn(|i| metrics.requests[i].get());
        let counted: Vec<(&str, u64)> = by_label(&labels, &requests).collect();
        assert!(counted.contains(&("produce", 2)), "{counted:?}");
        assert!(counted.contains(&("fetch", 0)), "{counted:?}");
        assert_eq!(counted.last(), Some(&("unknown", 3)));
        let mut names: Vec<&str> = counted.iter().map(|(label, _)| *label).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), counted.len(), "one series per label");
    }

    #[test]
    fn an_open_connection_counts_until_dropped() {
        let metrics = Rc::new(ShardMetrics::default());
        let first = metrics.connection_opened();
        let second = metrics.connection_opened();
        drop(first);
        assert_eq!(metrics.connections_open.get(), 1);
        assert_eq!(metrics.connections_accepted.get(), 2);
        drop(second);
        assert_eq!(metrics.connections_open.get(), 0);
    }
}
