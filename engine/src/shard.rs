//! The shard store: every group log of one shard, the shard journal and the superblock, and the
//! two kinds of jobs that move their bytes to disk (DESIGN.md §3).
//!
//! A flush cycle starts as soon as the previous one completed and anything is pending: it
//! writes every group's pending bytes and the journal's pending cycle concurrently, and the one
//! journal sync that makes every `persisted` prepare of the shard durable — or, when few
//! `persisted` groups wait, skips the journal for them and syncs their segments instead (the
//! direct path, `crate::direct`), choosing per cycle by cost. A checkpoint job runs
//! beside the cycles: it syncs the segments of the groups due a checkpoint, then writes at most
//! one superblock version recording those checkpoints (and any changed views). Both are split
//! into begin (sync, snapshots), run (owned I/O) and finish (sync, applies), so appends continue
//! while they run. This module never reads a clock: times arrive as arguments.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::cache::{BatchCache, CacheCounters};
use crate::checksum;
use crate::chunk::ChunkPool;
use crate::direct::{PersistedForm, PersistedPath, SyncCosts, cheapest_form};
use crate::error::{Error, Result};
use crate::join::join_all;
use crate::journal::{Journal, JournalCycle, JournalRecovery, Take};
use crate::partition::{
    FlushDone, FlushJob, GroupRecovery, PartitionLog, SettleJob, Shared, WRITE_BUFFER_FULL,
    ZERO_STEPS_PER_FILL_MAX, ZeroStep, ZeroStepDone,
};
use crate::record::{ChainNext, check_standalone, prepare_of};
use crate::ring::{RingBudget, RingLimits};
use crate::segment::is_retired_name;
use crate::state::GroupState;
use crate::storage::{AlignedBuf, BLOCK_SIZE_BYTES, Storage, StorageFile};
use crate::superblock::{
    Checkpoint, CopyStatus, Durability, Fence, GroupConfig, GroupSlot, Identity, Superblock,
    SuperblockWrite,
};
use crate::transfer;
use crate::wire::{HEADER_SIZE, Header};

/// Settings of one shard's storage.
#[derive(Clone, Debug)]
pub struct ShardConfig {
    /// Cluster id stamped in every record.
    pub cluster: u64,
    /// This node's id.
    pub node: u64,
    /// This shard's index.
    pub shard: u32,
    /// Shards on this node (a changed count is refused at open).
    pub shard_count: u32,
    /// Groups the superblock can hold. A data directory made with another bound has its slot
    /// table laid out again at open (refused only when it holds more groups than this).
    pub groups_max: usize,
    /// Size of the shard journal file.
    pub journal_size_bytes: u64,
    /// A group is checkpointed once this many bytes were appended since its last checkpoint.
    /// Small enough that each checkpoint's segment sync is short: on a device with a write
    /// cache a sync costs every byte written since the last one, and a long one stalls the
    /// writes beside it (docs/benchmarks.md).
    pub checkpoint_interval_bytes: u64,
    /// The largest step of disk space made ready ahead of an active segment's tail (a clean
    /// "storage full" before a cycle writes anything); a partition's step grows toward it with
    /// its write rate.
    pub ready_ahead_bytes: u64,
    /// Ready space (ahead of tails, in spare segment files) all the shard's partitions may hold
    /// together: partitions that are writing get it, idle ones never did (DESIGN.md §3).
    pub ready_budget_bytes: u64,
    /// Segments retention retires become the next segment's file (the spare) instead of being
    /// deleted, while a group has no spare: writing over written blocks makes the checkpoint
    /// syncs cheaper than filling fresh space (DESIGN.md §3). Off, retention frees the space.
    pub recycle_segments: bool,
    /// Distance between sparse index entries.
    pub index_interval_bytes: u64,
    /// Flush cycles in flight at once (at least 1). A cycle may start while earlier ones are
    /// still writing, so the device always has writes queued.
    pub flush_cycles_in_flight_max: usize,
    /// Of those, cycles that write the shard journal at once (at least 1): a cycle's journal
    /// write goes out while the one before it syncs, and each counts as durable once every
    /// cycle before it is.
    pub journal_cycles_in_flight_max: usize,
    /// Bounds of each group's prepare ring.
    pub ring: RingLimits,
    /// Memory all rings of the shard may hold together.
    pub ring_budget_bytes: usize,
    /// Size of one write-buffer chunk (must hold the largest record plus a block).
    pub chunk_size_bytes: usize,
    /// Write-buffer chunks the shard may allocate.
    pub chunks_max: usize,
    /// Out-of-order prepares a group holds at most.
    pub held_prepares_max: usize,
    /// A `persisted` group writes its segment once this much is pending (capped at a quarter of
    /// the ring, which must hold it meanwhile).
    pub persisted_write_batch_bytes: usize,
    /// Read window of scans.
    pub scan_window_bytes: usize,
    /// Memory the shard's batch cache may hold: written prepares kept for consumers behind the
    /// rings, since direct I/O leaves nothing in the page cache (0: none).
    pub batch_cache_bytes: usize,
    /// Read-ahead reads (each about `scan_window_bytes`) a partition keeps in flight at most
    /// for a consumer reading from disk in order (0: no read-ahead).
    pub read_ahead_windows: usize,
    /// Entries an index file may hold.
    pub index_entries_max: usize,
    /// Largest record any group may configure (bounds journal entries).
    pub record_size_bytes_max: usize,
    /// How flush cycles make `persisted` prepares durable: the shard journal, the direct path
    /// (segment writes with sync marks, then a sync per group or one of the file system), or
    /// per cycle by cost (DESIGN.md §3, `crate::direct::cheapest_form`).
    pub persisted_path: PersistedPath,
    /// What one file's sync costs, in bytes written (`PersistedPath::Auto` compares the forms
    /// in bytes).
    pub sync_cost_bytes: u64,
    /// What one sync of the whole file system costs, in bytes written. Where the file system
    /// does not support it (`Storage::filesystem_sync_supported`), `Auto` never takes it.
    pub filesystem_sync_cost_bytes: u64,
}

impl Default for ShardConfig {
    fn default() -> Self {
        Self {
            cluster: 0,
            node: 0,
            shard: 0,
            shard_count: 1,
            // A node holds 10,000 partitions on one shard (DESIGN.md §3), plus its metadata.
            groups_max: 16_384,
            journal_size_bytes: 1 << 30,
            checkpoint_interval_bytes: 4 << 20,
            ready_ahead_bytes: 64 << 20,
            ready_budget_bytes: 1 << 30,
            recycle_segments: true,
            index_interval_bytes: 64 << 10,
            flush_cycles_in_flight_max: 4,
            // Measured best with producers rounds ahead (docs/benchmarks.md, "Journal cycles in
            // flight"): 3 against 2 and 4.
            journal_cycles_in_flight_max: 3,
            ring: RingLimits::default(),
            ring_budget_bytes: 1 << 30,
            chunk_size_bytes: 4 << 20,
            chunks_max: 1024,
            held_prepares_max: 1024,
            persisted_write_batch_bytes: 1 << 20,
            scan_window_bytes: 1 << 20,
            batch_cache_bytes: 1 << 30,
            read_ahead_windows: 4,
            index_entries_max: 1 << 20,
            record_size_bytes_max: crate::wire::HEADER_SIZE + (1 << 20),
            persisted_path: PersistedPath::Auto,
            // A sync's fixed cost on the disks measured is worth about 40-80 KiB of writes
            // (docs/benchmarks.md, "the adaptive persisted path").
            sync_cost_bytes: 64 << 10,
            // Measured, not the sync alone: the file-system form's sync waits for the cycle's
            // writes, where the journal's runs beside them, several cycles at once. With 64
            // partitions and three journal cycles in flight the two forms tie at about 3.2 MiB
            // per cycle (docs/benchmarks.md, "The file-system form against journal cycles in
            // flight").
            filesystem_sync_cost_bytes: 3 << 20,
        }
    }
}

impl ShardConfig {
    /// A small profile for tests: small journal, rings, chunks and read-ahead.
    #[must_use]
    pub fn small() -> Self {
        Self {
            groups_max: 256,
            journal_size_bytes: 4 << 20,
            checkpoint_interval_bytes: 1 << 20,
            ready_ahead_bytes: 256 << 10,
            ready_budget_bytes: 8 << 20,
            index_interval_bytes: 4 << 10,
            flush_cycles_in_flight_max: 2,
            journal_cycles_in_flight_max: 2,
            ring: RingLimits { entries_max: 1024, bytes_max: 1 << 20 },
            ring_budget_bytes: 8 << 20,
            chunk_size_bytes: 256 << 10,
            chunks_max: 256,
            held_prepares_max: 64,
            scan_window_bytes: 64 << 10,
            batch_cache_bytes: 4 << 20,
            index_entries_max: 1 << 16,
            record_size_bytes_max: crate::wire::HEADER_SIZE + (64 << 10),
            ..Self::default()
        }
    }
}

/// Counters of the shard's I/O (tests and metrics read them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardCounters {
    /// Flush cycles completed.
    pub flushes: u64,
    /// Journal fdatasyncs.
    pub journal_syncs: u64,
    /// Segment fdatasyncs (checkpoints and rolls).
    pub segment_syncs: u64,
    /// Direct-path jobs completed (each synced its group's segment files, or was covered by a
    /// file-system sync).
    pub direct_syncs: u64,
    /// File-system syncs completed (each covering a cycle's direct-path jobs).
    pub filesystem_syncs: u64,
    /// Superblock versions written.
    pub superblock_writes: u64,
    /// Bytes written to segments (data and zeros).
    pub segment_bytes_written: u64,
    /// Bytes written to the journal.
    pub journal_bytes_written: u64,
    /// Checkpoints recorded.
    pub checkpoints: u64,
    /// State transfers installed ([`ShardStore::install_transfer`] calls that completed).
    pub transfers_installed: u64,
    /// Segments retention recycled into a spare segment file rather than deleted.
    pub segments_recycled: u64,
    /// Bytes of written prepares other groups' rings gave back to the shard's ring budget for
    /// an append whose own ring had none left to evict.
    pub ring_bytes_taken_back: u64,
    /// Walks over the other groups' rings for room in the ring budget. A walk that finds
    /// nothing written to take is not repeated until a flush finishes: at most one per flush
    /// when the budget is full of unwritten prepares, however many appends it refuses.
    pub ring_take_back_scans: u64,
    /// Zero steps completed: space ahead of a direct log's tail written with zeros and synced
    /// beside the flush cycles (their bytes count in `segment_bytes_written`).
    pub zero_steps: u64,
    /// Write-buffer chunks groups took from the pool. A busy group takes one per chunk it
    /// fills; one per append means groups hand their chunks back between appends.
    pub write_chunks_taken: u64,
    /// Bytes of new write-buffer memory the pool allocated (first touched, which is slow).
    /// It grows while the pool reaches the memory its rings and batch cache hold, then stays.
    pub write_chunk_bytes_allocated: u64,
}

/// What opening the shard found.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    /// Each superblock copy's status.
    pub superblock: Vec<CopyStatus>,
    /// Valid journal entries found.
    pub journal_entries: u64,
    /// Damage in the journal's synced region.
    pub journal_corruption: Option<crate::Corruption>,
    /// Each group's recovery.
    pub groups: Vec<GroupRecovery>,
    /// The previous run stopped cleanly (closed, everything synced).
    pub clean_shutdown: bool,
}

/// Groups whose appends became durable in a flush: (group, highest durable op).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlushReport {
    /// Per group, the new durable op.
    pub durable: Vec<(u64, u64)>,
    /// Groups that failed (now fail-stop) with the error.
    pub failed: Vec<(u64, String)>,
    /// Storage was full: some group's pending bytes stay pending until a retried reservation
    /// succeeds (see [`ShardStore::on_tick`]).
    pub storage_full: bool,
}

/// One shard's storage.
pub struct ShardStore<S: Storage> {
    storage: S,
    dir: PathBuf,
    config: ShardConfig,
    shared: Rc<Shared>,
    superblock: Superblock<S::File>,
    journal: Journal<S::File>,
    groups: BTreeMap<u64, PartitionLog<S>>,
    durable: BTreeMap<u64, u64>,
    /// Groups whose durable op changed since the owner last asked
    /// ([`ShardStore::take_durable_changed`]): a shard of 10,000 groups tells only these.
    durable_changed: BTreeSet<u64>,
    /// The shift over the last `persisted` append's body length, for its journal checksum:
    /// producers' batches often have one length, and computing it each time showed in the
    /// 64-partition benchmark's profile.
    body_shift: checksum::Shift,
    /// Groups whose log holds a damage marker (`PartitionLog::damaged_from`), kept beside the
    /// logs so the owner finds them without walking every group
    /// ([`ShardStore::damaged_groups`]).
    damaged: BTreeSet<u64>,
    /// Whether the file system holding `dir` supports the file-system form.
    filesystem_sync: bool,
    /// Groups whose slot changed (views, fence) and must reach the superblock.
    slots_dirty: BTreeSet<u64>,
    /// The dirty slots the checkpoint job in flight writes: dirty again if it fails.
    slots_in_flight: BTreeSet<u64>,
    /// Groups to checkpoint in the next flush whatever their byte count.
    checkpoint_wanted: BTreeSet<u64>,
    /// Groups that may have flush, checkpoint or storage-full work: every group touched since
    /// it was last found idle. The per-cycle questions (anything pending? which jobs?) ask
    /// these and `checkpoint_wanted` only, so 10,000 idle groups cost a shard nothing per cycle.
    /// A group leaves only when [`ShardStore::is_idle`] says so, checked once per tick.
    active: BTreeSet<u64>,
    /// Where the next cycle's turn at writing put-off segment writes starts (a group id).
    segment_write_turn: u64,
    /// The group [`ShardStore::take_back_ring_budget`] asks first next time.
    ring_take_back_turn: u64,
    /// The last walk for ring room found nothing written to take back. Until a flush finishes
    /// (prepares become written only then), another walk would find nothing either; at 10,000
    /// groups a walk per refused append would cost milliseconds per flush under backpressure.
    ring_take_back_futile: bool,
    /// Where the next zero fill's turn starts (a group id): each takes a few of the steps due.
    zero_fill_turn: u64,
    /// Groups whose rolled segments' index files found no room: no checkpoint of theirs starts
    /// until the next [`ShardStore::on_tick`].
    settle_blocked: BTreeSet<u64>,
    counters: ShardCounters,
    marker_wanted: bool,
    checkpoint_in_flight: bool,
    /// A [`ZeroFillJob`] is in flight.
    zero_fill_in_flight: bool,
    /// Flush cycles begun and not yet finished, and the sequence number of the next to begin;
    /// cycles finish in the order they began.
    flushes_in_flight: usize,
    next_flush_seq: u64,
    failed: Option<String>,
}

/// A flush cycle in flight, owning its I/O.
pub struct ShardFlush<S: Storage> {
    seq: u64,
    /// Every append made before the cycle began is durable once it (and the cycles before it)
    /// finished: no `replicated` group was left with data for a later cycle, and the journal
    /// cycle took every pending entry.
    complete: bool,
    jobs: Vec<FlushJob<S>>,
    journal: Option<JournalCycle<S::File>>,
    /// Persisted groups whose prepares up to this op ride in the journal cycle.
    journaled: Vec<(u64, u64)>,
    group_targets: Vec<(u64, u64)>,
    /// The file-system form: the storage and the directory whose file system one sync makes
    /// the direct jobs durable once they all wrote.
    filesystem_sync: Option<(S, PathBuf)>,
}

/// A finished [`ShardFlush`], to hand back to [`ShardStore::finish_flush`].
pub struct ShardFlushDone<S: Storage> {
    seq: u64,
    jobs: Vec<FlushDone<S>>,
    journal: Option<(JournalCycle<S::File>, Result<()>)>,
    journaled: Vec<(u64, u64)>,
    group_targets: Vec<(u64, u64)>,
    /// A file-system sync completed for the cycle.
    filesystem_synced: bool,
}

impl<S: Storage> ShardFlush<S> {
    /// Whether every append made before the cycle began is durable once it finishes
    /// successfully (a cycle beside others in flight may leave some for a later one).
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// Runs the cycle: group writes and the journal write and its sync, concurrently; in the
    /// file-system form, the one file-system sync once every group's writes are done.
    pub async fn run(self) -> ShardFlushDone<S> {
        let ShardFlush {
            seq,
            complete: _,
            jobs,
            journal,
            journaled,
            group_targets,
            filesystem_sync,
        } = self;
        let jobs_future = async {
            let mut done = join_all(jobs.into_iter().map(FlushJob::run).collect()).await;
            let mut synced = false;
            if let Some((storage, dir)) = &filesystem_sync
                && done.iter().any(FlushDone::waits_for_filesystem_sync)
            {
                let result = if cfg!(feature = "canary-no-filesystem-sync") {
                    // Canary (DESIGN.md §7): the jobs count as synced without the sync.
                    Ok(())
                } else {
                    storage.sync_filesystem(dir).await
                };
                synced = result.is_ok();
                for job in &mut done {
                    job.finish_filesystem_sync(&result);
                }
            }
            (done, synced)
        };
        let journal_future = async {
            match &journal {
                Some(cycle) => Some(cycle.run().await),
                None => None,
            }
        };
        let ((jobs_done, filesystem_synced), journal_result) =
            join2(jobs_future, journal_future).await;
        ShardFlushDone {
            seq,
            jobs: jobs_done,
            journal: journal.map(|cycle| (cycle, journal_result.expect("ran with the cycle"))),
            journaled,
            group_targets,
            filesystem_synced,
        }
    }
}

/// A checkpoint in flight: the segment syncs that make the written data durable, then the
/// superblock version that records it (and carries any changed views). It runs beside flush
/// cycles, so a sync that pays for everything the device absorbed never stalls appends.
pub struct CheckpointJob<S: Storage> {
    syncs: Vec<(u64, Rc<S::File>)>,
    /// Rolled segments below the new checkpoints, made final first.
    settles: Vec<SettleJob<S>>,
    checkpoints: Vec<(u64, Checkpoint, u64)>,
    superblock: SuperblockWrite<S::File>,
}

/// Zero steps in flight ([`ZeroStep`]): the space ahead of small direct logs' tails, written with
/// zeros and synced beside the flush cycles and checkpoints, so that no append waits for it.
pub struct ZeroFillJob<S: Storage> {
    steps: Vec<ZeroStep<S>>,
}

/// A finished [`ZeroFillJob`], to hand back to [`ShardStore::finish_zero_fill`].
pub struct ZeroFillDone<S: Storage> {
    steps: Vec<ZeroStepDone<S>>,
}

impl<S: Storage> ZeroFillJob<S> {
    /// The groups whose steps the job writes.
    pub fn groups(&self) -> impl Iterator<Item = u64> + '_ {
        self.steps.iter().map(ZeroStep::group)
    }

    /// Runs every step concurrently.
    pub async fn run(self) -> ZeroFillDone<S> {
        ZeroFillDone { steps: join_all(self.steps.into_iter().map(ZeroStep::run).collect()).await }
    }
}

/// A finished [`CheckpointJob`], to hand back to [`ShardStore::finish_checkpoint`].
pub struct CheckpointDone<S: Storage> {
    job: CheckpointJob<S>,
    /// Every sync or settle that failed, by group.
    failed_sync: Vec<(u64, Error)>,
    settle_syncs: u64,
    superblock: Result<()>,
}

impl<S: Storage> CheckpointJob<S> {
    /// Syncs the segments and settles rolled ones concurrently, then writes the superblock only
    /// if every step succeeded, so it never names a checkpoint whose data is not durable.
    pub async fn run(self) -> CheckpointDone<S> {
        let syncs = join_all(
            self.syncs
                .iter()
                .map(|(group, file)| {
                    let file = Rc::clone(file);
                    let group = *group;
                    async move {
                        file.sync_data().await.map_err(|e| {
                            (group, Error::io(format!("syncing group {group} for a checkpoint"), e))
                        })
                    }
                })
                .collect(),
        );
        let settles = join_all(
            self.settles
                .iter()
                .map(|settle| async move { settle.run().await.map_err(|e| (settle.group(), e)) })
                .collect(),
        );
        let (sync_results, settle_results) = join2(syncs, settles).await;
        let settle_syncs = settle_results.iter().filter_map(|result| result.as_ref().ok()).sum();
        let failed_sync: Vec<(u64, Error)> = sync_results
            .into_iter()
            .chain(settle_results.into_iter().map(|result| result.map(drop)))
            .filter_map(Result::err)
            .collect();
        let superblock = if failed_sync.is_empty() {
            self.superblock.run().await
        } else {
            Err(Error::Invalid("skipped: a checkpoint sync failed".into()))
        };
        CheckpointDone { job: self, failed_sync, settle_syncs, superblock }
    }
}

impl<S: Storage> ShardStore<S> {
    /// Opens (or creates) the shard's storage in `dir` and recovers every group.
    pub async fn open(
        storage: S,
        dir: &Path,
        config: ShardConfig,
    ) -> Result<(Self, RecoveryReport)> {
        create_shard_dir(&storage, dir).await?;
        let filesystem_sync = storage.filesystem_sync_supported(dir);
        if config.persisted_path == PersistedPath::Filesystem && !filesystem_sync {
            return Err(Error::Invalid(format!(
                "persisted_path \"filesystem\": the file system of {} is not known to make \
                 writes durable with one sync (syncfs); use \"auto\", \"direct\" or \"journal\"",
                dir.display()
            )));
        }
        let identity = Identity {
            cluster: config.cluster,
            node: config.node,
            shard: config.shard,
            shard_count: config.shard_count,
        };
        refuse_a_lost_superblock(&storage, dir).await?;
        let (superblock, superblock_status) =
            Superblock::open(&storage, dir, identity, config.groups_max).await?;
        let groups_named = superblock.state().groups.len();
        let (journal, journal_recovery) = Journal::open(
            &storage,
            dir,
            config.cluster,
            config.journal_size_bytes,
            config.record_size_bytes_max,
            config.journal_cycles_in_flight_max,
            groups_named,
        )
        .await?;
        let shared = Rc::new(shared_for(&config));
        let mut report = RecoveryReport {
            superblock: superblock_status,
            journal_entries: journal_recovery.entries_valid,
            journal_corruption: journal_recovery.corruption.clone(),
            groups: Vec::new(),
            clean_shutdown: superblock.state().clean_shutdown,
        };
        let recovered =
            recover_groups(&storage, dir, &shared, &superblock, &journal_recovery, &mut report)
                .await?;
        let RecoveredGroups { mut groups, durable, checkpoint_wanted } = recovered;
        let superblock = finish_interrupted(superblock, &mut groups).await?;
        remove_unnamed_group_dirs(&storage, dir, &groups).await?;
        let mut journal = journal;
        release_stale_journal(&mut journal, &groups);
        let durable_changed = durable.keys().copied().collect();
        let damaged =
            groups.iter().filter(|(_, log)| log.damaged_from() != 0).map(|(&id, _)| id).collect();
        let shard = ShardStore {
            storage,
            dir: dir.to_path_buf(),
            config,
            shared,
            superblock,
            journal,
            active: groups.keys().copied().collect(),
            segment_write_turn: 0,
            ring_take_back_turn: 0,
            ring_take_back_futile: false,
            zero_fill_turn: 0,
            groups,
            durable,
            durable_changed,
            body_shift: checksum::Shift::new(0),
            damaged,
            filesystem_sync,
            slots_dirty: BTreeSet::new(),
            slots_in_flight: BTreeSet::new(),
            checkpoint_wanted,
            settle_blocked: BTreeSet::new(),
            counters: ShardCounters::default(),
            marker_wanted: false,
            checkpoint_in_flight: false,
            zero_fill_in_flight: false,
            flushes_in_flight: 0,
            next_flush_seq: 0,
            failed: None,
        };
        Ok((shard, report))
    }

    /// The shard's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The shard's settings.
    pub fn config(&self) -> &ShardConfig {
        &self.config
    }

    /// I/O counters.
    pub fn counters(&self) -> ShardCounters {
        ShardCounters {
            superblock_writes: self.superblock.writes(),
            write_chunks_taken: self.shared.pool.borrow().taken(),
            write_chunk_bytes_allocated: self.shared.pool.borrow().allocated_bytes_total(),
            ..self.counters
        }
    }

    /// Group ids, in order.
    pub fn group_ids(&self) -> Vec<u64> {
        self.groups.keys().copied().collect()
    }

    /// A group's log.
    pub fn group(&self, group: u64) -> Option<&PartitionLog<S>> {
        self.groups.get(&group)
    }

    /// A group's log, mutably (reads that finish from disk need it). The group counts as
    /// touched: whatever the caller changes is seen by the next cycle.
    pub fn group_mut(&mut self, group: u64) -> Option<&mut PartitionLog<S>> {
        let log = self.groups.get_mut(&group)?;
        self.active.insert(group);
        Some(log)
    }

    /// The highest op of `group` known durable under its durability mode.
    pub fn durable_op(&self, group: u64) -> Option<u64> {
        self.durable.get(&group).copied()
    }

    /// Bytes held by all prepare rings.
    pub fn ring_bytes(&self) -> usize {
        self.shared.ring_budget.used_bytes()
    }

    /// Bytes the batch cache holds, and what it did since open.
    pub fn batch_cache(&self) -> (usize, CacheCounters) {
        let cache = self.shared.cache.borrow();
        (cache.used_bytes(), cache.counters())
    }

    /// Ready space all groups hold ahead of their data (within `ready_budget_bytes`, except
    /// while a claim is settling).
    pub fn ready_space_bytes(&self) -> u64 {
        self.shared.ready_budget.held_bytes()
    }

    /// Write-buffer chunks allocated.
    pub fn chunks_allocated(&self) -> usize {
        self.shared.pool.borrow().allocated()
    }

    /// Creates one group: [`ShardStore::create_groups`] with one entry.
    pub async fn create_group(&mut self, group: u64, config: GroupConfig) -> Result<()> {
        self.create_groups(&[(group, config)]).await
    }

    /// Creates groups, durably and all at once: each one's directory, one sync of the shard
    /// directory and one superblock write for the lot, so a topic of 10,000 partitions costs
    /// one superblock write, not 10,000 growing ones. Nothing else is made: a group's files and
    /// its ready space come with its first write. Every entry is checked before anything is
    /// created; a failure part-way leaves directories the superblock does not name (a later
    /// create of the same group reuses them).
    pub async fn create_groups(&mut self, groups: &[(u64, GroupConfig)]) -> Result<()> {
        self.check_serving()?;
        if groups.is_empty() {
            return Ok(());
        }
        assert!(self.is_between_jobs(), "create_groups between jobs");
        for (index, &(group, config)) in groups.iter().enumerate() {
            config.validate()?;
            if config.record_size_bytes_max as usize > self.config.record_size_bytes_max {
                return Err(Error::Invalid(format!(
                    "record_size_bytes_max {} exceeds the shard's {}",
                    config.record_size_bytes_max, self.config.record_size_bytes_max
                )));
            }
            if config.record_size_bytes_max as usize + BLOCK_SIZE_BYTES
                > self.config.chunk_size_bytes
            {
                return Err(Error::Invalid(
                    "record_size_bytes_max does not fit a write-buffer chunk".into(),
                ));
            }
            if self.groups.contains_key(&group)
                || groups[..index].iter().any(|(earlier, _)| *earlier == group)
            {
                return Err(Error::Invalid(format!("group {group} exists")));
            }
        }
        if self.groups.len() + groups.len() > self.config.groups_max {
            return Err(Error::LimitReached(format!(
                "shard holds at most {} groups",
                self.config.groups_max
            )));
        }
        // A group of the same id may have been deleted with entries still in the journal: the
        // new log must never replay them.
        let journal_floor_seq =
            if cfg!(feature = "canary-journal-floor") { 0 } else { self.journal.last_seq() };
        let mut logs = Vec::with_capacity(groups.len());
        for &(group, config) in groups {
            let slot = GroupSlot { group, config, journal_floor_seq, ..GroupSlot::default() };
            let dir = group_dir(&self.dir, group);
            logs.push(
                PartitionLog::create(
                    self.storage.clone(),
                    Rc::clone(&self.shared),
                    dir,
                    slot,
                    config,
                )
                .await?,
            );
        }
        self.storage
            .sync_dir(&self.dir)
            .await
            .map_err(|e| Error::io(format!("syncing {}", self.dir.display()), e))?;
        let mut slots = self.slots();
        for log in &logs {
            slots.insert(log.group(), log.slot());
        }
        if let Err(error) = self.superblock.write(slots).await {
            return Err(self.fail(error));
        }
        for log in logs {
            self.set_durable(log.group(), 0);
            self.groups.insert(log.group(), log);
        }
        Ok(())
    }

    /// Deletes groups, durably and all at once: one superblock write without their slots (the
    /// commit point: from then on no open recovers them), then their directories' files and
    /// the directories. Their appends not yet written, their journal entries and the memory
    /// they held go with them. A stop after the commit point leaves directories the
    /// superblock does not name, which the next open removes; a group of the same id created
    /// later never replays the journal entries of this one ([`GroupSlot::journal_floor_seq`]).
    /// Unknown ids are refused before anything changes. After the commit point, a file that
    /// cannot be removed is reported as an error, the groups being gone all the same.
    pub async fn delete_groups(&mut self, groups: &[u64]) -> Result<()> {
        self.check_serving()?;
        if groups.is_empty() {
            return Ok(());
        }
        assert!(self.is_between_jobs(), "delete_groups between jobs");
        for &group in groups {
            self.log(group)?;
        }
        let mut groups = groups.to_vec();
        groups.sort_unstable();
        groups.dedup();
        let mut slots = self.slots();
        let mut logs = Vec::with_capacity(groups.len());
        for &group in &groups {
            let Some(log) = self.groups.remove(&group) else { continue };
            logs.push(log);
            slots.remove(&group);
            self.durable.remove(&group);
            self.durable_changed.remove(&group);
            self.damaged.remove(&group);
            self.active.remove(&group);
            self.slots_dirty.remove(&group);
            self.checkpoint_wanted.remove(&group);
            self.settle_blocked.remove(&group);
            self.journal.forget_group(group);
        }
        if let Err(error) = self.superblock.write(slots).await {
            return Err(self.fail(error));
        }
        // Their chunks, ready space and cached batches go back to the shard.
        drop(logs);
        let mut first_error = None;
        for &group in &groups {
            if let Err(error) = remove_group_dir(&self.storage, &group_dir(&self.dir, group)).await
            {
                first_error.get_or_insert(error);
            }
        }
        let synced = self
            .storage
            .sync_dir(&self.dir)
            .await
            .map_err(|e| Error::io(format!("syncing {}", self.dir.display()), e));
        match first_error {
            Some(error) => Err(error),
            None => synced,
        }
    }

    /// Changes `group`'s retention bounds (total size, age; 0: none): the next retention pass
    /// applies them, and the superblock keeps them from its next write on.
    pub fn set_retention(
        &mut self,
        group: u64,
        retention_bytes: u64,
        retention_ms: u64,
    ) -> Result<()> {
        let log = self.groups.get_mut(&group).ok_or_else(|| unknown(group))?;
        if log.config().retention_bytes == retention_bytes
            && log.config().retention_ms == retention_ms
        {
            return Ok(());
        }
        log.set_retention(retention_bytes, retention_ms);
        self.slots_dirty.insert(group);
        self.active.insert(group);
        Ok(())
    }

    /// What the next prepare of `group` must be.
    pub fn next(&self, group: u64) -> Result<ChainNext> {
        Ok(self.log(group)?.next())
    }

    /// Appends a prepare to `group` (memory only; durable after a flush reports it). For a
    /// `persisted` group the prepare also joins the journal's pending cycle.
    pub fn append(&mut self, group: u64, header: &Header, body: &[u8]) -> Result<()> {
        self.check_serving()?;
        let persisted = self.log(group)?.config().durability == Durability::Persisted;
        if persisted && !self.journal.has_room(header.size as usize) {
            for oldest in self.journal.oldest_groups(8) {
                self.checkpoint_wanted.insert(oldest);
            }
            return Err(Error::LimitReached("journal full until checkpoints release space".into()));
        }
        let log = self.groups.get_mut(&group).expect("checked by log()");
        match log.append(header, body) {
            Err(Error::LimitReached(reason))
                if reason == WRITE_BUFFER_FULL && self.release_pinned_chunks() =>
            {
                let log = self.groups.get_mut(&group).expect("checked by log()");
                log.append(header, body)?;
            }
            Err(Error::LimitReached(_))
                if self.take_back_ring_budget(group, header.size as usize) =>
            {
                let log = self.groups.get_mut(&group).expect("checked by log()");
                log.append(header, body)?;
            }
            result => result?,
        }
        self.active.insert(group);
        let log = self.groups.get_mut(&group).expect("checked by log()");
        if persisted {
            let op = prepare_of(header).op;
            let record = log.ring().by_op(op).expect("just appended").record.clone();
            if self.body_shift.len_bytes() != header.body_size() {
                self.body_shift = checksum::Shift::new(header.body_size());
            }
            let checksum = self
                .body_shift
                .concat(checksum::crc32c(&record[..HEADER_SIZE]), header.checksum_body);
            self.journal.add(record, checksum, group, op);
        }
        Ok(())
    }

    /// Appends a prepare received from the primary, then any held prepares it lets continue;
    /// one that arrives early is held. Returns the ops appended by this call. Held prepares that
    /// the journal has no room for stay held (backpressure), never appended unjournaled.
    pub fn append_received(
        &mut self,
        group: u64,
        header: &Header,
        body: &[u8],
    ) -> Result<Vec<u64>> {
        self.check_serving()?;
        let next_op = self.log(group)?.next().op;
        let op = header.as_prepare().ok_or_else(|| Error::Invalid("not a prepare".into()))?.op;
        if op != next_op {
            self.groups.get_mut(&group).expect("checked by log()").hold(header, body)?;
            return Ok(Vec::new());
        }
        self.append(group, header, body)?;
        let mut appended = vec![op];
        loop {
            let log = self.groups.get_mut(&group).expect("checked by log()");
            let Some((held_header, held_body)) = log.take_held_next() else { break };
            match self.append(group, &held_header, &held_body) {
                Ok(()) => appended.push(prepare_of(&held_header).op),
                Err(Error::LimitReached(_) | Error::StorageFull) => {
                    let log = self.groups.get_mut(&group).expect("checked by log()");
                    log.return_held(held_header, held_body);
                    break;
                }
                // A held prepare that does not chain (another primary's) is dropped.
                Err(Error::Invalid(_)) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(appended)
    }

    /// Whether `group`'s slot, as last changed ([`ShardStore::set_views`]), is in the
    /// superblock: no change waits for a checkpoint job, and none is in the job in flight.
    pub fn slot_durable(&self, group: u64) -> bool {
        !self.slots_dirty.contains(&group) && !self.slots_in_flight.contains(&group)
    }

    /// Records a group's view, log_view and the head op that log view began with
    /// ([`GroupSlot::log_view_head_op`]); they are durable once the next checkpoint job
    /// finishes (it writes the superblock). Nothing revealing them may leave before.
    pub fn set_views(
        &mut self,
        group: u64,
        view: u32,
        log_view: u32,
        log_view_head_op: Option<u64>,
    ) -> Result<()> {
        let log = self.groups.get_mut(&group).ok_or_else(|| unknown(group))?;
        log.set_views(view, log_view, log_view_head_op);
        self.slots_dirty.insert(group);
        Ok(())
    }

    /// Asks the next flush to announce the newest synced journal cycle with a marker entry when
    /// nothing else will (the node layer calls this when a shard goes idle), and the newest
    /// direct sync of each group with a sync mark. Until a later synced entry (or mark)
    /// announces a cycle, latent damage to it is indistinguishable from a torn write; the
    /// marker closes that window at the cost of one small write and sync per idle period (per
    /// direct group), never on a busy shard.
    pub fn request_journal_marker(&mut self) {
        self.marker_wanted = true;
    }

    /// The write-buffer pool ran dry: the chunks groups keep between flushes go back (those
    /// with nothing unwritten), and while memory handed back is still held by views, the batch
    /// cache, then the idle groups' rings (then, if that is not enough, every ring) drop what
    /// is on the segments, which readers find there. True when there was memory to free.
    fn release_pinned_chunks(&mut self) -> bool {
        let mut given_back = false;
        for id in &self.active {
            if let Some(log) = self.groups.get_mut(id) {
                given_back |= log.give_back_idle_chunk();
            }
        }
        if !self.shared.pool.borrow_mut().has_pinned() {
            return given_back;
        }
        // The batch cache's write views are the cheapest to give up: they are on disk, and
        // only consumers far behind want them.
        self.shared.cache.borrow_mut().release_written();
        if !self.shared.pool.borrow_mut().has_pinned() {
            return true;
        }
        for (id, log) in &mut self.groups {
            if !self.active.contains(id) {
                log.release_written_ring();
            }
        }
        if self.shared.pool.borrow_mut().has_pinned() {
            for log in self.groups.values_mut() {
                log.release_written_ring();
            }
        }
        true
    }

    /// The shard's ring budget is too full for `group`'s append of `size_bytes`, and its own
    /// ring has no written prepares left to evict: the other rings give back theirs, whole,
    /// taking turns from where the last call stopped, until the append fits. Without this the
    /// rings of the groups that wrote first kept the budget, since only a ring's own appends
    /// evict from it, and a group whose ring was empty got `LimitReached` for good. Only
    /// written prepares are taken (readers find them on their segments and in the batch
    /// cache); unwritten ones stay backpressure. True when any room was given back.
    fn take_back_ring_budget(&mut self, group: u64, size_bytes: usize) -> bool {
        if !self.shared.ring_budget.over(size_bytes) || self.ring_take_back_futile {
            return false;
        }
        self.counters.ring_take_back_scans += 1;
        let turn = self.ring_take_back_turn;
        let mut given_back_bytes = 0;
        let from_turn = (Bound::Included(turn), Bound::Unbounded);
        let before_turn = (Bound::Unbounded, Bound::Excluded(turn));
        'turns: for range in [from_turn, before_turn] {
            for (&id, log) in self.groups.range_mut(range) {
                if id == group {
                    continue;
                }
                given_back_bytes += log.give_back_written_ring();
                if !self.shared.ring_budget.over(size_bytes) {
                    self.ring_take_back_turn = id + 1;
                    break 'turns;
                }
            }
        }
        self.counters.ring_bytes_taken_back += given_back_bytes as u64;
        self.ring_take_back_futile = given_back_bytes == 0;
        given_back_bytes > 0
    }

    /// Whether a flush has anything to do.
    pub fn has_pending(&self) -> bool {
        (self.marker_wanted
            && (self.journal.needs_marker() || self.touched().any(|(_, log)| log.mark_due())))
            || self.journal.pending_entries() > 0
            || self.touched().any(|(id, log)| log.wants_flush(self.checkpoint_wanted.contains(&id)))
    }

    /// The groups that may have work: the active ones and those asked to checkpoint.
    fn touched(&self) -> impl Iterator<Item = (u64, &PartitionLog<S>)> {
        let wanted = self.checkpoint_wanted.iter().filter(|id| !self.active.contains(id));
        self.active.iter().chain(wanted).filter_map(|&id| self.groups.get(&id).map(|log| (id, log)))
    }

    /// Whether a group has nothing for a flush, a checkpoint, a zero step or a retry to do, and
    /// everything it appended is durable: it may leave the active set until it is touched again.
    fn is_idle(&self, id: u64, log: &PartitionLog<S>) -> bool {
        let write_all = self.writes_all(id, log);
        self.durable.get(&id).is_some_and(|&durable| durable >= log.head_op())
            && !log.has_unwritten()
            && !log.is_storage_full()
            && !self.checkpoint_wanted.contains(&id)
            && !self.settle_blocked.contains(&id)
            && !log.wants_flush(write_all)
            && !self.checkpoint_due(id, log)
            && !log.mark_due()
            && !log.zero_step_due()
    }

    /// Whether a group's next job writes everything it holds, whatever its batching: it was
    /// asked to checkpoint, or it appended twice its checkpoint interval since its last (a
    /// checkpoint records only what is written; a group past its interval alone checkpoints
    /// what its batches wrote, so groups whose producers run in step do not all write
    /// everything in one cycle).
    fn writes_all(&self, id: u64, log: &PartitionLog<S>) -> bool {
        self.checkpoint_wanted.contains(&id)
            || log.bytes_since_checkpoint() >= 2 * self.config.checkpoint_interval_bytes
    }

    /// Starts a flush cycle, possibly beside cycles still in flight (None when nothing is
    /// pending that can start now, or `flush_cycles_in_flight_max` cycles are in flight). A
    /// group whose job cannot run beside its jobs in flight, and the journal's waiting prepares
    /// while `journal_cycles_in_flight_max` journal cycles are in flight, wait for a later
    /// cycle. Cycles must be finished in the order they began.
    ///
    /// The `persisted` groups waiting in the journal take the journal or the direct path
    /// ([`ShardConfig::persisted_path`]); a group that would go direct but has a job in flight
    /// waits for a later cycle rather than pay for both.
    pub fn begin_flush(&mut self) -> Option<ShardFlush<S>> {
        if self.flushes_in_flight >= self.config.flush_cycles_in_flight_max.max(1)
            || self.failed.is_some()
            || !self.has_pending()
        {
            return None;
        }
        let (direct, deferred, form) = self.persisted_paths();
        // The idle request that asks the journal for a marker asks direct groups for a mark.
        let marks = self.marker_wanted;
        let put_off = self.segment_writes_put_off(&direct, &deferred, marks);
        let mut jobs = Vec::new();
        let mut group_targets = Vec::new();
        // Groups not touched since they were last idle have nothing new to write or report.
        let touched: Vec<u64> = self.touched().map(|(id, _)| id).collect();
        for id in touched {
            let write_all = self.writes_all(id, &self.groups[&id]);
            let log = self.groups.get_mut(&id).expect("touched groups exist");
            // An idle group whose newest direct sync no mark announces yet gets a mark job.
            let direct_now = direct.contains(&id) || (marks && log.mark_due());
            log.note_flush_cycle();
            let job = if deferred.contains(&id) {
                None
            } else {
                log.begin_flush_deferring(write_all, direct_now, put_off.contains(&id))
            };
            // Its prepares leave the journal: the job is what makes them durable.
            assert!(job.is_some() || !direct_now, "a direct group always gets its job");
            if let Some(mut job) = job {
                if direct_now && form == PersistedForm::Filesystem {
                    job.leave_sync_to_filesystem();
                }
                jobs.push(job);
            }
            group_targets.push((id, log.head_op()));
        }
        // A marker waits for every cycle in flight: it announces what they made durable.
        if !self.journal.cycle_in_flight()
            && std::mem::take(&mut self.marker_wanted)
            && self.journal.needs_marker()
        {
            self.journal.add_marker();
        }
        let journal_busy = !self.journal.can_begin_cycle();
        let (journal, journaled) = self.journal.begin_cycle(|group| {
            if direct.contains(&group) {
                Take::Drop
            } else if journal_busy || deferred.contains(&group) {
                Take::Keep
            } else {
                Take::Journal
            }
        });
        if jobs.is_empty() && journal.is_none() {
            return None;
        }
        let complete = self.journal.pending_entries() == 0
            && self.touched().all(|(_, log)| {
                log.config().durability == Durability::Persisted
                    || log.faulty_reason().is_some()
                    || !log.has_unsubmitted()
            });
        let seq = self.next_flush_seq;
        self.next_flush_seq += 1;
        self.flushes_in_flight += 1;
        let filesystem_sync =
            (form == PersistedForm::Filesystem).then(|| (self.storage.clone(), self.dir.clone()));
        Some(ShardFlush { seq, complete, jobs, journal, journaled, group_targets, filesystem_sync })
    }

    /// The `persisted` groups whose segment write, due by batch alone
    /// ([`PartitionLog::deferrable_segment_write_bytes`]), waits for a later cycle. Taking turns
    /// from where the last cycle stopped, a cycle takes such writes up to the bytes waiting for
    /// the journal and puts off the rest; a cycle that begins with none in flight takes at
    /// least one, so that put-off writes go out once the shard is otherwise idle. (Not every
    /// cycle takes one: the node layer asks for cycles until none begins, and each ask would
    /// then take one more of the writes put off, all in the same round.) Groups that gather
    /// their batches in step (producers at equal rates) then write over the following cycles
    /// instead of all in one, which would hold that cycle's acknowledgements until all of them
    /// had written (docs/benchmarks.md, "Segment writes in batches, spread over the cycles",
    /// and "The 64-partition benchmark driven as the node layer drives it").
    fn segment_writes_put_off(
        &mut self,
        direct: &BTreeSet<u64>,
        deferred: &BTreeSet<u64>,
        marks: bool,
    ) -> BTreeSet<u64> {
        let mut due: Vec<(u64, u64)> = self
            .touched()
            // Groups that write everything this cycle anyway are not candidates.
            .filter(|&(id, log)| {
                !(direct.contains(&id)
                    || deferred.contains(&id)
                    || marks && log.mark_due()
                    || self.writes_all(id, log))
            })
            .filter_map(|(id, log)| log.deferrable_segment_write_bytes().map(|bytes| (id, bytes)))
            .collect();
        // The groups from the turn on first, then those before it.
        due.sort_unstable_by_key(|&(id, _)| (id < self.segment_write_turn, id));
        let mut budget_bytes = self.journal.pending_bytes() as u64;
        let mut put_off = BTreeSet::new();
        for (index, (id, bytes)) in due.into_iter().enumerate() {
            if (index == 0 && self.flushes_in_flight == 0) || budget_bytes > 0 {
                budget_bytes = budget_bytes.saturating_sub(bytes);
                self.segment_write_turn = id + 1;
            } else {
                put_off.insert(id);
            }
        }
        put_off
    }

    /// Which of the `persisted` groups waiting in the journal take the direct path this cycle,
    /// which wait, and the form the cycle takes: with a direct form chosen, a group that can
    /// take it does, one with a job in flight waits for it (its mark slots are written one job
    /// at a time), and any other (a faulty one, one out of space, one whose segment has no
    /// sync-mark trailer) takes the journal. Idle mark jobs join the cycle's form (in a journal
    /// cycle, they sync their own files).
    fn persisted_paths(&self) -> (BTreeSet<u64>, BTreeSet<u64>, PersistedForm) {
        let mut direct = BTreeSet::new();
        let mut deferred = BTreeSet::new();
        let waiting = self.journal.waiting_groups();
        let form = match self.config.persisted_path {
            PersistedPath::Journal => PersistedForm::Journal,
            PersistedPath::Direct => PersistedForm::Direct,
            PersistedPath::Filesystem => PersistedForm::Filesystem,
            PersistedPath::Auto => {
                let bytes = waiting.values().map(|&bytes| bytes as u64).sum();
                let costs = SyncCosts {
                    sync_cost_bytes: self.config.sync_cost_bytes,
                    filesystem_sync_cost_bytes: self
                        .filesystem_sync
                        .then_some(self.config.filesystem_sync_cost_bytes),
                };
                cheapest_form(waiting.len(), bytes, costs)
            }
        };
        if form == PersistedForm::Journal {
            return (direct, deferred, form);
        }
        for &group in waiting.keys() {
            let Some(log) = self.groups.get(&group) else { continue };
            if log.can_flush_direct() {
                direct.insert(group);
            } else if log.has_flush_in_flight() && log.faulty_reason().is_none() {
                deferred.insert(group);
            }
        }
        (direct, deferred, form)
    }

    /// Whether a checkpoint job has anything to do: a group past its checkpoint interval or
    /// asked to checkpoint with written data to record, or views to make durable.
    pub fn has_checkpoint_pending(&self) -> bool {
        !self.slots_dirty.is_empty() || self.touched().any(|(id, log)| self.checkpoint_due(id, log))
    }

    /// Whether a group's checkpoint starts a checkpoint job.
    fn checkpoint_due(&self, id: u64, log: &PartitionLog<S>) -> bool {
        self.checkpoint_records(id, log, self.config.checkpoint_interval_bytes)
    }

    /// Whether a checkpoint job records a group's checkpoint: it is due, or past half of its
    /// interval. Groups that append at similar rates checkpoint at different points (their
    /// batches reach the segment in different cycles); gathered into one job they share its
    /// superblock write, which a checkpoint of each alone would repeat for every group.
    fn checkpoint_joins(&self, id: u64, log: &PartitionLog<S>) -> bool {
        self.checkpoint_records(id, log, self.config.checkpoint_interval_bytes.div_ceil(2))
    }

    fn checkpoint_records(&self, id: u64, log: &PartitionLog<S>, interval_bytes: u64) -> bool {
        (self.checkpoint_wanted.contains(&id) || log.bytes_since_checkpoint() >= interval_bytes)
            && log.has_checkpoint_candidate()
            && !self.settle_blocked.contains(&id)
    }

    /// Whether the disk was found full: some group refuses appends that need more space than it
    /// has ready, or waits to write what it holds, or cannot settle a rolled segment.
    pub fn is_storage_full(&self) -> bool {
        !self.settle_blocked.is_empty() || self.touched().any(|(_, log)| log.is_storage_full())
    }

    /// How many groups refuse appends for lack of disk space (their writes of what they hold
    /// go on). Unlike [`ShardStore::is_storage_full`] it ignores checkpoints waiting for room, which
    /// come and go with every retry.
    pub fn storage_full_group_count(&self) -> usize {
        self.touched().filter(|(_, log)| log.is_storage_full()).count()
    }

    /// The shard's once-per-tick work (the node layer calls it once per tick).
    ///
    /// It lets the next flush cycle and checkpoint job try again what a full disk refused: each
    /// storage-full group's reservation, and the index files of rolled segments. A full disk is
    /// probed at that pace, never by every cycle, and once space is freed writes resume without
    /// anyone's help.
    ///
    /// Groups found idle leave the active set here and hand their write chunk back to the pool:
    /// a group keeps its chunk between flushes while it writes, until the first tick that finds
    /// it idle.
    pub fn on_tick(&mut self) {
        let touched: Vec<u64> = self.touched().map(|(id, _)| id).collect();
        for id in touched {
            let log = &self.groups[&id];
            if self.is_idle(id, log) {
                self.active.remove(&id);
                let log = self.groups.get_mut(&id).expect("touched groups exist");
                log.reset_pace();
                log.give_back_idle_chunk();
            } else {
                self.groups.get_mut(&id).expect("touched groups exist").retry_storage_full();
            }
        }
        self.settle_blocked.clear();
    }

    /// Starts a checkpoint job (None when nothing is due or one is in flight). It may run
    /// beside a flush cycle.
    pub fn begin_checkpoint(&mut self) -> Option<CheckpointJob<S>> {
        if self.checkpoint_in_flight || self.failed.is_some() || !self.has_checkpoint_pending() {
            return None;
        }
        let mut syncs = Vec::new();
        let mut settles = Vec::new();
        let mut checkpoints = Vec::new();
        let mut slots = self.slots();
        for (id, log) in self.touched() {
            if !self.checkpoint_joins(id, log) {
                continue;
            }
            let candidate = log.checkpoint_candidate().expect("due");
            if let Some(file) = candidate.file {
                syncs.push((id, file));
            }
            settles.extend(candidate.settle);
            if let Some(slot) = slots.get_mut(&id) {
                slot.checkpoint = candidate.checkpoint;
            }
            checkpoints.push((id, candidate.checkpoint, candidate.appended_bytes));
        }
        let superblock = match self.superblock.begin_write(slots) {
            Ok(write) => write,
            Err(error) => {
                self.failed = Some(error.to_string());
                return None;
            }
        };
        for (id, _, _) in &checkpoints {
            self.checkpoint_wanted.remove(id);
        }
        self.slots_in_flight = std::mem::take(&mut self.slots_dirty);
        self.checkpoint_in_flight = true;
        Some(CheckpointJob { syncs, settles, checkpoints, superblock })
    }

    /// Applies a finished checkpoint job: the checkpoints it recorded release journal space.
    ///
    /// `StorageFull` when an index file found no room: nothing is recorded, no group fails, and
    /// the job's groups checkpoint again — the one that found no room after the next
    /// [`ShardStore::on_tick`].
    pub fn finish_checkpoint(&mut self, done: CheckpointDone<S>) -> Result<()> {
        assert!(self.checkpoint_in_flight, "finish without a checkpoint in flight");
        self.checkpoint_in_flight = false;
        let CheckpointDone { job, failed_sync, settle_syncs, superblock } = done;
        let slots_written = std::mem::take(&mut self.slots_in_flight);
        self.counters.segment_syncs += job.syncs.len() as u64 + settle_syncs;
        if !failed_sync.is_empty() {
            let mut first = None;
            for (group, error) in failed_sync {
                let error = if matches!(error, Error::StorageFull) {
                    self.settle_blocked.insert(group);
                    error
                } else {
                    // A failed sync is that group's I/O failure: it stops, the others go on.
                    self.groups.get_mut(&group).expect("job groups exist").fail_io(error)
                };
                // A real failure is what the caller must hear of, before a full disk.
                if first.as_ref().is_none_or(|first| matches!(first, Error::StorageFull)) {
                    first = Some(error);
                }
            }
            for (id, _, _) in &job.checkpoints {
                self.slots_dirty.insert(*id);
                self.checkpoint_wanted.insert(*id);
            }
            // The superblock was not written: every slot it carried (views too, not only the
            // checkpoints') must still reach it. Canary (DESIGN.md §7): forget them, so views
            // announced durable are lost at the next restart.
            if !cfg!(feature = "canary-views-dropped-on-full") {
                let live = slots_written.into_iter().filter(|id| self.groups.contains_key(id));
                self.slots_dirty.extend(live);
            }
            return Err(first.expect("a failure"));
        }
        if let Err(error) = superblock {
            return Err(self.fail(error));
        }
        self.superblock.finish_write(job.superblock);
        for settle in &job.settles {
            if let Some(log) = self.groups.get_mut(&settle.group()) {
                log.finish_settle(&settle.segment_base_offsets());
            }
        }
        for (group, checkpoint, appended) in job.checkpoints {
            if let Some(log) = self.groups.get_mut(&group) {
                log.set_checkpoint(checkpoint, appended);
                self.journal.release(group, checkpoint.op);
                self.counters.checkpoints += 1;
            }
        }
        Ok(())
    }

    /// Starts up to [`ZERO_STEPS_PER_FILL_MAX`] of the zero steps that are due, taking turns
    /// from where the last zero fill stopped (None when none is due, or a zero fill is in
    /// flight). It may run beside flush cycles and a checkpoint.
    pub fn begin_zero_fill(&mut self) -> Option<ZeroFillJob<S>> {
        if self.zero_fill_in_flight || self.failed.is_some() {
            return None;
        }
        let mut touched: Vec<u64> = self.touched().map(|(id, _)| id).collect();
        // The groups from the turn on first, then those before it; a group whose step is not
        // due begins none, and no group past the bound is asked.
        touched.sort_unstable_by_key(|&id| (id < self.zero_fill_turn, id));
        let steps: Vec<ZeroStep<S>> = touched
            .into_iter()
            .filter_map(|id| self.groups.get_mut(&id).and_then(PartitionLog::begin_zero_step))
            .take(ZERO_STEPS_PER_FILL_MAX)
            .collect();
        let last = steps.last()?;
        self.zero_fill_turn = last.group() + 1;
        self.zero_fill_in_flight = true;
        Some(ZeroFillJob { steps })
    }

    /// Applies a finished zero fill. A step that failed is its group's failure (in the report's
    /// `failed`; the group is fail-stop) or found the disk full (`storage_full`: the group
    /// refuses appends that need more space than is ready until a retry); no durable position
    /// changes.
    pub fn finish_zero_fill(&mut self, done: ZeroFillDone<S>) -> FlushReport {
        assert!(self.zero_fill_in_flight, "finish without a zero fill in flight");
        self.zero_fill_in_flight = false;
        let mut report = FlushReport::default();
        for step in done.steps {
            let group = step.group();
            let bytes = step.bytes_written();
            let log = self.groups.get_mut(&group).expect("groups change only between jobs");
            match log.finish_zero_step(step) {
                Ok(()) => {
                    self.counters.zero_steps += 1;
                    self.counters.segment_bytes_written += bytes;
                }
                Err(Error::StorageFull) => {
                    // The group may have left the active set while its step ran (nothing else
                    // was due): only active groups are retried, and a log left full with no
                    // retry would refuse every append for good.
                    self.active.insert(group);
                    report.storage_full = true;
                }
                Err(error) => report.failed.push((group, error.to_string())),
            }
        }
        report
    }

    /// Whether no flush cycle, checkpoint or zero fill is in flight: what changes a log's files
    /// or its set of groups (creating, deleting, truncating, cutting, installing, closing) may
    /// run only then.
    fn is_between_jobs(&self) -> bool {
        self.flushes_in_flight == 0 && !self.checkpoint_in_flight && !self.zero_fill_in_flight
    }

    /// Applies a finished flush cycle and reports which groups' appends became durable.
    pub fn finish_flush(&mut self, done: ShardFlushDone<S>) -> FlushReport {
        assert!(self.flushes_in_flight > 0, "finish without a flush in flight");
        assert_eq!(
            done.seq,
            self.next_flush_seq - self.flushes_in_flight as u64,
            "flush cycles finish in the order they began"
        );
        self.flushes_in_flight -= 1;
        // Its jobs may have written prepares other rings can give back.
        self.ring_take_back_futile = false;
        let mut report = FlushReport::default();
        let mut synced = BTreeMap::new();
        if done.filesystem_synced {
            self.counters.filesystem_syncs += 1;
        }
        for job in done.jobs {
            let group = job.group();
            // What the job found (a full disk, a roll to checkpoint) is for the next cycles.
            self.active.insert(group);
            let log = self.groups.get_mut(&group).expect("jobs come from groups");
            match log.finish_flush(job) {
                Ok(outcome) => {
                    self.counters.segment_bytes_written += outcome.bytes_written;
                    if outcome.sealed {
                        self.checkpoint_wanted.insert(group);
                    }
                    if outcome.synced {
                        self.counters.direct_syncs += 1;
                        synced.insert(group, outcome.written_op);
                    }
                }
                Err(Error::StorageFull) => report.storage_full = true,
                Err(error) => report.failed.push((group, error.to_string())),
            }
        }
        let journal_ok = match done.journal {
            Some((cycle, result)) => {
                self.counters.journal_bytes_written += cycle.len_bytes() as u64;
                match result {
                    // A cycle after a failed one is not durable: the failed one's entries are
                    // missing below it.
                    Ok(()) if self.failed.is_none() => {
                        self.counters.journal_syncs += 1;
                        self.journal.finish_cycle(&cycle);
                        true
                    }
                    // The canary counts it anyway.
                    Ok(()) => cfg!(feature = "canary-journal-counts-after-failure"),
                    Err(error) => {
                        // The journal is shared: its failure stops the whole shard.
                        self.failed = Some(error.to_string());
                        false
                    }
                }
            }
            None => true,
        };
        // Durable positions: replicated once written, persisted once the journal or (the
        // direct path) the group's own segment sync made them so.
        let journaled: BTreeMap<u64, u64> =
            if journal_ok { done.journaled.iter().copied().collect() } else { BTreeMap::new() };
        for (group, target) in done.group_targets {
            let Some(log) = self.groups.get(&group) else { continue };
            let durable_now = match log.config().durability {
                Durability::Replicated => log.written_op().min(target),
                Durability::Persisted => {
                    let by_journal = journaled.get(&group).copied().unwrap_or(0);
                    let by_segment = synced.get(&group).copied().unwrap_or(0);
                    by_journal.max(by_segment).min(log.head_op()).max(self.durable[&group])
                }
            };
            let entry = self.durable.entry(group).or_insert(0);
            if durable_now > *entry && log.faulty_reason().is_none() {
                *entry = durable_now;
                self.durable_changed.insert(group);
                report.durable.push((group, durable_now));
            }
        }
        self.counters.flushes += 1;
        report
    }

    /// Runs one whole flush cycle (begin, run, finish); returns an empty report when nothing
    /// was pending.
    ///
    /// A checkpoint job and a zero fill that are due run after the cycle (the node layer runs
    /// them side by side instead). What a full disk refused is tried again only after
    /// [`ShardStore::on_tick`]; a full disk is in the report (`storage_full`, or
    /// [`ShardStore::is_storage_full`]), never an error.
    pub async fn flush(&mut self) -> Result<FlushReport> {
        self.check_serving()?;
        let mut report = FlushReport::default();
        if let Some(flush) = self.begin_flush() {
            let done = flush.run().await;
            report = self.finish_flush(done);
            self.check_serving()?;
        }
        if let Some(checkpoint) = self.begin_checkpoint() {
            let done = checkpoint.run().await;
            match self.finish_checkpoint(done) {
                Ok(()) | Err(Error::StorageFull) => {}
                Err(error) => return Err(error),
            }
        }
        if let Some(zero_fill) = self.begin_zero_fill() {
            let done = zero_fill.run().await;
            let zero_report = self.finish_zero_fill(done);
            report.failed.extend(zero_report.failed);
            report.storage_full |= zero_report.storage_full;
        }
        Ok(report)
    }

    /// Truncates `group` above `op` for view `view` (durably: the fence reaches the superblock
    /// before this returns). Flushes first. Call with no flush in flight.
    pub async fn truncate_after(&mut self, group: u64, op: u64, view: u32) -> Result<()> {
        self.check_serving()?;
        assert!(self.is_between_jobs(), "truncate between jobs");
        // Everything appended must be on the segment first (a checkpoint writes it all). On a
        // full disk that may not be possible yet: the caller retries later.
        while self.groups.get(&group).ok_or_else(|| unknown(group))?.has_unwritten() {
            self.checkpoint_wanted.insert(group);
            let written = self.groups[&group].written_op();
            let report = self.flush().await?;
            let log = &self.groups[&group];
            if report.storage_full || (log.is_storage_full() && log.written_op() == written) {
                return Err(Error::StorageFull);
            }
        }
        self.write_pending_journal().await?;
        let log = self.groups.get_mut(&group).expect("checked");
        let journal_seq = self.journal.last_seq();
        if log.begin_truncate(op, view, journal_seq).await?.is_none() {
            return Ok(());
        }
        let durable = self.durable.get(&group).copied().unwrap_or(0).min(op);
        self.set_durable(group, durable);
        // The fence reaches the superblock before any byte of the log is cut.
        self.write_slots().await?;
        self.active.insert(group);
        self.groups.get_mut(&group).expect("checked").finish_truncate().await?;
        // The cut is durable: from now on segment records above the fence are the new suffix,
        // whatever view they were prepared in (a view change may re-adopt an older op).
        self.groups.get_mut(&group).expect("checked").finish_fence();
        self.write_slots().await?;
        self.journal.release_above(group, op);
        Ok(())
    }

    /// Protocol-aware recovery of a damaged group (DESIGN.md §3), which only an owner whose
    /// group has peers to repair from may ask for: recovers the group again with
    /// [`PartitionLog::recover_cut`] — the chain cut at its first invalid record, everything
    /// past it faulty rather than absent — and makes the cut durable (the superblock holds the
    /// lowered checkpoint and the damage marker) before it returns. A group of one must never
    /// call it: with nobody to repair from, damage refuses service instead (DESIGN.md §6).
    /// Call with no flush or checkpoint in flight; what the group had appended but not written
    /// is dropped (it lies past the cut, in the faulty suffix).
    pub async fn cut_damaged(&mut self, group: u64) -> Result<GroupRecovery> {
        self.check_serving()?;
        assert!(self.is_between_jobs(), "cut between jobs");
        let old = self.groups.remove(&group).ok_or_else(|| unknown(group))?;
        let (slot, head_op) = (old.slot(), old.head_op());
        let (storage, dir) = (self.storage.clone(), group_dir(&self.dir, group));
        // Dropped first: it returns its ring budget and write chunks.
        drop(old);
        let shared = Rc::clone(&self.shared);
        let (log, recovery) =
            PartitionLog::recover_cut(storage, shared, dir, slot, slot.config, head_op).await?;
        self.set_durable(group, log.head_op());
        self.note_damage(group, &log);
        self.checkpoint_wanted.insert(group);
        self.active.insert(group);
        let head_op = log.head_op();
        self.groups.insert(group, log);
        self.write_slots().await?;
        self.slots_dirty.remove(&group);
        self.journal.release_above(group, head_op);
        Ok(recovery)
    }

    /// Holds every op past `group`'s head faulty, durably (the damage marker, as a cut leaves
    /// it) before it returns where the faulty suffix begins, when recovery found the group's
    /// torn window ending in a damaged record past its head ([`GroupRecovery::torn_record_op`]).
    /// That record may be the newest synced one, hit by latent damage before a later sync mark
    /// announced it: its replica may have acknowledged it, so it must never nack it, nor, after
    /// another restart finds only zeros there, forget that it may have. Like
    /// [`ShardStore::cut_damaged`], only for a group with peers, and before its replica starts.
    pub async fn hold_torn_tail_faulty(&mut self, group: u64) -> Result<u64> {
        self.check_serving()?;
        let log = self.groups.get_mut(&group).ok_or_else(|| unknown(group))?;
        let from = log.mark_damaged_past_head();
        self.damaged.insert(group);
        self.write_slots().await?;
        self.slots_dirty.remove(&group);
        Ok(from)
    }

    /// Writes every group's slot to the superblock, durably; a failure fails the shard.
    async fn write_slots(&mut self) -> Result<()> {
        let slots = self.slots();
        if let Err(error) = self.superblock.write(slots).await {
            return Err(self.fail(error));
        }
        Ok(())
    }

    /// `group`'s damage marker ([`GroupSlot::damaged_from`]) as a crash would find it: the
    /// group's own, or, while its clear is not yet in a durable superblock, the one the
    /// superblock still holds (a restart brings that one back). None when neither is set.
    pub fn damage_marker(&self, group: u64) -> Option<u64> {
        let log = self.groups.get(&group)?;
        let durable =
            self.superblock.state().groups.get(&group).map_or(0, |slot| slot.damaged_from);
        [log.damaged_from(), durable].into_iter().find(|&op| op != 0)
    }

    /// Forgets `group`'s damage marker (its replica holds every op again, durably); the next
    /// checkpoint job writes the slot, and until it has, [`ShardStore::damage_marker`] still
    /// reports the marker.
    pub fn clear_damaged_from(&mut self, group: u64) {
        if let Some(log) = self.groups.get_mut(&group)
            && log.clear_damaged_from()
        {
            self.slots_dirty.insert(group);
        }
        self.damaged.remove(&group);
    }

    /// The groups whose log holds a damage marker, in id order.
    pub fn damaged_groups(&self) -> impl Iterator<Item = u64> + '_ {
        debug_assert!(
            self.groups
                .iter()
                .all(|(id, log)| (log.damaged_from() != 0) == self.damaged.contains(id)),
            "the damaged set went out of step with the logs"
        );
        self.damaged.iter().copied()
    }

    /// Takes the groups whose durable op ([`ShardStore::durable_op`]) changed since the last
    /// call, in id order.
    pub fn take_durable_changed(&mut self) -> BTreeSet<u64> {
        std::mem::take(&mut self.durable_changed)
    }

    fn set_durable(&mut self, group: u64, op: u64) {
        self.durable.insert(group, op);
        self.durable_changed.insert(group);
    }

    /// Records whether `log` (about to become `group`'s) holds a damage marker.
    fn note_damage(&mut self, group: u64, log: &PartitionLog<S>) {
        if log.damaged_from() != 0 {
            self.damaged.insert(group);
        } else {
            self.damaged.remove(&group);
        }
    }

    /// Replaces `group`'s log by one that begins at a peer's op S (state transfer, DESIGN.md §4):
    /// `first` and `body` are the prepare of op S as the peer holds it (the caller checked it
    /// against the header checksum the peer named) and `state` the peer's replicated state as
    /// of S. Once it returns, durably, the log holds S alone, as a log whose beginning
    /// retention removed: head and first op S, next offset `state.end_offset`, next parent
    /// `first.checksum_header`; later ops arrive by [`ShardStore::append_received`]. The state is
    /// kept as the group's `transfer-state` ([`crate::state::load_transfer_state`]); the
    /// owner's own `state` snapshot is left alone. Held prepares, the ring and anything
    /// appended but not yet written are dropped with the old log.
    ///
    /// Refused with [`Error::Invalid`], nothing changed: an unknown group, a record that fails
    /// the standalone checks (checksums, cluster, group, size bound) or whose body is not
    /// `size` − 256 bytes, a state whose op is not S or whose end offset is not the one after
    /// S's records, a state over its size bound, and an S at or below the log's head (a
    /// transfer only moves a log forward, so no journal entry of the old log lies above S).
    ///
    /// Crash safety: the new segment and state are staged beside the live files under names
    /// recovery does not read, and synced; the superblock write that names the new checkpoint
    /// (op S at byte 0 of the new segment), a fence killing every journal entry written so far
    /// above S, and the *transfer pending* flag is the commit point. A crash before it leaves
    /// the old log, and open removes the staged leftovers; after it, open rolls the install
    /// forward (removes the old log's files, renames the staged ones into place; idempotent, so
    /// a crash during it only repeats it) before recovering the group. The second superblock
    /// write, clearing the flag, is durable before this returns: a roll-forward once appends
    /// have begun would remove their segments. A failure before the commit point is returned
    /// with the shard still serving (no room for the staged files is [`Error::StorageFull`]);
    /// after it, the shard stops (fail-stop) and reopening finishes the install. Call with no
    /// flush or checkpoint in flight.
    pub async fn install_transfer(
        &mut self,
        group: u64,
        first: &Header,
        body: &[u8],
        state: &GroupState,
    ) -> Result<()> {
        self.check_serving()?;
        assert!(self.is_between_jobs(), "install a transfer between jobs");
        let config = *self.log(group)?.config();
        let (record, header) = self.check_transfer(group, first, body, state)?;
        let prepare = *prepare_of(&header);
        let state_file = bytes::Bytes::from(state.encode()?);
        let dir = group_dir(&self.dir, group);
        let base = prepare.base_offset;

        self.write_pending_journal().await?;
        let old = self.groups[&group].slot();

        // 1. Stage beside the live log; nothing the group depends on changes.
        if cfg!(feature = "canary-transfer-unstaged") {
            // Canary (DESIGN.md §7): the old log is replaced in place before the commit point.
            transfer::stage_unstaged(&self.storage, &dir, &record, base, state_file).await?;
        } else {
            transfer::stage(&self.storage, &dir, &record, base, state_file).await?;
        }

        // 2. The commit point: the slot of the new log, with a fence over the old one's journal
        // entries (see `transfer_slot`).
        let slot = transfer_slot(old, state, &header, self.journal.last_seq());
        let mut slots = self.slots();
        slots.insert(group, slot);
        if let Err(error) = self.superblock.write(slots).await {
            return Err(self.fail(error));
        }

        // 3. Roll forward. The old log goes first: it returns its ring budget and chunks, and
        // its open files are not written again.
        drop(self.groups.remove(&group));
        self.checkpoint_wanted.remove(&group);
        self.settle_blocked.remove(&group);
        if let Err(error) = transfer::roll_forward(&self.storage, &dir, base).await {
            return Err(self.fail(error));
        }

        // 4. Rebuild the log from the new slot (recovery checks the record again as read), then
        // clear the flag durably before anything can be appended.
        let shared = Rc::clone(&self.shared);
        let recovered =
            PartitionLog::recover(self.storage.clone(), shared, dir, slot, config, &[]).await;
        let (log, recovery) = match recovered {
            Ok(recovered) => recovered,
            Err(error) => return Err(self.fail(error)),
        };
        self.set_durable(group, log.head_op());
        self.note_damage(group, &log);
        self.groups.insert(group, log);
        self.active.insert(group);
        // Entries up to S are covered by the new checkpoint, those above it fenced off.
        self.journal.release(group, u64::MAX);
        self.write_slots().await?;
        self.slots_dirty.remove(&group);
        self.counters.transfers_installed += 1;
        match recovery.corruption {
            Some(corruption) => Err(Error::Corruption(corruption)),
            None => Ok(()),
        }
    }

    /// Checks a transferred first record and state against each other and against the group:
    /// the record is valid standalone, its op and end offset are the state's, and it moves the
    /// group forward. Returns the record's bytes and its header.
    fn check_transfer(
        &self,
        group: u64,
        first: &Header,
        body: &[u8],
        state: &GroupState,
    ) -> Result<(Vec<u8>, Header)> {
        let log = self.log(group)?;
        let config = *log.config();
        let encoded = first.encode();
        if HEADER_SIZE + body.len() != first.size as usize {
            return Err(Error::Invalid(format!(
                "transferred record of group {group}: the header says {} bytes, header and body \
                 are {}",
                first.size,
                HEADER_SIZE + body.len()
            )));
        }
        let mut record = Vec::with_capacity(HEADER_SIZE + body.len());
        record.extend_from_slice(&encoded);
        record.extend_from_slice(body);
        let record_max = config.record_size_bytes_max as usize;
        let header =
            check_standalone(&record, self.config.cluster, group, record_max).map_err(|fault| {
                Error::Invalid(format!("transferred record of group {group}: {fault}"))
            })?;
        let prepare = *prepare_of(&header);
        if prepare.op != state.op {
            return Err(Error::Invalid(format!(
                "transferred state of group {group} is as of op {}, its record is op {}",
                state.op, prepare.op
            )));
        }
        let end_offset = prepare.end_offset();
        if state.end_offset != end_offset {
            return Err(Error::Invalid(format!(
                "transferred state of group {group} ends at offset {}, op {} ends at {end_offset}",
                state.end_offset, prepare.op
            )));
        }
        if state.op <= log.head_op() {
            return Err(Error::Invalid(format!(
                "a transfer to op {} does not move group {group} forward from its head {}",
                state.op,
                log.head_op()
            )));
        }
        Ok((record, header))
    }

    /// Applies retention to every group (`now_ms` from the caller's clock). Call with no flush
    /// in flight. Returns the segments deleted.
    pub async fn enforce_retention(&mut self, now_ms: i64) -> Result<usize> {
        self.check_serving()?;
        let mut deleted = 0;
        for (&id, log) in &mut self.groups {
            if log.faulty_reason().is_none() {
                let recycled_before = log.recycled_segments();
                let removed = log.enforce_retention(now_ms).await?;
                self.counters.segments_recycled += log.recycled_segments() - recycled_before;
                if removed > 0 {
                    // A recycled spare changes what the group has ready.
                    self.active.insert(id);
                }
                deleted += removed;
            }
        }
        Ok(deleted)
    }

    /// The files of segments retention retired since the last call, to be removed off the
    /// driver's loop ([`remove_retired_files`]); a driver that never asks leaves retention to
    /// remove them itself once [`RETIRED_FILES_MAX`](crate::partition::RETIRED_FILES_MAX) wait.
    pub fn take_retired_files(&mut self) -> Vec<PathBuf> {
        std::mem::take(&mut *self.shared.retired_files.borrow_mut())
    }

    /// Flushes everything, checkpoints every group and records a clean shutdown (graceful
    /// shutdown). Call with no flush in flight.
    pub async fn close(mut self) -> Result<()> {
        assert!(self.is_between_jobs(), "close with nothing in flight");
        // One more try at what a full disk refused, so that whatever fits now is written.
        self.on_tick();
        for _ in 0..4 {
            self.checkpoint_wanted.extend(self.groups.keys().copied());
            self.marker_wanted = true;
            self.flush().await?;
            if !self.has_pending() && !self.has_checkpoint_pending() {
                break;
            }
        }
        let clean = !self.has_pending()
            && !self.has_checkpoint_pending()
            && self.groups.values().all(|log| log.faulty_reason().is_none());
        let slots = self.slots();
        self.superblock.write_with(slots, clean).await
    }

    /// Writes the journal's pending entries (a whole flush cycle) when it has any. A fence
    /// names the journal's last sequence number, so every entry numbered so far must be on disk
    /// before it: a pending entry a crash takes would have its number handed out again after
    /// the restart, to a new entry the fence would then kill although it was reported durable.
    async fn write_pending_journal(&mut self) -> Result<()> {
        if self.journal.pending_entries() > 0 {
            self.flush().await?;
        }
        assert_eq!(self.journal.pending_entries(), 0, "a flush cycle takes every pending entry");
        Ok(())
    }

    /// The slot table as it should be durable now: every group's control state (whose
    /// checkpoint is always one a superblock write already made durable).
    fn slots(&self) -> BTreeMap<u64, GroupSlot> {
        let mut slots = self.superblock.state().groups.clone();
        for (&id, log) in &self.groups {
            slots.insert(id, log.slot());
        }
        slots
    }

    fn log(&self, group: u64) -> Result<&PartitionLog<S>> {
        self.groups.get(&group).ok_or_else(|| unknown(group))
    }

    /// Why the shard's storage stopped (a journal or superblock failure), if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    fn check_serving(&self) -> Result<()> {
        match &self.failed {
            Some(reason) => Err(Error::Faulty {
                group: u64::MAX,
                reason: format!("shard storage failed: {reason}"),
            }),
            None => Ok(()),
        }
    }

    fn fail(&mut self, error: Error) -> Error {
        if self.failed.is_none() && !matches!(error, Error::StorageFull) {
            self.failed = Some(error.to_string());
        }
        error
    }
}

/// The directory of shard `shard` inside a node's data directory.
#[must_use]
pub fn shard_dir(data_dir: &Path, shard: u32) -> PathBuf {
    data_dir.join(format!("shard-{shard}"))
}

/// The group's slot at a transfer's commit point, written before the old log's files go.
///
/// The fence kills every journal entry written so far above S (the old log's held none above its
/// head, but a truncated suffix's entries may still lie in the journal); `finished`, since segment
/// records above S will be the new suffix. A journal that never held an entry (`journal_seq` 0)
/// needs no fence, and a fence with `seq` 0 would judge later entries by view. Entries numbered
/// after it (seq above `fence.seq`, never reused: every lower number is on disk) are the new
/// log's.
fn transfer_slot(
    old: GroupSlot,
    state: &GroupState,
    header: &Header,
    journal_seq: u64,
) -> GroupSlot {
    let prepare = prepare_of(header);
    let fence = if journal_seq == 0 {
        Fence::default()
    } else {
        Fence { op: state.op, view: old.view.max(1), seq: journal_seq, finished: true }
    };
    GroupSlot {
        checkpoint: Checkpoint {
            op: state.op,
            checksum: header.checksum_header,
            next_offset: prepare.end_offset(),
            segment_base_offset: prepare.base_offset,
            position_bytes: 0,
        },
        fence,
        // A damage cut's missing ops past S may have been acknowledged: they stay faulty
        // (from S + 1) until the owner clears the marker, as for any cut.
        damaged_from: if old.damaged_from == 0 { 0 } else { state.op + 1 },
        transfer_pending: true,
        ..old
    }
}

/// Creates the shard directory and makes every entry on its way durable: each may have just been
/// created, and a power loss could otherwise take the whole shard directory with it.
async fn create_shard_dir<S: Storage>(storage: &S, dir: &Path) -> Result<()> {
    storage
        .create_dir_all(dir)
        .await
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    // A relative path ends in an empty ancestor, which names no directory to sync.
    for ancestor in dir.ancestors().skip(1).filter(|a| !a.as_os_str().is_empty()) {
        storage
            .sync_dir(ancestor)
            .await
            .map_err(|e| Error::io(format!("syncing {}", ancestor.display()), e))?;
    }
    Ok(())
}

/// How much of the batch cache may be views of write chunks: half of what the chunk pool holds
/// beyond what the rings may pin, so that the rings and the chunks being filled always find
/// room (a dry pool takes every view back, DESIGN.md §3).
fn write_views_max_bytes(config: &ShardConfig) -> usize {
    let pool_bytes = config.chunks_max.saturating_mul(config.chunk_size_bytes);
    pool_bytes.saturating_sub(config.ring_budget_bytes) / 2
}

/// The settings and pools every partition log of the shard shares.
fn shared_for(config: &ShardConfig) -> Shared {
    let mut zeros = AlignedBuf::zeroed(1 << 20, BLOCK_SIZE_BYTES);
    zeros.set_len(1 << 20);
    Shared {
        cluster: config.cluster,
        ready_ahead_bytes: config.ready_ahead_bytes,
        ready_budget: crate::ready::ReadyBudget::new(config.ready_budget_bytes),
        recycle_segments: config.recycle_segments,
        index_interval_bytes: config.index_interval_bytes,
        ring_limits: config.ring,
        held_prepares_max: config.held_prepares_max,
        persisted_write_batch_bytes: config.persisted_write_batch_bytes,
        scan_window_bytes: config.scan_window_bytes,
        index_entries_max: config.index_entries_max,
        pool: std::cell::RefCell::new(ChunkPool::new(config.chunk_size_bytes, config.chunks_max)),
        ring_budget: RingBudget::new(config.ring_budget_bytes),
        zeros: zeros.freeze(),
        cache: std::cell::RefCell::new(BatchCache::new(
            config.batch_cache_bytes,
            write_views_max_bytes(config),
        )),
        read_ahead_windows: config.read_ahead_windows,
        retired_files: std::cell::RefCell::new(Vec::new()),
        replay_scan_shelf: crate::storage::BufferShelf::new(1),
    }
}

/// The groups an open recovered, with what the shard tracks for each from the start.
struct RecoveredGroups<S: Storage> {
    groups: BTreeMap<u64, PartitionLog<S>>,
    /// Each group's durable head at open.
    durable: BTreeMap<u64, u64>,
    /// Groups whose recovery replayed or cut something, so a checkpoint should follow.
    checkpoint_wanted: BTreeSet<u64>,
}

/// Recovers every group the superblock names, in id order: finishes a state transfer that passed
/// its commit point, scans the log past its checkpoint (replaying the journal's prepares), and
/// marks a suffix faulty where the stop may have taken acknowledged writes without a trace.
async fn recover_groups<S: Storage>(
    storage: &S,
    dir: &Path,
    shared: &Rc<Shared>,
    superblock: &Superblock<S::File>,
    journal_recovery: &JournalRecovery,
    report: &mut RecoveryReport,
) -> Result<RecoveredGroups<S>> {
    let mut recovered = RecoveredGroups {
        groups: BTreeMap::new(),
        durable: BTreeMap::new(),
        checkpoint_wanted: BTreeSet::new(),
    };
    let no_prepares = Vec::new();
    let clean_shutdown = superblock.state().clean_shutdown;
    let journal_corrupt = journal_recovery.corruption.is_some();
    let slots: Vec<(u64, GroupSlot)> =
        superblock.state().groups.iter().map(|(&id, slot)| (id, *slot)).collect();
    for batch in slots.chunks(GROUPS_RECOVERED_AT_ONCE) {
        let recoveries = batch.iter().map(|&(id, slot)| {
            let prepares = journal_recovery.prepares.get(&id).unwrap_or(&no_prepares);
            async move {
                if slot.transfer_pending {
                    // A state transfer passed its commit point and the stop came before its
                    // second superblock write: finish replacing the old log's files first.
                    let base = slot.checkpoint.segment_base_offset;
                    transfer::roll_forward(storage, &group_dir(dir, id), base).await?;
                }
                PartitionLog::recover(
                    storage.clone(),
                    Rc::clone(shared),
                    group_dir(dir, id),
                    slot,
                    slot.config,
                    prepares,
                )
                .await
            }
        });
        let recovered_batch = join_all(recoveries.collect()).await;
        for result in recovered_batch {
            let (log, recovery) = result?;
            note_recovered(&mut recovered, report, clean_shutdown, journal_corrupt, log, recovery);
        }
    }
    Ok(recovered)
}

/// Groups whose recoveries run at once. Each is a chain of small dependent I/Os (opening its
/// files, reading its torn window, rewriting it and syncing), so one group at a time left the
/// disk idle between them: a start of 10,000 groups spent over 4 s here.
const GROUPS_RECOVERED_AT_ONCE: usize = 16;

/// Takes in one group's recovery, in id order: the faulty suffixes the shard's state implies,
/// and what the shard tracks for the group from the start.
fn note_recovered<S: Storage>(
    recovered: &mut RecoveredGroups<S>,
    report: &mut RecoveryReport,
    clean_shutdown: bool,
    journal_corrupt: bool,
    mut log: PartitionLog<S>,
    mut recovery: GroupRecovery,
) {
    let durability = log.config().durability;
    if durability == Durability::Persisted && journal_corrupt {
        // A synced journal entry is gone and we cannot tell whose: every persisted group's
        // suffix is faulty rather than absent (unavailable beats wrong).
        log.mark_suffix_faulty();
        recovery.faulty = log.faulty_ops().clone();
    }
    if durability == Durability::Replicated && !clean_shutdown && recovery.corruption.is_none() {
        // Writes past the checkpoint were acknowledged once written, not once synced: after an
        // unclean stop some may be gone without a trace, so the suffix is faulty.
        log.mark_suffix_faulty();
        recovery.faulty = log.faulty_ops().clone();
    }
    let id = recovery.group;
    if recovery.journal_replayed > 0 || recovery.torn_tail.is_some() {
        recovered.checkpoint_wanted.insert(id);
    }
    recovered.durable.insert(id, log.head_op());
    recovered.groups.insert(id, log);
    report.groups.push(recovery);
}

/// Clears the clean-shutdown flag before anything can be acknowledged, and finishes what a crash
/// interrupted: a truncation is finished now (recovery cut its tail as torn); a state transfer
/// was rolled forward durably by [`recover_groups`], and its flag goes before anything is
/// appended, since a later roll-forward would remove the new segments.
async fn finish_interrupted<S: Storage>(
    mut superblock: Superblock<S::File>,
    groups: &mut BTreeMap<u64, PartitionLog<S>>,
) -> Result<Superblock<S::File>> {
    let mut slots = superblock.state().groups.clone();
    for (id, slot) in &mut slots {
        slot.transfer_pending = false;
        if slot.fence.view != 0 && !slot.fence.finished {
            slot.fence.finished = true;
            if let Some(log) = groups.get_mut(id) {
                log.finish_fence();
            }
        }
    }
    superblock.write(slots).await?;
    Ok(superblock)
}

/// Frees the journal entries no group needs any more. The journal's tail may still hold entries a
/// checkpoint covered just before the stop (no later entry recorded the tail moving past them):
/// left live, an idle group's stale entries would pin the journal until every other group stalls
/// on it.
fn release_stale_journal<S: Storage>(
    journal: &mut Journal<S::File>,
    groups: &BTreeMap<u64, PartitionLog<S>>,
) {
    // One pass over the live entries, whatever the number of groups.
    journal.release_dead(|group, seq, op| {
        let Some(log) = groups.get(&group) else {
            // A deleted group's: no group will ever replay it.
            return true;
        };
        // An earlier group of the same id wrote it (deleted since); or its checkpoint covers
        // it; or a damage cut, in this open or an earlier run, whose ops the group has not all
        // had back, made it dead: every op past the head is faulty by the durable marker. Left
        // live, such entries would pin the journal until the group got those ops back, which
        // may need a state transfer whose appends the full journal refuses (retention seed
        // 21,000,173).
        seq <= log.journal_floor_seq()
            || op <= log.checkpoint().op
            || (log.damaged_from() != 0 && op > log.head_op())
    });
}

/// The directory of a group inside a shard directory.
#[must_use]
pub fn group_dir(shard_dir: &Path, group: u64) -> PathBuf {
    shard_dir.join(format!("group-{group:020}"))
}

/// The group a shard directory entry named as [`group_dir`] names it belongs to.
#[must_use]
pub fn group_of_dir_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("group-")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Removes retired segment files ([`ShardStore::take_retired_files`]), each once: one already
/// gone (its group was deleted meanwhile) is no error. Their directories need no sync: the
/// rename out of the log was synced, and a file a crash brings back is removed at open.
pub async fn remove_retired_files<S: Storage>(storage: &S, paths: Vec<PathBuf>) -> Result<()> {
    for path in paths {
        match storage.remove_file(&path).await {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(format!("removing {}", path.display()), error));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Removes a group's directory: every file in it, then the directory. Group directories hold
/// files only. A retired segment the driver removes meanwhile is no error.
async fn remove_group_dir<S: Storage>(storage: &S, dir: &Path) -> Result<()> {
    let names = storage
        .list_dir(dir)
        .await
        .map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    for name in names {
        let path = dir.join(&name);
        match storage.remove_file(&path).await {
            Err(error)
                if error.kind() == std::io::ErrorKind::NotFound && is_retired_name(&name) => {}
            result => result.map_err(|e| Error::io(format!("removing {}", path.display()), e))?,
        }
    }
    storage.remove_dir(dir).await.map_err(|e| Error::io(format!("removing {}", dir.display()), e))
}

/// Removes the group directories the superblock does not name: a deletion's files the stop
/// came before, or a creation's directories the stop came before its superblock write (they
/// hold nothing). Left, they would hold disk space no group accounts for.
/// A shard directory holding a journal or a group directory but no superblock lost it: a first
/// start writes the superblock (renamed into place) before anything else, so only damage or a
/// mistake leaves the others without it. A new superblock would name no group, and the open
/// would then remove every group directory as unnamed: refused instead.
async fn refuse_a_lost_superblock<S: Storage>(storage: &S, dir: &Path) -> Result<()> {
    let superblock = dir.join(crate::superblock::FILE_NAME);
    if storage.exists(&superblock).await.map_err(|e| Error::io("probing the superblock", e))? {
        return Ok(());
    }
    let names = storage
        .list_dir(dir)
        .await
        .map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    let left = names
        .iter()
        .find(|name| *name == crate::journal::FILE_NAME || group_of_dir_name(name).is_some());
    match left {
        None => Ok(()),
        Some(name) => Err(Error::Corruption(crate::Corruption {
            file: superblock,
            position_bytes: 0,
            offset: None,
            op: None,
            reason: format!(
                "the superblock is missing beside {name}: refusing to start a new one, which \
                 would forget every group and remove its data"
            ),
        })),
    }
}

async fn remove_unnamed_group_dirs<S: Storage>(
    storage: &S,
    dir: &Path,
    groups: &BTreeMap<u64, PartitionLog<S>>,
) -> Result<()> {
    let names = storage
        .list_dir(dir)
        .await
        .map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    let mut removed = false;
    for name in names {
        if let Some(group) = group_of_dir_name(&name)
            && !groups.contains_key(&group)
        {
            remove_group_dir(storage, &dir.join(name)).await?;
            removed = true;
        }
    }
    if removed {
        storage
            .sync_dir(dir)
            .await
            .map_err(|e| Error::io(format!("syncing {}", dir.display()), e))?;
    }
    Ok(())
}

fn unknown(group: u64) -> Error {
    Error::Invalid(format!("unknown group {group}"))
}

/// Awaits two futures concurrently.
async fn join2<A: std::future::Future, B: std::future::Future>(
    a: A,
    b: B,
) -> (A::Output, B::Output) {
    let mut a = std::pin::pin!(a);
    let mut b = std::pin::pin!(b);
    let mut out_a = None;
    let mut out_b = None;
    std::future::poll_fn(|context| {
        if out_a.is_none()
            && let std::task::Poll::Ready(value) = a.as_mut().poll(context)
        {
            out_a = Some(value);
        }
        if out_b.is_none()
            && let std::task::Poll::Ready(value) = b.as_mut().poll(context)
        {
            out_b = Some(value);
        }
        if out_a.is_some() && out_b.is_some() {
            std::task::Poll::Ready((out_a.take().expect("ready"), out_b.take().expect("ready")))
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}
