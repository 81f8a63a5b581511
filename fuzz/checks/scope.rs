//! The `scope` fuzz target's check, shared with the regression tests in
//! `crates/idem-http/tests/fuzz_regressions.rs`.
//!
//! Scope derivation from request headers, as the layer does it.
//!
//! Input: header lines `name\0value\0name\0value...`; a name whose first
//! byte is 0, 1 or 2 modulo 4 stands for `authorization`, `x-tenant` or
//! `x-user`, the names the sources read. Whatever the headers, derivation
//! never panics, a named header never falls back to the anonymous scope,
//! and it is deterministic.

use http::{HeaderName, HeaderValue, Request};
use idem_core::Scope;
use idem_http::ScopeSource;

/// Runs one input; panics when a property fails.
pub(crate) fn check(data: &[u8]) {
    let mut builder = Request::builder();
    let mut fields = data.split(|&b| b == 0);
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        let name = match name.first().map(|b| b % 4) {
            Some(0) => HeaderName::from_static("authorization"),
            Some(1) => HeaderName::from_static("x-tenant"),
            Some(2) => HeaderName::from_static("x-user"),
            _ => match HeaderName::from_bytes(name) {
                Ok(n) => n,
                Err(_) => continue,
            },
        };
        let Ok(value) = HeaderValue::from_bytes(value) else {
            continue;
        };
        builder = builder.header(name, value);
    }
    let Ok(request) = builder.body(()) else {
        return;
    };
    let (parts, ()) = request.into_parts();
    let sources = [
        ScopeSource::Authorization,
        ScopeSource::Header(HeaderName::from_static("x-tenant")),
        ScopeSource::Headers(vec![
            HeaderName::from_static("x-tenant"),
            HeaderName::from_static("x-user"),
        ]),
    ];
    for (i, source) in sources.iter().enumerate() {
        let first = source.scope_of(&parts);
        assert_eq!(first, source.scope_of(&parts), "deterministic");
        if i > 0
            && let Ok(scope) = &first
        {
            assert_ne!(
                *scope,
                Scope::anonymous(),
                "a named header is never anonymous"
            );
        }
        if i == 0 && parts.headers.get_all("authorization").iter().count() == 0 {
            assert_eq!(first, Ok(Scope::anonymous()));
        }
    }
}
