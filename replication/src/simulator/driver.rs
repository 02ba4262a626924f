//! What the cluster does above each node's replicas, as the server's driver does: the admin
//! group's state machine (`admin`) rebuilt at a restart, fed the committed ops, its state served
//! for a peer's transfer and installed from one, with snapshots; and every data group's producer
//! table snapshot. A saved snapshot lets retention remove what it covers.
//!
//! It never decides anything in the protocol: it answers a replica's `StateWanted` and saves
//! snapshots; the machine's own checks (a request executes at most once) live in `admin`.

use bytes::Bytes;
use shoal_engine::state::{self, GroupState};
use shoal_engine::storage::sim::Sim;

use super::admin::{ADMIN_SNAPSHOT_INTERVAL_OPS, AdminMachine};
use super::checks::Violation;
use super::cluster::{Cluster, SimNode, sim_group_dir};
use crate::message::Committed;

impl Cluster {
    /// Node `node`'s admin machine: the op it applied last and its state's bytes, when the
    /// node is up and the machine follows the group's log.
    pub fn admin_state(&self, node: usize) -> Option<(u64, Vec<u8>)> {
        let machine = self.nodes[node].admin.as_ref()?;
        Some((machine.op(), machine.encode()))
    }

    /// The admin group, when the run has one.
    pub(super) fn admin_group(&self) -> Option<u64> {
        (self.options.admin_group && self.options.groups >= 2).then_some(self.options.groups)
    }

    /// A restarted node's admin machine, as the server rebuilds its metadata state: the newer
    /// of its snapshot and the state a transfer installed, then the log past it up to the
    /// replica's commit point. A log that cannot be read back from there is not followed.
    /// Retention may then delete only what the machine's state covers.
    pub(super) fn rebuild_admin(&mut self, index: usize) -> Option<Violation> {
        let group = self.admin_group()?;
        let tick = self.tick;
        let violation =
            |what: String| Some(Violation { tick, what: format!("node {index}: {what}") });
        let host = &mut self.nodes[index];
        host.admin = None;
        let node = host.node.as_mut()?;
        let commit = node.replica(group)?.commit();
        let (storage, dir) = (host.sim.storage(), sim_group_dir(group));
        let saved = host.sim.block_on(state::load(&storage, &dir)).ok().flatten();
        let transferred =
            host.sim.block_on(state::load_transfer_state(&storage, &dir)).ok().flatten();
        let transferred = transferred.and_then(|state| {
            let (_, driver) = crate::decode_transfer_state(&state.bytes)?;
            Some(GroupState { bytes: driver.to_vec(), ..state })
        });
        let newest = match (saved, transferred) {
            (Some(saved), Some(transferred)) if transferred.op > saved.op => Some(transferred),
            (saved, transferred) => saved.or(transferred),
        };
        let mut machine = match newest {
            None => AdminMachine::new(),
            Some(newest) => {
                match AdminMachine::restore(newest.op, newest.end_offset, &newest.bytes) {
                    Ok(machine) => machine,
                    Err(what) => return violation(what),
                }
            }
        };
        let log = node.store_mut().group_mut(group)?;
        log.set_retention_floor(machine.end_offset());
        if log.first_op() > machine.op() + 1 {
            return None;
        }
        for op in machine.op() + 1..=commit {
            let Ok(Some(stored)) = host.sim.block_on(log.read_op(op)) else { return None };
            let fields = stored.header.as_prepare().expect("stored records are prepares");
            let end_offset = fields.end_offset();
            let request = (fields.client, fields.request);
            if let Err(what) = machine.apply((op, end_offset), request, &mut self.admin_executions)
            {
                return violation(format!("after its restart: {what}"));
            }
        }
        host.admin = Some(machine);
        None
    }

    /// Feeds node `index`'s admin machine what its replica delivered for `group`, answers a
    /// peer's transfer with the machine's state, and saves a snapshot once one is due. The other
    /// groups keep no state of the driver's (their transfers carry an empty part); their
    /// producer tables are snapshotted the same way.
    pub(super) fn apply_admin(
        &mut self,
        index: usize,
        group: u64,
        committed: &Committed,
    ) -> Option<Violation> {
        let tick = self.tick;
        let violation =
            |what: String| Some(Violation { tick, what: format!("node {index}: {what}") });
        let is_admin = self.admin_group() == Some(group);
        let host = &mut self.nodes[index];
        let node = host.node.as_mut()?;
        match committed {
            Committed::StateWanted { op } => {
                let state = if is_admin {
                    // A machine past the frozen op (a snapshot ahead of the recovered commit
                    // point) or not following cannot give the state at it: refused.
                    let machine = host.admin.as_ref().filter(|machine| machine.op() == *op);
                    self.coverage.admin_states_served += u64::from(machine.is_some());
                    machine.map(|machine| Bytes::from(machine.encode()))
                } else {
                    Some(Bytes::new())
                };
                node.on_driver_state(group, *op, state);
                None
            }
            Committed::Op { header } if !is_admin => {
                // A data group's producer table, saved as the server saves it with its
                // offsets: once it is at this op, every `ADMIN_SNAPSHOT_INTERVAL_OPS` ops.
                let fields = header.as_prepare().expect("prepares");
                let replica = node.replica(group)?;
                let saved_op = host.producers_saved_op.get(&group).copied().unwrap_or(0);
                if replica.producers().op() != fields.op
                    || fields.op < saved_op + ADMIN_SNAPSHOT_INTERVAL_OPS
                {
                    return None;
                }
                let bytes = replica.producers().encode();
                let saved = GroupState { op: fields.op, end_offset: fields.end_offset(), bytes };
                if save_snapshot(&host.sim, node, group, &saved) {
                    host.producers_saved_op.insert(group, saved.op);
                    self.coverage.producer_snapshots += 1;
                }
                None
            }
            _ if !is_admin => None,
            Committed::Transferred { header, state } => {
                let fields = header.as_prepare().expect("prepares");
                let end_offset = fields.end_offset();
                let machine = match AdminMachine::restore(fields.op, end_offset, state) {
                    Ok(machine) => machine,
                    Err(what) => return violation(what),
                };
                self.coverage.admin_duplicates += host.admin.take().map_or(0, |a| a.duplicates);
                self.coverage.admin_states_transferred += 1;
                host.admin = Some(machine);
                None
            }
            Committed::Op { header } => {
                let machine = host.admin.as_mut()?;
                let fields = header.as_prepare().expect("prepares");
                let end_offset = fields.end_offset();
                let request = (fields.client, fields.request);
                let applied = (fields.op, end_offset);
                if let Err(what) = machine.apply(applied, request, &mut self.admin_executions) {
                    return violation(what);
                }
                if machine.op() < machine.snapshot_op + ADMIN_SNAPSHOT_INTERVAL_OPS {
                    return None;
                }
                let saved = GroupState {
                    op: machine.op(),
                    end_offset: machine.end_offset(),
                    bytes: machine.encode(),
                };
                if save_snapshot(&host.sim, node, group, &saved) {
                    machine.snapshot_op = saved.op;
                    self.coverage.admin_snapshots += 1;
                }
                None
            }
        }
    }
}

/// Saves `saved` as `group`'s snapshot on the node's disk and lets retention delete what it
/// covers, as the server does once a snapshot is durable. False when the save failed (an
/// injected fault): the caller tries again at a later op.
fn save_snapshot(sim: &Sim, node: &mut SimNode, group: u64, saved: &GroupState) -> bool {
    if sim.block_on(state::save(&sim.storage(), &sim_group_dir(group), saved)).is_err() {
        return false;
    }
    if let Some(log) = node.store_mut().group_mut(group) {
        log.set_retention_floor(saved.end_offset);
    }
    true
}
