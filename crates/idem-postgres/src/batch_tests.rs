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
use idem_core::batch::OnRefusal;

use crate::batch::{self, CompletionCall, ReleaseCall};
use crate::tests::TestPostgres;

/// The store's batch functions, called directly with a batch of the
/// check's choosing (the batcher forms its own from whatever arrives).
/// With `OnRefusal::FailAll`, a batch the server refused fails every call,
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
            OnRefusal::FailAll,
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
            OnRefusal::FailAll,
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
            &claim_batch(store, OnRefusal::FailAll),
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
fn a_borrowed_fence_in_a_batch_takes_no_other_answer() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let guard = TestPostgres::fresh(&url).await;
        let store = guard.store();
        batches::a_borrowed_fence_in_a_batch_takes_no_other_answer(store, &complete_batch(store))
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

/// Waits (30 s at most) until a backend waits on a lock held by the
/// backend `pid`, or no batch is left to wait for (`done`).
async fn wait_until_blocked_by(store: &PostgresStore, pid: i32, done: impl Fn() -> bool) -> bool {
    let watcher = store.pool().get().await.unwrap();
    let blocked = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            let waiting: i64 = watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))",
                    &[&pid],
                )
                .await
                .unwrap()
                .get(0);
            if waiting > 0 {
                return true;
            }
            if done() {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    blocked.expect("neither blocked nor done within 30 s")
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
            OnRefusal::FailAll,
        ));
        // The batch waits on the held insert.
        let holder_pid: i32 = held
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        assert!(
            wait_until_blocked_by(store, holder_pid, || false).await,
            "the batch never waited"
        );
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

/// Two calls for one id with different bodies, the first meeting a record
/// that vanishes (a purge or release) before the second would be
/// inserted: an acquired call is always answered with its own record (its
/// fingerprint, its fence), never with one built from the other call's
/// request. A trigger holds the second call's insert, should the batch
/// try it, until the record has been deleted.
#[test]
fn a_record_that_vanishes_mid_batch_never_gives_one_call_anothers_record() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let guard = TestPostgres::fresh(&url).await;
        let store = guard.store();
        let s = store.schema();
        let id = unique_id("vanishing-000001");
        assert!(matches!(
            store.claim(&request(&id, "{}", t0())).await,
            Ok(Claim::Acquired(_))
        ));
        let calls = vec![
            request(&id, "{\"call\":1}", t0()),
            request(&id, "{\"call\":2}", t0()),
        ];
        let second: String = calls[1]
            .fingerprint
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let lock_key: i64 = (0x6964_656d_i64 << 32) | i64::from(std::process::id());
        let admin = store.pool().get().await.unwrap();
        admin
            .batch_execute(&format!(
                "CREATE FUNCTION {s}.hold_second() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN IF NEW.fingerprint = '\\x{second}'::bytea THEN \
                 PERFORM pg_advisory_xact_lock_shared({lock_key}); END IF; RETURN NEW; END $$; \
                 CREATE TRIGGER hold_second BEFORE INSERT ON {s}.idem_records \
                 FOR EACH ROW EXECUTE FUNCTION {s}.hold_second();"
            ))
            .await
            .unwrap();
        let gate = store.pool().get().await.unwrap();
        gate.execute("SELECT pg_advisory_lock($1)", &[&lock_key])
            .await
            .unwrap();
        let gate_pid: i32 = gate
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        let batch = tokio::spawn(batch::claims(
            store.inner.pool.clone(),
            store.inner.sql.clone(),
            calls.clone(),
            OnRefusal::FailAll,
        ));
        if wait_until_blocked_by(store, gate_pid, || batch.is_finished()).await {
            // The batch tried the second call's insert: the record the
            // first call met vanishes now.
            admin
                .execute(
                    &format!(
                        "DELETE FROM {s}.idem_records \
                         WHERE scope = $1 AND operation = $2 AND key = $3"
                    ),
                    &[&id.scope.as_str(), &id.operation.as_str(), &id.key.as_str()],
                )
                .await
                .unwrap();
        }
        gate.execute("SELECT pg_advisory_unlock($1)", &[&lock_key])
            .await
            .unwrap();
        let answers = batch.await.unwrap();
        let stored = store.get(&id, t0()).await.unwrap();
        let mut acquired = 0;
        for (call, answer) in calls.iter().zip(&answers) {
            assert!(answer.is_ok(), "{answer:?}");
            if let Ok(Claim::Acquired(lease)) = answer {
                acquired += 1;
                let record = stored.as_ref().expect("an acquired call has a record");
                assert_eq!(
                    record.fingerprint, call.fingerprint,
                    "a call was answered acquired with another call's record"
                );
                assert_eq!(record.fence, lease.fence);
            }
        }
        assert!(acquired <= 1, "{answers:?}");
    });
}
