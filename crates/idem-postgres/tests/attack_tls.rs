//! Review of issue 13's PostgreSQL TLS (attack tests), against the
//! machine's PostgreSQL (`ssl = on`) with a CA that signed nothing the
//! server holds: every connection below that succeeds went unchecked.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::sync::atomic::{AtomicU32, Ordering};

use idem_postgres::PostgresStore;
use idem_testkit::tls::TestCa;

fn url() -> Option<String> {
    idem_testkit::backend_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL")
}

fn with(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// Connects with `ca` as the only trusted CA; `true` if it got through.
async fn connects(url: &str, ca: &str) -> bool {
    static N: AtomicU32 = AtomicU32::new(0);
    let schema = format!(
        "idem_t_attack_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    match PostgresStore::builder(url)
        .schema(schema)
        .ca_pem(ca)
        .connect()
        .await
    {
        Ok(store) => {
            let _ = store.drop_schema().await;
            true
        }
        Err(_) => false,
    }
}

/// Passes today: every spelling of verify-ca / verify-full that libpq or
/// tokio-postgres would read is either checked or refused, never
/// downgraded.
#[test]
fn no_spelling_of_a_checked_sslmode_connects_unchecked() {
    let Some(url) = url() else { return };
    let stranger = TestCa::new("a CA the server never used").cert_pem();
    idem_testkit::runtime().block_on(async {
        for param in [
            "sslmode=verify-full",
            "sslmode=verify-ca",
            "sslmode=verify%2Dca",
            "ssl%6Dode=verify-ca",
            "sslmode=verify-ca%20",
            "SSLMODE=verify-ca",
            "sslmode=disable&sslmode=verify-ca",
            "sslmode=verify-ca&sslmode=require",
            "sslmode=verify-ca&sslmode=prefer",
            "sslmode=verify-ca&ssl%6Dode=require",
            "sslmode=verify-ca&sslmode=verify-ca",
            "application_name=x&sslmode=verify-ca&options=-c%20x%3Dy",
            "sslmode=verify-ca#",
            "sslnegotiation=direct&sslmode=verify-ca",
        ] {
            let target = with(&url, param);
            assert!(!connects(&target, &stranger).await, "{param}: unchecked");
        }
        // The key=value form, for the machine's server only.
        if url == "postgres://postgres@127.0.0.1:5432/test" {
            let base = "host=127.0.0.1 port=5432 user=postgres dbname=test";
            for param in [
                "sslmode=verify-ca",
                "sslmode = verify-ca",
                "sslmode='verify-ca'",
                "sslmode=verify-ca\r",
                "sslmode=disable sslmode=verify-ca",
                "sslmode=verify-ca sslmode=require",
                "application_name='a b' sslmode=verify-ca",
            ] {
                let target = format!("{base} {param}");
                assert!(!connects(&target, &stranger).await, "{param:?}: unchecked");
            }
        }
    });
}

/// Fails today: a CA given (`ca_pem`, `idem --store-ca`) is silently
/// ignored unless the URL says verify-ca/verify-full. libpq, which the
/// crate says it follows, treats `require` with a root certificate as
/// `verify-ca`; with `prefer` (the default) or `disable` the connection
/// may even be plain. An operator who gave a CA expects it to be used.
#[test]
fn a_ca_given_is_never_ignored() {
    let Some(url) = url() else { return };
    let stranger = TestCa::new("a CA the server never used").cert_pem();
    idem_testkit::runtime().block_on(async {
        let mut unchecked = Vec::new();
        for param in [
            None,
            Some("sslmode=prefer"),
            Some("sslmode=require"),
            Some("sslmode=disable"),
        ] {
            let target = param.map_or_else(|| url.clone(), |p| with(&url, p));
            if connects(&target, &stranger).await {
                unchecked.push(param.unwrap_or("(no sslmode)"));
            }
        }
        assert!(
            unchecked.is_empty(),
            "connected despite the CA: {unchecked:?}"
        );
    });
}
