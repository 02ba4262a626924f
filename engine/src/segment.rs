//! Segment files and their sparse index: naming, the in-memory index of one segment (offset,
//! op and append time → byte position), and the index file format.
//!
//! A segment file is a run of records (prepare header + batch) named by the base offset of its
//! first record; zeros follow the last record (space made ready ahead of the tail). The index is
//! an optimisation only: it may be missing, behind or damaged, and is then rebuilt from the
//! segment. This module never decides when to roll or what to keep.

use crate::wire::Header;

/// Suffix of segment files.
pub const LOG_SUFFIX: &str = ".log";
/// Suffix of index files.
pub const INDEX_SUFFIX: &str = ".index";
/// The group's spare segment file: space made ready for the next segment before the active one
/// fills, renamed to the next segment's name when it rolls. Empty (its space is reserved, never
/// written) and never read: a leftover one is reused or removed.
pub const SPARE_NAME: &str = "spare.segment";

/// Suffix of a segment retention has retired and not yet removed: renaming it out of the log
/// takes the shard a moment, while removing a 1 GiB file frees its blocks for 0.2 s, which the
/// driver does off its loop ([`crate::shard::ShardStore::take_retired_files`]). Never read: a
/// leftover one is removed when its group opens.
pub const RETIRED_SUFFIX: &str = ".retired";

/// File name of the segment whose first record starts at `base_offset`.
#[must_use]
pub fn log_name(base_offset: u64) -> String {
    format!("{base_offset:020}{LOG_SUFFIX}")
}

/// File name of that segment's index.
#[must_use]
pub fn index_name(base_offset: u64) -> String {
    format!("{base_offset:020}{INDEX_SUFFIX}")
}

/// File name a retired segment has until it is removed.
#[must_use]
pub fn retired_name(base_offset: u64) -> String {
    format!("{base_offset:020}{RETIRED_SUFFIX}")
}

/// Whether a file name is a retired segment's.
#[must_use]
pub fn is_retired_name(name: &str) -> bool {
    parse_base_offset_name(name, RETIRED_SUFFIX).is_some()
}

/// The base offset a segment file name encodes, if it is one.
#[must_use]
pub fn parse_log_name(name: &str) -> Option<u64> {
    parse_base_offset_name(name, LOG_SUFFIX)
}

/// The base offset an index file name encodes, if it is one.
#[must_use]
pub fn parse_index_name(name: &str) -> Option<u64> {
    parse_base_offset_name(name, INDEX_SUFFIX)
}

/// The base offset a `<20 decimal digits><suffix>` file name encodes, if it is one: the one
/// parser of every name a log file carries (segments, indexes, staged transfer segments).
#[must_use]
pub fn parse_base_offset_name(name: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_suffix(suffix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// One sparse index entry: where a record starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// The record's op.
    pub op: u64,
    /// The record's base offset.
    pub offset: u64,
    /// Byte position of the record in the segment.
    pub position_bytes: u64,
    /// The record's append time (non-decreasing along a partition).
    pub append_time_ms: i64,
}

/// The sparse index of one segment: an entry for the first record and then one at least every
/// `interval_bytes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentIndex {
    entries: Vec<IndexEntry>,
}

impl SegmentIndex {
    /// Notes a record at `position_bytes`; keeps it when it is the first or at least
    /// `interval_bytes` past the previous entry.
    pub fn observe(&mut self, header: &Header, position_bytes: u64, interval_bytes: u64) {
        let prepare = crate::record::prepare_of(header);
        let due = self
            .entries
            .last()
            .is_none_or(|last| position_bytes >= last.position_bytes + interval_bytes);
        if due {
            self.entries.push(IndexEntry {
                op: prepare.op,
                offset: prepare.base_offset,
                position_bytes,
                append_time_ms: prepare.append_time_ms,
            });
        }
    }

    /// The entries.
    #[must_use]
    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// Where to start scanning for the record containing `offset`.
    #[must_use]
    pub fn position_for_offset(&self, offset: u64) -> u64 {
        self.before(|entry| entry.offset <= offset)
    }

    /// Where to start scanning for `op`.
    #[must_use]
    pub fn position_for_op(&self, op: u64) -> u64 {
        self.before(|entry| entry.op <= op)
    }

    /// Where to start scanning for the first record appended at or after `time_ms`.
    #[must_use]
    pub fn position_for_time(&self, time_ms: i64) -> u64 {
        self.before(|entry| entry.append_time_ms < time_ms)
    }

    /// Drops entries at or past `position_bytes` (a truncation).
    pub fn truncate(&mut self, position_bytes: u64) {
        self.entries.retain(|entry| entry.position_bytes < position_bytes);
    }

    fn before(&self, is_before: impl Fn(&IndexEntry) -> bool) -> u64 {
        let count = self.entries.partition_point(is_before);
        count.checked_sub(1).map_or(0, |index| self.entries[index].position_bytes)
    }

    /// Encodes the index file: a header (magic, checksum, version, entry count, and the summary
    /// of the segment it covers) followed by the entries, little-endian.
    #[must_use]
    pub fn encode(&self, summary: &IndexSummary) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(
            INDEX_HEADER_SIZE_BYTES + self.entries.len() * INDEX_ENTRY_SIZE_BYTES,
        );
        bytes.extend_from_slice(&INDEX_MAGIC);
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&u32::from(INDEX_VERSION).to_le_bytes());
        bytes.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&summary.covered_bytes.to_le_bytes());
        bytes.extend_from_slice(&summary.next_offset.to_le_bytes());
        bytes.extend_from_slice(&summary.last_op.to_le_bytes());
        bytes.extend_from_slice(&summary.last_append_ms.to_le_bytes());
        bytes.resize(INDEX_HEADER_SIZE_BYTES, 0);
        for entry in &self.entries {
            bytes.extend_from_slice(&entry.op.to_le_bytes());
            bytes.extend_from_slice(&entry.offset.to_le_bytes());
            bytes.extend_from_slice(&entry.position_bytes.to_le_bytes());
            bytes.extend_from_slice(&entry.append_time_ms.to_le_bytes());
        }
        let checksum = shoal_proto::checksum::crc32c(&bytes[INDEX_OFF_CHECKSUM + 4..]);
        bytes[INDEX_OFF_CHECKSUM..INDEX_OFF_CHECKSUM + 4].copy_from_slice(&checksum.to_le_bytes());
        bytes
    }

    /// Decodes an index file; returns the index and the summary of the segment it covers, or why
    /// it cannot be trusted (the caller then rebuilds it).
    pub fn decode(
        bytes: &[u8],
        entries_max: usize,
    ) -> Result<(SegmentIndex, IndexSummary), String> {
        if bytes.len() < INDEX_HEADER_SIZE_BYTES || bytes[..4] != INDEX_MAGIC {
            return Err("not an index file".to_string());
        }
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let count = u64_at(INDEX_OFF_COUNT);
        if count > entries_max as u64 {
            return Err(format!("{count} entries exceed the bound {entries_max}"));
        }
        let count = count as usize;
        let end = INDEX_HEADER_SIZE_BYTES + count * INDEX_ENTRY_SIZE_BYTES;
        if bytes.len() < end {
            return Err("index file cut short".to_string());
        }
        let stored = u32::from_le_bytes(
            bytes[INDEX_OFF_CHECKSUM..INDEX_OFF_CHECKSUM + 4].try_into().expect("4"),
        );
        if stored != shoal_proto::checksum::crc32c(&bytes[INDEX_OFF_CHECKSUM + 4..end]) {
            return Err("index checksum mismatch".to_string());
        }
        if bytes[INDEX_OFF_VERSION] != INDEX_VERSION {
            return Err(format!("unsupported index version {}", bytes[INDEX_OFF_VERSION]));
        }
        let mut entries = Vec::with_capacity(count);
        for index in 0..count {
            let at = INDEX_HEADER_SIZE_BYTES + index * INDEX_ENTRY_SIZE_BYTES;
            let entry = IndexEntry {
                op: u64_at(at),
                offset: u64_at(at + 8),
                position_bytes: u64_at(at + 16),
                append_time_ms: u64_at(at + 24) as i64,
            };
            if entries.last().is_some_and(|last: &IndexEntry| {
                entry.op <= last.op
                    || entry.offset <= last.offset
                    || entry.position_bytes <= last.position_bytes
            }) {
                return Err(format!("entry {index} is out of order"));
            }
            entries.push(entry);
        }
        let summary = IndexSummary {
            covered_bytes: u64_at(INDEX_OFF_COVERED),
            next_offset: u64_at(INDEX_OFF_COVERED + 8),
            last_op: u64_at(INDEX_OFF_COVERED + 16),
            last_append_ms: u64_at(INDEX_OFF_COVERED + 24) as i64,
        };
        if entries.first().is_none_or(|first| first.position_bytes != 0)
            || entries.last().is_some_and(|last| {
                last.op > summary.last_op || last.position_bytes >= summary.covered_bytes
            })
        {
            return Err("index entries disagree with its summary".to_string());
        }
        Ok((SegmentIndex { entries }, summary))
    }
}

const INDEX_MAGIC: [u8; 4] = *b"SHIX";
const INDEX_VERSION: u8 = 1;
const INDEX_OFF_CHECKSUM: usize = 4;
const INDEX_OFF_VERSION: usize = INDEX_OFF_CHECKSUM + 4;
const INDEX_OFF_COUNT: usize = INDEX_OFF_VERSION + 4;
const INDEX_OFF_COVERED: usize = INDEX_OFF_COUNT + 8;
/// Bytes of the index file header.
pub const INDEX_HEADER_SIZE_BYTES: usize = 64;
/// Bytes of one index entry on disk.
pub const INDEX_ENTRY_SIZE_BYTES: usize = 32;
const _: () = assert!(INDEX_OFF_COVERED + 32 <= INDEX_HEADER_SIZE_BYTES);

/// What an index file says of its whole segment, so a synced segment can be opened without
/// reading it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexSummary {
    /// Bytes of valid records in the segment.
    pub covered_bytes: u64,
    /// The offset after the segment's last record.
    pub next_offset: u64,
    /// The segment's last op.
    pub last_op: u64,
    /// The segment's newest append time.
    pub last_append_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(op: u64, offset: u64, position_bytes: u64, append_time_ms: i64) -> IndexEntry {
        IndexEntry { op, offset, position_bytes, append_time_ms }
    }

    #[test]
    fn names_round_trip_and_reject_strangers() {
        assert_eq!(log_name(42), "00000000000000000042.log");
        assert_eq!(parse_log_name(&log_name(42)), Some(42));
        assert_eq!(parse_log_name("42.log"), None);
        assert_eq!(parse_log_name("0000000000000000004x.log"), None);
        assert_eq!(parse_log_name(&index_name(42)), None);
    }

    #[test]
    fn lookups_start_at_the_last_entry_before_the_target() {
        let index = SegmentIndex {
            entries: vec![entry(1, 0, 0, 10), entry(5, 40, 5000, 20), entry(9, 80, 9000, 30)],
        };
        assert_eq!(index.position_for_offset(0), 0);
        assert_eq!(index.position_for_offset(39), 0);
        assert_eq!(index.position_for_offset(40), 5000);
        assert_eq!(index.position_for_offset(1000), 9000);
        assert_eq!(index.position_for_op(8), 5000);
        assert_eq!(index.position_for_time(20), 0);
        assert_eq!(index.position_for_time(21), 5000);
    }

    #[test]
    fn index_file_round_trips_and_damage_is_detected() {
        let index = SegmentIndex { entries: vec![entry(1, 0, 0, 10), entry(5, 40, 5000, 20)] };
        let summary =
            IndexSummary { covered_bytes: 6000, next_offset: 50, last_op: 6, last_append_ms: 25 };
        let bytes = index.encode(&summary);
        assert_eq!(SegmentIndex::decode(&bytes, 10), Ok((index.clone(), summary)));
        assert!(SegmentIndex::decode(&bytes, 1).is_err(), "bound on entries");
        for position in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[position] ^= 1;
            assert!(SegmentIndex::decode(&damaged, 10).is_err(), "flip at {position}");
        }
        assert!(SegmentIndex::decode(&bytes[..bytes.len() - 1], 10).is_err());
    }
}
