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

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::pending;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use monoio::net::{ListenerOpts, TcpListener};
use shoal_engine::batch::BatchBuilder;
use shoal_engine::checksum;
use shoal_engine::partition::{DiskReadDone, ReadPlan};
use shoal_engine::protocol::{ErrorCode, FetchFrom, FetchReply, ProduceReply};
use shoal_engine::ring::StoredPrepare;
use shoal_engine::shard::{ShardConfig, shard_dir};
use shoal_engine::storage::uring::{UringStorage, runtime};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_engine::wire::ClientRequest;
use shoal_replication::{
    Clock, Node, NodeConfig, ReplicaConfig, ReplyResult, Request, RequestRefused, Status, TICK_MS,
    Transport,
};

use crate::config::Config;
use crate::connection;
use crate::metadata::{Applied, Catalog, METADATA_GROUP, MetaCommand, Published};

/// The cluster id of a single node until cluster configuration arrives.
pub const CLUSTER: u64 = 1;

/// Whether accepted writes go to their groups at once (always, except under the
/// `canary-ack-on-receipt` canary, which holds them until the next tick).
const SUBMIT_AT_ONCE: bool = !cfg!(feature = "canary-ack-on-receipt");

/// How long a stopping shard waits for its connections to write the replies they owe.
const SHUTDOWN_REPLIES_TIME_MAX: Duration = Duration::from_secs(2);

/// Ticks between two retention passes over the shard's groups.
const RETENTION_INTERVAL_TICKS: u64 = 100;

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
    /// Report the shard's own figures.
    Report {
        /// The answer.
        reply: flume::Sender<ShardReport>,
    },
    /// Nothing: wakes the loop to look at its local completions.
    Wake,
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
    if let Some(cpu) = spec.config.shard[spec.index as usize].cpu
        && !core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
    {
        let message = format!("shard {}: cannot pin to CPU {cpu}", spec.index);
        let _ = spec.bound.send(Err(message.clone()));
        return Err(message);
    }
    let mut runtime = runtime();
    runtime.block_on(serve(spec))
}

/// A disk read finished by a spawned task, for the loop to complete.
struct ReadDone {
    group: u64,
    args: FetchArgs,
    done: DiskReadDone,
    reply: Slot,
}

/// A produce accepted by this shard, waiting for its reply.
struct PendingProduce {
    partition: u32,
    record_count: u32,
    reply: Slot,
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
    /// Produce requests in a group's pipeline, by (group, client, request).
    pending: HashMap<(u64, u64, u64), PendingProduce>,
    /// Produce requests waiting for room in their group's pipeline, oldest first.
    waiting: BTreeMap<u64, VecDeque<(Request, PendingProduce)>>,
    waiting_count: usize,
    /// Disk reads completed by their tasks.
    reads_done: Rc<RefCell<Vec<ReadDone>>>,
    /// Groups refusing writes for lack of disk space at the last tick (logged when it changes).
    storage_full_groups: usize,
    /// Canary: the offset each group's next acknowledged-on-receipt write is promised.
    #[cfg(feature = "canary-ack-on-receipt")]
    predicted_offsets: HashMap<u64, u64>,
}

struct MetadataState {
    catalog: Catalog,
    pending: HashMap<(u64, u64), Slot>,
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
        node: 0,
        replica,
        message_size_bytes_max: shard_config.record_size_bytes_max + (64 << 10),
        held_messages_max: 4096,
    };
    let seed = u64::from(index) ^ now_ms() as u64;
    let open =
        Node::open(UringStorage::new(), &dir, shard_config, node_config, NoPeers, WallClock, seed);
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
    let acceptor = connection::Acceptor {
        replies_owed: Rc::clone(&replies_owed),
        config: Arc::clone(&spec.config),
        mesh: Arc::clone(&spec.mesh),
        published: Arc::clone(&spec.published),
        connections: Arc::clone(&spec.connections),
        stop: Arc::clone(&spec.stop),
    };
    let accepting = monoio::spawn(acceptor.run(listener));

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
        if self.index == 0 {
            let groups_max = self.node.shard_mut().config().groups_max as u32;
            let mut catalog = Catalog::new(self.config.shards, groups_max);
            if self.node.group_ids().contains(&METADATA_GROUP) {
                self.replay_metadata(&mut catalog).await?;
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
                        .min(self.node.shard_mut().config().record_size_bytes_max as u32),
                    ..config
                };
                self.node
                    .create_group(METADATA_GROUP, config)
                    .await
                    .map_err(|e| format!("creating the metadata group: {e}"))?;
            }
            self.metadata = Some(MetadataState { catalog, pending: HashMap::new() });
        }
        let mut ticks = 0;
        while !self.all_normal() {
            ticks += 1;
            if ticks > RECOVERY_TICKS_MAX || stop.load(Ordering::SeqCst) {
                return Err(format!("groups not back to normal after {RECOVERY_TICKS_MAX} ticks"));
            }
            self.node.on_tick();
            self.round().await;
        }
        if let Some(metadata) = &self.metadata {
            self.publish(Arc::new(metadata.catalog.clone()));
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

    fn all_normal(&self) -> bool {
        self.node.group_ids().into_iter().all(|group| {
            self.node.group_failure(group).is_some()
                || self.node.replica(group).is_some_and(|r| r.status() == Status::Normal)
        })
    }

    /// Applies the committed metadata log (up to what the recovered replica knows committed);
    /// ops committed later arrive through the normal path.
    async fn replay_metadata(&mut self, catalog: &mut Catalog) -> Result<(), String> {
        let commit = self.node.replica(METADATA_GROUP).map_or(0, |r| r.commit());
        let Some(log) = self.node.shard_mut().group_mut(METADATA_GROUP) else {
            return Err("metadata group vanished".into());
        };
        if let Some(reason) = log.faulty_reason() {
            return Err(format!("the metadata log is damaged: {reason}"));
        }
        let mut offset = log.first_offset();
        while catalog.applied_op < commit {
            let prepares = log
                .read_offset(offset, 1 << 20)
                .await
                .map_err(|e| format!("reading the metadata log: {e}"))?;
            if prepares.is_empty() {
                return Err(format!(
                    "metadata log ends at op {} below its commit {commit}",
                    catalog.applied_op
                ));
            }
            for prepare in prepares {
                let fields = *shoal_engine::record::prepare_of(&prepare.header);
                offset = fields.base_offset + u64::from(fields.record_count);
                if fields.op <= catalog.applied_op || fields.op > commit {
                    continue;
                }
                apply_metadata(catalog, &prepare).map(drop).map_err(|e| e.1)?;
            }
        }
        Ok(())
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
            if let Err(error) = self.node.create_group(group, config).await {
                eprintln!("shoal: shard {}: cannot create group {group}: {error}", self.index);
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
            let wait = next_tick.saturating_duration_since(Instant::now());
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
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + tick;
                self.node.on_tick();
                ticks += 1;
                if ticks.is_multiple_of(RETENTION_INTERVAL_TICKS) {
                    self.enforce_retention().await;
                }
                self.log_storage_full();
                if !SUBMIT_AT_ONCE {
                    self.submit_waiting();
                }
            }
            self.round().await;
        }
        // Finish what was accepted (to the end: nothing may stay in flight); refuse what is
        // still queued.
        self.node.run_io().await;
        self.answer_replies();
        self.apply_committed().await;
        while let Ok(work) = inbox.try_recv() {
            refuse(work);
        }
        for (_, pending) in self.pending.drain() {
            let _ = pending.reply.send(Outcome::error(ErrorCode::ShuttingDown, "shutting down"));
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
            eprintln!(
                "shoal: shard {}: storage full: {full} partition(s) refuse produce with \
                 StorageFull until disk space is freed",
                self.index
            );
        } else {
            eprintln!("shoal: shard {}: disk space is back: writes go through again", self.index);
        }
        self.storage_full_groups = full;
    }

    /// Deletes sealed segments beyond each topic's retention.
    async fn enforce_retention(&mut self) {
        if let Err(error) = self.node.enforce_retention(now_ms()).await {
            eprintln!("shoal: shard {}: retention: {error}", self.index);
        }
    }

    /// Starts an I/O round if anything is pending (its flush runs on while the loop takes more
    /// work), then sends every answer that is ready.
    async fn round(&mut self) {
        if self.node.has_io() {
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
        let stored = self.node.shard_mut().group(group).map_or(0, |log| log.next_offset());
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
                if self.waiting_count >= self.config.network.shard_inbox_max {
                    let _ = reply.send(Outcome::error(
                        ErrorCode::Busy,
                        format!("shard {} has too many writes waiting", self.index),
                    ));
                    return;
                }
                let record_count = request.record_count;
                #[cfg(feature = "canary-ack-on-receipt")]
                let reply = self.ack_on_receipt(group, partition, record_count, reply);
                let pending = PendingProduce { partition, record_count, reply };
                self.waiting.entry(group).or_default().push_back((request, pending));
                self.waiting_count += 1;
                if SUBMIT_AT_ONCE {
                    self.submit_waiting();
                }
            }
            Work::Fetch { group, args, reply } => {
                self.ensure_group(group).await;
                self.fetch(group, args, reply);
            }
            Work::Metadata { client, command, reply } => {
                self.propose_metadata(client, command, reply)
            }
            Work::Catalog(catalog) => self.install(catalog).await,
            Work::Stats { groups, reply } => {
                let stats = groups
                    .into_iter()
                    .map(|group| {
                        let stats = self.node.shard_mut().group(group).map_or(
                            GroupStats::default(),
                            |log| GroupStats {
                                first_offset: log.first_offset(),
                                next_offset: log.next_offset(),
                                size_bytes: log.size_bytes(),
                            },
                        );
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
            Work::Wake => {}
        }
    }

    /// A request may reach this shard before the catalog that placed its group here does (when
    /// shard 0 found this inbox full), or after creating the group failed (a full disk had no
    /// room for its directory): install the published catalog, which creates what is missing.
    async fn ensure_group(&mut self, group: u64) {
        if self.node.shard_mut().group(group).is_none() {
            let mut latest = Arc::clone(&self.catalog);
            self.published.refresh(&mut latest);
            self.install(latest).await;
        }
    }

    /// Hands waiting writes to their groups while their pipelines have room.
    fn submit_waiting(&mut self) {
        if self.waiting_count == 0 {
            return;
        }
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
                    let _ = pending.reply.send(Outcome::error(
                        ErrorCode::InvalidRequest,
                        format!("request {} of this client is already in flight", request.request),
                    ));
                    continue;
                }
                match self.node.on_client_request(group, request) {
                    Ok(()) => {
                        self.pending.insert(key, pending);
                    }
                    Err(refused) => {
                        let _ = pending.reply.send(refusal(&refused));
                    }
                }
            }
        }
    }

    fn answer_replies(&mut self) {
        for (group, reply) in self.node.take_replies() {
            if group == METADATA_GROUP
                && let Some(metadata) = &mut self.metadata
            {
                // A committed metadata request is answered by its apply.
                if !matches!(reply.result, ReplyResult::Committed { .. })
                    && let Some(slot) = metadata.pending.remove(&(reply.client, reply.request))
                {
                    let _ = slot.send(result_error(&reply.result));
                }
                continue;
            }
            let Some(pending) = self.pending.remove(&(group, reply.client, reply.request)) else {
                continue;
            };
            let outcome = match reply.result {
                ReplyResult::Committed { base_offset, .. } => Outcome::produced(ProduceReply {
                    partition: pending.partition,
                    base_offset,
                    record_count: pending.record_count,
                }),
                other => result_error(&other),
            };
            let _ = pending.reply.send(outcome);
        }
    }

    async fn apply_committed(&mut self) {
        let committed = self.node.take_committed();
        if self.metadata.is_none() {
            return;
        }
        let mut changed = false;
        for (group, entry) in committed {
            if group != METADATA_GROUP {
                continue;
            }
            let op = shoal_engine::record::prepare_of(&entry.header).op;
            let read = match self.node.shard_mut().group_mut(METADATA_GROUP) {
                Some(log) => log.read_op(op).await,
                None => continue,
            };
            let Some(metadata) = self.metadata.as_mut() else { return };
            let prepare = match read {
                Ok(Some(prepare)) => prepare,
                other => {
                    eprintln!("shoal: metadata op {op} unreadable after commit: {other:?}");
                    continue;
                }
            };
            let fields = *shoal_engine::record::prepare_of(&prepare.header);
            let outcome = match apply_metadata(&mut metadata.catalog, &prepare) {
                Ok(Applied::Session(session)) => {
                    changed = true;
                    Outcome::ok(shoal_engine::protocol::encode_session(session))
                }
                Ok(Applied::Done) => {
                    changed = true;
                    Outcome::ok(Vec::new())
                }
                Err((code, text)) => Outcome::error(code, text),
            };
            if let Some(slot) = metadata.pending.remove(&(fields.client, fields.request)) {
                // Publish before answering, so the client's next request sees the change.
                if changed {
                    let catalog = Arc::new(metadata.catalog.clone());
                    changed = false;
                    self.publish(catalog);
                }
                let _ = slot.send(outcome);
            }
        }
        if changed && let Some(metadata) = &self.metadata {
            let catalog = Arc::new(metadata.catalog.clone());
            self.publish(catalog);
        }
    }

    fn propose_metadata(&mut self, client: ClientRequest, command: MetaCommand, reply: Slot) {
        let Some(metadata) = self.metadata.as_mut() else {
            let _ = reply.send(Outcome::error(ErrorCode::InvalidRequest, "not the metadata shard"));
            return;
        };
        if let Err((code, text)) = metadata.catalog.check(&command) {
            let _ = reply.send(Outcome::error(code, text));
            return;
        }
        let key = (client.client, client.request);
        if metadata.pending.contains_key(&key) {
            let _ = reply.send(Outcome::error(
                ErrorCode::InvalidRequest,
                format!("request {} of this client is already in flight", client.request),
            ));
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
        metadata.pending.insert(key, reply);
        if let Err(refused) = self.node.on_client_request(METADATA_GROUP, request)
            && let Some(slot) = self.metadata.as_mut().and_then(|m| m.pending.remove(&key))
        {
            let _ = slot.send(refusal(&refused));
        }
    }

    fn fetch(&mut self, group: u64, args: FetchArgs, reply: Slot) {
        let Some(log) = self.node.shard_mut().group_mut(group) else {
            let _ = reply.send(Outcome::error(
                ErrorCode::PartitionFailed,
                format!("group {group} is not on shard {}", self.index),
            ));
            return;
        };
        let plan = match args.from {
            FetchFrom::Timestamp(time_ms) => log.plan_read_time(time_ms),
            FetchFrom::Offset(offset) => log.plan_read_offset(offset, args.bytes_max as usize),
            FetchFrom::First => log.plan_read_offset(log.first_offset(), args.bytes_max as usize),
            FetchFrom::Last => {
                let last = log.next_offset().saturating_sub(1).max(log.first_offset());
                log.plan_read_offset(last, args.bytes_max as usize)
            }
        };
        match plan {
            Err(error) => {
                let _ = reply.send(Outcome::error(ErrorCode::PartitionFailed, error.to_string()));
            }
            Ok(ReadPlan::Done(found)) => self.found(group, args, found, reply),
            Ok(ReadPlan::Disk(read)) => {
                let done_list = Rc::clone(&self.reads_done);
                let wake = self.mesh[self.index as usize].clone();
                monoio::spawn(async move {
                    let done = read.run().await;
                    done_list.borrow_mut().push(ReadDone { group, args, done, reply });
                    let _ = wake.try_send(Work::Wake);
                });
            }
        }
    }

    fn finish_reads(&mut self) {
        let done: Vec<ReadDone> = std::mem::take(&mut *self.reads_done.borrow_mut());
        for read in done {
            let Some(log) = self.node.shard_mut().group_mut(read.group) else { continue };
            match log.finish_read(read.done) {
                Ok(found) => self.found(read.group, read.args, found, read.reply),
                Err(error) => {
                    let _ = read
                        .reply
                        .send(Outcome::error(ErrorCode::PartitionFailed, error.to_string()));
                }
            }
        }
    }

    /// Completes a fetch with what the log returned: a time lookup becomes an offset read,
    /// anything else is the answer.
    fn found(&mut self, group: u64, args: FetchArgs, found: Vec<StoredPrepare>, reply: Slot) {
        if let FetchFrom::Timestamp(_) = args.from {
            match found.first() {
                Some(prepare) => {
                    let from = FetchFrom::Offset(prepare.base_offset());
                    self.fetch(group, FetchArgs { from, ..args }, reply);
                }
                None => self.answer_fetch(group, args, Vec::new(), reply),
            }
            return;
        }
        self.answer_fetch(group, args, found, reply);
    }

    fn answer_fetch(
        &mut self,
        group: u64,
        args: FetchArgs,
        found: Vec<StoredPrepare>,
        reply: Slot,
    ) {
        let (first_offset, next_offset) = self
            .node
            .shard_mut()
            .group(group)
            .map_or((0, 0), |log| (log.first_offset(), log.next_offset()));
        let mut records = 0u64;
        let mut batches: Vec<Bytes> = Vec::new();
        for prepare in found {
            if records >= u64::from(args.count_max.max(1)) {
                break;
            }
            let fields = shoal_engine::record::prepare_of(&prepare.header);
            records += u64::from(fields.record_count);
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
        let mut body = Vec::with_capacity(prefix.len() + size);
        body.extend_from_slice(&prefix);
        for batch in &batches {
            body.extend_from_slice(batch);
        }
        let _ = reply.send(Outcome::ok(body));
    }
}

/// Applies one committed metadata prepare to `catalog`.
fn apply_metadata(
    catalog: &mut Catalog,
    prepare: &StoredPrepare,
) -> Result<Applied, (ErrorCode, String)> {
    let fields = *shoal_engine::record::prepare_of(&prepare.header);
    let body = prepare.body();
    let command = shoal_engine::batch::records(&body)
        .ok()
        .and_then(|mut records| records.next())
        .and_then(|record| record.ok())
        .and_then(|record| record.value.map(MetaCommand::decode));
    match command {
        Some(Ok(command)) => catalog.apply(fields.op, fields.append_time_ms, &command),
        _ => {
            // A committed op that is not a command cannot come from this server; skipping it
            // keeps the op sequence, refusing would stop metadata for good.
            catalog.applied_op = catalog.applied_op.max(fields.op);
            Err((ErrorCode::InvalidRequest, format!("metadata op {} is not a command", fields.op)))
        }
    }
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
        Work::Produce { reply, .. } | Work::Fetch { reply, .. } | Work::Metadata { reply, .. } => {
            let _ = reply.send(outcome());
        }
        Work::Stats { reply, .. } => {
            let _ = reply.send(Vec::new());
        }
        Work::Report { .. } => {}
        Work::Catalog(_) | Work::Wake => {}
    }
}
