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
use metrics_exporter_prometheus::PrometheusHandle;

/// The OpenAPI 3.1 document, as kept in the repository.
const OPENAPI_JSON: &str = include_str!("../openapi/idem-gateway.json");

#[derive(Clone)]
struct Admin {
    store: Arc<dyn Store>,
    prometheus: PrometheusHandle,
}

pub(crate) fn router(store: Arc<dyn Store>, prometheus: PrometheusHandle) -> Router {
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
        .with_state(Admin { store, prometheus })
}

/// Ready when the store answers a read within 2 s.
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
