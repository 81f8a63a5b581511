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
        toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
    }
}

/// The gateway's validated configuration.
#[derive(Debug, Clone)]
pub(crate) struct GatewayConfig {
    pub(crate) upstream: http::Uri,
    pub(crate) listen: String,
    pub(crate) admin_listen: String,
    pub(crate) store: String,
    pub(crate) default_policy: Policy,
    pub(crate) routes: Vec<RouteRule>,
    pub(crate) max_body: usize,
    pub(crate) key_policy: KeyPolicy,
    pub(crate) tenant_header: Option<HeaderName>,
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

impl GatewayConfig {
    /// Merges and validates.
    pub(crate) fn from_args(args: &ServeArgs) -> anyhow::Result<GatewayConfig> {
        let file = match &args.config {
            Some(p) => FileConfig::load(p)?,
            None => FileConfig::default(),
        };
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
        let upstream_timeout = opt_duration(
            pick(&args.upstream_timeout, &file.upstream_timeout).as_ref(),
            "upstream-timeout",
        )?
        .unwrap_or(Duration::from_secs(25));
        if upstream_timeout >= lease {
            bail!(
                "--upstream-timeout ({upstream_timeout:?}) must be shorter than --lease ({lease:?}): a request still running when its lease ends could be forwarded twice"
            );
        }
        let default_policy = policy(ttl, lease, wait, "--ttl/--lease/--wait")?;
        let max_body = pick(&args.max_body, &file.max_body)
            .map(|s| size(&s))
            .transpose()
            .context("--max-body")?
            .unwrap_or(1 << 20);
        let min_key_len = args.min_key_len.or(file.min_key_len).unwrap_or(16);
        if !(1..=255).contains(&min_key_len) {
            bail!("--min-key-len must be between 1 and 255, not {min_key_len}");
        }
        let tenant_header = pick(&args.tenant_header, &file.tenant_header)
            .map(|h| {
                HeaderName::try_from(h.as_str())
                    .with_context(|| format!("--tenant-header {h:?} is not a header name"))
            })
            .transpose()?;

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
                rule = rule.body_limit(size(b).with_context(|| what.clone())?);
            }
            routes.push(rule);
        }

        Ok(GatewayConfig {
            upstream,
            listen: pick(&args.listen, &file.listen).unwrap_or_else(|| "127.0.0.1:8080".into()),
            admin_listen: pick(&args.admin_listen, &file.admin_listen)
                .unwrap_or_else(|| "127.0.0.1:9090".into()),
            store: pick(&args.store, &file.store).unwrap_or_else(|| "sqlite:idem.db".into()),
            default_policy,
            routes,
            max_body,
            key_policy: KeyPolicy::default().min_len(min_key_len),
            tenant_header,
            upstream_timeout,
            shutdown_grace: opt_duration(
                pick(&args.shutdown_grace, &file.shutdown_grace).as_ref(),
                "shutdown-grace",
            )?
            .unwrap_or(Duration::from_secs(30)),
            sweep_interval: opt_duration(
                pick(&args.sweep_interval, &file.sweep_interval).as_ref(),
                "sweep-interval",
            )?
            .unwrap_or(Duration::from_secs(60))
            .max(Duration::from_millis(100)),
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
