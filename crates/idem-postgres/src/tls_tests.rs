//! TLS against the machine's PostgreSQL (`ssl = on`), with the server's own
//! certificate as the trusted CA and a CA made here that signed nothing the
//! server holds.

use idem_core::StoreErrorKind;
use idem_testkit::tls::TestCa;

use crate::PostgresStore;
use idem_testkit::{IsolatedBackend, unique_name};

use crate::tests::TestPostgres;

/// `url` with one more query parameter.
fn with(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// The server's certificate (PEM), read from the file it names, or `None`
/// (after saying why) when the server has TLS off. Under `CI=true` TLS
/// must be on: the machine's PostgreSQL has `ssl = on`.
async fn server_certificate(url: &str) -> Option<Vec<u8>> {
    let store = PostgresStore::builder(with(url, "sslmode=disable"))
        .schema(unique_name("tlsprobe"))
        .connect()
        .await
        .expect("connect without TLS");
    let client = store.pool().get().await.expect("a connection");
    let ssl: String = client
        .query_one("SHOW ssl", &[])
        .await
        .expect("SHOW ssl")
        .get(0);
    let file: String = client
        .query_one("SHOW ssl_cert_file", &[])
        .await
        .expect("SHOW ssl_cert_file")
        .get(0);
    drop(client);
    let _ = store.drop_schema().await;
    if ssl != "on" {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the test PostgreSQL has ssl = {ssl}; CI needs it on"
        );
        eprintln!("skipped: the test PostgreSQL has ssl = {ssl}");
        return None;
    }
    Some(std::fs::read(&file).unwrap_or_else(|e| panic!("read {file}: {e}")))
}

/// Connects with `sslmode` and the CA given; on success, whether the
/// store's own connection is encrypted (from `pg_stat_ssl`).
async fn connect(
    url: &str,
    sslmode: &str,
    ca: Option<&[u8]>,
) -> Result<bool, idem_core::StoreError> {
    let mut builder =
        PostgresStore::builder(with(url, &format!("sslmode={sslmode}"))).schema(unique_name("tls"));
    if let Some(ca) = ca {
        builder = builder.ca_pem(ca);
    }
    let store = builder.connect().await?;
    let client = store.pool().get().await.expect("a connection");
    let encrypted: bool = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .get(0);
    drop(client);
    store.drop_schema().await.expect("drop the test schema");
    Ok(encrypted)
}

#[test]
fn each_sslmode_encrypts_and_checks_as_libpq_does() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    idem_testkit::runtime().block_on(async {
        let Some(server_cert) = server_certificate(&url).await else {
            return;
        };
        let stranger = TestCa::new("a CA the server never used").cert_pem();

        assert!(
            !connect(&url, "disable", None).await.unwrap(),
            "disable: plain"
        );
        assert!(
            connect(&url, "prefer", None).await.unwrap(),
            "prefer: encrypted"
        );
        assert!(
            connect(&url, "require", None).await.unwrap(),
            "require: encrypted"
        );
        // require checks nothing without a CA; with one it checks the
        // chain, as verify-ca does (libpq's reading).
        assert!(connect(&url, "require", Some(&server_cert)).await.unwrap());
        assert!(
            connect(&url, "require", Some(stranger.as_bytes()))
                .await
                .is_err()
        );
        // A CA with a mode that may not encrypt is refused before connecting.
        for mode in ["prefer", "disable"] {
            let e = connect(&url, mode, Some(&server_cert)).await.unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Setup, "{mode}: {e}");
        }

        // verify-ca: the chain must lead to the CA given.
        assert!(
            connect(&url, "verify-ca", Some(&server_cert))
                .await
                .unwrap()
        );
        let refused = connect(&url, "verify-ca", Some(stranger.as_bytes()))
            .await
            .unwrap_err();
        assert_ne!(refused.kind(), StoreErrorKind::Setup, "{refused:?}");
        assert!(
            format!("{refused:?}").contains("UnknownIssuer"),
            "refused for its issuer: {refused:?}"
        );

        // verify-full also checks the name: the machine's certificate
        // (CN=localhost, no subjectAltName) names no host rustls accepts,
        // so the same CA that verify-ca accepted is not enough.
        let refused = connect(&url, "verify-full", Some(&server_cert))
            .await
            .unwrap_err();
        assert!(
            format!("{refused:?}").contains("NotValidForName"),
            "refused for its name: {refused:?}"
        );
    });
}

#[test]
fn a_checked_mode_cannot_be_undone_by_a_second_sslmode() {
    for url in [
        "postgres://u@h/db?sslmode=verify-full&sslmode=disable",
        "postgres://u@h/db?sslmode=verify-ca&ssl%6dode=disable",
        "postgres://u@h/db?sslmode=disable&sslmode=verify-full&sslmode=prefer",
    ] {
        let e = PostgresStore::builder(url).check().unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Setup, "{url}: {e}");
    }
    assert!(
        PostgresStore::builder("postgres://u@h/db?sslmode=disable&sslmode=verify-full")
            .check()
            .is_ok()
    );
}

#[test]
fn a_ca_file_without_certificates_is_a_setup_error() {
    for pem in [
        "",
        "not a certificate",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    ] {
        let e = PostgresStore::builder("postgres://u@h/db?sslmode=verify-full")
            .ca_pem(pem)
            .check()
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Setup, "{pem:?}: {e}");
    }
}
