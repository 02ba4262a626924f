//! The effective configuration as others see it: a config file (`--print-config`) that loads
//! back to the same configuration, the JSON the admin command returns, and each shard's
//! settings by key name for the metrics endpoint's gauges.
//!
//! The file and the JSON are `#[derive(Serialize)]` views of a [`Config`] that `toml` and
//! `serde_json` write; a section's keys come from its key table, in the table's order, so no key
//! name is repeated here. Output only: nothing here reads or checks a setting.

use std::borrow::Cow;

use serde::{Serialize, Serializer};

use super::keys::{
    IntKey, METADATA_KEYS, NETWORK_KEYS, REPLICATION_KEYS, STORAGE_KEYS, TOPIC_KEYS, TUNING_KEYS,
    is_bool_key, key_words,
};
use super::model::{ClusterNode, Config, ShardSettings};

/// The first line of `--print-config`: a TOML comment, which serde cannot write.
const FILE_HEADER: &str = "# The effective shoal configuration (shoal --print-config).\n";

impl Config {
    /// The effective configuration as JSON (the admin command returns it): every key resolved,
    /// one object per shard (no `[shard]`/`[shard.N]` inheritance left to work out).
    pub fn to_json(&self) -> serde_json::Value {
        let shard = self.shard.iter().enumerate();
        let json = ConfigJson {
            node: Node::of(self),
            shard: shard.map(|(index, settings)| ShardJson::of(index, settings)).collect(),
        };
        serde_json::to_value(json).expect("every key of the view is a string")
    }

    /// The effective configuration as a config file (`shoal --print-config`): loaded back as-is
    /// it resolves to this configuration again. `[shard]` holds shard 0's storage settings and
    /// each `[shard.N]` only what differs from them.
    pub fn to_toml(&self) -> String {
        let file = toml::to_string(&ConfigFile::of(self))
            .expect("every value fits a TOML integer (keys are bounded by TOML_INT_MAX)");
        format!("{FILE_HEADER}{file}")
    }
}

/// A shard's settings by their `[shard]` key names, in the tables' order — the engine's storage
/// settings, then the server's tuning (the boolean keys as 0 or 1) — so the metrics endpoint can
/// show each as a gauge and a `[shard.N]` override can be seen at work.
pub fn shard_settings(settings: &ShardSettings) -> impl Iterator<Item = (&'static str, u64)> + '_ {
    let storage = STORAGE_KEYS.iter().map(move |key| (key.name, (key.get)(&settings.storage)));
    storage.chain(TUNING_KEYS.iter().map(move |key| (key.name, (key.get)(&settings.tuning))))
}

/// What the file and the JSON share: the top-level keys and the node-wide sections.
#[derive(Serialize)]
struct Node<'a> {
    data_dir: Cow<'a, str>,
    native_listen: String,
    shards: u32,
    profile: &'static str,
    cluster: Cluster<'a>,
    network: Keys,
    metrics: Metrics,
    kafka: Kafka<'a>,
    log: Log<'a>,
    replication: Keys,
    metadata: Keys,
    topic_defaults: Keys,
}

/// `[cluster]`; `nodes` is always there (`[]` for a one-node cluster), each node as an array
/// element, its optional keys only when set; `added_node`, a table of the same keys, only on a
/// node added later.
#[derive(Serialize)]
struct Cluster<'a> {
    id: u64,
    node: u8,
    balancer_interval_ms: u64,
    nodes: Vec<ClusterNodeKeys<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    added_node: Option<ClusterNodeKeys<'a>>,
}

#[derive(Serialize)]
struct ClusterNodeKeys<'a> {
    bus: String,
    client: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    kafka: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rack: Option<&'a str>,
}

#[derive(Serialize)]
struct Metrics {
    listen: String,
}

#[derive(Serialize)]
struct Kafka<'a> {
    listen: String,
    stream: &'a str,
    group_initial_rebalance_delay_ms: u32,
    auto_create_topics: bool,
    fetch_bytes_max: u32,
}

#[derive(Serialize)]
struct Log<'a> {
    level: &'a str,
}

/// `--print-config`'s file. TOML writes a table's values before its sub-tables, so `cpus`
/// follows `profile` and `[shard]` comes last.
#[derive(Serialize)]
struct ConfigFile<'a> {
    #[serde(flatten)]
    node: Node<'a>,
    /// A list when every shard is pinned; otherwise "none" plus a `cpu` per pinned shard in its
    /// `[shard.N]`, so that loading the output back never falls into the default placement.
    cpus: String,
    /// Shard 0's settings, then a `[shard.N]` table for each shard with what differs (`None`
    /// only for a configuration without shards, which validation never lets through).
    shard: Option<Keys>,
}

/// The admin command's JSON.
#[derive(Serialize)]
struct ConfigJson<'a> {
    #[serde(flatten)]
    node: Node<'a>,
    shard: Vec<ShardJson>,
}

/// One shard in the JSON: its index and CPUs, then every key resolved.
#[derive(Serialize)]
struct ShardJson {
    index: usize,
    cpu: Option<usize>,
    sqpoll_cpu: Option<usize>,
    #[serde(flatten)]
    keys: Keys,
}

/// A section's keys in their key table's order, written as a TOML table or a JSON object
/// (`toml::Table` and `serde_json::Map` would sort them).
struct Keys(Vec<(Cow<'static, str>, Value)>);

impl Serialize for Keys {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(name, value)| (name, value)))
    }
}

/// A key's value as the file and the JSON write it.
#[derive(Serialize)]
#[serde(untagged)]
enum Value {
    Int(u64),
    Bool(bool),
    Text(String),
    /// A `[shard.N]` table inside `[shard]`.
    Table(Keys),
}

impl<'a> Node<'a> {
    fn of(config: &'a Config) -> Node<'a> {
        let mut network = keys(&NETWORK_KEYS, &config.network);
        network.0.push(("shard_listen".into(), Value::Text(config.network.shard_listen_text())));
        let mut topic_defaults = Keys(Vec::new());
        for key in &TOPIC_KEYS {
            topic_defaults.0.push((key.name.into(), value(key, &config.topic_defaults)));
            if key.name == "partitions" {
                let durability = config.topic_defaults.durability.as_str().to_string();
                topic_defaults.0.push(("durability".into(), Value::Text(durability)));
            }
        }
        Node {
            data_dir: config.data_dir.to_string_lossy(),
            native_listen: config.native_listen.to_string(),
            shards: config.shards,
            profile: config.profile.as_str(),
            cluster: Cluster {
                id: config.cluster.id,
                node: config.cluster.node,
                balancer_interval_ms: config.cluster.balancer_interval_ms,
                nodes: config.cluster.nodes.iter().map(ClusterNodeKeys::of).collect(),
                added_node: config.cluster.added_node.as_ref().map(ClusterNodeKeys::of),
            },
            network,
            metrics: Metrics { listen: config.metrics.listen_text() },
            kafka: Kafka {
                listen: config.kafka.listen_text(),
                stream: &config.kafka.stream,
                group_initial_rebalance_delay_ms: config.kafka.group_initial_rebalance_delay_ms,
                auto_create_topics: config.kafka.auto_create_topics,
                fetch_bytes_max: config.kafka.fetch_bytes_max,
            },
            log: Log { level: &config.log.level },
            replication: keys(&REPLICATION_KEYS, &config.replication),
            metadata: keys(&METADATA_KEYS, &config.metadata),
            topic_defaults,
        }
    }
}

impl<'a> ClusterNodeKeys<'a> {
    fn of(node: &'a ClusterNode) -> ClusterNodeKeys<'a> {
        ClusterNodeKeys {
            bus: node.bus.to_string(),
            client: node.client.to_string(),
            kafka: node.kafka.map(|kafka| kafka.to_string()),
            rack: node.rack.as_deref(),
        }
    }
}

impl<'a> ConfigFile<'a> {
    fn of(config: &'a Config) -> ConfigFile<'a> {
        let all_pinned: Option<Vec<String>> =
            config.shard.iter().map(|s| s.cpu.map(|cpu| cpu.to_string())).collect();
        let cpus = all_pinned.as_ref().map_or_else(|| "none".to_string(), |list| list.join(","));
        ConfigFile {
            node: Node::of(config),
            cpus,
            shard: shard_tables(&config.shard, all_pinned.is_none()),
        }
    }
}

impl ShardJson {
    fn of(index: usize, settings: &ShardSettings) -> ShardJson {
        let mut all = keys(&STORAGE_KEYS, &settings.storage);
        all.0.extend(keys(&TUNING_KEYS, &settings.tuning).0);
        ShardJson { index, cpu: settings.cpu, sqpoll_cpu: settings.tuning.sqpoll_cpu, keys: all }
    }
}

/// `[shard]` (shard 0's storage and tuning keys) with a `[shard.N]` table for each shard that
/// differs from it; `cpu_per_shard`: `cpus` says "none", so each pinned shard names its CPU.
fn shard_tables(shards: &[ShardSettings], cpu_per_shard: bool) -> Option<Keys> {
    let first = shards.first()?;
    let mut tables = keys(&STORAGE_KEYS, &first.storage);
    tables.0.extend(keys(&TUNING_KEYS, &first.tuning).0);
    for (index, settings) in shards.iter().enumerate() {
        let mut differs = Vec::new();
        if cpu_per_shard && let Some(cpu) = settings.cpu {
            differs.push(("cpu".into(), Value::Int(cpu as u64)));
        }
        if let Some(cpu) = settings.tuning.sqpoll_cpu {
            differs.push(("sqpoll_cpu".into(), Value::Int(cpu as u64)));
        }
        differs.extend(changed(&STORAGE_KEYS, &settings.storage, &first.storage));
        differs.extend(changed(&TUNING_KEYS, &settings.tuning, &first.tuning));
        if !differs.is_empty() {
            tables.0.push((index.to_string().into(), Value::Table(Keys(differs))));
        }
    }
    Some(tables)
}

/// Every key of `table`, valued from `settings`.
fn keys<T>(table: &[IntKey<T>], settings: &T) -> Keys {
    Keys(table.iter().map(|key| (key.name.into(), value(key, settings))).collect())
}

/// The keys of `table` whose value in `settings` differs from `base`.
fn changed<'a, T>(
    table: &'a [IntKey<T>],
    settings: &'a T,
    base: &'a T,
) -> impl Iterator<Item = (Cow<'static, str>, Value)> + 'a {
    table
        .iter()
        .filter(move |key| (key.get)(settings) != (key.get)(base))
        .map(move |key| (key.name.into(), value(key, settings)))
}

/// A key's value as written in a config file (a boolean key as `true` or `false`).
fn value<T>(key: &IntKey<T>, settings: &T) -> Value {
    let value = (key.get)(settings);
    if is_bool_key(key.name) {
        Value::Bool(value != 0)
    } else if let Some(words) = key_words(key.name) {
        Value::Text(words[value as usize].to_string())
    } else {
        Value::Int(value)
    }
}
