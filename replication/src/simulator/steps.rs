//! The run and its steps: [`run`] drives the fault phase and then the liveness phase;
//! [`Cluster::step`] is one tick — faults, restarts, deliveries, every live node's tick and I/O
//! round, retention, the nodes' outputs, the supervisor, then the clients — and [`Outcome`] is
//! what a run reports at its end.
//!
//! The order of a step's effects is the seed's trace: it must never change without every
//! recorded trace hash changing with it. The step judges nothing itself: it hands what it sees to
//! the checks (`checks`) at fixed points.

use bytes::BytesMut;
use shoal_engine::shard::remove_retired_files;

use super::checks::{Violation, into_result};
use super::cluster::{Cluster, Host, Packet};
use super::coverage::{Coverage, add_counters};
use super::options::{Mode, SimOptions};
use super::trace::trace_message;
use crate::message::Request;
use crate::replica::Status;

/// The result of one run.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// The mode the run used.
    pub mode: Mode,
    /// Hash of every delivery, reply and commit in order: equal for equal seeds.
    pub trace_hash: u64,
    /// Ticks simulated.
    pub ticks: u64,
    /// Branches exercised.
    pub coverage: Coverage,
    /// The first invariant violated, if any.
    pub violation: Option<Violation>,
}

/// Runs one seed to the end (or to the first violation, or to a panic inside the system under
/// test, which the caller may catch).
pub fn run(options: &SimOptions) -> Outcome {
    let mut cluster = Cluster::new(options);
    let violation = cluster.run().err();
    cluster.finish(violation)
}

/// How often nodes enforce retention when a run configures it.
pub const RETENTION_INTERVAL_TICKS: u64 = 100;
/// Deliveries buffered for a paused node at most.
const PAUSED_INBOX_MAX: usize = 1_024;
/// Deliveries a run may make at most before it is declared a livelock.
const DELIVERIES_MAX: u64 = 50_000_000;

impl Cluster {
    /// One tick: faults (during the fault phase), restarts, deliveries, every live node's tick
    /// and I/O round, their outputs, then the clients.
    pub fn step(&mut self) -> Result<(), Violation> {
        self.tick += 1;
        self.clock.set(self.tick as i64 * 10);
        if self.faults_active {
            if self.tick < self.options.ticks {
                self.inject_faults();
            } else {
                self.stop_faults();
            }
        }
        into_result(self.wake_nodes())?;
        into_result(self.deliver())?;
        for index in 0..self.nodes.len() {
            if let Some(node) = self.live_node(index) {
                node.on_tick();
            }
        }
        for index in std::mem::take(&mut self.crashes_due) {
            if self.nodes[index].node.is_some() {
                self.maybe_crash(index);
            }
        }
        into_result(self.run_io())?;
        if self.options.retention_bytes > 0 && self.tick.is_multiple_of(RETENTION_INTERVAL_TICKS) {
            self.enforce_retention();
        }
        into_result(self.collect())?;
        into_result(self.check_primaries())?;
        into_result(self.client_violation.take())?;
        self.advance_shutdowns();
        self.supervise();
        self.drive_clients();
        Ok(())
    }

    /// Runs `ticks` steps.
    pub fn run_ticks(&mut self, ticks: u64) -> Result<(), Violation> {
        for _ in 0..ticks {
            self.step()?;
        }
        Ok(())
    }

    /// Steps until `done` holds (true) or `ticks_max` steps passed (false).
    pub fn run_until(
        &mut self,
        ticks_max: u64,
        mut done: impl FnMut(&Cluster) -> bool,
    ) -> Result<bool, Violation> {
        for _ in 0..ticks_max {
            if done(self) {
                return Ok(true);
            }
            self.step()?;
        }
        Ok(done(self))
    }

    /// Ends every fault, then requires each client to complete `liveness_requests` more
    /// requests within `liveness_ticks`.
    pub fn finish_liveness(&mut self) -> Result<(), Violation> {
        self.stop_faults();
        self.clients_active = true;
        self.liveness_from_tick = self.tick;
        for client in &mut self.clients {
            client.completed_late = 0;
        }
        for _ in 0..self.options.liveness_ticks {
            self.step()?;
            if self.liveness_done() {
                return Ok(());
            }
        }
        let stuck: Vec<String> = self
            .clients
            .iter()
            .filter(|c| c.completed_late < self.options.liveness_requests)
            .map(|c| format!("client {} (group {}) request {}", c.id, c.group, c.next_request))
            .collect();
        Err(Violation {
            tick: self.tick,
            what: format!(
                "liveness: {} ticks after faults stopped, still waiting: {}; {}",
                self.options.liveness_ticks,
                stuck.join(", "),
                self.describe()
            ),
        })
    }

    /// The whole run: the fault phase, then the liveness phase.
    fn run(&mut self) -> Result<(), Violation> {
        while self.tick < self.options.ticks {
            self.step()?;
        }
        self.finish_liveness()
    }

    /// Lets every live node delete what its groups' retention allows.
    fn enforce_retention(&mut self) {
        let now_ms = self.clock.get();
        let mut retired_total = 0;
        for index in 0..self.nodes.len() {
            let Some(Host { sim, node: Some(node), .. }) = self.live_slot(index) else {
                continue;
            };
            // A failure here is the engine's fail-stop, which the final checks report.
            let _ = sim.block_on(node.enforce_retention(now_ms));
            // Removed at once, as the server's task does soon after; a crash before leaves
            // them for the next open to remove.
            let retired = node.take_retired_files();
            retired_total += retired.len() as u64;
            let _ = sim.block_on(remove_retired_files(&sim.storage(), retired));
        }
        self.coverage.segments_retired += retired_total;
    }

    /// The liveness phase's goal: every client completed its share and every replica rejoined.
    fn liveness_done(&self) -> bool {
        self.clients
            .iter()
            .all(|c| c.completed_late >= self.options.liveness_requests && c.moves_left == 0)
            && self.replicas_rejoined()
    }

    /// Every replica of every group is up, normal in its primary's view and holds everything
    /// that primary committed: nobody is left behind once faults stop.
    fn replicas_rejoined(&self) -> bool {
        (1..=self.options.groups).all(|group| {
            let Some(primary) = self.primary(group).and_then(|n| self.replica(n, group)) else {
                return false;
            };
            // A node the group's configuration left out holds no member to wait for.
            let members = primary.config().members;
            (0..self.nodes.len()).filter(|&node| members.is_member(node as u8)).all(|node| {
                self.replica(node, group).is_some_and(|r| {
                    r.status() == Status::Normal
                        && r.view() == primary.view()
                        && r.op_appended() >= primary.commit()
                })
            })
        })
    }

    /// The end of a run: the final checks (unless a violation ended it first), the last
    /// counters summed, and the outcome.
    fn finish(mut self, violation: Option<Violation>) -> Outcome {
        let violation =
            violation.or_else(|| self.check_final_logs()).or_else(|| self.check_disk_images());
        for host in &self.nodes {
            if let Some(node) = &host.node {
                add_counters(&mut self.coverage, node);
            }
            self.coverage.read_errors += host.sim.stats().read_errors;
        }
        let stats = self.network.stats();
        self.coverage.packets_dropped = stats.lost
            + stats.dropped_link_down
            + stats.dropped_link_full
            + stats.dropped_endpoint_inbound;
        Outcome {
            seed: self.options.seed,
            mode: self.mode,
            trace_hash: self.trace,
            ticks: self.tick,
            coverage: self.coverage,
            violation,
        }
    }

    /// Delivers what is due: the inboxes of nodes no longer paused first, then the network's
    /// packets, to clients, to a paused node's inbox (up to `PAUSED_INBOX_MAX`), or to a live node.
    pub(super) fn deliver(&mut self) -> Option<Violation> {
        let replicas = self.nodes.len();
        let mut deliveries: Vec<(usize, usize, Packet)> = Vec::new();
        for index in 0..replicas {
            let host = &mut self.nodes[index];
            if host.node.is_some() && host.paused_until_tick <= self.tick {
                deliveries.extend(host.inbox.drain(..).map(|(from, p)| (from, index, p)));
            }
        }
        deliveries
            .extend(self.network.deliver(self.tick).into_iter().map(|d| (d.from, d.to, d.packet)));
        for (from, to, packet) in deliveries {
            self.deliveries += 1;
            if self.deliveries > DELIVERIES_MAX {
                return Some(Violation {
                    tick: self.tick,
                    what: "livelock: delivery bound reached".into(),
                });
            }
            self.coverage.packets_delivered += 1;
            self.trace_packet(from, to, &packet);
            if to >= replicas {
                self.client_reply(to - replicas, packet);
                continue;
            }
            let host = &mut self.nodes[to];
            if host.paused_until_tick > self.tick {
                if host.inbox.len() < PAUSED_INBOX_MAX {
                    host.inbox.push_back((from, packet));
                }
                continue;
            }
            let Some(node) = host.node.as_mut() else { continue };
            match packet {
                Packet::Replica(bytes) => {
                    if let Some(traced) = self.options.trace_group {
                        trace_message(self.tick, from, to, traced, &bytes);
                    }
                    // A packet a node cannot decode is its problem to count, never a panic.
                    let _ = node.on_packet(from as u8, &bytes);
                }
                Packet::Request { group, client, request, body, reconfigure } => {
                    let request = Request {
                        client,
                        session: client,
                        request,
                        body: BytesMut::from(&body[..]),
                        body_checksum: shoal_proto::checksum::crc32c(&body),
                        record_count: 1,
                        first_timestamp_ms: 0,
                        max_timestamp_ms: 0,
                        append_time_ms: 0,
                    };
                    let _ = match reconfigure {
                        Some(next) => node.on_reconfigure_request(group, request, next),
                        None => node.on_client_request(group, request),
                    };
                }
                Packet::Reply { .. } => {}
            }
        }
        None
    }

    /// Runs every live node's I/O round, then notes the views each replica was told are durable
    /// (the check after a restart compares against them).
    pub(super) fn run_io(&mut self) -> Option<Violation> {
        for index in 0..self.nodes.len() {
            let Some(Host { sim, node: Some(node), durable_views, .. }) = self.live_slot(index)
            else {
                continue;
            };
            if node.has_io() {
                sim.block_on(node.run_io());
            }
            for group in node.group_ids() {
                if let Some(replica) = node.replica(group) {
                    let seen = durable_views.entry(group).or_insert((0, 0));
                    let (view, log_view) = replica.durable_views();
                    *seen = (seen.0.max(view), seen.1.max(log_view));
                }
            }
        }
        None
    }

    /// Moves every node's outputs out: packets to the network, replies to clients, commits
    /// into the agreement check.
    pub(super) fn collect(&mut self) -> Option<Violation> {
        let replicas = self.nodes.len();
        for index in 0..replicas {
            let Some(node) = self.nodes[index].node.as_mut() else { continue };
            let packets = std::mem::take(&mut node.transport_mut().packets);
            let replies = node.take_replies();
            let committed = node.take_committed();
            for (to, packet) in packets {
                self.network.send(self.tick, index, usize::from(to), Packet::Replica(packet));
            }
            for (group, reply) in replies {
                let client = (reply.client - 1) as usize;
                self.network.send(
                    self.tick,
                    index,
                    replicas + client,
                    Packet::Reply { group, reply },
                );
            }
            for (group, committed) in committed {
                if let Some(violation) = self.apply_admin(index, group, &committed) {
                    return Some(violation);
                }
                let Some(&header) = committed.header() else { continue };
                let op = header.as_prepare().expect("prepares").op;
                self.trace_commit(group, op, header.checksum_header);
                if let Some(violation) = self
                    .check_agreement(index, group, op, header.checksum_header)
                    .or_else(|| self.check_voters(group, &header))
                {
                    return Some(violation);
                }
            }
        }
        None
    }
}
