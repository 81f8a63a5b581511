//! HTTP throughput and p99, each as a ratio to a baseline measured in the
//! same run over loopback:
//!
//! 1. the idem-http layer in-process, in front of a minimal axum handler,
//!    against the same handler without it;
//! 2. `idem serve` (the release binary, its own process) in front of an
//!    upstream, against the same upstream reached directly.
//!
//! Each for new keys and replays, on the memory and SQLite stores.
//! `IDEM_BENCH_SECS` (default 5) sets the seconds per figure;
//! `IDEM_BENCH_CONCURRENCY` (default 32) the client tasks. The load
//! generator is reqwest with keep-alive connections in this process, so
//! client, gateway and upstream share the 2 cores alike in every row.

use std::process::{Child, Command, Stdio};
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

fn handler_app() -> Router {
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
    format!("http://{addr}")
}

#[derive(Clone, Copy)]
enum Keys {
    None,
    New,
    Replay,
}

/// Requests per second and p99 latency (ms) against `url`.
async fn load(url: &str, keys: Keys, secs: u64, tasks: u64) -> (f64, f64) {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let client = reqwest::Client::new();
    let stop = Arc::new(AtomicBool::new(false));
    let warm = Instant::now() + Duration::from_millis(300);
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (client, url, stop) = (client.clone(), url.to_owned(), stop.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut n = 0u64;
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
                    assert_eq!(resp.status(), 201, "unexpected status");
                    let _ = resp.bytes().await.expect("body");
                    if start > warm {
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

fn header(title: &str, base: (f64, f64)) {
    println!("\n{title}\n");
    println!("| configuration | requests/s | ratio | p99 ms | p99 ratio |");
    println!("|---|---:|---:|---:|---:|");
    println!("| baseline | {:.0} | 1.00 | {:.2} | 1.00 |", base.0, base.1);
}

fn row(name: &str, r: (f64, f64), base: (f64, f64)) {
    println!(
        "| {name} | {:.0} | {:.2} | {:.2} | {:.2} |",
        r.0,
        r.0 / base.0,
        r.1,
        r.1 / base.1
    );
}

struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start_gateway(upstream: &str, store: &str) -> (Gateway, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let gateway = Gateway(
        Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["serve", "--upstream", upstream, "--store", store])
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--admin-listen",
                &format!("127.0.0.1:{admin}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("idem serve"),
    );
    let health = format!("http://127.0.0.1:{admin}/healthz");
    for _ in 0..200 {
        if reqwest::get(&health)
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return (gateway, format!("http://127.0.0.1:{port}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("idem serve did not start");
}

fn main() {
    let secs = env_or("IDEM_BENCH_SECS", 5);
    let tasks = env_or("IDEM_BENCH_CONCURRENCY", 32);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");

        // 1. The layer, in-process.
        let plain = serve(handler_app()).await;
        let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let sqlite: Arc<dyn Store> =
            Arc::new(idem_sqlite::SqliteStore::open(dir.path().join("layer.db")).expect("sqlite"));
        let with_memory =
            serve(handler_app().layer(IdempotencyLayer::builder_shared(memory).build())).await;
        let with_sqlite =
            serve(handler_app().layer(IdempotencyLayer::builder_shared(sqlite).build())).await;
        let base = load(&format!("{plain}/orders"), Keys::None, secs, tasks).await;
        header(
            "idem-http layer in-process (baseline: the same axum handler without it)",
            base,
        );
        for (name, url) in [("memory", &with_memory), ("sqlite", &with_sqlite)] {
            for (label, keys) in [("new keys", Keys::New), ("replays", Keys::Replay)] {
                row(
                    &format!("layer, {name}, {label}"),
                    load(&format!("{url}/orders"), keys, secs, tasks).await,
                    base,
                );
            }
        }

        // 2. The gateway process.
        let upstream = serve(handler_app()).await;
        let base = load(&format!("{upstream}/orders"), Keys::None, secs, tasks).await;
        header(
            "idem serve (baseline: the same upstream reached directly)",
            base,
        );
        let sqlite_url = format!("sqlite:{}", dir.path().join("gateway.db").display());
        for (name, store) in [("memory", "memory:"), ("sqlite", sqlite_url.as_str())] {
            let (_gateway, url) = start_gateway(&upstream, store).await;
            for (label, keys) in [("new keys", Keys::New), ("replays", Keys::Replay)] {
                row(
                    &format!("idem serve, {name}, {label}"),
                    load(&format!("{url}/orders"), keys, secs, tasks).await,
                    base,
                );
            }
        }
    });
}
