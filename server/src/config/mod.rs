//! The server's effective configuration: what the config file, the `SHOAL_*` environment and the
//! command-line flags resolve to, validated once at start-up (`docs/configuration.md` lists every
//! key).
//!
//! It owns the keys (one table per section, which the file, the environment and the flags all go
//! through, so a key has one name, one bound and one env variable), the defaults, the resolution
//! order — built-in defaults, then the file, then `SHOAL_*` variables, then flags, later winning
//! key by key; a `[shard.N]` key beats the same `[shard]` key (and `cpus`) from any layer — and
//! every validation rule. `[cluster]` names the cluster, this node and the founding nodes'
//! addresses (its `nodes` key is a list: an array of tables in the file, a text form elsewhere)
//! and, on a node added later, that node's own (`added_node`). `[shard]` holds two tables of
//! keys: the engine's `ShardConfig` fields and the server's own per-shard `ShardTuning` (ring,
//! SQPOLL, direct I/O, group-commit delay, new partitions' segment age). An error names the key as the user wrote it (`topic_defaults.segment_size_bytes`,
//! `SHOAL_NETWORK_CONNECTIONS_MAX`, `--shards`, `cluster.nodes[1]`, `cluster.added_node.bus`) and
//! the reason.
//!
//! It never reads a file, the environment or the machine's CPU list itself (`main` passes their
//! contents in, so tests drive it with plain strings) and never touches the data directory. A shard
//! receives an already-resolved [`Config`] and never reads a file or the environment itself.
//!
//! By job: `model` is the resolved [`Config`] and its defaults; `keys` the key tables, their
//! scopes and env names, and how each value is read; `args` the command line (parsed by clap) and
//! its completion scripts; `layers` the resolution (file, environment, flags, then defaults and
//! placement); `validate` the rules that tie keys together; `print` the effective configuration
//! as TOML, JSON and gauges; `error` the [`ConfigError`] every step returns.

mod args;
mod error;
mod keys;
mod layers;
mod model;
mod print;
mod validate;

#[cfg(test)]
mod tests;

pub use args::{Args, completion_script, parse_args};
pub use error::ConfigError;
pub use keys::{LOG_LEVELS, NODES_MAX, log_filter};
pub use layers::{Host, Layers, Resolved};
pub use model::{
    ClusterConfig, ClusterNode, Config, GROUP_INITIAL_REBALANCE_DELAY_MS_MAX,
    KAFKA_FETCH_BYTES_MAX, KAFKA_FETCH_BYTES_MIN, LogConfig, MetadataConfig, MetricsConfig,
    NetworkConfig, Profile, ReplicationConfig, SHARDS_MAX, ShardSettings, ShardTuning,
    TopicDefaults,
};
pub use print::shard_settings;
