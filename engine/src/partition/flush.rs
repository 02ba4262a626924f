//! Flushes: what was appended goes to the segment files in jobs the shard's flush cycle runs,
//! each making its space ready before it writes, several in flight at once, finished in the
//! order they began.
//!
//! A job creates files, reserves space and writes. It syncs data only on the direct
//! `persisted` path (DESIGN.md §3, `crate::direct`), where the sync is what acknowledges the
//! appends; otherwise syncing is the checkpoint's job, off that path. Running out of space is
//! the clean, retryable "storage full"; any other failure leaves the log fail-stop.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;

use super::log::{Location, PartitionLog, SegmentMeta, open_segment};
use crate::chunk::written_extent_end;
use crate::direct::TRAILER_BYTES;
use crate::error::{Error, Result};
use crate::join::{Latch, join_all};
use crate::ready::READY_STEP_MIN_BYTES;
use crate::segment::{SPARE_NAME, log_name};
use crate::storage::{
    BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile, copy_io_error, zero_pieces,
};
use crate::superblock::Durability;

/// The largest single write a flush issues: longer runs are split so that several writes are
/// in flight at once (the device's queue depth, not one request, sets the throughput).
pub const WRITE_PIECE_BYTES: usize = 1 << 20;

const _: () = assert!(WRITE_PIECE_BYTES.is_multiple_of(BLOCK_SIZE_BYTES));

/// A new step ahead asked for within this many data-writing jobs of the last one: the step was
/// too small for the rate, and doubles.
pub(super) const STEP_GROW_JOBS_MAX: u32 = 4;
/// A new step ahead asked for only after this many jobs: the step was larger than the rate
/// needs, and halves.
const STEP_SHRINK_JOBS_MIN: u32 = 256;
/// [`STEP_GROW_JOBS_MAX`] for a step written with zeros (`super::zero_fill`). While its zeros
/// are written and not yet synced, the syncs of the log's appends commit their allocation, so
/// the step grows until half of it lasts more than this many jobs (16 MiB for 64 KiB appends),
/// and that window comes rarely.
const ZEROED_STEP_GROW_JOBS_MAX: u32 = 64;
/// The largest step written with zeros (16 MiB, ~8 ms at this disk's bandwidth): the appends
/// that land in the step's range while its zeros are being written wait for them.
pub(super) const ZEROED_STEP_BYTES_MAX: u64 = 16 << 20;
/// A log whose direct jobs write at most this much gets its steps ahead written with zeros.
/// Zeros spare every later sync the allocation of the blocks it covers (a fixed cost per
/// sync, ~0.2 ms here) but write every byte of the log twice: worth it while a job's own bytes
/// take less time to write than that allocation costs, never for a log that streams large
/// batches at the disk's bandwidth (docs/benchmarks.md, "Zeros ahead for the direct path").
const ZERO_FILL_JOB_BYTES_MAX: u64 = 256 << 10;

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
    /// A direct-path job: every op up to `written_op` is now synced.
    pub synced: bool,
}

/// One write of a flush job: the segment (by base offset), the position in it, the bytes.
pub(super) type SegmentWrite = (u64, u64, Bytes);

/// A chunk's fill when a flush job took its bytes: chunk id, bytes filled.
type ChunkMark = (u64, usize);

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

/// The I/O of one group's part of a flush cycle, owning everything it touches so appends can
/// continue while it runs. Several may be in flight per log, each writing what was appended
/// after the previous one began; they are finished in the order they began.
pub struct FlushJob<S: Storage> {
    storage: S,
    dir: PathBuf,
    group: u64,
    create: Vec<u64>,
    files: BTreeMap<u64, Rc<S::File>>,
    writes: Vec<SegmentWrite>,
    target: Location,
    target_appended_bytes: u64,
    chunk_marks: Vec<ChunkMark>,
    /// Space to make ready before writing, in order: every `needed` one first.
    reserves: Vec<Reserve>,
    /// The segment among `create` that takes the spare segment file (renamed, not created).
    spare_for: Option<u64>,
    /// Opened when the job's I/O ended (or the job was dropped).
    done: Rc<Latch>,
    /// Writes in flight this job's writes must land after: the tail an earlier job writes, and
    /// the log's zero step. A write touching one waits for its latch.
    fences: Vec<TailWrite>,
    /// The direct path's sync mark (when an earlier sync has something to announce), and the
    /// segments the job syncs once its writes are done: every one it writes, and every one an
    /// earlier job wrote since the last direct job.
    mark: Option<SegmentWrite>,
    sync: Option<Vec<u64>>,
    /// The file-system form: the job leaves its sync to the cycle's one file-system sync
    /// (`ShardFlush::run`), which marks it synced.
    sync_by_filesystem: bool,
    /// Where the sync-mark trailer of a segment this job creates begins (`persisted` groups):
    /// it is written with zeros at creation, so a mark never needs new space.
    trailer_at_bytes: Option<u64>,
}

impl<S: Storage> Drop for FlushJob<S> {
    fn drop(&mut self) {
        // A job dropped unfinished (its node closing, a simulated crash) must not leave a later
        // job waiting for it.
        self.done.open();
    }
}

/// A write in flight that later writes over its blocks must wait for (a padded tail, or a zero
/// step): its blocks, and the latch opened once it is written.
#[derive(Clone)]
pub(super) struct TailWrite {
    segment_base_offset: u64,
    position_bytes: u64,
    len_bytes: u64,
    latch: Rc<Latch>,
}

impl TailWrite {
    pub(super) fn new(
        segment_base_offset: u64,
        position_bytes: u64,
        len_bytes: u64,
        latch: Rc<Latch>,
    ) -> Self {
        Self { segment_base_offset, position_bytes, len_bytes, latch }
    }

    /// Whether `latch` is this write's.
    pub(super) fn has_latch(&self, latch: &Rc<Latch>) -> bool {
        Rc::ptr_eq(&self.latch, latch)
    }

    /// Where its blocks end, if they are in this segment.
    pub(super) fn end_in(&self, segment_base_offset: u64) -> Option<u64> {
        (segment_base_offset == self.segment_base_offset)
            .then_some(self.position_bytes + self.len_bytes)
    }

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
    /// Created segments whose trailer was written.
    trailers: Vec<u64>,
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

    /// Makes a direct job leave its sync to the cycle's one file-system sync, which must then
    /// run once the job (and every other of the cycle) finished writing.
    pub fn leave_sync_to_filesystem(&mut self) {
        assert!(self.sync.is_some(), "only a direct job syncs");
        self.sync_by_filesystem = true;
    }

    /// Runs the writes: creates new segment files (and syncs the directory; a `persisted`
    /// group's get their sync-mark trailer), makes space ready (everything the writes cover
    /// first, then the step ahead of the tail), then writes data concurrently. Only a direct job
    /// then syncs the data (with its mark): elsewhere that is the checkpoint's job, off the path
    /// that acknowledges appends.
    pub async fn run(self) -> FlushDone<S> {
        let mut created = Vec::new();
        let mut trailers = Vec::new();
        let mut reserved = Vec::new();
        let mut outcome = WriteOutcome::default();
        let result = self.run_inner(&mut created, &mut trailers, &mut reserved, &mut outcome).await;
        self.done.open();
        FlushDone { job: self, created, trailers, reserved, outcome, result }
    }

    async fn run_inner(
        &self,
        created: &mut Vec<(u64, Rc<S::File>)>,
        trailers: &mut Vec<u64>,
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
        if let Some(at) = self.trailer_at_bytes {
            for (base, file) in created.iter() {
                // A recycled spare may hold a retired segment's marks there: zeros replace them.
                // The trailer is beyond the space made ready, and optional: when it cannot be
                // written (a full disk), the segment takes the journal path until it rolls.
                if write_zeros(file.as_ref(), at, at + TRAILER_BYTES).await.is_ok() {
                    trailers.push(*base);
                }
            }
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
        // The mark never shares a block with data: it lies past the segment's limit.
        let results = join_all(
            self.writes
                .iter()
                .chain(self.mark.iter())
                .map(|(base, position, bytes)| {
                    let file = file_of(*base);
                    let bytes = bytes.clone();
                    let position = *position;
                    let after: Vec<Rc<Latch>> = self
                        .fences
                        .iter()
                        .filter(|fence| fence.overlaps(*base, position, bytes.len() as u64))
                        .map(|fence| Rc::clone(&fence.latch))
                        .collect();
                    async move {
                        if !cfg!(feature = "canary-tail-unordered") {
                            for latch in after {
                                latch.wait().await;
                            }
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
        outcome.bytes_written +=
            self.writes.iter().map(|(_, _, bytes)| bytes.len() as u64).sum::<u64>();
        if let Some(bases) = &self.sync
            && !self.sync_by_filesystem
        {
            let syncs = join_all(
                bases
                    .iter()
                    .copied()
                    .filter(|_| !cfg!(feature = "canary-ack-before-sync"))
                    .map(|base| {
                        let file = file_of(base);
                        async move { file.sync_data().await }
                    })
                    .collect(),
            )
            .await;
            for result in syncs {
                result
                    .map_err(|e| Error::io(format!("syncing group {} segment", self.group), e))?;
            }
            outcome.synced = true;
        }
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

impl<S: Storage> FlushDone<S> {
    /// The group the job wrote for.
    pub fn group(&self) -> u64 {
        self.job.group
    }

    /// Whether every step of the job succeeded.
    pub fn is_ok(&self) -> bool {
        self.result.is_ok()
    }

    /// Whether the job wrote everything and waits for the cycle's file-system sync to count
    /// as synced.
    pub fn waits_for_filesystem_sync(&self) -> bool {
        self.job.sync_by_filesystem && self.result.is_ok()
    }

    /// Applies the cycle's file-system sync, run after every job of the cycle finished: a job
    /// waiting for it is synced, or failed with it (fail-stop, like its own sync failing).
    pub fn finish_filesystem_sync(&mut self, result: &std::io::Result<()>) {
        if !self.waits_for_filesystem_sync() {
            return;
        }
        match result {
            Ok(()) => self.outcome.synced = true,
            Err(error) => {
                let context = format!("syncing the file system for group {}", self.job.group);
                self.result = Err(Error::io(context, copy_io_error(error)));
            }
        }
    }
}

impl<S: Storage> PartitionLog<S> {
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
    ///
    /// With `direct` (the direct `persisted` path; only when
    /// [`PartitionLog::can_flush_direct`] says so, and then it always returns a job), the job
    /// writes everything appended and a sync mark, then syncs the files it wrote: once it
    /// finishes, everything appended before it began is durable.
    pub fn begin_flush(&mut self, write_all: bool, direct: bool) -> Option<FlushJob<S>> {
        self.begin_flush_deferring(write_all, direct, false)
    }

    /// [`PartitionLog::begin_flush`], except that with `defer_segment_write` a segment write
    /// due only by batch ([`PartitionLog::deferrable_segment_write_bytes`]) waits for a later
    /// cycle: the job, if any, then only makes space ready.
    pub fn begin_flush_deferring(
        &mut self,
        write_all: bool,
        direct: bool,
        defer_segment_write: bool,
    ) -> Option<FlushJob<S>> {
        assert!(!direct || self.can_flush_direct(), "a direct job only where it can run");
        assert!(
            !defer_segment_write
                || (!write_all && !direct && self.deferrable_segment_write_bytes().is_some()),
            "only a write due by batch alone waits"
        );
        if self.faulty.is_some()
            || (self.flushes_in_flight > 0 && (self.flush_failed || self.exclusive_in_flight))
        {
            return None;
        }
        let retrying = self.storage_full && self.storage_retry;
        // A retry after a full disk writes everything pending, so that its reservation covers
        // whatever waits for space.
        let write_data = ((write_all || retrying || direct) && self.has_unsubmitted())
            || (self.segment_write_due() && !defer_segment_write);
        if !(write_data || self.needs_ready() || direct) {
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
        if write_data {
            let job_bytes = self.unsubmitted_bytes();
            self.zeros_ahead = direct && job_bytes <= ZERO_FILL_JOB_BYTES_MAX;
        }
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
        if write_data {
            self.jobs_since_step = self.jobs_since_step.saturating_add(1);
        }
        // Space asked for ahead counts against the shard's budget from now, so the jobs of
        // other logs beginning in the same cycle see it gone; the finish reports what is held.
        let claimed: u64 = reserves
            .iter()
            .filter(|reserve| !reserve.needed)
            .map(|reserve| reserve.to_bytes - reserve.from_bytes)
            .sum();
        if claimed > 0 {
            self.claim_ready(claimed);
        }
        if reserves.iter().any(|reserve| reserve.base_offset.is_some() && !reserve.needed) {
            self.adapt_ready_step(false);
        }
        let done = Rc::new(Latch::default());
        let fences: Vec<TailWrite> = self
            .tail_in_flight
            .iter()
            .chain(self.zeroing.iter())
            .filter(|fence| !fence.latch.is_open())
            .cloned()
            .collect();
        let (writes, chunk_marks) = self.submit_chunks(chunks, &done);
        let (target, target_appended_bytes) = if write_data {
            (self.head, self.appended_bytes)
        } else {
            (self.submitted, self.submitted_appended_bytes)
        };
        self.submitted = target;
        self.submitted_appended_bytes = target_appended_bytes;
        self.flushes_in_flight += 1;
        self.exclusive_in_flight = exclusive;
        let mark = if direct { self.next_mark(&target) } else { None };
        let sync = direct.then(|| {
            let mut bases: Vec<u64> = writes.iter().map(|(base, _, _)| *base).collect();
            bases.push(target.segment_base_offset);
            let files = &self.files;
            bases.extend(self.unsynced_segments.iter().filter(|base| files.contains_key(base)));
            bases.sort_unstable();
            bases.dedup();
            bases
        });
        let trailer_at_bytes =
            (self.config.durability == Durability::Persisted).then(|| self.segment_limit_bytes());
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
            fences,
            mark,
            sync,
            sync_by_filesystem: false,
            trailer_at_bytes,
        })
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
        let result = self.apply_flush(done);
        if self.flushes_in_flight == 0 {
            // What the job reserved is now known, and what was appended since used some of it.
            self.account_ready();
        }
        result
    }

    fn apply_flush(&mut self, done: FlushDone<S>) -> Result<WriteOutcome> {
        assert!(self.flushes_in_flight > 0, "finish without a flush in flight");
        self.flushes_in_flight -= 1;
        if self.flushes_in_flight == 0 {
            self.exclusive_in_flight = false;
            self.tail_in_flight = None;
        }
        let FlushDone { job, created, trailers, reserved, mut outcome, result } = done;
        for (base, file) in created {
            self.files.insert(base, file);
        }
        for base in trailers {
            if let Some(meta) = self.segment_mut(base) {
                meta.trailer_ready = true;
            }
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
                    meta.written_through_bytes = 0;
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
        // The last chunk stays once all of it is written, unless it grew past what the group's
        // pace asks for: a group appending one batch at a time has no flush in flight between
        // its batches, and handing the chunk back then took a fresh one for every batch (a
        // 2 MiB chunk per 64 KiB batch, whose ring view kept the whole chunk from the pool).
        // The shard hands it back once the group is found idle.
        if self.flushes_in_flight == 0 && self.chunk_outgrew_pace() {
            self.give_back_idle_chunk();
        }
        assert!(job.target.op >= self.written.op, "flush jobs finish in the order they began");
        outcome.sealed = job.target.segment_base_offset != self.written.segment_base_offset;
        self.written = job.target;
        self.written_appended_bytes = job.target_appended_bytes;
        outcome.written_op = job.target.op;
        if outcome.synced {
            self.finish_direct(&job.target, job.mark.is_some());
            self.unsynced_segments.clear();
        } else {
            self.unsynced_segments.extend(job.writes.iter().map(|(base, _, _)| *base));
        }
        Ok(outcome)
    }

    /// Whether the last chunk is larger than the one the group would take now: it grew while
    /// the group's writes lagged (see `next_chunk_bytes`), and a trickle that kept it would
    /// keep doubling it whenever a chunk filled with writes put off for a batch.
    fn chunk_outgrew_pace(&self) -> bool {
        let Some(chunk) = self.chunks.back() else { return false };
        let wanted = self.next_chunk_bytes(0);
        self.shared.pool.borrow().size_for(wanted).is_some_and(|size| chunk.size_bytes() > size)
    }

    /// Hands the last chunk back once everything in it is written and no job is in flight: a
    /// group that stopped writing keeps only the partial block its next append continues
    /// (`tail_prefix`), not a chunk (DESIGN.md §3: buffers come from a shard pool). The shard
    /// calls this for a group it found idle at a tick, and for every group when its pool runs
    /// dry. True when a chunk went back.
    pub fn give_back_idle_chunk(&mut self) -> bool {
        if self.flushes_in_flight > 0 || self.chunks.len() != 1 || self.chunks[0].has_unwritten() {
            return false;
        }
        let Some(active) = self.segments.last() else { return false };
        let chunk = &self.chunks[0];
        let end = active.end_bytes;
        let block_start = end - end % BLOCK_SIZE_BYTES as u64;
        if chunk.segment_base_offset != active.base_offset
            || chunk.file_end_bytes() != end
            || block_start < chunk.file_base_bytes
        {
            return false;
        }
        let start = (block_start - chunk.file_base_bytes) as usize;
        self.tail_prefix = chunk.view(start, (end - block_start) as usize).to_vec();
        let chunk = self.chunks.pop_back().expect("one chunk");
        self.shared.pool.borrow_mut().give_back(chunk);
        true
    }

    /// Drops the ring's prepares that are on their segment, so the pool can reuse the memory
    /// their views hold (the shard asks when its pool runs dry).
    pub fn release_written_ring(&mut self) {
        self.ring.evict_written(self.written.op);
    }

    /// Gives the shard's ring budget back what this ring holds of prepares on their segment,
    /// into the batch cache, as an eviction by its own appends would: another group's append
    /// needs the room. Returns the bytes given back.
    pub fn give_back_written_ring(&mut self) -> usize {
        let (group, cache) = (self.group, &self.shared.cache);
        self.ring.evict_written_into(self.written.op, |prepare| {
            cache.borrow_mut().insert(group, prepare, true);
        })
    }

    /// Runs a whole flush of this log alone (begin, run, finish): for tests and tools; the shard
    /// runs many logs' jobs at once.
    pub async fn flush(&mut self) -> Result<WriteOutcome> {
        match self.begin_flush(false, false) {
            None => Ok(WriteOutcome { written_op: self.written.op, ..WriteOutcome::default() }),
            Some(job) => {
                let done = job.run().await;
                self.finish_flush(done)
            }
        }
    }

    /// Hands the unsubmitted bytes of the first `chunks` chunks to the job whose latch is `done`:
    /// the writes, in pieces of at most [`WRITE_PIECE_BYTES`], and each chunk's mark; a padded
    /// tail the job writes becomes the tail in flight.
    fn submit_chunks(
        &mut self,
        chunks: usize,
        done: &Rc<Latch>,
    ) -> (Vec<SegmentWrite>, Vec<ChunkMark>) {
        let mut writes = Vec::new();
        let mut chunk_marks = Vec::with_capacity(chunks);
        let mut written_blocks_end = self.written_blocks_end;
        for index in 0..chunks {
            // A successor chunk in the same segment starts with this chunk's partial block.
            let successor_same_segment = self.chunks.get(index + 1).is_some_and(|next| {
                next.segment_base_offset == self.chunks[index].segment_base_offset
            });
            let written_end =
                self.written_end_in(written_blocks_end, self.chunks[index].segment_base_offset);
            let chunk = &mut self.chunks[index];
            chunk_marks.push((chunk.id, chunk.filled()));
            // Every byte of it went to an earlier job (its tail block included): nothing to do.
            if !chunk.has_unsubmitted() {
                continue;
            }
            let with_tail = !successor_same_segment;
            let tail_bytes = if with_tail { chunk.tail_bytes() as u64 } else { 0 };
            // A write over blocks an earlier job wrote (its tail block, its guard block) and on
            // into blocks only reserved goes out as two, split where the written blocks end
            // (`written_end`, above): ext4 issues a direct write inline only when its whole
            // range is one extent kind (written, or reserved and unwritten); one across both is
            // refused to io_uring's non-blocking attempt and punted to an io-wq worker
            // (docs/benchmarks.md, "Writes across written and reserved blocks").
            let mut covered_end = written_end;
            for (position, bytes) in chunk.unsubmitted(with_tail) {
                // Large runs go out as several block-aligned pieces in flight at once.
                let mut start = 0;
                while start < bytes.len() {
                    let mut end = (start + WRITE_PIECE_BYTES).min(bytes.len());
                    let split = written_end.saturating_sub(position);
                    if (start as u64) < split && split < end as u64 {
                        end = split as usize;
                    }
                    writes.push((
                        chunk.segment_base_offset,
                        position + start as u64,
                        bytes.slice(start..end),
                    ));
                    start = end;
                }
                covered_end = covered_end.max(position + bytes.len() as u64);
            }
            written_blocks_end = Some((chunk.segment_base_offset, covered_end));
            if tail_bytes > 0 {
                let filled = chunk.filled() as u64;
                self.tail_in_flight = Some(TailWrite {
                    segment_base_offset: chunk.segment_base_offset,
                    position_bytes: chunk.file_base_bytes + filled
                        - filled % BLOCK_SIZE_BYTES as u64,
                    len_bytes: tail_bytes,
                    latch: Rc::clone(done),
                });
            }
            chunk.mark_submitted(chunk.filled());
        }
        self.written_blocks_end = written_blocks_end;
        (writes, chunk_marks)
    }

    /// Where the blocks known written end in the segment at `segment_base_offset`: those the
    /// jobs up to `written_blocks_end` wrote, and those the file already held written (a
    /// recycled segment's, a zero step's), whichever reach further.
    pub(super) fn written_end_in(
        &self,
        written_blocks_end: Option<(u64, u64)>,
        segment_base_offset: u64,
    ) -> u64 {
        let by_jobs = match written_blocks_end {
            Some((segment, end)) if segment == segment_base_offset => end,
            _ => 0,
        };
        let on_file =
            self.segment(segment_base_offset).map_or(0, |meta| meta.written_through_bytes);
        by_jobs.max(on_file)
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
        let mut available = self.shared.ready_budget.available_bytes();
        // A log whose steps are written with zeros gets them from its zero step instead.
        if let Some((from, to)) = self.active_step(create, available).filter(|_| !self.zeros_ahead)
        {
            available -= to - from;
            reserves.push(Reserve {
                base_offset: self.segments.last().map(|active| active.base_offset),
                from_bytes: from,
                to_bytes: to,
                needed: false,
            });
        }
        if let Some((from, to)) = self.spare_step(available) {
            reserves.push(Reserve {
                base_offset: None,
                from_bytes: from,
                to_bytes: to,
                needed: false,
            });
        }
        reserves
    }

    /// The step ahead of the active segment's tail due now, within `available` bytes of the
    /// shard's budget: `[from, to)`, or None when the space ahead is still at least half a step
    /// (or the budget has nothing left).
    pub(super) fn active_step(&self, create: &[u64], available: u64) -> Option<(u64, u64)> {
        let active = self.segments.last()?;
        if !(self.files.contains_key(&active.base_offset) || create.contains(&active.base_offset)) {
            return None;
        }
        let data_end = written_extent_end(active.end_bytes);
        let ready_end = self.ready_end_of(active);
        if ready_end >= self.ready_wanted_end_bytes(data_end) {
            return None;
        }
        let from = ready_end.max(data_end);
        let to = (data_end + self.ready_step_bytes)
            .min(self.segment_limit_bytes())
            .min(from + available)
            .max(data_end);
        (to > from).then_some((from, to))
    }

    /// The spare segment file's step due now, within `available` bytes of the shard's budget:
    /// once the active segment is within half a step of its end (its own space ahead can grow no
    /// further), so a roll finds a full disk while the active segment still has room. A log
    /// that never wrote has no active segment and gets none.
    fn spare_step(&self, available: u64) -> Option<(u64, u64)> {
        let active = self.segments.last()?;
        let near_end = written_extent_end(active.end_bytes) + self.ready_step_bytes / 2
            >= self.segment_limit_bytes();
        let target = self.ready_step_bytes.min(self.segment_limit_bytes());
        let from = self.spare_ready_end_bytes.unwrap_or(0);
        if !near_end || self.spare_in_flight || self.spare_claimed || from >= target {
            return None;
        }
        let to = target.min(from + available);
        (to > from).then_some((from, to))
    }

    /// Adapts the step ahead to the write rate when a new one is asked for: doubled (up to
    /// `ready_ahead_bytes`) when half the last one lasted only a few jobs, halved (down to
    /// [`READY_STEP_MIN_BYTES`]) when it lasted many, so a partition that writes a trickle holds
    /// little space ahead and a busy one reserves rarely.
    pub(super) fn adapt_ready_step(&mut self, zeroed: bool) {
        let max = self.shared.ready_ahead_bytes;
        let min = READY_STEP_MIN_BYTES.min(max);
        let (grow_jobs_max, max) = if zeroed {
            (ZEROED_STEP_GROW_JOBS_MAX, max.min(ZEROED_STEP_BYTES_MAX.max(min)))
        } else {
            (STEP_GROW_JOBS_MAX, max)
        };
        if self.jobs_since_step <= grow_jobs_max {
            self.ready_step_bytes = (self.ready_step_bytes * 2).min(max);
        } else if self.jobs_since_step >= STEP_SHRINK_JOBS_MIN {
            self.ready_step_bytes = (self.ready_step_bytes / 2).max(min);
        }
        // A step grown while the log streamed large batches comes down at once.
        self.ready_step_bytes = self.ready_step_bytes.min(max);
        self.ready_step_bytes -= self.ready_step_bytes % BLOCK_SIZE_BYTES as u64;
        self.jobs_since_step = 0;
    }

    /// How far a segment's space is ready: reserved, or occupied by what is on file or being
    /// written by a job in flight (the padded tail block is always written whole), or being
    /// written with zeros by the log's zero step.
    pub(super) fn ready_end_of(&self, meta: &SegmentMeta) -> u64 {
        let on_file = self.end_on_file(meta, &self.submitted);
        let zeroing = self.zeroing.as_ref().and_then(|z| z.end_in(meta.base_offset));
        meta.ready_end_bytes.max(written_extent_end(on_file)).max(zeroing.unwrap_or(0))
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
                self.unsubmitted_bytes() >= self.segment_write_batch_bytes()
                    || self.full_chunks_unsubmitted() > 0
            }
        }
    }

    /// The bytes a `persisted` group gathers before its segment write is due (a quarter of the
    /// ring at most, so that the ring never fills with unwritten prepares).
    pub(super) fn segment_write_batch_bytes(&self) -> u64 {
        (self.shared.persisted_write_batch_bytes as u64)
            .min(self.shared.ring_limits.bytes_max as u64 / 4)
    }

    /// The bytes of a `persisted` group's segment write that is due by batch alone (a batch
    /// gathered, or one chunk filled): a write the shard may put off for a few cycles, to
    /// spread the segment writes of groups that fill their batches in step over its cycles.
    /// None when no write is due, or when it cannot wait any longer: twice the batch gathered
    /// (the ring's bound comes closer) or a second chunk filled (the pool's).
    pub fn deferrable_segment_write_bytes(&self) -> Option<u64> {
        if self.config.durability != Durability::Persisted
            || self.faulty.is_some()
            || self.storage_full
            || !self.segment_write_due()
        {
            return None;
        }
        let unsubmitted = self.unsubmitted_bytes();
        (unsubmitted < 2 * self.segment_write_batch_bytes() && self.full_chunks_unsubmitted() <= 1)
            .then_some(unsubmitted)
    }

    /// Bytes appended that no flush job has taken yet.
    fn unsubmitted_bytes(&self) -> u64 {
        self.appended_bytes - self.submitted_appended_bytes
    }

    /// Full chunks (every one but the last, which receives appends) with bytes no flush job has
    /// taken yet.
    fn full_chunks_unsubmitted(&self) -> usize {
        self.chunks.iter().rev().skip(1).filter(|chunk| chunk.has_unsubmitted()).count()
    }

    /// Whether the space made ready ahead of the active segment's tail has fallen below half a
    /// step (or is unknown, after recovery) and a flush job makes it ready (not the log's zero
    /// step), or the spare is due, and the shard's budget has room for it.
    fn needs_ready(&self) -> bool {
        let available = self.shared.ready_budget.available_bytes();
        (!self.zeros_ahead && self.active_step(&[], available).is_some())
            || self.spare_step(available).is_some()
    }

    /// How far the active segment must be ready once its data reaches `data_end_bytes`: half
    /// the ready-ahead window past it, but never past the segment's end, which no reservation
    /// can pass (otherwise a segment near its end would want a flush every cycle until it rolls).
    fn ready_wanted_end_bytes(&self, data_end_bytes: u64) -> u64 {
        (data_end_bytes + self.ready_step_bytes / 2).min(self.segment_limit_bytes())
    }

    /// How far a segment's file may reach: its size, padded tail and guard block included.
    pub(super) fn segment_limit_bytes(&self) -> u64 {
        let block = BLOCK_SIZE_BYTES as u64;
        self.config.segment_size_bytes.next_multiple_of(block) + block
    }
}

/// Writes zeros over `[from_bytes, to_bytes)` (block-aligned) of `file`, in pieces of at most
/// [`WRITE_PIECE_BYTES`], all in flight at once.
async fn write_zeros<F: StorageFile>(file: &F, from_bytes: u64, to_bytes: u64) -> io::Result<()> {
    let pieces = zero_pieces(from_bytes, to_bytes, WRITE_PIECE_BYTES)
        .map(|(position, zeros)| file.write_at(zeros, position));
    for result in join_all(pieces.collect()).await {
        result?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::path::Path;
    use std::pin::Pin;

    use shoal_proto::batch::BatchBuilder;

    use super::{FlushDone, Reserve};
    use crate::chunk::written_extent_end;
    use crate::join::join_all;
    use crate::partition::ZeroStepDone;
    use crate::record::build_prepare;
    use crate::shard::{ShardConfig, ShardStore};
    use crate::storage::BLOCK_SIZE_BYTES;
    use crate::storage::sim::{Sim, SimConfig, SimStorage};
    use crate::superblock::{Durability, GroupConfig};
    use crate::wire::Prepare;

    const GROUP: u64 = 1;

    /// A simulated shard (small profile) with group `GROUP` of `durability`.
    fn open_with_group(durability: Durability) -> (Sim, ShardStore<SimStorage>) {
        open_with_group_seeded(durability, 1)
    }

    /// The small profile with a small journal, so that a test can open many shards.
    fn config() -> ShardConfig {
        ShardConfig { journal_size_bytes: 1 << 20, ..ShardConfig::small() }
    }

    fn open_with_group_seeded(durability: Durability, seed: u64) -> (Sim, ShardStore<SimStorage>) {
        let sim = Sim::new(seed, SimConfig::default());
        let (mut shard, _) =
            sim.block_on(ShardStore::open(sim.storage(), Path::new("/d"), config())).unwrap();
        // Small segments: the simulated disk holds a persisted segment's whole size in memory.
        let config = GroupConfig {
            durability,
            segment_size_bytes: 4 << 20,
            record_size_bytes_max: 64 << 10,
            ..GroupConfig::default()
        };
        sim.block_on(shard.create_group(GROUP, config)).unwrap();
        (sim, shard)
    }

    fn append(shard: &mut ShardStore<SimStorage>, records: u32) -> u64 {
        let mut builder = BatchBuilder::new(1);
        for _ in 0..records {
            builder.push(1, None, Some(&[b'x'; 2000]), &[]);
        }
        let body = builder.build();
        let fields = Prepare { record_count: records, append_time_ms: 1, ..Prepare::default() };
        let header = build_prepare(&shard.next(GROUP).unwrap(), 1, 0, fields, &body);
        shard.append(GROUP, &header, &body).unwrap();
        shard.group(GROUP).unwrap().segments.last().expect("active segment").end_bytes
    }

    /// A job's first write starts in the block an earlier job's tail (and guard) wrote and
    /// runs on into space only reserved: it goes out split where the earlier writes ended, so
    /// that each piece is one kind of extent and ext4 issues it inline.
    #[test]
    fn a_write_over_written_and_reserved_blocks_is_split_where_the_written_ones_end() {
        let (sim, mut shard) = open_with_group(Durability::Replicated);
        let first_end = append(&mut shard, 3);
        sim.block_on(shard.flush()).unwrap();
        let written_end = written_extent_end(first_end);
        let second_end = append(&mut shard, 5);
        assert!(second_end > written_end, "the second job runs past the first one's blocks");
        let job = shard.group_mut(GROUP).unwrap().begin_flush(true, false).expect("a job");
        let ranges = write_ranges(&job);
        assert!(ranges.iter().all(|&(from, to)| to <= written_end || from >= written_end));
        assert!(ranges.iter().any(|&(_, to)| to == written_end), "{ranges:?}");
        assert!(ranges.iter().any(|&(from, _)| from == written_end), "{ranges:?}");
        run_job(&sim, &mut shard, job);
        let log = shard.group_mut(GROUP).unwrap();
        assert_eq!(sim.block_on(log.read_offset(0, usize::MAX)).unwrap().len(), 2);
    }

    /// Blocks a finished zero step wrote count as written: a job's write from the earlier tail
    /// block on into them crosses no reserved blocks and goes out whole, not split.
    #[test]
    fn a_write_over_written_and_zeroed_blocks_goes_out_whole() {
        let (sim, mut shard) = open_with_group(Durability::Persisted);
        append(&mut shard, 3);
        assert_eq!(run_direct_job(&sim, &mut shard), None);
        let log = shard.group_mut(GROUP).unwrap();
        let data_end = written_extent_end(log.segments.last().unwrap().end_bytes);
        let step = log.begin_zero_step().expect("a small direct log's step ahead is due");
        let done = sim.block_on(step.run());
        log.finish_zero_step(done).unwrap();
        assert!(log.segments.last().unwrap().written_through_bytes > data_end);
        let second_end = append(&mut shard, 5);
        assert!(second_end > data_end, "the second job runs past the first one's blocks");
        let job = shard.group_mut(GROUP).unwrap().begin_flush(false, true).expect("a direct job");
        let ranges = write_ranges(&job);
        assert!(ranges.iter().any(|&(from, to)| from < data_end && to > data_end), "{ranges:?}");
        run_job(&sim, &mut shard, job);
        let log = shard.group_mut(GROUP).unwrap();
        assert_eq!(sim.block_on(log.read_offset(0, usize::MAX)).unwrap().len(), 2);
    }

    /// A segment that takes a recycled segment's file counts that file's blocks as written, so
    /// a later job's write from the tail block on into them goes out whole.
    #[test]
    fn a_segment_in_a_recycled_file_counts_its_blocks_as_written() {
        let sim = Sim::new(3, SimConfig::default());
        let (mut shard, _) =
            sim.block_on(ShardStore::open(sim.storage(), Path::new("/d"), config())).unwrap();
        let group_config = GroupConfig {
            durability: Durability::Replicated,
            segment_size_bytes: 1 << 20,
            retention_bytes: 1 << 20,
            record_size_bytes_max: 64 << 10,
            ..GroupConfig::default()
        };
        sim.block_on(shard.create_group(GROUP, group_config)).unwrap();
        let mut in_recycled = false;
        for _ in 0..200 {
            let end = append(&mut shard, 30);
            sim.block_on(shard.flush()).unwrap();
            sim.block_on(shard.enforce_retention(1)).unwrap();
            let log = shard.group(GROUP).unwrap();
            let active = log.segments.last().unwrap();
            // Past the segment's first job: the next write starts in a block a job wrote.
            if log.recycled_segments() > 0 && active.written_through_bytes > end {
                in_recycled = true;
                break;
            }
        }
        assert!(in_recycled, "no segment took a recycled file");
        let data_end =
            written_extent_end(shard.group(GROUP).unwrap().segments.last().unwrap().end_bytes);
        append(&mut shard, 5);
        let job = shard.group_mut(GROUP).unwrap().begin_flush(true, false).expect("a job");
        let ranges = write_ranges(&job);
        assert!(ranges.iter().any(|&(from, to)| from < data_end && to > data_end), "{ranges:?}");
        run_job(&sim, &mut shard, job);
    }

    /// The file ranges a job's writes cover.
    fn write_ranges(job: &super::FlushJob<SimStorage>) -> Vec<(u64, u64)> {
        job.writes
            .iter()
            .map(|(_, position, bytes)| (*position, position + bytes.len() as u64))
            .collect()
    }

    fn run_job(sim: &Sim, shard: &mut ShardStore<SimStorage>, job: super::FlushJob<SimStorage>) {
        let done = sim.block_on(job.run());
        shard.group_mut(GROUP).unwrap().finish_flush(done).unwrap();
    }

    /// Runs one direct job of `log` to its end.
    fn run_direct_job(sim: &Sim, shard: &mut ShardStore<SimStorage>) -> Option<Reserve> {
        let log = shard.group_mut(GROUP).unwrap();
        let job = log.begin_flush(false, true).expect("a direct job");
        let step = job.reserves.iter().find(|reserve| !reserve.needed).copied();
        run_job(sim, shard, job);
        step
    }

    /// A log whose direct jobs carry little gets its step ahead from a zero step beside its
    /// jobs (so the syncs of the appends that land there later allocate no blocks, and none
    /// waits for the zeros); one whose jobs carry much, as a log streaming large batches does,
    /// has its flush jobs reserve it.
    #[test]
    fn small_direct_jobs_get_their_step_ahead_from_a_zero_step_and_large_ones_reserve_it() {
        let (sim, mut shard) = open_with_group(Durability::Persisted);
        // About 60 KB: the job makes only its own space ready; the step is the zero step's.
        append(&mut shard, 30);
        assert_eq!(run_direct_job(&sim, &mut shard), None);
        let log = shard.group_mut(GROUP).unwrap();
        let data_end = written_extent_end(log.segments.last().unwrap().end_bytes);
        assert!(log.zero_step_due());
        let step = log.begin_zero_step().expect("due");
        let zeroing = log.zeroing.clone().expect("in flight");
        assert_eq!(zeroing.position_bytes, data_end);
        assert!(!log.zero_step_due(), "one step at a time");
        let done = sim.block_on(step.run());
        assert_eq!(done.bytes_written(), zeroing.len_bytes);
        log.finish_zero_step(done).unwrap();
        assert!(log.zeroing.is_none());
        let ready_end = log.segments.last().unwrap().ready_end_bytes;
        assert_eq!(ready_end, zeroing.position_bytes + zeroing.len_bytes);
        // About 300 KB per job, until a step is due again: the flush job reserves it.
        let large = loop {
            for _ in 0..5 {
                append(&mut shard, 30);
            }
            if let Some(step) = run_direct_job(&sim, &mut shard) {
                break step;
            }
        };
        assert!(large.from_bytes >= ready_end || large.to_bytes > ready_end);
        assert!(!shard.group(GROUP).unwrap().zero_step_due());
        let log = shard.group_mut(GROUP).unwrap();
        assert!(!sim.block_on(log.read_offset(0, usize::MAX)).unwrap().is_empty());
    }

    /// The outputs of a zero step and a flush job run together.
    enum Finished {
        Zeros(ZeroStepDone<SimStorage>),
        Data(Box<FlushDone<SimStorage>>),
    }

    /// A direct job whose data reaches into a zero step still in flight waits for the zeros
    /// before it writes there: whatever order the disk completes them in, the data is what
    /// stays. (The `canary-tail-unordered` feature drops the wait, and this test fails.)
    #[test]
    fn data_written_into_a_zero_step_in_flight_waits_for_its_zeros() {
        for seed in 0..16 {
            let (sim, mut shard) = open_with_group_seeded(Durability::Persisted, seed);
            append(&mut shard, 30);
            run_direct_job(&sim, &mut shard);
            let step = shard.group_mut(GROUP).unwrap().begin_zero_step().expect("due");
            let zeroing = shard.group(GROUP).unwrap().zeroing.clone().expect("in flight");
            while shard.group(GROUP).unwrap().segments.last().unwrap().end_bytes
                < zeroing.position_bytes + BLOCK_SIZE_BYTES as u64
            {
                append(&mut shard, 30);
            }
            let log = shard.group_mut(GROUP).unwrap();
            let job = log.begin_flush(false, true).expect("a direct job");
            assert!(job.fences.iter().any(|fence| fence.has_latch(&zeroing.latch)));
            let runs: Vec<Pin<Box<dyn Future<Output = Finished>>>> = vec![
                Box::pin(async move { Finished::Zeros(step.run().await) }),
                Box::pin(async move { Finished::Data(Box::new(job.run().await)) }),
            ];
            for finished in sim.block_on(join_all(runs)) {
                let log = shard.group_mut(GROUP).unwrap();
                match finished {
                    Finished::Zeros(done) => log.finish_zero_step(done).unwrap(),
                    Finished::Data(done) => assert!(log.finish_flush(*done).unwrap().synced),
                }
            }
            let head_op = shard.group(GROUP).unwrap().head_op();
            // Read back from the files, not from memory: zeros over synced data would read as
            // a lost synced op (corruption) or a shorter log.
            let (mut shard, report) =
                sim.block_on(ShardStore::open(sim.storage(), Path::new("/d"), config())).unwrap();
            assert!(report.groups.iter().all(|group| group.corruption.is_none()), "seed {seed}");
            let log = shard.group_mut(GROUP).unwrap();
            assert_eq!(log.head_op(), head_op, "seed {seed}");
            let served = sim.block_on(log.read_offset(0, usize::MAX)).unwrap();
            assert_eq!(served.len() as u64, head_op, "seed {seed}: every op is on file");
        }
    }
}
