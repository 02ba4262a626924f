//! Issue 26, replication factor per topic on real processes: a topic's partitions live on as
//! many nodes as its replication factor says, spread over the cluster; a node holds (creates,
//! stores, reports) only the partitions it is a member of, and answers a request for any other
//! with `NotPrimary` naming a node that holds it; a partition of one replica comes back from its
//! own node's disk after `kill -9`, while the others serve on.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::Raw;
use common::cluster::*;
use serde_json::Value;
use shoal_proto::Durability;
use shoal_proto::protocol::{
    CreateTopic, ErrorCode, Fetch, FetchFrom, Operation, TopicDescription, encode_topic_name,
};
use shoal_testkit::ShoalCluster;

/// The status document of node `node`.
fn status(cluster: &ShoalCluster, node: usize) -> Value {
    let mut raw = Raw::connect(&cluster.clients[node], rand_client());
    let answer = raw.call(Operation::Status, &[]);
    serde_json::from_slice(answer.ok()).expect("status is JSON")
}

/// Per partition of `topic` as node `node` reports it: (replicas, held here, primary).
fn placement(cluster: &ShoalCluster, node: usize, topic: &str) -> Vec<(Vec<u64>, bool, Value)> {
    let status = status(cluster, node);
    let partitions = status["partitions"].as_array().expect("partitions");
    partitions
        .iter()
        .filter(|p| p["topic"] == topic)
        .map(|p| {
            let replicas = p["replicas"].as_array().expect("replicas");
            let replicas = replicas.iter().map(|n| n.as_u64().expect("a node")).collect();
            (replicas, p["held"].as_bool().expect("held"), p["primary"].clone())
        })
        .collect()
}

/// The partition groups of `topic` node `node` holds, from its metrics page.
fn groups_held(cluster: &ShoalCluster, node: usize, topic: &str) -> BTreeSet<u32> {
    groups_on(cluster, node)
        .expect("a metrics page")
        .into_iter()
        .filter(|(group, _)| group.topic == topic)
        .filter_map(|(group, _)| group.partition)
        .collect()
}

#[test]
fn a_topic_of_one_replica_per_partition_spreads_over_the_nodes_and_serves_through_any() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = cluster(dir.path());
    let stream = shoal_proto::protocol::encode_stream_name(STREAM);
    assert_eq!(call_anywhere(&cluster, 0, Operation::CreateStream, &stream).unwrap().0, 0);
    create_topic_as(
        &cluster,
        CreateTopic {
            durability: Some(Durability::Persisted),
            replication_factor: Some(1),
            ..topic_of("one")
        },
    );
    // Unset: three replicas, every node of three.
    create_topic(&cluster, "all", Durability::Persisted);
    // More replicas than nodes: refused, naming the bound.
    let over = CreateTopic { replication_factor: Some(4), ..topic_of("over") };
    let (code, body) = call_anywhere(&cluster, 0, Operation::CreateTopic, &over.encode()).unwrap();
    assert_eq!(code, ErrorCode::InvalidArgument as u32);
    assert!(String::from_utf8_lossy(&body).contains("replication_factor"));

    let mut ledger = Ledger::default();
    ledger.produce(&cluster, "one", 30);
    ledger.produce(&cluster, "all", 6);
    ledger.check(&cluster);

    // Every node agrees where each partition lives; each lives on exactly one node, and the
    // three partitions on three different nodes.
    let mut holder = BTreeMap::new();
    for node in 0..3 {
        let seen = placement(&cluster, node, "one");
        assert_eq!(seen.len(), PARTITIONS as usize);
        for (partition, (replicas, held, primary)) in seen.iter().enumerate() {
            assert_eq!(replicas.len(), 1, "node {node}, partition {partition}: {replicas:?}");
            assert_eq!(*held, replicas[0] == node as u64);
            // A node that holds nothing of it names the holder, its home, as primary.
            assert_eq!(primary.as_u64(), Some(replicas[0]), "node {node}: {primary}");
            let first = *holder.entry(partition).or_insert(replicas[0]);
            assert_eq!(first, replicas[0], "nodes disagree on partition {partition}");
        }
        for (replicas, held, _) in placement(&cluster, node, "all") {
            assert_eq!((replicas, held), (vec![0, 1, 2], true));
        }
    }
    let nodes: BTreeSet<u64> = holder.values().copied().collect();
    assert_eq!(nodes.len(), 3, "one partition per node: {holder:?}");
    for node in 0..3 {
        let expected: BTreeSet<u32> = holder
            .iter()
            .filter(|&(_, &held_by)| held_by == node as u64)
            .map(|(&partition, _)| partition as u32)
            .collect();
        assert_eq!(groups_held(&cluster, node, "one"), expected, "node {node} holds its own");
        assert_eq!(groups_held(&cluster, node, "all").len(), PARTITIONS as usize);
    }

    // A node that does not hold a partition answers its requests `NotPrimary`, naming the
    // holder; `DescribeTopic` names the holder as each partition's primary everywhere.
    let (&partition, &held_by) = holder.iter().next().unwrap();
    let elsewhere = (held_by as usize + 1) % 3;
    let fetch = Fetch {
        stream: STREAM.into(),
        topic: "one".into(),
        partition: partition as u32,
        from: FetchFrom::Offset(0),
        bytes_max: 1 << 16,
        count_max: 10,
        wait_ms_max: 0,
    };
    let mut raw = Raw::connect(&cluster.clients[elsewhere], rand_client());
    let answer = raw.call(Operation::Fetch, &fetch.encode());
    assert_eq!(answer.error(), ErrorCode::NotPrimary);
    let name = encode_topic_name(STREAM, "one");
    let (code, describe) = call_anywhere(&cluster, 0, Operation::DescribeTopic, &name).unwrap();
    assert_eq!(code, 0);
    let description = TopicDescription::decode(&describe).expect("a description");
    for (info, primary) in description.partitions.iter().zip(&description.primaries) {
        assert_eq!(u64::from(primary.primary), holder[&(info.partition as usize)]);
    }

    // The holder of a one-replica partition killed: the other partitions serve on; restarted,
    // it serves every acknowledged write again from its own disk.
    cluster.nodes[held_by as usize].kill_9();
    for other in (0..PARTITIONS).filter(|&p| p != partition as u32) {
        ledger.produce_to(&cluster, "one", other, 3);
    }
    restart(&mut cluster, held_by as usize);
    ledger.produce_to(&cluster, "one", partition as u32, 3);
    ledger.check(&cluster);
}
