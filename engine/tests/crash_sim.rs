//! Crash tests on the simulated disk (DESIGN.md §6, §7): a workload of appends, flushes, rolls,
//! truncations and superblock writes is cut by a power loss at a seeded point, where any subset
//! of unsynced writes survives, each possibly torn. After every recovery:
//! - every append reported durable in a `persisted` group is present and byte-identical, and no
//!   offset it was given is reissued;
//! - in every group, what is served is byte-identical to what was appended at that op (or, for
//!   ops a truncation in flight may have cut, to the pre-truncation prepare), offsets are dense,
//!   and nothing past a torn record is served;
//! - a truncation that completed never comes back.
//!
//! Retention trims both groups as they grow, so rolls take recycled segment files (a retired
//! segment's records lie past the data until overwritten) as well as fresh ones.
//!
//! Flush cycles overlap (up to the profile's `flush_cycles_in_flight_max`), finished in the order
//! they began, and zero fills (the direct path's space ahead, written with zeros) run beside
//! them, so the simulated disk completes the writes of several jobs in any order.
//!
//! Each seed runs several crash/recover rounds; the test prints what it injected and requires
//! minimums, so a change that stops injecting faults fails loudly.

mod common;

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::future::{Future, poll_fn};
use std::path::Path;
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;

use bytes::Bytes;
use shoal_engine::direct::PersistedPath;
use shoal_engine::record::build_prepare;
use shoal_engine::rng::Rng;
use shoal_engine::shard::{ShardConfig, ShardFlushDone, ShardStore, ZeroFillDone};
use shoal_engine::storage::sim::{Sim, SimConfig, SimStats, SimStorage};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_proto::wire::Prepare;

const PERSISTED: u64 = 1;
const REPLICATED: u64 = 2;
/// A second `persisted` group, so that one cycle's forms cover several groups (one journal
/// sync, a sync per group, or one file-system sync for all).
const PERSISTED_TOO: u64 = 3;
const GROUPS: [u64; 3] = [PERSISTED, REPLICATED, PERSISTED_TOO];

fn durability(group: u64) -> Durability {
    if group == REPLICATED { Durability::Replicated } else { Durability::Persisted }
}
const SEEDS: u64 = 64;
const ROUNDS: usize = 4;

/// What the test knows of one group.
#[derive(Default, Clone)]
struct GroupModel {
    /// op -> (base offset, body) of every prepare appended and not truncated.
    appended: BTreeMap<u64, (u64, Bytes)>,
    /// Prepares a truncation in flight may or may not have cut: op -> body.
    maybe_cut: BTreeMap<u64, Bytes>,
    /// The highest op reported durable.
    durable: u64,
    /// The view new prepares are built in.
    view: u32,
}

type Model = Rc<RefCell<BTreeMap<u64, GroupModel>>>;

const RECORD_BYTES_MAX: u32 = 32 << 10;

fn config(durability: Durability) -> GroupConfig {
    GroupConfig { retention_bytes: 2 << 20, ..common::group_config(durability, RECORD_BYTES_MAX) }
}

/// The seed picks how `persisted` prepares become durable, so power losses cut every form and
/// the cost rule's switches between them (DESIGN.md §3).
fn shard_config(seed: u64) -> ShardConfig {
    let persisted_path = match seed / 2 % 4 {
        0 => PersistedPath::Auto,
        1 => PersistedPath::Journal,
        2 => PersistedPath::Direct,
        _ => PersistedPath::Filesystem,
    };
    ShardConfig {
        persisted_path,
        // Small enough that `Auto` sometimes takes the journal for the persisted groups' small
        // cycles too.
        sync_cost_bytes: if seed.is_multiple_of(2) { 0 } else { 16 << 10 },
        // Free or dear: `Auto` then takes the file-system form, or the other two.
        filesystem_sync_cost_bytes: if (seed / 8).is_multiple_of(2) { 0 } else { 128 << 10 },
        journal_size_bytes: 1 << 20,
        checkpoint_interval_bytes: 256 << 10,
        ready_ahead_bytes: 64 << 10,
        ..ShardConfig::small()
    }
}

/// Appends a few prepares of random sizes to each group, then starts a flush.
fn append_some(
    rng: &mut Rng,
    shard: &Rc<RefCell<Option<ShardStore<SimStorage>>>>,
    model: &Model,
    seed: u64,
    step: u64,
) -> Option<shoal_engine::shard::ShardFlush<SimStorage>> {
    let mut guard = shard.borrow_mut();
    let shard_ref = guard.as_mut().expect("open");
    for group in GROUPS {
        for _ in 0..rng.below(4) {
            let next = shard_ref.next(group).expect("group");
            let len = 1 + rng.below(12_000) as usize;
            let body: Bytes =
                (0..len).map(|i| (i as u64 ^ seed ^ next.op) as u8).collect::<Vec<u8>>().into();
            let view = model.borrow()[&group].view;
            let fields = Prepare {
                record_count: 1 + rng.below(5) as u32,
                append_time_ms: step as i64,
                ..Prepare::default()
            };
            let header = build_prepare(&next, view, 0, fields, &body);
            match shard_ref.append(group, &header, &body) {
                Ok(()) => {
                    let mut model = model.borrow_mut();
                    let group_model = model.get_mut(&group).expect("model");
                    group_model.appended.insert(next.op, (next.offset, body));
                }
                Err(shoal_engine::Error::LimitReached(_)) => break,
                Err(error) => panic!("append: {error}"),
            }
        }
    }
    shard_ref.begin_flush()
}

/// A flush cycle in flight and its result once it finished.
struct InFlight {
    run: Pin<Box<dyn Future<Output = ShardFlushDone<SimStorage>>>>,
    done: Option<ShardFlushDone<SimStorage>>,
}

/// A zero fill in flight and its result once it finished.
#[derive(Default)]
struct ZeroFill {
    run: Option<Pin<Box<dyn Future<Output = ZeroFillDone<SimStorage>>>>>,
    done: Option<ZeroFillDone<SimStorage>>,
}

impl ZeroFill {
    fn poll(&mut self, context: &mut std::task::Context<'_>) {
        if let Some(run) = self.run.as_mut()
            && let Poll::Ready(done) = run.as_mut().poll(context)
        {
            self.run = None;
            self.done = Some(done);
        }
    }

    /// Applies a finished zero fill, and starts the next one due when none is in flight.
    fn finish_and_begin(&mut self, shard: &Rc<RefCell<Option<ShardStore<SimStorage>>>>, seed: u64) {
        let mut guard = shard.borrow_mut();
        let shard = guard.as_mut().expect("open");
        self.apply(shard, seed);
        if self.run.is_none()
            && let Some(job) = shard.begin_zero_fill()
        {
            self.run = Some(Box::pin(job.run()));
        }
    }

    /// Runs the one in flight to its end and applies it (before a truncation or retention).
    async fn settle(&mut self, shard: &Rc<RefCell<Option<ShardStore<SimStorage>>>>, seed: u64) {
        if let Some(run) = self.run.take() {
            self.done = Some(run.await);
        }
        self.apply(shard.borrow_mut().as_mut().expect("open"), seed);
    }

    fn apply(&mut self, shard: &mut ShardStore<SimStorage>, seed: u64) {
        if let Some(done) = self.done.take() {
            let report = shard.finish_zero_fill(done);
            assert!(report.failed.is_empty(), "seed {seed}: {report:?}");
        }
    }
}

/// Polls every cycle in flight (and the zero fill) until the oldest cycle has finished, and
/// returns it.
async fn oldest_done(
    flushes: &mut VecDeque<InFlight>,
    zero_fill: &mut ZeroFill,
) -> ShardFlushDone<SimStorage> {
    poll_fn(|context| {
        zero_fill.poll(context);
        for flush in flushes.iter_mut().filter(|flush| flush.done.is_none()) {
            if let Poll::Ready(done) = flush.run.as_mut().poll(context) {
                flush.done = Some(done);
            }
        }
        match flushes.front().is_some_and(|flush| flush.done.is_some()) {
            true => Poll::Ready(flushes.pop_front().and_then(|flush| flush.done).expect("done")),
            false => Poll::Pending,
        }
    })
    .await
}

/// Finishes the oldest cycle in flight and records the durable positions it reports.
async fn finish_oldest(
    flushes: &mut VecDeque<InFlight>,
    zero_fill: &mut ZeroFill,
    shard: &Rc<RefCell<Option<ShardStore<SimStorage>>>>,
    model: &Model,
    seed: u64,
) {
    let done = oldest_done(flushes, zero_fill).await;
    let report = shard.borrow_mut().as_mut().expect("open").finish_flush(done);
    assert!(report.failed.is_empty(), "seed {seed}: {report:?}");
    let mut model = model.borrow_mut();
    for (group, op) in report.durable {
        let group_model = model.get_mut(&group).expect("model");
        group_model.durable = group_model.durable.max(op);
    }
}

/// The workload: appends of random sizes to both groups, overlapping flushes, an occasional
/// truncation.
async fn workload(shard: Rc<RefCell<Option<ShardStore<SimStorage>>>>, model: Model, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut flushes: VecDeque<InFlight> = VecDeque::new();
    let mut zero_fill = ZeroFill::default();
    for step in 0..400u64 {
        if let Some(flush) = append_some(&mut rng, &shard, &model, seed, step) {
            flushes.push_back(InFlight { run: Box::pin(flush.run()), done: None });
        }
        // Sometimes the next cycle starts before the oldest has finished.
        if !flushes.is_empty() && (rng.chance(1, 2) || flushes.len() >= 2) {
            finish_oldest(&mut flushes, &mut zero_fill, &shard, &model, seed).await;
        }
        // Checkpoints run as jobs of their own (segment syncs, then the superblock).
        let checkpoint = shard.borrow_mut().as_mut().expect("open").begin_checkpoint();
        if let Some(checkpoint) = checkpoint {
            let done = checkpoint.run().await;
            shard.borrow_mut().as_mut().expect("open").finish_checkpoint(done).expect("checkpoint");
        }
        zero_fill.finish_and_begin(&shard, seed);
        if rng.chance(1, 20) {
            // Retention needs the log at rest too.
            while !flushes.is_empty() {
                finish_oldest(&mut flushes, &mut zero_fill, &shard, &model, seed).await;
            }
            zero_fill.settle(&shard, seed).await;
            let mut taken = shard.borrow_mut().take().expect("open");
            let result = taken.enforce_retention(step as i64).await;
            *shard.borrow_mut() = Some(taken);
            result.expect("retention");
        }
        if rng.chance(1, 40) {
            let group = if rng.chance(1, 2) { PERSISTED } else { REPLICATED };
            let (head, view) = {
                let guard = shard.borrow();
                let shard_ref = guard.as_ref().expect("open");
                (shard_ref.group(group).expect("group").head_op(), model.borrow()[&group].view)
            };
            // A truncation needs the log at rest.
            while !flushes.is_empty() {
                finish_oldest(&mut flushes, &mut zero_fill, &shard, &model, seed).await;
            }
            zero_fill.settle(&shard, seed).await;
            if head > 2 {
                let cut = head - 1 - rng.below(head.min(6) - 1);
                {
                    let mut model = model.borrow_mut();
                    let group_model = model.get_mut(&group).expect("model");
                    let above: Vec<u64> =
                        group_model.appended.range(cut + 1..).map(|(op, _)| *op).collect();
                    for op in above {
                        let (_, body) = group_model.appended.remove(&op).expect("listed");
                        group_model.maybe_cut.insert(op, body);
                    }
                    group_model.view = view + 1;
                    // Whoever truncates (VSR's new primary) has decided those ops were never
                    // committed; from the start of the truncation they may vanish.
                    group_model.durable = group_model.durable.min(cut);
                }
                // The truncation holds the shard for its I/O (it runs between flushes).
                let mut taken = shard.borrow_mut().take().expect("open");
                let result = taken.truncate_after(group, cut, view + 1).await;
                *shard.borrow_mut() = Some(taken);
                result.expect("truncate");
                let mut model = model.borrow_mut();
                let group_model = model.get_mut(&group).expect("model");
                group_model.maybe_cut.clear();
            }
        }
    }
}

fn check(shard: &mut ShardStore<SimStorage>, sim: &Sim, model: &Model, seed: u64, round: usize) {
    let mut model = model.borrow_mut();
    for group in GROUPS {
        let group_model = model.get_mut(&group).expect("model");
        let log = shard.group_mut(group).expect("group");
        let head = log.head_op();
        if durability(group) == Durability::Persisted {
            assert!(
                head >= group_model.durable,
                "seed {seed} round {round}: persisted group lost acknowledged ops: head {head} < durable {}",
                group_model.durable
            );
        }
        let (first_op, first_offset) = (log.first_op(), log.first_offset());
        let served = sim.block_on(log.read_offset(first_offset, usize::MAX)).expect("read");
        assert_eq!(
            served.len() as u64,
            head + 1 - first_op,
            "seed {seed} round {round}: group {group} serves every op retention kept once"
        );
        let mut offset = first_offset;
        for (index, prepare) in served.iter().enumerate() {
            let op = first_op + index as u64;
            assert_eq!(prepare.op(), op, "seed {seed} round {round}: ops dense");
            assert_eq!(prepare.base_offset(), offset, "seed {seed} round {round}: offsets dense");
            offset = prepare.end_offset();
            let body = prepare.body();
            let expected = group_model.appended.get(&op).map(|(_, body)| body.clone());
            let maybe = group_model.maybe_cut.get(&op).cloned();
            assert!(
                expected.as_ref() == Some(&body) || maybe.as_ref() == Some(&body),
                "seed {seed} round {round}: group {group} op {op} is not what was appended there"
            );
        }
        assert!(sim.block_on(log.read_op(head + 1)).expect("read").is_none());
        // Rebase the model on what survived: lost unacknowledged ops are gone for good, and a
        // cut that did not happen made the old prepares current again.
        let survived: BTreeMap<u64, (u64, Bytes)> = served
            .iter()
            .map(|prepare| (prepare.op(), (prepare.base_offset(), prepare.body())))
            .collect();
        group_model.appended = survived;
        group_model.maybe_cut.clear();
        group_model.durable = head;
        group_model.view = served
            .iter()
            .map(|prepare| prepare.header.view)
            .max()
            .unwrap_or(1)
            .max(group_model.view);
    }
}

/// Runs one seed; returns what the simulated disk injected, the segments recycled, and the
/// direct-path jobs and file-system syncs completed.
fn run_seed(seed: u64) -> (SimStats, u64, u64, u64, u64) {
    let sim = Sim::new(seed, SimConfig::default());
    let dir = Path::new("/data/shard-0");
    let model: Model = Rc::new(RefCell::new(BTreeMap::new()));
    for group in GROUPS {
        model.borrow_mut().insert(group, GroupModel { view: 1, ..GroupModel::default() });
    }
    {
        let (mut shard, _) =
            sim.block_on(ShardStore::open(sim.storage(), dir, shard_config(seed))).expect("open");
        for group in GROUPS {
            sim.block_on(shard.create_group(group, config(durability(group)))).expect("create");
        }
    }
    let mut rng = Rng::new(seed ^ 0x5eed);
    let mut recycled = 0;
    let mut direct_syncs = 0;
    let mut filesystem_syncs = 0;
    let mut zero_steps = 0;
    for round in 0..ROUNDS {
        let (shard, report) = sim
            .block_on(ShardStore::open(sim.storage(), dir, shard_config(seed)))
            .unwrap_or_else(|e| panic!("seed {seed} round {round}: open: {e}"));
        for group in &report.groups {
            assert!(
                group.corruption.is_none(),
                "seed {seed} round {round}: a crash is not corruption: {group:?}"
            );
        }
        let mut shard = shard;
        if std::env::var("CRASH_SIM_VERBOSE").is_ok() {
            eprintln!("seed {seed} round {round}: {report:?}");
        }
        check(&mut shard, &sim, &model, seed, round);
        let shard = Rc::new(RefCell::new(Some(shard)));
        let crash_after = 50 + rng.below(700);
        let finished = sim.run_until_crash(
            workload(Rc::clone(&shard), Rc::clone(&model), seed * 31 + round as u64),
            crash_after,
        );
        if finished.is_some() {
            sim.crash();
        }
        let counters = shard.borrow().as_ref().map(ShardStore::counters).unwrap_or_default();
        recycled += counters.segments_recycled;
        direct_syncs += counters.direct_syncs;
        filesystem_syncs += counters.filesystem_syncs;
        zero_steps += counters.zero_steps;
    }
    let (mut shard, report) =
        sim.block_on(ShardStore::open(sim.storage(), dir, shard_config(seed))).expect("open");
    if std::env::var("CRASH_SIM_VERBOSE").is_ok() {
        eprintln!("seed {seed} final: {report:?}");
    }
    check(&mut shard, &sim, &model, seed, ROUNDS);
    (sim.stats(), recycled, direct_syncs, filesystem_syncs, zero_steps)
}

#[test]
fn crash_at_random_points_loses_no_durable_append_and_serves_nothing_torn() {
    let mut total = SimStats::default();
    // CRASH_SIM_SEED=N reproduces one seed; CRASH_SIM_SEEDS=A..B soaks a range (xtask, not CI).
    let seeds = match (std::env::var("CRASH_SIM_SEED"), std::env::var("CRASH_SIM_SEEDS")) {
        (Ok(seed), _) => {
            let seed: u64 = seed.parse().expect("CRASH_SIM_SEED is a number");
            seed..seed + 1
        }
        (_, Ok(range)) => {
            let (start, end) = range.split_once("..").expect("CRASH_SIM_SEEDS is A..B");
            start.parse().expect("A")..end.parse().expect("B")
        }
        _ => 0..SEEDS,
    };
    let mut recycled = 0;
    let mut direct_syncs = 0;
    let mut filesystem_syncs = 0;
    let mut zero_steps = 0;
    for seed in seeds.clone() {
        let (stats, seed_recycled, seed_direct_syncs, seed_filesystem_syncs, seed_zero_steps) =
            run_seed(seed);
        recycled += seed_recycled;
        direct_syncs += seed_direct_syncs;
        filesystem_syncs += seed_filesystem_syncs;
        zero_steps += seed_zero_steps;
        total.crashes += stats.crashes;
        total.writes_lost_at_crash += stats.writes_lost_at_crash;
        total.writes_torn_at_crash += stats.writes_torn_at_crash;
        total.namespace_ops_lost_at_crash += stats.namespace_ops_lost_at_crash;
        total.syncs += stats.syncs;
    }
    println!(
        "crash_sim: {} seeds, {} crashes, {} unsynced writes lost, {} torn, {} namespace ops lost, {} syncs, {} segments recycled, {} direct-path syncs, {} file-system syncs, {} zero steps",
        seeds.end - seeds.start,
        total.crashes,
        total.writes_lost_at_crash,
        total.writes_torn_at_crash,
        total.namespace_ops_lost_at_crash,
        total.syncs,
        recycled,
        direct_syncs,
        filesystem_syncs,
        zero_steps
    );
    let count = seeds.end - seeds.start;
    assert!(total.crashes >= count * ROUNDS as u64, "every round crashes");
    assert!(total.writes_lost_at_crash >= count, "crashes must drop unsynced writes");
    assert!(total.writes_torn_at_crash >= count / 4, "crashes must tear writes");
    assert!(recycled >= count / 2, "rolls must take recycled segment files");
    assert!(direct_syncs >= count, "persisted cycles must take the direct path too");
    assert!(filesystem_syncs >= count / 4, "and its file-system form");
    assert!(zero_steps >= count, "direct logs must get their space ahead from zero steps");
}
