//! Group commit for stores on a server: calls from concurrent requests
//! gathered into batches, each sent as one statement (one round trip, one
//! transaction, one commit) by the store, each caller getting its own
//! answer.
//!
//! Batches form without a timer: a call that arrives while no batch is in
//! flight (or fewer than the allowed number) leaves at once, alone; calls
//! that arrive while batches are in flight wait for one to end, and then
//! leave together. Under no load nothing waits; under load each batch
//! carries whatever arrived during the previous one, as SQLite's writer
//! does with its transactions.
//!
//! What a batch means is the store's: this module only gathers, runs the
//! store's batch function in a task of its own (a caller that gives up
//! does not cut a batch off mid-flight) and hands the answers back in
//! order. Not here: any store logic, retries, or timeouts (the caller's
//! deadline covers its wait and its batch).

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};

/// The most calls waiting for a batch before callers wait to queue (a
/// bound on memory under a store that stalls).
const QUEUE: usize = 4096;

/// A queue of calls of one kind (claims, say), sent in batches by a
/// dispatcher task. Clones share the queue; the dispatcher ends when the
/// last clone is dropped.
#[derive(Debug)]
pub struct Batcher<Call, Answer> {
    queue: mpsc::Sender<(Call, oneshot::Sender<Answer>)>,
}

impl<Call, Answer> Clone for Batcher<Call, Answer> {
    fn clone(&self) -> Self {
        Batcher {
            queue: self.queue.clone(),
        }
    }
}

/// The batch's task ended without an answer for this call (it panicked,
/// or the runtime is shutting down): the call's outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the batch carrying this call ended without answering it")]
pub struct BatchLost;

impl<Call, Answer> Batcher<Call, Answer>
where
    Call: Send + 'static,
    Answer: Send + 'static,
{
    /// A batcher whose batches (at most `max_batch` calls, at most
    /// `in_flight` batches at once) are sent by `send`, which answers
    /// each call of the batch, in the batch's order (missing answers are
    /// [`BatchLost`] for their callers). Spawns the dispatcher on the
    /// current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn<F, Fut>(in_flight: usize, max_batch: usize, send: F) -> Batcher<Call, Answer>
    where
        F: Fn(Vec<Call>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Answer>> + Send + 'static,
    {
        let (queue, calls) = mpsc::channel(QUEUE);
        tokio::spawn(dispatch(
            calls,
            in_flight.max(1),
            max_batch.max(1),
            Arc::new(send),
        ));
        Batcher { queue }
    }

    /// Sends `call` with the next batch and waits for its answer.
    ///
    /// # Errors
    /// [`BatchLost`] when the batch ended without answering it, or the
    /// dispatcher is gone.
    pub async fn call(&self, call: Call) -> Result<Answer, BatchLost> {
        let (answer, answered) = oneshot::channel();
        self.queue
            .send((call, answer))
            .await
            .map_err(|_| BatchLost)?;
        answered.await.map_err(|_| BatchLost)
    }
}

async fn dispatch<Call, Answer, F, Fut>(
    mut calls: mpsc::Receiver<(Call, oneshot::Sender<Answer>)>,
    in_flight: usize,
    max_batch: usize,
    send: Arc<F>,
) where
    Call: Send + 'static,
    Answer: Send + 'static,
    F: Fn(Vec<Call>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<Answer>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(in_flight));
    loop {
        // A slot first: while every slot is taken, calls gather in the
        // queue, and the next batch takes them all.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = calls.recv().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match calls.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let (batch, callers): (Vec<Call>, Vec<oneshot::Sender<Answer>>) = batch.into_iter().unzip();
        let sending = send(batch);
        tokio::spawn(async move {
            let answers = sending.await;
            for (caller, answer) in callers.into_iter().zip(answers) {
                // A caller that gave up is not waiting: nothing to do.
                let _ = caller.send(answer);
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// While one batch is held in flight, calls gather; the next batch
    /// carries them all, and every caller gets its own answer.
    #[tokio::test]
    async fn calls_that_arrive_during_a_batch_leave_together_with_their_own_answers() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(tokio::sync::Notify::new());
        let (seen, held) = (sizes.clone(), gate.clone());
        let batcher = Batcher::spawn(1, 100, move |calls: Vec<u32>| {
            let (seen, held) = (seen.clone(), held.clone());
            async move {
                let first_batch = {
                    let mut s = seen
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    s.push(calls.len());
                    s.len() == 1
                };
                if first_batch {
                    held.notified().await;
                }
                calls.into_iter().map(|c| c * 10).collect::<Vec<_>>()
            }
        });
        let first = tokio::spawn({
            let b = batcher.clone();
            async move { b.call(1).await }
        });
        // The first batch is in flight (its size recorded) before the rest
        // are sent.
        while sizes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_empty()
        {
            tokio::task::yield_now().await;
        }
        let rest: Vec<_> = (2..=6)
            .map(|n| {
                let b = batcher.clone();
                tokio::spawn(async move { b.call(n).await })
            })
            .collect();
        // Each of the five is queued before the first batch ends.
        while batcher.queue.capacity() > QUEUE - 5 {
            tokio::task::yield_now().await;
        }
        gate.notify_one();
        assert_eq!(first.await.ok(), Some(Ok(10)));
        for (n, r) in (2..=6).zip(rest) {
            assert_eq!(r.await.ok(), Some(Ok(n * 10)));
        }
        assert_eq!(
            *sizes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            vec![1, 5]
        );
    }

    /// A batch function that answers fewer calls than it was given: the
    /// unanswered callers get `BatchLost`, not a hang.
    #[tokio::test]
    async fn a_call_left_unanswered_is_lost_not_hung() {
        let batcher = Batcher::spawn(1, 1, |_calls: Vec<u32>| async { Vec::<u32>::new() });
        assert_eq!(batcher.call(7).await, Err(BatchLost));
    }
}
