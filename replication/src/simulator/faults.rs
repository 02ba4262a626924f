//! Fault injection: what the fault phase draws each tick (a full disk, partitions, crashes,
//! pauses), crashes as a process crash or a power loss (sometimes in the middle of an I/O round),
//! restarts (the supervisor's reopen after fail-stop too), bit flips at rest within the damage
//! budget, and the same faults on demand for scripted scenarios.
//!
//! It must never inject a fault outside the fault model of DESIGN.md §6 for the run's mode
//! (`crash_allowed`, the budget of `inject_damage`), and never change the order in which it draws
//! from the run's PRNG (the trace hash pins it).

use std::path::{Path, PathBuf};

use shoal_engine::shard::shard_dir;
use shoal_engine::storage::sim::Sim;

use super::checks::{Violation, into_result};
use super::cluster::{Cluster, DATA_DIR, Packet};
use super::coverage::add_counters;
use super::network::NetworkConfig;
use super::options::Mode;
use crate::replica::Status;

impl Cluster {
    /// Crashes node `node` now — a power loss (the simulated disk's crash semantics) or a
    /// process crash (the page cache survives) — whatever the fault model says. It stays down
    /// until [`Cluster::restart`].
    pub fn crash(&mut self, node: usize, power_loss: bool) {
        self.crash_node(node, power_loss, false);
        self.nodes[node].restart_tick = u64::MAX;
    }

    /// Restarts a crashed node now (recovery runs, its replicas start `Recovering`).
    pub fn restart(&mut self, node: usize) -> Result<(), Violation> {
        assert!(self.nodes[node].node.is_none(), "restart a crashed node");
        self.nodes[node].restart_tick = self.tick;
        into_result(self.wake_nodes())
    }

    /// Cuts (or restores) the directed link `from` → `to` between nodes.
    pub fn set_link(&mut self, from: usize, to: usize, up: bool) {
        self.network.set_link(from, to, up);
    }

    /// Throttles the directed link `from` → `to` between nodes: it loses `loss_per_million` of
    /// its packets (or the network's own loss rate, where higher) until [`Cluster::heal`] or
    /// [`Cluster::stop_faults`].
    pub fn set_link_loss(&mut self, from: usize, to: usize, loss_per_million: u32) {
        self.network.set_link_loss(from, to, loss_per_million);
    }

    /// Pauses node `node` for the next `ticks` steps, as a stopped process: it neither ticks nor
    /// runs I/O, and what arrives meanwhile waits in its inbox (at most `PAUSED_INBOX_MAX`
    /// packets; the rest are lost). [`Cluster::stop_faults`] resumes it early.
    pub fn pause(&mut self, node: usize, ticks: u64) {
        self.coverage.pauses += 1;
        self.nodes[node].paused_until_tick = self.tick + 1 + ticks;
    }

    /// Cuts a node off in both directions until [`Cluster::heal`].
    pub fn isolate(&mut self, node: usize) {
        self.network.isolate(node);
    }

    /// Brings every link back up.
    pub fn heal(&mut self) {
        self.network.heal();
    }

    /// Shuts node `node` down cleanly (everything flushed and checkpointed, a clean shutdown
    /// recorded); it stays down until [`Cluster::restart`].
    pub fn shutdown(&mut self, node: usize) {
        assert!(self.stop_cleanly(node), "a clean shutdown");
        self.nodes[node].restart_tick = u64::MAX;
    }

    /// Flips one bit at rest in the durable record of `op` of `group` on node `node`'s disk
    /// (chosen by the seed): latent damage, found when the record is next read. False when no
    /// durable copy of the op is on that disk.
    pub fn corrupt_op(&mut self, node: usize, group: u64, op: u64) -> bool {
        let records = self.chain_records(node, group);
        let Some(record) = records.into_iter().find(|r| r.0 == op) else { return false };
        self.flip(node, group, record)
    }

    /// Nodes holding damage to `op` of `group` that they have not cut or repaired yet.
    pub fn damaged_replicas(&self, group: u64, op: u64) -> usize {
        self.damage.iter().filter(|d| d.group == group && d.op == op && self.unhealed(d)).count()
    }

    /// Ends the fault phase: heals the network, makes it reliable, resumes paused nodes and
    /// restarts crashed ones.
    pub fn stop_faults(&mut self) {
        self.faults_active = false;
        self.network.heal();
        self.network.set_config(NetworkConfig::reliable());
        self.heal_tick = u64::MAX;
        self.disk_full = None;
        for host in &mut self.nodes {
            host.sim.set_read_error_one_in(0);
            host.sim.set_capacity_bytes(u64::MAX);
            host.paused_until_tick = 0;
            host.stopping = None;
            if host.node.is_none() {
                host.restart_tick = self.tick;
            }
        }
    }

    /// The fault phase's draws for this tick: a full disk starts or ends, a partition heals or
    /// starts, and each live node may be due to crash later in the step or pause.
    pub(super) fn inject_faults(&mut self) {
        let faults = self.faults;
        self.damage_prune();
        match self.disk_full {
            Some((index, until)) if self.tick >= until => {
                self.nodes[index].sim.set_capacity_bytes(u64::MAX);
                self.disk_full = None;
            }
            Some(_) => {}
            None if self.rng.chance(u64::from(faults.disk_full_per_million), 1_000_000) => {
                let index = self.rng.below(self.nodes.len() as u64) as usize;
                let sim = &self.nodes[index].sim;
                sim.set_capacity_bytes(sim.used_bytes() + self.rng.below(DISK_FULL_SLACK_BYTES));
                self.coverage.disk_full_periods += 1;
                self.disk_full =
                    Some((index, self.tick + 1 + self.rng.below(faults.disk_full_ticks_max)));
            }
            None => {}
        }
        if self.tick >= self.heal_tick {
            self.network.heal();
            self.heal_tick = u64::MAX;
        }
        if self.heal_tick == u64::MAX
            && self.rng.chance(u64::from(faults.partition_per_million), 1_000_000)
        {
            self.partition();
        }
        for index in 0..self.nodes.len() {
            if self.nodes[index].node.is_none() {
                continue;
            }
            if self.rng.chance(u64::from(faults.crash_per_million), 1_000_000) {
                // Struck later in the step, once this tick's deliveries queued writes, so a
                // power loss can land in the middle of an I/O round.
                self.crashes_due.push(index);
            } else if self.rng.chance(u64::from(faults.pause_per_million), 1_000_000)
                && self.nodes[index].paused_until_tick <= self.tick
            {
                self.coverage.pauses += 1;
                self.nodes[index].paused_until_tick =
                    self.tick + 1 + self.rng.below(faults.pause_ticks_max);
            }
        }
        self.draw_shutdowns();
    }

    /// Restarts crashed nodes whose time has come, checking their views did not regress.
    pub(super) fn wake_nodes(&mut self) -> Option<Violation> {
        for index in 0..self.nodes.len() {
            if self.nodes[index].node.is_none() && self.nodes[index].restart_tick <= self.tick {
                if self.faults_active
                    && self.rng.chance(u64::from(self.faults.corrupt_on_restart_percent), 100)
                {
                    self.inject_damage(index);
                }
                let node = match self.open_node(&self.nodes[index].sim, index as u8) {
                    Ok(node) => node,
                    Err(_) => {
                        // Fail-stop: the supervisor tries again next tick.
                        self.coverage.opens_failed += 1;
                        self.nodes[index].restart_tick = self.tick + 1;
                        continue;
                    }
                };
                if let Some(violation) = self.check_views_after_restart(index, &node) {
                    return Some(violation);
                }
                self.nodes[index].node = Some(node);
                if let Some(violation) = self.rebuild_admin(index) {
                    return Some(violation);
                }
            }
        }
        None
    }

    /// Fail-stop with automatic reopen: a node with a group its engine stopped (an I/O failure)
    /// is restarted, as a supervisor restarts the process, and recovery reopens the group. (A
    /// group of one that finds damage stays stopped across restarts, DESIGN.md §6; nothing here
    /// damages a group of one.)
    pub(super) fn supervise(&mut self) {
        for index in 0..self.nodes.len() {
            let Some(node) = &self.nodes[index].node else { continue };
            if node.group_ids().iter().all(|&group| node.group_failure(group).is_none()) {
                continue;
            }
            self.coverage.failed_restarts += 1;
            self.crash_node(index, false, false);
            self.nodes[index].restart_tick = self.tick + 1;
        }
    }

    /// Crashes node `index` if the fault model allows it now.
    pub(super) fn maybe_crash(&mut self, index: usize) {
        let power = self.rng.chance(u64::from(self.faults.power_loss_percent), 100);
        if !self.crash_allowed(index, power) {
            return;
        }
        let during_io = self.rng.chance(u64::from(self.faults.crash_during_io_percent), 100);
        self.crash_node(index, power, during_io);
        self.nodes[index].restart_tick =
            self.tick + 1 + self.rng.below(self.faults.restart_ticks_max);
    }

    /// Takes node `index` down: what it sent this step goes out first, then a power loss (maybe
    /// in the middle of its I/O round) applies the disk's crash semantics, or a process crash
    /// keeps the page cache; what waited for it is dropped.
    fn crash_node(&mut self, index: usize, power: bool, during_io: bool) {
        self.coverage.crashes += 1;
        let host = &mut self.nodes[index];
        let mut node = host.node.take().expect("crash a live node");
        add_counters(&mut self.coverage, &node);
        self.coverage.admin_duplicates += host.admin.take().map_or(0, |a| a.duplicates);
        // What the node sent this step, before its I/O round, left before the crash: a message
        // that went out too early must be able to reveal lost state.
        let replicas = self.options.replicas as usize;
        for (to, packet) in std::mem::take(&mut node.transport_mut().packets) {
            self.network.send(self.tick, index, usize::from(to), Packet::Replica(packet));
        }
        for (group, reply) in node.take_replies() {
            let client = replicas + (reply.client - 1) as usize;
            self.network.send(self.tick, index, client, Packet::Reply { group, reply });
        }
        if power {
            self.coverage.power_losses += 1;
            let before = host.sim.stats();
            if during_io && node.has_io() {
                self.coverage.crashes_during_io += 1;
                let after_io = 1 + self.rng.below(16);
                let _ = host.sim.run_until_crash(node.run_io(), after_io);
            }
            drop(node);
            host.sim.crash();
            let after = host.sim.stats();
            self.coverage.torn_writes += after.writes_torn_at_crash - before.writes_torn_at_crash;
            self.coverage.writes_lost += after.writes_lost_at_crash - before.writes_lost_at_crash;
        } else {
            drop(node);
        }
        host.inbox.clear();
        host.paused_until_tick = 0;
        host.stopping = None;
        self.network.drop_endpoint_inbound(index);
    }

    /// DESIGN.md §6: `persisted` groups survive any crashes; `replicated` groups survive at
    /// most f replicas down, where a replica that restarted but has not caught up still counts
    /// as down, and so does one in a controlled shutdown (it goes down once settled, and may
    /// come back with damage injected at its restart: seed 597 took a second replica down
    /// that way and left group 2 unable to finish a view change); a lone `replicated` replica
    /// survives process crashes only. The budget counts voters: nothing acknowledged depends
    /// on a learner, so a learner's node may always go down.
    pub(super) fn crash_allowed(&self, index: usize, power: bool) -> bool {
        let voters = usize::from(self.options.voters());
        // Changing configurations make any node a voter in turn: a node down counts against
        // the voters' f wherever it is.
        let n = if self.options.moves > 0 { usize::from(self.options.replicas) } else { voters };
        if self.mode == Mode::Persisted || index >= n {
            return true;
        }
        if voters == 1 {
            return !power;
        }
        let f = (voters - 1) / 2;
        let down_others = (0..n)
            .filter(|&i| i != index && (!self.caught_up(i) || self.nodes[i].stopping.is_some()))
            .count();
        down_others < f && self.caught_up(index)
    }

    /// Whether node `index` is up and every replica on it is normal with every committed op.
    fn caught_up(&self, index: usize) -> bool {
        let Some(node) = &self.nodes[index].node else { return false };
        if self.node_damaged(index) {
            // Damage it has not cut or repaired yet: it lacks ops, like a replica that is down.
            return false;
        }
        (1..=self.options.groups).all(|group| {
            let commit_max = self.commit_max(group);
            node.replica(group).is_some_and(|r| {
                r.status() == Status::Removed
                    || r.status() == Status::Normal
                        && !r.needs_start_view()
                        && r.faulty_from().is_none()
                        && r.op_appended() >= commit_max
            })
        })
    }

    /// Starts a partition until a drawn tick: one node isolated, a random split, or a one-way
    /// cut between two nodes.
    fn partition(&mut self) {
        let n = self.nodes.len();
        if n < 2 {
            return;
        }
        self.coverage.partitions += 1;
        let a = self.rng.below(n as u64) as usize;
        let b = (a + 1 + self.rng.below(n as u64 - 1) as usize) % n;
        match self.rng.below(3) {
            0 => self.network.isolate(a),
            1 => {
                let side: Vec<usize> = (0..n).filter(|_| self.rng.chance(1, 2)).collect();
                let other: Vec<usize> = (0..n).filter(|i| !side.contains(i)).collect();
                self.network.partition(&side, &other);
            }
            _ => {
                self.coverage.one_way_partitions += 1;
                self.network.partition_one_way(&[a], &[b]);
            }
        }
        self.heal_tick = self.tick + 1 + self.rng.below(self.faults.partition_ticks_max);
    }

    /// Damages a crashed node's disk before it restarts, within the budget: never while any
    /// other node holds damage it has not cut or repaired (so at most one replica per op, and
    /// f ≥ 1), never in a group of one (no peer to repair from: out of the model, DESIGN.md §6).
    /// The record is one of the node's newest durable ones, which recovery reads back.
    fn inject_damage(&mut self, index: usize) {
        if self.options.voters() < 3
            || self.damage.iter().any(|d| d.node != index && self.unhealed(d))
        {
            return;
        }
        let group = 1 + self.rng.below(self.options.groups);
        let chain = self.chain_records(index, group);
        let newest = chain.last().map_or(0, |r| r.0);
        let sim = &self.nodes[index].sim;
        // Only where a read sees the durable bytes: an unsynced write a process crash left in
        // the page cache would hide the damage until a power loss.
        let candidates: Vec<DiskRecord> = chain
            .into_iter()
            .filter(|r| r.0 + DAMAGE_NEWEST_OPS > newest)
            .filter(|(_, path, position, size)| {
                let range = *position as usize..(position + size) as usize;
                let visible = sim.file_contents(path);
                let durable = sim.durable_contents(path);
                visible.as_ref().and_then(|v| v.get(range.clone()))
                    == durable.as_ref().and_then(|d| d.get(range.clone()))
            })
            .collect();
        if candidates.is_empty() {
            return;
        }
        let record = candidates[self.rng.below(candidates.len() as u64) as usize].clone();
        let _ = self.flip(index, group, record);
    }

    /// Flips a bit of the record; false (and undone) when the byte is not durable, or an
    /// unsynced write in the page cache covers it, so that no read would see the damage.
    fn flip(&mut self, node: usize, group: u64, (op, path, position, size): DiskRecord) -> bool {
        let sim = &self.nodes[node].sim;
        let byte = position + self.rng.below(size);
        let bit = self.rng.below(8) as u8;
        let durable = sim.durable_contents(&path).map_or(0, |bytes| bytes.len() as u64);
        let visible = |sim: &Sim| sim.file_contents(&path).map(|bytes| bytes[byte as usize]);
        let before = visible(sim);
        if byte >= durable || before.is_none() {
            return false;
        }
        sim.corrupt(&path, byte, bit);
        let flipped = visible(sim).unwrap_or(0);
        if Some(flipped) == before {
            sim.corrupt(&path, byte, bit);
            return false;
        }
        self.coverage.corruptions_injected += 1;
        self.damage.push(Damage { node, group, op, path, record_bytes: position, byte, flipped });
        true
    }

    /// The records of `group`'s chain in node `node`'s segments as a read sees them now: from
    /// the first segment's first record, each the next op naming its predecessor's checksum,
    /// until the first that is not. Stale records past the chain's end (from before a
    /// truncation) are not the log's, and never chosen for damage.
    fn chain_records(&self, node: usize, group: u64) -> Vec<DiskRecord> {
        let sim = &self.nodes[node].sim;
        let dir = shoal_engine::shard::group_dir(&shard_dir(Path::new(DATA_DIR), 0), group);
        let record_max = self.group_config(group).record_size_bytes_max as usize;
        let mut files: Vec<(u64, PathBuf)> = sim
            .paths()
            .into_iter()
            .filter(|path| path.parent() == Some(dir.as_path()))
            .filter_map(|path| {
                let name = path.file_name()?.to_str()?;
                Some((shoal_engine::segment::parse_log_name(name)?, path.clone()))
            })
            .collect();
        files.sort();
        let mut records: Vec<DiskRecord> = Vec::new();
        let mut previous: Option<(u64, u32)> = None;
        'files: for (_, path) in files {
            let Some(bytes) = sim.file_contents(&path) else { continue };
            let mut position = 0usize;
            while position < bytes.len() {
                let Ok(header) = shoal_engine::record::check_standalone(
                    &bytes[position..],
                    0x5ea1,
                    group,
                    record_max,
                ) else {
                    break;
                };
                let Some(prepare) = header.as_prepare() else { break };
                if previous.is_some_and(|(op, checksum)| {
                    prepare.op != op + 1 || prepare.parent != checksum
                }) {
                    break 'files;
                }
                previous = Some((prepare.op, header.checksum_header));
                records.push((prepare.op, path.clone(), position as u64, u64::from(header.size)));
                position += header.size as usize;
            }
        }
        records
    }

    /// Whether damage still counts against the budget: the byte still holds the flipped value,
    /// or the node cut it and has not had the cut ops back yet (its replica is down, still has
    /// a faulty suffix, or its log still carries the damage marker) — a faulty suffix may hide
    /// any op past the cut, so it counts as damage to all of them.
    pub(super) fn unhealed(&self, damage: &Damage) -> bool {
        self.damage_on_disk(damage)
            || self.nodes[damage.node].node.as_ref().is_none_or(|node| {
                node.damaged_from(damage.group).is_some()
                    || node.replica(damage.group).is_none_or(|r| r.faulty_from().is_some())
            })
    }

    /// Whether the damaged byte still holds the flipped value.
    pub(super) fn damage_on_disk(&self, damage: &Damage) -> bool {
        self.nodes[damage.node]
            .sim
            .file_contents(&damage.path)
            .is_some_and(|bytes| bytes.get(damage.byte as usize) == Some(&damage.flipped))
    }

    /// Whether node `index` holds damage it has not cut or repaired yet.
    fn node_damaged(&self, index: usize) -> bool {
        self.damage.iter().any(|d| d.node == index && self.unhealed(d))
    }

    /// Forgets damage that has healed.
    fn damage_prune(&mut self) {
        let damage = std::mem::take(&mut self.damage);
        self.damage = damage.into_iter().filter(|d| self.unhealed(d)).collect();
    }
}

/// A bit flipped at rest in a node's durable record. It counts as damage until the node has cut
/// or repaired it (the byte no longer holds the flipped value, or the file is gone).
#[derive(Clone, Debug)]
pub(super) struct Damage {
    pub(super) node: usize,
    pub(super) group: u64,
    pub(super) op: u64,
    pub(super) path: PathBuf,
    /// Where the damaged record begins.
    pub(super) record_bytes: u64,
    pub(super) byte: u64,
    pub(super) flipped: u8,
}

/// A durable record found on a node's disk: (op, file, position, size).
type DiskRecord = (u64, PathBuf, u64, u64);

/// Bytes a full disk leaves free at most.
const DISK_FULL_SLACK_BYTES: u64 = 32 << 10;

/// Newest records (per group, on the node's visible log) that damage injected at restart may
/// hit: a restarted node reads them back (the checkpoint record, its newest headers), so the
/// damage is found then, not left latent for the rest of the run.
const DAMAGE_NEWEST_OPS: u64 = 64;
