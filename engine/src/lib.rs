//! Shoal's storage engine.
//!
//! It owns everything between a prepare and the disk: segment logs with their indexes, the shard
//! journal, the superblock, the in-memory prepare ring and recovery, and the install of a state
//! transfer. The formats it stores (wire header, RecordBatch v2) are `shoal-proto`'s. It never
//! opens a socket, reads a clock or spawns a thread, and knows nothing of quorums: view, op and
//! commit are fields it checks for continuity and checksums only.

pub mod cache;
mod chunk;
pub mod direct;
mod error;
#[cfg(feature = "inspect")]
pub mod inspect;
mod join;
pub mod journal;
pub mod partition;
pub mod ready;
pub mod record;
pub mod ring;
pub mod rng;
mod scan;
pub mod segment;
pub mod shard;
pub mod state;
pub mod storage;
pub mod superblock;
pub mod transfer;

pub use error::{Corruption, Error, Result};
// The shared formats under the crate-local paths the engine's modules use; other crates name
// `shoal-proto` themselves.
use shoal_proto::{checksum, wire};
