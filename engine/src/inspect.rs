//! The data-directory checker: walks a node's data directory (or one shard directory) and
//! verifies every file the engine owns — superblock copies, group segments and their indexes, and
//! the shard journal — against the rules recovery relies on (DESIGN.md §3), reporting what it
//! found and, precisely, where the first damage lies.
//!
//! It owns only the *reading* of those files and the classification of what it sees:
//! damage where the fault model says data must be intact (before a group's checkpoint, in the
//! synced part of the journal, a torn superblock copy) is a problem; the torn window past a
//! checkpoint, zeros and stale bytes past the chain's end are notes. `shoal-inspect` and the
//! simulator both call [`inspect`], generic over [`Storage`], so it runs on real and on simulated
//! disks alike.
//!
//! It must never write, create, rename or remove anything (an operator runs it on a directory
//! that may be evidence), never panic on any file contents or missing files, and never allocate
//! or read by a length it has not bounded first: segments are read in windows, whatever their
//! size.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::Corruption;
use crate::record::{ChainNext, RecordFault, check_next, check_standalone, prepare_of};
use crate::scan::Scanner;
use crate::segment::{
    INDEX_ENTRY_SIZE_BYTES, INDEX_HEADER_SIZE_BYTES, IndexEntry, IndexSummary, SPARE_NAME,
    SegmentIndex, index_name, parse_index_name, parse_log_name,
};
use crate::storage::{AlignedBuf, BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile};
use crate::superblock::{
    self, COPIES, Checkpoint, Durability, Fence, GroupSlot, Identity, SuperblockState,
};
use crate::wire::{HEADER_SIZE, Header};

/// Read window for segments and the journal: large enough to make sequential reads cheap, small
/// enough that a 4 GiB segment never sits in memory.
const WINDOW_BYTES: usize = 4 << 20;

/// Record bound for a group the superblock does not describe (an orphan directory, or no valid
/// superblock copy): generous, but still a bound on what one record read may allocate.
const RECORD_SIZE_FALLBACK_BYTES: usize = 64 << 20;

/// Largest superblock copy region the checker will read (4096 groups need about 0.5 MiB).
const COPY_SIZE_MAX_BYTES: usize = 64 << 20;

/// Where a copy header stores its slot bound (`slots_max`), which fixes every copy's size. Only
/// used to find the copy size when copy 0 is unreadable; `superblock_header_layout_is_pinned`
/// checks it against a superblock the engine wrote.
const SUPERBLOCK_OFF_SLOTS_MAX: usize = 48;

/// Cap on the candidate copy sizes probed when copy 0 is damaged.
const COPY_SIZE_PROBES_MAX: usize = 4096;

/// Everything the checker found under one path.
#[derive(Clone, Debug, Default)]
pub struct InspectReport {
    /// The path inspected.
    pub path: PathBuf,
    /// Why nothing could be inspected (missing or unreadable path, not a data directory).
    pub error: Option<String>,
    /// One report per shard directory, in shard order.
    pub shards: Vec<ShardReport>,
    /// Every problem (damage where data must be intact), in the order found: per shard its
    /// superblock, then its groups in id order (segments in offset order), then its journal.
    pub problems: Vec<Corruption>,
    /// Findings that are not damage: torn-window leftovers, stale data past the chain's end,
    /// stale superblock copies, unknown files.
    pub notes: Vec<Note>,
}

impl InspectReport {
    /// No problem was found and the path could be inspected.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.error.is_none() && self.problems.is_empty()
    }

    /// The first problem found (see [`InspectReport::problems`] for the order).
    #[must_use]
    pub fn first_corruption(&self) -> Option<&Corruption> {
        self.problems.first()
    }
}

/// A finding that is not damage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// The file (or directory) it concerns.
    pub file: PathBuf,
    /// Byte position in the file, when it has one.
    pub position_bytes: Option<u64>,
    /// What was found.
    pub message: String,
}

/// One shard directory.
#[derive(Clone, Debug, Default)]
pub struct ShardReport {
    /// The shard directory.
    pub dir: PathBuf,
    /// The shard index its directory name gives (`shard-N`), if it has one.
    pub shard: Option<u32>,
    /// The superblock file.
    pub superblock: SuperblockReport,
    /// Every group: those the superblock names and those with a directory, in id order.
    pub groups: Vec<GroupReport>,
    /// The journal, if the file could be opened.
    pub journal: Option<JournalReport>,
}

/// The superblock file of one shard.
#[derive(Clone, Debug, Default)]
pub struct SuperblockReport {
    /// The file.
    pub file: PathBuf,
    /// Its size in bytes.
    pub file_size_bytes: u64,
    /// The size of one copy's region (0 when it could not be determined).
    pub copy_size_bytes: u64,
    /// Each copy, in file order.
    pub copies: Vec<CopyReport>,
    /// Index of the newest valid copy.
    pub newest: Option<usize>,
    /// The newest valid version: identity and every group slot.
    pub state: Option<SuperblockState>,
}

/// One superblock copy.
#[derive(Clone, Debug)]
pub struct CopyReport {
    /// Copy number (0-based).
    pub index: usize,
    /// Where the copy starts in the file.
    pub position_bytes: u64,
    /// What it holds, or why it is invalid.
    pub status: Result<CopyInfo, String>,
}

/// What a valid superblock copy holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyInfo {
    /// Version sequence number.
    pub sequence: u64,
    /// Checksum of the version.
    pub checksum: u32,
    /// Checksum of the previous version.
    pub parent: u32,
    /// Whose directory it says this is.
    pub identity: Identity,
    /// Group slots in use.
    pub slot_count: usize,
    /// The slot table's bound.
    pub slots_max: usize,
    /// It holds the newest version (false: a stale, older version).
    pub current: bool,
}

/// One group (partition log).
#[derive(Clone, Debug, Default)]
pub struct GroupReport {
    /// Group id.
    pub group: u64,
    /// Its directory.
    pub dir: PathBuf,
    /// Its slot in the newest superblock copy (None: the superblock does not name it).
    pub slot: Option<GroupSlot>,
    /// Its segment files, in offset order.
    pub segments: Vec<SegmentReport>,
    /// First op of the chain found (None: no valid record).
    pub first_op: Option<u64>,
    /// Last op of the chain found.
    pub last_op: Option<u64>,
    /// First offset of the chain found.
    pub first_offset: Option<u64>,
    /// The offset after the chain's last record.
    pub next_offset: Option<u64>,
    /// Valid records found.
    pub records: u64,
    /// Bytes of valid records.
    pub valid_bytes: u64,
    /// The transferred state the live log began from (`transfer-state`), when a state transfer
    /// installed the log and the file checks out: (op, end offset).
    pub transfer_state: Option<(u64, u64)>,
}

/// One segment file.
#[derive(Clone, Debug, Default)]
pub struct SegmentReport {
    /// The file.
    pub file: PathBuf,
    /// The base offset its name gives.
    pub base_offset: u64,
    /// Its size on disk (data, then zeros written ahead).
    pub file_size_bytes: u64,
    /// Bytes from its start to the end of its data (its last valid or stepped-over record).
    pub valid_bytes: u64,
    /// Valid records.
    pub records: u64,
    /// Records before the checkpoint whose header held but whose body (or chain link) did not:
    /// stepped over, counted in `valid_bytes`, not in `records`.
    pub damaged_records: u64,
    /// First op held.
    pub first_op: Option<u64>,
    /// Last op held.
    pub last_op: Option<u64>,
    /// Offset of its first record.
    pub first_offset: Option<u64>,
    /// Offset after its last record.
    pub next_offset: Option<u64>,
    /// It lies past the chain's end (a torn-window leftover that recovery deletes).
    pub leftover: bool,
    /// How its data ended.
    pub end: SegmentEnd,
    /// Its index file.
    pub index: IndexStatus,
}

/// How a segment's data ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum SegmentEnd {
    /// Zeros from the last record to the end of the file.
    #[default]
    Clean,
    /// Something other than zeros past the last valid record.
    DataAfterEnd {
        /// Where the unexpected bytes start.
        position_bytes: u64,
        /// What they are.
        reason: String,
        /// Whether it is damage (before the checkpoint) rather than the torn window.
        corruption: bool,
    },
    /// The file could not be read to its end.
    Unreadable(String),
    /// Not scanned (a leftover past the chain's end).
    NotScanned,
}

/// The state of a segment's index file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum IndexStatus {
    /// No index file (normal for the active segment; rebuilt on open otherwise).
    #[default]
    Missing,
    /// Decoded and agrees with the segment.
    Ok {
        /// Entries it holds.
        entries: usize,
    },
    /// Does not decode (recovery rebuilds it).
    Damaged(String),
    /// Decodes but disagrees with the segment.
    Disagrees(String),
    /// Decoded, but the segment is damaged so it was not compared.
    NotCompared {
        /// Entries it holds.
        entries: usize,
    },
}

/// The shard journal.
#[derive(Clone, Debug, Default)]
pub struct JournalReport {
    /// The file.
    pub file: PathBuf,
    /// Its size in bytes.
    pub file_size_bytes: u64,
    /// Valid entries found.
    pub entries_valid: u64,
    /// Lowest seq found.
    pub seq_first: Option<u64>,
    /// Highest seq found (the newest entry).
    pub seq_last: Option<u64>,
    /// Of which markers: entries without a prepare that only announce what is durable.
    pub markers: u64,
    /// Highest seq any entry says was synced.
    pub durable_seq: u64,
    /// The newest entry's `tail_seq`: entries from here on are still needed.
    pub tail_seq: u64,
    /// Needed entries per group.
    pub groups: Vec<JournalGroup>,
}

/// The needed journal entries of one group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalGroup {
    /// Group id.
    pub group: u64,
    /// Needed entries (seq at or past the tail).
    pub entries: u64,
    /// Lowest op among them.
    pub first_op: u64,
    /// Highest op among them.
    pub last_op: u64,
    /// Ops past the segments' end that continue the chain: what recovery replays.
    pub replayable: u64,
}

/// Checks the data directory (holding `shard-N` directories) or shard directory at `path`.
///
/// Never writes and never panics on what it reads; an unreadable path or a directory that is
/// neither comes back as [`InspectReport::error`].
pub async fn inspect<S: Storage>(storage: &S, path: &Path) -> InspectReport {
    let mut checker = Checker { storage, problems: Vec::new(), notes: Vec::new() };
    let mut report = InspectReport { path: path.to_path_buf(), ..InspectReport::default() };
    match storage.exists(path).await {
        Ok(true) => {}
        Ok(false) => {
            report.error = Some(format!("{} does not exist", path.display()));
            return report;
        }
        Err(error) => {
            report.error = Some(format!("cannot probe {}: {error}", path.display()));
            return report;
        }
    }
    let names = match storage.list_dir(path).await {
        Ok(names) => names,
        Err(error) => {
            report.error = Some(format!("cannot list {}: {error}", path.display()));
            return report;
        }
    };
    let is_shard_dir = names.iter().any(|name| {
        name == superblock::FILE_NAME
            || name == superblock::TEMP_FILE_NAME
            || name == crate::journal::FILE_NAME
            || parse_group_dir(name).is_some()
    });
    if is_shard_dir {
        let shard = path.file_name().and_then(|n| n.to_str()).and_then(parse_shard_dir);
        let shard_report = checker.shard(path, shard).await;
        report.shards.push(shard_report);
    } else {
        let mut shards: Vec<(u32, String)> = names
            .iter()
            .filter_map(|name| parse_shard_dir(name).map(|n| (n, name.clone())))
            .collect();
        if shards.is_empty() {
            report.error = Some(format!(
                "{} holds neither shard directories (shard-N) nor a shard's superblock",
                path.display()
            ));
            return report;
        }
        shards.sort();
        for name in &names {
            if parse_shard_dir(name).is_none() {
                checker.note(path.join(name), None, "unknown entry in the data directory");
            }
        }
        for (n, name) in &shards {
            let shard_report = checker.shard(&path.join(name), Some(*n)).await;
            report.shards.push(shard_report);
        }
        checker.node_identity(path, &report.shards);
    }
    report.problems = checker.problems;
    report.notes = checker.notes;
    report
}

struct Checker<'s, S> {
    storage: &'s S,
    problems: Vec<Corruption>,
    notes: Vec<Note>,
}

/// A record position a problem can name.
#[derive(Clone, Copy)]
struct At {
    position_bytes: u64,
    offset: Option<u64>,
    op: Option<u64>,
}

impl At {
    fn byte(position_bytes: u64) -> At {
        At { position_bytes, offset: None, op: None }
    }

    fn expecting(position_bytes: u64, next: Option<&ChainNext>) -> At {
        At { position_bytes, offset: next.map(|n| n.offset), op: next.map(|n| n.op) }
    }
}

/// Where a group's chain stands while its segments are walked.
enum Chain {
    /// The next record must be exactly this one.
    Expect(ChainNext),
    /// Take the next record as it comes (start of a log whose beginning retention may have
    /// deleted, or after damage already reported).
    Anchor,
    /// The chain ended past the checkpoint: later segments are torn-window leftovers.
    Ended(ChainNext),
}

impl<S: Storage> Checker<'_, S> {
    fn problem(&mut self, file: &Path, at: At, reason: impl Into<String>) {
        self.problems.push(Corruption {
            file: file.to_path_buf(),
            position_bytes: at.position_bytes,
            offset: at.offset,
            op: at.op,
            reason: reason.into(),
        });
    }

    fn note(&mut self, file: PathBuf, position_bytes: Option<u64>, message: impl Into<String>) {
        self.notes.push(Note { file, position_bytes, message: message.into() });
    }

    async fn shard(&mut self, dir: &Path, shard: Option<u32>) -> ShardReport {
        let mut report = ShardReport { dir: dir.to_path_buf(), shard, ..ShardReport::default() };
        let names = match self.storage.list_dir(dir).await {
            Ok(names) => names,
            Err(error) => {
                self.problem(dir, At::byte(0), format!("cannot list the shard directory: {error}"));
                return report;
            }
        };
        let has = |file: &str| names.iter().any(|name| name == file);
        if !has(superblock::FILE_NAME)
            && has(superblock::TEMP_FILE_NAME)
            && !names.iter().any(|name| parse_group_dir(name).is_some())
        {
            // Open renames the new superblock into place before anything else is written, so
            // a shard caught before that holds no data: the next open starts it afresh.
            report.superblock.file = dir.join(superblock::FILE_NAME);
            self.note(
                dir.join(superblock::TEMP_FILE_NAME),
                None,
                "shard creation interrupted before its superblock was in place (holds no data)",
            );
            return report;
        }
        report.superblock = self.superblock(dir, &names).await;
        let state = report.superblock.state.clone();
        if let (Some(state), Some(shard)) = (&state, shard)
            && state.identity.shard != shard
        {
            let file = report.superblock.file.clone();
            self.problem(
                &file,
                At::byte(0),
                format!(
                    "the superblock belongs to shard {}, the directory is shard-{shard}",
                    state.identity.shard
                ),
            );
        }
        let mut group_ids: BTreeMap<u64, String> = BTreeMap::new();
        for name in &names {
            if let Some(group) = parse_group_dir(name) {
                group_ids.insert(group, name.clone());
            } else if name == superblock::TEMP_FILE_NAME {
                self.note(
                    dir.join(name),
                    None,
                    "a new superblock written but never renamed into place (creation interrupted)",
                );
            } else if name != superblock::FILE_NAME && name != crate::journal::FILE_NAME {
                self.note(dir.join(name), None, "unknown entry in the shard directory");
            }
        }
        let slots = state.as_ref().map(|s| s.groups.clone()).unwrap_or_default();
        let mut ids: Vec<u64> = slots.keys().chain(group_ids.keys()).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        let cluster = state.as_ref().map(|s| s.identity.cluster);
        let mut heads = BTreeMap::new();
        for id in ids {
            let group_dir = crate::shard::group_dir(dir, id);
            let slot = slots.get(&id).copied();
            if slot.is_none() {
                self.note(
                    group_dir.clone(),
                    None,
                    "group directory the superblock does not name (recovery ignores it)",
                );
            }
            let (group, next) =
                self.group(&group_dir, id, slot, cluster, group_ids.contains_key(&id)).await;
            heads.insert(id, next);
            report.groups.push(group);
        }
        report.journal = self.journal(dir, state.as_ref(), &heads).await;
        report
    }

    /// Cross-shard checks of a node's data directory: every shard agrees on who owns it and how
    /// many shards there are, and none is missing.
    fn node_identity(&mut self, dir: &Path, shards: &[ShardReport]) {
        let identities: Vec<(&ShardReport, Identity)> = shards
            .iter()
            .filter_map(|s| s.superblock.state.as_ref().map(|state| (s, state.identity)))
            .collect();
        let Some(&(_, first)) = identities.first() else { return };
        for &(shard, identity) in &identities[1..] {
            if (identity.cluster, identity.node, identity.shard_count)
                != (first.cluster, first.node, first.shard_count)
            {
                self.problem(
                    &shard.superblock.file,
                    At::byte(0),
                    format!(
                        "identity (cluster {}, node {}, {} shards) differs from the first shard's \
                         (cluster {}, node {}, {} shards)",
                        identity.cluster,
                        identity.node,
                        identity.shard_count,
                        first.cluster,
                        first.node,
                        first.shard_count
                    ),
                );
            }
        }
        for n in 0..first.shard_count.min(1 << 16) {
            if !shards.iter().any(|s| s.shard == Some(n)) {
                self.problem(
                    &crate::shard::shard_dir(dir, n),
                    At::byte(0),
                    format!(
                        "shard directory missing (the superblocks say {} shards)",
                        first.shard_count
                    ),
                );
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // Superblock
    // ---------------------------------------------------------------------------------------

    async fn superblock(&mut self, dir: &Path, names: &[String]) -> SuperblockReport {
        let path = dir.join(superblock::FILE_NAME);
        let mut report = SuperblockReport { file: path.clone(), ..SuperblockReport::default() };
        if !names.iter().any(|name| name == superblock::FILE_NAME) {
            self.problem(&path, At::byte(0), "superblock missing");
            return report;
        }
        let file = match self.storage.open(&path, OpenMode::Read, false).await {
            Ok(file) => file,
            Err(error) => {
                self.problem(&path, At::byte(0), format!("cannot open the superblock: {error}"));
                return report;
            }
        };
        report.file_size_bytes = match file.size_bytes().await {
            Ok(size) => size,
            Err(error) => {
                self.problem(&path, At::byte(0), format!("cannot size the superblock: {error}"));
                return report;
            }
        };
        let Some(copy_size) = copy_size(&file, report.file_size_bytes).await else {
            self.problem(
                &path,
                At::byte(0),
                "no valid superblock copy: no copy header names a plausible copy size",
            );
            return report;
        };
        report.copy_size_bytes = copy_size as u64;
        let mut decoded = Vec::with_capacity(COPIES);
        for index in 0..COPIES {
            let position = (index * copy_size) as u64;
            let status = match read_range(&file, position, copy_size).await {
                Ok(mut bytes) => {
                    // A short copy reads as zeros past the end, as the engine reads it.
                    bytes.resize(copy_size, 0);
                    superblock::decode_copy(&bytes)
                }
                Err(error) => Err(format!("read error: {error}")),
            };
            decoded.push(status);
        }
        let newest = decoded
            .iter()
            .enumerate()
            .filter_map(|(i, copy)| copy.as_ref().ok().map(|state| (i, state)))
            .max_by_key(|(i, state)| (state.sequence, std::cmp::Reverse(*i)))
            .map(|(i, state)| (i, state.clone()));
        for (index, copy) in decoded.into_iter().enumerate() {
            let position = (index * copy_size) as u64;
            let status = match copy {
                Ok(state) => {
                    let current = newest.as_ref().is_some_and(|(_, n)| {
                        n.sequence == state.sequence && n.checksum == state.checksum
                    });
                    if let Some((_, n)) = &newest
                        && !current
                    {
                        self.superblock_stale(&path, index, position, n, &state);
                    }
                    Ok(CopyInfo {
                        sequence: state.sequence,
                        checksum: state.checksum,
                        parent: state.parent,
                        identity: state.identity,
                        slot_count: state.groups.len(),
                        slots_max: state.slots_max,
                        current,
                    })
                }
                Err(reason) => {
                    self.problem(
                        &path,
                        At::byte(position),
                        format!("superblock copy {index} invalid: {reason}"),
                    );
                    Err(reason)
                }
            };
            report.copies.push(CopyReport { index, position_bytes: position, status });
        }
        match newest {
            Some((index, state)) => {
                if copy_size != superblock::copy_size_bytes(state.slots_max) {
                    self.problem(
                        &path,
                        At::byte(0),
                        format!(
                            "copies are {copy_size} bytes apart, the newest names slots_max {} ({} bytes)",
                            state.slots_max,
                            superblock::copy_size_bytes(state.slots_max)
                        ),
                    );
                }
                report.newest = Some(index);
                report.state = Some(state);
            }
            None => self.problem(&path, At::byte(0), "no valid superblock copy"),
        }
        report
    }

    /// A valid copy older than the newest: what a crash between copy writes leaves (open
    /// rewrites it). Its version must still be an ancestor the newest can chain to.
    fn superblock_stale(
        &mut self,
        path: &Path,
        index: usize,
        position: u64,
        newest: &SuperblockState,
        stale: &SuperblockState,
    ) {
        if stale.sequence >= newest.sequence {
            self.problem(
                path,
                At::byte(position),
                format!(
                    "superblock copy {index} holds another version with the same sequence {}",
                    stale.sequence
                ),
            );
        } else if stale.sequence + 1 == newest.sequence && newest.parent != stale.checksum {
            self.problem(
                path,
                At::byte(position),
                format!(
                    "superblock copy {index} (sequence {}) is not the parent of the newest version",
                    stale.sequence
                ),
            );
        } else {
            self.note(
                path.to_path_buf(),
                Some(position),
                format!(
                    "superblock copy {index} is stale (sequence {}, newest {}): a crash between \
                     copy writes; open rewrites it",
                    stale.sequence, newest.sequence
                ),
            );
        }
    }

    // ---------------------------------------------------------------------------------------
    // Groups and segments
    // ---------------------------------------------------------------------------------------

    /// Walks one group's segments in offset order, following the chain across them. Returns
    /// the report and what the record after the chain's end must be (None when no chain was
    /// found or damage broke it).
    async fn group(
        &mut self,
        dir: &Path,
        group: u64,
        slot: Option<GroupSlot>,
        cluster: Option<u64>,
        dir_exists: bool,
    ) -> (GroupReport, Option<ChainNext>) {
        let mut report =
            GroupReport { group, dir: dir.to_path_buf(), slot, ..GroupReport::default() };
        let checkpoint = slot.map(|s| s.checkpoint).unwrap_or_default();
        let at_checkpoint = At {
            position_bytes: checkpoint.position_bytes,
            offset: Some(checkpoint.next_offset),
            op: Some(checkpoint.op),
        };
        if !dir_exists {
            if checkpoint.op > 0 {
                self.problem(
                    dir,
                    at_checkpoint,
                    "group directory missing, but its checkpoint names data",
                );
            }
            return (report, None);
        }
        let names = match self.storage.list_dir(dir).await {
            Ok(names) => names,
            Err(error) => {
                self.problem(dir, At::byte(0), format!("cannot list the group directory: {error}"));
                return (report, None);
            }
        };
        // A slot whose transfer is pending names the new log's first segment, staged or
        // already renamed into place; the roll-forward at open removes everything else.
        let pending = slot.is_some_and(|s| s.transfer_pending);
        let staged_name = crate::transfer::staged_log_name(checkpoint.segment_base_offset);
        let staged_present = pending && names.contains(&staged_name);
        if pending {
            self.note(
                dir.to_path_buf(),
                None,
                format!(
                    "state transfer to op {} pending: open rolls it forward (removes the old \
                     log's files, renames the staged ones into place)",
                    checkpoint.op
                ),
            );
        }
        let mut bases = Vec::new();
        for name in &names {
            if let Some(base) = parse_log_name(name) {
                if pending && (staged_present || base != checkpoint.segment_base_offset) {
                    self.note(
                        dir.join(name),
                        None,
                        "segment of the log a pending state transfer replaces (the \
                         roll-forward removes it)",
                    );
                } else {
                    bases.push(base);
                }
            } else if pending && *name == staged_name {
                // Walked below in place of the segment it becomes.
            } else if name == crate::state::TRANSFER_STATE_FILE
                || (pending && name == crate::state::TRANSFER_STATE_STAGED)
            {
                match crate::state::load_file(self.storage, &dir.join(name)).await {
                    Ok(state) => {
                        report.transfer_state = state.map(|state| (state.op, state.end_offset));
                    }
                    Err(error) => self.problem(
                        &dir.join(name),
                        At::byte(0),
                        format!("transferred state: {error}"),
                    ),
                }
            } else if crate::transfer::is_staged_name(name) {
                self.note(
                    dir.join(name),
                    None,
                    "leftover of a state transfer that never reached its commit point (open \
                     removes it)",
                );
            } else if name == crate::state::STATE_FILE {
                if let Err(error) = crate::state::load(self.storage, dir).await {
                    self.problem(&dir.join(name), At::byte(0), format!("group state: {error}"));
                }
            } else if name == crate::state::STATE_FILE_NEW {
                self.note(dir.join(name), None, "leftover of an interrupted group state save");
            } else if name == SPARE_NAME {
                // Space made ready for the next segment: it holds no data to check (a recycled
                // one holds a retired segment's records, which the next segment overwrites).
                let path = dir.join(name);
                let size = match self.storage.open(&path, OpenMode::Read, false).await {
                    Ok(file) => file.size_bytes().await.unwrap_or(0),
                    Err(_) => 0,
                };
                if size > 0 {
                    self.note(
                        path,
                        None,
                        "spare segment file holds a retired segment's bytes (recycled); the next \
                         segment overwrites them",
                    );
                }
            } else if parse_index_name(name).is_none() {
                self.note(dir.join(name), None, "unknown file in the group directory");
            }
        }
        bases.sort_unstable();
        for name in &names {
            if pending && parse_index_name(name).is_some() {
                self.note(
                    dir.join(name),
                    None,
                    "index file of the log a pending state transfer replaces (the roll-forward \
                     removes it)",
                );
            } else if let Some(base) = parse_index_name(name)
                && !bases.contains(&base)
            {
                self.note(dir.join(name), None, "index file without its segment");
            }
        }
        let checkpoint_file = dir.join(crate::segment::log_name(checkpoint.segment_base_offset));
        let mut walk = GroupWalk {
            cluster,
            group,
            checkpoint,
            fence: slot.map(|s| s.fence).unwrap_or_default(),
            record_max: slot
                .map_or(RECORD_SIZE_FALLBACK_BYTES, |s| s.config.record_size_bytes_max as usize),
            // A log that never checkpointed has lost nothing to retention, so it starts at op 1;
            // otherwise the first remaining segment says where the chain starts.
            chain: match cluster {
                Some(cluster) if slot.is_some() && checkpoint.op == 0 => {
                    Chain::Expect(ChainNext { cluster, group, op: 1, parent: 0, offset: 0 })
                }
                _ => Chain::Anchor,
            },
            checkpoint_seen: false,
            damaged: false,
            end_at: None,
        };
        let mut files: Vec<(u64, PathBuf, bool)> = bases
            .iter()
            .map(|&base| {
                let has_index = !pending && names.iter().any(|name| *name == index_name(base));
                (base, dir.join(crate::segment::log_name(base)), has_index)
            })
            .collect();
        if staged_present {
            files.push((checkpoint.segment_base_offset, dir.join(&staged_name), false));
        }
        if checkpoint.op > 0
            && !files.iter().any(|(base, ..)| *base == checkpoint.segment_base_offset)
        {
            self.problem(&checkpoint_file, at_checkpoint, "the checkpoint's segment is missing");
            walk.damaged = true;
        }
        for (base, path, has_index) in files {
            let segment = self.segment(&mut walk, &path, base, has_index).await;
            if !segment.leftover {
                if report.first_op.is_none() {
                    report.first_op = segment.first_op;
                    report.first_offset = segment.first_offset;
                }
                if segment.last_op.is_some() {
                    report.last_op = segment.last_op;
                    report.next_offset = segment.next_offset;
                }
                report.records += segment.records;
                report.valid_bytes += segment.valid_bytes;
            }
            report.segments.push(segment);
        }
        if checkpoint.op > 0 && !walk.checkpoint_seen && !walk.damaged {
            let (file, at) = walk.end_at.clone().unwrap_or((checkpoint_file, at_checkpoint));
            self.problem(
                &file,
                at,
                format!(
                    "the chain ends at op {} before the checkpoint op {}",
                    report.last_op.unwrap_or(0),
                    checkpoint.op
                ),
            );
        }
        let end = match walk.chain {
            Chain::Expect(next) | Chain::Ended(next) if !walk.damaged => Some(next),
            _ => None,
        };
        (report, end)
    }

    async fn segment(
        &mut self,
        walk: &mut GroupWalk,
        path: &Path,
        base: u64,
        has_index: bool,
    ) -> SegmentReport {
        let mut report = SegmentReport {
            file: path.to_path_buf(),
            base_offset: base,
            ..SegmentReport::default()
        };
        let file = match self.storage.open(path, OpenMode::Read, false).await {
            Ok(file) => file,
            Err(error) => {
                let at = At::expecting(0, walk.expected());
                self.problem(path, at, format!("cannot open the segment: {error}"));
                walk.break_chain();
                report.end = SegmentEnd::Unreadable(error.to_string());
                return report;
            }
        };
        let mut scanner = match Scanner::new(&file, WINDOW_BYTES).await {
            Ok(scanner) => scanner,
            Err(error) => {
                let at = At::expecting(0, walk.expected());
                self.problem(path, at, format!("cannot read the segment: {error}"));
                walk.break_chain();
                report.end = SegmentEnd::Unreadable(error.to_string());
                return report;
            }
        };
        report.file_size_bytes = file.size_bytes().await.unwrap_or(0);

        // Does the chain go on in this segment? Recovery asks the same of every segment after
        // the first, and deletes the ones where it does not.
        if let Chain::Expect(next) | Chain::Ended(next) = walk.chain {
            let first = scanner.record_at(0, walk.record_max).await;
            let fault = match &first {
                Ok(bytes) => check_next(bytes, &next, &walk.fence, walk.record_max).err(),
                Err(error) => Some(RecordFault::BadHeader(format!("read error: {error}"))),
            };
            if let Some(fault) = fault {
                if matches!(walk.chain, Chain::Expect(_)) && walk.before_checkpoint(&next, base) {
                    self.problem(
                        path,
                        At::expecting(0, Some(&next)),
                        format!(
                            "the chain breaks at the start of the segment (expected op {} at \
                             offset {}): {fault}",
                            next.op, next.offset
                        ),
                    );
                    walk.break_chain();
                } else {
                    walk.chain = Chain::Ended(next);
                    report.leftover = true;
                    report.end = SegmentEnd::NotScanned;
                    self.note(
                        path.to_path_buf(),
                        Some(0),
                        format!(
                            "segment past the chain's end (torn-window leftover; recovery \
                             deletes it): {fault}"
                        ),
                    );
                    return report;
                }
            } else {
                walk.chain = Chain::Expect(next);
            }
        }

        let index_path = path.with_file_name(index_name(base));
        let index = if has_index {
            Some(self.read_index(&index_path, report.file_size_bytes).await)
        } else {
            None
        };
        let mut index_check = match &index {
            Some(Ok((index, _))) => Some(IndexCheck::new(index.entries())),
            _ => None,
        };
        let problems_before = self.problems.len();
        let mut position = 0u64;
        let mut last_append_ms = i64::MIN;
        report.end = loop {
            let bytes = match scanner.record_at(position, walk.record_max).await {
                Ok(bytes) => bytes,
                Err(error) => {
                    let at = At::expecting(position, walk.expected());
                    self.problem(path, at, format!("read error: {error}"));
                    walk.break_chain();
                    break SegmentEnd::Unreadable(error.to_string());
                }
            };
            let checked = match (&walk.chain, walk.cluster) {
                (Chain::Expect(next), _) => check_next(&bytes, next, &walk.fence, walk.record_max),
                (_, Some(cluster)) => {
                    check_standalone(&bytes, cluster, walk.group, walk.record_max)
                }
                // No superblock says whose cluster this is: believe the first record's.
                (_, None) => {
                    let cluster = Header::decode_prefix(&bytes).map_or(0, |header| header.cluster);
                    check_standalone(&bytes, cluster, walk.group, walk.record_max)
                }
            };
            let checked = checked.and_then(|header| {
                let prepare = prepare_of(&header);
                let here = walk.expected().copied().unwrap_or(ChainNext {
                    cluster: header.cluster,
                    group: walk.group,
                    op: prepare.op,
                    parent: prepare.parent,
                    offset: prepare.base_offset,
                });
                chain_after(&here, &header).map(|next| (header, next)).ok_or_else(|| {
                    RecordFault::BadHeader("op or offset at the end of the u64 range".into())
                })
            });
            let (header, next) = match checked {
                Ok(checked) => checked,
                Err(fault) => {
                    match self.end_of_data(walk, &mut scanner, path, base, position, fault).await {
                        EndOfData::SkipTo(next_position) => {
                            position = next_position;
                            report.damaged_records += 1;
                            report.valid_bytes = position;
                            continue;
                        }
                        EndOfData::End(end) => break end,
                    }
                }
            };
            let prepare = prepare_of(&header);
            if position == 0 && prepare.base_offset != base {
                self.problem(
                    path,
                    At {
                        position_bytes: 0,
                        offset: Some(prepare.base_offset),
                        op: Some(prepare.op),
                    },
                    format!(
                        "the file name says base offset {base}, its first record starts at \
                         offset {}",
                        prepare.base_offset
                    ),
                );
            }
            self.checkpoint_record(walk, path, base, position, &header);
            if let Some(check) = &mut index_check {
                check.observe(&header, position);
            }
            if report.records == 0 {
                report.first_op = Some(prepare.op);
                report.first_offset = Some(prepare.base_offset);
            }
            report.records += 1;
            report.last_op = Some(prepare.op);
            report.next_offset = Some(next.offset);
            last_append_ms = last_append_ms.max(prepare.append_time_ms);
            position += u64::from(header.size);
            report.valid_bytes = position;
            walk.cluster.get_or_insert(header.cluster);
            walk.chain = Chain::Expect(next);
        };
        walk.end_at = Some((path.to_path_buf(), At::expecting(position, walk.expected())));

        let damaged = self.problems.len() > problems_before;
        report.index = match index {
            None => IndexStatus::Missing,
            Some(Err(reason)) => {
                self.note(
                    index_path,
                    None,
                    format!("index file damaged (recovery rebuilds it): {reason}"),
                );
                IndexStatus::Damaged(reason)
            }
            Some(Ok((index, summary))) => {
                let entries = index.entries().len();
                let scanned = IndexSummary {
                    covered_bytes: report.valid_bytes,
                    next_offset: report.next_offset.unwrap_or(base),
                    last_op: report.last_op.unwrap_or(0),
                    last_append_ms,
                };
                match index_check.and_then(|check| check.finish(&summary, &scanned)) {
                    _ if damaged => IndexStatus::NotCompared { entries },
                    None => IndexStatus::Ok { entries },
                    Some(reason) => {
                        let message = format!("index disagrees with its segment: {reason}");
                        // Recovery takes a synced segment's index on trust, without scanning:
                        // a wrong one there misplaces reads, so it is damage. Elsewhere the
                        // index is rebuilt before use.
                        if walk.checkpoint.op > 0 && base < walk.checkpoint.segment_base_offset {
                            self.problem(&index_path, At::byte(0), message);
                        } else {
                            self.note(index_path, None, message);
                        }
                        IndexStatus::Disagrees(reason)
                    }
                }
            }
        };
        report
    }

    /// Checks the record of the checkpoint op against what the superblock says of it.
    fn checkpoint_record(
        &mut self,
        walk: &mut GroupWalk,
        path: &Path,
        base: u64,
        position: u64,
        header: &Header,
    ) {
        let checkpoint = walk.checkpoint;
        let prepare = prepare_of(header);
        if checkpoint.op == 0 || prepare.op != checkpoint.op {
            return;
        }
        walk.checkpoint_seen = true;
        let next_offset = prepare.base_offset.saturating_add(u64::from(prepare.record_count));
        let mut wrong = Vec::new();
        if base != checkpoint.segment_base_offset {
            wrong.push(format!("segment {base} (superblock: {})", checkpoint.segment_base_offset));
        }
        if position != checkpoint.position_bytes {
            wrong.push(format!("position {position} (superblock: {})", checkpoint.position_bytes));
        }
        if header.checksum_header != checkpoint.checksum {
            wrong.push(format!(
                "checksum {:#010x} (superblock: {:#010x})",
                header.checksum_header, checkpoint.checksum
            ));
        }
        if next_offset != checkpoint.next_offset {
            wrong.push(format!(
                "next offset {next_offset} (superblock: {})",
                checkpoint.next_offset
            ));
        }
        if !wrong.is_empty() {
            self.problem(
                path,
                At {
                    position_bytes: position,
                    offset: Some(prepare.base_offset),
                    op: Some(prepare.op),
                },
                format!(
                    "the checkpoint record is not where the superblock says: {}",
                    wrong.join(", ")
                ),
            );
        }
    }

    /// Classifies what lies where the next valid record should be.
    async fn end_of_data<F: StorageFile>(
        &mut self,
        walk: &mut GroupWalk,
        scanner: &mut Scanner<'_, F>,
        path: &Path,
        base: u64,
        position: u64,
        fault: RecordFault,
    ) -> EndOfData {
        if matches!(fault, RecordFault::Zeroed) {
            // Zeros end the data. Bytes after a zeroed gap are stale records the engine left on
            // purpose (a truncation zeroes only the blocks at the cut; a recycled segment file
            // keeps its retired segment's records past the data), never read again.
            return match first_nonzero(scanner, position).await {
                Ok(None) => EndOfData::End(SegmentEnd::Clean),
                Ok(Some(stale)) => {
                    self.note(
                        path.to_path_buf(),
                        Some(stale),
                        format!("stale data after the end of data (which is at byte {position})"),
                    );
                    EndOfData::End(SegmentEnd::DataAfterEnd {
                        position_bytes: stale,
                        reason: "stale data after a zeroed gap".into(),
                        corruption: false,
                    })
                }
                Err(error) => {
                    let at = At::expecting(position, walk.expected());
                    self.problem(path, at, format!("read error: {error}"));
                    EndOfData::End(SegmentEnd::Unreadable(error.to_string()))
                }
            };
        }
        let synced = match walk.expected() {
            Some(next) => walk.before_checkpoint(next, base),
            None => walk.checkpoint.op > 0 && base <= walk.checkpoint.segment_base_offset,
        };
        if !synced {
            self.note(
                path.to_path_buf(),
                Some(position),
                format!("data after the end of the chain (torn window): {fault}"),
            );
            return EndOfData::End(SegmentEnd::DataAfterEnd {
                position_bytes: position,
                reason: fault.to_string(),
                corruption: false,
            });
        }
        let at = At::expecting(position, walk.expected());
        self.problem(path, at, format!("damaged record before the checkpoint: {fault}"));
        walk.damaged = true;
        // A sound header still says where the next record starts: step over the damage so the
        // rest of the log is checked and its ranges reported.
        if matches!(
            fault,
            RecordFault::BadBody | RecordFault::Foreign | RecordFault::ChainBreak { .. }
        ) && let Ok(bytes) = scanner.bytes_at(position, HEADER_SIZE).await
            && let Ok(header) = Header::decode_prefix(&bytes)
            && let Some(prepare) = header.as_prepare()
            && (header.size as usize) <= walk.record_max
            && let Some(after) = chain_after(
                &ChainNext {
                    cluster: walk.cluster.unwrap_or(header.cluster),
                    group: walk.group,
                    op: prepare.op,
                    parent: prepare.parent,
                    offset: prepare.base_offset,
                },
                &header,
            )
        {
            walk.chain = Chain::Expect(after);
            return EndOfData::SkipTo(position + u64::from(header.size));
        }
        walk.break_chain();
        EndOfData::End(SegmentEnd::DataAfterEnd {
            position_bytes: position,
            reason: fault.to_string(),
            corruption: true,
        })
    }

    /// Reads and decodes an index file, bounded by what its segment could need: at most one
    /// entry per record, and no record is shorter than a header.
    async fn read_index(
        &mut self,
        path: &Path,
        segment_size_bytes: u64,
    ) -> Result<(SegmentIndex, IndexSummary), String> {
        let entries_max = usize::try_from(segment_size_bytes / HEADER_SIZE as u64 + 1)
            .map_err(|_| "segment too large".to_string())?;
        let size_max = INDEX_HEADER_SIZE_BYTES
            .saturating_add(entries_max.saturating_mul(INDEX_ENTRY_SIZE_BYTES));
        let file = self
            .storage
            .open(path, OpenMode::Read, false)
            .await
            .map_err(|e| format!("cannot open: {e}"))?;
        let size = file.size_bytes().await.map_err(|e| format!("cannot size: {e}"))?;
        if size > size_max as u64 {
            return Err(format!("{size} bytes, more than its segment could need ({size_max})"));
        }
        let bytes =
            read_range(&file, 0, size as usize).await.map_err(|e| format!("read error: {e}"))?;
        SegmentIndex::decode(&bytes, entries_max)
    }

    // ---------------------------------------------------------------------------------------
    // Journal
    // ---------------------------------------------------------------------------------------

    /// Scans the journal as recovery does (entries contiguous within a cycle, cycles on block
    /// boundaries), checks that every entry the newest one says was synced and still needed is
    /// there, and what each group's needed entries add past its segments.
    async fn journal(
        &mut self,
        dir: &Path,
        state: Option<&SuperblockState>,
        heads: &BTreeMap<u64, Option<ChainNext>>,
    ) -> Option<JournalReport> {
        let path = dir.join(crate::journal::FILE_NAME);
        match self.storage.exists(&path).await {
            Ok(true) => {}
            // Shard::open creates the journal with the superblock: a shard without one lost it.
            Ok(false) => {
                self.problem(&path, At::byte(0), "journal missing");
                return None;
            }
            Err(error) => {
                self.problem(&path, At::byte(0), format!("cannot probe the journal: {error}"));
                return None;
            }
        }
        let file = match self.storage.open(&path, OpenMode::Read, false).await {
            Ok(file) => file,
            Err(error) => {
                self.problem(&path, At::byte(0), format!("cannot open the journal: {error}"));
                return None;
            }
        };
        let mut report = JournalReport { file: path.clone(), ..JournalReport::default() };
        let mut scanner = match Scanner::new(&file, WINDOW_BYTES).await {
            Ok(scanner) => scanner,
            Err(error) => {
                self.problem(&path, At::byte(0), format!("cannot read the journal: {error}"));
                return Some(report);
            }
        };
        report.file_size_bytes = file.size_bytes().await.unwrap_or(0);
        if !report.file_size_bytes.is_multiple_of(BLOCK_SIZE_BYTES as u64) {
            self.note(
                path.clone(),
                None,
                format!("journal size {} is not block-aligned", report.file_size_bytes),
            );
        }
        let record_max = state
            .and_then(|s| s.groups.values().map(|g| g.config.record_size_bytes_max as usize).max())
            .unwrap_or(RECORD_SIZE_FALLBACK_BYTES);
        let entry_max = HEADER_SIZE + record_max;
        let block = BLOCK_SIZE_BYTES as u64;
        let mut found: BTreeMap<u64, JournalFound> = BTreeMap::new();
        let mut position = 0u64;
        while position + HEADER_SIZE as u64 <= report.file_size_bytes {
            let bytes = match scanner.record_at(position, entry_max).await {
                Ok(bytes) => bytes,
                Err(error) => {
                    self.problem(&path, At::byte(position), format!("read error: {error}"));
                    break;
                }
            };
            let Some(entry) = decode_journal_entry(&bytes, entry_max, position) else {
                position = (position + 1).next_multiple_of(block);
                continue;
            };
            position += entry.size_bytes;
            if let Some(first) = found.get(&entry.fields.seq) {
                self.note(
                    path.clone(),
                    Some(entry.position_bytes),
                    format!(
                        "journal entry seq {} appears again (first at byte {})",
                        entry.fields.seq, first.position_bytes
                    ),
                );
                continue;
            }
            found.insert(entry.fields.seq, entry);
        }
        report.entries_valid = found.len() as u64;
        report.markers = found.values().filter(|e| e.inner.is_none()).count() as u64;
        let (Some((&seq_first, _)), Some((&seq_last, newest))) =
            (found.first_key_value(), found.last_key_value())
        else {
            return Some(report);
        };
        report.seq_first = Some(seq_first);
        report.seq_last = Some(seq_last);
        report.durable_seq = found.values().map(|e| e.fields.durable_seq).max().unwrap_or(0);
        report.tail_seq = newest.fields.tail_seq.max(1);

        // Every entry the newest says was synced and still needed must be here: a missing one
        // may have been acknowledged. `tail_seq` only moves when an entry is written, so after
        // the last checkpoints (a clean close) it still names entries they cover. A missing seq
        // is provably covered when every persisted group has a later entry at or below its
        // checkpoint (a group's ops grow with seq): such a loss is a note, not damage.
        let synced_last = report.durable_seq.min(seq_last);
        let covered_below = covered_below(&found, state);
        let uncovered_from = report.tail_seq.max(covered_below);
        if let Some((missing, absent)) = first_missing(
            &found,
            report.tail_seq,
            synced_last.min(uncovered_from.saturating_sub(1)),
        ) {
            self.note(
                path.clone(),
                Some(entry_end_before(&found, missing)),
                format!(
                    "{absent} journal entries from seq {missing} are missing or damaged, but \
                     checkpoints cover them (recovery still counts them as synced losses)"
                ),
            );
        }
        if let Some((missing, absent)) = first_missing(&found, uncovered_from, synced_last) {
            self.problem(
                &path,
                At::byte(entry_end_before(&found, missing)),
                format!(
                    "journal entry seq {missing} was synced but is missing or damaged ({absent} \
                     of seq {uncovered_from}..={synced_last} missing)"
                ),
            );
        }

        // What the needed entries hold, per group, in op order (as recovery replays them).
        let mut by_group: BTreeMap<u64, Vec<&JournalFound>> = BTreeMap::new();
        for entry in found.range(report.tail_seq..).map(|(_, e)| e) {
            let Some(prepare) = entry.prepare() else { continue };
            if !entry.inner_body_ok {
                let at = At {
                    position_bytes: entry.position_bytes,
                    offset: Some(prepare.base_offset),
                    op: Some(prepare.op),
                };
                if entry.fields.seq <= report.durable_seq {
                    self.problem(&path, at, "journal entry holds a prepare whose body is damaged");
                } else {
                    self.note(path.clone(), Some(at.position_bytes), "torn journal entry");
                }
                continue;
            }
            by_group.entry(prepare.group).or_default().push(entry);
        }
        for (group, mut entries) in by_group {
            sort_for_replay(&mut entries);
            let mut summary = JournalGroup {
                group,
                entries: entries.len() as u64,
                first_op: entries.first().map_or(0, |e| e.op()),
                last_op: entries.last().map_or(0, |e| e.op()),
                replayable: 0,
            };
            let slot = state.and_then(|s| s.groups.get(&group));
            let cluster = state.map(|s| s.identity.cluster);
            if slot.is_none() {
                self.note(
                    path.clone(),
                    entries.first().map(|e| e.position_bytes),
                    format!("journal entries of group {group}, which the superblock does not name"),
                );
            } else if let Some(cluster) = cluster
                && let Some(foreign) = entries.iter().find(|e| e.cluster != cluster)
            {
                self.note(
                    path.clone(),
                    Some(foreign.position_bytes),
                    format!("journal entry of cluster {}, not {cluster}", foreign.cluster),
                );
            } else if let (Some(slot), Some(Some(head))) = (slot, heads.get(&group)) {
                summary.replayable =
                    self.journal_replay(&path, &entries, *head, slot.fence, report.durable_seq);
            }
            report.groups.push(summary);
        }
        Some(report)
    }

    /// Walks a group's needed journal entries past its segments' end like recovery's replay:
    /// returns how many continue the chain. A gap before a synced entry is a lost op.
    fn journal_replay(
        &mut self,
        path: &Path,
        entries: &[&JournalFound],
        head: ChainNext,
        fence: Fence,
        durable_seq: u64,
    ) -> u64 {
        let mut next = head;
        let mut replayable = 0;
        for entry in entries {
            let (Some(inner), Some(prepare)) = (entry.inner.as_ref(), entry.prepare()) else {
                continue;
            };
            // As recovery: entries below the chain's next op, and entries the fence killed (a
            // truncated suffix's, which may lie past a gap their own truncation left), are
            // skipped before any gap is judged.
            if prepare.op < next.op
                || fence.kills_journal_entry(prepare.op, inner.view, entry.fields.seq)
            {
                continue;
            }
            if prepare.op > next.op {
                let message = format!(
                    "journal holds op {} of group {} but op {} is in neither the segments nor \
                     the journal",
                    prepare.op, prepare.group, next.op
                );
                if entry.fields.seq <= durable_seq {
                    let at = At {
                        position_bytes: entry.position_bytes,
                        offset: Some(next.offset),
                        op: Some(next.op),
                    };
                    self.problem(path, at, message);
                } else {
                    self.note(path.to_path_buf(), Some(entry.position_bytes), message);
                }
                break;
            }
            if prepare.parent != next.parent || prepare.base_offset != next.offset {
                // Recovery skips it too: a stale entry of a truncated view.
                continue;
            }
            let Some(after) = chain_after(&next, inner) else { break };
            replayable += 1;
            next = after;
        }
        replayable
    }
}

/// Orders a group's journal entries as recovery replays them: op order, and within an op the
/// newest view first (a later view's prepare of an op supersedes an older one, whatever their
/// journal sequence).
fn sort_for_replay(entries: &mut [&JournalFound]) {
    entries.sort_by_key(|e| {
        let view = e.inner.as_ref().map_or(0, |inner| inner.view);
        (e.op(), std::cmp::Reverse(view), e.fields.seq)
    });
}

/// The chain position after `header`, like [`ChainNext::after`] but refusing (rather than
/// overflowing on) an op or offset at the end of the u64 range, which a hostile file can hold
/// behind valid checksums.
fn chain_after(here: &ChainNext, header: &Header) -> Option<ChainNext> {
    let prepare = header.as_prepare()?;
    Some(ChainNext {
        cluster: here.cluster,
        group: here.group,
        op: prepare.op.checked_add(1)?,
        parent: header.checksum_header,
        offset: prepare.base_offset.checked_add(u64::from(prepare.record_count))?,
    })
}

/// The first seq missing from `found` in `from..=to`, and how many are missing there.
fn first_missing(found: &BTreeMap<u64, JournalFound>, from: u64, to: u64) -> Option<(u64, u64)> {
    if from > to {
        return None;
    }
    let mut expected = from;
    let mut first = None;
    for &seq in found.range(from..=to).map(|(seq, _)| seq) {
        if seq != expected {
            first.get_or_insert(expected);
        }
        expected = seq + 1;
    }
    if expected <= to {
        first.get_or_insert(expected);
    }
    let present = found.range(from..=to).count() as u64;
    first.map(|first| (first, (to - from).saturating_add(1).saturating_sub(present)))
}

/// Where the entry before `seq` ends: where `seq` would have been, or the closest to it.
fn entry_end_before(found: &BTreeMap<u64, JournalFound>, seq: u64) -> u64 {
    found.range(..seq).next_back().map_or(0, |(_, e)| e.position_bytes + e.size_bytes)
}

/// Seqs below the returned one are covered by checkpoints whatever group they held: every
/// persisted group has an entry at or past that seq whose op its checkpoint covers.
fn covered_below(found: &BTreeMap<u64, JournalFound>, state: Option<&SuperblockState>) -> u64 {
    let Some(state) = state else { return 0 };
    let mut bound = u64::MAX;
    for slot in state.groups.values().filter(|s| s.config.durability == Durability::Persisted) {
        let newest_covered = found
            .values()
            .filter(|e| {
                e.prepare().is_some_and(|prepare| {
                    prepare.group == slot.group && prepare.op <= slot.checkpoint.op
                })
            })
            .map(|e| e.fields.seq)
            .max();
        bound = bound.min(newest_covered.unwrap_or(0));
    }
    if bound == u64::MAX { 0 } else { bound }
}

/// A group's chain while its segments are walked.
struct GroupWalk {
    /// The cluster every record must carry (None: no superblock; taken from the first record).
    cluster: Option<u64>,
    group: u64,
    checkpoint: Checkpoint,
    fence: Fence,
    record_max: usize,
    chain: Chain,
    /// The record the checkpoint names was found.
    checkpoint_seen: bool,
    /// A problem already broke or damaged the chain: later consequences are not new findings.
    damaged: bool,
    /// Where the data of the last scanned segment ended.
    end_at: Option<(PathBuf, At)>,
}

impl GroupWalk {
    fn expected(&self) -> Option<&ChainNext> {
        match &self.chain {
            Chain::Expect(next) => Some(next),
            Chain::Anchor | Chain::Ended(_) => None,
        }
    }

    fn break_chain(&mut self) {
        self.chain = Chain::Anchor;
        self.damaged = true;
    }

    /// Whether the record `next` describes, in segment `base`, lies before the torn window:
    /// the checkpoint op is not reached yet, or the segment is older than the checkpoint's
    /// (synced whole when it rolled).
    fn before_checkpoint(&self, next: &ChainNext, base: u64) -> bool {
        self.checkpoint.op > 0
            && (next.op <= self.checkpoint.op || base < self.checkpoint.segment_base_offset)
    }
}

enum EndOfData {
    /// The damaged record could be stepped over: continue here.
    SkipTo(u64),
    /// The segment's data ends.
    End(SegmentEnd),
}

/// Compares an index file's entries with the records a scan finds, one record at a time, so
/// the segment is never held whole.
struct IndexCheck {
    entries: Vec<IndexEntry>,
    next: usize,
    mismatch: Option<String>,
}

impl IndexCheck {
    fn new(entries: &[IndexEntry]) -> Self {
        Self { entries: entries.to_vec(), next: 0, mismatch: None }
    }

    fn fail(&mut self, reason: String) {
        self.mismatch.get_or_insert(reason);
    }

    fn observe(&mut self, header: &Header, position: u64) {
        let prepare = prepare_of(header);
        while let Some(entry) = self.entries.get(self.next).copied()
            && entry.position_bytes < position
        {
            self.fail(format!(
                "entry {} points at byte {}, which is not a record start",
                self.next, entry.position_bytes
            ));
            self.next += 1;
        }
        if let Some(entry) = self.entries.get(self.next).copied()
            && entry.position_bytes == position
        {
            if (entry.op, entry.offset, entry.append_time_ms)
                != (prepare.op, prepare.base_offset, prepare.append_time_ms)
            {
                self.fail(format!(
                    "entry {} says op {} offset {} at byte {position}, the record there is op {} \
                     offset {}",
                    self.next, entry.op, entry.offset, prepare.op, prepare.base_offset
                ));
            }
            self.next += 1;
        }
    }

    fn finish(mut self, summary: &IndexSummary, scanned: &IndexSummary) -> Option<String> {
        if let Some(entry) = self.entries.get(self.next).copied() {
            self.fail(format!(
                "entry {} points at byte {}, past the segment's data",
                self.next, entry.position_bytes
            ));
        }
        // The append time is left out: it only steers time lookups, and the engine derives it
        // from index entries after a restart, so it may trail the newest record's.
        if (summary.covered_bytes, summary.next_offset, summary.last_op)
            != (scanned.covered_bytes, scanned.next_offset, scanned.last_op)
        {
            self.fail(format!(
                "summary says {} bytes, next offset {}, last op {}; the segment holds {} bytes, \
                 next offset {}, last op {}",
                summary.covered_bytes,
                summary.next_offset,
                summary.last_op,
                scanned.covered_bytes,
                scanned.next_offset,
                scanned.last_op
            ));
        }
        self.mismatch
    }
}

/// One journal entry that decoded.
struct JournalFound {
    position_bytes: u64,
    size_bytes: u64,
    fields: crate::wire::JournalEntry,
    /// The outer header's cluster.
    cluster: u64,
    /// The prepare it frames (None: a marker, which only announces what is durable).
    inner: Option<Header>,
    inner_body_ok: bool,
}

impl JournalFound {
    fn prepare(&self) -> Option<&crate::wire::Prepare> {
        self.inner.as_ref().and_then(Header::as_prepare)
    }

    fn op(&self) -> u64 {
        self.prepare().map_or(0, |prepare| prepare.op)
    }
}

/// Decodes a journal entry at the start of `bytes` with the checks recovery makes (outer
/// header and body checksum, an inner prepare that fills the body, one cluster; or a marker,
/// a bare header); also notes whether the inner prepare's own body checksum holds.
fn decode_journal_entry(bytes: &[u8], entry_max: usize, position: u64) -> Option<JournalFound> {
    let (outer, fields, inner) = crate::journal::decode_entry(bytes, entry_max)?;
    let size = outer.size as usize;
    // The outer checksum covers the framed record; its own body checksum is checked apart so a
    // record that was framed damaged is told from one damaged at rest.
    let inner_body_ok =
        inner.is_none_or(|inner| inner.verify_body(&bytes[2 * HEADER_SIZE..size]).is_ok());
    Some(JournalFound {
        position_bytes: position,
        size_bytes: size as u64,
        fields,
        cluster: outer.cluster,
        inner,
        inner_body_ok,
    })
}

/// The size of one superblock copy's region. Copy 0's header names the slot bound that fixes
/// it; when copy 0 is damaged, sizes the file allows are probed at the later copies.
async fn copy_size<F: StorageFile>(file: &F, file_size: u64) -> Option<usize> {
    if let Some(size) = copy_size_at(file, 0, None).await {
        return Some(size);
    }
    // Three whole copies precede the last, which holds at least one block.
    let block = BLOCK_SIZE_BYTES as u64;
    let low = (file_size / COPIES as u64).next_multiple_of(block).max(block);
    let high = file_size.saturating_sub(block) / (COPIES as u64 - 1);
    let mut candidate = low;
    let mut probes = 0;
    while candidate <= high && probes < COPY_SIZE_PROBES_MAX {
        let size = usize::try_from(candidate).ok()?;
        for copy in 1..COPIES {
            if copy_size_at(file, candidate * copy as u64, Some(size)).await.is_some() {
                return Some(size);
            }
        }
        candidate += block;
        probes += 1;
    }
    None
}

/// The copy size the copy at `position` names, if that copy decodes (and has `expected` size).
async fn copy_size_at<F: StorageFile>(
    file: &F,
    position: u64,
    expected: Option<usize>,
) -> Option<usize> {
    let head = read_range(file, position, superblock::HEADER_SIZE_BYTES).await.ok()?;
    let slots_max = head.get(SUPERBLOCK_OFF_SLOTS_MAX..SUPERBLOCK_OFF_SLOTS_MAX + 4)?;
    let slots_max = u32::from_le_bytes(slots_max.try_into().ok()?) as usize;
    let size = superblock::copy_size_bytes(slots_max);
    if size > COPY_SIZE_MAX_BYTES || expected.is_some_and(|expected| expected != size) {
        return None;
    }
    let mut bytes = read_range(file, position, size).await.ok()?;
    bytes.resize(size, 0);
    superblock::decode_copy(&bytes).ok().map(|_| size)
}

/// Up to `len` bytes at `position` (fewer at end of file). Callers bound `len`.
async fn read_range<F: StorageFile>(
    file: &F,
    position: u64,
    len: usize,
) -> std::io::Result<Vec<u8>> {
    let (result, buffer) = file.read_at(AlignedBuf::zeroed(len.max(1), 1), position).await;
    result?;
    let bytes = buffer.as_slice();
    Ok(bytes[..bytes.len().min(len)].to_vec())
}

/// The position of the first non-zero byte at or after `from`, read window by window.
async fn first_nonzero<F: StorageFile>(
    scanner: &mut Scanner<'_, F>,
    from: u64,
) -> std::io::Result<Option<u64>> {
    let mut position = from;
    loop {
        let bytes = scanner.bytes_at(position, WINDOW_BYTES).await?;
        if bytes.is_empty() {
            return Ok(None);
        }
        if let Some(index) = bytes.iter().position(|&b| b != 0) {
            return Ok(Some(position + index as u64));
        }
        position += bytes.len() as u64;
    }
}

fn parse_digits<T: std::str::FromStr>(digits: &str, len: Option<usize>) -> Option<T> {
    if digits.is_empty()
        || len.is_some_and(|len| digits.len() != len)
        || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    digits.parse().ok()
}

/// The shard index of a `shard-N` directory name.
fn parse_shard_dir(name: &str) -> Option<u32> {
    parse_digits(name.strip_prefix("shard-")?, None)
}

/// The group id of a `group-<20 digits>` directory name.
fn parse_group_dir(name: &str) -> Option<u64> {
    parse_digits(name.strip_prefix("group-")?, Some(20))
}

/// How a durability mode reads in reports.
#[must_use]
pub fn durability_name(durability: Durability) -> &'static str {
    match durability {
        Durability::Replicated => "replicated",
        Durability::Persisted => "persisted",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::build_prepare;
    use crate::shard::{Shard, ShardConfig, group_dir, shard_dir};
    use crate::storage::sim::{Sim, SimConfig, SimStorage};
    use crate::superblock::GroupConfig;
    use crate::wire::Prepare;
    use bytes::Bytes;
    use shoal_proto::batch::BatchBuilder;

    const GROUP: u64 = 3;

    /// Builds `/data/shard-0` with one group of `prepares` prepares (5 records each), closed
    /// cleanly (so everything is checkpointed).
    fn build(sim: &Sim, durability: Durability, prepares: u32) {
        let dir = shard_dir(Path::new("/data"), 0);
        let (mut shard, _) =
            sim.block_on(Shard::open(sim.storage(), &dir, ShardConfig::small())).unwrap();
        let config = GroupConfig {
            durability,
            segment_size_bytes: 1 << 20,
            record_size_bytes_max: 64 << 10,
            ..GroupConfig::default()
        };
        sim.block_on(shard.create_group(GROUP, config)).unwrap();
        for i in 0..prepares {
            let mut builder = BatchBuilder::new(1_000 + i64::from(i));
            for _ in 0..5 {
                builder.push(1_000 + i64::from(i), None, Some(&[b'x'; 2000]), &[]);
            }
            let body = builder.build();
            let fields = Prepare {
                record_count: 5,
                append_time_ms: 1_000 + i64::from(i),
                ..Prepare::default()
            };
            let header = build_prepare(&shard.next(GROUP).unwrap(), 1, 0, fields, &body);
            shard.append(GROUP, &header, &body).unwrap();
            if i % 16 == 15 {
                sim.block_on(shard.flush()).unwrap();
            }
        }
        sim.block_on(shard.flush()).unwrap();
        sim.block_on(shard.close()).unwrap();
    }

    fn run(sim: &Sim, path: &str) -> InspectReport {
        sim.block_on(inspect(&sim.storage(), Path::new(path)))
    }

    #[test]
    fn clean_shard_on_the_simulated_disk_is_clean() {
        for durability in [Durability::Replicated, Durability::Persisted] {
            let sim = Sim::new(11, SimConfig::default());
            build(&sim, durability, 300);
            let report = run(&sim, "/data");
            assert!(report.is_clean(), "{:#?}", report.problems);
            assert_eq!(report.shards.len(), 1);
            let shard = &report.shards[0];
            assert_eq!(shard.superblock.copies.len(), COPIES);
            assert!(shard.superblock.copies.iter().all(|c| c.status.as_ref().unwrap().current));
            let group = &shard.groups[0];
            assert_eq!((group.first_op, group.last_op), (Some(1), Some(300)));
            assert_eq!((group.first_offset, group.next_offset), (Some(0), Some(1500)));
            assert!(group.segments.len() > 1, "300 x ~10 KiB rolls 1 MiB segments");
            for pair in group.segments.windows(2) {
                assert_eq!(pair[0].next_offset, Some(pair[1].base_offset));
                assert_eq!(pair[0].index, IndexStatus::Ok { entries: pair[0].index_entries() });
            }
            let journal = shard.journal.as_ref().unwrap();
            if durability == Durability::Persisted {
                assert!(journal.entries_valid > 0);
            }
            // The same shard inspected through its own directory.
            assert!(run(&sim, "/data/shard-0").is_clean());
        }
    }

    impl SegmentReport {
        fn index_entries(&self) -> usize {
            match self.index {
                IndexStatus::Ok { entries } | IndexStatus::NotCompared { entries } => entries,
                _ => 0,
            }
        }
    }

    #[test]
    fn bit_flip_before_the_checkpoint_names_file_position_and_offset() {
        let sim = Sim::new(12, SimConfig::default());
        build(&sim, Durability::Replicated, 300);
        let report = run(&sim, "/data");
        let segment = &report.shards[0].groups[0].segments[1];
        let flipped = segment.valid_bytes / 2 + 7;
        sim.corrupt(&segment.file, flipped, 3);
        let report = run(&sim, "/data");
        assert!(!report.is_clean());
        let first = report.first_corruption().unwrap();
        assert_eq!(first.file, segment.file);
        assert!(first.position_bytes <= flipped && flipped - first.position_bytes < 64 << 10);
        let offset = first.offset.unwrap();
        assert!((segment.base_offset..segment.next_offset.unwrap()).contains(&offset));
        // Stepping over the damaged record keeps the rest of the log checked and reported.
        let group = &report.shards[0].groups[0];
        assert_eq!(group.last_op, Some(300));
        assert_eq!(report.problems.len(), 1, "{:#?}", report.problems);
    }

    #[test]
    fn one_torn_superblock_copy_is_a_problem_but_the_state_is_still_read() {
        for copy in 0..COPIES as u64 {
            let sim = Sim::new(13, SimConfig::default());
            build(&sim, Durability::Persisted, 20);
            let path = Path::new("/data/shard-0/superblock");
            let copy_size = superblock::copy_size_bytes(ShardConfig::small().groups_max) as u64;
            sim.corrupt(path, copy * copy_size + 30, 0);
            let report = run(&sim, "/data");
            let superblock = &report.shards[0].superblock;
            assert_eq!(superblock.copy_size_bytes, copy_size, "copy {copy}");
            assert!(superblock.state.is_some());
            assert_eq!(report.problems.len(), 1, "{:#?}", report.problems);
            assert_eq!(report.problems[0].position_bytes, copy * copy_size);
            assert!(report.problems[0].reason.contains(&format!("copy {copy} invalid")));
            assert_eq!(report.shards[0].groups[0].last_op, Some(20));
        }
    }

    #[test]
    fn synced_journal_entries_past_the_checkpoint_must_be_there() {
        let sim = Sim::new(16, SimConfig::default());
        build(&sim, Durability::Persisted, 10);
        let dir = shard_dir(Path::new("/data"), 0);
        let (mut shard, _) =
            sim.block_on(Shard::open(sim.storage(), &dir, ShardConfig::small())).unwrap();
        for i in 0..5 {
            let body = BatchBuilder::new(i).build();
            let fields = Prepare { record_count: 0, append_time_ms: 5_000, ..Prepare::default() };
            let header = build_prepare(&shard.next(GROUP).unwrap(), 1, 0, fields, &body);
            shard.append(GROUP, &header, &body).unwrap();
            // One journal cycle each; a cycle is known synced once a later entry (or marker)
            // says so.
            sim.block_on(shard.flush()).unwrap();
        }
        drop(shard);
        let report = run(&sim, "/data");
        assert!(report.is_clean(), "{:#?}", report.problems);
        let journal = report.shards[0].journal.clone().unwrap();
        assert_eq!(journal.groups[0].last_op, 15);
        let path = dir.join("journal");
        let bytes = sim.file_contents(&path).unwrap();
        // The entry framing op 11 (the clean close before wrote a marker entry just before it).
        let cycle_of_op_11 = (0..bytes.len() / BLOCK_SIZE_BYTES)
            .map(|block| block * BLOCK_SIZE_BYTES)
            .find(|&at| {
                let framed = Header::decode_prefix(&bytes[at..])
                    .is_ok_and(|h| h.as_journal_entry().is_some())
                    && bytes.len() >= at + 2 * HEADER_SIZE;
                framed
                    && Header::decode_prefix(&bytes[at + HEADER_SIZE..])
                        .is_ok_and(|inner| inner.as_prepare().is_some_and(|p| p.op == 11))
            })
            .unwrap();
        sim.corrupt(&path, cycle_of_op_11 as u64 + 100, 1);
        let report = run(&sim, "/data");
        let first = report.first_corruption().expect("a synced, needed entry is gone");
        assert_eq!(first.file, path);
        assert!(first.reason.contains("was synced but is missing"), "{first}");
    }

    /// Recovery replays a group's journal entries in op order, the newest view first, and so
    /// does the checker. A damage cut leaves a stale chain of an older view in the journal
    /// (never replayed) beside the newer view's entries for the same ops, which run further and
    /// were written later: taken in sequence order, the stale chain would be followed and then
    /// end in a false "lost op" (found by the simulator's seed 132 once its admin group changed
    /// the schedule).
    #[test]
    fn journal_entries_replay_newest_view_first_within_an_op() {
        let entry = |op: u64, view: u32, seq: u64| {
            let prepare = Prepare { group: GROUP, op, ..Prepare::default() };
            JournalFound {
                position_bytes: seq * 4096,
                size_bytes: 4096,
                fields: crate::wire::JournalEntry { seq, ..Default::default() },
                cluster: 0,
                inner: Some(Header::prepare(0, view, 0, prepare, b"")),
                inner_body_ok: true,
            }
        };
        let found = [
            entry(353, 6, 742),
            entry(354, 6, 744),
            entry(353, 10, 938),
            entry(354, 10, 939),
            entry(355, 10, 940),
        ];
        let mut entries: Vec<&JournalFound> = found.iter().collect();
        sort_for_replay(&mut entries);
        let order: Vec<(u64, u64)> = entries.iter().map(|e| (e.op(), e.fields.seq)).collect();
        assert_eq!(order, [(353, 938), (353, 742), (354, 939), (354, 744), (355, 940)]);
    }

    #[test]
    fn superblock_header_layout_is_pinned() {
        let sim = Sim::new(14, SimConfig::default());
        build(&sim, Durability::Replicated, 1);
        let bytes = sim.file_contents(Path::new("/data/shard-0/superblock")).unwrap();
        let at = SUPERBLOCK_OFF_SLOTS_MAX;
        let slots_max = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        assert_eq!(slots_max as usize, ShardConfig::small().groups_max);
    }

    #[test]
    fn garbage_and_missing_files_are_reported_never_panicked_on() {
        let sim = Sim::new(15, SimConfig::default());
        build(&sim, Durability::Persisted, 40);
        let storage: SimStorage = sim.storage();
        let mut rng = crate::storage::sim::SimRng::new(99);
        let garbage: Vec<u8> = (0..300_000).map(|_| rng.next_u64() as u8).collect();
        let dir = group_dir(&shard_dir(Path::new("/data"), 0), GROUP);
        for name in ["00000000000009999999.log", "00000000000009999999.index", "stray"] {
            let garbage = Bytes::from(garbage.clone());
            sim.block_on(async {
                let file =
                    storage.open(&dir.join(name), OpenMode::CreateReadWrite, false).await.unwrap();
                file.write_at(garbage, 0).await.unwrap();
                file.sync_data().await.unwrap();
                storage.sync_dir(&dir).await.unwrap();
            });
        }
        let report = run(&sim, "/data");
        // Past the checkpoint, a garbage segment is a leftover the chain never reaches.
        assert!(report.is_clean(), "{:#?}", report.problems);
        assert!(report.notes.iter().any(|n| n.file.ends_with("00000000000009999999.log")));
        // Journal entries lost under garbage, but all covered by the close's checkpoints.
        let journal = Path::new("/data/shard-0/journal");
        sim.block_on(async {
            let file = storage.open(journal, OpenMode::ReadWrite, false).await.unwrap();
            file.write_at(Bytes::from(garbage.clone()), 0).await.unwrap();
            file.sync_data().await.unwrap();
        });
        let report = run(&sim, "/data");
        assert!(report.is_clean(), "{:#?}", report.problems);
        assert!(report.notes.iter().any(|n| n.file == journal && n.message.contains("cover")));
        // A record with valid checksums whose op and offset sit at the end of the u64 range,
        // in a directory the superblock does not name (so nothing bounds the chain's start).
        let hostile = Prepare {
            group: 77,
            op: u64::MAX,
            base_offset: u64::MAX - 1,
            record_count: 9,
            ..Prepare::default()
        };
        let header = Header::prepare(0, 1, 0, hostile, b"body");
        let mut record = header.encode().to_vec();
        record.extend_from_slice(b"body");
        let orphan = group_dir(&shard_dir(Path::new("/data"), 0), 77);
        sim.block_on(async {
            storage.create_dir_all(&orphan).await.unwrap();
            let path = orphan.join(crate::segment::log_name(u64::MAX - 1));
            let file = storage.open(&path, OpenMode::CreateReadWrite, false).await.unwrap();
            file.write_at(Bytes::from(record), 0).await.unwrap();
            file.sync_data().await.unwrap();
        });
        let report = run(&sim, "/data");
        assert!(report.shards[0].groups.iter().any(|g| g.group == 77));
        assert!(run(&sim, "/nowhere").error.is_some());
        assert!(run(&sim, "/data/shard-0/journal").error.is_some());
    }
}
