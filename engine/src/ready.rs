//! The shard's budget of ready space: disk made ready ahead of the data (reserved past a
//! segment's tail, or held by a spare segment file) by all the shard's partitions together.
//!
//! Ready space is what makes a full disk surface as a clean "storage full" while the space
//! already made ready still takes the writes in flight. A per-partition allowance would make
//! every partition cost disk before it wrote a byte; a shard budget hands it to the partitions
//! that are writing now, in steps that follow each one's rate (DESIGN.md §3). This module only
//! counts: it never touches disk, and never refuses space a write needs (a partition's own data
//! is always reserved whatever the budget says).

use std::cell::Cell;
use std::rc::Rc;

use crate::storage::BLOCK_SIZE_BYTES;

/// The smallest step of ready space a writing partition is given ahead of its tail (capped by
/// the configured largest step). A partition that wrote once holds at most this much ahead.
pub const READY_STEP_MIN_BYTES: u64 = 1 << 20;

/// The shard-wide account of ready space, shared by every partition log of the shard.
#[derive(Clone, Debug)]
pub struct ReadyBudget {
    held_bytes: Rc<Cell<u64>>,
    max_bytes: u64,
}

impl ReadyBudget {
    /// A budget of `max_bytes` of ready space for all partitions of a shard.
    #[must_use]
    pub fn new(max_bytes: u64) -> Self {
        Self { held_bytes: Rc::new(Cell::new(0)), max_bytes }
    }

    /// Ready space the shard's partitions hold now (or have asked for in jobs in flight).
    #[must_use]
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes.get()
    }

    /// The bound.
    #[must_use]
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// What may still be handed out, whole blocks only.
    #[must_use]
    pub fn available_bytes(&self) -> u64 {
        let free = self.max_bytes.saturating_sub(self.held_bytes.get());
        free - free % BLOCK_SIZE_BYTES as u64
    }

    /// Moves one holder's account from `from_bytes` to `to_bytes` (the holder keeps what it
    /// last reported, so the sum stays exact whatever order holders change in).
    pub(crate) fn update(&self, from_bytes: u64, to_bytes: u64) {
        let held = self.held_bytes.get();
        assert!(held >= from_bytes, "a holder reported more ready space than the shard counts");
        self.held_bytes.set(held - from_bytes + to_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_move_their_own_share_and_whole_blocks_are_handed_out() {
        let budget = ReadyBudget::new(10_000);
        budget.update(0, 4096);
        let other = budget.clone();
        other.update(0, 1000);
        assert_eq!(budget.held_bytes(), 5096);
        assert_eq!(budget.available_bytes(), 4096, "4904 free, one whole block");
        budget.update(4096, 0);
        other.update(1000, 12_000);
        assert_eq!(budget.held_bytes(), 12_000);
        assert_eq!(budget.available_bytes(), 0, "overdrawn: nothing more is handed out");
    }
}
