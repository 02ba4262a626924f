//! Power loss on real files (DESIGN.md §6: `kill -9` proves process-crash safety only): a
//! workload runs on the io_uring backend with the write recorder on; then, for many crash points
//! and seeds, a post-crash image is rebuilt from the recorded writes — everything synced before
//! the point, plus any subset of the unsynced writes, each possibly torn at 512-byte sectors —
//! and reopened with the real engine. Every `persisted` append acknowledged before the point
//! must be there, byte-identical; nothing torn may be served; offsets stay dense.
//!
//! Directory entries are taken as durable here (the simulated disk covers their crash rules).
#![cfg(feature = "write-recorder")]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use shoal_engine::direct::PersistedPath;
use shoal_engine::record::build_prepare;
use shoal_engine::rng::Rng;
use shoal_engine::shard::{ShardConfig, ShardStore};
use shoal_engine::storage::Storage;
use shoal_engine::storage::uring::recorder::{Event, Recorder};
use shoal_engine::storage::uring::{UringStorage, runtime};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_proto::wire::Prepare;

const PERSISTED: u64 = 1;
const REPLICATED: u64 = 2;
const SECTOR_BYTES: usize = 512;

fn config(persisted_path: PersistedPath) -> ShardConfig {
    ShardConfig {
        persisted_path,
        journal_size_bytes: 1 << 20,
        checkpoint_interval_bytes: 128 << 10,
        ready_ahead_bytes: 64 << 10,
        ..ShardConfig::small()
    }
}

const RECORD_BYTES_MAX: u32 = 32 << 10;

fn group_config(durability: Durability) -> GroupConfig {
    common::group_config(durability, RECORD_BYTES_MAX)
}

fn body(group: u64, op: u64) -> Bytes {
    let len = 500 + (op * 1237 % 9000) as usize;
    (0..len).map(|i| (i as u64 ^ op ^ (group << 4)) as u8).collect::<Vec<u8>>().into()
}

/// Runs the workload in `dir`; returns the recorded events and, per ack, (events recorded so
/// far, durable op of the persisted group).
fn record_workload(dir: &Path, path: PersistedPath) -> (Vec<Event>, Vec<(usize, u64)>) {
    let recorder = Recorder::default();
    let storage = UringStorage::new().with_recorder(recorder.clone());
    let mut acks = Vec::new();
    runtime().block_on(async {
        let (mut shard, _) = ShardStore::open(storage, dir, config(path)).await.unwrap();
        shard.create_group(PERSISTED, group_config(Durability::Persisted)).await.unwrap();
        shard.create_group(REPLICATED, group_config(Durability::Replicated)).await.unwrap();
        for round in 0..60u64 {
            for group in [PERSISTED, REPLICATED] {
                for _ in 0..1 + round % 4 {
                    let next = shard.next(group).unwrap();
                    let body = body(group, next.op);
                    let fields = Prepare {
                        record_count: 1,
                        append_time_ms: round as i64,
                        ..Prepare::default()
                    };
                    shard.append(group, &build_prepare(&next, 1, 0, fields, &body), &body).unwrap();
                }
            }
            let report = shard.flush().await.unwrap();
            assert!(report.failed.is_empty());
            if let Some(op) = shard.durable_op(PERSISTED) {
                acks.push((recorder.events().len(), op));
            }
        }
    });
    (recorder.events(), acks)
}

/// The files as a power loss after `events[..cut]` might leave them.
fn image(events: &[Event], cut: usize, rng: &mut Rng) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut durable: BTreeMap<PathBuf, Vec<u8>> = BTreeMap::new();
    let mut pending: BTreeMap<PathBuf, Vec<(u64, Bytes)>> = BTreeMap::new();
    // A handle keeps writing to its file after a rename; the recorder names the handle's path.
    let mut renamed: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
    for event in &events[..cut] {
        let resolve = |path: &PathBuf| renamed.get(path).cloned().unwrap_or_else(|| path.clone());
        match event {
            Event::Create { path } => {
                durable.entry(resolve(path)).or_default();
            }
            Event::Write { path, offset_bytes, data } => {
                let path = resolve(path);
                durable.entry(path.clone()).or_default();
                pending.entry(path).or_default().push((*offset_bytes, data.clone()));
            }
            Event::Sync { path } => {
                let path = resolve(path);
                let file = durable.entry(path.clone()).or_default();
                for (offset, data) in pending.remove(&path).unwrap_or_default() {
                    apply(file, offset, &data);
                }
            }
            Event::Remove { path } => {
                durable.remove(path);
                pending.remove(path);
            }
            Event::RemoveDir { .. } => {}
            Event::Rename { from, to } => {
                renamed.insert(from.clone(), to.clone());
                if let Some(file) = durable.remove(from) {
                    durable.insert(to.clone(), file);
                }
                if let Some(writes) = pending.remove(from) {
                    pending.insert(to.clone(), writes);
                }
            }
            Event::SyncDir { .. } => {}
            Event::SyncFilesystem => {
                for (path, writes) in std::mem::take(&mut pending) {
                    let file = durable.entry(path).or_default();
                    for (offset, data) in writes {
                        apply(file, offset, &data);
                    }
                }
            }
        }
    }
    for (path, writes) in pending {
        let file = durable.entry(path).or_default();
        for (offset, data) in writes {
            if rng.chance(1, 2) {
                continue;
            }
            if data.len() > SECTOR_BYTES && rng.chance(1, 3) {
                for (index, sector) in data.chunks(SECTOR_BYTES).enumerate() {
                    if rng.chance(1, 2) {
                        apply(file, offset + (index * SECTOR_BYTES) as u64, sector);
                    }
                }
            } else {
                apply(file, offset, &data);
            }
        }
    }
    durable
}

fn apply(file: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let end = offset as usize + data.len();
    if file.len() < end {
        file.resize(end, 0);
    }
    file[offset as usize..end].copy_from_slice(data);
}

#[test]
fn crash_images_rebuilt_from_recorded_writes_keep_every_acknowledged_append() {
    check_crash_images(PersistedPath::Auto);
}

/// The direct path's file-system form: the cycle's one `syncfs` is what acknowledges.
#[test]
fn crash_images_of_the_filesystem_form_keep_every_acknowledged_append() {
    check_crash_images(PersistedPath::Filesystem);
}

fn check_crash_images(path: PersistedPath) {
    let source = tempfile::tempdir().unwrap();
    let source_shard = source.path().join("shard-0");
    if path == PersistedPath::Filesystem
        && !UringStorage::new().filesystem_sync_supported(source.path())
    {
        eprintln!("post_crash_images: the temporary directory's file system has no syncfs form");
        return;
    }
    let (events, acks) = record_workload(&source_shard, path);
    if path == PersistedPath::Filesystem {
        assert!(events.iter().any(|event| matches!(event, Event::SyncFilesystem)));
    }
    let writes = events.iter().filter(|event| matches!(event, Event::Write { .. })).count();
    assert!(writes > 200, "the workload must write: {writes}");
    let mut rng = Rng::new(7);
    let mut images = 0;
    for trial in 0..40 {
        let cut = 1 + rng.below(events.len() as u64) as usize;
        let acked = acks.iter().filter(|(at, _)| *at <= cut).map(|(_, op)| *op).max().unwrap_or(0);
        let files = image(&events, cut, &mut rng);
        let target = tempfile::tempdir().unwrap();
        for (path, contents) in &files {
            let relative = path.strip_prefix(source.path()).unwrap();
            let destination = target.path().join(relative);
            std::fs::create_dir_all(destination.parent().unwrap()).unwrap();
            std::fs::write(destination, contents).unwrap();
        }
        let shard_dir = target.path().join("shard-0");
        if !shard_dir.join("superblock").exists() {
            continue;
        }
        images += 1;
        runtime().block_on(async {
            let opened = ShardStore::open(UringStorage::new(), &shard_dir, config(path)).await;
            let (mut shard, report) =
                opened.unwrap_or_else(|e| panic!("trial {trial} cut {cut}: {e}"));
            for group in &report.groups {
                assert!(
                    group.corruption.is_none(),
                    "trial {trial}: a crash is not corruption: {group:?}"
                );
            }
            if let Some(log) = shard.group_mut(PERSISTED) {
                assert!(
                    log.head_op() >= acked,
                    "trial {trial} cut {cut}: head {} < acked {acked}",
                    log.head_op()
                );
            } else {
                assert_eq!(acked, 0, "trial {trial}: the group's creation was acknowledged");
            }
            for group in [PERSISTED, REPLICATED] {
                let Some(log) = shard.group_mut(group) else { continue };
                let served = log.read_offset(0, usize::MAX).await.unwrap();
                assert_eq!(served.len() as u64, log.head_op());
                let mut offset = 0;
                for prepare in served {
                    assert_eq!(prepare.base_offset(), offset, "trial {trial}: dense offsets");
                    offset = prepare.end_offset();
                    assert_eq!(
                        prepare.body(),
                        body(group, prepare.op()),
                        "trial {trial}: op {}",
                        prepare.op()
                    );
                }
            }
        });
    }
    println!(
        "post_crash_images: {} events, {writes} writes, {images} images reopened",
        events.len()
    );
    assert!(images >= 20, "most crash points must leave a shard to reopen");
}
