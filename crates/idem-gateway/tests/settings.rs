//! Settings a gateway cannot serve with are refused by `Gateway::start`
//! with an error that names them, before anything runs; a grace without
//! a bound still drains; and the gateway's `Debug` keeps the upstream's
//! password to itself.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::sync::Arc;
use std::time::Duration;

use idem_core::{MemoryStore, Store};
use idem_gateway::{
    Accept, ConnectionLimits, Gateway, OpenStore, RustlsAcceptor, TcpAcceptor, ThreadStores,
    UpstreamSettings,
};
use idem_http::IdempotencyLayer;
use idem_testkit::tls::TestCa;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// An upstream never reached: these gateways serve no request.
fn upstream() -> UpstreamSettings {
    UpstreamSettings::new("http://127.0.0.1:9/".parse().unwrap())
}

fn gateway() -> Gateway {
    Gateway::new(IdempotencyLayer::new(MemoryStore::new()), upstream()).threads(2)
}

/// What `start` says of `gateway`, which it must refuse.
async fn refused<A: Accept>(gateway: Gateway<A>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let shutdown = CancellationToken::new();
    match gateway.start(listener, &shutdown).await {
        Ok(running) => {
            shutdown.cancel();
            let _ = running.wait().await;
            panic!("started");
        }
        Err(e) => e.to_string(),
    }
}

fn limits(change: impl FnOnce(&mut ConnectionLimits)) -> ConnectionLimits {
    let mut limits = ConnectionLimits::default();
    change(&mut limits);
    limits
}

fn with_upstream(change: impl FnOnce(&mut UpstreamSettings)) -> Gateway {
    let mut settings = upstream();
    change(&mut settings);
    Gateway::new(IdempotencyLayer::new(MemoryStore::new()), settings).threads(2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limits_outside_their_bounds_are_refused() {
    for max in [0, usize::MAX] {
        let error = refused(gateway().limits(limits(|l| l.max_connections = max))).await;
        assert!(error.contains("max_connections"), "{error}");
        assert!(error.contains(&max.to_string()), "{error}");
    }
    for header in [Duration::ZERO, Duration::MAX] {
        let error = refused(gateway().limits(limits(|l| l.header_timeout = header))).await;
        assert!(error.contains("header_timeout"), "{error}");
    }
    let error = refused(gateway().limits(limits(|l| l.stall_timeout = Duration::ZERO))).await;
    assert!(error.contains("stall_timeout"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_timeouts_outside_their_bounds_are_refused() {
    for timeout in [Duration::ZERO, Duration::MAX] {
        let error = refused(with_upstream(|u| u.timeout = timeout)).await;
        assert!(error.contains("UpstreamSettings::timeout"), "{error}");
        let error = refused(with_upstream(|u| u.body_timeout = timeout)).await;
        assert!(error.contains("body_timeout"), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_serving_thread_is_refused() {
    let error = refused(gateway().threads(0)).await;
    assert!(error.contains("threads"), "{error}");
}

/// Per-thread stores made for one thread, on a gateway of two: the
/// second thread would have had no instance of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_stores_for_another_number_of_threads_are_refused() {
    let main: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let open: OpenStore =
        Arc::new(|| Box::pin(async { Ok(Arc::new(MemoryStore::new()) as Arc<dyn Store>) }));
    let stores = ThreadStores::new(main, 1, open);
    let layer = IdempotencyLayer::builder_shared(stores.clone()).build();
    let gateway = Gateway::new(layer, upstream())
        .threads(2)
        .thread_stores(stores);
    let error = refused(gateway).await;
    assert!(error.contains("ThreadStores"), "{error}");
    assert!(error.contains('1') && error.contains('2'), "{error}");
}

fn tls_config() -> Arc<rustls::ServerConfig> {
    let issued = TestCa::new("settings test CA").issue(&["localhost"]);
    let certs = CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    Arc::new(config)
}

/// A TLS step and `Gateway::tls` together would run TLS inside TLS, which
/// no client speaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_over_a_tls_step_is_refused() {
    let config = tls_config();
    let gateway = gateway()
        .acceptor(RustlsAcceptor::over(TcpAcceptor::new(), config.clone()))
        .tls(config);
    let error = refused(gateway).await;
    assert!(error.contains("TLS"), "{error}");
}

/// `Duration::MAX` as the grace: drain without a bound of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grace_without_bound_drains() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let running = gateway()
        .threads(1)
        .shutdown_grace(Duration::MAX)
        .start(listener, &shutdown)
        .await
        .unwrap();
    // Answered (502: the upstream is never reached), so the thread's
    // accept loop runs, and drains when the token is cancelled.
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    shutdown.cancel();
    let waited = tokio::time::timeout(Duration::from_secs(5), running.wait()).await;
    assert!(matches!(waited, Ok(Ok(()))), "{waited:?}");
}

#[test]
fn debug_shows_the_upstream_without_its_password() {
    let settings = UpstreamSettings::new(
        "https://user:s3cret@upstream.internal:8443/api?q=1"
            .parse()
            .unwrap(),
    );
    let gateway = Gateway::new(IdempotencyLayer::new(MemoryStore::new()), settings.clone());
    for shown in [format!("{gateway:?}"), format!("{settings:?}")] {
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(!shown.contains("user"), "{shown}");
        assert!(
            shown.contains("https://upstream.internal:8443/api?q=1"),
            "{shown}"
        );
    }
}
