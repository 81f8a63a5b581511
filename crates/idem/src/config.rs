//! Turning flags, environment and the TOML file into one validated
//! gateway configuration. Flags (and their environment variables) win over
//! the file, the file over the defaults. Everything after this module sees
//! only [`GatewayConfig`].
//!
//! Validation goes on past a problem: every independent problem is
//! collected into one [`ConfigError`], one line each, so that `idem
//! check-config` (and `idem serve`, which refuses to start with the same
//! lines) shows them all at once. A check that depends on a setting
//! already refused (the lease against a bad `--upstream-timeout`, a
//! route's policy inheriting a bad `--ttl`) is skipped rather than
//! reported twice.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use http::{HeaderName, Method, header};
use idem_core::{Concurrency, KeyPolicy, Policy};
use idem_http::{KeyRequirement, RouteRule};
use serde::Deserialize;

use crate::cli::ServeArgs;
use crate::stores::StoreUrl;
use crate::tls::{CaFile, ServerTls};
use crate::units::{duration, size};

/// The TOML file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    upstream: Option<String>,
    upstream_ca: Option<PathBuf>,
    listen: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    admin_listen: Option<String>,
    store: Option<String>,
    store_ca: Option<PathBuf>,
    ttl: Option<String>,
    lease: Option<String>,
    wait: Option<String>,
    max_body: Option<String>,
    min_key_len: Option<usize>,
    key_header: Option<String>,
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
    threads: Option<usize>,
    store_timeout: Option<String>,
    upstream_timeout: Option<String>,
    upstream_idle_timeout: Option<String>,
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

    /// Parses a config file's text. A syntax error is one line: where it
    /// is and what is wrong (toml's own message spans several lines).
    pub(crate) fn parse(text: &str) -> anyhow::Result<FileConfig> {
        toml::from_str(text).map_err(|e| {
            let message = e.message().trim().replace('\n', " ");
            match e.span() {
                Some(span) => {
                    let before = text.get(..span.start).unwrap_or(text);
                    let line = before.matches('\n').count() + 1;
                    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                    anyhow!("line {line}, column {column}: {message}")
                }
                None => anyhow!("{message}"),
            }
        })
    }
}

/// The gateway's validated configuration.
#[derive(Debug, Clone)]
pub(crate) struct GatewayConfig {
    pub(crate) upstream: http::Uri,
    /// `--upstream-ca`, for an `https://` upstream.
    pub(crate) upstream_ca: Option<PathBuf>,
    /// How an `https://` upstream is reached (`None` for `http://`).
    pub(crate) upstream_tls: Option<rustls::ClientConfig>,
    pub(crate) listen: String,
    /// `--tls-cert` and `--tls-key`: the listener speaks HTTPS.
    pub(crate) tls: Option<ServerTls>,
    pub(crate) admin_listen: String,
    pub(crate) store: StoreUrl,
    /// `--store-ca`: the CA a PostgreSQL or Redis store is checked against.
    pub(crate) store_ca: Option<CaFile>,
    pub(crate) default_policy: Policy,
    pub(crate) routes: Vec<RouteRule>,
    /// What each of `routes` was configured with, for `idem check-config`
    /// (a [`RouteRule`] does not show its settings).
    pub(crate) route_settings: Vec<RouteSettings>,
    pub(crate) max_body: usize,
    pub(crate) key_policy: KeyPolicy,
    /// The request header that carries the key (`Idempotency-Key` by default).
    pub(crate) key_header: HeaderName,
    /// `--tenant-header` then `--scope-header`, those given: the scope.
    pub(crate) scope_headers: Vec<HeaderName>,
    pub(crate) tenant_header: Option<HeaderName>,
    pub(crate) scope_header: Option<HeaderName>,
    pub(crate) require_scope: bool,
    pub(crate) anonymous_reads: bool,
    pub(crate) trust_forwarded: bool,
    pub(crate) max_response: usize,
    pub(crate) replay_cache: usize,
    pub(crate) header_timeout: Duration,
    pub(crate) body_timeout: Duration,
    pub(crate) max_connections: usize,
    pub(crate) threads: usize,
    pub(crate) store_timeout: Duration,
    pub(crate) upstream_timeout: Duration,
    pub(crate) upstream_idle_timeout: Duration,
    pub(crate) shutdown_grace: Duration,
    pub(crate) sweep_interval: Duration,
}

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

/// Why a configuration was refused: every independent problem, one line
/// each, naming the setting (`--ttl`, `[[route]] #2 (/x)`, ...). Exit 2.
#[derive(Debug)]
pub(crate) struct ConfigError {
    problems: Vec<String>,
}

impl ConfigError {
    /// The problems, one line each, in the order the settings are checked.
    pub(crate) fn problems(&self) -> &[String] {
        &self.problems
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.problems.join("; "))
    }
}

impl std::error::Error for ConfigError {}

/// The problems found so far.
#[derive(Debug, Default)]
struct Problems(Vec<String>);

impl Problems {
    /// Records a problem, on one line.
    fn add(&mut self, problem: impl fmt::Display) {
        let text = problem.to_string();
        self.0
            .push(text.lines().map(str::trim).collect::<Vec<_>>().join(" "));
    }

    /// `r`'s value, or `None` with its error (and causes) recorded.
    fn check<T>(&mut self, r: anyhow::Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.add(format!("{e:#}"));
                None
            }
        }
    }

    /// The configuration if nothing was refused.
    fn finish<T>(mut self, built: Option<T>) -> Result<T, ConfigError> {
        match built {
            Some(v) if self.0.is_empty() => Ok(v),
            _ => {
                if self.0.is_empty() {
                    // Every setting left out was refused with a problem;
                    // this only guards against a check that forgot to say.
                    self.add("invalid configuration");
                }
                Err(ConfigError { problems: self.0 })
            }
        }
    }
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

/// The most serving threads: each new connection wakes every thread's
/// event loop (they share the listening socket).
const MAX_THREADS: usize = 256;

/// A count setting: defaulted, within `min..=max`.
fn bounded_count(
    v: Option<usize>,
    name: &str,
    default: usize,
    min: usize,
    max: usize,
) -> anyhow::Result<usize> {
    let n = v.unwrap_or(default);
    if !(min..=max).contains(&n) {
        bail!("--{name} must be between {min} and {max}, not {n}");
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

/// A listen address: `host:port`, the host an IP address or a name that
/// binding resolves. Checked without binding.
fn address(v: Option<String>, name: &str, default: &str) -> anyhow::Result<String> {
    let a = v.unwrap_or_else(|| default.to_owned());
    if a.parse::<SocketAddr>().is_ok() {
        return Ok(a);
    }
    match a.rsplit_once(':') {
        Some((host, port))
            if !host.is_empty() && !host.contains(':') && port.parse::<u16>().is_ok() =>
        {
            Ok(a)
        }
        _ => bail!("--{name} must be host:port, such as 127.0.0.1:8080, not {a:?}"),
    }
}

/// Headers that describe the body: a key there would not name an
/// intent.
const BODY_HEADERS: [HeaderName; 3] = [
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
];

/// `--key-header`: a header name that reaches the upstream unchanged and
/// is nothing else: not hop-by-hop, not Authorization, not one the gateway
/// writes, not a scope header.
pub(crate) fn key_header(
    v: Option<String>,
    scope_headers: &[(&str, HeaderName)],
) -> anyhow::Result<HeaderName> {
    let name = match header_name(v, "key-header")? {
        Some(name) => name,
        None => idem_http::IDEMPOTENCY_KEY,
    };
    if name == header::AUTHORIZATION {
        bail!("--key-header cannot be Authorization: a key must never be the credential");
    }
    if idem_gateway::rewritten_on_the_way(&name) || BODY_HEADERS.contains(&name) {
        bail!(
            "--key-header {name} is a header the gateway strips (hop-by-hop) or rewrites, or one that describes the body; name one of your own, such as X-Request-Key"
        );
    }
    if let Some((flag, _)) = scope_headers.iter().find(|(_, h)| *h == name) {
        bail!("--key-header and --{flag} both name {name}: a key cannot be its own scope");
    }
    Ok(name)
}

/// What a route inherits from the gateway's own settings; `None` where
/// that setting was refused (its problem is already recorded).
struct Inherited {
    ttl: Option<Duration>,
    lease: Option<Duration>,
    wait: Option<Option<Duration>>,
    /// Whether the default policy itself is valid.
    policy_ok: bool,
    upstream_timeout: Option<Duration>,
    store_timeout: Option<Duration>,
}

/// Validates one `[[route]]`; `None` when it has a problem (recorded).
fn route(
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
            p.check(policy(t, l, w, &what))
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
    fn rule(&self) -> Option<RouteRule> {
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

impl GatewayConfig {
    /// Reads the file `--config` names, merges and validates. A file that
    /// cannot be read or parsed is one problem: nothing else is checked.
    pub(crate) fn from_args(args: &ServeArgs) -> Result<GatewayConfig, ConfigError> {
        let file = match &args.config {
            Some(p) => match FileConfig::load(p) {
                Ok(file) => file,
                Err(e) => {
                    let mut problems = Problems::default();
                    problems.add(format!("{e:#}"));
                    return problems.finish(None);
                }
            },
            None => FileConfig::default(),
        };
        GatewayConfig::from_file(args, &file)
    }

    /// Merges flags over a parsed file, and validates: every problem found.
    pub(crate) fn from_file(
        args: &ServeArgs,
        file: &FileConfig,
    ) -> Result<GatewayConfig, ConfigError> {
        let mut problems = Problems::default();
        let built = GatewayConfig::validate(args, file, &mut problems);
        problems.finish(built)
    }

    /// Every check runs before the configuration is assembled, so one
    /// refused setting does not hide the next.
    fn validate(args: &ServeArgs, file: &FileConfig, p: &mut Problems) -> Option<GatewayConfig> {
        let pick =
            |flag: &Option<String>, file: &Option<String>| flag.clone().or_else(|| file.clone());

        let upstream = match pick(&args.upstream, &file.upstream) {
            None => {
                p.add(
                    "--upstream (or IDEM_UPSTREAM, or `upstream` in the config file) is required",
                );
                None
            }
            Some(text) => p.check(upstream_url(&text)),
        };
        let listen = p.check(address(
            pick(&args.listen, &file.listen),
            "listen",
            "127.0.0.1:8080",
        ));
        let admin_listen = p.check(address(
            pick(&args.admin_listen, &file.admin_listen),
            "admin-listen",
            "127.0.0.1:9090",
        ));
        // Port 0 is a new port each time, so two of them never clash.
        if let (Some(a), Some(b)) = (&listen, &admin_listen)
            && a == b
            && !a.ends_with(":0")
        {
            p.add(format!(
                "--listen and --admin-listen are the same address {a}"
            ));
        }
        let store = p.check(
            pick(&args.store, &file.store)
                .as_deref()
                .unwrap_or("sqlite:idem.db")
                .parse::<StoreUrl>()
                .context("--store"),
        );
        let pick_path =
            |flag: &Option<PathBuf>, file: &Option<PathBuf>| flag.clone().or_else(|| file.clone());
        let upstream_ca = pick_path(&args.upstream_ca, &file.upstream_ca);
        let upstream_tls = match &upstream {
            Some(u) if u.scheme_str() == Some("https") => {
                let ca = upstream_ca
                    .as_deref()
                    .and_then(|path| p.check(CaFile::read(path).context("--upstream-ca")));
                match (&upstream_ca, ca) {
                    (Some(_), None) => None,
                    (_, ca) => p
                        .check(crate::tls::upstream_client(ca.as_ref()).context("--upstream"))
                        .map(Some),
                }
            }
            Some(_) if upstream_ca.is_some() => {
                p.add("--upstream-ca is for an https:// upstream; --upstream is http://");
                None
            }
            _ => Some(None),
        };
        let tls = match (
            pick_path(&args.tls_cert, &file.tls_cert),
            pick_path(&args.tls_key, &file.tls_key),
        ) {
            (Some(cert), Some(key)) => p.check(ServerTls::read(&cert, &key)).map(Some),
            (None, None) => Some(None),
            _ => {
                p.add("--tls-cert and --tls-key go together: give both, or neither");
                None
            }
        };
        let store_ca = match pick_path(&args.store_ca, &file.store_ca) {
            None => Some(None),
            Some(path) => {
                let ca = p.check(CaFile::read(&path).context("--store-ca"));
                match &store {
                    Some(url) if !url.speaks_tls() => {
                        p.add(format!(
                            "--store-ca is for a PostgreSQL or Redis store; --store is {url}"
                        ));
                        None
                    }
                    Some(url) => match ca {
                        Some(ca) => p
                            .check(url.check_ca(&ca).context("--store-ca"))
                            .map(|()| Some(ca)),
                        None => None,
                    },
                    None => None,
                }
            }
        };

        let ttl = p
            .check(opt_duration(pick(&args.ttl, &file.ttl).as_ref(), "ttl"))
            .map(|d| d.unwrap_or(Duration::from_secs(86_400)));
        let lease = p
            .check(opt_duration(
                pick(&args.lease, &file.lease).as_ref(),
                "lease",
            ))
            .map(|d| d.unwrap_or(Duration::from_secs(30)));
        let wait = p.check(opt_duration(pick(&args.wait, &file.wait).as_ref(), "wait"));
        let upstream_timeout = p.check(bounded_duration(
            pick(&args.upstream_timeout, &file.upstream_timeout).as_ref(),
            "upstream-timeout",
            Duration::from_secs(25),
            Duration::from_millis(1),
            Duration::from_secs(3600),
        ));
        let upstream_idle_timeout = p.check(bounded_duration(
            pick(&args.upstream_idle_timeout, &file.upstream_idle_timeout).as_ref(),
            "upstream-idle-timeout",
            Duration::from_secs(60),
            Duration::from_millis(100),
            Duration::from_secs(3600),
        ));
        let store_timeout = p.check(bounded_duration(
            pick(&args.store_timeout, &file.store_timeout).as_ref(),
            "store-timeout",
            Duration::from_secs(2),
            Duration::from_millis(10),
            Duration::from_secs(60),
        ));
        // The lease must cover the forwarded request and the completion
        // that stores its answer; a lease that ends first lets a retry be
        // forwarded beside the first execution.
        if let (Some(upstream_timeout), Some(store_timeout), Some(lease)) =
            (upstream_timeout, store_timeout, lease)
            && upstream_timeout + store_timeout >= lease
        {
            p.add(format!(
                "--upstream-timeout ({upstream_timeout:?}) plus --store-timeout ({store_timeout:?}) must be shorter than --lease ({lease:?}): a request still running when its lease ends could be forwarded twice"
            ));
        }
        let default_policy = match (ttl, lease, wait) {
            (Some(ttl), Some(lease), Some(wait)) => {
                p.check(policy(ttl, lease, wait, "--ttl/--lease/--wait"))
            }
            _ => None,
        };
        let max_body = p.check(bounded_size(
            pick(&args.max_body, &file.max_body).as_ref(),
            "max-body",
            1 << 20,
        ));
        let replay_cache = p.check(bounded_size(
            pick(&args.replay_cache, &file.replay_cache).as_ref(),
            "replay-cache",
            idem_http::DEFAULT_REPLAY_CACHE,
        ));
        let max_response = p.check(bounded_size(
            pick(&args.max_response, &file.max_response).as_ref(),
            "max-response",
            8 << 20,
        ));
        let max_connections = p.check(bounded_count(
            args.max_connections.or(file.max_connections),
            "max-connections",
            1024,
            1,
            1_000_000,
        ));
        let threads = p.check(bounded_count(
            args.threads.or(file.threads),
            "threads",
            std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS)),
            1,
            MAX_THREADS,
        ));
        let min_key_len = p.check(bounded_count(
            args.min_key_len.or(file.min_key_len),
            "min-key-len",
            16,
            1,
            255,
        ));

        let tenant_header = p.check(header_name(
            pick(&args.tenant_header, &file.tenant_header),
            "tenant-header",
        ));
        let scope_header = p.check(header_name(
            pick(&args.scope_header, &file.scope_header),
            "scope-header",
        ));
        let named: Vec<(&str, HeaderName)> = [
            ("tenant-header", tenant_header.clone().flatten()),
            ("scope-header", scope_header.clone().flatten()),
        ]
        .into_iter()
        .filter_map(|(flag, h)| Some((flag, h?)))
        .collect();
        if let [(_, a), (_, b)] = &named[..]
            && a == b
        {
            p.add(format!(
                "--tenant-header and --scope-header name the same header {a}"
            ));
        }
        let key_header = p.check(key_header(pick(&args.key_header, &file.key_header), &named));

        let inherited = Inherited {
            ttl,
            lease,
            wait,
            policy_ok: default_policy.is_some(),
            upstream_timeout,
            store_timeout,
        };
        let route_settings: Vec<Option<RouteSettings>> = file
            .routes
            .iter()
            .enumerate()
            .map(|(i, r)| route(r, i, &inherited, p))
            .collect();

        let header_timeout = p.check(bounded_duration(
            pick(&args.header_timeout, &file.header_timeout).as_ref(),
            "header-timeout",
            Duration::from_secs(10),
            Duration::from_millis(100),
            Duration::from_secs(300),
        ));
        let body_timeout = p.check(bounded_duration(
            pick(&args.body_timeout, &file.body_timeout).as_ref(),
            "body-timeout",
            Duration::from_secs(30),
            Duration::from_millis(100),
            Duration::from_secs(600),
        ));
        let shutdown_grace = p.check(bounded_duration(
            pick(&args.shutdown_grace, &file.shutdown_grace).as_ref(),
            "shutdown-grace",
            Duration::from_secs(30),
            Duration::ZERO,
            Duration::from_secs(3600),
        ));
        let sweep_interval = p.check(bounded_duration(
            pick(&args.sweep_interval, &file.sweep_interval).as_ref(),
            "sweep-interval",
            Duration::from_secs(60),
            Duration::from_millis(100),
            Duration::from_secs(86_400),
        ));

        // Assembled only from here: every check above has run.
        let route_settings = route_settings.into_iter().collect::<Option<Vec<_>>>()?;
        let routes = route_settings
            .iter()
            .map(RouteSettings::rule)
            .collect::<Option<Vec<_>>>()?;
        let tenant_header = tenant_header?;
        let scope_header = scope_header?;
        Some(GatewayConfig {
            upstream: upstream?,
            upstream_ca,
            upstream_tls: upstream_tls?,
            listen: listen?,
            tls: tls?,
            admin_listen: admin_listen?,
            store: store?,
            store_ca: store_ca?,
            default_policy: default_policy?,
            routes,
            route_settings,
            max_body: max_body?,
            key_policy: KeyPolicy::default().min_len(min_key_len?),
            key_header: key_header?,
            scope_headers: tenant_header.iter().chain(&scope_header).cloned().collect(),
            tenant_header,
            scope_header,
            require_scope: args.require_scope || file.require_scope.unwrap_or(false),
            anonymous_reads: args.anonymous_reads || file.anonymous_reads.unwrap_or(false),
            trust_forwarded: args.trust_forwarded || file.trust_forwarded.unwrap_or(false),
            max_response: max_response?,
            replay_cache: replay_cache?,
            header_timeout: header_timeout?,
            body_timeout: body_timeout?,
            max_connections: max_connections?,
            threads: threads?,
            store_timeout: store_timeout?,
            upstream_timeout: upstream_timeout?,
            upstream_idle_timeout: upstream_idle_timeout?,
            shutdown_grace: shutdown_grace?,
            sweep_interval: sweep_interval?,
        })
    }
}

/// `--upstream`: an http:// or https:// URL with a host.
/// Never echoes the text whole: an upstream URL may carry a password.
fn upstream_url(text: &str) -> anyhow::Result<http::Uri> {
    let shown = || crate::stores::redact(text);
    let Ok(upstream) = text.parse::<http::Uri>() else {
        bail!("--upstream {} is not a URL", shown());
    };
    if !matches!(upstream.scheme_str(), Some("http" | "https")) || upstream.authority().is_none() {
        bail!(
            "--upstream must be an http:// or https:// URL with a host, not {}",
            shown()
        );
    }
    if upstream
        .authority()
        .is_some_and(|a| a.as_str().contains('@'))
    {
        bail!(
            "--upstream must not carry user information ({}): the gateway never sends it, and it would reach the logs",
            shown()
        );
    }
    Ok(upstream)
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
            idle in duration_text(),
            body in (any::<u32>(), prop::sample::select(vec!["", "B", "KiB", "MiB", "GiB"])),
            path in "[/{}*a-z.%]{0,20}",
            method in "[A-Za-z]{0,8}",
            fields in prop::collection::vec("[/a-z~0-9]{0,6}", 0..3),
        ) {
            let text = format!(
                "upstream = \"http://127.0.0.1:1\"\nttl = {ttl:?}\nlease = {lease:?}\nwait = {wait:?}\n\
                 upstream_timeout = {timeout:?}\nupstream_idle_timeout = {idle:?}\nmax_body = \"{}{}\"\n\
                 [[route]]\nmethod = {method:?}\npath = {path:?}\nlease = {lease:?}\nfingerprint_fields = {fields:?}\n",
                body.0, body.1
            );
            check(&text);
        }
    }
}
