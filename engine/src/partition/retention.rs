//! Retention: whole settled segments beyond the size or age bounds are deleted (or recycled into
//! the spare segment file), oldest first.
//!
//! It must never remove the active segment, one at or after the checkpoint, one the owner's
//! state or an uncommitted op still needs, nor leave a gap: each removal is durable before the
//! next.

use std::path::Path;
use std::rc::Rc;

use super::log::{PartitionLog, SegmentMeta};
use crate::error::{Error, Result};
use crate::segment::{SPARE_NAME, index_name, log_name, retired_name};
use crate::storage::{BLOCK_SIZE_BYTES, Storage};

/// Retired segment files a shard keeps for its driver to remove at most; past it, retention
/// removes them itself.
pub const RETIRED_FILES_MAX: usize = 64;

impl<S: Storage> PartitionLog<S> {
    /// Deletes whole sealed, settled segments beyond the retention bounds (total size, age of
    /// the newest record), oldest first; never the active segment nor one at or after the
    /// checkpoint. Returns how many it deleted. Call it with no flush job in flight.
    pub async fn enforce_retention(&mut self, now_ms: i64) -> Result<usize> {
        self.check_serving()?;
        let mut total = self.size_bytes();
        let mut delete = 0;
        for (index, segment) in self.segments.iter().enumerate() {
            // A sealed segment ends where the next begins.
            let end_offset = self.segments.get(index + 1).map_or(u64::MAX, |next| next.base_offset);
            let deletable = segment.sealed
                && segment.settled
                && segment.base_offset < self.checkpoint.segment_base_offset
                && end_offset <= self.retention_floor_offset
                // Strictly below: the op that begins the next segment, the log's first once
                // this one goes, is committed too, so a restart may take it as committed.
                && end_offset < self.committed_end_offset;
            let by_size = self.config.retention_bytes > 0 && total > self.config.retention_bytes;
            // A retention time past i64 milliseconds keeps everything (a cast would wrap it
            // negative, an age every segment has).
            let retention_ms = i64::try_from(self.config.retention_ms).unwrap_or(i64::MAX);
            let by_age =
                retention_ms > 0 && segment.last_append_ms < now_ms.saturating_sub(retention_ms);
            if !deletable || !(by_size || by_age) {
                break;
            }
            total -= segment.end_bytes;
            delete += 1;
        }
        if delete == 0 {
            return Ok(0);
        }
        let removed: Vec<SegmentMeta> = self.segments.drain(..delete).collect();
        // Oldest first, each removal durable before the next: a crash leaves the log a suffix
        // of itself, never a gap between segments.
        for segment in &removed {
            let result = if self.may_recycle(segment) {
                self.recycle_segment(segment).await
            } else {
                self.retire_segment(segment.base_offset).await
            };
            if let Err(error) = result {
                return Err(self.fail(error));
            }
            self.account_ready();
            if let Err(error) = self.storage.sync_dir(&self.dir).await {
                return Err(self.fail(Error::io("syncing group dir after retention", error)));
            }
        }
        Ok(delete)
    }

    /// Whether `segment`, which retention retires, may become the spare segment file:
    /// recycling is on, the shard's ready-space budget has room for it, no job is making or
    /// taking a spare, no disk read is in flight, and any spare there is has fewer blocks
    /// written. The rename replaces such a spare, even one with as much space reserved: a
    /// fresh spare's space is only reserved, and a sync into written blocks costs far less
    /// than one that converts reserved ones. (A log whose segments are no larger than its step
    /// ahead reserves its spare right after each roll, before retention retires the segment
    /// that could take its place: comparing reserved space, it never recycled.)
    fn may_recycle(&self, segment: &SegmentMeta) -> bool {
        let recycled = self.ready_in_file_bytes(segment.end_bytes);
        let spare_ready = self.spare_ready_end_bytes.unwrap_or(0);
        self.shared.recycle_segments
            && self.spare_written_end_bytes < recycled
            // A recycled segment is ready space like any other: within the shard's budget,
            // which the spare it replaces gives its space back to.
            && recycled.saturating_sub(spare_ready) <= self.shared.ready_budget.available_bytes()
            && !self.spare_in_flight
            && !self.spare_claimed
            && Rc::strong_count(&self.disk_reads) == 1
    }

    /// The space a spare file holding `bytes` has ready: its whole blocks, within a segment.
    pub(super) fn ready_in_file_bytes(&self, bytes: u64) -> u64 {
        let block = BLOCK_SIZE_BYTES as u64;
        (bytes - bytes % block).min(self.segment_limit_bytes())
    }

    /// Makes a retired segment's file the spare segment file (its index goes): its blocks are
    /// already written, so the segment that takes it overwrites them, which costs a sync far
    /// less than filling fresh space does (DESIGN.md §3). Its old records stay until
    /// overwritten; writes keep zeros past the data
    /// ([`written_extent_end`](crate::chunk::written_extent_end)) and recovery zeroes whatever
    /// lies past the chain's end, so they are never taken for data.
    async fn recycle_segment(&mut self, segment: &SegmentMeta) -> Result<()> {
        let from = self.dir.join(log_name(segment.base_offset));
        let to = self.dir.join(SPARE_NAME);
        self.storage
            .rename(&from, &to)
            .await
            .map_err(|e| Error::io(format!("recycling {}", from.display()), e))?;
        self.remove_if_present(&self.dir.join(index_name(segment.base_offset))).await?;
        // Only whole blocks of what the segment held count: its file may be longer. Those
        // blocks are written, not only reserved.
        let held_bytes = self.ready_in_file_bytes(segment.end_bytes);
        self.spare_ready_end_bytes = Some(held_bytes);
        self.spare_written_end_bytes = held_bytes;
        self.recycled_segments += 1;
        Ok(())
    }

    /// Takes a segment retention deletes out of the log: its index goes and its file is
    /// renamed to its retired name, for the shard's driver to remove off its loop (removing a
    /// 1 GiB file frees its blocks for some 0.2 s, which stalled every partition of the shard;
    /// docs/benchmarks.md, "Retired segments removed off the loop"). Past
    /// [`RETIRED_FILES_MAX`] waiting, a driver that does not take them, the file is removed
    /// here. Either way the directory sync that follows makes the log a suffix of itself.
    async fn retire_segment(&self, base_offset: u64) -> Result<()> {
        if self.shared.retired_files.borrow().len() >= RETIRED_FILES_MAX {
            return self.remove_segment_files(base_offset).await;
        }
        let from = self.dir.join(log_name(base_offset));
        let to = self.dir.join(retired_name(base_offset));
        match self.storage.rename(&from, &to).await {
            Ok(()) => self.shared.retired_files.borrow_mut().push(to),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(Error::io(format!("retiring {}", from.display()), error)),
        }
        self.remove_if_present(&self.dir.join(index_name(base_offset))).await
    }

    pub(super) async fn remove_segment_files(&self, base_offset: u64) -> Result<()> {
        for name in [log_name(base_offset), index_name(base_offset)] {
            self.remove_if_present(&self.dir.join(name)).await?;
        }
        Ok(())
    }

    /// Removes a file of the group if it exists (durable with the caller's directory sync).
    async fn remove_if_present(&self, path: &Path) -> Result<()> {
        if self.storage.exists(path).await.map_err(|e| Error::io("probing a segment", e))? {
            self.storage
                .remove_file(path)
                .await
                .map_err(|e| Error::io(format!("removing {}", path.display()), e))?;
        }
        Ok(())
    }
}
