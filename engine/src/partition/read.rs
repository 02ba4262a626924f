//! Reads: prepares by offset, by op or by time, served from the ring when it holds them, by
//! offset also from the shard's batch cache, else planned as a disk read that runs without
//! borrowing the log and continues from the ring. Offset reads cache what they decoded, the rest
//! of their read window included, and a consumer reading in order has read-ahead planned for it:
//! several window-sized reads in flight past what the cache holds. A restart's replays of each
//! log cache nothing and reuse one window per shard. No window reads past a segment's written
//! end.
//!
//! A read verifies every record's checksums and must never serve around damage: corruption it
//! finds makes the log refuse service; a read that merely failed changes nothing. Damage that
//! only read-ahead ran into is left for the read that wants that record.

use std::path::PathBuf;
use std::rc::Rc;

use bytes::Bytes;

use super::log::PartitionLog;
use crate::error::{Corruption, Error, Result};
use crate::record::{check_standalone, prepare_of};
use crate::ring::StoredPrepare;
use crate::scan::Scanner;
use crate::segment::log_name;
use crate::storage::{BufferShelf, OpenMode, Storage};
use crate::wire::Header;

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
    /// Prepares gathered at most (always at least one).
    prepares_max: usize,
    want: Want,
    /// The read stopped at the written end of the log: continue from the ring.
    continue_in_ring: bool,
    /// Once what was asked for is gathered, the records starting before this position of the
    /// first planned segment are still decoded, for the cache only.
    ahead_to_bytes: u64,
    /// A read-ahead: everything it decodes is for the cache, and what stops it is no failure.
    read_ahead: bool,
    /// The cache's epoch when planned (see [`crate::cache::BatchCache::epoch`]).
    cache_epoch: u64,
    /// A replay's read ([`PartitionLog::read_newest_headers`], [`PartitionLog::read_ops`],
    /// [`PartitionLog::replay_offset`]): its windows come from the shard's replay shelf, and
    /// nothing it finds enters the batch cache.
    replay: Option<Replay>,
    /// Held while the read may scan files: see `PartitionLog::disk_reads`.
    _in_flight: Rc<()>,
}

/// How a replay's disk read differs from a consumer's.
struct Replay {
    shelf: BufferShelf,
    /// Keep only each record's header (its bytes checked, then dropped).
    headers_only: bool,
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
    /// Decoded past what was asked for: for the cache.
    ahead: Vec<StoredPrepare>,
    cache_epoch: u64,
    /// A replay's read: nothing goes into the cache.
    replay: bool,
    reached_written_end: bool,
    bytes_max: usize,
    prepares_max: usize,
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
        let mut ahead = Vec::new();
        let mut reached_written_end = true;
        let result = self.run_inner(&mut found, &mut ahead, &mut reached_written_end).await;
        DiskReadDone {
            found,
            ahead,
            cache_epoch: self.cache_epoch,
            replay: self.replay.is_some(),
            reached_written_end,
            bytes_max: self.bytes_max,
            prepares_max: self.prepares_max,
            want: self.want,
            result,
        }
    }

    async fn run_inner(
        &self,
        found: &mut Vec<StoredPrepare>,
        ahead: &mut Vec<StoredPrepare>,
        reached_written_end: &mut bool,
    ) -> Result<()> {
        let mut bytes = 0usize;
        // What was asked for is gathered: only the cache's read-ahead goes on.
        let mut full = self.read_ahead;
        // A slice kept would hold the whole window, and the shelf could not take it back.
        let headers_only = self.replay.as_ref().is_some_and(|replay| replay.headers_only);
        for (index, planned) in self.segments.iter().enumerate() {
            let ahead_to = if index == 0 { self.ahead_to_bytes } else { 0 };
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
            let shelf =
                self.replay.as_ref().map_or_else(|| BufferShelf::new(1), |r| r.shelf.clone());
            let mut scanner = Scanner::with_shelf(file, self.scan_window_bytes, shelf)
                .await
                .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
            scanner.read_no_further_than(planned.written_end_bytes);
            let mut position = planned.start_bytes;
            while position < planned.written_end_bytes {
                full |= !found.is_empty()
                    && (bytes >= self.bytes_max || found.len() >= self.prepares_max);
                if full && position >= ahead_to {
                    // The next record is not even decoded, so damage past what was asked for
                    // (a read by op wants one) is left for the read that wants it.
                    *reached_written_end = false;
                    return Ok(());
                }
                let record = match scanner.record_at(position, self.record_size_bytes_max).await {
                    Ok(record) => record,
                    Err(_) if full => {
                        *reached_written_end = false;
                        return Ok(());
                    }
                    Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
                };
                let checked =
                    check_standalone(&record, self.cluster, self.group, self.record_size_bytes_max);
                let header = match checked {
                    Ok(header) => header,
                    Err(_) if full => {
                        *reached_written_end = false;
                        return Ok(());
                    }
                    Err(fault) => {
                        return Err(Error::Corruption(Corruption {
                            file: path.clone(),
                            position_bytes: position,
                            offset: found.last().map(StoredPrepare::end_offset),
                            op: found.last().map(|prepare| prepare.op() + 1),
                            reason: fault.to_string(),
                        }));
                    }
                };
                position += u64::from(header.size);
                let record = if headers_only { Bytes::new() } else { record };
                let prepare = StoredPrepare { header, record };
                if !full && found.is_empty() && !self.want.accepts(&prepare) {
                    continue;
                }
                if !full && !found.is_empty() && bytes + prepare.record.len() > self.bytes_max {
                    full = true;
                }
                if full {
                    ahead.push(prepare);
                    continue;
                }
                bytes += prepare.record.len();
                found.push(prepare);
            }
            if full {
                // Read-ahead stays within the first segment.
                *reached_written_end = false;
                return Ok(());
            }
        }
        *reached_written_end = self.continue_in_ring;
        Ok(())
    }
}

impl<S: Storage> PartitionLog<S> {
    /// Plans a read of the prepares containing `offset` and after it, up to `bytes_max` bytes of
    /// records (always at least one whole record when one exists).
    pub fn plan_read_offset(&self, offset: u64, bytes_max: usize) -> Result<ReadPlan<S>> {
        self.plan_offset(offset, bytes_max, true)
    }

    /// [`PartitionLog::plan_read_offset`]; a consumer's (`for_consumer`) miss counts as one.
    fn plan_offset(
        &self,
        offset: u64,
        bytes_max: usize,
        for_consumer: bool,
    ) -> Result<ReadPlan<S>> {
        self.check_serving()?;
        if offset >= self.next.offset || offset < self.first_offset() {
            return Ok(ReadPlan::Done(Vec::new()));
        }
        if let Some(index) = self.ring.position_of_offset(offset) {
            return Ok(ReadPlan::Done(self.collect_ring(index, bytes_max, usize::MAX, None)));
        }
        let mut found = self.shared.cache.borrow_mut().collect(self.group, offset, bytes_max);
        if let Some(last) = found.last() {
            // A cached run that reaches the ring goes on there.
            if self.ring.first_op() == Some(last.op() + 1) {
                let bytes: usize = found.iter().map(|prepare| prepare.record.len()).sum();
                let bytes_left = bytes_max.saturating_sub(bytes);
                // The ring's "at least one" is the cached run's already.
                let from_ring = self.collect_ring(0, bytes_left, usize::MAX, None);
                if from_ring.first().is_some_and(|first| first.record.len() <= bytes_left) {
                    found.extend(from_ring);
                }
            }
            return Ok(ReadPlan::Done(found));
        }
        if for_consumer {
            self.shared.cache.borrow_mut().counters_mut().misses += 1;
        }
        let segment = self.segments.partition_point(|segment| segment.base_offset <= offset) - 1;
        let position = self.segments[segment].index.position_for_offset(offset);
        let mut plan =
            self.plan_disk(segment, position, bytes_max, usize::MAX, Want::Offset(offset));
        if let ReadPlan::Disk(read) = &mut plan {
            // The rest of the read's first window is read anyway: decode it for the cache.
            read.ahead_to_bytes = position + self.shared.scan_window_bytes as u64;
        }
        Ok(plan)
    }

    /// Plans a read of the prepare with this op.
    pub fn plan_read_op(&self, op: u64) -> Result<ReadPlan<S>> {
        self.plan_read_ops(op, 1, 1)
    }

    /// Plans a read of the prepares from `op` on: at most `prepares_max` of them, and at most
    /// `bytes_max` bytes of records (always the first one, when it exists). A peer's repair
    /// asks for runs of consecutive ops, which one scan reads in order.
    pub fn plan_read_ops(
        &self,
        op: u64,
        prepares_max: usize,
        bytes_max: usize,
    ) -> Result<ReadPlan<S>> {
        self.check_serving()?;
        let prepares_max = prepares_max.max(1);
        if op == 0 || op > self.head.op {
            return Ok(ReadPlan::Done(Vec::new()));
        }
        if let Some(first) = self.ring.first_op()
            && self.ring.by_op(op).is_some()
        {
            let index = (op - first) as usize;
            return Ok(ReadPlan::Done(self.collect_ring(index, bytes_max, prepares_max, None)));
        }
        let segment = self.segments.partition_point(|segment| segment.first_op <= op);
        let Some(segment) = segment.checked_sub(1) else { return Ok(ReadPlan::Done(Vec::new())) };
        let position = self.segments[segment].index.position_for_op(op);
        Ok(self.plan_disk(segment, position, bytes_max, prepares_max, Want::Op(op)))
    }

    /// Plans finding the first prepare appended at or after `time_ms`.
    pub fn plan_read_time(&self, time_ms: i64) -> Result<ReadPlan<S>> {
        self.check_serving()?;
        let segment = self.segments.partition_point(|segment| segment.last_append_ms < time_ms);
        if segment == self.segments.len() {
            return Ok(ReadPlan::Done(Vec::new()));
        }
        let position = self.segments[segment].index.position_for_time(time_ms);
        Ok(self.plan_disk(segment, position, 1, 1, Want::Time(time_ms)))
    }

    /// Completes a disk read: reports corruption (marking the log faulty: it refuses service
    /// rather than serve around damage) and read errors (the log keeps serving: nothing on disk
    /// changed), and continues from the ring where the disk part ended.
    pub fn finish_read(&mut self, done: DiskReadDone) -> Result<Vec<StoredPrepare>> {
        match done.result {
            Ok(()) => {}
            // A cut since the plan may have zeroed what the read expected to find: what it
            // ran into says nothing of the disk. The caller may retry, as for a failed read.
            Err(Error::Corruption(corruption))
                if done.cache_epoch != self.shared.cache.borrow().epoch() =>
            {
                return Err(Error::io(
                    "reading while a log of the shard was cut",
                    std::io::Error::new(std::io::ErrorKind::Interrupted, corruption.to_string()),
                ));
            }
            // Damage stops the log: serving around it could hand out a hole as the end.
            Err(error @ Error::Corruption(_)) => return Err(self.fail(error)),
            // A read that failed changed nothing on disk: the caller hears of it (never as
            // "absent") and may retry; the log keeps serving.
            Err(error) => return Err(error),
        }
        let mut found = done.found;
        if matches!(done.want, Want::Offset(_)) && !done.replay {
            self.cache_read(done.cache_epoch, found.iter().chain(&done.ahead));
        }
        if done.reached_written_end {
            let bytes: usize = found.iter().map(|prepare| prepare.record.len()).sum();
            let from_op = found.last().map_or(self.written.op + 1, |prepare| prepare.op() + 1);
            if let Some(first) = self.ring.first_op() {
                let limit = done.prepares_max;
                if found.len() < limit && from_op >= first {
                    let index = (from_op - first) as usize;
                    let want = found.is_empty().then_some(done.want);
                    let bytes_left = done.bytes_max.saturating_sub(bytes);
                    found.extend(self.collect_ring(index, bytes_left, limit - found.len(), want));
                }
            }
        }
        if let Want::Op(op) = done.want {
            let end = op.saturating_add(done.prepares_max as u64);
            found.retain(|prepare| (op..end).contains(&prepare.op()));
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

    /// Reads up to `prepares_max` prepares from `op` on, and up to `bytes_max` bytes of records
    /// (always the first, when it exists), in one scan, for a replay that walks the log once
    /// (a restart's producer tables): see [`PartitionLog::replay_offset`].
    pub async fn read_ops(
        &mut self,
        op: u64,
        prepares_max: usize,
        bytes_max: usize,
    ) -> Result<Vec<StoredPrepare>> {
        let plan = self.plan_read_ops(op, prepares_max, bytes_max)?;
        self.complete(self.as_replay(plan, false)).await
    }

    /// Reads the prepares containing `offset` and after it, up to `bytes_max` bytes of records,
    /// for a replay that walks the log once (a restart's consumer offsets). Unlike a consumer's
    /// read, nothing enters the batch cache (a restart replays every group, and would fill
    /// the cache with fresh memory for reads no consumer made), and the scan's windows come
    /// from the shard's replay shelf: a caller that drops what it read before the next call
    /// reuses one window instead of paying a fresh one's first touch each time.
    pub async fn replay_offset(
        &mut self,
        offset: u64,
        bytes_max: usize,
    ) -> Result<Vec<StoredPrepare>> {
        let plan = self.plan_offset(offset, bytes_max, false)?;
        self.complete(self.as_replay(plan, false)).await
    }

    /// The headers of the newest `count` ops (fewer where the log holds fewer, past
    /// retention), ascending and ending at the head, each record's checksums verified on the
    /// way: what a restarting replica needs of its log. A replay's read (see
    /// [`PartitionLog::replay_offset`]) that keeps no record at all: each is dropped once
    /// checked.
    pub async fn read_newest_headers(&mut self, count: usize) -> Result<Vec<Header>> {
        let from_op = (self.head.op + 1).saturating_sub(count as u64).max(self.first_op()).max(1);
        let count = (self.head.op + 1).saturating_sub(from_op);
        if count == 0 {
            return Ok(Vec::new());
        }
        let plan = self.plan_read_ops(from_op, count as usize, usize::MAX)?;
        let found = self.complete(self.as_replay(plan, true)).await?;
        Ok(found.into_iter().map(|prepare| prepare.header).collect())
    }

    /// `plan`'s disk read made a replay's: no decoding ahead for the cache, windows from the
    /// replay shelf.
    fn as_replay(&self, mut plan: ReadPlan<S>, headers_only: bool) -> ReadPlan<S> {
        if let ReadPlan::Disk(read) = &mut plan {
            read.ahead_to_bytes = 0;
            read.replay =
                Some(Replay { shelf: self.shared.replay_scan_shelf.clone(), headers_only });
        }
        plan
    }

    /// The offset of the first message appended at or after `time_ms`, if any.
    pub async fn offset_for_time(&mut self, time_ms: i64) -> Result<Option<u64>> {
        let plan = self.plan_read_time(time_ms)?;
        Ok(self.complete(plan).await?.first().map(StoredPrepare::base_offset))
    }

    fn plan_disk(
        &self,
        segment: usize,
        position: u64,
        bytes_max: usize,
        prepares_max: usize,
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
            prepares_max,
            want,
            continue_in_ring,
            ahead_to_bytes: 0,
            read_ahead: false,
            cache_epoch: self.shared.cache.borrow().epoch(),
            replay: None,
            _in_flight: Rc::clone(&self.disk_reads),
        })
    }

    /// Caches prepares a disk read found, unless the log's history changed since it was
    /// planned (they may be ops a truncation cut).
    fn cache_read<'a>(&self, epoch: u64, prepares: impl Iterator<Item = &'a StoredPrepare>) {
        let mut cache = self.shared.cache.borrow_mut();
        if cache.epoch() != epoch {
            return;
        }
        for prepare in prepares.filter(|prepare| prepare.op() <= self.written.op) {
            cache.insert(self.group, prepare.clone(), false);
        }
    }

    /// Read-ahead for a consumer that will read from `offset` next: when the cache holds less
    /// than the read-ahead span past it, reads of about one scan window each, starting where
    /// the cached run (or the reads already in flight) end, up to `read_ahead_windows` in
    /// flight. Each starts at a record that the sparse index names and ends before the next
    /// read's first record, so no record is read twice. Nothing when `offset` is not on disk
    /// yet (the ring serves it) or read-ahead is off. Run each, then
    /// [`PartitionLog::finish_read_ahead`].
    pub fn plan_read_ahead(&mut self, offset: u64) -> Vec<DiskRead<S>> {
        let windows_max = self.shared.read_ahead_windows;
        let window = self.shared.scan_window_bytes as u64;
        let mut reads = Vec::new();
        // What the ring holds is served from memory already: read-ahead stops where it begins.
        let ring_start = self.ring.get(0).map(StoredPrepare::base_offset);
        let disk_end = ring_start
            .map_or(self.written.next_offset, |start| start.min(self.written.next_offset));
        if windows_max == 0
            || self.faulty.is_some()
            || self.shared.cache.borrow().budget_bytes() == 0
            || offset < self.first_offset()
            || offset >= disk_end
            || self.reads_ahead_in_flight >= windows_max
        {
            return reads;
        }
        let span = windows_max * window as usize;
        let (run_end, cached) = self.shared.cache.borrow().run_end(self.group, offset, span);
        if cached >= span / 2 {
            return reads;
        }
        // Reads in flight past the cached run continue; otherwise (none, or another reader's
        // elsewhere) start at the run's end.
        let mut from = run_end;
        if self.reads_ahead_in_flight > 0 && self.read_ahead_to_offset > run_end {
            from = self.read_ahead_to_offset;
        }
        let mut planned = cached as u64;
        while self.reads_ahead_in_flight < windows_max && planned < span as u64 && from < disk_end {
            let segment = self.segments.partition_point(|s| s.base_offset <= from) - 1;
            let meta = &self.segments[segment];
            let written_end = self.written_end(meta);
            let start = meta.index.position_for_offset(from);
            let entries = meta.index.entries();
            let next = entries.partition_point(|entry| entry.position_bytes < start + window);
            let (stop, stop_offset) = match entries.get(next) {
                Some(entry) if entry.position_bytes < written_end => {
                    (entry.position_bytes, entry.offset)
                }
                _ if written_end < meta.end_bytes => (written_end, self.written.next_offset),
                _ => (written_end, meta.next_offset),
            };
            if stop <= start || stop_offset <= from {
                break;
            }
            let ReadPlan::Disk(mut read) =
                self.plan_disk(segment, start, 0, usize::MAX, Want::Offset(from))
            else {
                break;
            };
            read.segments.truncate(1);
            read.continue_in_ring = false;
            read.ahead_to_bytes = stop;
            read.read_ahead = true;
            reads.push(read);
            self.reads_ahead_in_flight += 1;
            planned += stop - start;
            from = stop_offset;
        }
        self.read_ahead_to_offset = from;
        self.shared.cache.borrow_mut().counters_mut().reads_ahead += reads.len() as u64;
        reads
    }

    /// Completes a read-ahead: caches what it decoded. What stopped it early (damage, a failed
    /// read) is left for the read that wants those records.
    pub fn finish_read_ahead(&mut self, done: DiskReadDone) {
        self.reads_ahead_in_flight = self.reads_ahead_in_flight.saturating_sub(1);
        self.cache_read(done.cache_epoch, done.found.iter().chain(&done.ahead));
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

    /// Ring entries from `index`: skipping those `want` rejects (until the first it accepts),
    /// then up to `prepares_max` entries and `bytes_max` bytes, at least one.
    fn collect_ring(
        &self,
        mut index: usize,
        bytes_max: usize,
        prepares_max: usize,
        want: Option<Want>,
    ) -> Vec<StoredPrepare> {
        let mut out: Vec<StoredPrepare> = Vec::new();
        let mut bytes = 0;
        while out.len() < prepares_max
            && let Some(prepare) = self.ring.get(index)
        {
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
}
