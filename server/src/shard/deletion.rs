//! Deleting the partition groups a node will never need again (DESIGN.md §8): a deleted
//! topic's, and a replica a move removed once the move is done. The files go (the engine's
//! `delete_groups`), and so does everything the shard kept for the group; whatever waited on it
//! is answered.
//!
//! It deletes only on committed facts, so a catalog behind the node's groups (a restart that
//! replays its metadata log) never deletes a group a later catalog places here:
//! - a group id below the catalog's `next_group` that no topic places belonged to a deleted
//!   topic (ids are never reused); a newer group is above the `next_group` of an older catalog;
//! - a replica is deleted only once its own group's log removed it (`Status::Removed`, an epoch
//!   entered without it) *and* the catalog no longer places the partition here. While a move
//!   is in progress, or cancelled back, the partition is placed here and the replica stays.
//!
//! A partition moved back later is joined afresh, as any new learner. It never deletes the
//! metadata group.

use std::collections::HashMap;

use shoal_proto::protocol::ErrorCode;

use super::state::ShardState;
use super::work::{Outcome, SendOutcome};
use crate::metadata::{METADATA_GROUP, PartitionPlace};

impl ShardState {
    /// Deletes every group of this shard the catalog lets go (see the module documentation),
    /// every retention interval. Cheap when there is nothing to do: no allocation unless the
    /// catalog changed or some replica was removed. A group with a state save in flight is left
    /// for the next sweep.
    pub(super) async fn delete_unneeded_groups(&mut self) {
        let removed = self.node.removed_group_ids();
        if self.catalog.applied_op == self.groups_swept_op && removed.is_empty() {
            return;
        }
        let node = self.config.cluster.node;
        let places: HashMap<u64, &PartitionPlace> =
            self.catalog.places().map(|place| (place.group, place)).collect();
        let mut deleted_topics = Vec::new();
        let mut removed_replicas = Vec::new();
        let mut deferred = false;
        for group in self.node.group_ids() {
            if group == METADATA_GROUP {
                continue;
            }
            let letting_go = match places.get(&group) {
                None => group < self.catalog.next_group,
                Some(place) => !place.is_held_by(node) && removed.contains(&group),
            };
            if !letting_go {
                continue;
            }
            if self.offsets.get(&group).is_some_and(|offsets| offsets.saving) {
                deferred = true;
            } else if places.contains_key(&group) {
                removed_replicas.push(group);
            } else {
                deleted_topics.push(group);
            }
        }
        drop(places);
        for &group in &deleted_topics {
            let gone =
                || Outcome::error(ErrorCode::TopicNotFound, "the partition's topic was deleted");
            self.answer_waiting_on(group, gone, gone);
        }
        for &group in &removed_replicas {
            // Its last configuration names the members it was removed by, and their primary.
            let Some(replica) = self.node.replica(group) else { continue };
            let view = replica.view();
            let primary = replica.config().primary_of(view);
            // A write its pipeline took may have committed in the configuration that removed
            // it: its outcome is unknown (an idempotent retry finds it there).
            let unknown = || {
                let text = "this replica was removed from the partition: the write's outcome is \
                            unknown, retry at its primary";
                Outcome::error(ErrorCode::TransientNotCommitted, text)
            };
            self.answer_waiting_on(group, unknown, || Outcome::not_primary(view, primary));
        }
        let doomed: Vec<u64> = deleted_topics.into_iter().chain(removed_replicas).collect();
        if !doomed.is_empty() {
            for &group in &doomed {
                self.forget_group(group);
            }
            // A deleted topic may have had 10,000 partitions: the count and the id range, not
            // every id.
            let (count, first, last) = (doomed.len(), doomed.iter().min(), doomed.iter().max());
            match self.node.delete_groups(&doomed).await {
                Ok(()) => tracing::info!(shard = self.index, count, first, last, "deleted groups"),
                Err(error) => {
                    tracing::error!(shard = self.index, count, first, last, %error, "deleting groups");
                }
            }
            self.groups_deleted +=
                doomed.iter().filter(|&&group| !self.node.has_log(group)).count() as u64;
        }
        if !deferred {
            self.groups_swept_op = self.catalog.applied_op;
        }
    }

    /// Answers whatever waits on `group`: the writes in its pipeline with `in_pipeline()`, the
    /// writes queued for it and its parked fetches with `refused()`.
    fn answer_waiting_on(
        &mut self,
        group: u64,
        in_pipeline: impl Fn() -> Outcome,
        refused: impl Fn() -> Outcome,
    ) {
        let keys: Vec<(u64, u64, u64)> =
            self.pending.keys().filter(|key| key.0 == group).copied().collect();
        for key in keys {
            if let Some(pending) = self.pending.remove(&key) {
                let _ = pending.reply.send(in_pipeline());
            }
        }
        if let Some(queue) = self.waiting.remove(&group) {
            self.waiting_count -= queue.len();
            for (_, pending) in queue {
                let _ = pending.reply.send(refused());
            }
        }
        for key in self.parked_by_group.remove(&group).unwrap_or_default() {
            self.parked.remove(key).to.reply().send_outcome(refused());
        }
    }

    /// Drops what the shard kept for a group it is deleting.
    fn forget_group(&mut self, group: u64) {
        self.committed_end.remove(&group);
        self.offsets.remove(&group);
        self.commits_in_flight.retain(|(g, _)| *g != group);
        self.mover.forget(group);
        #[cfg(feature = "canary-ack-on-receipt")]
        self.predicted_offsets.remove(&group);
    }
}
