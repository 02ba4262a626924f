//! Learners (DESIGN.md §8): members of a group that take its log like backups but never count
//! in a quorum, vote, or lead. Scripted on the simulator: four nodes holding group 1, nodes 0–2
//! its voters and node 3 a learner, so the primary of view `v` is node `(v + 1) mod 3`.
//!
//! Canary (DESIGN.md §7): `cargo test -p shoal-replication --features canary-learner-acks --test
//! learners` counts a learner's PrepareOk in the commit quorum, and the first scenario fails.

mod common;

use common::{GROUP, replica, wait};
use shoal_replication::simulator::{Cluster, FaultProfile, Mode, SimOptions, Violation};
use shoal_replication::{ReplicaState, Status};

const LEARNER: usize = 3;

/// The primary of view 0.
const PRIMARY: usize = 1;

/// `replica_lag_ticks_max` of these clusters: short, so a learner cut off shows as behind soon.
const LAG_TICKS_MAX: u64 = 300;

/// The cluster, once view 0's primary has committed the client's first writes.
fn cluster_with_a_learner(seed: u64) -> Result<Cluster, Violation> {
    let mut cluster = Cluster::new(&SimOptions {
        replica_lag_ticks_max: LAG_TICKS_MAX,
        faults: Some(FaultProfile::none()),
        mode: Some(Mode::Persisted),
        replicas: 4,
        learners: 1,
        groups: 1,
        clients_per_group: 1,
        ..SimOptions::new(seed)
    });
    wait(&mut cluster, 500, "the client's first writes commit", |c| {
        replica(c, PRIMARY).commit() > 2
    })?;
    Ok(cluster)
}

/// A primary cut off from both other voters but not from the learner: the learner takes the
/// next prepare and acknowledges it, and the op still does not commit (a quorum of three voters
/// is two of them). Once the voters elect a new primary the learner follows it, and the
/// liveness phase and the final log check find every acknowledged write.
#[test]
fn a_learners_acknowledgement_never_commits_an_op() -> Result<(), Violation> {
    let mut cluster = cluster_with_a_learner(21)?;
    for voter in [0, 2] {
        cluster.set_link(PRIMARY, voter, false);
    }
    let committed = replica(&cluster, PRIMARY).commit();
    wait(&mut cluster, 90, "the learner holds an op past the commit point", |c| {
        replica(c, LEARNER).op() > committed
    })?;
    // Less than the heartbeat timeout: the primary is still in its view, with the learner's
    // acknowledgement of the op and its own.
    cluster.run_ticks(60)?;
    let cut_off = replica(&cluster, PRIMARY);
    assert_eq!(cut_off.status(), Status::Normal);
    assert!(cut_off.counters().learner_acks > 0, "the learner acknowledged prepares");
    assert_eq!(cut_off.commit(), committed, "an op committed on a learner's acknowledgement");
    wait(&mut cluster, 2_000, "the other voters start a view of their own", |c| {
        c.primary(GROUP).is_some_and(|p| p != PRIMARY)
    })?;
    let new_primary = cluster.primary(GROUP).expect("a primary");
    wait(&mut cluster, 500, "the learner follows the new view", |c| {
        let learner = replica(c, LEARNER);
        learner.status() == Status::Normal && learner.view() == replica(c, new_primary).view()
    })?;
    assert_eq!(replica(&cluster, LEARNER).counters().votes_cast, 0, "a learner never votes");
    for voter in [0, 2] {
        cluster.set_link(PRIMARY, voter, true);
    }
    cluster.finish_liveness()?;
    cluster.check_logs()
}

/// A learner that hears nothing from the primary does not vote: with the primary gone and one
/// other voter down, the remaining voter and the learner are no quorum, so no view starts; once
/// the second voter is back, a view starts without the learner's vote.
#[test]
fn a_learner_never_makes_a_quorum_for_a_view_change() -> Result<(), Violation> {
    let mut cluster = cluster_with_a_learner(22)?;
    let view = replica(&cluster, 0).view();
    cluster.crash(PRIMARY, false);
    cluster.crash(2, false);
    // Several heartbeat and view-change timeouts: voter 0 votes alone, the learner probes.
    cluster.run_ticks(1_000)?;
    assert!(replica(&cluster, 0).status() != Status::Normal, "one voter started a view alone");
    assert_eq!(replica(&cluster, LEARNER).view(), view, "the learner left its view");
    assert_eq!(replica(&cluster, LEARNER).counters().votes_cast, 0, "a learner never votes");
    cluster.restart(2)?;
    wait(&mut cluster, 3_000, "voters 0 and 2 start a view", |c| c.primary(GROUP).is_some())?;
    cluster.restart(PRIMARY)?;
    cluster.finish_liveness()?;
    cluster.check_logs()
}

/// The primary tracks a learner's progress by the lag definition of DESIGN.md §4 — what a
/// partition move waits on before it promotes a learner: a learner cut off from the primary
/// turns dead (nothing heard) while the group commits without it, and once the link is back it
/// repairs and is reported in sync again.
#[test]
fn the_primary_reports_whether_a_learner_has_caught_up() -> Result<(), Violation> {
    let mut cluster = cluster_with_a_learner(23)?;
    let learner_state = |c: &Cluster| {
        let status = replica(c, PRIMARY).group_status();
        status.replicas.iter().find(|p| usize::from(p.replica) == LEARNER).map(|p| p.state)
    };
    assert_eq!(learner_state(&cluster), Some(ReplicaState::InSync));
    cluster.set_link(PRIMARY, LEARNER, false);
    cluster.set_link(LEARNER, PRIMARY, false);
    let committed = replica(&cluster, PRIMARY).commit();
    wait(&mut cluster, 3 * LAG_TICKS_MAX, "the learner is reported dead", |c| {
        learner_state(c) == Some(ReplicaState::Dead)
    })?;
    assert!(replica(&cluster, PRIMARY).commit() > committed, "the group commits without it");
    cluster.set_link(PRIMARY, LEARNER, true);
    cluster.set_link(LEARNER, PRIMARY, true);
    wait(&mut cluster, 3 * LAG_TICKS_MAX, "the learner catches up and is in sync", |c| {
        learner_state(c) == Some(ReplicaState::InSync)
            && replica(c, LEARNER).commit() >= replica(c, PRIMARY).commit().saturating_sub(1)
    })?;
    cluster.finish_liveness()?;
    cluster.check_logs()
}
