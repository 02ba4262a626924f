//! What the bus counts, per peer and for the shard's bus port, for the metrics page. Plain cells
//! the shard's own tasks update; nothing here sends or reads.

use std::cell::Cell;

/// One peer's link as the metrics see it.
#[derive(Debug, Default)]
pub struct PeerCounters {
    /// The peer is a node of the cluster: its address is known, or it connected. The metrics
    /// show known peers only (a cluster has 32 slots, most of them unused).
    pub known: Cell<bool>,
    /// A handshaken connection is up.
    pub connected: Cell<bool>,
    /// Connections established after the first (the link went down and came back).
    pub reconnects: Cell<u64>,
    /// Established at least once (so the next one is a reconnect).
    pub(super) ever_connected: Cell<bool>,
    pub sent_bytes: Cell<u64>,
    pub sent_packets: Cell<u64>,
    pub received_bytes: Cell<u64>,
    pub received_packets: Cell<u64>,
    /// Packets dropped: the peer's send queue was full or its link down, or the shard's inbox
    /// was full.
    pub dropped_packets: Cell<u64>,
    /// Bytes of packets in the peer's send queue now.
    pub queued_bytes: Cell<u64>,
    /// Whether the peer held the cluster's state at its last handshake (`None`: no handshake
    /// yet). Not a metric: a node with an empty data directory decides by it whether it forms
    /// a new cluster or rejoins one.
    pub formed: Cell<Option<bool>>,
}

/// The bus counters of one shard.
#[derive(Debug)]
pub struct BusCounters {
    /// By node index (this node's entry stays zero).
    pub peers: Vec<PeerCounters>,
    /// Connections to the bus port closed before or at the handshake: unreadable bytes, a
    /// refused identity, or no handshake in time.
    pub connections_refused: Cell<u64>,
    /// Frames that failed the header checks on an established link (the link is closed).
    pub frames_rejected: Cell<u64>,
}

impl BusCounters {
    pub fn new(slots: u8) -> BusCounters {
        BusCounters {
            peers: (0..slots).map(|_| PeerCounters::default()).collect(),
            connections_refused: Cell::new(0),
            frames_rejected: Cell::new(0),
        }
    }
}

/// Adds `n` to a counter.
pub(super) fn add(cell: &Cell<u64>, n: u64) {
    cell.set(cell.get() + n);
}
