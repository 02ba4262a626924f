//! The storage contract: the narrow interface every other engine module does its file I/O
//! through, and the aligned buffers that cross it.
//!
//! Three backends implement it: the io_uring backend (`uring`, the production path, behind the
//! default `uring` feature), the blocking `std` backend (for `shoal-inspect` and other offline
//! readers), and the deterministic simulated disk (`sim`, behind the test-only `sim` feature, so
//! the shipped server never contains it) that injects crashes, torn writes, bit flips, read errors
//! and disk-full. Engine code is generic over [`Storage`] (never `dyn`), so the
//! production path pays nothing for the other two.
//!
//! The contract is deliberately small: positional reads and writes, a data sync (of one file,
//! or of every file of the file system at once), and the few directory operations the engine
//! needs. Durability is explicit: a write is volatile until a
//! [`StorageFile::sync_data`] on its file or a [`Storage::sync_filesystem`] completes, and a create, rename or remove is volatile
//! until [`Storage::sync_dir`] on its directory completes. A backend must never report a sync
//! before the bytes it covers are durable.

mod buf;
mod filesystem;
#[cfg(feature = "sim")]
pub mod sim;
pub mod std_fs;
#[cfg(feature = "uring")]
pub mod uring;

use std::future::Future;
use std::io;
use std::path::Path;

pub use buf::{AlignedBuf, BufferShelf, zero_pieces};
use bytes::Bytes;
pub use filesystem::{copy_io_error, filesystem_sync_supported, sync_filesystem_blocking};

/// The block size the engine aligns direct I/O to when the backend cannot tell (and the size it
/// asserts in debug builds, see DESIGN.md §3).
pub const BLOCK_SIZE_BYTES: usize = 4096;

/// How to open a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Open an existing file for reading only.
    Read,
    /// Open an existing file for reading and writing.
    ReadWrite,
    /// Create the file if it is missing, then open it for reading and writing.
    CreateReadWrite,
}

/// A directory and file namespace, plus the operations on it that need a directory sync.
pub trait Storage: Clone + 'static {
    /// An open file of this backend.
    type File: StorageFile + 'static;

    /// Opens `path`. Files the engine appends to are opened for direct I/O where the backend
    /// supports it (`direct = true`); `false` asks for buffered I/O.
    fn open(
        &self,
        path: &Path,
        mode: OpenMode,
        direct: bool,
    ) -> impl Future<Output = io::Result<Self::File>>;

    /// The names (not paths) of the entries of a directory, sorted, so that callers iterate in
    /// the same order on every backend (the simulator depends on it).
    fn list_dir(&self, path: &Path) -> impl Future<Output = io::Result<Vec<String>>>;

    /// Creates a directory and its missing parents. Durable only after [`Storage::sync_dir`] of
    /// each parent.
    fn create_dir_all(&self, path: &Path) -> impl Future<Output = io::Result<()>>;

    /// Removes a file. Durable only after [`Storage::sync_dir`] of its directory.
    fn remove_file(&self, path: &Path) -> impl Future<Output = io::Result<()>>;

    /// Removes an empty directory. Durable only after [`Storage::sync_dir`] of its parent.
    fn remove_dir(&self, path: &Path) -> impl Future<Output = io::Result<()>>;

    /// Renames a file, replacing `to` if it exists. Durable only after [`Storage::sync_dir`].
    fn rename(&self, from: &Path, to: &Path) -> impl Future<Output = io::Result<()>>;

    /// Makes the directory's entries (creates, renames, removes) durable.
    fn sync_dir(&self, path: &Path) -> impl Future<Output = io::Result<()>>;

    /// Whether a file or directory exists.
    fn exists(&self, path: &Path) -> impl Future<Output = io::Result<bool>>;

    /// Whether [`Storage::sync_filesystem`] is known to make completed writes durable on the
    /// file system holding `path`. Where it is not, the engine never calls it.
    fn filesystem_sync_supported(&self, path: &Path) -> bool;

    /// Makes every completed write to every file of the file system holding `path` durable, as
    /// a [`StorageFile::sync_data`] of each would: one sync for many files (the direct
    /// `persisted` path's shared form, `crate::direct`). It also writes back whatever else is
    /// dirty on that file system. Directory entries still need [`Storage::sync_dir`].
    fn sync_filesystem(&self, path: &Path) -> impl Future<Output = io::Result<()>>;
}

/// An open file: positional I/O and a data sync.
pub trait StorageFile {
    /// The file's current size in bytes.
    fn size_bytes(&self) -> impl Future<Output = io::Result<u64>>;

    /// Writes all of `data` at `offset_bytes`. For a file opened with direct I/O, `data` must
    /// start at an address and an offset aligned to [`StorageFile::alignment_bytes`] and its
    /// length must be a multiple of it.
    fn write_at(&self, data: Bytes, offset_bytes: u64) -> impl Future<Output = io::Result<()>>;

    /// Reads up to `buf.capacity()` bytes at `offset_bytes` into `buf` (replacing its contents)
    /// and returns the buffer; its length is the number of bytes read, short only at end of file.
    fn read_at(
        &self,
        buf: AlignedBuf,
        offset_bytes: u64,
    ) -> impl Future<Output = (io::Result<()>, AlignedBuf)>;

    /// Reserves disk space for `[offset_bytes, offset_bytes + len_bytes)` without changing the
    /// file's contents, so that later writes there cannot fail for lack of space. Fails with
    /// ENOSPC (the clean, retryable "storage full") when the space is not there. Where the
    /// filesystem cannot reserve, it succeeds without reserving. The file's size grows to the
    /// range's end if it was shorter (the bytes past the old end read as zeros); a crash before
    /// the next [`StorageFile::sync_data`] may leave the old size. Callers find the end of data
    /// by reading, never from the size.
    fn allocate(&self, offset_bytes: u64, len_bytes: u64) -> impl Future<Output = io::Result<()>>;

    /// Makes `[offset_bytes, offset_bytes + len_bytes)` read as zeros without writing them,
    /// keeping its space reserved, where the filesystem can (a metadata change, durable with the
    /// next [`StorageFile::sync_data`] like a write). Returns `false`, having changed nothing,
    /// where it cannot: the caller then writes the zeros itself.
    fn zero_range(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> impl Future<Output = io::Result<bool>>;

    /// Makes every completed write to this file durable.
    fn sync_data(&self) -> impl Future<Output = io::Result<()>>;

    /// The alignment direct I/O needs for this file, in bytes (1 for buffered files).
    fn alignment_bytes(&self) -> usize;
}
