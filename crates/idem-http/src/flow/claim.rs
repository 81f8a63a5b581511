//! Claiming the record: a new claim (or a takeover of a lapsed one)
//! goes on to execute; a finished record is replayed; a mismatch is 422;
//! a claim in flight is 409 with `Retry-After`, or waited for in wait
//! mode; a store that fails is 503 (fail closed).

use std::sync::Arc;
use std::time::Duration;

use http::Response;
use idem_core::{
    Claim, ClaimRequest, Concurrency, Fingerprint, Lease, Record, RecordId, StoreError, Timestamp,
};

use super::execution::Ended;
use super::release::give_back;
use crate::body::Body;
use crate::metrics::{Outcome, StoreOp};
use crate::pending::HeldAnswer;
use crate::rejection::Rejection;
use crate::replay::{replay, set_expires};
use crate::rule::RouteRule;
use crate::shared::{Shared, store_call};

/// Claims the key; in wait mode, waits for an in-flight first request.
/// `Ok` is a lease to execute with; `Err` is the response to send, with
/// its outcome.
pub(super) async fn claim_or_wait(
    shared: &Arc<Shared>,
    rule: &RouteRule,
    id: &RecordId,
    fingerprint: Fingerprint,
    legacy: &(dyn Fn() -> Fingerprint + Sync),
) -> Result<Lease, Ended<Response<Body>>> {
    let policy = &rule.policy;
    let deadline = match policy.concurrency() {
        Concurrency::Wait { limit } => Some(tokio::time::Instant::now() + limit),
        _ => None,
    };
    // A finished record replayed before, kept in memory: no store call.
    if let Some(kept) = shared
        .replays
        .as_ref()
        .and_then(|c| c.get(id, &fingerprint, Timestamp::now()))
    {
        shared.meters.count(Outcome::Replayed);
        shared.meters.replay_cache_hit();
        return Err((Outcome::Replayed, replay(&kept.response, kept.expires_at)));
    }
    let mut backoff = Duration::from_millis(50);
    loop {
        // A result held here while the store has not taken it yet: its
        // key must not run again (`pending.rs`).
        if let Some(held) = shared.pending.answer(id, &fingerprint, Timestamp::now()) {
            return Err(match held {
                HeldAnswer::Replay(response, expires_at) => {
                    shared.meters.count(Outcome::Replayed);
                    (Outcome::Replayed, replay(&response, expires_at))
                }
                HeldAnswer::Mismatch(expires_at) => (
                    Outcome::Mismatch,
                    reject_keyed(shared, Rejection::Mismatch, expires_at),
                ),
            });
        }
        // Subscribe before claiming, so a finish between the claim and the
        // wait is not missed.
        let subscription = deadline.map(|_| shared.waiters.subscribe(id));
        // Enabled now, so a `notify_waiters` between the claim and the wait
        // below still wakes this waiter.
        let mut notified = subscription
            .as_ref()
            .map(|s| Box::pin(s.notify().notified()));
        if let Some(n) = notified.as_mut() {
            n.as_mut().enable();
        }
        let req = ClaimRequest {
            id: id.clone(),
            fingerprint,
            now: Timestamp::now(),
            lease: policy.lease(),
            ttl: policy.ttl(),
        };
        let before = shared.loss_window.before_claim();
        if let Some(r) = loss_gate(shared, req.now) {
            return Err((r.outcome(), shared.reject(r)));
        }
        let unavailable = |e: StoreError| {
            tracing::warn!(key = %id.key.log_id(), error = %e, "store unavailable; refusing to execute");
            let r = Rejection::StoreUnavailable {
                retry_after: shared.settings.unavailable_retry_after,
            };
            (r.outcome(), shared.reject(r))
        };
        let mut claim = store_call(shared, StoreOp::Claim, shared.store.claim(&req))
            .await
            .map_err(unavailable)?;
        if let Claim::Mismatch { .. } = claim {
            // A record written before fingerprint version 2 is compared the
            // way it was written, so its retries keep replaying: claimed
            // again with the old fingerprint, so that the store answers
            // (and settles, waits for replicas, ...) as for any claim.
            let record = store_call(shared, StoreOp::Get, shared.store.get(id, req.now))
                .await
                .map_err(unavailable)?;
            if record.is_some_and(|r| written_with_legacy(&r, legacy)) {
                let as_before = ClaimRequest {
                    fingerprint: legacy(),
                    ..req.clone()
                };
                claim = store_call(shared, StoreOp::Claim, shared.store.claim(&as_before))
                    .await
                    .map_err(unavailable)?;
            }
        }
        match claim {
            Claim::Acquired(lease) if shared.loss_window.moved_since(before) => {
                // A loss was noticed, or the store met down, while this
                // claim was on its way: the store that granted it may be
                // one that forgot an execution still running. Given back:
                // tried once here; if the store is still down, owed and
                // retried in the background, so that the key is not kept
                // from a retry for a whole lease. A takeover is kept
                // instead (it lapses with its lease): its record is the
                // crash window's, whose end the route's takeover policy
                // decides; deleted, the next claim would be a fresh one
                // and run unannounced beside an attempt that may have acted.
                if !lease.takeover {
                    give_back(shared, id, lease.fence, lease.lease_until, 1).await;
                }
                let r =
                    loss_gate(shared, Timestamp::now()).unwrap_or(Rejection::StoreUnavailable {
                        retry_after: shared.settings.unavailable_retry_after,
                    });
                return Err((r.outcome(), shared.reject(r)));
            }
            Claim::Acquired(lease) => {
                if lease.takeover {
                    shared.meters.takeover();
                    if !policy.takeover().executes() {
                        // The crash window, held: the claim is kept (under
                        // this lease, by nobody) and the key not run again.
                        tracing::warn!(key = %id.key.log_id(), "took over a claim whose outcome is unknown; held for an operator (takeover policy: hold)");
                        return Err((
                            Outcome::Held,
                            reject_keyed(shared, Rejection::OutcomeUnresolved, lease.expires_at),
                        ));
                    }
                }
                return Ok(lease);
            }
            Claim::Mismatch { expires_at } => {
                return Err((
                    Outcome::Mismatch,
                    reject_keyed(shared, Rejection::Mismatch, expires_at),
                ));
            }
            Claim::Replay(record) => {
                shared.meters.count(Outcome::Replayed);
                if let Some(cache) = &shared.replays {
                    cache.keep(&record);
                }
                return Err((
                    Outcome::Replayed,
                    match &record.response {
                        Some(stored) => replay(stored, record.expires_at),
                        None => Rejection::HandlerFailed.into_response(),
                    },
                ));
            }
            Claim::InFlight { expires_at, .. } => {
                let in_flight = || {
                    let r = Rejection::InFlight {
                        retry_after: shared.settings.in_flight_retry_after,
                    };
                    (r.outcome(), reject_keyed(shared, r, expires_at))
                };
                let (Some(deadline), Some(notified)) = (deadline, notified) else {
                    return Err(in_flight());
                };
                if tokio::time::Instant::now() >= deadline {
                    return Err(in_flight());
                }
                let nap = tokio::time::sleep(backoff.min(deadline - tokio::time::Instant::now()));
                tokio::select! {
                    () = notified => {}
                    () = nap => backoff = (backoff * 2).min(Duration::from_secs(1)),
                }
            }
        }
    }
}

/// Whether `record` was written under fingerprint version 1 with the
/// request's version-1 fingerprint (rather than being a real mismatch).
pub(super) fn written_with_legacy(
    record: &Record,
    legacy: &(dyn Fn() -> Fingerprint + Sync),
) -> bool {
    record.fingerprint.version() == 1 && record.fingerprint == legacy()
}

/// A refusal of a request whose record exists: it says when the record
/// expires.
fn reject_keyed(shared: &Shared, r: Rejection, expires_at: Timestamp) -> Response<Body> {
    let mut response = shared.reject(r);
    set_expires(response.headers_mut(), expires_at);
    response
}

/// Why no claim may go to the store now, if there is a reason: the store
/// lost records and the loss window is open (a claim it grants may be one
/// that an execution still running holds without its knowing), or the
/// store was met down and may have come back empty, and its epoch has not
/// been checked since (`store_watch.rs`).
fn loss_gate(shared: &Shared, now: Timestamp) -> Option<Rejection> {
    if let Some(retry_after) = shared.loss_window.retry_after(now) {
        return Some(Rejection::StoreLostRecords { retry_after });
    }
    // An execution of this process that began before the loss may outlive
    // the window (a heartbeat carries it past its lease): the window stays
    // open here until it ends.
    if shared
        .loss_window
        .lost_at()
        .is_some_and(|at| shared.in_progress.started_before(at))
    {
        return Some(Rejection::StoreLostRecords {
            retry_after: shared.settings.unavailable_retry_after,
        });
    }
    shared
        .loss_window
        .awaiting_check()
        .then_some(Rejection::StoreUnavailable {
            retry_after: shared.settings.unavailable_retry_after,
        })
}
