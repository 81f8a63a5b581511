//! Tests against the PostgreSQL named by `IDEM_TEST_POSTGRES_URL`; each
//! test gets a schema of its own, dropped afterwards.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Claim, Completion, Fence, RecordId, Settled, Status, Store, StoreErrorKind};
use idem_testkit::{CleanupOnDrop, IsolatedBackend, unique_name};

use super::*;

/// The PostgreSQL at `IDEM_TEST_POSTGRES_URL`; each store on a schema of
/// its own.
pub(crate) struct TestPostgres;

impl IsolatedBackend for TestPostgres {
    type Store = PostgresStore;
    const URL_VAR: &'static str = "IDEM_TEST_POSTGRES_URL";
    const SERVER: &'static str = "PostgreSQL";

    async fn open(url: &str, name: &str) -> PostgresStore {
        PostgresStore::builder(url)
            .schema(name)
            .pool_size(8)
            .connect()
            .await
            .expect("connect to test postgres")
    }

    async fn remove(store: PostgresStore) {
        let _ = store.drop_schema().await;
    }
}

/// The conformance suite, each check on its own schema.
mod conformance {
    use super::*;

    idem_testkit::conformance_tests!(optional TestPostgres::fresh_if_configured());
}

use idem_testkit::{request, response, t0, unique_id};

pub(crate) fn rt() -> tokio::runtime::Runtime {
    idem_testkit::runtime()
}

/// Two pools, as two instances would have, 64 tasks split across them
/// claiming one key: exactly one acquires.
#[test]
fn cross_instance_race_has_one_winner() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let a = TestPostgres::fresh(&url).await;
        let b = PostgresStore::builder(&url)
            .schema(a.store().schema())
            .pool_size(8)
            .connect()
            .await
            .unwrap();
        idem_testkit::race_one_key_across(&[Arc::new(a.store().clone()), Arc::new(b)], 64).await;
    });
}

/// The epoch (`idem_core::EpochWatch`) notices a schema that lost data:
/// its epoch rows deleted (emptied, as a restored dump without them or a
/// new server would be), its counter set back (rolled back, as a restored
/// backup of the same epoch or a failover to a lagging replica would be).
mod epoch {
    use idem_core::{EpochMark, EpochWatch, LossCause};

    use super::*;

    /// Advances the store's epoch and shows its one mark to `watch`:
    /// the causes of the losses it noticed.
    async fn check(
        store: &PostgresStore,
        watch: &mut EpochWatch,
        candidate: &str,
    ) -> Vec<LossCause> {
        let marks = store.advance_epoch(candidate).await.unwrap();
        assert_eq!(marks.len(), 1, "{marks:?}");
        assert_eq!(marks[0].place, "store");
        watch.observe(&marks).into_iter().map(|l| l.cause).collect()
    }

    async fn execute(store: &PostgresStore, sql: &str) {
        let sql = sql.replace("{s}", store.schema());
        store
            .pool()
            .get()
            .await
            .unwrap()
            .batch_execute(&sql)
            .await
            .unwrap();
    }

    #[test]
    fn deleted_rows_are_an_emptied_store_and_a_counter_set_back_a_rollback() {
        let Some(url) = TestPostgres::url() else {
            return;
        };
        rt().block_on(async {
            let guarded = TestPostgres::fresh(&url).await;
            let store = guarded.store();
            idem_testkit::epoch::hand_made_losses_are_seen(
                store,
                || execute(store, "DELETE FROM {s}.idem_epoch"),
                || execute(store, "UPDATE {s}.idem_epoch SET counter = 1"),
            )
            .await;
        });
    }

    /// Two instances (two pools on one schema), each advancing the epoch
    /// from many tasks at once for the first time (`xmax = 0` tells the
    /// insert from the update).
    #[test]
    fn concurrent_first_advances_across_instances_write_one_epoch() {
        let Some(url) = TestPostgres::url() else {
            return;
        };
        rt().block_on(async {
            let guarded = TestPostgres::fresh(&url).await;
            let a = guarded.store().clone();
            let b = PostgresStore::builder(&url)
                .schema(a.schema())
                .pool_size(8)
                .connect()
                .await
                .unwrap();
            idem_testkit::epoch::concurrent_first_advances_write_one_epoch(
                std::sync::Arc::new(a),
                std::sync::Arc::new(b),
            )
            .await;
        });
    }

    /// Two instances (two pools on one schema) share the epoch: a watcher
    /// of each sees the other's advances as progress, never as a loss.
    #[test]
    fn instances_on_one_schema_share_the_epoch() {
        let Some(url) = TestPostgres::url() else {
            return;
        };
        rt().block_on(async {
            let guarded = TestPostgres::fresh(&url).await;
            let a = guarded.store();
            let b = PostgresStore::builder(&url)
                .schema(a.schema())
                .pool_size(2)
                .connect()
                .await
                .unwrap();
            let (mut wa, mut wb) = (EpochWatch::new(), EpochWatch::new());
            assert!(check(a, &mut wa, "from-a").await.is_empty());
            for _ in 0..3 {
                assert!(check(&b, &mut wb, "from-b").await.is_empty());
                assert!(check(a, &mut wa, "from-a").await.is_empty());
            }
            let marks = b.advance_epoch("from-b").await.unwrap();
            assert_eq!(marks, [EpochMark::new("store", "from-a", 8, false)]);
        });
    }
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
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let a = TestPostgres::fresh(&url).await;
        let store = a.store().clone();
        for i in 0..300 {
            let id = unique_id(&format!("purge-many-{i:06}"));
            let mut req = request(&id, "{}", t0());
            req.ttl = Duration::from_secs(60);
            req.lease = Duration::from_secs(10);
            store.claim(&req).await.unwrap();
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

/// Atomic mode: the shared suite of idem-testkit, on a schema of its own
/// per test.
mod atomic_mode {
    use std::ffi::OsString;

    use idem_testkit::atomic::{AtomicHarness, Outcome, Plan, REFUSAL, REFUSED_RESOURCE_ID};

    use super::*;

    idem_testkit::atomic_conformance_tests!(PostgresHarness);

    /// The crash child's server and schema.
    const URL_VAR: &str = "IDEM_CRASH_URL";
    const SCHEMA_VAR: &str = "IDEM_CRASH_SCHEMA";

    /// A schema with the store's tables and `transfers`, dropped with the
    /// harness (a crash child's harness drops nothing). `admin` reads rows
    /// and installs triggers beside the store under test.
    struct PostgresHarness {
        url: String,
        admin: PostgresStore,
        _cleanup: Option<CleanupOnDrop>,
    }

    /// The mutation a [`Plan`] describes, in the store's transaction.
    async fn transfer<C: crate::GenericClient + Sync>(
        tx: &C,
        schema: &str,
        key: &str,
        plan: Plan,
    ) -> Result<(String, Completion), tokio_postgres::Error> {
        let row: i64 = tx
            .query_one(
                &format!("INSERT INTO {schema}.transfers (idem_key, amount) VALUES ($1, 100) RETURNING id"),
                &[&key],
            )
            .await?
            .get(0);
        let row = row.to_string();
        let mut resource_id = row.clone();
        match plan {
            Plan::Transfer => {}
            Plan::FailAfterInsert => {
                tx.execute("SELECT 1/0", &[]).await?;
            }
            Plan::RefusedCompletion => resource_id = REFUSED_RESOURCE_ID.to_owned(),
            Plan::HangBeforeCommit => {
                idem_testkit::crash::say_ready();
                std::future::pending::<()>().await;
            }
        }
        let c = Completion::completed(response(201, &format!("transfer {row}")))
            .with_resource_id(resource_id);
        Ok((row, c))
    }

    impl AtomicHarness for PostgresHarness {
        type Store = PostgresStore;

        async fn prepare() -> Option<Self> {
            let url = TestPostgres::url()?;
            let admin = PostgresStore::builder(&url)
                .schema(unique_name("a"))
                .pool_size(2)
                .connect()
                .await
                .expect("connect to test postgres");
            let cleanup = TestPostgres::cleanup(&admin);
            admin
                .pool()
                .get()
                .await
                .unwrap()
                .batch_execute(&format!(
                    "CREATE TABLE {}.transfers (id bigserial PRIMARY KEY, idem_key text NOT NULL, amount bigint NOT NULL)",
                    admin.schema()
                ))
                .await
                .unwrap();
            Some(PostgresHarness {
                url,
                admin,
                _cleanup: Some(cleanup),
            })
        }

        fn crash_env(&self) -> Vec<(&'static str, OsString)> {
            vec![
                (URL_VAR, self.url.clone().into()),
                (SCHEMA_VAR, self.admin.schema().into()),
            ]
        }

        async fn from_crash_env() -> Self {
            let (Ok(url), Ok(schema)) = (std::env::var(URL_VAR), std::env::var(SCHEMA_VAR)) else {
                panic!("the crash child needs {URL_VAR} and {SCHEMA_VAR}");
            };
            let admin = PostgresStore::builder(&url)
                .schema(schema)
                .pool_size(2)
                .connect()
                .await
                .unwrap();
            PostgresHarness {
                url,
                admin,
                _cleanup: None,
            }
        }

        /// One connection: every call after a failed one reuses it.
        async fn connect(&self) -> PostgresStore {
            PostgresStore::builder(&self.url)
                .schema(self.admin.schema())
                .pool_size(1)
                .connect()
                .await
                .unwrap()
        }

        async fn complete_atomically(
            &self,
            store: &PostgresStore,
            id: &RecordId,
            fence: Fence,
            plan: Plan,
        ) -> Outcome {
            let schema = store.schema().to_owned();
            let key = id.key.as_str().to_owned();
            let out = store
                .complete_atomically(id, fence, move |tx| {
                    Box::pin(async move { transfer(tx, &schema, &key, plan).await })
                })
                .await?;
            Ok(out.map_failed(|e| e.to_string()))
        }

        async fn claim_and_complete_atomically(
            &self,
            store: &PostgresStore,
            req: &idem_core::ClaimRequest,
            plan: Plan,
        ) -> Result<idem_core::ClaimedAtomically<String, String>, idem_core::StoreError> {
            let schema = store.schema().to_owned();
            let key = req.id.key.as_str().to_owned();
            let out = store
                .claim_and_complete_atomically(req, move |tx, _fence| {
                    Box::pin(async move { transfer(tx, &schema, &key, plan).await })
                })
                .await?;
            Ok(out.map_failed(|e| e.to_string()))
        }

        async fn rows(&self, key: &str) -> i64 {
            let c = self.admin.pool().get().await.unwrap();
            c.query_one(
                &format!(
                    "SELECT count(*) FROM {}.transfers WHERE idem_key = $1",
                    self.admin.schema()
                ),
                &[&key],
            )
            .await
            .unwrap()
            .get(0)
        }

        async fn refuse_completions(&self) {
            let s = self.admin.schema();
            self.admin
                .pool()
                .get()
                .await
                .unwrap()
                .batch_execute(&format!(
                    "CREATE FUNCTION {s}.refuse_completion() RETURNS trigger LANGUAGE plpgsql AS \
                     $$ BEGIN RAISE EXCEPTION '{REFUSAL}'; END $$; \
                     CREATE TRIGGER refuse_completion BEFORE UPDATE ON {s}.idem_records FOR EACH ROW \
                     WHEN (NEW.resource_id = '{REFUSED_RESOURCE_ID}') EXECUTE FUNCTION {s}.refuse_completion();"
                ))
                .await
                .unwrap();
        }
    }
}

/// An upper bound for assertions, far beyond any expected wait.
const BOUND: Duration = Duration::from_secs(20);

/// With a statement timeout, calls blocked on another session's row lock
/// fail with `Unavailable` instead of hanging, and the store works once the
/// lock is released.
#[test]
fn a_call_blocked_past_the_statement_timeout_is_unavailable() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let g = TestPostgres::fresh(&url).await;
        let s = g.store().schema().to_owned();
        let store = PostgresStore::builder(&url)
            .schema(&s)
            .pool_size(2)
            .statement_timeout(Duration::from_millis(200))
            .connect()
            .await
            .unwrap();
        let id = unique_id("pg-row-locked-01");
        let Claim::Acquired(lease) = store.claim(&request(&id, "{}", t0())).await.unwrap() else {
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

        let e = tokio::time::timeout(BOUND, store.claim(&request(&id, "{}", t0())))
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
            store.claim(&request(&id, "{}", t0())).await.unwrap(),
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
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let g = TestPostgres::fresh(&url).await;
        let store = PostgresStore::builder(&url)
            .schema(g.store().schema())
            .pool_size(1)
            .connect_timeout(Duration::from_millis(200))
            .connect()
            .await
            .unwrap();
        let taken = store.pool().get().await.unwrap();
        let id = unique_id("pg-pool-exhausted");
        let e = tokio::time::timeout(BOUND, store.claim(&request(&id, "{}", t0())))
            .await
            .expect("the claim answers in bounded time")
            .unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
        drop(taken);
        assert!(matches!(
            store.claim(&request(&id, "{}", t0())).await.unwrap(),
            Claim::Acquired(_)
        ));
    });
}

/// The CI server runs with PostgreSQL's defaults: `fsync` keeps records.
#[test]
fn durability_reports_fsync_and_synchronous_commit() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let s = TestPostgres::fresh(&url).await;
        let report = s.store().durability().await.unwrap();
        let fsync = &report.findings[0];
        assert_eq!(
            (fsync.setting.as_str(), fsync.value.as_str()),
            ("fsync", "on")
        );
        assert_eq!(fsync.verdict, idem_core::Verdict::Keeps);
        assert_eq!(report.findings[1].setting, "synchronous_commit");
    });
}
