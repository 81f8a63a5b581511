//! Settling: the answer stored with the record, or the key released (a
//! transient failure) or held (an unknown outcome) until its lease ends;
//! each store call retried a few times, and the execution's end counted.

use std::time::Duration;

use http::Response;
use idem_core::{Completion, Lease, RecordId, Settled, Timestamp};

use crate::body::Body;
use crate::metrics::{Outcome, StoreOp};
use crate::rejection::Rejection;
use crate::replay::set_expires;
use crate::shared::{Shared, store_call};

pub(super) fn finish(shared: &Shared, id: &RecordId, token: u64, outcome: Outcome) {
    shared.waiters.wake(id);
    shared.in_progress.end(token, &shared.meters);
    shared.meters.count(outcome);
}

/// Leaves the claim held until its lease ends (the outcome is unknown) and
/// answers with `rejection`.
pub(super) fn hold(
    shared: &Shared,
    id: &RecordId,
    lease: Lease,
    token: u64,
    rejection: Rejection,
) -> Response<Body> {
    finish(shared, id, token, Outcome::Held);
    let mut response = rejection.into_response();
    set_expires(response.headers_mut(), lease.expires_at);
    response
}

/// Releases the claim of an execution that produced no storable result,
/// and wakes its waiters.
pub(super) async fn settle_release(shared: &Shared, id: &RecordId, lease: Lease, token: u64) {
    release(shared, id, lease).await;
    finish(shared, id, token, Outcome::Released);
}

/// As [`settle_release`], answering with `rejection`.
pub(super) async fn abandon(
    shared: &Shared,
    id: &RecordId,
    lease: Lease,
    token: u64,
    rejection: Rejection,
) -> Response<Body> {
    settle_release(shared, id, lease, token).await;
    let mut response = rejection.into_response();
    set_expires(response.headers_mut(), lease.expires_at);
    response
}

/// Attempts at a completion or release before giving up: a store blip
/// must not turn a finished execution into a duplicate.
pub(super) const SETTLE_ATTEMPTS: u32 = 3;

/// Stores the result. A store that fails is retried (100 ms doubling to
/// 1 s) for as long as the lease runs, so the record is durable before the
/// response leaves whenever the store comes back in time; the answer waits
/// for it. If the lease ends first, the client still gets the response (the
/// effect happened, and a client with its answer has no reason to retry),
/// and the record stays in progress until recovery.
pub(super) async fn complete(
    shared: &Shared,
    id: &RecordId,
    lease: Lease,
    completion: Completion,
) -> Outcome {
    let mut backoff = Duration::from_millis(100);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match store_call(
            shared,
            StoreOp::Complete,
            shared
                .store
                .complete(id, lease.fence, completion.clone(), Timestamp::now()),
        )
        .await
        {
            Ok(Settled::Applied) => return Outcome::Executed,
            Ok(Settled::StaleFence) => {
                shared.meters.stale_completion();
                tracing::warn!(key = %id.key.log_id(), "lease lost before completion; result not stored");
                return Outcome::Executed;
            }
            Err(e) if Timestamp::now() + backoff < lease.lease_until => {
                tracing::warn!(key = %id.key.log_id(), error = %e, attempt, "completion failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(e) => {
                shared.meters.unrecorded_completion();
                tracing::error!(key = %id.key.log_id(), error = %e, attempt, "completion failed until the lease ended; the record stays in progress until recovery");
                return Outcome::Executed;
            }
        }
    }
}

pub(super) async fn release(shared: &Shared, id: &RecordId, lease: Lease) {
    for attempt in 1..=SETTLE_ATTEMPTS {
        match store_call(
            shared,
            StoreOp::Release,
            shared.store.release(id, lease.fence, Timestamp::now()),
        )
        .await
        {
            Ok(_) => return,
            Err(e) if attempt < SETTLE_ATTEMPTS => {
                tracing::warn!(key = %id.key.log_id(), error = %e, attempt, "release failed; retrying");
                tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
            }
            Err(e) => {
                tracing::error!(key = %id.key.log_id(), error = %e, "release failed; the claim ends with its lease");
            }
        }
    }
}
