//! The direct `persisted` path (DESIGN.md §3): which form a flush cycle takes, and the sync
//! marks that let recovery tell a torn tail from corruption when a segment, not the journal,
//! made the prepares durable.
//!
//! A cycle that dirties few `persisted` groups writes their prepares to their segments only and
//! syncs those files: every byte is written once, and one sync per group replaces the journal's
//! one sync for the shard. A cycle that dirties many writes them the same way and then syncs
//! the whole file system once (`syncfs(2)`, where the file system is known to flush the device
//! for it): every byte once, one sync for the shard.
//!
//! What the journal's `durable_seq` does for its entries, a sync mark
//! does for a segment: each direct job writes, beside its data and under the same sync, a mark
//! naming the newest op an *earlier* completed sync made durable. A mark written with the data
//! it covers could land without that data; one naming an earlier sync cannot. So after a power
//! loss every op up to the newest mark found must be there (damage to it is corruption), and
//! only what lies past it is a torn window — the newest synced job, as in the journal, until an
//! idle mark announces it.
//!
//! Marks live in a trailer past the segment's data limit, two block-sized slots used in turn,
//! so a torn mark write always leaves the previous mark whole. This module owns their format and
//! the choice of form; it never does I/O.

use bytes::Bytes;

use crate::storage::{AlignedBuf, BLOCK_SIZE_BYTES};
use crate::wire::{HEADER_SIZE, Header, JournalEntry};

/// Mark slots in a segment's trailer.
pub const MARK_SLOTS: u64 = 2;

/// Bytes of a segment file's sync-mark trailer.
pub const TRAILER_BYTES: u64 = MARK_SLOTS * BLOCK_SIZE_BYTES as u64;

/// Bytes of a mark's body: group, op, and the op's record header checksum.
const MARK_BODY_BYTES: usize = 24;

/// How a flush cycle makes `persisted` prepares durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PersistedPath {
    /// Per cycle, by cost: the direct path when the segment syncs it adds cost less than
    /// writing the cycle's bytes a second time (see [`prefers_direct`]).
    #[default]
    Auto,
    /// Always the shard journal.
    Journal,
    /// The direct path, one sync per group, for every group that can take it (tests and
    /// benchmarks).
    Direct,
    /// The direct path, one file-system sync per cycle, for every group that can take it (tests
    /// and benchmarks; refused at open where the file system does not support it).
    Filesystem,
}

impl PersistedPath {
    /// Parses a configuration value: `auto`, `journal` or `direct`.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "auto" => Some(Self::Auto),
            "journal" => Some(Self::Journal),
            "direct" => Some(Self::Direct),
            "filesystem" => Some(Self::Filesystem),
            _ => None,
        }
    }

    /// The configuration value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Journal => "journal",
            Self::Direct => "direct",
            Self::Filesystem => "filesystem",
        }
    }
}

/// The form a cycle's waiting `persisted` groups take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PersistedForm {
    /// Through the shard journal and its one sync.
    Journal,
    /// Straight to their segments, each group syncing its own files.
    Direct,
    /// Straight to their segments, then one sync of the whole file system.
    Filesystem,
}

/// What syncs cost, in bytes written (the unit the forms are compared in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncCosts {
    /// One file's sync.
    pub sync_cost_bytes: u64,
    /// One file-system sync, or `None` where the file system does not support it.
    pub filesystem_sync_cost_bytes: Option<u64>,
}

/// The form `Auto` takes for a cycle in which `groups` groups wait with `bytes` in all. Every
/// form writes the bytes to their segments in the cycle; what each adds:
/// - the journal, one sync and the bytes a second time (whole blocks);
/// - the direct form, one sync and one mark block per group (syncs of different files do not
///   merge on the disks measured, docs/benchmarks.md);
/// - the file-system form, one file-system sync and one mark block per group.
///
/// The cheapest wins; a tie goes to the direct forms, which write less.
pub fn cheapest_form(groups: usize, bytes: u64, costs: SyncCosts) -> PersistedForm {
    let groups = groups as u64;
    let block = BLOCK_SIZE_BYTES as u64;
    let marks = groups.saturating_mul(block);
    let journal = costs.sync_cost_bytes.saturating_add(bytes.div_ceil(block) * block);
    let direct = groups.saturating_mul(costs.sync_cost_bytes).saturating_add(marks);
    let filesystem =
        costs.filesystem_sync_cost_bytes.map(|cost| cost.saturating_add(marks)).unwrap_or(u64::MAX);
    if groups == 0 || journal < direct.min(filesystem) {
        PersistedForm::Journal
    } else if direct <= filesystem {
        PersistedForm::Direct
    } else {
        PersistedForm::Filesystem
    }
}

/// A sync mark: every op of `group` up to `op` was synced in its segment files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncMark {
    /// Marks of one segment count up; the newer of the two slots wins.
    pub seq: u64,
    /// The group.
    pub group: u64,
    /// The newest op a completed sync made durable.
    pub op: u64,
    /// That op's record header checksum.
    pub checksum: u32,
}

impl SyncMark {
    /// Where the mark with this sequence number goes in a segment whose data ends by
    /// `limit_bytes`.
    pub fn position_bytes(limit_bytes: u64, seq: u64) -> u64 {
        limit_bytes + (seq % MARK_SLOTS) * BLOCK_SIZE_BYTES as u64
    }

    /// The mark as one zero-padded, aligned block.
    pub fn encode(&self, cluster: u64) -> Bytes {
        let mut body = [0u8; MARK_BODY_BYTES];
        body[..8].copy_from_slice(&self.group.to_le_bytes());
        body[8..16].copy_from_slice(&self.op.to_le_bytes());
        body[16..20].copy_from_slice(&self.checksum.to_le_bytes());
        let fields = JournalEntry { seq: self.seq, durable_seq: 0, tail_seq: 0 };
        let header = Header::journal_entry(cluster, fields, &body);
        let mut block = AlignedBuf::zeroed(BLOCK_SIZE_BYTES, BLOCK_SIZE_BYTES);
        block.extend_from_slice(&header.encode());
        block.extend_from_slice(&body);
        block.set_len(BLOCK_SIZE_BYTES);
        block.freeze()
    }

    /// Decodes a mark slot: `None` unless it holds a whole, valid mark of this cluster and
    /// group (zeros, a torn write and another group's bytes all read as no mark).
    pub fn decode(bytes: &[u8], cluster: u64, group: u64) -> Option<Self> {
        let header = Header::decode_prefix(bytes).ok()?;
        let fields = *header.as_journal_entry()?;
        if header.cluster != cluster || header.size as usize != HEADER_SIZE + MARK_BODY_BYTES {
            return None;
        }
        let body = bytes.get(HEADER_SIZE..HEADER_SIZE + MARK_BODY_BYTES)?;
        header.verify_body(body).ok()?;
        let word = |range: std::ops::Range<usize>| -> u64 {
            let mut le = [0u8; 8];
            le[..range.len()].copy_from_slice(&body[range]);
            u64::from_le_bytes(le)
        };
        let mark = SyncMark {
            seq: fields.seq,
            group: word(0..8),
            op: word(8..16),
            checksum: word(16..20) as u32,
        };
        (mark.group == group).then_some(mark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_round_trips_and_rejects_damage_and_strangers() {
        let mark = SyncMark { seq: 7, group: 3, op: 41, checksum: 0xdead_beef };
        let block = mark.encode(9);
        assert_eq!(block.len(), BLOCK_SIZE_BYTES);
        assert_eq!(SyncMark::decode(&block, 9, 3), Some(mark));
        assert_eq!(SyncMark::decode(&block, 8, 3), None, "another cluster");
        assert_eq!(SyncMark::decode(&block, 9, 4), None, "another group");
        let mut torn = block.to_vec();
        torn[HEADER_SIZE + 9] ^= 1;
        assert_eq!(SyncMark::decode(&torn, 9, 3), None, "a damaged body");
        assert_eq!(SyncMark::decode(&vec![0; BLOCK_SIZE_BYTES], 9, 3), None, "zeros");
    }

    #[test]
    fn slots_alternate_past_the_limit() {
        assert_eq!(SyncMark::position_bytes(1 << 20, 0), 1 << 20);
        assert_eq!(SyncMark::position_bytes(1 << 20, 1), (1 << 20) + BLOCK_SIZE_BYTES as u64);
        assert_eq!(SyncMark::position_bytes(1 << 20, 2), 1 << 20);
    }

    const KIB: u64 = 1 << 10;

    fn costs(sync: u64, filesystem: Option<u64>) -> SyncCosts {
        SyncCosts { sync_cost_bytes: sync, filesystem_sync_cost_bytes: filesystem }
    }

    #[test]
    fn one_group_always_goes_direct_and_many_small_ones_never() {
        use PersistedForm::{Direct, Journal};
        let no_filesystem = costs(64 * KIB, None);
        assert_eq!(cheapest_form(1, 1, no_filesystem), Direct);
        assert_eq!(cheapest_form(0, 1 << 20, no_filesystem), Journal);
        assert_eq!(cheapest_form(2, 128 * KIB, no_filesystem), Direct);
        assert_eq!(cheapest_form(64, 1 << 20, no_filesystem), Journal);
        assert_eq!(cheapest_form(64, 1 << 20, costs(0, None)), Direct, "a free sync");
    }

    #[test]
    fn many_groups_take_one_filesystem_sync_unless_their_bytes_are_few() {
        use PersistedForm::{Direct, Filesystem, Journal};
        let both = costs(64 * KIB, Some(128 * KIB));
        assert_eq!(cheapest_form(64, 1 << 20, both), Filesystem, "64 x 16 KiB");
        assert_eq!(cheapest_form(64, 64 * KIB, both), Journal, "64 x 1 KiB: marks cost more");
        assert_eq!(cheapest_form(1, 64 * KIB, both), Direct, "one file's sync is cheaper");
        assert_eq!(cheapest_form(8, 8 * 16 * KIB, both), Filesystem);
        assert_eq!(cheapest_form(2, 32 * KIB, both), Journal);
        // The default's switch for 64 groups, as measured with journal cycles in flight: the
        // forms tie at about 3.2 MiB per cycle.
        let measured = costs(64 * KIB, Some(3072 * KIB));
        assert_eq!(cheapest_form(64, 1 << 20, measured), Journal, "64 x 16 KiB");
        assert_eq!(cheapest_form(64, 2 << 20, measured), Journal, "64 x 32 KiB");
        assert_eq!(cheapest_form(64, 4 << 20, measured), Filesystem, "64 x 64 KiB");
        assert_eq!(cheapest_form(8, 2 << 20, measured), Direct, "8 x 256 KiB");
    }
}
