//! Where the node's groups are led: the deliberate view changes a node's primaries start
//! (DESIGN.md §8) — a group led away from its home (its view-0 primary) is handed back once the
//! home has been in sync for `primary_return_ticks`, and a node that shuts down hands every
//! group it leads to a peer in sync — and which groups the node leads.
//!
//! It decides only who should lead, and only on the node that leads now; the hand-over itself
//! (refusing new requests, waiting for the target, leaving the view) is the replica's
//! ([`Replica::hand_over`](crate::Replica::hand_over)). It never hands a group to a peer that
//! has not proven, by its acknowledgements in the current view, that it is in sync.

use std::collections::BTreeMap;

use shoal_engine::storage::Storage;

use super::config::{Clock, Transport};
use super::state::Node;
use crate::replica::{HandOverRefused, Replica};

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// Hands `group` to member `to` (see [`Replica::hand_over`]); returns the view `to` will
    /// lead.
    pub fn hand_over(&mut self, group: u64, to: u8) -> Result<u32, HandOverRefused> {
        let entry = self
            .wake(group)
            .filter(|g| g.failed.is_none())
            .ok_or(HandOverRefused::GroupUnavailable { group })?;
        let view = entry.replica.hand_over(to)?;
        self.collect(group);
        self.send_heartbeats();
        Ok(view)
    }

    /// Controlled shutdown (Kafka's): begins a hand-over of every group this node leads, each to
    /// a peer in sync that answered one of the last two heartbeats (the group's home first, else
    /// the one in sync the longest). Returns how many began; a group with no such peer, or
    /// already handing over, is left as it is. The driver keeps the node running until
    /// [`Node::shutdown_settled`] (or its bound passes), calling this again now and then: a
    /// hand-over given up, or a view change that came back to this node, needs another.
    pub fn hand_over_all(&mut self) -> usize {
        let mut begun = 0;
        for group in self.groups_led() {
            let entry = &self.groups[&group];
            let replica = &entry.replica;
            if replica.handing_over().is_some() {
                continue;
            }
            let Some(to) = shutdown_target(replica, self.asleep_ticks(entry)) else {
                self.counters.shutdown_groups_without_peer += 1;
                continue;
            };
            if self.hand_over(group, to).is_ok() {
                self.counters.shutdown_hand_overs += 1;
                begun += 1;
            }
        }
        begun
    }

    /// The groups this node's replica serves as primary (handing over or not), ascending.
    pub fn groups_led(&self) -> Vec<u64> {
        self.groups
            .iter()
            .filter(|(_, g)| g.failed.is_none() && g.replica.is_primary())
            .map(|(&group, _)| group)
            .collect()
    }

    /// Whether a node shutting down may stop now: no hand-over is under way, it votes in no view
    /// change (a hand-over is complete once it installed the target's StartView), and it leads
    /// no group it could still hand to a peer (what it leads with every peer silent or behind,
    /// as the last node of a cluster stopping, stays led).
    pub fn shutdown_settled(&self) -> bool {
        self.groups.values().filter(|g| g.failed.is_none()).all(|g| {
            let replica = &g.replica;
            replica.handing_over().is_none()
                && replica.status() != crate::replica::Status::ViewChange
                && (!replica.is_primary()
                    || shutdown_target(replica, self.asleep_ticks(g)).is_none())
        })
    }

    /// Makes voter `node` the place `group`'s primary belongs instead of its home (a leader
    /// balancer's choice, which the driver gets agreed elsewhere, e.g. in a metadata group);
    /// `None`: the home again. Only the group's primary acts on it, handing over as it hands
    /// back home. A node that is not (or no longer) a voter is ignored: the home stands.
    pub fn set_preferred_primary(&mut self, group: u64, node: Option<u8>) {
        match node {
            Some(node) => self.preferred_primaries.insert(group, node),
            None => self.preferred_primaries.remove(&group),
        };
        // Its next tick decides whether its primary is away: a sleeping group ticks again.
        self.wake(group);
    }

    /// On a tick: `group`, led by this node away from where its primary belongs (its home, or
    /// the voter preferred instead), goes there once that node has been in sync for
    /// `primary_return_ticks` (0: never).
    pub(super) fn return_home(&mut self, group: u64) {
        let return_ticks = self.config.primary_return_ticks;
        let replica = &self.groups[&group].replica;
        let home = primary_belongs(&self.preferred_primaries, group, replica);
        if return_ticks == 0
            || home == self.config.node
            || !replica.is_primary()
            || replica.handing_over().is_some()
            || replica.in_sync_ticks(home).is_none_or(|ticks| ticks < return_ticks)
        {
            return;
        }
        if self.hand_over(group, home).is_ok() {
            self.counters.primaries_returned += 1;
        }
    }
}

/// Where `group`'s primary belongs: the voter preferred for it, while it is one, else its home.
pub(super) fn primary_belongs(preferred: &BTreeMap<u64, u8>, group: u64, replica: &Replica) -> u8 {
    let config = replica.config();
    match preferred.get(&group) {
        Some(&node) if config.is_voter(node) => node,
        _ => config.home(),
    }
}

/// The peer a shutting-down primary hands `replica`'s group to: among the peers in sync that
/// answered one of the last two heartbeats, counted at a settled group's slower pace (a peer
/// that stopped is still "in sync" for `replica_lag_ticks_max`), the home, else the one in sync
/// the longest (the lowest index among equals). `asleep_ticks`: the ticks the node has not
/// handed the sleeping replica yet, by which every peer's time in sync and silence are longer
/// than the replica's own figures.
fn shutdown_target(replica: &Replica, asleep_ticks: u64) -> Option<u8> {
    let config = replica.config();
    let heard_ticks_max = 2 * config.idle_heartbeat_interval_ticks;
    let ready = |peer: u8| {
        let in_sync = replica.in_sync_ticks(peer)? + asleep_ticks;
        let silent = replica.silent_ticks(peer)? + asleep_ticks;
        (silent <= heard_ticks_max).then_some(in_sync)
    };
    if ready(config.home()).is_some() {
        return Some(config.home());
    }
    config
        .members
        .voter_indices()
        .filter_map(|peer| ready(peer).map(|ticks| (ticks, peer)))
        .max_by_key(|&(ticks, peer)| (ticks, std::cmp::Reverse(peer)))
        .map(|(_, peer)| peer)
}
