//! Where the replicas' outputs go: messages to peers (Commit heartbeats coalesced into one
//! packet per peer node), writes queued for the I/O round with a ticket each, replies and
//! committed ops for the driver, and peers' prepare requests queued for reading.
//!
//! This is the send-after-persist chokepoint: a message the replica may send only once its
//! state is durable (`persisted_messages`) is held here with the newest ticket issued, and
//! leaves only once every write up to that ticket is durable. Nothing here may send such a
//! message earlier, nor drop a held one except the oldest at `held_messages_max` (the protocol
//! retransmits).

use shoal_engine::storage::Storage;
use shoal_proto::wire::CommitEntry;

use super::config::{Clock, Transport};
use super::state::Node;
use crate::codec;
use crate::message::{Committed, Envelope, Message, Reply};

impl<S: Storage, T: Transport, C: Clock> Node<S, T, C> {
    /// Client replies, with their group.
    pub fn take_replies(&mut self) -> Vec<(u64, Reply)> {
        std::mem::take(&mut self.replies)
    }

    /// Committed ops, in order per group.
    pub fn take_committed(&mut self) -> Vec<(u64, Committed)> {
        std::mem::take(&mut self.committed)
    }

    /// Takes a replica's outputs: messages leave now, writes queue with a ticket, messages
    /// that must wait are held until every write issued so far is durable.
    pub(super) fn collect(&mut self, group: u64) {
        let entry = self.groups.get_mut(&group).expect("collect for a held group");
        if !entry.replica.has_ready() {
            return;
        }
        let ready = entry.replica.take_ready();
        for envelope in ready.messages {
            self.send(group, envelope);
        }
        for write in ready.writes {
            self.tickets_issued += 1;
            self.writes.push_back((self.tickets_issued, group, write));
        }
        for envelope in ready.persisted_messages {
            if self.tickets_durable >= self.tickets_issued {
                self.send(group, envelope);
                continue;
            }
            self.counters.messages_held += 1;
            if self.held.len() >= self.config.held_messages_max {
                self.held.pop_front();
                self.counters.held_dropped += 1;
            }
            self.held.push_back((self.tickets_issued, group, envelope));
        }
        for read in ready.reads {
            if self.reads.len() >= self.config.serve_reads_queued_max {
                self.counters.serve_reads_dropped += 1;
                continue;
            }
            self.reads.push_back((group, read));
        }
        if let Some(header) = ready.committed.iter().rev().find_map(Committed::header) {
            // Retention keeps every op not yet committed: a view change may still cut it.
            let fields = header.as_prepare().expect("committed ops are prepares");
            let end_offset = fields.end_offset();
            if let Some(log) = self.store.group_mut(group) {
                log.set_committed_end(end_offset);
            }
        }
        self.committed.extend(ready.committed.into_iter().map(|c| (group, c)));
        self.replies.extend(ready.replies.into_iter().map(|r| (group, r)));
    }

    /// Sends `envelope` of `group` now, or for a Commit, adds it to its peer's heartbeat packet.
    pub(super) fn send(&mut self, group: u64, envelope: Envelope) {
        if let Message::Commit { view, commit, commit_checksum } = envelope.message {
            let entry = CommitEntry { group, commit, commit_checksum, view };
            self.heartbeats.entry(envelope.to).or_default().push(entry);
            return;
        }
        let packet =
            codec::encode(self.config.replica.cluster, envelope.from, group, &envelope.message);
        self.transport.send(envelope.to, packet);
    }

    /// Sends the coalesced heartbeats: one packet per peer node, within the entry bound.
    pub(super) fn send_heartbeats(&mut self) {
        let entries_max = self.store.config().groups_max.max(1);
        for (to, entries) in std::mem::take(&mut self.heartbeats) {
            for chunk in entries.chunks(entries_max) {
                self.counters.heartbeat_packets += 1;
                let packet =
                    codec::encode_commits(self.config.replica.cluster, self.config.node, chunk);
                self.transport.send(to, packet);
            }
        }
    }

    /// Sends the held messages whose ticket is durable, oldest first.
    pub(super) fn release_held(&mut self) {
        while let Some((ticket, _, _)) = self.held.front() {
            if *ticket > self.tickets_durable {
                break;
            }
            let (_, group, envelope) = self.held.pop_front().expect("front");
            self.send(group, envelope);
        }
    }
}
