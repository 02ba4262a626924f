//! The server's effective configuration: what the config file, the `SHOAL_*` environment and the
//! command-line flags resolve to, validated once at start-up (`docs/configuration.md` lists every
//! key).
//!
//! It owns the keys (one table per section, which the file, the environment and the flags all go
//! through, so a key has one name, one bound and one env variable), the defaults, the resolution
//! order — built-in defaults, then the file, then `SHOAL_*` variables, then flags, later winning
//! key by key; a `[shard.N]` key beats the same `[shard]` key (and `cpus`) from any layer — and
//! every validation rule. `[shard]` holds two tables of keys: the engine's `ShardConfig` fields
//! and the server's own per-shard `ShardTuning` (ring, SQPOLL, direct I/O, group-commit delay,
//! new partitions' segment age). An error names the key as the user wrote it
//! (`topic_defaults.segment_size_bytes`, `SHOAL_NETWORK_CONNECTIONS_MAX`, `--shards`) and the
//! reason.
//!
//! It never reads a file, the environment or the machine's CPU list itself (`main` passes their
//! contents in, so tests drive it with plain strings) and never touches the data directory. A shard
//! receives an already-resolved [`Config`] and never reads a file or the environment itself.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use shoal_engine::ring::RingLimits;
use shoal_engine::shard::ShardConfig;
use shoal_engine::storage::BLOCK_SIZE_BYTES;
use shoal_engine::superblock::{
    Durability, GroupConfig, SEGMENT_SIZE_BYTES_MAX, SEGMENT_SIZE_BYTES_MIN,
};
use shoal_engine::wire::HEADER_SIZE;

/// Shards one node runs at most.
pub const SHARDS_MAX: u32 = 256;
/// Largest CPU id a shard may be pinned to.
const CPU_ID_MAX: u64 = 65_535;
/// Largest value a TOML integer holds, so every bound (and every printed value) fits one.
const TOML_INT_MAX: u64 = i64::MAX as u64;
/// The wire header in front of every record and every frame.
const HEADER_SIZE_BYTES: u64 = HEADER_SIZE as u64;

// Sizes are read as u64 and stored in the engine's usize fields; the server only runs on 64-bit
// Linux (io_uring), where that never truncates.
const _: () = assert!(usize::BITS == 64);

/// Everything the server was configured with, resolved and validated.
#[derive(Clone, Debug)]
pub struct Config {
    /// The data directory (absolute once the server has created it).
    pub data_dir: PathBuf,
    /// The native protocol listener (port 0 picks a free port).
    pub native_listen: SocketAddr,
    /// Shards on this node.
    pub shards: u32,
    /// The storage profile the shard and topic defaults started from (the resolved values are in
    /// `shard` and `topic_defaults`; this only says where they came from).
    pub profile: Profile,
    /// Connection and request limits.
    pub network: NetworkConfig,
    /// The Prometheus endpoint.
    pub metrics: MetricsConfig,
    /// The log.
    pub log: LogConfig,
    /// The metadata state machine.
    pub metadata: MetadataConfig,
    /// Settings a topic gets when its creator does not choose.
    pub topic_defaults: TopicDefaults,
    /// One entry per shard, index = shard.
    pub shard: Vec<ShardSettings>,
}

/// Connection and request limits (the same on every shard).
#[derive(Clone, Copy, Debug)]
pub struct NetworkConfig {
    /// Open native connections per node; one more is refused with `LimitReached`.
    pub connections_max: usize,
    /// Largest frame (header plus body) a client may send.
    pub frame_size_bytes_max: usize,
    /// Requests one connection may have unanswered; the server stops reading it beyond that.
    pub requests_in_flight_max: usize,
    /// Work items a shard's inbox holds (local and forwarded requests).
    pub shard_inbox_max: usize,
    /// Longest a fetch may wait for new data (long-poll); a longer wait is refused.
    pub fetch_wait_ms_max: u32,
    /// Fetches a shard holds waiting for new data; one more is answered at once (empty).
    pub fetch_parked_max: usize,
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
            fetch_parked_max: 4096,
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

/// The metadata state machine (shard 0's metadata group).
#[derive(Clone, Copy, Debug)]
pub struct MetadataConfig {
    /// Committed metadata ops between two snapshots of the metadata state: restart replays at
    /// most about this many ops of the metadata log.
    pub snapshot_interval_ops: u64,
    /// Sessions the client table keeps; registering one more expires the least recently used.
    pub sessions_max: usize,
}

impl Default for MetadataConfig {
    fn default() -> Self {
        MetadataConfig { snapshot_interval_ops: 1024, sessions_max: 4096 }
    }
}

/// The structured log on stderr.
#[derive(Clone, Debug)]
pub struct LogConfig {
    /// What is logged: a level (`info`) or comma-separated directives (`warn,shoal_server=debug`),
    /// already checked by [`log_filter`].
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { level: "info".to_string() }
    }
}

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

    fn parse(text: &str) -> Option<Profile> {
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
        let base = if small { ShardConfig::small() } else { ShardConfig::default() };
        let mut topic_defaults = TopicDefaults::default();
        if small {
            topic_defaults.segment_size_bytes = 8 << 20;
            topic_defaults.message_size_bytes_max = 60 << 10;
        }
        Config {
            data_dir: PathBuf::from("shoal-data"),
            native_listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            shards,
            profile: if small { Profile::Small } else { Profile::Default },
            network: NetworkConfig::default(),
            metrics: MetricsConfig::default(),
            log: LogConfig::default(),
            metadata: MetadataConfig::default(),
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

    /// The effective configuration as JSON (the admin command returns it): every key resolved,
    /// one object per shard (no `[shard]`/`[shard.N]` inheritance left to work out).
    pub fn to_json(&self) -> serde_json::Value {
        let mut network = serde_json::Map::new();
        for key in &NETWORK_KEYS {
            network.insert(key.name.into(), (key.get)(&self.network).into());
        }
        network.insert("shard_listen".into(), self.network.shard_listen_text().into());
        let mut topic_defaults = serde_json::Map::new();
        for key in &TOPIC_KEYS {
            topic_defaults.insert(key.name.into(), (key.get)(&self.topic_defaults).into());
            if key.name == "partitions" {
                topic_defaults.insert(
                    "durability".into(),
                    durability_name(self.topic_defaults.durability).into(),
                );
            }
        }
        let mut metadata = serde_json::Map::new();
        for key in &METADATA_KEYS {
            metadata.insert(key.name.into(), (key.get)(&self.metadata).into());
        }
        let shard: Vec<serde_json::Value> = self
            .shard
            .iter()
            .enumerate()
            .map(|(index, settings)| {
                let mut object = serde_json::Map::new();
                object.insert("index".into(), index.into());
                object.insert("cpu".into(), settings.cpu.into());
                object.insert("sqpoll_cpu".into(), settings.tuning.sqpoll_cpu.into());
                let json = |name: &str, value: u64| -> serde_json::Value {
                    if is_bool_key(name) { (value != 0).into() } else { value.into() }
                };
                for key in &STORAGE_KEYS {
                    object.insert(key.name.into(), json(key.name, (key.get)(&settings.storage)));
                }
                for key in &TUNING_KEYS {
                    object.insert(key.name.into(), json(key.name, (key.get)(&settings.tuning)));
                }
                object.into()
            })
            .collect();
        serde_json::json!({
            "data_dir": self.data_dir.to_string_lossy(),
            "native_listen": self.native_listen.to_string(),
            "shards": self.shards,
            "profile": self.profile.as_str(),
            "network": network,
            "metrics": { "listen": self.metrics.listen_text() },
            "log": { "level": self.log.level },
            "metadata": metadata,
            "topic_defaults": topic_defaults,
            "shard": shard,
        })
    }

    /// The effective configuration as a config file (`shoal --print-config`): loaded back as-is
    /// it resolves to this configuration again. `[shard]` holds shard 0's storage settings and
    /// each `[shard.N]` only what differs from them.
    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        let mut line = |text: String| {
            out.push_str(&text);
            out.push('\n');
        };
        line("# The effective shoal configuration (shoal --print-config).".into());
        line(format!("data_dir = {}", quoted(&self.data_dir.to_string_lossy())));
        line(format!("native_listen = {}", quoted(&self.native_listen.to_string())));
        line(format!("shards = {}", self.shards));
        line(format!("profile = {}", quoted(self.profile.as_str())));
        // A list when every shard is pinned; otherwise "none" plus a `cpu` per pinned shard, so
        // that loading the output back never falls into the default placement.
        let all_pinned: Option<Vec<String>> =
            self.shard.iter().map(|s| s.cpu.map(|cpu| cpu.to_string())).collect();
        let cpus = all_pinned.as_ref().map_or_else(|| "none".to_string(), |list| list.join(","));
        line(format!("cpus = {}", quoted(&cpus)));
        line(String::new());
        line("[network]".into());
        for key in &NETWORK_KEYS {
            line(format!("{} = {}", key.name, (key.get)(&self.network)));
        }
        line(format!("shard_listen = {}", quoted(&self.network.shard_listen_text())));
        line(String::new());
        line("[metrics]".into());
        line(format!("listen = {}", quoted(&self.metrics.listen_text())));
        line(String::new());
        line("[log]".into());
        line(format!("level = {}", quoted(&self.log.level)));
        line(String::new());
        line("[metadata]".into());
        for key in &METADATA_KEYS {
            line(format!("{} = {}", key.name, (key.get)(&self.metadata)));
        }
        line(String::new());
        line("[topic_defaults]".into());
        for key in &TOPIC_KEYS {
            line(format!("{} = {}", key.name, (key.get)(&self.topic_defaults)));
            if key.name == "partitions" {
                line(format!(
                    "durability = {}",
                    quoted(durability_name(self.topic_defaults.durability))
                ));
            }
        }
        let Some(first) = self.shard.first() else {
            return out;
        };
        line(String::new());
        line("[shard]".into());
        for key in &STORAGE_KEYS {
            line(format!("{} = {}", key.name, key_text(key, &first.storage)));
        }
        for key in &TUNING_KEYS {
            line(format!("{} = {}", key.name, key_text(key, &first.tuning)));
        }
        for (index, settings) in self.shard.iter().enumerate() {
            let mut lines = Vec::new();
            if all_pinned.is_none()
                && let Some(cpu) = settings.cpu
            {
                lines.push(format!("cpu = {cpu}"));
            }
            if let Some(cpu) = settings.tuning.sqpoll_cpu {
                lines.push(format!("sqpoll_cpu = {cpu}"));
            }
            for key in &STORAGE_KEYS {
                if (key.get)(&settings.storage) != (key.get)(&first.storage) {
                    lines.push(format!("{} = {}", key.name, key_text(key, &settings.storage)));
                }
            }
            for key in &TUNING_KEYS {
                if (key.get)(&settings.tuning) != (key.get)(&first.tuning) {
                    lines.push(format!("{} = {}", key.name, key_text(key, &settings.tuning)));
                }
            }
            if !lines.is_empty() {
                line(String::new());
                line(format!("[shard.{index}]"));
                lines.into_iter().for_each(&mut line);
            }
        }
        out
    }
}

/// A shard's settings by their `[shard]` key names, in the tables' order — the engine's storage
/// settings, then the server's tuning (the boolean keys as 0 or 1) — so the metrics endpoint can
/// show each as a gauge and a `[shard.N]` override can be seen at work.
pub fn shard_settings(settings: &ShardSettings) -> impl Iterator<Item = (&'static str, u64)> + '_ {
    let storage = STORAGE_KEYS.iter().map(move |key| (key.name, (key.get)(&settings.storage)));
    storage.chain(TUNING_KEYS.iter().map(move |key| (key.name, (key.get)(&settings.tuning))))
}

/// An invalid setting: the key as the user wrote it, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// `topic_defaults.segment_size_bytes`, `shard.2.cpu`, `SHOAL_SHARDS`, `--shards`, or the
    /// config file's path when the file itself cannot be read or parsed.
    pub key: String,
    /// What is wrong and, where it helps, what would be right.
    pub reason: String,
}

impl ConfigError {
    /// An error about `key`.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError { key: key.into(), reason: reason.into() }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// What the command line asked for.
#[derive(Debug, Default)]
pub struct Args {
    /// `--config FILE`.
    pub config_file: Option<PathBuf>,
    /// `--print-config`: print the effective configuration and exit.
    pub print_config: bool,
    /// `--help`.
    pub help: bool,
    /// The setting flags in the order given, as (flag, value); a repeated flag: the last wins.
    pub settings: Vec<(&'static str, String)>,
}

/// The flags that set a key, and the key each sets.
const FLAGS: [(&str, Scope, &str); 7] = [
    ("--data-dir", Scope::Server, "data_dir"),
    ("--listen", Scope::Server, "native_listen"),
    ("--shards", Scope::Server, "shards"),
    ("--cpus", Scope::Server, "cpus"),
    ("--profile", Scope::Server, "profile"),
    ("--metrics-listen", Scope::Metrics, "listen"),
    ("--log-level", Scope::Log, "level"),
];

/// Splits the command line (without the program name) into [`Args`]. Takes `--flag VALUE` and
/// `--flag=VALUE`; values are checked later, by [`Layers::flag`].
pub fn parse_args(words: impl IntoIterator<Item = String>) -> Result<Args, ConfigError> {
    let mut args = Args::default();
    let mut words = words.into_iter();
    while let Some(word) = words.next() {
        let (flag, inline) = match word.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_string(), Some(value)),
            _ => (word.clone(), None),
        };
        match flag.as_str() {
            "--help" | "-h" | "--print-config" => {
                if inline.is_some() {
                    return Err(ConfigError::new(flag, "takes no value"));
                }
                if flag == "--print-config" {
                    args.print_config = true;
                } else {
                    args.help = true;
                }
            }
            _ => {
                let Some(known) = FLAGS
                    .iter()
                    .map(|&(known, _, _)| known)
                    .chain(["--config"])
                    .find(|&known| known == flag)
                else {
                    let reason = if flag.starts_with('-') {
                        "unknown flag (shoal --help lists them)"
                    } else {
                        "unexpected argument (shoal takes flags only; see shoal --help)"
                    };
                    return Err(ConfigError::new(flag, reason));
                };
                let value = match inline {
                    Some(value) => value.to_string(),
                    None => words.next().ok_or_else(|| ConfigError::new(known, "needs a value"))?,
                };
                if known == "--config" {
                    args.config_file = Some(PathBuf::from(value));
                } else {
                    args.settings.push((known, value));
                }
            }
        }
    }
    Ok(args)
}

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
    data_dir: Option<Given<PathBuf>>,
    native_listen: Option<Given<SocketAddr>>,
    metrics_listen: Option<Given<Option<SocketAddr>>>,
    shard_listen: Option<Given<Option<SocketAddr>>>,
    log_level: Option<Given<String>>,
    shards: Option<Given<u32>>,
    profile: Option<Given<Profile>>,
    cpus: Option<Given<Placement>>,
    durability: Option<Given<Durability>>,
    /// Every integer key (network, topic defaults, shard storage and tuning, per-shard `cpu`),
    /// and the boolean shard keys as 0 or 1.
    ints: BTreeMap<(Scope, &'static str), Given<u64>>,
    /// The `[shard.N]` tables of the file, even empty ones, with the key that names each.
    shard_tables: BTreeMap<u32, String>,
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

    /// Applies one setting flag (`--shards`, ...) from [`Args::settings`].
    pub fn flag(&mut self, flag: &str, value: &str) -> Result<(), ConfigError> {
        let Some(&(flag, scope, key)) = FLAGS.iter().find(|(known, _, _)| *known == flag) else {
            return Err(ConfigError::new(flag, "unknown flag (shoal --help lists them)"));
        };
        self.set(scope, key, Raw::Text(value), flag.to_string())
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
        if let Some(native_listen) = &self.native_listen {
            config.native_listen = native_listen.value;
        }
        if let Some(listen) = &self.metrics_listen {
            config.metrics.listen = listen.value;
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
        Ok(Resolved { config, warnings })
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
        Ok(cpus)
    }

    /// The rules that tie keys together (each key's own bounds were checked when it was set).
    /// When a rule between two keys breaks, the error names the one the user set.
    fn validate(&self, config: &Config) -> Result<(), ConfigError> {
        let block = BLOCK_SIZE_BYTES as u64;
        for (index, settings) in (0..config.shards).zip(&config.shard) {
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
        }

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
            (Scope::Metrics, "listen") => {
                let text = raw.text().map_err(error)?;
                let listen = if text == "off" {
                    None
                } else {
                    Some(text.parse().map_err(|_| {
                        error(format!(
                            "{text:?} is not an IP address and port, e.g. 127.0.0.1:9464, or \"off\""
                        ))
                    })?)
                };
                self.metrics_listen = Some(Given { value: listen, key: written });
            }
            (Scope::Network, "shard_listen") => {
                let text = raw.text().map_err(error)?;
                let listen = if text == "off" {
                    None
                } else {
                    Some(text.parse().map_err(|_| {
                        error(format!(
                            "{text:?} is not an IP address and port, e.g. 127.0.0.1:7100, or \
                             \"off\""
                        ))
                    })?)
                };
                self.shard_listen = Some(Given { value: listen, key: written });
            }
            (Scope::Shard | Scope::ShardN(_), name)
                if let Some(name) = BOOL_KEYS.iter().find(|key| **key == name) =>
            {
                let value = raw.bool().map_err(error)?;
                self.ints.insert((scope, name), Given { value: u64::from(value), key: written });
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
                let durability = match text {
                    "replicated" => Durability::Replicated,
                    "persisted" => Durability::Persisted,
                    _ => {
                        return Err(error(format!(
                            "{text:?}: use \"replicated\" or \"persisted\""
                        )));
                    }
                };
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
struct Given<T> {
    value: T,
    key: String,
}

/// A key as an error should name it, and whether the user set it (or it is a default).
#[derive(Debug)]
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

/// A top-level key set both bare and under `[server]`, named by its `[server]` spelling (the
/// table's key order decides which of the two is met first).
fn twice(key: &str) -> ConfigError {
    ConfigError::new(format!("server.{key}"), "also set at the top level: set it once")
}

/// Where a key lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    /// The top level or `[server]`.
    Server,
    Network,
    Metrics,
    Log,
    Metadata,
    TopicDefaults,
    /// `[shard]`: every shard's defaults.
    Shard,
    /// `[shard.N]`.
    ShardN(u32),
}

impl Scope {
    /// The key's name in the file.
    fn dotted(self, name: &str) -> String {
        match self {
            Scope::Server => name.to_string(),
            Scope::Network => format!("network.{name}"),
            Scope::Metrics => format!("metrics.{name}"),
            Scope::Log => format!("log.{name}"),
            Scope::Metadata => format!("metadata.{name}"),
            Scope::TopicDefaults => format!("topic_defaults.{name}"),
            Scope::Shard => format!("shard.{name}"),
            Scope::ShardN(index) => format!("shard.{index}.{name}"),
        }
    }

    /// The integer key `name` of this scope: its static name and bounds.
    fn int_key(self, name: &str) -> Option<(&'static str, u64, u64)> {
        fn find<T>(keys: &[IntKey<T>], name: &str) -> Option<(&'static str, u64, u64)> {
            keys.iter().find(|key| key.name == name).map(|key| (key.name, key.min, key.max))
        }
        match self {
            Scope::Server | Scope::Metrics | Scope::Log => None,
            Scope::Network => find(&NETWORK_KEYS, name),
            Scope::Metadata => find(&METADATA_KEYS, name),
            Scope::TopicDefaults => find(&TOPIC_KEYS, name),
            Scope::Shard | Scope::ShardN(_) if is_bool_key(name) => None,
            Scope::Shard | Scope::ShardN(_) => {
                find(&STORAGE_KEYS, name).or_else(|| find(&TUNING_KEYS, name))
            }
        }
    }
}

/// The top-level (or `[server]`) keys; all are strings but `shards`.
const SERVER_KEYS: [&str; 5] = ["data_dir", "native_listen", "shards", "profile", "cpus"];

/// The section and key a `SHOAL_*` variable names.
fn env_key(var: &str) -> Option<(Scope, &'static str)> {
    let suffix = var.strip_prefix("SHOAL_")?;
    let matches = |prefix: &str, name: &str| {
        suffix.strip_prefix(prefix).is_some_and(|rest| rest == name.to_ascii_uppercase())
    };
    if let Some(&name) = SERVER_KEYS.iter().find(|&&name| matches("", name)) {
        return Some((Scope::Server, name));
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
    // The one variable outside the SHOAL_<SECTION>_<KEY> rule: SHOAL_LOG, like RUST_LOG.
    if suffix == "LOG" {
        return Some((Scope::Log, "level"));
    }
    if let Some(key) = METADATA_KEYS.iter().find(|key| matches("METADATA_", key.name)) {
        return Some((Scope::Metadata, key.name));
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
fn shard_index(key: &str) -> Option<u32> {
    key.parse::<u32>().ok().filter(|index| index.to_string() == key)
}

/// The entries of a section, or why it is not one.
fn section<'a>(value: &'a toml::Value, key: &str) -> Result<&'a toml::Table, ConfigError> {
    value.as_table().ok_or_else(|| {
        ConfigError::new(key, format!("must be a table ([{key}]), not a {}", value.type_str()))
    })
}

/// A TOML string, quoted and escaped.
fn quoted(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

fn durability_name(durability: Durability) -> &'static str {
    match durability {
        Durability::Replicated => "replicated",
        Durability::Persisted => "persisted",
    }
}

/// A value as some layer wrote it: typed in the file, text in the environment and on the command
/// line.
#[derive(Clone, Copy, Debug)]
enum Raw<'a> {
    Toml(&'a toml::Value),
    Text(&'a str),
}

impl<'a> Raw<'a> {
    fn text(self) -> Result<&'a str, String> {
        match self {
            Raw::Toml(toml::Value::String(text)) => Ok(text),
            Raw::Text(text) => Ok(text),
            Raw::Toml(other) => Err(format!("expected a string, found a {}", other.type_str())),
        }
    }

    /// `true` or `false` (a TOML boolean in the file, the word elsewhere).
    fn bool(self) -> Result<bool, String> {
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
    fn int(self, min: u64, max: u64) -> Result<u64, String> {
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
enum Placement {
    Unpinned,
    Cpus(Vec<usize>),
}

impl Placement {
    fn parse(text: &str) -> Result<Placement, String> {
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
struct IntKey<T> {
    name: &'static str,
    min: u64,
    max: u64,
    get: fn(&T) -> u64,
    set: fn(&mut T, u64),
}

/// `[metadata]`.
const METADATA_KEYS: [IntKey<MetadataConfig>; 2] = [
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
];

/// `[network]`.
const NETWORK_KEYS: [IntKey<NetworkConfig>; 6] = [
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
        name: "fetch_parked_max",
        min: 1,
        max: 1 << 20,
        get: |c| c.fetch_parked_max as u64,
        set: |c, v| c.fetch_parked_max = v as usize,
    },
];

/// `[topic_defaults]` but `durability` (a string).
const TOPIC_KEYS: [IntKey<TopicDefaults>; 5] = [
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
const STORAGE_KEYS: [IntKey<ShardConfig>; 17] = [
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
const TUNING_KEYS: [IntKey<ShardTuning>; 5] = [
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
const BOOL_KEYS: [&str; 2] = ["direct_io", "recycle_segments"];

fn is_bool_key(name: &str) -> bool {
    BOOL_KEYS.contains(&name)
}

/// A shard key's value as written in a config file.
fn key_text<T>(key: &IntKey<T>, settings: &T) -> String {
    let value = (key.get)(settings);
    if is_bool_key(key.name) { (value != 0).to_string() } else { value.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine with 4 CPUs, so defaults do not depend on where the tests run.
    fn host() -> Host {
        Host { parallelism: 4, core_ids: vec![0, 1, 2, 3] }
    }

    /// Resolves a file's text, then `env`, then the command line `flags`, on [`host`].
    fn resolve_with(
        file: &str,
        env: &[(&str, &str)],
        flags: &[&str],
    ) -> Result<Resolved, ConfigError> {
        let args = parse_args(flags.iter().map(|flag| flag.to_string()))?;
        let mut layers = Layers::default();
        layers.file(Path::new("test.toml"), file)?;
        layers.env(env.iter().map(|(name, value)| (name.to_string(), value.to_string())))?;
        for (flag, value) in &args.settings {
            layers.flag(flag, value)?;
        }
        layers.resolve(&host())
    }

    fn resolve(file: &str, env: &[(&str, &str)], flags: &[&str]) -> Config {
        resolve_with(file, env, flags).unwrap_or_else(|error| panic!("{error}")).config
    }

    /// The one check of every error test: resolving fails, naming `key`, with `reason` in the
    /// reason.
    fn check_error(file: &str, env: &[(&str, &str)], flags: &[&str], key: &str, reason: &str) {
        match resolve_with(file, env, flags) {
            Ok(_) => panic!("{file:?} {env:?} {flags:?} resolved; expected an error about {key}"),
            Err(error) => {
                assert_eq!(error.key, key, "{file:?} {env:?} {flags:?}: {error}");
                assert!(
                    error.reason.contains(reason),
                    "{key}: {:?} lacks {reason:?}",
                    error.reason
                );
            }
        }
    }

    fn all_keys() -> Vec<(Scope, &'static str)> {
        let mut keys: Vec<(Scope, &'static str)> =
            SERVER_KEYS.iter().map(|&name| (Scope::Server, name)).collect();
        keys.extend(NETWORK_KEYS.iter().map(|key| (Scope::Network, key.name)));
        keys.push((Scope::Network, "shard_listen"));
        keys.push((Scope::Metrics, "listen"));
        keys.push((Scope::Log, "level"));
        keys.extend(METADATA_KEYS.iter().map(|key| (Scope::Metadata, key.name)));
        keys.push((Scope::TopicDefaults, "durability"));
        keys.extend(TOPIC_KEYS.iter().map(|key| (Scope::TopicDefaults, key.name)));
        keys.extend(STORAGE_KEYS.iter().map(|key| (Scope::Shard, key.name)));
        keys.extend(TUNING_KEYS.iter().map(|key| (Scope::Shard, key.name)));
        keys
    }

    fn env_name(scope: Scope, name: &str) -> String {
        let section = match scope {
            Scope::Server => "",
            Scope::Network => "NETWORK_",
            Scope::Metrics => "METRICS_",
            Scope::Log => return "SHOAL_LOG".to_string(),
            Scope::Metadata => "METADATA_",
            Scope::TopicDefaults => "TOPIC_DEFAULTS_",
            Scope::Shard | Scope::ShardN(_) => "SHARD_",
        };
        format!("SHOAL_{section}{}", name.to_ascii_uppercase())
    }

    #[test]
    fn nothing_given_resolves_to_the_defaults() {
        let config = resolve("", &[], &[]);
        let mut expected = Config::defaults(4, false);
        for (index, settings) in expected.shard.iter_mut().enumerate() {
            settings.cpu = Some(index);
        }
        assert_eq!(config.to_json(), expected.to_json());
        assert_eq!(config.shards, 4, "one shard per available CPU");
        assert_eq!(config.data_dir, PathBuf::from("shoal-data"));
        assert_eq!(config.native_listen.to_string(), "127.0.0.1:7070");
        assert_eq!(config.profile, Profile::Default);
        let cpus: Vec<Option<usize>> = config.shard.iter().map(|s| s.cpu).collect();
        assert_eq!(cpus, [Some(0), Some(1), Some(2), Some(3)], "shard i on the i-th CPU");
        for (index, settings) in config.shard.iter().enumerate() {
            assert_eq!(settings.storage.shard, index as u32);
            assert_eq!(settings.storage.shard_count, 4);
            assert_eq!(
                settings.storage.journal_size_bytes,
                ShardConfig::default().journal_size_bytes
            );
        }
    }

    #[test]
    fn single_node_toml_as_shipped_is_exactly_the_defaults() {
        let text = include_str!("../../configs/single-node.toml");
        assert_eq!(resolve(text, &[], &[]).to_json(), resolve("", &[], &[]).to_json());
    }

    #[test]
    fn single_node_toml_and_the_docs_cover_every_key() {
        let file = include_str!("../../configs/single-node.toml");
        let docs = include_str!("../../docs/configuration.md");
        for (scope, name) in all_keys() {
            let dotted = scope.dotted(name);
            assert!(
                file.lines()
                    .any(|line| line.trim_start_matches("# ").starts_with(&format!("{name} = "))),
                "configs/single-node.toml lacks {dotted}"
            );
            assert!(docs.contains(&format!("`{name}`")), "docs/configuration.md lacks {dotted}");
        }
        assert!(docs.contains("`cpu`"), "docs/configuration.md lacks [shard.N] cpu");
        assert!(docs.contains("`sqpoll_cpu`"), "docs/configuration.md lacks [shard.N] sqpoll_cpu");
        assert!(file.contains("# sqpoll_cpu = "), "configs/single-node.toml lacks sqpoll_cpu");
    }

    #[test]
    fn test_toml_is_one_unpinned_small_shard_on_a_free_port() {
        let config = resolve(include_str!("../../configs/test.toml"), &[], &[]);
        assert_eq!(config.shards, 1);
        assert_eq!(config.shard[0].cpu, None);
        assert_eq!(config.profile, Profile::Small);
        assert_eq!(
            config.shard[0].storage.journal_size_bytes,
            ShardConfig::small().journal_size_bytes
        );
        assert_eq!(config.topic_defaults.message_size_bytes_max, 60 << 10);
        assert_eq!(config.native_listen.port(), 0);
    }

    #[test]
    fn later_layers_win_key_by_key() {
        let file =
            "shards = 2\ncpus = \"none\"\n[network]\nconnections_max = 10\nshard_inbox_max = 11\n";
        assert_eq!(resolve(file, &[], &[]).shards, 2, "the file over the default");
        let env = [("SHOAL_SHARDS", "3"), ("SHOAL_NETWORK_CONNECTIONS_MAX", "20")];
        let config = resolve(file, &env, &[]);
        assert_eq!(config.shards, 3, "the environment over the file");
        assert_eq!(config.network.connections_max, 20);
        assert_eq!(
            config.network.shard_inbox_max, 11,
            "keys the environment leaves keep the file's"
        );
        let config = resolve(file, &env, &["--shards", "5", "--shards=6"]);
        assert_eq!(config.shards, 6, "flags over the environment; the last flag wins");
        assert_eq!(config.network.connections_max, 20);
        let config = resolve("", &[("SHOAL_CPUS", "none")], &["--cpus", "0,1,2,3"]);
        assert_eq!(config.shard[3].cpu, Some(3));
        let config = resolve("", &[], &["--cpus", "none", "--cpus", "3,2,1,0"]);
        assert_eq!(config.shard[0].cpu, Some(3));
    }

    #[test]
    fn shard_n_overrides_shard_and_beats_the_environment_for_its_shard() {
        let file = "shards = 3\n[shard]\nring_bytes_max = 2000000\nchunks_max = 7\n\
                    [shard.1]\nring_bytes_max = 3000000\ncpu = 2\n";
        let config = resolve(file, &[("SHOAL_SHARD_RING_BYTES_MAX", "4000000")], &[]);
        let ring: Vec<usize> = config.shard.iter().map(|s| s.storage.ring.bytes_max).collect();
        assert_eq!(ring, [4_000_000, 3_000_000, 4_000_000], "env replaces [shard], not [shard.1]");
        assert!(config.shard.iter().all(|s| s.storage.chunks_max == 7));
        assert!(config.shard.iter().all(|s| s.storage.ring.entries_max == 65_536));
        let cpus: Vec<Option<usize>> = config.shard.iter().map(|s| s.cpu).collect();
        assert_eq!(cpus, [None, Some(2), None], "a [shard.N] cpu turns the default placement off");
        let config = resolve(file, &[], &["--cpus", "0,1,3"]);
        let cpus: Vec<Option<usize>> = config.shard.iter().map(|s| s.cpu).collect();
        assert_eq!(cpus, [Some(0), Some(2), Some(3)], "[shard.1] cpu beats cpus");
    }

    #[test]
    fn a_shard_n_past_the_shard_count_is_refused() {
        check_error("shards = 2\n[shard.2]\nchunks_max = 3\n", &[], &[], "shard.2", "no shard 2");
        check_error("[shard.4]\n", &[], &[], "shard.4", "0 to 3");
        check_error("[shard.1]\n", &[], &["--shards", "1"], "shard.1", "shards is 1");
        check_error("[shard.01]\n", &[], &[], "shard.01", "unknown key");
        assert_eq!(resolve("[shard.3]\n", &[], &[]).shards, 4, "the last shard is in range");
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        // (file, key named)
        let in_the_file = [
            ("sharts = 2\n", "sharts"),
            ("[server]\nlisten = \"127.0.0.1:1\"\n", "server.listen"),
            ("[network]\nconections_max = 5\n", "network.conections_max"),
            ("[netwrok]\nconnections_max = 5\n", "netwrok"),
            ("[topic_defaults]\nsegment_bytes = 5\n", "topic_defaults.segment_bytes"),
            ("[shard.0]\nring_bytes = 5\n", "shard.0.ring_bytes"),
        ];
        for (file, key) in in_the_file {
            check_error(file, &[], &[], key, "unknown key");
        }
        // Misspelt, lower-case, and per-shard (which only the file has).
        for var in ["SHOAL_NETWORK_CONECTIONS_MAX", "SHOAL_shards", "SHOAL_SHARD_0_CPU"] {
            check_error("", &[(var, "5")], &[], var, "unknown SHOAL_ variable");
        }
        check_error("", &[], &["--shard", "5"], "--shard", "unknown flag");
        check_error("[shard]\ncpu = 1\n", &[], &[], "shard.cpu", "per shard");
        check_error("", &[], &["shards"], "shards", "unexpected argument");
    }

    #[test]
    fn variables_other_programs_own_are_left_alone() {
        let env = [
            ("SHOAL_BENCH_DIR", "/nowhere"),
            ("SHOAL_SIM_SEEDS", "9"),
            ("PATH", "/bin"),
            ("HOME", "/root"),
        ];
        assert_eq!(resolve("", &env, &[]).to_json(), resolve("", &[], &[]).to_json());
    }

    #[test]
    fn every_validation_error_names_its_key() {
        // (file, key named, part of the reason)
        let in_the_file: &[(&str, &str, &str)] = &[
            // Each key's own bounds and type.
            (
                "[topic_defaults]\nsegment_size_bytes = 1000\n",
                "topic_defaults.segment_size_bytes",
                "outside 1048576..=4294967296",
            ),
            ("shards = \"two\"\n", "shards", "expected an integer, found a string"),
            ("[server]\nshards = 1.5\n", "server.shards", "expected an integer, found a float"),
            ("[topic_defaults]\nretention_ms = -1\n", "topic_defaults.retention_ms", "negative"),
            ("native_listen = \"localhost\"\n", "native_listen", "not an IP address and port"),
            ("native_listen = 7070\n", "native_listen", "expected a string"),
            ("data_dir = \"\"\n", "data_dir", "must not be empty"),
            ("profile = \"huge\"\n", "profile", "use \"default\" or \"small\""),
            (
                "[topic_defaults]\ndurability = \"fast\"\n",
                "topic_defaults.durability",
                "\"replicated\" or",
            ),
            ("cpus = \"0,one\"\n", "cpus", "comma-separated CPU list"),
            ("cpus = \"0,1\"\n", "cpus", "cpus names 2 CPUs for 4 shards"),
            ("[shard.0]\ncpu = 70000\n", "shard.0.cpu", "outside 0..=65535"),
            ("[shard]\nchunks_max = 0\n", "shard.chunks_max", "outside 1..="),
            // Rules between keys: the key the user set is named.
            (
                "[shard]\nchunk_size_bytes = 8192\n",
                "shard.chunk_size_bytes",
                "must hold record_size",
            ),
            (
                "[shard.1]\nrecord_size_bytes_max = 5000000\n",
                "shard.1.record_size_bytes_max",
                "must hold record_size",
            ),
            (
                "[shard]\njournal_size_bytes = 1048577\n",
                "shard.journal_size_bytes",
                "not a multiple of the 4096",
            ),
            (
                "[shard]\njournal_size_bytes = 1048576\n",
                "shard.journal_size_bytes",
                "two of the largest records",
            ),
            (
                "[shard]\nready_ahead_bytes = 5000\n",
                "shard.ready_ahead_bytes",
                "not a multiple of the 4096",
            ),
            (
                "[shard]\nring_bytes_max = 1000\n",
                "shard.ring_bytes_max",
                "must hold the largest record",
            ),
            ("[shard]\nring_budget_bytes = 1048576\n", "shard.ring_budget_bytes", "one full ring"),
            (
                "[topic_defaults]\nmessage_size_bytes_max = 2097152\n",
                "topic_defaults.message_size_bytes_max",
                "must fit shard 0's record",
            ),
            (
                "profile = \"small\"\n[shard.2]\nrecord_size_bytes_max = 4096\n",
                "shard.2.record_size_bytes_max",
                "must fit shard 2's",
            ),
            (
                "[topic_defaults]\nsegment_size_bytes = 1048576\n",
                "topic_defaults.segment_size_bytes",
                "must fit a segment",
            ),
            (
                "[network]\nframe_size_bytes_max = 4096\n",
                "network.frame_size_bytes_max",
                "must carry the largest message",
            ),
            // The file's shape.
            ("shards = 2\n[server]\nshards = 3\n", "server.shards", "set it once"),
            ("network = 5\n", "network", "must be a table"),
            ("[shard]\n0 = 5\n", "shard.0", "must be a table"),
            ("shards = 2\nshards = 3\n", "test.toml", "line 2"),
            ("[network\n", "test.toml", "not a valid TOML file: line 1"),
        ];
        for &(file, key, reason) in in_the_file {
            check_error(file, &[], &[], key, reason);
        }
        // (variable, value, part of the reason); the variable is the key named.
        let in_the_environment: &[(&str, &str, &str)] = &[
            ("SHOAL_NETWORK_CONNECTIONS_MAX", "0", "outside 1..="),
            ("SHOAL_SHARDS", "x", "not a non-negative decimal integer"),
            ("SHOAL_SHARDS", "", "not a non-negative decimal integer"),
            ("SHOAL_PROFILE", "Small", "use \"default\""),
            ("SHOAL_TOPIC_DEFAULTS_DURABILITY", "", "\"replicated\""),
            ("SHOAL_SHARD_READY_AHEAD_BYTES", "5000", "not a multiple"),
            ("SHOAL_CPUS", "0,1", "SHOAL_CPUS names 2 CPUs for 4 shards"),
        ];
        for &(var, value, reason) in in_the_environment {
            check_error("", &[(var, value)], &[], var, reason);
        }
        // (command line, key named, part of the reason)
        let on_the_command_line: &[(&[&str], &str, &str)] = &[
            (&["--shards", "0"], "--shards", "outside 1..=256"),
            (&["--shards=257"], "--shards", "outside 1..=256"),
            (&["--listen", "1.2.3.4"], "--listen", "not an IP address and port"),
            (&["--shards", "2", "--cpus", "0"], "--cpus", "--cpus names 1 CPUs for 2 shards"),
            (&["--profile", "tiny"], "--profile", "use \"default\" or \"small\""),
            (&["--data-dir"], "--data-dir", "needs a value"),
            (&["--print-config=yes"], "--print-config", "takes no value"),
        ];
        for &(flags, key, reason) in on_the_command_line {
            check_error("", &[], flags, key, reason);
        }
    }

    #[test]
    fn each_integer_key_is_refused_just_past_its_bounds_and_taken_at_them() {
        for (scope, name) in all_keys() {
            let Some((_, min, max)) = scope
                .int_key(name)
                .or_else(|| (name == "shards").then_some((name, 1, u64::from(SHARDS_MAX))))
            else {
                continue;
            };
            let var = env_name(scope, name);
            let past = [min.checked_sub(1), max.checked_add(1)];
            for value in past.into_iter().flatten() {
                let value = value.to_string();
                check_error("", &[(var.as_str(), value.as_str())], &[], &var, "outside");
            }
            // At a bound a key may still break a rule with another key, but never its own.
            for value in [min, max] {
                let value = value.to_string();
                if let Err(error) = resolve_with("", &[(var.as_str(), value.as_str())], &[]) {
                    assert!(!error.reason.contains("outside"), "{var}={value}: {error}");
                }
            }
        }
    }

    #[test]
    fn the_limits_themselves_are_accepted() {
        assert_eq!(resolve("shards = 256\ncpus = \"none\"\n", &[], &[]).shards, 256);
        let small = "profile = \"small\"\n[topic_defaults]\nsegment_size_bytes = 1048576\n";
        assert_eq!(
            resolve(small, &[], &[]).topic_defaults.segment_size_bytes,
            SEGMENT_SIZE_BYTES_MIN
        );
        let largest = "[topic_defaults]\nsegment_size_bytes = 4294967296\n";
        assert_eq!(
            resolve(largest, &[], &[]).topic_defaults.segment_size_bytes,
            SEGMENT_SIZE_BYTES_MAX
        );
        // message_size_bytes_max may use the whole record bound but the header.
        let exact = "[topic_defaults]\nmessage_size_bytes_max = 1048576\n\
                     [shard]\nrecord_size_bytes_max = 1048832\n";
        assert_eq!(resolve(exact, &[], &[]).topic_defaults.message_size_bytes_max, 1 << 20);
        check_error(
            "[topic_defaults]\nmessage_size_bytes_max = 1048577\n",
            &[],
            &[],
            "topic_defaults.message_size_bytes_max",
            "must fit",
        );
        // A chunk of exactly the largest record plus a block.
        let chunk = "[shard]\nchunk_size_bytes = 1052928\n";
        assert_eq!(resolve(chunk, &[], &[]).shard[0].storage.chunk_size_bytes, 1_052_928);
        check_error(
            "[shard]\nchunk_size_bytes = 1052927\n",
            &[],
            &[],
            "shard.chunk_size_bytes",
            "must hold",
        );
    }

    #[test]
    fn too_few_cpus_for_the_default_placement_leaves_shards_unpinned_with_a_warning() {
        let resolved = resolve_with("shards = 5\n", &[], &[]).unwrap();
        assert!(resolved.config.shard.iter().all(|s| s.cpu.is_none()));
        assert_eq!(resolved.warnings, ["5 shards on 4 CPUs: shard threads are not pinned"]);
        assert!(resolve_with("", &[], &[]).unwrap().warnings.is_empty());
    }

    #[test]
    fn printed_config_loads_back_to_the_same_config() {
        let files = [
            "",
            include_str!("../../configs/test.toml"),
            "data_dir = 'dir \"with\" quotes\\\\'\nshards = 3\n[shard]\nchunks_max = 9\n\
             [shard.1]\ncpu = 7\nring_entries_max = 5\n[shard.2]\nscan_window_bytes = 8192\n",
            "[topic_defaults]\ndurability = \"persisted\"\nretention_ms = 9223372036854775807\n",
            "shards = 2\ncpus = \"3,5\"\n[network]\nshard_listen = \"0.0.0.0:7100\"\n\
             [shard]\nuring_entries = 1024\n[shard.0]\nsqpoll_idle_ms = 20\nsqpoll_cpu = 4\n\
             [shard.1]\ndirect_io = false\nflush_delay_us_max = 300\nsegment_age_ms_max = 0\n",
            include_str!("../../configs/i4i.4xlarge.toml"),
        ];
        for file in files {
            let config = resolve(file, &[], &[]);
            let printed = config.to_toml();
            let again = resolve(&printed, &[], &[]);
            assert_eq!(again.to_json(), config.to_json(), "{file}\n---\n{printed}");
        }
        let printed = resolve(files[2], &[], &[]).to_toml();
        assert!(printed.contains("cpus = \"none\""), "{printed}");
        assert!(printed.contains("[shard.1]\ncpu = 7\nring_entries_max = 5\n"), "{printed}");
        assert!(!printed.contains("[shard.0]"), "shard 0 is [shard] itself: {printed}");
    }

    #[test]
    fn metrics_listen_and_log_level_resolve_through_every_layer() {
        let config = resolve("", &[], &[]);
        assert_eq!(config.metrics.listen_text(), "127.0.0.1:9464");
        assert_eq!(config.log.level, "info");
        let file = "[metrics]\nlisten = \"127.0.0.1:1\"\n[log]\nlevel = \"warn\"\n";
        let config = resolve(file, &[], &[]);
        assert_eq!(config.metrics.listen_text(), "127.0.0.1:1");
        assert_eq!(config.log.level, "warn");
        let env = [("SHOAL_METRICS_LISTEN", "off"), ("SHOAL_LOG", "DEBUG")];
        let config = resolve(file, &env, &[]);
        assert_eq!(config.metrics.listen, None, "off turns the endpoint off");
        assert_eq!(config.log.level, "debug", "SHOAL_LOG over the file, lower-cased");
        let flags = ["--metrics-listen", "127.0.0.1:0", "--log-level=error,shoal_server=trace"];
        let config = resolve(file, &env, &flags);
        assert_eq!(config.metrics.listen_text(), "127.0.0.1:0");
        assert_eq!(config.log.level, "error,shoal_server=trace");
    }

    #[test]
    fn a_bad_metrics_listen_or_log_level_is_refused_by_name() {
        check_error(
            "[metrics]\nlisten = \"localhost\"\n",
            &[],
            &[],
            "metrics.listen",
            "or \"off\"",
        );
        check_error("[metrics]\nport = 1\n", &[], &[], "metrics.port", "unknown key");
        check_error("[log]\nlevel = \"loud\"\n", &[], &[], "log.level", "\"loud\" is not a level");
        check_error("[log]\nlevel = 3\n", &[], &[], "log.level", "expected a string");
        check_error("", &[("SHOAL_LOG", "inf")], &[], "SHOAL_LOG", "is not a level");
        check_error("", &[("SHOAL_LOG_LEVEL", "info")], &[], "SHOAL_LOG_LEVEL", "is SHOAL_LOG");
        check_error("", &[], &["--log-level", "a b=info"], "--log-level", "not a target");
        check_error("", &[], &["--metrics-listen", "9464"], "--metrics-listen", "IP address");
    }

    #[test]
    fn log_filters_are_checked_and_normalised() {
        assert_eq!(log_filter("INFO"), Ok("info".to_string()));
        assert_eq!(
            log_filter(" warn , shoal_server::shard = Debug "),
            Ok("warn,shoal_server::shard=debug".to_string())
        );
        assert_eq!(log_filter("shoal_server=off"), Ok("shoal_server=off".to_string()));
        for bad in ["", "info,debug", "verbose", "=info", "shoal-server=info", "a=b=c", "info,"] {
            assert!(log_filter(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn shard_tuning_resolves_through_every_layer_with_shard_n_winning() {
        let config = resolve("", &[], &[]);
        assert!(config.shard.iter().all(|s| s.tuning == ShardTuning::default()));
        assert_eq!(config.shard[0].tuning.uring_entries, 256, "what the shards were built with");
        assert_eq!(config.shard[0].tuning.segment_age_ms_max, 7 * 24 * 3600 * 1000);
        let file = "shards = 3\n[shard]\nuring_entries = 512\nflush_delay_us_max = 100\n\
                    [shard.1]\nuring_entries = 2048\ndirect_io = false\nsqpoll_idle_ms = 5\n\
                    sqpoll_cpu = 3\nsegment_age_ms_max = 3600000\n";
        let env = [("SHOAL_SHARD_URING_ENTRIES", "1024"), ("SHOAL_SHARD_DIRECT_IO", "true")];
        let config = resolve(file, &env, &["--cpus", "0,1,2"]);
        let tuning: Vec<ShardTuning> = config.shard.iter().map(|s| s.tuning).collect();
        let entries: Vec<u32> = tuning.iter().map(|t| t.uring_entries).collect();
        assert_eq!(entries, [1024, 2048, 1024], "env replaces [shard], not [shard.1]");
        let direct: Vec<bool> = tuning.iter().map(|t| t.direct_io).collect();
        assert_eq!(direct, [true, false, true]);
        let sqpoll: Vec<u32> = tuning.iter().map(|t| t.sqpoll_idle_ms).collect();
        assert_eq!(sqpoll, [0, 5, 0]);
        let sqpoll_cpus: Vec<Option<usize>> = tuning.iter().map(|t| t.sqpoll_cpu).collect();
        assert_eq!(sqpoll_cpus, [None, Some(3), None]);
        assert!(tuning.iter().all(|t| t.flush_delay_us_max == 100));
        assert_eq!(tuning[1].segment_age_ms_max, 3_600_000);
        let settings: BTreeMap<&str, u64> = shard_settings(&config.shard[1]).collect();
        assert_eq!(settings["uring_entries"], 2048, "the gauges see the override");
        assert_eq!(settings["direct_io"], 0);
        assert_eq!(settings["ring_bytes_max"], 64 << 20, "storage keys are there too");
        let json = config.to_json();
        assert_eq!(json["shard"][1]["direct_io"], false);
        assert_eq!(json["shard"][0]["uring_entries"], 1024);
    }

    #[test]
    fn recycle_segments_is_a_boolean_storage_key() {
        let config = resolve("", &[], &[]);
        assert!(config.shard.iter().all(|s| s.storage.recycle_segments), "on by default");
        let file = "shards = 2\n[shard.1]\nrecycle_segments = false\n";
        let config = resolve(file, &[], &["--cpus", "none"]);
        let recycle: Vec<bool> = config.shard.iter().map(|s| s.storage.recycle_segments).collect();
        assert_eq!(recycle, [true, false]);
        let settings: BTreeMap<&str, u64> = shard_settings(&config.shard[1]).collect();
        assert_eq!(settings["recycle_segments"], 0);
        assert_eq!(config.to_json()["shard"][1]["recycle_segments"], false);
        assert!(config.to_toml().contains("recycle_segments = true"), "{}", config.to_toml());
        let config = resolve("", &[("SHOAL_SHARD_RECYCLE_SEGMENTS", "false")], &[]);
        assert!(!config.shard[0].storage.recycle_segments);
        check_error("[shard]\nrecycle_segments = 0\n", &[], &[], "shard.recycle_segments", "true");
    }

    #[test]
    fn shard_tuning_is_refused_by_name_when_it_cannot_work() {
        check_error(
            "[shard]\nuring_entries = 300\n",
            &[],
            &[],
            "shard.uring_entries",
            "power of two",
        );
        check_error(
            "[shard.2]\nuring_entries = 128\n",
            &[],
            &[],
            "shard.2.uring_entries",
            "256..=",
        );
        check_error("[shard]\ndirect_io = 1\n", &[], &[], "shard.direct_io", "true or false");
        check_error("", &[("SHOAL_SHARD_DIRECT_IO", "yes")], &[], "SHOAL_SHARD_DIRECT_IO", "true");
        check_error(
            "[shard]\nflush_delay_us_max = 100001\n",
            &[],
            &[],
            "shard.flush_delay_us_max",
            "outside 0..=100000",
        );
        // SQPOLL needs a pinned shard (not pinned by "none", nor by a default placement that
        // found too few CPUs) and a CPU of its own for the polling thread.
        let unpinned = "cpus = \"none\"\n[shard.1]\nsqpoll_idle_ms = 10\nsqpoll_cpu = 2\n";
        check_error(unpinned, &[], &[], "shard.1.sqpoll_idle_ms", "pin shard 1 first");
        let unpinned = "cpus = \"none\"\n[shard.1]\nsqpoll_idle_ms = 10\n";
        check_error(unpinned, &[], &[], "shard.1.sqpoll_idle_ms", "[shard.1] cpu");
        check_error(
            "shards = 5\n[shard]\nsqpoll_idle_ms = 10\n",
            &[],
            &[],
            "shard.sqpoll_idle_ms",
            "[shard.0] cpu",
        );
        let no_cpu = "shards = 2\n[shard.1]\nsqpoll_idle_ms = 10\n";
        check_error(no_cpu, &[], &[], "shard.1.sqpoll_idle_ms", "shares the shard's CPU 1");
        let on_a_shard = "shards = 2\n[shard.1]\nsqpoll_idle_ms = 10\nsqpoll_cpu = 0\n";
        check_error(on_a_shard, &[], &[], "shard.1.sqpoll_cpu", "CPU 0 runs shard 0");
        let shared = "shards = 2\n[shard]\nsqpoll_idle_ms = 10\n\
                      [shard.0]\nsqpoll_cpu = 3\n[shard.1]\nsqpoll_cpu = 3\n";
        check_error(shared, &[], &[], "shard.0.sqpoll_cpu", "already polls shard 1");
        check_error("[shard.0]\nsqpoll_cpu = 3\n", &[], &[], "shard.0.sqpoll_cpu", "SQPOLL is off");
        check_error("[shard]\nsqpoll_cpu = 3\n", &[], &[], "shard.sqpoll_cpu", "per shard");
        let good = "shards = 2\n[shard.1]\nsqpoll_idle_ms = 10\nsqpoll_cpu = 3\n";
        let config = resolve(good, &[], &[]);
        assert_eq!(config.shard[1].tuning.sqpoll_idle_ms, 10);
        assert_eq!(config.shard[1].tuning.sqpoll_cpu, Some(3));
        // Topic settings stay node-wide, with the reason instead of "unknown key".
        for key in ["segment_size_bytes", "durability", "retention_ms", "partitions"] {
            let file = format!("[shard.0]\n{key} = 1\n");
            check_error(&file, &[], &[], &format!("shard.0.{key}"), "[topic_defaults]");
        }
    }

    #[test]
    fn shard_listen_gives_each_shard_its_port_within_the_port_range() {
        let config = resolve("", &[], &[]);
        assert_eq!(config.network.shard_listen, None, "off by default");
        assert_eq!(config.network.shard_listen_address(0), None);
        let config = resolve("[network]\nshard_listen = \"127.0.0.1:7100\"\n", &[], &[]);
        let ports: Vec<u16> = (0..4)
            .filter_map(|i| config.network.shard_listen_address(i))
            .map(|a| a.port())
            .collect();
        assert_eq!(ports, [7100, 7101, 7102, 7103]);
        let config = resolve("", &[("SHOAL_NETWORK_SHARD_LISTEN", "127.0.0.1:0")], &[]);
        let ports: Vec<u16> = (0..4)
            .filter_map(|i| config.network.shard_listen_address(i))
            .map(|a| a.port())
            .collect();
        assert_eq!(ports, [0, 0, 0, 0], "port 0: each shard picks a free one");
        let last = "[network]\nshard_listen = \"127.0.0.1:65532\"\n";
        assert_eq!(resolve(last, &[], &[]).network.shard_listen_address(3).unwrap().port(), 65535);
        let past = "[network]\nshard_listen = \"127.0.0.1:65533\"\n";
        check_error(past, &[], &[], "network.shard_listen", "at most 65532");
        let clash =
            "native_listen = \"0.0.0.0:7102\"\n[network]\nshard_listen = \"127.0.0.1:7100\"\n";
        check_error(clash, &[], &[], "network.shard_listen", "shard 2's own port");
        let bad = [("SHOAL_NETWORK_SHARD_LISTEN", "7100")];
        check_error("", &bad, &[], "SHOAL_NETWORK_SHARD_LISTEN", "or \"off\"");
        let off = resolve("[network]\nshard_listen = \"off\"\n", &[], &[]);
        assert_eq!(off.network.shard_listen_text(), "off");
    }

    #[test]
    fn i4i_profile_parses_validates_and_explains_every_choice() {
        let text = include_str!("../../configs/i4i.4xlarge.toml");
        // As shipped (its CPU list names CPUs this machine may not have: resolving checks no
        // CPU), and unpinned, as a smaller test box would run it.
        for flags in [&[][..], &["--cpus", "none"][..]] {
            let config = resolve(text, &[], flags);
            assert_eq!(config.shards, 14);
            assert_eq!(config.profile, Profile::Default);
            assert!(config.shard.iter().all(|s| s.tuning.sqpoll_idle_ms == 0), "SQPOLL off");
            assert!(config.network.shard_listen.is_some(), "clients can reach the owner");
        }
        let pinned = resolve(text, &[], &[]);
        let cpus: Vec<Option<usize>> = pinned.shard.iter().map(|s| s.cpu).collect();
        assert!(!cpus.contains(&Some(0)) && !cpus.contains(&Some(8)), "core 0 left to the kernel");
        // Every setting line carries its reason in the comment lines right above it.
        let mut commented = false;
        for line in text.lines().map(str::trim) {
            if line.starts_with('#') {
                commented = true;
            } else if line.contains(" = ") {
                assert!(commented, "no reason given for {line:?}");
                commented = false;
            } else if line.is_empty() || line.starts_with('[') {
                commented = false;
            }
        }
    }

    #[test]
    fn json_holds_every_key_of_every_shard() {
        let config = resolve("shards = 2\n[shard.1]\ncpu = 3\n", &[], &[]);
        let json = config.to_json();
        assert_eq!(json["shards"], 2);
        assert_eq!(json["profile"], "default");
        assert_eq!(json["topic_defaults"]["durability"], "replicated");
        assert_eq!(json["network"]["connections_max"], 1024);
        assert_eq!(json["shard"][0]["cpu"], serde_json::Value::Null);
        assert_eq!(json["shard"][1]["cpu"], 3);
        for key in &STORAGE_KEYS {
            let value = &json["shard"][1][key.name];
            assert!(value.is_u64() || is_bool_key(key.name) && value.is_boolean(), "{}", key.name);
        }
        for key in &TUNING_KEYS {
            let value = &json["shard"][1][key.name];
            assert!(value.is_u64() || value.is_boolean(), "{}", key.name);
        }
        assert_eq!(json["network"]["shard_listen"], "off");
    }
}
