//! Security review of the layer: a store blip at the wrong moment must
//! not let the layer report a success it has not recorded, as long as the
//! store comes back within the lease.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_core::{
    Key, MemoryStore, Operation, RecordId, Scope, Status, Store, StoreError, StoreErrorKind,
    Timestamp,
};
use idem_testkit::{Fault, FaultyStore, StoreOp};
use support::{key, spawn_app};

/// A memory store whose next `fail` completions fail as unavailable.
fn loses_completions(fail: Arc<AtomicU32>) -> FaultyStore {
    FaultyStore::with_faults(Arc::new(MemoryStore::new()), move |call| {
        let failing = call.op == StoreOp::Complete
            && fail
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if failing {
            Fault::Fail(StoreError::new(StoreErrorKind::Unavailable, "blip"))
        } else {
            Fault::Pass
        }
    })
}

/// docs/contract.md, *Records and their state machine*: "a completed record is durable before its
/// response leaves the server". A store that fails several completions in
/// a row and then answers (within the two seconds an answer waits for its
/// completion): the client's 201 leaves only once the record is completed,
/// and the retry replays it. (A store that stays down longer: the answer
/// leaves and its completion is held and retried, `tests/store_faults.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_leaves_only_with_its_record_when_the_store_recovers() {
    let fail = Arc::new(AtomicU32::new(0));
    let store = Arc::new(loses_completions(fail.clone()));
    let shared: Arc<dyn Store> = store.clone();
    let app = spawn_app(shared, |b| b.store_timeout(Duration::from_millis(200))).await;
    let k = key();
    fail.store(4, Ordering::SeqCst);
    let first = app.post("/orders", &k, "{}").send().await.unwrap().status();
    assert_eq!(first, 201);
    assert_eq!(fail.load(Ordering::SeqCst), 0, "every failure was retried");
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
