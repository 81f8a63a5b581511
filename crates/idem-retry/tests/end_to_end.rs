//! The client and the server halves together: the server (the idem layer
//! on SQLite) commits and then drops the connection before answering for
//! 30% of first attempts. Every logical call must end with exactly one
//! effect, and the client must see the original response (as a replay).
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use idem_core::Key;
use idem_http::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, IdempotencyLayer};
use idem_retry::{Backoff, RetryMiddleware, RetryPolicy};
use tower::ServiceExt;

#[derive(Default)]
struct Effects {
    /// Executions per key, and the body each produced.
    by_key: Mutex<HashMap<String, (usize, String)>>,
}

/// The key a request carries, as the server reads it (the client sends an
/// sf-string).
fn key_of(headers: &HeaderMap) -> String {
    headers
        .get(IDEMPOTENCY_KEY)
        .and_then(|v| Key::from_header_value(v.as_bytes()).ok())
        .map(|k| k.as_str().to_owned())
        .unwrap_or_default()
}

async fn order(State(e): State<Arc<Effects>>, headers: HeaderMap) -> (StatusCode, String) {
    let key = key_of(&headers);
    let mut map = e.by_key.lock().unwrap();
    let n = map.len() + 1;
    let entry = map.entry(key).or_insert((0, format!("{{\"order\":{n}}}")));
    entry.0 += 1;
    (StatusCode::CREATED, entry.1.clone())
}

/// Whether this first attempt's answer is lost: 30% of keys, by hash.
fn lose(key: &str) -> bool {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish() % 10 < 3
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answers_after_commit_are_replayed_and_never_executed_twice() {
    let dir = tempfile::tempdir().unwrap();
    let store = idem_sqlite::SqliteStore::open(dir.path().join("e2e.db")).unwrap();
    let effects = Arc::new(Effects::default());
    let app = axum::Router::new()
        .route("/orders", post(order))
        .with_state(effects.clone())
        .layer(IdempotencyLayer::new(store));

    let first_seen = Arc::new(Mutex::new(HashSet::new()));
    let lost = Arc::new(Mutex::new(HashSet::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/orders", listener.local_addr().unwrap());
    {
        let (first_seen, lost) = (first_seen.clone(), lost.clone());
        tokio::spawn(async move {
            loop {
                let (sock, _) = listener.accept().await.unwrap();
                let (app, first_seen, lost) = (app.clone(), first_seen.clone(), lost.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                        let app = app.clone();
                        let key = key_of(req.headers());
                        let drop_it = first_seen.lock().unwrap().insert(key.clone()) && lose(&key);
                        if drop_it {
                            lost.lock().unwrap().insert(key);
                        }
                        async move {
                            let resp = app
                                .oneshot(req.map(axum::body::Body::new))
                                .await
                                .unwrap_or_else(|e: Infallible| match e {});
                            if drop_it {
                                // Committed, but the answer never leaves: the
                                // connection closes without a response.
                                Err(std::io::Error::other("answer lost"))
                            } else {
                                Ok(resp)
                            }
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(sock), svc)
                        .await;
                });
            }
        });
    }

    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(
            RetryPolicy::builder()
                .backoff(Backoff::new(
                    Duration::from_millis(1),
                    Duration::from_millis(10),
                ))
                .build(),
        ))
        .build();
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let key = format!("e2e-intent-{i:05}-0000");
                let r = client
                    .post(&url)
                    .header(IDEMPOTENCY_KEY, &key)
                    .body("{}")
                    .send()
                    .await
                    .unwrap();
                let replayed = r.headers().contains_key(IDEMPOTENT_REPLAYED);
                (key, r.status(), replayed, r.text().await.unwrap())
            })
        })
        .collect();
    let lost = {
        let mut results = Vec::new();
        for c in calls {
            results.push(c.await.unwrap());
        }
        let lost = lost.lock().unwrap().clone();
        let effects = effects.by_key.lock().unwrap();
        for (key, status, replayed, body) in &results {
            assert_eq!(*status, StatusCode::CREATED, "{key}");
            let (executions, original) = &effects[key];
            assert_eq!(*executions, 1, "{key}: exactly one effect");
            assert_eq!(
                body, original,
                "{key}: the client sees the original response"
            );
            assert_eq!(
                *replayed,
                lost.contains(key),
                "{key}: replayed exactly when the first answer was lost"
            );
        }
        lost.len()
    };
    assert!(
        (30..=90).contains(&lost),
        "about 30% of 200 answers lost: {lost}"
    );
}
