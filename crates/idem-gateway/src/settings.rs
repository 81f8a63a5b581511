//! The gateway's settings: small types of its own, filled by whoever embeds
//! it (the `idem` binary fills them from its flags and file).

use std::time::Duration;

use http::{HeaderName, Uri};

/// Where requests go and how long the upstream may take.
#[derive(Debug, Clone)]
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
    /// to `replay_limit`, and a passthrough one until its headers.
    /// Connecting gets the shorter of this and 5 s.
    pub timeout: Duration,
    /// How long an idle pooled connection is kept.
    pub idle_timeout: Duration,
    /// How long the rest of an answer the layer does not store may go
    /// without a frame.
    pub body_timeout: Duration,
    /// How much of a keyed answer is read whole under `timeout`: the
    /// layer's response limit (`IdempotencyLayer`'s `response_limit`).
    pub replay_limit: usize,
    /// Whether the client's forwarding headers are kept (its only client
    /// is a trusted proxy) or dropped.
    pub trust_forwarded: bool,
    /// Headers a client may not strip by naming them in `Connection`: the
    /// key header and the scope headers. `Authorization` and the headers
    /// that describe the body always are.
    pub protected_headers: Vec<HeaderName>,
}

impl UpstreamSettings {
    /// Settings for `url` with the `idem serve` defaults: 25 s for an
    /// exchange, 60 s idle, 30 s of body silence, 8 MiB stored, the
    /// client's forwarding headers dropped, and `Idempotency-Key`
    /// protected.
    pub fn new(url: Uri) -> UpstreamSettings {
        UpstreamSettings {
            url,
            tls: None,
            timeout: Duration::from_secs(25),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            replay_limit: 8 << 20,
            trust_forwarded: false,
            protected_headers: vec![idem_http::IDEMPOTENCY_KEY],
        }
    }
}

/// The bounds on client connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections served at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers, counted
    /// from when the connection starts waiting for them (so an idle
    /// keep-alive connection is closed after it too). A TLS handshake
    /// gets as long.
    pub header_timeout: Duration,
    /// How long a write to the client may make no progress (a client that
    /// stops reading its answer) before the connection is closed.
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
