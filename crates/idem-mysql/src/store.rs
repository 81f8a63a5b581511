//! The store: its pool and statements, and the `Store` operations: claims,
//! completions and releases through the batchers (`batch.rs`), whose
//! single-call path is here too; every other operation one statement on
//! a pooled connection.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::decode::{self, CorruptValue};
use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Durability, EpochMark, Fence, Key, Record,
    RecordId, Scope, Settled, StaleCursor, Store, StoreError, StoreErrorKind, Timestamp,
};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool, Row, TxOpts};

use crate::batch::lost;
use crate::error::{corrupt, is_deadlock, my_error};
use crate::row;
use crate::schema::{self, Statements};
use idem_core::batch::StoreBatchers;

/// How many times a claim that lost a deadlock is run again.
pub(crate) const DEADLOCK_RETRIES: usize = 8;

/// The MySQL or MariaDB store. Clones share one pool and one set of
/// batchers.
#[derive(Clone)]
pub struct MysqlStore {
    pub(crate) inner: Arc<Inner>,
    /// Claims, completions and releases gathered into transactions
    /// (`batch.rs`); the batchers hold `inner`, not the other way round.
    pub(crate) batches: Arc<StoreBatchers>,
}

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) wait: Duration,
    /// The server's `max_allowed_packet`: a completion must fit in it.
    pub(crate) max_packet: u64,
    pub(crate) database: String,
    pub(crate) sql: Statements,
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
pub(crate) fn check_id(id: &RecordId) -> Result<(), StoreError> {
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
pub(crate) fn claim_params(req: &ClaimRequest) -> (&str, &str, &str, &[u8], i64, i64, i64) {
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

    /// A pooled connection, within the connect timeout.
    pub(crate) async fn conn(&self) -> Result<Conn, StoreError> {
        self.inner.conn().await
    }
}

impl Inner {
    /// A pooled connection, within the connect timeout.
    pub(crate) async fn conn(&self) -> Result<Conn, StoreError> {
        match tokio::time::timeout(self.wait, self.pool.get_conn()).await {
            Ok(conn) => conn.map_err(|e| my_error("connecting", e)),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "mysql store: no connection available",
            )),
        }
    }

    /// Refuses a completion the server would not take in one packet
    /// (`max_allowed_packet`): a clear error before the effect's record is
    /// attempted, instead of a broken connection. Keep the gateway's
    /// `--max-response` below it.
    pub(crate) fn check_fits(&self, completion: &Completion) -> Result<(), StoreError> {
        let size = completion.response.body.len()
            + completion.response.encode_headers().len()
            + completion.resource_id.as_ref().map_or(0, String::len)
            + 4096;
        if size as u64 > self.max_packet {
            return Err(StoreError::new(
                StoreErrorKind::Backend,
                format!(
                    "mysql store: a completion of {size} bytes does not fit the server's max_allowed_packet ({})",
                    self.max_packet
                ),
            ));
        }
        Ok(())
    }

    /// How long a call the batchers run may take before it is dropped
    /// mid-flight, its connection with it: calls run in the batchers'
    /// tasks, which no caller's deadline cuts off, and a server that stops
    /// answering without a word would otherwise hold them (and their
    /// connections) until TCP gives up, minutes later.
    pub(crate) fn call_bound(&self) -> Duration {
        self.wait * 2
    }

    /// `call` within [`call_bound`](Self::call_bound); past it, dropped
    /// with its connection, and the outcome is unknown (`Unavailable`).
    pub(crate) async fn bounded<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.call_bound(), call).await {
            Ok(answer) => answer,
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                format!("mysql store: {what}: no answer in time"),
            )),
        }
    }

    /// One claim in a transaction of its own (the claim procedure's).
    pub(crate) async fn claim_one(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        check_id(&req.id)?;
        self.bounded("claiming", async {
            let mut conn = self.conn().await?;
            let params = claim_params(req);
            let mut tries = 0;
            let row: Option<Row> = loop {
                match conn.exec_first(&self.sql.claim, params).await {
                    Err(e) if is_deadlock(&e) && tries < DEADLOCK_RETRIES => tries += 1,
                    other => break other.map_err(|e| my_error("claiming", e))?,
                }
            };
            row::claim_from_row(req, row.as_ref())
        })
        .await
    }

    /// One completion, autocommitted.
    pub(crate) async fn complete_one(
        &self,
        id: &RecordId,
        fence: i64,
        completion: &Completion,
    ) -> Result<Settled, StoreError> {
        self.bounded("completing", async {
            let mut conn = self.conn().await?;
            complete_with(&mut conn, &self.sql.complete, id, fence, completion).await
        })
        .await
    }

    /// One release, autocommitted.
    pub(crate) async fn release_one(
        &self,
        id: &RecordId,
        fence: i64,
    ) -> Result<Settled, StoreError> {
        self.bounded("releasing", async {
            let mut conn = self.conn().await?;
            conn.exec_drop(
                &self.sql.release,
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
        .await
    }
}

impl Store for MysqlStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            check_id(&req.id)?;
            self.batches.claims.call(req.clone()).await.map_err(lost)?
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
            self.inner.check_fits(&completion)?;
            self.batches
                .completions
                .call((id.clone(), fence, completion))
                .await
                .map_err(lost)?
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
            self.batches
                .releases
                .call((id.clone(), fence))
                .await
                .map_err(lost)?
        })
    }

    // One `UPDATE`, and a second look when it changed no row: unless the
    // connection asked for `CLIENT_FOUND_ROWS`, MySQL counts only the rows
    // whose values changed, and a heartbeat that moves neither the lease
    // nor the expiry (both already as late) changes none; one that moves
    // only the expiry changes the row and counts. The second look is a
    // fresh read that changes nothing: a fence that holds the record then
    // has held it with a lease and an expiry at least as late since the
    // `UPDATE` (under one fence both only grow, and a fence never comes
    // back once it lost the record).
    fn extend_lease<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        lease_until: Timestamp,
        _now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(async move {
            let Some(fence) = fence.to_i64() else {
                return Ok(Settled::StaleFence);
            };
            check_id(id)?;
            let mut conn = self.conn().await?;
            let (scope, operation, key) =
                (id.scope.as_str(), id.operation.as_str(), id.key.as_str());
            let until = lease_until.as_millis();
            conn.exec_drop(
                &self.inner.sql.extend,
                (until, until, until, scope, operation, key, fence),
            )
            .await
            .map_err(|e| my_error("extending a lease", e))?;
            if conn.affected_rows() > 0 {
                return Ok(Settled::Applied);
            }
            let holds: Option<i64> = conn
                .exec_first(&self.inner.sql.holds, (scope, operation, key, fence))
                .await
                .map_err(|e| my_error("extending a lease", e))?;
            Ok(if holds.is_some() {
                Settled::Applied
            } else {
                Settled::StaleFence
            })
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

    /// One place, `store`: the epoch is the row of `idem_epoch` in the
    /// store's database, advanced in one transaction (`INSERT ... ON
    /// DUPLICATE KEY UPDATE`, then a read of the row it holds locked),
    /// atomic whatever other instances do at the same moment. A
    /// transaction that loses a deadlock is rolled back whole and run
    /// again.
    fn advance_epoch<'a>(
        &'a self,
        candidate: &'a str,
    ) -> BoxFuture<'a, Result<Vec<EpochMark>, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let mut tries = 0;
            let (row, affected) = loop {
                match advance_epoch_once(&mut conn, &self.inner.sql, candidate).await {
                    Err(e) if is_deadlock(&e) && tries < DEADLOCK_RETRIES => tries += 1,
                    other => break other.map_err(|e| my_error("advancing the epoch", e))?,
                }
            };
            let created = match affected {
                1 => true,
                2 => false,
                n => {
                    return Err(StoreError::new(
                        StoreErrorKind::Backend,
                        format!("mysql store: advancing the epoch affected {n} rows, not 1 or 2"),
                    ));
                }
            };
            let Some((epoch, counter)) = row else {
                return Err(StoreError::new(
                    StoreErrorKind::Backend,
                    "mysql store: the epoch was not there after its advance",
                ));
            };
            let epoch = decode::text(epoch, "epoch").map_err(corrupt)?;
            let counter =
                u64::try_from(counter).map_err(|_| corrupt(CorruptValue::new("epoch counter")))?;
            Ok(vec![EpochMark::new(EPOCH_PLACE, epoch, counter, created)])
        })
    }

    /// `innodb_flush_log_at_trx_commit` (anything but `1` loses records)
    /// and `sync_binlog` (anything but `1` is risky: a replica may miss
    /// commits).
    fn durability(&self) -> BoxFuture<'_, Result<Durability, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let row: Option<(String, String)> = conn
                .query_first(crate::durability::SQL)
                .await
                .map_err(|e| my_error("reading the durability settings", e))?;
            let (flush, binlog) = row.unwrap_or_else(|| ("unknown".into(), "unknown".into()));
            Ok(crate::durability::judge(&flush, &binlog))
        })
    }
}

/// The store's one place: the whole server loses data together.
const EPOCH_PLACE: &str = "store";

/// One try at advancing the epoch, in a transaction of its own on `conn`:
/// the row as read after the advance (epoch, counter) and the rows the
/// advance affected. On an error the transaction is dropped, and
/// mysql_async rolls it back before the connection's next use.
async fn advance_epoch_once(
    conn: &mut Conn,
    sql: &Statements,
    candidate: &str,
) -> Result<(Option<(Vec<u8>, i64)>, u64), mysql_async::Error> {
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    tx.exec_drop(&sql.epoch_advance, (EPOCH_PLACE, candidate))
        .await?;
    let affected = tx.affected_rows();
    let row: Option<(Vec<u8>, i64)> = tx.exec_first(&sql.epoch_read, (EPOCH_PLACE,)).await?;
    tx.commit().await?;
    Ok((row, affected))
}

/// The completion statement, on a pooled connection ([`Store::complete`])
/// or inside an atomic-mode transaction.
pub(crate) async fn complete_with<Q: Queryable + AffectedRows>(
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
pub(crate) trait AffectedRows {
    fn changed(&self) -> u64;
}

impl AffectedRows for Conn {
    fn changed(&self) -> u64 {
        self.affected_rows()
    }
}
