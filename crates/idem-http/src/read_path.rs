//! The reconciliation read path: a client asks what became of its key.
//!
//! [`ReadPath`] is a service that answers `GET <prefix>/{key}` with the
//! caller's own record as JSON ([`RecordView`]): the key and the caller's
//! credential (or scope headers, as the layer derives them) are enough;
//! `?method=POST&path=/transfers/7` picks one operation when the key was
//! used on several, otherwise the newest record is shown. Other methods
//! get 405. Mount it next to the protected routes but outside the layer,
//! e.g. with axum (routes added after `.route_layer` are not wrapped by it):
//!
//! ```ignore
//! let read_path = layer.read_path();
//! Router::new().route(...).route_layer(layer).route_service("/_idem/records/{key}", read_path)
//! ```
//!
//! Records of the anonymous scope (callers without a credential) are not
//! served unless [`ReadPath::anonymous_reads`] allows it: anyone could read
//! them.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use base64::Engine;
use http::{Method, Request, Response, StatusCode};
use idem_core::{Key, Record, RecordId, Scope, Status, Store, StoreError, Timestamp};
use serde::Serialize;

use crate::body::{Body, full};
use crate::metrics::StoreOp;
use crate::problem::Problem;
use crate::rejection::Rejection;
use crate::shared::{Shared, store_call};

/// A record as JSON for its owner: status, resource id, expiry, and the
/// stored response. The fingerprint and fence are internal and left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecordView {
    /// The key.
    pub key: String,
    /// The operation (`POST /transfers`).
    pub operation: String,
    /// `in_progress`, `completed` or `failed`.
    pub status: &'static str,
    /// What the operation created, if the handler said.
    pub resource_id: Option<String>,
    /// RFC 3339 would need a date library; this is the HTTP-date the
    /// `Idempotency-Key-Expires` header carries.
    pub expires_at: String,
    /// Milliseconds since the Unix epoch, for machines.
    pub expires_at_ms: i64,
    /// The stored response, once finished.
    pub response: Option<ResponseView>,
}

/// A stored response as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResponseView {
    /// Status code.
    pub status: u16,
    /// Stored headers; values that are not UTF-8 are left out.
    pub headers: Vec<(String, String)>,
    /// The body as text when it is UTF-8.
    pub body: Option<String>,
    /// The body in base64 when it is not UTF-8.
    pub body_base64: Option<String>,
}

impl From<&Record> for RecordView {
    fn from(r: &Record) -> RecordView {
        RecordView {
            key: r.id.key.as_str().to_owned(),
            operation: r.id.operation.as_str().to_owned(),
            status: r.status.as_str(),
            resource_id: r.resource_id.clone(),
            expires_at: crate::replay::http_date(r.expires_at).unwrap_or_default(),
            expires_at_ms: r.expires_at.as_millis(),
            response: r
                .response
                .as_ref()
                .filter(|_| r.status != Status::InProgress)
                .map(|s| {
                    let text = std::str::from_utf8(&s.body).ok().map(str::to_owned);
                    ResponseView {
                        status: s.status,
                        headers: s
                            .headers
                            .iter()
                            .filter_map(|(n, v)| {
                                Some((n.clone(), String::from_utf8(v.clone()).ok()?))
                            })
                            .collect(),
                        body_base64: text
                            .is_none()
                            .then(|| base64::engine::general_purpose::STANDARD.encode(&s.body)),
                        body: text,
                    }
                }),
        }
    }
}

/// Reads the caller's own record: the scope in `id` must come from the
/// caller's credential, as the layer derives it.
///
/// # Errors
/// [`StoreError`] when the store does not answer.
pub async fn lookup(store: &dyn Store, id: &RecordId) -> Result<Option<RecordView>, StoreError> {
    Ok(store
        .get(id, Timestamp::now())
        .await?
        .as_ref()
        .map(RecordView::from))
}

/// The read path as a service: `GET <prefix>/{key}` answers the caller's
/// own record as JSON ([`RecordView`]), found by the key and the caller's
/// scope alone; `?method=&path=` picks one operation. Records of the
/// anonymous scope are refused (401) unless [`ReadPath::anonymous_reads`].
/// Built by [`IdempotencyLayer::read_path`](crate::IdempotencyLayer::read_path),
/// so it derives scopes and operations exactly as the layer does.
#[derive(Clone)]
pub struct ReadPath {
    shared: Arc<Shared>,
    anonymous_reads: bool,
}

impl std::fmt::Debug for ReadPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadPath")
            .field("anonymous_reads", &self.anonymous_reads)
            .finish_non_exhaustive()
    }
}

impl ReadPath {
    pub(crate) fn new(shared: Arc<Shared>) -> ReadPath {
        ReadPath {
            shared,
            anonymous_reads: false,
        }
    }

    /// Serve the anonymous scope's records too. Default off.
    pub fn anonymous_reads(mut self, allow: bool) -> ReadPath {
        self.anonymous_reads = allow;
        self
    }

    async fn answer(self, parts: http::request::Parts) -> Response<Body> {
        match self.find(&parts).await {
            Ok(view) => {
                let body = serde_json::to_vec(&view).unwrap_or_default();
                let mut response = Response::new(full(body));
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                response
            }
            Err(problem) => problem.into_response(),
        }
    }

    async fn find(&self, parts: &http::request::Parts) -> Result<RecordView, Problem> {
        let segment = parts.uri.path().rsplit('/').next().unwrap_or("");
        let decoded = percent_encoding::percent_decode_str(segment).decode_utf8_lossy();
        // As the key header is read: bare or as an sf-string (`%22...%22`),
        // so the key as the client sent it finds its record.
        let key = Key::from_header_value(decoded.as_bytes())
            .map_err(|e| Rejection::InvalidKey(e).problem())?;
        let scope = match self.shared.settings.scope.scope_of(parts) {
            Ok(s) if s == Scope::anonymous() && !self.anonymous_reads => {
                // The same problem type as the layer's, with a detail for a
                // read: nothing runs here either way.
                return Err(Problem::idem(
                    http::StatusCode::UNAUTHORIZED,
                    "credential-required",
                    "Credential required",
                    "Records are served to the caller that made them: send the same credential (Authorization, or the scope headers) as the request with this key. This server does not serve records of anonymous callers.",
                ));
            }
            Ok(s) => s,
            Err(e) => return Err(Rejection::Scope(e).problem()),
        };
        let (mut method, mut path) = (None, None);
        for (name, value) in form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes()) {
            match &*name {
                "method" => method = Some(value.into_owned()),
                "path" => path = Some(value.into_owned()),
                _ => {}
            }
        }
        let now = Timestamp::now();
        let store = &self.shared.store;
        let found = match (method, path) {
            (Some(m), Some(p)) => {
                let method =
                    Method::from_bytes(m.to_ascii_uppercase().as_bytes()).map_err(|_| {
                        Problem::idem(
                            StatusCode::BAD_REQUEST,
                            "invalid-operation",
                            "Invalid method",
                            "?method= is not an HTTP method.",
                        )
                    })?;
                let operation = self.shared.settings.rule_for(&method, &p).map_or_else(
                    || idem_core::Operation::new(method.as_str(), &p),
                    |rule| self.shared.settings.operation(&rule, &method, &p),
                );
                let id = RecordId::new(scope, operation, key);
                store_call(&self.shared, StoreOp::Get, store.get(&id, now))
                    .await
                    .map(|r| r.into_iter().collect::<Vec<_>>())
            }
            (None, None) => {
                store_call(
                    &self.shared,
                    StoreOp::FindByKey,
                    store.find_by_key(&scope, &key, now, 1),
                )
                .await
            }
            _ => {
                return Err(Problem::idem(
                    StatusCode::BAD_REQUEST,
                    "invalid-operation",
                    "Operation incomplete",
                    "Give both ?method= and ?path=, or neither.",
                ));
            }
        };
        match found {
            Ok(records) => match records.first() {
                Some(record) => Ok(RecordView::from(record)),
                // The store lost records, or was met down and not checked
                // since: "none" may be one it forgot.
                None => match self.shared.loss_window.retry_after(Timestamp::now()) {
                    Some(retry_after) => Err(Rejection::StoreLostRecords { retry_after }.problem()),
                    None if self.shared.loss_window.awaiting_check() => {
                        Err(Rejection::StoreUnavailable {
                            retry_after: self.shared.settings.unavailable_retry_after,
                        }
                        .problem())
                    }
                    None => Err(Problem::idem(
                        StatusCode::NOT_FOUND,
                        "record-not-found",
                        "No such record",
                        "No live record for this key and credential.",
                    )),
                },
            },
            Err(e) => {
                tracing::warn!(error = %e, "record look-up failed");
                Err(Rejection::StoreUnavailable {
                    retry_after: self.shared.settings.unavailable_retry_after,
                }
                .problem())
            }
        }
    }
}

impl<B> tower::Service<Request<B>> for ReadPath {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = idem_core::BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (parts, _body) = req.into_parts();
        if parts.method != Method::GET && parts.method != Method::HEAD {
            let mut response = Problem::idem(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                "Records are read with GET.",
            )
            .into_response();
            response.headers_mut().insert(
                http::header::ALLOW,
                http::HeaderValue::from_static("GET, HEAD"),
            );
            return Box::pin(async move { Ok(response) });
        }
        let this = self.clone();
        Box::pin(async move { Ok(this.answer(parts).await) })
    }
}
