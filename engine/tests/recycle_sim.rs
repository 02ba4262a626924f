//! Segment recycling on the simulated disk: retention hands a retired segment's file to the next
//! roll, whose records overwrite the retired ones. The log must read back byte-identical and
//! reopen with no torn tail and no faulty op — after a process crash and after a close — even
//! when a record ends exactly on a block boundary or too close to one for a header, where the
//! retired segment's bytes would otherwise lie right past the data (`written_extent_end`).

mod common;

use bytes::Bytes;
use shoal_engine::inspect::inspect;
use shoal_engine::record::build_prepare;
use shoal_engine::shard::{ShardConfig, ShardStore};
use shoal_engine::storage::Storage;
use shoal_engine::storage::sim::{Sim, SimConfig, SimStorage};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_proto::batch::BatchBuilder;
use shoal_proto::wire::{HEADER_SIZE, Prepare};
use std::path::Path;

const GROUP: u64 = 7;
const RECORD_BYTES_MAX: u32 = 64 << 10;
const BLOCK: u64 = 4096;
const SEGMENT_BYTES: u64 = 1 << 20;

fn body(value_len: usize, timestamp_ms: i64) -> Bytes {
    let mut builder = BatchBuilder::new(timestamp_ms);
    builder.push(timestamp_ms, None, Some(&vec![b'r'; value_len]), &[]);
    builder.build()
}

/// The value length whose one-record batch makes a record of exactly `record_bytes`, if any
/// (varint lengths make a few sizes unreachable).
fn value_len_for(record_bytes: u64) -> Option<usize> {
    let target = record_bytes.checked_sub(HEADER_SIZE as u64)? as usize;
    (target.saturating_sub(96)..=target).find(|&len| body(len, 0).len() == target)
}

/// Where the next record should end within its last block.
#[derive(Clone, Copy)]
enum End {
    /// Exactly on a block boundary: no padding follows.
    OnBoundary,
    /// This many bytes before a boundary: less room than a header.
    Before(u64),
    /// Wherever a size of this many bytes puts it.
    Free(u64),
}

/// Appends one record ending as asked, following the segment layout (rolls at 1 MiB) in
/// `end_bytes`; returns the body.
fn append(
    shard: &mut ShardStore<SimStorage>,
    end_bytes: &mut u64,
    end: End,
    time_ms: i64,
) -> Bytes {
    let want_mod = |size: u64, from: u64| match end {
        End::OnBoundary => (from + size).is_multiple_of(BLOCK),
        End::Before(gap) => (from + size) % BLOCK == BLOCK - gap,
        End::Free(_) => true,
    };
    // Near the segment's end the record rolls: size it past the room left, from position 0.
    let room = SEGMENT_BYTES - *end_bytes;
    let (from, sizes) = match end {
        End::Free(size) => (*end_bytes, size..=size + 64),
        _ if room < 20_000 => (0, room + 1..=room + 2 * BLOCK),
        _ => (*end_bytes, 8_192..=8_192 + 2 * BLOCK),
    };
    let (size, value_len) = sizes
        .filter(|&size| want_mod(size, from))
        .find_map(|size| value_len_for(size).map(|len| (size, len)))
        .expect("a reachable size");
    let rolls = *end_bytes > 0 && *end_bytes + size > SEGMENT_BYTES;
    *end_bytes = if rolls { size } else { *end_bytes + size };
    let data = body(value_len, time_ms);
    let next = shard.next(GROUP).unwrap();
    let fields = Prepare { record_count: 1, append_time_ms: time_ms, ..Prepare::default() };
    let header = build_prepare(&next, 1, 0, fields, &data);
    assert_eq!(u64::from(header.size), size);
    shard.append(GROUP, &header, &data).unwrap();
    data
}

/// Opens the shard; recovery must find no damage and no torn tail (and, after a close, no
/// faulty op: after a crash a `replicated` group's suffix is faulty by rule).
fn open(sim: &Sim, dir: &Path, after_close: bool) -> ShardStore<SimStorage> {
    let (shard, report) =
        sim.block_on(ShardStore::open(sim.storage(), dir, ShardConfig::small())).unwrap();
    let seed = sim.seed();
    for group in &report.groups {
        assert!(group.corruption.is_none(), "seed {seed}: {group:?}");
        assert!(group.torn_tail.is_none(), "seed {seed}: stale bytes read as torn: {group:?}");
        assert!(!after_close || group.faulty.suffix_from.is_none(), "seed {seed}: {group:?}");
    }
    shard
}

/// Removes every segment index, so recovery rebuilds each by scanning its segment to the end
/// of data, where only zeros may follow in a synced segment.
fn remove_indexes(sim: &Sim, dir: &Path) {
    let storage = sim.storage();
    let group_dir = shoal_engine::shard::group_dir(dir, GROUP);
    for name in sim.block_on(storage.list_dir(&group_dir)).unwrap() {
        if shoal_engine::segment::parse_index_name(&name).is_some() {
            sim.block_on(storage.remove_file(&group_dir.join(name))).unwrap();
        }
    }
}

/// Every record from the log's first offset on, against the bodies appended.
fn check_log(sim: &Sim, shard: &mut ShardStore<SimStorage>, bodies: &[Bytes]) {
    let log = shard.group_mut(GROUP).unwrap();
    assert_eq!(log.head_op(), bodies.len() as u64);
    let first = log.first_offset();
    assert!(first > 0, "retention trimmed the log");
    let read = sim.block_on(log.read_offset(first, usize::MAX)).unwrap();
    assert_eq!(read.len() as u64, bodies.len() as u64 - first);
    for prepare in read {
        assert_eq!(
            prepare.body(),
            bodies[prepare.base_offset() as usize],
            "offset {}",
            prepare.base_offset()
        );
    }
}

/// Bytes written to the group's spare segment file (a reserved spare has none, whatever its
/// size), or `None` when there is no spare.
fn spare_written_bytes(sim: &Sim, dir: &Path) -> Option<usize> {
    let path = shoal_engine::shard::group_dir(dir, GROUP).join("spare.segment");
    sim.file_contents(&path).map(|contents| contents.len())
}

#[test]
fn retired_segments_are_recycled_and_the_log_reopens_clean() {
    for seed in 1..=3 {
        let sim = Sim::new(seed, SimConfig::default());
        let dir = Path::new("/data/shard-0");
        let mut shard = open(&sim, dir, true);
        let config = GroupConfig {
            retention_bytes: 2 * SEGMENT_BYTES,
            ..common::group_config(Durability::Replicated, RECORD_BYTES_MAX)
        };
        sim.block_on(shard.create_group(GROUP, config)).unwrap();
        let mut bodies = Vec::new();
        let mut end_bytes = 0;
        let mut spare_seen = false;
        let appends = 700;
        for i in 0..appends {
            let end = match (i % 3, i + 1 == appends) {
                (_, true) | (0, _) => End::OnBoundary,
                (1, _) => End::Before(1 + (i * 37 + seed) % (HEADER_SIZE as u64 - 1)),
                _ => End::Free(300 + (i * 7919 + seed * 101) % 30_000),
            };
            bodies.push(append(&mut shard, &mut end_bytes, end, i as i64));
            if i % 5 == 4 {
                let report = sim.block_on(shard.flush()).unwrap();
                assert!(report.failed.is_empty(), "{report:?}");
                sim.block_on(shard.enforce_retention(0)).unwrap();
                spare_seen |= spare_written_bytes(&sim, dir).is_some_and(|bytes| bytes > 0);
            }
        }
        sim.block_on(shard.flush()).unwrap();
        let recycled = shard.group(GROUP).unwrap().recycled_segments();
        assert!(recycled >= 5, "seed {seed}: {recycled} recycled");
        assert!(spare_seen, "a recycled spare holds the retired segment's bytes");
        check_log(&sim, &mut shard, &bodies);

        // A process crash: everything written survives, nothing past the last checkpoint was
        // synced, and recovery scans the recycled active segment past its checkpoint.
        drop(shard);
        remove_indexes(&sim, dir);
        let mut shard = open(&sim, dir, false);
        check_log(&sim, &mut shard, &bodies);
        let report = sim.block_on(inspect(&sim.storage(), Path::new("/data")));
        assert!(report.is_clean(), "seed {seed}: {:#?}", report.problems);

        // A close checkpoints the last record: where it ends is where the model says.
        sim.block_on(shard.close()).unwrap();
        remove_indexes(&sim, dir);
        let mut shard = open(&sim, dir, true);
        let checkpoint = shard.group(GROUP).unwrap().checkpoint();
        let last = (HEADER_SIZE + bodies.last().unwrap().len()) as u64;
        assert_eq!(checkpoint.position_bytes + last, end_bytes, "seed {seed}: the layout model");
        assert!(end_bytes.is_multiple_of(BLOCK), "the last record ends on a block boundary");
        check_log(&sim, &mut shard, &bodies);
        // Appends go on over the recycled file after the reopen zeroed what lay past the data.
        for i in 0..200 {
            bodies.push(append(&mut shard, &mut end_bytes, End::Free(9_000), 10_000 + i));
            if i % 10 == 9 {
                sim.block_on(shard.flush()).unwrap();
                sim.block_on(shard.enforce_retention(0)).unwrap();
            }
        }
        sim.block_on(shard.flush()).unwrap();
        drop(shard);
        let mut shard = open(&sim, dir, false);
        check_log(&sim, &mut shard, &bodies);
    }
}

/// Regression (found by the engine's 64-partition benchmark under retention): a log whose step
/// ahead is as large as its segments reserves its next spare right after each roll, before
/// retention retires the segment that could take its place, and a spare with as much space
/// reserved was never replaced, so such a log recycled almost nothing: every segment went into
/// reserved blocks. A spare whose space is only reserved gives way to a retired segment now.
#[test]
fn a_spare_only_reserved_gives_way_to_a_retired_segment() {
    let sim = Sim::new(11, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let config = ShardConfig { ready_ahead_bytes: 4 * SEGMENT_BYTES, ..ShardConfig::small() };
    let (mut shard, _) = sim.block_on(ShardStore::open(sim.storage(), dir, config)).unwrap();
    let group = GroupConfig {
        retention_bytes: SEGMENT_BYTES,
        ..common::group_config(Durability::Replicated, RECORD_BYTES_MAX)
    };
    sim.block_on(shard.create_group(GROUP, group)).unwrap();
    let (mut bodies, mut end_bytes) = (Vec::new(), 0);
    let (mut reserved_spares_seen, mut spares_due) = (0, 0);
    // 300 KB per flush: a 1 MiB step lasts two jobs, so the step grows to 4 MiB and the spare
    // is due as soon as a segment begins. Retention runs every fourth flush, as a server's
    // runs every few hundred milliseconds: the flushes after a roll reserve the next spare
    // before it.
    for i in 0..600 {
        bodies.push(append(&mut shard, &mut end_bytes, End::Free(30_000), i));
        if i % 10 == 9 {
            sim.block_on(shard.flush()).unwrap();
        }
        if i % 40 == 39 {
            // A fresh spare: its space reserved, nothing written.
            reserved_spares_seen += usize::from(spare_written_bytes(&sim, dir) == Some(0));
            let removed = sim.block_on(shard.enforce_retention(0)).unwrap();
            // One spare per call: a second segment retired at once is deleted.
            spares_due += removed.min(1);
        }
    }
    assert!(reserved_spares_seen >= 3, "fresh spares reserved after rolls: {reserved_spares_seen}");
    let recycled = shard.group(GROUP).unwrap().recycled_segments() as usize;
    assert!(spares_due >= 10, "{spares_due} retention passes retired a segment");
    assert_eq!(recycled, spares_due, "each pass's first retired segment replaced the spare");
    sim.block_on(shard.flush()).unwrap();
    check_log(&sim, &mut shard, &bodies);
    drop(shard);
    remove_indexes(&sim, dir);
    let mut shard = open(&sim, dir, false);
    check_log(&sim, &mut shard, &bodies);
}

#[test]
fn with_recycling_off_retention_deletes_the_files() {
    let sim = Sim::new(9, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let config = ShardConfig { recycle_segments: false, ..ShardConfig::small() };
    let (mut shard, _) = sim.block_on(ShardStore::open(sim.storage(), dir, config)).unwrap();
    let group = GroupConfig {
        retention_bytes: 2 * SEGMENT_BYTES,
        ..common::group_config(Durability::Replicated, RECORD_BYTES_MAX)
    };
    sim.block_on(shard.create_group(GROUP, group)).unwrap();
    let mut end_bytes = 0;
    let mut deleted = 0;
    for i in 0..400 {
        append(&mut shard, &mut end_bytes, End::Free(12_000), i);
        if i % 5 == 4 {
            sim.block_on(shard.flush()).unwrap();
            deleted += sim.block_on(shard.enforce_retention(0)).unwrap();
            assert!(
                spare_written_bytes(&sim, dir).is_none_or(|bytes| bytes == 0),
                "no retired bytes kept"
            );
        }
    }
    assert!(deleted >= 2);
    assert_eq!(shard.group(GROUP).unwrap().recycled_segments(), 0);
}
