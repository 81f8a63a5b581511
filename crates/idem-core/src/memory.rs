//! An in-memory store for tests and single-process services.
//!
//! Records live in a fixed number of shards, each a `HashMap` behind its own
//! mutex, chosen by hashing the record id: claims on different keys rarely
//! touch the same lock, and no lock is held across an `.await`. Nothing
//! survives the process; use the SQLite store when it must.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::record::{Fence, Record, Status};
use crate::scope::RecordId;
use crate::store::{
    BoxFuture, Claim, ClaimRequest, Completion, Settled, StaleCursor, Store, StoreError,
};
use crate::time::Timestamp;
use crate::transition;

const SHARDS: usize = 64;

/// The in-memory store. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<HashMap<RecordId, Record>>]>,
    hasher: RandomState,
    fences: AtomicU64,
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
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            fences: AtomicU64::new(0),
        }
    }

    /// How many records it holds, expired ones included.
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|i| self.lock(i).len()).sum()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard_of(&self, id: &RecordId) -> usize {
        (self.hasher.hash_one(id) as usize) % SHARDS
    }

    /// Locks a shard. A panic while holding the lock cannot leave a record
    /// half-written (every update is a single assignment), so a poisoned
    /// lock is simply taken over.
    fn lock(&self, shard: usize) -> MutexGuard<'_, HashMap<RecordId, Record>> {
        self.shards[shard]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn next_fence(&self) -> Fence {
        Fence::new(self.fences.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn claim_now(&self, req: &ClaimRequest) -> Claim {
        let mut shard = self.lock(self.shard_of(&req.id));
        let step = transition::claim(shard.get(&req.id), req, || self.next_fence());
        if let Some(record) = step.write {
            shard.insert(req.id.clone(), record);
        }
        step.claim
    }

    fn finish_now(&self, id: &RecordId, fence: Fence, completion: Option<Completion>) -> Settled {
        let mut shard = self.lock(self.shard_of(id));
        if !transition::may_finish(shard.get(id), fence) {
            return Settled::StaleFence;
        }
        match completion {
            Some(c) => {
                if let Some(rec) = shard.get_mut(id) {
                    transition::complete(rec, c);
                }
            }
            None => {
                shard.remove(id);
            }
        }
        Settled::Applied
    }
}

impl Store for MemoryStore {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move { Ok(self.claim_now(req)) })
    }

    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        completion: Completion,
        _now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(async move { Ok(self.finish_now(id, fence, Some(completion))) })
    }

    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        _now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(async move { Ok(self.finish_now(id, fence, None)) })
    }

    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            let shard = self.lock(self.shard_of(id));
            Ok(shard.get(id).filter(|r| r.is_live(now)).cloned())
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
}

#[cfg(test)]
mod tests {
    use super::MemoryStore;

    crate::conformance_tests!(async { MemoryStore::new() });
}
