//! Issue 23, catch-up on real processes. A backup that was away while its peers' retention
//! removed what it missed takes a state transfer, and the transfer carries the shard's machine
//! state (consumer offsets) beside the producer table, so once the group is back home on that
//! node it answers the offsets its peers stored meanwhile; `kill -9` in the middle of the
//! transfer changes nothing of that (under `canary-transfer-drops-driver-state` the transfer
//! carries the producer table alone and these two tests fail). A backup that was paused while
//! its peers kept everything shows dead, lagging, then in sync, and repairs from their
//! segments without a transfer; and a topic's own lag bound governs its groups alone.

mod common;

use std::time::Instant;

use common::cluster::*;
use common::{DEADLINE, Raw, batch};
use shoal_proto::Durability;
use shoal_proto::protocol::consumer::{
    ConsumerId, Membership, OffsetKey, PartitionRef, StoreOffset, decode_stored_offset,
};
use shoal_proto::protocol::{CreateTopic, ErrorCode, Operation, Partitioning, Produce};
use shoal_testkit::ShoalCluster;

/// The retained topic's segments and retention: the smallest segment, one segment kept.
const SEGMENT_SIZE_BYTES: u64 = 1 << 20;
/// One bulk batch's value: most of the small profile's 60 KiB message bound.
const BULK_VALUE_SIZE_BYTES: usize = 48 << 10;
/// Bulk batches written at most while waiting for retention (bounds the disk footprint:
/// about 5 MiB per node).
const BULK_BATCHES_MAX: u32 = 100;

#[test]
fn a_backup_behind_its_peers_retention_installs_their_state_with_the_offsets() {
    catch_up_by_transfer(false);
}

#[test]
fn a_backup_killed_during_its_state_transfer_still_gets_the_offsets() {
    catch_up_by_transfer(true);
}

/// Node 2 leads a partition of retained topic `t` and stores an offset, then is killed
/// (`kill -9`) while the group fails over, two consumers store offsets and enough is written for
/// retention on nodes 0 and 1 to delete the segments that hold those commits. Restarted, node 2
/// can repair none of it and installs a transfer (`kill_during`: it is killed again once a peer
/// served its state, and restarted); the group goes back home to node 2, which must answer both
/// offsets as they were stored.
///
/// Killed rather than paused: a paused node's peers keep sending, and the kernel's socket
/// buffers may hold all a test writes, which the node then appends on resuming — nothing missed.
fn catch_up_by_transfer(kill_during: bool) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("return.toml");
    std::fs::write(&config, "[replication]\nprimary_return_ms = 200\n").unwrap();
    let mut cluster = cluster_with_args(dir.path(), &["--config", config.to_str().unwrap()]);
    create_stream_and_topic(&cluster);
    create_topic_as(
        &cluster,
        CreateTopic {
            durability: Some(Durability::Persisted),
            retention_bytes: Some(SEGMENT_SIZE_BYTES),
            segment_size_bytes: Some(SEGMENT_SIZE_BYTES),
            ..topic_of("t")
        },
    );
    let led = partition_led_by(&cluster, 2, "t");
    let at = PartitionRef { stream: STREAM.into(), topic: "t".into(), partition: led.partition };
    let (alice, bob) = (ConsumerId::consumer("alice"), ConsumerId::consumer("bob"));
    produce(&cluster, led.partition, b"before");
    store(&cluster, &at, &alice, 1);
    converge(&cluster);

    cluster.nodes[2].kill_9();
    store(&cluster, &at, &alice, 5);
    store(&cluster, &at, &bob, 6);
    // Every commit above lies below this offset.
    let marker = produce(&cluster, led.partition, b"marker");
    let bulk = vec![b'x'; BULK_VALUE_SIZE_BYTES];
    let first_offset = |node: usize| {
        gauge_sum(
            &cluster,
            node,
            "shoal_partition_first_offset",
            &format!("group=\"{}\"", led.group),
        )
    };
    let mut written = 0;
    let started = Instant::now();
    while ![0, 1].iter().all(|&node| first_offset(node).is_some_and(|first| first > marker)) {
        assert!(
            started.elapsed() < DEADLINE,
            "retention never passed offset {marker}: first offsets {:?}\n{}",
            [first_offset(0), first_offset(1)],
            cluster.log_tails(30)
        );
        if written < BULK_BATCHES_MAX {
            produce(&cluster, led.partition, &bulk);
            written += 1;
        } else {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    eprintln!("retention passed offset {marker} on nodes 0 and 1 after {written} bulk batches");

    restart(&mut cluster, 2);
    if kill_during {
        wait_until(&cluster, "a peer served node 2 its state", || {
            [0, 1].iter().any(|&node| {
                gauge_sum(&cluster, node, "shoal_transfer_states_served_total", "").unwrap_or(0) > 0
            })
        });
        cluster.nodes[2].kill_9();
        restart(&mut cluster, 2);
    } else {
        let took = wait_until(&cluster, "node 2 installed a transfer", || {
            gauge_sum(&cluster, 2, "shoal_transfer_states_installed_total", "").unwrap_or(0) > 0
        });
        eprintln!("node 2 installed its peer's state {took:?} after it resumed");
    }
    let group_dir = cluster.data_dir(2).join(format!("shard-0/group-{:020}", led.group));
    wait_until(&cluster, "node 2's log began from a transferred state", || {
        group_dir.join("transfer-state").exists()
    });
    let home = wait_until(&cluster, "the partition back home on node 2", || {
        led_by(&cluster, 2).is_some_and(|led_here| led_here.iter().any(|l| l.group == led.group))
    });
    eprintln!("the partition was back on node 2 after {home:?}");
    for (consumer, expected) in [(&alice, 5), (&bob, 6)] {
        assert_eq!(offset_on(&cluster, 2, &at, consumer), Some(expected), "{consumer:?}");
    }
    converge(&cluster);
    check_logs_agree(&mut cluster);
}

/// Writes one record to partition `partition` of `t` (any node that takes it) and returns its
/// offset.
fn produce(cluster: &ShoalCluster, partition: u32, value: &[u8]) -> u64 {
    produce_to(cluster, "t", partition, value)
}

/// Writes one record to partition `partition` of `topic` (any node that takes it) and returns
/// its offset.
fn produce_to(cluster: &ShoalCluster, topic: &str, partition: u32, value: &[u8]) -> u64 {
    let produce = Produce {
        stream: STREAM.into(),
        topic: topic.into(),
        partitioning: Partitioning::Explicit(partition),
    };
    let body = produce.encode(&batch(&[value]));
    loop {
        if let Some((code, reply)) = call_anywhere(cluster, 0, Operation::Produce, &body) {
            assert_eq!(code, 0, "{}", String::from_utf8_lossy(&reply));
            let reply = shoal_proto::protocol::ProduceReply::decode(&reply).expect("a reply");
            return reply.base_offset;
        }
        // The outcome was lost in a failover: the value may be written, once more is harmless.
    }
}

/// Stores `consumer`'s offset at `at` (any node that takes it).
fn store(cluster: &ShoalCluster, at: &PartitionRef, consumer: &ConsumerId, offset: u64) {
    let store = StoreOffset {
        partition: at.clone(),
        consumer: consumer.clone(),
        membership: Membership::default(),
        offset,
    };
    let answer = call_anywhere(cluster, 0, Operation::StoreOffset, &store.encode());
    assert_eq!(answer.map(|(code, _)| code), Some(0), "{consumer:?} at {offset}");
}

/// `consumer`'s offset at `at`, as node `node` answers it (retried while the node says it does
/// not lead the partition yet).
fn offset_on(
    cluster: &ShoalCluster,
    node: usize,
    at: &PartitionRef,
    consumer: &ConsumerId,
) -> Option<u64> {
    let key = OffsetKey { partition: at.clone(), consumer: consumer.clone() };
    let mut raw = Raw::connect(&cluster.clients[node], rand_client());
    let deadline = Instant::now() + DEADLINE;
    loop {
        let answer = raw.call(Operation::GetOffset, &key.encode());
        if answer.reply.error == 0 {
            return decode_stored_offset(&answer.body).expect("a stored offset");
        }
        assert!(
            matches!(answer.error(), ErrorCode::NotPrimary | ErrorCode::TransientNotAccepted),
            "node {node}: {:?} {}",
            answer.error(),
            String::from_utf8_lossy(&answer.body)
        );
        assert!(Instant::now() < deadline, "node {node} never answered the offset");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Issue 23, lag by time and catch-up from segments: a backup paused (SIGSTOP) while 64 MiB is
/// written to a partition shows dead on the primary (`replica_lag_time_max_ms` = 1000), then
/// lagging while it catches up once resumed, then in sync; what its peers' bus queues could not
/// hold it repairs from their segments, and it never takes a transfer (its peers still hold
/// everything). Times are reported, not asserted.
#[test]
fn a_paused_backup_shows_dead_then_lagging_then_in_sync_and_repairs_from_segments() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lag.toml");
    // A small bus queue, so that most of what node 2 misses must come by repair.
    let text = "[replication]\nreplica_lag_time_max_ms = 1000\n\
                repair_bytes_max = 1048576\n\n[network]\nbus_queue_bytes_max = 4194304\n";
    std::fs::write(&config, text).unwrap();
    let mut cluster = cluster_with_args(dir.path(), &["--config", config.to_str().unwrap()]);
    create_stream_and_topic(&cluster);
    let led = partition_led_by(&cluster, 0, "p");
    let state_of_2 = || replica_state(&cluster, 0, led.group, 2);
    let flagged_lagging =
        || gauge_sum(&cluster, 0, "shoal_backups_flagged_lagging_total", "").unwrap_or(0);
    wait_until(&cluster, "node 2 in sync", || state_of_2() == Some(IN_SYNC));
    let lagging_before = flagged_lagging();

    cluster.nodes[2].stop();
    let stopped = Instant::now();
    let bulk = vec![b'x'; BULK_VALUE_SIZE_BYTES];
    let mut written_bytes = 0;
    while written_bytes < PAUSED_WRITE_BYTES {
        produce_to(&cluster, "p", led.partition, &bulk);
        written_bytes += bulk.len();
    }
    let wrote = stopped.elapsed();
    let dead = wait_until(&cluster, "node 2 dead on node 0", || state_of_2() == Some(DEAD));
    eprintln!(
        "64 MiB written in {wrote:?}; node 2 showed dead {:?} after it stopped",
        wrote + dead
    );

    cluster.nodes[2].cont();
    let resumed = Instant::now();
    let mut lagging_seen = None;
    loop {
        let state = state_of_2();
        if state == Some(LAGGING) && lagging_seen.is_none() {
            lagging_seen = Some(resumed.elapsed());
        }
        if state == Some(IN_SYNC) {
            break;
        }
        assert!(
            resumed.elapsed() < DEADLINE,
            "node 2 never in sync again\n{}",
            cluster.log_tails(30)
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let in_sync = resumed.elapsed();
    eprintln!(
        "node 2 resumed: lagging seen at {lagging_seen:?}, in sync again after {in_sync:?} \
         ({:.1} MB/s of what was written)",
        PAUSED_WRITE_BYTES as f64 / in_sync.as_secs_f64() / 1e6
    );
    // Dead, then lagging: the flag counts every entry into lagging, however short.
    assert!(flagged_lagging() > lagging_before, "node 2 was never flagged lagging");
    converge(&cluster);
    let served_from_disk: u64 = [0, 1]
        .iter()
        .map(|&node| {
            gauge_sum(&cluster, node, "shoal_repair_prepares_served_from_disk_total", "")
                .unwrap_or(0)
        })
        .sum();
    let installed = gauge_sum(&cluster, 2, "shoal_transfers_installed_total", "");
    let requested = gauge_sum(&cluster, 2, "shoal_repair_prepares_requested_total", "");
    let unanswered = gauge_sum(&cluster, 2, "shoal_repair_rounds_unanswered_total", "");
    let rounds = gauge_sum(&cluster, 2, "shoal_repair_rounds_total", "");
    eprintln!(
        "prepares served to node 2 from segments: {served_from_disk}; node 2 asked for \
         {requested:?} in {rounds:?} rounds, {unanswered:?} without progress"
    );
    assert!(served_from_disk > 0, "node 2 caught up without repair from segments");
    assert_eq!(installed, Some(0), "node 2 took a transfer although its peers held everything");
    check_logs_agree(&mut cluster);
}

/// What node 2 missed while paused.
const PAUSED_WRITE_BYTES: usize = 64 << 20;
/// `shoal_group_replica_state` values.
const IN_SYNC: u64 = 0;
const LAGGING: u64 = 1;
const DEAD: u64 = 2;

/// Replica `replica`'s state in group `group` as node `node` (its primary) shows it.
fn replica_state(cluster: &ShoalCluster, node: usize, group: u64, replica: u8) -> Option<u64> {
    let page = common::metrics_page(cluster.nodes[node].metrics()?)?;
    let (group, replica) = (format!("group=\"{group}\""), format!("replica=\"{replica}\""));
    page.lines()
        .filter(|line| line.starts_with("shoal_group_replica_state{"))
        .find(|line| line.contains(&group) && line.contains(&replica))
        .and_then(|line| line.rsplit_once(' ')?.1.parse().ok())
}

/// Issue 23, a topic's own lag bound: the cluster keeps the default 30 s, topic `q` sets 1 s
/// (`CreateTopic`'s `replica_lag_time_max_ms`). A stopped backup shows dead in `q`'s group
/// within about a second, while the metadata group, under the cluster's bound, still counts it
/// in sync.
#[test]
fn a_topic_lag_bound_overrides_the_cluster_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = cluster(dir.path());
    create_stream_and_topic(&cluster);
    create_topic_as(
        &cluster,
        CreateTopic {
            durability: Some(Durability::Persisted),
            replica_lag_time_max_ms: Some(1_000),
            replication_factor: None,
            ..topic_of("q")
        },
    );
    let led = partition_led_by(&cluster, 0, "q");
    wait_until(&cluster, "node 2 in sync", || {
        replica_state(&cluster, 0, led.group, 2) == Some(IN_SYNC)
            && replica_state(&cluster, 0, 0, 2) == Some(IN_SYNC)
    });
    cluster.nodes[2].stop();
    let stopped = Instant::now();
    let dead = wait_until(&cluster, "node 2 dead in q's group", || {
        replica_state(&cluster, 0, led.group, 2) == Some(DEAD)
    });
    eprintln!("node 2 showed dead in q's group {dead:?} after it stopped");
    // Well within the cluster's 30 s: the metadata group has not given up on node 2.
    assert!(stopped.elapsed() < std::time::Duration::from_secs(20), "too slow to tell");
    assert_eq!(replica_state(&cluster, 0, 0, 2), Some(IN_SYNC), "the metadata group's bound");
    cluster.nodes[2].cont();
    wait_until(&cluster, "node 2 in sync again", || {
        replica_state(&cluster, 0, led.group, 2) == Some(IN_SYNC)
    });
    converge(&cluster);
    check_logs_agree(&mut cluster);
}
