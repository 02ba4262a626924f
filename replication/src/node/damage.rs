//! When storage goes wrong for a group: fail-stop (a group the engine failed takes no more
//! input), and protocol-aware recovery of damage (DESIGN.md §3): the log is cut at the first
//! invalid record, the cut ops become the replica's faulty suffix, and the damage marker goes
//! only once peers brought them back and that is durable.
//!
//! It never cuts a group of one (with no peer to repair from, damage refuses service,
//! DESIGN.md §6), never takes a read that merely failed for damage, and never clears a damage
//! marker before the repaired ops are durable.

use shoal_engine::Error as EngineError;
use shoal_engine::storage::Storage;
use shoal_proto::wire::Header;

use super::config::{Clock, Transport};
use super::restart::{SavedProducers, min_faulty};
use super::state::Node;

/// Damage cuts a node remembers for status.
pub(super) const DAMAGE_CUTS_KEPT: usize = 16;

/// Where protocol-aware recovery cut a group's log (DESIGN.md §3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamageCut {
    /// The group.
    pub group: u64,
    /// The log's head after the cut.
    pub head_op: u64,
    /// Where the faulty suffix begins (None only under the `canary-truncate-faulty` canary).
    pub faulty_from: Option<u64>,
    /// The file, byte position and reason of the first invalid record, when the chain did not
    /// simply end there.
    pub at: Option<String>,
}

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// Where `group`'s log was cut for damage while the cut ops are not all back yet, or their
    /// return is not yet durable (see `GroupSlot::damaged_from`: a restart before the cleared
    /// marker reaches the superblock finds it again); None when there is no such cut.
    pub fn damaged_from(&self, group: u64) -> Option<u64> {
        self.store.damage_marker(group)
    }

    /// The newest damage cuts (protocol-aware recovery), oldest first.
    pub fn damage_cuts(&self) -> impl Iterator<Item = &DamageCut> {
        self.damage_cuts.iter()
    }

    /// Whether this node's groups have peers (protocol-aware recovery needs someone to repair
    /// from; a group of one refuses service on damage instead, DESIGN.md §6). A lone voter's
    /// learners count for nothing there, but a learner repairs from its voters.
    pub(super) fn has_peers(&self) -> bool {
        let replica = &self.config.replica;
        replica.voter_count() > 1 || !replica.is_voter(self.config.node)
    }

    /// A failure of the shard's storage (or a checkpoint) stops every group.
    pub(super) fn fail_all(&mut self, error: &EngineError) {
        let groups: Vec<u64> = self.groups.keys().copied().collect();
        let reason = error.to_string();
        for group in groups {
            self.fail_group(group, EngineError::Invalid(reason.clone()));
        }
    }

    /// Stops `group` (fail-stop); one already stopped keeps its first reason.
    pub(super) fn fail_group(&mut self, group: u64, error: EngineError) {
        if let Some(entry) = self.wake(group)
            && entry.failed.is_none()
        {
            entry.failed = Some(error.to_string());
            self.counters.groups_failed += 1;
            self.abandon_pipeline(group);
            self.keep_stopped_log(group);
        }
    }

    /// Answers the requests in `group`'s pipeline with "outcome unknown", before its replica
    /// stops or is replaced: neither would ever answer them, and their clients (and connection
    /// slots) waited for good. What else the replica had ready goes with it.
    fn abandon_pipeline(&mut self, group: u64) {
        let Some(entry) = self.wake(group) else { return };
        entry.replica.fail_pipeline();
        let replies = entry.replica.take_ready().replies;
        self.replies.extend(replies.into_iter().map(|reply| (group, reply)));
    }

    /// Protocol-aware recovery of a damaged group (DESIGN.md §3): the engine cuts its log at
    /// the first invalid record, durably, and the ops past the cut become the replica's faulty
    /// suffix, which it never nacks and which repair and StartView bring back from peers.
    /// Returns where the faulty suffix begins, or why the cut failed.
    pub(super) async fn cut_damaged(&mut self, group: u64) -> Result<Option<u64>, String> {
        match self.store.cut_damaged(group).await {
            Ok(recovery) => {
                self.counters.damage_cuts += 1;
                self.damage_clear_at.remove(&group);
                if self.damage_cuts.len() >= DAMAGE_CUTS_KEPT {
                    self.damage_cuts.pop_front();
                }
                self.damage_cuts.push_back(DamageCut {
                    group,
                    head_op: recovery.head_op,
                    faulty_from: recovery.faulty.suffix_from,
                    at: recovery.cut.map(|(file, position, why)| {
                        format!("{} at byte {position}: {why}", file.display())
                    }),
                });
                Ok(recovery.faulty.suffix_from)
            }
            Err(error) => Err(error.to_string()),
        }
    }

    /// A group whose log a read found damaged while it served: fail-stop, then reopened at
    /// once. With peers it is recovered with a damage cut and its replica
    /// restarts `Recovering` (it was never nacking anything it held: the cut ops are faulty);
    /// a group of one stays stopped, refusing service (DESIGN.md §6).
    pub(super) async fn reopen_damaged(&mut self, group: u64, reason: String) {
        if !self.has_peers() {
            self.fail_group(group, EngineError::Invalid(reason));
            return;
        }
        // The log at rest: everything appended is written, no job in flight.
        self.settle().await;
        // What the replica asked for, and what it wanted sent, belongs to a replica that is
        // about to be replaced; a restarted replica asks again for what it still needs.
        self.forget_queued(group);
        self.abandon_pipeline(group);
        self.counters.groups_reopened += 1;
        // Ops the replica already held faulty stay faulty: the replica is replaced, not its
        // history.
        let faulty_before = self.groups.get(&group).and_then(|g| g.replica.faulty_from());
        // So is its producer table, as of its commit point: the log the cut leaves may no
        // longer begin at op 1 (retention), and rebuilt from it alone the table would forget
        // producers only the older ops knew. The ops past the cut come back from peers
        // unchanged, and applying them again changes nothing.
        let saved = self.groups.get(&group).map_or(SavedProducers::NotKept, |g| {
            SavedProducers::Saved(g.replica.producers().encode())
        });
        let headers = match self.cut_damaged(group).await {
            Ok(from) => match self.newest_headers(group).await {
                Ok(headers) => Some((headers, from)),
                Err(error) => {
                    self.fail_group(group, error);
                    None
                }
            },
            Err(reason) => {
                self.fail_group(group, EngineError::Invalid(reason));
                None
            }
        };
        if let Some((headers, faulty_from)) = headers {
            let head = headers.last().and_then(Header::as_prepare).map_or(0, |p| p.op);
            // A faulty op the reopened log holds again is no longer missing.
            let before = faulty_before.map(|from| from.max(head + 1));
            let faulty_from = min_faulty(faulty_from, before);
            if let Err(error) = self.insert_recovered(group, headers, faulty_from, saved).await {
                self.fail_group(group, error);
            }
        }
    }

    /// Forgets each group's damage marker once its replica holds every op again: its faulty
    /// suffix is cleared (a StartView brought it up to date) and everything it appended is
    /// durable, so a crash cannot take the repaired ops away with the marker gone.
    pub(super) fn clear_repaired_damage(&mut self) {
        for group in self.store.damaged_groups() {
            let Some(entry) = self.groups.get(&group) else { continue };
            let Some(log) = self.store.group(group) else { continue };
            let damaged_from = log.damaged_from();
            if damaged_from == 0
                || entry.failed.is_some()
                || entry.replica.faulty_from().is_some()
                || entry.replica.status() != crate::replica::Status::Normal
            {
                continue;
            }
            // The head when the faulty suffix cleared covers every op the cut took; under load
            // the appended head keeps moving past what is durable, so wait for that one.
            let target = *self.damage_clear_at.entry(group).or_insert(entry.replica.op_appended());
            if self.store.durable_op(group).is_none_or(|op| op < target) {
                continue;
            }
            self.counters.damaged_ops_repaired += (target + 1).saturating_sub(damaged_from);
            self.counters.damage_repaired += 1;
            self.repaired_groups.push(group);
        }
        for group in std::mem::take(&mut self.repaired_groups) {
            self.damage_clear_at.remove(&group);
            self.store.clear_damaged_from(group);
        }
    }
}
