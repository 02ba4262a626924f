//! Deliberate view changes (DESIGN.md §8 "Placement and primaries"): a primary hands its group to
//! a chosen member — back to the group's home once the home is in sync again, or off a node that
//! shuts down — through the whole cluster (node layer, real engine, simulated disks) driven by
//! `simulator::Cluster` with no random faults.
//!
//! The hand-over is VR Revisited §4.2's view change started on purpose: the primary stops taking
//! requests, waits until the target has acknowledged its head and everything is committed, then
//! leaves its view and votes for the first view the target leads; the backups join at once on the
//! vote of their own primary, and the view change runs as any other. Its one safety rule is the
//! one every view change relies on, "a sent DoViewChange binds" (DESIGN.md §4): once the old
//! primary has offered its log for the new view it serves its old view no more.
//!
//! Group 1's primaries of views 0, 1 and 2 are nodes 1, 2 and 0 ([`primary_of`]); the group's
//! home is node 1. Canary: `canary-handover-unsafe` (the old primary keeps serving its view after
//! sending the target its log, as Raft's TimeoutNow would without its precondition) fails
//! `the_old_primary_serves_nothing_once_it_handed_over`, with
//! `cargo test -p shoal-replication --features canary-handover-unsafe --test hand_over`.

mod common;

use common::{GROUP, cluster, primary_of, replica, wait};
use shoal_replication::simulator::{
    Cluster, FaultProfile, Mode, SHUTDOWN_TICKS_MAX, SimOptions, Violation,
};
use shoal_replication::{HandOverRefused, ReplicaConfig, Status};

/// The end of every scenario: faults stop, every client completes its requests, and the final
/// logs hold every acknowledged write with identical committed prefixes.
fn finish(cluster: &mut Cluster) -> Result<(), Violation> {
    cluster.finish_liveness()?;
    cluster.check_logs()
}

/// The simulator's heartbeat timeout: a view change that waited for it was not deliberate.
const HEARTBEAT_TIMEOUT_TICKS: u64 = 100;

/// Per group, the longest run of ticks with no serving primary, as a scenario steps.
#[derive(Default)]
struct Gaps {
    /// Per group: (ticks without a primary so far, longest such run).
    groups: Vec<(u64, u64)>,
}

impl Gaps {
    fn new(groups: u64) -> Gaps {
        Gaps { groups: vec![(0, 0); groups as usize] }
    }

    fn observe(&mut self, cluster: &Cluster) {
        for (index, (current, longest)) in self.groups.iter_mut().enumerate() {
            if cluster.primary(index as u64 + 1).is_some() {
                *current = 0;
            } else {
                *current += 1;
                *longest = (*longest).max(*current);
            }
        }
    }

    fn longest(&self) -> u64 {
        self.groups.iter().map(|(_, longest)| *longest).max().unwrap_or(0)
    }
}

/// DESIGN.md §8 ("the primaries move back after a node returns"), VR Revisited §4.2: the home of
/// group 1 crashes and view 1 starts without it; back and caught up, the home stays a backup
/// until it has been in sync for `primary_return_ticks` (1,000), then the primary of view 1 hands
/// the group back to it: view 3, the first the home leads, starts within a few round trips (no
/// heartbeat timeout), the third replica joining on its primary's vote, and the home fetching
/// nothing (it holds the whole log).
#[test]
fn a_group_moves_back_home_once_its_home_has_been_in_sync_for_a_while() -> Result<(), Violation> {
    let mut cluster = cluster(31, Mode::Persisted, 2);
    let (home, away, third) = (primary_of(0), primary_of(1), primary_of(2));
    cluster.run_ticks(100)?;
    cluster.crash(home, false);
    wait(&mut cluster, 2_000, "view 1 starts without the home", |c| {
        c.primary(GROUP) == Some(away)
    })?;
    cluster.run_ticks(200)?;
    cluster.restart(home)?;
    wait(&mut cluster, 1_000, "the home is in sync again", |c| {
        replica(c, away).in_sync_ticks(home as u8).is_some()
    })?;
    let in_sync_from = cluster.tick();
    let acknowledged = cluster.acknowledged();
    let mut gaps = Gaps::new(1);
    wait(&mut cluster, 3_000, "the group is back home", |c| {
        gaps.observe(c);
        c.primary(GROUP) == Some(home)
    })?;
    let waited = cluster.tick() - in_sync_from;
    assert!(waited >= 1_000, "moved home {waited} ticks after it was in sync");
    let config = ReplicaConfig::new(0, GROUP, 3, 0);
    assert_eq!(replica(&cluster, home).view(), config.next_view_led_by(1, home as u8));
    assert!(gaps.longest() < HEARTBEAT_TIMEOUT_TICKS, "no primary for {} ticks", gaps.longest());
    let counters = replica(&cluster, away).counters();
    assert_eq!((counters.hand_overs_begun, counters.hand_overs_done), (1, 1), "{counters:?}");
    assert_eq!(cluster.node_counters(away).map(|c| c.primaries_returned), Some(1));
    assert!(replica(&cluster, third).counters().abdications_joined > 0, "the backup waited");
    let counters = replica(&cluster, home).counters();
    assert_eq!(counters.bodies_fetched_for_view, 0, "the home lacked bodies: {counters:?}");
    assert!(cluster.acknowledged() > acknowledged, "the group went on committing");
    finish(&mut cluster)?;
    assert_eq!(cluster.primary(GROUP), Some(home), "the group left its home again");
    Ok(())
}

/// DESIGN.md §8 ("a hand-over that fails falls back"): the target's acknowledgements never reach
/// the primary, so it never proves it holds the head; after `hand_over_ticks_max` the primary
/// gives the hand-over up and serves on in its view, which never changed. While it waited it
/// refused new requests (nothing entered a log about to be left) and refused a second hand-over.
#[test]
fn a_hand_over_whose_target_never_catches_up_is_given_up_and_the_primary_serves_on()
-> Result<(), Violation> {
    let mut cluster = cluster(32, Mode::Persisted, 2);
    let (primary, target, other) = (primary_of(0), primary_of(1), primary_of(2));
    cluster.run_ticks(100)?;
    cluster.set_link(target, primary, false);
    assert_eq!(cluster.hand_over(primary, GROUP, target as u8), Ok(1));
    assert_eq!(
        cluster.hand_over(primary, GROUP, other as u8),
        Err(HandOverRefused::InProgress { to: target as u8 })
    );
    assert_eq!(cluster.hand_over(target, GROUP, other as u8), Err(HandOverRefused::NotPrimary));
    let head = replica(&cluster, primary).op();
    let mut grew = None;
    wait(&mut cluster, 100, "the hand-over is given up", |c| {
        let r = replica(c, primary);
        if r.handing_over().is_some() && r.op() > head {
            grew = grew.or(Some(r.op()));
        }
        r.handing_over().is_none()
    })?;
    assert_eq!(grew, None, "a request entered the log while handing over");
    let r = replica(&cluster, primary);
    assert!(r.is_primary() && r.view() == 0, "{:?} in view {}", r.status(), r.view());
    let counters = r.counters();
    assert_eq!((counters.hand_overs_abandoned, counters.hand_overs_done), (1, 0), "{counters:?}");
    cluster.set_link(target, primary, true);
    let acknowledged = cluster.acknowledged();
    wait(&mut cluster, 300, "the primary serves again", |c| c.acknowledged() > acknowledged + 5)?;
    assert_eq!(replica(&cluster, primary).view(), 0);
    finish(&mut cluster)
}

/// DESIGN.md §4 ("votes bind nothing, a sent DoViewChange does": the replica never serves below
/// that view) as the hand-over relies on it: the old primary hands over, and from then on the
/// target's messages reach nobody, so neither the old primary nor the third replica learns that
/// the new view started. Writes keep arriving. The old primary left its view when it offered its
/// log, so it prepares nothing more there: nothing the new view's log lacks can be committed,
/// and once the links heal every acknowledged write is in every log.
///
/// With `canary-handover-unsafe` the old primary sends the target its log and keeps serving view
/// 0 with the third replica, committing writes view 1's log lacks (`replica_memory.rs` shows
/// them lost; here the replicas that committed them refuse view 1's StartView, which ends below
/// their commit point, and the group never converges).
#[test]
fn the_old_primary_serves_nothing_once_it_handed_over() -> Result<(), Violation> {
    let mut cluster = cluster(33, Mode::Persisted, 4);
    let (old, target, third) = (primary_of(0), primary_of(1), primary_of(2));
    cluster.run_ticks(100)?;
    assert_eq!(cluster.hand_over(old, GROUP, target as u8), Ok(1));
    wait(&mut cluster, 60, "the old primary hands over", |c| {
        replica(c, old).counters().hand_overs_done > 0
    })?;
    cluster.set_link(target, old, false);
    cluster.set_link(target, third, false);
    let mut served = None;
    cluster.run_until(60, |c| {
        let r = replica(c, old);
        if r.is_primary() && r.view() == 0 && served.is_none() {
            served = Some((c.tick(), r.op()));
        }
        false
    })?;
    assert_eq!(served, None, "(tick, head) of the old primary serving view 0 after handing over");
    cluster.heal();
    finish(&mut cluster)
}

/// DESIGN.md §8 (controlled shutdown, as Kafka's): node 1 shuts down while it leads group 1 (its
/// home; groups 2 and 3 are led by nodes 2 and 0). It hands the group to a peer in sync and
/// stops only once it leads nothing and takes part in no view change, so no group goes without
/// a serving primary for anything like a heartbeat timeout, as a crash would cost. Restarted,
/// node 1 gets the group back once it has been in sync for a while: a rolling restart that
/// leaves every group where it was.
#[test]
fn a_controlled_shutdown_hands_every_group_over_before_the_node_stops() -> Result<(), Violation> {
    let mut cluster = Cluster::new(&SimOptions {
        faults: Some(FaultProfile::none()),
        mode: Some(Mode::Persisted),
        replicas: 3,
        groups: 3,
        clients_per_group: 2,
        ..SimOptions::new(34)
    });
    let leaving = 1;
    cluster.run_ticks(200)?;
    assert_eq!(cluster.groups_led(leaving), vec![1]);
    let acknowledged = cluster.acknowledged();
    let mut gaps = Gaps::new(3);
    cluster.begin_shutdown(leaving);
    wait(&mut cluster, SHUTDOWN_TICKS_MAX + 1, "the node stops", |c| {
        gaps.observe(c);
        !c.is_up(leaving)
    })?;
    assert_eq!(cluster.coverage().shutdowns_settled, 1, "it stopped before it handed over");
    cluster.run_until(300, |c| {
        gaps.observe(c);
        false
    })?;
    assert!(gaps.longest() < HEARTBEAT_TIMEOUT_TICKS, "no primary for {} ticks", gaps.longest());
    let coverage = cluster.coverage();
    assert_eq!((coverage.shutdown_hand_overs, coverage.hand_overs_done), (1, 1), "{coverage:?}");
    for group in 1..=3 {
        let primary = cluster.primary(group);
        assert!(primary.is_some_and(|p| p != leaving), "group {group}: {primary:?}");
        for node in [0, 2] {
            let r = cluster.replica(node, group).expect("up");
            assert_eq!(r.status(), Status::Normal, "node {node} group {group}");
        }
    }
    assert!(cluster.acknowledged() > acknowledged, "the groups went on committing");
    cluster.restart(leaving)?;
    wait(&mut cluster, 3_000, "group 1 is back home", |c| c.primary(1) == Some(leaving))?;
    finish(&mut cluster)
}

/// DESIGN.md §8, the bound's other side: a cluster stopped node after node. The first two hand
/// their groups on as above; the last leads every group with no peer left to take one (both
/// silent for more than two heartbeats), so it is settled at once and stops well within its
/// bound instead of waiting it out. (A peer that stopped within the last two heartbeats may
/// still be chosen, and an acknowledgement it sent just before may even complete the hand-over:
/// the view change then waits for a target that is gone, and the node stops at its bound.)
/// Restarted, the three come back with every acknowledged write.
#[test]
fn the_last_node_of_a_cluster_stopping_stops_without_waiting_out_its_bound() -> Result<(), Violation>
{
    let mut cluster = Cluster::new(&SimOptions {
        faults: Some(FaultProfile::none()),
        mode: Some(Mode::Persisted),
        replicas: 3,
        groups: 3,
        clients_per_group: 2,
        ..SimOptions::new(35)
    });
    cluster.run_ticks(200)?;
    for node in [0, 1] {
        cluster.begin_shutdown(node);
        wait(&mut cluster, SHUTDOWN_TICKS_MAX + 1, "the node stops", |c| !c.is_up(node))?;
    }
    assert_eq!(cluster.groups_led(2), vec![1, 2, 3], "the last node leads every group");
    // Two heartbeats and more, within the heartbeat timeout: it still leads, nobody answers.
    cluster.run_ticks(30)?;
    let started = cluster.tick();
    cluster.begin_shutdown(2);
    wait(&mut cluster, SHUTDOWN_TICKS_MAX + 1, "the last node stops", |c| !c.is_up(2))?;
    let took = cluster.tick() - started;
    assert!(took < HEARTBEAT_TIMEOUT_TICKS, "the last node stopped after {took} ticks");
    assert_eq!(cluster.coverage().shutdowns_settled, 3);
    for node in 0..3 {
        cluster.restart(node)?;
    }
    finish(&mut cluster)
}

/// The leader balancer's lever (DESIGN.md §8 "Placement and primaries"): every node is told that
/// group 1's primary belongs on the voter that leads view 2, not on its home. The home, leading
/// view 0, hands the group over once that voter has been in sync for `primary_return_ticks`;
/// after the preferred voter crashes and comes back, the group returns to it, not home; and once
/// the preference is withdrawn the group goes home again. No acknowledged write is lost.
#[test]
fn a_group_moves_to_its_preferred_primary_and_back_there_after_a_failover() -> Result<(), Violation>
{
    let mut cluster = cluster(34, Mode::Persisted, 2);
    let (home, preferred) = (primary_of(0), primary_of(2));
    let prefer = |cluster: &mut Cluster, to: Option<u8>| {
        for node in 0..3 {
            cluster.set_preferred_primary(node, GROUP, to);
        }
    };
    cluster.run_ticks(100)?;
    assert_eq!(cluster.primary(GROUP), Some(home));
    prefer(&mut cluster, Some(preferred as u8));
    wait(&mut cluster, 3_000, "the group moves to its preferred primary", |c| {
        c.primary(GROUP) == Some(preferred)
    })?;
    assert_eq!(cluster.node_counters(home).map(|c| c.primaries_returned), Some(1));

    cluster.crash(preferred, false);
    wait(&mut cluster, 2_000, "a failover away from it", |c| {
        c.primary(GROUP).is_some_and(|p| p != preferred)
    })?;
    cluster.run_ticks(200)?;
    cluster.restart(preferred)?;
    // A restarted node forgets what it was told (the server's catalog tells it again).
    cluster.set_preferred_primary(preferred, GROUP, Some(preferred as u8));
    wait(&mut cluster, 3_000, "back on the preferred primary, not home", |c| {
        c.primary(GROUP) == Some(preferred)
    })?;

    prefer(&mut cluster, None);
    wait(&mut cluster, 3_000, "home again once the preference is gone", |c| {
        c.primary(GROUP) == Some(home)
    })?;
    finish(&mut cluster)
}
