//! Retry storms: 1,000 logical calls against a server that fails
//! everything. With the default budget the client adds under 25% load;
//! without one it triples it. Once the server heals, retrying is normal.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use idem_retry::{Backoff, RetryMiddleware, RetryPolicy, RetryPolicyBuilder};

const FAIL_ALL: u8 = 0;
const HEALTHY: u8 = 1;
const FAIL_FIRST: u8 = 2;

#[derive(Default)]
struct Server {
    mode: AtomicU8,
    attempts: AtomicUsize,
    seen: std::sync::Mutex<std::collections::HashSet<String>>,
}

async fn handler(State(s): State<Arc<Server>>, headers: HeaderMap) -> StatusCode {
    s.attempts.fetch_add(1, Ordering::SeqCst);
    let key = headers
        .get(idem_retry::header_names::IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    match s.mode.load(Ordering::SeqCst) {
        FAIL_ALL => StatusCode::SERVICE_UNAVAILABLE,
        FAIL_FIRST if s.seen.lock().unwrap().insert(key) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::CREATED,
    }
}

async fn serve() -> (String, Arc<Server>) {
    let state = Arc::new(Server::default());
    let app = axum::Router::new()
        .route("/orders", post(handler))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/orders"), state)
}

fn fast(b: RetryPolicyBuilder) -> RetryPolicy {
    b.backoff(Backoff::new(
        Duration::from_millis(1),
        Duration::from_millis(4),
    ))
    .build()
}

/// Sends `calls` logical POSTs, 50 at a time; returns how many ended 201.
async fn burst(
    client: &reqwest_middleware::ClientWithMiddleware,
    url: &str,
    calls: usize,
) -> usize {
    let ok = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..50)
        .map(|_| {
            let (client, url, ok, next) =
                (client.clone(), url.to_owned(), ok.clone(), next.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::SeqCst) < calls {
                    let r = client.post(&url).body("{}").send().await.unwrap();
                    if r.status() == StatusCode::CREATED {
                        ok.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    ok.load(Ordering::SeqCst)
}

fn client(policy: RetryPolicy) -> reqwest_middleware::ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_budget_stops_a_storm_and_recovers() {
    let (url, server) = serve().await;
    let c = client(fast(RetryPolicy::builder()));

    assert_eq!(burst(&c, &url, 1000).await, 0);
    let ratio = server.attempts.load(Ordering::SeqCst) as f64 / 1000.0;
    eprintln!("outage: {ratio:.3} attempts per logical call with the default budget");
    assert!(
        ratio < 1.25,
        "attempts per logical call in an outage: {ratio:.3}"
    );

    // The server heals; healthy traffic refills the budget.
    server.mode.store(HEALTHY, Ordering::SeqCst);
    assert_eq!(burst(&c, &url, 1000).await, 1000);
    // Now every call fails once: each is retried and succeeds.
    server.mode.store(FAIL_FIRST, Ordering::SeqCst);
    server.attempts.store(0, Ordering::SeqCst);
    assert_eq!(burst(&c, &url, 50).await, 50, "normal retrying is back");
    assert_eq!(server.attempts.load(Ordering::SeqCst), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_budget_a_storm_triples_the_load() {
    let (url, server) = serve().await;
    let c = client(fast(RetryPolicy::builder().no_budget()));
    assert_eq!(burst(&c, &url, 1000).await, 0);
    let ratio = server.attempts.load(Ordering::SeqCst) as f64 / 1000.0;
    assert!((2.99..=3.0).contains(&ratio), "{ratio:.3}");
}
