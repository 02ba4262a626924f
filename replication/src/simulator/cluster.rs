//! The cluster under test: [`Cluster`] and one host per node (its simulated disk, the node while
//! it is up, its restart and pause times, what waits for it while it is paused, the views it was
//! told are durable, its driver state), how a node is configured and opened on its disk, and the
//! queries scenarios make of the cluster.
//!
//! It owns the state; the steps, faults, clients, checks, driver and trace live beside it as
//! `impl Cluster` blocks of their own. Nothing here draws from the run's PRNG after
//! `Cluster::new` (the order of draws is part of the trace), reads a real clock or touches a real
//! file.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;
use shoal_engine::rng::Rng;
use shoal_engine::shard::{ShardConfig, group_dir, shard_dir};
use shoal_engine::state;
use shoal_engine::storage::sim::{Sim, SimConfig, SimStorage};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_proto::wire::HEADER_SIZE;

use super::admin::{AdminMachine, Executions};
use super::checks::Violation;
use super::clients::{Ack, Client};
use super::coverage::Coverage;
use super::faults::Damage;
use super::network::Network;
use super::options::{FaultProfile, Mode, SHUTDOWN_SEED_SALT, SimOptions};
use crate::config::{Membership, ReplicaConfig};
use crate::lag::GroupStatus;
use crate::message::Reply;
use crate::node::{Clock, Node, NodeConfig, NodeCounters, SavedProducers, Transport};
use crate::replica::{HandOverRefused, Replica};

/// A simulated cluster, for [`run`](super::run) and for scripted scenarios.
pub struct Cluster {
    pub(super) options: SimOptions,
    pub(super) mode: Mode,
    pub(super) faults: FaultProfile,
    pub(super) rng: Rng,
    pub(super) tick: u64,
    pub(super) clock: Rc<Cell<i64>>,
    pub(super) network: Network<Packet>,
    pub(super) nodes: Vec<Host>,
    pub(super) clients: Vec<Client>,
    /// (group, op) → checksum of the committed prepare, as first seen on any replica.
    pub(super) committed: BTreeMap<(u64, u64), u32>,
    /// (group, view) → the node first seen serving as that view's primary. A view number
    /// names its configuration epoch too, so this is "one primary per view of one
    /// configuration".
    pub(super) primaries: BTreeMap<(u64, u32), usize>,
    /// Every admin request's execution, as any machine first applied it.
    pub(super) admin_executions: Executions,
    pub(super) acks: Vec<Ack>,
    /// A client saw a reply that only a broken producer table gives.
    pub(super) client_violation: Option<Violation>,
    pub(super) heal_tick: u64,
    /// Faults are injected while true (the fault phase of [`run`](super::run)); scripted runs
    /// drive their own.
    pub(super) faults_active: bool,
    pub(super) crashes_due: Vec<usize>,
    pub(super) clients_active: bool,
    pub(super) liveness_from_tick: u64,
    pub(super) coverage: Coverage,
    pub(super) trace: u64,
    pub(super) deliveries: u64,
    /// Damage injected at rest, healed entries pruned as the run goes.
    pub(super) damage: Vec<Damage>,
    /// The node whose disk is full, and until which tick.
    pub(super) disk_full: Option<(usize, u64)>,
    /// Draws the controlled shutdowns, apart from `rng` so that they move none of its draws.
    pub(super) shutdown_rng: Rng,
}

impl Cluster {
    /// Builds the cluster of `options`: every node up with every group created.
    pub fn new(options: &SimOptions) -> Cluster {
        let mut rng = Rng::new(options.seed);
        let faults = options.faults.unwrap_or_else(|| FaultProfile::swarm(&mut rng));
        let mode = options.mode.unwrap_or_else(|| match rng.below(3) {
            0 => Mode::Persisted,
            1 => Mode::Replicated,
            _ => Mode::Mixed,
        });
        let replicas = usize::from(options.replicas);
        let client_count = (options.groups * options.clients_per_group) as usize;
        let network = Network::new(replicas + client_count, faults.network, rng.next_u64());
        let clock = Rc::new(Cell::new(0));
        let mut cluster = Cluster {
            options: *options,
            mode,
            faults,
            rng,
            tick: 0,
            clock,
            network,
            nodes: Vec::new(),
            clients: Vec::new(),
            committed: BTreeMap::new(),
            primaries: BTreeMap::new(),
            admin_executions: Executions::new(),
            acks: Vec::new(),
            client_violation: None,
            heal_tick: u64::MAX,
            faults_active: options.faults != Some(FaultProfile::none()),
            crashes_due: Vec::new(),
            clients_active: true,
            liveness_from_tick: u64::MAX,
            coverage: Coverage::default(),
            trace: 0xcbf2_9ce4_8422_2325,
            deliveries: 0,
            damage: Vec::new(),
            disk_full: None,
            shutdown_rng: Rng::new(options.seed ^ SHUTDOWN_SEED_SALT),
        };
        for index in 0..options.replicas {
            let sim = Sim::new(cluster.rng.next_u64(), SimConfig::default());
            let mut node = cluster.open_node(&sim, index).expect("a fresh simulated node opens");
            for group in 1..=options.groups {
                let config = cluster.group_config(group);
                sim.block_on(node.create_group(group, config)).expect("create group");
                // Retention deletes nothing the group's snapshot (the admin machine's, or a
                // data group's producer table) does not cover.
                let log = node.store_mut().group_mut(group).expect("created");
                log.set_retention_floor(0);
            }
            cluster.nodes.push(Host {
                sim,
                node: Some(node),
                restart_tick: 0,
                paused_until_tick: 0,
                stopping: None,
                inbox: VecDeque::new(),
                durable_views: BTreeMap::new(),
                admin: cluster.admin_group().map(|_| AdminMachine::new()),
                producers_saved_op: BTreeMap::new(),
            });
        }
        if cluster.faults_active {
            for host in &cluster.nodes {
                host.sim.set_read_error_one_in(cluster.faults.read_error_one_in);
            }
        }
        let members = Membership::first(options.voters(), options.replicas);
        for index in 0..client_count as u64 {
            let group = index / options.clients_per_group + 1;
            let mut client = Client::new(index + 1, group);
            let operator = index % options.clients_per_group == 0
                && cluster.admin_group() != Some(group)
                && options.learners > 0;
            if operator {
                client.operate(options.moves, members);
            }
            cluster.clients.push(client);
        }
        cluster
    }

    /// The current tick.
    pub fn tick(&self) -> u64 {
        self.tick
    }

    /// The replica of `group` on node `node`, when the node is up.
    pub fn replica(&self, node: usize, group: u64) -> Option<&Replica> {
        self.nodes[node].node.as_ref()?.replica(group)
    }

    /// The oldest op node `node`'s log of `group` still holds (retention removes from the
    /// front), when the node is up.
    pub fn log_first_op(&self, node: usize, group: u64) -> Option<u64> {
        Some(self.nodes[node].node.as_ref()?.store().group(group)?.first_op())
    }

    /// The bytes node `node`'s batch cache holds, when the node is up.
    pub fn batch_cache_bytes(&self, node: usize) -> Option<usize> {
        Some(self.nodes[node].node.as_ref()?.store().batch_cache().0)
    }

    /// The newest op of `group` node `node`'s engine knows durable (synced), when the node is up
    /// and holds the group.
    pub fn durable_op(&self, node: usize, group: u64) -> Option<u64> {
        self.nodes[node].node.as_ref()?.store().durable_op(group)
    }

    /// The node layer's counters of node `node`, when it is up (they restart with the node).
    pub fn node_counters(&self, node: usize) -> Option<NodeCounters> {
        Some(self.nodes[node].node.as_ref()?.counters())
    }

    /// `group` as node `node`'s replica sees it (lag and in-sync set on the primary), when the
    /// node is up.
    pub fn group_status(&self, node: usize, group: u64) -> Option<GroupStatus> {
        self.nodes[node].node.as_ref()?.group_status(group)
    }

    /// The node whose replica of `group` is a normal primary in the highest view, if any.
    pub fn primary(&self, group: u64) -> Option<usize> {
        (0..self.nodes.len())
            .filter_map(|n| {
                self.replica(n, group).filter(|r| r.is_primary()).map(|r| (r.view(), n))
            })
            .max()
            .map(|(_, n)| n)
    }

    /// The groups node `node` leads (its replica is their serving primary), when it is up.
    pub fn groups_led(&self, node: usize) -> Vec<u64> {
        self.nodes[node].node.as_ref().map_or_else(Vec::new, |n| n.groups_led())
    }

    /// Has node `node` hand `group` to member `to` (see [`Replica::hand_over`]).
    pub fn hand_over(&mut self, node: usize, group: u64, to: u8) -> Result<u32, HandOverRefused> {
        match self.nodes[node].node.as_mut() {
            Some(live) => live.hand_over(group, to),
            None => Err(HandOverRefused::GroupUnavailable { group }),
        }
    }

    /// Tells node `node`, if up, where `group`'s primary belongs instead of its home
    /// (`Node::set_preferred_primary`); the server keeps this in its catalog, the simulator
    /// only on live nodes.
    pub fn set_preferred_primary(&mut self, node: usize, group: u64, to: Option<u8>) {
        if let Some(live) = self.nodes[node].node.as_mut() {
            live.set_preferred_primary(group, to);
        }
    }

    /// Whether node `node` is up.
    pub fn is_up(&self, node: usize) -> bool {
        self.nodes[node].node.is_some()
    }

    /// The checksums of every op node `node` holds of `group`, from its engine's log (first
    /// op first), when the node is up and can read them.
    pub fn log_checksums(&mut self, node: usize, group: u64) -> Option<Vec<(u64, u32)>> {
        let host = &mut self.nodes[node];
        let node = host.node.as_mut()?;
        let log = node.store_mut().group_mut(group)?;
        let mut out = Vec::new();
        for op in log.first_op().max(1)..=log.head_op() {
            let stored = host.sim.block_on(log.read_op(op)).ok()??;
            out.push((op, stored.header.checksum_header));
        }
        Some(out)
    }

    /// `group`'s configuration: durability by the run's mode, retention as the options say.
    pub(super) fn group_config(&self, group: u64) -> GroupConfig {
        let durability = match self.mode {
            Mode::Persisted => Durability::Persisted,
            Mode::Replicated => Durability::Replicated,
            Mode::Mixed if group % 2 == 1 => Durability::Persisted,
            Mode::Mixed => Durability::Replicated,
        };
        GroupConfig {
            durability,
            segment_size_bytes: 1 << 20,
            segment_age_ms_max: 0,
            retention_bytes: self.options.retention_bytes,
            retention_ms: 0,
            record_size_bytes_max: (HEADER_SIZE + 4096) as u32,
            members: 0,
        }
    }

    /// Node `index`'s configuration: faster timers than production, and the repair round size
    /// the seed draws unless the options fix it.
    fn node_config(&self, index: u8) -> NodeConfig {
        let mut replica = ReplicaConfig::new(0x5ea1, 0, self.options.replicas, 0);
        replica.members = Membership::first(self.options.voters(), self.options.replicas);
        // Faster timers than production keep runs short; the ratios between them are kept.
        replica.heartbeat_timeout_ticks = 100;
        replica.view_change_timeout_ticks = 200;
        let mut draw = Rng::new(self.options.seed ^ 0x7e9a_1c00);
        let per_round_max = if draw.chance(1, 2) { 4 } else { 128 };
        replica.repair_prepares_max = self
            .options
            .repair_prepares_max
            .unwrap_or_else(|| 1 + draw.below(per_round_max) as usize);
        replica.replica_lag_ticks_max = self.options.replica_lag_ticks_max;
        replica.unclean_recovery = self.options.unclean_recovery;
        // Small, so a state transfer of even a few producers takes several pieces.
        replica.state_chunk_bytes_max = 256;
        // The admin group's machine rides along in its transfers.
        replica.transfers_carry_driver_state = true;
        NodeConfig {
            primary_return_ticks: self.options.primary_return_ticks,
            groups_sleep: self.options.groups_sleep,
            ..NodeConfig::new(index, replica)
        }
    }

    /// Every node's shard configuration. Half the seeds turn segment recycling off, so that
    /// retention retires (renames, then removes) the segments it deletes instead of recycling
    /// nearly all of them into the spare.
    fn shard_config(&self) -> ShardConfig {
        let recycle_segments = Rng::new(self.options.seed ^ 0x5e9_4ec7).chance(1, 2);
        ShardConfig { cluster: 0x5ea1, recycle_segments, ..ShardConfig::small() }
    }

    /// Opens node `index` on its disk; fails when recovery could not read or write it (a read
    /// error, a full disk): the caller retries, as a supervisor restarting the process would.
    /// Every data group's producer table comes from its newest snapshot plus the log past it,
    /// and retention may delete only what that snapshot covers, as in the server.
    pub(super) fn open_node(&self, sim: &Sim, index: u8) -> shoal_engine::Result<SimNode> {
        let dir = shard_dir(Path::new(DATA_DIR), 0);
        let clock = SimClock(Rc::clone(&self.clock));
        let storage = sim.storage();
        let admin_group = self.admin_group();
        let floors = RefCell::new(BTreeMap::new());
        let load_producers = async |group: u64| {
            if admin_group == Some(group) {
                return SavedProducers::NotKept;
            }
            let saved = state::load(&storage, &sim_group_dir(group)).await;
            let end_offset = saved.as_ref().ok().and_then(Option::as_ref).map(|s| s.end_offset);
            floors.borrow_mut().insert(group, end_offset.unwrap_or(0));
            SavedProducers::from_load(saved, |saved| Ok(Some(saved.bytes)))
        };
        let open = Node::open_with_producer_snapshots(
            sim.storage(),
            &dir,
            self.shard_config(),
            self.node_config(index),
            Outbox::default(),
            clock,
            self.options.seed ^ u64::from(index),
            load_producers,
        );
        let mut node = sim.block_on(open).map(|(node, _)| node)?;
        for (group, floor) in floors.into_inner() {
            if let Some(log) = node.store_mut().group_mut(group) {
                log.set_retention_floor(floor);
            }
        }
        Ok(node)
    }

    /// The highest commit point any live replica of `group` knows (0 when none is up).
    pub(super) fn commit_max(&self, group: u64) -> u64 {
        self.nodes
            .iter()
            .filter_map(|host| host.node.as_ref()?.replica(group).map(|r| r.commit()))
            .max()
            .unwrap_or(0)
    }

    /// Node `index`, when it is up and not paused.
    pub(super) fn live_node(&mut self, index: usize) -> Option<&mut SimNode> {
        self.live_slot(index)?.node.as_mut()
    }

    /// Node `index`'s host, when the node is up and not paused.
    pub(super) fn live_slot(&mut self, index: usize) -> Option<&mut Host> {
        let host = &mut self.nodes[index];
        (host.node.is_some() && host.paused_until_tick <= self.tick).then_some(host)
    }
}

/// Where every node's shard lives on its simulated disk.
pub(super) const DATA_DIR: &str = "/data";

/// A node of the cluster: the real node layer over a simulated disk, transport and clock.
pub(super) type SimNode = Node<SimStorage, Outbox, SimClock>;

/// One simulated host: its disk outlives the node running on it across crashes and restarts.
pub(super) struct Host {
    pub(super) sim: Sim,
    pub(super) node: Option<SimNode>,
    pub(super) restart_tick: u64,
    pub(super) paused_until_tick: u64,
    /// A controlled shutdown under way: the node hands its groups over until it is settled or
    /// the tick comes, then stops cleanly.
    pub(super) stopping: Option<Stopping>,
    pub(super) inbox: VecDeque<(usize, Packet)>,
    /// Per group, the highest (view, log view) the replica was told is durable.
    pub(super) durable_views: BTreeMap<u64, (u32, u32)>,
    /// The admin group's state machine on this node, while the node is up and the machine
    /// could follow its whole log (a log retention or a state transfer cut short is not
    /// followed).
    pub(super) admin: Option<AdminMachine>,
    /// Per data group, the op of the newest producer table snapshot saved (as the server
    /// saves one with its offsets).
    pub(super) producers_saved_op: BTreeMap<u64, u64>,
}

/// A node's controlled shutdown under way.
#[derive(Clone, Copy, Debug)]
pub(super) struct Stopping {
    /// It stops at this tick at the latest, whatever it still leads.
    pub(super) until_tick: u64,
    /// It begins hand-overs again at this tick.
    pub(super) next_hand_over_tick: u64,
    /// Once stopped it restarts after this many ticks (`None`: stays down).
    pub(super) restart_after_ticks: Option<u64>,
}

/// What travels on the simulated network: replica messages between nodes, and clients'
/// requests and the replies to them.
#[derive(Clone, Debug)]
pub(super) enum Packet {
    Replica(Bytes),
    Request { group: u64, client: u64, request: u64, body: Bytes, reconfigure: Option<Membership> },
    Reply { group: u64, reply: Reply },
}

/// The transport of a simulated node: packets wait here until the simulator takes them.
#[derive(Default)]
pub(super) struct Outbox {
    pub(super) packets: Vec<(u8, Bytes)>,
}

impl Transport for Outbox {
    fn send(&mut self, to: u8, packet: Bytes) {
        self.packets.push((to, packet));
    }
}

/// The simulated wall clock, shared by every node.
#[derive(Clone)]
pub(super) struct SimClock(Rc<Cell<i64>>);

impl Clock for SimClock {
    fn now_ms(&self) -> i64 {
        self.0.get()
    }
}

/// A group's directory on a node's simulated disk (snapshots, transferred state).
pub(super) fn sim_group_dir(group: u64) -> PathBuf {
    group_dir(&shard_dir(Path::new(DATA_DIR), 0), group)
}
