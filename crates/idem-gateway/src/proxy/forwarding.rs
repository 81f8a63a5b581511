//! The forwarding-header policy: what the upstream receives of a
//! request's headers. Hop-by-hop headers go, `Host` is the upstream's, and
//! the forwarding headers (`Forwarded`, `X-Forwarded-For`, `-Host`,
//! `-Proto`) are the gateway's own, with every value it writes checked or
//! quoted (RFC 7239), so a client cannot add a forwarding element or a
//! header. A client's own forwarding headers are dropped unless trusted.

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{self, HeaderName};
use http::uri::Authority;
use http::{HeaderMap, HeaderValue};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Forwarding headers a client could forge.
pub(super) const FORWARDING: [HeaderName; 5] = [
    header::FORWARDED,
    X_FORWARDED_FOR,
    X_FORWARDED_HOST,
    X_FORWARDED_PROTO,
    HeaderName::from_static("x-real-ip"),
];

/// The client at the other end of one connection, with the text the
/// forwarding headers give it, written once per connection rather than
/// once per request: the front service puts it in every request's
/// extensions.
#[derive(Clone, Debug)]
pub(crate) struct Peer(Arc<PeerText>);

#[derive(Debug)]
struct PeerText {
    /// The address as `X-Forwarded-For` lists it.
    address: HeaderValue,
    /// The address as an RFC 7239 node: IPv6 quoted and in brackets.
    node: String,
}

impl Peer {
    pub(crate) fn new(addr: SocketAddr) -> Peer {
        let ip = addr.ip();
        let text = ip.to_string();
        let node = if ip.is_ipv6() {
            format!("\"[{text}]\"")
        } else {
            text.clone()
        };
        // An address's text is digits, dots, colons and hex letters.
        let address = HeaderValue::try_from(text)
            .unwrap_or_else(|_| unreachable!("an IP address is a valid header value"));
        Peer(Arc::new(PeerText { address, node }))
    }
}

/// `value` as an RFC 7230 quoted-string, or `None` if it holds a byte a
/// quoted-string cannot (controls other than tab).
pub(super) fn quoted(value: &str) -> Option<String> {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() && c != '\t' => return None,
            c => out.push(c),
        }
    }
    out.push('"');
    Some(out)
}

/// Sets the gateway's forwarding headers for a request from `peer` whose
/// `Host` was `host`. A client's own are dropped first unless trusted,
/// also for a request whose peer is unknown (the front service always
/// names it), which then gets none of the gateway's.
pub(super) fn set_forwarding(
    headers: &mut HeaderMap,
    peer: Option<&Peer>,
    host: Option<&str>,
    proto: &'static str,
    trust: bool,
) {
    if !trust {
        for name in &FORWARDING {
            headers.remove(name);
        }
    }
    let Some(Peer(peer)) = peer else {
        return;
    };
    // Only a Host that is a plain host[:port] is passed on (an authority
    // may hold commas and other sub-delimiters; a forwarded host may not).
    let host = host.filter(|h| {
        h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b))
            && h.parse::<Authority>().is_ok()
    });
    // A trusted proxy's list, on as many lines as it sent (one list, as
    // RFC 9110 reads repeated lines), then this client, on one line.
    // Every byte of it is kept: a client behind that proxy could
    // otherwise put one byte that is not visible ASCII in its own part of
    // a line and have the proxy's record of its address dropped with it.
    // Blank lines name nobody. Untrusted, the client's lines were removed
    // above.
    let mut list = Vec::new();
    for prev in headers.get_all(&X_FORWARDED_FOR) {
        let prev = prev.as_bytes().trim_ascii();
        if !prev.is_empty() {
            list.extend_from_slice(prev);
            list.extend_from_slice(b", ");
        }
    }
    let xff = if list.is_empty() {
        Some(peer.address.clone())
    } else {
        list.extend_from_slice(peer.address.as_bytes());
        HeaderValue::try_from(list).ok()
    };
    if let Some(v) = xff {
        headers.insert(X_FORWARDED_FOR, v);
    }
    if !trust || !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    }
    if let Some(h) = host
        && (!trust || !headers.contains_key(&X_FORWARDED_HOST))
        && let Ok(v) = HeaderValue::from_str(h)
    {
        headers.insert(X_FORWARDED_HOST, v);
    }
    let quoted_host = host.and_then(quoted);
    let mut element = String::with_capacity(
        "for=;proto=;host=".len()
            + peer.node.len()
            + proto.len()
            + quoted_host.as_ref().map_or(0, String::len),
    );
    element.push_str("for=");
    element.push_str(&peer.node);
    element.push_str(";proto=");
    element.push_str(proto);
    if let Some(h) = quoted_host {
        element.push_str(";host=");
        element.push_str(&h);
    }
    if let Ok(v) = HeaderValue::try_from(element) {
        headers.append(header::FORWARDED, v);
    }
}

/// Headers that belong to one connection and are never forwarded.
pub(super) const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers and those `Connection` names, except the
/// `protected` ones.
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap, protected: &[HeaderName]) {
    // Most requests and answers carry none (those with `Connection`,
    // even `keep-alive` alone, take the long way): one pass over their
    // names instead of a removal each.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        // Hop-by-hop names go below in any case.
        .filter(|n| {
            !HOP_BY_HOP
                .iter()
                .any(|h| n.eq_ignore_ascii_case(h.as_str()))
        })
        .filter_map(|n| HeaderName::try_from(n).ok())
        .filter(|n| !protected.contains(n))
        .collect();
    for name in HOP_BY_HOP.iter().chain(listed.iter()) {
        headers.remove(name);
    }
}

/// What the upstream gets of the headers of a request from `peer`: no
/// hop-by-hop headers (but the `protected` ones), the gateway's
/// forwarding headers, and the upstream's own `Host` (the client's is
/// forwarded), last. The client's Host is removed last: removing a header
/// moves the last one into its place, so the order the upstream sees is
/// what it always was.
pub(super) fn rewrite_headers(
    headers: &mut HeaderMap,
    peer: Option<&Peer>,
    upstream_host: Option<&HeaderValue>,
    protected: &[HeaderName],
    proto: &'static str,
    trust: bool,
) {
    let original_host = headers.get(header::HOST).cloned();
    strip_hop_by_hop(headers, protected);
    // The gateway answered the client's `100-continue` itself (hyper does,
    // as the body is read) and sends the body at once.
    headers.remove(header::EXPECT);
    set_forwarding(
        headers,
        peer,
        original_host.as_ref().and_then(|h| h.to_str().ok()),
        proto,
        trust,
    );
    headers.remove(header::HOST);
    if let Some(host) = upstream_host {
        headers.insert(header::HOST, host.clone());
    }
}

/// Whether the gateway removes or rewrites a request header of this name
/// on its way to the upstream: a hop-by-hop header, `Host`, or a
/// forwarding header, or `Idem-Takeover` (the layer's own). A header the
/// upstream would not receive as the client sent it cannot carry an
/// idempotency key.
pub fn rewritten_on_the_way(name: &HeaderName) -> bool {
    *name == header::HOST
        || *name == idem_http::IDEM_TAKEOVER
        || HOP_BY_HOP.contains(name)
        || FORWARDING.contains(name)
}
