//! Scripted scenarios: the whole cluster (node layer, real engine, simulated disks) driven
//! through `simulator::Cluster` with no random faults, each scenario placing its own crashes and
//! cuts where one rule of the protocol is the only thing between the cluster and a lost write.
//!
//! Each test names the section of "Viewstamped Replication Revisited" (Liskov & Cowling 2012:
//! §4.1 normal operation, §4.2 view changes, §4.3 recovery) or the DESIGN.md §4 rule it
//! exercises, asserts through a branch counter that the run really took that branch, and ends
//! with the simulator's liveness phase and its final log check: every acknowledged write sits at
//! its acknowledged op and offset, and committed prefixes agree.
//!
//! The primary of group `g` in view `v` is node `(v + g) mod 3`; every scenario but the admin
//! group's transfer uses group 1, so the primaries of views 0, 1 and 2 are nodes 1, 2 and 0
//! ([`primary_of`]).
//!
//! Canaries (DESIGN.md §7) these scenarios catch, each run with
//! `cargo test -p shoal-replication --features canary-<rule> --test scenarios`:
//! `skip-body-fetch` (the first three scenarios), `vote-while-recovering` (the restarted
//! backup), `send-before-persist` (the backup that loses power before persisting the StartView
//! it acknowledges), `nack-faulty` (the two unclean restarts), `no-dedup` (the retry across
//! a primary change), `transfer-keeps-table` and `transfer-drops-driver-state` (the two state
//! transfers). `join-on-receipt` changes no
//! behaviour, so nothing can catch it: see the one-way partition scenario.

mod common;

use common::{GROUP, cluster, primary_of, replica, wait};
use shoal_replication::Status;
use shoal_replication::simulator::{
    Cluster, FaultProfile, Mode, SimOptions, Violation, network::NetworkConfig,
};

/// The end of every scenario: faults stop, every client completes its requests, and the final
/// logs hold every acknowledged write with identical committed prefixes.
fn finish(cluster: &mut Cluster) -> Result<(), Violation> {
    cluster.finish_liveness()?;
    cluster.check_logs()
}

// --- §4.2: the new primary's log -----------------------------------------------------------------

/// VR Revisited §4.2 (the new primary takes the log of the highest view and op) and DESIGN.md §4
/// "the new primary fetches every missing body and checks it against the merged header ... and
/// only then sends StartView": an op the old primary and one backup (the witness) acknowledged
/// while the other backup missed it (its link from the primary cut) survives the old primary's
/// death although it lies above every commit point the survivors know, and the backup that
/// missed it becomes the new primary.
#[test]
fn new_primary_fetches_the_body_of_an_acknowledged_op_it_missed() -> Result<(), Violation> {
    let mut cluster = cluster(11, Mode::Persisted, 1);
    let (old, new, witness) = (primary_of(0), primary_of(1), primary_of(2));
    cluster.run_ticks(100)?;
    cluster.set_link(old, new, false);
    // The old primary commits an op on the witness's acknowledgement alone, and dies before it
    // tells anyone the op is committed.
    wait(&mut cluster, 200, "an op committed that the new primary lacks", |c| {
        let committed = replica(c, old).commit();
        committed > replica(c, new).op() && committed > replica(c, witness).commit()
    })?;
    let missed = replica(&cluster, old).commit();
    cluster.crash(old, false);
    wait(&mut cluster, 10, "the client hears that the op committed", |c| {
        c.acknowledged_ops(GROUP).contains(&missed)
    })?;
    assert!(replica(&cluster, witness).commit() < missed, "op {missed} is below a commit point");
    wait(&mut cluster, 2_000, "the backup that missed the op leads view 1", |c| {
        c.primary(GROUP) == Some(new)
    })?;
    let counters = replica(&cluster, new).counters();
    assert!(counters.bodies_fetched_for_view > 0, "no body fetched before StartView: {counters:?}");
    assert!(replica(&cluster, new).op_appended() >= missed, "started view 1 without op {missed}");
    finish(&mut cluster)
}

/// VR Revisited §4.2 (the new primary's log holds every committed op) and DESIGN.md §4 (the new
/// primary starts its view only once its merged log is whole): a backup that missed ops the
/// other backup knows committed is not promoted while it lacks them; it becomes primary of
/// view 1 only after fetching them.
#[test]
fn a_replica_missing_committed_ops_is_promoted_only_after_repairing_them() -> Result<(), Violation>
{
    let mut cluster = cluster(12, Mode::Persisted, 2);
    let (old, new, witness) = (primary_of(0), primary_of(1), primary_of(2));
    cluster.run_ticks(100)?;
    cluster.set_link(old, new, false);
    wait(&mut cluster, 300, "the witness knows committed ops the new primary lacks", |c| {
        replica(c, witness).commit() >= replica(c, new).op() + 3
    })?;
    // The merged commit point of view 1 is at least what the witness knows now.
    let commit = replica(&cluster, witness).commit();
    cluster.crash(old, false);
    let mut promoted_early = None;
    wait(&mut cluster, 2_000, "the lagging backup leads view 1", |c| {
        let r = replica(c, new);
        if r.is_primary() && r.op_appended() < commit && promoted_early.is_none() {
            promoted_early = Some((c.tick(), r.op_appended()));
        }
        c.primary(GROUP) == Some(new)
    })?;
    assert_eq!(promoted_early, None, "(tick, op_appended) of a primary below commit {commit}");
    let counters = replica(&cluster, new).counters();
    assert!(counters.repairs_requested > 0, "nothing repaired: {counters:?}");
    assert!(counters.views_started > 0);
    finish(&mut cluster)
}

/// DESIGN.md §4 "a header it holds without a body above commit counts as a nack": the old
/// primary prepares an op nobody else receives; the first would-be primary merges the old
/// primary's log (so it holds the op's header) but the old primary dies before the body is
/// fetched; the next view change counts the header without body as a nack, drops the op, which
/// no client was ever told committed, and starts (VR Revisited §4.2 with DESIGN.md's nack rule).
#[test]
fn a_header_without_its_body_is_a_nack_so_a_dead_op_cannot_stall_the_view() -> Result<(), Violation>
{
    let mut cluster = cluster(13, Mode::Persisted, 1);
    let (old, first, second) = (primary_of(0), primary_of(1), primary_of(2));
    cluster.run_ticks(100)?;
    // `second` is down while the op is prepared: it cannot have received it.
    cluster.crash(second, false);
    cluster.run_ticks(50)?;
    cluster.set_link(old, first, false);
    wait(&mut cluster, 100, "an op prepared on the old primary alone", |c| {
        replica(c, old).op() > replica(c, first).op()
    })?;
    cluster.set_clients_active(false);
    let dropped = replica(&cluster, old).op();
    let checksum = replica(&cluster, old).header(dropped).expect("the head").checksum_header;
    let acknowledged = cluster.acknowledged();
    // Once the old primary gives up view 0 it stops retransmitting, and may offer its log.
    wait(&mut cluster, 300, "the old primary leaves view 0", |c| {
        replica(c, old).status() == Status::ViewChange
    })?;
    cluster.set_link(old, first, true);
    wait(&mut cluster, 500, "the would-be primary merged the op's header", |c| {
        let r = replica(c, first);
        r.status() == Status::ViewChange
            && r.op_appended() < dropped
            && r.header(dropped).is_some_and(|h| h.checksum_header == checksum)
    })?;
    // The only body is gone before it could be fetched.
    cluster.crash(old, false);
    cluster.restart(second)?;
    wait(&mut cluster, 3_000, "a view starts without the old primary", |c| {
        c.primary(GROUP).is_some()
    })?;
    assert_eq!(cluster.acknowledged(), acknowledged, "an op was acknowledged by a dead view");
    let primary = cluster.primary(GROUP).expect("waited for it");
    let counters = replica(&cluster, primary).counters();
    assert!(counters.ops_nacked > 0, "the op was not dropped by nacks: {counters:?}");
    let held =
        |c: &Cluster, node| c.replica(node, GROUP)?.header(dropped).map(|h| h.checksum_header);
    assert_ne!(held(&cluster, primary), Some(checksum), "the new view kept op {dropped}");
    finish(&mut cluster)?;
    for node in 0..3 {
        assert_ne!(held(&cluster, node), Some(checksum), "node {node} kept op {dropped}");
    }
    Ok(())
}

// --- §4.2: crashes during a view change ----------------------------------------------------------

/// Which replica dies in the middle of the view change.
#[derive(Clone, Copy, Debug)]
enum Victim {
    /// The primary of the view being started.
    NewPrimary,
    /// The other backup, a voter.
    Voter,
}

/// VR Revisited §4.2: the old primary is cut off, both backups vote for view 1 on their own
/// timeouts, and `victim` crashes after StartViewChange and before any StartView. The survivors
/// and the old primary (healed) still start a view, the victim rejoins through StartView after
/// its restart, and nothing acknowledged is lost.
fn check_crash_during_view_change(seed: u64, victim: Victim) -> Result<(), Violation> {
    let mut cluster = cluster(seed, Mode::Persisted, 2);
    let (old, new, voter) = (primary_of(0), primary_of(1), primary_of(2));
    cluster.run_ticks(150)?;
    let acknowledged = cluster.acknowledged();
    assert!(acknowledged > 0, "nothing written before the view change");
    cluster.isolate(old);
    wait(&mut cluster, 400, "both backups voted for view 1", |c| {
        [new, voter].iter().all(|&n| {
            let r = replica(c, n);
            r.status() == Status::ViewChange && r.view() == 1
        })
    })?;
    assert_eq!(cluster.coverage().views_started, 0, "a view started before the crash");
    let victim = match victim {
        Victim::NewPrimary => new,
        Victim::Voter => voter,
    };
    cluster.crash(victim, false);
    cluster.heal();
    wait(&mut cluster, 3_000, "the survivors start a view", |c| c.primary(GROUP).is_some())?;
    let primary = cluster.primary(GROUP).expect("waited for it");
    assert_ne!(primary, victim);
    assert!(replica(&cluster, primary).counters().views_started > 0);
    cluster.restart(victim)?;
    wait(&mut cluster, 1_000, "the victim rejoins", |c| {
        let r = replica(c, victim);
        r.status() == Status::Normal && r.counters().start_views_installed > 0
    })?;
    finish(&mut cluster)?;
    assert!(cluster.acknowledged() > acknowledged);
    Ok(())
}

#[test]
fn the_new_primary_crashing_during_the_view_change_loses_nothing() -> Result<(), Violation> {
    check_crash_during_view_change(14, Victim::NewPrimary)
}

#[test]
fn a_voter_crashing_during_the_view_change_loses_nothing() -> Result<(), Violation> {
    check_crash_during_view_change(14, Victim::Voter)
}

// --- §4.3: restarts ------------------------------------------------------------------------------

/// VR Revisited §4.3 (a recovering replica takes no part in the protocol until it has the
/// state) and DESIGN.md §4 Restart (it stays out of every quorum, Recovering, until the current
/// primary's StartView): a backup of a `replicated` group restarts after a power loss while
/// the primary is healthy; its first probes go unanswered. It never votes, stays Recovering
/// until it installs a StartView, then catches up and clears its faulty suffix; the primary's
/// view never changes.
#[test]
fn a_restarted_backup_stays_out_of_quorums_until_start_view() -> Result<(), Violation> {
    let mut cluster = cluster(15, Mode::Replicated, 2);
    let (primary, backup) = (primary_of(0), primary_of(1));
    cluster.run_ticks(150)?;
    cluster.crash(backup, true);
    cluster.run_ticks(100)?;
    // Fewer unanswered probes than `start_view_probes_max`: it must simply wait.
    cluster.set_link(primary, backup, false);
    cluster.restart(backup)?;
    assert!(replica(&cluster, backup).faulty_from().is_some(), "no faulty suffix to clear");
    // Out of every quorum: no vote, and Recovering until a StartView is installed.
    let joined = |c: &Cluster| {
        let r = replica(c, backup);
        let out = r.status() == Status::Recovering || r.counters().start_views_installed > 0;
        (r.counters().votes_cast > 0 || !out).then(|| (c.tick(), r.status(), r.counters()))
    };
    let mut broke = None;
    cluster.run_until(60, |c| {
        broke = broke.or_else(|| joined(c));
        false
    })?;
    assert_eq!(
        broke, None,
        "the restarted backup joined a quorum while its probes went unanswered"
    );
    cluster.set_link(primary, backup, true);
    wait(&mut cluster, 300, "the backup installs a StartView", |c| {
        broke = broke.or_else(|| joined(c));
        replica(c, backup).counters().start_views_installed > 0
    })?;
    wait(&mut cluster, 500, "the backup catches up", |c| {
        broke = broke.or_else(|| joined(c));
        let r = replica(c, backup);
        r.faulty_from().is_none() && r.op_appended() >= replica(c, primary).commit()
    })?;
    assert_eq!(broke, None, "the restarted backup joined a quorum before its StartView");
    assert!(replica(&cluster, primary).is_primary());
    assert_eq!(replica(&cluster, primary).view(), 0, "the healthy primary was deposed");
    finish(&mut cluster)
}

/// A restart reads each group's newest headers and replays its producers' batches from its
/// log, and neither read is a consumer's: the restarted node's batch cache starts empty (with
/// 10,000 groups, caching those reads held gigabytes of fresh memory and took most of the
/// start), and the restarted replica still rejoins with its log.
#[test]
fn a_restart_reads_its_logs_without_filling_the_batch_cache() -> Result<(), Violation> {
    let mut cluster = cluster(19, Mode::Persisted, 2);
    let backup = primary_of(1);
    cluster.run_ticks(300)?;
    assert!(replica(&cluster, backup).op() > 20, "a log worth reading");
    cluster.crash(backup, false);
    cluster.restart(backup)?;
    assert_eq!(cluster.batch_cache_bytes(backup), Some(0));
    let counters = cluster.node_counters(backup).expect("up");
    assert!(counters.producer_ops_replayed > 0, "the producers' batches were replayed");
    wait(&mut cluster, 500, "the backup rejoins", |c| {
        replica(c, backup).status() == Status::Normal
    })?;
    finish(&mut cluster)
}

/// DESIGN.md §4 Restart ("a cluster whose nodes all restarted comes back: in `persisted`
/// groups nothing acknowledged can be missing from every replica") and VR Revisited §4.3: every
/// replica loses power at once while writes are in flight; nobody answers the restarted
/// replicas' probes, so they fall back to a view change offering their logs, and every
/// acknowledged write is still there. Run at a few crash points.
#[test]
fn every_replica_of_a_persisted_group_losing_power_at_once_loses_nothing() -> Result<(), Violation>
{
    for (seed, warm_up_ticks) in [(16, 100), (17, 173), (18, 251)] {
        let mut cluster = cluster(seed, Mode::Persisted, 2);
        let primary = primary_of(0);
        cluster.run_ticks(warm_up_ticks)?;
        wait(&mut cluster, 50, "a write in flight", |c| {
            let r = replica(c, primary);
            r.op() > r.commit()
        })?;
        for node in 0..3 {
            cluster.crash(node, true);
        }
        for node in 0..3 {
            cluster.restart(node)?;
        }
        wait(&mut cluster, 3_000, "the cluster comes back", |c| c.primary(GROUP).is_some())?;
        let coverage = cluster.coverage();
        assert!(coverage.recovery_view_changes > 0, "seed {seed}: {coverage:?}");
        assert_eq!(coverage.power_losses, 3);
        finish(&mut cluster)?;
    }
    Ok(())
}

/// DESIGN.md §4 Restart ("in `replicated` groups a simultaneous restart of every replica is
/// beyond the fault model: an op faulty everywhere stalls the group, and only an explicit
/// setting (`unclean_recovery = true`, like Kafka's unclean leader election) lets it restart,
/// logging what it may have lost"): every replica of a `replicated` group loses power at once
/// while writes are in flight. Each comes back with its unsynced suffix faulty, so no merge can
/// prove the ops above the commit point dead or find them whole: by default the group stays
/// down (unavailable beats wrong); with `unclean_recovery` it serves again and counts the
/// merge that may have lost acknowledged writes.
#[test]
fn a_replicated_group_that_lost_power_everywhere_restarts_only_when_told_to_be_unclean()
-> Result<(), Violation> {
    for unclean_recovery in [false, true] {
        let mut cluster = Cluster::new(&SimOptions {
            faults: Some(FaultProfile::none()),
            mode: Some(Mode::Replicated),
            replicas: 3,
            groups: 1,
            clients_per_group: 2,
            unclean_recovery,
            ..SimOptions::new(26)
        });
        cluster.run_ticks(150)?;
        for node in 0..3 {
            cluster.crash(node, true);
        }
        for node in 0..3 {
            cluster.restart(node)?;
            assert!(replica(&cluster, node).faulty_from().is_some(), "node {node}: nothing faulty");
        }
        if unclean_recovery {
            // What it may lose is the documented outcome: only what follows is checked.
            cluster.forget_history();
        }
        let came_back = cluster.run_until(3_000, |c| c.primary(GROUP).is_some())?;
        let stalls: u64 = (0..3).map(|n| replica(&cluster, n).counters().merges_stalled).sum();
        let lost: u64 = (0..3).map(|n| replica(&cluster, n).counters().unclean_ops_lost).sum();
        if unclean_recovery {
            assert!(came_back, "unclean recovery did not restart the group: {}", cluster.state());
            assert!(lost > 0, "the unclean merge was not counted");
            finish(&mut cluster)?;
        } else {
            assert!(!came_back, "the group restarted over ops faulty everywhere");
            assert!(stalls > 0 && lost == 0, "stalls {stalls}, lost {lost}");
        }
    }
    Ok(())
}

/// DESIGN.md §4 Repair and catch-up ("peers serve from the prepare ring and fall back to their
/// segments on disk, so a replica that missed more than the ring holds still catches up
/// incrementally"): a backup is down while the group commits more ops than the primary's ring
/// holds (`ShardConfig::small`: 1,024). After its restart it pulls the missing ops in bounded
/// rounds, the primary reads the old ones back from its segments, and no state transfer is
/// needed.
#[test]
fn a_backup_that_missed_more_than_the_ring_catches_up_from_the_primarys_segments()
-> Result<(), Violation> {
    const RING_ENTRIES: u64 = 1_024;
    let mut cluster = cluster(21, Mode::Persisted, 12);
    let (primary, backup) = (primary_of(0), primary_of(1));
    cluster.run_ticks(50)?;
    cluster.crash(backup, false);
    let missed_from = replica(&cluster, primary).commit();
    wait(&mut cluster, 20_000, "the group moves past the primary's ring", |c| {
        replica(c, primary).commit() > missed_from + RING_ENTRIES + 200
    })?;
    cluster.restart(backup)?;
    let mut taken_for_evicted = None;
    wait(&mut cluster, 20_000, "the backup catches up", |c| {
        let (b, p) = (replica(c, backup), replica(c, primary));
        // The peers still hold every op it misses: it must never conclude otherwise.
        if taken_for_evicted.is_none() && b.op_appended() < p.commit() && b.needs_state_transfer() {
            taken_for_evicted = Some(c.tick());
        }
        b.status() == Status::Normal && b.op_appended() >= missed_from + RING_ENTRIES + 200
    })?;
    assert_eq!(
        taken_for_evicted, None,
        "a peer that holds the range was taken for one that does not"
    );
    let served = cluster.node_counters(primary).expect("the primary is up");
    assert!(served.prepares_served_from_disk > 0, "nothing read back from segments: {served:?}");
    let counters = replica(&cluster, backup).counters();
    assert!(counters.repair_rounds > 1, "one round cannot carry it: {counters:?}");
    assert_eq!(counters.ranges_evicted, 0);
    finish(&mut cluster)
}

/// DESIGN.md §4 Repair and catch-up, when the peers answer slower than the repair interval
/// (a busy disk, a long link: here every packet takes 4 ticks each way, the interval is 5): a
/// round that brought nothing by its deadline asks the next peer after twice the interval, and
/// one whose answers are arriving lives on, so the returning backup asks for each op it missed
/// about once instead of asking every peer again and again while their answers are on the way
/// (which once multiplied the peers' disk reads during a real catch-up).
#[test]
fn a_backup_repairing_from_slow_peers_asks_for_each_op_about_once() -> Result<(), Violation> {
    let slow =
        NetworkConfig { delay_ticks_min: 4, delay_ticks_max: 4, ..NetworkConfig::reliable() };
    let mut cluster = Cluster::new(&SimOptions {
        faults: Some(FaultProfile { network: slow, ..FaultProfile::none() }),
        mode: Some(Mode::Persisted),
        replicas: 3,
        groups: 1,
        clients_per_group: 12,
        ..SimOptions::new(23)
    });
    let (primary, backup) = (primary_of(0), primary_of(1));
    cluster.run_ticks(50)?;
    cluster.crash(backup, false);
    let missed_from = replica(&cluster, primary).commit();
    wait(&mut cluster, 20_000, "the group commits 1,000 ops more", |c| {
        replica(c, primary).commit() > missed_from + 1_000
    })?;
    cluster.restart(backup)?;
    let target = replica(&cluster, primary).commit();
    wait(&mut cluster, 20_000, "the backup catches up", |c| {
        let b = replica(c, backup);
        b.status() == Status::Normal && b.op_appended() >= target
    })?;
    let counters = replica(&cluster, backup).counters();
    let missed = target - missed_from;
    assert!(
        counters.repairs_requested < missed + missed / 2,
        "{} ops asked for {missed} missed: {counters:?}",
        counters.repairs_requested
    );
    assert!(counters.repair_rounds_extended > 0 || counters.repair_rounds_unanswered > 0);
    finish(&mut cluster)
}

/// DESIGN.md §4 Repair and catch-up ("a full state transfer is needed only when the peer no
/// longer has the data (retention)"): a backup is down while retention on both other replicas
/// deletes segments holding ops it never received. After its restart each peer answers its
/// repair with `RangeEvicted` (their oldest op); once both have, the backup takes a state
/// transfer while the group goes on committing: it assembles a peer's replicated state (its
/// idempotent producer table as of its commit point) piece by piece, fetches that op's
/// prepare, installs a log beginning there, and catches up by ordinary repair. It converges
/// (the final check compares every log from its first op), ends with the same producer table as
/// the primary, and after a crash restarts from the transferred state.
#[test]
fn a_backup_whose_missing_ops_retention_removed_everywhere_catches_up_through_a_state_transfer()
-> Result<(), Violation> {
    let mut cluster = Cluster::new(&SimOptions {
        faults: Some(FaultProfile::none()),
        mode: Some(Mode::Persisted),
        replicas: 3,
        groups: 1,
        clients_per_group: 12,
        retention_bytes: 2 << 20,
        value_size_bytes: 3_000,
        ..SimOptions::new(27)
    });
    let (primary, backup, other) = (primary_of(0), primary_of(1), primary_of(2));
    cluster.run_ticks(50)?;
    cluster.crash(backup, false);
    let missed_from = replica(&cluster, primary).commit() + 1;
    wait(&mut cluster, 30_000, "retention removes ops the backup never had", |c| {
        [primary, other].iter().all(|&n| c.log_first_op(n, GROUP).is_some_and(|f| f > missed_from))
    })?;
    cluster.restart(backup)?;
    wait(&mut cluster, 3_000, "the backup installs a peer's state", |c| {
        replica(c, backup).counters().transfers_installed > 0
    })?;
    let counters = replica(&cluster, backup).counters();
    assert!(counters.ranges_evicted >= 2, "both peers said so first: {counters:?}");
    assert_eq!(counters.transfer_states_rejected, 0, "{counters:?}");
    let served: u64 =
        [primary, other].iter().map(|&n| replica(&cluster, n).counters().state_chunks_served).sum();
    assert!(served > 1, "a table of 12 producers takes several 256-byte pieces: {served}");
    let installed_at = replica(&cluster, backup).commit();
    assert!(installed_at > missed_from, "the log begins past what it missed");
    // The table came with the state: it knows every client's batches at ops the backup never
    // held (its own log stopped before `missed_from`).
    let producers = replica(&cluster, backup).producers();
    for client in 1..=12 {
        let newest = producers.state(client, 0).and_then(|s| s.batches().last().map(|b| b.op));
        assert!(newest.is_some_and(|op| op >= missed_from), "client {client}: {newest:?}");
    }
    let acknowledged = cluster.acknowledged();
    let target = replica(&cluster, primary).commit();
    wait(&mut cluster, 3_000, "the backup catches up by repair after the install", |c| {
        replica(c, backup).op_appended() >= target
    })?;
    assert!(cluster.acknowledged() > acknowledged, "the group went on committing meanwhile");
    assert_eq!(cluster.log_first_op(backup, GROUP), Some(installed_at));
    // A crash after the install: the restart takes its producer table and commit point from
    // the transferred state, where its log begins.
    cluster.crash(backup, false);
    cluster.restart(backup)?;
    finish(&mut cluster)?;
    cluster.set_clients_active(false);
    let heads_equal = |c: &Cluster| {
        let (b, p) = (replica(c, backup), replica(c, primary));
        b.commit() == p.commit() && b.status() == Status::Normal
    };
    wait(&mut cluster, 1_000, "backup and primary at one commit point", heads_equal)?;
    assert_eq!(
        replica(&cluster, backup).producers().encode(),
        replica(&cluster, primary).producers().encode(),
        "the transferred producer table plus what followed is the primary's"
    );
    Ok(())
}

/// DESIGN.md §3 (state transfer) and the issue's "Metadata: snapshot every N ops, transferred
/// the same way", on the simulator's admin group (group 2 here: a client table as its machine,
/// snapshotted every 16 ops so retention may delete what a snapshot covers). A backup of both
/// groups misses ops that retention then removes everywhere; its transfers carry, beside the
/// producer table, the peer machine's state as of the transferred op, and the backup's
/// machine becomes that state and follows the log from there. It must then hold every
/// acknowledged admin request at or below its op as executed (checked at the end), answer
/// retries of requests executed at ops it never held from the transferred table (a second
/// execution fails the run as it happens), and at the end hold exactly the primary's state.
#[test]
fn a_backup_whose_admin_ops_retention_removed_everywhere_takes_the_admin_state_with_the_transfer()
-> Result<(), Violation> {
    const ADMIN: u64 = 2;
    let mut cluster = Cluster::new(&SimOptions {
        faults: Some(FaultProfile::none()),
        mode: Some(Mode::Persisted),
        replicas: 3,
        groups: 2,
        clients_per_group: 8,
        retention_bytes: 2 << 20,
        value_size_bytes: 3_000,
        ..SimOptions::new(29)
    });
    // The admin group's primary in view 0 is node 2; node 0 is a backup of both groups.
    let (primary, other, backup) = (2, 1, 0);
    let commit = |c: &Cluster, node: usize| c.replica(node, ADMIN).expect("up").commit();
    cluster.run_ticks(50)?;
    cluster.crash(backup, false);
    let missed_from = commit(&cluster, primary) + 1;
    wait(&mut cluster, 30_000, "retention removes admin ops the backup never had", |c| {
        [primary, other].iter().all(|&n| c.log_first_op(n, ADMIN).is_some_and(|f| f > missed_from))
    })?;
    assert!(cluster.coverage().admin_snapshots > 0, "retention waited for snapshots");
    cluster.restart(backup)?;
    wait(&mut cluster, 3_000, "the backup's admin machine becomes a peer's state", |c| {
        c.coverage().admin_states_transferred > 0
    })?;
    assert!(cluster.coverage().admin_states_served > 0);
    let (op, _) = cluster.admin_state(backup).expect("the machine follows after the transfer");
    assert!(op > missed_from, "the machine starts past the ops it missed: {op}");
    assert_eq!(cluster.log_first_op(backup, ADMIN), Some(commit(&cluster, backup)));
    // A crash after the install: the machine restarts from the transferred state (or a newer
    // snapshot) where the log begins.
    cluster.run_ticks(20)?;
    cluster.crash(backup, false);
    cluster.restart(backup)?;
    assert!(cluster.admin_state(backup).is_some(), "followed again after the restart");
    finish(&mut cluster)?;
    cluster.set_clients_active(false);
    wait(&mut cluster, 1_000, "the backup's and the primary's machines at one op", |c| {
        let op = |n| c.admin_state(n).map(|(op, _)| op);
        op(backup).is_some() && op(backup) == op(primary)
    })?;
    assert_eq!(
        cluster.admin_state(backup),
        cluster.admin_state(primary),
        "the transferred admin state plus what followed is the primary's"
    );
    cluster.check_logs()
}

// --- DESIGN.md §4: durable before revealed -------------------------------------------------------

/// VR Revisited §4.1 step 4 with DESIGN.md §4 ("a replica writes the prepare to its log — and,
/// for `persisted`, syncs the journal — before PrepareOk"; "send only after persist"): both
/// backups receive a prepare and lose power before their I/O round; the primary then dies.
/// A PrepareOk sent ahead of the sync would have let the primary acknowledge a write that no
/// surviving log holds, and the backups' view change would reissue its op. (A backup
/// acknowledges only its durable head, so `canary-send-before-persist`, which releases PrepareOk
/// whatever it reveals, does not reach this; the next scenario catches it.)
#[test]
fn backups_losing_power_before_their_sync_never_acknowledged_the_write() -> Result<(), Violation> {
    let mut cluster = cluster(19, Mode::Persisted, 1);
    let (primary, backups) = (primary_of(0), [primary_of(1), primary_of(2)]);
    cluster.run_ticks(100)?;
    wait(&mut cluster, 50, "a prepare on its way to the backups", |c| {
        let head = replica(c, primary).op();
        backups.iter().all(|&b| replica(c, b).op() < head)
    })?;
    cluster.step_losing_power_before_io(&backups)?;
    // Whatever the backups sent reaches the primary; its replies reach the client.
    cluster.run_ticks(5)?;
    cluster.crash(primary, false);
    for node in backups {
        cluster.restart(node)?;
    }
    wait(&mut cluster, 3_000, "the backups start a view", |c| c.primary(GROUP).is_some())?;
    let coverage = cluster.coverage();
    assert!(coverage.recovery_view_changes > 0, "{coverage:?}");
    assert_eq!(coverage.power_losses, 2);
    finish(&mut cluster)
}

/// DESIGN.md §4 ("view and log_view are durable before any message that reveals them is
/// sent") and VR Revisited §4.2 (a backup that installs StartView is normal in the new view and
/// acknowledges its log there): the old primary dies holding an op the new primary fetches from
/// the one backup left; that backup installs the StartView and loses power before its I/O
/// round. Its PrepareOk of view 1 reveals a log view it never made durable, so it must never
/// leave: the new primary, alone, commits nothing until the backup has restarted and installed
/// the view again.
#[test]
fn a_backup_acknowledges_a_new_view_only_once_it_is_durable() -> Result<(), Violation> {
    let mut cluster = cluster(21, Mode::Persisted, 1);
    let (old, new, backup) = (primary_of(0), primary_of(1), primary_of(2));
    cluster.run_ticks(100)?;
    // The new primary misses an op the backup holds; the old primary dies before anyone else
    // learns the op committed, so view 1 must re-propose it and needs the backup's PrepareOk.
    cluster.set_link(old, new, false);
    wait(&mut cluster, 200, "an op the new primary lacks, committed on the old one alone", |c| {
        let committed = replica(c, old).commit();
        committed > replica(c, new).op() && committed > replica(c, backup).commit()
    })?;
    let reproposed = replica(&cluster, old).commit();
    cluster.crash(old, false);
    // Its StartView leaves once its log view is durable, and arrives in the next step.
    wait(&mut cluster, 2_000, "the new primary sends its StartView", |c| {
        c.primary(GROUP) == Some(new) && replica(c, new).durable_views() == (1, 1)
    })?;
    let commit = replica(&cluster, new).commit();
    assert!(commit < reproposed, "view 1 started with op {reproposed} already committed");
    // The StartView arrives at the backup in this step; it loses power before persisting it.
    cluster.step_losing_power_before_io(&[backup])?;
    let mut committed_alone = None;
    cluster.run_until(30, |c| {
        let r = replica(c, new);
        if r.commit() > commit && committed_alone.is_none() {
            committed_alone = Some((c.tick(), r.commit()));
        }
        false
    })?;
    assert_eq!(
        committed_alone, None,
        "(tick, commit) of a primary counting a PrepareOk of a view its sender never persisted"
    );
    cluster.restart(backup)?;
    wait(&mut cluster, 500, "the backup rejoins view 1 and the op commits", |c| {
        let r = replica(c, backup);
        r.counters().start_views_installed > 0 && replica(c, new).commit() >= reproposed
    })?;
    assert!(replica(&cluster, new).counters().views_started > 0);
    finish(&mut cluster)
}

// --- DESIGN.md §4: faulty ops --------------------------------------------------------------------

/// DESIGN.md §4 ("an op that is faulty on its disk is never nacked") and VR Revisited §4.3
/// (a recovering replica's log may lack what it acknowledged): in a `replicated` group the old
/// primary commits an op on one backup's acknowledgement and loses power, losing the op with
/// its unsynced suffix; the backup that holds it starts view 1 but nobody hears its StartView;
/// the other backup, which never had the op, restarts after a process crash. Both restarted
/// replicas lack the op inside their faulty suffixes: they may not nack it, so their own view
/// change stalls until the replica that holds it answers, and the acknowledged write survives.
/// Never are two replicas down at once.
#[test]
fn faulty_suffixes_never_nack_an_acknowledged_op() -> Result<(), Violation> {
    let mut cluster = cluster(25, Mode::Replicated, 1);
    let (old, keeper, other) = (primary_of(0), primary_of(1), primary_of(2));
    cluster.run_ticks(100)?;
    // The other backup hears neither the primary nor, when it tries to repair, the keeper.
    cluster.set_link(old, other, false);
    cluster.set_link(keeper, other, false);
    wait(&mut cluster, 200, "an op committed on the keeper's acknowledgement alone", |c| {
        let committed = replica(c, old).commit();
        committed > replica(c, other).op() && committed > replica(c, keeper).commit()
    })?;
    let acked = replica(&cluster, old).commit();
    let checksum = replica(&cluster, old).header(acked).expect("committed").checksum_header;
    cluster.crash(old, true);
    wait(&mut cluster, 10, "the client hears that the op committed", |c| {
        c.acknowledged_ops(GROUP).contains(&acked)
    })?;
    // The old primary restarts at once, lacking the op; the keeper answers it nothing.
    cluster.set_link(old, other, true);
    cluster.set_link(keeper, old, false);
    cluster.restart(old)?;
    // The keeper starts view 1 from the other backup's DoViewChange; the other backup crashes
    // before its StartView could arrive, and the keeper still answers it nothing.
    wait(&mut cluster, 600, "the keeper starts view 1", |c| {
        let r = replica(c, keeper);
        r.is_primary() && r.view() == 1
    })?;
    cluster.crash(other, false);
    cluster.restart(other)?;
    for node in [old, other] {
        let r = replica(&cluster, node);
        assert!(r.op() < acked, "node {node} restarted holding op {acked}");
        assert!(r.faulty_from().is_some_and(|from| from <= acked), "node {node}: no faulty op");
    }
    // Unanswered, the restarted replicas start view 2 between them and must wait.
    wait(&mut cluster, 1_000, "the restarted replicas' merge stalls", |c| {
        replica(c, other).counters().merges_stalled > 0
    })?;
    cluster.heal();
    wait(&mut cluster, 1_000, "view 2 starts with the keeper's log", |c| {
        c.primary(GROUP) == Some(other)
    })?;
    let kept = replica(&cluster, other).header(acked).map(|h| h.checksum_header);
    assert_eq!(kept, Some(checksum), "view 2 dropped acknowledged op {acked}");
    finish(&mut cluster)
}

// --- DESIGN.md §4: no joining on receipt ---------------------------------------------------------

/// DESIGN.md §4 ("receiving another replica's StartViewChange does not make a replica join ...
/// so a backup cut off one way cannot depose a healthy primary"), against VR Revisited §4.2
/// where it would: the link primary → backup is cut, the backup votes on its own timeout again
/// and again, the other backup never joins, the primary stays in view 0 and keeps committing.
///
/// `canary-join-on-receipt` passes this test, and every other: it only drops the own-vote
/// requirement from `check_votes`, which runs only in view-change status for the replica's own
/// view, where its own vote is always recorded, so it changes no behaviour. A replica that really
/// joined on receipt (starting a view change from `on_start_view_change` while normal) fails it.
#[test]
fn a_one_way_partitioned_backup_cannot_depose_a_healthy_primary() -> Result<(), Violation> {
    let mut cluster = cluster(20, Mode::Persisted, 2);
    let (primary, deaf, other) = (primary_of(0), primary_of(1), primary_of(2));
    cluster.run_ticks(100)?;
    cluster.set_link(primary, deaf, false);
    let acknowledged = cluster.acknowledged();
    let mut deposed = None;
    cluster.run_until(1_000, |c| {
        let (p, o) = (replica(c, primary), replica(c, other));
        if deposed.is_none() && (!p.is_primary() || p.view() != 0 || o.counters().votes_cast > 0) {
            deposed = Some((c.tick(), p.status(), p.view(), o.counters()));
        }
        false
    })?;
    assert_eq!(deposed, None, "the healthy primary was challenged");
    let votes = replica(&cluster, deaf).counters().votes_cast;
    assert!(votes > 1, "the deaf backup voted {votes} times");
    assert!(cluster.acknowledged() >= acknowledged + 20, "writes stopped committing");
    finish(&mut cluster)
}

// --- DESIGN.md §4: exactly-once produce ----------------------------------------------------------

/// DESIGN.md §4 "a duplicate gets its original offsets back" with VR Revisited §4.2: a request
/// the old primary committed, whose reply the client never got (the primary's link to the
/// client is cut), is resent after the client's timeout and reaches the new primary after the
/// old one died. Every replica applied the committed batch to its producer table, so the new
/// primary answers with the original op and offset instead of appending it again; the final
/// log check then finds every (client, request) once.
#[test]
fn a_retry_of_a_committed_request_across_a_primary_change_is_applied_once() -> Result<(), Violation>
{
    let mut cluster = cluster(21, Mode::Persisted, 1);
    let (old, new) = (primary_of(0), primary_of(1));
    // The one client is endpoint 3 (after the three nodes).
    let client = 3;
    cluster.run_ticks(100)?;
    let acknowledged_before = cluster.acknowledged();
    assert!(acknowledged_before > 0, "the client made progress");
    cluster.set_link(old, client, false);
    wait(&mut cluster, 200, "an op committed whose reply the client lost", |c| {
        let acked = c.acknowledged_ops(GROUP).into_iter().max().unwrap_or(0);
        replica(c, old).commit() > acked && replica(c, new).commit() > acked
    })?;
    let lost = replica(&cluster, old).commit();
    cluster.crash(old, false);
    wait(&mut cluster, 2_000, "the new primary leads view 1", |c| c.primary(GROUP) == Some(new))?;
    wait(&mut cluster, 500, "the retry is answered with the original op", |c| {
        c.acknowledged_ops(GROUP).contains(&lost)
    })?;
    let duplicates = replica(&cluster, new).counters().duplicates;
    assert!(duplicates > 0, "the new primary answered no duplicate");
    cluster.heal();
    cluster.restart(old)?;
    finish(&mut cluster)
}
