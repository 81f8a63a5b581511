//! Tests against the MySQL or MariaDB named by `IDEM_TEST_MYSQL_URL`; each
//! test gets a database of its own, dropped afterwards.

use std::sync::Arc;

use idem_core::{ClaimRequest, Fence, RecordId, Scope, Store, StoreError, StoreErrorKind};
use idem_testkit::{CleanupOnDrop, IsolatedBackend, unique_name};
use mysql_async::prelude::Queryable;

use super::*;

/// The MySQL or MariaDB at `IDEM_TEST_MYSQL_URL`; each store on a
/// database of its own.
pub(crate) struct TestMysql;

impl IsolatedBackend for TestMysql {
    type Store = MysqlStore;
    const URL_VAR: &'static str = "IDEM_TEST_MYSQL_URL";
    const SERVER: &'static str = "MySQL";

    async fn open(url: &str, name: &str) -> MysqlStore {
        MysqlStore::builder(url)
            .database(name)
            .pool_size(8)
            .connect()
            .await
            .expect("connect to test mysql")
    }

    async fn remove(store: MysqlStore) {
        let _ = store.drop_database().await;
    }
}

/// The conformance suite, each check on its own database.
mod conformance {
    use super::*;

    idem_testkit::conformance_tests!(optional TestMysql::fresh_if_configured());
}

fn rt() -> tokio::runtime::Runtime {
    idem_testkit::runtime()
}

/// Two pools, as two instances would have, 64 tasks split across them
/// claiming one key: exactly one acquires.
#[test]
fn cross_instance_race_has_one_winner() {
    let Some(url) = TestMysql::url() else { return };
    rt().block_on(async {
        let a = TestMysql::fresh(&url).await;
        let b = MysqlStore::builder(&url)
            .database(a.store().database())
            .pool_size(8)
            .connect()
            .await
            .unwrap();
        idem_testkit::race_one_key_across(&[Arc::new(a.store().clone()), Arc::new(b)], 64).await;
    });
}

/// Several instances migrating one new database at the same moment: all
/// succeed, and each migration is recorded once.
#[test]
fn concurrent_first_connects_migrate_once() {
    let Some(url) = TestMysql::url() else { return };
    rt().block_on(async {
        let database = unique_name("m");
        let connects: Vec<_> = (0..6)
            .map(|_| {
                let (url, database) = (url.clone(), database.clone());
                tokio::spawn(async move {
                    MysqlStore::builder(url)
                        .database(database)
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
        let mut conn = stores[0].conn().await.unwrap();
        let n: Option<i64> = conn
            .query_first(format!("SELECT COUNT(*) FROM {database}.idem_migrations"))
            .await
            .unwrap();
        assert_eq!(n, Some(i64::from(schema::VERSION)));
        drop(conn);
        stores[0].drop_database().await.unwrap();
    });
}

/// The pool keeps its connections, with the session settings the store
/// depends on: one connection serves call after call (the same
/// `CONNECTION_ID()`) at read committed, strict, with bounded lock waits.
#[test]
fn pooled_connections_are_kept_with_their_settings() {
    let Some(url) = TestMysql::url() else { return };
    rt().block_on(async {
        let store = MysqlStore::builder(&url)
            .database(unique_name("p"))
            .pool_size(1)
            .lock_wait_timeout(std::time::Duration::from_secs(3))
            .connect()
            .await
            .unwrap();
        let mut ids = Vec::new();
        for i in 0..5 {
            let id = idem_testkit::unique_id(&format!("pool-reuse-key-{i:02}"));
            let _ = store
                .claim(&idem_testkit::request(&id, "{}", idem_testkit::t0()))
                .await
                .unwrap();
            let mut conn = store.conn().await.unwrap();
            let row: Option<(u64, String, String, u64, u64)> = conn
                .query_first(
                    "SELECT CONNECTION_ID(), @@tx_isolation, @@sql_mode, \
                     @@innodb_lock_wait_timeout, @@lock_wait_timeout",
                )
                .await
                .unwrap();
            let (conn_id, isolation, mode, row_wait, meta_wait) = row.unwrap();
            assert_eq!(isolation, "READ-COMMITTED");
            assert!(mode.contains("STRICT_ALL_TABLES"), "{mode}");
            assert_eq!((row_wait, meta_wait), (3, 3));
            ids.push(conn_id);
        }
        assert!(
            ids.windows(2).all(|w| w[0] == w[1]),
            "connections were not kept: {ids:?}"
        );
        store.drop_database().await.unwrap();
    });
}

/// An id the columns cannot hold whole is refused before it reaches the
/// server: never truncated into another record's id.
#[test]
fn ids_longer_than_their_columns_are_refused() {
    let Some(url) = TestMysql::url() else { return };
    rt().block_on(async {
        let store = TestMysql::fresh(&url).await;
        let base = idem_testkit::unique_id("long-value-key-01");
        for id in [
            RecordId::new(
                Scope::from_raw("s".repeat(513)),
                base.operation.clone(),
                base.key.clone(),
            ),
            RecordId::new(
                base.scope.clone(),
                idem_core::Operation::from_raw(format!("POST /{}", "r".repeat(1100))),
                base.key.clone(),
            ),
        ] {
            let req = idem_testkit::request(&id, "{}", idem_testkit::t0());
            let e = store.store().claim(&req).await.unwrap_err();
            assert!(e.to_string().contains("longer than"), "{e}");
        }
    });
}

/// Servers whose AUTO_INCREMENT does not survive a restart are refused.
#[test]
fn only_servers_that_keep_auto_increment_are_supported() {
    for (version, ok) in [
        ("10.11.19-MariaDB-0+deb12u1", true),
        ("10.3.39-MariaDB", true),
        ("10.2.44-MariaDB", false),
        ("8.0.36", true),
        ("8.4.0-commercial", true),
        ("5.7.44-log", false),
        ("11.4.2-MariaDB", true),
    ] {
        assert_eq!(schema::supported(version), ok, "{version}");
    }
}

/// A bad URL or database name is a setup error that never shows the URL.
#[test]
fn bad_settings_are_setup_errors_without_the_url() {
    for (url, database) in [
        ("mysql://u:s3cret@h:notaport/db", "idem"),
        ("postgres://u:s3cret@h/db", "idem"),
        ("mysql://u:s3cret@h/db", "Idem; DROP"),
    ] {
        let e = MysqlStore::builder(url)
            .database(database)
            .check()
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Setup, "{url}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }
}

/// The atomic-mode suite (commits, failures, races, SIGKILL inside and
/// after the transaction) on a database with a `transfers` table.
mod atomic_mode {
    use std::ffi::OsString;

    use idem_core::Completion;
    use idem_testkit::atomic::{AtomicHarness, Outcome, Plan, REFUSAL, REFUSED_RESOURCE_ID};
    use idem_testkit::response;

    use super::*;
    use crate::MysqlTransaction;

    idem_testkit::atomic_conformance_tests!(MysqlHarness);

    /// The crash child's server and database.
    const URL_VAR: &str = "IDEM_CRASH_URL";
    const DATABASE_VAR: &str = "IDEM_CRASH_DATABASE";

    /// A database with the store's tables and `transfers`, dropped with the
    /// harness (a crash child's harness drops nothing).
    struct MysqlHarness {
        url: String,
        admin: MysqlStore,
        _cleanup: Option<CleanupOnDrop>,
    }

    /// The mutation a [`Plan`] describes, in the store's transaction.
    async fn transfer(
        tx: &mut MysqlTransaction,
        database: &str,
        key: &str,
        plan: Plan,
    ) -> Result<(String, Completion), mysql_async::Error> {
        tx.exec_drop(
            format!("INSERT INTO {database}.transfers (idem_key, amount) VALUES (?, 100)"),
            (key,),
        )
        .await?;
        let row = tx.last_insert_id().unwrap_or_default().to_string();
        let mut resource_id = row.clone();
        match plan {
            Plan::Transfer => {}
            Plan::FailAfterInsert => {
                tx.query_drop(format!("SELECT * FROM {database}.no_such_table"))
                    .await?;
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

    impl AtomicHarness for MysqlHarness {
        type Store = MysqlStore;

        async fn prepare() -> Option<Self> {
            let url = TestMysql::url()?;
            let admin = MysqlStore::builder(&url)
                .database(unique_name("a"))
                .pool_size(2)
                .connect()
                .await
                .expect("connect to test mysql");
            let cleanup = TestMysql::cleanup(&admin);
            let mut conn = admin.conn().await.unwrap();
            conn.query_drop(format!(
                "CREATE TABLE {}.transfers (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
                 idem_key VARBINARY(255) NOT NULL, amount BIGINT NOT NULL) ENGINE = InnoDB",
                admin.database()
            ))
            .await
            .unwrap();
            drop(conn);
            Some(MysqlHarness {
                url,
                admin,
                _cleanup: Some(cleanup),
            })
        }

        fn crash_env(&self) -> Vec<(&'static str, OsString)> {
            vec![
                (URL_VAR, self.url.clone().into()),
                (DATABASE_VAR, self.admin.database().into()),
            ]
        }

        async fn from_crash_env() -> Self {
            let (Ok(url), Ok(database)) = (std::env::var(URL_VAR), std::env::var(DATABASE_VAR))
            else {
                panic!("the crash child needs {URL_VAR} and {DATABASE_VAR}");
            };
            let admin = MysqlStore::builder(&url)
                .database(database)
                .pool_size(2)
                .connect()
                .await
                .unwrap();
            MysqlHarness {
                url,
                admin,
                _cleanup: None,
            }
        }

        /// One connection: every call after a failed one reuses it.
        async fn connect(&self) -> MysqlStore {
            MysqlStore::builder(&self.url)
                .database(self.admin.database())
                .pool_size(1)
                .connect()
                .await
                .unwrap()
        }

        async fn complete_atomically(
            &self,
            store: &MysqlStore,
            id: &RecordId,
            fence: Fence,
            plan: Plan,
        ) -> Outcome {
            let database = store.database().to_owned();
            let key = id.key.as_str().to_owned();
            let out = store
                .complete_atomically(id, fence, move |tx| {
                    Box::pin(async move { transfer(tx, &database, &key, plan).await })
                })
                .await?;
            Ok(out.map_failed(|e| e.to_string()))
        }

        async fn claim_and_complete_atomically(
            &self,
            store: &MysqlStore,
            req: &ClaimRequest,
            plan: Plan,
        ) -> Result<idem_core::ClaimedAtomically<String, String>, StoreError> {
            let database = store.database().to_owned();
            let key = req.id.key.as_str().to_owned();
            let out = store
                .claim_and_complete_atomically(req, move |tx, _fence| {
                    Box::pin(async move { transfer(tx, &database, &key, plan).await })
                })
                .await?;
            Ok(out.map_failed(|e| e.to_string()))
        }

        async fn rows(&self, key: &str) -> i64 {
            let mut conn = self.admin.conn().await.unwrap();
            let n: Option<i64> = conn
                .exec_first(
                    format!(
                        "SELECT COUNT(*) FROM {}.transfers WHERE idem_key = ?",
                        self.admin.database()
                    ),
                    (key,),
                )
                .await
                .unwrap();
            n.unwrap_or_default()
        }

        async fn refuse_completions(&self) {
            let d = self.admin.database();
            let mut conn = self.admin.conn().await.unwrap();
            conn.query_drop(format!(
                "CREATE TRIGGER {d}.refuse_completion BEFORE UPDATE ON {d}.idem_records \
                 FOR EACH ROW BEGIN IF NEW.resource_id = '{REFUSED_RESOURCE_ID}' THEN \
                 SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{REFUSAL}'; END IF; END"
            ))
            .await
            .unwrap();
        }
    }
}

/// The CI server runs with the defaults: `innodb_flush_log_at_trx_commit = 1`
/// keeps records.
#[test]
fn durability_reports_the_log_flush_and_the_binlog_sync() {
    let Some(url) = TestMysql::url() else {
        return;
    };
    rt().block_on(async {
        let s = TestMysql::fresh(&url).await;
        let report = s.store().durability().await.unwrap();
        let flush = &report.findings[0];
        assert_eq!(
            (flush.setting.as_str(), flush.value.as_str()),
            ("innodb_flush_log_at_trx_commit", "1")
        );
        assert_eq!(flush.verdict, idem_core::Verdict::Keeps);
        assert_eq!(report.findings[1].setting, "sync_binlog");
    });
}

/// A new instance on `database` (pool of 2), which migrates it.
async fn reopen(url: &str, database: &str) -> Result<MysqlStore, idem_core::StoreError> {
    MysqlStore::builder(url)
        .database(database)
        .pool_size(2)
        .connect()
        .await
}

/// Runs `statements` in order on a connection of `store`, `{d}` standing
/// for its database.
async fn execute(store: &MysqlStore, statements: &[&str]) {
    let database = format!("`{}`", store.database());
    let mut conn = store.conn().await.unwrap();
    for sql in statements {
        conn.query_drop(sql.replace("{d}", &database))
            .await
            .unwrap();
    }
}

/// The last migration recorded in `database`.
async fn schema_version(store: &MysqlStore, database: &str) -> Option<i32> {
    let mut conn = store.conn().await.unwrap();
    conn.query_first(format!(
        "SELECT MAX(version) FROM `{database}`.idem_migrations"
    ))
    .await
    .unwrap()
}

/// A migration whose statements ran but whose record did not (a crash
/// between them) runs again on the next connect: an added column that is
/// already there counts as added, and the connect succeeds.
#[test]
fn a_migration_cut_off_before_its_record_runs_again() {
    let Some(url) = TestMysql::url() else { return };
    rt().block_on(async {
        let old = TestMysql::fresh(&url).await;
        let database = old.store().database().to_owned();
        execute(
            old.store(),
            &["DELETE FROM {d}.idem_migrations WHERE version >= 3"],
        )
        .await;
        let store = reopen(&url, &database)
            .await
            .expect("the column of migration 3 is there: it counts as added");
        assert_eq!(
            schema_version(&store, &database).await,
            Some(schema::VERSION)
        );
    });
}

/// Whether `database`'s records table has migration 3's column.
async fn has_written_by(store: &MysqlStore, database: &str) -> bool {
    let mut conn = store.conn().await.unwrap();
    let columns: Option<i64> = conn
        .query_first(format!(
            "SELECT COUNT(*) FROM information_schema.columns \
             WHERE table_schema = '{database}' AND table_name = 'idem_records' \
             AND column_name = 'written_by'"
        ))
        .await
        .unwrap();
    columns == Some(1)
}

/// A migration whose `ALTER` cannot have the records table's metadata
/// lock (a transaction that read a record is still open) waits at most
/// one wait a try, pauses between tries, and after the last gives up as
/// unavailable with nothing of it recorded or applied; once the
/// transaction ends, the next start migrates.
#[test]
fn a_migration_that_cannot_have_its_lock_gives_up_with_nothing_applied() {
    use std::time::Duration;
    let Some(url) = TestMysql::url() else { return };
    rt().block_on(async {
        let old = TestMysql::fresh(&url).await;
        let database = old.store().database().to_owned();
        execute(
            old.store(),
            &[
                "ALTER TABLE {d}.idem_records DROP COLUMN written_by",
                "DELETE FROM {d}.idem_migrations WHERE version >= 3",
            ],
        )
        .await;
        // Holds a shared metadata lock on the table until it commits.
        let mut holder = old.store().conn().await.unwrap();
        holder.query_drop("START TRANSACTION").await.unwrap();
        let _: Option<i64> = holder
            .query_first(format!("SELECT COUNT(*) FROM `{database}`.idem_records"))
            .await
            .unwrap();
        // The server waits in whole seconds: 300 ms is a second.
        let wait = Duration::from_millis(300);
        let started = std::time::Instant::now();
        let refused = tokio::time::timeout(
            Duration::from_secs(60),
            MysqlStore::builder(&url)
                .database(&database)
                .pool_size(2)
                .migration_lock_wait(wait, 3)
                .connect(),
        )
        .await
        .expect("the migration gives up in bounded time")
        .expect_err("the lock is held");
        let elapsed = started.elapsed();
        assert_eq!(refused.kind(), idem_core::StoreErrorKind::Unavailable);
        assert!(
            refused.to_string().contains("3 waits of 1000 ms"),
            "{refused}"
        );
        // Three waits of a second, and pauses of half a second and a
        // whole one.
        assert!(
            elapsed >= Duration::from_millis(4500),
            "gave up after {elapsed:?}"
        );
        assert_eq!(schema_version(old.store(), &database).await, Some(2));
        assert!(!has_written_by(old.store(), &database).await);
        holder.query_drop("COMMIT").await.unwrap();
        // A pool of one: its connection is the one that migrated.
        let store = MysqlStore::builder(&url)
            .database(&database)
            .pool_size(1)
            .connect()
            .await
            .unwrap();
        assert_eq!(
            schema_version(&store, &database).await,
            Some(schema::VERSION)
        );
        assert!(has_written_by(&store, &database).await);
        // It goes on with the store's own lock wait (5 s), not the
        // migration's.
        let mut conn = store.conn().await.unwrap();
        let session: Option<u64> = conn
            .query_first("SELECT @@SESSION.lock_wait_timeout")
            .await
            .unwrap();
        assert_eq!(session, Some(5));
    });
}

/// A database at schema 1 (before the epoch) is migrated on connect: the
/// epoch table is created beside the records, which are kept, and the
/// first epoch is written by the first advance.
#[test]
fn a_version_1_database_gets_its_epoch_table_on_connect() {
    let Some(url) = TestMysql::url() else { return };
    rt().block_on(async {
        let old = TestMysql::fresh(&url).await;
        let database = old.store().database().to_owned();
        let id = idem_testkit::unique_id("my-migrate-v1-01");
        let claim = old
            .store()
            .claim(&idem_testkit::request(&id, "{}", idem_testkit::t0()))
            .await
            .unwrap();
        assert!(matches!(claim, idem_core::Claim::Acquired(_)));
        execute(
            old.store(),
            &[
                "DROP TABLE {d}.idem_epoch",
                "ALTER TABLE {d}.idem_records DROP COLUMN written_by",
                "DELETE FROM {d}.idem_migrations WHERE version >= 2",
            ],
        )
        .await;
        let store = reopen(&url, &database).await.unwrap();
        assert!(store.get(&id, idem_testkit::t0()).await.unwrap().is_some());
        let marks = store.advance_epoch("after-v1").await.unwrap();
        assert_eq!(
            marks,
            [idem_core::EpochMark::new("store", "after-v1", 1, true)]
        );
        assert_eq!(
            schema_version(&store, &database).await,
            Some(schema::VERSION)
        );
        // Version 3's column is back, and a batch of new keys (which
        // writes it) acquires them.
        assert!(has_written_by(&store, &database).await);
        let ids: Vec<_> = (0..8)
            .map(|n| idem_testkit::unique_id(&format!("my-migrate-v1-new-{n}")))
            .collect();
        let claims: Vec<_> = ids
            .iter()
            .map(|id| {
                let store = store.clone();
                let req = idem_testkit::request(id, "{}", idem_testkit::t0());
                tokio::spawn(async move { store.claim(&req).await })
            })
            .collect();
        for claim in claims {
            let claim = claim.await.unwrap();
            assert!(
                matches!(claim, Ok(idem_core::Claim::Acquired(_))),
                "{claim:?}"
            );
        }
    });
}

/// The epoch (`idem_core::EpochWatch`) notices a database that lost data:
/// its epoch rows deleted (emptied, as a restored dump without them or a
/// new server would be), its counter set back (rolled back, as a restored
/// backup of the same epoch or a failover to a lagging replica would be).
mod epoch {
    use std::sync::Arc;

    use super::*;

    async fn execute(store: &MysqlStore, sql: &str) {
        let sql = sql.replace("{d}", &format!("`{}`", store.database()));
        store.conn().await.unwrap().query_drop(sql).await.unwrap();
    }

    #[test]
    fn deleted_rows_are_an_emptied_store_and_a_counter_set_back_a_rollback() {
        let Some(url) = TestMysql::url() else { return };
        rt().block_on(async {
            let guarded = TestMysql::fresh(&url).await;
            let store = guarded.store();
            idem_testkit::epoch::hand_made_losses_are_seen(
                store,
                || execute(store, "DELETE FROM {d}.idem_epoch"),
                || execute(store, "UPDATE {d}.idem_epoch SET counter = 1"),
            )
            .await;
        });
    }

    /// Two instances (two pools on one database), each advancing the
    /// epoch from many tasks at once for the first time.
    #[test]
    fn concurrent_first_advances_across_instances_write_one_epoch() {
        let Some(url) = TestMysql::url() else { return };
        rt().block_on(async {
            let guarded = TestMysql::fresh(&url).await;
            let a = guarded.store().clone();
            let b = MysqlStore::builder(&url)
                .database(a.database())
                .pool_size(8)
                .connect()
                .await
                .unwrap();
            idem_testkit::epoch::concurrent_first_advances_write_one_epoch(
                Arc::new(a),
                Arc::new(b),
            )
            .await;
        });
    }
}

/// An instance that does not migrate (a serving thread's, beside the
/// gateway's main instance) opens only a database at this code's schema
/// version: a database nothing created, and one at another version, are
/// refused as `Setup` without creating or changing anything; one that a
/// migrating instance left serves claims that the other sees.
#[test]
fn an_instance_that_does_not_migrate_opens_only_this_codes_version() {
    let Some(url) = TestMysql::url() else { return };
    rt().block_on(async {
        use idem_core::Claim;
        let name = unique_name("nomig");
        let thread = || {
            MysqlStore::builder(&url)
                .database(&name)
                .thread_share(2)
                .migrate(false)
                .connect()
        };
        let Err(refused) = thread().await else {
            panic!("a database nothing created was opened");
        };
        assert_eq!(refused.kind(), StoreErrorKind::Setup, "{refused}");
        assert!(
            refused.to_string().contains("has not been created"),
            "{refused}"
        );
        let mut direct = mysql_async::Conn::from_url(url.as_str()).await.unwrap();
        let created: Option<i64> = direct
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?",
                (name.as_str(),),
            )
            .await
            .unwrap();
        assert_eq!(created, Some(0), "the refusal created nothing");
        let _ = direct.disconnect().await;
        let main = MysqlStore::builder(&url)
            .database(&name)
            .smallest_share()
            .connect()
            .await
            .unwrap();
        let mut conn = main.conn().await.unwrap();
        let tables: Option<i64> = conn
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ?",
                (name.as_str(),),
            )
            .await
            .unwrap();
        assert!(tables.unwrap_or(0) >= 3, "the main instance migrated");
        let beside = thread().await.unwrap();
        let id = idem_testkit::unique_id("nomig-claim-0001");
        let claimed = beside
            .claim(&idem_testkit::request(&id, "{}", idem_testkit::t0()))
            .await
            .unwrap();
        assert!(matches!(claimed, Claim::Acquired(_)), "{claimed:?}");
        assert!(main.get(&id, idem_testkit::t0()).await.unwrap().is_some());
        // Another idem migrated it further: refused, and left as it is.
        let newer = crate::schema::VERSION + 1;
        conn.query_drop(format!(
            "INSERT INTO `{name}`.idem_migrations (version) VALUES ({newer})"
        ))
        .await
        .unwrap();
        let Err(refused) = thread().await else {
            panic!("a database at another version was opened");
        };
        assert_eq!(refused.kind(), StoreErrorKind::Setup, "{refused}");
        assert!(
            refused.to_string().contains(&format!("version {newer}")),
            "{refused}"
        );
        let kept: Option<i32> = conn
            .query_first(format!("SELECT MAX(version) FROM `{name}`.idem_migrations"))
            .await
            .unwrap();
        assert_eq!(kept, Some(newer));
        drop(conn);
        let _ = main.drop_database().await;
    });
}

/// The claim procedures run with their caller's privileges (migration 4):
/// as `SQL SECURITY DEFINER`, a procedure whose definer is gone (the
/// account that migrated, dropped since) fails every claim (1449).
/// Migrating a database left so at version 3 repairs the procedures in
/// place, and claims pass.
#[test]
fn claims_outlive_the_account_that_migrated() {
    let Some(url) = TestMysql::url() else { return };
    rt().block_on(async {
        use idem_core::Claim;
        let name = unique_name("definer");
        let quoted = crate::schema::quoted(&name);
        let open = || {
            MysqlStore::builder(&url)
                .database(&name)
                .pool_size(2)
                .connect()
        };
        let store = open().await.unwrap();
        let mut conn = store.conn().await.unwrap();
        let security = "SELECT ROUTINE_NAME, SECURITY_TYPE FROM information_schema.ROUTINES \
                        WHERE ROUTINE_SCHEMA = ? ORDER BY ROUTINE_NAME";
        let invoker = vec![
            ("idem_claim".to_owned(), "INVOKER".to_owned()),
            ("idem_claim_in_tx".to_owned(), "INVOKER".to_owned()),
        ];
        let kinds: Vec<(String, String)> = conn.exec(security, (name.as_str(),)).await.unwrap();
        assert_eq!(kinds, invoker);
        // As version 3 left them, defined by an account since dropped.
        for (procedure, own_transaction) in [("idem_claim", true), ("idem_claim_in_tx", false)] {
            let text = crate::schema::claim_procedure(procedure, own_transaction)
                .replace("{d}", &quoted)
                .replace("SQL SECURITY INVOKER", "SQL SECURITY DEFINER")
                .replacen(
                    "CREATE PROCEDURE",
                    "CREATE DEFINER = 'idem_gone'@'localhost' PROCEDURE",
                    1,
                );
            conn.query_drop(format!("DROP PROCEDURE {quoted}.{procedure}"))
                .await
                .unwrap();
            conn.query_drop(text).await.unwrap();
        }
        conn.query_drop(format!(
            "DELETE FROM {quoted}.idem_migrations WHERE version = 4"
        ))
        .await
        .unwrap();
        let request =
            |n: &str| idem_testkit::request(&idem_testkit::unique_id(n), "{}", idem_testkit::t0());
        let refused = store.claim(&request("definer-gone-0001")).await;
        assert!(refused.is_err(), "{refused:?}");
        drop(store);
        let migrated = open().await.unwrap();
        let kinds: Vec<(String, String)> = conn.exec(security, (name.as_str(),)).await.unwrap();
        assert_eq!(kinds, invoker);
        let claimed = migrated.claim(&request("definer-gone-0002")).await.unwrap();
        assert!(matches!(claimed, Claim::Acquired(_)), "{claimed:?}");
        drop(conn);
        let _ = migrated.drop_database().await;
    });
}

/// A purge the server chooses as a deadlock victim runs again and deletes
/// what it was asked to, instead of answering the sweeper a store error.
/// A session of the test's own holds the later of two expired records;
/// the purge deletes the earlier and waits for the later; the session
/// then reaches for the earlier. The session has written rows of its own,
/// so the purge is the lighter transaction, the one InnoDB rolls back.
/// MariaDB only: it watches the lock wait in `information_schema`, which
/// MySQL 8 moved to `performance_schema`.
#[test]
fn a_purge_that_loses_a_deadlock_runs_again() {
    use idem_testkit::{request, t0, unique_id};
    let Some(url) = TestMysql::url() else { return };
    rt().block_on(async {
        let db = TestMysql::fresh(&url).await;
        let store = db.store().clone();
        let mut session = store.conn().await.unwrap();
        let version: Option<String> = session.query_first("SELECT VERSION()").await.unwrap();
        let version = version.unwrap_or_default();
        if !version.contains("MariaDB") {
            eprintln!("skipped: the lock wait is watched on MariaDB only (server {version})");
            return;
        }
        let (first, second) = (unique_id("purged-first"), unique_id("purged-second"));
        for (id, ttl) in [(&first, 1), (&second, 2)] {
            let mut req = request(id, "{}", t0());
            req.ttl = std::time::Duration::from_secs(ttl);
            req.lease = std::time::Duration::from_secs(1);
            let claim = store.claim(&req).await.unwrap();
            assert!(matches!(claim, idem_core::Claim::Acquired(_)), "{claim:?}");
        }
        let now = t0() + std::time::Duration::from_secs(10);

        let d = format!("`{}`", store.database());
        let lock =
            format!("SELECT 1 FROM {d}.idem_records WHERE scope = ? AND record_key = ? FOR UPDATE");
        let records = format!("SELECT COUNT(*) FROM {d}.idem_records");
        session
            .query_drop(format!("CREATE TABLE {d}.ballast (n INT PRIMARY KEY)"))
            .await
            .unwrap();
        let deadlocks_before = deadlocks(&mut session).await;
        let session_id: Option<u64> = session.query_first("SELECT CONNECTION_ID()").await.unwrap();
        let session_id = session_id.expect("the session's id");
        session.query_drop("START TRANSACTION").await.unwrap();
        let ballast: Vec<String> = (0..64).map(|n| format!("({n})")).collect();
        session
            .query_drop(format!(
                "INSERT INTO {d}.ballast VALUES {}",
                ballast.join(",")
            ))
            .await
            .unwrap();
        session
            .exec_drop(&lock, (second.scope.as_str(), second.key.as_str()))
            .await
            .unwrap();

        let purging = store.clone();
        let purge = tokio::spawn(async move { purging.purge_expired(now, 10).await });
        // The purge has deleted `first` and waits on `second`, which only
        // the session holds (other tests' waits on the server are not it).
        let mut watcher = store.conn().await.unwrap();
        let waiting = format!(
            "SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS AS w \
             JOIN information_schema.INNODB_TRX AS t ON t.trx_id = w.blocking_trx_id \
             WHERE t.trx_mysql_thread_id = {session_id}"
        );
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        while watcher.query_first::<u64, _>(&waiting).await.unwrap() != Some(1) {
            assert!(
                tokio::time::Instant::now() < deadline && !purge.is_finished(),
                "the purge never waited on the held record"
            );
            // InnoDB refreshes what these tables show only when they were
            // last read more than 100 ms ago: a faster poll sees one
            // picture for ever.
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        }

        session
            .exec_drop(&lock, (first.scope.as_str(), first.key.as_str()))
            .await
            .expect("the purge, not the heavier session, is the deadlock's victim");
        session.query_drop("COMMIT").await.unwrap();

        let purged = purge.await.unwrap();
        assert_eq!(
            purged.map_err(|e| e.to_string()),
            Ok(2),
            "the purge ran again after losing the deadlock"
        );
        // At least this one (tests running beside it may add theirs).
        assert!(
            deadlocks(&mut session).await > deadlocks_before,
            "a deadlock happened"
        );
        assert_eq!(
            session.query_first::<u64, _>(&records).await.unwrap(),
            Some(0),
            "both records are gone"
        );
    });
}

/// The server's count of deadlocks it broke.
async fn deadlocks(conn: &mut mysql_async::Conn) -> u64 {
    let row: Option<(String, u64)> = conn
        .query_first("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
        .await
        .unwrap();
    row.expect("Innodb_deadlocks").1
}
