//! The node layer: one shard's replicas and its storage engine, between the sans-IO replicas
//! and the real world (DESIGN.md §1).
//!
//! It owns the shard's [`Shard`], one [`Replica`] per group, the writes the replicas asked for
//! and the messages they may send only once those writes are durable. It turns replica outputs
//! into engine calls and packets, feeds completions back, coalesces Commit heartbeats per node
//! pair, and makes every group's view updates pending in one I/O round share one superblock
//! write. It is the single chokepoint that holds a message back until the state it reveals is
//! durable: `persisted_messages` wait here for their ticket. It is generic over storage,
//! transport and clock, so the simulator and `server` run this same code; it never opens a
//! socket, reads a clock or spawns a thread itself.
//!
//! Node `i` is replica `i` of every group (the member list is the node list).

use std::collections::{BTreeMap, VecDeque};
use std::future::{Future, poll_fn};
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use shoal_engine::partition::{DiskReadDone, PartitionLog, ReadPlan};
use shoal_engine::ring::StoredPrepare;
use shoal_engine::shard::ShardCounters;
use shoal_engine::shard::{
    CheckpointDone, FlushReport, RecoveryReport, Shard, ShardConfig, ShardFlushDone, group_dir,
};
use shoal_engine::state;
use shoal_engine::storage::Storage;
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_engine::wire::{CommitEntry, HEADER_SIZE, Header};
use shoal_engine::{Error as EngineError, Result as EngineResult};

use crate::codec::{self, CodecLimits, DecodeError};
use crate::config::ReplicaConfig;
use crate::lag::GroupStatus;
use crate::message::{
    Committed, Envelope, Message, Persisted, Reply, Request, ServePrepare, Write,
};
use crate::producers::{ProducerBatch, ProducerTable};
use crate::replica::{RecoveredLog, Replica};

/// Sends packets to other nodes (bounded queues, sockets, or the simulated network).
pub trait Transport {
    /// Sends `packet` to node `to`; may drop it (the protocol retransmits).
    fn send(&mut self, to: u8, packet: Bytes);
}

/// The wall clock, for the append time stamped on each prepare.
pub trait Clock {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// Why the node refused a client's request before it reached the replica. Nothing of the
/// request entered the log, so the client may send it again (to this node or another).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestRefused {
    /// The group is not on this node.
    UnknownGroup {
        /// The group asked for.
        group: u64,
    },
    /// The engine stopped the group (fail-stop); it takes no input until it is recovered.
    GroupFailed {
        /// The group.
        group: u64,
        /// Why, as the engine first reported it.
        reason: String,
    },
    /// The disk has no room for the group's next writes (DESIGN.md §3: the clean, retryable
    /// storage full). The group keeps serving reads; it takes writes again once a retried
    /// reservation succeeds, which the node tries once per tick.
    StorageFull {
        /// The group.
        group: u64,
    },
}

impl std::fmt::Display for RequestRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestRefused::UnknownGroup { group } => {
                write!(f, "group {group} is not on this node")
            }
            RequestRefused::GroupFailed { group, reason } => {
                write!(f, "group {group} stopped: {reason}")
            }
            RequestRefused::StorageFull { group } => {
                write!(f, "group {group}: storage full; retry once disk space is freed")
            }
        }
    }
}

impl std::error::Error for RequestRefused {}

/// The node layer's settings.
#[derive(Clone, Copy, Debug)]
pub struct NodeConfig {
    /// This node's index (its replica index in every group).
    pub node: u8,
    /// The template of every group's replica config (`group` and `replica` are set per group).
    pub replica: ReplicaConfig,
    /// Largest packet accepted from a peer.
    pub message_size_bytes_max: usize,
    /// Messages held back for durability at most; beyond, the oldest are dropped (the protocol
    /// retransmits) and counted.
    pub held_messages_max: usize,
    /// New repair rounds the node lets its groups start per tick, all groups together: a shard
    /// with many lagging groups catches them up a few at a time instead of flooding its peers
    /// (and its own intake) at once.
    pub repair_rounds_per_tick_max: usize,
    /// Repair rounds in flight at most, all groups together; bounds the bodies a shard may have
    /// on the way to it for repair (each round asks up to `repair_prepares_max`).
    pub repair_rounds_in_flight_max: usize,
    /// Prepares peers asked for that wait to be read from the log at most; beyond, requests
    /// are dropped and counted (the asker's round times out and asks again, or elsewhere).
    pub serve_reads_queued_max: usize,
}

impl NodeConfig {
    /// Node `node` with the replica template `replica` and default bounds.
    pub fn new(node: u8, replica: ReplicaConfig) -> NodeConfig {
        NodeConfig {
            node,
            replica,
            message_size_bytes_max: 1 << 20,
            held_messages_max: 4_096,
            repair_rounds_per_tick_max: 8,
            repair_rounds_in_flight_max: 32,
            serve_reads_queued_max: 1_024,
        }
    }
}

/// Counters of the node layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeCounters {
    /// Packets that failed to decode.
    pub packets_rejected: u64,
    /// Messages for groups this node does not hold.
    pub messages_unknown_group: u64,
    /// Messages held back until durable.
    pub messages_held: u64,
    /// Held messages dropped at the bound.
    pub held_dropped: u64,
    /// I/O rounds run.
    pub io_rounds: u64,
    /// Heartbeat packets sent (each carries many groups).
    pub heartbeat_packets: u64,
    /// Appends the engine refused for lack of room, retried after a flush.
    pub append_backpressure: u64,
    /// Groups stopped by an engine failure.
    pub groups_failed: u64,
    /// I/O rounds in which a full disk deferred some group's writes (retried in a later round).
    pub storage_full_rounds: u64,
    /// Repair rounds granted to the groups' replicas.
    pub repair_rounds_granted: u64,
    /// Ticks on which some group's due repair round waited for a later tick's budget.
    pub repair_rounds_deferred: u64,
    /// Prepares served to peers from the prepare ring (memory).
    pub prepares_served_from_ring: u64,
    /// Prepares served to peers from segment files.
    pub prepares_served_from_disk: u64,
    /// Requests for ops retention had removed, answered with `RangeEvicted`.
    pub ranges_evicted_sent: u64,
    /// Peers' prepare requests dropped at `serve_reads_queued_max`.
    pub serve_reads_dropped: u64,
    /// State transfers installed (a log replaced by one beginning at a peer's state).
    pub transfers_installed: u64,
    /// Client requests refused because their group's storage was full.
    pub storage_full_refusals: u64,
    /// Producer table snapshots the driver handed over that did not decode or lay past the
    /// log's head (the table was rebuilt from the log instead).
    pub producer_snapshots_rejected: u64,
    /// Prepares read back at open to rebuild producer tables.
    pub producer_ops_replayed: u64,
    /// Damage cuts made (protocol-aware recovery, at open or after a read found damage).
    pub damage_cuts: u64,
    /// Groups reopened because a read while serving a peer found damage.
    pub groups_reopened: u64,
    /// Damage cuts whose ops the replica got back from peers (the marker cleared).
    pub damage_repaired: u64,
    /// Ops past damage cuts that were repaired from peers.
    pub damaged_ops_repaired: u64,
}

/// A checkpoint job running across I/O rounds.
type CheckpointRun<S> = Pin<Box<dyn Future<Output = CheckpointDone<S>>>>;

/// A flush cycle running across I/O rounds.
type FlushRun<S> = Pin<Box<dyn Future<Output = ShardFlushDone<S>>>>;

/// A flush cycle in flight: its I/O, the ticket of the newest write it makes durable (None when
/// it left some of what preceded it to a later cycle), and its result once it finished ahead of
/// an older cycle (cycles are applied in the order they began).
struct FlushSlot<S: Storage> {
    run: FlushRun<S>,
    ticket: Option<u64>,
    done: Option<ShardFlushDone<S>>,
}

/// Flush cycles one round (or one poll of the jobs) runs at most before yielding: each carries
/// everything pending when it began, so more than a few means something keeps failing.
const FLUSHES_PER_ROUND_MAX: usize = 64;

struct Group {
    replica: Replica,
    /// Set when the engine failed the group: it takes no more input.
    failed: Option<String>,
}

/// One shard's replicas and engine. See the module documentation.
pub struct Node<S: Storage, T: Transport, C: Clock> {
    config: NodeConfig,
    shard: Shard<S>,
    /// The shard's storage, for the group files the engine does not read itself (a
    /// transferred state).
    storage: S,
    transport: T,
    clock: C,
    seed: u64,
    groups: BTreeMap<u64, Group>,
    /// The writes the replicas asked for, not yet applied to the engine: (ticket, group, write),
    /// in ticket order.
    writes: VecDeque<(u64, u64, Write)>,
    tickets_issued: u64,
    tickets_durable: u64,
    held: VecDeque<(u64, u64, Envelope)>,
    reads: Vec<(u64, ServePrepare)>,
    heartbeats: BTreeMap<u8, Vec<CommitEntry>>,
    replies: Vec<(u64, Reply)>,
    committed: Vec<(u64, Committed)>,
    /// The checkpoint job in flight: it outlives the round that started it, so its segment
    /// syncs never hold up a round's flush (and the replies waiting on it).
    checkpoint: Option<CheckpointRun<S>>,
    /// The flush cycles in flight, oldest first (the shard bounds how many).
    flushes: VecDeque<FlushSlot<S>>,
    /// Set when a cycle hit a full disk or failed: the next round retries, not the poll.
    flush_blocked: bool,
    counters: NodeCounters,
    /// Where the next tick's repair grants start, so every group gets its turn.
    repair_cursor: u64,
    /// The newest damage cuts, for status (at most `DAMAGE_CUTS_KEPT`).
    damage_cuts: VecDeque<DamageCut>,
    /// Groups a read found damaged this round, reopened at its end.
    damaged: Vec<(u64, String)>,
    /// Scratch: groups whose damage marker is cleared this round.
    repaired_groups: Vec<u64>,
    /// Per damaged group whose replica is whole again: the op that must be durable before its
    /// damage marker may go.
    damage_clear_at: BTreeMap<u64, u64>,
}

/// Damage cuts a node remembers for status.
const DAMAGE_CUTS_KEPT: usize = 16;

/// Where protocol-aware recovery cut a group's log (DESIGN.md §3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamageCut {
    /// The group.
    pub group: u64,
    /// The log's head after the cut.
    pub head_op: u64,
    /// Where the faulty suffix begins (None only under the `canary-truncate-faulty` canary).
    pub faulty_from: Option<u64>,
    /// The file, byte position and reason of the first invalid record, when the chain did not
    /// simply end there.
    pub at: Option<String>,
}

/// A group's log in figures, as a driver reports it (status, metrics) and decides on it
/// (snapshots, retention, recovery): never the log itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// The offset of the oldest retained message.
    pub first_offset: u64,
    /// The offset the next message will get (the log end offset).
    pub next_offset: u64,
    /// The last appended op (0 when empty).
    pub head_op: u64,
    /// Bytes of valid records in all segments.
    pub size_bytes: u64,
    /// Segment files.
    pub segments: usize,
    /// The group's size-based retention (0: keep everything).
    pub retention_bytes: u64,
    /// The group's age-based retention (0: keep everything).
    pub retention_ms: u64,
}

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// Opens (recovering) the shard in `dir` and restarts a replica for every group it holds:
    /// each starts `Recovering` with its views, newest headers and faulty suffix, and its
    /// producer table rebuilt from its whole log (see [`Node::open_with_producer_snapshots`]).
    pub async fn open(
        storage: S,
        dir: &Path,
        shard_config: ShardConfig,
        config: NodeConfig,
        transport: T,
        clock: C,
        seed: u64,
    ) -> EngineResult<(Self, RecoveryReport)> {
        let none = async |_group: u64| -> Option<Vec<u8>> { None };
        Node::open_with_producer_snapshots(
            storage,
            dir,
            shard_config,
            config,
            transport,
            clock,
            seed,
            none,
        )
        .await
    }

    /// [`Node::open`], with each group's producer table (DESIGN.md §4) rebuilt from the
    /// snapshot `load_producers(group)` returns — bytes of [`ProducerTable::encode`], which the
    /// driver saved from [`Replica::producers`] wherever it keeps group state — plus the log
    /// past the snapshot's op. Without a usable snapshot the whole log (from its first retained
    /// op) is replayed. This is where a restarted group's producer table is rebuilt, so the
    /// server and the simulator share it.
    #[expect(clippy::too_many_arguments, reason = "open's arguments plus the snapshot source")]
    pub async fn open_with_producer_snapshots<L>(
        storage: S,
        dir: &Path,
        shard_config: ShardConfig,
        config: NodeConfig,
        transport: T,
        clock: C,
        seed: u64,
        mut load_producers: L,
    ) -> EngineResult<(Self, RecoveryReport)>
    where
        L: AsyncFnMut(u64) -> Option<Vec<u8>>,
    {
        let (shard, report) = Shard::open(storage.clone(), dir, shard_config).await?;
        let mut node = Node {
            config,
            shard,
            storage,
            transport,
            clock,
            seed,
            groups: BTreeMap::new(),
            writes: VecDeque::new(),
            tickets_issued: 0,
            tickets_durable: 0,
            held: VecDeque::new(),
            reads: Vec::new(),
            heartbeats: BTreeMap::new(),
            replies: Vec::new(),
            committed: Vec::new(),
            checkpoint: None,
            flushes: VecDeque::new(),
            flush_blocked: false,
            counters: NodeCounters::default(),
            repair_cursor: 0,
            damage_cuts: VecDeque::new(),
            damaged: Vec::new(),
            repaired_groups: Vec::new(),
            damage_clear_at: BTreeMap::new(),
        };
        for recovery in &report.groups {
            let group = recovery.group;
            let mut faulty_from = recovery.faulty.suffix_from;
            let Some(log) = node.shard.group_mut(group) else { continue };
            if let Some(reason) = log.faulty_reason() {
                let reason = reason.to_string();
                // Damage before the torn window: a group with peers cuts it and repairs from
                // them; a group of one (or a failure that is not damage) refuses service.
                let cut = if node.has_peers() && recovery.corruption.is_some() {
                    node.cut_damaged(group).await
                } else {
                    Err(reason)
                };
                match cut {
                    Ok(from) => {
                        faulty_from = node.unclean_suffix(group, from, report.clean_shutdown);
                    }
                    Err(reason) => {
                        node.insert_failed(group, reason);
                        continue;
                    }
                }
            }
            let headers = match node.newest_headers(group).await {
                Ok(headers) => headers,
                // A read of the newest records found damage: the same protocol-aware cut, when
                // there are peers. A read that merely failed (EIO) is no damage: cutting there
                // would drop a persisted group's journal-held tail for nothing and leave this
                // replica faulty beside a damaged peer (seed 30,000,479); the open fails and is
                // retried instead, as for any read error at open.
                Err(error @ EngineError::Corruption(_)) if node.has_peers() => {
                    match node.cut_damaged(group).await {
                        Ok(from) => {
                            let from = node.unclean_suffix(group, from, report.clean_shutdown);
                            faulty_from = min_faulty(faulty_from, from);
                            match node.newest_headers(group).await {
                                Ok(headers) => headers,
                                Err(error) => {
                                    node.insert_failed(group, error.to_string());
                                    continue;
                                }
                            }
                        }
                        Err(reason) => {
                            node.insert_failed(group, format!("{error}; the cut failed: {reason}"));
                            continue;
                        }
                    }
                }
                Err(error) => return Err(error),
            };
            let snapshot = load_producers(group).await;
            node.insert_recovered(group, headers, faulty_from, snapshot).await?;
        }
        Ok((node, report))
    }

    /// Whether this node's groups have peers (protocol-aware recovery needs someone to repair
    /// from; a group of one refuses service on damage instead, DESIGN.md §6).
    fn has_peers(&self) -> bool {
        self.config.replica.replica_count > 1
    }

    /// The newest headers of `group`'s log (for a restarting replica).
    async fn newest_headers(&mut self, group: u64) -> EngineResult<Vec<Header>> {
        let count = self.config.replica.view_headers_max;
        let log = self
            .shard
            .group_mut(group)
            .ok_or(EngineError::Faulty { group, reason: "the group's log is gone".into() })?;
        newest_headers(log, count).await
    }

    /// The faulty suffix after a damage cut at open: the cut's, and for a `replicated` group
    /// after an unclean stop everything past the head too (what [`Shard::open`] marks when it
    /// finds no damage: written ops were acknowledged before they were synced).
    fn unclean_suffix(&self, group: u64, from: Option<u64>, clean_shutdown: bool) -> Option<u64> {
        let Some(log) = self.shard.group(group) else { return from };
        if clean_shutdown || log.config().durability != Durability::Replicated {
            return from;
        }
        min_faulty(from, Some(log.head_op() + 1))
    }

    /// Restarts `group`'s replica, `Recovering`, on its recovered log, with its producer table
    /// rebuilt from the newer of `producer_snapshot` and the `transferred` state (when usable)
    /// and the log past it.
    async fn insert_recovered(
        &mut self,
        group: u64,
        headers: Vec<Header>,
        faulty_from: Option<u64>,
        producer_snapshot: Option<Vec<u8>>,
    ) -> EngineResult<()> {
        let replica_config = self.replica_config(group);
        // A log a state transfer installed begins at the state's op: the state is where its
        // producer table and commit point start (unless a newer snapshot was saved since).
        let transferred =
            match state::load_transfer_state(&self.storage, &group_dir(self.shard.dir(), group))
                .await
            {
                Ok(transferred) => transferred,
                // A read that failed is the open's to retry (as a supervisor restarting the
                // process would); only damage stops the group.
                Err(error @ (EngineError::Io { .. } | EngineError::StorageFull)) => {
                    return Err(error);
                }
                Err(error) => {
                    self.insert_failed(group, format!("its transferred state: {error}"));
                    return Ok(());
                }
            };
        // The driver's part of the state is the driver's to load; the table is the replica's.
        let transferred = match transferred {
            None => None,
            Some(state) => match crate::transfer::decode_transfer_state(&state.bytes) {
                Some((producers, _)) => Some((state.op, producers.to_vec())),
                None => {
                    self.insert_failed(group, "its transferred state is malformed".into());
                    return Ok(());
                }
            },
        };
        let Some(log) = self.shard.group_mut(group) else { return Ok(()) };
        // Nothing is known committed until the replica commits again.
        log.set_committed_end(0);
        let slot = log.slot();
        // A log whose beginning retention removed begins with a committed op (retention
        // deletes a segment only once the op after it committed); one a state transfer
        // installed begins with the transferred op, committed too.
        let first_committed = if log.first_op() > 1 { log.first_op() } else { 0 };
        let commit_min = transferred.as_ref().map_or(0, |&(op, _)| op).max(first_committed);
        let limits = replica_config.producer_limits();
        let snapshot_op = |bytes: &Vec<u8>| ProducerTable::decode(bytes, limits).map(|t| t.op());
        let producer_snapshot = match (producer_snapshot, transferred) {
            (Some(saved), Some((op, _))) if snapshot_op(&saved).is_ok_and(|saved| saved >= op) => {
                Some(saved)
            }
            (saved, transferred) => transferred.map(|(_, producers)| producers).or(saved),
        };
        let recovered = RecoveredLog {
            view: slot.view,
            log_view: slot.log_view,
            headers,
            faulty_from,
            commit_min,
            log_view_head_op: slot.log_view_head_op,
        };
        let mut replica = Replica::recover(replica_config, recovered, self.seed);
        let (table, uncommitted) =
            rebuild_producers(log, &replica, producer_snapshot, &mut self.counters).await?;
        replica.recover_producers(table, &uncommitted);
        replica.ration_repair();
        self.groups.insert(group, Group { replica, failed: None });
        Ok(())
    }

    /// Records `group` as stopped (fail-stop) with a blank replica that takes no input.
    fn insert_failed(&mut self, group: u64, reason: String) {
        let replica =
            Replica::recover(self.replica_config(group), RecoveredLog::default(), self.seed);
        self.groups.insert(group, Group { replica, failed: Some(reason) });
        self.counters.groups_failed += 1;
    }

    /// Protocol-aware recovery of a damaged group (DESIGN.md §3): the engine cuts its log at
    /// the first invalid record, durably, and the ops past the cut become the replica's faulty
    /// suffix, which it never nacks and which repair and StartView bring back from peers.
    /// Returns where the faulty suffix begins, or why the cut failed.
    async fn cut_damaged(&mut self, group: u64) -> Result<Option<u64>, String> {
        match self.shard.cut_damaged(group).await {
            Ok(recovery) => {
                self.counters.damage_cuts += 1;
                self.damage_clear_at.remove(&group);
                if self.damage_cuts.len() >= DAMAGE_CUTS_KEPT {
                    self.damage_cuts.pop_front();
                }
                self.damage_cuts.push_back(DamageCut {
                    group,
                    head_op: recovery.head_op,
                    faulty_from: recovery.faulty.suffix_from,
                    at: recovery.cut.map(|(file, position, why)| {
                        format!("{} at byte {position}: {why}", file.display())
                    }),
                });
                Ok(recovery.faulty.suffix_from)
            }
            Err(error) => Err(error.to_string()),
        }
    }

    /// A group whose log a read found damaged while it served: fail-stop, then reopened at
    /// once. With peers it is recovered with a damage cut and its replica
    /// restarts `Recovering` (it was never nacking anything it held: the cut ops are faulty);
    /// a group of one stays stopped, refusing service (DESIGN.md §6).
    async fn reopen_damaged(&mut self, group: u64, reason: String) {
        if !self.has_peers() {
            self.fail_group(group, EngineError::Invalid(reason));
            return;
        }
        // The log at rest: everything appended is written, no job in flight.
        self.settle().await;
        // What the replica asked for, and what it wanted sent, belongs to a replica that is
        // about to be replaced; a restarted replica asks again for what it still needs.
        self.writes.retain(|(_, g, _)| *g != group);
        self.held.retain(|(_, g, _)| *g != group);
        self.reads.retain(|(g, _)| *g != group);
        self.counters.groups_reopened += 1;
        // Ops the replica already held faulty stay faulty: the replica is replaced, not its
        // history.
        let faulty_before = self.groups.get(&group).and_then(|g| g.replica.faulty_from());
        let headers = match self.cut_damaged(group).await {
            Ok(from) => match self.newest_headers(group).await {
                Ok(headers) => Some((headers, from)),
                Err(error) => {
                    self.fail_group(group, error);
                    None
                }
            },
            Err(reason) => {
                self.fail_group(group, EngineError::Invalid(reason));
                None
            }
        };
        if let Some((headers, faulty_from)) = headers {
            let head = headers.last().and_then(Header::as_prepare).map_or(0, |p| p.op);
            // A faulty op the reopened log holds again is no longer missing.
            let before = faulty_before.map(|from| from.max(head + 1));
            // No snapshot here: the table is rebuilt from the whole log the cut left.
            let faulty_from = min_faulty(faulty_from, before);
            if let Err(error) = self.insert_recovered(group, headers, faulty_from, None).await {
                self.fail_group(group, error);
            }
        }
    }

    /// Forgets each group's damage marker once its replica holds every op again: its faulty
    /// suffix is cleared (a StartView brought it up to date) and everything it appended is
    /// durable, so a crash cannot take the repaired ops away with the marker gone.
    fn clear_repaired_damage(&mut self) {
        for (&group, entry) in &self.groups {
            let Some(log) = self.shard.group(group) else { continue };
            let damaged_from = log.damaged_from();
            if damaged_from == 0
                || entry.failed.is_some()
                || entry.replica.faulty_from().is_some()
                || entry.replica.status() != crate::replica::Status::Normal
            {
                continue;
            }
            // The head when the faulty suffix cleared covers every op the cut took; under load
            // the appended head keeps moving past what is durable, so wait for that one.
            let target = *self.damage_clear_at.entry(group).or_insert(entry.replica.op_appended());
            if self.shard.durable_op(group).is_none_or(|op| op < target) {
                continue;
            }
            self.counters.damaged_ops_repaired += (target + 1).saturating_sub(damaged_from);
            self.counters.damage_repaired += 1;
            self.repaired_groups.push(group);
        }
        for group in std::mem::take(&mut self.repaired_groups) {
            self.damage_clear_at.remove(&group);
            self.shard.clear_damaged_from(group);
        }
    }

    /// Creates a group on this node (every member node creates it with the same id): its
    /// storage durably, and a fresh replica in view 0.
    pub async fn create_group(&mut self, group: u64, config: GroupConfig) -> EngineResult<()> {
        self.settle().await;
        self.shard.create_group(group, config).await?;
        if let Some(log) = self.shard.group_mut(group) {
            log.set_committed_end(0);
        }
        let mut replica = Replica::new(self.replica_config(group), self.seed);
        replica.ration_repair();
        self.groups.insert(group, Group { replica, failed: None });
        Ok(())
    }

    /// A group's replica settings. A `replicated` group of one replica recovers uncleanly: with
    /// no peer to ask, the ops its faulty suffix may have held are lost, which is the documented
    /// single-node power-loss outcome (DESIGN.md §6); otherwise it would never serve again.
    fn replica_config(&self, group: u64) -> ReplicaConfig {
        let replicated = self
            .shard
            .group(group)
            .is_some_and(|log| log.config().durability == Durability::Replicated);
        let mut config = ReplicaConfig { group, replica: self.config.node, ..self.config.replica };
        if replicated && config.replica_count == 1 {
            config.unclean_recovery = true;
        }
        // A state piece and its header must fit in one packet the peers accept (every node of
        // a cluster runs the same bound).
        let packet_room = self.config.message_size_bytes_max.saturating_sub(HEADER_SIZE).max(1);
        config.state_chunk_bytes_max = config.state_chunk_bytes_max.min(packet_room);
        config
    }

    // --- Inputs ----------------------------------------------------------------------------

    /// A packet from node `from`. Anything malformed is counted and dropped.
    pub fn on_packet(&mut self, from: u8, packet: &Bytes) -> Result<(), DecodeError> {
        let limits = CodecLimits {
            message_size_bytes_max: self.config.message_size_bytes_max,
            view_headers_max: self.config.replica.view_headers_max,
            commit_entries_max: self.shard.config().groups_max,
        };
        let (sender, messages) = match codec::decode(self.config.replica.cluster, packet, &limits) {
            Ok(decoded) => decoded,
            Err(error) => {
                self.counters.packets_rejected += 1;
                return Err(error);
            }
        };
        // A prepare names the replica that prepared it, whoever relays it; every other
        // message names its sender.
        let relayed = matches!(messages.as_slice(), [(_, Message::Prepare { .. })]);
        if sender != from && !relayed {
            self.counters.packets_rejected += 1;
            return Err(DecodeError::Invalid("sender"));
        }
        for (group, message) in messages {
            match self.groups.get_mut(&group) {
                Some(entry) if entry.failed.is_none() => {
                    entry.replica.on_message(from, message);
                    self.collect(group);
                }
                _ => self.counters.messages_unknown_group += 1,
            }
        }
        self.send_heartbeats();
        Ok(())
    }

    /// One tick for every replica. It also lets the engine try again, once, whatever a full
    /// disk refused, so writes resume by themselves once space is freed (and a full disk is
    /// probed once per tick, not by every flush cycle).
    pub fn on_tick(&mut self) {
        self.shard.retry_storage_full();
        let groups: Vec<u64> = self.groups.keys().copied().collect();
        for group in groups {
            let entry = self.groups.get_mut(&group).expect("listed");
            if entry.failed.is_none() {
                entry.replica.on_tick();
                self.collect(group);
            }
        }
        self.grant_repairs();
        self.send_heartbeats();
    }

    /// Lets the groups whose repair round is due start one, within the tick's budget and the
    /// shard's bound on rounds in flight, taking turns from where the last tick stopped.
    fn grant_repairs(&mut self) {
        let in_flight = self.groups.values().filter(|g| g.replica.repair_in_flight()).count();
        let mut budget = self
            .config
            .repair_rounds_per_tick_max
            .min(self.config.repair_rounds_in_flight_max.saturating_sub(in_flight));
        let wanting: Vec<u64> = self
            .groups
            .range(self.repair_cursor..)
            .chain(self.groups.range(..self.repair_cursor))
            .filter(|(_, g)| g.failed.is_none() && g.replica.repair_wanted())
            .map(|(&group, _)| group)
            .collect();
        for group in wanting {
            if budget == 0 {
                self.counters.repair_rounds_deferred += 1;
                self.repair_cursor = group;
                return;
            }
            let replica = &mut self.groups.get_mut(&group).expect("listed").replica;
            replica.grant_repair();
            if replica.repair_in_flight() {
                budget -= 1;
                self.counters.repair_rounds_granted += 1;
            }
            self.collect(group);
        }
    }

    /// A client's write to `group`; the reply arrives through [`Node::take_replies`]. The
    /// append time is this node's clock.
    ///
    /// Refused at once, before the replica sees it, when the group is not here, has failed, or
    /// its storage is full: a request the replica accepted takes an op, which it must then see
    /// through, so a write that cannot get disk space must never get that far.
    pub fn on_client_request(
        &mut self,
        group: u64,
        mut request: Request,
    ) -> Result<(), RequestRefused> {
        let Some(entry) = self.groups.get_mut(&group) else {
            return Err(RequestRefused::UnknownGroup { group });
        };
        if let Some(reason) = &entry.failed {
            return Err(RequestRefused::GroupFailed { group, reason: reason.clone() });
        }
        if self.shard.group(group).is_some_and(|log| log.is_storage_full()) {
            self.counters.storage_full_refusals += 1;
            return Err(RequestRefused::StorageFull { group });
        }
        request.append_time_ms = self.clock.now_ms();
        entry.replica.on_client_request(request);
        self.collect(group);
        self.send_heartbeats();
        Ok(())
    }

    /// The driver's answer to a `Committed::StateWanted` of `group` (see
    /// [`Replica::on_driver_state`]): its machine's state as of `op`, or `None` to refuse.
    pub fn on_driver_state(&mut self, group: u64, op: u64, state: Option<Bytes>) {
        let Some(entry) = self.groups.get_mut(&group) else { return };
        if entry.failed.is_some() {
            return;
        }
        entry.replica.on_driver_state(op, state);
        self.collect(group);
        self.send_heartbeats();
    }

    /// Writes the replicas asked for that no I/O round has applied yet (the driver's group
    /// commit may hold them back for a while to gather more per round).
    pub fn writes_queued(&self) -> usize {
        self.writes.len()
    }

    /// Whether `group`'s storage is full: its client requests are refused with
    /// [`RequestRefused::StorageFull`] until a retried reservation succeeds.
    pub fn is_storage_full(&self, group: u64) -> bool {
        self.shard.group(group).is_some_and(|log| log.is_storage_full())
    }

    /// How many groups of this shard refuse client requests for lack of disk space; for logs
    /// and status.
    pub fn storage_full_group_count(&self) -> usize {
        self.shard.storage_full_group_count()
    }

    /// Whether [`Node::run_io`] has anything to do.
    pub fn has_io(&self) -> bool {
        !self.writes.is_empty()
            || !self.reads.is_empty()
            || self.shard.has_pending()
            || self.shard.has_checkpoint_pending()
            || self.io_in_flight()
    }

    /// One I/O round to its end: [`Node::start_io`], then [`Node::wait_io`] until no flush
    /// cycle is in flight, so everything the round applied is durable (or failed) when it
    /// returns. The simulator and tests drive nodes with it; a checkpoint it starts may still
    /// be running afterwards.
    pub async fn run_io(&mut self) {
        self.start_io().await;
        for _ in 0..FLUSHES_PER_ROUND_MAX {
            if self.flushes.is_empty() {
                break;
            }
            self.wait_io().await;
        }
    }

    /// Starts a round: applies every pending write in order (appends, view updates, durable
    /// truncations) and starts a flush cycle for them unless one is in flight (the next starts
    /// as soon as it finishes, see [`Node::wait_io`]), then releases what is durable and serves
    /// log reads to peers. It does not wait for the flush: the driver goes on taking input,
    /// whose appends the next cycle carries.
    ///
    /// A due checkpoint job (segment syncs, then a superblock version) also outlives the round
    /// that starts it: appends are durable without it (written for `replicated`, journaled for
    /// `persisted`), so its syncs stay off the reply path. A round that records views or
    /// truncates waits for every job instead and settles: views are durable only once a
    /// superblock holds them, and a truncation needs the log at rest.
    pub async fn start_io(&mut self) {
        self.counters.io_rounds += 1;
        self.flush_blocked = false;
        let mut views: BTreeMap<u64, (u32, u32)> = BTreeMap::new();
        let mut truncated: Vec<(u64, u64)> = Vec::new();
        let mut installed: Vec<(u64, u64)> = Vec::new();
        let mut complete = true;
        // Writes of groups whose storage is full, kept in order for a later round.
        let mut deferred: VecDeque<(u64, u64, Write)> = VecDeque::new();
        let mut full_groups: Vec<u64> = Vec::new();
        while let Some((ticket, group, write)) = self.writes.pop_front() {
            if self.groups.get(&group).is_none_or(|g| g.failed.is_some()) {
                continue;
            }
            if full_groups.contains(&group) {
                deferred.push_back((ticket, group, write));
                continue;
            }
            let result = match &write {
                Write::Append { header, body } => self.append(group, header, body).await,
                Write::Views { view, log_view, log_view_head_op } => {
                    views.insert(group, (*view, *log_view));
                    self.shard.set_views(group, *view, *log_view, *log_view_head_op)
                }
                Write::Truncate { op, view } => {
                    complete &= self.finish_jobs().await;
                    let result = self.shard.truncate_after(group, *op, *view).await;
                    if result.is_ok() {
                        truncated.push((group, *op));
                    }
                    result
                }
                Write::Install { header, body, state } => {
                    complete &= self.finish_jobs().await;
                    let result = self.shard.install_transfer(group, header, body, state).await;
                    if result.is_ok() {
                        self.counters.transfers_installed += 1;
                        installed.push((group, state.op));
                    }
                    result
                }
            };
            match result {
                Ok(()) => {}
                // Disk full is clean and retryable (DESIGN.md §3): this write and the group's
                // later ones wait, in order, for a later round, while other groups' writes go
                // on. The durability ticket stops below the first one waiting, so nothing held
                // behind them leaves.
                Err(EngineError::StorageFull) => {
                    full_groups.push(group);
                    deferred.push_back((ticket, group, write));
                    complete = false;
                }
                Err(error) => self.fail_group(group, error),
            }
        }
        if !deferred.is_empty() {
            self.counters.storage_full_rounds += 1;
        }
        debug_assert!(self.writes.is_empty(), "the loop drains what it queues too");
        self.writes = deferred;
        if views.is_empty() && truncated.is_empty() && installed.is_empty() {
            poll_fn(|cx| {
                self.poll_jobs(cx);
                Poll::Ready(())
            })
            .await;
        } else {
            let ticket = self.applied_ticket();
            complete &= self.settle().await;
            for (group, op) in truncated {
                self.persisted(group, Persisted::Truncated { op });
            }
            for (group, op) in installed {
                self.persisted(group, Persisted::Installed { op });
            }
            for (group, (view, log_view)) in views {
                self.persisted(group, Persisted::Views { view, log_view });
            }
            self.report_durable();
            if complete {
                self.tickets_durable = self.tickets_durable.max(ticket);
            }
        }
        self.release_held();
        self.serve_reads().await;
        for (group, reason) in std::mem::take(&mut self.damaged) {
            self.reopen_damaged(group, reason).await;
        }
        self.clear_repaired_damage();
        self.send_heartbeats();
    }

    /// Whether a flush cycle or a checkpoint job is in flight (see [`Node::wait_io`]).
    pub fn io_in_flight(&self) -> bool {
        !self.flushes.is_empty() || self.checkpoint.is_some()
    }

    /// Waits until a flush cycle or checkpoint job in flight finishes, and applies it: the
    /// writes its cycle carried are durable (replies and held messages follow), and the next
    /// cycle starts at once with whatever was appended meanwhile. Never finishes when nothing
    /// is in flight. Cancel-safe: the jobs live in the node, not in this future.
    pub async fn wait_io(&mut self) {
        poll_fn(|cx| if self.poll_jobs(cx) { Poll::Ready(()) } else { Poll::Pending }).await;
        self.release_held();
        self.send_heartbeats();
    }

    // --- Outputs ---------------------------------------------------------------------------

    /// Client replies, with their group.
    pub fn take_replies(&mut self) -> Vec<(u64, Reply)> {
        std::mem::take(&mut self.replies)
    }

    /// Committed ops, in order per group.
    pub fn take_committed(&mut self) -> Vec<(u64, Committed)> {
        std::mem::take(&mut self.committed)
    }

    /// The replica of `group`.
    pub fn replica(&self, group: u64) -> Option<&Replica> {
        self.groups.get(&group).map(|g| &g.replica)
    }

    /// `group` as its replica sees it (DESIGN.md §4 "Lag"): view, status, commit point, head and,
    /// on the group's primary, every member's progress and the in-sync set. Lags are in ticks;
    /// the driver knows how long its tick is.
    pub fn group_status(&self, group: u64) -> Option<GroupStatus> {
        self.groups.get(&group).map(|g| g.replica.group_status())
    }

    /// Why `group` stopped, if it did.
    pub fn group_failure(&self, group: u64) -> Option<&str> {
        self.groups.get(&group).and_then(|g| g.failed.as_deref())
    }

    /// The groups held.
    pub fn group_ids(&self) -> Vec<u64> {
        self.groups.keys().copied().collect()
    }

    /// The engine, read-only (for inspection).
    pub fn shard(&self) -> &Shard<S> {
        &self.shard
    }

    /// The engine (for reads and inspection).
    pub fn shard_mut(&mut self) -> &mut Shard<S> {
        &mut self.shard
    }

    /// The transport.
    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }

    /// Where `group`'s log was cut for damage while the cut ops are not all back yet, or their
    /// return is not yet durable (see `GroupSlot::damaged_from`: a restart before the cleared
    /// marker reaches the superblock finds it again); None when there is no such cut.
    pub fn damaged_from(&self, group: u64) -> Option<u64> {
        self.shard.damage_marker(group)
    }

    /// The newest damage cuts (protocol-aware recovery), oldest first.
    pub fn damage_cuts(&self) -> impl Iterator<Item = &DamageCut> {
        self.damage_cuts.iter()
    }

    /// Counters.
    pub fn counters(&self) -> NodeCounters {
        self.counters
    }

    /// Deletes the sealed segments beyond each group's retention (`now_ms` from the driver's
    /// clock), once the flush cycles in flight have finished. Returns the segments deleted.
    pub async fn enforce_retention(&mut self, now_ms: i64) -> EngineResult<usize> {
        self.finish_flushes_in_flight().await;
        self.shard.enforce_retention(now_ms).await
    }

    /// Flushes, checkpoints and records a clean shutdown.
    pub async fn close(mut self) -> EngineResult<()> {
        self.settle().await;
        self.shard.close().await
    }

    // --- The logs, for the driver ----------------------------------------------------------
    //
    // What a driver reads of its groups' logs (consumer reads, its own state rebuilt from a
    // log, figures), and the one thing it sets on them (the retention floor its snapshots
    // allow), named for what it needs: the engine's shard stays the node's.

    /// The engine settings the shard was opened with (its limits: groups, record size).
    pub fn shard_config(&self) -> &ShardConfig {
        self.shard.config()
    }

    /// The engine's counters.
    pub fn engine_counters(&self) -> ShardCounters {
        self.shard.counters()
    }

    /// Bytes the engine's prepare rings hold.
    pub fn ring_bytes(&self) -> usize {
        self.shard.ring_bytes()
    }

    /// Chunks the engine has allocated.
    pub fn chunks_allocated(&self) -> usize {
        self.shard.chunks_allocated()
    }

    /// Whether the engine holds a log for `group` (a group whose creation failed has none).
    pub fn has_log(&self, group: u64) -> bool {
        self.shard.group(group).is_some()
    }

    /// `group`'s log in figures; None when the engine holds no log for it.
    pub fn log_stats(&self, group: u64) -> Option<LogStats> {
        self.shard.group(group).map(|log| LogStats {
            first_offset: log.first_offset(),
            next_offset: log.next_offset(),
            head_op: log.head_op(),
            size_bytes: log.size_bytes(),
            segments: log.segment_count(),
            retention_bytes: log.config().retention_bytes,
            retention_ms: log.config().retention_ms,
        })
    }

    /// The offset of the oldest message `group`'s log retains (what a fetch reply reports and
    /// where a fetch from the first offset starts), without the rest of [`Node::log_stats`]:
    /// every fetch asks.
    pub fn log_first_offset(&self, group: u64) -> Option<u64> {
        self.shard.group(group).map(|log| log.first_offset())
    }

    /// Why `group`'s log refuses work (corruption or an I/O failure it met), if it does.
    pub fn log_fault(&self, group: u64) -> Option<&str> {
        self.shard.group(group).and_then(|log| log.faulty_reason())
    }

    /// Keeps retention from deleting any segment of `group` that holds an offset at or above
    /// `offset`: the driver's state derived from the log (consumer offsets) can be rebuilt only
    /// from its last snapshot on. Nothing happens when the engine holds no log for `group`.
    pub fn set_retention_floor(&mut self, group: u64, offset: u64) {
        if let Some(log) = self.shard.group_mut(group) {
            log.set_retention_floor(offset);
        }
    }

    /// Reads `group`'s prepare with this op (plan, run, finish in one call).
    pub async fn read_op(&mut self, group: u64, op: u64) -> EngineResult<Option<StoredPrepare>> {
        self.log_mut(group)?.read_op(op).await
    }

    /// Reads `group`'s prepares containing `offset` and after it, up to about `bytes_max` bytes
    /// (plan, run, finish in one call).
    pub async fn read_offset(
        &mut self,
        group: u64,
        offset: u64,
        bytes_max: usize,
    ) -> EngineResult<Vec<StoredPrepare>> {
        self.log_mut(group)?.read_offset(offset, bytes_max).await
    }

    /// Plans a read of `group`'s prepares containing `offset` and after it: done from memory,
    /// or a disk read the driver runs off its loop and hands to [`Node::finish_read`].
    pub fn plan_read_offset(
        &self,
        group: u64,
        offset: u64,
        bytes_max: usize,
    ) -> EngineResult<ReadPlan<S>> {
        self.log(group)?.plan_read_offset(offset, bytes_max)
    }

    /// Plans finding `group`'s first prepare appended at or after `time_ms` (see
    /// [`Node::plan_read_offset`]).
    pub fn plan_read_time(&self, group: u64, time_ms: i64) -> EngineResult<ReadPlan<S>> {
        self.log(group)?.plan_read_time(time_ms)
    }

    /// Completes a disk read of `group` that a plan started (damage it met stops the log).
    pub fn finish_read(
        &mut self,
        group: u64,
        done: DiskReadDone,
    ) -> EngineResult<Vec<StoredPrepare>> {
        self.log_mut(group)?.finish_read(done)
    }

    /// `group`'s log, for the reads above; callers that treat a missing log apart ask
    /// [`Node::has_log`] first.
    fn log(&self, group: u64) -> EngineResult<&PartitionLog<S>> {
        let missing = || EngineError::Invalid(format!("group {group} has no log on this shard"));
        self.shard.group(group).ok_or_else(missing)
    }

    fn log_mut(&mut self, group: u64) -> EngineResult<&mut PartitionLog<S>> {
        let missing = || EngineError::Invalid(format!("group {group} has no log on this shard"));
        self.shard.group_mut(group).ok_or_else(missing)
    }

    // --- Internals -------------------------------------------------------------------------

    /// Takes a replica's outputs: messages leave now, writes queue with a ticket, messages
    /// that must wait are held until every write issued so far is durable.
    fn collect(&mut self, group: u64) {
        let entry = self.groups.get_mut(&group).expect("collect for a held group");
        let ready = entry.replica.take_ready();
        for envelope in ready.messages {
            self.send(group, envelope);
        }
        for write in ready.writes {
            self.tickets_issued += 1;
            self.writes.push_back((self.tickets_issued, group, write));
        }
        for envelope in ready.persisted_messages {
            if self.tickets_durable >= self.tickets_issued {
                self.send(group, envelope);
                continue;
            }
            self.counters.messages_held += 1;
            if self.held.len() >= self.config.held_messages_max {
                self.held.pop_front();
                self.counters.held_dropped += 1;
            }
            self.held.push_back((self.tickets_issued, group, envelope));
        }
        for read in ready.reads {
            if self.reads.len() >= self.config.serve_reads_queued_max {
                self.counters.serve_reads_dropped += 1;
                continue;
            }
            self.reads.push((group, read));
        }
        if let Some(header) = ready.committed.iter().rev().find_map(Committed::header) {
            // Retention keeps every op not yet committed: a view change may still cut it.
            let fields = header.as_prepare().expect("committed ops are prepares");
            let end_offset = fields.end_offset();
            if let Some(log) = self.shard.group_mut(group) {
                log.set_committed_end(end_offset);
            }
        }
        self.committed.extend(ready.committed.into_iter().map(|c| (group, c)));
        self.replies.extend(ready.replies.into_iter().map(|r| (group, r)));
    }

    fn send(&mut self, group: u64, envelope: Envelope) {
        if let Message::Commit { view, commit, commit_checksum } = envelope.message {
            let entry = CommitEntry { group, commit, commit_checksum, view };
            self.heartbeats.entry(envelope.to).or_default().push(entry);
            return;
        }
        let packet =
            codec::encode(self.config.replica.cluster, envelope.from, group, &envelope.message);
        self.transport.send(envelope.to, packet);
    }

    /// Sends the coalesced heartbeats: one packet per peer node, within the entry bound.
    fn send_heartbeats(&mut self) {
        let entries_max = self.shard.config().groups_max.max(1);
        for (to, entries) in std::mem::take(&mut self.heartbeats) {
            for chunk in entries.chunks(entries_max) {
                self.counters.heartbeat_packets += 1;
                let packet =
                    codec::encode_commits(self.config.replica.cluster, self.config.node, chunk);
                self.transport.send(to, packet);
            }
        }
    }

    fn release_held(&mut self) {
        while let Some((ticket, _, _)) = self.held.front() {
            if *ticket > self.tickets_durable {
                break;
            }
            let (_, group, envelope) = self.held.pop_front().expect("front");
            self.send(group, envelope);
        }
    }

    fn persisted(&mut self, group: u64, persisted: Persisted) {
        let Some(entry) = self.groups.get_mut(&group) else { return };
        if entry.failed.is_some() {
            return;
        }
        entry.replica.on_persisted(persisted);
        self.collect(group);
    }

    /// Appends, making room by flushing and checkpointing when the engine's bounds (journal,
    /// ring, write buffer) push back. On a full disk those bounds may not drain (the journal
    /// waits for checkpoints that cannot cover data waiting for space): then the append waits
    /// like one the disk refused, rather than failing the group.
    async fn append(&mut self, group: u64, header: &Header, body: &[u8]) -> EngineResult<()> {
        for attempt in 0..8 {
            match self.shard.append(group, header, body) {
                Err(EngineError::LimitReached(_))
                    if attempt > 0 && self.shard.is_storage_full() =>
                {
                    return Err(EngineError::StorageFull);
                }
                Err(EngineError::LimitReached(_)) => {
                    self.counters.append_backpressure += 1;
                    self.settle().await;
                }
                result => return result,
            }
        }
        match self.shard.append(group, header, body) {
            Err(EngineError::LimitReached(_)) if self.shard.is_storage_full() => {
                Err(EngineError::StorageFull)
            }
            result => result,
        }
    }

    /// Polls the jobs in flight, applies those that finished and starts the next ones (a flush
    /// cycle when anything is pending, a checkpoint when one is due); true when a job finished.
    fn poll_jobs(&mut self, cx: &mut Context<'_>) -> bool {
        let mut finished = false;
        for _ in 0..FLUSHES_PER_ROUND_MAX {
            let mut again = false;
            if let Some(run) = self.checkpoint.as_mut()
                && let Poll::Ready(done) = run.as_mut().poll(cx)
            {
                self.checkpoint = None;
                self.apply_checkpoint(done);
                finished = true;
            }
            for slot in self.flushes.iter_mut().filter(|slot| slot.done.is_none()) {
                if let Poll::Ready(done) = slot.run.as_mut().poll(cx) {
                    slot.done = Some(done);
                }
            }
            while self.flushes.front().is_some_and(|slot| slot.done.is_some()) {
                let slot = self.flushes.pop_front().expect("checked");
                // A failure is recorded in the groups; the next round retries a full disk.
                let _ = self.finish_flush(slot.done.expect("checked"), slot.ticket);
                finished = true;
            }
            if !self.flush_blocked
                && let Some(flush) = self.shard.begin_flush()
            {
                let ticket = flush.is_complete().then(|| self.applied_ticket());
                self.flushes.push_back(FlushSlot {
                    run: Box::pin(flush.run()),
                    ticket,
                    done: None,
                });
                again = true;
            }
            if self.checkpoint.is_none()
                && let Some(job) = self.shard.begin_checkpoint()
            {
                self.checkpoint = Some(Box::pin(job.run()));
                again = true;
            }
            if !again {
                break;
            }
        }
        finished
    }

    /// Applies a finished flush cycle: failures, then the durable positions it reached; false
    /// when the disk was full or the cycle failed.
    fn finish_flush(&mut self, done: ShardFlushDone<S>, ticket: Option<u64>) -> bool {
        let report = self.shard.finish_flush(done);
        let ok = self.apply_flush_report(report);
        if ok {
            // A complete cycle: everything applied before it began is durable now.
            if let Some(ticket) = ticket {
                self.tickets_durable = self.tickets_durable.max(ticket);
            }
        } else {
            // Retried by the next round, not at once.
            self.flush_blocked = true;
        }
        self.report_durable();
        ok
    }

    /// The ticket below which every write is applied to the engine (queued ones, and those
    /// after the first one a full disk deferred, are not all).
    fn applied_ticket(&self) -> u64 {
        self.writes.front().map_or(self.tickets_issued, |(ticket, _, _)| ticket - 1)
    }

    /// Waits for the flush cycles in flight, oldest first, and applies them; false when one
    /// failed. (An older cycle never waits for a newer one, so awaiting them one at a time
    /// cannot stall.)
    async fn finish_flushes_in_flight(&mut self) -> bool {
        let mut ok = true;
        while let Some(slot) = self.flushes.pop_front() {
            let done = match slot.done {
                Some(done) => done,
                None => slot.run.await,
            };
            ok &= self.finish_flush(done, slot.ticket);
        }
        ok
    }

    /// Tells every replica how far its log is durable.
    fn report_durable(&mut self) {
        let groups: Vec<u64> = self.groups.keys().copied().collect();
        for group in groups {
            if let Some(op) = self.shard.durable_op(group) {
                self.persisted(group, Persisted::Appended { op });
            }
        }
    }

    /// Waits for the flush cycle and the checkpoint in flight, if any, and applies them; false
    /// when one failed.
    async fn finish_jobs(&mut self) -> bool {
        let mut ok = self.finish_flushes_in_flight().await;
        if let Some(run) = self.checkpoint.take() {
            let done = run.await;
            ok &= self.apply_checkpoint(done);
        }
        ok
    }

    /// Runs flush cycles and checkpoints to the end, waiting for each (bounded): for view
    /// changes, truncations, creating groups, backpressure and closing. False when the storage
    /// was full or an error stopped it.
    async fn settle(&mut self) -> bool {
        if !self.finish_jobs().await {
            return false;
        }
        for _ in 0..64 {
            if !self.shard.has_pending() && !self.shard.has_checkpoint_pending() {
                return true;
            }
            match self.shard.flush().await {
                Ok(report) => {
                    if !self.apply_flush_report(report) {
                        return false;
                    }
                }
                Err(error) => {
                    self.fail_all(&error);
                    return false;
                }
            }
        }
        false
    }

    /// Applies a flush cycle's failures; false when the storage was full or the shard failed.
    fn apply_flush_report(&mut self, report: FlushReport) -> bool {
        for (group, reason) in report.failed {
            self.fail_group(group, EngineError::Invalid(reason));
        }
        if let Some(reason) = self.shard.failure() {
            let error = EngineError::Invalid(format!("shard storage failed: {reason}"));
            self.fail_all(&error);
            return false;
        }
        !report.storage_full
    }

    fn apply_checkpoint(&mut self, done: CheckpointDone<S>) -> bool {
        match self.shard.finish_checkpoint(done) {
            Ok(()) => true,
            // No room for a rolled segment's index: the checkpoint waits for the next retry,
            // and nothing has failed.
            Err(EngineError::StorageFull) => false,
            Err(error) => {
                self.fail_all(&error);
                false
            }
        }
    }

    /// A failure of the shard's storage (or a checkpoint) stops every group.
    fn fail_all(&mut self, error: &EngineError) {
        let groups: Vec<u64> = self.groups.keys().copied().collect();
        let reason = error.to_string();
        for group in groups {
            self.fail_group(group, EngineError::Invalid(reason.clone()));
        }
    }

    fn fail_group(&mut self, group: u64, error: EngineError) {
        if let Some(entry) = self.groups.get_mut(&group)
            && entry.failed.is_none()
        {
            entry.failed = Some(error.to_string());
            self.counters.groups_failed += 1;
        }
    }

    async fn serve_reads(&mut self) {
        for (group, read) in std::mem::take(&mut self.reads) {
            let Some(log) = self.shard.group_mut(group) else { continue };
            let op_min = log.first_op();
            if read.op < op_min {
                // Retention removed it: say so, so the asker looks elsewhere at once.
                let view = self.groups.get(&group).map_or(0, |g| g.replica.view());
                let message = Message::RangeEvicted { view, op: read.op, op_min };
                let envelope = Envelope { from: self.config.node, to: read.to, message };
                self.counters.ranges_evicted_sent += 1;
                self.send(group, envelope);
                continue;
            }
            let from_ring = log.ring().by_op(read.op).is_some();
            let stored = match log.read_op(read.op).await {
                Ok(Some(stored)) => stored,
                Ok(None) => continue,
                // A read that failed is never taken for "absent": nothing is sent, and the
                // asker's round times out and asks again (or another peer).
                Err(error) if !matches!(error, EngineError::Corruption(_)) => continue,
                // Damage: the log stopped itself, and the group is reopened at the end of the
                // round.
                Err(error) => {
                    if !self.damaged.iter().any(|(g, _)| *g == group) {
                        self.damaged.push((group, error.to_string()));
                    }
                    continue;
                }
            };
            if read.checksum.is_some_and(|c| c != stored.header.checksum_header) {
                continue;
            }
            if from_ring {
                self.counters.prepares_served_from_ring += 1;
            } else {
                self.counters.prepares_served_from_disk += 1;
            }
            // A stored record is header and body exactly: the Prepare message itself.
            self.transport.send(read.to, stored.record.clone());
        }
    }
}

/// A restarted group's producer table: the snapshot (when it decodes and lies within the log),
/// then every idempotent batch of the log past it up to the replica's commit point applied;
/// and the idempotence fields of the ops above the commit point, for the replica's pipeline
/// overlay.
async fn rebuild_producers<S: Storage>(
    log: &mut shoal_engine::partition::PartitionLog<S>,
    replica: &Replica,
    snapshot: Option<Vec<u8>>,
    counters: &mut NodeCounters,
) -> EngineResult<(ProducerTable, Vec<(u64, ProducerBatch)>)> {
    let limits = replica.config().producer_limits();
    let head = log.head_op();
    let mut table = match snapshot.map(|bytes| ProducerTable::decode(&bytes, limits)) {
        // A snapshot past the head describes ops this log lost (a power loss of a `replicated`
        // group): not this log's state.
        Some(Ok(table)) if table.op() <= head => table,
        Some(_) => {
            counters.producer_snapshots_rejected += 1;
            ProducerTable::new(limits)
        }
        None => ProducerTable::new(limits),
    };
    let commit = replica.commit();
    let mut uncommitted = Vec::new();
    let from_op = table.op() + 1;
    if from_op > head {
        return Ok((table, uncommitted));
    }
    let mut offset = match log.read_op(from_op).await? {
        Some(first) => first.base_offset(),
        // Below the log's start (retention): replay what is left.
        None => log.first_offset(),
    };
    'scan: loop {
        let prepares = log.read_offset(offset, 1 << 20).await?;
        let before = offset;
        for prepare in prepares {
            let op = prepare.op();
            if op > head {
                break 'scan;
            }
            offset = offset.max(prepare.end_offset());
            if op < from_op {
                continue;
            }
            counters.producer_ops_replayed += 1;
            let Some(batch) = ProducerBatch::from_body(&prepare.body()) else { continue };
            if op <= commit {
                let fields = prepare.header.as_prepare().expect("stored records are prepares");
                table.apply(&batch, op, fields.base_offset, fields.append_time_ms);
            } else {
                uncommitted.push((op, batch));
            }
        }
        if offset == before {
            break;
        }
    }
    table.advance_to(commit.min(head));
    Ok((table, uncommitted))
}

/// The lower of two faulty-suffix starts, either possibly absent.
fn min_faulty(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The newest `count` headers of a recovered log, ascending.
async fn newest_headers<S: Storage>(
    log: &mut shoal_engine::partition::PartitionLog<S>,
    count: usize,
) -> EngineResult<Vec<Header>> {
    let head = log.head_op();
    let low = (head + 1).saturating_sub(count as u64).max(1);
    let mut headers = Vec::new();
    let mut op = low;
    while op <= head {
        let Some(first) = log.read_op(op).await? else {
            // Below the log's start (retention): begin where it begins.
            op += 1;
            continue;
        };
        let prepares = log.read_offset(first.base_offset(), 1 << 20).await?;
        let before = headers.len();
        for prepare in prepares {
            if prepare.op() >= op && prepare.op() <= head {
                headers.push(prepare.header);
            }
        }
        if headers.len() == before {
            headers.push(first.header);
        }
        op = headers.last().and_then(|h| h.as_prepare()).map_or(op + 1, |p| p.op + 1);
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use shoal_engine::storage::sim::{Sim, SimConfig, SimStorage};

    use super::*;
    use crate::message::{ReplyResult, Request};

    #[derive(Default)]
    struct Sent(Vec<(u8, Bytes)>);

    impl Transport for Sent {
        fn send(&mut self, to: u8, packet: Bytes) {
            self.0.push((to, packet));
        }
    }

    struct Zero;

    impl Clock for Zero {
        fn now_ms(&self) -> i64 {
            0
        }
    }

    fn node(sim: &Sim, held_messages_max: usize) -> Node<SimStorage, Sent, Zero> {
        let config =
            NodeConfig { held_messages_max, ..NodeConfig::new(0, ReplicaConfig::new(1, 0, 3, 0)) };
        let shard = ShardConfig { cluster: 1, ..ShardConfig::small() };
        let open =
            Node::open(sim.storage(), Path::new("/d"), shard, config, Sent::default(), Zero, 3);
        let (mut node, _) = sim.block_on(open).unwrap();
        // Group 1: the primary of view 0 is node 1, so node 0 is a backup that will vote.
        let group = GroupConfig {
            segment_size_bytes: 1 << 20,
            record_size_bytes_max: 4096,
            ..GroupConfig::default()
        };
        sim.block_on(node.create_group(1, group)).unwrap();
        node
    }

    /// DESIGN.md §4 ("repair is rationed so it never starves client traffic"): five groups of a
    /// backup node learn at once that they are far behind. The node lets at most
    /// `repair_rounds_per_tick_max` of them start a round per tick and keeps at most
    /// `repair_rounds_in_flight_max` rounds in flight; each round goes to one peer; the groups
    /// still waiting get their turn once rounds time out.
    #[test]
    fn repair_rounds_are_rationed_per_tick_and_in_flight() {
        let sim = Sim::new(2, SimConfig::default());
        let mut node = node(&sim, 64);
        node.config.repair_rounds_per_tick_max = 2;
        node.config.repair_rounds_in_flight_max = 3;
        let group = GroupConfig {
            segment_size_bytes: 1 << 20,
            record_size_bytes_max: 4096,
            ..GroupConfig::default()
        };
        // Node 0 backs up every group whose primary in view 0, `g mod 3`, is another node.
        let groups = [1, 2, 4, 5, 7];
        for g in groups.into_iter().skip(1) {
            sim.block_on(node.create_group(g, group)).unwrap();
        }
        for primary in [1u8, 2] {
            let entries: Vec<CommitEntry> = groups
                .into_iter()
                .filter(|g| g % 3 == u64::from(primary))
                .map(|group| CommitEntry { group, commit: 50, commit_checksum: 0, view: 0 })
                .collect();
            let packet = codec::encode_commits(node.config.replica.cluster, primary, &entries);
            node.on_packet(primary, &packet).unwrap();
        }
        let limits = CodecLimits {
            message_size_bytes_max: 1 << 20,
            view_headers_max: 128,
            commit_entries_max: 8,
        };
        let mut rounds_per_tick = Vec::new();
        let mut rounds_of: BTreeMap<u64, usize> = BTreeMap::new();
        for tick in 0..8 {
            node.transport.0.clear();
            node.on_tick();
            let mut asked: BTreeMap<u64, u8> = BTreeMap::new();
            for (to, packet) in &node.transport.0 {
                let (_, messages) =
                    codec::decode(node.config.replica.cluster, packet, &limits).unwrap();
                for (group, message) in messages {
                    if matches!(message, Message::RequestPrepare { .. }) {
                        let previous = asked.insert(group, *to);
                        assert!(previous.is_none_or(|p| p == *to), "a round asks one peer");
                        // The first round asks the primary; one that brought nothing makes the
                        // next ask the other peer.
                        let primary = (group % 3) as u8;
                        let first = rounds_of.get(&group).is_none_or(|&n| n == 0);
                        let expected = if first { primary } else { 3 - primary };
                        assert_eq!(*to, expected, "tick {tick} group {group}");
                    }
                }
            }
            for group in asked.keys() {
                *rounds_of.entry(*group).or_default() += 1;
            }
            rounds_per_tick.push(asked.len());
        }
        // 2 on the first tick, 1 more (3 in flight), none until rounds time out after the
        // repair interval (5 ticks), then the next groups' turn.
        assert_eq!(&rounds_per_tick[..5], &[2, 1, 0, 0, 0], "{rounds_per_tick:?}");
        assert!(rounds_per_tick[5..].iter().sum::<usize>() >= 2, "{rounds_per_tick:?}");
        let counters = node.counters();
        assert!(counters.repair_rounds_deferred >= 3, "{counters:?}");
    }

    /// Limits everywhere: peers' prepare reads wait in a queue of at most
    /// `serve_reads_queued_max`; requests beyond it are dropped (counted), the queued ones are
    /// served at the next I/O round, and the queue takes requests again after it.
    #[test]
    fn peers_prepare_reads_queue_up_to_their_bound() {
        let sim = Sim::new(5, SimConfig::default());
        let mut node = node(&sim, 64);
        node.config.serve_reads_queued_max = 4;
        node.config.replica.stamp_batches = false;
        // Group 3: node 0 is the primary of view 0.
        let group = GroupConfig {
            segment_size_bytes: 1 << 20,
            record_size_bytes_max: 4096,
            ..GroupConfig::default()
        };
        sim.block_on(node.create_group(3, group)).unwrap();
        for number in 1..=10 {
            node.on_client_request(3, request(number, 100)).unwrap();
        }
        sim.block_on(node.run_io());
        let cluster = node.config.replica.cluster;
        let checksum = node.replica(3).unwrap().header(10).unwrap().checksum_header;
        let ok = Message::PrepareOk { view: 0, op: 10, commit: 0, prepare_checksum: checksum };
        node.on_packet(1, &codec::encode(cluster, 1, 3, &ok)).unwrap();
        assert_eq!(node.replica(3).unwrap().commit(), 10, "committed: bodies leave memory");
        sim.block_on(node.run_io());
        node.transport.0.clear();
        for op in 1..=10 {
            let ask = Message::RequestPrepare { view: 0, op, checksum: None };
            node.on_packet(1, &codec::encode(cluster, 1, 3, &ask)).unwrap();
        }
        assert_eq!(node.reads.len(), 4, "the queue holds its bound");
        assert_eq!(node.counters().serve_reads_dropped, 6);
        sim.block_on(node.run_io());
        let limits = CodecLimits {
            message_size_bytes_max: 1 << 20,
            view_headers_max: 128,
            commit_entries_max: 8,
        };
        let served: Vec<u64> = node
            .transport
            .0
            .iter()
            .filter(|(to, _)| *to == 1)
            .flat_map(|(_, packet)| codec::decode(cluster, packet, &limits).unwrap().1)
            .filter_map(|(_, message)| match message {
                Message::Prepare { header, .. } => header.as_prepare().map(|p| p.op),
                _ => None,
            })
            .collect();
        assert_eq!(served, vec![1, 2, 3, 4], "the queued reads, in order");
        assert!(node.reads.is_empty());
        let ask = Message::RequestPrepare { view: 0, op: 9, checksum: None };
        node.on_packet(1, &codec::encode(cluster, 1, 3, &ask)).unwrap();
        assert_eq!(node.reads.len(), 1, "room again after the round");
    }

    /// A vote reveals a view that is not durable until the node's I/O round: the node holds the
    /// StartViewChange messages back, within `held_messages_max`, and sends them once durable.
    #[test]
    fn messages_wait_for_durability_within_their_bound() {
        let sim = Sim::new(1, SimConfig::default());
        let mut node = node(&sim, 1);
        for _ in 0..300 {
            node.on_tick();
        }
        assert!(
            node.transport.0.is_empty(),
            "nothing revealing the vote left before it is durable"
        );
        let counters = node.counters();
        assert!(counters.messages_held >= 2 && counters.held_dropped >= 1, "{counters:?}");
        assert_eq!(node.held.len(), 1, "the bound holds");
        sim.block_on(node.run_io());
        assert!(!node.transport.0.is_empty(), "released once the view is durable");
        assert!(node.held.is_empty());
    }

    /// A node of one with a `replicated` group 1 (single-replica groups, so writes commit
    /// at once).
    fn single_node(sim: &Sim) -> Node<SimStorage, Sent, Zero> {
        single_node_with_segments(sim, 64 << 20)
    }

    fn single_node_with_segments(
        sim: &Sim,
        segment_size_bytes: u64,
    ) -> Node<SimStorage, Sent, Zero> {
        let replica = ReplicaConfig { stamp_batches: false, ..ReplicaConfig::new(1, 0, 1, 0) };
        let config = NodeConfig { held_messages_max: 64, ..NodeConfig::new(0, replica) };
        let shard = ShardConfig { cluster: 1, ..ShardConfig::small() };
        let open =
            Node::open(sim.storage(), Path::new("/d"), shard, config, Sent::default(), Zero, 3);
        let (mut node, _) = sim.block_on(open).unwrap();
        let group = GroupConfig {
            durability: shoal_engine::superblock::Durability::Replicated,
            segment_size_bytes,
            record_size_bytes_max: 64 << 10,
            ..GroupConfig::default()
        };
        sim.block_on(node.create_group(1, group)).unwrap();
        node
    }

    fn request(number: u64, body_bytes: usize) -> Request {
        Request {
            client: 1,
            session: 1,
            request: number,
            body: bytes::BytesMut::from(&vec![7u8; body_bytes][..]),
            body_checksum: shoal_engine::checksum::crc32c(&vec![7u8; body_bytes]),
            record_count: 1,
            first_timestamp_ms: 0,
            max_timestamp_ms: 0,
            append_time_ms: 0,
        }
    }

    /// A checkpoint's segment sync stays off the reply path: while it is held in flight, every
    /// round still acknowledges its writes, and the checkpoint lands in a later round once
    /// the sync completes.
    #[test]
    fn rounds_acknowledge_writes_while_a_checkpoint_sync_is_in_flight() {
        let sim = Sim::new(4, SimConfig::default());
        let mut node = single_node(&sim);
        sim.set_syncs_held(true);
        let mut number = 0;
        let mut write_and_acknowledge = |node: &mut Node<SimStorage, Sent, Zero>| {
            number += 1;
            node.on_client_request(1, request(number, 32 << 10)).unwrap();
            sim.block_on(node.run_io());
            assert_eq!(node.take_replies().len(), 1, "request {number} answered in its round");
        };
        // The small profile checkpoints every 1 MiB: 32 KiB writes reach it within 40.
        for _ in 0..40 {
            write_and_acknowledge(&mut node);
            if node.checkpoint.is_some() {
                break;
            }
        }
        assert!(node.checkpoint.is_some(), "a checkpoint started");
        for _ in 0..40 {
            write_and_acknowledge(&mut node);
        }
        assert!(node.checkpoint.is_some(), "its sync is still held");
        assert_eq!(node.shard.counters().checkpoints, 0);
        sim.set_syncs_held(false);
        for _ in 0..40 {
            write_and_acknowledge(&mut node);
            if node.shard.counters().checkpoints > 0 {
                break;
            }
        }
        assert!(node.shard.counters().checkpoints > 0, "the checkpoint landed once released");
        sim.block_on(node.close()).unwrap();
    }

    /// A segment roll's syncs (the rolled segment, its index, the directory) belong to the
    /// checkpoint job: writes that cross rolls are acknowledged while every sync is held.
    #[test]
    fn rounds_acknowledge_writes_across_segment_rolls_while_syncs_are_held() {
        let sim = Sim::new(6, SimConfig::default());
        let mut node = single_node_with_segments(&sim, 1 << 20);
        sim.set_syncs_held(true);
        // 96 × 32 KiB = 3 MiB: at least two rolls of 1 MiB segments.
        for number in 1..=96 {
            node.on_client_request(1, request(number, 32 << 10)).unwrap();
            sim.block_on(node.run_io());
            assert_eq!(node.take_replies().len(), 1, "request {number} answered in its round");
        }
        let log = node.shard.group(1).unwrap();
        assert!(log.segment_count() >= 3, "the writes rolled segments");
        assert!(log.open_file_count() >= 2, "rolled segments stay open until settled");
        assert_eq!(node.shard.counters().segment_syncs, 0, "no sync completed");
        sim.set_syncs_held(false);
        for number in 97..=200 {
            node.on_client_request(1, request(number, 32 << 10)).unwrap();
            sim.block_on(node.run_io());
            assert_eq!(node.take_replies().len(), 1, "request {number} answered in its round");
            if node.shard.group(1).unwrap().open_file_count() == 1 {
                break;
            }
        }
        assert_eq!(node.shard.group(1).unwrap().open_file_count(), 1, "rolled segments settled");
        assert!(node.shard.counters().segment_syncs >= 2, "each rolled segment was synced");
        sim.block_on(node.close()).unwrap();
    }

    /// Rounds overlap their flushes: a write applied while a cycle is in flight waits for
    /// the next cycle, and is acknowledged only once that one finishes.
    #[test]
    fn a_write_applied_during_a_flush_is_acknowledged_only_after_its_own_cycle() {
        let sim = Sim::new(5, SimConfig::default());
        let mut node = single_node(&sim);
        node.on_client_request(1, request(1, 1000)).unwrap();
        sim.block_on(node.start_io());
        assert!(node.io_in_flight(), "the first cycle runs on after the round");
        assert!(node.take_replies().is_empty(), "nothing is acknowledged before its write");
        node.on_client_request(1, request(2, 1000)).unwrap();
        sim.block_on(node.start_io());
        let mut acknowledged = Vec::new();
        for _ in 0..8 {
            if !node.io_in_flight() {
                break;
            }
            sim.block_on(node.wait_io());
            let replies: Vec<u64> = node.take_replies().iter().map(|(_, r)| r.request).collect();
            if acknowledged.is_empty() && !replies.is_empty() {
                assert_eq!(replies, vec![1], "the first cycle carried request 1 only");
            }
            acknowledged.extend(replies);
        }
        assert_eq!(acknowledged, vec![1, 2], "request 2 was acknowledged by the second cycle");
        assert_eq!(node.shard.counters().flushes, 2, "one cycle each");
    }

    /// A second `replicated` group on a single node.
    fn add_group(sim: &Sim, node: &mut Node<SimStorage, Sent, Zero>, group: u64) {
        let config = GroupConfig {
            durability: shoal_engine::superblock::Durability::Replicated,
            segment_size_bytes: 64 << 20,
            record_size_bytes_max: 64 << 10,
            ..GroupConfig::default()
        };
        sim.block_on(node.create_group(group, config)).unwrap();
    }

    fn replied(node: &mut Node<SimStorage, Sent, Zero>) -> Vec<(u64, u64)> {
        let replies = node.take_replies();
        assert!(replies.iter().all(|(_, r)| matches!(r.result, ReplyResult::Committed { .. })));
        replies.into_iter().map(|(group, reply)| (group, reply.request)).collect()
    }

    /// Disk full is clean and retryable (DESIGN.md §3): once the space made ready ahead of a
    /// group's tail runs out and no more can be reserved, its requests are refused with the
    /// typed `StorageFull` before they reach the replica; the group is not stopped, its reads
    /// and the other groups' writes (into their own ready space) go on, and once space is
    /// freed a tick's retry lets writes through again, with no reopen.
    #[test]
    fn a_full_disk_refuses_requests_as_storage_full_until_a_tick_finds_room() {
        let sim = Sim::new(3, SimConfig::default());
        let mut node = single_node(&sim);
        add_group(&sim, &mut node, 2);
        for (number, group) in [(1, 1), (2, 2)] {
            node.on_client_request(group, request(number, 1000)).unwrap();
            sim.block_on(node.run_io());
        }
        assert_eq!(replied(&mut node), vec![(1, 1), (2, 2)]);
        sim.set_capacity_bytes(sim.used_bytes());
        let mut accepted = 0;
        let refusal = loop {
            match node.on_client_request(1, request(100 + accepted, 32 << 10)) {
                Ok(()) => accepted += 1,
                Err(refusal) => break refusal,
            }
            sim.block_on(node.run_io());
            assert!(accepted < 100, "a full disk must refuse");
        };
        assert_eq!(refusal, RequestRefused::StorageFull { group: 1 });
        assert!(node.is_storage_full(1) && !node.is_storage_full(2));
        // What was taken fit the space already ready: every one of them is acknowledged.
        assert_eq!(replied(&mut node).len() as u64, accepted);
        for _ in 0..5 {
            node.on_tick();
            sim.block_on(node.run_io());
            assert!(node.on_client_request(1, request(900, 1000)).is_err(), "still full");
        }
        assert!(node.group_failure(1).is_none(), "{:?}", node.group_failure(1));
        assert!(node.counters().storage_full_refusals >= 6);
        // Group 2 writes into the space made ready for it earlier.
        node.on_client_request(2, request(3, 1000)).unwrap();
        sim.block_on(node.run_io());
        assert_eq!(replied(&mut node), vec![(2, 3)]);
        // Reads go on.
        let log = node.shard_mut().group_mut(1).unwrap();
        assert_eq!(
            sim.block_on(log.read_offset(0, usize::MAX)).unwrap().len() as u64,
            accepted + 1
        );
        // Space is freed: the next tick's retry finds it, and writes resume by themselves.
        sim.set_capacity_bytes(u64::MAX);
        node.on_tick();
        sim.block_on(node.run_io());
        assert!(!node.is_storage_full(1));
        node.on_client_request(1, request(901, 1000)).unwrap();
        sim.block_on(node.run_io());
        assert_eq!(replied(&mut node), vec![(1, 901)]);
    }

    /// A write the replica took before the engine knew the disk was full waits for space — in
    /// order, with the group's later writes — while other groups' writes are applied and
    /// acknowledged; once space is freed every waiting write is acknowledged, in order.
    #[test]
    fn writes_waiting_for_space_hold_back_only_their_own_group() {
        let sim = Sim::new(7, SimConfig::default());
        let mut node = single_node(&sim);
        add_group(&sim, &mut node, 2);
        node.on_client_request(2, request(1, 1000)).unwrap();
        sim.block_on(node.run_io());
        assert_eq!(replied(&mut node), vec![(2, 1)]);
        sim.set_capacity_bytes(sim.used_bytes());
        // A burst larger than the space group 1 has ready (256 KiB in the small profile), taken
        // before any flush could find the disk full.
        for number in 10..22 {
            node.on_client_request(1, request(number, 32 << 10)).unwrap();
        }
        sim.block_on(node.start_io());
        // Taken while that cycle runs: the engine does not know yet.
        node.on_client_request(1, request(22, 32 << 10)).unwrap();
        node.on_client_request(2, request(2, 1000)).unwrap();
        while node.io_in_flight() {
            sim.block_on(node.wait_io());
        }
        assert!(node.is_storage_full(1));
        sim.block_on(node.run_io());
        assert_eq!(replied(&mut node), vec![(2, 2)], "group 2 is not held back");
        assert!(node.counters().storage_full_rounds > 0, "group 1's last write waits");
        assert!(matches!(
            node.on_client_request(1, request(23, 1000)),
            Err(RequestRefused::StorageFull { group: 1 })
        ));
        for _ in 0..3 {
            node.on_tick();
            sim.block_on(node.run_io());
        }
        assert!(node.take_replies().is_empty(), "nothing acknowledged without room");
        sim.set_capacity_bytes(u64::MAX);
        for _ in 0..4 {
            node.on_tick();
            sim.block_on(node.run_io());
        }
        let expected: Vec<(u64, u64)> = (10..23).map(|number| (1, number)).collect();
        assert_eq!(replied(&mut node), expected, "in order, once there is room");
        assert!(node.group_failure(1).is_none());
        sim.block_on(node.close()).unwrap();
    }

    #[test]
    fn a_packet_from_another_cluster_or_sender_is_refused_and_counted() {
        let sim = Sim::new(2, SimConfig::default());
        let mut node = node(&sim, 8);
        let foreign = codec::encode(2, 1, 1, &Message::StartViewChange { view: 1 });
        assert!(matches!(node.on_packet(1, &foreign), Err(DecodeError::Invalid("cluster"))));
        let spoofed = codec::encode(1, 2, 1, &Message::StartViewChange { view: 1 });
        assert!(matches!(node.on_packet(1, &spoofed), Err(DecodeError::Invalid("sender"))));
        let unknown = codec::encode(1, 1, 99, &Message::StartViewChange { view: 1 });
        assert!(node.on_packet(1, &unknown).is_ok());
        let counters = node.counters();
        assert_eq!((counters.packets_rejected, counters.messages_unknown_group), (2, 1));
    }
}
