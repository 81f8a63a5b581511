//! One-commit mode's plain-insert claim of a new key against `idem_claim`,
//! which `Store::claim` uses: the same answer in every record state, and
//! at most one committed execution when every path races on one key.
//! (Written as an attack on the fast path; kept as regression tests.)
#![allow(clippy::unwrap_used, clippy::panic, clippy::expect_used)] // a test crate

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{
    Atomic, Claim, ClaimRequest, ClaimedAtomically, Completion, Fence, RecordId, Status, Store,
    Timestamp,
};
use idem_postgres::PostgresStore;
use idem_testkit::{LEASE, TTL, request, response, t0, unique_id};

mod common;
use common::{rows, url};

async fn fresh(url: &str, pool: usize) -> PostgresStore {
    common::fresh(url, pool, "atk1c").await
}

/// One-commit with a mutation that inserts a transfer row, or fails if `fail`.
async fn one_commit(
    store: &PostgresStore,
    req: &ClaimRequest,
    fail: bool,
    slow: bool,
) -> ClaimedAtomically<Fence, String> {
    let s = store.schema().to_owned();
    let (key, scope) = (
        req.id.key.as_str().to_owned(),
        req.id.scope.as_str().to_owned(),
    );
    store
        .claim_and_complete_atomically(req, move |tx, fence| {
            Box::pin(async move {
                common::insert_transfer(tx, &s, &key, &scope)
                    .await
                    .map_err(|e| e.to_string())?;
                if slow {
                    tx.execute("SELECT pg_sleep(0.02)", &[])
                        .await
                        .map_err(|e| e.to_string())?;
                }
                if fail {
                    return Err("refused".to_owned());
                }
                Ok((fence, Completion::completed(response(201, "one-commit"))))
            })
        })
        .await
        .expect("store")
        .map_failed(|e| e)
}

/// Kinds of answers, to compare the two paths.
fn kind(c: &Claim) -> String {
    match c {
        Claim::Acquired(l) => format!("Acquired(takeover={})", l.takeover),
        Claim::InFlight { .. } => "InFlight".into(),
        Claim::Replay(r) => format!("Replay({:?})", r.status),
        Claim::Mismatch { .. } => "Mismatch".into(),
    }
}

/// Puts `id` in a named state at t0 (using only the plain store API).
async fn setup(store: &PostgresStore, id: &RecordId, state: &str) -> Option<Fence> {
    let acquire = |body: &'static str| {
        let req = request(id, body, t0());
        async move {
            match store.claim(&req).await.unwrap() {
                Claim::Acquired(l) => l.fence,
                o => panic!("{o:?}"),
            }
        }
    };
    match state {
        "absent" => None,
        "in_progress" => Some(acquire("{}").await),
        "in_progress_other_fp" => Some(acquire("{\"other\":1}").await),
        "completed" | "completed_other_fp" | "failed" => {
            let body = if state == "completed_other_fp" {
                "{\"other\":1}"
            } else {
                "{}"
            };
            let f = acquire(body).await;
            let c = if state == "failed" {
                Completion::failed(response(400, "f"))
            } else {
                Completion::completed(response(200, "c"))
            };
            let _ = store.complete(id, f, c, t0()).await.unwrap();
            Some(f)
        }
        "released" => {
            let f = acquire("{}").await;
            let _ = store.release(id, f, t0()).await.unwrap();
            Some(f)
        }
        _ => unreachable!(),
    }
}

/// For every state and claim time, the one-commit path answers what
/// `Store::claim` answers for the same record, its fence grows, and a
/// failed mutation leaves the record as it found it.
#[test]
fn one_commit_answers_as_store_claim_in_every_state() {
    let Some(url) = url() else { return };
    idem_testkit::runtime().block_on(async {
        let store = fresh(&url, 4).await;
        let states = [
            "absent",
            "in_progress",
            "in_progress_other_fp",
            "completed",
            "completed_other_fp",
            "failed",
            "released",
        ];
        let times = [
            ("t0", t0()),
            ("lease over", t0() + LEASE),
            (
                "just before expiry",
                Timestamp::from_millis(t0().as_millis() + TTL.as_millis() as i64 - 1),
            ),
            ("expired", t0() + TTL),
            ("long expired", t0() + TTL + TTL),
            ("before t0", Timestamp::from_millis(t0().as_millis() - 5)),
        ];
        let mut differences = Vec::new();
        for state in states {
            for (when, now) in times {
                let a = unique_id("differential-key-a");
                let b = unique_id("differential-key-b");
                let c = unique_id("differential-key-c");
                let fa = setup(&store, &a, state).await;
                let _ = setup(&store, &b, state).await;
                let _ = setup(&store, &c, state).await;
                let before_c = store.get(&c, now).await.unwrap();
                let plain = store.claim(&request(&a, "{}", now)).await.unwrap();
                let atomic = one_commit(&store, &request(&b, "{}", now), false, false).await;
                let got = match &atomic {
                    ClaimedAtomically::NotAcquired(c) => kind(c),
                    ClaimedAtomically::Ran(Atomic::Committed(_)) => match &plain {
                        Claim::Acquired(l) => format!("Acquired(takeover={})", l.takeover),
                        _ => "Acquired(?)".into(),
                    },
                    other => format!("{other:?}"),
                };
                eprintln!(
                    "{state:>22} @ {when:<18}: claim {:<24} one-commit {got}",
                    kind(&plain)
                );
                if kind(&plain) != got {
                    differences.push(format!(
                        "{state} @ {when}: claim {} / one-commit {got}",
                        kind(&plain)
                    ));
                }
                if let (Claim::Acquired(l), Some(fa)) = (&plain, fa) {
                    assert!(l.fence > fa, "{state} @ {when}: fence went back");
                }
                if let ClaimedAtomically::Ran(Atomic::Committed(f)) = &atomic {
                    assert_eq!(rows(&store, &b).await, 1);
                    let rec = store.get(&b, now).await.unwrap().expect("record");
                    assert_eq!(rec.status, Status::Completed);
                    assert_eq!(rec.fence, *f);
                } else {
                    assert_eq!(rows(&store, &b).await, 0);
                }
                // A failed mutation on `c` leaves `c` as it was.
                let failed = one_commit(&store, &request(&c, "{}", now), true, false).await;
                let after_c = store.get(&c, now).await.unwrap();
                assert_eq!(rows(&store, &c).await, 0, "{state} @ {when}");
                assert_eq!(
                    format!("{before_c:?}"),
                    format!("{after_c:?}"),
                    "{state} @ {when}: {failed:?}"
                );
            }
        }
        let _ = store.drop_schema().await;
        assert!(differences.is_empty(), "{differences:#?}");
    });
}

/// One-commit callers, plain claimers that complete atomically, plain
/// claimers that release (a transient failure) and callers whose mutation
/// fails, all on one key at once, on many keys: at most one transfer per
/// key, a completed record exactly when there is one, no deadlock, no hang.
#[test]
fn mixed_paths_on_one_key_commit_at_most_once() {
    race(false);
}

/// The same with a one-commit mutation that holds its transaction open a
/// while (20 ms), so that the other paths wait on its row.
#[test]
fn mixed_paths_with_a_slow_one_commit_mutation() {
    race(true);
}

fn race(slow: bool) {
    let Some(url) = url() else { return };
    idem_testkit::runtime().block_on(async {
        let store = Arc::new(fresh(&url, 16).await);
        let errors = Arc::new(AtomicUsize::new(0));
        for round in 0..40 {
            let id = unique_id("mixed-race-key-0001");
            // Half the rounds start with an expired record, so the key goes
            // through idem_claim's takeover/expired branches too.
            let now = if round % 2 == 0 {
                setup(
                    &store,
                    &id,
                    if round % 4 == 0 {
                        "completed"
                    } else {
                        "in_progress"
                    },
                )
                .await;
                t0() + TTL
            } else {
                t0()
            };
            let mut tasks = Vec::new();
            for i in 0..16usize {
                let store = store.clone();
                let id = id.clone();
                let errors = errors.clone();
                tasks.push(tokio::spawn(async move {
                    let req = request(&id, "{}", now);
                    match i % 4 {
                        0 | 1 => {
                            let _ = one_commit(&store, &req, i % 8 == 1, slow).await;
                        }
                        2 => {
                            if let Ok(Claim::Acquired(l)) = store.claim(&req).await {
                                let s = store.schema().to_owned();
                                let (k, sc) =
                                    (id.key.as_str().to_owned(), id.scope.as_str().to_owned());
                                let r = store
                                    .complete_atomically(&id, l.fence, move |tx| {
                                        Box::pin(async move {
                                            common::insert_transfer(tx, &s, &k, &sc).await?;
                                            Ok::<_, tokio_postgres::Error>((
                                                (),
                                                Completion::completed(response(201, "plain")),
                                            ))
                                        })
                                    })
                                    .await;
                                if r.is_err() {
                                    errors.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        _ => {
                            if let Ok(Claim::Acquired(l)) = store.claim(&req).await {
                                tokio::task::yield_now().await;
                                let _ = store.release(&id, l.fence, now).await;
                            }
                        }
                    }
                }));
            }
            let joined = tokio::time::timeout(Duration::from_secs(60), async {
                for t in tasks {
                    t.await.unwrap();
                }
            })
            .await;
            assert!(joined.is_ok(), "round {round}: hang");
            let n = rows(&store, &id).await;
            let rec = store.get(&id, now).await.unwrap();
            assert!(n <= 1, "round {round}: {n} transfers");
            let completed = rec
                .as_ref()
                .is_some_and(|r| r.status == Status::Completed && r.created_at >= now);
            assert_eq!(
                n == 1,
                completed,
                "round {round}: {n} transfers, record {rec:?}"
            );
        }
        assert_eq!(errors.load(Ordering::Relaxed), 0);
        let _ = store.drop_schema().await;
    });
}

/// A one-commit call dropped while its mutation runs (a caller's timeout,
/// a cancelled task) rolls back: its connection is closed, never returned
/// to the pool inside the transaction, and the key runs once afterwards.
/// Ten times over a pool of four, and the pool still serves.
#[test]
fn a_dropped_one_commit_call_rolls_back_and_the_pool_serves_on() {
    let Some(url) = url() else { return };
    idem_testkit::runtime().block_on(async {
        let store = fresh(&url, 4).await;
        for round in 0..10 {
            let id = unique_id(&format!("dropped-call-{round:04}"));
            let req = request(&id, "{}", t0());
            let s = store.schema().to_owned();
            let (key, scope) = (id.key.as_str().to_owned(), id.scope.as_str().to_owned());
            let inserted = Arc::new(tokio::sync::Notify::new());
            let said = inserted.clone();
            let call = store.claim_and_complete_atomically(&req, move |c, _fence| {
                Box::pin(async move {
                    common::insert_transfer(c, &s, &key, &scope)
                        .await
                        .map_err(|e| e.to_string())?;
                    said.notify_one();
                    std::future::pending::<Result<((), Completion), String>>().await
                })
            });
            tokio::select! {
                out = call => panic!("round {round}: the hanging call finished: {out:?}"),
                () = inserted.notified() => {}
            }
            // The call is dropped here, inside its transaction.
            let again = one_commit(&store, &req, false, false).await;
            assert!(
                matches!(again, ClaimedAtomically::Ran(Atomic::Committed(_))),
                "round {round}: {again:?}"
            );
            assert_eq!(rows(&store, &id).await, 1, "round {round}");
        }
        let _ = store.drop_schema().await;
    });
}
