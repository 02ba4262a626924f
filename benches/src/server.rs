//! `--spawn-server CONFIG` and `--spawn-cluster N`: starts a local `shoal` (or a cluster of N on
//! loopback) for the run — the binary beside this one, the given config, fresh data directories,
//! ephemeral ports — waits for every readiness line, and stops everything (SIGTERM, then SIGKILL
//! after a bound) and removes the directories afterwards. Starting, waiting and stopping are
//! `shoal_testkit`'s (`ShoalProcess`, `ShoalCluster`), the same as the end-to-end tests'.
//!
//! It owns those child processes; it never talks the protocol.

use std::path::{Path, PathBuf};
use std::time::Duration;

use shoal_testkit::{ClusterPlan, ShoalCluster, ShoalProcess};

/// How long a spawned server may take to become ready or to stop.
const DEADLINE: Duration = Duration::from_secs(120);

/// What was started.
#[derive(Debug)]
enum Spawned {
    One(ShoalProcess),
    Cluster(ShoalCluster),
}

/// The servers started for the run; stopped (and their directories removed) when dropped.
#[derive(Debug)]
pub struct SpawnedServer {
    spawned: Spawned,
    /// Removed once every process is stopped (a cluster's root; a single server owns its own).
    root: Option<PathBuf>,
    /// Every node's native address.
    pub addresses: Vec<String>,
}

/// A fresh directory under the system temp directory.
fn unique_dir() -> PathBuf {
    let unique = format!(
        "shoal-bench-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    std::env::temp_dir().join(unique)
}

fn shoal_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating shoal-bench: {e}"))?;
    shoal_testkit::shoal_binary_beside(&exe)
}

impl SpawnedServer {
    /// Starts `shoal --config CONFIG` on a new data directory.
    pub fn start(config: &Path) -> Result<SpawnedServer, String> {
        let dir = unique_dir();
        let mut command = ShoalProcess::command(&shoal_binary()?, &dir);
        command.arg("--config").arg(config);
        let process = ShoalProcess::start_owning(command, DEADLINE, dir)
            .map_err(|error| error.to_string())?;
        let addresses = vec![process.native().to_string()];
        Ok(SpawnedServer { spawned: Spawned::One(process), root: None, addresses })
    }

    /// Starts a cluster of `nodes` on loopback, each node with `config` when given (its
    /// `[cluster]` is replaced by the loopback one), one shard per node unless the config says
    /// otherwise; the nodes' shards are pinned in turn over the machine's CPUs.
    pub fn start_cluster(nodes: u8, config: Option<&Path>) -> Result<SpawnedServer, String> {
        let root = unique_dir();
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        let mut args = Vec::new();
        if let Some(config) = config {
            args.push("--config".to_string());
            args.push(config.display().to_string());
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let plan = ClusterPlan {
            binary: shoal_binary()?,
            root: root.clone(),
            nodes,
            shards: 1,
            bus_ports_per_node: 1,
            args,
            node_args: (0..usize::from(nodes))
                .map(|node| vec!["--cpus".into(), (node % cpus).to_string()])
                .collect(),
            deadline: DEADLINE,
        };
        let cluster = match ShoalCluster::start(plan) {
            Ok(cluster) => cluster,
            Err(error) => {
                let _ = std::fs::remove_dir_all(&root);
                return Err(error.to_string());
            }
        };
        let addresses = cluster.clients.clone();
        Ok(SpawnedServer { spawned: Spawned::Cluster(cluster), root: Some(root), addresses })
    }

    /// The (first) server's process id.
    pub fn pid(&self) -> Option<u32> {
        match &self.spawned {
            Spawned::One(process) => process.pid(),
            Spawned::Cluster(cluster) => cluster.nodes.first().and_then(ShoalProcess::pid),
        }
    }
}

impl Drop for SpawnedServer {
    fn drop(&mut self) {
        // Past the deadline a process is killed; a single server's own drop removes its
        // directory, a cluster's root is removed here.
        match &mut self.spawned {
            Spawned::One(process) => {
                let _ = process.terminate();
            }
            Spawned::Cluster(cluster) => {
                for node in &mut cluster.nodes {
                    let _ = node.terminate();
                }
            }
        }
        if let Some(root) = &self.root {
            let _ = std::fs::remove_dir_all(root);
        }
    }
}
