//! Consumer offsets and the log start in the partition logs: a commit or a new log start
//! (DeleteRecords) is proposed as a one-record control batch in the partition's own log (and so
//! shares its durability and replication), and each partition's table
//! (`crate::offsets::PartitionOffsets`) is rebuilt at start-up from its state snapshot and the
//! committed log past it.
//!
//! A stored offset is applied to the table only once its commit is committed — by the primary
//! when it answers the write (`writes`), and by every replica as the commit reaches it
//! ([`ShardState::apply_committed_offset`]), so a backup that takes over answers at once —
//! except under the `canary-offsets-unlogged` canary, which the offsets restart test must catch.

use bytes::BytesMut;
use shoal_engine::shard::{group_dir, shard_dir};
use shoal_engine::state;
use shoal_proto::checksum;
use shoal_proto::protocol::ErrorCode;
use shoal_proto::protocol::consumer::{LogStartRecord, OffsetCommitRecord};
use shoal_proto::wire::{ClientRequest, Prepare};
use shoal_replication::Request;

use super::state::ShardState;
use super::thread::now_ms;
use super::transfer::recovery_states;
use super::work::{Outcome, ReplySender};
use super::writes::{PendingWrite, WriteKind};
use crate::metadata::METADATA_GROUP;
use crate::offsets::PartitionOffsets;

/// Consumers whose offsets one partition stores at most.
pub const CONSUMERS_PER_PARTITION_MAX: usize = 65_536;

impl ShardState {
    /// Rebuilds every partition group's consumer offsets: the newer of its snapshot and the
    /// state a transfer installed its log from, then the committed log past it (without a
    /// usable snapshot, the whole log: the node layer stopped every group whose log retention
    /// shortened past what only the snapshot held, see `SavedProducers`). Retention then keeps
    /// whatever the snapshot does not cover.
    pub(super) async fn recover_offsets(&mut self) {
        let shard_dir = shard_dir(&self.config.data_dir, self.index);
        let storage = self.storage.clone();
        for group in self.node.group_ids() {
            if group == METADATA_GROUP || self.node.group_failure(group).is_some() {
                continue;
            }
            let committed_end = self.committed_end.get(&group).copied().unwrap_or(0);
            let dir = group_dir(&shard_dir, group);
            let mut offsets = PartitionOffsets::default();
            let mut replay_from = 0;
            let saved = state::load(&storage, &dir).await.unwrap_or_else(|error| {
                tracing::warn!(
                    shard = self.index,
                    group,
                    %error,
                    "offsets snapshot unusable; rebuilding offsets from the log"
                );
                None
            });
            for saved in recovery_states(&storage, &dir, saved).await {
                match PartitionOffsets::decode(&saved.bytes) {
                    Ok(table) => {
                        offsets = table;
                        offsets.snapshot_end = saved.end_offset;
                        replay_from = saved.end_offset;
                        break;
                    }
                    Err(why) => tracing::warn!(
                        shard = self.index,
                        group,
                        op = saved.op,
                        why,
                        "offsets state unreadable; trying an older one, or the log"
                    ),
                }
            }
            let Some(log) = self.node.log_stats(group) else { continue };
            offsets.snapshot_size_bytes = log.size_bytes;
            let mut offset = replay_from.max(log.first_offset);
            // Data may end anywhere before the replay: only what it reads is known.
            offsets.data_end = offset;
            let mut replayed = 0;
            'scan: while offset < committed_end {
                let prepares = match self.node.replay_offset(group, offset, 1 << 20).await {
                    Ok(prepares) if !prepares.is_empty() => prepares,
                    other => {
                        let result = format!("{other:?}");
                        tracing::error!(
                            shard = self.index,
                            group,
                            offset,
                            result,
                            "offsets replay stopped"
                        );
                        break;
                    }
                };
                for prepare in prepares {
                    if prepare.end_offset() > committed_end {
                        break 'scan;
                    }
                    if prepare.end_offset() <= offset {
                        continue;
                    }
                    offset = prepare.end_offset();
                    match offsets.apply_batch(&prepare.body()) {
                        Ok(true) => replayed += 1,
                        Ok(false) => offsets.data_committed(offset),
                        Err(error) => {
                            offsets.data_committed(offset);
                            tracing::error!(
                                shard = self.index,
                                group,
                                offset = prepare.base_offset(),
                                %error,
                                "an offset commit record does not decode; skipped"
                            );
                        }
                    }
                }
            }
            offsets.dirty = replayed > 0 || offsets.snapshot_end == 0;
            self.node.set_retention_floor(group, offsets.snapshot_end);
            self.offsets.insert(group, offsets);
        }
    }

    /// Applies a newly committed op of partition group `group` to its consumer offsets if it
    /// is an offset commit — on every replica, so a backup that becomes primary answers offset
    /// reads at once. Commit records are one-record batches, so only those are read back (from
    /// the prepare ring, mostly). The primary applied its own already when it answered the
    /// write (`writes`); applying the same record again, in the same order, changes nothing.
    pub(super) async fn apply_committed_offset(&mut self, group: u64, fields: &Prepare) {
        if self.node.group_failure(group).is_some() {
            return;
        }
        if fields.record_count != 1 {
            self.offsets.entry(group).or_default().data_committed(fields.end_offset());
            return;
        }
        let prepare = match self.node.read_op(group, fields.op).await {
            Ok(Some(prepare)) => prepare,
            other => {
                let result = format!("{other:?}");
                tracing::error!(
                    shard = self.index,
                    group,
                    op = fields.op,
                    result,
                    "committed op unreadable; its offset commit, if any, not applied"
                );
                self.offsets.entry(group).or_default().data_committed(fields.end_offset());
                return;
            }
        };
        let offsets = self.offsets.entry(group).or_default();
        let applied = offsets.apply_batch(&prepare.body());
        if applied != Ok(true) {
            offsets.data_committed(fields.end_offset());
        }
        if let Err(error) = applied {
            tracing::error!(
                shard = self.index,
                group,
                op = fields.op,
                %error,
                "an offset commit record does not decode; skipped"
            );
        }
    }

    /// Moves partition group `group`'s log start up to `offset` (`None`: the committed end):
    /// a one-record control batch in its log, answered with the new log start once committed.
    /// Only the primary does it (it reads the committed end); an offset past the committed end
    /// is refused (`InvalidArgument`), and one at or below the log start is answered at once.
    pub(super) fn delete_records(
        &mut self,
        group: u64,
        client: ClientRequest,
        offset: Option<u64>,
        reply: ReplySender,
    ) {
        if let Some(refusal) = self.read_refusal(group) {
            let _ = reply.send(refusal);
            return;
        }
        if let Some(busy) = self.writes_busy() {
            let _ = reply.send(busy);
            return;
        }
        let committed_end = self.committed_end.get(&group).copied().unwrap_or(0);
        let offset = offset.unwrap_or(committed_end);
        if offset > committed_end {
            let text = format!("offset {offset} is past the partition's end, {committed_end}");
            let _ = reply.send(Outcome::error(ErrorCode::InvalidArgument, text));
            return;
        }
        let log_start = self.offsets.get(&group).map_or(0, |o| o.log_start);
        if offset <= log_start {
            let _ = reply.send(Outcome::ok(log_start.to_le_bytes().to_vec()));
            return;
        }
        let now = now_ms();
        let batch = LogStartRecord { offset }.to_batch(now);
        let request = control_request(client, &batch, now);
        let kind = WriteKind::LogStart(offset);
        self.queue_write(group, request, PendingWrite { kind, reply });
    }

    /// Proposes an offset commit: a one-record control batch in the partition's own log, under
    /// the requesting client's header fields, answered as `kind` says once committed.
    pub(super) fn store_offset(
        &mut self,
        group: u64,
        client: ClientRequest,
        record: OffsetCommitRecord,
        kind: impl FnOnce(OffsetCommitRecord) -> WriteKind,
        reply: ReplySender,
    ) -> bool {
        if let Some(busy) = self.writes_busy() {
            let _ = reply.send(busy);
            return false;
        }
        let committed_end = self.committed_end.get(&group).copied().unwrap_or(0);
        let table = self.offsets.entry(group).or_default();
        if let Some(offset) = record.offset
            && !table.commit_needed(&record.consumer, offset, committed_end)
        {
            let _ = reply.send(match kind(record) {
                WriteKind::PollCommit { answer, .. } => answer,
                _ => Outcome::ok(Vec::new()),
            });
            return false;
        }
        if record.offset.is_some()
            && let Err(full) = table.check_room(&record.consumer, CONSUMERS_PER_PARTITION_MAX)
        {
            let _ = reply.send(Outcome::error(
                ErrorCode::LimitReached,
                format!(
                    "a partition stores the offsets of at most {} consumers",
                    full.consumers_max
                ),
            ));
            return false;
        }
        let now = now_ms();
        let request = control_request(client, &record.to_batch(now), now);
        let kind = kind(record);
        // Canary (DESIGN.md §7): a stored offset is answered and applied without entering the
        // log, so a restart loses it; the offsets restart test must catch it.
        #[cfg(feature = "canary-offsets-unlogged")]
        if let WriteKind::Offset(record) = &kind {
            table.apply(record.clone());
            let _ = reply.send(Outcome::ok(Vec::new()));
            return true;
        }
        self.queue_write(group, request, PendingWrite { kind, reply });
        true
    }
}

/// The write of a one-record control batch under `client`'s header fields.
pub(super) fn control_request(client: ClientRequest, batch: &[u8], now: i64) -> Request {
    Request {
        client: client.client,
        session: client.session,
        request: client.request,
        body_checksum: checksum::crc32c(batch),
        body: BytesMut::from(batch),
        record_count: 1,
        first_timestamp_ms: now,
        max_timestamp_ms: now,
        append_time_ms: now,
    }
}
