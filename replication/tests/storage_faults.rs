//! Storage faults within the budget (DESIGN.md §3 Recovery, §4 Restart and Repair, §6): a
//! record damaged at rest on one replica is found when that replica restarts, its log is cut
//! there durably, and the ops past the cut are its *faulty suffix* — never nacked, brought back
//! from peers and verified against the hash chain (protocol-aware recovery).
//!
//! Each scenario damages one durable record with `Cluster::corrupt_op` on a node that is down
//! (shut down cleanly, so the op is checkpointed: damage before the torn window, which a single
//! node would have to refuse to serve), asserts through a node counter that the branch ran, and
//! ends with the liveness phase, the final log check and `shoal-inspect` over every disk.
//!
//! Canary: `cargo test -p shoal-replication --features canary-truncate-faulty --test
//! storage_faults` must fail `a_damaged_op_is_faulty_so_a_view_change_keeps_it` (the cut forgets
//! the ops were there, the damaged backup nacks the op it acknowledged, and view 1 drops a
//! committed write) and `a_damaged_newest_synced_op_is_faulty_before_a_mark_announces_it` (the
//! same, for damage that reads as a torn tail).

mod common;

use common::{GROUP, cluster, primary_of, replica, wait};
use shoal_replication::Status;
use shoal_replication::simulator::{Cluster, Mode, Violation};

fn finish(cluster: &mut Cluster) -> Result<(), Violation> {
    cluster.finish_liveness()?;
    cluster.check_logs()?;
    cluster.check_disks()
}

/// DESIGN.md §3 ("an op lost or damaged this way is faulty, not absent") and §4 Repair: a
/// backup's committed record, damaged at rest, is cut at its restart (`damage_cuts`) and
/// repaired from a peer (`damage_repaired`); afterwards its log holds exactly the primary's
/// prepares, checksum for checksum, and no disk holds damage.
#[test]
fn a_corrupted_record_on_one_replica_is_repaired_from_a_peer() -> Result<(), Violation> {
    for mode in [Mode::Persisted, Mode::Replicated] {
        let mut cluster = cluster(41, mode, 2);
        let (primary, damaged) = (primary_of(0), primary_of(1));
        wait(&mut cluster, 2_000, "ops committed everywhere", |c| {
            (0..3).all(|n| c.replica(n, GROUP).is_some_and(|r| r.commit() >= 20))
        })?;
        cluster.shutdown(damaged);
        let op = 10;
        assert!(cluster.corrupt_op(damaged, GROUP, op), "op {op} is durable on node {damaged}");
        assert_eq!(cluster.damaged_replicas(GROUP, op), 1);
        cluster.restart(damaged)?;
        let counters = cluster.node_counters(damaged).expect("up");
        assert_eq!(counters.damage_cuts, 1, "{mode:?}: no damage cut at restart: {counters:?}");
        let r = replica(&cluster, damaged);
        assert_eq!(r.faulty_from(), Some(op), "{mode:?}: the cut op is faulty, not absent");
        assert_eq!(r.op(), op - 1, "{mode:?}: the log ends before the damaged op");
        wait(&mut cluster, 3_000, "the damaged backup repaired its cut ops", |c| {
            c.node_counters(damaged).is_some_and(|n| n.damage_repaired == 1)
        })?;
        // The marker's clear counts once the superblock holds it: a crash before that brings
        // the marker back.
        wait(&mut cluster, 1_000, "the cleared damage marker is durable", |c| {
            c.damaged_replicas(GROUP, op) == 0
        })?;
        finish(&mut cluster)?;
        let counters = cluster.node_counters(damaged).expect("up");
        assert!(counters.damaged_ops_repaired >= 1, "{counters:?}");
        let ours = cluster.log_checksums(damaged, GROUP).expect("readable");
        let theirs = cluster.log_checksums(primary, GROUP).expect("readable");
        let commit = replica(&cluster, primary).commit();
        assert!(ours.len() as u64 >= commit, "{mode:?}: the repaired log is short");
        assert_eq!(
            ours[..commit as usize],
            theirs[..commit as usize],
            "{mode:?}: the repaired log differs from the primary's"
        );
    }
    Ok(())
}

/// DESIGN.md §4 ("an op that is faulty on its disk is never nacked") with §3: the old primary
/// commits an op on one backup's acknowledgement (the other backup's link from it is cut); that
/// backup's copy is damaged at rest and it restarts; the old primary dies. In the view change
/// the backup that missed the op nacks it — and the damaged backup must not, or the two make a
/// nack quorum and view 1 drops a committed write. So the merge stalls until the old primary
/// returns with the op, and the op survives. `canary-truncate-faulty` makes the damage cut
/// forget the ops were there, and this test fails.
#[test]
fn a_damaged_op_is_faulty_so_a_view_change_keeps_it() -> Result<(), Violation> {
    let mut cluster = cluster(42, Mode::Persisted, 1);
    let (old, missed_it, damaged) = (primary_of(0), primary_of(1), primary_of(2));
    cluster.run_ticks(100)?;
    cluster.set_link(old, missed_it, false);
    wait(&mut cluster, 300, "an op committed on the damaged backup's acknowledgement", |c| {
        let committed = replica(c, old).commit();
        committed > replica(c, missed_it).op() && replica(c, damaged).op() >= committed
    })?;
    let acked = replica(&cluster, old).commit();
    let checksum = replica(&cluster, old).header(acked).expect("committed").checksum_header;
    cluster.set_clients_active(false);
    wait(&mut cluster, 10, "the client hears that the op committed", |c| {
        c.acknowledged_ops(GROUP).contains(&acked)
    })?;
    cluster.shutdown(damaged);
    cluster.crash(old, false);
    assert!(cluster.corrupt_op(damaged, GROUP, acked), "op {acked} is durable on the backup");
    cluster.restart(damaged)?;
    assert_eq!(cluster.node_counters(damaged).expect("up").damage_cuts, 1);
    assert!(replica(&cluster, damaged).op() < acked, "the damaged op is cut");
    the_view_change_keeps(&mut cluster, (old, missed_it, damaged), acked, checksum)
}

/// DESIGN.md §3 with §4: a `persisted` backup acknowledges an op once it is synced, and the
/// sync mark that announces that sync only comes with a later write. Latent damage to that
/// newest synced record, found at the restart after a process crash, reads like a torn write:
/// the backup must hold the op faulty rather than absent (and durably so, since the torn
/// window it cuts reads as zeros at the next restart), or with the backup that missed the op it
/// makes a nack quorum and a new view drops a committed write (simulator seed 1,545 with
/// retention did exactly that). `canary-truncate-faulty` takes the damaged tail for an
/// unsynced write, and this test fails.
#[test]
fn a_damaged_newest_synced_op_is_faulty_before_a_mark_announces_it() -> Result<(), Violation> {
    let mut cluster = cluster(43, Mode::Persisted, 1);
    let (old, missed_it, damaged) = (primary_of(0), primary_of(1), primary_of(2));
    cluster.run_ticks(100)?;
    cluster.set_link(old, missed_it, false);
    // The crash comes the tick the backup's engine makes an op durable that the cut-off backup
    // lacks: before any later write could carry its mark.
    wait(&mut cluster, 300, "the backup synced an op the cut-off backup lacks", |c| {
        c.durable_op(damaged, GROUP).is_some_and(|op| op > replica(c, missed_it).op())
    })?;
    let acked = cluster.durable_op(damaged, GROUP).expect("checked");
    cluster.crash(damaged, false);
    wait(&mut cluster, 300, "the op commits on the backup's acknowledgement", |c| {
        c.acknowledged_ops(GROUP).contains(&acked)
    })?;
    let checksum = replica(&cluster, old).header(acked).expect("committed").checksum_header;
    cluster.crash(old, false);
    assert!(cluster.corrupt_op(damaged, GROUP, acked), "op {acked} is durable on the backup");
    cluster.restart(damaged)?;
    // Before the restarted backup can take part in a view, a crash brings it back once more:
    // the cut tail is zeros now, and only the durable marker remembers the op may be owed.
    cluster.crash(damaged, false);
    cluster.restart(damaged)?;
    assert_eq!(replica(&cluster, damaged).faulty_from(), Some(acked), "held faulty from the op");
    assert!(replica(&cluster, damaged).op() < acked, "the damaged op is cut");
    the_view_change_keeps(&mut cluster, (old, missed_it, damaged), acked, checksum)
}

/// The end both view-change scenarios share, once the old primary is down and the damaged
/// backup has restarted without op `acked`: nobody up holds the op, so the survivors' merge
/// must wait for it and never start a view without it; when the old primary returns, the new
/// view keeps it, checksum for checksum.
fn the_view_change_keeps(
    cluster: &mut Cluster,
    (old, missed_it, damaged): (usize, usize, usize),
    acked: u64,
    checksum: u32,
) -> Result<(), Violation> {
    wait(cluster, 3_000, "the survivors' merge stalls (or a view starts)", |c| {
        (0..3).any(|n| {
            c.replica(n, GROUP).is_some_and(|r| {
                r.counters().merges_stalled > 0 || (r.status() == Status::Normal && r.view() > 0)
            })
        })
    })?;
    cluster.run_ticks(500)?;
    for node in [missed_it, damaged] {
        let r = replica(cluster, node);
        assert!(
            r.status() != Status::Normal || r.op() >= acked,
            "node {node} is normal in view {} without acknowledged op {acked} (op {}): the \
             damaged backup nacked an op it had acknowledged",
            r.view(),
            r.op()
        );
    }
    cluster.restart(old)?;
    wait(cluster, 3_000, "a new view starts", |c| {
        c.primary(GROUP).is_some_and(|p| replica(c, p).view() > 0)
    })?;
    let primary = cluster.primary(GROUP).expect("checked");
    let kept = replica(cluster, primary).header(acked).map(|h| h.checksum_header);
    assert_eq!(kept, Some(checksum), "the new view dropped acknowledged op {acked}");
    finish(cluster)
}
