//! The resolution: [`Layers`] takes the settings layer by layer in the order the caller applies
//! them — the config file, then the `SHOAL_*` environment, then the flags — each replacing what
//! an earlier one set for the same key; [`Layers::resolve`] then starts from the built-in
//! defaults, applies every key given (a `[shard.N]` key beats the same `[shard]` key from any
//! layer; in a cluster, `native_listen` no layer set is this node's client address), places the
//! shards on CPUs and validates.
//!
//! It never reads a file, the environment or the machine itself: `main` passes their contents
//! in, so tests drive it with plain strings.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use shoal_proto::durability::{Durability, UnknownDurability};

use super::args::FLAGS;
use super::error::ConfigError;
use super::keys::{
    BOOL_KEYS, CLUSTER_KEYS, CPU_ID_MAX, METADATA_KEYS, NETWORK_KEYS, Placement, REPLICATION_KEYS,
    Raw, STORAGE_KEYS, Scope, TOPIC_KEYS, TUNING_KEYS, WORD_KEYS, cluster_added_node,
    cluster_nodes, env_key, log_filter, shard_index,
};
use super::model::{
    ClusterNode, Config, GROUP_INITIAL_REBALANCE_DELAY_MS_MAX, KAFKA_FETCH_BYTES_MAX,
    KAFKA_FETCH_BYTES_MIN, Profile, SHARDS_MAX,
};

/// What the machine offers, for the defaults that depend on it.
#[derive(Clone, Debug)]
pub struct Host {
    /// Available parallelism: the default shard count (capped at [`SHARDS_MAX`]).
    pub parallelism: u32,
    /// CPU ids a thread may be pinned to: the default placement puts shard i on the i-th.
    pub core_ids: Vec<usize>,
}

/// A resolved configuration and what the operator should hear about it.
#[derive(Debug)]
pub struct Resolved {
    /// The configuration, validated.
    pub config: Config,
    /// Notes for stderr (a default that could not be applied, such as the CPU placement).
    pub warnings: Vec<String>,
    /// The key that chose each shard's CPU, for an error about it once the server checks the
    /// CPUs it may run on (resolving checks none: `--print-config` shows any machine's config).
    pub cpu_keys: Vec<String>,
}

/// The `SHOAL_*` variables other programs of the project own; the server ignores them instead of
/// rejecting them as unknown keys. No config section is named `bench` or `sim`, so these can
/// never shadow a key.
const ENV_OWNED_ELSEWHERE: [&str; 2] = ["SHOAL_BENCH_", "SHOAL_SIM_"];

/// The settings given so far, layer by layer: each `file`, `env` or `flag` call sets keys,
/// replacing what an earlier call set for the same key; [`Layers::resolve`] fills in the
/// defaults and validates. Call them in the resolution order: file, environment, flags.
#[derive(Clone, Debug, Default)]
pub struct Layers {
    pub(super) data_dir: Option<Given<PathBuf>>,
    pub(super) native_listen: Option<Given<SocketAddr>>,
    pub(super) metrics_listen: Option<Given<Option<SocketAddr>>>,
    pub(super) kafka_listen: Option<Given<Option<SocketAddr>>>,
    pub(super) kafka_stream: Option<Given<String>>,
    pub(super) kafka_group_delay: Option<Given<u32>>,
    pub(super) kafka_auto_create: Option<Given<bool>>,
    pub(super) kafka_fetch_bytes_max: Option<Given<u32>>,
    pub(super) shard_listen: Option<Given<Option<SocketAddr>>>,
    pub(super) log_level: Option<Given<String>>,
    pub(super) shards: Option<Given<u32>>,
    pub(super) profile: Option<Given<Profile>>,
    pub(super) cpus: Option<Given<Placement>>,
    pub(super) durability: Option<Given<Durability>>,
    pub(super) cluster_nodes: Option<Given<Vec<ClusterNode>>>,
    /// `[cluster] added_node`; `None` inside: an empty text took back an earlier layer's.
    pub(super) cluster_added_node: Option<Given<Option<ClusterNode>>>,
    /// Every integer key (network, topic defaults, shard storage and tuning, per-shard `cpu`),
    /// and the boolean shard keys as 0 or 1.
    pub(super) ints: BTreeMap<(Scope, &'static str), Given<u64>>,
    /// The `[shard.N]` tables of the file, even empty ones, with the key that names each.
    pub(super) shard_tables: BTreeMap<u32, String>,
}

impl Layers {
    /// Applies a config file's text (`path` only names it in errors).
    pub fn file(&mut self, path: &Path, text: &str) -> Result<(), ConfigError> {
        let table: toml::Table = text.parse().map_err(|error: toml::de::Error| {
            let at = error.span().map_or(String::new(), |span| {
                let before = text.get(..span.start).unwrap_or(text);
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |at| at + 1) + 1;
                format!("line {line}, column {column}: ")
            });
            ConfigError::new(
                path.display().to_string(),
                format!("not a valid TOML file: {at}{}", error.message().trim()),
            )
        })?;
        let mut server_keys: BTreeSet<String> = BTreeSet::new();
        for (name, value) in &table {
            match name.as_str() {
                "server" => {
                    for (key, value) in section(value, "server")? {
                        if !server_keys.insert(key.clone()) {
                            return Err(twice(key));
                        }
                        self.set(Scope::Server, key, Raw::Toml(value), format!("server.{key}"))?;
                    }
                }
                "cluster" => {
                    for (key, value) in section(value, "cluster")? {
                        let written = format!("cluster.{key}");
                        self.set(Scope::Cluster, key, Raw::Toml(value), written)?;
                    }
                }
                "network" => {
                    for (key, value) in section(value, "network")? {
                        let written = format!("network.{key}");
                        self.set(Scope::Network, key, Raw::Toml(value), written)?;
                    }
                }
                "metrics" => {
                    for (key, value) in section(value, "metrics")? {
                        let written = format!("metrics.{key}");
                        self.set(Scope::Metrics, key, Raw::Toml(value), written)?;
                    }
                }
                "kafka" => {
                    for (key, value) in section(value, "kafka")? {
                        let written = format!("kafka.{key}");
                        self.set(Scope::Kafka, key, Raw::Toml(value), written)?;
                    }
                }
                "replication" => {
                    for (key, value) in section(value, "replication")? {
                        let written = format!("replication.{key}");
                        self.set(Scope::Replication, key, Raw::Toml(value), written)?;
                    }
                }
                "metadata" => {
                    for (key, value) in section(value, "metadata")? {
                        let written = format!("metadata.{key}");
                        self.set(Scope::Metadata, key, Raw::Toml(value), written)?;
                    }
                }
                "log" => {
                    for (key, value) in section(value, "log")? {
                        let written = format!("log.{key}");
                        self.set(Scope::Log, key, Raw::Toml(value), written)?;
                    }
                }
                "topic_defaults" => {
                    for (key, value) in section(value, "topic_defaults")? {
                        let written = format!("topic_defaults.{key}");
                        self.set(Scope::TopicDefaults, key, Raw::Toml(value), written)?;
                    }
                }
                "shard" => {
                    for (key, value) in section(value, "shard")? {
                        let Some(index) = shard_index(key) else {
                            self.set(Scope::Shard, key, Raw::Toml(value), format!("shard.{key}"))?;
                            continue;
                        };
                        let table_key = format!("shard.{index}");
                        for (key, value) in section(value, &table_key)? {
                            let written = format!("{table_key}.{key}");
                            self.set(Scope::ShardN(index), key, Raw::Toml(value), written)?;
                        }
                        self.shard_tables.insert(index, table_key);
                    }
                }
                _ => {
                    if !server_keys.insert(name.clone()) {
                        return Err(twice(name));
                    }
                    self.set(Scope::Server, name, Raw::Toml(value), name.clone())?;
                }
            }
        }
        Ok(())
    }

    /// Applies the `SHOAL_*` variables among `vars` (others are ignored): `SHOAL_<KEY>` for a
    /// top-level key, `SHOAL_<SECTION>_<KEY>` for a section's, upper-cased. An unknown `SHOAL_*`
    /// variable is an error, so a typo cannot silently leave a default in place.
    pub fn env(
        &mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), ConfigError> {
        // Sorted, so the same environment always reports the same first error.
        let vars: BTreeMap<String, String> =
            vars.into_iter().filter(|(name, _)| name.starts_with("SHOAL_")).collect();
        for (name, value) in &vars {
            if ENV_OWNED_ELSEWHERE.iter().any(|owned| {
                if owned.ends_with('_') { name.starts_with(owned) } else { name == owned }
            }) {
                continue;
            }
            let Some((scope, key)) = env_key(name) else {
                let reason = if name == "SHOAL_LOG_LEVEL" {
                    "unknown SHOAL_ variable: the log level is SHOAL_LOG"
                } else {
                    "unknown SHOAL_ variable (docs/configuration.md lists them)"
                };
                return Err(ConfigError::new(name, reason));
            };
            self.set(scope, key, Raw::Text(value), name.clone())?;
        }
        Ok(())
    }

    /// Applies one setting flag (`--shards`, ...) from [`Args::settings`](crate::config::Args::settings).
    pub fn flag(&mut self, flag: &str, value: &str) -> Result<(), ConfigError> {
        let Some(known) = FLAGS.iter().find(|known| known.name == flag) else {
            return Err(ConfigError::new(flag, "unknown flag (shoal --help lists them)"));
        };
        self.set(known.scope, known.key, Raw::Text(value), known.name.to_string())
    }

    /// Fills in the defaults (`host` gives the machine-dependent ones), applies the settings on
    /// top and validates the result.
    pub fn resolve(&self, host: &Host) -> Result<Resolved, ConfigError> {
        let shards =
            self.shards.as_ref().map_or(host.parallelism.clamp(1, SHARDS_MAX), |s| s.value);
        let profile = self.profile.as_ref().map_or(Profile::Default, |p| p.value);
        let mut config = Config::defaults(shards, profile == Profile::Small);
        let mut warnings = Vec::new();
        if let Some(data_dir) = &self.data_dir {
            config.data_dir.clone_from(&data_dir.value);
        }
        for key in &CLUSTER_KEYS {
            if let Some(given) = self.ints.get(&(Scope::Cluster, key.name)) {
                (key.set)(&mut config.cluster, given.value);
            }
        }
        if let Some(nodes) = &self.cluster_nodes {
            config.cluster.nodes.clone_from(&nodes.value);
        }
        if let Some(added_node) = &self.cluster_added_node {
            config.cluster.added_node.clone_from(&added_node.value);
        }
        // In a cluster the native listener is, unless set, where the node's peers tell clients
        // to connect (from `nodes`, or `added_node` for a node added later; an unknown `node` is
        // left for validation to name).
        let client = config.cluster.own_node().map(|own| own.client);
        match (&self.native_listen, client) {
            (Some(native_listen), _) => config.native_listen = native_listen.value,
            (None, Some(client)) => config.native_listen = client,
            (None, None) => {}
        }
        if let Some(listen) = &self.metrics_listen {
            config.metrics.listen = listen.value;
        }
        // As for the native listener: in a cluster, unless set, the node's advertised address.
        match (&self.kafka_listen, config.cluster.own_node().and_then(|own| own.kafka)) {
            (Some(listen), _) => config.kafka.listen = listen.value,
            (None, Some(kafka)) => config.kafka.listen = Some(kafka),
            (None, None) => {}
        }
        if let Some(stream) = &self.kafka_stream {
            config.kafka.stream.clone_from(&stream.value);
        }
        if let Some(delay) = &self.kafka_group_delay {
            config.kafka.group_initial_rebalance_delay_ms = delay.value;
        }
        if let Some(auto_create) = &self.kafka_auto_create {
            config.kafka.auto_create_topics = auto_create.value;
        }
        if let Some(bytes) = &self.kafka_fetch_bytes_max {
            config.kafka.fetch_bytes_max = bytes.value;
        }
        if let Some(listen) = &self.shard_listen {
            config.network.shard_listen = listen.value;
        }
        if let Some(level) = &self.log_level {
            config.log.level.clone_from(&level.value);
        }
        for key in &NETWORK_KEYS {
            if let Some(given) = self.ints.get(&(Scope::Network, key.name)) {
                (key.set)(&mut config.network, given.value);
            }
        }
        for key in &REPLICATION_KEYS {
            if let Some(given) = self.ints.get(&(Scope::Replication, key.name)) {
                (key.set)(&mut config.replication, given.value);
            }
        }
        for key in &METADATA_KEYS {
            if let Some(given) = self.ints.get(&(Scope::Metadata, key.name)) {
                (key.set)(&mut config.metadata, given.value);
            }
        }
        for key in &TOPIC_KEYS {
            if let Some(given) = self.ints.get(&(Scope::TopicDefaults, key.name)) {
                (key.set)(&mut config.topic_defaults, given.value);
            }
        }
        if let Some(durability) = &self.durability {
            config.topic_defaults.durability = durability.value;
        }
        if let Some((&index, key)) = self.shard_tables.range(shards..).next() {
            return Err(ConfigError::new(
                key,
                format!(
                    "there is no shard {index}: shards is {shards}, so N in [shard.N] runs from \
                     0 to {}",
                    shards - 1
                ),
            ));
        }
        for (index, settings) in (0..shards).zip(config.shard.iter_mut()) {
            for key in &STORAGE_KEYS {
                let given = self
                    .ints
                    .get(&(Scope::ShardN(index), key.name))
                    .or_else(|| self.ints.get(&(Scope::Shard, key.name)));
                if let Some(given) = given {
                    (key.set)(&mut settings.storage, given.value);
                }
            }
            for key in &TUNING_KEYS {
                let given = self
                    .ints
                    .get(&(Scope::ShardN(index), key.name))
                    .or_else(|| self.ints.get(&(Scope::Shard, key.name)));
                if let Some(given) = given {
                    (key.set)(&mut settings.tuning, given.value);
                }
            }
            if let Some(given) = self.ints.get(&(Scope::ShardN(index), "sqpoll_cpu")) {
                settings.tuning.sqpoll_cpu = Some(given.value as usize);
            }
        }
        for (settings, cpu) in
            config.shard.iter_mut().zip(self.placement(shards, host, &mut warnings)?)
        {
            settings.cpu = cpu;
        }
        self.validate(&config)?;
        let cpu_keys = (0..shards).map(|index| self.cpu_key(index)).collect();
        Ok(Resolved { config, warnings, cpu_keys })
    }

    /// The CPU of each shard: the `cpus` setting, else — when no `[shard.N] cpu` is given either
    /// — shard i on the i-th available CPU if there are enough (otherwise none pinned, with a
    /// warning); then each `[shard.N] cpu`.
    fn placement(
        &self,
        shards: u32,
        host: &Host,
        warnings: &mut Vec<String>,
    ) -> Result<Vec<Option<usize>>, ConfigError> {
        let count = shards as usize;
        let any_shard_cpu =
            self.ints.keys().any(|&(scope, key)| matches!(scope, Scope::ShardN(_)) && key == "cpu");
        let mut cpus = match &self.cpus {
            Some(Given { value: Placement::Unpinned, .. }) => vec![None; count],
            Some(Given { value: Placement::Cpus(list), key }) => {
                if list.len() != count {
                    // The flag's name leads the reason as well: scripts grep for it.
                    return Err(ConfigError::new(
                        key,
                        format!(
                            "{key} names {} CPUs for {shards} shards: give one per shard, or none",
                            list.len()
                        ),
                    ));
                }
                list.iter().map(|&cpu| Some(cpu)).collect()
            }
            None if any_shard_cpu => vec![None; count],
            None if host.core_ids.len() < count => {
                warnings.push(format!(
                    "{shards} shards on {} CPUs: shard threads are not pinned",
                    host.core_ids.len()
                ));
                vec![None; count]
            }
            None => host.core_ids.iter().take(count).map(|&cpu| Some(cpu)).collect(),
        };
        for (index, cpu) in (0..shards).zip(cpus.iter_mut()) {
            if let Some(given) = self.ints.get(&(Scope::ShardN(index), "cpu")) {
                *cpu = Some(given.value as usize);
            }
        }
        for (index, cpu) in cpus.iter().enumerate() {
            let Some(cpu) = *cpu else { continue };
            if let Some(other) = cpus[..index].iter().position(|&earlier| earlier == Some(cpu)) {
                return Err(ConfigError::new(
                    self.cpu_key(index as u32),
                    format!(
                        "shards {other} and {index} would both be pinned to CPU {cpu}: a shard \
                         needs a CPU of its own (or use cpus = \"none\")"
                    ),
                ));
            }
        }
        Ok(cpus)
    }

    /// The key that chose shard `index`'s CPU: its `[shard.N] cpu`, else `cpus` as written.
    fn cpu_key(&self, index: u32) -> String {
        self.ints
            .get(&(Scope::ShardN(index), "cpu"))
            .map(|given| given.key.clone())
            .or_else(|| self.cpus.as_ref().map(|given| given.key.clone()))
            .unwrap_or_else(|| "cpus".into())
    }

    /// Sets one key from any layer; `written` is the key as the user wrote it, for errors.
    fn set(
        &mut self,
        scope: Scope,
        name: &str,
        raw: Raw<'_>,
        written: String,
    ) -> Result<(), ConfigError> {
        let error = |reason: String| ConfigError::new(written.clone(), reason);
        match (scope, name) {
            (Scope::Server, "data_dir") => {
                let text = raw.text().map_err(error)?;
                if text.is_empty() {
                    return Err(error("must not be empty".into()));
                }
                self.data_dir = Some(Given { value: PathBuf::from(text), key: written });
            }
            (Scope::Server, "native_listen") => {
                let text = raw.text().map_err(error)?;
                let address = text.parse().map_err(|_| {
                    error(format!("{text:?} is not an IP address and port, e.g. 127.0.0.1:7070"))
                })?;
                self.native_listen = Some(Given { value: address, key: written });
            }
            (Scope::Cluster, "nodes") => {
                let nodes = cluster_nodes(raw, &written)?;
                self.cluster_nodes = Some(Given { value: nodes, key: written });
            }
            (Scope::Cluster, "added_node") => {
                let node = cluster_added_node(raw, &written)?;
                self.cluster_added_node = Some(Given { value: node, key: written });
            }
            (Scope::Metrics, "listen") => {
                let listen = raw.listen_or_off("127.0.0.1:9464").map_err(error)?;
                self.metrics_listen = Some(Given { value: listen, key: written });
            }
            (Scope::Kafka, "listen") => {
                let listen = raw.listen_or_off("127.0.0.1:9092").map_err(error)?;
                self.kafka_listen = Some(Given { value: listen, key: written });
            }
            (Scope::Kafka, "stream") => {
                let text = raw.text().map_err(error)?;
                shoal_proto::protocol::validate_name(text)
                    .map_err(|reason| error(format!("{text:?} is not a stream name: {reason}")))?;
                self.kafka_stream = Some(Given { value: text.to_string(), key: written });
            }
            (Scope::Kafka, "group_initial_rebalance_delay_ms") => {
                let delay = raw.int(0, u64::from(GROUP_INITIAL_REBALANCE_DELAY_MS_MAX));
                let delay = delay.map_err(error)? as u32;
                self.kafka_group_delay = Some(Given { value: delay, key: written });
            }
            (Scope::Kafka, "auto_create_topics") => {
                let value = raw.bool().map_err(error)?;
                self.kafka_auto_create = Some(Given { value, key: written });
            }
            (Scope::Kafka, "fetch_bytes_max") => {
                let bounds = (u64::from(KAFKA_FETCH_BYTES_MIN), u64::from(KAFKA_FETCH_BYTES_MAX));
                let value = raw.int(bounds.0, bounds.1).map_err(error)? as u32;
                self.kafka_fetch_bytes_max = Some(Given { value, key: written });
            }
            (Scope::Network, "shard_listen") => {
                let listen = raw.listen_or_off("127.0.0.1:7100").map_err(error)?;
                self.shard_listen = Some(Given { value: listen, key: written });
            }
            (Scope::Shard | Scope::ShardN(_), name)
                if let Some(name) = BOOL_KEYS.iter().find(|key| **key == name) =>
            {
                let value = raw.bool().map_err(error)?;
                self.ints.insert((scope, name), Given { value: u64::from(value), key: written });
            }
            (Scope::Shard | Scope::ShardN(_), name)
                if let Some((name, words)) = WORD_KEYS.iter().find(|(key, _)| *key == name) =>
            {
                let text = raw.text().map_err(error)?;
                let index = words
                    .iter()
                    .position(|word| *word == text)
                    .ok_or_else(|| error(format!("{text:?}: use one of {}", words.join(", "))))?;
                self.ints.insert((scope, name), Given { value: index as u64, key: written });
            }
            (Scope::Shard | Scope::ShardN(_), name)
                if name == "durability" || TOPIC_KEYS.iter().any(|key| key.name == name) =>
            {
                return Err(error(format!(
                    "{name} is a topic setting, and a topic's partitions span shards: set it \
                     for the node in [topic_defaults] (docs/configuration.md, \"Per-shard topic \
                     defaults\")"
                )));
            }
            (Scope::Log, "level") => {
                let level = log_filter(raw.text().map_err(error)?).map_err(error)?;
                self.log_level = Some(Given { value: level, key: written });
            }
            (Scope::Server, "shards") => {
                let shards = raw.int(1, u64::from(SHARDS_MAX)).map_err(error)?;
                self.shards = Some(Given { value: shards as u32, key: written });
            }
            (Scope::Server, "profile") => {
                let text = raw.text().map_err(error)?;
                let profile = Profile::parse(text)
                    .ok_or_else(|| error(format!("{text:?}: use \"default\" or \"small\"")))?;
                self.profile = Some(Given { value: profile, key: written });
            }
            (Scope::Server, "cpus") => {
                let text = raw.text().map_err(error)?;
                let placement = Placement::parse(text).map_err(error)?;
                self.cpus = Some(Given { value: placement, key: written });
            }
            (Scope::TopicDefaults, "durability") => {
                let text = raw.text().map_err(error)?;
                let durability: Durability = text
                    .parse()
                    .map_err(|unknown: UnknownDurability| error(unknown.to_string()))?;
                self.durability = Some(Given { value: durability, key: written });
            }
            (Scope::ShardN(_), "cpu") => {
                let cpu = raw.int(0, CPU_ID_MAX).map_err(error)?;
                self.ints.insert((scope, "cpu"), Given { value: cpu, key: written });
            }
            (Scope::Shard, "cpu") => {
                return Err(error(
                    "cpu is set per shard, in [shard.N]; for all shards use the top-level cpus"
                        .into(),
                ));
            }
            (Scope::ShardN(_), "sqpoll_cpu") => {
                let cpu = raw.int(0, CPU_ID_MAX).map_err(error)?;
                self.ints.insert((scope, "sqpoll_cpu"), Given { value: cpu, key: written });
            }
            (Scope::Shard, "sqpoll_cpu") => {
                return Err(error(
                    "sqpoll_cpu is set per shard, in [shard.N]: each shard's polling thread needs \
                     a CPU of its own"
                        .into(),
                ));
            }
            _ => {
                let Some((name, min, max)) = scope.int_key(name) else {
                    return Err(error("unknown key (docs/configuration.md lists them)".into()));
                };
                let value = raw.int(min, max).map_err(error)?;
                self.ints.insert((scope, name), Given { value, key: written });
            }
        }
        Ok(())
    }
}

/// A value some layer set, with the key it was written as.
#[derive(Clone, Debug)]
pub(super) struct Given<T> {
    pub(super) value: T,
    pub(super) key: String,
}

/// A top-level key set both bare and under `[server]`, named by its `[server]` spelling (the
/// table's key order decides which of the two is met first).
fn twice(key: &str) -> ConfigError {
    ConfigError::new(format!("server.{key}"), "also set at the top level: set it once")
}

/// The entries of a section, or why it is not one.
fn section<'a>(value: &'a toml::Value, key: &str) -> Result<&'a toml::Table, ConfigError> {
    value.as_table().ok_or_else(|| {
        ConfigError::new(key, format!("must be a table ([{key}]), not a {}", value.type_str()))
    })
}
