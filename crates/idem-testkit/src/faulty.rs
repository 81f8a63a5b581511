//! A [`Store`] in front of another that injects faults: a store that goes
//! down and comes back, fails a given call, answers late, never answers,
//! or does the work and loses the answer; and that counts every call.
//!
//! Tests put it where they would otherwise write a wrapper forwarding every
//! `Store` method by hand to change one. It is not a store of its own (the
//! inner store keeps the records) and not for production wrappers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Fence, Key, MemoryStore, Record, RecordId, Scope,
    Settled, StaleCursor, Store, StoreError, StoreErrorKind, Timestamp,
};

/// The operations of [`Store`], one each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreOp {
    /// [`Store::claim`].
    Claim,
    /// [`Store::complete`].
    Complete,
    /// [`Store::release`].
    Release,
    /// [`Store::extend_lease`].
    ExtendLease,
    /// [`Store::get`].
    Get,
    /// [`Store::purge_expired`].
    PurgeExpired,
    /// [`Store::list_stale`].
    ListStale,
    /// [`Store::find_by_key`].
    FindByKey,
    /// [`Store::advance_epoch`].
    AdvanceEpoch,
}

impl StoreOp {
    /// Every operation.
    pub const ALL: [StoreOp; 9] = [
        StoreOp::Claim,
        StoreOp::Complete,
        StoreOp::Release,
        StoreOp::ExtendLease,
        StoreOp::Get,
        StoreOp::PurgeExpired,
        StoreOp::ListStale,
        StoreOp::FindByKey,
        StoreOp::AdvanceEpoch,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// One call, as the fault hook sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// Which operation.
    pub op: StoreOp,
    /// How many calls of `op` came before this one (0 for the first).
    pub nth: u64,
}

/// What happens to a call.
#[derive(Debug)]
pub enum Fault {
    /// The call goes through.
    Pass,
    /// The call fails with this error without reaching the inner store.
    Fail(StoreError),
    /// The call reaches the inner store, and its answer is lost: the
    /// caller gets this error instead (a reply lost on the way back).
    LoseAnswer(StoreError),
    /// The call waits this long, then goes through.
    Delay(Duration),
    /// The call goes through, and its answer comes this much later.
    DelayAnswer(Duration),
    /// The call never answers, nor reaches the inner store.
    Stall,
    /// The call waits at the door until the test opens it, then goes
    /// through.
    Hold(Arc<Door>),
    /// The call goes through, and its answer waits at the door until the
    /// test opens it.
    HoldAnswer(Arc<Door>),
}

/// Where [`Fault::Hold`] and [`Fault::HoldAnswer`] keep calls until the
/// test opens it: a test that must act while a call is in flight (after
/// it passed the caller's checks, before it reaches the store) waits for
/// [`Door::arrived`], acts, and opens the door. No timing involved.
#[derive(Debug)]
pub struct Door {
    arrived: tokio::sync::Notify,
    open: tokio::sync::watch::Sender<bool>,
}

impl Door {
    /// A closed door.
    pub fn new() -> Arc<Door> {
        Arc::new(Door {
            arrived: tokio::sync::Notify::new(),
            open: tokio::sync::watch::channel(false).0,
        })
    }

    /// Waits until a call is waiting at the door (one wake-up per call;
    /// a call that arrived before this wait is not missed).
    pub async fn arrived(&self) {
        self.arrived.notified().await;
    }

    /// Lets every held call through, now and from now on.
    pub fn open(&self) {
        self.open.send_replace(true);
    }

    async fn wait(&self) {
        let mut open = self.open.subscribe();
        self.arrived.notify_one();
        // The sender lives in `self`: the channel never closes here.
        let _ = open.wait_for(|open| *open).await;
    }
}

type Hook = Box<dyn Fn(Call) -> Fault + Send + Sync>;

/// A store in front of `inner` that asks a hook what to do with each call
/// and can be switched down; see the [module](self).
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    hook: Hook,
    down: AtomicBool,
    calls: [AtomicU64; StoreOp::ALL.len()],
    answered: [AtomicU64; StoreOp::ALL.len()],
}

impl std::fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyStore")
            .field("down", &self.down)
            .field("calls", &self.calls)
            .finish_non_exhaustive()
    }
}

impl FaultyStore {
    /// In front of `inner`, passing every call until
    /// [`set_down`](Self::set_down).
    pub fn new(inner: Arc<dyn Store>) -> FaultyStore {
        FaultyStore::with_faults(inner, |_| Fault::Pass)
    }

    /// In front of `inner`, asking `hook` what to do with each call (while
    /// up).
    pub fn with_faults(
        inner: Arc<dyn Store>,
        hook: impl Fn(Call) -> Fault + Send + Sync + 'static,
    ) -> FaultyStore {
        FaultyStore {
            inner,
            hook: Box::new(hook),
            down: AtomicBool::new(false),
            calls: Default::default(),
            answered: Default::default(),
        }
    }

    /// A store that is down (in front of an empty memory store).
    pub fn unavailable() -> FaultyStore {
        let store = FaultyStore::new(Arc::new(MemoryStore::new()));
        store.set_down(true);
        store
    }

    /// A store whose every call never answers.
    pub fn stalled() -> FaultyStore {
        FaultyStore::with_faults(Arc::new(MemoryStore::new()), |_| Fault::Stall)
    }

    /// Down or up. While down, every call fails as unavailable (`test
    /// store is down`) without reaching the inner store or the hook.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// How many calls of `op` were made, failed ones included.
    pub fn calls(&self, op: StoreOp) -> u64 {
        self.calls[op.index()].load(Ordering::SeqCst)
    }

    /// How many calls of `op` were answered (with a result or an error).
    pub fn answered(&self, op: StoreOp) -> u64 {
        self.answered[op.index()].load(Ordering::SeqCst)
    }

    /// The store behind.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// Counts the call, then fails it (down), or does what the hook says
    /// around `forward`, which makes the inner store's call.
    fn intercept<'a, T: Send + 'a>(
        &'a self,
        op: StoreOp,
        forward: impl FnOnce() -> BoxFuture<'a, Result<T, StoreError>> + Send + 'a,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        Box::pin(async move {
            let nth = self.calls[op.index()].fetch_add(1, Ordering::SeqCst);
            let answer = self.decide(op, nth, forward).await;
            self.answered[op.index()].fetch_add(1, Ordering::SeqCst);
            answer
        })
    }

    /// What the call does: fails (down), or what the hook says.
    async fn decide<'a, T: Send + 'a>(
        &'a self,
        op: StoreOp,
        nth: u64,
        forward: impl FnOnce() -> BoxFuture<'a, Result<T, StoreError>> + Send + 'a,
    ) -> Result<T, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "test store is down",
            ));
        }
        match (self.hook)(Call { op, nth }) {
            Fault::Pass => forward().await,
            Fault::Fail(e) => Err(e),
            Fault::LoseAnswer(e) => {
                let _lost = forward().await;
                Err(e)
            }
            Fault::Delay(d) => {
                tokio::time::sleep(d).await;
                forward().await
            }
            Fault::DelayAnswer(d) => {
                let answer = forward().await;
                tokio::time::sleep(d).await;
                answer
            }
            Fault::Stall => std::future::pending().await,
            Fault::Hold(door) => {
                door.wait().await;
                forward().await
            }
            Fault::HoldAnswer(door) => {
                let answer = forward().await;
                door.wait().await;
                answer
            }
        }
    }
}

impl Store for FaultyStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        self.intercept(StoreOp::Claim, move || self.inner.claim(req))
    }
    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        completion: Completion,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        self.intercept(StoreOp::Complete, move || {
            self.inner.complete(id, fence, completion, now)
        })
    }
    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        self.intercept(StoreOp::Release, move || self.inner.release(id, fence, now))
    }
    fn extend_lease<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        lease_until: Timestamp,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        self.intercept(StoreOp::ExtendLease, move || {
            self.inner.extend_lease(id, fence, lease_until, now)
        })
    }
    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        self.intercept(StoreOp::Get, move || self.inner.get(id, now))
    }
    fn purge_expired(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'_, Result<usize, StoreError>> {
        self.intercept(StoreOp::PurgeExpired, move || {
            self.inner.purge_expired(now, limit)
        })
    }
    fn list_stale<'a>(
        &'a self,
        now: Timestamp,
        after: Option<&'a StaleCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        self.intercept(StoreOp::ListStale, move || {
            self.inner.list_stale(now, after, limit)
        })
    }
    fn find_by_key<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a Key,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        self.intercept(StoreOp::FindByKey, move || {
            self.inner.find_by_key(scope, key, now, limit)
        })
    }
    fn durability(&self) -> BoxFuture<'_, Result<idem_core::Durability, StoreError>> {
        self.inner.durability()
    }
    fn advance_epoch<'a>(
        &'a self,
        candidate: &'a str,
    ) -> BoxFuture<'a, Result<Vec<idem_core::EpochMark>, StoreError>> {
        self.intercept(StoreOp::AdvanceEpoch, move || {
            self.inner.advance_epoch(candidate)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{request, response, t0, unique_id};

    fn blip() -> StoreError {
        StoreError::new(StoreErrorKind::Unavailable, "blip")
    }

    #[tokio::test]
    async fn calls_pass_fail_and_are_counted_as_the_hook_says() {
        let store = FaultyStore::with_faults(Arc::new(MemoryStore::new()), |call| {
            match (call.op, call.nth) {
                (StoreOp::Complete, 0) => Fault::Fail(blip()),
                (StoreOp::Complete, 1) => Fault::LoseAnswer(blip()),
                (StoreOp::Get, _) => Fault::Delay(Duration::from_millis(1)),
                _ => Fault::Pass,
            }
        });
        let id = unique_id("faulty-store-01");
        let Claim::Acquired(lease) = store.claim(&request(&id, "{}", t0())).await.unwrap() else {
            panic!("a fresh key is acquired")
        };
        let done = Completion::completed(response(201, "done"));
        let failed = store.complete(&id, lease.fence, done.clone(), t0()).await;
        assert_eq!(failed.unwrap_err().to_string(), "blip");
        assert!(
            store
                .get(&id, t0())
                .await
                .unwrap()
                .unwrap()
                .response
                .is_none()
        );
        // The second completion reaches the inner store; its answer is lost.
        let lost = store.complete(&id, lease.fence, done.clone(), t0()).await;
        assert!(lost.is_err());
        let record = store.get(&id, t0()).await.unwrap().unwrap();
        assert_eq!(record.response, Some(done.response));
        assert_eq!(store.calls(StoreOp::Complete), 2);
        assert_eq!(store.calls(StoreOp::Get), 2);
        assert_eq!(store.calls(StoreOp::Release), 0);
    }

    #[tokio::test]
    async fn a_store_that_is_down_fails_every_call_until_it_is_up() {
        let store = FaultyStore::unavailable();
        let id = unique_id("faulty-store-02");
        let e = store.claim(&request(&id, "{}", t0())).await.unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
        assert!(
            store
                .purge_expired(t0(), 10)
                .await
                .unwrap_err()
                .is_unavailable()
        );
        store.set_down(false);
        assert!(matches!(
            store.claim(&request(&id, "{}", t0())).await.unwrap(),
            Claim::Acquired(_)
        ));
        assert_eq!(store.calls(StoreOp::Claim), 2);
    }

    #[tokio::test]
    async fn a_stalled_store_never_answers() {
        let store = FaultyStore::stalled();
        let id = unique_id("faulty-store-03");
        let waited = tokio::time::timeout(Duration::from_millis(20), store.get(&id, t0())).await;
        assert!(waited.is_err(), "answered: {waited:?}");
    }
}
