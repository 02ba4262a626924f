//! Issue 26, adding, removing and replacing nodes on real processes (`docs/cluster.md`, "Adding
//! and removing nodes"): a three-node cluster grows to four under load — the new node joins the
//! metadata group as a learner and a third of the partitions move onto it — then node 0 is
//! removed: every partition it held moves away (through `kill -9` of the node receiving them
//! and of the metadata primary), its metadata seat goes to node 3, and once it is killed the
//! cluster goes on (writes, a new topic). A node whose disk is gone is replaced by a
//! new node with a new index. With the balancer on, a node added to a cluster gets its share of
//! the replicas by itself. No acknowledged write is lost, and each partition's longest write
//! stall is reported.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::DEADLINE;
use common::cluster::*;
use serde_json::Value;
use shoal_proto::Durability;
use shoal_proto::protocol::{
    AddNode, CreateTopic, ErrorCode, MoveAction, MovePartition, Operation, RemoveNode,
};
use shoal_testkit::ShoalCluster;

const TOPIC: &str = "grow";

/// Each partition of the topic as node `node` reports it: (replicas, moving to), by partition.
fn placements(cluster: &ShoalCluster, node: usize) -> Option<BTreeMap<u64, (u32, u32)>> {
    let status = status(cluster, node)?;
    let bits = |entry: &Value, key: &str| -> u32 {
        entry[key]
            .as_array()
            .map_or(0, |a| a.iter().filter_map(Value::as_u64).map(|n| 1 << n).sum())
    };
    let all = status["partitions"].as_array()?.iter().filter(|p| p["topic"] == TOPIC);
    let found: BTreeMap<u64, (u32, u32)> = all
        .filter_map(|p| {
            Some((p["partition"].as_u64()?, (bits(p, "replicas"), bits(p, "moving_to"))))
        })
        .collect();
    (found.len() == PARTITIONS as usize).then_some(found)
}

/// The metadata group's voters and learners as node `node`'s replica knows them.
fn metadata_members(cluster: &ShoalCluster, node: usize) -> Option<(u32, u32, String)> {
    let status = status(cluster, node)?;
    let report = status["shard_reports"]
        .as_array()?
        .iter()
        .flat_map(|shard| shard["replication"].as_array().cloned().unwrap_or_default())
        .find(|report| report["group"] == 0)?;
    let bits = |key: &str| -> u32 {
        report[key]
            .as_array()
            .map_or(0, |a| a.iter().filter_map(Value::as_u64).map(|n| 1 << n).sum())
    };
    Some((bits("voters"), bits("learners"), report["status"].as_str()?.to_string()))
}

/// Whether every node of `nodes` reports every partition settled (no move) and none on a node
/// of `absent`.
fn settled_without(cluster: &ShoalCluster, nodes: &[usize], absent: u32) -> bool {
    nodes.iter().all(|&node| {
        placements(cluster, node).is_some_and(|all| {
            all.values().all(|&(replicas, to)| to == 0 && replicas & absent == 0)
        })
    })
}

/// Writes in turn to every partition, one write at a time, until `done`; returns each
/// partition's longest write (its worst stall) seen meanwhile.
fn produce_until(
    cluster: &ShoalCluster,
    ledger: &mut Ledger,
    what: &str,
    stalls: &mut [Duration],
    done: impl Fn() -> bool,
) {
    let deadline = Instant::now() + DEADLINE;
    let mut partition = 0;
    while !done() {
        assert!(Instant::now() < deadline, "{what} never happened\n{}", cluster.log_tails(40));
        let started = Instant::now();
        ledger.produce_to(cluster, TOPIC, partition, 1);
        let stall = &mut stalls[partition as usize];
        *stall = (*stall).max(started.elapsed());
        partition = (partition + 1) % PARTITIONS;
    }
}

/// Three nodes with the topic (three replicas per partition) and 30 writes in it.
fn cluster_with_grow_topic(dir: &std::path::Path) -> (ShoalCluster, Ledger) {
    let cluster = cluster(dir);
    create_grow_topic(&cluster);
    let mut ledger = Ledger::default();
    ledger.produce(&cluster, TOPIC, 30);
    (cluster, ledger)
}

fn create_grow_topic(cluster: &ShoalCluster) {
    let stream = shoal_proto::protocol::encode_stream_name(STREAM);
    assert_eq!(call_anywhere(cluster, 0, Operation::CreateStream, &stream).unwrap().0, 0);
    let create = CreateTopic { durability: Some(Durability::Persisted), ..topic_of(TOPIC) };
    create_topic_as(cluster, create);
}

/// Adds the node `cluster.reserve_node` reserved, through the metadata group; checks the index
/// it was given, then starts it.
fn add_node(cluster: &mut ShoalCluster) -> usize {
    let node = cluster.reserve_node().unwrap_or_else(|error| panic!("{error}"));
    let index = usize::from(node);
    let request = AddNode {
        node: None,
        bus: cluster.buses[index].clone(),
        client: cluster.clients[index].clone(),
        kafka: cluster.kafkas[index].clone(),
        rack: String::new(),
    };
    let (code, body) = call_anywhere(cluster, 0, Operation::AddNode, &request.encode())
        .expect("AddNode is answered");
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&body));
    assert_eq!(body, [node], "the lowest free index");
    cluster.start_added(node).unwrap_or_else(|error| panic!("{error}"));
    index
}

fn remove_node(cluster: &ShoalCluster, node: u8, replacement: Option<u8>) {
    let request = RemoveNode { node, replacement };
    let (code, body) = call_anywhere(cluster, 1, Operation::RemoveNode, &request.encode())
        .expect("RemoveNode is answered");
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&body));
}

#[test]
fn a_cluster_grows_to_four_nodes_and_loses_node_0_without_losing_a_write() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cluster, mut ledger) = cluster_with_grow_topic(dir.path());
    let mut stalls = vec![Duration::ZERO; PARTITIONS as usize];

    // Bad requests get a clear refusal and change nothing.
    let refused = |operation, body: Vec<u8>, code: ErrorCode, says: &str| {
        let (got, text) = call_anywhere(&cluster, 0, operation, &body).expect("answered");
        let text = String::from_utf8_lossy(&text).to_string();
        assert_eq!(got, code as u32, "{text}");
        assert!(text.contains(says), "{text}");
    };
    let bad = |bus: &str, client: &str, node| {
        let request =
            AddNode { node, bus: bus.into(), client: client.into(), ..AddNode::default() };
        request.encode()
    };
    let founder_bus = cluster.buses[1].clone();
    refused(
        Operation::AddNode,
        bad("nowhere", "127.0.0.1:1", None),
        ErrorCode::InvalidRequest,
        "IP:PORT",
    );
    refused(
        Operation::AddNode,
        bad(&founder_bus, "127.0.0.1:1", None),
        ErrorCode::InvalidArgument,
        "founding node 1",
    );
    refused(
        Operation::AddNode,
        bad("127.0.0.1:2", "127.0.0.1:1", Some(1)),
        ErrorCode::InvalidArgument,
        "founding",
    );
    let unknown = RemoveNode { node: 7, replacement: None }.encode();
    refused(Operation::RemoveNode, unknown, ErrorCode::InvalidArgument, "not an active node");
    // Three replicas on three nodes: removing one leaves them nowhere to go.
    let too_few = RemoveNode { node: 2, replacement: None }.encode();
    refused(Operation::RemoveNode, too_few, ErrorCode::InvalidArgument, "no other active node");

    let new = add_node(&mut cluster);
    assert_eq!(new, 3);
    // The new node joins the metadata group as a learner and learns the catalog from it.
    wait_until(&cluster, "node 3 learns the catalog", || {
        metadata_members(&cluster, 3).is_some_and(|(voters, learners, status)| {
            (voters, learners) == (0b0111, 0b1000) && status == "normal"
        }) && placements(&cluster, 3).is_some()
    });
    // A third of the partitions moves onto it, under load: partition 0 from node 0 to node 3.
    let all = placements(&cluster, 1).expect("node 1 knows the topic");
    assert!(all.values().all(|&(replicas, _)| replicas == 0b0111), "{all:?}");
    start_move(&cluster, 0, 0b1110);
    produce_until(&cluster, &mut ledger, "partition 0's move", &mut stalls, || {
        (0..4).all(|node| {
            placements(&cluster, node).is_some_and(|all| all[&0] == (0b1110, 0) && all[&1].1 == 0)
        })
    });

    // Node 0 leaves: its partitions move to the least loaded node (3), its metadata seat too.
    // Mid-removal, `kill -9` of the node receiving the replicas (an added node: it restarts
    // from its own directory) and then of the metadata group's primary: the moves resume.
    remove_node(&cluster, 0, None);
    cluster.nodes[3].kill_9();
    ledger.produce(&cluster, TOPIC, 6);
    restart(&mut cluster, 3);
    let metadata_primary = metadata_primary(&cluster);
    cluster.nodes[metadata_primary].kill_9();
    ledger.produce(&cluster, TOPIC, 6);
    restart(&mut cluster, metadata_primary);
    produce_until(&cluster, &mut ledger, "node 0's partitions move away", &mut stalls, || {
        settled_without(&cluster, &[1, 2, 3], 0b0001)
    });
    wait_until(&cluster, "node 0 leaves the metadata group", || {
        (1..4).all(|node| {
            metadata_members(&cluster, node)
                .is_some_and(|(voters, learners, _)| voters == 0b1110 && learners == 0)
        })
    });
    let nodes = status(&cluster, 3).expect("node 3 answers")["cluster_nodes"].clone();
    let leaving: Vec<u64> = nodes
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["leaving"] == true)
        .filter_map(|n| n["node"].as_u64())
        .collect();
    assert_eq!(leaving, [0], "{nodes}");

    // Node 0 holds nothing now: the cluster goes on without it.
    cluster.nodes[0].kill_9();
    ledger.produce(&cluster, TOPIC, 30);
    create_topic_as(&cluster, topic_of("after"));
    ledger.check_with_control_records(&cluster);
    eprintln!("longest write stall per partition while nodes came and went: {stalls:?}");
}

#[test]
fn a_node_whose_disk_is_gone_is_replaced_by_a_new_node() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cluster, mut ledger) = cluster_with_grow_topic(dir.path());
    let mut stalls = vec![Duration::ZERO; PARTITIONS as usize];

    // Node 1's machine is lost with its disk.
    cluster.nodes[1].kill_9();
    std::fs::remove_dir_all(cluster.data_dir(1)).unwrap();
    ledger.produce(&cluster, TOPIC, 15);

    let new = add_node(&mut cluster);
    remove_node(&cluster, 1, Some(new as u8));
    produce_until(&cluster, &mut ledger, "node 3 takes node 1's place", &mut stalls, || {
        settled_without(&cluster, &[0, 2, 3], 0b0010)
            && placements(&cluster, 3)
                .is_some_and(|all| all.values().all(|&(replicas, _)| replicas == 0b1101))
    });
    wait_until(&cluster, "node 3 takes node 1's metadata seat", || {
        [0, 2, 3].iter().all(|&node| {
            metadata_members(&cluster, node)
                .is_some_and(|(voters, learners, _)| voters == 0b1101 && learners == 0)
        })
    });
    ledger.produce(&cluster, TOPIC, 15);
    ledger.check_with_control_records(&cluster);
    eprintln!("longest write stall per partition during the replacement: {stalls:?}");
}

/// The balancer (`[cluster] balancer_interval_ms`) on every node: a fourth node added to three
/// holding three partitions of three replicas (3, 3, 3, 0 replicas) gets its share, one move
/// at a time, until every node holds within one replica of every other (2, 2, 3, 2), while
/// writes go on.
#[test]
fn the_balancer_gives_an_added_node_its_share_of_the_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("balancer.toml");
    std::fs::write(&config, "[cluster]\nbalancer_interval_ms = 100\n").unwrap();
    let config = config.to_str().unwrap().to_string();
    let mut cluster = cluster_with_args(dir.path(), &["--config", &config]);
    create_grow_topic(&cluster);
    let mut ledger = Ledger::default();
    ledger.produce(&cluster, TOPIC, 30);
    let all = placements(&cluster, 0).expect("node 0 knows the topic");
    assert!(all.values().all(|&(replicas, to)| (replicas, to) == (0b0111, 0)), "{all:?}");

    add_node(&mut cluster);
    let mut stalls = vec![Duration::ZERO; PARTITIONS as usize];
    let balanced = || {
        (0..4).all(|node| {
            placements(&cluster, node).is_some_and(|all| {
                let mut load = [0u32; 4];
                for &(replicas, to) in all.values() {
                    if to != 0 {
                        return false;
                    }
                    (0..4).filter(|n| replicas & (1 << n) != 0).for_each(|n| load[n] += 1);
                }
                load[3] == 2 && load.iter().max().unwrap() - load.iter().min().unwrap() <= 1
            })
        })
    };
    produce_until(&cluster, &mut ledger, "the balancer evens the replicas", &mut stalls, balanced);
    let started = shard_sum(&cluster, 4, "balancer_moves");
    assert!(started >= 2, "the balancer started the moves: {started}");
    // Then the primaries: each partition led where the catalog prefers, every node agreeing,
    // and no node leading two while another leads none.
    let even = || primaries_even(&cluster, 4);
    produce_until(&cluster, &mut ledger, "the primaries are even", &mut stalls, even);
    let changes = shard_sum(&cluster, 4, "balancer_primaries");
    eprintln!("preferred-primary changes: {changes}; led {:?}", led_as_preferred(&cluster, 4));
    ledger.produce(&cluster, TOPIC, 15);
    ledger.check_with_control_records(&cluster);
    eprintln!("longest write stall per partition while the balancer moved replicas: {stalls:?}");
}

/// Three nodes, a topic of two replicas per partition (homes one per node), the balancer on.
/// The operator moves partition 1 so that one node is the home of two partitions and another
/// of none (the replica balancer, evening the counts that move upset, leaves it so). The leader
/// balancer prefers another voter for one of them, and its primary hands the group over: each
/// node leads one partition, every node agreeing, and no acknowledged write is lost.
#[test]
fn the_leader_balancer_evens_the_primaries_a_move_left_uneven() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("balancer.toml");
    std::fs::write(&config, "[cluster]\nbalancer_interval_ms = 100\n").unwrap();
    let config = config.to_str().unwrap().to_string();
    let cluster = cluster_with_args(dir.path(), &["--config", &config]);
    let stream = shoal_proto::protocol::encode_stream_name(STREAM);
    assert_eq!(call_anywhere(&cluster, 0, Operation::CreateStream, &stream).unwrap().0, 0);
    let create = CreateTopic {
        durability: Some(Durability::Persisted),
        replication_factor: Some(2),
        ..topic_of(TOPIC)
    };
    create_topic_as(&cluster, create);
    let mut ledger = Ledger::default();
    ledger.produce(&cluster, TOPIC, 30);
    let mut stalls = vec![Duration::ZERO; PARTITIONS as usize];
    let even = || primaries_even(&cluster, 3);
    produce_until(&cluster, &mut ledger, "the first primaries are even", &mut stalls, even);

    start_move(&cluster, 1, 0b110);
    let settled = || {
        shard_sum(&cluster, 3, "balancer_primaries") > 0
            && placements(&cluster, 0).is_some_and(|all| all.values().all(|&(_, to)| to == 0))
            && primaries_even(&cluster, 3)
    };
    produce_until(
        &cluster,
        &mut ledger,
        "the leader balancer evens the primaries",
        &mut stalls,
        settled,
    );
    eprintln!("led {:?}; stalls {stalls:?}", led_as_preferred(&cluster, 3));
    ledger.produce(&cluster, TOPIC, 15);
    ledger.check_with_control_records(&cluster);
}

/// Starts a move of the topic's partition `partition` to `voters` (a bit per node); checks it
/// was taken.
fn start_move(cluster: &ShoalCluster, partition: u32, voters: u32) {
    let action = MoveAction::Start { voters };
    let request = MovePartition { stream: STREAM.into(), topic: TOPIC.into(), partition, action };
    let (code, body) = call_anywhere(cluster, 0, Operation::MovePartition, &request.encode())
        .expect("a move is answered");
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&body));
}

/// A per-shard figure summed over the shards of the first `nodes` nodes.
fn shard_sum(cluster: &ShoalCluster, nodes: usize, key: &str) -> u64 {
    (0..nodes)
        .filter_map(|node| status(cluster, node))
        .flat_map(|status| status["shard_reports"].as_array().cloned().unwrap_or_default())
        .filter_map(|shard| shard[key].as_u64())
        .sum()
}

/// Whether each partition of the topic is led by its preferred primary, as every node holding it
/// reports, and the `nodes` nodes lead within one partition of each other.
fn primaries_even(cluster: &ShoalCluster, nodes: usize) -> bool {
    led_as_preferred(cluster, nodes).is_some_and(|led| {
        led.iter().sum::<u32>() == PARTITIONS
            && led.iter().max().unwrap() - led.iter().min().unwrap() <= 1
    })
}

/// Per node, the partitions of the topic it leads, when every node holding a partition reports
/// it led by its preferred primary (its home, or the voter the leader balancer chose).
fn led_as_preferred(cluster: &ShoalCluster, nodes: usize) -> Option<Vec<u32>> {
    let mut led = vec![0u32; nodes];
    for (node, count) in led.iter_mut().enumerate() {
        let status = status(cluster, node)?;
        let held = status["partitions"].as_array()?.iter().filter(|p| p["topic"] == TOPIC);
        for partition in held.filter(|p| p["held"] == true) {
            let primary = partition["primary"].as_u64()?;
            if primary != partition["preferred_primary"].as_u64()? {
                return None;
            }
            *count += u32::from(primary == node as u64);
        }
    }
    Some(led)
}
