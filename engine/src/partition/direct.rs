//! The direct `persisted` path of one log (DESIGN.md §3; the form and the mark format are
//! `crate::direct`'s): whether a job may take it, the sync mark each direct job writes, and
//! what recovery learns from the marks it finds.
//!
//! It never decides which path a cycle takes (the shard does) and never syncs by itself: the
//! flush job it configures does.

use std::path::PathBuf;

use super::flush::SegmentWrite;
use super::log::{Location, PartitionLog, open_segment};
use super::recover::GroupRecovery;
use crate::direct::{SyncMark, TRAILER_BYTES};
use crate::error::{Corruption, Error, Result};
use crate::scan::Scanner;
use crate::segment::log_name;
use crate::storage::{BLOCK_SIZE_BYTES, OpenMode, Storage};
use crate::superblock::{Checkpoint, Durability};

/// The newest mark recovery found, and the file it is in.
pub(super) struct FoundMark {
    pub(super) mark: SyncMark,
    pub(super) path: PathBuf,
}

impl<S: Storage> PartitionLog<S> {
    /// Whether a direct job may start now: a healthy `persisted` log with no job in flight
    /// (its mark slots are written one job at a time) and an active segment whose sync-mark
    /// trailer exists or will be written when the job creates it. A segment made before its
    /// group had a trailer (a state transfer's) takes the journal until it rolls.
    pub fn can_flush_direct(&self) -> bool {
        self.config.durability == Durability::Persisted
            && self.faulty.is_none()
            && self.flushes_in_flight == 0
            && !self.storage_full
            && self.truncation.is_none()
            && self.segments.last().is_some_and(|active| {
                active.trailer_ready || !self.files.contains_key(&active.base_offset)
            })
    }

    /// Whether the newest direct sync is not announced by any mark yet (latent damage to it
    /// would look like a torn write): an idle mark job would fix that. The shard asks only
    /// when it goes idle.
    pub fn mark_due(&self) -> bool {
        self.synced.is_some_and(|(op, _)| op > self.mark_announced_op)
            && !self.has_unsubmitted()
            && self.can_flush_direct()
    }

    /// The sync mark a direct job writes beside its data: the newest op an earlier completed
    /// sync made durable, in the next slot of the trailer of the segment the job's data ends in.
    /// None when no earlier sync has anything to announce.
    pub(super) fn next_mark(&mut self, target: &Location) -> Option<SegmentWrite> {
        if cfg!(feature = "canary-no-sync-mark") {
            // Canary (DESIGN.md §7): direct syncs are never announced, so recovery takes
            // latent damage to a synced, acknowledged op for a torn tail and cuts it away.
            return None;
        }
        // A segment the job itself creates gets its trailer then, and may find no room for it:
        // its first job writes no mark (the previous segment's trailer still holds the last).
        if !self.segment(target.segment_base_offset).is_some_and(|meta| meta.trailer_ready) {
            return None;
        }
        let (op, checksum) = self.synced?;
        let mark = SyncMark { seq: self.mark_seq, group: self.group, op, checksum };
        self.mark_seq += 1;
        self.mark_pending_op = op;
        let position = SyncMark::position_bytes(self.segment_limit_bytes(), mark.seq);
        Some((target.segment_base_offset, position, mark.encode(self.shared.cluster)))
    }

    /// Applies a finished direct job: everything up to its target is synced, and the mark it
    /// wrote (if any) is what recovery will find announced.
    pub(super) fn finish_direct(&mut self, target: &Location, marked: bool) {
        if target.op > 0 {
            self.synced = Some((target.op, target.checksum));
        }
        if marked {
            self.mark_announced_op = self.mark_announced_op.max(self.mark_pending_op);
        }
    }

    /// Forgets marks above a cut: a truncation zeroed the trailers they were in.
    pub(super) fn forget_marks_above(&mut self, op: u64) {
        if self.synced.is_some_and(|(synced, _)| synced > op) {
            self.synced = None;
        }
        self.mark_announced_op = self.mark_announced_op.min(op);
    }

    /// Reads the sync-mark trailers of the segments `bases` (the torn window's), and returns
    /// the newest valid mark; adopts what it says as the log's synced and announced position,
    /// and continues the mark sequence after it.
    pub(super) async fn read_sync_marks(&mut self, bases: &[u64]) -> Result<Option<FoundMark>> {
        let limit = self.segment_limit_bytes();
        let mut newest: Option<FoundMark> = None;
        for &base in bases {
            let path = self.dir.join(log_name(base));
            let file = open_segment(&self.storage, &path, OpenMode::Read).await?;
            let mut scanner = Scanner::new(&file, TRAILER_BYTES as usize)
                .await
                .map_err(|e| Error::io("reading a sync-mark trailer", e))?;
            let trailer = scanner
                .bytes_at(limit, TRAILER_BYTES as usize)
                .await
                .map_err(|e| Error::io("reading a sync-mark trailer", e))?;
            for slot in trailer.chunks_exact(BLOCK_SIZE_BYTES) {
                let Some(mark) = SyncMark::decode(slot, self.shared.cluster, self.group) else {
                    continue;
                };
                self.mark_seq = self.mark_seq.max(mark.seq + 1);
                if newest.as_ref().is_none_or(|found| mark.op > found.mark.op) {
                    newest = Some(FoundMark { mark, path: path.clone() });
                }
            }
        }
        Ok(newest)
    }

    /// Recovery's use of the marks (DESIGN.md §3): the newest mark in the torn window's
    /// segments names the newest op a completed sync made durable, so a chain that ends at or
    /// before it (`next_op` is the op it ends before) lost a synced op: corruption, never a
    /// torn tail. A mark above an unfinished fence counts up to the fence only (the ops above
    /// it are dead; those below were synced with them).
    pub(super) async fn check_sync_marks(
        &mut self,
        bases: &[u64],
        checkpoint: Checkpoint,
        next_op: u64,
        report: &GroupRecovery,
    ) -> Result<()> {
        let Some(found) = self.read_sync_marks(bases).await? else { return Ok(()) };
        let fenced = self.fence.view != 0 && !self.fence.finished && found.mark.op > self.fence.op;
        let op = if fenced { self.fence.op } else { found.mark.op };
        if op <= checkpoint.op {
            return Ok(());
        }
        if op >= next_op {
            let (file, position_bytes, why) = report
                .torn_tail
                .clone()
                .unwrap_or_else(|| (found.path.clone(), 0, "the chain ends there".into()));
            return Err(Error::Corruption(Corruption {
                file,
                position_bytes,
                offset: None,
                op: Some(next_op),
                reason: format!(
                    "op {next_op} was synced (the sync mark in {} names op {op}) but is gone: {why}",
                    found.path.display()
                ),
            }));
        }
        if !fenced {
            self.synced = Some((found.mark.op, found.mark.checksum));
        }
        self.mark_announced_op = op;
        Ok(())
    }
}
