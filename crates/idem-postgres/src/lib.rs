//! PostgreSQL store for idem: many service or gateway instances share one
//! set of records, and the atomic mode commits a business mutation and its
//! idempotency result in one transaction.
//!
//! ```no_run
//! use idem_postgres::PostgresStore;
//!
//! # async fn run() -> Result<(), idem_core::StoreError> {
//! let store = PostgresStore::builder("postgres://app@db/payments")
//!     .schema("idem")
//!     .pool_size(16)
//!     .connect()
//!     .await?;
//! // `store` implements `idem_core::Store`.
//! # Ok(()) }
//! ```
//!
//! # Behavior
//!
//! - Every store operation is one statement and one round trip, through
//!   prepared statements cached per connection. A claim calls the
//!   `idem_claim` function (PL/pgSQL, created by the migration), which locks
//!   the record, decides by docs/contract.md, *Records and their state machine*, and writes, atomically.
//! - The schema (default `idem`) is created and migrated on connect, under
//!   an advisory lock, so instances that start together are safe. A schema
//!   newer than this code is refused.
//! - Fences come from one sequence, so they grow across every claim.
//! - Layout: one table, `idem_records`, keyed by (scope, operation, key),
//!   with indexes on `expires_at` (purge), on the lease end of in-progress
//!   records (the stale listing, migration 2) and on (scope, key) (the
//!   look-up by key whatever the operation, migration 3); the `idem_fence`
//!   sequence; the `idem_claim` function; and `idem_migrations`, which
//!   records the applied versions.
//! - Purge deletes in bounded batches with `FOR UPDATE SKIP LOCKED`, so
//!   several instances can purge at once without waiting on each other or
//!   on traffic.
//! - Connection loss, server shutdown and pool timeouts are
//!   [`StoreErrorKind::Unavailable`]; the pool reconnects by itself when
//!   the server is back.
//! - Nothing waits without bound, and every limit fails closed with
//!   [`StoreErrorKind::Unavailable`] (the HTTP layer answers 503 and runs
//!   nothing): a call waits at most
//!   [`connect_timeout`](PostgresStoreBuilder::connect_timeout) (default
//!   5 s) for a pooled connection, and every statement runs under
//!   PostgreSQL's `statement_timeout`
//!   ([`statement_timeout`](PostgresStoreBuilder::statement_timeout),
//!   default 5 s, set on each connection the pool opens), so a stalled
//!   server or a row locked by another session does not hang callers.
//!   The statement timeout is enforced by the server; a server that
//!   vanishes from the network is noticed when the connection fails.
//!   Migrations run without it, on a connection closed afterwards.
//! - The server's clock is not used: `now` comes from the caller (see
//!   `idem_core::Timestamp`).
//!
//! # Atomic mode
//!
//! [`PostgresStore::complete_atomically`] runs your statements and the
//! completion of the record in one transaction, after locking the record
//! and checking the fence. If the process dies before commit, neither the
//! mutation nor the completion happened, and the retry (after the lease)
//! executes once. This is the only way to exactly-once effects without help
//! from downstream.
//!
//! ```no_run
//! # use idem_core::{Claim, Completion, Store, StoredResponse};
//! # use idem_postgres::{Atomic, PostgresStore};
//! # async fn run(store: PostgresStore, req: idem_core::ClaimRequest) -> Result<(), Box<dyn std::error::Error>> {
//! if let Claim::Acquired(lease) = store.claim(&req).await? {
//!     let outcome = store
//!         .complete_atomically(&req.id, lease.fence, |tx| {
//!             Box::pin(async move {
//!                 let row = tx
//!                     .query_one("INSERT INTO transfers (amount) VALUES (100) RETURNING id", &[])
//!                     .await?;
//!                 let id: i64 = row.get(0);
//!                 let response = StoredResponse { status: 201, headers: vec![], body: id.to_string().into_bytes() };
//!                 Ok::<_, tokio_postgres::Error>((id, Completion::completed(response).with_resource_id(id.to_string())))
//!             })
//!         })
//!         .await?;
//!     match outcome {
//!         Atomic::Committed(id) => println!("transfer {id} committed with its record"),
//!         Atomic::Failed(e) => println!("rolled back: {e}; release the claim"),
//!         Atomic::StaleFence => println!("lost the lease; nothing was written"),
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! [`StoreErrorKind::Unavailable`]: idem_core::StoreErrorKind::Unavailable

use std::fmt;
use std::sync::Arc;

use deadpool_postgres::{Object, Pool};
use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Fence, Key, Record, RecordId, Scope, Settled,
    StaleCursor, Store, StoreError, Timestamp,
};
use tokio_postgres::Statement;

mod atomic;
mod builder;
mod error;
mod row;
mod schema;
mod tls;

pub use builder::PostgresStoreBuilder;
pub use deadpool_postgres::{Client, GenericClient, Transaction};
use error::{pg_error, pool_error};
pub use idem_core::Atomic;
use row::millis;
use schema::Statements;
/// The PostgreSQL driver's error and parameter trait, for atomic-mode closures.
pub use tokio_postgres::{Error as PgError, types::ToSql};

/// The PostgreSQL store. Clones share one pool.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    schema: String,
    sql: Statements,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("schema", &self.inner.schema)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Options for connecting to `url` (`postgres://user@host:port/db`).
    pub fn builder(url: impl Into<String>) -> PostgresStoreBuilder {
        PostgresStoreBuilder::new(url.into())
    }

    /// Connects with the default options.
    ///
    /// # Errors
    /// As [`PostgresStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        PostgresStore::builder(url).connect().await
    }

    /// The schema this store uses.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// The pool, for applications that run their own queries beside the
    /// store (atomic mode uses it too).
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Drops the store's schema and everything in it. For tests.
    ///
    /// # Errors
    /// As any operation.
    pub async fn drop_schema(&self) -> Result<(), StoreError> {
        let client = self.inner.pool.get().await.map_err(pool_error)?;
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {} CASCADE",
                self.inner.schema
            ))
            .await
            .map_err(|e| pg_error("dropping the schema", e))
    }

    /// A pooled connection with `sql` prepared on it (statements are cached
    /// per connection, so this is a lookup after the first time).
    async fn prepared(&self, sql: &str, what: &str) -> Result<(Object, Statement), StoreError> {
        let client = self.inner.pool.get().await.map_err(pool_error)?;
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(|e| pg_error(&format!("preparing {what}"), e))?;
        Ok((client, stmt))
    }
}

impl Store for PostgresStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let (client, stmt) = self.prepared(&self.inner.sql.claim, "claim").await?;
            let row = client
                .query_one(
                    &stmt,
                    &[
                        &req.id.scope.as_str(),
                        &req.id.operation.as_str(),
                        &req.id.key.as_str(),
                        &req.fingerprint.as_bytes(),
                        &req.now.as_millis(),
                        &millis(req.lease),
                        &millis(req.ttl),
                    ],
                )
                .await
                .map_err(|e| pg_error("claiming", e))?;
            row::claim_from_row(req, &row)
        })
    }

    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        completion: Completion,
        _now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(async move {
            let Some(fence) = fence.to_i64() else {
                return Ok(Settled::StaleFence);
            };
            let client = self.inner.pool.get().await.map_err(pool_error)?;
            complete_with(&client, &self.inner.sql.complete, id, fence, &completion).await
        })
    }

    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        _now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(async move {
            let Some(fence) = fence.to_i64() else {
                return Ok(Settled::StaleFence);
            };
            let (client, stmt) = self.prepared(&self.inner.sql.release, "release").await?;
            let n = client
                .execute(
                    &stmt,
                    &[
                        &id.scope.as_str(),
                        &id.operation.as_str(),
                        &id.key.as_str(),
                        &fence,
                    ],
                )
                .await
                .map_err(|e| pg_error("releasing", e))?;
            Ok(Settled::from_changed(n))
        })
    }

    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            let (client, stmt) = self.prepared(&self.inner.sql.get, "get").await?;
            let row = client
                .query_opt(
                    &stmt,
                    &[
                        &id.scope.as_str(),
                        &id.operation.as_str(),
                        &id.key.as_str(),
                        &now.as_millis(),
                    ],
                )
                .await
                .map_err(|e| pg_error("reading a record", e))?;
            row.map(|row| row::record_from_row(id.clone(), &row))
                .transpose()
        })
    }

    fn purge_expired(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(async move {
            let (client, stmt) = self.prepared(&self.inner.sql.purge, "purge").await?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let n = client
                .execute(&stmt, &[&now.as_millis(), &limit])
                .await
                .map_err(|e| pg_error("purging", e))?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
    }

    fn list_stale<'a>(
        &'a self,
        now: Timestamp,
        after: Option<&'a StaleCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        Box::pin(async move {
            let (client, stmt) = self
                .prepared(&self.inner.sql.stale, "stale listing")
                .await?;
            let (lease, scope, op, key) = match after {
                Some(c) => (
                    c.lease_until.as_millis(),
                    c.id.scope.as_str(),
                    c.id.operation.as_str(),
                    c.id.key.as_str(),
                ),
                None => (i64::MIN, "", "", ""),
            };
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = client
                .query(
                    &stmt,
                    &[&now.as_millis(), &lease, &scope, &op, &key, &limit],
                )
                .await
                .map_err(|e| pg_error("listing stale records", e))?;
            rows.iter().map(row::record_with_id_from_row).collect()
        })
    }

    fn find_by_key<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a Key,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        Box::pin(async move {
            let (client, stmt) = self
                .prepared(&self.inner.sql.by_key, "the look-up by key")
                .await?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = client
                .query(
                    &stmt,
                    &[&scope.as_str(), &key.as_str(), &now.as_millis(), &limit],
                )
                .await
                .map_err(|e| pg_error("finding records by key", e))?;
            rows.iter()
                .map(|row| row::record_with_operation_from_row(scope, key, row))
                .collect()
        })
    }
}

/// The completion statement, on a plain client ([`Store::complete`]) or
/// inside the atomic-mode transaction; `fence` is one
/// [`Fence::to_i64`] accepted.
async fn complete_with<C: GenericClient + Sync>(
    client: &C,
    sql: &str,
    id: &RecordId,
    fence: i64,
    c: &Completion,
) -> Result<Settled, StoreError> {
    let stmt = client
        .prepare_cached(sql)
        .await
        .map_err(|e| pg_error("preparing complete", e))?;
    let n = client
        .execute(
            &stmt,
            &[
                &id.scope.as_str(),
                &id.operation.as_str(),
                &id.key.as_str(),
                &fence,
                &(c.status().code() as i16),
                &c.resource_id.as_deref(),
                &i32::from(c.response.status),
                &c.response.encode_headers(),
                &c.response.body,
            ],
        )
        .await
        .map_err(|e| pg_error("completing", e))?;
    Ok(Settled::from_changed(n))
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;

/// The README's examples, compiled (and run, unless `no_run`) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
