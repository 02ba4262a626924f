//! The metadata log's retention on real processes (`[metadata] retention_bytes`): three nodes
//! with 1 MiB metadata segments, a 1 MiB bound and a snapshot every 64 ops. While node 2 is
//! down, the metadata log grows past two segments (registered sessions) and a topic is created;
//! the other nodes delete the log's first segment once a snapshot covers it. Node 2, back,
//! finds the ops it lacks gone from every peer and takes the metadata state by a state
//! transfer: it knows the new topic, serves it, and keeps it across a `kill -9`.

mod common;

use std::time::{Duration, Instant};

use common::cluster::*;
use common::{DEADLINE, metrics_page};
use shoal_proto::Durability;
use shoal_proto::protocol::Operation;
use shoal_testkit::ShoalCluster;

const FIRST_SEGMENT: &str = "00000000000000000000.log";

/// Whether node `node`'s metadata log still has its first segment.
fn first_segment_held(cluster: &ShoalCluster, node: usize) -> bool {
    let dir = cluster.data_dir(node as u8).join("shard-0").join(format!("group-{:020}", 0));
    dir.join(FIRST_SEGMENT).exists()
}

/// Whether node `node` reports partition 0 of topic `topic` in its status.
fn knows_topic(cluster: &ShoalCluster, node: usize, topic: &str) -> bool {
    status(cluster, node).is_some_and(|status| {
        status["partitions"].as_array().is_some_and(|all| all.iter().any(|p| p["topic"] == topic))
    })
}

/// A counter summed over node `node`'s metrics page (0 without a page).
fn node_counter(cluster: &ShoalCluster, node: usize, name: &str) -> u64 {
    let page = cluster.nodes[node].metrics().and_then(metrics_page);
    page.map_or(0, |page| counter(&page, name))
}

#[test]
fn a_node_behind_the_metadata_logs_start_catches_up_by_a_state_transfer() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("metadata.toml");
    let settings = "[metadata]\nretention_bytes = 1048576\nsegment_size_bytes = 1048576\n\
                    snapshot_interval_ops = 64\n";
    std::fs::write(&config, settings).unwrap();
    let config = config.to_str().unwrap().to_string();
    let mut cluster = cluster_with_args(dir.path(), &["--config", &config]);
    create_stream_and_topic(&cluster);
    let mut ledger = Ledger::default();
    ledger.produce(&cluster, "p", 10);

    cluster.nodes[2].kill_9();
    grow_metadata_log(&cluster);
    create_topic(&cluster, "late", Durability::Persisted);
    ledger.produce(&cluster, "late", 10);

    restart(&mut cluster, 2);
    wait_until(&cluster, "node 2 learns the topic created while it was down", || {
        knows_topic(&cluster, 2, "late")
    });
    let installed = node_counter(&cluster, 2, "shoal_transfer_states_installed_total");
    assert!(installed >= 1, "node 2 took the metadata state by a transfer: {installed}");
    // Node 2 serves the new topic's partitions it leads, and after a `kill -9` it rebuilds the
    // catalog from the transferred state and the log past it.
    ledger.produce(&cluster, "late", 10);
    ledger.produce(&cluster, "p", 10);
    cluster.nodes[2].kill_9();
    restart(&mut cluster, 2);
    wait_until(&cluster, "node 2 knows the topic after its restart", || {
        knows_topic(&cluster, 2, "late")
    });
    ledger.produce(&cluster, "late", 5);
    ledger.check(&cluster);
}

/// Registers sessions at the metadata primary until nodes 0 and 1 both deleted the metadata
/// log's first segment (each session is one op of about 350 bytes in the log).
fn grow_metadata_log(cluster: &ShoalCluster) {
    let deadline = Instant::now() + DEADLINE;
    let mut registered = 0u64;
    while first_segment_held(cluster, 0) || first_segment_held(cluster, 1) {
        assert!(
            Instant::now() < deadline,
            "the metadata log's first segment stays after {registered} sessions\n{}",
            cluster.log_tails(40)
        );
        let primary = metadata_primary(cluster);
        let Some(mut raw) = connect(&cluster.clients[primary]) else { continue };
        for _ in 0..500 {
            raw.send(Operation::Register, &[]);
        }
        for _ in 0..500 {
            if raw.try_receive().is_none() {
                break;
            }
            registered += 1;
        }
        if registered > 40_000 {
            // Far past two segments: give retention (once a second) a moment.
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    eprintln!("the metadata log's first segment went after {registered} sessions");
}
