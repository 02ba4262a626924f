//! The file steps of installing a state transfer (DESIGN.md §4, "Repair and catch-up"): the
//! staged files an install writes beside a group's live log, the roll-forward that replaces the
//! log with them once the superblock says so, and the removal of staged files an install left
//! behind before its commit point.
//!
//! It owns the staged file names and these steps only. It never writes the superblock (the
//! shard writes the commit point and clears the flag, see `ShardStore::install_transfer`), never
//! judges whether a transfer is acceptable (the shard checks the record and the state first),
//! and never interprets the transferred state's bytes.
//!
//! Every step is safe to repeat after a crash at any point in it: staging starts from scratch,
//! and the roll-forward reads what is left in the directory to tell which of its renames already
//! happened (a rename is atomic, and the staged files are durable before the commit point, so a
//! staged file that is gone was renamed).

use std::path::Path;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::segment::{SPARE_NAME, log_name, parse_index_name, parse_log_name};
use crate::state::{TRANSFER_STATE_FILE, TRANSFER_STATE_STAGED, write_synced};
use crate::storage::{AlignedBuf, BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile};

/// Suffix of a staged segment: `<base offset, 20 digits>.log.transfer`. Not a segment name
/// (`segment::parse_log_name` refuses it), so recovery never scans it as part of the log.
pub const STAGED_LOG_SUFFIX: &str = ".log.transfer";

/// File name of the staged first segment of a transferred log starting at `base_offset`.
#[must_use]
pub fn staged_log_name(base_offset: u64) -> String {
    format!("{base_offset:020}{STAGED_LOG_SUFFIX}")
}

/// The base offset a staged segment's file name encodes, if it is one.
#[must_use]
pub fn parse_staged_log_name(name: &str) -> Option<u64> {
    crate::segment::parse_base_offset_name(name, STAGED_LOG_SUFFIX)
}

/// Whether `name` is a file only an install in progress writes.
#[must_use]
pub fn is_staged_name(name: &str) -> bool {
    name == TRANSFER_STATE_STAGED || parse_staged_log_name(name).is_some()
}

/// Step 1 of an install: writes the new first segment (`record`, zero-padded to whole blocks)
/// under its staged name and the encoded transferred state as `transfer-state.staged`, syncs
/// both and the directory. The live log is not touched, so a failure here changes nothing the
/// group depends on: no room for the staged segment is the clean [`Error::StorageFull`], and a
/// retry starts again from scratch.
pub(crate) async fn stage<S: Storage>(
    storage: &S,
    dir: &Path,
    record: &[u8],
    base_offset: u64,
    state: Bytes,
) -> Result<()> {
    let names = list(storage, dir).await?;
    // A leftover of an earlier install that never reached its commit point may be longer than
    // what is written now: start from nothing.
    remove_leftovers(storage, dir, &names).await?;
    write_segment(storage, dir, &staged_log_name(base_offset), record).await?;
    write_synced(storage, &dir.join(TRANSFER_STATE_STAGED), state).await?;
    sync(storage, dir).await
}

/// Step 3 of an install, after the superblock holds the slot with the transfer pending: removes
/// every segment, index and spare file of the old log, renames the staged segment to its final
/// name and `transfer-state.staged` over `transfer-state`, and syncs the directory. Idempotent:
/// a staged file that is gone was already renamed (the commit point came after both were
/// durable), and then `<base_offset>.log` is the new log's and stays.
pub(crate) async fn roll_forward<S: Storage>(
    storage: &S,
    dir: &Path,
    base_offset: u64,
) -> Result<()> {
    let names = list(storage, dir).await?;
    let staged = staged_log_name(base_offset);
    let live = log_name(base_offset);
    let renamed = !names.contains(&staged);
    for name in &names {
        let old_segment = parse_log_name(name).is_some() && !(renamed && *name == live);
        let other_staged = parse_staged_log_name(name).is_some_and(|base| base != base_offset);
        if old_segment || other_staged || parse_index_name(name).is_some() || name == SPARE_NAME {
            remove(storage, &dir.join(name)).await?;
        }
    }
    if !renamed {
        storage
            .rename(&dir.join(&staged), &dir.join(&live))
            .await
            .map_err(|e| Error::io(format!("renaming {staged} into place"), e))?;
    }
    if names.iter().any(|name| name == TRANSFER_STATE_STAGED) {
        storage
            .rename(&dir.join(TRANSFER_STATE_STAGED), &dir.join(TRANSFER_STATE_FILE))
            .await
            .map_err(|e| Error::io("renaming the transferred state into place", e))?;
    }
    sync(storage, dir).await
}

/// Removes the staged files of an install that never reached its commit point (`names` is the
/// directory's listing). Without a directory sync: a removal a crash loses is made again by the
/// next open, and nothing reads a staged file without the commit point naming it.
pub(crate) async fn remove_leftovers<S: Storage>(
    storage: &S,
    dir: &Path,
    names: &[String],
) -> Result<()> {
    for name in names.iter().filter(|name| is_staged_name(name)) {
        remove(storage, &dir.join(name)).await?;
    }
    Ok(())
}

/// Canary (DESIGN.md §7, `canary-transfer-unstaged`): replaces the old log in place before the
/// commit point — removes its files and writes the new segment under its final name — so a
/// crash before the superblock write leaves neither the old log nor a committed new one.
pub(crate) async fn stage_unstaged<S: Storage>(
    storage: &S,
    dir: &Path,
    record: &[u8],
    base_offset: u64,
    state: Bytes,
) -> Result<()> {
    let names = list(storage, dir).await?;
    remove_leftovers(storage, dir, &names).await?;
    for name in &names {
        if parse_log_name(name).is_some() || parse_index_name(name).is_some() || name == SPARE_NAME
        {
            remove(storage, &dir.join(name)).await?;
        }
    }
    sync(storage, dir).await?;
    write_segment(storage, dir, &log_name(base_offset), record).await?;
    write_synced(storage, &dir.join(TRANSFER_STATE_STAGED), state).await?;
    sync(storage, dir).await
}

/// Creates `name` in `dir` holding `record` zero-padded to whole blocks (direct I/O needs them,
/// and zeros past the chain's end are end of data to recovery's scan), and syncs its data.
async fn write_segment<S: Storage>(
    storage: &S,
    dir: &Path,
    name: &str,
    record: &[u8],
) -> Result<()> {
    let path = dir.join(name);
    let file = storage
        .open(&path, OpenMode::CreateReadWrite, true)
        .await
        .map_err(|e| Error::preparing(format!("creating {}", path.display()), e))?;
    let len_bytes = record.len().next_multiple_of(BLOCK_SIZE_BYTES);
    let mut buffer = AlignedBuf::zeroed(len_bytes, BLOCK_SIZE_BYTES);
    buffer.extend_from_slice(record);
    buffer.set_len(len_bytes);
    // Nothing depends on this file until the commit point: no room for it is clean.
    file.write_at(buffer.freeze(), 0)
        .await
        .map_err(|e| Error::preparing(format!("writing {}", path.display()), e))?;
    file.sync_data().await.map_err(|e| Error::io(format!("syncing {}", path.display()), e))
}

async fn list<S: Storage>(storage: &S, dir: &Path) -> Result<Vec<String>> {
    storage.list_dir(dir).await.map_err(|e| Error::io(format!("listing {}", dir.display()), e))
}

async fn remove<S: Storage>(storage: &S, path: &Path) -> Result<()> {
    storage
        .remove_file(path)
        .await
        .map_err(|e| Error::io(format!("removing {}", path.display()), e))
}

async fn sync<S: Storage>(storage: &S, dir: &Path) -> Result<()> {
    storage.sync_dir(dir).await.map_err(|e| Error::io(format!("syncing {}", dir.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_names_are_never_segment_or_index_names() {
        let name = staged_log_name(42);
        assert_eq!(name, "00000000000000000042.log.transfer");
        assert_eq!(parse_staged_log_name(&name), Some(42));
        assert!(parse_log_name(&name).is_none() && parse_index_name(&name).is_none());
        assert!(is_staged_name(&name) && is_staged_name(TRANSFER_STATE_STAGED));
        for other in [log_name(42), TRANSFER_STATE_FILE.to_string(), "42.log.transfer".into()] {
            assert!(!is_staged_name(&other), "{other}");
        }
    }
}
