//! Which groups tick. A group whose next ticks would only count (`Replica::ticks_only_counting`)
//! sleeps: the node's tick skips it until an input arrives or the tick at which its own tick
//! does work again comes, and then first hands it the ticks it slept through
//! (`Replica::skip_ticks`), so it is in the state ticking it every time would have left it in.
//! A one-replica primary with nothing to finish sleeps until an input: a single node's 10,000
//! idle groups cost its tick nothing. In an idle group of three, the primary sleeps until its
//! next heartbeat is due and its backups until that heartbeat arrives (an input): each wakes
//! about once per heartbeat instead of every tick, and a settled group heartbeats only every
//! idle interval (`ReplicaConfig::idle_heartbeat_interval_ticks`). A sleeping primary's peers
//! grow more silent and lag more with every tick it slept through, so the node adds those ticks
//! to what it reports of them (`Node::asleep_ticks`, `Node::group_status`).
//!
//! Every input to a group goes through [`Node::wake`]; a group is put to sleep only at the end
//! of its tick, never while an input may still follow. Nothing here decides what a replica
//! does.

use std::collections::BTreeSet;

use shoal_engine::storage::Storage;

use super::config::{Clock, Transport};
use super::state::{Group, Node};
use super::status::NodeCounters;
use crate::replica::Replica;

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// Adds `replica` as `group`, awake (its first tick decides whether it sleeps).
    pub(super) fn insert_group(&mut self, group: u64, replica: Replica, failed: Option<String>) {
        let entry = Group { replica, failed, asleep_since_tick: None, wake_at_tick: None };
        self.groups.insert(group, entry);
        self.awake.insert(group);
    }

    /// Removes `group`, asleep or not.
    pub(super) fn remove_group(&mut self, group: u64) {
        if let Some(at) = self.groups.remove(&group).and_then(|entry| entry.wake_at_tick) {
            self.wake_ticks.remove(&(at, group));
        }
        self.awake.remove(&group);
    }

    /// `group`, awake and caught up with the node's ticks, for an input; `None` if the node
    /// does not hold it.
    pub(super) fn wake(&mut self, group: u64) -> Option<&mut Group> {
        let entry = self.groups.get_mut(&group)?;
        let through = self.ticks;
        rouse(group, entry, through, &mut self.counters, &mut self.awake, &mut self.wake_ticks);
        Some(entry)
    }

    /// The ticks `entry`'s replica slept through and has not been handed yet (0 while it
    /// ticks): what the node adds to the replica's figures that grow with time.
    pub(super) fn asleep_ticks(&self, entry: &Group) -> u64 {
        entry.asleep_since_tick.map_or(0, |since| self.ticks - since)
    }

    /// At the start of a node tick: wakes the sleeping groups whose tick does work at this
    /// one, handing them every tick before it, so that they take this one with the others.
    pub(super) fn wake_due(&mut self) {
        while let Some(&(at, group)) = self.wake_ticks.first() {
            if at > self.ticks {
                break;
            }
            assert_eq!(at, self.ticks, "a sleeping group's working tick passed by");
            let entry = self.groups.get_mut(&group).expect("a group with a wake tick is held");
            assert!(entry.asleep_since_tick.is_some(), "a group with a wake tick sleeps");
            // Every tick before this one: it takes this one awake, with the others.
            let through = self.ticks - 1;
            rouse(group, entry, through, &mut self.counters, &mut self.awake, &mut self.wake_ticks);
        }
    }

    /// Puts `group` to sleep after its tick if the next ticks would only count: nothing failed,
    /// no output waits, no repair is wanted or due, and no timer of the replica's fires. It
    /// sleeps until an input, or until the tick at which its own tick works again.
    pub(super) fn sleep_if_idle(&mut self, group: u64) {
        let Some(entry) = self.groups.get_mut(&group) else { return };
        let replica = &entry.replica;
        if !self.config.groups_sleep
            || entry.failed.is_some()
            || replica.has_ready()
            || replica.repair_wanted()
            || replica.repair_in_flight()
        {
            return;
        }
        let ticks = replica.ticks_only_counting();
        if ticks == 0 {
            return;
        }
        entry.asleep_since_tick = Some(self.ticks);
        // Past the ticks that only count comes one that works: the node wakes the group then.
        entry.wake_at_tick = ticks.checked_add(self.ticks + 1);
        if let Some(at) = entry.wake_at_tick {
            self.wake_ticks.insert((at, group));
        }
        self.awake.remove(&group);
    }
}

/// Wakes `group` (`entry`) if it sleeps: hands its replica the ticks it slept through up to node
/// tick `through`, and drops its working tick from `wake_ticks`. The one way out of sleep, for
/// an input and for a working tick alike.
fn rouse(
    group: u64,
    entry: &mut Group,
    through: u64,
    counters: &mut NodeCounters,
    awake: &mut BTreeSet<u64>,
    wake_ticks: &mut BTreeSet<(u64, u64)>,
) {
    let Some(since) = entry.asleep_since_tick.take() else { return };
    entry.replica.skip_ticks(through - since);
    counters.ticks_slept += through - since;
    awake.insert(group);
    if let Some(at) = entry.wake_at_tick.take() {
        wake_ticks.remove(&(at, group));
    }
}
