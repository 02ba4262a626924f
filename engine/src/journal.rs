//! The shard journal: one pre-written, circular file per shard that `persisted` prepares of
//! every partition are appended to, so that *one* fdatasync per flush cycle makes everything
//! pending on the shard durable (DESIGN.md §3 Shard journal).
//!
//! Each entry is a wire header (`JournalEntry`: seq, durable_seq, tail_seq) framing one whole
//! prepare record. A cycle's entries are contiguous and start on a block boundary, so no block
//! is ever written twice in flight and recovery can find cycles by probing block boundaries.
//! Space behind the oldest entry still needed (not yet covered by its group's checkpoint) is
//! reused; when the next cycle would overwrite a needed entry the journal refuses more until
//! checkpoints release space.
//!
//! Up to `cycles_in_flight_max` cycles write at once, each into blocks of its own, and they
//! finish in the order they began: a cycle's sync covers its own write, never one still in
//! flight before it, so a cycle counts as durable only once every cycle before it is too.
//! Entries announce as `durable_seq` only what finished cycles made durable.
//!
//! Prepares wait as views of their ring records until a cycle begins, and only then get their
//! sequence numbers and bytes: the shard decides per cycle which groups' prepares the journal
//! takes and which go the direct path (DESIGN.md §3) instead. This module never decides that,
//! nor when to checkpoint or flush.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;

use crate::error::{Corruption, Error, Result};
use crate::partition::JournalPrepare;
use crate::record::prepare_of;
use crate::scan::Scanner;
use crate::storage::{
    AlignedBuf, BLOCK_SIZE_BYTES, BufferShelf, OpenMode, Storage, StorageFile, zero_pieces,
};
use crate::wire::{HEADER_SIZE, Header, JournalEntry};

/// The journal's file name inside a shard directory.
pub const FILE_NAME: &str = "journal";

/// Recovery reads the journal through a window this large (or one entry, if larger): the file
/// is 1 GiB by default, and a restart must not hold it whole (nor first touch that much memory).
const SCAN_WINDOW_BYTES: usize = 4 << 20;

/// An entry the scan found: where it lies and what its header says, not its bytes (the scan
/// walks stale laps of the ring too, and keeps only the needed entries' records).
#[derive(Clone, Copy, Debug)]
struct FoundEntry {
    position_bytes: u64,
    /// The whole entry's size, header included.
    size_bytes: u64,
    fields: JournalEntry,
}

/// One entry still needed for recovery.
#[derive(Clone, Copy, Debug)]
struct LiveEntry {
    seq: u64,
    group: u64,
    op: u64,
    position_bytes: u64,
    released: bool,
}

/// The open journal of one shard.
pub struct Journal<F> {
    file: Rc<F>,
    path: PathBuf,
    size_bytes: u64,
    /// Where the next cycle starts (block-aligned).
    head_bytes: u64,
    next_seq: u64,
    durable_seq: u64,
    /// The highest `durable_seq` carried by a synced entry: cycles up to it are known synced to
    /// recovery, so damage to them is reported as corruption rather than taken for a torn write.
    announced_seq: u64,
    cluster: u64,
    live: VecDeque<LiveEntry>,
    /// Prepares (and at most one marker) waiting for a cycle, in append order.
    pending: Vec<PendingEntry>,
    /// The bytes `pending` would take as entries.
    pending_bytes: usize,
    /// The last seq of each cycle in flight, oldest first.
    in_flight: VecDeque<u64>,
    cycles_in_flight_max: usize,
    /// The cycle buffers, kept between cycles (one per cycle in flight).
    buffers: BufferShelf,
}

/// A prepare waiting for a journal cycle: a view of its record, not a copy.
struct PendingEntry {
    /// `None` for a marker.
    prepare: Option<PendingPrepare>,
}

struct PendingPrepare {
    group: u64,
    op: u64,
    record: Bytes,
    record_checksum: u32,
}

impl PendingEntry {
    fn size_bytes(&self) -> usize {
        HEADER_SIZE + self.prepare.as_ref().map_or(0, |prepare| prepare.record.len())
    }
}

/// What [`Journal::begin_cycle`] does with a group's waiting prepares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// They join the cycle.
    Journal,
    /// They leave the journal: the group makes them durable on its own (the direct path).
    Drop,
    /// They wait for a later cycle.
    Keep,
}

/// One flush cycle's journal write and sync, owning what it touches.
pub struct JournalCycle<F> {
    file: Rc<F>,
    position_bytes: u64,
    bytes: Bytes,
    last_seq: u64,
    /// The `durable_seq` its entries announce.
    announces: u64,
}

impl<F: StorageFile> JournalCycle<F> {
    /// Writes the cycle's entries, then syncs the journal file: the one sync of the cycle.
    pub async fn run(&self) -> Result<()> {
        self.file
            .write_at(self.bytes.clone(), self.position_bytes)
            .await
            .map_err(|e| Error::io("writing the journal", e))?;
        #[cfg(not(feature = "canary-ack-before-sync"))]
        self.file.sync_data().await.map_err(|e| Error::io("syncing the journal", e))?;
        Ok(())
    }

    /// Bytes the cycle writes.
    pub fn len_bytes(&self) -> usize {
        self.bytes.len()
    }
}

/// What the journal held at open, for the partitions to replay.
#[derive(Debug, Default)]
pub struct JournalRecovery {
    /// Needed prepares per group, in op order.
    pub prepares: BTreeMap<u64, Vec<JournalPrepare>>,
    /// Entries found valid.
    pub entries_valid: u64,
    /// Damage in the journal's synced region (an entry that was synced is gone).
    pub corruption: Option<Corruption>,
}

impl<F: StorageFile> Journal<F> {
    /// Opens the shard journal, creating and pre-writing it with zeros when missing, and scans
    /// it for the entries recovery needs. At most `cycles_in_flight_max` (at least 1) cycles
    /// write at once.
    pub async fn open<S: Storage<File = F>>(
        storage: &S,
        dir: &Path,
        cluster: u64,
        size_bytes: u64,
        record_size_bytes_max: usize,
        cycles_in_flight_max: usize,
        groups_named: usize,
    ) -> Result<(Self, JournalRecovery)> {
        let cycles_in_flight_max = cycles_in_flight_max.max(1);
        let path = dir.join(FILE_NAME);
        if size_bytes < 2 * (record_size_bytes_max + HEADER_SIZE + BLOCK_SIZE_BYTES) as u64
            || !size_bytes.is_multiple_of(BLOCK_SIZE_BYTES as u64)
        {
            return Err(Error::Invalid(format!(
                "journal_size_bytes {size_bytes} must be block-aligned and hold two of the largest records"
            )));
        }
        let exists =
            storage.exists(&path).await.map_err(|e| Error::io("probing the journal", e))?;
        // A first start writes the journal before any group exists: a superblock naming groups
        // beside no journal lost it, with whatever acknowledged prepares it alone held.
        if !exists && groups_named > 0 {
            return Err(Error::Corruption(crate::Corruption {
                file: path,
                position_bytes: 0,
                offset: None,
                op: None,
                reason: format!(
                    "the journal is missing while the superblock names {groups_named} groups"
                ),
            }));
        }
        let file = storage
            .open(&path, OpenMode::CreateReadWrite, true)
            .await
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let mut journal = Journal {
            file: Rc::new(file),
            path,
            size_bytes,
            head_bytes: 0,
            next_seq: 1,
            durable_seq: 0,
            announced_seq: 0,
            cluster,
            live: VecDeque::new(),
            pending: Vec::new(),
            pending_bytes: 0,
            in_flight: VecDeque::new(),
            cycles_in_flight_max,
            buffers: BufferShelf::new(cycles_in_flight_max),
        };
        if !exists {
            journal.prewrite().await?;
            storage.sync_dir(dir).await.map_err(|e| Error::io("syncing the shard directory", e))?;
            return Ok((journal, JournalRecovery::default()));
        }
        let recovery = journal.scan(record_size_bytes_max).await?;
        journal.prewrite_past_end().await?;
        Ok((journal, recovery))
    }

    /// Zeros from the file's end to the configured size, when the file is shorter: a first
    /// start stopped during its pre-write, or `journal_size_bytes` grew. The ring then never
    /// writes past the file's end, where a full disk would be a write error that stops the
    /// shard instead of a clean "storage full" here, at start.
    async fn prewrite_past_end(&self) -> Result<()> {
        let file_size_bytes =
            self.file.size_bytes().await.map_err(|e| Error::io("sizing the journal", e))?;
        let from = file_size_bytes - file_size_bytes % BLOCK_SIZE_BYTES as u64;
        if from >= self.size_bytes {
            return Ok(());
        }
        for (position, zeros) in zero_pieces(from, self.size_bytes, 1 << 20) {
            self.file
                .write_at(zeros, position)
                .await
                .map_err(|e| Error::preparing("pre-writing the journal", e))?;
        }
        self.file.sync_data().await.map_err(|e| Error::io("syncing the journal", e))
    }

    async fn prewrite(&self) -> Result<()> {
        // One piece at a time: the file may be 1 GiB, written at start-up.
        for (position, zeros) in zero_pieces(0, self.size_bytes, 1 << 20) {
            self.file
                .write_at(zeros, position)
                .await
                .map_err(|e| Error::io("pre-writing the journal", e))?;
        }
        self.file.sync_data().await.map_err(|e| Error::io("syncing the journal", e))
    }

    /// Scans the whole file for valid entries, window by window; rebuilds the writer's state
    /// from the newest, and reads the records of the entries still needed a second time.
    async fn scan(&mut self, record_size_bytes_max: usize) -> Result<JournalRecovery> {
        let file = Rc::clone(&self.file);
        let entry_max = HEADER_SIZE + record_size_bytes_max;
        let mut scanner = Scanner::new(&*file, SCAN_WINDOW_BYTES.max(entry_max))
            .await
            .map_err(|e| Error::io("reading the journal", e))?;
        let mut found: BTreeMap<u64, FoundEntry> = BTreeMap::new();
        let block = BLOCK_SIZE_BYTES as u64;
        // The configured size bounds the ring, whatever the file's length.
        let scan_end = scanner.file_size_bytes().min(self.size_bytes);
        let mut position = 0u64;
        while position + HEADER_SIZE as u64 <= scan_end {
            let mut bytes = scanner
                .record_at(position, entry_max)
                .await
                .map_err(|e| Error::io("reading the journal", e))?;
            bytes.truncate(bytes.len().min((scan_end - position) as usize));
            match decode_entry(&bytes, entry_max) {
                Some((outer, fields, _)) => {
                    let size_bytes = u64::from(outer.size);
                    found.insert(
                        fields.seq,
                        FoundEntry { position_bytes: position, size_bytes, fields },
                    );
                    position += size_bytes;
                }
                None => position = (position + 1).next_multiple_of(block),
            }
        }
        let mut recovery =
            JournalRecovery { entries_valid: found.len() as u64, ..JournalRecovery::default() };
        let Some((_, newest)) = found.last_key_value() else {
            return Ok(recovery);
        };
        let durable_seq = found.values().map(|entry| entry.fields.durable_seq).max().unwrap_or(0);
        let tail_seq = newest.fields.tail_seq.max(1);
        let torn_at_seq = self
            .drop_past_torn_entry(&mut found, &mut scanner, durable_seq.max(tail_seq - 1))
            .await?;
        let Some((&newest_seq, &newest)) = found.last_key_value() else {
            // Only a torn cycle's later entries were found, and they are erased now. Their seqs
            // are not reused: the next cycle starts where the torn one broke.
            self.next_seq = torn_at_seq.unwrap_or(1);
            self.file.sync_data().await.map_err(|e| Error::io("syncing the journal", e))?;
            return Ok(recovery);
        };
        // Every entry the newest one says was synced and still needed must be here.
        if let Some(missing) =
            (tail_seq..=durable_seq.min(newest_seq)).find(|seq| !found.contains_key(seq))
        {
            let before = found.range(..missing).next_back().map_or(0, |(_, e)| e.position_bytes);
            recovery.corruption = Some(Corruption {
                file: self.path.clone(),
                position_bytes: before,
                offset: None,
                op: None,
                reason: format!("journal entry seq {missing} was synced but is missing or damaged"),
            });
        }
        self.next_seq = newest_seq + 1;
        self.head_bytes =
            (newest.position_bytes + newest.size_bytes).next_multiple_of(block) % self.size_bytes;
        for (&seq, entry) in found.range(tail_seq..) {
            // The second read of an entry the first one found whole: the bytes must not have
            // changed in between (nothing writes the journal while it opens).
            let bytes = scanner
                .record_at(entry.position_bytes, entry_max)
                .await
                .map_err(|e| Error::io("reading the journal", e))?;
            let Some((outer, fields, inner)) =
                decode_entry(&bytes, entry_max).filter(|(outer, fields, _)| {
                    *fields == entry.fields && u64::from(outer.size) == entry.size_bytes
                })
            else {
                return Err(Error::io(
                    "reading the journal",
                    std::io::Error::other(format!(
                        "entry seq {seq} at byte {} read differently the second time",
                        entry.position_bytes
                    )),
                ));
            };
            let Some(inner) = inner else { continue };
            let prepare = prepare_of(&inner);
            self.live.push_back(LiveEntry {
                seq: fields.seq,
                group: prepare.group,
                op: prepare.op,
                position_bytes: entry.position_bytes,
                released: false,
            });
            recovery.prepares.entry(prepare.group).or_default().push(JournalPrepare {
                seq,
                header: inner,
                record: bytes.slice(HEADER_SIZE..outer.size as usize),
            });
        }
        for prepares in recovery.prepares.values_mut() {
            // Op order, and within an op the newest view first (it supersedes older ones).
            prepares.sort_by_key(|prepare| {
                (prepare_of(&prepare.header).op, std::cmp::Reverse(prepare.header.view))
            });
        }
        // What was found is now made durable, so the next entries may say so.
        self.file.sync_data().await.map_err(|e| Error::io("syncing the journal", e))?;
        self.durable_seq = newest_seq;
        self.announced_seq = durable_seq;
        Ok(recovery)
    }

    /// A power loss can tear the last cycle so that entries past a damaged one survive whole
    /// (the disk keeps any subset of an unsynced write's sectors). Nothing in that cycle was
    /// acknowledged: it was never synced (a synced cycle is whole), or it is the newest synced
    /// one, which no entry announces yet and whose damage cannot be told from a tear. Recovery
    /// treats it as torn where it first breaks: the entries from the first seq missing above
    /// `announced_seq` on are dropped, and their headers are zeroed on disk so that no later
    /// scan finds them again under seqs the next cycles reuse. Kept, they would be replayed
    /// past a gap, and the next cycle would announce the missing seq as synced, which the next
    /// recovery reports as corruption. Returns the missing seq, if entries were dropped.
    async fn drop_past_torn_entry(
        &mut self,
        found: &mut BTreeMap<u64, FoundEntry>,
        scanner: &mut Scanner<'_, F>,
        announced_seq: u64,
    ) -> Result<Option<u64>> {
        let Some((&newest_seq, _)) = found.last_key_value() else { return Ok(None) };
        let Some(missing) = (announced_seq + 1..newest_seq).find(|seq| !found.contains_key(seq))
        else {
            return Ok(None);
        };
        let dropped = found.split_off(&missing);
        let block = BLOCK_SIZE_BYTES as u64;
        let mut blocks: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for entry in dropped.values() {
            let position = entry.position_bytes;
            for block_at in (position - position % block..position + HEADER_SIZE as u64)
                .step_by(BLOCK_SIZE_BYTES)
            {
                let contents = match blocks.entry(block_at) {
                    std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
                    std::collections::btree_map::Entry::Vacant(entry) => {
                        // A short (damaged) file reads as zeros past its end.
                        let mut contents = vec![0; BLOCK_SIZE_BYTES];
                        let on_file = scanner
                            .bytes_at(block_at, BLOCK_SIZE_BYTES)
                            .await
                            .map_err(|e| Error::io("reading the journal", e))?;
                        contents[..on_file.len()].copy_from_slice(&on_file);
                        entry.insert(contents)
                    }
                };
                let from = position.max(block_at);
                let to = (position + HEADER_SIZE as u64).min(block_at + block);
                contents[(from - block_at) as usize..(to - block_at) as usize].fill(0);
            }
        }
        for (block_at, contents) in blocks {
            let mut buffer = AlignedBuf::zeroed(BLOCK_SIZE_BYTES, BLOCK_SIZE_BYTES);
            buffer.extend_from_slice(&contents);
            self.file
                .write_at(buffer.freeze(), block_at)
                .await
                .map_err(|e| Error::io("erasing journal entries past a torn one", e))?;
        }
        Ok(Some(missing))
    }

    /// Where a cycle of `len_bytes` of entries starting at the head would lie: its start and
    /// block-aligned end.
    fn placement(&self, len_bytes: usize) -> (u64, u64) {
        let start = self.head_bytes;
        let len = len_bytes as u64;
        let end = (start + len).next_multiple_of(BLOCK_SIZE_BYTES as u64);
        if end > self.size_bytes {
            // The cycle does not fit before the end: it goes to the start of the file.
            (0, len.next_multiple_of(BLOCK_SIZE_BYTES as u64))
        } else {
            (start, end)
        }
    }

    /// Whether a record of `record_size_bytes` can wait for the next cycle now, with every
    /// prepare already waiting taken by it too. When not, the cycle would overwrite entries
    /// still needed: checkpoints must release space first.
    pub fn has_room(&self, record_size_bytes: usize) -> bool {
        let (start, end) = self.placement(self.pending_bytes + HEADER_SIZE + record_size_bytes);
        self.fits(start, end)
    }

    /// Adds a prepare record (header and body, as stored in the segment; a view, not a copy)
    /// to the prepares waiting for a cycle; `record_checksum` is the record's CRC-32C, which
    /// the caller derives from the prepare's checksums without reading the body again.
    ///
    /// # Panics
    /// If there is no room: callers check [`Journal::has_room`] first.
    pub fn add(&mut self, record: Bytes, record_checksum: u32, group: u64, op: u64) {
        assert!(self.has_room(record.len()), "journal add without room");
        let entry =
            PendingEntry { prepare: Some(PendingPrepare { group, op, record, record_checksum }) };
        self.pending_bytes += entry.size_bytes();
        self.pending.push(entry);
    }

    /// Whether `[start, end)` avoids every needed entry. Needed bytes run from the oldest
    /// needed entry to the head (where claimed space ends), wrapping.
    fn fits(&self, start: u64, end: u64) -> bool {
        if end > self.size_bytes {
            return false;
        }
        let oldest = self.live.iter().find(|entry| !entry.released);
        let Some(oldest) = oldest else { return true };
        let (from, to) = (oldest.position_bytes, self.head_bytes);
        let overlaps = |a: u64, b: u64| start < b && a < end;
        if from < to {
            !overlaps(from, to)
        } else {
            !overlaps(from, self.size_bytes) && !overlaps(0, to)
        }
    }

    /// The bytes of the entries waiting for a cycle.
    pub fn pending_bytes(&self) -> usize {
        self.pending_bytes
    }

    /// Whether a cycle is being written.
    pub fn cycle_in_flight(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// Whether another cycle may begin now (fewer than `cycles_in_flight_max` are in flight).
    pub fn can_begin_cycle(&self) -> bool {
        self.in_flight.len() < self.cycles_in_flight_max
    }

    /// The groups with prepares waiting, each with how many bytes they wait with.
    pub fn waiting_groups(&self) -> BTreeMap<u64, usize> {
        let mut groups = BTreeMap::new();
        for prepare in self.pending.iter().filter_map(|entry| entry.prepare.as_ref()) {
            *groups.entry(prepare.group).or_insert(0) += prepare.record.len();
        }
        groups
    }

    /// Takes the waiting prepares as `take` says per group, and returns the cycle writing
    /// those it takes into the journal (None when it takes none and no marker waits) with the
    /// highest op of each group in it. Markers always join the cycle. Unless
    /// [`Journal::can_begin_cycle`], `take` must not say [`Take::Journal`].
    pub fn begin_cycle(
        &mut self,
        mut take: impl FnMut(u64) -> Take,
    ) -> (Option<JournalCycle<F>>, Vec<(u64, u64)>) {
        let mut taken = Vec::new();
        let mut kept = Vec::new();
        let mut journaled: BTreeMap<u64, u64> = BTreeMap::new();
        for entry in std::mem::take(&mut self.pending) {
            let decision = entry.prepare.as_ref().map_or(Take::Journal, |p| take(p.group));
            match decision {
                Take::Journal => {
                    if let Some(prepare) = &entry.prepare {
                        journaled.insert(prepare.group, prepare.op);
                    }
                    taken.push(entry);
                }
                Take::Drop => {}
                Take::Keep => kept.push(entry),
            }
        }
        self.pending_bytes = kept.iter().map(PendingEntry::size_bytes).sum();
        self.pending = kept;
        if taken.is_empty() {
            return (None, Vec::new());
        }
        assert!(self.can_begin_cycle(), "journal cycles in flight past their bound");
        let len_bytes: usize = taken.iter().map(PendingEntry::size_bytes).sum();
        let (position_bytes, end) = self.placement(len_bytes);
        assert!(self.fits(position_bytes, end), "waiting prepares were admitted with room");
        let len = (end - position_bytes) as usize;
        let mut buffer = self.buffers.take(len, BLOCK_SIZE_BYTES);
        let tail_seq = self.live.front().map_or(self.next_seq, |entry| entry.seq);
        // What finished cycles made durable; the canary also claims the cycles in flight.
        let announces = match self.in_flight.back() {
            Some(&newest) if cfg!(feature = "canary-journal-announces-in-flight") => newest,
            _ => self.durable_seq,
        };
        for entry in taken {
            let fields = JournalEntry { seq: self.next_seq, durable_seq: announces, tail_seq };
            let position = position_bytes + buffer.len() as u64;
            match entry.prepare {
                Some(prepare) => {
                    let header = Header::journal_entry_checksummed(
                        self.cluster,
                        fields,
                        &prepare.record,
                        prepare.record_checksum,
                    );
                    buffer.extend_from_slice(&header.encode());
                    buffer.extend_from_slice(&prepare.record);
                    self.live.push_back(LiveEntry {
                        seq: self.next_seq,
                        group: prepare.group,
                        op: prepare.op,
                        position_bytes: position,
                        released: false,
                    });
                }
                None => {
                    let header = Header::journal_entry(self.cluster, fields, &[]);
                    buffer.extend_from_slice(&header.encode());
                }
            }
            self.next_seq += 1;
        }
        // A reused buffer holds an earlier cycle's bytes: the padding must read as zeros.
        let padding = len - buffer.len();
        buffer.spare_mut()[..padding].fill(0);
        buffer.set_len(len);
        self.in_flight.push_back(self.next_seq - 1);
        // The cycle's space is claimed from now on: the next cycle starts after it.
        self.head_bytes = end % self.size_bytes;
        let cycle = JournalCycle {
            file: Rc::clone(&self.file),
            position_bytes,
            bytes: self.buffers.freeze(buffer),
            last_seq: self.next_seq - 1,
            announces,
        };
        (Some(cycle), journaled.into_iter().collect())
    }

    /// Whether the newest synced cycle is not yet announced by a later synced entry (so a
    /// latent fault in it would look like a torn write). A marker cycle fixes that.
    pub fn needs_marker(&self) -> bool {
        self.durable_seq > self.announced_seq
            && self.pending.is_empty()
            && self.in_flight.is_empty()
    }

    /// Adds a marker entry: no prepare, only the announcement of what is durable. The shard
    /// writes one when the journal goes idle after a sync.
    pub fn add_marker(&mut self) {
        let entry = PendingEntry { prepare: None };
        let (start, end) = self.placement(self.pending_bytes + entry.size_bytes());
        if !self.fits(start, end) {
            return;
        }
        self.pending_bytes += entry.size_bytes();
        self.pending.push(entry);
    }

    /// Applies a completed cycle: its entries are durable. Call in the order the cycles
    /// began, each once the cycles before it finished: its sync did not cover their writes.
    pub fn finish_cycle(&mut self, cycle: &JournalCycle<F>) {
        assert_eq!(
            self.in_flight.pop_front(),
            Some(cycle.last_seq),
            "journal cycles finish in the order they began"
        );
        self.durable_seq = cycle.last_seq;
        self.announced_seq = self.announced_seq.max(cycle.announces);
    }

    /// Releases every entry of `group` up to `op` (its checkpoint covers them now).
    pub fn release(&mut self, group: u64, op: u64) {
        self.release_where(group, |entry_op| entry_op <= op);
    }

    /// Releases every entry of `group` above `op`: a durable cut (truncation, damage cut, state
    /// transfer) made them dead, and a group that must first get those ops back from peers
    /// would otherwise hold their space until its checkpoint passed them, filling the journal
    /// for every group meanwhile.
    pub fn release_above(&mut self, group: u64, op: u64) {
        self.release_where(group, |entry_op| entry_op > op);
    }

    /// Drops a deleted group from the journal: its prepares waiting for a cycle, and its
    /// entries (released, so their space is reused).
    pub fn forget_group(&mut self, group: u64) {
        let before = self.pending.len();
        self.pending.retain(|entry| entry.prepare.as_ref().is_none_or(|p| p.group != group));
        if self.pending.len() != before {
            self.pending_bytes = self.pending.iter().map(PendingEntry::size_bytes).sum();
        }
        self.release_matching(|entry| entry.group == group);
    }

    /// Releases, in one pass, every entry `dead(group, seq, op)` says no group needs (at open:
    /// a deleted group's, one an earlier group of the same id wrote, one a checkpoint covers).
    pub fn release_dead(&mut self, dead: impl Fn(u64, u64, u64) -> bool) {
        self.release_matching(|entry| dead(entry.group, entry.seq, entry.op));
    }

    /// Releases the entries of `group` whose op `released` picks, then frees the space of the
    /// released entries at the tail.
    fn release_where(&mut self, group: u64, released: impl Fn(u64) -> bool) {
        self.release_matching(|entry| entry.group == group && released(entry.op));
    }

    /// Releases the entries `released` picks, then frees the space of the released entries at
    /// the tail.
    fn release_matching(&mut self, released: impl Fn(&LiveEntry) -> bool) {
        for entry in &mut self.live {
            if released(entry) {
                entry.released = true;
            }
        }
        while self.live.front().is_some_and(|entry| entry.released) {
            self.live.pop_front();
        }
    }

    /// The oldest groups still holding journal space, oldest first (candidates for a
    /// checkpoint under journal pressure).
    pub fn oldest_groups(&self, count: usize) -> Vec<u64> {
        let mut groups = Vec::new();
        for entry in &self.live {
            if !entry.released && !groups.contains(&entry.group) {
                groups.push(entry.group);
                if groups.len() == count {
                    break;
                }
            }
        }
        groups
    }

    /// The sequence number of the newest entry added (0 before any).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Entries waiting for the next cycle.
    pub fn pending_entries(&self) -> usize {
        self.pending.len()
    }

    /// Needed entries held (pending ones included).
    pub fn live_entries(&self) -> usize {
        self.live.iter().filter(|entry| !entry.released).count()
    }
}

/// Decodes a journal entry at the start of `bytes`: outer header, body checksum, inner prepare.
/// Decodes the journal entry at the start of `bytes`: its header (checksum, then body
/// checksum), its fields, and the prepare header it frames — `None` for a marker, which only
/// announces what earlier cycles made durable. `None` overall when the bytes are not a whole,
/// valid entry. Recovery and `inspect` both read the journal through this.
pub fn decode_entry(
    bytes: &[u8],
    entry_size_bytes_max: usize,
) -> Option<(Header, JournalEntry, Option<Header>)> {
    let outer = Header::decode_prefix(bytes).ok()?;
    let fields = *outer.as_journal_entry()?;
    let size = outer.size as usize;
    if size == HEADER_SIZE {
        outer.verify_body(&[]).ok()?;
        return Some((outer, fields, None));
    }
    if size > entry_size_bytes_max || size > bytes.len() || size < 2 * HEADER_SIZE {
        return None;
    }
    outer.verify_body(&bytes[HEADER_SIZE..size]).ok()?;
    let inner = Header::decode_prefix(&bytes[HEADER_SIZE..size]).ok()?;
    inner.as_prepare()?;
    if HEADER_SIZE + inner.size as usize != size || inner.cluster != outer.cluster {
        return None;
    }
    Some((outer, fields, Some(inner)))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use bytes::Bytes;

    use super::{Journal, Take};
    use crate::storage::sim::{Sim, SimConfig, SimFile};
    use crate::storage::{BLOCK_SIZE_BYTES, Storage, StorageFile};
    use crate::wire::HEADER_SIZE;

    /// A journal shorter than its configured size (a first start stopped during its pre-write)
    /// is written with zeros to that size at open, so the ring never writes past the file's
    /// end; a journal missing beside a superblock that names groups is refused as damage.
    #[test]
    fn a_short_journal_is_written_to_its_size_and_a_lost_one_is_refused() {
        let sim = Sim::new(2, SimConfig::default());
        let storage = sim.storage();
        let dir = Path::new("/j");
        sim.block_on(storage.create_dir_all(dir)).unwrap();
        let path = dir.join(super::FILE_NAME);
        let file = sim
            .block_on(storage.open(&path, crate::storage::OpenMode::CreateReadWrite, true))
            .unwrap();
        sim.block_on(file.write_at(Bytes::from(vec![0; 8 << 10]), 0)).unwrap();
        drop(file);
        sim.block_on(Journal::open(&storage, dir, 1, 1 << 20, 64 << 10, 1, 3)).unwrap();
        let file =
            sim.block_on(storage.open(&path, crate::storage::OpenMode::ReadWrite, true)).unwrap();
        assert_eq!(sim.block_on(file.size_bytes()).unwrap(), 1 << 20);
        drop(file);
        sim.block_on(storage.remove_file(&path)).unwrap();
        let refused = sim.block_on(Journal::open(&storage, dir, 1, 1 << 20, 64 << 10, 1, 3));
        assert!(matches!(refused, Err(crate::Error::Corruption(_))), "{:?}", refused.err());
        // With no group named, a missing journal is a first start's.
        sim.block_on(Journal::open(&storage, dir, 1, 1 << 20, 64 << 10, 1, 0)).unwrap();
    }

    /// A cycle writes from the buffer the previous cycle used: the bytes past its entries must
    /// still be zeros (DESIGN.md §3: zeros end the data), not what the longer cycle left there.
    #[test]
    fn a_cycle_in_a_reused_buffer_pads_with_zeros() {
        let sim = Sim::new(1, SimConfig::default());
        let storage = sim.storage();
        sim.block_on(storage.create_dir_all(Path::new("/j"))).unwrap();
        let (mut journal, _) = sim
            .block_on(Journal::open(&storage, Path::new("/j"), 1, 1 << 20, 64 << 10, 1, 0))
            .unwrap();
        let cycle = |journal: &mut Journal<_>, record: Bytes, op: u64| {
            journal.add(record.clone(), shoal_proto::checksum::crc32c(&record), 1, op);
            let (cycle, _) = journal.begin_cycle(|_| Take::Journal);
            let cycle = cycle.expect("one entry");
            let written = cycle.bytes.clone();
            sim.block_on(cycle.run()).unwrap();
            journal.finish_cycle(&cycle);
            written
        };
        let long = cycle(&mut journal, Bytes::from(vec![0xAB; 40 << 10]), 1);
        let long_start = long.as_ptr();
        drop(long);
        let short = cycle(&mut journal, Bytes::from(vec![0xCD; 100]), 2);
        assert_eq!(short.as_ptr(), long_start, "the second cycle reuses the first one's buffer");
        assert_eq!(short.len(), BLOCK_SIZE_BYTES);
        assert!(short[HEADER_SIZE + 100..].iter().all(|&byte| byte == 0), "padding is zeros");
    }

    /// Opens a 1 MiB journal with two cycles in flight at most, and begins three one-entry
    /// cycles if it can: (cycles begun, journal).
    fn three_cycles(sim: &Sim) -> (Vec<super::JournalCycle<SimFile>>, Journal<SimFile>) {
        let storage = sim.storage();
        sim.block_on(storage.create_dir_all(Path::new("/j"))).unwrap();
        let (mut journal, _) = sim
            .block_on(Journal::open(&storage, Path::new("/j"), 1, 1 << 20, 64 << 10, 2, 0))
            .unwrap();
        let mut cycles = Vec::new();
        for op in 1..=3 {
            if !journal.can_begin_cycle() {
                break;
            }
            let record = Bytes::from(vec![op as u8; 100]);
            journal.add(record.clone(), shoal_proto::checksum::crc32c(&record), 1, op);
            cycles.push(journal.begin_cycle(|_| Take::Journal).0.expect("one entry"));
        }
        (cycles, journal)
    }

    /// A cycle begun beside one in flight announces only what finished cycles made durable, and
    /// no more cycles begin than the bound.
    #[test]
    fn cycles_in_flight_are_bounded_and_announce_only_finished_ones() {
        let sim = Sim::new(2, SimConfig::default());
        let (cycles, mut journal) = three_cycles(&sim);
        assert_eq!(cycles.len(), 2, "two in flight at most");
        assert_eq!(cycles.iter().map(|c| c.announces).collect::<Vec<_>>(), [0, 0]);
        assert_ne!(cycles[0].position_bytes, cycles[1].position_bytes, "blocks of their own");
        for cycle in &cycles {
            sim.block_on(cycle.run()).unwrap();
        }
        journal.finish_cycle(&cycles[0]);
        assert!(journal.can_begin_cycle());
        let record = Bytes::from(vec![3; 100]);
        journal.add(record.clone(), shoal_proto::checksum::crc32c(&record), 1, 3);
        let third = journal.begin_cycle(|_| Take::Journal).0.expect("one entry");
        assert_eq!(third.announces, 1, "the first cycle finished, the second did not");
        journal.finish_cycle(&cycles[1]);
        journal.finish_cycle(&third);
        assert!(!journal.cycle_in_flight());
    }

    /// Reopening a journal many windows long finds every needed entry, the ones that straddle
    /// a window's end too, and reads it a window at a time: a restart never holds the file
    /// (1 GiB by default) whole.
    #[test]
    fn recovery_reads_the_journal_a_window_at_a_time_and_finds_every_entry() {
        let sim = Sim::new(4, SimConfig::default());
        let storage = sim.storage();
        let dir = Path::new("/j");
        sim.block_on(storage.create_dir_all(dir)).unwrap();
        let size_bytes = 16 * super::SCAN_WINDOW_BYTES as u64;
        let record_max = 64 << 10;
        let (mut journal, _) =
            sim.block_on(Journal::open(&storage, dir, 1, size_bytes, record_max, 1, 0)).unwrap();
        // Odd-sized records, so entries end anywhere in a block and cross windows' ends.
        let records: Vec<Bytes> = (1..=300u64)
            .map(|op| {
                let body = vec![op as u8; 40_000 + op as usize * 7];
                let fields = crate::wire::Prepare { group: 5, op, ..Default::default() };
                let header = crate::wire::Header::prepare(1, 1, 0, fields, &body);
                let mut record = header.encode().to_vec();
                record.extend_from_slice(&body);
                Bytes::from(record)
            })
            .collect();
        for (i, record) in records.iter().enumerate() {
            let op = i as u64 + 1;
            journal.add(record.clone(), shoal_proto::checksum::crc32c(record), 5, op);
            let (cycle, _) = journal.begin_cycle(|_| Take::Journal);
            let cycle = cycle.expect("one entry");
            sim.block_on(cycle.run()).unwrap();
            journal.finish_cycle(&cycle);
        }
        let head_bytes = journal.head_bytes;
        assert!(head_bytes > 2 * super::SCAN_WINDOW_BYTES as u64, "entries span windows");
        drop(journal);
        let before = sim.stats().read_bytes_max;
        let (reopened, recovery) =
            sim.block_on(Journal::open(&storage, dir, 1, size_bytes, record_max, 1, 0)).unwrap();
        let read_bytes_max = sim.stats().read_bytes_max.max(before);
        assert!(
            read_bytes_max <= super::SCAN_WINDOW_BYTES as u64,
            "one read of {read_bytes_max} bytes, more than a window"
        );
        assert_eq!(recovery.entries_valid, 300);
        assert!(recovery.corruption.is_none());
        let found = &recovery.prepares[&5];
        assert_eq!(found.len(), 300, "every entry is needed: nothing was released");
        for (prepare, record) in found.iter().zip(&records) {
            assert_eq!(&prepare.record, record, "seq {}", prepare.seq);
        }
        assert_eq!(reopened.head_bytes, head_bytes, "the next cycle starts where they ended");
        assert_eq!(reopened.next_seq, 301);
    }

    #[test]
    #[should_panic(expected = "journal cycles finish in the order they began")]
    fn cycles_finished_out_of_order_are_refused() {
        let sim = Sim::new(3, SimConfig::default());
        let (cycles, mut journal) = three_cycles(&sim);
        journal.finish_cycle(&cycles[1]);
    }
}
