//! A full disk on the simulated disk (DESIGN.md §3: "ENOSPC while preparing space ahead of the
//! tail is the one clean, retryable storage full"; §6: disk full has its outcome and a test).
//!
//! What these tests prove:
//! - appends are refused with `StorageFull` once the space made ready ahead of the tail runs out
//!   and no more can be reserved; the group is never failed, the shard never stops, and every
//!   group keeps serving reads;
//! - a full disk is probed only when the caller allows a retry (once per tick in the node layer),
//!   not by every flush cycle;
//! - once space is freed the next retry succeeds and appends resume, with no reopen;
//! - every acknowledged append survives a crash on the full disk, recovery on the full disk, and
//!   a crash after space came back, byte-identical with dense offsets;
//! - a rolled segment's index file that finds no room delays the checkpoint, never fails it;
//! - ENOSPC anywhere else (a data write into space believed ready, a sync) is an I/O failure:
//!   fail-stop, never mistaken for the clean case.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use shoal_engine::Error;
use shoal_engine::direct::PersistedPath;
use shoal_engine::record::build_prepare;
use shoal_engine::shard::{RecoveryReport, ShardConfig, ShardStore, group_dir};
use shoal_engine::storage::sim::{Sim, SimConfig, SimStorage};
use shoal_engine::storage::{OpenMode, Storage, StorageFile};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_proto::wire::Prepare;

const DIR: &str = "/data/shard-0";
const RECORD_BYTES_MAX: u32 = 32 << 10;
const ENOSPC: i32 = 28;

/// The group that stays away from the full disk's trouble, and the one that fills it.
const OTHER: u64 = 1;
const FILLED: u64 = 2;

fn group_config(durability: Durability) -> GroupConfig {
    common::group_config(durability, RECORD_BYTES_MAX)
}

fn open(sim: &Sim) -> (ShardStore<SimStorage>, RecoveryReport) {
    sim.block_on(ShardStore::open(sim.storage(), Path::new(DIR), ShardConfig::small())).unwrap()
}

fn body(op: u64, len: usize) -> Bytes {
    (0..len).map(|i| (i as u64 ^ op.wrapping_mul(131)) as u8).collect::<Vec<u8>>().into()
}

/// What the test knows of one group: every prepare appended (op → base offset, body) and the
/// highest op the engine reported durable, i.e. acknowledged.
#[derive(Default)]
struct Model {
    appended: BTreeMap<u64, (u64, Bytes)>,
    acknowledged: u64,
}

impl Model {
    fn try_append(
        &mut self,
        shard: &mut ShardStore<SimStorage>,
        group: u64,
        len: usize,
    ) -> Result<u64, Error> {
        let next = shard.next(group)?;
        let body = body(next.op, len);
        let fields =
            Prepare { record_count: 3, append_time_ms: next.op as i64, ..Prepare::default() };
        let header = build_prepare(&next, 1, 0, fields, &body);
        shard.append(group, &header, &body)?;
        self.appended.insert(next.op, (next.offset, body));
        Ok(next.op)
    }

    /// One flush, after allowing a retry of what a full disk refused (as the node layer does
    /// once per tick); what it made durable counts as acknowledged.
    fn flush(&mut self, sim: &Sim, shard: &mut ShardStore<SimStorage>, group: u64) -> bool {
        shard.on_tick();
        let report = sim.block_on(shard.flush()).expect("a full disk is no error");
        assert!(report.failed.is_empty(), "{report:?}");
        self.acknowledged = self.acknowledged.max(shard.durable_op(group).unwrap_or(0));
        report.storage_full
    }

    /// Every acknowledged prepare is served, byte-identical, at its offset; offsets are dense
    /// from 0 over everything served.
    fn check(&self, sim: &Sim, shard: &mut ShardStore<SimStorage>, group: u64, when: &str) {
        let log = shard.group_mut(group).unwrap();
        let served = sim.block_on(log.read_offset(0, usize::MAX)).expect("reads are served");
        let mut next_offset = 0;
        for prepare in &served {
            assert_eq!(prepare.base_offset(), next_offset, "{when}: offsets are dense");
            next_offset = prepare.end_offset();
            let (offset, body) = &self.appended[&prepare.op()];
            assert_eq!((prepare.base_offset(), &prepare.body()), (*offset, body), "{when}");
        }
        let served_head = served.last().map_or(0, |prepare| prepare.op());
        assert!(
            served_head >= self.acknowledged,
            "{when}: acknowledged op {} lost (served up to {served_head})",
            self.acknowledged
        );
    }
}

/// How the disk fills up under `FILLED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fill {
    /// While space ahead of the active segment's tail is still ready: appends go on into it,
    /// then are refused; everything taken is written and acknowledged.
    Ahead,
    /// Exactly as appends start a new segment: the spare segment made ready earlier takes the
    /// roll, so this is as clean as `Ahead`.
    AtRoll,
    /// After a burst of appends larger than the space ready, taken before the flush that finds
    /// the disk full: that data waits in memory for space (unacknowledged in a `replicated`
    /// group, acknowledged through the journal in a `persisted` one).
    Burst,
}

/// Fills the disk while appending to `FILLED`, then frees space.
fn fill_then_free(seed: u64, durability: Durability, fill: Fill) {
    let what = format!("seed {seed}, {durability:?}, {fill:?}");
    let sim = Sim::new(seed, SimConfig::default());
    let (mut shard, _) = open(&sim);
    sim.block_on(shard.create_group(OTHER, group_config(Durability::Persisted))).unwrap();
    sim.block_on(shard.create_group(FILLED, group_config(durability))).unwrap();
    let mut other = Model::default();
    let mut filled = Model::default();
    for _ in 0..5 {
        other.try_append(&mut shard, OTHER, 1000).unwrap();
    }
    other.flush(&sim, &mut shard, OTHER);

    // A 1 MiB segment holds 35 records of 29 KiB; `AtRoll` stops two short of the roll.
    let records = if fill == Fill::AtRoll { 34 } else { 10 };
    for _ in 0..records {
        filled.try_append(&mut shard, FILLED, 29_000).unwrap();
        filled.flush(&sim, &mut shard, FILLED);
    }
    if fill == Fill::Burst {
        // 12 × 29 KiB, more than the 256 KiB step ready ahead, with no flush in between.
        for _ in 0..12 {
            filled.try_append(&mut shard, FILLED, 29_000).unwrap();
        }
    }
    sim.set_capacity_bytes(sim.used_bytes() + if fill == Fill::Ahead { 16 << 10 } else { 0 });

    // Appends go on while they fit the space already made ready, then are refused.
    let mut refused = false;
    for _ in 0..200 {
        if filled.flush(&sim, &mut shard, FILLED) && fill != Fill::Burst {
            panic!("{what}: only data taken beyond the space ready waits for space");
        }
        match filled.try_append(&mut shard, FILLED, 29_000) {
            Ok(_) => {}
            Err(Error::StorageFull) => {
                refused = true;
                break;
            }
            // The journal waits for checkpoints that cannot cover what waits for space.
            Err(Error::LimitReached(_)) => {}
            Err(error) => panic!("{what}: {error}"),
        }
    }
    filled.flush(&sim, &mut shard, FILLED);
    assert!(refused, "{what}: a full disk refuses appends");
    let log = shard.group(FILLED).unwrap();
    assert!(log.is_storage_full(), "{what}");
    assert!(log.faulty_reason().is_none(), "{what}: storage full is not fail-stop");
    assert!(shard.failure().is_none(), "{what}");
    let last = *filled.appended.keys().last().unwrap();
    match fill {
        Fill::Ahead | Fill::AtRoll => {
            // Everything taken fit the space made ready: all written and acknowledged.
            assert_eq!(filled.acknowledged, last, "{what}");
            assert!(!log.has_unwritten() || durability == Durability::Persisted, "{what}");
        }
        Fill::Burst if durability == Durability::Replicated => {
            // What the disk had no room for waits in memory, unacknowledged.
            assert!(log.has_unwritten(), "{what}");
            assert!(filled.acknowledged < last, "{what}: acknowledged without room");
        }
        Fill::Burst => {}
    }
    if fill == Fill::AtRoll {
        assert_eq!(log.segment_count(), 2, "{what}: the roll took the spare");
    }

    // Refused again and again, while flushes and reads go on: no failure, no busy probing.
    let probes = sim.stats().enospc_errors;
    for _ in 0..5 {
        assert!(matches!(filled.try_append(&mut shard, FILLED, 29_000), Err(Error::StorageFull)));
        let mut cycle = shard.begin_flush();
        while let Some(flush) = cycle {
            let done = sim.block_on(flush.run());
            assert!(shard.finish_flush(done).failed.is_empty());
            cycle = shard.begin_flush();
        }
    }
    assert_eq!(sim.stats().enospc_errors, probes, "{what}: only a retry probes the disk");
    filled.flush(&sim, &mut shard, FILLED);
    assert!(sim.stats().enospc_errors > probes, "{what}: a retry probes the disk");
    other.try_append(&mut shard, OTHER, 10).map(drop).unwrap_or_else(|error| {
        // The other group may need space too; it must say so cleanly.
        assert!(matches!(error, Error::StorageFull | Error::LimitReached(_)), "{what}: {error}");
    });
    other.flush(&sim, &mut shard, OTHER);
    other.check(&sim, &mut shard, OTHER, &format!("{what}: other group, disk full"));
    filled.check(&sim, &mut shard, FILLED, &format!("{what}: disk full"));

    // A crash on the full disk (a power loss for `persisted`; a process crash for `replicated`,
    // which a single node promises to survive), then recovery on the still full disk.
    drop(shard);
    if durability == Durability::Persisted {
        sim.crash();
    }
    let (mut shard, report) = open(&sim);
    assert!(report.groups.iter().all(|group| group.corruption.is_none()), "{what}: {report:?}");
    filled.check(&sim, &mut shard, FILLED, &format!("{what}: recovered on a full disk"));
    other.check(&sim, &mut shard, OTHER, &format!("{what}: other group recovered"));
    filled.flush(&sim, &mut shard, FILLED);
    assert!(shard.group(FILLED).unwrap().faulty_reason().is_none(), "{what}");

    // Space comes back: the next retry goes through and appends resume, with no reopen.
    sim.set_capacity_bytes(u64::MAX);
    filled.flush(&sim, &mut shard, FILLED);
    let op = filled.try_append(&mut shard, FILLED, 29_000).expect("appends resume");
    for _ in 0..4 {
        filled.flush(&sim, &mut shard, FILLED);
    }
    assert!(!shard.group(FILLED).unwrap().is_storage_full(), "{what}");
    assert!(filled.acknowledged >= op, "{what}: the new append is acknowledged");
    if durability == Durability::Replicated {
        // (A `persisted` group batches its segment writes; the journal holds the rest.)
        assert!(!shard.group(FILLED).unwrap().has_unwritten(), "{what}: what waited is written");
    }
    filled.check(&sim, &mut shard, FILLED, &format!("{what}: space freed"));

    // And a crash after space came back loses nothing either.
    drop(shard);
    if durability == Durability::Persisted {
        sim.crash();
    }
    let (mut shard, report) = open(&sim);
    assert!(report.groups.iter().all(|group| group.corruption.is_none()), "{what}: {report:?}");
    filled.check(&sim, &mut shard, FILLED, &format!("{what}: recovered after space came back"));
    other.check(&sim, &mut shard, OTHER, &format!("{what}: other group at the end"));
}

#[test]
fn full_disk_refuses_appends_keeps_the_group_and_resumes_once_space_is_freed() {
    for seed in 0..4 {
        for durability in [Durability::Replicated, Durability::Persisted] {
            for fill in [Fill::Ahead, Fill::AtRoll, Fill::Burst] {
                fill_then_free(30 + seed, durability, fill);
            }
        }
    }
}

fn index_files(sim: &Sim, group: u64) -> Vec<PathBuf> {
    let dir = group_dir(Path::new(DIR), group);
    sim.paths()
        .into_iter()
        .filter(|path| {
            path.parent() == Some(&dir) && path.extension().is_some_and(|e| e == "index")
        })
        .collect()
}

/// Appends to `FILLED` until its log rolled, written by flush cycles alone (no checkpoint job
/// yet: the roll's index file waits for one).
fn roll_by_flush_cycles(sim: &Sim, shard: &mut ShardStore<SimStorage>, model: &mut Model) {
    while shard.group(FILLED).unwrap().segment_count() < 2 {
        model.try_append(shard, FILLED, 29_000).unwrap();
        while let Some(flush) = shard.begin_flush() {
            let done = sim.block_on(flush.run());
            assert!(shard.finish_flush(done).failed.is_empty());
        }
    }
}

/// Regression: a rolled segment's index file is a new file written at checkpoint; ENOSPC there
/// was mapped to `StorageFull` and the node layer stopped every group on it. It now delays the
/// checkpoint until a retry, and no group fails.
#[test]
fn index_file_without_room_delays_the_checkpoint_and_fails_nothing() {
    let sim = Sim::new(40, SimConfig::default());
    let (mut shard, _) = open(&sim);
    sim.block_on(shard.create_group(FILLED, group_config(Durability::Replicated))).unwrap();
    let mut model = Model::default();
    roll_by_flush_cycles(&sim, &mut shard, &mut model);
    assert!(shard.has_checkpoint_pending(), "a roll asks for a checkpoint");
    let before = shard.group(FILLED).unwrap().checkpoint();
    sim.set_capacity_bytes(sim.used_bytes());
    let job = shard.begin_checkpoint().expect("due");
    let done = sim.block_on(job.run());
    assert!(matches!(shard.finish_checkpoint(done), Err(Error::StorageFull)));
    assert!(shard.failure().is_none());
    assert!(shard.group(FILLED).unwrap().faulty_reason().is_none());
    assert_eq!(shard.group(FILLED).unwrap().checkpoint(), before, "nothing recorded");
    assert!(shard.is_storage_full());
    // Appends into the space already made ready go on meanwhile.
    model.try_append(&mut shard, FILLED, 1000).unwrap();
    // Space comes back: the retried checkpoint settles the rolled segment.
    sim.set_capacity_bytes(u64::MAX);
    model.flush(&sim, &mut shard, FILLED);
    model.flush(&sim, &mut shard, FILLED);
    assert!(shard.group(FILLED).unwrap().checkpoint().op > before.op, "checkpoint recorded");
    assert_eq!(index_files(&sim, FILLED).len(), 1, "the rolled segment's index is written");
    assert!(!shard.is_storage_full());
    model.check(&sim, &mut shard, FILLED, "after the retried checkpoint");
}

/// Regression: ENOSPC from a segment data write used to be mapped to `StorageFull` and retried.
/// Writes only ever go into space made ready, so ENOSPC there means that promise broke: it is an
/// I/O failure, fail-stop for the group, and the other groups go on.
#[test]
fn enospc_from_a_data_write_is_fail_stop_not_storage_full() {
    let sim = Sim::new(41, SimConfig::default());
    let (mut shard, _) = open(&sim);
    sim.block_on(shard.create_group(OTHER, group_config(Durability::Replicated))).unwrap();
    sim.block_on(shard.create_group(FILLED, group_config(Durability::Replicated))).unwrap();
    let mut other = Model::default();
    let mut filled = Model::default();
    filled.try_append(&mut shard, FILLED, 100).unwrap();
    other.try_append(&mut shard, OTHER, 100).unwrap();
    filled.flush(&sim, &mut shard, FILLED);
    let segment = sim
        .paths()
        .into_iter()
        .find(|path| {
            path.parent() == Some(&group_dir(Path::new(DIR), FILLED))
                && path.extension().is_some_and(|e| e == "log")
        })
        .unwrap();
    sim.fail_next_write_with(&segment, ENOSPC);
    filled.try_append(&mut shard, FILLED, 100).unwrap();
    other.try_append(&mut shard, OTHER, 100).unwrap();
    let report = sim.block_on(shard.flush()).unwrap();
    assert!(!report.storage_full, "{report:?}");
    assert_eq!(report.failed.len(), 1, "{report:?}");
    assert_eq!(report.failed[0].0, FILLED);
    assert!(matches!(
        filled.try_append(&mut shard, FILLED, 100),
        Err(Error::Faulty { group: FILLED, .. })
    ));
    assert_eq!(shard.durable_op(OTHER), Some(2), "the other group goes on");
}

/// ENOSPC from the journal's sync (writeback that found no room) stops the shard like any
/// journal failure: the page cache may have dropped what the sync did not make durable.
#[test]
fn enospc_from_a_journal_sync_stops_the_shard() {
    let sim = Sim::new(42, SimConfig::default());
    let config = ShardConfig { persisted_path: PersistedPath::Journal, ..ShardConfig::small() };
    let (mut shard, _) =
        sim.block_on(ShardStore::open(sim.storage(), Path::new(DIR), config)).unwrap();
    sim.block_on(shard.create_group(FILLED, group_config(Durability::Persisted))).unwrap();
    let mut model = Model::default();
    model.try_append(&mut shard, FILLED, 100).unwrap();
    model.flush(&sim, &mut shard, FILLED);
    sim.fail_next_sync_with(&Path::new(DIR).join("journal"), ENOSPC);
    model.try_append(&mut shard, FILLED, 100).unwrap();
    assert!(sim.block_on(shard.flush()).is_err(), "the shard stops");
    assert!(shard.failure().is_some());
    assert_eq!(shard.durable_op(FILLED), Some(1), "nothing unsynced counts as durable");
}

fn spare_path() -> PathBuf {
    group_dir(Path::new(DIR), FILLED).join(shoal_engine::segment::SPARE_NAME)
}

fn open_spare(sim: &Sim, mode: OpenMode) -> <SimStorage as Storage>::File {
    sim.block_on(sim.storage().open(&spare_path(), mode, false)).unwrap()
}

/// The spare segment file makes the next segment's space ready before the roll: it is there
/// once the active segment nears its end, survives a restart (reused, so a full disk after a
/// restart still has it), takes the roll without new space, and `shoal-inspect` knows it.
#[test]
fn spare_segment_takes_the_roll_on_a_full_disk_after_a_restart() {
    let sim = Sim::new(43, SimConfig::default());
    let (mut shard, _) = open(&sim);
    sim.block_on(shard.create_group(FILLED, group_config(Durability::Replicated))).unwrap();
    let mut model = Model::default();
    for _ in 0..33 {
        model.try_append(&mut shard, FILLED, 29_000).unwrap();
        model.flush(&sim, &mut shard, FILLED);
    }
    assert_eq!(shard.group(FILLED).unwrap().segment_count(), 1);
    assert!(sim.file_contents(&spare_path()).is_some_and(|c| c.is_empty()), "spare made");
    sim.block_on(shard.close()).unwrap();
    let report = sim.block_on(shoal_engine::inspect::inspect(&sim.storage(), Path::new("/data")));
    assert!(report.is_clean(), "{report:?}");
    assert!(report.notes.iter().all(|note| note.file != spare_path()), "{:?}", report.notes);
    // Reserving grew the spare's size (its space reads as zeros), yet it holds no records: it
    // is not a recycled segment, so a restart with recycling off keeps it too.
    let spare_size = || sim.block_on(open_spare(&sim, OpenMode::Read).size_bytes()).unwrap();
    assert!(spare_size() > 0, "the reservation grew the spare's size");
    let config = ShardConfig { recycle_segments: false, ..ShardConfig::small() };
    let (shard, _) = sim.block_on(ShardStore::open(sim.storage(), Path::new(DIR), config)).unwrap();
    assert!(spare_size() > 0, "a reserved spare is kept with recycling off");
    sim.block_on(shard.close()).unwrap();

    // Restart on a disk that is now full: what was reserved before is still there.
    sim.set_capacity_bytes(sim.used_bytes());
    let (mut shard, _) = open(&sim);
    for _ in 0..6 {
        match model.try_append(&mut shard, FILLED, 29_000) {
            Ok(_) => {}
            Err(Error::StorageFull) => break,
            Err(error) => panic!("{error}"),
        }
        assert!(!model.flush(&sim, &mut shard, FILLED), "nothing waits for space");
    }
    let log = shard.group(FILLED).unwrap();
    assert_eq!(log.segment_count(), 2, "rolled into the spare");
    assert!(sim.file_contents(&spare_path()).is_none(), "the spare became the new segment");
    assert_eq!(model.acknowledged, *model.appended.keys().last().unwrap());
    model.check(&sim, &mut shard, FILLED, "after the roll into the spare");

    // A spare that is not empty is a recycled segment: recovery keeps it, or removes it with
    // recycling off.
    sim.set_capacity_bytes(u64::MAX);
    drop(shard);
    let file = open_spare(&sim, OpenMode::CreateReadWrite);
    sim.block_on(file.write_at(Bytes::from_static(b"x"), 0)).unwrap();
    drop(file);
    let report = sim.block_on(shoal_engine::inspect::inspect(&sim.storage(), Path::new("/data")));
    assert!(report.notes.iter().any(|note| note.file == spare_path()), "{:?}", report.notes);
    let (mut shard, _) = open(&sim);
    assert!(sim.file_contents(&spare_path()).is_some(), "a written spare is kept");
    model.check(&sim, &mut shard, FILLED, "after keeping a written spare");
    drop(shard);
    let config = ShardConfig { recycle_segments: false, ..ShardConfig::small() };
    let (mut shard, _) =
        sim.block_on(ShardStore::open(sim.storage(), Path::new(DIR), config)).unwrap();
    assert!(sim.file_contents(&spare_path()).is_none(), "without recycling it is removed");
    model.check(&sim, &mut shard, FILLED, "after removing a written spare");
}

/// A checkpoint job carries every dirty slot, a view change's too, not only its checkpoints.
/// When it finds no room, nothing of it reaches the superblock: the other group's new views
/// stay waiting (`slot_durable` false, which keeps its replica from revealing them), are
/// written by the retried job once space is back, and a restart finds them.
#[test]
fn views_a_checkpoint_without_room_carried_wait_for_the_retry_and_survive_a_restart() {
    let sim = Sim::new(41, SimConfig::default());
    let (mut shard, _) = open(&sim);
    sim.block_on(shard.create_group(OTHER, group_config(Durability::Replicated))).unwrap();
    sim.block_on(shard.create_group(FILLED, group_config(Durability::Replicated))).unwrap();
    let mut model = Model::default();
    roll_by_flush_cycles(&sim, &mut shard, &mut model);
    assert!(shard.slot_durable(OTHER));
    shard.set_views(OTHER, 3, 3, Some(0)).unwrap();
    assert!(!shard.slot_durable(OTHER), "recorded, not written");
    sim.set_capacity_bytes(sim.used_bytes());
    let job = shard.begin_checkpoint().expect("due");
    assert!(!shard.slot_durable(OTHER), "in the job in flight");
    let done = sim.block_on(job.run());
    assert!(matches!(shard.finish_checkpoint(done), Err(Error::StorageFull)));
    assert!(!shard.slot_durable(OTHER), "the superblock was not written");
    sim.set_capacity_bytes(u64::MAX);
    for _ in 0..4 {
        if shard.slot_durable(OTHER) {
            break;
        }
        model.flush(&sim, &mut shard, FILLED);
    }
    assert!(shard.slot_durable(OTHER), "the retried checkpoint wrote the slot");
    drop(shard);
    sim.crash();
    let (shard, _) = open(&sim);
    let slot = shard.group(OTHER).unwrap().slot();
    assert_eq!((slot.view, slot.log_view), (3, 3));
}
