//! Turning flags, environment and the TOML file into one validated
//! gateway configuration. Flags (and their environment variables) win over
//! the file, the file over the defaults. Everything after this module sees
//! only [`GatewayConfig`].

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use http::{HeaderName, Method};
use idem_core::{Concurrency, KeyPolicy, Policy};
use idem_http::{KeyRequirement, RouteRule};
use serde::Deserialize;

use crate::cli::ServeArgs;
use crate::stores::StoreUrl;
use crate::units::{duration, size};

/// The TOML file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    upstream: Option<String>,
    listen: Option<String>,
    admin_listen: Option<String>,
    store: Option<String>,
    ttl: Option<String>,
    lease: Option<String>,
    wait: Option<String>,
    max_body: Option<String>,
    min_key_len: Option<usize>,
    tenant_header: Option<String>,
    scope_header: Option<String>,
    require_scope: Option<bool>,
    anonymous_reads: Option<bool>,
    trust_forwarded: Option<bool>,
    max_response: Option<String>,
    replay_cache: Option<String>,
    header_timeout: Option<String>,
    body_timeout: Option<String>,
    max_connections: Option<usize>,
    store_timeout: Option<String>,
    upstream_timeout: Option<String>,
    shutdown_grace: Option<String>,
    sweep_interval: Option<String>,
    #[serde(default, rename = "route")]
    routes: Vec<FileRoute>,
}

/// One `[[route]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileRoute {
    method: Option<String>,
    #[serde(default)]
    methods: Vec<String>,
    path: String,
    /// `required` (default) or `optional`.
    key: Option<String>,
    ttl: Option<String>,
    lease: Option<String>,
    wait: Option<String>,
    #[serde(default)]
    fingerprint_fields: Vec<String>,
    #[serde(default)]
    store_headers: Vec<String>,
    max_body: Option<String>,
}

impl FileConfig {
    pub(crate) fn load(path: &Path) -> anyhow::Result<FileConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        FileConfig::parse(&text).with_context(|| format!("invalid config file {}", path.display()))
    }

    /// Parses a config file's text.
    pub(crate) fn parse(text: &str) -> anyhow::Result<FileConfig> {
        Ok(toml::from_str(text)?)
    }
}

/// The gateway's validated configuration.
#[derive(Debug, Clone)]
pub(crate) struct GatewayConfig {
    pub(crate) upstream: http::Uri,
    pub(crate) listen: String,
    pub(crate) admin_listen: String,
    pub(crate) store: StoreUrl,
    pub(crate) default_policy: Policy,
    pub(crate) routes: Vec<RouteRule>,
    pub(crate) max_body: usize,
    pub(crate) key_policy: KeyPolicy,
    pub(crate) scope_headers: Vec<HeaderName>,
    pub(crate) require_scope: bool,
    pub(crate) anonymous_reads: bool,
    pub(crate) trust_forwarded: bool,
    pub(crate) max_response: usize,
    pub(crate) replay_cache: usize,
    pub(crate) header_timeout: Duration,
    pub(crate) body_timeout: Duration,
    pub(crate) max_connections: usize,
    pub(crate) store_timeout: Duration,
    pub(crate) upstream_timeout: Duration,
    pub(crate) shutdown_grace: Duration,
    pub(crate) sweep_interval: Duration,
}

fn policy(
    ttl: Duration,
    lease: Duration,
    wait: Option<Duration>,
    what: &str,
) -> anyhow::Result<Policy> {
    let mut b = Policy::builder().ttl(ttl).lease(lease);
    if let Some(limit) = wait {
        b = b.concurrency(Concurrency::Wait { limit });
    }
    b.build().with_context(|| format!("{what}: invalid policy"))
}

fn opt_duration(v: Option<&String>, name: &str) -> anyhow::Result<Option<Duration>> {
    v.map(|t| duration(t).with_context(|| format!("--{name}")))
        .transpose()
}

/// A duration setting: parsed, defaulted, and checked against its bounds.
fn bounded_duration(
    v: Option<&String>,
    name: &str,
    default: Duration,
    min: Duration,
    max: Duration,
) -> anyhow::Result<Duration> {
    let d = opt_duration(v, name)?.unwrap_or(default);
    if d < min || d > max {
        bail!("--{name} must be between {min:?} and {max:?}, not {d:?}");
    }
    Ok(d)
}

/// The largest body or response size accepted in the configuration.
const MAX_SIZE: usize = 256 << 20;

/// A size setting: parsed, defaulted, at most [`MAX_SIZE`].
fn bounded_size(v: Option<&String>, name: &str, default: usize) -> anyhow::Result<usize> {
    let n = v
        .map(|t| size(t))
        .transpose()
        .with_context(|| format!("--{name}"))?
        .unwrap_or(default);
    if n > MAX_SIZE {
        bail!("--{name} must be at most 256MiB, not {n} bytes");
    }
    Ok(n)
}

fn header_name(v: Option<String>, flag: &str) -> anyhow::Result<Option<HeaderName>> {
    v.map(|h| {
        HeaderName::try_from(h.as_str())
            .with_context(|| format!("--{flag} {h:?} is not a header name"))
    })
    .transpose()
}

impl GatewayConfig {
    /// Merges and validates.
    pub(crate) fn from_args(args: &ServeArgs) -> anyhow::Result<GatewayConfig> {
        let file = match &args.config {
            Some(p) => FileConfig::load(p)?,
            None => FileConfig::default(),
        };
        GatewayConfig::from_file(args, &file)
    }

    /// Merges flags over a parsed file, and validates.
    pub(crate) fn from_file(args: &ServeArgs, file: &FileConfig) -> anyhow::Result<GatewayConfig> {
        let pick =
            |flag: &Option<String>, file: &Option<String>| flag.clone().or_else(|| file.clone());

        let Some(upstream) = pick(&args.upstream, &file.upstream) else {
            bail!("--upstream (or IDEM_UPSTREAM, or `upstream` in the config file) is required");
        };
        let upstream: http::Uri = upstream
            .parse()
            .with_context(|| format!("--upstream {upstream:?} is not a URL"))?;
        if upstream.scheme_str() != Some("http") || upstream.authority().is_none() {
            bail!("--upstream must be an http:// URL with a host, not {upstream}");
        }

        let ttl = opt_duration(pick(&args.ttl, &file.ttl).as_ref(), "ttl")?
            .unwrap_or(Duration::from_secs(86_400));
        let lease = opt_duration(pick(&args.lease, &file.lease).as_ref(), "lease")?
            .unwrap_or(Duration::from_secs(30));
        let wait = opt_duration(pick(&args.wait, &file.wait).as_ref(), "wait")?;
        let upstream_timeout = bounded_duration(
            pick(&args.upstream_timeout, &file.upstream_timeout).as_ref(),
            "upstream-timeout",
            Duration::from_secs(25),
            Duration::from_millis(1),
            Duration::from_secs(3600),
        )?;
        let store_timeout = bounded_duration(
            pick(&args.store_timeout, &file.store_timeout).as_ref(),
            "store-timeout",
            Duration::from_secs(2),
            Duration::from_millis(10),
            Duration::from_secs(60),
        )?;
        // The lease must cover the forwarded request and the completion
        // that stores its answer; a lease that ends first lets a retry be
        // forwarded beside the first execution.
        let held = upstream_timeout + store_timeout;
        if held >= lease {
            bail!(
                "--upstream-timeout ({upstream_timeout:?}) plus --store-timeout ({store_timeout:?}) must be shorter than --lease ({lease:?}): a request still running when its lease ends could be forwarded twice"
            );
        }
        let default_policy = policy(ttl, lease, wait, "--ttl/--lease/--wait")?;
        let max_body = bounded_size(
            pick(&args.max_body, &file.max_body).as_ref(),
            "max-body",
            1 << 20,
        )?;
        let replay_cache = bounded_size(
            pick(&args.replay_cache, &file.replay_cache).as_ref(),
            "replay-cache",
            idem_http::DEFAULT_REPLAY_CACHE,
        )?;
        let max_response = bounded_size(
            pick(&args.max_response, &file.max_response).as_ref(),
            "max-response",
            8 << 20,
        )?;
        let max_connections = args
            .max_connections
            .or(file.max_connections)
            .unwrap_or(1024);
        if !(1..=1_000_000).contains(&max_connections) {
            bail!("--max-connections must be between 1 and 1000000, not {max_connections}");
        }
        let min_key_len = args.min_key_len.or(file.min_key_len).unwrap_or(16);
        if !(1..=255).contains(&min_key_len) {
            bail!("--min-key-len must be between 1 and 255, not {min_key_len}");
        }
        let scope_headers: Vec<HeaderName> = [
            header_name(
                pick(&args.tenant_header, &file.tenant_header),
                "tenant-header",
            )?,
            header_name(pick(&args.scope_header, &file.scope_header), "scope-header")?,
        ]
        .into_iter()
        .flatten()
        .collect();
        if let [a, b] = &scope_headers[..]
            && a == b
        {
            bail!("--tenant-header and --scope-header name the same header {a}");
        }

        let mut routes = Vec::new();
        for (i, r) in file.routes.iter().enumerate() {
            let what = format!("[[route]] #{} ({})", i + 1, r.path);
            let mut methods: Vec<String> = r.methods.clone();
            methods.extend(r.method.clone());
            if methods.is_empty() {
                bail!("{what}: give `method` or `methods`");
            }
            let methods = methods
                .iter()
                .map(|m| {
                    Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                        .with_context(|| format!("{what}: bad method {m:?}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let r_ttl = opt_duration(r.ttl.as_ref(), "ttl")
                .with_context(|| what.clone())?
                .unwrap_or(ttl);
            let r_lease = opt_duration(r.lease.as_ref(), "lease")
                .with_context(|| what.clone())?
                .unwrap_or(lease);
            let r_wait = opt_duration(r.wait.as_ref(), "wait")
                .with_context(|| what.clone())?
                .or(wait);
            if held >= r_lease {
                bail!(
                    "{what}: lease ({r_lease:?}) must be longer than --upstream-timeout ({upstream_timeout:?}) plus --store-timeout ({store_timeout:?}): a request still running when its lease ends could be forwarded twice"
                );
            }
            let mut rule = RouteRule::new(methods[0].clone(), &r.path)
                .policy(policy(r_ttl, r_lease, r_wait, &what)?);
            for m in &methods[1..] {
                rule = rule.method(m.clone());
            }
            rule = rule.key(match r.key.as_deref() {
                None | Some("required") => KeyRequirement::Required,
                Some("optional") => KeyRequirement::Optional,
                Some(other) => {
                    bail!("{what}: key must be \"required\" or \"optional\", not {other:?}")
                }
            });
            if !r.fingerprint_fields.is_empty() {
                if let Some(bad) = r.fingerprint_fields.iter().find(|f| !f.starts_with('/')) {
                    bail!(
                        "{what}: fingerprint field {bad:?} must be a JSON pointer such as \"/amount\""
                    );
                }
                rule = rule.fingerprint_fields(r.fingerprint_fields.clone());
            }
            for h in &r.store_headers {
                rule = rule.store_header(
                    HeaderName::try_from(h.as_str())
                        .with_context(|| format!("{what}: bad header {h:?}"))?,
                );
            }
            if let Some(b) = &r.max_body {
                rule = rule.body_limit(
                    bounded_size(Some(b), "max-body", max_body).with_context(|| what.clone())?,
                );
            }
            routes.push(rule);
        }

        let store: StoreUrl = pick(&args.store, &file.store)
            .as_deref()
            .unwrap_or("sqlite:idem.db")
            .parse()
            .context("--store")?;

        Ok(GatewayConfig {
            upstream,
            listen: pick(&args.listen, &file.listen).unwrap_or_else(|| "127.0.0.1:8080".into()),
            admin_listen: pick(&args.admin_listen, &file.admin_listen)
                .unwrap_or_else(|| "127.0.0.1:9090".into()),
            store,
            default_policy,
            routes,
            max_body,
            key_policy: KeyPolicy::default().min_len(min_key_len),
            scope_headers,
            require_scope: args.require_scope || file.require_scope.unwrap_or(false),
            anonymous_reads: args.anonymous_reads || file.anonymous_reads.unwrap_or(false),
            trust_forwarded: args.trust_forwarded || file.trust_forwarded.unwrap_or(false),
            max_response,
            replay_cache,
            header_timeout: bounded_duration(
                pick(&args.header_timeout, &file.header_timeout).as_ref(),
                "header-timeout",
                Duration::from_secs(10),
                Duration::from_millis(100),
                Duration::from_secs(300),
            )?,
            body_timeout: bounded_duration(
                pick(&args.body_timeout, &file.body_timeout).as_ref(),
                "body-timeout",
                Duration::from_secs(30),
                Duration::from_millis(100),
                Duration::from_secs(600),
            )?,
            max_connections,
            store_timeout,
            upstream_timeout,
            shutdown_grace: bounded_duration(
                pick(&args.shutdown_grace, &file.shutdown_grace).as_ref(),
                "shutdown-grace",
                Duration::from_secs(30),
                Duration::ZERO,
                Duration::from_secs(3600),
            )?,
            sweep_interval: bounded_duration(
                pick(&args.sweep_interval, &file.sweep_interval).as_ref(),
                "sweep-interval",
                Duration::from_secs(60),
                Duration::from_millis(100),
                Duration::from_secs(86_400),
            )?,
        })
    }
}

/// The operations the config's routes name (for record look-ups).
pub(crate) fn route_operations(path: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let file = FileConfig::load(path)?;
    Ok(file
        .routes
        .iter()
        .flat_map(|r| {
            let mut methods = r.methods.clone();
            methods.extend(r.method.clone());
            methods
                .into_iter()
                .map(move |m| (m.to_ascii_uppercase(), r.path.clone()))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(text: &str) {
        // Any text: an error or a config, never a panic.
        if let Ok(file) = FileConfig::parse(text) {
            let mut args = ServeArgs::default();
            if file.upstream.is_none() {
                args.upstream = Some("http://127.0.0.1:1".into());
            }
            let _ = GatewayConfig::from_file(&args, &file);
        }
    }

    fn duration_text() -> impl Strategy<Value = String> {
        (
            prop_oneof![Just(0u64), 1u64..100, any::<u64>()],
            prop::sample::select(vec!["", "ms", "s", "m", "h", "d", "y", " s", "µs"]),
        )
            .prop_map(|(n, u)| format!("{n}{u}"))
    }

    /// Cases per property: 2,000 in every test run; set
    /// `IDEM_CONFIG_FUZZ_CASES` for a long run.
    fn cases() -> u32 {
        std::env::var("IDEM_CONFIG_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2_000)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        #[test]
        fn any_text_is_an_error_or_a_config(text in "\\PC{0,200}") {
            check(&text);
        }

        #[test]
        fn any_settings_are_an_error_or_a_config(
            ttl in duration_text(),
            lease in duration_text(),
            wait in duration_text(),
            timeout in duration_text(),
            body in (any::<u32>(), prop::sample::select(vec!["", "B", "KiB", "MiB", "GiB"])),
            path in "[/{}*a-z.%]{0,20}",
            method in "[A-Za-z]{0,8}",
            fields in prop::collection::vec("[/a-z~0-9]{0,6}", 0..3),
        ) {
            let text = format!(
                "upstream = \"http://127.0.0.1:1\"\nttl = {ttl:?}\nlease = {lease:?}\nwait = {wait:?}\n\
                 upstream_timeout = {timeout:?}\nmax_body = \"{}{}\"\n\
                 [[route]]\nmethod = {method:?}\npath = {path:?}\nlease = {lease:?}\nfingerprint_fields = {fields:?}\n",
                body.0, body.1
            );
            check(&text);
        }
    }
}
