//! Migrations on connect: instances that start together migrate a new
//! schema once, and schemas at older versions are brought to the newest
//! with their records kept.

use idem_core::{Claim, Store};
use idem_testkit::{IsolatedBackend, request, t0, unique_id, unique_name};

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

/// What version 5 added (the batch functions), dropped.
fn without_version_5(schema: &str) -> String {
    ["idem_claim_many", "idem_complete_many", "idem_release_many"]
        .map(|f| format!("DROP FUNCTION {schema}.{f};"))
        .join(" ")
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
        let old = TestPostgres::fresh(&url).await;
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
                 DROP TABLE {schema}.idem_epoch;
                 {}
                 DELETE FROM {schema}.idem_migrations WHERE version >= 3;",
                without_version_5(&schema)
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
                      WHERE schemaname = $1 AND indexname = 'idem_records_scope_key'), \
                     (SELECT count(*) FROM pg_tables \
                      WHERE schemaname = $1 AND tablename = 'idem_epoch')"
                ),
                &[&schema],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i32>(0), schema::VERSION);
        assert_eq!(row.get::<_, i64>(1), 1);
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
        let old = TestPostgres::fresh(&url).await;
        let schema = old.store().schema().to_owned();
        let id = unique_id("pg-migrate-v3-01");
        assert!(matches!(
            old.store().claim(&request(&id, "{}", t0())).await.unwrap(),
            Claim::Acquired(_)
        ));
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
        let store = PostgresStore::builder(&url)
            .schema(&schema)
            .pool_size(2)
            .connect()
            .await
            .unwrap();
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
