use idem_core::StoreErrorKind;
use idem_core::testkit::Guarded;

use super::*;

/// A fresh store in a temporary directory removed with the store.
fn fresh() -> Guarded<SqliteStore> {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("store.db")).expect("open store");
    Guarded::new(store, dir)
}

idem_core::conformance_tests!(async { fresh() });

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

/// Records and the fence counter survive closing and reopening the file.
#[test]
fn records_and_fences_survive_reopening() {
    use idem_core::testkit::{request, response, t0, unique_id};
    let rt = idem_core::testkit::runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reopen.db");
    let id = unique_id("reopen-key-00001");
    let first = rt.block_on(async {
        let store = SqliteStore::open(&path).unwrap();
        let Claim::Acquired(lease) = store.claim(&request(&id, "{}", t0())).await.unwrap() else {
            panic!("expected Acquired")
        };
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
        let Claim::Acquired(lease) = store.claim(&request(&other, "{}", t0())).await.unwrap()
        else {
            panic!("expected Acquired")
        };
        assert!(lease.fence > first, "the fence counter is persistent");
    });
}

/// Many concurrent writers end up in fewer transactions than operations:
/// the writer groups them. Counted through SQLite's own commit counter
/// would need a hook; instead, every claim is answered and visible.
#[test]
fn concurrent_claims_on_many_keys_all_commit() {
    use idem_core::testkit::{request, t0, unique_id};
    let rt = idem_core::testkit::runtime();
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

mod atomic_mode {
    use idem_core::testkit::{LEASE, request, response, t0, unique_id};
    use idem_core::{Atomic, Key, Operation, Scope, Status};

    use super::*;

    fn transfer_table(path: &Path) {
        Connection::open(path)
            .unwrap()
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS transfers (id INTEGER PRIMARY KEY, idem_key TEXT NOT NULL, amount INTEGER NOT NULL)",
            )
            .unwrap();
    }

    fn rows(path: &Path, key: &str) -> i64 {
        Connection::open(path)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM transfers WHERE idem_key = ?1",
                [key],
                |r| r.get(0),
            )
            .unwrap()
    }

    async fn transfer(
        store: &SqliteStore,
        id: &RecordId,
        fence: Fence,
    ) -> Atomic<i64, rusqlite::Error> {
        let key = id.key.as_str().to_owned();
        store
            .complete_atomically(id, fence, move |conn| {
                conn.execute(
                    "INSERT INTO transfers (idem_key, amount) VALUES (?1, 100)",
                    [&key],
                )?;
                let tid = conn.last_insert_rowid();
                let c = Completion::completed(response(201, &format!("transfer {tid}")))
                    .with_resource_id(tid.to_string());
                Ok((tid, c))
            })
            .await
            .unwrap()
    }

    #[test]
    fn commits_both_or_neither() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("atomic.db");
        let store = SqliteStore::open(&path).unwrap();
        transfer_table(&path);
        idem_core::testkit::runtime().block_on(async {
            let id = unique_id("sqlite-atomic-01");
            let Claim::Acquired(lease) = store.claim(&request(&id, "{}", t0())).await.unwrap()
            else {
                panic!()
            };
            let Atomic::Committed(tid) = transfer(&store, &id, lease.fence).await else {
                panic!("expected commit")
            };
            let rec = store.get(&id, t0()).await.unwrap().unwrap();
            assert_eq!(rec.status, Status::Completed);
            assert_eq!(rec.resource_id, Some(tid.to_string()));
            assert_eq!(rows(&path, id.key.as_str()), 1);

            // A failing mutation: rolled back, the record stays ours.
            let id = unique_id("sqlite-atomic-02");
            let Claim::Acquired(lease) = store.claim(&request(&id, "{}", t0())).await.unwrap()
            else {
                panic!()
            };
            let key = id.key.as_str().to_owned();
            let out = store
                .complete_atomically(&id, lease.fence, move |conn| {
                    conn.execute(
                        "INSERT INTO transfers (idem_key, amount) VALUES (?1, 1)",
                        [&key],
                    )?;
                    conn.execute("INSERT INTO no_such_table VALUES (1)", [])?;
                    Ok::<_, rusqlite::Error>(((), Completion::completed(response(200, "never"))))
                })
                .await
                .unwrap();
            assert!(matches!(out, Atomic::Failed(_)));
            assert_eq!(rows(&path, id.key.as_str()), 0);
            let rec = store.get(&id, t0()).await.unwrap().unwrap();
            assert_eq!((rec.status, rec.fence), (Status::InProgress, lease.fence));

            // A panicking mutation: rolled back, and the writer lives on.
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
            assert_eq!(rows(&path, id.key.as_str()), 0);

            // A stale fence: the mutation never runs.
            let Claim::Acquired(_) = store
                .claim(&request(&id, "{}", t0() + LEASE))
                .await
                .unwrap()
            else {
                panic!()
            };
            assert!(matches!(
                transfer(&store, &id, lease.fence).await,
                Atomic::StaleFence
            ));
            assert_eq!(rows(&path, id.key.as_str()), 0);
        });
    }

    fn crash_id(key: &str) -> RecordId {
        RecordId::new(
            Scope::from_raw("crash-test"),
            Operation::new("POST", "/transfers"),
            Key::new(key).unwrap(),
        )
    }

    /// The child half of the crash tests.
    #[test]
    #[ignore = "child process of the crash tests; run by them"]
    fn crash_child() {
        let (Ok(path), Ok(key), Ok(mode)) = (
            std::env::var("IDEM_CRASH_PATH"),
            std::env::var("IDEM_CRASH_KEY"),
            std::env::var("IDEM_CRASH_MODE"),
        ) else {
            panic!("crash_child needs IDEM_CRASH_* variables");
        };
        idem_core::testkit::runtime().block_on(async {
            let store = SqliteStore::open(&path).unwrap();
            let id = crash_id(&key);
            let Claim::Acquired(lease) = store.claim(&request(&id, "{}", t0())).await.unwrap()
            else {
                panic!("child could not claim")
            };
            let before_commit = mode == "before-commit";
            let key2 = key.clone();
            let out = store
                .complete_atomically(&id, lease.fence, move |conn| {
                    conn.execute(
                        "INSERT INTO transfers (idem_key, amount) VALUES (?1, 100)",
                        [&key2],
                    )?;
                    if before_commit {
                        println!("{}", idem_core::testkit::crash::READY);
                        loop {
                            std::thread::park();
                        }
                    }
                    Ok::<_, rusqlite::Error>(((), Completion::completed(response(201, "child"))))
                })
                .await
                .unwrap();
            assert!(matches!(out, Atomic::Committed(())));
            println!("{}", idem_core::testkit::crash::READY);
            std::future::pending::<()>().await;
        });
    }

    fn crash_test(mode: &str) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crash.db");
        drop(SqliteStore::open(&path).unwrap());
        transfer_table(&path);
        let key = format!("crash-{mode}-0001");
        idem_core::testkit::crash::run_until_ready_then_kill(
            "tests::atomic_mode::crash_child",
            &[
                ("IDEM_CRASH_PATH", path.as_os_str()),
                ("IDEM_CRASH_KEY", key.as_ref()),
                ("IDEM_CRASH_MODE", mode.as_ref()),
            ],
        );

        let store = SqliteStore::open(&path).unwrap();
        idem_core::testkit::runtime().block_on(async {
            let id = crash_id(&key);
            let retry = request(&id, "{}", t0() + LEASE);
            match (mode, store.claim(&retry).await.unwrap()) {
                ("before-commit", Claim::Acquired(lease)) => {
                    assert!(lease.takeover);
                    assert_eq!(rows(&path, &key), 0, "the killed transaction left nothing");
                    assert!(matches!(
                        transfer(&store, &id, lease.fence).await,
                        Atomic::Committed(_)
                    ));
                }
                ("after-commit", Claim::Replay(rec)) => assert_eq!(rec.status, Status::Completed),
                (mode, other) => panic!("{mode}: unexpected claim after the crash: {other:?}"),
            }
            assert_eq!(rows(&path, &key), 1, "exactly one transfer");
            assert!(matches!(
                store.claim(&retry).await.unwrap(),
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
}

#[test]
fn a_version_1_store_is_migrated_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    drop(SqliteStore::open(&path).unwrap());
    let c = Connection::open(&path).unwrap();
    c.execute_batch("DROP INDEX idem_records_stale; PRAGMA user_version = 1;")
        .unwrap();
    drop(c);
    drop(SqliteStore::open(&path).unwrap());
    let c = Connection::open(&path).unwrap();
    let v: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, schema::SCHEMA_VERSION);
    let n: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name = 'idem_records_stale'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 1);
}
