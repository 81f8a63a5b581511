//! Which requests need a key, and the rules each route runs under.

use std::fmt;
use std::sync::Arc;

use http::{HeaderName, Method, request::Parts};
use idem_core::{FieldSelection, Operation, Policy, Scope};

/// Whether a route needs an `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRequirement {
    /// A request without a key is refused with 400. The default.
    Required,
    /// A request without a key passes through unprotected; one with a key
    /// is protected.
    Optional,
}

/// A path pattern: literal segments, `{name}` for any one segment, and a
/// final `*` for any rest. `/accounts/{id}/transfers` matches
/// `/accounts/7/transfers`. The pattern (not the path) names the operation,
/// so one key on `/accounts/7/transfers` and `/accounts/8/transfers` are two
/// operations only if the rule says so: use the literal path for that.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    raw: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
    Rest,
}

impl PathPattern {
    /// Parses a pattern. A leading `/` is optional.
    pub fn new(pattern: &str) -> PathPattern {
        let segments = split(pattern)
            .map(|s| {
                if s == "*" {
                    Segment::Rest
                } else if s.starts_with('{') && s.ends_with('}') {
                    Segment::Param
                } else {
                    Segment::Literal(s.to_owned())
                }
            })
            .collect();
        PathPattern {
            raw: format!("/{}", pattern.trim_start_matches('/')),
            segments,
        }
    }

    /// Whether `path` matches.
    pub fn matches(&self, path: &str) -> bool {
        let mut parts = split(path);
        for seg in &self.segments {
            match seg {
                Segment::Rest => return true,
                Segment::Param => {
                    if parts.next().is_none() {
                        return false;
                    }
                }
                Segment::Literal(l) => {
                    if parts.next() != Some(l.as_str()) {
                        return false;
                    }
                }
            }
        }
        parts.next().is_none()
    }

    /// The pattern as written, with a leading `/`.
    pub fn as_str(&self) -> &str {
        &self.raw
    }
}

fn split(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|s| !s.is_empty())
}

/// The rules for requests matching a method and a path pattern.
#[derive(Debug, Clone)]
pub struct RouteRule {
    pub(crate) methods: Vec<Method>,
    pub(crate) path: PathPattern,
    pub(crate) key: KeyRequirement,
    pub(crate) policy: Policy,
    pub(crate) fields: FieldSelection,
    pub(crate) extra_headers: Vec<HeaderName>,
    pub(crate) body_limit: Option<usize>,
}

impl RouteRule {
    /// A rule for `method` on `path` (a [`PathPattern`]), key required,
    /// default policy.
    pub fn new(method: Method, path: &str) -> RouteRule {
        RouteRule {
            methods: vec![method],
            path: PathPattern::new(path),
            key: KeyRequirement::Required,
            policy: Policy::default(),
            fields: FieldSelection::Whole,
            extra_headers: Vec::new(),
            body_limit: None,
        }
    }

    /// `POST path`.
    pub fn post(path: &str) -> RouteRule {
        RouteRule::new(Method::POST, path)
    }

    /// `PATCH path`.
    pub fn patch(path: &str) -> RouteRule {
        RouteRule::new(Method::PATCH, path)
    }

    /// Adds another method to the rule.
    pub fn method(mut self, method: Method) -> Self {
        if !self.methods.contains(&method) {
            self.methods.push(method);
        }
        self
    }

    /// Whether a key is required. Default [`KeyRequirement::Required`].
    pub fn key(mut self, key: KeyRequirement) -> Self {
        self.key = key;
        self
    }

    /// The policy (ttl, lease, concurrency, dispositions). Default
    /// [`Policy::default`]: 24 h, 30 s, conflict mode.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Fingerprint only these JSON pointers. Default: the whole body.
    pub fn fingerprint_fields<I: IntoIterator<Item = S>, S: Into<String>>(
        mut self,
        fields: I,
    ) -> Self {
        self.fields = FieldSelection::Fields(fields.into_iter().map(Into::into).collect());
        self
    }

    /// Stores this response header too, beyond the default allowlist.
    /// `Set-Cookie` and hop-by-hop headers are never stored.
    pub fn store_header(mut self, name: HeaderName) -> Self {
        self.extra_headers.push(name);
        self
    }

    /// The largest request body accepted (413 beyond). Default: the
    /// layer's limit.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = Some(bytes);
        self
    }

    pub(crate) fn matches(&self, method: &Method, path: &str) -> bool {
        self.methods.contains(method) && self.path.matches(path)
    }

    /// The operations this rule names, one per method (`POST /transfers`).
    pub fn operations(&self) -> impl Iterator<Item = Operation> + '_ {
        self.methods
            .iter()
            .map(|m| Operation::new(m.as_str(), self.path.as_str()))
    }
}

/// Where a request's scope comes from: whose records it may see.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum ScopeSource {
    /// A SHA-256 of the `Authorization` header; anonymous without one.
    /// The default.
    #[default]
    Authorization,
    /// A tenant named by this header (set by a trusted proxy); anonymous
    /// without one.
    Header(HeaderName),
    /// Your own function of the request head.
    Custom(Arc<dyn Fn(&Parts) -> Scope + Send + Sync>),
}

impl fmt::Debug for ScopeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScopeSource::Authorization => f.write_str("Authorization"),
            ScopeSource::Header(h) => write!(f, "Header({h})"),
            ScopeSource::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl ScopeSource {
    /// The scope of a request, as the layer derives it.
    pub fn scope_of(&self, parts: &Parts) -> Scope {
        match self {
            ScopeSource::Authorization => parts
                .headers
                .get(http::header::AUTHORIZATION)
                .map_or_else(Scope::anonymous, |v| Scope::from_credential(v.as_bytes())),
            ScopeSource::Header(name) => parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map_or_else(Scope::anonymous, Scope::from_tenant),
            ScopeSource::Custom(f) => f(parts),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_segments() {
        let p = PathPattern::new("/accounts/{id}/transfers");
        assert!(p.matches("/accounts/7/transfers"));
        assert!(p.matches("/accounts/7/transfers/"));
        assert!(!p.matches("/accounts/7"));
        assert!(!p.matches("/accounts/7/transfers/9"));
        assert!(!p.matches("/accounts//transfers"));
        let rest = PathPattern::new("/files/*");
        assert!(rest.matches("/files/a/b/c"));
        assert!(rest.matches("/files"));
        assert!(!rest.matches("/other"));
        assert_eq!(PathPattern::new("transfers").as_str(), "/transfers");
    }

    #[test]
    fn rules_match_method_and_path() {
        let r = RouteRule::post("/t").method(Method::PUT);
        assert!(r.matches(&Method::POST, "/t"));
        assert!(r.matches(&Method::PUT, "/t"));
        assert!(!r.matches(&Method::GET, "/t"));
    }
}
