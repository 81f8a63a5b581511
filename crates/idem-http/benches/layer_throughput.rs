//! Requests per second and p99 latency through the layer, for new keys and
//! replays, on the memory and SQLite stores, as ratios to the same axum
//! service without the layer, all measured in one run over loopback HTTP.
//!
//! `IDEM_BENCH_SECS` (default 5) sets the seconds per figure;
//! `IDEM_BENCH_CONCURRENCY` (default 32) the client tasks. The client runs
//! in the same process (reqwest, pooled keep-alive connections), so client
//! and server share the 2 cores alike in every configuration.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use idem_core::{MemoryStore, Store};
use idem_http::IdempotencyLayer;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn app() -> Router {
    Router::new().route(
        "/orders",
        post(|body: String| async move {
            (
                axum::http::StatusCode::CREATED,
                [("content-type", "application/json")],
                format!("{{\"order\":1,\"len\":{}}}", body.len()),
            )
        }),
    )
}

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
    format!("http://{addr}/orders")
}

#[derive(Clone, Copy)]
enum Keys {
    None,
    New,
    Replay,
}

/// Requests per second and p99 latency (ms).
async fn load(url: &str, keys: Keys, secs: u64, tasks: u64) -> (f64, f64) {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let client = reqwest::Client::new();
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (client, url, stop) = (client.clone(), url.to_owned(), stop.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut n = 0u64;
                let deadline = Instant::now() + Duration::from_millis(300);
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let mut req = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(r#"{"item":"book","qty":1}"#);
                    match keys {
                        Keys::None => {}
                        Keys::New => {
                            req =
                                req.header("idempotency-key", format!("bench-{run}-{t:04}-{n:010}"))
                        }
                        Keys::Replay => {
                            req = req
                                .header("idempotency-key", format!("bench-{run}-{t:04}-replayed"))
                        }
                    }
                    let start = Instant::now();
                    let resp = req.send().await.expect("request");
                    assert_eq!(resp.status(), 201);
                    let _ = resp.bytes().await.expect("body");
                    // The first 300 ms are warm-up (and create the replayed keys).
                    if start > deadline {
                        latencies.push(start.elapsed());
                    }
                }
                latencies
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300) + Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("task"));
    }
    all.sort();
    let p99 = all.get(all.len() * 99 / 100).copied().unwrap_or_default();
    (all.len() as f64 / secs as f64, p99.as_secs_f64() * 1000.0)
}

fn main() {
    let secs = env_or("IDEM_BENCH_SECS", 5);
    let tasks = env_or("IDEM_BENCH_CONCURRENCY", 32);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let plain = serve(app()).await;
        let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let sqlite: Arc<dyn Store> =
            Arc::new(idem_sqlite::SqliteStore::open(dir.path().join("bench.db")).expect("sqlite"));
        let with_memory =
            serve(app().layer(IdempotencyLayer::builder_shared(memory).build())).await;
        let with_sqlite =
            serve(app().layer(IdempotencyLayer::builder_shared(sqlite).build())).await;

        let (base_rps, base_p99) = load(&plain, Keys::None, secs, tasks).await;
        println!("| configuration | requests/s | ratio | p99 ms | p99 ratio |");
        println!("|---|---:|---:|---:|---:|");
        println!("| without the layer (baseline) | {base_rps:.0} | 1.00 | {base_p99:.2} | 1.00 |");
        for (name, url) in [("memory", &with_memory), ("sqlite", &with_sqlite)] {
            for (label, keys) in [("new keys", Keys::New), ("replays", Keys::Replay)] {
                let (rps, p99) = load(url, keys, secs, tasks).await;
                println!(
                    "| {name}, {label} | {rps:.0} | {:.2} | {p99:.2} | {:.2} |",
                    rps / base_rps,
                    p99 / base_p99
                );
            }
        }
    });
}
