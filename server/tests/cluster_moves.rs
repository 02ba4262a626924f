//! Issue 26, partition moves on real processes (DESIGN.md §8): a partition of one replica moves
//! to another node while a producer writes to it — the new node joins as a learner, the
//! voters switch once it is in sync, the old node is dropped — and no acknowledged write is
//! lost, before or after `kill -9` of the node it moved to; a move whose new node is down waits
//! for it (writes go on at the old node) and a cancel takes the partition back. Under
//! `canary-promote-unsynced` the mover switches without waiting and the second test fails.

mod common;

use std::time::{Duration, Instant};

use common::DEADLINE;
use common::cluster::*;
use serde_json::Value;
use shoal_proto::Durability;
use shoal_proto::protocol::{CreateTopic, MoveAction, MovePartition, Operation};
use shoal_testkit::ShoalCluster;

const TOPIC: &str = "moving";

/// Partition `partition` of the moving topic as node `node` reports it: (replicas, moving to).
fn placement(cluster: &ShoalCluster, node: usize, partition: u32) -> Option<(Vec<u64>, Vec<u64>)> {
    let status = status(cluster, node)?;
    let entry = status["partitions"]
        .as_array()?
        .iter()
        .find(|p| p["topic"] == TOPIC && p["partition"] == partition)?
        .clone();
    let nodes = |key: &str| -> Vec<u64> {
        entry[key].as_array().map_or(Vec::new(), |a| a.iter().filter_map(Value::as_u64).collect())
    };
    Some((nodes("replicas"), nodes("moving_to")))
}

/// A per-shard figure of node `node`'s status summed over its shards.
fn shard_sum(cluster: &ShoalCluster, node: usize, key: &str) -> u64 {
    status(cluster, node).map_or(0, |status| {
        status["shard_reports"]
            .as_array()
            .map_or(0, |shards| shards.iter().filter_map(|s| s[key].as_u64()).sum())
    })
}

/// Node `node`'s report of `group`'s replica: (view, status).
fn replica_of(cluster: &ShoalCluster, node: usize, group: u64) -> Option<(u64, String)> {
    let status = status(cluster, node)?;
    let report = status["shard_reports"]
        .as_array()?
        .iter()
        .flat_map(|shard| shard["replication"].as_array().cloned().unwrap_or_default())
        .find(|report| report["group"] == group)?;
    Some((report["view"].as_u64()?, report["status"].as_str()?.to_string()))
}

/// The moving topic (persisted, one replica per partition) in stream `s`; returns partition 0's
/// holder and group.
fn create_moving_topic(cluster: &ShoalCluster) -> (usize, u64) {
    let stream = shoal_proto::protocol::encode_stream_name(STREAM);
    assert_eq!(call_anywhere(cluster, 0, Operation::CreateStream, &stream).unwrap().0, 0);
    create_topic_as(
        cluster,
        CreateTopic {
            durability: Some(Durability::Persisted),
            replication_factor: Some(1),
            ..topic_of(TOPIC)
        },
    );
    let (replicas, _) = wait_for_placement(cluster, 0);
    let holder = replicas[0] as usize;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let group = status(cluster, holder).and_then(|status| {
            let all = status["partitions"].as_array()?.clone();
            all.iter().find(|p| p["topic"] == TOPIC && p["partition"] == 0)?["group"].as_u64()
        });
        if let Some(group) = group {
            return (holder, group);
        }
        assert!(Instant::now() < deadline, "node {holder} never reported its partition");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Partition `partition`'s placement as the first node that knows the topic reports it.
fn wait_for_placement(cluster: &ShoalCluster, partition: u32) -> (Vec<u64>, Vec<u64>) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(found) = (0..3).find_map(|node| placement(cluster, node, partition)) {
            return found;
        }
        assert!(Instant::now() < deadline, "no node knows {TOPIC}/{partition}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asks the cluster to `action` partition 0's move; checks it was taken.
fn move_partition(cluster: &ShoalCluster, action: MoveAction) {
    let request =
        MovePartition { stream: STREAM.into(), topic: TOPIC.into(), partition: 0, action };
    let (code, body) = call_anywhere(cluster, 0, Operation::MovePartition, &request.encode())
        .expect("a move is answered");
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&body));
}

/// Whether every live node among `nodes` reports partition 0 on `replicas` with no move.
fn moved(cluster: &ShoalCluster, nodes: &[usize], replicas: &[u64]) -> bool {
    nodes.iter().all(|&node| {
        placement(cluster, node, 0).is_some_and(|(now, to)| now == replicas && to.is_empty())
    })
}

/// Writes to partition 0, one at a time, until every node reports it moved to node `to`;
/// returns how many writes that took.
fn produce_until_moved(cluster: &ShoalCluster, ledger: &mut Ledger, to: usize) -> u32 {
    let deadline = Instant::now() + DEADLINE;
    let mut writes = 0;
    while !moved(cluster, &[0, 1, 2], &[to as u64]) {
        assert!(Instant::now() < deadline, "the move never finished\n{}", cluster.log_tails(40));
        ledger.produce_to(cluster, TOPIC, 0, 1);
        writes += 1;
    }
    writes
}

#[test]
fn a_partition_moves_to_another_node_under_load_and_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = cluster(dir.path());
    let (from, group) = create_moving_topic(&cluster);
    let to = (from + 1) % 3;
    let mut ledger = Ledger::default();
    ledger.produce_to(&cluster, TOPIC, 0, 20);

    move_partition(&cluster, MoveAction::Start { voters: 1 << to });
    // Writes go on throughout the move; each is acknowledged or its outcome is unknown.
    let during = produce_until_moved(&cluster, &mut ledger, to);
    assert!(during > 0);
    ledger.produce_to(&cluster, TOPIC, 0, 10);
    ledger.check_with_control_records(&cluster);
    // The node the partition left keeps no say in it: its replica is removed (it learns so
    // from the new epoch's StartView, which answers its probe once the primary stops sending it
    // anything), and then deleted, files and all; the new one leads it.
    assert!(group_dir_exists(&cluster, from, group));
    wait_until(&cluster, "the old node deletes its replica", || {
        replica_of(&cluster, from, group).is_none() && !group_dir_exists(&cluster, from, group)
    });
    assert_eq!(shard_sum(&cluster, from, "groups_deleted"), 1);
    let led = replica_of(&cluster, to, group).expect("the new node holds it");
    assert_eq!(led.1, "normal");
    assert!(shard_sum(&cluster, from, "move_changes_proposed") >= 2, "add and switch");

    // The one replica is on the new node's disk now.
    cluster.nodes[to].kill_9();
    restart(&mut cluster, to);
    ledger.produce_to(&cluster, TOPIC, 0, 5);
    ledger.check_with_control_records(&cluster);

    // Back to the node that deleted it: the group id returns there, joined afresh from the
    // other replica (never from what that node's journal may still hold of the deleted one),
    // and after `kill -9` the node serves it from its own disk.
    move_partition(&cluster, MoveAction::Start { voters: 1 << from });
    let back = produce_until_moved(&cluster, &mut ledger, from);
    assert!(back > 0);
    wait_until(&cluster, "the other node deletes its replica", || {
        !group_dir_exists(&cluster, to, group)
    });
    cluster.nodes[from].kill_9();
    restart(&mut cluster, from);
    ledger.produce_to(&cluster, TOPIC, 0, 5);
    ledger.check_with_control_records(&cluster);
}

/// Whether node `node` has a directory for `group` on any of its shards.
fn group_dir_exists(cluster: &ShoalCluster, node: usize, group: u64) -> bool {
    let data = cluster.data_dir(node as u8);
    let shards = std::fs::read_dir(&data).map_or(Vec::new(), |dir| dir.flatten().collect());
    shards.iter().any(|shard| shard.path().join(format!("group-{group:020}")).exists())
}

#[test]
fn a_move_waits_for_its_learner_and_a_cancel_takes_the_partition_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = cluster(dir.path());
    let (from, group) = create_moving_topic(&cluster);
    let to = (from + 1) % 3;
    let mut ledger = Ledger::default();
    ledger.produce_to(&cluster, TOPIC, 0, 10);

    // The node it moves to is down: it can never catch up, so the switch must wait.
    cluster.nodes[to].kill_9();
    move_partition(&cluster, MoveAction::Start { voters: 1 << to });
    let epoch_1 = 1u64 << 20;
    wait_until(&cluster, "the learner is added", || {
        replica_of(&cluster, from, group).is_some_and(|(view, _)| view >= epoch_1)
    });
    // A switch to the next epoch would make the node that is down the only voter: it must not
    // happen (checked while waiting, so a mover that does not wait fails at once).
    wait_until(&cluster, "the mover waits for the learner", || {
        let view = replica_of(&cluster, from, group).map_or(0, |(view, _)| view);
        assert!(view < 2 * epoch_1, "switched to a learner that is down (view {view})");
        shard_sum(&cluster, from, "move_steps_waited") >= 3
    });
    // The old node still leads: writes go on there.
    ledger.produce_to(&cluster, TOPIC, 0, 10);
    let (replicas, moving_to) = placement(&cluster, from, 0).unwrap();
    assert_eq!((replicas, moving_to), (vec![from as u64], vec![to as u64]));

    move_partition(&cluster, MoveAction::Cancel);
    let others: Vec<usize> = (0..3).filter(|&node| node != to).collect();
    wait_until(&cluster, "the move is cancelled", || moved(&cluster, &others, &[from as u64]));
    restart(&mut cluster, to);
    wait_until(&cluster, "every node agrees", || moved(&cluster, &[0, 1, 2], &[from as u64]));
    ledger.produce_to(&cluster, TOPIC, 0, 5);
    ledger.check_with_control_records(&cluster);
    let (_, state) = replica_of(&cluster, from, group).unwrap();
    assert_eq!(state, "normal");
}

/// `kill -9` mid-move, of the node the partition moves to and of the metadata group's primary:
/// the move resumes once they are back (the catalog keeps it, the partition's primary carries
/// it on, its report reaches whichever node leads the metadata group then) and nothing
/// acknowledged is lost.
#[test]
fn a_move_resumes_after_kill_9_of_its_new_node_and_of_the_metadata_primary() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = cluster(dir.path());
    let (from, _) = create_moving_topic(&cluster);
    let to = (from + 1) % 3;
    let mut ledger = Ledger::default();
    // A backlog the new node takes a while to copy.
    ledger.produce_to(&cluster, TOPIC, 0, 200);

    move_partition(&cluster, MoveAction::Start { voters: 1 << to });
    cluster.nodes[to].kill_9();
    ledger.produce_to(&cluster, TOPIC, 0, 20);
    restart(&mut cluster, to);

    // The metadata primary, wherever it is, killed while the move may still be going on.
    let metadata_primary = metadata_primary(&cluster);
    cluster.nodes[metadata_primary].kill_9();
    if metadata_primary != from {
        ledger.produce_to(&cluster, TOPIC, 0, 20);
    }
    restart(&mut cluster, metadata_primary);

    produce_until_moved(&cluster, &mut ledger, to);
    ledger.produce_to(&cluster, TOPIC, 0, 10);
    ledger.check_with_control_records(&cluster);
}
