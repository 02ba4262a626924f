//! The group check: one group's directory and its segments walked in offset order, following
//! the chain across them as recovery does, with each segment's index file compared to what the
//! scan finds.
//!
//! Damage where data was synced (before the checkpoint, or up to the op the newest sync mark of
//! a `persisted` group names) is a problem; the torn window past it, zeros and stale bytes past
//! the chain's end, and leftovers of interrupted work are notes. It reads segments window by
//! window and must never hold one whole.

use std::path::{Path, PathBuf};

use super::checker::{At, Checker, RECORD_SIZE_FALLBACK_BYTES, WINDOW_BYTES, read_range};
use super::report::{GroupReport, IndexStatus, SegmentEnd, SegmentReport};
use crate::direct::{SyncMark, TRAILER_BYTES};
use crate::partition::spare_holds_records;
use crate::record::{ChainNext, RecordFault, check_next, check_standalone, prepare_of};
use crate::scan::Scanner;
use crate::segment::{
    INDEX_ENTRY_SIZE_BYTES, INDEX_HEADER_SIZE_BYTES, IndexEntry, IndexSummary, SPARE_NAME,
    SegmentIndex, index_name, parse_index_name, parse_log_name,
};
use crate::storage::{BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile};
use crate::superblock::{Checkpoint, Durability, Fence, GroupSlot};
use crate::wire::{HEADER_SIZE, Header};

/// Where a group's chain stands while its segments are walked.
enum Chain {
    /// The next record must be exactly this one.
    Expect(ChainNext),
    /// Take the next record as it comes (start of a log whose beginning retention may have
    /// deleted, or after damage already reported).
    Anchor,
    /// The chain ended past the checkpoint: later segments are torn-window leftovers.
    Ended(ChainNext),
}

/// A state transfer pending in a group's slot: the slot names the new log's first segment,
/// staged or already renamed into place, and the roll-forward at open removes everything else.
struct PendingTransfer {
    pending: bool,
    /// The staged name of the new log's first segment.
    staged_name: String,
    /// That segment is still staged (not yet renamed into place).
    staged_present: bool,
}

impl<S: Storage> Checker<'_, S> {
    /// Walks one group's segments in offset order, following the chain across them. Returns
    /// the report and what the record after the chain's end must be (None when no chain was
    /// found or damage broke it).
    pub(super) async fn group(
        &mut self,
        dir: &Path,
        group: u64,
        slot: Option<GroupSlot>,
        cluster: Option<u64>,
        dir_exists: bool,
    ) -> (GroupReport, Option<ChainNext>) {
        let mut report =
            GroupReport { group, dir: dir.to_path_buf(), slot, ..GroupReport::default() };
        let checkpoint = slot.map(|s| s.checkpoint).unwrap_or_default();
        let at_checkpoint = At {
            position_bytes: checkpoint.position_bytes,
            offset: Some(checkpoint.next_offset),
            op: Some(checkpoint.op),
        };
        if !dir_exists {
            if checkpoint.op > 0 {
                self.problem(
                    dir,
                    at_checkpoint,
                    "group directory missing, but its checkpoint names data",
                );
            }
            return (report, None);
        }
        let names = match self.storage.list_dir(dir).await {
            Ok(names) => names,
            Err(error) => {
                self.problem(dir, At::byte(0), format!("cannot list the group directory: {error}"));
                return (report, None);
            }
        };
        let pending = slot.is_some_and(|s| s.transfer_pending);
        let staged_name = crate::transfer::staged_log_name(checkpoint.segment_base_offset);
        let staged_present = pending && names.contains(&staged_name);
        let transfer = PendingTransfer { pending, staged_name, staged_present };
        if pending {
            self.note(
                dir.to_path_buf(),
                None,
                format!(
                    "state transfer to op {} pending: open rolls it forward (removes the old \
                     log's files, renames the staged ones into place)",
                    checkpoint.op
                ),
            );
        }
        let mut bases = self
            .group_entries(dir, &names, &transfer, checkpoint.segment_base_offset, &mut report)
            .await;
        bases.sort_unstable();
        self.stray_indexes(dir, &names, &bases, pending);
        let checkpoint_file = dir.join(crate::segment::log_name(checkpoint.segment_base_offset));
        let mut walk = GroupWalk::new(cluster, group, slot);
        let mut files: Vec<(u64, PathBuf, bool)> = bases
            .iter()
            .map(|&base| {
                let has_index = !pending && names.iter().any(|name| *name == index_name(base));
                (base, dir.join(crate::segment::log_name(base)), has_index)
            })
            .collect();
        if transfer.staged_present {
            files.push((checkpoint.segment_base_offset, dir.join(&transfer.staged_name), false));
        }
        if checkpoint.op > 0
            && !files.iter().any(|(base, ..)| *base == checkpoint.segment_base_offset)
        {
            self.problem(&checkpoint_file, at_checkpoint, "the checkpoint's segment is missing");
            walk.damaged = true;
        }
        let mark = self.sync_marks(&walk, &files, slot).await;
        if let Some((op, _)) = &mark {
            walk.synced_op = walk.synced_op.max(*op);
        }
        self.walk_segments(&mut walk, files, &mut report).await;
        if let Some((op, mark_file)) = mark
            && !walk.damaged
            && let Chain::Expect(next) | Chain::Ended(next) = walk.chain
            && next.op <= op
        {
            let (file, at) = walk.end_at.clone().unwrap_or((mark_file.clone(), At::byte(0)));
            self.problem(
                &file,
                at,
                format!(
                    "the chain ends before op {}, which the sync mark in {} says was synced",
                    next.op,
                    mark_file.display()
                ),
            );
        }
        if checkpoint.op > 0 && !walk.checkpoint_seen && !walk.damaged {
            let (file, at) = walk.end_at.clone().unwrap_or((checkpoint_file, at_checkpoint));
            self.problem(
                &file,
                at,
                format!(
                    "the chain ends at op {} before the checkpoint op {}",
                    report.last_op.unwrap_or(0),
                    checkpoint.op
                ),
            );
        }
        let end = match walk.chain {
            Chain::Expect(next) | Chain::Ended(next) if !walk.damaged => Some(next),
            _ => None,
        };
        (report, end)
    }

    /// The newest sync mark (`crate::direct`) in the trailers of a `persisted` group's segments
    /// from the checkpoint's on, as recovery reads them: the op it names (held to an unfinished
    /// fence) and its file. None without a slot (the segment size is unknown) or a mark past
    /// the checkpoint.
    async fn sync_marks(
        &mut self,
        walk: &GroupWalk,
        files: &[(u64, PathBuf, bool)],
        slot: Option<GroupSlot>,
    ) -> Option<(u64, PathBuf)> {
        let slot = slot.filter(|slot| slot.config.durability == Durability::Persisted)?;
        let cluster = walk.cluster?;
        let limit = data_limit_bytes(&slot);
        let mut newest: Option<(u64, PathBuf)> = None;
        for (base, path, _) in files {
            if walk.checkpoint.op > 0 && *base < walk.checkpoint.segment_base_offset {
                continue;
            }
            let Ok(file) = self.storage.open(path, OpenMode::Read, false).await else { continue };
            let Ok(mut scanner) = Scanner::new(&file, TRAILER_BYTES as usize).await else {
                continue;
            };
            let Ok(trailer) = scanner.bytes_at(limit, TRAILER_BYTES as usize).await else {
                continue;
            };
            for block in trailer.chunks_exact(BLOCK_SIZE_BYTES) {
                if let Some(mark) = SyncMark::decode(block, cluster, walk.group)
                    && newest.as_ref().is_none_or(|(op, _)| mark.op > *op)
                {
                    newest = Some((mark.op, path.clone()));
                }
            }
        }
        let (mut op, path) = newest?;
        if walk.fence.view != 0 && !walk.fence.finished {
            op = op.min(walk.fence.op);
        }
        (op > walk.checkpoint.op).then_some((op, path))
    }

    /// Sorts a group directory's entries: returns the base offsets of the segments to walk, and
    /// checks or notes everything else (transferred and group state, leftovers, the spare).
    async fn group_entries(
        &mut self,
        dir: &Path,
        names: &[String],
        transfer: &PendingTransfer,
        checkpoint_base: u64,
        report: &mut GroupReport,
    ) -> Vec<u64> {
        let mut bases = Vec::new();
        for name in names {
            if let Some(base) = parse_log_name(name) {
                if transfer.pending && (transfer.staged_present || base != checkpoint_base) {
                    self.note(
                        dir.join(name),
                        None,
                        "segment of the log a pending state transfer replaces (the \
                         roll-forward removes it)",
                    );
                } else {
                    bases.push(base);
                }
            } else if transfer.pending && *name == transfer.staged_name {
                // Walked below in place of the segment it becomes.
            } else if name == crate::state::TRANSFER_STATE_FILE
                || (transfer.pending && name == crate::state::TRANSFER_STATE_STAGED)
            {
                match crate::state::load_file(self.storage, &dir.join(name)).await {
                    Ok(state) => {
                        report.transfer_state = state.map(|state| (state.op, state.end_offset));
                    }
                    Err(error) => self.problem(
                        &dir.join(name),
                        At::byte(0),
                        format!("transferred state: {error}"),
                    ),
                }
            } else if crate::segment::is_retired_name(name) {
                self.note(
                    dir.join(name),
                    None,
                    "segment retention retired, not yet removed (open removes it)",
                );
            } else if crate::transfer::is_staged_name(name) {
                self.note(
                    dir.join(name),
                    None,
                    "leftover of a state transfer that never reached its commit point (open \
                     removes it)",
                );
            } else if name == crate::state::STATE_FILE {
                if let Err(error) = crate::state::load(self.storage, dir).await {
                    self.problem(&dir.join(name), At::byte(0), format!("group state: {error}"));
                }
            } else if name == crate::state::STATE_FILE_NEW {
                self.note(dir.join(name), None, "leftover of an interrupted group state save");
            } else if name == SPARE_NAME {
                // Space made ready for the next segment: it holds no data to check (a recycled
                // one holds a retired segment's records, which the next segment overwrites).
                let path = dir.join(name);
                let recycled = match self.storage.open(&path, OpenMode::Read, false).await {
                    Ok(file) => spare_holds_records(&file).await.unwrap_or(false),
                    Err(_) => false,
                };
                if recycled {
                    self.note(
                        path,
                        None,
                        "spare segment file holds a retired segment's bytes (recycled); the next \
                         segment overwrites them",
                    );
                }
            } else if parse_index_name(name).is_none() {
                self.note(dir.join(name), None, "unknown file in the group directory");
            }
        }
        bases
    }

    /// Notes index files whose segment is not walked: of a log a pending transfer replaces, or
    /// without a segment at all.
    fn stray_indexes(&mut self, dir: &Path, names: &[String], bases: &[u64], pending: bool) {
        for name in names {
            if pending && parse_index_name(name).is_some() {
                self.note(
                    dir.join(name),
                    None,
                    "index file of the log a pending state transfer replaces (the roll-forward \
                     removes it)",
                );
            } else if let Some(base) = parse_index_name(name)
                && !bases.contains(&base)
            {
                self.note(dir.join(name), None, "index file without its segment");
            }
        }
    }

    /// Walks the segment files in order and sums up what the chain holds.
    async fn walk_segments(
        &mut self,
        walk: &mut GroupWalk,
        files: Vec<(u64, PathBuf, bool)>,
        report: &mut GroupReport,
    ) {
        for (base, path, has_index) in files {
            let segment = self.segment(walk, &path, base, has_index).await;
            if !segment.leftover {
                if report.first_op.is_none() {
                    report.first_op = segment.first_op;
                    report.first_offset = segment.first_offset;
                }
                if segment.last_op.is_some() {
                    report.last_op = segment.last_op;
                    report.last_checksum = segment.last_checksum;
                    report.next_offset = segment.next_offset;
                }
                report.records += segment.records;
                report.valid_bytes += segment.valid_bytes;
            }
            report.segments.push(segment);
        }
    }

    async fn segment(
        &mut self,
        walk: &mut GroupWalk,
        path: &Path,
        base: u64,
        has_index: bool,
    ) -> SegmentReport {
        let mut report = SegmentReport {
            file: path.to_path_buf(),
            base_offset: base,
            ..SegmentReport::default()
        };
        let file = match self.storage.open(path, OpenMode::Read, false).await {
            Ok(file) => file,
            Err(error) => {
                let at = At::expecting(0, walk.expected());
                self.problem(path, at, format!("cannot open the segment: {error}"));
                walk.break_chain();
                report.end = SegmentEnd::Unreadable(error.to_string());
                return report;
            }
        };
        let mut scanner = match Scanner::new(&file, WINDOW_BYTES).await {
            Ok(scanner) => scanner,
            Err(error) => {
                let at = At::expecting(0, walk.expected());
                self.problem(path, at, format!("cannot read the segment: {error}"));
                walk.break_chain();
                report.end = SegmentEnd::Unreadable(error.to_string());
                return report;
            }
        };
        report.file_size_bytes = file.size_bytes().await.unwrap_or(0);

        // Does the chain go on in this segment? Recovery asks the same of every segment after
        // the first, and deletes the ones where it does not.
        if !self.chain_goes_on(walk, &mut scanner, path, base, &mut report).await {
            return report;
        }

        let index_path = path.with_file_name(index_name(base));
        let index = if has_index {
            Some(self.read_index(&index_path, report.file_size_bytes).await)
        } else {
            None
        };
        let mut index_check = match &index {
            Some(Ok((index, _))) => Some(IndexCheck::new(index.entries())),
            _ => None,
        };
        let problems_before = self.problems.len();
        let (position, last_append_ms) =
            self.scan_segment(walk, &mut scanner, path, &mut index_check, &mut report).await;
        walk.end_at = Some((path.to_path_buf(), At::expecting(position, walk.expected())));

        let damaged = self.problems.len() > problems_before;
        report.index = match index {
            None => IndexStatus::Missing,
            Some(Err(reason)) => {
                self.note(
                    index_path,
                    None,
                    format!("index file damaged (recovery rebuilds it): {reason}"),
                );
                IndexStatus::Damaged(reason)
            }
            Some(Ok((index, summary))) => {
                let entries = index.entries().len();
                let scanned = IndexSummary {
                    covered_bytes: report.valid_bytes,
                    next_offset: report.next_offset.unwrap_or(base),
                    last_op: report.last_op.unwrap_or(0),
                    last_append_ms,
                };
                match index_check.and_then(|check| check.finish(&summary, &scanned)) {
                    _ if damaged => IndexStatus::NotCompared { entries },
                    None => IndexStatus::Ok { entries },
                    Some(reason) => {
                        let message = format!("index disagrees with its segment: {reason}");
                        // Recovery takes a synced segment's index on trust, without scanning:
                        // a wrong one there misplaces reads, so it is damage. Elsewhere the
                        // index is rebuilt before use.
                        if walk.checkpoint.op > 0 && base < walk.checkpoint.segment_base_offset {
                            self.problem(&index_path, At::byte(0), message);
                        } else {
                            self.note(index_path, None, message);
                        }
                        IndexStatus::Disagrees(reason)
                    }
                }
            }
        };
        report
    }

    /// Whether the chain goes on in this segment (false: a leftover past the chain's end, which
    /// is reported as such and not scanned).
    async fn chain_goes_on<F: StorageFile>(
        &mut self,
        walk: &mut GroupWalk,
        scanner: &mut Scanner<'_, F>,
        path: &Path,
        base: u64,
        report: &mut SegmentReport,
    ) -> bool {
        if let Chain::Expect(next) | Chain::Ended(next) = walk.chain {
            let first = scanner.record_at(0, walk.record_max).await;
            let fault = match &first {
                Ok(bytes) => check_next(bytes, &next, &walk.fence, walk.record_max).err(),
                Err(error) => Some(RecordFault::BadHeader(format!("read error: {error}"))),
            };
            if let Some(fault) = fault {
                if matches!(walk.chain, Chain::Expect(_)) && walk.before_checkpoint(&next, base) {
                    self.problem(
                        path,
                        At::expecting(0, Some(&next)),
                        format!(
                            "the chain breaks at the start of the segment (expected op {} at \
                             offset {}): {fault}",
                            next.op, next.offset
                        ),
                    );
                    walk.break_chain();
                } else {
                    walk.chain = Chain::Ended(next);
                    report.leftover = true;
                    report.end = SegmentEnd::NotScanned;
                    self.note(
                        path.to_path_buf(),
                        Some(0),
                        format!(
                            "segment past the chain's end (torn-window leftover; recovery \
                             deletes it): {fault}"
                        ),
                    );
                    return false;
                }
            } else {
                walk.chain = Chain::Expect(next);
            }
        }
        true
    }

    /// Scans a segment's records from its start, following the chain, until its data ends:
    /// fills in the report's counts and how the data ended. Returns where the data ends and the
    /// newest append time seen.
    async fn scan_segment<F: StorageFile>(
        &mut self,
        walk: &mut GroupWalk,
        scanner: &mut Scanner<'_, F>,
        path: &Path,
        index_check: &mut Option<IndexCheck>,
        report: &mut SegmentReport,
    ) -> (u64, i64) {
        let base = report.base_offset;
        let mut position = 0u64;
        let mut last_append_ms = i64::MIN;
        report.end = loop {
            let bytes = match scanner.record_at(position, walk.record_max).await {
                Ok(bytes) => bytes,
                Err(error) => {
                    let at = At::expecting(position, walk.expected());
                    self.problem(path, at, format!("read error: {error}"));
                    walk.break_chain();
                    break SegmentEnd::Unreadable(error.to_string());
                }
            };
            let checked = check_record(walk, &bytes);
            let (header, next) = match checked {
                Ok(checked) => checked,
                Err(fault) => {
                    match self.end_of_data(walk, scanner, path, base, position, fault).await {
                        EndOfData::SkipTo(next_position) => {
                            position = next_position;
                            report.damaged_records += 1;
                            report.valid_bytes = position;
                            continue;
                        }
                        EndOfData::End(end) => break end,
                    }
                }
            };
            let prepare = prepare_of(&header);
            if position == 0 && prepare.base_offset != base {
                self.problem(
                    path,
                    At {
                        position_bytes: 0,
                        offset: Some(prepare.base_offset),
                        op: Some(prepare.op),
                    },
                    format!(
                        "the file name says base offset {base}, its first record starts at \
                         offset {}",
                        prepare.base_offset
                    ),
                );
            }
            self.checkpoint_record(walk, path, base, position, &header);
            if let Some(check) = index_check {
                check.observe(&header, position);
            }
            if report.records == 0 {
                report.first_op = Some(prepare.op);
                report.first_offset = Some(prepare.base_offset);
            }
            report.records += 1;
            report.last_op = Some(prepare.op);
            report.last_checksum = Some(header.checksum_header);
            report.next_offset = Some(next.offset);
            last_append_ms = last_append_ms.max(prepare.append_time_ms);
            position += u64::from(header.size);
            report.valid_bytes = position;
            walk.cluster.get_or_insert(header.cluster);
            walk.chain = Chain::Expect(next);
        };
        (position, last_append_ms)
    }

    /// Checks the record of the checkpoint op against what the superblock says of it.
    fn checkpoint_record(
        &mut self,
        walk: &mut GroupWalk,
        path: &Path,
        base: u64,
        position: u64,
        header: &Header,
    ) {
        let checkpoint = walk.checkpoint;
        let prepare = prepare_of(header);
        if checkpoint.op == 0 || prepare.op != checkpoint.op {
            return;
        }
        walk.checkpoint_seen = true;
        let next_offset = prepare.base_offset.saturating_add(u64::from(prepare.record_count));
        let mut wrong = Vec::new();
        if base != checkpoint.segment_base_offset {
            wrong.push(format!("segment {base} (superblock: {})", checkpoint.segment_base_offset));
        }
        if position != checkpoint.position_bytes {
            wrong.push(format!("position {position} (superblock: {})", checkpoint.position_bytes));
        }
        if header.checksum_header != checkpoint.checksum {
            wrong.push(format!(
                "checksum {:#010x} (superblock: {:#010x})",
                header.checksum_header, checkpoint.checksum
            ));
        }
        if next_offset != checkpoint.next_offset {
            wrong.push(format!(
                "next offset {next_offset} (superblock: {})",
                checkpoint.next_offset
            ));
        }
        if !wrong.is_empty() {
            self.problem(
                path,
                At {
                    position_bytes: position,
                    offset: Some(prepare.base_offset),
                    op: Some(prepare.op),
                },
                format!(
                    "the checkpoint record is not where the superblock says: {}",
                    wrong.join(", ")
                ),
            );
        }
    }

    /// Classifies what lies where the next valid record should be.
    async fn end_of_data<F: StorageFile>(
        &mut self,
        walk: &mut GroupWalk,
        scanner: &mut Scanner<'_, F>,
        path: &Path,
        base: u64,
        position: u64,
        fault: RecordFault,
    ) -> EndOfData {
        if matches!(fault, RecordFault::Zeroed) {
            // Zeros end the data. Bytes after a zeroed gap are stale records the engine left on
            // purpose (a truncation zeroes only the blocks at the cut; a recycled segment file
            // keeps its retired segment's records past the data), never read again.
            return match first_nonzero(scanner, position, walk.data_limit_bytes).await {
                Ok(None) => EndOfData::End(SegmentEnd::Clean),
                Ok(Some(stale)) => {
                    self.note(
                        path.to_path_buf(),
                        Some(stale),
                        format!("stale data after the end of data (which is at byte {position})"),
                    );
                    EndOfData::End(SegmentEnd::DataAfterEnd {
                        position_bytes: stale,
                        reason: "stale data after a zeroed gap".into(),
                        corruption: false,
                    })
                }
                Err(error) => {
                    let at = At::expecting(position, walk.expected());
                    self.problem(path, at, format!("read error: {error}"));
                    EndOfData::End(SegmentEnd::Unreadable(error.to_string()))
                }
            };
        }
        let synced = match walk.expected() {
            Some(next) => walk.before_checkpoint(next, base),
            None => walk.checkpoint.op > 0 && base <= walk.checkpoint.segment_base_offset,
        };
        if !synced {
            self.note(
                path.to_path_buf(),
                Some(position),
                format!("data after the end of the chain (torn window): {fault}"),
            );
            return EndOfData::End(SegmentEnd::DataAfterEnd {
                position_bytes: position,
                reason: fault.to_string(),
                corruption: false,
            });
        }
        let at = At::expecting(position, walk.expected());
        self.problem(
            path,
            at,
            format!("damaged record where data was synced (checkpoint or sync mark): {fault}"),
        );
        walk.damaged = true;
        // A sound header still says where the next record starts: step over the damage so the
        // rest of the log is checked and its ranges reported.
        if matches!(
            fault,
            RecordFault::BadBody | RecordFault::Foreign | RecordFault::ChainBreak { .. }
        ) && let Ok(bytes) = scanner.bytes_at(position, HEADER_SIZE).await
            && let Ok(header) = Header::decode_prefix(&bytes)
            && let Some(prepare) = header.as_prepare()
            && (header.size as usize) <= walk.record_max
            && let Some(after) = chain_after(
                &ChainNext {
                    cluster: walk.cluster.unwrap_or(header.cluster),
                    group: walk.group,
                    op: prepare.op,
                    parent: prepare.parent,
                    offset: prepare.base_offset,
                },
                &header,
            )
        {
            walk.chain = Chain::Expect(after);
            return EndOfData::SkipTo(position + u64::from(header.size));
        }
        walk.break_chain();
        EndOfData::End(SegmentEnd::DataAfterEnd {
            position_bytes: position,
            reason: fault.to_string(),
            corruption: true,
        })
    }

    /// Reads and decodes an index file, bounded by what its segment could need: at most one
    /// entry per record, and no record is shorter than a header.
    async fn read_index(
        &mut self,
        path: &Path,
        segment_size_bytes: u64,
    ) -> Result<(SegmentIndex, IndexSummary), String> {
        let entries_max = usize::try_from(segment_size_bytes / HEADER_SIZE as u64 + 1)
            .map_err(|_| "segment too large".to_string())?;
        let size_max = INDEX_HEADER_SIZE_BYTES
            .saturating_add(entries_max.saturating_mul(INDEX_ENTRY_SIZE_BYTES));
        let file = self
            .storage
            .open(path, OpenMode::Read, false)
            .await
            .map_err(|e| format!("cannot open: {e}"))?;
        let size = file.size_bytes().await.map_err(|e| format!("cannot size: {e}"))?;
        if size > size_max as u64 {
            return Err(format!("{size} bytes, more than its segment could need ({size_max})"));
        }
        let bytes =
            read_range(&file, 0, size as usize).await.map_err(|e| format!("read error: {e}"))?;
        SegmentIndex::decode(&bytes, entries_max)
    }
}

/// The chain position after `header`, like [`ChainNext::after`] but refusing (rather than
/// overflowing on) an op or offset at the end of the u64 range, which a hostile file can hold
/// behind valid checksums.
pub(super) fn chain_after(here: &ChainNext, header: &Header) -> Option<ChainNext> {
    let prepare = header.as_prepare()?;
    Some(ChainNext {
        cluster: here.cluster,
        group: here.group,
        op: prepare.op.checked_add(1)?,
        parent: header.checksum_header,
        offset: prepare.base_offset.checked_add(u64::from(prepare.record_count))?,
    })
}

/// Checks the record in `bytes` where the walk stands: against the chain when it expects one,
/// else on its own; and the chain position after it.
fn check_record(walk: &GroupWalk, bytes: &[u8]) -> Result<(Header, ChainNext), RecordFault> {
    let checked = match (&walk.chain, walk.cluster) {
        (Chain::Expect(next), _) => check_next(bytes, next, &walk.fence, walk.record_max),
        (_, Some(cluster)) => check_standalone(bytes, cluster, walk.group, walk.record_max),
        // No superblock says whose cluster this is: believe the first record's.
        (_, None) => {
            let cluster = Header::decode_prefix(bytes).map_or(0, |header| header.cluster);
            check_standalone(bytes, cluster, walk.group, walk.record_max)
        }
    };
    checked.and_then(|header| {
        let prepare = prepare_of(&header);
        let here = walk.expected().copied().unwrap_or(ChainNext {
            cluster: header.cluster,
            group: walk.group,
            op: prepare.op,
            parent: prepare.parent,
            offset: prepare.base_offset,
        });
        chain_after(&here, &header).map(|next| (header, next)).ok_or_else(|| {
            RecordFault::BadHeader("op or offset at the end of the u64 range".into())
        })
    })
}

/// A group's chain while its segments are walked.
struct GroupWalk {
    /// The cluster every record must carry (None: no superblock; taken from the first record).
    cluster: Option<u64>,
    group: u64,
    checkpoint: Checkpoint,
    fence: Fence,
    record_max: usize,
    chain: Chain,
    /// The record the checkpoint names was found.
    checkpoint_seen: bool,
    /// A problem already broke or damaged the chain: later consequences are not new findings.
    damaged: bool,
    /// Where the data of the last scanned segment ended.
    end_at: Option<(PathBuf, At)>,
    /// Every op up to this one was synced: the checkpoint's, or a sync mark's beyond it.
    synced_op: u64,
    /// Where a segment's data ends at most (its sync-mark trailer follows); None without a slot.
    data_limit_bytes: Option<u64>,
}

impl GroupWalk {
    /// A walk about to visit the group's first segment file.
    fn new(cluster: Option<u64>, group: u64, slot: Option<GroupSlot>) -> Self {
        let checkpoint = slot.map(|s| s.checkpoint).unwrap_or_default();
        GroupWalk {
            cluster,
            group,
            checkpoint,
            fence: slot.map(|s| s.fence).unwrap_or_default(),
            record_max: slot
                .map_or(RECORD_SIZE_FALLBACK_BYTES, |s| s.config.record_size_bytes_max as usize),
            // A log that never checkpointed has lost nothing to retention, so it starts at op 1;
            // otherwise the first remaining segment says where the chain starts.
            chain: match cluster {
                Some(cluster) if slot.is_some() && checkpoint.op == 0 => {
                    Chain::Expect(ChainNext { cluster, group, op: 1, parent: 0, offset: 0 })
                }
                _ => Chain::Anchor,
            },
            checkpoint_seen: false,
            damaged: false,
            end_at: None,
            synced_op: checkpoint.op,
            data_limit_bytes: slot.as_ref().map(data_limit_bytes),
        }
    }

    fn expected(&self) -> Option<&ChainNext> {
        match &self.chain {
            Chain::Expect(next) => Some(next),
            Chain::Anchor | Chain::Ended(_) => None,
        }
    }

    fn break_chain(&mut self) {
        self.chain = Chain::Anchor;
        self.damaged = true;
    }

    /// Whether the record `next` describes, in segment `base`, lies before the torn window:
    /// the checkpoint op is not reached yet, or the segment is older than the checkpoint's
    /// (synced whole when it rolled).
    fn before_checkpoint(&self, next: &ChainNext, base: u64) -> bool {
        next.op <= self.synced_op
            || (self.checkpoint.op > 0 && base < self.checkpoint.segment_base_offset)
    }
}

enum EndOfData {
    /// The damaged record could be stepped over: continue here.
    SkipTo(u64),
    /// The segment's data ends.
    End(SegmentEnd),
}

/// Compares an index file's entries with the records a scan finds, one record at a time, so
/// the segment is never held whole.
struct IndexCheck {
    entries: Vec<IndexEntry>,
    next: usize,
    mismatch: Option<String>,
}

impl IndexCheck {
    fn new(entries: &[IndexEntry]) -> Self {
        Self { entries: entries.to_vec(), next: 0, mismatch: None }
    }

    fn fail(&mut self, reason: String) {
        self.mismatch.get_or_insert(reason);
    }

    fn observe(&mut self, header: &Header, position: u64) {
        let prepare = prepare_of(header);
        while let Some(entry) = self.entries.get(self.next).copied()
            && entry.position_bytes < position
        {
            self.fail(format!(
                "entry {} points at byte {}, which is not a record start",
                self.next, entry.position_bytes
            ));
            self.next += 1;
        }
        if let Some(entry) = self.entries.get(self.next).copied()
            && entry.position_bytes == position
        {
            if (entry.op, entry.offset, entry.append_time_ms)
                != (prepare.op, prepare.base_offset, prepare.append_time_ms)
            {
                self.fail(format!(
                    "entry {} says op {} offset {} at byte {position}, the record there is op {} \
                     offset {}",
                    self.next, entry.op, entry.offset, prepare.op, prepare.base_offset
                ));
            }
            self.next += 1;
        }
    }

    fn finish(mut self, summary: &IndexSummary, scanned: &IndexSummary) -> Option<String> {
        if let Some(entry) = self.entries.get(self.next).copied() {
            self.fail(format!(
                "entry {} points at byte {}, past the segment's data",
                self.next, entry.position_bytes
            ));
        }
        // The append time is left out: it only steers time lookups, and the engine derives it
        // from index entries after a restart, so it may trail the newest record's.
        if (summary.covered_bytes, summary.next_offset, summary.last_op)
            != (scanned.covered_bytes, scanned.next_offset, scanned.last_op)
        {
            self.fail(format!(
                "summary says {} bytes, next offset {}, last op {}; the segment holds {} bytes, \
                 next offset {}, last op {}",
                summary.covered_bytes,
                summary.next_offset,
                summary.last_op,
                scanned.covered_bytes,
                scanned.next_offset,
                scanned.last_op
            ));
        }
        self.mismatch
    }
}

/// The position of the first non-zero byte at or after `from`, read window by window.
/// Where a group's segment data ends at most: its size, padded, and a guard block; the
/// sync-mark trailer follows.
fn data_limit_bytes(slot: &GroupSlot) -> u64 {
    let block = BLOCK_SIZE_BYTES as u64;
    slot.config.segment_size_bytes.next_multiple_of(block) + block
}

/// The first nonzero byte from `from` up to `stop` (the file's end when None).
async fn first_nonzero<F: StorageFile>(
    scanner: &mut Scanner<'_, F>,
    from: u64,
    stop: Option<u64>,
) -> std::io::Result<Option<u64>> {
    let mut position = from;
    loop {
        let len = stop.map_or(WINDOW_BYTES as u64, |stop| stop.saturating_sub(position));
        let bytes = scanner.bytes_at(position, len.min(WINDOW_BYTES as u64) as usize).await?;
        if bytes.is_empty() {
            return Ok(None);
        }
        if let Some(index) = bytes.iter().position(|&b| b != 0) {
            return Ok(Some(position + index as u64));
        }
        position += bytes.len() as u64;
    }
}
