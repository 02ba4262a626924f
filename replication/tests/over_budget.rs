//! Storage faults beyond the budget (DESIGN.md §6: storage faults on at most f replicas per
//! op): the same committed op damaged on more than f replicas. The promise there is not that
//! nothing is lost, but that the cluster stops safely — the affected group stalls rather than
//! inventing data: no view starts without the op, commit points never pass it, committed
//! prefixes never diverge (the simulator checks that on every step), and no write is
//! acknowledged past the hole, and a clean copy of the op is never dropped.
//!
//! Every replica is shut down cleanly first, so the op is checkpointed everywhere: damage before
//! the torn window, which each replica cuts at restart (protocol-aware recovery) and marks
//! faulty. With every copy faulty, only `unclean_recovery` (off) could let the group go on.

use shoal_replication::simulator::{Cluster, FaultProfile, Mode, SimOptions, Violation};
use shoal_replication::{Replica, Status};

/// The group every test scripts.
const GROUP: u64 = 1;

fn cluster(seed: u64, mode: Mode) -> Cluster {
    Cluster::new(&SimOptions {
        faults: Some(FaultProfile::none()),
        mode: Some(mode),
        replicas: 3,
        groups: 1,
        clients_per_group: 2,
        ..SimOptions::new(seed)
    })
}

fn replica(cluster: &Cluster, node: usize) -> &Replica {
    cluster.replica(node, GROUP).unwrap_or_else(|| panic!("node {node} is down"))
}

/// Runs until `op` is committed on every replica, then shuts all three down cleanly, damages
/// `op` on each of `damaged` and restarts them (the others stay down); returns the acknowledged
/// writes so far.
fn damage_on(cluster: &mut Cluster, op: u64, damaged: &[usize]) -> Result<u64, Violation> {
    let reached = cluster.run_until(3_000, |c| {
        (0..3).all(|n| c.replica(n, GROUP).is_some_and(|r| r.commit() >= op + 5))
    })?;
    assert!(reached, "op {op} committed everywhere: {}", cluster.state());
    cluster.set_clients_active(false);
    cluster.run_ticks(50)?;
    let acknowledged = cluster.acknowledged();
    for node in 0..3 {
        cluster.shutdown(node);
    }
    for &node in damaged {
        assert!(cluster.corrupt_op(node, GROUP, op), "op {op} durable on node {node}");
    }
    assert_eq!(cluster.damaged_replicas(GROUP, op), damaged.len());
    cluster.set_clients_active(true);
    for &node in damaged {
        cluster.restart(node)?;
        assert_eq!(cluster.node_counters(node).expect("up").damage_cuts, 1);
        assert_eq!(replica(cluster, node).faulty_from(), Some(op), "node {node}");
    }
    Ok(acknowledged)
}

/// Asserts the group stalled safely: no replica normal in a view without `op`, no commit point
/// past the hole, nothing acknowledged since.
fn assert_stalled(cluster: &Cluster, op: u64, acknowledged: u64, nodes: &[usize]) {
    for &node in nodes {
        let r = replica(cluster, node);
        assert!(
            r.status() != Status::Normal || r.view() == 0,
            "node {node} serves view {} with op {} although op {op} is faulty everywhere",
            r.view(),
            r.op()
        );
        assert!(
            r.status() != Status::Normal || r.commit() < op,
            "node {node} commits past the hole at op {op}"
        );
    }
    assert_eq!(cluster.acknowledged(), acknowledged, "a write was acknowledged past the hole");
}

/// Two of three replicas hold the op damaged, so both cut their logs there and everything past
/// the cut is faulty on both. With the third down the two can neither prove the op dead nor find
/// it: the merge stalls (`merges_stalled`) and nothing is served. The third coming back with a
/// clean copy does not end it either: two faulty suffixes may hide ops past the clean copy's
/// head that the other two acknowledged (a nack quorum needs two replicas that provably lack
/// an op), so the group stays stopped rather than guess — beyond the budget, availability is
/// what is lost, never a write, and the clean copy keeps every op it had.
#[test]
fn an_op_damaged_on_a_quorum_stalls_the_group_even_once_a_clean_copy_returns()
-> Result<(), Violation> {
    for mode in [Mode::Persisted, Mode::Replicated] {
        let mut cluster = cluster(51, mode);
        let op = 12;
        let acknowledged = damage_on(&mut cluster, op, &[0, 1])?;
        cluster.run_ticks(3_000)?;
        assert!(
            (0..2).any(|n| replica(&cluster, n).counters().merges_stalled > 0),
            "{mode:?}: the merge never stalled: {}",
            cluster.state()
        );
        assert_stalled(&cluster, op, acknowledged, &[0, 1]);
        cluster.restart(2)?;
        let clean = cluster.log_checksums(2, GROUP).expect("node 2's log is readable");
        assert!(clean.iter().any(|&(o, _)| o == op), "{mode:?}: node 2 holds op {op}");
        cluster.run_ticks(3_000)?;
        assert_stalled(&cluster, op, acknowledged, &[0, 1, 2]);
        let kept = cluster.log_checksums(2, GROUP).expect("node 2's log is readable");
        assert_eq!(kept, clean, "{mode:?}: the clean copy changed while the group was stopped");
        cluster.check_disks()?;
    }
    Ok(())
}

/// Every replica holds the op damaged: it is lost. The group must stay stopped — no view starts,
/// no commit passes the hole, nothing more is acknowledged — rather than renumber later writes
/// over an acknowledged one; and the final log check names the loss instead of passing.
#[test]
fn an_op_damaged_on_every_replica_stops_the_group_and_is_reported_lost() -> Result<(), Violation> {
    let mut cluster = cluster(52, Mode::Persisted);
    let op = 12;
    let acknowledged = damage_on(&mut cluster, op, &[0, 1, 2])?;
    cluster.run_ticks(5_000)?;
    assert!(
        (0..3).any(|n| replica(&cluster, n).counters().merges_stalled > 0),
        "the merge never stalled: {}",
        cluster.state()
    );
    assert_stalled(&cluster, op, acknowledged, &[0, 1, 2]);
    let lost = cluster.check_logs().expect_err("an acknowledged write is gone everywhere");
    assert!(lost.what.contains("acknowledged write lost"), "{lost}");
    Ok(())
}
