//! The keys: one table per section (name, bounds, field), the scope each lives in, the
//! `SHOAL_*` variable that names it, and how a value is read from the file (typed) or from the
//! environment and the command line (text). The file, the environment and the flags all go
//! through these tables, so a key has one name, one bound and one env variable.
//!
//! A value is checked against its own key's bounds here; rules between keys are `validate`'s.

use std::net::SocketAddr;

use shoal_engine::direct::PersistedPath;
use shoal_engine::ring::RingLimits;
use shoal_engine::shard::ShardConfig;
use shoal_engine::storage::BLOCK_SIZE_BYTES;
use shoal_engine::superblock::{SEGMENT_SIZE_BYTES_MAX, SEGMENT_SIZE_BYTES_MIN};
use shoal_proto::protocol::TOPIC_PARTITIONS_MAX;
use shoal_proto::wire::HEADER_SIZE;

use super::error::ConfigError;
use super::model::{
    ClusterConfig, ClusterNode, MetadataConfig, NetworkConfig, ReplicationConfig, ShardTuning,
    TopicDefaults,
};

/// Nodes a cluster has at most: the replica core's bound on a group's replicas
/// (`ReplicaConfig::validate`), since every node holds a replica of every group.
pub const NODES_MAX: usize = 32;

/// Longest rack name, in bytes.
pub(super) const RACK_SIZE_BYTES_MAX: usize = 64;

/// Largest CPU id a shard may be pinned to.
pub(super) const CPU_ID_MAX: u64 = 65_535;

/// Largest value a TOML integer holds, so every bound (and every printed value) fits one.
pub(super) const TOML_INT_MAX: u64 = i64::MAX as u64;

/// The wire header in front of every record and every frame.
pub(super) const HEADER_SIZE_BYTES: u64 = HEADER_SIZE as u64;

// Sizes are read as u64 and stored in the engine's usize fields; the server only runs on 64-bit
// Linux (io_uring), where that never truncates.
const _: () = assert!(usize::BITS == 64);

/// The levels a log directive may name, from quietest to loudest.
pub const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Checks a log filter and returns it normalised (levels lower-cased, spaces around directives
/// removed): comma-separated directives, each a level (the default for every target; at most one)
/// or `TARGET=LEVEL`, where a target is a Rust module path (`shoal_server::shard`). Stricter than
/// `tracing-subscriber`'s own parser on purpose: there a misspelt level silently becomes a target
/// name and the log goes quiet.
pub fn log_filter(text: &str) -> Result<String, String> {
    let level = |word: &str| {
        let lower = word.trim().to_ascii_lowercase();
        LOG_LEVELS.contains(&lower.as_str()).then_some(lower).ok_or_else(|| {
            format!(
                "{text:?}: {word:?} is not a level (use off, error, warn, info, debug or trace)"
            )
        })
    };
    let mut directives = Vec::new();
    let mut default_given = false;
    for directive in text.split(',') {
        let directive = directive.trim();
        match directive.split_once('=') {
            None => {
                if default_given {
                    return Err(format!("{text:?} gives two default levels"));
                }
                default_given = true;
                directives.push(level(directive)?);
            }
            Some((target, value)) => {
                let target = target.trim();
                let valid = !target.is_empty()
                    && target.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':');
                if !valid {
                    return Err(format!(
                        "{text:?}: {target:?} is not a target (a module path such as \
                         shoal_server::shard)"
                    ));
                }
                directives.push(format!("{target}={}", level(value)?));
            }
        }
    }
    Ok(directives.join(","))
}

/// Where a key lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Scope {
    /// The top level or `[server]`.
    Server,
    Cluster,
    Network,
    Metrics,
    Kafka,
    Log,
    Metadata,
    Replication,
    TopicDefaults,
    /// `[shard]`: every shard's defaults.
    Shard,
    /// `[shard.N]`.
    ShardN(u32),
}

impl Scope {
    /// The key's name in the file.
    pub(super) fn dotted(self, name: &str) -> String {
        match self {
            Scope::Server => name.to_string(),
            Scope::Cluster => format!("cluster.{name}"),
            Scope::Network => format!("network.{name}"),
            Scope::Metrics => format!("metrics.{name}"),
            Scope::Kafka => format!("kafka.{name}"),
            Scope::Log => format!("log.{name}"),
            Scope::Metadata => format!("metadata.{name}"),
            Scope::Replication => format!("replication.{name}"),
            Scope::TopicDefaults => format!("topic_defaults.{name}"),
            Scope::Shard => format!("shard.{name}"),
            Scope::ShardN(index) => format!("shard.{index}.{name}"),
        }
    }

    /// The integer key `name` of this scope: its static name and bounds.
    pub(super) fn int_key(self, name: &str) -> Option<(&'static str, u64, u64)> {
        fn find<T>(keys: &[IntKey<T>], name: &str) -> Option<(&'static str, u64, u64)> {
            keys.iter().find(|key| key.name == name).map(|key| (key.name, key.min, key.max))
        }
        match self {
            Scope::Server | Scope::Metrics | Scope::Kafka | Scope::Log => None,
            Scope::Cluster => find(&CLUSTER_KEYS, name),
            Scope::Network => find(&NETWORK_KEYS, name),
            Scope::Metadata => find(&METADATA_KEYS, name),
            Scope::Replication => find(&REPLICATION_KEYS, name),
            Scope::TopicDefaults => find(&TOPIC_KEYS, name),
            Scope::Shard | Scope::ShardN(_) if is_bool_key(name) || key_words(name).is_some() => {
                None
            }
            Scope::Shard | Scope::ShardN(_) => {
                find(&STORAGE_KEYS, name).or_else(|| find(&TUNING_KEYS, name))
            }
        }
    }
}

/// The top-level (or `[server]`) keys; all are strings but `shards`.
pub(super) const SERVER_KEYS: [&str; 5] =
    ["data_dir", "native_listen", "shards", "profile", "cpus"];

/// The keys of `[kafka]`.
pub(super) const KAFKA_KEYS: [&str; 5] = [
    "listen",
    "stream",
    "group_initial_rebalance_delay_ms",
    "auto_create_topics",
    "fetch_bytes_max",
];

/// The section and key a `SHOAL_*` variable names.
pub(super) fn env_key(var: &str) -> Option<(Scope, &'static str)> {
    let suffix = var.strip_prefix("SHOAL_")?;
    let matches = |prefix: &str, name: &str| {
        suffix.strip_prefix(prefix).is_some_and(|rest| rest == name.to_ascii_uppercase())
    };
    if let Some(&name) = SERVER_KEYS.iter().find(|&&name| matches("", name)) {
        return Some((Scope::Server, name));
    }
    if let Some(key) = CLUSTER_KEYS.iter().find(|key| matches("CLUSTER_", key.name)) {
        return Some((Scope::Cluster, key.name));
    }
    if matches("CLUSTER_", "nodes") {
        return Some((Scope::Cluster, "nodes"));
    }
    if matches("CLUSTER_", "added_node") {
        return Some((Scope::Cluster, "added_node"));
    }
    if let Some(key) = NETWORK_KEYS.iter().find(|key| matches("NETWORK_", key.name)) {
        return Some((Scope::Network, key.name));
    }
    if matches("NETWORK_", "shard_listen") {
        return Some((Scope::Network, "shard_listen"));
    }
    if matches("METRICS_", "listen") {
        return Some((Scope::Metrics, "listen"));
    }
    if let Some(&name) = KAFKA_KEYS.iter().find(|&&name| matches("KAFKA_", name)) {
        return Some((Scope::Kafka, name));
    }
    // The one variable outside the SHOAL_<SECTION>_<KEY> rule: SHOAL_LOG, like RUST_LOG.
    if suffix == "LOG" {
        return Some((Scope::Log, "level"));
    }
    if let Some(key) = METADATA_KEYS.iter().find(|key| matches("METADATA_", key.name)) {
        return Some((Scope::Metadata, key.name));
    }
    if let Some(key) = REPLICATION_KEYS.iter().find(|key| matches("REPLICATION_", key.name)) {
        return Some((Scope::Replication, key.name));
    }
    if matches("TOPIC_DEFAULTS_", "durability") {
        return Some((Scope::TopicDefaults, "durability"));
    }
    if let Some(key) = TOPIC_KEYS.iter().find(|key| matches("TOPIC_DEFAULTS_", key.name)) {
        return Some((Scope::TopicDefaults, key.name));
    }
    if let Some(key) = STORAGE_KEYS.iter().find(|key| matches("SHARD_", key.name)) {
        return Some((Scope::Shard, key.name));
    }
    TUNING_KEYS.iter().find(|key| matches("SHARD_", key.name)).map(|key| (Scope::Shard, key.name))
}

/// The index of a `[shard.N]` table: a plain decimal number (no sign, no leading zero).
pub(super) fn shard_index(key: &str) -> Option<u32> {
    key.parse::<u32>().ok().filter(|index| index.to_string() == key)
}

/// A value as some layer wrote it: typed in the file, text in the environment and on the command
/// line.
#[derive(Clone, Copy, Debug)]
pub(super) enum Raw<'a> {
    Toml(&'a toml::Value),
    Text(&'a str),
}

impl<'a> Raw<'a> {
    /// A listen address, `IP:PORT`, or `off` (None); `example` shows the form in the error.
    pub(super) fn listen_or_off(self, example: &str) -> Result<Option<SocketAddr>, String> {
        let text = self.text()?;
        if text == "off" {
            return Ok(None);
        }
        text.parse().map(Some).map_err(|_| {
            format!("{text:?} is not an IP address and port, e.g. {example}, or \"off\"")
        })
    }

    pub(super) fn text(self) -> Result<&'a str, String> {
        match self {
            Raw::Toml(toml::Value::String(text)) => Ok(text),
            Raw::Text(text) => Ok(text),
            Raw::Toml(other) => Err(format!("expected a string, found a {}", other.type_str())),
        }
    }

    /// `true` or `false` (a TOML boolean in the file, the word elsewhere).
    pub(super) fn bool(self) -> Result<bool, String> {
        match self {
            Raw::Toml(toml::Value::Boolean(value)) => Ok(*value),
            Raw::Toml(other) => {
                Err(format!("expected true or false, found a {}", other.type_str()))
            }
            Raw::Text("true") => Ok(true),
            Raw::Text("false") => Ok(false),
            Raw::Text(text) => Err(format!("{text:?}: use true or false")),
        }
    }

    /// An integer within `min..=max`.
    pub(super) fn int(self, min: u64, max: u64) -> Result<u64, String> {
        let value = match self {
            Raw::Toml(toml::Value::Integer(value)) => u64::try_from(*value)
                .map_err(|_| format!("{value} is negative: use {min} to {max}"))?,
            Raw::Toml(other) => {
                return Err(format!("expected an integer, found a {}", other.type_str()));
            }
            Raw::Text(text) => text
                .parse()
                .map_err(|_| format!("{text:?} is not a non-negative decimal integer"))?,
        };
        if !(min..=max).contains(&value) {
            return Err(format!("{value} is outside {min}..={max}"));
        }
        Ok(value)
    }
}

/// `cpus`: one CPU per shard, or none pinned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Placement {
    Unpinned,
    Cpus(Vec<usize>),
}

impl Placement {
    pub(super) fn parse(text: &str) -> Result<Placement, String> {
        if text == "none" {
            return Ok(Placement::Unpinned);
        }
        text.split(',')
            .map(|cpu| {
                cpu.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|&cpu| cpu <= CPU_ID_MAX)
                    .map(|cpu| cpu as usize)
                    .ok_or_else(|| {
                        format!(
                            "{text:?}: give a comma-separated CPU list (ids 0 to {CPU_ID_MAX}) \
                             or none"
                        )
                    })
            })
            .collect::<Result<_, _>>()
            .map(Placement::Cpus)
    }
}

/// An integer key of a section whose values live in one struct `T`: its name, bounds, and how
/// to read and write it.
pub(super) struct IntKey<T> {
    pub(super) name: &'static str,
    pub(super) min: u64,
    pub(super) max: u64,
    pub(super) get: fn(&T) -> u64,
    pub(super) set: fn(&mut T, u64),
}

/// `[cluster]` but `nodes` (a list) and `added_node` (one node).
pub(super) const CLUSTER_KEYS: [IntKey<ClusterConfig>; 3] = [
    IntKey { name: "id", min: 1, max: TOML_INT_MAX, get: |c| c.id, set: |c, v| c.id = v },
    IntKey {
        name: "node",
        min: 0,
        max: NODES_MAX as u64 - 1,
        get: |c| u64::from(c.node),
        set: |c, v| c.node = v as u8,
    },
    IntKey {
        name: "balancer_interval_ms",
        min: 0,
        max: 86_400_000,
        get: |c| c.balancer_interval_ms,
        set: |c, v| c.balancer_interval_ms = v,
    },
];

/// `[replication]`: the replicas' timers, in milliseconds (the replicas count 10 ms ticks, so
/// each is at least one tick).
pub(super) const REPLICATION_KEYS: [IntKey<ReplicationConfig>; 14] = [
    IntKey {
        name: "commit_interval_ms",
        min: 10,
        max: 60_000,
        get: |c| c.commit_interval_ms,
        set: |c, v| c.commit_interval_ms = v,
    },
    IntKey {
        name: "idle_heartbeat_interval_ms",
        min: 0,
        max: 600_000,
        get: |c| c.idle_heartbeat_interval_ms,
        set: |c, v| c.idle_heartbeat_interval_ms = v,
    },
    IntKey {
        name: "heartbeat_timeout_ms",
        min: 20,
        max: 600_000,
        get: |c| c.heartbeat_timeout_ms,
        set: |c, v| c.heartbeat_timeout_ms = v,
    },
    IntKey {
        name: "view_change_timeout_ms",
        min: 20,
        max: 600_000,
        get: |c| c.view_change_timeout_ms,
        set: |c, v| c.view_change_timeout_ms = v,
    },
    IntKey {
        name: "start_view_probe_interval_ms",
        min: 10,
        max: 60_000,
        get: |c| c.start_view_probe_interval_ms,
        set: |c, v| c.start_view_probe_interval_ms = v,
    },
    IntKey {
        name: "replica_lag_time_max_ms",
        min: 10,
        max: 3_600_000,
        get: |c| c.replica_lag_time_max_ms,
        set: |c, v| c.replica_lag_time_max_ms = v,
    },
    IntKey {
        name: "primary_return_ms",
        min: 0,
        max: 3_600_000,
        get: |c| c.primary_return_ms,
        set: |c, v| c.primary_return_ms = v,
    },
    IntKey {
        name: "repair_prepares_max",
        min: 1,
        max: 4096,
        get: |c| c.repair_prepares_max,
        set: |c, v| c.repair_prepares_max = v,
    },
    IntKey {
        name: "repair_bytes_max",
        min: 4096,
        max: 1 << 33,
        get: |c| c.repair_bytes_max,
        set: |c, v| c.repair_bytes_max = v,
    },
    IntKey {
        name: "repair_rounds_per_tick_max",
        min: 1,
        max: 4096,
        get: |c| c.repair_rounds_per_tick_max,
        set: |c, v| c.repair_rounds_per_tick_max = v,
    },
    IntKey {
        name: "repair_rounds_in_flight_max",
        min: 1,
        max: 65_536,
        get: |c| c.repair_rounds_in_flight_max,
        set: |c, v| c.repair_rounds_in_flight_max = v,
    },
    IntKey {
        name: "repair_bytes_per_second_max",
        min: 0,
        max: 1 << 40,
        get: |c| c.repair_bytes_per_second_max,
        set: |c, v| c.repair_bytes_per_second_max = v,
    },
    IntKey {
        name: "serve_reads_in_flight_max",
        min: 1,
        max: 1024,
        get: |c| c.serve_reads_in_flight_max,
        set: |c, v| c.serve_reads_in_flight_max = v,
    },
    IntKey {
        name: "serve_read_bytes_max",
        min: 4096,
        max: 1 << 33,
        get: |c| c.serve_read_bytes_max,
        set: |c, v| c.serve_read_bytes_max = v,
    },
];

/// `[metadata]`.
pub(super) const METADATA_KEYS: [IntKey<MetadataConfig>; 5] = [
    IntKey {
        name: "snapshot_interval_ops",
        min: 1,
        max: 1 << 32,
        get: |c| c.snapshot_interval_ops,
        set: |c, v| c.snapshot_interval_ops = v,
    },
    IntKey {
        name: "sessions_max",
        min: 1,
        max: 1 << 20,
        get: |c| c.sessions_max as u64,
        set: |c, v| c.sessions_max = v as usize,
    },
    IntKey {
        name: "topic_partitions_max",
        min: 1,
        max: TOPIC_PARTITIONS_MAX as u64,
        get: |c| u64::from(c.topic_partitions_max),
        set: |c, v| c.topic_partitions_max = v as u32,
    },
    IntKey {
        name: "retention_bytes",
        min: 0,
        max: 1 << 50,
        get: |c| c.retention_bytes,
        set: |c, v| c.retention_bytes = v,
    },
    IntKey {
        name: "segment_size_bytes",
        min: shoal_engine::superblock::SEGMENT_SIZE_BYTES_MIN,
        max: 1 << 30,
        get: |c| c.segment_size_bytes,
        set: |c, v| c.segment_size_bytes = v,
    },
];

/// `[network]`.
pub(super) const NETWORK_KEYS: [IntKey<NetworkConfig>; 9] = [
    IntKey {
        name: "connections_max",
        min: 1,
        max: 1 << 20,
        get: |c| c.connections_max as u64,
        set: |c, v| c.connections_max = v as usize,
    },
    IntKey {
        name: "frame_size_bytes_max",
        min: 4096,
        max: 1 << 30,
        get: |c| c.frame_size_bytes_max as u64,
        set: |c, v| c.frame_size_bytes_max = v as usize,
    },
    IntKey {
        name: "requests_in_flight_max",
        min: 1,
        max: 1 << 16,
        get: |c| c.requests_in_flight_max as u64,
        set: |c, v| c.requests_in_flight_max = v as usize,
    },
    IntKey {
        name: "shard_inbox_max",
        min: 1,
        max: 1 << 24,
        get: |c| c.shard_inbox_max as u64,
        set: |c, v| c.shard_inbox_max = v as usize,
    },
    IntKey {
        name: "fetch_wait_ms_max",
        min: 0,
        max: 600_000,
        get: |c| u64::from(c.fetch_wait_ms_max),
        set: |c, v| c.fetch_wait_ms_max = v as u32,
    },
    IntKey {
        name: "idle_timeout_ms",
        min: 0,
        max: 86_400_000,
        get: |c| u64::from(c.idle_timeout_ms),
        set: |c, v| c.idle_timeout_ms = v as u32,
    },
    IntKey {
        name: "fetch_parked_max",
        min: 1,
        max: 1 << 20,
        get: |c| c.fetch_parked_max as u64,
        set: |c, v| c.fetch_parked_max = v as usize,
    },
    IntKey {
        name: "bus_queue_packets_max",
        min: 1,
        max: 1 << 20,
        get: |c| c.bus_queue_packets_max as u64,
        set: |c, v| c.bus_queue_packets_max = v as usize,
    },
    IntKey {
        name: "bus_queue_bytes_max",
        min: 1 << 20,
        max: 1 << 34,
        get: |c| c.bus_queue_bytes_max,
        set: |c, v| c.bus_queue_bytes_max = v,
    },
];

/// `[topic_defaults]` but `durability` (a string).
pub(super) const TOPIC_KEYS: [IntKey<TopicDefaults>; 5] = [
    IntKey {
        name: "partitions",
        min: 1,
        max: 1 << 16,
        get: |t| u64::from(t.partitions),
        set: |t, v| t.partitions = v as u32,
    },
    IntKey {
        name: "segment_size_bytes",
        min: SEGMENT_SIZE_BYTES_MIN,
        max: SEGMENT_SIZE_BYTES_MAX,
        get: |t| t.segment_size_bytes,
        set: |t, v| t.segment_size_bytes = v,
    },
    IntKey {
        name: "retention_bytes",
        min: 0,
        max: TOML_INT_MAX,
        get: |t| t.retention_bytes,
        set: |t, v| t.retention_bytes = v,
    },
    IntKey {
        name: "retention_ms",
        min: 0,
        max: TOML_INT_MAX,
        get: |t| t.retention_ms,
        set: |t, v| t.retention_ms = v,
    },
    IntKey {
        name: "message_size_bytes_max",
        min: 1,
        max: 1 << 30,
        get: |t| u64::from(t.message_size_bytes_max),
        set: |t, v| t.message_size_bytes_max = v as u32,
    },
];

/// `[shard]` and `[shard.N]`: the engine's `ShardConfig` fields (`ring_*_max` → `ring`).
pub(super) const STORAGE_KEYS: [IntKey<ShardConfig>; 24] = [
    IntKey {
        name: "groups_max",
        min: 1,
        max: 1 << 20,
        get: |s| s.groups_max as u64,
        set: |s, v| s.groups_max = v as usize,
    },
    IntKey {
        name: "journal_size_bytes",
        min: 1 << 20,
        max: 1 << 40,
        get: |s| s.journal_size_bytes,
        set: |s, v| s.journal_size_bytes = v,
    },
    IntKey {
        name: "checkpoint_interval_bytes",
        min: 1,
        max: 1 << 40,
        get: |s| s.checkpoint_interval_bytes,
        set: |s, v| s.checkpoint_interval_bytes = v,
    },
    IntKey {
        name: "ready_ahead_bytes",
        min: BLOCK_SIZE_BYTES as u64,
        max: 1 << 32,
        get: |s| s.ready_ahead_bytes,
        set: |s, v| s.ready_ahead_bytes = v,
    },
    IntKey {
        name: "ready_budget_bytes",
        min: 0,
        max: 1 << 44,
        get: |s| s.ready_budget_bytes,
        set: |s, v| s.ready_budget_bytes = v,
    },
    IntKey {
        name: "recycle_segments",
        min: 0,
        max: 1,
        get: |s| u64::from(s.recycle_segments),
        set: |s, v| s.recycle_segments = v != 0,
    },
    IntKey {
        name: "index_interval_bytes",
        min: 1,
        max: 1 << 30,
        get: |s| s.index_interval_bytes,
        set: |s, v| s.index_interval_bytes = v,
    },
    IntKey {
        name: "flush_cycles_in_flight_max",
        min: 1,
        max: 64,
        get: |s| s.flush_cycles_in_flight_max as u64,
        set: |s, v| s.flush_cycles_in_flight_max = v as usize,
    },
    IntKey {
        name: "journal_cycles_in_flight_max",
        min: 1,
        max: 8,
        get: |s| s.journal_cycles_in_flight_max as u64,
        set: |s, v| s.journal_cycles_in_flight_max = v as usize,
    },
    IntKey {
        name: "ring_entries_max",
        min: 1,
        max: 1 << 24,
        get: |s| s.ring.entries_max as u64,
        set: |s, v| s.ring = RingLimits { entries_max: v as usize, ..s.ring },
    },
    IntKey {
        name: "ring_bytes_max",
        min: 1,
        max: 1 << 40,
        get: |s| s.ring.bytes_max as u64,
        set: |s, v| s.ring = RingLimits { bytes_max: v as usize, ..s.ring },
    },
    IntKey {
        name: "ring_budget_bytes",
        min: 1,
        max: 1 << 40,
        get: |s| s.ring_budget_bytes as u64,
        set: |s, v| s.ring_budget_bytes = v as usize,
    },
    IntKey {
        name: "chunk_size_bytes",
        min: BLOCK_SIZE_BYTES as u64,
        max: 1 << 32,
        get: |s| s.chunk_size_bytes as u64,
        set: |s, v| s.chunk_size_bytes = v as usize,
    },
    IntKey {
        name: "chunks_max",
        min: 1,
        max: 1 << 20,
        get: |s| s.chunks_max as u64,
        set: |s, v| s.chunks_max = v as usize,
    },
    IntKey {
        name: "held_prepares_max",
        min: 1,
        max: 1 << 20,
        get: |s| s.held_prepares_max as u64,
        set: |s, v| s.held_prepares_max = v as usize,
    },
    IntKey {
        name: "persisted_write_batch_bytes",
        min: 1,
        max: 1 << 32,
        get: |s| s.persisted_write_batch_bytes as u64,
        set: |s, v| s.persisted_write_batch_bytes = v as usize,
    },
    IntKey {
        name: "scan_window_bytes",
        min: BLOCK_SIZE_BYTES as u64,
        max: 1 << 32,
        get: |s| s.scan_window_bytes as u64,
        set: |s, v| s.scan_window_bytes = v as usize,
    },
    IntKey {
        name: "batch_cache_bytes",
        min: 0,
        max: 1 << 44,
        get: |s| s.batch_cache_bytes as u64,
        set: |s, v| s.batch_cache_bytes = v as usize,
    },
    IntKey {
        name: "read_ahead_windows",
        min: 0,
        max: 64,
        get: |s| s.read_ahead_windows as u64,
        set: |s, v| s.read_ahead_windows = v as usize,
    },
    IntKey {
        name: "persisted_path",
        min: 0,
        max: PERSISTED_PATHS.len() as u64 - 1,
        get: |s| {
            PERSISTED_PATHS.iter().position(|path| *path == s.persisted_path).unwrap_or(0) as u64
        },
        set: |s, v| s.persisted_path = PERSISTED_PATHS[v as usize],
    },
    IntKey {
        name: "sync_cost_bytes",
        min: 0,
        max: 1 << 32,
        get: |s| s.sync_cost_bytes,
        set: |s, v| s.sync_cost_bytes = v,
    },
    IntKey {
        name: "filesystem_sync_cost_bytes",
        min: 0,
        max: 1 << 32,
        get: |s| s.filesystem_sync_cost_bytes,
        set: |s, v| s.filesystem_sync_cost_bytes = v,
    },
    IntKey {
        name: "index_entries_max",
        min: 1,
        max: 1 << 24,
        get: |s| s.index_entries_max as u64,
        set: |s, v| s.index_entries_max = v as usize,
    },
    IntKey {
        name: "record_size_bytes_max",
        min: HEADER_SIZE_BYTES + 1,
        max: (1 << 30) + HEADER_SIZE_BYTES,
        get: |s| s.record_size_bytes_max as u64,
        set: |s, v| s.record_size_bytes_max = v as usize,
    },
];

/// `[shard]` and `[shard.N]` keys the server owns (`ShardTuning`); `direct_io` is a boolean,
/// held as 0 or 1.
pub(super) const TUNING_KEYS: [IntKey<ShardTuning>; 5] = [
    IntKey {
        // monoio builds at least 256 entries, and the kernel refuses more than 32768
        // (IORING_MAX_ENTRIES): within these bounds the ring is the size configured.
        name: "uring_entries",
        min: 256,
        max: 32_768,
        get: |t| u64::from(t.uring_entries),
        set: |t, v| t.uring_entries = v as u32,
    },
    IntKey {
        name: "sqpoll_idle_ms",
        min: 0,
        max: 10_000,
        get: |t| u64::from(t.sqpoll_idle_ms),
        set: |t, v| t.sqpoll_idle_ms = v as u32,
    },
    IntKey {
        name: "direct_io",
        min: 0,
        max: 1,
        get: |t| u64::from(t.direct_io),
        set: |t, v| t.direct_io = v != 0,
    },
    IntKey {
        // 100 ms is ten ticks: a longer hold would only add latency, no flush gathers that long.
        name: "flush_delay_us_max",
        min: 0,
        max: 100_000,
        get: |t| u64::from(t.flush_delay_us_max),
        set: |t, v| t.flush_delay_us_max = v as u32,
    },
    IntKey {
        name: "segment_age_ms_max",
        min: 0,
        max: TOML_INT_MAX,
        get: |t| t.segment_age_ms_max,
        set: |t, v| t.segment_age_ms_max = v,
    },
];

/// The shard keys whose values are `true` or `false` (held as 0 or 1).
pub(super) const BOOL_KEYS: [&str; 2] = ["direct_io", "recycle_segments"];

pub(super) fn is_bool_key(name: &str) -> bool {
    BOOL_KEYS.contains(&name)
}

/// `persisted_path`'s values, in the order its index holds them.
const PERSISTED_PATHS: [PersistedPath; 4] =
    [PersistedPath::Auto, PersistedPath::Journal, PersistedPath::Direct, PersistedPath::Filesystem];

/// The shard keys whose values are words from a list (held as the word's index).
pub(super) const WORD_KEYS: [(&str, &[&str]); 1] =
    [("persisted_path", &["auto", "journal", "direct", "filesystem"])];

/// The words of word key `name`, if it is one.
pub(super) fn key_words(name: &str) -> Option<&'static [&'static str]> {
    WORD_KEYS.iter().find(|(key, _)| *key == name).map(|(_, words)| *words)
}

/// The keys of one `[cluster] nodes` entry (and of `added_node`), in the order the text form
/// writes them.
const NODE_KEYS: [&str; 4] = ["bus", "client", "kafka", "rack"];

/// A `[cluster] nodes` value: an array of tables in the file (`{ bus = "IP:PORT", ... }`), the
/// text form elsewhere (nodes separated by `;`, each a `,`-separated list of `key=value`; an
/// empty text is no nodes). `written` is the key as the user wrote it: an error about a node
/// names it `written[i]` (`cluster.nodes[1]`), one about a node's key `written[i].key`.
pub(super) fn cluster_nodes(raw: Raw<'_>, written: &str) -> Result<Vec<ClusterNode>, ConfigError> {
    let node_key = |index: usize| format!("{written}[{index}]");
    match raw {
        Raw::Toml(toml::Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                let key = node_key(index);
                cluster_node(&key, node_table(item, &key)?)
            })
            .collect(),
        Raw::Toml(other) => Err(ConfigError::new(
            written,
            format!("expected an array of tables, found a {}", other.type_str()),
        )),
        Raw::Text(text) if text.trim().is_empty() => Ok(Vec::new()),
        Raw::Text(text) => text
            .split(';')
            .enumerate()
            .map(|(index, node)| {
                let key = node_key(index);
                if node.trim().is_empty() {
                    return Err(ConfigError::new(
                        key,
                        "empty: nodes are separated by ';', a node's key=value pairs by ','",
                    ));
                }
                cluster_node(&key, node_pairs(node, &key)?)
            })
            .collect(),
    }
}

/// A `[cluster] added_node` value: one node in the form of one entry of `nodes` — a table in
/// the file, the text form of one node elsewhere (an empty text is none, so a later layer can
/// take back an earlier one's). An error names `written` (`cluster.added_node`) or, about one of
/// the node's keys, `written.key`.
pub(super) fn cluster_added_node(
    raw: Raw<'_>,
    written: &str,
) -> Result<Option<ClusterNode>, ConfigError> {
    let entries = match raw {
        Raw::Text(text) if text.trim().is_empty() => return Ok(None),
        Raw::Text(text) if text.contains(';') => {
            return Err(ConfigError::new(
                written,
                "one node only (';' separates the nodes of nodes; a node's key=value pairs \
                 are separated by ',')",
            ));
        }
        Raw::Text(text) => node_pairs(text, written)?,
        Raw::Toml(item) => node_table(item, written)?,
    };
    cluster_node(written, entries).map(Some)
}

/// A node's entries from its TOML table; `key` names the node in errors.
fn node_table<'a>(
    item: &'a toml::Value,
    key: &str,
) -> Result<Vec<(&'a str, Raw<'a>)>, ConfigError> {
    let table = item.as_table().ok_or_else(|| {
        ConfigError::new(
            key,
            format!(
                "expected a table ({{ bus = \"IP:PORT\", client = \"IP:PORT\" }}), found a {}",
                item.type_str()
            ),
        )
    })?;
    Ok(table.iter().map(|(name, value)| (name.as_str(), Raw::Toml(value))).collect())
}

/// A node's entries from its text form (`bus=IP:PORT,client=IP:PORT,...`); `key` names the node
/// in errors.
fn node_pairs<'a>(text: &'a str, key: &str) -> Result<Vec<(&'a str, Raw<'a>)>, ConfigError> {
    text.split(',')
        .map(|pair| {
            let (name, value) = pair.split_once('=').ok_or_else(|| {
                ConfigError::new(
                    key,
                    format!("{:?} is not key=value (keys: {})", pair.trim(), NODE_KEYS.join(", ")),
                )
            })?;
            Ok((name.trim(), Raw::Text(value.trim())))
        })
        .collect()
}

/// One node from its `key = value` entries; `key` names it in errors (`cluster.nodes[1]`,
/// `cluster.added_node`).
fn cluster_node(key: &str, entries: Vec<(&str, Raw<'_>)>) -> Result<ClusterNode, ConfigError> {
    let (mut bus, mut client, mut kafka, mut rack) = (None, None, None, None);
    for (name, raw) in entries {
        let error = |reason: String| ConfigError::new(format!("{key}.{name}"), reason);
        let address = |example: &str| {
            let text = raw.text().map_err(error)?;
            text.parse::<SocketAddr>().map_err(|_| {
                error(format!("{text:?} is not an IP address and port, e.g. {example}"))
            })
        };
        let given_before = match name {
            "bus" => bus.replace(address("127.0.0.1:7200")?).is_some(),
            "client" => client.replace(address("127.0.0.1:7070")?).is_some(),
            "kafka" => kafka.replace(address("127.0.0.1:9092")?).is_some(),
            "rack" => rack.replace(rack_name(raw.text().map_err(error)?).map_err(error)?).is_some(),
            _ => {
                return Err(error(format!("unknown key (a node has {})", NODE_KEYS.join(", "))));
            }
        };
        if given_before {
            return Err(error("given twice".into()));
        }
    }
    let missing = |name: &str| ConfigError::new(key, format!("missing {name}"));
    Ok(ClusterNode {
        bus: bus.ok_or_else(|| missing("bus"))?,
        client: client.ok_or_else(|| missing("client"))?,
        kafka,
        rack,
    })
}

/// A rack name: 1 to 64 bytes of letters, digits, `_`, `.` and `-` (so the text form, which
/// separates with `,`, `;` and `=`, carries any of them as written).
fn rack_name(text: &str) -> Result<String, String> {
    let valid = (1..=RACK_SIZE_BYTES_MAX).contains(&text.len())
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if !valid {
        return Err(format!(
            "{text:?}: a rack name is 1 to {RACK_SIZE_BYTES_MAX} letters, digits, '_', '.' or '-'"
        ));
    }
    Ok(text.to_string())
}
