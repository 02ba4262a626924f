//! The I/O round: the writes the replicas asked for applied to the engine in ticket order
//! (appends, view updates, durable truncations, installed state transfers), their flush
//! started, and what became durable reported back to the replicas; then held messages
//! released, peers' reads served and damaged groups reopened.
//!
//! A round never reorders a group's writes, never lets a full disk fail a group (its writes
//! wait, in order, for a later round) and never reports a view, truncation or installed state
//! to a replica before a superblock or the settled log holds it.

use std::collections::{BTreeMap, VecDeque};
use std::future::poll_fn;
use std::task::Poll;

use shoal_engine::storage::Storage;
use shoal_engine::{Error as EngineError, Result as EngineResult};
use shoal_proto::wire::Header;

use super::config::{Clock, Transport};
use super::flush::FLUSHES_PER_ROUND_MAX;
use super::state::Node;
use crate::message::{Persisted, Write};

/// What a round's writes changed besides appends: reported to each replica once durable.
struct AppliedWrites {
    /// Per group, the views its newest view update recorded (view, log view).
    views: BTreeMap<u64, (u32, u32)>,
    /// (group, op) of each durable truncation.
    truncated: Vec<(u64, u64)>,
    /// (group, op) of each state transfer installed.
    installed: Vec<(u64, u64)>,
    /// False when a write waits for space or a job it waited for failed: the durability ticket
    /// must not pass the round's writes.
    complete: bool,
}

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// Writes the replicas asked for that no I/O round has applied yet (the driver's group
    /// commit may hold them back for a while to gather more per round).
    pub fn writes_queued(&self) -> usize {
        self.writes.len()
    }

    /// Whether [`Node::run_io`] has anything to do.
    pub fn has_io(&self) -> bool {
        !self.writes.is_empty()
            || !self.reads.is_empty()
            || self.store.has_pending()
            || self.store.has_checkpoint_pending()
            || self.io_in_flight()
    }

    /// One I/O round to its end: [`Node::start_io`], then [`Node::wait_io`] until no flush
    /// cycle is in flight, so everything the round applied is durable (or failed) when it
    /// returns. The simulator and tests drive nodes with it; a checkpoint it starts may still
    /// be running afterwards.
    pub async fn run_io(&mut self) {
        self.start_io().await;
        for _ in 0..FLUSHES_PER_ROUND_MAX {
            if self.flushes.is_empty() && self.peer_reads.is_empty() {
                break;
            }
            self.wait_io().await;
        }
    }

    /// Starts a round: applies every pending write in order (appends, view updates, durable
    /// truncations) and starts a flush cycle for them unless one is in flight (the next starts
    /// as soon as it finishes, see [`Node::wait_io`]), then releases what is durable and serves
    /// log reads to peers. It does not wait for the flush: the driver goes on taking input,
    /// whose appends the next cycle carries.
    ///
    /// A due checkpoint job (segment syncs, then a superblock version) also outlives the round
    /// that starts it: appends are durable without it (written for `replicated`, journaled for
    /// `persisted`), so its syncs stay off the reply path. A round that records views or
    /// truncates waits for every job instead and settles: views are durable only once a
    /// superblock holds them, and a truncation needs the log at rest.
    pub async fn start_io(&mut self) {
        self.counters.io_rounds += 1;
        self.flush_blocked = false;
        let applied = self.apply_writes().await;
        self.flush_applied(applied).await;
        self.release_held();
        self.serve_reads();
        for (group, reason) in std::mem::take(&mut self.damaged) {
            self.reopen_damaged(group, reason).await;
        }
        self.clear_repaired_damage();
        self.send_heartbeats();
    }

    /// Whether a flush cycle, a checkpoint job, a zero fill or a disk read for a peer is in
    /// flight (see [`Node::wait_io`]).
    pub fn io_in_flight(&self) -> bool {
        !self.flushes.is_empty()
            || self.checkpoint.is_some()
            || self.zero_fill.is_some()
            || !self.peer_reads.is_empty()
    }

    /// Waits until a flush cycle, checkpoint job, zero fill or disk read for a peer in flight
    /// finishes, and applies it: the writes its cycle carried are durable (replies and held
    /// messages follow), and the next cycle starts at once with whatever was appended
    /// meanwhile; a finished read is sent, and the next queued ones start. Never finishes when
    /// nothing is in flight. Cancel-safe: the jobs live in the node, not in this future.
    pub async fn wait_io(&mut self) {
        poll_fn(|cx| if self.poll_jobs(cx) { Poll::Ready(()) } else { Poll::Pending }).await;
        self.release_held();
        self.send_heartbeats();
    }

    /// Applies every queued write to the engine in ticket order, the writes of a group whose
    /// storage is full or whose append a bound still refuses after settling (and its later
    /// ones) kept in order for a later round, those of a stopped group dropped.
    async fn apply_writes(&mut self) -> AppliedWrites {
        let mut views: BTreeMap<u64, (u32, u32)> = BTreeMap::new();
        let mut truncated: Vec<(u64, u64)> = Vec::new();
        let mut installed: Vec<(u64, u64)> = Vec::new();
        let mut complete = true;
        // Writes of groups whose storage is full (or whose append a bound refused), kept in
        // order for a later round.
        let mut deferred: VecDeque<(u64, u64, Write)> = VecDeque::new();
        let mut waiting_groups: Vec<u64> = Vec::new();
        while let Some((ticket, group, write)) = self.writes.pop_front() {
            if self.groups.get(&group).is_none_or(|g| g.failed.is_some()) {
                continue;
            }
            if waiting_groups.contains(&group) {
                deferred.push_back((ticket, group, write));
                continue;
            }
            let result = match &write {
                Write::Append { header, body } => self.append(group, header, body).await,
                Write::Views { view, log_view, log_view_head_op } => {
                    views.insert(group, (*view, *log_view));
                    self.store.set_views(group, *view, *log_view, *log_view_head_op)
                }
                Write::Truncate { op, view } => {
                    self.drop_peer_reads(group);
                    complete &= self.finish_jobs().await;
                    let result = self.store.truncate_after(group, *op, *view).await;
                    if result.is_ok() {
                        truncated.push((group, *op));
                    }
                    result
                }
                Write::Install { header, body, state } => {
                    self.drop_peer_reads(group);
                    complete &= self.finish_jobs().await;
                    let result = self.store.install_transfer(group, header, body, state).await;
                    if result.is_ok() {
                        self.counters.transfers_installed += 1;
                        installed.push((group, state.op));
                    }
                    result
                }
            };
            match result {
                Ok(()) => {}
                // Disk full is clean and retryable (DESIGN.md §3): this write and the group's
                // later ones wait, in order, for a later round, while other groups' writes go
                // on. The durability ticket stops below the first one waiting, so nothing held
                // behind them leaves.
                Err(EngineError::StorageFull) => {
                    waiting_groups.push(group);
                    deferred.push_back((ticket, group, write));
                    complete = false;
                }
                // An append a bound still refuses after settling waits too, instead of
                // stopping the group: what holds the memory may be outside the engine's reach
                // (a consumer's reply still being sent holds views of the write chunks), and it
                // lets go in time.
                Err(EngineError::LimitReached(_)) if matches!(write, Write::Append { .. }) => {
                    self.counters.appends_waiting_rounds += 1;
                    waiting_groups.push(group);
                    deferred.push_back((ticket, group, write));
                    complete = false;
                }
                Err(error) => self.fail_group(group, error),
            }
        }
        if !deferred.is_empty() {
            self.counters.storage_full_rounds += 1;
        }
        debug_assert!(self.writes.is_empty(), "the loop drains what it queues too");
        self.writes = deferred;
        AppliedWrites { views, truncated, installed, complete }
    }

    /// Starts the flush of what the round applied; a round that recorded views, truncated or
    /// installed a state settles instead and then tells the replicas, advancing the durability
    /// ticket past the round's writes when all of them were applied and made durable.
    async fn flush_applied(&mut self, applied: AppliedWrites) {
        let AppliedWrites { views, truncated, installed, mut complete } = applied;
        if views.is_empty() && truncated.is_empty() && installed.is_empty() {
            poll_fn(|cx| {
                self.poll_jobs(cx);
                Poll::Ready(())
            })
            .await;
            // A checkpoint job that finished in the poll may have written waiting views.
            self.report_settled_views();
        } else {
            let ticket = self.applied_ticket();
            complete &= self.settle().await;
            for (group, op) in truncated {
                self.persisted(group, Persisted::Truncated { op });
            }
            for (group, op) in installed {
                self.persisted(group, Persisted::Installed { op });
            }
            // Told durable only once the superblock holds them: a settle that found the disk
            // full left them waiting for a later checkpoint job.
            for (group, (view, log_view)) in views {
                let unsettled = self.views_unsettled.entry(group).or_default();
                *unsettled = (unsettled.0.max(view), unsettled.1.max(log_view));
            }
            if cfg!(feature = "canary-views-before-settled") {
                for (group, (view, log_view)) in std::mem::take(&mut self.views_unsettled) {
                    self.persisted(group, Persisted::Views { view, log_view });
                }
            }
            self.report_settled_views();
            self.report_durable();
            if complete {
                self.tickets_durable = self.tickets_durable.max(ticket);
            }
        }
    }

    /// Tells each replica whose recorded views reached the superblock since they were
    /// recorded (see `views_unsettled`).
    fn report_settled_views(&mut self) {
        if self.views_unsettled.is_empty() {
            return;
        }
        let settled: Vec<u64> = self
            .views_unsettled
            .keys()
            .copied()
            .filter(|&group| self.store.slot_durable(group))
            .collect();
        for group in settled {
            let (view, log_view) = self.views_unsettled.remove(&group).expect("listed");
            self.persisted(group, Persisted::Views { view, log_view });
        }
    }

    /// Hands `group`'s replica a durable write (none to a stopped group).
    pub(super) fn persisted(&mut self, group: u64, persisted: Persisted) {
        let Some(entry) = self.wake(group) else { return };
        if entry.failed.is_some() {
            return;
        }
        entry.replica.on_persisted(persisted);
        self.collect(group);
    }

    /// Appends, making room by flushing and checkpointing when the engine's bounds (journal,
    /// ring, write buffer) push back. On a full disk those bounds may not drain (the journal
    /// waits for checkpoints that cannot cover data waiting for space): then the append waits
    /// like one the disk refused, rather than failing the group.
    pub(super) async fn append(
        &mut self,
        group: u64,
        header: &Header,
        body: &[u8],
    ) -> EngineResult<()> {
        for attempt in 0..8 {
            match self.store.append(group, header, body) {
                Err(EngineError::LimitReached(_))
                    if attempt > 0 && self.store.is_storage_full() =>
                {
                    return Err(EngineError::StorageFull);
                }
                Err(EngineError::LimitReached(_)) => {
                    self.counters.append_backpressure += 1;
                    self.settle().await;
                }
                result => return result,
            }
        }
        match self.store.append(group, header, body) {
            Err(EngineError::LimitReached(_)) if self.store.is_storage_full() => {
                Err(EngineError::StorageFull)
            }
            result => result,
        }
    }

    /// Tells the replicas whose log's durable op changed how far it is durable now; a sleeping
    /// group only when that is news to it (old news changes nothing, so it sleeps on). The
    /// others' reports would be old news: a shard of 10,000 groups walks only those that
    /// changed.
    pub(super) fn report_durable(&mut self) {
        for group in self.store.take_durable_changed() {
            self.counters.durable_groups_visited += 1;
            if let Some(op) = self.store.durable_op(group)
                && let Some(entry) = self.groups.get(&group)
            {
                if entry.asleep_since_tick.is_some() && !entry.replica.durable_news(op) {
                    continue;
                }
                self.persisted(group, Persisted::Appended { op });
            }
        }
        debug_assert!(
            self.groups.iter().all(|(&group, entry)| {
                entry.failed.is_some()
                    || self.store.durable_op(group).is_none_or(|op| !entry.replica.durable_news(op))
            }),
            "a replica's durable op lags its log's, unreported"
        );
    }
}
