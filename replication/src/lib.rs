//! Viewstamped Replication for Shoal: the sans-IO replica state machine, the shard's node layer
//! and (behind the test-only `simulator` feature, never in the shipped server) the deterministic
//! cluster simulator.
//!
//! Nothing here opens a socket or a file, reads a clock or spawns a thread: time arrives as
//! ticks, randomness from a seeded PRNG, and I/O through the node layer's storage and transport.

#![forbid(unsafe_code)]

mod client_table;
pub mod codec;
mod config;
mod lag;
mod message;
mod node;
mod producers;
mod replica;
#[cfg(feature = "simulator")]
pub mod simulator;
mod transfer;

pub use client_table::{
    ClientCheck, ClientLimits, ClientSnapshotError, ClientTable, ClientTableError,
};
pub use config::{
    EPOCH_MAX, EPOCH_VIEW_BITS, Membership, ReplicaConfig, TICK_MS, epoch_of, first_view_of,
};
pub use lag::{GroupStatus, ReplicaProgress, ReplicaState};
pub use message::{
    Committed, Envelope, FLAG_NACK, FLAG_PRESENT, Message, Persisted, Ready, Reply, ReplyResult,
    Request, ServePrepare, Write,
};
pub use node::{
    Clock, DamageCut, LogStats, Node, NodeConfig, NodeCounters, RequestRefused, SavedProducers,
    Transport,
};
pub use producers::{
    BatchRecord, Check, PRODUCER_BATCHES_MAX, ProducerBatch, ProducerLimits, ProducerState,
    ProducerTable, SnapshotError,
};
pub use replica::{HandOverRefused, RecoveredLog, Replica, ReplicaCounters, Status};
pub use transfer::{decode_transfer_state, encode_transfer_state};
