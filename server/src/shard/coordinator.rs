//! Shard 0's consumer group coordinator at work: joins, heartbeats and leaves update its
//! membership (`crate::groups::Coordinator`), a changed membership or an expired member becomes a
//! rebalance proposed through the metadata log, and a join is answered once an assignment in
//! force includes it.
//!
//! An assignment is in force only once its metadata op committed; the coordinator never answers
//! a join from a proposal.
//!
//! The coordinator runs on the metadata group's primary only, like Kafka's group coordinator on
//! its partition leader: elsewhere a group request is answered `NotPrimary` naming that primary.
//! A node that becomes the serving primary starts it once its metadata state has applied every
//! op its replica knows committed, seeding membership from the assignments in force (hard
//! state, in the log) with a fresh session for every member; a node that stops being primary
//! answers the joins still waiting and drops its membership (soft state). What is lost with it
//! is only liveness: a member that died while no node coordinated is noticed one session
//! timeout after the new coordinator starts, and a rebalance proposed but not committed by the
//! old primary is proposed again by the new one.

use shoal_proto::protocol::ErrorCode;

use super::kafka_coordinator::restart_kafka_groups;
use super::metadata::MetaWaiter;
use super::state::ShardState;
use super::thread::now_ms;
use super::work::{GroupRequest, Outcome, ReplySender, redirect};
use crate::groups::{self, Coordinator};
use crate::metadata::METADATA_GROUP;

impl ShardState {
    /// Starts the coordinator when this node becomes the metadata group's serving primary with
    /// its metadata state caught up, and stops it (answering waiting joins, dropping
    /// membership) when it no longer is. Called before every group request and every tick.
    pub(super) fn sync_coordinator(&mut self) {
        // A new primary holds every op an earlier primary committed (a stored group among
        // them) but may not know them committed yet: it starts once it has committed the head
        // op its view began with, and applied everything it committed.
        let (leads, commit, view_start_op) = match self.node.replica(METADATA_GROUP) {
            Some(replica) => {
                (replica.is_primary(), replica.commit(), replica.log_view_head_op().unwrap_or(0))
            }
            None => (false, 0, 0),
        };
        let node = self.node.node_index();
        let kafka_delay_ms = self.config.kafka.group_initial_rebalance_delay_ms;
        let Some(metadata) = self.metadata.as_mut() else { return };
        // Catching up gates the start only: a running coordinator's own rebalances commit a
        // moment before they are applied, which must not stop it.
        let starts =
            leads && commit >= view_start_op && metadata.state.catalog.applied_op >= commit;
        if metadata.coordinating == leads || (!metadata.coordinating && !starts) {
            return;
        }
        metadata.coordinating = leads;
        if leads {
            // Member ids must never repeat one handed out before: another start, another node.
            let mut coordinator = Coordinator::new(format!("{:x}.{node}", now_ms()));
            coordinator.seed(&metadata.state.catalog, now_ms());
            metadata.coordinator = coordinator;
            let prefix = Some(format!("{:x}.{node}", now_ms()));
            restart_kafka_groups(&mut metadata.kafka_groups, prefix, kafka_delay_ms);
            metadata.kafka_groups.load(metadata.state.kafka_groups.values(), now_ms());
            tracing::info!(node, applied_op = metadata.state.catalog.applied_op, "coordinating");
            return;
        }
        let joins = std::mem::replace(&mut metadata.coordinator, Coordinator::new(String::new()))
            .drain_joins();
        restart_kafka_groups(&mut metadata.kafka_groups, None, kafka_delay_ms);
        tracing::info!(node, joins = joins.len(), "no longer coordinating");
        for slot in joins {
            let refusal = self.node.replica(METADATA_GROUP).and_then(redirect);
            let _ = slot.send(refusal.unwrap_or_else(not_coordinating));
        }
    }

    /// Proposes every rebalance the coordinator finds due.
    pub(super) fn propose_rebalances(&mut self) {
        let Some(metadata) = self.metadata.as_mut().filter(|m| m.coordinating) else { return };
        let due = metadata.coordinator.rebalances_due(&metadata.state.catalog);
        for (group, command) in due {
            let Some(metadata) = self.metadata.as_mut() else { return };
            let client = metadata.next_internal_request();
            self.propose_metadata(client, command, MetaWaiter::Rebalance(group));
        }
    }

    /// A consumer group request: the coordinator updates membership, a changed membership
    /// becomes a rebalance proposal, and a join is answered once an assignment includes it.
    pub(super) fn group_request(&mut self, request: GroupRequest, reply: ReplySender) {
        self.sync_coordinator();
        let refusal = self.node.replica(METADATA_GROUP).and_then(redirect);
        let Some(metadata) = self.metadata.as_mut() else {
            let _ =
                reply.send(Outcome::error(ErrorCode::InvalidRequest, "not the coordinator shard"));
            return;
        };
        if !metadata.coordinating {
            let _ = reply.send(refusal.unwrap_or_else(not_coordinating));
            return;
        }
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
    pub(super) fn expire_members(&mut self) {
        self.sync_coordinator();
        let Some(metadata) = self.metadata.as_mut().filter(|m| m.coordinating) else { return };
        let retry = std::mem::take(&mut metadata.rebalances_retry);
        if metadata.coordinator.expire(now_ms()) > 0 || retry {
            self.propose_rebalances();
        }
    }
}

/// The answer to a group request on the metadata primary before its coordinator has caught up
/// with the metadata log (or on a node whose primary is unknown).
fn not_coordinating() -> Outcome {
    Outcome::error(
        ErrorCode::TransientNotAccepted,
        "the group coordinator is not running here yet: retry",
    )
}
