//! The conformance checks of [`Store::extend_lease`], the heartbeat of a
//! long execution: applied only to an in-progress record under the
//! caller's own fence (expired or not), never moving its lease back,
//! raising the record's expiry to at least the new lease end (so an
//! execution that outlives its ttl keeps its key), and changing nothing
//! else.
//!
//! An extension to a time before the current lease end answers
//! [`Settled::Applied`] and leaves the lease where it was: the answer says
//! whether the caller still holds the record, not whether the value moved
//! (as `idem_core::transition::extend_lease` and the memory store do).

use std::time::Duration;

use crate::checks::{acquired, claim_ok};
use crate::fixtures::{LEASE, TTL, request, response, t0, unique_id};
use idem_core::{Claim, Completion, Fence, RecordId, Settled, Status, Store, Timestamp};

/// `extend_lease` that must not fail.
async fn extend<S: Store + ?Sized>(
    store: &S,
    id: &RecordId,
    fence: Fence,
    lease_until: Timestamp,
    now: Timestamp,
) -> Settled {
    store
        .extend_lease(id, fence, lease_until, now)
        .await
        .unwrap_or_else(|e| panic!("extend_lease failed: {e}"))
}

/// Whether `id` is among the stale records at `now` (one page is enough:
/// the store is the check's own).
async fn listed_stale<S: Store + ?Sized>(store: &S, id: &RecordId, now: Timestamp) -> bool {
    let page = store.list_stale(now, None, 100).await.unwrap();
    page.iter().any(|r| &r.id == id)
}

/// An extension moves the lease: a claim after the old end and before the
/// new one is in flight (no takeover), `get` and the stale listing see the
/// new end, a claim at the new end takes over, and the old executor, now
/// fenced out, can extend no more.
pub async fn extend_lease_holds_off_a_takeover<S: Store + ?Sized>(store: &S) {
    let id = unique_id("extend-key-00001");
    let mut req = request(&id, "{}", t0());
    req.lease = Duration::from_secs(10);
    let lease = acquired(claim_ok(store, &req).await);
    let (old_end, new_end) = (
        t0() + Duration::from_secs(10),
        t0() + Duration::from_secs(60),
    );
    assert_eq!(lease.lease_until, old_end);

    let beat = t0() + Duration::from_secs(5);
    assert_eq!(
        extend(store, &id, lease.fence, new_end, beat).await,
        Settled::Applied
    );
    let rec = store
        .get(&id, beat)
        .await
        .unwrap()
        .expect("record after extend");
    assert_eq!(rec.lease_until, Some(new_end), "the lease moved");
    assert_eq!(
        (rec.status, rec.fence, rec.expires_at, rec.created_at),
        (Status::InProgress, lease.fence, lease.expires_at, t0()),
        "nothing but the lease changed"
    );

    let between = t0() + Duration::from_secs(20);
    assert_eq!(
        claim_ok(store, &request(&id, "{}", between)).await,
        Claim::InFlight {
            lease_until: new_end,
            expires_at: lease.expires_at
        },
        "a claim after the old lease end and before the new one is in flight"
    );
    assert!(
        !listed_stale(store, &id, between).await,
        "a record whose lease was extended is not stale before its new end"
    );
    assert!(
        listed_stale(store, &id, new_end).await,
        "it is stale at its new end"
    );
    let rec = store.get(&id, between).await.unwrap().unwrap();
    assert_eq!(
        (rec.fence, rec.lease_until),
        (lease.fence, Some(new_end)),
        "an in-flight answer changes nothing"
    );

    let taker = acquired(claim_ok(store, &request(&id, "{}", new_end)).await);
    assert!(taker.takeover, "a claim at the new lease end takes over");
    assert!(taker.fence > lease.fence);
    assert_eq!(
        extend(store, &id, lease.fence, new_end + LEASE * 10, new_end).await,
        Settled::StaleFence,
        "the executor taken over cannot extend"
    );
}

/// An extension never moves a lease back: to an earlier time, or to the
/// very same one, it answers `Applied` and the lease stays.
pub async fn extend_lease_never_moves_a_lease_back<S: Store + ?Sized>(store: &S) {
    let id = unique_id("extend-key-00002");
    let lease = acquired(claim_ok(store, &request(&id, "{}", t0())).await);
    let end = t0() + LEASE;
    let beat = t0() + Duration::from_secs(1);
    for earlier in [t0() + Duration::from_secs(10), end, t0()] {
        assert_eq!(
            extend(store, &id, lease.fence, earlier, beat).await,
            Settled::Applied,
            "the fence still holds the record (extended to {earlier:?})"
        );
        let rec = store.get(&id, beat).await.unwrap().unwrap();
        assert_eq!(
            rec.lease_until,
            Some(end),
            "the lease did not move back to {earlier:?}"
        );
    }
    // Past the earlier times the lease is still the executor's.
    let later = t0() + Duration::from_secs(20);
    assert_eq!(
        claim_ok(store, &request(&id, "{}", later)).await,
        Claim::InFlight {
            lease_until: end,
            expires_at: lease.expires_at
        }
    );
    // And forward again after that.
    let further = end + LEASE;
    assert_eq!(
        extend(store, &id, lease.fence, further, later).await,
        Settled::Applied
    );
    let rec = store.get(&id, later).await.unwrap().unwrap();
    assert_eq!(rec.lease_until, Some(further));
}

/// A fence that no longer holds the record extends nothing: the executor
/// taken over (the new one's lease stays as the takeover set it, and the
/// new one may extend), a released record (which stays absent), and a
/// fence no one ever held.
pub async fn extend_lease_with_a_stale_fence_changes_nothing<S: Store + ?Sized>(store: &S) {
    let id = unique_id("extend-key-00003");
    let old = acquired(claim_ok(store, &request(&id, "{}", t0())).await);
    let at = t0() + LEASE;
    let new = acquired(claim_ok(store, &request(&id, "{}", at)).await);
    assert!(new.takeover, "a claim after the lease is a takeover");
    let far = at + LEASE * 10;
    assert_eq!(
        extend(store, &id, old.fence, far, at).await,
        Settled::StaleFence
    );
    let rec = store.get(&id, at).await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.fence, rec.lease_until, rec.expires_at),
        (
            Status::InProgress,
            new.fence,
            Some(new.lease_until),
            new.expires_at
        ),
        "a stale extension changes nothing"
    );
    let bogus = Fence::new(u64::MAX - 7);
    assert_eq!(
        extend(store, &id, bogus, far, at).await,
        Settled::StaleFence
    );
    assert_eq!(
        store.get(&id, at).await.unwrap().unwrap().lease_until,
        Some(new.lease_until)
    );
    // The holder of the record may.
    assert_eq!(
        extend(store, &id, new.fence, far, at).await,
        Settled::Applied
    );
    assert_eq!(
        store.get(&id, at).await.unwrap().unwrap().lease_until,
        Some(far)
    );

    // A released record: the extension does not bring it back.
    let gone = unique_id("extend-key-00004");
    let lease = acquired(claim_ok(store, &request(&gone, "{}", t0())).await);
    assert_eq!(
        store.release(&gone, lease.fence, t0()).await.unwrap(),
        Settled::Applied
    );
    assert_eq!(
        extend(store, &gone, lease.fence, far, t0()).await,
        Settled::StaleFence
    );
    assert_eq!(store.get(&gone, t0()).await.unwrap(), None);
    let again = acquired(claim_ok(store, &request(&gone, "{}", t0())).await);
    assert!(!again.takeover, "a released key is claimed afresh");
    assert_eq!(again.lease_until, t0() + LEASE);
}

/// A completed or failed record is final: an extension by the fence that
/// finished it answers `StaleFence`, and the record keeps its status, its
/// response and no lease.
pub async fn extend_lease_on_a_finished_record_changes_nothing<S: Store + ?Sized>(store: &S) {
    for (n, c) in [
        Completion::completed(response(201, "done")).with_resource_id("r_9"),
        Completion::failed(response(422, "refused")),
    ]
    .into_iter()
    .enumerate()
    {
        let id = unique_id(&format!("extend-done-{n:04}"));
        let lease = acquired(claim_ok(store, &request(&id, "{}", t0())).await);
        let status = c.status();
        assert_eq!(
            store
                .complete(&id, lease.fence, c.clone(), t0())
                .await
                .unwrap(),
            Settled::Applied
        );
        let beat = t0() + Duration::from_secs(1);
        assert_eq!(
            extend(store, &id, lease.fence, t0() + LEASE * 10, beat).await,
            Settled::StaleFence,
            "a {status:?} record takes no heartbeat"
        );
        let rec = store.get(&id, beat).await.unwrap().unwrap();
        assert_eq!(rec.status, status);
        assert_eq!(rec.fence, lease.fence);
        assert_eq!(rec.lease_until, None, "a finished record has no lease");
        assert_eq!(rec.response, Some(c.response.clone()));
        assert_eq!(rec.resource_id, c.resource_id);
        assert_eq!(rec.expires_at, lease.expires_at);
        let Claim::Replay(replayed) = claim_ok(store, &request(&id, "{}", beat)).await else {
            panic!("a finished record is replayed after a refused extension");
        };
        assert_eq!(replayed.response, Some(c.response));
    }
}

/// No record, no extension: `StaleFence`, and nothing is created.
pub async fn extend_lease_on_no_record_changes_nothing<S: Store + ?Sized>(store: &S) {
    let id = unique_id("extend-key-00005");
    for fence in [Fence::new(1), Fence::new(u64::MAX - 7)] {
        assert_eq!(
            extend(store, &id, fence, t0() + LEASE, t0()).await,
            Settled::StaleFence
        );
    }
    assert_eq!(
        store.get(&id, t0()).await.unwrap(),
        None,
        "nothing was created"
    );
    let lease = acquired(claim_ok(store, &request(&id, "{}", t0())).await);
    assert!(!lease.takeover);
    assert_eq!(lease.lease_until, t0() + LEASE);
}

/// An expired record still takes its own executor's heartbeat, as it
/// takes its result: nobody else has claimed it. The extension raises its
/// expiry to the new lease end, so it reads as in progress again and a
/// claim is in flight; once that end has passed it is absent, a claim
/// executes afresh (no takeover), and the old fence extends nothing.
pub async fn extend_lease_on_an_expired_record_under_its_fence_applies<S: Store + ?Sized>(
    store: &S,
) {
    let id = unique_id("extend-key-00006");
    let mut req = request(&id, "{}", t0());
    req.lease = Duration::from_secs(10);
    req.ttl = Duration::from_secs(60);
    let lease = acquired(claim_ok(store, &req).await);
    let late = t0() + Duration::from_secs(120);
    let end = t0() + Duration::from_secs(200);
    assert_eq!(store.get(&id, late).await.unwrap(), None, "expired");
    assert_eq!(
        extend(store, &id, lease.fence, end, late).await,
        Settled::Applied
    );
    let rec = store
        .get(&id, late)
        .await
        .unwrap()
        .expect("the extension keeps the record alive until its new lease end");
    assert_eq!(
        (rec.status, rec.fence, rec.lease_until, rec.expires_at),
        (Status::InProgress, lease.fence, Some(end), end)
    );
    assert_eq!(
        claim_ok(store, &request(&id, "{}", late)).await,
        Claim::InFlight {
            lease_until: end,
            expires_at: end
        }
    );

    let after = end + Duration::from_secs(1);
    assert_eq!(store.get(&id, after).await.unwrap(), None, "expired again");
    let fresh = acquired(claim_ok(store, &request(&id, r#"{"b":1}"#, after)).await);
    assert!(
        !fresh.takeover,
        "an expired record is absent, not taken over"
    );
    assert!(fresh.fence > lease.fence);
    assert_eq!(fresh.lease_until, after + LEASE);
    assert_eq!(fresh.expires_at, after + TTL);
    assert_eq!(
        extend(store, &id, lease.fence, end + LEASE * 10, after).await,
        Settled::StaleFence,
        "the expired executor cannot extend the new claim"
    );
    assert_eq!(
        store.get(&id, after).await.unwrap().unwrap().lease_until,
        Some(after + LEASE)
    );
}

/// A heartbeat keeps its record alive past its ttl: an execution that runs
/// longer than the ttl, extending its lease past the record's expiry,
/// still holds the key. Between the old expiry and the new lease end the
/// record reads as in progress, a claim is in flight (not a second
/// execution), and the purge leaves it; the expiry never moves earlier.
pub async fn extend_lease_keeps_the_record_alive_past_its_ttl<S: Store + ?Sized>(store: &S) {
    let id = unique_id("extend-key-00007");
    let mut req = request(&id, "{}", t0());
    req.lease = Duration::from_secs(10);
    req.ttl = Duration::from_secs(60);
    let lease = acquired(claim_ok(store, &req).await);
    let old_expiry = t0() + Duration::from_secs(60);
    assert_eq!(lease.expires_at, old_expiry);

    // Heartbeats inside the ttl leave the expiry alone.
    let beat = t0() + Duration::from_secs(5);
    let inside = t0() + Duration::from_secs(40);
    assert_eq!(
        extend(store, &id, lease.fence, inside, beat).await,
        Settled::Applied
    );
    let rec = store.get(&id, beat).await.unwrap().unwrap();
    assert_eq!(
        (rec.lease_until, rec.expires_at),
        (Some(inside), old_expiry)
    );

    // A heartbeat past the ttl raises it to the new lease end.
    let beat = t0() + Duration::from_secs(35);
    let new_end = t0() + Duration::from_secs(120);
    assert_eq!(
        extend(store, &id, lease.fence, new_end, beat).await,
        Settled::Applied
    );
    let between = t0() + Duration::from_secs(90);
    let rec = store
        .get(&id, between)
        .await
        .unwrap()
        .expect("alive between the old expiry and the new lease end");
    assert_eq!(
        (rec.status, rec.fence, rec.lease_until, rec.expires_at),
        (Status::InProgress, lease.fence, Some(new_end), new_end)
    );
    assert_eq!(
        claim_ok(store, &request(&id, "{}", between)).await,
        Claim::InFlight {
            lease_until: new_end,
            expires_at: new_end
        },
        "a claim while the long execution runs is in flight, not a second execution"
    );
    assert_eq!(
        store.purge_expired(between, 100).await.unwrap(),
        0,
        "the purge leaves a record whose expiry the heartbeat raised"
    );
    assert!(
        store.get(&id, between).await.unwrap().is_some(),
        "still there after the purge"
    );

    // An earlier extension lowers neither the lease nor the expiry.
    assert_eq!(
        extend(store, &id, lease.fence, old_expiry, between).await,
        Settled::Applied
    );
    let rec = store.get(&id, between).await.unwrap().unwrap();
    assert_eq!((rec.lease_until, rec.expires_at), (Some(new_end), new_end));

    // The result still lands, and lives until the raised expiry.
    assert_eq!(
        store
            .complete(
                &id,
                lease.fence,
                Completion::completed(response(201, "done")),
                between
            )
            .await
            .unwrap(),
        Settled::Applied
    );
    let rec = store.get(&id, between).await.unwrap().unwrap();
    assert_eq!((rec.status, rec.expires_at), (Status::Completed, new_end));
}
