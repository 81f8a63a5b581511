//! One request through the contract: key, scope, body, fingerprint, claim,
//! then reject, replay, wait, or execute.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::header::HeaderName;
use http::{HeaderMap, Request, Response, header, request::Parts};
use http_body_util::{BodyExt, Limited};
use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Concurrency, Disposition, Fingerprint, Key, Lease,
    Operation, RecordId, Settled, Timestamp,
};

use crate::body::{Body, BoxError, boxed, full};
use crate::context::IdempotencyContext;
use crate::layer::Shared;
use crate::metrics::{self, Outcome, count, timed};
use crate::rejection::Rejection;
use crate::replay::{replay, set_expires, to_stored};
use crate::rule::{KeyRequirement, RouteRule};

/// The `Idempotency-Key` header.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

fn reject(r: Rejection) -> Response<Body> {
    count(r.outcome());
    r.into_response()
}

fn reject_keyed(r: Rejection, expires_at: Timestamp) -> Response<Body> {
    let mut response = reject(r);
    set_expires(response.headers_mut(), expires_at);
    response
}

/// The inner service's call, boxed.
pub(crate) type Call<E> =
    Box<dyn FnOnce(Request<Body>) -> BoxFuture<'static, Result<Response<Body>, E>> + Send>;

pub(crate) async fn handle<B, E>(
    shared: Arc<Shared>,
    inner: Call<E>,
    req: Request<B>,
) -> Result<Response<Body>, E>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    E: Send + 'static,
{
    let (parts, body) = req.into_parts();
    let pass =
        |inner: Call<E>, parts: Parts, body: B| inner(Request::from_parts(parts, boxed(body)));
    let Some(rule) = shared.rule_for(&parts.method, parts.uri.path()) else {
        return pass(inner, parts, body).await;
    };

    // The key.
    let mut values = parts.headers.get_all(IDEMPOTENCY_KEY).iter();
    let raw = match (values.next(), values.next()) {
        (None, _) if rule.key == KeyRequirement::Optional => {
            return pass(inner, parts, body).await;
        }
        (None, _) => return Ok(reject(Rejection::MissingKey)),
        (Some(_), Some(_)) => return Ok(reject(Rejection::RepeatedKey)),
        (Some(v), None) => v.clone(),
    };
    let key = match parse_key(&shared, &raw, &parts.headers) {
        Ok(k) => k,
        Err(r) => return Ok(reject(r)),
    };
    let id = RecordId::new(
        shared.scope.scope_of(&parts),
        Operation::new(parts.method.as_str(), rule.path.as_str()),
        key,
    );

    // The body, bounded.
    let limit = rule.body_limit.unwrap_or(shared.body_limit);
    let bytes = match read_body(body, &parts.headers, limit).await {
        Ok(b) => b,
        Err(r) => return Ok(reject(r)),
    };
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let fingerprint = Fingerprint::compute(&id.operation, content_type, &bytes, &rule.fields);

    let lease = match claim_or_wait(&shared, &rule, &id, fingerprint).await {
        Ok(lease) => lease,
        Err(response) => return Ok(response),
    };
    tracing::debug!(key = %id.key.log_id(), fence = lease.fence.get(), takeover = lease.takeover, "executing");

    // Execute in a task of our own: a client that hangs up drops this
    // future, not the handler.
    let ctx = IdempotencyContext::new(id.clone(), lease.fence, lease.expires_at);
    let mut request = Request::from_parts(parts, full(bytes));
    request.extensions_mut().insert(ctx.clone());
    let call = inner(request);
    let task = shared
        .tracker
        .spawn(execute(shared.clone(), call, ctx, rule, lease));
    match task.await {
        Ok(result) => result,
        // Only our own code can panic here (the handler's panics are caught
        // inside); the claim is left to its lease.
        Err(_) => Ok(reject(Rejection::HandlerFailed)),
    }
}

fn parse_key(
    shared: &Shared,
    raw: &http::HeaderValue,
    headers: &HeaderMap,
) -> Result<Key, Rejection> {
    let text = raw.to_str().map_err(|_| {
        let at = raw
            .as_bytes()
            .iter()
            .position(|b| !b.is_ascii())
            .unwrap_or(0);
        Rejection::InvalidKey(idem_core::KeyError::InvalidCharacter {
            byte: raw.as_bytes().get(at).copied().unwrap_or(0),
            at,
        })
    })?;
    let credential = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split_once(' ').map_or(v, |(_, token)| token).trim());
    Key::parse(text, &shared.key_policy, credential).map_err(Rejection::InvalidKey)
}

async fn read_body<B>(body: B, headers: &HeaderMap, limit: usize) -> Result<Bytes, Rejection>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(Rejection::BodyTooLarge { limit });
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(Rejection::BodyTooLarge { limit })
        }
        Err(_) => Err(Rejection::UnreadableBody),
    }
}

/// Claims the key; in wait mode, waits for an in-flight first request.
/// `Ok` is a lease to execute with; `Err` is the response to send.
async fn claim_or_wait(
    shared: &Shared,
    rule: &RouteRule,
    id: &RecordId,
    fingerprint: Fingerprint,
) -> Result<Lease, Response<Body>> {
    let policy = &rule.policy;
    let deadline = match policy.concurrency() {
        Concurrency::Wait { limit } => Some(tokio::time::Instant::now() + limit),
        _ => None,
    };
    let mut backoff = Duration::from_millis(50);
    loop {
        // Subscribe before claiming, so a finish between the claim and the
        // wait is not missed.
        let notify = deadline.map(|_| shared.waiters.subscribe(id));
        // Enabled now, so a `notify_waiters` between the claim and the wait
        // below still wakes this waiter.
        let mut notified = notify.as_ref().map(|n| Box::pin(n.notified()));
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
        let claim = match timed("claim", shared.store.claim(&req)).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(key = %id.key.log_id(), error = %e, "store unavailable; refusing to execute");
                return Err(reject(Rejection::StoreUnavailable {
                    retry_after: shared.unavailable_retry_after,
                }));
            }
        };
        match claim {
            Claim::Acquired(lease) => {
                if lease.takeover {
                    ::metrics::counter!(metrics::TAKEOVERS).increment(1);
                }
                return Ok(lease);
            }
            Claim::Mismatch { expires_at } => {
                return Err(reject_keyed(Rejection::Mismatch, expires_at));
            }
            Claim::Replay(record) => {
                count(Outcome::Replayed);
                return Err(match &record.response {
                    Some(stored) => replay(stored, record.expires_at),
                    None => Rejection::HandlerFailed.into_response(),
                });
            }
            Claim::InFlight { expires_at, .. } => {
                let in_flight = || {
                    reject_keyed(
                        Rejection::InFlight {
                            retry_after: shared.in_flight_retry_after,
                        },
                        expires_at,
                    )
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

/// Runs the handler's future to the end and settles the record.
async fn execute<E>(
    shared: Arc<Shared>,
    call: BoxFuture<'static, Result<Response<Body>, E>>,
    ctx: IdempotencyContext,
    rule: RouteRule,
    lease: Lease,
) -> Result<Response<Body>, E> {
    let token = shared.in_progress.begin();
    let id = ctx.id().clone();
    let outcome = tokio::select! {
        biased;
        () = shared.shutdown.cancelled() => None,
        r = AssertUnwindSafe(call).catch_unwind() => Some(r),
    };
    let response = match outcome {
        None => return Ok(abandon(&shared, &id, lease, token, Rejection::ShuttingDown).await),
        Some(Err(_panic)) => {
            tracing::error!(key = %id.key.log_id(), "handler panicked; claim released");
            return Ok(abandon(&shared, &id, lease, token, Rejection::HandlerFailed).await);
        }
        Some(Ok(Err(e))) => {
            settle_release(&shared, &id, lease, token).await;
            return Err(e);
        }
        Some(Ok(Ok(response))) => response,
    };
    let (mut parts, body) = response.into_parts();
    let Ok(collected) = body.collect().await else {
        tracing::error!(key = %id.key.log_id(), "handler's response body failed; claim released");
        return Ok(abandon(&shared, &id, lease, token, Rejection::HandlerFailed).await);
    };
    let bytes = collected.to_bytes();

    let outcome = if ctx.is_completed() {
        Outcome::Executed
    } else {
        let stored = || to_stored(parts.status, &parts.headers, &bytes, &rule.extra_headers);
        match rule.policy.disposition(parts.status.as_u16()) {
            Disposition::Complete => {
                complete(&shared, &id, lease, Completion::completed(stored())).await
            }
            Disposition::Fail => complete(&shared, &id, lease, Completion::failed(stored())).await,
            Disposition::Release => {
                release(&shared, &id, lease).await;
                Outcome::Released
            }
        }
    };
    shared.waiters.wake(&id);
    shared.in_progress.end(token);
    count(outcome);
    set_expires(&mut parts.headers, lease.expires_at);
    Ok(Response::from_parts(parts, full(bytes)))
}

/// Releases the claim of an execution that produced no storable result,
/// and wakes its waiters.
async fn settle_release(shared: &Shared, id: &RecordId, lease: Lease, token: u64) {
    release(shared, id, lease).await;
    shared.waiters.wake(id);
    shared.in_progress.end(token);
    count(Outcome::Released);
}

/// As [`settle_release`], answering with `rejection`.
async fn abandon(
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
const SETTLE_ATTEMPTS: u32 = 3;

async fn complete(shared: &Shared, id: &RecordId, lease: Lease, completion: Completion) -> Outcome {
    for attempt in 1..=SETTLE_ATTEMPTS {
        match timed(
            "complete",
            shared
                .store
                .complete(id, lease.fence, completion.clone(), Timestamp::now()),
        )
        .await
        {
            Ok(Settled::Applied) => return Outcome::Executed,
            Ok(Settled::StaleFence) => {
                ::metrics::counter!(metrics::STALE).increment(1);
                tracing::warn!(key = %id.key.log_id(), "lease lost before completion; result not stored");
                return Outcome::Executed;
            }
            Err(e) if attempt < SETTLE_ATTEMPTS => {
                tracing::warn!(key = %id.key.log_id(), error = %e, attempt, "completion failed; retrying");
                tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
            }
            Err(e) => {
                tracing::error!(key = %id.key.log_id(), error = %e, "completion failed; the record stays in progress until its lease ends");
            }
        }
    }
    Outcome::Executed
}

async fn release(shared: &Shared, id: &RecordId, lease: Lease) {
    for attempt in 1..=SETTLE_ATTEMPTS {
        match timed(
            "release",
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
