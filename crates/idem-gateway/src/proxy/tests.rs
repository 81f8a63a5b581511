//! The forwarding policy and the upstream mapping against oracles.

use super::forwarding::{
    FORWARDING, HOP_BY_HOP, Peer, rewrite_headers, rewritten_on_the_way, set_forwarding,
    strip_hop_by_hop,
};
use super::upstream::Upstream;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Uri};
use proptest::prelude::*;
use std::net::{IpAddr, SocketAddr};

/// Every header the proxy strips or rewrites is one a key cannot be in
/// (`--key-header` refuses them through `rewritten_on_the_way`).
#[test]
fn every_header_the_proxy_strips_or_rewrites_is_named_as_such() {
    for name in HOP_BY_HOP
        .iter()
        .chain(FORWARDING.iter())
        .chain([&header::HOST])
    {
        assert!(rewritten_on_the_way(name), "{name}");
    }
    assert!(!rewritten_on_the_way(&HeaderName::from_static(
        "idempotency-key"
    )));
}

// The oracles below are the forwarding code as it was before the
// upstream's parts and the peer's text were prepared once (formatted
// and parsed per request); what the upstream receives must not change.

fn target_per_request(upstream: &Uri, uri: &Uri) -> Option<Uri> {
    let base = upstream.path().trim_end_matches('/');
    let rest = uri.path_and_query().map_or("/", |p| p.as_str());
    Uri::builder()
        .scheme(upstream.scheme_str().unwrap_or("http"))
        .authority(upstream.authority()?.as_str())
        .path_and_query(format!("{base}{rest}"))
        .build()
        .ok()
}

fn forwarding_per_request(
    headers: &mut HeaderMap,
    peer: Option<IpAddr>,
    host: Option<&str>,
    proto: &'static str,
    trust: bool,
) {
    if !trust {
        for name in [
            "forwarded",
            "x-forwarded-for",
            "x-forwarded-host",
            "x-forwarded-proto",
            "x-real-ip",
        ] {
            headers.remove(name);
        }
    }
    let Some(peer) = peer else {
        return;
    };
    let host = host.filter(|h| {
        h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b))
            && h.parse::<http::uri::Authority>().is_ok()
    });
    // Not as it was: the code before kept only the first of a
    // trusted proxy's X-Forwarded-For lines, and only if it was
    // visible ASCII; every non-blank line is kept now, bytes as sent.
    let lines: Vec<&[u8]> = headers
        .get_all("x-forwarded-for")
        .iter()
        .map(|v| v.as_bytes().trim_ascii())
        .filter(|v| !v.is_empty())
        .collect();
    let xff = if lines.is_empty() {
        peer.to_string().into_bytes()
    } else {
        [lines.join(&b", "[..]), format!(", {peer}").into_bytes()].concat()
    };
    if let Ok(v) = HeaderValue::from_bytes(&xff) {
        headers.insert("x-forwarded-for", v);
    }
    if !trust || !headers.contains_key("x-forwarded-proto") {
        headers.insert("x-forwarded-proto", HeaderValue::from_static(proto));
    }
    if let Some(h) = host
        && (!trust || !headers.contains_key("x-forwarded-host"))
        && let Ok(v) = HeaderValue::from_str(h)
    {
        headers.insert("x-forwarded-host", v);
    }
    let node = if peer.is_ipv6() {
        format!("\"[{peer}]\"")
    } else {
        peer.to_string()
    };
    let mut element = format!("for={node};proto={proto}");
    if let Some(h) = host.and_then(super::forwarding::quoted) {
        element.push_str(";host=");
        element.push_str(&h);
    }
    if let Ok(v) = HeaderValue::from_str(&element) {
        headers.append(header::FORWARDED, v);
    }
}

fn strip_per_request(headers: &mut HeaderMap, protected: &[HeaderName]) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::try_from(n.trim()).ok())
        .filter(|n| !protected.contains(n))
        .collect();
    for name in HOP_BY_HOP.iter().chain(listed.iter()) {
        headers.remove(name);
    }
}

/// Every (name, value) pair in order, values as bytes: equal maps
/// print equal.
fn pairs(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect()
}

/// The headers a generated request carries (values a header cannot
/// hold left out), and the protected names: the key's and
/// `Content-Type`, or none.
fn request_headers(
    headers: &[(&'static str, &'static str)],
    protect: bool,
) -> (HeaderMap, Vec<HeaderName>) {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        if let Ok(v) = HeaderValue::from_bytes(value.as_bytes()) {
            map.append(*name, v);
        }
    }
    let protected = if protect {
        vec![
            HeaderName::from_static("idempotency-key"),
            header::CONTENT_TYPE,
        ]
    } else {
        Vec::new()
    };
    (map, protected)
}

fn upstream_url() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec!["http", "https"]),
        prop::sample::select(vec!["up:8080", "10.0.0.1", "[::1]:9", "Svc.Local"]),
        prop::sample::select(vec!["", "/", "/api", "/api/", "/a/b//", "/%20x"]),
    )
        .prop_map(|(s, a, p)| format!("{s}://{a}{p}"))
}

/// A request target as hyper hands it over: origin form, absolute
/// form (with or without a path), asterisk and authority form, with
/// path and query bytes a `Uri` may or may not accept.
fn request_target() -> impl Strategy<Value = String> {
    let path = "(/[-a-zA-Z0-9._~%!$&'()*+,;=:@{}|^`\"]{0,6}){0,4}/?";
    let query = prop::option::of("[-a-zA-Z0-9._~%!$&'()*+,;=:@/?{}|^#]{0,10}");
    let built = (
        path,
        query,
        prop::sample::select(vec!["", "http://client.example", "https://h:1", "HTTP://X"]),
    )
        .prop_map(|(p, q, abs)| {
            let p = if p.is_empty() && abs.is_empty() {
                "/".to_owned()
            } else {
                p
            };
            match q {
                Some(q) => format!("{abs}{p}?{q}"),
                None => format!("{abs}{p}"),
            }
        });
    prop_oneof![
        4 => built,
        1 => prop::sample::select(vec![
            "*", "h:1", "client.example:443", "/a#frag", "/?", "/a?b#c", "http://h",
        ]).prop_map(str::to_owned),
    ]
}

proptest! {
    #[test]
    fn the_target_is_what_formatting_it_per_request_gave(
        upstream in upstream_url(),
        target in request_target(),
    ) {
        let upstream: Uri = upstream.parse().unwrap();
        let Ok(uri) = target.parse::<Uri>() else {
            return Ok(());
        };
        // The old client wrote the absolute target in origin form
        // on the wire: its path and query, as a URI of those alone
        // displays them (hyper writes the request line with
        // `Display`, which shows an empty path as `/`).
        let now = Upstream::new(&upstream).target(&uri);
        let before = target_per_request(&upstream, &uri)
            .and_then(|b| b.path_and_query().cloned());
        prop_assert_eq!(
            now.as_ref().and_then(Uri::path_and_query).map(|p| p.as_str().to_owned()),
            before.as_ref().map(|p| p.as_str().to_owned())
        );
        prop_assert_eq!(
            now.as_ref().map(ToString::to_string),
            before.map(|p| Uri::from(p).to_string())
        );
        prop_assert!(now.is_none_or(|t| t.scheme().is_none() && t.authority().is_none()));
    }

    /// The whole rewrite, header order included: Host, the
    /// hop-by-hop headers, the forwarding headers, then Host gone.
    #[test]
    fn request_headers_are_rewritten_as_formatting_them_per_request_did(
        peer in prop::option::of(prop::sample::select(vec![
            "127.0.0.1:5000", "10.1.2.3:1", "[::1]:80", "[2001:db8::7]:443",
            "[::ffff:10.0.0.1]:9", "0.0.0.0:0",
        ])),
        proto in prop::sample::select(vec!["http", "https"]),
        trust in any::<bool>(),
        protect in any::<bool>(),
        headers in prop::collection::vec(
            (
                prop::sample::select(vec![
                    "host", "connection", "keep-alive", "te", "upgrade",
                    "x-forwarded-for", "forwarded", "x-forwarded-host",
                    "x-forwarded-proto", "x-real-ip", "idempotency-key",
                    "content-type", "x-private", "user-agent",
                ]),
                prop::sample::select(vec![
                    "api.example:8443", "h", "[::1]:80", "a,b", "x\"y", "h h", "",
                    "10.9.9.9", "1.1.1.1, 2.2.2.2", "a\tb", "caf\u{e9}",
                    "host", "x-forwarded-for", "TE", "Transfer-Encoding\t,x-private",
                    "keep-alive", "close, Upgrade", "idempotency-key, content-type",
                    "for=1.2.3.4", "https",
                ]),
            ),
            0..10,
        ),
    ) {
        let peer: Option<SocketAddr> = peer.map(|p| p.parse().unwrap());
        let (mut map, protected) = request_headers(&headers, protect);
        let mut before = map.clone();
        let upstream_host = HeaderValue::from_static("up:8080");
        rewrite_headers(
            &mut map,
            peer.map(Peer::new).as_ref(),
            Some(&upstream_host),
            &protected,
            proto,
            trust,
        );
        let host = before
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned);
        strip_per_request(&mut before, &protected);
        forwarding_per_request(
            &mut before,
            peer.map(|p| p.ip()),
            host.as_deref(),
            proto,
            trust,
        );
        before.remove(header::HOST);
        // What hyper-util's client then added, a request having none.
        before.entry(header::HOST).or_insert(upstream_host);
        prop_assert_eq!(pairs(&map), pairs(&before));
    }

    #[test]
    fn hop_by_hop_stripping_is_what_it_was(
        headers in prop::collection::vec(
            (prop::sample::select(vec![
                "connection", "keep-alive", "te", "trailer", "transfer-encoding",
                "upgrade", "proxy-authorization", "x-private", "close", "content-type",
                "idempotency-key", "x-other",
            ]), prop::sample::select(vec![
                "keep-alive", "close", "x-private", "Keep-Alive, X-Private",
                " upgrade ,te", "idempotency-key", "content-type, x-other", "",
                ",,", "bad name", "caf\u{e9}",
            ])),
            0..8,
        ),
        protect in any::<bool>(),
    ) {
        let (mut map, protected) = request_headers(&headers, protect);
        let mut before = map.clone();
        strip_hop_by_hop(&mut map, &protected);
        strip_per_request(&mut before, &protected);
        prop_assert_eq!(pairs(&map), pairs(&before));
    }
}

/// hyper-util 0.1.21's `set_host` with its `get_non_default_port`,
/// as it wrote Host from every request's URI: the oracle of
/// `upstream::host_of`.
fn host_per_request(uri: &Uri) -> Option<String> {
    let hostname = uri.host()?;
    let secure = uri
        .scheme_str()
        .map(|s| matches!(s, "wss" | "https"))
        .unwrap_or_default();
    let port = match (uri.port().map(|p| p.as_u16()), secure) {
        (Some(443), true) | (Some(80), false) => None,
        _ => uri.port(),
    };
    Some(match port {
        Some(port) => format!("{hostname}:{port}"),
        None => hostname.to_owned(),
    })
}

proptest! {
    #[test]
    fn the_upstream_host_is_what_the_client_library_wrote(
        scheme in prop::sample::select(vec!["http", "https", "HTTP", "HttpS"]),
        host in prop::sample::select(vec![
            "up", "Up.Example", "10.0.0.1", "[::1]", "[2001:DB8::7]", "a-b.c_d",
        ]),
        port in prop::option::of(prop::sample::select(vec![
            "80", "443", "8080", "08080", "0", "65535", "",
        ])),
        path in prop::sample::select(vec!["", "/", "/api/"]),
    ) {
        let url = match port {
            Some(p) => format!("{scheme}://{host}:{p}{path}"),
            None => format!("{scheme}://{host}{path}"),
        };
        let Ok(uri) = url.parse::<Uri>() else {
            return Ok(());
        };
        let now = Upstream::new(&uri).host;
        prop_assert_eq!(
            now.as_ref().map(|h| h.as_bytes().to_vec()),
            host_per_request(&uri).map(String::into_bytes),
            "{}", url
        );
    }
}

/// The Host the upstream gets is what hyper-util's client wrote from
/// the request's URI (`set_host`): the port unless the scheme's default.
#[test]
fn the_upstream_host_is_the_client_librarys() {
    for (url, host) in [
        ("http://up:8080/api", "up:8080"),
        ("http://up:80", "up"),
        ("http://up", "up"),
        ("http://up:443", "up:443"),
        ("https://up:443/", "up"),
        ("https://up:80", "up:80"),
        ("https://up", "up"),
        ("http://[::1]:9", "[::1]:9"),
        ("http://[::1]:80", "[::1]"),
        ("http://Up.Example:08080", "Up.Example:8080"),
    ] {
        let upstream = Upstream::new(&url.parse().unwrap());
        assert_eq!(
            upstream.host.as_ref().map(HeaderValue::as_bytes),
            Some(host.as_bytes()),
            "{url}"
        );
    }
}

#[test]
fn an_upstream_without_an_authority_has_no_target() {
    let upstream = Uri::from_static("/only/a/path");
    let uri = Uri::from_static("/x");
    assert!(Upstream::new(&upstream).target(&uri).is_none());
    assert!(target_per_request(&upstream, &uri).is_none());
}

#[test]
fn the_peer_is_written_as_each_header_names_it() {
    let mut headers = HeaderMap::new();
    let peer = Peer::new("[2001:db8::7]:443".parse().unwrap());
    set_forwarding(&mut headers, Some(&peer), Some("api:1"), "https", false);
    assert_eq!(headers["x-forwarded-for"], "2001:db8::7");
    assert_eq!(
        headers[header::FORWARDED],
        "for=\"[2001:db8::7]\";proto=https;host=\"api:1\""
    );
    let mut headers = HeaderMap::new();
    headers.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.9"));
    let peer = Peer::new("127.0.0.1:9".parse().unwrap());
    set_forwarding(&mut headers, Some(&peer), None, "http", true);
    assert_eq!(headers["x-forwarded-for"], "10.0.0.9, 127.0.0.1");
    assert_eq!(headers[header::FORWARDED], "for=127.0.0.1;proto=http");
}

/// A trusted proxy that sends its list on several lines loses none of
/// them (the first alone used to be kept, and only if it was visible
/// ASCII), blank lines aside; an untrusted client's lines are all
/// dropped.
#[test]
fn every_x_forwarded_for_line_of_a_trusted_proxy_is_kept() {
    let peer = Peer::new("127.0.0.1:9".parse().unwrap());
    let client_lines = || {
        let mut headers = HeaderMap::new();
        for line in ["10.0.0.1, 10.0.0.2", " ", "10.0.0.3", "caf\u{e9}, 10.0.0.4"] {
            headers.append(
                "x-forwarded-for",
                HeaderValue::from_bytes(line.as_bytes()).unwrap(),
            );
        }
        headers
    };
    let mut trusted = client_lines();
    set_forwarding(&mut trusted, Some(&peer), None, "http", true);
    let lines: Vec<_> = trusted.get_all("x-forwarded-for").iter().collect();
    assert_eq!(
        lines,
        ["10.0.0.1, 10.0.0.2, 10.0.0.3, caf\u{e9}, 10.0.0.4, 127.0.0.1".as_bytes()]
    );
    let mut untrusted = client_lines();
    set_forwarding(&mut untrusted, Some(&peer), None, "http", false);
    let lines: Vec<_> = untrusted.get_all("x-forwarded-for").iter().collect();
    assert_eq!(lines, ["127.0.0.1"]);
}
