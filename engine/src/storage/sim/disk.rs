//! The simulated disk: its namespace, every file's durable, pending and visible bytes, the
//! operations in flight, the fault counters, and the [`Storage`] handles engine code uses.
//!
//! Crash semantics ([`Sim::crash`], [`Sim::run_until_crash`]) are those of the module
//! documentation of `sim`. The disk applies an operation's effect only when the executor asks it
//! to complete that operation, and draws every random choice from its own [`Rng`]: it must
//! never read a clock or iterate anything in an order the seed does not fix.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;

use super::executor::{InFlight, Shared, Sim, Submit};
use crate::rng::Rng;
use crate::storage::{AlignedBuf, BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile};

pub(super) const EIO: i32 = 5;
const ENOENT: i32 = 2;
const EBADF: i32 = 9;
const EEXIST: i32 = 17;
const ENOTDIR: i32 = 20;
const EISDIR: i32 = 21;
const ENOTEMPTY: i32 = 39;
pub(super) const ENOSPC: i32 = 28;

/// Fault rates and limits of a simulated disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// A read fails with EIO with probability `1 / read_error_one_in`; 0 means never.
    pub read_error_one_in: u64,
    /// The total size of all files; a write that would grow it past this fails with ENOSPC.
    /// Files removed but not yet durably removed (or still open) still count.
    pub capacity_bytes: u64,
    /// At a crash, a surviving unsynced write is torn with probability `1 / torn_write_one_in`;
    /// 0 means never.
    pub torn_write_one_in: u64,
    /// The unit a crash tears writes at (a power of two).
    pub sector_size_bytes: u64,
    /// Executor steps (task polls plus I/O completions) one `block_on` or `run_until_crash` may
    /// take before it is declared a livelock.
    pub steps_max: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            read_error_one_in: 0,
            capacity_bytes: u64::MAX,
            torn_write_one_in: 4,
            sector_size_bytes: 512,
            steps_max: 10_000_000,
        }
    }
}

/// What the simulation has done and injected so far; tests print these and require minimums.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// In-flight operations completed (successfully or not).
    pub io_completions: u64,
    /// `sync_data` and `sync_dir` calls that completed successfully.
    pub syncs: u64,
    /// Crashes applied.
    pub crashes: u64,
    /// Unsynced writes that survived a crash whole.
    pub writes_kept_at_crash: u64,
    /// Unsynced writes that a crash lost entirely.
    pub writes_lost_at_crash: u64,
    /// Unsynced writes that a crash tore (some sectors kept, some lost).
    pub writes_torn_at_crash: u64,
    /// Unsynced creates, renames, removes and mkdirs that a crash lost.
    pub namespace_ops_lost_at_crash: u64,
    /// Bits flipped by [`Sim::corrupt`].
    pub bit_flips: u64,
    /// Reads failed with EIO by `read_error_one_in`.
    pub read_errors: u64,
    /// The largest buffer one read asked to fill: what a reader holds at once, at least.
    pub read_bytes_max: u64,
    /// Writes failed with ENOSPC.
    pub enospc_errors: u64,
    /// Writes and syncs failed by [`Sim::fail_next_write`] and [`Sim::fail_next_sync`].
    pub injected_errors: u64,
}

/// A handle on the simulated disk, implementing [`Storage`]. Cheap to clone; valid across
/// crashes (the files it opened are not).
#[derive(Clone)]
pub struct SimStorage {
    shared: Rc<Shared>,
}

/// A file opened through [`SimStorage`]. Every operation on it fails once the disk has crashed.
pub struct SimFile {
    shared: Rc<Shared>,
    inode: u64,
    /// Keeps an unlinked file's bytes alive while it is open, as a real inode is.
    _anchor: Rc<()>,
    epoch: u64,
    writable: bool,
    direct: bool,
}

impl Sim {
    /// A storage handle on this disk.
    #[must_use]
    pub fn storage(&self) -> SimStorage {
        SimStorage { shared: Rc::clone(&self.shared) }
    }

    /// Loses power: applies the crash semantics of the module documentation, drops every
    /// spawned task and invalidates every open file.
    pub fn crash(&self) {
        let (tasks, in_flight) = {
            let mut disk = self.shared.disk.borrow_mut();
            let in_flight = disk.crash();
            (std::mem::take(&mut *self.shared.tasks.borrow_mut()), in_flight)
        };
        // Dropped with no borrow held: a task's destructors may reach back into the simulation.
        drop(tasks);
        drop(in_flight);
        self.shared.queue.lock().expect("wake queue").clear();
    }

    /// Flips bit `bit` (0..8) of the byte at `offset_bytes` of `path`'s durable contents: damage
    /// at rest. Unsynced writes covering the byte still show over it until a crash drops them.
    ///
    /// # Panics
    /// If `path` is not a visible file, the byte is not durable, or `bit >= 8`.
    pub fn corrupt(&self, path: &Path, offset_bytes: u64, bit: u8) {
        assert!(bit < 8, "bit {bit} of a byte");
        let mut disk = self.shared.disk.borrow_mut();
        let inode = disk
            .visible_inode(path)
            .unwrap_or_else(|| panic!("corrupt: no file {}", path.display()));
        let file = disk.files.get_mut(&inode).expect("live inode");
        let offset = to_usize(offset_bytes);
        assert!(
            offset < file.durable.len(),
            "corrupt: offset {offset_bytes} past the {} durable bytes of {}",
            file.durable.len(),
            path.display()
        );
        file.durable[offset] ^= 1 << bit;
        file.rebuild_visible();
        disk.stats.bit_flips += 1;
    }

    /// Makes the next write to `path` (to the file it names now) to complete fail with EIO,
    /// without effect.
    ///
    /// # Panics
    /// If `path` is not a visible file.
    pub fn fail_next_write(&self, path: &Path) {
        self.fail_next_write_with(path, EIO);
    }

    /// Makes the next write to `path` to complete fail with the OS error `errno`, without
    /// effect: ENOSPC from a write the engine believed had space ready, for instance.
    ///
    /// # Panics
    /// If `path` is not a visible file.
    pub fn fail_next_write_with(&self, path: &Path, errno: i32) {
        self.with_file(path, |file| file.fail_next_write = Some(errno));
    }

    /// Makes the next `sync_data` of `path` to complete fail with EIO, making nothing durable.
    ///
    /// # Panics
    /// If `path` is not a visible file.
    pub fn fail_next_sync(&self, path: &Path) {
        self.fail_next_sync_with(path, EIO);
    }

    /// Makes the next `sync_data` of `path` to complete fail with the OS error `errno`, making
    /// nothing durable (ENOSPC from writeback, for instance).
    ///
    /// # Panics
    /// If `path` is not a visible file.
    pub fn fail_next_sync_with(&self, path: &Path, errno: i32) {
        self.with_file(path, |file| file.fail_next_sync = Some(errno));
    }

    /// Holds every file's `sync_data` in flight (not completed, not failed) until released: a
    /// device slow to flush its cache, for tests of what must not wait for a sync.
    pub fn set_syncs_held(&self, held: bool) {
        self.shared.disk.borrow_mut().syncs_held = held;
    }

    /// Makes a read fail with EIO with probability `1 / one_in` from now on (0: never); see
    /// [`SimConfig::read_error_one_in`].
    pub fn set_read_error_one_in(&self, one_in: u64) {
        self.shared.disk.borrow_mut().config.read_error_one_in = one_in;
    }

    /// Changes the disk's capacity (a full disk being cleaned up, or filling up).
    pub fn set_capacity_bytes(&self, capacity_bytes: u64) {
        self.shared.disk.borrow_mut().config.capacity_bytes = capacity_bytes;
    }

    /// Bytes held by all files now (what the capacity bounds).
    pub fn used_bytes(&self) -> u64 {
        self.shared.disk.borrow().used_bytes()
    }

    /// The counters so far.
    #[must_use]
    pub fn stats(&self) -> SimStats {
        self.shared.disk.borrow().stats
    }

    /// What a read of `path` would see now, or `None` if no such file is visible.
    #[must_use]
    pub fn file_contents(&self, path: &Path) -> Option<Vec<u8>> {
        let disk = self.shared.disk.borrow();
        let inode = disk.visible_inode(path)?;
        Some(disk.files[&inode].visible.clone())
    }

    /// What `path` is guaranteed to hold after any crash: its durable bytes under its durable
    /// name, or `None` if that name is not durable.
    #[must_use]
    pub fn durable_contents(&self, path: &Path) -> Option<Vec<u8>> {
        let disk = self.shared.disk.borrow();
        let Some(Node::File(inode)) = disk.durable_ns.get(path) else {
            return None;
        };
        Some(disk.files[inode].durable.clone())
    }

    /// Every visible entry, files and directories (not the root), sorted.
    #[must_use]
    pub fn paths(&self) -> Vec<PathBuf> {
        self.shared.disk.borrow().visible_ns.keys().cloned().collect()
    }

    fn with_file(&self, path: &Path, change: impl FnOnce(&mut FileState)) {
        let mut disk = self.shared.disk.borrow_mut();
        let inode =
            disk.visible_inode(path).unwrap_or_else(|| panic!("no file {}", path.display()));
        change(disk.files.get_mut(&inode).expect("live inode"));
    }
}

impl Storage for SimStorage {
    type File = SimFile;

    async fn open(&self, path: &Path, mode: OpenMode, direct: bool) -> io::Result<SimFile> {
        let op = Op::Open { path: path.to_path_buf(), mode };
        match Submit::new(&self.shared, op, None).await {
            Done::Opened { inode, anchor, epoch } => Ok(SimFile {
                shared: Rc::clone(&self.shared),
                inode,
                _anchor: anchor,
                epoch,
                writable: mode != OpenMode::Read,
                direct,
            }),
            done => done.into_unit().map(|()| unreachable!("open completed without a file")),
        }
    }

    async fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let disk = self.shared.disk.borrow();
        if !disk.is_visible_dir(path) {
            return Err(not_found_or_not_dir(disk.visible_ns.get(path)));
        }
        let mut names: Vec<String> = disk
            .visible_ns
            .keys()
            .filter(|entry| entry.parent() == Some(path))
            .filter_map(|entry| entry.file_name()?.to_str().map(str::to_owned))
            .collect();
        names.sort();
        Ok(names)
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        Submit::new(&self.shared, Op::CreateDirAll { path: path.to_path_buf() }, None)
            .await
            .into_unit()
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        Submit::new(&self.shared, Op::Remove { path: path.to_path_buf() }, None).await.into_unit()
    }

    async fn remove_dir(&self, path: &Path) -> io::Result<()> {
        Submit::new(&self.shared, Op::RemoveDir { path: path.to_path_buf() }, None)
            .await
            .into_unit()
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let op = Op::Rename { from: from.to_path_buf(), to: to.to_path_buf() };
        Submit::new(&self.shared, op, None).await.into_unit()
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let op = Op::SyncDir { path: path.to_path_buf(), ns_seq: 0 };
        Submit::new(&self.shared, op, None).await.into_unit()
    }

    async fn exists(&self, path: &Path) -> io::Result<bool> {
        let disk = self.shared.disk.borrow();
        Ok(is_root(path) || disk.visible_ns.contains_key(path))
    }

    fn filesystem_sync_supported(&self, _path: &Path) -> bool {
        true
    }

    async fn sync_filesystem(&self, _path: &Path) -> io::Result<()> {
        // One disk is one file system: every file's completed writes.
        let op = Op::SyncFilesystem { write_seq: 0 };
        Submit::new(&self.shared, op, None).await.into_unit()
    }
}

impl SimFile {
    /// Reserves space and grows the file's size over it, as `fallocate` mode 0 does (metadata
    /// only, completes at once, survives crashes: of the two outcomes a crash may leave, the
    /// grown size is the one that puts zeros where readers look for data).
    fn reserve(&self, end_bytes: u64) -> io::Result<()> {
        let mut disk = self.shared.disk.borrow_mut();
        if disk.epoch != self.epoch {
            return Err(stale_handle());
        }
        let Some(file) = disk.files.get(&self.inode) else { return Err(stale_handle()) };
        let current = (file.visible.len() as u64).max(file.reserved_bytes);
        let growth = end_bytes.saturating_sub(current);
        if disk.used_bytes().saturating_add(growth) > disk.config.capacity_bytes {
            disk.stats.enospc_errors += 1;
            return Err(io::Error::from_raw_os_error(ENOSPC));
        }
        let file = disk.files.get_mut(&self.inode).expect("checked");
        file.reserved_bytes = file.reserved_bytes.max(end_bytes);
        Ok(())
    }
}

impl StorageFile for SimFile {
    async fn allocate(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.reserve(offset_bytes.saturating_add(len_bytes))
    }

    async fn size_bytes(&self) -> io::Result<u64> {
        let disk = self.shared.disk.borrow();
        if disk.epoch != self.epoch {
            return Err(stale_handle());
        }
        Ok(disk.files.get(&self.inode).map_or(0, FileState::size_bytes))
    }

    async fn write_at(&self, data: Bytes, offset_bytes: u64) -> io::Result<()> {
        if self.direct {
            // The kernel would answer EINVAL; here it is a bug to catch at its source.
            let block = BLOCK_SIZE_BYTES as u64;
            assert!(
                offset_bytes.is_multiple_of(block) && data.len().is_multiple_of(BLOCK_SIZE_BYTES),
                "misaligned direct write: offset {offset_bytes}, length {} (alignment {block})",
                data.len()
            );
        }
        if !self.writable {
            return Err(io::Error::from_raw_os_error(EBADF));
        }
        let op = Op::Write { inode: self.inode, offset: offset_bytes, data };
        Submit::new(&self.shared, op, Some(self.epoch)).await.into_unit()
    }

    async fn read_at(&self, buf: AlignedBuf, offset_bytes: u64) -> (io::Result<()>, AlignedBuf) {
        if self.direct {
            assert!(
                offset_bytes.is_multiple_of(BLOCK_SIZE_BYTES as u64)
                    && buf.capacity().is_multiple_of(BLOCK_SIZE_BYTES)
                    && buf.alignment() >= BLOCK_SIZE_BYTES,
                "misaligned direct read: offset {offset_bytes}, {buf:?} (alignment {BLOCK_SIZE_BYTES})"
            );
        }
        let op = Op::Read { inode: self.inode, offset: offset_bytes, buf };
        match Submit::new(&self.shared, op, Some(self.epoch)).await {
            Done::Read(result, buf) => (result, buf),
            _ => unreachable!("a read completes with its buffer"),
        }
    }

    async fn zero_range(&self, _offset_bytes: u64, _len_bytes: u64) -> io::Result<bool> {
        // Zeros written by the caller follow the crash rules of writes, which is what a
        // filesystem's zero-range (a journaled metadata change) amounts to before its sync.
        Ok(false)
    }

    async fn sync_data(&self) -> io::Result<()> {
        let op = Op::SyncData { inode: self.inode, write_seq: 0 };
        Submit::new(&self.shared, op, Some(self.epoch)).await.into_unit()
    }

    fn alignment_bytes(&self) -> usize {
        if self.direct { BLOCK_SIZE_BYTES } else { 1 }
    }
}

impl std::fmt::Debug for SimFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimFile")
            .field("inode", &self.inode)
            .field("epoch", &self.epoch)
            .field("direct", &self.direct)
            .finish_non_exhaustive()
    }
}

/// An operation on its way to the disk. Sequence numbers of syncs are stamped at submission.
pub(super) enum Op {
    Open { path: PathBuf, mode: OpenMode },
    CreateDirAll { path: PathBuf },
    Remove { path: PathBuf },
    RemoveDir { path: PathBuf },
    Rename { from: PathBuf, to: PathBuf },
    SyncDir { path: PathBuf, ns_seq: u64 },
    Write { inode: u64, offset: u64, data: Bytes },
    Read { inode: u64, offset: u64, buf: AlignedBuf },
    SyncData { inode: u64, write_seq: u64 },
    SyncFilesystem { write_seq: u64 },
}

/// How an operation ended.
pub(super) enum Done {
    Unit,
    Opened { inode: u64, anchor: Rc<()>, epoch: u64 },
    Read(io::Result<()>, AlignedBuf),
    Failed(io::Error),
}

impl Done {
    fn into_unit(self) -> io::Result<()> {
        match self {
            Done::Unit | Done::Opened { .. } => Ok(()),
            Done::Read(result, _) => result,
            Done::Failed(error) => Err(error),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Dir,
    File(u64),
}

/// A namespace change that is visible but not yet durable.
#[derive(Clone, Debug)]
enum NsOp {
    Mkdir {
        path: PathBuf,
    },
    Create {
        path: PathBuf,
        inode: u64,
    },
    Remove {
        path: PathBuf,
        inode: u64,
    },
    /// An empty directory removed. A crash may keep it while losing the removals of the files
    /// it held; the directory goes with them then, as a journaling file system commits an
    /// `rmdir` only after the unlinks that emptied it.
    Rmdir {
        path: PathBuf,
    },
    Rename {
        from: PathBuf,
        to: PathBuf,
        inode: u64,
    },
}

impl NsOp {
    /// Whether a sync of `dir` makes this durable: it changes an entry of `dir`.
    fn touches(&self, dir: &Path) -> bool {
        let parent_is = |path: &Path| path.parent() == Some(dir);
        match self {
            NsOp::Mkdir { path }
            | NsOp::Rmdir { path }
            | NsOp::Create { path, .. }
            | NsOp::Remove { path, .. } => parent_is(path),
            NsOp::Rename { from, to, .. } => parent_is(from) || parent_is(to),
        }
    }

    fn inode(&self) -> Option<u64> {
        match self {
            NsOp::Mkdir { .. } | NsOp::Rmdir { .. } => None,
            NsOp::Create { inode, .. }
            | NsOp::Remove { inode, .. }
            | NsOp::Rename { inode, .. } => Some(*inode),
        }
    }

    /// Applies the change to a durable namespace. It may find that namespace without the
    /// changes before it (a crash keeps any subset), so it changes only what it names.
    fn apply(&self, ns: &mut BTreeMap<PathBuf, Node>) {
        match self {
            NsOp::Mkdir { path } => {
                ns.entry(path.clone()).or_insert(Node::Dir);
            }
            NsOp::Create { path, inode } => {
                ns.insert(path.clone(), Node::File(*inode));
            }
            NsOp::Remove { path, inode } => {
                if ns.get(path) == Some(&Node::File(*inode)) {
                    ns.remove(path);
                }
            }
            NsOp::Rmdir { path } => {
                if ns.get(path) == Some(&Node::Dir) {
                    ns.retain(|entry, _| !entry.starts_with(path));
                }
            }
            NsOp::Rename { from, to, inode } => {
                if ns.get(from) == Some(&Node::File(*inode)) {
                    ns.remove(from);
                }
                ns.insert(to.clone(), Node::File(*inode));
            }
        }
    }
}

struct PendingNsOp {
    seq: u64,
    op: NsOp,
}

struct PendingWrite {
    seq: u64,
    offset: u64,
    data: Bytes,
}

pub(super) struct FileState {
    /// The contents as of the last completed sync (or crash).
    durable: Vec<u8>,
    /// Completed, unsynced writes in completion order.
    pending: Vec<PendingWrite>,
    /// `durable` with `pending` applied in order: what reads see.
    visible: Vec<u8>,
    /// Space reserved by `allocate` (counted against the capacity like written bytes).
    reserved_bytes: u64,
    /// Cloned into every open handle; more than one strong count means the file is open.
    anchor: Rc<()>,
    /// The OS error the next completing write (sync) fails with, if any.
    fail_next_write: Option<i32>,
    fail_next_sync: Option<i32>,
}

impl FileState {
    fn new() -> Self {
        Self {
            durable: Vec::new(),
            pending: Vec::new(),
            visible: Vec::new(),
            reserved_bytes: 0,
            anchor: Rc::new(()),
            fail_next_write: None,
            fail_next_sync: None,
        }
    }

    /// The size readers see: the written bytes, or the reservation if it reaches further.
    fn size_bytes(&self) -> u64 {
        (self.visible.len() as u64).max(self.reserved_bytes)
    }

    fn rebuild_visible(&mut self) {
        self.visible.clone_from(&self.durable);
        for write in &self.pending {
            apply_write(&mut self.visible, write.offset, &write.data);
        }
    }
}

pub(super) struct Disk {
    pub(super) config: SimConfig,
    pub(super) rng: Rng,
    pub(super) stats: SimStats,
    /// Bumped by every crash; handles from an older epoch are dead.
    pub(super) epoch: u64,
    pub(super) files: BTreeMap<u64, FileState>,
    next_inode: u64,
    durable_ns: BTreeMap<PathBuf, Node>,
    /// `durable_ns` with `pending_ns` applied in order.
    visible_ns: BTreeMap<PathBuf, Node>,
    pending_ns: Vec<PendingNsOp>,
    /// Namespace changes completed so far.
    pub(super) ns_seq: u64,
    /// Writes completed so far.
    pub(super) write_seq: u64,
    pub(super) in_flight: BTreeMap<u64, InFlight>,
    pub(super) next_op: u64,
    /// Set by [`Sim::set_syncs_held`].
    pub(super) syncs_held: bool,
}

impl Disk {
    /// A fresh disk (only the root directory exists) whose every choice follows `seed`.
    pub(super) fn new(config: SimConfig, seed: u64) -> Self {
        Self {
            config,
            rng: Rng::new(seed),
            stats: SimStats::default(),
            epoch: 0,
            files: BTreeMap::new(),
            next_inode: 1,
            durable_ns: BTreeMap::new(),
            visible_ns: BTreeMap::new(),
            pending_ns: Vec::new(),
            ns_seq: 0,
            write_seq: 0,
            in_flight: BTreeMap::new(),
            next_op: 0,
            syncs_held: false,
        }
    }

    fn visible_inode(&self, path: &Path) -> Option<u64> {
        match self.visible_ns.get(path) {
            Some(Node::File(inode)) => Some(*inode),
            _ => None,
        }
    }

    fn is_visible_dir(&self, path: &Path) -> bool {
        is_root(path) || self.visible_ns.get(path) == Some(&Node::Dir)
    }

    fn used_bytes(&self) -> u64 {
        self.files.values().map(FileState::size_bytes).sum()
    }

    fn fits(&self, inode: u64, offset: u64, len: usize) -> bool {
        let file = &self.files[&inode];
        let size = file.size_bytes();
        let growth = (offset + len as u64).saturating_sub(size);
        self.used_bytes().saturating_add(growth) <= self.config.capacity_bytes
    }

    fn record_ns(&mut self, op: NsOp) {
        op.apply(&mut self.visible_ns);
        self.ns_seq += 1;
        self.pending_ns.push(PendingNsOp { seq: self.ns_seq, op });
    }

    pub(super) fn complete(&mut self, op: Op) -> Done {
        let result = match op {
            Op::Read { inode, offset, buf } => return self.complete_read(inode, offset, buf),
            Op::Open { path, mode } => return self.complete_open(&path, mode),
            Op::Write { inode, offset, data } => self.complete_write(inode, offset, data),
            Op::SyncData { inode, write_seq } => self.complete_sync_data(inode, write_seq),
            Op::SyncFilesystem { write_seq } => self.complete_sync_filesystem(write_seq),
            Op::SyncDir { path, ns_seq } => self.complete_sync_dir(&path, ns_seq),
            Op::CreateDirAll { path } => self.complete_create_dir_all(&path),
            Op::Remove { path } => self.complete_remove(&path),
            Op::RemoveDir { path } => self.complete_remove_dir(&path),
            Op::Rename { from, to } => self.complete_rename(&from, &to),
        };
        match result {
            Ok(()) => Done::Unit,
            Err(error) => Done::Failed(error),
        }
    }

    fn complete_open(&mut self, path: &Path, mode: OpenMode) -> Done {
        let inode = match self.visible_ns.get(path) {
            Some(Node::File(inode)) => *inode,
            Some(Node::Dir) => return Done::Failed(io::Error::from_raw_os_error(EISDIR)),
            None if mode != OpenMode::CreateReadWrite => {
                return Done::Failed(io::Error::from_raw_os_error(ENOENT));
            }
            None => {
                let parent = path.parent().unwrap_or(Path::new(""));
                if !self.is_visible_dir(parent) {
                    return Done::Failed(not_found_or_not_dir(self.visible_ns.get(parent)));
                }
                let inode = self.next_inode;
                self.next_inode += 1;
                self.files.insert(inode, FileState::new());
                self.record_ns(NsOp::Create { path: path.to_path_buf(), inode });
                inode
            }
        };
        Done::Opened { inode, anchor: Rc::clone(&self.files[&inode].anchor), epoch: self.epoch }
    }

    fn complete_read(&mut self, inode: u64, offset: u64, mut buf: AlignedBuf) -> Done {
        buf.set_len(0);
        self.stats.read_bytes_max = self.stats.read_bytes_max.max(buf.capacity() as u64);
        if self.config.read_error_one_in > 0 && self.rng.chance(1, self.config.read_error_one_in) {
            self.stats.read_errors += 1;
            return Done::Read(Err(io::Error::from_raw_os_error(EIO)), buf);
        }
        let Some(file) = self.files.get(&inode) else {
            return Done::Read(Err(io::Error::from_raw_os_error(EBADF)), buf);
        };
        let size = to_usize(file.size_bytes());
        let start = to_usize(offset).min(size);
        let end = start.saturating_add(buf.capacity()).min(size);
        let data_end = end.min(file.visible.len()).max(start);
        buf.extend_from_slice(&file.visible[start..data_end]);
        // Reserved space past the written bytes reads as zeros.
        buf.extend_from_slice(&vec![0; end - data_end]);
        Done::Read(Ok(()), buf)
    }

    fn complete_write(&mut self, inode: u64, offset: u64, data: Bytes) -> io::Result<()> {
        let Some(file) = self.files.get_mut(&inode) else {
            return Err(io::Error::from_raw_os_error(EBADF));
        };
        if let Some(errno) = file.fail_next_write.take() {
            self.stats.injected_errors += 1;
            return Err(io::Error::from_raw_os_error(errno));
        }
        if !self.fits(inode, offset, data.len()) {
            self.stats.enospc_errors += 1;
            return Err(io::Error::from_raw_os_error(ENOSPC));
        }
        self.push_pending_write(inode, offset, data);
        Ok(())
    }

    fn push_pending_write(&mut self, inode: u64, offset: u64, data: Bytes) {
        self.write_seq += 1;
        let file = self.files.get_mut(&inode).expect("live inode");
        apply_write(&mut file.visible, offset, &data);
        // Once a write completed, the kernel holds its own copy (the page cache, or the device
        // after direct I/O), and the caller may reuse its buffer: keeping the caller's `Bytes`
        // until the next sync pinned the engine's write chunks, which ran its pool dry in
        // simulations that a real disk would never have (seed 320,473,883,067, 8 groups).
        let data = Bytes::copy_from_slice(&data);
        file.pending.push(PendingWrite { seq: self.write_seq, offset, data });
    }

    fn complete_sync_data(&mut self, inode: u64, write_seq: u64) -> io::Result<()> {
        let Some(file) = self.files.get_mut(&inode) else {
            return Err(io::Error::from_raw_os_error(EBADF));
        };
        if let Some(errno) = file.fail_next_sync.take() {
            self.stats.injected_errors += 1;
            return Err(io::Error::from_raw_os_error(errno));
        }
        // Pending writes are in completion order, so the covered ones are a prefix and moving
        // them into `durable` leaves `visible` unchanged.
        let covered = file.pending.iter().take_while(|write| write.seq <= write_seq).count();
        for write in file.pending.drain(..covered) {
            apply_write(&mut file.durable, write.offset, &write.data);
        }
        self.stats.syncs += 1;
        Ok(())
    }

    /// A file-system sync fails, making nothing durable, when a file with writes it covers was
    /// set to fail its next sync ([`Sim::fail_next_sync`]): the write-back error is reported
    /// there as it would be by that file's own sync.
    fn complete_sync_filesystem(&mut self, write_seq: u64) -> io::Result<()> {
        let covers = |file: &FileState| file.pending.first().is_some_and(|w| w.seq <= write_seq);
        if let Some(file) =
            self.files.values_mut().find(|file| covers(file) && file.fail_next_sync.is_some())
        {
            let errno = file.fail_next_sync.take().expect("found with one");
            self.stats.injected_errors += 1;
            return Err(io::Error::from_raw_os_error(errno));
        }
        for file in self.files.values_mut() {
            let covered = file.pending.iter().take_while(|write| write.seq <= write_seq).count();
            for write in file.pending.drain(..covered) {
                apply_write(&mut file.durable, write.offset, &write.data);
            }
        }
        self.stats.syncs += 1;
        Ok(())
    }

    fn complete_sync_dir(&mut self, path: &Path, ns_seq: u64) -> io::Result<()> {
        if !self.is_visible_dir(path) {
            return Err(not_found_or_not_dir(self.visible_ns.get(path)));
        }
        let (covered, rest) = std::mem::take(&mut self.pending_ns)
            .into_iter()
            .partition::<Vec<_>, _>(|pending| pending.seq <= ns_seq && pending.op.touches(path));
        self.pending_ns = rest;
        for pending in covered {
            pending.op.apply(&mut self.durable_ns);
        }
        self.stats.syncs += 1;
        self.collect_garbage();
        Ok(())
    }

    fn complete_create_dir_all(&mut self, path: &Path) -> io::Result<()> {
        let missing: Vec<PathBuf> = path
            .ancestors()
            .take_while(|ancestor| !self.is_visible_dir(ancestor))
            .map(Path::to_path_buf)
            .collect();
        if let Some(blocker) = missing.iter().find(|dir| self.visible_ns.contains_key(*dir)) {
            let error = if blocker == path { EEXIST } else { ENOTDIR };
            return Err(io::Error::from_raw_os_error(error));
        }
        for dir in missing.into_iter().rev() {
            self.record_ns(NsOp::Mkdir { path: dir });
        }
        Ok(())
    }

    fn complete_remove(&mut self, path: &Path) -> io::Result<()> {
        match self.visible_ns.get(path) {
            Some(Node::File(inode)) => {
                let inode = *inode;
                self.record_ns(NsOp::Remove { path: path.to_path_buf(), inode });
                self.collect_garbage();
                Ok(())
            }
            Some(Node::Dir) => Err(io::Error::from_raw_os_error(EISDIR)),
            None => Err(io::Error::from_raw_os_error(ENOENT)),
        }
    }

    fn complete_remove_dir(&mut self, path: &Path) -> io::Result<()> {
        match self.visible_ns.get(path) {
            Some(Node::Dir) => {
                if self.visible_ns.keys().any(|entry| entry.parent() == Some(path)) {
                    return Err(io::Error::from_raw_os_error(ENOTEMPTY));
                }
                self.record_ns(NsOp::Rmdir { path: path.to_path_buf() });
                Ok(())
            }
            Some(Node::File(_)) => Err(io::Error::from_raw_os_error(ENOTDIR)),
            None => Err(io::Error::from_raw_os_error(ENOENT)),
        }
    }

    fn complete_rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        let inode = match self.visible_ns.get(from) {
            Some(Node::File(inode)) => *inode,
            Some(Node::Dir) => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "the simulated disk renames files only",
                ));
            }
            None => return Err(io::Error::from_raw_os_error(ENOENT)),
        };
        if self.visible_ns.get(to) == Some(&Node::Dir) {
            return Err(io::Error::from_raw_os_error(EISDIR));
        }
        let parent = to.parent().unwrap_or(Path::new(""));
        if !self.is_visible_dir(parent) {
            return Err(not_found_or_not_dir(self.visible_ns.get(parent)));
        }
        if from != to {
            self.record_ns(NsOp::Rename { from: from.to_path_buf(), to: to.to_path_buf(), inode });
            self.collect_garbage();
        }
        Ok(())
    }

    /// Frees files nothing can reach any more: no name (durable, visible or pending) and no
    /// open handle.
    fn collect_garbage(&mut self) {
        let mut live: BTreeSet<u64> = BTreeSet::new();
        for node in self.visible_ns.values().chain(self.durable_ns.values()) {
            if let Node::File(inode) = node {
                live.insert(*inode);
            }
        }
        live.extend(self.pending_ns.iter().filter_map(|pending| pending.op.inode()));
        self.files.retain(|inode, file| live.contains(inode) || Rc::strong_count(&file.anchor) > 1);
    }

    /// Applies a crash to the disk; returns the in-flight set it discarded, for the caller to
    /// drop once the borrow of the disk has ended.
    fn crash(&mut self) -> BTreeMap<u64, InFlight> {
        let in_flight = std::mem::take(&mut self.in_flight);
        let mut discarded = BTreeMap::new();
        for (id, entry) in in_flight {
            match entry.op {
                Op::Write { inode, offset, data }
                    if self.files.contains_key(&inode) && self.fits(inode, offset, data.len()) =>
                {
                    self.push_pending_write(inode, offset, data);
                }
                op => {
                    discarded.insert(id, InFlight { op, completion: entry.completion });
                }
            }
        }

        let Disk { config, rng, stats, files, .. } = self;
        for file in files.values_mut() {
            let mut contents = std::mem::take(&mut file.durable);
            for write in std::mem::take(&mut file.pending) {
                if !rng.chance(1, 2) {
                    stats.writes_lost_at_crash += 1;
                } else if config.torn_write_one_in > 0
                    && rng.chance(1, config.torn_write_one_in)
                    && tear_write(&mut contents, &write, config.sector_size_bytes, rng)
                {
                    stats.writes_torn_at_crash += 1;
                } else {
                    apply_write(&mut contents, write.offset, &write.data);
                    stats.writes_kept_at_crash += 1;
                }
            }
            file.visible.clone_from(&contents);
            file.durable = contents;
            // Old handles are dead: they must not keep files alive.
            file.anchor = Rc::new(());
            file.fail_next_write = None;
            file.fail_next_sync = None;
        }

        let mut ns = std::mem::take(&mut self.durable_ns);
        for pending in std::mem::take(&mut self.pending_ns) {
            if self.rng.chance(1, 2) {
                pending.op.apply(&mut ns);
            } else {
                self.stats.namespace_ops_lost_at_crash += 1;
            }
        }
        // Paths sort parents before children, so one pass sees each parent's fate first.
        let mut survivors = BTreeMap::new();
        for (path, node) in ns {
            let parent = path.parent().unwrap_or(Path::new(""));
            if is_root(parent) || survivors.get(parent) == Some(&Node::Dir) {
                survivors.insert(path, node);
            }
        }
        self.visible_ns.clone_from(&survivors);
        self.durable_ns = survivors;
        self.collect_garbage();
        self.epoch += 1;
        self.stats.crashes += 1;
        discarded
    }
}

/// Applies `write` onto `contents` sector by sector, keeping a random mix of at least one and
/// at most all but one of the sectors it touches. Returns false (and changes nothing) if it
/// touches a single sector, which cannot tear.
fn tear_write(
    contents: &mut Vec<u8>,
    write: &PendingWrite,
    sector_size_bytes: u64,
    rng: &mut Rng,
) -> bool {
    let end = write.offset + write.data.len() as u64;
    let mut pieces = Vec::new();
    let mut start = write.offset;
    while start < end {
        let piece_end = ((start / sector_size_bytes + 1) * sector_size_bytes).min(end);
        pieces.push((start, piece_end));
        start = piece_end;
    }
    if pieces.len() < 2 {
        return false;
    }
    let keep = loop {
        let keep: Vec<bool> = pieces.iter().map(|_| rng.chance(1, 2)).collect();
        if keep.contains(&true) && keep.contains(&false) {
            break keep;
        }
    };
    for ((start, end), kept) in pieces.into_iter().zip(keep) {
        if kept {
            let from = to_usize(start - write.offset);
            let to = to_usize(end - write.offset);
            apply_write(contents, start, &write.data[from..to]);
        }
    }
    true
}

/// Writes `data` at `offset`, extending `contents` with zeros up to it if needed.
fn apply_write(contents: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let start = to_usize(offset);
    let end = start + data.len();
    if contents.len() < end {
        contents.resize(end, 0);
    }
    contents[start..end].copy_from_slice(data);
}

fn is_root(path: &Path) -> bool {
    path.as_os_str().is_empty() || path.parent().is_none()
}

pub(super) fn to_usize(value: u64) -> usize {
    usize::try_from(value).expect("simulated offsets fit in memory")
}

fn not_found_or_not_dir(node: Option<&Node>) -> io::Error {
    match node {
        Some(Node::File(_)) => io::Error::from_raw_os_error(ENOTDIR),
        _ => io::Error::from_raw_os_error(ENOENT),
    }
}

pub(super) fn stale_handle() -> io::Error {
    io::Error::other("simulated file handle opened before a crash")
}
