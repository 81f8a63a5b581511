//! An in-memory store for tests and single-process services.
//!
//! Records live in a fixed number of shards, each a `HashMap` behind its own
//! mutex, chosen by hashing the record's scope and key (not its operation):
//! claims on different keys rarely touch the same lock, and no lock is held
//! across an `.await`. Nothing survives the process; use the SQLite store
//! when it must.
//!
//! Because every operation of one (scope, key) lives in one shard, each
//! shard also keeps an index from (scope, key) to the operations it holds
//! records for, updated under the same lock as the records themselves (on
//! the claim that creates a record, the release that deletes it, and the
//! purge). [`Store::find_by_key`] therefore locks one shard and reads a few
//! records, whatever the size of the store.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

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
}

/// One shard: its records, and the operations of its records by (scope, key).
#[derive(Debug, Default)]
struct Shard {
    records: HashMap<RecordId, Record>,
    /// Never holds an empty list: a (scope, key) whose last record goes is
    /// removed.
    by_key: HashMap<(Scope, Key), Vec<Operation>>,
}

impl Shard {
    /// Saves `record` under `id`, indexing it if it is new.
    fn insert(&mut self, id: &RecordId, record: Record) {
        if self.records.insert(id.clone(), record).is_none() {
            self.by_key
                .entry((id.scope.clone(), id.key.clone()))
                .or_default()
                .push(id.operation.clone());
        }
    }

    /// Deletes the record at `id` and its index entry.
    fn remove(&mut self, id: &RecordId) {
        if self.records.remove(id).is_none() {
            return;
        }
        if let Entry::Occupied(mut ops) = self.by_key.entry((id.scope.clone(), id.key.clone())) {
            ops.get_mut().retain(|op| *op != id.operation);
            if ops.get().is_empty() {
                ops.remove();
            }
        }
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
        }
    }

    /// How many records it holds, expired ones included.
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|i| self.lock(i).records.len()).sum()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shard of every record of `scope` with `key`, whatever its
    /// operation, so that [`Store::find_by_key`] locks one shard.
    fn shard_of(&self, scope: &Scope, key: &Key) -> usize {
        (self.hasher.hash_one((scope, key)) as usize) % SHARDS
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
        let mut shard = self.lock(self.shard_of(&req.id.scope, &req.id.key));
        let step = transition::claim(shard.records.get(&req.id), req, || self.next_fence());
        if let Some(record) = step.write {
            shard.insert(&req.id, record);
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
        let mut shard = self.lock(self.shard_of(&id.scope, &id.key));
        if !transition::may_finish(shard.records.get(id), fence) {
            return Settled::StaleFence;
        }
        match completion {
            Some(c) => {
                if let Some(rec) = shard.records.get_mut(id) {
                    transition::complete(rec, c);
                }
            }
            None => shard.remove(id),
        }
        Settled::Applied
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

    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            let shard = self.lock(self.shard_of(&id.scope, &id.key));
            Ok(shard.records.get(id).filter(|r| r.is_live(now)).cloned())
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
                let expired: Vec<RecordId> = shard
                    .records
                    .iter()
                    .filter(|(_, r)| !r.is_live(now))
                    .map(|(id, _)| id.clone())
                    .take(limit - purged)
                    .collect();
                for id in expired {
                    shard.remove(&id);
                    purged += 1;
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
                        .records
                        .values()
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
            let mut found: Vec<Record> = {
                let shard = self.lock(self.shard_of(scope, key));
                let Some(ops) = shard.by_key.get(&(scope.clone(), key.clone())) else {
                    return Ok(Vec::new());
                };
                let mut id = RecordId::new(scope.clone(), Operation::from_raw(""), key.clone());
                ops.iter()
                    .filter_map(|op| {
                        id.operation.clone_from(op);
                        shard.records.get(&id).filter(|r| r.is_live(now)).cloned()
                    })
                    .collect()
            };
            found.sort_by(|a, b| {
                (b.created_at, &b.id.operation).cmp(&(a.created_at, &a.id.operation))
            });
            found.truncate(limit);
            Ok(found)
        })
    }
}

// The conformance suite runs against MemoryStore from tests/conformance.rs.
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::MemoryStore;
    use crate::{
        ClaimRequest, FieldSelection, Fingerprint, Key, Operation, RecordId, Scope, Timestamp,
    };

    // Fixtures like idem-testkit's, which a unit test here cannot use: the
    // kit links the published idem-core, not this test build of it.
    fn t0() -> Timestamp {
        Timestamp::from_millis(1_800_000_000_000)
    }

    fn unique_id(key: &str) -> RecordId {
        let key = Key::new(key).unwrap_or_else(|e| panic!("test key {key:?}: {e}"));
        RecordId::new(
            Scope::from_raw("memory-tests"),
            Operation::new("POST", "/memory"),
            key,
        )
    }

    fn request(id: &RecordId, body: &str, now: Timestamp) -> ClaimRequest {
        ClaimRequest {
            id: id.clone(),
            fingerprint: Fingerprint::compute(
                &id.operation,
                Some("application/json"),
                body.as_bytes(),
                &FieldSelection::Whole,
            ),
            now,
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(3600),
        }
    }

    /// The (scope, key) index follows claims, releases and purges, so it
    /// never grows beyond the records it points at.
    #[test]
    fn the_key_index_keeps_in_step_with_the_records() {
        use crate::{Claim, Settled, Store};

        let indexed = |store: &MemoryStore| -> usize {
            (0..super::SHARDS)
                .map(|i| store.lock(i).by_key.values().map(Vec::len).sum::<usize>())
                .sum()
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("tokio runtime: {e}"));
        rt.block_on(async {
            let store = MemoryStore::new();
            let a = unique_id("index-key-000001");
            let b = RecordId::new(
                a.scope.clone(),
                Operation::new("PUT", "/index"),
                a.key.clone(),
            );
            let Claim::Acquired(la) = store.claim(&request(&a, "{}", t0())).await.unwrap() else {
                panic!("claim a");
            };
            let mut short = request(&b, "{}", t0());
            short.ttl = Duration::from_secs(60);
            assert!(matches!(
                store.claim(&short).await.unwrap(),
                Claim::Acquired(_)
            ));
            assert_eq!(indexed(&store), 2);
            // A takeover overwrites a record: still one entry for it.
            let later = t0() + Duration::from_secs(31);
            assert!(matches!(
                store.claim(&request(&a, "{}", later)).await.unwrap(),
                Claim::Acquired(_)
            ));
            assert_eq!(indexed(&store), 2);
            assert_eq!(
                store.release(&a, la.fence, later).await.unwrap(),
                Settled::StaleFence
            );
            assert_eq!(indexed(&store), 2, "a stale release changes nothing");
            let rec = store.get(&a, later).await.unwrap().unwrap();
            assert_eq!(
                store.release(&a, rec.fence, later).await.unwrap(),
                Settled::Applied
            );
            assert_eq!(indexed(&store), 1);
            let after = t0() + Duration::from_secs(60);
            assert_eq!(store.purge_expired(after, 10).await.unwrap(), 1);
            assert_eq!(indexed(&store), 0);
            assert!(
                store
                    .lock(store.shard_of(&a.scope, &a.key))
                    .by_key
                    .is_empty()
            );
        });
    }
}
