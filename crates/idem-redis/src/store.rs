//! The store: one connection (or one per cluster node), its key layout
//! and scripts, and the `Store` operations, each one script call.

use std::fmt;

use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Durability, EpochMark, Fence, Key, Record,
    RecordId, Scope, Settled, StaleCursor, Store, StoreError, StoreErrorKind, Timestamp,
};
use redis::Value;

use crate::connection::Connections;
use crate::error::{not_replicated, redis_error};
use crate::replica_wait::ReplicaWait;
use crate::row;
use crate::scripts::{self, Keys, Layout, Scripts};

/// How long after a record's `expires_at` Redis may drop its keys: a Redis
/// clock up to this far ahead of the callers' never loses a live record.
/// Records past `expires_at` but not yet dropped count as expired (the
/// scripts compare with the caller's time) and are removed by
/// [`Store::purge_expired`].
pub const EXPIRY_MARGIN: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// How many in-progress indexes of a cluster are read at once when stale
/// records are listed.
const STALE_CONCURRENCY: usize = 64;

/// The Redis store. Clones share one multiplexed connection (on a cluster,
/// one per node).
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) conn: Connections,
    pub(crate) keys: Keys,
    pub(crate) scripts: Scripts,
    pub(crate) replicas: Option<ReplicaWait>,
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
        let mut conn = self.conn.get();
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
    ///
    /// [`RedisStoreBuilder::wait_for_replicas`]: crate::RedisStoreBuilder::wait_for_replicas
    async fn run_acknowledged<T: redis::FromRedisValue>(
        &self,
        call: &scripts::ScriptCall<'_>,
        what: &str,
        needs_ack: impl FnOnce(&T) -> bool,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.get();
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

    /// Where the store's epoch lives: each place and its key. One place,
    /// `store`, on one server; on a cluster one per master, named by the
    /// slots it serves (see `epoch.rs`), read from `CLUSTER SLOTS` now.
    async fn epoch_places(&self) -> Result<Vec<(String, String)>, StoreError> {
        if self.keys.layout() == Layout::Single {
            return Ok(vec![("store".to_owned(), self.keys.epoch())]);
        }
        let shards = self
            .conn
            .get()
            .shards()
            .await
            .map_err(|e| redis_error("listing the masters", e))?;
        if shards.is_empty() {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "redis store: the cluster names no master that serves slots",
            ));
        }
        shards
            .iter()
            .map(|ranges| {
                let place = crate::epoch::shard_place(ranges);
                let key = self.keys.shard_epoch(ranges).ok_or_else(|| {
                    StoreError::new(
                        StoreErrorKind::Backend,
                        format!("redis store: no epoch key found for the {place}"),
                    )
                })?;
                Ok((place, key))
            })
            .collect()
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

    fn extend_lease<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        lease_until: Timestamp,
        _now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(async move {
            let call = self
                .scripts
                .extend
                .call()
                .key(self.keys.record(id))
                .key(self.keys.in_progress(&id.scope, &id.key))
                .key(self.keys.key_index(&id.scope, &id.key))
                .key(self.keys.fence(id))
                .arg(fence.get().to_string())
                .arg(lease_until.as_millis())
                .arg((lease_until + EXPIRY_MARGIN).as_millis());
            // A lease a failover forgets lets another executor take over:
            // an applied heartbeat waits for the replicas as a completion
            // does.
            let answer: i64 = self
                .run_acknowledged(&call, "extending a lease", |answer: &i64| *answer == 1)
                .await?;
            // 1: applied (the lease may have been later already); 0: the
            // fence does not hold an in-progress record.
            Ok(match answer {
                1 => Settled::Applied,
                _ => Settled::StaleFence,
            })
        })
    }

    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.get();
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
            let mut conn = self.conn.get();
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
                    let mut conn = self.conn.get();
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
            let mut conn = self.conn.get();
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

    /// One place, `store`, on one server (the hash `PREFIX:epoch`); on a
    /// cluster one place per master, named by the slots it serves
    /// (`slots 0-5460`, so a replica promoted for them is the same place),
    /// each at `PREFIX:{TAG}:epoch` with a tag in those slots. Each place
    /// is one call of `epoch.lua`, followed by a `WAIT` when the store
    /// waits for replicas (an advance no replica acknowledged fails
    /// closed). Every place answers, or the call fails.
    fn advance_epoch<'a>(
        &'a self,
        candidate: &'a str,
    ) -> BoxFuture<'a, Result<Vec<EpochMark>, StoreError>> {
        Box::pin(async move {
            let places = self.epoch_places().await?;
            futures_util::future::try_join_all(places.into_iter().map(|(place, key)| async move {
                let call = self.scripts.epoch.call().key(&key).arg(candidate);
                let items: Vec<Value> = self
                    .run_acknowledged(&call, "advancing the epoch", |_: &Vec<Value>| true)
                    .await?;
                row::epoch_from_reply(place, &items)
            }))
            .await
        })
    }

    /// `appendonly`, `appendfsync` and `maxmemory-policy` of the one
    /// server, or of every master of a cluster (each finding's setting then
    /// names the master by its place in `CLUSTER SLOTS`, `appendonly@master0`).
    /// A server that refuses `CONFIG` gives findings with the value
    /// `unknown`, [`Verdict::Risky`](idem_core::Verdict::Risky).
    fn durability(&self) -> BoxFuture<'_, Result<Durability, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.get();
            let masters = conn
                .masters()
                .await
                .map_err(|e| redis_error("listing the masters", e))?;
            let cluster = masters.len() > 1 || self.keys.layout() == Layout::Cluster;
            let mut findings = Vec::new();
            for (n, node) in masters.into_iter().enumerate() {
                for setting in crate::durability::SETTINGS {
                    let value = match conn.config_get(node, setting).await {
                        Ok(v) => v,
                        Err(e)
                            if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() =>
                        {
                            return Err(redis_error("reading the durability settings", e));
                        }
                        Err(_) => None,
                    };
                    let mut finding = crate::durability::judge(setting, value.as_deref());
                    if cluster {
                        finding.setting = format!("{setting}@master{n}");
                    }
                    findings.push(finding);
                }
            }
            Ok(Durability::new(findings))
        })
    }
}
