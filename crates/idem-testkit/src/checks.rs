//! The individual conformance checks. Each takes a store of its own.

use std::sync::Arc;
use std::time::Duration;

use crate::fixtures::{LEASE, TTL, request, response, t0, unique_id};
use idem_core::{Claim, Completion, Fence, Lease, Settled, Status, Store};

pub(crate) fn acquired(claim: Claim) -> Lease {
    match claim {
        Claim::Acquired(lease) => lease,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

pub(crate) async fn claim_ok<S: Store + ?Sized>(store: &S, req: &idem_core::ClaimRequest) -> Claim {
    store
        .claim(req)
        .await
        .unwrap_or_else(|e| panic!("claim failed: {e}"))
}

/// Absent → `in_progress` with a fence, lease and expiry set from `now`.
pub async fn claim_absent_acquires<S: Store + ?Sized>(store: &S) {
    let id = unique_id("absent-key-0001");
    let req = request(&id, r#"{"a":1}"#, t0());
    let lease = acquired(claim_ok(store, &req).await);
    assert!(!lease.takeover);
    assert!(lease.fence.get() > 0);
    assert_eq!(lease.lease_until, t0() + LEASE);
    assert_eq!(lease.expires_at, t0() + TTL);
    let rec = store
        .get(&id, t0())
        .await
        .unwrap()
        .expect("record after claim");
    assert_eq!(rec.status, Status::InProgress);
    assert_eq!(rec.fence, lease.fence);
    assert_eq!(rec.fingerprint, req.fingerprint);
    assert_eq!(rec.lease_until, Some(t0() + LEASE));
    assert_eq!(rec.expires_at, t0() + TTL);
    assert_eq!(rec.created_at, t0());
    assert_eq!(rec.response, None);
    let other = unique_id("absent-key-0001");
    assert_eq!(
        store.get(&other, t0()).await.unwrap(),
        None,
        "scopes are separate"
    );
}

/// `in_progress`, lease live, same fingerprint → `InFlight`.
pub async fn duplicate_claim_is_in_flight<S: Store + ?Sized>(store: &S) {
    let id = unique_id("in-flight-key-01");
    let req = request(&id, r#"{"a":1}"#, t0());
    let lease = acquired(claim_ok(store, &req).await);
    let later = request(&id, r#"{"a":1}"#, t0() + LEASE - Duration::from_millis(1));
    assert_eq!(
        claim_ok(store, &later).await,
        Claim::InFlight {
            lease_until: lease.lease_until,
            expires_at: lease.expires_at
        }
    );
    let rec = store.get(&id, later.now).await.unwrap().unwrap();
    assert_eq!(
        rec.fence, lease.fence,
        "an in-flight answer changes nothing"
    );
}

/// A live record with another fingerprint answers `Mismatch`, whatever its
/// state: in progress (lease live or not), completed, failed.
pub async fn other_fingerprint_is_a_mismatch_in_every_state<S: Store + ?Sized>(store: &S) {
    for (n, finish) in [None, Some(false), Some(true)].into_iter().enumerate() {
        let id = unique_id(&format!("mismatch-key-{n:04}"));
        let lease = acquired(claim_ok(store, &request(&id, r#"{"a":1}"#, t0())).await);
        match finish {
            None => {}
            Some(failed) => {
                let c = if failed {
                    Completion::failed(response(422, "f"))
                } else {
                    Completion::completed(response(201, "c"))
                };
                assert_eq!(
                    store.complete(&id, lease.fence, c, t0()).await.unwrap(),
                    Settled::Applied
                );
            }
        }
        let other = request(&id, r#"{"a":2}"#, t0() + Duration::from_secs(1));
        assert_eq!(
            claim_ok(store, &other).await,
            Claim::Mismatch {
                expires_at: lease.expires_at
            },
            "state {finish:?}"
        );
        // Past the lease but before expiry, a mismatch is still a mismatch
        // (never a takeover with other parameters).
        let late = request(&id, r#"{"a":2}"#, t0() + LEASE + Duration::from_secs(1));
        assert!(matches!(
            claim_ok(store, &late).await,
            Claim::Mismatch { .. }
        ));
        let rec = store.get(&id, late.now).await.unwrap().unwrap();
        assert_eq!(rec.fence, lease.fence, "a mismatch changes nothing");
    }
}

/// `completed` → the stored response, resource id and status are replayed.
pub async fn completed_is_replayed<S: Store + ?Sized>(store: &S) {
    let id = unique_id("completed-key-01");
    let req = request(&id, r#"{"a":1}"#, t0());
    let lease = acquired(claim_ok(store, &req).await);
    let done = Completion::completed(response(201, "created")).with_resource_id("tr_42");
    assert_eq!(
        store.complete(&id, lease.fence, done, t0()).await.unwrap(),
        Settled::Applied
    );
    let again = request(&id, r#"{"a":1}"#, t0() + Duration::from_secs(5));
    let Claim::Replay(rec) = claim_ok(store, &again).await else {
        panic!("expected a replay");
    };
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.response, Some(response(201, "created")));
    assert_eq!(rec.resource_id.as_deref(), Some("tr_42"));
    assert_eq!(rec.fence, lease.fence);
    assert_eq!(rec.lease_until, None);
    assert_eq!(rec.expires_at, t0() + TTL);
    // Replays go on after the lease would have run out.
    let late = request(&id, r#"{"a":1}"#, t0() + LEASE * 3);
    assert!(matches!(claim_ok(store, &late).await, Claim::Replay(_)));
}

/// `failed` is replayed like a success.
pub async fn failed_is_replayed<S: Store + ?Sized>(store: &S) {
    let id = unique_id("failed-key-00001");
    let lease = acquired(claim_ok(store, &request(&id, "{}", t0())).await);
    let f = Completion::failed(response(422, "insufficient funds"));
    assert_eq!(
        store.complete(&id, lease.fence, f, t0()).await.unwrap(),
        Settled::Applied
    );
    let Claim::Replay(rec) = claim_ok(store, &request(&id, "{}", t0())).await else {
        panic!("expected a replay");
    };
    assert_eq!(rec.status, Status::Failed);
    assert_eq!(rec.response, Some(response(422, "insufficient funds")));
}

/// release → absent; the next claim executes with a larger fence.
pub async fn release_lets_the_next_claim_execute<S: Store + ?Sized>(store: &S) {
    let id = unique_id("release-key-0001");
    let first = acquired(claim_ok(store, &request(&id, "{}", t0())).await);
    assert_eq!(
        store.release(&id, first.fence, t0()).await.unwrap(),
        Settled::Applied
    );
    assert_eq!(store.get(&id, t0()).await.unwrap(), None);
    // After a release even other parameters may use the key: nothing is live.
    let second = acquired(claim_ok(store, &request(&id, r#"{"b":2}"#, t0())).await);
    assert!(second.fence > first.fence, "fences grow across releases");
    assert!(!second.takeover);
    assert_eq!(
        store
            .complete(
                &id,
                first.fence,
                Completion::completed(response(200, "old")),
                t0()
            )
            .await
            .unwrap(),
        Settled::StaleFence,
        "the released executor cannot complete the new claim"
    );
}

/// `in_progress`, lease expired → takeover with a larger fence; the old
/// executor can neither complete nor release.
pub async fn lease_takeover_fences_out_the_old_executor<S: Store + ?Sized>(store: &S) {
    let id = unique_id("takeover-key-001");
    let old = acquired(claim_ok(store, &request(&id, "{}", t0())).await);
    let at = t0() + LEASE;
    let new = acquired(claim_ok(store, &request(&id, "{}", at)).await);
    assert!(new.takeover, "a claim after the lease is a takeover");
    assert!(new.fence > old.fence);
    assert_eq!(new.lease_until, at + LEASE);
    assert_eq!(new.expires_at, at + TTL);
    let stale = Completion::completed(response(200, "old"));
    assert_eq!(
        store.complete(&id, old.fence, stale, at).await.unwrap(),
        Settled::StaleFence
    );
    assert_eq!(
        store.release(&id, old.fence, at).await.unwrap(),
        Settled::StaleFence
    );
    let rec = store.get(&id, at).await.unwrap().unwrap();
    assert_eq!((rec.status, rec.fence), (Status::InProgress, new.fence));
    let fresh = Completion::completed(response(200, "new"));
    assert_eq!(
        store.complete(&id, new.fence, fresh, at).await.unwrap(),
        Settled::Applied
    );
    let Claim::Replay(rec) = claim_ok(store, &request(&id, "{}", at)).await else {
        panic!("expected a replay");
    };
    assert_eq!(rec.response, Some(response(200, "new")));
}

/// Complete and release with a fence that is not current change nothing:
/// a made-up fence, a second completion, a release after completion, and
/// anything on an absent record.
pub async fn stale_fences_change_nothing<S: Store + ?Sized>(store: &S) {
    let id = unique_id("stale-fence-0001");
    let bogus = Fence::new(u64::MAX - 7);
    let c = || Completion::completed(response(200, "x"));
    assert_eq!(
        store.complete(&id, bogus, c(), t0()).await.unwrap(),
        Settled::StaleFence
    );
    assert_eq!(
        store.release(&id, bogus, t0()).await.unwrap(),
        Settled::StaleFence
    );
    assert_eq!(
        store.get(&id, t0()).await.unwrap(),
        None,
        "nothing was created"
    );

    let lease = acquired(claim_ok(store, &request(&id, "{}", t0())).await);
    assert_eq!(
        store.complete(&id, bogus, c(), t0()).await.unwrap(),
        Settled::StaleFence
    );
    assert_eq!(
        store.release(&id, bogus, t0()).await.unwrap(),
        Settled::StaleFence
    );
    assert_eq!(
        store.complete(&id, lease.fence, c(), t0()).await.unwrap(),
        Settled::Applied
    );
    let second = Completion::failed(response(400, "overwrite"));
    assert_eq!(
        store
            .complete(&id, lease.fence, second, t0())
            .await
            .unwrap(),
        Settled::StaleFence,
        "a finished record is final"
    );
    assert_eq!(
        store.release(&id, lease.fence, t0()).await.unwrap(),
        Settled::StaleFence
    );
    let rec = store.get(&id, t0()).await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.response, Some(response(200, "x")));
}

/// After `expires_at` a record is gone for every purpose: `get` answers
/// `None` and a claim executes again, with any parameters.
pub async fn expired_records_execute_again<S: Store + ?Sized>(store: &S) {
    let id = unique_id("expiry-key-00001");
    let lease = acquired(claim_ok(store, &request(&id, r#"{"a":1}"#, t0())).await);
    let c = Completion::completed(response(201, "first"));
    assert_eq!(
        store.complete(&id, lease.fence, c, t0()).await.unwrap(),
        Settled::Applied
    );
    let just_before = t0() + TTL - Duration::from_millis(1);
    assert!(store.get(&id, just_before).await.unwrap().is_some());
    assert!(matches!(
        claim_ok(store, &request(&id, r#"{"a":1}"#, just_before)).await,
        Claim::Replay(_)
    ));
    let expiry = t0() + TTL;
    assert_eq!(store.get(&id, expiry).await.unwrap(), None);
    let again = acquired(claim_ok(store, &request(&id, r#"{"a":9}"#, expiry)).await);
    assert!(again.fence > lease.fence);
    assert!(
        !again.takeover,
        "an expired record is absent, not taken over"
    );
    assert_eq!(again.expires_at, expiry + TTL);

    // An in-progress record that expires is also claimable afresh.
    let id2 = unique_id("expiry-key-00002");
    acquired(claim_ok(store, &request(&id2, "{}", t0())).await);
    let after = acquired(claim_ok(store, &request(&id2, r#"{"z":0}"#, t0() + TTL)).await);
    assert!(!after.takeover);
}

/// Purge deletes expired records only, at most `limit` per call.
pub async fn purge_deletes_only_expired_in_bounded_batches<S: Store + ?Sized>(store: &S) {
    let short = Duration::from_secs(60);
    let mut expired_ids = Vec::new();
    for i in 0..25 {
        let id = unique_id(&format!("purge-key-{i:06}"));
        let mut req = request(&id, "{}", t0());
        req.ttl = short;
        req.lease = Duration::from_secs(10);
        let lease = acquired(claim_ok(store, &req).await);
        if i % 2 == 0 {
            let c = Completion::completed(response(200, "p"));
            let _ = store.complete(&id, lease.fence, c, t0()).await.unwrap();
        }
        expired_ids.push(id);
    }
    let live = unique_id("purge-live-00001");
    acquired(claim_ok(store, &request(&live, "{}", t0())).await);

    let now = t0() + short;
    assert_eq!(store.purge_expired(now, 10).await.unwrap(), 10);
    assert_eq!(store.purge_expired(now, 10).await.unwrap(), 10);
    assert_eq!(store.purge_expired(now, 10).await.unwrap(), 5);
    assert_eq!(store.purge_expired(now, 10).await.unwrap(), 0);
    assert!(
        store.get(&live, now).await.unwrap().is_some(),
        "live records stay"
    );
    // The purged keys are absent: a claim is a fresh acquisition.
    let lease = acquired(claim_ok(store, &request(&expired_ids[0], "{}", now)).await);
    assert!(!lease.takeover);
    // Nothing is purged before its time.
    assert_eq!(store.purge_expired(t0(), 100).await.unwrap(), 0);
}

/// `tasks` concurrent claims of one key: exactly one `Acquired`, all others
/// `InFlight`.
pub async fn race_one_key<S: Store>(store: Arc<S>, tasks: usize) {
    race_one_key_across(&[store], tasks).await;
}

/// As [`race_one_key`], the tasks spread round-robin over several handles
/// on one backend (as several instances would hold).
pub async fn race_one_key_across<S: Store>(stores: &[Arc<S>], tasks: usize) {
    assert!(!stores.is_empty(), "race needs a store");
    let id = unique_id("race-key-0000001");
    let barrier = Arc::new(tokio::sync::Barrier::new(tasks));
    let mut handles = Vec::with_capacity(tasks);
    for i in 0..tasks {
        let (store, barrier, id) = (
            stores[i % stores.len()].clone(),
            barrier.clone(),
            id.clone(),
        );
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            store.claim(&request(&id, r#"{"race":true}"#, t0())).await
        }));
    }
    let (mut acquired_n, mut in_flight) = (0, 0);
    for h in handles {
        match h.await.expect("task panicked").expect("claim failed") {
            Claim::Acquired(_) => acquired_n += 1,
            Claim::InFlight { .. } => in_flight += 1,
            other => panic!("unexpected answer in race: {other:?}"),
        }
    }
    assert_eq!(acquired_n, 1, "exactly one executor");
    assert_eq!(in_flight, tasks - 1);
}

/// Stale records (in progress, lease over, not expired) are listed in
/// pages, oldest lease first, each once; finished, live-lease and expired
/// records are not.
pub async fn stale_records_are_listed_in_pages<S: Store + ?Sized>(store: &S) {
    use idem_core::StaleCursor;
    let mut stale_ids = Vec::new();
    for i in 0..5u64 {
        let id = unique_id(&format!("stale-key-{i:06}"));
        // Claimed at t0 + i seconds, so leases end in that order.
        let mut req = request(&id, "{}", t0() + Duration::from_secs(i));
        req.lease = Duration::from_secs(10);
        acquired(claim_ok(store, &req).await);
        stale_ids.push(id);
    }
    let done = unique_id("stale-done-00001");
    let lease = acquired(claim_ok(store, &request(&done, "{}", t0())).await);
    let _ = store
        .complete(
            &done,
            lease.fence,
            Completion::completed(response(200, "d")),
            t0(),
        )
        .await
        .unwrap();
    let later = t0() + Duration::from_secs(100);
    let live = unique_id("stale-live-00001");
    acquired(claim_ok(store, &request(&live, "{}", later)).await);
    let expired = unique_id("stale-expired-01");
    let mut req = request(&expired, "{}", t0());
    req.ttl = Duration::from_secs(50);
    req.lease = Duration::from_secs(10);
    acquired(claim_ok(store, &req).await);

    let mut seen = Vec::new();
    let mut cursor: Option<StaleCursor> = None;
    loop {
        let page = store.list_stale(later, cursor.as_ref(), 2).await.unwrap();
        assert!(page.len() <= 2, "pages are bounded");
        let Some(last) = page.last() else { break };
        cursor = Some(StaleCursor::after(last));
        for r in &page {
            assert_eq!(r.status, Status::InProgress);
            assert!(r.response.is_none());
        }
        seen.extend(page.into_iter().map(|r| r.id));
    }
    assert_eq!(
        seen, stale_ids,
        "each stale record once, oldest lease first"
    );
    // Before the leases end, nothing is stale.
    assert!(
        store
            .list_stale(t0() + Duration::from_secs(1), None, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// [`Store::find_by_key`] answers the live records of one scope and key,
/// whatever their operation, newest first (ties by operation, descending),
/// at most `limit`; never another scope's or another key's records, nor
/// released or expired ones.
pub async fn records_are_found_by_scope_and_key<S: Store + ?Sized>(store: &S) {
    use idem_core::{Key, Operation, RecordId};
    let base = unique_id("find-by-key-0001");
    let (scope, key) = (base.scope.clone(), base.key.clone());
    let on = |method: &str, route: &str| {
        RecordId::new(scope.clone(), Operation::new(method, route), key.clone())
    };
    let claim_at = |id: &RecordId, at: Duration, ttl: Duration| {
        let mut req = request(id, "{}", t0() + at);
        req.ttl = ttl;
        req
    };

    // Oldest: completed at t0.
    let done = on("POST", "/testkit");
    let lease = acquired(claim_ok(store, &claim_at(&done, Duration::ZERO, TTL)).await);
    let c = Completion::completed(response(201, "found")).with_resource_id("r_1");
    assert_eq!(
        store.complete(&done, lease.fence, c, t0()).await.unwrap(),
        Settled::Applied
    );
    // Two in progress, claimed in the same millisecond at t0 + 1 s.
    let tie_low = on("POST", "/testkit/tie");
    let tie_high = on("PUT", "/testkit/tie");
    acquired(claim_ok(store, &claim_at(&tie_low, Duration::from_secs(1), TTL)).await);
    acquired(claim_ok(store, &claim_at(&tie_high, Duration::from_secs(1), TTL)).await);
    // Newest, but released.
    let released = on("PATCH", "/testkit/released");
    let lease = acquired(claim_ok(store, &claim_at(&released, Duration::from_secs(3), TTL)).await);
    assert_eq!(
        store.release(&released, lease.fence, t0()).await.unwrap(),
        Settled::Applied
    );
    // Newer still, but expires at t0 + 12 s.
    let expiring = on("DELETE", "/testkit/expiring");
    acquired(
        claim_ok(
            store,
            &claim_at(&expiring, Duration::from_secs(2), Duration::from_secs(10)),
        )
        .await,
    );
    // The same key in another scope, and another key in this scope.
    let other_scope = unique_id(key.as_str());
    assert_ne!(other_scope.scope, scope);
    acquired(claim_ok(store, &claim_at(&other_scope, Duration::from_secs(4), TTL)).await);
    let other_key = RecordId::new(
        scope.clone(),
        Operation::new("POST", "/testkit"),
        Key::new("find-by-key-0002").unwrap(),
    );
    acquired(claim_ok(store, &claim_at(&other_key, Duration::from_secs(4), TTL)).await);

    fn ids(records: &[idem_core::Record]) -> Vec<&RecordId> {
        records.iter().map(|r| &r.id).collect()
    }

    // Before the expiry: the expiring record is the newest.
    let before = t0() + Duration::from_secs(11);
    let found = store.find_by_key(&scope, &key, before, 10).await.unwrap();
    assert_eq!(
        ids(&found),
        [&expiring, &tie_high, &tie_low, &done],
        "newest first, ties by operation descending; released records are gone"
    );

    // At the expiry it is gone too.
    let after = t0() + Duration::from_secs(12);
    let found = store.find_by_key(&scope, &key, after, 10).await.unwrap();
    assert_eq!(
        ids(&found),
        [&tie_high, &tie_low, &done],
        "expired records are not found"
    );
    // The records are whole.
    let last = &found[2];
    assert_eq!(last.status, Status::Completed);
    assert_eq!(last.response, Some(response(201, "found")));
    assert_eq!(last.resource_id.as_deref(), Some("r_1"));
    assert_eq!(last.created_at, t0());
    assert_eq!(last.expires_at, t0() + TTL);
    assert_eq!(Some(last), store.get(&done, after).await.unwrap().as_ref());
    assert_eq!(found[0].status, Status::InProgress);
    assert_eq!(found[0].created_at, t0() + Duration::from_secs(1));
    assert_eq!(
        found[0].lease_until,
        Some(t0() + Duration::from_secs(1) + LEASE)
    );

    // The limit is respected, keeping the newest.
    let found = store.find_by_key(&scope, &key, after, 2).await.unwrap();
    assert_eq!(ids(&found), [&tie_high, &tie_low]);
    let found = store.find_by_key(&scope, &key, after, 1).await.unwrap();
    assert_eq!(ids(&found), [&tie_high]);
    assert!(
        store
            .find_by_key(&scope, &key, after, 0)
            .await
            .unwrap()
            .is_empty()
    );

    // Other scopes and keys see only their own.
    let found = store
        .find_by_key(&other_scope.scope, &key, after, 10)
        .await
        .unwrap();
    assert_eq!(ids(&found), [&other_scope]);
    let found = store
        .find_by_key(&scope, &other_key.key, after, 10)
        .await
        .unwrap();
    assert_eq!(ids(&found), [&other_key]);
    let nobody = idem_core::Scope::from_raw(format!("{}-nobody", scope.as_str()));
    assert!(
        store
            .find_by_key(&nobody, &key, after, 10)
            .await
            .unwrap()
            .is_empty()
    );

    // A released key claimed again is found again, once.
    acquired(claim_ok(store, &claim_at(&released, Duration::from_secs(20), TTL)).await);
    let at = t0() + Duration::from_secs(20);
    let found = store.find_by_key(&scope, &key, at, 10).await.unwrap();
    assert_eq!(ids(&found), [&released, &tie_high, &tie_low, &done]);
}

/// The store's epoch (`idem_core::EpochWatch`): written once per place
/// from the first candidate, advanced by one per call, atomically under
/// concurrent callers, and untouched by a purge far past every expiry.
pub async fn epoch_is_written_once_and_advances<S: Store + ?Sized>(store: &S) {
    let first = store.advance_epoch("epoch-candidate-1").await.unwrap();
    assert!(!first.is_empty(), "every store keeps an epoch");
    for mark in &first {
        assert!(mark.created, "a fresh store has no epoch: {mark:?}");
        assert_eq!(mark.epoch, "epoch-candidate-1");
        assert_eq!(mark.counter, 1);
    }
    let places = |marks: &[idem_core::EpochMark]| {
        let mut p: Vec<String> = marks.iter().map(|m| m.place.clone()).collect();
        p.sort();
        p
    };
    let second = store.advance_epoch("epoch-candidate-2").await.unwrap();
    assert_eq!(places(&second), places(&first));
    for mark in &second {
        assert!(!mark.created, "the epoch is written once: {mark:?}");
        assert_eq!(mark.epoch, "epoch-candidate-1", "the first candidate stays");
        assert_eq!(mark.counter, 2);
    }
    // Concurrent advances: each gets a counter of its own, per place.
    let mut counters = std::collections::HashMap::<String, Vec<u64>>::new();
    let calls = (0..16).map(|i| async move { store.advance_epoch(&format!("c-{i}")).await });
    for marks in futures_util::future::join_all(calls).await {
        for mark in marks.unwrap() {
            assert_eq!(mark.epoch, "epoch-candidate-1");
            counters.entry(mark.place).or_default().push(mark.counter);
        }
    }
    for (place, mut seen) in counters {
        seen.sort_unstable();
        assert_eq!(seen, (3..19).collect::<Vec<_>>(), "at {place}");
    }
    // No purge deletes it, however late.
    let far = t0() + Duration::from_secs(100 * 365 * 86_400);
    store.purge_expired(far, 1000).await.unwrap();
    for mark in store.advance_epoch("epoch-candidate-3").await.unwrap() {
        assert_eq!(
            (mark.epoch.as_str(), mark.counter, mark.created),
            ("epoch-candidate-1", 19, false)
        );
    }
}
