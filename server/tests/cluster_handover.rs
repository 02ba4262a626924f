//! Primaries moving on purpose, on three real `shoal` processes (DESIGN.md §8, "Primaries"):
//! a node stopped with SIGTERM hands the groups it leads to peers in sync before it exits
//! (controlled shutdown), a node that comes back gets the groups it is home to back once it has
//! been in sync for `primary_return_ms`, and a rolling restart of all three loses nothing.
//!
//! The heartbeat timeout is ten minutes here, so a backup never takes a group on its own within
//! a test's deadline: every move these tests see is a hand-over, and a missing one stalls a
//! write past the deadline and fails the test.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::cluster::*;
use common::{DEADLINE, metrics_page};
use shoal_proto::Durability;
use shoal_testkit::{ShoalCluster, node_log};

/// Hand-overs only: no primary is replaced by a timeout within a test; groups go home after
/// half a second in sync.
const TIMERS: &str = "[replication]\nheartbeat_timeout_ms = 600000\nprimary_return_ms = 500\n";

/// A cluster of hand-overs only with topic `p` written to, every primary at its home; its
/// groups.
fn settled_cluster(dir: &Path) -> (ShoalCluster, Ledger, BTreeSet<u64>) {
    let config = dir.join("timers.toml");
    std::fs::write(&config, TIMERS).unwrap();
    let cluster = cluster_with_args(dir, &["--config", config.to_str().unwrap()]);
    create_stream_and_topic(&cluster);
    let mut ledger = Ledger::default();
    ledger.produce(&cluster, "p", 6);
    let groups = all_groups(&cluster, 0);
    wait_primaries_home(&cluster, &groups);
    (cluster, ledger, groups)
}

/// The ids of the groups node `node` leads (`None`: no metrics page).
fn groups_led_by(cluster: &ShoalCluster, node: usize) -> Option<BTreeSet<u64>> {
    Some(led_by(cluster, node)?.into_iter().map(|led| led.group).collect())
}

/// Waits (bounded) until each of `groups` is led, and every node leads only groups it is home to
/// (group mod 3): every primary is back where placement put it.
fn wait_primaries_home(cluster: &ShoalCluster, groups: &BTreeSet<u64>) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let led: Vec<Option<BTreeSet<u64>>> =
            (0..3).map(|node| groups_led_by(cluster, node)).collect();
        let all_home = led.iter().enumerate().all(|(node, led)| {
            led.as_ref().is_some_and(|led| led.iter().all(|g| g % 3 == node as u64))
        });
        let every_one_led = groups.iter().all(|g| led.iter().flatten().any(|l| l.contains(g)));
        if all_home && every_one_led {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the primaries never went home: led {led:?}\n{}",
            cluster.log_tails(40)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every group of the cluster (the metadata group, 0, and the partitions'), as node `node` sees
/// them.
fn all_groups(cluster: &ShoalCluster, node: usize) -> BTreeSet<u64> {
    let groups = groups_on(cluster, node).expect("the node's metrics page");
    groups.into_iter().map(|(led, _)| led.group).collect()
}

/// SIGTERM on `node`: it must exit cleanly having handed everything over (its log says so).
fn stop_handing_over(cluster: &mut ShoalCluster, dir: &Path, node: usize) {
    let before = std::fs::read_to_string(node_log(dir, node as u8)).unwrap_or_default().len();
    let asked = Instant::now();
    let status = cluster.nodes[node].terminate().expect("a controlled shutdown ends");
    assert!(status.success(), "node {node} exited with {status}");
    eprintln!("node {node} handed over and exited in {:?}", asked.elapsed());
    let log = std::fs::read_to_string(node_log(dir, node as u8)).unwrap();
    let this_run = &log[before..];
    assert!(
        this_run.contains("hand-off complete"),
        "node {node} stopped without handing everything over:\n{this_run}"
    );
}

/// Writes `count` records and says how long the slowest took.
fn produce_timed(ledger: &mut Ledger, cluster: &ShoalCluster, count: u32) -> Duration {
    let mut slowest = Duration::ZERO;
    for _ in 0..count {
        let started = Instant::now();
        ledger.produce(cluster, "p", 1);
        slowest = slowest.max(started.elapsed());
    }
    slowest
}

fn sum_counter(cluster: &ShoalCluster, nodes: &[usize], name: &str) -> u64 {
    nodes
        .iter()
        .filter_map(|&node| metrics_page(cluster.nodes[node].metrics()?))
        .map(|page| counter(&page, name))
        .sum()
}

#[test]
fn sigterm_hands_the_primaries_over_and_they_come_back_home() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cluster, mut ledger, groups) = settled_cluster(dir.path());
    let node_0_home: BTreeSet<u64> = groups.iter().copied().filter(|g| g % 3 == 0).collect();
    assert!(node_0_home.contains(&0), "node 0 is the metadata group's home");

    stop_handing_over(&mut cluster, dir.path(), 0);
    // Writes to every partition and an admin request (the metadata group moved too) go through
    // at once: nobody waits ten minutes for a heartbeat timeout.
    let slowest = produce_timed(&mut ledger, &cluster, 6);
    eprintln!("slowest write after the hand-over: {slowest:?}");
    create_topic(&cluster, "after", Durability::Persisted);
    let led_elsewhere: BTreeSet<u64> =
        [1, 2].iter().flat_map(|&node| groups_led_by(&cluster, node).unwrap()).collect();
    assert!(node_0_home.is_subset(&led_elsewhere), "{node_0_home:?} not in {led_elsewhere:?}");

    let groups = all_groups(&cluster, 1);
    restart(&mut cluster, 0);
    wait_primaries_home(&cluster, &groups);
    let returned = sum_counter(&cluster, &[1, 2], "shoal_primaries_returned_total");
    assert!(returned >= node_0_home.len() as u64, "{returned} hand-overs home");
    ledger.produce(&cluster, "p", 6);
    ledger.produce(&cluster, "after", 3);
    converge(&cluster);
    ledger.check(&cluster);
    check_logs_agree(&mut cluster);
}

#[test]
fn a_rolling_restart_stalls_nothing_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cluster, mut ledger, groups) = settled_cluster(dir.path());
    let mut slowest = Duration::ZERO;
    for node in [2, 1, 0] {
        stop_handing_over(&mut cluster, dir.path(), node);
        slowest = slowest.max(produce_timed(&mut ledger, &cluster, 6));
        restart(&mut cluster, node);
        slowest = slowest.max(produce_timed(&mut ledger, &cluster, 3));
        // A `replicated` group survives one node down at a time: the next node stops only once
        // this one is caught up and leads its groups again, as an operator's rolling restart
        // waits for in-sync replicas.
        converge(&cluster);
        wait_primaries_home(&cluster, &groups);
    }
    eprintln!("slowest write during the rolling restart: {slowest:?}");
    converge(&cluster);
    ledger.check(&cluster);
    check_logs_agree(&mut cluster);
}
