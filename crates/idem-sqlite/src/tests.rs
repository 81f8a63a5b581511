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
