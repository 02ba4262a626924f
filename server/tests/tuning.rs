//! Per-shard tuning on the real `shoal` binary: a flush delay gathers writes that arrive within
//! it into one flush cycle; a shard built with SQPOLL, a larger ring and buffered files serves
//! produce and fetch; a `[shard.N]` segment age rolls only that shard's partitions; and each
//! shard's own listener (`[network] shard_listen`) is named in the readiness line and in `Hello`,
//! and serves a partition's owner without forwarding, while an old (version 1) client still gets
//! the old `Hello` result.
//!
//! Every server runs on ephemeral ports and a temp directory and is killed by its guard if a test
//! fails; every socket read is bounded by a timeout.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{OutputWithin, Raw, ShoalProcess, restart, start_command, terminate};
use shoal_proto::Durability;
use shoal_proto::protocol::{
    FetchFrom, Hello, HelloReply, Operation, PROTOCOL_VERSION, decode_describe, encode_topic_name,
};

/// `shoal` with `shards` shards (small profile, ephemeral ports, unpinned) and `file` as config.
fn start_with(dir: &Path, shards: u32, file: &str, extra: &[&str]) -> ShoalProcess {
    let config = dir.join("shoal.toml");
    std::fs::write(&config, file).unwrap();
    let mut command = common::command(&dir.join("data"), shards);
    command.arg("--config").arg(&config).args(extra);
    start_command(command)
}

/// One sample of the metrics page (`name` with every label of `labels`), by a plain GET; the
/// page's format is checked strictly by `tests/metrics.rs`.
fn metric(server: &ShoalProcess, name: &str, labels: &[(&str, &str)]) -> f64 {
    let address = server.metrics().expect("a metrics address");
    let page = common::metrics_page(address).expect("the page");
    let found: Vec<f64> = page
        .lines()
        .filter(|line| {
            line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} "))
        })
        .filter(|line| labels.iter().all(|(k, v)| line.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
    found[0]
}

/// Sends `count` produce requests to `partition`, `spacing` apart, without waiting for their
/// replies; then reads every reply (in order, each a success).
fn produce_spaced(raw: &mut Raw, partition: u32, count: usize, spacing: Duration) {
    for i in 0..count {
        let value = format!("spaced-{i}");
        let body = Raw::produce_body("s", "t", partition, &[value.as_bytes()]);
        raw.send(Operation::Produce, &body);
        std::thread::sleep(spacing);
    }
    for _ in 0..count {
        raw.receive().ok();
    }
}

#[test]
fn writes_arriving_within_the_flush_delay_share_one_flush_cycle() {
    const WRITES: usize = 5;
    // 10 ms apart: without a delay each write finds the previous cycle done (its one sync: the
    // partition's segment on the direct path, one partition being all that writes) and gets a
    // cycle of its own; with a 100 ms delay all five, sent within about 40 ms, wait for the
    // first one's window and go out together.
    let spacing = Duration::from_millis(10);
    let mut data_syncs = Vec::new();
    for delay_us in [0, 100_000] {
        let dir = tempfile::tempdir().unwrap();
        let file = format!("[shard]\nflush_delay_us_max = {delay_us}\n");
        let mut server = start_with(dir.path(), 1, &file, &[]);
        let mut raw = Raw::connect(server.native(), 1);
        raw.create_stream("s").ok();
        raw.create_topic("s", "t", 1, Durability::Persisted).ok();
        raw.produce("s", "t", 0, &[b"settle"]);
        let shard = [("shard", "0")];
        // A persisted cycle syncs the journal, or (the direct path) the partition's segment.
        let syncs = |server: &ShoalProcess| {
            metric(server, "shoal_journal_syncs_total", &shard)
                + metric(server, "shoal_direct_syncs_total", &shard)
        };
        let before = syncs(&server);
        produce_spaced(&mut raw, 0, WRITES, spacing);
        let after = syncs(&server);
        let (_, fetched) = raw.fetch("s", "t", 0, FetchFrom::First, 100);
        assert_eq!(fetched.len(), WRITES + 1, "every write was stored");
        data_syncs.push(after - before);
        assert_eq!(terminate(&mut server), 0);
    }
    let (undelayed, delayed) = (data_syncs[0], data_syncs[1]);
    // One cycle, or two should a slow machine stretch the sends past the 100 ms window.
    assert!((1.0..=2.0).contains(&delayed), "with the delay: {delayed} data syncs");
    assert!(undelayed > delayed, "without the delay: {undelayed}, with it: {delayed}");
}

#[test]
fn a_shard_with_sqpoll_a_larger_ring_and_buffered_files_serves_produce_and_fetch() {
    let dir = tempfile::tempdir().unwrap();
    // SQPOLL wants a pinned shard and a CPU for its polling thread (the config refuses it
    // otherwise): CPUs 0 and 1, so this test needs a machine with two.
    let file = "[shard]\nuring_entries = 1024\nsqpoll_idle_ms = 10\ndirect_io = false\n\
                [shard.0]\nsqpoll_cpu = 1\n";
    let mut server = start_with(dir.path(), 1, file, &["--cpus", "0"]);
    let mut raw = Raw::connect(server.native(), 1);
    raw.create_stream("s").ok();
    raw.create_topic("s", "t", 1, Durability::Persisted).ok();
    for round in 0..20u32 {
        let value = format!("sqpoll-{round}");
        raw.produce("s", "t", 0, &[value.as_bytes()]);
        if round == 10 {
            // Past the idle time the polling thread sleeps; the next submit must wake it.
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let (_, fetched) = raw.fetch("s", "t", 0, FetchFrom::First, 100);
    let values: Vec<String> =
        fetched.iter().map(|(_, v)| String::from_utf8_lossy(v).into_owned()).collect();
    let expected: Vec<String> = (0..20).map(|round| format!("sqpoll-{round}")).collect();
    assert_eq!(values, expected);
    assert_eq!(metric(&server, "shoal_shard_config_sqpoll_idle_ms", &[("shard", "0")]), 10.0);
    assert_eq!(terminate(&mut server), 0);
    // Restarted the same way, it reads back what it wrote through the page cache.
    restart(&mut server);
    let mut raw = Raw::connect(server.native(), 1);
    let (_, fetched) = raw.fetch("s", "t", 0, FetchFrom::First, 100);
    assert_eq!(fetched.len(), 20);
    assert_eq!(terminate(&mut server), 0);
}

#[test]
fn a_shard_n_segment_age_rolls_only_that_shards_partitions() {
    let dir = tempfile::tempdir().unwrap();
    // Shard 1's partitions roll at every append a millisecond after the previous one; shard 0
    // keeps the default week.
    let mut server = start_with(dir.path(), 2, "[shard.1]\nsegment_age_ms_max = 1\n", &[]);
    let mut raw = Raw::connect(server.native(), 1);
    raw.create_stream("s").ok();
    raw.create_topic("s", "t", 2, Durability::Replicated).ok();
    let shards = partition_shards(&mut raw);
    for round in 0..4 {
        for partition in 0..2 {
            raw.produce("s", "t", partition, &[format!("{round}").as_bytes()]);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for partition in 0..2u32 {
        let labels = [("stream", "s"), ("topic", "t"), ("partition", &*partition.to_string())];
        let segments = metric(&server, "shoal_partition_segments", &labels);
        match shards[partition as usize] {
            0 => assert_eq!(segments, 1.0, "partition {partition} on shard 0"),
            _ => assert!(segments >= 3.0, "partition {partition} on shard 1: {segments}"),
        }
    }
    assert_eq!(terminate(&mut server), 0);
}

/// The shard of each partition of `s`/`t`, by partition.
fn partition_shards(raw: &mut Raw) -> Vec<u32> {
    let answer = raw.call(Operation::DescribeTopic, &encode_topic_name("s", "t"));
    let (_, partitions) = decode_describe(answer.ok()).expect("a describe reply");
    let mut shards = vec![0; partitions.len()];
    for p in partitions {
        shards[p.partition as usize] = p.shard;
    }
    shards
}

/// Connects and says hello speaking `version_min..=version_max`; returns the result.
fn hello(address: &str, version_min: u16, version_max: u16) -> (Raw, HelloReply) {
    let mut raw = Raw::connect_only(address, 7);
    let hello = Hello { version_min, version_max, client_name: "tuning-test".into() };
    let answer = raw.call(Operation::Hello, &hello.encode());
    let reply = HelloReply::decode(answer.ok()).expect("a Hello result");
    (raw, reply)
}

#[test]
fn a_client_on_the_owning_shards_own_port_is_served_without_forwarding() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start_with(dir.path(), 2, "[network]\nshard_listen = \"127.0.0.1:0\"\n", &[]);
    assert_eq!(server.shards().len(), 2, "the readiness line names both shards' ports");
    assert!(!server.shards().iter().any(|shard| shard == server.native()));
    for (shard, address) in server.shards().iter().enumerate() {
        let (_, reply) = hello(address, 1, PROTOCOL_VERSION);
        assert_eq!(reply.version, PROTOCOL_VERSION);
        assert_eq!(reply.shard, shard as u32, "{address} is shard {shard}'s own");
        assert_eq!(reply.shards, 2);
        assert_eq!(reply.shard_addresses, server.shards());
    }
    // A version 1 client gets the version 1 result: no shard fields.
    let (_, old) = hello(server.native(), 1, 1);
    assert_eq!((old.version, old.shard_addresses.len()), (1, 0));

    // Set up through shard 0's port (metadata lives on shard 0: nothing is forwarded).
    let mut admin = Raw::connect(&server.shards()[0], 1);
    admin.create_stream("s").ok();
    admin.create_topic("s", "t", 2, Durability::Replicated).ok();
    let shards = partition_shards(&mut admin);
    let on_shard_1 = shards.iter().position(|&s| s == 1).expect("a partition on shard 1") as u32;

    const DIRECT: usize = 10;
    let mut direct = Raw::connect(&server.shards()[1], 2);
    for i in 0..DIRECT {
        direct.produce("s", "t", on_shard_1, &[format!("direct-{i}").as_bytes()]);
    }
    let shard = |index: &'static str| [("shard", index)];
    let produce_1 = [("shard", "1"), ("operation", "produce")];
    assert_eq!(metric(&server, "shoal_requests_forwarded_total", &shard("1")), 0.0);
    assert_eq!(metric(&server, "shoal_requests_total", &produce_1), DIRECT as f64);
    assert_eq!(metric(&server, "shoal_requests_forwarded_total", &shard("0")), 0.0);

    // The same partition through shard 0's port is a hand-off per request.
    const HANDED_OFF: usize = 3;
    for i in 0..HANDED_OFF {
        admin.produce("s", "t", on_shard_1, &[format!("via-0-{i}").as_bytes()]);
    }
    let forwarded = metric(&server, "shoal_requests_forwarded_total", &shard("0"));
    assert_eq!(forwarded, HANDED_OFF as f64);
    let (_, fetched) = direct.fetch("s", "t", on_shard_1, FetchFrom::First, 100);
    assert_eq!(fetched.len(), DIRECT + HANDED_OFF);
    assert_eq!(metric(&server, "shoal_requests_forwarded_total", &shard("1")), 0.0);
    assert_eq!(terminate(&mut server), 0);
}

#[test]
fn a_taken_shard_port_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let output = common::command(dir.path(), 1)
        .env("SHOAL_NETWORK_SHARD_LISTEN", address.to_string())
        .output_within();
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "no readiness line");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&format!("cannot listen for shard 0 on {address}")), "{stderr}");
}
