//! Tests against the PostgreSQL named by `IDEM_TEST_POSTGRES_URL`; each
//! test gets a schema of its own, dropped afterwards.

use std::sync::atomic::{AtomicU32, Ordering};

use idem_core::testkit::{CleanupOnDrop, Guarded};

use super::*;

pub(crate) fn url() -> Option<String> {
    idem_core::testkit::backend_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL")
}

pub(crate) fn schema_name(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "idem_t_{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

async fn fresh(url: &str) -> Guarded<PostgresStore> {
    let store = PostgresStore::builder(url)
        .schema(schema_name("c"))
        .pool_size(8)
        .connect()
        .await
        .expect("connect to test postgres");
    let dropper = store.clone();
    Guarded::new(
        store,
        CleanupOnDrop::new(move || async move {
            let _ = dropper.drop_schema().await;
        }),
    )
}

/// The conformance suite, each check on its own schema.
mod conformance {
    use super::*;

    idem_core::conformance_tests!(optional async {
        match url() {
            Some(u) => Some(fresh(&u).await),
            None => None,
        }
    });
}

use idem_core::testkit::{LEASE, request, response, t0, unique_id};

fn rt() -> tokio::runtime::Runtime {
    idem_core::testkit::runtime()
}

/// Two pools, as two instances would have, 64 tasks split across them
/// claiming one key: exactly one acquires.
#[test]
fn cross_instance_race_has_one_winner() {
    let Some(url) = url() else { return };
    rt().block_on(async {
        let a = fresh(&url).await;
        let b = PostgresStore::builder(&url)
            .schema(a.store().schema())
            .pool_size(8)
            .connect()
            .await
            .unwrap();
        idem_core::testkit::race_one_key_across(&[Arc::new(a.store().clone()), Arc::new(b)], 64)
            .await;
    });
}

/// Several instances migrating one new schema at the same moment: all
/// succeed, and the migration is recorded once.
#[test]
fn concurrent_first_connects_migrate_once() {
    let Some(url) = url() else { return };
    rt().block_on(async {
        let schema = schema_name("m");
        let connects: Vec<_> = (0..6)
            .map(|_| {
                let (url, schema) = (url.clone(), schema.clone());
                tokio::spawn(async move {
                    PostgresStore::builder(url)
                        .schema(schema)
                        .pool_size(2)
                        .connect()
                        .await
                })
            })
            .collect();
        let mut stores = Vec::new();
        for c in connects {
            stores.push(c.await.unwrap().expect("every instance connects"));
        }
        let client = stores[0].pool().get().await.unwrap();
        let n: i64 = client
            .query_one(
                &format!("SELECT count(*) FROM {schema}.idem_migrations"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, i64::from(schema::VERSION));
        stores[0].drop_schema().await.unwrap();
    });
}

/// A schema at version 2 (before the (scope, key) index) is migrated on
/// connect; its records are kept and found by key afterwards.
#[test]
fn a_version_2_schema_is_migrated_on_connect() {
    let Some(url) = url() else { return };
    rt().block_on(async {
        let old = fresh(&url).await;
        let schema = old.store().schema().to_owned();
        let id = unique_id("pg-migrate-v2-01");
        assert!(matches!(
            old.store().claim(&request(&id, "{}", t0())).await.unwrap(),
            Claim::Acquired(_)
        ));
        let client = old.store().pool().get().await.unwrap();
        client
            .batch_execute(&format!(
                "DROP INDEX {schema}.idem_records_scope_key;
                 DELETE FROM {schema}.idem_migrations WHERE version = 3;"
            ))
            .await
            .unwrap();
        drop(client);
        let store = PostgresStore::builder(&url)
            .schema(&schema)
            .pool_size(2)
            .connect()
            .await
            .unwrap();
        let found = store
            .find_by_key(&id.scope, &id.key, t0(), 10)
            .await
            .unwrap();
        assert_eq!(found.iter().map(|r| &r.id).collect::<Vec<_>>(), [&id]);
        let client = store.pool().get().await.unwrap();
        let row = client
            .query_one(
                &format!(
                    "SELECT (SELECT max(version) FROM {schema}.idem_migrations), \
                     (SELECT count(*) FROM pg_indexes \
                      WHERE schemaname = $1 AND indexname = 'idem_records_scope_key')"
                ),
                &[&schema],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i32>(0), 3);
        assert_eq!(row.get::<_, i32>(0), schema::VERSION);
        assert_eq!(row.get::<_, i64>(1), 1);
    });
}

#[test]
fn bad_urls_and_schema_names_are_setup_errors() {
    rt().block_on(async {
        let e = PostgresStore::connect("not a url at all")
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Setup);
        let e = PostgresStore::builder("postgres://x@127.0.0.1/x")
            .schema("Robert'); DROP")
            .connect()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Setup);
        // Nobody listens on port 1: unavailable, after the connect timeout.
        let e = PostgresStore::builder("postgres://x@127.0.0.1:1/x")
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
    });
}

/// Concurrent purges from several instances delete each expired record
/// once and never fail on each other's locks.
#[test]
fn concurrent_purges_share_the_work() {
    let Some(url) = url() else { return };
    rt().block_on(async {
        let a = fresh(&url).await;
        let store = a.store().clone();
        for i in 0..300 {
            let id = unique_id(&format!("purge-many-{i:06}"));
            let mut req = request(&id, "{}", t0());
            req.ttl = Duration::from_secs(60);
            req.lease = Duration::from_secs(10);
            store.claim_now(&req).await.unwrap();
        }
        let now = t0() + Duration::from_secs(60);
        let purgers: Vec<_> = (0..4)
            .map(|_| {
                let s = store.clone();
                tokio::spawn(async move {
                    let mut total = 0;
                    loop {
                        let n = s.purge_expired(now, 25).await.unwrap();
                        assert!(n <= 25);
                        total += n;
                        if n == 0 {
                            return total;
                        }
                    }
                })
            })
            .collect();
        let mut total = 0;
        for p in purgers {
            total += p.await.unwrap();
        }
        assert_eq!(total, 300);
    });
}

async fn business_table(store: &PostgresStore) {
    let c = store.pool().get().await.unwrap();
    c.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {}.transfers (id bigserial PRIMARY KEY, idem_key text NOT NULL, amount bigint NOT NULL)",
        store.schema()
    ))
    .await
    .unwrap();
}

async fn transfer_rows(store: &PostgresStore, key: &str) -> i64 {
    let c = store.pool().get().await.unwrap();
    c.query_one(
        &format!(
            "SELECT count(*) FROM {}.transfers WHERE idem_key = $1",
            store.schema()
        ),
        &[&key],
    )
    .await
    .unwrap()
    .get(0)
}

/// Runs the transfer under atomic mode; `pause` is awaited inside the
/// transaction, after the insert and before the commit.
async fn atomic_transfer(
    store: &PostgresStore,
    id: &RecordId,
    fence: Fence,
    pause: impl std::future::Future<Output = ()> + Send + 'static,
) -> Atomic<i64, tokio_postgres::Error> {
    let schema = store.schema().to_owned();
    let key = id.key.as_str().to_owned();
    store
        .complete_atomically(id, fence, move |tx| {
            Box::pin(async move {
                let row = tx
                    .query_one(&format!("INSERT INTO {schema}.transfers (idem_key, amount) VALUES ($1, 100) RETURNING id"), &[&key])
                    .await?;
                let tid: i64 = row.get(0);
                pause.await;
                Ok((tid, Completion::completed(response(201, &format!("transfer {tid}"))).with_resource_id(tid.to_string())))
            })
        })
        .await
        .unwrap()
}

#[test]
fn atomic_mode_commits_both_or_neither() {
    let Some(url) = url() else { return };
    rt().block_on(async {
        let g = fresh(&url).await;
        let store = g.store();
        business_table(store).await;

        // Commit: row and completed record together.
        let id = unique_id("atomic-commit-001");
        let Claim::Acquired(lease) = store.claim_now(&request(&id, "{}", t0())).await.unwrap()
        else {
            panic!()
        };
        let Atomic::Committed(tid) = atomic_transfer(store, &id, lease.fence, async {}).await
        else {
            panic!("expected commit")
        };
        let rec = store.get(&id, t0()).await.unwrap().unwrap();
        assert_eq!(rec.status, Status::Completed);
        assert_eq!(rec.resource_id, Some(tid.to_string()));
        assert_eq!(transfer_rows(store, id.key.as_str()).await, 1);

        // The mutation fails: nothing is written and the record stays ours.
        let id = unique_id("atomic-failure-01");
        let Claim::Acquired(lease) = store.claim_now(&request(&id, "{}", t0())).await.unwrap()
        else {
            panic!()
        };
        let schema = store.schema().to_owned();
        let key = id.key.as_str().to_owned();
        let out = store
            .complete_atomically(&id, lease.fence, move |tx| {
                Box::pin(async move {
                    tx.execute(
                        &format!(
                            "INSERT INTO {schema}.transfers (idem_key, amount) VALUES ($1, 1)"
                        ),
                        &[&key],
                    )
                    .await?;
                    tx.execute("SELECT 1/0", &[]).await?;
                    Ok::<_, tokio_postgres::Error>((
                        (),
                        Completion::completed(response(200, "never")),
                    ))
                })
            })
            .await
            .unwrap();
        assert!(matches!(out, Atomic::Failed(_)));
        assert_eq!(transfer_rows(store, id.key.as_str()).await, 0);
        let rec = store.get(&id, t0()).await.unwrap().unwrap();
        assert_eq!((rec.status, rec.fence), (Status::InProgress, lease.fence));

        // A stale fence: the mutation is never run.
        let later = t0() + LEASE;
        let Claim::Acquired(_) = store.claim_now(&request(&id, "{}", later)).await.unwrap() else {
            panic!()
        };
        let out = atomic_transfer(store, &id, lease.fence, async {}).await;
        assert!(matches!(out, Atomic::StaleFence));
        assert_eq!(transfer_rows(store, id.key.as_str()).await, 0);
    });
}

/// The child half of the crash tests: claims, runs the atomic transfer,
/// says READY at the chosen point, and waits to be killed.
#[test]
#[ignore = "child process of the crash tests; run by them"]
fn crash_child() {
    let (Ok(url), Ok(schema), Ok(key), Ok(mode)) = (
        std::env::var("IDEM_CRASH_URL"),
        std::env::var("IDEM_CRASH_SCHEMA"),
        std::env::var("IDEM_CRASH_KEY"),
        std::env::var("IDEM_CRASH_MODE"),
    ) else {
        panic!("crash_child needs IDEM_CRASH_* variables");
    };
    rt().block_on(async {
        let store = PostgresStore::builder(url)
            .schema(schema)
            .pool_size(2)
            .connect()
            .await
            .unwrap();
        let id = crash_id(&key);
        let Claim::Acquired(lease) = store.claim_now(&request(&id, "{}", t0())).await.unwrap()
        else {
            panic!("child could not claim")
        };
        let before_commit = mode == "before-commit";
        let pause = async move {
            if before_commit {
                println!("{}", idem_core::testkit::crash::READY);
                std::future::pending::<()>().await;
            }
        };
        let out = atomic_transfer(&store, &id, lease.fence, pause).await;
        assert!(matches!(out, Atomic::Committed(_)));
        println!("{}", idem_core::testkit::crash::READY);
        std::future::pending::<()>().await;
    });
}

fn crash_id(key: &str) -> RecordId {
    RecordId::new(
        idem_core::Scope::from_raw("crash-test"),
        idem_core::Operation::new("POST", "/transfers"),
        idem_core::Key::new(key).unwrap(),
    )
}

/// Starts the child, waits for READY, kills it with SIGKILL.
fn run_and_kill_child(url: &str, schema: &str, key: &str, mode: &str) {
    idem_core::testkit::crash::run_until_ready_then_kill(
        "tests::crash_child",
        &[
            ("IDEM_CRASH_URL", url.as_ref()),
            ("IDEM_CRASH_SCHEMA", schema.as_ref()),
            ("IDEM_CRASH_KEY", key.as_ref()),
            ("IDEM_CRASH_MODE", mode.as_ref()),
        ],
    );
}

fn crash_test(mode: &str) {
    let Some(url) = url() else { return };
    let rt = rt();
    let g = rt.block_on(fresh(&url));
    let store = g.store().clone();
    rt.block_on(business_table(&store));
    let key = format!("crash-{mode}-0001");
    run_and_kill_child(&url, store.schema(), &key, mode);

    rt.block_on(async {
        let id = crash_id(&key);
        // The retry comes after the lease.
        let retry = request(&id, "{}", t0() + LEASE);
        match (mode, store.claim_now(&retry).await.unwrap()) {
            ("before-commit", Claim::Acquired(lease)) => {
                assert!(lease.takeover);
                assert_eq!(
                    transfer_rows(&store, &key).await,
                    0,
                    "the killed transaction left nothing"
                );
                let out = atomic_transfer(&store, &id, lease.fence, async {}).await;
                assert!(matches!(out, Atomic::Committed(_)));
            }
            ("after-commit", Claim::Replay(rec)) => {
                assert_eq!(rec.status, Status::Completed);
            }
            (mode, other) => panic!("{mode}: unexpected claim after the crash: {other:?}"),
        }
        assert_eq!(transfer_rows(&store, &key).await, 1, "exactly one transfer");
        // And any further retry replays.
        assert!(matches!(
            store.claim_now(&retry).await.unwrap(),
            Claim::Replay(_)
        ));
    });
}

#[test]
fn crash_before_commit_executes_once_on_retry() {
    crash_test("before-commit");
}

#[test]
fn crash_after_commit_replays_on_retry() {
    crash_test("after-commit");
}

/// Atomic mode: the completion fails after the mutation ran (a trigger
/// refuses the completion's UPDATE). The caller gets the error and the
/// transaction does not commit: no transfer row, the record is still ours,
/// and the same connection then serves the next call cleanly.
#[test]
fn atomic_mode_a_failing_completion_commits_nothing() {
    let Some(url) = url() else { return };
    rt().block_on(async {
        let g = fresh(&url).await;
        business_table(g.store()).await;
        let s = g.store().schema().to_owned();
        g.store()
            .pool()
            .get()
            .await
            .unwrap()
            .batch_execute(&format!(
                "CREATE FUNCTION {s}.refuse_boom() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'completion refused'; END $$; \
                 CREATE TRIGGER refuse_boom BEFORE UPDATE ON {s}.idem_records FOR EACH ROW \
                 WHEN (NEW.resource_id = 'boom') EXECUTE FUNCTION {s}.refuse_boom();"
            ))
            .await
            .unwrap();
        // One connection: the calls after the failure reuse it.
        let store = PostgresStore::builder(&url)
            .schema(&s)
            .pool_size(1)
            .connect()
            .await
            .unwrap();
        let id = unique_id("pg-atomic-refused");
        let Claim::Acquired(lease) = store.claim_now(&request(&id, "{}", t0())).await.unwrap()
        else {
            panic!()
        };
        let key = id.key.as_str().to_owned();
        let schema = s.clone();
        let err = store
            .complete_atomically(&id, lease.fence, move |tx| {
                Box::pin(async move {
                    tx.execute(
                        &format!(
                            "INSERT INTO {schema}.transfers (idem_key, amount) VALUES ($1, 1)"
                        ),
                        &[&key],
                    )
                    .await?;
                    let c =
                        Completion::completed(response(201, "refused")).with_resource_id("boom");
                    Ok::<_, tokio_postgres::Error>(((), c))
                })
            })
            .await
            .unwrap_err();
        assert!(format!("{err:?}").contains("completion refused"), "{err:?}");
        assert_eq!(transfer_rows(&store, id.key.as_str()).await, 0);
        let rec = store.get(&id, t0()).await.unwrap().unwrap();
        assert_eq!((rec.status, rec.fence), (Status::InProgress, lease.fence));

        let other = unique_id("pg-atomic-after-1");
        let Claim::Acquired(l2) = store.claim_now(&request(&other, "{}", t0())).await.unwrap()
        else {
            panic!()
        };
        assert!(matches!(
            atomic_transfer(&store, &other, l2.fence, async {}).await,
            Atomic::Committed(_)
        ));
        assert_eq!(transfer_rows(&store, other.key.as_str()).await, 1);
        assert_eq!(transfer_rows(&store, id.key.as_str()).await, 0);
    });
}

/// An upper bound for assertions, far beyond any expected wait.
const BOUND: Duration = Duration::from_secs(20);

/// With a statement timeout, calls blocked on another session's row lock
/// fail with `Unavailable` instead of hanging, and the store works once the
/// lock is released.
#[test]
fn a_call_blocked_past_the_statement_timeout_is_unavailable() {
    let Some(url) = url() else { return };
    rt().block_on(async {
        let g = fresh(&url).await;
        let s = g.store().schema().to_owned();
        let store = PostgresStore::builder(&url)
            .schema(&s)
            .pool_size(2)
            .statement_timeout(Duration::from_millis(200))
            .connect()
            .await
            .unwrap();
        let id = unique_id("pg-row-locked-01");
        let Claim::Acquired(lease) = store.claim_now(&request(&id, "{}", t0())).await.unwrap()
        else {
            panic!()
        };

        // Another session locks the record's row and keeps it locked.
        let mut locker = g.store().pool().get().await.unwrap();
        let tx = locker.transaction().await.unwrap();
        tx.query_one(
            &format!("SELECT 1 FROM {s}.idem_records WHERE scope = $1 AND key = $2 FOR UPDATE"),
            &[&id.scope.as_str(), &id.key.as_str()],
        )
        .await
        .unwrap();

        let e = tokio::time::timeout(BOUND, store.claim_now(&request(&id, "{}", t0())))
            .await
            .expect("the claim answers in bounded time")
            .unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
        let done = Completion::completed(response(200, "done"));
        let e = tokio::time::timeout(BOUND, store.complete(&id, lease.fence, done.clone(), t0()))
            .await
            .expect("the completion answers in bounded time")
            .unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
        let e = tokio::time::timeout(
            BOUND,
            store.complete_atomically(&id, lease.fence, |_tx| {
                Box::pin(async {
                    Ok::<_, tokio_postgres::Error>(((), Completion::completed(response(200, "x"))))
                })
            }),
        )
        .await
        .expect("atomic mode answers in bounded time")
        .unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");

        tx.rollback().await.unwrap();
        assert!(matches!(
            store.claim_now(&request(&id, "{}", t0())).await.unwrap(),
            Claim::InFlight { .. }
        ));
        assert_eq!(
            store.complete(&id, lease.fence, done, t0()).await.unwrap(),
            Settled::Applied
        );
        let rec = store.get(&id, t0()).await.unwrap().unwrap();
        assert_eq!(rec.status, Status::Completed);
    });
}

/// Every connection of the pool is taken: a call fails with `Unavailable`
/// after the pool's wait instead of hanging, and works once one is back.
#[test]
fn an_exhausted_pool_is_unavailable_after_the_wait() {
    let Some(url) = url() else { return };
    rt().block_on(async {
        let g = fresh(&url).await;
        let store = PostgresStore::builder(&url)
            .schema(g.store().schema())
            .pool_size(1)
            .connect_timeout(Duration::from_millis(200))
            .connect()
            .await
            .unwrap();
        let taken = store.pool().get().await.unwrap();
        let id = unique_id("pg-pool-exhausted");
        let e = tokio::time::timeout(BOUND, store.claim_now(&request(&id, "{}", t0())))
            .await
            .expect("the claim answers in bounded time")
            .unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
        drop(taken);
        assert!(matches!(
            store.claim_now(&request(&id, "{}", t0())).await.unwrap(),
            Claim::Acquired(_)
        ));
    });
}
