//! Batches of claims, completions and releases sent as one statement each
//! (`batch.rs`), against the PostgreSQL named by `IDEM_TEST_POSTGRES_URL`:
//! each call in a batch gets the answer it would get alone, and a call
//! that poisons its batch fails only itself.

use idem_core::{Claim, ClaimRequest, Completion, Operation, RecordId, Settled, Status, Store};
use idem_testkit::{IsolatedBackend, request, response, t0, unique_id};

use crate::batch::{self, CompletionCall, ReleaseCall};
use crate::tests::TestPostgres;

/// The batch functions, called directly with a batch of the test's
/// choosing (the batcher forms its own from whatever arrives).
async fn claim_batch(
    store: &crate::PostgresStore,
    calls: Vec<ClaimRequest>,
) -> Vec<Result<Claim, idem_core::StoreError>> {
    batch::claims(store.inner.pool.clone(), store.inner.sql.clone(), calls).await
}

async fn complete_batch(
    store: &crate::PostgresStore,
    calls: Vec<CompletionCall>,
) -> Vec<Result<Settled, idem_core::StoreError>> {
    batch::completions(store.inner.pool.clone(), store.inner.sql.clone(), calls).await
}

async fn release_batch(
    store: &crate::PostgresStore,
    calls: Vec<ReleaseCall>,
) -> Vec<Result<Settled, idem_core::StoreError>> {
    batch::releases(store.inner.pool.clone(), store.inner.sql.clone(), calls).await
}

fn rt() -> tokio::runtime::Runtime {
    idem_testkit::runtime()
}

/// A claim of `id` acquired and completed with `tag`, at `t0`.
async fn finished(store: &crate::PostgresStore, id: &RecordId, body: &str, tag: &str) {
    let Claim::Acquired(lease) = store.claim(&request(id, body, t0())).await.unwrap() else {
        panic!("a fresh key was not acquired");
    };
    let done = Completion::completed(response(201, tag));
    assert_eq!(
        store.complete(id, lease.fence, done, t0()).await.unwrap(),
        Settled::Applied
    );
}

/// New keys (two of them sent twice), a key in flight, a finished key and
/// a finished key asked with another body, in one batch in a shuffled
/// order: each call gets its own answer, and each new key is acquired by
/// its first call only.
#[test]
fn a_mixed_batch_answers_each_claim_as_alone() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let guard = TestPostgres::fresh(&url).await;
        let store = guard.store();
        let (new_a, new_b, new_c) = (
            unique_id("new-aaaa-0000001"),
            unique_id("new-bbbb-0000001"),
            unique_id("new-cccc-0000001"),
        );
        let flying = unique_id("flying-000000001");
        let done = unique_id("finished-0000001");
        let other = unique_id("mismatch-0000001");
        let now = t0() + std::time::Duration::from_secs(1);
        assert!(matches!(
            store.claim(&request(&flying, "{}", t0())).await.unwrap(),
            Claim::Acquired(_)
        ));
        finished(store, &done, "{}", "done").await;
        finished(store, &other, "{\"a\":1}", "other").await;

        let calls: Vec<ClaimRequest> = vec![
            request(&new_b, "{}", now),
            request(&done, "{}", now),
            request(&new_a, "{}", now),
            request(&flying, "{}", now),
            request(&new_b, "{}", now),
            request(&other, "{\"a\":2}", now),
            request(&new_a, "{}", now),
            request(&new_c, "{}", now),
        ];
        let answers = claim_batch(store, calls).await;
        let kinds: Vec<&str> = answers
            .iter()
            .map(|a| match a {
                Ok(Claim::Acquired(_)) => "acquired",
                Ok(Claim::InFlight { .. }) => "in flight",
                Ok(Claim::Replay(r)) if r.status == Status::Completed => "replay",
                Ok(Claim::Mismatch { .. }) => "mismatch",
                Ok(_) => "other",
                Err(_) => "error",
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                "acquired",
                "replay",
                "acquired",
                "in flight",
                "in flight",
                "mismatch",
                "in flight",
                "acquired"
            ]
        );
        let Ok(Claim::Replay(r)) = &answers[1] else {
            unreachable!()
        };
        assert_eq!(r.response.as_ref().unwrap(), &response(201, "done"));
        // Distinct fences for the three acquired keys.
        let mut fences: Vec<u64> = answers
            .iter()
            .filter_map(|a| match a {
                Ok(Claim::Acquired(l)) => Some(l.fence.get()),
                _ => None,
            })
            .collect();
        fences.sort_unstable();
        fences.dedup();
        assert_eq!(fences.len(), 3);
    });
}

/// An operation the server cannot store (text with a NUL byte) poisons
/// the batch's statement: the batch is sent again a call at a time, and
/// only that call fails.
#[test]
fn a_poisoned_claim_fails_only_itself() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let guard = TestPostgres::fresh(&url).await;
        let store = guard.store();
        let good = unique_id("good-0000000001");
        let also = unique_id("good-0000000002");
        let poisoned = RecordId::new(
            good.scope.clone(),
            Operation::from_raw("POST /nul\0here"),
            good.key.clone(),
        );
        let calls = vec![
            request(&good, "{}", t0()),
            request(&poisoned, "{}", t0()),
            request(&also, "{}", t0()),
        ];
        let answers = claim_batch(store, calls).await;
        assert!(
            matches!(answers[0], Ok(Claim::Acquired(_))),
            "{:?}",
            answers[0]
        );
        assert!(answers[1].is_err(), "{:?}", answers[1]);
        assert!(
            matches!(answers[2], Ok(Claim::Acquired(_))),
            "{:?}",
            answers[2]
        );
    });
}

/// Completions and releases in batches: a call whose fence holds its
/// record applies, one whose fence is stale (or whose record another call
/// of the batch settled first) does not, each as alone.
#[test]
fn batched_completions_and_releases_apply_only_under_their_fence() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let guard = TestPostgres::fresh(&url).await;
        let store = guard.store();
        let ids: Vec<RecordId> = (0..4)
            .map(|n| unique_id(&format!("settle-{n:010}")))
            .collect();
        let mut fences = Vec::new();
        for id in &ids {
            let Claim::Acquired(lease) = store.claim(&request(id, "{}", t0())).await.unwrap()
            else {
                panic!("not acquired");
            };
            fences.push(lease.fence.to_i64().unwrap());
        }
        let done = |tag: &str| Completion::completed(response(201, tag));
        let completions = vec![
            (ids[0].clone(), fences[0], done("zero")),
            (ids[1].clone(), fences[1] + 1000, done("stale")),
            (ids[0].clone(), fences[0], done("again")),
        ];
        let answers = complete_batch(store, completions).await;
        let answers: Vec<Settled> = answers.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            answers,
            vec![Settled::Applied, Settled::StaleFence, Settled::StaleFence]
        );
        let record = store.get(&ids[0], t0()).await.unwrap().unwrap();
        assert_eq!(record.response.unwrap(), response(201, "zero"));

        let releases = vec![
            (ids[2].clone(), fences[2]),
            (ids[3].clone(), fences[3] + 1000),
            (ids[0].clone(), fences[0]),
        ];
        let answers = release_batch(store, releases).await;
        let answers: Vec<Settled> = answers.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            answers,
            vec![Settled::Applied, Settled::StaleFence, Settled::StaleFence]
        );
        assert!(store.get(&ids[2], t0()).await.unwrap().is_none());
        assert!(store.get(&ids[3], t0()).await.unwrap().is_some());
        assert_eq!(
            store.get(&ids[0], t0()).await.unwrap().unwrap().status,
            Status::Completed
        );
    });
}
