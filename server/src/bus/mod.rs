//! The replica bus (DESIGN.md §8): one TCP connection per (peer node, shard) carrying the replica
//! messages of every group on this shard, opened by the lower node index to the higher one's bus
//! port (the configured base port plus the shard index). Peers are member slots: the founding
//! nodes' addresses come from `[cluster] nodes`, those of nodes added later from the catalog
//! ([`BusAddresses::learn`]); a dialer waits until its peer's address is known.
//!
//! A shard starts its bus before it opens its node, so a restarting node hears StartView while it
//! recovers. Sends never block the shard: [`BusTransport`] puts each packet in a bounded queue per
//! peer that drops and counts when full or when the peer's link is down (VSR retransmits and
//! repairs); a link task per connection writes the
//! queue out and hands each frame it reads to the shard's inbox as `Work::Packet` (dropped and
//! counted when the inbox is full). This module never decodes a replica message: the node layer's
//! codec does; it checks only the handshake and the framing (header checksum and a size bound
//! before the body is read).
//!
//! By job: `identity` is what a handshake states and how two are compared; `transport` the
//! queues; `link` one connection's handshake and frames; `dial` and `accept` how connections
//! are made; `counters` what the metrics show per peer.

mod accept;
mod counters;
mod dial;
mod identity;
mod link;
mod transport;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use bytes::Bytes;

pub use counters::{BusCounters, PeerCounters};
pub use identity::{BusIdentity, Peer};
pub use transport::{BusTransport, QueueBound};

use crate::shard::Work;

/// What a shard's bus needs to start.
pub struct BusSpec {
    /// This shard's identity on the bus.
    pub identity: BusIdentity,
    /// Every node's bus address for this shard, by node index (this node's included), as far as
    /// they are known; the shard adds the nodes the catalog adds.
    pub addresses: BusAddresses,
    /// Packets queued per peer at most; beyond, new ones are dropped and counted.
    pub queue_packets_max: usize,
    /// Bytes queued per peer at most; beyond, new packets are dropped and counted.
    pub queue_bytes_max: u64,
    /// Largest frame (header plus body) accepted from a peer.
    pub frame_size_bytes_max: usize,
    /// Where received packets go: this shard's inbox.
    pub inbox: flume::Sender<Work>,
    /// Set when the node stops: links and dialers end.
    pub stop: Arc<AtomicBool>,
    /// Whether this node holds the cluster's state, as its handshakes say.
    pub formed: Arc<AtomicBool>,
}

/// The bus addresses of one shard's peers by node index (`None`: not known yet), shared by its
/// dialers and the shard, which adds the nodes its catalog adds.
#[derive(Clone, Debug, Default)]
pub struct BusAddresses(Rc<RefCell<Vec<Option<SocketAddr>>>>);

impl BusAddresses {
    /// `slots` unknown addresses.
    pub fn new(slots: u8) -> BusAddresses {
        BusAddresses(Rc::new(RefCell::new(vec![None; usize::from(slots)])))
    }

    /// Node `node`'s address, if known.
    pub fn get(&self, node: u8) -> Option<SocketAddr> {
        self.0.borrow().get(usize::from(node)).copied().flatten()
    }

    /// Records node `node`'s address (a slot past the bus's is ignored: validation keeps node
    /// indices below the slot count).
    pub fn learn(&self, node: u8, address: SocketAddr) {
        if let Some(slot) = self.0.borrow_mut().get_mut(usize::from(node)) {
            *slot = Some(address);
        }
    }
}

/// Binds this shard's bus port (when the cluster has peers) and starts its dialers and
/// acceptor; returns the transport the node sends through and the counters the metrics read.
/// A one-node cluster gets a transport without peers and starts nothing.
pub fn start(spec: BusSpec) -> Result<(BusTransport, Rc<BusCounters>), String> {
    let slots = spec.identity.slots;
    let counters = Rc::new(BusCounters::new(slots));
    let bound = QueueBound { packets_max: spec.queue_packets_max, bytes_max: spec.queue_bytes_max };
    let (transport, queues) = BusTransport::new(spec.identity.node, slots, bound, &counters);
    if slots <= 1 {
        return Ok((transport, counters));
    }
    let node = spec.identity.node;
    for peer in 0..slots {
        counters.peers[usize::from(peer)]
            .known
            .set(peer != node && spec.addresses.get(peer).is_some());
    }
    let Some(own) = spec.addresses.get(node) else {
        return Err(format!("shard {}: node {node} has no bus address", spec.identity.shard));
    };
    let listener = monoio::net::TcpListener::bind(own).map_err(|error| {
        format!("shard {}: cannot listen for peers on {own}: {error}", spec.identity.shard)
    })?;
    let spec = Rc::new(spec);
    // The links of the lower nodes, which dial this one; the higher ones this node dials.
    let mut dialed_by: Vec<Option<Rc<link::Link>>> = vec![None; usize::from(slots)];
    for (peer, queue) in queues.into_iter().enumerate() {
        let Some(queue) = queue else { continue };
        let link = link::Link::new(Rc::clone(&spec), peer as u8, queue, Rc::clone(&counters));
        if peer as u8 > spec.identity.node {
            monoio::spawn(dial::run(link));
        } else {
            dialed_by[peer] = Some(link);
        }
    }
    monoio::spawn(accept::run(Rc::clone(&spec), listener, Rc::clone(&counters), dialed_by));
    Ok((transport, counters))
}

/// A packet received from a peer, for the shard's node.
pub(crate) fn deliver(inbox: &flume::Sender<Work>, from: u8, packet: Bytes) -> bool {
    inbox.try_send(Work::Packet { from, packet }).is_ok()
}
