//! The scripted-cluster harness `scenarios.rs`, `storage_faults.rs` and `learners.rs` share:
//! three nodes holding one group (`learners.rs` builds its own cluster of four), no random
//! faults, and a bounded wait that names what it waited for.
// Each test crate that includes this module uses a part of it.
#![allow(dead_code)]

use shoal_replication::Replica;
use shoal_replication::simulator::{Cluster, FaultProfile, Mode, SimOptions, Violation};

/// The group every scenario scripts.
pub const GROUP: u64 = 1;

/// A scripted cluster of three nodes holding `GROUP` in `mode`, with no random faults.
pub fn cluster(seed: u64, mode: Mode, clients_per_group: u64) -> Cluster {
    Cluster::new(&SimOptions {
        faults: Some(FaultProfile::none()),
        mode: Some(mode),
        replicas: 3,
        groups: 1,
        clients_per_group,
        ..SimOptions::new(seed)
    })
}

/// The node that is the primary of `GROUP` in `view`.
pub fn primary_of(view: u32) -> usize {
    ((u64::from(view) + GROUP) % 3) as usize
}

/// The replica of `GROUP` on `node`, which must be up.
pub fn replica(cluster: &Cluster, node: usize) -> &Replica {
    cluster.replica(node, GROUP).unwrap_or_else(|| panic!("node {node} is down"))
}

/// Steps until `done` holds, failing the test (naming `what`) if it does not within
/// `ticks_max`.
pub fn wait(
    cluster: &mut Cluster,
    ticks_max: u64,
    what: &str,
    done: impl FnMut(&Cluster) -> bool,
) -> Result<(), Violation> {
    let start = cluster.tick();
    let reached = cluster.run_until(ticks_max, done)?;
    assert!(
        reached,
        "not reached within {ticks_max} ticks of tick {start}: {what}; {}",
        cluster.state()
    );
    Ok(())
}
