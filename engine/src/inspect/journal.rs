//! The journal check: the shard journal scanned as recovery scans it, every entry the newest
//! one says was synced and still needed accounted for, and each group's needed entries walked
//! past its segments' end like recovery's replay.
//!
//! A missing synced entry is a problem unless checkpoints provably cover it; torn entries past
//! the synced ones are notes. It must never read an entry by a length it has not bounded.

use std::collections::BTreeMap;
use std::path::Path;

use super::checker::{At, Checker, RECORD_SIZE_FALLBACK_BYTES, WINDOW_BYTES};
use super::group::chain_after;
use super::report::{JournalGroup, JournalReport};
use crate::record::ChainNext;
use crate::scan::Scanner;
use crate::storage::{BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile};
use crate::superblock::{Durability, Fence, SuperblockState};
use crate::wire::{HEADER_SIZE, Header};

impl<S: Storage> Checker<'_, S> {
    /// Scans the journal as recovery does (entries contiguous within a cycle, cycles on block
    /// boundaries), checks that every entry the newest one says was synced and still needed is
    /// there, and what each group's needed entries add past its segments.
    pub(super) async fn journal(
        &mut self,
        dir: &Path,
        state: Option<&SuperblockState>,
        heads: &BTreeMap<u64, Option<ChainNext>>,
    ) -> Option<JournalReport> {
        let path = dir.join(crate::journal::FILE_NAME);
        match self.storage.exists(&path).await {
            Ok(true) => {}
            // ShardStore::open creates the journal with the superblock: a shard without one lost it.
            Ok(false) => {
                self.problem(&path, At::byte(0), "journal missing");
                return None;
            }
            Err(error) => {
                self.problem(&path, At::byte(0), format!("cannot probe the journal: {error}"));
                return None;
            }
        }
        let file = match self.storage.open(&path, OpenMode::Read, false).await {
            Ok(file) => file,
            Err(error) => {
                self.problem(&path, At::byte(0), format!("cannot open the journal: {error}"));
                return None;
            }
        };
        let mut report = JournalReport { file: path.clone(), ..JournalReport::default() };
        let mut scanner = match Scanner::new(&file, WINDOW_BYTES).await {
            Ok(scanner) => scanner,
            Err(error) => {
                self.problem(&path, At::byte(0), format!("cannot read the journal: {error}"));
                return Some(report);
            }
        };
        report.file_size_bytes = file.size_bytes().await.unwrap_or(0);
        if !report.file_size_bytes.is_multiple_of(BLOCK_SIZE_BYTES as u64) {
            self.note(
                path.clone(),
                None,
                format!("journal size {} is not block-aligned", report.file_size_bytes),
            );
        }
        let found = self.journal_entries(&path, &mut scanner, report.file_size_bytes, state).await;
        report.entries_valid = found.len() as u64;
        report.markers = found.values().filter(|e| e.inner.is_none()).count() as u64;
        let (Some((&seq_first, _)), Some((&seq_last, newest))) =
            (found.first_key_value(), found.last_key_value())
        else {
            return Some(report);
        };
        report.seq_first = Some(seq_first);
        report.seq_last = Some(seq_last);
        report.durable_seq = found.values().map(|e| e.fields.durable_seq).max().unwrap_or(0);
        report.tail_seq = newest.fields.tail_seq.max(1);
        self.synced_entries(&path, &found, state, &report, seq_last);
        self.journal_groups(&path, &found, state, heads, &mut report);
        Some(report)
    }

    /// Every entry that decodes, by seq, scanned as recovery scans (entries contiguous within a
    /// cycle, cycles on block boundaries); a seq found again is a note.
    async fn journal_entries<F: StorageFile>(
        &mut self,
        path: &Path,
        scanner: &mut Scanner<'_, F>,
        file_size_bytes: u64,
        state: Option<&SuperblockState>,
    ) -> BTreeMap<u64, JournalFound> {
        let record_max = state
            .and_then(|s| s.groups.values().map(|g| g.config.record_size_bytes_max as usize).max())
            .unwrap_or(RECORD_SIZE_FALLBACK_BYTES);
        let entry_max = HEADER_SIZE + record_max;
        let block = BLOCK_SIZE_BYTES as u64;
        let mut found: BTreeMap<u64, JournalFound> = BTreeMap::new();
        let mut position = 0u64;
        while position + HEADER_SIZE as u64 <= file_size_bytes {
            let bytes = match scanner.record_at(position, entry_max).await {
                Ok(bytes) => bytes,
                Err(error) => {
                    self.problem(path, At::byte(position), format!("read error: {error}"));
                    break;
                }
            };
            let Some(entry) = decode_journal_entry(&bytes, entry_max, position) else {
                position = (position + 1).next_multiple_of(block);
                continue;
            };
            position += entry.size_bytes;
            if let Some(first) = found.get(&entry.fields.seq) {
                self.note(
                    path.to_path_buf(),
                    Some(entry.position_bytes),
                    format!(
                        "journal entry seq {} appears again (first at byte {})",
                        entry.fields.seq, first.position_bytes
                    ),
                );
                continue;
            }
            found.insert(entry.fields.seq, entry);
        }
        found
    }

    /// Checks that every entry the newest says was synced and still needed is here: a missing
    /// one may have been acknowledged. `tail_seq` only moves when an entry is written, so after
    /// the last checkpoints (a clean close) it still names entries they cover. A missing seq
    /// is provably covered when every persisted group has a later entry at or below its
    /// checkpoint (a group's ops grow with seq): such a loss is a note, not damage.
    fn synced_entries(
        &mut self,
        path: &Path,
        found: &BTreeMap<u64, JournalFound>,
        state: Option<&SuperblockState>,
        report: &JournalReport,
        seq_last: u64,
    ) {
        let synced_last = report.durable_seq.min(seq_last);
        let covered_below = covered_below(found, state);
        let uncovered_from = report.tail_seq.max(covered_below);
        if let Some((missing, absent)) =
            first_missing(found, report.tail_seq, synced_last.min(uncovered_from.saturating_sub(1)))
        {
            self.note(
                path.to_path_buf(),
                Some(entry_end_before(found, missing)),
                format!(
                    "{absent} journal entries from seq {missing} are missing or damaged, but \
                     checkpoints cover them (recovery still counts them as synced losses)"
                ),
            );
        }
        if let Some((missing, absent)) = first_missing(found, uncovered_from, synced_last) {
            self.problem(
                path,
                At::byte(entry_end_before(found, missing)),
                format!(
                    "journal entry seq {missing} was synced but is missing or damaged ({absent} \
                     of seq {uncovered_from}..={synced_last} missing)"
                ),
            );
        }
    }

    /// What the needed entries hold, per group, in op order (as recovery replays them).
    fn journal_groups(
        &mut self,
        path: &Path,
        found: &BTreeMap<u64, JournalFound>,
        state: Option<&SuperblockState>,
        heads: &BTreeMap<u64, Option<ChainNext>>,
        report: &mut JournalReport,
    ) {
        let mut by_group: BTreeMap<u64, Vec<&JournalFound>> = BTreeMap::new();
        for entry in found.range(report.tail_seq..).map(|(_, e)| e) {
            let Some(prepare) = entry.prepare() else { continue };
            if !entry.inner_body_ok {
                let at = At {
                    position_bytes: entry.position_bytes,
                    offset: Some(prepare.base_offset),
                    op: Some(prepare.op),
                };
                if entry.fields.seq <= report.durable_seq {
                    self.problem(path, at, "journal entry holds a prepare whose body is damaged");
                } else {
                    self.note(path.to_path_buf(), Some(at.position_bytes), "torn journal entry");
                }
                continue;
            }
            by_group.entry(prepare.group).or_default().push(entry);
        }
        for (group, mut entries) in by_group {
            let slot = state.and_then(|s| s.groups.get(&group));
            if let Some(slot) = slot {
                // An earlier group of the same id wrote these; recovery ignores them.
                entries.retain(|entry| entry.fields.seq > slot.journal_floor_seq);
                if entries.is_empty() {
                    continue;
                }
            }
            sort_for_replay(&mut entries);
            let mut summary = JournalGroup {
                group,
                entries: entries.len() as u64,
                first_op: entries.first().map_or(0, |e| e.op()),
                last_op: entries.last().map_or(0, |e| e.op()),
                replayable: 0,
            };
            let cluster = state.map(|s| s.identity.cluster);
            if slot.is_none() {
                self.note(
                    path.to_path_buf(),
                    entries.first().map(|e| e.position_bytes),
                    format!("journal entries of group {group}, which the superblock does not name"),
                );
            } else if let Some(cluster) = cluster
                && let Some(foreign) = entries.iter().find(|e| e.cluster != cluster)
            {
                self.note(
                    path.to_path_buf(),
                    Some(foreign.position_bytes),
                    format!("journal entry of cluster {}, not {cluster}", foreign.cluster),
                );
            } else if let (Some(slot), Some(Some(head))) = (slot, heads.get(&group)) {
                summary.replayable =
                    self.journal_replay(path, &entries, *head, slot.fence, report.durable_seq);
            }
            report.groups.push(summary);
        }
    }

    /// Walks a group's needed journal entries past its segments' end like recovery's replay:
    /// returns how many continue the chain. A gap before a synced entry is a lost op.
    fn journal_replay(
        &mut self,
        path: &Path,
        entries: &[&JournalFound],
        head: ChainNext,
        fence: Fence,
        durable_seq: u64,
    ) -> u64 {
        let mut next = head;
        let mut replayable = 0;
        for entry in entries {
            let (Some(inner), Some(prepare)) = (entry.inner.as_ref(), entry.prepare()) else {
                continue;
            };
            // As recovery: entries below the chain's next op, and entries the fence killed (a
            // truncated suffix's, which may lie past a gap their own truncation left), are
            // skipped before any gap is judged.
            if prepare.op < next.op
                || fence.kills_journal_entry(prepare.op, inner.view, entry.fields.seq)
            {
                continue;
            }
            if prepare.op > next.op {
                let message = format!(
                    "journal holds op {} of group {} but op {} is in neither the segments nor \
                     the journal",
                    prepare.op, prepare.group, next.op
                );
                if entry.fields.seq <= durable_seq {
                    let at = At {
                        position_bytes: entry.position_bytes,
                        offset: Some(next.offset),
                        op: Some(next.op),
                    };
                    self.problem(path, at, message);
                } else {
                    self.note(path.to_path_buf(), Some(entry.position_bytes), message);
                }
                break;
            }
            if prepare.parent != next.parent || prepare.base_offset != next.offset {
                // Recovery skips it too: a stale entry of a truncated view.
                continue;
            }
            let Some(after) = chain_after(&next, inner) else { break };
            replayable += 1;
            next = after;
        }
        replayable
    }
}

/// Orders a group's journal entries as recovery replays them: op order, and within an op the
/// newest view first (a later view's prepare of an op supersedes an older one, whatever their
/// journal sequence).
fn sort_for_replay(entries: &mut [&JournalFound]) {
    entries.sort_by_key(|e| {
        let view = e.inner.as_ref().map_or(0, |inner| inner.view);
        (e.op(), std::cmp::Reverse(view), e.fields.seq)
    });
}

/// The first seq missing from `found` in `from..=to`, and how many are missing there.
fn first_missing(found: &BTreeMap<u64, JournalFound>, from: u64, to: u64) -> Option<(u64, u64)> {
    if from > to {
        return None;
    }
    let mut expected = from;
    let mut first = None;
    for &seq in found.range(from..=to).map(|(seq, _)| seq) {
        if seq != expected {
            first.get_or_insert(expected);
        }
        expected = seq + 1;
    }
    if expected <= to {
        first.get_or_insert(expected);
    }
    let present = found.range(from..=to).count() as u64;
    first.map(|first| (first, (to - from).saturating_add(1).saturating_sub(present)))
}

/// Where the entry before `seq` ends: where `seq` would have been, or the closest to it.
fn entry_end_before(found: &BTreeMap<u64, JournalFound>, seq: u64) -> u64 {
    found.range(..seq).next_back().map_or(0, |(_, e)| e.position_bytes + e.size_bytes)
}

/// Seqs below the returned one are covered by checkpoints whatever group they held: every
/// persisted group has an entry at or past that seq whose op its checkpoint covers.
fn covered_below(found: &BTreeMap<u64, JournalFound>, state: Option<&SuperblockState>) -> u64 {
    let Some(state) = state else { return 0 };
    let mut bound = u64::MAX;
    for slot in state.groups.values().filter(|s| s.config.durability == Durability::Persisted) {
        let newest_covered = found
            .values()
            .filter(|e| {
                e.prepare().is_some_and(|prepare| {
                    prepare.group == slot.group && prepare.op <= slot.checkpoint.op
                })
            })
            .map(|e| e.fields.seq)
            .max();
        bound = bound.min(newest_covered.unwrap_or(0));
    }
    if bound == u64::MAX { 0 } else { bound }
}

/// One journal entry that decoded.
struct JournalFound {
    position_bytes: u64,
    size_bytes: u64,
    fields: crate::wire::JournalEntry,
    /// The outer header's cluster.
    cluster: u64,
    /// The prepare it frames (None: a marker, which only announces what is durable).
    inner: Option<Header>,
    inner_body_ok: bool,
}

impl JournalFound {
    fn prepare(&self) -> Option<&crate::wire::Prepare> {
        self.inner.as_ref().and_then(Header::as_prepare)
    }

    fn op(&self) -> u64 {
        self.prepare().map_or(0, |prepare| prepare.op)
    }
}

/// Decodes a journal entry at the start of `bytes` with the checks recovery makes (outer
/// header and body checksum, an inner prepare that fills the body, one cluster; or a marker,
/// a bare header); also notes whether the inner prepare's own body checksum holds.
fn decode_journal_entry(bytes: &[u8], entry_max: usize, position: u64) -> Option<JournalFound> {
    let (outer, fields, inner) = crate::journal::decode_entry(bytes, entry_max)?;
    let size = outer.size as usize;
    // The outer checksum covers the framed record; its own body checksum is checked apart so a
    // record that was framed damaged is told from one damaged at rest.
    let inner_body_ok =
        inner.is_none_or(|inner| inner.verify_body(&bytes[2 * HEADER_SIZE..size]).is_ok());
    Some(JournalFound {
        position_bytes: position,
        size_bytes: size as u64,
        fields,
        cluster: outer.cluster,
        inner,
        inner_body_ok,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Prepare;

    const GROUP: u64 = 3;

    /// Recovery replays a group's journal entries in op order, the newest view first, and so
    /// does the checker. A damage cut leaves a stale chain of an older view in the journal
    /// (never replayed) beside the newer view's entries for the same ops, which run further and
    /// were written later: taken in sequence order, the stale chain would be followed and then
    /// end in a false "lost op" (found by the simulator's seed 132 once its admin group changed
    /// the schedule).
    #[test]
    fn journal_entries_replay_newest_view_first_within_an_op() {
        let entry = |op: u64, view: u32, seq: u64| {
            let prepare = Prepare { group: GROUP, op, ..Prepare::default() };
            JournalFound {
                position_bytes: seq * 4096,
                size_bytes: 4096,
                fields: crate::wire::JournalEntry { seq, ..Default::default() },
                cluster: 0,
                inner: Some(Header::prepare(0, view, 0, prepare, b"")),
                inner_body_ok: true,
            }
        };
        let found = [
            entry(353, 6, 742),
            entry(354, 6, 744),
            entry(353, 10, 938),
            entry(354, 10, 939),
            entry(355, 10, 940),
        ];
        let mut entries: Vec<&JournalFound> = found.iter().collect();
        sort_for_replay(&mut entries);
        let order: Vec<(u64, u64)> = entries.iter().map(|e| (e.op(), e.fields.seq)).collect();
        assert_eq!(order, [(353, 938), (353, 742), (354, 939), (354, 744), (355, 940)]);
    }
}
