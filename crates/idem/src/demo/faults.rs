//! The fault-injecting front in front of the ledger: what a real network
//! and a real server do to requests, on purpose and counted.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// How often each fault happens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FaultRates {
    /// First attempts whose answer is lost after the commit.
    pub(crate) drop: f64,
    /// Attempts refused with 503 before they reach the ledger.
    pub(crate) fail: f64,
    /// First attempts answered only after the client gave up.
    pub(crate) slow: f64,
    /// How late a slow answer comes.
    pub(crate) slow_by: Duration,
}

/// What the front saw and did.
#[derive(Debug, Default)]
pub(crate) struct FrontStats {
    pub(crate) attempts: AtomicU64,
    pub(crate) executed: AtomicU64,
    pub(crate) replayed: AtomicU64,
    pub(crate) conflicts: AtomicU64,
    pub(crate) mismatches: AtomicU64,
    pub(crate) injected_503: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) slowed: AtomicU64,
    pub(crate) released: AtomicU64,
}

/// A deterministic coin: the same seed and inputs give the same faults.
fn coin(seed: u64, salt: u64, key: &str, attempt: u64, p: f64) -> bool {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (seed, salt, key, attempt).hash(&mut h);
    (h.finish() as f64 / u64::MAX as f64) < p
}

/// Serves `app` behind the faults on 127.0.0.1:0; returns the base URL.
pub(crate) async fn serve(
    app: Router,
    rates: FaultRates,
    seed: u64,
    stats: Arc<FrontStats>,
) -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let seen = Arc::new(Mutex::new(HashSet::<String>::new()));
    let counter = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                continue;
            };
            let (app, seen, stats, counter) =
                (app.clone(), seen.clone(), stats.clone(), counter.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                    let (app, stats) = (app.clone(), stats.clone());
                    let key = req
                        .headers()
                        .get(idem_http::IDEMPOTENCY_KEY)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    let first = seen
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(key.clone());
                    async move {
                        stats.attempts.fetch_add(1, Ordering::Relaxed);
                        if coin(seed, 1, &key, n, rates.fail) {
                            stats.injected_503.fetch_add(1, Ordering::Relaxed);
                            let resp = axum::http::Response::builder()
                                .status(503)
                                .header("content-type", "application/problem+json")
                                .body(axum::body::Body::from(r#"{"type":"about:blank","title":"Injected fault","status":503,"detail":"not forwarded"}"#))
                                .unwrap_or_default();
                            return Ok::<_, std::io::Error>(resp);
                        }
                        let resp = app
                            .oneshot(req.map(axum::body::Body::new))
                            .await
                            .unwrap_or_else(|e: Infallible| match e {});
                        count(&stats, &resp);
                        if first && coin(seed, 2, &key, 0, rates.drop) {
                            stats.dropped.fetch_add(1, Ordering::Relaxed);
                            return Err(std::io::Error::other("answer lost after commit"));
                        }
                        if first && coin(seed, 3, &key, 0, rates.slow) {
                            stats.slowed.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(rates.slow_by).await;
                        }
                        Ok(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
    Ok(base)
}

fn count(stats: &FrontStats, resp: &axum::http::Response<axum::body::Body>) {
    let s = resp.status().as_u16();
    let counter = if resp.headers().contains_key(idem_ledger::EXECUTED) {
        &stats.executed
    } else if resp.headers().contains_key(idem_http::IDEMPOTENT_REPLAYED) {
        &stats.replayed
    } else if s == 409 {
        &stats.conflicts
    } else if s == 422 {
        &stats.mismatches
    } else if s >= 500 {
        &stats.released
    } else {
        // Validation errors: the demo sends none.
        &stats.released
    };
    counter.fetch_add(1, Ordering::Relaxed);
}
