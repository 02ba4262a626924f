//! Clients follow the primary, on three real `shoal` processes (issue 22, item 6): the client
//! library, given one node's address, is redirected to the metadata group's primary for admin
//! requests and sends each partition's batches to that partition's primary; when the primary of
//! a partition is killed with `kill -9` in the middle of the stream, an idempotent producer
//! follows the new primary, and every acknowledged (partition, offset) reads back exactly once,
//! offsets dense. A write to a group that has lost its quorum is answered within a bound instead
//! of waiting forever.
//!
//! Clients of older protocol versions keep their layouts: a version 2 `Hello` names no nodes and
//! a version 2 `NotPrimary` is the text alone, where version 3 gets the structured answer.
//!
//! Every wait is bounded by [`DEADLINE`]; nothing sleeps for synchronisation (loops poll the
//! condition, bounded).

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Answer, Raw};
use shoal_client::{
    Ack, Client, ClientConfig, ClientError, ConsumerId, CreateTopic, Durability, ErrorCode, Fetch,
    FetchFrom, GroupRef, JoinGroup, Membership, OffsetKey, PartitionInfo, PartitionRef,
    Partitioning, Poll, Producer, ProducerConfig, Route,
};
use shoal_proto::batch::BatchBuilder;
use shoal_proto::protocol::{Hello, HelloReply, NotPrimary, Operation, Produce, Writer};
use shoal_testkit::{ClusterPlan, ShoalCluster};

/// How long any start, stop or wait may take.
const DEADLINE: Duration = Duration::from_secs(60);
/// Records produced before the kill, and after it.
const RECORDS_PER_PHASE: usize = 300;
/// Partitions of the test topic.
const PARTITIONS: u32 = 3;

fn start_cluster(root: &Path) -> ShoalCluster {
    let plan = ClusterPlan::small(env!("CARGO_BIN_EXE_shoal").into(), root, 3, DEADLINE);
    ShoalCluster::start(plan).unwrap_or_else(|error| panic!("{error}"))
}

/// A client given only `seed`, with a session (its producer id).
async fn connect(seed: &str) -> Client {
    let config = ClientConfig {
        register: true,
        request_timeout_ms: 10_000,
        connect_timeout_ms: 2_000,
        ..ClientConfig::with_seeds([seed])
    };
    retry_within("connect", async || Client::connect(config.clone()).await).await
}

/// Runs `attempt` until it succeeds or fails with an error that is not retryable; a retryable
/// failure (a cluster still electing its primaries) is tried again until [`DEADLINE`] passes.
async fn retry_within<T>(
    what: &str,
    mut attempt: impl AsyncFnMut() -> Result<T, ClientError>,
) -> T {
    let started = Instant::now();
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(error) if error.is_retryable() && started.elapsed() < DEADLINE => {
                monoio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("{what}: {error} after {:?}", started.elapsed()),
        }
    }
}

/// Creates stream `s` and topic `s/t` through whatever node `client` was given (the metadata
/// primary may be another: the client is redirected).
async fn create_topic(client: &mut Client, durability: Durability, partitions: u32) {
    retry_within("create stream", async || client.create_stream("s").await).await;
    let create = CreateTopic {
        stream: "s".into(),
        topic: "t".into(),
        partitions,
        durability: Some(durability),
        ..CreateTopic::default()
    };
    retry_within("create topic", async || client.create_topic(&create).await).await;
}

/// Every record of every partition, read from each partition's primary: per partition, the
/// values by offset.
async fn read_all(client: &mut Client) -> Vec<BTreeMap<u64, Vec<u8>>> {
    let mut partitions = Vec::new();
    for partition in 0..PARTITIONS {
        let mut records = BTreeMap::new();
        let mut next = 0;
        let started = Instant::now();
        loop {
            let fetch = Fetch {
                stream: "s".into(),
                topic: "t".into(),
                partition,
                from: FetchFrom::Offset(next),
                bytes_max: 1 << 20,
                count_max: 10_000,
                wait_ms_max: 0,
            };
            let fetched = retry_within("fetch", async || client.fetch(&fetch).await).await;
            for record in fetched.records() {
                let record = record.expect("a readable record");
                let value = record.value.unwrap_or_default().to_vec();
                assert!(records.insert(record.offset, value).is_none(), "offset read twice");
                next = record.offset + 1;
            }
            if next >= fetched.reply.next_offset {
                break;
            }
            assert!(started.elapsed() < DEADLINE, "partition {partition} never read to its end");
        }
        partitions.push(records);
    }
    partitions
}

/// Sends `count` records numbered from `first` (values `r{n}`), returning their tickets'
/// values in ticket order.
async fn send(producer: &mut Producer, first: usize, count: usize, values: &mut Vec<String>) {
    for n in first..first + count {
        let value = format!("r{n}");
        producer.send(None, value.as_bytes()).await.expect("the producer follows the primary");
        values.push(value);
    }
}

#[test]
fn an_idempotent_producer_follows_a_killed_primary_and_every_ack_reads_back_once() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = start_cluster(root.path());
    let seed = cluster.clients[1].clone();
    let mut runtime = shoal_client::runtime().unwrap();
    runtime.block_on(async {
        let mut client = connect(&seed).await;
        assert_eq!(client.nodes(), cluster.clients, "Hello named every node");
        create_topic(&mut client, Durability::Persisted, PARTITIONS).await;
        let metadata = client.believed_primary(&Route::Metadata);
        assert!(metadata.is_some(), "the redirect taught the metadata primary");

        let config = ProducerConfig {
            idempotent: true,
            batch_records_max: 16,
            linger_us: 200,
            retries_max: 30,
            retry_backoff_ms_max: 1_000,
            ..ProducerConfig::default()
        };
        let producer_client = connect(&seed).await;
        let mut producer = Producer::new(producer_client, "s", "t", config).await.unwrap();
        let mut values = Vec::new();
        send(&mut producer, 0, RECORDS_PER_PHASE, &mut values).await;
        producer.flush().await.expect("the first phase is acknowledged");

        // Kill the primary of partition 0 with batches in flight, and keep producing.
        let (_, partitions) = client.describe_topic("s", "t").await.unwrap();
        let victim = primary_of(&client, &partitions, 0);
        send(&mut producer, RECORDS_PER_PHASE, 40, &mut values).await;
        producer.send_buffered().await.unwrap();
        cluster.nodes[usize::from(victim)].kill_9();
        let killed = Instant::now();
        send(&mut producer, RECORDS_PER_PHASE + 40, RECORDS_PER_PHASE - 40, &mut values).await;
        producer.flush().await.expect("the producer followed the new primary");
        eprintln!("node {victim} killed; all acknowledged {:?} later", killed.elapsed());

        let acks: Vec<Ack> = producer.poll_acks().collect();
        assert_eq!(acks.len(), values.len(), "every record acknowledged");
        let mut reader = connect(&seed_other_than(&cluster.clients, victim)).await;
        let logs = read_all(&mut reader).await;
        check_every_ack_once(&acks, &values, &logs);
    });
}

/// The node the client believes leads `partition` (a version 3 describe names it).
fn primary_of(client: &Client, partitions: &[PartitionInfo], partition: u32) -> u8 {
    assert!(partitions.iter().any(|p| p.partition == partition));
    let route = Route::Partition { stream: "s", topic: "t", partition };
    client.believed_primary(&route).expect("describe named the partition's primary")
}

fn seed_other_than(clients: &[String], node: u8) -> String {
    clients.iter().enumerate().find(|(i, _)| *i != usize::from(node)).unwrap().1.clone()
}

/// Every acknowledged record is in its partition at its offset with its value, no value is
/// stored twice, and each partition's offsets are dense from 0.
fn check_every_ack_once(acks: &[Ack], values: &[String], logs: &[BTreeMap<u64, Vec<u8>>]) {
    for ack in acks {
        let stored = logs[ack.partition as usize].get(&ack.offset);
        let expected = values[ack.ticket as usize].as_bytes();
        assert_eq!(stored.map(Vec::as_slice), Some(expected), "ack {ack:?}");
    }
    let mut seen = HashSet::new();
    for (partition, log) in logs.iter().enumerate() {
        let offsets: Vec<u64> = log.keys().copied().collect();
        assert_eq!(offsets, (0..log.len() as u64).collect::<Vec<_>>(), "partition {partition}");
        for value in log.values() {
            assert!(seen.insert(value.clone()), "{} stored twice", String::from_utf8_lossy(value));
        }
    }
    assert_eq!(seen.len(), acks.len(), "nothing stored that was not acknowledged once");
}

#[test]
fn a_write_to_a_group_without_quorum_is_answered_within_a_bound() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = start_cluster(root.path());
    let survivor = cluster.clients[0].clone();
    let mut runtime = shoal_client::runtime().unwrap();
    runtime.block_on(async {
        let mut client = connect(&survivor).await;
        create_topic(&mut client, Durability::Replicated, 1).await;
        let batch = one_record_batch();
        retry_within("first produce", async || {
            client.produce("s", "t", Partitioning::Explicit(0), &batch).await
        })
        .await;
        // A consumer group is coordinated by the metadata primary, wherever the client was.
        let join = JoinGroup {
            group: GroupRef { stream: "s".into(), topic: "t".into(), group: "g".into() },
            member: String::new(),
            session_timeout_ms: 10_000,
        };
        let assignment = retry_within("join", async || client.join_group(&join).await).await;
        assert_eq!(assignment.partitions, [0]);

        cluster.nodes[1].kill_9();
        cluster.nodes[2].kill_9();
        // Sent to the survivor only (no following, no retries): each answer comes within the
        // write bound (plus slack), until the survivor's group, without a quorum, says so.
        let mut raw = connect_only(&survivor).await;
        let started = Instant::now();
        loop {
            let sent = Instant::now();
            let body = produce_body(&batch);
            let request = raw.submit(Operation::Produce, &[&body]).await.unwrap();
            let reply = raw.receive().await.expect("an answer, not a timeout");
            assert_eq!(reply.request, request);
            let waited = sent.elapsed();
            assert!(waited < Duration::from_secs(15), "answered after {waited:?}");
            match reply.result.map_err(|e| e.code()) {
                Err(Some(ErrorCode::TransientNotAccepted | ErrorCode::TransientNotCommitted)) => {
                    eprintln!("without a quorum: answered in {waited:?}");
                    break;
                }
                // Still a backup of a primary it has not noticed is gone.
                Err(Some(ErrorCode::NotPrimary)) => {}
                other => panic!("a write without a quorum was answered {other:?}"),
            }
            assert!(started.elapsed() < DEADLINE, "never refused as without a quorum");
        }
    });
}

/// A client on `address` only, without a session, that never follows a primary (its
/// `submit`/`receive` pair goes over the one connection).
async fn connect_only(address: &str) -> Client {
    let config = ClientConfig { request_timeout_ms: 30_000, ..ClientConfig::with_seeds([address]) };
    Client::connect(config).await.expect("the survivor answers")
}

fn one_record_batch() -> Vec<u8> {
    let mut builder = BatchBuilder::new(1_000);
    builder.push(1_000, None, Some(b"x"), &[]);
    builder.build().to_vec()
}

fn produce_body(batch: &[u8]) -> Vec<u8> {
    let produce =
        Produce { stream: "s".into(), topic: "t".into(), partitioning: Partitioning::Explicit(0) };
    let mut body = Writer::new();
    produce.encode_prefix(&mut body);
    body.raw(batch);
    body.finish()
}

#[test]
fn version_2_clients_get_the_plain_not_primary_and_version_3_the_structured_one() {
    let root = tempfile::tempdir().unwrap();
    let cluster = start_cluster(root.path());
    let started = Instant::now();
    // Until the metadata group has a serving primary, nodes answer TransientNotAccepted (or
    // name a primary that does not serve yet): ask again, bounded.
    loop {
        let answers: Vec<(Answer, Answer)> = (0..3)
            .map(|node| {
                let address = &cluster.clients[node];
                let (mut old, _) = hello(address, 2, node as u8, &cluster.clients);
                let (mut new, _) = hello(address, 3, node as u8, &cluster.clients);
                (old.call(Operation::ListStreams, &[]), new.call(Operation::ListStreams, &[]))
            })
            .collect();
        let serving: Vec<usize> = (0..3)
            .filter(|&n| answers[n].0.reply.error == 0 && answers[n].1.reply.error == 0)
            .collect();
        let redirected = |n: usize| {
            let code = ErrorCode::NotPrimary as u32;
            answers[n].0.reply.error == code && answers[n].1.reply.error == code
        };
        if let [primary] = serving[..]
            && (0..3).filter(|&n| n != primary).all(redirected)
        {
            for node in (0..3).filter(|&n| n != primary) {
                let (old, new) = &answers[node];
                let structured = NotPrimary::decode(&new.body).expect("a version 3 NotPrimary");
                assert_eq!(usize::from(structured.primary), primary);
                assert_eq!(structured.address, cluster.clients[primary]);
                assert_eq!(String::from_utf8_lossy(&old.body), structured.text, "version 2");
                let expected = format!("replica {primary} leads view {}", structured.view);
                assert_eq!(structured.text, expected);
            }
            return;
        }
        assert!(started.elapsed() < DEADLINE, "no single metadata primary emerged");
        std::thread::yield_now();
    }
}

/// A raw connection to `address` speaking exactly `version`, and its `Hello` result (checked:
/// the cluster's nodes from version 3 on, none before).
fn hello(address: &str, version: u16, node: u8, clients: &[String]) -> (Raw, HelloReply) {
    let mut raw = Raw::connect_only(address, 7);
    let hello = Hello { version_min: version, version_max: version, client_name: "old".into() };
    let reply = HelloReply::decode(raw.call(Operation::Hello, &hello.encode()).ok()).unwrap();
    assert_eq!(reply.version, version);
    if version >= 3 {
        assert_eq!(reply.node, node);
        let named: Vec<&str> = reply.nodes.iter().map(|n| n.address.as_str()).collect();
        assert_eq!(named, clients.iter().map(String::as_str).collect::<Vec<_>>());
    } else {
        assert!(reply.nodes.is_empty(), "a version 2 result names no nodes");
    }
    (raw, reply)
}

/// Issue 23: a consumer group commits offsets on every partition (polls with auto-commit), the
/// node leading the metadata group and a partition is killed, and the group carries on from
/// the new primaries: each partition's stored offset is the latest committed, and the next poll
/// starts there, re-reading nothing.
#[test]
fn a_consumer_group_continues_from_its_committed_offsets_after_a_primary_dies() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = start_cluster(root.path());
    let seed = cluster.clients[1].clone();
    let mut runtime = shoal_client::runtime().unwrap();
    runtime.block_on(async {
        let mut client = connect(&seed).await;
        create_topic(&mut client, Durability::Persisted, PARTITIONS).await;
        // Five batches of two records per partition, so a poll can stop short of the end.
        for partition in 0..PARTITIONS {
            for n in 0..5 {
                let mut batch = BatchBuilder::new(1_700_000_000_000);
                for record in 0..2 {
                    let value = format!("p{partition}-{n}-{record}");
                    batch.push(1_700_000_000_000, None, Some(value.as_bytes()), &[]);
                }
                let batch = batch.build();
                let explicit = Partitioning::Explicit(partition);
                retry_within("produce", async || {
                    client.produce("s", "t", explicit.clone(), &batch).await
                })
                .await;
            }
        }

        let group = GroupRef { stream: "s".into(), topic: "t".into(), group: "readers".into() };
        let join =
            JoinGroup { group: group.clone(), member: String::new(), session_timeout_ms: 60_000 };
        let assignment = retry_within("join", async || client.join_group(&join).await).await;
        assert_eq!(assignment.partitions, (0..PARTITIONS).collect::<Vec<_>>());
        let membership =
            Membership { member: assignment.member.clone(), generation: assignment.generation };
        let poll = |partition: u32| Poll {
            partition: PartitionRef { stream: "s".into(), topic: "t".into(), partition },
            consumer: ConsumerId::group("readers"),
            membership: membership.clone(),
            bytes_max: 1 << 20,
            count_max: 4,
            wait_ms_max: 0,
            auto_commit: true,
        };
        let mut consumed = Vec::new();
        for partition in 0..PARTITIONS {
            let fetched = retry_within("poll", async || client.poll(&poll(partition)).await).await;
            let offsets: Vec<u64> = fetched.records().map(|r| r.unwrap().offset).collect();
            let end = offsets.last().map_or(0, |last| last + 1);
            assert!(end > 0 && end < 10, "partition {partition}: a poll stops short: {offsets:?}");
            assert_eq!(offsets, (0..end).collect::<Vec<_>>(), "partition {partition}");
            consumed.push(end);
        }

        // Node 0 leads the metadata group (the coordinator) and a partition in view 0.
        cluster.nodes[0].kill_9();
        for partition in 0..PARTITIONS {
            let key = OffsetKey {
                partition: PartitionRef { stream: "s".into(), topic: "t".into(), partition },
                consumer: ConsumerId::group("readers"),
            };
            let stored = retry_within("get offset", async || client.get_offset(&key).await).await;
            assert_eq!(stored, Some(consumed[partition as usize]), "partition {partition}");
            let fetched = retry_within("poll", async || client.poll(&poll(partition)).await).await;
            let first = fetched.records().next().map(|r| r.unwrap().offset);
            let expected = Some(consumed[partition as usize]);
            assert_eq!(first, expected, "partition {partition} goes on where the group left it");
        }
    });
}
