//! State transfer's install (`ShardStore::install_transfer`) on the simulated disk: a group's log is
//! replaced by one that begins at a peer's op S, as a log whose beginning retention removed.
//!
//! - The installed log holds S alone (head, first op, next offset and parent from S), serves S
//!   byte-identical, keeps the transferred state, takes the peer's later ops and survives a
//!   reopen; the old log's files are gone; stale journal entries of a truncated suffix above S
//!   never come back, even where they would chain onto S.
//! - Every refused precondition returns `Error::Invalid` and changes nothing.
//! - A power loss at a random point of an install leaves exactly the old log (every durable op
//!   byte-identical) or exactly the new one (S, its record, its transferred state), never a mix
//!   nor corruption, and `engine::inspect` finds the image clean before and after reopening;
//!   once installed, appends reported durable survive a later power loss. The test prints how
//!   often each outcome (and a roll-forward at open) happened and requires minimums, so a change
//!   that stops crashing inside the install fails loudly. `canary-transfer-unstaged` (the old
//!   log replaced in place before the commit point) must make it fail.

mod common;

use std::cell::Cell;
use std::path::Path;
use std::rc::Rc;

use bytes::Bytes;
use shoal_engine::Error;
use shoal_engine::inspect::inspect;
use shoal_engine::record::{ChainNext, build_prepare};
use shoal_engine::rng::Rng;
use shoal_engine::shard::{ShardConfig, ShardStore, group_dir};
use shoal_engine::state::{self, GroupState};
use shoal_engine::storage::sim::{Sim, SimConfig, SimStorage};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_proto::wire::{Header, Prepare};

const DIR: &str = "/data/shard-0";
const GROUP: u64 = 3;
const CLUSTER: u64 = 0;
const RECORD_BYTES_MAX: u32 = 32 << 10;

fn group_config(durability: Durability) -> GroupConfig {
    common::group_config(durability, RECORD_BYTES_MAX)
}

fn shard_config() -> ShardConfig {
    ShardConfig {
        cluster: CLUSTER,
        journal_size_bytes: 1 << 20,
        checkpoint_interval_bytes: 256 << 10,
        ready_ahead_bytes: 64 << 10,
        ..ShardConfig::small()
    }
}

/// One prepare of a chain.
#[derive(Clone)]
struct Op {
    header: Header,
    body: Bytes,
}

impl Op {
    fn record(&self) -> Vec<u8> {
        let mut record = self.header.encode().to_vec();
        record.extend_from_slice(&self.body);
        record
    }

    fn end_offset(&self) -> u64 {
        let prepare = self.header.as_prepare().expect("prepare");
        prepare.end_offset()
    }
}

/// A chain of `count` prepares of `GROUP` from op 1, its bodies and record counts decided by
/// `seed` and `tag` (two tags give two different chains, as two replicas' divergent logs).
fn chain(seed: u64, tag: u64, count: u64, body_bytes_max: u64) -> Vec<Op> {
    let mut rng = Rng::new(seed ^ tag.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut next = ChainNext { cluster: CLUSTER, group: GROUP, op: 1, parent: 0, offset: 0 };
    let mut ops = Vec::new();
    for _ in 0..count {
        let len = 1 + rng.below(body_bytes_max) as usize;
        let salt = rng.next_u64();
        let body: Bytes =
            (0..len).map(|i| (i as u64 ^ salt ^ next.op) as u8).collect::<Vec<u8>>().into();
        let fields = Prepare {
            record_count: 1 + rng.below(5) as u32,
            append_time_ms: next.op as i64,
            ..Prepare::default()
        };
        let header = build_prepare(&next, 1, 0, fields, &body);
        next = next.after(&header);
        ops.push(Op { header, body });
    }
    ops
}

/// The transferred state a peer would send with op `s` of `chain`.
fn state_at(chain: &[Op], s: u64) -> GroupState {
    let op = &chain[s as usize - 1];
    GroupState { op: s, end_offset: op.end_offset(), bytes: format!("state@{s}").into_bytes() }
}

fn open(sim: &Sim) -> ShardStore<SimStorage> {
    let (shard, report) = sim
        .block_on(ShardStore::open(sim.storage(), Path::new(DIR), shard_config()))
        .unwrap_or_else(|e| panic!("seed {}: open: {e}", sim.seed()));
    for group in &report.groups {
        assert!(group.corruption.is_none(), "seed {}: {group:?}", sim.seed());
    }
    shard
}

/// Appends `ops` in order, flushing every few, and returns the highest op reported durable.
fn append_all(sim: &Sim, shard: &mut ShardStore<SimStorage>, ops: &[Op]) -> u64 {
    for (index, op) in ops.iter().enumerate() {
        shard.append(GROUP, &op.header, &op.body).expect("append");
        if index % 5 == 4 {
            sim.block_on(shard.flush()).expect("flush");
        }
    }
    sim.block_on(shard.flush()).expect("flush");
    shard.durable_op(GROUP).expect("group")
}

/// Every prepare the group serves, from its first offset on.
fn served(sim: &Sim, shard: &mut ShardStore<SimStorage>) -> Vec<shoal_engine::ring::StoredPrepare> {
    let log = shard.group_mut(GROUP).expect("group");
    let first = log.first_offset();
    sim.block_on(log.read_offset(first, usize::MAX)).expect("read")
}

/// The names in the group's directory.
fn files(sim: &Sim) -> Vec<String> {
    let dir = group_dir(Path::new(DIR), GROUP);
    let mut names: Vec<String> = sim
        .paths()
        .into_iter()
        .filter(|path| path.parent() == Some(&dir))
        .filter_map(|path| path.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    names
}

fn assert_inspect_clean(sim: &Sim, context: &str) -> shoal_engine::inspect::InspectReport {
    let report = sim.block_on(inspect(&sim.storage(), Path::new("/data")));
    if std::env::var("TRANSFER_SIM_VERBOSE").is_ok() {
        eprintln!(
            "{context}: {:#?} {:#?}",
            report.shards.first().map(|s| (&s.groups, &s.journal)),
            report.notes
        );
    }
    assert!(report.is_clean(), "seed {} {context}: {:#?}", sim.seed(), report.problems);
    report
}

/// Checks the group is exactly the log installed at `s` of `peer`, extended by the peer's ops
/// up to its head: S first, every op byte-identical, the transferred state in place.
fn check_installed(
    sim: &Sim,
    shard: &mut ShardStore<SimStorage>,
    peer: &[Op],
    s: u64,
    context: &str,
) {
    let seed = sim.seed();
    let log = shard.group(GROUP).expect("group");
    let head = log.head_op();
    assert_eq!(log.first_op(), s, "seed {seed} {context}: the log begins at S");
    assert!(head >= s, "seed {seed} {context}");
    assert_eq!(log.first_offset(), peer[s as usize - 1].header.as_prepare().unwrap().base_offset);
    let next = log.next();
    let last = &peer[head as usize - 1];
    assert_eq!(
        (next.op, next.parent, next.offset),
        (head + 1, last.header.checksum_header, last.end_offset()),
        "seed {seed} {context}: the chain continues from the head"
    );
    let served = served(sim, shard);
    assert_eq!(served.len() as u64, head - s + 1, "seed {seed} {context}: S..=head served");
    for prepare in &served {
        let expected = &peer[prepare.op() as usize - 1];
        assert_eq!(
            prepare.record.as_ref(),
            expected.record().as_slice(),
            "seed {seed} {context}: op {} byte-identical to the peer's",
            prepare.op()
        );
    }
    let transferred = sim
        .block_on(state::load_transfer_state(&sim.storage(), &group_dir(Path::new(DIR), GROUP)))
        .expect("transfer state");
    assert_eq!(transferred, Some(state_at(peer, s)), "seed {seed} {context}");
    let names = files(sim);
    assert!(
        names.iter().all(|name| !name.contains("transfer") || name == "transfer-state"),
        "seed {seed} {context}: no staged file is left: {names:?}"
    );
}

/// Checks the group is exactly the old log: op 1 first, every op up to the head byte-identical
/// to `local`, at least `durable` of them, no transferred state.
fn check_old(sim: &Sim, shard: &mut ShardStore<SimStorage>, local: &[Op], durable: u64) {
    let seed = sim.seed();
    let log = shard.group(GROUP).expect("group");
    let head = log.head_op();
    assert!(head >= durable, "seed {seed}: the old log lost durable ops: head {head} < {durable}");
    assert!(head <= local.len() as u64, "seed {seed}");
    let served = served(sim, shard);
    assert_eq!(served.len() as u64, head, "seed {seed}: old ops 1..=head served");
    for (index, prepare) in served.iter().enumerate() {
        assert_eq!(prepare.op(), index as u64 + 1, "seed {seed}: old log starts at op 1");
        assert_eq!(
            prepare.record.as_ref(),
            local[index].record().as_slice(),
            "seed {seed}: old op {} byte-identical",
            prepare.op()
        );
    }
    let transferred = sim
        .block_on(state::load_transfer_state(&sim.storage(), &group_dir(Path::new(DIR), GROUP)))
        .expect("transfer state");
    assert_eq!(transferred, None, "seed {seed}: the old log has no transferred state");
    let names = files(sim);
    assert!(
        names.iter().all(|name| !name.contains("transfer")),
        "seed {seed}: open removed the staged leftovers: {names:?}"
    );
}

#[test]
fn install_replaces_the_log_with_one_that_begins_at_s_and_appends_continue() {
    for durability in [Durability::Replicated, Durability::Persisted] {
        let sim = Sim::new(1, SimConfig::default());
        let local = chain(1, 1, 150, 20_000);
        let peer_chain = chain(1, 2, 220, 12_000);
        let s = 170;

        // The peer holds its log on its own disk; op S comes from there, as a fetch would.
        let peer_sim = Sim::new(2, SimConfig::default());
        let (mut peer, _) = peer_sim
            .block_on(ShardStore::open(peer_sim.storage(), Path::new(DIR), shard_config()))
            .expect("peer");
        peer_sim.block_on(peer.create_group(GROUP, group_config(durability))).expect("create");
        append_all(&peer_sim, &mut peer, &peer_chain);
        let log = peer.group_mut(GROUP).expect("group");
        let fetched = peer_sim.block_on(log.read_op(s)).expect("read").expect("present");
        assert_eq!(fetched.record.as_ref(), peer_chain[s as usize - 1].record().as_slice());

        let mut shard = open(&sim);
        sim.block_on(shard.create_group(GROUP, group_config(durability))).expect("create");
        append_all(&sim, &mut shard, &local);
        let dir = group_dir(Path::new(DIR), GROUP);
        // The owner's own snapshot is not the install's business.
        let owner_state = GroupState { op: 100, end_offset: 7, bytes: b"owner".to_vec() };
        sim.block_on(state::save(&sim.storage(), &dir, &owner_state)).expect("save");
        let old_segments: Vec<String> =
            files(&sim).into_iter().filter(|name| name.ends_with(".log")).collect();
        assert!(old_segments.len() > 1, "the old log rolled: {old_segments:?}");

        let state = state_at(&peer_chain, s);
        sim.block_on(shard.install_transfer(GROUP, &fetched.header, &fetched.body(), &state))
            .expect("install");
        assert_eq!(shard.counters().transfers_installed, 1);
        assert_eq!(shard.durable_op(GROUP), Some(s));
        assert_eq!(shard.group(GROUP).unwrap().head_op(), s);
        check_installed(&sim, &mut shard, &peer_chain, s, "after install");
        let base = fetched.base_offset();
        let names = files(&sim);
        let segments: Vec<&String> = names.iter().filter(|n| n.ends_with(".log")).collect();
        assert_eq!(segments, [&format!("{base:020}.log")], "old segments gone: {names:?}");
        assert!(!names.iter().any(|n| n.ends_with(".index")), "{names:?}");
        assert_eq!(sim.block_on(state::load(&sim.storage(), &dir)).unwrap(), Some(owner_state));
        assert_inspect_clean(&sim, "after install");
        // The transferred state is checksummed like the owner's snapshot.
        let transfer_state = dir.join(state::TRANSFER_STATE_FILE);
        sim.corrupt(&transfer_state, 9, 2);
        let damaged = sim.block_on(state::load_transfer_state(&sim.storage(), &dir));
        assert!(matches!(damaged, Err(Error::Corruption(_))), "{damaged:?}");
        let report = sim.block_on(inspect(&sim.storage(), Path::new("/data")));
        assert_eq!(report.first_corruption().map(|c| c.file.clone()), Some(transfer_state.clone()));
        sim.corrupt(&transfer_state, 9, 2);

        // The peer's later ops chain onto S and survive a reopen.
        for op in &peer_chain[s as usize..200] {
            let appended =
                shard.append_received(GROUP, &op.header, &op.body).expect("append received");
            assert_eq!(appended.len(), 1);
        }
        sim.block_on(shard.flush()).expect("flush");
        assert_eq!(shard.durable_op(GROUP), Some(200));
        sim.block_on(shard.close()).expect("close");
        let mut shard = open(&sim);
        check_installed(&sim, &mut shard, &peer_chain, s, "after reopen");
        assert_eq!(shard.group(GROUP).unwrap().head_op(), 200);

        // A later transfer replaces the log and the transferred state again.
        let s2 = 210;
        let second = &peer_chain[s2 as usize - 1];
        let state2 = state_at(&peer_chain, s2);
        sim.block_on(shard.install_transfer(GROUP, &second.header, &second.body, &state2))
            .expect("second install");
        check_installed(&sim, &mut shard, &peer_chain, s2, "after a second install");
        for op in &peer_chain[s2 as usize..] {
            shard.append_received(GROUP, &op.header, &op.body).expect("append received");
        }
        sim.block_on(shard.flush()).expect("flush");
        drop(shard);
        sim.crash();
        let mut shard = open(&sim);
        let head = shard.group(GROUP).unwrap().head_op();
        if durability == Durability::Persisted {
            assert_eq!(head, 220, "persisted appends reported durable survive a power loss");
        }
        check_installed(&sim, &mut shard, &peer_chain, s2, "after a power loss");
        assert_inspect_clean(&sim, "after a power loss");
    }
}

#[test]
fn stale_journal_entries_above_s_never_come_back() {
    // A persisted log appended ops 1..=60 (all in the journal), then a view change truncated
    // it above 20. The peer's log shares ops 1..=40 with it, so the old journal entries of 41..=60
    // chain onto the installed S = 40 byte for byte: only the install's fence keeps them dead.
    let sim = Sim::new(5, SimConfig::default());
    let local = chain(5, 1, 60, 3_000);
    let mut peer = local[..40].to_vec();
    let divergent = chain(5, 2, 50, 3_000);
    let mut next = ChainNext {
        cluster: CLUSTER,
        group: GROUP,
        op: 41,
        parent: peer[39].header.checksum_header,
        offset: peer[39].end_offset(),
    };
    for op in &divergent[40..] {
        let fields = Prepare {
            record_count: op.header.as_prepare().unwrap().record_count,
            append_time_ms: next.op as i64,
            ..Prepare::default()
        };
        let header = build_prepare(&next, 2, 1, fields, &op.body);
        next = next.after(&header);
        peer.push(Op { header, body: op.body.clone() });
    }
    let mut shard = open(&sim);
    sim.block_on(shard.create_group(GROUP, group_config(Durability::Persisted))).expect("create");
    assert_eq!(append_all(&sim, &mut shard, &local), 60);
    sim.block_on(shard.truncate_after(GROUP, 20, 2)).expect("truncate");
    assert_eq!(shard.group(GROUP).unwrap().head_op(), 20);

    let s = 40;
    let first = &peer[s as usize - 1];
    assert_eq!(first.record(), local[s as usize - 1].record(), "S is shared");
    sim.block_on(shard.install_transfer(GROUP, &first.header, &first.body, &state_at(&peer, s)))
        .expect("install");
    // Reopen twice: after a power loss with nothing appended, and after the peer's ops.
    drop(shard);
    sim.crash();
    let mut shard = open(&sim);
    assert_eq!(shard.group(GROUP).unwrap().head_op(), s, "old ops 41..=60 stay dead");
    check_installed(&sim, &mut shard, &peer, s, "reopened");
    for op in &peer[s as usize..45] {
        shard.append_received(GROUP, &op.header, &op.body).expect("append received");
    }
    sim.block_on(shard.flush()).expect("flush");
    drop(shard);
    sim.crash();
    let mut shard = open(&sim);
    assert_eq!(shard.group(GROUP).unwrap().head_op(), 45);
    check_installed(&sim, &mut shard, &peer, s, "reopened after appends");
    assert_inspect_clean(&sim, "after appends");
}

#[test]
fn every_refused_precondition_is_invalid_and_changes_nothing() {
    let sim = Sim::new(7, SimConfig::default());
    let local = chain(7, 1, 30, 2_000);
    let peer = chain(7, 2, 60, 2_000);
    let mut shard = open(&sim);
    sim.block_on(shard.create_group(GROUP, group_config(Durability::Persisted))).expect("create");
    append_all(&sim, &mut shard, &local);
    let s = 40;
    let good = peer[s as usize - 1].clone();
    let good_state = state_at(&peer, s);

    let mut flipped = good.body.to_vec();
    flipped[0] ^= 1;
    let mut unsealed = good.header;
    unsealed.view += 1;
    let foreign =
        Header::prepare(CLUSTER + 1, 1, 0, *good.header.as_prepare().unwrap(), &good.body);
    let other_group = {
        let prepare = Prepare { group: GROUP + 1, ..*good.header.as_prepare().unwrap() };
        Header::prepare(CLUSTER, 1, 0, prepare, &good.body)
    };
    let at_head = &local[29];
    let oversized =
        GroupState { bytes: vec![0; state::STATE_SIZE_BYTES_MAX + 1], ..good_state.clone() };
    let too_large = {
        let body = Bytes::from(vec![7u8; RECORD_BYTES_MAX as usize]);
        let header = Header::prepare(CLUSTER, 1, 0, *good.header.as_prepare().unwrap(), &body);
        Op { header, body }
    };
    let cases: Vec<(&str, u64, Header, Bytes, GroupState)> = vec![
        ("unknown group", GROUP + 9, good.header, good.body.clone(), good_state.clone()),
        ("body checksum", GROUP, good.header, Bytes::from(flipped), good_state.clone()),
        ("header checksum", GROUP, unsealed, good.body.clone(), good_state.clone()),
        ("body length", GROUP, good.header, good.body.slice(1..), good_state.clone()),
        ("cluster", GROUP, foreign, good.body.clone(), good_state.clone()),
        ("group", GROUP, other_group, good.body.clone(), good_state.clone()),
        ("record size", GROUP, too_large.header, too_large.body, good_state.clone()),
        (
            "state op",
            GROUP,
            good.header,
            good.body.clone(),
            GroupState { op: s + 1, ..good_state.clone() },
        ),
        (
            "end offset",
            GROUP,
            good.header,
            good.body.clone(),
            GroupState { end_offset: good_state.end_offset + 1, ..good_state.clone() },
        ),
        ("state size", GROUP, good.header, good.body.clone(), oversized),
        ("at the head", GROUP, at_head.header, at_head.body.clone(), state_at(&local, 30)),
        ("below the head", GROUP, local[9].header, local[9].body.clone(), state_at(&local, 10)),
    ];
    let before_files = files(&sim);
    let before_served: Vec<Bytes> =
        served(&sim, &mut shard).into_iter().map(|p| p.record).collect();
    let before_counters = shard.counters();
    for (name, group, header, body, state) in cases {
        let result = sim.block_on(shard.install_transfer(group, &header, &body, &state));
        assert!(matches!(result, Err(Error::Invalid(_))), "{name}: {result:?}");
        assert_eq!(files(&sim), before_files, "{name}: no file changed");
        assert_eq!(shard.counters(), before_counters, "{name}: no write");
        let now: Vec<Bytes> = served(&sim, &mut shard).into_iter().map(|p| p.record).collect();
        assert_eq!(now, before_served, "{name}: the log is unchanged");
        assert!(shard.failure().is_none(), "{name}: the shard serves");
    }
    // The good one still installs after all those refusals.
    sim.block_on(shard.install_transfer(GROUP, &good.header, &good.body, &good_state))
        .expect("install");
    check_installed(&sim, &mut shard, &peer, s, "after the refusals");
}

/// What the crash test saw, over all seeds.
#[derive(Default, Debug)]
struct Outcomes {
    old: u64,
    new: u64,
    rolled_forward_at_open: u64,
    crashes_in_roll_forward_at_open: u64,
    staged_leftovers_at_open: u64,
    crashes_after_appends: u64,
}

/// The appends after a completed install, cut by a power loss: the highest op reported
/// durable lives in `durable`, which outlives the dropped future.
async fn append_after_install(
    shard: &mut ShardStore<SimStorage>,
    ops: &[Op],
    durable: Rc<Cell<u64>>,
) {
    for (index, op) in ops.iter().enumerate() {
        shard.append_received(GROUP, &op.header, &op.body).expect("append received");
        if index % 3 == 2 {
            shard.flush().await.expect("flush");
            durable.set(shard.durable_op(GROUP).expect("group"));
        }
    }
    shard.flush().await.expect("flush");
    durable.set(shard.durable_op(GROUP).expect("group"));
}

fn run_seed(seed: u64, outcomes: &mut Outcomes) {
    let sim = Sim::new(seed, SimConfig::default());
    let mut rng = Rng::new(seed ^ 0x7e57);
    let durability =
        if seed.is_multiple_of(2) { Durability::Persisted } else { Durability::Replicated };
    // Sometimes enough to roll 1 MiB segments (index files, several old segments).
    let body_max = if rng.chance(1, 3) { 30_000 } else { 8_000 };
    let local = chain(seed, 1, 3 + rng.below(60), body_max);
    let s = local.len() as u64 + 1 + rng.below(8);
    let peer = chain(seed, 2, s + 30, body_max);
    let state = state_at(&peer, s);
    let first = peer[s as usize - 1].clone();

    let mut shard = open(&sim);
    sim.block_on(shard.create_group(GROUP, group_config(durability))).expect("create");
    // The last few ops are appended but never flushed: the install drops them with the old log.
    let unflushed = rng.below(3).min(local.len() as u64 - 1) as usize;
    let flushed = local.len() - unflushed;
    let mut durable = append_all(&sim, &mut shard, &local[..flushed]);
    if durability == Durability::Replicated {
        // A replicated op survives a power loss only once a checkpoint synced it.
        durable = shard.group(GROUP).unwrap().checkpoint().op;
    }
    for op in &local[flushed..] {
        shard.append(GROUP, &op.header, &op.body).expect("append");
    }

    // The install, cut at a random I/O completion (or not at all, when it has fewer).
    let crash_after = rng.below(40);
    let finished = sim.run_until_crash(
        shard.install_transfer(GROUP, &first.header, &first.body, &state),
        crash_after,
    );
    drop(shard);
    let completed = finished.is_some();
    if let Some(result) = finished {
        result.unwrap_or_else(|e| panic!("seed {seed}: install: {e}"));
        sim.crash();
    }
    // The post-crash image, before anything repairs it.
    let report = assert_inspect_clean(&sim, "post-crash image");
    let slot = report.shards[0].groups.iter().find(|g| g.group == GROUP).and_then(|g| g.slot);
    // Once the install returned, appends may follow: a roll-forward at open would remove their
    // segments, so the flag's clearing write was durable before it returned.
    assert!(
        !(completed && slot.is_some_and(|slot| slot.transfer_pending)),
        "seed {seed}: an install returned with its transfer still pending on disk"
    );
    let noted = |text: &str| report.notes.iter().any(|note| note.message.contains(text));
    if slot.is_some_and(|slot| slot.transfer_pending) {
        assert!(noted("pending: open rolls it forward"), "seed {seed}: {:#?}", report.notes);
        outcomes.rolled_forward_at_open += 1;
        if rng.chance(1, 2) {
            // A power loss during the roll-forward at open: the next open does it again.
            let crash_after = rng.below(12);
            let opened = sim.run_until_crash(
                ShardStore::open(sim.storage(), Path::new(DIR), shard_config()),
                crash_after,
            );
            match opened {
                None => outcomes.crashes_in_roll_forward_at_open += 1,
                Some(opened) => {
                    drop(opened.unwrap_or_else(|e| panic!("seed {seed}: open: {e}")));
                    sim.crash();
                }
            }
            assert_inspect_clean(&sim, "after a crash during the roll-forward at open");
        }
    } else if files(&sim).iter().any(|name| name.contains(".staged") || name.contains(".log.")) {
        assert!(noted("leftover of a state transfer"), "seed {seed}: {:#?}", report.notes);
        outcomes.staged_leftovers_at_open += 1;
    }

    let mut shard = open(&sim);
    assert_inspect_clean(&sim, "after reopening");
    let is_new = shard.group(GROUP).unwrap().first_op() == s;
    if is_new {
        outcomes.new += 1;
        check_installed(&sim, &mut shard, &peer, s, "after a crash in the install");
        assert_eq!(shard.group(GROUP).unwrap().head_op(), s);
    } else {
        outcomes.old += 1;
        check_old(&sim, &mut shard, &local, durable);
        // Install again, now to completion.
        sim.block_on(shard.install_transfer(GROUP, &first.header, &first.body, &state))
            .unwrap_or_else(|e| panic!("seed {seed}: install after a crash: {e}"));
        check_installed(&sim, &mut shard, &peer, s, "installed after a crash");
    }

    // Appends of the peer's later ops, cut by a power loss: what was reported durable stays.
    let durable_new = Rc::new(Cell::new(s));
    let crash_after = 1 + rng.below(40);
    let finished = sim.run_until_crash(
        append_after_install(&mut shard, &peer[s as usize..], Rc::clone(&durable_new)),
        crash_after,
    );
    drop(shard);
    if finished.is_some() {
        sim.crash();
    } else {
        outcomes.crashes_after_appends += 1;
    }
    assert_inspect_clean(&sim, "after appends and a crash");
    let mut shard = open(&sim);
    let head = shard.group(GROUP).unwrap().head_op();
    if durability == Durability::Persisted {
        assert!(
            head >= durable_new.get(),
            "seed {seed}: lost appends reported durable: head {head} < {}",
            durable_new.get()
        );
    }
    check_installed(&sim, &mut shard, &peer, s, "after appends and a crash");
}

#[test]
fn crash_during_install_leaves_the_old_log_or_the_new_one_never_a_mix() {
    // TRANSFER_SIM_SEED=N reproduces one seed; TRANSFER_SIM_VERBOSE=1 prints every inspection.
    let seeds = match std::env::var("TRANSFER_SIM_SEED") {
        Ok(seed) => {
            let seed: u64 = seed.parse().expect("TRANSFER_SIM_SEED is a number");
            seed..seed + 1
        }
        Err(_) => 0..200,
    };
    let mut outcomes = Outcomes::default();
    for seed in seeds.clone() {
        run_seed(seed, &mut outcomes);
    }
    println!("transfer_sim: {} seeds: {outcomes:?}", seeds.end - seeds.start);
    if seeds.end - seeds.start < 200 {
        return;
    }
    assert!(outcomes.old >= 40, "crashes before the commit point: {outcomes:?}");
    assert!(outcomes.new >= 40, "crashes after the commit point: {outcomes:?}");
    assert!(outcomes.rolled_forward_at_open >= 10, "roll-forwards at open: {outcomes:?}");
    assert!(
        outcomes.crashes_in_roll_forward_at_open >= 10,
        "crashes during a roll-forward at open: {outcomes:?}"
    );
    assert!(outcomes.staged_leftovers_at_open >= 10, "staged leftovers: {outcomes:?}");
    assert!(outcomes.crashes_after_appends >= 100, "crashes after appends: {outcomes:?}");
}
