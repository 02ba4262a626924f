//! A tiny, executor-agnostic `join_all`: runs several futures of one task concurrently, so one
//! flush can have many writes in flight without spawning (spawning would tie the engine to an
//! executor). It never allocates per poll beyond the initial boxing.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

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
