//! Truncation for a view change: every op above a cut goes, after a fence the superblock makes
//! durable first.
//!
//! Nothing on disk changes until the fence is durable; then whole segments above the cut are
//! removed and the tail at the cut is zeroed and synced, so the old ops can never validate
//! again.

use std::rc::Rc;

use super::log::{Location, PartitionLog, SegmentMeta, open_segment};
use crate::error::{Error, Result};
use crate::record::{ChainNext, prepare_of};
use crate::scan::Scanner;
use crate::segment::{index_name, log_name};
use crate::storage::{AlignedBuf, BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile};
use crate::superblock::{Checkpoint, Fence, GroupSlot};
use crate::wire::Header;

impl<S: Storage> PartitionLog<S> {
    /// Starts truncating every op above `op`, for a new view `view` that must be newer than
    /// the view of every truncated prepare. Nothing on disk changes yet: this returns the slot
    /// (fence, and the checkpoint moved back to the cut when it was above it) that the caller
    /// makes durable in the superblock *first*, then [`PartitionLog::finish_truncate`] cuts the
    /// files. A crash in between finds the fence and kills the old ops; a crash before finds the
    /// old log intact. Call it with no flush job in flight and nothing unwritten. `None` when
    /// there is nothing above `op`.
    pub async fn begin_truncate(
        &mut self,
        op: u64,
        view: u32,
        journal_seq: u64,
    ) -> Result<Option<GroupSlot>> {
        self.check_serving()?;
        assert!(
            self.flushes_in_flight == 0 && self.zeroing.is_none() && !self.has_unwritten(),
            "truncate only after a flush"
        );
        assert!(self.truncation.is_none(), "one truncation at a time");
        self.held.retain(|&held_op, _| held_op <= op);
        if op >= self.head.op {
            return Ok(None);
        }
        if let Some(first) = self.ring.by_op(op + 1) {
            assert!(first.header.view < view, "truncation view must be newer than truncated ops");
        }
        let location = if op == 0 {
            None
        } else {
            match self.locate(op).await {
                Ok(Some(location)) => Some(location),
                Ok(None) => return Err(Error::Invalid(format!("op {op} not found"))),
                Err(error) => return Err(self.fail(error)),
            }
        };
        self.fence = Fence { op, view, seq: journal_seq, finished: false };
        // Readers must not be served the cut ops from memory either, from now on.
        self.shared.cache.borrow_mut().truncate_after(self.group, op);
        if self.checkpoint.op > op {
            // Everything up to the cut is below the old checkpoint, hence already synced.
            self.checkpoint = location.map_or(Checkpoint::default(), |l| l.checkpoint());
        }
        self.truncation = Some((op, location));
        Ok(Some(self.slot()))
    }

    /// Marks the fence finished: the files are cut, so segment records above it are new. The
    /// shard makes it durable with its next superblock write.
    pub fn finish_fence(&mut self) {
        self.fence.finished = true;
    }

    /// Cuts the files after [`PartitionLog::begin_truncate`]'s slot is durable: removes whole
    /// segments above the cut, zeroes the tail at the cut and syncs it.
    pub async fn finish_truncate(&mut self) -> Result<()> {
        let (op, location) = self.truncation.take().expect("begin_truncate first");
        let result = self.truncate_files(op, location).await;
        self.account_ready();
        if let Err(error) = result {
            return Err(self.fail(error));
        }
        self.ring.truncate_after(op);
        // Again: a read planned since the cut began may have cached ops above it.
        self.shared.cache.borrow_mut().truncate_after(self.group, op);
        Ok(())
    }

    async fn truncate_files(&mut self, op: u64, location: Option<Location>) -> Result<()> {
        // Marks naming cut ops lie in trailers the cut zeroes or removes: none may be written
        // again.
        self.forget_marks_above(op);
        // Whole segments above the cut go.
        let keep = self.segments.partition_point(|segment| segment.first_op <= op);
        let removed: Vec<SegmentMeta> = self.segments.drain(keep..).collect();
        for segment in &removed {
            self.unsynced_segments.remove(&segment.base_offset);
        }
        // A segment that took the spare but was never created leaves the spare file unowned
        // (the next flush reserves in it again).
        self.spare_claimed &= self.segments.iter().rev().any(|segment| segment.from_spare);
        for segment in &removed {
            self.files.remove(&segment.base_offset);
            self.remove_segment_files(segment.base_offset).await?;
        }
        if !removed.is_empty() {
            self.storage
                .sync_dir(&self.dir)
                .await
                .map_err(|e| Error::io("syncing group dir", e))?;
        }
        for chunk in self.chunks.drain(..) {
            self.shared.pool.borrow_mut().give_back(chunk);
        }
        let Some(location) = location else {
            self.segments.clear();
            self.files.clear();
            self.tail_prefix.clear();
            self.head = Location::default();
            self.written = Location::default();
            self.submitted = Location::default();
            self.next = ChainNext {
                cluster: self.shared.cluster,
                group: self.group,
                op: 1,
                parent: 0,
                offset: 0,
            };
            return Ok(());
        };
        let segment = self.segments.last_mut().expect("the segment holding op remains");
        debug_assert_eq!(segment.base_offset, location.segment_base_offset);
        let path = self.dir.join(log_name(segment.base_offset));
        let file = match self.files.get(&segment.base_offset) {
            Some(file) => Rc::clone(file),
            None => {
                let file = open_segment(&self.storage, &path, OpenMode::ReadWrite).await?;
                let file = Rc::new(file);
                self.files.insert(segment.base_offset, Rc::clone(&file));
                file
            }
        };
        let end = location.end_bytes;
        let block = BLOCK_SIZE_BYTES as u64;
        let block_start = end - end % block;
        let mut scanner = Scanner::new(&*file, BLOCK_SIZE_BYTES)
            .await
            .map_err(|e| Error::io("reading segment", e))?;
        let prefix = scanner
            .bytes_at(block_start, (end - block_start) as usize)
            .await
            .map_err(|e| Error::io("reading segment", e))?;
        // Zero two blocks from the cut: the next record's header starts there, so it can never
        // validate again, whatever the fence says.
        let mut zeroed = AlignedBuf::zeroed(2 * BLOCK_SIZE_BYTES, BLOCK_SIZE_BYTES);
        zeroed.extend_from_slice(&prefix);
        zeroed.set_len(2 * BLOCK_SIZE_BYTES);
        file.write_at(zeroed.freeze(), block_start)
            .await
            .map_err(|e| Error::io("zeroing the truncated tail", e))?;
        file.sync_data().await.map_err(|e| Error::io("syncing the truncated tail", e))?;
        // Everything further that the truncated ops occupied goes too: a view change may
        // re-append byte-identical prepares at the same positions, and the scan must then stop
        // where the new log ends instead of chaining on into the old, dead records.
        let base = segment.base_offset;
        self.rewrite_window(base, block_start + 2 * block, false).await?;
        let segment = self.segments.last_mut().expect("the segment holding op remains");
        if segment.settled {
            let index_path = self.dir.join(index_name(segment.base_offset));
            if self
                .storage
                .exists(&index_path)
                .await
                .map_err(|e| Error::io("probing an index", e))?
            {
                self.storage
                    .remove_file(&index_path)
                    .await
                    .map_err(|e| Error::io("removing a stale index", e))?;
            }
        }
        segment.sealed = false;
        segment.settled = false;
        segment.index.truncate(end);
        segment.end_bytes = end;
        segment.next_offset = location.next_offset;
        segment.last_op = op;
        // The zeroed blocks are written, and any reservation past them still holds.
        segment.ready_end_bytes = segment.ready_end_bytes.max(block_start + 2 * block);
        self.tail_prefix = prefix.to_vec();
        self.head = location;
        self.written = location;
        self.submitted = location;
        self.next = ChainNext {
            cluster: self.shared.cluster,
            group: self.group,
            op: op + 1,
            parent: location.checksum,
            offset: location.next_offset,
        };
        Ok(())
    }

    /// Where the record of `op` lies.
    async fn locate(&mut self, op: u64) -> Result<Option<Location>> {
        if op == self.head.op {
            return Ok(Some(self.head));
        }
        let Some(prepare) = self.read_op(op).await? else { return Ok(None) };
        let segment = self.segments.partition_point(|segment| segment.first_op <= op) - 1;
        let segment = &self.segments[segment];
        // The record's position: scan the index-located region for it.
        let base = segment.base_offset;
        let position = self.position_of_op(segment, op).await?;
        let end_bytes = position + prepare.record.len() as u64;
        Ok(Some(Location {
            op,
            checksum: prepare.header.checksum_header,
            next_offset: prepare.end_offset(),
            segment_base_offset: base,
            position_bytes: position,
            end_bytes,
        }))
    }

    async fn position_of_op(&self, segment: &SegmentMeta, op: u64) -> Result<u64> {
        let path = self.dir.join(log_name(segment.base_offset));
        let file = open_segment(&self.storage, &path, OpenMode::Read).await?;
        let mut scanner = Scanner::new(&file, self.shared.scan_window_bytes)
            .await
            .map_err(|e| Error::io("reading a segment", e))?;
        let mut position = segment.index.position_for_op(op);
        while position < segment.end_bytes {
            let record = scanner
                .record_at(position, self.config.record_size_bytes_max as usize)
                .await
                .map_err(|e| Error::io("reading a segment", e))?;
            let header =
                Header::decode_prefix(&record).map_err(|e| Error::Invalid(e.to_string()))?;
            if prepare_of(&header).op == op {
                return Ok(position);
            }
            position += u64::from(header.size);
        }
        Err(Error::Invalid(format!("op {op} not found in {}", path.display())))
    }
}
