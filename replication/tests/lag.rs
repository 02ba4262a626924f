//! Lag and the in-sync set (DESIGN.md §4 "Lag", `docs/protocol.md` "Lag and status"), tested
//! after Kafka's KAFKA-1546 plan in the simulator: the whole cluster (node layer, real engine,
//! simulated disks) driven through `simulator::Cluster` with no random faults, each test placing
//! its own pause, throttle or crash and reading the primary's `GroupStatus` every tick.
//!
//! - Brutal small-batch load never flags a healthy backup. The naive definition (caught up only
//!   when acknowledging the head of the moment) would: `.ci/run` requires the `canary-lag-naive`
//!   feature, which swaps it in, to make this file fail.
//! - A paused backup is flagged dead once silent for the bound, and is back in sync once resumed
//!   and caught up.
//! - A throttled backup (most packets to it lost) keeps answering but falls ever further behind:
//!   lagging, never dead.
//! - A backup down for long stays out of the in-sync set after its restart until it has caught
//!   up, then rejoins.
//!
//! The network keeps each link FIFO: with packets overtaking each other a backup drops every
//! prepare that arrives ahead of its predecessor and waits for a retransmission, which stalls
//! the whole group (commit point included) for up to `prepare_retry_ticks_max`; that is lag,
//! honestly reported, not the healthy backup the first test needs.
//!
//! Group 1's primary in view 0 is node 1; nodes 0 and 2 are its backups. Every test checks that
//! the view never changed, so "the primary" is node 1 throughout, and ends with the simulator's
//! liveness phase and final log check.

use shoal_replication::simulator::network::NetworkConfig;
use shoal_replication::simulator::{Cluster, FaultProfile, Mode, SimOptions, Violation};
use shoal_replication::{GroupStatus, ReplicaConfig, ReplicaState};

/// The group every test watches.
const GROUP: u64 = 1;
/// Group 1's primary in view 0.
const PRIMARY: usize = 1;

/// A three-node cluster holding `GROUP` with `clients` clients, every replica flagging at
/// `lag_ticks_max`, and `network` (no other fault) for as long as a test runs.
fn cluster(seed: u64, clients: u64, lag_ticks_max: u64, network: NetworkConfig) -> Cluster {
    Cluster::new(&options(seed, clients, lag_ticks_max, network))
}

/// The options [`cluster`] uses.
fn options(seed: u64, clients: u64, lag_ticks_max: u64, network: NetworkConfig) -> SimOptions {
    SimOptions {
        faults: Some(FaultProfile { network, ..FaultProfile::none() }),
        mode: Some(Mode::Persisted),
        replicas: 3,
        groups: 1,
        clients_per_group: clients,
        // The network above stays in force this long; every test ends well before.
        ticks: 1_000_000,
        replica_lag_ticks_max: lag_ticks_max,
        // Production-sized repair rounds: how fast a restarted backup catches up is part of
        // what these tests time.
        repair_prepares_max: Some(ReplicaConfig::new(0, 0, 1, 0).repair_prepares_max),
        ..SimOptions::new(seed)
    }
}

/// A network that loses nothing and delays every packet `delay_ticks` ticks, so each link stays
/// FIFO (see the module documentation).
fn delayed(delay_ticks: u64) -> NetworkConfig {
    NetworkConfig {
        delay_ticks_min: delay_ticks,
        delay_ticks_max: delay_ticks,
        ..NetworkConfig::reliable()
    }
}

/// One step, then the primary's status. Fails the test if node 1 is no longer the serving
/// primary of view 0: every figure below is relative to it.
fn step(cluster: &mut Cluster) -> Result<GroupStatus, Violation> {
    cluster.step()?;
    let status = cluster.group_status(PRIMARY, GROUP).expect("the primary's node is up");
    assert!(
        status.primary && status.view == 0,
        "tick {}: node {PRIMARY} no longer leads view 0: {status:?}; {}",
        cluster.tick(),
        cluster.state()
    );
    Ok(status)
}

/// The state the primary gives `backup`.
fn state(status: &GroupStatus, backup: usize) -> ReplicaState {
    status.progress(backup as u8).expect("the primary reports every member").state
}

/// The end of every test: faults stop, every client completes its requests, and the final logs
/// hold every acknowledged write with identical committed prefixes.
fn finish(cluster: &mut Cluster) -> Result<(), Violation> {
    cluster.finish_liveness()?;
    cluster.check_logs()
}

/// KAFKA-1546's first case: many clients, one small batch each, as fast as the pipeline takes
/// them, over a network that delays and reorders; checked every tick for thousands of ticks, no
/// backup is ever anything but in sync, although the head moves on every tick and no
/// acknowledgement ever names the head of the moment it arrives. The bound is tight (50 ticks,
/// 500 ms) so that the naive definition, which waits for an acknowledgement of the current head,
/// trips it.
#[test]
fn brutal_small_batch_load_never_flags_a_healthy_backup() -> Result<(), Violation> {
    const TICKS: u64 = 3_000;
    let mut cluster = cluster(61, 64, 50, delayed(3));
    let mut lag_ticks_max_seen = 0;
    for _ in 0..TICKS {
        let status = step(&mut cluster)?;
        for backup in [0, 2] {
            let progress = status.progress(backup).expect("reported");
            assert_eq!(
                progress.state,
                ReplicaState::InSync,
                "tick {}: backup {backup} flagged under load: {status:?}",
                cluster.tick()
            );
            lag_ticks_max_seen = lag_ticks_max_seen.max(progress.lag_ticks);
        }
        assert_eq!(status.in_sync(), vec![0, 1, 2]);
    }
    // The load was brutal: thousands of one-message writes, and backups trailing the head.
    assert!(cluster.acknowledged() > 2 * TICKS, "only {} writes", cluster.acknowledged());
    assert!(lag_ticks_max_seen > 0, "the backups never trailed the head");
    let coverage = cluster.coverage();
    assert_eq!((coverage.backups_lagging, coverage.backups_dead), (0, 0), "{coverage:?}");
    finish(&mut cluster)
}

/// KAFKA-1546's second case: a backup whose process stops (paused: it neither ticks nor answers)
/// is flagged dead once it has been silent for the bound — not before — and is back in sync once
/// it resumes and catches up. The other backup stays in sync throughout.
#[test]
fn a_paused_backup_is_flagged_dead_and_rejoins_once_resumed() -> Result<(), Violation> {
    const LAG: u64 = 300;
    // A heartbeat interval and a round trip.
    const SLACK: u64 = 20;
    let (paused, healthy) = (2, 0);
    let mut cluster = cluster(62, 4, LAG, delayed(3));
    for _ in 0..200 {
        let status = step(&mut cluster)?;
        assert_eq!(status.in_sync(), vec![0, 1, 2]);
    }
    let pause_tick = cluster.tick();
    cluster.pause(paused, 3 * LAG);
    let mut dead_from = None;
    while cluster.tick() < pause_tick + 3 * LAG {
        let status = step(&mut cluster)?;
        let tick = cluster.tick();
        assert_eq!(state(&status, healthy), ReplicaState::InSync, "tick {tick}: {status:?}");
        match state(&status, paused) {
            ReplicaState::Dead => {
                dead_from.get_or_insert(tick);
            }
            other => {
                assert!(dead_from.is_none(), "tick {tick}: dead, then {other:?}: {status:?}");
                // Its last answer (and the last acknowledgement, which may trail it) came at
                // most a heartbeat interval before the pause: nothing is flagged before then.
                assert!(
                    other == ReplicaState::InSync || tick > pause_tick + LAG - SLACK,
                    "tick {tick}: flagged {other:?} within the bound: {status:?}"
                );
            }
        }
    }
    let dead_from = dead_from.expect("the paused backup was never flagged dead");
    assert!(
        (pause_tick + LAG - SLACK..=pause_tick + LAG + SLACK).contains(&dead_from),
        "flagged dead at tick {dead_from}, paused at {pause_tick}"
    );
    let status = step(&mut cluster)?;
    assert_eq!(status.in_sync(), vec![0, 1], "{status:?}");
    // Resumed (the pause ended): it answers, repairs what it missed and is back in sync.
    let mut back = false;
    for _ in 0..2 * LAG {
        let status = step(&mut cluster)?;
        if status.in_sync() == vec![0, 1, 2] {
            back = true;
            break;
        }
    }
    assert!(back, "the resumed backup is not back in sync: {}", cluster.state());
    let coverage = cluster.coverage();
    assert!(coverage.backups_dead >= 1 && coverage.backups_back_in_sync >= 1, "{coverage:?}");
    finish(&mut cluster)
}

/// KAFKA-1546's third case: a backup throttled so hard (nine in ten packets from either peer
/// lost) that it keeps answering — the Commit heartbeats that get through are acknowledged — but
/// falls ever further behind under load: flagged lagging, never dead; the other backup stays in
/// sync. Once the throttle lifts it catches up.
#[test]
fn a_throttled_backup_is_flagged_lagging_but_not_dead() -> Result<(), Violation> {
    const LAG: u64 = 1_000;
    const TICKS: u64 = 4_000;
    let (throttled, healthy) = (0, 2);
    // Small repair rounds too: with production-sized ones, the tenth of the answers that gets
    // through still carries enough to keep up.
    let mut cluster = Cluster::new(&SimOptions {
        repair_prepares_max: Some(4),
        ..options(63, 8, LAG, delayed(3))
    });
    for _ in 0..100 {
        step(&mut cluster)?;
    }
    let throttle_tick = cluster.tick();
    // Every way in is throttled: repair would otherwise fetch what it misses from the healthy
    // backup instead.
    cluster.set_link_loss(PRIMARY, throttled, 900_000);
    cluster.set_link_loss(healthy, throttled, 900_000);
    let mut lagging_from = None;
    let mut behind = Vec::new();
    while cluster.tick() < throttle_tick + TICKS {
        let status = step(&mut cluster)?;
        let tick = cluster.tick();
        assert_eq!(state(&status, healthy), ReplicaState::InSync, "tick {tick}: {status:?}");
        let progress = *status.progress(throttled as u8).expect("reported");
        assert_ne!(progress.state, ReplicaState::Dead, "tick {tick}: {status:?}");
        assert!(progress.silent_ticks <= LAG, "tick {tick}: {status:?}");
        if progress.state == ReplicaState::Lagging {
            lagging_from.get_or_insert(tick);
        } else {
            assert!(lagging_from.is_none(), "tick {tick}: lagging, then {status:?}");
        }
        if tick.is_multiple_of(1_000) {
            behind.push(status.head - progress.acknowledged_op);
        }
    }
    let lagging_from = lagging_from.expect("the throttled backup was never flagged lagging");
    assert!(
        lagging_from > throttle_tick + LAG,
        "lagging at {lagging_from}, throttled at {throttle_tick}"
    );
    // Ever further behind: the ops it has not acknowledged grow, thousand ticks by thousand.
    assert!(
        behind.len() >= 3 && behind.windows(2).all(|w| w[0] < w[1]),
        "ops behind the head: {behind:?}"
    );
    let coverage = cluster.coverage();
    assert_eq!(coverage.backups_dead, 0, "{coverage:?}");
    assert!(coverage.backups_lagging >= 1, "{coverage:?}");
    finish(&mut cluster)
}

/// KAFKA-1546's fourth case: a backup down (crashed) for three bounds under load stays out of
/// the in-sync set after its restart, although it answers at once, until it has caught up:
/// whenever the primary counts it in sync it has acknowledged what was the head one bound ago.
/// Then it rejoins.
#[test]
fn a_long_down_backup_stays_out_of_sync_until_caught_up() -> Result<(), Violation> {
    const LAG: u64 = 300;
    let (victim, healthy) = (2, 0);
    let mut cluster = cluster(64, 12, LAG, delayed(3));
    // The primary's head at every tick, to check "caught up within the bound" against.
    let mut heads = vec![0];
    for _ in 0..200 {
        heads.push(step(&mut cluster)?.head);
    }
    cluster.crash(victim, false);
    for _ in 0..3 * LAG {
        let status = step(&mut cluster)?;
        assert_eq!(state(&status, healthy), ReplicaState::InSync, "{status:?}");
        heads.push(status.head);
    }
    let status = cluster.group_status(PRIMARY, GROUP).expect("up");
    assert_eq!(state(&status, victim), ReplicaState::Dead, "{status:?}");
    let restart_tick = cluster.tick();
    cluster.restart(victim)?;
    let mut lagging_after_restart = 0;
    let mut rejoined = None;
    for _ in 0..3 * LAG {
        let status = step(&mut cluster)?;
        let tick = cluster.tick();
        heads.push(status.head);
        assert_eq!(tick as usize + 1, heads.len());
        let progress = *status.progress(victim as u8).expect("reported");
        match progress.state {
            ReplicaState::Lagging => lagging_after_restart += 1,
            ReplicaState::InSync => {
                let head_a_bound_ago = heads[(tick - LAG) as usize];
                assert!(
                    progress.acknowledged_op >= head_a_bound_ago,
                    "tick {tick}: in sync having acknowledged op {} while the head {LAG} ticks \
                     ago was {head_a_bound_ago}: {status:?}",
                    progress.acknowledged_op
                );
                rejoined.get_or_insert(tick);
            }
            _ => {}
        }
    }
    let rejoined = rejoined.expect("the restarted backup never rejoined the in-sync set");
    // It answered well before it rejoined: heard, out of sync, for a while.
    assert!(lagging_after_restart > 10, "lagging for {lagging_after_restart} ticks only");
    assert!(rejoined > restart_tick + 10, "rejoined at {rejoined}, restarted at {restart_tick}");
    assert_eq!(
        cluster.group_status(PRIMARY, GROUP).expect("up").in_sync(),
        vec![0, 1, 2],
        "{}",
        cluster.state()
    );
    finish(&mut cluster)
}

/// Only the primary knows its backups' progress: a backup reports its own view, status, commit
/// point and head, and an empty in-sync set.
#[test]
fn a_backup_reports_its_own_position_only() -> Result<(), Violation> {
    let mut cluster = cluster(65, 2, 300, NetworkConfig::reliable());
    for _ in 0..200 {
        step(&mut cluster)?;
    }
    let backup = cluster.group_status(0, GROUP).expect("up");
    assert!(!backup.primary && backup.replicas.is_empty() && backup.in_sync().is_empty());
    assert!(backup.head > 0 && backup.commit > 0, "{backup:?}");
    let primary = cluster.group_status(PRIMARY, GROUP).expect("up");
    let own = primary.progress(PRIMARY as u8).expect("reported");
    assert_eq!(own.state, ReplicaState::Primary);
    assert!(primary.head >= backup.head);
    finish(&mut cluster)
}
