//! Recovery (DESIGN.md §3): a group's log rebuilt from its files and the shard journal, and the
//! protocol-aware recovery of a damaged log that cuts the chain at the damage.
//!
//! A torn tail past the checkpoint is ordinary and is cut; damage before it is corruption and
//! leaves the log faulty, never truncated (except by an explicit damage cut, which marks every
//! op past it faulty rather than absent).

use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;

use super::log::{
    FaultyOps, Location, PartitionLog, SegmentMeta, Shared, open_segment, spare_holds_records,
};
use crate::direct::TRAILER_BYTES;
use crate::error::{Corruption, Error, Result};
use crate::record::{ChainNext, RecordFault, check_next, check_standalone, prepare_of};
use crate::scan::Scanner;
use crate::segment::{
    IndexSummary, SPARE_NAME, SegmentIndex, index_name, log_name, parse_log_name,
};
use crate::storage::{AlignedBuf, BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile};
use crate::superblock::{Checkpoint, Durability, Fence, GroupConfig, GroupSlot};
use crate::wire::{HEADER_SIZE, Header};

/// What recovery found in one group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupRecovery {
    /// The group.
    pub group: u64,
    /// The last valid op after recovery.
    pub head_op: u64,
    /// Records scanned in segments.
    pub records_scanned: u64,
    /// Prepares replayed from the shard journal.
    pub journal_replayed: u64,
    /// Where the torn tail was cut, and why (a torn tail is ordinary).
    pub torn_tail: Option<(PathBuf, u64, String)>,
    /// The op the torn window's first invalid record would have held, when that record is
    /// damaged bytes rather than zeros or stale data. The newest synced record, before a later
    /// sync mark announces it, reads the same when latent damage hits it: a replica with peers
    /// holds the ops from here faulty (see `ShardStore::hold_torn_tail_faulty`).
    pub torn_record_op: Option<u64>,
    /// Damage before the torn window: the group refuses service.
    pub corruption: Option<Corruption>,
    /// Where a damage cut ([`PartitionLog::recover_cut`]) ended the chain, and why.
    pub cut: Option<(PathBuf, u64, String)>,
    /// Ops that are faulty rather than absent.
    pub faulty: FaultyOps,
    /// Index files rebuilt because they were missing, behind or damaged.
    pub indexes_rebuilt: u64,
}

/// A prepare found in the shard journal for this group, for replay at recovery.
#[derive(Clone, Debug)]
pub struct JournalPrepare {
    /// The journal entry's sequence number.
    pub seq: u64,
    /// The prepare's header.
    pub header: Header,
    /// The whole record (header and body).
    pub record: Bytes,
}

/// Where recovery's scan of the torn window begins.
struct WindowStart {
    /// The record the chain must continue with.
    next: ChainNext,
    /// Where the scan begins in the window's first segment.
    position_bytes: u64,
    /// The index of that segment's part before `position_bytes` (synced, when the scan begins
    /// at the checkpoint).
    index: SegmentIndex,
    /// The scan begins right after the checkpoint record (else at op 1 of a fresh log).
    from_checkpoint: bool,
}

impl<S: Storage> PartitionLog<S> {
    /// Recovers a group's log (DESIGN.md §3 Recovery): loads or rebuilds the indexes of synced
    /// segments, checks the checkpoint record, scans forward from it through the torn window,
    /// cuts the torn tail, replays journal prepares past it, and reports what it found. Damage
    /// before the window leaves the log faulty (refusing service), never truncated.
    pub async fn recover(
        storage: S,
        shared: Rc<Shared>,
        dir: PathBuf,
        slot: GroupSlot,
        config: GroupConfig,
        journal: &[JournalPrepare],
    ) -> Result<(Self, GroupRecovery)> {
        let mut log = Self::empty(storage, shared, dir, slot, config);
        let mut report = GroupRecovery { group: slot.group, ..GroupRecovery::default() };
        let mut outcome = log.recover_segments(&slot, &mut report, false).await;
        if cfg!(feature = "canary-truncate-corruption")
            && matches!(outcome, Err(Error::Corruption(_)))
        {
            // Canary (DESIGN.md §7): forget that the damage lies before the torn window and cut
            // the log at the first invalid record, as if it were a torn tail.
            let forgetful = GroupSlot { checkpoint: Checkpoint::default(), ..slot };
            let (storage, shared, dir) =
                (log.storage.clone(), Rc::clone(&log.shared), log.dir.clone());
            log = Self::empty(storage, shared, dir, forgetful, config);
            report = GroupRecovery { group: slot.group, ..GroupRecovery::default() };
            outcome = log.recover_segments(&forgetful, &mut report, true).await;
        }
        match outcome {
            Ok(()) => {}
            Err(Error::Corruption(corruption)) => {
                log.faulty = Some(corruption.to_string());
                report.corruption = Some(corruption);
                report.head_op = log.head.op;
                return Ok((log, report));
            }
            Err(error) => return Err(error),
        }
        // Replay the journal past the segments' end (persisted groups). Entries come in op
        // order, the newest view first: a later view's prepare of an op supersedes an older
        // one, and one the fence killed is dead.
        for entry in journal {
            let op = prepare_of(&entry.header).op;
            if op < log.next.op
                || entry.seq <= log.journal_floor_seq
                || log.fence.kills_journal_entry(op, entry.header.view, entry.seq)
            {
                continue;
            }
            let record_max = log.config.record_size_bytes_max as usize;
            // The fence judged the entry above (by its journal position, not the segment rule).
            let no_fence = Fence::default();
            if op > log.next.op
                || check_next(&entry.record, &log.next, &no_fence, record_max).is_err()
            {
                // A synced prepare is missing (or does not connect) before this one: what
                // follows may have been acknowledged, so it is faulty rather than absent.
                log.faulty_ops.suffix_from = Some(log.next.op);
                break;
            }
            let body = &entry.record[HEADER_SIZE..];
            match log.append(&entry.header, body) {
                Ok(()) => {}
                // The journal may hold more of this group than its ring keeps unwritten (the
                // segment writes a power loss took): write what was replayed so far to the
                // segment, which frees the ring, and go on. The journal keeps it durable until
                // the checkpoint that open asks for after a replay passes it.
                Err(Error::LimitReached(_)) => {
                    log.write_replayed().await?;
                    log.append(&entry.header, body)?;
                }
                Err(error) => return Err(error),
            }
            report.journal_replayed += 1;
        }
        if log.damaged_from != 0 {
            // A damage cut whose ops the replica has not all had back yet: whatever the log
            // lacks past its head may have been acknowledged (DESIGN.md §3).
            log.fault_past_head();
        }
        report.head_op = log.head.op;
        report.faulty = log.faulty_ops.clone();
        log.account_ready();
        Ok((log, report))
    }

    /// Protocol-aware recovery of a damaged log (DESIGN.md §3), for a group whose replica has
    /// peers to fetch from: where [`PartitionLog::recover`] found damage before the torn window
    /// (or a read found it later), this recovers again trusting nothing but the chain itself.
    /// It scans every segment from the first record, ends the chain at the first record that is
    /// not valid, zeroes everything past it and removes later segments (durably: synced), and
    /// returns a log whose checkpoint is at most the chain's new end and whose slot carries the
    /// durable marker [`GroupSlot::damaged_from`]: every op past the head is faulty, not absent,
    /// until the replica has it back. The caller writes the slot to the superblock before it
    /// appends anything. Journal prepares are not replayed: whatever they held lies past the
    /// cut, in the faulty suffix.
    ///
    /// A crash part-way is safe: until the superblock holds the new slot, its old checkpoint
    /// names a record that is now zeros or in a removed segment, so the next open finds damage
    /// again and cuts again, at the same place.
    ///
    /// `head_op_known` is the head the log had before (0 when unknown): a chain ending below it
    /// or below the old checkpoint lost ops, whatever the bytes there look like.
    ///
    /// When the log's very first record is damaged and retention (or a state transfer) removed
    /// what came before it, the chain cannot be continued from anything: the log is cut to
    /// empty, positioned at op 1 and offset 0, with every op faulty (`damaged_from` 1). Its
    /// replica fetches the ops again from peers that hold them from op 1, or takes a state
    /// transfer (`ShardStore::install_transfer` accepts any op above the empty log's head).
    pub async fn recover_cut(
        storage: S,
        shared: Rc<Shared>,
        dir: PathBuf,
        slot: GroupSlot,
        config: GroupConfig,
        head_op_known: u64,
    ) -> Result<(Self, GroupRecovery)> {
        let forgetful = GroupSlot { checkpoint: Checkpoint::default(), ..slot };
        let mut log = Self::empty(storage, shared, dir, forgetful, config);
        let mut report = GroupRecovery { group: slot.group, ..GroupRecovery::default() };
        log.recover_segments(&forgetful, &mut report, true).await?;
        report.cut = report.torn_tail.take();
        let old = slot.checkpoint;
        log.checkpoint = if old.op != 0 && old.op <= log.head.op {
            // The damage lay past the old checkpoint, which still names a record of the chain.
            old
        } else if log.head.op > 0 {
            // Everything up to the old checkpoint was synced, the new end with it.
            log.head.checkpoint()
        } else {
            Checkpoint::default()
        };
        // Something was cut: a record that is not valid, or a chain that ends before a record
        // the log is known to have held (zeros where data was, a missing segment). A read
        // that merely failed cuts nothing and leaves no faulty suffix behind.
        let cut = report.cut.is_some() || log.head.op < old.op.max(head_op_known);
        // Canary (DESIGN.md §7): the cut forgets that the ops past it were there at all, so the
        // replica may nack an op it acknowledged.
        if cut && !cfg!(feature = "canary-truncate-faulty") {
            log.damaged_from = log.next.op;
        }
        if log.damaged_from != 0 {
            log.faulty_ops.suffix_from = Some(log.next.op);
        }
        report.head_op = log.head.op;
        report.faulty = log.faulty_ops.clone();
        log.account_ready();
        Ok((log, report))
    }

    /// Writes every appended prepare to the segment files (no sync), during recovery's journal
    /// replay: the flush cycles that would otherwise write them do not run before open returns.
    async fn write_replayed(&mut self) -> Result<()> {
        // Each job writes what is pending; one that only makes space ready comes first.
        for _ in 0..8 {
            let Some(job) = self.begin_flush(true, false) else { break };
            let done = job.run().await;
            self.finish_flush(done)?;
            if !self.has_unwritten() {
                return Ok(());
            }
        }
        if self.has_unwritten() {
            return Err(Error::Invalid(format!(
                "group {}: replayed prepares could not be written during recovery",
                self.group
            )));
        }
        Ok(())
    }

    /// Rebuilds the log from its segment files, phase by phase: list the group directory, load
    /// the synced segments before the checkpoint's, check the checkpoint record, scan the torn
    /// window from it, remove what lies past the chain's end, zero the window past the chain,
    /// open the active segment, adopt a spare. `canary_truncate`: the canary's forgetful scan,
    /// which takes any valid first record of a fresh window as the chain's start.
    async fn recover_segments(
        &mut self,
        slot: &GroupSlot,
        report: &mut GroupRecovery,
        canary_truncate: bool,
    ) -> Result<()> {
        let checkpoint = slot.checkpoint;
        let Some(names) = self.list_group_dir(checkpoint).await? else { return Ok(()) };
        // Staged files of a state transfer that never reached its commit point: the shard rolls
        // a committed one forward before it recovers the group, so any found here are such.
        crate::transfer::remove_leftovers(&self.storage, &self.dir, &names).await?;
        // Segments retention retired, whose removal the crash (or stop) cut short.
        let retired: Vec<_> = names
            .iter()
            .filter(|name| crate::segment::is_retired_name(name))
            .map(|name| self.dir.join(name))
            .collect();
        crate::shard::remove_retired_files(&self.storage, retired).await?;
        let bases: Vec<u64> = names.iter().filter_map(|name| parse_log_name(name)).collect();
        if checkpoint.op > 0 && !bases.contains(&checkpoint.segment_base_offset) {
            return Err(Error::Corruption(Corruption {
                file: self.dir.join(log_name(checkpoint.segment_base_offset)),
                position_bytes: 0,
                offset: Some(checkpoint.next_offset),
                op: Some(checkpoint.op),
                reason: "the checkpoint's segment is missing".into(),
            }));
        }
        self.load_synced_segments(checkpoint, &bases, &names, report).await?;
        // The checkpoint's segment and every later one: the torn window starts at the
        // checkpoint record.
        let window_bases: Vec<u64> = bases
            .iter()
            .copied()
            .filter(|&base| checkpoint.op == 0 || base >= checkpoint.segment_base_offset)
            .collect();
        let start = self.window_start(checkpoint, &names, report).await?;
        let mark_bases = window_bases.clone();
        let (next, leftover) =
            self.scan_window(checkpoint, window_bases, start, report, canary_truncate).await?;
        if self.config.durability == Durability::Persisted && !canary_truncate {
            self.check_sync_marks(&mark_bases, checkpoint, next.op, report).await?;
        }
        // A torn tail in a `replicated` group may have held acknowledged ops (DESIGN.md §3).
        if report.torn_tail.is_some() && self.config.durability == Durability::Replicated {
            self.faulty_ops.suffix_from = Some(next.op);
        }
        self.remove_past_chain_end(&leftover).await?;
        self.adopt_chain_end(next);
        // A cut trusts no mark: the forgetful scan zeroes the trailers with the window.
        self.zero_torn_window(checkpoint, !canary_truncate).await?;
        self.open_active_segment().await?;
        if names.iter().any(|name| name == SPARE_NAME) {
            self.adopt_spare().await?;
        }
        Ok(())
    }

    /// The names in the group directory; `None` when the directory is missing and the
    /// checkpoint names no data: it is created (durably) and the log stays empty.
    async fn list_group_dir(&self, checkpoint: Checkpoint) -> Result<Option<Vec<String>>> {
        match self.storage.list_dir(&self.dir).await {
            Ok(names) => Ok(Some(names)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound && checkpoint.op == 0 => {
                self.storage
                    .create_dir_all(&self.dir)
                    .await
                    .map_err(|e| Error::io("creating group dir", e))?;
                if let Some(parent) = self.dir.parent() {
                    self.storage
                        .sync_dir(parent)
                        .await
                        .map_err(|e| Error::io("syncing shard dir", e))?;
                }
                Ok(None)
            }
            Err(error) => Err(Error::io(format!("listing {}", self.dir.display()), error)),
        }
    }

    /// Segments before the checkpoint's are synced: takes their index when it is sound, else
    /// rebuilds it by scanning (any damage found is corruption), and checks that they leave no
    /// gap.
    async fn load_synced_segments(
        &mut self,
        checkpoint: Checkpoint,
        bases: &[u64],
        names: &[String],
        report: &mut GroupRecovery,
    ) -> Result<()> {
        let synced: Vec<u64> = bases
            .iter()
            .copied()
            .filter(|&base| checkpoint.op > 0 && base < checkpoint.segment_base_offset)
            .collect();
        for base in &synced {
            let meta = self.load_synced_segment(*base, names, report).await?;
            self.segments.push(meta);
        }
        for pair in self.segments.windows(2) {
            if pair[0].next_offset != pair[1].base_offset {
                return Err(Error::Corruption(Corruption {
                    file: self.dir.join(log_name(pair[1].base_offset)),
                    position_bytes: 0,
                    offset: Some(pair[0].next_offset),
                    op: None,
                    reason: format!(
                        "segments leave a gap: {} ends at offset {}",
                        log_name(pair[0].base_offset),
                        pair[0].next_offset
                    ),
                }));
            }
        }
        Ok(())
    }

    /// Where the scan of the torn window begins: right after the checkpoint record, once it is
    /// the record the superblock names (the head then stands at it); at op 1 when there is no
    /// checkpoint. A checkpoint record that is damaged or another one is corruption.
    async fn window_start(
        &mut self,
        checkpoint: Checkpoint,
        names: &[String],
        report: &mut GroupRecovery,
    ) -> Result<WindowStart> {
        let record_max = self.config.record_size_bytes_max as usize;
        let window = self.shared.scan_window_bytes;
        let mut start = WindowStart {
            next: ChainNext {
                cluster: self.shared.cluster,
                group: self.group,
                op: 1,
                parent: 0,
                offset: 0,
            },
            position_bytes: 0,
            index: SegmentIndex::default(),
            from_checkpoint: false,
        };
        if checkpoint.op > 0 {
            let base = checkpoint.segment_base_offset;
            let path = self.dir.join(log_name(base));
            let file = open_segment(&self.storage, &path, OpenMode::Read).await?;
            let mut scanner =
                Scanner::new(&file, window).await.map_err(|e| Error::io("reading", e))?;
            let record = scanner
                .record_at(checkpoint.position_bytes, record_max)
                .await
                .map_err(|e| Error::io("reading", e))?;
            let checked = check_standalone(&record, self.shared.cluster, self.group, record_max);
            match checked {
                Ok(header)
                    if header.checksum_header == checkpoint.checksum
                        && prepare_of(&header).op == checkpoint.op =>
                {
                    start.next = ChainNext {
                        cluster: self.shared.cluster,
                        group: self.group,
                        op: checkpoint.op + 1,
                        parent: checkpoint.checksum,
                        offset: checkpoint.next_offset,
                    };
                    start.position_bytes = checkpoint.position_bytes + u64::from(header.size);
                    self.head = Location {
                        op: checkpoint.op,
                        checksum: checkpoint.checksum,
                        next_offset: checkpoint.next_offset,
                        segment_base_offset: base,
                        position_bytes: checkpoint.position_bytes,
                        end_bytes: start.position_bytes,
                    };
                    // The index of the synced part of this segment: from its file or rebuilt.
                    start.index =
                        self.index_up_to(base, names, &file, start.position_bytes, report).await?;
                    start.from_checkpoint = true;
                }
                other => {
                    let reason = match other {
                        Ok(_) => {
                            "the checkpoint record is not the one the superblock names".to_string()
                        }
                        Err(fault) => format!("the checkpoint record is damaged: {fault}"),
                    };
                    return Err(Error::Corruption(Corruption {
                        file: path,
                        position_bytes: checkpoint.position_bytes,
                        offset: None,
                        op: Some(checkpoint.op),
                        reason,
                    }));
                }
            }
        }
        Ok(start)
    }

    /// Scans the torn window's segments (`window_bases`) from `start`, following the chain from
    /// one segment into the next until a record does not continue it. Returns what the next
    /// record would have to be, and the segments past the chain's end (torn-window leftovers).
    async fn scan_window(
        &mut self,
        checkpoint: Checkpoint,
        window_bases: Vec<u64>,
        start: WindowStart,
        report: &mut GroupRecovery,
        canary_truncate: bool,
    ) -> Result<(ChainNext, Vec<u64>)> {
        let window = self.shared.scan_window_bytes;
        let WindowStart {
            mut next,
            position_bytes: start_position,
            index: mut start_index,
            from_checkpoint,
        } = start;
        let mut chain_ended = false;
        let mut first_in_window = true;
        let mut leftover = Vec::new();
        for base in window_bases {
            if chain_ended {
                leftover.push(base);
                continue;
            }
            let path = self.dir.join(log_name(base));
            let file = open_segment(&self.storage, &path, OpenMode::Read).await?;
            let mut scanner =
                Scanner::new(&file, window).await.map_err(|e| Error::io("reading", e))?;
            let position = if first_in_window { start_position } else { 0 };
            if !first_in_window || !from_checkpoint {
                // A segment after the checkpoint's must begin with the chain's next record, and
                // a fresh log with op 1; anything else means the chain ended before it.
                let anchor = checkpoint.op == 0 && first_in_window && canary_truncate;
                let begins = match self.chain_begins(&mut scanner, &mut next, anchor).await? {
                    Ok(()) => true,
                    Err(RecordFault::Zeroed) => false,
                    Err(fault) => {
                        // A record was there and is not the chain's next: the window ends in
                        // a torn (or damaged) record, exactly as within a segment. A damaged
                        // first record of a fresh log is such a cut too.
                        let at = Some((path.to_path_buf(), 0, fault.to_string()));
                        report.torn_tail = report.torn_tail.take().or(at);
                        if fault.is_damage() {
                            report.torn_record_op = report.torn_record_op.or(Some(next.op));
                        }
                        false
                    }
                };
                // The first record of a log whose beginning retention (or a state transfer)
                // removed ends the chain too: nothing before it is kept, so the log is cut to
                // empty, at op 1, every op faulty. Its replica gets the ops back from peers
                // that still hold them from op 1, or else takes a state transfer, which only
                // needs a log below the transferred op.
                if !begins {
                    chain_ended = true;
                    leftover.push(base);
                    continue;
                }
            }
            let mut meta = SegmentMeta::new(base, next.op);
            if first_in_window && from_checkpoint {
                meta.index = std::mem::take(&mut start_index);
                meta.end_bytes = start_position;
                meta.next_offset = next.offset;
                if let Some(first) = meta.index.entries().first() {
                    meta.first_op = first.op;
                    meta.first_append_ms = first.append_time_ms;
                    meta.last_append_ms =
                        meta.index.entries().last().map_or(i64::MIN, |e| e.append_time_ms);
                }
            }
            first_in_window = false;
            self.scan_chain(&mut scanner, &mut meta, position, &mut next, &path, report).await?;
            if meta.first_op == 0 || meta.is_empty() {
                meta.first_op = next.op;
            }
            self.segments.push(meta);
        }
        Ok((next, leftover))
    }

    /// Whether the segment `scanner` reads begins with the record `next` names. With `anchor`
    /// (the canary's forgetful scan), any valid record begins it, and `next` moves to it.
    async fn chain_begins(
        &self,
        scanner: &mut Scanner<'_, S::File>,
        next: &mut ChainNext,
        anchor: bool,
    ) -> Result<std::result::Result<(), RecordFault>> {
        let record_max = self.config.record_size_bytes_max as usize;
        let record = scanner.record_at(0, record_max).await.map_err(|e| Error::io("reading", e))?;
        let begins = if anchor {
            check_standalone(&record, self.shared.cluster, self.group, record_max).map(|header| {
                let prepare = prepare_of(&header);
                *next = ChainNext {
                    cluster: self.shared.cluster,
                    group: self.group,
                    op: prepare.op,
                    parent: prepare.parent,
                    offset: prepare.base_offset,
                };
            })
        } else {
            check_next(&record, next, &self.fence, record_max).map(|_| ())
        };
        Ok(begins)
    }

    /// Scans one window segment from `position` for as long as its records continue the chain,
    /// moving the head and `next` along; the first record that does not ends the chain, and is
    /// reported as the torn tail unless it is zeros.
    async fn scan_chain(
        &mut self,
        scanner: &mut Scanner<'_, S::File>,
        meta: &mut SegmentMeta,
        mut position: u64,
        next: &mut ChainNext,
        path: &Path,
        report: &mut GroupRecovery,
    ) -> Result<()> {
        let record_max = self.config.record_size_bytes_max as usize;
        let interval = self.shared.index_interval_bytes;
        let base = meta.base_offset;
        loop {
            let record = scanner
                .record_at(position, record_max)
                .await
                .map_err(|e| Error::io("reading", e))?;
            match check_next(&record, next, &self.fence, record_max) {
                Ok(header) => {
                    meta.observe(&header, position, interval);
                    self.head = Location {
                        op: prepare_of(&header).op,
                        checksum: header.checksum_header,
                        next_offset: next.after(&header).offset,
                        segment_base_offset: base,
                        position_bytes: position,
                        end_bytes: position + u64::from(header.size),
                    };
                    *next = next.after(&header);
                    position += u64::from(header.size);
                    report.records_scanned += 1;
                }
                Err(fault) => {
                    if fault.is_damage() {
                        report.torn_record_op = Some(next.op);
                    }
                    if !matches!(fault, RecordFault::Zeroed) {
                        report.torn_tail = Some((path.to_path_buf(), position, fault.to_string()));
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Removes the segments past the chain's end: the torn window's leftovers (durably), then
    /// empty segments at the end.
    async fn remove_past_chain_end(&mut self, leftover: &[u64]) -> Result<()> {
        // Segments past the chain's end are torn-window leftovers: never synced as part of the
        // chain, so they go.
        for base in leftover {
            self.remove_segment_files(*base).await?;
        }
        if !leftover.is_empty() {
            self.storage
                .sync_dir(&self.dir)
                .await
                .map_err(|e| Error::io("syncing group dir", e))?;
        }
        // Drop empty segments at the end (created, never written), except one that the chain
        // names by the checkpoint.
        while self.segments.len() > 1 && self.segments.last().is_some_and(|meta| meta.is_empty()) {
            let meta = self.segments.pop().expect("checked");
            self.remove_segment_files(meta.base_offset).await?;
        }
        if self.segments.last().is_some_and(SegmentMeta::is_empty) {
            let meta = self.segments.pop().expect("checked");
            self.remove_segment_files(meta.base_offset).await?;
        }
        Ok(())
    }

    /// Takes the recovered chain as the log: every segment but the last is sealed, and
    /// everything up to the head counts as written.
    fn adopt_chain_end(&mut self, next: ChainNext) {
        let count = self.segments.len();
        for (index, meta) in self.segments.iter_mut().enumerate() {
            meta.sealed = index + 1 < count;
            // Segments whose index file was sound stay settled; the rest (rebuilt indexes, and
            // sealed segments from the torn window) are synced and get their index written by
            // the next flush.
            meta.settled = meta.sealed && meta.settled;
        }
        self.next = next;
        self.written = self.head;
        self.submitted = self.head;
    }

    /// The torn window is rewritten before anything new is appended: whatever survived past
    /// the chain's end in a segment of the window becomes zeros, durably.
    async fn zero_torn_window(&self, checkpoint: Checkpoint, keep_trailer: bool) -> Result<()> {
        let window: Vec<(u64, u64)> = self
            .segments
            .iter()
            .filter(|meta| checkpoint.op == 0 || meta.base_offset >= checkpoint.segment_base_offset)
            .map(|meta| (meta.base_offset, meta.end_bytes))
            .collect();
        for (base, end) in window {
            self.rewrite_window(base, end, keep_trailer).await?;
        }
        Ok(())
    }

    /// Opens the active segment for appends and keeps the partial block before its end, so the
    /// first append can start a chunk without reading the disk.
    async fn open_active_segment(&mut self) -> Result<()> {
        if let Some(active) = self.segments.last() {
            let path = self.dir.join(log_name(active.base_offset));
            let file = open_segment(&self.storage, &path, OpenMode::ReadWrite).await?;
            let end = active.end_bytes;
            let block_start = end - end % BLOCK_SIZE_BYTES as u64;
            let mut scanner =
                Scanner::new(&file, BLOCK_SIZE_BYTES).await.map_err(|e| Error::io("reading", e))?;
            self.tail_prefix = scanner
                .bytes_at(block_start, (end - block_start) as usize)
                .await
                .map_err(|e| Error::io("reading", e))?
                .to_vec();
            // Its reservation is unknown (`ready_end_bytes` 0): the first flush reserves again.
            let base = active.base_offset;
            let size = file.size_bytes().await.map_err(|e| Error::io("sizing a segment", e))?;
            let trailer_ready = size >= self.segment_limit_bytes() + TRAILER_BYTES;
            if let Some(active) = self.segments.last_mut() {
                active.trailer_ready = trailer_ready;
            }
            self.files.insert(base, Rc::new(file));
        }
        Ok(())
    }

    /// A spare segment file left by the previous run is reused (reserving again over what it
    /// holds costs no new space, which matters on a full disk): its whole blocks count as ready.
    /// One that holds records is a recycled segment, which goes with recycling off.
    async fn adopt_spare(&mut self) -> Result<()> {
        let path = self.dir.join(SPARE_NAME);
        let file = self
            .storage
            .open(&path, OpenMode::Read, false)
            .await
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let size = file.size_bytes().await.map_err(|e| Error::io("sizing the spare", e))?;
        let recycled = size > 0
            && spare_holds_records(&file).await.map_err(|e| Error::io("reading the spare", e))?;
        if !recycled || self.shared.recycle_segments {
            self.spare_ready_end_bytes = Some(self.ready_in_file_bytes(size));
            return Ok(());
        }
        self.storage
            .remove_file(&path)
            .await
            .map_err(|e| Error::io(format!("removing {}", path.display()), e))
    }

    /// Overwrites a segment's bytes past `end` (the chain's end) with zeros and syncs, when
    /// anything lies there.
    pub(super) async fn rewrite_window(
        &self,
        base: u64,
        end: u64,
        keep_trailer: bool,
    ) -> Result<()> {
        let path = self.dir.join(log_name(base));
        let file = open_segment(&self.storage, &path, OpenMode::ReadWrite).await?;
        let size = file.size_bytes().await.map_err(|e| Error::io("sizing a segment", e))?;
        if size <= end {
            return Ok(());
        }
        let block = BLOCK_SIZE_BYTES as u64;
        let block_start = end - end % block;
        let mut scanner =
            Scanner::new(&file, BLOCK_SIZE_BYTES).await.map_err(|e| Error::io("reading", e))?;
        let prefix = scanner
            .bytes_at(block_start, (end - block_start) as usize)
            .await
            .map_err(|e| Error::io("reading", e))?;
        let mut first = AlignedBuf::zeroed(BLOCK_SIZE_BYTES, BLOCK_SIZE_BYTES);
        first.extend_from_slice(&prefix);
        first.set_len(BLOCK_SIZE_BYTES);
        let rewrite =
            |error| Error::io(format!("rewriting the torn window of {}", path.display()), error);
        file.write_at(first.freeze(), block_start).await.map_err(rewrite)?;
        let mut position = block_start + block;
        // The sync-mark trailer past the data limit stays unless the cut makes its marks lie.
        let stop = if keep_trailer { size.min(self.segment_limit_bytes()) } else { size };
        let stop = stop.next_multiple_of(block);
        // A recycled segment file holds up to a whole retired segment past the chain's end:
        // zeroing it by metadata where the filesystem can costs no writes.
        if position < stop && file.zero_range(position, stop - position).await.map_err(rewrite)? {
            position = stop;
        }
        while position < stop {
            let len = (stop - position).min(self.shared.zeros.len() as u64) as usize;
            file.write_at(self.shared.zeros.slice(..len), position).await.map_err(rewrite)?;
            position += len as u64;
        }
        file.sync_data().await.map_err(rewrite)
    }

    /// Opens a synced segment (before the checkpoint's): its index file when sound, else an
    /// index rebuilt by scanning it, where any damage is corruption.
    async fn load_synced_segment(
        &self,
        base: u64,
        names: &[String],
        report: &mut GroupRecovery,
    ) -> Result<SegmentMeta> {
        if names.iter().any(|name| *name == index_name(base)) {
            let path = self.dir.join(index_name(base));
            if let Some((index, summary)) = self.read_index_file(&path).await {
                let mut meta = SegmentMeta::new(base, index.entries().first().map_or(0, |e| e.op));
                meta.first_append_ms =
                    index.entries().first().map_or(i64::MIN, |e| e.append_time_ms);
                meta.index = index;
                meta.end_bytes = summary.covered_bytes;
                meta.next_offset = summary.next_offset;
                meta.last_op = summary.last_op;
                meta.last_append_ms = summary.last_append_ms;
                meta.settled = true;
                return Ok(meta);
            }
        }
        report.indexes_rebuilt += 1;
        let path = self.dir.join(log_name(base));
        let file = open_segment(&self.storage, &path, OpenMode::Read).await?;
        let (meta, fault) = self.scan_synced(&file, base, u64::MAX).await?;
        if let Some((position, fault)) = fault {
            // The segment was synced whole: only zeros may follow its last record.
            if !matches!(fault, RecordFault::Zeroed) {
                return Err(Error::Corruption(Corruption {
                    file: path,
                    position_bytes: position,
                    offset: Some(meta.next_offset),
                    op: Some(meta.last_op + 1),
                    reason: fault.to_string(),
                }));
            }
        }
        Ok(meta)
    }

    /// The index of `[0, end)` of the checkpoint's segment: from its file when it covers that
    /// far, else rebuilt by scanning (the region is synced, so damage is corruption).
    async fn index_up_to(
        &self,
        base: u64,
        names: &[String],
        file: &S::File,
        end: u64,
        report: &mut GroupRecovery,
    ) -> Result<SegmentIndex> {
        if names.iter().any(|name| *name == index_name(base)) {
            let path = self.dir.join(index_name(base));
            if let Some((mut index, summary)) = self.read_index_file(&path).await
                && summary.covered_bytes >= end
            {
                index.truncate(end);
                return Ok(index);
            }
        }
        report.indexes_rebuilt += 1;
        let (meta, fault) = self.scan_synced(file, base, end).await?;
        if meta.end_bytes < end {
            let (position, reason) = fault
                .map_or((meta.end_bytes, "ends early".to_string()), |(p, f)| (p, f.to_string()));
            return Err(Error::Corruption(Corruption {
                file: self.dir.join(log_name(base)),
                position_bytes: position,
                offset: Some(meta.next_offset),
                op: Some(meta.last_op + 1),
                reason,
            }));
        }
        Ok(meta.index)
    }

    /// Scans a synced segment from its start up to `end` (or its first invalid record), with the
    /// chain taken from its first record.
    async fn scan_synced(
        &self,
        file: &S::File,
        base: u64,
        end: u64,
    ) -> Result<(SegmentMeta, Option<(u64, RecordFault)>)> {
        let record_max = self.config.record_size_bytes_max as usize;
        let mut scanner = Scanner::new(file, self.shared.scan_window_bytes)
            .await
            .map_err(|e| Error::io("reading", e))?;
        let mut meta = SegmentMeta::new(base, 0);
        let mut position = 0;
        let mut next: Option<ChainNext> = None;
        while position < end {
            let record = scanner
                .record_at(position, record_max)
                .await
                .map_err(|e| Error::io("reading", e))?;
            let checked = match &next {
                Some(next) => check_next(&record, next, &self.fence, record_max),
                None => check_standalone(&record, self.shared.cluster, self.group, record_max),
            };
            match checked {
                Ok(header) => {
                    let prepare = prepare_of(&header);
                    let chain = next.unwrap_or(ChainNext {
                        cluster: self.shared.cluster,
                        group: self.group,
                        op: prepare.op,
                        parent: prepare.parent,
                        offset: prepare.base_offset,
                    });
                    if meta.is_empty() {
                        meta.first_op = prepare.op;
                    }
                    meta.observe(&header, position, self.shared.index_interval_bytes);
                    next = Some(chain.after(&header));
                    position += u64::from(header.size);
                }
                Err(fault) => return Ok((meta, Some((position, fault)))),
            }
        }
        Ok((meta, None))
    }

    async fn read_index_file(&self, path: &Path) -> Option<(SegmentIndex, IndexSummary)> {
        let file = self.storage.open(path, OpenMode::Read, false).await.ok()?;
        let size = file.size_bytes().await.ok()? as usize;
        let max = crate::segment::INDEX_HEADER_SIZE_BYTES
            + self.shared.index_entries_max * crate::segment::INDEX_ENTRY_SIZE_BYTES;
        if size > max {
            return None;
        }
        let (result, buffer) = file.read_at(AlignedBuf::zeroed(size.max(1), 1), 0).await;
        result.ok()?;
        SegmentIndex::decode(buffer.as_slice(), self.shared.index_entries_max).ok()
    }
}
