//! The invariant checks and what they report ([`Violation`]): committed prefixes agree on every
//! replica (as commits arrive), one primary per view of a group (a view names its configuration
//! epoch), no committed configuration change below the replication factor, views and log views
//! never regress across a restart, and at the
//! end every node's log holds the committed prepares with dense offsets and every acknowledged
//! write at its acknowledged op and offset, no retry applied twice, the admin machines agree, and
//! the offline checker finds no damage but what was injected.
//!
//! Checks only look: they must never change what a run does or draw from its PRNG, so checking
//! never moves a trace hash.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use shoal_proto::wire::Header;

use super::admin::AdminMachine;
use super::cluster::{Cluster, DATA_DIR, SimNode};

/// A broken invariant, with the tick it was found at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// When.
    pub tick: u64,
    /// Which invariant, and the evidence.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tick {}: {}", self.tick, self.what)
    }
}

impl Cluster {
    /// Checks the final logs (see [`Cluster::finish`]).
    pub fn check_logs(&mut self) -> Result<(), Violation> {
        into_result(self.check_final_logs())
    }

    /// Runs the offline checker (`shoal_engine::inspect`) over every node's simulated disk: it
    /// must find no damage but what was injected and not yet cut or repaired. The torn window
    /// past a checkpoint, zeros and stale bytes past a chain's end are notes, never problems,
    /// so a live node's disk (unsynced writes visible, as after a process crash) is judged the
    /// same way as a crash image.
    pub fn check_disks(&mut self) -> Result<(), Violation> {
        into_result(self.check_disk_images())
    }

    /// Forgets the committed history and the acknowledgements so far: after an unclean
    /// recovery (`unclean_recovery`) a group may reissue ops and offsets, the documented loss,
    /// and only what happens from here on is checked.
    pub fn forget_history(&mut self) {
        self.committed.clear();
        self.acks.clear();
        // The group may have forgotten the producers' last batches too: as a Kafka producer
        // does after an unclean election, each starts a new epoch from sequence 0.
        for client in &mut self.clients {
            client.pending = None;
            client.epoch += 1;
            client.epoch_first_request = client.next_request;
        }
    }

    /// At most one primary per view of each group, over the whole run: a view number names its
    /// configuration epoch, so two primaries of one view would be two primaries of one view of
    /// one configuration (two leaders, two diverging logs in the making).
    pub(super) fn check_primaries(&mut self) -> Option<Violation> {
        for index in 0..self.nodes.len() {
            let Some(node) = self.nodes[index].node.as_ref() else { continue };
            for group in node.group_ids() {
                let Some(replica) = node.replica(group).filter(|r| r.is_primary()) else {
                    continue;
                };
                let view = replica.view();
                let first = *self.primaries.entry((group, view)).or_insert(index);
                if first != index {
                    return Some(Violation {
                        tick: self.tick,
                        what: format!(
                            "two primaries of group {group} in view {view}: node {first} and \
                             node {index}"
                        ),
                    });
                }
            }
        }
        None
    }

    /// A committed configuration change keeps the group's voters at its replication factor
    /// (`voters()`): a move adds members as learners and swaps voters one for one, never
    /// passing through fewer (DESIGN.md §8).
    pub(super) fn check_voters(&self, group: u64, header: &Header) -> Option<Violation> {
        let fields = header.as_prepare()?;
        let next = fields.reconfigure;
        let voters = u32::from(self.options.voters());
        (!next.is_empty() && next.voter_count() < voters).then(|| Violation {
            tick: self.tick,
            what: format!(
                "group {group} op {} committed a configuration of {} voters, below {voters}: \
                 {next:?}",
                fields.op,
                next.voter_count()
            ),
        })
    }

    /// The agreement check, as a node reports `op` of `group` committed with `checksum`: every
    /// replica commits the same prepare at an op.
    pub(super) fn check_agreement(
        &mut self,
        index: usize,
        group: u64,
        op: u64,
        checksum: u32,
    ) -> Option<Violation> {
        match self.committed.insert((group, op), checksum) {
            Some(previous) if previous != checksum => Some(Violation {
                tick: self.tick,
                what: format!(
                    "committed prefixes diverge: group {group} op {op} committed as \
                     {previous:#010x} and as {checksum:#010x} (node {index})"
                ),
            }),
            _ => None,
        }
    }

    /// Node `index`, just reopened, holds no group at a lower view or log view than its replica
    /// was told is durable before the restart.
    pub(super) fn check_views_after_restart(
        &self,
        index: usize,
        node: &SimNode,
    ) -> Option<Violation> {
        for (&group, &(view, log_view)) in &self.nodes[index].durable_views {
            // A group the open stopped (a read error) has an inert stand-in replica; its
            // views stay in the superblock for the supervisor's next open, checked again then.
            if node.group_failure(group).is_some() {
                continue;
            }
            let Some(replica) = node.replica(group) else { continue };
            if replica.view() < view || replica.log_view() < log_view {
                return Some(Violation {
                    tick: self.tick,
                    what: format!(
                        "views regressed: node {index} group {group} restarted at view {} log \
                         view {} after view {view} log view {log_view} was durable",
                        replica.view(),
                        replica.log_view()
                    ),
                });
            }
        }
        None
    }

    /// Reads every node's log back: committed ops match the agreed checksums, offsets are
    /// dense, and every acknowledged write sits at its acknowledged op and offset.
    pub(super) fn check_final_logs(&mut self) -> Option<Violation> {
        let mut logs = FinalLogs::default();
        // Per group, the highest commit point any replica knows: a backup's log may already
        // hold ops its primary committed and answered just before the run ended, before the
        // next commit message told the backup (and the primary's own log may be cut short by
        // latent damage this check stops at).
        let group_commit: BTreeMap<u64, u64> =
            (1..=self.options.groups).map(|group| (group, self.commit_max(group))).collect();
        for index in 0..self.nodes.len() {
            for group in 1..=self.options.groups {
                let commit_max = group_commit.get(&group).copied().unwrap_or(0);
                if let Some(violation) = self.check_final_log(index, group, commit_max, &mut logs) {
                    return Some(violation);
                }
            }
        }
        self.check_acks(&logs).or_else(|| self.check_admin_machines())
    }

    /// Reads node `index`'s log of `group` back, when the node is up, into `logs`: from its
    /// first op to its commit point, and on to `commit_max` (the highest commit point any
    /// replica knows) while it holds the committed prepares; it stops at injected damage the
    /// node never read back.
    fn check_final_log(
        &mut self,
        index: usize,
        group: u64,
        commit_max: u64,
        logs: &mut FinalLogs,
    ) -> Option<Violation> {
        let tick = self.tick;
        let admin_group = self.admin_group();
        let violation = |what: String| Some(Violation { tick, what });
        let host = &mut self.nodes[index];
        let node = host.node.as_mut()?;
        let commit = node.replica(group).map(|r| r.commit())?;
        if let Some(reason) = node.group_failure(group) {
            return violation(format!("node {index} group {group} stopped: {reason}"));
        }
        let sim = &host.sim;
        let log = node.store_mut().group_mut(group)?;
        let mut next_offset = None;
        let first_op = log.first_op().max(1);
        let retained = logs.retained_from.entry(group).or_insert(first_op);
        *retained = (*retained).min(first_op);
        let beyond_max = commit_max.min(log.head_op());
        for op in first_op..=commit.max(beyond_max) {
            // Above its own commit point an op counts only where it is the committed
            // prepare; anything else there is a lagging log, not a fault.
            let beyond = op > commit;
            let damaged = self.damage.iter().any(|d| {
                d.node == index && d.group == group && d.op <= op && {
                    let bytes = sim.file_contents(&d.path);
                    bytes.is_some_and(|b| b.get(d.byte as usize) == Some(&d.flipped))
                }
            });
            if damaged {
                // Injected damage this node never read back (it is latent until read):
                // what lies past it is checked on the other replicas.
                break;
            }
            let stored = match sim.block_on(log.read_op(op)) {
                Ok(Some(stored)) => stored,
                _ if beyond => break,
                Ok(None) => {
                    let head = log.head_op();
                    return violation(format!(
                        "node {index} group {group} lost committed op {op} (engine head {head})"
                    ));
                }
                Err(error) => {
                    return violation(format!("node {index} group {group} op {op}: {error}"));
                }
            };
            let fields = *stored.header.as_prepare().expect("prepares");
            if beyond && self.committed.get(&(group, op)) != Some(&stored.header.checksum_header) {
                break;
            }
            if let Some(expected) = next_offset
                && fields.base_offset != expected
            {
                return violation(format!("node {index} group {group} op {op}: offsets not dense"));
            }
            next_offset = Some(fields.end_offset());
            if let Some(&checksum) = self.committed.get(&(group, op))
                && checksum != stored.header.checksum_header
            {
                return violation(format!(
                    "node {index} group {group} op {op}: log differs from the committed prepare"
                ));
            }
            logs.verified.insert((group, op), (fields.base_offset, fields.client, fields.request));
            // The admin group's log may hold a retry twice: its client table executes it
            // once (checked below).
            if admin_group != Some(group)
                && let Some(first) = logs.applied.insert((group, fields.client, fields.request), op)
                && first != op
            {
                return violation(format!(
                    "retried request applied twice: group {group} client {} request {} \
                     at ops {first} and {op} (node {index})",
                    fields.client, fields.request
                ));
            }
        }
        None
    }

    /// Every acknowledged write sits at its acknowledged op and offset in the logs read back
    /// (unless retention removed its op from every log).
    fn check_acks(&self, logs: &FinalLogs) -> Option<Violation> {
        let violation = |what: String| Some(Violation { tick: self.tick, what });
        for ack in &self.acks {
            if logs.retained_from.get(&ack.group).is_some_and(|&first| ack.op < first) {
                continue;
            }
            match logs.verified.get(&(ack.group, ack.op)) {
                Some(&(base_offset, client, request))
                    if base_offset == ack.base_offset
                        && client == ack.client
                        && request == ack.request => {}
                found => {
                    return violation(format!(
                        "acknowledged write lost: group {} op {} offset {} (client {} request {}); the final log holds {found:?}; damage not yet cut or repaired: {:?}; {}",
                        ack.group,
                        ack.op,
                        ack.base_offset,
                        ack.client,
                        ack.request,
                        self.damage
                            .iter()
                            .filter(|d| self.unhealed(d))
                            .map(|d| (d.node, d.group, d.op))
                            .collect::<Vec<_>>(),
                        self.describe()
                    ));
                }
            }
        }
        None
    }

    /// The admin group's machines agree: any two at the same op hold the same state (that no
    /// request executes twice, or at two ops, is checked as they apply), and each holds every
    /// acknowledged request at or below its position as executed.
    fn check_admin_machines(&self) -> Option<Violation> {
        let group = self.admin_group()?;
        let machines: Vec<(usize, &AdminMachine)> = (0..self.nodes.len())
            .filter_map(|index| Some((index, self.nodes[index].admin.as_ref()?)))
            .collect();
        let violation = |what: String| Some(Violation { tick: self.tick, what });
        for (i, &(a, first)) in machines.iter().enumerate() {
            for &(b, second) in &machines[i + 1..] {
                if first.op() == second.op() && first.encode() != second.encode() {
                    return violation(format!(
                        "admin machines of nodes {a} and {b} hold different states at op {}",
                        first.op()
                    ));
                }
            }
        }
        for ack in self.acks.iter().filter(|ack| ack.group == group) {
            for &(index, machine) in &machines {
                if ack.op <= machine.op() && !machine.knows(ack.client, ack.request) {
                    return violation(format!(
                        "node {index}'s admin machine does not hold acknowledged client {} \
                         request {} (op {}) as executed",
                        ack.client, ack.request, ack.op
                    ));
                }
            }
        }
        None
    }

    /// The offline checker's verdict on every node's disk (see [`Cluster::check_disks`]).
    pub(super) fn check_disk_images(&mut self) -> Option<Violation> {
        for index in 0..self.nodes.len() {
            let sim = &self.nodes[index].sim;
            let report =
                sim.block_on(shoal_engine::inspect::inspect(&sim.storage(), Path::new(DATA_DIR)));
            let what = if let Some(error) = &report.error {
                Some(format!("node {index}: inspect could not check the disk: {error}"))
            } else {
                report
                    .problems
                    .iter()
                    .find(|problem| {
                        !self.damage.iter().any(|d| {
                            d.node == index
                                && d.path == problem.file
                                && self.damage_on_disk(d)
                                && (d.record_bytes..=d.byte).contains(&problem.position_bytes)
                        })
                    })
                    .map(|problem| {
                        format!("node {index}: inspect found damage nobody injected: {problem}")
                    })
            };
            if let Some(what) = what {
                return Some(Violation { tick: self.tick, what });
            }
        }
        None
    }

    /// Every replica's protocol state, for a violation report.
    pub(super) fn describe(&self) -> String {
        let mut out = String::new();
        for (index, host) in self.nodes.iter().enumerate() {
            let Some(node) = &host.node else {
                out.push_str(&format!("[node {index} down] "));
                continue;
            };
            for group in node.group_ids() {
                let Some(r) = node.replica(group) else { continue };
                out.push_str(&format!(
                    "[node {index} group {group}: {:?} view {} log_view {} op {} appended {} \
                     commit {} faulty_from {:?} failed {:?} next {:?} {:?}] ",
                    r.status(),
                    r.view(),
                    r.log_view(),
                    r.op(),
                    r.op_appended(),
                    r.commit(),
                    r.faulty_from(),
                    node.group_failure(group),
                    [24u64, 28].map(|o| r.header(o).map(|h| (h.checksum_header, h.view))),
                    r.counters(),
                ));
            }
        }
        out
    }
}

/// A step's `Option<Violation>` as the `Result` the public API returns.
pub(super) fn into_result(violation: Option<Violation>) -> Result<(), Violation> {
    violation.map_or(Ok(()), Err)
}

/// What the final log check read back from every node's logs.
#[derive(Default)]
struct FinalLogs {
    /// (group, op) → (base offset, client, request) of the prepare read back.
    verified: BTreeMap<(u64, u64), (u64, u64, u64)>,
    /// (group, client, request) → op. Exactly once (DESIGN.md §4): a request resent after a
    /// timeout, to any node, across view changes and restarts, is in the committed log once.
    applied: BTreeMap<(u64, u64, u64), u64>,
    /// Per group, the lowest op some node's log still holds: retention (when a run sets it)
    /// removes older ops by configuration, so acknowledgements below it cannot be checked.
    retained_from: BTreeMap<u64, u64>,
}
