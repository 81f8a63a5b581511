//! Batches of claims, completions and releases sent as one statement each
//! (`batch.rs`), against the PostgreSQL named by `IDEM_TEST_POSTGRES_URL`,
//! checked by idem-testkit's `batches`: each call in a batch gets the
//! answer it would get alone, and a call that poisons its batch fails only
//! itself.

use idem_core::Store;
use idem_core::{BoxFuture, Claim, ClaimRequest, Operation, RecordId, Settled, StoreError};
use idem_testkit::batches;
use idem_testkit::{IsolatedBackend, request, t0, unique_id};

use crate::PostgresStore;
use crate::batch::{self, CompletionCall, OnRefusal, ReleaseCall};
use crate::tests::TestPostgres;

/// The store's batch functions, called directly with a batch of the
/// check's choosing (the batcher forms its own from whatever arrives).
/// With `OnRefusal::Fail`, a batch the server refused fails every call,
/// so that a check passes only on the batch statement's own answers (the
/// single path would give the same answers, and hide a broken batch).
fn claim_batch(
    store: &PostgresStore,
    on_refusal: OnRefusal,
) -> impl Fn(Vec<ClaimRequest>) -> BoxFuture<'static, Vec<Result<Claim, StoreError>>> {
    let (pool, sql) = (store.inner.pool.clone(), store.inner.sql.clone());
    move |calls| Box::pin(batch::claims(pool.clone(), sql.clone(), calls, on_refusal))
}

fn complete_batch(
    store: &PostgresStore,
) -> impl Fn(Vec<CompletionCall>) -> BoxFuture<'static, Vec<Result<Settled, StoreError>>> {
    let (pool, sql) = (store.inner.pool.clone(), store.inner.sql.clone());
    move |calls| {
        Box::pin(batch::completions(
            pool.clone(),
            sql.clone(),
            calls,
            OnRefusal::Fail,
        ))
    }
}

fn release_batch(
    store: &PostgresStore,
) -> impl Fn(Vec<ReleaseCall>) -> BoxFuture<'static, Vec<Result<Settled, StoreError>>> {
    let (pool, sql) = (store.inner.pool.clone(), store.inner.sql.clone());
    move |calls| {
        Box::pin(batch::releases(
            pool.clone(),
            sql.clone(),
            calls,
            OnRefusal::Fail,
        ))
    }
}

fn rt() -> tokio::runtime::Runtime {
    idem_testkit::runtime()
}

#[test]
fn a_mixed_batch_answers_each_claim_as_alone() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let guard = TestPostgres::fresh(&url).await;
        let store = guard.store();
        batches::a_mixed_batch_answers_each_claim_as_alone(
            store,
            &claim_batch(store, OnRefusal::Fail),
        )
        .await;
    });
}

/// An operation the server cannot store (text with a NUL byte).
#[test]
fn a_poisoned_claim_fails_only_itself() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let guard = TestPostgres::fresh(&url).await;
        let store = guard.store();
        let id = unique_id("poisoned-0000001");
        let poisoned = RecordId::new(id.scope, Operation::from_raw("POST /zz-nul\0here"), id.key);
        batches::a_poisoned_claim_fails_only_itself(
            &claim_batch(store, OnRefusal::OneAtATime),
            &poisoned,
        )
        .await;
    });
}

#[test]
fn batched_completions_and_releases_apply_only_under_their_fence() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let guard = TestPostgres::fresh(&url).await;
        let store = guard.store();
        batches::batched_completions_and_releases_apply_only_under_their_fence(
            store,
            &complete_batch(store),
            &release_batch(store),
        )
        .await;
    });
}

/// A batch waiting on another transaction's insert of its first key draws
/// its second key's fence only when it inserts that key. A claim of the
/// second key that came and went meanwhile (its fence handed out, then
/// released) is followed by a larger fence, never a smaller one: fences
/// grow (docs/contract.md).
#[test]
fn a_waiting_batch_draws_each_fence_when_it_inserts() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let guard = TestPostgres::fresh(&url).await;
        let store = guard.store();
        let first = unique_id("waited-on-000001");
        let second = RecordId::new(
            first.scope.clone(),
            first.operation.clone(),
            idem_core::Key::new("waited-on-000002").unwrap(),
        );
        let s = store.schema();
        // Another transaction's insert of the first key, not yet ended.
        let mut holder = store.pool().get().await.unwrap();
        let held = holder.transaction().await.unwrap();
        held.execute(
            &format!(
                "INSERT INTO {s}.idem_records (scope, operation, key, fingerprint, status, \
                 fence, created_at, lease_until, expires_at) \
                 VALUES ($1, $2, $3, '\\x00', 0, 1, 0, 1, 1)"
            ),
            &[
                &first.scope.as_str(),
                &first.operation.as_str(),
                &first.key.as_str(),
            ],
        )
        .await
        .unwrap();
        let batch = tokio::spawn(batch::claims(
            store.inner.pool.clone(),
            store.inner.sql.clone(),
            vec![request(&first, "{}", t0()), request(&second, "{}", t0())],
            OnRefusal::Fail,
        ));
        // The batch waits on the held insert.
        let watcher = store.pool().get().await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(30), async {
            loop {
                let waiting: i64 = watcher
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                         AND query LIKE '%idem_claim_many%'",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get(0);
                if waiting > 0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the batch never waited on the held insert");
        // Meanwhile the second key is claimed alone and released.
        let Ok(Claim::Acquired(meanwhile)) = store.claim(&request(&second, "{}", t0())).await
        else {
            panic!("the second key was not acquired alone");
        };
        assert_eq!(
            store.release(&second, meanwhile.fence, t0()).await.ok(),
            Some(Settled::Applied)
        );
        held.rollback().await.unwrap();
        let answers = batch.await.unwrap();
        assert!(
            matches!(answers[0], Ok(Claim::Acquired(_))),
            "{:?}",
            answers[0]
        );
        let Ok(Claim::Acquired(later)) = &answers[1] else {
            panic!("{:?}", answers[1]);
        };
        assert!(
            later.fence > meanwhile.fence,
            "the batch stored fence {:?} after {:?} was handed out",
            later.fence,
            meanwhile.fence
        );
    });
}
