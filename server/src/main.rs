//! The `shoal` server binary: starts the shards of one node on a data directory and serves until
//! SIGINT or SIGTERM.
//!
//! It owns start-up (the configuration, which `config` resolves from the config file, `SHOAL_*`
//! variables and flags; the log; the data-directory lock; the metrics listener; the shards'
//! inboxes and the published catalog; one thread per shard, each serving its connections and
//! partitions; the readiness line) and graceful shutdown. What a shard does is in `shard`,
//! `connection`, `metadata` and `metrics`.
//!
//! stdout carries the readiness line only; everything else goes to stderr: configuration errors
//! as one plain line (the log is not set up before the configuration is known), the rest as
//! `tracing` events (`logging`).

use shoal_server::{alloc, config, lock, logging, metadata, shard, signals};

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use config::{ConfigError, Host, Layers};

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

const USAGE: &str = "\
usage: shoal [--config FILE] [--data-dir DIR] [--listen ADDR] [--shards N] [--cpus LIST]
             [--profile P] [--metrics-listen ADDR] [--log-level LEVEL] [--print-config]

  --config FILE    TOML config file (configs/single-node.toml lists every key and its default)
  --data-dir DIR   data directory (default ./shoal-data), created if missing, locked while served
  --listen ADDR    native protocol address (default 127.0.0.1:7070; port 0 picks a free port)
  --shards N       shards, one thread each, 1 to 256 (default: one per available CPU); a data
                   directory keeps the shard count it was created with
  --cpus LIST      CPU of each shard thread, comma-separated (one per shard), or none (no
                   pinning); default: shard i on the i-th available CPU when there are enough
  --profile P      storage sizes: default (production) or small (tests: small journal and rings)
  --metrics-listen ADDR
                   Prometheus endpoint, GET /metrics on shard 0 (default 127.0.0.1:9464; port 0
                   picks a free port; off: none)
  --log-level LEVEL
                   stderr log filter: off, error, warn, info (default), debug or trace, or
                   directives such as warn,shoal_server::shard=debug (also SHOAL_LOG)
  --print-config   print the effective configuration as TOML and exit (starts nothing, touches
                   no data directory)
  --help           print this and exit

Settings resolve in this order, later winning: built-in defaults, the config file, SHOAL_*
environment variables (SHOAL_<KEY> or SHOAL_<SECTION>_<KEY>, e.g. SHOAL_SHARDS,
SHOAL_NETWORK_CONNECTIONS_MAX), flags; docs/configuration.md lists every key. An invalid setting
prints \"shoal: config: KEY: REASON\" and exits 2.

Prints one JSON line once recovery is done and the listeners are bound:
  {\"ready\":true,\"native\":\"ADDR\",\"metrics\":\"ADDR\",\"shards\":[\"ADDR\",...]}
(no metrics field when the endpoint is off; shards, each shard's own listener, only with
[network] shard_listen). SIGINT or SIGTERM shuts down gracefully (flush, checkpoint,
clean-shutdown flag, exit 0); a second signal exits at once.
";

/// Resolves the configuration from the command line, the config file and the environment, with
/// the warnings to log. `Ok(None)`: nothing to start (`--help`, `--print-config`, both already
/// answered).
fn configure() -> Result<Option<config::Resolved>, ConfigError> {
    let words = std::env::args_os()
        .skip(1)
        .map(|word| {
            word.into_string()
                .map_err(|word| ConfigError::new(word.to_string_lossy(), "not valid UTF-8"))
        })
        .collect::<Result<Vec<String>, _>>()?;
    let args = config::parse_args(words)?;
    if args.help {
        print!("{USAGE}");
        return Ok(None);
    }
    let mut layers = Layers::default();
    if let Some(path) = &args.config_file {
        let text = std::fs::read_to_string(path).map_err(|error| {
            ConfigError::new("--config", format!("cannot read {}: {error}", path.display()))
        })?;
        layers.file(path, &text)?;
    }
    layers.env(shoal_environment()?)?;
    for (flag, value) in &args.settings {
        layers.flag(flag, value)?;
    }
    let host = Host {
        parallelism: std::thread::available_parallelism()
            .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX)),
        core_ids: core_affinity::get_core_ids()
            .unwrap_or_default()
            .into_iter()
            .map(|core| core.id)
            .collect(),
    };
    let resolved = layers.resolve(&host)?;
    if args.print_config {
        for warning in &resolved.warnings {
            eprintln!("shoal: {warning}");
        }
        print!("{}", resolved.config.to_toml());
        return Ok(None);
    }
    Ok(Some(resolved))
}

/// The `SHOAL_*` environment variables (the config layer rejects the unknown ones).
fn shoal_environment() -> Result<Vec<(String, String)>, ConfigError> {
    std::env::vars_os()
        .filter(|(name, _)| name.as_encoded_bytes().starts_with(b"SHOAL_"))
        .map(|(name, value)| {
            let name = name.into_string().map_err(|name| {
                ConfigError::new(name.to_string_lossy(), "variable name is not valid UTF-8")
            })?;
            let value = value
                .into_string()
                .map_err(|_| ConfigError::new(name.as_str(), "value is not valid UTF-8"))?;
            Ok((name, value))
        })
        .collect()
}

fn main() -> ExitCode {
    alloc::keep_freed_memory();
    let (mut config, warnings) = match configure() {
        Ok(Some(resolved)) => (resolved.config, resolved.warnings),
        Ok(None) => return ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("shoal: config: {error}");
            return ExitCode::from(2);
        }
    };
    if let Err(error) = logging::init(&config.log.level) {
        eprintln!("shoal: {error}");
        return ExitCode::FAILURE;
    }
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    // Signals are blocked before any thread starts, so only the signal thread receives them.
    let signals = match signals::block() {
        Ok(signals) => signals,
        Err(error) => {
            tracing::error!(%error, "cannot set up signal handling");
            return ExitCode::FAILURE;
        }
    };
    if let Err(error) = std::fs::create_dir_all(&config.data_dir) {
        let dir = config.data_dir.display();
        tracing::error!(%error, "cannot create data directory {dir}");
        return ExitCode::FAILURE;
    }
    // Absolute from here on, so every message names the directory unambiguously.
    match std::fs::canonicalize(&config.data_dir) {
        Ok(data_dir) => config.data_dir = data_dir,
        Err(error) => {
            tracing::error!(%error, "data directory {}", config.data_dir.display());
            return ExitCode::FAILURE;
        }
    }
    let _lock = match lock::DataDirLock::acquire(&config.data_dir) {
        Ok(lock) => lock,
        Err(error) => {
            tracing::error!("{error}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(error) = check_shard_count(&config.data_dir, config.shards) {
        tracing::error!("{error}");
        return ExitCode::FAILURE;
    }
    // Bound here, not on shard 0, so a taken port stops the start before any shard runs, and
    // without SO_REUSEPORT (monoio's default), so a second server cannot share the port.
    let mut metrics_listener = match config.metrics.listen.map(std::net::TcpListener::bind) {
        None => None,
        Some(Ok(listener)) => Some(listener),
        Some(Err(error)) => {
            let address = config.metrics.listen_text();
            tracing::error!(%error, "cannot listen for metrics on {address}");
            return ExitCode::FAILURE;
        }
    };
    let metrics_address = match metrics_listener.as_ref().map(std::net::TcpListener::local_addr) {
        None => None,
        Some(Ok(address)) => Some(address),
        Some(Err(error)) => {
            tracing::error!(%error, "the metrics listener has no address");
            return ExitCode::FAILURE;
        }
    };
    // Each shard's own listener, bound here for the same reasons as the metrics listener (a
    // taken port stops the start; no SO_REUSEPORT), and before any shard starts, so that every
    // shard's first Hello can name every shard's address.
    let mut own_listeners = Vec::new();
    for index in 0..config.shards {
        let Some(address) = config.network.shard_listen_address(index) else { break };
        match std::net::TcpListener::bind(address) {
            Ok(listener) => own_listeners.push(listener),
            Err(error) => {
                tracing::error!(%error, "cannot listen for shard {index} on {address}");
                return ExitCode::FAILURE;
            }
        }
    }
    let mut shard_addresses = Vec::with_capacity(own_listeners.len());
    for (index, listener) in own_listeners.iter().enumerate() {
        match listener.local_addr() {
            Ok(address) => shard_addresses.push(address.to_string()),
            Err(error) => {
                tracing::error!(%error, "shard {index}'s listener has no address");
                return ExitCode::FAILURE;
            }
        }
    }
    let shard_addresses = Arc::new(shard_addresses);
    let mut own_listeners = own_listeners.into_iter();
    let config = Arc::new(config);
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let mut threads = Vec::new();
    let (mesh, mut inboxes) = shard::mesh(config.shards, config.network.shard_inbox_max);
    let published =
        Arc::new(metadata::Published::new(Arc::new(metadata::Catalog::new(config.shards, 0))));
    let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Shard 0 binds first so that port 0 becomes a real port the other shards share.
    let mut listen = config.native_listen;
    for index in 0..config.shards {
        let (bound_tx, bound_rx) = mpsc::channel();
        let spec = shard::ShardSpec {
            index,
            config: Arc::clone(&config),
            listen,
            stop: Arc::clone(&stop),
            bound: bound_tx,
            own_listener: own_listeners.next(),
            shard_addresses: Arc::clone(&shard_addresses),
            ready: ready_tx.clone(),
            inbox: inboxes.remove(0),
            mesh: Arc::clone(&mesh),
            published: Arc::clone(&published),
            connections: Arc::clone(&connections),
            metrics_listener: if index == 0 { metrics_listener.take() } else { None },
        };
        threads.push(std::thread::spawn(move || shard::run(spec)));
        match bound_rx.recv() {
            Ok(Ok(address)) => listen = address,
            Ok(Err(error)) => {
                return abort_start(format!("shard {index}: {error}"), &stop, threads);
            }
            Err(_) => {
                let error = format!("shard {index} stopped while starting");
                return abort_start(error, &stop, threads);
            }
        }
    }
    drop(ready_tx);
    for _ in 0..config.shards {
        match ready_rx.recv() {
            Ok(Ok(report)) => tracing::info!("{report}"),
            Ok(Err(error)) => return abort_start(error, &stop, threads),
            Err(_) => {
                return abort_start("a shard stopped during recovery".into(), &stop, threads);
            }
        }
    }
    // Addresses print without quotes or backslashes, so the line needs no JSON escaping.
    let mut line = format!("{{\"ready\":true,\"native\":\"{listen}\"");
    if let Some(metrics) = metrics_address {
        line.push_str(&format!(",\"metrics\":\"{metrics}\""));
    }
    if !shard_addresses.is_empty() {
        let quoted: Vec<String> = shard_addresses.iter().map(|a| format!("\"{a}\"")).collect();
        line.push_str(&format!(",\"shards\":[{}]", quoted.join(",")));
    }
    println!("{line}}}");
    let metrics = metrics_address.map_or_else(|| "off".to_string(), |address| address.to_string());
    let shards =
        if shard_addresses.is_empty() { "off".to_string() } else { shard_addresses.join(",") };
    tracing::info!(native = %listen, %metrics, shards, "ready");
    signals::wait_then_stop(signals, &stop);
    join_all(threads, ExitCode::SUCCESS)
}

/// A failed start: says why, stops the shards already started and waits for them.
fn abort_start(
    error: String,
    stop: &AtomicBool,
    threads: Vec<std::thread::JoinHandle<Result<(), String>>>,
) -> ExitCode {
    tracing::error!("{error}");
    stop.store(true, Ordering::SeqCst);
    join_all(threads, ExitCode::FAILURE)
}

fn join_all(threads: Vec<std::thread::JoinHandle<Result<(), String>>>, code: ExitCode) -> ExitCode {
    let mut code = code;
    for thread in threads {
        match thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::error!("{error}");
                code = ExitCode::FAILURE;
            }
            Err(_) => code = ExitCode::FAILURE,
        }
    }
    code
}

/// Refuses a data directory created with another shard count before any shard directory is
/// created (each shard's superblock checks it too, but only after a missing shard's directory
/// would have been made).
fn check_shard_count(data_dir: &std::path::Path, shards: u32) -> Result<(), String> {
    let entries = std::fs::read_dir(data_dir)
        .map_err(|error| format!("data directory {}: {error}", data_dir.display()))?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        if let Some(index) = name.to_str().and_then(|n| n.strip_prefix("shard-"))
            && let Ok(index) = index.parse::<u32>()
        {
            found.push(index);
        }
    }
    found.sort_unstable();
    if found.is_empty() || found == (0..shards).collect::<Vec<_>>() {
        return Ok(());
    }
    Err(format!(
        "{} holds {} shard directories but {shards} shards were asked for: a data directory keeps \
         the shard count it was created with",
        data_dir.display(),
        found.len()
    ))
}
