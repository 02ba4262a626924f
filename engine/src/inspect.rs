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
    INDEX_ENTRY_SIZE_BYTES, INDEX_HEADER_SIZE_BYTES, INDEX_SUFFIX, IndexEntry, IndexSummary,
    LOG_SUFFIX, SegmentIndex, index_name, parse_log_name,
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
    /// Bytes from its start to the end of its last valid record.
    pub valid_bytes: u64,
    /// Valid records.
    pub records: u64,
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
                    format!("shard directory missing (the superblocks say {} shards)", first.shard_count),
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
    /// the report and where the chain ends (None when it is broken or empty of records).
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
        if !dir_exists {
            if checkpoint.op > 0 {
                self.problem(
                    dir,
                    At { position_bytes: 0, offset: Some(checkpoint.next_offset), op: Some(checkpoint.op) },
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
        let mut bases = Vec::new();
        for name in &names {
            if let Some(base) = parse_log_name(name) {
                bases.push(base);
            } else if parse_index_name(name).is_none() {
                self.note(dir.join(name), None, "unknown file in the group directory");
            }
        }
        bases.sort_unstable();
        for name in &names {
            if let Some(base) = parse_index_name(name)
                && !bases.contains(&base)
            {
                self.note(dir.join(name), None, "index file without its segment");
            }
        }
        if checkpoint.op > 0 && !bases.contains(&checkpoint.segment_base_offset) {
            self.problem(
                &dir.join(crate::segment::log_name(checkpoint.segment_base_offset)),
                At { position_bytes: 0, offset: Some(checkpoint.next_offset), op: Some(checkpoint.op) },
                "the checkpoint's segment is missing",
            );
        }
        let problems_before = self.problems.len();
        let mut walk = GroupWalk {
            cluster,
            group,
            checkpoint,
            fence: slot.map(|s| s.fence).unwrap_or_default(),
            record_max: slot
                .map_or(RECORD_SIZE_FALLBACK_BYTES, |s| s.config.record_size_bytes_max as usize),
            // A log that never checkpointed has lost nothing to retention, so it starts at op 1;
            // otherwise the first remaining segment sets where the chain starts.
            chain: match (slot, cluster) {
                (Some(_), Some(cluster)) if checkpoint.op == 0 => Chain::Expect(ChainNext {
                    cluster,
                    group,
                    op: 1,
                    parent: 0,
                    offset: 0,
                }),
                _ => Chain::Anchor,
            },
            head: None,
            checkpoint_seen: false,
        };
        for base in bases {
            let path = dir.join(crate::segment::log_name(base));
            let has_index = names.iter().any(|name| *name == index_name(base));
            let segment = self.segment(&mut walk, &path, base, has_index).await;
            if !segment.leftover {
                if let (Some(first_op), None) = (segment.first_op, report.first_op) {
                    report.first_op = Some(first_op);
                    report.first_offset = segment.first_offset;
                }
                report.records += segment.records;
                report.valid_bytes += segment.valid_bytes;
            }
            report.segments.push(segment);
        }
        if let Some(head) = &walk.head {
            report.last_op = Some(head.op - 1);
            report.next_offset = Some(head.offset);
        }
        if checkpoint.op > 0 && !walk.checkpoint_seen && self.problems.len() == problems_before {
            let file = dir.join(crate::segment::log_name(checkpoint.segment_base_offset));
            self.problem(
                &file,
                At {
                    position_bytes: checkpoint.position_bytes,
                    offset: walk.head.map(|h| h.offset),
                    op: Some(checkpoint.op),
                },
                format!(
                    "the chain ends at op {} before the checkpoint op {}",
                    report.last_op.unwrap_or(0),
                    checkpoint.op
                ),
            );
        }
        let end = match walk.chain {
            Chain::Expect(next) | Chain::Ended(next) => Some(next),
            Chain::Anchor => None,
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
        let mut report =
            SegmentReport { file: path.to_path_buf(), base_offset: base, ..SegmentReport::default() };
        if let Chain::Ended(next) = walk.chain {
            // The chain ended in the torn window: this segment holds nothing recovery keeps,
            // unless it continues the chain exactly (recovery then keeps it, so do we).
            let continues = match self.storage.open(path, OpenMode::Read, false).await {
                Ok(file) => {
                    report.file_size_bytes = file.size_bytes().await.unwrap_or(0);
                    match Scanner::new(&file, BLOCK_SIZE_BYTES).await {
                        Ok(mut scanner) => match scanner.record_at(0, walk.record_max).await {
                            Ok(bytes) => {
                                check_next(&bytes, &next, &walk.fence, walk.record_max).is_ok()
                            }
                            Err(_) => false,
                        },
                        Err(_) => false,
                    }
                }
                Err(_) => false,
            };
            if !continues {
                report.leftover = true;
                report.end = SegmentEnd::NotScanned;
                self.note(
                    path.to_path_buf(),
                    Some(0),
                    "segment past the chain's end (torn-window leftover; recovery deletes it)",
                );
                return report;
            }
            walk.chain = Chain::Expect(next);
        }
        let file = match self.storage.open(path, OpenMode::Read, false).await {
            Ok(file) => file,
            Err(error) => {
                let at = At::expecting(0, walk.expected());
                self.problem(path, at, format!("cannot open the segment: {error}"));
                walk.chain = Chain::Anchor;
                report.end = SegmentEnd::Unreadable(error.to_string());
                return report;
            }
        };
        let mut scanner = match Scanner::new(&file, WINDOW_BYTES).await {
            Ok(scanner) => scanner,
            Err(error) => {
                let at = At::expecting(0, walk.expected());
                self.problem(path, at, format!("cannot read the segment: {error}"));
                walk.chain = Chain::Anchor;
                report.end = SegmentEnd::Unreadable(error.to_string());
                return report;
            }
        };
        report.file_size_bytes = file.size_bytes().await.unwrap_or(0);
        let index = if has_index {
            Some(self.read_index(&path.with_extension(&INDEX_SUFFIX[1..]), report.file_size_bytes).await)
        } else {
            None
        };
        let mut index_check = index.as_ref().and_then(|i| i.as_ref().ok()).map(|(index, _)| {
            IndexCheck { entries: index.entries().to_vec(), next: 0, mismatch: None }
        });
        let problems_before = self.problems.len();
        let mut position = 0u64;
        let mut last_append_ms = i64::MIN;
        let end = loop {
            let bytes = match scanner.record_at(position, walk.record_max).await {
                Ok(bytes) => bytes,
                Err(error) => {
                    let at = At::expecting(position, walk.expected());
                    self.problem(path, at, format!("read error: {error}"));
                    walk.chain = Chain::Anchor;
                    break SegmentEnd::Unreadable(error.to_string());
                }
            };
            let checked = match &walk.chain {
                Chain::Expect(next) => check_next(&bytes, next, &walk.fence, walk.record_max),
                _ => match walk.cluster {
                    Some(cluster) => check_standalone(&bytes, cluster, walk.group, walk.record_max),
                    // No superblock to say whose cluster this is: believe the first record's.
                    None => match Header::decode_prefix(&bytes) {
                        Ok(header) => {
                            check_standalone(&bytes, header.cluster, walk.group, walk.record_max)
                        }
                        Err(_) => check_standalone(&bytes, 0, walk.group, walk.record_max),
                    },
                },
            };
            match checked {
                Ok(header) => {
                    let prepare = prepare_of(&header);
                    if position == 0 && prepare.base_offset != base {
                        self.problem(
                            path,
                            At { position_bytes: 0, offset: Some(prepare.base_offset), op: Some(prepare.op) },
                            format!(
                                "the file name says base offset {base}, its first record starts \
                                 at offset {}",
                                prepare.base_offset
                            ),
                        );
                    }
                    self.record_checkpoint(walk, path, base, position, &header);
                    if let Some(check) = &mut index_check {
                        check.observe(&header, position);
                    }
                    let next = match &walk.chain {
                        Chain::Expect(next) => next.after(&header),
                        _ => ChainNext {
                            cluster: header.cluster,
                            group: walk.group,
                            op: prepare.op,
                            parent: prepare.parent,
                            offset: prepare.base_offset,
                        }
                        .after(&header),
                    };
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
                    if walk.cluster.is_none() {
                        walk.cluster = Some(header.cluster);
                    }
                    walk.chain = Chain::Expect(next);
                    walk.head = Some(next);
                }
                Err(fault) => {
                    match self.segment_end(walk, &mut scanner, path, base, position, fault).await {
                        Some(skip_to) => position = skip_to,
                        None => break self.classified_end(walk, &mut scanner, path, base, position).await,
                    }
                }
            }
        };
        report.end = end;
        let damaged = self.problems.len() > problems_before;
        report.index = match index {
            None => IndexStatus::Missing,
            Some(Err(reason)) => {
                self.note(
                    path.with_extension(&INDEX_SUFFIX[1..]),
                    None,
                    format!("index file damaged (recovery rebuilds it): {reason}"),
                );
                IndexStatus::Damaged(reason)
            }
            Some(Ok((index, summary))) => {
                let entries = index.entries().len();
                let check = index_check.expect("built from a decoded index");
                if damaged {
                    IndexStatus::NotCompared { entries }
                } else {
                    let scanned = IndexSummary {
                        covered_bytes: report.valid_bytes,
                        next_offset: report.next_offset.unwrap_or(base),
                        last_op: report.last_op.unwrap_or(0),
                        last_append_ms,
                    };
                    match check.finish(&summary, &scanned) {
                        None => IndexStatus::Ok { entries },
                        Some(reason) => {
                            let index_path = path.with_extension(&INDEX_SUFFIX[1..]);
                            // Recovery trusts the index of a synced segment without scanning
                            // it: a wrong one there misplaces reads, so it is damage.
                            if walk.checkpoint.op > 0 && base <= walk.checkpoint.segment_base_offset
                            {
                                self.problem(
                                    &index_path,
                                    At::byte(0),
                                    format!("index disagrees with its segment: {reason}"),
                                );
                            } else {
                                self.note(
                                    index_path,
                                    None,
                                    format!("index disagrees with its segment: {reason}"),
                                );
                            }
                            IndexStatus::Disagrees(reason)
                        }
                    }
                }
            }
        };
        report
    }

    /// Checks the record of the checkpoint op against what the superblock says of it.
    fn record_checkpoint(
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
        let next_offset = prepare.base_offset + u64::from(prepare.record_count);
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
            wrong.push(format!("next offset {next_offset} (superblock: {})", checkpoint.next_offset));
        }
        if !wrong.is_empty() {
            self.problem(
                path,
                At { position_bytes: position, offset: Some(prepare.base_offset), op: Some(prepare.op) },
                format!("the checkpoint record is not the one the superblock names: {}", wrong.join(", ")),
            );
        }
    }

    /// Handles a record that is not the next valid one. Returns where to continue scanning this
    /// segment when the damage could be stepped over (a record whose header is sound but whose
    /// body is not), None when the segment's data ends here.
    async fn segment_end<F: StorageFile>(
        &mut self,
        walk: &mut GroupWalk,
        scanner: &mut Scanner<'_, F>,
        path: &Path,
        base: u64,
        position: u64,
        fault: RecordFault,
    ) -> Option<u64> {
        if matches!(fault, RecordFault::Zeroed) {
            walk.pending_fault = None;
            return None;
        }
        if !walk.is_synced(base) {
            walk.pending_fault = Some(fault);
            return None;
        }
        let at = At::expecting(position, walk.expected());
        self.problem(path, at, format!("damaged record before the checkpoint: {fault}"));
        walk.pending_fault = None;
        // A sound header still says where the next record starts: keep walking past the damage
        // so the rest of the log is checked and its ranges reported.
        if matches!(fault, RecordFault::BadBody | RecordFault::Foreign | RecordFault::ChainBreak { .. })
            && let Ok(bytes) = scanner.bytes_at(position, HEADER_SIZE).await
            && let Ok(header) = Header::decode_prefix(&bytes)
            && let Some(prepare) = header.as_prepare()
            && (header.size as usize) <= walk.record_max
        {
            walk.chain = Chain::Expect(ChainNext {
                cluster: walk.cluster.unwrap_or(header.cluster),
                group: walk.group,
                op: prepare.op,
                parent: prepare.parent,
                offset: prepare.base_offset,
            }.after(&header));
            walk.head = None;
            return Some(position + u64::from(header.size));
        }
        walk.chain = Chain::Anchor;
        walk.head = None;
        walk.reported_break = true;
        None
    }
}
