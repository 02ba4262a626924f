//! The superblock check: every copy of a shard's superblock decoded, the newest valid version
//! found, and stale or damaged copies told apart.
//!
//! It finds the copy size from the copy headers when copy 0 is damaged, probing a bounded
//! number of candidates; it must never trust a size it has not bounded, nor stop at the first
//! damaged copy (the state is still read from the others).

use std::path::Path;

use super::checker::{At, Checker, read_range};
use super::report::{CopyInfo, CopyReport, SuperblockReport};
use crate::storage::{BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile};
use crate::superblock::{self, COPIES, SuperblockState};

/// Largest superblock copy region the checker will read (4096 groups need about 0.5 MiB).
const COPY_SIZE_MAX_BYTES: usize = 64 << 20;

/// Where a copy header stores its slot bound (`slots_max`), which fixes every copy's size. Only
/// used to find the copy size when copy 0 is unreadable; `superblock_header_layout_is_pinned`
/// checks it against a superblock the engine wrote.
pub(super) const SUPERBLOCK_OFF_SLOTS_MAX: usize = 48;
/// Where a copy header keeps its format version (it fixes the slot size).
const SUPERBLOCK_OFF_VERSION: usize = 44;

/// Cap on the candidate copy sizes probed when copy 0 is damaged.
const COPY_SIZE_PROBES_MAX: usize = 4096;

impl<S: Storage> Checker<'_, S> {
    pub(super) async fn superblock(&mut self, dir: &Path, names: &[String]) -> SuperblockReport {
        let path = dir.join(superblock::FILE_NAME);
        let mut report = SuperblockReport { file: path.clone(), ..SuperblockReport::default() };
        if !names.iter().any(|name| name == superblock::FILE_NAME) {
            self.problem(&path, At::byte(0), "superblock missing");
            return report;
        }
        let file = match self.storage.open(&path, OpenMode::Read, false).await {
            Ok(file) => file,
            Err(error) => {
                self.problem(&path, At::byte(0), format!("cannot open the superblock: {error}"));
                return report;
            }
        };
        report.file_size_bytes = match file.size_bytes().await {
            Ok(size) => size,
            Err(error) => {
                self.problem(&path, At::byte(0), format!("cannot size the superblock: {error}"));
                return report;
            }
        };
        let Some(copy_size) = copy_size(&file, report.file_size_bytes).await else {
            self.problem(
                &path,
                At::byte(0),
                "no valid superblock copy: no copy header names a plausible copy size",
            );
            return report;
        };
        report.copy_size_bytes = copy_size as u64;
        let mut decoded = Vec::with_capacity(COPIES);
        for index in 0..COPIES {
            let position = (index * copy_size) as u64;
            let status = match read_range(&file, position, copy_size).await {
                Ok(mut bytes) => {
                    // A short copy reads as zeros past the end, as the engine reads it.
                    bytes.resize(copy_size, 0);
                    superblock::decode_copy(&bytes)
                }
                Err(error) => Err(format!("read error: {error}")),
            };
            decoded.push(status);
        }
        let newest = decoded
            .iter()
            .enumerate()
            .filter_map(|(i, copy)| copy.as_ref().ok().map(|state| (i, state)))
            .max_by_key(|(i, state)| (state.sequence, std::cmp::Reverse(*i)))
            .map(|(i, state)| (i, state.clone()));
        for (index, copy) in decoded.into_iter().enumerate() {
            let position = (index * copy_size) as u64;
            let status = match copy {
                Ok(state) => {
                    let current = newest.as_ref().is_some_and(|(_, n)| {
                        n.sequence == state.sequence && n.checksum == state.checksum
                    });
                    if let Some((_, n)) = &newest
                        && !current
                    {
                        self.superblock_stale(&path, index, position, n, &state);
                    }
                    Ok(CopyInfo {
                        sequence: state.sequence,
                        checksum: state.checksum,
                        parent: state.parent,
                        identity: state.identity,
                        slot_count: state.groups.len(),
                        slots_max: state.slots_max,
                        current,
                    })
                }
                Err(reason) => {
                    self.problem(
                        &path,
                        At::byte(position),
                        format!("superblock copy {index} invalid: {reason}"),
                    );
                    Err(reason)
                }
            };
            report.copies.push(CopyReport { index, position_bytes: position, status });
        }
        match newest {
            Some((index, state)) => {
                let named = superblock::copy_size_bytes_in(state.version, state.slots_max);
                if copy_size != named {
                    self.problem(
                        &path,
                        At::byte(0),
                        format!(
                            "copies are {copy_size} bytes apart, the newest names slots_max {} ({} bytes)",
                            state.slots_max, named
                        ),
                    );
                }
                report.newest = Some(index);
                report.state = Some(state);
            }
            None => self.problem(&path, At::byte(0), "no valid superblock copy"),
        }
        report
    }

    /// A valid copy older than the newest: what a crash between copy writes leaves (open
    /// rewrites it). Its version must still be an ancestor the newest can chain to.
    fn superblock_stale(
        &mut self,
        path: &Path,
        index: usize,
        position: u64,
        newest: &SuperblockState,
        stale: &SuperblockState,
    ) {
        if stale.sequence >= newest.sequence {
            self.problem(
                path,
                At::byte(position),
                format!(
                    "superblock copy {index} holds another version with the same sequence {}",
                    stale.sequence
                ),
            );
        } else if stale.sequence + 1 == newest.sequence && newest.parent != stale.checksum {
            self.problem(
                path,
                At::byte(position),
                format!(
                    "superblock copy {index} (sequence {}) is not the parent of the newest version",
                    stale.sequence
                ),
            );
        } else {
            self.note(
                path.to_path_buf(),
                Some(position),
                format!(
                    "superblock copy {index} is stale (sequence {}, newest {}): a crash between \
                     copy writes; open rewrites it",
                    stale.sequence, newest.sequence
                ),
            );
        }
    }
}

/// The size of one superblock copy's region. Copy 0's header names the slot bound that fixes
/// it; when copy 0 is damaged, sizes the file allows are probed at the later copies.
async fn copy_size<F: StorageFile>(file: &F, file_size: u64) -> Option<usize> {
    if let Some(size) = copy_size_at(file, 0, None).await {
        return Some(size);
    }
    // Three whole copies precede the last, which holds at least one block.
    let block = BLOCK_SIZE_BYTES as u64;
    let low = (file_size / COPIES as u64).next_multiple_of(block).max(block);
    let high = file_size.saturating_sub(block) / (COPIES as u64 - 1);
    let mut candidate = low;
    let mut probes = 0;
    while candidate <= high && probes < COPY_SIZE_PROBES_MAX {
        let size = usize::try_from(candidate).ok()?;
        for copy in 1..COPIES {
            if copy_size_at(file, candidate * copy as u64, Some(size)).await.is_some() {
                return Some(size);
            }
        }
        candidate += block;
        probes += 1;
    }
    None
}

/// The copy size the copy at `position` names, if that copy decodes (and has `expected` size).
async fn copy_size_at<F: StorageFile>(
    file: &F,
    position: u64,
    expected: Option<usize>,
) -> Option<usize> {
    let head = read_range(file, position, superblock::HEADER_SIZE_BYTES).await.ok()?;
    let slots_max = head.get(SUPERBLOCK_OFF_SLOTS_MAX..SUPERBLOCK_OFF_SLOTS_MAX + 4)?;
    let slots_max = u32::from_le_bytes(slots_max.try_into().ok()?) as usize;
    let version = *head.get(SUPERBLOCK_OFF_VERSION)?;
    let size = superblock::copy_size_bytes_in(version, slots_max);
    if size > COPY_SIZE_MAX_BYTES || expected.is_some_and(|expected| expected != size) {
        return None;
    }
    let mut bytes = read_range(file, position, size).await.ok()?;
    bytes.resize(size, 0);
    superblock::decode_copy(&bytes).ok().map(|_| size)
}
