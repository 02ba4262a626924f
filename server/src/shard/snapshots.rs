//! The state snapshots a shard saves: each partition group's consumer offsets and producer
//! table, saved when they changed, when the log moved by the snapshot interval or when retention
//! waits for one (and every changed one at shutdown), and shard 0's metadata state every
//! `snapshot_interval_ops` ops. A spawned task writes each; the loop takes the result in.
//!
//! A partition's retention floor moves only once a save covering it succeeded: retention never
//! deletes what restart would need to replay. One save per group runs at a time.

use std::rc::Rc;

use shoal_engine::shard::{group_dir, shard_dir};
use shoal_engine::state::{self, GroupState};

use super::state::ShardState;
use super::work::Work;
use crate::metadata::METADATA_GROUP;

/// A partition group's state snapshot is saved once its log has grown (or shrunk) by this
/// much since the last one, or its offsets changed: restart replays at most about this much of
/// each log to rebuild its consumer offsets.
const STATE_SNAPSHOT_INTERVAL_BYTES: u64 = 16 << 20;

/// A group state snapshot saved (or not) by a spawned task.
pub(super) struct StateSaved {
    group: u64,
    /// The op it covers.
    op: u64,
    end_offset: u64,
    size_bytes: u64,
    result: shoal_engine::Result<()>,
}

impl ShardState {
    /// Starts a snapshot save (a spawned task) for every partition group whose offsets changed
    /// or whose log moved by the snapshot interval since its last one, one save per group at a
    /// time. The snapshot is the table as of the committed end, which the loop keeps in step.
    pub(super) fn save_states(&mut self) {
        let shard_dir = shard_dir(&self.config.data_dir, self.index);
        for (&group, offsets) in self.offsets.iter_mut() {
            let Some(log) = self.node.log_stats(group) else { continue };
            let size_bytes = log.size_bytes;
            let moved = size_bytes.abs_diff(offsets.snapshot_size_bytes);
            let end_offset = self.committed_end.get(&group).copied().unwrap_or(0);
            // Retention deletes nothing the newest snapshot does not cover: a log with sealed
            // segments past it and a retention bound needs a new one.
            let over_bound = log.retention_bytes > 0 && size_bytes > log.retention_bytes;
            let retention_held = (over_bound || log.retention_ms > 0)
                && log.segments > 1
                && end_offset > offsets.snapshot_end;
            if offsets.saving
                || !(offsets.dirty || retention_held || moved >= STATE_SNAPSHOT_INTERVAL_BYTES)
            {
                continue;
            }
            let Some(replica) = self.node.replica(group) else { continue };
            let (op, producers) = (replica.commit(), replica.producers());
            let saved =
                GroupState { op, end_offset, bytes: offsets.encode_snapshot(&producers.encode()) };
            offsets.producers_saved_op = producers.op();
            offsets.saving = true;
            offsets.dirty = false;
            let dir = group_dir(&shard_dir, group);
            let done = Rc::clone(&self.states_saved);
            let wake = self.mesh[self.index as usize].clone();
            let storage = self.storage.clone();
            monoio::spawn(async move {
                let result = state::save(&storage, &dir, &saved).await;
                done.borrow_mut().push(StateSaved { group, op, end_offset, size_bytes, result });
                let _ = wake.try_send(Work::Wake);
            });
        }
    }

    /// Takes in finished snapshot saves: retention may now delete what each one covers.
    pub(super) fn finish_state_saves(&mut self) {
        let saved: Vec<StateSaved> = std::mem::take(&mut *self.states_saved.borrow_mut());
        for StateSaved { group, op, end_offset, size_bytes, result } in saved {
            if group == METADATA_GROUP {
                self.finish_metadata_snapshot(op, end_offset, result);
                continue;
            }
            let Some(offsets) = self.offsets.get_mut(&group) else { continue };
            offsets.saving = false;
            match result {
                Ok(()) => {
                    offsets.snapshot_end = end_offset;
                    offsets.snapshot_size_bytes = size_bytes;
                    self.node.set_retention_floor(group, end_offset);
                }
                Err(error) => {
                    offsets.dirty = true;
                    tracing::error!(shard = self.index, group, %error, "offsets snapshot failed");
                }
            }
        }
    }

    /// At shutdown: saves every changed table and waits for it, so the next start replays
    /// nothing.
    pub(super) async fn save_states_now(&mut self) {
        let shard_dir = shard_dir(&self.config.data_dir, self.index);
        let storage = self.storage.clone();
        for (&group, offsets) in self.offsets.iter_mut() {
            let Some(replica) = self.node.replica(group) else { continue };
            let producers = replica.producers();
            // A save in flight owns the group's new-snapshot file; what it misses is replayed.
            let producers_moved = producers.op() > offsets.producers_saved_op;
            if !(offsets.dirty || producers_moved) || offsets.saving {
                continue;
            }
            let end_offset = self.committed_end.get(&group).copied().unwrap_or(0);
            let op = replica.commit();
            let saved =
                GroupState { op, end_offset, bytes: offsets.encode_snapshot(&producers.encode()) };
            if let Err(error) = state::save(&storage, &group_dir(&shard_dir, group), &saved).await {
                tracing::error!(shard = self.index, group, %error, "offsets snapshot failed");
            }
        }
    }

    /// Starts a save of the metadata state (a spawned task) once `metadata.snapshot_interval_ops`
    /// ops were applied since the newest snapshot, one save at a time. The state is encoded
    /// here, as of `end_offset` (the offset after the last applied op), so the task needs
    /// nothing of the loop's; one that comes due while a save runs starts when it finishes.
    pub(super) fn save_metadata_snapshot(&mut self, end_offset: u64) {
        let interval = self.config.metadata.snapshot_interval_ops;
        let Some(metadata) = self.metadata.as_mut() else { return };
        let op = metadata.state.catalog.applied_op;
        let due = metadata.snapshot_due || op.saturating_sub(metadata.snapshot_op) >= interval;
        if !due || op == 0 {
            return;
        }
        if metadata.snapshot_saving {
            metadata.snapshot_deferred_end = Some(end_offset);
            return;
        }
        metadata.snapshot_saving = true;
        metadata.snapshot_due = false;
        let saved = GroupState { op, end_offset, bytes: metadata.state.encode_snapshot() };
        let dir = group_dir(&shard_dir(&self.config.data_dir, self.index), METADATA_GROUP);
        let done = Rc::clone(&self.states_saved);
        let wake = self.mesh[self.index as usize].clone();
        let storage = self.storage.clone();
        monoio::spawn(async move {
            let result = state::save(&storage, &dir, &saved).await;
            let size_bytes = saved.bytes.len() as u64;
            let group = METADATA_GROUP;
            done.borrow_mut().push(StateSaved { group, op, end_offset, size_bytes, result });
            let _ = wake.try_send(Work::Wake);
        });
    }

    /// Takes in a finished metadata snapshot save: the metadata log's retention may delete what
    /// it covers (`[metadata] retention_bytes`), and the replay at start-up begins after it.
    fn finish_metadata_snapshot(
        &mut self,
        op: u64,
        end_offset: u64,
        result: shoal_engine::Result<()>,
    ) {
        let Some(metadata) = self.metadata.as_mut() else { return };
        metadata.snapshot_saving = false;
        match result {
            Ok(()) => {
                metadata.snapshot_op = op;
                self.node.set_retention_floor(METADATA_GROUP, end_offset);
                self.metrics.metadata_snapshot_saved(op);
                tracing::debug!(op, "metadata snapshot saved");
            }
            Err(error) => {
                // Tried again once the interval is up again; the log still holds everything.
                metadata.snapshot_op = op;
                tracing::error!(op, %error, "metadata snapshot failed");
            }
        }
        if let Some(end_offset) = metadata.snapshot_deferred_end.take() {
            self.save_metadata_snapshot(end_offset);
        }
    }
}
