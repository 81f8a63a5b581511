//! TLS on every path the gateway has, against real peers, with
//! certificates made here at run time: an HTTPS upstream (`--upstream-ca`),
//! the gateway's own HTTPS listener (`--tls-cert`, `--tls-key`), the
//! machine's PostgreSQL (`sslmode=verify-ca` with `--store-ca`) and a
//! `redis-server` speaking only TLS (`rediss://` with `--store-ca`). Each
//! path also meets a certificate its CA did not sign, and refuses it.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::http::HeaderMap;
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use idem_testkit::tls::{Issued, TestCa, write};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use support::{free_port, gateway, idem};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// An upstream that counts the requests it got and echoes what the
/// gateway told it about the client's protocol.
#[derive(Clone, Default)]
struct Upstream {
    requests: Arc<AtomicU64>,
}

impl Upstream {
    fn router(&self) -> Router {
        let requests = self.requests.clone();
        Router::new().route(
            "/orders",
            post(move |headers: HeaderMap| async move {
                let n = requests.fetch_add(1, Ordering::SeqCst) + 1;
                let proto = headers
                    .get("x-forwarded-proto")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                (
                    axum::http::StatusCode::CREATED,
                    format!("{{\"execution\":{n},\"proto\":\"{proto}\"}}"),
                )
            }),
        )
    }

    fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Serves `app` over HTTPS with `issued` on a free port of 127.0.0.1.
async fn serve_https(app: Router, issued: &Issued) -> SocketAddr {
    let chain = CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                    .await;
            });
        }
    });
    addr
}

type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A client that trusts only `ca_pem`.
fn https_client(ca_pem: &str) -> HttpsClient {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .enable_http1()
        .build();
    Client::builder(TokioExecutor::new()).build(connector)
}

/// POSTs `/orders` with `key`; returns the status, whether it was a
/// replay, and the body.
async fn post_order(client: &HttpsClient, base: &str, key: &str) -> (u16, bool, String) {
    let request = http::Request::post(format!("{base}/orders"))
        .header("idempotency-key", key)
        .header("authorization", "Bearer tls-test")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"amount\":1}")))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        replayed,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// POSTs through a plain-HTTP gateway with reqwest.
async fn post_plain(base: &str, key: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/orders"))
        .header("idempotency-key", key)
        .header("authorization", "Bearer tls-test")
        .header("content-type", "application/json")
        .body("{\"amount\":1}")
        .send()
        .await
        .unwrap()
}

/// An https upstream that takes the TCP connection but never answers the
/// TLS handshake: nothing of the request was written by the upstream
/// timeout, so the answer is 502 `upstream-unreachable` with the key
/// released (the retry with the same key is tried again, not held as of
/// unknown outcome behind a 409 until the lease ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upstream_handshake_releases_the_key() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        // Holds what it accepts, silent.
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let g = gateway(
        &format!("https://127.0.0.1:{}", addr.port()),
        "memory:",
        &["--upstream-timeout", "300ms"],
    )
    .await;
    for attempt in 1..=2 {
        let answer = post_plain(&g.base, "stalled-handshake-key-0001").await;
        assert_eq!(answer.status(), 502, "attempt {attempt}");
        let body = answer.text().await.unwrap();
        assert!(
            body.contains("upstream-unreachable"),
            "attempt {attempt}: {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_is_reached_only_with_a_certificate_its_ca_signed() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("upstream CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.cert_pem());
    let upstream = Upstream::default();
    let addr = serve_https(upstream.router(), &ca.issue(&["localhost", "127.0.0.1"])).await;
    let url = format!("https://localhost:{}", addr.port());

    // The private CA given: forwarded once, replayed after.
    let g = gateway(
        &url,
        "memory:",
        &["--upstream-ca", ca_file.to_str().unwrap()],
    )
    .await;
    let key = "tls-upstream-key-0001";
    let first = post_plain(&g.base, key).await;
    assert_eq!(first.status(), 201);
    let second = post_plain(&g.base, key).await;
    assert_eq!(second.status(), 201);
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    assert_eq!(upstream.requests(), 1);

    // The system's roots do not hold the private CA; another CA did not
    // sign the upstream's certificate: both refuse it before anything is
    // sent (502, the key released: a retry may go through later).
    let stranger = write(
        dir.path(),
        "stranger.pem",
        &TestCa::new("another CA").cert_pem(),
    );
    for extra in [vec![], vec!["--upstream-ca", stranger.to_str().unwrap()]] {
        let g = gateway(&url, "memory:", &extra).await;
        let refused = post_plain(&g.base, "tls-upstream-key-0002").await;
        assert_eq!(refused.status(), 502, "{extra:?}");
        let body = refused.text().await.unwrap();
        assert!(body.contains("upstream-unreachable"), "{extra:?}: {body}");
    }
    assert_eq!(upstream.requests(), 1, "nothing reached the upstream");

    // The right CA, but a certificate for another name.
    let other = Upstream::default();
    let addr = serve_https(other.router(), &ca.issue(&["other.example"])).await;
    let g = gateway(
        &format!("https://localhost:{}", addr.port()),
        "memory:",
        &["--upstream-ca", ca_file.to_str().unwrap()],
    )
    .await;
    assert_eq!(
        post_plain(&g.base, "tls-upstream-key-0003").await.status(),
        502
    );
    assert_eq!(other.requests(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_serves_https_with_its_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gateway CA");
    let issued = ca.issue(&["localhost", "127.0.0.1"]);
    let cert = write(dir.path(), "gateway.pem", &issued.cert_pem);
    let key = write(dir.path(), "gateway.key", &issued.key_pem);
    let upstream = Upstream::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_url = format!("http://{}", listener.local_addr().unwrap());
    let router = upstream.router();
    tokio::spawn(async move { axum::serve(listener, router).await });

    let g = gateway(
        &upstream_url,
        "memory:",
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--header-timeout",
            "1s",
        ],
    )
    .await;
    let https = g.base.replace("http://", "https://");
    let client = https_client(&ca.cert_pem());
    let (status, replayed, body) = post_order(&client, &https, "tls-listener-key-0001").await;
    assert_eq!(status, 201);
    assert!(!replayed);
    // The upstream is told the client used https.
    assert!(body.contains("\"proto\":\"https\""), "{body}");
    let (status, replayed, again) = post_order(&client, &https, "tls-listener-key-0001").await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(again, body);
    assert_eq!(upstream.requests(), 1);

    // A client that trusts another CA refuses the gateway.
    let stranger = https_client(&TestCa::new("another CA").cert_pem());
    let request = http::Request::post(format!("{https}/orders"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert!(stranger.request(request).await.is_err());

    // Plain HTTP to the TLS port gets no HTTP answer.
    let answer = support::raw(&g.base, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(!answer.starts_with("HTTP/"), "{answer:?}");

    // A client that connects and never starts its handshake is closed
    // after the header timeout (the read would otherwise wait 20 s and
    // fail the test below).
    use std::io::Read;
    let mut idle = std::net::TcpStream::connect(support::addr(&g.base)).unwrap();
    idle.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let mut buf = [0u8; 16];
    let read = idle.read(&mut buf);
    assert!(matches!(read, Ok(0)), "closed, not timed out: {read:?}");
    assert_eq!(upstream.requests(), 1);
}

#[test]
fn tls_settings_are_checked_before_start() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("check CA");
    let issued = ca.issue(&["localhost"]);
    let cert = write(dir.path(), "c.pem", &issued.cert_pem);
    let key = write(dir.path(), "c.key", &issued.key_pem);
    let other_key = write(dir.path(), "o.key", &ca.issue(&["localhost"]).key_pem);
    let ca_file = write(dir.path(), "ca.pem", &ca.cert_pem());
    let junk = write(dir.path(), "junk.pem", "not a certificate\n");
    let (cert, key, other_key, ca_file, junk) = (
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
        other_key.to_str().unwrap(),
        ca_file.to_str().unwrap(),
        junk.to_str().unwrap(),
    );
    let refused: [(&[&str], &str); 9] = [
        (
            &["--tls-cert", cert],
            "--tls-cert and --tls-key go together",
        ),
        (&["--tls-key", key], "--tls-cert and --tls-key go together"),
        (&["--tls-cert", cert, "--tls-key", other_key], "--tls-cert"),
        (&["--tls-cert", junk, "--tls-key", key], "--tls-cert"),
        (&["--tls-cert", cert, "--tls-key", cert], "--tls-key"),
        (
            &["--upstream-ca", ca_file],
            "--upstream-ca is for an https:// upstream",
        ),
        (
            &["--store", "sqlite:x.db", "--store-ca", ca_file],
            "--store-ca is for a PostgreSQL or Redis store",
        ),
        // A CA the URL would ignore is refused, not dropped.
        (
            &[
                "--store",
                "postgres://u@h/db?sslmode=prefer",
                "--store-ca",
                ca_file,
            ],
            "needs sslmode=require",
        ),
        (
            &["--store", "redis://127.0.0.1:6379", "--store-ca", ca_file],
            "is for a rediss:// URL",
        ),
    ];
    for (extra, expected) in refused {
        let mut args = vec!["check-config", "--upstream", "http://127.0.0.1:3000"];
        args.extend_from_slice(extra);
        let (code, _, stderr) = idem(&args);
        assert_eq!(code, 2, "{extra:?}: {stderr}");
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
        // A private key never reaches a message.
        assert!(!stderr.contains("PRIVATE KEY"), "{stderr}");
    }
    for (extra, expected) in [
        (["--upstream-ca", junk], "--upstream-ca"),
        (["--store-ca", junk], "--store-ca"),
    ] {
        let mut args = vec![
            "check-config",
            "--upstream",
            "https://localhost:3000",
            "--store",
            "redis://127.0.0.1:6379",
        ];
        args.extend_from_slice(&extra);
        let (code, _, stderr) = idem(&args);
        assert_eq!(code, 2, "{extra:?}: {stderr}");
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
    }

    let (code, stdout, stderr) = idem(&[
        "check-config",
        "--upstream",
        "https://localhost:3000",
        "--upstream-ca",
        ca_file,
        "--tls-cert",
        cert,
        "--tls-key",
        key,
        "--store",
        "rediss://127.0.0.1:6380",
        "--store-ca",
        ca_file,
    ]);
    assert_eq!(code, 0, "{stderr}");
    for line in [
        format!("tls_cert = \"{cert}\""),
        format!("tls_key = \"{key}\""),
        format!("upstream_ca = \"{ca_file}\""),
        format!("store_ca = \"{ca_file}\""),
        "store = \"rediss://127.0.0.1:6380\"".to_owned(),
    ] {
        assert!(stdout.contains(&line), "{line} in {stdout}");
    }
}

fn unix_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A gateway on `store` with `--store-ca ca` executes a new key once and
/// replays it; with `--store-ca stranger` it does not start (exit 1).
async fn store_over_tls(upstream: &str, store: &str, ca: &str, stranger: &str) {
    let g = gateway(upstream, store, &["--store-ca", ca]).await;
    // A shared database outlives this run: a key of its own.
    let key = format!("tls-store-{}-{}", std::process::id(), unix_nanos());
    assert_eq!(post_plain(&g.base, &key).await.status(), 201);
    let again = post_plain(&g.base, &key).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    drop(g);
    let (code, stderr) = serve_fails(upstream, store, &["--store-ca", stranger]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("cannot reach store"), "{stderr}");
}

/// Starts `idem serve` expecting it to fail at start; returns its exit
/// code and standard error.
fn serve_fails(upstream: &str, store: &str, extra: &[&str]) -> (i32, String) {
    let mut args = vec![
        "serve",
        "--upstream",
        upstream,
        "--store",
        store,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let (code, _, stderr) = idem(&args);
    (code, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_over_tls_are_checked_against_the_store_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("redis CA");
    let stranger = write(
        dir.path(),
        "stranger.pem",
        &TestCa::new("another CA").cert_pem(),
    );
    let stranger = stranger.to_str().unwrap();
    let upstream = Upstream::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_url = format!("http://{}", listener.local_addr().unwrap());
    let router = upstream.router();
    tokio::spawn(async move { axum::serve(listener, router).await });

    let mut checked = 0;
    // PostgreSQL: the machine's server certificate is self-signed, so it
    // is its own CA (verify-ca; its name is not checked).
    if let Some(pg) = idem_testkit::backend_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL") {
        let cert_file = "/etc/ssl/certs/ssl-cert-snakeoil.pem";
        if std::path::Path::new(cert_file).exists() {
            let sep = if pg.contains('?') { '&' } else { '?' };
            let url = format!("{pg}{sep}sslmode=verify-ca");
            store_over_tls(&upstream_url, &url, cert_file, stranger).await;
            checked += 1;
        } else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI's PostgreSQL uses {cert_file}"
            );
            eprintln!("skipped the PostgreSQL part: no {cert_file}");
        }
    }
    // Redis: a server of our own that speaks only TLS.
    if idem_testkit::backend_url("IDEM_TEST_REDIS_URL", "Redis").is_some() {
        let issued = ca.issue(&["127.0.0.1"]);
        let cert = write(dir.path(), "redis.pem", &issued.cert_pem);
        let key = write(dir.path(), "redis.key", &issued.key_pem);
        let ca_file = write(dir.path(), "ca.pem", &ca.cert_pem());
        let port = free_port();
        let server =
            idem_testkit::private_redis::PrivateRedis::start_tls(port, &cert, &key, &ca_file)
                .expect("redis-server");
        server.wait_ready();
        store_over_tls(
            &upstream_url,
            &server.url(),
            ca_file.to_str().unwrap(),
            stranger,
        )
        .await;
        checked += 1;
    }
    assert_eq!(upstream.requests(), checked, "one execution per store");
}
