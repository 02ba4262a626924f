//! The state one shard's loop owns: [`ShardState`], which each of the shard's jobs extends
//! with its own `impl` block.
//!
//! Nothing in it is shared with another thread or touched outside the loop: tasks the loop
//! spawns (disk reads, snapshot saves) hand their results back through its `Rc` lists and wake
//! it through its inbox.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use shoal_engine::partition::DiskReadDone;
use shoal_engine::storage::uring::UringStorage;
use shoal_proto::protocol::consumer::ConsumerId;
use shoal_replication::Request;
use slab::Slab;

use crate::bus::{BusAddresses, BusCounters};

use super::fetch::{ParkedFetch, ReadDone, ReadFor};
use super::flush_gate::FlushGate;
use super::formation::Formation;
use super::metadata::MetadataState;
use super::snapshots::StateSaved;
use super::thread::{ShardNode, ShardSpec};
use super::work::{FetchArgs, Mesh};
use super::writes::PendingWrite;
use crate::config::{Config, ShardTuning};
use crate::metadata::{Catalog, Published};
use crate::metrics::ShardMetrics;
use crate::offsets::PartitionOffsets;

/// The shard's state, owned by its loop.
pub(super) struct ShardState {
    pub(super) index: u32,
    pub(super) config: Arc<Config>,
    pub(super) node: ShardNode,
    pub(super) mesh: Mesh,
    pub(super) published: Arc<Published>,
    pub(super) catalog: Arc<Catalog>,
    /// Shard 0 only: the authoritative catalog and the metadata requests awaiting their apply.
    pub(super) metadata: Option<MetadataState>,
    /// Writes (produce, offset commits) in a group's pipeline, by (group, client, request).
    pub(super) pending: HashMap<(u64, u64, u64), PendingWrite>,
    /// Writes waiting for room in their group's pipeline, oldest first.
    pub(super) waiting: BTreeMap<u64, VecDeque<(Request, PendingWrite)>>,
    pub(super) waiting_count: usize,
    /// The moves this shard's primaries carry out.
    pub(super) mover: super::moves::Mover,
    /// Disk reads completed by their tasks.
    pub(super) reads_done: Rc<RefCell<Vec<ReadDone>>>,
    /// Read-ahead reads finished by their tasks: (group, what was read), for the batch cache.
    pub(super) reads_ahead_done: Rc<RefCell<Vec<(u64, DiskReadDone)>>>,
    /// Per group, the offset after its last committed message: consumers read below it only.
    pub(super) committed_end: HashMap<u64, u64>,
    /// Fetches waiting for their group's committed log to grow: a slab sized once to
    /// `fetch_parked_max`, so parking never allocates and the bound is the table's own.
    pub(super) parked: Slab<ParkedFetch>,
    /// Reads to run next, while `fetch` runs one: a poll that skips control records goes on
    /// from past them through here, one step per record at worst, so a long run of offset
    /// commits is a loop and not a recursion as deep as the run (it overflowed the stack).
    pub(super) fetches_next: VecDeque<(u64, FetchArgs, ReadFor)>,
    /// Whether `fetch` is running (its loop takes what `fetches_next` gets meanwhile).
    pub(super) fetching: bool,
    /// The keys in `parked` of each group's fetches, oldest first.
    pub(super) parked_by_group: HashMap<u64, Vec<usize>>,
    /// Per partition group, its consumers' stored offsets.
    pub(super) offsets: HashMap<u64, PartitionOffsets>,
    /// Consumers whose poll's auto-commit is in flight: their next poll waits for it.
    pub(super) commits_in_flight: HashSet<(u64, ConsumerId)>,
    /// Snapshot saves completed by their tasks.
    pub(super) states_saved: Rc<RefCell<Vec<StateSaved>>>,
    /// The node's random seed (distinct per start).
    pub(super) node_seed: u64,
    /// The shard's files: direct or buffered, as its tuning says.
    pub(super) storage: UringStorage,
    /// The shard's tuning (`[shard]` and its `[shard.N]`).
    pub(super) tuning: ShardTuning,
    /// Holds new writes back to gather more of them per flush cycle.
    pub(super) flush_gate: FlushGate,
    /// Counters this loop and its connections keep (see `metrics`).
    pub(super) metrics: Rc<ShardMetrics>,
    /// What the shard's replica bus counts, per peer.
    pub(super) bus: Rc<BusCounters>,
    /// Its peers' addresses: the shard adds the nodes its catalog adds.
    pub(super) bus_addresses: BusAddresses,
    /// Shard 0: where the node stands in forming or rejoining its cluster.
    pub(super) formation: Formation,
    /// The node's rejoin floor, shared by its shards (see `formation`).
    pub(super) rejoin_floor: Arc<AtomicU64>,
    /// Shards that have brought back every group below the floor, and whether this one has.
    pub(super) rejoin_settled: Arc<AtomicUsize>,
    pub(super) rejoin_settled_here: bool,
    /// Whether the node holds its cluster's state, as its bus handshakes say.
    pub(super) formed: Arc<AtomicBool>,
    /// Groups refusing writes for lack of disk space at the last tick (logged when it changes).
    pub(super) storage_full_groups: usize,
    /// Whether a task is removing segment files retention retired (one at a time; the engine
    /// keeps what retention retires meanwhile, under its bound).
    pub(super) removing_retired: Rc<Cell<bool>>,
    /// The catalog op up to which every group it lets go was deleted (see `deletion`).
    pub(super) groups_swept_op: u64,
    /// Partition groups this shard deleted since it started.
    pub(super) groups_deleted: u64,
    /// Canary: the offset each group's next acknowledged-on-receipt write is promised.
    #[cfg(feature = "canary-ack-on-receipt")]
    pub(super) predicted_offsets: HashMap<u64, u64>,
}

impl ShardState {
    /// The state of shard `spec.index` around its opened `node`, before start-up: no catalog
    /// yet (an empty one), nothing pending, nothing parked.
    pub(super) fn new(
        spec: &ShardSpec,
        node: ShardNode,
        seed: u64,
        storage: UringStorage,
        tuning: ShardTuning,
        (bus, bus_addresses): (Rc<BusCounters>, BusAddresses),
    ) -> ShardState {
        ShardState {
            index: spec.index,
            config: Arc::clone(&spec.config),
            node,
            mesh: Arc::clone(&spec.mesh),
            published: Arc::clone(&spec.published),
            catalog: Arc::new(Catalog::new(spec.config.shards, 0)),
            metadata: None,
            pending: HashMap::new(),
            waiting: BTreeMap::new(),
            mover: super::moves::Mover::default(),
            waiting_count: 0,
            reads_done: Rc::new(RefCell::new(Vec::new())),
            reads_ahead_done: Rc::new(RefCell::new(Vec::new())),
            node_seed: seed,
            storage,
            tuning,
            flush_gate: FlushGate::new(tuning.flush_delay_us_max),
            committed_end: HashMap::new(),
            // Grown as fetches park: the bound (up to 2^20) is counted, not reserved.
            parked: Slab::new(),
            fetches_next: VecDeque::new(),
            fetching: false,
            parked_by_group: HashMap::new(),
            offsets: HashMap::new(),
            commits_in_flight: HashSet::new(),
            states_saved: Rc::new(RefCell::new(Vec::new())),
            metrics: Rc::new(ShardMetrics::default()),
            bus,
            bus_addresses,
            formation: if !spec.formed.load(Ordering::SeqCst) {
                Formation::Deciding
            } else if spec.rejoin_floor.load(Ordering::SeqCst) == u64::MAX {
                Formation::Rejoining { head_op: None }
            } else {
                Formation::Formed
            },
            rejoin_floor: Arc::clone(&spec.rejoin_floor),
            rejoin_settled: Arc::clone(&spec.rejoin_settled),
            rejoin_settled_here: false,
            formed: Arc::clone(&spec.formed),
            storage_full_groups: 0,
            removing_retired: Rc::new(Cell::new(false)),
            groups_swept_op: 0,
            groups_deleted: 0,
            #[cfg(feature = "canary-ack-on-receipt")]
            predicted_offsets: HashMap::new(),
        }
    }
}
