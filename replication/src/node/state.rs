//! What a node owns: [`Node`] and its groups, which each of the node's jobs extends with its
//! own `impl` block, and the blank node around a freshly opened shard.
//!
//! Only state lives here: no I/O, no replica input, no decision; the jobs that change a field
//! say why in their own files.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use shoal_engine::shard::ShardStore;
use shoal_engine::storage::Storage;
use shoal_proto::wire::CommitEntry;

use super::config::{Clock, NodeConfig, Transport};
use super::damage::DamageCut;
use super::flush::{CheckpointRun, InFlightFlush, ZeroFillRun};
use super::serve::PeerRead;
use super::status::NodeCounters;
use crate::message::{Committed, Envelope, Reply, ServePrepare, Write};
use crate::replica::Replica;

/// A group on this node: its replica, and whether the engine stopped it.
pub(super) struct Group {
    pub(super) replica: Replica,
    /// Set when the engine failed the group: it takes no more input.
    pub(super) failed: Option<String>,
    /// The node's tick count when the group stopped ticking, its ticks only counting
    /// (`Replica::ticks_only_counting`); `None` while it ticks. See the `sleep` module.
    pub(super) asleep_since_tick: Option<u64>,
    /// The node tick at which a sleeping group's tick does work again, when one will before
    /// any input (it is then in [`Node::wake_ticks`]).
    pub(super) wake_at_tick: Option<u64>,
}

/// One shard's replicas and engine. See the documentation of the `node` module.
pub struct Node<S: Storage, T: Transport, C: Clock> {
    pub(super) config: NodeConfig,
    pub(super) store: ShardStore<S>,
    /// The shard's storage, for the group files the engine does not read itself (a
    /// transferred state).
    pub(super) storage: S,
    pub(super) transport: T,
    pub(super) clock: C,
    pub(super) seed: u64,
    pub(super) groups: BTreeMap<u64, Group>,
    /// Ticks the node has had.
    pub(super) ticks: u64,
    /// The groups that tick (every group not asleep), in group order.
    pub(super) awake: BTreeSet<u64>,
    /// Sleeping groups whose tick does work at a known node tick, by (that tick, group).
    pub(super) wake_ticks: BTreeSet<(u64, u64)>,
    /// The writes the replicas asked for, not yet applied to the engine: (ticket, group, write),
    /// in ticket order.
    pub(super) writes: VecDeque<(u64, u64, Write)>,
    pub(super) tickets_issued: u64,
    pub(super) tickets_durable: u64,
    pub(super) held: VecDeque<(u64, u64, Envelope)>,
    pub(super) reads: VecDeque<(u64, ServePrepare)>,
    /// The disk reads for peers in flight (at most `serve_reads_in_flight_max`).
    pub(super) peer_reads: Vec<PeerRead>,
    pub(super) heartbeats: BTreeMap<u8, Vec<CommitEntry>>,
    pub(super) replies: Vec<(u64, Reply)>,
    pub(super) committed: Vec<(u64, Committed)>,
    /// The checkpoint job in flight: it outlives the round that started it, so its segment
    /// syncs never hold up a round's flush (and the replies waiting on it).
    pub(super) checkpoint: Option<CheckpointRun<S>>,
    /// The zero fill in flight (space ahead of small direct logs' tails): like the checkpoint,
    /// it runs beside the flush cycles, so no reply waits for it.
    pub(super) zero_fill: Option<ZeroFillRun<S>>,
    /// The flush cycles in flight, oldest first (the shard bounds how many).
    pub(super) flushes: VecDeque<InFlightFlush<S>>,
    /// Set when a cycle hit a full disk or failed: the next round retries, not the poll.
    pub(super) flush_blocked: bool,
    pub(super) counters: NodeCounters,
    /// Where the next tick's repair grants start, so every group gets its turn.
    pub(super) repair_cursor: u64,
    /// The bytes repair rounds may still ask for under `repair_bytes_per_tick_max`: topped up
    /// every tick, charged per round granted (so it may go below zero, delaying the next).
    pub(super) repair_bytes_credit: i64,
    /// The groups a tick visits, the ones it collects and the ones it may grant repair, kept
    /// between ticks so a tick allocates nothing.
    pub(super) tick_awake: Vec<u64>,
    pub(super) tick_groups: Vec<u64>,
    pub(super) tick_repairing: Vec<u64>,
    /// The newest damage cuts, for status (at most `DAMAGE_CUTS_KEPT`).
    pub(super) damage_cuts: VecDeque<DamageCut>,
    /// Groups a read found damaged this round, reopened at its end.
    pub(super) damaged: Vec<(u64, String)>,
    /// Scratch: groups whose damage marker is cleared this round.
    pub(super) repaired_groups: Vec<u64>,
    /// Per damaged group whose replica is whole again: the op that must be durable before its
    /// damage marker may go.
    pub(super) damage_clear_at: BTreeMap<u64, u64>,
    /// Groups whose replicas take their own lag bound, in ticks (a topic's
    /// `replica_lag_time_max_ms`), instead of the template's.
    pub(super) lag_ticks_by_group: BTreeMap<u64, u64>,
    /// Groups whose primary belongs on a voter other than their home (the leader balancer's
    /// choice, `Node::set_preferred_primary`).
    pub(super) preferred_primaries: BTreeMap<u64, u8>,
    /// Views recorded whose superblock write has not succeeded yet (a round's settle found
    /// the disk full): each replica hears of them once the engine has its slot on disk
    /// ([`ShardStore::slot_durable`]), never before.
    pub(super) views_unsettled: BTreeMap<u64, (u32, u32)>,
}

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// A node around the freshly opened `store`, holding no group yet: the open restarts one
    /// replica per recovered group into it.
    pub(super) fn blank(
        config: NodeConfig,
        store: ShardStore<S>,
        storage: S,
        transport: T,
        clock: C,
        seed: u64,
    ) -> Self {
        Node {
            config,
            store,
            storage,
            transport,
            clock,
            seed,
            groups: BTreeMap::new(),
            ticks: 0,
            awake: BTreeSet::new(),
            wake_ticks: BTreeSet::new(),
            writes: VecDeque::new(),
            tickets_issued: 0,
            tickets_durable: 0,
            held: VecDeque::new(),
            reads: VecDeque::new(),
            peer_reads: Vec::new(),
            heartbeats: BTreeMap::new(),
            replies: Vec::new(),
            committed: Vec::new(),
            checkpoint: None,
            zero_fill: None,
            flushes: VecDeque::new(),
            flush_blocked: false,
            counters: NodeCounters::default(),
            repair_cursor: 0,
            repair_bytes_credit: 0,
            tick_awake: Vec::new(),
            tick_groups: Vec::new(),
            tick_repairing: Vec::new(),
            damage_cuts: VecDeque::new(),
            damaged: Vec::new(),
            repaired_groups: Vec::new(),
            damage_clear_at: BTreeMap::new(),
            lag_ticks_by_group: BTreeMap::new(),
            views_unsettled: BTreeMap::new(),
            preferred_primaries: BTreeMap::new(),
        }
    }
}
