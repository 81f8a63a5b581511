//! Security review of the layer: a store blip at the wrong moment must
//! not let the layer report a success it has not recorded, as long as the
//! store comes back within the lease.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Fence, Key, MemoryStore, Operation, Record,
    RecordId, Scope, Settled, StaleCursor, Status, Store, StoreError, StoreErrorKind, Timestamp,
};
use support::{key, spawn_app};

/// A memory store whose next `fail` completions fail as unavailable.
#[derive(Default)]
struct LosesCompletions {
    inner: MemoryStore,
    fail: AtomicU32,
}

impl Store for LosesCompletions {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        self.inner.claim(req)
    }
    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        c: Completion,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        let failing = self
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Box::pin(async { Err(StoreError::new(StoreErrorKind::Unavailable, "blip")) });
        }
        self.inner.complete(id, fence, c, now)
    }
    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        self.inner.release(id, fence, now)
    }
    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        self.inner.get(id, now)
    }
    fn purge_expired(&self, now: Timestamp, n: usize) -> BoxFuture<'_, Result<usize, StoreError>> {
        self.inner.purge_expired(now, n)
    }
    fn list_stale<'a>(
        &'a self,
        now: Timestamp,
        after: Option<&'a StaleCursor>,
        n: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        self.inner.list_stale(now, after, n)
    }
    fn find_by_key<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a Key,
        now: Timestamp,
        n: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        self.inner.find_by_key(scope, key, now, n)
    }
}

/// docs/contract.md, *Records and their state machine*: "a completed record is durable before its
/// response leaves the server". A store that fails several completions in
/// a row and then answers: the client's 201 leaves only once the record is
/// completed, and the retry replays it. (A store that stays down for the
/// whole lease is the documented limit: the client still gets its answer,
/// and the record stays in progress until recovery.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_leaves_only_with_its_record_when_the_store_recovers() {
    let store = Arc::new(LosesCompletions::default());
    let shared: Arc<dyn Store> = store.clone();
    let app = spawn_app(shared, |b| b.store_timeout(Duration::from_millis(200))).await;
    let k = key();
    store.fail.store(4, Ordering::SeqCst);
    let first = app.post("/orders", &k, "{}").send().await.unwrap().status();
    assert_eq!(first, 201);
    assert_eq!(
        store.fail.load(Ordering::SeqCst),
        0,
        "every failure was retried"
    );
    let id = RecordId::new(
        Scope::anonymous(),
        Operation::new("POST", "/orders"),
        Key::new(k.clone()).unwrap(),
    );
    let record = store.get(&id, Timestamp::now()).await.unwrap();
    assert_eq!(record.map(|r| r.status), Some(Status::Completed));
    let retry = app.post("/orders", &k, "{}").send().await.unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(app.executions(), 1);
}
