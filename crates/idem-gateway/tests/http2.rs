//! HTTP/2 through the gateway, on both sides: h2c with prior knowledge
//! and h2 by ALPN from clients, h2c and h2 (ALPN) to the upstream; every
//! HTTP/1.1 guarantee per stream (claim, replay, conflicts, a stream reset
//! mid-request); and the bounds a hostile HTTP/2 client meets (rapid
//! reset, more streams than allowed, a huge header list).

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use http::{Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use idem_core::MemoryStore;
use idem_gateway::{
    ConnectionLimits, Gateway, Http2Limits, Running, UpstreamProtocol, UpstreamSettings,
};
use idem_http::{IdempotencyLayer, KeyRequirement};
use idem_testkit::tls::TestCa;
use rustls::pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// An HTTP/1.1 upstream that counts its executions, and can hold them
/// until released, noting how many ran at once.
#[derive(Clone, Default)]
struct Counting {
    executed: Arc<AtomicUsize>,
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    hold: Option<Arc<Notify>>,
}

impl Counting {
    fn holding() -> Counting {
        Counting {
            hold: Some(Arc::new(Notify::new())),
            ..Counting::default()
        }
    }

    async fn serve(&self) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let me = self.clone();
        let app = Router::new().route(
            "/payments",
            post(move |body: Bytes| {
                let me = me.clone();
                async move {
                    let n = me.executed.fetch_add(1, Ordering::SeqCst) + 1;
                    let now = me.running.fetch_add(1, Ordering::SeqCst) + 1;
                    me.peak.fetch_max(now, Ordering::SeqCst);
                    if let Some(hold) = &me.hold {
                        hold.notified().await;
                    }
                    me.running.fetch_sub(1, Ordering::SeqCst);
                    let text = String::from_utf8_lossy(&body).into_owned();
                    (StatusCode::CREATED, format!("payment {n} for {text}"))
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    fn executed(&self) -> usize {
        self.executed.load(Ordering::SeqCst)
    }

    /// Lets held executions go, `every` so often, until the task is
    /// aborted: all that wait, or one at a time.
    fn keep_releasing(&self, how: Release, every: Duration) -> tokio::task::JoinHandle<()> {
        let hold = self.hold.clone().unwrap();
        tokio::spawn(async move {
            loop {
                match how {
                    Release::All => hold.notify_waiters(),
                    Release::One => hold.notify_one(),
                }
                tokio::time::sleep(every).await;
            }
        })
    }
}

/// How [`Counting::keep_releasing`] lets held executions go.
#[derive(Clone, Copy)]
enum Release {
    All,
    One,
}

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

fn layer() -> IdempotencyLayer {
    IdempotencyLayer::builder(MemoryStore::new())
        .default_key(KeyRequirement::Required)
        .hold_unknown_outcomes(true)
        .build()
}

async fn gateway(
    upstream: UpstreamSettings,
    http2: Http2Limits,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Started {
    let limits = ConnectionLimits {
        http2,
        ..ConnectionLimits::default()
    };
    gateway_with(upstream, limits, tls).await
}

async fn gateway_with(
    upstream: UpstreamSettings,
    limits: ConnectionLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Started {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let mut gateway = Gateway::new(layer(), upstream)
        .threads(1)
        .shutdown_grace(Duration::from_secs(1))
        .limits(limits);
    if let Some(tls) = tls {
        gateway = gateway.tls(tls);
    }
    let running = gateway.start(listener, &shutdown).await.unwrap();
    Started {
        addr,
        shutdown,
        running,
    }
}

/// An h2c connection with prior knowledge.
async fn h2c(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
    trailers: Option<http::HeaderMap>,
}

async fn exchange(sender: &mut SendRequest<Full<Bytes>>, req: Request<Full<Bytes>>) -> Answer {
    sender.ready().await.unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.version(), Version::HTTP_2);
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await.unwrap();
    Answer {
        status: parts.status,
        headers: parts.headers,
        trailers: collected.trailers().cloned(),
        body: collected.to_bytes(),
    }
}

fn payment(addr: SocketAddr, key: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}/payments"))
        .header("idempotency-key", key)
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

fn replayed(a: &Answer) -> bool {
    a.headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// h2c from the client, HTTP/1.1 to the upstream: a keyed request runs
/// once, its retry on the same connection and on another is a replay,
/// another body under the key is refused, and concurrent duplicates on
/// one connection and on two run the upstream once.
#[tokio::test]
async fn h2c_streams_get_every_http1_guarantee() {
    let up = Counting::default();
    let url = up.serve().await;
    let g = gateway(
        UpstreamSettings::new(url.parse().unwrap()),
        Http2Limits::default(),
        None,
    )
    .await;
    let mut one = h2c(g.addr).await;
    let mut two = h2c(g.addr).await;

    let first = exchange(&mut one, payment(g.addr, "h2c-key-00000000001", "10 EUR")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!replayed(&first));
    let again = exchange(&mut one, payment(g.addr, "h2c-key-00000000001", "10 EUR")).await;
    let elsewhere = exchange(&mut two, payment(g.addr, "h2c-key-00000000001", "10 EUR")).await;
    for retry in [&again, &elsewhere] {
        assert_eq!(retry.status, StatusCode::CREATED);
        assert!(replayed(retry));
        assert_eq!(retry.body, first.body);
    }
    let other = exchange(&mut two, payment(g.addr, "h2c-key-00000000001", "99 EUR")).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(up.executed(), 1);

    // Sixteen duplicates at once, on two connections' streams.
    let mut calls = Vec::new();
    for i in 0..16 {
        let mut sender = if i % 2 == 0 { one.clone() } else { two.clone() };
        let req = payment(g.addr, "h2c-key-00000000002", "20 EUR");
        calls.push(tokio::spawn(
            async move { exchange(&mut sender, req).await },
        ));
    }
    let mut statuses = Vec::new();
    for c in calls {
        statuses.push(c.await.unwrap().status);
    }
    assert_eq!(up.executed(), 2, "duplicates ran: {statuses:?}");
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::CREATED || *s == StatusCode::CONFLICT),
        "{statuses:?}"
    );
    g.stop().await;
}

/// A stream reset while its execution runs does not cancel the
/// execution: the answer is stored, and the retry replays it.
#[tokio::test]
async fn a_stream_reset_mid_request_leaves_one_execution_and_its_answer() {
    let up = Counting::holding();
    let url = up.serve().await;
    let g = gateway(
        UpstreamSettings::new(url.parse().unwrap()),
        Http2Limits::default(),
        None,
    )
    .await;
    let mut conn = h2c(g.addr).await;
    conn.ready().await.unwrap();
    let pending = conn.send_request(payment(g.addr, "h2c-reset-0000000001", "5 EUR"));
    // Until the upstream has it, then the client gives up (RST_STREAM).
    let waiting = tokio::spawn(pending);
    while up.running.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    waiting.abort();
    let _ = waiting.await;
    up.hold.as_ref().unwrap().notify_waiters();
    // The retry waits out the execution (409 while it runs), then replays.
    let retry = loop {
        let a = exchange(&mut conn, payment(g.addr, "h2c-reset-0000000001", "5 EUR")).await;
        if a.status != StatusCode::CONFLICT {
            break a;
        }
        up.hold.as_ref().unwrap().notify_waiters();
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(replayed(&retry));
    assert_eq!(up.executed(), 1);
    g.stop().await;
}

/// The rapid-reset attack (CVE-2023-44487): keyed requests sent whole and
/// reset at once, in a loop, on one connection. Executions outlive their
/// streams, so they are what it could pile up: at most the connection's
/// stream limit run at once, whatever the number of resets, and the
/// gateway goes on serving others.
#[tokio::test]
async fn rapid_reset_cannot_pile_up_executions() {
    let up = Counting::holding();
    let url = up.serve().await;
    let limits = Http2Limits {
        max_concurrent_streams: 4,
        ..Http2Limits::default()
    };
    let g = gateway(UpstreamSettings::new(url.parse().unwrap()), limits, None).await;
    let tcp = TcpStream::connect(g.addr).await.unwrap();
    let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut sent = 0;
    for i in 0..400 {
        let Ok(ready) = client.clone().ready().await else {
            break; // the gateway closed the connection: fine
        };
        client = ready;
        let req = Request::post(format!("http://{}/payments", g.addr))
            .header("idempotency-key", format!("rapid-reset-{i:010}"))
            .header("content-type", "text/plain")
            .body(())
            .unwrap();
        let Ok((_response, mut stream)) = client.send_request(req, false) else {
            break;
        };
        if stream
            .send_data(Bytes::from_static(b"1 EUR"), true)
            .is_err()
        {
            break;
        }
        stream.send_reset(h2::Reason::CANCEL);
        sent += 1;
        // Give the gateway's thread a turn now and then, as a network would.
        if i % 8 == 0 {
            tokio::task::yield_now().await;
        }
    }
    // Let whatever was let in reach the upstream.
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let peak = up.peak.load(Ordering::SeqCst);
    assert!(sent > 0);
    assert!(peak <= 4, "{peak} executions at once from one connection");
    // Another client is served meanwhile (its execution is held too).
    let mut other = h2c(g.addr).await;
    other.ready().await.unwrap();
    let answer =
        tokio::spawn(other.send_request(payment(g.addr, "rapid-reset-others-001", "2 EUR")));
    let releasing = up.keep_releasing(Release::All, Duration::from_millis(10));
    let answer = tokio::time::timeout(Duration::from_secs(20), answer)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    releasing.abort();
    conn.abort();
    g.stop().await;
}

/// More streams at once than the connection allows: those a client opens
/// before it has the gateway's SETTINGS are refused (REFUSED_STREAM, which
/// says nothing ran), later ones wait their turn, and the upstream never
/// sees more at once than the limit.
#[tokio::test]
async fn streams_beyond_the_limit_are_refused_or_wait() {
    let up = Counting::holding();
    let url = up.serve().await;
    let limits = Http2Limits {
        max_concurrent_streams: 3,
        ..Http2Limits::default()
    };
    let g = gateway(UpstreamSettings::new(url.parse().unwrap()), limits, None).await;
    let sender = h2c(g.addr).await;
    let mut calls = Vec::new();
    for i in 0..12 {
        let mut s = sender.clone();
        let req = payment(g.addr, &format!("stream-flood-{i:08}"), "3 EUR");
        calls.push(tokio::spawn(async move {
            s.ready().await.ok()?;
            let resp = s.send_request(req).await;
            match resp {
                Ok(r) => Some(r.status()),
                Err(e) => {
                    let refused = std::error::Error::source(&e)
                        .and_then(|c| c.downcast_ref::<h2::Error>())
                        .and_then(h2::Error::reason)
                        == Some(h2::Reason::REFUSED_STREAM);
                    assert!(refused, "{e:?}");
                    None
                }
            }
        }));
    }
    let releasing = up.keep_releasing(Release::One, Duration::from_millis(5));
    let mut served = 0;
    for c in calls {
        if let Some(status) = c.await.unwrap() {
            assert_eq!(status, StatusCode::CREATED);
            served += 1;
        }
    }
    releasing.abort();
    assert!(served >= 3, "{served}");
    assert_eq!(up.executed(), served);
    assert!(up.peak.load(Ordering::SeqCst) <= 3);
    g.stop().await;
}

/// A header list over the limit is refused before anything runs.
#[tokio::test]
async fn a_huge_header_list_is_refused() {
    let up = Counting::default();
    let url = up.serve().await;
    let g = gateway(
        UpstreamSettings::new(url.parse().unwrap()),
        Http2Limits::default(),
        None,
    )
    .await;
    let tcp = TcpStream::connect(g.addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let big = "x".repeat(40 * 1024);
    let req = Request::post(format!("http://{}/payments", g.addr))
        .header("idempotency-key", "huge-header-list-001")
        .header("x-padding", big)
        .body(())
        .unwrap();
    let refused = match client.send_request(req, true) {
        Ok((response, _)) => match response.await {
            Ok(r) => r.status() == StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Err(_) => true,
        },
        Err(_) => true,
    };
    assert!(refused);
    assert_eq!(up.executed(), 0);
    g.stop().await;
}

fn server_tls(ca: &TestCa, alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
    Arc::new(ca.server_config(&["localhost"], alpn))
}

fn client_tls(ca: &TestCa, alpn: &[&[u8]]) -> rustls::ClientConfig {
    ca.client_config(alpn)
}

/// An HTTP/2 upstream over TLS (h2 by ALPN) that counts its executions.
async fn h2_tls_upstream(ca: &TestCa, executed: Arc<AtomicUsize>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://localhost:{}",
        listener.local_addr().unwrap().port()
    );
    let acceptor = tokio_rustls::TlsAcceptor::from(server_tls(ca, &[b"h2"]));
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            let executed = executed.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let executed = executed.clone();
                        async move {
                            let version = req.version();
                            let n = executed.fetch_add(1, Ordering::SeqCst) + 1;
                            let body = format!("payment {n} over {version:?}");
                            Ok::<_, Infallible>(
                                http::Response::builder()
                                    .status(StatusCode::CREATED)
                                    .body(Full::new(Bytes::from(body)))
                                    .unwrap(),
                            )
                        }
                    });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    url
}

/// h2 by ALPN on both sides: a client that offers h2 to the gateway's
/// TLS listener gets it, and the gateway speaks h2 to an upstream that
/// offers only h2 (`h2`, and `auto`). The answer, whose end only the
/// stream tells (no length), is stored and replayed.
#[tokio::test]
async fn h2_by_alpn_on_both_sides() {
    let ca = TestCa::new("idem h2 test CA");
    for protocol in [UpstreamProtocol::H2, UpstreamProtocol::Auto] {
        let executed = Arc::new(AtomicUsize::new(0));
        let url = h2_tls_upstream(&ca, executed.clone()).await;
        let mut upstream = UpstreamSettings::new(url.parse().unwrap());
        upstream.tls = Some(client_tls(&ca, &[]));
        upstream.protocol = protocol;
        let g = gateway(
            upstream,
            Http2Limits::default(),
            Some(server_tls(&ca, &[b"h2", b"http/1.1"])),
        )
        .await;
        let connector =
            tokio_rustls::TlsConnector::from(Arc::new(client_tls(&ca, &[b"h2", b"http/1.1"])));
        let tcp = TcpStream::connect(g.addr).await.unwrap();
        let tls = connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(b"h2".as_slice()));
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        let req = |body: &'static str| {
            Request::post(format!("https://localhost:{}/payments", g.addr.port()))
                .header("idempotency-key", "h2-alpn-key-000000001")
                .body(Full::new(Bytes::from_static(body.as_bytes())))
                .unwrap()
        };
        let first = exchange(&mut sender, req("7 EUR")).await;
        assert_eq!(first.status, StatusCode::CREATED, "{protocol:?}");
        assert_eq!(first.body, "payment 1 over HTTP/2.0", "{protocol:?}");
        let retry = exchange(&mut sender, req("7 EUR")).await;
        assert!(replayed(&retry), "{protocol:?}");
        assert_eq!(retry.body, first.body);
        assert_eq!(executed.load(Ordering::SeqCst), 1);
        g.stop().await;
    }
}

/// With HTTP/2 off, a client that speaks h2c first gets no HTTP/2: the
/// bytes are read as HTTP/1.1 and refused.
#[tokio::test]
async fn http2_off_serves_http1_only() {
    let up = Counting::default();
    let url = up.serve().await;
    let off = Http2Limits {
        enabled: false,
        ..Http2Limits::default()
    };
    let g = gateway(UpstreamSettings::new(url.parse().unwrap()), off, None).await;
    let tcp = TcpStream::connect(g.addr).await.unwrap();
    let handshake = hyper::client::conn::http2::handshake::<_, _, Full<Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(tcp),
    );
    let worked = match tokio::time::timeout(Duration::from_secs(5), handshake).await {
        Ok(Ok((mut sender, conn))) => {
            tokio::spawn(conn);
            let sent = sender
                .send_request(payment(g.addr, "http2-off-key-00001", "1 EUR"))
                .await;
            sent.is_ok()
        }
        _ => false,
    };
    assert!(!worked);
    assert_eq!(up.executed(), 0);
    g.stop().await;
}

/// Trailers of a keyed HTTP/2 answer are stored and replayed: both the
/// first answer and the replay carry them.
#[tokio::test]
async fn trailers_are_passed_on_and_replayed() {
    let executed = Arc::new(AtomicUsize::new(0));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let counter = executed.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let counter = counter.clone();
            let service =
                hyper::service::service_fn(move |_req: Request<hyper::body::Incoming>| {
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    async move {
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", http::HeaderValue::from(0));
                        trailers.insert("x-ledger-entry", http::HeaderValue::from(n));
                        let frames = futures_util::stream::iter(vec![
                            Ok::<_, Infallible>(http_body::Frame::data(Bytes::from_static(
                                b"paid",
                            ))),
                            Ok(http_body::Frame::trailers(trailers)),
                        ]);
                        Ok::<_, Infallible>(
                            http::Response::builder()
                                .header("content-type", "application/grpc")
                                .body(http_body_util::StreamBody::new(frames))
                                .unwrap(),
                        )
                    }
                });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service),
            );
        }
    });
    let mut upstream = UpstreamSettings::new(url.parse().unwrap());
    upstream.protocol = UpstreamProtocol::H2c;
    let g = gateway(upstream, Http2Limits::default(), None).await;
    let mut conn = h2c(g.addr).await;
    let req = || {
        Request::post(format!("http://{}/ledger.Ledger/Pay", g.addr))
            .header("idempotency-key", "trailer-key-0000000001")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(Bytes::from_static(b"\0\0\0\0\x01z")))
            .unwrap()
    };
    let first = exchange(&mut conn, req()).await;
    let retry = exchange(&mut conn, req()).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(replayed(&retry));
    assert_eq!(first.body, retry.body);
    let t = first.trailers.expect("first answer's trailers");
    assert_eq!(t["grpc-status"], "0");
    assert_eq!(
        retry.trailers.expect("replay's trailers")["grpc-status"],
        "0"
    );
    assert_eq!(executed.load(Ordering::SeqCst), 1);
    g.stop().await;
}

/// A plain connection that sends nothing is closed after the header
/// timeout (the choice between HTTP/1.1 and h2c waits for its first
/// bytes), and an HTTP/2 connection with no request open after the idle
/// timeout (its client would answer pings for ever): neither holds its
/// connection slot for ever.
#[tokio::test]
async fn silent_and_idle_connections_are_closed() {
    use tokio::io::AsyncReadExt as _;
    let up = Counting::default();
    let url = up.serve().await;
    let limits = ConnectionLimits {
        header_timeout: Duration::from_millis(300),
        http2: Http2Limits {
            idle_timeout: Duration::from_millis(300),
            ..Http2Limits::default()
        },
        ..ConnectionLimits::default()
    };
    let g = gateway_with(UpstreamSettings::new(url.parse().unwrap()), limits, None).await;
    // Nothing at all, and half of HTTP/2's preface.
    for sent in [&b""[..], &b"PRI * HTTP/2.0\r\n"[..]] {
        let mut tcp = TcpStream::connect(g.addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut tcp, sent)
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        let closed = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "still open after sending {sent:?}: {closed:?}"
        );
    }
    // An HTTP/2 connection that served requests, then went quiet.
    let tcp = TcpStream::connect(g.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    // Short requests, closer together than the idle timeout, keep it
    // open however the idle checks fall between them.
    for i in 0..12 {
        let key = format!("idle-h2c-key-{i:07}");
        let served = exchange(&mut sender, payment(g.addr, &key, "1 EUR")).await;
        assert_eq!(served.status, StatusCode::CREATED, "request {i}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!conn.is_finished(), "closed while in use");
    let ended = tokio::time::timeout(Duration::from_secs(10), conn).await;
    assert!(ended.is_ok(), "the idle HTTP/2 connection is still open");
    g.stop().await;
}

/// The library refuses an upstream protocol its URL's scheme cannot
/// carry: h2 (TLS) over http://, h2c (clear text) over https://.
#[tokio::test]
async fn a_protocol_the_scheme_cannot_carry_is_refused() {
    for (url, protocol) in [
        ("http://127.0.0.1:9", UpstreamProtocol::H2),
        ("https://127.0.0.1:9", UpstreamProtocol::H2c),
    ] {
        let mut upstream = UpstreamSettings::new(url.parse().unwrap());
        upstream.protocol = protocol;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let started = Gateway::new(layer(), upstream)
            .threads(1)
            .start(listener, &CancellationToken::new())
            .await;
        let Err(e) = started else {
            panic!("{protocol:?} over {url} started");
        };
        assert!(e.to_string().contains("UpstreamSettings::protocol"), "{e}");
    }
}

/// An h2c gRPC upstream for the tests below: `/ledger.Ledger/NoStatus`
/// answers a message and no grpc-status (a hop dropped its trailers);
/// anything else answers whether `grpc-timeout` reached it, with status 0.
async fn grpc_upstream(executed: Arc<AtomicUsize>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let executed = executed.clone();
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                executed.fetch_add(1, Ordering::SeqCst);
                let timeout = req
                    .headers()
                    .get("grpc-timeout")
                    .map_or("none".to_owned(), |v| v.to_str().unwrap().to_owned());
                let no_status = req.uri().path() == "/ledger.Ledger/NoStatus";
                async move {
                    let mut frames = vec![Ok::<_, Infallible>(http_body::Frame::data(
                        Bytes::from(format!("timeout:{timeout}")),
                    ))];
                    if !no_status {
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", http::HeaderValue::from(0));
                        frames.push(Ok(http_body::Frame::trailers(trailers)));
                    }
                    Ok::<_, Infallible>(
                        http::Response::builder()
                            .header("content-type", "application/grpc")
                            .body(http_body_util::StreamBody::new(futures_util::stream::iter(
                                frames,
                            )))
                            .unwrap(),
                    )
                }
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service),
            );
        }
    });
    url
}

fn grpc_call(addr: SocketAddr, method: &str, key: &str) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}/ledger.Ledger/{method}"))
        .header("idempotency-key", key)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "1m")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\x01z")))
        .unwrap()
}

/// A keyed gRPC call runs to its end whatever its client's deadline: its
/// `grpc-timeout` does not reach the service (which could stop it half
/// done and answer DEADLINE_EXCEEDED, releasing the key for a second run).
/// A gRPC answer without a status may be a success whose trailers were
/// lost on the way: its key is held, not released, so a retry does not run
/// it again.
#[tokio::test]
async fn keyed_grpc_calls_outlive_their_deadline_and_a_lost_status_holds_the_key() {
    let executed = Arc::new(AtomicUsize::new(0));
    let url = grpc_upstream(executed.clone()).await;
    let mut upstream = UpstreamSettings::new(url.parse().unwrap());
    upstream.protocol = UpstreamProtocol::H2c;
    let g = gateway(upstream, Http2Limits::default(), None).await;
    let mut conn = h2c(g.addr).await;
    let paid = exchange(&mut conn, grpc_call(g.addr, "Pay", "grpc-deadline-000001")).await;
    assert_eq!(paid.body, "timeout:none");
    assert_eq!(paid.trailers.unwrap()["grpc-status"], "0");

    let lost = exchange(
        &mut conn,
        grpc_call(g.addr, "NoStatus", "grpc-nostatus-000001"),
    )
    .await;
    assert_eq!(lost.headers["grpc-status"], "2", "held: UNKNOWN");
    let retry = exchange(
        &mut conn,
        grpc_call(g.addr, "NoStatus", "grpc-nostatus-000001"),
    )
    .await;
    assert_eq!(retry.headers["grpc-status"], "10", "still held: ABORTED");
    assert_eq!(executed.load(Ordering::SeqCst), 2);
    g.stop().await;
}
