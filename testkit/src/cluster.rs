//! [`ShoalCluster`]: several `shoal` processes on 127.0.0.1 forming one cluster, for the
//! end-to-end tests and the load tool's `--spawn-cluster`.
//!
//! Every node must know every other's bus and client address before any starts, so ports cannot
//! be port 0: they are reserved by binding them here and released just before the nodes start.
//! They are picked below the kernel's ephemeral range (`ip_local_port_range`): a node restarted
//! after `kill -9` binds the same ports again, and a port in that range may meanwhile have
//! become the local end of any process's outgoing connection (measured: 2 of 30 runs of the
//! `cluster` tests beside a CPU hog failed to restart a node on its Kafka port). Another
//! process may still take a released port first; the server then fails to bind, and the whole
//! start is retried on fresh ports (bounded), so tests stay parallel-safe. It owns the
//! processes (killed when dropped) but never the data directories' parent, and it never speaks
//! the server's protocol.

use std::hash::BuildHasher;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::{ProcessError, ShoalProcess};

/// Fresh port sets tried at most when a released port was taken before a node bound it.
const START_ATTEMPTS_MAX: usize = 4;

/// How a cluster is laid out.
#[derive(Clone, Debug)]
pub struct ClusterPlan {
    /// The `shoal` binary.
    pub binary: PathBuf,
    /// Node `i`'s data directory is `root/node-i`.
    pub root: PathBuf,
    /// Nodes (3 for the usual cluster).
    pub nodes: u8,
    /// Shards per node.
    pub shards: u32,
    /// Consecutive bus ports checked free per node, from the node's base (at least `shards`):
    /// more for a test that restarts a node with more shards, whose extra shards' bus ports must
    /// not be taken by then.
    pub bus_ports_per_node: u32,
    /// Arguments every node gets after the harness's own (`--profile small`, ...).
    pub args: Vec<String>,
    /// Arguments node `i` alone gets after those (`node_args[i]`; none past the list's end).
    pub node_args: Vec<Vec<String>>,
    /// Bounds each node's start and stop.
    pub deadline: Duration,
}

impl ClusterPlan {
    /// The tests' cluster: `nodes` nodes of one shard each on the small profile, under `root`,
    /// every start and stop bounded by `deadline`.
    pub fn small(binary: PathBuf, root: &Path, nodes: u8, deadline: Duration) -> ClusterPlan {
        ClusterPlan {
            binary,
            root: root.to_path_buf(),
            nodes,
            shards: 1,
            bus_ports_per_node: 1,
            args: vec!["--profile".into(), "small".into()],
            node_args: Vec::new(),
            deadline,
        }
    }
}

/// A running cluster: `nodes[i]` is node `i`.
#[derive(Debug)]
pub struct ShoalCluster {
    pub nodes: Vec<ShoalProcess>,
    /// The `--cluster-nodes` text every node was given.
    pub nodes_text: String,
    /// Each node's client address, by node.
    pub clients: Vec<String>,
    /// Each node's Kafka address, by node (in `--cluster-nodes`, so Metadata names them all).
    pub kafkas: Vec<String>,
    /// Each node's bus base address (shard s listens on its port + s), by node.
    pub buses: Vec<String>,
    /// The founding nodes (`plan.nodes` at the start); the ones after were added.
    pub founders: u8,
    plan: ClusterPlan,
}

impl ShoalCluster {
    /// Starts every node of `plan` (each waits for its own readiness line) on reserved ports.
    pub fn start(plan: ClusterPlan) -> Result<ShoalCluster, ProcessError> {
        let mut last = None;
        for _ in 0..START_ATTEMPTS_MAX {
            let ports = reserve(&plan)?;
            match ShoalCluster::launch(&plan, &ports) {
                Ok(cluster) => return Ok(cluster),
                // Exited before its readiness line: most likely a port was taken meanwhile.
                Err(ProcessError::NotReadinessLine(line)) if line.is_empty() => {
                    last = Some(ProcessError::NotReadinessLine(line));
                }
                Err(error) => return Err(error),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    /// Node `node`'s data directory.
    pub fn data_dir(&self, node: u8) -> PathBuf {
        node_dir(&self.plan.root, node)
    }

    /// The last `lines` lines of every node's log, for a failing test to show.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for node in 0..self.plan.nodes {
            let text = std::fs::read_to_string(node_log(&self.plan.root, node)).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- node {node}\n"));
            for line in &all[all.len().saturating_sub(lines)..] {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// The command line node `node` runs with (to start it again differently, e.g. with another
    /// cluster id).
    pub fn command(&self, node: u8) -> Command {
        let node_index = usize::from(node);
        let mut command = node_command(
            &self.plan,
            node,
            &self.nodes_text,
            &self.clients[node_index],
            &self.kafkas[node_index],
        );
        if node >= self.founders {
            command.args(["--cluster-added-node", &self.node_text(node)]);
        }
        command
    }

    /// Node `node`'s addresses in the text form (`bus=...,client=...,kafka=...`).
    pub fn node_text(&self, node: u8) -> String {
        let node = usize::from(node);
        format!(
            "bus={},client={},kafka={}",
            self.buses[node], self.clients[node], self.kafkas[node]
        )
    }

    /// Reserves the ports of one more node, the next index, without starting it: the caller
    /// adds it to the cluster (`AddNode`) and then starts it with [`ShoalCluster::start_added`].
    /// Returns its index.
    pub fn reserve_node(&mut self) -> Result<u8, ProcessError> {
        let plan = ClusterPlan { nodes: 1, ..self.plan.clone() };
        let ports = reserve(&plan)?;
        let node = u8::try_from(self.clients.len()).expect("at most 32 nodes");
        self.clients.push(format!("127.0.0.1:{}", ports.clients[0]));
        self.kafkas.push(format!("127.0.0.1:{}", ports.kafkas[0]));
        self.buses.push(format!("127.0.0.1:{}", ports.buses[0]));
        self.plan.nodes += 1;
        Ok(node)
    }

    /// Starts node `node`, reserved by [`ShoalCluster::reserve_node`], as a node added to the
    /// cluster; it becomes `nodes[node]`.
    pub fn start_added(&mut self, node: u8) -> Result<(), ProcessError> {
        assert_eq!(usize::from(node), self.nodes.len(), "added nodes start in index order");
        let process = ShoalProcess::start(self.command(node), self.plan.deadline)?;
        self.nodes.push(process);
        Ok(())
    }

    /// Every node's client address, comma-separated (what `--server` takes).
    pub fn servers(&self) -> String {
        self.clients.join(",")
    }

    /// Every node's Kafka address, comma-separated (Kafka clients' `bootstrap.servers`).
    pub fn kafka_servers(&self) -> String {
        self.kafkas.join(",")
    }

    fn launch(plan: &ClusterPlan, ports: &Ports) -> Result<ShoalCluster, ProcessError> {
        let mut nodes = Vec::new();
        let clients: Vec<String> =
            ports.clients.iter().map(|port| format!("127.0.0.1:{port}")).collect();
        let buses: Vec<String> =
            ports.buses.iter().map(|port| format!("127.0.0.1:{port}")).collect();
        let kafkas: Vec<String> =
            ports.kafkas.iter().map(|port| format!("127.0.0.1:{port}")).collect();
        let nodes_text = clients
            .iter()
            .zip(&buses)
            .zip(&kafkas)
            .map(|((client, bus), kafka)| format!("bus={bus},client={client},kafka={kafka}"))
            .collect::<Vec<_>>()
            .join(";");
        for node in 0..plan.nodes {
            let (client, kafka) = (&clients[node as usize], &kafkas[node as usize]);
            let command = node_command(plan, node, &nodes_text, client, kafka);
            // Dropping the started nodes on an error kills them.
            nodes.push(ShoalProcess::start(command, plan.deadline)?);
        }
        let founders = plan.nodes;
        Ok(ShoalCluster { nodes, nodes_text, clients, kafkas, buses, founders, plan: plan.clone() })
    }
}

fn node_dir(root: &Path, node: u8) -> PathBuf {
    root.join(format!("node-{node}"))
}

/// Node `node`'s log (its stderr, appended to across restarts), beside its data directory.
pub fn node_log(root: &Path, node: u8) -> PathBuf {
    root.join(format!("node-{node}.log"))
}

fn node_command(
    plan: &ClusterPlan,
    node: u8,
    nodes_text: &str,
    client: &str,
    kafka: &str,
) -> Command {
    let mut command = ShoalProcess::command(&plan.binary, &node_dir(&plan.root, node));
    if let Ok(log) =
        std::fs::File::options().create(true).append(true).open(node_log(&plan.root, node))
    {
        command.stderr(log);
    }
    command
        .args(["--shards", &plan.shards.to_string(), "--cpus", "none"])
        .args(["--listen", client, "--kafka-listen", kafka])
        .args(["--cluster-node", &node.to_string()])
        .args(["--cluster-nodes", nodes_text])
        .args(&plan.args)
        .args(plan.node_args.get(usize::from(node)).into_iter().flatten());
    command
}

/// Ports reserved for one start: each node's client and Kafka ports and the base of its bus
/// ports.
struct Ports {
    clients: Vec<u16>,
    kafkas: Vec<u16>,
    buses: Vec<u16>,
}

/// Reserves a client port, a Kafka port and `bus_ports_per_node` (at least `shards`)
/// consecutive bus ports per node, all released on return.
fn reserve(plan: &ClusterPlan) -> Result<Ports, ProcessError> {
    let mut held = Vec::new();
    let mut ports = Ports { clients: Vec::new(), kafkas: Vec::new(), buses: Vec::new() };
    let mut picker = PortPicker::new();
    for _ in 0..plan.nodes {
        let bus_ports = plan.bus_ports_per_node.max(plan.shards);
        ports.clients.push(picker.run(1, &mut held).map_err(ProcessError::Spawn)?);
        ports.kafkas.push(picker.run(1, &mut held).map_err(ProcessError::Spawn)?);
        ports.buses.push(picker.run(bus_ports, &mut held).map_err(ProcessError::Spawn)?);
    }
    Ok(ports)
}

/// The lowest port reservations take: above the well-known and most registered services'.
const RESERVED_PORT_MIN: u16 = 10_000;

/// The fewest ports below the ephemeral range worth picking from; with fewer (a host whose
/// ephemeral range starts low), reservations let the kernel pick instead.
const PICK_SPAN_MIN: u32 = 1_000;

/// The first port of the kernel's ephemeral range (`ip_local_port_range`; Linux's default when
/// unreadable).
fn ephemeral_port_min() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Picks ports in `[RESERVED_PORT_MIN, first ephemeral port)`, from a start that differs per
/// call, so that tests reserving at once rarely try the same ports.
struct PortPicker {
    next: u32,
    span: u32,
}

impl PortPicker {
    fn new() -> Self {
        let span = u32::from(ephemeral_port_min().saturating_sub(RESERVED_PORT_MIN));
        // Keyed per process at random by the standard library.
        let start = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        PortPicker { next: (start % u64::from(span.max(1))) as u32, span }
    }

    /// Binds `count` consecutive free ports (kept in `held`) and returns the first; with no
    /// room below the ephemeral range (a narrow-range host), lets the kernel pick.
    fn run(&mut self, count: u32, held: &mut Vec<TcpListener>) -> std::io::Result<u16> {
        if self.span < PICK_SPAN_MIN {
            return consecutive_ephemeral(count, held);
        }
        // Bounded: a few hundred tries cover any plausible crowding of the range.
        for _ in 0..512 {
            let base =
                RESERVED_PORT_MIN as u32 + self.next % self.span.saturating_sub(count).max(1);
            self.next = self.next.wrapping_add(count + 1);
            let bound: Option<Vec<TcpListener>> =
                (0..count).map(|offset| bind((base + offset) as u16).ok()).collect();
            if let Some(bound) = bound {
                held.extend(bound);
                return Ok(base as u16);
            }
        }
        Err(std::io::Error::other("no run of consecutive free ports found"))
    }
}

/// Binds `count` consecutive ports the kernel picks (kept in `held`) and returns the first.
fn consecutive_ephemeral(count: u32, held: &mut Vec<TcpListener>) -> std::io::Result<u16> {
    for _ in 0..64 {
        let first = bind(0)?;
        let base = first.local_addr()?.port();
        let rest: Option<Vec<TcpListener>> = (1..count)
            .map(|offset| base.checked_add(offset as u16).and_then(|port| bind(port).ok()))
            .collect();
        if let Some(rest) = rest {
            held.push(first);
            held.extend(rest);
            return Ok(base);
        }
    }
    Err(std::io::Error::other("no run of consecutive free ports found"))
}

fn bind(port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reserved port lies below the kernel's ephemeral range (where no outgoing
    /// connection takes it while a killed node is down), the ports are distinct, and each
    /// node's bus ports are consecutive.
    #[test]
    fn reserved_ports_lie_below_the_ephemeral_range_and_bus_ports_run_consecutively() {
        let ephemeral_min = ephemeral_port_min();
        let plan = ClusterPlan {
            bus_ports_per_node: 4,
            ..ClusterPlan::small(PathBuf::from("shoal"), Path::new("/tmp"), 3, Duration::ZERO)
        };
        let ports = reserve(&plan).expect("ports");
        let mut all: Vec<u16> = ports.clients.iter().chain(&ports.kafkas).copied().collect();
        for &base in &ports.buses {
            all.extend(base..base + 4);
        }
        assert_eq!(all.len(), 3 * 6);
        if u32::from(ephemeral_min.saturating_sub(RESERVED_PORT_MIN)) >= PICK_SPAN_MIN {
            assert!(all.iter().all(|&port| (RESERVED_PORT_MIN..ephemeral_min).contains(&port)));
        }
        let count = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), count, "distinct ports");
    }
}
