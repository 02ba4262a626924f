//! A node's life: open (the shard recovered, a replica restarted for every group it holds, damage
//! found at open cut when the group has peers), creating a group, and closing.
//!
//! It never starts a replica on a log it has not read back (a group it cannot recover is
//! recorded as stopped instead) and never lets a group of one cut damage it cannot repair.

use std::path::Path;

use shoal_engine::partition::GroupRecovery;
use shoal_engine::shard::{RecoveryReport, ShardConfig, ShardStore};
use shoal_engine::storage::Storage;
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_engine::{Error as EngineError, Result as EngineResult};
use shoal_proto::wire::{HEADER_SIZE, Header};

use super::config::{Clock, NodeConfig, Transport};
use super::restart::{SavedProducers, min_faulty};
use super::state::Node;
use crate::config::{Membership, ReplicaConfig};
use crate::replica::{RecoveredLog, Replica};

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// Opens (recovering) the shard in `dir` and restarts a replica for every group it holds:
    /// each starts `Recovering` with its views, newest headers and faulty suffix, and its
    /// producer table rebuilt from its whole log (see [`Node::open_with_producer_snapshots`]).
    pub async fn open(
        storage: S,
        dir: &Path,
        shard_config: ShardConfig,
        config: NodeConfig,
        transport: T,
        clock: C,
        seed: u64,
    ) -> EngineResult<(Self, RecoveryReport)> {
        let none = async |_group: u64| SavedProducers::NotKept;
        Node::open_with_producer_snapshots(
            storage,
            dir,
            shard_config,
            config,
            transport,
            clock,
            seed,
            none,
        )
        .await
    }

    /// [`Node::open`], with each group's producer table (DESIGN.md §4) rebuilt from what
    /// `load_producers(group)` says the driver saved of it (see [`SavedProducers`]) plus the
    /// log past the snapshot's op. Without a usable snapshot the whole log is replayed; a group
    /// whose snapshot is unusable and whose log no longer begins where its history does is
    /// recorded as stopped. This is where a restarted group's producer table is rebuilt, so
    /// the server and the simulator share it.
    #[expect(clippy::too_many_arguments, reason = "open's arguments plus the snapshot source")]
    pub async fn open_with_producer_snapshots<L>(
        storage: S,
        dir: &Path,
        shard_config: ShardConfig,
        config: NodeConfig,
        transport: T,
        clock: C,
        seed: u64,
        mut load_producers: L,
    ) -> EngineResult<(Self, RecoveryReport)>
    where
        L: AsyncFnMut(u64) -> SavedProducers,
    {
        let (store, report) = ShardStore::open(storage.clone(), dir, shard_config).await?;
        let mut node = Node::blank(config, store, storage, transport, clock, seed);
        for recovery in &report.groups {
            let group = recovery.group;
            let Some((headers, faulty_from)) =
                node.recover_log(recovery, report.clean_shutdown).await?
            else {
                continue;
            };
            let snapshot = load_producers(group).await;
            node.insert_recovered(group, headers, faulty_from, snapshot).await?;
        }
        Ok((node, report))
    }

    /// One recovered group's newest headers and faulty suffix, its damage cut first when it has
    /// peers; None when the engine holds no log for it or it is recorded as stopped instead.
    async fn recover_log(
        &mut self,
        recovery: &GroupRecovery,
        clean_shutdown: bool,
    ) -> EngineResult<Option<(Vec<Header>, Option<u64>)>> {
        let group = recovery.group;
        let mut faulty_from = recovery.faulty.suffix_from;
        let Some(log) = self.store.group_mut(group) else { return Ok(None) };
        let persisted = log.config().durability == Durability::Persisted;
        if let Some(reason) = log.faulty_reason() {
            let reason = reason.to_string();
            // Damage before the torn window: a group with peers cuts it and repairs from
            // them; a group of one (or a failure that is not damage) refuses service.
            let cut = if self.has_peers() && recovery.corruption.is_some() {
                self.cut_damaged(group).await
            } else {
                Err(reason)
            };
            match cut {
                Ok(from) => {
                    faulty_from = self.unclean_suffix(group, from, clean_shutdown);
                }
                Err(reason) => {
                    self.insert_failed(group, reason);
                    return Ok(None);
                }
            }
        } else if persisted
            && self.has_peers()
            && recovery.torn_record_op.is_some_and(|op| op > recovery.head_op)
            // Canary (DESIGN.md §7): the damaged tail is taken for an unsynced write, so the
            // replica may nack an op it acknowledged.
            && !cfg!(feature = "canary-truncate-faulty")
        {
            // A `persisted` replica acknowledges an op once it is synced, and the mark that
            // announces that sync comes with a later write: a damaged record past the head may
            // be a synced op that latent damage hit before its mark, as well as a torn write.
            let from = self.store.hold_torn_tail_faulty(group).await?;
            self.counters.torn_tails_held_faulty += 1;
            faulty_from = min_faulty(faulty_from, Some(from));
        }
        let headers = match self.newest_headers(group).await {
            Ok(headers) => headers,
            // A read of the newest records found damage: the same protocol-aware cut, when
            // there are peers. A read that merely failed (EIO) is no damage: cutting there
            // would drop a persisted group's journal-held tail for nothing and leave this
            // replica faulty beside a damaged peer (seed 30,000,479); the open fails and is
            // retried instead, as for any read error at open.
            Err(error @ EngineError::Corruption(_)) if self.has_peers() => {
                match self.cut_damaged(group).await {
                    Ok(from) => {
                        let from = self.unclean_suffix(group, from, clean_shutdown);
                        faulty_from = min_faulty(faulty_from, from);
                        match self.newest_headers(group).await {
                            Ok(headers) => headers,
                            Err(error) => {
                                self.insert_failed(group, error.to_string());
                                return Ok(None);
                            }
                        }
                    }
                    Err(reason) => {
                        self.insert_failed(group, format!("{error}; the cut failed: {reason}"));
                        return Ok(None);
                    }
                }
            }
            Err(error) => return Err(error),
        };
        Ok(Some((headers, faulty_from)))
    }

    /// Creates a group on this node (every member node creates it with the same id): its
    /// storage durably, and a fresh replica in view 0 — or, for a group below the rejoin floor
    /// (see [`NodeConfig::rejoin_floor`]), a `Recovering` one that knows nothing.
    pub async fn create_group(&mut self, group: u64, config: GroupConfig) -> EngineResult<()> {
        self.create_groups(&[(group, config)]).await
    }

    /// Creates groups as [`Node::create_group`] does, all at once: the engine makes them durable
    /// with one superblock write for the lot (a topic's partitions arrive together).
    pub async fn create_groups(&mut self, groups: &[(u64, GroupConfig)]) -> EngineResult<()> {
        self.create_or_join(groups, false).await
    }

    /// Creates groups this node joins as a learner of a move (DESIGN.md §8), as
    /// [`Node::create_groups`] does, except that each replica starts `Recovering` knowing
    /// nothing: the group may be many epochs past its first, and its primary's `StartView`
    /// brings this replica in once a change made it a member. Each group's config names this
    /// node a learner, so a restart before then never makes it vote or lead.
    pub async fn join_groups(&mut self, groups: &[(u64, GroupConfig)]) -> EngineResult<()> {
        self.create_or_join(groups, true).await
    }

    async fn create_or_join(
        &mut self,
        groups: &[(u64, GroupConfig)],
        joining: bool,
    ) -> EngineResult<()> {
        if groups.is_empty() {
            return Ok(());
        }
        self.settle().await;
        self.store.create_groups(groups).await?;
        for &(group, _) in groups {
            self.add_replica(group, joining);
        }
        Ok(())
    }

    /// Deletes groups from this node: a replica a configuration change removed, once the
    /// group's move is done, or a deleted topic's (DESIGN.md §8). Each replica stops, what it
    /// queued is dropped, and the engine deletes its storage durably. The driver decides that
    /// a group may go; the node refuses only a group it does not hold, before anything changes.
    /// A group the engine still holds afterwards (its storage failed before the deletion's
    /// commit point) keeps its replica.
    pub async fn delete_groups(&mut self, groups: &[u64]) -> EngineResult<()> {
        if let Some(&unknown) = groups.iter().find(|&&group| !self.groups.contains_key(&group)) {
            return Err(EngineError::Invalid(format!("unknown group {unknown}")));
        }
        if groups.is_empty() {
            return Ok(());
        }
        for &group in groups {
            // Its writes never reach the engine, and no read of its files is left running.
            self.forget_queued(group);
        }
        // The engine deletes between jobs; the other groups' pending writes go out first.
        self.settle().await;
        let deleted = self.store.delete_groups(groups).await;
        let gone: Vec<u64> =
            groups.iter().copied().filter(|&group| self.store.group(group).is_none()).collect();
        for group in gone {
            self.remove_group(group);
            self.committed.retain(|(g, _)| *g != group);
            self.damaged.retain(|(g, _)| *g != group);
            self.damage_clear_at.remove(&group);
            self.lag_ticks_by_group.remove(&group);
            self.preferred_primaries.remove(&group);
            for entries in self.heartbeats.values_mut() {
                entries.retain(|entry| entry.group != group);
            }
            self.counters.groups_deleted += 1;
        }
        deleted
    }

    /// The replica of a group the engine just created.
    fn add_replica(&mut self, group: u64, joining: bool) {
        if let Some(log) = self.store.group_mut(group) {
            log.set_committed_end(0);
        }
        if let Err(reason) = self.stored_members(group) {
            self.insert_failed(group, reason);
            return;
        }
        let config = self.replica_config(group);
        let mut replica = if group < self.config.rejoin_floor || joining {
            // This node may have acknowledged ops of the group before it lost its disk (or, as
            // a joiner, knows nothing of it yet): it vouches for none of them and waits for the
            // cluster's view.
            let forgotten = RecoveredLog {
                faulty_from: Some(1),
                log_view_head_op: None,
                ..RecoveredLog::default()
            };
            Replica::recover(config, forgotten, self.seed)
        } else {
            Replica::new(config, self.seed)
        };
        replica.ration_repair();
        self.insert_group(group, replica, None);
    }

    /// The members `group` was created with, as its superblock slot keeps them (None: none
    /// recorded, so the template's, as for every group before per-group members); an error
    /// names why they cannot be this node's members of the group.
    pub(super) fn stored_members(&self, group: u64) -> Result<Option<Membership>, String> {
        let word = self.store.group(group).map_or(0, |log| log.config().members);
        if word == 0 {
            return Ok(None);
        }
        let members = Membership::from_word(word);
        let config =
            ReplicaConfig { group, replica: self.config.node, members, ..self.config.replica };
        match config.validate() {
            Ok(()) => Ok(Some(members)),
            Err(reason) => Err(format!("its stored members do not fit this cluster: {reason}")),
        }
    }

    /// A group's replica settings: the template, with the group's own members when it was
    /// created with some. A `replicated` group of one voter recovers uncleanly: with
    /// no other voter to ask, the ops its faulty suffix may have held are lost, which is the documented
    /// single-node power-loss outcome (DESIGN.md §6); otherwise it would never serve again.
    pub(super) fn replica_config(&self, group: u64) -> ReplicaConfig {
        let replicated = self
            .store
            .group(group)
            .is_some_and(|log| log.config().durability == Durability::Replicated);
        let mut config = ReplicaConfig { group, replica: self.config.node, ..self.config.replica };
        if let Ok(Some(members)) = self.stored_members(group) {
            config.members = members;
        }
        if replicated && config.voter_count() == 1 {
            config.unclean_recovery = true;
        }
        if group < self.config.rejoin_floor {
            config.start_view_probes_max = u32::MAX;
        }
        if let Some(&ticks) = self.lag_ticks_by_group.get(&group) {
            config.replica_lag_ticks_max = ticks;
        }
        // A state piece and its header must fit in one packet the peers accept (every node of
        // a cluster runs the same bound).
        let packet_room = self.config.message_size_bytes_max.saturating_sub(HEADER_SIZE).max(1);
        config.state_chunk_bytes_max = config.state_chunk_bytes_max.min(packet_room);
        config
    }

    /// Gives `group`'s replica its own lag bound (a topic's `replica_lag_time_max_ms`), now and
    /// whenever it is restarted; `None`: the template's again. A bound within one idle
    /// heartbeat interval would flag a healthy backup between two heartbeats, so it is raised
    /// past it.
    pub fn set_replica_lag_ticks(&mut self, group: u64, ticks: Option<u64>) {
        let floor = self.config.replica.idle_heartbeat_interval_ticks + 1;
        let ticks = match ticks {
            Some(ticks) => {
                let ticks = ticks.max(floor);
                self.lag_ticks_by_group.insert(group, ticks);
                ticks
            }
            None => {
                self.lag_ticks_by_group.remove(&group);
                self.config.replica.replica_lag_ticks_max
            }
        };
        if let Some(entry) = self.wake(group) {
            entry.replica.set_replica_lag_ticks_max(ticks);
        }
    }

    /// Raises or lowers the rejoin floor (see [`NodeConfig::rejoin_floor`]) for the groups
    /// created or restarted from now on.
    pub fn set_rejoin_floor(&mut self, floor: u64) {
        self.config.rejoin_floor = floor;
    }

    /// Flushes, checkpoints and records a clean shutdown.
    pub async fn close(mut self) -> EngineResult<()> {
        self.settle().await;
        self.store.close().await
    }
}
