//! What drives the replicas: packets from peers, ticks, client requests and the driver's state
//! for a transfer, each handed to its group's replica and its outputs collected at once; and
//! the per-tick rationing of repair rounds across groups.
//!
//! Inputs never wait for I/O. A malformed or misaddressed packet is counted and dropped, never
//! asserted on; a client request the node refuses ([`RequestRefused`]) never reaches the
//! replica, so no op is taken that cannot be seen through; a stopped group takes no input.

use bytes::Bytes;

use shoal_engine::storage::Storage;

use super::config::{Clock, Transport};
use super::primaries::primary_belongs;
use super::state::Node;
use crate::codec::{self, CodecLimits, DecodeError};
use crate::config::Membership;
use crate::message::{Message, Request};

/// Why the node refused a client's request before it reached the replica. Nothing of the
/// request entered the log, so the client may send it again (to this node or another).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestRefused {
    /// The group is not on this node.
    UnknownGroup {
        /// The group asked for.
        group: u64,
    },
    /// The engine stopped the group (fail-stop); it takes no input until it is recovered.
    GroupFailed {
        /// The group.
        group: u64,
        /// Why, as the engine first reported it.
        reason: String,
    },
    /// The disk has no room for the group's next writes (DESIGN.md §3: the clean, retryable
    /// storage full). The group keeps serving reads; it takes writes again once a retried
    /// reservation succeeds, which the node tries once per tick.
    StorageFull {
        /// The group.
        group: u64,
    },
}

impl std::fmt::Display for RequestRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestRefused::UnknownGroup { group } => {
                write!(f, "group {group} is not on this node")
            }
            RequestRefused::GroupFailed { group, reason } => {
                write!(f, "group {group} stopped: {reason}")
            }
            RequestRefused::StorageFull { group } => {
                write!(f, "group {group}: storage full; retry once disk space is freed")
            }
        }
    }
}

impl std::error::Error for RequestRefused {}

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// A packet from node `from`. Anything malformed is counted and dropped.
    pub fn on_packet(&mut self, from: u8, packet: &Bytes) -> Result<(), DecodeError> {
        let limits = CodecLimits {
            message_size_bytes_max: self.config.message_size_bytes_max,
            view_headers_max: self.config.replica.view_headers_max,
            commit_entries_max: self.store.config().groups_max,
        };
        let (sender, messages) = match codec::decode(self.config.replica.cluster, packet, &limits) {
            Ok(decoded) => decoded,
            Err(error) => {
                self.counters.packets_rejected += 1;
                return Err(error);
            }
        };
        // A prepare names the replica that prepared it, whoever relays it; every other
        // message names its sender.
        let relayed = matches!(messages.as_slice(), [(_, Message::Prepare { .. })]);
        if sender != from && !relayed {
            self.counters.packets_rejected += 1;
            return Err(DecodeError::Invalid("sender"));
        }
        for (group, message) in messages {
            match self.wake(group) {
                Some(entry) if entry.failed.is_none() => {
                    entry.replica.on_message(from, message);
                    self.collect(group);
                }
                _ => self.counters.messages_unknown_group += 1,
            }
        }
        self.send_heartbeats();
        Ok(())
    }

    /// One tick for every replica awake (see the `sleep` module). It also runs the engine's
    /// tick (`ShardStore::on_tick`): whatever a full disk refused is tried again, once, so
    /// writes resume by themselves once space is freed (and a full disk is probed once per
    /// tick, not by every flush cycle), and groups gone idle hand their write chunks back.
    pub fn on_tick(&mut self) {
        self.store.on_tick();
        self.ticks += 1;
        self.wake_due();
        // Every replica ticks first, then the ones with output are collected in group order:
        // one group's tick never depends on another's output, so this is the order of ticking
        // and collecting each in turn, without looking every group up again.
        let node = self.config.node;
        let returning = self.config.primary_return_ticks > 0;
        let mut awake = std::mem::take(&mut self.tick_awake);
        let mut groups = std::mem::take(&mut self.tick_groups);
        let mut repairing = std::mem::take(&mut self.tick_repairing);
        awake.clear();
        awake.extend(self.awake.iter().copied());
        groups.clear();
        repairing.clear();
        for &group in &awake {
            let entry = self.groups.get_mut(&group).expect("an awake group is held");
            let replica = &mut entry.replica;
            if entry.failed.is_none() {
                replica.on_tick();
                let away = returning
                    && replica.is_primary()
                    && primary_belongs(&self.preferred_primaries, group, replica) != node;
                if away || replica.has_ready() {
                    groups.push(group);
                }
            }
            if replica.repair_wanted() || replica.repair_in_flight() {
                repairing.push(group);
            }
        }
        for &group in &groups {
            self.collect(group);
            if returning {
                self.return_home(group);
            }
        }
        // Collecting changes no replica; handing a group over may, so those are asked again.
        repairing.extend_from_slice(&groups);
        repairing.sort_unstable();
        repairing.dedup();
        self.grant_repairs(&repairing);
        // A group with output or away from home ticks again; the rest may sleep.
        for &group in &awake {
            if groups.binary_search(&group).is_err() {
                self.sleep_if_idle(group);
            }
        }
        self.tick_awake = awake;
        self.tick_groups = groups;
        self.tick_repairing = repairing;
        self.send_heartbeats();
    }

    /// Lets the groups whose repair round is due start one, within the tick's budget, the
    /// shard's bound on rounds in flight and its byte credit, taking turns from where the last
    /// tick stopped.
    /// `candidates` (ascending) holds every group that wants a round or has one in flight.
    fn grant_repairs(&mut self, candidates: &[u64]) {
        let rate = i64::try_from(self.config.repair_bytes_per_tick_max).unwrap_or(i64::MAX);
        if rate > 0 {
            // The credit saves up at most one round's worth (or one tick's, if more), so an
            // idle spell never buys a burst above the rate.
            let round = i64::try_from(self.config.replica.repair_bytes_max).unwrap_or(i64::MAX);
            self.repair_bytes_credit =
                self.repair_bytes_credit.saturating_add(rate).min(rate.max(round));
        }
        let in_flight =
            candidates.iter().filter(|group| self.groups[group].replica.repair_in_flight()).count();
        let mut budget = self
            .config
            .repair_rounds_per_tick_max
            .min(self.config.repair_rounds_in_flight_max.saturating_sub(in_flight));
        let cursor = self.repair_cursor;
        let from_cursor = candidates.partition_point(|&group| group < cursor);
        let wanting: Vec<u64> = candidates[from_cursor..]
            .iter()
            .chain(&candidates[..from_cursor])
            .copied()
            .filter(|group| {
                let entry = &self.groups[group];
                entry.failed.is_none() && entry.replica.repair_wanted()
            })
            .collect();
        for group in wanting {
            if budget == 0 || (rate > 0 && self.repair_bytes_credit <= 0) {
                self.counters.repair_rounds_deferred += 1;
                self.repair_cursor = group;
                return;
            }
            let replica = &mut self.groups.get_mut(&group).expect("listed").replica;
            let bytes = replica.grant_repair();
            if rate > 0 {
                self.repair_bytes_credit -= i64::try_from(bytes).unwrap_or(i64::MAX);
            }
            if replica.repair_in_flight() {
                budget -= 1;
                self.counters.repair_rounds_granted += 1;
            }
            self.collect(group);
        }
    }

    /// A client's write to `group`; the reply arrives through [`Node::take_replies`]. The
    /// append time is this node's clock.
    ///
    /// Refused at once, before the replica sees it, when the group is not here, has failed, or
    /// its storage is full: a request the replica accepted takes an op, which it must then see
    /// through, so a write that cannot get disk space must never get that far.
    pub fn on_client_request(
        &mut self,
        group: u64,
        request: Request,
    ) -> Result<(), RequestRefused> {
        self.admit_request(group, request, None)
    }

    /// A configuration change of `group` to the members `next` (see
    /// [`Replica::on_reconfigure_request`](crate::Replica::on_reconfigure_request)), carried by
    /// `request` like a client's write and answered the same way.
    pub fn on_reconfigure_request(
        &mut self,
        group: u64,
        request: Request,
        next: Membership,
    ) -> Result<(), RequestRefused> {
        self.admit_request(group, request, Some(next))
    }

    fn admit_request(
        &mut self,
        group: u64,
        mut request: Request,
        reconfigure: Option<Membership>,
    ) -> Result<(), RequestRefused> {
        let Some(entry) = self.wake(group) else {
            return Err(RequestRefused::UnknownGroup { group });
        };
        if let Some(reason) = &entry.failed {
            return Err(RequestRefused::GroupFailed { group, reason: reason.clone() });
        }
        if self.store.group(group).is_some_and(|log| log.is_storage_full()) {
            self.counters.storage_full_refusals += 1;
            return Err(RequestRefused::StorageFull { group });
        }
        request.append_time_ms = self.clock.now_ms();
        let entry = self.groups.get_mut(&group).expect("woken above");
        match reconfigure {
            None => entry.replica.on_client_request(request),
            Some(next) => entry.replica.on_reconfigure_request(request, next),
        }
        self.collect(group);
        self.send_heartbeats();
        Ok(())
    }

    /// The driver's answer to a `Committed::StateWanted` of `group` (see
    /// [`Replica::on_driver_state`](crate::Replica::on_driver_state)): its machine's state as
    /// of `op`, or `None` to refuse.
    pub fn on_driver_state(&mut self, group: u64, op: u64, state: Option<Bytes>) {
        let Some(entry) = self.wake(group) else { return };
        if entry.failed.is_some() {
            return;
        }
        entry.replica.on_driver_state(op, state);
        self.collect(group);
        self.send_heartbeats();
    }
}
