//! Tiny, executor-agnostic concurrency for one thread: `join_all` runs several futures of one
//! task concurrently, so one flush can have many writes in flight without spawning (spawning
//! would tie the engine to an executor), and [`Latch`] lets one job's write wait for another
//! job's. Neither allocates per poll beyond the initial boxing and the wakers it keeps.

use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// A one-shot completion flag of one thread: opened once, awaited by any number of futures.
#[derive(Debug, Default)]
pub struct Latch {
    open: Cell<bool>,
    waiting: RefCell<Vec<Waker>>,
}

impl Latch {
    /// Opens the latch and wakes every waiter; later waits return at once.
    pub fn open(&self) {
        self.open.set(true);
        // Taken out first: an executor that polls on wake would otherwise find the list borrowed.
        let waiting = std::mem::take(&mut *self.waiting.borrow_mut());
        for waker in waiting {
            waker.wake();
        }
    }

    /// Whether it is open.
    pub fn is_open(&self) -> bool {
        self.open.get()
    }

    /// Waits until the latch is open.
    pub async fn wait(&self) {
        poll_fn(|context| {
            if self.open.get() {
                Poll::Ready(())
            } else {
                let mut waiting = self.waiting.borrow_mut();
                if !waiting.iter().any(|waker| waker.will_wake(context.waker())) {
                    waiting.push(context.waker().clone());
                }
                Poll::Pending
            }
        })
        .await;
    }
}

/// Awaits every future, polling all unfinished ones on each wake; outputs in input order.
pub async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    JoinAll {
        futures: futures.into_iter().map(|future| Some(Box::pin(future))).collect(),
        outputs: Vec::new(),
    }
    .await
}

struct JoinAll<F: Future> {
    futures: Vec<Option<Pin<Box<F>>>>,
    outputs: Vec<Option<F::Output>>,
}

impl<F: Future> Future for JoinAll<F> {
    type Output = Vec<F::Output>;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.outputs.len() < this.futures.len() {
            this.outputs.resize_with(this.futures.len(), || None);
        }
        let mut pending = false;
        for (slot, output) in this.futures.iter_mut().zip(this.outputs.iter_mut()) {
            if let Some(future) = slot {
                match future.as_mut().poll(context) {
                    Poll::Ready(value) => {
                        *output = Some(value);
                        *slot = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            return Poll::Pending;
        }
        Poll::Ready(this.outputs.iter_mut().map(|output| output.take().expect("joined")).collect())
    }
}

impl<F: Future> Unpin for JoinAll<F> {}
