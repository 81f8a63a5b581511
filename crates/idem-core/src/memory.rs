//! An in-memory store for tests and single-process services.
//!
//! Records live in a fixed number of shards, each a `HashMap` behind its own
//! mutex, chosen by hashing the record's scope and key (not its operation):
//! claims on different keys rarely touch the same lock, and no lock is held
//! across an `.await`. Nothing survives the process; use the SQLite store
//! when it must.
//!
//! A store call hashes the (scope, key) once, with a keyed hash seeded at
//! random per store, so a client cannot choose keys that collide. That hash
//! picks the shard and, inside it, the bucket of the (scope, key): every
//! record of it, by operation. [`Store::find_by_key`] reads one bucket, and
//! a lookup copies no part of the id. A bucket is found by comparing its
//! scope and key, not by the hash alone, so two (scope, key)s whose hashes
//! collide keep buckets of their own.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use hashbrown::HashTable;

use crate::durability::{Durability, DurabilityFinding, Verdict};
use crate::epoch::EpochMark;
use crate::key::Key;
use crate::record::{Fence, Record, Status};
use crate::scope::{Operation, RecordId, Scope};
use crate::store::{
    BoxFuture, Claim, ClaimRequest, Completion, Settled, StaleCursor, Store, StoreError,
};
use crate::time::Timestamp;
use crate::transition;

const SHARDS: usize = 64;

/// The in-memory store. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    fences: AtomicU64,
    /// The store's epoch and counter (`epoch.rs`); `None` until the first
    /// advance, and again after [`MemoryStore::forget_everything`].
    epoch: Mutex<Option<(String, u64)>>,
}

/// The hash of a (scope, key), computed once per store call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KeyHash(u64);

impl KeyHash {
    /// The shard: bits that the bucket's place in the table (the low ones)
    /// and its tag (the top seven) do not use, so a shard's buckets spread
    /// over its table.
    fn shard(self) -> usize {
        (self.0 >> 32) as usize % SHARDS
    }
}

/// Every record of one (scope, key).
#[derive(Debug)]
struct Bucket {
    hash: KeyHash,
    /// Never empty: a bucket whose last record goes is removed. Its records'
    /// ids name the bucket's (scope, key).
    records: Records,
}

impl Bucket {
    fn holds(&self, scope: &Scope, key: &Key) -> bool {
        self.records
            .first()
            .is_some_and(|r| r.id.scope == *scope && r.id.key == *key)
    }
}

/// Up to this many records of one (scope, key) are kept in a list and
/// found by comparing operations; more go into a map by operation.
const FEW: usize = 8;

/// The records of one bucket, by operation. Nearly every key is used with
/// one operation, so a bucket starts as a list that holds exactly its
/// records: a map would allocate room for four and hash the operation on
/// every lookup, and a record here is a few hundred bytes (BENCHMARKS.md:
/// it was three quarters of the store's memory). A key used with more than
/// [`FEW`] operations (an application whose operations are its raw paths,
/// say, under a client's control) gets a map, so lookups stay constant.
#[derive(Debug)]
enum Records {
    Few(Vec<Record>),
    /// Boxed: rare, and it keeps every bucket in the shard's table small
    /// (a list's 24 bytes, not a map's 48).
    #[allow(clippy::box_collection)]
    Many(Box<HashMap<Operation, Record>>),
}

impl Records {
    fn one(record: Record) -> Records {
        Records::Few(vec![record])
    }

    fn get(&self, operation: &Operation) -> Option<&Record> {
        match self {
            Records::Few(list) => list.iter().find(|r| r.id.operation == *operation),
            Records::Many(map) => map.get(operation),
        }
    }

    fn get_mut(&mut self, operation: &Operation) -> Option<&mut Record> {
        match self {
            Records::Few(list) => list.iter_mut().find(|r| r.id.operation == *operation),
            Records::Many(map) => map.get_mut(operation),
        }
    }

    /// Saves `record`, over the one with its operation if there is one.
    fn put(&mut self, record: Record) {
        match self {
            Records::Few(list) => {
                if let Some(slot) = list
                    .iter_mut()
                    .find(|r| r.id.operation == record.id.operation)
                {
                    *slot = record;
                } else if list.len() < FEW {
                    list.push(record);
                } else {
                    let mut map: HashMap<Operation, Record> = std::mem::take(list)
                        .into_iter()
                        .map(|r| (r.id.operation.clone(), r))
                        .collect();
                    map.insert(record.id.operation.clone(), record);
                    *self = Records::Many(Box::new(map));
                }
            }
            Records::Many(map) => {
                map.insert(record.id.operation.clone(), record);
            }
        }
    }

    fn remove(&mut self, operation: &Operation) {
        match self {
            Records::Few(list) => {
                if let Some(at) = list.iter().position(|r| r.id.operation == *operation) {
                    list.swap_remove(at);
                }
            }
            Records::Many(map) => {
                map.remove(operation);
            }
        }
    }

    fn retain(&mut self, mut keep: impl FnMut(&Record) -> bool) {
        match self {
            Records::Few(list) => list.retain(|r| keep(r)),
            Records::Many(map) => map.retain(|_, r| keep(r)),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Records::Few(list) => list.is_empty(),
            Records::Many(map) => map.is_empty(),
        }
    }

    fn first(&self) -> Option<&Record> {
        match self {
            Records::Few(list) => list.first(),
            Records::Many(map) => map.values().next(),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Record> {
        let (few, many) = match self {
            Records::Few(list) => (Some(list.iter()), None),
            Records::Many(map) => (None, Some(map.values())),
        };
        few.into_iter().flatten().chain(many.into_iter().flatten())
    }
}

/// One shard: the buckets of the (scope, key)s that hash to it.
#[derive(Debug, Default)]
struct Shard {
    buckets: HashTable<Bucket>,
}

impl Shard {
    fn bucket(&self, hash: KeyHash, scope: &Scope, key: &Key) -> Option<&Bucket> {
        self.buckets.find(hash.0, |b| b.holds(scope, key))
    }

    fn get(&self, hash: KeyHash, id: &RecordId) -> Option<&Record> {
        self.bucket(hash, &id.scope, &id.key)?
            .records
            .get(&id.operation)
    }

    fn get_mut(&mut self, hash: KeyHash, id: &RecordId) -> Option<&mut Record> {
        self.buckets
            .find_mut(hash.0, |b| b.holds(&id.scope, &id.key))?
            .records
            .get_mut(&id.operation)
    }

    /// Saves `record`, over the record with its id if there is one.
    fn put(&mut self, hash: KeyHash, record: Record) {
        let id = &record.id;
        match self
            .buckets
            .find_mut(hash.0, |b| b.holds(&id.scope, &id.key))
        {
            Some(bucket) => bucket.records.put(record),
            None => {
                let bucket = Bucket {
                    hash,
                    records: Records::one(record),
                };
                self.buckets.insert_unique(hash.0, bucket, |b| b.hash.0);
            }
        }
    }

    /// Deletes the record at `id`, and its bucket if it was the last.
    fn remove(&mut self, hash: KeyHash, id: &RecordId) {
        if let Ok(mut entry) = self
            .buckets
            .find_entry(hash.0, |b| b.holds(&id.scope, &id.key))
        {
            entry.get_mut().records.remove(&id.operation);
            if entry.get().records.is_empty() {
                entry.remove();
            }
        }
    }

    fn records(&self) -> impl Iterator<Item = &Record> {
        self.buckets.iter().flat_map(|b| b.records.iter())
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: RandomState::new(),
            fences: AtomicU64::new(0),
            epoch: Mutex::new(None),
        }
    }

    /// Drops every record and the epoch, as a store restarted without
    /// persistence would: for tests of what notices a store that forgot
    /// ([`crate::EpochWatch`]).
    pub fn forget_everything(&self) {
        for i in 0..SHARDS {
            *self.lock(i) = Shard::default();
        }
        *self
            .epoch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// How many records it holds, expired ones included.
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|i| self.lock(i).records().count()).sum()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The hash of every record of `scope` with `key`, whatever its
    /// operation, so that [`Store::find_by_key`] reads one bucket.
    fn hash(&self, scope: &Scope, key: &Key) -> KeyHash {
        KeyHash(self.hasher.hash_one((scope, key)))
    }

    /// Locks a shard. A panic while holding the lock cannot leave a record
    /// half-written (every update is a single assignment), so a poisoned
    /// lock is simply taken over.
    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.shards[shard]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn next_fence(&self) -> Fence {
        Fence::new(self.fences.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Decides a claim and writes its outcome under the shard's lock. Sync,
    /// so the lock is never held across an `.await`.
    fn claim_locked(&self, req: &ClaimRequest) -> Claim {
        let hash = self.hash(&req.id.scope, &req.id.key);
        let mut shard = self.lock(hash.shard());
        let step = transition::claim(shard.get(hash, &req.id), req, || self.next_fence());
        if let Some(record) = step.write {
            shard.put(hash, record);
        }
        step.claim
    }

    /// Completes (`Some`) or releases (`None`) a record under the shard's
    /// lock, if `fence` still holds it. Sync, like [`Self::claim_locked`].
    fn finish_locked(
        &self,
        id: &RecordId,
        fence: Fence,
        completion: Option<Completion>,
    ) -> Settled {
        let hash = self.hash(&id.scope, &id.key);
        let mut shard = self.lock(hash.shard());
        let Some(record) = shard.get_mut(hash, id) else {
            return Settled::StaleFence;
        };
        if !transition::may_finish(Some(record), fence) {
            return Settled::StaleFence;
        }
        match completion {
            Some(c) => transition::complete(record, c),
            None => shard.remove(hash, id),
        }
        Settled::Applied
    }

    fn extend_locked(&self, id: &RecordId, fence: Fence, lease_until: Timestamp) -> Settled {
        let hash = self.hash(&id.scope, &id.key);
        let mut shard = self.lock(hash.shard());
        match shard.get_mut(hash, id) {
            Some(record) if transition::may_finish(Some(record), fence) => {
                transition::extend_lease(record, lease_until);
                Settled::Applied
            }
            _ => Settled::StaleFence,
        }
    }
}

impl Store for MemoryStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move { Ok(self.claim_locked(req)) })
    }

    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        completion: Completion,
        _now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(async move { Ok(self.finish_locked(id, fence, Some(completion))) })
    }

    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        _now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(async move { Ok(self.finish_locked(id, fence, None)) })
    }

    fn extend_lease<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        lease_until: Timestamp,
        _now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(async move { Ok(self.extend_locked(id, fence, lease_until)) })
    }

    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            let hash = self.hash(&id.scope, &id.key);
            let shard = self.lock(hash.shard());
            Ok(shard.get(hash, id).filter(|r| r.is_live(now)).cloned())
        })
    }

    fn purge_expired(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(async move {
            let mut purged = 0;
            // One shard locked at a time: traffic on other shards goes on.
            for i in 0..SHARDS {
                if purged >= limit {
                    break;
                }
                let mut shard = self.lock(i);
                shard.buckets.retain(|bucket| {
                    bucket.records.retain(|r| {
                        let purge = purged < limit && !r.is_live(now);
                        purged += usize::from(purge);
                        !purge
                    });
                    !bucket.records.is_empty()
                });
                // Give back what a burst of keys left once it has expired.
                if shard.buckets.capacity() > 4 * shard.buckets.len().max(64) {
                    shard.buckets.shrink_to_fit(|b| b.hash.0);
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
            // A full scan, one shard locked at a time: the memory store is
            // for tests and single processes, where this is small.
            let position = |r: &Record| (r.lease_until.unwrap_or_default(), r.id.clone());
            let mut stale: Vec<Record> = (0..SHARDS)
                .flat_map(|i| {
                    self.lock(i)
                        .records()
                        .filter(|r| {
                            r.status == Status::InProgress
                                && r.is_live(now)
                                && !r.lease_is_live(now)
                        })
                        .cloned()
                        .collect::<Vec<_>>()
                })
                .filter(|r| after.is_none_or(|c| position(r) > (c.lease_until, c.id.clone())))
                .collect();
            stale.sort_by_key(position);
            stale.truncate(limit);
            Ok(stale)
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
            let hash = self.hash(scope, key);
            let shard = self.lock(hash.shard());
            let mut found: Vec<&Record> = shard
                .bucket(hash, scope, key)
                .into_iter()
                .flat_map(|b| b.records.iter())
                .filter(|r| r.is_live(now))
                .collect();
            found.sort_by(|a, b| {
                (b.created_at, &b.id.operation).cmp(&(a.created_at, &a.id.operation))
            });
            // Only the records asked for are copied (with their stored
            // responses): one key used on many paths costs no more.
            found.truncate(limit);
            let found = found.into_iter().cloned().collect();
            Ok(found)
        })
    }

    /// One place, `store`: the epoch lives beside the records, and goes
    /// with them in [`MemoryStore::forget_everything`].
    fn advance_epoch<'a>(
        &'a self,
        candidate: &'a str,
    ) -> BoxFuture<'a, Result<Vec<EpochMark>, StoreError>> {
        let mut epoch = self
            .epoch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mark = match epoch.as_mut() {
            Some((id, counter)) => {
                *counter += 1;
                EpochMark::new("store", id.clone(), *counter, false)
            }
            None => {
                *epoch = Some((candidate.to_owned(), 1));
                EpochMark::new("store", candidate, 1, true)
            }
        };
        Box::pin(async move { Ok(vec![mark]) })
    }

    /// One finding, `storage = memory`, that [`Verdict::Loses`] records:
    /// they live in this process only.
    fn durability(&self) -> BoxFuture<'_, Result<Durability, StoreError>> {
        Box::pin(async {
            Ok(Durability::new(vec![DurabilityFinding::new(
                "storage",
                "memory",
                Verdict::Loses("records live in this process only".into()),
            )]))
        })
    }
}

// The conformance suite runs against MemoryStore from tests/conformance.rs.

#[cfg(test)]
mod tests;
