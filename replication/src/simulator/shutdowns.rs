//! Controlled shutdowns (Kafka's; DESIGN.md §8): a node hands every group it leads to a peer in
//! sync, keeps running until it is settled (`Node::shutdown_settled`) or `SHUTDOWN_TICKS_MAX`
//! passes, then stops by its clean close. The fault phase draws them per node and tick, as in a
//! rolling restart, and restarts the node later; scripted scenarios start one on demand.
//!
//! It draws only from the shutdowns' own PRNG, never from the run's (whose order of draws is
//! part of every seed's trace), and stops a node only through its clean close.

use super::cluster::{Cluster, Packet, Stopping};
use super::coverage::add_counters;

/// A node shutting down stops after this many ticks at most, whatever it still leads: a few
/// view-change timeouts of the simulator's timers.
pub const SHUTDOWN_TICKS_MAX: u64 = 600;
/// A node shutting down begins hand-overs again this often: one given up, or a view change that
/// came back to it, needs another.
const HAND_OVER_RETRY_TICKS: u64 = 10;

impl Cluster {
    /// Begins a controlled shutdown of node `node`, which must be up: it hands its groups over,
    /// then stops cleanly within [`SHUTDOWN_TICKS_MAX`] ticks and stays down until
    /// [`Cluster::restart`].
    pub fn begin_shutdown(&mut self, node: usize) {
        assert!(self.nodes[node].node.is_some(), "shut down a live node");
        self.start_stopping(node, None);
    }

    /// Whether node `node` is in a controlled shutdown.
    pub fn is_stopping(&self, node: usize) -> bool {
        self.nodes[node].stopping.is_some()
    }

    /// The fault phase's draw: each live node not already stopping may begin a controlled
    /// shutdown, restarting after up to `restart_ticks_max` ticks once stopped, when the fault
    /// model allows it to go down as it allows a process crash (a close that fails is one, and
    /// a node down counts as not caught up until it is back).
    pub(super) fn draw_shutdowns(&mut self) {
        let rate = u64::from(self.faults.shutdown_per_million);
        for index in 0..self.nodes.len() {
            let host = &self.nodes[index];
            if host.node.is_none() || host.stopping.is_some() || host.paused_until_tick > self.tick
            {
                continue;
            }
            if self.shutdown_rng.chance(rate, 1_000_000) && self.crash_allowed(index, false) {
                let restart_after = self.shutdown_rng.below(self.faults.restart_ticks_max);
                self.start_stopping(index, Some(restart_after));
            }
        }
    }

    /// Every step: a stopping node begins hand-overs again now and then, and stops once it is
    /// settled or out of time.
    pub(super) fn advance_shutdowns(&mut self) {
        for index in 0..self.nodes.len() {
            let tick = self.tick;
            let Some(host) = self.live_slot(index) else { continue };
            let Some(stopping) = host.stopping.as_mut() else { continue };
            let node = host.node.as_mut().expect("a live slot holds a node");
            let settled = node.shutdown_settled();
            if !settled && tick < stopping.until_tick {
                if tick >= stopping.next_hand_over_tick {
                    stopping.next_hand_over_tick = tick + HAND_OVER_RETRY_TICKS;
                    node.hand_over_all();
                }
                continue;
            }
            let restart_after = stopping.restart_after_ticks;
            self.coverage.shutdowns_settled += u64::from(settled);
            self.stop_cleanly(index);
            self.nodes[index].restart_tick =
                restart_after.map_or(u64::MAX, |after| tick + 1 + after);
        }
    }

    /// Takes node `index` down by its clean close (everything flushed and checkpointed, a clean
    /// shutdown recorded), after what it sent this step went out. False when the close failed
    /// (an injected fault): the disk is then as a process crash leaves it.
    pub(super) fn stop_cleanly(&mut self, index: usize) -> bool {
        let replicas = self.nodes.len();
        let host = &mut self.nodes[index];
        let mut closing = host.node.take().expect("stop a live node");
        add_counters(&mut self.coverage, &closing);
        self.coverage.admin_duplicates += host.admin.take().map_or(0, |a| a.duplicates);
        for (to, packet) in std::mem::take(&mut closing.transport_mut().packets) {
            self.network.send(self.tick, index, usize::from(to), Packet::Replica(packet));
        }
        for (group, reply) in closing.take_replies() {
            let client = replicas + (reply.client - 1) as usize;
            self.network.send(self.tick, index, client, Packet::Reply { group, reply });
        }
        let closed = host.sim.block_on(closing.close()).is_ok();
        host.inbox.clear();
        host.paused_until_tick = 0;
        host.stopping = None;
        self.network.drop_endpoint_inbound(index);
        closed
    }

    /// Node `index` begins its shutdown: every group it leads is handed to a peer in sync.
    fn start_stopping(&mut self, index: usize, restart_after_ticks: Option<u64>) {
        self.coverage.controlled_shutdowns += 1;
        let tick = self.tick;
        let host = &mut self.nodes[index];
        host.stopping = Some(Stopping {
            until_tick: tick + SHUTDOWN_TICKS_MAX,
            next_hand_over_tick: tick + HAND_OVER_RETRY_TICKS,
            restart_after_ticks,
        });
        if let Some(node) = host.node.as_mut() {
            node.hand_over_all();
        }
    }
}
