//! TLS settings read from PEM files: the gateway's own certificate
//! (`--tls-cert`, `--tls-key`), the CA an HTTPS upstream is checked
//! against (`--upstream-ca`, or the system's roots), and the CA of a store
//! (`--store-ca`, handed to the store's driver). rustls with ring; files are
//! read and checked when the configuration is, so a bad one is a
//! configuration error (exit 2), not a failure at the first request.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Makes ring the process's crypto provider, for the drivers that take
/// the process default (the Redis client). Once, at start.
pub(crate) fn install_crypto_provider() {
    // An error means one is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A PEM file of certificates, with at least one.
#[derive(Debug, Clone)]
pub(crate) struct CaFile {
    pub(crate) path: PathBuf,
    /// Handed to a store's driver.
    pub(crate) pem: Vec<u8>,
    certs: Vec<CertificateDer<'static>>,
}

impl CaFile {
    /// The file's bytes, as a store's driver takes them.
    pub(crate) fn pem(&self) -> &[u8] {
        &self.pem
    }

    pub(crate) fn read(path: &Path) -> anyhow::Result<CaFile> {
        let pem = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let certs = certificates(&pem).with_context(|| format!("{}", path.display()))?;
        Ok(CaFile {
            path: path.to_owned(),
            pem,
            certs,
        })
    }
}

fn certificates(pem: &[u8]) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        bail!("holds no PEM certificate");
    }
    Ok(certs)
}

/// The client side of HTTPS to the upstream: the certificate must chain to
/// the CA given (only it), or to one of the system's roots, and name the
/// upstream's host.
pub(crate) fn upstream_client(ca: Option<&CaFile>) -> anyhow::Result<ClientConfig> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(ca) => {
            for cert in &ca.certs {
                roots.add(cert.clone()).with_context(|| {
                    format!("{}: a certificate rustls cannot use", ca.path.display())
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A system root rustls cannot parse is skipped.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                bail!(
                    "no system CA certificates found for the https:// upstream; give --upstream-ca FILE"
                );
            }
        }
    }
    // No ALPN here: the HTTPS connector offers http/1.1 itself.
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS setup")?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The gateway's own listener: a certificate chain and its private key.
#[derive(Debug, Clone)]
pub(crate) struct ServerTls {
    pub(crate) cert_path: PathBuf,
    pub(crate) key_path: PathBuf,
    pub(crate) config: Arc<ServerConfig>,
}

impl ServerTls {
    pub(crate) fn read(cert_path: &Path, key_path: &Path) -> anyhow::Result<ServerTls> {
        let pem = std::fs::read(cert_path)
            .with_context(|| format!("--tls-cert: cannot read {}", cert_path.display()))?;
        let chain =
            certificates(&pem).with_context(|| format!("--tls-cert {}", cert_path.display()))?;
        let key_pem = std::fs::read(key_path)
            .with_context(|| format!("--tls-key: cannot read {}", key_path.display()))?;
        // The key's bytes never reach a message.
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| {
            anyhow::anyhow!(
                "--tls-key {}: holds no PEM private key (PKCS#8, PKCS#1 or SEC1)",
                key_path.display()
            )
        })?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .context("TLS setup")?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .with_context(|| {
                format!(
                    "--tls-cert {} with --tls-key {}",
                    cert_path.display(),
                    key_path.display()
                )
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(ServerTls {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            config: Arc::new(config),
        })
    }
}
