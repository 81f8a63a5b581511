//! The store: its pool and statements, and the `Store` operations: claims,
//! completions and releases through the batchers (`batch.rs`), whose
//! single-call path is here too; every other operation one statement on
//! a pooled connection.

use std::fmt;
use std::sync::Arc;

use idem_core::decode::{self, CorruptValue};
use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Durability, EpochMark, Fence, Key, Record,
    RecordId, Scope, Settled, StaleCursor, Store, StoreError, StoreErrorKind, Timestamp,
};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool, Row, TxOpts};

use crate::batch::lost;
use crate::error::{DeadlockRetries, corrupt, my_error};
use crate::row;
use crate::schema::{self, Statements};
use crate::single::{Inner, check_id};
use idem_core::batch::StoreBatchers;

/// The MySQL or MariaDB store. Clones share one pool and one set of
/// batchers.
#[derive(Clone)]
pub struct MysqlStore {
    pub(crate) inner: Arc<Inner>,
    /// Claims, completions and releases gathered into transactions
    /// (`batch.rs`); the batchers hold `inner`, not the other way round.
    pub(crate) batches: Arc<StoreBatchers>,
}

impl fmt::Debug for MysqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlStore")
            .field("database", &self.inner.database)
            .finish_non_exhaustive()
    }
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
            // One autocommitted DELETE: a deadlock victim deleted nothing.
            let mut retries = DeadlockRetries::default();
            loop {
                let answer = conn
                    .exec_drop(&self.inner.sql.purge, (now.as_millis(), limit))
                    .await;
                if !retries.again(&answer) {
                    break answer.map_err(|e| my_error("purging", e))?;
                }
            }
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
            let mut retries = DeadlockRetries::default();
            let (row, affected) = loop {
                let answer = advance_epoch_once(&mut conn, &self.inner.sql, candidate).await;
                if !retries.again(&answer) {
                    break answer.map_err(|e| my_error("advancing the epoch", e))?;
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
