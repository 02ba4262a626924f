//! Controlled shutdown (Kafka's; DESIGN.md §8): once the stop flag is set, the shard hands every
//! group its node leads to a peer in sync ([`Node::hand_over_all`](shoal_replication::Node))
//! and keeps its loop running — bus packets, ticks, I/O rounds — until the node is settled
//! (`Node::shutdown_settled`: no hand-over under way, no view change it votes in, nothing led
//! that a peer could take), so a rolling restart stalls no partition for a view-change timeout.
//! A one-node cluster has nobody to hand to and stops at once.
//!
//! It decides nothing in the protocol (the replicas hand over, the node layer picks each
//! target) and never holds the stop back without bound: after three view-change timeouts
//! ([`ShardState::hand_off_time_max`]; 6 s by default) the shard stops with whatever it still
//! leads, whose backups then take over on their own timeouts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::state::ShardState;

/// How often groups the node still leads are handed over again: one given up (its target did
/// not catch up in time), or a view change that came back to this node, needs another.
const RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// A stopping shard's hand-off under way.
pub(super) struct HandOff {
    started: Instant,
    next_retry: Instant,
}

impl ShardState {
    /// Whether the loop goes on: while the stop flag is down, and once it is up, while the
    /// hand-off it then begins is under way (see the module documentation).
    pub(super) fn keep_serving(
        &mut self,
        stop: &AtomicBool,
        hand_off: &mut Option<HandOff>,
    ) -> bool {
        if !stop.load(Ordering::SeqCst) {
            return true;
        }
        if self.config.cluster.nodes.is_empty() {
            return false;
        }
        let now = Instant::now();
        let hand_off = hand_off.get_or_insert_with(|| self.begin_hand_off(now));
        let elapsed_ms = now.duration_since(hand_off.started).as_millis() as u64;
        if self.node.shutdown_settled() {
            tracing::info!(shard = self.index, elapsed_ms, "hand-off complete: stopping");
            return false;
        }
        if now.duration_since(hand_off.started) >= self.hand_off_time_max() {
            let still_led = self.node.groups_led();
            tracing::warn!(
                shard = self.index,
                elapsed_ms,
                groups = still_led.len(),
                ?still_led,
                "hand-off incomplete: stopping anyway (these groups wait for their backups' \
                 timeouts)"
            );
            return false;
        }
        if now >= hand_off.next_retry {
            hand_off.next_retry = now + RETRY_INTERVAL;
            self.node.hand_over_all();
        }
        true
    }

    /// The longest a stopping shard keeps serving to hand its groups over: three view-change
    /// timeouts, room for a hand-over given up and begun again, or one whose view change had
    /// to move on.
    fn hand_off_time_max(&self) -> Duration {
        hand_off_time_max(self.config.replication.view_change_timeout_ms)
    }

    /// Begins handing every group the node leads to a peer in sync.
    fn begin_hand_off(&mut self, now: Instant) -> HandOff {
        let led = self.node.groups_led().len();
        let begun = self.node.hand_over_all();
        tracing::info!(
            shard = self.index,
            groups = led,
            hand_overs = begun,
            "stopping: handing the groups this node leads to peers in sync"
        );
        HandOff { started: now, next_retry: now + RETRY_INTERVAL }
    }
}

fn hand_off_time_max(view_change_timeout_ms: u64) -> Duration {
    Duration::from_millis(3 * view_change_timeout_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ReplicationConfig;

    #[test]
    fn the_hand_off_bound_is_three_view_change_timeouts_six_seconds_by_default() {
        let defaults = ReplicationConfig::default();
        assert_eq!(hand_off_time_max(defaults.view_change_timeout_ms), Duration::from_secs(6));
    }
}
