//! Serving peers' prepare requests (repair, state catch-up) from the log at the end of each I/O
//! round: from the prepare ring when it still holds the op, else from segment files; an op
//! retention removed is answered with `RangeEvicted`.
//!
//! A read that failed is never taken for "absent" (nothing is sent; the asker asks again), and
//! damage it finds is never served around: the group is reopened at the round's end.

use shoal_engine::Error as EngineError;
use shoal_engine::storage::Storage;

use super::config::{Clock, Transport};
use super::state::Node;
use crate::message::{Envelope, Message};

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// Whether peers' prepare requests wait to be served (a round serves a bounded share).
    pub fn reads_waiting(&self) -> bool {
        !self.reads.is_empty()
    }

    /// Serves the queued prepare requests of peers, in order, up to
    /// `serve_disk_bytes_per_round_max` read from segment files: the rest wait for the next
    /// round, so the shard's loop is never held for a whole repair round's reads.
    pub(super) async fn serve_reads(&mut self) {
        let mut disk_bytes = 0;
        while disk_bytes < self.config.serve_disk_bytes_per_round_max {
            let Some((group, read)) = self.reads.pop_front() else { break };
            let Some(log) = self.store.group_mut(group) else { continue };
            let op_min = log.first_op();
            if read.op < op_min {
                // Retention removed it: say so, so the asker looks elsewhere at once.
                let view = self.groups.get(&group).map_or(0, |g| g.replica.view());
                let message = Message::RangeEvicted { view, op: read.op, op_min };
                let envelope = Envelope { from: self.config.node, to: read.to, message };
                self.counters.ranges_evicted_sent += 1;
                self.send(group, envelope);
                continue;
            }
            let from_ring = log.ring().by_op(read.op).is_some();
            let stored = match log.read_op(read.op).await {
                Ok(Some(stored)) => stored,
                Ok(None) => continue,
                // A read that failed is never taken for "absent": nothing is sent, and the
                // asker's round times out and asks again (or another peer).
                Err(error) if !matches!(error, EngineError::Corruption(_)) => continue,
                // Damage: the log stopped itself, and the group is reopened at the end of the
                // round.
                Err(error) => {
                    if !self.damaged.iter().any(|(g, _)| *g == group) {
                        self.damaged.push((group, error.to_string()));
                    }
                    continue;
                }
            };
            if read.checksum.is_some_and(|c| c != stored.header.checksum_header) {
                continue;
            }
            if from_ring {
                self.counters.prepares_served_from_ring += 1;
            } else {
                self.counters.prepares_served_from_disk += 1;
                disk_bytes += stored.record.len();
            }
            // A stored record is header and body exactly: the Prepare message itself.
            self.transport.send(read.to, stored.record.clone());
        }
    }
}
