//! The shard's batch cache on the simulated disk: batches a ring lets go are served from memory,
//! a reader in order is served by read-ahead after one miss, the budget holds, a truncation
//! leaves no cut op behind, damage that read-ahead runs into is left for the read that wants
//! it, and a restart's reads (headers, ops in order) leave the cache alone.

mod common;

use std::path::Path;

use shoal_engine::Error;
use shoal_engine::partition::{PartitionLog, ReadPlan};
use shoal_engine::record::build_prepare;
use shoal_engine::ring::{RingLimits, StoredPrepare};
use shoal_engine::segment::log_name;
use shoal_engine::shard::{ShardConfig, ShardStore, group_dir};
use shoal_engine::storage::sim::{Sim, SimConfig, SimStorage};
use shoal_engine::superblock::Durability;
use shoal_proto::batch::BatchBuilder;
use shoal_proto::wire::Prepare;

const GROUP: u64 = 7;
const RECORDS: i64 = 300;

fn config(cache_bytes: usize) -> ShardConfig {
    ShardConfig {
        ring: RingLimits { entries_max: 8, bytes_max: 1 << 20 },
        batch_cache_bytes: cache_bytes,
        scan_window_bytes: 8 << 10,
        index_interval_bytes: 1 << 10,
        read_ahead_windows: 2,
        ..ShardConfig::small()
    }
}

fn open(sim: &Sim, config: ShardConfig) -> ShardStore<SimStorage> {
    let dir = Path::new("/data/shard-0");
    sim.block_on(ShardStore::open(sim.storage(), dir, config)).unwrap().0
}

/// Op `i + 1`'s body: three records whose values say which batch they are.
fn body(i: i64) -> bytes::Bytes {
    body_of(i, 20)
}

/// A body of about 7 KB: 300 of them fill more than one segment.
fn big_body(i: i64) -> bytes::Bytes {
    body_of(i, 200)
}

fn body_of(i: i64, repeats: usize) -> bytes::Bytes {
    let mut builder = BatchBuilder::new(1_000 + i);
    let value = format!("batch {i:05} ").repeat(repeats);
    for r in 0..3 {
        builder.push(1_000 + i + r, None, Some(value.as_bytes()), &[]);
    }
    builder.build()
}

/// A shard holding `RECORDS` flushed prepares of one `replicated` group (3 offsets each).
fn filled(sim: &Sim, cache_bytes: usize) -> ShardStore<SimStorage> {
    filled_with(sim, cache_bytes, body)
}

fn filled_with(
    sim: &Sim,
    cache_bytes: usize,
    body: fn(i64) -> bytes::Bytes,
) -> ShardStore<SimStorage> {
    let mut shard = open(sim, config(cache_bytes));
    sim.block_on(shard.create_group(GROUP, common::group_config(Durability::Replicated, 64 << 10)))
        .unwrap();
    for i in 0..RECORDS {
        append(&mut shard, &body(i));
        if i % 5 == 4 {
            sim.block_on(shard.flush()).unwrap();
        }
    }
    sim.block_on(shard.flush()).unwrap();
    shard
}

/// A shard filled as [`filled_with`] fills it, closed and opened again: its cache and its
/// rings are empty.
fn reopened(sim: &Sim, body: fn(i64) -> bytes::Bytes) -> ShardStore<SimStorage> {
    let shard = filled_with(sim, 1 << 20, body);
    sim.block_on(shard.close()).unwrap();
    open(sim, config(1 << 20))
}

/// A shard filled with [`big_body`]s and closed, bits of its first segment flipped 300,000
/// bytes in (past its first records), then opened again. The first segment is sealed: its index
/// is on file, so recovery does not scan it and finds nothing wrong.
fn damaged_past_its_first_records(sim: &Sim) -> ShardStore<SimStorage> {
    let shard = filled_with(sim, 1 << 20, big_body);
    sim.block_on(shard.close()).unwrap();
    let segment = group_dir(Path::new("/data/shard-0"), GROUP).join(log_name(0));
    sim.corrupt(&segment, 300_000, 3);
    open(sim, config(1 << 20))
}

fn append(shard: &mut ShardStore<SimStorage>, body: &bytes::Bytes) {
    let next = shard.next(GROUP).unwrap();
    let fields = Prepare { record_count: 3, append_time_ms: 1, ..Prepare::default() };
    let header = build_prepare(&next, 1, 0, fields, body);
    shard.append(GROUP, &header, body).unwrap();
}

/// One fetch as the server runs it: the plan, its disk read if any, then the read-ahead it
/// asks for, each run to completion.
fn fetch(
    sim: &Sim,
    log: &mut PartitionLog<SimStorage>,
    offset: u64,
    bytes_max: usize,
) -> Result<Vec<StoredPrepare>, Error> {
    let found = match log.plan_read_offset(offset, bytes_max)? {
        ReadPlan::Done(found) => found,
        ReadPlan::Disk(read) => log.finish_read(sim.block_on(read.run()))?,
    };
    if let Some(last) = found.last() {
        for read in log.plan_read_ahead(last.end_offset()) {
            let done = sim.block_on(read.run());
            log.finish_read_ahead(done);
        }
    }
    Ok(found)
}

/// Checks `found` continues the reader at `next_op` with the right bodies; returns the op after.
fn check_run(found: &[StoredPrepare], next_op: u64) -> u64 {
    check_run_of(found, next_op, body)
}

fn check_run_of(found: &[StoredPrepare], next_op: u64, body: fn(i64) -> bytes::Bytes) -> u64 {
    let mut op = next_op;
    for prepare in found {
        assert_eq!(prepare.op(), op);
        assert_eq!(prepare.base_offset(), (op - 1) * 3);
        assert_eq!(prepare.body(), body(op as i64 - 1), "op {op}");
        op += 1;
    }
    op
}

#[test]
fn batches_a_ring_lets_go_are_served_from_the_cache_as_they_were_written() {
    let sim = Sim::new(1, SimConfig::default());
    let mut shard = filled(&sim, 1 << 20);
    let (cached_bytes, counters) = shard.batch_cache();
    assert!(cached_bytes > 0 && counters.inserted_bytes > 0, "the ring's evictions went in");
    let log = shard.group_mut(GROUP).unwrap();
    // Everything before the ring's 8 is in the cache: one plan serves it, no disk read.
    let found = match log.plan_read_offset(0, usize::MAX).unwrap() {
        ReadPlan::Done(found) => found,
        ReadPlan::Disk(_) => panic!("offset 0 is cached"),
    };
    assert_eq!(check_run(&found, 1), RECORDS as u64 + 1, "the cached run goes on in the ring");
    // A reader at the tail reads the ring: no read-ahead of what the ring holds.
    assert!(log.plan_read_ahead((RECORDS as u64 - 2) * 3).is_empty());
    let (_, counters) = shard.batch_cache();
    assert_eq!((counters.hits, counters.misses), (1, 0));
}

#[test]
fn a_reader_in_order_is_served_by_read_ahead_after_one_miss() {
    let sim = Sim::new(2, SimConfig::default());
    // Reopened: the cache is empty and the ring holds nothing either.
    let mut shard = reopened(&sim, body);
    assert_eq!(shard.batch_cache().0, 0);
    let log = shard.group_mut(GROUP).unwrap();
    let (mut offset, mut op, mut fetches) = (0, 1, 0);
    while op <= RECORDS as u64 {
        let found = fetch(&sim, log, offset, 2 << 10).unwrap();
        assert!(!found.is_empty(), "offset {offset} exists");
        op = check_run(&found, op);
        offset = found.last().unwrap().end_offset();
        fetches += 1;
        assert!(fetches < 1_000, "bounded");
    }
    let (_, counters) = shard.batch_cache();
    assert_eq!(counters.misses, 1, "{counters:?}");
    assert_eq!(counters.hits, fetches - 1);
    assert!(counters.reads_ahead >= 2, "{counters:?}");
}

#[test]
fn the_cache_stays_within_its_budget_and_keeps_the_newest() {
    let budget = 16 << 10;
    let sim = Sim::new(3, SimConfig::default());
    let mut shard = filled(&sim, budget);
    let (cached_bytes, counters) = shard.batch_cache();
    assert!(cached_bytes <= budget && cached_bytes > budget / 2, "{cached_bytes}");
    assert!(counters.evicted_bytes > 0);
    // The oldest went first: offset 0 reads the disk, and the reader then goes on in order
    // within the budget.
    let log = shard.group_mut(GROUP).unwrap();
    assert!(matches!(log.plan_read_offset(0, 1 << 10).unwrap(), ReadPlan::Disk(_)));
    let (mut offset, mut op) = (0, 1);
    for _ in 0..1_000 {
        if op > RECORDS as u64 {
            break;
        }
        let log = shard.group_mut(GROUP).unwrap();
        let found = fetch(&sim, log, offset, 4 << 10).unwrap();
        op = check_run(&found, op);
        offset = found.last().unwrap().end_offset();
        assert!(shard.batch_cache().0 <= budget);
    }
    assert_eq!(op, RECORDS as u64 + 1);
}

#[test]
fn a_truncation_leaves_no_cut_op_in_the_cache_even_from_a_read_in_flight() {
    let sim = Sim::new(4, SimConfig::default());
    let mut shard = reopened(&sim, body);
    // A disk read planned before the cut, finished after it, caches nothing.
    let log = shard.group_mut(GROUP).unwrap();
    let ReadPlan::Disk(read) = log.plan_read_offset(0, usize::MAX).unwrap() else {
        panic!("the cache is empty after a reopen");
    };
    sim.block_on(shard.truncate_after(GROUP, 30, 2)).unwrap();
    let done = sim.block_on(read.run());
    let _ = shard.group_mut(GROUP).unwrap().finish_read(done);
    assert_eq!(shard.batch_cache().0, 0, "planned before the cut");
    // Cached ops above a cut go with it: fill the cache, cut, append other bodies.
    let log = shard.group_mut(GROUP).unwrap();
    let mut offset = 0;
    while offset < 90 {
        offset = fetch(&sim, log, offset, 1 << 10).unwrap().last().unwrap().end_offset();
    }
    assert!(
        matches!(log.plan_read_offset(75, 1).unwrap(), ReadPlan::Done(found) if !found.is_empty())
    );
    sim.block_on(shard.truncate_after(GROUP, 20, 3)).unwrap();
    for i in 0..10 {
        append(&mut shard, &body(1_000 + i));
        if i % 5 == 4 {
            sim.block_on(shard.flush()).unwrap();
        }
    }
    let log = shard.group_mut(GROUP).unwrap();
    let found = fetch(&sim, log, 60, usize::MAX).unwrap();
    assert_eq!(found.len(), 10);
    for (i, prepare) in found.iter().enumerate() {
        assert_eq!(prepare.op(), 21 + i as u64);
        assert_eq!(prepare.body(), body(1_000 + i as i64), "the new op, never the cut one");
    }
}

#[test]
fn damage_read_ahead_runs_into_is_left_for_the_read_that_wants_it() {
    let sim = Sim::new(5, SimConfig::default());
    let mut shard = damaged_past_its_first_records(&sim);
    let log = shard.group_mut(GROUP).unwrap();
    let (mut offset, mut op) = (0, 1);
    let error = loop {
        assert!(op <= RECORDS as u64, "the damage is found");
        match fetch(&sim, log, offset, 1 << 10) {
            Ok(found) => {
                op = check_run_of(&found, op, big_body);
                offset = found.last().unwrap().end_offset();
                assert!(log.faulty_reason().is_none(), "read-ahead alone never stops the log");
            }
            Err(error) => break error,
        }
    };
    assert!(error.to_string().contains("checksum mismatch"), "{error}");
    assert!(op > 10, "the reader got as far as the damage: op {op}");
    assert!(log.faulty_reason().is_some(), "the read that wanted it stopped the log");
}

#[test]
fn a_restarts_reads_of_headers_and_ops_check_every_record_and_cache_nothing() {
    let sim = Sim::new(6, SimConfig::default());
    let mut shard = reopened(&sim, body);
    let log = shard.group_mut(GROUP).unwrap();
    let head = RECORDS as u64;
    let headers = sim.block_on(log.read_newest_headers(128)).unwrap();
    let ops: Vec<u64> = headers.iter().map(|h| h.as_prepare().unwrap().op).collect();
    assert_eq!(ops, (head - 127..=head).collect::<Vec<_>>());
    let ops_read = sim.block_on(log.read_ops(head - 127, usize::MAX, usize::MAX)).unwrap();
    assert_eq!(ops_read.len(), 128);
    for (header, prepare) in headers.iter().zip(&ops_read) {
        assert_eq!(header, &prepare.header, "op {}", prepare.op());
    }
    check_run(&ops_read, head - 127);
    // More than the log holds: from its first op.
    assert_eq!(sim.block_on(log.read_newest_headers(1_000)).unwrap().len(), RECORDS as usize);
    let (cached_bytes, counters) = shard.batch_cache();
    assert_eq!((cached_bytes, counters.inserted_bytes), (0, 0), "{counters:?}");

    // Damage in a body is found although only the headers are kept.
    let sim = Sim::new(7, SimConfig::default());
    let mut shard = damaged_past_its_first_records(&sim);
    let log = shard.group_mut(GROUP).unwrap();
    let error = sim.block_on(log.read_newest_headers(1_000)).unwrap_err();
    assert!(error.to_string().contains("checksum mismatch"), "{error}");
    assert!(log.faulty_reason().is_some(), "damage stops the log");
}
