use idem_core::{
    Claim, Completion, Fence, RecordId, Settled, Store, StoreError, StoreErrorKind, Timestamp,
};
use idem_testkit::Guarded;
use rusqlite::Connection;
use tokio::sync::oneshot;

use super::*;

/// A fresh store in a temporary directory removed with the store.
fn fresh() -> Guarded<SqliteStore> {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("store.db")).expect("open store");
    Guarded::new(store, dir)
}

idem_testkit::conformance_tests!(async { fresh() });

/// Keeps the writer thread busy: an atomic-mode mutation that waits until
/// the returned sender fires (or is dropped). Returns once the writer is
/// inside it, with the queue empty behind it.
async fn hold_writer(
    store: &SqliteStore,
) -> (
    std::sync::mpsc::Sender<()>,
    tokio::task::JoinHandle<Result<idem_core::Atomic<(), rusqlite::Error>, StoreError>>,
) {
    use idem_testkit::{response, t0, unique_id};
    let id = unique_id("hold-the-writer");
    let lease = acquire(store, &id, t0()).await;
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (inside, started) = oneshot::channel();
    let s = store.clone();
    let held = tokio::spawn(async move {
        s.complete_atomically(&id, lease.fence, move |_conn| {
            let _ = inside.send(());
            let _ = wait.recv();
            Ok::<_, rusqlite::Error>(((), Completion::completed(response(200, "held"))))
        })
        .await
    });
    started.await.expect("the writer runs the holding job");
    (go, held)
}

/// Claims `id` with an empty body at `now`, which must acquire it.
async fn acquire(store: &SqliteStore, id: &RecordId, now: Timestamp) -> idem_core::Lease {
    match store
        .claim(&idem_testkit::request(id, "{}", now))
        .await
        .unwrap()
    {
        Claim::Acquired(lease) => lease,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// Polls `f` once: enough for a store call to hand its job to the writer.
async fn queue<F: std::future::Future + Unpin>(f: &mut F) {
    std::future::poll_fn(|cx| {
        assert!(
            std::pin::Pin::new(&mut *f).poll(cx).is_pending(),
            "the call answered while the writer was held"
        );
        std::task::Poll::Ready(())
    })
    .await;
}

#[test]
fn opening_a_file_that_is_not_sqlite_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.db");
    std::fs::write(
        &path,
        b"these are not the pages you are looking for, not at all, no, none of them",
    )
    .unwrap();
    let err = SqliteStore::open(&path).unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Setup);
    assert!(err.to_string().contains("not an SQLite database"), "{err}");
}

#[test]
fn opening_another_apps_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.db");
    let c = Connection::open(&path).unwrap();
    c.execute_batch("CREATE TABLE users (id INTEGER PRIMARY KEY); INSERT INTO users VALUES (1);")
        .unwrap();
    drop(c);
    let err = SqliteStore::open(&path).unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Setup);
    assert!(err.to_string().contains("not an idem store"), "{err}");
    // Nothing was written into it.
    let c = Connection::open(&path).unwrap();
    let n: i64 = c
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn opening_a_read_only_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.db");
    drop(SqliteStore::open(&path).unwrap());
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&path, perms).unwrap();
    let err = SqliteStore::open(&path).unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Setup);
    assert!(err.to_string().contains("read-only"), "{err}");
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("newer.db");
    drop(SqliteStore::open(&path).unwrap());
    Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", schema::SCHEMA_VERSION + 1)
        .unwrap();
    let err = SqliteStore::open(&path).unwrap_err();
    assert!(err.to_string().contains("newer idem"), "{err}");
}

#[test]
fn a_missing_directory_is_a_clear_error() {
    let err = SqliteStore::open("/nonexistent-dir-for-idem/x.db").unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Setup);
    assert!(
        err.to_string().contains("/nonexistent-dir-for-idem/x.db"),
        "{err}"
    );
}

/// SQLite in this build syncs with fdatasync, not fsync (its source's
/// default on Linux): `.cargo/config.toml` sets `LIBSQLITE3_FLAGS` for
/// libsqlite3-sys's build script. Checked on what was linked: this test
/// binary holds the same SQLite as the store, so it must import
/// `fdatasync` from the C library and not `fsync` (nothing else linked
/// into it syncs a file). It fails for a build whose environment
/// overrides the variable, or that links a system SQLite.
#[test]
#[cfg(target_os = "linux")]
fn the_linked_sqlite_syncs_with_fdatasync() {
    use object::{Object, ObjectSymbol};
    let exe = std::env::current_exe().expect("the test binary's path");
    let bytes = std::fs::read(&exe).expect("reading the test binary");
    let file = object::File::parse(&*bytes).expect("parsing the test binary");
    let imported = |name: &str| {
        file.dynamic_symbols()
            .any(|s| s.is_undefined() && s.name() == Ok(name))
    };
    assert!(
        imported("fdatasync") && !imported("fsync"),
        "{} imports fdatasync: {}, fsync: {}; SQLite must be built with \
         LIBSQLITE3_FLAGS=-DHAVE_FDATASYNC=1 (.cargo/config.toml)",
        exe.display(),
        imported("fdatasync"),
        imported("fsync"),
    );
}

/// Records and the fence counter survive closing and reopening the file.
#[test]
fn records_and_fences_survive_reopening() {
    use idem_testkit::{request, response, t0, unique_id};
    let rt = idem_testkit::runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reopen.db");
    let id = unique_id("reopen-key-00001");
    let first = rt.block_on(async {
        let store = SqliteStore::open(&path).unwrap();
        let lease = acquire(&store, &id, t0()).await;
        let c = Completion::completed(response(201, "durable"));
        assert_eq!(
            store.complete(&id, lease.fence, c, t0()).await.unwrap(),
            Settled::Applied
        );
        lease.fence
    });
    rt.block_on(async {
        let store = SqliteStore::open(&path).unwrap();
        let Claim::Replay(rec) = store.claim(&request(&id, "{}", t0())).await.unwrap() else {
            panic!("expected Replay after reopening")
        };
        assert_eq!(rec.response, Some(response(201, "durable")));
        let other = unique_id("reopen-key-00002");
        let lease = acquire(&store, &other, t0()).await;
        assert!(lease.fence > first, "the fence counter is persistent");
    });
}

/// Two stores on one file, as two `idem serve` processes on one node would
/// have: each has its own writer, and each draws fences. A takeover by one
/// must never draw the fence the other's holder has, or the holder's late
/// completion would land on the new claim (two executions, one record).
#[test]
fn two_stores_on_one_file_never_draw_the_same_fence() {
    use idem_testkit::{LEASE, request, response, t0, unique_id};
    let rt = idem_testkit::runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let (a, b) = (
        SqliteStore::open(&path).unwrap(),
        SqliteStore::open(&path).unwrap(),
    );
    rt.block_on(async {
        // `a` draws two fences and `b` none: with a counter of its own,
        // `b`'s takeover (one fence skipped by its insert, then one drawn)
        // would draw exactly the holder's.
        let filler = unique_id("two-writers-filler");
        assert!(matches!(
            a.claim(&request(&filler, "{}", t0())).await.unwrap(),
            Claim::Acquired(_)
        ));
        let id = unique_id("two-writers-takeover");
        let first = acquire(&a, &id, t0()).await;
        let later = t0() + LEASE + std::time::Duration::from_secs(1);
        let Claim::Acquired(second) = b.claim(&request(&id, "{}", later)).await.unwrap() else {
            panic!("expected a takeover once the lease ended")
        };
        assert_ne!(
            first.fence, second.fence,
            "a takeover drew the holder's fence"
        );
        let late = Completion::completed(response(201, "late holder"));
        assert_eq!(
            a.complete(&id, first.fence, late, later).await.unwrap(),
            Settled::StaleFence,
            "the first holder's late completion was applied to the takeover's claim"
        );
        let own = Completion::completed(response(201, "taker"));
        assert_eq!(
            b.complete(&id, second.fence, own, later).await.unwrap(),
            Settled::Applied
        );

        // Claims alternated between the two never share a fence.
        let mut seen = std::collections::HashSet::new();
        let mut claim_new = async |store: &SqliteStore, id: &RecordId| {
            let lease = acquire(store, id, t0()).await;
            assert!(
                seen.insert(lease.fence),
                "fence {:?} drawn twice",
                lease.fence
            );
            lease.fence
        };
        // One after the other, they also grow, whichever store draws.
        let mut last = second.fence;
        for i in 0..200 {
            let store = if i % 3 == 0 { &a } else { &b };
            let fence = claim_new(store, &unique_id(&format!("two-writers-{i:04}"))).await;
            assert!(fence > last, "{fence:?} after {last:?}");
            last = fence;
        }

        // And at once: tasks on both stores claim new keys concurrently,
        // and every fifth claim is of a record the other store holds with
        // its lease ended (a takeover across writers); no fence is drawn
        // twice, and every takeover's fence is above the record's.
        let mut held = Vec::new();
        for i in 0..40 {
            let store = if i % 2 == 0 { &a } else { &b };
            let id = unique_id(&format!("two-writers-held-{i:04}"));
            let fence = claim_new(store, &id).await;
            held.push((id, fence));
        }
        let held = std::sync::Arc::new(held);
        let tasks: Vec<_> = (0..8usize)
            .map(|t| {
                let store = if t % 2 == 0 { a.clone() } else { b.clone() };
                let held = held.clone();
                tokio::spawn(async move {
                    let mut fences = Vec::new();
                    for i in 0..25usize {
                        let (id, now, above) = if i % 5 == 0 {
                            // Even tasks (store `a`) take over `b`'s records
                            // (odd indexes), odd tasks `a`'s; each once.
                            let (id, fence) = &held[2 * (t / 2 * 5 + i / 5) + (t + 1) % 2];
                            (id.clone(), later, Some(*fence))
                        } else {
                            let id = unique_id(&format!("two-writers-{t}-{i:04}"));
                            (id, t0(), None)
                        };
                        let claim = store.claim(&request(&id, "{}", now)).await.unwrap();
                        let Claim::Acquired(lease) = claim else {
                            panic!("expected Acquired or a takeover, got {claim:?}")
                        };
                        if let Some(above) = above {
                            assert!(
                                lease.takeover && lease.fence > above,
                                "{lease:?} over {above:?}"
                            );
                        }
                        fences.push(lease.fence);
                    }
                    fences
                })
            })
            .collect();
        for task in tasks {
            for fence in task.await.unwrap() {
                assert!(seen.insert(fence), "fence {fence:?} drawn twice");
            }
        }
        assert_eq!(seen.len(), 200 + 40 + 8 * 25);

        // A race on one key through both stores: exactly one claim acquires.
        let raced = unique_id("two-writers-race");
        let racers: Vec<_> = (0..16)
            .map(|t| {
                let store = if t % 2 == 0 { a.clone() } else { b.clone() };
                let req = request(&raced, "{}", t0());
                tokio::spawn(async move { store.claim(&req).await.unwrap() })
            })
            .collect();
        let mut acquired = 0;
        for racer in racers {
            match racer.await.unwrap() {
                Claim::Acquired(_) => acquired += 1,
                Claim::InFlight { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(acquired, 1);
    });
}

/// Many concurrent writers end up in fewer transactions than operations:
/// the writer groups them. Counted through SQLite's own commit counter
/// would need a hook; instead, every claim is answered and visible.
#[test]
fn concurrent_claims_on_many_keys_all_commit() {
    use idem_testkit::{request, t0, unique_id};
    let rt = idem_testkit::runtime();
    rt.block_on(async {
        let store = fresh();
        let ids: Vec<_> = (0..500)
            .map(|i| unique_id(&format!("many-keys-{i:06}")))
            .collect();
        let mut tasks = Vec::new();
        for id in ids.clone() {
            let s = store.store().clone();
            tasks.push(tokio::spawn(async move {
                s.claim(&request(&id, "{}", t0())).await
            }));
        }
        for t in tasks {
            assert!(matches!(t.await.unwrap().unwrap(), Claim::Acquired(_)));
        }
        for id in &ids {
            assert!(store.get(id, t0()).await.unwrap().is_some());
        }
    });
}

/// Atomic mode: the shared suite of idem-testkit, and what only SQLite has
/// (a mutation runs on the writer thread, where a panic must not kill it).
mod atomic_mode {
    use std::ffi::OsString;
    use std::path::PathBuf;

    use idem_core::Atomic;
    use idem_testkit::atomic::{AtomicHarness, Call, Outcome, Plan, REFUSAL, REFUSED_RESOURCE_ID};
    use idem_testkit::{request, response, t0, unique_id};

    use super::*;

    idem_testkit::atomic_conformance_tests!(SqliteHarness);

    /// The crash child's store file.
    const PATH_VAR: &str = "IDEM_CRASH_PATH";

    /// A store file with a `transfers` table, in a temporary directory
    /// removed on drop (a crash child's harness owns no directory).
    struct SqliteHarness {
        path: PathBuf,
        _dir: Option<tempfile::TempDir>,
    }

    impl SqliteHarness {
        fn db(&self) -> Connection {
            Connection::open(&self.path).unwrap()
        }
    }

    /// The mutation a [`Plan`] describes, on the writer's connection.
    fn transfer(
        conn: &Connection,
        key: &str,
        plan: Plan,
    ) -> rusqlite::Result<(String, Completion)> {
        conn.execute(
            "INSERT INTO transfers (idem_key, amount) VALUES (?1, 100)",
            [key],
        )?;
        let row = conn.last_insert_rowid().to_string();
        let mut resource_id = row.clone();
        match plan {
            Plan::Transfer => {}
            Plan::FailAfterInsert => {
                conn.execute("INSERT INTO no_such_table VALUES (1)", [])?;
            }
            Plan::RefusedCompletion => resource_id = REFUSED_RESOURCE_ID.to_owned(),
            Plan::HangBeforeCommit => {
                idem_testkit::crash::say_ready();
                loop {
                    std::thread::park();
                }
            }
        }
        let c = Completion::completed(response(201, &format!("transfer {row}")))
            .with_resource_id(resource_id);
        Ok((row, c))
    }

    impl AtomicHarness for SqliteHarness {
        type Store = SqliteStore;

        async fn prepare() -> Option<Self> {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("atomic.db");
            drop(SqliteStore::open(&path).unwrap());
            let h = SqliteHarness {
                path,
                _dir: Some(dir),
            };
            h.db()
                .execute_batch(
                    "CREATE TABLE transfers (id INTEGER PRIMARY KEY, idem_key TEXT NOT NULL, amount INTEGER NOT NULL)",
                )
                .unwrap();
            Some(h)
        }

        fn crash_env(&self) -> Vec<(&'static str, OsString)> {
            vec![(PATH_VAR, self.path.clone().into_os_string())]
        }

        async fn from_crash_env() -> Self {
            let path = std::env::var_os(PATH_VAR)
                .unwrap_or_else(|| panic!("the crash child needs {PATH_VAR}"));
            SqliteHarness {
                path: path.into(),
                _dir: None,
            }
        }

        async fn connect(&self) -> SqliteStore {
            SqliteStore::open(&self.path).unwrap()
        }

        async fn complete_atomically(
            &self,
            store: &SqliteStore,
            id: &RecordId,
            fence: Fence,
            plan: Plan,
        ) -> Outcome {
            let key = id.key.as_str().to_owned();
            let out = store
                .complete_atomically(id, fence, move |conn| transfer(conn, &key, plan))
                .await?;
            Ok(out.map_failed(|e| e.to_string()))
        }

        async fn claim_and_complete_atomically(
            &self,
            store: &SqliteStore,
            req: &idem_core::ClaimRequest,
            plan: Plan,
        ) -> Result<idem_core::ClaimedAtomically<String, String>, idem_core::StoreError> {
            let key = req.id.key.as_str().to_owned();
            let out = store
                .claim_and_complete_atomically(req, move |conn, _fence| transfer(conn, &key, plan))
                .await?;
            Ok(out.map_failed(|e| e.to_string()))
        }

        async fn rows(&self, key: &str) -> i64 {
            self.db()
                .query_row(
                    "SELECT count(*) FROM transfers WHERE idem_key = ?1",
                    [key],
                    |r| r.get(0),
                )
                .unwrap()
        }

        async fn refuse_completions(&self) {
            self.db()
                .execute_batch(&format!(
                    "CREATE TRIGGER refuse_completion BEFORE UPDATE ON idem_records \
                     WHEN NEW.resource_id = '{REFUSED_RESOURCE_ID}' \
                     BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END;"
                ))
                .unwrap();
        }

        /// Holds the writer while the calls queue up, so that they share
        /// one group-commit batch.
        async fn run_together<'a>(&'a self, store: &'a SqliteStore, mut calls: Vec<Call<'a>>) {
            let (go, held) = hold_writer(store).await;
            for call in &mut calls {
                queue(call).await;
            }
            go.send(()).unwrap();
            assert!(matches!(
                held.await.unwrap().unwrap(),
                Atomic::Committed(())
            ));
            for call in calls {
                call.await;
            }
        }
    }

    /// A panicking mutation is rolled back like a failing one, the caller
    /// gets an error, and the writer thread lives on: the record is still
    /// the caller's, and its next atomic call commits.
    #[test]
    fn a_panicking_mutation_rolls_back_and_the_writer_lives_on() {
        idem_testkit::runtime().block_on(async {
            let h = SqliteHarness::prepare().await.unwrap();
            let store = h.connect().await;
            let id = unique_id("sqlite-atomic-panic");
            let Claim::Acquired(lease) = store.claim(&request(&id, "{}", t0())).await.unwrap()
            else {
                panic!()
            };
            let key = id.key.as_str().to_owned();
            let out = store
                .complete_atomically(
                    &id,
                    lease.fence,
                    move |conn| -> Result<((), Completion), rusqlite::Error> {
                        conn.execute(
                            "INSERT INTO transfers (idem_key, amount) VALUES (?1, 1)",
                            [&key],
                        )?;
                        panic!("mutation bug");
                    },
                )
                .await;
            assert!(out.is_err());
            assert_eq!(h.rows(id.key.as_str()).await, 0);

            let out = h
                .complete_atomically(&store, &id, lease.fence, Plan::Transfer)
                .await
                .unwrap();
            assert!(matches!(out, Atomic::Committed(_)), "{out:?}");
            assert_eq!(h.rows(id.key.as_str()).await, 1);
        });
    }
}

#[test]
fn a_version_1_store_is_migrated_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    drop(SqliteStore::open(&path).unwrap());
    let c = Connection::open(&path).unwrap();
    rewrite_as_old_schema(&c, 1, None);
    drop(c);
    drop(SqliteStore::open(&path).unwrap());
    let c = Connection::open(&path).unwrap();
    assert_eq!(user_version(&c), schema::SCHEMA_VERSION);
    let n: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_schema \
             WHERE name IN ('idem_records_stale', 'idem_records_expires_at')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 2);
    assert!(has_epoch_table(&c));
}

/// Rewrites a store file as schema `version` (1 to 5) had it, with the
/// same records: a table without rowid keyed by (scope, operation, key)
/// (schema 4: (scope, key, operation)), the indexes of that version, and
/// the fence counter (in `idem_meta` before schema 4) at `counter`, or at
/// the file's own value; schema 5 is today's without the epoch table
/// (schema 6).
fn rewrite_as_old_schema(c: &Connection, version: i64, counter: Option<i64>) {
    if version == 5 {
        c.execute_batch("BEGIN; DROP TABLE idem_epoch; PRAGMA user_version = 5; COMMIT;")
            .unwrap();
        return;
    }
    let counter: i64 = match counter {
        Some(n) => n,
        None => c
            .query_row(
                "SELECT value FROM idem_counters WHERE name = 'fence'",
                [],
                |r| r.get(0),
            )
            .unwrap(),
    };
    let stale = "CREATE INDEX idem_records_stale ON idem_records (lease_until, scope, operation, key) \
         WHERE status = 0;";
    let (primary_key, later, counter_sql) = if version == 4 {
        (
            "scope, key, operation",
            stale.to_owned(),
            format!("UPDATE idem_counters SET value = {counter} WHERE name = 'fence';"),
        )
    } else {
        let indexes = [
            "",
            stale,
            "CREATE INDEX idem_records_scope_key ON idem_records (scope, key);",
        ];
        (
            "scope, operation, key",
            indexes[..usize::try_from(version).unwrap()].concat(),
            format!(
                "DROP TABLE idem_counters;
                 CREATE TABLE idem_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
                 INSERT INTO idem_meta (name, value) VALUES ('fence', {counter});"
            ),
        )
    };
    c.execute_batch(&format!(
        "BEGIN;
         CREATE TEMP TABLE saved AS SELECT * FROM idem_records;
         DROP TABLE idem_records;
         CREATE TABLE idem_records (
             scope TEXT NOT NULL, operation TEXT NOT NULL, key TEXT NOT NULL,
             fingerprint BLOB NOT NULL, status INTEGER NOT NULL, fence INTEGER NOT NULL,
             created_at INTEGER NOT NULL, lease_until INTEGER, expires_at INTEGER NOT NULL,
             resource_id TEXT, response_status INTEGER, response_headers BLOB,
             response_body BLOB, PRIMARY KEY ({primary_key})
         ) WITHOUT ROWID;
         CREATE INDEX idem_records_expires_at ON idem_records (expires_at);
         {later}
         INSERT INTO idem_records SELECT * FROM saved;
         DROP TABLE saved;
         DROP TABLE IF EXISTS idem_epoch;
         {counter_sql}
         PRAGMA user_version = {version};
         COMMIT;"
    ))
    .unwrap();
}

/// The statements the store runs search the B-trees they were laid out
/// for: a claim and a completion the unique key index, the look-up by key
/// its (scope, key) prefix, the purge the expiry index and then the rowid.
#[test]
fn queries_search_the_keys_they_were_laid_out_for() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plans.db");
    drop(SqliteStore::open(&path).unwrap());
    let c = Connection::open(&path).unwrap();
    let plan = |sql: &str| -> String {
        let mut stmt = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        // Any parameters are left unbound (NULL): the plan does not depend on them.
        let rows = stmt
            .raw_query()
            .mapped(|r| r.get::<_, String>(3))
            .collect::<rusqlite::Result<Vec<_>>>()
            .unwrap();
        rows.join(" | ")
    };
    let by_key = plan(row::BY_KEY);
    let by_id = plan(row::BY_ID);
    assert!(
        by_id.contains("USING INDEX idem_records_key (scope=? AND key=? AND operation=?)"),
        "{by_id}"
    );
    assert!(
        by_key.contains("USING INDEX idem_records_key (scope=? AND key=?)"),
        "{by_key}"
    );
    let one = plan(crate::writer::COMPLETE);
    let release = plan(crate::writer::RELEASE);
    assert!(
        release.contains("USING INDEX idem_records_key (scope=? AND key=? AND operation=?)"),
        "{release}"
    );
    assert!(
        one.contains("USING INDEX idem_records_key (scope=? AND key=? AND operation=?)"),
        "{one}"
    );
    let extend = plan(crate::writer::EXTEND);
    assert!(
        extend.contains("USING INDEX idem_records_key (scope=? AND key=? AND operation=?)"),
        "{extend}"
    );
    let purge = plan(crate::writer::PURGE);
    assert!(
        purge.contains("USING INTEGER PRIMARY KEY (rowid=?)")
            && purge.contains("INDEX idem_records_expires_at (expires_at<?)"),
        "{purge}"
    );
}

/// A file written by the previous version (schema 2, no (scope, key)
/// index) is migrated on open, its records are kept, and they are found by
/// key afterwards.
#[test]
fn a_version_2_store_is_migrated_on_open() {
    use idem_testkit::{request, t0, unique_id};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2.db");
    let id = unique_id("migrate-v2-key-1");
    let rt = idem_testkit::runtime();
    {
        let store = SqliteStore::open(&path).unwrap();
        let claim = rt.block_on(store.claim(&request(&id, "{}", t0()))).unwrap();
        assert!(matches!(claim, Claim::Acquired(_)));
    }
    let c = Connection::open(&path).unwrap();
    rewrite_as_old_schema(&c, 2, None);
    drop(c);
    let store = SqliteStore::open(&path).unwrap();
    let found = rt
        .block_on(store.find_by_key(&id.scope, &id.key, t0(), 10))
        .unwrap();
    assert_eq!(
        found.iter().map(|r| &r.id).collect::<Vec<_>>(),
        [&id],
        "records written before the migration are found by key"
    );
    drop(store);
    let c = Connection::open(&path).unwrap();
    assert_eq!(user_version(&c), schema::SCHEMA_VERSION);
    assert!(has_epoch_table(&c));
}

/// A file written by schema 5 (before the epoch) gets the epoch table on
/// open, keeps its records, and its first epoch is written then.
#[test]
fn a_version_5_store_gets_its_epoch_table_on_open() {
    use idem_testkit::{request, t0, unique_id};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v5.db");
    let id = unique_id("migrate-v5-key-1");
    let rt = idem_testkit::runtime();
    {
        let store = SqliteStore::open(&path).unwrap();
        let claim = rt.block_on(store.claim(&request(&id, "{}", t0()))).unwrap();
        assert!(matches!(claim, Claim::Acquired(_)));
    }
    let c = Connection::open(&path).unwrap();
    let before = all_rows(&c);
    rewrite_as_old_schema(&c, 5, None);
    assert!(!has_epoch_table(&c));
    drop(c);
    let store = SqliteStore::open(&path).unwrap();
    let c = Connection::open(&path).unwrap();
    assert_eq!(user_version(&c), schema::SCHEMA_VERSION);
    assert!(has_epoch_table(&c));
    assert_eq!(all_rows(&c), before, "the records are untouched");
    let marks = rt.block_on(store.advance_epoch("after-v5")).unwrap();
    assert_eq!(
        marks,
        [idem_core::EpochMark::new("store", "after-v5", 1, true)]
    );
}

/// Whether the file has the epoch table (schema 6).
fn has_epoch_table(c: &Connection) -> bool {
    c.query_row(
        "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'idem_epoch'",
        [],
        |r| r.get::<_, i64>(0),
    )
    .unwrap()
        == 1
}

/// A file written by schema 3 (primary key (scope, operation, key) and an
/// index on (scope, key)) is rebuilt as a table with a rowid, found by key
/// through one unique index: every record and every column is kept, the
/// (scope, key) index goes, and the records are replayed, found by key,
/// and purged as before.
#[test]
fn a_version_3_store_is_rebuilt_on_open_with_every_record() {
    rebuilt_on_open_with_every_record(3);
}

/// The same for a file written by schema 4 (a table without rowid, keyed
/// by (scope, key, operation)).
#[test]
fn a_version_4_store_is_rebuilt_on_open_with_every_record() {
    rebuilt_on_open_with_every_record(4);
}

fn rebuilt_on_open_with_every_record(version: i64) {
    use idem_testkit::{TTL, request, response, t0, unique_id};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let rt = idem_testkit::runtime();
    // One scope and operation: `running` is written first, `done` a
    // millisecond later, and the old table's key order ("...-done" before
    // "...-running") is not time order.
    let done = unique_id("migrate-old-done");
    let running = RecordId::new(
        done.scope.clone(),
        done.operation.clone(),
        idem_core::Key::new("migrate-old-running").unwrap(),
    );
    let fences = rt.block_on(async {
        let store = SqliteStore::open(&path).unwrap();
        let b = acquire(&store, &running, t0()).await;
        let a = acquire(&store, &done, t0() + std::time::Duration::from_millis(1)).await;
        let c = Completion::completed(response(201, "kept"));
        assert_eq!(
            store.complete(&done, a.fence, c, t0()).await.unwrap(),
            Settled::Applied
        );
        (a.fence, b.fence)
    });
    // Rewrite the file as the old schema had it, with the same rows.
    let c = Connection::open(&path).unwrap();
    let before: Vec<Vec<rusqlite::types::Value>> = all_rows(&c);
    rewrite_as_old_schema(&c, version, None);
    drop(c);

    let store = SqliteStore::open(&path).unwrap();
    let wal = std::fs::metadata(dir.path().join("old.db-wal"))
        .unwrap()
        .len();
    assert_eq!(
        wal, 0,
        "the rebuilt table was checkpointed and the WAL truncated"
    );
    let c = Connection::open(&path).unwrap();
    assert_eq!(all_rows(&c), before, "every row and column survives");
    let (v, indexes) = (user_version(&c), index_names(&c));
    assert_eq!(v, schema::SCHEMA_VERSION);
    assert!(has_epoch_table(&c));
    assert_eq!(
        indexes,
        "idem_records_expires_at,idem_records_key,idem_records_stale"
    );
    let table: String = c
        .query_row(
            "SELECT sql FROM sqlite_schema WHERE name = 'idem_records'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        !table.contains("WITHOUT ROWID") && !table.contains("PRIMARY KEY"),
        "{table}"
    );
    rt.block_on(async {
        let Claim::Replay(rec) = store.claim(&request(&done, "{}", t0())).await.unwrap() else {
            panic!("expected a replay of the migrated record")
        };
        assert_eq!(rec.response, Some(response(201, "kept")));
        assert_eq!(rec.fence, fences.0);
        let found = store
            .find_by_key(&running.scope, &running.key, t0(), 10)
            .await
            .unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].fence, fences.1);
        // New fences stay above the migrated ones.
        let other = unique_id("migrate-old-new");
        let lease = acquire(&store, &other, t0()).await;
        assert!(lease.fence > fences.0 && lease.fence > fences.1);
        // The rebuilt rows are in the order they were written, and a new
        // claim goes after them.
        let in_rowid_order = texts(&c, "SELECT key FROM idem_records ORDER BY rowid");
        assert_eq!(
            in_rowid_order,
            [running.key.as_str(), done.key.as_str(), other.key.as_str()]
        );
        let later = t0() + TTL + std::time::Duration::from_secs(1);
        assert_eq!(store.purge_expired(later, 100).await.unwrap(), 3);
    });
}

/// The file's schema version.
fn user_version(c: &Connection) -> i64 {
    c.query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

/// The names of the indexes on the records written out in SQL (not
/// SQLite's own), sorted, joined by commas.
fn index_names(c: &Connection) -> String {
    c.query_row(
        "SELECT group_concat(name, ',') FROM (SELECT name FROM sqlite_schema \
         WHERE type = 'index' AND tbl_name = 'idem_records' COLLATE NOCASE \
         AND sql IS NOT NULL ORDER BY name)",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

/// The first column of every row `sql` returns, as text.
fn texts(c: &Connection, sql: &str) -> Vec<String> {
    c.prepare(sql)
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

/// Every row of the records table, every column, in key order.
fn all_rows(c: &Connection) -> Vec<Vec<rusqlite::types::Value>> {
    let mut stmt = c
        .prepare("SELECT * FROM idem_records ORDER BY scope, operation, key")
        .unwrap();
    let n = stmt.column_count();
    stmt.query_map([], |r| (0..n).map(|i| r.get(i)).collect())
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

/// A batch that fails (here, an application's trigger rolls the whole
/// transaction back) takes its rolled-back reservation with it: another
/// store on the file then reserves that very range, and the first store,
/// whose block ended at the same number, must not go on drawing from it.
#[test]
fn a_failed_batch_never_hands_its_fences_out_again() {
    use idem_testkit::{request, t0, unique_id};
    let rt = idem_testkit::runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("failing.db");
    let a = SqliteStore::open(&path).unwrap();
    let c = Connection::open(&path).unwrap();
    c.execute_batch(
        "CREATE TRIGGER app_refuses BEFORE INSERT ON idem_records WHEN NEW.key = 'boom' \
         BEGIN SELECT RAISE(ROLLBACK, 'refused'); END;",
    )
    .unwrap();
    drop(c);
    let boom = |tag: &str| {
        let mut id = unique_id("boom");
        id.scope = idem_core::Scope::from_raw(format!("failing-{tag}"));
        id
    };
    rt.block_on(async {
        let mut seen = std::collections::HashSet::new();
        let mut fence_of = async |store: &SqliteStore, tag: &str| {
            let id = unique_id(&format!("failing-{tag}"));
            let lease = acquire(store, &id, t0()).await;
            assert!(
                seen.insert(lease.fence),
                "fence {:?} drawn twice",
                lease.fence
            );
            lease.fence
        };
        // `a`'s first batch reserves its block and fails: the reservation
        // is rolled back. `b`, opened after, reserves from the same counter.
        let err = a
            .claim(&request(&boom("first"), "{}", t0()))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
        let b = SqliteStore::open(&path).unwrap();
        let from_b = fence_of(&b, "b-1").await;
        let from_a = fence_of(&a, "a-1").await;
        assert!(from_a > from_b);

        for i in 0..5 {
            fence_of(&a, &format!("a-after-{i}")).await;
            fence_of(&b, &format!("b-after-{i}")).await;
        }
    });
}

/// Batches with more claims than a block holds (the writer's batch may be
/// larger than the block) still draw each fence once.
#[test]
fn batches_larger_than_a_block_draw_distinct_fences() {
    use idem_testkit::{request, t0, unique_id};
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::builder(dir.path().join("big.db"))
        .max_batch(4096)
        .open()
        .unwrap();
    let rt = idem_testkit::runtime();
    let fences = rt.block_on(async {
        // The writer held while 3,000 claims queue up behind it, so that
        // they are taken as one batch.
        let (go, held) = hold_writer(&store).await;
        let mut calls = Vec::new();
        for i in 0..3000 {
            let s = store.clone();
            let req = request(&unique_id(&format!("big-{i:05}")), "{}", t0());
            let mut call = Box::pin(async move { s.claim(&req).await });
            queue(&mut call).await;
            calls.push(call);
        }
        go.send(()).unwrap();
        assert!(matches!(
            held.await.unwrap().unwrap(),
            idem_core::Atomic::Committed(_)
        ));
        let mut fences = Vec::new();
        for call in calls {
            let Claim::Acquired(lease) = call.await.unwrap() else {
                panic!("expected Acquired")
            };
            fences.push(lease.fence);
        }
        fences
    });
    let distinct: std::collections::HashSet<_> = fences.iter().collect();
    assert_eq!(distinct.len(), fences.len());
}

/// A schema 3 file whose fence counter fell behind its records (an older
/// idem with two processes on the file could lower it): after the
/// migration, a takeover's fence is above the record's and the old
/// holder's completion is refused, and new keys' fences are above every
/// fence the file holds.
#[test]
fn a_counter_behind_its_records_is_raised_by_the_migration() {
    use idem_testkit::{LEASE, request, response, t0, unique_id};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("behind.db");
    let rt = idem_testkit::runtime();
    let id = unique_id("behind-held");
    let held = rt.block_on(async {
        let store = SqliteStore::open(&path).unwrap();
        // Fences into the thousands, then the key this test takes over.
        for i in 0..1500 {
            let other = unique_id(&format!("behind-{i:05}"));
            assert!(matches!(
                store.claim(&request(&other, "{}", t0())).await.unwrap(),
                Claim::Acquired(_)
            ));
        }
        let lease = acquire(&store, &id, t0()).await;
        lease.fence
    });
    assert!(held.get() > 1500);
    let c = Connection::open(&path).unwrap();
    rewrite_as_old_schema(&c, 3, Some(3));
    drop(c);

    let store = SqliteStore::open(&path).unwrap();
    rt.block_on(async {
        // A new key first: its fence comes from the counter the migration
        // raised, not from a record it was compared with.
        let first = acquire(&store, &unique_id("behind-first"), t0()).await;
        assert!(first.fence > held, "{first:?} after {held:?}");
        let later = t0() + LEASE + std::time::Duration::from_secs(1);
        let Claim::Acquired(taken) = store.claim(&request(&id, "{}", later)).await.unwrap() else {
            panic!("expected a takeover")
        };
        assert!(taken.fence > held, "{taken:?} over {held:?}");
        let late = Completion::completed(response(201, "late"));
        assert_eq!(
            store.complete(&id, held, late, later).await.unwrap(),
            Settled::StaleFence
        );
        let fresh = unique_id("behind-fresh");
        let lease = acquire(&store, &fresh, t0()).await;
        assert!(lease.fence > taken.fence);
    });
}

/// What an application put beside the records (atomic mode invites its
/// tables into the file) survives the rebuild, from schema 3 and from
/// schema 4: a view over the records still reads them, a trigger on them
/// (its table named in another case) still fires, and an index on them is
/// still there.
#[test]
fn the_rebuild_keeps_views_and_triggers_on_the_records() {
    for version in [3, 4] {
        rebuild_keeps_views_and_triggers(version);
    }
}

fn rebuild_keeps_views_and_triggers(version: i64) {
    use idem_testkit::{request, response, t0, unique_id};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let rt = idem_testkit::runtime();
    let id = unique_id("app-objects");
    let other = unique_id("app-objects-later");
    let lease = rt.block_on(async {
        let store = SqliteStore::open(&path).unwrap();
        acquire(&store, &id, t0()).await
    });
    let c = Connection::open(&path).unwrap();
    rewrite_as_old_schema(&c, version, None);
    c.execute_batch(
        "CREATE TABLE app_audit (key TEXT NOT NULL, status INTEGER NOT NULL);
         CREATE VIEW app_done AS SELECT key FROM idem_records WHERE status = 1;
         CREATE TRIGGER app_on_complete AFTER UPDATE OF status ON IDEM_RECORDS
         BEGIN INSERT INTO app_audit (key, status) VALUES (NEW.key, NEW.status); END;
         CREATE INDEX app_by_resource ON idem_records (resource_id);",
    )
    .unwrap();
    drop(c);

    let store = SqliteStore::open(&path).unwrap();
    rt.block_on(async {
        let c = Completion::completed(response(201, "audited"));
        assert_eq!(
            store.complete(&id, lease.fence, c, t0()).await.unwrap(),
            Settled::Applied
        );
        assert!(matches!(
            store.claim(&request(&other, "{}", t0())).await.unwrap(),
            Claim::Acquired(_)
        ));
    });
    let c = Connection::open(&path).unwrap();
    let audited: Vec<(String, i64)> = c
        .prepare("SELECT key, status FROM app_audit")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(audited, [(id.key.as_str().to_owned(), 1)]);
    let done = texts(&c, "SELECT key FROM app_done");
    assert_eq!(done, [id.key.as_str().to_owned()]);
    let index: String = c
        .query_row(
            "SELECT sql FROM sqlite_schema WHERE name = 'app_by_resource'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(index.contains("(resource_id)"), "{index}");
}

/// Names idem used in older schemas, or uses in schema 5, may be the
/// application's in a schema 4 file: its index named like schema 3's
/// (scope, key) index and its trigger named like idem's stale index survive
/// the rebuild (the trigger still fires), and an index named like schema
/// 5's key index (in either case) makes the migration fail, leaving the
/// file at schema 4 with the application's index in place, instead of
/// dropping it.
#[test]
fn the_rebuild_keeps_an_application_index_named_like_ours_or_fails() {
    let dir = tempfile::tempdir().unwrap();

    let kept = dir.path().join("kept.db");
    drop(SqliteStore::open(&kept).unwrap());
    let c = Connection::open(&kept).unwrap();
    rewrite_as_old_schema(&c, 4, None);
    c.execute_batch(
        "CREATE INDEX idem_records_scope_key ON idem_records (resource_id);
         CREATE TABLE app_log (key TEXT NOT NULL);
         CREATE TRIGGER idem_records_stale AFTER INSERT ON idem_records
         BEGIN INSERT INTO app_log (key) VALUES (NEW.key); END;",
    )
    .unwrap();
    drop(c);
    let store = SqliteStore::open(&kept).unwrap();
    let id = idem_testkit::unique_id("app-trigger-after-migration");
    idem_testkit::runtime().block_on(acquire(&store, &id, idem_testkit::t0()));
    drop(store);
    let c = Connection::open(&kept).unwrap();
    assert_eq!(user_version(&c), schema::SCHEMA_VERSION);
    assert_eq!(
        index_names(&c),
        "idem_records_expires_at,idem_records_key,idem_records_scope_key,idem_records_stale"
    );
    assert_eq!(
        texts(&c, "SELECT key FROM app_log"),
        [id.key.as_str()],
        "the application's trigger named like idem's index still fires"
    );

    for name in ["IDEM_RECORDS_KEY", "idem_records_key"] {
        let taken = dir.path().join(format!("taken-{name}.db"));
        drop(SqliteStore::open(&taken).unwrap());
        let c = Connection::open(&taken).unwrap();
        rewrite_as_old_schema(&c, 4, None);
        c.execute_batch(&format!(
            "CREATE INDEX {name} ON idem_records (resource_id);"
        ))
        .unwrap();
        drop(c);
        let err = SqliteStore::open(&taken).expect_err("the name is taken");
        assert_eq!(err.kind(), StoreErrorKind::Setup, "{err}");
        assert!(err.to_string().contains(name), "{err}");
        let c = Connection::open(&taken).unwrap();
        assert_eq!(user_version(&c), 4);
        let mut expected = [name, "idem_records_expires_at", "idem_records_stale"];
        expected.sort_unstable();
        assert_eq!(index_names(&c), expected.join(","));
    }
}

/// An application table whose rows reference the records through a
/// foreign key (atomic mode invites its tables into the file) keeps them
/// through schema 5's rebuild: with foreign keys on (the bundled SQLite's
/// default), dropping the old table would have deleted every record first,
/// and through `ON DELETE CASCADE` the application's rows with them. After
/// the migration foreign keys are on again: the purge of the record still
/// cascades. A reference the rebuilt table cannot resolve (to schema 4's
/// primary key, which schema 5's table does not have) fails the migration,
/// naming the problem, and leaves the file at schema 4 with its rows.
#[test]
fn the_rebuild_keeps_rows_that_reference_the_records() {
    use idem_testkit::{t0, unique_id};
    let dir = tempfile::tempdir().unwrap();
    let rt = idem_testkit::runtime();
    let count = |path: &std::path::Path| -> i64 {
        Connection::open(path)
            .unwrap()
            .query_row("SELECT count(*) FROM app_payments", [], |r| r.get(0))
            .unwrap()
    };
    let old_file = |name: &str, reference: &str| {
        let path = dir.path().join(name);
        let id = unique_id("referenced");
        rt.block_on(async {
            let store = SqliteStore::open(&path).unwrap();
            acquire(&store, &id, t0()).await;
        });
        let c = Connection::open(&path).unwrap();
        rewrite_as_old_schema(&c, 4, None);
        c.execute_batch(&format!(
            "CREATE TABLE app_payments (id INTEGER PRIMARY KEY, scope TEXT, operation TEXT, key TEXT,
                 FOREIGN KEY (scope, key, operation) {reference} ON DELETE CASCADE);
             INSERT INTO app_payments (scope, operation, key) SELECT scope, operation, key FROM idem_records;"
        ))
        .unwrap();
        assert_eq!(count(&path), 1);
        path
    };

    let kept = old_file("kept.db", "REFERENCES idem_records (scope, key, operation)");
    // A row that was already an orphan (written with foreign keys off) is
    // the application's business: it does not stop the migration.
    Connection::open(&kept)
        .unwrap()
        .execute_batch(
            "PRAGMA foreign_keys = OFF;
             INSERT INTO app_payments (scope, operation, key) VALUES ('nobody', 'POST /x', 'gone');",
        )
        .unwrap();
    let store = SqliteStore::open(&kept).unwrap();
    assert_eq!(count(&kept), 2, "the migration kept the application's rows");
    let c = Connection::open(&kept).unwrap();
    assert_eq!(user_version(&c), schema::SCHEMA_VERSION);
    let violations: i64 = c
        .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(violations, 1, "the orphan from before");
    drop(c);
    let purged = rt
        .block_on(store.purge_expired(t0() + std::time::Duration::from_secs(400 * 86_400), 10))
        .unwrap();
    assert_eq!(purged, 1);
    assert_eq!(
        count(&kept),
        1,
        "foreign keys are on again: the purge cascades"
    );
    drop(store);

    let mismatched = old_file("mismatched.db", "REFERENCES idem_records");
    let err = SqliteStore::open(&mismatched).expect_err("schema 5 has no primary key to refer to");
    assert_eq!(err.kind(), StoreErrorKind::Setup, "{err}");
    assert!(err.to_string().contains("foreign key mismatch"), "{err}");
    let c = Connection::open(&mismatched).unwrap();
    assert_eq!(user_version(&c), 4);
    assert_eq!(count(&mismatched), 1);
}

/// The epoch (`idem_core::EpochWatch`) notices a file that lost data: its
/// epoch rows deleted (emptied), its counter set back or the file replaced
/// by a backup taken earlier (rolled back).
mod epoch {
    use idem_core::{EpochWatch, LossCause};

    use super::*;

    /// Advances the store's epoch and shows its one mark to `watch`:
    /// the causes of the losses it noticed.
    async fn check(store: &SqliteStore, watch: &mut EpochWatch, candidate: &str) -> Vec<LossCause> {
        let marks = store.advance_epoch(candidate).await.unwrap();
        assert_eq!(marks.len(), 1, "{marks:?}");
        assert_eq!(marks[0].place, "store");
        watch.observe(&marks).into_iter().map(|l| l.cause).collect()
    }

    #[test]
    fn deleted_rows_are_an_emptied_store_and_a_counter_set_back_a_rollback() {
        let rt = idem_testkit::runtime();
        let guarded = fresh();
        let store = guarded.store();
        let execute = |sql: &'static str| async move {
            Connection::open(store.path())
                .unwrap()
                .execute(sql, [])
                .unwrap();
        };
        rt.block_on(idem_testkit::epoch::hand_made_losses_are_seen(
            store,
            || execute("DELETE FROM idem_epoch"),
            || execute("UPDATE idem_epoch SET counter = 1"),
        ));
    }

    /// A backup taken while the store runs (`VACUUM INTO`, as an online
    /// backup would), restored over the file once the store is stopped:
    /// the reopened store's epoch is the same, its counter behind the
    /// watcher's.
    #[test]
    fn a_restored_backup_is_a_rollback() {
        let rt = idem_testkit::runtime();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let backup = dir.path().join("backup.db");
        let mut watch = EpochWatch::new();
        rt.block_on(async {
            let store = SqliteStore::open(&path).unwrap();
            assert!(check(&store, &mut watch, "kept").await.is_empty());
            assert!(check(&store, &mut watch, "x").await.is_empty());
            Connection::open(&path)
                .unwrap()
                .execute("VACUUM INTO ?1", [backup.to_str().unwrap()])
                .unwrap();
            assert!(check(&store, &mut watch, "y").await.is_empty());
            assert!(check(&store, &mut watch, "z").await.is_empty());
        });
        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.clone().into_os_string();
            file.push(suffix);
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => panic!("removing {file:?}: {e}"),
            }
        }
        std::fs::copy(&backup, &path).unwrap();
        rt.block_on(async {
            let store = SqliteStore::open(&path).unwrap();
            assert_eq!(
                check(&store, &mut watch, "restored").await,
                [LossCause::RolledBack { seen: 4, read: 3 }]
            );
            assert!(check(&store, &mut watch, "later").await.is_empty());
        });
    }
}

/// Backpressure: a stalled writer makes calls fail with `Unavailable`
/// (after the write timeout, or at once when the queue is full) instead of
/// piling up, and the store works again once the writer moves on.
mod backpressure {
    use std::time::{Duration, Instant};

    use idem_testkit::{request, t0, unique_id};

    use super::*;

    /// An upper bound for assertions, far beyond any expected wait.
    const BOUND: Duration = Duration::from_secs(20);

    fn open(dir: &tempfile::TempDir, max_queue: usize, timeout: Duration) -> SqliteStore {
        SqliteStore::builder(dir.path().join("store.db"))
            .max_queue(max_queue)
            .write_timeout(timeout)
            .open()
            .unwrap()
    }

    #[test]
    fn a_call_past_the_write_timeout_is_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let timeout = Duration::from_millis(200);
        let store = open(&dir, 10_000, timeout);
        idem_testkit::runtime().block_on(async {
            let (go, held) = hold_writer(&store).await;
            let id = unique_id("past-the-deadline");
            let started = Instant::now();
            let e = tokio::time::timeout(BOUND, store.claim(&request(&id, "{}", t0())))
                .await
                .expect("answered in bounded time")
                .unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e:?}");
            assert!(started.elapsed() >= timeout);
            // The holding call itself timed out too.
            assert!(held.await.unwrap().unwrap_err().is_unavailable());

            go.send(()).unwrap();
            // The writer still applied the late claim: the key is in
            // progress under a lease nobody holds, until it runs out.
            assert!(matches!(
                store.claim(&request(&id, "{}", t0())).await.unwrap(),
                Claim::InFlight { .. }
            ));
            let other = unique_id("after-the-deadline");
            assert!(matches!(
                store.claim(&request(&other, "{}", t0())).await.unwrap(),
                Claim::Acquired(_)
            ));
        });
    }

    #[test]
    fn calls_beyond_the_queue_capacity_fail_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir, 2, Duration::from_secs(600));
        idem_testkit::runtime().block_on(async {
            let (go, held) = hold_writer(&store).await;
            let ids: Vec<_> = (0..3)
                .map(|i| unique_id(&format!("queue-full-{i:04}")))
                .collect();
            let reqs: Vec<_> = ids.iter().map(|id| request(id, "{}", t0())).collect();
            let mut first = store.claim(&reqs[0]);
            let mut second = store.claim(&reqs[1]);
            queue(&mut first).await;
            queue(&mut second).await;
            // The queue holds two: the third call is refused without
            // waiting for the writer (whose timeout here is ten minutes).
            let e = tokio::time::timeout(BOUND, store.claim(&reqs[2]))
                .await
                .expect("refused at once, not after the write timeout")
                .unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e:?}");
            assert!(e.to_string().contains("queue is full"), "{e}");

            go.send(()).unwrap();
            assert!(matches!(
                held.await.unwrap().unwrap(),
                idem_core::Atomic::Committed(())
            ));
            assert!(matches!(first.await.unwrap(), Claim::Acquired(_)));
            assert!(matches!(second.await.unwrap(), Claim::Acquired(_)));
            // The refused call never reached the writer; it can be retried.
            assert!(store.get(&ids[2], t0()).await.unwrap().is_none());
            assert!(matches!(
                store.claim(&reqs[2]).await.unwrap(),
                Claim::Acquired(_)
            ));
        });
    }
}

/// The report follows the builder's `synchronous`: FULL keeps, OFF loses.
#[test]
fn durability_follows_synchronous() {
    idem_testkit::runtime().block_on(async {
        let full = fresh();
        let report = full.durability().await.unwrap();
        assert_eq!(report.findings[0].value, "FULL");
        assert_eq!(report.findings[0].verdict, idem_core::Verdict::Keeps);
        let dir = tempfile::tempdir().unwrap();
        let off = SqliteStore::builder(dir.path().join("off.db"))
            .synchronous(Synchronous::Off)
            .open()
            .unwrap();
        let report = off.durability().await.unwrap();
        assert_eq!(report.findings[0].value, "OFF");
        assert!(report.loses_records());
    });
}
