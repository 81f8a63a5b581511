//! The admin listener: `/metrics`, `/healthz`, `/readyz`, and
//! `/openapi.json` (the OpenAPI document of what the gateway adds to any
//! API, `crates/idem/openapi/idem-gateway.json`).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::routing::get;
use idem_core::{Key, Operation, RecordId, Scope, Store, Timestamp};
use idem_http::LayerHandle;
use metrics_exporter_prometheus::PrometheusHandle;

/// The OpenAPI 3.1 document, as kept in the repository.
const OPENAPI_JSON: &str = include_str!("../openapi/idem-gateway.json");

#[derive(Clone)]
struct Admin {
    store: Arc<dyn Store>,
    prometheus: PrometheusHandle,
    layer: LayerHandle,
}

pub(crate) fn router(
    store: Arc<dyn Store>,
    prometheus: PrometheusHandle,
    layer: LayerHandle,
) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(a): State<Admin>| async move { a.prometheus.render() }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route(
            "/openapi.json",
            get(|| async { ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON) }),
        )
        .with_state(Admin {
            store,
            prometheus,
            layer,
        })
}

/// Ready when the store answers a read within 2 s and new claims do not
/// wait for the store's epoch check (after a request met the store down,
/// until the watch has checked that it did not come back empty: about a
/// check interval, 1 s, plus the store timeout once the store answers
/// again). A store that does not answer is reported first, with its
/// error.
async fn ready(State(a): State<Admin>) -> (StatusCode, String) {
    let Ok(key) = Key::new("readiness-probe-0000") else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "probe key\n".into());
    };
    let id = RecordId::new(
        Scope::from_raw("idem-readyz"),
        Operation::new("GET", "/readyz"),
        key,
    );
    match tokio::time::timeout(Duration::from_secs(2), a.store.get(&id, Timestamp::now())).await {
        Ok(Ok(_)) if a.layer.awaiting_store_check() => (
            StatusCode::SERVICE_UNAVAILABLE,
            "store unavailable: new claims wait for the check of the store's epoch \
             (the store was met down and is not yet checked since)\n"
                .into(),
        ),
        Ok(Ok(_)) => (StatusCode::OK, "ready\n".into()),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("store unavailable: {e}\n"),
        ),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "store did not answer in 2s\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicBool, Ordering};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use idem_core::{MemoryStore, StoreError, StoreErrorKind};
    use idem_http::{IdempotencyLayer, RouteRule};
    use idem_testkit::{Door, Fault, FaultyStore, StoreOp};
    use metrics_exporter_prometheus::PrometheusBuilder;
    use tokio_util::sync::CancellationToken;
    use tower::{Layer, ServiceExt};

    use super::*;

    async fn readyz(admin: &Router) -> (StatusCode, String) {
        let request = axum::http::Request::get("/readyz")
            .body(axum::body::Body::empty())
            .expect("a request");
        let answer = admin.clone().oneshot(request).await.expect("an answer");
        let status = answer.status();
        let body = answer.into_body().collect().await.expect("a body");
        (
            status,
            String::from_utf8_lossy(&body.to_bytes()).into_owned(),
        )
    }

    /// After a request met the store down, new claims wait for the
    /// watch's check of the store's epoch, however well the store answers
    /// meanwhile: `/readyz` says so (503) until the check passes, then
    /// answers 200 again; while the store is down, it gives the store's
    /// error. The check is held at a door to keep the moment open.
    #[tokio::test]
    async fn not_ready_while_new_claims_wait_for_the_stores_check() {
        let down = Arc::new(AtomicBool::new(false));
        let is_down = down.clone();
        let door = Door::new();
        let held = door.clone();
        let store = Arc::new(FaultyStore::with_faults(
            Arc::new(MemoryStore::new()),
            move |call| match call.op {
                StoreOp::AdvanceEpoch if call.nth > 0 => Fault::Hold(held.clone()),
                StoreOp::Claim | StoreOp::Get if is_down.load(Ordering::SeqCst) => Fault::Fail(
                    StoreError::new(StoreErrorKind::Unavailable, "injected: down"),
                ),
                _ => Fault::Pass,
            },
        ));
        let layer = IdempotencyLayer::builder_shared(store.clone())
            .route(RouteRule::post("/pay"))
            .build();
        let handle = layer.handle();
        let app = layer.layer(tower::service_fn(
            |_: axum::http::Request<idem_http::Body>| async {
                Ok::<_, Infallible>(
                    axum::http::Response::builder()
                        .status(201)
                        .body(Full::new(Bytes::from_static(b"{}")))
                        .expect("a response"),
                )
            },
        ));
        let watch = handle.store_watch().interval(Duration::from_secs(3600));
        watch.check_once().await.expect("the first check");
        let stop = CancellationToken::new();
        let running = watch.spawn(stop.clone());
        // The watch runs once its first check has begun (it waits at the
        // door): only a running watch gates claims.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while store.calls(StoreOp::AdvanceEpoch) < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the watch never ran"
            );
            tokio::task::yield_now().await;
        }
        let prometheus = PrometheusBuilder::new().build_recorder().handle();
        let admin = router(store.clone(), prometheus, handle.clone());
        assert_eq!(readyz(&admin).await.0, StatusCode::OK);

        down.store(true, Ordering::SeqCst);
        let met_down = app
            .clone()
            .oneshot(
                axum::http::Request::post("/pay")
                    .header("idempotency-key", "met-the-store-down")
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from_static(b"{}")))
                    .expect("a request"),
            )
            .await
            .expect("an answer");
        assert_eq!(met_down.status(), StatusCode::SERVICE_UNAVAILABLE);
        // While the store is down, that is what `/readyz` says.
        let (status, body) = readyz(&admin).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body.contains("injected: down"), "{body}");
        down.store(false, Ordering::SeqCst);

        // The store answers reads again; the check is held at the door.
        let (status, body) = readyz(&admin).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body.contains("check of the store's epoch"), "{body}");

        door.open();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while handle.awaiting_store_check() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the check never passed"
            );
            tokio::task::yield_now().await;
        }
        assert_eq!(readyz(&admin).await.0, StatusCode::OK);
        stop.cancel();
        running.await.expect("the watch ends");
    }
}
