//! The node layer: one shard's replicas and its storage engine, between the sans-IO replicas
//! and the real world (DESIGN.md §1).
//!
//! It owns the shard's [`ShardStore`](shoal_engine::shard::ShardStore), one
//! [`Replica`](crate::Replica) per group, the writes the replicas asked for and the messages
//! they may send only once those writes are durable. It turns replica outputs into engine calls
//! and packets, feeds completions back, coalesces Commit heartbeats per node pair, and makes
//! every group's view updates pending in one I/O round share one superblock write. It is the
//! single chokepoint that holds a message back until the state it reveals is durable:
//! `persisted_messages` wait here for their ticket. It is generic over storage, transport and
//! clock, so the simulator and `server` run this same code; it never opens a socket, reads a
//! clock or spawns a thread itself.
//!
//! Node `i` is replica `i` of every group (the member list is the node list).
//!
//! By job: `config` is what a driver hands the node (settings, transport, clock); `state` what
//! the node owns; `open` its life (open, create a group, close); `restart` a group's replica
//! restarted on its recovered log; `inputs` packets, ticks and client requests into the
//! replicas; `sleep` which groups tick; `outputs` the replicas' outputs, with the
//! send-after-persist chokepoint; `round` the I/O round that applies their writes; `flush` the
//! flush cycles and checkpoint jobs in flight; `serve` peers' prepare reads; `damage` fail-stop
//! and protocol-aware recovery; `logs` the groups' logs as a driver reads them; `primaries` the
//! deliberate moves of the groups it leads (back home, off a node that shuts down); `status`
//! what the node reports of itself.

mod config;
mod damage;
mod flush;
mod inputs;
mod logs;
mod open;
mod outputs;
mod primaries;
mod restart;
mod round;
mod serve;
mod sleep;
mod state;
mod status;
#[cfg(test)]
mod tests;

pub use config::{Clock, NodeConfig, Transport};
pub use damage::DamageCut;
pub use inputs::RequestRefused;
pub use logs::LogStats;
pub use restart::SavedProducers;
pub use state::Node;
pub use status::NodeCounters;
