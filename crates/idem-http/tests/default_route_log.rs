//! The once-per-route warning for routes claimed under the default rule,
//! in a test binary of its own: tracing caches whether a log line is
//! wanted the first time any thread reaches it, so a test that captures
//! logs with a scoped subscriber must not share its process with tests
//! that reach the same line without one.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::sync::Arc;

use axum::Router;
use axum::routing::post;
use http::Request;
use idem_core::MemoryStore;
use idem_http::{IdempotencyLayer, RouteRule};
use tower::ServiceExt;

/// A log line's sink.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A route no rule names (here `/login/{user}`, next to a named `/pay`)
/// is claimed under the default rule; the layer says so, once per route,
/// naming the route as the router registered it.
#[tokio::test]
async fn a_route_under_the_default_rule_is_logged_once() {
    let logs = Captured::default();
    let sink = logs.clone();
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .finish(),
    );
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .route(RouteRule::post("/pay"))
        .build();
    let app = Router::new()
        .route("/pay", post(|| async { (http::StatusCode::CREATED, "{}") }))
        .route(
            "/login/{user}",
            post(|| async { (http::StatusCode::CREATED, "{}") }),
        )
        .route_layer(layer);
    for (n, path) in ["/pay", "/login/ann", "/login/bob", "/pay"]
        .into_iter()
        .enumerate()
    {
        let request = Request::post(path)
            .header("idempotency-key", format!("route-log-key-{n:08}"))
            .header("content-type", "application/json")
            .body(axum::body::Body::from("{}"))
            .unwrap();
        let answer = app.clone().oneshot(request).await.unwrap();
        assert_eq!(answer.status(), 201);
    }
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<_> = text
        .lines()
        .filter(|l| l.contains("no RouteRule names this route"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(lines[0].contains("/login/{user}"), "{}", lines[0]);
    assert!(lines[0].contains("POST"), "{}", lines[0]);
}
