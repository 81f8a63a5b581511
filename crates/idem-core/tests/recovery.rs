//! Recovery ([`reconcile_once`]) against [`MemoryStore`]: the application's
//! answers are applied with the record's fence, and a late executor and the
//! reconciler never both win.
//!
//! Integration tests rather than unit tests: the fixtures come from
//! idem-testkit, which links this crate as a library.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::Mutex;
use std::time::Duration;

use idem_core::{
    BoxFuture, Claim, Completion, Lease, MemoryStore, Reconcile, ReconcileReport, Record, RecordId,
    Resolution, Settled, Status, Store, reconcile_once,
};
use idem_testkit::{LEASE, request, response, t0, unique_id};

/// The application's state: which keys it knows the outcome of.
#[derive(Default)]
struct App {
    answers: Mutex<HashMap<RecordId, Resolution>>,
}

impl Reconcile for App {
    fn resolve<'a>(
        &'a self,
        r: &'a Record,
    ) -> BoxFuture<'a, Result<Resolution, Box<dyn StdError + Send + Sync>>> {
        let answer = self.answers.lock().unwrap().get(&r.id).cloned();
        Box::pin(async move { answer.ok_or_else(|| "unknown to the application".into()) })
    }
}

async fn claim(store: &MemoryStore, id: &RecordId) -> Lease {
    match store.claim(&request(id, "{}", t0())).await.unwrap() {
        Claim::Acquired(l) => l,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn stale_records_are_completed_released_or_left_as_the_application_says() {
    let store = MemoryStore::new();
    let app = App::default();
    let ids: Vec<_> = (0..7)
        .map(|i| unique_id(&format!("recover-key-{i:05}")))
        .collect();
    for id in &ids {
        claim(&store, id).await;
    }
    {
        let mut a = app.answers.lock().unwrap();
        for id in &ids[0..3] {
            a.insert(
                id.clone(),
                Resolution::Complete(Completion::completed(response(201, "from state"))),
            );
        }
        for id in &ids[3..5] {
            a.insert(id.clone(), Resolution::Release);
        }
        a.insert(ids[5].clone(), Resolution::Leave);
        // ids[6]: the application errs.
    }
    // Before the lease ends there is nothing to do.
    assert_eq!(
        reconcile_once(&store, &app, t0(), 2).await.unwrap(),
        ReconcileReport::default()
    );
    let now = t0() + LEASE;
    let report = reconcile_once(&store, &app, now, 2).await.unwrap();
    assert_eq!(
        report,
        ReconcileReport {
            completed: 3,
            released: 2,
            left: 2,
            superseded: 0
        }
    );
    for id in &ids[0..3] {
        let r = store.get(id, now).await.unwrap().unwrap();
        assert_eq!(r.status, Status::Completed);
        assert_eq!(r.response, Some(response(201, "from state")));
    }
    for id in &ids[3..5] {
        assert_eq!(store.get(id, now).await.unwrap(), None);
    }
    for id in &ids[5..7] {
        assert_eq!(
            store.get(id, now).await.unwrap().unwrap().status,
            Status::InProgress
        );
    }
}

/// A late executor and the reconciler race for one record: whichever
/// lands first wins, and the other changes nothing.
#[tokio::test]
async fn a_late_executor_and_the_reconciler_leave_exactly_one_outcome() {
    let now = t0() + LEASE + Duration::from_secs(1);
    // The executor finishes first: the reconciler's release is refused.
    let store = MemoryStore::new();
    let id = unique_id("race-late-exec-1");
    let lease = claim(&store, &id).await;
    let stale = store.list_stale(now, None, 10).await.unwrap();
    assert_eq!(stale.len(), 1);
    let done = Completion::completed(response(201, "executor"));
    assert_eq!(
        store.complete(&id, lease.fence, done, now).await.unwrap(),
        Settled::Applied
    );
    let app = App::default();
    app.answers
        .lock()
        .unwrap()
        .insert(id.clone(), Resolution::Release);
    // The reconciler acts on what it listed before the executor finished.
    let r = &stale[0];
    assert_eq!(
        store.release(&r.id, r.fence, now).await.unwrap(),
        Settled::StaleFence
    );
    assert_eq!(
        store.get(&id, now).await.unwrap().unwrap().response,
        Some(response(201, "executor"))
    );

    // The reconciler releases first: the late executor cannot complete.
    let id = unique_id("race-late-exec-2");
    let lease = claim(&store, &id).await;
    app.answers
        .lock()
        .unwrap()
        .insert(id.clone(), Resolution::Release);
    let report = reconcile_once(&store, &app, now, 10).await.unwrap();
    assert_eq!(report.released, 1);
    let late = Completion::completed(response(201, "too late"));
    assert_eq!(
        store.complete(&id, lease.fence, late, now).await.unwrap(),
        Settled::StaleFence
    );
    assert_eq!(store.get(&id, now).await.unwrap(), None);

    // Concurrently, many times: exactly one of the two wins each time.
    for round in 0..50 {
        let id = unique_id(&format!("race-conc-{round:05}"));
        let lease = claim(&store, &id).await;
        let store_ref = &store;
        let (exec, rec) = tokio::join!(
            async {
                store_ref
                    .complete(
                        &id,
                        lease.fence,
                        Completion::completed(response(201, "x")),
                        now,
                    )
                    .await
                    .unwrap()
            },
            async { store_ref.release(&id, lease.fence, now).await.unwrap() },
        );
        assert_ne!(exec, rec, "round {round}: exactly one applied");
    }
}
