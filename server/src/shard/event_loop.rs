//! The shard's loop: waits for work, the next tick, the flush gate's deadline or a finished
//! flush cycle; hands each work item to its job; on every tick expires parked fetches and group
//! members and (every so often) saves snapshots and enforces retention; then runs the I/O round
//! the flush gate allows and sends every answer that is ready.
//!
//! It is the only code that drives the shard's node once start-up is over, and it never waits on
//! another shard's inbox: what it sends there (catalogs, its own wake-ups) goes with `try_send`.

use std::collections::HashMap;
use std::future::pending;
use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use shoal_engine::shard::remove_retired_files;
use shoal_proto::protocol::ErrorCode;
use shoal_proto::protocol::consumer;
use shoal_replication::TICK_MS;

use super::fetch::{PollFor, ReadFor};
use super::formation::Formation;
use super::kafka_coordinator::restart_kafka_groups;
use super::metadata::MetaWaiter;
use super::state::ShardState;
use super::thread::now_ms;
use super::work::{GroupReport, GroupStats, Outcome, SendOutcome, ShardReport, Work, refuse};
use super::writes::{PendingWrite, SUBMIT_AT_ONCE, WriteKind};
use crate::metrics;

/// Ticks between two retention passes over the shard's groups. A partition keeps one spare
/// segment file, which retention refills with the segment it retires and the next roll takes:
/// passes a second apart let a partition writing 1.3 GB/s roll past an empty spare into fresh
/// space between them, and retire two segments in one pass, one of them deleted. Four passes a
/// second recycle nearly every segment (docs/benchmarks.md, "Retention four times a second").
const RETENTION_INTERVAL_TICKS: u64 = 25;

/// Ticks between two saves of the groups' states and two sweeps of groups no longer needed.
const STATE_SAVE_INTERVAL_TICKS: u64 = 100;

impl ShardState {
    /// Serves the inbox until the stop flag is set and the node has handed the groups it leads
    /// over (`handoff`), then finishes what was accepted and refuses the rest.
    pub(super) async fn serve(&mut self, inbox: &flume::Receiver<Work>, stop: &AtomicBool) {
        let tick = Duration::from_millis(TICK_MS);
        let mut next_tick = Instant::now() + tick;
        let mut ticks: u64 = 0;
        let batch_max = self.config.network.shard_inbox_max;
        // Once the stop flag is up, the loop runs on while the node hands its groups over.
        let mut hand_off = None;
        while self.keep_serving(stop, &mut hand_off) {
            // Wake for the tick, or sooner for the writes the flush gate holds.
            let wake_at = self.flush_gate.deadline().map_or(next_tick, |d| d.min(next_tick));
            let wait = wake_at.saturating_duration_since(Instant::now());
            // A flush cycle finishing wakes the loop too: its replies go out and the next
            // cycle starts with whatever arrived meanwhile; so does a disk read for a peer.
            let node = &mut self.node;
            let first = monoio::select! {
                work = inbox.recv_async() => work.ok(),
                _ = monoio::time::sleep(wait) => None,
                _ = async {
                    if node.io_in_flight() { node.wait_io().await } else { pending().await }
                } => None,
            };
            if let Some(work) = first {
                self.handle(work).await;
                for _ in 0..batch_max {
                    match inbox.try_recv() {
                        Ok(work) => self.handle(work).await,
                        Err(_) => break,
                    }
                }
            }
            self.finish_reads();
            self.finish_state_saves();
            // Peers' prepare requests start their disk reads now, whatever the flush gate holds.
            self.node.serve_reads();
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + tick;
                self.node.on_tick();
                if self.index == 0 {
                    self.advance_formation().await;
                }
                self.settle_rejoin(ticks);
                self.expire_parked();
                self.expire_writes();
                self.drive_moves();
                self.expire_members();
                self.tick_kafka_groups();
                ticks += 1;
                // In the order they ran when all three came at once: saves, retention, sweep.
                let states_due = ticks.is_multiple_of(STATE_SAVE_INTERVAL_TICKS);
                if states_due {
                    self.save_states();
                }
                if ticks.is_multiple_of(RETENTION_INTERVAL_TICKS) {
                    self.enforce_retention().await;
                }
                if states_due {
                    self.delete_unneeded_groups().await;
                }
                self.log_storage_full();
                if !SUBMIT_AT_ONCE {
                    self.submit_waiting();
                }
            }
            self.round(true).await;
        }
        // Finish what was accepted (to the end: nothing may stay in flight); refuse what is
        // still queued.
        self.node.run_io().await;
        self.answer_replies();
        self.apply_committed().await;
        self.save_states_now().await;
        // A write still pending entered its group's log, and in a cluster it may yet commit in
        // the view this node handed over (or lost): its outcome is unknown, never "not executed".
        let unknown = || {
            Outcome::error(
                ErrorCode::TransientNotCommitted,
                "the server stopped before the write committed: its outcome is unknown",
            )
        };
        if let Some(metadata) = self.metadata.as_mut() {
            for slot in metadata.coordinator.drain_joins() {
                let _ = slot.send(Outcome::error(ErrorCode::ShuttingDown, "shutting down"));
            }
            restart_kafka_groups(&mut metadata.kafka_groups, None, 0);
            for (_, (_, waiters)) in metadata.pending.drain() {
                for waiter in waiters {
                    if let MetaWaiter::Client(slot) = waiter {
                        let _ = slot.send(unknown());
                    }
                }
            }
        }
        while let Ok(work) = inbox.try_recv() {
            refuse(work);
        }
        for (_, pending) in self.pending.drain() {
            let _ = pending.reply.send(unknown());
        }
        self.parked_by_group.clear();
        for fetch in self.parked.drain() {
            let outcome = Outcome::error(ErrorCode::ShuttingDown, "shutting down");
            fetch.to.reply().send_outcome(outcome);
        }
        for (_, queue) in std::mem::take(&mut self.waiting) {
            for (_, pending) in queue {
                let _ =
                    pending.reply.send(Outcome::error(ErrorCode::ShuttingDown, "shutting down"));
            }
        }
    }

    /// Says when partitions start or stop refusing writes for lack of disk space (once per
    /// change, checked every tick).
    fn log_storage_full(&mut self) {
        let full = self.node.storage_full_group_count();
        if full == self.storage_full_groups {
            return;
        }
        if full > 0 {
            tracing::warn!(
                shard = self.index,
                partitions = full,
                "storage full: these partitions refuse produce with StorageFull until disk space \
                 is freed"
            );
        } else {
            tracing::info!(shard = self.index, "disk space is back: writes go through again");
        }
        self.storage_full_groups = full;
    }

    /// Deletes sealed segments beyond each topic's retention, and counts what it deleted.
    async fn enforce_retention(&mut self) {
        let before = metrics::stored_bytes(&self.node);
        match self.node.enforce_retention(now_ms()).await {
            Ok(0) => {}
            Ok(segments) => {
                let bytes = before.saturating_sub(metrics::stored_bytes(&self.node));
                self.metrics.retention(segments, bytes);
                tracing::debug!(shard = self.index, segments, bytes, "retention deleted segments");
            }
            Err(error) => tracing::error!(shard = self.index, %error, "retention failed"),
        }
        self.remove_retired();
    }

    /// Removes the segment files retention retired, in a task: removing a 1 GiB file frees its
    /// blocks for some 0.2 s, which awaited here stopped every partition of the shard (the
    /// unlink runs on io_uring's workers, so the loop goes on meanwhile). One task at a time.
    fn remove_retired(&mut self) {
        if self.removing_retired.get() {
            return;
        }
        let files = self.node.take_retired_files();
        if files.is_empty() {
            return;
        }
        self.removing_retired.set(true);
        let (busy, storage, shard) =
            (Rc::clone(&self.removing_retired), self.storage.clone(), self.index);
        monoio::spawn(async move {
            if let Err(error) = remove_retired_files(&storage, files).await {
                tracing::error!(shard, %error, "removing retired segments failed");
            }
            busy.set(false);
        });
    }

    /// Starts an I/O round if anything is pending (its flush runs on while the loop takes more
    /// work) and, when `gated`, the flush gate lets the writes waiting for it go now; then sends
    /// every answer that is ready.
    pub(super) async fn round(&mut self, gated: bool) {
        let due = !gated || self.flush_gate.open(Instant::now(), self.node.writes_queued() > 0);
        if due && self.node.has_io() && !self.canary_holds_writes() {
            self.node.start_io().await;
        }
        self.answer_replies();
        self.apply_committed().await;
        if SUBMIT_AT_ONCE {
            self.submit_waiting();
        }
    }

    /// Canary `canary-bus-ack-on-receipt`: writes wait while the data directory holds a
    /// `hold-writes` file, so the prepares a backup acknowledged on receipt are certainly not
    /// on its disk when the test kills it. Never in a build without the canary.
    fn canary_holds_writes(&self) -> bool {
        cfg!(feature = "canary-bus-ack-on-receipt")
            && self.config.data_dir.join("hold-writes").exists()
    }

    /// Hands one work item to the job it is for.
    pub(super) async fn handle(&mut self, work: Work) {
        match work {
            Work::Produce { group, partition, request, reply } => {
                if let Some(refusal) = self.ensure_group(group).await {
                    let _ = reply.send(refusal);
                    return;
                }
                if let Some(busy) = self.writes_busy() {
                    let _ = reply.send(busy);
                    return;
                }
                let record_count = request.record_count;
                #[cfg(feature = "canary-ack-on-receipt")]
                let reply = self.ack_on_receipt(group, partition, record_count, reply);
                let kind = WriteKind::Produce { partition, record_count };
                self.queue_write(group, request, PendingWrite { kind, reply });
            }
            Work::StoreOffset { group, client, record, reply } => {
                if let Some(refusal) = self.ensure_group(group).await {
                    let _ = reply.send(refusal);
                    return;
                }
                self.store_offset(group, client, record, WriteKind::Offset, reply);
            }
            Work::DeleteRecords { group, client, offset, reply } => {
                if let Some(refusal) = self.ensure_group(group).await {
                    let _ = reply.send(refusal);
                    return;
                }
                self.apply_committed().await;
                self.delete_records(group, client, offset, reply);
            }
            Work::GetOffset { group, consumer, reply } => {
                if let Some(refusal) = self.ensure_group(group).await {
                    let _ = reply.send(refusal);
                    return;
                }
                // Committed offset commits are applied before the table answers.
                self.apply_committed().await;
                if let Some(refusal) = self.read_refusal(group) {
                    let _ = reply.send(refusal);
                    return;
                }
                let committed_end = self.committed_end.get(&group).copied().unwrap_or(0);
                let stored =
                    self.offsets.get(&group).and_then(|o| o.effective(&consumer, committed_end));
                let _ = reply.send(Outcome::ok(consumer::encode_stored_offset(stored)));
            }
            Work::Group { request, reply } => self.group_request(request, reply),
            Work::KafkaGroup { request, reply } => self.kafka_group_request(request, reply),
            Work::Poll { group, args, consumer, auto_commit, client, reply } => {
                if let Some(refusal) = self.ensure_group(group).await {
                    let _ = reply.send(refusal);
                    return;
                }
                self.apply_committed().await;
                let to =
                    ReadFor::Poll(PollFor { consumer, skipped_to: 0, auto_commit, client, reply });
                self.fetch(group, args, to);
            }
            Work::Fetch { group, args, reply } => {
                if let Some(refusal) = self.ensure_group(group).await {
                    let _ = reply.send(refusal);
                    return;
                }
                self.fetch(group, args, ReadFor::Fetch(reply));
            }
            Work::Metadata { reply, .. } if self.formation == Formation::Deciding => {
                let text = "this node is still forming its cluster (it waits to hear from every \
                            peer): retry, or ask another node";
                let _ = reply.send(Outcome::error(ErrorCode::TransientNotAccepted, text));
            }
            Work::Metadata { client, command, reply } => {
                self.propose_metadata(client, command, MetaWaiter::Client(reply))
            }
            Work::Catalog(catalog) => self.install(catalog).await,
            Work::Stats { groups, reply } => {
                // A partition this node does not hold names its preferred primary (its home, or
                // the voter the leader balancer chose): a guess that node corrects with a
                // `NotPrimary` of its own if it is wrong.
                let homes: HashMap<u64, u8> = if groups.iter().all(|&g| self.node.has_log(g)) {
                    HashMap::new()
                } else {
                    let nodes = self.config.cluster.founders();
                    let node = self.config.cluster.node;
                    self.catalog
                        .places()
                        .filter(|place| !place.is_held_by(node))
                        .map(|place| (place.group, place.preferred_primary(nodes)))
                        .collect()
                };
                let stats = groups
                    .into_iter()
                    .map(|g| {
                        let mut stats =
                            GroupStats::of(self.node.log_stats(g), self.node.replica(g));
                        stats.first_offset = self.log_start(g).unwrap_or(stats.first_offset);
                        if let Some(&home) = homes.get(&g) {
                            stats.primary = home;
                        }
                        (g, stats)
                    })
                    .collect();
                let _ = reply.send(stats);
            }
            Work::Report { reply } => {
                let groups = self.node.group_ids();
                let replication = groups.iter().filter_map(|&g| {
                    Some(GroupReport::of(self.node.replica(g)?, self.node.group_status(g)?))
                });
                let _ = reply.send(ShardReport {
                    shard: self.index,
                    groups: groups.len(),
                    allocations: crate::alloc::allocations_on_this_thread(),
                    io_rounds: self.node.counters().io_rounds,
                    move_changes_proposed: self.mover.changes_proposed,
                    move_steps_waited: self.mover.steps_waited,
                    balancer_moves: self.mover.balancer_moves,
                    balancer_primaries: self.mover.balancer_primaries,
                    groups_deleted: self.groups_deleted,
                    replication: replication.collect(),
                });
            }
            Work::Metrics { reply } => {
                let figures = metrics::snapshot(
                    self.index,
                    &self.metrics,
                    &self.node,
                    &self.committed_end,
                    &self.bus,
                );
                let _ = reply.send(figures);
            }
            Work::Packet { from, packet } => {
                // A malformed packet is counted by the node and dropped.
                let _ = self.node.on_packet(from, &packet);
            }
            Work::Wake => {}
        }
    }
}
