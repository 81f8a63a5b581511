//! `idem demo --store-faults`: the layer's record store frozen, then closed
//! and reopened, mid-run.
//!
//! [`FaultyStore`] sits at the `Store` interface between the layer and its
//! store. Frozen, every call waits for the thaw before it reaches the store
//! (a long fsync, a failover pause); a call given up meanwhile (the layer's
//! store timeout, or its client gone) never reaches it. Restarting, every
//! call fails as unavailable; the old instance is dropped and a new one,
//! opened on the same data, takes its place. The epochs the layer's store
//! watch reads pass through here too: the demo sees any loss noticed.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Durability, EpochMark, EpochWatch, Fence, Key,
    Record, RecordId, Scope, Settled, StaleCursor, Store, StoreError, StoreErrorKind, StoreLoss,
    Timestamp,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long the store stays frozen.
pub(crate) const FREEZE: Duration = Duration::from_millis(1500);
/// How long the store stays closed before it is reopened.
pub(crate) const RESTART: Duration = Duration::from_secs(1);

/// Opens a new instance of the store on the same data.
pub(crate) type Reopen =
    Box<dyn Fn() -> BoxFuture<'static, anyhow::Result<Arc<dyn Store>>> + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    Frozen,
    Restarting,
}

/// The layer's store, frozen and restarted on demand.
pub(crate) struct FaultyStore {
    current: RwLock<Option<Arc<dyn Store>>>,
    phase: watch::Sender<Phase>,
    reopen: Reopen,
    /// Calls that met the freeze, those of them given up before the thaw,
    /// and calls failed while restarting.
    delayed: AtomicU64,
    gave_up: AtomicU64,
    failed: AtomicU64,
    /// Epoch checks answered, and the losses they showed.
    checks: AtomicU64,
    epochs: Mutex<(EpochWatch, Vec<StoreLoss>)>,
}

/// Counts a call that met the freeze as given up unless disarmed.
struct Waiting<'a>(Option<&'a AtomicU64>);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(counter) = self.0 {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl FaultyStore {
    pub(crate) fn new(store: Arc<dyn Store>, reopen: Reopen) -> FaultyStore {
        FaultyStore {
            current: RwLock::new(Some(store)),
            phase: watch::Sender::new(Phase::Running),
            reopen,
            delayed: AtomicU64::new(0),
            gave_up: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            checks: AtomicU64::new(0),
            epochs: Mutex::new((EpochWatch::new(), Vec::new())),
        }
    }

    /// Waits out a freeze; the instance to call, or the restart's refusal.
    async fn gate(&self) -> Result<Arc<dyn Store>, StoreError> {
        let mut phase = self.phase.subscribe();
        let mut waiting = Waiting(None);
        loop {
            match *phase.borrow_and_update() {
                Phase::Running => break,
                Phase::Frozen if waiting.0.is_none() => {
                    self.delayed.fetch_add(1, Ordering::Relaxed);
                    waiting.0 = Some(&self.gave_up);
                }
                Phase::Frozen => {}
                Phase::Restarting => {
                    waiting.0 = None;
                    return Err(self.restarting());
                }
            }
            // The sender lives as long as `self`: never an error.
            if phase.changed().await.is_err() {
                break;
            }
        }
        waiting.0 = None;
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        current.clone().ok_or_else(|| self.restarting())
    }

    fn restarting(&self) -> StoreError {
        self.failed.fetch_add(1, Ordering::Relaxed);
        StoreError::new(StoreErrorKind::Unavailable, "demo store: restarting")
    }

    /// Freezes the store, or (`false`) thaws it.
    pub(crate) fn freeze(&self, on: bool) {
        let phase = if on { Phase::Frozen } else { Phase::Running };
        self.phase.send_replace(phase);
    }

    /// Closes the store: calls fail from now on, and the handle on the old
    /// instance is dropped off the runtime (the last handle of a SQLite
    /// store joins its writer thread; calls still running hold theirs).
    pub(crate) fn close(&self) {
        self.phase.send_replace(Phase::Restarting);
        let old = self
            .current
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(tokio::task::spawn_blocking(move || drop(old)));
    }

    /// Opens a new instance and lets calls through to it.
    pub(crate) async fn reopen(&self) -> anyhow::Result<()> {
        let new = (self.reopen)().await?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(new);
        self.phase.send_replace(Phase::Running);
        Ok(())
    }

    fn observe(&self, marks: &[EpochMark]) {
        self.checks.fetch_add(1, Ordering::Relaxed);
        let mut epochs = self.epochs.lock().unwrap_or_else(PoisonError::into_inner);
        let losses = epochs.0.observe(marks);
        epochs.1.extend(losses);
    }

    /// `phases` (what [`schedule`] did) with the counts.
    pub(crate) fn summary(&self, phases: Summary) -> Summary {
        let epochs = self.epochs.lock().unwrap_or_else(PoisonError::into_inner);
        Summary {
            delayed: self.delayed.load(Ordering::Relaxed),
            gave_up: self.gave_up.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            checks: self.checks.load(Ordering::Relaxed),
            losses: epochs.1.iter().map(ToString::to_string).collect(),
            ..phases
        }
    }
}

/// What the schedule did, for the report.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    /// Intents done when the freeze began, and how long it lasted.
    pub(crate) freeze: Option<(usize, Duration)>,
    pub(crate) delayed: u64,
    pub(crate) gave_up: u64,
    /// Intents done when the restart began, and how long it lasted.
    pub(crate) restart: Option<(usize, Duration)>,
    pub(crate) failed: u64,
    /// Epoch checks answered, and the losses they showed.
    pub(crate) checks: u64,
    pub(crate) losses: Vec<String>,
}

/// Freezes the store when a quarter of the `total` intents are done, then
/// restarts it at 60%; answers the phases it ran. A phase not begun when
/// `stop` is cancelled is skipped; one begun runs to its end.
pub(crate) async fn schedule(
    store: Arc<FaultyStore>,
    done: Arc<AtomicUsize>,
    total: usize,
    stop: CancellationToken,
) -> anyhow::Result<Summary> {
    let mut phases = Summary::default();
    let Some(at) = reached(&done, total / 4, &stop).await else {
        return Ok(phases);
    };
    let began = Instant::now();
    store.freeze(true);
    tokio::time::sleep(FREEZE).await;
    store.freeze(false);
    phases.freeze = Some((at, began.elapsed()));
    let Some(at) = reached(&done, total * 3 / 5, &stop).await else {
        return Ok(phases);
    };
    let began = Instant::now();
    store.close();
    tokio::time::sleep(RESTART).await;
    store.reopen().await?;
    phases.restart = Some((at, began.elapsed()));
    Ok(phases)
}

/// Waits until `done` reaches `at`; `None` if `stop` came first.
async fn reached(done: &AtomicUsize, at: usize, stop: &CancellationToken) -> Option<usize> {
    loop {
        let n = done.load(Ordering::Relaxed);
        if n >= at {
            return Some(n);
        }
        tokio::select! {
            () = stop.cancelled() => return None,
            () = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
    }
}

impl Store for FaultyStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move { self.gate().await?.claim(req).await })
    }

    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        completion: Completion,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(async move {
            self.gate()
                .await?
                .complete(id, fence, completion, now)
                .await
        })
    }

    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(async move { self.gate().await?.release(id, fence, now).await })
    }

    fn extend_lease<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        lease_until: Timestamp,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(async move {
            let store = self.gate().await?;
            store.extend_lease(id, fence, lease_until, now).await
        })
    }

    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move { self.gate().await?.get(id, now).await })
    }

    fn purge_expired(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(async move { self.gate().await?.purge_expired(now, limit).await })
    }

    fn list_stale<'a>(
        &'a self,
        now: Timestamp,
        after: Option<&'a StaleCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        Box::pin(async move { self.gate().await?.list_stale(now, after, limit).await })
    }

    fn find_by_key<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a Key,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        Box::pin(async move {
            let store = self.gate().await?;
            store.find_by_key(scope, key, now, limit).await
        })
    }

    fn durability(&self) -> BoxFuture<'_, Result<Durability, StoreError>> {
        Box::pin(async move { self.gate().await?.durability().await })
    }

    fn advance_epoch<'a>(
        &'a self,
        candidate: &'a str,
    ) -> BoxFuture<'a, Result<Vec<EpochMark>, StoreError>> {
        Box::pin(async move {
            let marks = self.gate().await?.advance_epoch(candidate).await?;
            self.observe(&marks);
            Ok(marks)
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test: a panic is a failed assertion
mod tests {
    use super::*;
    use idem_core::{FieldSelection, Fingerprint, MemoryStore, Operation};

    fn request() -> ClaimRequest {
        let op = Operation::new("POST", "/transfers");
        let key = Key::new("k-0001-0002-0003").unwrap();
        ClaimRequest {
            id: RecordId::new(Scope::anonymous(), op.clone(), key),
            fingerprint: Fingerprint::compute(&op, None, b"{}", &FieldSelection::Whole),
            now: Timestamp::now(),
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(60),
        }
    }

    /// A wrapper whose reopen answers `next` (a new store on "the same
    /// data" is played by a store the test holds).
    fn wrapper(first: Arc<dyn Store>, next: Arc<dyn Store>) -> Arc<FaultyStore> {
        let reopen: Reopen = Box::new(move || {
            let next = next.clone();
            Box::pin(async move { Ok(next) })
        });
        Arc::new(FaultyStore::new(first, reopen))
    }

    #[tokio::test]
    async fn a_freeze_delays_calls_and_a_restart_fails_them_then_forwards_to_the_new_store() {
        let (first, second) = (Arc::new(MemoryStore::new()), Arc::new(MemoryStore::new()));
        let store = wrapper(first.clone(), second.clone());
        let req = request();

        // Frozen: the claim waits, and reaches the store only at the thaw.
        store.freeze(true);
        let (s, r) = (store.clone(), req.clone());
        let call = tokio::spawn(async move { s.claim(&r).await });
        while store.delayed.load(Ordering::Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
        assert!(!call.is_finished());
        assert!(first.get(&req.id, req.now).await.unwrap().is_none());
        // A call given up while frozen (the layer's store timeout) is
        // counted and never reaches the store.
        let given_up = tokio::time::timeout(Duration::ZERO, store.get(&req.id, req.now)).await;
        assert!(given_up.is_err());
        assert_eq!(store.gave_up.load(Ordering::Relaxed), 1);
        store.freeze(false);
        assert!(matches!(call.await.unwrap().unwrap(), Claim::Acquired(_)));
        let counts = store.summary(Summary::default());
        assert_eq!((counts.delayed, counts.gave_up), (2, 1));
        assert!(first.get(&req.id, req.now).await.unwrap().is_some());

        // Restarting: calls fail as unavailable, none reaches a store.
        store.close();
        assert!(store.claim(&req).await.unwrap_err().is_unavailable());
        assert!(store.advance_epoch("e").await.is_err());
        assert_eq!(store.failed.load(Ordering::Relaxed), 2);

        // Reopened: calls go to the new instance (which never saw the
        // claim; the old one would answer in flight).
        store.reopen().await.unwrap();
        let claim = store.claim(&req).await.unwrap();
        assert!(matches!(claim, Claim::Acquired(_)));
        assert!(second.get(&req.id, req.now).await.unwrap().is_some());
        assert!(store.durability().await.is_ok());
    }

    /// Reopened on the same data, the epoch goes on; on an empty store, it
    /// shows the loss.
    #[tokio::test]
    async fn the_epochs_read_through_it_show_a_reopen_that_forgot() {
        let kept: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let empty: Arc<dyn Store> = Arc::new(MemoryStore::new());
        for (next, losses) in [(kept.clone(), 0), (empty, 1)] {
            let store = wrapper(kept.clone(), next);
            store.advance_epoch("a").await.unwrap();
            store.close();
            store.reopen().await.unwrap();
            store.advance_epoch("b").await.unwrap();
            let summary = store.summary(Summary::default());
            assert_eq!((summary.checks, summary.losses.len()), (2, losses));
        }
    }
}
