//! The writes a shard's partition groups take — produce, a stored offset, a poll's auto-commit:
//! the queue in front of each group's pipeline (bounded by the shard's inbox size), the pending
//! table behind it, and each write's answer once its group replies.
//!
//! A write is answered only by its group's reply (committed, or why not), never on receipt —
//! except under the `canary-ack-on-receipt` canary, which exists to prove the crash test
//! catches exactly that.
//!
//! No write waits forever. One queued for a group that is not normal (a view change, a
//! recovery) or whose pipeline is full is answered `TransientNotAccepted` once it has waited
//! [`write_wait_ms_max`] (it never entered the log: the client may send it anywhere). One in a
//! pipeline is answered by its replica: committed, or `TransientNotCommitted` when a view change
//! fails the pipeline — which a primary that has heard from no quorum for a heartbeat timeout
//! starts by itself.

use shoal_proto::protocol::consumer::OffsetCommitRecord;
use shoal_proto::protocol::{ErrorCode, ProduceReply};
use shoal_proto::wire::Membership;
use shoal_replication::{ReplicaConfig, ReplyResult, Request, Status, TICK_MS};

use super::state::ShardState;
use super::thread::now_ms;
use super::work::{Outcome, ReplySender, refusal, result_error};
use crate::metadata::METADATA_GROUP;

/// How long a write may wait in front of a group's pipeline, in milliseconds: one heartbeat
/// timeout to notice a lost primary plus two view-change timeouts (a view change that times out
/// once, with its random spread, and the one after it). Derived from the replica's timers rather
/// than configured, so it follows them; by then a view that can start has started, and a group
/// still without one has no quorum.
pub(super) fn write_wait_ms_max(config: &ReplicaConfig) -> i64 {
    let ticks = config.heartbeat_timeout_ticks + 2 * config.view_change_timeout_ticks;
    (ticks * TICK_MS) as i64
}

/// Whether accepted writes go to their groups at once (always, except under the
/// `canary-ack-on-receipt` canary, which holds them until the next tick).
pub(super) const SUBMIT_AT_ONCE: bool = !cfg!(feature = "canary-ack-on-receipt");

/// A write accepted by this shard, waiting for its reply.
pub(super) struct PendingWrite {
    pub(super) kind: WriteKind,
    pub(super) reply: ReplySender,
}

/// What a write is, for its answer.
pub(super) enum WriteKind {
    Produce {
        partition: u32,
        record_count: u32,
    },
    /// A stored offset: answered empty once committed.
    Offset(OffsetCommitRecord),
    /// A new log start: answered with the log start once committed.
    LogStart(u64),
    /// A poll's auto-commit: the poll's answer goes out once the commit is committed.
    PollCommit {
        record: OffsetCommitRecord,
        answer: Outcome,
    },
    /// A move's configuration change (`moves`): nobody waits for it, but its answer lets the
    /// move's next step follow.
    Reconfigure(Membership),
}

impl ShardState {
    /// Canary (DESIGN.md §7): acknowledges a write on receipt with the offset it will get,
    /// before it is in the log, let alone durable; the writes themselves wait for the next tick.
    /// The kill -9 test must catch it.
    #[cfg(feature = "canary-ack-on-receipt")]
    pub(super) fn ack_on_receipt(
        &mut self,
        group: u64,
        partition: u32,
        record_count: u32,
        reply: ReplySender,
    ) -> ReplySender {
        let stored = self.node.log_stats(group).map_or(0, |log| log.next_offset);
        let next = self.predicted_offsets.entry(group).or_insert(stored);
        *next = (*next).max(stored);
        let base_offset = *next;
        *next += u64::from(record_count);
        let _ =
            reply.send(Outcome::produced(ProduceReply { partition, base_offset, record_count }));
        flume::bounded(1).0
    }

    /// The refusal of one more write when the shard's queue of waiting writes is full.
    pub(super) fn writes_busy(&self) -> Option<Outcome> {
        (self.waiting_count >= self.config.network.shard_inbox_max).then(|| {
            Outcome::error(
                ErrorCode::Busy,
                format!("shard {} has too many writes waiting", self.index),
            )
        })
    }

    /// Queues a write for its group's pipeline (submitted at once unless the canary holds it).
    pub(super) fn queue_write(&mut self, group: u64, request: Request, pending: PendingWrite) {
        self.waiting.entry(group).or_default().push_back((request, pending));
        self.waiting_count += 1;
        if SUBMIT_AT_ONCE {
            self.submit_waiting();
        }
    }

    /// Hands waiting writes to their groups while their pipelines have room.
    pub(super) fn submit_waiting(&mut self) {
        if self.waiting_count == 0 {
            return;
        }
        let mut refused = Vec::new();
        // Empty queues stay in the map (at most one per group), so a steady stream of writes
        // allocates no queue per request.
        for (&group, queue) in self.waiting.iter_mut() {
            while !queue.is_empty() {
                let room = match self.node.replica(group) {
                    Some(replica)
                        if self.node.group_failure(group).is_none()
                            && !self.node.is_storage_full(group) =>
                    {
                        replica.status() == Status::Normal
                            && replica.op() - replica.commit()
                                < replica.config().pipeline_prepares_max
                    }
                    // on_client_request answers a missing or failed group, or one whose storage
                    // is full, at once: such a write must not wait behind a pipeline that
                    // itself waits for disk space.
                    _ => true,
                };
                if !room {
                    break;
                }
                let Some((request, pending)) = queue.pop_front() else { break };
                self.waiting_count -= 1;
                let key = (group, request.client, request.request);
                if self.pending.contains_key(&key) {
                    let text =
                        format!("request {} of this client is already in flight", request.request);
                    refused.push((group, pending, Outcome::error(ErrorCode::InvalidRequest, text)));
                    continue;
                }
                let submitted = match pending.kind {
                    WriteKind::Reconfigure(next) => {
                        self.node.on_reconfigure_request(group, request, next)
                    }
                    _ => self.node.on_client_request(group, request),
                };
                match submitted {
                    Ok(()) => {
                        self.pending.insert(key, pending);
                    }
                    Err(why) => {
                        let outcome = refusal(&why);
                        refused.push((group, pending, outcome));
                    }
                }
            }
        }
        for (group, pending, outcome) in refused {
            if let WriteKind::PollCommit { record, .. } = &pending.kind {
                self.commits_in_flight.remove(&(group, record.consumer.clone()));
            }
            let _ = pending.reply.send(outcome);
        }
    }

    /// Answers `TransientNotAccepted` to every write that has waited longer than
    /// [`write_wait_ms_max`] for its group to take it (oldest first: a queue is in arrival
    /// order). Checked every tick; the time a write arrived is its request's `append_time_ms`.
    pub(super) fn expire_writes(&mut self) {
        if self.waiting_count == 0 {
            return;
        }
        let now = now_ms();
        let mut expired = Vec::new();
        for (&group, queue) in self.waiting.iter_mut() {
            let Some(replica) = self.node.replica(group) else { continue };
            let wait_ms_max = write_wait_ms_max(replica.config());
            while queue
                .front()
                .is_some_and(|(request, _)| now - request.append_time_ms > wait_ms_max)
            {
                let Some((_, pending)) = queue.pop_front() else { break };
                self.waiting_count -= 1;
                let text = format!(
                    "group {group} took no write for {wait_ms_max} ms (status {:?}, view {}): not \
                     accepted, retry",
                    replica.status(),
                    replica.view()
                );
                expired.push((group, pending, text));
            }
        }
        for (group, pending, text) in expired {
            if let WriteKind::PollCommit { record, .. } = &pending.kind {
                self.commits_in_flight.remove(&(group, record.consumer.clone()));
                self.wake_parked(group);
            }
            let _ = pending.reply.send(Outcome::error(ErrorCode::TransientNotAccepted, text));
        }
    }

    /// Answers every write its group replied to; a poll waiting for its auto-commit runs again.
    pub(super) fn answer_replies(&mut self) {
        let mut woken = Vec::new();
        for (group, reply) in self.node.take_replies() {
            // The metadata group's own configuration changes (the mover's) are pending writes;
            // its commands are the metadata state's.
            let key = (group, reply.client, reply.request);
            if group == METADATA_GROUP
                && !self.pending.contains_key(&key)
                && let Some(metadata) = &mut self.metadata
            {
                metadata.answer_uncommitted(&reply);
                continue;
            }
            let Some(pending) = self.pending.remove(&(group, reply.client, reply.request)) else {
                continue;
            };
            let committed = matches!(reply.result, ReplyResult::Committed { .. });
            if let WriteKind::Reconfigure(next) = pending.kind {
                tracing::info!(group, ?next, result = ?reply.result, "a move's change answered");
                self.change_answered(group);
                continue;
            }
            let outcome = match (pending.kind, reply.result) {
                (
                    WriteKind::Produce { partition, record_count },
                    ReplyResult::Committed { base_offset, .. },
                ) => Outcome::produced(ProduceReply { partition, base_offset, record_count }),
                (WriteKind::Offset(record), _) if committed => {
                    self.offsets.entry(group).or_default().apply(record);
                    Outcome::ok(Vec::new())
                }
                (WriteKind::LogStart(offset), _) if committed => {
                    let offsets = self.offsets.entry(group).or_default();
                    offsets.apply_log_start(offset);
                    Outcome::ok(offsets.log_start.to_le_bytes().to_vec())
                }
                (WriteKind::PollCommit { record, answer }, result) => {
                    self.commits_in_flight.remove(&(group, record.consumer.clone()));
                    // The consumer's next poll may have been waiting for this commit.
                    woken.push(group);
                    if committed {
                        self.offsets.entry(group).or_default().apply(record);
                        answer
                    } else {
                        result_error(&result)
                    }
                }
                (_, other) => result_error(&other),
            };
            let _ = pending.reply.send(outcome);
        }
        for group in woken {
            self.wake_parked(group);
        }
    }
}
