//! `shoal-inspect`'s storage: the engine's file contract over read-only memory maps (memmap2),
//! so checking a data directory reads sealed segments without a read call per window; listing
//! and probing directories are the blocking `std` backend's.
//!
//! It belongs here and nowhere near a shard: a page fault on a mapped file blocks the faulting
//! thread, which an offline tool may afford and a shard's event loop may not. It never writes,
//! creates, renames, removes or syncs anything: every such call is refused, so the checker stays
//! read-only by construction.

use std::fs::File;
use std::io;
use std::path::Path;

use bytes::Bytes;
use memmap2::Mmap;
use shoal_engine::storage::std_fs::StdStorage;
use shoal_engine::storage::{AlignedBuf, OpenMode, Storage, StorageFile};

/// Read-only storage on the local filesystem through memory maps.
#[derive(Clone, Copy, Debug, Default)]
pub struct MappedStorage;

/// A file mapped read-only as it was when opened (an empty file maps to nothing).
#[derive(Debug)]
pub struct MappedFile(Option<Mmap>);

fn refused(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, format!("{what}: the inspector only reads"))
}

impl Storage for MappedStorage {
    type File = MappedFile;

    async fn open(&self, path: &Path, mode: OpenMode, _direct: bool) -> io::Result<MappedFile> {
        // A reader that opens for writing out of habit (the engine's state loader does) gets the
        // same read-only map; its first write is refused.
        if mode == OpenMode::CreateReadWrite {
            return Err(refused("creating a file"));
        }
        let file = File::open(path)?;
        if file.metadata()?.len() == 0 {
            return Ok(MappedFile(None));
        }
        // SAFETY: the map is only ever read, by copying bytes out of it, and every byte read is
        // checked (checksums, lengths) before anything trusts it. The engine writes a segment
        // only while it is active, and the inspector runs on a directory no server holds (a
        // running server's files may change under any reader, mapped or not: the checks then
        // report what they saw, and nothing here depends on the bytes staying the same).
        let map = unsafe { Mmap::map(&file)? };
        Ok(MappedFile(Some(map)))
    }

    async fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        StdStorage.list_dir(path).await
    }

    async fn create_dir_all(&self, _path: &Path) -> io::Result<()> {
        Err(refused("creating a directory"))
    }

    async fn remove_file(&self, _path: &Path) -> io::Result<()> {
        Err(refused("removing a file"))
    }

    async fn remove_dir(&self, _path: &Path) -> io::Result<()> {
        Err(refused("removing a directory"))
    }

    async fn rename(&self, _from: &Path, _to: &Path) -> io::Result<()> {
        Err(refused("renaming a file"))
    }

    async fn sync_dir(&self, _path: &Path) -> io::Result<()> {
        Err(refused("syncing a directory"))
    }

    async fn exists(&self, path: &Path) -> io::Result<bool> {
        StdStorage.exists(path).await
    }

    fn filesystem_sync_supported(&self, _path: &Path) -> bool {
        false
    }

    async fn sync_filesystem(&self, _path: &Path) -> io::Result<()> {
        Err(refused("syncing the file system"))
    }
}

impl MappedFile {
    fn bytes(&self) -> &[u8] {
        self.0.as_deref().unwrap_or_default()
    }
}

impl StorageFile for MappedFile {
    async fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.bytes().len() as u64)
    }

    async fn write_at(&self, _data: Bytes, _offset_bytes: u64) -> io::Result<()> {
        Err(refused("writing"))
    }

    async fn read_at(
        &self,
        mut buf: AlignedBuf,
        offset_bytes: u64,
    ) -> (io::Result<()>, AlignedBuf) {
        let bytes = self.bytes();
        let start = usize::try_from(offset_bytes).unwrap_or(usize::MAX).min(bytes.len());
        let end = start + (bytes.len() - start).min(buf.capacity());
        buf.set_len(0);
        buf.extend_from_slice(&bytes[start..end]);
        (Ok(()), buf)
    }

    async fn allocate(&self, _offset_bytes: u64, _len_bytes: u64) -> io::Result<()> {
        Err(refused("reserving space"))
    }

    async fn zero_range(&self, _offset_bytes: u64, _len_bytes: u64) -> io::Result<bool> {
        Err(refused("zeroing a range"))
    }

    async fn sync_data(&self) -> io::Result<()> {
        Err(refused("syncing"))
    }

    fn alignment_bytes(&self) -> usize {
        1
    }
}

#[cfg(test)]
mod tests {
    use shoal_engine::storage::std_fs::block_on;

    use super::*;

    #[test]
    fn mapped_files_read_like_files_and_refuse_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        std::fs::write(dir.path().join("empty"), b"").unwrap();
        let storage = MappedStorage;
        let file = block_on(storage.open(&path, OpenMode::Read, false)).unwrap();
        assert_eq!(block_on(file.size_bytes()).unwrap(), 10);
        let (result, buf) = block_on(file.read_at(AlignedBuf::zeroed(4, 1), 8));
        result.unwrap();
        assert_eq!(buf.as_slice(), b"89", "short only at the end");
        let (result, buf) = block_on(file.read_at(buf, 2));
        result.unwrap();
        assert_eq!(buf.as_slice(), b"2345");
        let (result, buf) = block_on(file.read_at(buf, 99));
        result.unwrap();
        assert!(buf.is_empty(), "past the end reads nothing");
        let empty = block_on(storage.open(&dir.path().join("empty"), OpenMode::Read, false));
        assert_eq!(block_on(empty.unwrap().size_bytes()).unwrap(), 0);
        assert_eq!(block_on(storage.list_dir(dir.path())).unwrap(), ["empty", "f"]);
        let denied = io::ErrorKind::PermissionDenied;
        let create = dir.path().join("new");
        let open = block_on(storage.open(&create, OpenMode::CreateReadWrite, false));
        assert_eq!(open.unwrap_err().kind(), denied);
        assert!(!create.exists());
        assert_eq!(block_on(file.write_at(Bytes::new(), 0)).unwrap_err().kind(), denied);
        assert_eq!(block_on(file.sync_data()).unwrap_err().kind(), denied);
        assert_eq!(block_on(storage.remove_file(&path)).unwrap_err().kind(), denied);
        assert_eq!(std::fs::read(&path).unwrap(), b"0123456789");
    }
}
