//! Shard 0's metadata state machine: the metadata group opened or replayed at start-up (its
//! snapshot, then the committed log past it), requests proposed into its log (a retry of a
//! session's request in flight joins it), committed ops applied in order with the catalog
//! published before anyone is answered, and the answers to whoever waited.
//!
//! Only shard 0 has a `MetadataState`; every other shard only installs the catalogs it publishes
//! (`catalog`). The consumer group coordinator's own requests come through here as well
//! (`coordinator`). It never applies an op that is not committed. Every node's shard 0 applies
//! the committed metadata log, but only the metadata group's primary takes metadata changes: on
//! any other node a client's change is answered `NotPrimary` naming it.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::BytesMut;
use shoal_engine::ring::StoredPrepare;
use shoal_engine::shard::{group_dir, shard_dir};
use shoal_engine::state::{self, GroupState};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_proto::batch::BatchBuilder;
use shoal_proto::checksum;
use shoal_proto::protocol::ErrorCode;
use shoal_proto::protocol::consumer::GroupRef;
use shoal_proto::wire::{ClientRequest, Membership as GroupMembers};
use shoal_replication::{Committed, Reply, ReplyResult, Request};

use super::formation::Formation;
use super::state::ShardState;
use super::thread::now_ms;
use super::transfer::recovery_states;
use super::work::{
    Body, KafkaGroupReplySender, Outcome, ReplySender, redirect, refusal, result_error,
};
use crate::groups::Coordinator;
use crate::kafka_groups::KafkaGroups;
use crate::metadata::{METADATA_GROUP, MetaCommand, MetaReply, MetaState};

/// What [`ShardState::replay_metadata`] rebuilt, and from where.
struct RecoveredMetadata {
    state: MetaState,
    /// The op the restored snapshot covers (0: none restored).
    snapshot_op: u64,
    /// Ops applied from the log past it.
    replayed_ops: u64,
    /// A snapshot existed but could not be used.
    snapshot_unusable: bool,
    /// The offset after the last op in `state` (where a snapshot of it would resume).
    end_offset: u64,
    /// The offset after the last op the restored snapshot covers (0: none restored): the
    /// metadata log's retention may delete below it.
    snapshot_end_offset: u64,
}

/// Shard 0's metadata state machine and the requests it waits on.
pub(super) struct MetadataState {
    /// The catalog and the client table, as of the last applied op.
    pub(super) state: MetaState,
    /// Who waits for each proposed request, by the proposal's (client, request): usually its
    /// client alone, plus any retry of the same session's request that arrived meanwhile.
    /// The value also names the proposal's session (0: none).
    pub(super) pending: HashMap<(u64, u64), (u64, Vec<MetaWaiter>)>,
    /// The proposal of each registered session's request in flight, by (session, request), so
    /// that a retry joins it (and is answered once it commits) rather than entering the log
    /// again: the client table would answer a second copy anyway, but one copy is cheaper.
    pub(super) in_flight: HashMap<(u64, u64), (u64, u64)>,
    /// The op the newest snapshot covers (saved, or restored at start-up).
    pub(super) snapshot_op: u64,
    /// Whether a snapshot save is running (its task owns the group's new-snapshot file).
    pub(super) snapshot_saving: bool,
    /// A snapshot is wanted before the interval is up (the one found at start-up was unusable).
    pub(super) snapshot_due: bool,
    /// The end offset of the state when a save came due while another was running: that save
    /// starts once the running one finishes (else a log gone quiet would keep the older
    /// snapshot until the next interval's worth of ops).
    pub(super) snapshot_deferred_end: Option<u64>,
    /// The consumer group coordinator: live only while this node's metadata replica is the
    /// serving primary and has applied every op it knows committed (`coordinating`); empty
    /// otherwise (`coordinator::sync_coordinator`).
    pub(super) coordinator: Coordinator<ReplySender>,
    pub(super) coordinating: bool,
    /// A rebalance was refused: the coordinator looks for rebalances due again at the next
    /// tick, not from inside the refusal's answer (which found the same group due at once and
    /// recursed until the stack overflowed).
    pub(super) rebalances_retry: bool,
    /// The Kafka groups, coordinated alongside (`kafka_coordinator`): soft state, empty while
    /// not coordinating.
    pub(super) kafka_groups: KafkaGroups<KafkaGroupReplySender>,
    /// The client id of the coordinator's own proposals (random per start) and its next request.
    pub(super) internal_client: u64,
    pub(super) internal_request: u64,
}

impl MetadataState {
    /// The header fields of the coordinators' next proposal of their own.
    pub(super) fn next_internal_request(&mut self) -> ClientRequest {
        self.internal_request += 1;
        ClientRequest {
            client: self.internal_client,
            session: 0,
            request: self.internal_request,
            operation: 0,
        }
    }

    /// Everyone waiting for the proposal (client, request), which is done with.
    fn take_waiters(&mut self, client: u64, request: u64) -> Option<Vec<MetaWaiter>> {
        let (session, waiters) = self.pending.remove(&(client, request))?;
        if session != 0 {
            self.in_flight.remove(&(session, request));
        }
        Some(waiters)
    }

    /// Answers whoever waits for a metadata request its group replied to without committing
    /// it: a committed one is answered by its apply.
    pub(super) fn answer_uncommitted(&mut self, reply: &Reply) {
        if !matches!(reply.result, ReplyResult::Committed { .. })
            && let Some(waiters) = self.take_waiters(reply.client, reply.request)
        {
            for waiter in waiters {
                match waiter {
                    MetaWaiter::Client(slot) => {
                        let _ = slot.send(result_error(&reply.result));
                    }
                    MetaWaiter::Rebalance(group) => {
                        self.coordinator.settled(&group, None);
                    }
                    MetaWaiter::Nobody => {}
                }
            }
        }
    }
}

/// Retries of one in-flight metadata request that may wait for it (each from a connection, whose
/// requests in flight are bounded too); one more is told to retry later.
const META_WAITERS_MAX: usize = 16;

/// Who waits for a metadata command: a client, or the coordinator's rebalance of a group.
pub(super) enum MetaWaiter {
    Client(ReplySender),
    Rebalance(GroupRef),
    /// A proposal of the node's own that nobody waits for: a Kafka group's store (see
    /// `kafka_coordinator`), a balancing move (`balancer`).
    Nobody,
}

impl ShardState {
    /// Shard 0 at start-up: replays the metadata group into the metadata state (or creates the
    /// group, on a first start, unless the node must first learn from its peers whether its
    /// cluster is new: `formation`) and sets up the coordinator. Returns the op and offset the
    /// replay ended at ((0, 0) when nothing was replayed).
    pub(super) async fn open_metadata(&mut self) -> Result<(u64, u64), String> {
        let mut recovered_end = (0, 0);
        let groups_max = self.node.shard_config().groups_max as u32;
        let sessions_max = self.config.metadata.sessions_max;
        let mut state = MetaState::new(self.config.shards, groups_max, sessions_max);
        let mut snapshot_op = 0;
        let mut snapshot_due = false;
        if self.node.group_ids().contains(&METADATA_GROUP) {
            let recovered = self.replay_metadata().await?;
            self.keep_metadata_log(recovered.snapshot_end_offset)?;
            snapshot_due = recovered.snapshot_unusable;
            snapshot_op = recovered.snapshot_op;
            recovered_end = (recovered.state.catalog.applied_op, recovered.end_offset);
            self.metrics.metadata_recovered(recovered.snapshot_op, recovered.replayed_ops);
            tracing::info!(
                snapshot_op = recovered.snapshot_op,
                replayed_ops = recovered.replayed_ops,
                applied_op = recovered.state.catalog.applied_op,
                sessions = recovered.state.clients.len(),
                "metadata recovered"
            );
            state = recovered.state;
        } else if self.formation != Formation::Deciding {
            self.create_metadata_group().await?;
        }
        // Seeded from the catalog once this node leads the metadata group (`sync_coordinator`).
        let coordinator = Coordinator::new(String::new());
        self.metadata = Some(MetadataState {
            state,
            pending: HashMap::new(),
            in_flight: HashMap::new(),
            snapshot_op,
            snapshot_saving: false,
            snapshot_due,
            snapshot_deferred_end: None,
            coordinator,
            coordinating: false,
            rebalances_retry: false,
            kafka_groups: KafkaGroups::new(String::new(), 0),
            internal_client: self.node_seed | (1 << 63),
            internal_request: 0,
        });
        Ok(recovered_end)
    }

    /// Sets the metadata log's retention from `[metadata] retention_bytes` (the group keeps
    /// it in its superblock slot; a changed setting applies at the next start) and lets it
    /// delete below `snapshot_end_offset`, which the newest metadata snapshot covers: a restart
    /// restores that snapshot and replays the log past it; a replica behind the log's start
    /// gets the metadata state by a state transfer.
    fn keep_metadata_log(&mut self, snapshot_end_offset: u64) -> Result<(), String> {
        let retention_bytes = self.config.metadata.retention_bytes;
        self.node
            .set_retention(METADATA_GROUP, retention_bytes, 0)
            .map_err(|e| format!("setting the metadata log's retention: {e}"))?;
        self.node.set_retention_floor(METADATA_GROUP, snapshot_end_offset);
        Ok(())
    }

    /// Creates the metadata group (a first start, or once the cluster is formed or rejoined):
    /// `persisted`, with `[metadata] segment_size_bytes` segments and `retention_bytes`
    /// retention (nothing deleted before a snapshot covers it). Its first members are the
    /// founding nodes; a node added later joins it as a learner, knowing nothing until the
    /// metadata primary's change makes it a member and its StartView brings it in.
    pub(super) async fn create_metadata_group(&mut self) -> Result<(), String> {
        let config = GroupConfig {
            durability: Durability::Persisted,
            segment_size_bytes: self.config.metadata.segment_size_bytes,
            segment_age_ms_max: 0,
            retention_bytes: self.config.metadata.retention_bytes,
            ..GroupConfig::default()
        };
        let cluster = &self.config.cluster;
        let founders = cluster.founders();
        let added = cluster.node >= founders;
        let members = if cluster.nodes.is_empty() {
            GroupMembers::default()
        } else if added {
            let voters = GroupMembers::first(founders, founders).voters;
            GroupMembers { voters, learners: 1 << cluster.node }
        } else {
            GroupMembers::first(founders, founders)
        };
        // Its records are small: the group's bound only has to fit the shard's and a segment
        // (the smallest segment is below the default record bound).
        let segment_size_bytes = u32::try_from(config.segment_size_bytes).unwrap_or(u32::MAX);
        let config = GroupConfig {
            record_size_bytes_max: config
                .record_size_bytes_max
                .min(self.node.shard_config().record_size_bytes_max as u32)
                .min(segment_size_bytes),
            members: members.to_word(),
            ..config
        };
        let created = if added {
            self.node.join_groups(&[(METADATA_GROUP, config)]).await
        } else {
            self.node.create_group(METADATA_GROUP, config).await
        };
        created.map_err(|e| format!("creating the metadata group: {e}"))?;
        // Nothing may be deleted before a snapshot covers it.
        self.node.set_retention_floor(METADATA_GROUP, 0);
        Ok(())
    }

    /// Rebuilds the metadata state: the newest of its snapshot and the state a transfer installed
    /// its log from, then the committed log past it (up to what the recovered replica knows
    /// committed); ops committed later arrive through the normal path. A state that is
    /// damaged, does not decode or is ahead of the log is not used: the next older one is, or
    /// else the whole log is replayed, which it still holds unless a transfer replaced it
    /// (then start-up refuses with the reason).
    async fn replay_metadata(&mut self) -> Result<RecoveredMetadata, String> {
        let commit = self.node.replica(METADATA_GROUP).map_or(0, |r| r.commit());
        let groups_max = self.node.shard_config().groups_max as u32;
        let (shards, sessions_max) = (self.config.shards, self.config.metadata.sessions_max);
        let dir = group_dir(&shard_dir(&self.config.data_dir, self.index), METADATA_GROUP);
        let loaded = state::load(&self.storage, &dir).await;
        let Some(log) = self.node.log_stats(METADATA_GROUP) else {
            return Err("metadata group vanished".into());
        };
        if let Some(reason) = self.node.log_fault(METADATA_GROUP) {
            return Err(format!("the metadata log is damaged: {reason}"));
        }
        let fresh = || MetaState::new(shards, groups_max, sessions_max);
        let mut recovered = RecoveredMetadata {
            state: fresh(),
            snapshot_op: 0,
            replayed_ops: 0,
            snapshot_unusable: false,
            end_offset: 0,
            snapshot_end_offset: 0,
        };
        let mut offset = log.first_offset;
        let (saved, mut unusable) = match loaded {
            Ok(saved) => (saved, None),
            Err(error) => (None, Some(error.to_string())),
        };
        let usable = |saved: &GroupState| {
            if saved.op > log.head_op {
                return Err(format!(
                    "it covers op {} but the log ends at op {}",
                    saved.op, log.head_op
                ));
            }
            let state = MetaState::decode_snapshot(&saved.bytes, shards, groups_max, sessions_max)
                .map_err(|e| format!("it does not decode: {e}"))?;
            if state.catalog.applied_op != saved.op {
                return Err(format!(
                    "its state is at op {}, its header says {}",
                    state.catalog.applied_op, saved.op
                ));
            }
            Ok(state)
        };
        let mut restored = None;
        for saved in recovery_states(&self.storage, &dir, saved).await {
            match usable(&saved) {
                Ok(state) => {
                    restored = Some((state, saved.end_offset));
                    break;
                }
                Err(why) => {
                    unusable.get_or_insert(why);
                }
            }
        }
        // An unusable snapshot is replaced by a new one as soon as the state is rebuilt.
        recovered.snapshot_unusable = unusable.is_some();
        match (restored, unusable) {
            (Some((state, end_offset)), _) => {
                recovered.snapshot_op = state.catalog.applied_op;
                recovered.state = state;
                recovered.end_offset = end_offset;
                recovered.snapshot_end_offset = end_offset;
                offset = end_offset.max(offset);
            }
            (None, None) => {}
            (None, Some(why)) if log.first_offset == 0 => {
                tracing::warn!(
                    why,
                    path = %dir.display(),
                    "metadata snapshot unusable; replaying the whole metadata log instead"
                );
            }
            (None, Some(why)) => {
                return Err(format!(
                    "the metadata snapshot in {} is unusable ({why}) and the metadata log no \
                     longer starts at its first op, so it cannot be rebuilt",
                    dir.display()
                ));
            }
        }
        while recovered.state.catalog.applied_op < commit {
            let prepares = self
                .node
                .replay_offset(METADATA_GROUP, offset, 1 << 20)
                .await
                .map_err(|e| format!("reading the metadata log: {e}"))?;
            if prepares.is_empty() {
                return Err(format!(
                    "metadata log ends at op {} below its commit {commit}",
                    recovered.state.catalog.applied_op
                ));
            }
            for prepare in prepares {
                let fields = *shoal_engine::record::prepare_of(&prepare.header);
                offset = fields.end_offset();
                if fields.op <= recovered.state.catalog.applied_op || fields.op > commit {
                    continue;
                }
                apply_metadata(&mut recovered.state, &prepare);
                recovered.replayed_ops += 1;
                recovered.end_offset = offset;
            }
        }
        Ok(recovered)
    }

    pub(super) async fn apply_committed(&mut self) {
        let committed = self.node.take_committed();
        let mut changed = false;
        let mut metadata_end = None;
        for (group, entry) in committed {
            let header = match entry {
                Committed::Op { header } => header,
                Committed::StateWanted { op } => {
                    self.serve_driver_state(group, op);
                    continue;
                }
                Committed::Transferred { header, state } => {
                    let installed = self.install_driver_state(group, &header, &state);
                    // Published by the install; a snapshot of it is due (never of a machine
                    // that kept its own state: its op is not the transferred end's).
                    if group == METADATA_GROUP && installed {
                        changed = false;
                        metadata_end = Some(self.committed_end[&METADATA_GROUP]);
                    }
                    continue;
                }
            };
            let fields = *shoal_engine::record::prepare_of(&header);
            let end = fields.end_offset();
            let known = self.committed_end.entry(group).or_insert(0);
            let newly_committed = end > *known;
            if newly_committed {
                *known = end;
                self.wake_parked(group);
            }
            if group != METADATA_GROUP {
                if newly_committed {
                    self.apply_committed_offset(group, &fields).await;
                }
                continue;
            }
            if self.metadata.is_none() {
                continue;
            }
            let op = fields.op;
            if !self.node.has_log(METADATA_GROUP) {
                continue;
            }
            let read = self.node.read_op(METADATA_GROUP, op).await;
            let Some(metadata) = self.metadata.as_mut() else { return };
            let prepare = match read {
                Ok(Some(prepare)) => prepare,
                other => {
                    tracing::error!(op, result = ?other, "metadata op unreadable after commit");
                    continue;
                }
            };
            let fields = *shoal_engine::record::prepare_of(&prepare.header);
            if fields.op <= metadata.state.catalog.applied_op {
                // Already in the state: a restored snapshot may cover ops past the commit point
                // the replica recovered with, and those commit again here.
                continue;
            }
            let reply = apply_metadata(&mut metadata.state, &prepare);
            changed = true;
            metadata_end = Some(fields.end_offset());
            if let Some(waiters) = metadata.take_waiters(fields.client, fields.request) {
                // Publish before answering, so the client's next request sees the change.
                let catalog = Arc::new(metadata.state.catalog.clone());
                changed = false;
                self.publish(catalog);
                for waiter in waiters {
                    self.answer_metadata(waiter, &reply);
                }
            }
        }
        if changed && let Some(metadata) = &self.metadata {
            let catalog = Arc::new(metadata.state.catalog.clone());
            self.publish(catalog);
        }
        if let Some(end_offset) = metadata_end {
            self.save_metadata_snapshot(end_offset);
            // A topic that grew (AddPartitions) has partitions its groups must assign.
            self.propose_rebalances();
        }
    }

    /// Answers whoever waited for a metadata command: its client, or (for a rebalance) the
    /// coordinator, which answers the joins the new assignment includes.
    fn answer_metadata(&mut self, waiter: MetaWaiter, reply: &MetaReply) {
        match waiter {
            MetaWaiter::Client(slot) => {
                let body = Body::Encoded(reply.body.clone());
                let _ = slot.send(Outcome { error: reply.error, body });
            }
            MetaWaiter::Rebalance(group) => {
                let Some(metadata) = self.metadata.as_mut() else { return };
                let in_force = metadata
                    .state
                    .catalog
                    .topic(&group.stream, &group.topic)
                    .ok()
                    .and_then(|topic| topic.consumer_groups.get(&group.group))
                    .cloned();
                if reply.error != 0 {
                    // Refused. For good (the topic's bound on groups, a check of the catalog),
                    // the joins it would have let in hear why and their members go: it would be
                    // refused again. For now (a full disk, a primary changing) they wait for
                    // the next proposal. Either way the coordinator looks again at the next
                    // tick, not from here.
                    let retryable =
                        ErrorCode::from_u32(reply.error).is_some_and(|e| e.is_retryable());
                    if !retryable {
                        for slot in metadata.coordinator.refused(&group, in_force.as_ref()) {
                            let body = Body::Encoded(reply.body.clone());
                            let _ = slot.send(Outcome { error: reply.error, body });
                        }
                    } else {
                        metadata.coordinator.settled(&group, None);
                    }
                    metadata.rebalances_retry = true;
                    return;
                }
                let answered = metadata.coordinator.settled(&group, in_force.as_ref());
                for (slot, assignment) in answered {
                    let _ = slot.send(Outcome::ok(assignment.encode()));
                }
                // Members may have changed while this one was in flight.
                self.propose_rebalances();
            }
            MetaWaiter::Nobody => {}
        }
    }

    pub(super) fn propose_metadata(
        &mut self,
        client: ClientRequest,
        command: MetaCommand,
        waiter: MetaWaiter,
    ) {
        // Metadata changes are made by the metadata group's primary only; a client is sent
        // there (a redirect, not a forward: the client learns the primary and goes straight to
        // it from then on, and a request never crosses two nodes).
        if let MetaWaiter::Client(reply) = &waiter
            && let Some(refusal) = self.node.replica(METADATA_GROUP).and_then(redirect)
        {
            let _ = reply.send(refusal);
            return;
        }
        let Some(metadata) = self.metadata.as_mut() else {
            if let MetaWaiter::Client(reply) = waiter {
                let _ =
                    reply.send(Outcome::error(ErrorCode::InvalidRequest, "not the metadata shard"));
            }
            return;
        };
        if let Err(answer) = metadata.state.admit(client.session, client.request, &command) {
            if client.session != 0 && answer.error == 0 {
                self.metrics.metadata_duplicate();
            }
            self.answer_metadata(waiter, &answer);
            return;
        }
        let key = (client.client, client.request);
        if client.session != 0
            && let Some(proposal) = metadata.in_flight.get(&(client.session, client.request))
            && let Some((_, waiters)) = metadata.pending.get_mut(proposal)
        {
            // A retry of a request still in flight: answered with the original's answer once it
            // commits (or with the original's failure).
            if waiters.len() < META_WAITERS_MAX {
                waiters.push(waiter);
                return;
            }
            let answer = MetaReply::error(
                ErrorCode::TransientNotAccepted,
                &format!("request {} is in flight and retried too often: retry", client.request),
            );
            self.answer_metadata(waiter, &answer);
            return;
        }
        if metadata.pending.contains_key(&key) {
            let answer = MetaReply::error(
                ErrorCode::InvalidRequest,
                &format!("request {} of this client is already in flight", client.request),
            );
            self.answer_metadata(waiter, &answer);
            return;
        }
        let now = now_ms();
        let mut batch = BatchBuilder::new(now);
        batch.push(now, None, Some(&command.encode()), &[]);
        let batch = batch.build();
        let request = Request {
            client: client.client,
            session: client.session,
            request: client.request,
            body: BytesMut::from(&batch[..]),
            body_checksum: checksum::crc32c(&batch),
            record_count: 1,
            first_timestamp_ms: now,
            max_timestamp_ms: now,
            append_time_ms: now,
        };
        metadata.pending.insert(key, (client.session, vec![waiter]));
        if client.session != 0 {
            metadata.in_flight.insert((client.session, client.request), key);
        }
        if let Err(refused) = self.node.on_client_request(METADATA_GROUP, request)
            && let Some(waiters) = self.metadata.as_mut().and_then(|m| m.take_waiters(key.0, key.1))
        {
            let outcome = refusal(&refused);
            let Body::Encoded(text) = outcome.body else { return };
            let answer = MetaReply { error: outcome.error, body: text };
            for waiter in waiters {
                self.answer_metadata(waiter, &answer);
            }
        }
    }
}

/// Applies one committed metadata prepare to `state` and returns its client's answer.
fn apply_metadata(state: &mut MetaState, prepare: &StoredPrepare) -> MetaReply {
    let fields = *shoal_engine::record::prepare_of(&prepare.header);
    let body = prepare.body();
    // A control batch is the group's own configuration change (the mover's): no command.
    let control = shoal_proto::batch::BatchHeader::parse(&body).is_ok_and(|h| h.is_control());
    let command = (!control)
        .then(|| shoal_proto::batch::records(&body))
        .and_then(Result::ok)
        .and_then(|mut records| records.next())
        .and_then(|record| record.ok())
        .and_then(|record| record.value.map(MetaCommand::decode))
        .and_then(Result::ok);
    state.apply(fields.op, fields.append_time_ms, fields.session, fields.request, command.as_ref())
}
