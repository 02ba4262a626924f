//! The prepare ring: a partition's most recent prepares in memory, for tailing consumers and
//! repair requests, bounded by entries and bytes and by the shard's budget across all rings.
//!
//! Entries are views of the write buffer (no copy). The ring never evicts a prepare that is not
//! yet written to its segment — that would lose the only copy a reader could find — so a full
//! ring of unwritten prepares is backpressure, not eviction. It never touches disk.

use std::cell::Cell;
use std::collections::VecDeque;
use std::rc::Rc;

use bytes::Bytes;

use crate::record::prepare_of;
use crate::wire::{HEADER_SIZE, Header};

/// One stored prepare: its decoded header and the whole record (header and body) as stored.
#[derive(Clone, Debug)]
pub struct StoredPrepare {
    /// The decoded header.
    pub header: Header,
    /// Header and body bytes exactly as stored.
    pub record: Bytes,
}

impl StoredPrepare {
    /// The body (for a partition: the record batch).
    #[must_use]
    pub fn body(&self) -> Bytes {
        self.record.slice(HEADER_SIZE..)
    }

    /// The prepare's op.
    #[must_use]
    pub fn op(&self) -> u64 {
        prepare_of(&self.header).op
    }

    /// Offset of its first record.
    #[must_use]
    pub fn base_offset(&self) -> u64 {
        prepare_of(&self.header).base_offset
    }

    /// Offset just past its last record.
    #[must_use]
    pub fn end_offset(&self) -> u64 {
        let prepare = prepare_of(&self.header);
        prepare.end_offset()
    }
}

/// The shard-wide memory budget all rings draw from.
#[derive(Clone, Debug)]
pub struct RingBudget {
    used_bytes: Rc<Cell<usize>>,
    max_bytes: usize,
}

impl RingBudget {
    /// A budget of `max_bytes` for all rings of a shard.
    #[must_use]
    pub fn new(max_bytes: usize) -> Self {
        Self { used_bytes: Rc::new(Cell::new(0)), max_bytes }
    }

    /// Bytes currently held by all rings.
    #[must_use]
    pub fn used_bytes(&self) -> usize {
        self.used_bytes.get()
    }

    /// Whether `extra` more bytes would exceed the budget.
    pub(crate) fn over(&self, extra: usize) -> bool {
        self.used_bytes.get() + extra > self.max_bytes
    }
}

/// Bounds of one ring.
#[derive(Clone, Copy, Debug)]
pub struct RingLimits {
    /// Entries held at most.
    pub entries_max: usize,
    /// Bytes held at most.
    pub bytes_max: usize,
}

impl Default for RingLimits {
    fn default() -> Self {
        Self { entries_max: 65_536, bytes_max: 64 * 1024 * 1024 }
    }
}

/// The ring of one partition. Ops in it are contiguous.
#[derive(Debug)]
pub struct PrepareRing {
    entries: VecDeque<StoredPrepare>,
    bytes: usize,
    limits: RingLimits,
    budget: RingBudget,
}

/// The ring is full of prepares not yet written; retry after the next flush.
#[derive(Debug, PartialEq, Eq)]
pub struct RingFull;

impl PrepareRing {
    /// An empty ring (allocates nothing until the first push).
    #[must_use]
    pub fn new(limits: RingLimits, budget: RingBudget) -> Self {
        Self { entries: VecDeque::new(), bytes: 0, limits, budget }
    }

    /// Makes room for a prepare of `size_bytes` by evicting the oldest *written* prepares
    /// (`op <= written_op`) into `evicted` (the shard's batch cache); fails, evicting nothing
    /// more, when that is not enough. Call before anything of the prepare becomes visible, then
    /// [`PrepareRing::push`].
    pub fn reserve(
        &mut self,
        size_bytes: usize,
        written_op: u64,
        mut evicted: impl FnMut(StoredPrepare),
    ) -> Result<(), RingFull> {
        while self.entries.len() + 1 > self.limits.entries_max
            || self.bytes + size_bytes > self.limits.bytes_max
            || self.budget.over(size_bytes)
        {
            match self.entries.front() {
                Some(oldest) if oldest.op() <= written_op => evicted(self.evict_oldest()),
                _ => return Err(RingFull),
            }
        }
        Ok(())
    }

    /// Adds the newest prepare. Its room must have been reserved.
    ///
    /// # Panics
    /// If ops would not be contiguous, or the entry bound would be exceeded.
    pub fn push(&mut self, prepare: StoredPrepare) {
        if let Some(last) = self.entries.back() {
            assert_eq!(last.op() + 1, prepare.op(), "ring ops must be contiguous");
        }
        assert!(self.entries.len() < self.limits.entries_max, "ring push without reserve");
        let size = prepare.record.len();
        self.bytes += size;
        self.budget.used_bytes.set(self.budget.used_bytes.get() + size);
        self.entries.push_back(prepare);
    }

    /// The prepare with this op, if the ring holds it.
    #[must_use]
    pub fn by_op(&self, op: u64) -> Option<&StoredPrepare> {
        let first = self.entries.front()?.op();
        let index = usize::try_from(op.checked_sub(first)?).ok()?;
        self.entries.get(index)
    }

    /// The index of the prepare containing `offset`, if the ring holds it.
    #[must_use]
    pub fn position_of_offset(&self, offset: u64) -> Option<usize> {
        let first = self.entries.front()?;
        if offset < first.base_offset() || offset >= self.entries.back()?.end_offset() {
            return None;
        }
        let index = self.entries.partition_point(|entry| entry.end_offset() <= offset);
        Some(index)
    }

    /// The entry at ring index `index`.
    #[must_use]
    pub fn get(&self, index: usize) -> Option<&StoredPrepare> {
        self.entries.get(index)
    }

    /// The oldest op held.
    #[must_use]
    pub fn first_op(&self) -> Option<u64> {
        self.entries.front().map(StoredPrepare::op)
    }

    /// Entries held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the ring is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes held.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Drops every prepare above `op` (a truncation).
    pub fn truncate_after(&mut self, op: u64) {
        while self.entries.back().is_some_and(|entry| entry.op() > op) {
            let entry = self.entries.pop_back().expect("checked non-empty");
            self.release(entry.record.len());
        }
    }

    /// Drops every prepare up to `written_op` (they are on their segment: reads find them
    /// there), so the write-buffer memory their views hold goes back to the pool.
    pub fn evict_written(&mut self, written_op: u64) {
        self.evict_written_into(written_op, drop);
    }

    /// Hands every prepare up to `written_op` to `evicted` (they are on their segment), oldest
    /// first; returns the bytes given back to the budget.
    pub fn evict_written_into(
        &mut self,
        written_op: u64,
        mut evicted: impl FnMut(StoredPrepare),
    ) -> usize {
        let before = self.bytes;
        while self.entries.front().is_some_and(|entry| entry.op() <= written_op) {
            evicted(self.evict_oldest());
        }
        before - self.bytes
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        while let Some(entry) = self.entries.pop_back() {
            self.release(entry.record.len());
        }
    }

    fn evict_oldest(&mut self) -> StoredPrepare {
        let entry = self.entries.pop_front().expect("checked non-empty");
        self.release(entry.record.len());
        entry
    }

    fn release(&mut self, size: usize) {
        self.bytes -= size;
        self.budget.used_bytes.set(self.budget.used_bytes.get() - size);
    }
}

impl Drop for PrepareRing {
    fn drop(&mut self) {
        self.clear();
    }
}
