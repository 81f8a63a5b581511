//! One request through the contract: key, scope, body, fingerprint, claim,
//! then reject, replay, wait, or execute.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header, request::Parts};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Concurrency, Disposition, Fingerprint, Key, Lease,
    Record, RecordId, Settled, StoreError, StoredResponse, Timestamp,
};
use tracing::Instrument;

use crate::body::{Body, BoxError, boxed, full};
use crate::context::IdempotencyContext;
use crate::key_header::IDEMPOTENCY_KEY;
use crate::metrics::{Outcome, StoreOp};
use crate::rejection::Rejection;
use crate::replay::{replay, set_expires, to_stored};
use crate::rule::{KeyRequirement, RouteRule, ScopeError};
use crate::shared::{Shared, store_call};

fn reject(shared: &Shared, r: Rejection) -> Response<Body> {
    shared.meters.count(r.outcome());
    r.into_response()
}

fn reject_keyed(shared: &Shared, r: Rejection, expires_at: Timestamp) -> Response<Body> {
    let mut response = reject(shared, r);
    set_expires(response.headers_mut(), expires_at);
    response
}

/// Put in a response's extensions by an inner service that cannot tell
/// whether its effect happened (a gateway whose upstream timed out after
/// the request was sent, say). The layer then neither stores nor releases
/// the record: the claim stays held until its lease ends, so a retry meets
/// 409 instead of running beside the first execution, and recovery decides
/// after the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutcomeUnknown;

/// Put in a response's extensions by an inner service that cannot tell
/// the body's end from a cut (an HTTP/1.1 answer framed by the closing of
/// its connection: a crashed upstream's half answer reads the same). The
/// effect happened, so the layer settles the record as executed, but
/// keeps no body to replay: the client gets the answer as it comes, and a
/// retry gets the `response-not-stored` problem with the same status,
/// as for an answer over the replay limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnverifiedEnd;

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
    let mut values = parts.headers.get_all(&shared.key_header).iter();
    let raw = match (values.next(), values.next()) {
        // A key under the standard name where another is configured: the
        // client (idem's own retry client, for one) believes it is
        // protected and will retry; passing it through unprotected could
        // execute it twice.
        (None, _)
            if shared.key_header != IDEMPOTENCY_KEY
                && parts.headers.contains_key(IDEMPOTENCY_KEY) =>
        {
            return Ok(shared.reject_key_header(Rejection::MissingKey));
        }
        (None, _) if rule.key == KeyRequirement::Optional => {
            return pass(inner, parts, body).await;
        }
        (None, _) => return Ok(shared.reject_key_header(Rejection::MissingKey)),
        (Some(_), Some(_)) => return Ok(shared.reject_key_header(Rejection::RepeatedKey)),
        (Some(v), None) => v.clone(),
    };
    let key = match parse_key(&shared, &raw, &parts.headers) {
        Ok(k) => k,
        Err(r) => return Ok(reject(&shared, r)),
    };
    let scope = match shared.scope.scope_of(&parts) {
        Ok(s) if shared.require_scope && s == idem_core::Scope::anonymous() => {
            return Ok(reject(
                &shared,
                Rejection::Scope(ScopeError::CredentialRequired),
            ));
        }
        Ok(s) => s,
        Err(e) => return Ok(reject(&shared, Rejection::Scope(e))),
    };
    let operation = shared.operation(&rule, &parts.method, parts.uri.path());
    let id = RecordId::new(scope, operation, key);

    // From here on the request is keyed: it ends with one debug event.
    let started = Instant::now();

    // The body, bounded in size and time.
    let limit = rule.body_limit.unwrap_or(shared.body_limit);
    let bytes = match read_body(body, &parts.headers, limit, shared.body_timeout).await {
        Ok(b) => b,
        Err(r) => {
            let outcome = r.outcome();
            return Ok(ended(&id, started, outcome, reject_and_close(&shared, r)));
        }
    };
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    // Everything that selects the effect: the operation, the actual path
    // and query (a route pattern names many resources), and the body.
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let fingerprint =
        Fingerprint::compute_request(&id.operation, target, content_type, &bytes, &rule.fields);
    let legacy = || Fingerprint::compute_v1(&id.operation, content_type, &bytes, &rule.fields);

    let lease = match claim_or_wait(&shared, &rule, &id, fingerprint, &legacy).await {
        Ok(lease) => lease,
        Err((outcome, response)) => return Ok(ended(&id, started, outcome, response)),
    };
    // Execute in a task of our own: a client that hangs up drops this
    // future, not the handler.
    let ctx = IdempotencyContext::new(id.clone(), lease.fence, lease.expires_at);
    let mut request = Request::from_parts(parts, full(bytes));
    request.extensions_mut().insert(ctx.clone());
    // The task runs in the caller's span, so that a span of the stack
    // around this layer (a TraceLayer, OpenTelemetry) covers the handler.
    // It logs the request's end itself: a client that hangs up drops the
    // wait below, not the execution, and its end is still logged.
    // Boxed: the task's future is moved several times on its way into the
    // runtime, and the execution's state is a few kilobytes.
    let execution = Box::pin(execute(shared.clone(), inner, request, ctx, rule, lease));
    let shared_for_panic = shared.clone();
    let task = shared.tracker.spawn(
        async move {
            match AssertUnwindSafe(execution).catch_unwind().await {
                Ok((outcome, result)) => {
                    let status = result.as_ref().ok().map(Response::status);
                    log_end(&id, started, outcome, status);
                    result
                }
                // Only our own code, or the service's `call` itself, can
                // panic here (the futures' panics are caught inside); the
                // claim is left to its lease.
                Err(_) => Ok(ended(
                    &id,
                    started,
                    Outcome::Released,
                    reject(&shared_for_panic, Rejection::HandlerFailed),
                )),
            }
        }
        .in_current_span(),
    );
    // The task catches every panic; a join error is a cancelled runtime.
    task.await
        .unwrap_or_else(|_| Ok(reject(&shared, Rejection::HandlerFailed)))
}

/// How a keyed request ended: the outcome it was counted under in
/// `idem_requests_total`, and its answer.
type Ended<T> = (Outcome, T);

/// The one event per keyed request, at debug: its operation (method and
/// route), outcome, status (none when the inner service failed) and
/// duration. The key appears only as its short hash.
fn log_end(id: &RecordId, started: Instant, outcome: Outcome, status: Option<StatusCode>) {
    tracing::debug!(
        operation = id.operation.as_str(),
        key = %id.key.log_id(),
        outcome = %outcome.as_str(),
        status = status.map(|s| s.as_u16()),
        duration_ms = started.elapsed().as_micros() as f64 / 1000.0,
        "request finished"
    );
}

/// Logs the end of a keyed request answered with `response`; returns it.
fn ended(
    id: &RecordId,
    started: Instant,
    outcome: Outcome,
    response: Response<Body>,
) -> Response<Body> {
    log_end(id, started, outcome, Some(response.status()));
    response
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

/// A rejection sent before the request body was read to its end: the
/// connection is closed after the answer, since what is left of the body
/// cannot be told apart from a next request.
fn reject_and_close(shared: &Shared, r: Rejection) -> Response<Body> {
    let mut response = reject(shared, r);
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// How much of an over-limit body is read and thrown away so that the
/// client, still sending, reads the 413 instead of a connection reset
/// (closing a socket with unread data makes the kernel send RST).
const DRAIN_LIMIT: u64 = 8 * 1024 * 1024;
/// How long that draining may take.
const DRAIN_TIME: Duration = Duration::from_secs(5);

async fn read_body<B>(
    body: B,
    headers: &HeaderMap,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, Rejection>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // A client that asked for 100-continue has sent nothing yet: refuse
    // without reading, and it sends nothing.
    let expects_continue = headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let too_large = Rejection::BodyTooLarge { limit };
    if declared.is_some_and(|n| n > limit as u64)
        && (expects_continue || declared.is_some_and(|n| n > limit as u64 + DRAIN_LIMIT))
    {
        return Err(too_large);
    }
    let mut body = std::pin::pin!(body);
    let mut buf = bytes::BytesMut::new();
    let read = async {
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(Into::into)?.into_data() else {
                continue;
            };
            if buf.len() + data.len() > limit {
                return Ok(false);
            }
            buf.extend_from_slice(&data);
        }
        Ok::<bool, BoxError>(true)
    };
    match tokio::time::timeout(timeout, read).await {
        Err(_) => return Err(Rejection::BodyTimeout),
        Ok(Err(_)) => return Err(Rejection::UnreadableBody),
        Ok(Ok(true)) => return Ok(buf.freeze()),
        Ok(Ok(false)) => {}
    }
    // Over the limit: drain a bounded amount, then refuse.
    let drain = async {
        let mut drained = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            drained += frame.data_ref().map_or(0, |d| d.len() as u64);
            if drained > DRAIN_LIMIT {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME.min(timeout), drain).await;
    Err(too_large)
}

/// Claims the key; in wait mode, waits for an in-flight first request.
/// `Ok` is a lease to execute with; `Err` is the response to send, with
/// its outcome.
async fn claim_or_wait(
    shared: &Shared,
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
        let unavailable = |e: StoreError| {
            tracing::warn!(key = %id.key.log_id(), error = %e, "store unavailable; refusing to execute");
            let r = Rejection::StoreUnavailable {
                retry_after: shared.unavailable_retry_after,
            };
            (r.outcome(), reject(shared, r))
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
            Claim::Acquired(lease) => {
                if lease.takeover {
                    shared.meters.takeover();
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
                        retry_after: shared.in_flight_retry_after,
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
fn written_with_legacy(record: &Record, legacy: &(dyn Fn() -> Fingerprint + Sync)) -> bool {
    record.fingerprint.version() == 1 && record.fingerprint == legacy()
}

/// Calls the handler, runs its future to the end and settles the record;
/// returns the answer with its outcome.
async fn execute<E>(
    shared: Arc<Shared>,
    inner: Call<E>,
    request: Request<Body>,
    ctx: IdempotencyContext,
    rule: Arc<RouteRule>,
    lease: Lease,
) -> Ended<Result<Response<Body>, E>> {
    let token = shared.in_progress.begin(&shared.meters);
    let id = ctx.id().clone();
    // Past the shutdown's grace the layer cancels executions. One claimed
    // since then has not reached the inner service: its claim is given
    // back, in either mode (a hold would keep a key that never ran until
    // its lease ends).
    if shared.shutdown.is_cancelled() {
        let abandoned = abandon(&shared, &id, lease, token, Rejection::ShuttingDown).await;
        return (Outcome::Released, Ok(abandoned));
    }
    tracing::debug!(key = %id.key.log_id(), fence = lease.fence.get(), takeover = lease.takeover, "executing");
    let head_request = request.method() == http::Method::HEAD;
    let call = inner(request);
    let outcome = tokio::select! {
        biased;
        () = shared.shutdown.cancelled() => None,
        r = AssertUnwindSafe(call).catch_unwind() => Some(r),
    };
    let response = match outcome {
        None if shared.hold_unknown_outcomes => {
            let held = hold(&shared, &id, lease, token, Rejection::ShuttingDown);
            return (Outcome::Held, Ok(held));
        }
        None => {
            let abandoned = abandon(&shared, &id, lease, token, Rejection::ShuttingDown).await;
            return (Outcome::Released, Ok(abandoned));
        }
        Some(Err(_panic)) => {
            tracing::error!(key = %id.key.log_id(), "handler panicked; claim released");
            let abandoned = abandon(&shared, &id, lease, token, Rejection::HandlerFailed).await;
            return (Outcome::Released, Ok(abandoned));
        }
        Some(Ok(Err(e))) => {
            settle_release(&shared, &id, lease, token).await;
            return (Outcome::Released, Err(e));
        }
        Some(Ok(Ok(response))) => response,
    };
    let (mut parts, body) = response.into_parts();
    if parts.extensions.get::<OutcomeUnknown>().is_some() {
        tracing::warn!(key = %id.key.log_id(), "outcome unknown; the claim is held until its lease ends");
        set_expires(&mut parts.headers, lease.expires_at);
        finish(&shared, &id, token, Outcome::Held);
        return (Outcome::Held, Ok(Response::from_parts(parts, body)));
    }
    let read = if parts.extensions.get::<UnverifiedEnd>().is_some() {
        ResponseBody::NotStorable(body, NotStored::UnverifiedEnd)
    } else {
        read_response(body, shared.response_limit).await
    };
    let body = match read {
        ResponseBody::Whole(bytes) => bytes,
        ResponseBody::NotStorable(streamed, why) => {
            // Executed, but not kept: the client still gets it whole, and
            // a retry learns from the record what happened.
            let outcome = if ctx.is_completed() {
                Outcome::Executed
            } else {
                let placeholder = not_stored(parts.status, why, shared.response_limit);
                let completion = match rule.policy.disposition(parts.status.as_u16()) {
                    Disposition::Release => None,
                    Disposition::Fail => Some(Completion::failed(placeholder)),
                    Disposition::Complete => Some(Completion::completed(placeholder)),
                };
                match completion {
                    Some(c) => complete(&shared, &id, lease, c).await,
                    None => {
                        release(&shared, &id, lease).await;
                        Outcome::Released
                    }
                }
            };
            finish(&shared, &id, token, outcome);
            set_expires(&mut parts.headers, lease.expires_at);
            return (outcome, Ok(Response::from_parts(parts, streamed)));
        }
        ResponseBody::Failed if shared.hold_unknown_outcomes => {
            tracing::error!(key = %id.key.log_id(), "response body failed; the claim is held until its lease ends");
            let held = hold(&shared, &id, lease, token, Rejection::OutcomeUnknown);
            return (Outcome::Held, Ok(held));
        }
        ResponseBody::Failed => {
            tracing::error!(key = %id.key.log_id(), "handler's response body failed; claim released");
            let abandoned = abandon(&shared, &id, lease, token, Rejection::HandlerFailed).await;
            return (Outcome::Released, Ok(abandoned));
        }
    };

    let outcome = if ctx.is_completed() {
        Outcome::Executed
    } else {
        let stored = || to_stored(parts.status, &parts.headers, &body, &rule.extra_headers);
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
    finish(&shared, &id, token, outcome);
    set_expires(&mut parts.headers, lease.expires_at);
    if !head_request {
        // The body is whole: its length is what the server writes, never
        // a length or a coding the handler (or an upstream) announced.
        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.remove(header::TRANSFER_ENCODING);
    }
    (outcome, Ok(Response::from_parts(parts, full(body))))
}

fn finish(shared: &Shared, id: &RecordId, token: u64, outcome: Outcome) {
    shared.waiters.wake(id);
    shared.in_progress.end(token, &shared.meters);
    shared.meters.count(outcome);
}

/// A handler's response body, read up to the layer's response limit.
enum ResponseBody {
    /// All of it.
    Whole(Bytes),
    /// Not to be stored: over the limit (what was read, followed by the
    /// rest, still to stream), or of an end that cannot be verified.
    NotStorable(Body, NotStored),
    /// The body failed (or stalled past a deadline the service set).
    Failed,
}

async fn read_response(mut body: Body, limit: usize) -> ResponseBody {
    // The first frame is kept as it came (most answers are one); from the
    // second on, frames are copied into one buffer: each `Bytes` of a
    // chunked answer holds a slice of the client's read buffer, so keeping
    // thousands of one-byte frames would cost tens of times the limit.
    let mut first: Option<Bytes> = None;
    let mut joined = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return ResponseBody::Failed;
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers are not stored
        };
        match first.take() {
            None if joined.is_empty() => first = Some(data),
            held => {
                if let Some(held) = held {
                    joined.reserve(held.len() + data.len());
                    joined.extend_from_slice(&held);
                }
                joined.extend_from_slice(&data);
            }
        }
        let total = first.as_ref().map_or(joined.len(), Bytes::len);
        if total > limit {
            let read = first.unwrap_or_else(|| joined.freeze());
            let read = futures_util::stream::once(async move {
                Ok::<_, BoxError>(http_body::Frame::data(read))
            });
            let rest = BodyStream::new(body);
            return ResponseBody::NotStorable(
                StreamBody::new(read.chain(rest)).boxed_unsync(),
                NotStored::TooLarge,
            );
        }
    }
    ResponseBody::Whole(first.unwrap_or_else(|| joined.freeze()))
}

/// Why an executed answer's body was not stored.
#[derive(Debug, Clone, Copy)]
enum NotStored {
    /// Over the replay limit.
    TooLarge,
    /// Its end could not be told from a cut ([`UnverifiedEnd`]).
    UnverifiedEnd,
}

/// What a record keeps for a response it could not store: the original
/// status, and a problem document saying the request was executed and
/// where its record can be read.
fn not_stored(status: StatusCode, why: NotStored, limit: usize) -> StoredResponse {
    // One title for the type (RFC 9457: a title does not change between
    // occurrences); the detail says why.
    let reason = match why {
        NotStored::TooLarge => {
            format!("its response was over the replay limit of {limit} bytes and was not kept")
        }
        NotStored::UnverifiedEnd => "its response ended with its connection, so a cut could not be told from the end, and it was not kept".to_owned(),
    };
    crate::Problem::idem(
        status,
        "response-not-stored",
        "Response not stored",
        format!(
            "The request with this key was executed once; {reason}. Do not send it again as a new request: read GET /_idem/records/{{key}} for its status and resource id."
        ),
    )
    .to_stored()
}

/// Leaves the claim held until its lease ends (the outcome is unknown) and
/// answers with `rejection`.
fn hold(
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
async fn settle_release(shared: &Shared, id: &RecordId, lease: Lease, token: u64) {
    release(shared, id, lease).await;
    finish(shared, id, token, Outcome::Released);
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

/// Stores the result. A store that fails is retried (100 ms doubling to
/// 1 s) for as long as the lease runs, so the record is durable before the
/// response leaves whenever the store comes back in time; the answer waits
/// for it. If the lease ends first, the client still gets the response (the
/// effect happened, and a client with its answer has no reason to retry),
/// and the record stays in progress until recovery.
async fn complete(shared: &Shared, id: &RecordId, lease: Lease, completion: Completion) -> Outcome {
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

async fn release(shared: &Shared, id: &RecordId, lease: Lease) {
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

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http_body::Frame;

    use super::{ResponseBody, read_response};
    use crate::body::{BoxError, boxed};

    /// One-byte frames, each a slice of a 4 KiB buffer of its own (as a
    /// chunked answer's frames are slices of the client's read buffer).
    /// When asked for a frame, it records whether the buffers behind the
    /// frames it gave before the last two are still held by anyone but
    /// itself.
    struct Slices {
        parents: Vec<Bytes>,
        next: usize,
        held: Arc<Mutex<VecDeque<usize>>>,
    }

    impl http_body::Body for Slices {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            let n = self.next;
            let this = &mut *self;
            for (i, parent) in this
                .parents
                .iter_mut()
                .enumerate()
                .take(n.saturating_sub(2))
            {
                if !parent.is_unique() {
                    this.held.lock().unwrap().push_back(i);
                }
            }
            let Some(parent) = self.parents.get(n) else {
                return Poll::Ready(None);
            };
            let frame = parent.slice(0..1);
            self.next += 1;
            Poll::Ready(Some(Ok(Frame::data(frame))))
        }
    }

    /// A keyed answer in many tiny frames costs its bytes, not a frame
    /// handle and a read buffer each: every frame but the newest is copied
    /// and let go while the answer is read. Was BROKEN (found by a review):
    /// each frame was kept, with the buffer behind it, until the end.
    #[tokio::test]
    async fn tiny_frames_do_not_hold_their_buffers() {
        let frames = 200;
        let held = Arc::new(Mutex::new(VecDeque::new()));
        let body = Slices {
            parents: (0..frames)
                .map(|i| Bytes::from(vec![b'a' + (i % 26) as u8; 4096]))
                .collect(),
            next: 0,
            held: held.clone(),
        };
        let ResponseBody::Whole(read) = read_response(boxed(body), 1 << 20).await else {
            panic!("the answer is under the limit");
        };
        let expected: Vec<u8> = (0..frames).map(|i| b'a' + (i % 26) as u8).collect();
        assert_eq!(&read[..], &expected[..]);
        let held = held.lock().unwrap();
        assert!(
            held.is_empty(),
            "buffers still held: {:?}",
            held.iter().take(5).collect::<Vec<_>>()
        );
    }
}
