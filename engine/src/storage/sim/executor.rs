//! The simulation's single-threaded executor: the tasks, the queue of woken tasks, and the
//! futures of operations in flight on the simulated disk.
//!
//! It runs woken tasks until none is runnable, then has the disk complete *one* operation in
//! flight, chosen by the disk's PRNG, and wakes the task waiting for it. It never decides an
//! outcome itself, never polls two tasks at once, and never reads a clock or spawns a thread: the
//! order of completions, and with it the whole run, follows the seed alone.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::pin::{Pin, pin};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use super::disk::{Disk, Done, Op, SimConfig, stale_handle, to_usize};

/// The simulation: a disk, its executor and its PRNG, all decided by one seed.
pub struct Sim {
    pub(super) shared: Rc<Shared>,
    seed: u64,
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
        let disk = Disk::new(config, seed);
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

/// A spawned task, its output already routed to its [`JoinHandle`].
pub(super) type Task = Pin<Box<dyn Future<Output = ()>>>;

/// State shared by the simulation, its storage handles, its files and its in-flight futures.
pub(super) struct Shared {
    pub(super) disk: RefCell<Disk>,
    /// Behind `Arc<Mutex>` only because `Waker` demands `Send + Sync`; one thread ever touches it.
    pub(super) queue: Arc<Mutex<WakeQueue>>,
    pub(super) tasks: RefCell<BTreeMap<u64, Task>>,
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
        let (completion, done) = {
            let mut disk = self.disk.borrow_mut();
            let syncs_held = disk.syncs_held;
            let eligible = |entry: &InFlight| {
                !(syncs_held && matches!(entry.op, Op::SyncData { .. } | Op::SyncFilesystem { .. }))
            };
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
            (entry.completion, done)
        };
        let waker = {
            let mut completion = completion.borrow_mut();
            completion.done = Some(done);
            completion.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }
}

#[derive(Default)]
pub(super) struct WakeQueue {
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

    pub(super) fn clear(&mut self) {
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

/// Where an in-flight operation's result lands once the executor completes it, and the task to
/// wake then.
#[derive(Default)]
pub(super) struct Completion {
    done: Option<Done>,
    waker: Option<Waker>,
}

pub(super) struct InFlight {
    pub(super) op: Op,
    pub(super) completion: Rc<RefCell<Completion>>,
}

/// The future of one operation: registers it on first poll, then waits for its completion.
/// Dropping it does not cancel the operation, as dropping an io_uring future does not.
pub(super) struct Submit {
    shared: Rc<Shared>,
    op: Option<Op>,
    epoch: Option<u64>,
    completion: Rc<RefCell<Completion>>,
}

impl Submit {
    pub(super) fn new(shared: &Rc<Shared>, op: Op, epoch: Option<u64>) -> Self {
        Self { shared: Rc::clone(shared), op: Some(op), epoch, completion: Rc::default() }
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
                Op::SyncData { write_seq, .. } | Op::SyncFilesystem { write_seq } => {
                    *write_seq = disk.write_seq;
                }
                Op::SyncDir { ns_seq, .. } => *ns_seq = disk.ns_seq,
                _ => {}
            }
            let id = disk.next_op;
            disk.next_op += 1;
            disk.in_flight.insert(id, InFlight { op, completion: Rc::clone(&self.completion) });
        }
        let mut completion = self.completion.borrow_mut();
        match completion.done.take() {
            Some(done) => Poll::Ready(done),
            None => {
                completion.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
