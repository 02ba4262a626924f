//! The engine on real files through io_uring (direct and buffered I/O): round trips across a
//! restart, and the crash and corruption scenarios of `crash_sim.rs` staged by damaging files
//! between runs — a flipped byte before the checkpoint is reported, never truncated away; a torn
//! tail is cut, and a `persisted` group gets its prepares back from the journal.

mod common;

use std::path::Path;

use shoal_engine::direct::PersistedPath;
use shoal_engine::record::build_prepare;
use shoal_engine::shard::{RecoveryReport, ShardConfig, ShardStore, group_dir};
use shoal_engine::storage::Storage;
use shoal_engine::storage::uring::{UringStorage, runtime};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_proto::batch::BatchBuilder;
use shoal_proto::wire::Prepare;

const PERSISTED: u64 = 1;
const REPLICATED: u64 = 2;

const RECORD_BYTES_MAX: u32 = 64 << 10;

fn group_config(durability: Durability) -> GroupConfig {
    common::group_config(durability, RECORD_BYTES_MAX)
}

fn body(op: u64, len: usize) -> bytes::Bytes {
    let mut builder = BatchBuilder::new(op as i64);
    let value: Vec<u8> = (0..len).map(|i| (i as u64 * 7 + op) as u8).collect();
    builder.push(op as i64, Some(b"key"), Some(&value), &[]);
    builder.build()
}

fn append(shard: &mut ShardStore<UringStorage>, group: u64, count: u64, len: usize) {
    for _ in 0..count {
        let next = shard.next(group).unwrap();
        let body = body(next.op, len);
        let fields =
            Prepare { record_count: 1, append_time_ms: next.op as i64, ..Prepare::default() };
        let header = build_prepare(&next, 1, 0, fields, &body);
        shard.append(group, &header, &body).unwrap();
    }
}

async fn open(storage: UringStorage, dir: &Path) -> (ShardStore<UringStorage>, RecoveryReport) {
    ShardStore::open(storage, dir, ShardConfig::small()).await.unwrap()
}

/// Every `persisted` prepare through the shard journal: for the tests about the journal.
async fn open_journal(
    storage: UringStorage,
    dir: &Path,
) -> (ShardStore<UringStorage>, RecoveryReport) {
    let config = ShardConfig { persisted_path: PersistedPath::Journal, ..ShardConfig::small() };
    ShardStore::open(storage, dir, config).await.unwrap()
}

/// The last nonzero byte of a segment's data (its sync-mark trailer, past the data's limit,
/// left out).
fn data_used(bytes: &[u8]) -> usize {
    let segment_size = group_config(Durability::Persisted).segment_size_bytes;
    let limit = (segment_size.next_multiple_of(4096) + 4096) as usize;
    bytes[..bytes.len().min(limit)].iter().rposition(|&b| b != 0).unwrap()
}

/// Writes 400 prepares of ~3 KiB into each group (several segments) and closes cleanly.
async fn populate(storage: UringStorage, dir: &Path) {
    let (mut shard, _) = open(storage, dir).await;
    shard.create_group(PERSISTED, group_config(Durability::Persisted)).await.unwrap();
    shard.create_group(REPLICATED, group_config(Durability::Replicated)).await.unwrap();
    for _ in 0..40 {
        append(&mut shard, PERSISTED, 10, 3000);
        append(&mut shard, REPLICATED, 10, 3000);
        let report = shard.flush().await.unwrap();
        assert!(report.failed.is_empty(), "{report:?}");
    }
    shard.close().await.unwrap();
}

async fn assert_reads_back(shard: &mut ShardStore<UringStorage>, group: u64, ops: u64) {
    assert_reads_back_len(shard, group, ops, 3000).await;
}

async fn assert_reads_back_len(
    shard: &mut ShardStore<UringStorage>,
    group: u64,
    ops: u64,
    len: usize,
) {
    let log = shard.group_mut(group).unwrap();
    assert_eq!(log.head_op(), ops);
    let all = log.read_offset(0, usize::MAX).await.unwrap();
    assert_eq!(all.len() as u64, ops);
    for prepare in &all {
        assert_eq!(prepare.body(), body(prepare.op(), len), "op {}", prepare.op());
    }
}

#[test]
fn round_trip_across_restart_direct_and_buffered() {
    for storage in [UringStorage::new(), UringStorage::buffered()] {
        let dir = tempfile::tempdir().unwrap();
        let shard_dir = dir.path().join("shard-0");
        runtime().block_on(async {
            populate(storage.clone(), &shard_dir).await;
            let (mut shard, report) = open(storage, &shard_dir).await;
            assert!(report.groups.iter().all(|g| g.corruption.is_none() && g.torn_tail.is_none()));
            assert_reads_back(&mut shard, PERSISTED, 400).await;
            assert_reads_back(&mut shard, REPLICATED, 400).await;
            assert!(shard.group(PERSISTED).unwrap().segment_count() > 1, "rolled");
        });
    }
}

/// The file-system form on real files: the sync runs on the backend's sync thread, several
/// groups' cycles are acknowledged by it, and everything reads back after a restart. A file
/// system without the form refuses it at open, with a message naming the choices.
#[test]
fn filesystem_form_acknowledges_several_groups_with_one_sync_per_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let shard_dir = dir.path().join("shard-0");
    let config = ShardConfig { persisted_path: PersistedPath::Filesystem, ..ShardConfig::small() };
    runtime().block_on(async {
        let opened = ShardStore::open(UringStorage::new(), &shard_dir, config.clone()).await;
        if !UringStorage::new().filesystem_sync_supported(&shard_dir) {
            let error = opened.err().expect("refused").to_string();
            assert!(error.contains("syncfs") && error.contains("\"auto\""), "{error}");
            return;
        }
        let (mut shard, _) = opened.unwrap();
        for group in 1..=4 {
            shard.create_group(group, group_config(Durability::Persisted)).await.unwrap();
        }
        for round in 1..=10 {
            for group in 1..=4 {
                append(&mut shard, group, 3, 3000);
            }
            let report = shard.flush().await.unwrap();
            assert!(report.failed.is_empty(), "{report:?}");
            for group in 1..=4 {
                assert_eq!(shard.durable_op(group), Some(round * 3), "acknowledged by the sync");
            }
        }
        let counters = shard.counters();
        assert_eq!(counters.filesystem_syncs, 10, "{counters:?}");
        assert_eq!(counters.journal_syncs, 0, "{counters:?}");
        drop(shard);
        let (mut shard, report) =
            ShardStore::open(UringStorage::new(), &shard_dir, config).await.unwrap();
        assert!(report.groups.iter().all(|g| g.corruption.is_none()), "{report:?}");
        for group in 1..=4 {
            assert_reads_back(&mut shard, group, 30).await;
        }
    });
}

/// The segment files of a group, oldest first.
fn segments(shard_dir: &Path, group: u64) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(group_dir(shard_dir, group))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
        .collect();
    files.sort();
    files
}

#[test]
fn corrupt_byte_before_checkpoint_is_reported_not_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let shard_dir = dir.path().join("shard-0");
    runtime().block_on(async {
        populate(UringStorage::new(), &shard_dir).await;
        for group in [PERSISTED, REPLICATED] {
            // The middle of the last segment: before the checkpoint that close() recorded.
            let last = segments(&shard_dir, group).pop().unwrap();
            let mut bytes = std::fs::read(&last).unwrap();
            let used = data_used(&bytes);
            let flip = used / 2;
            bytes[flip] ^= 0x40;
            std::fs::write(&last, &bytes).unwrap();
        }
        let before: Vec<Vec<u8>> = [PERSISTED, REPLICATED]
            .iter()
            .flat_map(|&g| segments(&shard_dir, g))
            .map(|path| std::fs::read(path).unwrap())
            .collect();
        let (mut shard, report) = open(UringStorage::new(), &shard_dir).await;
        for recovery in &report.groups {
            let corruption = recovery.corruption.as_ref().unwrap_or_else(|| {
                panic!("group {}: corruption must be reported: {recovery:?}", recovery.group)
            });
            assert!(corruption.file.to_string_lossy().ends_with(".log"), "{corruption}");
            assert!(corruption.offset.is_some(), "names the offset: {corruption}");
        }
        // The partition refuses service instead of serving around the damage...
        assert!(shard.group_mut(PERSISTED).unwrap().read_offset(0, 1).await.is_err());
        drop(shard);
        // ...and nothing was truncated or rewritten.
        let after: Vec<Vec<u8>> = [PERSISTED, REPLICATED]
            .iter()
            .flat_map(|&g| segments(&shard_dir, g))
            .map(|path| std::fs::read(path).unwrap())
            .collect();
        assert_eq!(before, after, "recovery must never truncate corruption away");
    });
}

#[test]
fn crash_torn_tail_is_cut_and_persisted_prepares_come_back_from_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let shard_dir = dir.path().join("shard-0");
    runtime().block_on(async {
        let (mut shard, _) = open_journal(UringStorage::new(), &shard_dir).await;
        shard.create_group(PERSISTED, group_config(Durability::Persisted)).await.unwrap();
        shard.create_group(REPLICATED, group_config(Durability::Replicated)).await.unwrap();
        // Large enough that the persisted group's deferred segment write is due in the flush.
        const LEN: usize = 15_000;
        append(&mut shard, PERSISTED, 5, LEN);
        append(&mut shard, REPLICATED, 5, LEN);
        shard.close().await.unwrap();
        let (mut shard, _) = open_journal(UringStorage::new(), &shard_dir).await;
        append(&mut shard, PERSISTED, 20, LEN);
        append(&mut shard, REPLICATED, 20, LEN);
        let report = shard.flush().await.unwrap();
        assert!(report.durable.contains(&(PERSISTED, 25)), "{report:?}");
        // The process dies here (no close): then the tail of each segment is torn.
        drop(shard);
        for group in [PERSISTED, REPLICATED] {
            let last = segments(&shard_dir, group).pop().unwrap();
            let mut bytes = std::fs::read(&last).unwrap();
            let used = data_used(&bytes);
            for byte in &mut bytes[used - 20_000..used - 19_000] {
                *byte ^= 0xff;
            }
            std::fs::write(&last, &bytes).unwrap();
        }
        let (mut shard, report) = open_journal(UringStorage::new(), &shard_dir).await;
        for recovery in &report.groups {
            assert!(recovery.corruption.is_none(), "a torn tail is not corruption: {recovery:?}");
            assert!(recovery.torn_tail.is_some(), "{recovery:?}");
        }
        let persisted = report.groups.iter().find(|g| g.group == PERSISTED).unwrap();
        assert!(persisted.journal_replayed > 0);
        // The damaged record's op is reported, and the replay reached past it: nothing there
        // can be owed (a node with peers holds faulty only what the replay did not bring back).
        assert!(
            persisted.torn_record_op.is_some_and(|op| op <= persisted.head_op),
            "{persisted:?}"
        );
        assert_reads_back_len(&mut shard, PERSISTED, 25, LEN).await;
        let replicated = report.groups.iter().find(|g| g.group == REPLICATED).unwrap();
        assert!(replicated.head_op < 25 && replicated.head_op >= 5);
        assert_eq!(replicated.torn_record_op, Some(replicated.head_op + 1), "{replicated:?}");
        assert_eq!(replicated.faulty.suffix_from, Some(replicated.head_op + 1));
        assert_reads_back_len(&mut shard, REPLICATED, replicated.head_op, LEN).await;
    });
}

/// Retention on real files: a retired segment's file (its inode) becomes a later segment, the
/// log reads back after a crash of the process and after a close, and the reopen zeroes what
/// lies past the data (by `fallocate` zero-range where ext4 allows) so `shoal-inspect`'s checker
/// finds the data directory clean.
#[test]
fn retired_segments_are_recycled_on_real_files() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let shard_dir = dir.path().join("shard-0");
    let inodes = |files: &[std::path::PathBuf]| -> Vec<u64> {
        files.iter().map(|path| std::fs::metadata(path).unwrap().ino()).collect()
    };
    runtime().block_on(async {
        let storage = UringStorage::new();
        let (mut shard, _) = open(storage.clone(), &shard_dir).await;
        let config =
            GroupConfig { retention_bytes: 2 << 20, ..group_config(Durability::Replicated) };
        shard.create_group(REPLICATED, config).await.unwrap();
        let mut retired_inodes = Vec::new();
        for _ in 0..150 {
            append(&mut shard, REPLICATED, 10, 3000);
            let report = shard.flush().await.unwrap();
            assert!(report.failed.is_empty(), "{report:?}");
            let before = inodes(&segments(&shard_dir, REPLICATED));
            shard.enforce_retention(0).await.unwrap();
            let after = inodes(&segments(&shard_dir, REPLICATED));
            retired_inodes.extend(before.into_iter().filter(|inode| !after.contains(inode)));
        }
        assert!(shard.counters().segments_recycled >= 2, "{:?}", shard.counters());
        let live = inodes(&segments(&shard_dir, REPLICATED));
        assert!(
            live.iter().any(|inode| retired_inodes.contains(inode)),
            "a live segment is a retired one's file: live {live:?}, retired {retired_inodes:?}"
        );
        let ops = shard.group(REPLICATED).unwrap().head_op();
        drop(shard);
        for close in [false, true] {
            let (mut shard, report) = open(storage.clone(), &shard_dir).await;
            for group in &report.groups {
                assert!(group.corruption.is_none() && group.torn_tail.is_none(), "{group:?}");
            }
            let log = shard.group_mut(REPLICATED).unwrap();
            assert_eq!(log.head_op(), ops);
            let first = log.first_offset();
            assert!(first > 0);
            let all = log.read_offset(first, usize::MAX).await.unwrap();
            assert_eq!(all.len() as u64, ops - first);
            for prepare in &all {
                assert_eq!(prepare.body(), body(prepare.op(), 3000), "op {}", prepare.op());
            }
            if close {
                shard.close().await.unwrap();
            }
        }
    });
    let report = shoal_engine::storage::std_fs::block_on(shoal_engine::inspect::inspect(
        &shoal_engine::storage::std_fs::StdStorage,
        dir.path(),
    ));
    assert!(report.is_clean(), "{:#?}", report.problems);
}
