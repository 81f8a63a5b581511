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
//! Two things that claim rests on, which the store cannot check:
//!
//! - **Clocks in step.** Expiry is judged by each instance's clock. An
//!   instance whose clock runs ahead by some skew treats a record as expired
//!   (and may claim it again, or purge it) that much earlier; a copy in an
//!   instance behind it answers with the old record for up to that skew.
//! - **A store that keeps what it finished.** A finished record that the
//!   store loses before its expiry (deleted by hand, a backup restored, a
//!   Redis key evicted under `maxmemory`, a failover to a replica that
//!   missed it) is executed again by the next claim that reaches the
//!   store; copies made before the loss keep answering with the first
//!   result until its expiry. Restart the instances (or turn the cache off)
//!   after such an event.
//!
//! What is kept: records that were replayed once (a key retried once is the
//! kind that is retried again) whose copy takes at most [`MAX_ENTRY`] bytes,
//! up to the capacity in bytes, everything counted (see [`weight`]); the
//! least useful go first (S3-FIFO, from `quick_cache`). Not kept: first
//! executions (most keys are never retried), in-progress records, records
//! of an older fingerprint version (a copy is matched against the current
//! version only, so it would never answer), anything whose response was
//! not stored.

use std::mem::size_of;
use std::sync::Arc;

use idem_core::{Fingerprint, Record, RecordId, Status, StoredResponse, Timestamp};
use quick_cache::Weighter;
use quick_cache::sync::Cache;

/// Records that would take more than this (everything counted, see
/// [`weight`]) are not kept.
pub(crate) const MAX_ENTRY: usize = 64 * 1024;

/// What an allocator adds to each allocation, at the least (its header and
/// rounding).
const PER_ALLOCATION: usize = 16;

/// What one entry costs in the cache's own tables: its slot (the id and the
/// pointer, inline, with list links and state) and its hash-table bucket,
/// counted twice since a table that grows by doubling may hold as much
/// again in spare room.
const SLOT: usize = 2 * (size_of::<(RecordId, Arc<Finished>)>() + 32);

/// The share of the estimated item count that `quick_cache` remembers as
/// ghosts (keys evicted lately, no value): each takes a [`SLOT`].
const GHOSTS: f64 = 0.5;

/// The heap bytes an allocation of `len` bytes takes.
fn allocation(len: usize) -> usize {
    if len == 0 { 0 } else { len + PER_ALLOCATION }
}

/// What keeping `response` under `id` costs in memory: every allocation of
/// the copy (the id's three strings, the entry, the header list and each
/// header's name and value, the body), each with the allocator's overhead,
/// and the entry's slot in the tables. A header costs its slot in the list
/// whatever its length, so a response of many empty headers weighs what it
/// holds.
pub(crate) fn weight(id: &RecordId, response: &StoredResponse) -> usize {
    SLOT + allocation(2 * size_of::<usize>() + size_of::<Finished>())
        + allocation(id.scope.as_str().len())
        + allocation(id.operation.as_str().len())
        + allocation(id.key.as_str().len())
        + fields_weight(&response.headers)
        + fields_weight(&response.trailers)
        + allocation(response.body.len())
}

/// What a list of stored fields (headers or trailers) holds on the heap.
fn fields_weight(fields: &[(String, Vec<u8>)]) -> usize {
    allocation(size_of_val(fields))
        + fields
            .iter()
            .map(|(n, v)| allocation(n.len()) + allocation(v.len()))
            .sum::<usize>()
}

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
    /// A cache that holds at most about `capacity` bytes, everything
    /// counted (entries, their copies, the tables and the ghosts); `None`
    /// for a capacity of 0 (no cache).
    pub(crate) fn new(capacity: usize) -> Option<ReplayCache> {
        if capacity == 0 {
            return None;
        }
        // An estimate for the tables: ~1 KiB a record.
        let items = (capacity / 1024).max(16);
        let options = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity(items)
            .weight_capacity(u64::try_from(capacity).unwrap_or(u64::MAX))
            .ghost_allocation(GHOSTS)
            .build()
            .ok()?;
        let entries = Cache::with_options(
            options,
            ByBytes,
            quick_cache::DefaultHashBuilder::default(),
            quick_cache::sync::DefaultLifecycle::default(),
        );
        // The ghosts' slots come out of the capacity (each shard rounds its
        // share of them up).
        let ghosts = (items as f64 * GHOSTS) as usize + entries.num_shards();
        let for_entries = capacity.saturating_sub(ghosts.saturating_mul(SLOT));
        entries.set_capacity(u64::try_from(for_entries).unwrap_or(u64::MAX));
        Some(ReplayCache { entries })
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
            // Only this copy: another thread may have kept a newer one of
            // the same id meanwhile (the key was claimed again).
            self.entries.remove_if(id, |kept| Arc::ptr_eq(kept, &entry));
            return None;
        }
        (entry.fingerprint == *fingerprint).then_some(entry)
    }

    /// Keeps a finished record that was just replayed from the store.
    pub(crate) fn keep(&self, record: &Record) {
        if !matches!(record.status, Status::Completed | Status::Failed) {
            return;
        }
        // A copy answers only a request whose (current-version) fingerprint
        // equals its own: a record of an older version would never answer,
        // and only take room.
        if record.fingerprint.version() != Fingerprint::VERSION_2 {
            return;
        }
        let Some(response) = &record.response else {
            return;
        };
        let id = &record.id;
        let weight = weight(id, response);
        if weight > MAX_ENTRY {
            return;
        }
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
                trailers: Vec::new(),
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
    fn in_progress_large_and_version_1_records_are_not_kept() {
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
        let mut legacy = record("key-0000000000000005", 10, Status::Completed, 1_000);
        legacy.fingerprint = Fingerprint::from_bytes([7; 32]);
        cache.keep(&legacy);
        assert_eq!(
            cache.len(),
            1,
            "a version-1 record never answers from memory"
        );
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

#[cfg(test)]
mod memory_tests {
    #![allow(clippy::unwrap_used)]

    use std::mem::size_of;

    use idem_core::{Fence, FieldSelection, Key, Operation, Scope};

    use super::*;

    /// What the cache holds on the heap, measured from what it keeps: its
    /// tables (as `quick_cache` counts them) and, for every entry, the
    /// bytes of each allocation the entry owns. Allocator overhead is not
    /// counted, so this is a lower bound of the real footprint.
    fn heap_held(cache: &ReplayCache) -> usize {
        let tables = cache.entries.memory_used().total();
        let entries: usize = cache
            .entries
            .iter()
            .map(|(id, kept)| {
                let r = &kept.response;
                id.scope.as_str().len()
                    + id.operation.as_str().len()
                    + id.key.as_str().len()
                    + 2 * size_of::<usize>()
                    + size_of::<Finished>()
                    + r.headers.capacity() * size_of::<(String, Vec<u8>)>()
                    + r.headers
                        .iter()
                        .map(|(n, v)| n.capacity() + v.capacity())
                        .sum::<usize>()
                    + r.body.capacity()
            })
            .sum();
        tables + entries
    }

    fn finished(n: usize, headers: Vec<(String, Vec<u8>)>, body: usize) -> Record {
        let op = Operation::new("POST", "/t");
        Record {
            id: RecordId::new(
                Scope::from_credential(b"Bearer alice"),
                op.clone(),
                Key::new(format!("key-{n:016}")).unwrap(),
            ),
            fingerprint: Fingerprint::compute(&op, None, b"", &FieldSelection::Whole),
            status: Status::Completed,
            response: Some(StoredResponse {
                status: 201,
                headers,
                body: vec![b'x'; body],
                trailers: Vec::new(),
            }),
            resource_id: None,
            created_at: Timestamp::from_millis(0),
            lease_until: None,
            fence: Fence::new(1),
            expires_at: Timestamp::from_millis(i64::MAX),
        }
    }

    /// Capacities from one byte to the largest: no panic, and a capacity
    /// too small for the tables keeps nothing.
    #[test]
    fn any_capacity_builds() {
        for capacity in [1, 1024, 4096, usize::MAX] {
            let cache = ReplayCache::new(capacity).unwrap();
            cache.keep(&finished(1, Vec::new(), 10));
            assert!(cache.entries.weight() <= capacity as u64);
        }
        let tiny = ReplayCache::new(1024).unwrap();
        tiny.keep(&finished(2, Vec::new(), 10));
        assert_eq!(tiny.len(), 0);
    }

    /// Many small replays (the common case): what the cache holds on the
    /// heap stays within its capacity.
    #[test]
    fn small_replays_stay_within_the_capacity_in_bytes_held() {
        let capacity = 1 << 20;
        let cache = ReplayCache::new(capacity).unwrap();
        for n in 0..20_000 {
            let headers = vec![
                ("content-type".to_owned(), b"application/json".to_vec()),
                ("location".to_owned(), format!("/orders/{n}").into_bytes()),
            ];
            cache.keep(&finished(n, headers, 48));
        }
        let held = heap_held(&cache);
        assert!(
            held <= capacity,
            "{} entries hold {held} bytes in a cache of {capacity}",
            cache.len()
        );
    }

    /// A response of many short headers: each costs a slot in the header
    /// list and two allocations, whatever its length.
    #[test]
    fn responses_with_many_headers_stay_within_the_capacity_in_bytes_held() {
        let capacity = 1 << 20;
        let cache = ReplayCache::new(capacity).unwrap();
        for n in 0..200 {
            let headers = (0..600).map(|_| ("vary".to_owned(), Vec::new())).collect();
            cache.keep(&finished(n, headers, 0));
        }
        assert!(cache.len() > 0, "such a response is kept");
        let held = heap_held(&cache);
        assert!(
            held <= capacity,
            "{} entries hold {held} bytes in a cache of {capacity}",
            cache.len()
        );
    }
}
