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
//!   the record, decides by DESIGN.md section 2, and writes, atomically.
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
//! # use idem_core::{Claim, Completion, StoredResponse};
//! # use idem_postgres::{Atomic, PostgresStore};
//! # async fn run(store: PostgresStore, req: idem_core::ClaimRequest) -> Result<(), Box<dyn std::error::Error>> {
//! if let Claim::Acquired(lease) = store.claim_now(&req).await? {
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

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{
    Hook, HookError, Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime,
};
use idem_core::transition::ClaimCode;
use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Fence, Fingerprint, Key, Lease, Operation, Record,
    RecordId, Scope, Settled, StaleCursor, Status, Store, StoreError, StoreErrorKind,
    StoredResponse, Timestamp,
};
use tokio_postgres::{NoTls, Row, Statement};

mod atomic;
mod error;
mod schema;

pub use deadpool_postgres::Transaction;
use error::{corrupt, pg_error, pool_error};
pub use idem_core::Atomic;
/// The PostgreSQL driver's error and parameter trait, for atomic-mode closures.
pub use tokio_postgres::{Error as PgError, types::ToSql};

/// Options for connecting a store.
#[derive(Debug, Clone)]
pub struct PostgresStoreBuilder {
    url: String,
    schema: String,
    pool_size: usize,
    wait: Duration,
    statement_timeout: Duration,
}

impl PostgresStoreBuilder {
    /// The schema holding idem's tables. Default `idem`. Lower-case letters,
    /// digits and `_` only.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The most connections the pool opens. Default 16.
    pub fn pool_size(mut self, n: usize) -> Self {
        self.pool_size = n.max(1);
        self
    }

    /// How long an operation waits for a connection (and for one to be
    /// opened) before failing with `Unavailable`. Default 5 s.
    pub fn connect_timeout(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// PostgreSQL's `statement_timeout` on the store's connections: a
    /// statement that runs longer (a stalled server, a row locked by
    /// another session) is cancelled by the server and the call fails with
    /// `Unavailable`. It applies to the statements of atomic-mode
    /// mutations too (a mutation may `SET LOCAL statement_timeout` for
    /// itself). Zero turns it off. Default 5 s.
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// Connects, then creates or migrates the schema.
    ///
    /// # Errors
    /// [`StoreErrorKind::Setup`] for a bad URL or schema name, or a schema
    /// newer than this code; [`StoreErrorKind::Unavailable`] when the server
    /// does not answer.
    pub async fn connect(self) -> Result<PostgresStore, StoreError> {
        if !schema::valid_schema_name(&self.schema) {
            return Err(StoreError::new(
                StoreErrorKind::Setup,
                format!("postgres store: invalid schema name {:?}", self.schema),
            ));
        }
        let config = tokio_postgres::Config::from_str(&self.url).map_err(|e| {
            StoreError::new(
                StoreErrorKind::Setup,
                "postgres store: invalid connection URL",
            )
            .with_source(e)
        })?;
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let statement_ms = ms(self.statement_timeout);
        let pool = Pool::builder(manager)
            .max_size(self.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(self.wait))
            .create_timeout(Some(self.wait))
            .recycle_timeout(Some(self.wait))
            .post_create(Hook::async_fn(move |client, _| {
                Box::pin(async move {
                    client
                        .batch_execute(&format!("SET statement_timeout = {statement_ms}"))
                        .await
                        .map_err(HookError::Backend)
                })
            }))
            .build()
            .map_err(|e| {
                StoreError::new(
                    StoreErrorKind::Setup,
                    "postgres store: cannot build the pool",
                )
                .with_source(e)
            })?;
        let mut client = pool.get().await.map_err(pool_error)?;
        // Migrations may wait for another instance's migration lock and
        // build indexes: no statement timeout for them, on a connection
        // that is then closed rather than returned to the pool.
        client
            .batch_execute("SET statement_timeout = 0")
            .await
            .map_err(|e| pg_error("preparing the migration", e))?;
        let migrated = schema::migrate(&mut client, &self.schema).await;
        drop(Object::take(client));
        migrated?;
        let s = &self.schema;
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                sql: Sql {
                    claim: format!("SELECT * FROM {s}.idem_claim($1, $2, $3, $4, $5, $6, $7)"),
                    complete: format!(
                        "UPDATE {s}.idem_records SET status = $5, resource_id = $6, response_status = $7, \
                         response_headers = $8, response_body = $9, lease_until = NULL \
                         WHERE scope = $1 AND operation = $2 AND key = $3 AND fence = $4 AND status = 0"
                    ),
                    release: format!(
                        "DELETE FROM {s}.idem_records \
                         WHERE scope = $1 AND operation = $2 AND key = $3 AND fence = $4 AND status = 0"
                    ),
                    get: format!(
                        "SELECT fingerprint, status, fence, created_at, lease_until, expires_at, resource_id, \
                         response_status, response_headers, response_body FROM {s}.idem_records \
                         WHERE scope = $1 AND operation = $2 AND key = $3 AND expires_at > $4"
                    ),
                    lock: format!(
                        "SELECT 1 FROM {s}.idem_records \
                         WHERE scope = $1 AND operation = $2 AND key = $3 AND fence = $4 AND status = 0 FOR UPDATE"
                    ),
                    purge: format!(
                        "DELETE FROM {s}.idem_records WHERE ctid = ANY (ARRAY( \
                         SELECT ctid FROM {s}.idem_records WHERE expires_at <= $1 \
                         LIMIT $2 FOR UPDATE SKIP LOCKED))"
                    ),
                    stale: format!(
                        "SELECT fingerprint, status, fence, created_at, lease_until, expires_at, resource_id, \
                         response_status, response_headers, response_body, scope, operation, key \
                         FROM {s}.idem_records WHERE status = 0 AND lease_until <= $1 AND expires_at > $1 \
                         AND (lease_until, scope, operation, key) > ($2, $3, $4, $5) \
                         ORDER BY lease_until, scope, operation, key LIMIT $6"
                    ),
                    // Operations compare as bytes (`COLLATE "C"`), as in
                    // every other store, whatever the database's collation.
                    by_key: format!(
                        "SELECT fingerprint, status, fence, created_at, lease_until, expires_at, resource_id, \
                         response_status, response_headers, response_body, operation \
                         FROM {s}.idem_records WHERE scope = $1 AND key = $2 AND expires_at > $3 \
                         ORDER BY created_at DESC, operation COLLATE \"C\" DESC LIMIT $4"
                    ),
                },
                pool,
                schema: self.schema,
            }),
        })
    }
}

struct Sql {
    claim: String,
    complete: String,
    release: String,
    get: String,
    lock: String,
    purge: String,
    stale: String,
    by_key: String,
}

struct Inner {
    pool: Pool,
    schema: String,
    sql: Sql,
}

/// The PostgreSQL store. Clones share one pool.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("schema", &self.inner.schema)
            .finish_non_exhaustive()
    }
}

/// One row changed: the fence was current. None: it was not.
fn settled(changed: u64) -> Settled {
    if changed == 1 {
        Settled::Applied
    } else {
        Settled::StaleFence
    }
}

fn fence_sql(fence: Fence) -> Option<i64> {
    i64::try_from(fence.get()).ok()
}

fn fence_from(v: i64) -> Result<Fence, StoreError> {
    u64::try_from(v)
        .map(Fence::new)
        .map_err(|_| corrupt("fence"))
}

fn ms(v: Duration) -> i64 {
    i64::try_from(v.as_millis()).unwrap_or(i64::MAX)
}

fn response_from(
    status: Option<i32>,
    headers: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
) -> Result<Option<StoredResponse>, StoreError> {
    let Some(status) = status else {
        return Ok(None);
    };
    Ok(Some(StoredResponse {
        status: u16::try_from(status).map_err(|_| corrupt("response status"))?,
        headers: StoredResponse::decode_headers(&headers.unwrap_or_default())
            .map_err(|_| corrupt("response headers"))?,
        body: body.unwrap_or_default(),
    }))
}

impl PostgresStore {
    /// Options for connecting to `url` (`postgres://user@host:port/db`).
    pub fn builder(url: impl Into<String>) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            url: url.into(),
            schema: "idem".into(),
            pool_size: 16,
            wait: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(5),
        }
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

    /// The claim, callable without naming the trait.
    ///
    /// # Errors
    /// As [`Store::claim`].
    pub async fn claim_now(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
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
                    &ms(req.lease),
                    &ms(req.ttl),
                ],
            )
            .await
            .map_err(|e| pg_error("claiming", e))?;
        claim_from_row(req, &row)
    }
}

fn claim_from_row(req: &ClaimRequest, row: &Row) -> Result<Claim, StoreError> {
    let get_err = |e| pg_error("reading the claim", e);
    let outcome: i16 = row.try_get(0).map_err(get_err)?;
    let fence = fence_from(row.try_get(1).map_err(get_err)?)?;
    let created_at = Timestamp::from_millis(row.try_get(2).map_err(get_err)?);
    let lease_until: Option<i64> = row.try_get(3).map_err(get_err)?;
    let expires_at = Timestamp::from_millis(row.try_get(4).map_err(get_err)?);
    let code = ClaimCode::from_code(i64::from(outcome)).ok_or_else(|| corrupt("claim outcome"))?;
    Ok(match code {
        ClaimCode::Acquired | ClaimCode::TakenOver => Claim::Acquired(Lease {
            fence,
            lease_until: Timestamp::from_millis(lease_until.unwrap_or_default()),
            expires_at,
            takeover: code == ClaimCode::TakenOver,
        }),
        ClaimCode::InFlight => Claim::InFlight {
            lease_until: Timestamp::from_millis(lease_until.unwrap_or_default()),
            expires_at,
        },
        ClaimCode::Replay => {
            let status: i16 = row.try_get(5).map_err(get_err)?;
            Claim::Replay(Box::new(Record {
                id: req.id.clone(),
                fingerprint: req.fingerprint,
                status: Status::from_code(i64::from(status)).ok_or_else(|| corrupt("status"))?,
                response: response_from(
                    row.try_get(7).map_err(get_err)?,
                    row.try_get(8).map_err(get_err)?,
                    row.try_get(9).map_err(get_err)?,
                )?,
                resource_id: row.try_get(6).map_err(get_err)?,
                created_at,
                lease_until: lease_until.map(Timestamp::from_millis),
                fence,
                expires_at,
            }))
        }
        ClaimCode::Mismatch => Claim::Mismatch { expires_at },
    })
}

impl Store for PostgresStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(self.claim_now(req))
    }

    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        completion: Completion,
        _now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(async move {
            let Some(fence) = fence_sql(fence) else {
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
            let Some(fence) = fence_sql(fence) else {
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
            Ok(settled(n))
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
            row.map(|row| record_from_row(id.clone(), &row)).transpose()
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
            rows.iter()
                .map(|row| {
                    let get_err = |e| pg_error("listing stale records", e);
                    let key = Key::new(row.try_get::<_, String>(12).map_err(get_err)?)
                        .map_err(|_| corrupt("key"))?;
                    let id = RecordId::new(
                        Scope::from_raw(row.try_get::<_, String>(10).map_err(get_err)?),
                        Operation::from_raw(row.try_get::<_, String>(11).map_err(get_err)?),
                        key,
                    );
                    record_from_row(id, row)
                })
                .collect()
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
                .map(|row| {
                    let operation: String = row
                        .try_get(10)
                        .map_err(|e| pg_error("finding records by key", e))?;
                    let id =
                        RecordId::new(scope.clone(), Operation::from_raw(operation), key.clone());
                    record_from_row(id, row)
                })
                .collect()
        })
    }
}

/// A record from the first ten columns of `get`, `stale` and `by_key`.
fn record_from_row(id: RecordId, row: &Row) -> Result<Record, StoreError> {
    let get_err = |e| pg_error("reading a record", e);
    let fp: Vec<u8> = row.try_get(0).map_err(get_err)?;
    let status: i16 = row.try_get(1).map_err(get_err)?;
    Ok(Record {
        id,
        fingerprint: Fingerprint::from_slice(&fp).ok_or_else(|| corrupt("fingerprint"))?,
        status: Status::from_code(i64::from(status)).ok_or_else(|| corrupt("status"))?,
        fence: fence_from(row.try_get(2).map_err(get_err)?)?,
        created_at: Timestamp::from_millis(row.try_get(3).map_err(get_err)?),
        lease_until: row
            .try_get::<_, Option<i64>>(4)
            .map_err(get_err)?
            .map(Timestamp::from_millis),
        expires_at: Timestamp::from_millis(row.try_get(5).map_err(get_err)?),
        resource_id: row.try_get(6).map_err(get_err)?,
        response: response_from(
            row.try_get(7).map_err(get_err)?,
            row.try_get(8).map_err(get_err)?,
            row.try_get(9).map_err(get_err)?,
        )?,
    })
}

/// The completion statement, on a plain client or inside a transaction.
async fn complete_with<C: deadpool_postgres::GenericClient + Sync>(
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
    Ok(settled(n))
}

#[cfg(test)]
mod tests;
