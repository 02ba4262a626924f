//! Group deletion on the simulated disk (DESIGN.md §3, §6): a deleted group's files go, its id
//! can come back, and the new group never shows the old one's data — not from its segments,
//! not from the shard journal's entries, whatever a power loss kept.
//!
//! The canary `canary-journal-floor` (a new group forgets where the deleted one's journal
//! entries end) makes both tests fail: recovery replays the old group's prepares into the new
//! log, or finds them not connecting and marks its suffix faulty.

mod common;

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use bytes::Bytes;
use shoal_engine::direct::PersistedPath;
use shoal_engine::record::build_prepare;
use shoal_engine::rng::Rng;
use shoal_engine::shard::{ShardConfig, ShardStore, group_dir, group_of_dir_name};
use shoal_engine::storage::Storage;
use shoal_engine::storage::sim::{Sim, SimConfig, SimStorage};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_proto::wire::Prepare;

const GROUP: u64 = 7;
const OTHER: u64 = 8;
const SEEDS: u64 = 48;

fn config() -> GroupConfig {
    common::group_config(Durability::Persisted, 32 << 10)
}

/// Journal-held prepares with no checkpoint in between, so a deleted group's entries are still
/// live in the journal when its id comes back.
fn shard_config() -> ShardConfig {
    ShardConfig {
        persisted_path: PersistedPath::Journal,
        journal_size_bytes: 4 << 20,
        checkpoint_interval_bytes: 1 << 30,
        ..ShardConfig::small()
    }
}

/// The body of `op` in the group's `incarnation`: each incarnation's bytes differ, so a read
/// tells which one wrote an op.
fn body(incarnation: u8, op: u64) -> Bytes {
    let len = 100 + (op as usize * 37) % 3000;
    (0..len).map(|i| incarnation ^ (i as u8) ^ (op as u8)).collect::<Vec<u8>>().into()
}

fn append(shard: &mut ShardStore<SimStorage>, group: u64, incarnation: u8, count: u64) {
    for _ in 0..count {
        let next = shard.next(group).expect("group");
        let body = body(incarnation, next.op);
        let fields = Prepare { record_count: 1, ..Prepare::default() };
        shard.append(group, &build_prepare(&next, 0, 0, fields, &body), &body).expect("append");
    }
}

/// The incarnation every op of `group` was written by, checking they all agree and that the
/// log is whole; `None` for an empty log.
fn incarnation_of(sim: &Sim, shard: &mut ShardStore<SimStorage>, group: u64) -> Option<u8> {
    let log = shard.group_mut(group).expect("group");
    assert!(log.faulty_reason().is_none(), "group {group} is faulty: {:?}", log.faulty_reason());
    let head = log.head_op();
    let mut found = None;
    for op in 1..=head {
        let prepare = sim.block_on(log.read_op(op)).expect("read").expect("every op is served");
        let which = (0..2).find(|&i| prepare.body() == body(i, op));
        let which = which.unwrap_or_else(|| panic!("op {op} of group {group} is nobody's"));
        assert!(found.is_none_or(|f| f == which), "group {group} mixes two groups' ops");
        found = Some(which);
    }
    found
}

/// The group directories on disk.
fn group_dirs(sim: &Sim, dir: &Path) -> Vec<u64> {
    let names = sim.block_on(sim.storage().list_dir(dir)).expect("list");
    names.iter().filter_map(|name| group_of_dir_name(name)).collect()
}

#[test]
fn a_deleted_group_leaves_nothing_and_its_id_comes_back_empty() {
    let sim = Sim::new(1, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let (mut shard, _) =
        sim.block_on(ShardStore::open(sim.storage(), dir, shard_config())).expect("open");
    sim.block_on(shard.create_groups(&[(GROUP, config()), (OTHER, config())])).expect("create");
    // The other group's entries come first: live, they keep the journal's tail before the
    // deleted group's, so recovery reads those too.
    append(&mut shard, OTHER, 0, 2);
    append(&mut shard, GROUP, 0, 6);
    sim.block_on(shard.flush()).expect("flush");
    // Pending prepares of a deleted group go with it.
    append(&mut shard, GROUP, 0, 1);
    assert!(sim.block_on(shard.group_mut(GROUP).unwrap().read_op(1)).unwrap().is_some());

    sim.block_on(shard.delete_groups(&[GROUP])).expect("delete");
    assert!(shard.group(GROUP).is_none());
    assert!(shard.durable_op(GROUP).is_none());
    assert!(!sim.block_on(sim.storage().exists(&group_dir(dir, GROUP))).unwrap());
    assert_eq!(group_dirs(&sim, dir), vec![OTHER]);
    let again = sim.block_on(shard.delete_groups(&[GROUP, OTHER]));
    assert!(again.is_err(), "an unknown group is refused");
    assert!(shard.group(OTHER).is_some(), "a refused delete changes nothing");

    sim.block_on(shard.create_group(GROUP, config())).expect("create again");
    assert_eq!(shard.next(GROUP).unwrap().op, 1, "the id comes back empty");
    append(&mut shard, GROUP, 1, 2);
    sim.block_on(shard.flush()).expect("flush");
    assert_eq!(shard.durable_op(GROUP), Some(2));

    // A power loss: the new group's segment writes were never synced, the journal holds both
    // groups' prepares of the id.
    sim.crash();
    let (mut shard, report) =
        sim.block_on(ShardStore::open(sim.storage(), dir, shard_config())).expect("reopen");
    assert!(report.groups.iter().all(|group| group.faulty.suffix_from.is_none()), "{report:?}");
    assert_eq!(shard.group(GROUP).unwrap().head_op(), 2, "only the new group's ops");
    assert_eq!(incarnation_of(&sim, &mut shard, GROUP), Some(1));
    assert_eq!(incarnation_of(&sim, &mut shard, OTHER), Some(0));
    assert_eq!(shard.group(OTHER).unwrap().head_op(), 2);
}

/// What the workload of one seed got to before the power loss.
#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    /// The delete returned.
    deleted: bool,
    /// The second create returned.
    recreated: bool,
    /// Ops reported durable, per incarnation.
    durable: [u64; 2],
}

/// Creates, fills, deletes and recreates one group beside another, with a power loss at a
/// seeded point; after recovery the group is whole and one incarnation's, and no directory is
/// left that no group owns.
#[test]
fn a_power_loss_anywhere_in_a_delete_keeps_one_whole_group_and_no_stray_files() {
    let mut deletes_cut = 0;
    let mut recreates_seen = 0;
    for seed in 0..SEEDS {
        let sim = Sim::new(seed, SimConfig::default());
        let dir = Path::new("/data/shard-0");
        {
            let (mut shard, _) =
                sim.block_on(ShardStore::open(sim.storage(), dir, shard_config())).expect("open");
            sim.block_on(shard.create_groups(&[(GROUP, config()), (OTHER, config())]))
                .expect("create");
        }
        let progress = Rc::new(RefCell::new(Progress::default()));
        let mut rng = Rng::new(seed ^ 0xde1e7e);
        let crash_after = 5 + rng.below(120);
        let workload = {
            let progress = Rc::clone(&progress);
            let storage = sim.storage();
            async move {
                let (mut shard, _) =
                    ShardStore::open(storage, dir, shard_config()).await.expect("open");
                for round in 0..3 {
                    append(&mut shard, GROUP, 0, 2 + round);
                    append(&mut shard, OTHER, 0, 1);
                    shard.flush().await.expect("flush");
                    progress.borrow_mut().durable[0] = shard.durable_op(GROUP).unwrap();
                }
                shard.delete_groups(&[GROUP]).await.expect("delete");
                progress.borrow_mut().deleted = true;
                shard.create_group(GROUP, config()).await.expect("create again");
                progress.borrow_mut().recreated = true;
                for _ in 0..3 {
                    append(&mut shard, GROUP, 1, 2);
                    shard.flush().await.expect("flush");
                    progress.borrow_mut().durable[1] = shard.durable_op(GROUP).unwrap();
                }
            }
        };
        if sim.run_until_crash(workload, crash_after).is_none() {
            sim.crash();
        }
        let progress = *progress.borrow();
        let (mut shard, _) =
            sim.block_on(ShardStore::open(sim.storage(), dir, shard_config())).expect("reopen");
        let mut held = shard.group_ids();
        held.sort_unstable();
        assert_eq!(group_dirs(&sim, dir), held, "seed {seed}: a directory no group owns");
        assert!(shard.group(OTHER).is_some());
        let present = shard.group(GROUP).is_some().then(|| incarnation_of(&sim, &mut shard, GROUP));
        match present {
            // Deleted, durably: its create again never became durable.
            None => {
                assert!(!progress.recreated, "seed {seed}: a created group is gone");
                deletes_cut += u32::from(progress.deleted);
            }
            Some(Some(0)) => {
                assert!(!progress.deleted, "seed {seed}: a deleted group came back");
                let head = shard.group(GROUP).unwrap().head_op();
                assert!(head >= progress.durable[0], "seed {seed}: lost durable ops");
            }
            Some(Some(_)) => {
                let head = shard.group(GROUP).unwrap().head_op();
                assert!(head >= progress.durable[1], "seed {seed}: lost durable ops");
                recreates_seen += 1;
            }
            // Empty: the first group before anything of it was durable, or the second.
            Some(None) => {
                let first = !progress.deleted && progress.durable[0] == 0;
                assert!(first || progress.durable[1] == 0, "seed {seed}: lost durable ops");
            }
        }
    }
    println!(
        "delete_sim: {SEEDS} seeds, {recreates_seen} recreated groups checked, {deletes_cut} cut after a delete"
    );
    assert!(recreates_seen >= 4, "the crash points must reach the recreated group");
}
