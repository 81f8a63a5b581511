//! One request through the contract, phase by phase: admit (key, scope,
//! body, fingerprint: [`admit`]), claim or wait (a new claim executes; a
//! finished record is replayed, a mismatch or a claim in flight refused:
//! [`claim`]), execute (the inner service, in a task of its own:
//! [`execute`]), and settle (the answer stored, the key released or held:
//! [`settle`]). This module runs the phases in order; each refusal on the
//! way is counted and rendered by [`Shared::reject`].

mod admit;
mod claim;
mod execute;
mod execution;
mod heartbeat;
mod not_stored;
mod release;
mod settle;
#[cfg(test)]
mod tests;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderValue, Request, Response, StatusCode, header, request::Parts};
use idem_core::{Fingerprint, RecordId, Takeover};
use tracing::Instrument;

use crate::body::{Body, BoxError, boxed, full};
use crate::context::IdempotencyContext;
use crate::key_header::IDEM_TAKEOVER;
use crate::metrics::Outcome;
use crate::rejection::Rejection;
use crate::shared::Shared;
pub(crate) use execution::Call;

pub use execution::{OutcomeUnknown, UnverifiedEnd};

/// One request through the layer; `grpc` says whether it is a gRPC call
/// (its media type, read once by the service).
pub(crate) async fn handle<B, E>(
    shared: Arc<Shared>,
    inner: Call<E>,
    req: Request<B>,
    grpc: bool,
) -> Result<Response<Body>, E>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    E: Send + 'static,
{
    let (mut parts, body) = req.into_parts();
    // `Idem-Takeover` is the layer's to set, never the client's: removed
    // from every request, keyed or not.
    parts.headers.remove(IDEM_TAKEOVER);
    let pass =
        |inner: Call<E>, parts: Parts, body: B| inner(Request::from_parts(parts, boxed(body)));
    let route = matched_route(&parts);
    let Some(rule) = shared
        .settings
        .rule_for_route(&parts.method, parts.uri.path(), route)
    else {
        return pass(inner, parts, body).await;
    };
    if let Some(route) = route {
        shared.note_default_route(&rule, &parts.method, route);
    }

    let id = match admit::record_id(&shared, &rule, &parts) {
        admit::Admission::Keyed(id) => id,
        admit::Admission::Pass => return pass(inner, parts, body).await,
        admit::Admission::Refused(answer) => return Ok(*answer),
    };

    // From here on the request is keyed: it ends with one debug event.
    let started = Instant::now();

    // The body, bounded in size and time.
    let limit = rule.body_limit.unwrap_or(shared.settings.body_limit);
    let bytes =
        match admit::read_body(body, &parts.headers, limit, shared.settings.body_timeout).await {
            Ok(b) => b,
            Err(r) => {
                let outcome = r.outcome();
                return Ok(ended(
                    &id,
                    started,
                    outcome,
                    admit::reject_and_close(&shared, r),
                ));
            }
        };
    if grpc && crate::grpc::has_compressed_message(&bytes) {
        let r = Rejection::CompressedMessage;
        return Ok(ended(&id, started, r.outcome(), shared.reject(r)));
    }
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

    let lease = match claim::claim_or_wait(&shared, &rule, &id, fingerprint, &legacy).await {
        Ok(lease) => lease,
        Err((outcome, response)) => return Ok(ended(&id, started, outcome, response)),
    };
    // Execute in a task of our own: a client that hangs up drops this
    // future, not the handler.
    let announced = lease.takeover && rule.policy.takeover() == Takeover::Announce;
    if announced && let Ok(key) = HeaderValue::from_str(id.key.as_str()) {
        parts.headers.insert(IDEM_TAKEOVER, key);
    }
    // A keyed gRPC call runs to its end whatever its client's deadline
    // (as any keyed request outlives its client): a service that enforced
    // `grpc-timeout` could stop it half done and answer DEADLINE_EXCEEDED,
    // which releases the key for a second run.
    if grpc {
        parts.headers.remove(crate::grpc::GRPC_TIMEOUT);
    }
    let ctx = IdempotencyContext::new(id.clone(), lease.fence, lease.expires_at, announced);
    let mut request = Request::from_parts(parts, full(bytes));
    request.extensions_mut().insert(ctx.clone());
    // The task runs in the caller's span, so that a span of the stack
    // around this layer (a TraceLayer, OpenTelemetry) covers the handler.
    // It logs the request's end itself: a client that hangs up drops the
    // wait below, not the execution, and its end is still logged.
    // Boxed: the task's future is moved several times on its way into the
    // runtime, and the execution's state is a few kilobytes.
    let execution = Box::pin(execute::execute(
        shared.clone(),
        inner,
        request,
        ctx,
        rule,
        lease,
        fingerprint,
    ));
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
                    shared_for_panic.reject(Rejection::HandlerFailed),
                )),
            }
        }
        .in_current_span(),
    );
    // The task catches every panic; a join error is a cancelled runtime.
    task.await
        .unwrap_or_else(|_| Ok(shared.reject(Rejection::HandlerFailed)))
}

/// The one event per keyed request, at debug: its operation (method and
/// route), outcome, status (none when the inner service failed) and
/// duration. The key appears only as its short hash.
pub(super) fn log_end(
    id: &RecordId,
    started: Instant,
    outcome: Outcome,
    status: Option<StatusCode>,
) {
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

/// The route the router matched the request to (axum's `MatchedPath`,
/// present under `route_layer` or inside a route), if any.
#[cfg(feature = "axum")]
fn matched_route(parts: &Parts) -> Option<&str> {
    parts
        .extensions
        .get::<axum::extract::MatchedPath>()
        .map(axum::extract::MatchedPath::as_str)
}

#[cfg(not(feature = "axum"))]
fn matched_route(_: &Parts) -> Option<&str> {
    None
}
