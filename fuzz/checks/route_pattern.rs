//! The `route_pattern` fuzz target's check, shared with the regression
//! tests in `crates/idem-http/tests/fuzz_regressions.rs`.
//!
//! Route patterns from the config file, matched against request paths.
//!
//! Input: a pattern, a NUL byte, a path. Never panics; a pattern matches its
//! own literal spelling when it has no parameters; matching is
//! deterministic; `as_str` always starts with `/`.

use http::Method;
use idem_http::{PathPattern, RouteRule};

/// Runs one input; panics when a property fails.
pub(crate) fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (pattern, path) = text.split_once('\0').unwrap_or((&text, "/"));
    let p = PathPattern::new(pattern);
    assert!(p.as_str().starts_with('/'));
    let m = p.matches(path);
    assert_eq!(m, p.matches(path));
    let literal = !pattern.contains('{') && !pattern.contains('*');
    if literal {
        assert!(p.matches(p.as_str()), "{pattern:?} must match itself");
    }
    let rule = RouteRule::post(pattern);
    assert_eq!(rule.matches(&Method::POST, path), m);
    assert!(!rule.matches(&Method::GET, path));
    let _ = rule.operation(&Method::POST);
}
