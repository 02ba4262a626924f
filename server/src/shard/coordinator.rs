//! Shard 0's consumer group coordinator at work: joins, heartbeats and leaves update its
//! membership (`crate::groups::Coordinator`), a changed membership or an expired member becomes a
//! rebalance proposed through the metadata log, and a join is answered once an assignment in
//! force includes it.
//!
//! An assignment is in force only once its metadata op committed; the coordinator never answers
//! a join from a proposal.

use shoal_proto::protocol::ErrorCode;
use shoal_proto::wire::ClientRequest;

use super::metadata::MetaWaiter;
use super::state::ShardState;
use super::thread::now_ms;
use super::work::{GroupRequest, Outcome, ReplySender};
use crate::groups;

impl ShardState {
    /// Proposes every rebalance the coordinator finds due.
    pub(super) fn propose_rebalances(&mut self) {
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

    /// A consumer group request: the coordinator updates membership, a changed membership
    /// becomes a rebalance proposal, and a join is answered once an assignment includes it.
    pub(super) fn group_request(&mut self, request: GroupRequest, reply: ReplySender) {
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
    pub(super) fn expire_members(&mut self) {
        let Some(metadata) = self.metadata.as_mut() else { return };
        if metadata.coordinator.expire(now_ms()) > 0 {
            self.propose_rebalances();
        }
    }
}
