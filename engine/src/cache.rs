//! The shard's batch cache: prepares that are on their segment files, kept in memory within a
//! byte budget, so that consumers behind the ring read them without the disk. O_DIRECT bypasses
//! the page cache, so the engine keeps its own (DESIGN.md §3).
//!
//! Two sources fill it, neither with a copy: prepares a ring evicts once they are written (views
//! of the write chunks), and records that disk reads decoded, read-ahead included (views of the
//! read windows). When the budget needs room, the oldest insertions go first: consumers stream
//! forward, so what was cached first is what they are done with.
//!
//! It never holds a prepare that is not on its segment (the ring holds those) and never does
//! I/O. A log that truncates forgets the ops it cut, and a log that is dropped or replaced
//! forgets the rest; reads planned before such a change insert nothing (see
//! [`BatchCache::epoch`]).

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::ring::StoredPrepare;

/// Where a prepare sits in its group's map: (end offset, op). Ends never decrease along a log,
/// so this orders by op, and the first key past `(offset, u64::MAX)` is the prepare that
/// contains `offset` (prepares of no records share an end with their successor and sort
/// before it).
type Key = (u64, u64);

/// The cache of one shard.
#[derive(Debug, Default)]
pub struct BatchCache {
    budget_bytes: usize,
    used_bytes: usize,
    /// Bytes of write-chunk views held at most: the chunk pool must keep room for the rings
    /// and the chunks being filled, or every append would find it dry and take them all back.
    write_views_max_bytes: usize,
    write_views_bytes: usize,
    groups: HashMap<u64, BTreeMap<Key, Cached>>,
    /// Insertion order, oldest first: (group, key, stamp). An entry removed another way leaves
    /// its record here, recognised as stale by a stamp that no longer matches.
    order: VecDeque<(u64, Key, u64)>,
    entries: usize,
    next_stamp: u64,
    epoch: u64,
    counters: CacheCounters,
}

#[derive(Debug)]
struct Cached {
    prepare: StoredPrepare,
    stamp: u64,
    /// A view of a write chunk (evicted from a ring), which the chunk pool may want back.
    from_write: bool,
}

/// What the cache did since the shard opened (metrics read them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounters {
    /// Reads served from the cache (wholly or with the ring's help).
    pub hits: u64,
    /// Offset reads that had to go to disk.
    pub misses: u64,
    /// Bytes of records served from the cache.
    pub hit_bytes: u64,
    /// Bytes inserted, from rings and from disk reads.
    pub inserted_bytes: u64,
    /// Bytes evicted to make room.
    pub evicted_bytes: u64,
    /// Read-ahead reads planned.
    pub reads_ahead: u64,
}

impl BatchCache {
    /// An empty cache holding at most `budget_bytes` of records (0: caches nothing), of which
    /// at most `write_views_max_bytes` are views of write chunks.
    #[must_use]
    pub fn new(budget_bytes: usize, write_views_max_bytes: usize) -> Self {
        Self { budget_bytes, write_views_max_bytes, ..Self::default() }
    }

    /// The bound.
    #[must_use]
    pub fn budget_bytes(&self) -> usize {
        self.budget_bytes
    }

    /// Bytes of records held.
    #[must_use]
    pub fn used_bytes(&self) -> usize {
        self.used_bytes
    }

    /// Bytes of those that are views of write chunks.
    #[must_use]
    pub fn write_views_bytes(&self) -> usize {
        self.write_views_bytes
    }

    /// Prepares held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries
    }

    /// Whether it holds nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// The counters.
    #[must_use]
    pub fn counters(&self) -> CacheCounters {
        self.counters
    }

    pub(crate) fn counters_mut(&mut self) -> &mut CacheCounters {
        &mut self.counters
    }

    /// Changes whenever some log's history changes (a truncation, a log dropped or replaced).
    /// A disk read notes it when planned; what it found is cached only if it has not changed
    /// by the time the read completes, since it may hold ops that are no longer the log's.
    #[must_use]
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Caches a prepare of `group` that is on its segment file; keeps what it holds for the
    /// same place, and skips what could never fit.
    pub fn insert(&mut self, group: u64, prepare: StoredPrepare, from_write: bool) {
        let size = prepare.record.len();
        if size > self.budget_bytes || (from_write && size > self.write_views_max_bytes) {
            return;
        }
        let key = (prepare.end_offset(), prepare.op());
        if self.groups.get(&group).is_some_and(|map| map.contains_key(&key)) {
            return;
        }
        while self.used_bytes + size > self.budget_bytes
            || (from_write && self.write_views_bytes + size > self.write_views_max_bytes)
        {
            let Some((old_group, old_key, stamp)) = self.order.pop_front() else {
                unreachable!("bytes are held but no entry is");
            };
            if self.stamp_of(old_group, old_key) == Some(stamp) {
                let evicted = self.remove(old_group, old_key);
                self.counters.evicted_bytes += evicted as u64;
            }
        }
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.used_bytes += size;
        self.write_views_bytes += if from_write { size } else { 0 };
        self.entries += 1;
        self.counters.inserted_bytes += size as u64;
        self.order.push_back((group, key, stamp));
        self.groups.entry(group).or_default().insert(key, Cached { prepare, stamp, from_write });
        self.compact_order();
    }

    /// The cached prepare containing `offset` and those following it without a gap in ops: up
    /// to `bytes_max` bytes of records (always the first). Empty when `offset` is not cached.
    pub fn collect(&mut self, group: u64, offset: u64, bytes_max: usize) -> Vec<StoredPrepare> {
        let mut found: Vec<StoredPrepare> = Vec::new();
        let mut bytes = 0usize;
        for cached in self.run(group, offset) {
            if !found.is_empty() && bytes + cached.record.len() > bytes_max {
                break;
            }
            bytes += cached.record.len();
            found.push(cached.clone());
        }
        if !found.is_empty() {
            self.counters.hits += 1;
            self.counters.hit_bytes += bytes as u64;
        }
        found
    }

    /// Where the run of cached prepares starting with the one containing `offset` ends (the
    /// offset past its last record, `offset` itself when that one is not cached), looking at
    /// no more than `bytes_max` bytes, and the bytes of records it looked at.
    #[must_use]
    pub fn run_end(&self, group: u64, offset: u64, bytes_max: usize) -> (u64, usize) {
        let (mut end, mut bytes) = (offset, 0usize);
        for cached in self.run(group, offset) {
            if bytes >= bytes_max {
                break;
            }
            bytes += cached.record.len();
            end = cached.end_offset();
        }
        (end, bytes)
    }

    /// The cached prepare containing `offset` and those following it without a gap in ops
    /// (nothing when `offset` is not cached).
    fn run(&self, group: u64, offset: u64) -> impl Iterator<Item = &StoredPrepare> {
        let map = self.groups.get(&group);
        let mut next_op = None;
        map.into_iter()
            .flat_map(move |map| map.range((offset, u64::MAX)..))
            .map(|(_, cached)| &cached.prepare)
            .take_while(move |cached| {
                let contiguous = match next_op {
                    None => cached.base_offset() <= offset,
                    Some(op) => op == cached.op(),
                };
                next_op = Some(cached.op() + 1);
                contiguous
            })
    }

    /// Forgets `group`'s prepares above `op` (the log cut them).
    pub fn truncate_after(&mut self, group: u64, op: u64) {
        self.epoch += 1;
        let Some(map) = self.groups.get(&group) else { return };
        let cut: Vec<Key> = map.keys().rev().take_while(|key| key.1 > op).copied().collect();
        for key in cut {
            self.remove(group, key);
        }
    }

    /// Forgets everything of `group` (its log is dropped or replaced).
    pub fn forget(&mut self, group: u64) {
        self.epoch += 1;
        let Some(map) = self.groups.remove(&group) else { return };
        for cached in map.values() {
            self.account_removed(cached);
        }
        self.compact_order();
    }

    /// Drops the views of write chunks, so the chunk pool can reuse their memory (the shard
    /// asks when the pool runs dry).
    pub fn release_written(&mut self) {
        let mut released = Vec::new();
        for (&group, map) in &self.groups {
            released.extend(map.iter().filter(|(_, c)| c.from_write).map(|(&key, _)| (group, key)));
        }
        for (group, key) in released {
            self.remove(group, key);
        }
        self.compact_order();
    }

    fn stamp_of(&self, group: u64, key: Key) -> Option<u64> {
        self.groups.get(&group)?.get(&key).map(|cached| cached.stamp)
    }

    fn remove(&mut self, group: u64, key: Key) -> usize {
        let Some(map) = self.groups.get_mut(&group) else { return 0 };
        let Some(cached) = map.remove(&key) else { return 0 };
        if map.is_empty() {
            self.groups.remove(&group);
        }
        self.account_removed(&cached);
        cached.prepare.record.len()
    }

    fn account_removed(&mut self, cached: &Cached) {
        let size = cached.prepare.record.len();
        self.used_bytes -= size;
        self.write_views_bytes -= if cached.from_write { size } else { 0 };
        self.entries -= 1;
    }

    /// Drops stale order records once they outnumber the live ones, so the order queue stays
    /// within twice the entries held.
    fn compact_order(&mut self) {
        if self.order.len() <= 2 * self.entries + 64 {
            return;
        }
        let order = std::mem::take(&mut self.order);
        self.order = order
            .into_iter()
            .filter(|&(group, key, stamp)| self.stamp_of(group, key) == Some(stamp))
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::wire::{HEADER_SIZE, Header, Prepare};

    /// A prepare of `op` holding offsets `base..end`, its record `size` bytes long.
    fn prepare(op: u64, base: u64, end: u64, size: usize) -> StoredPrepare {
        let fields = Prepare {
            op,
            base_offset: base,
            record_count: (end - base) as u32,
            ..Prepare::default()
        };
        let header = Header::prepare(0, 1, 0, fields, &[]);
        StoredPrepare { header, record: Bytes::from(vec![0u8; size.max(HEADER_SIZE)]) }
    }

    #[test]
    fn a_run_is_served_from_the_prepare_containing_the_offset_and_stops_at_a_gap() {
        let mut cache = BatchCache::new(1 << 20, 1 << 20);
        for op in 1..=3 {
            cache.insert(7, prepare(op, (op - 1) * 10, op * 10, 1000), false);
        }
        cache.insert(7, prepare(5, 40, 50, 1000), false);
        let ops =
            |found: Vec<StoredPrepare>| found.iter().map(StoredPrepare::op).collect::<Vec<_>>();
        assert_eq!(ops(cache.collect(7, 15, usize::MAX)), [2, 3], "op 4 is missing");
        assert_eq!(ops(cache.collect(7, 0, 1500)), [1], "the first always, then within bytes");
        assert_eq!(ops(cache.collect(7, 30, usize::MAX)), Vec::<u64>::new(), "offset 30 is op 4's");
        assert_eq!(ops(cache.collect(8, 0, usize::MAX)), Vec::<u64>::new(), "another group");
        assert_eq!(cache.run_end(7, 5, usize::MAX), (30, 3000));
        assert_eq!(cache.run_end(7, 35, usize::MAX), (35, 0));
        assert_eq!(cache.counters().hits, 2);
    }

    #[test]
    fn the_budget_evicts_the_oldest_insertions_first() {
        let mut cache = BatchCache::new(3000, 3000);
        for op in 1..=5 {
            cache.insert(1, prepare(op, op, op + 1, 1000), false);
        }
        assert_eq!((cache.len(), cache.used_bytes()), (3, 3000));
        assert!(cache.collect(1, 2, usize::MAX).is_empty(), "op 2 was among the oldest");
        assert_eq!(cache.collect(1, 3, usize::MAX).len(), 3);
        cache.insert(1, prepare(9, 9, 10, 4000), false);
        assert_eq!(cache.len(), 3, "what can never fit is not cached");
        assert_eq!(cache.counters().evicted_bytes, 2000);
    }

    #[test]
    fn write_views_stay_within_their_own_bound() {
        let mut cache = BatchCache::new(10_000, 2_000);
        cache.insert(1, prepare(1, 1, 2, 1000), false);
        for op in 2..=6 {
            cache.insert(1, prepare(op, op, op + 1, 1000), true);
            assert!(cache.write_views_bytes() <= 2_000);
        }
        assert_eq!(cache.write_views_bytes(), 2_000);
        assert_eq!(cache.run_end(1, 5, usize::MAX), (7, 2000), "the newest write views stay");
        cache.insert(1, prepare(9, 9, 10, 3000), true);
        assert_eq!(cache.write_views_bytes(), 2_000, "a view larger than the bound is skipped");
        cache.forget(1);
        assert_eq!((cache.used_bytes(), cache.write_views_bytes()), (0, 0));
    }

    #[test]
    fn truncation_forgetting_and_released_write_views_leave_the_account_exact() {
        let mut cache = BatchCache::new(1 << 20, 1 << 20);
        for op in 1..=6 {
            cache.insert(1, prepare(op, op, op + 1, 300), op % 2 == 0);
            cache.insert(2, prepare(op, op, op + 1, 300), false);
        }
        let epoch = cache.epoch();
        cache.truncate_after(1, 4);
        assert!(cache.epoch() > epoch);
        assert_eq!(cache.run_end(1, 1, usize::MAX), (5, 1200));
        cache.release_written();
        assert_eq!(cache.run_end(1, 1, usize::MAX), (2, 300), "ops 2 and 4 were write views");
        cache.forget(2);
        assert_eq!((cache.len(), cache.used_bytes()), (2, 600));
        // Stale order records do not pile up past the bound.
        for round in 0..1000 {
            cache.insert(3, prepare(1, 0, 1, 300), false);
            cache.forget(3);
            assert!(cache.order.len() <= 2 * cache.len() + 65, "round {round}");
        }
        cache.forget(1);
        assert!(cache.is_empty() && cache.used_bytes() == 0);
    }
}
