//! The store: its pool and statements, and the `Store` operations, each
//! one prepared statement on a pooled connection; claims, completions and
//! releases gathered into batches by `batch.rs`.

use std::fmt;
use std::sync::Arc;

use deadpool_postgres::{GenericClient, Pool};
use idem_core::decode::CorruptValue;
use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Durability, EpochMark, Fence, Key, Record,
    RecordId, Scope, Settled, StaleCursor, Store, StoreError, Timestamp,
};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement};

use crate::batch::lost;
use crate::error::{corrupt, pg_error};
use crate::pooled::{Pooled, forget_changed_plans};
use crate::row;
use crate::schema::Statements;
use crate::single::prepared;
use idem_core::batch::StoreBatchers;

/// The PostgreSQL store. Clones share one pool.
#[derive(Clone)]
pub struct PostgresStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) schema: String,
    pub(crate) sql: Arc<Statements>,
    /// Claims, completions and releases of concurrent calls, sent in
    /// batches (`batch.rs`).
    pub(crate) batches: StoreBatchers,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("schema", &self.inner.schema)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
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
        let client = Pooled::get(&self.inner.pool).await?;
        let answer = client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {} CASCADE",
                self.inner.schema
            ))
            .await;
        client
            .answered(answer)
            .map_err(|e| pg_error("dropping the schema", e))
    }

    /// [`prepared`] on the store's pool.
    async fn prepared(&self, sql: &str, what: &str) -> Result<(Pooled, Statement), StoreError> {
        prepared(&self.inner.pool, sql, what).await
    }

    /// The rows a read statement answers (`sql`, prepared as `what`,
    /// failing as `doing`), tried once more when its first try met its
    /// cached plan changed under it ([`forget_changed_plans`], which
    /// empties every connection's cache first, so the second try prepares
    /// it again on whichever connection it is handed). A read changes
    /// nothing, so two tries cannot do anything twice.
    async fn read(
        &self,
        sql: &str,
        what: &str,
        doing: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let mut tried = false;
        loop {
            let (client, stmt) = self.prepared(sql, what).await?;
            let answer = client.query(&stmt, params).await;
            match answer {
                Err(e) if !tried && forget_changed_plans(&self.inner.pool, &e) => {
                    client.answered(());
                    tried = true;
                }
                answer => return client.answered(answer).map_err(|e| pg_error(doing, e)),
            }
        }
    }
}

impl Store for PostgresStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            self.inner
                .batches
                .claims
                .call(req.clone())
                .await
                .map_err(lost)?
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
            self.inner
                .batches
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
            self.inner
                .batches
                .releases
                .call((id.clone(), fence))
                .await
                .map_err(lost)?
        })
    }

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
            let (client, stmt) = self
                .prepared(&self.inner.sql.extend, "the lease extension")
                .await?;
            let answer = client
                .execute(
                    &stmt,
                    &[
                        &id.scope.as_str(),
                        &id.operation.as_str(),
                        &id.key.as_str(),
                        &fence,
                        &lease_until.as_millis(),
                    ],
                )
                .await;
            let n = client
                .answered(answer)
                .map_err(|e| pg_error("extending a lease", e))?;
            Ok(Settled::from_changed(n))
        })
    }

    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            let rows = self
                .read(
                    &self.inner.sql.get,
                    "get",
                    "reading a record",
                    &[
                        &id.scope.as_str(),
                        &id.operation.as_str(),
                        &id.key.as_str(),
                        &now.as_millis(),
                    ],
                )
                .await?;
            // One row at most: the statement reads by the primary key.
            rows.first()
                .map(|row| row::record_from_row(id.clone(), row))
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
            let answer = client.execute(&stmt, &[&now.as_millis(), &limit]).await;
            let n = client
                .answered(answer)
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
            let rows = self
                .read(
                    &self.inner.sql.stale,
                    "stale listing",
                    "listing stale records",
                    &[&now.as_millis(), &lease, &scope, &op, &key, &limit],
                )
                .await?;
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
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = self
                .read(
                    &self.inner.sql.by_key,
                    "the look-up by key",
                    "finding records by key",
                    &[&scope.as_str(), &key.as_str(), &now.as_millis(), &limit],
                )
                .await?;
            rows.iter()
                .map(|row| row::record_with_operation_from_row(scope, key, row))
                .collect()
        })
    }

    /// One place, `store`: the epoch is the row of `idem_epoch` in the
    /// store's schema, advanced in one statement (`INSERT ... ON CONFLICT
    /// DO UPDATE`), atomic whatever other instances do at the same moment.
    fn advance_epoch<'a>(
        &'a self,
        candidate: &'a str,
    ) -> BoxFuture<'a, Result<Vec<EpochMark>, StoreError>> {
        Box::pin(async move {
            let (client, stmt) = self
                .prepared(&self.inner.sql.epoch, "the epoch's advance")
                .await?;
            let answer = client.query_one(&stmt, &[&EPOCH_PLACE, &candidate]).await;
            let row = client
                .answered(answer)
                .map_err(|e| pg_error("advancing the epoch", e))?;
            let get_err = |e| pg_error("reading the epoch", e);
            let epoch: String = row.try_get(0).map_err(get_err)?;
            let counter: i64 = row.try_get(1).map_err(get_err)?;
            let created: bool = row.try_get(2).map_err(get_err)?;
            let counter =
                u64::try_from(counter).map_err(|_| corrupt(CorruptValue::new("epoch counter")))?;
            Ok(vec![EpochMark::new(EPOCH_PLACE, epoch, counter, created)])
        })
    }

    /// `fsync` and `synchronous_commit` of the session: `fsync = off` or
    /// `synchronous_commit = off` lose records; `local` is risky behind a
    /// standby; anything else keeps them.
    fn durability(&self) -> BoxFuture<'_, Result<Durability, StoreError>> {
        Box::pin(async move {
            let client = Pooled::get(&self.inner.pool).await?;
            let answer = client.query_one(crate::durability::SQL, &[]).await;
            let row = client
                .answered(answer)
                .map_err(|e| pg_error("reading the durability settings", e))?;
            let fsync: String = row.get(0);
            let commit: String = row.get(1);
            Ok(crate::durability::judge(&fsync, &commit))
        })
    }
}

/// The store's one place: the whole server loses data together.
const EPOCH_PLACE: &str = "store";
