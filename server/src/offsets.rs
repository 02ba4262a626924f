//! Consumer offsets of one partition, and its log start: what the partition's committed
//! offset-commit and log-start control records add up to, and its snapshot.
//!
//! It owns the table, its bound and the snapshot's byte layout: the offsets table, then
//! optional tagged sections, each at most once — the partition's idempotent producer table
//! (bytes of `shoal_replication::ProducerTable::encode`, which this module carries but never
//! reads) and the log start (written only once it is above 0). A snapshot written before
//! sections existed is the offsets table alone. It never proposes a commit,
//! never checks who may commit (group generations are the shard's, against the catalog) and
//! never does I/O: the shard applies committed records in log order, saves snapshots through
//! `engine::state` and replays the log past the newest one at start-up.

use std::collections::BTreeMap;

use shoal_proto::protocol::consumer::{ConsumerId, LogStartRecord, OffsetCommitRecord};
use shoal_proto::protocol::{ProtocolError, Reader, Writer};

/// Why a commit cannot be applied.
#[derive(Debug, PartialEq, Eq)]
pub struct TableFull {
    /// The bound.
    pub consumers_max: usize,
}

/// One partition's stored offsets, as of `end_offset` of its log.
#[derive(Debug)]
pub struct PartitionOffsets {
    table: BTreeMap<ConsumerId, u64>,
    /// Changed since the last snapshot was taken.
    pub dirty: bool,
    /// What the newest durable snapshot covers: the log below this offset.
    pub snapshot_end: u64,
    /// The log's size when that snapshot was taken.
    pub snapshot_size_bytes: u64,
    /// A snapshot save is in flight.
    pub saving: bool,
    /// The producer table op the newest snapshot save carried (a clean shutdown saves again
    /// when the table moved past it).
    pub producers_saved_op: u64,
    /// The first offset consumers may read (`DeleteRecords` moved it; 0 until then).
    pub log_start: u64,
    /// No committed batch other than an offset commit ends past this offset: an upper bound
    /// (where a replay or a transferred log began; `u64::MAX` when nothing is known). Past it
    /// the log holds only offset commits, which consumers skip: see
    /// [`PartitionOffsets::commit_needed`].
    pub data_end: u64,
}

impl Default for PartitionOffsets {
    fn default() -> Self {
        PartitionOffsets {
            table: BTreeMap::new(),
            dirty: false,
            snapshot_end: 0,
            snapshot_size_bytes: 0,
            saving: false,
            producers_saved_op: 0,
            log_start: 0,
            data_end: u64::MAX,
        }
    }
}

/// Section tag: the producer table.
const SECTION_PRODUCERS: u8 = 1;
/// Section tag: the log start.
const SECTION_LOG_START: u8 = 2;
/// The largest producer section accepted: bounds what a damaged length could make us trust.
const SECTION_SIZE_BYTES_MAX: usize = shoal_engine::state::STATE_SIZE_BYTES_MAX;

impl PartitionOffsets {
    /// The stored offset of `consumer`.
    pub fn get(&self, consumer: &ConsumerId) -> Option<u64> {
        self.table.get(consumer).copied()
    }

    /// The table of a log created just now: no consumer, no data.
    pub fn for_new_log() -> Self {
        PartitionOffsets { data_end: 0, ..PartitionOffsets::default() }
    }

    /// The offset to report as `consumer`'s: its stored one, or — when only offset commits lie
    /// between that and `committed_end` — `committed_end`, so a consumer that read everything
    /// has no lag although its own commit moved the end.
    pub fn effective(&self, consumer: &ConsumerId, committed_end: u64) -> Option<u64> {
        let stored = self.get(consumer)?;
        Some(if stored >= self.data_end && stored < committed_end { committed_end } else { stored })
    }

    /// Whether committing `offset` for `consumer` changes anything a consumer would read from:
    /// not when it is the stored offset, nor when it only moves past offset commits up to
    /// `committed_end` (each commit would otherwise move the end, and an idle group commit
    /// forever). Past the end, data may yet arrive: such a commit is stored.
    pub fn commit_needed(&self, consumer: &ConsumerId, offset: u64, committed_end: u64) -> bool {
        match self.get(consumer) {
            Some(stored) if stored == offset => false,
            Some(stored) => {
                !(stored < offset && offset <= committed_end && stored >= self.data_end)
            }
            None => true,
        }
    }

    /// A committed batch that is not an offset commit, ending at `end_offset`.
    pub fn data_committed(&mut self, end_offset: u64) {
        self.data_end = self.data_end.max(end_offset);
    }

    /// Whether one more consumer could store an offset.
    pub fn check_room(&self, consumer: &ConsumerId, consumers_max: usize) -> Result<(), TableFull> {
        if self.table.len() >= consumers_max && !self.table.contains_key(consumer) {
            return Err(TableFull { consumers_max });
        }
        Ok(())
    }

    /// Applies the offset commit or log start a stored batch holds, if it is one: `Ok(true)`
    /// when applied, `Ok(false)` for any other batch, `Err` for one that claims to be either
    /// and does not decode (nothing applied).
    pub fn apply_batch(&mut self, batch: &[u8]) -> Result<bool, ProtocolError> {
        if let Some(start) = LogStartRecord::from_batch(batch) {
            self.apply_log_start(start?.offset);
            return Ok(true);
        }
        match OffsetCommitRecord::from_batch(batch) {
            Some(Ok(record)) => {
                self.apply(record);
                Ok(true)
            }
            Some(Err(error)) => Err(error),
            None => Ok(false),
        }
    }

    /// Moves the log start up to `offset` (never down: a retried or reordered request that
    /// names an older start changes nothing).
    pub fn apply_log_start(&mut self, offset: u64) {
        if offset > self.log_start {
            self.log_start = offset;
            self.dirty = true;
        }
    }

    /// Applies a committed record. A record beyond the bound (possible only when the bound was
    /// lowered since it was accepted) is still applied: the log is the truth.
    pub fn apply(&mut self, record: OffsetCommitRecord) {
        match record.offset {
            Some(offset) => self.table.insert(record.consumer, offset),
            None => self.table.remove(&record.consumer),
        };
        self.dirty = true;
    }

    /// Takes `installed`'s offsets in place of this table's (a state transfer replaced the
    /// machine): the snapshot bookkeeping stays, and the table counts as changed, so that a
    /// snapshot of the new table is saved.
    pub fn replace_table(&mut self, installed: PartitionOffsets) {
        self.table = installed.table;
        self.log_start = installed.log_start;
        self.dirty = true;
    }

    /// Consumers with a stored offset.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no consumer has a stored offset.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// The snapshot's bytes: a count, then each consumer's kind, name and offset.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(self.table.len() as u32);
        for (consumer, offset) in &self.table {
            consumer.write(&mut w);
            w.u64(*offset);
        }
        w.finish()
    }

    /// A table from snapshot bytes (hostile-input safe: counts are bounded by the bytes present).
    pub fn decode(bytes: &[u8]) -> Result<PartitionOffsets, String> {
        let (offsets, _) = PartitionOffsets::decode_snapshot(bytes)?;
        Ok(offsets)
    }

    /// The snapshot's bytes: the offsets table, the producer table's section (tag u8 1,
    /// length u32, the bytes), then, once above 0, the log start's (tag u8 2, length u32 8,
    /// the offset u64).
    pub fn encode_snapshot(&self, producers: &[u8]) -> Vec<u8> {
        let mut w = Writer::new();
        w.raw(&self.encode());
        w.u8(SECTION_PRODUCERS);
        w.bytes(producers);
        if self.log_start > 0 {
            w.u8(SECTION_LOG_START);
            w.bytes(&self.log_start.to_le_bytes());
        }
        w.finish()
    }

    /// The offsets table (with its log start) and the producer section, if the snapshot has
    /// one. Hostile-input safe: every length is bounded before it is believed; an unknown or
    /// repeated tag, or trailing bytes, refuse the snapshot.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<(PartitionOffsets, Option<&[u8]>), String> {
        let mut r = Reader::new(bytes);
        type Table = BTreeMap<ConsumerId, u64>;
        fn decode<'a>(
            r: &mut Reader<'a>,
        ) -> shoal_proto::protocol::Result<(Table, Option<&'a [u8]>, u64)> {
            let count = r.count("consumers", 1 + 2 + 8)?;
            let mut table = BTreeMap::new();
            for _ in 0..count {
                let consumer = ConsumerId::read(r)?;
                table.insert(consumer, r.u64("offset")?);
            }
            let (mut producers, mut log_start) = (None, None);
            while r.remaining() > 0 {
                let refused = |reason: &str| shoal_proto::protocol::ProtocolError::Invalid {
                    field: "section",
                    reason: reason.into(),
                };
                match r.u8("section")? {
                    SECTION_PRODUCERS if producers.is_none() => {
                        producers = Some(r.bytes("producers", SECTION_SIZE_BYTES_MAX)?)
                    }
                    SECTION_LOG_START if log_start.is_none() => {
                        let bytes = r.bytes("log_start", 8)?;
                        let bytes: [u8; 8] =
                            bytes.try_into().map_err(|_| refused("a log start is 8 bytes"))?;
                        log_start = Some(u64::from_le_bytes(bytes));
                    }
                    SECTION_PRODUCERS | SECTION_LOG_START => return Err(refused("repeated")),
                    _ => return Err(refused("unknown section tag")),
                }
            }
            r.end()?;
            Ok((table, producers, log_start.unwrap_or(0)))
        }
        let (table, producers, log_start) = decode(&mut r).map_err(|e| e.to_string())?;
        Ok((PartitionOffsets { table, log_start, ..PartitionOffsets::default() }, producers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_apply_in_order_and_the_snapshot_round_trips() {
        let mut offsets = PartitionOffsets::default();
        let group = ConsumerId::group("g");
        let consumer = ConsumerId::consumer("c");
        offsets.apply(OffsetCommitRecord { consumer: group.clone(), offset: Some(5) });
        offsets.apply(OffsetCommitRecord { consumer: consumer.clone(), offset: Some(1) });
        offsets.apply(OffsetCommitRecord { consumer: group.clone(), offset: Some(9) });
        offsets.apply(OffsetCommitRecord { consumer: consumer.clone(), offset: None });
        assert_eq!((offsets.get(&group), offsets.get(&consumer)), (Some(9), None));
        assert!(offsets.dirty);
        let decoded = PartitionOffsets::decode(&offsets.encode()).unwrap();
        assert_eq!(decoded.get(&group), Some(9));
        assert_eq!(decoded.len(), 1);
        assert!(!decoded.dirty);
        let mut garbled = offsets.encode();
        garbled[4] = 7; // the consumer kind
        assert!(PartitionOffsets::decode(&garbled).is_err());
    }

    /// Offset commits past a stored offset do not count as something to read: committing past
    /// them stores nothing, and the stored offset reads as the end, so lag can reach 0.
    #[test]
    fn commits_over_only_offset_commits_are_not_needed_and_read_as_the_end() {
        let mut offsets = PartitionOffsets::for_new_log();
        let g = ConsumerId::group("g");
        offsets.data_committed(10);
        assert!(offsets.commit_needed(&g, 10, 10), "nothing stored yet");
        offsets.apply(OffsetCommitRecord { consumer: g.clone(), offset: Some(10) });
        // The commit record itself took offset 10: the end is 11.
        assert_eq!(offsets.effective(&g, 11), Some(11));
        assert!(!offsets.commit_needed(&g, 10, 11), "the same offset");
        assert!(!offsets.commit_needed(&g, 11, 11), "past the commit record only");
        assert!(offsets.commit_needed(&g, 12, 11), "past the end: data may come");
        assert!(offsets.commit_needed(&g, 4, 11), "backwards");
        // New data: the stored offset is behind it again.
        offsets.data_committed(15);
        assert_eq!(offsets.effective(&g, 15), Some(10));
        assert!(offsets.commit_needed(&g, 15, 15));
        assert_eq!(offsets.effective(&ConsumerId::group("other"), 15), None);
    }

    #[test]
    fn the_producer_section_round_trips_and_old_snapshots_still_decode() {
        let mut offsets = PartitionOffsets::default();
        offsets.apply(OffsetCommitRecord { consumer: ConsumerId::consumer("c"), offset: Some(3) });
        let snapshot = offsets.encode_snapshot(b"producer bytes");
        let (decoded, producers) = PartitionOffsets::decode_snapshot(&snapshot).unwrap();
        assert_eq!(decoded.get(&ConsumerId::consumer("c")), Some(3));
        assert_eq!(producers, Some(&b"producer bytes"[..]));
        // Written before sections existed: the offsets table alone.
        let old = offsets.encode();
        let (_, none) = PartitionOffsets::decode_snapshot(&old).unwrap();
        assert_eq!(none, None);
        for len in offsets.encode().len() + 1..snapshot.len() {
            assert!(PartitionOffsets::decode_snapshot(&snapshot[..len]).is_err(), "cut at {len}");
        }
        let mut unknown = snapshot.clone();
        unknown[offsets.encode().len()] = 9;
        assert!(PartitionOffsets::decode_snapshot(&unknown).is_err());
        let mut trailing = snapshot;
        trailing.push(0);
        assert!(PartitionOffsets::decode_snapshot(&trailing).is_err());
    }

    #[test]
    fn the_log_start_only_moves_up_and_round_trips_through_the_snapshot() {
        let mut offsets = PartitionOffsets::default();
        let start = |offset| LogStartRecord { offset }.to_batch(0);
        assert_eq!(offsets.apply_batch(&start(40)), Ok(true));
        assert_eq!(offsets.apply_batch(&start(10)), Ok(true));
        assert_eq!(offsets.log_start, 40, "never down");
        offsets.apply(OffsetCommitRecord { consumer: ConsumerId::consumer("c"), offset: Some(3) });
        let snapshot = offsets.encode_snapshot(b"p");
        let (decoded, producers) = PartitionOffsets::decode_snapshot(&snapshot).unwrap();
        assert_eq!((decoded.log_start, producers), (40, Some(&b"p"[..])));
        assert_eq!(decoded.get(&ConsumerId::consumer("c")), Some(3));
        // A log start of 0 writes no section: what a binary without it wrote, and reads.
        let plain = PartitionOffsets::default().encode_snapshot(b"p");
        assert_eq!(PartitionOffsets::decode_snapshot(&plain).unwrap().0.log_start, 0);
        let mut repeated = snapshot.clone();
        repeated.extend_from_slice(&snapshot[snapshot.len() - 13..]);
        assert!(PartitionOffsets::decode_snapshot(&repeated).is_err(), "a section twice");
        for len in snapshot.len() - 12..snapshot.len() {
            assert!(PartitionOffsets::decode_snapshot(&snapshot[..len]).is_err(), "cut at {len}");
        }
    }

    #[test]
    fn the_table_is_bounded_but_a_known_consumer_may_always_commit() {
        let mut offsets = PartitionOffsets::default();
        offsets.apply(OffsetCommitRecord { consumer: ConsumerId::consumer("a"), offset: Some(1) });
        assert_eq!(offsets.check_room(&ConsumerId::consumer("a"), 1), Ok(()));
        assert_eq!(
            offsets.check_room(&ConsumerId::consumer("b"), 1),
            Err(TableFull { consumers_max: 1 })
        );
    }
}
