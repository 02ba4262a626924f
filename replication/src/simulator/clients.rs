//! The simulated clients: each has one request outstanding at a time to a node of its group (an
//! idempotent producer's batch, or a plain request in the admin group), resends the very batch
//! after a timeout to the next node, follows a `NotPrimary` hint, backs off on a transient
//! refusal, and records every acknowledged write ([`Ack`]) for the final checks.
//!
//! A client judges nothing but a reply only a broken producer table gives; what it was told is
//! checked against the logs in `checks`.

use bytes::Bytes;
use shoal_proto::batch::BatchBuilder;

use super::checks::Violation;
use super::cluster::{Cluster, Packet};
use crate::config::Membership;
use crate::message::ReplyResult;
use crate::replica::Status;

/// Writes an operator client sends between two configuration changes.
const WRITES_PER_MOVE: u64 = 4;

impl Cluster {
    /// Whether clients issue new requests (outstanding ones are still retried).
    pub fn set_clients_active(&mut self, active: bool) {
        self.clients_active = active;
    }

    /// Writes acknowledged to clients so far.
    pub fn acknowledged(&self) -> u64 {
        self.acks.len() as u64
    }

    /// Every client's turn: an idle one issues its next request (while clients are active, and
    /// in the liveness phase until it completed its share), and an outstanding one is sent again
    /// once its resend tick comes, to the next node if the last send went unanswered.
    pub(super) fn drive_clients(&mut self) {
        let replicas = self.nodes.len();
        let admin_group = self.admin_group();
        let liveness = self.tick >= self.liveness_from_tick;
        for index in 0..self.clients.len() {
            let tick = self.tick;
            let next_move = self.next_move(index);
            let client = &mut self.clients[index];
            if client.pending.is_none() && tick >= client.ready_tick {
                if !self.clients_active
                    || (liveness
                        && client.completed_late >= self.options.liveness_requests
                        && client.moves_left == 0)
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
                    reconfigure: next_move,
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
                reconfigure: pending.reconfigure,
            };
            let (endpoint, target) = (replicas + index, usize::from(client.target));
            self.network.send(tick, endpoint, target, packet);
        }
    }

    /// Client `index` takes a delivered reply to its outstanding request.
    pub(super) fn client_reply(&mut self, index: usize, packet: Packet) {
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
                if let Some(next) = pending.reconfigure
                    && next != client.members
                {
                    let step = match client.phase {
                        MovePhase::Add(_) => &mut self.coverage.move_learners_added,
                        MovePhase::Switch => &mut self.coverage.move_voters_switched,
                        MovePhase::Drop(_) => &mut self.coverage.move_members_dropped,
                    };
                    *step += 1;
                }
                if let Some(next) = pending.reconfigure {
                    client.finish_move(next);
                    self.coverage.moves_done += 1;
                }
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
            | ReplyResult::ProducerFenced
            | ReplyResult::ReconfigurationRefused { .. }) => {
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
}

impl Cluster {
    /// The configuration change operator client `index` makes with its next request, if one
    /// is due and ready: a switch waits until the learner it promotes has caught up with the
    /// group's primary (the lag definition's "caught up", seen from outside).
    fn next_move(&self, index: usize) -> Option<Membership> {
        let client = &self.clients[index];
        if client.moves_left == 0 || client.pending.is_some() {
            return None;
        }
        if !client.next_request.is_multiple_of(WRITES_PER_MOVE)
            && self.tick < self.liveness_from_tick
        {
            return None;
        }
        let members = client.members;
        match client.phase {
            MovePhase::Drop(member) => Some(Membership {
                voters: members.voters,
                learners: members.learners & !(1 << member),
            }),
            MovePhase::Add(member) => Some(Membership {
                voters: members.voters,
                learners: members.learners | (1 << member),
            }),
            MovePhase::Switch => {
                let primary = self.primary(client.group)?;
                let commit = self.replica(primary, client.group)?.commit();
                let promoted = members.member_indices().find(|&m| {
                    !members.is_voter(m)
                        && self.replica(usize::from(m), client.group).is_some_and(|r| {
                            r.status() == Status::Normal && r.op_appended() >= commit
                        })
                })?;
                let voters: Vec<u8> = members.voter_indices().collect();
                let demoted = voters[client.moves_left as usize % voters.len()];
                Some(Membership {
                    voters: members.voters & !(1 << demoted) | (1 << promoted),
                    learners: members.learners & !(1 << promoted) | (1 << demoted),
                })
            }
        }
    }
}

/// Where an operator client's cycle of configuration changes stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MovePhase {
    /// Next: promote a caught-up learner and demote a voter in one change.
    Switch,
    /// Next: drop the member the switch demoted.
    Drop(u8),
    /// Next: add that member back as a learner.
    Add(u8),
}

/// Ticks a client waits for a reply before trying the next node.
const CLIENT_TIMEOUT_TICKS: u64 = 400;

/// One simulated client of one group, with at most one request outstanding.
pub(super) struct Client {
    pub(super) id: u64,
    pub(super) group: u64,
    pub(super) next_request: u64,
    pub(super) pending: Option<Pending>,
    pub(super) target: u8,
    pub(super) ready_tick: u64,
    /// Requests completed since the liveness phase began.
    pub(super) completed_late: u64,
    /// The idempotent producer's epoch, and the request its sequence 0 went with.
    pub(super) epoch: i16,
    pub(super) epoch_first_request: u64,
    /// An operator's configuration changes still to make (0 for every other client).
    pub(super) moves_left: u32,
    /// The group's members as of the operator's last committed change.
    pub(super) members: Membership,
    pub(super) phase: MovePhase,
}

impl Client {
    /// Client `id` of `group`, idle, about to send its first request to node 0.
    pub(super) fn new(id: u64, group: u64) -> Client {
        Client {
            id,
            group,
            next_request: 1,
            pending: None,
            target: 0,
            ready_tick: 0,
            completed_late: 0,
            epoch: 0,
            epoch_first_request: 1,
            moves_left: 0,
            members: Membership::default(),
            phase: MovePhase::Switch,
        }
    }

    /// Makes this client its group's operator: `moves` changes from `members` on.
    pub(super) fn operate(&mut self, moves: u32, members: Membership) {
        self.moves_left = moves;
        self.members = members;
    }

    /// Its change to `next` committed: on to the next phase.
    fn finish_move(&mut self, next: Membership) {
        if next == self.members {
            return;
        }
        self.phase = match self.phase {
            MovePhase::Switch => {
                let demoted = (self.members.voters & !next.voters).trailing_zeros() as u8;
                MovePhase::Drop(demoted)
            }
            MovePhase::Drop(member) => MovePhase::Add(member),
            MovePhase::Add(_) => MovePhase::Switch,
        };
        self.members = next;
        self.moves_left -= 1;
    }
}

/// A client's outstanding request: the very batch every resend carries.
#[derive(Clone, Debug)]
pub(super) struct Pending {
    request: u64,
    body: Bytes,
    resend_tick: u64,
    /// Sent to `target` with no answer yet: the next send is a retry after a timeout, and goes
    /// to another node.
    unanswered: bool,
    /// The configuration change the request makes, if it is one.
    reconfigure: Option<Membership>,
}

/// One acknowledged write: where the client was told it is.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ack {
    pub(super) group: u64,
    pub(super) op: u64,
    pub(super) base_offset: u64,
    pub(super) client: u64,
    pub(super) request: u64,
}
