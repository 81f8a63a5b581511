//! Redis store for idem: low latency, shared by many instances.
//!
//! ```no_run
//! use idem_redis::RedisStore;
//!
//! # async fn run() -> Result<(), idem_core::StoreError> {
//! let store = RedisStore::builder("redis://127.0.0.1:6379").prefix("idem").connect().await?;
//! // `store` implements `idem_core::Store`.
//! # Ok(()) }
//! ```
//!
//! # Behavior
//!
//! - Each operation (claim, complete, release, get, the stale listing, the
//!   look-up by key) is one Lua script, run
//!   atomically by the server in one round trip. Scripts are sent by SHA
//!   (`EVALSHA`); after a `SCRIPT FLUSH` or a server restart the first call
//!   gets `NOSCRIPT` and the script is loaded again, transparently.
//! - A record is a hash at `PREFIX:r:LEN:SCOPE:LEN:OPERATION:KEY`; its Redis
//!   TTL is set to the record's `expires_at` plus [`EXPIRY_MARGIN`]
//!   (`PEXPIREAT`), so Redis forgets expired records by itself, and a Redis
//!   clock up to that margin ahead of the callers' never drops a live
//!   record (whose retry would then execute again). The scripts compare
//!   `expires_at` with the caller's `now`, so logical expiry is exact
//!   whatever Redis's clock says. [`Store::purge_expired`] removes records that are logically
//!   expired but not yet dropped by Redis, in bounded `SCAN` batches.
//! - In-progress records are indexed in a sorted set by lease end
//!   (`PREFIX:in-progress`), for [`Store::list_stale`].
//! - The records of one scope and key, whatever their operation, are
//!   indexed in a sorted set at `PREFIX:k:LEN:SCOPE:KEY` whose members are
//!   the operations (the record key is derived from them) scored by
//!   `created_at`, for [`Store::find_by_key`]: newest first is the set's own
//!   reverse order, ties included, so a look-up reads only the records it
//!   answers with. The claim script writes it when it creates or takes over
//!   a record, in the same round trip, and extends its Redis TTL to at least
//!   the record's `expires_at`, so the index outlives every record it
//!   points at. Release and purge leave members behind; the look-up script
//!   skips members whose record is gone or expired and removes them. Records
//!   written by a version of idem without this index are not found by key
//!   (they are still found by id) until they expire.
//! - Fences come from one counter per prefix (`PREFIX:fence`), so they grow
//!   across every claim.
//! - One multiplexed connection (`ConnectionManager`) serves every task; it
//!   reconnects by itself when the server comes back. Connection failures
//!   and timeouts are [`StoreErrorKind::Unavailable`].
//!
//! # What Redis cannot give
//!
//! - **No atomic mode.** Your business data does not live in Redis, so the
//!   mutation and the record cannot commit together. A crash between the
//!   mutation and the completion leaves the record in progress; after the
//!   lease a retry executes again. Use PostgreSQL or SQLite when the effect
//!   must happen exactly once, or make the downstream idempotent too.
//! - **Durability is the server's.** With the default `appendfsync everysec`
//!   a power loss can drop the last second of completions; with no AOF at
//!   all, a restart forgets every record. Run with `appendonly yes` and
//!   `appendfsync always` for the contract's durability, at a price.
//! - **No eviction.** Every record has a TTL, so the `volatile-*` and
//!   `allkeys-*` `maxmemory-policy` settings may evict live records, and
//!   the next claim of an evicted key executes again. Run the server with
//!   `maxmemory-policy noeviction`: a full Redis then refuses writes, which
//!   the store reports as unavailable (503, fail closed).
//! - **No Redis Cluster.** A claim touches the record and the fence counter,
//!   which would live in different slots.
//!
//! [`StoreErrorKind::Unavailable`]: idem_core::StoreErrorKind::Unavailable

use std::fmt;

use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Fence, Key, Record, RecordId, Scope, Settled,
    StaleCursor, Store, StoreError, Timestamp,
};
use redis::Value;
use redis::aio::ConnectionManager;

mod builder;
mod error;
mod row;
mod scripts;

pub use builder::RedisStoreBuilder;
use error::redis_error;

/// How long after a record's `expires_at` Redis may drop its keys: a Redis
/// clock up to this far ahead of the callers' never loses a live record.
/// Records past `expires_at` but not yet dropped count as expired (the
/// scripts compare with the caller's time) and are removed by
/// [`Store::purge_expired`].
pub const EXPIRY_MARGIN: std::time::Duration = std::time::Duration::from_secs(10 * 60);
use scripts::{Keys, Scripts};

/// The Redis store. Clones share one multiplexed connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    keys: Keys,
    scripts: Scripts,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.keys.prefix())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Options for connecting to `url` (`redis://host:port/db`).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::new(url.into())
    }

    /// Connects with the default options.
    ///
    /// # Errors
    /// As [`RedisStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).connect().await
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        self.keys.prefix()
    }

    /// The Redis key holding a record. Lengths make it unambiguous whatever
    /// characters the scope and operation hold.
    pub fn record_key(&self, id: &RecordId) -> String {
        self.keys.record(id)
    }

    /// The Redis key of the index of `scope`'s records with `key`, whatever
    /// their operation (a sorted set: operation by `created_at`).
    pub fn key_index_key(&self, scope: &Scope, key: &Key) -> String {
        self.keys.key_index(scope, key)
    }

    /// Deletes every key under the prefix. For tests.
    ///
    /// # Errors
    /// As any operation.
    pub async fn delete_all(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let pattern = self.keys.every_key();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys) = scan_page(&mut conn, cursor, &pattern).await?;
            if !keys.is_empty() {
                let _: i64 = redis::cmd("DEL")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| redis_error("deleting", e))?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// Completes (`Some`) or releases (`None`) a record if `fence` still
    /// holds it: `complete.lua` or `release.lua`, which take the same keys.
    async fn finish(
        &self,
        id: &RecordId,
        fence: Fence,
        completion: Option<Completion>,
    ) -> Result<Settled, StoreError> {
        let mut conn = self.conn.clone();
        let key = self.keys.record(id);
        let fence = fence.get().to_string();
        let applied: i64 = match completion {
            Some(c) => {
                let rid = c
                    .resource_id
                    .as_deref()
                    .map(|r| format!("s{r}"))
                    .unwrap_or_default();
                self.scripts
                    .complete
                    .key(key)
                    .key(self.keys.in_progress())
                    .arg(fence)
                    .arg(c.status().code())
                    .arg(rid)
                    .arg(c.response.status)
                    .arg(c.response.encode_headers())
                    .arg(&c.response.body)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| redis_error("completing", e))?
            }
            None => self
                .scripts
                .release
                .key(key)
                .key(self.keys.in_progress())
                .arg(fence)
                .invoke_async(&mut conn)
                .await
                .map_err(|e| redis_error("releasing", e))?,
        };
        Ok(Settled::from_changed(u64::try_from(applied).unwrap_or(0)))
    }
}

/// One `SCAN` page of keys matching `pattern`: the next cursor (0 at the
/// end) and the keys. Pages are bounded, so no call blocks the server.
async fn scan_page(
    conn: &mut ConnectionManager,
    cursor: u64,
    pattern: &str,
) -> Result<(u64, Vec<String>), StoreError> {
    redis::cmd("SCAN")
        .arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(500)
        .query_async(conn)
        .await
        .map_err(|e| redis_error("scanning", e))
}

impl Store for RedisStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let lease_until = req.now + req.lease;
            let expires_at = req.now + req.ttl;
            let items: Vec<Value> = self
                .scripts
                .claim
                .key(self.keys.record(&req.id))
                .key(self.keys.fence())
                .key(self.keys.in_progress())
                .key(self.keys.key_index(&req.id.scope, &req.id.key))
                .arg(req.fingerprint.as_bytes())
                .arg(req.now.as_millis())
                .arg(lease_until.as_millis())
                .arg(expires_at.as_millis())
                .arg(req.id.operation.as_str())
                .arg((expires_at + EXPIRY_MARGIN).as_millis())
                .invoke_async(&mut conn)
                .await
                .map_err(|e| redis_error("claiming", e))?;
            row::claim_from_reply(req, &items)
        })
    }

    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        completion: Completion,
        _now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(self.finish(id, fence, Some(completion)))
    }

    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        _now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(self.finish(id, fence, None))
    }

    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let items: Vec<Value> = self
                .scripts
                .get
                .key(self.keys.record(id))
                .arg(now.as_millis())
                .invoke_async(&mut conn)
                .await
                .map_err(|e| redis_error("reading a record", e))?;
            if items.is_empty() {
                return Ok(None);
            }
            row::record_from_reply(id.clone(), &items).map(Some)
        })
    }

    fn purge_expired(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let pattern = self.keys.every_record();
            let mut purged = 0usize;
            let mut cursor: u64 = 0;
            loop {
                let (next, keys) = scan_page(&mut conn, cursor, &pattern).await?;
                if !keys.is_empty() {
                    let mut inv = self.scripts.purge.prepare_invoke();
                    inv.key(self.keys.in_progress());
                    for k in &keys {
                        inv.key(k);
                    }
                    let n: i64 = inv
                        .arg(now.as_millis())
                        .arg(limit - purged)
                        .invoke_async(&mut conn)
                        .await
                        .map_err(|e| redis_error("purging", e))?;
                    purged += usize::try_from(n).unwrap_or(0);
                }
                if next == 0 || purged >= limit {
                    return Ok(purged);
                }
                cursor = next;
            }
        })
    }

    fn list_stale<'a>(
        &'a self,
        now: Timestamp,
        after: Option<&'a StaleCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let (score, member) = match after {
                Some(c) => (
                    c.lease_until.as_millis().to_string(),
                    self.keys.record(&c.id),
                ),
                None => ("-inf".to_owned(), String::new()),
            };
            let items: Vec<Value> = self
                .scripts
                .stale
                .key(self.keys.in_progress())
                .arg(now.as_millis())
                .arg(score)
                .arg(member)
                .arg(limit)
                .invoke_async(&mut conn)
                .await
                .map_err(|e| redis_error("listing stale records", e))?;
            row::stale_records_from_reply(&self.keys, &items)
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
            if limit == 0 {
                return Ok(Vec::new());
            }
            let mut conn = self.conn.clone();
            let (head, tail) = self.keys.record_around_operation(scope, key);
            let items: Vec<Value> = self
                .scripts
                .find
                .key(self.keys.key_index(scope, key))
                .arg(now.as_millis())
                .arg(limit)
                .arg(head)
                .arg(tail)
                .invoke_async(&mut conn)
                .await
                .map_err(|e| redis_error("finding records by key", e))?;
            row::records_by_key_from_reply(scope, key, &items)
        })
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;

/// The README's examples, compiled (and run, unless `no_run`) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
