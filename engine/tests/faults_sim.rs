//! Faults and bounds on the simulated disk: corruption before the torn window (reported with
//! file, byte position and offset, never truncated), a synced journal entry lost, an I/O error
//! (fail-stop for that group only), and the engine's limits each exercised at their bound. Disk
//! full has its own file, `disk_full_sim.rs`.

mod common;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use shoal_engine::Error;
use shoal_engine::direct::PersistedPath;
use shoal_engine::record::{ChainNext, build_prepare};
use shoal_engine::shard::{RecoveryReport, ShardConfig, ShardStore, group_dir};
use shoal_engine::state::GroupState;
use shoal_engine::storage::sim::{Sim, SimConfig, SimStorage};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_proto::wire::{HEADER_SIZE, Prepare};

const DIR: &str = "/data/shard-0";

const RECORD_BYTES_MAX: u32 = 32 << 10;

fn group_config(durability: Durability) -> GroupConfig {
    common::group_config(durability, RECORD_BYTES_MAX)
}

fn body(op: u64, len: usize) -> Bytes {
    (0..len).map(|i| (i as u64 ^ op.wrapping_mul(31)) as u8).collect::<Vec<u8>>().into()
}

fn try_append(shard: &mut ShardStore<SimStorage>, group: u64, len: usize) -> Result<u64, Error> {
    let next = shard.next(group)?;
    let body = body(next.op, len);
    let fields = Prepare { record_count: 2, append_time_ms: next.op as i64, ..Prepare::default() };
    let header = build_prepare(&next, 1, 0, fields, &body);
    shard.append(group, &header, &body).map(|()| next.op)
}

fn append(shard: &mut ShardStore<SimStorage>, group: u64, count: u64, len: usize) {
    for _ in 0..count {
        try_append(shard, group, len).unwrap();
    }
}

fn open_with(sim: &Sim, config: ShardConfig) -> (ShardStore<SimStorage>, RecoveryReport) {
    sim.block_on(ShardStore::open(sim.storage(), Path::new(DIR), config)).unwrap()
}

fn open(sim: &Sim) -> (ShardStore<SimStorage>, RecoveryReport) {
    open_with(sim, ShardConfig::small())
}

/// Every `persisted` prepare through the shard journal: for the tests about the journal.
fn open_journal(sim: &Sim) -> (ShardStore<SimStorage>, RecoveryReport) {
    open_with(sim, ShardConfig { persisted_path: PersistedPath::Journal, ..ShardConfig::small() })
}

/// Every `persisted` prepare through the direct path's file-system form.
fn open_filesystem(sim: &Sim) -> (ShardStore<SimStorage>, RecoveryReport) {
    let config = ShardConfig { persisted_path: PersistedPath::Filesystem, ..ShardConfig::small() };
    open_with(sim, config)
}

/// The file-system form: one sync makes several groups' cycle durable, and when it fails,
/// nothing it covered is acknowledged and every group it covered stops (fail-stop, as a failed
/// segment sync does), until reopened.
#[test]
fn one_filesystem_sync_acknowledges_every_group_or_none() {
    let sim = Sim::new(31, SimConfig::default());
    let (mut shard, _) = open_filesystem(&sim);
    for group in 1..=3 {
        sim.block_on(shard.create_group(group, group_config(Durability::Persisted))).unwrap();
        append(&mut shard, group, 2, 3000);
    }
    let report = sim.block_on(shard.flush()).unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    let counters = shard.counters();
    assert_eq!(counters.filesystem_syncs, 1, "{counters:?}");
    assert_eq!(counters.direct_syncs, 3, "{counters:?}");
    assert_eq!(counters.journal_syncs, 0, "{counters:?}");
    for group in 1..=3 {
        assert_eq!(shard.durable_op(group), Some(2));
    }
    // The first cycle wrote no marks (nothing synced before); the second writes them, and its
    // sync fails where group 2's segment reports the write-back error.
    sim.fail_next_sync(&segment_files(&sim, 2)[0]);
    for group in 1..=3 {
        append(&mut shard, group, 1, 3000);
    }
    let report = sim.block_on(shard.flush()).unwrap();
    assert_eq!(report.failed.len(), 3, "one sync failed for all: {report:?}");
    assert!(report.failed[0].1.contains("syncing the file system"), "{report:?}");
    for group in 1..=3 {
        assert_eq!(shard.durable_op(group), Some(2), "nothing of the failed cycle is durable");
        assert!(matches!(try_append(&mut shard, group, 10), Err(Error::Faulty { .. })));
    }
    assert_eq!(shard.counters().filesystem_syncs, 1);
    drop(shard);
    let (mut shard, report) = open_filesystem(&sim);
    for group in &report.groups {
        assert!(group.corruption.is_none(), "{group:?}");
        assert!(group.head_op >= 2, "{group:?}");
    }
    for group in 1..=3 {
        try_append(&mut shard, group, 10).unwrap();
    }
}

/// Where a segment's data ends at most (its sync-mark trailer follows).
fn data_limit_bytes() -> u64 {
    let segment_size = group_config(Durability::Persisted).segment_size_bytes;
    segment_size.next_multiple_of(4096) + 4096
}

fn segment_files(sim: &Sim, group: u64) -> Vec<PathBuf> {
    let dir = group_dir(Path::new(DIR), group);
    let mut files: Vec<PathBuf> = sim
        .paths()
        .into_iter()
        .filter(|path| path.parent() == Some(&dir) && path.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    files
}

fn populated(seed: u64, durability: Durability) -> Sim {
    let sim = Sim::new(seed, SimConfig::default());
    let (mut shard, _) = open(&sim);
    sim.block_on(shard.create_group(1, group_config(durability))).unwrap();
    for _ in 0..20 {
        append(&mut shard, 1, 10, 6000);
        sim.block_on(shard.flush()).unwrap();
    }
    sim.block_on(shard.close()).unwrap();
    sim
}

#[test]
fn corrupt_record_in_checkpoint_segment_is_reported_at_recovery_never_truncated() {
    for durability in [Durability::Replicated, Durability::Persisted] {
        let sim = populated(11, durability);
        let last = segment_files(&sim, 1).pop().unwrap();
        let contents = sim.durable_contents(&last).unwrap();
        // The data, not the sync-mark trailer past its limit.
        let data = &contents[..contents.len().min(data_limit_bytes() as usize)];
        let used = data.iter().rposition(|&b| b != 0).unwrap() as u64;
        sim.corrupt(&last, used / 2, 3);
        let damaged = sim.durable_contents(&last).unwrap();
        let (mut shard, report) = open(&sim);
        let corruption = report.groups[0].corruption.clone().expect("reported");
        assert_eq!(corruption.file, last);
        assert!(corruption.position_bytes <= used / 2, "{corruption}");
        assert!(corruption.offset.is_some(), "{corruption}");
        let log = shard.group_mut(1).unwrap();
        assert!(matches!(sim.block_on(log.read_offset(0, 1)), Err(Error::Faulty { .. })));
        drop(shard);
        assert_eq!(sim.durable_contents(&last).unwrap(), damaged, "never truncated or rewritten");
    }
}

#[test]
fn corrupt_record_in_sealed_segment_is_reported_by_the_read_that_meets_it() {
    let sim = populated(12, Durability::Replicated);
    let first = segment_files(&sim, 1).remove(0);
    sim.corrupt(&first, 100_000, 0);
    let (mut shard, report) = open(&sim);
    assert!(report.groups[0].corruption.is_none(), "sealed segments are trusted by their index");
    let log = shard.group_mut(1).unwrap();
    let error = sim.block_on(log.read_offset(0, usize::MAX)).unwrap_err();
    let Error::Corruption(corruption) = error else { panic!("{error}") };
    assert_eq!(corruption.file, first);
    assert!(corruption.position_bytes <= 100_000 && corruption.position_bytes + 7000 > 100_000);
    assert!(corruption.offset.is_some());
    // Fail-stop: the group refuses further reads.
    assert!(matches!(sim.block_on(log.read_offset(0, 1)), Err(Error::Faulty { .. })));
}

/// A read by op stops at the op it wants: damage in the record after it (latent, found by no
/// read yet) does not make it unreadable. The read that meets the damage still reports it.
/// (The simulator's final log check failed reading op 3,000 of a log whose op 3,001 was
/// damaged: five-replica seed 56.)
#[test]
fn a_read_by_op_never_decodes_the_record_after_it() {
    let sim = populated(13, Durability::Replicated);
    let (mut shard, _) = open(&sim);
    let log = shard.group_mut(1).unwrap();
    let records: Vec<usize> = sim
        .block_on(log.read_offset(0, usize::MAX))
        .unwrap()
        .iter()
        .map(|p| p.record.len())
        .collect();
    drop(shard);
    let first = segment_files(&sim, 1).remove(0);
    // Op 5's header checksum, in the first (sealed) segment.
    let op5_position: usize = records[..4].iter().sum();
    sim.corrupt(&first, op5_position as u64, 1);
    let (mut shard, report) = open(&sim);
    assert!(report.groups[0].corruption.is_none(), "sealed segments are trusted by their index");
    let log = shard.group_mut(1).unwrap();
    let op4 = sim.block_on(log.read_op(4)).unwrap().expect("op 4 is whole");
    assert_eq!(op4.op(), 4);
    let error = sim.block_on(log.read_op(5)).unwrap_err();
    let Error::Corruption(corruption) = error else { panic!("{error}") };
    assert_eq!((corruption.file, corruption.position_bytes), (first, op5_position as u64));
}

#[test]
fn corrupt_synced_journal_entry_makes_persisted_suffix_faulty_not_absent() {
    let sim = Sim::new(13, SimConfig::default());
    let (mut shard, _) = open_journal(&sim);
    sim.block_on(shard.create_group(1, group_config(Durability::Persisted))).unwrap();
    for _ in 0..4 {
        append(&mut shard, 1, 3, 5000);
        sim.block_on(shard.flush()).unwrap();
    }
    drop(shard);
    // The first cycle's first entry: synced, and later entries say so.
    sim.corrupt(&Path::new(DIR).join("journal"), 300, 1);
    let (_, report) = open_journal(&sim);
    let corruption = report.journal_corruption.expect("a synced journal entry is gone");
    assert!(corruption.file.ends_with("journal"));
    assert_eq!(report.groups[0].faulty.suffix_from, Some(report.groups[0].head_op + 1));
}

#[test]
fn write_error_stops_only_its_group() {
    let sim = Sim::new(15, SimConfig::default());
    let (mut shard, _) = open(&sim);
    sim.block_on(shard.create_group(1, group_config(Durability::Replicated))).unwrap();
    sim.block_on(shard.create_group(2, group_config(Durability::Replicated))).unwrap();
    append(&mut shard, 1, 2, 100);
    append(&mut shard, 2, 2, 100);
    sim.block_on(shard.flush()).unwrap();
    sim.fail_next_write(&segment_files(&sim, 1)[0]);
    append(&mut shard, 1, 1, 100);
    append(&mut shard, 2, 1, 100);
    let report = sim.block_on(shard.flush()).unwrap();
    assert_eq!(report.failed.len(), 1, "{report:?}");
    assert_eq!(report.failed[0].0, 1);
    assert_eq!(shard.durable_op(2), Some(3));
    assert!(matches!(try_append(&mut shard, 1, 10), Err(Error::Faulty { .. })));
    append(&mut shard, 2, 1, 100);
    sim.block_on(shard.flush()).unwrap();
    assert_eq!(shard.durable_op(2), Some(4));
    // Reopening recovers the failed group (fail-stop until recovered).
    drop(shard);
    let (mut shard, _) = open(&sim);
    try_append(&mut shard, 1, 10).unwrap();
}

#[test]
fn segment_fills_to_exactly_its_size_then_rolls() {
    let sim = Sim::new(16, SimConfig::default());
    let (mut shard, _) = open(&sim);
    sim.block_on(shard.create_group(1, group_config(Durability::Replicated))).unwrap();
    // 32 records of exactly 32 KiB fill a 1 MiB segment to the byte.
    let len = (32 << 10) - HEADER_SIZE;
    for _ in 0..4 {
        append(&mut shard, 1, 8, len);
        sim.block_on(shard.flush()).unwrap();
    }
    assert_eq!(shard.group(1).unwrap().segment_count(), 1);
    assert_eq!(shard.group(1).unwrap().size_bytes(), 1 << 20);
    append(&mut shard, 1, 1, 1);
    assert_eq!(shard.group(1).unwrap().segment_count(), 2);
    sim.block_on(shard.close()).unwrap();
    let (mut shard, _) = open(&sim);
    let log = shard.group_mut(1).unwrap();
    assert_eq!(log.segment_count(), 2);
    assert_eq!(sim.block_on(log.read_offset(0, usize::MAX)).unwrap().len(), 33);
}

#[test]
fn record_larger_than_the_group_bound_is_refused() {
    let sim = Sim::new(17, SimConfig::default());
    let (mut shard, _) = open(&sim);
    sim.block_on(shard.create_group(1, group_config(Durability::Replicated))).unwrap();
    let len = (32 << 10) - HEADER_SIZE;
    try_append(&mut shard, 1, len).unwrap();
    assert!(matches!(try_append(&mut shard, 1, len + 1), Err(Error::Invalid(_))));
    assert_eq!(shard.group(1).unwrap().head_op(), 1, "nothing of the refused record stays");
}

#[test]
fn ring_at_its_entry_and_byte_limits_applies_backpressure_then_evicts_written() {
    let sim = Sim::new(18, SimConfig::default());
    let mut config = ShardConfig::small();
    config.ring.entries_max = 8;
    config.ring.bytes_max = 64 << 10;
    let (mut shard, _) = open_with(&sim, config);
    sim.block_on(shard.create_group(1, group_config(Durability::Replicated))).unwrap();
    append(&mut shard, 1, 8, 100);
    assert!(matches!(try_append(&mut shard, 1, 100), Err(Error::LimitReached(_))), "entries");
    sim.block_on(shard.flush()).unwrap();
    append(&mut shard, 1, 8, 100);
    assert_eq!(shard.group(1).unwrap().ring().len(), 8);
    sim.block_on(shard.flush()).unwrap();
    // Bytes: 64 KiB holds two 30 KiB prepares, not three.
    append(&mut shard, 1, 2, 30_000);
    assert!(matches!(try_append(&mut shard, 1, 30_000), Err(Error::LimitReached(_))), "bytes");
    sim.block_on(shard.flush()).unwrap();
    try_append(&mut shard, 1, 30_000).unwrap();
    // Evicted prepares are read from disk, identical.
    let log = shard.group_mut(1).unwrap();
    let all = sim.block_on(log.read_offset(0, usize::MAX)).unwrap();
    assert_eq!(all.len(), 19);
    for prepare in all {
        assert_eq!(prepare.body(), body(prepare.op(), prepare.body().len()));
    }
}

/// Regression (found by the 64-partition benchmark under retention): the shard's ring budget
/// went to the rings of the groups that wrote first, whose written prepares only their own
/// appends ever evicted, so a group with an empty ring got `LimitReached` for good once the
/// others' written prepares filled the budget. An append takes the room from other rings'
/// written prepares now; only unwritten ones are backpressure.
#[test]
fn the_ring_budget_held_by_written_prepares_of_other_groups_is_taken_back() {
    let sim = Sim::new(24, SimConfig::default());
    let mut config = ShardConfig::small();
    config.ring_budget_bytes = 256 << 10;
    let (mut shard, _) = open_with(&sim, config);
    for group in 1..=3 {
        sim.block_on(shard.create_group(group, group_config(Durability::Replicated))).unwrap();
    }
    // Groups 1 and 2 fill the budget with written prepares.
    for group in 1..=2 {
        append(&mut shard, group, 6, 20_000);
        sim.block_on(shard.flush()).unwrap();
    }
    assert!(shard.ring_bytes() > (256 << 10) - 20_000);
    // Group 3's ring is empty: the room comes from theirs.
    append(&mut shard, 3, 6, 20_000);
    assert!(shard.ring_bytes() <= 256 << 10);
    assert!(shard.counters().ring_bytes_taken_back >= 5 * 20_000);
    sim.block_on(shard.flush()).unwrap();
    // What was taken back is read from the segments, identical.
    for group in 1..=3 {
        let log = shard.group_mut(group).unwrap();
        let all = sim.block_on(log.read_offset(0, usize::MAX)).unwrap();
        assert_eq!(all.len(), 6, "group {group}");
        for prepare in all {
            assert_eq!(prepare.body(), body(prepare.op(), prepare.body().len()));
        }
    }
    // Unwritten prepares are never taken: with the budget full of them, appends wait.
    let mut refused = false;
    for _ in 0..20 {
        if let Err(Error::LimitReached(_)) = try_append(&mut shard, 1, 20_000) {
            refused = true;
            break;
        }
    }
    assert!(refused, "unwritten prepares are backpressure");
    // Refused again and again before a flush, the shard walks the rings once: the first walk
    // found nothing written, and nothing becomes written until a flush finishes.
    let scans = shard.counters().ring_take_back_scans;
    for _ in 0..5 {
        assert!(matches!(try_append(&mut shard, 2, 20_000), Err(Error::LimitReached(_))));
    }
    assert_eq!(shard.counters().ring_take_back_scans, scans, "a futile walk is not repeated");
    sim.block_on(shard.flush()).unwrap();
    try_append(&mut shard, 2, 20_000).unwrap();
    assert_eq!(shard.counters().ring_take_back_scans, scans + 1, "walks again after a flush");
}

#[test]
fn groups_held_prepares_and_journal_have_bounds() {
    let sim = Sim::new(19, SimConfig::default());
    let mut config = ShardConfig::small();
    config.groups_max = 2;
    config.held_prepares_max = 2;
    config.journal_size_bytes = 256 << 10;
    let (mut shard, _) = open_with(&sim, config);
    sim.block_on(shard.create_group(1, group_config(Durability::Persisted))).unwrap();
    sim.block_on(shard.create_group(2, group_config(Durability::Replicated))).unwrap();
    assert!(matches!(
        sim.block_on(shard.create_group(3, group_config(Durability::Replicated))),
        Err(Error::LimitReached(_))
    ));
    // Out-of-order prepares wait in memory, at most two of them.
    let next = shard.next(2).unwrap();
    let mut early = Vec::new();
    for gap in 2..5u64 {
        let future = shoal_engine::record::ChainNext { op: next.op + gap, ..next };
        let body = body(future.op, 10);
        early.push((build_prepare(&future, 1, 0, Prepare::default(), &body), body));
    }
    shard.append_received(2, &early[0].0, &early[0].1).unwrap();
    shard.append_received(2, &early[1].0, &early[1].1).unwrap();
    assert!(matches!(
        shard.append_received(2, &early[2].0, &early[2].1),
        Err(Error::LimitReached(_))
    ));
    assert_eq!(shard.group(2).unwrap().held_count(), 2);
    // The journal refuses entries that would overwrite ones not yet checkpointed; a flush with
    // checkpoints frees it.
    let mut refused = false;
    for _ in 0..200 {
        match try_append(&mut shard, 1, 20_000) {
            Ok(_) => {}
            Err(Error::LimitReached(_)) => {
                refused = true;
                break;
            }
            Err(error) => panic!("{error}"),
        }
    }
    assert!(refused, "the journal is bounded");
    sim.block_on(shard.flush()).unwrap();
    sim.block_on(shard.flush()).unwrap();
    try_append(&mut shard, 1, 20_000).unwrap();
}

/// Regression: a crash while truncating below the checkpoint (between cutting the files and
/// recording the fence) used to look like corruption. The fence is now durable first.
#[test]
fn crash_during_truncation_below_checkpoint_is_not_corruption() {
    for durability in [Durability::Replicated, Durability::Persisted] {
        for crash_after in 0..40 {
            let sim = populated(20 + crash_after, durability);
            let (mut shard, _) = open(&sim);
            let head = shard.group(1).unwrap().head_op();
            let finished = sim
                .run_until_crash(async { shard.truncate_after(1, head - 5, 2).await }, crash_after);
            if finished.is_none() {
                sim.crash();
            }
            let (shard, report) = open(&sim);
            assert!(report.groups[0].corruption.is_none(), "crash point {crash_after}: {report:?}");
            let now = shard.group(1).unwrap().head_op();
            assert!(now == head || now == head - 5, "old or cut, nothing else: {now}");
        }
    }
}

/// Regression: damage to the newest synced journal cycle was indistinguishable from a torn
/// write until a later cycle announced it; the idle marker announces it.
#[test]
fn corrupt_newest_synced_journal_cycle_is_detected_once_announced() {
    let sim = Sim::new(21, SimConfig::default());
    let (mut shard, _) = open_journal(&sim);
    sim.block_on(shard.create_group(1, group_config(Durability::Persisted))).unwrap();
    append(&mut shard, 1, 3, 5000);
    sim.block_on(shard.flush()).unwrap();
    shard.request_journal_marker();
    assert!(shard.has_pending());
    sim.block_on(shard.flush()).unwrap();
    assert!(!shard.has_pending(), "one marker per idle period");
    drop(shard);
    sim.corrupt(&Path::new(DIR).join("journal"), 300, 1);
    let (_, report) = open_journal(&sim);
    assert!(report.journal_corruption.is_some(), "{report:?}");
}

/// Every `persisted` prepare through the direct path: segment writes and syncs, sync marks.
fn open_direct(sim: &Sim) -> (ShardStore<SimStorage>, RecoveryReport) {
    open_with(sim, ShardConfig { persisted_path: PersistedPath::Direct, ..ShardConfig::small() })
}

/// Where the record of `op` starts in a segment file's durable contents (scanning its chain
/// from byte 0).
fn record_position(contents: &[u8], op: u64) -> usize {
    let mut position = 0;
    loop {
        let header = shoal_proto::wire::Header::decode_prefix(&contents[position..]).unwrap();
        if header.as_prepare().unwrap().op == op {
            return position;
        }
        position += header.size as usize;
    }
}

/// On the direct path the segment sync is what acknowledges: damage to a synced op past the
/// checkpoint is corruption, reported and left in place — never a torn tail cut away (which
/// is what recovery would do without the sync marks: `canary-no-sync-mark`).
#[test]
fn corrupt_record_synced_by_the_direct_path_is_reported_never_truncated() {
    let sim = Sim::new(23, SimConfig::default());
    let (mut shard, _) = open_direct(&sim);
    sim.block_on(shard.create_group(1, group_config(Durability::Persisted))).unwrap();
    for _ in 0..4 {
        append(&mut shard, 1, 2, 3000);
        let report = sim.block_on(shard.flush()).unwrap();
        assert!(report.failed.is_empty(), "{report:?}");
    }
    assert_eq!(shard.durable_op(1), Some(8));
    assert!(shard.counters().direct_syncs >= 4, "{:?}", shard.counters());
    assert_eq!(shard.counters().journal_syncs, 0, "nothing went through the journal");
    // The process stops without a checkpoint: the acknowledged ops lie past it.
    drop(shard);
    let segment = segment_files(&sim, 1).pop().unwrap();
    let contents = sim.durable_contents(&segment).unwrap();
    let position = record_position(&contents, 3);
    sim.corrupt(&segment, position as u64 + HEADER_SIZE as u64 + 10, 1);
    let damaged = sim.durable_contents(&segment).unwrap();
    let (mut shard, report) = open_direct(&sim);
    let corruption = report.groups[0].corruption.clone().expect("synced damage is corruption");
    assert_eq!(corruption.op, Some(3), "{corruption}");
    assert!(corruption.reason.contains("sync mark"), "{corruption}");
    let log = shard.group_mut(1).unwrap();
    assert!(matches!(sim.block_on(log.read_offset(0, 1)), Err(Error::Faulty { .. })));
    drop(shard);
    assert_eq!(sim.durable_contents(&segment).unwrap(), damaged, "never truncated or rewritten");
}

/// The newest direct sync is announced by no mark until the group goes idle: the idle request
/// that writes the journal's marker writes a sync mark, after which damage to it is detected.
#[test]
fn corrupt_newest_direct_sync_is_detected_once_announced() {
    let sim = Sim::new(24, SimConfig::default());
    let (mut shard, _) = open_direct(&sim);
    sim.block_on(shard.create_group(1, group_config(Durability::Persisted))).unwrap();
    append(&mut shard, 1, 3, 5000);
    sim.block_on(shard.flush()).unwrap();
    assert_eq!(shard.durable_op(1), Some(3));
    shard.request_journal_marker();
    assert!(shard.has_pending(), "a mark is due");
    sim.block_on(shard.flush()).unwrap();
    assert!(!shard.has_pending(), "one mark per idle period");
    drop(shard);
    let segment = segment_files(&sim, 1).pop().unwrap();
    let contents = sim.durable_contents(&segment).unwrap();
    let position = record_position(&contents, 3);
    sim.corrupt(&segment, position as u64 + HEADER_SIZE as u64 + 10, 1);
    let (_, report) = open_direct(&sim);
    assert!(report.groups[0].corruption.is_some(), "{report:?}");
}

/// Regression (found by `model_prop`): a truncation to an empty log kept the op its last direct
/// sync covered, so the next direct job's mark named a cut op and the next open took the new,
/// shorter log for a damaged one.
#[test]
fn a_truncation_forgets_the_synced_ops_it_cuts() {
    let sim = Sim::new(25, SimConfig::default());
    let (mut shard, _) = open_direct(&sim);
    sim.block_on(shard.create_group(1, group_config(Durability::Persisted))).unwrap();
    for keep in [0, 1] {
        for _ in 0..3 {
            append(&mut shard, 1, 1, 1000);
            sim.block_on(shard.flush()).unwrap();
        }
        sim.block_on(shard.truncate_after(1, keep, 2 + keep as u32)).unwrap();
        append(&mut shard, 1, 1, 1000);
        sim.block_on(shard.flush()).unwrap();
        append(&mut shard, 1, 1, 1000);
        sim.block_on(shard.flush()).unwrap();
        drop(shard);
        let (reopened, report) = open_direct(&sim);
        shard = reopened;
        assert!(report.groups[0].corruption.is_none(), "keep {keep}: {report:?}");
        assert_eq!(report.groups[0].head_op, keep + 2, "keep {keep}");
    }
}

/// Regression: after an unclean stop, a `replicated` group's lost tail may read as plain zeros;
/// its suffix must still be faulty (it may have been acknowledged), and after a clean
/// shutdown it must not be.
#[test]
fn replicated_suffix_is_faulty_after_unclean_stop_only() {
    let sim = Sim::new(22, SimConfig::default());
    let (mut shard, _) = open(&sim);
    sim.block_on(shard.create_group(1, group_config(Durability::Replicated))).unwrap();
    append(&mut shard, 1, 3, 100);
    sim.block_on(shard.flush()).unwrap();
    drop(shard);
    let (shard, report) = open(&sim);
    assert_eq!(report.groups[0].faulty.suffix_from, Some(4));
    sim.block_on(shard.close()).unwrap();
    let (_, report) = open(&sim);
    assert_eq!(report.groups[0].faulty.suffix_from, None);
}

/// Regression: a crash during the very first open could leave a superblock file with no
/// synced copy, which no later open accepted.
#[test]
fn crash_during_first_open_leaves_a_shard_that_opens() {
    for crash_after in 0..30 {
        let sim = Sim::new(100 + crash_after, SimConfig::default());
        let storage = sim.storage();
        let finished = sim.run_until_crash(
            ShardStore::open(storage, Path::new(DIR), ShardConfig::small()),
            crash_after,
        );
        if finished.is_none() {
            sim.crash();
        }
        let (_, report) = open(&sim);
        assert!(report.groups.is_empty());
    }
}

/// Regression: retention removes segments oldest first, each durably, so a crash in the middle
/// leaves a suffix of the log, never a gap.
#[test]
fn crash_during_retention_leaves_a_suffix_of_the_log() {
    for crash_after in 0..20 {
        let sim = Sim::new(200 + crash_after, SimConfig::default());
        let (mut shard, _) = open(&sim);
        let config =
            GroupConfig { retention_bytes: 1 << 20, ..group_config(Durability::Replicated) };
        sim.block_on(shard.create_group(1, config)).unwrap();
        for _ in 0..60 {
            append(&mut shard, 1, 10, 6000);
            sim.block_on(shard.flush()).unwrap();
        }
        sim.block_on(shard.close()).unwrap();
        let (mut shard, _) = open(&sim);
        assert!(shard.group(1).unwrap().segment_count() > 3);
        let finished = sim.run_until_crash(shard.enforce_retention(0), crash_after);
        if finished.is_none() {
            sim.crash();
        }
        let (mut shard, report) = open(&sim);
        assert!(report.groups[0].corruption.is_none(), "crash point {crash_after}: {report:?}");
        let log = shard.group_mut(1).unwrap();
        let first = log.first_offset();
        let all = sim.block_on(log.read_offset(first, usize::MAX)).unwrap();
        assert_eq!(all.last().unwrap().op(), 600);
    }
}

/// Group 2 appends `rounds` records of 20 KB with a flush after each: many times a small
/// journal's size, so its space must keep being freed by checkpoints.
fn write_through_journal(sim: &Sim, shard: &mut ShardStore<SimStorage>, rounds: usize) {
    for _ in 0..rounds {
        if let Err(Error::LimitReached(_)) = try_append(shard, 2, 20_000) {
            sim.block_on(shard.flush()).unwrap();
            sim.block_on(shard.flush()).unwrap();
            try_append(shard, 2, 20_000).expect("checkpoints free the journal");
        }
        sim.block_on(shard.flush()).unwrap();
    }
}

/// Regression (found by the cluster simulator): journal entries a checkpoint covered just
/// before a stop came back as live at the next open, because no later entry recorded the tail
/// moving past them. An idle group's stale entries then pinned the journal's tail for good, and
/// every other persisted group of the shard stopped on "journal full". Open releases them now.
#[test]
fn entries_covered_before_a_restart_never_pin_the_journal() {
    let sim = Sim::new(23, SimConfig::default());
    let mut config = ShardConfig::small();
    config.journal_size_bytes = 256 << 10;
    let (mut shard, _) = open_with(&sim, config.clone());
    sim.block_on(shard.create_group(1, group_config(Durability::Persisted))).unwrap();
    sim.block_on(shard.create_group(2, group_config(Durability::Persisted))).unwrap();
    append(&mut shard, 1, 3, 1_000);
    sim.block_on(shard.flush()).unwrap();
    sim.block_on(shard.close()).unwrap();
    // Group 1 stays idle from here on; group 2 writes many times the journal's size.
    let (mut shard, _) = open_with(&sim, config);
    write_through_journal(&sim, &mut shard, 100);
}

#[test]
fn a_truncation_fence_never_kills_entries_numbered_after_it() {
    // Group 2's appended prepare is still pending in the journal when group 1 truncates: the
    // fence names its sequence number. A power loss takes the pending entry; without care the
    // reopened journal hands its number to group 1's next prepare, which the fence then kills
    // at the following recovery although it was reported durable.
    let sim = Sim::new(23, SimConfig::default());
    let (mut shard, _) = open(&sim);
    sim.block_on(shard.create_group(1, group_config(Durability::Persisted))).unwrap();
    sim.block_on(shard.create_group(2, group_config(Durability::Persisted))).unwrap();
    append(&mut shard, 1, 10, 1000);
    sim.block_on(shard.close()).unwrap();
    let (mut shard, _) = open(&sim);
    append(&mut shard, 2, 1, 1000);
    sim.block_on(shard.truncate_after(1, 5, 2)).unwrap();
    drop(shard);
    sim.crash();
    let (mut shard, _) = open(&sim);
    let next = shard.next(1).unwrap();
    let body = body(next.op, 100);
    let fields = Prepare { record_count: 2, append_time_ms: 6, ..Prepare::default() };
    let header = build_prepare(&next, 2, 0, fields, &body);
    shard.append(1, &header, &body).unwrap();
    sim.block_on(shard.flush()).unwrap();
    assert_eq!(shard.durable_op(1), Some(6));
    drop(shard);
    sim.crash();
    let (shard, _) = open(&sim);
    assert_eq!(shard.group(1).unwrap().head_op(), 6, "an op reported durable survives");
}

/// Regression (found by the retention swarm): the damaged first record of a log whose
/// beginning retention removed failed the group for good, since nothing before it is left to
/// continue the chain from. The protocol-aware cut now empties the log — positioned at op 1 and
/// offset 0, every op faulty — and a state transfer installs over it.
#[test]
fn a_damaged_first_record_after_retention_cuts_the_log_to_empty() {
    let sim = Sim::new(31, SimConfig::default());
    let (mut shard, _) = open(&sim);
    let config = GroupConfig { retention_bytes: 1 << 20, ..group_config(Durability::Persisted) };
    sim.block_on(shard.create_group(1, config)).unwrap();
    for _ in 0..60 {
        append(&mut shard, 1, 10, 6000);
        sim.block_on(shard.flush()).unwrap();
    }
    assert!(sim.block_on(shard.enforce_retention(0)).unwrap() > 0);
    assert!(shard.group(1).unwrap().first_op() > 1);
    sim.block_on(shard.close()).unwrap();
    let first_segment = segment_files(&sim, 1)[0].clone();
    sim.corrupt(&first_segment, 100, 3);
    let (mut shard, _) = open(&sim);
    let recovery = sim.block_on(shard.cut_damaged(1)).unwrap();
    assert_eq!(recovery.faulty.suffix_from, Some(1), "{recovery:?}");
    let log = shard.group(1).unwrap();
    assert_eq!((log.head_op(), log.damaged_from(), log.next_offset()), (0, 1, 0));
    assert!(segment_files(&sim, 1).is_empty(), "{:?}", segment_files(&sim, 1));

    // A peer's op 700 installs over the empty log; its damage marker moves past it.
    let next = ChainNext { op: 700, parent: 0x5eed, offset: 9_000, ..shard.next(1).unwrap() };
    let body = body(700, 6000);
    let fields = Prepare { record_count: 2, append_time_ms: 700, ..Prepare::default() };
    let header = build_prepare(&next, 1, 0, fields, &body);
    let state = GroupState { op: 700, end_offset: 9_002, bytes: b"peer state".to_vec() };
    sim.block_on(shard.install_transfer(1, &header, &body, &state)).unwrap();
    append(&mut shard, 1, 3, 6000);
    sim.block_on(shard.close()).unwrap();
    let (shard, report) = open(&sim);
    assert!(report.groups[0].corruption.is_none(), "{report:?}");
    let log = shard.group(1).unwrap();
    assert_eq!((log.first_op(), log.head_op(), log.damaged_from()), (700, 703, 701));

    // Once the ops are back the owner clears the marker; until a superblock write carries
    // the clear, a crash would find it again, and the shard keeps reporting it.
    let mut shard = shard;
    shard.clear_damaged_from(1);
    assert_eq!((shard.group(1).unwrap().damaged_from(), shard.damage_marker(1)), (0, Some(701)));
    drop(shard);
    let (mut shard, _) = open(&sim);
    assert_eq!(shard.damage_marker(1), Some(701));
    shard.clear_damaged_from(1);
    sim.block_on(shard.flush()).unwrap();
    assert_eq!(shard.damage_marker(1), None);
    drop(shard);
    let (shard, _) = open(&sim);
    assert_eq!(shard.damage_marker(1), None);
}

/// Regression (found by the retention swarm, seed 21,000,173): a group whose log a damage cut
/// emptied in an earlier run came back at the next open with its old journal entries live
/// again (they cannot replay onto the empty log, so nothing consumed them). They pinned the
/// journal's tail until the group got those ops back, which needs a state transfer, whose
/// appends the full journal refused: every other persisted group stopped on "journal full" and
/// the node restarted for good. Open releases a damage-cut group's entries above its head.
#[test]
fn a_damage_cut_groups_old_entries_never_pin_the_journal_after_a_restart() {
    let sim = Sim::new(37, SimConfig::default());
    let mut config = ShardConfig::small();
    config.journal_size_bytes = 2 << 20;
    let (mut shard, _) = open_with(&sim, config.clone());
    let retained = GroupConfig { retention_bytes: 1 << 20, ..group_config(Durability::Persisted) };
    sim.block_on(shard.create_group(1, retained)).unwrap();
    sim.block_on(shard.create_group(2, group_config(Durability::Persisted))).unwrap();
    for _ in 0..60 {
        append(&mut shard, 1, 10, 6000);
        sim.block_on(shard.flush()).unwrap();
    }
    assert!(sim.block_on(shard.enforce_retention(0)).unwrap() > 0);
    // Past the last checkpoint: these stay in the journal.
    append(&mut shard, 1, 3, 6000);
    sim.block_on(shard.flush()).unwrap();
    drop(shard);
    let first_segment = segment_files(&sim, 1)[0].clone();
    sim.corrupt(&first_segment, 100, 3);
    let (mut shard, _) = open_with(&sim, config.clone());
    let recovery = sim.block_on(shard.cut_damaged(1)).unwrap();
    assert_eq!(recovery.faulty.suffix_from, Some(1), "{recovery:?}");
    // Stopped before any later entry could record the journal's tail moving past them.
    drop(shard);
    let (mut shard, _) = open_with(&sim, config);
    assert_eq!(shard.group(1).unwrap().damaged_from(), 1);
    write_through_journal(&sim, &mut shard, 300);
}
