//! Configuration changes (DESIGN.md §8; docs/protocol.md, "Learners and reconfiguration"):
//! a change is an op in the group's own log, committed by the old voters, and every member
//! enters the next epoch's first view from it. Scripted on the simulator: four nodes holding
//! group 1, nodes 0–2 its voters and node 3 a learner; the first client is the group's operator,
//! making its changes in turn (promote the learner and demote a voter, drop the demoted member,
//! add it back as a learner).

mod common;

use common::{GROUP, replica, wait};
use shoal_replication::Status;
use shoal_replication::simulator::{Cluster, FaultProfile, Mode, SimOptions, Violation};
use shoal_replication::{Membership, epoch_of, first_view_of};

fn cluster_with_moves(seed: u64, moves: u32, mode: Mode) -> Cluster {
    Cluster::new(&SimOptions {
        faults: Some(FaultProfile::none()),
        mode: Some(mode),
        replicas: 4,
        learners: 1,
        groups: 1,
        clients_per_group: 2,
        moves,
        ..SimOptions::new(seed)
    })
}

/// The members every live replica of the group agrees on, if they agree.
fn agreed_members(cluster: &Cluster) -> Option<Membership> {
    let mut members = (0..4)
        .filter_map(|node| cluster.replica(node, GROUP))
        .filter(|r| r.status() != Status::Removed)
        .map(|r| r.config().members);
    let first = members.next()?;
    members.all(|m| m == first).then_some(first)
}

/// The first two changes with no faults: the switch promotes node 3 and demotes a voter, and
/// the drop removes the demoted node, whose replica stops at the change that left it out and
/// takes no more of the log. The voters are three throughout, and every write acknowledged
/// across both changes is where it was acknowledged.
#[test]
fn a_learner_is_promoted_and_the_demoted_voter_dropped() -> Result<(), Violation> {
    let mut cluster = cluster_with_moves(31, 2, Mode::Replicated);
    wait(&mut cluster, 3_000, "the switch commits", |c| {
        (0..4).all(|n| c.replica(n, GROUP).is_some_and(|r| r.epoch() >= 1))
    })?;
    let switched = replica(&cluster, 3).config().members;
    assert_eq!(switched.voter_count(), 3);
    assert!(switched.is_voter(3), "the caught-up learner was promoted: {switched:?}");
    let demoted = (0..3).find(|&m| !switched.is_voter(m)).expect("one voter demoted");
    assert!(switched.learners & (1 << demoted) != 0, "the demoted voter learns");
    cluster.finish_liveness()?;
    let removed = replica(&cluster, usize::from(demoted));
    assert_eq!(removed.status(), Status::Removed);
    assert_eq!(removed.epoch(), 2, "the dropped member stops in the epoch that left it out");
    let frozen = removed.op();
    cluster.run_ticks(300)?;
    assert_eq!(replica(&cluster, usize::from(demoted)).op(), frozen, "it takes no more log");
    let members = agreed_members(&cluster).expect("the members agree");
    assert_eq!(members, Membership { voters: switched.voters, learners: 0 });
    assert!(replica(&cluster, 3).op() > frozen, "the group went on without it");
    cluster.check_logs()
}

/// A whole cycle with no faults: after the switch and the drop, the dropped member is added
/// back as a learner; its replica, removed, rejoins through the newer epoch's StartView and
/// catches up. Every member ends normal in epoch 3.
#[test]
fn a_dropped_member_added_back_rejoins_as_a_learner() -> Result<(), Violation> {
    let mut cluster = cluster_with_moves(32, 3, Mode::Replicated);
    cluster.finish_liveness()?;
    let members = agreed_members(&cluster).expect("the members agree at the end");
    assert_eq!(members.voter_count(), 3);
    assert_eq!(members.learners.count_ones(), 1);
    assert!(members.is_voter(3));
    for node in 0..4 {
        let r = replica(&cluster, node);
        assert_eq!(epoch_of(r.view()), 3, "node {node} is in the third epoch");
        assert!(r.view() >= first_view_of(3));
        assert_eq!(r.status(), Status::Normal, "node {node}");
    }
    let coverage = cluster.coverage();
    assert_eq!(coverage.moves_done, 3);
    assert!(coverage.epochs_entered >= 3, "{coverage:?}");
    cluster.check_logs()
}

/// Whether the head of `node`'s log is a configuration change not yet committed there.
fn change_at_head(cluster: &Cluster, node: usize) -> bool {
    cluster.replica(node, GROUP).is_some_and(|r| {
        r.op() > r.commit()
            && r.header(r.op())
                .and_then(|h| h.as_prepare())
                .is_some_and(|p| !p.reconfigure.is_empty())
    })
}

/// The primary commits the change and enters the new epoch, but nothing it sends from then on
/// arrives: the other old voters, still in the old epoch with the change prepared, elect a
/// primary among themselves, which commits the change again and leads them into the new
/// epoch. Once the links heal, the old primary (answered as a replica of the same epoch now)
/// rejoins; nothing acknowledged is lost.
#[test]
fn the_old_voters_finish_a_change_whose_committer_went_silent() -> Result<(), Violation> {
    let mut cluster = cluster_with_moves(33, 1, Mode::Persisted);
    wait(&mut cluster, 3_000, "the primary prepares the change", |c| {
        c.primary(GROUP).is_some_and(|p| change_at_head(c, p))
    })?;
    let committer = cluster.primary(GROUP).expect("a primary");
    wait(&mut cluster, 300, "the change commits on its primary", |c| {
        replica(c, committer).epoch() == 1
    })?;
    for peer in (0..4).filter(|&n| n != committer) {
        cluster.set_link(committer, peer, false);
    }
    wait(&mut cluster, 3_000, "every other member enters the new epoch", |c| {
        (0..4).filter(|&n| n != committer).all(|n| replica(c, n).epoch() == 1)
    })?;
    let recommitted = (0..4).filter(|&n| n != committer).any(|n| {
        let counters = replica(&cluster, n).counters();
        counters.votes_cast > 0 && counters.epochs_entered > 0
    });
    assert!(recommitted, "an old voter elected in the old epoch committed the change again");
    for peer in (0..4).filter(|&n| n != committer) {
        cluster.set_link(committer, peer, true);
    }
    cluster.finish_liveness()?;
    assert!(agreed_members(&cluster).is_some_and(|m| m.is_voter(3)));
    cluster.check_logs()
}

/// The primary crashes right after preparing the change, before it commits: the change is on
/// the other old voters' logs (or not), and their view change either commits it or drops it;
/// the operator's retry makes it in the end, and the restarted primary follows.
#[test]
fn a_change_survives_its_primary_crashing_before_it_commits() -> Result<(), Violation> {
    let mut cluster = cluster_with_moves(34, 1, Mode::Persisted);
    wait(&mut cluster, 3_000, "the primary prepares the change", |c| {
        c.primary(GROUP).is_some_and(|p| change_at_head(c, p))
    })?;
    let primary = cluster.primary(GROUP).expect("a primary");
    cluster.crash(primary, false);
    cluster.run_ticks(500)?;
    cluster.restart(primary)?;
    cluster.finish_liveness()?;
    let members = agreed_members(&cluster).expect("the members agree");
    assert!(members.is_voter(3), "the change was made: {members:?}");
    for node in 0..4 {
        assert_eq!(replica(&cluster, node).epoch(), 1, "node {node}");
    }
    cluster.check_logs()
}
