//! MySQL and MariaDB store for idem: many service or gateway instances
//! share one set of records, kept where many payment and commerce teams
//! keep everything else.
//!
//! ```no_run
//! use idem_mysql::MysqlStore;
//!
//! # async fn run() -> Result<(), idem_core::StoreError> {
//! let store = MysqlStore::builder("mysql://app@db:3306/payments")
//!     .database("idem")
//!     .pool_size(16)
//!     .connect()
//!     .await?;
//! // `store` implements `idem_core::Store`.
//! # Ok(()) }
//! ```
//!
//! # Behavior
//!
//! - MySQL 8 and MariaDB 10.11 (InnoDB). Every store operation is one
//!   statement and one round trip, prepared and cached per connection. A
//!   claim calls the `idem_claim` procedure (created by the migration),
//!   which locks the record, decides by docs/contract.md, *Records and
//!   their state machine*, writes and commits in one transaction of its
//!   own.
//! - The tables live in a database of their own (default `idem`), created
//!   and migrated on connect under a named lock (`GET_LOCK`), so instances
//!   that start together migrate once. A schema newer than this code is
//!   refused.
//! - Fences come from the records table's `AUTO_INCREMENT` (InnoDB keeps
//!   it across restarts): a new or taken-over record gets a new fence, and
//!   fences grow across every claim without a shared counter row.
//! - The pool's connections run at `READ COMMITTED`, so that claims of new
//!   keys take no gap locks, and with `innodb_lock_wait_timeout` set
//!   ([`lock_wait_timeout`](MysqlStoreBuilder::lock_wait_timeout), 5 s):
//!   a row another session holds fails the call with
//!   [`StoreErrorKind::Unavailable`] instead of hanging it. A claim that
//!   loses a deadlock is retried.
//! - Purge deletes expired records in bounded batches (`ORDER BY
//!   expires_at LIMIT n`).
//! - The server's clock is not used: `now` comes from the caller.
//!
//! It is not an HTTP layer: give the store to `idem_http::IdempotencyLayer`.
//!
//! [`StoreErrorKind::Unavailable`]: idem_core::StoreErrorKind::Unavailable

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Fence, Key, Record, RecordId, Scope, Settled,
    StaleCursor, Store, StoreError, StoreErrorKind, Timestamp,
};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool, Row};

mod atomic;
mod builder;
mod error;
mod row;
mod schema;

pub use atomic::MysqlTransaction;
pub use builder::MysqlStoreBuilder;
use error::{is_deadlock, my_error};
pub use idem_core::Atomic;
/// The driver's error, for atomic-mode closures.
pub use mysql_async::Error as MysqlError;
use schema::Statements;

/// How many times a claim that lost a deadlock is run again.
const DEADLOCK_RETRIES: usize = 8;

/// The MySQL or MariaDB store. Clones share one pool.
#[derive(Clone)]
pub struct MysqlStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    wait: Duration,
    /// The server's `max_allowed_packet`: a completion must fit in it.
    max_packet: u64,
    database: String,
    sql: Statements,
}

impl fmt::Debug for MysqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlStore")
            .field("database", &self.inner.database)
            .finish_non_exhaustive()
    }
}

fn millis(v: Duration) -> i64 {
    i64::try_from(v.as_millis()).unwrap_or(i64::MAX)
}

/// The longest scope, operation and key the columns hold (bytes).
const MAX_SCOPE: usize = 512;
const MAX_OPERATION: usize = 1024;
const MAX_KEY: usize = 255;

/// Refuses an id the columns cannot hold whole: never truncated into
/// another record's id, and a clear error instead of the server's.
fn check_id(id: &RecordId) -> Result<(), StoreError> {
    for (what, len, max) in [
        ("scope", id.scope.as_str().len(), MAX_SCOPE),
        ("operation", id.operation.as_str().len(), MAX_OPERATION),
        ("key", id.key.as_str().len(), MAX_KEY),
    ] {
        if len > max {
            return Err(StoreError::new(
                StoreErrorKind::Backend,
                format!(
                    "mysql store: the {what} is {len} bytes, longer than the {max} it can hold"
                ),
            ));
        }
    }
    Ok(())
}

/// The claim procedures' parameters, in their order.
fn claim_params(req: &ClaimRequest) -> (&str, &str, &str, &[u8], i64, i64, i64) {
    (
        req.id.scope.as_str(),
        req.id.operation.as_str(),
        req.id.key.as_str(),
        req.fingerprint.as_bytes(),
        req.now.as_millis(),
        millis(req.lease),
        millis(req.ttl),
    )
}

impl MysqlStore {
    /// Options for connecting to `url` (`mysql://user@host:port/db`).
    pub fn builder(url: impl Into<String>) -> MysqlStoreBuilder {
        MysqlStoreBuilder::new(url.into())
    }

    /// Connects with the default options.
    ///
    /// # Errors
    /// As [`MysqlStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<MysqlStore, StoreError> {
        MysqlStore::builder(url).connect().await
    }

    /// The database holding this store's tables.
    pub fn database(&self) -> &str {
        &self.inner.database
    }

    /// The pool, for applications that run their own queries beside the
    /// store.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Drops the store's database and everything in it. For tests.
    ///
    /// # Errors
    /// As any operation.
    pub async fn drop_database(&self) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        conn.query_drop(format!(
            "DROP DATABASE IF EXISTS {}",
            schema::quoted(&self.inner.database)
        ))
        .await
        .map_err(|e| my_error("dropping the database", e))
    }

    /// Refuses a completion the server would not take in one packet
    /// (`max_allowed_packet`): a clear error before the effect's record is
    /// attempted, instead of a broken connection. Keep the gateway's
    /// `--max-response` below it.
    fn check_fits(&self, completion: &Completion) -> Result<(), StoreError> {
        let size = completion.response.body.len()
            + completion.response.encode_headers().len()
            + completion.resource_id.as_ref().map_or(0, String::len)
            + 4096;
        if size as u64 > self.inner.max_packet {
            return Err(StoreError::new(
                StoreErrorKind::Backend,
                format!(
                    "mysql store: a completion of {size} bytes does not fit the server's max_allowed_packet ({})",
                    self.inner.max_packet
                ),
            ));
        }
        Ok(())
    }

    /// A pooled connection, within the connect timeout.
    async fn conn(&self) -> Result<Conn, StoreError> {
        match tokio::time::timeout(self.inner.wait, self.inner.pool.get_conn()).await {
            Ok(conn) => conn.map_err(|e| my_error("connecting", e)),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "mysql store: no connection available",
            )),
        }
    }
}

impl Store for MysqlStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            check_id(&req.id)?;
            let mut conn = self.conn().await?;
            let params = claim_params(req);
            let mut tries = 0;
            let row: Option<Row> = loop {
                match conn.exec_first(&self.inner.sql.claim, params).await {
                    Err(e) if is_deadlock(&e) && tries < DEADLOCK_RETRIES => tries += 1,
                    other => break other.map_err(|e| my_error("claiming", e))?,
                }
            };
            row::claim_from_row(req, row.as_ref())
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
            check_id(id)?;
            self.check_fits(&completion)?;
            let mut conn = self.conn().await?;
            complete_with(&mut conn, &self.inner.sql.complete, id, fence, &completion).await
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
            check_id(id)?;
            let mut conn = self.conn().await?;
            conn.exec_drop(
                &self.inner.sql.release,
                (
                    id.scope.as_str(),
                    id.operation.as_str(),
                    id.key.as_str(),
                    fence,
                ),
            )
            .await
            .map_err(|e| my_error("releasing", e))?;
            Ok(Settled::from_changed(conn.affected_rows()))
        })
    }

    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let row: Option<Row> = conn
                .exec_first(
                    &self.inner.sql.get,
                    (
                        id.scope.as_str(),
                        id.operation.as_str(),
                        id.key.as_str(),
                        now.as_millis(),
                    ),
                )
                .await
                .map_err(|e| my_error("reading a record", e))?;
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
            let mut conn = self.conn().await?;
            let limit = u64::try_from(limit).unwrap_or(u64::MAX);
            conn.exec_drop(&self.inner.sql.purge, (now.as_millis(), limit))
                .await
                .map_err(|e| my_error("purging", e))?;
            Ok(usize::try_from(conn.affected_rows()).unwrap_or(usize::MAX))
        })
    }

    fn list_stale<'a>(
        &'a self,
        now: Timestamp,
        after: Option<&'a StaleCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let (lease, scope, op, key) = match after {
                Some(c) => (
                    c.lease_until.as_millis(),
                    c.id.scope.as_str(),
                    c.id.operation.as_str(),
                    c.id.key.as_str(),
                ),
                None => (i64::MIN, "", "", ""),
            };
            let limit = u64::try_from(limit).unwrap_or(u64::MAX);
            let rows: Vec<Row> = conn
                .exec(
                    &self.inner.sql.stale,
                    (
                        now.as_millis(),
                        now.as_millis(),
                        lease,
                        scope,
                        op,
                        key,
                        limit,
                    ),
                )
                .await
                .map_err(|e| my_error("listing stale records", e))?;
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
            let mut conn = self.conn().await?;
            let limit = u64::try_from(limit).unwrap_or(u64::MAX);
            let rows: Vec<Row> = conn
                .exec(
                    &self.inner.sql.by_key,
                    (scope.as_str(), key.as_str(), now.as_millis(), limit),
                )
                .await
                .map_err(|e| my_error("finding records by key", e))?;
            rows.iter()
                .map(|row| row::record_with_operation_from_row(scope, key, row))
                .collect()
        })
    }
}

/// The completion statement, on a pooled connection ([`Store::complete`])
/// or inside an atomic-mode transaction.
async fn complete_with<Q: Queryable + AffectedRows>(
    conn: &mut Q,
    sql: &str,
    id: &RecordId,
    fence: i64,
    c: &Completion,
) -> Result<Settled, StoreError> {
    conn.exec_drop(
        sql,
        (
            c.status().code(),
            c.resource_id.as_deref(),
            i32::from(c.response.status),
            c.response.encode_headers(),
            c.response.body.as_slice(),
            id.scope.as_str(),
            id.operation.as_str(),
            id.key.as_str(),
            fence,
        ),
    )
    .await
    .map_err(|e| my_error("completing", e))?;
    Ok(Settled::from_changed(conn.changed()))
}

/// How many rows the last statement changed, on a connection or inside a
/// transaction.
trait AffectedRows {
    fn changed(&self) -> u64;
}

impl AffectedRows for Conn {
    fn changed(&self) -> u64 {
        self.affected_rows()
    }
}

impl AffectedRows for MysqlTransaction {
    fn changed(&self) -> u64 {
        self.affected_rows()
    }
}

#[cfg(test)]
mod tests;

/// The README's examples, compiled (and run, unless `no_run`) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
