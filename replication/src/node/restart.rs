//! A group's replica restarted on its recovered log (at open, and when a damaged group is
//! reopened): the log's newest headers, its faulty suffix, its producer table rebuilt from a
//! snapshot, a transferred state and the log past them; or, when the log cannot be trusted, a
//! blank replica recorded as stopped.
//!
//! A restarted replica always starts `Recovering` and never knows anything committed its log
//! does not prove: the commit point starts at what retention or a state transfer left.

use shoal_engine::partition::PartitionLog;
use shoal_engine::shard::group_dir;
use shoal_engine::state;
use shoal_engine::storage::Storage;
use shoal_engine::{Error as EngineError, Result as EngineResult};
use shoal_proto::Durability;
use shoal_proto::wire::Header;

use super::config::{Clock, Transport};
use super::state::Node;
use super::status::NodeCounters;
use crate::producers::{ProducerBatch, ProducerTable, SnapshotError};
use crate::replica::{RecoveredLog, Replica};

/// What a driver saved of a restarting group's producer table (the answer of
/// [`Node::open_with_producer_snapshots`]' `load_producers`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SavedProducers {
    /// The driver keeps no snapshot of this group: its table is what its log rebuilds.
    NotKept,
    /// The driver keeps snapshots of this group but has none it can use: none was saved yet,
    /// or the one saved is missing or damaged (the reason). The table is then rebuilt from
    /// the beginning of the group's history (op 1, or the state a transfer installed), which
    /// the log holds only if retention removed none of it. Retention deletes only what a saved
    /// snapshot covers, so a log that no longer begins there lost part of its history with
    /// the snapshot: the group stops (DESIGN.md §6, a damaged file), rather than forget
    /// producers and, in the driver's state, consumer offsets.
    Unavailable(String),
    /// The bytes of [`ProducerTable::encode`] the driver saved.
    Saved(Vec<u8>),
}

impl SavedProducers {
    /// What a driver that keeps the table in its group state snapshot saved, from its load of
    /// that snapshot ([`state::load`]) and `table`, which finds the table's bytes in the
    /// state: None when the state holds none (as the driver wrote it), the reason when it does
    /// not decode. A snapshot that is missing, damaged or cannot be read is unavailable: one
    /// unreadable file stops at most its own group, never the whole shard's start.
    pub fn from_load(
        loaded: EngineResult<Option<state::GroupState>>,
        table: impl FnOnce(state::GroupState) -> Result<Option<Vec<u8>>, String>,
    ) -> Self {
        match loaded {
            Ok(Some(saved)) => match table(saved) {
                Ok(Some(bytes)) => Self::Saved(bytes),
                Ok(None) => Self::NotKept,
                Err(why) => Self::Unavailable(format!("it does not decode: {why}")),
            },
            Ok(None) => Self::Unavailable("none was saved".into()),
            Err(error) => Self::Unavailable(error.to_string()),
        }
    }
}

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// The newest headers of `group`'s log (for a restarting replica).
    pub(super) async fn newest_headers(&mut self, group: u64) -> EngineResult<Vec<Header>> {
        let count = self.config.replica.view_headers_max;
        let log = self
            .store
            .group_mut(group)
            .ok_or(EngineError::Faulty { group, reason: "the group's log is gone".into() })?;
        log.read_newest_headers(count).await
    }

    /// The faulty suffix after a damage cut at open: the cut's, and for a `replicated` group
    /// after an unclean stop everything past the head too (what
    /// [`ShardStore::open`](shoal_engine::shard::ShardStore::open) marks when it finds no damage: written
    /// ops were acknowledged before they were synced).
    pub(super) fn unclean_suffix(
        &self,
        group: u64,
        from: Option<u64>,
        clean_shutdown: bool,
    ) -> Option<u64> {
        let Some(log) = self.store.group(group) else { return from };
        if clean_shutdown || log.config().durability != Durability::Replicated {
            return from;
        }
        min_faulty(from, Some(log.head_op() + 1))
    }

    /// Restarts `group`'s replica, `Recovering`, on its recovered log, with its producer table
    /// rebuilt from the newer of the `saved` snapshot and the transferred state (when usable)
    /// and the log past it. A group whose history that leaves unknown is recorded as stopped
    /// instead (see [`SavedProducers::Unavailable`]).
    pub(super) async fn insert_recovered(
        &mut self,
        group: u64,
        headers: Vec<Header>,
        faulty_from: Option<u64>,
        saved: SavedProducers,
    ) -> EngineResult<()> {
        if let Err(reason) = self.stored_members(group) {
            self.insert_failed(group, reason);
            return Ok(());
        }
        let replica_config = self.replica_config(group);
        // A log a state transfer installed begins at the state's op: the state is where its
        // producer table and commit point start (unless a newer snapshot was saved since).
        let transferred =
            match state::load_transfer_state(&self.storage, &group_dir(self.store.dir(), group))
                .await
            {
                Ok(transferred) => transferred,
                // A read that failed is the open's to retry (as a supervisor restarting the
                // process would); only damage stops the group.
                Err(error @ (EngineError::Io { .. } | EngineError::StorageFull)) => {
                    return Err(error);
                }
                Err(error) => {
                    self.insert_failed(group, format!("its transferred state: {error}"));
                    return Ok(());
                }
            };
        // The driver's part of the state is the driver's to load; the table is the replica's.
        let transferred = match transferred {
            None => None,
            Some(state) => match crate::transfer::decode_transfer_state(&state.bytes) {
                Some((producers, _)) => Some((state.op, producers.to_vec())),
                None => {
                    self.insert_failed(group, "its transferred state is malformed".into());
                    return Ok(());
                }
            },
        };
        let limits = replica_config.producer_limits();
        let saved = match saved {
            SavedProducers::NotKept => Ok(None),
            SavedProducers::Saved(bytes) => match ProducerTable::decode(&bytes, limits) {
                Ok(table) => Ok(Some(table)),
                Err(error) => {
                    self.counters.producer_snapshots_rejected += 1;
                    Err(format!("it does not decode: {error}"))
                }
            },
            SavedProducers::Unavailable(why) => Err(why),
        };
        let Some(first_op) = self.store.group(group).map(|log| log.first_op()) else {
            return Ok(());
        };
        let saved = match saved {
            Ok(saved) => saved,
            Err(why) => {
                // The history then starts from the transferred state, or from op 1, and only
                // a log that still begins there holds the rest of it.
                let history_from = transferred.as_ref().map_or(1, |&(op, _)| op + 1);
                if first_op > history_from && !cfg!(feature = "canary-lost-state-served") {
                    self.insert_failed(
                        group,
                        format!(
                            "its state snapshot is unusable ({why}) and its log begins at op \
                             {first_op}, past op {history_from}: retention removed history only \
                             that snapshot held"
                        ),
                    );
                    return Ok(());
                }
                None
            }
        };
        let Some(log) = self.store.group_mut(group) else { return Ok(()) };
        // Nothing is known committed until the replica commits again.
        log.set_committed_end(0);
        let slot = log.slot();
        // A log whose beginning retention removed begins with a committed op (retention
        // deletes a segment only once the op after it committed); one a state transfer
        // installed begins with the transferred op, committed too.
        let first_committed = if log.first_op() > 1 { log.first_op() } else { 0 };
        let commit_min = transferred.as_ref().map_or(0, |&(op, _)| op).max(first_committed);
        let producer_snapshot = match (saved, transferred) {
            (Some(saved), Some((op, _))) if saved.op() >= op => Some(Ok(saved)),
            (saved, transferred) => transferred
                .map(|(_, producers)| ProducerTable::decode(&producers, limits))
                .or(saved.map(Ok)),
        };
        let recovered = RecoveredLog {
            view: slot.view,
            log_view: slot.log_view,
            headers,
            faulty_from,
            commit_min,
            log_view_head_op: slot.log_view_head_op,
        };
        let mut replica = Replica::recover(replica_config, recovered, self.seed);
        let (table, uncommitted) =
            rebuild_producers(log, &replica, producer_snapshot, &mut self.counters).await?;
        replica.recover_producers(table, &uncommitted);
        replica.ration_repair();
        self.insert_group(group, replica, None);
        Ok(())
    }

    /// Records `group` as stopped (fail-stop) with a blank replica that takes no input.
    pub(super) fn insert_failed(&mut self, group: u64, reason: String) {
        let replica =
            Replica::recover(self.replica_config(group), RecoveredLog::default(), self.seed);
        self.insert_group(group, replica, Some(reason));
        self.keep_stopped_log(group);
        self.counters.groups_failed += 1;
    }
}

/// A restarted group's producer table: the snapshot (when it decoded, and lies within the log
/// or the group's committed ops will come back from peers),
/// then every idempotent batch of the log past it up to the replica's commit point applied;
/// and the idempotence fields of the ops above the commit point, for the replica's pipeline
/// overlay.
async fn rebuild_producers<S: Storage>(
    log: &mut PartitionLog<S>,
    replica: &Replica,
    snapshot: Option<Result<ProducerTable, SnapshotError>>,
    counters: &mut NodeCounters,
) -> EngineResult<(ProducerTable, Vec<(u64, ProducerBatch)>)> {
    let limits = replica.config().producer_limits();
    let head = log.head_op();
    // A snapshot past the head describes committed ops this log lost (a damage cut, a power
    // loss of a `replicated` group). Where peers hold every committed op (the recovery is not
    // unclean), they come back unchanged, and applying them again leaves the table as it is:
    // the snapshot is the group's state, and the only one left that knows producers whose
    // ops retention removed (seed 227 with retention). Where recovery is unclean, those ops
    // may be gone for good and their offsets reissued: not this log's state.
    let trust_past_head = !replica.config().unclean_recovery;
    let mut table = match snapshot {
        Some(Ok(table)) if table.op() <= head || trust_past_head => table,
        Some(_) => {
            counters.producer_snapshots_rejected += 1;
            ProducerTable::new(limits)
        }
        None => ProducerTable::new(limits),
    };
    let commit = replica.commit();
    let mut uncommitted = Vec::new();
    let from_op = table.op() + 1;
    if from_op > head {
        return Ok((table, uncommitted));
    }
    // Below the log's start (retention): replay what is left.
    let mut next_op = from_op.max(log.first_op());
    // Not through the batch cache: a restart replays every group once, and consumers are
    // better served by what they read themselves.
    'scan: while next_op <= head {
        let prepares = log.read_ops(next_op, usize::MAX, 1 << 20).await?;
        let before = next_op;
        for prepare in prepares {
            let op = prepare.op();
            if op > head {
                break 'scan;
            }
            next_op = next_op.max(op + 1);
            counters.producer_ops_replayed += 1;
            let Some(batch) = ProducerBatch::from_body(&prepare.body()) else { continue };
            if op <= commit {
                let fields = prepare.header.as_prepare().expect("stored records are prepares");
                table.apply(&batch, op, fields.base_offset, fields.append_time_ms);
            } else {
                uncommitted.push((op, batch));
            }
        }
        if next_op == before {
            break;
        }
    }
    table.advance_to(commit.min(head));
    Ok((table, uncommitted))
}

/// The lower of two faulty-suffix starts, either possibly absent.
pub(super) fn min_faulty(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
