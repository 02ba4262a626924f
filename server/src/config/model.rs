//! The resolved configuration: [`Config`] and its sections, each with its built-in default,
//! and the storage [`Profile`] the shard and topic defaults start from.
//!
//! Plain data: nothing here reads a file, the environment or the command line, and nothing
//! validates (`layers` and `validate` do, before a `Config` exists for anyone else).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use shoal_engine::shard::ShardConfig;
use shoal_engine::superblock::{Durability, GroupConfig};

/// Shards one node runs at most.
pub const SHARDS_MAX: u32 = 256;

/// Everything the server was configured with, resolved and validated.
#[derive(Clone, Debug)]
pub struct Config {
    /// The data directory (absolute once the server has created it).
    pub data_dir: PathBuf,
    /// The native protocol listener (port 0 picks a free port); in a cluster, unless set, this
    /// node's client address.
    pub native_listen: SocketAddr,
    /// Shards on this node.
    pub shards: u32,
    /// The cluster this node belongs to (a one-node cluster without `[cluster] nodes`).
    pub cluster: ClusterConfig,
    /// The storage profile the shard and topic defaults started from (the resolved values are in
    /// `shard` and `topic_defaults`; this only says where they came from).
    pub profile: Profile,
    /// Connection and request limits.
    pub network: NetworkConfig,
    /// The Prometheus endpoint.
    pub metrics: MetricsConfig,
    /// `[kafka]`: the Kafka protocol listener.
    pub kafka: KafkaConfig,
    /// The log.
    pub log: LogConfig,
    /// The metadata state machine.
    pub metadata: MetadataConfig,
    /// `[replication]`: the replicas' timers.
    pub replication: ReplicationConfig,
    /// Settings a topic gets when its creator does not choose.
    pub topic_defaults: TopicDefaults,
    /// One entry per shard, index = shard.
    pub shard: Vec<ShardSettings>,
}

/// `[cluster]`
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Cluster id stamped in every header and superblock (default 1).
    pub id: u64,
    /// This node's index: in `nodes` for a founding node, past them for a node added later
    /// (default 0).
    pub node: u8,
    /// The cluster's founding nodes, in index order; identical on every node and never changed
    /// (nodes added later are in the cluster's metadata). Empty: a one-node cluster (today's
    /// behaviour).
    pub nodes: Vec<ClusterNode>,
    /// This node's own addresses when it was added to a running cluster (`node` past `nodes`):
    /// `nodes` stays the founders' list, so the added node's entry has to come from somewhere
    /// else. None on a founding node (default).
    pub added_node: Option<ClusterNode>,
    /// How often the partition balancer may start a move (`docs/cluster.md`, "The balancer");
    /// 0: off (default). Only the metadata group's primary runs it.
    pub balancer_interval_ms: u64,
}

/// One node of `[cluster] nodes` (or `added_node`): where its peers and its clients reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    /// Replica-bus base address: shard s of this node listens on the base port + s.
    pub bus: SocketAddr,
    /// The native client address clients are told to use (Hello, NotPrimary).
    pub client: SocketAddr,
    /// The Kafka address advertised to Kafka clients (the listener comes in a later issue).
    pub kafka: Option<SocketAddr>,
    /// Optional rack name (≤ 64 bytes, [A-Za-z0-9_.-]).
    pub rack: Option<String>,
}

impl ClusterNode {
    /// Its bus address for shard `shard` (the base port plus the shard); None past the port
    /// range (validation keeps every shard of a configured node within it).
    pub fn bus_address(&self, shard: u32) -> Option<SocketAddr> {
        let mut address = self.bus;
        address.set_port(u16::try_from(u32::from(address.port()) + shard).ok()?);
        Some(address)
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            id: 1,
            node: 0,
            nodes: Vec::new(),
            added_node: None,
            balancer_interval_ms: 0,
        }
    }
}

impl ClusterConfig {
    /// The founding nodes: `nodes.len()`, or 1 (this node) when `nodes` is empty.
    pub fn founders(&self) -> u8 {
        // Validation keeps the list within NODES_MAX (32).
        u8::try_from(self.nodes.len().max(1)).expect("at most 32 nodes")
    }

    /// This node's entry: from `nodes` for a founding node, `added_node` for one added later;
    /// None for a one-node cluster.
    pub fn own_node(&self) -> Option<&ClusterNode> {
        self.entry(self.node)
    }

    /// Node `node`'s bus address for shard `shard` (base port + shard); None for a one-node
    /// cluster, a node this configuration does not know (a node added later, other than this
    /// one) or a shard past the port range (validation keeps every shard of this node's and the
    /// founders' within it).
    pub fn bus_address(&self, node: u8, shard: u32) -> Option<SocketAddr> {
        self.entry(node)?.bus_address(shard)
    }

    /// Node `node`'s entry: a founding node's from `nodes`, this node's from `added_node` when
    /// it was added later. Other added nodes' addresses are in the cluster's metadata, not here.
    pub fn entry(&self, node: u8) -> Option<&ClusterNode> {
        match self.nodes.get(usize::from(node)) {
            Some(founder) => Some(founder),
            // A one-node cluster has no entries at all, even with an `added_node` that
            // validation is about to refuse.
            None if node == self.node && !self.nodes.is_empty() => self.added_node.as_ref(),
            None => None,
        }
    }
}

/// The text form of one node, as `SHOAL_CLUSTER_NODES` and `--cluster-nodes` take it
/// (`bus=IP:PORT,client=IP:PORT[,kafka=IP:PORT][,rack=NAME]`; nodes are joined by `;`) and
/// `SHOAL_CLUSTER_ADDED_NODE` and `--cluster-added-node` take one.
impl fmt::Display for ClusterNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bus={},client={}", self.bus, self.client)?;
        if let Some(kafka) = self.kafka {
            write!(f, ",kafka={kafka}")?;
        }
        if let Some(rack) = &self.rack {
            write!(f, ",rack={rack}")?;
        }
        Ok(())
    }
}

/// Connection and request limits (the same on every shard).
#[derive(Clone, Copy, Debug)]
pub struct NetworkConfig {
    /// Open client connections (native and Kafka) per node; one more is refused.
    pub connections_max: usize,
    /// Largest frame (header plus body) a client may send.
    pub frame_size_bytes_max: usize,
    /// Requests one connection may have unanswered; the server stops reading it beyond that.
    pub requests_in_flight_max: usize,
    /// Work items a shard's inbox holds (local and forwarded requests).
    pub shard_inbox_max: usize,
    /// Longest a fetch may wait for new data (long-poll); a longer wait is refused.
    pub fetch_wait_ms_max: u32,
    /// A client connection (native or Kafka) with nothing to answer that sends nothing for
    /// this long is closed (Kafka's `connections.max.idle.ms`); 0: never.
    pub idle_timeout_ms: u32,
    /// Fetches a shard holds waiting for new data; one more is answered at once (empty).
    pub fetch_parked_max: usize,
    /// Replica packets queued per peer on each shard's bus at most; beyond, new ones are dropped
    /// and counted (VSR retransmits).
    pub bus_queue_packets_max: usize,
    /// Bytes of replica packets queued per peer on each shard's bus at most (the packet bound
    /// alone would let large prepares take `bus_queue_packets_max` times the message size).
    pub bus_queue_bytes_max: u64,
    /// Each shard's own listener: shard i on this IP and port + i (port 0: each shard picks a
    /// free port); `None`: only the shared `native_listen`.
    pub shard_listen: Option<SocketAddr>,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            connections_max: 1024,
            frame_size_bytes_max: (1 << 20) + (64 << 10),
            requests_in_flight_max: 256,
            shard_inbox_max: 4096,
            fetch_wait_ms_max: 30_000,
            // Kafka's default (10 minutes).
            idle_timeout_ms: 600_000,
            fetch_parked_max: 4096,
            bus_queue_packets_max: 4096,
            bus_queue_bytes_max: 64 << 20,
            shard_listen: None,
        }
    }
}

impl NetworkConfig {
    /// The shard listener setting as written: `IP:PORT` or `off`.
    pub fn shard_listen_text(&self) -> String {
        self.shard_listen.map_or_else(|| "off".to_string(), |address| address.to_string())
    }

    /// Where shard `index` listens on its own (`None`: per-shard listeners are off). Validation
    /// keeps base port + index within the port range.
    pub fn shard_listen_address(&self, index: u32) -> Option<SocketAddr> {
        let mut address = self.shard_listen?;
        if address.port() != 0 {
            let port = u32::from(address.port()) + index;
            address.set_port(u16::try_from(port).unwrap_or(u16::MAX));
        }
        Some(address)
    }
}

/// `[replication]`: how fast a cluster notices a lost primary and replaces it
/// (`docs/cluster.md`, "Timeouts"). Every node of a cluster should run the same values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicationConfig {
    /// The primary's commit broadcast, which doubles as the heartbeat.
    pub commit_interval_ms: u64,
    /// The heartbeat's interval while a group is settled (nothing in flight, every backup
    /// holding the head and the commit point): an idle group's heartbeats only prove its
    /// primary alive. 0: a quarter of `heartbeat_timeout_ms` or `replica_lag_time_max_ms`,
    /// whichever is shorter, and at least `commit_interval_ms`
    /// ([`ReplicationConfig::idle_heartbeat_interval_ms_resolved`]).
    pub idle_heartbeat_interval_ms: u64,
    /// A backup that hears nothing from its primary this long votes for a view change (plus a
    /// random extra of up to half of it).
    pub heartbeat_timeout_ms: u64,
    /// A view change that has not started its view after this long moves on to the next view.
    pub view_change_timeout_ms: u64,
    /// A restarted replica asks for the current view this often.
    pub start_view_probe_interval_ms: u64,
    /// A backup not caught up for this long is lagging; silent this long, dead (Kafka's
    /// `replica.lag.time.max.ms`).
    pub replica_lag_time_max_ms: u64,
    /// A group led away from its home node (its view-0 primary, say while that node was down)
    /// is handed back once the home has been in sync this long (Kafka's preferred-leader
    /// election); 0: never.
    pub primary_return_ms: u64,
    /// The repair ration (`docs/cluster.md`, "Catching up"): prepares one repair round asks a
    /// peer for at most; each group starts at most one round per 10 ms tick.
    pub repair_prepares_max: u64,
    /// Bytes of prepares one repair round asks for at most (by their headers' sizes); at most
    /// half of `[network] bus_queue_bytes_max`, so the answering peer can queue a whole round.
    pub repair_bytes_max: u64,
    /// Repair rounds a shard lets its groups start per tick, all groups together.
    pub repair_rounds_per_tick_max: u64,
    /// Repair rounds a shard has in flight at most, all groups together (bounds the bodies on
    /// their way to it: this times `repair_prepares_max` prepares).
    pub repair_rounds_in_flight_max: u64,
    /// Bytes a shard's backups ask peers for in repair rounds per second, on average, all
    /// groups together; 0: no bound (Redpanda's `raft_learner_recovery_rate`, per shard).
    pub repair_bytes_per_second_max: u64,
    /// Disk reads a shard runs for its peers' repair at once, at most: they run beside the
    /// shard's loop, and this bounds the disk and memory they take from its clients.
    pub serve_reads_in_flight_max: u64,
    /// Bytes of prepares one of those reads gathers at most (a run of ops one peer asked for);
    /// at most half of `[network] bus_queue_bytes_max`, like `repair_bytes_max`.
    pub serve_read_bytes_max: u64,
}

impl ReplicationConfig {
    /// `idle_heartbeat_interval_ms`, with 0 resolved: four heartbeats per heartbeat timeout
    /// and per lag bound (whichever is shorter), never more often than the commit interval.
    pub fn idle_heartbeat_interval_ms_resolved(&self) -> u64 {
        match self.idle_heartbeat_interval_ms {
            0 => (self.heartbeat_timeout_ms.min(self.replica_lag_time_max_ms) / 4)
                .max(self.commit_interval_ms),
            ms => ms,
        }
    }
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        ReplicationConfig {
            commit_interval_ms: 100,
            idle_heartbeat_interval_ms: 0,
            heartbeat_timeout_ms: 1_000,
            view_change_timeout_ms: 2_000,
            start_view_probe_interval_ms: 200,
            replica_lag_time_max_ms: 30_000,
            primary_return_ms: 10_000,
            repair_prepares_max: 128,
            repair_bytes_max: 8 << 20,
            repair_rounds_per_tick_max: 8,
            repair_rounds_in_flight_max: 32,
            repair_bytes_per_second_max: 0,
            serve_reads_in_flight_max: 8,
            serve_read_bytes_max: 2 << 20,
        }
    }
}

/// The Prometheus text endpoint (`docs/metrics.md`).
#[derive(Clone, Copy, Debug)]
pub struct MetricsConfig {
    /// Where shard 0 serves `GET /metrics` (port 0 picks a free port); `None`: no endpoint.
    pub listen: Option<SocketAddr>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        // 9464 is the port Prometheus exporters of OpenTelemetry use; loopback only, like the
        // native listener, until the operator opens it.
        MetricsConfig { listen: Some(SocketAddr::from(([127, 0, 0, 1], 9464))) }
    }
}

impl MetricsConfig {
    /// The listen setting as written: `IP:PORT` or `off`.
    pub fn listen_text(&self) -> String {
        self.listen.map_or_else(|| "off".to_string(), |address| address.to_string())
    }
}

/// `[kafka]`
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaConfig {
    /// Where every shard accepts Kafka clients (port 0 picks a free port); `None`: no Kafka
    /// listener. In a cluster, unless set, the node's `kafka` address from `[cluster] nodes`.
    pub listen: Option<SocketAddr>,
    /// The Shoal stream whose topics are the Kafka topics (Kafka has one flat namespace).
    pub stream: String,
    /// How long a new Kafka consumer group waits for more members before its first generation
    /// (Kafka's `group.initial.rebalance.delay.ms`): fewer rebalances when a group starts.
    pub group_initial_rebalance_delay_ms: u32,
    /// Whether Metadata creates a topic a client names that does not exist (with the
    /// `[topic_defaults]`), as Kafka's `auto.create.topics.enable`.
    pub auto_create_topics: bool,
    /// The most bytes of batches one Fetch response carries, whatever the request asks (Kafka's
    /// broker `fetch.max.bytes`): a partition's first batch may pass it, so that a consumer
    /// always progresses, and no partition's batches are added once it is spent.
    pub fetch_bytes_max: u32,
}

/// The bounds of `[kafka] fetch_bytes_max`: at most 512 MiB, so that a response (the bound,
/// plus one partition's batches past it, plus the partitions' fields) stays under Kafka's
/// 2 GiB frame.
pub const KAFKA_FETCH_BYTES_MIN: u32 = 1 << 10;
pub const KAFKA_FETCH_BYTES_MAX: u32 = 512 << 20;

/// The longest `[kafka] group_initial_rebalance_delay_ms`.
pub const GROUP_INITIAL_REBALANCE_DELAY_MS_MAX: u32 = 300_000;

impl Default for KafkaConfig {
    fn default() -> Self {
        // 9092 is where Kafka clients look first; loopback only until the operator opens it.
        KafkaConfig {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 9092))),
            stream: "kafka".to_string(),
            // Kafka's default.
            group_initial_rebalance_delay_ms: 3_000,
            // Kafka 4 recommends it off: a typo should not become a topic.
            auto_create_topics: false,
            // Kafka's broker default (55 MiB).
            fetch_bytes_max: 57_671_680,
        }
    }
}

impl KafkaConfig {
    /// The listen setting as written: `IP:PORT` or `off`.
    pub fn listen_text(&self) -> String {
        self.listen.map_or_else(|| "off".to_string(), |address| address.to_string())
    }
}

/// The metadata state machine (shard 0's metadata group).
#[derive(Clone, Copy, Debug)]
pub struct MetadataConfig {
    /// Committed metadata ops between two snapshots of the metadata state: restart replays at
    /// most about this many ops of the metadata log.
    pub snapshot_interval_ops: u64,
    /// Sessions the client table keeps; registering one more expires the least recently used.
    pub sessions_max: usize,
    /// Partitions one topic may have (each is a group on some shard, within `groups_max`).
    pub topic_partitions_max: u32,
    /// The metadata log is kept at most about this big (0: all of it): retention deletes its
    /// oldest sealed segments once a metadata snapshot covers them.
    pub retention_bytes: u64,
    /// Segment size of the metadata log, fixed when the metadata group is created.
    pub segment_size_bytes: u64,
}

impl Default for MetadataConfig {
    fn default() -> Self {
        MetadataConfig {
            snapshot_interval_ops: 1024,
            sessions_max: 4096,
            topic_partitions_max: 10_000,
            retention_bytes: 256 << 20,
            segment_size_bytes: 8 << 20,
        }
    }
}

/// The structured log on stderr.
#[derive(Clone, Debug)]
pub struct LogConfig {
    /// What is logged: a level (`info`) or comma-separated directives (`warn,shoal_server=debug`),
    /// already checked by [`log_filter`](crate::config::log_filter).
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { level: "info".to_string() }
    }
}

/// Topic settings used when a create request leaves them at zero.
#[derive(Clone, Copy, Debug)]
pub struct TopicDefaults {
    /// Partitions of a new topic.
    pub partitions: u32,
    /// How appends become durable.
    pub durability: Durability,
    /// Segment roll size.
    pub segment_size_bytes: u64,
    /// Size-based retention (0: keep everything).
    pub retention_bytes: u64,
    /// Age-based retention (0: keep everything).
    pub retention_ms: u64,
    /// Largest batch a producer may send.
    pub message_size_bytes_max: u32,
}

impl Default for TopicDefaults {
    fn default() -> Self {
        TopicDefaults {
            partitions: 1,
            durability: Durability::Replicated,
            segment_size_bytes: 1 << 30,
            retention_bytes: 0,
            retention_ms: 0,
            message_size_bytes_max: 1 << 20,
        }
    }
}

/// One shard's settings.
#[derive(Clone, Debug)]
pub struct ShardSettings {
    /// The CPU this shard's thread is pinned to (`None`: not pinned).
    pub cpu: Option<usize>,
    /// The shard's storage engine settings (cluster, shard index and count filled in).
    pub storage: ShardConfig,
    /// What the server itself does differently on this shard: its ring, its I/O mode, its
    /// group commit, its new partitions' segment age.
    pub tuning: ShardTuning,
}

/// A shard's settings that are the server's, not the engine's `ShardConfig`: how its io_uring
/// ring is built, whether its files use direct I/O, how long its loop may hold writes back to
/// gather a larger flush cycle, and how partitions created on it roll their segments by age.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardTuning {
    /// Submission queue entries of the shard's io_uring ring (a power of two).
    pub uring_entries: u32,
    /// SQPOLL: a kernel thread polls the ring's submission queue and sleeps after this many idle
    /// milliseconds (0: off, submissions are system calls).
    pub sqpoll_idle_ms: u32,
    /// The CPU the SQPOLL thread is bound to (`[shard.N]` only; required with SQPOLL, since the
    /// thread would otherwise inherit the shard's own CPU and spin against it).
    pub sqpoll_cpu: Option<usize>,
    /// Segment and journal files use O_DIRECT where the filesystem allows (false: buffered I/O,
    /// through the page cache).
    pub direct_io: bool,
    /// Group commit: how long the shard may hold the writes that arrived since its last I/O
    /// round, counted from the first of them, before it hands them to a flush cycle (0: at once).
    pub flush_delay_us_max: u32,
    /// Partitions created on this shard roll their active segment once its first record is this
    /// old (0: never by age). Recorded in each partition's superblock slot at creation.
    pub segment_age_ms_max: u64,
}

impl Default for ShardTuning {
    fn default() -> Self {
        ShardTuning {
            // What the shard's runtime was built with before the key existed: deep enough for a
            // flush cycle's writes (1 MiB pieces) plus the connections' reads and writes.
            uring_entries: 256,
            sqpoll_idle_ms: 0,
            sqpoll_cpu: None,
            direct_io: true,
            flush_delay_us_max: 0,
            segment_age_ms_max: GroupConfig::default().segment_age_ms_max,
        }
    }
}

/// The base storage sizes (`profile`): the engine's `ShardConfig::default()` or
/// `ShardConfig::small()`, with matching topic defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// Production sizes.
    Default,
    /// Test sizes: small journal, rings, chunks and segments.
    Small,
}

impl Profile {
    /// The name used in the file, the environment and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Default => "default",
            Profile::Small => "small",
        }
    }

    pub(super) fn parse(text: &str) -> Option<Profile> {
        match text {
            "default" => Some(Profile::Default),
            "small" => Some(Profile::Small),
            _ => None,
        }
    }
}

impl Config {
    /// The defaults: `shards` shards with the production (or, with `small`, the test) storage
    /// profile, no pinning.
    pub fn defaults(shards: u32, small: bool) -> Config {
        let base = if small {
            ShardConfig::small()
        } else {
            // Sized for the data directory's disk and the machine's memory when the shard
            // opens (`ready_budget_bytes`, `batch_cache_bytes`).
            ShardConfig { ready_budget_bytes: 0, batch_cache_bytes: 0, ..ShardConfig::default() }
        };
        let mut topic_defaults = TopicDefaults::default();
        if small {
            topic_defaults.segment_size_bytes = 8 << 20;
            topic_defaults.message_size_bytes_max = 60 << 10;
        }
        Config {
            data_dir: PathBuf::from("shoal-data"),
            native_listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            shards,
            cluster: ClusterConfig::default(),
            profile: if small { Profile::Small } else { Profile::Default },
            network: NetworkConfig::default(),
            metrics: MetricsConfig::default(),
            kafka: KafkaConfig::default(),
            log: LogConfig::default(),
            metadata: MetadataConfig::default(),
            replication: ReplicationConfig::default(),
            topic_defaults,
            shard: (0..shards)
                .map(|index| ShardSettings {
                    cpu: None,
                    storage: ShardConfig { shard: index, shard_count: shards, ..base.clone() },
                    tuning: ShardTuning::default(),
                })
                .collect(),
        }
    }
}
