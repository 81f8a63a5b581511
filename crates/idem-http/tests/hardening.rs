//! The layer against hostile timing and legacy data (issue 10): waiters
//! that must not pile up, a store that stalls, and records written by the
//! fingerprint of an earlier release.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{
    Claim, ClaimRequest, Concurrency, FieldSelection, Fingerprint, Key, MemoryStore, Operation,
    Policy, RecordId, Scope, Store,
};
use idem_testkit::FaultyStore;
use support::{key, spawn_app};

/// Wait mode: every keyed request subscribes to its record's notifier;
/// none of those entries may outlive the request (item 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_mode_leaves_no_waiter_entries_behind() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let app = spawn_app(store, |b| {
        b.default_policy(
            Policy::builder()
                .concurrency(Concurrency::Wait {
                    limit: Duration::from_secs(5),
                })
                .build()
                .unwrap(),
        )
    })
    .await;
    for _ in 0..300 {
        let k = key();
        for _ in 0..3 {
            let r = app.post("/orders", &k, "{}").send().await.unwrap();
            assert_eq!(r.status(), 201);
        }
        let r = app
            .post("/orders", &k, r#"{"other":1}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 422);
    }
    assert_eq!(app.executions(), 300);
    assert_eq!(app.handle.waiting(), 0, "no entry outlives its request");
}

/// A stalled store fails closed with 503 once the store deadline passes,
/// and the handler never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_store_answers_503_at_its_deadline() {
    let app = spawn_app(Arc::new(FaultyStore::stalled()), |b| {
        b.store_timeout(Duration::from_millis(200))
    })
    .await;
    let started = Instant::now();
    let r = app.post("/orders", &key(), "{}").send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(app.executions(), 0);
}

/// Records written before fingerprint version 2 keep replaying to the
/// same request, and stay refused to a different one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_the_version_1_fingerprint_keep_replaying() {
    let store = Arc::new(MemoryStore::new());
    let op = Operation::new("POST", "/orders");
    let body = br#"{"amount":5}"#;
    let k = key();
    let id = RecordId::new(Scope::anonymous(), op.clone(), Key::new(k.clone()).unwrap());
    let v1 = Fingerprint::compute_v1(&op, Some("application/json"), body, &FieldSelection::Whole);
    assert_eq!(v1.version(), 1);
    let req = support::complete_as_an_old_release(&*store, &id, v1).await;

    // An in-progress version-1 record is in flight to the same request.
    let k2 = key();
    let id2 = RecordId::new(
        Scope::anonymous(),
        op.clone(),
        Key::new(k2.clone()).unwrap(),
    );
    let Claim::Acquired(_) = store
        .claim(&ClaimRequest {
            id: id2,
            ..req.clone()
        })
        .await
        .unwrap()
    else {
        panic!("fresh key")
    };

    let app = spawn_app(store, |b| b).await;
    let r = app
        .post("/orders", &k, r#"{ "amount": 5 }"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert_eq!(r.text().await.unwrap(), "from the old release");
    let r = app
        .post("/orders", &k, r#"{"amount":6}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let r = app
        .post("/orders", &k2, r#"{"amount":5}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    assert_eq!(app.executions(), 0);
}

/// The read path as a library service: a client reconciling after a
/// timeout needs only its key and its credential.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_path_service_needs_only_the_key_and_the_credential() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let probe = Arc::new(support::Probe::default());
    let layer = idem_http::IdempotencyLayer::builder_shared(store).build();
    let read_path = layer.read_path();
    let app = support::router(probe)
        .layer(layer)
        .route_service("/_idem/records/{key}", read_path);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let c = reqwest::Client::new();
    let k = key();
    let r = c
        .post(format!("{base}/orders"))
        .header("idempotency-key", &k)
        .header("authorization", "Bearer reader")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let read = |query: &str, auth: Option<&str>| {
        let mut req = c.get(format!("{base}/_idem/records/{k}{query}"));
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        req.send()
    };
    let mine = read("", Some("Bearer reader")).await.unwrap();
    assert_eq!(mine.status(), 200);
    let view: serde_json::Value = mine.json().await.unwrap();
    assert_eq!(view["status"], "completed");
    assert_eq!(view["operation"], "POST /orders");
    assert_eq!(view["response"]["status"], 201);
    let exact = read("?method=post&path=/orders", Some("Bearer reader"))
        .await
        .unwrap();
    assert_eq!(exact.status(), 200);
    assert_eq!(
        read("?method=POST&path=/other", Some("Bearer reader"))
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(read("", Some("Bearer other")).await.unwrap().status(), 404);
    assert_eq!(read("", None).await.unwrap().status(), 401);
    assert_eq!(
        read("?method=POST", Some("Bearer reader"))
            .await
            .unwrap()
            .status(),
        400
    );
    // Records are read, never written, there.
    let post = c
        .post(format!("{base}/_idem/records/{k}"))
        .header("idempotency-key", key())
        .header("authorization", "Bearer reader")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), 405);
    assert_eq!(post.headers()["allow"], "GET, HEAD");
}
