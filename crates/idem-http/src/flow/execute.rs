//! Executing: the inner service called once, in the layer's task, under
//! the shutdown; its answer read (up to the response limit) and handed to
//! settling.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::StreamExt;
use http::{Request, Response, header};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use idem_core::{Completion, Disposition, Fingerprint, Lease, RecordId, Takeover};

use super::execution::Claimed;
use super::execution::{Call, Ended, OutcomeUnknown, UnverifiedEnd};
use super::heartbeat::beating;
use super::not_stored::{NotStored, not_stored};
use super::release::release;
use super::settle::{abandon, complete, finish, hold, settle_release};
use crate::body::{Body, BoxError, full_with_trailers};
use crate::context::IdempotencyContext;
use crate::grpc;
use crate::metrics::Outcome;
use crate::rejection::Rejection;
use crate::replay::{set_expires, to_stored};
use crate::rule::RouteRule;
use crate::shared::Shared;

/// Calls the handler, runs its future to the end and settles the record;
/// returns the answer with its outcome.
pub(super) async fn execute<E>(
    shared: Arc<Shared>,
    inner: Call<E>,
    request: Request<Body>,
    ctx: IdempotencyContext,
    rule: Arc<RouteRule>,
    lease: Lease,
    fingerprint: Fingerprint,
) -> Ended<Result<Response<Body>, E>> {
    let token = shared.in_progress.begin(&shared.meters);
    let id = ctx.id().clone();
    let claim = Claimed {
        lease,
        fingerprint,
        lease_length: rule.policy.lease(),
        keep_claim: lease.takeover && rule.policy.takeover() == Takeover::Announce,
    };
    // Past the shutdown's grace the layer cancels executions. One claimed
    // since then has not reached the inner service: its claim is given
    // back, in either mode (a hold would keep a key that never ran until
    // its lease ends).
    if shared.shutdown.is_cancelled() {
        let abandoned = abandon(&shared, &id, claim, token, Rejection::ShuttingDown).await;
        return (claim.released(), Ok(abandoned));
    }
    tracing::debug!(key = %id.key.log_id(), fence = lease.fence.get(), takeover = lease.takeover, "executing");
    let head_request = request.method() == http::Method::HEAD;
    let call = inner(request);
    // The claim's lease is renewed while the handler runs and while its
    // answer is read: a long execution is never taken over beside itself.
    let outcome = tokio::select! {
        biased;
        () = shared.shutdown.cancelled() => None,
        r = beating(&shared, &id, claim, AssertUnwindSafe(call).catch_unwind()) => Some(r),
    };
    let response = match outcome {
        None if shared.settings.hold_unknown_outcomes => {
            let held = hold(&shared, &id, lease, token, Rejection::ShuttingDown);
            return (Outcome::Held, Ok(held));
        }
        None => {
            let abandoned = abandon(&shared, &id, claim, token, Rejection::ShuttingDown).await;
            return (claim.released(), Ok(abandoned));
        }
        Some(Err(_panic)) => {
            tracing::error!(key = %id.key.log_id(), "handler panicked; claim released");
            let abandoned = abandon(&shared, &id, claim, token, Rejection::HandlerFailed).await;
            return (claim.released(), Ok(abandoned));
        }
        Some(Ok(Err(e))) => {
            settle_release(&shared, &id, claim, token).await;
            return (claim.released(), Err(e));
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
        beating(
            &shared,
            &id,
            claim,
            read_response(body, shared.settings.response_limit),
        )
        .await
    };
    let (body, trailers) = match read {
        ResponseBody::Whole(bytes, trailers) => (bytes, trailers),
        ResponseBody::NotStorable(streamed, why) => {
            // Executed, but not kept: the client still gets it whole, and
            // a retry learns from the record what happened.
            let outcome = if ctx.is_completed() {
                Outcome::Executed
            } else {
                let placeholder = not_stored(parts.status, why, shared.settings.response_limit);
                // A gRPC answer's status is in its trailers, which are
                // still to come: its HTTP status is all there is.
                let completion = match rule.policy.disposition(parts.status.as_u16()) {
                    Disposition::Release => None,
                    Disposition::Fail => Some(Completion::failed(placeholder)),
                    Disposition::Complete => Some(Completion::completed(placeholder)),
                };
                match completion.map(|c| with_resource(c, &ctx)) {
                    Some(c) => beating(&shared, &id, claim, complete(&shared, &id, claim, c)).await,
                    None => {
                        release(&shared, &id, claim).await;
                        claim.released()
                    }
                }
            };
            finish(&shared, &id, token, outcome);
            set_expires(&mut parts.headers, lease.expires_at);
            return (outcome, Ok(Response::from_parts(parts, streamed)));
        }
        ResponseBody::Failed => {
            let (outcome, answer) =
                unknown_outcome(&shared, &id, claim, token, "response body failed").await;
            return (outcome, Ok(answer));
        }
    };

    // A gRPC answer settles by its grpc-status, an HTTP one by its status.
    let settling = grpc::settling_status(parts.status, &parts.headers, trailers.as_ref());
    if settling.is_none() && !ctx.is_completed() {
        // A gRPC answer that ended without a status: something on the way
        // (an HTTP/1.1 hop) may have dropped its trailers, so the call may
        // well have succeeded. Its outcome is unknown, as for a failed body.
        let (outcome, answer) =
            unknown_outcome(&shared, &id, claim, token, "gRPC answer without a status").await;
        return (outcome, Ok(answer));
    }
    let outcome = if ctx.is_completed() {
        Outcome::Executed
    } else {
        let stored = || {
            to_stored(
                parts.status,
                &parts.headers,
                &body,
                trailers.as_ref(),
                &rule.extra_headers,
            )
        };
        match rule.policy.disposition(settling.unwrap_or_default()) {
            // The lease is renewed while the completion is retried too.
            Disposition::Complete => {
                let c = with_resource(Completion::completed(stored()), &ctx);
                beating(&shared, &id, claim, complete(&shared, &id, claim, c)).await
            }
            Disposition::Fail => {
                let c = with_resource(Completion::failed(stored()), &ctx);
                beating(&shared, &id, claim, complete(&shared, &id, claim, c)).await
            }
            Disposition::Release => {
                release(&shared, &id, claim).await;
                claim.released()
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
    (
        outcome,
        Ok(Response::from_parts(
            parts,
            full_with_trailers(body, trailers),
        )),
    )
}

/// An answer whose outcome is unknown (`what` says why): its claim held
/// until its lease ends, or released where the layer does not hold
/// unknown outcomes (a handler in process stopped: nothing runs on).
async fn unknown_outcome(
    shared: &Arc<Shared>,
    id: &RecordId,
    claim: Claimed,
    token: u64,
    what: &str,
) -> (Outcome, Response<Body>) {
    if shared.settings.hold_unknown_outcomes {
        tracing::error!(key = %id.key.log_id(), "{what}; the claim is held until its lease ends");
        let held = hold(shared, id, claim.lease, token, Rejection::OutcomeUnknown);
        return (Outcome::Held, held);
    }
    tracing::error!(key = %id.key.log_id(), "{what}; claim released");
    let abandoned = abandon(shared, id, claim, token, Rejection::HandlerFailed).await;
    (claim.released(), abandoned)
}

/// `completion` with the resource id the handler named, if it named one.
fn with_resource(completion: Completion, ctx: &IdempotencyContext) -> Completion {
    match ctx.resource_id() {
        Some(id) => completion.with_resource_id(id),
        None => completion,
    }
}

/// A handler's response body, read up to the layer's response limit.
pub(super) enum ResponseBody {
    /// All of it, and its trailers if it had any.
    Whole(Bytes, Option<http::HeaderMap>),
    /// Not to be stored: over the limit (what was read, followed by the
    /// rest, still to stream), or of an end that cannot be verified.
    NotStorable(Body, NotStored),
    /// The body failed (or stalled past a deadline the service set).
    Failed,
}

pub(super) async fn read_response(mut body: Body, limit: usize) -> ResponseBody {
    // The first frame is kept as it came (most answers are one); from the
    // second on, frames are copied into one buffer: each `Bytes` of a
    // chunked answer holds a slice of the client's read buffer, so keeping
    // thousands of one-byte frames would cost tens of times the limit.
    let mut first: Option<Bytes> = None;
    let mut joined = bytes::BytesMut::new();
    let mut trailers: Option<http::HeaderMap> = None;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return ResponseBody::Failed;
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                // Trailers end the body: kept (all of them, should a body
                // send two blocks) for storing and for the first answer.
                if let Ok(t) = frame.into_trailers() {
                    trailers.get_or_insert_with(http::HeaderMap::new).extend(t);
                }
                continue;
            }
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
    ResponseBody::Whole(first.unwrap_or_else(|| joined.freeze()), trailers)
}
