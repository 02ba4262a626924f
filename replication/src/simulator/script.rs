//! Scripting helpers for scenario tests (`replication/tests/scenarios.rs`): faults and
//! observations the seeded fault phase has no need for.
//!
//! It owns nothing: every helper works on the [`Cluster`]'s own state through the same private
//! steps [`Cluster::step`] uses, so a scripted run stays deterministic. It never weakens an
//! invariant check: whatever a helper does, commits still go through the agreement check and the
//! final logs through [`Cluster::check_logs`].

use super::checks::{Violation, into_result};
use super::cluster::{Cluster, Packet};

impl Cluster {
    /// One step in which every node of `victims` receives and ticks as usual, its transport sends
    /// what the node handed it, and then it loses power *before* its I/O round: the writes it
    /// asked for this step never reach the disk, and its unsynced writes from before are subject
    /// to the simulated disk's crash semantics. Victims stay down until [`Cluster::restart`].
    /// For scripted runs: the step injects no random fault.
    ///
    /// [`Cluster::step`] moves packets to the network only after every node's I/O round, and a
    /// crash drops what the node's transport holds; a real transport sends at once. Without this
    /// step a message released before the write it reveals is durable could never reach a peer
    /// ahead of a power loss, so no scripted run could tell it apart from a correct one.
    pub fn step_losing_power_before_io(&mut self, victims: &[usize]) -> Result<(), Violation> {
        self.tick += 1;
        self.clock.set(self.tick as i64 * 10);
        into_result(self.wake_nodes())?;
        into_result(self.deliver())?;
        for index in 0..self.nodes.len() {
            if let Some(node) = self.live_node(index) {
                node.on_tick();
            }
        }
        for &index in victims {
            let Some(node) = self.nodes[index].node.as_mut() else { continue };
            let packets = std::mem::take(&mut node.transport_mut().packets);
            for (to, packet) in packets {
                self.network.send(self.tick, index, usize::from(to), Packet::Replica(packet));
            }
            self.crash(index, true);
        }
        into_result(self.run_io())?;
        into_result(self.collect())?;
        self.drive_clients();
        Ok(())
    }

    /// The ops of `group` acknowledged to clients so far, in the order the replies arrived.
    pub fn acknowledged_ops(&self, group: u64) -> Vec<u64> {
        self.acks.iter().filter(|ack| ack.group == group).map(|ack| ack.op).collect()
    }

    /// Every replica's protocol state, for a scenario's failure message.
    pub fn state(&self) -> String {
        self.describe()
    }
}
