//! The checker's walk: [`inspect`] takes a data directory (or one shard directory), visits
//! each shard's superblock, groups and journal, and gathers the problems and notes the checks
//! find, with the few reading helpers every check shares.
//!
//! It decides only where to look and in what order; judging a file's contents is the job of
//! the superblock, group and journal checks. It must never write, and never read a length it
//! has not bounded first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::report::{InspectReport, Note, ShardReport};
use crate::Corruption;
use crate::record::ChainNext;
use crate::storage::{AlignedBuf, Storage, StorageFile};
use crate::superblock::{self, Identity};

/// Read window for segments and the journal: large enough to make sequential reads cheap, small
/// enough that a 4 GiB segment never sits in memory.
pub(super) const WINDOW_BYTES: usize = 4 << 20;

/// Record bound for a group the superblock does not describe (an orphan directory, or no valid
/// superblock copy): generous, but still a bound on what one record read may allocate.
pub(super) const RECORD_SIZE_FALLBACK_BYTES: usize = 64 << 20;

/// Checks the data directory (holding `shard-N` directories) or shard directory at `path`.
///
/// Never writes and never panics on what it reads; an unreadable path or a directory that is
/// neither comes back as [`InspectReport::error`].
pub async fn inspect<S: Storage>(storage: &S, path: &Path) -> InspectReport {
    let mut checker = Checker { storage, problems: Vec::new(), notes: Vec::new() };
    let mut report = InspectReport { path: path.to_path_buf(), ..InspectReport::default() };
    match storage.exists(path).await {
        Ok(true) => {}
        Ok(false) => {
            report.error = Some(format!("{} does not exist", path.display()));
            return report;
        }
        Err(error) => {
            report.error = Some(format!("cannot probe {}: {error}", path.display()));
            return report;
        }
    }
    let names = match storage.list_dir(path).await {
        Ok(names) => names,
        Err(error) => {
            report.error = Some(format!("cannot list {}: {error}", path.display()));
            return report;
        }
    };
    let is_shard_dir = names.iter().any(|name| {
        name == superblock::FILE_NAME
            || name == superblock::TEMP_FILE_NAME
            || name == crate::journal::FILE_NAME
            || parse_group_dir(name).is_some()
    });
    if is_shard_dir {
        let shard = path.file_name().and_then(|n| n.to_str()).and_then(parse_shard_dir);
        let shard_report = checker.shard(path, shard).await;
        report.shards.push(shard_report);
    } else {
        let mut shards: Vec<(u32, String)> = names
            .iter()
            .filter_map(|name| parse_shard_dir(name).map(|n| (n, name.clone())))
            .collect();
        if shards.is_empty() {
            report.error = Some(format!(
                "{} holds neither shard directories (shard-N) nor a shard's superblock",
                path.display()
            ));
            return report;
        }
        shards.sort();
        for name in &names {
            if parse_shard_dir(name).is_none() {
                checker.note(path.join(name), None, "unknown entry in the data directory");
            }
        }
        for (n, name) in &shards {
            let shard_report = checker.shard(&path.join(name), Some(*n)).await;
            report.shards.push(shard_report);
        }
        checker.node_identity(path, &report.shards);
    }
    report.problems = checker.problems;
    report.notes = checker.notes;
    report
}

/// What the walk has found so far, and the storage it reads through.
pub(super) struct Checker<'s, S> {
    pub(super) storage: &'s S,
    pub(super) problems: Vec<Corruption>,
    pub(super) notes: Vec<Note>,
}

/// A record position a problem can name.
#[derive(Clone, Copy)]
pub(super) struct At {
    pub(super) position_bytes: u64,
    pub(super) offset: Option<u64>,
    pub(super) op: Option<u64>,
}

impl At {
    pub(super) fn byte(position_bytes: u64) -> At {
        At { position_bytes, offset: None, op: None }
    }

    pub(super) fn expecting(position_bytes: u64, next: Option<&ChainNext>) -> At {
        At { position_bytes, offset: next.map(|n| n.offset), op: next.map(|n| n.op) }
    }
}

impl<S: Storage> Checker<'_, S> {
    pub(super) fn problem(&mut self, file: &Path, at: At, reason: impl Into<String>) {
        self.problems.push(Corruption {
            file: file.to_path_buf(),
            position_bytes: at.position_bytes,
            offset: at.offset,
            op: at.op,
            reason: reason.into(),
        });
    }

    pub(super) fn note(
        &mut self,
        file: PathBuf,
        position_bytes: Option<u64>,
        message: impl Into<String>,
    ) {
        self.notes.push(Note { file, position_bytes, message: message.into() });
    }

    async fn shard(&mut self, dir: &Path, shard: Option<u32>) -> ShardReport {
        let mut report = ShardReport { dir: dir.to_path_buf(), shard, ..ShardReport::default() };
        let names = match self.storage.list_dir(dir).await {
            Ok(names) => names,
            Err(error) => {
                self.problem(dir, At::byte(0), format!("cannot list the shard directory: {error}"));
                return report;
            }
        };
        let has = |file: &str| names.iter().any(|name| name == file);
        if !has(superblock::FILE_NAME)
            && has(superblock::TEMP_FILE_NAME)
            && !names.iter().any(|name| parse_group_dir(name).is_some())
        {
            // Open renames the new superblock into place before anything else is written, so
            // a shard caught before that holds no data: the next open starts it afresh.
            report.superblock.file = dir.join(superblock::FILE_NAME);
            self.note(
                dir.join(superblock::TEMP_FILE_NAME),
                None,
                "shard creation interrupted before its superblock was in place (holds no data)",
            );
            return report;
        }
        report.superblock = self.superblock(dir, &names).await;
        let state = report.superblock.state.clone();
        if let (Some(state), Some(shard)) = (&state, shard)
            && state.identity.shard != shard
        {
            let file = report.superblock.file.clone();
            self.problem(
                &file,
                At::byte(0),
                format!(
                    "the superblock belongs to shard {}, the directory is shard-{shard}",
                    state.identity.shard
                ),
            );
        }
        let mut group_ids: BTreeMap<u64, String> = BTreeMap::new();
        for name in &names {
            if let Some(group) = parse_group_dir(name) {
                group_ids.insert(group, name.clone());
            } else if name == superblock::TEMP_FILE_NAME {
                self.note(
                    dir.join(name),
                    None,
                    "a new superblock written but never renamed into place (creation interrupted)",
                );
            } else if name != superblock::FILE_NAME && name != crate::journal::FILE_NAME {
                self.note(dir.join(name), None, "unknown entry in the shard directory");
            }
        }
        let slots = state.as_ref().map(|s| s.groups.clone()).unwrap_or_default();
        let mut ids: Vec<u64> = slots.keys().chain(group_ids.keys()).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        let cluster = state.as_ref().map(|s| s.identity.cluster);
        let mut heads = BTreeMap::new();
        for id in ids {
            let group_dir = crate::shard::group_dir(dir, id);
            let slot = slots.get(&id).copied();
            if slot.is_none() {
                self.note(
                    group_dir.clone(),
                    None,
                    "group directory the superblock does not name (recovery ignores it)",
                );
            }
            let (group, next) =
                self.group(&group_dir, id, slot, cluster, group_ids.contains_key(&id)).await;
            heads.insert(id, next);
            report.groups.push(group);
        }
        report.journal = self.journal(dir, state.as_ref(), &heads).await;
        report
    }

    /// Cross-shard checks of a node's data directory: every shard agrees on who owns it and how
    /// many shards there are, and none is missing.
    fn node_identity(&mut self, dir: &Path, shards: &[ShardReport]) {
        let identities: Vec<(&ShardReport, Identity)> = shards
            .iter()
            .filter_map(|s| s.superblock.state.as_ref().map(|state| (s, state.identity)))
            .collect();
        let Some(&(_, first)) = identities.first() else { return };
        for &(shard, identity) in &identities[1..] {
            if (identity.cluster, identity.node, identity.shard_count)
                != (first.cluster, first.node, first.shard_count)
            {
                self.problem(
                    &shard.superblock.file,
                    At::byte(0),
                    format!(
                        "identity (cluster {}, node {}, {} shards) differs from the first shard's \
                         (cluster {}, node {}, {} shards)",
                        identity.cluster,
                        identity.node,
                        identity.shard_count,
                        first.cluster,
                        first.node,
                        first.shard_count
                    ),
                );
            }
        }
        for n in 0..first.shard_count.min(1 << 16) {
            if !shards.iter().any(|s| s.shard == Some(n)) {
                self.problem(
                    &crate::shard::shard_dir(dir, n),
                    At::byte(0),
                    format!(
                        "shard directory missing (the superblocks say {} shards)",
                        first.shard_count
                    ),
                );
            }
        }
    }
}

/// Up to `len` bytes at `position` (fewer at end of file). Callers bound `len`.
pub(super) async fn read_range<F: StorageFile>(
    file: &F,
    position: u64,
    len: usize,
) -> std::io::Result<Vec<u8>> {
    let (result, buffer) = file.read_at(AlignedBuf::zeroed(len.max(1), 1), position).await;
    result?;
    let bytes = buffer.as_slice();
    Ok(bytes[..bytes.len().min(len)].to_vec())
}

fn parse_digits<T: std::str::FromStr>(digits: &str, len: Option<usize>) -> Option<T> {
    if digits.is_empty()
        || len.is_some_and(|len| digits.len() != len)
        || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    digits.parse().ok()
}

/// The shard index of a `shard-N` directory name.
fn parse_shard_dir(name: &str) -> Option<u32> {
    parse_digits(name.strip_prefix("shard-")?, None)
}

/// The group id of a `group-<20 digits>` directory name.
fn parse_group_dir(name: &str) -> Option<u64> {
    crate::shard::group_of_dir_name(name)
}
