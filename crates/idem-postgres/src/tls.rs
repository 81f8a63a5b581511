//! TLS to the server, as the URL's `sslmode` asks, with rustls.
//!
//! libpq's modes, which tokio-postgres reads only in part (it knows
//! `disable`, `prefer` and `require`):
//!
//! | `sslmode` | encrypted | certificate checked | host name checked |
//! |---|---|---|---|
//! | `disable` | no | – | – |
//! | `prefer` (the default) | if the server offers it | no | no |
//! | `require` | yes, or no connection | no | no |
//! | `verify-ca` | yes | signed by a trusted CA | no |
//! | `verify-full` | yes | signed by a trusted CA | yes |
//!
//! `verify-ca` and `verify-full` are read here and handed to tokio-postgres
//! as `require`, with a certificate verifier that does the checking. The
//! trusted CAs are the system's roots, or only the PEM certificates given
//! to [`PostgresStoreBuilder::ca_pem`](crate::PostgresStoreBuilder::ca_pem).
//! A CA given is never ignored: with `require` it makes the check
//! `verify-ca`'s (as libpq does with a root certificate), and with
//! `prefer`, `disable` or no `sslmode` the builder refuses it.
//! Without a check (`prefer`, `require`) the connection is still encrypted
//! and the handshake's signatures still verified; only who holds the
//! certificate is not, as in libpq.

use std::sync::Arc;

use idem_core::{StoreError, StoreErrorKind};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientConfig, WebPkiServerVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error as TlsError, RootCertStore};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verification {
    /// Encrypted, nothing checked (`prefer`, `require`, or no `sslmode`).
    EncryptOnly,
    /// Signed by a trusted CA, any name (`verify-ca`).
    Ca,
    /// Signed by a trusted CA, for the host connected to (`verify-full`).
    Full,
}

/// Takes `sslmode=verify-ca` or `verify-full` out of a connection string
/// (URL query or `key=value` form), putting `require` in its place for
/// tokio-postgres, and says which check it asked for.
pub(crate) fn split_ssl_mode(url: &str) -> (String, Verification) {
    for (mode, verification) in [
        ("verify-full", Verification::Full),
        ("verify-ca", Verification::Ca),
    ] {
        let asked = format!("sslmode={mode}");
        // Only a whole parameter: preceded by `?`, `&` or white space (or
        // the start), and followed by `&`, white space or the end.
        let found = url.match_indices(&asked).find(|(at, _)| {
            let before = url[..*at].chars().next_back();
            let after = url[at + asked.len()..].chars().next();
            matches!(before, None | Some('?' | '&' | ' ' | '\t' | '\n'))
                && matches!(after, None | Some('&' | ' ' | '\t' | '\n'))
        });
        if let Some((at, _)) = found {
            let mut plain = String::with_capacity(url.len());
            plain.push_str(&url[..at]);
            plain.push_str("sslmode=require");
            plain.push_str(&url[at + asked.len()..]);
            return (plain, verification);
        }
    }
    (url.to_owned(), Verification::EncryptOnly)
}

/// The trusted roots: the PEM certificates given, or the system's.
fn roots(ca_pem: Option<&[u8]>) -> Result<RootCertStore, StoreError> {
    let mut roots = RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| setup("cannot read the CA certificates", e))?;
                roots
                    .add(cert)
                    .map_err(|e| setup("cannot use a CA certificate", e))?;
            }
            if roots.is_empty() {
                return Err(StoreError::new(
                    StoreErrorKind::Setup,
                    "postgres store: the CA file holds no certificate",
                ));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A system root rustls cannot parse is skipped, as browsers do.
                let _ = roots.add(cert);
            }
        }
    }
    Ok(roots)
}

fn setup(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::new(StoreErrorKind::Setup, format!("postgres store: {what}")).with_source(e)
}

/// The connector for tokio-postgres: rustls with ring, checking as asked.
pub(crate) fn connector(
    verification: Verification,
    ca_pem: Option<&[u8]>,
) -> Result<MakeRustlsConnect, StoreError> {
    // ring, named here rather than taken from the process default, so the
    // verifiers and the configuration agree whatever else is installed.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| setup("TLS setup", e))?;
    let config = match verification {
        Verification::Full => builder
            .with_root_certificates(roots(ca_pem)?)
            .with_no_client_auth(),
        Verification::Ca => {
            let inner = WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots(ca_pem)?),
                provider.clone(),
            )
            .build()
            .map_err(|e| setup("TLS setup", e))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyName(inner)))
                .with_no_client_auth()
        }
        Verification::EncryptOnly => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(
                provider.signature_verification_algorithms,
            )))
            .with_no_client_auth(),
    };
    Ok(MakeRustlsConnect::new(config))
}

/// `verify-ca`: the chain must lead to a trusted root; the name is not
/// checked.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(TlsError::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require`: any certificate; the handshake's signatures are
/// still verified, so the session is encrypted to whoever holds the key.
#[derive(Debug)]
struct EncryptOnly(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::{Verification, split_ssl_mode};

    #[test]
    fn verify_modes_are_taken_out_of_the_url() {
        let cases = [
            (
                "postgres://u@h/db?sslmode=verify-full",
                "postgres://u@h/db?sslmode=require",
                Verification::Full,
            ),
            (
                "postgres://u@h/db?application_name=x&sslmode=verify-ca&connect_timeout=3",
                "postgres://u@h/db?application_name=x&sslmode=require&connect_timeout=3",
                Verification::Ca,
            ),
            (
                "host=h user=u sslmode=verify-full dbname=db",
                "host=h user=u sslmode=require dbname=db",
                Verification::Full,
            ),
            (
                "postgres://u@h/db?sslmode=require",
                "postgres://u@h/db?sslmode=require",
                Verification::EncryptOnly,
            ),
            // Not a whole parameter: left for tokio-postgres to refuse.
            (
                "postgres://u@h/db?xsslmode=verify-full",
                "postgres://u@h/db?xsslmode=verify-full",
                Verification::EncryptOnly,
            ),
            (
                "postgres://u@h/db?sslmode=verify-fullx",
                "postgres://u@h/db?sslmode=verify-fullx",
                Verification::EncryptOnly,
            ),
        ];
        for (url, plain, verification) in cases {
            assert_eq!(
                split_ssl_mode(url),
                (plain.to_owned(), verification),
                "{url}"
            );
        }
    }
}
