//! The `shoal` server's library: everything the binary (`main.rs`) runs, in modules a benchmark
//! or test can reach. `config` resolves the configuration; `shard` is one shard's loop; `bus` the replica bus between nodes;
//! `connection` the native protocol; `metadata` the metadata state machine; `metrics` the
//! per-shard counters and the Prometheus page, which `http` serves on shard 0; `logging` the
//! structured log; `lock` the data directory's lock; `signals` the shutdown signals; `alloc` the
//! counting allocator the binary installs. ARCHITECTURE.md maps how they fit.

pub mod alloc;
pub mod balancer;
pub mod bus;
pub mod config;
pub mod connection;
pub mod groups;
pub mod http;
pub mod kafka;
pub mod kafka_groups;
pub mod lock;
pub mod logging;
pub mod metadata;
pub mod metrics;
pub mod node_book;
pub mod offsets;
pub mod ports;
pub mod shard;
pub mod signals;
pub mod vectored;
