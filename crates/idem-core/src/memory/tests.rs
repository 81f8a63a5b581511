//! MemoryStore's own behaviour beyond the conformance suite.

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

/// Buckets follow claims, releases and purges: one per (scope, key)
/// with records, none left behind.
#[test]
fn buckets_keep_in_step_with_the_records() {
    use crate::{Claim, Settled, Store};

    let counts = |store: &MemoryStore| -> (usize, usize) {
        (0..super::SHARDS)
            .map(|i| {
                let shard = store.lock(i);
                (shard.buckets.len(), shard.records().count())
            })
            .fold((0, 0), |(b, r), (sb, sr)| (b + sb, r + sr))
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
        assert_eq!(counts(&store), (1, 2), "one bucket for one (scope, key)");
        // A takeover overwrites a record: still one entry for it.
        let later = t0() + Duration::from_secs(31);
        assert!(matches!(
            store.claim(&request(&a, "{}", later)).await.unwrap(),
            Claim::Acquired(_)
        ));
        assert_eq!(counts(&store), (1, 2));
        assert_eq!(
            store.release(&a, la.fence, later).await.unwrap(),
            Settled::StaleFence
        );
        assert_eq!(counts(&store), (1, 2), "a stale release changes nothing");
        let rec = store.get(&a, later).await.unwrap().unwrap();
        assert_eq!(
            store.release(&a, rec.fence, later).await.unwrap(),
            Settled::Applied
        );
        assert_eq!(counts(&store), (1, 1));
        let after = t0() + Duration::from_secs(60);
        assert_eq!(store.purge_expired(after, 10).await.unwrap(), 1);
        assert_eq!(counts(&store), (0, 0));
    });
}

fn claimed(id: &RecordId, at: Timestamp) -> crate::Record {
    let step = crate::transition::claim(None, &request(id, "{}", at), || {
        crate::record::Fence::new(1)
    });
    assert!(matches!(step.claim, crate::Claim::Acquired(_)));
    step.write.unwrap()
}

/// Two (scope, key)s whose hashes collide keep buckets of their own:
/// a bucket is found by its scope and key, not by the hash alone.
#[test]
fn colliding_hashes_keep_their_records_apart() {
    use super::{KeyHash, Shard};

    let a = unique_id("collide-key-0001");
    let b = RecordId::new(
        Scope::from_raw("another-scope"),
        a.operation.clone(),
        a.key.clone(),
    );
    let same = KeyHash(42);
    let mut shard = Shard::default();
    shard.put(same, claimed(&a, t0()));
    shard.put(same, claimed(&b, t0()));
    shard.put(same, claimed(&a, t0())); // overwrites, does not add
    assert_eq!(shard.buckets.len(), 2);
    assert_eq!(shard.records().count(), 2);
    assert_eq!(shard.get(same, &a).map(|r| &r.id), Some(&a));
    assert_eq!(shard.get(same, &b).map(|r| &r.id), Some(&b));
    shard.remove(same, &a);
    assert!(shard.get(same, &a).is_none());
    assert_eq!(shard.get(same, &b).map(|r| &r.id), Some(&b));
    shard.remove(same, &b);
    assert!(shard.buckets.is_empty());
}

/// Even when another scope's records sit under the same hash, looking
/// a key up by (scope, key) returns only that scope's records.
#[test]
fn find_by_key_never_returns_a_colliding_scope() {
    use crate::Store;

    let store = MemoryStore::new();
    let a = unique_id("collide-key-0001");
    let b = RecordId::new(
        Scope::from_raw("another-scope"),
        a.operation.clone(),
        a.key.clone(),
    );
    let hash = store.hash(&a.scope, &a.key);
    for id in [&a, &b] {
        // b forced under a's hash.
        store.lock(hash.shard()).put(hash, claimed(id, t0()));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let found = rt
        .block_on(store.find_by_key(&a.scope, &a.key, t0(), 10))
        .unwrap();
    assert_eq!(found.iter().map(|r| &r.id).collect::<Vec<_>>(), vec![&a]);
    assert_eq!(
        rt.block_on(store.get(&a, t0())).unwrap().map(|r| r.id),
        Some(a)
    );
}

/// Many operations under one key (more than a bucket's list holds):
/// each is its own record in one bucket, and a purge stops at its limit
/// inside it.
#[test]
fn many_operations_on_one_key_purge_within_the_limit() {
    use crate::Store;

    let store = MemoryStore::new();
    let a = unique_id("many-ops-key-001");
    let ids: Vec<RecordId> = (0..(super::FEW + 4))
        .map(|i| {
            RecordId::new(
                a.scope.clone(),
                Operation::new("POST", &format!("/op/{i}")),
                a.key.clone(),
            )
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for id in &ids {
        let mut req = request(id, "{}", t0());
        req.ttl = Duration::from_secs(60);
        assert!(matches!(
            rt.block_on(store.claim(&req)).unwrap(),
            crate::Claim::Acquired(_)
        ));
    }
    assert_eq!(store.len(), super::FEW + 4);
    for id in &ids {
        let found = rt.block_on(store.get(id, t0())).unwrap();
        assert_eq!(found.map(|r| r.id), Some(id.clone()));
    }
    let hash = store.hash(&a.scope, &a.key);
    assert_eq!(store.lock(hash.shard()).buckets.len(), 1);
    let later = t0() + Duration::from_secs(61);
    assert_eq!(rt.block_on(store.purge_expired(later, 2)).unwrap(), 2);
    assert_eq!(store.len(), super::FEW + 2);
    assert_eq!(
        rt.block_on(store.purge_expired(later, 100)).unwrap(),
        super::FEW + 2
    );
    assert!(store.is_empty());
    assert!(store.lock(hash.shard()).buckets.is_empty());
}

/// A bucket's records behave as a map by operation on either side of
/// the list's limit: put, overwrite, remove and purge, against a model.
mod records_against_a_map {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::super::{FEW, Records};
    use super::{claimed, t0, unique_id};
    use crate::{Operation, RecordId};

    #[derive(Debug, Clone)]
    enum Step {
        Put(u8, u8),
        Remove(u8),
        Retain(u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        // Up to three times the list's limit of operations.
        let op = 0..(3 * FEW as u8);
        prop_oneof![
            4 => (op.clone(), any::<u8>()).prop_map(|(o, v)| Step::Put(o, v)),
            2 => op.prop_map(Step::Remove),
            1 => any::<u8>().prop_map(Step::Retain),
        ]
    }

    fn id(op: u8) -> RecordId {
        let base = unique_id("records-model-01");
        RecordId::new(
            base.scope,
            Operation::new("POST", &format!("/op/{op}")),
            base.key,
        )
    }

    proptest! {
        #[test]
        fn behave_as_a_map(steps in proptest::collection::vec(step(), 1..80)) {
            // The model: operation -> the fence its record was put with.
            let mut model: BTreeMap<u8, u64> = BTreeMap::new();
            let mut records: Option<Records> = None;
            for s in steps {
                match s {
                    Step::Put(op, v) => {
                        let mut r = claimed(&id(op), t0());
                        r.fence = crate::record::Fence::new(u64::from(v) + 1);
                        match records.as_mut() {
                            Some(rs) => rs.put(r),
                            None => records = Some(Records::one(r)),
                        }
                        model.insert(op, u64::from(v) + 1);
                    }
                    Step::Remove(op) => {
                        if let Some(rs) = records.as_mut() {
                            rs.remove(&id(op).operation);
                        }
                        model.remove(&op);
                    }
                    Step::Retain(m) => {
                        let keep = |fence: u64| fence % 3 != u64::from(m) % 3;
                        if let Some(rs) = records.as_mut() {
                            rs.retain(|r| keep(r.fence.get()));
                        }
                        model.retain(|_, f| keep(*f));
                    }
                }
                let Some(rs) = records.as_mut() else { continue };
                prop_assert_eq!(rs.is_empty(), model.is_empty());
                prop_assert_eq!(rs.iter().count(), model.len());
                prop_assert_eq!(rs.first().is_some(), !model.is_empty());
                for op in 0..(3 * FEW as u8) {
                    let expected = model.get(&op).copied();
                    let operation = id(op).operation;
                    prop_assert_eq!(rs.get(&operation).map(|r| r.fence.get()), expected);
                    prop_assert_eq!(rs.get_mut(&operation).map(|r| r.fence.get()), expected);
                }
                if rs.is_empty() {
                    records = None;
                }
            }
        }
    }
}
