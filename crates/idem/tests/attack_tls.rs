//! Review of issue 13's HTTPS listener (attack tests): each test states
//! the contract and fails while the bug it names is there.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_testkit::tls::{TestCa, write};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use support::gateway;

/// Nobody listens on the discard port: a forwarded request fails at once.
const DEAD_UPSTREAM: &str = "http://127.0.0.1:9";

/// Starts a gateway (HTTPS with `tls`) whose header timeout is 20 s, opens
/// a connection that sends nothing, makes sure the gateway accepted it,
/// sends SIGTERM, and says how long the process took to exit.
async fn shutdown_time_with_a_silent_connection(tls: bool) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("attack CA");
    let issued = ca.issue(&["localhost", "127.0.0.1"]);
    let cert = write(dir.path(), "gateway.pem", &issued.cert_pem);
    let key = write(dir.path(), "gateway.key", &issued.key_pem);
    let mut args = vec!["--header-timeout", "20s"];
    if tls {
        args.extend(["--tls-cert", cert.to_str().unwrap()]);
        args.extend(["--tls-key", key.to_str().unwrap()]);
    }
    let mut g = gateway(DEAD_UPSTREAM, "memory:", &args).await;
    let addr = support::addr(&g.base);
    let silent = std::net::TcpStream::connect(&addr).unwrap();
    // A later connection that gets through proves the silent one, ahead
    // of it in the backlog, was accepted (and is in its handshake).
    if tls {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca.cert_pem().as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .unwrap();
    } else {
        let answer = support::raw(
            &g.base,
            b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(answer.starts_with("HTTP/1.1 "), "{answer:?}");
    }
    let asked = Instant::now();
    g.proc.terminate();
    g.proc.child.wait().unwrap();
    let took = asked.elapsed();
    drop(silent);
    took
}

/// Control: over plain HTTP a connection that never sent a byte is idle,
/// and graceful shutdown closes it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_does_not_hold_up_shutdown_over_http() {
    let took = shutdown_time_with_a_silent_connection(false).await;
    assert!(took < Duration::from_secs(5), "exited after {took:?}");
}

/// Over HTTPS the same connection sits in `acceptor.accept` holding a
/// graceful-shutdown watcher that nothing cancels, so SIGTERM waits for
/// the handshake timeout (the header timeout, here 20 s) before the
/// process exits: any client delays every deploy by that much.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_does_not_hold_up_shutdown_over_https() {
    let took = shutdown_time_with_a_silent_connection(true).await;
    assert!(took < Duration::from_secs(5), "exited after {took:?}");
}
