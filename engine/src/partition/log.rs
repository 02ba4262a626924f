//! The partition log's state: one group's segments, open files, chain position, write buffer,
//! ring and fences, the constructor of an empty log, and what the rest of the engine may read
//! of it.
//!
//! Every other part of `partition` works on this state; this file only holds and reports it.
//! It must never do I/O beyond creating a new group's directory.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;

use super::flush::TailWrite;
use crate::cache::BatchCache;
use crate::chunk::{Chunk, ChunkPool, written_extent_end};
use crate::error::{Error, Result};
use crate::ready::{READY_STEP_MIN_BYTES, ReadyBudget};
use crate::record::{ChainNext, prepare_of};
use crate::ring::{PrepareRing, RingBudget, RingLimits};
use crate::segment::{IndexSummary, SegmentIndex};
use crate::storage::{AlignedBuf, BLOCK_SIZE_BYTES, BufferShelf, OpenMode, Storage, StorageFile};
use crate::superblock::{Checkpoint, Fence, GroupConfig, GroupSlot};
use crate::wire::Header;

/// Shard-wide settings and resources every partition of the shard shares.
pub struct Shared {
    /// Cluster id stamped in every record.
    pub cluster: u64,
    /// The largest step of disk space made ready ahead of a segment's tail, so that running out
    /// of space surfaces as a clean "storage full" while the space already made ready still
    /// takes the writes in flight. A partition's step grows toward it with its write rate.
    pub ready_ahead_bytes: u64,
    /// The shard's account of ready space across its partitions.
    pub ready_budget: ReadyBudget,
    /// Retired segments become the spare segment file (`ShardConfig::recycle_segments`).
    pub recycle_segments: bool,
    /// Distance between sparse index entries.
    pub index_interval_bytes: u64,
    /// Bounds of each ring.
    pub ring_limits: RingLimits,
    /// Out-of-order prepares held per partition at most.
    pub held_prepares_max: usize,
    /// A `persisted` group writes its segment once this much is pending (the journal already
    /// holds it durably).
    pub persisted_write_batch_bytes: usize,
    /// Read window for scans.
    pub scan_window_bytes: usize,
    /// Index entries a loaded index file may hold.
    pub index_entries_max: usize,
    /// The write-buffer chunks.
    pub pool: RefCell<ChunkPool>,
    /// The memory budget of all rings.
    pub ring_budget: RingBudget,
    /// An aligned run of zeros, for rewriting a torn window.
    pub zeros: Bytes,
    /// Written prepares kept for consumers behind the rings.
    pub cache: RefCell<BatchCache>,
    /// Read-ahead reads a partition keeps in flight at most for a sequential consumer (0:
    /// none), each about `scan_window_bytes` long.
    pub read_ahead_windows: usize,
    /// Segments retention retired (renamed out of the log) whose files are still to be
    /// removed: the shard's driver removes them off its loop.
    pub retired_files: RefCell<Vec<PathBuf>>,
    /// The scan window replays share ([`PartitionLog::replay_offset`]): a restart reads every
    /// group's log, and a fresh window per read cost its first touch each time.
    pub replay_scan_shelf: BufferShelf,
}

/// Where one record lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(super) struct Location {
    pub(super) op: u64,
    pub(super) checksum: u32,
    pub(super) next_offset: u64,
    pub(super) segment_base_offset: u64,
    pub(super) position_bytes: u64,
    pub(super) end_bytes: u64,
}

impl Location {
    pub(super) fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            op: self.op,
            checksum: self.checksum,
            next_offset: self.next_offset,
            segment_base_offset: self.segment_base_offset,
            position_bytes: self.position_bytes,
        }
    }
}

/// What the log knows of one segment.
#[derive(Debug)]
pub(super) struct SegmentMeta {
    pub(super) base_offset: u64,
    pub(super) first_op: u64,
    /// End of the last valid record.
    pub(super) end_bytes: u64,
    pub(super) next_offset: u64,
    pub(super) last_op: u64,
    pub(super) first_append_ms: i64,
    pub(super) last_append_ms: i64,
    pub(super) index: SegmentIndex,
    /// No more appends go here (a newer segment exists).
    pub(super) sealed: bool,
    /// Synced and its index file written since it was sealed.
    pub(super) settled: bool,
    /// Space made ready (reserved, or written) from the file's start: a write below it cannot
    /// run out of space. 0 when unknown (after recovery), so the next job reserves again.
    pub(super) ready_end_bytes: u64,
    /// Not created yet: the job that creates it renames the spare segment file instead, whose
    /// reserved space `ready_end_bytes` stands for.
    pub(super) from_spare: bool,
    /// Its sync-mark trailer is written (`crate::direct`): direct jobs may mark it.
    pub(super) trailer_ready: bool,
    /// Every block below is written on file (a recycled segment's bytes, a finished zero
    /// step's zeros), as far as this log knows; 0 when unknown. A write below it crosses no
    /// reserved blocks, so it needs no split (see `submit_chunks`).
    pub(super) written_through_bytes: u64,
}

impl SegmentMeta {
    pub(super) fn new(base_offset: u64, first_op: u64) -> Self {
        Self {
            base_offset,
            first_op,
            end_bytes: 0,
            next_offset: base_offset,
            last_op: first_op.saturating_sub(1),
            first_append_ms: i64::MIN,
            last_append_ms: i64::MIN,
            index: SegmentIndex::default(),
            sealed: false,
            settled: false,
            ready_end_bytes: 0,
            from_spare: false,
            trailer_ready: false,
            written_through_bytes: 0,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.end_bytes == 0
    }

    pub(super) fn summary(&self) -> IndexSummary {
        IndexSummary {
            covered_bytes: self.end_bytes,
            next_offset: self.next_offset,
            last_op: self.last_op,
            last_append_ms: self.last_append_ms,
        }
    }

    pub(super) fn observe(&mut self, header: &Header, position_bytes: u64, interval_bytes: u64) {
        let prepare = prepare_of(header);
        if self.is_empty() {
            self.first_append_ms = prepare.append_time_ms;
        }
        self.last_append_ms = self.last_append_ms.max(prepare.append_time_ms);
        self.index.observe(header, position_bytes, interval_bytes);
        self.end_bytes = position_bytes + u64::from(header.size);
        self.next_offset = prepare.end_offset();
        self.last_op = prepare.op;
    }
}

/// Ops the log cannot vouch for after recovery (DESIGN.md §3: faulty, not absent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultyOps {
    /// Every op from this one on may have existed and been acknowledged, but is gone.
    pub suffix_from: Option<u64>,
}

/// One group's log.
pub struct PartitionLog<S: Storage> {
    pub(super) storage: S,
    pub(super) shared: Rc<Shared>,
    pub(super) group: u64,
    pub(super) config: GroupConfig,
    pub(super) dir: PathBuf,
    pub(super) segments: Vec<SegmentMeta>,
    /// Open files of segments with unsettled data (the active one at least).
    pub(super) files: BTreeMap<u64, Rc<S::File>>,
    pub(super) next: ChainNext,
    pub(super) head: Location,
    pub(super) written: Location,
    /// Where the flush jobs handed out so far end (`written` when none is in flight).
    pub(super) submitted: Location,
    /// Chunks with bytes not yet written; the last one receives appends.
    pub(super) chunks: VecDeque<Chunk>,
    /// The bytes of the partial block before the append point, kept so the first append after
    /// recovery or truncation can start a chunk without reading the disk.
    pub(super) tail_prefix: Vec<u8>,
    pub(super) ring: PrepareRing,
    pub(super) held: BTreeMap<u64, (Header, Bytes)>,
    pub(super) fence: Fence,
    /// Journal entries numbered at or below this are an earlier group's of the same id
    /// ([`GroupSlot::journal_floor_seq`]).
    pub(super) journal_floor_seq: u64,
    view: u32,
    log_view: u32,
    log_view_head_op: Option<u64>,
    pub(super) checkpoint: Checkpoint,
    /// Bytes appended since open, at the head, at the written op and at the checkpoint.
    pub(super) appended_bytes: u64,
    pub(super) written_appended_bytes: u64,
    pub(super) submitted_appended_bytes: u64,
    pub(super) checkpoint_appended_bytes: u64,
    /// Bytes appended at the shard's last flush cycle, and per cycle (smoothed): the group's
    /// pace, which sizes a `persisted` group's write-buffer chunks.
    cycle_appended_bytes: u64,
    pub(super) appended_bytes_per_cycle: u64,
    /// Flush jobs in flight; they finish in the order they began.
    pub(super) flushes_in_flight: usize,
    /// The job in flight creates files or reserves space: no other job runs beside it.
    pub(super) exclusive_in_flight: bool,
    /// A job failed while later ones were in flight: theirs are void, and no job starts until
    /// every one has finished.
    pub(super) flush_failed: bool,
    /// The tail (partial block and guard block) the newest job writing one pads, and that
    /// job's latch: a later job rewriting those blocks waits until the job finished, so the
    /// older, shorter copy can never land last.
    pub(super) tail_in_flight: Option<TailWrite>,
    /// The log's direct jobs are small: its steps ahead are written with zeros by zero steps
    /// (`super::zero_fill`), not reserved by its flush jobs.
    pub(super) zeros_ahead: bool,
    /// The zero step in flight: its range counts as ready, and data writes into it wait for it.
    pub(super) zeroing: Option<TailWrite>,
    /// The segment the last flush job wrote to, and where the blocks its writes covered end:
    /// blocks below were written before, blocks above only reserved (see `submit_chunks`).
    pub(super) written_blocks_end: Option<(u64, u64)>,
    /// A truncation whose fence is being made durable: the cut op and where it lies.
    pub(super) truncation: Option<(u64, Option<Location>)>,
    /// The disk had no room for space ahead of the tail: appends that would need more than is
    /// ready are refused with `StorageFull` until a reservation succeeds.
    pub(super) storage_full: bool,
    /// The next flush may try the failed reservation again (armed by
    /// [`PartitionLog::retry_storage_full`], so a full disk is probed at the caller's pace
    /// rather than by every cycle).
    pub(super) storage_retry: bool,
    /// The spare segment file exists, with this much space reserved in it (0: unknown). It
    /// makes a roll's new segment ready before the roll, so that a full disk is found while the
    /// active segment still has room, not by the append that starts a new one.
    pub(super) spare_ready_end_bytes: Option<u64>,
    /// Of the spare's ready space, the whole blocks a recycled segment's bytes fill (0 for a
    /// spare whose space was only reserved, or after recovery): the segment that takes the
    /// spare starts with them written (`SegmentMeta::written_through_bytes`).
    pub(super) spare_written_end_bytes: u64,
    /// A job reserving space in the spare is in flight: no roll takes the spare meanwhile.
    pub(super) spare_in_flight: bool,
    /// A segment took the spare and the job renaming it has not finished: the file
    /// `spare.segment` is that segment's, so no new spare is made meanwhile.
    pub(super) spare_claimed: bool,
    /// One clone per disk read in flight: a segment file a read may still be scanning is never
    /// recycled (its bytes would change under the read), only deleted.
    pub(super) disk_reads: Rc<()>,
    /// Read-ahead: the offset where the reads planned so far end, and how many are in flight.
    pub(super) read_ahead_to_offset: u64,
    pub(super) reads_ahead_in_flight: usize,
    /// Segments recycled into the spare since open.
    pub(super) recycled_segments: u64,
    /// The step of ready space this log asks for ahead of its tail: it doubles while steps are
    /// used up within a few flush jobs and halves while they last long.
    pub(super) ready_step_bytes: u64,
    /// Flush jobs that wrote data since the last step ahead was asked for.
    pub(super) jobs_since_step: u32,
    /// The ready space this log last reported to the shard's budget.
    pub(super) ready_held_bytes: u64,
    pub(super) faulty: Option<String>,
    pub(super) faulty_ops: FaultyOps,
    /// The durable marker of a damage cut ([`GroupSlot::damaged_from`]; 0: none).
    pub(super) damaged_from: u64,
    /// Retention keeps every segment holding an offset at or above this (the owner's state
    /// snapshot covers only what is below it).
    pub(super) retention_floor_offset: u64,
    /// See [`PartitionLog::set_committed_end`].
    pub(super) committed_end_offset: u64,
    /// The direct path (`partition::direct`): the newest op (and its record checksum) a
    /// completed segment sync made durable, the next mark's sequence number, the op the job in
    /// flight announces, and the newest op a written mark announces.
    pub(super) synced: Option<(u64, u32)>,
    pub(super) mark_seq: u64,
    pub(super) mark_pending_op: u64,
    pub(super) mark_announced_op: u64,
    /// Segments that jobs off the direct path wrote since the last direct job: the next one
    /// syncs them too, so that its mark never names an op whose bytes no sync covered.
    pub(super) unsynced_segments: std::collections::BTreeSet<u64>,
}

impl<S: Storage> Drop for PartitionLog<S> {
    fn drop(&mut self) {
        // A log replaced while the shard runs (a damage cut, a state transfer) hands its write
        // chunks back: their memory would come back to the pool anyway once unviewed, but
        // handed back, views still holding it count as pinned (`ChunkPool::has_pinned`), which
        // a dry pool asks the rings to let go. The ring gives its budget back on its own.
        let mut pool = self.shared.pool.borrow_mut();
        for chunk in self.chunks.drain(..) {
            pool.give_back(chunk);
        }
        // Its files stay (a replaced log's successor adopts or removes them and reports anew).
        self.shared.ready_budget.update(self.ready_held_bytes, 0);
        self.shared.cache.borrow_mut().forget(self.group);
    }
}

impl<S: Storage> PartitionLog<S> {
    /// Creates the directory of a new, empty group log. The caller syncs the parent directory
    /// (once for all the groups it creates) and records the group's slot in the superblock
    /// before appending.
    pub async fn create(
        storage: S,
        shared: Rc<Shared>,
        dir: PathBuf,
        slot: GroupSlot,
        config: GroupConfig,
    ) -> Result<Self> {
        config.validate()?;
        // No data depends on a group that does not exist yet: no room for it is clean.
        storage
            .create_dir_all(&dir)
            .await
            .map_err(|e| Error::preparing(format!("creating {}", dir.display()), e))?;
        Ok(Self::empty(storage, shared, dir, slot, config))
    }

    /// The group id.
    pub fn group(&self) -> u64 {
        self.group
    }

    /// The group's settings.
    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    /// What the next prepare must be: op, parent checksum and base offset. The primary builds
    /// its prepare header from this.
    pub fn next(&self) -> ChainNext {
        self.next
    }

    /// The last appended op (0 when empty).
    pub fn head_op(&self) -> u64 {
        self.head.op
    }

    /// The last op written to its segment file.
    pub fn written_op(&self) -> u64 {
        self.written.op
    }

    /// The offset of the oldest retained message.
    pub fn first_offset(&self) -> u64 {
        self.segments.first().map_or(self.next.offset, |segment| segment.base_offset)
    }

    /// The oldest op the log still holds (retention deletes from the front); `head_op() + 1`
    /// when it holds none.
    pub fn first_op(&self) -> u64 {
        self.segments.first().map_or(self.head.op + 1, |segment| segment.first_op)
    }

    /// The offset the next message will get (the log end offset).
    pub fn next_offset(&self) -> u64 {
        self.next.offset
    }

    /// Number of segment files.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Keeps retention from deleting any segment that holds an offset at or above `offset`:
    /// the group's owner keeps state derived from the log (consumer offsets) and can rebuild it
    /// only from its last snapshot on, which covers the offsets below this. `u64::MAX` (the
    /// default) sets no floor.
    pub fn set_retention_floor(&mut self, offset: u64) {
        self.retention_floor_offset = offset;
    }

    /// Keeps retention from deleting any segment unless the op after it is committed
    /// (`offset`: the offset after the last committed op): a view change may still truncate
    /// an uncommitted op, and a truncation needs the op it keeps; so the first op of a log
    /// whose beginning retention removed is always committed. `u64::MAX` (the default) sets no
    /// bound; a replicated owner sets it as its commit point moves.
    pub fn set_committed_end(&mut self, offset: u64) {
        self.committed_end_offset = offset;
    }

    /// Bytes of valid records in all segments.
    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|segment| segment.end_bytes).sum()
    }

    /// Segments retention recycled into the spare segment file since open (the rest it deleted).
    pub fn recycled_segments(&self) -> u64 {
        self.recycled_segments
    }

    /// Write-buffer chunks this log holds (none once everything it appended is written).
    pub fn write_buffer_chunks(&self) -> usize {
        self.chunks.len()
    }

    /// The bytes of the write-buffer chunks this log holds.
    pub fn write_buffer_bytes(&self) -> usize {
        self.chunks.iter().map(Chunk::size_bytes).sum()
    }

    /// Files this log holds open.
    pub fn open_file_count(&self) -> usize {
        self.files.len()
    }

    /// The durable checkpoint.
    pub fn checkpoint(&self) -> Checkpoint {
        self.checkpoint
    }

    /// The ring (for tests and metrics).
    pub fn ring(&self) -> &PrepareRing {
        &self.ring
    }

    /// Prepares held out of order, waiting for their predecessors.
    pub fn held_count(&self) -> usize {
        self.held.len()
    }

    /// Ops that are faulty rather than absent.
    pub fn faulty_ops(&self) -> &FaultyOps {
        &self.faulty_ops
    }

    /// Why the log refuses work, if it does.
    pub fn faulty_reason(&self) -> Option<&str> {
        self.faulty.as_deref()
    }

    /// Whether a flush job of this log is in flight.
    pub fn has_flush_in_flight(&self) -> bool {
        self.flushes_in_flight > 0
    }

    /// Whether bytes are waiting to be written (or are being written).
    pub fn has_unwritten(&self) -> bool {
        self.written.op < self.head.op
    }

    /// Whether bytes are waiting for a flush job to be handed to.
    pub fn has_unsubmitted(&self) -> bool {
        self.submitted.op < self.head.op
    }

    /// Bytes appended since the last checkpoint.
    pub fn bytes_since_checkpoint(&self) -> u64 {
        self.appended_bytes - self.checkpoint_appended_bytes
    }

    /// Counts one of the shard's flush cycles towards the group's pace: the bytes it appended
    /// per cycle, smoothed over the last few.
    pub fn note_flush_cycle(&mut self) {
        let appended = self.appended_bytes.saturating_sub(self.cycle_appended_bytes);
        self.cycle_appended_bytes = self.appended_bytes;
        self.appended_bytes_per_cycle = (3 * self.appended_bytes_per_cycle + appended) / 4;
    }

    /// Forgets the group's pace (it went idle): its next append starts from the smallest chunk.
    pub fn reset_pace(&mut self) {
        self.cycle_appended_bytes = self.appended_bytes;
        self.appended_bytes_per_cycle = 0;
    }

    /// Changes the retention bounds (the shard records them in the superblock).
    pub(crate) fn set_retention(&mut self, retention_bytes: u64, retention_ms: u64) {
        self.config.retention_bytes = retention_bytes;
        self.config.retention_ms = retention_ms;
    }

    /// Journal entries numbered at or below this are an earlier group's of the same id.
    pub fn journal_floor_seq(&self) -> u64 {
        self.journal_floor_seq
    }

    /// The durable control state of this group, as the superblock should hold it.
    pub fn slot(&self) -> GroupSlot {
        GroupSlot {
            group: self.group,
            config: self.config,
            view: self.view,
            log_view: self.log_view,
            log_view_head_op: self.log_view_head_op,
            checkpoint: self.checkpoint,
            fence: self.fence,
            damaged_from: self.damaged_from,
            // Only a state transfer's commit write sets it; a live log is never mid-install.
            transfer_pending: false,
            journal_floor_seq: self.journal_floor_seq,
        }
    }

    /// The op a damage cut was made at, while its ops may still be missing (0: none).
    pub fn damaged_from(&self) -> u64 {
        self.damaged_from
    }

    /// Marks every op past the head faulty, and sets the damage marker there unless an older
    /// one lies lower: the marker without a cut, for a chain recovery already ended at a damaged
    /// record. Durable once the shard writes the slot. Returns where the faulty suffix begins.
    pub fn mark_damaged_past_head(&mut self) -> u64 {
        if self.damaged_from == 0 {
            self.damaged_from = self.next.op;
        }
        self.fault_past_head()
    }

    /// Lowers the faulty suffix to begin right past the head (where it does not already begin
    /// lower); returns where it begins.
    pub(super) fn fault_past_head(&mut self) -> u64 {
        let from = self.faulty_ops.suffix_from.map_or(self.next.op, |f| f.min(self.next.op));
        self.faulty_ops.suffix_from = Some(from);
        from
    }

    /// Forgets the damage cut once the owner holds its ops again; true when there was one (the
    /// shard then writes the slot). The owner calls it only once everything it appended is
    /// durable, so a crash can never leave the ops missing with the marker gone.
    pub fn clear_damaged_from(&mut self) -> bool {
        std::mem::take(&mut self.damaged_from) != 0
    }

    /// Records view, log_view and the head op that log view began with (when known); durable
    /// once the shard writes the superblock.
    pub fn set_views(&mut self, view: u32, log_view: u32, log_view_head_op: Option<u64>) {
        self.view = view;
        self.log_view = log_view;
        self.log_view_head_op = log_view_head_op;
    }

    /// Marks every op past the head faulty rather than absent (the shard calls this when the
    /// journal lost a synced entry it cannot attribute).
    pub fn mark_suffix_faulty(&mut self) {
        self.faulty_ops.suffix_from = Some(self.next.op);
    }

    /// Marks the log fail-stop after an I/O failure the shard saw on its behalf (a checkpoint
    /// sync).
    pub fn fail_io(&mut self, error: Error) -> Error {
        self.fail(error)
    }

    pub(super) fn empty(
        storage: S,
        shared: Rc<Shared>,
        dir: PathBuf,
        slot: GroupSlot,
        config: GroupConfig,
    ) -> Self {
        let ring = PrepareRing::new(shared.ring_limits, shared.ring_budget.clone());
        let cluster = shared.cluster;
        let ready_step_bytes = READY_STEP_MIN_BYTES.min(shared.ready_ahead_bytes);
        Self {
            storage,
            shared,
            group: slot.group,
            config,
            dir,
            segments: Vec::new(),
            files: BTreeMap::new(),
            next: ChainNext { cluster, group: slot.group, op: 1, parent: 0, offset: 0 },
            head: Location::default(),
            written: Location::default(),
            submitted: Location::default(),
            chunks: VecDeque::new(),
            tail_prefix: Vec::new(),
            ring,
            held: BTreeMap::new(),
            fence: slot.fence,
            journal_floor_seq: slot.journal_floor_seq,
            view: slot.view,
            log_view: slot.log_view,
            log_view_head_op: slot.log_view_head_op,
            checkpoint: slot.checkpoint,
            appended_bytes: 0,
            written_appended_bytes: 0,
            submitted_appended_bytes: 0,
            checkpoint_appended_bytes: 0,
            cycle_appended_bytes: 0,
            appended_bytes_per_cycle: 0,
            flushes_in_flight: 0,
            exclusive_in_flight: false,
            flush_failed: false,
            tail_in_flight: None,
            zeros_ahead: false,
            zeroing: None,
            written_blocks_end: None,
            truncation: None,
            storage_full: false,
            storage_retry: false,
            spare_ready_end_bytes: None,
            spare_written_end_bytes: 0,
            spare_in_flight: false,
            spare_claimed: false,
            disk_reads: Rc::new(()),
            read_ahead_to_offset: 0,
            reads_ahead_in_flight: 0,
            recycled_segments: 0,
            ready_step_bytes,
            // Neither grows nor shrinks the first step: nothing is known of the rate yet.
            jobs_since_step: super::flush::STEP_GROW_JOBS_MAX + 1,
            ready_held_bytes: 0,
            faulty: None,
            faulty_ops: FaultyOps::default(),
            damaged_from: slot.damaged_from,
            synced: None,
            mark_seq: 0,
            mark_pending_op: 0,
            mark_announced_op: 0,
            unsynced_segments: std::collections::BTreeSet::new(),
            retention_floor_offset: u64::MAX,
            committed_end_offset: u64::MAX,
        }
    }

    pub(super) fn check_serving(&self) -> Result<()> {
        match &self.faulty {
            Some(reason) => Err(Error::Faulty { group: self.group, reason: reason.clone() }),
            None => Ok(()),
        }
    }

    /// Marks the log fail-stop and passes the error on; storage full stays retryable.
    pub(super) fn fail(&mut self, error: Error) -> Error {
        if !matches!(error, Error::StorageFull) && self.faulty.is_none() {
            self.faulty = Some(error.to_string());
        }
        error
    }

    /// The segment with this base offset, searched from the newest (callers ask for the last few).
    pub(super) fn segment(&self, base_offset: u64) -> Option<&SegmentMeta> {
        self.segments.iter().rev().find(|meta| meta.base_offset == base_offset)
    }

    pub(super) fn segment_mut(&mut self, base_offset: u64) -> Option<&mut SegmentMeta> {
        self.segments.iter_mut().rev().find(|meta| meta.base_offset == base_offset)
    }

    /// Ready space this log holds ahead of its data: reserved past the active segment's tail,
    /// and in the spare segment file.
    pub fn ready_space_bytes(&self) -> u64 {
        let ahead = self.segments.last().map_or(0, |active| {
            self.ready_end_of(active).saturating_sub(written_extent_end(active.end_bytes))
        });
        ahead + self.spare_ready_end_bytes.unwrap_or(0)
    }

    /// Counts `bytes` more of ready space against the shard's budget from now, for a job that
    /// asks for them (so other logs' jobs beginning meanwhile see them gone); the finish of the
    /// job reports what is held ([`PartitionLog::account_ready`]).
    pub(super) fn claim_ready(&mut self, bytes: u64) {
        self.shared.ready_budget.update(self.ready_held_bytes, self.ready_held_bytes + bytes);
        self.ready_held_bytes += bytes;
    }

    /// Reports this log's ready space to the shard's budget. Called where it may have changed
    /// with no job in flight that claimed more (a claim in flight is reported when it is made).
    pub(super) fn account_ready(&mut self) {
        let now = self.ready_space_bytes();
        self.shared.ready_budget.update(self.ready_held_bytes, now);
        self.ready_held_bytes = now;
    }

    /// How far a segment's bytes are on file (the rest is only in memory).
    pub(super) fn written_end(&self, segment: &SegmentMeta) -> u64 {
        self.end_on_file(segment, &self.written)
    }

    /// How far a segment's bytes reach once everything up to `upto` is on file.
    pub(super) fn end_on_file(&self, segment: &SegmentMeta, upto: &Location) -> u64 {
        use std::cmp::Ordering;
        match segment.base_offset.cmp(&upto.segment_base_offset) {
            Ordering::Less => segment.end_bytes,
            Ordering::Equal if upto.op > 0 => upto.end_bytes,
            _ => 0,
        }
    }
}

/// Whether a spare segment file holds a retired segment's records (it was recycled) rather
/// than space made ready alone, which reads as zeros whatever its size ([`StorageFile::allocate`]
/// may grow the size): a retired segment starts with a record header, never with zeros.
pub(crate) async fn spare_holds_records<F: StorageFile>(file: &F) -> std::io::Result<bool> {
    let (result, first) =
        file.read_at(AlignedBuf::zeroed(BLOCK_SIZE_BYTES, BLOCK_SIZE_BYTES), 0).await;
    result?;
    Ok(first.as_slice().iter().any(|&byte| byte != 0))
}

/// Opens a segment file for direct I/O, naming it in the error.
pub(super) async fn open_segment<S: Storage>(
    storage: &S,
    path: &Path,
    mode: OpenMode,
) -> Result<S::File> {
    storage
        .open(path, mode, true)
        .await
        .map_err(|e| Error::io(format!("opening {}", path.display()), e))
}
