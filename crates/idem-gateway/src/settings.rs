//! The gateway's settings: small types of its own, filled by whoever embeds
//! it (the `idem` binary fills them from its flags and file), and checked
//! by [`Gateway::start`](crate::Gateway::start), which refuses a setting
//! outside its bounds ([`Error::Setting`]) before anything runs.
//!
//! What the layer decides is not repeated here: the gateway takes the key
//! header, the scope headers and the response limit from the
//! [`IdempotencyLayer`](idem_http::IdempotencyLayer) it starts with.

use std::time::Duration;

use http::uri::PathAndQuery;
use http::{HeaderName, Uri};
use tokio::sync::Semaphore;

use crate::error::Error;

/// The longest timeout the gateway takes: far beyond any useful one, and
/// short enough that a deadline computed from it never overflows.
const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Where requests go and how long the upstream may take.
#[derive(Clone)]
pub struct UpstreamSettings {
    /// The upstream's URL: scheme, authority, and a path prefixed to every
    /// request's path. One without an authority is never connected to
    /// (every request gets 502 `bad-upstream-url`).
    pub url: Uri,
    /// How an `https://` upstream is checked; `None` for `http://` (an
    /// `https://` upstream without it is never reached in plain text: the
    /// connection fails).
    pub tls: Option<rustls::ClientConfig>,
    /// How long a keyed exchange may take, the answer's body included up
    /// to the layer's response limit
    /// ([`IdempotencyLayer::response_limit`](idem_http::IdempotencyLayer::response_limit)),
    /// and a passthrough one until its headers. Connecting gets the
    /// shorter of this and 5 s. More than zero and at most 365 days
    /// ([`Gateway::start`](crate::Gateway::start) refuses others).
    pub timeout: Duration,
    /// How long an idle pooled connection is kept (zero: never kept).
    pub idle_timeout: Duration,
    /// How long the rest of an answer the layer does not store may go
    /// without a frame. More than zero and at most 365 days.
    pub body_timeout: Duration,
    /// Whether the client's forwarding headers are kept (its only client
    /// is a trusted proxy) or dropped.
    pub trust_forwarded: bool,
    /// Headers a client may not strip by naming them in `Connection`,
    /// besides those the gateway always keeps: the layer's key header and
    /// scope headers (taken from the layer when the gateway starts:
    /// [`IdempotencyLayer::key_header`](idem_http::IdempotencyLayer::key_header),
    /// [`scope_headers`](idem_http::IdempotencyLayer::scope_headers)),
    /// `Authorization`, and the headers that describe the body. Name here
    /// the headers a custom scope function
    /// ([`ScopeSource::Custom`](idem_http::ScopeSource::Custom)) reads.
    pub protected_headers: Vec<HeaderName>,
}

impl UpstreamSettings {
    /// Settings for `url` with the `idem serve` defaults: 25 s for an
    /// exchange, 60 s idle, 30 s of body silence, the client's forwarding
    /// headers dropped, and no header protected besides those the gateway
    /// always keeps.
    pub fn new(url: Uri) -> UpstreamSettings {
        UpstreamSettings {
            url,
            tls: None,
            timeout: Duration::from_secs(25),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            trust_forwarded: false,
            protected_headers: Vec::new(),
        }
    }

    /// Refuses a setting outside its bounds.
    pub(crate) fn check(&self) -> Result<(), Error> {
        check_timeout("UpstreamSettings::timeout", self.timeout)?;
        check_timeout("UpstreamSettings::body_timeout", self.body_timeout)
    }
}

impl std::fmt::Debug for UpstreamSettings {
    /// The URL without its user information, which may hold a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamSettings")
            .field("url", &without_userinfo(&self.url))
            .field("tls", &self.tls.is_some())
            .field("timeout", &self.timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("body_timeout", &self.body_timeout)
            .field("trust_forwarded", &self.trust_forwarded)
            .field("protected_headers", &self.protected_headers)
            .finish()
    }
}

/// `url` as text without the user information of its authority.
pub(crate) fn without_userinfo(url: &Uri) -> String {
    let Some(authority) = url.authority() else {
        return url.to_string();
    };
    let host = authority
        .as_str()
        .rsplit_once('@')
        .map_or(authority.as_str(), |(_, host)| host);
    let scheme = url
        .scheme_str()
        .map(|s| format!("{s}://"))
        .unwrap_or_default();
    let rest = url.path_and_query().map_or("", PathAndQuery::as_str);
    format!("{scheme}{host}{rest}")
}

/// Refuses a timeout of zero (nothing would ever be in time) or over
/// [`MAX_TIMEOUT`] (a deadline computed from it could overflow).
fn check_timeout(setting: &'static str, value: Duration) -> Result<(), Error> {
    if value.is_zero() || value > MAX_TIMEOUT {
        return Err(Error::Setting {
            setting,
            bound: "more than zero and at most 365 days".to_owned(),
            value: format!("{value:?}"),
        });
    }
    Ok(())
}

/// The bounds on client connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections served at once; more wait in the kernel's backlog.
    /// At least 1 and at most [`Semaphore::MAX_PERMITS`]
    /// ([`Gateway::start`](crate::Gateway::start) refuses others).
    pub max_connections: usize,
    /// How long a client may take to send a request's headers, counted
    /// from when the connection starts waiting for them (so an idle
    /// keep-alive connection is closed after it too). A connection's
    /// setup (its [`Accept`](crate::Accept) step: a TLS handshake) gets as
    /// long. More than zero and at most 365 days.
    pub header_timeout: Duration,
    /// How long a write to the client may make no progress (a client that
    /// stops reading its answer) before the connection is closed. More
    /// than zero and at most 365 days.
    pub stall_timeout: Duration,
}

impl Default for ConnectionLimits {
    /// The `idem serve` defaults: 1024 connections, 10 s for headers,
    /// 30 s of a stalled write.
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(30),
        }
    }
}

impl ConnectionLimits {
    /// Refuses a limit outside its bounds.
    pub(crate) fn check(&self) -> Result<(), Error> {
        let max = Semaphore::MAX_PERMITS;
        if !(1..=max).contains(&self.max_connections) {
            return Err(Error::Setting {
                setting: "ConnectionLimits::max_connections",
                bound: format!("between 1 and {max}"),
                value: self.max_connections.to_string(),
            });
        }
        check_timeout("ConnectionLimits::header_timeout", self.header_timeout)?;
        check_timeout("ConnectionLimits::stall_timeout", self.stall_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::without_userinfo;

    #[test]
    fn user_information_is_left_out_and_the_rest_kept() {
        for (url, shown) in [
            ("http://u:p@up:8080/api?x=1", "http://up:8080/api?x=1"),
            ("https://token@up/", "https://up/"),
            ("http://up:8080/api", "http://up:8080/api"),
            ("/only/a/path", "/only/a/path"),
        ] {
            assert_eq!(without_userinfo(&url.parse().unwrap()), shown, "{url}");
        }
    }
}
