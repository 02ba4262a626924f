//! The formats every Shoal process shares: the wire header and the replica and client command
//! layouts with their checksums ([`wire`], [`checksum`]), the Kafka RecordBatch v2 batch format
//! ([`batch`]), the native client protocol's bodies ([`protocol`]) and the durability mode's
//! names and bytes ([`durability`]).
//!
//! It performs no I/O and pulls in no runtime: the client library builds on this crate alone, the
//! engine stores these bytes verbatim, and replication sends them. Every decoder here treats its
//! input as hostile (bounded lengths before allocation, checksums before use, no panic on any
//! bytes).

pub mod batch;
pub mod checksum;
pub mod durability;
pub mod protocol;
pub mod wire;

pub use durability::Durability;
