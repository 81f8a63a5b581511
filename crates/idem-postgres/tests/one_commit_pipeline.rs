//! The pipelined one-commit mode (BEGIN pipelined with the claim, the
//! completion pipelined with COMMIT, the mutation on the pooled
//! connection) against what a reviewer threw at it: a completion that
//! fails in the client before it is sent (a body too large to send: about
//! 5 GB of memory for a few seconds), a mutation that swallows an error, a
//! panicking mutation, and (ignored, run alone) a BEGIN cancelled by
//! another session. None may commit a mutation without its record, or
//! leave a claim behind.
#![allow(clippy::unwrap_used, clippy::panic, clippy::expect_used)] // a test crate

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use idem_core::{
    Atomic, ClaimRequest, ClaimedAtomically, Completion, RecordId, Status, StoredResponse,
    Timestamp,
};
use idem_postgres::PostgresStore;
use idem_testkit::{LEASE, request, response, t0, unique_id};

mod common;
use common::{rows, url};

async fn fresh(url: &str, pool: usize) -> PostgresStore {
    common::fresh(url, pool, "atkpl").await
}

/// Raw record status straight from the table (None: no row).
async fn raw_status(store: &PostgresStore, id: &RecordId) -> Option<i16> {
    let s = store.schema();
    store
        .pool()
        .get()
        .await
        .unwrap()
        .query_opt(
            &format!(
                "SELECT status FROM {s}.idem_records WHERE scope = $1 AND operation = $2 AND key = $3"
            ),
            &[&id.scope.as_str(), &id.operation.as_str(), &id.key.as_str()],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

/// Inserts a transfer row, then returns `completion`.
async fn run_with(
    store: &PostgresStore,
    req: &ClaimRequest,
    completion: Completion,
) -> Result<ClaimedAtomically<(), String>, idem_core::StoreError> {
    let s = store.schema().to_owned();
    let (key, scope) = (
        req.id.key.as_str().to_owned(),
        req.id.scope.as_str().to_owned(),
    );
    store
        .claim_and_complete_atomically(req, move |c, _fence| {
            Box::pin(async move {
                common::insert_transfer(c, &s, &key, &scope)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(((), completion))
            })
        })
        .await
}

/// A completion that cannot be encoded client-side (a Bind message over
/// i32::MAX bytes: "value too large to transmit") is never sent, but the
/// COMMIT pipelined behind it is: the mutation and an in-progress claim
/// commit, the caller gets an error, and after the lease a retry takes
/// over and runs the mutation a second time.
///
/// Needs about 5 GB of memory.
#[test]
fn an_unsendable_completion_commits_nothing() {
    let Some(url) = url() else { return };
    idem_testkit::runtime().block_on(async {
        let store = fresh(&url, 2).await;
        let id = unique_id("unsendable-completion");
        let req = request(&id, "{}", t0());
        let huge = StoredResponse {
            status: 200,
            headers: vec![],
            body: vec![7u8; 1 << 31],
            trailers: Vec::new(),
        };
        let out = run_with(&store, &req, Completion::completed(huge)).await;
        eprintln!("answer: {out:?}");
        let (n, st) = (rows(&store, &id).await, raw_status(&store, &id).await);
        eprintln!("after the error: transfer rows {n}, record status {st:?}");
        // A retry after the lease (a redelivery) executes again.
        let later = request(&id, "{}", t0() + LEASE);
        let again = run_with(
            &store,
            &later,
            Completion::completed(response(200, "retry")),
        )
        .await;
        eprintln!("retry after the lease: {again:?}");
        let n2 = rows(&store, &id).await;
        eprintln!("transfer rows after the retry: {n2}");
        let _ = store.drop_schema().await;
        assert!(out.is_err(), "{out:?}");
        assert_eq!(n, 0, "the mutation committed although the call failed");
        assert_eq!(st, None, "the claim committed although the call failed");
        assert_eq!(n2, 1, "the mutation ran twice");
    });
}

/// A mutation that swallows its own error (leaving the transaction
/// aborted, here with a division by zero) and answers Ok: the completion
/// fails, nothing commits, the error is not read as a stale fence, and a
/// pool of one serves on.
#[test]
fn a_mutation_that_swallows_a_division_by_zero_commits_nothing() {
    let Some(url) = url() else { return };
    idem_testkit::runtime().block_on(async {
        let store = fresh(&url, 1).await;
        let id = unique_id("swallowed-div0");
        let req = request(&id, "{}", t0());
        let s = store.schema().to_owned();
        let (key, scope) = (id.key.as_str().to_owned(), id.scope.as_str().to_owned());
        let out = store
            .claim_and_complete_atomically(&req, move |c, _fence| {
                Box::pin(async move {
                    common::insert_transfer(c, &s, &key, &scope)
                        .await
                        .map_err(|e| e.to_string())?;
                    let swallowed = c.execute("SELECT 1 / 0", &[]).await;
                    assert!(swallowed.is_err());
                    Ok::<_, String>(((), Completion::completed(response(200, "x"))))
                })
            })
            .await;
        eprintln!("answer: {out:?}");
        assert!(
            !matches!(out, Ok(ClaimedAtomically::Ran(Atomic::Committed(_)))),
            "{out:?}"
        );
        assert_eq!(rows(&store, &id).await, 0);
        assert_eq!(raw_status(&store, &id).await, None);
        for i in 0..5 {
            let id = unique_id(&format!("after-div0-{i}"));
            let out = run_with(
                &store,
                &request(&id, "{}", t0()),
                Completion::completed(response(200, "y")),
            )
            .await
            .unwrap();
            assert!(matches!(out, ClaimedAtomically::Ran(Atomic::Committed(_))));
            assert_eq!(rows(&store, &id).await, 1);
        }
        let _ = store.drop_schema().await;
    });
}

/// A mutation that panics after its insert, under catch_unwind as the
/// consumer calls it: nothing commits, the key runs once afterwards, and
/// a pool of one serves on (the connection was closed, not returned).
#[test]
fn a_panicking_mutation_commits_nothing_and_the_pool_serves() {
    let Some(url) = url() else { return };
    idem_testkit::runtime().block_on(async {
        let store = fresh(&url, 1).await;
        for round in 0..5 {
            let id = unique_id(&format!("panicking-{round}"));
            let req = request(&id, "{}", t0());
            let s = store.schema().to_owned();
            let (key, scope) = (id.key.as_str().to_owned(), id.scope.as_str().to_owned());
            let caught = std::panic::AssertUnwindSafe(store.claim_and_complete_atomically(
                &req,
                move |c, _fence| {
                    Box::pin(async move {
                        common::insert_transfer(c, &s, &key, &scope)
                            .await
                            .map_err(|e| e.to_string())?;
                        if round < 100 {
                            panic!("the effect panics");
                        }
                        Ok::<_, String>(((), Completion::completed(response(200, "x"))))
                    })
                },
            ))
            .catch_unwind()
            .await;
            assert!(caught.is_err());
            let out = run_with(&store, &req, Completion::completed(response(200, "y")))
                .await
                .unwrap();
            assert!(
                matches!(out, ClaimedAtomically::Ran(Atomic::Committed(_))),
                "{out:?}"
            );
            assert_eq!(rows(&store, &id).await, 1);
            let rec = idem_core::Store::get(&store, &id, t0())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(rec.status, Status::Completed);
        }
        let _ = store.drop_schema().await;
    });
}

/// BEGIN and the claim's insert are separate protocol messages: if BEGIN
/// fails in the server (here: a query cancel landing on it), the insert
/// runs in autocommit and its claim commits although the call fails.
/// Probabilistic: a canceller hammers the pool's only backend. Run alone:
/// `cargo test -p idem-postgres --test attack_one_commit_pipeline -- --ignored cancel`
#[test]
#[ignore = "probabilistic, cancels backends; run alone"]
fn a_cancel_on_begin_never_commits_a_claim() {
    let Some(url) = url() else { return };
    idem_testkit::runtime().block_on(async {
        let store = fresh(&url, 1).await;
        let s = store.schema().to_owned();
        let stop = Arc::new(AtomicBool::new(false));
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let halt = stop.clone();
        let cancels = Arc::new(AtomicUsize::new(0));
        let counted = cancels.clone();
        let pid = Arc::new(std::sync::atomic::AtomicI32::new(0));
        {
            let c = store.pool().get().await.unwrap();
            let p: i32 = c.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
            pid.store(p, Ordering::Relaxed);
        }
        let target = pid.clone();
        let canceller = tokio::spawn(async move {
            let stmt = client.prepare("SELECT pg_cancel_backend($1)").await.unwrap();
            while !halt.load(Ordering::Relaxed) {
                let p = target.load(Ordering::Relaxed);
                if let Ok(r) = client.query_one(&stmt, &[&p]).await
                    && r.get::<_, bool>(0)
                {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        let _ = &s;
        let (checker, conn2) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn2);
        let check_sql = format!(
            "SELECT status FROM {s}.idem_records WHERE scope = $1 AND operation = $2 AND key = $3"
        );
        let mut other_errors = std::collections::BTreeMap::<String, usize>::new();
        let mut begin_errors = 0;
        let mut leaked = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let mut i = 0;
        while std::time::Instant::now() < deadline && leaked.is_empty() {
            i += 1;
            let id = unique_id(&format!("cancel-begin-{i}"));
            let req = request(&id, "{}", Timestamp::now());
            let out = run_with(&store, &req, Completion::completed(response(200, "x"))).await;
            if out.is_err() {
                for _ in 0..50 {
                    if let Ok(c) = store.pool().get().await
                        && let Ok(r) = c.query_one("SELECT pg_backend_pid()", &[]).await
                    {
                        pid.store(r.get(0), Ordering::Relaxed);
                        break;
                    }
                }
            }
            if let Err(e) = &out {
                let text = format!("{e:?}");
                let msg = e.to_string();
                *other_errors.entry(msg).or_default() += 1;
                if text.contains("beginning") {
                    eprintln!("BEGIN failed: {text}");
                    begin_errors += 1;
                    let found = checker
                        .query_opt(
                            &check_sql,
                            &[&id.scope.as_str(), &id.operation.as_str(), &id.key.as_str()],
                        )
                        .await
                        .unwrap();
                    if found.is_some() {
                        leaked.push((id.key.as_str().to_owned(), text));
                    }
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        let _ = canceller.await;
        eprintln!(
            "{i} calls, {} cancels sent, {begin_errors} BEGIN errors, errors {other_errors:?}, leaked claims: {leaked:?}",
            cancels.load(Ordering::Relaxed)
        );
        let _ = store.drop_schema().await;
        assert!(leaked.is_empty(), "a failed call committed its claim: {leaked:?}");
    });
}
