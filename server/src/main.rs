//! The `shoal` server binary: starts the shards of one node on a data directory and serves until
//! SIGINT or SIGTERM.
//!
//! It owns start-up (the configuration, which `config` resolves from the config file, `SHOAL_*`
//! variables and flags; the log; the data-directory lock; the metrics listener; the shards'
//! inboxes and the published catalog; one thread per shard, each serving its connections and
//! partitions; the readiness line) and graceful shutdown. What a shard does is in `shard`,
//! `connection`, `metadata` and `metrics`.
//!
//! stdout carries the readiness line only (or what `--help`, `--print-config` and `completions`
//! print instead of serving); everything else goes to stderr: usage errors as clap writes them
//! and configuration errors as one plain line (the log is not set up before the configuration is
//! known), the rest as `tracing` events (`logging`).

use shoal_server::{alloc, config, lock, logging, metadata, ports, shard, signals};

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use config::{Args, Config, ConfigError, Host, Layers, Resolved};
use serde::Serialize;

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

/// A start-up phase's result. `Err` carries the exit code once the failure is logged and every
/// shard already started has stopped.
type Start<T> = Result<T, ExitCode>;

fn main() -> ExitCode {
    alloc::keep_freed_memory();
    let args = match config::parse_args(std::env::args_os().skip(1)) {
        Ok(args) => args,
        Err(error) => {
            // As `clap::Error::exit` does: help on stdout, a usage error on stderr; a failed
            // write has nowhere left to be reported.
            let _ = error.print();
            return ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2));
        }
    };
    if let Some(shell) = args.completions {
        return match std::io::stdout().write_all(&config::completion_script(shell)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("shoal: cannot write the completion script: {error}");
                ExitCode::FAILURE
            }
        };
    }
    let resolved = match resolve(&args) {
        Ok(resolved) => resolved,
        Err(error) => {
            eprintln!("shoal: config: {error}");
            return ExitCode::from(2);
        }
    };
    if args.print_config {
        for warning in &resolved.warnings {
            eprintln!("shoal: {warning}");
        }
        let mut stdout = std::io::stdout().lock();
        if let Err(error) = write!(stdout, "{}", resolved.config.to_toml()) {
            eprintln!("shoal: cannot print the configuration: {error}");
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }
    serve(resolved).unwrap_or_else(|code| code)
}

/// Resolves the configuration: the config file, then the `SHOAL_*` environment, then the
/// command line's setting flags, on this machine's defaults.
fn resolve(args: &Args) -> Result<Resolved, ConfigError> {
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
    layers.resolve(&host)
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

/// Serves the node: the log, signal handling, the data directory, the listeners, the shards and
/// their recovery, the readiness line; then waits for a signal and the shards' graceful stop.
fn serve(Resolved { mut config, warnings, cpu_keys }: Resolved) -> Start<ExitCode> {
    if let Err(error) = logging::init(&config.log.level) {
        eprintln!("shoal: {error}");
        return Err(ExitCode::FAILURE);
    }
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    // Signals are blocked before any thread starts, so only the signal thread receives them.
    let signals = signals::block().map_err(|error| {
        tracing::error!(%error, "cannot set up signal handling");
        ExitCode::FAILURE
    })?;
    let (stop, signalled) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    signals::watch(signals, Arc::clone(&stop), Arc::clone(&signalled));
    check_cpus(&config, &cpu_keys)?;
    let _lock = open_data_dir(&mut config)?;
    let formation = formation_of(&config)?;
    refuse_taken_ports(&config)?;
    let (metrics_listener, metrics_address) = bind_metrics(&config)?;
    let (own_listeners, shard_addresses) = bind_shard_listeners(&config)?;
    let shard_addresses = Arc::new(shard_addresses);
    let listeners = (metrics_listener, own_listeners);
    let shards = start_shards(config, listeners, &shard_addresses, formation, stop)?;
    let shards = await_recovery(shards, &signalled)?;
    if !shards.stop.load(Ordering::SeqCst) {
        announce_ready(shards.listen, metrics_address, shards.kafka_listen, &shard_addresses);
    }
    // The shards serve until a signal sets `stop` (or one fails and sets it for all).
    Ok(join_all(shards.threads, ExitCode::SUCCESS))
}

/// Creates the data directory if missing, makes `config.data_dir` absolute (so every message
/// names it unambiguously), locks it and checks its shard count.
fn open_data_dir(config: &mut Config) -> Start<lock::DataDirLock> {
    if let Err(error) = std::fs::create_dir_all(&config.data_dir) {
        let dir = config.data_dir.display();
        tracing::error!(%error, "cannot create data directory {dir}");
        return Err(ExitCode::FAILURE);
    }
    match std::fs::canonicalize(&config.data_dir) {
        Ok(data_dir) => config.data_dir = data_dir,
        Err(error) => {
            tracing::error!(%error, "data directory {}", config.data_dir.display());
            return Err(ExitCode::FAILURE);
        }
    }
    let lock = lock::DataDirLock::acquire(&config.data_dir).map_err(|error| {
        tracing::error!("{error}");
        ExitCode::FAILURE
    })?;
    if let Err(error) = check_shard_count(&config.data_dir, config.shards) {
        tracing::error!("{error}");
        return Err(ExitCode::FAILURE);
    }
    Ok(lock)
}

/// Whether the node holds its cluster's state, and its rejoin floor (`shard::formation`): a
/// one-node cluster, a directory with a `formation` file or one whose shard 0 already holds the
/// metadata group does; an empty directory of a cluster's node must first hear its peers.
fn formation_of(config: &Config) -> Start<(bool, u64)> {
    let floor = shard::read_formation(&config.data_dir).map_err(|error| {
        tracing::error!("{error}");
        ExitCode::FAILURE
    })?;
    let shard_0 = shoal_engine::shard::shard_dir(&config.data_dir, 0);
    let metadata = shoal_engine::shard::group_dir(&shard_0, metadata::METADATA_GROUP);
    let formed = config.cluster.nodes.is_empty() || floor.is_some() || metadata.exists();
    Ok((formed, floor.unwrap_or(0)))
}

/// The metrics listener and its address (`None`: the endpoint is off). Bound here, not on shard
/// 0, so a taken port stops the start before any shard runs, and without SO_REUSEPORT (monoio's
/// default), so a second server cannot share the port.
fn bind_metrics(config: &Config) -> Start<(Option<TcpListener>, Option<SocketAddr>)> {
    let metrics_listener = match config.metrics.listen.map(TcpListener::bind) {
        None => None,
        Some(Ok(listener)) => Some(listener),
        Some(Err(error)) => {
            let address = config.metrics.listen_text();
            tracing::error!(%error, "cannot listen for metrics on {address}");
            return Err(ExitCode::FAILURE);
        }
    };
    let metrics_address = match metrics_listener.as_ref().map(TcpListener::local_addr) {
        None => None,
        Some(Ok(address)) => Some(address),
        Some(Err(error)) => {
            tracing::error!(%error, "the metrics listener has no address");
            return Err(ExitCode::FAILURE);
        }
    };
    Ok((metrics_listener, metrics_address))
}

/// Refuses, before anything is created, a shard CPU (or SQPOLL CPU) this machine does not
/// have: a config may be written for another machine (`--print-config` shows it anywhere), and
/// the shard that cannot pin itself would stop the start only once the data directory exists.
/// The machine's CPUs, not this process's affinity: a thread may move to any CPU of its cpuset
/// (`taskset` on the launcher narrows only the launcher's own mask).
fn check_cpus(config: &Config, cpu_keys: &[String]) -> Start<()> {
    // SAFETY: sysconf reads a system constant; it takes no pointers.
    let configured = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    let Ok(count) = usize::try_from(configured) else { return Ok(()) };
    if count == 0 {
        return Ok(());
    }
    for (index, shard) in config.shard.iter().enumerate().take(config.shards as usize) {
        let pinned = shard.cpu.map(|cpu| (cpu_keys[index].clone(), "pinned to", cpu));
        let sqpoll = shard
            .tuning
            .sqpoll_cpu
            .map(|cpu| (format!("shard.{index}.sqpoll_cpu"), "given its SQPOLL thread on", cpu));
        for (key, what, cpu) in pinned.into_iter().chain(sqpoll) {
            if cpu >= count {
                eprintln!(
                    "shoal: config: {key}: shard {index} would be {what} CPU {cpu}, which this \
                     machine does not have (CPUs 0..{count})"
                );
                return Err(ExitCode::from(2));
            }
        }
    }
    Ok(())
}

/// Fails the start when another socket already listens on a port the shards will share
/// (native, Kafka, this node's bus ports): they bind with SO_REUSEPORT, which the kernel grants
/// a second server of the same user, so the two would split the connections without a word
/// (`shoal_server::ports`).
fn refuse_taken_ports(config: &Config) -> Start<()> {
    let bus = (0..config.shards).filter_map(|shard| {
        let address = config.cluster.bus_address(config.cluster.node, shard)?;
        Some(("peers", address))
    });
    let shared =
        [("native clients", Some(config.native_listen)), ("Kafka clients", config.kafka.listen)]
            .into_iter()
            .filter_map(|(what, address)| Some((what, address?)))
            .chain(bus);
    for (what, address) in shared {
        if let Some(other) = ports::taken(address) {
            tracing::error!(
                "cannot listen for {what} on {address}: another socket listens on {other} \
                 (another server?)"
            );
            return Err(ExitCode::FAILURE);
        }
    }
    Ok(())
}

/// Each shard's own listener (`[network] shard_listen`; none when it is off) and its address,
/// index = shard. Bound here for the same reasons as the metrics listener (a taken port stops
/// the start; no SO_REUSEPORT), and before any shard starts, so that every shard's first Hello
/// can name every shard's address.
fn bind_shard_listeners(config: &Config) -> Start<(Vec<TcpListener>, Vec<String>)> {
    let mut own_listeners = Vec::new();
    for index in 0..config.shards {
        let Some(address) = config.network.shard_listen_address(index) else { break };
        match TcpListener::bind(address) {
            Ok(listener) => own_listeners.push(listener),
            Err(error) => {
                tracing::error!(%error, "cannot listen for shard {index} on {address}");
                return Err(ExitCode::FAILURE);
            }
        }
    }
    let mut shard_addresses = Vec::with_capacity(own_listeners.len());
    for (index, listener) in own_listeners.iter().enumerate() {
        match listener.local_addr() {
            Ok(address) => shard_addresses.push(address.to_string()),
            Err(error) => {
                tracing::error!(%error, "shard {index}'s listener has no address");
                return Err(ExitCode::FAILURE);
            }
        }
    }
    Ok((own_listeners, shard_addresses))
}

/// The shard threads of a start under way.
struct Shards {
    threads: Vec<JoinHandle<Result<(), String>>>,
    /// Set to stop every shard.
    stop: Arc<AtomicBool>,
    /// Each shard's recovery report (or why recovery failed), one per shard.
    ready: mpsc::Receiver<Result<String, String>>,
    /// The native address every shard listens on (a configured port 0 made real by shard 0).
    listen: SocketAddr,
    /// The Kafka address every shard listens on, likewise; `None`: no Kafka listener.
    kafka_listen: Option<SocketAddr>,
}

impl Shards {
    /// A failed start: says why, stops the shards already started and waits for them.
    fn abort(self, error: String) -> ExitCode {
        tracing::error!("{error}");
        self.stop.store(true, Ordering::SeqCst);
        join_all(self.threads, ExitCode::FAILURE)
    }
}

/// Starts one thread per shard, each once the one before has bound its native listener: shard 0
/// binds first so that port 0 becomes a real port the other shards share.
fn start_shards(
    config: Config,
    (mut metrics_listener, own_listeners): (Option<TcpListener>, Vec<TcpListener>),
    shard_addresses: &Arc<Vec<String>>,
    (formed, rejoin_floor): (bool, u64),
    stop: Arc<AtomicBool>,
) -> Start<Shards> {
    let formed = Arc::new(AtomicBool::new(formed));
    let rejoin_floor = Arc::new(std::sync::atomic::AtomicU64::new(rejoin_floor));
    let rejoin_settled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let config = Arc::new(config);
    let (ready_tx, ready) = mpsc::channel();
    let mut shards = Shards {
        threads: Vec::new(),
        stop,
        ready,
        listen: config.native_listen,
        kafka_listen: config.kafka.listen,
    };
    let (mesh, mut inboxes) = shard::mesh(config.shards, config.network.shard_inbox_max);
    // Random per process start: a peer tells this node's restart from a reconnect by it.
    let incarnation = std::hash::BuildHasher::hash_one(
        &std::collections::hash_map::RandomState::new(),
        std::process::id(),
    );
    let published =
        Arc::new(metadata::Published::new(Arc::new(metadata::Catalog::new(config.shards, 0))));
    let connections = Arc::new(AtomicUsize::new(0));
    let mut own_listeners = own_listeners.into_iter();
    for index in 0..config.shards {
        let (bound_tx, bound_rx) = mpsc::channel();
        let spec = shard::ShardSpec {
            index,
            config: Arc::clone(&config),
            listen: shards.listen,
            kafka_listen: shards.kafka_listen,
            stop: Arc::clone(&shards.stop),
            bound: bound_tx,
            own_listener: own_listeners.next(),
            shard_addresses: Arc::clone(shard_addresses),
            ready: ready_tx.clone(),
            inbox: inboxes.remove(0),
            mesh: Arc::clone(&mesh),
            published: Arc::clone(&published),
            connections: Arc::clone(&connections),
            metrics_listener: if index == 0 { metrics_listener.take() } else { None },
            incarnation,
            formed: Arc::clone(&formed),
            rejoin_floor: Arc::clone(&rejoin_floor),
            rejoin_settled: Arc::clone(&rejoin_settled),
        };
        shards.threads.push(std::thread::spawn(move || run_shard(spec)));
        match bound_rx.recv() {
            Ok(Ok((address, kafka))) => (shards.listen, shards.kafka_listen) = (address, kafka),
            Ok(Err(error)) => return Err(shards.abort(format!("shard {index}: {error}"))),
            Err(_) => return Err(shards.abort(format!("shard {index} stopped while starting"))),
        }
    }
    Ok(shards)
}

/// Runs one shard's thread. A panic in it stops the node: the panic is reported where the
/// start waits for the shard (a start must not wait for good on a shard that died) and every
/// other shard is told to stop gracefully, so the process exits (with failure) for a
/// supervisor to restart, rather than serve on without one shard.
fn run_shard(spec: shard::ShardSpec) -> Result<(), String> {
    let (index, ready, bound, stop) =
        (spec.index, spec.ready.clone(), spec.bound.clone(), Arc::clone(&spec.stop));
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| shard::run(spec))) {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|text| (*text).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            let message = format!("shard {index} panicked: {what}");
            stop.store(true, Ordering::SeqCst);
            let _ = bound.send(Err(message.clone()));
            let _ = ready.send(Err(message.clone()));
            Err(message)
        }
    }
}

/// How often a start waiting for the shards' recovery looks whether a signal asked it to stop.
const RECOVERY_STOP_POLL: Duration = Duration::from_millis(100);

/// Waits for every shard's recovery and logs its report; gives up when `stop` is set: by a
/// shard that failed (an error), or by a signal (`signalled`: a stop that was asked for, which
/// ends the process with success once the shards stopped).
fn await_recovery(shards: Shards, signalled: &AtomicBool) -> Start<Shards> {
    let mut reported = 0;
    while reported < shards.threads.len() {
        match shards.ready.recv_timeout(RECOVERY_STOP_POLL) {
            Ok(Ok(report)) => {
                tracing::info!("{report}");
                reported += 1;
            }
            Ok(Err(error)) => return Err(shards.abort(error)),
            Err(mpsc::RecvTimeoutError::Timeout) if signalled.load(Ordering::SeqCst) => {
                tracing::info!("a signal stopped the start-up");
                shards.stop.store(true, Ordering::SeqCst);
                return Err(join_all(shards.threads, ExitCode::SUCCESS));
            }
            Err(mpsc::RecvTimeoutError::Timeout) if shards.stop.load(Ordering::SeqCst) => {
                return Err(shards.abort("stopped during start-up".into()));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(shards.abort("a shard stopped during recovery".into()));
            }
        }
    }
    Ok(shards)
}

/// The readiness line, stdout's only line: scripts and the README rely on its keys and their
/// order.
#[derive(Serialize)]
struct Ready<'a> {
    ready: bool,
    native: SocketAddr,
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kafka: Option<SocketAddr>,
    /// Each shard's own listener, only with `[network] shard_listen`.
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    shards: &'a [String],
}

/// Prints the readiness line and logs the same.
fn announce_ready(
    listen: SocketAddr,
    metrics_address: Option<SocketAddr>,
    kafka: Option<SocketAddr>,
    shards: &[String],
) {
    let ready = Ready { ready: true, native: listen, metrics: metrics_address, kafka, shards };
    let line = serde_json::to_string(&ready).expect("addresses and strings serialize");
    // A closed or broken stdout (its reader gone) must not take a serving server down: the
    // line is in the log below too.
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
        tracing::warn!(%error, "the readiness line could not be written to stdout");
    }
    let metrics = metrics_address.map_or_else(|| "off".to_string(), |address| address.to_string());
    let shards = if shards.is_empty() { "off".to_string() } else { shards.join(",") };
    let kafka = kafka.map_or_else(|| "off".to_string(), |address| address.to_string());
    tracing::info!(native = %listen, %metrics, %kafka, shards, "ready");
}

fn join_all(threads: Vec<JoinHandle<Result<(), String>>>, code: ExitCode) -> ExitCode {
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
