//! The deterministic cluster simulator: a whole cluster — nodes running the real node layer
//! and engine over simulated disks, clients, and a faulty network — driven in one thread from
//! one `u64` seed (DESIGN.md §7).
//!
//! It owns the cluster under test, the fault schedule, the clients' workload and the invariant
//! checks, which run as the simulation goes: committed prefixes agree on every replica (by
//! checksum), every acknowledged write sits at its acknowledged offset in the final log, view
//! and log view never regress across restarts, offsets are dense, and once faults stop every
//! client completes its requests within a bound. It never reads a clock, spawns a thread or
//! touches a real file, and iterates only ordered collections, so a seed reproduces bit for bit
//! (the trace hash proves it).
//!
//! A run has two phases. The fault phase injects what the seed's [`FaultProfile`] draws —
//! message delay, loss, duplication and reordering; symmetric and one-way partitions and
//! isolation; pauses; crashes at any tick, as a process crash (the page cache survives) or a
//! power loss (the simulated disk's crash semantics), sometimes in the middle of an I/O round;
//! storage faults: bit flips at rest in a crashed node's newest durable records (at most one
//! replica per op until it has cut and repaired them), read errors, a full disk — within the
//! fault model of DESIGN.md §6 for the seed's durability mode. The liveness phase heals
//! everything and requires every client to finish and every replica to rejoin; the end checks
//! the final logs and runs the offline checker (`shoal_engine::inspect`) over every disk.

mod admin;
pub mod network;
mod script;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use shoal_engine::batch::BatchBuilder;
use shoal_engine::shard::{ShardConfig, group_dir, shard_dir};
use shoal_engine::state::{self, GroupState};
use shoal_engine::storage::sim::{Sim, SimConfig, SimRng, SimStorage};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_engine::wire::HEADER_SIZE;

use crate::config::ReplicaConfig;
use crate::lag::GroupStatus;
use crate::message::{Committed, Reply, ReplyResult, Request};
use crate::node::{Clock, Node, NodeConfig, NodeCounters, Transport};
use crate::replica::{Replica, ReplicaCounters, Status};
use admin::{ADMIN_SNAPSHOT_INTERVAL_OPS, AdminMachine, Executions};
use network::{Network, NetworkConfig};

/// Which durability the groups of a run use; decides which crashes are within the fault model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every group `persisted`: any crashes, any number at once.
    Persisted,
    /// Every group `replicated`: at most f replicas down (or not yet caught up) at once.
    Replicated,
    /// Odd groups `persisted`, even groups `replicated` (the stricter crash rule applies).
    Mixed,
}

/// Fault probabilities and durations of a run (per tick unless named otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultProfile {
    /// The network's delay, loss, duplication and reordering during the fault phase.
    pub network: NetworkConfig,
    /// Chance per tick per node that it crashes.
    pub crash_per_million: u32,
    /// Chance that a crash is a power loss rather than a process crash.
    pub power_loss_percent: u32,
    /// Chance that a crash strikes in the middle of an I/O round.
    pub crash_during_io_percent: u32,
    /// A crashed node restarts after up to this many ticks.
    pub restart_ticks_max: u64,
    /// Chance per tick of a new partition (isolation, symmetric split or one-way cut).
    pub partition_per_million: u32,
    /// A partition heals after up to this many ticks.
    pub partition_ticks_max: u64,
    /// Chance per tick per node that it pauses.
    pub pause_per_million: u32,
    /// A pause lasts up to this many ticks.
    pub pause_ticks_max: u64,
    /// Chance that a crashed node's disk has a bit flipped at rest in one of its newest durable
    /// records before it restarts (within the budget: at most f replicas per op, see
    /// [`Cluster::corrupt_op`]).
    pub corrupt_on_restart_percent: u32,
    /// During the fault phase every read fails with EIO with probability `1 / read_error_one_in`
    /// (0: never).
    pub read_error_one_in: u64,
    /// Chance per tick that one node's disk fills up (its capacity drops to what it uses plus a
    /// little), while no other's is full.
    pub disk_full_per_million: u32,
    /// A full disk is freed after up to this many ticks.
    pub disk_full_ticks_max: u64,
}

impl FaultProfile {
    /// No faults at all.
    pub fn none() -> FaultProfile {
        FaultProfile {
            network: NetworkConfig::reliable(),
            crash_per_million: 0,
            power_loss_percent: 0,
            crash_during_io_percent: 0,
            restart_ticks_max: 1,
            partition_per_million: 0,
            partition_ticks_max: 1,
            pause_per_million: 0,
            pause_ticks_max: 1,
            corrupt_on_restart_percent: 0,
            read_error_one_in: 0,
            disk_full_per_million: 0,
            disk_full_ticks_max: 1,
        }
    }

    /// Swarm testing: probabilities drawn per seed, each fault sometimes absent, sometimes
    /// frequent.
    pub fn swarm(rng: &mut SimRng) -> FaultProfile {
        let mut rate =
            |max: u32| if rng.chance(1, 4) { 0 } else { rng.below(u64::from(max)) as u32 + 1 };
        let crash_per_million = rate(400);
        let partition_per_million = rate(600);
        let pause_per_million = rate(300);
        FaultProfile {
            network: NetworkConfig::swarm(rng),
            crash_per_million,
            power_loss_percent: rng.below(101) as u32,
            crash_during_io_percent: rng.below(101) as u32,
            restart_ticks_max: 50 + rng.below(1_500),
            partition_per_million,
            partition_ticks_max: 50 + rng.below(2_000),
            pause_per_million,
            pause_ticks_max: 10 + rng.below(500),
            corrupt_on_restart_percent: if rng.chance(1, 4) {
                0
            } else {
                20 + rng.below(81) as u32
            },
            read_error_one_in: if rng.chance(1, 2) { 0 } else { 200 + rng.below(5_000) },
            disk_full_per_million: if rng.chance(1, 3) { 0 } else { rng.below(300) as u32 + 1 },
            // Long enough that a full node's writes often outrun the space it had ready (the
            // engine then refuses appends, `storage_full_rounds`), not just stop the step ahead.
            disk_full_ticks_max: 50 + rng.below(3_000),
        }
    }
}

/// What to simulate.
#[derive(Clone, Copy, Debug)]
pub struct SimOptions {
    /// Decides everything.
    pub seed: u64,
    /// Replicas per group (1, 3 or 5).
    pub replicas: u8,
    /// Groups (partitions), all with a replica on every node.
    pub groups: u64,
    /// Clients per group, each with one request outstanding at a time.
    pub clients_per_group: u64,
    /// Ticks of the fault phase.
    pub ticks: u64,
    /// Ticks the liveness phase may take at most.
    pub liveness_ticks: u64,
    /// Requests each client must complete in the liveness phase.
    pub liveness_requests: u64,
    /// The faults; `None` draws a swarm profile from the seed.
    pub faults: Option<FaultProfile>,
    /// The durability mode; `None` draws one from the seed.
    pub mode: Option<Mode>,
    /// Print every replica message of this group to stderr as it is delivered (debugging a
    /// failing seed).
    pub trace_group: Option<u64>,
    /// Every replica's `replica_lag_ticks_max` (the production default unless a test needs a
    /// tighter bound).
    pub replica_lag_ticks_max: u64,
    /// Every replica's `unclean_recovery` (off, as in production, unless a test needs it).
    pub unclean_recovery: bool,
    /// Every replica's `repair_prepares_max`; `None` draws one per seed (half the seeds 1–4,
    /// the others 1–128), so runs exercise both long multi-round repairs and quick ones.
    pub repair_prepares_max: Option<usize>,
    /// Every group's retention by size (0: none); nodes enforce it every
    /// [`RETENTION_INTERVAL_TICKS`]. The final log check then starts at each log's first op.
    pub retention_bytes: u64,
    /// Bytes each client message's value is padded to (fewer ops per segment), at most 4,000.
    pub value_size_bytes: usize,
    /// In a run of two or more groups, the last is an *admin* group: its clients send plain
    /// requests (no idempotent producer fields), so a retry may enter its log twice, and each
    /// node applies its committed ops to a client-table state machine that must execute every
    /// request at most once (`simulator::admin`).
    pub admin_group: bool,
}

impl SimOptions {
    /// The fault profile this seed draws when `faults` is `None`.
    pub fn drawn_faults(&self) -> FaultProfile {
        FaultProfile::swarm(&mut SimRng::new(self.seed))
    }

    /// The CI defaults for `seed`: three replicas, two groups, 20,000 ticks of swarm faults.
    pub fn new(seed: u64) -> SimOptions {
        SimOptions {
            seed,
            replicas: 3,
            groups: 2,
            clients_per_group: 2,
            ticks: 20_000,
            liveness_ticks: 10_000,
            liveness_requests: 3,
            faults: None,
            mode: None,
            trace_group: None,
            replica_lag_ticks_max: ReplicaConfig::new(0, 0, 1, 0).replica_lag_ticks_max,
            unclean_recovery: ReplicaConfig::new(0, 0, 1, 0).unclean_recovery,
            repair_prepares_max: None,
            retention_bytes: 0,
            value_size_bytes: 0,
            admin_group: true,
        }
    }
}

/// Branches a run exercised; a swarm requires minimums so a run that never reached a branch
/// fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Votes cast on a replica's own timeout.
    pub votes_cast: u64,
    /// Votes withdrawn on a fresh heartbeat.
    pub votes_withdrawn: u64,
    /// Views started by a new primary.
    pub views_started: u64,
    /// StartView messages installed.
    pub start_views_installed: u64,
    /// Ops dropped by nack quorums.
    pub ops_nacked: u64,
    /// Bodies fetched by a new primary before StartView.
    pub bodies_fetched_for_view: u64,
    /// Merges that had to wait for proof.
    pub merges_stalled: u64,
    /// Older-view ops merges found on a replica of a lower log view.
    pub older_ops_found: u64,
    /// Truncations of a divergent suffix.
    pub truncations: u64,
    /// Prepares retransmitted.
    pub retransmissions: u64,
    /// Repair requests.
    pub repairs_requested: u64,
    /// Repair rounds (each asks one peer for a bounded run of ops).
    pub repair_rounds: u64,
    /// Repair rounds that brought nothing, so the next asked another peer.
    pub repair_rounds_unanswered: u64,
    /// Restarted replicas that fell back to a view change.
    pub recovery_view_changes: u64,
    /// Retried requests answered with their original op and offset (DESIGN.md §4).
    pub duplicates: u64,
    /// Retries the admin group's log held twice, which its client table answered without
    /// executing them again.
    pub admin_duplicates: u64,
    /// Admin machine snapshots saved (every `ADMIN_SNAPSHOT_INTERVAL_OPS` applied ops).
    pub admin_snapshots: u64,
    /// Data groups' producer table snapshots saved.
    pub producer_snapshots: u64,
    /// Admin machine states handed to a replica for a peer's state transfer.
    pub admin_states_served: u64,
    /// Admin machines that became a peer's state through a state transfer.
    pub admin_states_transferred: u64,
    /// Crashes (all kinds).
    pub crashes: u64,
    /// Crashes that were power losses.
    pub power_losses: u64,
    /// Power losses in the middle of an I/O round.
    pub crashes_during_io: u64,
    /// Unsynced writes torn by a power loss.
    pub torn_writes: u64,
    /// Unsynced writes lost by a power loss.
    pub writes_lost: u64,
    /// Partitions of any kind.
    pub partitions: u64,
    /// One-way partitions.
    pub one_way_partitions: u64,
    /// Pauses.
    pub pauses: u64,
    /// Backups a primary flagged lagging.
    pub backups_lagging: u64,
    /// Backups a primary flagged dead.
    pub backups_dead: u64,
    /// Lagging or dead backups back in sync.
    pub backups_back_in_sync: u64,
    /// Writes acknowledged to clients.
    pub acknowledged: u64,
    /// Packets delivered.
    pub packets_delivered: u64,
    /// Packets lost, dropped or cut.
    pub packets_dropped: u64,
    /// Bit flips injected at rest into durable records.
    pub corruptions_injected: u64,
    /// Damage cuts (protocol-aware recovery) the nodes made.
    pub damage_cuts: u64,
    /// Repair answers that a peer's retention removed the op asked for.
    pub ranges_evicted: u64,
    /// State transfers installed (a backup's log replaced by one beginning at a peer's state).
    pub transfers_installed: u64,
    /// Prepares of an older view above the log view's start, dropped as a dead branch.
    pub stale_prepares_dropped: u64,
    /// Damage cuts whose ops came back from peers.
    pub damage_repaired: u64,
    /// Ops past damage cuts repaired from peers.
    pub damaged_ops_repaired: u64,
    /// Groups reopened after a read found damage while serving a peer.
    pub groups_reopened: u64,
    /// Reads failed with EIO.
    pub read_errors: u64,
    /// Node opens that failed (a read error or a full disk during recovery) and were retried.
    pub opens_failed: u64,
    /// Nodes restarted because a group stopped (fail-stop, then reopened by the supervisor).
    pub failed_restarts: u64,
    /// Periods of a full disk.
    pub disk_full_periods: u64,
    /// I/O rounds in which a full disk deferred writes.
    pub storage_full_rounds: u64,
}

impl Coverage {
    fn add_replica(&mut self, counters: &ReplicaCounters) {
        self.votes_cast += counters.votes_cast;
        self.votes_withdrawn += counters.votes_withdrawn;
        self.views_started += counters.views_started;
        self.start_views_installed += counters.start_views_installed;
        self.ops_nacked += counters.ops_nacked;
        self.bodies_fetched_for_view += counters.bodies_fetched_for_view;
        self.merges_stalled += counters.merges_stalled;
        self.older_ops_found += counters.older_ops_found;
        self.truncations += counters.truncations;
        self.retransmissions += counters.retransmissions;
        self.repairs_requested += counters.repairs_requested;
        self.repair_rounds += counters.repair_rounds;
        self.repair_rounds_unanswered += counters.repair_rounds_unanswered;
        self.recovery_view_changes += counters.recovery_view_changes;
        self.backups_lagging += counters.backups_lagging;
        self.backups_dead += counters.backups_dead;
        self.backups_back_in_sync += counters.backups_back_in_sync;
        self.duplicates += counters.duplicates;
        self.ranges_evicted += counters.ranges_evicted;
        self.transfers_installed += counters.transfers_installed;
        self.stale_prepares_dropped += counters.stale_prepares_dropped;
    }

    /// Adds another run's counters.
    pub fn add(&mut self, other: &Coverage) {
        let pairs = [
            (&mut self.votes_cast, other.votes_cast),
            (&mut self.votes_withdrawn, other.votes_withdrawn),
            (&mut self.views_started, other.views_started),
            (&mut self.start_views_installed, other.start_views_installed),
            (&mut self.ops_nacked, other.ops_nacked),
            (&mut self.bodies_fetched_for_view, other.bodies_fetched_for_view),
            (&mut self.merges_stalled, other.merges_stalled),
            (&mut self.older_ops_found, other.older_ops_found),
            (&mut self.truncations, other.truncations),
            (&mut self.retransmissions, other.retransmissions),
            (&mut self.repairs_requested, other.repairs_requested),
            (&mut self.repair_rounds, other.repair_rounds),
            (&mut self.repair_rounds_unanswered, other.repair_rounds_unanswered),
            (&mut self.recovery_view_changes, other.recovery_view_changes),
            (&mut self.duplicates, other.duplicates),
            (&mut self.admin_duplicates, other.admin_duplicates),
            (&mut self.admin_snapshots, other.admin_snapshots),
            (&mut self.producer_snapshots, other.producer_snapshots),
            (&mut self.ranges_evicted, other.ranges_evicted),
            (&mut self.transfers_installed, other.transfers_installed),
            (&mut self.stale_prepares_dropped, other.stale_prepares_dropped),
            (&mut self.admin_states_served, other.admin_states_served),
            (&mut self.admin_states_transferred, other.admin_states_transferred),
            (&mut self.crashes, other.crashes),
            (&mut self.power_losses, other.power_losses),
            (&mut self.crashes_during_io, other.crashes_during_io),
            (&mut self.torn_writes, other.torn_writes),
            (&mut self.writes_lost, other.writes_lost),
            (&mut self.partitions, other.partitions),
            (&mut self.one_way_partitions, other.one_way_partitions),
            (&mut self.pauses, other.pauses),
            (&mut self.backups_lagging, other.backups_lagging),
            (&mut self.backups_dead, other.backups_dead),
            (&mut self.backups_back_in_sync, other.backups_back_in_sync),
            (&mut self.acknowledged, other.acknowledged),
            (&mut self.packets_delivered, other.packets_delivered),
            (&mut self.packets_dropped, other.packets_dropped),
            (&mut self.corruptions_injected, other.corruptions_injected),
            (&mut self.damage_cuts, other.damage_cuts),
            (&mut self.damage_repaired, other.damage_repaired),
            (&mut self.damaged_ops_repaired, other.damaged_ops_repaired),
            (&mut self.groups_reopened, other.groups_reopened),
            (&mut self.read_errors, other.read_errors),
            (&mut self.opens_failed, other.opens_failed),
            (&mut self.failed_restarts, other.failed_restarts),
            (&mut self.disk_full_periods, other.disk_full_periods),
            (&mut self.storage_full_rounds, other.storage_full_rounds),
        ];
        for (mine, theirs) in pairs {
            *mine += theirs;
        }
    }
}

/// The result of one run.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// The mode the run used.
    pub mode: Mode,
    /// Hash of every delivery, reply and commit in order: equal for equal seeds.
    pub trace_hash: u64,
    /// Ticks simulated.
    pub ticks: u64,
    /// Branches exercised.
    pub coverage: Coverage,
    /// The first invariant violated, if any.
    pub violation: Option<Violation>,
}

/// A broken invariant, with the tick it was found at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// When.
    pub tick: u64,
    /// Which invariant, and the evidence.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tick {}: {}", self.tick, self.what)
    }
}

/// Runs one seed to the end (or to the first violation, or to a panic inside the system under
/// test, which the caller may catch).
pub fn run(options: &SimOptions) -> Outcome {
    let mut cluster = Cluster::new(options);
    let violation = cluster.run().err();
    cluster.finish(violation)
}

// --- The cluster under test ------------------------------------------------------------------

const DATA_DIR: &str = "/data";
/// Ticks a client waits for a reply before trying the next node.
const CLIENT_TIMEOUT_TICKS: u64 = 400;

/// How often nodes enforce retention when a run configures it.
pub const RETENTION_INTERVAL_TICKS: u64 = 100;
/// Deliveries buffered for a paused node at most.
const PAUSED_INBOX_MAX: usize = 1_024;
/// Deliveries a run may make at most before it is declared a livelock.
const DELIVERIES_MAX: u64 = 50_000_000;

#[derive(Clone, Debug)]
enum Packet {
    Replica(Bytes),
    Request { group: u64, client: u64, request: u64, body: Bytes },
    Reply { group: u64, reply: Reply },
}

/// The transport of a simulated node: packets wait here until the simulator takes them.
#[derive(Default)]
struct Outbox {
    packets: Vec<(u8, Bytes)>,
}

impl Transport for Outbox {
    fn send(&mut self, to: u8, packet: Bytes) {
        self.packets.push((to, packet));
    }
}

/// The simulated wall clock, shared by every node.
#[derive(Clone)]
struct SimClock(Rc<Cell<i64>>);

impl Clock for SimClock {
    fn now_ms(&self) -> i64 {
        self.0.get()
    }
}

type SimNode = Node<SimStorage, Outbox, SimClock>;

struct NodeSlot {
    sim: Sim,
    node: Option<SimNode>,
    restart_tick: u64,
    paused_until_tick: u64,
    inbox: VecDeque<(usize, Packet)>,
    /// Per group, the highest (view, log view) the replica was told is durable.
    durable_views: BTreeMap<u64, (u32, u32)>,
    /// The admin group's state machine on this node, while the node is up and the machine
    /// could follow its whole log (a log retention or a state transfer cut short is not
    /// followed).
    admin: Option<AdminMachine>,
    /// Per data group, the op of the newest producer table snapshot saved (as the server
    /// saves one with its offsets).
    producers_saved_op: BTreeMap<u64, u64>,
}

struct Client {
    id: u64,
    group: u64,
    next_request: u64,
    pending: Option<Pending>,
    target: u8,
    ready_tick: u64,
    /// Requests completed since the liveness phase began.
    completed_late: u64,
    /// The idempotent producer's epoch, and the request its sequence 0 went with.
    epoch: i16,
    epoch_first_request: u64,
}

#[derive(Clone, Debug)]
struct Pending {
    request: u64,
    body: Bytes,
    resend_tick: u64,
    /// Sent to `target` with no answer yet: the next send is a retry after a timeout, and goes
    /// to another node.
    unanswered: bool,
}

/// One acknowledged write: where the client was told it is.
#[derive(Clone, Copy, Debug)]
struct Ack {
    group: u64,
    op: u64,
    base_offset: u64,
    client: u64,
    request: u64,
}

/// A bit flipped at rest in a node's durable record. It counts as damage until the node has cut
/// or repaired it (the byte no longer holds the flipped value, or the file is gone).
#[derive(Clone, Debug)]
struct Damage {
    node: usize,
    group: u64,
    op: u64,
    path: PathBuf,
    /// Where the damaged record begins.
    record_bytes: u64,
    byte: u64,
    flipped: u8,
}

/// A durable record found on a node's disk: (op, file, position, size).
type DiskRecord = (u64, PathBuf, u64, u64);

/// Bytes a full disk leaves free at most.
const DISK_FULL_SLACK_BYTES: u64 = 32 << 10;

/// Newest records (per group, on the node's visible log) that damage injected at restart may
/// hit: a restarted node reads them back (the checkpoint record, its newest headers), so the
/// damage is found then, not left latent for the rest of the run.
const DAMAGE_NEWEST_OPS: u64 = 64;

/// A simulated cluster, for [`run`] and for scripted scenarios.
pub struct Cluster {
    options: SimOptions,
    mode: Mode,
    faults: FaultProfile,
    rng: SimRng,
    tick: u64,
    clock: Rc<Cell<i64>>,
    network: Network<Packet>,
    nodes: Vec<NodeSlot>,
    clients: Vec<Client>,
    /// (group, op) → checksum of the committed prepare, as first seen on any replica.
    committed: BTreeMap<(u64, u64), u32>,
    /// Every admin request's execution, as any machine first applied it.
    admin_executions: Executions,
    acks: Vec<Ack>,
    /// A client saw a reply that only a broken producer table gives.
    client_violation: Option<Violation>,
    heal_tick: u64,
    /// Faults are injected while true (the fault phase of [`run`]); scripted runs drive their
    /// own.
    faults_active: bool,
    crashes_due: Vec<usize>,
    clients_active: bool,
    liveness_from_tick: u64,
    coverage: Coverage,
    trace: u64,
    deliveries: u64,
    /// Damage injected at rest, healed entries pruned as the run goes.
    damage: Vec<Damage>,
    /// The node whose disk is full, and until which tick.
    disk_full: Option<(usize, u64)>,
}

impl Cluster {
    /// Builds the cluster of `options`: every node up with every group created.
    pub fn new(options: &SimOptions) -> Cluster {
        let mut rng = SimRng::new(options.seed);
        let faults = options.faults.unwrap_or_else(|| FaultProfile::swarm(&mut rng));
        let mode = options.mode.unwrap_or_else(|| match rng.below(3) {
            0 => Mode::Persisted,
            1 => Mode::Replicated,
            _ => Mode::Mixed,
        });
        let replicas = usize::from(options.replicas);
        let client_count = (options.groups * options.clients_per_group) as usize;
        let network = Network::new(replicas + client_count, faults.network, rng.next_u64());
        let clock = Rc::new(Cell::new(0));
        let mut cluster = Cluster {
            options: *options,
            mode,
            faults,
            rng,
            tick: 0,
            clock,
            network,
            nodes: Vec::new(),
            clients: Vec::new(),
            committed: BTreeMap::new(),
            admin_executions: Executions::new(),
            acks: Vec::new(),
            client_violation: None,
            heal_tick: u64::MAX,
            faults_active: options.faults != Some(FaultProfile::none()),
            crashes_due: Vec::new(),
            clients_active: true,
            liveness_from_tick: u64::MAX,
            coverage: Coverage::default(),
            trace: 0xcbf2_9ce4_8422_2325,
            deliveries: 0,
            damage: Vec::new(),
            disk_full: None,
        };
        for index in 0..options.replicas {
            let sim = Sim::new(cluster.rng.next_u64(), SimConfig::default());
            let mut node = cluster.open_node(&sim, index).expect("a fresh simulated node opens");
            for group in 1..=options.groups {
                let config = cluster.group_config(group);
                sim.block_on(node.create_group(group, config)).expect("create group");
                // Retention deletes nothing the group's snapshot (the admin machine's, or a
                // data group's producer table) does not cover.
                let log = node.shard_mut().group_mut(group).expect("created");
                log.set_retention_floor(0);
            }
            cluster.nodes.push(NodeSlot {
                sim,
                node: Some(node),
                restart_tick: 0,
                paused_until_tick: 0,
                inbox: VecDeque::new(),
                durable_views: BTreeMap::new(),
                admin: cluster.admin_group().map(|_| AdminMachine::new()),
                producers_saved_op: BTreeMap::new(),
            });
        }
        if cluster.faults_active {
            for slot in &cluster.nodes {
                slot.sim.set_read_error_one_in(cluster.faults.read_error_one_in);
            }
        }
        for index in 0..client_count as u64 {
            let group = index / options.clients_per_group + 1;
            cluster.clients.push(Client {
                id: index + 1,
                group,
                next_request: 1,
                pending: None,
                target: 0,
                ready_tick: 0,
                completed_late: 0,
                epoch: 0,
                epoch_first_request: 1,
            });
        }
        cluster
    }

    fn group_config(&self, group: u64) -> GroupConfig {
        let durability = match self.mode {
            Mode::Persisted => Durability::Persisted,
            Mode::Replicated => Durability::Replicated,
            Mode::Mixed if group % 2 == 1 => Durability::Persisted,
            Mode::Mixed => Durability::Replicated,
        };
        GroupConfig {
            durability,
            segment_size_bytes: 1 << 20,
            segment_age_ms_max: 0,
            retention_bytes: self.options.retention_bytes,
            retention_ms: 0,
            record_size_bytes_max: (HEADER_SIZE + 4096) as u32,
        }
    }

    fn node_config(&self, index: u8) -> NodeConfig {
        let mut replica = ReplicaConfig::new(0x5ea1, 0, self.options.replicas, 0);
        // Faster timers than production keep runs short; the ratios between them are kept.
        replica.heartbeat_timeout_ticks = 100;
        replica.view_change_timeout_ticks = 200;
        let mut draw = SimRng::new(self.options.seed ^ 0x7e9a_1c00);
        let per_round_max = if draw.chance(1, 2) { 4 } else { 128 };
        replica.repair_prepares_max = self
            .options
            .repair_prepares_max
            .unwrap_or_else(|| 1 + draw.below(per_round_max) as usize);
        replica.replica_lag_ticks_max = self.options.replica_lag_ticks_max;
        replica.unclean_recovery = self.options.unclean_recovery;
        // Small, so a state transfer of even a few producers takes several pieces.
        replica.state_chunk_bytes_max = 256;
        // The admin group's machine rides along in its transfers.
        replica.transfers_carry_driver_state = true;
        NodeConfig::new(index, replica)
    }

    fn shard_config() -> ShardConfig {
        ShardConfig { cluster: 0x5ea1, ..ShardConfig::small() }
    }

    /// Opens node `index` on its disk; fails when recovery could not read or write it (a read
    /// error, a full disk): the caller retries, as a supervisor restarting the process would.
    /// Every data group's producer table comes from its newest snapshot plus the log past it,
    /// and retention may delete only what that snapshot covers, as in the server.
    fn open_node(&self, sim: &Sim, index: u8) -> shoal_engine::Result<SimNode> {
        let dir = shard_dir(Path::new(DATA_DIR), 0);
        let clock = SimClock(Rc::clone(&self.clock));
        let storage = sim.storage();
        let admin_group = self.admin_group();
        let floors = RefCell::new(BTreeMap::new());
        let load_producers = async |group: u64| {
            if admin_group == Some(group) {
                return None;
            }
            let saved = state::load(&storage, &sim_group_dir(group)).await.ok().flatten();
            floors.borrow_mut().insert(group, saved.as_ref().map_or(0, |s| s.end_offset));
            saved.map(|saved| saved.bytes)
        };
        let open = Node::open_with_producer_snapshots(
            sim.storage(),
            &dir,
            Cluster::shard_config(),
            self.node_config(index),
            Outbox::default(),
            clock,
            self.options.seed ^ u64::from(index),
            load_producers,
        );
        let mut node = sim.block_on(open).map(|(node, _)| node)?;
        for (group, floor) in floors.into_inner() {
            if let Some(log) = node.shard_mut().group_mut(group) {
                log.set_retention_floor(floor);
            }
        }
        Ok(node)
    }

    /// The whole run: the fault phase, then the liveness phase.
    fn run(&mut self) -> Result<(), Violation> {
        while self.tick < self.options.ticks {
            self.step()?;
        }
        self.finish_liveness()
    }

    /// One tick: faults (during the fault phase), restarts, deliveries, every live node's tick
    /// and I/O round, their outputs, then the clients.
    pub fn step(&mut self) -> Result<(), Violation> {
        self.tick += 1;
        self.clock.set(self.tick as i64 * 10);
        if self.faults_active {
            if self.tick < self.options.ticks {
                self.inject_faults();
            } else {
                self.stop_faults();
            }
        }
        into_result(self.wake_nodes())?;
        into_result(self.deliver())?;
        for index in 0..self.nodes.len() {
            if let Some(node) = self.live_node(index) {
                node.on_tick();
            }
        }
        for index in std::mem::take(&mut self.crashes_due) {
            if self.nodes[index].node.is_some() {
                self.maybe_crash(index);
            }
        }
        into_result(self.run_io())?;
        if self.options.retention_bytes > 0 && self.tick.is_multiple_of(RETENTION_INTERVAL_TICKS) {
            self.enforce_retention();
        }
        into_result(self.collect())?;
        into_result(self.client_violation.take())?;
        self.supervise();
        self.drive_clients();
        Ok(())
    }

    /// Lets every live node delete what its groups' retention allows.
    fn enforce_retention(&mut self) {
        let now_ms = self.clock.get();
        for index in 0..self.nodes.len() {
            let Some(NodeSlot { sim, node: Some(node), .. }) = self.live_slot(index) else {
                continue;
            };
            // A failure here is the engine's fail-stop, which the final checks report.
            let _ = sim.block_on(node.enforce_retention(now_ms));
        }
    }

    /// Fail-stop with automatic reopen: a node with a group its engine stopped (an I/O failure)
    /// is restarted, as a supervisor restarts the process, and recovery reopens the group. (A
    /// group of one that finds damage stays stopped across restarts, DESIGN.md §6; nothing here
    /// damages a group of one.)
    fn supervise(&mut self) {
        for index in 0..self.nodes.len() {
            let Some(node) = &self.nodes[index].node else { continue };
            if node.group_ids().iter().all(|&group| node.group_failure(group).is_none()) {
                continue;
            }
            self.coverage.failed_restarts += 1;
            self.crash_node(index, false, false);
            self.nodes[index].restart_tick = self.tick + 1;
        }
    }

    /// Runs `ticks` steps.
    pub fn run_ticks(&mut self, ticks: u64) -> Result<(), Violation> {
        for _ in 0..ticks {
            self.step()?;
        }
        Ok(())
    }

    /// Steps until `done` holds (true) or `ticks_max` steps passed (false).
    pub fn run_until(
        &mut self,
        ticks_max: u64,
        mut done: impl FnMut(&Cluster) -> bool,
    ) -> Result<bool, Violation> {
        for _ in 0..ticks_max {
            if done(self) {
                return Ok(true);
            }
            self.step()?;
        }
        Ok(done(self))
    }

    /// Ends every fault, then requires each client to complete `liveness_requests` more
    /// requests within `liveness_ticks`.
    pub fn finish_liveness(&mut self) -> Result<(), Violation> {
        self.stop_faults();
        self.clients_active = true;
        self.liveness_from_tick = self.tick;
        for client in &mut self.clients {
            client.completed_late = 0;
        }
        for _ in 0..self.options.liveness_ticks {
            self.step()?;
            if self.liveness_done() {
                return Ok(());
            }
        }
        let stuck: Vec<String> = self
            .clients
            .iter()
            .filter(|c| c.completed_late < self.options.liveness_requests)
            .map(|c| format!("client {} (group {}) request {}", c.id, c.group, c.next_request))
            .collect();
        Err(Violation {
            tick: self.tick,
            what: format!(
                "liveness: {} ticks after faults stopped, still waiting: {}; {}",
                self.options.liveness_ticks,
                stuck.join(", "),
                self.describe()
            ),
        })
    }

    /// The current tick.
    pub fn tick(&self) -> u64 {
        self.tick
    }

    /// The replica of `group` on node `node`, when the node is up.
    pub fn replica(&self, node: usize, group: u64) -> Option<&Replica> {
        self.nodes[node].node.as_ref()?.replica(group)
    }

    /// Forgets the committed history and the acknowledgements so far: after an unclean
    /// recovery (`unclean_recovery`) a group may reissue ops and offsets, the documented loss,
    /// and only what happens from here on is checked.
    pub fn forget_history(&mut self) {
        self.committed.clear();
        self.acks.clear();
        // The group may have forgotten the producers' last batches too: as a Kafka producer
        // does after an unclean election, each starts a new epoch from sequence 0.
        for client in &mut self.clients {
            client.pending = None;
            client.epoch += 1;
            client.epoch_first_request = client.next_request;
        }
    }

    /// The oldest op node `node`'s log of `group` still holds (retention removes from the
    /// front), when the node is up.
    pub fn log_first_op(&self, node: usize, group: u64) -> Option<u64> {
        Some(self.nodes[node].node.as_ref()?.shard().group(group)?.first_op())
    }

    /// Node `node`'s admin machine: the op it applied last and its state's bytes, when the
    /// node is up and the machine follows the group's log.
    pub fn admin_state(&self, node: usize) -> Option<(u64, Vec<u8>)> {
        let machine = self.nodes[node].admin.as_ref()?;
        Some((machine.op(), machine.encode()))
    }

    /// The node layer's counters of node `node`, when it is up (they restart with the node).
    pub fn node_counters(&self, node: usize) -> Option<NodeCounters> {
        Some(self.nodes[node].node.as_ref()?.counters())
    }

    /// `group` as node `node`'s replica sees it (lag and in-sync set on the primary), when the
    /// node is up.
    pub fn group_status(&self, node: usize, group: u64) -> Option<GroupStatus> {
        self.nodes[node].node.as_ref()?.group_status(group)
    }

    /// The node whose replica of `group` is a normal primary in the highest view, if any.
    pub fn primary(&self, group: u64) -> Option<usize> {
        (0..self.nodes.len())
            .filter_map(|n| {
                self.replica(n, group).filter(|r| r.is_primary()).map(|r| (r.view(), n))
            })
            .max()
            .map(|(_, n)| n)
    }

    /// Whether node `node` is up.
    pub fn is_up(&self, node: usize) -> bool {
        self.nodes[node].node.is_some()
    }

    /// Crashes node `node` now — a power loss (the simulated disk's crash semantics) or a
    /// process crash (the page cache survives) — whatever the fault model says. It stays down
    /// until [`Cluster::restart`].
    pub fn crash(&mut self, node: usize, power_loss: bool) {
        self.crash_node(node, power_loss, false);
        self.nodes[node].restart_tick = u64::MAX;
    }

    /// Restarts a crashed node now (recovery runs, its replicas start `Recovering`).
    pub fn restart(&mut self, node: usize) -> Result<(), Violation> {
        assert!(self.nodes[node].node.is_none(), "restart a crashed node");
        self.nodes[node].restart_tick = self.tick;
        into_result(self.wake_nodes())
    }

    /// Cuts (or restores) the directed link `from` → `to` between nodes.
    pub fn set_link(&mut self, from: usize, to: usize, up: bool) {
        self.network.set_link(from, to, up);
    }

    /// Throttles the directed link `from` → `to` between nodes: it loses `loss_per_million` of
    /// its packets (or the network's own loss rate, where higher) until [`Cluster::heal`] or
    /// [`Cluster::stop_faults`].
    pub fn set_link_loss(&mut self, from: usize, to: usize, loss_per_million: u32) {
        self.network.set_link_loss(from, to, loss_per_million);
    }

    /// Pauses node `node` for the next `ticks` steps, as a stopped process: it neither ticks nor
    /// runs I/O, and what arrives meanwhile waits in its inbox (at most `PAUSED_INBOX_MAX`
    /// packets; the rest are lost). [`Cluster::stop_faults`] resumes it early.
    pub fn pause(&mut self, node: usize, ticks: u64) {
        self.coverage.pauses += 1;
        self.nodes[node].paused_until_tick = self.tick + 1 + ticks;
    }

    /// Cuts a node off in both directions until [`Cluster::heal`].
    pub fn isolate(&mut self, node: usize) {
        self.network.isolate(node);
    }

    /// Brings every link back up.
    pub fn heal(&mut self) {
        self.network.heal();
    }

    /// Whether clients issue new requests (outstanding ones are still retried).
    pub fn set_clients_active(&mut self, active: bool) {
        self.clients_active = active;
    }

    /// Writes acknowledged to clients so far.
    pub fn acknowledged(&self) -> u64 {
        self.acks.len() as u64
    }

    /// The coverage so far: crashed replicas' counters and the live ones'.
    pub fn coverage(&self) -> Coverage {
        let mut coverage = self.coverage;
        for slot in &self.nodes {
            if let Some(node) = &slot.node {
                add_counters(&mut coverage, node);
            }
            coverage.admin_duplicates += slot.admin.as_ref().map_or(0, |a| a.duplicates);
        }
        coverage
    }

    /// Checks the final logs (see [`Cluster::finish`]).
    pub fn check_logs(&mut self) -> Result<(), Violation> {
        into_result(self.check_final_logs())
    }

    /// Runs the offline checker (`shoal_engine::inspect`) over every node's simulated disk: it
    /// must find no damage but what was injected and not yet cut or repaired. The torn window
    /// past a checkpoint, zeros and stale bytes past a chain's end are notes, never problems,
    /// so a live node's disk (unsynced writes visible, as after a process crash) is judged the
    /// same way as a crash image.
    pub fn check_disks(&mut self) -> Result<(), Violation> {
        into_result(self.check_disk_images())
    }

    /// Shuts node `node` down cleanly (everything flushed and checkpointed, a clean shutdown
    /// recorded); it stays down until [`Cluster::restart`].
    pub fn shutdown(&mut self, node: usize) {
        let slot = &mut self.nodes[node];
        let closing = slot.node.take().expect("shut down a live node");
        add_counters(&mut self.coverage, &closing);
        self.coverage.admin_duplicates += slot.admin.take().map_or(0, |a| a.duplicates);
        slot.sim.block_on(closing.close()).expect("a clean shutdown");
        slot.inbox.clear();
        slot.paused_until_tick = 0;
        slot.restart_tick = u64::MAX;
        self.network.drop_endpoint_inbound(node);
    }

    /// Flips one bit at rest in the durable record of `op` of `group` on node `node`'s disk
    /// (chosen by the seed): latent damage, found when the record is next read. False when no
    /// durable copy of the op is on that disk.
    pub fn corrupt_op(&mut self, node: usize, group: u64, op: u64) -> bool {
        let records = self.chain_records(node, group);
        let Some(record) = records.into_iter().find(|r| r.0 == op) else { return false };
        self.flip(node, group, record)
    }

    /// Nodes holding damage to `op` of `group` that they have not cut or repaired yet.
    pub fn damaged_replicas(&self, group: u64, op: u64) -> usize {
        self.damage.iter().filter(|d| d.group == group && d.op == op && self.unhealed(d)).count()
    }

    /// The checksums of every op node `node` holds of `group`, from its engine's log (first
    /// op first), when the node is up and can read them.
    pub fn log_checksums(&mut self, node: usize, group: u64) -> Option<Vec<(u64, u32)>> {
        let slot = &mut self.nodes[node];
        let node = slot.node.as_mut()?;
        let log = node.shard_mut().group_mut(group)?;
        let mut out = Vec::new();
        for op in log.first_op().max(1)..=log.head_op() {
            let stored = slot.sim.block_on(log.read_op(op)).ok()??;
            out.push((op, stored.header.checksum_header));
        }
        Some(out)
    }

    /// Every replica's protocol state, for a violation report.
    fn describe(&self) -> String {
        let mut out = String::new();
        for (index, slot) in self.nodes.iter().enumerate() {
            let Some(node) = &slot.node else {
                out.push_str(&format!("[node {index} down] "));
                continue;
            };
            for group in node.group_ids() {
                let Some(r) = node.replica(group) else { continue };
                out.push_str(&format!(
                    "[node {index} group {group}: {:?} view {} log_view {} op {} appended {} \
                     commit {} faulty_from {:?} failed {:?} next {:?} {:?}] ",
                    r.status(),
                    r.view(),
                    r.log_view(),
                    r.op(),
                    r.op_appended(),
                    r.commit(),
                    r.faulty_from(),
                    node.group_failure(group),
                    [24u64, 28].map(|o| r.header(o).map(|h| (h.checksum_header, h.view))),
                    r.counters(),
                ));
            }
        }
        out
    }

    fn liveness_done(&self) -> bool {
        self.clients.iter().all(|c| c.completed_late >= self.options.liveness_requests)
            && self.replicas_rejoined()
    }

    /// Every replica of every group is up, normal in its primary's view and holds everything
    /// that primary committed: nobody is left behind once faults stop.
    fn replicas_rejoined(&self) -> bool {
        (1..=self.options.groups).all(|group| {
            let Some(primary) = self.primary(group).and_then(|n| self.replica(n, group)) else {
                return false;
            };
            (0..self.nodes.len()).all(|node| {
                self.replica(node, group).is_some_and(|r| {
                    r.status() == Status::Normal
                        && r.view() == primary.view()
                        && r.op_appended() >= primary.commit()
                })
            })
        })
    }

    // --- Faults ----------------------------------------------------------------------------

    fn inject_faults(&mut self) {
        let faults = self.faults;
        self.damage_prune();
        match self.disk_full {
            Some((index, until)) if self.tick >= until => {
                self.nodes[index].sim.set_capacity_bytes(u64::MAX);
                self.disk_full = None;
            }
            Some(_) => {}
            None if self.rng.chance(u64::from(faults.disk_full_per_million), 1_000_000) => {
                let index = self.rng.below(self.nodes.len() as u64) as usize;
                let sim = &self.nodes[index].sim;
                sim.set_capacity_bytes(sim.used_bytes() + self.rng.below(DISK_FULL_SLACK_BYTES));
                self.coverage.disk_full_periods += 1;
                self.disk_full =
                    Some((index, self.tick + 1 + self.rng.below(faults.disk_full_ticks_max)));
            }
            None => {}
        }
        if self.tick >= self.heal_tick {
            self.network.heal();
            self.heal_tick = u64::MAX;
        }
        if self.heal_tick == u64::MAX
            && self.rng.chance(u64::from(faults.partition_per_million), 1_000_000)
        {
            self.partition();
        }
        for index in 0..self.nodes.len() {
            if self.nodes[index].node.is_none() {
                continue;
            }
            if self.rng.chance(u64::from(faults.crash_per_million), 1_000_000) {
                // Struck later in the step, once this tick's deliveries queued writes, so a
                // power loss can land in the middle of an I/O round.
                self.crashes_due.push(index);
            } else if self.rng.chance(u64::from(faults.pause_per_million), 1_000_000)
                && self.nodes[index].paused_until_tick <= self.tick
            {
                self.coverage.pauses += 1;
                self.nodes[index].paused_until_tick =
                    self.tick + 1 + self.rng.below(faults.pause_ticks_max);
            }
        }
    }

    /// Damages a crashed node's disk before it restarts, within the budget: never while any
    /// other node holds damage it has not cut or repaired (so at most one replica per op, and
    /// f ≥ 1), never in a group of one (no peer to repair from: out of the model, DESIGN.md §6).
    /// The record is one of the node's newest durable ones, which recovery reads back.
    fn inject_damage(&mut self, index: usize) {
        if self.nodes.len() < 3 || self.damage.iter().any(|d| d.node != index && self.unhealed(d)) {
            return;
        }
        let group = 1 + self.rng.below(self.options.groups);
        let chain = self.chain_records(index, group);
        let newest = chain.last().map_or(0, |r| r.0);
        let sim = &self.nodes[index].sim;
        // Only where a read sees the durable bytes: an unsynced write a process crash left in
        // the page cache would hide the damage until a power loss.
        let candidates: Vec<DiskRecord> = chain
            .into_iter()
            .filter(|r| r.0 + DAMAGE_NEWEST_OPS > newest)
            .filter(|(_, path, position, size)| {
                let range = *position as usize..(position + size) as usize;
                let visible = sim.file_contents(path);
                let durable = sim.durable_contents(path);
                visible.as_ref().and_then(|v| v.get(range.clone()))
                    == durable.as_ref().and_then(|d| d.get(range.clone()))
            })
            .collect();
        if candidates.is_empty() {
            return;
        }
        let record = candidates[self.rng.below(candidates.len() as u64) as usize].clone();
        let _ = self.flip(index, group, record);
    }

    /// Flips a bit of the record; false (and undone) when the byte is not durable, or an
    /// unsynced write in the page cache covers it, so that no read would see the damage.
    fn flip(&mut self, node: usize, group: u64, (op, path, position, size): DiskRecord) -> bool {
        let sim = &self.nodes[node].sim;
        let byte = position + self.rng.below(size);
        let bit = self.rng.below(8) as u8;
        let durable = sim.durable_contents(&path).map_or(0, |bytes| bytes.len() as u64);
        let visible = |sim: &Sim| sim.file_contents(&path).map(|bytes| bytes[byte as usize]);
        let before = visible(sim);
        if byte >= durable || before.is_none() {
            return false;
        }
        sim.corrupt(&path, byte, bit);
        let flipped = visible(sim).unwrap_or(0);
        if Some(flipped) == before {
            sim.corrupt(&path, byte, bit);
            return false;
        }
        self.coverage.corruptions_injected += 1;
        self.damage.push(Damage { node, group, op, path, record_bytes: position, byte, flipped });
        true
    }

    /// The records of `group`'s chain in node `node`'s segments as a read sees them now: from
    /// the first segment's first record, each the next op naming its predecessor's checksum,
    /// until the first that is not. Stale records past the chain's end (from before a
    /// truncation) are not the log's, and never chosen for damage.
    fn chain_records(&self, node: usize, group: u64) -> Vec<DiskRecord> {
        let sim = &self.nodes[node].sim;
        let dir = shoal_engine::shard::group_dir(&shard_dir(Path::new(DATA_DIR), 0), group);
        let record_max = self.group_config(group).record_size_bytes_max as usize;
        let mut files: Vec<(u64, PathBuf)> = sim
            .paths()
            .into_iter()
            .filter(|path| path.parent() == Some(dir.as_path()))
            .filter_map(|path| {
                let name = path.file_name()?.to_str()?;
                Some((shoal_engine::segment::parse_log_name(name)?, path.clone()))
            })
            .collect();
        files.sort();
        let mut records: Vec<DiskRecord> = Vec::new();
        let mut previous: Option<(u64, u32)> = None;
        'files: for (_, path) in files {
            let Some(bytes) = sim.file_contents(&path) else { continue };
            let mut position = 0usize;
            while position < bytes.len() {
                let Ok(header) = shoal_engine::record::check_standalone(
                    &bytes[position..],
                    0x5ea1,
                    group,
                    record_max,
                ) else {
                    break;
                };
                let Some(prepare) = header.as_prepare() else { break };
                if previous.is_some_and(|(op, checksum)| {
                    prepare.op != op + 1 || prepare.parent != checksum
                }) {
                    break 'files;
                }
                previous = Some((prepare.op, header.checksum_header));
                records.push((prepare.op, path.clone(), position as u64, u64::from(header.size)));
                position += header.size as usize;
            }
        }
        records
    }

    /// Whether damage still counts against the budget: the byte still holds the flipped value,
    /// or the node cut it and has not had the cut ops back yet (its replica is down, still has
    /// a faulty suffix, or its log still carries the damage marker) — a faulty suffix may hide
    /// any op past the cut, so it counts as damage to all of them.
    fn unhealed(&self, damage: &Damage) -> bool {
        self.damage_on_disk(damage)
            || self.nodes[damage.node].node.as_ref().is_none_or(|node| {
                node.damaged_from(damage.group).is_some()
                    || node.replica(damage.group).is_none_or(|r| r.faulty_from().is_some())
            })
    }

    /// Whether the damaged byte still holds the flipped value.
    fn damage_on_disk(&self, damage: &Damage) -> bool {
        self.nodes[damage.node]
            .sim
            .file_contents(&damage.path)
            .is_some_and(|bytes| bytes.get(damage.byte as usize) == Some(&damage.flipped))
    }

    fn node_damaged(&self, index: usize) -> bool {
        self.damage.iter().any(|d| d.node == index && self.unhealed(d))
    }

    fn damage_prune(&mut self) {
        let damage = std::mem::take(&mut self.damage);
        self.damage = damage.into_iter().filter(|d| self.unhealed(d)).collect();
    }

    fn partition(&mut self) {
        let n = self.nodes.len();
        if n < 2 {
            return;
        }
        self.coverage.partitions += 1;
        let a = self.rng.below(n as u64) as usize;
        let b = (a + 1 + self.rng.below(n as u64 - 1) as usize) % n;
        match self.rng.below(3) {
            0 => self.network.isolate(a),
            1 => {
                let side: Vec<usize> = (0..n).filter(|_| self.rng.chance(1, 2)).collect();
                let other: Vec<usize> = (0..n).filter(|i| !side.contains(i)).collect();
                self.network.partition(&side, &other);
            }
            _ => {
                self.coverage.one_way_partitions += 1;
                self.network.partition_one_way(&[a], &[b]);
            }
        }
        self.heal_tick = self.tick + 1 + self.rng.below(self.faults.partition_ticks_max);
    }

    /// Crashes node `index` if the fault model allows it now.
    fn maybe_crash(&mut self, index: usize) {
        let power = self.rng.chance(u64::from(self.faults.power_loss_percent), 100);
        if !self.crash_allowed(index, power) {
            return;
        }
        let during_io = self.rng.chance(u64::from(self.faults.crash_during_io_percent), 100);
        self.crash_node(index, power, during_io);
        self.nodes[index].restart_tick =
            self.tick + 1 + self.rng.below(self.faults.restart_ticks_max);
    }

    fn crash_node(&mut self, index: usize, power: bool, during_io: bool) {
        self.coverage.crashes += 1;
        let slot = &mut self.nodes[index];
        let mut node = slot.node.take().expect("crash a live node");
        add_counters(&mut self.coverage, &node);
        self.coverage.admin_duplicates += slot.admin.take().map_or(0, |a| a.duplicates);
        // What the node sent this step, before its I/O round, left before the crash: a message
        // that went out too early must be able to reveal lost state.
        let replicas = self.options.replicas as usize;
        for (to, packet) in std::mem::take(&mut node.transport_mut().packets) {
            self.network.send(self.tick, index, usize::from(to), Packet::Replica(packet));
        }
        for (group, reply) in node.take_replies() {
            let client = replicas + (reply.client - 1) as usize;
            self.network.send(self.tick, index, client, Packet::Reply { group, reply });
        }
        if power {
            self.coverage.power_losses += 1;
            let before = slot.sim.stats();
            if during_io && node.has_io() {
                self.coverage.crashes_during_io += 1;
                let after_io = 1 + self.rng.below(16);
                let _ = slot.sim.run_until_crash(node.run_io(), after_io);
            }
            drop(node);
            slot.sim.crash();
            let after = slot.sim.stats();
            self.coverage.torn_writes += after.writes_torn_at_crash - before.writes_torn_at_crash;
            self.coverage.writes_lost += after.writes_lost_at_crash - before.writes_lost_at_crash;
        } else {
            drop(node);
        }
        slot.inbox.clear();
        slot.paused_until_tick = 0;
        self.network.drop_endpoint_inbound(index);
    }

    /// DESIGN.md §6: `persisted` groups survive any crashes; `replicated` groups survive at
    /// most f replicas down, where a replica that restarted but has not caught up still counts
    /// as down; a lone `replicated` replica survives process crashes only.
    fn crash_allowed(&self, index: usize, power: bool) -> bool {
        if self.mode == Mode::Persisted {
            return true;
        }
        let n = self.nodes.len();
        if n == 1 {
            return !power;
        }
        let f = (n - 1) / 2;
        let down_others = (0..n).filter(|&i| i != index && !self.caught_up(i)).count();
        down_others < f && self.caught_up(index)
    }

    /// The highest commit point any live replica of `group` knows (0 when none is up).
    fn commit_max(&self, group: u64) -> u64 {
        self.nodes
            .iter()
            .filter_map(|slot| slot.node.as_ref()?.replica(group).map(|r| r.commit()))
            .max()
            .unwrap_or(0)
    }

    /// Whether node `index` is up and every replica on it is normal with every committed op.
    fn caught_up(&self, index: usize) -> bool {
        let Some(node) = &self.nodes[index].node else { return false };
        if self.node_damaged(index) {
            // Damage it has not cut or repaired yet: it lacks ops, like a replica that is down.
            return false;
        }
        (1..=self.options.groups).all(|group| {
            let commit_max = self.commit_max(group);
            node.replica(group).is_some_and(|r| {
                r.status() == Status::Normal
                    && !r.needs_start_view()
                    && r.faulty_from().is_none()
                    && r.op_appended() >= commit_max
            })
        })
    }

    /// Ends the fault phase: heals the network, makes it reliable, resumes paused nodes and
    /// restarts crashed ones.
    pub fn stop_faults(&mut self) {
        self.faults_active = false;
        self.network.heal();
        self.network.set_config(NetworkConfig::reliable());
        self.heal_tick = u64::MAX;
        self.disk_full = None;
        for slot in &mut self.nodes {
            slot.sim.set_read_error_one_in(0);
            slot.sim.set_capacity_bytes(u64::MAX);
            slot.paused_until_tick = 0;
            if slot.node.is_none() {
                slot.restart_tick = self.tick;
            }
        }
    }

    /// The admin group, when the run has one.
    fn admin_group(&self) -> Option<u64> {
        (self.options.admin_group && self.options.groups >= 2).then_some(self.options.groups)
    }

    /// A restarted node's admin machine, as the server rebuilds its metadata state: the newer
    /// of its snapshot and the state a transfer installed, then the log past it up to the
    /// replica's commit point. A log that cannot be read back from there is not followed.
    /// Retention may then delete only what the machine's state covers.
    fn rebuild_admin(&mut self, index: usize) -> Option<Violation> {
        let group = self.admin_group()?;
        let tick = self.tick;
        let violation =
            |what: String| Some(Violation { tick, what: format!("node {index}: {what}") });
        let slot = &mut self.nodes[index];
        slot.admin = None;
        let node = slot.node.as_mut()?;
        let commit = node.replica(group)?.commit();
        let (storage, dir) = (slot.sim.storage(), sim_group_dir(group));
        let saved = slot.sim.block_on(state::load(&storage, &dir)).ok().flatten();
        let transferred =
            slot.sim.block_on(state::load_transfer_state(&storage, &dir)).ok().flatten();
        let transferred = transferred.and_then(|state| {
            let (_, driver) = crate::decode_transfer_state(&state.bytes)?;
            Some(GroupState { bytes: driver.to_vec(), ..state })
        });
        let newest = match (saved, transferred) {
            (Some(saved), Some(transferred)) if transferred.op > saved.op => Some(transferred),
            (saved, transferred) => saved.or(transferred),
        };
        let mut machine = match newest {
            None => AdminMachine::new(),
            Some(newest) => {
                match AdminMachine::restore(newest.op, newest.end_offset, &newest.bytes) {
                    Ok(machine) => machine,
                    Err(what) => return violation(what),
                }
            }
        };
        let log = node.shard_mut().group_mut(group)?;
        log.set_retention_floor(machine.end_offset());
        if log.first_op() > machine.op() + 1 {
            return None;
        }
        for op in machine.op() + 1..=commit {
            let Ok(Some(stored)) = slot.sim.block_on(log.read_op(op)) else { return None };
            let fields = stored.header.as_prepare().expect("stored records are prepares");
            let end_offset = fields.end_offset();
            let request = (fields.client, fields.request);
            if let Err(what) = machine.apply((op, end_offset), request, &mut self.admin_executions)
            {
                return violation(format!("after its restart: {what}"));
            }
        }
        slot.admin = Some(machine);
        None
    }

    /// Feeds node `index`'s admin machine what its replica delivered for `group`, answers a
    /// peer's transfer with the machine's state, and saves a snapshot once one is due. The other
    /// groups keep no state of the driver's (their transfers carry an empty part); their
    /// producer tables are snapshotted the same way.
    fn apply_admin(
        &mut self,
        index: usize,
        group: u64,
        committed: &Committed,
    ) -> Option<Violation> {
        let tick = self.tick;
        let violation =
            |what: String| Some(Violation { tick, what: format!("node {index}: {what}") });
        let is_admin = self.admin_group() == Some(group);
        let slot = &mut self.nodes[index];
        let node = slot.node.as_mut()?;
        match committed {
            Committed::StateWanted { op } => {
                let state = if is_admin {
                    // A machine past the frozen op (a snapshot ahead of the recovered commit
                    // point) or not following cannot give the state at it: refused.
                    let machine = slot.admin.as_ref().filter(|machine| machine.op() == *op);
                    self.coverage.admin_states_served += u64::from(machine.is_some());
                    machine.map(|machine| Bytes::from(machine.encode()))
                } else {
                    Some(Bytes::new())
                };
                node.on_driver_state(group, *op, state);
                None
            }
            Committed::Op { header } if !is_admin => {
                // A data group's producer table, saved as the server saves it with its
                // offsets: once it is at this op, every `ADMIN_SNAPSHOT_INTERVAL_OPS` ops.
                let fields = header.as_prepare().expect("prepares");
                let replica = node.replica(group)?;
                let saved_op = slot.producers_saved_op.get(&group).copied().unwrap_or(0);
                if replica.producers().op() != fields.op
                    || fields.op < saved_op + ADMIN_SNAPSHOT_INTERVAL_OPS
                {
                    return None;
                }
                let bytes = replica.producers().encode();
                let saved = GroupState { op: fields.op, end_offset: fields.end_offset(), bytes };
                if save_snapshot(&slot.sim, node, group, &saved) {
                    slot.producers_saved_op.insert(group, saved.op);
                    self.coverage.producer_snapshots += 1;
                }
                None
            }
            _ if !is_admin => None,
            Committed::Transferred { header, state } => {
                let fields = header.as_prepare().expect("prepares");
                let end_offset = fields.end_offset();
                let machine = match AdminMachine::restore(fields.op, end_offset, state) {
                    Ok(machine) => machine,
                    Err(what) => return violation(what),
                };
                self.coverage.admin_duplicates += slot.admin.take().map_or(0, |a| a.duplicates);
                self.coverage.admin_states_transferred += 1;
                slot.admin = Some(machine);
                None
            }
            Committed::Op { header } => {
                let machine = slot.admin.as_mut()?;
                let fields = header.as_prepare().expect("prepares");
                let end_offset = fields.end_offset();
                let request = (fields.client, fields.request);
                let applied = (fields.op, end_offset);
                if let Err(what) = machine.apply(applied, request, &mut self.admin_executions) {
                    return violation(what);
                }
                if machine.op() < machine.snapshot_op + ADMIN_SNAPSHOT_INTERVAL_OPS {
                    return None;
                }
                let saved = GroupState {
                    op: machine.op(),
                    end_offset: machine.end_offset(),
                    bytes: machine.encode(),
                };
                if save_snapshot(&slot.sim, node, group, &saved) {
                    machine.snapshot_op = saved.op;
                    self.coverage.admin_snapshots += 1;
                }
                None
            }
        }
    }

    /// Restarts crashed nodes whose time has come, checking their views did not regress.
    fn wake_nodes(&mut self) -> Option<Violation> {
        for index in 0..self.nodes.len() {
            if self.nodes[index].node.is_none() && self.nodes[index].restart_tick <= self.tick {
                if self.faults_active
                    && self.rng.chance(u64::from(self.faults.corrupt_on_restart_percent), 100)
                {
                    self.inject_damage(index);
                }
                let node = match self.open_node(&self.nodes[index].sim, index as u8) {
                    Ok(node) => node,
                    Err(_) => {
                        // Fail-stop: the supervisor tries again next tick.
                        self.coverage.opens_failed += 1;
                        self.nodes[index].restart_tick = self.tick + 1;
                        continue;
                    }
                };
                if let Some(violation) = self.check_views_after_restart(index, &node) {
                    return Some(violation);
                }
                self.nodes[index].node = Some(node);
                if let Some(violation) = self.rebuild_admin(index) {
                    return Some(violation);
                }
            }
        }
        None
    }

    fn check_views_after_restart(&self, index: usize, node: &SimNode) -> Option<Violation> {
        for (&group, &(view, log_view)) in &self.nodes[index].durable_views {
            // A group the open stopped (a read error) has an inert stand-in replica; its
            // views stay in the superblock for the supervisor's next open, checked again then.
            if node.group_failure(group).is_some() {
                continue;
            }
            let Some(replica) = node.replica(group) else { continue };
            if replica.view() < view || replica.log_view() < log_view {
                return Some(Violation {
                    tick: self.tick,
                    what: format!(
                        "views regressed: node {index} group {group} restarted at view {} log \
                         view {} after view {view} log view {log_view} was durable",
                        replica.view(),
                        replica.log_view()
                    ),
                });
            }
        }
        None
    }

    fn live_node(&mut self, index: usize) -> Option<&mut SimNode> {
        self.live_slot(index)?.node.as_mut()
    }

    /// Node `index`'s slot, when the node is up and not paused.
    fn live_slot(&mut self, index: usize) -> Option<&mut NodeSlot> {
        let slot = &mut self.nodes[index];
        (slot.node.is_some() && slot.paused_until_tick <= self.tick).then_some(slot)
    }

    // --- Steps -----------------------------------------------------------------------------

    fn deliver(&mut self) -> Option<Violation> {
        let replicas = self.nodes.len();
        let mut deliveries: Vec<(usize, usize, Packet)> = Vec::new();
        for index in 0..replicas {
            let slot = &mut self.nodes[index];
            if slot.node.is_some() && slot.paused_until_tick <= self.tick {
                deliveries.extend(slot.inbox.drain(..).map(|(from, p)| (from, index, p)));
            }
        }
        deliveries
            .extend(self.network.deliver(self.tick).into_iter().map(|d| (d.from, d.to, d.packet)));
        for (from, to, packet) in deliveries {
            self.deliveries += 1;
            if self.deliveries > DELIVERIES_MAX {
                return Some(Violation {
                    tick: self.tick,
                    what: "livelock: delivery bound reached".into(),
                });
            }
            self.coverage.packets_delivered += 1;
            self.trace_packet(from, to, &packet);
            if to >= replicas {
                self.client_reply(to - replicas, packet);
                continue;
            }
            let slot = &mut self.nodes[to];
            if slot.paused_until_tick > self.tick {
                if slot.inbox.len() < PAUSED_INBOX_MAX {
                    slot.inbox.push_back((from, packet));
                }
                continue;
            }
            let Some(node) = slot.node.as_mut() else { continue };
            match packet {
                Packet::Replica(bytes) => {
                    if let Some(traced) = self.options.trace_group {
                        trace_message(self.tick, from, to, traced, &bytes);
                    }
                    // A packet a node cannot decode is its problem to count, never a panic.
                    let _ = node.on_packet(from as u8, &bytes);
                }
                Packet::Request { group, client, request, body } => {
                    let request = Request {
                        client,
                        session: client,
                        request,
                        body: BytesMut::from(&body[..]),
                        body_checksum: shoal_engine::checksum::crc32c(&body),
                        record_count: 1,
                        first_timestamp_ms: 0,
                        max_timestamp_ms: 0,
                        append_time_ms: 0,
                    };
                    let _ = node.on_client_request(group, request);
                }
                Packet::Reply { .. } => {}
            }
        }
        None
    }

    fn run_io(&mut self) -> Option<Violation> {
        for index in 0..self.nodes.len() {
            let Some(NodeSlot { sim, node: Some(node), durable_views, .. }) = self.live_slot(index)
            else {
                continue;
            };
            if node.has_io() {
                sim.block_on(node.run_io());
            }
            for group in node.group_ids() {
                if let Some(replica) = node.replica(group) {
                    let seen = durable_views.entry(group).or_insert((0, 0));
                    let (view, log_view) = replica.durable_views();
                    *seen = (seen.0.max(view), seen.1.max(log_view));
                }
            }
        }
        None
    }

    /// Moves every node's outputs out: packets to the network, replies to clients, commits
    /// into the agreement check.
    fn collect(&mut self) -> Option<Violation> {
        let replicas = self.nodes.len();
        for index in 0..replicas {
            let Some(node) = self.nodes[index].node.as_mut() else { continue };
            let packets = std::mem::take(&mut node.transport_mut().packets);
            let replies = node.take_replies();
            let committed = node.take_committed();
            for (to, packet) in packets {
                self.network.send(self.tick, index, usize::from(to), Packet::Replica(packet));
            }
            for (group, reply) in replies {
                let client = (reply.client - 1) as usize;
                self.network.send(
                    self.tick,
                    index,
                    replicas + client,
                    Packet::Reply { group, reply },
                );
            }
            for (group, committed) in committed {
                if let Some(violation) = self.apply_admin(index, group, &committed) {
                    return Some(violation);
                }
                let Some(&header) = committed.header() else { continue };
                let op = header.as_prepare().expect("prepares").op;
                mix(&mut self.trace, group ^ (op << 8) ^ u64::from(header.checksum_header));
                match self.committed.insert((group, op), header.checksum_header) {
                    Some(previous) if previous != header.checksum_header => {
                        return Some(Violation {
                            tick: self.tick,
                            what: format!(
                                "committed prefixes diverge: group {group} op {op} committed as \
                                 {previous:#010x} and as {:#010x} (node {index})",
                                header.checksum_header
                            ),
                        });
                    }
                    _ => {}
                }
            }
        }
        None
    }

    // --- Clients ---------------------------------------------------------------------------

    fn drive_clients(&mut self) {
        let replicas = self.nodes.len();
        let admin_group = self.admin_group();
        let liveness = self.tick >= self.liveness_from_tick;
        for index in 0..self.clients.len() {
            let tick = self.tick;
            let client = &mut self.clients[index];
            if client.pending.is_none() && tick >= client.ready_tick {
                if !self.clients_active
                    || (liveness && client.completed_late >= self.options.liveness_requests)
                {
                    continue;
                }
                let request = client.next_request;
                client.next_request += 1;
                let mut value = format!("client {} request {request}", client.id);
                let padded = self.options.value_size_bytes.min(4_000);
                while value.len() < padded {
                    value.push('.');
                }
                // An idempotent producer (DESIGN.md §4): producer id = client id, one sequence
                // per request, so a resend after a timeout is the same batch. An admin group's
                // clients send plain requests: its client table deduplicates them instead.
                let sequence =
                    i32::try_from(request - client.epoch_first_request).unwrap_or(i32::MAX);
                let mut batch = BatchBuilder::new(tick as i64 * 10);
                if admin_group != Some(client.group) {
                    batch = batch.producer(client.id as i64, client.epoch, sequence);
                }
                batch.push(tick as i64 * 10, None, Some(value.as_bytes()), &[]);
                client.pending = Some(Pending {
                    request,
                    body: batch.build(),
                    resend_tick: tick,
                    unanswered: false,
                });
            }
            let Some(pending) = client.pending.as_mut() else { continue };
            if pending.resend_tick > tick {
                continue;
            }
            pending.resend_tick = tick + CLIENT_TIMEOUT_TICKS;
            if pending.unanswered {
                // Timed out: that node may be down; try the next.
                client.target = (client.target + 1) % self.options.replicas;
            }
            pending.unanswered = true;
            let packet = Packet::Request {
                group: client.group,
                client: client.id,
                request: pending.request,
                body: pending.body.clone(),
            };
            let (endpoint, target) = (replicas + index, usize::from(client.target));
            self.network.send(tick, endpoint, target, packet);
        }
    }

    fn client_reply(&mut self, index: usize, packet: Packet) {
        let Packet::Reply { group, reply } = packet else { return };
        let tick = self.tick;
        let backoff = 5 + self.rng.below(40);
        let client = &mut self.clients[index];
        let Some(pending) = client.pending.as_mut() else { return };
        if reply.request != pending.request {
            return;
        }
        match reply.result {
            ReplyResult::Committed { op, base_offset } => {
                self.acks.push(Ack {
                    group,
                    op,
                    base_offset,
                    client: client.id,
                    request: reply.request,
                });
                self.coverage.acknowledged += 1;
                client.pending = None;
                client.ready_tick = tick + self.rng.below(5);
                if tick >= self.liveness_from_tick {
                    client.completed_late += 1;
                }
            }
            ReplyResult::NotPrimary { primary, .. } => {
                client.target = primary;
                pending.resend_tick = tick + 1;
                pending.unanswered = false;
            }
            ReplyResult::TransientNotAccepted | ReplyResult::TransientNotCommitted => {
                // That node cannot take it now (a view change, perhaps a long one): after a
                // backoff, the next node.
                pending.resend_tick = tick + backoff;
            }
            // A client sends its requests in order, one at a time, and resends the very batch:
            // a group that refuses its sequence lost track of it.
            refused @ (ReplyResult::OutOfOrderSequence
            | ReplyResult::UnknownProducer
            | ReplyResult::ProducerFenced) => {
                self.client_violation.get_or_insert(Violation {
                    tick,
                    what: format!(
                        "group {group} refused client {} request {} as {refused:?}",
                        client.id, reply.request
                    ),
                });
                pending.resend_tick = tick + backoff;
            }
        }
    }

    // --- The end ---------------------------------------------------------------------------

    fn finish(mut self, violation: Option<Violation>) -> Outcome {
        let violation =
            violation.or_else(|| self.check_final_logs()).or_else(|| self.check_disk_images());
        for slot in &self.nodes {
            if let Some(node) = &slot.node {
                add_counters(&mut self.coverage, node);
            }
            self.coverage.read_errors += slot.sim.stats().read_errors;
        }
        let stats = self.network.stats();
        self.coverage.packets_dropped = stats.lost
            + stats.dropped_link_down
            + stats.dropped_link_full
            + stats.dropped_endpoint_inbound;
        Outcome {
            seed: self.options.seed,
            mode: self.mode,
            trace_hash: self.trace,
            ticks: self.tick,
            coverage: self.coverage,
            violation,
        }
    }

    /// Reads every node's log back: committed ops match the agreed checksums, offsets are
    /// dense, and every acknowledged write sits at its acknowledged op and offset.
    fn check_final_logs(&mut self) -> Option<Violation> {
        let tick = self.tick;
        let admin_group = self.admin_group();
        let violation = |what: String| Some(Violation { tick, what });
        let mut verified: BTreeMap<(u64, u64), (u64, u64, u64)> = BTreeMap::new();
        // Exactly once (DESIGN.md §4): a request resent after a timeout, to any node, across
        // view changes and restarts, is in the committed log once.
        let mut applied: BTreeMap<(u64, u64, u64), u64> = BTreeMap::new();
        // Per group, the lowest op some node's log still holds: retention (when a run sets it)
        // removes older ops by configuration, so acknowledgements below it cannot be checked.
        let mut retained_from: BTreeMap<u64, u64> = BTreeMap::new();
        // Per group, the highest commit point any replica knows: a backup's log may already
        // hold ops its primary committed and answered just before the run ended, before the
        // next commit message told the backup (and the primary's own log may be cut short by
        // latent damage this check stops at).
        let group_commit: BTreeMap<u64, u64> =
            (1..=self.options.groups).map(|group| (group, self.commit_max(group))).collect();
        for index in 0..self.nodes.len() {
            let slot = &mut self.nodes[index];
            let Some(node) = slot.node.as_mut() else { continue };
            for group in 1..=self.options.groups {
                let Some(commit) = node.replica(group).map(|r| r.commit()) else { continue };
                if let Some(reason) = node.group_failure(group) {
                    return violation(format!("node {index} group {group} stopped: {reason}"));
                }
                let sim = &slot.sim;
                let Some(log) = node.shard_mut().group_mut(group) else { continue };
                let mut next_offset = None;
                let first_op = log.first_op().max(1);
                let retained = retained_from.entry(group).or_insert(first_op);
                *retained = (*retained).min(first_op);
                let beyond_max = group_commit.get(&group).copied().unwrap_or(0).min(log.head_op());
                for op in first_op..=commit.max(beyond_max) {
                    // Above its own commit point an op counts only where it is the committed
                    // prepare; anything else there is a lagging log, not a fault.
                    let beyond = op > commit;
                    let damaged = self.damage.iter().any(|d| {
                        d.node == index && d.group == group && d.op <= op && {
                            let bytes = sim.file_contents(&d.path);
                            bytes.is_some_and(|b| b.get(d.byte as usize) == Some(&d.flipped))
                        }
                    });
                    if damaged {
                        // Injected damage this node never read back (it is latent until read):
                        // what lies past it is checked on the other replicas.
                        break;
                    }
                    let stored = match sim.block_on(log.read_op(op)) {
                        Ok(Some(stored)) => stored,
                        _ if beyond => break,
                        Ok(None) => {
                            let head = log.head_op();
                            return violation(format!(
                                "node {index} group {group} lost committed op {op} (engine head {head})"
                            ));
                        }
                        Err(error) => {
                            return violation(format!(
                                "node {index} group {group} op {op}: {error}"
                            ));
                        }
                    };
                    let fields = *stored.header.as_prepare().expect("prepares");
                    if beyond
                        && self.committed.get(&(group, op)) != Some(&stored.header.checksum_header)
                    {
                        break;
                    }
                    if let Some(expected) = next_offset
                        && fields.base_offset != expected
                    {
                        return violation(format!(
                            "node {index} group {group} op {op}: offsets not dense"
                        ));
                    }
                    next_offset = Some(fields.end_offset());
                    if let Some(&checksum) = self.committed.get(&(group, op))
                        && checksum != stored.header.checksum_header
                    {
                        return violation(format!(
                            "node {index} group {group} op {op}: log differs from the committed prepare"
                        ));
                    }
                    verified
                        .insert((group, op), (fields.base_offset, fields.client, fields.request));
                    // The admin group's log may hold a retry twice: its client table executes it
                    // once (checked below).
                    if admin_group != Some(group)
                        && let Some(first) =
                            applied.insert((group, fields.client, fields.request), op)
                        && first != op
                    {
                        return violation(format!(
                            "retried request applied twice: group {group} client {} request {} \
                             at ops {first} and {op} (node {index})",
                            fields.client, fields.request
                        ));
                    }
                }
            }
        }
        for ack in &self.acks {
            if retained_from.get(&ack.group).is_some_and(|&first| ack.op < first) {
                continue;
            }
            match verified.get(&(ack.group, ack.op)) {
                Some(&(base_offset, client, request))
                    if base_offset == ack.base_offset
                        && client == ack.client
                        && request == ack.request => {}
                found => {
                    return violation(format!(
                        "acknowledged write lost: group {} op {} offset {} (client {} request {}); the final log holds {found:?}; damage not yet cut or repaired: {:?}; {}",
                        ack.group,
                        ack.op,
                        ack.base_offset,
                        ack.client,
                        ack.request,
                        self.damage
                            .iter()
                            .filter(|d| self.unhealed(d))
                            .map(|d| (d.node, d.group, d.op))
                            .collect::<Vec<_>>(),
                        self.describe()
                    ));
                }
            }
        }
        self.check_admin_machines()
    }

    /// The admin group's machines agree: any two at the same op hold the same state (that no
    /// request executes twice, or at two ops, is checked as they apply), and each holds every
    /// acknowledged request at or below its position as executed.
    fn check_admin_machines(&self) -> Option<Violation> {
        let group = self.admin_group()?;
        let machines: Vec<(usize, &AdminMachine)> = (0..self.nodes.len())
            .filter_map(|index| Some((index, self.nodes[index].admin.as_ref()?)))
            .collect();
        let violation = |what: String| Some(Violation { tick: self.tick, what });
        for (i, &(a, first)) in machines.iter().enumerate() {
            for &(b, second) in &machines[i + 1..] {
                if first.op() == second.op() && first.encode() != second.encode() {
                    return violation(format!(
                        "admin machines of nodes {a} and {b} hold different states at op {}",
                        first.op()
                    ));
                }
            }
        }
        for ack in self.acks.iter().filter(|ack| ack.group == group) {
            for &(index, machine) in &machines {
                if ack.op <= machine.op() && !machine.knows(ack.client, ack.request) {
                    return violation(format!(
                        "node {index}'s admin machine does not hold acknowledged client {} \
                         request {} (op {}) as executed",
                        ack.client, ack.request, ack.op
                    ));
                }
            }
        }
        None
    }

    fn check_disk_images(&mut self) -> Option<Violation> {
        for index in 0..self.nodes.len() {
            let sim = &self.nodes[index].sim;
            let report =
                sim.block_on(shoal_engine::inspect::inspect(&sim.storage(), Path::new(DATA_DIR)));
            let what = if let Some(error) = &report.error {
                Some(format!("node {index}: inspect could not check the disk: {error}"))
            } else {
                report
                    .problems
                    .iter()
                    .find(|problem| {
                        !self.damage.iter().any(|d| {
                            d.node == index
                                && d.path == problem.file
                                && self.damage_on_disk(d)
                                && (d.record_bytes..=d.byte).contains(&problem.position_bytes)
                        })
                    })
                    .map(|problem| {
                        format!("node {index}: inspect found damage nobody injected: {problem}")
                    })
            };
            if let Some(what) = what {
                return Some(Violation { tick: self.tick, what });
            }
        }
        None
    }

    fn trace_packet(&mut self, from: usize, to: usize, packet: &Packet) {
        let value = match packet {
            Packet::Replica(bytes) => {
                u64::from(u32::from_le_bytes(bytes[..4].try_into().unwrap_or([0; 4])))
            }
            Packet::Request { client, request, .. } => client << 32 ^ request,
            Packet::Reply { reply, .. } => reply.client << 32 ^ reply.request ^ 1 << 63,
        };
        mix(&mut self.trace, self.tick);
        mix(&mut self.trace, (from as u64) << 16 | to as u64);
        mix(&mut self.trace, value);
    }
}

/// Prints one delivered replica message of `group` (the debugging trace of `trace_group`).
fn trace_message(tick: u64, from: usize, to: usize, group: u64, bytes: &Bytes) {
    let limits = crate::codec::CodecLimits {
        message_size_bytes_max: usize::MAX,
        view_headers_max: usize::MAX,
        commit_entries_max: usize::MAX,
    };
    let Ok((_, messages)) = crate::codec::decode(0x5ea1, bytes, &limits) else { return };
    for (g, message) in messages {
        if g != group {
            continue;
        }
        let detail = match &message {
            crate::message::Message::Prepare { header, .. } => {
                let p = header.as_prepare().expect("prepare");
                format!(
                    "op {} view {} commit {} sum {:#x}",
                    p.op, header.view, p.commit, header.checksum_header
                )
            }
            crate::message::Message::DoViewChange { headers, flags, .. } => {
                let ops: Vec<String> = headers
                    .iter()
                    .zip(flags)
                    .rev()
                    .take(4)
                    .map(|(h, f)| format!("{}@{}/{f}", h.as_prepare().expect("prepare").op, h.view))
                    .collect();
                format!("{message:?}").split(", headers").next().unwrap_or("").to_string()
                    + &format!(" top {ops:?}")
            }
            crate::message::Message::StartView { headers, .. } => {
                let ops: Vec<String> = headers
                    .iter()
                    .rev()
                    .take(4)
                    .map(|h| format!("{}@{}", h.as_prepare().expect("prepare").op, h.view))
                    .collect();
                format!("{message:?}").split(", headers").next().unwrap_or("").to_string()
                    + &format!(" top {ops:?}")
            }
            other => format!("{other:?}"),
        };
        eprintln!("{tick:>6} {from}->{to} {} {detail}", message.name());
    }
}

/// A group's directory on a node's simulated disk (snapshots, transferred state).
fn sim_group_dir(group: u64) -> PathBuf {
    group_dir(&shard_dir(Path::new(DATA_DIR), 0), group)
}

/// Saves `saved` as `group`'s snapshot on the node's disk and lets retention delete what it
/// covers, as the server does once a snapshot is durable. False when the save failed (an
/// injected fault): the caller tries again at a later op.
fn save_snapshot(sim: &Sim, node: &mut SimNode, group: u64, saved: &GroupState) -> bool {
    if sim.block_on(state::save(&sim.storage(), &sim_group_dir(group), saved)).is_err() {
        return false;
    }
    if let Some(log) = node.shard_mut().group_mut(group) {
        log.set_retention_floor(saved.end_offset);
    }
    true
}

fn into_result(violation: Option<Violation>) -> Result<(), Violation> {
    violation.map_or(Ok(()), Err)
}

fn add_counters(coverage: &mut Coverage, node: &SimNode) {
    for group in node.group_ids() {
        if let Some(replica) = node.replica(group) {
            coverage.add_replica(&replica.counters());
        }
    }
    let counters = node.counters();
    coverage.damage_cuts += counters.damage_cuts;
    coverage.damage_repaired += counters.damage_repaired;
    coverage.damaged_ops_repaired += counters.damaged_ops_repaired;
    coverage.groups_reopened += counters.groups_reopened;
    coverage.storage_full_rounds += counters.storage_full_rounds;
}

/// FNV-1a over the eight bytes of `value`.
fn mix(hash: &mut u64, value: u64) {
    for byte in value.to_le_bytes() {
        *hash ^= u64::from(byte);
        *hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
}
