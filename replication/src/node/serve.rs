//! Serving peers' prepare requests (repair, state catch-up) from the log: from the prepare ring
//! at once when it still holds the op, else by a disk read that runs beside the shard's loop
//! (a job polled with the flush cycles) and is sent when it finishes; an op retention removed
//! is answered with `RangeEvicted`.
//!
//! A run of consecutive ops one peer asked for is read by one scan. Disk reads in flight are
//! bounded in number and size, so a peer's repair never holds the shard's loop nor its memory.
//! A read that failed is never taken for "absent" (nothing is sent; the asker asks again), and
//! damage it finds is never served around: the group is reopened at the next round's end. A
//! read in flight is dropped before its group's log is rewritten (truncated, replaced by a
//! transfer, reopened), so it never scans bytes changing under it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use shoal_engine::Error as EngineError;
use shoal_engine::partition::{DiskReadDone, ReadPlan};
use shoal_engine::ring::StoredPrepare;
use shoal_engine::storage::Storage;

use super::config::{Clock, Transport};
use super::state::Node;
use crate::message::{Envelope, Message, ServePrepare};

/// Ops one disk read for a peer gathers at most: a repair round's worth.
const SERVE_RUN_OPS_MAX: usize = 128;

/// A run of consecutive ops one peer asked for.
struct Asked {
    group: u64,
    to: u8,
    /// The first op asked for; the run's ops follow it.
    op: u64,
    /// Per op of the run, the checksum the peer named.
    checksums: Vec<Option<u32>>,
}

/// A disk read for a peer, in flight.
pub(super) struct PeerRead {
    asked: Asked,
    run: Pin<Box<dyn Future<Output = DiskReadDone>>>,
}

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// Disk reads for peers in flight.
    pub fn peer_reads_in_flight(&self) -> usize {
        self.peer_reads.len()
    }

    /// Serves the queued prepare requests of peers, in order, while fewer than
    /// `serve_reads_in_flight_max` disk reads are in flight: ring hits are sent at once, the
    /// rest start disk reads that [`Node::wait_io`] completes. The driver calls it after
    /// handing the node its input (an I/O round does too).
    pub fn serve_reads(&mut self) {
        while self.peer_reads.len() < self.config.serve_reads_in_flight_max {
            let Some((group, first)) = self.reads.pop_front() else { break };
            let Some(log) = self.store.group(group) else { continue };
            let op_min = log.first_op();
            if first.op < op_min {
                // Retention removed it: say so, so the asker looks elsewhere at once.
                let view = self.groups.get(&group).map_or(0, |g| g.replica.view());
                let message = Message::RangeEvicted { view, op: first.op, op_min };
                let envelope = Envelope { from: self.config.node, to: first.to, message };
                self.counters.ranges_evicted_sent += 1;
                self.send(group, envelope);
                continue;
            }
            let mut checksums = vec![first.checksum];
            while checksums.len() < SERVE_RUN_OPS_MAX
                && let Some((next_group, next)) = self.reads.front()
                && *next_group == group
                && next.to == first.to
                && next.op == first.op + checksums.len() as u64
            {
                checksums.push(next.checksum);
                self.reads.pop_front();
            }
            let prepares_max = checksums.len();
            let plan = log.plan_read_ops(first.op, prepares_max, self.config.serve_read_bytes_max);
            let asked = Asked { group, to: first.to, op: first.op, checksums };
            match plan {
                Ok(ReadPlan::Done(found)) => self.send_served(asked, found, true),
                Ok(ReadPlan::Disk(disk)) => {
                    self.counters.serve_disk_reads += 1;
                    self.peer_reads.push(PeerRead { asked, run: Box::pin(disk.run()) });
                }
                Err(error) => self.read_failed(group, error),
            }
        }
    }

    /// Polls the disk reads in flight and sends what those that finished found; true when one
    /// finished (the queue may then start more).
    pub(super) fn poll_peer_reads(&mut self, cx: &mut Context<'_>) -> bool {
        let mut finished = false;
        let mut index = 0;
        while index < self.peer_reads.len() {
            let Poll::Ready(done) = self.peer_reads[index].run.as_mut().poll(cx) else {
                index += 1;
                continue;
            };
            let asked = self.peer_reads.swap_remove(index).asked;
            finished = true;
            let Some(log) = self.store.group_mut(asked.group) else { continue };
            match log.finish_read(done) {
                Ok(found) => self.send_served(asked, found, false),
                Err(error) => self.read_failed(asked.group, error),
            }
        }
        finished
    }

    /// Drops `group`'s disk reads in flight: its log is about to be rewritten. Their peers'
    /// rounds time out and ask again.
    pub(super) fn drop_peer_reads(&mut self, group: u64) {
        self.peer_reads.retain(|read| read.asked.group != group);
    }

    /// Drops what `group`'s replica queued (writes, messages held for them, peers' reads and
    /// the disk reads serving them): the replica is about to be replaced or deleted.
    pub(super) fn forget_queued(&mut self, group: u64) {
        self.writes.retain(|(_, g, _)| *g != group);
        self.held.retain(|(_, g, _)| *g != group);
        self.reads.retain(|(g, _)| *g != group);
        self.drop_peer_reads(group);
    }

    /// Sends the prepares a read found, each whose checksum is the one asked for; ops of the
    /// run it did not reach (its bytes bound) go back to the front of the queue, in order.
    fn send_served(&mut self, read: Asked, found: Vec<StoredPrepare>, from_ring: bool) {
        let mut next = read.op;
        for stored in found {
            let op = stored.header.as_prepare().map_or(0, |p| p.op);
            let Some(index) = op.checked_sub(read.op).map(|i| i as usize) else { continue };
            let Some(&asked) = read.checksums.get(index) else { continue };
            next = op + 1;
            if asked.is_some_and(|c| c != stored.header.checksum_header) {
                continue;
            }
            if from_ring {
                self.counters.prepares_served_from_ring += 1;
            } else {
                self.counters.prepares_served_from_disk += 1;
            }
            // A stored record is header and body exactly: the Prepare message itself.
            self.transport.send(read.to, stored.record);
        }
        // Nothing found: the ops are not in the log (cut by a truncation since): dropped.
        if next == read.op {
            return;
        }
        let reached = (next - read.op) as usize;
        for (index, &checksum) in read.checksums.iter().enumerate().skip(reached).rev() {
            let op = read.op + index as u64;
            self.reads.push_front((read.group, ServePrepare { to: read.to, op, checksum }));
        }
    }

    /// A read that failed is never taken for "absent": nothing is sent, and the asker's round
    /// times out and asks again (or another peer). Damage stopped the log, and the group is
    /// reopened at the end of the next round.
    fn read_failed(&mut self, group: u64, error: EngineError) {
        if matches!(error, EngineError::Corruption(_))
            && !self.damaged.iter().any(|(g, _)| *g == group)
        {
            self.damaged.push((group, error.to_string()));
        }
    }
}
