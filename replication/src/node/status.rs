//! What a node reports of itself for status, metrics and tests: its [`NodeCounters`], its
//! groups (their replicas, status and failures, full storage) and read access to the engine
//! and transport.
//!
//! Read-only views (the engine and transport handed out for inspection aside): nothing here
//! feeds a replica or starts I/O.

use shoal_engine::shard::ShardStore;
use shoal_engine::storage::Storage;

use super::config::{Clock, Transport};
use super::state::{Group, Node};
use crate::lag::GroupStatus;
use crate::replica::Replica;

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
    /// Appends a bound still refused after settling, left waiting (with their group's later
    /// writes) for a later round instead of stopping the group.
    pub appends_waiting_rounds: u64,
    /// Groups stopped by an engine failure.
    pub groups_failed: u64,
    /// Groups deleted from this node (removed replicas, deleted topics).
    pub groups_deleted: u64,
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
    /// Disk reads started for peers (each reads a run of consecutive ops by one scan).
    pub serve_disk_reads: u64,
    /// Requests for ops retention had removed, answered with `RangeEvicted`.
    pub ranges_evicted_sent: u64,
    /// Peers' prepare requests dropped at `serve_reads_queued_max`.
    pub serve_reads_dropped: u64,
    /// State transfers installed (a log replaced by one beginning at a peer's state).
    pub transfers_installed: u64,
    /// Client requests refused because their group's storage was full.
    pub storage_full_refusals: u64,
    /// Producer table snapshots the driver handed over that did not decode, or lay past the
    /// log's head of a group recovering uncleanly (the table was rebuilt from the log instead).
    pub producer_snapshots_rejected: u64,
    /// Prepares read back at open to rebuild producer tables.
    pub producer_ops_replayed: u64,
    /// Damage cuts made (protocol-aware recovery, at open or after a read found damage).
    pub damage_cuts: u64,
    /// Groups whose `persisted` log's torn window ended in a damaged record past its head,
    /// held faulty from there at open (it may have been a synced, acknowledged op).
    pub torn_tails_held_faulty: u64,
    /// Groups reopened because a read while serving a peer found damage.
    pub groups_reopened: u64,
    /// Damage cuts whose ops the replica got back from peers (the marker cleared).
    pub damage_repaired: u64,
    /// Ops past damage cuts that were repaired from peers.
    pub damaged_ops_repaired: u64,
    /// Hand-overs begun to bring a group back to its home, in sync again.
    pub primaries_returned: u64,
    /// Hand-overs begun by a controlled shutdown ([`Node::hand_over_all`]).
    pub shutdown_hand_overs: u64,
    /// Groups a controlled shutdown found no peer in sync to hand to (per attempt).
    pub shutdown_groups_without_peer: u64,
    /// Ticks groups slept through, their ticks only counting, counted when an input woke them
    /// (see the node's `sleep` module).
    pub ticks_slept: u64,
    /// Groups the I/O rounds looked at to report durable ops: those whose durable op changed,
    /// however many groups the shard holds.
    pub durable_groups_visited: u64,
}

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// Whether `group`'s storage is full: its client requests are refused with
    /// [`RequestRefused::StorageFull`](super::RequestRefused::StorageFull) until a retried reservation succeeds.
    pub fn is_storage_full(&self, group: u64) -> bool {
        self.store.group(group).is_some_and(|log| log.is_storage_full())
    }

    /// How many groups of this shard refuse client requests for lack of disk space; for logs
    /// and status.
    pub fn storage_full_group_count(&self) -> usize {
        self.store.storage_full_group_count()
    }

    /// The replica of `group`. A sleeping replica's figures that grow with time (its peers'
    /// silence and lag) trail the node's by the ticks it slept through: read those through
    /// [`Node::group_status`].
    pub fn replica(&self, group: u64) -> Option<&Replica> {
        self.groups.get(&group).map(|g| &g.replica)
    }

    /// `group` as its replica sees it (DESIGN.md §4 "Lag"): view, status, commit point, head and,
    /// on the group's primary, every member's progress and the in-sync set. Lags are in ticks;
    /// the driver knows how long its tick is.
    pub fn group_status(&self, group: u64) -> Option<GroupStatus> {
        self.groups.get(&group).map(|g| g.replica.group_status_after(self.asleep_ticks(g)))
    }

    /// Why `group` stopped, if it did.
    pub fn group_failure(&self, group: u64) -> Option<&str> {
        self.groups.get(&group).and_then(|g| g.failed.as_deref())
    }

    /// The groups held.
    pub fn group_ids(&self) -> Vec<u64> {
        self.groups.keys().copied().collect()
    }

    /// The groups whose replica a configuration change removed (empty, allocating nothing, when
    /// there are none).
    pub fn removed_group_ids(&self) -> Vec<u64> {
        let removed = |(_, g): &(&u64, &Group)| g.replica.status() == crate::Status::Removed;
        self.groups.iter().filter(removed).map(|(&id, _)| id).collect()
    }

    /// The engine, read-only (for inspection).
    pub fn store(&self) -> &ShardStore<S> {
        &self.store
    }

    /// The engine (for reads and inspection).
    pub fn store_mut(&mut self) -> &mut ShardStore<S> {
        &mut self.store
    }

    /// The transport.
    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }

    /// This node's index (its replica index in every group).
    pub fn node_index(&self) -> u8 {
        self.config.node
    }

    /// Counters.
    pub fn counters(&self) -> NodeCounters {
        self.counters
    }
}
