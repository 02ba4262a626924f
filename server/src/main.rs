//! The `shoal` server binary: starts the shards of one node on a data directory and serves until
//! SIGINT or SIGTERM.
//!
//! Today it owns start-up (flags, the data-directory lock, one thread per shard with its own
//! io_uring runtime running the node layer, the native listener, the readiness line) and graceful
//! shutdown. The native protocol, streams/topics/partitions, produce and consume arrive with the
//! rest of the thread-per-core server issue; until then connections are accepted and closed.

mod lock;
mod shard;
mod signals;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

const USAGE: &str = "\
usage: shoal [--data-dir DIR] [--listen ADDR] [--shards N] [--cpus LIST] [--profile P]

  --data-dir DIR   data directory (default ./shoal-data), created if missing, locked while served
  --listen ADDR    native protocol address (default 127.0.0.1:7070; port 0 picks a free port)
  --shards N       shards, one thread each (default: one per available CPU); a data directory
                   keeps the shard count it was created with
  --cpus LIST      CPU of each shard thread, comma-separated (one per shard), or none (no
                   pinning); default: shard i on the i-th available CPU when there are enough
  --profile P      storage sizes: default (production) or small (tests: small journal and rings)

Prints one JSON line {\"ready\":true,\"native\":\"ADDR\"} once recovery is done and the listener is
bound. SIGINT or SIGTERM shuts down gracefully (flush, checkpoint, clean-shutdown flag, exit 0);
a second signal exits at once.
";

/// What the flags asked for.
pub struct Options {
    data_dir: PathBuf,
    listen: SocketAddr,
    shards: u32,
    /// `None`: the default placement; `Some(empty)`: no pinning.
    cpus: Option<Vec<usize>>,
    small: bool,
}

fn parse() -> Result<Options, String> {
    let mut options = Options {
        data_dir: PathBuf::from("shoal-data"),
        listen: "127.0.0.1:7070".parse().expect("a valid default address"),
        shards: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        cpus: None,
        small: false,
    };
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        if flag == "--help" || flag == "-h" {
            return Err(String::new());
        }
        let value = words.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--data-dir" => options.data_dir = PathBuf::from(value),
            "--listen" => {
                options.listen =
                    value.parse().map_err(|_| format!("--listen {value}: not an address"))?;
            }
            "--shards" => {
                options.shards = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=256).contains(n))
                    .ok_or_else(|| format!("--shards {value}: use 1 to 256"))?;
            }
            "--cpus" => {
                options.cpus = Some(if value == "none" {
                    Vec::new()
                } else {
                    value
                        .split(',')
                        .map(|cpu| cpu.trim().parse::<usize>())
                        .collect::<Result<_, _>>()
                        .map_err(|_| {
                            format!("--cpus {value}: a comma-separated CPU list or none")
                        })?
                });
            }
            "--profile" => {
                options.small = match value.as_str() {
                    "default" => false,
                    "small" => true,
                    other => return Err(format!("--profile {other}: use default or small")),
                };
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if let Some(cpus) = &options.cpus
        && !cpus.is_empty()
        && cpus.len() != options.shards as usize
    {
        return Err(format!(
            "--cpus names {} CPUs for {} shards: give one per shard, or none",
            cpus.len(),
            options.shards
        ));
    }
    Ok(options)
}

/// The CPU each shard thread is pinned to (`None`: not pinned).
fn placement(options: &Options) -> Vec<Option<usize>> {
    let shards = options.shards as usize;
    match &options.cpus {
        Some(cpus) if cpus.is_empty() => vec![None; shards],
        Some(cpus) => cpus.iter().map(|&cpu| Some(cpu)).collect(),
        None => {
            let available: Vec<usize> = core_affinity::get_core_ids()
                .unwrap_or_default()
                .into_iter()
                .map(|core| core.id)
                .collect();
            if available.len() < shards {
                eprintln!(
                    "shoal: {shards} shards on {} CPUs: shard threads are not pinned",
                    available.len()
                );
                return vec![None; shards];
            }
            available.into_iter().take(shards).map(Some).collect()
        }
    }
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(error) => {
            if !error.is_empty() {
                eprintln!("shoal: {error}\n");
            }
            eprint!("{USAGE}");
            return if error.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(2) };
        }
    };
    // Signals are blocked before any thread starts, so only the signal thread receives them.
    let signals = match signals::block() {
        Ok(signals) => signals,
        Err(error) => {
            eprintln!("shoal: cannot set up signal handling: {error}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(error) = std::fs::create_dir_all(&options.data_dir) {
        eprintln!("shoal: cannot create data directory {}: {error}", options.data_dir.display());
        return ExitCode::FAILURE;
    }
    // Absolute from here on, so every message names the directory unambiguously.
    let options = match std::fs::canonicalize(&options.data_dir) {
        Ok(data_dir) => Options { data_dir, ..options },
        Err(error) => {
            eprintln!("shoal: data directory {}: {error}", options.data_dir.display());
            return ExitCode::FAILURE;
        }
    };
    let _lock = match lock::DataDirLock::acquire(&options.data_dir) {
        Ok(lock) => lock,
        Err(error) => {
            eprintln!("shoal: {error}");
            return ExitCode::FAILURE;
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let mut threads = Vec::new();
    // Shard 0 binds first so that port 0 becomes a real port the other shards share.
    let mut listen = options.listen;
    let cpus = placement(&options);
    for index in 0..options.shards {
        let (bound_tx, bound_rx) = mpsc::channel();
        let spec = shard::ShardSpec {
            index,
            count: options.shards,
            data_dir: options.data_dir.clone(),
            listen,
            small: options.small,
            cpu: cpus[index as usize],
            stop: Arc::clone(&stop),
            bound: bound_tx,
            ready: ready_tx.clone(),
        };
        threads.push(std::thread::spawn(move || shard::run(spec)));
        match bound_rx.recv() {
            Ok(Ok(address)) => listen = address,
            Ok(Err(error)) => {
                eprintln!("shoal: shard {index}: {error}");
                stop.store(true, Ordering::SeqCst);
                return join_all(threads, ExitCode::FAILURE);
            }
            Err(_) => {
                eprintln!("shoal: shard {index} stopped while starting");
                stop.store(true, Ordering::SeqCst);
                return join_all(threads, ExitCode::FAILURE);
            }
        }
    }
    drop(ready_tx);
    for _ in 0..options.shards {
        match ready_rx.recv() {
            Ok(Ok(report)) => eprintln!("shoal: {report}"),
            Ok(Err(error)) => {
                eprintln!("shoal: {error}");
                stop.store(true, Ordering::SeqCst);
                return join_all(threads, ExitCode::FAILURE);
            }
            Err(_) => {
                eprintln!("shoal: a shard stopped during recovery");
                stop.store(true, Ordering::SeqCst);
                return join_all(threads, ExitCode::FAILURE);
            }
        }
    }
    println!("{{\"ready\":true,\"native\":\"{listen}\"}}");
    signals::wait_then_stop(signals, &stop);
    join_all(threads, ExitCode::SUCCESS)
}

fn join_all(threads: Vec<std::thread::JoinHandle<Result<(), String>>>, code: ExitCode) -> ExitCode {
    let mut code = code;
    for thread in threads {
        match thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                eprintln!("shoal: {error}");
                code = ExitCode::FAILURE;
            }
            Err(_) => code = ExitCode::FAILURE,
        }
    }
    code
}
