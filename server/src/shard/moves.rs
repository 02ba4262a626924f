//! Partition moves, carried out by the node that leads the partition (DESIGN.md §8): the
//! metadata group decides a move (the catalog names its target voters); the group's primary
//! takes the group's configuration there one change at a time — the new nodes join as
//! learners, the voters switch to the target once every learner to be promoted is caught up
//! (the lag definition of DESIGN.md §4: it acknowledged the head of a moment ago, one step
//! back, and is in sync), then the leaving members are dropped — and asks the
//! metadata group to record the move done. A cancel is a move back to the nodes the partition
//! came from, by the same steps.
//!
//! It never promotes a learner that is not in sync, never changes the voters but all at once
//! (so the group never has fewer voters than its replication factor), and never has two changes
//! of one group in flight. Each change is a control record in the partition's own log, which
//! consumers skip.

use std::collections::HashMap;

use shoal_proto::batch::BatchBuilder;
use shoal_proto::protocol::{MoveAction, MovePartition, Operation};
use shoal_proto::wire::{ClientRequest, Membership};
use shoal_replication::{ReplicaState, Status, TICK_MS};

use super::metadata::MetaWaiter;
use super::offsets::control_request;
use super::state::ShardState;
use super::thread::now_ms;
use super::work::Work;
use super::writes::{PendingWrite, WriteKind};
use crate::balancer::{self, BalancingMove};
use crate::connection::metadata_primary;
use crate::metadata::{METADATA_GROUP, MetaCommand};

/// The key of a configuration change's control record: Kafka's control key layout with a type
/// of Shoal's own ("MC", members change).
pub const MEMBERS_CONTROL_KEY: [u8; 4] = [0, 0, 0x4d, 0x43];

/// Moves advance at most this often, in ticks: a step waits for a commit or a catch-up anyway.
const MOVE_STEP_TICKS: u64 = 5;
/// A change with no answer for this long may be proposed again (its request was refused, or
/// the view changed under it).
const CHANGE_ANSWER_TICKS: u64 = 300;
/// A finished move is reported to the metadata group at most this often until it is recorded.
const DONE_REPORT_TICKS: u64 = 50;
/// The client id a node's configuration changes go under in partition logs (clients pick odd
/// random ids; a collision only mismatches a reply the mover ignores anyway).
const MOVER_CLIENT: u64 = u64::MAX - 1;

/// What the group's primary does next for a move to a `target` configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MoveStep {
    /// Propose this configuration.
    Change(Membership),
    /// Wait: a learner to be promoted is not in sync yet.
    Wait,
    /// The group runs with the target voters alone.
    Done,
}

/// The next step from `current` towards `target` (its voters, and the learners it keeps: a
/// partition keeps none, the metadata group has every other active node as one);
/// `in_sync(member)` says whether a member is in sync by the primary's lag tracker.
pub(super) fn next_step(
    current: Membership,
    target: Membership,
    in_sync: impl Fn(u8) -> bool,
) -> MoveStep {
    let joining = target.members() & !current.members();
    if joining != 0 {
        let learners = current.learners | joining;
        return MoveStep::Change(Membership { voters: current.voters, learners });
    }
    if current.voters != target.voters {
        let promoted = Membership { voters: target.voters & !current.voters, learners: 0 };
        // Canary (DESIGN.md §7): promote without waiting for the learners to catch up.
        let ready =
            cfg!(feature = "canary-promote-unsynced") || promoted.voter_indices().all(&in_sync);
        if !ready {
            return MoveStep::Wait;
        }
        let learners = current.members() & !target.voters;
        return MoveStep::Change(Membership { voters: target.voters, learners });
    }
    if current.learners != target.learners {
        return MoveStep::Change(target);
    }
    MoveStep::Done
}

/// The metadata group's configuration on a cluster whose `known` nodes (a bit per index) are
/// all its members and whose `leaving` ones must go, from `current`: as many voters as it has
/// (the founding nodes' count, unless too few nodes are left), a leaving voter's seat taken by
/// the lowest active non-voter, and every other active node a learner, so every node holds
/// the catalog.
pub(super) fn metadata_target(current: Membership, known: u32, leaving: u32) -> Membership {
    let active = known & !leaving;
    let mut voters = current.voters & active;
    let mut seats = current.voter_count().saturating_sub(voters.count_ones());
    for node in 0..32u8 {
        if seats == 0 {
            break;
        }
        let bit = 1u32 << node;
        if active & bit != 0 && voters & bit == 0 {
            voters |= bit;
            seats -= 1;
        }
    }
    if voters == 0 {
        // Nothing active is left to vote: the group stays as it is.
        return current;
    }
    Membership { voters, learners: active & !voters }
}

/// The mover's own state on one shard.
#[derive(Default)]
pub(super) struct Mover {
    ticks: u64,
    next_request: u64,
    /// Per group: the tick until which its proposed change is awaited.
    awaited: HashMap<u64, u64>,
    /// Per group: the tick before which its finished move is not reported again.
    reported: HashMap<u64, u64>,
    /// Per group: the primary's head at the previous step. A learner that has acknowledged it
    /// was caught up a step ago; one that has acknowledged nothing in this view never is
    /// (the lag tracker counts a member in sync until its bound passes).
    heads: HashMap<u64, u64>,
    /// Changes proposed (the status document shows them per shard).
    pub(super) changes_proposed: u64,
    /// Steps held back for a learner not in sync yet.
    pub(super) steps_waited: u64,
    /// The tick of the balancer's last look at the catalog.
    balanced_tick: u64,
    /// Moves the balancer started (proposed; one that does not apply is not retried at once).
    pub(super) balancer_moves: u64,
    /// Preferred-primary changes the balancer proposed.
    pub(super) balancer_primaries: u64,
}

impl Mover {
    /// Forgets a group this shard deleted.
    pub(super) fn forget(&mut self, group: u64) {
        self.awaited.remove(&group);
        self.reported.remove(&group);
        self.heads.remove(&group);
    }
}

impl ShardState {
    /// Advances every move of a partition this shard's replica leads, one step at a time.
    pub(super) fn drive_moves(&mut self) {
        self.mover.ticks += 1;
        let tick = self.mover.ticks;
        if !tick.is_multiple_of(MOVE_STEP_TICKS) {
            return;
        }
        if self.index == 0 {
            self.drive_metadata_members(tick);
            self.balance(tick);
        }
        // Without a move anywhere (the common case) this is one pass over the places, with no
        // allocation.
        if self.catalog.places().all(|place| place.target.is_empty()) {
            return;
        }
        let mut moving = Vec::new();
        for (stream, topic, info) in self.catalog.partition_infos() {
            if info.shard != self.index {
                continue;
            }
            let Ok((_, place)) = self.catalog.partition(&stream, &topic, info.partition) else {
                continue;
            };
            if !place.target.is_empty() {
                moving.push((stream, topic, info.partition, place));
            }
        }
        for (stream, topic, partition, place) in moving {
            let group = place.group;
            let target = Membership { voters: place.target.voters, learners: 0 };
            match self.step_towards(group, |_| target, tick) {
                None => {}
                Some(MoveStep::Change(next)) => self.propose_change(group, next, tick),
                Some(MoveStep::Wait) => self.mover.steps_waited += 1,
                Some(MoveStep::Done) => {
                    self.mover.heads.remove(&group);
                    if self.mover.reported.get(&group).is_some_and(|&until| tick < until) {
                        continue;
                    }
                    self.mover.reported.insert(group, tick + DONE_REPORT_TICKS);
                    let done = MoveAction::Done { voters: place.target.voters };
                    self.report_move(MovePartition { stream, topic, partition, action: done });
                }
            }
        }
    }

    /// The next step of `group` towards `target(current members)`, where this replica leads
    /// the group and no change of it is awaited; `None` otherwise.
    fn step_towards(
        &mut self,
        group: u64,
        target: impl Fn(Membership) -> Membership,
        tick: u64,
    ) -> Option<MoveStep> {
        let replica = self.node.replica(group)?;
        if !replica.is_primary() || replica.status() != Status::Normal {
            return None;
        }
        if self.mover.awaited.get(&group).is_some_and(|&until| tick < until) {
            return None;
        }
        let status = self.node.group_status(group)?;
        let head_before = self.mover.heads.insert(group, status.head);
        let in_sync = |member: u8| {
            status.replicas.iter().any(|p| {
                p.replica == member
                    && p.state == ReplicaState::InSync
                    && head_before.is_some_and(|head| p.acknowledged_op >= head)
            })
        };
        let current = replica.config().members;
        Some(next_step(current, target(current), in_sync))
    }

    /// Shard 0 of the metadata group's primary: keeps the metadata group's members in step
    /// with the node book ([`metadata_target`]): an added node joins as a learner, a leaving
    /// one hands its seat over and goes.
    fn drive_metadata_members(&mut self, tick: u64) {
        let cluster = &self.config.cluster;
        if cluster.nodes.is_empty() {
            return;
        }
        let known = self.catalog.nodes.known(cluster.founders());
        let leaving = self.catalog.nodes.leaving;
        let target = |current| metadata_target(current, known, leaving);
        match self.step_towards(METADATA_GROUP, target, tick) {
            Some(MoveStep::Change(next)) => self.propose_change(METADATA_GROUP, next, tick),
            Some(MoveStep::Wait) => self.mover.steps_waited += 1,
            Some(MoveStep::Done) => {
                self.mover.heads.remove(&METADATA_GROUP);
            }
            None => {}
        }
    }

    /// Shard 0 of the metadata group's serving primary, with the balancer on: every
    /// `balancer_interval_ms`, proposes the balancer's next move, if any, else its next
    /// preferred-primary change, if any.
    fn balance(&mut self, tick: u64) {
        let cluster = &self.config.cluster;
        let interval_ticks = cluster.balancer_interval_ms / TICK_MS;
        if cluster.balancer_interval_ms == 0
            || tick < self.mover.balanced_tick + interval_ticks.max(MOVE_STEP_TICKS)
        {
            return;
        }
        self.mover.balanced_tick = tick;
        let serving = self
            .node
            .replica(METADATA_GROUP)
            .is_some_and(|replica| replica.is_primary() && replica.status() == Status::Normal);
        if !serving {
            return;
        }
        let founders = cluster.founders();
        let command = if let Some(next) = balancer::next_move(&self.catalog, founders) {
            let BalancingMove { stream, topic, partition, action } = next;
            tracing::info!(stream, topic, partition, ?action, "the balancer moves a partition");
            self.mover.balancer_moves += 1;
            MetaCommand::Move { stream, topic, partition, action, nodes: founders }
        } else if let Some((group, node)) = balancer::next_primary(&self.catalog, founders) {
            tracing::info!(group, node, "the balancer prefers another primary for a partition");
            self.mover.balancer_primaries += 1;
            MetaCommand::PreferPrimary { group, node: Some(node) }
        } else {
            return;
        };
        let Some(metadata) = self.metadata.as_mut() else { return };
        let client = metadata.next_internal_request();
        self.propose_metadata(client, command, MetaWaiter::Nobody);
    }

    /// Proposes `group`'s change to `next` as a control record in its log.
    fn propose_change(&mut self, group: u64, next: Membership, tick: u64) {
        self.mover.next_request += 1;
        self.mover.changes_proposed += 1;
        let now = now_ms();
        let mut batch = BatchBuilder::new(now).control();
        batch.push(now, Some(&MEMBERS_CONTROL_KEY), Some(&next.to_word().to_le_bytes()), &[]);
        let request = self.mover.next_request;
        let client = ClientRequest { client: MOVER_CLIENT, session: 0, request, operation: 0 };
        let request = control_request(client, &batch.build(), now);
        tracing::info!(group, ?next, "proposing a configuration change for a move");
        self.mover.awaited.insert(group, tick + CHANGE_ANSWER_TICKS);
        // Nobody waits on the answer: the group's configuration is what the next step reads.
        let (reply, _) = flume::bounded(1);
        self.queue_write(
            group,
            request,
            PendingWrite { kind: WriteKind::Reconfigure(next), reply },
        );
    }

    /// A change's answer came (committed or not): the next step may follow at once.
    pub(super) fn change_answered(&mut self, group: u64) {
        self.mover.awaited.remove(&group);
    }

    /// Asks the metadata group's primary, wherever it is, to record `done`. A lost report is
    /// sent again after [`DONE_REPORT_TICKS`] while the catalog still shows the move.
    fn report_move(&mut self, done: MovePartition) {
        let mesh = self.mesh.clone();
        let config = std::sync::Arc::clone(&self.config);
        let published = std::sync::Arc::clone(&self.published);
        monoio::spawn(async move {
            let Some((_, primary)) = metadata_primary(&mesh).await else { return };
            let client =
                ClientRequest { client: MOVER_CLIENT, session: 0, request: 0, operation: 0 };
            let cluster = &config.cluster;
            if primary == cluster.node {
                let MovePartition { stream, topic, partition, action } = done;
                let nodes = cluster.founders();
                let command = MetaCommand::Move { stream, topic, partition, action, nodes };
                let (reply, _) = flume::bounded(1);
                let _ = mesh[0].send_async(Work::Metadata { client, command, reply }).await;
                return;
            }
            let Some(address) = published.latest().nodes.client_address(cluster, primary) else {
                return;
            };
            let requests = [(Operation::MovePartition, done.encode())];
            if let Err(error) =
                crate::kafka::call_each(address, cluster.id, MOVER_CLIENT, 1, &requests).await
            {
                tracing::warn!(%error, "reporting a finished move to the metadata primary");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(voters: u32, learners: u32) -> Membership {
        Membership { voters, learners }
    }

    /// A move of one replica from node 0 to node 2, and of three replicas from {0,1,2} to
    /// {1,2,3}: add the new nodes as learners, switch once they are in sync (never before),
    /// drop the leaving ones; a cancel after the switch is a move back by the same steps.
    #[test]
    fn a_move_adds_learners_switches_once_they_are_in_sync_then_drops_the_leavers() {
        let never = |_| false;
        let always = |_| true;
        assert_eq!(
            next_step(members(0b1, 0), members(0b100, 0), never),
            MoveStep::Change(members(0b1, 0b100))
        );
        if !cfg!(feature = "canary-promote-unsynced") {
            assert_eq!(next_step(members(0b1, 0b100), members(0b100, 0), never), MoveStep::Wait);
        }
        assert_eq!(
            next_step(members(0b1, 0b100), members(0b100, 0), always),
            MoveStep::Change(members(0b100, 0b1))
        );
        assert_eq!(
            next_step(members(0b100, 0b1), members(0b100, 0), never),
            MoveStep::Change(members(0b100, 0))
        );
        assert_eq!(next_step(members(0b100, 0), members(0b100, 0), never), MoveStep::Done);

        let only_3 = |member| member == 3;
        assert_eq!(
            next_step(members(0b0111, 0), members(0b1110, 0), never),
            MoveStep::Change(members(0b0111, 0b1000))
        );
        assert_eq!(
            next_step(members(0b0111, 0b1000), members(0b1110, 0), only_3),
            MoveStep::Change(members(0b1110, 0b0001))
        );
        // Cancelled after the switch: back to {0,1,2}, node 0 still a learner and in sync.
        let only_0 = |member| member == 0;
        assert_eq!(
            next_step(members(0b1110, 0b0001), members(0b0111, 0), only_0),
            MoveStep::Change(members(0b0111, 0b1000))
        );
        // Cancelled before the switch: the learner is dropped, nothing else changes.
        assert_eq!(
            next_step(members(0b0111, 0b1000), members(0b0111, 0), never),
            MoveStep::Change(members(0b0111, 0))
        );
    }

    /// The metadata group: an added node joins as a learner; removing a voter moves its seat
    /// to the lowest active non-voter (promoted only once in sync), and the leaver goes last.
    #[test]
    fn the_metadata_group_follows_the_node_book() {
        let founding = members(0b0111, 0);
        // Node 3 added: it becomes a learner, nothing else changes.
        let added = metadata_target(founding, 0b1111, 0);
        assert_eq!(added, members(0b0111, 0b1000));
        assert_eq!(next_step(founding, added, |_| false), MoveStep::Change(added));
        // Node 0 leaving: node 3 takes its seat.
        let removing = metadata_target(added, 0b1111, 0b0001);
        assert_eq!(removing, members(0b1110, 0));
        if !cfg!(feature = "canary-promote-unsynced") {
            assert_eq!(next_step(added, removing, |_| false), MoveStep::Wait);
        }
        let switched = members(0b1110, 0b0001);
        assert_eq!(next_step(added, removing, |n| n == 3), MoveStep::Change(switched));
        assert_eq!(next_step(switched, removing, |_| false), MoveStep::Change(removing));
        assert_eq!(next_step(removing, removing, |_| false), MoveStep::Done);
        // Too few nodes left to fill every seat: the active ones vote.
        assert_eq!(metadata_target(founding, 0b0111, 0b0011), members(0b0100, 0));
        // Nothing active: unchanged.
        assert_eq!(metadata_target(founding, 0b0111, 0b0111), founding);
    }
}
