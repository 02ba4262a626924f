//! Settings the engine's integration tests share.

use shoal_engine::superblock::{Durability, GroupConfig};

/// A group with 1 MiB segments (the smallest allowed, so tests roll) and records of at most
/// `record_size_bytes_max`.
pub fn group_config(durability: Durability, record_size_bytes_max: u32) -> GroupConfig {
    GroupConfig {
        durability,
        segment_size_bytes: 1 << 20,
        record_size_bytes_max,
        ..GroupConfig::default()
    }
}
