//! Metrics through the `metrics` facade (docs/contract.md, *Operations*). No key and
//! no tenant is ever a label.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `idem_requests_total` | counter | `outcome`: executed, replayed, conflict, mismatch, missing_key, invalid_key, store_unavailable, released, invalid_request, held |
//! | `idem_lease_takeovers_total` | counter | |
//! | `idem_records_in_progress` | gauge | (this process's executions) |
//! | `idem_in_progress_oldest_seconds` | gauge | |
//! | `idem_store_duration_seconds` | histogram | `op`: claim, complete, release, get |
//! | `idem_stale_completions_total` | counter | (an executor lost its lease before finishing) |
//! | `idem_unrecorded_completions_total` | counter | (answered, but the store failed for the whole lease: the record stays in progress) |
//! | `idem_replay_cache_hits_total` | counter | (replays answered from memory, without the store) |

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Request counter.
pub const REQUESTS: &str = "idem_requests_total";
/// Takeover counter.
pub const TAKEOVERS: &str = "idem_lease_takeovers_total";
/// In-progress gauge.
pub const IN_PROGRESS: &str = "idem_records_in_progress";
/// Oldest in-progress age gauge.
pub const OLDEST: &str = "idem_in_progress_oldest_seconds";
/// Store latency histogram.
pub const STORE_DURATION: &str = "idem_store_duration_seconds";
/// Replays answered from the replay cache, without the store.
pub const REPLAY_CACHE_HITS: &str = "idem_replay_cache_hits_total";
/// Completions refused for a stale fence.
pub const STALE: &str = "idem_stale_completions_total";
/// Executions answered whose result could not be stored before their
/// lease ended (the store failed throughout).
pub const UNRECORDED: &str = "idem_unrecorded_completions_total";

/// How a keyed request ended, as counted in `idem_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and its result was stored.
    Executed,
    /// A stored result was replayed.
    Replayed,
    /// 409: in flight.
    Conflict,
    /// 422: different parameters.
    Mismatch,
    /// 400: no key.
    MissingKey,
    /// 400: bad key.
    InvalidKey,
    /// 503: store down.
    StoreUnavailable,
    /// The handler ran and failed transiently; the claim was released.
    Released,
    /// 400/408/413: the body was unreadable, too slow or too large, or the
    /// caller could not be identified.
    InvalidRequest,
    /// The outcome is unknown (upstream timed out or failed after the
    /// request was sent, shutdown): the claim is held until its lease ends.
    Held,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::Replayed => "replayed",
            Outcome::Conflict => "conflict",
            Outcome::Mismatch => "mismatch",
            Outcome::MissingKey => "missing_key",
            Outcome::InvalidKey => "invalid_key",
            Outcome::StoreUnavailable => "store_unavailable",
            Outcome::Released => "released",
            Outcome::InvalidRequest => "invalid_request",
            Outcome::Held => "held",
        }
    }
}

pub(crate) fn count(outcome: Outcome) {
    metrics::counter!(REQUESTS, "outcome" => outcome.as_str()).increment(1);
}

/// Times a store operation into `idem_store_duration_seconds{op}`.
pub(crate) async fn timed<T>(op: &'static str, fut: impl Future<Output = T>) -> T {
    let start = Instant::now();
    let out = fut.await;
    metrics::histogram!(STORE_DURATION, "op" => op).record(start.elapsed().as_secs_f64());
    out
}

/// This process's running executions, for the in-progress gauges.
#[derive(Debug, Default)]
pub(crate) struct InProgress {
    next: AtomicU64,
    started: Mutex<BTreeMap<u64, Instant>>,
}

impl InProgress {
    pub(crate) fn begin(&self) -> u64 {
        let id = {
            // The id is taken under the lock, so ids and start times grow
            // together and the first entry is the oldest.
            let mut started = self.lock();
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            started.insert(id, Instant::now());
            id
        };
        self.report();
        id
    }

    pub(crate) fn end(&self, id: u64) {
        self.lock().remove(&id);
        self.report();
    }

    /// Sets both gauges; call it on a timer too, since the oldest age grows
    /// without any event.
    pub(crate) fn report(&self) {
        let started = self.lock();
        metrics::gauge!(IN_PROGRESS).set(started.len() as f64);
        let oldest = started
            .first_key_value()
            .map_or(0.0, |(_, t)| t.elapsed().as_secs_f64());
        metrics::gauge!(OLDEST).set(oldest);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Instant>> {
        self.started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
