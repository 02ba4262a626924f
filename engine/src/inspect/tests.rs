//! Tests of the checker on shards the engine built on the simulated disk, then damaged.

use std::path::Path;

use bytes::Bytes;

use super::superblock::SUPERBLOCK_OFF_SLOTS_MAX;
use super::{IndexStatus, InspectReport, SegmentReport, inspect};
use crate::direct::PersistedPath;
use crate::record::build_prepare;
use crate::shard::{ShardConfig, ShardStore, group_dir, shard_dir};
use crate::storage::sim::{Sim, SimConfig, SimStorage};
use crate::storage::{BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile};
use crate::superblock::{self, COPIES, Durability, GroupConfig};
use crate::wire::{HEADER_SIZE, Header, Prepare};
use shoal_proto::batch::BatchBuilder;

const GROUP: u64 = 3;

/// The small profile with every `persisted` prepare through the journal, whose checks these
/// tests are about.
fn journal_config() -> ShardConfig {
    ShardConfig { persisted_path: PersistedPath::Journal, ..ShardConfig::small() }
}

/// Builds `/data/shard-0` with one group of `prepares` prepares (5 records each), closed
/// cleanly (so everything is checkpointed).
fn build(sim: &Sim, durability: Durability, prepares: u32) {
    let dir = shard_dir(Path::new("/data"), 0);
    let (mut shard, _) =
        sim.block_on(ShardStore::open(sim.storage(), &dir, journal_config())).unwrap();
    let config = GroupConfig {
        durability,
        segment_size_bytes: 1 << 20,
        record_size_bytes_max: 64 << 10,
        ..GroupConfig::default()
    };
    sim.block_on(shard.create_group(GROUP, config)).unwrap();
    for i in 0..prepares {
        let mut builder = BatchBuilder::new(1_000 + i64::from(i));
        for _ in 0..5 {
            builder.push(1_000 + i64::from(i), None, Some(&[b'x'; 2000]), &[]);
        }
        let body = builder.build();
        let fields =
            Prepare { record_count: 5, append_time_ms: 1_000 + i64::from(i), ..Prepare::default() };
        let header = build_prepare(&shard.next(GROUP).unwrap(), 1, 0, fields, &body);
        shard.append(GROUP, &header, &body).unwrap();
        if i % 16 == 15 {
            sim.block_on(shard.flush()).unwrap();
        }
    }
    sim.block_on(shard.flush()).unwrap();
    sim.block_on(shard.close()).unwrap();
}

/// Appends `count` empty prepares to `GROUP`, each flushed on its own; returns their sizes.
fn append_empty_flushing_each(
    sim: &Sim,
    shard: &mut ShardStore<SimStorage>,
    count: i64,
) -> Vec<u32> {
    let mut sizes = Vec::new();
    for i in 0..count {
        let body = BatchBuilder::new(i).build();
        let fields = Prepare { record_count: 0, append_time_ms: 5_000, ..Prepare::default() };
        let header = build_prepare(&shard.next(GROUP).unwrap(), 1, 0, fields, &body);
        shard.append(GROUP, &header, &body).unwrap();
        sim.block_on(shard.flush()).unwrap();
        sizes.push(header.size);
    }
    sizes
}

fn run(sim: &Sim, path: &str) -> InspectReport {
    sim.block_on(inspect(&sim.storage(), Path::new(path)))
}

#[test]
fn clean_shard_on_the_simulated_disk_is_clean() {
    for durability in [Durability::Replicated, Durability::Persisted] {
        let sim = Sim::new(11, SimConfig::default());
        build(&sim, durability, 300);
        let report = run(&sim, "/data");
        assert!(report.is_clean(), "{:#?}", report.problems);
        assert_eq!(report.shards.len(), 1);
        let shard = &report.shards[0];
        assert_eq!(shard.superblock.copies.len(), COPIES);
        assert!(shard.superblock.copies.iter().all(|c| c.status.as_ref().unwrap().current));
        let group = &shard.groups[0];
        assert_eq!((group.first_op, group.last_op), (Some(1), Some(300)));
        assert_eq!((group.first_offset, group.next_offset), (Some(0), Some(1500)));
        assert!(group.segments.len() > 1, "300 x ~10 KiB rolls 1 MiB segments");
        for pair in group.segments.windows(2) {
            assert_eq!(pair[0].next_offset, Some(pair[1].base_offset));
            assert_eq!(pair[0].index, IndexStatus::Ok { entries: pair[0].index_entries() });
        }
        let journal = shard.journal.as_ref().unwrap();
        if durability == Durability::Persisted {
            assert!(journal.entries_valid > 0);
        }
        // The same shard inspected through its own directory.
        assert!(run(&sim, "/data/shard-0").is_clean());
    }
}

impl SegmentReport {
    fn index_entries(&self) -> usize {
        match self.index {
            IndexStatus::Ok { entries } | IndexStatus::NotCompared { entries } => entries,
            _ => 0,
        }
    }
}

#[test]
fn bit_flip_before_the_checkpoint_names_file_position_and_offset() {
    let sim = Sim::new(12, SimConfig::default());
    build(&sim, Durability::Replicated, 300);
    let report = run(&sim, "/data");
    let segment = &report.shards[0].groups[0].segments[1];
    let flipped = segment.valid_bytes / 2 + 7;
    sim.corrupt(&segment.file, flipped, 3);
    let report = run(&sim, "/data");
    assert!(!report.is_clean());
    let first = report.first_corruption().unwrap();
    assert_eq!(first.file, segment.file);
    assert!(first.position_bytes <= flipped && flipped - first.position_bytes < 64 << 10);
    let offset = first.offset.unwrap();
    assert!((segment.base_offset..segment.next_offset.unwrap()).contains(&offset));
    // Stepping over the damaged record keeps the rest of the log checked and reported.
    let group = &report.shards[0].groups[0];
    assert_eq!(group.last_op, Some(300));
    assert_eq!(report.problems.len(), 1, "{:#?}", report.problems);
}

#[test]
fn one_torn_superblock_copy_is_a_problem_but_the_state_is_still_read() {
    for copy in 0..COPIES as u64 {
        let sim = Sim::new(13, SimConfig::default());
        build(&sim, Durability::Persisted, 20);
        let path = Path::new("/data/shard-0/superblock");
        let copy_size = superblock::copy_size_bytes(ShardConfig::small().groups_max) as u64;
        sim.corrupt(path, copy * copy_size + 30, 0);
        let report = run(&sim, "/data");
        let superblock = &report.shards[0].superblock;
        assert_eq!(superblock.copy_size_bytes, copy_size, "copy {copy}");
        assert!(superblock.state.is_some());
        assert_eq!(report.problems.len(), 1, "{:#?}", report.problems);
        assert_eq!(report.problems[0].position_bytes, copy * copy_size);
        assert!(report.problems[0].reason.contains(&format!("copy {copy} invalid")));
        assert_eq!(report.shards[0].groups[0].last_op, Some(20));
    }
}

/// On the direct path the segment sync acknowledges: damage to an op a sync mark names is a
/// problem past the checkpoint too, as recovery sees it.
#[test]
fn ops_a_sync_mark_names_past_the_checkpoint_must_be_there() {
    let sim = Sim::new(17, SimConfig::default());
    build(&sim, Durability::Persisted, 10);
    let dir = shard_dir(Path::new("/data"), 0);
    let config = ShardConfig { persisted_path: PersistedPath::Direct, ..ShardConfig::small() };
    let (mut shard, _) = sim.block_on(ShardStore::open(sim.storage(), &dir, config)).unwrap();
    let positions = append_empty_flushing_each(&sim, &mut shard, 5);
    assert!(shard.counters().direct_syncs >= 5);
    drop(shard);
    let report = run(&sim, "/data");
    assert!(report.is_clean(), "{:#?}", report.problems);
    // The segment's last 5 records are ops 11..=15; op 12 lies past the checkpoint (op 10).
    let segment = group_dir(&dir, GROUP).join(crate::segment::log_name(0));
    let bytes = sim.file_contents(&segment).unwrap();
    let limit = (1u64 << 20).next_multiple_of(BLOCK_SIZE_BYTES as u64) + BLOCK_SIZE_BYTES as u64;
    let data = &bytes[..bytes.len().min(limit as usize)];
    let end = data.iter().rposition(|&b| b != 0).unwrap() + 1;
    let tail: u32 = positions[1..].iter().sum();
    let op_12 = end as u64 - u64::from(tail);
    sim.corrupt(&segment, op_12 + HEADER_SIZE as u64 + 4, 1);
    let report = run(&sim, "/data");
    assert!(!report.is_clean(), "a synced op the mark names is damaged");
}

#[test]
fn synced_journal_entries_past_the_checkpoint_must_be_there() {
    let sim = Sim::new(16, SimConfig::default());
    build(&sim, Durability::Persisted, 10);
    let dir = shard_dir(Path::new("/data"), 0);
    let (mut shard, _) =
        sim.block_on(ShardStore::open(sim.storage(), &dir, journal_config())).unwrap();
    // One journal cycle each; a cycle is known synced once a later entry (or marker) says so.
    append_empty_flushing_each(&sim, &mut shard, 5);
    drop(shard);
    let report = run(&sim, "/data");
    assert!(report.is_clean(), "{:#?}", report.problems);
    let journal = report.shards[0].journal.clone().unwrap();
    assert_eq!(journal.groups[0].last_op, 15);
    let path = dir.join("journal");
    let bytes = sim.file_contents(&path).unwrap();
    // The entry framing op 11 (the clean close before wrote a marker entry just before it).
    let cycle_of_op_11 = (0..bytes.len() / BLOCK_SIZE_BYTES)
        .map(|block| block * BLOCK_SIZE_BYTES)
        .find(|&at| {
            let framed = Header::decode_prefix(&bytes[at..])
                .is_ok_and(|h| h.as_journal_entry().is_some())
                && bytes.len() >= at + 2 * HEADER_SIZE;
            framed
                && Header::decode_prefix(&bytes[at + HEADER_SIZE..])
                    .is_ok_and(|inner| inner.as_prepare().is_some_and(|p| p.op == 11))
        })
        .unwrap();
    sim.corrupt(&path, cycle_of_op_11 as u64 + 100, 1);
    let report = run(&sim, "/data");
    let first = report.first_corruption().expect("a synced, needed entry is gone");
    assert_eq!(first.file, path);
    assert!(first.reason.contains("was synced but is missing"), "{first}");
}

#[test]
fn superblock_header_layout_is_pinned() {
    let sim = Sim::new(14, SimConfig::default());
    build(&sim, Durability::Replicated, 1);
    let bytes = sim.file_contents(Path::new("/data/shard-0/superblock")).unwrap();
    let at = SUPERBLOCK_OFF_SLOTS_MAX;
    let slots_max = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!(slots_max as usize, ShardConfig::small().groups_max);
}

#[test]
fn garbage_and_missing_files_are_reported_never_panicked_on() {
    let sim = Sim::new(15, SimConfig::default());
    build(&sim, Durability::Persisted, 40);
    let storage: SimStorage = sim.storage();
    let mut rng = crate::rng::Rng::new(99);
    let garbage: Vec<u8> = (0..300_000).map(|_| rng.next_u64() as u8).collect();
    let dir = group_dir(&shard_dir(Path::new("/data"), 0), GROUP);
    for name in ["00000000000009999999.log", "00000000000009999999.index", "stray"] {
        let garbage = Bytes::from(garbage.clone());
        sim.block_on(async {
            let file =
                storage.open(&dir.join(name), OpenMode::CreateReadWrite, false).await.unwrap();
            file.write_at(garbage, 0).await.unwrap();
            file.sync_data().await.unwrap();
            storage.sync_dir(&dir).await.unwrap();
        });
    }
    let report = run(&sim, "/data");
    // Past the checkpoint, a garbage segment is a leftover the chain never reaches.
    assert!(report.is_clean(), "{:#?}", report.problems);
    assert!(report.notes.iter().any(|n| n.file.ends_with("00000000000009999999.log")));
    // Journal entries lost under garbage, but all covered by the close's checkpoints.
    let journal = Path::new("/data/shard-0/journal");
    sim.block_on(async {
        let file = storage.open(journal, OpenMode::ReadWrite, false).await.unwrap();
        file.write_at(Bytes::from(garbage.clone()), 0).await.unwrap();
        file.sync_data().await.unwrap();
    });
    let report = run(&sim, "/data");
    assert!(report.is_clean(), "{:#?}", report.problems);
    assert!(report.notes.iter().any(|n| n.file == journal && n.message.contains("cover")));
    // A record with valid checksums whose op and offset sit at the end of the u64 range,
    // in a directory the superblock does not name (so nothing bounds the chain's start).
    let hostile = Prepare {
        group: 77,
        op: u64::MAX,
        base_offset: u64::MAX - 1,
        record_count: 9,
        ..Prepare::default()
    };
    let header = Header::prepare(0, 1, 0, hostile, b"body");
    let mut record = header.encode().to_vec();
    record.extend_from_slice(b"body");
    let orphan = group_dir(&shard_dir(Path::new("/data"), 0), 77);
    sim.block_on(async {
        storage.create_dir_all(&orphan).await.unwrap();
        let path = orphan.join(crate::segment::log_name(u64::MAX - 1));
        let file = storage.open(&path, OpenMode::CreateReadWrite, false).await.unwrap();
        file.write_at(Bytes::from(record), 0).await.unwrap();
        file.sync_data().await.unwrap();
    });
    let report = run(&sim, "/data");
    assert!(report.shards[0].groups.iter().any(|g| g.group == 77));
    assert!(run(&sim, "/nowhere").error.is_some());
    assert!(run(&sim, "/data/shard-0/journal").error.is_some());
}
