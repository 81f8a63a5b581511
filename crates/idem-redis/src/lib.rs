//! Redis store for idem: low latency, shared by many instances, on one
//! server or a Redis Cluster. Not a place for business data: it has no
//! atomic mode (below).
//!
//! ```no_run
//! use idem_redis::RedisStore;
//!
//! # async fn run() -> Result<(), idem_core::StoreError> {
//! let store = RedisStore::builder("redis://127.0.0.1:6379").prefix("idem").connect().await?;
//! // `store` implements `idem_core::Store`.
//!
//! // A cluster: any of its nodes (the rest are found through them), and
//! // optionally an acknowledgement from a replica before each answer.
//! let cluster = RedisStore::builder("redis-cluster://10.0.0.1:7000,10.0.0.2:7000")
//!     .wait_for_replicas(1, std::time::Duration::from_millis(500))
//!     .connect()
//!     .await?;
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
//! # On a Redis Cluster
//!
//! The same scripts, with the keys laid out so that each script's keys
//! share one hash slot:
//!
//! - **Buckets.** A record lives in one of 1,024 buckets, chosen by a fixed
//!   hash (FNV-1a) of its scope and key, and every key of a bucket carries
//!   the bucket's hash tag: `PREFIX:{B}:r:...` (the record),
//!   `PREFIX:{B}:k:...` (its `(scope, key)` index), `PREFIX:{B}:f:...` (its
//!   fence) and `PREFIX:{B}:in-progress` (the bucket's in-progress index).
//!   The 1,024 tags spread over the cluster's slots, so records spread over
//!   every master. The prefix may not hold `{` or `}`.
//! - **A fence per record**, no global counter: the claim sets the record's
//!   fence to the larger of its last fence plus one and the server's clock
//!   in microseconds. The counter is kept as long as the record's keys
//!   (its Redis TTL is extended to the longest), so fences of one record
//!   grow across releases and takeovers; once it has expired with every
//!   record it fenced, the clock keeps the next fence above the old ones
//!   unless the master's clock went back by more than the TTL.
//! - **Across the cluster**: `list_stale` reads every bucket's index (64 at
//!   a time) and merges them; `purge_expired` and `delete_all` `SCAN` each
//!   master. The client follows `MOVED`/`ASK` and learns the slots again
//!   after a failover; a command that cannot be served within the store's
//!   timeout (the cluster is failing over, a slot has no master) is
//!   [`StoreErrorKind::Unavailable`].
//! - **Failover and `WAIT`.** Redis replicates asynchronously: a master
//!   answers a write before any replica has it, and a replica promoted
//!   after the master dies may not have the last writes. A claim lost that
//!   way lets a retry execute again; a completion lost that way leaves the
//!   record in progress (the retry waits out the lease, then executes
//!   again). With [`RedisStoreBuilder::wait_for_replicas`] (or
//!   `?wait_replicas=N` in the URL) the store sends `WAIT N timeout` after
//!   each write, checked to be on the write's connection: a claim that
//!   took a key, a completion, a release, and a replay (which writes the
//!   record's expiry again, so that the wait covers the completion it
//!   answers with). It answers only when N replicas have the write; if
//!   fewer acknowledge in time it fails closed with `Unavailable`, though
//!   the write stands on the master, and a repeated completion by the
//!   same fence waits again before it answers. With N equal to the
//!   replicas per master, a replica promoted by the cluster's own failover
//!   holds every write the store acknowledged. Still not a consensus
//!   system: a manual `CLUSTER FAILOVER TAKEOVER` of a lagging replica, or
//!   losing a master and all its acknowledging replicas at once, can lose
//!   writes. Cost: see BENCHMARKS.md.
//! - **Hostile keys** can crowd one bucket (the hash is not keyed): that
//!   loads one master more than the others, and changes nothing else.
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
//!
//! [`StoreErrorKind::Unavailable`]: idem_core::StoreErrorKind::Unavailable

use std::fmt;

use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Fence, Key, Record, RecordId, Scope, Settled,
    StaleCursor, Store, StoreError, Timestamp,
};
use redis::Value;

mod builder;
mod connection;
mod error;
mod row;
mod scripts;

pub use builder::RedisStoreBuilder;
use connection::Connection;
use error::{not_replicated, redis_error};

/// How long after a record's `expires_at` Redis may drop its keys: a Redis
/// clock up to this far ahead of the callers' never loses a live record.
/// Records past `expires_at` but not yet dropped count as expired (the
/// scripts compare with the caller's time) and are removed by
/// [`Store::purge_expired`].
pub const EXPIRY_MARGIN: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// How many in-progress indexes of a cluster are read at once when stale
/// records are listed.
const STALE_CONCURRENCY: usize = 64;
use scripts::{Keys, Layout, Scripts};

/// The Redis store. Clones share one multiplexed connection (on a cluster,
/// one per node).
#[derive(Clone)]
pub struct RedisStore {
    conn: Connection,
    keys: Keys,
    scripts: Scripts,
    replicas: Option<ReplicaWait>,
}

/// How many replicas must acknowledge each write before the store answers
/// (`WAIT`), and for how long it waits for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaWait {
    pub(crate) replicas: u32,
    pub(crate) timeout: std::time::Duration,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.keys.prefix())
            .field("cluster", &(self.keys.layout() == Layout::Cluster))
            .field("replicas", &self.replicas)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Options for connecting to `url`: one server (`redis://host:port/db`,
    /// `rediss://` for TLS) or a cluster (`redis-cluster://host:port[,host:port...]`,
    /// `rediss-cluster://` for TLS); see [`RedisStoreBuilder`].
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
        let mut scan = conn
            .scan(self.keys.every_key())
            .await
            .map_err(|e| redis_error("listing the masters", e))?;
        while let Some(keys) = scan
            .next_page(&mut conn)
            .await
            .map_err(|e| redis_error("scanning", e))?
        {
            // One key at a time: on a cluster the keys of a page lie in
            // many slots.
            for key in keys {
                let _: i64 = redis::cmd("DEL")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| redis_error("deleting", e))?;
            }
        }
        Ok(())
    }

    /// Runs a call that may write. With
    /// [`RedisStoreBuilder::wait_for_replicas`] a `WAIT` follows it on the
    /// same connection, and an answer that stands for a write (`needs_ack`
    /// of the reply) fails closed (`Unavailable`) unless enough replicas
    /// acknowledged it in time.
    async fn run_acknowledged<T: redis::FromRedisValue>(
        &self,
        call: &scripts::ScriptCall<'_>,
        what: &str,
        needs_ack: impl FnOnce(&T) -> bool,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        let Some(wait) = self.replicas else {
            return conn.run(call).await.map_err(|e| redis_error(what, e));
        };
        let (reply, acked) = conn
            .run_then_wait(call, wait.replicas, wait.timeout)
            .await
            .map_err(|e| redis_error(what, e))?;
        if needs_ack(&reply) && acked < i64::from(wait.replicas) {
            return Err(not_replicated(acked, wait));
        }
        Ok(reply)
    }

    /// Completes (`Some`) or releases (`None`) a record if `fence` still
    /// holds it: `complete.lua` or `release.lua`, which take the same keys.
    async fn finish(
        &self,
        id: &RecordId,
        fence: Fence,
        completion: Option<Completion>,
    ) -> Result<Settled, StoreError> {
        let key = self.keys.record(id);
        let in_progress = self.keys.in_progress(&id.scope, &id.key);
        let fence = fence.get().to_string();
        let (call, what) = match completion {
            Some(c) => {
                let rid = c
                    .resource_id
                    .as_deref()
                    .map(|r| format!("s{r}"))
                    .unwrap_or_default();
                let call = self
                    .scripts
                    .complete
                    .call()
                    .key(&key)
                    .key(&in_progress)
                    .arg(fence)
                    .arg(c.status().code())
                    .arg(rid)
                    .arg(c.response.status)
                    .arg(c.response.encode_headers())
                    .arg(&c.response.body[..])
                    .arg(if self.replicas.is_some() { "1" } else { "0" });
                (call, "completing")
            }
            None => {
                let call = self
                    .scripts
                    .release
                    .call()
                    .key(&key)
                    .key(&in_progress)
                    .arg(fence);
                (call, "releasing")
            }
        };
        // 1: applied; 2 (complete.lua only): this fence completed the
        // record before, and the script wrote again so that this call's
        // `WAIT` covers that completion; 0: another fence holds it.
        let answer: i64 = self
            .run_acknowledged(&call, what, |answer: &i64| *answer > 0)
            .await?;
        Ok(match answer {
            1 => Settled::Applied,
            _ => Settled::StaleFence,
        })
    }
}

impl Store for RedisStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let lease_until = req.now + req.lease;
            let expires_at = req.now + req.ttl;
            let record = self.keys.record(&req.id);
            let per_record_fence = match self.keys.layout() {
                Layout::Single => "0",
                Layout::Cluster => "1",
            };
            let call = self
                .scripts
                .claim
                .call()
                .key(&record)
                .key(self.keys.fence(&req.id))
                .key(self.keys.in_progress(&req.id.scope, &req.id.key))
                .key(self.keys.key_index(&req.id.scope, &req.id.key))
                .arg(req.fingerprint.as_bytes())
                .arg(req.now.as_millis())
                .arg(lease_until.as_millis())
                .arg(expires_at.as_millis())
                .arg(req.id.operation.as_str())
                .arg((expires_at + EXPIRY_MARGIN).as_millis())
                .arg(per_record_fence)
                .arg(if self.replicas.is_some() { "1" } else { "0" });
            // A claim that took the key, and a replay (whose script wrote
            // again, so that this `WAIT` covers the completion it answers
            // with), stand for writes; in flight and mismatch do not.
            let items: Vec<Value> = self
                .run_acknowledged(&call, "claiming", |items: &Vec<Value>| {
                    matches!(items.first(), Some(Value::Int(0 | 2 | 4)))
                })
                .await?;
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
            let call = self
                .scripts
                .get
                .call()
                .key(self.keys.record(id))
                .arg(now.as_millis());
            let items: Vec<Value> = conn
                .run(&call)
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
            let mut purged = 0usize;
            let mut scan = conn
                .scan(self.keys.every_record())
                .await
                .map_err(|e| redis_error("listing the masters", e))?;
            while purged < limit {
                let Some(keys) = scan
                    .next_page(&mut conn)
                    .await
                    .map_err(|e| redis_error("scanning", e))?
                else {
                    break;
                };
                // One script per in-progress index: on a cluster, the
                // records of one bucket with their bucket's index.
                let mut groups: std::collections::BTreeMap<String, Vec<String>> =
                    std::collections::BTreeMap::new();
                // Only keys that are records of this store, named exactly
                // as it names them: a client's key may hold `}:r:`, which
                // the pattern lets through for its index or fence.
                for key in keys {
                    if let Some(id) = self.keys.id_of(&key) {
                        let index = self.keys.in_progress(&id.scope, &id.key);
                        groups.entry(index).or_default().push(key);
                    }
                }
                for (index, group) in groups {
                    if purged >= limit {
                        break;
                    }
                    let call = self
                        .scripts
                        .purge
                        .call()
                        .key(index)
                        .key(&group)
                        .arg(now.as_millis())
                        .arg(limit - purged);
                    let n: i64 = conn
                        .run(&call)
                        .await
                        .map_err(|e| redis_error("purging", e))?;
                    purged += usize::try_from(n).unwrap_or(0);
                }
            }
            Ok(purged)
        })
    }

    fn list_stale<'a>(
        &'a self,
        now: Timestamp,
        after: Option<&'a StaleCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        Box::pin(async move {
            let (score, member) = match after {
                Some(c) => (
                    c.lease_until.as_millis().to_string(),
                    self.keys.record(&c.id),
                ),
                None => ("-inf".to_owned(), String::new()),
            };
            // Each index answers its first `limit` after the cursor; the
            // first `limit` of them all, in the same order, are the page.
            let mut found: Vec<(Timestamp, String, Record)> = Vec::new();
            let indexes = self.keys.in_progress_indexes();
            for chunk in indexes.chunks(STALE_CONCURRENCY) {
                let pages = futures_util::future::try_join_all(chunk.iter().map(|index| {
                    let mut conn = self.conn.clone();
                    let (score, member) = (&score, &member);
                    async move {
                        let call = self
                            .scripts
                            .stale
                            .call()
                            .key(index)
                            .arg(now.as_millis())
                            .arg(score)
                            .arg(member)
                            .arg(limit);
                        let items: Vec<Value> = conn
                            .run(&call)
                            .await
                            .map_err(|e| redis_error("listing stale records", e))?;
                        row::stale_records_from_reply(&self.keys, &items)
                    }
                }))
                .await?;
                for record in pages.into_iter().flatten() {
                    let lease_until = record.lease_until.unwrap_or(record.created_at);
                    found.push((lease_until, self.keys.record(&record.id), record));
                }
                found.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
                found.truncate(limit);
            }
            Ok(found.into_iter().map(|(_, _, record)| record).collect())
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
            let call = self
                .scripts
                .find
                .call()
                .key(self.keys.key_index(scope, key))
                .arg(now.as_millis())
                .arg(limit)
                .arg(head)
                .arg(tail);
            let items: Vec<Value> = conn
                .run(&call)
                .await
                .map_err(|e| redis_error("finding records by key", e))?;
            row::records_by_key_from_reply(scope, key, &items)
        })
    }
}

#[cfg(test)]
mod cluster_attack_tests;
#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;

/// The README's examples, compiled (and run, unless `no_run`) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
