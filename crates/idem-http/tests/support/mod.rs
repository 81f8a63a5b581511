//! Shared helpers: a test service behind the layer on a real port, and
//! store factories for every backend.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idem_core::{Claim, ClaimRequest, Completion, MemoryStore, RecordId, Store, Timestamp};
use idem_http::{IdempotencyLayer, IdempotencyLayerBuilder, LayerHandle};
use idem_testkit::{CleanupOnDrop, Guarded};
use tokio::sync::{Notify, Semaphore};

/// What the test service counts and how tests steer it.
pub struct Probe {
    pub executions: AtomicUsize,
    /// Handlers on `/gated` wait for a permit here.
    pub gate: Semaphore,
    /// Notified when a `/gated` handler starts.
    pub started: Notify,
    /// Notified when a `/gated` handler returns.
    pub finished: Notify,
}

impl Default for Probe {
    fn default() -> Probe {
        Probe {
            executions: AtomicUsize::new(0),
            gate: Semaphore::new(0),
            started: Notify::new(),
            finished: Notify::new(),
        }
    }
}

pub struct App {
    pub base: String,
    pub probe: Arc<Probe>,
    pub handle: LayerHandle,
    pub client: reqwest::Client,
}

impl App {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn executions(&self) -> usize {
        self.probe.executions.load(Ordering::SeqCst)
    }

    /// A POST with a key and a JSON body.
    pub fn post(&self, path: &str, key: &str, body: &str) -> reqwest::RequestBuilder {
        self.client
            .post(self.url(path))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body.to_owned())
    }
}

async fn orders(State(p): State<Arc<Probe>>, headers: HeaderMap, body: String) -> Response {
    let n = p.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let tenant = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("anonymous")
        .to_owned();
    let mut r = (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "order": n, "tenant": tenant, "echo": body }).to_string(),
    )
        .into_response();
    r.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/orders/{n}")).unwrap(),
    );
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("session=do-not-replay"),
    );
    r
}

async fn gated(State(p): State<Arc<Probe>>) -> Response {
    let n = p.executions.fetch_add(1, Ordering::SeqCst) + 1;
    p.started.notify_one();
    let permit = p.gate.acquire().await.expect("gate open");
    permit.forget();
    p.finished.notify_one();
    (StatusCode::CREATED, format!("gated {n}")).into_response()
}

async fn status(State(p): State<Arc<Probe>>, Path(code): Path<u16>) -> Response {
    let n = p.executions.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::from_u16(code).unwrap(),
        format!("status {code} run {n}"),
    )
        .into_response()
}

async fn panics(State(p): State<Arc<Probe>>) -> Response {
    p.executions.fetch_add(1, Ordering::SeqCst);
    panic!("handler bug")
}

/// The test service: `/orders` (201 JSON), `/gated` (waits for the gate),
/// `/status/{code}`, `/panic`, `/ping` (GET).
pub fn router(probe: Arc<Probe>) -> Router {
    Router::new()
        .route("/orders", post(orders))
        .route("/gated", post(gated))
        .route("/status/{code}", post(status))
        .route("/panic", post(panics))
        .route("/ping", get(|| async { "pong" }))
        .with_state(probe)
}

/// Serves `router` behind the layer on 127.0.0.1:0.
pub async fn spawn_app(
    store: Arc<dyn Store>,
    configure: impl FnOnce(IdempotencyLayerBuilder) -> IdempotencyLayerBuilder,
) -> App {
    let probe = Arc::new(Probe::default());
    let layer: IdempotencyLayer = configure(IdempotencyLayer::builder_shared(store)).build();
    let handle = layer.handle();
    let app = router(probe.clone()).layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    App {
        base: format!("http://{addr}"),
        probe,
        handle,
        client: reqwest::Client::new(),
    }
}

/// A fresh random key.
pub fn key() -> String {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "test-key-{}-{:08}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Claims `id` with fingerprint `fingerprint` and completes it with a 201
/// "from the old release", as a gateway of an older release would have
/// (for records of fingerprint version 1); gives the claim request.
pub async fn complete_as_an_old_release(
    store: &dyn Store,
    id: &RecordId,
    fingerprint: idem_core::Fingerprint,
) -> ClaimRequest {
    let now = Timestamp::now();
    let req = ClaimRequest {
        id: id.clone(),
        fingerprint,
        now,
        lease: std::time::Duration::from_secs(30),
        ttl: std::time::Duration::from_secs(3600),
    };
    let Claim::Acquired(lease) = store.claim(&req).await.unwrap() else {
        panic!("fresh key")
    };
    let stored = idem_core::StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), b"text/plain".to_vec())],
        body: b"from the old release".to_vec(),
        trailers: Vec::new(),
    };
    let _ = store
        .complete(id, lease.fence, Completion::completed(stored), now)
        .await
        .unwrap();
    req
}

pub async fn memory() -> Option<Arc<dyn Store>> {
    Some(Arc::new(MemoryStore::new()))
}

pub async fn sqlite() -> Option<Arc<dyn Store>> {
    let dir = tempfile::tempdir().unwrap();
    let store = idem_sqlite::SqliteStore::open(dir.path().join("http.db")).unwrap();
    Some(Arc::new(Guarded::new(store, dir)))
}

pub async fn postgres() -> Option<Arc<dyn Store>> {
    let url = idem_testkit::backend_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL")?;
    static N: AtomicUsize = AtomicUsize::new(0);
    let schema = format!(
        "idem_http_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let store = idem_postgres::PostgresStore::builder(url)
        .schema(schema)
        .pool_size(8)
        .connect()
        .await
        .unwrap();
    let dropper = store.clone();
    Some(Arc::new(Guarded::new(
        store,
        CleanupOnDrop::new(move || async move {
            let _ = dropper.drop_schema().await;
        }),
    )))
}

pub async fn redis() -> Option<Arc<dyn Store>> {
    let url = idem_testkit::backend_url("IDEM_TEST_REDIS_URL", "Redis")?;
    static N: AtomicUsize = AtomicUsize::new(0);
    let prefix = format!(
        "idem-http-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let store = idem_redis::RedisStore::builder(url)
        .prefix(prefix)
        .connect()
        .await
        .unwrap();
    let cleaner = store.clone();
    Some(Arc::new(Guarded::new(
        store,
        CleanupOnDrop::new(move || async move {
            let _ = cleaner.delete_all().await;
        }),
    )))
}
