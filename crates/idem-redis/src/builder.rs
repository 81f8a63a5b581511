//! Options for connecting a store, and connecting it.

use std::time::Duration;

use idem_core::{StoreError, StoreErrorKind};
use redis::IntoConnectionInfo;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::RedisStore;
use crate::error::redis_error;
use crate::scripts::{Keys, Scripts};

/// Options for connecting a store.
#[derive(Clone)]
pub struct RedisStoreBuilder {
    url: String,
    prefix: String,
    timeout: Duration,
    /// Trusted CA certificates (PEM) instead of the system's roots.
    ca_pem: Option<Vec<u8>>,
}

/// Without the URL, which may hold a password.
impl std::fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("ca_pem", &self.ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

impl RedisStoreBuilder {
    /// The default options for `url`.
    pub(crate) fn new(url: String) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url,
            prefix: "idem".into(),
            timeout: Duration::from_secs(2),
            ca_pem: None,
        }
    }

    /// The prefix of every key this store writes. Default `idem`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one operation, or one connection attempt, may take before
    /// it fails with `Unavailable`. Default 2 s.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Trust only these CA certificates (PEM, one or more) for a
    /// `rediss://` server, instead of the system's roots: for a server
    /// whose certificate a private CA signed. The server's certificate is
    /// always checked, name included (no `#insecure`). Refused with a
    /// plain `redis://` URL, where it would be ignored.
    ///
    /// The driver takes the process's default rustls `CryptoProvider`:
    /// install one at start (`rustls::crypto::ring::default_provider()
    /// .install_default()`); without it a `rediss://` store is refused.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Checks the URL as [`connect`](Self::connect) reads it, without
    /// connecting (for configuration checks).
    ///
    /// # Errors
    /// [`StoreErrorKind::Setup`] for a URL the driver cannot read. The
    /// message names what is wrong, never the URL.
    pub fn check(&self) -> Result<(), StoreError> {
        self.client().map(drop)
    }

    fn client(&self) -> Result<redis::Client, StoreError> {
        let invalid =
            |e| StoreError::new(StoreErrorKind::Setup, "redis store: invalid URL").with_source(e);
        let info = self.url.as_str().into_connection_info().map_err(invalid)?;
        if let redis::ConnectionAddr::TcpTls { insecure: true, .. } = info.addr() {
            // `rediss://...#insecure` turns certificate checks off.
            return Err(StoreError::new(
                StoreErrorKind::Setup,
                "redis store: #insecure is refused: the server's certificate is always checked",
            ));
        }
        let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        if tls && rustls::crypto::CryptoProvider::get_default().is_none() {
            // The driver builds its TLS configuration from the process's
            // default provider; without one it would panic on connect. A
            // library does not choose the process's provider for it.
            return Err(StoreError::new(
                StoreErrorKind::Setup,
                "redis store: rediss:// needs a rustls CryptoProvider installed for the process, e.g. rustls::crypto::ring::default_provider().install_default() at start",
            ));
        }
        if !tls && self.ca_pem.is_some() {
            return Err(StoreError::new(
                StoreErrorKind::Setup,
                "redis store: a CA certificate is for a rediss:// URL; this one is not encrypted",
            ));
        }
        match &self.ca_pem {
            None => redis::Client::open(info).map_err(invalid),
            // The driver reads the PEM only when it connects; a file
            // without a certificate is a configuration error now.
            Some(pem) if !holds_a_certificate(pem) => Err(StoreError::new(
                StoreErrorKind::Setup,
                "redis store: the CA file holds no certificate",
            )),
            Some(pem) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                },
            )
            .map_err(|e| {
                StoreError::new(
                    StoreErrorKind::Setup,
                    "redis store: cannot use the CA certificates",
                )
                .with_source(e)
            }),
        }
    }

    /// Connects.
    ///
    /// # Errors
    /// [`StoreErrorKind::Setup`] for a bad URL; [`StoreErrorKind::Unavailable`]
    /// when the server does not answer.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let client = self.client()?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.timeout))
            .set_connection_timeout(Some(self.timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| redis_error("connecting", e))?;
        Ok(RedisStore {
            conn,
            keys: Keys::new(self.prefix),
            scripts: Scripts::new(),
        })
    }
}

/// Whether `pem` holds at least one certificate, and only readable ones.
fn holds_a_certificate(pem: &[u8]) -> bool {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut found = false;
    for cert in CertificateDer::pem_slice_iter(pem) {
        if cert.is_err() {
            return false;
        }
        found = true;
    }
    found
}
