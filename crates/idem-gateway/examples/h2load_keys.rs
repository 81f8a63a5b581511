//! A small HTTP/2 (h2c) load generator for `bench/h2.sh`: what h2load
//! cannot do, a new `Idempotency-Key` on every request. POSTs a small
//! JSON body to URL over CONNECTIONS connections with STREAMS requests in
//! flight on each, until REQUESTS have been answered, and prints its
//! figures in h2load's words (so the bench reads both alike).
//!
//! ```text
//! cargo run --release -p idem-gateway --example h2load_keys -- URL REQUESTS CONNECTIONS STREAMS
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench tool: a panic is a failed run

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

const BODY: &str = r#"{"from":"acct-1","to":"acct-2","amount":100}"#;

#[derive(Default)]
struct Counts {
    started: AtomicU64,
    done: AtomicU64,
    ok: AtomicU64,
    client_errors: AtomicU64,
    server_errors: AtomicU64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, requests, connections, streams] = &args[..] else {
        eprintln!("usage: h2load_keys URL REQUESTS CONNECTIONS STREAMS");
        std::process::exit(2);
    };
    let url: http::Uri = url.parse().expect("a URL");
    let requests: u64 = requests.parse().expect("REQUESTS");
    let connections: usize = connections.parse().expect("CONNECTIONS");
    let streams: usize = streams.parse().expect("STREAMS");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(run(url, requests, connections, streams));
}

async fn run(url: http::Uri, requests: u64, connections: usize, streams: usize) {
    let counts = Arc::new(Counts::default());
    let authority = url.authority().expect("a host").to_string();
    // Keys differ between runs (the seed) and between requests (the count).
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let since = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let tcp = TcpStream::connect(&authority).await.expect("connect");
        tcp.set_nodelay(true).expect("nodelay");
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .expect("an h2c handshake");
        tokio::spawn(conn);
        for _ in 0..streams {
            let (mut sender, counts, url) = (sender.clone(), counts.clone(), url.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let n = counts.started.fetch_add(1, Ordering::Relaxed);
                    if n >= requests {
                        counts.started.fetch_sub(1, Ordering::Relaxed);
                        return;
                    }
                    let key = format!("{:016x}-{n:012}", seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                    let req = Request::post(url.clone())
                        .header("content-type", "application/json")
                        .header("idempotency-key", key)
                        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
                        .expect("a request");
                    if sender.ready().await.is_err() {
                        return;
                    }
                    let Ok(resp) = sender.send_request(req).await else {
                        return;
                    };
                    let status = resp.status();
                    let _ = resp.into_body().collect().await;
                    let counter = match status.as_u16() {
                        200..=399 => &counts.ok,
                        400..=499 => &counts.client_errors,
                        _ => &counts.server_errors,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    counts.done.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    let secs = since.elapsed().as_secs_f64();
    let done = counts.done.load(Ordering::Relaxed);
    println!(
        "finished in {secs:.2}s, {:.2} req/s, 0B/s",
        done as f64 / secs
    );
    println!(
        "requests: {requests} total, {} started, {done} done, {} succeeded, {} failed, 0 errored, 0 timeout",
        counts.started.load(Ordering::Relaxed),
        counts.ok.load(Ordering::Relaxed),
        requests - counts.ok.load(Ordering::Relaxed),
    );
    println!(
        "status codes: {} 2xx, 0 3xx, {} 4xx, {} 5xx",
        counts.ok.load(Ordering::Relaxed),
        counts.client_errors.load(Ordering::Relaxed),
        counts.server_errors.load(Ordering::Relaxed),
    );
}
