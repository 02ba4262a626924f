//! The branches a run exercised ([`Coverage`]): the replicas' and nodes' counters (a crashed
//! node's as it goes down, the live ones' at the end) and the fault injection's own, so a swarm
//! can require minimums and fail rather than pass vacuously.
//!
//! It only counts: nothing here decides anything in a run or feeds the trace hash.

use super::cluster::{Cluster, SimNode};
use crate::replica::ReplicaCounters;

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
    /// Repair rounds given another interval because answers were arriving.
    pub repair_rounds_extended: u64,
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
    /// Damaged torn tails of `persisted` logs held faulty at open.
    pub torn_tails_held_faulty: u64,
    /// Zero steps the engines completed (space ahead of a small direct log's tail, written with
    /// zeros beside its flush jobs).
    pub zero_steps: u64,
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
    /// Segments retention retired and the driver removed (runs with a retention bound).
    pub segments_retired: u64,
    /// I/O rounds in which a full disk deferred writes.
    pub storage_full_rounds: u64,
    /// Hand-overs primaries began (back home, or off a node shutting down).
    pub hand_overs_begun: u64,
    /// Hand-overs in which the primary, its target caught up, left its view for the target's.
    pub hand_overs_done: u64,
    /// Hand-overs given up (the target did not catch up in time, or the view was lost first).
    pub hand_overs_abandoned: u64,
    /// View changes joined at once on the vote of the primary of the joiner's view.
    pub abdications_joined: u64,
    /// PrepareOks primaries took from learners (progress only).
    pub learner_acks: u64,
    /// Configuration changes primaries prepared.
    pub reconfigurations_prepared: u64,
    /// Configuration changes operator clients saw committed.
    pub moves_done: u64,
    /// Of those, each step of a move: a learner added, the voters switched (a caught-up
    /// learner promoted, a voter demoted), a demoted member dropped.
    pub move_learners_added: u64,
    pub move_voters_switched: u64,
    pub move_members_dropped: u64,
    /// Epochs replicas entered by committing the change that opened them.
    pub epochs_entered: u64,
    /// Epochs replicas entered by installing a newer epoch's StartView.
    pub epochs_installed: u64,
    /// Older-epoch messages answered with the newer epoch's StartView.
    pub older_epochs_answered: u64,
    /// Newer-epoch messages answered with a probe.
    pub newer_epochs_probed: u64,
    /// Requests refused while a configuration change closed its epoch.
    pub requests_refused_epoch_closing: u64,
    /// Hand-overs begun to bring a group back to its home.
    pub primaries_returned: u64,
    /// Hand-overs begun by controlled shutdowns.
    pub shutdown_hand_overs: u64,
    /// Controlled shutdowns begun.
    pub controlled_shutdowns: u64,
    /// Controlled shutdowns that stopped settled (`Node::shutdown_settled`), not at their bound.
    pub shutdowns_settled: u64,
    /// Ticks groups slept through (one-replica primaries with nothing to do), counted when an
    /// input woke them: the one figure a run with sleeping groups may differ in from one
    /// without.
    pub ticks_slept: u64,
}

impl Coverage {
    /// Adds one replica's counters.
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
        self.repair_rounds_extended += counters.repair_rounds_extended;
        self.recovery_view_changes += counters.recovery_view_changes;
        self.backups_lagging += counters.backups_lagging;
        self.backups_dead += counters.backups_dead;
        self.backups_back_in_sync += counters.backups_back_in_sync;
        self.duplicates += counters.duplicates;
        self.ranges_evicted += counters.ranges_evicted;
        self.transfers_installed += counters.transfers_installed;
        self.stale_prepares_dropped += counters.stale_prepares_dropped;
        self.hand_overs_begun += counters.hand_overs_begun;
        self.hand_overs_done += counters.hand_overs_done;
        self.hand_overs_abandoned += counters.hand_overs_abandoned;
        self.abdications_joined += counters.abdications_joined;
        self.learner_acks += counters.learner_acks;
        self.reconfigurations_prepared += counters.reconfigurations_prepared;
        self.epochs_entered += counters.epochs_entered;
        self.epochs_installed += counters.epochs_installed;
        self.older_epochs_answered += counters.older_epochs_answered;
        self.newer_epochs_probed += counters.newer_epochs_probed;
        self.requests_refused_epoch_closing += counters.requests_refused_epoch_closing;
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
            (&mut self.repair_rounds_extended, other.repair_rounds_extended),
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
            (&mut self.torn_tails_held_faulty, other.torn_tails_held_faulty),
            (&mut self.zero_steps, other.zero_steps),
            (&mut self.damage_repaired, other.damage_repaired),
            (&mut self.damaged_ops_repaired, other.damaged_ops_repaired),
            (&mut self.groups_reopened, other.groups_reopened),
            (&mut self.read_errors, other.read_errors),
            (&mut self.opens_failed, other.opens_failed),
            (&mut self.failed_restarts, other.failed_restarts),
            (&mut self.disk_full_periods, other.disk_full_periods),
            (&mut self.segments_retired, other.segments_retired),
            (&mut self.storage_full_rounds, other.storage_full_rounds),
            (&mut self.hand_overs_begun, other.hand_overs_begun),
            (&mut self.hand_overs_done, other.hand_overs_done),
            (&mut self.hand_overs_abandoned, other.hand_overs_abandoned),
            (&mut self.abdications_joined, other.abdications_joined),
            (&mut self.learner_acks, other.learner_acks),
            (&mut self.reconfigurations_prepared, other.reconfigurations_prepared),
            (&mut self.moves_done, other.moves_done),
            (&mut self.move_learners_added, other.move_learners_added),
            (&mut self.move_voters_switched, other.move_voters_switched),
            (&mut self.move_members_dropped, other.move_members_dropped),
            (&mut self.epochs_entered, other.epochs_entered),
            (&mut self.epochs_installed, other.epochs_installed),
            (&mut self.older_epochs_answered, other.older_epochs_answered),
            (&mut self.newer_epochs_probed, other.newer_epochs_probed),
            (&mut self.requests_refused_epoch_closing, other.requests_refused_epoch_closing),
            (&mut self.primaries_returned, other.primaries_returned),
            (&mut self.shutdown_hand_overs, other.shutdown_hand_overs),
            (&mut self.controlled_shutdowns, other.controlled_shutdowns),
            (&mut self.shutdowns_settled, other.shutdowns_settled),
            (&mut self.ticks_slept, other.ticks_slept),
        ];
        for (mine, theirs) in pairs {
            *mine += theirs;
        }
    }
}

impl Cluster {
    /// The coverage so far: crashed replicas' counters and the live ones'.
    pub fn coverage(&self) -> Coverage {
        let mut coverage = self.coverage;
        for host in &self.nodes {
            if let Some(node) = &host.node {
                add_counters(&mut coverage, node);
            }
            coverage.admin_duplicates += host.admin.as_ref().map_or(0, |a| a.duplicates);
        }
        coverage
    }
}

/// Adds node `node`'s counters and its replicas' (when it goes down, or at the end of a run).
pub(super) fn add_counters(coverage: &mut Coverage, node: &SimNode) {
    for group in node.group_ids() {
        if let Some(replica) = node.replica(group) {
            coverage.add_replica(&replica.counters());
        }
    }
    let counters = node.counters();
    coverage.damage_cuts += counters.damage_cuts;
    coverage.torn_tails_held_faulty += counters.torn_tails_held_faulty;
    coverage.zero_steps += node.store().counters().zero_steps;
    coverage.damage_repaired += counters.damage_repaired;
    coverage.damaged_ops_repaired += counters.damaged_ops_repaired;
    coverage.groups_reopened += counters.groups_reopened;
    coverage.storage_full_rounds += counters.storage_full_rounds;
    coverage.primaries_returned += counters.primaries_returned;
    coverage.shutdown_hand_overs += counters.shutdown_hand_overs;
    coverage.ticks_slept += counters.ticks_slept;
}
