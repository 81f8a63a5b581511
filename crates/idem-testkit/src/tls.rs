//! Certificates made at run time for the TLS tests: a private CA, the
//! server certificates it signs, and a second CA nobody trusts (whose
//! certificates must be refused).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// A certificate authority that lives for one test.
#[derive(Debug)]
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

impl TestCa {
    /// A new CA named `name`.
    ///
    /// # Panics
    /// If rcgen cannot make a key or a certificate (a test set-up failure).
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA certificate"),
        }
    }

    /// The CA's own certificate, to trust.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `names` (DNS names or IP addresses).
    ///
    /// # Panics
    /// As [`TestCa::new`].
    pub fn issue(&self, names: &[&str]) -> Issued {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, "idem test server");
        let key = KeyPair::generate().expect("server key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

impl TestCa {
    /// A rustls server configuration (ring) with a certificate this CA
    /// issued for `names`, offering `alpn` (in order).
    ///
    /// # Panics
    /// If rustls refuses the certificate (a test set-up failure).
    pub fn server_config(&self, names: &[&str], alpn: &[&[u8]]) -> rustls::ServerConfig {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let issued = self.issue(names);
        let certs = CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("the issued certificate");
        let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).expect("its key");
        let mut config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring's protocol versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("a server configuration");
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config
    }

    /// A rustls client configuration (ring) that trusts this CA alone,
    /// offering `alpn` (in order).
    ///
    /// # Panics
    /// If rustls refuses the CA's certificate (a test set-up failure).
    pub fn client_config(&self, alpn: &[&[u8]]) -> rustls::ClientConfig {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.cert_pem().as_bytes()) {
            roots
                .add(cert.expect("the CA certificate"))
                .expect("a root");
        }
        let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring's protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config
    }
}

/// Writes `contents` to `dir/name` and returns the path.
///
/// # Panics
/// If the file cannot be written.
pub fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write a test certificate");
    path
}
