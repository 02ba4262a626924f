//! The rules that tie keys together, checked once on the resolved configuration: storage sizes
//! that must hold the largest record, SQPOLL's placement, per-shard listener ports, topic
//! defaults the storage engine accepts, and a cluster whose nodes' addresses can all be bound
//! and dialled. Each key's own bounds were checked when it was set.
//!
//! An error names the key the user set: when a rule between two keys breaks, never the default
//! the user did not think about.

use std::net::SocketAddr;
use std::ops::RangeInclusive;

use shoal_engine::storage::BLOCK_SIZE_BYTES;
use shoal_engine::superblock::GroupConfig;
use shoal_proto::wire::HEADER_SIZE;
use shoal_replication::TICK_MS;

use super::error::ConfigError;
use super::keys::{HEADER_SIZE_BYTES, NODES_MAX, Scope};
use super::layers::Layers;
use super::model::{ClusterNode, Config, ShardSettings};

impl Layers {
    /// The rules that tie keys together (each key's own bounds were checked when it was set).
    /// When a rule between two keys breaks, the error names the one the user set.
    pub(super) fn validate(&self, config: &Config) -> Result<(), ConfigError> {
        for (index, settings) in (0..config.shards).zip(&config.shard) {
            self.validate_shard(config, index, settings)?;
        }
        self.validate_shard_listen(config)?;
        self.validate_listeners(config)?;
        self.validate_replication(config)?;
        self.validate_topic_defaults(config)?;
        self.validate_cluster(config)
    }

    /// Shard `index`'s rules: its ring and SQPOLL, and storage sizes that hold the largest record.
    fn validate_shard(
        &self,
        config: &Config,
        index: u32,
        settings: &ShardSettings,
    ) -> Result<(), ConfigError> {
        let block = BLOCK_SIZE_BYTES as u64;
        let storage = &settings.storage;
        let key = |name: &'static str| self.storage_key(index, name);
        let tuning = &settings.tuning;
        if !tuning.uring_entries.is_power_of_two() {
            return Err(key("uring_entries").error(format!(
                "{} is not a power of two (the kernel would round it up silently)",
                tuning.uring_entries
            )));
        }
        self.check_sqpoll(config, index)?;
        let record = storage.record_size_bytes_max as u64;
        let chunk = storage.chunk_size_bytes as u64;
        if chunk < record + block {
            return Err(blame(
                key("chunk_size_bytes"),
                key("record_size_bytes_max"),
                format!(
                    "chunk_size_bytes ({chunk}) must hold record_size_bytes_max ({record}) \
                     plus a {block}-byte block"
                ),
            ));
        }
        let journal = storage.journal_size_bytes;
        if !journal.is_multiple_of(block) {
            return Err(key("journal_size_bytes")
                .error(format!("{journal} is not a multiple of the {block}-byte block")));
        }
        let journal_min = 2 * (record + HEADER_SIZE_BYTES + block);
        if journal < journal_min {
            return Err(blame(
                key("journal_size_bytes"),
                key("record_size_bytes_max"),
                format!(
                    "journal_size_bytes ({journal}) must hold two of the largest records: \
                     at least {journal_min} with record_size_bytes_max {record}"
                ),
            ));
        }
        let ready_ahead = storage.ready_ahead_bytes;
        if !ready_ahead.is_multiple_of(block) {
            return Err(key("ready_ahead_bytes")
                .error(format!("{ready_ahead} is not a multiple of the {block}-byte block")));
        }
        let ring = storage.ring.bytes_max as u64;
        if ring < record {
            return Err(blame(
                key("ring_bytes_max"),
                key("record_size_bytes_max"),
                format!(
                    "ring_bytes_max ({ring}) must hold the largest record \
                     (record_size_bytes_max {record})"
                ),
            ));
        }
        let budget = storage.ring_budget_bytes as u64;
        if budget < ring {
            return Err(blame(
                key("ring_budget_bytes"),
                key("ring_bytes_max"),
                format!(
                    "ring_budget_bytes ({budget}), the memory of all rings of the shard, must \
                     hold at least one full ring (ring_bytes_max {ring})"
                ),
            ));
        }
        Ok(())
    }

    /// The per-shard listeners' rules: every shard's port within the port range, and none on
    /// `native_listen`'s port.
    fn validate_shard_listen(&self, config: &Config) -> Result<(), ConfigError> {
        if let (Some(listen), Some(given)) = (config.network.shard_listen, &self.shard_listen) {
            let last = u32::from(listen.port()) + (config.shards - 1);
            if listen.port() != 0 && last > u32::from(u16::MAX) {
                return Err(ConfigError::new(
                    &given.key,
                    format!(
                        "shard {} would listen on port {last}: with {} shards the base port may \
                         be at most {}",
                        config.shards - 1,
                        config.shards,
                        u32::from(u16::MAX) + 1 - config.shards
                    ),
                ));
            }
            let native = config.native_listen;
            let clash = (0..config.shards).find(|&index| {
                config.network.shard_listen_address(index).is_some_and(|address| {
                    address.port() != 0
                        && address.port() == native.port()
                        && (address.ip() == native.ip()
                            || address.ip().is_unspecified()
                            || native.ip().is_unspecified())
                })
            });
            if let Some(index) = clash {
                return Err(ConfigError::new(
                    &given.key,
                    format!(
                        "shard {index}'s own port would be native_listen's ({native}): the \
                         shared listener and the per-shard ones need different ports"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The node's own listeners: no two of the native, Kafka and metrics ones on one port of
    /// one host. The native and Kafka listeners share their port among the shards, so the
    /// kernel would let them share it with each other too, and split connections between the
    /// two protocols without a word.
    fn validate_listeners(&self, config: &Config) -> Result<(), ConfigError> {
        let written = |given: Option<String>, default: &str| match given {
            Some(key) => Written { key, given: true },
            None => Written { key: default.to_string(), given: false },
        };
        let listeners = [
            (
                written(self.native_listen.as_ref().map(|g| g.key.clone()), "native_listen"),
                Some(config.native_listen),
            ),
            (
                written(self.kafka_listen.as_ref().map(|g| g.key.clone()), "kafka.listen"),
                config.kafka.listen,
            ),
            (
                written(self.metrics_listen.as_ref().map(|g| g.key.clone()), "metrics.listen"),
                config.metrics.listen,
            ),
        ];
        for (index, (first, a)) in listeners.iter().enumerate() {
            for (second, b) in &listeners[index + 1..] {
                let (Some(a), Some(b)) = (a, b) else { continue };
                if a.port() != 0 && a.port() == b.port() && same_host(*a, *b) {
                    let reason = format!(
                        "{} ({a}) and {} ({b}) would share a port: each listener needs its own",
                        first.key, second.key
                    );
                    let (first, second) = (first.clone(), second.clone());
                    return Err(blame(first, second, reason));
                }
            }
        }
        Ok(())
    }

    /// The topic defaults' rules: the largest message fits every shard's record, a segment and a
    /// frame, and the storage engine accepts the defaults as a group's settings.
    fn validate_topic_defaults(&self, config: &Config) -> Result<(), ConfigError> {
        let topic = &config.topic_defaults;
        let message = u64::from(topic.message_size_bytes_max);
        let message_key = self.key_of(Scope::TopicDefaults, "message_size_bytes_max");
        let smallest = (0..config.shards)
            .zip(&config.shard)
            .min_by_key(|(_, settings)| settings.storage.record_size_bytes_max);
        if let Some((index, settings)) = smallest {
            let record = settings.storage.record_size_bytes_max as u64;
            if message + HEADER_SIZE_BYTES > record {
                return Err(blame(
                    message_key,
                    self.storage_key(index, "record_size_bytes_max"),
                    format!(
                        "message_size_bytes_max ({message}) plus the {HEADER_SIZE_BYTES}-byte \
                         header must fit shard {index}'s record_size_bytes_max ({record})"
                    ),
                ));
            }
        }
        if message + HEADER_SIZE_BYTES > topic.segment_size_bytes {
            return Err(blame(
                self.key_of(Scope::TopicDefaults, "message_size_bytes_max"),
                self.key_of(Scope::TopicDefaults, "segment_size_bytes"),
                format!(
                    "message_size_bytes_max ({message}) plus the {HEADER_SIZE_BYTES}-byte header \
                     must fit a segment (segment_size_bytes {})",
                    topic.segment_size_bytes
                ),
            ));
        }
        let frame = config.network.frame_size_bytes_max as u64;
        if frame < message + HEADER_SIZE_BYTES {
            return Err(blame(
                self.key_of(Scope::Network, "frame_size_bytes_max"),
                self.key_of(Scope::TopicDefaults, "message_size_bytes_max"),
                format!(
                    "frame_size_bytes_max ({frame}) must carry the largest message \
                     (message_size_bytes_max {message}) plus the {HEADER_SIZE_BYTES}-byte header"
                ),
            ));
        }
        let partitions = topic.partitions;
        let partitions_max = config.metadata.topic_partitions_max;
        if partitions > partitions_max {
            return Err(blame(
                self.key_of(Scope::TopicDefaults, "partitions"),
                self.key_of(Scope::Metadata, "topic_partitions_max"),
                format!(
                    "partitions ({partitions}) is past the bound on a topic's partitions \
                     (topic_partitions_max {partitions_max}): every topic created with the \
                     defaults would be refused"
                ),
            ));
        }
        // The engine's own rules for a group's settings, so a default it would refuse at topic
        // creation is refused here, at start-up, instead.
        let group = GroupConfig {
            durability: topic.durability,
            segment_size_bytes: topic.segment_size_bytes,
            retention_bytes: topic.retention_bytes,
            retention_ms: topic.retention_ms,
            record_size_bytes_max: topic.message_size_bytes_max + HEADER_SIZE as u32,
            ..GroupConfig::default()
        };
        group.validate().map_err(|error| {
            let reason = match error {
                shoal_engine::Error::Invalid(reason) => reason,
                other => other.to_string(),
            };
            ConfigError::new("topic_defaults", format!("the storage engine refuses it: {reason}"))
        })
    }

    /// `[cluster]`'s rules: at most [`NODES_MAX`] founding nodes; `node` one of them (0 without
    /// `nodes`) or, for a node added later, past them with its addresses in `added_node` (which
    /// needs founders to add to); and addresses every node can bind and every peer and client
    /// can dial. `node` below [`NODES_MAX`] is its key's own bound.
    fn validate_cluster(&self, config: &Config) -> Result<(), ConfigError> {
        let cluster = &config.cluster;
        let count = cluster.nodes.len();
        let node = cluster.node;
        let node_key = || self.key_of(Scope::Cluster, "node");
        let added_key = || {
            let given = self.cluster_added_node.as_ref().expect("added_node comes from a layer");
            given.key.clone()
        };
        if count == 0 {
            if cluster.added_node.is_some() {
                return Err(ConfigError::new(
                    added_key(),
                    "nodes is empty: a one-node cluster cannot grow by added_node (list the \
                     founding nodes in nodes, the same on every node)",
                ));
            }
            if node != 0 {
                return Err(node_key().error(format!(
                    "node {node} of a one-node cluster: nodes is empty, so node must be 0"
                )));
            }
            return Ok(());
        }
        let nodes_key = &self.cluster_nodes.as_ref().expect("nodes come from a layer").key;
        if count > NODES_MAX {
            return Err(ConfigError::new(
                nodes_key,
                format!("{count} nodes: a cluster has at most {NODES_MAX}"),
            ));
        }
        let founding = usize::from(node) < count;
        if founding && cluster.added_node.is_some() {
            return Err(ConfigError::new(
                added_key(),
                format!(
                    "node {node} is one of the founding nodes: added_node is for a node added \
                     later"
                ),
            ));
        }
        if !founding && cluster.added_node.is_none() {
            return Err(node_key().error(format!(
                "node {node} is past the {count} founding nodes: give its addresses in added_node"
            )));
        }
        self.validate_cluster_addresses(config, nodes_key)
    }

    /// The nodes' addresses — the founders', and this node's when it was added later (it must
    /// not clash with them either): no port 0 (a peer or client must know the port), every
    /// shard's bus port within the port range, and no two listeners of the cluster on one IP and
    /// port — every node runs `shards` shards (the bus handshake refuses any other count), so
    /// each takes `shards` bus ports from its base. An error names the node and key at fault:
    /// the later of two nodes whose bus ranges or client addresses clash, the bus whose range
    /// takes a client port — but the added node's client when a founder's bus range takes it,
    /// since the founders' list is the same on every node and never changes.
    fn validate_cluster_addresses(
        &self,
        config: &Config,
        nodes_key: &str,
    ) -> Result<(), ConfigError> {
        let shards = config.shards;
        let cluster = &config.cluster;
        let founders = cluster.nodes.len();
        // (index, node, the key naming it): the founders in order, then the added node.
        let mut known: Vec<(usize, &ClusterNode, String)> = cluster
            .nodes
            .iter()
            .enumerate()
            .map(|(index, node)| (index, node, format!("{nodes_key}[{index}]")))
            .collect();
        if let Some(added) = &cluster.added_node {
            let given = self.cluster_added_node.as_ref().expect("added_node comes from a layer");
            known.push((usize::from(cluster.node), added, given.key.clone()));
        }
        let error = |key: &str, name: &str, reason: String| {
            ConfigError::new(format!("{key}.{name}"), reason)
        };
        let bus_ports = |address: SocketAddr| -> RangeInclusive<u32> {
            u32::from(address.port())..=u32::from(address.port()) + shards - 1
        };
        for (position, (index, node, key)) in known.iter().enumerate() {
            let addresses =
                [("bus", Some(node.bus)), ("client", Some(node.client)), ("kafka", node.kafka)];
            for (name, address) in addresses {
                if address.is_some_and(|address| address.port() == 0) {
                    return Err(error(
                        key,
                        name,
                        "port 0 picks a free port, which no peer or client could know: give the port".into(),
                    ));
                }
            }
            let ports = bus_ports(node.bus);
            if *ports.end() > u32::from(u16::MAX) {
                return Err(error(
                    key,
                    "bus",
                    format!(
                        "shard {} would listen on bus port {}: with {shards} shards the bus base \
                         port may be at most {}",
                        shards - 1,
                        ports.end(),
                        u32::from(u16::MAX) + 1 - shards
                    ),
                ));
            }
            for (other, earlier, _) in known.iter().take(position) {
                let theirs = bus_ports(earlier.bus);
                if same_host(node.bus, earlier.bus)
                    && ports.start() <= theirs.end()
                    && theirs.start() <= ports.end()
                {
                    return Err(error(
                        key,
                        "bus",
                        format!(
                            "bus ports {}..={} overlap node {other}'s ({}..={}) on the same IP: \
                             each node's bus takes one port per shard ({shards}) from its base",
                            ports.start(),
                            ports.end(),
                            theirs.start(),
                            theirs.end()
                        ),
                    ));
                }
                if node.client == earlier.client {
                    return Err(error(
                        key,
                        "client",
                        format!("{} is node {other}'s client address too", node.client),
                    ));
                }
            }
            for (other, any, any_key) in &known {
                if !same_host(node.bus, any.client)
                    || !ports.contains(&u32::from(any.client.port()))
                {
                    continue;
                }
                if *index < founders && *other >= founders {
                    return Err(error(
                        any_key,
                        "client",
                        format!(
                            "client port {} is within node {index}'s bus ports {}..={}",
                            any.client.port(),
                            ports.start(),
                            ports.end()
                        ),
                    ));
                }
                let whose =
                    if other == index { "its own".to_string() } else { format!("node {other}'s") };
                return Err(error(
                    key,
                    "bus",
                    format!(
                        "bus ports {}..={} include {whose} client port {}",
                        ports.start(),
                        ports.end(),
                        any.client.port()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// SQPOLL's rules for shard `index`: a kernel thread busy-polls the shard's ring, so it is
    /// only sensible with cores to spare — the shard pinned to its own CPU and the polling
    /// thread bound to another one that no shard and no other polling thread uses (unbound, the
    /// thread inherits the shard's CPU and spins against it: checked on kernel 6.18).
    fn check_sqpoll(&self, config: &Config, index: u32) -> Result<(), ConfigError> {
        let settings = &config.shard[index as usize];
        let idle_key = || self.storage_key(index, "sqpoll_idle_ms");
        let cpu_key = || self.key_of(Scope::ShardN(index), "sqpoll_cpu");
        let Some(sqpoll_cpu) = settings.tuning.sqpoll_cpu else {
            if settings.tuning.sqpoll_idle_ms == 0 {
                return Ok(());
            }
            let reason = match settings.cpu {
                None => format!(
                    "SQPOLL adds a kernel thread that busy-polls shard {index}'s ring: only \
                     sensible on dedicated cores, so pin the shard first (cpus, or \
                     [shard.{index}] cpu) and give the thread a CPU of its own \
                     ([shard.{index}] sqpoll_cpu), or set 0"
                ),
                Some(cpu) => format!(
                    "SQPOLL needs [shard.{index}] sqpoll_cpu, a CPU for its polling thread: \
                     without it the thread shares the shard's CPU {cpu} and spins against it"
                ),
            };
            return Err(idle_key().error(reason));
        };
        if settings.tuning.sqpoll_idle_ms == 0 {
            return Err(cpu_key().error(
                "SQPOLL is off (sqpoll_idle_ms is 0), so there is no polling thread to place"
                    .into(),
            ));
        }
        let Some(cpu) = settings.cpu else {
            return Err(idle_key().error(format!(
                "SQPOLL is only sensible on dedicated cores: pin shard {index} first (cpus, or \
                 [shard.{index}] cpu)"
            )));
        };
        if let Some(other) = config.shard.iter().position(|s| s.cpu == Some(sqpoll_cpu)) {
            let whose = if other == index as usize { "this shard" } else { "another shard" };
            return Err(cpu_key().error(format!(
                "CPU {sqpoll_cpu} runs shard {other} ({whose}; shard {index} is on CPU {cpu}): \
                 the polling thread needs a CPU no shard uses"
            )));
        }
        let shared = config.shard.iter().enumerate().find(|&(other, s)| {
            other != index as usize
                && s.tuning.sqpoll_idle_ms > 0
                && s.tuning.sqpoll_cpu == Some(sqpoll_cpu)
        });
        if let Some((other, _)) = shared {
            return Err(cpu_key().error(format!(
                "CPU {sqpoll_cpu} already polls shard {other}'s ring: each polling thread needs \
                 a CPU of its own"
            )));
        }
        Ok(())
    }

    /// The replicas' timers: the heartbeat timeout and the lag bound must outlast a commit
    /// interval and a settled group's idle heartbeat interval, or a healthy primary would be
    /// deposed (or its backups flagged) between two of its heartbeats; the idle interval is
    /// never shorter than the commit interval. Compared in the replicas' 10 ms ticks.
    fn validate_replication(&self, config: &Config) -> Result<(), ConfigError> {
        let timers = &config.replication;
        let ticks = |ms: u64| (ms / TICK_MS).max(1);
        let commit = ticks(timers.commit_interval_ms);
        let interval = || self.key_of(Scope::Replication, "commit_interval_ms");
        for (name, value) in [
            ("heartbeat_timeout_ms", timers.heartbeat_timeout_ms),
            ("replica_lag_time_max_ms", timers.replica_lag_time_max_ms),
        ] {
            if ticks(value) <= commit {
                return Err(blame(
                    self.key_of(Scope::Replication, name),
                    interval(),
                    format!(
                        "{name} ({value}) must be longer than commit_interval_ms ({}) by at least \
                         one 10 ms tick",
                        timers.commit_interval_ms
                    ),
                ));
            }
        }
        let idle_key = || self.key_of(Scope::Replication, "idle_heartbeat_interval_ms");
        let idle_ms = timers.idle_heartbeat_interval_ms_resolved();
        if ticks(idle_ms) < commit {
            return Err(blame(
                idle_key(),
                interval(),
                format!(
                    "idle_heartbeat_interval_ms ({idle_ms}) must be at least commit_interval_ms \
                     ({}), or 0 for a quarter of heartbeat_timeout_ms",
                    timers.commit_interval_ms
                ),
            ));
        }
        for (name, value) in [
            ("heartbeat_timeout_ms", timers.heartbeat_timeout_ms),
            ("replica_lag_time_max_ms", timers.replica_lag_time_max_ms),
        ] {
            if ticks(value) <= ticks(idle_ms) {
                return Err(blame(
                    self.key_of(Scope::Replication, name),
                    idle_key(),
                    format!(
                        "{name} ({value}) must be longer than the idle heartbeat interval \
                         ({idle_ms} ms, idle_heartbeat_interval_ms) by at least one 10 ms tick"
                    ),
                ));
            }
        }
        // A node of one has neither view changes nor a bus: the next two rules are a cluster's.
        let clustered = !config.cluster.nodes.is_empty();
        // A view change waits for votes its peers resend once per commit interval: a deadline
        // shorter than two of those moves on to the next view before a lost vote comes again.
        let view_change_ms = timers.view_change_timeout_ms;
        if clustered && ticks(view_change_ms) < 2 * commit {
            return Err(blame(
                self.key_of(Scope::Replication, "view_change_timeout_ms"),
                interval(),
                format!(
                    "view_change_timeout_ms ({view_change_ms}) must be at least twice \
                     commit_interval_ms ({})",
                    timers.commit_interval_ms
                ),
            ));
        }
        // A bus queue takes a prepare only whole: one of the largest record, and its
        // retransmission or repair answer beside it, must fit.
        let largest = (0..config.shards)
            .zip(&config.shard)
            .max_by_key(|(_, settings)| settings.storage.record_size_bytes_max);
        if let Some((index, settings)) = largest.filter(|_| clustered) {
            let record = settings.storage.record_size_bytes_max as u64;
            let queue = config.network.bus_queue_bytes_max;
            if queue < 2 * record {
                return Err(blame(
                    self.key_of(Scope::Network, "bus_queue_bytes_max"),
                    self.storage_key(index, "record_size_bytes_max"),
                    format!(
                        "bus_queue_bytes_max ({queue}) must hold two of shard {index}'s largest \
                         records (record_size_bytes_max {record})"
                    ),
                ));
            }
        }
        // A peer answering a repair round (or serving one read of it) must be able to queue all
        // of it, twice over (two peers may ask at once), or what its bus queue drops is asked
        // again at the deadline.
        let queue_bytes_max = config.network.bus_queue_bytes_max;
        for (name, value) in [
            ("repair_bytes_max", timers.repair_bytes_max),
            ("serve_read_bytes_max", timers.serve_read_bytes_max),
        ] {
            if value > queue_bytes_max / 2 {
                return Err(blame(
                    self.key_of(Scope::Replication, name),
                    self.key_of(Scope::Network, "bus_queue_bytes_max"),
                    format!(
                        "{name} ({value}) must be at most half of bus_queue_bytes_max \
                         ({queue_bytes_max})"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The key that set `name` in `scope`, or its default's dotted name.
    fn key_of(&self, scope: Scope, name: &'static str) -> Written {
        match self.ints.get(&(scope, name)) {
            Some(given) => Written { key: given.key.clone(), given: true },
            None => Written { key: scope.dotted(name), given: false },
        }
    }

    /// The key that set storage key `name` of shard `index`: its `[shard.N]`, else `[shard]`.
    fn storage_key(&self, index: u32, name: &'static str) -> Written {
        let own = self.key_of(Scope::ShardN(index), name);
        if own.given { own } else { self.key_of(Scope::Shard, name) }
    }
}

/// Whether two listeners could be on one host's IP: the same IP, or either unspecified
/// (`0.0.0.0` binds every address of the host).
fn same_host(a: SocketAddr, b: SocketAddr) -> bool {
    a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified()
}

/// A key as an error should name it, and whether the user set it (or it is a default).
#[derive(Clone, Debug)]
struct Written {
    key: String,
    given: bool,
}

impl Written {
    fn error(self, reason: String) -> ConfigError {
        ConfigError::new(self.key, reason)
    }
}

/// An error about a rule between two keys, naming the one the user set (`first` when both or
/// neither were set): the other may be a default the user never thought about.
fn blame(first: Written, second: Written, reason: String) -> ConfigError {
    if !first.given && second.given { second.error(reason) } else { first.error(reason) }
}
