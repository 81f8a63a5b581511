//! The gateway embedded in a binary of one's own: a small upstream that
//! counts the payments it makes, the gateway in front of it, and one
//! payment sent twice with the same key. The upstream runs once; the
//! retry is answered from the store.
//!
//! `cargo run -p idem-gateway --example embed`

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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The service behind the gateway: every call it gets is a payment.
    let payments = Arc::new(AtomicUsize::new(0));
    let upstream = TcpListener::bind("127.0.0.1:0").await?;
    let upstream_url = format!("http://{}", upstream.local_addr()?);
    let made = payments.clone();
    let app = Router::new().route(
        "/payments",
        post(move || async move {
            let n = made.fetch_add(1, Ordering::SeqCst) + 1;
            (http::StatusCode::CREATED, format!("{{\"payment\":{n}}}"))
        }),
    );
    tokio::spawn(async move { axum::serve(upstream, app).await });

    // The gateway in front of it.
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .hold_unknown_outcomes(true)
        .build();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let gateway_addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let running = Gateway::new(layer, UpstreamSettings::new(upstream_url.parse()?))
        .threads(1)
        .start(listener, &shutdown)
        .await?;

    // One payment, sent twice with the same key.
    let request = "POST /payments HTTP/1.1\r\nHost: example\r\n\
                   Idempotency-Key: embed-example-0001\r\n\
                   Content-Type: application/json\r\nContent-Length: 13\r\n\
                   Connection: close\r\n\r\n{\"amount\":42}";
    for attempt in ["first", "retry"] {
        let mut conn = TcpStream::connect(gateway_addr).await?;
        conn.write_all(request.as_bytes()).await?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer).await?;
        let status = answer.lines().next().unwrap_or_default();
        let replayed = answer
            .lines()
            .any(|l| l.eq_ignore_ascii_case("idempotent-replayed: true"));
        let body = answer.rsplit("\r\n\r\n").next().unwrap_or_default();
        println!("{attempt}: {status}, replayed: {replayed}, body: {body}");
    }
    println!(
        "payments the upstream made: {}",
        payments.load(Ordering::SeqCst)
    );

    shutdown.cancel();
    running.wait().await?;
    Ok(())
}
