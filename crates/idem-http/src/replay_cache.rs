//! Finished records kept in memory, so that a key retried again and again
//! is answered without a store round trip.
//!
//! Safe with any number of instances on one shared store: a finished
//! record (`completed` or `failed`) never changes until it expires. No
//! store operation rewrites it (a claim replays or refuses it, complete and
//! release need the fence of an in-progress record, purge takes only
//! expired records), so a copy is as good as the store's answer until the
//! record's `expires_at`, and is never used after it. A request whose
//! fingerprint differs from the copy's goes to the store as if there were no
//! copy, so mismatches and records of an older fingerprint version are
//! decided there.
//!
//! What is kept: records that were replayed once (a key retried once is the
//! kind that is retried again), with a response under [`MAX_ENTRY`] bytes,
//! up to a total weight in bytes; the least useful go first (S3-FIFO, from
//! `quick_cache`). Not kept: first executions (most keys are never
//! retried), in-progress records, anything whose response was not stored.

use std::sync::Arc;

use idem_core::{Fingerprint, Record, RecordId, Status, StoredResponse, Timestamp};
use quick_cache::Weighter;
use quick_cache::sync::Cache;

/// Records with a larger response are not kept.
pub(crate) const MAX_ENTRY: usize = 64 * 1024;

/// A finished record's replay, as kept.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) expires_at: Timestamp,
    pub(crate) response: StoredResponse,
    weight: u64,
}

#[derive(Debug, Clone, Copy)]
struct ByBytes;

impl Weighter<RecordId, Arc<Finished>> for ByBytes {
    fn weight(&self, _id: &RecordId, entry: &Arc<Finished>) -> u64 {
        entry.weight
    }
}

/// The cache: bounded in bytes, shared by clones of one layer.
pub(crate) struct ReplayCache {
    entries: Cache<RecordId, Arc<Finished>, ByBytes>,
}

impl std::fmt::Debug for ReplayCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayCache")
            .field("entries", &self.entries.len())
            .field("weight", &self.entries.weight())
            .finish()
    }
}

impl ReplayCache {
    /// A cache of at most `capacity` bytes (responses, headers and ids);
    /// `None` for a capacity of 0 (no cache).
    pub(crate) fn new(capacity: usize) -> Option<ReplayCache> {
        (capacity > 0).then(|| {
            let capacity = u64::try_from(capacity).unwrap_or(u64::MAX);
            // An estimate for the table's first allocation: ~1 KiB a record.
            let items = usize::try_from(capacity / 1024)
                .unwrap_or(usize::MAX)
                .max(16);
            ReplayCache {
                entries: Cache::with_weighter(items, capacity, ByBytes),
            }
        })
    }

    /// The kept replay of `id`, if there is one for these parameters that
    /// has not expired at `now`.
    pub(crate) fn get(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        now: Timestamp,
    ) -> Option<Arc<Finished>> {
        let entry = self.entries.get(id)?;
        if now >= entry.expires_at {
            self.entries.remove(id);
            return None;
        }
        (entry.fingerprint == *fingerprint).then_some(entry)
    }

    /// Keeps a finished record that was just replayed from the store.
    pub(crate) fn keep(&self, record: &Record) {
        if !matches!(record.status, Status::Completed | Status::Failed) {
            return;
        }
        let Some(response) = &record.response else {
            return;
        };
        let weight = response.body.len()
            + response
                .headers
                .iter()
                .map(|(n, v)| n.len() + v.len())
                .sum::<usize>();
        if weight > MAX_ENTRY {
            return;
        }
        let id = &record.id;
        let weight = weight
            + id.scope.as_str().len()
            + id.operation.as_str().len()
            + id.key.as_str().len()
            + std::mem::size_of::<Finished>();
        self.entries.insert(
            id.clone(),
            Arc::new(Finished {
                fingerprint: record.fingerprint,
                expires_at: record.expires_at,
                response: response.clone(),
                weight: u64::try_from(weight).unwrap_or(u64::MAX),
            }),
        );
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use idem_core::{Fence, FieldSelection, Key, Operation, Scope};

    use super::*;

    fn record(key: &str, body: usize, status: Status, expires_at: i64) -> Record {
        let id = RecordId::new(
            Scope::from_raw("tenant-a"),
            Operation::new("POST", "/t"),
            Key::new(key).unwrap(),
        );
        Record {
            fingerprint: fingerprint(b"{}"),
            status,
            response: (status != Status::InProgress).then(|| StoredResponse {
                status: 201,
                headers: vec![("content-type".into(), b"application/json".to_vec())],
                body: vec![b'x'; body],
            }),
            resource_id: None,
            created_at: Timestamp::from_millis(0),
            lease_until: None,
            fence: Fence::new(1),
            expires_at: Timestamp::from_millis(expires_at),
            id,
        }
    }

    fn fingerprint(body: &[u8]) -> Fingerprint {
        Fingerprint::compute(
            &Operation::new("POST", "/t"),
            Some("application/json"),
            body,
            &FieldSelection::Whole,
        )
    }

    #[test]
    fn a_kept_record_answers_only_the_same_parameters_until_it_expires() {
        let cache = ReplayCache::new(1 << 20).unwrap();
        let r = record("key-0000000000000001", 10, Status::Completed, 1_000);
        cache.keep(&r);
        let before = Timestamp::from_millis(999);
        assert!(cache.get(&r.id, &r.fingerprint, before).is_some());
        assert!(cache.get(&r.id, &fingerprint(b"[1]"), before).is_none());
        let mut other_scope = r.id.clone();
        other_scope.scope = Scope::from_raw("tenant-b");
        assert!(cache.get(&other_scope, &r.fingerprint, before).is_none());
        assert!(
            cache
                .get(&r.id, &r.fingerprint, Timestamp::from_millis(1_000))
                .is_none()
        );
        assert_eq!(cache.len(), 0, "an expired copy is dropped");
    }

    #[test]
    fn in_progress_and_large_records_are_not_kept() {
        let cache = ReplayCache::new(1 << 20).unwrap();
        cache.keep(&record(
            "key-0000000000000002",
            10,
            Status::InProgress,
            1_000,
        ));
        cache.keep(&record(
            "key-0000000000000003",
            MAX_ENTRY + 1,
            Status::Completed,
            1_000,
        ));
        assert_eq!(cache.len(), 0);
        cache.keep(&record("key-0000000000000004", 10, Status::Failed, 1_000));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn the_weight_stays_within_the_capacity() {
        let capacity = 256 * 1024;
        let cache = ReplayCache::new(capacity).unwrap();
        for i in 0..200 {
            cache.keep(&record(
                &format!("key-{i:016}"),
                8 * 1024,
                Status::Completed,
                1_000,
            ));
        }
        assert!(cache.entries.weight() <= capacity as u64);
        assert!(cache.len() < 200);
        assert!(ReplayCache::new(0).is_none());
    }
}
