//! One shard: a thread with its own io_uring runtime that owns the shard's storage and replicas
//! (the node layer over the io_uring backend), ticks them every 10 ms, runs their I/O, and serves
//! the native listener.
//!
//! It never shares state with another shard; the only things crossing threads are the start-up
//! reports and the stop flag.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use monoio::net::{ListenerOpts, TcpListener};
use shoal_engine::shard::{ShardConfig, shard_dir};
use shoal_engine::storage::uring::{UringStorage, runtime};
use shoal_replication::{Clock, Node, NodeConfig, ReplicaConfig, TICK_MS, Transport};

/// The cluster id of a single node until cluster configuration arrives.
const CLUSTER: u64 = 1;

/// What a shard thread needs to start.
pub struct ShardSpec {
    pub index: u32,
    pub count: u32,
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub small: bool,
    /// The CPU to pin this thread to, if any.
    pub cpu: Option<usize>,
    pub stop: Arc<AtomicBool>,
    /// The bound listener address (or why binding failed).
    pub bound: Sender<Result<SocketAddr, String>>,
    /// What recovery found (or why it failed).
    pub ready: Sender<Result<String, String>>,
}

/// A single node has no peers: nothing is ever sent.
struct NoPeers;

impl Transport for NoPeers {
    fn send(&mut self, _to: u8, _packet: Bytes) {}
}

/// The wall clock, read only here, outside the node layer.
struct WallClock;

impl Clock for WallClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
    }
}

/// Runs the shard until the stop flag is set, then shuts its storage down cleanly.
pub fn run(spec: ShardSpec) -> Result<(), String> {
    if let Some(cpu) = spec.cpu
        && !core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
    {
        let message = format!("shard {}: cannot pin to CPU {cpu}", spec.index);
        let _ = spec.bound.send(Err(message.clone()));
        return Err(message);
    }
    let mut runtime = runtime();
    runtime.block_on(serve(spec))
}

async fn serve(spec: ShardSpec) -> Result<(), String> {
    let opts = ListenerOpts::new().reuse_port(true);
    let listener = match TcpListener::bind_with_config(spec.listen, &opts) {
        Ok(listener) => listener,
        Err(error) => {
            let message = format!("cannot listen on {}: {error}", spec.listen);
            let _ = spec.bound.send(Err(message.clone()));
            return Err(message);
        }
    };
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let _ = spec.bound.send(Ok(address));

    let started = Instant::now();
    let dir = shard_dir(&spec.data_dir, spec.index);
    let base = if spec.small { ShardConfig::small() } else { ShardConfig::default() };
    let shard_config =
        ShardConfig { cluster: CLUSTER, shard: spec.index, shard_count: spec.count, ..base };
    let node_config = NodeConfig {
        node: 0,
        replica: ReplicaConfig::new(CLUSTER, 0, 1, 0),
        message_size_bytes_max: shard_config.record_size_bytes_max + (64 << 10),
        held_messages_max: 4096,
    };
    let seed = u64::from(spec.index) ^ WallClock.now_ms() as u64;
    let open =
        Node::open(UringStorage::new(), &dir, shard_config, node_config, NoPeers, WallClock, seed);
    let mut node = match open.await {
        Ok((node, report)) => {
            let groups = report.groups.len();
            let elapsed = started.elapsed();
            let _ = spec.ready.send(Ok(format!(
                "shard {}: recovered {groups} groups in {elapsed:?} from {}",
                spec.index,
                dir.display()
            )));
            node
        }
        Err(error) => {
            let message =
                format!("shard {}: recovery of {} failed: {error}", spec.index, dir.display());
            let _ = spec.ready.send(Err(message.clone()));
            return Err(message);
        }
    };

    // The native protocol arrives with the server issue; until then a connection is closed.
    monoio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    });

    let tick = Duration::from_millis(TICK_MS);
    while !spec.stop.load(Ordering::SeqCst) {
        monoio::time::sleep(tick).await;
        node.on_tick();
        if node.has_io() {
            node.run_io().await;
        }
    }
    node.close().await.map_err(|e| format!("shard {}: shutdown: {e}", spec.index))
}
