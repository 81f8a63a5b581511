//! `IdempotencyContext` as an axum extractor (the `axum` feature), and why
//! the layer goes on with `Router::route_layer`: real axum routers on
//! 127.0.0.1:0.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use idem_core::{Key, MemoryStore, Scope, Store, Timestamp};
use idem_http::{
    IDEMPOTENCY_KEY, IDEMPOTENCY_KEY_EXPIRES, IDEMPOTENT_REPLAYED, IdempotencyContext,
    IdempotencyLayer, KeyRequirement, RouteRule, http_date,
};
use support::key;

/// What the handlers saw.
#[derive(Default)]
struct Runs(AtomicUsize);

impl Runs {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Needs the context: answers with what it holds.
async fn with_context(
    State(runs): State<Arc<Runs>>,
    ctx: IdempotencyContext,
) -> (StatusCode, String) {
    runs.0.fetch_add(1, Ordering::SeqCst);
    let body = serde_json::json!({
        "key": ctx.id().key.as_str(),
        "operation": ctx.id().operation.as_str(),
        "fence": ctx.fence().get(),
        "expires": http_date(ctx.expires_at()),
    });
    (StatusCode::CREATED, body.to_string())
}

/// Takes the context if there is one.
async fn maybe_context(
    State(runs): State<Arc<Runs>>,
    ctx: Option<IdempotencyContext>,
) -> (StatusCode, String) {
    runs.0.fetch_add(1, Ordering::SeqCst);
    let seen = ctx.map_or("none".to_owned(), |c| c.id().key.as_str().to_owned());
    (StatusCode::CREATED, seen)
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn post_keyed(base: &str, path: &str, key: &str, body: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header(IDEMPOTENCY_KEY, key)
        .header("content-type", "application/json")
        .body(body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_gets_the_claim_it_runs_under() {
    let runs = Arc::new(Runs::default());
    let app = Router::new()
        .route("/payments", post(with_context))
        .with_state(runs.clone())
        .route_layer(IdempotencyLayer::new(MemoryStore::new()));
    let base = serve(app).await;

    let k = key();
    let first = post_keyed(&base, "/payments", &k, "{}")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let expires = first.headers()[IDEMPOTENCY_KEY_EXPIRES].clone();
    let seen: serde_json::Value = serde_json::from_str(&first.text().await.unwrap()).unwrap();
    assert_eq!(seen["key"], k.as_str());
    assert_eq!(seen["operation"], "POST /payments");
    assert_eq!(seen["expires"], expires.to_str().unwrap());
    assert_eq!(runs.count(), 1);

    // The retry is answered by the layer: the handler does not run.
    let again = post_keyed(&base, "/payments", &format!("\"{k}\""), "{}")
        .send()
        .await
        .unwrap();
    assert_eq!(again.headers()[IDEMPOTENT_REPLAYED], "true");
    assert_eq!(again.text().await.unwrap(), seen.to_string());
    assert_eq!(runs.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_layer_the_extractor_is_a_500_problem_and_the_handler_does_not_run() {
    let runs = Arc::new(Runs::default());
    let app = Router::new()
        .route("/payments", post(with_context))
        .with_state(runs.clone());
    let base = serve(app).await;
    let resp = post_keyed(&base, "/payments", &key(), "{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    let problem: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:layer-missing");
    assert_eq!(problem["status"], 500);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("idempotency layer"),
        "{problem}"
    );
    assert_eq!(runs.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_optional_extractor_is_none_for_requests_the_layer_passes_through() {
    let runs = Arc::new(Runs::default());
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .route(RouteRule::post("/notes").key(KeyRequirement::Optional))
        .build();
    let app = Router::new()
        .route("/notes", post(maybe_context))
        .with_state(runs.clone())
        .route_layer(layer);
    let base = serve(app).await;

    let keyless = reqwest::Client::new()
        .post(format!("{base}/notes"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(keyless.status(), StatusCode::CREATED);
    assert_eq!(keyless.text().await.unwrap(), "none");

    let k = key();
    let keyed = post_keyed(&base, "/notes", &k, "{}").send().await.unwrap();
    assert_eq!(keyed.text().await.unwrap(), k);
    assert_eq!(runs.count(), 2);
}

/// The records a key has in the anonymous scope.
async fn records_of(store: &dyn Store, key: &str) -> usize {
    store
        .find_by_key(
            &Scope::anonymous(),
            &Key::new(key).unwrap(),
            Timestamp::now(),
            10,
        )
        .await
        .unwrap()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_route_layer_unknown_routes_are_not_claimed_or_recorded() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let routed = |layered: fn(Router, IdempotencyLayer) -> Router| {
        let runs = Arc::new(Runs::default());
        let layer = IdempotencyLayer::builder_shared(store.clone()).build();
        let app = Router::new()
            .route("/payments", post(with_context))
            .with_state(runs);
        layered(app, layer)
    };

    // route_layer: a keyed POST to a path with no route gets the router's
    // 404, no record, and the same again on a retry.
    let base = serve(routed(|app, layer| app.route_layer(layer))).await;
    let k = key();
    for _ in 0..2 {
        let resp = post_keyed(&base, "/paymnets", &k, "{}")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        assert!(resp.headers().get(IDEMPOTENCY_KEY_EXPIRES).is_none());
        assert!(resp.headers().get(IDEMPOTENT_REPLAYED).is_none());
    }
    assert_eq!(records_of(&*store, &k).await, 0);
    // Without a key, still the 404, not the layer's 400.
    let resp = reqwest::Client::new()
        .post(format!("{base}/paymnets"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    // The protected route is protected.
    let k2 = key();
    let resp = post_keyed(&base, "/payments", &k2, "{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(records_of(&*store, &k2).await, 1);

    // Router::layer, for contrast: the fallback is wrapped, so the 404 is
    // claimed, recorded as failed and replayed.
    let base = serve(routed(|app, layer| app.layer(layer))).await;
    let k = key();
    let first = post_keyed(&base, "/paymnets", &k, "{}")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::NOT_FOUND);
    assert!(first.headers().get(IDEMPOTENCY_KEY_EXPIRES).is_some());
    let again = post_keyed(&base, "/paymnets", &k, "{}")
        .send()
        .await
        .unwrap();
    assert_eq!(again.headers()[IDEMPOTENT_REPLAYED], "true");
    assert_eq!(records_of(&*store, &k).await, 1);
}

/// Under `route_layer`, a rule written as the router's route is that
/// route's, whatever the raw path: axum's `{*rest}` (which the layer's own
/// patterns do not know) gets the rule's field selection, so a retry that
/// differs only in a field left out is a replay; the same router with the
/// rule's pattern mistyped falls back to the default rule (the whole body
/// fingerprinted) and the retry is refused as another request.
#[tokio::test]
async fn rules_are_matched_to_the_routers_route() {
    let app = |rule_path: &str, runs: Arc<Runs>| {
        let layer = IdempotencyLayer::builder(MemoryStore::new())
            .route(RouteRule::post(rule_path).fingerprint_fields(["amount"]))
            .build();
        Router::new()
            .route("/files/{*rest}", post(maybe_context))
            .route_layer(layer)
            .with_state(runs)
    };
    let client = reqwest::Client::new();
    for (rule_path, retry_status) in [("/files/{*rest}", 201), ("/file/{*rest}", 422)] {
        let runs = Arc::new(Runs::default());
        let base = serve(app(rule_path, runs.clone())).await;
        let k = key();
        let send = |note: &'static str| {
            client
                .post(format!("{base}/files/a/b/c"))
                .header(IDEMPOTENCY_KEY, k.as_str())
                .header("content-type", "application/json")
                .body(format!(r#"{{"amount":5,"note":"{note}"}}"#))
                .send()
        };
        assert_eq!(send("first").await.unwrap().status(), 201);
        let retry = send("second").await.unwrap();
        assert_eq!(retry.status().as_u16(), retry_status, "rule {rule_path}");
        if retry_status == 201 {
            assert!(retry.headers().contains_key(IDEMPOTENT_REPLAYED));
        }
        assert_eq!(runs.count(), 1, "rule {rule_path}");
    }
}
