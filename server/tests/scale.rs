//! Many partitions on one node (issue 24): a topic of 10,000 partitions is created on the real
//! binary (small profile, one shard), and the partitions that never wrote must cost at most
//! 64 KiB of disk and 64 KiB of resident memory each — no data file, no write buffer, no ready
//! space (DESIGN.md §3). One more partition than `[metadata] topic_partitions_max` is refused
//! with an error naming the key. Nothing here is timed: `docs/benchmarks.md` records how long
//! the creation takes.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Instant;

use common::{DEADLINE, Raw, command, metrics_page, start_command};
use shoal_proto::Durability;
use shoal_proto::protocol::{ErrorCode, FetchFrom};

const PARTITIONS: u32 = 10_000;
/// The bound on what a partition that never wrote may cost, on disk and in memory.
const IDLE_PARTITION_BYTES_MAX: u64 = 64 << 10;

/// Bytes the files under `dir` occupy on disk (allocated blocks, so a sparse file counts what
/// it holds, and directories count their own blocks).
fn disk_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let metadata = std::fs::symlink_metadata(&path).expect("stat");
        total += metadata.blocks() * 512;
        if metadata.is_dir() {
            for entry in std::fs::read_dir(&path).expect("list") {
                pending.push(entry.expect("entry").path());
            }
        }
    }
    total
}

/// The server's resident memory, from `/proc`.
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).expect("VmRSS");
    let kib: u64 = line.split_whitespace().nth(1).expect("value").parse().expect("number");
    kib << 10
}

/// The gauge `shoal_groups` of shard 0.
fn groups(metrics: &str) -> u64 {
    let page = metrics_page(metrics).expect("metrics page");
    let line = page
        .lines()
        .find(|line| line.starts_with("shoal_groups{"))
        .unwrap_or_else(|| panic!("no shoal_groups in {page}"));
    line.rsplit(' ').next().expect("value").parse().expect("number")
}

#[test]
fn ten_thousand_partitions_that_never_wrote_cost_little_disk_and_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut shoal = command(dir.path(), 1);
    // The small profile's superblock holds 256 groups: room for the topic and the metadata.
    shoal.env("SHOAL_SHARD_GROUPS_MAX", "10240");
    let server = start_command(shoal);
    let pid = server.pid().expect("running");
    let metrics = server.metrics().expect("metrics endpoint").to_string();
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    let (disk_before, memory_before) = (disk_bytes(dir.path()), resident_bytes(pid));

    let refused = client.create_topic("s", "too-many", PARTITIONS + 1, Durability::Persisted);
    assert_eq!(refused.error(), ErrorCode::InvalidArgument);
    let reason = String::from_utf8_lossy(&refused.body).into_owned();
    assert!(reason.contains("topic_partitions_max"), "{reason}");

    let started = Instant::now();
    client.create_topic("s", "wide", PARTITIONS, Durability::Persisted).ok();
    // The shard creates the groups once the catalog reaches it: wait for all of them (and
    // the metadata group).
    while groups(&metrics) < u64::from(PARTITIONS) + 1 {
        assert!(started.elapsed() < DEADLINE, "groups not created within {DEADLINE:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    eprintln!("{PARTITIONS} partitions created in {:?}", started.elapsed());

    let disk_per_partition = disk_bytes(dir.path()).saturating_sub(disk_before) / 10_000;
    let memory_per_partition = resident_bytes(pid).saturating_sub(memory_before) / 10_000;
    eprintln!(
        "per idle partition: {disk_per_partition} B of disk, {memory_per_partition} B of memory"
    );
    assert!(disk_per_partition <= IDLE_PARTITION_BYTES_MAX, "{disk_per_partition} B of disk");
    assert!(memory_per_partition <= IDLE_PARTITION_BYTES_MAX, "{memory_per_partition} B of memory");

    // They work: a few of them take a message and give it back.
    for partition in [0, 4_999, PARTITIONS - 1] {
        client.produce("s", "wide", partition, &[b"hello"]);
        let (_, records) = client.fetch("s", "wide", partition, FetchFrom::Offset(0), 10);
        assert_eq!(records, [(0, b"hello".to_vec())], "partition {partition}");
    }
}
