//! What a reviewer threw at the MySQL store, kept as regression tests:
//! session settings that survive a return to the pool, row and metadata
//! lock waits that end at the configured timeout (a hang fails the test),
//! no gap-lock wait between unrelated new keys, a long operation under a
//! non-strict server, cancelled calls, and a race of one-commit and plain
//! claimers on one key (at most one executor per round).
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{
    Claim, ClaimRequest, ClaimedAtomically, Completion, Key, Operation, RecordId, Scope, Settled,
    Store, StoredResponse, Timestamp,
};
use idem_mysql::MysqlStore;
use mysql_async::prelude::Queryable;

fn url() -> Option<String> {
    std::env::var("IDEM_TEST_MYSQL_URL")
        .ok()
        .filter(|u| !u.is_empty())
}

fn db(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "idem_atk_{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

fn req(scope: &str, op: Operation, key: &str, body: &str, now: Timestamp) -> ClaimRequest {
    let fp = idem_core::Fingerprint::compute(
        &op,
        None,
        body.as_bytes(),
        &idem_core::FieldSelection::Whole,
    );
    ClaimRequest {
        id: RecordId::new(Scope::from_raw(scope), op, Key::new(key).unwrap()),
        fingerprint: fp,
        now,
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(3600),
    }
}

fn resp() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![],
        body: b"ok".to_vec(),
        trailers: Vec::new(),
    }
}

async fn session_vars(store: &MysqlStore) -> (String, i64) {
    let mut c = store.pool().get_conn().await.unwrap();
    let row: Option<(String, i64)> = c
        .query_first("SELECT @@session.tx_isolation, @@session.innodb_lock_wait_timeout")
        .await
        .unwrap();
    row.unwrap()
}

/// The store's session settings (READ COMMITTED, the lock wait) hold after
/// a connection went back to the pool and came out again (mysql_async's
/// default reset on return would put them back to the server's).
#[test]
fn session_settings_survive_a_pool_return() {
    let Some(url) = url() else { return };
    rt().block_on(async {
        let store = MysqlStore::builder(&url)
            .database(db("s"))
            .pool_size(1)
            .lock_wait_timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let first = session_vars(&store).await;
        let now = Timestamp::now();
        let r = req(
            "s",
            Operation::new("POST", "/x"),
            "k-0000000000000001",
            "b",
            now,
        );
        let _ = store.claim(&r).await.unwrap();
        let after = session_vars(&store).await;
        store.drop_database().await.unwrap();
        eprintln!("session after connect: {first:?}; after one claim: {after:?}");
        assert_eq!(
            after,
            ("READ-COMMITTED".to_owned(), 2),
            "session settings were reset"
        );
    });
}

/// A claim that waits for a locked row should fail after the configured
/// lock wait (1 s), not the server's default.
#[test]
fn lock_wait_is_bounded_by_the_setting() {
    let Some(url) = url() else { return };
    rt().block_on(async {
        let store = MysqlStore::builder(&url)
            .database(db("w"))
            .pool_size(1)
            .lock_wait_timeout(Duration::from_secs(1))
            .connect()
            .await
            .unwrap();
        let now = Timestamp::now();
        let r = req(
            "s",
            Operation::new("POST", "/x"),
            "k-0000000000000002",
            "b",
            now,
        );
        let Claim::Acquired(_) = store.claim(&r).await.unwrap() else {
            panic!()
        };
        // Another session holds the row (as an atomic-mode transaction whose
        // mutation is slow would).
        let mut other = mysql_async::Conn::new(mysql_async::Opts::from_url(&url).unwrap())
            .await
            .unwrap();
        other.query_drop("START TRANSACTION").await.unwrap();
        other
            .query_drop(format!(
                "SELECT * FROM {}.idem_records FOR UPDATE",
                store.database()
            ))
            .await
            .unwrap();
        let mut later = r.clone();
        later.now = Timestamp::from_millis(now.as_millis() + 31_000);
        let t = Instant::now();
        let out = tokio::time::timeout(Duration::from_secs(12), store.claim(&later)).await;
        let took = t.elapsed();
        other.query_drop("ROLLBACK").await.unwrap();
        drop(other);
        store.drop_database().await.unwrap();
        eprintln!("claim on a locked row answered after {took:?}: {out:?}");
        assert!(
            took < Duration::from_secs(4),
            "waited {took:?} with lock_wait_timeout 1 s"
        );
    });
}

/// While a one-commit claim's mutation runs, a claim of a *different* new
/// key next to it in the index should not wait (READ COMMITTED takes no
/// gap locks). Both pools are warmed first, so their connections have been
/// through one pool return.
#[test]
fn unrelated_new_key_does_not_wait_for_a_one_commit_claim() {
    let Some(url) = url() else { return };
    rt().block_on(async {
        let database = db("g");
        let a = MysqlStore::builder(&url)
            .database(database.clone())
            .pool_size(1)
            .connect()
            .await
            .unwrap();
        let b = MysqlStore::builder(&url)
            .database(database.clone())
            .pool_size(1)
            .connect()
            .await
            .unwrap();
        let now = Timestamp::now();
        let op = Operation::new("POST", "/x");
        // warm both pools (one op each, so the connection went back once)
        let _ = a
            .claim(&req("s", op.clone(), "k-zzzzzzzzzzzzzzz1", "b", now))
            .await
            .unwrap();
        let _ = b
            .claim(&req("s", op.clone(), "k-zzzzzzzzzzzzzzz2", "b", now))
            .await
            .unwrap();
        let slow = req("s", op.clone(), "k-mmmmmmmmmmmmmmmm", "b", now);
        let a2 = a.clone();
        let started = Arc::new(tokio::sync::Notify::new());
        let s2 = started.clone();
        let h = tokio::spawn(async move {
            a2.claim_and_complete_atomically(&slow, move |_tx, _fence| {
                Box::pin(async move {
                    s2.notify_one();
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    Ok::<_, mysql_async::Error>(((), Completion::completed(resp())))
                })
            })
            .await
        });
        started.notified().await;
        let t = Instant::now();
        let other = b
            .claim(&req("s", op.clone(), "k-aaaaaaaaaaaaaaaa", "b", now))
            .await;
        let took = t.elapsed();
        let done = h.await.unwrap();
        eprintln!("unrelated claim took {took:?}: {other:?}; slow one: {done:?}");
        a.drop_database().await.unwrap();
        assert!(
            took < Duration::from_millis(1000),
            "an unrelated new key waited {took:?}"
        );
    });
}

/// Under a non-strict sql_mode at migration time (a server with
/// `sql_mode=''`), the procedure's VARBINARY(1024) parameter truncates a
/// longer operation while the complete/release statements compare the full
/// value: the claim is acquired, the completion answers StaleFence, and
/// after the lease the key executes a second time. Simulated by
/// re-creating the procedure under `sql_mode=''` (what the migration does
/// on such a server).
#[test]
fn long_operation_under_non_strict_mode() {
    let Some(url) = url() else { return };
    rt().block_on(async {
        let store = MysqlStore::builder(&url)
            .database(db("t"))
            .pool_size(1)
            .connect()
            .await
            .unwrap();
        let d = store.database().to_owned();
        {
            let mut c = store.pool().get_conn().await.unwrap();
            let row: Option<mysql_async::Row> = c
                .query_first(format!("SHOW CREATE PROCEDURE {d}.idem_claim"))
                .await
                .unwrap();
            let row = row.unwrap();
            let body: String = row.get::<String, usize>(2).unwrap();
            c.query_drop(format!("USE {d}")).await.unwrap();
            c.query_drop("SET SESSION sql_mode = ''").await.unwrap();
            c.query_drop(format!("DROP PROCEDURE {d}.idem_claim"))
                .await
                .unwrap();
            c.query_drop(body).await.unwrap();
        }
        let now = Timestamp::now();
        let long_route = format!("/{}", "r".repeat(1100));
        let r = req(
            "s",
            Operation::new("POST", &long_route),
            "k-0000000000000003",
            "b",
            now,
        );
        let first = store.claim(&r).await;
        eprintln!("first claim: {first:?}");
        let Ok(Claim::Acquired(lease)) = first else {
            store.drop_database().await.unwrap();
            return;
        };
        let done = store
            .complete(&r.id, lease.fence, Completion::completed(resp()), now)
            .await
            .unwrap();
        let got = store.get(&r.id, now).await.unwrap();
        let mut later = r.clone();
        later.now = Timestamp::from_millis(now.as_millis() + 31_000);
        let second = store.claim(&later).await.unwrap();
        eprintln!(
            "complete: {done:?}; get: {:?}; claim after the lease: {second:?}",
            got.is_some()
        );
        store.drop_database().await.unwrap();
        assert_eq!(done, Settled::Applied);
        assert!(
            matches!(second, Claim::Replay(_)),
            "executed twice: {second:?}"
        );
    });
}

/// Cancelled calls leave no connection out of step with its answers.
#[test]
fn cancelled_calls_do_not_desync_the_connection() {
    let Some(url) = url() else { return };
    rt().block_on(async {
        let store = MysqlStore::builder(&url)
            .database(db("x"))
            .pool_size(1)
            .connect()
            .await
            .unwrap();
        let now = Timestamp::now();
        let op = Operation::new("POST", "/x");
        for i in 0..200u64 {
            let r = req("s", op.clone(), &format!("k-cancel-{i:08}"), "b", now);
            let us = (i * 37) % 3000;
            let _ = tokio::time::timeout(Duration::from_micros(us), store.claim(&r)).await;
        }
        let mut wrong = 0;
        for i in 0..200u64 {
            let r = req("s", op.clone(), &format!("k-check-{i:08}"), "b", now);
            match store.claim(&r).await {
                Ok(Claim::Acquired(_)) => {}
                other => {
                    wrong += 1;
                    eprintln!("{i}: {other:?}");
                }
            }
        }
        store.drop_database().await.unwrap();
        assert_eq!(wrong, 0);
    });
}

/// One-commit and plain claimers of one key at once, round after round: at
/// most one runs the mutation.
#[test]
fn one_commit_race() {
    let Some(url) = url() else { return };
    rt().block_on(async {
        let store = MysqlStore::builder(&url)
            .database(db("r"))
            .pool_size(16)
            .connect()
            .await
            .unwrap();
        let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let mut errors = 0;
        let mut ran_total = 0;
        for round in 0..20 {
            let now = Timestamp::now();
            let r = req(
                "s",
                Operation::new("POST", "/x"),
                &format!("k-race-{round:010}"),
                "b",
                now,
            );
            let mut hs = Vec::new();
            for i in 0..24 {
                let store = store.clone();
                let r = r.clone();
                let runs = runs.clone();
                hs.push(tokio::spawn(async move {
                    if i % 2 == 0 {
                        store
                            .claim_and_complete_atomically(&r, move |_tx, _f| {
                                Box::pin(async move {
                                    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                    Ok::<_, mysql_async::Error>(((), Completion::completed(resp())))
                                })
                            })
                            .await
                            .map(|c| matches!(c, ClaimedAtomically::Ran(_)))
                    } else {
                        store
                            .claim(&r)
                            .await
                            .map(|c| matches!(c, Claim::Acquired(_)))
                    }
                }));
            }
            let mut ran = 0;
            for h in hs {
                match h.await.unwrap() {
                    Ok(true) => ran += 1,
                    Ok(false) => {}
                    Err(e) => {
                        errors += 1;
                        eprintln!("round {round}: {e}");
                    }
                }
            }
            ran_total += ran;
            assert!(ran <= 1, "round {round}: {ran} executors");
        }
        eprintln!("executors {ran_total} in 20 rounds, errors {errors}");
        store.drop_database().await.unwrap();
    });
}

/// A claim that waits on a metadata lock (LOCK TABLES, an ALTER, a
/// backup's FLUSH TABLES WITH READ LOCK) ends at the lock wait too.
#[test]
fn metadata_lock_waits_are_bounded() {
    let Some(url) = url() else { return };
    rt().block_on(async {
        let store = MysqlStore::builder(&url)
            .database(db("md"))
            .pool_size(1)
            .lock_wait_timeout(Duration::from_secs(1))
            .connect()
            .await
            .unwrap();
        let mut other = mysql_async::Conn::new(mysql_async::Opts::from_url(&url).unwrap())
            .await
            .unwrap();
        other
            .query_drop(format!(
                "LOCK TABLES {}.idem_records WRITE",
                store.database()
            ))
            .await
            .unwrap();
        let now = Timestamp::now();
        let r = req(
            "s",
            Operation::new("POST", "/x"),
            "k-0000000000000010",
            "b",
            now,
        );
        let t = Instant::now();
        let out = tokio::time::timeout(Duration::from_secs(8), store.claim(&r)).await;
        eprintln!(
            "claim under a table lock: after {:?}: {:?}",
            t.elapsed(),
            out.as_ref().map(|r| r.as_ref().map(|_| ()))
        );
        other.query_drop("UNLOCK TABLES").await.unwrap();
        drop(other);
        store.drop_database().await.unwrap();
        assert!(
            out.is_ok(),
            "claim still waiting after 8 s with lock_wait_timeout 1 s"
        );
    });
}
