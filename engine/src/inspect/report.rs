//! What the checker reports: one report per shard, its superblock copies, groups, segments and
//! journal, and the problems and notes found, in the order found.
//!
//! Plain data for `shoal-inspect` and tests to print or assert on; it must never read a file
//! or judge what it holds.

use std::path::PathBuf;

use crate::Corruption;
use crate::superblock::{GroupSlot, Identity, SuperblockState};

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
    /// The checksum of that last op's record: through the chain of parents it vouches for the
    /// whole log, so two replicas whose logs end alike hold the same log.
    pub last_checksum: Option<u32>,
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
    /// The checksum of its last record.
    pub last_checksum: Option<u32>,
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
