//! The io_uring backend: the only module of the engine that calls monoio.
//!
//! Reads, writes and syncs go through the shard's monoio io_uring ring. Directory listing and
//! `statx` are blocking metadata calls on the shard thread: rare (open, create, roll) and cheap.
//! Files opened for direct I/O that the filesystem refuses fall back to buffered I/O with a
//! logged warning, as DESIGN.md §3 asks. Behind the `write-recorder` feature every write, sync
//! and directory change is recorded so tests can rebuild post-crash images of real files.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::{AlignedBuf, BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile};

/// Storage on the local filesystem through the current monoio io_uring runtime.
#[derive(Clone, Debug, Default)]
pub struct UringStorage {
    /// Open direct files buffered even where O_DIRECT works (tests of the fallback path).
    force_buffered: bool,
    /// Where file-system syncs go: started by the first one.
    syncer: Arc<Mutex<Option<FilesystemSyncer>>>,
    #[cfg(feature = "write-recorder")]
    recorder: Option<recorder::Recorder>,
}

impl UringStorage {
    /// A backend that uses direct I/O where the filesystem allows it.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A backend that never uses direct I/O (the config switch that forces the fallback).
    #[must_use]
    pub fn buffered() -> Self {
        Self {
            force_buffered: true,
            syncer: Arc::default(),
            #[cfg(feature = "write-recorder")]
            recorder: None,
        }
    }

    /// Records every write, sync and directory change into `recorder`.
    #[cfg(feature = "write-recorder")]
    #[must_use]
    pub fn with_recorder(mut self, recorder: recorder::Recorder) -> Self {
        self.recorder = Some(recorder);
        self
    }
}

/// A request to the file-system sync thread: the directory whose file system to sync, and where
/// to answer.
type SyncRequest = (PathBuf, flume::Sender<io::Result<()>>);

/// File-system syncs waiting for the sync thread, at most: more wait in `send_async` (a shard
/// has at most its flush cycles in flight, each asking for one).
const SYNCS_QUEUED_MAX: usize = 64;

/// The thread that runs `syncfs(2)` for [`UringStorage`]: io_uring has no such operation, and a
/// blocking call on the shard thread would stall every partition of the shard for the sync's
/// duration. It ends when the last clone of its storage is dropped.
#[derive(Debug)]
struct FilesystemSyncer {
    requests: flume::Sender<SyncRequest>,
}

impl FilesystemSyncer {
    fn start() -> io::Result<Self> {
        let (requests, inbox) = flume::bounded::<SyncRequest>(SYNCS_QUEUED_MAX);
        std::thread::Builder::new().name("shoal-syncfs".into()).spawn(move || {
            while let Ok(first) = inbox.recv() {
                // Every request already queued was made after its writes completed, so one
                // sync (per file system asked for) started now answers them all.
                let mut waiting: BTreeMap<PathBuf, Vec<flume::Sender<io::Result<()>>>> =
                    BTreeMap::new();
                for (path, reply) in std::iter::once(first).chain(inbox.try_iter()) {
                    waiting.entry(path).or_default().push(reply);
                }
                for (path, replies) in waiting {
                    let result = super::sync_filesystem_blocking(&path);
                    for reply in replies {
                        let answer = result.as_ref().map_err(super::copy_io_error).copied();
                        // The asker may have gone (its shard closing): nobody needs the answer.
                        let _ = reply.send(answer);
                    }
                }
            }
        })?;
        Ok(Self { requests })
    }
}

/// A file opened through [`UringStorage`].
#[derive(Debug)]
pub struct UringFile {
    file: monoio::fs::File,
    alignment_bytes: usize,
    #[cfg(feature = "write-recorder")]
    recorded: Option<(recorder::Recorder, PathBuf)>,
}

impl Storage for UringStorage {
    type File = UringFile;

    async fn open(&self, path: &Path, mode: OpenMode, direct: bool) -> io::Result<UringFile> {
        let mut options = monoio::fs::OpenOptions::new();
        options.read(true);
        match mode {
            OpenMode::Read => {}
            OpenMode::ReadWrite => {
                options.write(true);
            }
            OpenMode::CreateReadWrite => {
                options.write(true).create(true);
            }
        }
        let want_direct = direct && !self.force_buffered;
        let (file, alignment_bytes) = if want_direct {
            let mut direct_options = options.clone();
            direct_options.custom_flags(libc::O_DIRECT);
            match direct_options.open(path).await {
                Ok(file) => {
                    let alignment = dio_alignment_bytes(&file).unwrap_or(BLOCK_SIZE_BYTES);
                    (file, alignment)
                }
                Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                    eprintln!(
                        "shoal-engine: O_DIRECT refused for {}, using buffered I/O",
                        path.display()
                    );
                    (options.open(path).await?, 1)
                }
                Err(error) => return Err(error),
            }
        } else {
            (options.open(path).await?, 1)
        };
        // The engine lays out every direct write on 4 KiB blocks; a device that needs more
        // would break that silently, and one that needs less is served by 4 KiB anyway.
        debug_assert!(
            alignment_bytes <= BLOCK_SIZE_BYTES,
            "direct I/O alignment {alignment_bytes} exceeds {BLOCK_SIZE_BYTES}"
        );
        let alignment_bytes = if alignment_bytes > 1 { BLOCK_SIZE_BYTES } else { 1 };
        #[cfg(feature = "write-recorder")]
        if let Some(recorder) = &self.recorder
            && mode == OpenMode::CreateReadWrite
        {
            recorder.record(recorder::Event::Create { path: path.to_path_buf() });
        }
        Ok(UringFile {
            file,
            alignment_bytes,
            #[cfg(feature = "write-recorder")]
            recorded: self.recorder.clone().map(|r| (r, path.to_path_buf())),
        })
    }

    async fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            if let Ok(name) = entry.file_name().into_string() {
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
        #[cfg(feature = "write-recorder")]
        if let Some(recorder) = &self.recorder {
            recorder.record(recorder::Event::Remove { path: path.to_path_buf() });
        }
        monoio::fs::remove_file(path).await
    }

    async fn remove_dir(&self, path: &Path) -> io::Result<()> {
        #[cfg(feature = "write-recorder")]
        if let Some(recorder) = &self.recorder {
            recorder.record(recorder::Event::RemoveDir { path: path.to_path_buf() });
        }
        // An empty directory's removal is a metadata operation as short as its creation,
        // which goes the same blocking way.
        std::fs::remove_dir(path)
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        #[cfg(feature = "write-recorder")]
        if let Some(recorder) = &self.recorder {
            recorder
                .record(recorder::Event::Rename { from: from.to_path_buf(), to: to.to_path_buf() });
        }
        // monoio 0.2.4's rename op does not build without its legacy driver; a rename is rare
        // metadata work (retention, index rewrite), so a blocking call on the shard is fine.
        std::fs::rename(from, to)
    }

    fn filesystem_sync_supported(&self, path: &Path) -> bool {
        super::filesystem_sync_supported(path)
    }

    async fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        let requests = {
            let mut syncer = self.syncer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if syncer.is_none() {
                *syncer = Some(FilesystemSyncer::start()?);
            }
            syncer.as_ref().expect("started above").requests.clone()
        };
        // Recorded as it starts: it covers the writes completed before, not those completing
        // while it runs (a failed one fails the recorded run).
        #[cfg(feature = "write-recorder")]
        if let Some(recorder) = &self.recorder {
            recorder.record(recorder::Event::SyncFilesystem);
        }
        let (reply, answer) = flume::bounded(1);
        let gone = || io::Error::other("the file-system sync thread is gone");
        requests.send_async((path.to_path_buf(), reply)).await.map_err(|_| gone())?;
        answer.recv_async().await.map_err(|_| gone())?
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let dir = monoio::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(path)
            .await?;
        dir.sync_all().await?;
        #[cfg(feature = "write-recorder")]
        if let Some(recorder) = &self.recorder {
            recorder.record(recorder::Event::SyncDir { path: path.to_path_buf() });
        }
        Ok(())
    }

    async fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }
}

impl StorageFile for UringFile {
    async fn size_bytes(&self) -> io::Result<u64> {
        // SAFETY: `fstat` writes into the zeroed struct we own; the fd is open for our lifetime.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let rc = unsafe { libc::fstat(self.file.as_raw_fd(), &mut stat) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(u64::try_from(stat.st_size).unwrap_or(0))
    }

    async fn write_at(&self, data: Bytes, offset_bytes: u64) -> io::Result<()> {
        debug_assert!(self.aligned(data.as_ptr() as usize, data.len(), offset_bytes));
        #[cfg(feature = "write-recorder")]
        let copy = self.recorded.as_ref().map(|_| data.clone());
        let (result, _data) = self.file.write_all_at(data, offset_bytes).await;
        #[cfg(feature = "write-recorder")]
        if let (Some((recorder, path)), Some(data), Ok(())) = (&self.recorded, copy, &result) {
            recorder.record(recorder::Event::Write { path: path.clone(), offset_bytes, data });
        }
        result
    }

    async fn read_at(
        &self,
        mut buf: AlignedBuf,
        offset_bytes: u64,
    ) -> (io::Result<()>, AlignedBuf) {
        buf.set_len(0);
        let mut filled = 0;
        // A short read before end of file is legal; keep reading until the buffer is full or
        // the file ends.
        loop {
            let tail = UnfilledTail { buf, start: filled };
            let (result, tail) = self.file.read_at(tail, offset_bytes + filled as u64).await;
            buf = tail.buf;
            match result {
                Ok(0) => break,
                Ok(read) => {
                    filled += read;
                    buf.set_len(filled);
                    if filled == buf.capacity()
                        || self.alignment_bytes > 1 && !read.is_multiple_of(self.alignment_bytes)
                    {
                        break;
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return (Err(error), buf),
            }
        }
        (Ok(()), buf)
    }

    async fn allocate(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        // monoio has no fallocate op; this is a rare, metadata-only call (once per reserved step
        // of a segment), so a blocking syscall on the shard thread is the cheap choice. Mode 0
        // (not `FALLOC_FL_KEEP_SIZE`) extends the file size over the reservation: ext4 takes an
        // O_DIRECT write past the size (an extending write) only under the inode's exclusive
        // lock, so io_uring punts it to an io-wq worker, where one file's writes run one at a
        // time; a write inside the size is issued inline (docs/benchmarks.md, "Writes inside the
        // file size").
        let (Ok(offset), Ok(len)) = (i64::try_from(offset_bytes), i64::try_from(len_bytes)) else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        // SAFETY: plain syscall on a file descriptor we own for the call's duration.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, offset, len) };
        if rc == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EOPNOTSUPP) => Ok(()),
            _ => Err(error),
        }
    }

    async fn zero_range(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<bool> {
        // Recorded runs rebuild files from their writes alone: let the caller write the zeros.
        #[cfg(feature = "write-recorder")]
        if self.recorded.is_some() {
            return Ok(false);
        }
        let (Ok(offset), Ok(len)) = (i64::try_from(offset_bytes), i64::try_from(len_bytes)) else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        // Rare (recovery only) and metadata-only, like `allocate`: a blocking call is fine.
        // SAFETY: plain syscall on a file descriptor we own for the call's duration.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            )
        };
        if rc == 0 {
            return Ok(true);
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EOPNOTSUPP) => Ok(false),
            _ => Err(error),
        }
    }

    async fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data().await?;
        #[cfg(feature = "write-recorder")]
        if let Some((recorder, path)) = &self.recorded {
            recorder.record(recorder::Event::Sync { path: path.clone() });
        }
        Ok(())
    }

    fn alignment_bytes(&self) -> usize {
        self.alignment_bytes
    }
}

impl UringFile {
    fn aligned(&self, address: usize, len: usize, offset: u64) -> bool {
        let alignment = self.alignment_bytes;
        address.is_multiple_of(alignment)
            && len.is_multiple_of(alignment)
            && offset.is_multiple_of(alignment as u64)
    }
}

/// The part of an [`AlignedBuf`] past `start`, as a buffer the kernel fills.
struct UnfilledTail {
    buf: AlignedBuf,
    start: usize,
}

// SAFETY: the pointer is into the `AlignedBuf`'s heap allocation, which never moves or
// reallocates while the tail owns it; `bytes_init` never exceeds the allocation.
unsafe impl monoio::buf::IoBuf for UnfilledTail {
    fn read_ptr(&self) -> *const u8 {
        // SAFETY: `start <= capacity`, so the result stays inside the allocation.
        unsafe { self.buf.as_ptr().add(self.start) }
    }

    fn bytes_init(&self) -> usize {
        self.buf.len().saturating_sub(self.start)
    }
}

// SAFETY: as for `IoBuf`; `bytes_total` is the allocation's size past `start`, all of it
// initialised memory, so the kernel may write anywhere in it.
unsafe impl monoio::buf::IoBufMut for UnfilledTail {
    fn write_ptr(&mut self) -> *mut u8 {
        // SAFETY: `start <= capacity`, so the result stays inside the allocation.
        unsafe { self.buf.as_mut_ptr().add(self.start) }
    }

    fn bytes_total(&mut self) -> usize {
        self.buf.capacity() - self.start
    }

    unsafe fn set_init(&mut self, pos: usize) {
        self.buf.set_len(self.start + pos);
    }
}

/// The direct-I/O alignment the filesystem reports for `file` through `statx`, if it does.
fn dio_alignment_bytes(file: &monoio::fs::File) -> Option<usize> {
    // SAFETY: `statx` only writes into the zeroed struct we own; the path is empty and
    // AT_EMPTY_PATH makes it describe the open fd.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the C string literal is NUL-terminated and outlives the call.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 || stx.stx_dio_offset_align == 0 {
        return None;
    }
    let alignment = stx.stx_dio_offset_align.max(stx.stx_dio_mem_align);
    usize::try_from(alignment).ok()
}

/// Builds a monoio io_uring runtime for tests and tools that need one outside a shard.
///
/// # Panics
/// If io_uring is unavailable: silently falling back to epoll would test the wrong thing.
#[must_use]
pub fn runtime() -> monoio::Runtime<monoio::time::TimeDriver<monoio::IoUringDriver>> {
    monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .enable_timer()
        .with_entries(256)
        .build()
        .expect("io_uring runtime (is io_uring enabled on this kernel?)")
}

#[cfg(feature = "write-recorder")]
pub mod recorder {
    //! The write recorder: a log of every write, sync and directory change the io_uring backend
    //! made, so tests can rebuild what a power loss might have left of real files.

    use std::cell::RefCell;
    use std::path::PathBuf;
    use std::rc::Rc;

    use bytes::Bytes;

    /// One recorded operation, in completion order.
    #[derive(Clone, Debug)]
    pub enum Event {
        /// A file was created (its directory entry is volatile until a directory sync).
        Create { path: PathBuf },
        /// A completed write.
        Write { path: PathBuf, offset_bytes: u64, data: Bytes },
        /// A completed data sync of one file.
        Sync { path: PathBuf },
        /// A rename (volatile until a directory sync).
        Rename { from: PathBuf, to: PathBuf },
        /// A removal (volatile until a directory sync).
        Remove { path: PathBuf },
        /// An empty directory's removal (volatile until its parent's sync).
        RemoveDir { path: PathBuf },
        /// A completed directory sync.
        SyncDir { path: PathBuf },
        /// A file-system sync, recorded as it started: every write completed before is durable.
        SyncFilesystem,
    }

    /// A shared, single-threaded event log.
    #[derive(Clone, Debug, Default)]
    pub struct Recorder {
        events: Rc<RefCell<Vec<Event>>>,
    }

    impl Recorder {
        /// Appends one event.
        pub fn record(&self, event: Event) {
            self.events.borrow_mut().push(event);
        }

        /// Every event so far, in order.
        #[must_use]
        pub fn events(&self) -> Vec<Event> {
            self.events.borrow().clone()
        }
    }
}
