//! Engine micro-benchmarks on real files through io_uring (figures and method in
//! docs/benchmarks.md; compare each to `../shared/bin/ceilings` measured in the same run):
//! - `replicated_1mib`: one partition, 1 MiB batches, `replicated`, appends pipelined with the
//!   flush cycle (vs `seq_write_direct_mb_s`), into a new log (fresh segment files);
//! - `replicated_1mib_recycled`: the same in the steady state of a log under retention, where
//!   every roll takes the file of the segment retention retired (recycled segments);
//! - `persisted_64k_one_in_flight`: one partition, 64 KiB batches, `persisted`, one append in
//!   flight (vs `write64k_fdatasync_per_s`); `persisted_64k_recycled` the same in the steady
//!   state of a log under retention (recycled segments);
//! - `persisted_64_partitions_16k`: 64 partitions on one shard, 16 KiB batches, `persisted`,
//!   all appending at once, up to three rounds ahead of what is durable, with the shard's jobs
//!   run as the node layer runs them (vs `write1m_fdatasync_mb_s`), with p99 append→durable
//!   latency, into new logs; `persisted_64_partitions_16k_recycled` the same in the steady
//!   state of logs under retention (64 MiB segments, recycled; about 10 GiB of disk);
//! - memory and open files per idle partition (printed, not timed).
//!
//! The `persisted` benchmarks open one store per benchmark, warm it up untimed with 1 GiB of
//! appends, and measure every sample on it: a store opened per sample would measure the first
//! touch of a write-buffer pool still growing, which a running server pays once. The 64 KiB
//! ones run checkpoints and zero fills beside the flush cycles, as the node layer does.
//!
//! The data directory is a temporary directory under `SHOAL_BENCH_DIR` (default: the system
//! temporary directory), which should be on the disk under test. With `SHOAL_BENCH_PHASES` set,
//! the 64 KiB benchmarks also print the thread's time per append in each step between one
//! append's sync and the next append's writes ([`Phases`]).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use shoal_engine::Error;
use shoal_engine::direct::PersistedPath;
use shoal_engine::record::build_prepare;
use shoal_engine::ring::RingLimits;
use shoal_engine::shard::{
    CheckpointDone, ShardConfig, ShardCounters, ShardFlushDone, ShardStore, ZeroFillDone,
};
use shoal_engine::storage::uring::{UringStorage, runtime};
use shoal_engine::superblock::{Durability, GroupConfig};
use shoal_proto::wire::{HEADER_SIZE, Prepare};

const MIB: usize = 1 << 20;

type FlushRun = Pin<Box<dyn Future<Output = ShardFlushDone<UringStorage>>>>;

fn bench_dir() -> tempfile::TempDir {
    match std::env::var_os("SHOAL_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir).expect("bench dir"),
        None => tempfile::tempdir().expect("temp dir"),
    }
}

/// Production sizes: 1 GiB segments, 64 MiB reserved ahead, 4 MiB checkpoints (the defaults).
/// `SHOAL_BENCH_FLUSH_CYCLES=N` overrides `flush_cycles_in_flight_max`,
/// `SHOAL_BENCH_JOURNAL_CYCLES=N` `journal_cycles_in_flight_max`,
/// `SHOAL_BENCH_CHECKPOINT_BYTES=N` `checkpoint_interval_bytes`, `SHOAL_BENCH_CACHE_BYTES=N`
/// `batch_cache_bytes` and `SHOAL_BENCH_PERSISTED_PATH=auto|journal|direct|filesystem`
/// `persisted_path`, for A/B runs.
fn production(record_size_bytes_max: usize) -> ShardConfig {
    let defaults = ShardConfig::default();
    let from_env = |name: &str| std::env::var(name).ok().and_then(|value| value.parse().ok());
    ShardConfig {
        flush_cycles_in_flight_max: from_env("SHOAL_BENCH_FLUSH_CYCLES")
            .map_or(defaults.flush_cycles_in_flight_max, |n: u64| n as usize),
        journal_cycles_in_flight_max: from_env("SHOAL_BENCH_JOURNAL_CYCLES")
            .map_or(defaults.journal_cycles_in_flight_max, |n: u64| n as usize),
        checkpoint_interval_bytes: from_env("SHOAL_BENCH_CHECKPOINT_BYTES")
            .unwrap_or(defaults.checkpoint_interval_bytes),
        batch_cache_bytes: from_env("SHOAL_BENCH_CACHE_BYTES")
            .map_or(defaults.batch_cache_bytes, |n: u64| n as usize),
        persisted_path: std::env::var("SHOAL_BENCH_PERSISTED_PATH")
            .ok()
            .and_then(|value| PersistedPath::parse(&value))
            .unwrap_or(defaults.persisted_path),
        journal_size_bytes: 1 << 30,
        chunk_size_bytes: 8 * MIB,
        chunks_max: 64,
        ring: RingLimits { entries_max: 65_536, bytes_max: 64 * MIB },
        ring_budget_bytes: 256 * MIB,
        record_size_bytes_max,
        ..defaults
    }
}

fn group_config(durability: Durability, record_size_bytes_max: usize) -> GroupConfig {
    GroupConfig {
        durability,
        record_size_bytes_max: record_size_bytes_max as u32,
        ..GroupConfig::default()
    }
}

/// A shard at production sizes in `dir` with `groups` `persisted` groups, ids 1..=groups.
async fn open_persisted(dir: &std::path::Path, groups: u64) -> ShardStore<UringStorage> {
    let (mut shard, _) =
        ShardStore::open(UringStorage::new(), dir, production(MIB)).await.expect("open");
    for group in 1..=groups {
        shard.create_group(group, group_config(Durability::Persisted, MIB)).await.expect("group");
    }
    shard
}

fn append_one(shard: &mut ShardStore<UringStorage>, group: u64, body: &Bytes) -> u64 {
    try_append_one(shard, group, body).expect("append")
}

fn try_append_one(
    shard: &mut ShardStore<UringStorage>,
    group: u64,
    body: &Bytes,
) -> shoal_engine::Result<u64> {
    let next = shard.next(group).expect("group");
    let header =
        build_prepare(&next, 1, 0, Prepare { record_count: 1, ..Prepare::default() }, body);
    shard.append(group, &header, body)?;
    Ok(next.op)
}

/// One partition, 1 MiB batches, `replicated`, into a new log.
fn replicated_1mib(c: &mut Criterion) {
    replicated_bench(c, "replicated_1mib", 0, 0);
}

/// One partition, 1 MiB batches, `replicated`, in the steady state of a log whose retention
/// (1 GiB, one production segment) retires a segment per roll. The first two segments are fresh
/// files (the first is retired only once the second exists), so an untimed warm-up writes
/// them (2 GiB); from the third segment on, every segment is a retired one's file.
fn replicated_1mib_recycled(c: &mut Criterion) {
    replicated_bench(c, "replicated_1mib_recycled", 1 << 30, 4);
}

/// One partition, 1 MiB batches, `replicated`: an appender keeps up to `window` bytes
/// unwritten while a flusher task runs flush cycles back to back, as the node layer will. With
/// `retention_bytes`, retention runs after each iteration (and each of `warmup_iterations`
/// untimed ones first), when no flush is in flight, as the server runs it between cycles.
fn replicated_bench(c: &mut Criterion, name: &str, retention_bytes: u64, warmup_iterations: u64) {
    let batch = Bytes::from(vec![7u8; MIB - HEADER_SIZE]);
    let batches_per_iteration: u64 = 512;
    let mut io = IoPerAppend::default();
    let mut group = c.benchmark_group("engine");
    group.sample_size(10).measurement_time(Duration::from_secs(20));
    group.throughput(Throughput::Bytes(batches_per_iteration * MIB as u64));
    group.bench_function(name, |b| {
        b.iter_custom(|iterations| {
            let dir = bench_dir();
            let mut elapsed = Duration::ZERO;
            runtime().block_on(async {
                // A retired 1 GiB segment becomes the spare only within the ready-space budget,
                // beside the active segment's space ahead: 4 GiB, what the server gives a shard
                // of a large disk. The default 1 GiB deletes every retired segment instead.
                let config = ShardConfig { ready_budget_bytes: 4 << 30, ..production(2 * MIB) };
                let (mut shard, _) =
                    ShardStore::open(UringStorage::new(), dir.path(), config).await.expect("open");
                let config = GroupConfig {
                    retention_bytes,
                    ..group_config(Durability::Replicated, 2 * MIB)
                };
                shard.create_group(1, config).await.expect("group");
                let shard = Rc::new(RefCell::new(shard));
                for _ in 0..warmup_iterations {
                    pipelined(&shard, &batch, batches_per_iteration, 32 * MIB as u64).await;
                    enforce_retention(&shard, retention_bytes).await;
                }
                let before = shard.borrow().counters();
                io.appends += iterations * batches_per_iteration;
                for _ in 0..iterations {
                    let start = Instant::now();
                    pipelined(&shard, &batch, batches_per_iteration, 32 * MIB as u64).await;
                    enforce_retention(&shard, retention_bytes).await;
                    elapsed += start.elapsed();
                }
                io.add(&before, &shard.borrow().counters());
            });
            elapsed
        });
    });
    group.finish();
    io.print(name);
}

/// Runs retention once, when the group has a bound; call it with nothing in flight.
#[expect(
    clippy::await_holding_refcell_ref,
    reason = "called between pipelined runs, when no other task of the thread touches the shard"
)]
async fn enforce_retention(shard: &Rc<RefCell<ShardStore<UringStorage>>>, retention_bytes: u64) {
    if retention_bytes > 0 {
        shard.borrow_mut().enforce_retention(0).await.expect("retention");
    }
}

/// Appends `count` batches to group 1, keeping at most `window_bytes` not yet durable, with
/// flush cycles in a second task (see [`pipelined_groups`]).
async fn pipelined(
    shard: &Rc<RefCell<ShardStore<UringStorage>>>,
    batch: &Bytes,
    count: u64,
    window_bytes: u64,
) {
    let shape = Shape { slice_batches: APPEND_SLICE_BATCHES, window_bytes };
    pipelined_groups(shard, 1, batch, count, shape, &mut Vec::new()).await;
}

/// How a pipelined appender delivers its batches: `slice_batches` at a time (then it lets the
/// flusher run), keeping at most `window_bytes` not yet durable.
struct Shape {
    slice_batches: u64,
    window_bytes: u64,
}

/// Appends `count` batches to each of groups `1..=groups`, one group after the other, in the
/// `shape` given, while a second task runs the shard's jobs as the node layer does
/// ([`run_jobs`]). Pushes each slice's latency to `latencies_us`: from its first append until
/// as many batches are durable as had been appended by its end.
async fn pipelined_groups(
    shard: &Rc<RefCell<ShardStore<UringStorage>>>,
    groups: u64,
    batch: &Bytes,
    count: u64,
    shape: Shape,
    latencies_us: &mut Vec<u64>,
) {
    let start_ops: Vec<u64> =
        (1..=groups).map(|group| shard.borrow().group(group).expect("group").head_op()).collect();
    let targets: Vec<u64> = start_ops.iter().map(|op| op + count).collect();
    let batch_bytes = (batch.len() + HEADER_SIZE) as u64;
    let appended_signal = Rc::new(Signal::default());
    let durable_signal = Rc::new(Signal::default());
    let flusher = monoio::spawn(run_jobs(
        Rc::clone(shard),
        targets,
        Rc::clone(&appended_signal),
        Rc::clone(&durable_signal),
    ));
    let mut appended = 0u64;
    let total = count * groups;
    // Slices not yet durable: the count appended by their end, and their start.
    let mut slices: VecDeque<(u64, Instant)> = VecDeque::new();
    let mut durable_slices = |durable: u64, slices: &mut VecDeque<(u64, Instant)>| {
        while slices.front().is_some_and(|&(end, _)| end <= durable) {
            let (_, start) = slices.pop_front().expect("checked");
            latencies_us.push(start.elapsed().as_micros() as u64);
        }
    };
    while appended < total {
        let progressed = {
            let mut shard = shard.borrow_mut();
            let durable: u64 = (1..=groups)
                .map(|group| {
                    let start = start_ops[group as usize - 1];
                    shard.durable_op(group).unwrap_or(0).saturating_sub(start)
                })
                .sum();
            durable_slices(durable, &mut slices);
            let before = appended;
            let start = Instant::now();
            // A slice at a time, as a server's connections deliver them, so the flusher can
            // start a cycle for each while earlier ones are still writing.
            while appended < total
                && appended - before < shape.slice_batches
                && (appended - durable) * batch_bytes < shape.window_bytes
            {
                append_one(&mut shard, appended % groups + 1, batch);
                appended += 1;
            }
            if appended > before {
                slices.push_back((appended, start));
            }
            appended > before
        };
        if progressed {
            appended_signal.raise();
            yield_now().await;
        } else if appended < total {
            durable_signal.wait().await;
        }
    }
    flusher.await;
    durable_slices(total, &mut slices);
}

/// Runs the shard's jobs as the node layer's `poll_jobs` does, until every group `g` is durable
/// up to `targets[g - 1]`: on every wake it polls the flush cycles in flight and applies those
/// finished (oldest first), then starts as many cycles as the shard allows, and a checkpoint
/// and a zero fill when due and none is in flight. Raises `durable` whenever a cycle finished.
async fn run_jobs(
    shard: Rc<RefCell<ShardStore<UringStorage>>>,
    targets: Vec<u64>,
    appended: Rc<Signal>,
    durable: Rc<Signal>,
) {
    let mut flushes: VecDeque<(FlushRun, Option<ShardFlushDone<UringStorage>>)> = VecDeque::new();
    let mut beside = Beside::default();
    let all_durable = |shard: &ShardStore<UringStorage>| {
        targets
            .iter()
            .enumerate()
            .all(|(index, &op)| shard.durable_op(index as u64 + 1) == Some(op))
    };
    poll_fn(|context| {
        // Bounded, as the node layer bounds a round.
        for _ in 0..64 {
            let mut again = appended.poll_raised(context);
            beside.checkpoint.poll(context);
            beside.zero_fill.poll(context);
            for (run, done) in flushes.iter_mut().filter(|(_, done)| done.is_none()) {
                if let Poll::Ready(output) = run.as_mut().poll(context) {
                    *done = Some(output);
                }
            }
            let mut shard = shard.borrow_mut();
            while flushes.front().is_some_and(|(_, done)| done.is_some()) {
                let (_, done) = flushes.pop_front().expect("checked");
                let report = shard.finish_flush(done.expect("checked"));
                assert!(report.failed.is_empty() && !report.storage_full, "{report:?}");
                durable.raise();
            }
            beside.apply(&mut shard);
            while let Some(flush) = shard.begin_flush() {
                flushes.push_back((Box::pin(flush.run()), None));
                again = true;
            }
            again |= beside.begin(&mut shard);
            if flushes.is_empty() && beside.is_idle() && all_durable(&shard) {
                return Poll::Ready(());
            }
            if !again {
                return Poll::Pending;
            }
        }
        // What began last has not been polled yet: come back at once.
        context.waker().wake_by_ref();
        Poll::Pending
    })
    .await;
}

/// Batches the pipelined appender adds before it lets the flusher run.
const APPEND_SLICE_BATCHES: u64 = 4;

/// Lets the other tasks of the thread run once. A future that wakes itself does not do that:
/// monoio polls the future given to `block_on` again at once while it woke itself, before any
/// task it woke, so the appender ran ahead of the flusher by whole windows (measured: every
/// journal cycle of the 64-partition benchmark with producers a round ahead held two rounds).
/// Waiting for a task spawned behind the woken ones runs them first.
async fn yield_now() {
    monoio::spawn(async {}).await;
}

/// A single-task wake-up: `raise` wakes the task waiting in `wait` (or lets its next `wait`
/// return at once).
#[derive(Default)]
struct Signal {
    raised: std::cell::Cell<bool>,
    waker: RefCell<Option<std::task::Waker>>,
}

impl Signal {
    fn raise(&self) {
        self.raised.set(true);
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }

    async fn wait(&self) {
        poll_fn(|context| if self.poll_raised(context) { Poll::Ready(()) } else { Poll::Pending })
            .await;
    }

    /// Takes the raised flag, or registers the task to be woken when it is raised.
    fn poll_raised(&self, context: &mut std::task::Context<'_>) -> bool {
        if self.raised.replace(false) {
            true
        } else {
            *self.waker.borrow_mut() = Some(context.waker().clone());
            false
        }
    }
}

/// One partition, 64 KiB batches, `persisted`, one append in flight: append, flush (with the
/// default `auto` path, the segment write, a sync mark and the segment's sync), and only then
/// the next append. Into a new log.
fn persisted_64k_one_in_flight(c: &mut Criterion) {
    persisted_64k_bench(c, "persisted_64k_one_in_flight", None);
}

/// `persisted_64k_one_in_flight` in the steady state of a log under retention: 64 MiB segments
/// and 64 MiB retention, so every segment after the first two is a retired one's file, whose
/// blocks are written (a sync there costs what it costs into a pre-written file, which the
/// design replay assumes; a new log's reserved space costs an extent conversion per sync).
fn persisted_64k_recycled(c: &mut Criterion) {
    persisted_64k_bench(c, "persisted_64k_recycled", Some(64 * MIB as u64));
}

/// Untimed appends before a 64 KiB `persisted` benchmark measures anything: 1 GiB of batches,
/// twice what the write-buffer pool holds at its bound (`production`), so the pool has grown to
/// its working set and reuses its memory, as in a server that has run for a few seconds. A
/// store opened afresh for every sample would pay the first touch of every chunk instead
/// (docs/benchmarks.md, "Steady write buffers in the engine benchmarks").
const WARM_UP_APPENDS_64K: u64 = 16 * 1024;

/// The body of both 64 KiB `persisted` benchmarks. One store serves every sample: it is opened
/// before the first and warmed up (`WARM_UP_APPENDS_64K`). With `recycled_segment_bytes`, the
/// group's segments and retention take that size, the warm-up also runs until two segments
/// were recycled, and retention runs every 256 appends.
fn persisted_64k_bench(c: &mut Criterion, name: &str, recycled_segment_bytes: Option<u64>) {
    const RETENTION_EVERY_APPENDS: u64 = 256;
    let batch = Bytes::from(vec![3u8; 64 * 1024]);
    let appends_per_iteration: u64 = 2000;
    let mut io = IoPerAppend::default();
    let mut group = c.benchmark_group("engine");
    group.sample_size(10).measurement_time(Duration::from_secs(20));
    group.throughput(Throughput::Elements(appends_per_iteration));
    let mut rt = runtime();
    let mut store: Option<(tempfile::TempDir, ShardStore<UringStorage>)> = None;
    let mut beside = Beside::default();
    let mut appended = 0u64;
    let mut latencies_us: Vec<u64> = Vec::new();
    let mut phases = Phases::from_env();
    group.bench_function(name, |b| {
        b.iter_custom(|iterations| {
            let mut elapsed = Duration::ZERO;
            rt.block_on(async {
                let mut append_and_flush =
                    async |shard: &mut ShardStore<UringStorage>, phases: &mut Phases| {
                        let start = phases.now();
                        let next = shard.next(1).expect("group");
                        let fields = Prepare { record_count: 1, ..Prepare::default() };
                        let header = build_prepare(&next, 1, 0, fields, &batch);
                        let built = phases.took(Phase::Prepare, start);
                        shard.append(1, &header, &batch).expect("append");
                        let op = next.op;
                        phases.took(Phase::Append, built);
                        beside.flush_timed(shard, phases).await;
                        assert_eq!(shard.durable_op(1), Some(op));
                        appended += 1;
                        if recycled_segment_bytes.is_some()
                            && appended.is_multiple_of(RETENTION_EVERY_APPENDS)
                        {
                            beside.settle(shard).await;
                            shard.enforce_retention(0).await.expect("retention");
                        }
                    };
                if store.is_none() {
                    let dir = bench_dir();
                    let (mut shard, _) =
                        ShardStore::open(UringStorage::new(), dir.path(), production(MIB))
                            .await
                            .expect("open");
                    let mut config = group_config(Durability::Persisted, MIB);
                    if let Some(segment_bytes) = recycled_segment_bytes {
                        config.segment_size_bytes = segment_bytes;
                        config.retention_bytes = segment_bytes;
                    }
                    shard.create_group(1, config).await.expect("group");
                    let mut warm_up_appends = 0;
                    while warm_up_appends < WARM_UP_APPENDS_64K
                        || (recycled_segment_bytes.is_some()
                            && shard.counters().segments_recycled < 2)
                    {
                        // Not timed by step: the warm-up touches the pool's memory first.
                        append_and_flush(&mut shard, &mut Phases::default()).await;
                        warm_up_appends += 1;
                    }
                    store = Some((dir, shard));
                }
                let (_, shard) = store.as_mut().expect("opened above");
                let before = shard.counters();
                io.appends += iterations * appends_per_iteration;
                for _ in 0..iterations {
                    let start = Instant::now();
                    for _ in 0..appends_per_iteration {
                        let append_start = Instant::now();
                        append_and_flush(shard, &mut phases).await;
                        latencies_us.push(append_start.elapsed().as_micros() as u64);
                    }
                    elapsed += start.elapsed();
                }
                io.add(&before, &shard.counters());
            });
            elapsed
        });
    });
    group.finish();
    drop(store);
    print_latencies(name, &mut latencies_us);
    io.print(name);
    phases.print(name);
}

/// The steps of one 64 KiB append, from building its prepare to the flush cycle's end.
#[derive(Clone, Copy)]
enum Phase {
    /// The prepare's header over the body: its body checksum, which a server computes when the
    /// request arrives.
    Prepare,
    /// `ShardStore::append`: the copy into the write buffer and the ring.
    Append,
    /// `ShardStore::begin_flush`: the cycle's jobs and their writes.
    BeginFlush,
    /// The cycle's first poll, which issues its writes.
    FirstPoll,
    /// The cycle's later polls: each write's and the sync's completion.
    LaterPolls,
    /// `ShardStore::finish_flush`, and the jobs beside the cycles.
    Finish,
}

/// Where an append's thread time goes, step by step ([`Phase`]), when `SHOAL_BENCH_PHASES` is
/// set: what lies between a sync's completion and the next append's writes when one append is
/// in flight, beside the replay of the same I/O (`shoal-bench replay --form direct`), which
/// spends none of it (docs/benchmarks.md, "The one-partition row: a round against its replay").
/// Unset, it reads no clock.
#[derive(Default)]
struct Phases {
    enabled: bool,
    appends: u64,
    ns: [u64; 6],
}

impl Phases {
    const NAMES: [&str; 6] =
        ["prepare", "append", "begin_flush", "first poll", "later polls", "finish and beside"];

    fn from_env() -> Self {
        Self { enabled: std::env::var_os("SHOAL_BENCH_PHASES").is_some(), appends: 0, ns: [0; 6] }
    }

    fn now(&self) -> Option<Instant> {
        self.enabled.then(Instant::now)
    }

    /// Adds the time since `since` to `phase`; returns now, the next phase's start.
    fn took(&mut self, phase: Phase, since: Option<Instant>) -> Option<Instant> {
        let since = since?;
        let now = Instant::now();
        self.ns[phase as usize] += (now - since).as_nanos() as u64;
        if matches!(phase, Phase::Append) {
            self.appends += 1;
        }
        Some(now)
    }

    fn print(&self, name: &str) {
        if self.appends == 0 {
            return;
        }
        let steps: Vec<String> = Self::NAMES
            .iter()
            .zip(self.ns)
            .map(|(step, ns)| format!("{step} {:.2}", ns as f64 / self.appends as f64 / 1000.0))
            .collect();
        println!("{name} thread time per append, us: {}", steps.join(", "));
    }
}

/// A job running beside the flush cycles, and its output once it finished.
struct BesideJob<T> {
    run: Option<Pin<Box<dyn Future<Output = T>>>>,
    done: Option<T>,
}

impl<T> Default for BesideJob<T> {
    fn default() -> Self {
        Self { run: None, done: None }
    }
}

impl<T> BesideJob<T> {
    fn poll(&mut self, context: &mut std::task::Context<'_>) {
        if let Some(run) = self.run.as_mut()
            && let Poll::Ready(done) = run.as_mut().poll(context)
        {
            self.run = None;
            self.done = Some(done);
        }
    }

    async fn run_to_end(&mut self) {
        if let Some(run) = self.run.take() {
            self.done = Some(run.await);
        }
    }
}

/// The checkpoint and the zero fill, run beside one-at-a-time flush cycles as the node layer
/// runs them: polled while a cycle runs, applied once finished, the next started when due.
#[derive(Default)]
struct Beside {
    checkpoint: BesideJob<CheckpointDone<UringStorage>>,
    zero_fill: BesideJob<ZeroFillDone<UringStorage>>,
}

impl Beside {
    /// Runs one flush cycle to its end while the jobs beside it progress, adding each step's
    /// time to `phases`.
    async fn flush_timed(&mut self, shard: &mut ShardStore<UringStorage>, phases: &mut Phases) {
        let start = phases.now();
        if let Some(flush) = shard.begin_flush() {
            let begun = phases.took(Phase::BeginFlush, start);
            let mut run = std::pin::pin!(flush.run());
            let mut polls = 0;
            let done = poll_fn(|context| {
                let poll_start = phases.now();
                self.checkpoint.poll(context);
                self.zero_fill.poll(context);
                let result = run.as_mut().poll(context);
                let phase = if polls == 0 { Phase::FirstPoll } else { Phase::LaterPolls };
                // The first poll counts from the cycle's start, the later ones each alone: the
                // thread waits between them.
                phases.took(phase, if polls == 0 { begun } else { poll_start });
                polls += 1;
                result
            })
            .await;
            let finish_start = phases.now();
            let report = shard.finish_flush(done);
            assert!(report.failed.is_empty() && !report.storage_full, "{report:?}");
            self.apply(shard);
            self.begin(shard);
            phases.took(Phase::Finish, finish_start);
            return;
        }
        self.apply(shard);
        self.begin(shard);
    }

    /// Starts a checkpoint and a zero fill when due and none is in flight; true when it
    /// started one.
    fn begin(&mut self, shard: &mut ShardStore<UringStorage>) -> bool {
        let mut started = false;
        if self.checkpoint.run.is_none()
            && let Some(job) = shard.begin_checkpoint()
        {
            self.checkpoint.run = Some(Box::pin(job.run()));
            started = true;
        }
        if self.zero_fill.run.is_none()
            && let Some(job) = shard.begin_zero_fill()
        {
            self.zero_fill.run = Some(Box::pin(job.run()));
            started = true;
        }
        started
    }

    /// Whether neither job is in flight or waiting to be applied.
    fn is_idle(&self) -> bool {
        self.checkpoint.run.is_none()
            && self.checkpoint.done.is_none()
            && self.zero_fill.run.is_none()
            && self.zero_fill.done.is_none()
    }

    fn apply(&mut self, shard: &mut ShardStore<UringStorage>) {
        if let Some(done) = self.checkpoint.done.take() {
            shard.finish_checkpoint(done).expect("checkpoint");
        }
        if let Some(done) = self.zero_fill.done.take() {
            let report = shard.finish_zero_fill(done);
            assert!(report.failed.is_empty() && !report.storage_full, "{report:?}");
        }
    }

    /// Runs both to their end (before retention, which needs the log at rest).
    async fn settle(&mut self, shard: &mut ShardStore<UringStorage>) {
        self.checkpoint.run_to_end().await;
        self.zero_fill.run_to_end().await;
        self.apply(shard);
    }
}

/// Prints the percentiles of append→durable latencies, in microseconds.
fn print_latencies(name: &str, latencies_us: &mut [u64]) {
    latencies_us.sort_unstable();
    if let Some(&max) = latencies_us.last() {
        let p = |q: f64| latencies_us[((latencies_us.len() - 1) as f64 * q) as usize];
        println!(
            "{name} append->durable latency: p50 {} us, p99 {} us, p99.9 {} us, max {max} us",
            p(0.5),
            p(0.99),
            p(0.999),
        );
    }
}

/// What a benchmark's appends cost the disk, summed over its runs: the figures that say how
/// far the engine's I/O is from a single write and sync per append.
#[derive(Default)]
struct IoPerAppend {
    appends: u64,
    journal_syncs: u64,
    segment_syncs: u64,
    direct_syncs: u64,
    superblock_writes: u64,
    journal_bytes: u64,
    segment_bytes: u64,
    segments_recycled: u64,
    write_chunks_taken: u64,
    write_chunk_bytes_allocated: u64,
}

impl IoPerAppend {
    fn add(&mut self, before: &ShardCounters, after: &ShardCounters) {
        self.journal_syncs += after.journal_syncs - before.journal_syncs;
        self.segment_syncs += after.segment_syncs - before.segment_syncs;
        self.direct_syncs += after.direct_syncs - before.direct_syncs;
        self.superblock_writes += after.superblock_writes - before.superblock_writes;
        self.journal_bytes += after.journal_bytes_written - before.journal_bytes_written;
        self.segment_bytes += after.segment_bytes_written - before.segment_bytes_written;
        self.segments_recycled += after.segments_recycled - before.segments_recycled;
        self.write_chunks_taken += after.write_chunks_taken - before.write_chunks_taken;
        self.write_chunk_bytes_allocated +=
            after.write_chunk_bytes_allocated - before.write_chunk_bytes_allocated;
    }

    fn print(&self, name: &str) {
        if self.appends == 0 {
            return;
        }
        let per = |value: u64| value as f64 / self.appends as f64;
        println!(
            "{name} per append: journal syncs {:.3}, direct syncs {:.3}, segment syncs {:.4}, superblock writes {:.4}, journal bytes {:.0}, segment bytes {:.0}, write chunks taken {:.4}; segments recycled {}, new chunk memory {} MiB",
            per(self.journal_syncs),
            per(self.direct_syncs),
            per(self.segment_syncs),
            per(self.superblock_writes),
            per(self.journal_bytes),
            per(self.segment_bytes),
            per(self.write_chunks_taken),
            self.segments_recycled,
            self.write_chunk_bytes_allocated >> 20
        );
    }
}

/// 64 partitions on one shard, 16 KiB batches, `persisted`, all appending at once: a round
/// appends one batch to each (1 MiB), the next round starts once the round three back is
/// durable (`SHOAL_BENCH_WINDOW_ROUNDS`), and the shard's jobs run as the node layer runs them
/// ([`run_jobs`]), so one journal cycle covers a round, up to three cycles are in flight, and
/// the segment writes, checkpoints and zero fills run beside the cycles.
fn persisted_64_partitions_16k(c: &mut Criterion) {
    persisted_64_partitions_bench(c, "persisted_64_partitions_16k", None);
}

/// `persisted_64_partitions_16k` in the steady state of logs under retention: 64 MiB segments
/// and 64 MiB retention per partition, so every segment a group writes into is a retired one's
/// file, whose blocks are written, as the journal form's replay assumes (a new log's segment
/// writes land in reserved blocks, and converting their extents slows the journal's syncs
/// beside them). The groups' logs are staggered, group `g` starting `64 - g` 64ths of a segment
/// in, so their rolls spread over the rounds as a long-running shard's do.
fn persisted_64_partitions_16k_recycled(c: &mut Criterion) {
    persisted_64_partitions_bench(c, "persisted_64_partitions_16k_recycled", Some(64 * MIB as u64));
}

/// The body of both 64-partition benchmarks. One store serves every sample, opened and warmed
/// up before the first (as much as the 64 KiB benchmarks' warm-up, `WARM_UP_APPENDS_64K`).
/// With `recycled_segment_bytes`, every group's segments and retention take that size, the
/// warm-up goes on until the groups recycled two segments each, and retention runs after every
/// iteration, once its rounds are durable and nothing is in flight, as the server runs it
/// between cycles.
fn persisted_64_partitions_bench(
    c: &mut Criterion,
    name: &str,
    recycled_segment_bytes: Option<u64>,
) {
    const PARTITIONS: u64 = 64;
    // `SHOAL_BENCH_BATCH_KIB=N` (4..=1024) writes N KiB per partition and round instead, with
    // as many bytes per iteration: where the file-system form overtakes the journal.
    let kib: usize = std::env::var("SHOAL_BENCH_BATCH_KIB")
        .ok()
        .and_then(|value| value.parse().ok())
        .filter(|kib| (4..=1024).contains(kib))
        .unwrap_or(16);
    let batch = Bytes::from(vec![5u8; kib * 1024 - HEADER_SIZE]);
    let rounds_per_iteration = (200 * 16 / kib as u64).max(1);
    let mut latencies_us: Vec<u64> = Vec::new();
    let mut io = IoPerAppend::default();
    let mut group = c.benchmark_group("engine");
    group.sample_size(10).measurement_time(Duration::from_secs(20));
    group.throughput(Throughput::Bytes(rounds_per_iteration * PARTITIONS * kib as u64 * 1024));
    // `SHOAL_BENCH_DRIVER=flush` runs each round as one `ShardStore::flush` instead (the
    // driver of the runs before 2026-12-05), for A/B runs.
    let one_flush_per_round = std::env::var("SHOAL_BENCH_DRIVER").is_ok_and(|v| v == "flush");
    // `SHOAL_BENCH_WINDOW_ROUNDS=N` (1..=8, default 3) lets the appender run up to N rounds
    // ahead of what is durable, as producers with several requests in flight do (Kafka's
    // producers keep up to 5 per connection); 1 is a round at a time, the runs before
    // 2026-12-05's "Journal cycles in flight".
    let window_rounds: u64 = std::env::var("SHOAL_BENCH_WINDOW_ROUNDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .filter(|rounds| (1..=8).contains(rounds))
        .unwrap_or(3);
    let mut rt = runtime();
    let mut store: Option<(tempfile::TempDir, Rc<RefCell<ShardStore<UringStorage>>>)> = None;
    group.bench_function(name, |b| {
        b.iter_custom(|iterations| {
            let mut elapsed = Duration::ZERO;
            rt.block_on(async {
                let run_rounds =
                    async |shard: &Rc<RefCell<ShardStore<UringStorage>>>,
                           rounds: u64,
                           latencies_us: &mut Vec<u64>| {
                        if one_flush_per_round {
                            rounds_by_flush(shard, PARTITIONS, &batch, rounds, latencies_us).await;
                        } else {
                            // A round's appends at once, the next once the round `window_rounds`
                            // back is durable.
                            let round_bytes = PARTITIONS * kib as u64 * 1024;
                            let rounds_shape = Shape {
                                slice_batches: PARTITIONS,
                                window_bytes: round_bytes * window_rounds,
                            };
                            pipelined_groups(
                                shard,
                                PARTITIONS,
                                &batch,
                                rounds,
                                rounds_shape,
                                latencies_us,
                            )
                            .await;
                        }
                    };
                let retention_bytes = recycled_segment_bytes.unwrap_or(0);
                if store.is_none() {
                    let dir = bench_dir();
                    let shard = match recycled_segment_bytes {
                        None => Rc::new(RefCell::new(open_persisted(dir.path(), PARTITIONS).await)),
                        Some(segment_bytes) => {
                            open_staggered(dir.path(), PARTITIONS, segment_bytes, &batch).await
                        }
                    };
                    let mut warm_up_rounds =
                        (WARM_UP_APPENDS_64K * 64 / PARTITIONS / kib as u64).max(1);
                    while warm_up_rounds > 0
                        || (retention_bytes > 0
                            && shard.borrow().counters().segments_recycled < 2 * PARTITIONS)
                    {
                        let rounds = match warm_up_rounds {
                            0 => rounds_per_iteration,
                            left => left.min(rounds_per_iteration),
                        };
                        run_rounds(&shard, rounds, &mut Vec::new()).await;
                        enforce_retention(&shard, retention_bytes).await;
                        warm_up_rounds -= rounds.min(warm_up_rounds);
                    }
                    store = Some((dir, shard));
                }
                let (_, shard) = store.as_ref().expect("opened above");
                let before = shard.borrow().counters();
                io.appends += iterations * rounds_per_iteration * PARTITIONS;
                for _ in 0..iterations {
                    let start = Instant::now();
                    run_rounds(shard, rounds_per_iteration, &mut latencies_us).await;
                    enforce_retention(shard, retention_bytes).await;
                    elapsed += start.elapsed();
                }
                io.add(&before, &shard.borrow().counters());
            });
            elapsed
        });
    });
    group.finish();
    drop(store);
    print_latencies(name, &mut latencies_us);
    io.print(name);
}

/// A shard in `dir` with `groups` `persisted` groups of `segment_bytes` segments and as much
/// retention, group `g` holding `groups - g` 64ths of a segment of `batch`es already, so that
/// appending to all of them at once rolls one group at a time.
async fn open_staggered(
    dir: &std::path::Path,
    groups: u64,
    segment_bytes: u64,
    batch: &Bytes,
) -> Rc<RefCell<ShardStore<UringStorage>>> {
    // Recycling keeps a retired segment as a spare only within the ready-space budget, and each
    // group holds up to a segment reserved ahead of its tail besides its spare: 8 GiB for 64
    // groups of 64 MiB segments. Below that, retention deletes retired segments instead.
    let config = ShardConfig { ready_budget_bytes: 16 << 30, ..production(MIB) };
    let (mut shard, _) = ShardStore::open(UringStorage::new(), dir, config).await.expect("open");
    let batches_per_step = segment_bytes / groups / (batch.len() + HEADER_SIZE) as u64;
    for group in 1..=groups {
        let config = GroupConfig {
            segment_size_bytes: segment_bytes,
            retention_bytes: segment_bytes,
            ..group_config(Durability::Persisted, MIB)
        };
        shard.create_group(group, config).await.expect("group");
        for appended in 1..=(groups - group) * batches_per_step {
            // A full journal waits for the flush, which checkpoints, as a server's appends do.
            while let Err(error) = try_append_one(&mut shard, group, batch) {
                assert!(matches!(error, Error::LimitReached(_)), "{error}");
                shard.flush().await.expect("flush");
            }
            if appended % 64 == 0 {
                shard.flush().await.expect("flush");
            }
        }
        shard.flush().await.expect("flush");
    }
    Rc::new(RefCell::new(shard))
}

/// Runs `rounds` rounds of one batch per group `1..=groups`, each round as one
/// `ShardStore::flush` (the 64-partition benchmark's driver before 2026-12-05), and pushes each
/// round's latency.
#[expect(
    clippy::await_holding_refcell_ref,
    reason = "no other task of the thread touches the shard while it runs"
)]
async fn rounds_by_flush(
    shard: &Rc<RefCell<ShardStore<UringStorage>>>,
    groups: u64,
    batch: &Bytes,
    rounds: u64,
    latencies_us: &mut Vec<u64>,
) {
    let mut shard = shard.borrow_mut();
    for _ in 0..rounds {
        let start = Instant::now();
        for group in 1..=groups {
            append_one(&mut shard, group, batch);
        }
        shard.flush().await.expect("flush");
        latencies_us.push(start.elapsed().as_micros() as u64);
    }
}

/// Memory and open files per idle partition: 1,000 groups created and never written, then the
/// same groups after one small append each.
fn idle_partition_footprint(_c: &mut Criterion) {
    const GROUPS: u64 = 1000;
    let dir = bench_dir();
    runtime().block_on(async {
        let mut config = production(MIB);
        config.groups_max = 2048;
        // One write-buffer chunk per partition that appended: small chunks, enough of them.
        config.chunk_size_bytes = 2 * MIB;
        config.chunks_max = 2048;
        let (mut shard, _) = ShardStore::open(UringStorage::new(), dir.path(), config).await.expect("open");
        let (rss_before, fds_before) = (rss_bytes(), open_fds());
        for group in 1..=GROUPS {
            shard.create_group(group, group_config(Durability::Persisted, MIB)).await.expect("group");
        }
        let (rss_idle, fds_idle) = (rss_bytes(), open_fds());
        let body = Bytes::from(vec![1u8; 100]);
        for group in 1..=GROUPS {
            append_one(&mut shard, group, &body);
        }
        shard.flush().await.expect("flush");
        // As the node layer goes on once the shard is idle: the idle mark, then a tick, which
        // takes back the chunks of the groups it finds idle.
        shard.request_journal_marker();
        shard.flush().await.expect("flush");
        shard.on_tick();
        let (rss_used, fds_used) = (rss_bytes(), open_fds());
        println!(
            "idle partition footprint: {} bytes and {:.2} open files per never-written partition; \
             {} bytes and {:.2} open files after one append each (write-buffer chunks: {} of {} bytes)",
            rss_idle.saturating_sub(rss_before) / GROUPS,
            (fds_idle - fds_before) as f64 / GROUPS as f64,
            rss_used.saturating_sub(rss_before) / GROUPS,
            (fds_used - fds_before) as f64 / GROUPS as f64,
            shard.chunks_allocated(),
            shard.config().chunk_size_bytes,
        );
    });
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    pages * 4096
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|entries| entries.count()).unwrap_or(0)
}

criterion_group!(
    benches,
    replicated_1mib,
    replicated_1mib_recycled,
    persisted_64k_one_in_flight,
    persisted_64k_recycled,
    persisted_64_partitions_16k,
    persisted_64_partitions_16k_recycled,
    idle_partition_footprint
);
criterion_main!(benches);
