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
    /// The HTTP version the upstream is spoken to in (default
    /// [`UpstreamProtocol::Http1`]).
    pub protocol: UpstreamProtocol,
}

/// The HTTP version the gateway speaks to its upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 on a pool of connections, one exchange at a time each.
    #[default]
    Http1,
    /// HTTP/2 over TLS (ALPN `h2` only): one multiplexed connection per
    /// serving thread. Only for an `https://` upstream
    /// ([`Gateway::start`](crate::Gateway::start) refuses it with
    /// `http://`); an upstream that does not pick `h2` gets no request.
    H2,
    /// HTTP/2 in clear text with prior knowledge (h2c, RFC 9113 section
    /// 3.3): one multiplexed connection per serving thread. Only for an
    /// `http://` upstream ([`Gateway::start`](crate::Gateway::start)
    /// refuses it with `https://`).
    H2c,
    /// For `https://`, whatever the upstream picks by ALPN (`h2`, then
    /// `http/1.1`) on each new connection; for `http://`, HTTP/1.1 (clear
    /// text offers no negotiation).
    Auto,
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
            protocol: UpstreamProtocol::Http1,
        }
    }

    /// Refuses a setting outside its bounds.
    pub(crate) fn check(&self) -> Result<(), Error> {
        check_timeout("UpstreamSettings::timeout", self.timeout)?;
        check_timeout("UpstreamSettings::body_timeout", self.body_timeout)?;
        let https = self.url.scheme_str() == Some("https");
        let mismatch = match self.protocol {
            UpstreamProtocol::H2 if !https => Some("h2 is HTTP/2 over TLS: an https:// upstream"),
            UpstreamProtocol::H2c if https => {
                Some("h2c is HTTP/2 in clear text: an http:// upstream")
            }
            _ => None,
        };
        match mismatch {
            Some(bound) => Err(Error::Setting {
                setting: "UpstreamSettings::protocol",
                bound: bound.to_owned(),
                value: format!("{:?} for {}", self.protocol, without_userinfo(&self.url)),
            }),
            None => Ok(()),
        }
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
            .field("protocol", &self.protocol)
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
    /// HTTP/2 on client connections: whether it is served, and its bounds.
    pub http2: Http2Limits,
}

impl Default for ConnectionLimits {
    /// The `idem serve` defaults: 1024 connections, 10 s for headers,
    /// 30 s of a stalled write, HTTP/2 as [`Http2Limits::default`].
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(30),
            http2: Http2Limits::default(),
        }
    }
}

/// HTTP/2 on client connections: offered by ALPN (`h2`, then
/// `http/1.1`) on the TLS listener, and taken with prior knowledge (h2c)
/// on the plain one, when `enabled`; with the bounds a hostile client
/// needs. Every field is checked by
/// [`Gateway::start`](crate::Gateway::start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Limits {
    /// Whether HTTP/2 is served at all (default on). Off: HTTP/1.1 only,
    /// and the TLS listener offers only `http/1.1`.
    pub enabled: bool,
    /// Streams a connection may have open at once (default 100, as
    /// RFC 9113 section 6.5.2 suggests as a floor). It also bounds the
    /// executions a connection's requests may have running, reset streams
    /// included: a request that would start one more waits for a slot.
    /// At least 1 and at most 10 000.
    pub max_concurrent_streams: u32,
    /// The largest header list a request may send, counted as RFC 9113
    /// section 6.5.2 counts it (default 16 KiB). 1 KiB to 1 MiB.
    pub max_header_list_size: u32,
    /// Flow-control window of each stream (default 1 MiB): what a client
    /// may send on a stream before the gateway has read it. 64 KiB to
    /// 16 MiB.
    pub stream_window: u32,
    /// Flow-control window of the whole connection (default 2 MiB), at
    /// least the stream window and at most 64 MiB.
    pub connection_window: u32,
    /// How often an idle connection is pinged (default 30 s; `None`:
    /// never); one that does not answer within
    /// [`keep_alive_timeout`](Http2Limits::keep_alive_timeout) is closed.
    pub keep_alive_interval: Option<Duration>,
    /// How long a ping may go unanswered (default 10 s).
    pub keep_alive_timeout: Duration,
    /// How long a connection may have no request open (and none begin or
    /// end) before it is closed gracefully, with GOAWAY (default 60 s): an
    /// HTTP/2 client answers pings for ever, so without this an idle one
    /// would hold its connection slot for ever.
    pub idle_timeout: Duration,
    /// Streams a client may reset before the gateway has taken them up,
    /// past which the connection is closed with `ENHANCE_YOUR_CALM`: the
    /// rapid-reset defence (CVE-2023-44487). Default 20; 1 to 10 000.
    pub max_pending_resets: usize,
    /// Streams the gateway may reset for a client's errors on one
    /// connection before closing it (default 1024); 1 to 100 000.
    pub max_local_error_resets: usize,
}

impl Default for Http2Limits {
    fn default() -> Http2Limits {
        Http2Limits {
            enabled: true,
            max_concurrent_streams: 100,
            max_header_list_size: 16 * 1024,
            stream_window: 1024 * 1024,
            connection_window: 2 * 1024 * 1024,
            keep_alive_interval: Some(Duration::from_secs(30)),
            keep_alive_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_pending_resets: 20,
            max_local_error_resets: 1024,
        }
    }
}

impl Http2Limits {
    /// Refuses a limit outside its bounds.
    pub(crate) fn check(&self) -> Result<(), Error> {
        let within = |setting: &'static str, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(Error::Setting {
                    setting,
                    bound: format!("between {min} and {max}"),
                    value: value.to_string(),
                })
            }
        };
        within(
            "Http2Limits::max_concurrent_streams",
            self.max_concurrent_streams.into(),
            1,
            10_000,
        )?;
        within(
            "Http2Limits::max_header_list_size",
            self.max_header_list_size.into(),
            1024,
            1 << 20,
        )?;
        within(
            "Http2Limits::stream_window",
            self.stream_window.into(),
            64 * 1024,
            16 << 20,
        )?;
        within(
            "Http2Limits::connection_window",
            self.connection_window.into(),
            self.stream_window.into(),
            64 << 20,
        )?;
        within(
            "Http2Limits::max_pending_resets",
            self.max_pending_resets as u64,
            1,
            10_000,
        )?;
        within(
            "Http2Limits::max_local_error_resets",
            self.max_local_error_resets as u64,
            1,
            100_000,
        )?;
        if let Some(interval) = self.keep_alive_interval {
            check_timeout("Http2Limits::keep_alive_interval", interval)?;
        }
        check_timeout("Http2Limits::keep_alive_timeout", self.keep_alive_timeout)?;
        check_timeout("Http2Limits::idle_timeout", self.idle_timeout)
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
        check_timeout("ConnectionLimits::stall_timeout", self.stall_timeout)?;
        self.http2.check()
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
