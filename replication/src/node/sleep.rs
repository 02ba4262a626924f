//! Which groups tick. A group whose tick would only count (`Replica::tick_only_counts`: a
//! one-replica primary with nothing to finish) sleeps: the node's tick skips it, and the next
//! input first hands it the ticks it slept through (`Replica::skip_ticks`), so it is in the
//! state ticking it every time would have left it in. A single node's 10,000 idle groups then
//! cost its tick nothing.
//!
//! Every input to a group goes through [`Node::wake`]; a group is put to sleep only at the end
//! of its tick, never while an input may still follow. Nothing here decides what a replica
//! does.

use shoal_engine::storage::Storage;

use super::config::{Clock, Transport};
use super::state::{Group, Node};
use crate::replica::Replica;

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// Adds `replica` as `group`, awake (its first tick decides whether it sleeps).
    pub(super) fn insert_group(&mut self, group: u64, replica: Replica, failed: Option<String>) {
        self.groups.insert(group, Group { replica, failed, asleep_since_tick: None });
        self.awake.insert(group);
    }

    /// Removes `group`, asleep or not.
    pub(super) fn remove_group(&mut self, group: u64) {
        self.groups.remove(&group);
        self.awake.remove(&group);
    }

    /// `group`, awake and caught up with the node's ticks, for an input; `None` if the node
    /// does not hold it.
    pub(super) fn wake(&mut self, group: u64) -> Option<&mut Group> {
        let entry = self.groups.get_mut(&group)?;
        if let Some(since) = entry.asleep_since_tick.take() {
            entry.replica.skip_ticks(self.ticks - since);
            self.counters.ticks_slept += self.ticks - since;
            self.awake.insert(group);
        }
        Some(entry)
    }

    /// Puts `group` to sleep after its tick if that tick, and every one after it until an
    /// input, would only count: nothing failed, no output waits, no repair is wanted or due.
    pub(super) fn sleep_if_idle(&mut self, group: u64) {
        let Some(entry) = self.groups.get_mut(&group) else { return };
        let replica = &entry.replica;
        if self.config.groups_sleep
            && entry.failed.is_none()
            && replica.tick_only_counts()
            && !replica.has_ready()
            && !replica.repair_wanted()
            && !replica.repair_in_flight()
        {
            entry.asleep_since_tick = Some(self.ticks);
            self.awake.remove(&group);
        }
    }
}
