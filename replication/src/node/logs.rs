//! The groups' logs as a driver needs them: what it reads (consumer reads, its own state
//! rebuilt from a log, figures as [`LogStats`]), the one thing it sets on them (the retention
//! floor its snapshots allow) and retention enforced on its clock, each named for what the
//! driver needs.
//!
//! The engine's shard stays the node's: nothing here hands a driver a log to change, and
//! nothing here feeds a replica.

use shoal_engine::cache::CacheCounters;
use shoal_engine::partition::{DiskRead, DiskReadDone, PartitionLog, ReadPlan};
use shoal_engine::ring::StoredPrepare;
use shoal_engine::shard::{ShardConfig, ShardCounters};
use shoal_engine::storage::Storage;
use shoal_engine::{Error as EngineError, Result as EngineResult};

use super::config::{Clock, Transport};
use super::state::Node;

/// A group's log in figures, as a driver reports it (status, metrics) and decides on it
/// (snapshots, retention, recovery): never the log itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// The offset of the oldest retained message.
    pub first_offset: u64,
    /// The offset the next message will get (the log end offset).
    pub next_offset: u64,
    /// The last appended op (0 when empty).
    pub head_op: u64,
    /// Bytes of valid records in all segments.
    pub size_bytes: u64,
    /// Segment files.
    pub segments: usize,
    /// The group's size-based retention (0: keep everything).
    pub retention_bytes: u64,
    /// The group's age-based retention (0: keep everything).
    pub retention_ms: u64,
}

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// The engine settings the shard was opened with (its limits: groups, record size).
    pub fn shard_config(&self) -> &ShardConfig {
        self.store.config()
    }

    /// The engine's counters.
    pub fn engine_counters(&self) -> ShardCounters {
        self.store.counters()
    }

    /// Bytes the engine's prepare rings hold.
    pub fn ring_bytes(&self) -> usize {
        self.store.ring_bytes()
    }

    /// Ready disk space the engine's groups hold ahead of their data.
    pub fn ready_space_bytes(&self) -> u64 {
        self.store.ready_space_bytes()
    }

    /// Bytes the shard's batch cache holds, and what it did since open.
    pub fn batch_cache(&self) -> (usize, CacheCounters) {
        self.store.batch_cache()
    }

    /// Chunks the engine has allocated.
    pub fn chunks_allocated(&self) -> usize {
        self.store.chunks_allocated()
    }

    /// Whether the engine holds a log for `group` (a group whose creation failed has none).
    pub fn has_log(&self, group: u64) -> bool {
        self.store.group(group).is_some()
    }

    /// `group`'s log in figures; None when the engine holds no log for it.
    pub fn log_stats(&self, group: u64) -> Option<LogStats> {
        self.store.group(group).map(|log| LogStats {
            first_offset: log.first_offset(),
            next_offset: log.next_offset(),
            head_op: log.head_op(),
            size_bytes: log.size_bytes(),
            segments: log.segment_count(),
            retention_bytes: log.config().retention_bytes,
            retention_ms: log.config().retention_ms,
        })
    }

    /// The offset of the oldest message `group`'s log retains (what a fetch reply reports and
    /// where a fetch from the first offset starts), without the rest of [`Node::log_stats`]:
    /// every fetch asks.
    pub fn log_first_offset(&self, group: u64) -> Option<u64> {
        self.store.group(group).map(|log| log.first_offset())
    }

    /// Why `group`'s log refuses work (corruption or an I/O failure it met), if it does.
    pub fn log_fault(&self, group: u64) -> Option<&str> {
        self.store.group(group).and_then(|log| log.faulty_reason())
    }

    /// Changes `group`'s retention bounds (see `ShardStore::set_retention`).
    pub fn set_retention(
        &mut self,
        group: u64,
        retention_bytes: u64,
        retention_ms: u64,
    ) -> EngineResult<()> {
        self.store.set_retention(group, retention_bytes, retention_ms)
    }

    /// Keeps retention from deleting any segment of `group` that holds an offset at or above
    /// `offset`: the driver's state derived from the log (consumer offsets) can be rebuilt only
    /// from its last snapshot on. Nothing happens when the engine holds no log for `group`,
    /// nor for a stopped group, whose log retention keeps whole (see [`Node::keep_stopped_log`]).
    pub fn set_retention_floor(&mut self, group: u64, offset: u64) {
        if self.group_failure(group).is_some() {
            return;
        }
        if let Some(log) = self.store.group_mut(group) {
            log.set_retention_floor(offset);
        }
    }

    /// A stopped group's log stays as it is: retention deletes none of it (DESIGN.md §6, a
    /// partition with damage refuses service and is never truncated away; what it still holds
    /// is what an operator or a repair has to work with).
    pub(super) fn keep_stopped_log(&mut self, group: u64) {
        if let Some(log) = self.store.group_mut(group) {
            log.set_retention_floor(0);
        }
    }

    /// Deletes the sealed segments beyond each group's retention (`now_ms` from the driver's
    /// clock), once the flush cycles in flight have finished. Returns the segments deleted.
    pub async fn enforce_retention(&mut self, now_ms: i64) -> EngineResult<usize> {
        self.finish_flushes_in_flight().await;
        self.store.enforce_retention(now_ms).await
    }

    /// The files of segments retention retired since the last call: the driver removes them
    /// off its loop ([`shoal_engine::shard::remove_retired_files`]).
    pub fn take_retired_files(&mut self) -> Vec<std::path::PathBuf> {
        self.store.take_retired_files()
    }

    /// Reads `group`'s prepare with this op (plan, run, finish in one call).
    pub async fn read_op(&mut self, group: u64, op: u64) -> EngineResult<Option<StoredPrepare>> {
        self.log_mut(group)?.read_op(op).await
    }

    /// Reads `group`'s prepares containing `offset` and after it, up to about `bytes_max` bytes,
    /// for a replay that walks the log once: nothing enters the batch cache (see
    /// [`PartitionLog::replay_offset`](shoal_engine::partition::PartitionLog::replay_offset)).
    pub async fn replay_offset(
        &mut self,
        group: u64,
        offset: u64,
        bytes_max: usize,
    ) -> EngineResult<Vec<StoredPrepare>> {
        self.log_mut(group)?.replay_offset(offset, bytes_max).await
    }

    /// Plans a read of `group`'s prepares containing `offset` and after it: done from memory,
    /// or a disk read the driver runs off its loop and hands to [`Node::finish_read`].
    pub fn plan_read_offset(
        &self,
        group: u64,
        offset: u64,
        bytes_max: usize,
    ) -> EngineResult<ReadPlan<S>> {
        self.log(group)?.plan_read_offset(offset, bytes_max)
    }

    /// Plans finding `group`'s first prepare appended at or after `time_ms` (see
    /// [`Node::plan_read_offset`]).
    pub fn plan_read_time(&self, group: u64, time_ms: i64) -> EngineResult<ReadPlan<S>> {
        self.log(group)?.plan_read_time(time_ms)
    }

    /// Completes a disk read of `group` that a plan started (damage it met stops the log).
    pub fn finish_read(
        &mut self,
        group: u64,
        done: DiskReadDone,
    ) -> EngineResult<Vec<StoredPrepare>> {
        self.log_mut(group)?.finish_read(done)
    }

    /// Plans read-ahead for a consumer of `group` that reads from `offset` next (see
    /// `PartitionLog::plan_read_ahead`): disk reads the driver runs off its loop and hands to
    /// [`Node::finish_read_ahead`]. None when the group is not here.
    pub fn plan_read_ahead(&mut self, group: u64, offset: u64) -> Vec<DiskRead<S>> {
        self.log_mut(group).map_or_else(|_| Vec::new(), |log| log.plan_read_ahead(offset))
    }

    /// Completes a read-ahead of `group`: what it read goes to the shard's batch cache.
    pub fn finish_read_ahead(&mut self, group: u64, done: DiskReadDone) {
        if let Ok(log) = self.log_mut(group) {
            log.finish_read_ahead(done);
        }
    }

    /// `group`'s log, for the reads above; callers that treat a missing log apart ask
    /// [`Node::has_log`] first.
    fn log(&self, group: u64) -> EngineResult<&PartitionLog<S>> {
        let missing = || EngineError::Invalid(format!("group {group} has no log on this shard"));
        self.store.group(group).ok_or_else(missing)
    }

    /// `group`'s log, for the reads above that change it (see [`Node::log`]).
    fn log_mut(&mut self, group: u64) -> EngineResult<&mut PartitionLog<S>> {
        let missing = || EngineError::Invalid(format!("group {group} has no log on this shard"));
        self.store.group_mut(group).ok_or_else(missing)
    }
}
