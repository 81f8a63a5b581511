//! The probe's HTTP client: HTTP/1.1 over `http://` or `https://`
//! (rustls with ring; the CAs given, else the system's roots), no
//! redirects, no proxies, one timeout over a whole exchange, and answers
//! read up to [`MAX_BODY`] bytes.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use http_body_util::{BodyExt, Full};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::error::Error;

/// The most of an answer's body the probe reads: past it the body is cut
/// (and marked), so that a server cannot fill the probe's memory.
pub(crate) const MAX_BODY: usize = 1 << 20;

/// An answer as read: status, headers, and the body up to [`MAX_BODY`]
/// bytes (then `…<cut>`).
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
}

/// A pooled HTTP/1.1 client for `http://` and `https://`.
#[derive(Clone)]
pub(crate) struct HttpClient {
    inner: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeout: Duration,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    /// A client whose `https://` peers must chain to a certificate in
    /// `ca_pem` (only those), or, without it, to a system root. Fails with
    /// [`crate::ErrorKind::Input`] on a PEM text with no usable
    /// certificate, and [`crate::ErrorKind::Client`] when TLS cannot be
    /// set up; with `https` set and no CA given nor found on the system,
    /// [`crate::ErrorKind::Input`] (every check would fail to connect).
    pub(crate) fn new(
        ca_pem: Option<&[u8]>,
        https: bool,
        idle_per_host: usize,
        timeout: Duration,
    ) -> Result<HttpClient, Error> {
        let roots = roots(ca_pem)?;
        if https && roots.is_empty() {
            return Err(Error::input(
                "https:// needs --ca-cert: this system has no root certificates rustls can use",
            ));
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::client(format!("TLS set-up: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(timeout));
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let inner = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(idle_per_host)
            .build(connector);
        Ok(HttpClient { inner, timeout })
    }

    /// Sends one request and reads its answer, all within the timeout.
    /// `Host` and `Content-Length` are set by the client. The error is the
    /// reason, with its causes, for the evidence.
    pub(crate) async fn send(
        &self,
        method: Method,
        url: &url::Url,
        headers: Vec<(HeaderName, HeaderValue)>,
        body: Vec<u8>,
    ) -> Result<Response, String> {
        let uri: http::Uri = url
            .as_str()
            .parse()
            .map_err(|e| format!("the URL is not a valid request target: {e}"))?;
        let mut request = http::Request::new(Full::new(Bytes::from(body)));
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        for (name, value) in headers {
            request.headers_mut().append(name, value);
        }
        let exchange = async {
            let response = self.inner.request(request).await.map_err(chain)?;
            let (head, mut body) = response.into_parts();
            let mut bytes = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| format!("the answer's body broke off: {e}"))?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let room = MAX_BODY - bytes.len();
                if data.len() > room {
                    bytes.extend_from_slice(&data[..room]);
                    bytes.extend_from_slice("…<cut>".as_bytes());
                    break;
                }
                bytes.extend_from_slice(&data);
            }
            Ok(Response {
                status: head.status.as_u16(),
                headers: head.headers,
                body: bytes,
            })
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "no complete answer within the timeout ({:?})",
                self.timeout
            )),
        }
    }
}

/// The error with its causes: hyper's own says only "client error
/// (Connect)", the cause says which (refused, certificate unknown, ...).
fn chain(e: impl std::error::Error) -> String {
    let mut text = format!("request failed: {e}");
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

fn roots(ca_pem: Option<&[u8]>) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    Error::input(format!("--ca-cert: not a PEM certificate file ({e})"))
                })?;
            if certs.is_empty() {
                return Err(Error::input("--ca-cert: holds no PEM certificate"));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| {
                    Error::input(format!("--ca-cert: a certificate rustls cannot use ({e})"))
                })?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                // A system root rustls cannot parse is skipped.
                let _ = roots.add(cert);
            }
        }
    }
    Ok(roots)
}
