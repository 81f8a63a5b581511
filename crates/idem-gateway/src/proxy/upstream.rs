//! Where requests go: the upstream URL taken apart once, and each
//! request's target on it.

use http::uri::{PathAndQuery, Scheme};
use http::{HeaderValue, Uri};

/// `uri`'s host, with its port unless the scheme's default (80 for http,
/// 443 for https and wss): the rule hyper-util's client writes `Host` by.
fn host_of(uri: &Uri) -> Option<HeaderValue> {
    let host = uri.host()?;
    let secure = matches!(uri.scheme_str(), Some("https" | "wss"));
    let value = match uri.port() {
        Some(port) if !matches!((port.as_u16(), secure), (443, true) | (80, false)) => {
            format!("{host}:{port}")
        }
        _ => host.to_owned(),
    };
    HeaderValue::try_from(value).ok()
}

/// The upstream's origin and path prefix, taken apart once.
pub(super) struct Upstream {
    /// Its scheme and authority, where connections go; `None` for an
    /// upstream URL without an authority, which the configuration refuses
    /// (a target is then never built: 502).
    pub(super) origin: Option<Uri>,
    /// The upstream URL's path without its trailing slashes: prefixed to
    /// every request's path.
    base: String,
    /// The `Host` every request to it carries: the URL's host, and its
    /// port unless that is the scheme's default (the rule hyper-util's
    /// client wrote it by, formatting it for each request).
    pub(super) host: Option<HeaderValue>,
}

impl Upstream {
    pub(super) fn new(upstream: &Uri) -> Upstream {
        let origin = upstream.authority().and_then(|authority| {
            let mut parts = http::uri::Parts::default();
            parts.scheme = Some(upstream.scheme().cloned().unwrap_or(Scheme::HTTP));
            parts.authority = Some(authority.clone());
            parts.path_and_query = Some(PathAndQuery::from_static("/"));
            Uri::from_parts(parts).ok()
        });
        Upstream {
            origin,
            base: upstream.path().trim_end_matches('/').to_owned(),
            host: host_of(upstream),
        }
    }

    /// Where a request for `uri` goes on the upstream's connection, in
    /// origin form (RFC 9112 section 3.2.1): the upstream's path prefix,
    /// then the request's path and query.
    pub(super) fn target(&self, uri: &Uri) -> Option<Uri> {
        self.origin.as_ref()?;
        let path_and_query = match (self.base.is_empty(), uri.path_and_query()) {
            // No prefix: the request's own, already parsed.
            (true, Some(p)) => p.clone(),
            (_, rest) => {
                let rest = rest.map_or("/", PathAndQuery::as_str);
                let mut joined = String::with_capacity(self.base.len() + rest.len());
                joined.push_str(&self.base);
                joined.push_str(rest);
                PathAndQuery::try_from(joined).ok()?
            }
        };
        Some(Uri::from(path_and_query))
    }
}
