//! Noticing a store that forgot, and failing closed while it matters.
//!
//! Every check advances the store's epoch ([`Store::advance_epoch`]) and
//! hands the marks to an [`EpochWatch`], which tells an emptied, replaced
//! or rolled-back store from one that kept its writes. On a loss the layer
//! refuses new claims for the *loss window* (503 `store-lost-records` with
//! `Retry-After`): at least the longest lease, so that every execution that
//! began before the loss (whose claim the store no longer holds) has ended
//! or lost its lease before a retry of its key can execute again; claims
//! also wait while an execution of this process that began before the loss
//! still runs (a heartbeat may carry it past its lease), and a claim
//! granted while the loss was being noticed is given back. What was
//! lost stays lost (a completed intent whose record went executes again on
//! its next retry); the window, the metric, the log line and the alert make
//! it seen.
//!
//! Checks run every [`StoreWatch::interval`] and at once after a store call
//! that found the store unavailable (a reconnect is when a restarted store
//! is met first). Until a check that began after the store was met down
//! (by a request, or by a check that failed) has answered, claims are
//! refused with 503 `store-unavailable`: a store that came back empty is
//! never claimed from before its epoch is read. A check that fails is
//! logged and counted; the next one tries again.
//!
//! Metrics: `idem_store_losses_total{cause}` (`emptied`, `replaced`,
//! `rolled_back`), `idem_store_loss_window_open` (1 while new claims are
//! refused), `idem_epoch_checks_failed_total`.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::{EpochWatch, LOSS_CAUSES, Store, StoreError, StoreLoss, Timestamp};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Losses noticed, by `cause`.
pub const STORE_LOSSES: &str = "idem_store_losses_total";
/// 1 while the loss window is open (new claims refused), else 0.
pub const LOSS_WINDOW_OPEN: &str = "idem_store_loss_window_open";
/// The longest loss window: the longest lease a policy allows.
pub const MAX_WINDOW: Duration = idem_core::Policy::MAX_LEASE;
/// Epoch checks that failed (the store did not answer in time).
pub const EPOCH_CHECKS_FAILED: &str = "idem_epoch_checks_failed_total";

/// Registers the watch's series at zero, so that an alert on one that has
/// not moved yet has a series to read. [`StoreWatch::spawn`] calls it.
pub fn register_metrics() {
    for cause in LOSS_CAUSES {
        metrics::counter!(STORE_LOSSES, "cause" => cause).increment(0);
    }
    metrics::gauge!(LOSS_WINDOW_OPEN).set(0.0);
    metrics::counter!(EPOCH_CHECKS_FAILED).increment(0);
}

/// The loss window, shared by the layer (which refuses claims while it is
/// open) and its [`StoreWatch`] (which opens it).
#[derive(Debug, Default)]
pub(crate) struct LossWindow {
    /// When the window closes, in milliseconds since the epoch; 0: closed.
    until_ms: AtomicI64,
    /// Woken when a store call found the store unavailable: check now.
    suspect: Notify,
    /// How many times a store call found the store unavailable.
    suspected: AtomicU64,
    /// The value of `suspected` when the last check that succeeded began:
    /// below `suspected`, the store was met down and not checked since.
    checked: AtomicU64,
    /// How many watches run: without one, nothing is awaited.
    watches: AtomicU64,
    /// How many losses were noticed: a claim granted while this moved may
    /// have been granted by the store that forgot.
    losses: AtomicU64,
    /// When the last loss was noticed: executions of this process that
    /// began before it hold claims the store may have forgotten, and keep
    /// the window open until they end, however long the lease.
    lost_at: std::sync::Mutex<Option<Instant>>,
}

/// What a claim saw of the window before it went to the store
/// ([`LossWindow::before_claim`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BeforeClaim {
    losses: u64,
    suspected: u64,
}

impl LossWindow {
    /// Read before a claim's pre-checks, and compared after the store
    /// granted it ([`LossWindow::moved_since`]).
    pub(crate) fn before_claim(&self) -> BeforeClaim {
        BeforeClaim {
            losses: self.losses.load(Ordering::SeqCst),
            suspected: self.suspected.load(Ordering::SeqCst),
        }
    }

    /// Whether a loss was noticed, or the store met down, since `before`:
    /// a claim granted meanwhile may come from a store that forgot an
    /// execution still running, and is given back. (A claim on its way
    /// when the watch opens the window would otherwise pass: the window is
    /// read before the claim.)
    pub(crate) fn moved_since(&self, before: BeforeClaim) -> bool {
        self.losses.load(Ordering::SeqCst) != before.losses
            || self.suspected.load(Ordering::SeqCst) != before.suspected
    }

    /// Whether a store call found the store unavailable and a running
    /// watch has not checked its epoch since: the store may have come
    /// back empty, and a claim now could run beside an execution it
    /// forgot. Claims wait for the check (503 `store-unavailable`).
    pub(crate) fn awaiting_check(&self) -> bool {
        self.watches.load(Ordering::SeqCst) > 0
            && self.suspected.load(Ordering::SeqCst) > self.checked.load(Ordering::SeqCst)
    }

    /// While the window is open at `now`: how long it stays open.
    pub(crate) fn retry_after(&self, now: Timestamp) -> Option<Duration> {
        let until = self.until_ms.load(Ordering::SeqCst);
        let left = until.checked_sub(now.as_millis()).filter(|ms| *ms > 0)?;
        Some(Duration::from_millis(u64::try_from(left).unwrap_or(0)))
    }

    /// Opens the window until `until`, or keeps it open longer if it is,
    /// and counts the loss for claims in flight.
    fn open_until(&self, until: Timestamp) {
        *self
            .lost_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        self.until_ms.fetch_max(until.as_millis(), Ordering::SeqCst);
        self.losses.fetch_add(1, Ordering::SeqCst);
    }

    /// When the last loss was noticed, if one was.
    pub(crate) fn lost_at(&self) -> Option<Instant> {
        if self.losses.load(Ordering::SeqCst) == 0 {
            return None;
        }
        *self
            .lost_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A store call found the store unavailable: the watch checks at once,
    /// and claims wait for it.
    pub(crate) fn suspect(&self) {
        self.suspected.fetch_add(1, Ordering::SeqCst);
        self.suspect.notify_one();
    }
}

/// Checks the store's epoch and opens the layer's loss window on a loss.
/// Made by [`LayerHandle::store_watch`](crate::LayerHandle::store_watch);
/// run by [`Maintenance::watch_store`](crate::maintenance::Maintenance::watch_store)
/// or [`StoreWatch::spawn`].
#[derive(Clone)]
pub struct StoreWatch {
    store: Arc<dyn Store>,
    window: Arc<LossWindow>,
    length: Duration,
    interval: Duration,
    timeout: Duration,
    /// What the checks saw, locked for a whole check: two checks of one
    /// watch (clones share it) never compare answers out of order.
    seen: Arc<tokio::sync::Mutex<EpochWatch>>,
}

impl std::fmt::Debug for StoreWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreWatch")
            .field("window", &self.length)
            .field("interval", &self.interval)
            .field("store_timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl StoreWatch {
    /// A watch over `store` that opens `window` for `length` (the layer's
    /// longest lease) on a loss; checks every second.
    pub(crate) fn new(store: Arc<dyn Store>, window: Arc<LossWindow>, length: Duration) -> Self {
        StoreWatch {
            store,
            window,
            length,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(5),
            seen: Arc::new(tokio::sync::Mutex::new(EpochWatch::new())),
        }
    }

    /// How often the epoch is checked. Default 1 s: a loss is noticed at
    /// most this long after the store comes back (sooner when a request
    /// met the store down). Each check is one small write.
    pub fn interval(mut self, every: Duration) -> StoreWatch {
        self.interval = every.max(Duration::from_millis(10));
        self
    }

    /// How long new claims are refused after a loss: never shorter than
    /// the layer's longest lease (a shorter `d` is raised to it). A gateway
    /// whose executions are bounded by an upstream deadline longer than the
    /// lease passes that deadline, so that no execution that began before
    /// the loss is still running when its key can run again.
    pub fn window(mut self, d: Duration) -> StoreWatch {
        self.length = self.length.max(d).min(MAX_WINDOW);
        self
    }

    /// The loss window's length.
    pub fn window_length(&self) -> Duration {
        self.length
    }

    /// The longest one check may take. Default 5 s.
    pub fn store_timeout(mut self, d: Duration) -> StoreWatch {
        self.timeout = d;
        self
    }

    /// One check: advances the epoch, and on a loss opens the window, logs
    /// it and counts it. Answers the losses noticed.
    ///
    /// # Errors
    /// The store's, or a timeout (counted as unavailable); nothing changes.
    pub async fn check_once(&self) -> Result<Vec<StoreLoss>, StoreError> {
        let mut seen = self.seen.lock().await;
        let candidate = new_epoch_id();
        let suspected = self.window.suspected.load(Ordering::SeqCst);
        let marks = tokio::time::timeout(self.timeout, self.store.advance_epoch(&candidate))
            .await
            .unwrap_or_else(|_| Err(StoreError::timed_out("an epoch check")))
            .inspect_err(|e| {
                metrics::counter!(EPOCH_CHECKS_FAILED).increment(1);
                // Met down by the check itself: claims wait for the next
                // check that answers (the interval's, not at once, so that
                // a store that stays down is not asked in a loop). Any
                // other failure (a missing right, a damaged epoch) is
                // logged and alerted on, and gates nothing: the store
                // answers, and a check that cannot succeed must not
                // refuse every claim for ever. So it also settles the
                // suspicions raised before it began, as a check that
                // passes would (else one request that met the store down
                // would gate every claim until a restart).
                if e.is_unavailable() {
                    self.window.suspected.fetch_add(1, Ordering::SeqCst);
                } else {
                    tracing::error!(error = %e, "the epoch check fails for a reason other than the store being down: losses of records cannot be noticed until it is fixed");
                    self.window.checked.fetch_max(suspected, Ordering::SeqCst);
                }
            })?;
        let (first, losses) = (!seen.has_seen(), seen.observe(&marks));
        if first {
            for mark in marks.iter().filter(|m| m.created) {
                tracing::info!(place = %mark.place, "the store had no epoch and was given one: a new store, or one emptied while no idem watched it");
            }
        }
        if !losses.is_empty() {
            let until = Timestamp::now() + self.length;
            self.window.open_until(until);
            metrics::gauge!(LOSS_WINDOW_OPEN).set(1.0);
            for loss in &losses {
                metrics::counter!(STORE_LOSSES, "cause" => loss.cause.as_str()).increment(1);
                tracing::error!(place = %loss.place, cause = loss.cause.as_str(), window_seconds = self.length.as_secs_f64(), "{loss}; new claims are refused until the window closes; retries of intents completed before the loss execute again");
            }
        } else if self.window.retry_after(Timestamp::now()).is_none() {
            metrics::gauge!(LOSS_WINDOW_OPEN).set(0.0);
        }
        // Checked after every suspicion raised before it began (with the
        // window open first, so that no claim slips between the two).
        self.window.checked.fetch_max(suspected, Ordering::SeqCst);
        drop(seen);
        Ok(losses)
    }

    /// Checks every interval, and at once when a request met the store
    /// unavailable, until `stop` is cancelled.
    pub fn spawn(self, stop: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(self.run(stop))
    }

    /// The loop [`StoreWatch::spawn`] runs.
    pub(crate) async fn run(self, stop: CancellationToken) {
        register_metrics();
        // Counted as running from here to its end, however it ends.
        struct Running<'a>(&'a LossWindow);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.watches.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.window.watches.fetch_add(1, Ordering::AcqRel);
        let window = self.window.clone();
        let _running = Running(&window);
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = self.window.suspect.notified() => {}
                () = stop.cancelled() => return,
            }
            if let Err(e) = self.check_once().await {
                tracing::warn!(error = %e, "epoch check failed; retrying at the next");
            }
        }
    }
}

/// A fresh epoch id: 128 bits from two hashers keyed by the operating
/// system's randomness (std's `RandomState`), so two stores, or one store
/// emptied twice, never get the same id.
fn new_epoch_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let a = RandomState::new().hash_one(nanos);
    let b = RandomState::new().hash_one((nanos, std::process::id()));
    format!("{a:016x}{b:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{LossCause, MemoryStore};

    fn watch(store: Arc<MemoryStore>, window: Duration) -> (StoreWatch, Arc<LossWindow>) {
        let w = Arc::new(LossWindow::default());
        (StoreWatch::new(store, w.clone(), window), w)
    }

    #[tokio::test]
    async fn an_emptied_store_opens_the_window_for_its_length() {
        let store = Arc::new(MemoryStore::new());
        let (watch, window) = watch(store.clone(), Duration::from_secs(30));
        assert!(watch.check_once().await.unwrap().is_empty());
        assert!(watch.check_once().await.unwrap().is_empty());
        assert_eq!(window.retry_after(Timestamp::now()), None);

        store.forget_everything();
        let losses = watch.check_once().await.unwrap();
        assert_eq!(losses.len(), 1);
        assert_eq!(losses[0].cause, LossCause::Emptied);
        let left = window.retry_after(Timestamp::now()).expect("open");
        assert!(
            left > Duration::from_secs(29) && left <= Duration::from_secs(30),
            "{left:?}"
        );
        // It closes when its length has passed, and the next check, which
        // sees the new epoch advance, keeps it closed.
        let later = Timestamp::now() + Duration::from_secs(31);
        assert_eq!(window.retry_after(later), None);
        assert!(watch.check_once().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_first_check_of_a_new_store_opens_nothing() {
        let store = Arc::new(MemoryStore::new());
        let (watch, window) = watch(store, Duration::from_secs(30));
        watch.check_once().await.unwrap();
        assert_eq!(window.retry_after(Timestamp::now()), None);
    }

    #[test]
    fn the_window_is_never_shorter_than_the_lease() {
        let w = Arc::new(LossWindow::default());
        let watch = StoreWatch::new(Arc::new(MemoryStore::new()), w, Duration::from_secs(30));
        assert_eq!(
            watch.clone().window(Duration::from_secs(1)).window_length(),
            Duration::from_secs(30)
        );
        assert_eq!(
            watch.window(Duration::from_secs(90)).window_length(),
            Duration::from_secs(90)
        );
    }

    #[test]
    fn a_longer_window_is_never_shortened_by_a_later_loss() {
        let w = LossWindow::default();
        let now = Timestamp::now();
        w.open_until(now + Duration::from_secs(60));
        w.open_until(now + Duration::from_secs(10));
        assert!(w.retry_after(now).unwrap() > Duration::from_secs(59));
    }

    /// A check that fails (the store down) gates claims until one answers,
    /// whoever met the store down first: a connection replaced by the
    /// failed check must not let a claim reach a store that came back
    /// empty before its epoch is read. Without a running watch nothing is
    /// gated.
    #[tokio::test]
    async fn a_failed_check_gates_claims_until_one_answers() {
        use idem_testkit::{Fault, FaultyStore, StoreOp};
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let is_down = down.clone();
        let store = Arc::new(FaultyStore::with_faults(
            Arc::new(MemoryStore::new()),
            move |call| match call.op {
                StoreOp::AdvanceEpoch if is_down.load(Ordering::SeqCst) => Fault::Fail(
                    StoreError::new(idem_core::StoreErrorKind::Unavailable, "down"),
                ),
                _ => Fault::Pass,
            },
        ));
        let window = Arc::new(LossWindow::default());
        let watch = StoreWatch::new(store, window.clone(), Duration::from_secs(30));
        watch.check_once().await.unwrap();
        down.store(true, Ordering::SeqCst);
        assert!(watch.check_once().await.is_err());
        assert!(!window.awaiting_check(), "no watch runs: nothing is gated");
        window.watches.fetch_add(1, Ordering::AcqRel);
        assert!(window.awaiting_check());
        down.store(false, Ordering::SeqCst);
        watch.check_once().await.unwrap();
        assert!(!window.awaiting_check());
    }

    #[test]
    fn epoch_ids_differ() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| new_epoch_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids.iter().all(|id| id.len() == 32));
    }
}
