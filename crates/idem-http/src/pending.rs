//! Completions the store has not taken yet: an execution finished, its
//! answer went to the client, and the store failed (or timed out) when
//! asked to keep it. The answer is held here, inside a byte budget, and
//! retried in the background with backoff until the store takes it, the
//! record is taken from this executor (a stale fence), the record
//! expires, or the layer shuts down. Meanwhile a retry of the same key that
//! reaches this process is answered from the held result (a replay, or 422
//! for other parameters), never executed again; a retry that reaches
//! another instance meets the record still in progress (409), since each
//! failed attempt is followed by a lease heartbeat where the store takes
//! one.
//!
//! Over the budget an answer is not held whole: its status and a
//! `response-not-stored` problem are, as for an answer over the replay
//! limit, so that a store stall under heavy traffic costs bounded memory
//! and still never lets the key run twice. Past [`MAX_HELD`] entries
//! nothing more is held: the key stays in progress until its lease ends,
//! and then the route's takeover policy decides.
//!
//! Each attempt sends a copy of its completion to the store; the copies in
//! flight at once are bounded too, by a quarter of the budget (or one
//! answer, if larger), so that retrying every held answer at once never
//! costs twice the budget.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Semaphore, SemaphorePermit};

use idem_core::{Completion, Fingerprint, RecordId, StoredResponse, Timestamp};

use crate::metrics::Meters;
use crate::replay_cache::weight;

/// At most this many completions are held at once, whatever their size.
pub(crate) const MAX_HELD: usize = 100_000;

/// One held completion.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) fingerprint: Fingerprint,
    /// What is retried, and what a retry of the key is answered with.
    pub(crate) completion: Completion,
    pub(crate) expires_at: Timestamp,
    /// What it costs against the budget.
    weight: usize,
}

/// How a request is answered from a held completion.
#[derive(Debug)]
pub(crate) enum HeldAnswer {
    /// The same parameters: the held answer, marked as a replay.
    Replay(StoredResponse, Timestamp),
    /// Other parameters under the same key: 422.
    Mismatch(Timestamp),
}

/// The completions this layer holds, by record.
#[derive(Debug)]
pub(crate) struct PendingCompletions {
    held: Mutex<HashMap<RecordId, Arc<Held>>>,
    /// Entries, read without the lock by the request path (most requests
    /// find nothing held).
    count: AtomicUsize,
    bytes: AtomicUsize,
    budget: usize,
    /// Bytes of completions being sent to the store at once (each attempt
    /// clones its completion): [`PendingCompletions::attempt`].
    attempts: Semaphore,
    /// The permits `attempts` started with.
    attempt_bytes: u32,
}

impl PendingCompletions {
    /// Holds up to `budget` bytes of answers (everything counted as the
    /// replay cache counts it).
    pub(crate) fn new(budget: usize, response_limit: usize) -> PendingCompletions {
        let attempt_bytes = (budget / 4)
            .max(response_limit)
            .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        let attempt_bytes = u32::try_from(attempt_bytes).unwrap_or(u32::MAX);
        PendingCompletions {
            held: Mutex::new(HashMap::new()),
            count: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            budget,
            attempts: Semaphore::new(attempt_bytes as usize),
            attempt_bytes,
        }
    }

    /// Waits until `entry`'s completion may be copied for an attempt (its
    /// weight in bytes, at most the whole allowance, is free); the attempt
    /// holds the permit while its copy lives.
    pub(crate) async fn attempt(&self, entry: &Held) -> SemaphorePermit<'_> {
        let want = u32::try_from(entry.weight)
            .unwrap_or(u32::MAX)
            .clamp(1, self.attempt_bytes);
        // Never closed: the semaphore lives as long as `self`.
        loop {
            if let Ok(permit) = self.attempts.acquire_many(want).await {
                return permit;
            }
        }
    }

    /// Holds `completion` for `id`: whole if it fits the budget, else as
    /// `placeholder(status)` (small, always held). `None` when [`MAX_HELD`]
    /// entries are held already: nothing is.
    pub(crate) fn hold(
        &self,
        id: &RecordId,
        fingerprint: Fingerprint,
        completion: Completion,
        expires_at: Timestamp,
        placeholder: impl FnOnce(&Completion) -> Completion,
        meters: &Meters,
    ) -> Option<Arc<Held>> {
        let mut held = self.lock();
        if held.len() >= MAX_HELD {
            return None;
        }
        let whole = weight(id, &completion.response);
        let (completion, weight) = if self.bytes.load(Ordering::Relaxed) + whole <= self.budget {
            (completion, whole)
        } else {
            let small = placeholder(&completion);
            let w = weight(id, &small.response);
            (small, w)
        };
        let entry = Arc::new(Held {
            fingerprint,
            completion,
            expires_at,
            weight,
        });
        if let Some(old) = held.insert(id.clone(), entry.clone()) {
            self.bytes.fetch_sub(old.weight, Ordering::Relaxed);
        }
        self.bytes.fetch_add(weight, Ordering::Relaxed);
        self.count.store(held.len(), Ordering::Relaxed);
        // Under the lock, so that two changes cannot leave the gauges
        // behind the map.
        meters.pending(held.len(), self.bytes.load(Ordering::Relaxed));
        Some(entry)
    }

    /// The answer for a request with `fingerprint` whose record is held
    /// here, if it is and has not expired at `now`.
    pub(crate) fn answer(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        now: Timestamp,
    ) -> Option<HeldAnswer> {
        if self.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let held = self.lock().get(id).cloned()?;
        if held.expires_at <= now {
            return None;
        }
        Some(if held.fingerprint == *fingerprint {
            HeldAnswer::Replay(held.completion.response.clone(), held.expires_at)
        } else {
            HeldAnswer::Mismatch(held.expires_at)
        })
    }

    /// Lets go of `id`'s completion `entry` (stored, or given up on): only
    /// that entry, not one held since under the same id (the record
    /// expired and the key ran again).
    pub(crate) fn release(&self, id: &RecordId, entry: &Arc<Held>, meters: &Meters) {
        let mut held = self.lock();
        if held.get(id).is_some_and(|h| Arc::ptr_eq(h, entry)) {
            held.remove(id);
            self.bytes.fetch_sub(entry.weight, Ordering::Relaxed);
        }
        self.count.store(held.len(), Ordering::Relaxed);
        meters.pending(held.len(), self.bytes.load(Ordering::Relaxed));
    }

    /// How many completions are held.
    pub(crate) fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// What they cost against the budget, in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RecordId, Arc<Held>>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use idem_core::{Key, Operation, Scope};

    fn held(pending: &PendingCompletions, key: &str, body: usize) -> Arc<Held> {
        let op = Operation::new("POST", "/p");
        let id = RecordId::new(Scope::anonymous(), op.clone(), Key::new(key).unwrap());
        let response = StoredResponse {
            status: 201,
            headers: vec![],
            body: vec![b'x'; body],
            trailers: Vec::new(),
        };
        pending
            .hold(
                &id,
                Fingerprint::compute(&op, None, b"", &Default::default()),
                Completion::completed(response),
                Timestamp::now() + std::time::Duration::from_secs(60),
                Clone::clone,
                &Meters::default(),
            )
            .unwrap()
    }

    /// Copies sent to the store at once are bounded by a quarter of the
    /// budget, or one answer's size where that is larger: a second large
    /// answer's attempt waits until the first one's copy is gone.
    #[test]
    fn attempts_in_flight_are_bounded_in_bytes() {
        let pending = PendingCompletions::new(4400, 1200);
        let a = held(&pending, "pending-key-00000001", 1500);
        let b = held(&pending, "pending-key-00000002", 1500);
        let first = pending.attempt(&a).now_or_never().expect("room for one");
        assert!(
            pending.attempt(&b).now_or_never().is_none(),
            "no room for two"
        );
        drop(first);
        assert!(pending.attempt(&b).now_or_never().is_some());
        // Small answers share the allowance.
        let small: Vec<_> = (0..2)
            .map(|i| held(&pending, &format!("pending-small-{i:06}"), 10))
            .collect();
        let permits: Vec<_> = small
            .iter()
            .map(|h| pending.attempt(h).now_or_never().expect("small ones fit"))
            .collect();
        assert_eq!(permits.len(), 2);
    }
}
