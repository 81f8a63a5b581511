//! Batches of claims, completions and releases sent as one statement each
//! (`batch.rs`), against the PostgreSQL named by `IDEM_TEST_POSTGRES_URL`,
//! checked by idem-testkit's `batches`: each call in a batch gets the
//! answer it would get alone, and a call that poisons its batch fails only
//! itself.

use idem_core::{BoxFuture, Claim, ClaimRequest, Operation, RecordId, Settled, StoreError};
use idem_testkit::batches;
use idem_testkit::{IsolatedBackend, unique_id};

use crate::PostgresStore;
use crate::batch::{self, CompletionCall, ReleaseCall};
use crate::tests::TestPostgres;

/// The store's batch functions, called directly with a batch of the
/// check's choosing (the batcher forms its own from whatever arrives).
fn claim_batch(
    store: &PostgresStore,
) -> impl Fn(Vec<ClaimRequest>) -> BoxFuture<'static, Vec<Result<Claim, StoreError>>> {
    let (pool, sql) = (store.inner.pool.clone(), store.inner.sql.clone());
    move |calls| Box::pin(batch::claims(pool.clone(), sql.clone(), calls))
}

fn complete_batch(
    store: &PostgresStore,
) -> impl Fn(Vec<CompletionCall>) -> BoxFuture<'static, Vec<Result<Settled, StoreError>>> {
    let (pool, sql) = (store.inner.pool.clone(), store.inner.sql.clone());
    move |calls| Box::pin(batch::completions(pool.clone(), sql.clone(), calls))
}

fn release_batch(
    store: &PostgresStore,
) -> impl Fn(Vec<ReleaseCall>) -> BoxFuture<'static, Vec<Result<Settled, StoreError>>> {
    let (pool, sql) = (store.inner.pool.clone(), store.inner.sql.clone());
    move |calls| Box::pin(batch::releases(pool.clone(), sql.clone(), calls))
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
        batches::a_mixed_batch_answers_each_claim_as_alone(store, &claim_batch(store)).await;
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
        batches::a_poisoned_claim_fails_only_itself(&claim_batch(store), &poisoned).await;
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
