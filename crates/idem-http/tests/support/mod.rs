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
use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Fence, Key, MemoryStore, Record, RecordId, Scope,
    Settled, StaleCursor, Store, StoreError, StoreErrorKind, Timestamp,
};
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

/// A store in front of another that can be switched off: while it is
/// down, every operation fails as unavailable without reaching the inner
/// store.
pub struct SwitchStore {
    inner: Arc<dyn Store>,
    down: std::sync::atomic::AtomicBool,
}

impl SwitchStore {
    /// Up, in front of `inner`.
    pub fn new(inner: Arc<dyn Store>) -> SwitchStore {
        SwitchStore {
            inner,
            down: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Down for good.
    pub fn down() -> SwitchStore {
        let s = SwitchStore::new(Arc::new(MemoryStore::new()));
        s.set_down(true);
        s
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "test store is down",
            ))
        } else {
            Ok(())
        }
    }
}

impl Store for SwitchStore {
    fn claim<'a>(&'a self, r: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            self.check()?;
            self.inner.claim(r).await
        })
    }
    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        c: Completion,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(async move {
            self.check()?;
            self.inner.complete(id, fence, c, now).await
        })
    }
    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(async move {
            self.check()?;
            self.inner.release(id, fence, now).await
        })
    }
    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            self.check()?;
            self.inner.get(id, now).await
        })
    }
    fn purge_expired(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(async move {
            self.check()?;
            self.inner.purge_expired(now, limit).await
        })
    }
    fn list_stale<'a>(
        &'a self,
        now: Timestamp,
        after: Option<&'a idem_core::StaleCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        Box::pin(async move {
            self.check()?;
            self.inner.list_stale(now, after, limit).await
        })
    }
    fn find_by_key<'a>(
        &'a self,
        scope: &'a idem_core::Scope,
        key: &'a idem_core::Key,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        Box::pin(async move {
            self.check()?;
            self.inner.find_by_key(scope, key, now, limit).await
        })
    }
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

/// A store whose claims never answer.
pub struct StalledStore;

impl Store for StalledStore {
    fn claim<'a>(&'a self, _: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(std::future::pending())
    }
    fn complete<'a>(
        &'a self,
        _: &'a RecordId,
        _: Fence,
        _: Completion,
        _: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(std::future::pending())
    }
    fn release<'a>(
        &'a self,
        _: &'a RecordId,
        _: Fence,
        _: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        Box::pin(std::future::pending())
    }
    fn get<'a>(
        &'a self,
        _: &'a RecordId,
        _: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(std::future::pending())
    }
    fn purge_expired(&self, _: Timestamp, _: usize) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(std::future::pending())
    }
    fn list_stale<'a>(
        &'a self,
        _: Timestamp,
        _: Option<&'a StaleCursor>,
        _: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        Box::pin(std::future::pending())
    }
    fn find_by_key<'a>(
        &'a self,
        _: &'a Scope,
        _: &'a Key,
        _: Timestamp,
        _: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        Box::pin(std::future::pending())
    }
}
