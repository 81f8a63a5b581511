//! Reading a store URL's host and port, and pointing it at the proxy.

use std::net::SocketAddr;

/// The host and port `url` names (`scheme://[userinfo@]host[:port][/...]`,
/// `[v6]` hosts included); the scheme's default port when it has none.
pub fn url_target(url: &str) -> Option<(String, u16)> {
    let (scheme, authority, _) = split_url(url)?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match host_port.strip_prefix('[') {
        Some(v6) => {
            let (host, rest) = v6.split_once(']')?;
            (host, rest.strip_prefix(':'))
        }
        None => match host_port.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        },
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => default_port(scheme)?,
    };
    (!host.is_empty()).then(|| (host.to_owned(), port))
}

/// `url` with its host and port replaced by `addr`, user, path and query
/// kept.
pub fn rewrite_url(url: &str, addr: SocketAddr) -> Option<String> {
    let (scheme, authority, rest) = split_url(url)?;
    let userinfo = authority.rsplit_once('@').map(|(u, _)| u);
    Some(match userinfo {
        Some(u) => format!("{scheme}://{u}@{addr}{rest}"),
        None => format!("{scheme}://{addr}{rest}"),
    })
}

/// (scheme, authority, the rest from the first `/` or `?`).
fn split_url(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, after) = url.split_once("://")?;
    let end = after.find(['/', '?']).unwrap_or(after.len());
    let (authority, rest) = after.split_at(end);
    (!authority.is_empty()).then_some((scheme, authority, rest))
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "postgres" | "postgresql" => Some(5432),
        "redis" | "rediss" => Some(6379),
        "mysql" | "mariadb" => Some(3306),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_read_and_rewritten() {
        let cases = [
            (
                "postgres://postgres@127.0.0.1:5432/test",
                ("127.0.0.1", 5432),
            ),
            ("redis://127.0.0.1", ("127.0.0.1", 6379)),
            ("mysql://root:p@ss@db.local:3307/x?a=1", ("db.local", 3307)),
            ("redis://[::1]:7000/2", ("::1", 7000)),
        ];
        for (url, (host, port)) in cases {
            assert_eq!(url_target(url), Some((host.to_owned(), port)), "{url}");
        }
        let addr: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        assert_eq!(
            rewrite_url(
                "postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
                addr
            )
            .as_deref(),
            Some("postgres://postgres@127.0.0.1:4000/test?sslmode=disable")
        );
        assert_eq!(
            rewrite_url("redis://127.0.0.1", addr).as_deref(),
            Some("redis://127.0.0.1:4000")
        );
        assert_eq!(
            rewrite_url("mysql://root:p@ss@db:3306", addr).as_deref(),
            Some("mysql://root:p@ss@127.0.0.1:4000")
        );
        assert_eq!(url_target("no-scheme"), None);
        assert_eq!(url_target("ftp://host"), None);
    }
}
