//! Idempotent producers of one partition group (DESIGN.md §4, after Kafka's idempotent
//! producer): per producer id its epoch and its last [`PRODUCER_BATCHES_MAX`] batches'
//! sequence ranges, ops and offsets, so a retried batch is recognised and answered with its
//! original offsets, and a gap is refused.
//!
//! It owns the table, its rules, its bounds and its snapshot bytes. It never decides what
//! enters the log (the replica checks a request against this table and its own uncommitted
//! pipeline), never does I/O and reads no clock: time is the prepares' `append_time_ms`, which
//! every replica sees identically, so every replica's table is the same function of the log.
//!
//! Rules (Kafka's): a batch whose producer id is negative is not idempotent and skips all of
//! this. Sequences count per partition from 0 and wrap from `i32::MAX` to 0. A producer the
//! table does not know may start only at sequence 0 (otherwise [`Check::UnknownProducer`]: it
//! expired, was evicted, or never existed); a newer epoch must start at 0; an older epoch is
//! fenced; within an epoch a batch must start right after the newest one, or repeat one of the
//! last five exactly (a duplicate).
//!
//! Bounds: at most `producers_max` producers; a producer that has appended nothing for
//! `expiration_ms` (by the newest append time the table has seen) is dropped; a new producer
//! beyond the bound evicts the least recently appending one (ties: the lowest id). Both are
//! deterministic, so replicas agree.

use std::collections::{BTreeMap, BTreeSet};

use shoal_proto::batch::{
    BASE_SEQUENCE_POS, BATCH_HEADER_SIZE, LAST_OFFSET_DELTA_POS, MAGIC_POS, PRODUCER_EPOCH_POS,
    PRODUCER_ID_POS,
};

/// Batches remembered per producer (Kafka's `max.in.flight.requests.per.connection` bound).
pub const PRODUCER_BATCHES_MAX: usize = 5;

/// Snapshot format version.
const SNAPSHOT_VERSION: u16 = 1;
/// Snapshot header: version, op, now_ms, count.
const SNAPSHOT_HEADER_SIZE: usize = 2 + 8 + 8 + 4;
/// One remembered batch: first_seq, last_seq, op, base_offset.
const SNAPSHOT_BATCH_SIZE: usize = 4 + 4 + 8 + 8;
/// One producer before its batches: id, epoch, last_append_ms, batch count.
const SNAPSHOT_PRODUCER_SIZE: usize = 8 + 2 + 8 + 1;
/// The smallest producer entry (one batch): bounds a count before allocating.
const SNAPSHOT_PRODUCER_SIZE_MIN: usize = SNAPSHOT_PRODUCER_SIZE + SNAPSHOT_BATCH_SIZE;

/// The idempotence fields of one batch, from its RecordBatch header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerBatch {
    /// The producer id (a session id on the native protocol).
    pub producer_id: i64,
    /// The producer epoch.
    pub epoch: i16,
    /// The batch's first sequence number.
    pub first_seq: i32,
    /// The batch's last sequence number (first plus the last offset delta, wrapping).
    pub last_seq: i32,
}

impl ProducerBatch {
    /// The fields of an idempotent batch, or `None` for a batch without a producer (id -1) or
    /// bytes too short or of another magic to be a RecordBatch v2. Reads fixed header fields
    /// only, so it is cheap and safe on any bytes; the caller validated the batch itself.
    pub fn from_body(body: &[u8]) -> Option<ProducerBatch> {
        if body.len() < BATCH_HEADER_SIZE || body[MAGIC_POS] != 2 {
            return None;
        }
        let producer_id = i64::from_be_bytes(field(body, PRODUCER_ID_POS));
        if producer_id < 0 {
            return None;
        }
        let epoch = i16::from_be_bytes(field(body, PRODUCER_EPOCH_POS));
        let first_seq = i32::from_be_bytes(field(body, BASE_SEQUENCE_POS));
        let delta = i32::from_be_bytes(field(body, LAST_OFFSET_DELTA_POS));
        Some(ProducerBatch { producer_id, epoch, first_seq, last_seq: add_seq(first_seq, delta) })
    }
}

fn field<const N: usize>(body: &[u8], pos: usize) -> [u8; N] {
    body[pos..pos + N].try_into().expect("length checked")
}

/// `seq + delta` on Kafka's sequence circle (0..=i32::MAX).
fn add_seq(seq: i32, delta: i32) -> i32 {
    if seq < 0 || delta < 0 {
        // Not a valid range; the check refuses it, so the value only has to be stable.
        return seq;
    }
    ((i64::from(seq) + i64::from(delta)) % (i64::from(i32::MAX) + 1)) as i32
}

/// The sequence after `seq`.
fn next_seq(seq: i32) -> i32 {
    if seq == i32::MAX { 0 } else { seq + 1 }
}

/// What the table says about a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The next batch of its producer: append it.
    New,
    /// A batch already in the log at `op`, starting at `base_offset`: answer with those.
    Duplicate {
        /// The op that holds it.
        op: u64,
        /// Its first offset.
        base_offset: u64,
    },
    /// A gap (or a bad sequence): refused, never enters the log.
    OutOfOrderSequence,
    /// A non-zero sequence from a producer the table does not know (expired, evicted, new).
    UnknownProducer,
    /// An epoch older than the producer's current one.
    ProducerFenced,
}

/// One remembered batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchRecord {
    /// First sequence.
    pub first_seq: i32,
    /// Last sequence.
    pub last_seq: i32,
    /// The op that holds it.
    pub op: u64,
    /// Its first offset.
    pub base_offset: u64,
}

/// One producer's state: its epoch and its newest batches, oldest first. Fixed size, so a
/// check can copy it and lay the uncommitted pipeline over it without allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerState {
    epoch: i16,
    last_append_ms: i64,
    len: u8,
    batches: [BatchRecord; PRODUCER_BATCHES_MAX],
}

impl ProducerState {
    /// A producer with no batch yet.
    pub fn new(epoch: i16, append_ms: i64) -> ProducerState {
        ProducerState {
            epoch,
            last_append_ms: append_ms,
            len: 0,
            batches: [BatchRecord::default(); PRODUCER_BATCHES_MAX],
        }
    }

    /// The producer's epoch.
    pub fn epoch(&self) -> i16 {
        self.epoch
    }

    /// The remembered batches, oldest first.
    pub fn batches(&self) -> &[BatchRecord] {
        &self.batches[..usize::from(self.len)]
    }

    /// Records an appended batch: a new epoch forgets the old one's batches; beyond the window
    /// the oldest goes. It never checks: the log is the truth.
    pub fn record(&mut self, batch: &ProducerBatch, op: u64, base_offset: u64, append_ms: i64) {
        if batch.epoch != self.epoch {
            self.epoch = batch.epoch;
            self.len = 0;
        }
        self.last_append_ms = self.last_append_ms.max(append_ms);
        let record =
            BatchRecord { first_seq: batch.first_seq, last_seq: batch.last_seq, op, base_offset };
        if usize::from(self.len) == PRODUCER_BATCHES_MAX {
            self.batches.copy_within(1.., 0);
            self.batches[PRODUCER_BATCHES_MAX - 1] = record;
        } else {
            self.batches[usize::from(self.len)] = record;
            self.len += 1;
        }
    }
}

/// The rules for `batch` against its producer's state (`None`: unknown).
pub fn check(state: Option<&ProducerState>, batch: &ProducerBatch) -> Check {
    if batch.first_seq < 0 || batch.epoch < 0 {
        return Check::OutOfOrderSequence;
    }
    let Some(state) = state else {
        return if batch.first_seq == 0 { Check::New } else { Check::UnknownProducer };
    };
    if batch.epoch < state.epoch {
        return Check::ProducerFenced;
    }
    if batch.epoch > state.epoch {
        return if batch.first_seq == 0 { Check::New } else { Check::OutOfOrderSequence };
    }
    let batches = state.batches();
    if let Some(b) =
        batches.iter().find(|b| b.first_seq == batch.first_seq && b.last_seq == batch.last_seq)
    {
        return Check::Duplicate { op: b.op, base_offset: b.base_offset };
    }
    match batches.last() {
        Some(newest) if batch.first_seq == next_seq(newest.last_seq) => Check::New,
        // An epoch with no batch yet (not reachable through `record`): only 0 starts it.
        None if batch.first_seq == 0 => Check::New,
        _ => Check::OutOfOrderSequence,
    }
}

/// The table's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerLimits {
    /// Producers kept at most; a new one beyond evicts the least recently appending.
    pub producers_max: usize,
    /// A producer with no append for this long (by append times) is dropped.
    pub expiration_ms: i64,
}

/// Why snapshot bytes were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotError(pub &'static str);

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "producer snapshot: {}", self.0)
    }
}

impl std::error::Error for SnapshotError {}

/// The committed producer state of one partition group. See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerTable {
    limits: ProducerLimits,
    producers: BTreeMap<i64, ProducerState>,
    /// (last_append_ms, id) of every producer: the eviction and expiry order.
    by_age: BTreeSet<(i64, i64)>,
    /// The newest append time applied: the table's clock.
    now_ms: i64,
    /// The highest op applied: the table is the log's state as of this op.
    op: u64,
    /// Producers dropped by expiry or eviction, for status.
    dropped: u64,
}

impl ProducerTable {
    /// An empty table.
    ///
    /// # Panics
    /// When `producers_max` is 0 (configs are validated where they are read).
    pub fn new(limits: ProducerLimits) -> ProducerTable {
        assert!(limits.producers_max > 0, "producers_max must be at least 1");
        ProducerTable {
            limits,
            producers: BTreeMap::new(),
            by_age: BTreeSet::new(),
            now_ms: i64::MIN,
            op: 0,
            dropped: 0,
        }
    }

    /// Producers known.
    pub fn len(&self) -> usize {
        self.producers.len()
    }

    /// Whether no producer is known.
    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// The highest op applied.
    pub fn op(&self) -> u64 {
        self.op
    }

    /// Producers dropped by expiry or eviction since this table was built.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The bounds.
    pub fn limits(&self) -> ProducerLimits {
        self.limits
    }

    /// A producer's state as of `now_ms` (`None` when unknown or expired by then).
    pub fn state(&self, producer_id: i64, now_ms: i64) -> Option<ProducerState> {
        let state = self.producers.get(&producer_id)?;
        let now_ms = now_ms.max(self.now_ms);
        (!self.expired(state.last_append_ms, now_ms)).then_some(*state)
    }

    /// The rules for `batch` against the committed table, as of `now_ms`.
    pub fn check(&self, batch: &ProducerBatch, now_ms: i64) -> Check {
        check(self.state(batch.producer_id, now_ms).as_ref(), batch)
    }

    /// Applies a committed batch at `op`: expires, records, evicts. Never refuses (the log is
    /// the truth; the primary checked before the batch entered it). An op at or below the
    /// table's is already in it (a snapshot taken past where a restart replays from) and is
    /// skipped, so applying the log again from any earlier op is harmless.
    pub fn apply(&mut self, batch: &ProducerBatch, op: u64, base_offset: u64, append_ms: i64) {
        if op <= self.op {
            return;
        }
        self.op = op;
        self.now_ms = self.now_ms.max(append_ms);
        self.expire();
        let now_ms = self.now_ms;
        let state = match self.producers.get_mut(&batch.producer_id) {
            Some(state) => {
                self.by_age.remove(&(state.last_append_ms, batch.producer_id));
                state
            }
            None => {
                if self.producers.len() >= self.limits.producers_max {
                    self.evict_oldest();
                }
                self.producers
                    .entry(batch.producer_id)
                    .or_insert(ProducerState::new(batch.epoch, now_ms))
            }
        };
        state.record(batch, op, base_offset, now_ms);
        self.by_age.insert((state.last_append_ms, batch.producer_id));
    }

    fn expired(&self, last_append_ms: i64, now_ms: i64) -> bool {
        last_append_ms.saturating_add(self.limits.expiration_ms) < now_ms
    }

    fn expire(&mut self) {
        while let Some(&(last, id)) = self.by_age.first() {
            if !self.expired(last, self.now_ms) {
                break;
            }
            self.by_age.pop_first();
            self.producers.remove(&id);
            self.dropped += 1;
        }
    }

    fn evict_oldest(&mut self) {
        if let Some((_, id)) = self.by_age.pop_first() {
            self.producers.remove(&id);
            self.dropped += 1;
        }
    }

    /// Marks every op up to `op` applied (a replay that found no idempotent batch there still
    /// moves the table's position).
    pub fn advance_to(&mut self, op: u64) {
        self.op = self.op.max(op);
    }

    /// The snapshot's bytes (little-endian): version u16, op u64, now_ms i64, count u32, then per
    /// producer in id order: id i64, epoch i16, last_append_ms i64, batch count u8 (1..=5),
    /// and per batch first_seq i32, last_seq i32, op u64, base_offset u64. The container
    /// (`engine::state`) checksums them.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            SNAPSHOT_HEADER_SIZE
                + self.producers.len() * (SNAPSHOT_PRODUCER_SIZE + SNAPSHOT_BATCH_SIZE * 5),
        );
        out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        out.extend_from_slice(&self.op.to_le_bytes());
        out.extend_from_slice(&self.now_ms.to_le_bytes());
        out.extend_from_slice(&(self.producers.len() as u32).to_le_bytes());
        for (id, state) in &self.producers {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&state.epoch.to_le_bytes());
            out.extend_from_slice(&state.last_append_ms.to_le_bytes());
            out.push(state.len);
            for b in state.batches() {
                out.extend_from_slice(&b.first_seq.to_le_bytes());
                out.extend_from_slice(&b.last_seq.to_le_bytes());
                out.extend_from_slice(&b.op.to_le_bytes());
                out.extend_from_slice(&b.base_offset.to_le_bytes());
            }
        }
        out
    }

    /// A table from snapshot bytes. Hostile-input safe: every count is bounded by the bytes
    /// present before anything is allocated; ids must ascend; nothing may trail. A snapshot
    /// holding more producers than `limits` allows (the bound was lowered) is cut down by the
    /// eviction rule.
    pub fn decode(bytes: &[u8], limits: ProducerLimits) -> Result<ProducerTable, SnapshotError> {
        let mut r = Cursor { bytes, pos: 0 };
        if r.u16()? != SNAPSHOT_VERSION {
            return Err(SnapshotError("unknown version"));
        }
        let op = r.u64()?;
        let now_ms = r.i64()?;
        let count = r.u32()? as usize;
        if count > r.remaining() / SNAPSHOT_PRODUCER_SIZE_MIN {
            return Err(SnapshotError("producer count beyond the bytes present"));
        }
        let mut table = ProducerTable::new(limits);
        table.now_ms = now_ms;
        table.op = op;
        let mut previous: Option<i64> = None;
        for _ in 0..count {
            let id = r.i64()?;
            if id < 0 || previous.is_some_and(|p| p >= id) {
                return Err(SnapshotError("producer ids not ascending"));
            }
            previous = Some(id);
            let epoch = r.i16()?;
            let last_append_ms = r.i64()?;
            let len = r.u8()?;
            if len == 0 || usize::from(len) > PRODUCER_BATCHES_MAX {
                return Err(SnapshotError("batch count not in 1..=5"));
            }
            let mut state = ProducerState::new(epoch, last_append_ms);
            for slot in 0..usize::from(len) {
                state.batches[slot] = BatchRecord {
                    first_seq: r.i32()?,
                    last_seq: r.i32()?,
                    op: r.u64()?,
                    base_offset: r.u64()?,
                };
            }
            state.len = len;
            table.producers.insert(id, state);
            table.by_age.insert((last_append_ms, id));
        }
        if r.remaining() != 0 {
            return Err(SnapshotError("trailing bytes"));
        }
        while table.producers.len() > limits.producers_max {
            table.evict_oldest();
        }
        Ok(table)
    }
}

/// A bounds-checked little-endian reader.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let end = self.pos.checked_add(N).ok_or(SnapshotError("truncated"))?;
        let slice = self.bytes.get(self.pos..end).ok_or(SnapshotError("truncated"))?;
        self.pos = end;
        Ok(slice.try_into().expect("N bytes"))
    }

    fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, SnapshotError> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn i16(&mut self) -> Result<i16, SnapshotError> {
        Ok(i16::from_le_bytes(self.take()?))
    }
    fn i32(&mut self) -> Result<i32, SnapshotError> {
        Ok(i32::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn i64(&mut self) -> Result<i64, SnapshotError> {
        Ok(i64::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
}

#[cfg(test)]
mod tests {
    use shoal_proto::batch::BatchBuilder;

    use super::*;

    const LIMITS: ProducerLimits = ProducerLimits { producers_max: 3, expiration_ms: 1_000 };

    fn batch(id: i64, epoch: i16, first: i32, count: i32) -> ProducerBatch {
        ProducerBatch {
            producer_id: id,
            epoch,
            first_seq: first,
            last_seq: add_seq(first, count - 1),
        }
    }

    /// Applies batches of `count` records from sequence `first` on, one op each.
    fn table_with(ops: &[(i64, i16, i32, i32)]) -> ProducerTable {
        let mut table = ProducerTable::new(LIMITS);
        for (i, &(id, epoch, first, count)) in ops.iter().enumerate() {
            let b = batch(id, epoch, first, count);
            assert_eq!(table.check(&b, 0), Check::New, "op {}", i + 1);
            table.apply(&b, i as u64 + 1, 10 * i as u64, 0);
        }
        table
    }

    #[test]
    fn fields_come_from_the_batch_header_and_non_idempotent_batches_have_none() {
        let mut builder = BatchBuilder::new(1).producer(7, 2, 40);
        for _ in 0..3 {
            builder.push(1, None, Some(b"v"), &[]);
        }
        let parsed = ProducerBatch::from_body(&builder.build());
        assert_eq!(
            parsed,
            Some(ProducerBatch { producer_id: 7, epoch: 2, first_seq: 40, last_seq: 42 })
        );
        let mut plain = BatchBuilder::new(1);
        plain.push(1, None, Some(b"v"), &[]);
        assert_eq!(ProducerBatch::from_body(&plain.build()), None);
        assert_eq!(ProducerBatch::from_body(&[0; 10]), None);
    }

    #[test]
    fn sequences_must_follow_on_and_duplicates_return_their_original_op_and_offset() {
        let table = table_with(&[(1, 0, 0, 2), (1, 0, 2, 3)]);
        assert_eq!(table.check(&batch(1, 0, 5, 1), 0), Check::New);
        assert_eq!(table.check(&batch(1, 0, 2, 3), 0), Check::Duplicate { op: 2, base_offset: 10 });
        assert_eq!(table.check(&batch(1, 0, 0, 2), 0), Check::Duplicate { op: 1, base_offset: 0 });
        // A gap, a different range at a known start, a repeat overlapping a batch.
        assert_eq!(table.check(&batch(1, 0, 6, 1), 0), Check::OutOfOrderSequence);
        assert_eq!(table.check(&batch(1, 0, 2, 2), 0), Check::OutOfOrderSequence);
        assert_eq!(table.check(&batch(1, 0, 1, 1), 0), Check::OutOfOrderSequence);
        assert_eq!(table.check(&batch(1, 0, -1, 1), 0), Check::OutOfOrderSequence);
    }

    #[test]
    fn an_unknown_producer_may_start_only_at_zero() {
        let table = table_with(&[(1, 0, 0, 1)]);
        assert_eq!(table.check(&batch(2, 0, 0, 1), 0), Check::New);
        assert_eq!(table.check(&batch(2, 0, 5, 1), 0), Check::UnknownProducer);
    }

    #[test]
    fn only_the_last_five_batches_are_remembered() {
        let table = table_with(&[
            (1, 0, 0, 1),
            (1, 0, 1, 1),
            (1, 0, 2, 1),
            (1, 0, 3, 1),
            (1, 0, 4, 1),
            (1, 0, 5, 1),
        ]);
        assert_eq!(table.state(1, 0).unwrap().batches().len(), PRODUCER_BATCHES_MAX);
        assert_eq!(table.check(&batch(1, 0, 1, 1), 0), Check::Duplicate { op: 2, base_offset: 10 });
        // The first batch fell out of the window: no longer provably a duplicate.
        assert_eq!(table.check(&batch(1, 0, 0, 1), 0), Check::OutOfOrderSequence);
        assert_eq!(table.check(&batch(1, 0, 6, 1), 0), Check::New);
    }

    #[test]
    fn sequences_wrap_from_i32_max_to_zero() {
        let max = i32::MAX;
        let mut table = ProducerTable::new(LIMITS);
        let mut state = ProducerState::new(0, 0);
        state.record(&batch(1, 0, max - 1, 1), 1, 0, 0);
        table.producers.insert(1, state);
        table.by_age.insert((0, 1));
        // Two records from MAX end at 0.
        let across = batch(1, 0, max, 2);
        assert_eq!(across.last_seq, 0);
        assert_eq!(table.check(&across, 0), Check::New);
        table.apply(&across, 2, 1, 0);
        assert_eq!(table.check(&batch(1, 0, 1, 1), 0), Check::New);
        assert_eq!(table.check(&across, 0), Check::Duplicate { op: 2, base_offset: 1 });
    }

    #[test]
    fn a_new_epoch_starts_at_zero_and_fences_the_old_one() {
        let mut table = table_with(&[(1, 0, 0, 3)]);
        assert_eq!(table.check(&batch(1, 1, 3, 1), 0), Check::OutOfOrderSequence);
        assert_eq!(table.check(&batch(1, 1, 0, 1), 0), Check::New);
        table.apply(&batch(1, 1, 0, 1), 2, 3, 0);
        assert_eq!(table.check(&batch(1, 0, 3, 1), 0), Check::ProducerFenced);
        assert_eq!(table.check(&batch(1, 1, 1, 1), 0), Check::New);
        assert_eq!(table.state(1, 0).unwrap().batches().len(), 1, "the old epoch is forgotten");
    }

    #[test]
    fn the_table_holds_producers_max_and_evicts_the_least_recently_appending() {
        let mut table = ProducerTable::new(LIMITS);
        for (op, id) in [(1, 10), (2, 11), (3, 12)] {
            table.apply(&batch(id, 0, 0, 1), op, op, op as i64);
        }
        // Producer 10 appends again: 11 is now the least recent.
        table.apply(&batch(10, 0, 1, 1), 4, 4, 4);
        assert_eq!(table.len(), LIMITS.producers_max);
        table.apply(&batch(13, 0, 0, 1), 5, 5, 5);
        assert_eq!(table.len(), LIMITS.producers_max);
        assert_eq!(table.dropped(), 1);
        assert_eq!(table.check(&batch(11, 0, 1, 1), 5), Check::UnknownProducer);
        assert_eq!(table.check(&batch(10, 0, 2, 1), 5), Check::New);
        assert_eq!(table.check(&batch(12, 0, 1, 1), 5), Check::New);
    }

    #[test]
    fn producers_expire_by_append_time_never_by_a_clock() {
        let mut table = ProducerTable::new(LIMITS);
        table.apply(&batch(1, 0, 0, 1), 1, 0, 1_000);
        table.apply(&batch(2, 0, 0, 1), 2, 1, 1_500);
        // Exactly at the expiration it is still known; past it, not (a check sees it gone
        // before any apply removes it).
        assert_eq!(table.check(&batch(1, 0, 1, 1), 2_000), Check::New);
        assert_eq!(table.check(&batch(1, 0, 1, 1), 2_001), Check::UnknownProducer);
        table.apply(&batch(2, 0, 1, 1), 3, 2, 2_001);
        assert_eq!(table.len(), 1, "applying at a later time drops the expired producer");
        // Append times that go back (another primary's clock) never move the table's back.
        table.apply(&batch(2, 0, 2, 1), 4, 3, 10);
        assert_eq!(table.check(&batch(2, 0, 3, 1), 0), Check::New);
    }

    #[test]
    fn the_snapshot_round_trips() {
        let mut table = table_with(&[(1, 0, 0, 2), (5, 3, 0, 1), (1, 0, 2, 1)]);
        table.apply(&batch(9, 1, 0, 4), 9, 90, 77);
        let decoded = ProducerTable::decode(&table.encode(), LIMITS).unwrap();
        assert_eq!(decoded.producers, table.producers);
        assert_eq!(decoded.by_age, table.by_age);
        assert_eq!((decoded.now_ms, decoded.op), (table.now_ms, table.op));
        let empty = ProducerTable::new(LIMITS);
        assert_eq!(ProducerTable::decode(&empty.encode(), LIMITS).unwrap(), empty);
        // A lowered bound cuts a snapshot down by the eviction rule.
        let small = ProducerLimits { producers_max: 1, ..LIMITS };
        let cut = ProducerTable::decode(&table.encode(), small).unwrap();
        assert_eq!(cut.producers.keys().copied().collect::<Vec<_>>(), vec![9]);
    }

    #[test]
    fn every_truncated_or_damaged_snapshot_is_refused_without_panicking() {
        let mut table = table_with(&[(1, 0, 0, 2), (2, 0, 0, 1)]);
        table.apply(&batch(1, 0, 2, 1), 3, 2, 5);
        let bytes = table.encode();
        for len in 0..bytes.len() {
            assert!(ProducerTable::decode(&bytes[..len], LIMITS).is_err(), "truncated at {len}");
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(ProducerTable::decode(&trailing, LIMITS).is_err());
        // Every single-byte change decodes to an error or to some table, never a panic.
        for pos in 0..bytes.len() {
            for value in [0x00, 0x01, 0x05, 0x06, 0x7f, 0x80, 0xff] {
                let mut damaged = bytes.clone();
                damaged[pos] = value;
                let _ = ProducerTable::decode(&damaged, LIMITS);
            }
        }
        let mut huge_count = bytes.clone();
        huge_count[18..22].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            ProducerTable::decode(&huge_count, LIMITS),
            Err(SnapshotError("producer count beyond the bytes present"))
        );
        let mut bad_len = bytes.clone();
        bad_len[SNAPSHOT_HEADER_SIZE + 18] = 6;
        assert!(ProducerTable::decode(&bad_len, LIMITS).is_err());
        let mut swapped = bytes;
        swapped[SNAPSHOT_HEADER_SIZE..SNAPSHOT_HEADER_SIZE + 8]
            .copy_from_slice(&9i64.to_le_bytes());
        assert_eq!(
            ProducerTable::decode(&swapped, LIMITS),
            Err(SnapshotError("producer ids not ascending"))
        );
    }
}
