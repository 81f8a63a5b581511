//! Migrations on connect: instances that start together migrate a new
//! schema once, and schemas at older versions are brought to the newest
//! with their records kept.

use idem_core::{Claim, Completion, Operation, RecordId, Settled, Store, StoreError};
use idem_testkit::{Guarded, IsolatedBackend, request, response, t0, unique_id, unique_name};

use crate::PostgresStore;
use crate::schema;
use crate::tests::{TestPostgres, rt};

/// Several instances migrating one new schema at the same moment: all
/// succeed, and the migration is recorded once.
#[test]
fn concurrent_first_connects_migrate_once() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let schema = unique_name("m");
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

/// What version 6 changed, undone: the key columns in the database's
/// collation, the primary key (scope, operation, key), and the (scope,
/// key) index of version 3 back.
fn back_to_version_5(schema: &str) -> String {
    format!(
        "ALTER TABLE {schema}.idem_records
             ALTER COLUMN scope TYPE text COLLATE \"default\",
             ALTER COLUMN operation TYPE text COLLATE \"default\",
             ALTER COLUMN key TYPE text COLLATE \"default\",
             DROP CONSTRAINT idem_records_pkey,
             ADD CONSTRAINT idem_records_pkey PRIMARY KEY (scope, operation, key);
         CREATE INDEX idem_records_scope_key ON {schema}.idem_records (scope, key);
         DELETE FROM {schema}.idem_migrations WHERE version >= 6;"
    )
}

/// What versions 5 and 6 did, undone: [`back_to_version_5`], and the batch
/// functions dropped.
fn without_version_5(schema: &str) -> String {
    let functions = ["idem_claim_many", "idem_complete_many", "idem_release_many"]
        .map(|f| format!("DROP FUNCTION {schema}.{f};"))
        .join(" ");
    format!("{} {functions}", back_to_version_5(schema))
}

/// The collation of each key column, and the primary key's definition,
/// of the records table in `schema`.
async fn key_layout(client: &deadpool_postgres::Client, schema: &str) -> (Vec<String>, String) {
    let collations = client
        .query(
            "SELECT c.collname::text FROM pg_attribute a \
             JOIN pg_collation c ON c.oid = a.attcollation \
             WHERE a.attrelid = ($1 || '.idem_records')::regclass \
               AND a.attname IN ('scope', 'operation', 'key') ORDER BY a.attnum",
            &[&schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let primary_key = client
        .query_one(
            "SELECT pg_get_indexdef(($1 || '.idem_records_pkey')::regclass)",
            &[&schema],
        )
        .await
        .unwrap()
        .get(0);
    (collations, primary_key)
}

/// A schema at version 5 is migrated on connect to byte keys and one
/// index fewer: the key columns compare as bytes (`COLLATE "C"`), the
/// primary key is (scope, key, operation), the (scope, key) index is
/// gone, and every record is kept: a finished one replays, one in flight
/// is in flight, both are found by key, and a new key is acquired.
#[test]
fn a_version_5_schema_gets_byte_keys_and_one_index_fewer_on_connect() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let old = TestPostgres::fresh(&url).await;
        let schema = old.store().schema().to_owned();
        let done = unique_id("pg-migrate-v5-done");
        let open = RecordId::new(
            done.scope.clone(),
            Operation::new("PUT", "/testkit"),
            done.key.clone(),
        );
        let Claim::Acquired(lease) = old.store().claim(&request(&done, "a", t0())).await.unwrap()
        else {
            panic!("a new key is acquired");
        };
        let answer = Completion::completed(response(201, "kept"));
        assert_eq!(
            old.store()
                .complete(&done, lease.fence, answer, t0())
                .await
                .unwrap(),
            Settled::Applied
        );
        assert!(matches!(
            old.store().claim(&request(&open, "b", t0())).await.unwrap(),
            Claim::Acquired(_)
        ));
        let client = old.store().pool().get().await.unwrap();
        client
            .batch_execute(&back_to_version_5(&schema))
            .await
            .unwrap();
        let (collations, primary_key) = key_layout(&client, &schema).await;
        assert_eq!(collations, ["default", "default", "default"]);
        assert!(
            primary_key.ends_with("(scope, operation, key)"),
            "{primary_key}"
        );
        drop(client);

        let store = reopen(&url, &schema, 2).await.unwrap();
        let client = store.pool().get().await.unwrap();
        let (collations, primary_key) = key_layout(&client, &schema).await;
        assert_eq!(collations, ["C", "C", "C"]);
        assert!(
            primary_key.ends_with("(scope, key, operation)"),
            "{primary_key}"
        );
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
        assert_eq!(row.get::<_, i32>(0), schema::VERSION);
        assert_eq!(row.get::<_, i64>(1), 0, "the (scope, key) index is dropped");
        drop(client);

        match store.claim(&request(&done, "a", t0())).await.unwrap() {
            Claim::Replay(record) => {
                assert_eq!(record.response, Some(response(201, "kept")));
            }
            other => panic!("the finished record replays: {other:?}"),
        }
        assert!(matches!(
            store.claim(&request(&open, "b", t0())).await.unwrap(),
            Claim::InFlight { .. }
        ));
        let mut found: Vec<RecordId> = store
            .find_by_key(&done.scope, &done.key, t0(), 10)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        found.sort_by(|a, b| a.operation.as_str().cmp(b.operation.as_str()));
        assert_eq!(found, [done.clone(), open.clone()]);
        let fresh = unique_id("pg-migrate-v5-new");
        assert!(matches!(
            store.claim(&request(&fresh, "c", t0())).await.unwrap(),
            Claim::Acquired(_)
        ));
        store.drop_schema().await.unwrap();
    });
}

/// A new instance on `schema` with a pool of `pool`, which migrates it.
async fn reopen(url: &str, schema: &str, pool: usize) -> Result<PostgresStore, StoreError> {
    PostgresStore::builder(url)
        .schema(schema)
        .pool_size(pool)
        .connect()
        .await
}

/// A fresh schema (dropped with the guard) holding one record in flight,
/// claimed with the key `key`: the guard, the schema's name and the id.
async fn one_claim(url: &str, key: &str) -> (Guarded<PostgresStore>, String, RecordId) {
    let guard = TestPostgres::fresh(url).await;
    let schema = guard.store().schema().to_owned();
    let id = unique_id(key);
    assert!(matches!(
        guard
            .store()
            .claim(&request(&id, "{}", t0()))
            .await
            .unwrap(),
        Claim::Acquired(_)
    ));
    (guard, schema, id)
}

/// A schema at version 2 (before the (scope, key) index and the epoch
/// table) is migrated on connect; its records are kept and found by key
/// afterwards.
#[test]
fn a_version_2_schema_is_migrated_on_connect() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let (old, schema, id) = one_claim(&url, "pg-migrate-v2-01").await;
        let client = old.store().pool().get().await.unwrap();
        client
            .batch_execute(&format!(
                "{}
                 DROP INDEX {schema}.idem_records_scope_key;
                 DROP TABLE {schema}.idem_epoch;
                 DELETE FROM {schema}.idem_migrations WHERE version >= 3;",
                without_version_5(&schema)
            ))
            .await
            .unwrap();
        drop(client);
        let store = reopen(&url, &schema, 2).await.unwrap();
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
                      WHERE schemaname = $1 AND indexname = 'idem_records_scope_key'), \
                     (SELECT count(*) FROM pg_tables \
                      WHERE schemaname = $1 AND tablename = 'idem_epoch')"
                ),
                &[&schema],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i32>(0), schema::VERSION);
        assert_eq!(
            row.get::<_, i64>(1),
            0,
            "version 3's index, created on the way, is dropped by version 6"
        );
        assert_eq!(row.get::<_, i64>(2), 1, "the epoch table is created");
    });
}

/// A schema at version 3 (before the epoch) is migrated on connect: the
/// epoch table is created beside the records, which are kept, and the
/// first epoch is written by the first advance.
#[test]
fn a_version_3_schema_gets_its_epoch_table_on_connect() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let (old, schema, id) = one_claim(&url, "pg-migrate-v3-01").await;
        let client = old.store().pool().get().await.unwrap();
        client
            .batch_execute(&format!(
                "DROP TABLE {schema}.idem_epoch;
                 {}
                 DELETE FROM {schema}.idem_migrations WHERE version >= 4;",
                without_version_5(&schema)
            ))
            .await
            .unwrap();
        drop(client);
        let store = reopen(&url, &schema, 2).await.unwrap();
        assert!(store.get(&id, t0()).await.unwrap().is_some());
        let marks = store.advance_epoch("after-v3").await.unwrap();
        assert_eq!(
            marks,
            [idem_core::EpochMark::new("store", "after-v3", 1, true)]
        );
        let client = store.pool().get().await.unwrap();
        let version: i32 = client
            .query_one(
                &format!("SELECT max(version) FROM {schema}.idem_migrations"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(version, schema::VERSION);
    });
}

/// An instance that does not migrate (a gateway's serving thread) opens a
/// schema at this code's version, and refuses one that is missing, older
/// or newer, without taking the migration lock.
#[test]
fn an_instance_that_does_not_migrate_checks_the_version_only() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let schema = unique_name("nm");
        let open = || {
            PostgresStore::builder(url.clone())
                .schema(schema.clone())
                .pool_size(2)
                .migrate(false)
                .connect()
        };
        let missing = open().await.expect_err("no schema yet");
        assert_eq!(missing.kind(), idem_core::StoreErrorKind::Setup);
        assert!(
            missing.to_string().contains("not been created"),
            "{missing}"
        );
        let main = PostgresStore::builder(url.clone())
            .schema(schema.clone())
            .pool_size(2)
            .connect()
            .await
            .unwrap();
        // Another instance holding the migration lock does not hold it up.
        let mut holder = main.pool().get().await.unwrap();
        let lock = holder.transaction().await.unwrap();
        lock.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            &[&0x6964_656d_i32, &schema],
        )
        .await
        .unwrap();
        // A bound, not a wait: an instance that took the lock would hang.
        let thread = tokio::time::timeout(std::time::Duration::from_secs(20), open())
            .await
            .expect("the instance did not wait for the migration lock")
            .expect("a schema at this version opens");
        let id = unique_id("nm");
        assert!(matches!(
            thread.claim(&request(&id, "a", t0())).await.unwrap(),
            Claim::Acquired { .. }
        ));
        lock.rollback().await.unwrap();
        // Older and newer versions are refused.
        let versions = format!("{schema}.idem_migrations");
        let older = format!("DELETE FROM {versions} WHERE version = {}", schema::VERSION);
        let newer = format!(
            "INSERT INTO {versions} (version) VALUES ({}), ({})",
            schema::VERSION,
            schema::VERSION + 1
        );
        for (change, says) in [(older, "older"), (newer, "newer")] {
            holder.batch_execute(&change).await.unwrap();
            let e = open().await.expect_err("another version is refused");
            assert_eq!(e.kind(), idem_core::StoreErrorKind::Setup, "{e}");
            assert!(e.to_string().contains(says), "{e}");
        }
        drop(holder);
        main.drop_schema().await.unwrap();
    });
}

/// Reads prepared before a migration changed the columns they return (a
/// newer instance's migration, while this instance runs on) prepare
/// again, on every pooled connection: the server refuses a cached plan
/// whose result type changed, and the store empties every connection's
/// statement cache and reads once more. Here the change is the key
/// columns' collation, under an instance of two connections that both
/// prepared the look-up by key and the stale listing; each statement is
/// the first read after a change of its own, and is read on both
/// connections after it.
#[test]
fn reads_prepared_before_a_migration_changed_their_columns_prepare_again() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let guard = TestPostgres::fresh(&url).await;
        let schema = guard.store().schema().to_owned();
        let store = reopen(&url, &schema, 2).await.unwrap();
        let id = unique_id("pg-replan");
        assert!(matches!(
            store.claim(&request(&id, "a", t0())).await.unwrap(),
            Claim::Acquired(_)
        ));
        // After the lease: the record is stale.
        let later = t0() + idem_testkit::LEASE + std::time::Duration::from_secs(1);
        let by_key = || async {
            let found = store.find_by_key(&id.scope, &id.key, later, 10).await;
            let found = found.expect("the look-up by key answers");
            assert_eq!(found.iter().map(|r| &r.id).collect::<Vec<_>>(), [&id]);
        };
        let stale = || async {
            let listed = store.list_stale(later, None, 1000).await;
            let listed = listed.expect("the stale listing answers");
            assert!(listed.iter().any(|r| r.id == id));
        };
        // Two at once: each of the two connections prepares both.
        tokio::join!(by_key(), by_key());
        tokio::join!(stale(), stale());

        let client = guard.store().pool().get().await.unwrap();
        let collate = |collation: &str| {
            format!(
                "ALTER TABLE {schema}.idem_records
                     ALTER COLUMN scope TYPE text COLLATE \"{collation}\",
                     ALTER COLUMN operation TYPE text COLLATE \"{collation}\",
                     ALTER COLUMN key TYPE text COLLATE \"{collation}\";"
            )
        };
        client.batch_execute(&collate("default")).await.unwrap();
        for _ in 0..3 {
            by_key().await;
        }
        client.batch_execute(&collate("C")).await.unwrap();
        for _ in 0..3 {
            stale().await;
        }
    });
}

/// A migration that cannot have the records table's lock (a transaction
/// holds a record, as atomic mode's execution does) waits a bounded time
/// at each of a bounded number of tries, so claims do not queue behind it
/// for good; then the start fails as unavailable, with nothing applied,
/// and succeeds once the lock is free. Two instances start together: the
/// second waits for the first's migration lock, which is held through the
/// pauses, so reads of the table get through during each pause (with the
/// lock let go at each try's end, the other instance's try took the
/// pause's place, and reads waited almost throughout).
#[test]
fn a_migration_that_cannot_have_its_lock_gives_up_with_nothing_applied() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::time::{Duration, Instant};
        let (guard, schema, id) = one_claim(&url, "pg-migrate-held").await;
        let mut holder = guard.store().pool().get().await.unwrap();
        holder
            .batch_execute(&back_to_version_5(&schema))
            .await
            .unwrap();
        let held = holder.transaction().await.unwrap();
        held.query_one(
            &format!(
                "SELECT 1 FROM {schema}.idem_records WHERE scope = $1 AND key = $2 FOR UPDATE"
            ),
            &[&id.scope.as_str(), &id.key.as_str()],
        )
        .await
        .unwrap();
        let wait = Duration::from_millis(300);
        // Sessions that a server ends after 100 ms idle in a transaction:
        // the migration's own transaction idles through its pauses, and
        // must not be ended.
        let impatient = format!(
            "{url}{}options=-c%20idle_in_transaction_session_timeout%3D100",
            if url.contains('?') { '&' } else { '?' }
        );
        let open = || {
            PostgresStore::builder(&impatient)
                .schema(&schema)
                .pool_size(1)
                .migration_lock_wait(wait, 3)
                .connect()
        };
        // Reads of the table, as claims make, until the starts end: those
        // after the first that waited (a try had begun) are counted by
        // whether they passed within half a wait.
        let migrating = Arc::new(AtomicBool::new(true));
        let probes = {
            let prober = guard.store().pool().get().await.unwrap();
            let read = format!("SELECT count(*) FROM {schema}.idem_records");
            let migrating = migrating.clone();
            tokio::spawn(async move {
                let (mut fast, mut slow) = (0u32, 0u32);
                while migrating.load(Ordering::SeqCst) {
                    let sent = Instant::now();
                    prober.query_one(&read, &[]).await.unwrap();
                    if sent.elapsed() >= wait / 2 {
                        slow += 1;
                    } else if slow > 0 {
                        fast += 1;
                    }
                    // Pacing, not synchronisation: what is counted is
                    // each read's own latency.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                (fast, slow)
            })
        };
        // Bounded: a migration that waited without a bound would hang.
        let started = Instant::now();
        let (first, second) = tokio::time::timeout(Duration::from_secs(60), async {
            tokio::join!(open(), open())
        })
        .await
        .expect("the migrations gave up in bounded time");
        migrating.store(false, Ordering::SeqCst);
        let (fast, slow) = probes.await.unwrap();
        for refused in [
            first.expect_err("the lock is held"),
            second.expect_err("the lock is held"),
        ] {
            assert!(
                refused.to_string().contains("3 waits of 300 ms"),
                "{refused}"
            );
            assert!(refused.is_unavailable(), "{refused}");
        }
        // One after the other, each three waits and pauses of half a wait
        // and a whole one (a lower bound: a slow machine only adds to it).
        assert!(
            started.elapsed() >= wait * 9,
            "gave up after {:?}, before two migrations' waits and pauses",
            started.elapsed()
        );
        // Four pauses of 150 and 300 ms: reads pass in them.
        assert!(slow > 0, "no read waited behind a try");
        assert!(
            fast >= 4,
            "{fast} reads passed during the pauses, {slow} waited"
        );
        held.rollback().await.unwrap();
        let version = format!("SELECT max(version) FROM {schema}.idem_migrations");
        let at = holder
            .query_one(&version, &[])
            .await
            .unwrap()
            .get::<_, i32>(0);
        assert_eq!(at, 5, "nothing of it was applied");
        let store = open().await.expect("the lock is free");
        let at = holder
            .query_one(&version, &[])
            .await
            .unwrap()
            .get::<_, i32>(0);
        assert_eq!(at, schema::VERSION);
        assert!(matches!(
            store.claim(&request(&id, "{}", t0())).await.unwrap(),
            Claim::InFlight { .. }
        ));
    });
}
