//! Shoal's storage engine.
//!
//! It owns everything between a prepare and the disk: the wire header every other crate shares,
//! the Kafka RecordBatch v2 format, segment logs with their indexes, the shard journal, the
//! superblock, the in-memory prepare ring and recovery, the install of a state transfer, and the
//! native protocol's bodies (shared by the server and the client library). It never opens a
//! socket, reads a clock or spawns a thread, and knows nothing of quorums: view, op and commit
//! are fields it checks for continuity and checksums only.

pub mod batch;
pub mod checksum;
mod chunk;
mod error;
pub mod inspect;
mod join;
pub mod journal;
pub mod partition;
pub mod protocol;
pub mod record;
pub mod ring;
mod scan;
pub mod segment;
pub mod shard;
pub mod state;
pub mod storage;
pub mod superblock;
pub mod transfer;
pub mod wire;

pub use error::{Corruption, Error, Result};
