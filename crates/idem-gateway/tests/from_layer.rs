//! What the gateway takes from its layer, so that an embedder who keeps
//! the gateway's defaults cannot forget it: the key header and the scope
//! headers reach the upstream whatever a client's `Connection` names, and
//! a keyed answer is read whole under the upstream timeout only up to the
//! layer's response limit.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderName;
use idem_core::MemoryStore;
use idem_gateway::{Gateway, Running, UpstreamSettings};
use idem_http::{IdempotencyLayer, ScopeSource};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The answer's body: three parts of 100 bytes.
const PARTS: [u8; 3] = [b'a', b'b', b'c'];

/// An upstream that records every request head it receives and answers
/// with [`PARTS`], 400 ms apart for a path under `/slow`. Returns its URL.
async fn upstream(heads: Arc<Mutex<Vec<String>>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            let heads = heads.clone();
            tokio::spawn(async move {
                let head = read_request(&mut conn).await;
                let slow = head.starts_with("POST /slow");
                heads.lock().unwrap().push(head);
                let length = PARTS.len() * 100;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
                );
                conn.write_all(answer.as_bytes()).await.unwrap();
                for (i, part) in PARTS.into_iter().enumerate() {
                    if slow && i > 0 {
                        tokio::time::sleep(Duration::from_millis(400)).await;
                    }
                    if conn.write_all(&[part; 100]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// Reads one request (its head and its `Content-Length` body); returns
/// the head.
async fn read_request(conn: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = conn.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the gateway closed before sending its request");
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8(buf[..end].to_vec()).unwrap();
        let length = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().unwrap())
            })
            .unwrap_or(0);
        while buf.len() < end + 4 + length {
            let n = conn.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the gateway closed before sending the body");
            buf.extend_from_slice(&chunk[..n]);
        }
        return head;
    }
}

/// A gateway on one thread, and what stops it.
struct Started {
    addr: SocketAddr,
    shutdown: CancellationToken,
    running: Running,
}

impl Started {
    async fn stop(self) {
        self.shutdown.cancel();
        self.running.wait().await.unwrap();
    }
}

async fn start(layer: IdempotencyLayer, upstream: UpstreamSettings) -> Started {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let running = Gateway::new(layer, upstream)
        .threads(1)
        .start(listener, &shutdown)
        .await
        .unwrap();
    Started {
        addr,
        shutdown,
        running,
    }
}

/// Sends `request` and reads the answer until the gateway closes.
async fn send(addr: SocketAddr, request: &str) -> String {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    // A cut answer may end with a reset: what came before it is the answer.
    let _ = conn.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}

fn body() -> String {
    PARTS
        .iter()
        .map(|&b| String::from_utf8(vec![b; 100]).unwrap())
        .collect()
}

/// A layer that reads its key from `X-Request-Key` and its scope from
/// `X-Tenant`, behind a gateway with `UpstreamSettings::new`'s defaults:
/// a client that names both in `Connection` does not get the upstream to
/// run the request without them (for another tenant than the record's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layers_key_and_scope_headers_reach_the_upstream() {
    let heads = Arc::new(Mutex::new(Vec::new()));
    let url = upstream(heads.clone()).await;
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .key_header(HeaderName::from_static("x-request-key"))
        .scope(ScopeSource::Header(HeaderName::from_static("x-tenant")))
        .build();
    let gateway = start(layer, UpstreamSettings::new(url.parse().unwrap())).await;

    let answer = send(
        gateway.addr,
        "POST /payments HTTP/1.1\r\nHost: x\r\nX-Request-Key: from-layer-key-0001\r\n\
         X-Tenant: acme\r\nConnection: close, X-Tenant, X-Request-Key\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    let head = heads[0].to_ascii_lowercase();
    assert!(head.contains("\r\nx-tenant: acme"), "{head}");
    assert!(
        head.contains("\r\nx-request-key: from-layer-key-0001"),
        "{head}"
    );
    gateway.stop().await;
}

/// A layer that stores answers of up to 16 bytes, behind a gateway with
/// the default settings (whose own default would be 8 MiB) and a 500 ms
/// upstream timeout: an answer past 16 bytes is streamed, not stored, so
/// only its first 16 bytes run under the timeout, and one that trickles
/// in over 800 ms reaches its client whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_layers_response_limit_runs_under_the_upstream_timeout() {
    let heads = Arc::new(Mutex::new(Vec::new()));
    let url = upstream(heads.clone()).await;
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .response_limit(16)
        .build();
    let mut settings = UpstreamSettings::new(url.parse().unwrap());
    settings.timeout = Duration::from_millis(500);
    let gateway = start(layer, settings).await;

    let answer = send(
        gateway.addr,
        "POST /slow HTTP/1.1\r\nHost: x\r\nIdempotency-Key: from-layer-key-0002\r\n\
         Connection: close\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with(&body()), "cut short: {answer}");
    gateway.stop().await;
}
