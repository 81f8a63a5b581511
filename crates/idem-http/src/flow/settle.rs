//! Settling: the answer stored with the record (or, when the store fails,
//! held and retried in the background), or the key released (a transient
//! failure: `release.rs`) or held (an unknown outcome) until its lease ends; and the
//! execution's end counted.

use std::sync::Arc;
use std::time::Duration;

use http::{Response, StatusCode};
use idem_core::{
    Claim, ClaimRequest, Completion, Lease, RecordId, Settled, Status, StoreError, Timestamp,
};

use super::execution::Claimed;
use super::heartbeat::beating;
use super::not_stored::{NotStored, not_stored};
use super::release::release;

use crate::body::Body;
use crate::metrics::{Outcome, StoreOp};
use crate::pending::Held;
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
pub(super) async fn settle_release(
    shared: &Arc<Shared>,
    id: &RecordId,
    claim: Claimed,
    token: u64,
) {
    release(shared, id, claim).await;
    finish(shared, id, token, claim.released());
}

/// As [`settle_release`], answering with `rejection`.
pub(super) async fn abandon(
    shared: &Arc<Shared>,
    id: &RecordId,
    claim: Claimed,
    token: u64,
    rejection: Rejection,
) -> Response<Body> {
    settle_release(shared, id, claim, token).await;
    let mut response = rejection.into_response();
    set_expires(response.headers_mut(), claim.lease.expires_at);
    response
}

/// How long an answer waits for its completion to be stored while the
/// store fails (a blip, a failover's first seconds) before it leaves with
/// the completion held and retried in the background.
const COMPLETION_WAIT: Duration = Duration::from_secs(2);

/// Stores the result. A store that fails is retried (100 ms doubling) for
/// up to [`COMPLETION_WAIT`], so that the answer leaves once its record is
/// durable whenever the store comes back that soon. Past it the completion
/// is held in memory and retried in the background ([`defer`]) and the
/// answer leaves: the effect has happened, and until the store takes the
/// record a retry that reaches this process is answered from the held
/// result.
pub(super) async fn complete(
    shared: &Arc<Shared>,
    id: &RecordId,
    claim: Claimed,
    completion: Completion,
) -> Outcome {
    let started = tokio::time::Instant::now();
    let mut backoff = Duration::from_millis(100);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let stored = store_call(
            shared,
            StoreOp::Complete,
            shared
                .store
                .complete(id, claim.lease.fence, completion.clone(), Timestamp::now()),
        )
        .await;
        match stored {
            Ok(Settled::Applied) => break,
            Ok(Settled::StaleFence) => {
                stale(shared, id);
                break;
            }
            Err(e) if started.elapsed() + backoff < COMPLETION_WAIT => {
                tracing::warn!(key = %id.key.log_id(), error = %e, attempt, "completion failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
            Err(e) => {
                tracing::warn!(key = %id.key.log_id(), error = %e, attempt, "completion failed; the answer leaves, held until the store takes it");
                // A store that is down takes the whole answer once it is
                // back; one that refuses it (too large for the backend,
                // say) would refuse it for ever: its placeholder is held.
                let refused = !e.is_unavailable();
                defer(shared, id, claim, completion, refused);
                break;
            }
        }
    }
    Outcome::Executed
}

fn stale(shared: &Shared, id: &RecordId) {
    shared.meters.stale_completion();
    tracing::warn!(key = %id.key.log_id(), "lease lost before completion; result not stored");
}

/// Holds `completion` (`pending.rs`) and retries it in a task of the
/// layer's, until the store takes it, the fence goes stale, the record
/// expires or the layer shuts down.
fn defer(
    shared: &Arc<Shared>,
    id: &RecordId,
    claim: Claimed,
    completion: Completion,
    refused: bool,
) {
    let limit = shared.settings.response_limit;
    let completion = if refused {
        placeholder(&completion, limit)
    } else {
        completion
    };
    let held = shared.pending.hold(
        id,
        claim.fingerprint,
        completion,
        claim.lease.expires_at,
        |whole| placeholder(whole, limit),
        &shared.meters,
    );
    let Some(held) = held else {
        shared.meters.unrecorded_completion();
        tracing::error!(key = %id.key.log_id(), "completion failed and too many are held already; the key stays in progress until its lease ends");
        return;
    };
    shared.meters.deferred_completion();
    let (shared, id) = (shared.clone(), id.clone());
    shared.clone().tracker.spawn(async move {
        // The lease is renewed every third of it while the completion
        // waits, whatever the backoff: another instance must not take the
        // key over while its answer is held here.
        let retried = retry_held(&shared, &id, claim, &held);
        beating(&shared, &id, claim, retried).await;
        shared.pending.release(&id, &held, &shared.meters);
    });
}

/// A held completion's retry met a stale fence: either an earlier attempt
/// was stored and its answer lost on the way back (the record is ours and
/// finished), or the record is gone (the store forgot it, or an operator
/// released it: it is written again from what is held, since the
/// operation did run), or the key was taken from this executor and the
/// answer is lost (counted as unrecorded).
async fn stale_or_stored(shared: &Shared, id: &RecordId, claim: Claimed, held: &Held) {
    let fence = claim.lease.fence;
    let now = Timestamp::now();
    let read = store_call(shared, StoreOp::Get, shared.store.get(id, now)).await;
    match read {
        Ok(Some(r)) if r.fence == fence && r.status != Status::InProgress => {
            tracing::info!(key = %id.key.log_id(), "held completion found stored (an earlier attempt's answer was lost)");
        }
        Ok(None) if rewrite(shared, id, claim, held, now).await => {
            tracing::warn!(key = %id.key.log_id(), "the store no longer had the record of a held completion (it forgot it, or it was released); written again from the held answer, so its retries replay it");
        }
        _ => {
            shared.meters.unrecorded_completion();
            tracing::error!(key = %id.key.log_id(), operation = id.operation.as_str(), "held completion not stored: the key was taken from this executor (a stall past its lease, or an operator's release)");
        }
    }
}

/// Writes a held completion's record again where the store has none: a
/// fresh claim under the held fingerprint, for the record's remaining
/// life, completed with the held answer. Whether it was written; `false`
/// when another request claimed the key first (or the store failed).
async fn rewrite(
    shared: &Shared,
    id: &RecordId,
    claim: Claimed,
    held: &Held,
    now: Timestamp,
) -> bool {
    let req = ClaimRequest {
        id: id.clone(),
        fingerprint: claim.fingerprint,
        now,
        lease: claim.lease_length,
        ttl: held.expires_at.saturating_since(now),
    };
    if req.ttl.is_zero() {
        return false;
    }
    let Ok(Claim::Acquired(lease)) =
        store_call(shared, StoreOp::Claim, shared.store.claim(&req)).await
    else {
        return false;
    };
    let _copy = shared.pending.attempt(held).await;
    let stored = store_call(
        shared,
        StoreOp::Complete,
        shared
            .store
            .complete(id, lease.fence, held.completion.clone(), Timestamp::now()),
    )
    .await;
    matches!(stored, Ok(Settled::Applied))
}

/// The longest wait between two attempts at a held completion.
const HELD_BACKOFF_MAX: Duration = Duration::from_secs(5);

async fn retry_held(shared: &Shared, id: &RecordId, claim: Claimed, held: &Held) {
    let (completion, expires_at) = (&held.completion, held.expires_at);
    let fence = claim.lease.fence;
    let mut backoff = Duration::from_millis(100);
    for attempt in 2u32.. {
        // At shutdown (past the layer's grace), one last attempt.
        let last = tokio::select! {
            biased;
            () = shared.shutdown.cancelled() => true,
            () = tokio::time::sleep(backoff) => false,
        };
        let now = Timestamp::now();
        if now >= expires_at {
            shared.meters.unrecorded_completion();
            tracing::error!(key = %id.key.log_id(), attempt, "the record expired before the store took its completion");
            return;
        }
        // The copy sent waits for room (`pending.rs`); at shutdown only
        // as long as a store call may take.
        let sending = async {
            let _copy = shared.pending.attempt(held).await;
            store_call(
                shared,
                StoreOp::Complete,
                shared.store.complete(id, fence, completion.clone(), now),
            )
            .await
        };
        let stored = if last {
            tokio::time::timeout(shared.settings.store_timeout, sending)
                .await
                .unwrap_or_else(|_| Err(StoreError::timed_out("a held completion's last attempt")))
        } else {
            sending.await
        };
        match stored {
            Ok(Settled::Applied) => {
                tracing::info!(key = %id.key.log_id(), attempt, "held completion stored");
                return;
            }
            Ok(Settled::StaleFence) => return stale_or_stored(shared, id, claim, held).await,
            Err(e) if last => {
                shared.meters.unrecorded_completion();
                tracing::error!(key = %id.key.log_id(), error = %e, attempt, "shutting down with a completion the store did not take; the key stays in progress until its lease ends");
                return;
            }
            Err(e) => {
                tracing::debug!(key = %id.key.log_id(), error = %e, attempt, "held completion failed again");
                backoff = (backoff * 2).min(HELD_BACKOFF_MAX);
            }
        }
    }
}

/// What is held instead of an answer over the budget: its status and a
/// `response-not-stored` problem, as for an answer over the replay limit.
fn placeholder(whole: &Completion, limit: usize) -> Completion {
    let status = StatusCode::from_u16(whole.response.status).unwrap_or(StatusCode::OK);
    let small = not_stored(status, NotStored::HeldOverBudget, limit);
    let small = match whole.status() {
        Status::Failed => Completion::failed(small),
        _ => Completion::completed(small),
    };
    match &whole.resource_id {
        Some(rid) => small.with_resource_id(rid.clone()),
        None => small,
    }
}
