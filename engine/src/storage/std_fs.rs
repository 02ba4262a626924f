//! The blocking `std` backend: positional I/O through `std::fs`, with every future ready on
//! its first poll.
//!
//! For offline readers (`shoal-inspect`, start-up tools) that must work without an io_uring
//! runtime. It never uses direct I/O, so alignment is 1; it must never sit on a shard's data
//! path, where a blocking call would stall every partition of the shard.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use bytes::Bytes;

use super::{AlignedBuf, OpenMode, Storage, StorageFile};

/// Storage on the local filesystem through blocking `std::fs` calls.
#[derive(Clone, Copy, Debug, Default)]
pub struct StdStorage;

/// A file opened through [`StdStorage`].
#[derive(Debug)]
pub struct StdFile(File);

impl Storage for StdStorage {
    type File = StdFile;

    async fn open(&self, path: &Path, mode: OpenMode, _direct: bool) -> io::Result<StdFile> {
        let mut options = OpenOptions::new();
        options.read(true);
        match mode {
            OpenMode::Read => {}
            OpenMode::ReadWrite => {
                options.write(true);
            }
            OpenMode::CreateReadWrite => {
                options.write(true).create(true).truncate(false);
            }
        }
        options.open(path).map(StdFile)
    }

    async fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path)? {
            if let Ok(name) = entry?.file_name().into_string() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    async fn remove_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    async fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }

    fn filesystem_sync_supported(&self, path: &Path) -> bool {
        super::filesystem_sync_supported(path)
    }

    async fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        super::sync_filesystem_blocking(path)
    }
}

impl StorageFile for StdFile {
    async fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    async fn write_at(&self, data: Bytes, offset_bytes: u64) -> io::Result<()> {
        self.0.write_all_at(&data, offset_bytes)
    }

    async fn read_at(
        &self,
        mut buf: AlignedBuf,
        offset_bytes: u64,
    ) -> (io::Result<()>, AlignedBuf) {
        buf.set_len(0);
        let mut filled = 0;
        while filled < buf.capacity() {
            match self.0.read_at(&mut buf.full_mut()[filled..], offset_bytes + filled as u64) {
                Ok(0) => break,
                Ok(read) => filled += read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return (Err(error), buf),
            }
        }
        buf.set_len(filled);
        (Ok(()), buf)
    }

    async fn allocate(&self, _offset_bytes: u64, _len_bytes: u64) -> io::Result<()> {
        // Offline tools never append; there is nothing to reserve for.
        Ok(())
    }

    async fn zero_range(&self, _offset_bytes: u64, _len_bytes: u64) -> io::Result<bool> {
        Ok(false)
    }

    async fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn alignment_bytes(&self) -> usize {
        1
    }
}

/// Runs a future whose every await completes at once (as all of this backend's do) to the end.
///
/// # Panics
/// If the future is pending on its first poll: it awaited something that is not this backend.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut context) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => panic!("std backend future awaited something asynchronous"),
    }
}
