//! One shard: a thread with its own io_uring runtime that owns the shard's storage and replicas
//! (the node layer over the io_uring backend), serves the connections it accepts, and executes
//! the work routed to its partitions from any shard.
//!
//! Everything a shard owns is touched by its loop alone: connection tasks and other shards hand
//! it [`Work`] through its bounded inbox, and it answers through each item's reply slot. Between
//! inbox batches it ticks the replicas, runs one I/O round (which makes everything submitted
//! meanwhile durable together), answers what committed, and, on shard 0, applies committed
//! metadata and publishes the new catalog. It never shares mutable state with another shard; the
//! published catalog is immutable and read through [`Published`].
//!
//! The shard's `[shard]` tuning is applied here: its runtime's ring (`uring_entries`, SQPOLL),
//! direct or buffered files (`direct_io`), how long the loop holds new writes back before an I/O
//! round so that more of them share one flush cycle ([`FlushGate`], `flush_delay_us_max`), and
//! the segment age its new partitions get (`segment_age_ms_max`).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::pending;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use monoio::net::{ListenerOpts, TcpListener};
use shoal_engine::batch::{BatchBuilder, BatchHeader};
use shoal_engine::checksum;
use shoal_engine::partition::{DiskReadDone, ReadPlan};
use shoal_engine::protocol::consumer::{
    self, ConsumerId, GroupMember, GroupRef, JoinGroup, OffsetCommitRecord,
};
use shoal_engine::protocol::{ErrorCode, FetchFrom, FetchReply, ProduceReply};
use shoal_engine::ring::StoredPrepare;
use shoal_engine::shard::{ShardConfig, group_dir, shard_dir};
use shoal_engine::state::{self, GroupState};
use shoal_engine::storage::uring::UringStorage;
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_engine::wire::ClientRequest;
use shoal_replication::{
    Clock, Committed, Node, NodeConfig, ReplicaConfig, ReplyResult, Request, RequestRefused,
    Status, TICK_MS, Transport,
};

use crate::config::{Config, ShardTuning};
use crate::connection;
use crate::groups::{self, Coordinator};
use crate::metadata::{Catalog, METADATA_GROUP, MetaCommand, MetaReply, MetaState, Published};
use crate::metrics::{self, ShardMetrics, ShardSnapshot};
use crate::offsets::PartitionOffsets;

/// The cluster id of a single node until cluster configuration arrives.
pub const CLUSTER: u64 = 1;

/// Whether accepted writes go to their groups at once (always, except under the
/// `canary-ack-on-receipt` canary, which holds them until the next tick).
const SUBMIT_AT_ONCE: bool = !cfg!(feature = "canary-ack-on-receipt");

/// How long a stopping shard waits for its connections to write the replies they owe.
const SHUTDOWN_REPLIES_TIME_MAX: Duration = Duration::from_secs(2);

/// Ticks between two retention passes over the shard's groups.
const RETENTION_INTERVAL_TICKS: u64 = 100;

/// Consumers whose offsets one partition stores at most.
pub const CONSUMERS_PER_PARTITION_MAX: usize = 65_536;

/// A partition group's state snapshot is saved once its log has grown (or shrunk) by this
/// much since the last one, or its offsets changed: restart replays at most about this much of
/// each log to rebuild its consumer offsets.
const STATE_SNAPSHOT_INTERVAL_BYTES: u64 = 16 << 20;

/// Ticks a recovering shard may take to bring every group back to normal before it gives up.
const RECOVERY_TICKS_MAX: u32 = 10_000;

/// The answer to one request: an error code (`0`: success) and the reply body.
#[derive(Debug)]
pub struct Outcome {
    /// `0` or an [`ErrorCode`].
    pub error: u32,
    /// The result, or the error's text.
    pub body: Body,
}

/// A reply body. A produce result travels unencoded, so the hot path allocates no buffer for
/// it: the connection's writer encodes it into its reused frame buffer.
#[derive(Debug)]
pub enum Body {
    /// Bytes already encoded.
    Encoded(Vec<u8>),
    /// A produce result.
    Produce(ProduceReply),
}

impl Outcome {
    /// A success with this body.
    pub fn ok(body: Vec<u8>) -> Outcome {
        Outcome { error: 0, body: Body::Encoded(body) }
    }

    /// A produce success.
    pub fn produced(reply: ProduceReply) -> Outcome {
        Outcome { error: 0, body: Body::Produce(reply) }
    }

    /// An error with its text.
    pub fn error(code: ErrorCode, text: impl Into<String>) -> Outcome {
        Outcome { error: code as u32, body: Body::Encoded(text.into().into_bytes()) }
    }
}

/// Where a request's answer goes: the waiting connection.
pub type Slot = flume::Sender<Outcome>;

/// Where a fetch starts, resolved on the owning shard.
#[derive(Clone, Copy, Debug)]
pub struct FetchArgs {
    /// Partition index (for the reply).
    pub partition: u32,
    /// Start.
    pub from: FetchFrom,
    /// Byte limit.
    pub bytes_max: u32,
    /// Record limit.
    pub count_max: u32,
    /// Long-poll: how long to wait for data when nothing committed is at the start yet.
    pub wait_ms_max: u32,
}

/// A partition's figures, for describe and status.
#[derive(Clone, Copy, Debug, Default)]
pub struct GroupStats {
    /// First offset held.
    pub first_offset: u64,
    /// Log end offset.
    pub next_offset: u64,
    /// Bytes on disk.
    pub size_bytes: u64,
}

/// Something for a shard's loop to do.
pub enum Work {
    /// Append a validated batch to a partition group owned here.
    Produce {
        /// The group.
        group: u64,
        /// The partition (for the reply).
        partition: u32,
        /// The write.
        request: Request,
        /// The answer.
        reply: Slot,
    },
    /// Read from a partition group owned here.
    Fetch {
        /// The group.
        group: u64,
        /// What to read.
        args: FetchArgs,
        /// The answer.
        reply: Slot,
    },
    /// A metadata change (shard 0 only).
    Metadata {
        /// The request's header fields (client and request number go into the log).
        client: ClientRequest,
        /// The change.
        command: MetaCommand,
        /// The answer.
        reply: Slot,
    },
    /// A new catalog: create the partition groups it places here.
    Catalog(Arc<Catalog>),
    /// Report these groups' figures.
    Stats {
        /// The groups.
        groups: Vec<u64>,
        /// The answer.
        reply: flume::Sender<Vec<(u64, GroupStats)>>,
    },
    /// Store or delete a consumer's offset in a partition group owned here (a control record
    /// in the group's log).
    StoreOffset {
        /// The group.
        group: u64,
        /// The request's header fields (the commit is a write of this client's).
        client: ClientRequest,
        /// The commit.
        record: OffsetCommitRecord,
        /// The answer.
        reply: Slot,
    },
    /// Read a consumer's stored offset in a partition group owned here.
    GetOffset {
        /// The group.
        group: u64,
        /// Whose.
        consumer: ConsumerId,
        /// The answer.
        reply: Slot,
    },
    /// A consumer group request (shard 0 only: the coordinator).
    Group {
        /// What is asked.
        request: GroupRequest,
        /// The answer.
        reply: Slot,
    },
    /// Fetch from a consumer's stored offset in a partition group owned here.
    Poll {
        /// The group.
        group: u64,
        /// Limits and wait (`from` is resolved here, from the stored offset).
        args: FetchArgs,
        /// Whose offset.
        consumer: ConsumerId,
        /// Commit past what is returned before answering.
        auto_commit: bool,
        /// The request's header fields (an auto-commit is a write of this client's).
        client: ClientRequest,
        /// The answer.
        reply: Slot,
    },
    /// Report the shard's own figures.
    Report {
        /// The answer.
        reply: flume::Sender<ShardReport>,
    },
    /// Report the shard's metrics (a scrape of the metrics endpoint).
    Metrics {
        /// The answer.
        reply: flume::Sender<ShardSnapshot>,
    },
    /// Nothing: wakes the loop to look at its local completions.
    Wake,
}

/// A consumer group request for the coordinator.
pub enum GroupRequest {
    /// Join (or rejoin) a group.
    Join(JoinGroup),
    /// Keep a member alive; answered with its assignment.
    Heartbeat(GroupMember),
    /// Leave a group.
    Leave(GroupMember),
}

/// A shard's own figures, for status.
#[derive(Clone, Copy, Debug)]
pub struct ShardReport {
    /// The shard.
    pub shard: u32,
    /// Groups it holds (the metadata group included).
    pub groups: usize,
    /// Heap allocations its thread has made since it started.
    pub allocations: u64,
    /// I/O rounds its node layer has run.
    pub io_rounds: u64,
}

/// Every shard's inbox.
pub type Mesh = Arc<Vec<flume::Sender<Work>>>;

/// What a shard thread needs to start.
pub struct ShardSpec {
    pub index: u32,
    /// The whole node's configuration; this shard's part is `config.shard[index]`.
    pub config: Arc<Config>,
    /// Where to listen: the configured address for shard 0, the address shard 0 bound for the
    /// others (so a configured port 0 becomes one shared port).
    pub listen: SocketAddr,
    pub stop: Arc<AtomicBool>,
    /// The bound listener address (or why binding failed).
    pub bound: Sender<Result<SocketAddr, String>>,
    /// This shard's own listener (`[network] shard_listen`), bound by `main` before any shard
    /// starts, so that every shard can name every shard's address from its first `Hello`.
    pub own_listener: Option<std::net::TcpListener>,
    /// Every shard's own listener address, by shard (empty: none).
    pub shard_addresses: Arc<Vec<String>>,
    /// What recovery found (or why it failed).
    pub ready: Sender<Result<String, String>>,
    /// This shard's inbox.
    pub inbox: flume::Receiver<Work>,
    /// Every shard's inbox, this one's included.
    pub mesh: Mesh,
    /// The catalog shard 0 publishes.
    pub published: Arc<Published>,
    /// Open connections on the whole node.
    pub connections: Arc<AtomicUsize>,
    /// Shard 0 only: the bound metrics listener, served on this shard's runtime.
    pub metrics_listener: Option<std::net::TcpListener>,
}

/// Creates the inboxes of `shards` shards.
pub fn mesh(shards: u32, inbox_max: usize) -> (Mesh, Vec<flume::Receiver<Work>>) {
    let (senders, receivers) = (0..shards).map(|_| flume::bounded(inbox_max)).unzip();
    (Arc::new(senders), receivers)
}

/// A single node has no peers: nothing is ever sent.
struct NoPeers;

impl Transport for NoPeers {
    fn send(&mut self, _to: u8, _packet: Bytes) {}
}

/// The wall clock, read only here, outside the node layer.
struct WallClock;

impl Clock for WallClock {
    fn now_ms(&self) -> i64 {
        now_ms()
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

type ShardNode = Node<UringStorage, NoPeers, WallClock>;

/// Runs the shard until the stop flag is set, then shuts its storage down cleanly.
pub fn run(spec: ShardSpec) -> Result<(), String> {
    let settings = &spec.config.shard[spec.index as usize];
    if let Some(cpu) = settings.cpu
        && !core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
    {
        let message = format!("shard {}: cannot pin to CPU {cpu}", spec.index);
        let _ = spec.bound.send(Err(message.clone()));
        return Err(message);
    }
    let mut runtime = match build_runtime(&settings.tuning) {
        Ok(runtime) => runtime,
        Err(error) => {
            let message = format!(
                "shard {}: cannot build its io_uring runtime ({} entries, SQPOLL {}): {error}",
                spec.index,
                settings.tuning.uring_entries,
                match (settings.tuning.sqpoll_idle_ms, settings.tuning.sqpoll_cpu) {
                    (0, _) => "off".to_string(),
                    (idle, cpu) => format!("idle {idle} ms on CPU {cpu:?}"),
                }
            );
            let _ = spec.bound.send(Err(message.clone()));
            return Err(message);
        }
    };
    runtime.block_on(serve(spec))
}

type ShardRuntime = monoio::Runtime<monoio::time::TimeDriver<monoio::IoUringDriver>>;

/// The shard's monoio runtime on the io_uring driver with the ring its tuning asks for. Never
/// falls back to epoll: a shard without io_uring would be a different, untested server.
fn build_runtime(tuning: &ShardTuning) -> std::io::Result<ShardRuntime> {
    let mut ring = io_uring::IoUring::builder();
    if tuning.sqpoll_idle_ms > 0 {
        // The kernel thread polls the submission queue, so submitting costs no system call
        // while it is awake; it sleeps after the idle time and the next submit wakes it (monoio
        // submits through io-uring's `submit`, which sets IORING_ENTER_SQ_WAKEUP when needed).
        ring.setup_sqpoll(tuning.sqpoll_idle_ms);
        // Bound to its own CPU: an unbound polling thread inherits the shard thread's affinity
        // (seen on kernel 6.18) and would spin on the shard's CPU. The config refuses SQPOLL
        // without one, so this is always set here.
        if let Some(cpu) = tuning.sqpoll_cpu {
            ring.setup_sqpoll_cpu(u32::try_from(cpu).unwrap_or(u32::MAX));
        }
    }
    monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .enable_timer()
        .with_entries(tuning.uring_entries)
        .uring_builder(ring)
        .build()
}

/// The storage backend the shard's tuning asks for: direct I/O where the filesystem allows it,
/// or buffered everywhere.
fn storage_for(tuning: &ShardTuning) -> UringStorage {
    if tuning.direct_io { UringStorage::new() } else { UringStorage::buffered() }
}

/// Group commit for the shard's loop (`flush_delay_us_max`): decides when the writes that
/// arrived since the last I/O round may start one. With a delay of 0 a round starts as soon as
/// anything is pending, as if there were no gate; otherwise the first write that finds no round
/// due opens a window of the delay, and every write arriving within it joins the same round (and
/// so the same flush cycle). It reads no clock: the loop passes `now` in.
#[derive(Clone, Copy, Debug)]
pub struct FlushGate {
    delay: Duration,
    /// When the oldest write not yet handed to a round arrived.
    pending_since: Option<Instant>,
}

impl FlushGate {
    /// A gate holding writes for at most `delay_us_max` microseconds.
    pub fn new(delay_us_max: u32) -> FlushGate {
        FlushGate { delay: Duration::from_micros(u64::from(delay_us_max)), pending_since: None }
    }

    /// Whether a round may start now, given whether writes wait for one. A `true` answer is
    /// taken as the round starting: the window closes with it.
    pub fn open(&mut self, now: Instant, writes_pending: bool) -> bool {
        if self.delay.is_zero() {
            return true;
        }
        if !writes_pending {
            self.pending_since = None;
            return true;
        }
        let since = *self.pending_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= self.delay {
            self.pending_since = None;
            return true;
        }
        false
    }

    /// When a window that is open now closes (the loop must wake by then).
    pub fn deadline(&self) -> Option<Instant> {
        self.pending_since.map(|since| since + self.delay)
    }
}

/// Where a read's result goes: a fetch's slot, or a poll's (which may commit first).
enum ReadFor {
    Fetch(Slot),
    Poll(PollFor),
}

struct PollFor {
    consumer: ConsumerId,
    /// Where the poll starts at the earliest: past control records it skipped.
    skipped_to: u64,
    auto_commit: bool,
    client: ClientRequest,
    reply: Slot,
}

/// A disk read finished by a spawned task, for the loop to complete.
struct ReadDone {
    group: u64,
    args: FetchArgs,
    done: DiskReadDone,
    to: ReadFor,
}

/// A group state snapshot saved (or not) by a spawned task.
struct StateSaved {
    group: u64,
    /// The op it covers.
    op: u64,
    end_offset: u64,
    size_bytes: u64,
    result: shoal_engine::Result<()>,
}

/// A fetch waiting for its group's committed log to reach its start (long-poll).
struct ParkedFetch {
    args: FetchArgs,
    deadline: Instant,
    to: ReadFor,
}

/// A write accepted by this shard, waiting for its reply.
struct PendingWrite {
    kind: WriteKind,
    reply: Slot,
}

enum WriteKind {
    Produce {
        partition: u32,
        record_count: u32,
    },
    /// A stored offset: answered empty once committed.
    Offset(OffsetCommitRecord),
    /// A poll's auto-commit: the poll's answer goes out once the commit is committed.
    PollCommit {
        record: OffsetCommitRecord,
        answer: Outcome,
    },
}

/// The shard's state, owned by its loop.
struct ShardState {
    index: u32,
    config: Arc<Config>,
    node: ShardNode,
    mesh: Mesh,
    published: Arc<Published>,
    catalog: Arc<Catalog>,
    /// Shard 0 only: the authoritative catalog and the metadata requests awaiting their apply.
    metadata: Option<MetadataState>,
    /// Writes (produce, offset commits) in a group's pipeline, by (group, client, request).
    pending: HashMap<(u64, u64, u64), PendingWrite>,
    /// Writes waiting for room in their group's pipeline, oldest first.
    waiting: BTreeMap<u64, VecDeque<(Request, PendingWrite)>>,
    waiting_count: usize,
    /// Disk reads completed by their tasks.
    reads_done: Rc<RefCell<Vec<ReadDone>>>,
    /// Per group, the offset after its last committed message: consumers read below it only.
    committed_end: HashMap<u64, u64>,
    /// Fetches waiting for their group's committed log to grow, by group.
    parked: HashMap<u64, Vec<ParkedFetch>>,
    parked_count: usize,
    /// Per partition group, its consumers' stored offsets.
    offsets: HashMap<u64, PartitionOffsets>,
    /// Consumers whose poll's auto-commit is in flight: their next poll waits for it.
    commits_in_flight: HashSet<(u64, ConsumerId)>,
    /// Snapshot saves completed by their tasks.
    states_saved: Rc<RefCell<Vec<StateSaved>>>,
    /// The node's random seed (distinct per start).
    node_seed: u64,
    /// The shard's files: direct or buffered, as its tuning says.
    storage: UringStorage,
    /// The shard's tuning (`[shard]` and its `[shard.N]`).
    tuning: ShardTuning,
    /// Holds new writes back to gather more of them per flush cycle.
    flush_gate: FlushGate,
    /// Counters this loop and its connections keep (see `metrics`).
    metrics: Rc<ShardMetrics>,
    /// Groups refusing writes for lack of disk space at the last tick (logged when it changes).
    storage_full_groups: usize,
    /// Canary: the offset each group's next acknowledged-on-receipt write is promised.
    #[cfg(feature = "canary-ack-on-receipt")]
    predicted_offsets: HashMap<u64, u64>,
}

/// What [`ShardState::replay_metadata`] rebuilt, and from where.
struct RecoveredMetadata {
    state: MetaState,
    /// The op the restored snapshot covers (0: none restored).
    snapshot_op: u64,
    /// Ops applied from the log past it.
    replayed_ops: u64,
    /// A snapshot existed but could not be used.
    snapshot_unusable: bool,
    /// The offset after the last op in `state` (where a snapshot of it would resume).
    end_offset: u64,
}

struct MetadataState {
    /// The catalog and the client table, as of the last applied op.
    state: MetaState,
    /// Who waits for each proposed request, by the proposal's (client, request): usually its
    /// client alone, plus any retry of the same session's request that arrived meanwhile.
    /// The value also names the proposal's session (0: none).
    pending: HashMap<(u64, u64), (u64, Vec<MetaWaiter>)>,
    /// The proposal of each registered session's request in flight, by (session, request), so
    /// that a retry joins it (and is answered once it commits) rather than entering the log
    /// again: the client table would answer a second copy anyway, but one copy is cheaper.
    in_flight: HashMap<(u64, u64), (u64, u64)>,
    /// The op the newest snapshot covers (saved, or restored at start-up).
    snapshot_op: u64,
    /// Whether a snapshot save is running (its task owns the group's new-snapshot file).
    snapshot_saving: bool,
    /// A snapshot is wanted before the interval is up (the one found at start-up was unusable).
    snapshot_due: bool,
    /// The consumer group coordinator.
    coordinator: Coordinator<Slot>,
    /// The client id of the coordinator's own proposals (random per start) and its next request.
    internal_client: u64,
    internal_request: u64,
}

impl MetadataState {
    /// Everyone waiting for the proposal (client, request), which is done with.
    fn take_waiters(&mut self, client: u64, request: u64) -> Option<Vec<MetaWaiter>> {
        let (session, waiters) = self.pending.remove(&(client, request))?;
        if session != 0 {
            self.in_flight.remove(&(session, request));
        }
        Some(waiters)
    }
}

/// Retries of one in-flight metadata request that may wait for it (each from a connection, whose
/// requests in flight are bounded too); one more is told to retry later.
const META_WAITERS_MAX: usize = 16;

/// Who waits for a metadata command: a client, or the coordinator's rebalance of a group.
enum MetaWaiter {
    Client(Slot),
    Rebalance(GroupRef),
}

async fn serve(spec: ShardSpec) -> Result<(), String> {
    let opts = ListenerOpts::new().reuse_port(true);
    let listener = match TcpListener::bind_with_config(spec.listen, &opts) {
        Ok(listener) => listener,
        Err(error) => {
            let message = format!("cannot listen on {}: {error}", spec.listen);
            let _ = spec.bound.send(Err(message.clone()));
            return Err(message);
        }
    };
    // The shard's own listener is advertised (readiness line, Hello) as soon as main bound it,
    // so a shard that cannot serve it must not start.
    let own_listener = match spec.own_listener.map(TcpListener::from_std).transpose() {
        Ok(own) => own,
        Err(error) => {
            let message = format!("shard {}: cannot serve its own listener: {error}", spec.index);
            let _ = spec.bound.send(Err(message.clone()));
            return Err(message);
        }
    };
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let _ = spec.bound.send(Ok(address));

    let started = Instant::now();
    let index = spec.index;
    let dir = shard_dir(&spec.config.data_dir, index);
    let shard_config =
        ShardConfig { cluster: CLUSTER, ..spec.config.shard[index as usize].storage.clone() };
    let mut replica = ReplicaConfig::new(CLUSTER, 0, 1, 0);
    // A group of one has nobody to ask for a StartView: probing would only delay its return.
    replica.start_view_probes_max = 0;
    let node_config = NodeConfig {
        message_size_bytes_max: shard_config.record_size_bytes_max + (64 << 10),
        ..NodeConfig::new(0, replica)
    };
    let seed = u64::from(index) ^ now_ms() as u64;
    let tuning = spec.config.shard[index as usize].tuning;
    let storage = storage_for(&tuning);
    // Each partition's producer table comes back from its state snapshot (the section after
    // its consumer offsets) plus the log past it; the node layer replays the log.
    let load_producers = {
        let (storage, dir) = (storage.clone(), dir.clone());
        async move |group: u64| -> Option<Vec<u8>> {
            // The metadata group's `state` file is the metadata snapshot, and its log holds no
            // idempotent batches.
            if group == METADATA_GROUP {
                return None;
            }
            let saved = state::load(&storage, &group_dir(&dir, group)).await.ok()??;
            let (_, producers) = PartitionOffsets::decode_snapshot(&saved.bytes).ok()?;
            producers.map(<[u8]>::to_vec)
        }
    };
    let open = Node::open_with_producer_snapshots(
        storage.clone(),
        &dir,
        shard_config,
        node_config,
        NoPeers,
        WallClock,
        seed,
        load_producers,
    );
    let (node, report) = match open.await {
        Ok(opened) => opened,
        Err(error) => {
            let message = format!("shard {index}: recovery of {} failed: {error}", dir.display());
            let _ = spec.ready.send(Err(message.clone()));
            return Err(message);
        }
    };
    let mut state = ShardState {
        index,
        config: Arc::clone(&spec.config),
        node,
        mesh: Arc::clone(&spec.mesh),
        published: Arc::clone(&spec.published),
        catalog: Arc::new(Catalog::new(spec.config.shards, 0)),
        metadata: None,
        pending: HashMap::new(),
        waiting: BTreeMap::new(),
        waiting_count: 0,
        reads_done: Rc::new(RefCell::new(Vec::new())),
        node_seed: seed,
        storage,
        tuning,
        flush_gate: FlushGate::new(tuning.flush_delay_us_max),
        committed_end: HashMap::new(),
        parked: HashMap::new(),
        parked_count: 0,
        offsets: HashMap::new(),
        commits_in_flight: HashSet::new(),
        states_saved: Rc::new(RefCell::new(Vec::new())),
        metrics: Rc::new(ShardMetrics::default()),
        storage_full_groups: 0,
        #[cfg(feature = "canary-ack-on-receipt")]
        predicted_offsets: HashMap::new(),
    };
    let mut early = Vec::new();
    if let Err(error) = state.start(&spec.inbox, &spec.stop, &mut early).await {
        let message = format!("shard {index}: start-up of {} failed: {error}", dir.display());
        let _ = spec.ready.send(Err(message.clone()));
        return Err(message);
    }
    let failed: Vec<String> = state
        .node
        .group_ids()
        .into_iter()
        .filter_map(|g| state.node.group_failure(g).map(|why| format!("group {g}: {why}")))
        .collect();
    let _ = spec.ready.send(Ok(format!(
        "shard {index}: recovered {} groups ({} stopped{}{}) in {:?} from {}",
        report.groups.len(),
        failed.len(),
        if failed.is_empty() { "" } else { ": " },
        failed.join("; "),
        started.elapsed(),
        dir.display()
    )));

    let replies_owed = Rc::new(std::cell::Cell::new(0));
    let acceptor = Rc::new(connection::Acceptor {
        shard: index,
        shard_addresses: Arc::clone(&spec.shard_addresses),
        replies_owed: Rc::clone(&replies_owed),
        config: Arc::clone(&spec.config),
        mesh: Arc::clone(&spec.mesh),
        published: Arc::clone(&spec.published),
        connections: Arc::clone(&spec.connections),
        stop: Arc::clone(&spec.stop),
        metrics: Rc::clone(&state.metrics),
    });
    let accepting = monoio::spawn(connection::Acceptor::run(Rc::clone(&acceptor), listener));
    let accepting_own =
        own_listener.map(|own| monoio::spawn(connection::Acceptor::run(acceptor, own)));
    if let Some(listener) = spec.metrics_listener {
        let exporter = metrics::Exporter {
            config: Arc::clone(&spec.config),
            mesh: Arc::clone(&spec.mesh),
            published: Arc::clone(&spec.published),
        };
        monoio::spawn(crate::http::serve(listener, exporter, Arc::clone(&spec.stop)));
    }

    for work in early {
        state.handle(work).await;
    }
    state.serve(&spec.inbox, &spec.stop).await;
    // Let the connections write the replies of what was finished (bounded): new requests are
    // refused with ShuttingDown by the readers, and work still arriving is refused here.
    let deadline = Instant::now() + SHUTDOWN_REPLIES_TIME_MAX;
    while replies_owed.get() > 0 && Instant::now() < deadline {
        while let Ok(work) = spec.inbox.try_recv() {
            refuse(work);
        }
        monoio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(accepting);
    drop(accepting_own);
    state.node.close().await.map_err(|e| format!("shard {index}: shutdown: {e}"))
}

impl ShardState {
    /// Brings every recovered group back to normal, and the catalog up: shard 0 creates or
    /// replays the metadata group and publishes; the others wait for its first catalog (work
    /// arriving meanwhile is kept in `early`).
    async fn start(
        &mut self,
        inbox: &flume::Receiver<Work>,
        stop: &AtomicBool,
        early: &mut Vec<Work>,
    ) -> Result<(), String> {
        // The op and offset the metadata replay ended at.
        let mut recovered_end = (0, 0);
        if self.index == 0 {
            let groups_max = self.node.shard_config().groups_max as u32;
            let sessions_max = self.config.metadata.sessions_max;
            let mut state = MetaState::new(self.config.shards, groups_max, sessions_max);
            let mut snapshot_op = 0;
            let mut snapshot_due = false;
            if self.node.group_ids().contains(&METADATA_GROUP) {
                let recovered = self.replay_metadata().await?;
                snapshot_due = recovered.snapshot_unusable;
                snapshot_op = recovered.snapshot_op;
                recovered_end = (recovered.state.catalog.applied_op, recovered.end_offset);
                self.metrics.metadata_recovered(recovered.snapshot_op, recovered.replayed_ops);
                tracing::info!(
                    snapshot_op = recovered.snapshot_op,
                    replayed_ops = recovered.replayed_ops,
                    applied_op = recovered.state.catalog.applied_op,
                    sessions = recovered.state.clients.len(),
                    "metadata recovered"
                );
                state = recovered.state;
            } else {
                let config = GroupConfig {
                    durability: Durability::Persisted,
                    segment_size_bytes: shoal_engine::superblock::SEGMENT_SIZE_BYTES_MIN * 8,
                    segment_age_ms_max: 0,
                    ..GroupConfig::default()
                };
                let config = GroupConfig {
                    record_size_bytes_max: config
                        .record_size_bytes_max
                        .min(self.node.shard_config().record_size_bytes_max as u32),
                    ..config
                };
                self.node
                    .create_group(METADATA_GROUP, config)
                    .await
                    .map_err(|e| format!("creating the metadata group: {e}"))?;
            }
            let mut coordinator = Coordinator::new(format!("{:x}", now_ms()));
            coordinator.seed(&state.catalog, now_ms());
            self.metadata = Some(MetadataState {
                state,
                pending: HashMap::new(),
                in_flight: HashMap::new(),
                snapshot_op,
                snapshot_saving: false,
                snapshot_due,
                coordinator,
                internal_client: self.node_seed | (1 << 63),
                internal_request: 0,
            });
        }
        let mut ticks = 0;
        while !self.all_normal() {
            ticks += 1;
            if ticks > RECOVERY_TICKS_MAX || stop.load(Ordering::SeqCst) {
                return Err(format!("groups not back to normal after {RECOVERY_TICKS_MAX} ticks"));
            }
            self.node.on_tick();
            // Recovery's rounds skip the flush gate: nothing waits to join them, and the loop
            // here does not sleep until the gate's deadline.
            self.round(false).await;
        }
        self.recover_committed_ends().await;
        self.recover_offsets().await;
        let applied = self.metadata.as_ref().map(|m| m.state.catalog.applied_op);
        if applied == Some(recovered_end.0) {
            // Replaces an unusable snapshot now, or one the replay found far behind (ops applied
            // since, on the way back to normal, made their own saves).
            self.save_metadata_snapshot(recovered_end.1);
        }
        if let Some(metadata) = &self.metadata {
            self.publish(Arc::new(metadata.state.catalog.clone()));
        }
        // Shard 0 sent its own catalog to its inbox too; every shard now waits for it.
        loop {
            if stop.load(Ordering::SeqCst) {
                return Err("stopped during start-up".into());
            }
            let work = monoio::select! {
                work = inbox.recv_async() => work,
                _ = monoio::time::sleep(Duration::from_millis(TICK_MS)) => continue,
            };
            match work {
                Ok(Work::Catalog(catalog)) => {
                    self.install(catalog).await;
                    return Ok(());
                }
                Ok(other) => early.push(other),
                Err(_) => return Err("every inbox sender is gone".into()),
            }
        }
    }

    /// Learns where each recovered group's committed log ends: the replica restarts knowing its
    /// commit op, and the offset after that op is in the op's prepare.
    async fn recover_committed_ends(&mut self) {
        for group in self.node.group_ids() {
            if self.committed_end.contains_key(&group) {
                continue;
            }
            let Some(commit) = self.node.replica(group).map(|r| r.commit()) else { continue };
            if !self.node.has_log(group) {
                continue;
            }
            let end = if commit == 0 {
                0
            } else {
                match self.node.read_op(group, commit).await {
                    Ok(Some(prepare)) => prepare.end_offset(),
                    // A failed or damaged group serves no reads; nothing of it is visible.
                    _ => 0,
                }
            };
            self.committed_end.insert(group, end);
        }
    }

    /// Rebuilds every partition group's consumer offsets: its snapshot, then the committed log
    /// past it (a damaged or missing snapshot means the whole log still held). Retention then
    /// keeps whatever the snapshot does not cover.
    async fn recover_offsets(&mut self) {
        let shard_dir = shard_dir(&self.config.data_dir, self.index);
        let storage = self.storage.clone();
        for group in self.node.group_ids() {
            if group == METADATA_GROUP || self.node.group_failure(group).is_some() {
                continue;
            }
            let committed_end = self.committed_end.get(&group).copied().unwrap_or(0);
            let dir = group_dir(&shard_dir, group);
            let mut offsets = PartitionOffsets::default();
            let mut replay_from = 0;
            match state::load(&storage, &dir).await {
                Ok(Some(saved)) => match PartitionOffsets::decode(&saved.bytes) {
                    Ok(table) => {
                        offsets = table;
                        offsets.snapshot_end = saved.end_offset;
                        replay_from = saved.end_offset;
                    }
                    Err(why) => tracing::warn!(
                        shard = self.index,
                        group,
                        why,
                        "offsets snapshot unreadable; rebuilding offsets from the log"
                    ),
                },
                Ok(None) => {}
                Err(error) => tracing::warn!(
                    shard = self.index,
                    group,
                    %error,
                    "offsets snapshot unusable; rebuilding offsets from the log"
                ),
            }
            let Some(log) = self.node.log_stats(group) else { continue };
            offsets.snapshot_size_bytes = log.size_bytes;
            let mut offset = replay_from.max(log.first_offset);
            let mut replayed = 0;
            'scan: while offset < committed_end {
                let prepares = match self.node.read_offset(group, offset, 1 << 20).await {
                    Ok(prepares) if !prepares.is_empty() => prepares,
                    other => {
                        let result = format!("{other:?}");
                        tracing::error!(
                            shard = self.index,
                            group,
                            offset,
                            result,
                            "offsets replay stopped"
                        );
                        break;
                    }
                };
                for prepare in prepares {
                    if prepare.end_offset() > committed_end {
                        break 'scan;
                    }
                    if prepare.end_offset() <= offset {
                        continue;
                    }
                    offset = prepare.end_offset();
                    match OffsetCommitRecord::from_batch(&prepare.body()) {
                        Some(Ok(record)) => {
                            offsets.apply(record);
                            replayed += 1;
                        }
                        Some(Err(error)) => tracing::error!(
                            shard = self.index,
                            group,
                            offset = prepare.base_offset(),
                            %error,
                            "an offset commit record does not decode; skipped"
                        ),
                        None => {}
                    }
                }
            }
            offsets.dirty = replayed > 0 || offsets.snapshot_end == 0;
            self.node.set_retention_floor(group, offsets.snapshot_end);
            self.offsets.insert(group, offsets);
        }
    }

    /// Starts a snapshot save (a spawned task) for every partition group whose offsets changed
    /// or whose log moved by the snapshot interval since its last one, one save per group at a
    /// time. The snapshot is the table as of the committed end, which the loop keeps in step.
    fn save_states(&mut self) {
        let shard_dir = shard_dir(&self.config.data_dir, self.index);
        for (&group, offsets) in self.offsets.iter_mut() {
            let Some(log) = self.node.log_stats(group) else { continue };
            let size_bytes = log.size_bytes;
            let moved = size_bytes.abs_diff(offsets.snapshot_size_bytes);
            let end_offset = self.committed_end.get(&group).copied().unwrap_or(0);
            // Retention deletes nothing the newest snapshot does not cover: a log with sealed
            // segments past it and a retention bound needs a new one.
            let over_bound = log.retention_bytes > 0 && size_bytes > log.retention_bytes;
            let retention_held = (over_bound || log.retention_ms > 0)
                && log.segments > 1
                && end_offset > offsets.snapshot_end;
            if offsets.saving
                || !(offsets.dirty || retention_held || moved >= STATE_SNAPSHOT_INTERVAL_BYTES)
            {
                continue;
            }
            let Some(replica) = self.node.replica(group) else { continue };
            let (op, producers) = (replica.commit(), replica.producers());
            let saved =
                GroupState { op, end_offset, bytes: offsets.encode_snapshot(&producers.encode()) };
            offsets.producers_saved_op = producers.op();
            offsets.saving = true;
            offsets.dirty = false;
            let dir = group_dir(&shard_dir, group);
            let done = Rc::clone(&self.states_saved);
            let wake = self.mesh[self.index as usize].clone();
            let storage = self.storage.clone();
            monoio::spawn(async move {
                let result = state::save(&storage, &dir, &saved).await;
                done.borrow_mut().push(StateSaved { group, op, end_offset, size_bytes, result });
                let _ = wake.try_send(Work::Wake);
            });
        }
    }

    /// Takes in finished snapshot saves: retention may now delete what each one covers.
    fn finish_state_saves(&mut self) {
        let saved: Vec<StateSaved> = std::mem::take(&mut *self.states_saved.borrow_mut());
        for StateSaved { group, op, end_offset, size_bytes, result } in saved {
            if group == METADATA_GROUP {
                self.finish_metadata_snapshot(op, result);
                continue;
            }
            let Some(offsets) = self.offsets.get_mut(&group) else { continue };
            offsets.saving = false;
            match result {
                Ok(()) => {
                    offsets.snapshot_end = end_offset;
                    offsets.snapshot_size_bytes = size_bytes;
                    self.node.set_retention_floor(group, end_offset);
                }
                Err(error) => {
                    offsets.dirty = true;
                    tracing::error!(shard = self.index, group, %error, "offsets snapshot failed");
                }
            }
        }
    }

    /// At shutdown: saves every changed table and waits for it, so the next start replays
    /// nothing.
    async fn save_states_now(&mut self) {
        let shard_dir = shard_dir(&self.config.data_dir, self.index);
        let storage = self.storage.clone();
        for (&group, offsets) in self.offsets.iter_mut() {
            let Some(replica) = self.node.replica(group) else { continue };
            let producers = replica.producers();
            // A save in flight owns the group's new-snapshot file; what it misses is replayed.
            let producers_moved = producers.op() > offsets.producers_saved_op;
            if !(offsets.dirty || producers_moved) || offsets.saving {
                continue;
            }
            let end_offset = self.committed_end.get(&group).copied().unwrap_or(0);
            let op = replica.commit();
            let saved =
                GroupState { op, end_offset, bytes: offsets.encode_snapshot(&producers.encode()) };
            if let Err(error) = state::save(&storage, &group_dir(&shard_dir, group), &saved).await {
                tracing::error!(shard = self.index, group, %error, "offsets snapshot failed");
            }
        }
    }

    /// Starts a save of the metadata state (a spawned task) once `metadata.snapshot_interval_ops`
    /// ops were applied since the newest snapshot, one save at a time. The state is encoded
    /// here, as of `end_offset` (the offset after the last applied op), so the task needs
    /// nothing of the loop's.
    fn save_metadata_snapshot(&mut self, end_offset: u64) {
        let interval = self.config.metadata.snapshot_interval_ops;
        let Some(metadata) = self.metadata.as_mut() else { return };
        let op = metadata.state.catalog.applied_op;
        let due = metadata.snapshot_due || op.saturating_sub(metadata.snapshot_op) >= interval;
        if !due || metadata.snapshot_saving || op == 0 {
            return;
        }
        metadata.snapshot_saving = true;
        metadata.snapshot_due = false;
        let saved = GroupState { op, end_offset, bytes: metadata.state.encode_snapshot() };
        let dir = group_dir(&shard_dir(&self.config.data_dir, self.index), METADATA_GROUP);
        let done = Rc::clone(&self.states_saved);
        let wake = self.mesh[self.index as usize].clone();
        let storage = self.storage.clone();
        monoio::spawn(async move {
            let result = state::save(&storage, &dir, &saved).await;
            let size_bytes = saved.bytes.len() as u64;
            let group = METADATA_GROUP;
            done.borrow_mut().push(StateSaved { group, op, end_offset, size_bytes, result });
            let _ = wake.try_send(Work::Wake);
        });
    }

    /// Takes in a finished metadata snapshot save. The metadata log has no retention, so
    /// nothing is deleted: the snapshot only shortens the replay at start-up.
    fn finish_metadata_snapshot(&mut self, op: u64, result: shoal_engine::Result<()>) {
        let Some(metadata) = self.metadata.as_mut() else { return };
        metadata.snapshot_saving = false;
        match result {
            Ok(()) => {
                metadata.snapshot_op = op;
                self.metrics.metadata_snapshot_saved(op);
                tracing::debug!(op, "metadata snapshot saved");
            }
            Err(error) => {
                // Tried again once the interval is up again; the log still holds everything.
                metadata.snapshot_op = op;
                tracing::error!(op, %error, "metadata snapshot failed");
            }
        }
    }

    fn all_normal(&self) -> bool {
        self.node.group_ids().into_iter().all(|group| {
            self.node.group_failure(group).is_some()
                || self.node.replica(group).is_some_and(|r| r.status() == Status::Normal)
        })
    }

    /// Rebuilds the metadata state: the newest snapshot, then the committed log past it (up to
    /// what the recovered replica knows committed); ops committed later arrive through the
    /// normal path. A snapshot that is damaged, does not decode or is ahead of the log is not
    /// used: the whole log is replayed instead, which it still holds because the metadata group
    /// has no retention (if it ever lost its first ops, start-up refuses with the reason).
    async fn replay_metadata(&mut self) -> Result<RecoveredMetadata, String> {
        let commit = self.node.replica(METADATA_GROUP).map_or(0, |r| r.commit());
        let groups_max = self.node.shard_config().groups_max as u32;
        let (shards, sessions_max) = (self.config.shards, self.config.metadata.sessions_max);
        let dir = group_dir(&shard_dir(&self.config.data_dir, self.index), METADATA_GROUP);
        let loaded = state::load(&self.storage, &dir).await;
        let Some(log) = self.node.log_stats(METADATA_GROUP) else {
            return Err("metadata group vanished".into());
        };
        if let Some(reason) = self.node.log_fault(METADATA_GROUP) {
            return Err(format!("the metadata log is damaged: {reason}"));
        }
        let fresh = || MetaState::new(shards, groups_max, sessions_max);
        let mut recovered = RecoveredMetadata {
            state: fresh(),
            snapshot_op: 0,
            replayed_ops: 0,
            snapshot_unusable: false,
            end_offset: 0,
        };
        let mut offset = log.first_offset;
        let restored = match loaded {
            Ok(None) => Ok(None),
            Ok(Some(saved)) if saved.op > log.head_op => {
                Err(format!("it covers op {} but the log ends at op {}", saved.op, log.head_op))
            }
            Ok(Some(saved)) => {
                MetaState::decode_snapshot(&saved.bytes, shards, groups_max, sessions_max)
                    .map_err(|e| format!("it does not decode: {e}"))
                    .and_then(|state| {
                        if state.catalog.applied_op == saved.op {
                            Ok(Some((state, saved.end_offset)))
                        } else {
                            Err(format!(
                                "its state is at op {}, its header says {}",
                                state.catalog.applied_op, saved.op
                            ))
                        }
                    })
            }
            Err(error) => Err(error.to_string()),
        };
        match restored {
            Ok(None) => {}
            Ok(Some((state, end_offset))) => {
                recovered.snapshot_op = state.catalog.applied_op;
                recovered.state = state;
                recovered.end_offset = end_offset;
                offset = end_offset.max(offset);
            }
            Err(why) if log.first_offset == 0 => {
                tracing::warn!(
                    why,
                    path = %dir.display(),
                    "metadata snapshot unusable; replaying the whole metadata log instead"
                );
                recovered.snapshot_unusable = true;
            }
            Err(why) => {
                return Err(format!(
                    "the metadata snapshot in {} is unusable ({why}) and the metadata log no \
                     longer starts at its first op, so it cannot be rebuilt",
                    dir.display()
                ));
            }
        }
        while recovered.state.catalog.applied_op < commit {
            let prepares = self
                .node
                .read_offset(METADATA_GROUP, offset, 1 << 20)
                .await
                .map_err(|e| format!("reading the metadata log: {e}"))?;
            if prepares.is_empty() {
                return Err(format!(
                    "metadata log ends at op {} below its commit {commit}",
                    recovered.state.catalog.applied_op
                ));
            }
            for prepare in prepares {
                let fields = *shoal_engine::record::prepare_of(&prepare.header);
                offset = fields.end_offset();
                if fields.op <= recovered.state.catalog.applied_op || fields.op > commit {
                    continue;
                }
                apply_metadata(&mut recovered.state, &prepare);
                recovered.replayed_ops += 1;
                recovered.end_offset = offset;
            }
        }
        Ok(recovered)
    }

    /// Publishes `catalog` to every shard (this one included, through its inbox).
    fn publish(&mut self, catalog: Arc<Catalog>) {
        self.published.publish(Arc::clone(&catalog));
        for inbox in self.mesh.iter() {
            // Never block a shard's loop on a full inbox (its own could deadlock it): a shard
            // that misses this update installs the published catalog when a request names a
            // group it does not hold yet (`ensure_group`), or with the next update.
            let _ = inbox.try_send(Work::Catalog(Arc::clone(&catalog)));
        }
    }

    /// Installs a catalog: creates every partition group it places here that does not exist.
    async fn install(&mut self, catalog: Arc<Catalog>) {
        if catalog.applied_op < self.catalog.applied_op {
            return;
        }
        let existing = self.node.group_ids();
        for (group, config) in catalog.groups_on(self.index) {
            if existing.contains(&group) {
                continue;
            }
            // The roll age is this shard's choice, not the topic's (docs/configuration.md, "Per-
            // shard topic defaults"); the superblock slot keeps it for the partition's life.
            let config =
                GroupConfig { segment_age_ms_max: self.tuning.segment_age_ms_max, ..config };
            match self.node.create_group(group, config).await {
                Ok(()) => {
                    self.committed_end.insert(group, 0);
                    self.offsets.insert(group, PartitionOffsets::default());
                    // Nothing may be deleted before a snapshot covers it.
                    self.node.set_retention_floor(group, 0);
                }
                Err(error) => {
                    tracing::error!(shard = self.index, group, %error, "cannot create group");
                }
            }
        }
        self.catalog = catalog;
    }

    async fn serve(&mut self, inbox: &flume::Receiver<Work>, stop: &AtomicBool) {
        let tick = Duration::from_millis(TICK_MS);
        let mut next_tick = Instant::now() + tick;
        let mut ticks: u64 = 0;
        let batch_max = self.config.network.shard_inbox_max;
        while !stop.load(Ordering::SeqCst) {
            // Wake for the tick, or sooner for the writes the flush gate holds.
            let wake_at = self.flush_gate.deadline().map_or(next_tick, |d| d.min(next_tick));
            let wait = wake_at.saturating_duration_since(Instant::now());
            // A flush cycle finishing wakes the loop too: its replies go out and the next
            // cycle starts with whatever arrived meanwhile.
            let node = &mut self.node;
            let first = monoio::select! {
                work = inbox.recv_async() => work.ok(),
                _ = monoio::time::sleep(wait) => None,
                _ = async {
                    if node.io_in_flight() { node.wait_io().await } else { pending().await }
                } => None,
            };
            if let Some(work) = first {
                self.handle(work).await;
                for _ in 0..batch_max {
                    match inbox.try_recv() {
                        Ok(work) => self.handle(work).await,
                        Err(_) => break,
                    }
                }
            }
            self.finish_reads();
            self.finish_state_saves();
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + tick;
                self.node.on_tick();
                self.expire_parked();
                self.expire_members();
                ticks += 1;
                if ticks.is_multiple_of(RETENTION_INTERVAL_TICKS) {
                    self.save_states();
                    self.enforce_retention().await;
                }
                self.log_storage_full();
                if !SUBMIT_AT_ONCE {
                    self.submit_waiting();
                }
            }
            self.round(true).await;
        }
        // Finish what was accepted (to the end: nothing may stay in flight); refuse what is
        // still queued.
        self.node.run_io().await;
        self.answer_replies();
        self.apply_committed().await;
        self.save_states_now().await;
        if let Some(metadata) = self.metadata.as_mut() {
            for slot in metadata.coordinator.drain_joins() {
                let _ = slot.send(Outcome::error(ErrorCode::ShuttingDown, "shutting down"));
            }
        }
        while let Ok(work) = inbox.try_recv() {
            refuse(work);
        }
        for (_, pending) in self.pending.drain() {
            let _ = pending.reply.send(Outcome::error(ErrorCode::ShuttingDown, "shutting down"));
        }
        for (_, parked) in self.parked.drain() {
            for fetch in parked {
                let outcome = Outcome::error(ErrorCode::ShuttingDown, "shutting down");
                fetch.to.reply().send_outcome(outcome);
            }
        }
        for (_, queue) in std::mem::take(&mut self.waiting) {
            for (_, pending) in queue {
                let _ =
                    pending.reply.send(Outcome::error(ErrorCode::ShuttingDown, "shutting down"));
            }
        }
    }

    /// Says when partitions start or stop refusing writes for lack of disk space (once per
    /// change, checked every tick).
    fn log_storage_full(&mut self) {
        let full = self.node.storage_full_group_count();
        if full == self.storage_full_groups {
            return;
        }
        if full > 0 {
            tracing::warn!(
                shard = self.index,
                partitions = full,
                "storage full: these partitions refuse produce with StorageFull until disk space \
                 is freed"
            );
        } else {
            tracing::info!(shard = self.index, "disk space is back: writes go through again");
        }
        self.storage_full_groups = full;
    }

    /// Deletes sealed segments beyond each topic's retention, and counts what it deleted.
    async fn enforce_retention(&mut self) {
        let before = metrics::stored_bytes(&self.node);
        match self.node.enforce_retention(now_ms()).await {
            Ok(0) => {}
            Ok(segments) => {
                let bytes = before.saturating_sub(metrics::stored_bytes(&self.node));
                self.metrics.retention(segments, bytes);
                tracing::debug!(shard = self.index, segments, bytes, "retention deleted segments");
            }
            Err(error) => tracing::error!(shard = self.index, %error, "retention failed"),
        }
    }

    /// Starts an I/O round if anything is pending (its flush runs on while the loop takes more
    /// work) and, when `gated`, the flush gate lets the writes waiting for it go now; then sends
    /// every answer that is ready.
    async fn round(&mut self, gated: bool) {
        let due = !gated || self.flush_gate.open(Instant::now(), self.node.writes_queued() > 0);
        if due && self.node.has_io() {
            self.node.start_io().await;
        }
        self.answer_replies();
        self.apply_committed().await;
        if SUBMIT_AT_ONCE {
            self.submit_waiting();
        }
    }

    /// Canary (DESIGN.md §7): acknowledges a write on receipt with the offset it will get,
    /// before it is in the log, let alone durable; the writes themselves wait for the next tick.
    /// The kill -9 test must catch it.
    #[cfg(feature = "canary-ack-on-receipt")]
    fn ack_on_receipt(
        &mut self,
        group: u64,
        partition: u32,
        record_count: u32,
        reply: Slot,
    ) -> Slot {
        let stored = self.node.log_stats(group).map_or(0, |log| log.next_offset);
        let next = self.predicted_offsets.entry(group).or_insert(stored);
        *next = (*next).max(stored);
        let base_offset = *next;
        *next += u64::from(record_count);
        let _ =
            reply.send(Outcome::produced(ProduceReply { partition, base_offset, record_count }));
        flume::bounded(1).0
    }

    async fn handle(&mut self, work: Work) {
        match work {
            Work::Produce { group, partition, request, reply } => {
                self.ensure_group(group).await;
                if let Some(busy) = self.writes_busy() {
                    let _ = reply.send(busy);
                    return;
                }
                let record_count = request.record_count;
                #[cfg(feature = "canary-ack-on-receipt")]
                let reply = self.ack_on_receipt(group, partition, record_count, reply);
                let kind = WriteKind::Produce { partition, record_count };
                self.queue_write(group, request, PendingWrite { kind, reply });
            }
            Work::StoreOffset { group, client, record, reply } => {
                self.ensure_group(group).await;
                self.store_offset(group, client, record, WriteKind::Offset, reply);
            }
            Work::GetOffset { group, consumer, reply } => {
                self.ensure_group(group).await;
                let stored = self.offsets.get(&group).and_then(|o| o.get(&consumer));
                let _ = reply.send(Outcome::ok(consumer::encode_stored_offset(stored)));
            }
            Work::Group { request, reply } => self.group_request(request, reply),
            Work::Poll { group, args, consumer, auto_commit, client, reply } => {
                self.ensure_group(group).await;
                let to =
                    ReadFor::Poll(PollFor { consumer, skipped_to: 0, auto_commit, client, reply });
                self.fetch(group, args, to);
            }
            Work::Fetch { group, args, reply } => {
                self.ensure_group(group).await;
                self.fetch(group, args, ReadFor::Fetch(reply));
            }
            Work::Metadata { client, command, reply } => {
                self.propose_metadata(client, command, MetaWaiter::Client(reply))
            }
            Work::Catalog(catalog) => self.install(catalog).await,
            Work::Stats { groups, reply } => {
                let stats = groups
                    .into_iter()
                    .map(|group| {
                        let stats =
                            self.node.log_stats(group).map_or(GroupStats::default(), |log| {
                                GroupStats {
                                    first_offset: log.first_offset,
                                    next_offset: log.next_offset,
                                    size_bytes: log.size_bytes,
                                }
                            });
                        (group, stats)
                    })
                    .collect();
                let _ = reply.send(stats);
            }
            Work::Report { reply } => {
                let _ = reply.send(ShardReport {
                    shard: self.index,
                    groups: self.node.group_ids().len(),
                    allocations: crate::alloc::allocations_on_this_thread(),
                    io_rounds: self.node.counters().io_rounds,
                });
            }
            Work::Metrics { reply } => {
                let figures =
                    metrics::snapshot(self.index, &self.metrics, &self.node, &self.committed_end);
                let _ = reply.send(figures);
            }
            Work::Wake => {}
        }
    }

    /// A request may reach this shard before the catalog that placed its group here does (when
    /// shard 0 found this inbox full), or after creating the group failed (a full disk had no
    /// room for its directory): install the published catalog, which creates what is missing.
    async fn ensure_group(&mut self, group: u64) {
        if !self.node.has_log(group) {
            let mut latest = Arc::clone(&self.catalog);
            self.published.refresh(&mut latest);
            self.install(latest).await;
        }
    }

    /// The refusal of one more write when the shard's queue of waiting writes is full.
    fn writes_busy(&self) -> Option<Outcome> {
        (self.waiting_count >= self.config.network.shard_inbox_max).then(|| {
            Outcome::error(
                ErrorCode::Busy,
                format!("shard {} has too many writes waiting", self.index),
            )
        })
    }

    /// Queues a write for its group's pipeline (submitted at once unless the canary holds it).
    fn queue_write(&mut self, group: u64, request: Request, pending: PendingWrite) {
        self.waiting.entry(group).or_default().push_back((request, pending));
        self.waiting_count += 1;
        if SUBMIT_AT_ONCE {
            self.submit_waiting();
        }
    }

    /// Proposes an offset commit: a one-record control batch in the partition's own log, under
    /// the requesting client's header fields, answered as `kind` says once committed.
    fn store_offset(
        &mut self,
        group: u64,
        client: ClientRequest,
        record: OffsetCommitRecord,
        kind: impl FnOnce(OffsetCommitRecord) -> WriteKind,
        reply: Slot,
    ) -> bool {
        if let Some(busy) = self.writes_busy() {
            let _ = reply.send(busy);
            return false;
        }
        let table = self.offsets.entry(group).or_default();
        if record.offset.is_some()
            && let Err(full) = table.check_room(&record.consumer, CONSUMERS_PER_PARTITION_MAX)
        {
            let _ = reply.send(Outcome::error(
                ErrorCode::LimitReached,
                format!(
                    "a partition stores the offsets of at most {} consumers",
                    full.consumers_max
                ),
            ));
            return false;
        }
        let now = now_ms();
        let batch = record.to_batch(now);
        let request = Request {
            client: client.client,
            session: client.session,
            request: client.request,
            body_checksum: checksum::crc32c(&batch),
            body: BytesMut::from(&batch[..]),
            record_count: 1,
            first_timestamp_ms: now,
            max_timestamp_ms: now,
            append_time_ms: now,
        };
        let kind = kind(record);
        // Canary (DESIGN.md §7): a stored offset is answered and applied without entering the
        // log, so a restart loses it; the offsets restart test must catch it.
        #[cfg(feature = "canary-offsets-unlogged")]
        if let WriteKind::Offset(record) = &kind {
            table.apply(record.clone());
            let _ = reply.send(Outcome::ok(Vec::new()));
            return true;
        }
        self.queue_write(group, request, PendingWrite { kind, reply });
        true
    }

    /// Hands waiting writes to their groups while their pipelines have room.
    fn submit_waiting(&mut self) {
        if self.waiting_count == 0 {
            return;
        }
        let mut refused = Vec::new();
        // Empty queues stay in the map (at most one per group), so a steady stream of writes
        // allocates no queue per request.
        for (&group, queue) in self.waiting.iter_mut() {
            while !queue.is_empty() {
                let room = match self.node.replica(group) {
                    Some(replica)
                        if self.node.group_failure(group).is_none()
                            && !self.node.is_storage_full(group) =>
                    {
                        replica.status() == Status::Normal
                            && replica.op() - replica.commit()
                                < replica.config().pipeline_prepares_max
                    }
                    // on_client_request answers a missing or failed group, or one whose storage
                    // is full, at once: such a write must not wait behind a pipeline that
                    // itself waits for disk space.
                    _ => true,
                };
                if !room {
                    break;
                }
                let Some((request, pending)) = queue.pop_front() else { break };
                self.waiting_count -= 1;
                let key = (group, request.client, request.request);
                if self.pending.contains_key(&key) {
                    let text =
                        format!("request {} of this client is already in flight", request.request);
                    refused.push((group, pending, Outcome::error(ErrorCode::InvalidRequest, text)));
                    continue;
                }
                match self.node.on_client_request(group, request) {
                    Ok(()) => {
                        self.pending.insert(key, pending);
                    }
                    Err(why) => {
                        let outcome = refusal(&why);
                        refused.push((group, pending, outcome));
                    }
                }
            }
        }
        for (group, pending, outcome) in refused {
            if let WriteKind::PollCommit { record, .. } = &pending.kind {
                self.commits_in_flight.remove(&(group, record.consumer.clone()));
            }
            let _ = pending.reply.send(outcome);
        }
    }

    fn answer_replies(&mut self) {
        let mut woken = Vec::new();
        for (group, reply) in self.node.take_replies() {
            if group == METADATA_GROUP
                && let Some(metadata) = &mut self.metadata
            {
                // A committed metadata request is answered by its apply.
                if !matches!(reply.result, ReplyResult::Committed { .. })
                    && let Some(waiters) = metadata.take_waiters(reply.client, reply.request)
                {
                    for waiter in waiters {
                        match waiter {
                            MetaWaiter::Client(slot) => {
                                let _ = slot.send(result_error(&reply.result));
                            }
                            MetaWaiter::Rebalance(group) => {
                                metadata.coordinator.settled(&group, None);
                            }
                        }
                    }
                }
                continue;
            }
            let Some(pending) = self.pending.remove(&(group, reply.client, reply.request)) else {
                continue;
            };
            let committed = matches!(reply.result, ReplyResult::Committed { .. });
            let outcome = match (pending.kind, reply.result) {
                (
                    WriteKind::Produce { partition, record_count },
                    ReplyResult::Committed { base_offset, .. },
                ) => Outcome::produced(ProduceReply { partition, base_offset, record_count }),
                (WriteKind::Offset(record), _) if committed => {
                    self.offsets.entry(group).or_default().apply(record);
                    Outcome::ok(Vec::new())
                }
                (WriteKind::PollCommit { record, answer }, result) => {
                    self.commits_in_flight.remove(&(group, record.consumer.clone()));
                    // The consumer's next poll may have been waiting for this commit.
                    woken.push(group);
                    if committed {
                        self.offsets.entry(group).or_default().apply(record);
                        answer
                    } else {
                        result_error(&result)
                    }
                }
                (_, other) => result_error(&other),
            };
            let _ = pending.reply.send(outcome);
        }
        for group in woken {
            self.wake_parked(group);
        }
    }

    async fn apply_committed(&mut self) {
        let committed = self.node.take_committed();
        let mut changed = false;
        let mut metadata_end = None;
        for (group, entry) in committed {
            let Committed::Op { header } = entry else {
                // A group of one takes no state transfer and serves none (this server leaves
                // `transfers_carry_driver_state` off until it runs replicated groups).
                continue;
            };
            let fields = shoal_engine::record::prepare_of(&header);
            let end = fields.end_offset();
            let known = self.committed_end.entry(group).or_insert(0);
            if end > *known {
                *known = end;
                self.wake_parked(group);
            }
            if group != METADATA_GROUP || self.metadata.is_none() {
                continue;
            }
            let op = fields.op;
            if !self.node.has_log(METADATA_GROUP) {
                continue;
            }
            let read = self.node.read_op(METADATA_GROUP, op).await;
            let Some(metadata) = self.metadata.as_mut() else { return };
            let prepare = match read {
                Ok(Some(prepare)) => prepare,
                other => {
                    tracing::error!(op, result = ?other, "metadata op unreadable after commit");
                    continue;
                }
            };
            let fields = *shoal_engine::record::prepare_of(&prepare.header);
            if fields.op <= metadata.state.catalog.applied_op {
                // Already in the state: a restored snapshot may cover ops past the commit point
                // the replica recovered with, and those commit again here.
                continue;
            }
            let reply = apply_metadata(&mut metadata.state, &prepare);
            changed = true;
            metadata_end = Some(fields.end_offset());
            if let Some(waiters) = metadata.take_waiters(fields.client, fields.request) {
                // Publish before answering, so the client's next request sees the change.
                let catalog = Arc::new(metadata.state.catalog.clone());
                changed = false;
                self.publish(catalog);
                for waiter in waiters {
                    self.answer_metadata(waiter, &reply);
                }
            }
        }
        if changed && let Some(metadata) = &self.metadata {
            let catalog = Arc::new(metadata.state.catalog.clone());
            self.publish(catalog);
        }
        if let Some(end_offset) = metadata_end {
            self.save_metadata_snapshot(end_offset);
        }
    }

    /// Answers whoever waited for a metadata command: its client, or (for a rebalance) the
    /// coordinator, which answers the joins the new assignment includes.
    fn answer_metadata(&mut self, waiter: MetaWaiter, reply: &MetaReply) {
        match waiter {
            MetaWaiter::Client(slot) => {
                let body = Body::Encoded(reply.body.clone());
                let _ = slot.send(Outcome { error: reply.error, body });
            }
            MetaWaiter::Rebalance(group) => {
                let Some(metadata) = self.metadata.as_mut() else { return };
                let in_force = metadata
                    .state
                    .catalog
                    .topic(&group.stream, &group.topic)
                    .ok()
                    .and_then(|topic| topic.consumer_groups.get(&group.group))
                    .cloned();
                let applied = reply.error == 0;
                let answered =
                    metadata.coordinator.settled(&group, in_force.as_ref().filter(|_| applied));
                for (slot, assignment) in answered {
                    let _ = slot.send(Outcome::ok(assignment.encode()));
                }
                // Members may have changed while this one was in flight.
                self.propose_rebalances();
            }
        }
    }

    /// Proposes every rebalance the coordinator finds due.
    fn propose_rebalances(&mut self) {
        let Some(metadata) = self.metadata.as_mut() else { return };
        let due = metadata.coordinator.rebalances_due(&metadata.state.catalog);
        for (group, command) in due {
            let Some(metadata) = self.metadata.as_mut() else { return };
            metadata.internal_request += 1;
            let client = ClientRequest {
                client: metadata.internal_client,
                session: 0,
                request: metadata.internal_request,
                operation: 0,
            };
            self.propose_metadata(client, command, MetaWaiter::Rebalance(group));
        }
    }

    fn propose_metadata(
        &mut self,
        client: ClientRequest,
        command: MetaCommand,
        waiter: MetaWaiter,
    ) {
        let Some(metadata) = self.metadata.as_mut() else {
            if let MetaWaiter::Client(reply) = waiter {
                let _ =
                    reply.send(Outcome::error(ErrorCode::InvalidRequest, "not the metadata shard"));
            }
            return;
        };
        if let Err(answer) = metadata.state.admit(client.session, client.request, &command) {
            if client.session != 0 && answer.error == 0 {
                self.metrics.metadata_duplicate();
            }
            self.answer_metadata(waiter, &answer);
            return;
        }
        let key = (client.client, client.request);
        if client.session != 0
            && let Some(proposal) = metadata.in_flight.get(&(client.session, client.request))
            && let Some((_, waiters)) = metadata.pending.get_mut(proposal)
        {
            // A retry of a request still in flight: answered with the original's answer once it
            // commits (or with the original's failure).
            if waiters.len() < META_WAITERS_MAX {
                waiters.push(waiter);
                return;
            }
            let answer = MetaReply::error(
                ErrorCode::TransientNotAccepted,
                &format!("request {} is in flight and retried too often: retry", client.request),
            );
            self.answer_metadata(waiter, &answer);
            return;
        }
        if metadata.pending.contains_key(&key) {
            let answer = MetaReply::error(
                ErrorCode::InvalidRequest,
                &format!("request {} of this client is already in flight", client.request),
            );
            self.answer_metadata(waiter, &answer);
            return;
        }
        let now = now_ms();
        let mut batch = BatchBuilder::new(now);
        batch.push(now, None, Some(&command.encode()), &[]);
        let batch = batch.build();
        let request = Request {
            client: client.client,
            session: client.session,
            request: client.request,
            body: BytesMut::from(&batch[..]),
            body_checksum: checksum::crc32c(&batch),
            record_count: 1,
            first_timestamp_ms: now,
            max_timestamp_ms: now,
            append_time_ms: now,
        };
        metadata.pending.insert(key, (client.session, vec![waiter]));
        if client.session != 0 {
            metadata.in_flight.insert((client.session, client.request), key);
        }
        if let Err(refused) = self.node.on_client_request(METADATA_GROUP, request)
            && let Some(waiters) = self.metadata.as_mut().and_then(|m| m.take_waiters(key.0, key.1))
        {
            let outcome = refusal(&refused);
            let Body::Encoded(text) = outcome.body else { return };
            let answer = MetaReply { error: outcome.error, body: text };
            for waiter in waiters {
                self.answer_metadata(waiter, &answer);
            }
        }
    }

    /// A consumer group request: the coordinator updates membership, a changed membership
    /// becomes a rebalance proposal, and a join is answered once an assignment includes it.
    fn group_request(&mut self, request: GroupRequest, reply: Slot) {
        let Some(metadata) = self.metadata.as_mut() else {
            let _ =
                reply.send(Outcome::error(ErrorCode::InvalidRequest, "not the coordinator shard"));
            return;
        };
        let now = now_ms();
        let coordinator = &mut metadata.coordinator;
        match request {
            GroupRequest::Join(join) => {
                match coordinator.join(&join.group, &join.member, join.session_timeout_ms, now) {
                    Ok(member) => coordinator.wait_for_assignment(&join.group, member, reply),
                    Err((code, text)) => {
                        let _ = reply.send(Outcome::error(code, text));
                        return;
                    }
                }
                self.propose_rebalances();
                let Some(metadata) = self.metadata.as_mut() else { return };
                if let Ok(topic) =
                    metadata.state.catalog.topic(&join.group.stream, &join.group.topic)
                    && let Some(in_force) = topic.consumer_groups.get(&join.group.group)
                {
                    for (slot, assignment) in
                        metadata.coordinator.answer_joins(&join.group, in_force)
                    {
                        let _ = slot.send(Outcome::ok(assignment.encode()));
                    }
                }
            }
            GroupRequest::Heartbeat(member) => {
                match coordinator.heartbeat(&member.group, &member.member, now) {
                    Ok(()) => {
                        let assignment = groups::assignment_of(
                            &metadata.state.catalog,
                            &member.group,
                            &member.member,
                        );
                        let _ = reply.send(Outcome::ok(assignment.encode()));
                    }
                    Err((code, text)) => {
                        let _ = reply.send(Outcome::error(code, text));
                    }
                }
            }
            GroupRequest::Leave(member) => match coordinator.leave(&member.group, &member.member) {
                Ok(()) => {
                    let _ = reply.send(Outcome::ok(Vec::new()));
                    self.propose_rebalances();
                }
                Err((code, text)) => {
                    let _ = reply.send(Outcome::error(code, text));
                }
            },
        }
    }

    /// Declares dead every member whose session ran out, and rebalances their groups.
    fn expire_members(&mut self) {
        let Some(metadata) = self.metadata.as_mut() else { return };
        if metadata.coordinator.expire(now_ms()) > 0 {
            self.propose_rebalances();
        }
    }

    fn fetch(&mut self, group: u64, args: FetchArgs, to: ReadFor) {
        let committed_end = self.committed_end.get(&group).copied().unwrap_or(0);
        // A poll starts at its consumer's stored offset, looked up again at every run (a parked
        // poll woken later sees commits made meanwhile); it waits while its own auto-commit is
        // in flight, so two polls never return the same messages.
        let mut args = args;
        if let ReadFor::Poll(poll) = &to {
            if poll.auto_commit && self.commits_in_flight.contains(&(group, poll.consumer.clone()))
            {
                let args = FetchArgs { wait_ms_max: args.wait_ms_max.max(1), ..args };
                self.park_or_answer(group, args, to);
                return;
            }
            args.from = match self.offsets.get(&group).and_then(|o| o.get(&poll.consumer)) {
                Some(offset) => FetchFrom::Offset(offset.max(poll.skipped_to)),
                None if poll.skipped_to > 0 => FetchFrom::Offset(poll.skipped_to),
                None => FetchFrom::First,
            };
        }
        let Some(first_offset) = self.node.log_first_offset(group) else {
            let text = format!("group {group} is not on shard {}", self.index);
            to.reply().send_outcome(Outcome::error(ErrorCode::PartitionFailed, text));
            return;
        };
        // Where an offset read starts; a start at or past the committed end waits for data
        // (long-poll) or gets nothing.
        let start = match args.from {
            FetchFrom::Timestamp(_) => None,
            FetchFrom::Offset(offset) => Some(offset),
            FetchFrom::First => Some(first_offset),
            FetchFrom::Last => {
                Some(committed_end.saturating_sub(1).max(first_offset).min(committed_end))
            }
        };
        if let Some(start) = start
            && start >= committed_end
        {
            let args = FetchArgs { from: FetchFrom::Offset(start), ..args };
            self.park_or_answer(group, args, to);
            return;
        }
        let plan = match args.from {
            FetchFrom::Timestamp(time_ms) => self.node.plan_read_time(group, time_ms),
            _ => self.node.plan_read_offset(group, start.unwrap_or(0), args.bytes_max as usize),
        };
        match plan {
            Err(error) => {
                let outcome = Outcome::error(ErrorCode::PartitionFailed, error.to_string());
                to.reply().send_outcome(outcome);
            }
            Ok(ReadPlan::Done(found)) => self.found(group, args, found, to),
            Ok(ReadPlan::Disk(read)) => {
                let done_list = Rc::clone(&self.reads_done);
                let wake = self.mesh[self.index as usize].clone();
                monoio::spawn(async move {
                    let done = read.run().await;
                    done_list.borrow_mut().push(ReadDone { group, args, done, to });
                    let _ = wake.try_send(Work::Wake);
                });
            }
        }
    }

    /// A fetch with nothing to read yet: held until its group commits more or its wait runs
    /// out, or answered at once (empty) when it may not wait or the shard holds enough waiting.
    fn park_or_answer(&mut self, group: u64, args: FetchArgs, to: ReadFor) {
        if args.wait_ms_max == 0 || self.parked_count >= self.config.network.fetch_parked_max {
            self.answer_fetch(group, args, Vec::new(), to);
            return;
        }
        let deadline = Instant::now() + Duration::from_millis(u64::from(args.wait_ms_max));
        self.parked.entry(group).or_default().push(ParkedFetch { args, deadline, to });
        self.parked_count += 1;
    }

    /// Runs again every fetch parked on `group`, whose committed log just grew (or whose
    /// consumer's auto-commit finished).
    fn wake_parked(&mut self, group: u64) {
        let Some(parked) = self.parked.remove(&group) else { return };
        self.parked_count -= parked.len();
        let now = Instant::now();
        for fetch in parked {
            let wait_ms_left = fetch.deadline.saturating_duration_since(now).as_millis() as u32;
            let args = FetchArgs { wait_ms_max: wait_ms_left.max(1), ..fetch.args };
            self.fetch(group, args, fetch.to);
        }
    }

    /// Answers, empty, every parked fetch whose wait ran out (checked every tick).
    fn expire_parked(&mut self) {
        if self.parked_count == 0 {
            return;
        }
        let now = Instant::now();
        let mut expired = Vec::new();
        for (&group, parked) in self.parked.iter_mut() {
            let mut index = 0;
            while index < parked.len() {
                if parked[index].deadline <= now {
                    expired.push((group, parked.swap_remove(index)));
                } else {
                    index += 1;
                }
            }
        }
        self.parked.retain(|_, parked| !parked.is_empty());
        self.parked_count -= expired.len();
        for (group, fetch) in expired {
            self.answer_fetch(group, fetch.args, Vec::new(), fetch.to);
        }
    }

    fn finish_reads(&mut self) {
        let done: Vec<ReadDone> = std::mem::take(&mut *self.reads_done.borrow_mut());
        for read in done {
            if !self.node.has_log(read.group) {
                continue;
            }
            match self.node.finish_read(read.group, read.done) {
                Ok(found) => self.found(read.group, read.args, found, read.to),
                Err(error) => {
                    let outcome = Outcome::error(ErrorCode::PartitionFailed, error.to_string());
                    read.to.reply().send_outcome(outcome);
                }
            }
        }
    }

    /// Completes a fetch with what the log returned: a time lookup becomes an offset read,
    /// anything else is the answer.
    fn found(&mut self, group: u64, args: FetchArgs, found: Vec<StoredPrepare>, to: ReadFor) {
        if let FetchFrom::Timestamp(_) = args.from {
            match found.first() {
                Some(prepare) => {
                    let from = FetchFrom::Offset(prepare.base_offset());
                    self.fetch(group, FetchArgs { from, ..args }, to);
                }
                None => {
                    // Nothing at or after that time yet: what comes next will be.
                    let end = self.committed_end.get(&group).copied().unwrap_or(0);
                    let args = FetchArgs { from: FetchFrom::Offset(end), ..args };
                    self.park_or_answer(group, args, to);
                }
            }
            return;
        }
        self.answer_fetch(group, args, found, to);
    }

    /// Answers a fetch with the committed batches of `found`; a poll that auto-commits first
    /// stores the offset after them and answers once that commit is committed.
    fn answer_fetch(
        &mut self,
        group: u64,
        args: FetchArgs,
        found: Vec<StoredPrepare>,
        mut to: ReadFor,
    ) {
        let next_offset = self.committed_end.get(&group).copied().unwrap_or(0);
        let first_offset = self.node.log_first_offset(group).unwrap_or(0);
        let mut records = 0u64;
        let mut end_offset = None;
        let mut batches: Vec<Bytes> = Vec::new();
        for prepare in found {
            // Consumers read only committed data; the log may hold more.
            if records >= u64::from(args.count_max.max(1)) || prepare.end_offset() > next_offset {
                break;
            }
            let fields = shoal_engine::record::prepare_of(&prepare.header);
            records += u64::from(fields.record_count);
            end_offset = Some(prepare.end_offset());
            batches.push(prepare.body());
        }
        let prefix = FetchReply {
            partition: args.partition,
            first_offset,
            next_offset,
            batch_count: batches.len() as u32,
        }
        .encode_prefix();
        let size: usize = batches.iter().map(Bytes::len).sum();
        let mut body = Vec::with_capacity(8 + prefix.len() + size);
        if let ReadFor::Poll(_) = to {
            // A poll's reply starts with where it started (the stored offset), so the client
            // skips what precedes it in the first batch.
            let start = match args.from {
                FetchFrom::Offset(offset) => offset,
                _ => first_offset,
            };
            body.extend_from_slice(&start.to_le_bytes());
        }
        body.extend_from_slice(&prefix);
        for batch in &batches {
            body.extend_from_slice(batch);
        }
        // A poll that found only control records (offset commits) has nothing to deliver: it
        // goes on from past them (waiting, when it may, for what comes next).
        if let (ReadFor::Poll(poll), Some(end)) = (&mut to, end_offset)
            && batches.iter().all(|batch| BatchHeader::parse(batch).is_ok_and(|h| h.is_control()))
        {
            poll.skipped_to = end;
            self.fetch(group, args, to);
            return;
        }
        let answer = Outcome::ok(body);
        match (to, end_offset) {
            (ReadFor::Poll(poll), Some(end)) if poll.auto_commit => {
                let key = (group, poll.consumer.clone());
                let record = OffsetCommitRecord { consumer: poll.consumer, offset: Some(end) };
                let kind = |record| WriteKind::PollCommit { record, answer };
                // Marked first: a write refused inside `store_offset` clears the mark again.
                self.commits_in_flight.insert(key.clone());
                if !self.store_offset(group, poll.client, record, kind, poll.reply) {
                    self.commits_in_flight.remove(&key);
                }
            }
            (to, _) => to.reply().send_outcome(answer),
        }
    }
}

impl ReadFor {
    fn reply(self) -> Slot {
        match self {
            ReadFor::Fetch(reply) => reply,
            ReadFor::Poll(poll) => poll.reply,
        }
    }
}

/// Sending an answer whose receiver may be gone (the connection closed).
trait SendOutcome {
    fn send_outcome(self, outcome: Outcome);
}

impl SendOutcome for Slot {
    fn send_outcome(self, outcome: Outcome) {
        let _ = self.send(outcome);
    }
}

/// Applies one committed metadata prepare to `state` and returns its client's answer.
fn apply_metadata(state: &mut MetaState, prepare: &StoredPrepare) -> MetaReply {
    let fields = *shoal_engine::record::prepare_of(&prepare.header);
    let body = prepare.body();
    let command = shoal_engine::batch::records(&body)
        .ok()
        .and_then(|mut records| records.next())
        .and_then(|record| record.ok())
        .and_then(|record| record.value.map(MetaCommand::decode))
        .and_then(Result::ok);
    state.apply(fields.op, fields.append_time_ms, fields.session, fields.request, command.as_ref())
}

fn result_error(result: &ReplyResult) -> Outcome {
    match result {
        ReplyResult::Committed { .. } => Outcome::ok(Vec::new()),
        ReplyResult::NotPrimary { view, primary } => {
            Outcome::error(ErrorCode::NotPrimary, format!("replica {primary} leads view {view}"))
        }
        ReplyResult::TransientNotAccepted => {
            Outcome::error(ErrorCode::TransientNotAccepted, "not accepted: retry")
        }
        ReplyResult::TransientNotCommitted => Outcome::error(
            ErrorCode::TransientNotCommitted,
            "outcome unknown: retry with the same request number",
        ),
        ReplyResult::OutOfOrderSequence => Outcome::error(
            ErrorCode::OutOfOrderSequence,
            "the batch's sequence does not follow the producer's last batch in this partition",
        ),
        ReplyResult::UnknownProducer => Outcome::error(
            ErrorCode::UnknownProducer,
            "this partition does not know the producer (expired or evicted): restart at sequence 0",
        ),
        ReplyResult::ProducerFenced => {
            Outcome::error(ErrorCode::ProducerFenced, "a newer epoch of this producer appended")
        }
    }
}

/// The answer to a request the node refused before it reached the replica.
fn refusal(refused: &RequestRefused) -> Outcome {
    let code = match refused {
        // Retryable: the client may send it again once disk space is freed.
        RequestRefused::StorageFull { .. } => ErrorCode::StorageFull,
        RequestRefused::UnknownGroup { .. } | RequestRefused::GroupFailed { .. } => {
            ErrorCode::PartitionFailed
        }
    };
    Outcome::error(code, refused.to_string())
}

fn refuse(work: Work) {
    let outcome = || Outcome::error(ErrorCode::ShuttingDown, "shutting down");
    match work {
        Work::Produce { reply, .. }
        | Work::Fetch { reply, .. }
        | Work::Metadata { reply, .. }
        | Work::StoreOffset { reply, .. }
        | Work::GetOffset { reply, .. }
        | Work::Group { reply, .. }
        | Work::Poll { reply, .. } => {
            let _ = reply.send(outcome());
        }
        Work::Stats { reply, .. } => {
            let _ = reply.send(Vec::new());
        }
        // Dropping the reply slot tells the scrape this shard has nothing to show.
        Work::Report { .. } | Work::Metrics { .. } => {}
        Work::Catalog(_) | Work::Wake => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flush_gate_holds_writes_for_the_delay_from_the_first_of_them() {
        let start = Instant::now();
        let at = |us: u64| start + Duration::from_micros(us);
        let mut undelayed = FlushGate::new(0);
        assert!(undelayed.open(at(0), true), "no delay: a round whenever anything is pending");
        assert_eq!(undelayed.deadline(), None);

        let mut gate = FlushGate::new(500);
        assert!(gate.open(at(0), false), "nothing waits: nothing to hold back");
        assert_eq!(gate.deadline(), None);
        // The first write opens the window; later ones join it without stretching it.
        assert!(!gate.open(at(10), true));
        assert_eq!(gate.deadline(), Some(at(510)));
        assert!(!gate.open(at(300), true));
        assert!(!gate.open(at(509), true));
        assert_eq!(gate.deadline(), Some(at(510)));
        assert!(gate.open(at(510), true), "the window's end lets them all go in one round");
        assert_eq!(gate.deadline(), None, "the round took them: the window is closed");
        // The next write opens a new window.
        assert!(!gate.open(at(600), true));
        assert_eq!(gate.deadline(), Some(at(1100)));
        // Writes that left another way (a round that had to run anyway) close it too.
        assert!(gate.open(at(700), false));
        assert_eq!(gate.deadline(), None);
    }
}
