//! The partition log: one VSR group's prepares in a sequence of segment files, with the write
//! buffer, the prepare ring, the sparse indexes, reads, truncation, retention and recovery.
//!
//! It owns the group's files and memory and nothing else: the shard decides when to flush,
//! when to checkpoint and when the superblock is written, and supplies journal entries at
//! recovery. Appends are synchronous memory operations (one copy into the write buffer); the
//! I/O happens in the [`FlushJob`] that [`PartitionLog::begin_flush`] hands the shard's flush
//! cycle, which gives it back to [`PartitionLog::finish_flush`]. The log
//! checks view, op and commit only for continuity and checksums; it knows nothing of quorums.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;

use crate::chunk::{Chunk, ChunkPool, written_extent_end};
use crate::error::{Corruption, Error, Result};
use crate::join::{Latch, join_all};
use crate::record::{ChainNext, RecordFault, check_next, check_standalone, prepare_of};
use crate::ring::{PrepareRing, RingBudget, RingFull, RingLimits, StoredPrepare};
use crate::scan::Scanner;
use crate::segment::{
    IndexSummary, SPARE_NAME, SegmentIndex, index_name, log_name, parse_log_name,
};
use crate::storage::{AlignedBuf, BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile};
use crate::superblock::{Checkpoint, Durability, Fence, GroupConfig, GroupSlot};
use crate::wire::{HEADER_SIZE, Header};

/// The largest single write a flush issues: longer runs are split so that several writes are
/// in flight at once (the device's queue depth, not one request, sets the throughput).
pub const WRITE_PIECE_BYTES: usize = 1 << 20;
const _: () = assert!(WRITE_PIECE_BYTES.is_multiple_of(BLOCK_SIZE_BYTES));

/// Shard-wide settings and resources every partition of the shard shares.
pub struct Shared {
    /// Cluster id stamped in every record.
    pub cluster: u64,
    /// Disk space reserved ahead of a segment's tail, so that running out of space surfaces as a
    /// clean "storage full" while the space already made ready still takes the writes in
    /// flight.
    pub ready_ahead_bytes: u64,
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
}

/// Where one record lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
struct Location {
    op: u64,
    checksum: u32,
    next_offset: u64,
    segment_base_offset: u64,
    position_bytes: u64,
    end_bytes: u64,
}

impl Location {
    fn checkpoint(&self) -> Checkpoint {
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
struct SegmentMeta {
    base_offset: u64,
    first_op: u64,
    /// End of the last valid record.
    end_bytes: u64,
    next_offset: u64,
    last_op: u64,
    first_append_ms: i64,
    last_append_ms: i64,
    index: SegmentIndex,
    /// No more appends go here (a newer segment exists).
    sealed: bool,
    /// Synced and its index file written since it was sealed.
    settled: bool,
    /// Space made ready (reserved, or written) from the file's start: a write below it cannot
    /// run out of space. 0 when unknown (after recovery), so the next job reserves again.
    ready_end_bytes: u64,
    /// Not created yet: the job that creates it renames the spare segment file instead, whose
    /// reserved space `ready_end_bytes` stands for.
    from_spare: bool,
}

impl SegmentMeta {
    fn new(base_offset: u64, first_op: u64) -> Self {
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
        }
    }

    fn is_empty(&self) -> bool {
        self.end_bytes == 0
    }

    fn summary(&self) -> IndexSummary {
        IndexSummary {
            covered_bytes: self.end_bytes,
            next_offset: self.next_offset,
            last_op: self.last_op,
            last_append_ms: self.last_append_ms,
        }
    }

    fn observe(&mut self, header: &Header, position_bytes: u64, interval_bytes: u64) {
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

/// What recovery found in one group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupRecovery {
    /// The group.
    pub group: u64,
    /// The last valid op after recovery.
    pub head_op: u64,
    /// Records scanned in segments.
    pub records_scanned: u64,
    /// Prepares replayed from the shard journal.
    pub journal_replayed: u64,
    /// Where the torn tail was cut, and why (a torn tail is ordinary).
    pub torn_tail: Option<(PathBuf, u64, String)>,
    /// Damage before the torn window: the group refuses service.
    pub corruption: Option<Corruption>,
    /// Where a damage cut ([`PartitionLog::recover_cut`]) ended the chain, and why.
    pub cut: Option<(PathBuf, u64, String)>,
    /// Ops that are faulty rather than absent.
    pub faulty: FaultyOps,
    /// Index files rebuilt because they were missing, behind or damaged.
    pub indexes_rebuilt: u64,
}

/// The outcome of one partition's writes in a flush cycle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteOutcome {
    /// Every op up to this one is now written to its segment.
    pub written_op: u64,
    /// Bytes written (data and zeros).
    pub bytes_written: u64,
    /// The written data crossed into a newer segment: the shard should checkpoint this group,
    /// which settles the rolled one.
    pub sealed: bool,
    /// The disk had no room for the step ahead of the tail. What the job wrote went into space
    /// made ready earlier; the group now refuses appends that would need more (storage full).
    pub storage_full: bool,
}

/// Space a flush job makes ready before it writes: `[from_bytes, to_bytes)` of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reserve {
    /// The segment (by base offset), or `None` for the spare segment file.
    base_offset: Option<u64>,
    from_bytes: u64,
    to_bytes: u64,
    /// The job's own writes land here: without it nothing of the job may be written. Otherwise
    /// it is the step ahead of the tail, whose failure is the clean "storage full".
    needed: bool,
}

/// One group's log.
pub struct PartitionLog<S: Storage> {
    storage: S,
    shared: Rc<Shared>,
    group: u64,
    config: GroupConfig,
    dir: PathBuf,
    segments: Vec<SegmentMeta>,
    /// Open files of segments with unsettled data (the active one at least).
    files: BTreeMap<u64, Rc<S::File>>,
    next: ChainNext,
    head: Location,
    written: Location,
    /// Where the flush jobs handed out so far end (`written` when none is in flight).
    submitted: Location,
    /// Chunks with bytes not yet written; the last one receives appends.
    chunks: VecDeque<Chunk>,
    /// The bytes of the partial block before the append point, kept so the first append after
    /// recovery or truncation can start a chunk without reading the disk.
    tail_prefix: Vec<u8>,
    ring: PrepareRing,
    held: BTreeMap<u64, (Header, Bytes)>,
    fence: Fence,
    view: u32,
    log_view: u32,
    log_view_head_op: Option<u64>,
    checkpoint: Checkpoint,
    /// Bytes appended since open, at the head, at the written op and at the checkpoint.
    appended_bytes: u64,
    written_appended_bytes: u64,
    submitted_appended_bytes: u64,
    checkpoint_appended_bytes: u64,
    /// Flush jobs in flight; they finish in the order they began.
    flushes_in_flight: usize,
    /// The job in flight creates files or reserves space: no other job runs beside it.
    exclusive_in_flight: bool,
    /// A job failed while later ones were in flight: theirs are void, and no job starts until
    /// every one has finished.
    flush_failed: bool,
    /// The tail (partial block and guard block) the newest job writing one pads, and that
    /// job's latch: a later job rewriting those blocks waits until the job finished, so the
    /// older, shorter copy can never land last.
    tail_in_flight: Option<TailWrite>,
    /// A truncation whose fence is being made durable: the cut op and where it lies.
    truncation: Option<(u64, Option<Location>)>,
    /// The disk had no room for space ahead of the tail: appends that would need more than is
    /// ready are refused with `StorageFull` until a reservation succeeds.
    storage_full: bool,
    /// The next flush may try the failed reservation again (armed by
    /// [`PartitionLog::retry_storage_full`], so a full disk is probed at the caller's pace
    /// rather than by every cycle).
    storage_retry: bool,
    /// The spare segment file exists, with this much space reserved in it (0: unknown). It
    /// makes a roll's new segment ready before the roll, so that a full disk is found while the
    /// active segment still has room, not by the append that starts a new one.
    spare_ready_end_bytes: Option<u64>,
    /// A job reserving space in the spare is in flight: no roll takes the spare meanwhile.
    spare_in_flight: bool,
    /// A segment took the spare and the job renaming it has not finished: the file
    /// `spare.segment` is that segment's, so no new spare is made meanwhile.
    spare_claimed: bool,
    /// One clone per disk read in flight: a segment file a read may still be scanning is never
    /// recycled (its bytes would change under the read), only deleted.
    disk_reads: Rc<()>,
    /// Segments recycled into the spare since open.
    recycled_segments: u64,
    faulty: Option<String>,
    faulty_ops: FaultyOps,
    /// The durable marker of a damage cut ([`GroupSlot::damaged_from`]; 0: none).
    damaged_from: u64,
    /// Retention keeps every segment holding an offset at or above this (the owner's state
    /// snapshot covers only what is below it).
    retention_floor_offset: u64,
    /// See [`PartitionLog::set_committed_end`].
    committed_end_offset: u64,
}

/// The I/O of one group's part of a flush cycle, owning everything it touches so appends can
/// continue while it runs. Several may be in flight per log, each writing what was appended
/// after the previous one began; they are finished in the order they began.
pub struct FlushJob<S: Storage> {
    storage: S,
    dir: PathBuf,
    group: u64,
    create: Vec<u64>,
    files: BTreeMap<u64, Rc<S::File>>,
    writes: Vec<(u64, u64, Bytes)>,
    target: Location,
    target_appended_bytes: u64,
    chunk_marks: Vec<(u64, usize)>,
    /// Space to make ready before writing, in order: every `needed` one first.
    reserves: Vec<Reserve>,
    /// The segment among `create` that takes the spare segment file (renamed, not created).
    spare_for: Option<u64>,
    /// Opened when the job's I/O ended (or the job was dropped).
    done: Rc<Latch>,
    /// The tail an earlier job in flight writes: this job's writes touching it wait for that
    /// job's latch.
    after: Option<TailWrite>,
}

impl<S: Storage> Drop for FlushJob<S> {
    fn drop(&mut self) {
        // A job dropped unfinished (its node closing, a simulated crash) must not leave a later
        // job waiting for it.
        self.done.open();
    }
}

impl<S: Storage> Drop for PartitionLog<S> {
    fn drop(&mut self) {
        // A log replaced while the shard runs (a damage cut, a state transfer) hands its write
        // chunks back, or the pool would count them as allocated for good and, one replacement
        // at a time, run out. The ring gives its budget back on its own.
        let mut pool = self.shared.pool.borrow_mut();
        for chunk in self.chunks.drain(..) {
            pool.give_back(chunk);
        }
    }
}

/// A tail write in flight: its blocks, and the latch of the job writing them.
#[derive(Clone)]
struct TailWrite {
    segment_base_offset: u64,
    position_bytes: u64,
    len_bytes: u64,
    latch: Rc<Latch>,
}

impl TailWrite {
    /// Whether a write of `len_bytes` at `position_bytes` of this segment touches its blocks.
    fn overlaps(&self, segment_base_offset: u64, position_bytes: u64, len_bytes: u64) -> bool {
        segment_base_offset == self.segment_base_offset
            && position_bytes < self.position_bytes + self.len_bytes
            && self.position_bytes < position_bytes + len_bytes
    }
}

/// A finished [`FlushJob`], to hand back to [`PartitionLog::finish_flush`].
pub struct FlushDone<S: Storage> {
    job: FlushJob<S>,
    created: Vec<(u64, Rc<S::File>)>,
    /// The reservations that succeeded: (segment, or `None` for the spare; ready end).
    reserved: Vec<(Option<u64>, u64)>,
    outcome: WriteOutcome,
    result: Result<()>,
}

impl<S: Storage> FlushJob<S> {
    /// The group this job writes for.
    pub fn group(&self) -> u64 {
        self.group
    }

    /// Runs the writes: creates new segment files (and syncs the directory), makes space ready
    /// (everything the writes cover first, then the step ahead of the tail), then writes data
    /// concurrently. It never syncs data: that is the checkpoint's job, off the path that
    /// acknowledges appends.
    pub async fn run(self) -> FlushDone<S> {
        let mut created = Vec::new();
        let mut reserved = Vec::new();
        let mut outcome = WriteOutcome::default();
        let result = self.run_inner(&mut created, &mut reserved, &mut outcome).await;
        self.done.open();
        FlushDone { job: self, created, reserved, outcome, result }
    }

    async fn run_inner(
        &self,
        created: &mut Vec<(u64, Rc<S::File>)>,
        reserved: &mut Vec<(Option<u64>, u64)>,
        outcome: &mut WriteOutcome,
    ) -> Result<()> {
        let spare_path = self.dir.join(SPARE_NAME);
        for &base in &self.create {
            let path = self.dir.join(log_name(base));
            if self.spare_for == Some(base) {
                // The spare's reserved space becomes the new segment's (durable with the
                // directory sync below; a crash before leaves an empty segment or the spare).
                self.storage.rename(&spare_path, &path).await.map_err(|e| {
                    Error::preparing(format!("renaming the spare to {}", path.display()), e)
                })?;
                let file = open_segment(&self.storage, &path, OpenMode::ReadWrite).await?;
                created.push((base, Rc::new(file)));
                continue;
            }
            // Nothing depends on a file that does not exist yet: ENOSPC here is clean.
            let file = self
                .storage
                .open(&path, OpenMode::CreateReadWrite, true)
                .await
                .map_err(|e| Error::preparing(format!("creating {}", path.display()), e))?;
            created.push((base, Rc::new(file)));
        }
        if !self.create.is_empty() {
            self.storage
                .sync_dir(&self.dir)
                .await
                .map_err(|e| Error::io(format!("syncing {}", self.dir.display()), e))?;
        }
        let file_of = |base: u64| -> Rc<S::File> {
            self.files
                .get(&base)
                .cloned()
                .or_else(|| created.iter().find(|(b, _)| *b == base).map(|(_, f)| Rc::clone(f)))
                .expect("every written segment has a file")
        };
        for reserve in &self.reserves {
            let Reserve { base_offset, from_bytes, to_bytes, needed } = *reserve;
            let result = match base_offset {
                Some(base) => {
                    file_of(base).allocate(from_bytes, to_bytes - from_bytes).await.map_err(|e| {
                        Error::preparing(
                            format!("reserving space in group {} segment", self.group),
                            e,
                        )
                    })
                }
                None => self.reserve_spare(&spare_path, from_bytes, to_bytes).await,
            };
            match result {
                Ok(()) => reserved.push((base_offset, to_bytes)),
                // The step ahead failed, but every write of this job lands in space already
                // ready: they go out, and the group reports storage full.
                Err(Error::StorageFull) if !needed => {
                    outcome.storage_full = true;
                    break;
                }
                Err(error) => return Err(error),
            }
        }
        let results = join_all(
            self.writes
                .iter()
                .map(|(base, position, bytes)| {
                    let file = file_of(*base);
                    let bytes = bytes.clone();
                    let position = *position;
                    let after = self
                        .after
                        .as_ref()
                        .filter(|tail| tail.overlaps(*base, position, bytes.len() as u64))
                        .map(|tail| Rc::clone(&tail.latch));
                    async move {
                        if let Some(latch) = after
                            && !cfg!(feature = "canary-tail-unordered")
                        {
                            latch.wait().await;
                        }
                        file.write_at(bytes, position).await
                    }
                })
                .collect(),
        )
        .await;
        for result in results {
            result.map_err(|e| Error::io(format!("writing group {} segment", self.group), e))?;
        }
        outcome.bytes_written = self.writes.iter().map(|(_, _, bytes)| bytes.len() as u64).sum();
        Ok(())
    }

    /// Creates the spare segment file if missing and reserves `[from, to)` in it. Its directory
    /// entry is not synced: a spare lost in a crash is simply made again.
    async fn reserve_spare(&self, path: &Path, from_bytes: u64, to_bytes: u64) -> Result<()> {
        let file = self
            .storage
            .open(path, OpenMode::CreateReadWrite, false)
            .await
            .map_err(|e| Error::preparing(format!("creating {}", path.display()), e))?;
        file.allocate(from_bytes, to_bytes - from_bytes)
            .await
            .map_err(|e| Error::preparing(format!("reserving space in {}", path.display()), e))
    }
}

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

impl<S: Storage> FlushDone<S> {
    /// The group the job wrote for.
    pub fn group(&self) -> u64 {
        self.job.group
    }

    /// Whether every step of the job succeeded.
    pub fn is_ok(&self) -> bool {
        self.result.is_ok()
    }
}

/// A checkpoint a group's written data allows.
pub struct CheckpointCandidate<S: Storage> {
    /// Where it lies.
    pub checkpoint: Checkpoint,
    /// The file to sync before recording it (None: that segment was synced when it rolled).
    pub file: Option<Rc<S::File>>,
    /// Rolled segments below it to settle first (None: every one is settled).
    pub settle: Option<SettleJob<S>>,
    /// The group's append count it stands for.
    pub appended_bytes: u64,
}

/// A read that must go to disk, owning what it needs so it runs without borrowing the log.
pub struct DiskRead<S: Storage> {
    storage: S,
    dir: PathBuf,
    cluster: u64,
    group: u64,
    record_size_bytes_max: usize,
    scan_window_bytes: usize,
    /// The segments to scan, in order.
    segments: Vec<PlannedSegment<S::File>>,
    bytes_max: usize,
    want: Want,
    /// The read stopped at the written end of the log: continue from the ring.
    continue_in_ring: bool,
    /// Held while the read may scan files: see `PartitionLog::disk_reads`.
    _in_flight: Rc<()>,
}

/// One segment a disk read scans.
struct PlannedSegment<F> {
    base_offset: u64,
    /// The open file, when the log holds one (else the read opens it by name).
    file: Option<Rc<F>>,
    start_bytes: u64,
    /// Where the bytes on file end (later ones are only in memory yet).
    written_end_bytes: u64,
}

/// What a read looks for first.
#[derive(Clone, Copy, Debug)]
enum Want {
    Offset(u64),
    Op(u64),
    Time(i64),
}

impl Want {
    fn accepts(&self, prepare: &StoredPrepare) -> bool {
        match *self {
            Want::Offset(offset) => prepare.end_offset() > offset,
            Want::Op(op) => prepare.op() >= op,
            Want::Time(time_ms) => prepare_of(&prepare.header).append_time_ms >= time_ms,
        }
    }
}

/// The result of a [`DiskRead`], to hand back to [`PartitionLog::finish_read`].
pub struct DiskReadDone {
    found: Vec<StoredPrepare>,
    reached_written_end: bool,
    bytes_max: usize,
    want: Want,
    result: Result<()>,
}

/// A read plan: served from memory already, or a disk read to run.
pub enum ReadPlan<S: Storage> {
    /// Served from the ring (or nothing to serve).
    Done(Vec<StoredPrepare>),
    /// Needs the disk: run it, then [`PartitionLog::finish_read`].
    Disk(DiskRead<S>),
}

impl<S: Storage> DiskRead<S> {
    /// Scans the planned segments, verifying every record's checksums.
    pub async fn run(self) -> DiskReadDone {
        let mut found = Vec::new();
        let mut reached_written_end = true;
        let result = self.run_inner(&mut found, &mut reached_written_end).await;
        DiskReadDone {
            found,
            reached_written_end,
            bytes_max: self.bytes_max,
            want: self.want,
            result,
        }
    }

    async fn run_inner(
        &self,
        found: &mut Vec<StoredPrepare>,
        reached_written_end: &mut bool,
    ) -> Result<()> {
        let mut bytes = 0usize;
        for planned in &self.segments {
            let path = self.dir.join(log_name(planned.base_offset));
            let opened;
            let file: &S::File = match &planned.file {
                Some(file) => file,
                None => match self.storage.open(&path, OpenMode::Read, true).await {
                    Ok(file) => {
                        opened = file;
                        &opened
                    }
                    // Retention removed it since the plan: the data is gone by policy.
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(error) => {
                        return Err(Error::io(format!("opening {}", path.display()), error));
                    }
                },
            };
            let mut scanner = Scanner::new(file, self.scan_window_bytes)
                .await
                .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
            let mut position = planned.start_bytes;
            while position < planned.written_end_bytes {
                if !found.is_empty() && bytes >= self.bytes_max {
                    // Full: the next record is not even decoded, so damage past what was asked
                    // for (a read by op wants one) is left for the read that wants it.
                    *reached_written_end = false;
                    return Ok(());
                }
                let record = scanner
                    .record_at(position, self.record_size_bytes_max)
                    .await
                    .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
                let header =
                    check_standalone(&record, self.cluster, self.group, self.record_size_bytes_max)
                        .map_err(|fault| {
                            Error::Corruption(Corruption {
                                file: path.clone(),
                                position_bytes: position,
                                offset: found.last().map(StoredPrepare::end_offset),
                                op: found.last().map(|prepare| prepare.op() + 1),
                                reason: fault.to_string(),
                            })
                        })?;
                position += u64::from(header.size);
                let prepare = StoredPrepare { header, record };
                if found.is_empty() && !self.want.accepts(&prepare) {
                    continue;
                }
                if !found.is_empty() && bytes + prepare.record.len() > self.bytes_max {
                    *reached_written_end = false;
                    return Ok(());
                }
                bytes += prepare.record.len();
                found.push(prepare);
            }
        }
        *reached_written_end = self.continue_in_ring;
        Ok(())
    }
}

impl<S: Storage> PartitionLog<S> {
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

    /// Whether the disk had no room for this log's space ahead of the tail (or for data it
    /// holds): it refuses appends that need more space than is ready (`StorageFull`) until a
    /// retried reservation succeeds. Reads, and writes of what it holds, go on.
    pub fn is_storage_full(&self) -> bool {
        self.storage_full
    }

    /// Lets the next flush try the reservation that failed for lack of space again. The caller
    /// paces the retries (the node layer: once per tick), so a full disk is not probed by every
    /// flush cycle.
    pub fn retry_storage_full(&mut self) {
        self.storage_retry = self.storage_full;
    }

    /// Whether a record of `size_bytes` appended now lands in the active segment's space that is
    /// already ready, padded tail block included.
    fn fits_ready_space(&self, size_bytes: usize) -> bool {
        self.segments.last().is_some_and(|active| {
            written_extent_end(active.end_bytes + size_bytes as u64) <= self.ready_end_of(active)
        })
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
        }
    }

    /// The op a damage cut was made at, while its ops may still be missing (0: none).
    pub fn damaged_from(&self) -> u64 {
        self.damaged_from
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

    /// Appends a prepare (header and body) that continues the chain: checks its header
    /// checksum, body length, group, op, parent and offset, copies it once into the write
    /// buffer and the ring, and rolls the segment when it would outgrow its size or age. The
    /// body's checksum is the caller's to vouch for (see `check_append`). Durable only after the
    /// shard's flush cycle reports it. Nothing changes when it fails.
    pub fn append(&mut self, header: &Header, body: &[u8]) -> Result<()> {
        self.check_serving()?;
        let encoded = header.encode();
        self.check_append(&encoded, header, body)?;
        let size = header.size as usize;
        let prepare = *prepare_of(header);
        let roll = self.segments.last().is_none_or(|active| {
            !active.is_empty()
                && (active.end_bytes + size as u64 > self.config.segment_size_bytes
                    || (self.config.segment_age_ms_max > 0
                        && prepare.append_time_ms.saturating_sub(active.first_append_ms)
                            >= self.config.segment_age_ms_max as i64))
        });
        // On a full disk only what fits the space already made ready is taken: it is sure to
        // be written. A roll needs new space: the spare segment's.
        let fits = if roll {
            // The new segment would take the spare's space, if any is ready.
            !self.spare_in_flight
                && self
                    .spare_ready_end_bytes
                    .is_some_and(|end| written_extent_end(size as u64) <= end)
        } else {
            self.fits_ready_space(size)
        };
        if self.storage_full && !fits {
            return Err(Error::StorageFull);
        }
        self.ring.reserve(size, self.written.op).map_err(|RingFull| {
            Error::LimitReached(format!(
                "group {}: prepare ring full of unwritten prepares",
                self.group
            ))
        })?;
        if roll {
            self.roll(prepare.base_offset, prepare.op)?;
        } else {
            self.ensure_chunk_room(size)?;
        }
        let chunk = self.chunks.back_mut().expect("ensured");
        let position = chunk.file_end_bytes();
        let record = chunk.append(&[&encoded, body]);
        self.ring.push(StoredPrepare { header: *header, record });
        let active = self.segments.last_mut().expect("a segment exists after roll");
        debug_assert_eq!(active.end_bytes, position);
        active.observe(header, position, self.shared.index_interval_bytes);
        self.head = Location {
            op: prepare.op,
            checksum: header.checksum_header,
            next_offset: prepare.end_offset(),
            segment_base_offset: active.base_offset,
            position_bytes: position,
            end_bytes: active.end_bytes,
        };
        self.next = self.next.after(header);
        self.appended_bytes += size as u64;
        Ok(())
    }

    /// Holds a prepare received from the primary ahead of its predecessors (a gap before it),
    /// in memory under a bound, until they arrive. A duplicate or stale op is ignored.
    pub fn hold(&mut self, header: &Header, body: &[u8]) -> Result<()> {
        self.check_serving()?;
        let prepare = *header.as_prepare().ok_or_else(|| Error::Invalid("not a prepare".into()))?;
        if prepare.op <= self.next.op || self.held.contains_key(&prepare.op) {
            return Ok(());
        }
        if self.held.len() >= self.shared.held_prepares_max {
            return Err(Error::LimitReached(format!(
                "group {}: {} out-of-order prepares already held",
                self.group,
                self.held.len()
            )));
        }
        header.verify_body(body).map_err(|e| Error::Invalid(e.to_string()))?;
        self.held.insert(prepare.op, (*header, Bytes::copy_from_slice(body)));
        Ok(())
    }

    /// The held prepare that continues the chain now, if any (taken out of the hold); held
    /// prepares the chain has passed are dropped.
    pub fn take_held_next(&mut self) -> Option<(Header, Bytes)> {
        let next_op = self.next.op;
        self.held.retain(|&op, _| op >= next_op);
        self.held.remove(&next_op)
    }

    /// Puts back a prepare taken by [`PartitionLog::take_held_next`] that could not be appended
    /// yet (backpressure).
    pub fn return_held(&mut self, header: Header, body: Bytes) {
        let op = prepare_of(&header).op;
        self.held.insert(op, (header, body));
    }

    /// Plans a read of the prepares containing `offset` and after it, up to `bytes_max` bytes of
    /// records (always at least one whole record when one exists).
    pub fn plan_read_offset(&self, offset: u64, bytes_max: usize) -> Result<ReadPlan<S>> {
        self.check_serving()?;
        if offset >= self.next.offset || offset < self.first_offset() {
            return Ok(ReadPlan::Done(Vec::new()));
        }
        if let Some(index) = self.ring.position_of_offset(offset) {
            return Ok(ReadPlan::Done(self.collect_ring(index, bytes_max, None)));
        }
        let segment = self.segments.partition_point(|segment| segment.base_offset <= offset) - 1;
        let position = self.segments[segment].index.position_for_offset(offset);
        Ok(self.plan_disk(segment, position, bytes_max, Want::Offset(offset)))
    }

    /// Plans a read of the prepare with this op.
    pub fn plan_read_op(&self, op: u64) -> Result<ReadPlan<S>> {
        self.check_serving()?;
        if op == 0 || op > self.head.op {
            return Ok(ReadPlan::Done(Vec::new()));
        }
        if let Some(prepare) = self.ring.by_op(op) {
            return Ok(ReadPlan::Done(vec![prepare.clone()]));
        }
        let segment = self.segments.partition_point(|segment| segment.first_op <= op);
        let Some(segment) = segment.checked_sub(1) else { return Ok(ReadPlan::Done(Vec::new())) };
        let position = self.segments[segment].index.position_for_op(op);
        Ok(self.plan_disk(segment, position, 1, Want::Op(op)))
    }

    /// Plans finding the first prepare appended at or after `time_ms`.
    pub fn plan_read_time(&self, time_ms: i64) -> Result<ReadPlan<S>> {
        self.check_serving()?;
        let segment = self.segments.partition_point(|segment| segment.last_append_ms < time_ms);
        if segment == self.segments.len() {
            return Ok(ReadPlan::Done(Vec::new()));
        }
        let position = self.segments[segment].index.position_for_time(time_ms);
        Ok(self.plan_disk(segment, position, 1, Want::Time(time_ms)))
    }

    fn plan_disk(
        &self,
        segment: usize,
        position: u64,
        bytes_max: usize,
        want: Want,
    ) -> ReadPlan<S> {
        let mut segments = Vec::new();
        let mut start = position;
        let mut continue_in_ring = true;
        for meta in &self.segments[segment..] {
            let written_end = self.written_end(meta);
            if written_end > start {
                segments.push(PlannedSegment {
                    base_offset: meta.base_offset,
                    file: self.files.get(&meta.base_offset).cloned(),
                    start_bytes: start,
                    written_end_bytes: written_end,
                });
            }
            if written_end < meta.end_bytes {
                break;
            }
            start = 0;
        }
        if segments.is_empty() {
            continue_in_ring = true;
        }
        ReadPlan::Disk(DiskRead {
            storage: self.storage.clone(),
            dir: self.dir.clone(),
            cluster: self.shared.cluster,
            group: self.group,
            record_size_bytes_max: self.config.record_size_bytes_max as usize,
            scan_window_bytes: self.shared.scan_window_bytes,
            segments,
            bytes_max,
            want,
            continue_in_ring,
            _in_flight: Rc::clone(&self.disk_reads),
        })
    }

    /// Completes a disk read: reports corruption (marking the log faulty: it refuses service
    /// rather than serve around damage) and read errors (the log keeps serving: nothing on disk
    /// changed), and continues from the ring where the disk part ended.
    pub fn finish_read(&mut self, done: DiskReadDone) -> Result<Vec<StoredPrepare>> {
        match done.result {
            Ok(()) => {}
            // Damage stops the log: serving around it could hand out a hole as the end.
            Err(error @ Error::Corruption(_)) => return Err(self.fail(error)),
            // A read that failed changed nothing on disk: the caller hears of it (never as
            // "absent") and may retry; the log keeps serving.
            Err(error) => return Err(error),
        }
        let mut found = done.found;
        if done.reached_written_end {
            let bytes: usize = found.iter().map(|prepare| prepare.record.len()).sum();
            let from_op = found.last().map_or(self.written.op + 1, |prepare| prepare.op() + 1);
            if let Some(first) = self.ring.first_op() {
                let limit = if matches!(done.want, Want::Op(_)) { 1 } else { usize::MAX };
                if found.len() < limit && from_op >= first {
                    let index = (from_op - first) as usize;
                    let want = found.is_empty().then_some(done.want);
                    let more = self.collect_ring(index, done.bytes_max.saturating_sub(bytes), want);
                    found.extend(more.into_iter().take(limit - found.len()));
                }
            }
        }
        if let Want::Op(op) = done.want {
            found.retain(|prepare| prepare.op() == op);
        }
        Ok(found)
    }

    /// Reads the prepares containing `offset` and after it (plan, run, finish in one call).
    pub async fn read_offset(
        &mut self,
        offset: u64,
        bytes_max: usize,
    ) -> Result<Vec<StoredPrepare>> {
        let plan = self.plan_read_offset(offset, bytes_max)?;
        self.complete(plan).await
    }

    /// Reads the prepare with this op (plan, run, finish in one call).
    pub async fn read_op(&mut self, op: u64) -> Result<Option<StoredPrepare>> {
        let plan = self.plan_read_op(op)?;
        Ok(self.complete(plan).await?.into_iter().next())
    }

    /// The offset of the first message appended at or after `time_ms`, if any.
    pub async fn offset_for_time(&mut self, time_ms: i64) -> Result<Option<u64>> {
        let plan = self.plan_read_time(time_ms)?;
        Ok(self.complete(plan).await?.first().map(StoredPrepare::base_offset))
    }

    async fn complete(&mut self, plan: ReadPlan<S>) -> Result<Vec<StoredPrepare>> {
        match plan {
            ReadPlan::Done(found) => Ok(found),
            ReadPlan::Disk(read) => {
                let done = read.run().await;
                self.finish_read(done)
            }
        }
    }

    /// Starts this group's part of a flush cycle: snapshots what was appended since the last job
    /// began and returns the job that writes it (None when nothing is pending, or when it cannot
    /// run beside the jobs in flight). Appends may continue while it runs; they go into the next
    /// job. Jobs may overlap — the device then always has writes queued, instead of draining at
    /// the end of every cycle — except that a job creating files or reserving space runs alone,
    /// and after a failure none starts until every job in flight has finished. Jobs must be
    /// finished in the order they began.
    ///
    /// With `write_all` (a checkpoint is wanted), everything appended is written whatever the
    /// group's batching, so that a checkpoint job can then sync and record it.
    pub fn begin_flush(&mut self, write_all: bool) -> Option<FlushJob<S>> {
        if self.faulty.is_some()
            || (self.flushes_in_flight > 0 && (self.flush_failed || self.exclusive_in_flight))
        {
            return None;
        }
        let retrying = self.storage_full && self.storage_retry;
        // A retry after a full disk writes everything pending, so that its reservation covers
        // whatever waits for space.
        let write_data =
            ((write_all || retrying) && self.has_unsubmitted()) || self.segment_write_due();
        if !(write_data || self.needs_ready()) {
            if retrying {
                // Nothing waits for space any more (a truncation took it): appends may try.
                self.storage_full = false;
                self.storage_retry = false;
            }
            return None;
        }
        let chunks = if write_data { self.chunks.len() } else { 0 };
        let create = self.files_to_create(chunks);
        // Every byte a job writes lies in space made ready first, so a data write cannot run out
        // of space; and space is made ready ahead of the tail in steps, so that running out of
        // it surfaces cleanly while the space already ready still takes the writes.
        let mut reserves = self.reservations(chunks, &create);
        if self.storage_full && !retrying {
            // Until the next retry, only writes that need no new space go out.
            if !write_data || reserves.iter().any(|reserve| reserve.needed) {
                return None;
            }
            reserves.clear();
        }
        let exclusive = !create.is_empty() || !reserves.is_empty();
        if exclusive && self.flushes_in_flight > 0 {
            return None;
        }
        if retrying {
            self.storage_retry = false;
            if reserves.is_empty() {
                // Nothing is left to make ready: appends may try the disk again.
                self.storage_full = false;
            }
        }
        let spare_for = create
            .iter()
            .copied()
            .find(|base| self.segment(*base).is_some_and(|meta| meta.from_spare));
        if reserves.iter().any(|reserve| reserve.base_offset.is_none()) {
            self.spare_in_flight = true;
        }
        let done = Rc::new(Latch::default());
        let after = self.tail_in_flight.clone().filter(|tail| !tail.latch.is_open());
        let mut writes = Vec::new();
        let mut chunk_marks = Vec::with_capacity(chunks);
        for index in 0..chunks {
            // A successor chunk in the same segment starts with this chunk's partial block.
            let successor_same_segment = self.chunks.get(index + 1).is_some_and(|next| {
                next.segment_base_offset == self.chunks[index].segment_base_offset
            });
            let chunk = &mut self.chunks[index];
            chunk_marks.push((chunk.id, chunk.filled()));
            // Every byte of it went to an earlier job (its tail block included): nothing to do.
            if !chunk.has_unsubmitted() {
                continue;
            }
            let with_tail = !successor_same_segment;
            let tail_bytes = if with_tail { chunk.tail_bytes() as u64 } else { 0 };
            for (position, bytes) in chunk.unsubmitted(with_tail) {
                // Large runs go out as several block-aligned pieces in flight at once.
                let mut start = 0;
                while start < bytes.len() {
                    let end = (start + WRITE_PIECE_BYTES).min(bytes.len());
                    writes.push((
                        chunk.segment_base_offset,
                        position + start as u64,
                        bytes.slice(start..end),
                    ));
                    start = end;
                }
            }
            if tail_bytes > 0 {
                let filled = chunk.filled() as u64;
                self.tail_in_flight = Some(TailWrite {
                    segment_base_offset: chunk.segment_base_offset,
                    position_bytes: chunk.file_base_bytes + filled
                        - filled % BLOCK_SIZE_BYTES as u64,
                    len_bytes: tail_bytes,
                    latch: Rc::clone(&done),
                });
            }
            chunk.mark_submitted(chunk.filled());
        }
        let (target, target_appended_bytes) = if write_data {
            (self.head, self.appended_bytes)
        } else {
            (self.submitted, self.submitted_appended_bytes)
        };
        self.submitted = target;
        self.submitted_appended_bytes = target_appended_bytes;
        self.flushes_in_flight += 1;
        self.exclusive_in_flight = exclusive;
        Some(FlushJob {
            storage: self.storage.clone(),
            dir: self.dir.clone(),
            group: self.group,
            create,
            files: self.files.clone(),
            writes,
            target,
            target_appended_bytes,
            chunk_marks,
            reserves,
            spare_for,
            done,
            after,
        })
    }

    /// The segments the first `chunks` write-buffer chunks write to that have no file yet.
    fn files_to_create(&self, chunks: usize) -> Vec<u64> {
        let mut create = Vec::new();
        for chunk in self.chunks.iter().take(chunks) {
            if !self.files.contains_key(&chunk.segment_base_offset)
                && !create.contains(&chunk.segment_base_offset)
            {
                create.push(chunk.segment_base_offset);
            }
        }
        create
    }

    /// The space a job writing the first `chunks` chunks must make ready, in the order it must
    /// do so: for every segment it writes, whatever of the written range is not ready yet
    /// (`needed`: usually nothing, except in a new segment or after a burst of more than half
    /// the step), then, when due, the step ahead of the active segment's tail.
    fn reservations(&self, chunks: usize, create: &[u64]) -> Vec<Reserve> {
        let mut reserves = Vec::new();
        let mut written_segments: Vec<u64> = Vec::new();
        for chunk in self.chunks.iter().take(chunks) {
            if chunk.has_unsubmitted() && !written_segments.contains(&chunk.segment_base_offset) {
                written_segments.push(chunk.segment_base_offset);
            }
        }
        // Written segments are the last few: look them up from the end, so a long log costs
        // nothing per cycle.
        for meta in written_segments.iter().filter_map(|base| self.segment(*base)) {
            let from = self.ready_end_of(meta);
            let to = written_extent_end(meta.end_bytes);
            if to > from {
                reserves.push(Reserve {
                    base_offset: Some(meta.base_offset),
                    from_bytes: from,
                    to_bytes: to,
                    needed: true,
                });
            }
        }
        if let Some(active) = self.segments.last()
            && (self.files.contains_key(&active.base_offset)
                || create.contains(&active.base_offset))
        {
            let data_end = written_extent_end(active.end_bytes);
            if self.ready_end_of(active) < self.ready_wanted_end_bytes(data_end) {
                let from = self.ready_end_of(active).max(data_end);
                let limit = self.segment_limit_bytes();
                let to = (data_end + self.shared.ready_ahead_bytes).min(limit).max(data_end);
                if to > from {
                    reserves.push(Reserve {
                        base_offset: Some(active.base_offset),
                        from_bytes: from,
                        to_bytes: to,
                        needed: false,
                    });
                }
            }
        }
        if self.spare_wanted() {
            reserves.push(Reserve {
                base_offset: None,
                from_bytes: self.spare_ready_end_bytes.unwrap_or(0),
                to_bytes: self.spare_target_bytes(),
                needed: false,
            });
        }
        reserves
    }

    /// How much space the spare segment file should have ready: a step, within one segment.
    fn spare_target_bytes(&self) -> u64 {
        self.shared.ready_ahead_bytes.min(self.segment_limit_bytes())
    }

    /// Whether the spare segment file should be made (more) ready now: once the active segment
    /// is within half a step of its end (its own space ahead can grow no further), or before
    /// the group's first segment.
    fn spare_wanted(&self) -> bool {
        let near_end = self.segments.last().is_none_or(|active| {
            let data_end = written_extent_end(active.end_bytes);
            data_end + self.shared.ready_ahead_bytes / 2 >= self.segment_limit_bytes()
        });
        near_end
            && !self.spare_in_flight
            && !self.spare_claimed
            && self.spare_ready_end_bytes.is_none_or(|end| end < self.spare_target_bytes())
    }

    /// The segment with this base offset, searched from the newest (callers ask for the last few).
    fn segment(&self, base_offset: u64) -> Option<&SegmentMeta> {
        self.segments.iter().rev().find(|meta| meta.base_offset == base_offset)
    }

    fn segment_mut(&mut self, base_offset: u64) -> Option<&mut SegmentMeta> {
        self.segments.iter_mut().rev().find(|meta| meta.base_offset == base_offset)
    }

    /// How far a segment's space is ready: reserved, or occupied by what is on file or being
    /// written by a job in flight (the padded tail block is always written whole).
    fn ready_end_of(&self, meta: &SegmentMeta) -> u64 {
        let on_file = self.end_on_file(meta, &self.submitted);
        meta.ready_end_bytes.max(written_extent_end(on_file))
    }

    /// Whether this cycle should write the segment data. A `replicated` group writes whatever is
    /// pending (the write is what makes it durable). A `persisted` group's prepares are durable
    /// in the shard journal, so its segment writes wait until a batch worth writing has gathered
    /// (or a chunk filled, a segment rolled, a checkpoint asks): the small synchronous cycles
    /// then carry one write, not two, and the segment gets large sequential writes.
    fn segment_write_due(&self) -> bool {
        if !self.has_unsubmitted() {
            return false;
        }
        match self.config.durability {
            Durability::Replicated => true,
            Durability::Persisted => {
                let unsubmitted = self.appended_bytes - self.submitted_appended_bytes;
                let batch = (self.shared.persisted_write_batch_bytes as u64)
                    .min(self.shared.ring_limits.bytes_max as u64 / 4);
                // A chunk other than the last one receiving appends is full.
                unsubmitted >= batch || self.chunks.iter().rev().skip(1).any(Chunk::has_unsubmitted)
            }
        }
    }

    /// Whether a flush would do anything for this group now (`write_all`: a checkpoint is
    /// wanted, so everything appended must be written).
    pub fn wants_flush(&self, write_all: bool) -> bool {
        if self.faulty.is_some() {
            return false;
        }
        if self.storage_full {
            if self.storage_retry {
                return true;
            }
            // Until the next retry, only writes that need no new space.
            let write_data = (write_all && self.has_unsubmitted()) || self.segment_write_due();
            let chunks = self.chunks.len();
            return write_data
                && !self
                    .reservations(chunks, &self.files_to_create(chunks))
                    .iter()
                    .any(|reserve| reserve.needed);
        }
        (write_all && self.has_unsubmitted()) || self.segment_write_due() || self.needs_ready()
    }

    /// Whether the written data allows a checkpoint past the durable one.
    pub fn has_checkpoint_candidate(&self) -> bool {
        self.faulty.is_none() && self.written.op > self.checkpoint.op
    }

    /// The checkpoint the written data allows, when it is past the durable one: the location,
    /// the file to sync before recording it (None when that segment was already synced when it
    /// rolled), the rolled segments below it to settle, and the append count it stands for.
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
        Some(CheckpointCandidate {
            checkpoint: self.written.checkpoint(),
            file: self.files.get(&written_base).cloned(),
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

    /// Marks the log fail-stop after an I/O failure the shard saw on its behalf (a checkpoint
    /// sync).
    pub fn fail_io(&mut self, error: Error) -> Error {
        self.fail(error)
    }

    /// Whether the space made ready ahead of the active segment's tail has fallen below half a
    /// step (or is unknown, after recovery).
    fn needs_ready(&self) -> bool {
        let active_behind = self.segments.last().is_some_and(|active| {
            self.files.contains_key(&active.base_offset)
                && self.ready_end_of(active)
                    < self.ready_wanted_end_bytes(written_extent_end(active.end_bytes))
        });
        active_behind || self.spare_wanted()
    }

    /// How far the active segment must be ready once its data reaches `data_end_bytes`: half
    /// the ready-ahead window past it, but never past the segment's end, which no reservation
    /// can pass (otherwise a segment near its end would want a flush every cycle until it rolls).
    fn ready_wanted_end_bytes(&self, data_end_bytes: u64) -> u64 {
        (data_end_bytes + self.shared.ready_ahead_bytes / 2).min(self.segment_limit_bytes())
    }

    /// How far a segment's file may reach: its size, padded tail and guard block included.
    fn segment_limit_bytes(&self) -> u64 {
        let block = BLOCK_SIZE_BYTES as u64;
        self.config.segment_size_bytes.next_multiple_of(block) + block
    }

    /// Marks every op past the head faulty rather than absent (the shard calls this when the
    /// journal lost a synced entry it cannot attribute).
    pub fn mark_suffix_faulty(&mut self) {
        self.faulty_ops.suffix_from = Some(self.next.op);
    }

    /// Applies a finished flush job (in the order the jobs began): what it wrote counts as
    /// written. Storage full (no room to create a segment or to make the job's space ready)
    /// leaves everything pending; no room for the step ahead leaves the job's writes done. Either
    /// way the log then refuses appends that need more space than is ready until a retried
    /// reservation succeeds (storage full is clean and retryable); any other failure is
    /// fail-stop.
    /// After a failure, the jobs that were in flight beside the failed one are void — their
    /// data is handed out again once all of them have finished.
    pub fn finish_flush(&mut self, done: FlushDone<S>) -> Result<WriteOutcome> {
        assert!(self.flushes_in_flight > 0, "finish without a flush in flight");
        self.flushes_in_flight -= 1;
        if self.flushes_in_flight == 0 {
            self.exclusive_in_flight = false;
            self.tail_in_flight = None;
        }
        let FlushDone { job, created, reserved, mut outcome, result } = done;
        for (base, file) in created {
            self.files.insert(base, file);
        }
        // Space made ready stays ready whatever became of the writes.
        for (base, end) in reserved.iter().copied() {
            match base {
                Some(base) => {
                    if let Some(meta) = self.segment_mut(base) {
                        meta.ready_end_bytes = meta.ready_end_bytes.max(end);
                    }
                }
                None => {
                    self.spare_ready_end_bytes =
                        Some(self.spare_ready_end_bytes.unwrap_or(0).max(end));
                }
            }
        }
        if job.reserves.iter().any(|reserve| reserve.base_offset.is_none()) {
            self.spare_in_flight = false;
        }
        if let Some(base) = job.spare_for {
            self.spare_claimed = false;
            let renamed = self.files.contains_key(&base);
            if let Some(meta) = self.segment_mut(base) {
                meta.from_spare = false;
                if !renamed {
                    // The rename did not happen: whatever became of the spare, this segment is
                    // created like any other, with no space of its own yet.
                    meta.ready_end_bytes = 0;
                }
            }
        }
        if self.flush_failed {
            self.flush_failed = self.flushes_in_flight > 0;
            self.check_serving()?;
            return Err(Error::StorageFull);
        }
        if let Err(error) = result {
            if matches!(error, Error::StorageFull) {
                self.storage_full = true;
            }
            self.flush_failed = self.flushes_in_flight > 0;
            self.submitted = self.written;
            self.submitted_appended_bytes = self.written_appended_bytes;
            for chunk in &mut self.chunks {
                chunk.reset_submitted();
            }
            return Err(self.fail(error));
        }
        if outcome.storage_full {
            self.storage_full = true;
        } else if !job.reserves.is_empty() {
            // Every reservation it asked for succeeded: the disk has room again.
            self.storage_full = false;
        }
        for chunk in &mut self.chunks {
            if let Some((_, mark)) = job.chunk_marks.iter().find(|(id, _)| *id == chunk.id) {
                chunk.mark_written(*mark);
            }
        }
        while self.chunks.len() > 1 && !self.chunks[0].has_unwritten() {
            let chunk = self.chunks.pop_front().expect("len > 1");
            self.shared.pool.borrow_mut().give_back(chunk);
        }
        assert!(job.target.op >= self.written.op, "flush jobs finish in the order they began");
        outcome.sealed = job.target.segment_base_offset != self.written.segment_base_offset;
        self.written = job.target;
        self.written_appended_bytes = job.target_appended_bytes;
        outcome.written_op = job.target.op;
        Ok(outcome)
    }

    /// Runs a whole flush of this log alone (begin, run, finish): for tests and tools; the shard
    /// runs many logs' jobs at once.
    pub async fn flush(&mut self) -> Result<WriteOutcome> {
        match self.begin_flush(false) {
            None => Ok(WriteOutcome { written_op: self.written.op, ..WriteOutcome::default() }),
            Some(job) => {
                let done = job.run().await;
                self.finish_flush(done)
            }
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
            self.flushes_in_flight == 0 && !self.has_unwritten(),
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
        if let Err(error) = self.truncate_files(op, location).await {
            return Err(self.fail(error));
        }
        self.ring.truncate_after(op);
        Ok(())
    }

    async fn truncate_files(&mut self, op: u64, location: Option<Location>) -> Result<()> {
        // Whole segments above the cut go.
        let keep = self.segments.partition_point(|segment| segment.first_op <= op);
        let removed: Vec<SegmentMeta> = self.segments.drain(keep..).collect();
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
        self.rewrite_window(base, block_start + 2 * block).await?;
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
            let by_age = self.config.retention_ms > 0
                && segment.last_append_ms < now_ms.saturating_sub(self.config.retention_ms as i64);
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
                self.remove_segment_files(segment.base_offset).await
            };
            if let Err(error) = result {
                return Err(self.fail(error));
            }
            if let Err(error) = self.storage.sync_dir(&self.dir).await {
                return Err(self.fail(Error::io("syncing group dir after retention", error)));
            }
        }
        Ok(delete)
    }

    /// Whether `segment`, which retention retires, may become the spare segment file:
    /// recycling is on, no job is making or taking a spare, no disk read is in flight, and any
    /// spare there is has less space ready (a fresh one only reserved space; the rename
    /// replaces it).
    fn may_recycle(&self, segment: &SegmentMeta) -> bool {
        self.shared.recycle_segments
            && self
                .spare_ready_end_bytes
                .is_none_or(|ready| ready < self.ready_in_file_bytes(segment.end_bytes))
            && !self.spare_in_flight
            && !self.spare_claimed
            && Rc::strong_count(&self.disk_reads) == 1
    }

    /// The space a spare file holding `bytes` has ready: its whole blocks, within a segment.
    fn ready_in_file_bytes(&self, bytes: u64) -> u64 {
        let block = BLOCK_SIZE_BYTES as u64;
        (bytes - bytes % block).min(self.segment_limit_bytes())
    }

    /// Makes a retired segment's file the spare segment file (its index goes): its blocks are
    /// already written, so the segment that takes it overwrites them, which costs a sync far
    /// less than filling fresh space does (DESIGN.md §3). Its old records stay until
    /// overwritten; writes keep zeros past the data ([`written_extent_end`]) and recovery
    /// zeroes whatever lies past the chain's end, so they are never taken for data.
    async fn recycle_segment(&mut self, segment: &SegmentMeta) -> Result<()> {
        let from = self.dir.join(log_name(segment.base_offset));
        let to = self.dir.join(SPARE_NAME);
        self.storage
            .rename(&from, &to)
            .await
            .map_err(|e| Error::io(format!("recycling {}", from.display()), e))?;
        self.remove_if_present(&self.dir.join(index_name(segment.base_offset))).await?;
        // Only whole blocks of what the segment held count: its file may be longer.
        self.spare_ready_end_bytes = Some(self.ready_in_file_bytes(segment.end_bytes));
        self.recycled_segments += 1;
        Ok(())
    }

    async fn remove_segment_files(&self, base_offset: u64) -> Result<()> {
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

    fn check_serving(&self) -> Result<()> {
        match &self.faulty {
            Some(reason) => Err(Error::Faulty { group: self.group, reason: reason.clone() }),
            None => Ok(()),
        }
    }

    /// Marks the log fail-stop and passes the error on; storage full stays retryable.
    fn fail(&mut self, error: Error) -> Error {
        if !matches!(error, Error::StorageFull) && self.faulty.is_none() {
            self.faulty = Some(error.to_string());
        }
        error
    }

    fn check_append(
        &self,
        encoded: &[u8; HEADER_SIZE],
        header: &Header,
        body: &[u8],
    ) -> Result<()> {
        let size = header.size as usize;
        if size > self.config.record_size_bytes_max as usize {
            return Err(Error::Invalid(format!(
                "record of {size} bytes exceeds record_size_bytes_max {}",
                self.config.record_size_bytes_max as usize
            )));
        }
        // Decode the very bytes that will be stored: what passes here passes recovery. The body's
        // checksum is the caller's to vouch for — it built the header over this body, or verified
        // the body on receipt — so the body is not read a second time (debug builds do).
        let decoded = Header::decode(encoded).map_err(|e| Error::Invalid(e.to_string()))?;
        if body.len() != header.body_size() {
            return Err(Error::Invalid(format!(
                "body of {} bytes, the header says {}",
                body.len(),
                header.body_size()
            )));
        }
        debug_assert!(header.verify_body(body).is_ok(), "an unverified body reached append");
        let prepare = decoded.as_prepare().ok_or_else(|| Error::Invalid("not a prepare".into()))?;
        if decoded.cluster != self.shared.cluster || prepare.group != self.group {
            return Err(Error::Invalid("prepare of another cluster or group".into()));
        }
        if prepare.op != self.next.op
            || prepare.parent != self.next.parent
            || prepare.base_offset != self.next.offset
        {
            return Err(Error::Invalid(format!(
                "prepare op {} (parent {:#x}, offset {}) does not continue the chain at op {} \
                 (parent {:#x}, offset {})",
                prepare.op,
                prepare.parent,
                prepare.base_offset,
                self.next.op,
                self.next.parent,
                self.next.offset
            )));
        }
        if self.fence.kills(prepare.op, decoded.view) {
            return Err(Error::Invalid(format!(
                "prepare op {} of view {} is behind the truncation fence",
                prepare.op, decoded.view
            )));
        }
        Ok(())
    }

    fn roll(&mut self, base_offset: u64, first_op: u64) -> Result<()> {
        let chunk = self
            .shared
            .pool
            .borrow_mut()
            .take(base_offset, 0, &[])
            .ok_or_else(|| Error::LimitReached("write buffer: every chunk is in use".into()))?;
        if let Some(active) = self.segments.last_mut() {
            active.sealed = true;
        }
        let mut meta = SegmentMeta::new(base_offset, first_op);
        if !self.spare_in_flight
            && let Some(ready_end_bytes) = self.spare_ready_end_bytes.take()
        {
            // The new segment takes the spare's space (the job creating it renames the spare).
            meta.from_spare = true;
            meta.ready_end_bytes = ready_end_bytes;
            self.spare_claimed = true;
        }
        self.segments.push(meta);
        self.chunks.push_back(chunk);
        self.tail_prefix.clear();
        Ok(())
    }

    /// Makes sure the chunk receiving appends has room for `size` more bytes.
    fn ensure_chunk_room(&mut self, size: usize) -> Result<()> {
        if self.chunks.back().is_some_and(|chunk| chunk.spare() >= size) {
            return Ok(());
        }
        let active = self.segments.last().expect("a segment exists");
        let end = active.end_bytes;
        let block = BLOCK_SIZE_BYTES as u64;
        let block_start = end - end % block;
        let prefix: Vec<u8> = match self.chunks.back() {
            Some(chunk) if chunk.segment_base_offset == active.base_offset => {
                let start = (block_start - chunk.file_base_bytes) as usize;
                chunk.view(start, (end - block_start) as usize).to_vec()
            }
            _ => self.tail_prefix.clone(),
        };
        debug_assert_eq!(prefix.len() as u64, end - block_start);
        let mut pool = self.shared.pool.borrow_mut();
        if size + BLOCK_SIZE_BYTES > pool.chunk_size_bytes() {
            return Err(Error::Invalid(format!(
                "record of {size} bytes exceeds the write-buffer chunk"
            )));
        }
        let chunk = pool
            .take(active.base_offset, block_start, &prefix)
            .ok_or_else(|| Error::LimitReached("write buffer: every chunk is in use".into()))?;
        if self.chunks.back().is_some_and(|previous| !previous.has_unwritten()) {
            let previous = self.chunks.pop_back().expect("checked");
            pool.give_back(previous);
        }
        self.chunks.push_back(chunk);
        Ok(())
    }

    /// Ring entries from `index`: skipping those `want` rejects (until the first it accepts),
    /// then up to `bytes_max` bytes, at least one.
    fn collect_ring(
        &self,
        mut index: usize,
        bytes_max: usize,
        want: Option<Want>,
    ) -> Vec<StoredPrepare> {
        let mut out: Vec<StoredPrepare> = Vec::new();
        let mut bytes = 0;
        while let Some(prepare) = self.ring.get(index) {
            index += 1;
            if out.is_empty() && want.is_some_and(|want| !want.accepts(prepare)) {
                continue;
            }
            if !out.is_empty() && bytes + prepare.record.len() > bytes_max {
                break;
            }
            bytes += prepare.record.len();
            out.push(prepare.clone());
        }
        out
    }

    /// How far a segment's bytes are on file (the rest is only in memory).
    fn written_end(&self, segment: &SegmentMeta) -> u64 {
        self.end_on_file(segment, &self.written)
    }

    /// How far a segment's bytes reach once everything up to `upto` is on file.
    fn end_on_file(&self, segment: &SegmentMeta, upto: &Location) -> u64 {
        use std::cmp::Ordering;
        match segment.base_offset.cmp(&upto.segment_base_offset) {
            Ordering::Less => segment.end_bytes,
            Ordering::Equal if upto.op > 0 => upto.end_bytes,
            _ => 0,
        }
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

/// Opens a segment file for direct I/O, naming it in the error.
async fn open_segment<S: Storage>(storage: &S, path: &Path, mode: OpenMode) -> Result<S::File> {
    storage
        .open(path, mode, true)
        .await
        .map_err(|e| Error::io(format!("opening {}", path.display()), e))
}

/// A prepare found in the shard journal for this group, for replay at recovery.
#[derive(Clone, Debug)]
pub struct JournalPrepare {
    /// The journal entry's sequence number.
    pub seq: u64,
    /// The prepare's header.
    pub header: Header,
    /// The whole record (header and body).
    pub record: Bytes,
}

impl<S: Storage> PartitionLog<S> {
    /// Creates the directory of a new, empty group log (durably: the parent directory is
    /// synced). The shard records the group's slot in the superblock before appending.
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
        if let Some(parent) = dir.parent() {
            storage
                .sync_dir(parent)
                .await
                .map_err(|e| Error::io(format!("syncing {}", parent.display()), e))?;
        }
        Ok(Self::empty(storage, shared, dir, slot, config))
    }

    fn empty(
        storage: S,
        shared: Rc<Shared>,
        dir: PathBuf,
        slot: GroupSlot,
        config: GroupConfig,
    ) -> Self {
        let ring = PrepareRing::new(shared.ring_limits, shared.ring_budget.clone());
        let cluster = shared.cluster;
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
            view: slot.view,
            log_view: slot.log_view,
            log_view_head_op: slot.log_view_head_op,
            checkpoint: slot.checkpoint,
            appended_bytes: 0,
            written_appended_bytes: 0,
            submitted_appended_bytes: 0,
            checkpoint_appended_bytes: 0,
            flushes_in_flight: 0,
            exclusive_in_flight: false,
            flush_failed: false,
            tail_in_flight: None,
            truncation: None,
            storage_full: false,
            storage_retry: false,
            spare_ready_end_bytes: None,
            spare_in_flight: false,
            spare_claimed: false,
            disk_reads: Rc::new(()),
            recycled_segments: 0,
            faulty: None,
            faulty_ops: FaultyOps::default(),
            damaged_from: slot.damaged_from,
            retention_floor_offset: u64::MAX,
            committed_end_offset: u64::MAX,
        }
    }

    /// Recovers a group's log (DESIGN.md §3 Recovery): loads or rebuilds the indexes of synced
    /// segments, checks the checkpoint record, scans forward from it through the torn window,
    /// cuts the torn tail, replays journal prepares past it, and reports what it found. Damage
    /// before the window leaves the log faulty (refusing service), never truncated.
    pub async fn recover(
        storage: S,
        shared: Rc<Shared>,
        dir: PathBuf,
        slot: GroupSlot,
        config: GroupConfig,
        journal: &[JournalPrepare],
    ) -> Result<(Self, GroupRecovery)> {
        let mut log = Self::empty(storage, shared, dir, slot, config);
        let mut report = GroupRecovery { group: slot.group, ..GroupRecovery::default() };
        let mut outcome = log.recover_segments(&slot, &mut report, false).await;
        if cfg!(feature = "canary-truncate-corruption")
            && matches!(outcome, Err(Error::Corruption(_)))
        {
            // Canary (DESIGN.md §7): forget that the damage lies before the torn window and cut
            // the log at the first invalid record, as if it were a torn tail.
            let forgetful = GroupSlot { checkpoint: Checkpoint::default(), ..slot };
            let (storage, shared, dir) =
                (log.storage.clone(), Rc::clone(&log.shared), log.dir.clone());
            log = Self::empty(storage, shared, dir, forgetful, config);
            report = GroupRecovery { group: slot.group, ..GroupRecovery::default() };
            outcome = log.recover_segments(&forgetful, &mut report, true).await;
        }
        match outcome {
            Ok(()) => {}
            Err(Error::Corruption(corruption)) => {
                log.faulty = Some(corruption.to_string());
                report.corruption = Some(corruption);
                report.head_op = log.head.op;
                return Ok((log, report));
            }
            Err(error) => return Err(error),
        }
        // Replay the journal past the segments' end (persisted groups). Entries come in op
        // order, the newest view first: a later view's prepare of an op supersedes an older
        // one, and one the fence killed is dead.
        for entry in journal {
            let op = prepare_of(&entry.header).op;
            if op < log.next.op || log.fence.kills_journal_entry(op, entry.header.view, entry.seq) {
                continue;
            }
            let record_max = log.config.record_size_bytes_max as usize;
            // The fence judged the entry above (by its journal position, not the segment rule).
            let no_fence = Fence::default();
            if op > log.next.op
                || check_next(&entry.record, &log.next, &no_fence, record_max).is_err()
            {
                // A synced prepare is missing (or does not connect) before this one: what
                // follows may have been acknowledged, so it is faulty rather than absent.
                log.faulty_ops.suffix_from = Some(log.next.op);
                break;
            }
            let body = &entry.record[HEADER_SIZE..];
            match log.append(&entry.header, body) {
                Ok(()) => {}
                // The journal may hold more of this group than its ring keeps unwritten (the
                // segment writes a power loss took): write what was replayed so far to the
                // segment, which frees the ring, and go on. The journal keeps it durable until
                // the checkpoint that open asks for after a replay passes it.
                Err(Error::LimitReached(_)) => {
                    log.write_replayed().await?;
                    log.append(&entry.header, body)?;
                }
                Err(error) => return Err(error),
            }
            report.journal_replayed += 1;
        }
        if log.damaged_from != 0 {
            // A damage cut whose ops the replica has not all had back yet: whatever the log
            // lacks past its head may have been acknowledged (DESIGN.md §3).
            let from = log.faulty_ops.suffix_from.map_or(log.next.op, |f| f.min(log.next.op));
            log.faulty_ops.suffix_from = Some(from);
        }
        report.head_op = log.head.op;
        report.faulty = log.faulty_ops.clone();
        Ok((log, report))
    }

    /// Writes every appended prepare to the segment files (no sync), during recovery's journal
    /// replay: the flush cycles that would otherwise write them do not run before open returns.
    async fn write_replayed(&mut self) -> Result<()> {
        // Each job writes what is pending; one that only makes space ready comes first.
        for _ in 0..8 {
            let Some(job) = self.begin_flush(true) else { break };
            let done = job.run().await;
            self.finish_flush(done)?;
            if !self.has_unwritten() {
                return Ok(());
            }
        }
        if self.has_unwritten() {
            return Err(Error::Invalid(format!(
                "group {}: replayed prepares could not be written during recovery",
                self.group
            )));
        }
        Ok(())
    }

    /// Protocol-aware recovery of a damaged log (DESIGN.md §3), for a group whose replica has
    /// peers to fetch from: where [`PartitionLog::recover`] found damage before the torn window
    /// (or a read found it later), this recovers again trusting nothing but the chain itself.
    /// It scans every segment from the first record, ends the chain at the first record that is
    /// not valid, zeroes everything past it and removes later segments (durably: synced), and
    /// returns a log whose checkpoint is at most the chain's new end and whose slot carries the
    /// durable marker [`GroupSlot::damaged_from`]: every op past the head is faulty, not absent,
    /// until the replica has it back. The caller writes the slot to the superblock before it
    /// appends anything. Journal prepares are not replayed: whatever they held lies past the
    /// cut, in the faulty suffix.
    ///
    /// A crash part-way is safe: until the superblock holds the new slot, its old checkpoint
    /// names a record that is now zeros or in a removed segment, so the next open finds damage
    /// again and cuts again, at the same place.
    ///
    /// `head_op_known` is the head the log had before (0 when unknown): a chain ending below it
    /// or below the old checkpoint lost ops, whatever the bytes there look like.
    ///
    /// When the log's very first record is damaged and retention (or a state transfer) removed
    /// what came before it, the chain cannot be continued from anything: the log is cut to
    /// empty, positioned at op 1 and offset 0, with every op faulty (`damaged_from` 1). Its
    /// replica fetches the ops again from peers that hold them from op 1, or takes a state
    /// transfer (`Shard::install_transfer` accepts any op above the empty log's head).
    pub async fn recover_cut(
        storage: S,
        shared: Rc<Shared>,
        dir: PathBuf,
        slot: GroupSlot,
        config: GroupConfig,
        head_op_known: u64,
    ) -> Result<(Self, GroupRecovery)> {
        let forgetful = GroupSlot { checkpoint: Checkpoint::default(), ..slot };
        let mut log = Self::empty(storage, shared, dir, forgetful, config);
        let mut report = GroupRecovery { group: slot.group, ..GroupRecovery::default() };
        log.recover_segments(&forgetful, &mut report, true).await?;
        report.cut = report.torn_tail.take();
        let old = slot.checkpoint;
        log.checkpoint = if old.op != 0 && old.op <= log.head.op {
            // The damage lay past the old checkpoint, which still names a record of the chain.
            old
        } else if log.head.op > 0 {
            // Everything up to the old checkpoint was synced, the new end with it.
            log.head.checkpoint()
        } else {
            Checkpoint::default()
        };
        // Something was cut: a record that is not valid, or a chain that ends before a record
        // the log is known to have held (zeros where data was, a missing segment). A read
        // that merely failed cuts nothing and leaves no faulty suffix behind.
        let cut = report.cut.is_some() || log.head.op < old.op.max(head_op_known);
        // Canary (DESIGN.md §7): the cut forgets that the ops past it were there at all, so the
        // replica may nack an op it acknowledged.
        if cut && !cfg!(feature = "canary-truncate-faulty") {
            log.damaged_from = log.next.op;
        }
        if log.damaged_from != 0 {
            log.faulty_ops.suffix_from = Some(log.next.op);
        }
        report.head_op = log.head.op;
        report.faulty = log.faulty_ops.clone();
        Ok((log, report))
    }

    async fn recover_segments(
        &mut self,
        slot: &GroupSlot,
        report: &mut GroupRecovery,
        canary_truncate: bool,
    ) -> Result<()> {
        let checkpoint = slot.checkpoint;
        let names = match self.storage.list_dir(&self.dir).await {
            Ok(names) => names,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound && checkpoint.op == 0 => {
                self.storage
                    .create_dir_all(&self.dir)
                    .await
                    .map_err(|e| Error::io("creating group dir", e))?;
                if let Some(parent) = self.dir.parent() {
                    self.storage
                        .sync_dir(parent)
                        .await
                        .map_err(|e| Error::io("syncing shard dir", e))?;
                }
                return Ok(());
            }
            Err(error) => return Err(Error::io(format!("listing {}", self.dir.display()), error)),
        };
        // Staged files of a state transfer that never reached its commit point: the shard rolls
        // a committed one forward before it recovers the group, so any found here are such.
        crate::transfer::remove_leftovers(&self.storage, &self.dir, &names).await?;
        let bases: Vec<u64> = names.iter().filter_map(|name| parse_log_name(name)).collect();
        if checkpoint.op > 0 && !bases.contains(&checkpoint.segment_base_offset) {
            return Err(Error::Corruption(Corruption {
                file: self.dir.join(log_name(checkpoint.segment_base_offset)),
                position_bytes: 0,
                offset: Some(checkpoint.next_offset),
                op: Some(checkpoint.op),
                reason: "the checkpoint's segment is missing".into(),
            }));
        }
        let record_max = self.config.record_size_bytes_max as usize;
        let window = self.shared.scan_window_bytes;
        let interval = self.shared.index_interval_bytes;

        // Segments before the checkpoint's are synced: take their index when it is sound, else
        // rebuild it by scanning (any damage found is corruption).
        let synced: Vec<u64> = bases
            .iter()
            .copied()
            .filter(|&base| checkpoint.op > 0 && base < checkpoint.segment_base_offset)
            .collect();
        for base in &synced {
            let meta = self.load_synced_segment(*base, &names, report).await?;
            self.segments.push(meta);
        }
        for pair in self.segments.windows(2) {
            if pair[0].next_offset != pair[1].base_offset {
                return Err(Error::Corruption(Corruption {
                    file: self.dir.join(log_name(pair[1].base_offset)),
                    position_bytes: 0,
                    offset: Some(pair[0].next_offset),
                    op: None,
                    reason: format!(
                        "segments leave a gap: {} ends at offset {}",
                        log_name(pair[0].base_offset),
                        pair[0].next_offset
                    ),
                }));
            }
        }

        // The checkpoint's segment and every later one: the torn window starts at the
        // checkpoint record.
        let window_bases: Vec<u64> = bases
            .iter()
            .copied()
            .filter(|&base| checkpoint.op == 0 || base >= checkpoint.segment_base_offset)
            .collect();
        let mut next = ChainNext {
            cluster: self.shared.cluster,
            group: self.group,
            op: 1,
            parent: 0,
            offset: 0,
        };
        let mut start_position = 0;
        let mut start_index = SegmentIndex::default();
        let mut start_meta_from_checkpoint = false;
        if checkpoint.op > 0 {
            let base = checkpoint.segment_base_offset;
            let path = self.dir.join(log_name(base));
            let file = open_segment(&self.storage, &path, OpenMode::Read).await?;
            let mut scanner =
                Scanner::new(&file, window).await.map_err(|e| Error::io("reading", e))?;
            let record = scanner
                .record_at(checkpoint.position_bytes, record_max)
                .await
                .map_err(|e| Error::io("reading", e))?;
            let checked = check_standalone(&record, self.shared.cluster, self.group, record_max);
            match checked {
                Ok(header)
                    if header.checksum_header == checkpoint.checksum
                        && prepare_of(&header).op == checkpoint.op =>
                {
                    next = ChainNext {
                        cluster: self.shared.cluster,
                        group: self.group,
                        op: checkpoint.op + 1,
                        parent: checkpoint.checksum,
                        offset: checkpoint.next_offset,
                    };
                    start_position = checkpoint.position_bytes + u64::from(header.size);
                    self.head = Location {
                        op: checkpoint.op,
                        checksum: checkpoint.checksum,
                        next_offset: checkpoint.next_offset,
                        segment_base_offset: base,
                        position_bytes: checkpoint.position_bytes,
                        end_bytes: start_position,
                    };
                    // The index of the synced part of this segment: from its file or rebuilt.
                    start_index =
                        self.index_up_to(base, &names, &file, start_position, report).await?;
                    start_meta_from_checkpoint = true;
                }
                other => {
                    let reason = match other {
                        Ok(_) => {
                            "the checkpoint record is not the one the superblock names".to_string()
                        }
                        Err(fault) => format!("the checkpoint record is damaged: {fault}"),
                    };
                    return Err(Error::Corruption(Corruption {
                        file: path,
                        position_bytes: checkpoint.position_bytes,
                        offset: None,
                        op: Some(checkpoint.op),
                        reason,
                    }));
                }
            }
        }

        let mut chain_ended = false;
        let mut first_in_window = true;
        let mut leftover = Vec::new();
        for base in window_bases {
            if chain_ended {
                leftover.push(base);
                continue;
            }
            let path = self.dir.join(log_name(base));
            let file = open_segment(&self.storage, &path, OpenMode::Read).await?;
            let mut scanner =
                Scanner::new(&file, window).await.map_err(|e| Error::io("reading", e))?;
            let mut position = if first_in_window { start_position } else { 0 };
            if !first_in_window || !start_meta_from_checkpoint {
                // A segment after the checkpoint's must begin with the chain's next record, and
                // a fresh log with op 1; anything else means the chain ended before it.
                let record =
                    scanner.record_at(0, record_max).await.map_err(|e| Error::io("reading", e))?;
                let begins = if checkpoint.op == 0 && first_in_window && canary_truncate {
                    check_standalone(&record, self.shared.cluster, self.group, record_max)
                        .map(|header| {
                            let prepare = prepare_of(&header);
                            next = ChainNext {
                                cluster: self.shared.cluster,
                                group: self.group,
                                op: prepare.op,
                                parent: prepare.parent,
                                offset: prepare.base_offset,
                            };
                        })
                        .is_ok()
                } else {
                    check_next(&record, &next, &self.fence, record_max).is_ok()
                };
                // The first record of a log whose beginning retention (or a state transfer)
                // removed ends the chain too: nothing before it is kept, so the log is cut to
                // empty, at op 1, every op faulty. Its replica gets the ops back from peers
                // that still hold them from op 1, or else takes a state transfer, which only
                // needs a log below the transferred op.
                if !begins {
                    chain_ended = true;
                    leftover.push(base);
                    continue;
                }
            }
            let mut meta = SegmentMeta::new(base, next.op);
            if first_in_window && start_meta_from_checkpoint {
                meta.index = std::mem::take(&mut start_index);
                meta.end_bytes = start_position;
                meta.next_offset = next.offset;
                if let Some(first) = meta.index.entries().first() {
                    meta.first_op = first.op;
                    meta.first_append_ms = first.append_time_ms;
                    meta.last_append_ms =
                        meta.index.entries().last().map_or(i64::MIN, |e| e.append_time_ms);
                }
            }
            first_in_window = false;
            loop {
                let record = scanner
                    .record_at(position, record_max)
                    .await
                    .map_err(|e| Error::io("reading", e))?;
                match check_next(&record, &next, &self.fence, record_max) {
                    Ok(header) => {
                        meta.observe(&header, position, interval);
                        self.head = Location {
                            op: prepare_of(&header).op,
                            checksum: header.checksum_header,
                            next_offset: next.after(&header).offset,
                            segment_base_offset: base,
                            position_bytes: position,
                            end_bytes: position + u64::from(header.size),
                        };
                        next = next.after(&header);
                        position += u64::from(header.size);
                        report.records_scanned += 1;
                    }
                    Err(fault) => {
                        if !matches!(fault, RecordFault::Zeroed) {
                            report.torn_tail = Some((path.clone(), position, fault.to_string()));
                        }
                        break;
                    }
                }
            }
            if meta.first_op == 0 || meta.is_empty() {
                meta.first_op = next.op;
            }
            self.segments.push(meta);
        }
        // A torn tail in a `replicated` group may have held acknowledged ops (DESIGN.md §3).
        if report.torn_tail.is_some() && self.config.durability == Durability::Replicated {
            self.faulty_ops.suffix_from = Some(next.op);
        }
        // Segments past the chain's end are torn-window leftovers: never synced as part of the
        // chain, so they go.
        for base in &leftover {
            self.remove_segment_files(*base).await?;
        }
        if !leftover.is_empty() {
            self.storage
                .sync_dir(&self.dir)
                .await
                .map_err(|e| Error::io("syncing group dir", e))?;
        }
        // Drop empty segments at the end (created, never written), except one that the chain
        // names by the checkpoint.
        while self.segments.len() > 1 && self.segments.last().is_some_and(|meta| meta.is_empty()) {
            let meta = self.segments.pop().expect("checked");
            self.remove_segment_files(meta.base_offset).await?;
        }
        if self.segments.last().is_some_and(SegmentMeta::is_empty) {
            let meta = self.segments.pop().expect("checked");
            self.remove_segment_files(meta.base_offset).await?;
        }
        let count = self.segments.len();
        for (index, meta) in self.segments.iter_mut().enumerate() {
            meta.sealed = index + 1 < count;
            // Segments whose index file was sound stay settled; the rest (rebuilt indexes, and
            // sealed segments from the torn window) are synced and get their index written by
            // the next flush.
            meta.settled = meta.sealed && meta.settled;
        }
        self.next = next;
        self.written = self.head;
        self.submitted = self.head;
        // The torn window is rewritten before anything new is appended: whatever survived past
        // the chain's end in a segment of the window becomes zeros, durably.
        let window: Vec<(u64, u64)> = self
            .segments
            .iter()
            .filter(|meta| checkpoint.op == 0 || meta.base_offset >= checkpoint.segment_base_offset)
            .map(|meta| (meta.base_offset, meta.end_bytes))
            .collect();
        for (base, end) in window {
            self.rewrite_window(base, end).await?;
        }
        if let Some(active) = self.segments.last() {
            let path = self.dir.join(log_name(active.base_offset));
            let file = open_segment(&self.storage, &path, OpenMode::ReadWrite).await?;
            let end = active.end_bytes;
            let block_start = end - end % BLOCK_SIZE_BYTES as u64;
            let mut scanner =
                Scanner::new(&file, BLOCK_SIZE_BYTES).await.map_err(|e| Error::io("reading", e))?;
            self.tail_prefix = scanner
                .bytes_at(block_start, (end - block_start) as usize)
                .await
                .map_err(|e| Error::io("reading", e))?
                .to_vec();
            // Its reservation is unknown (`ready_end_bytes` 0): the first flush reserves again.
            self.files.insert(active.base_offset, Rc::new(file));
        }
        if names.iter().any(|name| name == SPARE_NAME) {
            self.adopt_spare().await?;
        }
        Ok(())
    }

    /// A spare segment file left by the previous run is reused (reserving again over what it
    /// holds costs no new space, which matters on a full disk). One that is not empty is a
    /// recycled segment: its whole blocks count as ready, or, with recycling off, it goes.
    async fn adopt_spare(&mut self) -> Result<()> {
        let path = self.dir.join(SPARE_NAME);
        let file = self
            .storage
            .open(&path, OpenMode::Read, false)
            .await
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let size = file.size_bytes().await.map_err(|e| Error::io("sizing the spare", e))?;
        if size == 0 || self.shared.recycle_segments {
            self.spare_ready_end_bytes = Some(self.ready_in_file_bytes(size));
            return Ok(());
        }
        self.storage
            .remove_file(&path)
            .await
            .map_err(|e| Error::io(format!("removing {}", path.display()), e))
    }

    /// Overwrites a segment's bytes past `end` (the chain's end) with zeros and syncs, when
    /// anything lies there.
    async fn rewrite_window(&self, base: u64, end: u64) -> Result<()> {
        let path = self.dir.join(log_name(base));
        let file = open_segment(&self.storage, &path, OpenMode::ReadWrite).await?;
        let size = file.size_bytes().await.map_err(|e| Error::io("sizing a segment", e))?;
        if size <= end {
            return Ok(());
        }
        let block = BLOCK_SIZE_BYTES as u64;
        let block_start = end - end % block;
        let mut scanner =
            Scanner::new(&file, BLOCK_SIZE_BYTES).await.map_err(|e| Error::io("reading", e))?;
        let prefix = scanner
            .bytes_at(block_start, (end - block_start) as usize)
            .await
            .map_err(|e| Error::io("reading", e))?;
        let mut first = AlignedBuf::zeroed(BLOCK_SIZE_BYTES, BLOCK_SIZE_BYTES);
        first.extend_from_slice(&prefix);
        first.set_len(BLOCK_SIZE_BYTES);
        let rewrite =
            |error| Error::io(format!("rewriting the torn window of {}", path.display()), error);
        file.write_at(first.freeze(), block_start).await.map_err(rewrite)?;
        let mut position = block_start + block;
        let stop = size.next_multiple_of(block);
        // A recycled segment file holds up to a whole retired segment past the chain's end:
        // zeroing it by metadata where the filesystem can costs no writes.
        if position < stop && file.zero_range(position, stop - position).await.map_err(rewrite)? {
            position = stop;
        }
        while position < stop {
            let len = (stop - position).min(self.shared.zeros.len() as u64) as usize;
            file.write_at(self.shared.zeros.slice(..len), position).await.map_err(rewrite)?;
            position += len as u64;
        }
        file.sync_data().await.map_err(rewrite)
    }
}

impl<S: Storage> PartitionLog<S> {
    /// Opens a synced segment (before the checkpoint's): its index file when sound, else an
    /// index rebuilt by scanning it, where any damage is corruption.
    async fn load_synced_segment(
        &self,
        base: u64,
        names: &[String],
        report: &mut GroupRecovery,
    ) -> Result<SegmentMeta> {
        if names.iter().any(|name| *name == index_name(base)) {
            let path = self.dir.join(index_name(base));
            if let Some((index, summary)) = self.read_index_file(&path).await {
                let mut meta = SegmentMeta::new(base, index.entries().first().map_or(0, |e| e.op));
                meta.first_append_ms =
                    index.entries().first().map_or(i64::MIN, |e| e.append_time_ms);
                meta.index = index;
                meta.end_bytes = summary.covered_bytes;
                meta.next_offset = summary.next_offset;
                meta.last_op = summary.last_op;
                meta.last_append_ms = summary.last_append_ms;
                meta.settled = true;
                return Ok(meta);
            }
        }
        report.indexes_rebuilt += 1;
        let path = self.dir.join(log_name(base));
        let file = open_segment(&self.storage, &path, OpenMode::Read).await?;
        let (meta, fault) = self.scan_synced(&file, base, u64::MAX).await?;
        if let Some((position, fault)) = fault {
            // The segment was synced whole: only zeros may follow its last record.
            if !matches!(fault, RecordFault::Zeroed) {
                return Err(Error::Corruption(Corruption {
                    file: path,
                    position_bytes: position,
                    offset: Some(meta.next_offset),
                    op: Some(meta.last_op + 1),
                    reason: fault.to_string(),
                }));
            }
        }
        Ok(meta)
    }

    /// The index of `[0, end)` of the checkpoint's segment: from its file when it covers that
    /// far, else rebuilt by scanning (the region is synced, so damage is corruption).
    async fn index_up_to(
        &self,
        base: u64,
        names: &[String],
        file: &S::File,
        end: u64,
        report: &mut GroupRecovery,
    ) -> Result<SegmentIndex> {
        if names.iter().any(|name| *name == index_name(base)) {
            let path = self.dir.join(index_name(base));
            if let Some((mut index, summary)) = self.read_index_file(&path).await
                && summary.covered_bytes >= end
            {
                index.truncate(end);
                return Ok(index);
            }
        }
        report.indexes_rebuilt += 1;
        let (meta, fault) = self.scan_synced(file, base, end).await?;
        if meta.end_bytes < end {
            let (position, reason) = fault
                .map_or((meta.end_bytes, "ends early".to_string()), |(p, f)| (p, f.to_string()));
            return Err(Error::Corruption(Corruption {
                file: self.dir.join(log_name(base)),
                position_bytes: position,
                offset: Some(meta.next_offset),
                op: Some(meta.last_op + 1),
                reason,
            }));
        }
        Ok(meta.index)
    }

    /// Scans a synced segment from its start up to `end` (or its first invalid record), with the
    /// chain taken from its first record.
    async fn scan_synced(
        &self,
        file: &S::File,
        base: u64,
        end: u64,
    ) -> Result<(SegmentMeta, Option<(u64, RecordFault)>)> {
        let record_max = self.config.record_size_bytes_max as usize;
        let mut scanner = Scanner::new(file, self.shared.scan_window_bytes)
            .await
            .map_err(|e| Error::io("reading", e))?;
        let mut meta = SegmentMeta::new(base, 0);
        let mut position = 0;
        let mut next: Option<ChainNext> = None;
        while position < end {
            let record = scanner
                .record_at(position, record_max)
                .await
                .map_err(|e| Error::io("reading", e))?;
            let checked = match &next {
                Some(next) => check_next(&record, next, &self.fence, record_max),
                None => check_standalone(&record, self.shared.cluster, self.group, record_max),
            };
            match checked {
                Ok(header) => {
                    let prepare = prepare_of(&header);
                    let chain = next.unwrap_or(ChainNext {
                        cluster: self.shared.cluster,
                        group: self.group,
                        op: prepare.op,
                        parent: prepare.parent,
                        offset: prepare.base_offset,
                    });
                    if meta.is_empty() {
                        meta.first_op = prepare.op;
                    }
                    meta.observe(&header, position, self.shared.index_interval_bytes);
                    next = Some(chain.after(&header));
                    position += u64::from(header.size);
                }
                Err(fault) => return Ok((meta, Some((position, fault)))),
            }
        }
        Ok((meta, None))
    }

    async fn read_index_file(&self, path: &Path) -> Option<(SegmentIndex, IndexSummary)> {
        let file = self.storage.open(path, OpenMode::Read, false).await.ok()?;
        let size = file.size_bytes().await.ok()? as usize;
        let max = crate::segment::INDEX_HEADER_SIZE_BYTES
            + self.shared.index_entries_max * crate::segment::INDEX_ENTRY_SIZE_BYTES;
        if size > max {
            return None;
        }
        let (result, buffer) = file.read_at(AlignedBuf::zeroed(size.max(1), 1), 0).await;
        result.ok()?;
        SegmentIndex::decode(buffer.as_slice(), self.shared.index_entries_max).ok()
    }
}
