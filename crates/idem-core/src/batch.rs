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

/// A completion to store, as a batch carries it: the record, its fence
/// (as the store keeps it) and the completion.
pub type CompletionCall = (crate::RecordId, i64, crate::Completion);
/// A release, as a batch carries it: the record and its fence.
pub type ReleaseCall = (crate::RecordId, i64);
/// A batched store call's answer.
type Answered<T> = Result<T, crate::StoreError>;

/// A store's three batchers: claims, completions and releases, each with
/// its own queue and batches, sent by the store's batch functions.
#[derive(Debug)]
pub struct StoreBatchers {
    /// Claims.
    pub claims: Batcher<crate::ClaimRequest, Answered<crate::Claim>>,
    /// Completions.
    pub completions: Batcher<CompletionCall, Answered<crate::Settled>>,
    /// Releases.
    pub releases: Batcher<ReleaseCall, Answered<crate::Settled>>,
}

impl StoreBatchers {
    /// Batchers of at most `max_batch` calls, at most `in_flight` batches
    /// of each kind at once, sent by the three functions.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn<C, CF, M, MF, R, RF>(
        in_flight: usize,
        max_batch: usize,
        claims: C,
        completions: M,
        releases: R,
    ) -> StoreBatchers
    where
        C: Fn(Vec<crate::ClaimRequest>) -> CF + Send + Sync + 'static,
        CF: Future<Output = Vec<Answered<crate::Claim>>> + Send + 'static,
        M: Fn(Vec<CompletionCall>) -> MF + Send + Sync + 'static,
        MF: Future<Output = Vec<Answered<crate::Settled>>> + Send + 'static,
        R: Fn(Vec<ReleaseCall>) -> RF + Send + Sync + 'static,
        RF: Future<Output = Vec<Answered<crate::Settled>>> + Send + 'static,
    {
        StoreBatchers {
            claims: Batcher::spawn(in_flight, max_batch, claims),
            completions: Batcher::spawn(in_flight, max_batch, completions),
            releases: Batcher::spawn(in_flight, max_batch, releases),
        }
    }
}

impl BatchLost {
    /// What a caller whose batch ended without its answer gets from the
    /// store called `store`: the call's outcome is unknown, so it fails
    /// (closed), as `Unavailable`.
    pub fn into_store_error(self, store: &str) -> crate::StoreError {
        crate::StoreError::new(
            crate::StoreErrorKind::Unavailable,
            format!("{store} store: the batch carrying this call ended without answering it"),
        )
    }
}

/// The kinds of calls a store batches (claims, completions and
/// releases), each with its own batches in flight.
pub const KINDS: usize = 3;

/// A store's connections and batches: its pool, and the batches of each
/// kind in flight at once, each on a connection of its own. A gateway
/// whose serving threads each open an instance of the store divides them
/// between the threads ([`PoolShare::thread_share`]), so that the threads
/// together hold about what one instance would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolShare {
    /// The most connections the pool opens.
    pub pool_size: usize,
    /// The most batches of each kind in flight at once.
    pub batches_in_flight: usize,
}

impl PoolShare {
    /// The smallest pool that keeps `in_flight` batches of each kind and
    /// one connection beside them.
    fn smallest_pool(in_flight: usize) -> usize {
        KINDS.saturating_mul(in_flight).saturating_add(1)
    }

    /// One of `threads` shares of this: the pool and the batches divided
    /// between the threads and rounded up, with no more batches than the
    /// share of the pool has connections for beside one for the calls that
    /// are not batched. A share keeps at least one batch of each kind and
    /// that one connection, so the shares of more than
    /// [`most_thread_shares`](Self::most_thread_shares) threads together
    /// hold more than the pool. One thread (or 0) keeps the whole.
    #[must_use]
    pub fn thread_share(self, threads: usize) -> PoolShare {
        if threads <= 1 {
            return self;
        }
        let pool = self.pool_size.div_ceil(threads);
        let batches_in_flight = self
            .batches_in_flight
            .div_ceil(threads)
            .min(pool.saturating_sub(1) / KINDS)
            .max(1);
        PoolShare {
            pool_size: pool.max(Self::smallest_pool(batches_in_flight)),
            batches_in_flight,
        }
    }

    /// The least a share keeps: one batch of each kind in flight and one
    /// connection beside them. For an instance beside per-thread ones that
    /// serves few calls (a gateway's start-up, sweeper and admin
    /// listener).
    #[must_use]
    pub fn smallest() -> PoolShare {
        PoolShare {
            pool_size: Self::smallest_pool(1),
            batches_in_flight: 1,
        }
    }

    /// The most threads whose [`thread_share`](Self::thread_share)s
    /// together hold no more than the pool (rounding aside): 4 for a pool
    /// of 16.
    #[must_use]
    pub fn most_thread_shares(self) -> usize {
        (self.pool_size / Self::smallest_pool(1)).max(1)
    }
}

/// The positions of `ids` in the order a batch runs them: by id (scope,
/// operation, key), calls with the same id in arrival order. Two batches
/// that lock the rows they share in this one order do not wait for each
/// other in a circle over those rows (a store's own locking may still
/// deadlock them, which the store must handle); a duplicate within a
/// batch runs after the call it duplicates, and sees it.
pub fn in_id_order<'a>(ids: impl Iterator<Item = &'a crate::RecordId>) -> Vec<usize> {
    let ids: Vec<&crate::RecordId> = ids.collect();
    let mut order: Vec<usize> = (0..ids.len()).collect();
    // Stable: equal ids keep their arrival order.
    order.sort_by(|&a, &b| {
        let (x, y) = (ids[a], ids[b]);
        (x.scope.as_str(), x.operation.as_str(), x.key.as_str()).cmp(&(
            y.scope.as_str(),
            y.operation.as_str(),
            y.key.as_str(),
        ))
    });
    order
}

/// Each call alone, in order: a batch of one, or a batch the server
/// refused (so that a call that poisoned it fails only itself).
pub async fn one_by_one<'c, C, A, Fut>(calls: &'c [C], one: impl Fn(&'c C) -> Fut) -> Vec<A>
where
    Fut: Future<Output = A>,
{
    let mut answers = Vec::with_capacity(calls.len());
    for call in calls {
        answers.push(one(call).await);
    }
    answers
}

/// What a store does with the calls of a batch its server refused
/// (nothing of the batch happened).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRefusal {
    /// Sends each again alone, so that a call that poisoned the batch
    /// fails only itself: what a store does.
    OneAtATime,
    /// Fails each, as `Backend`: for checks that must see the batch's own
    /// answers (the single path gives every call the same answers as a
    /// working batch, and would hide a broken one).
    FailAll,
}

impl OnRefusal {
    /// The answer to `call` of a batch the server refused, for the store
    /// called `store`: `alone(call)`, or a failure.
    pub async fn answer<'c, C, A, Fut>(
        self,
        store: &str,
        call: &'c C,
        alone: impl FnOnce(&'c C) -> Fut,
    ) -> Result<A, crate::StoreError>
    where
        Fut: Future<Output = Result<A, crate::StoreError>>,
    {
        match self {
            OnRefusal::OneAtATime => alone(call).await,
            OnRefusal::FailAll => Err(crate::StoreError::new(
                crate::StoreErrorKind::Backend,
                format!("{store} store: the server refused the batch"),
            )),
        }
    }
}

/// `n` copies of one failure: a batch whose outcome is unknown (the
/// connection failed under it) fails every call in it, closed.
pub fn all_failed<T>(
    n: usize,
    kind: crate::StoreErrorKind,
    message: &str,
) -> Vec<Result<T, crate::StoreError>> {
    (0..n)
        .map(|_| Err(crate::StoreError::new(kind, message.to_owned())))
        .collect()
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

    /// A refused batch's call goes alone, or fails without going: a check
    /// run with `FailAll` never sees the single path's answer.
    #[tokio::test]
    async fn a_refused_call_goes_alone_or_fails_without_going() {
        let went = std::sync::atomic::AtomicUsize::new(0);
        let alone = |n: &u32| {
            went.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let n = *n;
            async move { Ok::<u32, crate::StoreError>(n * 10) }
        };
        assert_eq!(
            OnRefusal::OneAtATime.answer("test", &4, alone).await.ok(),
            Some(40)
        );
        let failed = OnRefusal::FailAll.answer("test", &4, alone).await;
        assert_eq!(
            failed.err().map(|e| e.kind()),
            Some(crate::StoreErrorKind::Backend)
        );
        assert_eq!(went.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// A batch function that answers fewer calls than it was given: the
    /// unanswered callers get `BatchLost`, not a hang.
    #[tokio::test]
    async fn a_call_left_unanswered_is_lost_not_hung() {
        let batcher = Batcher::spawn(1, 1, |_calls: Vec<u32>| async { Vec::<u32>::new() });
        assert_eq!(batcher.call(7).await, Err(BatchLost));
    }
}

#[cfg(test)]
mod pool_share_tests {
    use super::{KINDS, PoolShare};

    fn share(pool_size: usize, batches_in_flight: usize, threads: usize) -> (usize, usize) {
        let s = PoolShare {
            pool_size,
            batches_in_flight,
        }
        .thread_share(threads);
        (s.pool_size, s.batches_in_flight)
    }

    #[test]
    fn one_thread_keeps_the_whole_and_more_threads_divide_it() {
        assert_eq!(share(16, 2, 1), (16, 2));
        assert_eq!(share(16, 2, 0), (16, 2));
        assert_eq!(share(16, 2, 2), (8, 1));
        assert_eq!(share(16, 2, 3), (6, 1));
        assert_eq!(share(16, 2, 4), (4, 1));
        assert_eq!(share(40, 4, 4), (10, 1));
        // Batches no more than the share's connections allow.
        assert_eq!(share(16, 8, 2), (8, 2));
        // One thread keeps what was set, even a pool smaller than its batches.
        assert_eq!(share(2, 2, 1), (2, 2));
    }

    #[test]
    fn every_share_keeps_a_batch_of_each_kind_and_a_connection_beside() {
        for threads in 2..=1024 {
            let (pool, in_flight) = share(16, 2, threads);
            assert!(in_flight >= 1, "{threads}: {in_flight}");
            assert!(pool > KINDS * in_flight, "{threads}: {pool} {in_flight}");
        }
    }

    #[test]
    fn up_to_the_most_shares_the_threads_hold_no_more_than_the_pool() {
        for pool_size in 1..=64 {
            let whole = PoolShare {
                pool_size,
                batches_in_flight: 2,
            };
            let most = whole.most_thread_shares();
            assert!(most >= 1);
            for (threads, in_flight) in (1..=most).flat_map(|t| (1..=8).map(move |b| (t, b))) {
                let (pool, _) = share(pool_size, in_flight, threads);
                // Rounding up gives each thread at most one more.
                assert!(
                    pool * threads <= pool_size.max(KINDS + 1) + threads,
                    "{pool_size} / {threads} ({in_flight} batches): {pool}"
                );
            }
            if pool_size >= 2 * (KINDS + 1) {
                // One thread more would hold more than the pool.
                let (over, _) = share(pool_size, 2, most + 1);
                assert!(over * (most + 1) > pool_size, "{pool_size}");
            }
        }
        assert_eq!(
            PoolShare {
                pool_size: 16,
                batches_in_flight: 2
            }
            .most_thread_shares(),
            4
        );
    }

    #[test]
    fn the_largest_shares_do_not_overflow() {
        assert_eq!(share(usize::MAX, 64, 2), (usize::MAX.div_ceil(2), 32));
        // As many batches as the share's connections allow.
        let half = usize::MAX.div_ceil(2);
        assert_eq!(share(usize::MAX, usize::MAX, 2), (half, (half - 1) / KINDS));
        let least = PoolShare::smallest();
        assert_eq!((least.pool_size, least.batches_in_flight), (KINDS + 1, 1));
    }
}
