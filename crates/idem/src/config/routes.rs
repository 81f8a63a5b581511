//! `[[route]]` sections: each validated with what it inherits from the
//! gateway's own settings, and turned into the layer's rule.

use std::time::Duration;

use anyhow::Context;
use http::{HeaderName, Method};
use idem_core::{Policy, Takeover};
use idem_http::{KeyRequirement, RouteRule};

use super::file::FileRoute;
use super::problems::Problems;
use super::values::{bounded_size, opt_duration, opt_takeover, policy};

/// One validated `[[route]]`, as `idem check-config` shows it: its own
/// settings merged with the defaults it inherits.
#[derive(Debug, Clone)]
pub(crate) struct RouteSettings {
    pub(crate) methods: Vec<Method>,
    pub(crate) path: String,
    pub(crate) key: KeyRequirement,
    pub(crate) policy: Policy,
    pub(crate) fingerprint_fields: Vec<String>,
    pub(crate) store_headers: Vec<HeaderName>,
    /// `None`: the gateway's `--max-body`.
    pub(crate) max_body: Option<usize>,
}

/// What a route inherits from the gateway's own settings; `None` where
/// that setting was refused (its problem is already recorded).
pub(super) struct Inherited {
    pub(super) ttl: Option<Duration>,
    pub(super) lease: Option<Duration>,
    pub(super) wait: Option<Option<Duration>>,
    pub(super) takeover: Option<Takeover>,
    /// Whether the default policy itself is valid.
    pub(super) policy_ok: bool,
    pub(super) upstream_timeout: Option<Duration>,
    pub(super) store_timeout: Option<Duration>,
}

/// Validates one `[[route]]`; `None` when it has a problem (recorded).
pub(super) fn route(
    r: &FileRoute,
    index: usize,
    inherited: &Inherited,
    p: &mut Problems,
) -> Option<RouteSettings> {
    let what = format!("[[route]] #{} ({})", index + 1, r.path);
    let mut names: Vec<String> = r.methods.clone();
    names.extend(r.method.clone());
    if names.is_empty() {
        p.add(format!("{what}: give `method` or `methods`"));
    }
    let mut methods = Vec::new();
    for m in &names {
        match Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
            // The gateway refuses CONNECT (405) before the upstream: a
            // rule for it would store that refusal as a key's answer.
            Ok(Method::CONNECT) => p.add(format!(
                "{what}: CONNECT is never forwarded, so it cannot have a rule"
            )),
            Ok(method) => methods.push(method),
            Err(_) => p.add(format!("{what}: bad method {m:?}")),
        }
    }
    let ttl = p.check(opt_duration(r.ttl.as_ref(), "ttl").with_context(|| what.clone()));
    let lease = p.check(opt_duration(r.lease.as_ref(), "lease").with_context(|| what.clone()));
    let wait = p.check(opt_duration(r.wait.as_ref(), "wait").with_context(|| what.clone()));
    let takeover = p
        .check(opt_takeover(
            r.takeover.as_ref(),
            &format!("{what}: takeover"),
        ))
        .map(|t| t.or(inherited.takeover));

    // The lease against the deadlines; a lease inherited was checked with
    // the gateway's own.
    if let (Some(Some(r_lease)), Some(upstream_timeout), Some(store_timeout)) =
        (lease, inherited.upstream_timeout, inherited.store_timeout)
        && upstream_timeout + store_timeout >= r_lease
    {
        p.add(format!(
            "{what}: lease ({r_lease:?}) must be longer than --upstream-timeout ({upstream_timeout:?}) plus --store-timeout ({store_timeout:?}): a request still running when its lease ends could be forwarded twice"
        ));
    }
    // The policy: from the route's own settings over the inherited ones,
    // unless one of those is refused already.
    let inherits = r.ttl.is_none() || r.lease.is_none() || r.wait.is_none();
    let policy = match (
        ttl.map(|t| t.or(inherited.ttl)),
        lease.map(|l| l.or(inherited.lease)),
        wait.map(|w| match w {
            Some(w) => Some(Some(w)),
            None => inherited.wait,
        }),
    ) {
        (Some(Some(t)), Some(Some(l)), Some(Some(w))) if inherited.policy_ok || !inherits => {
            takeover
                .flatten()
                .and_then(|k| p.check(policy(t, l, w, k, &what)))
        }
        _ => None,
    };

    let key = match r.key.as_deref() {
        None | Some("required") => Some(KeyRequirement::Required),
        Some("optional") => Some(KeyRequirement::Optional),
        Some(other) => {
            p.add(format!(
                "{what}: key must be \"required\" or \"optional\", not {other:?}"
            ));
            None
        }
    };
    let mut fields_ok = true;
    for bad in r.fingerprint_fields.iter().filter(|f| !f.starts_with('/')) {
        p.add(format!(
            "{what}: fingerprint field {bad:?} must be a JSON pointer such as \"/amount\""
        ));
        fields_ok = false;
    }
    let mut store_headers = Vec::new();
    for h in &r.store_headers {
        match HeaderName::try_from(h.as_str()) {
            Ok(name) => store_headers.push(name),
            Err(_) => p.add(format!("{what}: bad header {h:?}")),
        }
    }
    let max_body = match &r.max_body {
        Some(b) => {
            Some(p.check(bounded_size(Some(b), "max-body", 0).with_context(|| what.clone()))?)
        }
        None => None,
    };

    if names.is_empty()
        || methods.len() != names.len()
        || store_headers.len() != r.store_headers.len()
        || !fields_ok
    {
        return None;
    }
    Some(RouteSettings {
        methods,
        path: r.path.clone(),
        key: key?,
        policy: policy?,
        fingerprint_fields: r.fingerprint_fields.clone(),
        store_headers,
        max_body,
    })
}

impl RouteSettings {
    /// The rule the layer runs this route with.
    pub(super) fn rule(&self) -> Option<RouteRule> {
        let (first, rest) = self.methods.split_first()?;
        let mut rule = RouteRule::new(first.clone(), &self.path)
            .policy(self.policy.clone())
            .key(self.key);
        for m in rest {
            rule = rule.method(m.clone());
        }
        if !self.fingerprint_fields.is_empty() {
            rule = rule.fingerprint_fields(self.fingerprint_fields.clone());
        }
        for h in &self.store_headers {
            rule = rule.store_header(h.clone());
        }
        if let Some(limit) = self.max_body {
            rule = rule.body_limit(limit);
        }
        Some(rule)
    }
}
