//! What a driver hands the node: its settings ([`NodeConfig`]), the [`Transport`] its packets
//! leave by and the [`Clock`] that stamps append times.
//!
//! Contracts only: nothing here sends, reads a clock or holds state; the driver implements them
//! (sockets and the wall clock in `server`, the simulated network and virtual time in the
//! simulator).

use bytes::Bytes;

use crate::config::ReplicaConfig;

/// Sends packets to other nodes (bounded queues, sockets, or the simulated network).
pub trait Transport {
    /// Sends `packet` to node `to`; may drop it (the protocol retransmits).
    fn send(&mut self, to: u8, packet: Bytes);
}

/// The wall clock, for the append time stamped on each prepare.
pub trait Clock {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The node layer's settings.
#[derive(Clone, Copy, Debug)]
pub struct NodeConfig {
    /// This node's index (its replica index in every group).
    pub node: u8,
    /// The template of every group's replica config (`group` and `replica` are set per group).
    pub replica: ReplicaConfig,
    /// Largest packet accepted from a peer.
    pub message_size_bytes_max: usize,
    /// Messages held back for durability at most; beyond, the oldest are dropped (the protocol
    /// retransmits) and counted.
    pub held_messages_max: usize,
    /// New repair rounds the node lets its groups start per tick, all groups together: a shard
    /// with many lagging groups catches them up a few at a time instead of flooding its peers
    /// (and its own intake) at once.
    pub repair_rounds_per_tick_max: usize,
    /// Repair rounds in flight at most, all groups together; bounds the bodies a shard may have
    /// on the way to it for repair (each round asks up to `repair_prepares_max`).
    pub repair_rounds_in_flight_max: usize,
    /// Bytes the node's groups may ask peers for in repair rounds per tick, all groups
    /// together, on average (by what each round asks, as [`Replica::grant_repair`] reports it);
    /// 0: no bound. It keeps a returning node's catch-up from taking the whole disk and bus
    /// its peers (and, on a shared machine, it) serve clients with.
    ///
    /// [`Replica::grant_repair`]: crate::Replica::grant_repair
    pub repair_bytes_per_tick_max: u64,
    /// Prepares peers asked for that wait to be read from the log at most; beyond, requests
    /// are dropped and counted (the asker's round times out and asks again, or elsewhere).
    pub serve_reads_queued_max: usize,
    /// Disk reads for peers in flight at most; the queued requests wait for one to finish.
    /// They run beside the shard's loop, so this bounds the disk and memory a peer's repair
    /// takes from the shard's own clients, not the loop's time.
    pub serve_reads_in_flight_max: usize,
    /// Bytes of prepares one disk read for a peer gathers at most (at least one prepare); the
    /// ops of its run past them are read next.
    pub serve_read_bytes_max: usize,
    /// Groups below this id may have been held — and their ops acknowledged — by this node
    /// before its data directory was lost (it rejoined its cluster with an empty one): their
    /// replicas here never trust their own log over the cluster's. A new one starts
    /// `Recovering` with an empty log instead of normal in view 0, and a restarted one waits for
    /// a peer's StartView however long its probes go unanswered, never starting a view change
    /// itself. 0: the node never rejoined (every group is what its log says).
    pub rejoin_floor: u64,
    /// A group this node leads away from its home (its view-0 primary) is handed back once the
    /// home has been in sync this long, by its acknowledgements (DESIGN.md §8); 0: never.
    pub primary_return_ticks: u64,
    /// Groups whose tick would only count stop ticking until their next input (see the node's
    /// `sleep` module); off, every group ticks every tick. The simulator runs seeds both ways
    /// and requires the same outcome.
    pub groups_sleep: bool,
}

impl NodeConfig {
    /// Node `node` with the replica template `replica` and default bounds.
    pub fn new(node: u8, replica: ReplicaConfig) -> NodeConfig {
        NodeConfig {
            node,
            replica,
            message_size_bytes_max: 1 << 20,
            held_messages_max: 4_096,
            repair_rounds_per_tick_max: 8,
            repair_rounds_in_flight_max: 32,
            repair_bytes_per_tick_max: 0,
            serve_reads_queued_max: 1_024,
            serve_reads_in_flight_max: 8,
            serve_read_bytes_max: 2 << 20,
            rejoin_floor: 0,
            primary_return_ticks: 10_000 / crate::config::TICK_MS,
            groups_sleep: true,
        }
    }
}
