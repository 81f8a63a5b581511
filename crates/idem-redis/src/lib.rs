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
//!   TTL is set to the record's `expires_at` (`PEXPIREAT`), so Redis forgets
//!   expired records by itself. The scripts also compare `expires_at` with
//!   the caller's `now`, so logical expiry is exact whatever Redis's clock
//!   says. [`Store::purge_expired`] removes records that are logically
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
//! - **No Redis Cluster.** A claim touches the record and the fence counter,
//!   which would live in different slots.

use std::fmt;
use std::time::Duration;

use idem_core::transition::ClaimCode;
use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Fence, Fingerprint, Key, Lease, Operation, Record,
    RecordId, Scope, Settled, StaleCursor, Status, Store, StoreError, StoreErrorKind,
    StoredResponse, Timestamp,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};

/// Options for connecting a store.
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    url: String,
    prefix: String,
    timeout: Duration,
}

impl RedisStoreBuilder {
    /// The prefix of every key this store writes. Default `idem`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one operation, or one connection attempt, may take before
    /// it fails with `Unavailable`. Default 2 s.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Connects.
    ///
    /// # Errors
    /// [`StoreErrorKind::Setup`] for a bad URL; [`StoreErrorKind::Unavailable`]
    /// when the server does not answer.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(self.url.as_str()).map_err(|e| {
            StoreError::new(StoreErrorKind::Setup, "redis store: invalid URL").with_source(e)
        })?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.timeout))
            .set_connection_timeout(Some(self.timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| redis_error("connecting", e))?;
        Ok(RedisStore {
            conn,
            fence_key: format!("{}:fence", self.prefix),
            index_key: format!("{}:in-progress", self.prefix),
            prefix: self.prefix,
            scripts: Scripts::new(),
        })
    }
}

#[derive(Clone)]
struct Scripts {
    claim: Script,
    complete: Script,
    release: Script,
    get: Script,
    purge: Script,
    stale: Script,
    find: Script,
}

impl Scripts {
    fn new() -> Scripts {
        Scripts {
            claim: Script::new(include_str!("lua/claim.lua")),
            complete: Script::new(include_str!("lua/complete.lua")),
            release: Script::new(include_str!("lua/release.lua")),
            get: Script::new(include_str!("lua/get.lua")),
            purge: Script::new(include_str!("lua/purge.lua")),
            stale: Script::new(include_str!("lua/stale.lua")),
            find: Script::new(include_str!("lua/find.lua")),
        }
    }
}

/// The Redis store. Clones share one multiplexed connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    fence_key: String,
    index_key: String,
    scripts: Scripts,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

fn redis_error(context: &str, e: redis::RedisError) -> StoreError {
    let kind = if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
    {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Backend
    };
    StoreError::new(kind, format!("redis store: {context}")).with_source(e)
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

fn corrupt(what: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Corrupt,
        format!("redis store: stored {what} is corrupt"),
    )
}

/// Reads reply item `i` as bytes.
fn bytes(items: &[Value], i: usize) -> Result<Vec<u8>, StoreError> {
    match items.get(i) {
        Some(Value::BulkString(b)) => Ok(b.clone()),
        Some(Value::SimpleString(s)) => Ok(s.clone().into_bytes()),
        Some(Value::Int(n)) => Ok(n.to_string().into_bytes()),
        _ => Err(corrupt("reply")),
    }
}

/// Reads reply item `i` as an integer; `None` for an empty string.
fn int(items: &[Value], i: usize) -> Result<Option<i64>, StoreError> {
    match items.get(i) {
        Some(Value::Int(n)) => Ok(Some(*n)),
        _ => {
            let b = bytes(items, i)?;
            if b.is_empty() {
                return Ok(None);
            }
            std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.parse().ok())
                .map(Some)
                .ok_or_else(|| corrupt("number"))
        }
    }
}

fn need(v: Option<i64>, what: &str) -> Result<i64, StoreError> {
    v.ok_or_else(|| corrupt(what))
}

fn fence_of(v: Option<i64>) -> Result<Fence, StoreError> {
    u64::try_from(need(v, "fence")?)
        .map(Fence::new)
        .map_err(|_| corrupt("fence"))
}

fn status_of(v: Option<i64>) -> Result<Status, StoreError> {
    Status::from_code(need(v, "status")?).ok_or_else(|| corrupt("status"))
}

/// The stored response and resource id at items 6..=9.
fn finished_parts(items: &[Value]) -> Result<(Option<String>, Option<StoredResponse>), StoreError> {
    let rid = bytes(items, 6)?;
    let resource_id = match rid.split_first() {
        Some((b's', rest)) => {
            Some(String::from_utf8(rest.to_vec()).map_err(|_| corrupt("resource id"))?)
        }
        _ => None,
    };
    let response = match int(items, 7)? {
        Some(code) => Some(StoredResponse {
            status: u16::try_from(code).map_err(|_| corrupt("response status"))?,
            headers: StoredResponse::decode_headers(&bytes(items, 8)?)
                .map_err(|_| corrupt("response headers"))?,
            body: bytes(items, 9)?,
        }),
        None => None,
    };
    Ok((resource_id, response))
}

/// A record from the reply of `get.lua` (and each entry of `find.lua` after
/// its operation): fingerprint, status, fence, created_at, lease_until,
/// expires_at, then the finished parts at 6..=9.
fn record_from(id: RecordId, items: &[Value]) -> Result<Record, StoreError> {
    let (resource_id, response) = finished_parts(items)?;
    Ok(Record {
        id,
        fingerprint: Fingerprint::from_slice(&bytes(items, 0)?)
            .ok_or_else(|| corrupt("fingerprint"))?,
        status: status_of(int(items, 1)?)?,
        fence: fence_of(int(items, 2)?)?,
        created_at: Timestamp::from_millis(need(int(items, 3)?, "created_at")?),
        lease_until: int(items, 4)?.map(Timestamp::from_millis),
        expires_at: Timestamp::from_millis(need(int(items, 5)?, "expires_at")?),
        resource_id,
        response,
    })
}

impl RedisStore {
    /// Options for connecting to `url` (`redis://host:port/db`).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            prefix: "idem".into(),
            timeout: Duration::from_secs(2),
        }
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
        &self.prefix
    }

    /// The Redis key holding a record. Lengths make it unambiguous whatever
    /// characters the scope and operation hold.
    pub fn record_key(&self, id: &RecordId) -> String {
        let (s, o) = (id.scope.as_str(), id.operation.as_str());
        format!(
            "{}:r:{}:{s}:{}:{o}:{}",
            self.prefix,
            s.len(),
            o.len(),
            id.key.as_str()
        )
    }

    /// The Redis key of the index of `scope`'s records with `key`, whatever
    /// their operation (a sorted set: operation by `created_at`).
    pub fn key_index_key(&self, scope: &Scope, key: &Key) -> String {
        let s = scope.as_str();
        format!("{}:k:{}:{s}:{}", self.prefix, s.len(), key.as_str())
    }

    /// The record id a record key names; `None` if it is not one of ours.
    fn id_of(&self, record_key: &str) -> Option<RecordId> {
        let rest = record_key.strip_prefix(&self.prefix)?.strip_prefix(":r:")?;
        let (scope_len, rest) = rest.split_once(':')?;
        let scope_len: usize = scope_len.parse().ok()?;
        let scope = rest.get(..scope_len)?;
        let rest = rest.get(scope_len..)?.strip_prefix(':')?;
        let (op_len, rest) = rest.split_once(':')?;
        let op_len: usize = op_len.parse().ok()?;
        let op = rest.get(..op_len)?;
        let key = rest.get(op_len..)?.strip_prefix(':')?;
        Some(RecordId::new(
            Scope::from_raw(scope),
            Operation::from_raw(op),
            Key::new(key).ok()?,
        ))
    }

    async fn list_stale_now(
        &self,
        now: Timestamp,
        after: Option<&StaleCursor>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let mut conn = self.conn.clone();
        let (score, member) = match after {
            Some(c) => (
                c.lease_until.as_millis().to_string(),
                self.record_key(&c.id),
            ),
            None => ("-inf".to_owned(), String::new()),
        };
        let items: Vec<Value> = self
            .scripts
            .stale
            .key(&self.index_key)
            .arg(now.as_millis())
            .arg(score)
            .arg(member)
            .arg(limit)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| redis_error("listing stale records", e))?;
        items
            .chunks(7)
            .map(|c| {
                let record_key =
                    String::from_utf8(bytes(c, 0)?).map_err(|_| corrupt("record key"))?;
                let id = self
                    .id_of(&record_key)
                    .ok_or_else(|| corrupt("record key"))?;
                Ok(Record {
                    id,
                    fingerprint: Fingerprint::from_slice(&bytes(c, 1)?)
                        .ok_or_else(|| corrupt("fingerprint"))?,
                    status: status_of(int(c, 2)?)?,
                    fence: fence_of(int(c, 3)?)?,
                    created_at: Timestamp::from_millis(need(int(c, 4)?, "created_at")?),
                    lease_until: int(c, 5)?.map(Timestamp::from_millis),
                    expires_at: Timestamp::from_millis(need(int(c, 6)?, "expires_at")?),
                    resource_id: None,
                    response: None,
                })
            })
            .collect()
    }

    /// Deletes every key under the prefix. For tests.
    ///
    /// # Errors
    /// As any operation.
    pub async fn delete_all(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let pattern = format!("{}:*", self.prefix);
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

    async fn claim_now(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let mut conn = self.conn.clone();
        let lease_until = req.now + req.lease;
        let expires_at = req.now + req.ttl;
        let items: Vec<Value> = self
            .scripts
            .claim
            .key(self.record_key(&req.id))
            .key(&self.fence_key)
            .key(&self.index_key)
            .key(self.key_index_key(&req.id.scope, &req.id.key))
            .arg(req.fingerprint.as_bytes())
            .arg(req.now.as_millis())
            .arg(lease_until.as_millis())
            .arg(expires_at.as_millis())
            .arg(req.id.operation.as_str())
            .invoke_async(&mut conn)
            .await
            .map_err(|e| redis_error("claiming", e))?;
        let code = ClaimCode::from_code(need(int(&items, 0)?, "outcome")?)
            .ok_or_else(|| corrupt("claim outcome"))?;
        let expires_at = Timestamp::from_millis(need(int(&items, 4)?, "expires_at")?);
        let lease_until = int(&items, 3)?.map(Timestamp::from_millis);
        Ok(match code {
            ClaimCode::Acquired | ClaimCode::TakenOver => Claim::Acquired(Lease {
                fence: fence_of(int(&items, 1)?)?,
                lease_until: lease_until.ok_or_else(|| corrupt("lease"))?,
                expires_at,
                takeover: code == ClaimCode::TakenOver,
            }),
            ClaimCode::InFlight => Claim::InFlight {
                lease_until: lease_until.ok_or_else(|| corrupt("lease"))?,
                expires_at,
            },
            ClaimCode::Replay => {
                let (resource_id, response) = finished_parts(&items)?;
                Claim::Replay(Box::new(Record {
                    id: req.id.clone(),
                    fingerprint: req.fingerprint,
                    status: status_of(int(&items, 5)?)?,
                    response,
                    resource_id,
                    created_at: Timestamp::from_millis(need(int(&items, 2)?, "created_at")?),
                    lease_until: None,
                    fence: fence_of(int(&items, 1)?)?,
                    expires_at,
                }))
            }
            ClaimCode::Mismatch => Claim::Mismatch { expires_at },
        })
    }

    async fn finish(
        &self,
        id: &RecordId,
        fence: Fence,
        completion: Option<Completion>,
    ) -> Result<Settled, StoreError> {
        let mut conn = self.conn.clone();
        let key = self.record_key(id);
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
                    .key(&self.index_key)
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
                .key(&self.index_key)
                .arg(fence)
                .invoke_async(&mut conn)
                .await
                .map_err(|e| redis_error("releasing", e))?,
        };
        Ok(if applied == 1 {
            Settled::Applied
        } else {
            Settled::StaleFence
        })
    }

    async fn get_now(&self, id: &RecordId, now: Timestamp) -> Result<Option<Record>, StoreError> {
        let mut conn = self.conn.clone();
        let items: Vec<Value> = self
            .scripts
            .get
            .key(self.record_key(id))
            .arg(now.as_millis())
            .invoke_async(&mut conn)
            .await
            .map_err(|e| redis_error("reading a record", e))?;
        if items.is_empty() {
            return Ok(None);
        }
        record_from(id.clone(), &items).map(Some)
    }

    async fn find_by_key_now(
        &self,
        scope: &Scope,
        key: &Key,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.conn.clone();
        let s = scope.as_str();
        let items: Vec<Value> = self
            .scripts
            .find
            .key(self.key_index_key(scope, key))
            .arg(now.as_millis())
            .arg(limit)
            .arg(format!("{}:r:{}:{s}:", self.prefix, s.len()))
            .arg(format!(":{}", key.as_str()))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| redis_error("finding records by key", e))?;
        items
            .chunks(11)
            .map(|c| {
                let op = String::from_utf8(bytes(c, 0)?).map_err(|_| corrupt("operation"))?;
                let id = RecordId::new(scope.clone(), Operation::from_raw(op), key.clone());
                record_from(id, c.get(1..).unwrap_or_default())
            })
            .collect()
    }

    async fn purge_now(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        let mut conn = self.conn.clone();
        let pattern = format!("{}:r:*", self.prefix);
        let mut purged = 0usize;
        let mut cursor: u64 = 0;
        loop {
            let (next, keys) = scan_page(&mut conn, cursor, &pattern).await?;
            if !keys.is_empty() {
                let mut inv = self.scripts.purge.prepare_invoke();
                inv.key(&self.index_key);
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
    }
}

impl Store for RedisStore {
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
        Box::pin(self.get_now(id, now))
    }

    fn purge_expired(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(self.purge_now(now, limit))
    }

    fn list_stale<'a>(
        &'a self,
        now: Timestamp,
        after: Option<&'a StaleCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        Box::pin(self.list_stale_now(now, after, limit))
    }

    fn find_by_key<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a Key,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        Box::pin(self.find_by_key_now(scope, key, now, limit))
    }
}

#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

#[cfg(test)]
mod tests;
