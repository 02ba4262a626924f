//! The shard store end to end on the simulated disk: appends, flushes, reads by offset, op and
//! time, restart, roll, retention and truncation.

mod common;

use shoal_engine::partition::{RETIRED_FILES_MAX, ReadPlan, ZERO_STEPS_PER_FILL_MAX};
use shoal_engine::record::build_prepare;
use shoal_engine::ring::StoredPrepare;
use shoal_engine::segment::{is_retired_name, parse_log_name};
use shoal_engine::shard::{
    ShardConfig, ShardFlush, ShardFlushDone, ShardStore, group_dir, remove_retired_files,
};
use shoal_engine::storage::sim::{Sim, SimConfig, SimStorage};
use shoal_engine::storage::{AlignedBuf, BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_proto::batch::BatchBuilder;
use shoal_proto::wire::Prepare;
use std::future::{Future, poll_fn};
use std::path::Path;
use std::task::Poll;

const GROUP: u64 = 7;

const RECORD_BYTES_MAX: u32 = 64 << 10;

fn group_config(durability: Durability) -> GroupConfig {
    common::group_config(durability, RECORD_BYTES_MAX)
}

fn batch(records: u32, value_len: usize, timestamp_ms: i64) -> bytes::Bytes {
    let mut builder = BatchBuilder::new(timestamp_ms);
    let value = vec![b'v'; value_len];
    for i in 0..records {
        builder.push(timestamp_ms + i64::from(i), None, Some(&value), &[]);
    }
    builder.build()
}

fn append(
    shard: &mut ShardStore<SimStorage>,
    records: u32,
    value_len: usize,
    append_ms: i64,
) -> u64 {
    let next = shard.next(GROUP).unwrap();
    let body = batch(records, value_len, append_ms);
    let fields = Prepare { record_count: records, append_time_ms: append_ms, ..Prepare::default() };
    let header = build_prepare(&next, 1, 0, fields, &body);
    shard.append(GROUP, &header, &body).unwrap();
    next.op
}

fn open(sim: &Sim, dir: &Path) -> ShardStore<SimStorage> {
    let (shard, report) =
        sim.block_on(ShardStore::open(sim.storage(), dir, ShardConfig::small())).unwrap();
    assert!(report.groups.iter().all(|g| g.corruption.is_none()), "{report:?}");
    shard
}

#[test]
fn appends_survive_flush_and_restart_and_read_back_by_offset_op_and_time() {
    for durability in [Durability::Replicated, Durability::Persisted] {
        let sim = Sim::new(1, SimConfig::default());
        let dir = Path::new("/data/shard-0");
        let mut shard = open(&sim, dir);
        sim.block_on(shard.create_group(GROUP, group_config(durability))).unwrap();
        for i in 0..200 {
            append(&mut shard, 3, 100, 1_000 + i);
            if i % 7 == 0 {
                let report = sim.block_on(shard.flush()).unwrap();
                assert!(report.failed.is_empty(), "{report:?}");
            }
        }
        let report = sim.block_on(shard.flush()).unwrap();
        eprintln!(
            "{report:?} {:?} head {} written {}",
            shard.counters(),
            shard.group(GROUP).unwrap().head_op(),
            shard.group(GROUP).unwrap().written_op()
        );
        assert!(report.failed.is_empty());
        assert_eq!(shard.durable_op(GROUP), Some(200));
        let log = shard.group_mut(GROUP).unwrap();
        assert_eq!(log.next_offset(), 600);
        let read = sim.block_on(log.read_offset(301, 1)).unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].base_offset(), 300);
        let by_op = sim.block_on(log.read_op(57)).unwrap().unwrap();
        assert_eq!(by_op.base_offset(), 56 * 3);
        assert_eq!(sim.block_on(log.offset_for_time(1_050)).unwrap(), Some(150));
        sim.block_on(shard.close()).unwrap();

        let mut shard = open(&sim, dir);
        assert_eq!(shard.durable_op(GROUP), Some(200));
        let log = shard.group_mut(GROUP).unwrap();
        assert_eq!(log.next_offset(), 600);
        let all = sim.block_on(log.read_offset(0, usize::MAX)).unwrap();
        assert_eq!(all.len(), 200);
        for (i, prepare) in all.iter().enumerate() {
            assert_eq!(prepare.op(), i as u64 + 1);
            assert_eq!(prepare.body(), batch(3, 100, 1_000 + i as i64));
        }
        // A run of ops (a peer's repair): bounded by count, and by bytes past the first.
        let mut read_ops = |op: u64, prepares_max: usize, bytes_max: usize| {
            let found = match log.plan_read_ops(op, prepares_max, bytes_max).unwrap() {
                ReadPlan::Done(found) => found,
                ReadPlan::Disk(read) => log.finish_read(sim.block_on(read.run())).unwrap(),
            };
            found.iter().map(StoredPrepare::op).collect::<Vec<u64>>()
        };
        assert_eq!(read_ops(57, 5, usize::MAX), vec![57, 58, 59, 60, 61]);
        let record_bytes = all[0].record.len();
        assert_eq!(read_ops(57, 5, 2 * record_bytes), vec![57, 58]);
        assert_eq!(read_ops(57, 5, 1), vec![57], "at least one");
        assert_eq!(read_ops(198, 5, usize::MAX), vec![198, 199, 200], "up to the head");
        assert!(read_ops(201, 5, usize::MAX).is_empty());
        // Appends continue the chain after restart.
        append(&mut shard, 1, 10, 5_000);
        sim.block_on(shard.flush()).unwrap();
        assert_eq!(shard.durable_op(GROUP), Some(201));
    }
}

/// A group with a 2 MiB retention bound and 400 appends of one 16 KiB record in 1 MiB segments,
/// all flushed (`seed` decides the simulated disk).
fn retained_log(seed: u64) -> (Sim, ShardStore<SimStorage>) {
    let config = GroupConfig { retention_bytes: 2 << 20, ..group_config(Durability::Replicated) };
    log_of(seed, config)
}

/// A group of `config` with 400 appends of one 16 KiB record in 1 MiB segments, all flushed.
fn log_of(seed: u64, config: GroupConfig) -> (Sim, ShardStore<SimStorage>) {
    let sim = Sim::new(seed, SimConfig::default());
    let mut shard = open(&sim, Path::new("/data/shard-0"));
    sim.block_on(shard.create_group(GROUP, config)).unwrap();
    for i in 0..400 {
        append(&mut shard, 1, 16 << 10, i);
        if i % 10 == 9 {
            sim.block_on(shard.flush()).unwrap();
        }
    }
    sim.block_on(shard.flush()).unwrap();
    (sim, shard)
}

/// A replicated owner's bound (`set_committed_end`): retention deletes a segment only once the
/// op after it, the log's first op afterwards, is committed; so a restart may take a trimmed
/// log's first op as committed, and a view change never has to cut below it.
#[test]
fn retention_deletes_a_segment_only_once_the_op_after_it_is_committed() {
    // The same 400 appends each time, so the segments end at the same offsets.
    let (sim, mut shard) = retained_log(3);
    shard.group_mut(GROUP).unwrap().set_committed_end(0);
    assert_eq!(sim.block_on(shard.enforce_retention(1_000_000)).unwrap(), 0, "nothing committed");
    // Offset 71 lies in the second segment (about 63 one-record batches per segment).
    shard.group_mut(GROUP).unwrap().set_committed_end(71);
    assert_eq!(sim.block_on(shard.enforce_retention(1_000_000)).unwrap(), 1);
    let first_end = shard.group(GROUP).unwrap().first_offset();
    assert!(first_end > 0 && first_end < 71);
    // The first segment ends exactly at the committed end: the op after it is not committed.
    let (sim, mut shard) = retained_log(3);
    shard.group_mut(GROUP).unwrap().set_committed_end(first_end);
    assert_eq!(sim.block_on(shard.enforce_retention(1_000_000)).unwrap(), 0, "strictly below");
    shard.group_mut(GROUP).unwrap().set_committed_end(first_end + 1);
    assert_eq!(sim.block_on(shard.enforce_retention(1_000_000)).unwrap(), 1);
    assert_eq!(shard.group(GROUP).unwrap().first_offset(), first_end);
}

/// A shard directory that lost its superblock but holds a journal and group directories is
/// refused at open, and its groups' files stay: a new superblock would have named no group,
/// and the open would have removed every group directory as unnamed.
#[test]
fn a_shard_that_lost_its_superblock_refuses_to_open_and_keeps_its_groups() {
    let sim = Sim::new(5, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let mut shard = open(&sim, dir);
    sim.block_on(shard.create_group(GROUP, group_config(Durability::Persisted))).unwrap();
    append(&mut shard, 1, 1000, 0);
    sim.block_on(shard.flush()).unwrap();
    sim.block_on(shard.close()).unwrap();
    let storage = sim.storage();
    sim.block_on(storage.remove_file(&dir.join("superblock"))).unwrap();
    let refused = sim.block_on(ShardStore::open(storage.clone(), dir, ShardConfig::small()));
    assert!(matches!(refused, Err(shoal_engine::Error::Corruption(_))), "{:?}", refused.err());
    let names = sim.block_on(storage.list_dir(dir)).unwrap();
    assert!(names.iter().any(|name| name.starts_with("group-")), "{names:?}");
}

/// A retention time past `i64::MAX` milliseconds keeps everything: it once wrapped to a
/// negative age, which every segment was older than, and retention deleted them all.
#[test]
fn a_retention_time_beyond_i64_keeps_every_segment() {
    let config = GroupConfig { retention_ms: u64::MAX, ..group_config(Durability::Replicated) };
    let (sim, mut shard) = log_of(4, config);
    let log = shard.group_mut(GROUP).unwrap();
    log.set_retention_floor(u64::MAX);
    log.set_committed_end(u64::MAX);
    assert!(log.segment_count() >= 6);
    assert_eq!(sim.block_on(shard.enforce_retention(1_000_000)).unwrap(), 0);
}

#[test]
fn segments_roll_by_size_and_retention_deletes_whole_sealed_segments() {
    let dir = Path::new("/data/shard-0");
    let (sim, mut shard) = retained_log(2);
    let segments = shard.group(GROUP).unwrap().segment_count();
    assert!(segments >= 6, "400 x 16 KiB in 1 MiB segments: {segments}");
    // A floor inside the second segment (offset 70: one 16 KiB record per batch, about 63 per
    // segment) lets retention take the first segment only.
    shard.group_mut(GROUP).unwrap().set_retention_floor(71);
    let deleted = sim.block_on(shard.enforce_retention(1_000_000)).unwrap();
    assert_eq!(deleted, 1, "the floor keeps every segment holding an offset at or above it");
    assert!(shard.group(GROUP).unwrap().first_offset() <= 70);
    shard.group_mut(GROUP).unwrap().set_retention_floor(u64::MAX);
    let deleted = sim.block_on(shard.enforce_retention(1_000_000)).unwrap();
    assert!(deleted > 0);
    let log = shard.group_mut(GROUP).unwrap();
    assert!(log.size_bytes() <= (2 << 20) + (1 << 20));
    let first = log.first_offset();
    assert!(first > 0);
    let read = sim.block_on(log.read_offset(first, 1)).unwrap();
    assert_eq!(read[0].base_offset(), first);
    sim.block_on(shard.close()).unwrap();
    let mut shard = open(&sim, dir);
    let log = shard.group_mut(GROUP).unwrap();
    assert_eq!(log.first_offset(), first);
    assert_eq!(log.next_offset(), 400);
    let all = sim.block_on(log.read_offset(first, usize::MAX)).unwrap();
    assert_eq!(all.len() as u64, 400 - first);
}

/// Runs two flush cycles concurrently (one task, both polled), returning both results.
fn run_both(
    sim: &Sim,
    first: ShardFlush<SimStorage>,
    second: ShardFlush<SimStorage>,
) -> (ShardFlushDone<SimStorage>, ShardFlushDone<SimStorage>) {
    let mut runs = [Box::pin(first.run()), Box::pin(second.run())];
    let mut done: [Option<ShardFlushDone<SimStorage>>; 2] = [None, None];
    sim.block_on(poll_fn(|context| {
        for (run, done) in runs.iter_mut().zip(done.iter_mut()) {
            if done.is_none()
                && let Poll::Ready(output) = run.as_mut().poll(context)
            {
                *done = Some(output);
            }
        }
        if done.iter().all(Option::is_some) { Poll::Ready(()) } else { Poll::Pending }
    }));
    let [first, second] = done;
    (first.unwrap(), second.unwrap())
}

/// A cycle starts while another is in flight, up to `flush_cycles_in_flight_max`; the two write
/// the same partial block (the later one with more data), are finished in order, and what
/// reaches the disk is every byte of both.
#[test]
fn flush_cycles_overlap_up_to_their_bound_and_finish_in_order() {
    let sim = Sim::new(9, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let mut shard = open(&sim, dir);
    assert_eq!(shard.config().flush_cycles_in_flight_max, 2);
    sim.block_on(shard.create_group(GROUP, group_config(Durability::Replicated))).unwrap();
    // The first cycle creates the file and reserves space: it runs alone.
    append(&mut shard, 1, 700, 1);
    let first = shard.begin_flush().unwrap();
    append(&mut shard, 1, 700, 2);
    assert!(shard.begin_flush().is_none(), "nothing may run beside a reserving job");
    let done = sim.block_on(first.run());
    assert_eq!(shard.finish_flush(done).durable, vec![(GROUP, 1)]);
    // Now two cycles overlap, each ending inside the same block.
    let second = shard.begin_flush().unwrap();
    assert!(second.is_complete());
    append(&mut shard, 1, 700, 3);
    let third = shard.begin_flush().unwrap();
    append(&mut shard, 1, 700, 4);
    assert!(shard.begin_flush().is_none(), "at most two cycles in flight");
    let (second, third) = run_both(&sim, second, third);
    assert_eq!(shard.finish_flush(second).durable, vec![(GROUP, 2)]);
    assert_eq!(shard.finish_flush(third).durable, vec![(GROUP, 3)]);
    let fourth = shard.begin_flush().unwrap();
    let done = sim.block_on(fourth.run());
    assert_eq!(shard.finish_flush(done).durable, vec![(GROUP, 4)]);
    sim.block_on(shard.close()).unwrap();
    let mut shard = open(&sim, dir);
    let log = shard.group_mut(GROUP).unwrap();
    let all = sim.block_on(log.read_offset(0, usize::MAX)).unwrap();
    assert_eq!(all.len(), 4, "every op is on disk");
    for (index, prepare) in all.iter().enumerate() {
        assert_eq!(prepare.body(), batch(1, 700, index as i64 + 1));
    }
}

#[test]
#[should_panic(expected = "flush cycles finish in the order they began")]
fn flush_cycles_finished_out_of_order_are_refused() {
    let sim = Sim::new(10, SimConfig::default());
    let mut shard = open(&sim, Path::new("/data/shard-0"));
    sim.block_on(shard.create_group(GROUP, group_config(Durability::Replicated))).unwrap();
    append(&mut shard, 1, 700, 1);
    sim.block_on(shard.flush()).unwrap();
    append(&mut shard, 1, 700, 2);
    let second = shard.begin_flush().unwrap();
    append(&mut shard, 1, 700, 3);
    let third = shard.begin_flush().unwrap();
    let (_, third) = run_both(&sim, second, third);
    shard.finish_flush(third);
}

/// Near a segment's end the ready-ahead window is cut short by the segment's size: once a
/// cycle has reserved up to the end, the log wants no further cycle until it appends again.
#[test]
fn a_segment_near_its_end_wants_no_flush_once_ready_to_its_end() {
    let sim = Sim::new(3, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let mut shard = open(&sim, dir);
    sim.block_on(shard.create_group(GROUP, group_config(Durability::Replicated))).unwrap();
    // 1 MiB segments, 256 KiB ready-ahead (the small profile): 56 × 16 KiB ends within 128 KiB
    // of the segment's end, before it rolls.
    for i in 0..56 {
        append(&mut shard, 1, 16 << 10, i);
        sim.block_on(shard.flush()).unwrap();
    }
    assert_eq!(shard.group(GROUP).unwrap().segment_count(), 1);
    assert!(!shard.has_pending(), "a flushed log near its segment's end has nothing pending");
    assert!(shard.begin_flush().is_none());
}

#[test]
fn truncation_is_durable_and_never_resurrects_an_op() {
    for durability in [Durability::Replicated, Durability::Persisted] {
        let sim = Sim::new(3, SimConfig::default());
        let dir = Path::new("/data/shard-0");
        let mut shard = open(&sim, dir);
        sim.block_on(shard.create_group(GROUP, group_config(durability))).unwrap();
        for i in 0..50 {
            append(&mut shard, 2, 50, i);
        }
        sim.block_on(shard.flush()).unwrap();
        sim.block_on(shard.truncate_after(GROUP, 30, 2)).unwrap();
        assert_eq!(shard.group(GROUP).unwrap().head_op(), 30);
        // A power loss right now must not bring ops 31.. back.
        sim.crash();
        let mut shard = open(&sim, dir);
        let log = shard.group_mut(GROUP).unwrap();
        assert_eq!(log.head_op(), 30, "{durability:?}");
        assert!(sim.block_on(log.read_op(31)).unwrap().is_none());
        assert_eq!(log.next_offset(), 60);
    }
}

/// Regression: a view change may re-adopt ops of an older view above an earlier truncation
/// (their new primary never saw the view that cut them). The fence once killed every record
/// above its op from a view below its own, forever, so the engine refused the re-adopted op and
/// stopped the group. Now a finished fence lets new appends through, while journal entries
/// written before the truncation stay dead.
#[test]
fn ops_of_an_older_view_readopted_after_a_truncation_append_and_survive_a_crash() {
    for durability in [Durability::Replicated, Durability::Persisted] {
        let sim = Sim::new(5, SimConfig::default());
        let dir = Path::new("/data/shard-0");
        let mut shard = open(&sim, dir);
        sim.block_on(shard.create_group(GROUP, group_config(durability))).unwrap();
        let mut prepares = Vec::new();
        for i in 0..40 {
            let next = shard.next(GROUP).unwrap();
            let body = batch(1, 50, i);
            let fields = Prepare { record_count: 1, append_time_ms: i, ..Prepare::default() };
            let header = build_prepare(&next, 1, 0, fields, &body);
            shard.append(GROUP, &header, &body).unwrap();
            prepares.push((header, body));
        }
        sim.block_on(shard.flush()).unwrap();
        sim.block_on(shard.truncate_after(GROUP, 30, 2)).unwrap();
        for (header, body) in &prepares[30..35] {
            shard.append(GROUP, header, body).expect("a re-adopted view-1 op appends");
        }
        sim.block_on(shard.flush()).unwrap();
        // Persisted: the journal cycle synced them, so even a power loss keeps them. Replicated:
        // written but not synced, so a process crash (the page cache survives) keeps them.
        drop(shard);
        if durability == Durability::Persisted {
            sim.crash();
        }
        let mut shard = open(&sim, dir);
        let log = shard.group_mut(GROUP).unwrap();
        assert_eq!(log.head_op(), 35, "{durability:?}: re-adopted ops kept, 36.. stay dead");
        let op_35 = sim.block_on(log.read_op(35)).unwrap().unwrap();
        assert_eq!(op_35.header, prepares[34].0);
    }
}

/// Regression (found reading the fence change): a truncation zeroed only two blocks at the cut.
/// When a view change re-appends byte-identical prepares at the same positions, a power loss
/// may keep their full blocks but lose the unsynced tail block; past the two zeroed blocks that
/// tail held the old, truncated records, which chain on the re-appended ones, so recovery
/// resurrected a dead op and skipped the newer one in the journal. Now the cut zeroes, durably,
/// everything the truncated ops occupied. A `replicated` group, whose segment writes are not
/// synced per cycle; many seeds, because which writes a crash keeps is the seed's choice.
#[test]
fn readopted_identical_prepares_never_chain_into_the_old_truncated_records() {
    for seed in 0..48 {
        let sim = Sim::new(seed, SimConfig::default());
        let dir = Path::new("/data/shard-0");
        let mut shard = open(&sim, dir);
        sim.block_on(shard.create_group(GROUP, group_config(Durability::Replicated))).unwrap();
        let mut prepares = Vec::new();
        for i in 0..40 {
            let next = shard.next(GROUP).unwrap();
            let body = batch(1, 3_000 + i as usize, i);
            let fields = Prepare { record_count: 1, append_time_ms: i, ..Prepare::default() };
            let header = build_prepare(&next, 1, 0, fields, &body);
            shard.append(GROUP, &header, &body).unwrap();
            prepares.push((header, body));
        }
        sim.block_on(shard.truncate_after(GROUP, 30, 2)).unwrap();
        for (header, body) in &prepares[30..38] {
            shard.append(GROUP, header, body).unwrap();
        }
        let next = shard.next(GROUP).unwrap();
        let body = batch(1, 10, 99);
        let fields = Prepare { record_count: 1, ..Prepare::default() };
        let header = build_prepare(&next, 3, 0, fields, &body);
        shard.append(GROUP, &header, &body).unwrap();
        for _ in 0..3 {
            sim.block_on(shard.flush()).unwrap();
        }
        drop(shard);
        sim.crash();
        let mut shard = open(&sim, dir);
        let log = shard.group_mut(GROUP).unwrap();
        // Unsynced writes may be lost, so the head may be anywhere from the cut on; whatever
        // survived must be the new log, never a truncated op.
        let head = log.head_op();
        assert!((30..=39).contains(&head), "seed {seed}: head {head}");
        for op in 31..=head {
            let stored = sim.block_on(log.read_op(op)).unwrap().unwrap();
            let expected = if op == 39 { header } else { prepares[op as usize - 1].0 };
            assert_eq!(stored.header, expected, "seed {seed}: op {op} is a truncated op");
        }
    }
}

#[test]
fn sixty_four_concurrent_persisted_appends_cost_one_journal_sync_and_at_most_one_superblock_write()
{
    let sim = Sim::new(4, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let mut shard = open(&sim, dir);
    for group in 100..164 {
        sim.block_on(shard.create_group(group, group_config(Durability::Persisted))).unwrap();
    }
    let before = shard.counters();
    for group in 100..164 {
        let next = shard.next(group).unwrap();
        let body = batch(1, 1000, 1);
        let header =
            build_prepare(&next, 1, 0, Prepare { record_count: 1, ..Prepare::default() }, &body);
        shard.append(group, &header, &body).unwrap();
    }
    let report = sim.block_on(shard.flush()).unwrap();
    let after = shard.counters();
    assert_eq!(report.durable.len(), 64, "every group's append is durable after one cycle");
    assert_eq!(after.flushes - before.flushes, 1);
    assert_eq!(after.journal_syncs - before.journal_syncs, 1);
    assert!(after.superblock_writes - before.superblock_writes <= 1);
}

/// A power loss can leave the journal holding more of a persisted group past its segments than
/// the group's ring keeps unwritten (the segment writes were lost, the checkpoint lagged):
/// recovery writes what it replayed to the segment as the ring fills instead of refusing to
/// open (`LimitReached`, which kept a simulator node down for good: seed 418). Every appended
/// op comes back, and a second power loss right after open loses nothing either.
#[test]
fn a_journal_replay_longer_than_the_ring_writes_as_it_goes() {
    const RING_ENTRIES: usize = 16;
    let mut replayed_max = 0;
    for seed in 0..16 {
        let sim = Sim::new(seed, SimConfig::default());
        let dir = Path::new("/data/shard-0");
        let config = ShardConfig {
            ring: shoal_engine::ring::RingLimits { entries_max: RING_ENTRIES, bytes_max: 1 << 20 },
            checkpoint_interval_bytes: 4 << 20,
            // Segments written every few appends at run time, as the ring requires.
            persisted_write_batch_bytes: 4 << 10,
            persisted_path: shoal_engine::direct::PersistedPath::Journal,
            ..ShardConfig::small()
        };
        let reopen = |sim: &Sim| {
            let (shard, report) =
                sim.block_on(ShardStore::open(sim.storage(), dir, config.clone())).expect("opens");
            (shard, report.groups.first().map_or(0, |g| g.journal_replayed))
        };
        let (mut shard, _) = reopen(&sim);
        sim.block_on(shard.create_group(GROUP, group_config(Durability::Persisted))).unwrap();
        for i in 0..100 {
            append(&mut shard, 1, 200, i);
            let report = sim.block_on(shard.flush()).unwrap();
            assert!(report.failed.is_empty(), "{report:?}");
        }
        assert_eq!(shard.durable_op(GROUP), Some(100));
        drop(shard);
        sim.crash();
        let (shard, replayed) = reopen(&sim);
        replayed_max = replayed_max.max(replayed);
        assert_eq!(shard.group(GROUP).unwrap().head_op(), 100, "seed {seed}");
        drop(shard);
        sim.crash();
        let (mut shard, _) = reopen(&sim);
        let log = shard.group_mut(GROUP).unwrap();
        assert_eq!(log.head_op(), 100, "seed {seed}: after a second power loss");
        let all = sim.block_on(log.read_offset(0, usize::MAX)).unwrap();
        assert_eq!(all.len(), 100, "seed {seed}");
        for (i, prepare) in all.iter().enumerate() {
            assert_eq!(prepare.body(), batch(1, 200, i as i64), "seed {seed} op {}", i + 1);
        }
    }
    assert!(replayed_max > RING_ENTRIES as u64, "no replay outgrew the ring: {replayed_max}");
}

/// Appends one record of `value_len` bytes to `group`.
fn append_to(shard: &mut ShardStore<SimStorage>, group: u64, value_len: usize) {
    let next = shard.next(group).unwrap();
    let body = batch(1, value_len, 1_000);
    let fields = Prepare { record_count: 1, append_time_ms: 1_000, ..Prepare::default() };
    let header = build_prepare(&next, 1, 0, fields, &body);
    shard.append(group, &header, &body).unwrap();
}

#[test]
fn groups_that_never_wrote_hold_no_disk_and_ready_space_stays_within_the_shard_budget() {
    let sim = Sim::new(3, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let config =
        ShardConfig { groups_max: 1024, ready_budget_bytes: 2 << 20, ..ShardConfig::small() };
    let budget = config.ready_budget_bytes;
    let (mut shard, _) =
        sim.block_on(ShardStore::open(sim.storage(), dir, config.clone())).unwrap();
    let before = sim.used_bytes();
    for group in 1..=1000 {
        sim.block_on(shard.create_group(group, group_config(Durability::Replicated))).unwrap();
    }
    let report = sim.block_on(shard.flush()).unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    let group_files = |sim: &Sim| {
        let in_group_dir = |path: &std::path::PathBuf| {
            path.parent().is_some_and(|dir| dir.to_string_lossy().contains("group-"))
        };
        sim.paths().iter().filter(|path| in_group_dir(path)).count()
    };
    // Each group is a directory with nothing in it; the superblock grew by one slot per group.
    assert_eq!(group_files(&sim), 0);
    let superblock_growth = 4 * 1000 * shoal_engine::superblock::SLOT_SIZE_BYTES as u64;
    assert!(sim.used_bytes() - before <= superblock_growth, "{}", sim.used_bytes() - before);
    assert_eq!(shard.ready_space_bytes(), 0);

    // Twenty groups write: each small profile step is 256 KiB, so together they would want
    // 5 MiB ahead; the budget hands out 2 MiB and the rest write into space reserved as needed.
    let used_before_writes = sim.used_bytes();
    for round in 0..3 {
        for group in 1..=20 {
            append_to(&mut shard, group, 1000);
        }
        let report = sim.block_on(shard.flush()).unwrap();
        assert!(report.failed.is_empty() && !report.storage_full, "round {round}: {report:?}");
        assert!(shard.ready_space_bytes() <= budget, "{} > {budget}", shard.ready_space_bytes());
    }
    for group in 1..=20 {
        assert_eq!(shard.durable_op(group), Some(3));
    }
    assert!(shard.ready_space_bytes() > 0, "the budget was handed out");
    let data_bytes = 20 * 3 * 8192; // each record's file extent is at most two blocks
    assert!(
        sim.used_bytes() - used_before_writes <= data_bytes + budget,
        "{} bytes for {data_bytes} of data and a budget of {budget}",
        sim.used_bytes() - used_before_writes
    );

    // Reopened, the shard accounts what its groups hold again, and the groups that never wrote
    // still hold nothing.
    drop(shard);
    let (shard, _) = sim.block_on(ShardStore::open(sim.storage(), dir, config)).unwrap();
    assert!(shard.ready_space_bytes() <= budget);
    assert_eq!(shard.group(21).unwrap().ready_space_bytes(), 0);
    assert_eq!(shard.group(21).unwrap().segment_count(), 0);
}

#[test]
fn a_busy_group_steps_its_ready_space_up_to_the_largest_step() {
    let sim = Sim::new(4, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let config = ShardConfig {
        ready_ahead_bytes: 8 << 20,
        ready_budget_bytes: 64 << 20,
        ..ShardConfig::small()
    };
    let (mut shard, _) = sim.block_on(ShardStore::open(sim.storage(), dir, config)).unwrap();
    let busy = GroupConfig { segment_size_bytes: 64 << 20, ..group_config(Durability::Replicated) };
    sim.block_on(shard.create_group(GROUP, busy)).unwrap();
    sim.block_on(shard.create_group(GROUP + 1, busy)).unwrap();
    let mut busiest_ahead = 0;
    for _ in 0..40 {
        // 256 KiB per cycle for the busy group, one small record for the other.
        for _ in 0..4 {
            append_to(&mut shard, GROUP, 60_000);
        }
        append_to(&mut shard, GROUP + 1, 100);
        let report = sim.block_on(shard.flush()).unwrap();
        assert!(report.failed.is_empty(), "{report:?}");
        busiest_ahead = busiest_ahead.max(shard.group(GROUP).unwrap().ready_space_bytes());
        assert!(shard.group(GROUP + 1).unwrap().ready_space_bytes() <= 1 << 20);
    }
    assert!(busiest_ahead > 4 << 20, "the busy group's step grew: {busiest_ahead} bytes ahead");
}

#[test]
fn an_idle_group_holds_no_chunk_and_a_dry_pool_takes_back_what_idle_rings_hold() {
    let sim = Sim::new(5, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    // 1 MiB of write buffer: sixteen of the smallest (64 KiB) chunks.
    let config = ShardConfig { chunk_size_bytes: 256 << 10, chunks_max: 4, ..ShardConfig::small() };
    let (mut shard, _) = sim.block_on(ShardStore::open(sim.storage(), dir, config)).unwrap();
    let groups = 1..=40u64;
    for group in groups.clone() {
        sim.block_on(shard.create_group(group, group_config(Durability::Replicated))).unwrap();
    }
    // Forty groups write one small record each, one after the other: each takes a small chunk,
    // hands it back at the first tick that finds it idle (as the node layer ticks), and its
    // ring keeps a view of it; the pool runs dry after sixteen and takes back what the idle
    // rings hold.
    for group in groups.clone() {
        append_to(&mut shard, group, 1000);
        let report = sim.block_on(shard.flush()).unwrap();
        assert!(report.failed.is_empty(), "{report:?}");
        assert_eq!(shard.durable_op(group), Some(1));
        shard.on_tick();
        assert_eq!(shard.group(group).unwrap().write_buffer_chunks(), 0, "group {group}");
    }
    assert!(shard.chunks_allocated() <= 16, "{} chunks", shard.chunks_allocated());
    // What the rings let go of is read from the segments.
    for group in groups {
        let log = shard.group_mut(group).unwrap();
        let records = match log.plan_read_offset(0, 1 << 20).unwrap() {
            ReadPlan::Done(found) => found,
            ReadPlan::Disk(read) => log.finish_read(sim.block_on(read.run())).unwrap(),
        };
        assert_eq!(records.len(), 1, "group {group}");
    }
}

#[test]
fn a_group_writing_one_batch_at_a_time_keeps_its_chunk_between_flushes() {
    let sim = Sim::new(6, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let config = ShardConfig { chunk_size_bytes: 256 << 10, chunks_max: 4, ..ShardConfig::small() };
    let (mut shard, _) = sim.block_on(ShardStore::open(sim.storage(), dir, config)).unwrap();
    const GROUP: u64 = 1;
    sim.block_on(shard.create_group(GROUP, group_config(Durability::Persisted))).unwrap();
    // One batch, then its flush, and only then the next, as a producer with one request in
    // flight writes: nothing is in flight between the batches. Each batch continues the chunk
    // the last one wrote into, so one chunk serves them all while the ring keeps views of them.
    for op in 1..=20 {
        append_to(&mut shard, GROUP, 2000);
        let report = sim.block_on(shard.flush()).unwrap();
        assert!(report.failed.is_empty(), "{report:?}");
        assert_eq!(shard.durable_op(GROUP), Some(op));
        assert_eq!(shard.group(GROUP).unwrap().write_buffer_chunks(), 1, "after op {op}");
    }
    assert_eq!(shard.counters().write_chunks_taken, 1, "one chunk for twenty batches");
    assert_eq!(shard.chunks_allocated(), 1);
    // So the pool never ran dry, and the ring still serves every batch from memory. With a
    // chunk per batch, the sixteenth filled the pool and the ring let go of what was written.
    let log = shard.group_mut(GROUP).unwrap();
    match log.plan_read_offset(0, 1 << 20).unwrap() {
        ReadPlan::Done(found) => assert_eq!(found.len(), 20),
        ReadPlan::Disk(_) => panic!("the ring let go of written batches"),
    }
    // Once idle (its last direct sync announced by an idle mark, as the node layer asks when a
    // shard goes idle), the first tick takes the chunk back; the next batch takes one again.
    shard.on_tick();
    assert_eq!(shard.group(GROUP).unwrap().write_buffer_chunks(), 1, "not idle before its mark");
    shard.request_journal_marker();
    assert!(sim.block_on(shard.flush()).unwrap().failed.is_empty());
    shard.on_tick();
    assert_eq!(shard.group(GROUP).unwrap().write_buffer_chunks(), 0);
    append_to(&mut shard, GROUP, 2000);
    assert!(sim.block_on(shard.flush()).unwrap().failed.is_empty());
    assert_eq!(shard.durable_op(GROUP), Some(21));
}

/// A group that gets one batch of about half a huge page now and then takes a chunk of that
/// batch's class: a whole huge page would sit half empty, pinned by the ring's view of the one
/// batch, and 1,000 such groups made the pool touch twice the new memory (docs/benchmarks.md,
/// "Huge pages only for chunks that fill").
#[test]
fn a_group_getting_one_large_batch_at_a_time_takes_chunks_of_the_batch_class() {
    let sim = Sim::new(7, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let record_max = 1 << 20;
    let config = ShardConfig {
        chunk_size_bytes: 4 << 20,
        chunks_max: 4,
        ring: shoal_engine::ring::RingLimits { entries_max: 1024, bytes_max: 8 << 20 },
        ring_budget_bytes: 16 << 20,
        record_size_bytes_max: shoal_proto::wire::HEADER_SIZE + record_max,
        ..ShardConfig::small()
    };
    let (mut shard, _) = sim.block_on(ShardStore::open(sim.storage(), dir, config)).unwrap();
    const GROUP: u64 = 1;
    let group = GroupConfig {
        segment_size_bytes: 16 << 20,
        ..common::group_config(Durability::Replicated, record_max as u32)
    };
    sim.block_on(shard.create_group(GROUP, group)).unwrap();
    for op in 1..=2 {
        append_to(&mut shard, GROUP, 1_000_000);
        assert!(sim.block_on(shard.flush()).unwrap().failed.is_empty());
        assert_eq!(shard.durable_op(GROUP), Some(op));
        // Idle between batches: the chunk goes back, the ring keeps its view.
        shard.on_tick();
        assert_eq!(shard.group(GROUP).unwrap().write_buffer_chunks(), 0);
    }
    assert_eq!(shard.counters().write_chunks_taken, 2);
    assert_eq!(shard.counters().write_chunk_bytes_allocated, 2 << 20, "two chunks of 1 MiB");
}

/// The small profile's `persisted` segment write batch: a quarter of its 1 MiB ring.
const SMALL_WRITE_BATCH_BYTES: usize = 256 << 10;

/// A shard of the small profile whose `persisted` groups take the journal and, with an interval
/// of `1 << 40`, never checkpoint within a test (its journal holds everything they append), so
/// that only their batches make their segment writes due. Their segments are 1 MiB (rolls ask
/// for checkpoints of their own) unless `segment_size_bytes` says otherwise. Up to four cycles
/// may be in flight, as in production.
fn open_for_batches(
    sim: &Sim,
    groups: &[u64],
    checkpoint_interval_bytes: u64,
    segment_size_bytes: Option<u64>,
) -> ShardStore<SimStorage> {
    let config = ShardConfig {
        journal_size_bytes: 32 << 20,
        checkpoint_interval_bytes,
        persisted_path: shoal_engine::direct::PersistedPath::Journal,
        flush_cycles_in_flight_max: 4,
        ..ShardConfig::small()
    };
    let (mut shard, _) =
        sim.block_on(ShardStore::open(sim.storage(), Path::new("/data/shard-0"), config)).unwrap();
    let mut config = group_config(Durability::Persisted);
    config.segment_size_bytes = segment_size_bytes.unwrap_or(config.segment_size_bytes);
    for &group in groups {
        sim.block_on(shard.create_group(group, config)).unwrap();
    }
    shard
}

/// Runs flush cycles as the node layer does: it asks for cycles until none begins (each may take
/// what the ones before it left), runs them, applies them in order, then runs the checkpoint
/// and the zero fill that are due.
fn flush_as_node_layer(sim: &Sim, shard: &mut ShardStore<SimStorage>) {
    let mut cycles = Vec::new();
    while let Some(cycle) = shard.begin_flush() {
        cycles.push(cycle);
        assert!(cycles.len() <= 4, "more cycles in flight than the bound");
    }
    for cycle in cycles {
        let report = shard.finish_flush(sim.block_on(cycle.run()));
        assert!(report.failed.is_empty(), "{report:?}");
    }
    if let Some(job) = shard.begin_checkpoint() {
        shard.finish_checkpoint(sim.block_on(job.run())).unwrap();
    }
    if let Some(job) = shard.begin_zero_fill() {
        let report = shard.finish_zero_fill(sim.block_on(job.run()));
        assert!(report.failed.is_empty(), "{report:?}");
    }
}

/// Groups appending in step, one 4,000-byte batch each per cycle (driven as the node layer
/// drives them, [`flush_as_node_layer`]), and who wrote to a segment in which cycle (a group's
/// written op moved).
struct SegmentWriteTally {
    groups: Vec<u64>,
    written_ops: Vec<u64>,
    writes: Vec<u32>,
    most_in_one_cycle: usize,
}

impl SegmentWriteTally {
    fn new(groups: &[u64]) -> Self {
        Self {
            groups: groups.to_vec(),
            written_ops: vec![0; groups.len()],
            writes: vec![0; groups.len()],
            most_in_one_cycle: 0,
        }
    }

    fn cycle(&mut self, sim: &Sim, shard: &mut ShardStore<SimStorage>) {
        for &group in &self.groups {
            append_to(shard, group, 4000);
        }
        flush_as_node_layer(sim, shard);
        let mut writing = 0;
        for (index, &group) in self.groups.iter().enumerate() {
            let written_op = shard.group(group).unwrap().written_op();
            if written_op > self.written_ops[index] {
                self.written_ops[index] = written_op;
                self.writes[index] += 1;
                writing += 1;
            }
        }
        self.most_in_one_cycle = self.most_in_one_cycle.max(writing);
    }
}

/// A busy `persisted` group's write buffer grows to hold its write batch, so its segment writes
/// carry whole batches; a group appending a trickle keeps the smallest chunk. Without the pace
/// rule (`partition::append::CHUNK_CYCLES`), the busy group's 64 KiB chunk filled every few
/// cycles and each fill made a write due.
#[test]
fn a_busy_persisted_group_writes_whole_batches_and_a_trickle_keeps_the_smallest_chunk() {
    const BUSY: u64 = 1;
    const TRICKLE: u64 = 2;
    let sim = Sim::new(5, SimConfig::default());
    let mut shard = open_for_batches(&sim, &[BUSY, TRICKLE], 1 << 40, None);
    let mut busy_written = 0;
    let mut ops_per_write = Vec::new();
    let mut trickle_buffer_max = 0;
    for _ in 0..400 {
        append_to(&mut shard, BUSY, 4000);
        append_to(&mut shard, TRICKLE, 100);
        flush_as_node_layer(&sim, &mut shard);
        let written = shard.group(BUSY).unwrap().written_op();
        if written > busy_written {
            ops_per_write.push(written - busy_written);
            busy_written = written;
        }
        let trickle = shard.group(TRICKLE).unwrap().write_buffer_bytes();
        trickle_buffer_max = trickle_buffer_max.max(trickle);
    }
    // The first writes come while the pace is still being learnt.
    let steady = &ops_per_write[2..];
    assert!(steady.len() >= 4, "{ops_per_write:?}");
    // A 4 KiB append is about 4.3 KiB with its headers: a batch of 256 KiB is ~59 of them, a
    // 64 KiB chunk ~15. A write may start part-way into a chunk, so it carries less than a
    // whole chunk then.
    assert!(steady.iter().all(|&ops| ops >= 40), "writes smaller than a batch: {ops_per_write:?}");
    assert_eq!(trickle_buffer_max, 64 << 10, "the trickle's write buffer grew");
    let busy_buffer = shard.group(BUSY).unwrap().write_buffer_bytes();
    assert!(busy_buffer >= SMALL_WRITE_BATCH_BYTES, "busy group's buffer: {busy_buffer}");
}

/// `persisted` groups that gather their batches in step (equal producers) do not all write in
/// the same cycle: a cycle takes put-off writes up to what it journals, the rest wait their
/// turn, and none waits past twice its batch. Without the spreading every group's write lands
/// on the same cycle; when every cycle took at least one, the node layer's extra asks for a
/// cycle (while one is in flight) took the put-off writes one by one in the same round.
#[test]
fn segment_writes_due_in_step_are_spread_over_the_cycles() {
    const GROUPS: u64 = 8;
    let groups: Vec<u64> = (1..=GROUPS).collect();
    let sim = Sim::new(6, SimConfig::default());
    let mut shard = open_for_batches(&sim, &groups, 1 << 40, None);
    let mut tally = SegmentWriteTally::new(&groups);
    let mut longest_wait_ops = 0;
    for _ in 0..360 {
        tally.cycle(&sim, &mut shard);
        for &group in &groups {
            let log = shard.group(group).unwrap();
            longest_wait_ops = longest_wait_ops.max(log.head_op() - log.written_op());
        }
    }
    let (most, writes) = (tally.most_in_one_cycle, &tally.writes);
    assert!(most <= 2, "{most} groups wrote in one cycle");
    assert!(writes.iter().all(|&count| count >= 4), "a group waited too long: {writes:?}");
    // Twice the batch is ~118 appends of ~4.3 KiB.
    assert!(longest_wait_ops <= 120, "a write waited {longest_wait_ops} appends");
    for &group in &groups {
        assert_eq!(shard.durable_op(group), Some(360), "group {group}");
    }
}

/// Groups in step that pass their checkpoint interval together neither write everything in the
/// same cycle (a checkpoint records what their spread batches wrote) nor pay a superblock write
/// each (a checkpoint job gathers every group past half of its interval). Without the first
/// rule all groups wrote their batches in the cycle before each checkpoint; without the second,
/// their checkpoints fell apart and each took a superblock write of its own.
#[test]
fn groups_in_step_checkpoint_together_without_writing_everything_at_once() {
    const GROUPS: u64 = 8;
    const CYCLES: u64 = 1200;
    let groups: Vec<u64> = (1..=GROUPS).collect();
    let sim = Sim::new(7, SimConfig::default());
    // Segments larger than what a group appends: no roll asks for a checkpoint of its own.
    let mut shard = open_for_batches(&sim, &groups, 1 << 20, Some(16 << 20));
    let mut tally = SegmentWriteTally::new(&groups);
    let before = shard.counters();
    for _ in 0..CYCLES {
        tally.cycle(&sim, &mut shard);
    }
    let after = shard.counters();
    let checkpoints = after.checkpoints - before.checkpoints;
    let superblock_writes = after.superblock_writes - before.superblock_writes;
    let most = tally.most_in_one_cycle;
    assert!(most <= 2, "{most} groups wrote in one cycle");
    // ~5 MiB appended per group, a checkpoint every 1 MiB: about five rounds.
    assert!(checkpoints >= 3 * GROUPS, "{checkpoints} checkpoints");
    assert!(
        checkpoints >= superblock_writes * GROUPS / 2,
        "{checkpoints} checkpoints took {superblock_writes} superblock writes"
    );
    for &group in &groups {
        assert_eq!(shard.durable_op(group), Some(CYCLES), "group {group}");
        let log = shard.group(group).unwrap();
        assert!(log.bytes_since_checkpoint() < 2 << 20, "group {group} lags its checkpoint");
    }
}

/// Groups on the direct path appending in step reach their steps ahead together, and each
/// step is written with zeros beside the cycles. A zero fill takes a few of them
/// (`ZERO_STEPS_PER_FILL_MAX`), so that an append's write never queues behind every group's
/// zeros at once, and the next zero fill starts where the last one stopped. Here the groups
/// want more steps than the zero fills take, so the turns show: taken in group order instead,
/// groups 1–4 got 114 steps each and groups 5–9 96. Before the bound, one zero fill took all
/// nine steps.
#[test]
fn zero_steps_due_together_are_written_a_few_at_a_time_in_turn() {
    const GROUPS: u64 = 9;
    const CYCLES: u64 = 400;
    let sim = Sim::new(8, SimConfig::default());
    let config = ShardConfig {
        persisted_path: shoal_engine::direct::PersistedPath::Direct,
        ..ShardConfig::small()
    };
    let (mut shard, _) =
        sim.block_on(ShardStore::open(sim.storage(), Path::new("/data/shard-0"), config)).unwrap();
    for group in 1..=GROUPS {
        sim.block_on(shard.create_group(group, group_config(Durability::Persisted))).unwrap();
    }
    let mut steps = vec![0u32; GROUPS as usize];
    let mut fills = 0;
    for _ in 0..CYCLES {
        for group in 1..=GROUPS {
            append_to(&mut shard, group, 48 << 10);
        }
        while let Some(cycle) = shard.begin_flush() {
            let report = shard.finish_flush(sim.block_on(cycle.run()));
            assert!(report.failed.is_empty(), "{report:?}");
        }
        if let Some(job) = shard.begin_zero_fill() {
            let groups: Vec<u64> = job.groups().collect();
            assert!(
                groups.len() <= ZERO_STEPS_PER_FILL_MAX,
                "one zero fill took {} steps",
                groups.len()
            );
            for group in groups {
                steps[group as usize - 1] += 1;
            }
            let report = shard.finish_zero_fill(sim.block_on(job.run()));
            assert!(report.failed.is_empty() && !report.storage_full, "{report:?}");
            fills += 1;
        }
    }
    assert!(fills >= CYCLES / 2, "{fills} zero fills");
    let (fewest, most) = (steps.iter().min().unwrap(), steps.iter().max().unwrap());
    assert!(most - fewest <= 2, "the groups did not take turns: {steps:?}");
    for group in 1..=GROUPS {
        assert_eq!(shard.durable_op(group), Some(CYCLES), "group {group}");
    }
}

/// A group on the direct path syncs its segment in every job, so its checkpoints record what is
/// already durable without syncing the segment again: one device flush fewer per checkpoint
/// beside the appends' own (docs/benchmarks.md, "The one-partition row: a round against its
/// replay"). A group on the journal path still syncs its segment at each checkpoint, and after a
/// power loss both groups have every op.
#[test]
fn checkpoints_of_a_direct_group_sync_no_segment_a_direct_job_synced() {
    const APPENDS: u64 = 64;
    for (path, segment_syncs_expected) in [
        (shoal_engine::direct::PersistedPath::Direct, false),
        (shoal_engine::direct::PersistedPath::Journal, true),
    ] {
        let sim = Sim::new(9, SimConfig::default());
        let dir = Path::new("/data/shard-0");
        let config = ShardConfig { persisted_path: path, ..ShardConfig::small() };
        let (mut shard, _) =
            sim.block_on(ShardStore::open(sim.storage(), dir, config.clone())).unwrap();
        // One segment: rolled segments are synced when they settle, on either path.
        let group =
            GroupConfig { segment_size_bytes: 8 << 20, ..group_config(Durability::Persisted) };
        sim.block_on(shard.create_group(GROUP, group)).unwrap();
        let before = shard.counters();
        for _ in 0..APPENDS {
            // 48 KiB per append: the small profile's 1 MiB checkpoint interval every ~21.
            append_to(&mut shard, GROUP, 48 << 10);
            while let Some(cycle) = shard.begin_flush() {
                let report = shard.finish_flush(sim.block_on(cycle.run()));
                assert!(report.failed.is_empty(), "{report:?}");
            }
            if let Some(job) = shard.begin_checkpoint() {
                shard.finish_checkpoint(sim.block_on(job.run())).unwrap();
            }
        }
        let after = shard.counters();
        assert_eq!(shard.durable_op(GROUP), Some(APPENDS));
        assert!(after.superblock_writes - before.superblock_writes >= 2, "{path:?}: {after:?}");
        if segment_syncs_expected {
            assert!(after.segment_syncs > before.segment_syncs, "{path:?}: {after:?}");
        } else {
            assert!(after.direct_syncs - before.direct_syncs >= APPENDS, "{path:?}: {after:?}");
            assert_eq!(after.segment_syncs, before.segment_syncs, "{path:?}: a checkpoint synced");
        }
        drop(shard);
        // A power loss: the simulated disk keeps only what a sync made durable.
        sim.crash();
        let (shard, report) = sim.block_on(ShardStore::open(sim.storage(), dir, config)).unwrap();
        assert!(report.groups.iter().all(|g| g.corruption.is_none()), "{path:?}: {report:?}");
        assert_eq!(shard.durable_op(GROUP), Some(APPENDS), "{path:?}");
    }
}

/// A power loss can tear one journal cycle so that a later entry of it survives whole past a
/// damaged one (the disk keeps any subset of an unsynced write's sectors; an entry that starts
/// on a block is found past the damage). Recovery must treat the cycle as torn where it first
/// breaks. It used to replay the later entry past the gap, and the next cycle then announced
/// the lost entry as synced: the next recovery reported the journal corrupt and every
/// `persisted` group's suffix faulty.
///
/// The damage is written over a synced cycle that no later entry announces yet, which recovery
/// cannot tell from an unsynced one (docs/storage-format.md: the newest synced cycle is
/// announced only by the next one).
#[test]
fn a_journal_cycle_torn_in_its_middle_is_not_taken_for_corruption_after_the_next_power_loss() {
    let sim = Sim::new(11, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let config = ShardConfig {
        journal_size_bytes: 32 << 20,
        checkpoint_interval_bytes: 1 << 40,
        persisted_path: shoal_engine::direct::PersistedPath::Journal,
        ..ShardConfig::small()
    };
    let reopen = |sim: &Sim| {
        let (shard, report) =
            sim.block_on(ShardStore::open(sim.storage(), dir, config.clone())).expect("opens");
        (shard, report)
    };
    let (mut shard, _) = reopen(&sim);
    // Entries of exactly 8 KiB (a 7,610-byte value in a batch, its prepare header, the entry
    // header): each starts on a block, so the scan finds the third past a damaged second.
    for group in 1..=3 {
        sim.block_on(shard.create_group(group, group_config(Durability::Persisted))).unwrap();
        append_to(&mut shard, group, 7_610);
    }
    let report = sim.block_on(shard.flush()).unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    drop(shard);
    sim.crash();

    // The cycle's middle entry damaged, as a tear that kept the entries on either side whole.
    let journal = dir.join(shoal_engine::journal::FILE_NAME);
    let file = sim.block_on(sim.storage().open(&journal, OpenMode::ReadWrite, true)).unwrap();
    let size = sim.block_on(file.size_bytes()).unwrap() as usize;
    let (result, bytes) = sim.block_on(file.read_at(AlignedBuf::zeroed(size, BLOCK_SIZE_BYTES), 0));
    result.unwrap();
    let bytes = bytes.freeze();
    // The cycle's prepare entries, in order: (seq, position).
    let mut prepares = Vec::new();
    let mut position = 0;
    while let Some((outer, fields, inner)) =
        shoal_engine::journal::decode_entry(&bytes[position..], 1 << 20)
    {
        if inner.is_some() {
            prepares.push((fields.seq, position));
        }
        position += outer.size as usize;
    }
    assert_eq!(prepares.len(), 3, "one cycle of three prepares: {prepares:?}");
    assert!(prepares.iter().all(|(_, at)| at % BLOCK_SIZE_BYTES == 0), "{prepares:?}");
    // One sector inside the middle entry's body, written over as a tear leaves it.
    let sector = (prepares[1].1 + 1024).next_multiple_of(512);
    assert!(sector + 512 < prepares[2].1, "inside the middle entry");
    let block_at = sector - sector % BLOCK_SIZE_BYTES;
    let mut damaged = bytes[block_at..block_at + BLOCK_SIZE_BYTES].to_vec();
    damaged[sector - block_at..][..512].fill(0xEE);
    sim.block_on(file.write_at(bytes::Bytes::from(damaged), block_at as u64)).unwrap();
    sim.block_on(file.sync_data()).unwrap();
    drop(file);

    let (mut shard, report) = reopen(&sim);
    assert!(report.journal_corruption.is_none(), "a torn cycle is not corruption: {report:?}");
    let heads = |shard: &ShardStore<SimStorage>| -> Vec<u64> {
        (1..=3).map(|group| shard.group(group).unwrap().head_op()).collect()
    };
    assert_eq!(heads(&shard), [1, 0, 0], "the cycle is cut where it breaks");
    append_to(&mut shard, 1, 100);
    let flushed = sim.block_on(shard.flush()).unwrap();
    assert!(flushed.failed.is_empty(), "{flushed:?}");
    drop(shard);
    sim.crash();

    let (shard, report) = reopen(&sim);
    assert_eq!(heads(&shard), [2, 0, 0]);
    assert!(report.groups.iter().all(|g| g.faulty.suffix_from.is_none()), "{report:?}");
    assert!(
        report.journal_corruption.is_none(),
        "the torn entry was announced as synced: {:?}",
        report.journal_corruption
    );
}

/// Two journal cycles in flight: the later one writes and syncs while the earlier one's write
/// has not reached the disk, then power is lost. The later cycle was never acknowledged (cycles
/// finish in order), its entries announce nothing the earlier one holds, and recovery drops it
/// as past a gap: neither replayed nor taken for corruption, now or after the next power loss.
/// A shard under `dir` whose `persisted` groups 1 and 2 always take the journal (at most two
/// cycles in flight, no checkpoints), with one journal cycle begun for each: (config, shard,
/// group 1's cycle, group 2's cycle begun beside it).
fn two_journal_cycles_in_flight(
    sim: &Sim,
    dir: &Path,
) -> (ShardConfig, ShardStore<SimStorage>, ShardFlush<SimStorage>, ShardFlush<SimStorage>) {
    let config = ShardConfig {
        checkpoint_interval_bytes: 1 << 40,
        persisted_path: shoal_engine::direct::PersistedPath::Journal,
        ..ShardConfig::small()
    };
    assert_eq!(config.journal_cycles_in_flight_max, 2);
    let (mut shard, _) =
        sim.block_on(ShardStore::open(sim.storage(), dir, config.clone())).expect("opens");
    for group in 1..=2 {
        sim.block_on(shard.create_group(group, group_config(Durability::Persisted))).unwrap();
    }
    append_to(&mut shard, 1, 3_000);
    let earlier = shard.begin_flush().expect("a cycle for group 1");
    append_to(&mut shard, 2, 3_000);
    let later = shard.begin_flush().expect("a second journal cycle beside the first");
    (config, shard, earlier, later)
}

#[test]
fn a_journal_cycle_synced_before_an_earlier_one_wrote_is_dropped_not_taken_for_corruption() {
    let sim = Sim::new(12, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let (config, shard, earlier, later) = two_journal_cycles_in_flight(&sim, dir);
    let reopen = |sim: &Sim| {
        sim.block_on(ShardStore::open(sim.storage(), dir, config.clone())).expect("opens")
    };
    // Only the later cycle runs: the earlier one's write never reaches the disk.
    let later_done = sim.block_on(later.run());
    drop((earlier, later_done, shard));
    sim.crash();

    // The later cycle's entry is on disk, synced, one block past where the earlier one's was due.
    let journal = dir.join(shoal_engine::journal::FILE_NAME);
    let file = sim.block_on(sim.storage().open(&journal, OpenMode::ReadWrite, true)).unwrap();
    let (result, bytes) =
        sim.block_on(file.read_at(AlignedBuf::zeroed(2 * BLOCK_SIZE_BYTES, BLOCK_SIZE_BYTES), 0));
    result.unwrap();
    drop(file);
    let bytes = bytes.freeze();
    assert!(shoal_engine::journal::decode_entry(&bytes, 1 << 20).is_none(), "nothing at 0");
    let (_, fields, inner) =
        shoal_engine::journal::decode_entry(&bytes[BLOCK_SIZE_BYTES..], 1 << 20)
            .expect("the later cycle's entry survives");
    assert_eq!((fields.seq, inner.map(|header| header.size > 0)), (2, Some(true)));

    let (mut shard, report) = reopen(&sim);
    assert!(
        report.journal_corruption.is_none(),
        "an unacknowledged cycle past a lost one is not corruption: {report:?}"
    );
    assert!(report.groups.iter().all(|g| g.faulty.suffix_from.is_none()), "{report:?}");
    let heads = |shard: &ShardStore<SimStorage>| -> Vec<u64> {
        (1..=2).map(|group| shard.group(group).unwrap().head_op()).collect()
    };
    assert_eq!(heads(&shard), [0, 0], "the later cycle is dropped, not replayed past the gap");
    for group in 1..=2 {
        append_to(&mut shard, group, 100);
    }
    let flushed = sim.block_on(shard.flush()).unwrap();
    assert!(flushed.failed.is_empty(), "{flushed:?}");
    drop(shard);
    sim.crash();

    let (shard, report) = reopen(&sim);
    assert!(report.journal_corruption.is_none(), "{:?}", report.journal_corruption);
    assert!(report.groups.iter().all(|g| g.faulty.suffix_from.is_none()), "{report:?}");
    assert_eq!(heads(&shard), [1, 1]);
}

/// Two journal cycles in flight: the earlier one's write fails, the later one's write and sync
/// succeed. The later cycle's entries lie past the failed one's missing entries (recovery would
/// drop them), so finishing it makes nothing durable, and the shard stops.
#[test]
fn a_journal_cycle_that_finishes_after_a_failed_one_makes_nothing_durable() {
    let sim = Sim::new(13, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let (_, mut shard, earlier, later) = two_journal_cycles_in_flight(&sim, dir);
    sim.fail_next_write(&dir.join(shoal_engine::journal::FILE_NAME));
    let earlier_done = sim.block_on(earlier.run());
    let later_done = sim.block_on(later.run());

    let report = shard.finish_flush(earlier_done);
    assert!(report.durable.is_empty(), "the failed cycle made group 1 durable: {report:?}");
    // The later cycle's write and sync succeeded, but the earlier cycle's entries are missing
    // below it, so recovery would drop it: nothing it holds may be acknowledged.
    let report = shard.finish_flush(later_done);
    assert!(
        report.durable.is_empty(),
        "a cycle past a failed one made a group durable: {report:?}"
    );
    assert_eq!((shard.durable_op(1), shard.durable_op(2)), (Some(0), Some(0)));
    assert!(
        matches!(sim.block_on(shard.flush()), Err(shoal_engine::Error::Faulty { .. })),
        "a failed journal stops the shard"
    );
}

/// The shard names the groups whose durable op changed since its owner last asked, and only
/// those (the node layer tells just them, however many groups the shard holds): every group
/// after an open, a group made durable by a cycle, one lowered by a truncation; none twice.
#[test]
fn the_groups_whose_durable_op_changed_are_named_once() {
    for durability in [Durability::Replicated, Durability::Persisted] {
        let sim = Sim::new(5, SimConfig::default());
        let dir = Path::new("/data/shard-0");
        let mut shard = open(&sim, dir);
        for group in 1..=3 {
            sim.block_on(shard.create_group(group, group_config(durability))).unwrap();
        }
        let created: Vec<u64> = shard.take_durable_changed().into_iter().collect();
        assert_eq!(created, [1, 2, 3]);
        append_to(&mut shard, 2, 100);
        assert!(shard.take_durable_changed().is_empty(), "nothing durable before the cycle");
        sim.block_on(shard.flush()).unwrap();
        assert_eq!(shard.take_durable_changed().into_iter().collect::<Vec<_>>(), [2]);
        assert_eq!(shard.durable_op(2), Some(1));
        sim.block_on(shard.flush()).unwrap();
        assert!(shard.take_durable_changed().is_empty(), "a cycle with nothing new");
        append_to(&mut shard, 3, 100);
        append_to(&mut shard, 3, 100);
        sim.block_on(shard.flush()).unwrap();
        sim.block_on(shard.truncate_after(3, 1, 2)).unwrap();
        assert_eq!(shard.take_durable_changed().into_iter().collect::<Vec<_>>(), [3]);
        assert_eq!(shard.durable_op(3), Some(1));
        drop(shard);
        let mut shard = open(&sim, dir);
        let opened: Vec<u64> = shard.take_durable_changed().into_iter().collect();
        assert_eq!(opened, [1, 2, 3], "{durability:?}");
        assert_eq!(shard.damaged_groups().count(), 0);
    }
}

/// A shard recovers its groups several at a time (`GROUPS_RECOVERED_AT_ONCE`): with more groups
/// than one batch, a power loss after each flush leaves every `persisted` group (held in the
/// journal) with every op it had made durable, every `replicated` group (written, not synced)
/// with its suffix faulty from its recovered head on (its peers hold the rest), the report
/// lists the groups in id order, and a group that never wrote is empty.
#[test]
fn groups_recovered_in_batches_keep_every_durable_op_after_power_losses() {
    let sim = Sim::new(12, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let config = ShardConfig {
        persisted_path: shoal_engine::direct::PersistedPath::Journal,
        ..ShardConfig::small()
    };
    const GROUPS: u64 = 50;
    let durability = |group: u64| {
        if group.is_multiple_of(2) { Durability::Persisted } else { Durability::Replicated }
    };
    let (mut shard, _) =
        sim.block_on(ShardStore::open(sim.storage(), dir, config.clone())).unwrap();
    for group in 1..=GROUPS {
        sim.block_on(shard.create_group(group, group_config(durability(group)))).unwrap();
    }
    for round in 1..=3u64 {
        // The last group never writes; the others write `group % 3 + 1` batches a round.
        for group in 1..GROUPS {
            for _ in 0..=group % 3 {
                append_to(&mut shard, group, 500);
            }
        }
        let report = sim.block_on(shard.flush()).unwrap();
        assert!(report.failed.is_empty(), "round {round}: {report:?}");
        let durable: Vec<Option<u64>> = (1..=GROUPS).map(|g| shard.durable_op(g)).collect();
        drop(shard);
        sim.crash();
        let (reopened, report) =
            sim.block_on(ShardStore::open(sim.storage(), dir, config.clone())).unwrap();
        shard = reopened;
        let ids: Vec<u64> = report.groups.iter().map(|g| g.group).collect();
        assert_eq!(ids, (1..=GROUPS).collect::<Vec<_>>(), "round {round}");
        for group in 1..GROUPS {
            let log = shard.group(group).unwrap();
            let recovery = &report.groups[group as usize - 1];
            assert!(log.faulty_reason().is_none(), "round {round}, group {group}");
            match durability(group) {
                Durability::Persisted => {
                    let written = durable[group as usize - 1].unwrap();
                    assert!(written >= round * (group % 3 + 1), "group {group}: {written}");
                    assert!(log.head_op() >= written, "round {round}, group {group}: lost ops");
                }
                Durability::Replicated => {
                    let from = recovery.faulty.suffix_from;
                    assert_eq!(from, Some(log.head_op() + 1), "round {round}, group {group}");
                }
            }
        }
        assert_eq!(shard.group(GROUPS).unwrap().head_op(), 0);
    }
}

/// The retired files in the group's directory.
fn retired_in(sim: &Sim, dir: &Path) -> Vec<String> {
    let names = sim.block_on(sim.storage().list_dir(&group_dir(dir, GROUP))).unwrap();
    names.into_iter().filter(|name| is_retired_name(name)).collect()
}

/// Segments retention deletes leave the log at once, their files renamed to wait for the
/// driver, which removes them off its loop; a crash before it leaves them for the next open,
/// which removes them and keeps the log as retention left it.
#[test]
fn retired_segments_wait_for_the_driver_and_an_open_removes_what_a_crash_left_behind() {
    let dir = Path::new("/data/shard-0");
    let (sim, mut shard) = retained_log(7);
    shard.group_mut(GROUP).unwrap().set_retention_floor(u64::MAX);
    let deleted = sim.block_on(shard.enforce_retention(1_000_000)).unwrap();
    assert!(deleted >= 2, "{deleted}");
    let first = shard.group(GROUP).unwrap().first_offset();
    let retired = shard.take_retired_files();
    // The first goes to the spare (recycled); the others are retired.
    assert_eq!(retired.len(), deleted - 1, "{retired:?}");
    assert!(shard.take_retired_files().is_empty(), "handed out once");
    assert_eq!(retired_in(&sim, dir).len(), retired.len());
    // Nothing of them is in the log any more, on disk either.
    let logs = sim.block_on(sim.storage().list_dir(&group_dir(dir, GROUP))).unwrap();
    let bases: Vec<u64> = logs.iter().filter_map(|name| parse_log_name(name)).collect();
    assert!(bases.iter().all(|&base| base >= first), "{bases:?} from {first}");
    // A process crash: what was written stays (a power loss could take the unsynced tail of
    // this `replicated` log, not the retirement, which a directory sync made durable).
    drop(shard);
    let mut shard = open(&sim, dir);
    assert!(retired_in(&sim, dir).is_empty(), "the open removes them");
    let log = shard.group_mut(GROUP).unwrap();
    assert_eq!(log.first_offset(), first);
    let all = sim.block_on(log.read_offset(first, usize::MAX)).unwrap();
    assert_eq!(all.len() as u64, 400 - first);
    // The driver's removal finds them gone: no error.
    sim.block_on(remove_retired_files(&sim.storage(), retired)).unwrap();
}

/// A driver that never takes the retired files makes retention remove them itself past
/// `RETIRED_FILES_MAX`: the list, and the disk they hold, stay bounded.
#[test]
fn retired_files_past_their_bound_are_removed_by_retention() {
    let dir = Path::new("/data/shard-0");
    let sim = Sim::new(9, SimConfig::default());
    // Without recycling every segment retention deletes is retired.
    let shard_config = ShardConfig { recycle_segments: false, ..ShardConfig::small() };
    let (mut shard, _) = sim.block_on(ShardStore::open(sim.storage(), dir, shard_config)).unwrap();
    let config = GroupConfig { retention_bytes: 1 << 20, ..group_config(Durability::Replicated) };
    sim.block_on(shard.create_group(GROUP, config)).unwrap();
    shard.group_mut(GROUP).unwrap().set_retention_floor(u64::MAX);
    let mut deleted = 0;
    let mut op = 0;
    while deleted < RETIRED_FILES_MAX + 8 {
        for _ in 0..64 {
            append(&mut shard, 1, 16 << 10, op);
            op += 1;
            if op % 8 == 0 {
                sim.block_on(shard.flush()).unwrap();
            }
        }
        deleted += sim.block_on(shard.enforce_retention(1_000_000)).unwrap();
        assert!(retired_in(&sim, dir).len() <= RETIRED_FILES_MAX);
    }
    assert_eq!(retired_in(&sim, dir).len(), RETIRED_FILES_MAX);
    assert_eq!(shard.take_retired_files().len(), RETIRED_FILES_MAX);
}
