//! The driver's part of state transfers: what this shard's state machines add to the producer
//! table a replica transfers to a peer that fell behind its peers' retention (or lost its disk
//! with no peer holding the log's beginning). For a partition group that is its consumer
//! offsets; for the metadata group, the metadata snapshot (catalog and client table).
//!
//! It serves the state asked for (`Committed::StateWanted`), installs a peer's
//! (`Committed::Transferred`: the machine is replaced and its committed position jumps to the
//! state's op) and, at start-up, hands recovery the newer of a group's own snapshot and the
//! transferred state its log began from. It never decides when a transfer happens (the
//! replica does) and never writes the transferred state to disk (the engine's install does).

use std::cmp::Reverse;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use shoal_engine::state::{self, GroupState};
use shoal_engine::storage::Storage;
use shoal_proto::wire::Header;

use super::state::ShardState;
use crate::metadata::{METADATA_GROUP, MetaState};
use crate::offsets::PartitionOffsets;

impl ShardState {
    /// Answers a replica's `StateWanted { op }` with the machine's state as of `op`, or with
    /// nothing when the machine cannot give it (the peer that asked then asks another replica).
    ///
    /// Committed ops reach the machine in order and the replica asks only after delivering
    /// every op up to `op`, so the metadata state is at `op` exactly whenever it follows its
    /// log. A partition's offsets may already hold a commit of a later op (the primary applies
    /// its own commits when it answers them, which this loop does before it applies committed
    /// ops): the peer applies that op again when it arrives, and an offset commit applied twice
    /// in log order leaves the table as it was.
    pub(super) fn serve_driver_state(&mut self, group: u64, op: u64) {
        let state = if group == METADATA_GROUP {
            self.metadata
                .as_ref()
                .filter(|metadata| metadata.state.catalog.applied_op == op)
                .map(|metadata| Bytes::from(metadata.state.encode_snapshot()))
        } else if self.node.group_failure(group).is_some() {
            None
        } else {
            let encoded = self.offsets.get(&group).map(PartitionOffsets::encode);
            Some(Bytes::from(encoded.unwrap_or_else(|| PartitionOffsets::default().encode())))
        };
        self.metrics.driver_state_served(state.is_some());
        self.node.on_driver_state(group, op, state);
    }

    /// Replaces `group`'s machine with the state a peer's transfer carried, as of the op of
    /// `header` (the first op of the log the replica installed), and moves its committed end
    /// there. A state that does not decode leaves the machine as it was and is logged: the
    /// peer's machine encoded it, so only a build mismatch or a bug can cause it. Says whether
    /// the state was installed.
    pub(super) fn install_driver_state(
        &mut self,
        group: u64,
        header: &Header,
        state: &[u8],
    ) -> bool {
        let fields = *shoal_engine::record::prepare_of(header);
        let end_offset = fields.end_offset();
        self.committed_end.insert(group, end_offset);
        self.wake_parked(group);
        let installed = if group == METADATA_GROUP {
            self.install_metadata_state(fields.op, state)
        } else {
            PartitionOffsets::decode(state).map(|table| {
                let offsets = self.offsets.entry(group).or_default();
                offsets.replace_table(table);
                // The log now begins past `end_offset`: data may end anywhere up to it.
                offsets.data_end = end_offset;
            })
        };
        self.metrics.driver_state_installed(installed.is_ok());
        match &installed {
            Ok(()) => tracing::info!(
                shard = self.index,
                group,
                op = fields.op,
                end_offset,
                "state transfer installed"
            ),
            Err(why) => tracing::error!(
                shard = self.index,
                group,
                op = fields.op,
                why,
                "a transferred state does not decode; the group's machine keeps its own"
            ),
        }
        installed.is_ok()
    }

    /// The metadata group's half of [`ShardState::install_driver_state`]: the new state is
    /// published at once, and a snapshot of it saved (the log before it is gone).
    fn install_metadata_state(&mut self, op: u64, bytes: &[u8]) -> Result<(), String> {
        let groups_max = self.node.shard_config().groups_max as u32;
        let (shards, sessions_max) = (self.config.shards, self.config.metadata.sessions_max);
        let Some(metadata) = self.metadata.as_mut() else {
            return Err("this shard keeps no metadata state".into());
        };
        let state = MetaState::decode_snapshot(bytes, shards, groups_max, sessions_max)
            .map_err(|e| e.to_string())?;
        if state.catalog.applied_op != op {
            return Err(format!("its state is at op {}, not {op}", state.catalog.applied_op));
        }
        metadata.state = state;
        metadata.snapshot_due = true;
        let catalog = Arc::new(metadata.state.catalog.clone());
        self.publish(catalog);
        Ok(())
    }
}

/// The states recovery may start a group's machine from, newest first: the group's own
/// snapshot (`state`, unless unreadable: `saved` is the caller's load of it) and the driver's
/// part of the state a transfer installed its log from (`transfer-state`). A transferred state
/// that cannot be read is left out: the node layer stops a group whose transferred state is
/// damaged, before the driver recovers it.
pub(super) async fn recovery_states<S: Storage>(
    storage: &S,
    group_dir: &Path,
    saved: Option<GroupState>,
) -> Vec<GroupState> {
    let transferred = state::load_transfer_state(storage, group_dir).await.ok().flatten();
    let transferred = transferred.and_then(|state| {
        let (_, driver) = shoal_replication::decode_transfer_state(&state.bytes)?;
        Some(GroupState { bytes: driver.to_vec(), ..state })
    });
    let mut states: Vec<GroupState> = saved.into_iter().chain(transferred).collect();
    states.sort_by_key(|state| Reverse(state.op));
    states
}
