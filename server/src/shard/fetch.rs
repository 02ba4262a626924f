//! Reads for consumers — fetch and poll: where a read starts (a poll from its consumer's stored
//! offset), long-polls parked until their group's committed log grows or their wait runs out,
//! disk reads run by spawned tasks and completed on the loop, and the reply built from what the
//! log returned. A poll that auto-commits answers only once its commit is committed.
//!
//! Consumers read below the committed end only: nothing the log holds past it is ever served.
//! In a cluster they read from the group's primary only, and only while it has heard from a
//! quorum within the heartbeat timeout (`read_refusal`).

use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use shoal_engine::partition::{DiskReadDone, ReadPlan};
use shoal_engine::ring::StoredPrepare;
use shoal_proto::batch::BatchHeader;
use shoal_proto::protocol::consumer::{ConsumerId, OffsetCommitRecord};
use shoal_proto::protocol::{ErrorCode, FetchFrom, FetchReply};
use shoal_proto::wire::ClientRequest;
use shoal_replication::TICK_MS;

use super::state::ShardState;
use super::work::{FetchArgs, Outcome, ReplySender, SendOutcome, Work, redirect};
use super::writes::WriteKind;

/// Where a read's result goes: a fetch's slot, or a poll's (which may commit first).
pub(super) enum ReadFor {
    Fetch(ReplySender),
    Poll(PollFor),
}

/// A poll's own part of a read: whose offset it starts from and how it answers.
pub(super) struct PollFor {
    pub(super) consumer: ConsumerId,
    /// Where the poll starts at the earliest: past control records it skipped.
    pub(super) skipped_to: u64,
    pub(super) auto_commit: bool,
    pub(super) client: ClientRequest,
    pub(super) reply: ReplySender,
}

/// A disk read finished by a spawned task, for the loop to complete.
pub(super) struct ReadDone {
    group: u64,
    args: FetchArgs,
    done: DiskReadDone,
    to: ReadFor,
}

/// A fetch waiting for its group's committed log to reach its start (long-poll).
pub(super) struct ParkedFetch {
    pub(super) group: u64,
    pub(super) args: FetchArgs,
    pub(super) deadline: Instant,
    pub(super) to: ReadFor,
}

impl ShardState {
    /// Reads from a partition group owned here, for a fetch or a poll: at once when its start
    /// is below the committed end, else parked until it is (or answered empty).
    pub(super) fn fetch(&mut self, group: u64, args: FetchArgs, to: ReadFor) {
        self.fetches_next.push_back((group, args, to));
        if self.fetching {
            return;
        }
        self.fetching = true;
        while let Some((group, args, to)) = self.fetches_next.pop_front() {
            self.fetch_one(group, args, to);
        }
        self.fetching = false;
    }

    fn fetch_one(&mut self, group: u64, args: FetchArgs, to: ReadFor) {
        if let Some(refusal) = self.read_refusal(group) {
            to.reply().send_outcome(refusal);
            return;
        }
        let committed_end = self.committed_end.get(&group).copied().unwrap_or(0);
        // A poll starts at its consumer's stored offset, looked up again at every run (a parked
        // poll woken later sees commits made meanwhile); it waits while its own auto-commit is
        // in flight, so two polls never return the same messages.
        let mut args = args;
        if let ReadFor::Poll(poll) = &to {
            if poll.auto_commit && self.commits_in_flight.contains(&(group, poll.consumer.clone()))
            {
                let args = FetchArgs { wait_ms_max: args.wait_ms_max.max(1), ..args };
                self.park_or_answer(group, args, to);
                return;
            }
            args.from = match self.offsets.get(&group).and_then(|o| o.get(&poll.consumer)) {
                Some(offset) => FetchFrom::Offset(offset.max(poll.skipped_to)),
                None if poll.skipped_to > 0 => FetchFrom::Offset(poll.skipped_to),
                None => FetchFrom::First,
            };
        }
        let Some(first_offset) = self.log_start(group) else {
            let text = format!("group {group} is not on shard {}", self.index);
            to.reply().send_outcome(Outcome::error(ErrorCode::PartitionFailed, text));
            return;
        };
        // Where an offset read starts; a start at or past the committed end waits for data
        // (long-poll) or gets nothing.
        let start = match args.from {
            FetchFrom::Timestamp(_) => None,
            // Below the log start is gone (retention, or DeleteRecords): read from the start.
            FetchFrom::Offset(offset) => Some(offset.max(first_offset)),
            FetchFrom::First => Some(first_offset),
            FetchFrom::Last => {
                Some(committed_end.saturating_sub(1).max(first_offset).min(committed_end))
            }
        };
        // A poll's reply tells the client where it starts, so a start moved up to the log
        // start is the one it must be told.
        if let (FetchFrom::Offset(_), Some(start)) = (args.from, start) {
            args.from = FetchFrom::Offset(start);
        }
        if let Some(start) = start
            && start >= committed_end
        {
            let args = FetchArgs { from: FetchFrom::Offset(start), ..args };
            self.park_or_answer(group, args, to);
            return;
        }
        // Offsets only (a Kafka Fetch's partitions past its response's budget): no read.
        if args.bytes_max == 0 && start.is_some() {
            self.answer_fetch(group, args, Vec::new(), to);
            return;
        }
        let plan = match args.from {
            FetchFrom::Timestamp(time_ms) => self.node.plan_read_time(group, time_ms),
            _ => self.node.plan_read_offset(group, start.unwrap_or(0), args.bytes_max as usize),
        };
        match plan {
            Err(error) => {
                let outcome = Outcome::error(ErrorCode::PartitionFailed, error.to_string());
                to.reply().send_outcome(outcome);
            }
            Ok(ReadPlan::Done(found)) => self.found(group, args, found, to),
            Ok(ReadPlan::Disk(read)) => {
                let done_list = Rc::clone(&self.reads_done);
                let wake = self.mesh[self.index as usize].clone();
                monoio::spawn(async move {
                    let done = read.run().await;
                    done_list.borrow_mut().push(ReadDone { group, args, done, to });
                    let _ = wake.try_send(Work::Wake);
                });
            }
        }
    }

    /// Where partition group `group`'s log starts for consumers: its first retained offset, or
    /// the log start DeleteRecords moved it to when that is higher (`None`: not on this shard).
    pub(super) fn log_start(&self, group: u64) -> Option<u64> {
        let retained = self.node.log_first_offset(group)?;
        Some(retained.max(self.offsets.get(&group).map_or(0, |o| o.log_start)))
    }

    /// Starts the read-ahead the log wants for a consumer that reads from `offset` next: each
    /// read runs in its own task, so several are in flight, and lands in the batch cache.
    fn read_ahead(&mut self, group: u64, offset: u64) {
        for read in self.node.plan_read_ahead(group, offset) {
            let done_list = Rc::clone(&self.reads_ahead_done);
            let wake = self.mesh[self.index as usize].clone();
            monoio::spawn(async move {
                let done = read.run().await;
                done_list.borrow_mut().push((group, done));
                let _ = wake.try_send(Work::Wake);
            });
        }
    }

    /// Why a read of `group` (fetch, poll, stored offset) must not be served here, if it must
    /// not: consumers read from the group's primary only, so a backup redirects
    /// ([`redirect`]); and a primary that has not heard from a quorum of its group within the
    /// heartbeat timeout may have been deposed without knowing it, so it refuses
    /// (`TransientNotAccepted`) rather than serve what a new primary may already have
    /// overtaken. A group of one voter always serves (learners cannot depose it). A stopped
    /// group serves nothing (DESIGN.md §6: a partition with damage refuses service), and says
    /// why.
    pub(super) fn read_refusal(&self, group: u64) -> Option<Outcome> {
        if let Some(reason) = self.node.group_failure(group) {
            let why = format!("group {group} stopped: {reason}");
            return Some(Outcome::error(ErrorCode::PartitionFailed, why));
        }
        let replica = self.node.replica(group)?;
        let config = replica.config();
        // The one voter of its group serves alone; a replica a move removed (no longer a
        // voter) is redirected below, never serving its log's stale end.
        if config.voter_count() == 1 && config.is_voter(config.replica) {
            return None;
        }
        if let Some(refusal) = redirect(replica) {
            return Some(refusal);
        }
        // A new primary holds every op an earlier primary may have acknowledged, but it serves
        // their effects (a stored offset) only once it has committed them in its own view.
        let view_start_op = replica.log_view_head_op().unwrap_or(0);
        if replica.log_view() == replica.view() && replica.commit() < view_start_op {
            return Some(Outcome::error(
                ErrorCode::TransientNotAccepted,
                format!(
                    "this primary of view {} has not yet committed op {view_start_op}, which its \
                     view began with: retry",
                    replica.view()
                ),
            ));
        }
        let timeout_ticks = config.heartbeat_timeout_ticks;
        // Through the node: a sleeping primary's own figures trail the ticks it slept through.
        let status = self.node.group_status(group)?;
        let heard = status
            .replicas
            .iter()
            .filter(|p| config.is_voter(p.replica) && p.silent_ticks <= timeout_ticks)
            .count();
        (heard < config.quorum()).then(|| {
            Outcome::error(
                ErrorCode::TransientNotAccepted,
                format!(
                    "this primary of view {} has not heard from a quorum for {} ms: retry",
                    status.view,
                    timeout_ticks * TICK_MS
                ),
            )
        })
    }

    /// A fetch with nothing to read yet: held until its group commits more or its wait runs
    /// out, or answered at once (empty) when it may not wait or the shard holds enough waiting.
    fn park_or_answer(&mut self, group: u64, args: FetchArgs, to: ReadFor) {
        if args.wait_ms_max == 0 || self.parked.len() >= self.config.network.fetch_parked_max {
            self.answer_fetch(group, args, Vec::new(), to);
            return;
        }
        let deadline = Instant::now() + Duration::from_millis(u64::from(args.wait_ms_max));
        let key = self.parked.insert(ParkedFetch { group, args, deadline, to });
        self.parked_by_group.entry(group).or_default().push(key);
    }

    /// Runs again every fetch parked on `group`, whose committed log just grew (or whose
    /// consumer's auto-commit finished).
    pub(super) fn wake_parked(&mut self, group: u64) {
        let Some(keys) = self.parked_by_group.remove(&group) else { return };
        let now = Instant::now();
        for key in keys {
            let fetch = self.parked.remove(key);
            let wait_ms_left = fetch.deadline.saturating_duration_since(now).as_millis() as u32;
            let args = FetchArgs { wait_ms_max: wait_ms_left.max(1), ..fetch.args };
            self.fetch(group, args, fetch.to);
        }
    }

    /// Answers, empty, every parked fetch whose wait ran out (checked every tick).
    pub(super) fn expire_parked(&mut self) {
        if self.parked.is_empty() {
            return;
        }
        let now = Instant::now();
        let expired: Vec<usize> = self
            .parked
            .iter()
            .filter(|(_, fetch)| fetch.deadline <= now)
            .map(|(key, _)| key)
            .collect();
        for key in expired {
            let fetch = self.parked.remove(key);
            if let Some(keys) = self.parked_by_group.get_mut(&fetch.group) {
                keys.retain(|&parked| parked != key);
                if keys.is_empty() {
                    self.parked_by_group.remove(&fetch.group);
                }
            }
            self.answer_fetch(fetch.group, fetch.args, Vec::new(), fetch.to);
        }
    }

    /// Completes the disk reads their tasks finished: read-ahead first, so that the reads
    /// completed with it may continue into what it cached.
    pub(super) fn finish_reads(&mut self) {
        let ahead: Vec<(u64, DiskReadDone)> =
            std::mem::take(&mut *self.reads_ahead_done.borrow_mut());
        for (group, done) in ahead {
            self.node.finish_read_ahead(group, done);
        }
        let done: Vec<ReadDone> = std::mem::take(&mut *self.reads_done.borrow_mut());
        for read in done {
            if !self.node.has_log(read.group) {
                continue;
            }
            match self.node.finish_read(read.group, read.done) {
                Ok(found) => self.found(read.group, read.args, found, read.to),
                Err(error) => {
                    let outcome = Outcome::error(ErrorCode::PartitionFailed, error.to_string());
                    read.to.reply().send_outcome(outcome);
                }
            }
        }
    }

    /// Completes a fetch with what the log returned: a time lookup becomes an offset read,
    /// anything else is the answer.
    fn found(&mut self, group: u64, args: FetchArgs, found: Vec<StoredPrepare>, to: ReadFor) {
        if let FetchFrom::Timestamp(_) = args.from {
            match found.first() {
                Some(prepare) => {
                    let from = FetchFrom::Offset(prepare.base_offset());
                    self.fetch(group, FetchArgs { from, ..args }, to);
                }
                None => {
                    // Nothing at or after that time yet: what comes next will be.
                    let end = self.committed_end.get(&group).copied().unwrap_or(0);
                    let args = FetchArgs { from: FetchFrom::Offset(end), ..args };
                    self.park_or_answer(group, args, to);
                }
            }
            return;
        }
        if let Some(last) = found.last() {
            self.read_ahead(group, last.end_offset());
        }
        self.answer_fetch(group, args, found, to);
    }

    /// Answers a fetch with the committed batches of `found`; a poll that auto-commits first
    /// stores the offset after them and answers once that commit is committed.
    fn answer_fetch(
        &mut self,
        group: u64,
        args: FetchArgs,
        found: Vec<StoredPrepare>,
        mut to: ReadFor,
    ) {
        let next_offset = self.committed_end.get(&group).copied().unwrap_or(0);
        let first_offset = self.log_start(group).unwrap_or(0);
        let mut records = 0u64;
        let mut end_offset = None;
        let mut batches: Vec<Bytes> = Vec::new();
        for prepare in found {
            // Consumers read only committed data; the log may hold more.
            if records >= u64::from(args.count_max.max(1)) || prepare.end_offset() > next_offset {
                break;
            }
            let fields = shoal_engine::record::prepare_of(&prepare.header);
            records += u64::from(fields.record_count);
            end_offset = Some(prepare.end_offset());
            batches.push(prepare.body());
        }
        let prefix = FetchReply {
            partition: args.partition,
            first_offset,
            next_offset,
            batch_count: batches.len() as u32,
        }
        .encode_prefix();
        let mut head = Vec::with_capacity(8 + prefix.len());
        if let ReadFor::Poll(_) = to {
            // A poll's reply starts with where it started (the stored offset), so the client
            // skips what precedes it in the first batch.
            let start = match args.from {
                FetchFrom::Offset(offset) => offset,
                _ => first_offset,
            };
            head.extend_from_slice(&start.to_le_bytes());
        }
        head.extend_from_slice(&prefix);
        // A poll that found only control records (offset commits) has nothing to deliver: it
        // goes on from past them (waiting, when it may, for what comes next).
        if let (ReadFor::Poll(poll), Some(end)) = (&mut to, end_offset)
            && batches.iter().all(|batch| BatchHeader::parse(batch).is_ok_and(|h| h.is_control()))
        {
            poll.skipped_to = end;
            self.fetch(group, args, to);
            return;
        }
        // The batches are not copied: the reply is written from the ring's or the read's views.
        let mut parts = Vec::with_capacity(batches.len() + 1);
        parts.push(Bytes::from(head));
        parts.extend(batches);
        let answer = Outcome::parts(parts);
        match (to, end_offset) {
            (ReadFor::Poll(poll), Some(end)) if poll.auto_commit => {
                let key = (group, poll.consumer.clone());
                let record = OffsetCommitRecord { consumer: poll.consumer, offset: Some(end) };
                let kind = |record| WriteKind::PollCommit { record, answer };
                // Marked first: a write refused inside `store_offset` clears the mark again.
                self.commits_in_flight.insert(key.clone());
                if !self.store_offset(group, poll.client, record, kind, poll.reply) {
                    self.commits_in_flight.remove(&key);
                }
            }
            (to, _) => to.reply().send_outcome(answer),
        }
    }
}

impl ReadFor {
    pub(super) fn reply(self) -> ReplySender {
        match self {
            ReadFor::Fetch(reply) => reply,
            ReadFor::Poll(poll) => poll.reply,
        }
    }
}
