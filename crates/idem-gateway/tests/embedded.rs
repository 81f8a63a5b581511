//! The gateway embedded through the library's API alone, as
//! `examples/embed.rs` shows it: a keyed request runs the upstream once,
//! its retry is a replay, and the gateway drains when its token is
//! cancelled.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::post;
use idem_core::MemoryStore;
use idem_gateway::{Gateway, UpstreamSettings};
use idem_http::IdempotencyLayer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

async fn send(addr: std::net::SocketAddr, key: &str, body: &str) -> String {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /payments HTTP/1.1\r\nHost: example\r\nIdempotency-Key: {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.unwrap();
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_through_the_embedded_gateway_is_a_replay() {
    let payments = Arc::new(AtomicUsize::new(0));
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_url = format!("http://{}/api", upstream.local_addr().unwrap());
    let made = payments.clone();
    let app = Router::new().route(
        "/api/payments",
        post(move || async move {
            let n = made.fetch_add(1, Ordering::SeqCst) + 1;
            (http::StatusCode::CREATED, format!("{{\"payment\":{n}}}"))
        }),
    );
    tokio::spawn(async move { axum::serve(upstream, app).await });

    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .hold_unknown_outcomes(true)
        .build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let running = Gateway::new(layer, UpstreamSettings::new(upstream_url.parse().unwrap()))
        .threads(2)
        .start(listener, &shutdown)
        .await
        .unwrap();

    let first = send(addr, "embedded-gateway-key-0001", "{\"amount\":42}").await;
    assert!(first.starts_with("HTTP/1.1 201"), "{first}");
    assert!(first.ends_with("{\"payment\":1}"), "{first}");
    let retry = send(addr, "embedded-gateway-key-0001", "{\"amount\":42}").await;
    assert!(retry.starts_with("HTTP/1.1 201"), "{retry}");
    assert!(
        retry
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
        "{retry}"
    );
    assert!(retry.ends_with("{\"payment\":1}"), "{retry}");
    // Another body under the same key is refused, not executed.
    let other = send(addr, "embedded-gateway-key-0001", "{\"amount\":43}").await;
    assert!(other.starts_with("HTTP/1.1 422"), "{other}");
    assert_eq!(payments.load(Ordering::SeqCst), 1);

    shutdown.cancel();
    running.wait().await.unwrap();
    assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
}
