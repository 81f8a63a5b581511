//! TLS against a `redis-server` started here with `--tls-port` and a
//! certificate from a CA made at run time.

use std::time::Duration;

use idem_core::{Claim, Store, StoreErrorKind};
use idem_testkit::private_redis::{PrivateRedis, free_port};
use idem_testkit::tls::{TestCa, write};
use idem_testkit::{IsolatedBackend, request, t0, unique_id};

use crate::RedisStore;
use crate::tests::TestRedis;

#[test]
fn rediss_checks_the_servers_certificate() {
    // Runs where the other Redis tests run (CI has redis-server).
    if TestRedis::url().is_none() {
        return;
    }
    let dir = tempfile_dir();
    let ca = TestCa::new("idem test CA");
    let issued = ca.issue(&["127.0.0.1", "localhost"]);
    let cert = write(dir.path(), "server.pem", &issued.cert_pem);
    let key = write(dir.path(), "server.key", &issued.key_pem);
    let ca_file = write(dir.path(), "ca.pem", &ca.cert_pem());
    let port = free_port();
    let Some(server) = PrivateRedis::start_tls(port, &cert, &key, &ca_file) else {
        return;
    };
    server.wait_ready();
    assert!(server.url().starts_with("rediss://"));

    // The driver takes the process's provider; the binary installs ring at
    // start, and so does this test.
    let _ = rustls::crypto::ring::default_provider().install_default();
    idem_testkit::runtime().block_on(async {
        // Trusting the CA that signed the server's certificate: the store
        // works over TLS.
        let store = RedisStore::builder(server.url())
            .ca_pem(ca.cert_pem())
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .expect("connect over TLS");
        let id = unique_id("redis-tls-01");
        assert!(matches!(
            store.claim(&request(&id, "{}", t0())).await.unwrap(),
            Claim::Acquired(_)
        ));

        // Another CA: refused, whatever the server says.
        a_stranger_ca_is_refused(&server.url()).await;

        // The system's roots do not hold the test CA either.
        assert!(
            RedisStore::builder(server.url())
                .timeout(Duration::from_secs(2))
                .connect()
                .await
                .is_err()
        );

        // Plain Redis to a TLS port gets no answer it can use.
        assert!(
            RedisStore::builder(format!("redis://127.0.0.1:{port}"))
                .timeout(Duration::from_millis(500))
                .connect()
                .await
                .is_err()
        );
    });
}

#[test]
fn certificate_checks_cannot_be_turned_off() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let e = RedisStore::builder("rediss://127.0.0.1:6380/#insecure")
        .check()
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Setup, "{e}");
    let e = RedisStore::builder("rediss://127.0.0.1:6380/")
        .ca_pem("not a certificate")
        .check()
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Setup, "{e}");
    // A CA with a plain URL would be ignored: refused.
    let ca = TestCa::new("unused").cert_pem();
    let e = RedisStore::builder("redis://127.0.0.1:6379/")
        .ca_pem(ca)
        .check()
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Setup, "{e}");
}

fn tempfile_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

/// A store that trusts only a CA that never signed the server's
/// certificate cannot connect to `url`, and says why.
pub(crate) async fn a_stranger_ca_is_refused(url: &str) {
    let stranger = TestCa::new("a CA the server never used");
    let refused = RedisStore::builder(url)
        .ca_pem(stranger.cert_pem())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect_err("a certificate the CA did not sign");
    assert!(
        format!("{refused:?}").contains("UnknownIssuer"),
        "refused for its issuer: {refused:?}"
    );
}
