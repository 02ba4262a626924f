//! The deterministic simulated disk and the single-threaded executor that drives it.
//!
//! It owns an in-memory namespace (directories and files), every file's durable and volatile
//! bytes, the set of I/O operations in flight, a seeded PRNG ([`SimRng`]) and the fault counters
//! ([`SimStats`]). Engine code that runs on io_uring runs here unchanged, through [`SimStorage`],
//! and one seed decides everything: which in-flight operation completes next, which reads fail,
//! and what a crash leaves behind. It must never read a clock, spawn a thread, iterate a hash map
//! or otherwise let anything but the seed and the calls made on it change an outcome; a failing
//! seed has to reproduce bit for bit.
//!
//! I/O model: `open`, `write_at`, `read_at`, `sync_data`, `sync_dir`, `rename`, `remove_file` and
//! `create_dir_all` register with the in-flight set on first poll and stay pending. Only when no
//! task is runnable does the executor complete *one* in-flight operation, chosen by the PRNG, and
//! apply its effect then: a write is visible to reads only from its completion on. `size_bytes`,
//! `exists` and `list_dir` are metadata lookups answered at once (they are not counted as I/O
//! completions). A sync makes durable what had *completed when the sync was submitted* (writes to
//! its file for `sync_data`; creates, renames, removes and mkdirs in its directory for
//! `sync_dir`), never anything that completed while it was in flight.
//!
//! Crash semantics ([`Sim::crash`], [`Sim::run_until_crash`]): every task and every open handle is
//! dropped or invalidated. Writes still in flight are treated as completed-but-unsynced writes
//! (the device may have taken them before the power went), provided they fit the capacity. Then,
//! file by file in path-independent inode order, each unsynced write independently survives with
//! probability 1/2, applied in completion order onto the durable bytes; a surviving write that
//! spans at least two sectors is torn with probability `1 / torn_write_one_in`, in which case
//! each sector it touches (sectors are absolute, `sector_size_bytes` each) is independently kept
//! or lost, at least one of each. Each unsynced namespace operation independently survives with
//! probability 1/2, applied in order onto the durable namespace; entries whose parent directory
//! did not survive are dropped. What results is the new durable state and nothing is pending.
//! Other namespace operations in flight are lost.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::{Pin, pin};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use bytes::Bytes;

use super::{AlignedBuf, BLOCK_SIZE_BYTES, OpenMode, Storage, StorageFile};

const EIO: i32 = 5;
const ENOENT: i32 = 2;
const EBADF: i32 = 9;
const EEXIST: i32 = 17;
const ENOTDIR: i32 = 20;
const EISDIR: i32 = 21;
const ENOSPC: i32 = 28;

/// A small seeded PRNG (SplitMix64): fast, with a 64-bit state that is trivially reproducible.
/// Not for cryptography; for simulation choices only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    /// A generator whose whole future output is decided by `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 uniformly distributed bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`. Multiply-shift, so biased by at most `n / 2^64`: irrelevant here.
    ///
    /// # Panics
    /// If `n` is zero.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "SimRng::below(0)");
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `numerator / denominator`.
    ///
    /// # Panics
    /// If `denominator` is zero.
    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.below(denominator) < numerator
    }
}

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
    /// Writes failed with ENOSPC.
    pub enospc_errors: u64,
    /// Writes and syncs failed by [`Sim::fail_next_write`] and [`Sim::fail_next_sync`].
    pub injected_errors: u64,
}

/// The simulation: a disk, its executor and its PRNG, all decided by one seed.
pub struct Sim {
    shared: Rc<Shared>,
    seed: u64,
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

/// Spawns tasks onto a [`Sim`] from inside other tasks.
#[derive(Clone)]
pub struct Spawner {
    shared: Rc<Shared>,
}

/// The output of a spawned task, as a future.
pub struct JoinHandle<T> {
    state: Rc<RefCell<JoinState<T>>>,
}

impl Sim {
    /// A fresh, empty disk (only the root directory exists) whose every choice follows `seed`.
    ///
    /// # Panics
    /// If `config.sector_size_bytes` is not a power of two.
    #[must_use]
    pub fn new(seed: u64, config: SimConfig) -> Self {
        assert!(
            config.sector_size_bytes.is_power_of_two(),
            "sector size {} is not a power of two",
            config.sector_size_bytes
        );
        let disk = Disk {
            config,
            rng: SimRng::new(seed),
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
        };
        let shared = Shared {
            disk: RefCell::new(disk),
            queue: Arc::new(Mutex::new(WakeQueue::default())),
            tasks: RefCell::new(BTreeMap::new()),
            next_task: Cell::new(0),
        };
        Self { shared: Rc::new(shared), seed }
    }

    /// The seed this simulation was created from, for failure messages.
    #[must_use]
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// A storage handle on this disk.
    #[must_use]
    pub fn storage(&self) -> SimStorage {
        SimStorage { shared: Rc::clone(&self.shared) }
    }

    /// A spawner for tasks that want to spawn further tasks.
    #[must_use]
    pub fn spawner(&self) -> Spawner {
        Spawner { shared: Rc::clone(&self.shared) }
    }

    /// Spawns a task. It runs whenever this simulation is driven (`block_on`,
    /// `run_until_crash`), until it finishes or a crash drops it.
    pub fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        self.shared.spawn(future)
    }

    /// Runs `future` (and every spawned task) until `future` finishes.
    ///
    /// # Panics
    /// If the simulation stalls (nothing runnable and no I/O in flight) or exceeds
    /// `steps_max`; both messages name the seed.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.drive(future, None).expect("no crash was asked for")
    }

    /// Runs `future` like [`Sim::block_on`], but crashes the disk right after the
    /// `crash_after_io`-th I/O completion of this call (before any task sees it), dropping
    /// `future` and every spawned task. Returns `None` if it crashed, the output otherwise.
    ///
    /// # Panics
    /// As [`Sim::block_on`].
    pub fn run_until_crash<F: Future>(&self, future: F, crash_after_io: u64) -> Option<F::Output> {
        self.drive(future, Some(crash_after_io))
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

    fn drive<F: Future>(&self, future: F, crash_after_io: Option<u64>) -> Option<F::Output> {
        let mut future = pin!(future);
        let main_id = self.shared.next_task_id();
        let waker = self.shared.waker(main_id);
        self.shared.queue.lock().expect("wake queue").push(main_id);
        let first_completion = self.stats().io_completions;
        let steps_max = self.shared.disk.borrow().config.steps_max;
        let mut steps = 0_u64;
        loop {
            if let Some(limit) = crash_after_io
                && self.stats().io_completions - first_completion >= limit
            {
                self.crash();
                return None;
            }
            while let Some(id) = self.shared.pop_runnable() {
                steps += 1;
                assert!(
                    steps <= steps_max,
                    "sim seed {}: more than {steps_max} steps (livelock?)",
                    self.seed
                );
                if id == main_id {
                    if let Poll::Ready(output) =
                        future.as_mut().poll(&mut Context::from_waker(&waker))
                    {
                        return Some(output);
                    }
                } else {
                    self.shared.poll_task(id);
                }
            }
            assert!(
                self.shared.complete_one(),
                "sim seed {}: stalled: no task is runnable and no I/O is in flight",
                self.seed
            );
            steps += 1;
        }
    }
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim").field("seed", &self.seed).field("stats", &self.stats()).finish()
    }
}

impl Spawner {
    /// As [`Sim::spawn`].
    pub fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        self.shared.spawn(future)
    }
}

impl<T> JoinHandle<T> {
    /// Whether the task has finished (and its output not yet taken).
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.state.borrow().output.is_some()
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut state = self.state.borrow_mut();
        match state.output.take() {
            Some(output) => Poll::Ready(output),
            None => {
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
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
}

impl SimFile {
    /// Reserves space (metadata only, completes at once, survives crashes: losing a reservation
    /// would only matter for the capacity check, never for data).
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
        Ok(disk.files.get(&self.inode).map_or(0, |file| file.visible.len() as u64))
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

/// A spawned task, its output already routed to its [`JoinHandle`].
type Task = Pin<Box<dyn Future<Output = ()>>>;

/// State shared by the simulation, its storage handles, its files and its in-flight futures.
struct Shared {
    disk: RefCell<Disk>,
    /// Behind `Arc<Mutex>` only because `Waker` demands `Send + Sync`; one thread ever touches it.
    queue: Arc<Mutex<WakeQueue>>,
    tasks: RefCell<BTreeMap<u64, Task>>,
    next_task: Cell<u64>,
}

impl Shared {
    fn next_task_id(&self) -> u64 {
        let id = self.next_task.get();
        self.next_task.set(id + 1);
        id
    }

    fn waker(&self, id: u64) -> Waker {
        Waker::from(Arc::new(TaskWaker { id, queue: Arc::clone(&self.queue) }))
    }

    fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        let state = Rc::new(RefCell::new(JoinState { output: None, waker: None }));
        let task_state = Rc::clone(&state);
        let task = async move {
            let output = future.await;
            let waker = {
                let mut state = task_state.borrow_mut();
                state.output = Some(output);
                state.waker.take()
            };
            if let Some(waker) = waker {
                waker.wake();
            }
        };
        let id = self.next_task_id();
        self.tasks.borrow_mut().insert(id, Box::pin(task));
        self.queue.lock().expect("wake queue").push(id);
        JoinHandle { state }
    }

    fn pop_runnable(&self) -> Option<u64> {
        self.queue.lock().expect("wake queue").pop()
    }

    fn poll_task(&self, id: u64) {
        // Taken out of the map while it runs, so that it may spawn; ids of finished or
        // crashed tasks may still be woken and are ignored.
        let Some(mut task) = self.tasks.borrow_mut().remove(&id) else {
            return;
        };
        let waker = self.waker(id);
        if task.as_mut().poll(&mut Context::from_waker(&waker)).is_pending() {
            self.tasks.borrow_mut().insert(id, task);
        }
    }

    /// Completes one in-flight operation chosen by the PRNG; false if none is in flight.
    fn complete_one(&self) -> bool {
        let (slot, done) = {
            let mut disk = self.disk.borrow_mut();
            let syncs_held = disk.syncs_held;
            let eligible =
                |entry: &InFlight| !(syncs_held && matches!(entry.op, Op::SyncData { .. }));
            let count = disk.in_flight.values().filter(|entry| eligible(entry)).count() as u64;
            if count == 0 {
                return false;
            }
            let index = disk.rng.below(count);
            let id = *disk
                .in_flight
                .iter()
                .filter(|(_, entry)| eligible(entry))
                .nth(to_usize(index))
                .expect("index below count")
                .0;
            let entry = disk.in_flight.remove(&id).expect("chosen op");
            disk.stats.io_completions += 1;
            let done = disk.complete(entry.op);
            (entry.slot, done)
        };
        let waker = {
            let mut slot = slot.borrow_mut();
            slot.done = Some(done);
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }
}

#[derive(Default)]
struct WakeQueue {
    order: VecDeque<u64>,
    queued: BTreeSet<u64>,
}

impl WakeQueue {
    fn push(&mut self, id: u64) {
        if self.queued.insert(id) {
            self.order.push_back(id);
        }
    }

    fn pop(&mut self) -> Option<u64> {
        let id = self.order.pop_front()?;
        self.queued.remove(&id);
        Some(id)
    }

    fn clear(&mut self) {
        self.order.clear();
        self.queued.clear();
    }
}

struct TaskWaker {
    id: u64,
    queue: Arc<Mutex<WakeQueue>>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.queue.lock().expect("wake queue").push(self.id);
    }
}

struct JoinState<T> {
    output: Option<T>,
    waker: Option<Waker>,
}

/// An operation on its way to the disk. Sequence numbers of syncs are stamped at submission.
enum Op {
    Open { path: PathBuf, mode: OpenMode },
    CreateDirAll { path: PathBuf },
    Remove { path: PathBuf },
    Rename { from: PathBuf, to: PathBuf },
    SyncDir { path: PathBuf, ns_seq: u64 },
    Write { inode: u64, offset: u64, data: Bytes },
    Read { inode: u64, offset: u64, buf: AlignedBuf },
    SyncData { inode: u64, write_seq: u64 },
}

/// How an operation ended.
enum Done {
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

#[derive(Default)]
struct Slot {
    done: Option<Done>,
    waker: Option<Waker>,
}

struct InFlight {
    op: Op,
    slot: Rc<RefCell<Slot>>,
}

/// The future of one operation: registers it on first poll, then waits for its completion.
/// Dropping it does not cancel the operation, as dropping an io_uring future does not.
struct Submit {
    shared: Rc<Shared>,
    op: Option<Op>,
    epoch: Option<u64>,
    slot: Rc<RefCell<Slot>>,
}

impl Submit {
    fn new(shared: &Rc<Shared>, op: Op, epoch: Option<u64>) -> Self {
        Self { shared: Rc::clone(shared), op: Some(op), epoch, slot: Rc::default() }
    }
}

impl Future for Submit {
    type Output = Done;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Done> {
        if let Some(mut op) = self.op.take() {
            let mut disk = self.shared.disk.borrow_mut();
            if self.epoch.is_some_and(|epoch| epoch != disk.epoch) {
                return Poll::Ready(match op {
                    Op::Read { buf, .. } => Done::Read(Err(stale_handle()), buf),
                    _ => Done::Failed(stale_handle()),
                });
            }
            match &mut op {
                Op::SyncData { write_seq, .. } => *write_seq = disk.write_seq,
                Op::SyncDir { ns_seq, .. } => *ns_seq = disk.ns_seq,
                _ => {}
            }
            let id = disk.next_op;
            disk.next_op += 1;
            disk.in_flight.insert(id, InFlight { op, slot: Rc::clone(&self.slot) });
        }
        let mut slot = self.slot.borrow_mut();
        match slot.done.take() {
            Some(done) => Poll::Ready(done),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
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
    Mkdir { path: PathBuf },
    Create { path: PathBuf, inode: u64 },
    Remove { path: PathBuf, inode: u64 },
    Rename { from: PathBuf, to: PathBuf, inode: u64 },
}

impl NsOp {
    /// Whether a sync of `dir` makes this durable: it changes an entry of `dir`.
    fn touches(&self, dir: &Path) -> bool {
        let parent_is = |path: &Path| path.parent() == Some(dir);
        match self {
            NsOp::Mkdir { path } | NsOp::Create { path, .. } | NsOp::Remove { path, .. } => {
                parent_is(path)
            }
            NsOp::Rename { from, to, .. } => parent_is(from) || parent_is(to),
        }
    }

    fn inode(&self) -> Option<u64> {
        match self {
            NsOp::Mkdir { .. } => None,
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

struct FileState {
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

    fn rebuild_visible(&mut self) {
        self.visible.clone_from(&self.durable);
        for write in &self.pending {
            apply_write(&mut self.visible, write.offset, &write.data);
        }
    }
}

struct Disk {
    config: SimConfig,
    rng: SimRng,
    stats: SimStats,
    /// Bumped by every crash; handles from an older epoch are dead.
    epoch: u64,
    files: BTreeMap<u64, FileState>,
    next_inode: u64,
    durable_ns: BTreeMap<PathBuf, Node>,
    /// `durable_ns` with `pending_ns` applied in order.
    visible_ns: BTreeMap<PathBuf, Node>,
    pending_ns: Vec<PendingNsOp>,
    /// Namespace changes completed so far.
    ns_seq: u64,
    /// Writes completed so far.
    write_seq: u64,
    in_flight: BTreeMap<u64, InFlight>,
    next_op: u64,
    /// Set by [`Sim::set_syncs_held`].
    syncs_held: bool,
}

impl Disk {
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
        self.files.values().map(|file| (file.visible.len() as u64).max(file.reserved_bytes)).sum()
    }

    fn fits(&self, inode: u64, offset: u64, len: usize) -> bool {
        let file = &self.files[&inode];
        let size = (file.visible.len() as u64).max(file.reserved_bytes);
        let growth = (offset + len as u64).saturating_sub(size);
        self.used_bytes().saturating_add(growth) <= self.config.capacity_bytes
    }

    fn record_ns(&mut self, op: NsOp) {
        op.apply(&mut self.visible_ns);
        self.ns_seq += 1;
        self.pending_ns.push(PendingNsOp { seq: self.ns_seq, op });
    }

    fn complete(&mut self, op: Op) -> Done {
        let result = match op {
            Op::Read { inode, offset, buf } => return self.complete_read(inode, offset, buf),
            Op::Open { path, mode } => return self.complete_open(&path, mode),
            Op::Write { inode, offset, data } => self.complete_write(inode, offset, data),
            Op::SyncData { inode, write_seq } => self.complete_sync_data(inode, write_seq),
            Op::SyncDir { path, ns_seq } => self.complete_sync_dir(&path, ns_seq),
            Op::CreateDirAll { path } => self.complete_create_dir_all(&path),
            Op::Remove { path } => self.complete_remove(&path),
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
        if self.config.read_error_one_in > 0 && self.rng.chance(1, self.config.read_error_one_in) {
            self.stats.read_errors += 1;
            return Done::Read(Err(io::Error::from_raw_os_error(EIO)), buf);
        }
        let Some(file) = self.files.get(&inode) else {
            return Done::Read(Err(io::Error::from_raw_os_error(EBADF)), buf);
        };
        let start = to_usize(offset).min(file.visible.len());
        let end = start.saturating_add(buf.capacity()).min(file.visible.len());
        buf.extend_from_slice(&file.visible[start..end]);
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
                    discarded.insert(id, InFlight { op, slot: entry.slot });
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
    rng: &mut SimRng,
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

fn to_usize(value: u64) -> usize {
    usize::try_from(value).expect("simulated offsets fit in memory")
}

fn not_found_or_not_dir(node: Option<&Node>) -> io::Error {
    match node {
        Some(Node::File(_)) => io::Error::from_raw_os_error(ENOTDIR),
        _ => io::Error::from_raw_os_error(ENOENT),
    }
}

fn stale_handle() -> io::Error {
    io::Error::other("simulated file handle opened before a crash")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEEDS: u64 = 200;

    fn sim(seed: u64) -> Sim {
        Sim::new(seed, SimConfig::default())
    }

    fn block(byte: u8, len: usize) -> Bytes {
        Bytes::from(vec![byte; len])
    }

    /// Creates `/d/name` with `contents`, durably (data and directory entry).
    async fn create_durable(storage: &SimStorage, name: &str, contents: Bytes) -> SimFile {
        storage.create_dir_all(Path::new("/d")).await.expect("mkdir");
        storage.sync_dir(Path::new("/")).await.expect("sync /");
        let file = storage
            .open(&Path::new("/d").join(name), OpenMode::CreateReadWrite, false)
            .await
            .expect("create");
        file.write_at(contents, 0).await.expect("write");
        file.sync_data().await.expect("sync");
        storage.sync_dir(Path::new("/d")).await.expect("sync /d");
        file
    }

    #[test]
    fn rng_is_seeded_and_bounded() {
        let mut a = SimRng::new(7);
        let mut b = SimRng::new(7);
        let mut c = SimRng::new(8);
        let first: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        assert_eq!(first, (0..8).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(first, (0..8).map(|_| c.next_u64()).collect::<Vec<_>>());
        let mut seen = [0_u32; 5];
        for _ in 0..5000 {
            seen[to_usize(a.below(5))] += 1;
        }
        assert!(seen.iter().all(|&count| (800..1200).contains(&count)), "{seen:?}");
        assert!(!a.chance(0, 3));
        assert!(a.chance(3, 3));
    }

    #[test]
    fn a_synced_write_survives_every_crash() {
        for seed in 0..SEEDS {
            let sim = sim(seed);
            let storage = sim.storage();
            let synced = vec![0x5A; 4096];
            let file = sim.block_on(create_durable(&storage, "f", Bytes::from(synced.clone())));
            // Unsynced writes past and over the synced region must not damage it wherever they
            // land, apart from what they overwrite.
            sim.block_on(file.write_at(block(0xEE, 2048), 4096)).expect("write");
            sim.crash();
            let after = sim.file_contents(Path::new("/d/f")).expect("file survives");
            assert_eq!(&after[..4096], &synced[..], "seed {seed}");
            assert_eq!(sim.durable_contents(Path::new("/d/f")), Some(after));
        }
    }

    #[test]
    fn an_unsynced_write_is_kept_lost_or_torn_across_seeds() {
        let (mut kept, mut lost, mut torn) = (0, 0, 0);
        let mut stats = SimStats::default();
        for seed in 0..SEEDS {
            let sim = Sim::new(seed, SimConfig { torn_write_one_in: 3, ..SimConfig::default() });
            let storage = sim.storage();
            let file = sim.block_on(create_durable(&storage, "f", block(0, 8192)));
            sim.block_on(file.write_at(block(0xAB, 8192), 0)).expect("write");
            assert_eq!(sim.file_contents(Path::new("/d/f")), Some(vec![0xAB; 8192]));
            sim.crash();
            let after = sim.file_contents(Path::new("/d/f")).expect("file survives");
            assert_eq!(after.len(), 8192);
            let sectors: Vec<u8> = after
                .chunks(512)
                .map(|sector| {
                    assert!(
                        sector.iter().all(|&b| b == sector[0]),
                        "seed {seed}: a sector tore inside"
                    );
                    sector[0]
                })
                .collect();
            match (sectors.contains(&0xAB), sectors.contains(&0)) {
                (true, false) => kept += 1,
                (false, true) => lost += 1,
                _ => torn += 1,
            }
            let run = sim.stats();
            stats.writes_kept_at_crash += run.writes_kept_at_crash;
            stats.writes_lost_at_crash += run.writes_lost_at_crash;
            stats.writes_torn_at_crash += run.writes_torn_at_crash;
        }
        println!("kept {kept}, lost {lost}, torn {torn}; {stats:?}");
        assert!(kept > 0 && lost > 0 && torn > 0);
        assert_eq!(stats.writes_kept_at_crash, kept);
        assert_eq!(stats.writes_lost_at_crash, lost);
        assert_eq!(stats.writes_torn_at_crash, torn);
    }

    #[test]
    fn a_sync_covers_only_writes_completed_before_it_was_submitted() {
        for seed in 0..50 {
            let sim = sim(seed);
            let storage = sim.storage();
            let file = Rc::new(sim.block_on(create_durable(&storage, "f", block(0, 4096))));
            let writer = Rc::clone(&file);
            let write = sim.spawn(async move { writer.write_at(block(1, 4096), 0).await });
            let syncer = Rc::clone(&file);
            let sync = sim.spawn(async move { syncer.sync_data().await });
            sim.block_on(async {
                write.await.expect("write");
                sync.await.expect("sync");
            });
            assert_eq!(sim.file_contents(Path::new("/d/f")), Some(vec![1; 4096]));
            assert_eq!(sim.durable_contents(Path::new("/d/f")), Some(vec![0; 4096]), "seed {seed}");
        }
    }

    /// Runs `change` on a fresh disk holding a durable `/d/a`, optionally syncs `/d`, crashes,
    /// and returns whether `/d/a` and `/d/b` exist afterwards.
    fn namespace_outcome(seed: u64, change: &str, sync: bool) -> (bool, bool) {
        let sim = sim(seed);
        let storage = sim.storage();
        sim.block_on(async {
            if change == "create" {
                storage.create_dir_all(Path::new("/d")).await.expect("mkdir");
                storage.sync_dir(Path::new("/")).await.expect("sync /");
                storage.sync_dir(Path::new("/d")).await.expect("sync /d");
                let file = storage
                    .open(Path::new("/d/a"), OpenMode::CreateReadWrite, false)
                    .await
                    .expect("create");
                file.write_at(block(3, 10), 0).await.expect("write");
                file.sync_data().await.expect("sync");
            } else {
                drop(create_durable(&storage, "a", block(3, 10)).await);
                match change {
                    "rename" => storage.rename(Path::new("/d/a"), Path::new("/d/b")).await,
                    "remove" => storage.remove_file(Path::new("/d/a")).await,
                    _ => unreachable!(),
                }
                .expect("change");
            }
            if sync {
                storage.sync_dir(Path::new("/d")).await.expect("sync /d");
            }
        });
        sim.crash();
        let a = sim.file_contents(Path::new("/d/a"));
        let b = sim.file_contents(Path::new("/d/b"));
        for contents in [&a, &b].into_iter().flatten() {
            assert_eq!(contents, &vec![3; 10], "seed {seed}: {change}");
        }
        (a.is_some(), b.is_some())
    }

    #[test]
    fn unsynced_namespace_changes_may_or_may_not_survive() {
        for (change, before, after) in [
            ("create", (false, false), (true, false)),
            ("rename", (true, false), (false, true)),
            ("remove", (true, false), (false, false)),
        ] {
            let mut outcomes = BTreeMap::new();
            for seed in 0..SEEDS {
                *outcomes.entry(namespace_outcome(seed, change, false)).or_insert(0) += 1;
            }
            println!("{change}: {outcomes:?}");
            assert_eq!(outcomes.len(), 2, "{change}: {outcomes:?}");
            assert!(outcomes[&before] > 0 && outcomes[&after] > 0, "{change}: {outcomes:?}");
        }
    }

    #[test]
    fn synced_namespace_changes_always_survive() {
        for seed in 0..SEEDS {
            assert_eq!(namespace_outcome(seed, "create", true), (true, false), "seed {seed}");
            assert_eq!(namespace_outcome(seed, "rename", true), (false, true), "seed {seed}");
            assert_eq!(namespace_outcome(seed, "remove", true), (false, false), "seed {seed}");
        }
    }

    #[test]
    fn an_unsynced_directory_takes_its_synced_entries_with_it() {
        let mut outcomes = BTreeSet::new();
        for seed in 0..50 {
            let sim = sim(seed);
            let storage = sim.storage();
            sim.block_on(async {
                storage.create_dir_all(Path::new("/x/y")).await.expect("mkdir");
                storage.sync_dir(Path::new("/x")).await.expect("sync /x");
                let file = storage
                    .open(Path::new("/x/y/f"), OpenMode::CreateReadWrite, false)
                    .await
                    .expect("create");
                file.sync_data().await.expect("sync");
                storage.sync_dir(Path::new("/x/y")).await.expect("sync /x/y");
            });
            sim.crash();
            let paths = sim.paths();
            assert!(paths.is_empty() || paths.len() == 3, "seed {seed}: {paths:?}");
            outcomes.insert(paths.len());
        }
        assert_eq!(outcomes, BTreeSet::from([0, 3]));
    }

    /// Every visible path with what a read of it sees.
    type Observed = Vec<(PathBuf, Option<Vec<u8>>)>;

    /// A workload with several writes in flight, crashed part way; returns everything a test
    /// could observe.
    fn crashed_workload(seed: u64) -> (SimStats, Observed) {
        let sim = sim(seed);
        let storage = sim.storage();
        let spawner = sim.spawner();
        let finished = sim.run_until_crash(
            async move {
                storage.create_dir_all(Path::new("/d")).await.expect("mkdir");
                let file = Rc::new(
                    storage
                        .open(Path::new("/d/log"), OpenMode::CreateReadWrite, true)
                        .await
                        .expect("open"),
                );
                for round in 0..4_u8 {
                    let writes: Vec<_> = (0..4_u8)
                        .map(|i| {
                            let file = Rc::clone(&file);
                            let offset = u64::from(round * 4 + i) * 4096;
                            spawner.spawn(async move {
                                file.write_at(block(round * 4 + i + 1, 4096), offset).await
                            })
                        })
                        .collect();
                    for write in writes {
                        write.await.expect("write");
                    }
                    file.sync_data().await.expect("sync");
                    storage.sync_dir(Path::new("/d")).await.expect("sync dir");
                }
            },
            14,
        );
        assert!(finished.is_none(), "the workload needs more than 14 completions");
        let observed =
            sim.paths().into_iter().map(|p| (p.clone(), sim.file_contents(&p))).collect();
        (sim.stats(), observed)
    }

    #[test]
    fn the_same_seed_gives_the_same_run() {
        let mut distinct = BTreeSet::new();
        for seed in 0..20 {
            let first = crashed_workload(seed);
            assert_eq!(first, crashed_workload(seed), "seed {seed}");
            assert_eq!(first.0.crashes, 1);
            assert_eq!(first.0.io_completions, 14);
            distinct.insert(format!("{first:?}"));
        }
        assert!(distinct.len() > 1, "every seed ran the same");
    }

    #[test]
    fn concurrent_writes_complete_in_seeded_order() {
        let mut winners = BTreeMap::new();
        for seed in 0..50 {
            let sim = sim(seed);
            let storage = sim.storage();
            let file = Rc::new(sim.block_on(create_durable(&storage, "f", block(0, 512))));
            let handles: Vec<_> = [1_u8, 2]
                .into_iter()
                .map(|byte| {
                    let file = Rc::clone(&file);
                    sim.spawn(async move { file.write_at(block(byte, 512), 0).await })
                })
                .collect();
            sim.block_on(async {
                for handle in handles {
                    handle.await.expect("write");
                }
            });
            let last = sim.file_contents(Path::new("/d/f")).expect("file")[0];
            *winners.entry(last).or_insert(0) += 1;
        }
        println!("last writer: {winners:?}");
        assert_eq!(winners.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn enospc_at_exactly_the_capacity() {
        let sim = Sim::new(1, SimConfig { capacity_bytes: 8192, ..SimConfig::default() });
        let storage = sim.storage();
        sim.block_on(async {
            let a =
                storage.open(Path::new("/a"), OpenMode::CreateReadWrite, false).await.expect("a");
            let b =
                storage.open(Path::new("/b"), OpenMode::CreateReadWrite, false).await.expect("b");
            a.write_at(block(1, 4096), 0).await.expect("a fits");
            b.write_at(block(2, 4095), 0).await.expect("b fits");
            b.write_at(block(2, 1), 4095).await.expect("the last byte fits");
            let error = b.write_at(block(2, 1), 4096).await.expect_err("one byte more");
            assert_eq!(error.kind(), io::ErrorKind::StorageFull);
            assert_eq!(error.raw_os_error(), Some(ENOSPC));
            // Overwriting in place needs no space.
            a.write_at(block(3, 4096), 0).await.expect("overwrite");
            assert_eq!(b.size_bytes().await.expect("size"), 4096);
        });
        assert_eq!(sim.stats().enospc_errors, 1);
    }

    #[test]
    fn read_errors_appear_at_the_configured_rate() {
        let sim = Sim::new(9, SimConfig { read_error_one_in: 10, ..SimConfig::default() });
        let storage = sim.storage();
        let failures = sim.block_on(async {
            let file = create_durable(&storage, "f", block(7, 100)).await;
            let mut failures = 0;
            let mut buf = AlignedBuf::zeroed(4096, 4096);
            for _ in 0..2000 {
                let (result, back) = file.read_at(buf, 0).await;
                buf = back;
                match result {
                    Ok(()) => assert_eq!(buf.as_slice(), &[7; 100][..]),
                    Err(error) => {
                        assert_eq!(error.raw_os_error(), Some(EIO));
                        failures += 1;
                    }
                }
            }
            failures
        });
        println!("{failures} of 2000 reads failed");
        assert!((120..=280).contains(&failures), "{failures}");
        assert_eq!(sim.stats().read_errors, failures);
    }

    #[test]
    fn reads_past_the_end_are_short() {
        let sim = sim(3);
        let storage = sim.storage();
        sim.block_on(async {
            let file = create_durable(&storage, "f", block(7, 100)).await;
            let (result, buf) = file.read_at(AlignedBuf::zeroed(64, 1), 90).await;
            result.expect("read");
            assert_eq!(buf.as_slice(), &[7; 10][..]);
            let (result, buf) = file.read_at(buf, 1000).await;
            result.expect("read");
            assert!(buf.is_empty());
        });
    }

    #[test]
    fn corrupt_flips_exactly_one_bit() {
        let sim = sim(4);
        let storage = sim.storage();
        drop(sim.block_on(create_durable(&storage, "f", block(0x0F, 4096))));
        sim.corrupt(Path::new("/d/f"), 1000, 6);
        for contents in
            [sim.file_contents(Path::new("/d/f")), sim.durable_contents(Path::new("/d/f"))]
        {
            let contents = contents.expect("file");
            let flipped: u32 = contents.iter().map(|&b| (b ^ 0x0F).count_ones()).sum();
            assert_eq!(flipped, 1);
            assert_eq!(contents[1000], 0x4F);
        }
        assert_eq!(sim.stats().bit_flips, 1);
    }

    #[test]
    fn injected_write_and_sync_errors_fail_once_without_effect() {
        let sim = sim(5);
        let storage = sim.storage();
        let file = sim.block_on(create_durable(&storage, "f", block(1, 10)));
        sim.fail_next_write(Path::new("/d/f"));
        sim.fail_next_sync(Path::new("/d/f"));
        sim.block_on(async {
            let error = file.write_at(block(2, 10), 0).await.expect_err("injected");
            assert_eq!(error.raw_os_error(), Some(EIO));
            file.write_at(block(3, 10), 0).await.expect("next write");
            file.sync_data().await.expect_err("injected");
        });
        assert_eq!(sim.file_contents(Path::new("/d/f")), Some(vec![3; 10]));
        assert_eq!(sim.durable_contents(Path::new("/d/f")), Some(vec![1; 10]));
        sim.block_on(file.sync_data()).expect("next sync");
        assert_eq!(sim.durable_contents(Path::new("/d/f")), Some(vec![3; 10]));
        assert_eq!(sim.stats().injected_errors, 2);
    }

    #[test]
    fn handles_from_before_a_crash_are_dead() {
        let sim = sim(6);
        let storage = sim.storage();
        let file = sim.block_on(create_durable(&storage, "f", block(1, 10)));
        sim.crash();
        assert!(sim.block_on(file.write_at(block(2, 1), 0)).is_err());
        assert!(sim.block_on(file.sync_data()).is_err());
        assert!(sim.block_on(file.size_bytes()).is_err());
        let reopened =
            sim.block_on(storage.open(Path::new("/d/f"), OpenMode::Read, false)).expect("open");
        assert_eq!(sim.block_on(reopened.size_bytes()).expect("size"), 10);
        assert!(sim.block_on(reopened.write_at(block(2, 1), 0)).is_err(), "read-only");
    }

    #[test]
    fn run_until_crash_returns_the_output_when_the_future_finishes_first() {
        let sim = sim(7);
        let storage = sim.storage();
        let output = sim.run_until_crash(
            async { storage.create_dir_all(Path::new("/d")).await.map(|()| 42) },
            5,
        );
        assert_eq!(output.map(Result::unwrap), Some(42));
        assert_eq!(sim.stats().crashes, 0);
        assert!(sim.run_until_crash(storage.sync_dir(Path::new("/")), 0).is_none());
        assert_eq!(sim.stats().crashes, 1);
    }

    #[test]
    fn metadata_follows_the_visible_namespace() {
        let sim = sim(8);
        let storage = sim.storage();
        sim.block_on(async {
            storage.create_dir_all(Path::new("/d/sub")).await.expect("mkdir");
            for name in ["b", "a", "c"] {
                storage
                    .open(&Path::new("/d").join(name), OpenMode::CreateReadWrite, false)
                    .await
                    .expect("create");
            }
            assert_eq!(
                storage.list_dir(Path::new("/d")).await.expect("list"),
                ["a", "b", "c", "sub"]
            );
            storage.remove_file(Path::new("/d/b")).await.expect("remove");
            assert!(!storage.exists(Path::new("/d/b")).await.expect("exists"));
            assert!(storage.exists(Path::new("/d/sub")).await.expect("exists"));
            let missing = storage
                .open(Path::new("/d/b"), OpenMode::ReadWrite, false)
                .await
                .expect_err("gone");
            assert_eq!(missing.kind(), io::ErrorKind::NotFound);
            let orphan = storage
                .open(Path::new("/nope/f"), OpenMode::CreateReadWrite, false)
                .await
                .expect_err("no dir");
            assert_eq!(orphan.kind(), io::ErrorKind::NotFound);
        });
    }

    #[test]
    fn a_write_in_flight_at_a_crash_may_land() {
        let mut both_landed = 0;
        for seed in 0..SEEDS {
            let sim = sim(seed);
            let storage = sim.storage();
            let spawner = sim.spawner();
            // `create_durable` takes six completions; the seventh completes one of the two
            // writes and the crash comes before the other has completed.
            let crashed = sim.run_until_crash(
                async {
                    let file = Rc::new(create_durable(&storage, "f", block(0, 1024)).await);
                    let other = Rc::clone(&file);
                    let first =
                        spawner.spawn(async move { other.write_at(block(9, 512), 0).await });
                    file.write_at(block(9, 512), 512).await.expect("write");
                    first.await.expect("write");
                },
                7,
            );
            assert!(crashed.is_none());
            let after = sim.file_contents(Path::new("/d/f")).expect("durable file");
            if after.iter().all(|&b| b == 9) {
                both_landed += 1;
            }
        }
        println!("both writes landed for {both_landed} of {SEEDS} seeds");
        assert!(both_landed > 0);
    }

    #[test]
    fn a_removed_file_stays_readable_while_open() {
        let sim = sim(2);
        let storage = sim.storage();
        sim.block_on(async {
            let file = create_durable(&storage, "f", block(4, 64)).await;
            storage.remove_file(Path::new("/d/f")).await.expect("remove");
            storage.sync_dir(Path::new("/d")).await.expect("sync /d");
            let (result, buf) = file.read_at(AlignedBuf::zeroed(64, 1), 0).await;
            result.expect("read");
            assert_eq!(buf.as_slice(), &[4; 64][..]);
        });
        assert!(sim.paths().iter().all(|p| p != Path::new("/d/f")));
        // The handle is gone now; the next collection frees the bytes.
        sim.block_on(storage.sync_dir(Path::new("/d"))).expect("sync /d");
        assert_eq!(sim.shared.disk.borrow().files.len(), 0);
    }

    #[test]
    #[should_panic(expected = "misaligned direct write")]
    fn a_misaligned_direct_write_panics() {
        let sim = sim(0);
        let storage = sim.storage();
        sim.block_on(async {
            let file =
                storage.open(Path::new("/f"), OpenMode::CreateReadWrite, true).await.expect("open");
            assert_eq!(file.alignment_bytes(), 4096);
            let _ = file.write_at(block(1, 4096), 512).await;
        });
    }

    #[test]
    #[should_panic(expected = "stalled")]
    fn a_stalled_simulation_panics() {
        sim(0).block_on(std::future::pending::<()>());
    }
}
