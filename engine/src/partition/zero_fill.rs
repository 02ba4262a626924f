//! Zeros ahead of a direct `persisted` log's tail, written off the acknowledgement path.
//!
//! A direct job's sync is what acknowledges its appends, and a sync that finds newly allocated
//! blocks commits their allocation too: about twice the cost of one into blocks already written
//! (docs/benchmarks.md, "Zeros ahead for the direct path"). A log whose direct jobs are small
//! therefore gets its step ahead of the tail written with zeros and synced by a [`ZeroStep`] of
//! its own, which runs beside the flush jobs instead of inside one: no append waits for it.
//!
//! It owns the step in flight and nothing else. It never writes where data may already be: a
//! step starts past everything a job in flight writes, and a data write that reaches into the
//! step waits until the zeros are written (`FlushJob` fences on the step's latch), so zeros can
//! never land over data. Recovery needs nothing from it: zeros read as the end of the data,
//! whether they were synced or not.

use std::rc::Rc;

use super::flush::{TailWrite, ZEROED_STEP_BYTES_MAX};
use super::log::PartitionLog;
use crate::error::{Error, Result};
use crate::join::Latch;
use crate::storage::{Storage, StorageFile, zero_pieces};

/// The zero step's writes, issued one after the other: an append's write that queues behind
/// one waits for this much at most (~0.1 ms at this disk's bandwidth).
const ZERO_PIECE_BYTES: usize = 256 << 10;

/// The zero steps a shard writes at once: an append's write then queues behind at most this
/// many pieces of zeros (1 MiB, ~0.6 ms here), and the steps of groups appending in step, which
/// come due together, take turns instead. All at once, 64 groups' steps held the file-system
/// form's p99 at 35–40 ms; one at a time, the zeros fell behind the appends
/// (docs/benchmarks.md, "Zero steps a few at a time").
pub const ZERO_STEPS_PER_FILL_MAX: usize = 4;

/// One log's step ahead, written with zeros and synced, beside its flush jobs.
pub struct ZeroStep<S: Storage> {
    group: u64,
    file: Rc<S::File>,
    segment_base_offset: u64,
    from_bytes: u64,
    to_bytes: u64,
    /// Opened once the zeros are written (before their sync): a data write into the step waits
    /// for it.
    written: Rc<Latch>,
}

impl<S: Storage> Drop for ZeroStep<S> {
    fn drop(&mut self) {
        // A step dropped unfinished (its node closing, a simulated crash) must not leave a
        // data write waiting for it.
        self.written.open();
    }
}

/// A finished [`ZeroStep`], to hand back to [`PartitionLog::finish_zero_step`].
pub struct ZeroStepDone<S: Storage> {
    step: ZeroStep<S>,
    result: Result<()>,
}

impl<S: Storage> ZeroStep<S> {
    /// The group the step is for.
    pub fn group(&self) -> u64 {
        self.group
    }

    /// Writes the zeros, opens the fence, then syncs them: once the sync is done the appends
    /// that land in the step commit no block allocation with their own syncs.
    pub async fn run(self) -> ZeroStepDone<S> {
        let written = self.write().await;
        self.written.open();
        let result = match written {
            Ok(()) => self.file.sync_data().await.map_err(|e| {
                Error::io(format!("syncing zeros ahead in group {} segment", self.group), e)
            }),
            Err(e) => Err(Error::preparing(
                format!("writing zeros ahead in group {} segment", self.group),
                e,
            )),
        };
        ZeroStepDone { step: self, result }
    }

    /// Writes the zeros one piece at a time: the device serves writes in the order they queue,
    /// so a step written all at once would hold an append's write behind all of it.
    async fn write(&self) -> std::io::Result<()> {
        for (position, zeros) in zero_pieces(self.from_bytes, self.to_bytes, ZERO_PIECE_BYTES) {
            self.file.write_at(zeros, position).await?;
        }
        Ok(())
    }
}

impl<S: Storage> ZeroStepDone<S> {
    /// The group the step was for.
    pub fn group(&self) -> u64 {
        self.step.group
    }

    /// Bytes of zeros the step wrote (none when it failed).
    pub fn bytes_written(&self) -> u64 {
        if self.result.is_ok() { self.step.to_bytes - self.step.from_bytes } else { 0 }
    }
}

impl<S: Storage> PartitionLog<S> {
    /// Whether this log's step ahead is due and is written with zeros by a [`ZeroStep`] (its
    /// direct jobs are small, no step is in flight, and its active segment's file exists).
    pub fn zero_step_due(&self) -> bool {
        self.zero_step_range().is_some()
    }

    /// The step ahead a [`ZeroStep`] would write now, if one is due: `[from, to)` of the active
    /// segment, within the shard's budget.
    fn zero_step_range(&self) -> Option<(u64, u64)> {
        let may_start = self.zeros_ahead
            && self.zeroing.is_none()
            && self.faulty.is_none()
            && self.truncation.is_none()
            && (!self.storage_full || self.storage_retry);
        if !may_start {
            return None;
        }
        let active = self.segments.last()?;
        if !self.files.contains_key(&active.base_offset) {
            return None;
        }
        let (from, to) = self.active_step(&[], self.shared.ready_budget.available_bytes())?;
        Some((from, to.min(from + ZEROED_STEP_BYTES_MAX)))
    }

    /// Starts the zero step that is due (None when none is): its space counts against the
    /// shard's budget and as ready from now, and data writes into it wait for its zeros.
    pub fn begin_zero_step(&mut self) -> Option<ZeroStep<S>> {
        let (from_bytes, to_bytes) = self.zero_step_range()?;
        let active = self.segments.last().expect("a step lies in the active segment");
        let segment_base_offset = active.base_offset;
        let file = Rc::clone(&self.files[&segment_base_offset]);
        if self.storage_full {
            // This step is the retry.
            self.storage_retry = false;
        }
        self.claim_ready(to_bytes - from_bytes);
        self.adapt_ready_step(true);
        let written = Rc::new(Latch::default());
        self.zeroing = Some(TailWrite::new(
            segment_base_offset,
            from_bytes,
            to_bytes - from_bytes,
            Rc::clone(&written),
        ));
        Some(ZeroStep {
            group: self.group,
            file,
            segment_base_offset,
            from_bytes,
            to_bytes,
            written,
        })
    }

    /// Applies a finished zero step: its space is ready; no room for it is the clean "storage
    /// full" (the log refuses appends that need more space than is ready until a retry); any
    /// other failure is fail-stop.
    pub fn finish_zero_step(&mut self, done: ZeroStepDone<S>) -> Result<()> {
        let ZeroStepDone { step, result } = done;
        // A log is replaced (cut, transfer) only with no zero fill in flight.
        let zeroing = self.zeroing.take();
        assert!(
            zeroing.is_some_and(|zeroing| zeroing.has_latch(&step.written)),
            "a zero step finishes on the log that began it"
        );
        let outcome = match result {
            Ok(()) => {
                let written_end =
                    self.written_end_in(self.written_blocks_end, step.segment_base_offset);
                if let Some(meta) = self.segment_mut(step.segment_base_offset) {
                    meta.ready_end_bytes = meta.ready_end_bytes.max(step.to_bytes);
                    // Zeros that continue the written blocks extend them; a step past a gap
                    // (blocks only reserved between) does not.
                    if step.from_bytes <= written_end {
                        meta.written_through_bytes = meta.written_through_bytes.max(step.to_bytes);
                    }
                }
                self.storage_full = false;
                Ok(())
            }
            Err(Error::StorageFull) => {
                self.storage_full = true;
                self.storage_retry = false;
                Err(Error::StorageFull)
            }
            Err(error) => Err(self.fail(error)),
        };
        if self.flushes_in_flight == 0 {
            self.account_ready();
        }
        outcome
    }
}
