//! A group's state snapshot: opaque bytes that the group's owner derives from its log (the
//! server's consumer offsets today) saved as of a point in the log, so that after a restart the
//! owner replays the log from that point instead of from its first record.
//!
//! It owns the snapshot file's format and its crash-safe replacement: the new copy is written
//! and synced under a temporary name, renamed over the old one, and the directory synced, so a
//! crash leaves the old snapshot or the new one, never a mix. It never interprets the bytes,
//! never decides when to snapshot, and never deletes log data (the owner sets the log's
//! retention floor to what its newest snapshot covers).
//!
//! The same format holds the *transferred state* a log installed by a state transfer begins
//! from (`transfer-state`, written by `ShardStore::install_transfer`, read by
//! [`load_transfer_state`]): the peer's state as of the first op of the installed log. This
//! module only writes and reads it; the install decides when it is staged and renamed.
//!
//! File `state` (or `transfer-state`) in the group's directory, little-endian:
//!
//! | Offset | Size | Field | Meaning |
//! |-------:|-----:|-------|---------|
//! | 0  | 4 | `magic`    | `SHST` |
//! | 4  | 2 | `version`  | 1 |
//! | 6  | 2 | reserved   | zero |
//! | 8  | 8 | `op`       | The last op the state includes. |
//! | 16 | 8 | `end_offset` | The offset after that op's records: replay starts here. |
//! | 24 | 4 | `size`     | Bytes of state that follow the header. |
//! | 28 | 4 | `checksum` | CRC-32C of bytes 0..28 and of the state. |
//! | 32 | `size` | state | The owner's bytes. |

use std::path::Path;

use bytes::Bytes;

use crate::error::{Corruption, Error, Result};
use crate::storage::{AlignedBuf, OpenMode, Storage, StorageFile};

/// The snapshot's file name in the group's directory.
pub const STATE_FILE: &str = "state";
/// The name a new snapshot is written under before it replaces the old one.
pub const STATE_FILE_NEW: &str = "state.new";
/// The transferred state the group's live log began from, when a state transfer installed it.
pub const TRANSFER_STATE_FILE: &str = "transfer-state";
/// The name an install stages the transferred state under; its roll-forward renames it to
/// [`TRANSFER_STATE_FILE`].
pub const TRANSFER_STATE_STAGED: &str = "transfer-state.staged";
const MAGIC: [u8; 4] = *b"SHST";
const VERSION: u16 = 1;
const HEADER_SIZE: usize = 32;
/// The largest state a snapshot may hold: bounds the allocation when one is read back.
pub const STATE_SIZE_BYTES_MAX: usize = 64 << 20;

/// A snapshot of a group's derived state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupState {
    /// The last op the state includes.
    pub op: u64,
    /// The offset after that op's records.
    pub end_offset: u64,
    /// The owner's bytes.
    pub bytes: Vec<u8>,
}

impl GroupState {
    /// The file's bytes; [`Error::Invalid`] when the state is over its bound.
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        if self.bytes.len() > STATE_SIZE_BYTES_MAX {
            return Err(Error::Invalid(format!(
                "a group state of {} bytes is over the {STATE_SIZE_BYTES_MAX}-byte bound",
                self.bytes.len()
            )));
        }
        let mut out = Vec::with_capacity(HEADER_SIZE + self.bytes.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.op.to_le_bytes());
        out.extend_from_slice(&self.end_offset.to_le_bytes());
        out.extend_from_slice(&(self.bytes.len() as u32).to_le_bytes());
        let checksum = checksum(&out, &self.bytes);
        out.extend_from_slice(&checksum.to_le_bytes());
        out.extend_from_slice(&self.bytes);
        Ok(out)
    }

    /// Decodes a snapshot file's bytes; `Err` names what is wrong.
    fn decode(file: &[u8]) -> std::result::Result<GroupState, String> {
        let header = file.get(..HEADER_SIZE).ok_or("shorter than its header")?;
        if header[0..4] != MAGIC {
            return Err("bad magic".into());
        }
        let version = u16::from_le_bytes([header[4], header[5]]);
        if version != VERSION {
            return Err(format!("version {version}, this build reads {VERSION}"));
        }
        let u64_at = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8"));
        let u32_at = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4"));
        let size = u32_at(24) as usize;
        if size > STATE_SIZE_BYTES_MAX || file.len() != HEADER_SIZE + size {
            return Err(format!("size {size} does not match the file's {} bytes", file.len()));
        }
        let bytes = &file[HEADER_SIZE..];
        if checksum(&header[..28], bytes) != u32_at(28) {
            return Err("checksum mismatch".into());
        }
        Ok(GroupState { op: u64_at(8), end_offset: u64_at(16), bytes: bytes.to_vec() })
    }
}

fn checksum(header: &[u8], bytes: &[u8]) -> u32 {
    shoal_proto::checksum::crc32c_append(shoal_proto::checksum::crc32c(header), bytes)
}

/// Replaces the group's snapshot with `state`, durably (see the module doc).
pub async fn save<S: Storage>(storage: &S, group_dir: &Path, state: &GroupState) -> Result<()> {
    let encoded = Bytes::from(state.encode()?);
    let new_path = group_dir.join(STATE_FILE_NEW);
    write_synced(storage, &new_path, encoded).await?;
    storage
        .rename(&new_path, &group_dir.join(STATE_FILE))
        .await
        .map_err(|e| Error::io("installing a group state", e))?;
    storage.sync_dir(group_dir).await.map_err(|e| Error::io("syncing a group directory", e))
}

/// Writes an encoded state file at `path` from scratch and syncs its data (not its directory
/// entry: the caller renames it into place, or syncs the directory, as its protocol needs).
pub(crate) async fn write_synced<S: Storage>(
    storage: &S,
    path: &Path,
    encoded: Bytes,
) -> Result<()> {
    // A leftover of a write that failed midway may be longer than this copy.
    if storage.exists(path).await.map_err(|e| Error::io("probing a group state", e))? {
        storage
            .remove_file(path)
            .await
            .map_err(|e| Error::io("removing a stale group state", e))?;
    }
    // Buffered: the file is small and written whole, so direct I/O's alignment buys nothing.
    let file = storage
        .open(path, OpenMode::CreateReadWrite, false)
        .await
        .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
    file.write_at(encoded, 0).await.map_err(|e| Error::io("writing a group state", e))?;
    file.sync_data().await.map_err(|e| Error::io("syncing a group state", e))
}

/// The group's snapshot: `Ok(None)` when it has none; [`Error::Corruption`] when the file is
/// damaged (its checksum is checked before any field is believed), an I/O error when it cannot
/// be read.
pub async fn load<S: Storage>(storage: &S, group_dir: &Path) -> Result<Option<GroupState>> {
    load_file(storage, &group_dir.join(STATE_FILE)).await
}

/// The transferred state the group's live log began from, if a state transfer installed its
/// log (file [`TRANSFER_STATE_FILE`]): `Ok(None)` when it has none; errors as [`load`]. A newer
/// install replaces it; the group's own snapshot ([`load`]) is a separate file.
pub async fn load_transfer_state<S: Storage>(
    storage: &S,
    group_dir: &Path,
) -> Result<Option<GroupState>> {
    load_file(storage, &group_dir.join(TRANSFER_STATE_FILE)).await
}

/// Reads and checks one state file (see [`load`]).
pub(crate) async fn load_file<S: Storage>(storage: &S, path: &Path) -> Result<Option<GroupState>> {
    if !storage.exists(path).await.map_err(|e| Error::io("probing a group state", e))? {
        return Ok(None);
    }
    let file = storage
        .open(path, OpenMode::ReadWrite, false)
        .await
        .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    let size = file.size_bytes().await.map_err(|e| Error::io("sizing a group state", e))?;
    let damaged = |reason: String| {
        Error::Corruption(Corruption {
            file: path.to_path_buf(),
            position_bytes: 0,
            offset: None,
            op: None,
            reason,
        })
    };
    if size > (HEADER_SIZE + STATE_SIZE_BYTES_MAX) as u64 {
        return Err(damaged(format!("{size} bytes is over the bound")));
    }
    let (read, buf) = file.read_at(AlignedBuf::zeroed(size as usize, 1), 0).await;
    read.map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    GroupState::decode(buf.as_slice()).map(Some).map_err(damaged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::std_fs::StdStorage;

    fn run<T>(future: impl std::future::Future<Output = T>) -> T {
        // Every StdStorage future is ready on its first poll.
        let mut future = std::pin::pin!(future);
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        match future.as_mut().poll(&mut context) {
            std::task::Poll::Ready(value) => value,
            std::task::Poll::Pending => unreachable!("std storage never waits"),
        }
    }

    #[test]
    fn a_saved_state_loads_back_and_a_newer_one_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let storage = StdStorage;
        assert_eq!(run(load(&storage, dir.path())).unwrap(), None);
        let first = GroupState { op: 7, end_offset: 40, bytes: vec![1; 1000] };
        run(save(&storage, dir.path(), &first)).unwrap();
        assert_eq!(run(load(&storage, dir.path())).unwrap(), Some(first));
        let second = GroupState { op: 9, end_offset: 44, bytes: vec![2; 10] };
        run(save(&storage, dir.path(), &second)).unwrap();
        assert_eq!(run(load(&storage, dir.path())).unwrap(), Some(second));
    }

    #[test]
    fn a_damaged_or_oversized_state_is_reported_as_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let storage = StdStorage;
        let state = GroupState { op: 1, end_offset: 2, bytes: b"offsets".to_vec() };
        run(save(&storage, dir.path(), &state)).unwrap();
        let path = dir.path().join(STATE_FILE);
        let good = std::fs::read(&path).unwrap();
        for position in [0, 8, 24, 28, good.len() - 1] {
            let mut bad = good.clone();
            bad[position] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            let error = run(load(&storage, dir.path())).unwrap_err();
            assert!(matches!(error, Error::Corruption(_)), "flip at {position}: {error}");
        }
        std::fs::write(&path, &good[..good.len() - 1]).unwrap();
        assert!(matches!(run(load(&storage, dir.path())), Err(Error::Corruption(_))));
        let oversized =
            GroupState { op: 1, end_offset: 2, bytes: vec![0; STATE_SIZE_BYTES_MAX + 1] };
        assert!(matches!(run(save(&storage, dir.path(), &oversized)), Err(Error::Invalid(_))));
    }
}
