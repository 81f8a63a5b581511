//! Metrics through the `metrics` facade (docs/contract.md, *Operations*). No key and
//! no tenant is ever a label.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `idem_requests_total` | counter | `outcome`: executed, replayed, conflict, mismatch, missing_key, invalid_key, store_unavailable, released, invalid_request, held |
//! | `idem_lease_takeovers_total` | counter | |
//! | `idem_records_in_progress` | gauge | (this process's executions) |
//! | `idem_in_progress_oldest_seconds` | gauge | |
//! | `idem_store_duration_seconds` | histogram | `op`: claim, complete, release, get, find_by_key |
//! | `idem_stale_completions_total` | counter | (an executor lost its lease before finishing) |
//! | `idem_unrecorded_completions_total` | counter | (answered, but the store failed for the whole lease: the record stays in progress) |
//! | `idem_replay_cache_hits_total` | counter | (replays answered from memory, without the store) |

//!
//! The layer takes its handles from the recorder installed when it first
//! records something, not when it is built (an application may build its
//! router before it installs its recorder), and keeps them: install the
//! recorder before the layer serves its first request.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use metrics::{Counter, Gauge, Histogram};

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
/// Executions whose result was never stored: the store failed until the
/// layer shut down, the record expired, or too many were held already.
/// Each such key stays in progress until its lease ends.
pub const UNRECORDED: &str = "idem_unrecorded_completions_total";
/// Completions the store failed to take at once, held in memory and
/// retried in the background (`pending.rs`).
pub const DEFERRED: &str = "idem_completions_deferred_total";
/// Releases the store failed to take at once, retried in the background
/// until it takes them or their lease ends (`flow/release.rs`).
pub const RELEASES_DEFERRED: &str = "idem_releases_deferred_total";
/// Releases owed now, retried in the background.
pub const RELEASES_OWED: &str = "idem_releases_owed";
/// Completions held now, waiting for the store.
pub const PENDING: &str = "idem_completions_pending";
/// What the held completions cost, in bytes (against the layer's budget).
pub const PENDING_BYTES: &str = "idem_completions_pending_bytes";
/// Executions that found their claim taken from them while they ran (a
/// lease heartbeat answered with a stale fence).
pub const LEASES_LOST: &str = "idem_leases_lost_total";

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
    /// Every outcome (every `outcome` label value), in the order of
    /// [`Outcome::index`].
    pub const ALL: &'static [Outcome] = &[
        Outcome::Executed,
        Outcome::Replayed,
        Outcome::Conflict,
        Outcome::Mismatch,
        Outcome::MissingKey,
        Outcome::InvalidKey,
        Outcome::StoreUnavailable,
        Outcome::Released,
        Outcome::InvalidRequest,
        Outcome::Held,
    ];

    /// Its place in [`Outcome::ALL`]. An exhaustive match, so that a new
    /// outcome does not compile until it has one.
    const fn index(self) -> usize {
        match self {
            Outcome::Executed => 0,
            Outcome::Replayed => 1,
            Outcome::Conflict => 2,
            Outcome::Mismatch => 3,
            Outcome::MissingKey => 4,
            Outcome::InvalidKey => 5,
            Outcome::StoreUnavailable => 6,
            Outcome::Released => 7,
            Outcome::InvalidRequest => 8,
            Outcome::Held => 9,
        }
    }

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

/// A store call, as labelled in `idem_store_duration_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreOp {
    Claim,
    Complete,
    Release,
    Get,
    FindByKey,
    ExtendLease,
}

impl StoreOp {
    /// In the order of [`StoreOp::index`].
    const ALL: [StoreOp; 6] = [
        StoreOp::Claim,
        StoreOp::Complete,
        StoreOp::Release,
        StoreOp::Get,
        StoreOp::FindByKey,
        StoreOp::ExtendLease,
    ];

    const fn index(self) -> usize {
        match self {
            StoreOp::Claim => 0,
            StoreOp::Complete => 1,
            StoreOp::Release => 2,
            StoreOp::Get => 3,
            StoreOp::FindByKey => 4,
            StoreOp::ExtendLease => 5,
        }
    }

    /// The label value; also names the call in a timeout's error.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StoreOp::Claim => "claim",
            StoreOp::Complete => "complete",
            StoreOp::Release => "release",
            StoreOp::Get => "get",
            StoreOp::FindByKey => "find_by_key",
            StoreOp::ExtendLease => "extend_lease",
        }
    }
}

/// The layer's metric handles. A lookup by name and labels costs the
/// recorder a hash and a lock on every call; a handle is an atomic update.
/// Taken from the recorder on first use (see the module's documentation).
#[derive(Debug, Default)]
pub(crate) struct Meters(OnceLock<Handles>);

#[derive(Debug)]
struct Handles {
    /// By [`Outcome::index`].
    requests: Vec<Counter>,
    /// By [`StoreOp::index`].
    store: [Histogram; StoreOp::ALL.len()],
    takeovers: Counter,
    replay_cache_hits: Counter,
    stale: Counter,
    unrecorded: Counter,
    deferred: Counter,
    deferred_releases: Counter,
    owed_releases: Gauge,
    pending: Gauge,
    pending_bytes: Gauge,
    leases_lost: Counter,
    in_progress: Gauge,
    oldest: Gauge,
}

impl Meters {
    fn handles(&self) -> &Handles {
        self.0.get_or_init(|| Handles {
            requests: Outcome::ALL
                .iter()
                .map(|o| metrics::counter!(REQUESTS, "outcome" => o.as_str()))
                .collect(),
            store: StoreOp::ALL.map(|op| metrics::histogram!(STORE_DURATION, "op" => op.as_str())),
            takeovers: metrics::counter!(TAKEOVERS),
            replay_cache_hits: metrics::counter!(REPLAY_CACHE_HITS),
            stale: metrics::counter!(STALE),
            unrecorded: metrics::counter!(UNRECORDED),
            deferred: metrics::counter!(DEFERRED),
            deferred_releases: metrics::counter!(RELEASES_DEFERRED),
            owed_releases: metrics::gauge!(RELEASES_OWED),
            pending: metrics::gauge!(PENDING),
            pending_bytes: metrics::gauge!(PENDING_BYTES),
            leases_lost: metrics::counter!(LEASES_LOST),
            in_progress: metrics::gauge!(IN_PROGRESS),
            oldest: metrics::gauge!(OLDEST),
        })
    }

    /// Counts a keyed request's end in `idem_requests_total{outcome}`.
    pub(crate) fn count(&self, outcome: Outcome) {
        match self.handles().requests.get(outcome.index()) {
            Some(counter) => counter.increment(1),
            // An outcome missing from `Outcome::ALL` (a test fails): looked
            // up by name rather than lost.
            None => metrics::counter!(REQUESTS, "outcome" => outcome.as_str()).increment(1),
        }
    }

    /// Times a store call into `idem_store_duration_seconds{op}`.
    pub(crate) async fn timed<T>(&self, op: StoreOp, fut: impl Future<Output = T>) -> T {
        let start = Instant::now();
        let out = fut.await;
        self.handles().store[op.index()].record(start.elapsed().as_secs_f64());
        out
    }

    pub(crate) fn takeover(&self) {
        self.handles().takeovers.increment(1);
    }

    pub(crate) fn replay_cache_hit(&self) {
        self.handles().replay_cache_hits.increment(1);
    }

    pub(crate) fn stale_completion(&self) {
        self.handles().stale.increment(1);
    }

    pub(crate) fn unrecorded_completion(&self) {
        self.handles().unrecorded.increment(1);
    }

    pub(crate) fn deferred_completion(&self) {
        self.handles().deferred.increment(1);
    }

    pub(crate) fn deferred_release(&self) {
        self.handles().deferred_releases.increment(1);
    }

    /// Sets the owed-release gauge.
    pub(crate) fn owed_releases(&self, owed: usize) {
        self.handles().owed_releases.set(owed as f64);
    }

    /// Sets the pending-completion gauges.
    pub(crate) fn pending(&self, held: usize, bytes: usize) {
        let handles = self.handles();
        handles.pending.set(held as f64);
        handles.pending_bytes.set(bytes as f64);
    }

    pub(crate) fn lease_lost(&self) {
        self.handles().leases_lost.increment(1);
    }
}

/// This process's running executions, for the in-progress gauges.
#[derive(Debug, Default)]
pub(crate) struct InProgress {
    next: AtomicU64,
    started: Mutex<BTreeMap<u64, Instant>>,
}

impl InProgress {
    pub(crate) fn begin(&self, meters: &Meters) -> u64 {
        // The id is taken under the lock, so ids and start times grow
        // together and the first entry is the oldest. The gauges are set
        // in the same hold: one lock an event, not two.
        let mut started = self.lock();
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        started.insert(id, Instant::now());
        Self::report_locked(&started, meters);
        id
    }

    pub(crate) fn end(&self, id: u64, meters: &Meters) {
        let mut started = self.lock();
        started.remove(&id);
        Self::report_locked(&started, meters);
    }

    /// Whether an execution that began before `t` is still running.
    pub(crate) fn started_before(&self, t: Instant) -> bool {
        self.lock().first_key_value().is_some_and(|(_, s)| *s < t)
    }

    /// Sets both gauges; call it on a timer too, since the oldest age grows
    /// without any event.
    pub(crate) fn report(&self, meters: &Meters) {
        Self::report_locked(&self.lock(), meters);
    }

    fn report_locked(started: &BTreeMap<u64, Instant>, meters: &Meters) {
        let handles = meters.handles();
        handles.in_progress.set(started.len() as f64);
        let oldest = started
            .first_key_value()
            .map_or(0.0, |(_, t)| t.elapsed().as_secs_f64());
        handles.oldest.set(oldest);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Instant>> {
        self.started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both gauges are set at every begin and end, not only on the timer:
    /// an application that never calls `report_metrics` still sees them.
    #[test]
    fn the_in_progress_gauges_follow_every_begin_and_end() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let (meters, in_progress) = (Meters::default(), InProgress::default());
            // Runs `event` with both gauges set to -1 first, so that what
            // the snapshot reads is what the event wrote (a snapshot also
            // zeroes the gauges it reads).
            let after = |event: &dyn Fn()| {
                meters.handles().in_progress.set(-1.0);
                meters.handles().oldest.set(-1.0);
                event();
                let (mut count, mut oldest) = (None, None);
                for (k, _, _, v) in snapshotter.snapshot().into_vec() {
                    if let DebugValue::Gauge(g) = v {
                        match k.key().name() {
                            IN_PROGRESS => count = Some(g.into_inner()),
                            OLDEST => oldest = Some(g.into_inner()),
                            _ => {}
                        }
                    }
                }
                (count, oldest)
            };
            let first = std::cell::Cell::new(0);
            let second = std::cell::Cell::new(0);
            let (count, oldest) = after(&|| first.set(in_progress.begin(&meters)));
            assert_eq!(count, Some(1.0));
            assert!(oldest.is_some_and(|age| age >= 0.0), "{oldest:?}");
            let (count, oldest) = after(&|| second.set(in_progress.begin(&meters)));
            assert_eq!(count, Some(2.0));
            assert!(oldest.is_some_and(|age| age >= 0.0), "{oldest:?}");
            let (count, oldest) = after(&|| in_progress.end(first.get(), &meters));
            assert_eq!(count, Some(1.0));
            assert!(oldest.is_some_and(|age| age >= 0.0), "{oldest:?}");
            let (count, oldest) = after(&|| in_progress.end(second.get(), &meters));
            assert_eq!((count, oldest), (Some(0.0), Some(0.0)));
        });
    }

    /// The handles are indexed by `index`: each list must be in that order
    /// and name every variant once.
    #[test]
    fn handle_lists_are_in_index_order() {
        for (i, outcome) in Outcome::ALL.iter().enumerate() {
            assert_eq!(outcome.index(), i, "{outcome:?}");
        }
        for (i, op) in StoreOp::ALL.iter().enumerate() {
            assert_eq!(op.index(), i, "{op:?}");
        }
        assert_eq!(Outcome::Held.index(), Outcome::ALL.len() - 1);
        let labels: std::collections::HashSet<_> =
            Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(labels.len(), Outcome::ALL.len());
    }
}
