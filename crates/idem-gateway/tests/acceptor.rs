//! `Accept` steps composed by a user of the library: a step of one's own
//! sets up every connection, on the thread that serves it, and the I/O it
//! makes is the one served; composed with TLS on either side it sees
//! ciphertext below and the negotiated protocol above; a step that fails
//! closes the connection, and one that waits is given up after the header
//! timeout and at shutdown.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use idem_core::MemoryStore;
use idem_gateway::{
    Accept, Accepted, Connecting, ConnectionLimits, Gateway, Running, RustlsAcceptor, TcpAcceptor,
    UpstreamSettings,
};
use idem_http::IdempotencyLayer;
use idem_testkit::tls::TestCa;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// What a [`Recorder`] saw of the connections it set up.
#[derive(Debug, Default)]
struct Seen {
    peers: Vec<SocketAddr>,
    threads: BTreeSet<String>,
    alpn: Vec<Option<Vec<u8>>>,
}

/// A step over `A` that records every connection it sets up and counts
/// the bytes the gateway writes to it, through an I/O wrapper of its own.
#[derive(Debug, Clone)]
struct Recorder<A> {
    inner: A,
    seen: Arc<Mutex<Seen>>,
    written: Arc<AtomicUsize>,
}

impl<A> Recorder<A> {
    fn new(inner: A) -> Recorder<A> {
        Recorder {
            inner,
            seen: Arc::default(),
            written: Arc::default(),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap()
    }

    fn written(&self) -> usize {
        self.written.load(Ordering::SeqCst)
    }
}

impl<A: Accept> Accept for Recorder<A> {
    type Io = Counted<A::Io>;

    async fn accept(
        &self,
        stream: TcpStream,
        conn: &Connecting,
    ) -> io::Result<Accepted<Counted<A::Io>>> {
        let accepted = self.inner.accept(stream, conn).await?;
        {
            let mut seen = self.seen();
            seen.peers.push(conn.peer());
            let thread = std::thread::current();
            seen.threads.insert(thread.name().unwrap_or("?").to_owned());
            seen.alpn.push(accepted.alpn_protocol().map(<[u8]>::to_vec));
        }
        let written = self.written.clone();
        Ok(accepted.map(|io| Counted { io, written }))
    }

    fn is_tls(&self) -> bool {
        self.inner.is_tls()
    }
}

/// I/O that counts the bytes written through it.
#[derive(Debug)]
struct Counted<T> {
    io: T,
    written: Arc<AtomicUsize>,
}

impl<T> Counted<T> {
    fn count(&self, poll: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if let Poll::Ready(Ok(n)) = poll {
            self.written.fetch_add(n, Ordering::SeqCst);
        }
        poll
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.count(poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.count(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A step that refuses every client, or (with `wait`) never finishes.
#[derive(Debug)]
struct Stuck {
    wait: bool,
    tried: Arc<AtomicUsize>,
}

impl Accept for Stuck {
    type Io = <TcpAcceptor as Accept>::Io;

    async fn accept(
        &self,
        _stream: TcpStream,
        _conn: &Connecting,
    ) -> io::Result<Accepted<Self::Io>> {
        self.tried.fetch_add(1, Ordering::SeqCst);
        if self.wait {
            std::future::pending::<()>().await;
        }
        Err(io::Error::new(io::ErrorKind::PermissionDenied, "refused"))
    }

    fn is_tls(&self) -> bool {
        false
    }
}

/// An upstream that answers `GET /api/proto` with the
/// `X-Forwarded-Proto` the gateway sent it; returns its URL.
async fn upstream() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api", listener.local_addr().unwrap());
    let app = Router::new().route(
        "/api/proto",
        get(|headers: http::HeaderMap| async move {
            let proto = headers.get("x-forwarded-proto").cloned();
            proto.map_or_else(String::new, |p| p.to_str().unwrap_or("?").to_owned())
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// A gateway over `acceptor` (with `tls` added by `Gateway::tls`, if
/// any) on two threads; returns its address.
async fn start<A: Accept>(
    acceptor: A,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: ConnectionLimits,
    shutdown: &CancellationToken,
) -> (SocketAddr, Running) {
    let layer = IdempotencyLayer::builder(MemoryStore::new()).build();
    let upstream = UpstreamSettings::new(upstream().await.parse().unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut gateway = Gateway::new(layer, upstream)
        .threads(2)
        .limits(limits)
        .acceptor(acceptor);
    if let Some(config) = tls {
        gateway = gateway.tls(config);
    }
    let running = gateway.start(listener, shutdown).await.unwrap();
    (addr, running)
}

const REQUEST: &[u8] = b"GET /proto HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

/// Sends [`REQUEST`] on `io` and reads the answer to its end.
async fn ask<T: AsyncRead + AsyncWrite + Unpin>(mut io: T) -> String {
    io.write_all(REQUEST).await.unwrap();
    let mut answer = Vec::new();
    // A TLS peer may close without close_notify once it answered.
    let _ = io.read_to_end(&mut answer).await;
    String::from_utf8(answer).unwrap()
}

/// Waits (up to 5 s) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    let since = Instant::now();
    while !done() {
        assert!(since.elapsed() < Duration::from_secs(5), "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn tls_config(ca: &TestCa) -> Arc<rustls::ServerConfig> {
    Arc::new(ca.server_config(&["localhost"], &[b"http/1.1"]))
}

fn connector(ca: &TestCa) -> tokio_rustls::TlsConnector {
    tokio_rustls::TlsConnector::from(Arc::new(ca.client_config(&[b"http/1.1"])))
}

/// Eight connections open at once, spread over both serving threads: the
/// step set up each of them (its peer is one of the clients), on the
/// thread that served it, and every byte of every answer went through
/// the I/O it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_of_ones_own_sets_up_every_connection() {
    let recorder = Recorder::new(TcpAcceptor::new());
    let shutdown = CancellationToken::new();
    let limits = ConnectionLimits::default();
    let (addr, running) = start(recorder.clone(), None, limits, &shutdown).await;

    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(TcpStream::connect(addr).await.unwrap());
    }
    // Held open together, so that the accepting thread hands some over.
    until("every connection set up", || {
        recorder.seen().peers.len() == 8
    })
    .await;
    let mut expected: Vec<SocketAddr> = clients.iter().map(|c| c.local_addr().unwrap()).collect();
    let mut answered = 0;
    for client in clients {
        let answer = ask(client).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nhttp"), "{answer}");
        answered += answer.len();
    }
    assert_eq!(
        recorder.written(),
        answered,
        "every answer's bytes went through the step's I/O"
    );
    {
        let seen = recorder.seen();
        let mut peers = seen.peers.clone();
        peers.sort();
        expected.sort();
        assert_eq!(peers, expected);
        let threads: Vec<&str> = seen.threads.iter().map(String::as_str).collect();
        assert_eq!(
            threads,
            ["idem-serve-0", "idem-serve-1"],
            "set up where served"
        );
        assert!(seen.alpn.iter().all(Option::is_none), "no TLS, no ALPN");
    }
    shutdown.cancel();
    running.wait().await.unwrap();
}

/// TLS composed with steps of one's own, both ways: explicitly (a step
/// below TLS and one above it) and with `Gateway::tls` over a step. The
/// step below sees the ciphertext (more bytes than the answer), the one
/// above the answer itself and the protocol ALPN chose; the upstream is
/// told `https` through the wrappers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_composes_with_steps_of_ones_own() {
    let ca = TestCa::new("acceptor test CA");
    let config = tls_config(&ca);
    let connector = connector(&ca);
    let below = Recorder::new(TcpAcceptor::new());
    let above = Recorder::new(RustlsAcceptor::over(below.clone(), config.clone()));
    let under_tls = Recorder::new(TcpAcceptor::new());
    let limits = ConnectionLimits::default();
    let shutdown = CancellationToken::new();
    let (explicit, running) = start(above.clone(), None, limits, &shutdown).await;
    let (convenient, running_too) = start(under_tls.clone(), Some(config), limits, &shutdown).await;

    for addr in [explicit, convenient] {
        for _ in 0..3 {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let name = ServerName::try_from("localhost").unwrap();
            let tls = connector.connect(name, tcp).await.unwrap();
            assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
            let answer = ask(tls).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            assert!(answer.ends_with("\r\n\r\nhttps"), "{answer}");
        }
    }
    assert_eq!(above.seen().peers.len(), 3);
    assert_eq!(below.seen().peers.len(), 3);
    assert_eq!(under_tls.seen().peers.len(), 3);
    assert_eq!(above.seen().alpn, vec![Some(b"http/1.1".to_vec()); 3]);
    assert_eq!(
        below.seen().alpn,
        vec![None; 3],
        "below TLS: nothing negotiated yet"
    );
    assert!(
        below.written() > above.written(),
        "ciphertext and handshake"
    );
    assert!(under_tls.written() > 0);
    shutdown.cancel();
    running.wait().await.unwrap();
    running_too.wait().await.unwrap();
}

/// A step that fails closes its connection unanswered; one that never
/// finishes is given up after the header timeout, and at shutdown at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_or_stuck_step_closes_the_connection() {
    let limits = ConnectionLimits {
        header_timeout: Duration::from_millis(300),
        ..ConnectionLimits::default()
    };
    let tried = Arc::new(AtomicUsize::new(0));
    let refusing = Stuck {
        wait: false,
        tried: tried.clone(),
    };
    let shutdown = CancellationToken::new();
    let (addr, running) = start(refusing, None, limits, &shutdown).await;
    let answer = ask(TcpStream::connect(addr).await.unwrap()).await;
    assert_eq!(answer, "", "closed unanswered");
    assert_eq!(tried.load(Ordering::SeqCst), 1);
    shutdown.cancel();
    running.wait().await.unwrap();

    let stuck = Stuck {
        wait: true,
        tried: tried.clone(),
    };
    let shutdown = CancellationToken::new();
    let (addr, running) = start(stuck, None, limits, &shutdown).await;
    let since = Instant::now();
    let mut client = TcpStream::connect(addr).await.unwrap();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), client.read(&mut byte)).await;
    assert!(matches!(read, Ok(Ok(0))), "closed: {read:?}");
    assert!(
        since.elapsed() >= Duration::from_millis(300),
        "not before the header timeout"
    );
    // Another stuck connection when the token is cancelled: the drain
    // does not wait for it (the grace is 30 s).
    let _held = TcpStream::connect(addr).await.unwrap();
    until("set up began", || tried.load(Ordering::SeqCst) == 3).await;
    let since = Instant::now();
    shutdown.cancel();
    running.wait().await.unwrap();
    assert!(
        since.elapsed() < Duration::from_secs(2),
        "{:?}",
        since.elapsed()
    );
}
