//! Small in-process servers that implement Idempotency-Key, one correct
//! and one per planted defect, on 127.0.0.1:0.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::Notify;

/// Which rule the server breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defect {
    /// None: the reference server.
    Correct,
    /// The record is found by key alone, whatever the path.
    PathUnbound,
    /// Every credential shares one key space.
    TenantsMerged,
    /// Check-then-insert: concurrent first requests all execute.
    Racy,
    /// A replayed 201 becomes 200 and loses `Location`.
    CreatedAsOk,
    /// A 5xx or 429 of the operation is stored and replayed.
    TransientCached,
    /// A request without a key is executed.
    KeyOptional,
    /// Correct, but the operation refuses fields it does not know (400).
    StrictSchema,
    /// The key is read and never used: every request executes.
    KeyIgnored,
    /// As `KeyIgnored`, and every answer names the same resource id.
    KeyIgnoredConstantId,
    /// One key space for every credential, the credential fingerprinted:
    /// another tenant's request with a used key is refused (422).
    TenantsMergedRefusing,
    /// Correct, numbering each tenant's resources on its own (tenant two's
    /// first order is id 1 too).
    IdsPerTenant,
    /// As `KeyIgnored`, and `/count` never moves (a cache, a replica).
    KeyIgnoredStaleCount,
}

#[derive(Clone)]
struct Stored {
    status: StatusCode,
    location: Option<String>,
    body: String,
    problem: bool,
}

enum Record {
    InFlight { fingerprint: String },
    Done { fingerprint: String, answer: Stored },
}

struct State {
    defect: Defect,
    records: Mutex<HashMap<(String, String, String), Record>>,
    /// First requests waiting for a duplicate to overlap with them.
    pending: Mutex<HashMap<String, Arc<Notify>>>,
    executions: AtomicU64,
    /// Executions by credential (`IdsPerTenant`).
    per_tenant: Mutex<HashMap<String, u64>>,
}

/// The server's base URL (`http://127.0.0.1:PORT`); it serves `POST` on
/// any path ending `/orders` (`/orders`, `/carts/7/orders`) and `GET
/// /count`.
pub async fn serve(defect: Defect) -> String {
    let state = Arc::new(State {
        defect,
        records: Mutex::default(),
        pending: Mutex::default(),
        executions: AtomicU64::new(0),
        per_tenant: Mutex::default(),
    });
    let count = state.clone();
    let app = Router::new()
        .route(
            "/count",
            get(move || async move {
                let n = match count.defect {
                    Defect::KeyIgnoredStaleCount => 0,
                    _ => count.executions.load(Ordering::SeqCst),
                };
                format!("{{\"count\":{n}}}")
            }),
        )
        .fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
            let state = state.clone();
            async move { handle(&state, &uri, &headers, &body).await }
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn problem(status: StatusCode, kind: &str) -> Stored {
    Stored {
        status,
        location: None,
        body: format!(
            "{{\"type\":\"urn:test:{kind}\",\"title\":\"{kind}\",\"status\":{}}}",
            status.as_u16()
        ),
        problem: true,
    }
}

fn respond(s: &Stored, replayed: bool, extra: &[(&'static str, &str)]) -> Response {
    let mut r = (s.status, s.body.clone()).into_response();
    let h = r.headers_mut();
    let media = if s.problem {
        "application/problem+json"
    } else {
        "application/json"
    };
    h.insert("content-type", HeaderValue::from_static(media));
    if let Some(l) = &s.location {
        h.insert("location", HeaderValue::from_str(l).unwrap());
    }
    if replayed {
        h.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    for (k, v) in extra {
        h.insert(*k, HeaderValue::from_str(v).unwrap());
    }
    r
}

const EXPIRES: (&str, &str) = ("idempotency-key-expires", "Sun, 06 Dec 2026 16:00:00 GMT");

async fn handle(state: &State, uri: &Uri, headers: &HeaderMap, body: &Bytes) -> Response {
    let defect = state.defect;
    if !uri.path().ends_with("/orders") {
        return respond(&problem(StatusCode::NOT_FOUND, "not-found"), false, &[]);
    }
    let value: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let Some(value) = value else {
        return respond(&problem(StatusCode::BAD_REQUEST, "bad-json"), false, &[]);
    };
    let known = |name: &String| ["sku", "qty", "fail"].contains(&name.as_str());
    if defect == Defect::StrictSchema
        && value
            .as_object()
            .is_none_or(|fields| !fields.keys().all(known))
    {
        return respond(
            &problem(StatusCode::BAD_REQUEST, "unknown-field"),
            false,
            &[],
        );
    }
    let credential = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if matches!(
        defect,
        Defect::KeyIgnored | Defect::KeyIgnoredConstantId | Defect::KeyIgnoredStaleCount
    ) {
        let mut answer = execute(state, &value, &credential);
        if defect == Defect::KeyIgnoredConstantId && answer.status.is_success() {
            answer.location = Some("/orders/1".to_owned());
            answer.body = "{\"id\":1}".to_owned();
        }
        return respond(&answer, false, &[]);
    }
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        if defect == Defect::KeyOptional {
            return respond(&execute(state, &value, &credential), false, &[]);
        }
        return respond(&problem(StatusCode::BAD_REQUEST, "key-missing"), false, &[]);
    };
    let tenant = match defect {
        Defect::TenantsMerged | Defect::TenantsMergedRefusing => String::new(),
        _ => credential.clone(),
    };
    let path = if defect == Defect::PathUnbound {
        ""
    } else {
        uri.path()
    };
    let id = (tenant, key.to_owned(), path.to_owned());
    let fingerprint = match defect {
        Defect::TenantsMergedRefusing => {
            format!("{credential}|{}|{value}", uri.query().unwrap_or(""))
        }
        _ => format!("{}|{value}", uri.query().unwrap_or("")),
    };
    if defect != Defect::Racy && !claim(state, &id, &fingerprint) {
        return answer_existing(state, &id, &fingerprint);
    }
    if defect == Defect::Racy {
        let seen = state.records.lock().unwrap().contains_key(&id);
        if seen {
            return answer_existing(state, &id, &fingerprint);
        }
    }
    // Hold the first request until a duplicate arrives (or 500 ms), so
    // that concurrent duplicates overlap with it whatever the scheduling.
    // The wait ends on the duplicate's arrival, not on time; the 500 ms
    // bound only frees a request that has no duplicate (every sequential
    // check's first request). A duplicate the probe sends at once would
    // have to be delayed past it for the race to be missed.
    overlap(state, key).await;
    let answer = execute(state, &value, &credential);
    let transient =
        answer.status.is_server_error() || answer.status == StatusCode::TOO_MANY_REQUESTS;
    let mut records = state.records.lock().unwrap();
    if transient && defect != Defect::TransientCached {
        records.remove(&id);
    } else {
        records.insert(
            id,
            Record::Done {
                fingerprint,
                answer: answer.clone(),
            },
        );
    }
    respond(&answer, false, &[EXPIRES])
}

/// Inserts an in-flight record; false when one exists.
fn claim(state: &State, id: &(String, String, String), fingerprint: &str) -> bool {
    let mut records = state.records.lock().unwrap();
    if records.contains_key(id) {
        return false;
    }
    records.insert(
        id.clone(),
        Record::InFlight {
            fingerprint: fingerprint.to_owned(),
        },
    );
    true
}

fn answer_existing(state: &State, id: &(String, String, String), fingerprint: &str) -> Response {
    if let Some(n) = state.pending.lock().unwrap().get(&id.1) {
        n.notify_one();
    }
    let records = state.records.lock().unwrap();
    match records.get(id) {
        Some(Record::InFlight { fingerprint: f }) if f == fingerprint => respond(
            &problem(StatusCode::CONFLICT, "in-flight"),
            false,
            &[("retry-after", "1"), EXPIRES],
        ),
        Some(Record::Done {
            fingerprint: f,
            answer,
        }) if f == fingerprint => {
            let mut replay = answer.clone();
            if state.defect == Defect::CreatedAsOk && replay.status == StatusCode::CREATED {
                replay.status = StatusCode::OK;
                replay.location = None;
            }
            respond(&replay, true, &[EXPIRES])
        }
        _ => respond(
            &problem(StatusCode::UNPROCESSABLE_ENTITY, "key-reused"),
            false,
            &[EXPIRES],
        ),
    }
}

async fn overlap(state: &State, key: &str) {
    let notify = {
        let mut pending = state.pending.lock().unwrap();
        if let Some(first) = pending.get(key) {
            // A duplicate (only the racy server gets here twice): wake the
            // first and run alongside it.
            first.notify_one();
            return;
        }
        let n = Arc::new(Notify::new());
        pending.insert(key.to_owned(), n.clone());
        n
    };
    let _ = tokio::time::timeout(Duration::from_millis(500), notify.notified()).await;
    state.pending.lock().unwrap().remove(key);
}

fn execute(state: &State, value: &serde_json::Value, credential: &str) -> Stored {
    if let Some(code) = value.get("fail").and_then(serde_json::Value::as_u64) {
        let status = StatusCode::from_u16(u16::try_from(code).unwrap()).unwrap();
        return problem(status, "operation-failed");
    }
    let mut id = state.executions.fetch_add(1, Ordering::SeqCst) + 1;
    if state.defect == Defect::IdsPerTenant {
        let mut per_tenant = state.per_tenant.lock().unwrap();
        let n = per_tenant.entry(credential.to_owned()).or_default();
        *n += 1;
        id = *n;
    }
    Stored {
        status: StatusCode::CREATED,
        location: Some(format!("/orders/{id}")),
        body: format!("{{\"id\":{id}}}"),
        problem: false,
    }
}
