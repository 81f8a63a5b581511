//! What the one-commit test files share: the server, a fresh schema with a
//! `transfers` business table, and its rows.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed assertion

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_core::RecordId;
use idem_postgres::PostgresStore;

pub(crate) fn url() -> Option<String> {
    idem_testkit::backend_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL")
}

/// A store on a schema of its own (named after `tag`) with a pool of
/// `pool`, and a `transfers (idem_key, scope)` table beside its records.
pub(crate) async fn fresh(url: &str, pool: usize, tag: &str) -> PostgresStore {
    static N: AtomicU32 = AtomicU32::new(0);
    let schema = format!(
        "idem_t_{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let store = PostgresStore::builder(url)
        .schema(schema)
        .pool_size(pool)
        .statement_timeout(Duration::from_secs(20))
        .connect()
        .await
        .expect("connect");
    let s = store.schema().to_owned();
    store
        .pool()
        .get()
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE TABLE {s}.transfers (id bigserial PRIMARY KEY, idem_key text NOT NULL, scope text NOT NULL)"
        ))
        .await
        .unwrap();
    store
}

/// The business row of a mutation, inside its transaction: `c` is the
/// store's transaction or its pooled connection in one.
pub(crate) async fn insert_transfer<C: idem_postgres::GenericClient + Sync>(
    c: &C,
    schema: &str,
    key: &str,
    scope: &str,
) -> Result<u64, tokio_postgres::Error> {
    c.execute(
        &format!("INSERT INTO {schema}.transfers (idem_key, scope) VALUES ($1, $2)"),
        &[&key, &scope],
    )
    .await
}

/// How many transfers record `id` made.
pub(crate) async fn rows(store: &PostgresStore, id: &RecordId) -> i64 {
    let s = store.schema();
    store
        .pool()
        .get()
        .await
        .unwrap()
        .query_one(
            &format!("SELECT count(*) FROM {s}.transfers WHERE idem_key = $1 AND scope = $2"),
            &[&id.key.as_str(), &id.scope.as_str()],
        )
        .await
        .unwrap()
        .get(0)
}
