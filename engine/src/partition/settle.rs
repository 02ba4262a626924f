//! Settling and checkpoints: the checkpoint the written data allows, the rolled segments to make
//! final (synced, index written) before it moves past them, and adopting it once durable.
//!
//! The syncs run in the shard's checkpoint job, never in the flush cycle that acknowledges
//! appends; the log adopts a checkpoint only once the superblock holding it is durable.

use std::path::PathBuf;
use std::rc::Rc;

use bytes::Bytes;

use super::log::{PartitionLog, open_segment};
use crate::error::{Error, Result};
use crate::segment::{index_name, log_name};
use crate::storage::{OpenMode, Storage, StorageFile};
use crate::superblock::Checkpoint;

/// The I/O that makes a group's rolled segments final before a checkpoint moves past them:
/// each one's data synced, its index file written and synced, then the directory synced. It
/// runs in the shard's checkpoint job, so a roll never stalls the cycles that acknowledge
/// appends.
pub struct SettleJob<S: Storage> {
    storage: S,
    dir: PathBuf,
    group: u64,
    segments: Vec<RolledSegment<S::File>>,
}

/// A sealed segment waiting to be settled.
struct RolledSegment<F> {
    base_offset: u64,
    /// None when the segment was sealed before a restart and never opened since.
    file: Option<Rc<F>>,
    index_bytes: Bytes,
}

impl<S: Storage> SettleJob<S> {
    /// The group whose segments it settles.
    pub fn group(&self) -> u64 {
        self.group
    }

    /// The base offsets of the segments it settles.
    pub fn segment_base_offsets(&self) -> Vec<u64> {
        self.segments.iter().map(|segment| segment.base_offset).collect()
    }

    /// Runs the syncs and index writes; returns the number of segment syncs made.
    pub async fn run(&self) -> Result<u64> {
        for RolledSegment { base_offset, file, index_bytes } in &self.segments {
            let opened;
            let file = match file {
                Some(file) => file,
                None => {
                    let path = self.dir.join(log_name(*base_offset));
                    opened = open_segment(&self.storage, &path, OpenMode::ReadWrite).await?;
                    &opened
                }
            };
            file.sync_data().await.map_err(|e| Error::io("syncing a rolled segment", e))?;
            let path = self.dir.join(index_name(*base_offset));
            // An index is only an optimisation, checked when loaded and rebuilt when missing or
            // damaged, and written whole each time: running out of space for it is a clean
            // "storage full" that a later checkpoint retries, not a failure of the group.
            let index_file = self
                .storage
                .open(&path, OpenMode::CreateReadWrite, false)
                .await
                .map_err(|e| Error::preparing(format!("creating {}", path.display()), e))?;
            index_file
                .write_at(index_bytes.clone(), 0)
                .await
                .map_err(|e| Error::preparing("writing an index", e))?;
            index_file.sync_data().await.map_err(|e| Error::preparing("syncing an index", e))?;
        }
        self.storage.sync_dir(&self.dir).await.map_err(|e| Error::io("syncing group dir", e))?;
        Ok(self.segments.len() as u64)
    }
}

/// A checkpoint a group's written data allows.
pub struct CheckpointCandidate<S: Storage> {
    /// Where it lies.
    pub checkpoint: Checkpoint,
    /// The file to sync before recording it (None: that segment was synced when it rolled, or
    /// a direct job's sync already covers everything written).
    pub file: Option<Rc<S::File>>,
    /// Rolled segments below it to settle first (None: every one is settled).
    pub settle: Option<SettleJob<S>>,
    /// The group's append count it stands for.
    pub appended_bytes: u64,
}

impl<S: Storage> PartitionLog<S> {
    /// Whether the written data allows a checkpoint past the durable one.
    pub fn has_checkpoint_candidate(&self) -> bool {
        self.faulty.is_none() && self.written.op > self.checkpoint.op
    }

    /// The checkpoint the written data allows, when it is past the durable one: the location,
    /// the file to sync before recording it (None when that segment was already synced when it
    /// rolled, or when a direct job synced through the written op: its sync covered every file
    /// with written data, `unsynced_segments` included), the rolled segments below it to
    /// settle, and the append count it stands for.
    pub fn checkpoint_candidate(&self) -> Option<CheckpointCandidate<S>> {
        if !self.has_checkpoint_candidate() {
            return None;
        }
        let written_base = self.written.segment_base_offset;
        let segments: Vec<_> = self
            .segments
            .iter()
            .filter(|segment| {
                segment.sealed && !segment.settled && segment.base_offset < written_base
            })
            .map(|segment| RolledSegment {
                base_offset: segment.base_offset,
                file: self.files.get(&segment.base_offset).cloned(),
                index_bytes: Bytes::from(segment.index.encode(&segment.summary())),
            })
            .collect();
        let settle = (!segments.is_empty()).then(|| SettleJob {
            storage: self.storage.clone(),
            dir: self.dir.clone(),
            group: self.group,
            segments,
        });
        // A group on the direct path syncs every job: a checkpoint sync would repeat it, one more
        // device flush per checkpoint beside the appends' own.
        let synced = self.synced.is_some_and(|(op, _)| op >= self.written.op);
        Some(CheckpointCandidate {
            checkpoint: self.written.checkpoint(),
            file: if synced { None } else { self.files.get(&written_base).cloned() },
            settle,
            appended_bytes: self.written_appended_bytes,
        })
    }

    /// Applies a finished [`SettleJob`]: its segments are final and their files close.
    pub fn finish_settle(&mut self, segment_base_offsets: &[u64]) {
        for base in segment_base_offsets {
            if let Some(segment) =
                self.segments.iter_mut().find(|segment| segment.base_offset == *base)
            {
                assert!(segment.sealed, "only rolled segments settle");
                segment.settled = true;
            }
            self.files.remove(base);
        }
    }

    /// Adopts a checkpoint once the superblock holding it is durable; `appended_bytes` is what
    /// [`PartitionLog::checkpoint_candidate`] said it stands for.
    pub fn set_checkpoint(&mut self, checkpoint: Checkpoint, appended_bytes: u64) {
        if checkpoint.op > self.checkpoint.op {
            self.checkpoint_appended_bytes = appended_bytes;
            self.checkpoint = checkpoint;
        }
    }
}
