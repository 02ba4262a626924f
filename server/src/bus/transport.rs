//! The node layer's [`Transport`] on the bus: one bounded queue per peer, filled by the shard's
//! node and emptied by that peer's link task. A send never blocks and never allocates beyond the
//! packet itself: a queue full by packets or by bytes, a peer whose link is down, or a node that
//! is not a peer drops the packet and counts it, and VSR retransmits or repairs.
//!
//! Nothing is queued for a peer that is not connected (and its link empties the queue when it
//! goes down): a node that was away for long would otherwise get, when it returns, a backlog of
//! stale messages — and a queue that held every prepare it missed would hide from it what its
//! peers' retention removed since, which it must learn through repair and state transfer.

use std::rc::Rc;

use bytes::Bytes;
use shoal_replication::Transport;

use super::counters::{BusCounters, add};

/// Sends to peers through their queues.
pub struct BusTransport {
    /// By node index; `None` for this node.
    queues: Vec<Option<flume::Sender<Bytes>>>,
    bytes_max: u64,
    counters: Rc<BusCounters>,
}

/// How much one peer's queue holds at most.
#[derive(Clone, Copy, Debug)]
pub struct QueueBound {
    pub packets_max: usize,
    pub bytes_max: u64,
}

impl BusTransport {
    /// The transport of node `node` in a cluster of `slots` member slots, and the receiving end
    /// of each peer's queue (by node index; `None` for this node).
    pub(super) fn new(
        node: u8,
        slots: u8,
        bound: QueueBound,
        counters: &Rc<BusCounters>,
    ) -> (BusTransport, Vec<Option<flume::Receiver<Bytes>>>) {
        let (queues, receivers) = (0..slots)
            .map(|peer| {
                if peer == node {
                    return (None, None);
                }
                let (sender, receiver) = flume::bounded(bound.packets_max);
                (Some(sender), Some(receiver))
            })
            .unzip();
        let transport =
            BusTransport { queues, bytes_max: bound.bytes_max, counters: Rc::clone(counters) };
        (transport, receivers)
    }
}

impl Transport for BusTransport {
    fn send(&mut self, to: u8, packet: Bytes) {
        let Some(Some(queue)) = self.queues.get(to as usize) else { return };
        let peer = &self.counters.peers[to as usize];
        let size = packet.len() as u64;
        let room = peer.queued_bytes.get() + size <= self.bytes_max;
        if !(peer.connected.get() && room) || queue.try_send(packet).is_err() {
            add(&peer.dropped_packets, 1);
            return;
        }
        add(&peer.queued_bytes, size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_and_counts_and_never_blocks() {
        let counters = Rc::new(BusCounters::new(3));
        let bound = QueueBound { packets_max: 2, bytes_max: 1 << 20 };
        let (mut transport, receivers) = BusTransport::new(1, 3, bound, &counters);
        assert!(receivers[1].is_none());
        counters.peers[2].connected.set(true);
        for _ in 0..5 {
            transport.send(2, Bytes::from_static(b"p"));
        }
        transport.send(1, Bytes::from_static(b"to itself"));
        transport.send(9, Bytes::from_static(b"no such node"));
        assert_eq!(receivers[2].as_ref().unwrap().len(), 2);
        assert_eq!(counters.peers[2].dropped_packets.get(), 3);
        assert_eq!(counters.peers[0].dropped_packets.get(), 0);
    }

    #[test]
    fn nothing_is_queued_for_a_peer_whose_link_is_down() {
        let counters = Rc::new(BusCounters::new(3));
        let bound = QueueBound { packets_max: 8, bytes_max: 1 << 20 };
        let (mut transport, receivers) = BusTransport::new(1, 3, bound, &counters);
        transport.send(0, Bytes::from_static(b"p"));
        assert!(receivers[0].as_ref().unwrap().is_empty());
        assert_eq!(counters.peers[0].dropped_packets.get(), 1);
        counters.peers[0].connected.set(true);
        transport.send(0, Bytes::from_static(b"p"));
        assert_eq!(receivers[0].as_ref().unwrap().len(), 1);
    }

    #[test]
    fn a_queue_holds_at_most_its_bytes() {
        let counters = Rc::new(BusCounters::new(2));
        let bound = QueueBound { packets_max: 100, bytes_max: 10 };
        let (mut transport, receivers) = BusTransport::new(0, 2, bound, &counters);
        counters.peers[1].connected.set(true);
        for _ in 0..4 {
            transport.send(1, Bytes::from_static(b"four"));
        }
        assert_eq!(receivers[1].as_ref().unwrap().len(), 2);
        assert_eq!(counters.peers[1].queued_bytes.get(), 8);
        assert_eq!(counters.peers[1].dropped_packets.get(), 2);
    }
}
