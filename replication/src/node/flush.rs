//! The jobs in flight across I/O rounds: the flush cycles (the node's in-flight flush table,
//! oldest first), the one checkpoint job and the one zero fill; polling them, applying them
//! once finished, and settling the log (every job run to its end) when a view change,
//! truncation, new group, backpressure or close needs it at rest.
//!
//! Flush cycles are applied strictly in the order they began, so the durability ticket only
//! moves forward and never past a write that a cycle left to a later one; a cycle that hit a
//! full disk or failed is retried by the next round, never at once.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use shoal_engine::Error as EngineError;
use shoal_engine::shard::{CheckpointDone, FlushReport, ShardFlushDone, ZeroFillDone};
use shoal_engine::storage::Storage;

use super::config::{Clock, Transport};
use super::state::Node;

/// A checkpoint job running across I/O rounds.
pub(super) type CheckpointRun<S> = Pin<Box<dyn Future<Output = CheckpointDone<S>>>>;

/// A zero fill running across I/O rounds.
pub(super) type ZeroFillRun<S> = Pin<Box<dyn Future<Output = ZeroFillDone<S>>>>;

/// A flush cycle running across I/O rounds.
type FlushRun<S> = Pin<Box<dyn Future<Output = ShardFlushDone<S>>>>;

/// A flush cycle in flight: its I/O, the ticket of the newest write it makes durable (None when
/// it left some of what preceded it to a later cycle), and its result once it finished ahead of
/// an older cycle (cycles are applied in the order they began).
pub(super) struct InFlightFlush<S: Storage> {
    run: FlushRun<S>,
    ticket: Option<u64>,
    done: Option<ShardFlushDone<S>>,
}

/// Flush cycles one round (or one poll of the jobs) runs at most before yielding: each carries
/// everything pending when it began, so more than a few means something keeps failing.
pub(super) const FLUSHES_PER_ROUND_MAX: usize = 64;

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// Polls the jobs in flight, applies those that finished and starts the next ones (a flush
    /// cycle when anything is pending, a checkpoint when one is due, the disk reads for peers
    /// the queue allows); true when a job finished.
    pub(super) fn poll_jobs(&mut self, cx: &mut Context<'_>) -> bool {
        let mut finished = false;
        for _ in 0..FLUSHES_PER_ROUND_MAX {
            let mut again = false;
            if let Some(run) = self.checkpoint.as_mut()
                && let Poll::Ready(done) = run.as_mut().poll(cx)
            {
                self.checkpoint = None;
                self.apply_checkpoint(done);
                finished = true;
            }
            if let Some(run) = self.zero_fill.as_mut()
                && let Poll::Ready(done) = run.as_mut().poll(cx)
            {
                self.zero_fill = None;
                self.apply_zero_fill(done);
                finished = true;
            }
            for cycle in self.flushes.iter_mut().filter(|cycle| cycle.done.is_none()) {
                if let Poll::Ready(done) = cycle.run.as_mut().poll(cx) {
                    cycle.done = Some(done);
                }
            }
            while self.flushes.front().is_some_and(|cycle| cycle.done.is_some()) {
                let cycle = self.flushes.pop_front().expect("checked");
                // A failure is recorded in the groups; the next round retries a full disk.
                let _ = self.finish_flush(cycle.done.expect("checked"), cycle.ticket);
                finished = true;
            }
            if !self.flush_blocked
                && let Some(flush) = self.store.begin_flush()
            {
                let ticket = flush.is_complete().then(|| self.applied_ticket());
                self.flushes.push_back(InFlightFlush {
                    run: Box::pin(flush.run()),
                    ticket,
                    done: None,
                });
                again = true;
            }
            if self.checkpoint.is_none()
                && let Some(job) = self.store.begin_checkpoint()
            {
                self.checkpoint = Some(Box::pin(job.run()));
                again = true;
            }
            if self.zero_fill.is_none()
                && let Some(job) = self.store.begin_zero_fill()
            {
                self.zero_fill = Some(Box::pin(job.run()));
                again = true;
            }
            if self.poll_peer_reads(cx) {
                finished = true;
                let before = self.peer_reads.len();
                self.serve_reads();
                again |= self.peer_reads.len() > before;
            }
            if !again {
                break;
            }
        }
        finished
    }

    /// Applies a finished flush cycle: failures, then the durable positions it reached; false
    /// when the disk was full or the cycle failed.
    pub(super) fn finish_flush(&mut self, done: ShardFlushDone<S>, ticket: Option<u64>) -> bool {
        let report = self.store.finish_flush(done);
        let ok = self.apply_flush_report(report);
        if ok {
            // A complete cycle: everything applied before it began is durable now.
            if let Some(ticket) = ticket {
                self.tickets_durable = self.tickets_durable.max(ticket);
            }
        } else {
            // Retried by the next round, not at once.
            self.flush_blocked = true;
        }
        self.report_durable();
        ok
    }

    /// The ticket below which every write is applied to the engine (queued ones, and those
    /// after the first one a full disk deferred, are not all).
    pub(super) fn applied_ticket(&self) -> u64 {
        self.writes.front().map_or(self.tickets_issued, |(ticket, _, _)| ticket - 1)
    }

    /// Waits for the flush cycles in flight, oldest first, and applies them; false when one
    /// failed. (An older cycle never waits for a newer one, so awaiting them one at a time
    /// cannot stall.)
    pub(super) async fn finish_flushes_in_flight(&mut self) -> bool {
        let mut ok = true;
        while let Some(cycle) = self.flushes.pop_front() {
            let done = match cycle.done {
                Some(done) => done,
                None => cycle.run.await,
            };
            ok &= self.finish_flush(done, cycle.ticket);
        }
        ok
    }

    /// Waits for the flush cycles, the checkpoint and the zero fill in flight, if any, and
    /// applies them; false when one failed.
    pub(super) async fn finish_jobs(&mut self) -> bool {
        let mut ok = self.finish_flushes_in_flight().await;
        if let Some(run) = self.checkpoint.take() {
            let done = run.await;
            ok &= self.apply_checkpoint(done);
        }
        if let Some(run) = self.zero_fill.take() {
            let done = run.await;
            ok &= self.apply_zero_fill(done);
        }
        ok
    }

    /// Runs flush cycles and checkpoints to the end, waiting for each (bounded): for view
    /// changes, truncations, creating groups, backpressure and closing. False when the storage
    /// was full or an error stopped it.
    pub(super) async fn settle(&mut self) -> bool {
        if !self.finish_jobs().await {
            return false;
        }
        for _ in 0..64 {
            if !self.store.has_pending() && !self.store.has_checkpoint_pending() {
                return true;
            }
            match self.store.flush().await {
                Ok(report) => {
                    if !self.apply_flush_report(report) {
                        return false;
                    }
                }
                Err(error) => {
                    self.fail_all(&error);
                    return false;
                }
            }
        }
        false
    }

    /// Applies a flush cycle's failures; false when the storage was full or the shard failed.
    pub(super) fn apply_flush_report(&mut self, report: FlushReport) -> bool {
        for (group, reason) in report.failed {
            self.fail_group(group, EngineError::Invalid(reason));
        }
        if let Some(reason) = self.store.failure() {
            let error = EngineError::Invalid(format!("shard storage failed: {reason}"));
            self.fail_all(&error);
            return false;
        }
        !report.storage_full
    }

    /// Applies a finished zero fill: a group whose step failed is fail-stop; a full disk is
    /// retried at the retry pace. False when a step failed or found no room.
    pub(super) fn apply_zero_fill(&mut self, done: ZeroFillDone<S>) -> bool {
        let report = self.store.finish_zero_fill(done);
        self.apply_flush_report(report)
    }

    /// Applies a finished checkpoint job; false when it failed or waits for space.
    pub(super) fn apply_checkpoint(&mut self, done: CheckpointDone<S>) -> bool {
        match self.store.finish_checkpoint(done) {
            Ok(()) => true,
            // No room for a rolled segment's index: the checkpoint waits for the next retry,
            // and nothing has failed.
            Err(EngineError::StorageFull) => false,
            Err(error) => {
                self.fail_all(&error);
                false
            }
        }
    }
}
