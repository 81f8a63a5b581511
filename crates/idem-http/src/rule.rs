//! Which requests need a key, and the rules each route runs under.

use std::borrow::Cow;
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
/// `/accounts/7/transfers`. The pattern (not the path) names the operation;
/// the actual path is bound by the fingerprint, so one key sent to
/// `/accounts/7/transfers` and then to `/accounts/8/transfers` is refused
/// (422), never replayed.
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
            raw: rooted(pattern).into_owned(),
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

    /// A path the pattern matches: each `{name}` and a final `*` stand
    /// for one segment, `x`.
    #[cfg(feature = "axum")]
    pub(crate) fn example(&self) -> String {
        let segments = self.segments.iter().map(|s| match s {
            Segment::Literal(l) => l.as_str(),
            Segment::Param | Segment::Rest => "x",
        });
        let mut path: String = segments.map(|s| format!("/{s}")).collect();
        // A pattern written with a trailing slash names a route with one.
        if path.is_empty() || self.raw.ends_with('/') {
            path.push('/');
        }
        path
    }
}

/// A pattern or path with exactly one leading `/`: how a pattern names its
/// operation, and so how the default rule names a path's.
fn rooted(path: &str) -> Cow<'_, str> {
    let rest = path.trim_start_matches('/');
    if rest.len() + 1 == path.len() {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(format!("/{rest}"))
    }
}

fn split(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|s| !s.is_empty())
}

/// The rules for requests matching a method and a path pattern.
#[derive(Debug, Clone)]
pub struct RouteRule {
    /// The rule's methods, each with its operation (`POST /transfers`),
    /// formed once here instead of for every request.
    pub(crate) methods: Vec<(Method, Operation)>,
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
        RouteRule::without_methods(path).method(method)
    }

    /// The rule of requests that only the layer's default methods select:
    /// key required, the default policy, the whole body fingerprinted. It
    /// names no method and so matches nothing itself; each request's
    /// operation is its own path ([`RouteRule::default_operation`]).
    pub(crate) fn for_default_methods() -> RouteRule {
        RouteRule::without_methods("*")
    }

    fn without_methods(path: &str) -> RouteRule {
        RouteRule {
            methods: Vec::new(),
            path: PathPattern::new(path),
            key: KeyRequirement::Required,
            policy: Policy::default(),
            fields: FieldSelection::Whole,
            extra_headers: Vec::new(),
            body_limit: None,
        }
    }

    /// The operation of a request on `path` under the default rule: the
    /// literal path, with one leading `/`, as if it were the rule's pattern.
    pub(crate) fn default_operation(method: &Method, path: &str) -> Operation {
        Operation::new(method.as_str(), &rooted(path))
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
        if !self.methods.iter().any(|(m, _)| *m == method) {
            let operation = Operation::new(method.as_str(), self.path.as_str());
            self.methods.push((method, operation));
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

    /// What a takeover of an abandoned claim does on this route (sets it
    /// on the rule's policy). Default [`Takeover::Hold`](idem_core::Takeover::Hold).
    /// A handler in atomic mode can take [`Takeover::Reexecute`](idem_core::Takeover::Reexecute):
    /// its record completes in the transaction of its effect, so a claim
    /// left in progress is one whose effect never committed.
    pub fn takeover(mut self, takeover: idem_core::Takeover) -> Self {
        self.policy = self.policy.with_takeover(takeover);
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

    /// Whether a request with `method` on `path` falls under this rule.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        self.methods.iter().any(|(m, _)| m == method) && self.path.matches(path)
    }

    /// Whether this rule names the router's `route` (a pattern as
    /// registered, `/payments/{id}`) for `method`: the same pattern, up to
    /// the leading `/`.
    pub(crate) fn names_route(&self, method: &Method, route: &str) -> bool {
        self.methods.iter().any(|(m, _)| m == method) && self.path.as_str() == rooted(route)
    }

    /// The operation a request with `method` under this rule belongs to.
    pub fn operation(&self, method: &Method) -> Operation {
        match self.methods.iter().find(|(m, _)| m == method) {
            Some((_, operation)) => operation.clone(),
            None => {
                debug_assert!(
                    !self.methods.is_empty(),
                    "the default methods' rule names no operation; use Shared::operation"
                );
                Operation::new(method.as_str(), self.path.as_str())
            }
        }
    }

    /// The operations this rule names, one per method (`POST /transfers`).
    pub fn operations(&self) -> impl Iterator<Item = Operation> + '_ {
        self.methods.iter().map(|(_, operation)| operation.clone())
    }
}

/// Where a request's scope comes from: whose records it may see.
///
/// Two callers must never share a scope by accident: a header that is
/// named as the scope's source must be present exactly once and hold a
/// plausible value, or the request is refused ([`ScopeError`]); it never
/// falls back to the anonymous scope.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum ScopeSource {
    /// A SHA-256 of the `Authorization` header; the anonymous scope without
    /// one (unless the layer requires a scope). A repeated `Authorization`
    /// is refused. Its length is bounded only by the server's own limit on
    /// request heads: access tokens (OIDC, Entra) are often 1.5-3 KiB.
    /// The default.
    #[default]
    Authorization,
    /// A tenant or principal named by this header, set by a trusted proxy in
    /// front of the service: its raw bytes are hashed. Missing, repeated,
    /// empty or oversized: refused.
    Header(HeaderName),
    /// Several such headers together (a tenant and a user within it, say),
    /// each under the same rules.
    Headers(Vec<HeaderName>),
    /// Your own function of the request head.
    Custom(Arc<ScopeFn>),
}

/// A function that derives a request's scope.
pub type ScopeFn = dyn Fn(&Parts) -> Result<Scope, ScopeError> + Send + Sync;

/// The longest value a scope header may hold, in bytes: a tenant or
/// principal name set by a trusted proxy. `Authorization` is a credential,
/// not a name, and has no limit of its own (the server's limit on request
/// heads bounds it), also when it is named as a scope header.
pub const MAX_SCOPE_HEADER_LEN: usize = 1024;

/// Why a request's scope could not be derived (400, or 401 when no
/// credential was given where one is required).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// The header that names the scope is absent.
    #[error("the {0} header is required")]
    Missing(HeaderName),
    /// The header that names the scope appears more than once.
    #[error("send exactly one {0} header")]
    Repeated(HeaderName),
    /// The header is empty, has control characters, or is too long (a
    /// scope header other than `Authorization` over
    /// [`MAX_SCOPE_HEADER_LEN`]).
    #[error(
        "the {0} header must be non-empty, without control characters, and (unless it is Authorization) at most 1024 bytes"
    )]
    Invalid(HeaderName),
    /// No credential, and the layer does not serve anonymous callers.
    #[error("this operation needs a credential (Authorization)")]
    CredentialRequired,
}

impl fmt::Debug for ScopeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScopeSource::Authorization => f.write_str("Authorization"),
            ScopeSource::Header(h) => write!(f, "Header({h})"),
            ScopeSource::Headers(h) => write!(f, "Headers({h:?})"),
            ScopeSource::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// The one value of `name`, checked.
fn single<'a>(headers: &'a http::HeaderMap, name: &HeaderName) -> Result<&'a [u8], ScopeError> {
    let mut values = headers.get_all(name).iter();
    let value = match (values.next(), values.next()) {
        (None, _) => return Err(ScopeError::Missing(name.clone())),
        (Some(_), Some(_)) => return Err(ScopeError::Repeated(name.clone())),
        (Some(v), None) => v.as_bytes(),
    };
    let within_limit = *name == http::header::AUTHORIZATION || value.len() <= MAX_SCOPE_HEADER_LEN;
    let plausible =
        !value.is_empty() && within_limit && !value.iter().any(|b| b.is_ascii_control());
    if plausible {
        Ok(value)
    } else {
        Err(ScopeError::Invalid(name.clone()))
    }
}

impl ScopeSource {
    /// The scope of a request, as the layer derives it.
    ///
    /// # Errors
    /// [`ScopeError`] when a header that names the scope is missing,
    /// repeated or invalid.
    pub fn scope_of(&self, parts: &Parts) -> Result<Scope, ScopeError> {
        match self {
            ScopeSource::Authorization => {
                let name = http::header::AUTHORIZATION;
                if parts.headers.contains_key(&name) {
                    single(&parts.headers, &name).map(Scope::from_credential)
                } else {
                    Ok(Scope::anonymous())
                }
            }
            ScopeSource::Header(name) => single(&parts.headers, name).map(Scope::from_tenant),
            ScopeSource::Headers(names) => {
                let values = names
                    .iter()
                    .map(|n| single(&parts.headers, n))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Scope::from_parts(&values))
            }
            ScopeSource::Custom(f) => f(parts),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operation a request got before rules were shared, written out
    /// on its own (not through `rooted` or `PathPattern`), so that a change
    /// to either shows here: the method as sent, a space, the path with
    /// exactly one leading `/`. Stored records are keyed by it. (The
    /// method was upper-cased until methods were bound as sent: the
    /// standard methods, upper-case already, keep their names.)
    fn operation_before(method: &Method, path: &str) -> String {
        format!("{} /{}", method.as_str(), path.trim_start_matches('/'))
    }

    fn method_from(token: &str) -> Method {
        Method::from_bytes(token.as_bytes()).expect("a method token")
    }

    proptest::proptest! {
        /// Every request is named as before, under the default rule and
        /// under a configured one (several methods, one added twice, and a
        /// method the rule does not name): records written before keep
        /// matching. Any path, any method token (standard, extension,
        /// lower-case, short and long).
        #[test]
        fn operations_are_named_as_before(
            slashes in 0..4usize,
            rest in proptest::prelude::any::<String>(),
            token in "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,20}",
        ) {
            let path = format!("{}{rest}", "/".repeat(slashes));
            let method = method_from(&token);
            let expected = operation_before(&method, &path);
            let named = RouteRule::default_operation(&method, &path);
            proptest::prop_assert_eq!(named.as_str(), &expected);
            let pattern = PathPattern::new(&path);
            proptest::prop_assert_eq!(
                pattern.as_str(),
                format!("/{}", path.trim_start_matches('/'))
            );
            let rule = RouteRule::new(Method::PUT, &path).method(method.clone()).method(Method::PUT);
            let named = rule.operation(&method);
            proptest::prop_assert_eq!(named.as_str(), &expected);
            let unnamed = rule.operation(&Method::DELETE);
            proptest::prop_assert_eq!(unnamed.as_str(), operation_before(&Method::DELETE, &path));
            let named: Vec<String> = rule.operations().map(|o| o.as_str().to_owned()).collect();
            let mut wanted = vec![operation_before(&Method::PUT, &path)];
            if method != Method::PUT {
                wanted.push(expected);
            }
            proptest::prop_assert_eq!(named, wanted);
        }
    }

    /// Literal names, independent of any of this code: these are in stores.
    #[test]
    fn operations_keep_their_literal_names() {
        let post = Method::POST;
        for (path, name) in [
            ("", "POST /"),
            ("/", "POST /"),
            ("orders", "POST /orders"),
            ("///a//b/", "POST /a//b/"),
            ("/%7Bx%7D", "POST /%7Bx%7D"),
            ("/{id}", "POST /{id}"),
            ("/*", "POST /*"),
            ("/é", "POST /é"),
        ] {
            assert_eq!(RouteRule::default_operation(&post, path).as_str(), name);
            assert_eq!(
                RouteRule::new(post.clone(), path).operation(&post).as_str(),
                name
            );
        }
        // Methods are case-sensitive: a lower-case extension method names
        // its own records (it was upper-cased, and shared `PURGE`'s, until
        // methods were bound as sent).
        let purge = method_from("purge");
        assert_eq!(
            RouteRule::default_operation(&purge, "/x").as_str(),
            "purge /x"
        );
        let upper = method_from("PURGE");
        assert_eq!(
            RouteRule::default_operation(&upper, "/x").as_str(),
            "PURGE /x"
        );
        let rule = RouteRule::post("/orders/{id}").method(purge.clone());
        assert_eq!(rule.operation(&purge).as_str(), "purge /orders/{id}");
    }

    #[test]
    fn a_rule_names_each_method_s_operation_once() {
        let rule = RouteRule::post("/orders/{id}")
            .method(Method::PUT)
            .method(Method::POST);
        assert_eq!(rule.methods.len(), 2, "a method added twice is kept once");
        assert_eq!(rule.operation(&Method::PUT).as_str(), "PUT /orders/{id}");
        assert_eq!(rule.operation(&Method::POST).as_str(), "POST /orders/{id}");
        let names: Vec<_> = rule.operations().map(|o| o.as_str().to_owned()).collect();
        assert_eq!(names, ["POST /orders/{id}", "PUT /orders/{id}"]);
        assert!(rule.matches(&Method::PUT, "/orders/7"));
        assert!(!rule.matches(&Method::PATCH, "/orders/7"));
    }

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

    fn parts(headers: &[(&str, &[u8])]) -> Parts {
        let mut b = http::Request::builder();
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn scope_headers_never_fall_back_to_a_shared_scope() {
        let tenant = ScopeSource::Header(HeaderName::from_static("x-tenant"));
        let cafe = tenant
            .scope_of(&parts(&[("x-tenant", "café".as_bytes())]))
            .unwrap();
        let caf = tenant.scope_of(&parts(&[("x-tenant", b"caf")])).unwrap();
        assert_ne!(cafe, caf);
        assert_ne!(cafe, Scope::anonymous());
        assert!(matches!(
            tenant.scope_of(&parts(&[])),
            Err(ScopeError::Missing(_))
        ));
        assert!(matches!(
            tenant.scope_of(&parts(&[("x-tenant", b"a"), ("x-tenant", b"b")])),
            Err(ScopeError::Repeated(_))
        ));
        assert!(matches!(
            tenant.scope_of(&parts(&[("x-tenant", b"")])),
            Err(ScopeError::Invalid(_))
        ));
        assert!(matches!(
            tenant.scope_of(&parts(&[("x-tenant", b"a\tb")])),
            Err(ScopeError::Invalid(_))
        ));
        let long = vec![b'a'; MAX_SCOPE_HEADER_LEN + 1];
        assert!(matches!(
            tenant.scope_of(&parts(&[("x-tenant", &long)])),
            Err(ScopeError::Invalid(_))
        ));

        let auth = ScopeSource::Authorization;
        assert_eq!(auth.scope_of(&parts(&[])).unwrap(), Scope::anonymous());
        // A long access token is a credential like any other, under the
        // default source and named as a scope header; two differ.
        let token = |fill: u8| [&b"Bearer "[..], &vec![fill; 3000]].concat();
        let named = ScopeSource::Header(http::header::AUTHORIZATION);
        for source in [&auth, &named] {
            let a = source
                .scope_of(&parts(&[("authorization", &token(b'a'))]))
                .unwrap();
            let b = source
                .scope_of(&parts(&[("authorization", &token(b'b'))]))
                .unwrap();
            assert_ne!(a, b);
            assert_ne!(a, Scope::anonymous());
        }
        assert!(matches!(
            auth.scope_of(&parts(&[
                ("authorization", b"Bearer a"),
                ("authorization", b"Bearer b")
            ])),
            Err(ScopeError::Repeated(_))
        ));

        let both = ScopeSource::Headers(vec![
            HeaderName::from_static("x-tenant"),
            HeaderName::from_static("x-user"),
        ]);
        let a = both
            .scope_of(&parts(&[("x-tenant", b"t1"), ("x-user", b"u")]))
            .unwrap();
        let b = both
            .scope_of(&parts(&[("x-tenant", b"t2"), ("x-user", b"u")]))
            .unwrap();
        assert_ne!(a, b);
        assert!(matches!(
            both.scope_of(&parts(&[("x-tenant", b"t1")])),
            Err(ScopeError::Missing(_))
        ));
    }
}
