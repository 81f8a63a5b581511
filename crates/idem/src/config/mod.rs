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

mod file;
mod problems;
mod routes;
mod sections;
#[cfg(test)]
mod tests;
mod values;

use idem_gateway::{Http2Limits, UpstreamProtocol};
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::HeaderName;
use idem_core::{KeyPolicy, Policy};
use idem_http::RouteRule;

pub(crate) use file::FileConfig;
pub(crate) use problems::ConfigError;
use problems::Problems;
pub(crate) use routes::RouteSettings;
use sections::Sources;

use crate::cli::ServeArgs;
use crate::tls::{CaFile, ServerTls};
use idem_stores::StoreUrl;

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
    /// Start even when the store's durability settings lose records.
    pub(crate) accept_volatile_store: bool,
    pub(crate) max_response: usize,
    pub(crate) replay_cache: usize,
    pub(crate) header_timeout: Duration,
    pub(crate) body_timeout: Duration,
    pub(crate) max_connections: usize,
    pub(crate) threads: usize,
    pub(crate) store_timeout: Duration,
    /// How a PostgreSQL or MySQL schema migration waits for a table's lock.
    pub(crate) store_migration_locks: idem_core::MigrationLockWaits,
    pub(crate) upstream_timeout: Duration,
    pub(crate) upstream_idle_timeout: Duration,
    pub(crate) shutdown_grace: Duration,
    pub(crate) sweep_interval: Duration,
    pub(crate) upstream_protocol: UpstreamProtocol,
    pub(crate) http2: Http2Limits,
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

    /// Every section is checked before the configuration is assembled,
    /// so one refused setting does not hide the next.
    fn validate(args: &ServeArgs, file: &FileConfig, p: &mut Problems) -> Option<GatewayConfig> {
        let sources = Sources { args, file };
        let upstream = sections::upstream(&sources, p);
        let listeners = sections::listeners(&sources, p);
        let store = sections::store(&sources, p);
        let policy = sections::default_policy(&sources, upstream.timeout, store.timeout, p);
        let limits = sections::limits(&sources, p);
        let keys = sections::keys(&sources, p);
        let http2 = sections::http2(&sources, p);
        let inherited = routes::Inherited {
            ttl: policy.ttl,
            lease: policy.lease,
            wait: policy.wait,
            takeover: policy.takeover,
            policy_ok: policy.policy.is_some(),
            upstream_timeout: upstream.timeout,
            store_timeout: store.timeout,
        };
        let route_settings: Vec<Option<RouteSettings>> = file
            .routes
            .iter()
            .enumerate()
            .map(|(i, r)| routes::route(r, i, &inherited, p))
            .collect();

        // Assembled only from here: every check above has run.
        let route_settings = route_settings.into_iter().collect::<Option<Vec<_>>>()?;
        let routes = route_settings
            .iter()
            .map(RouteSettings::rule)
            .collect::<Option<Vec<_>>>()?;
        let tenant_header = keys.tenant_header?;
        let scope_header = keys.scope_header?;
        Some(GatewayConfig {
            upstream: upstream.url?,
            upstream_ca: upstream.ca,
            upstream_tls: upstream.tls?,
            listen: listeners.listen?,
            tls: listeners.tls?,
            admin_listen: listeners.admin_listen?,
            store: store.url?,
            store_ca: store.ca?,
            default_policy: policy.policy?,
            routes,
            route_settings,
            max_body: limits.max_body?,
            key_policy: keys.policy?,
            key_header: keys.key_header?,
            scope_headers: tenant_header.iter().chain(&scope_header).cloned().collect(),
            tenant_header,
            scope_header,
            require_scope: args.require_scope || file.require_scope.unwrap_or(false),
            anonymous_reads: args.anonymous_reads || file.anonymous_reads.unwrap_or(false),
            trust_forwarded: args.trust_forwarded || file.trust_forwarded.unwrap_or(false),
            accept_volatile_store: args.accept_volatile_store
                || file.accept_volatile_store.unwrap_or(false),
            max_response: limits.max_response?,
            replay_cache: limits.replay_cache?,
            header_timeout: limits.header_timeout?,
            body_timeout: limits.body_timeout?,
            max_connections: limits.max_connections?,
            threads: limits.threads?,
            store_timeout: store.timeout?,
            store_migration_locks: store.migration_locks?,
            upstream_timeout: upstream.timeout?,
            upstream_idle_timeout: upstream.idle_timeout?,
            shutdown_grace: limits.shutdown_grace?,
            sweep_interval: limits.sweep_interval?,
            upstream_protocol: upstream.protocol?,
            http2: http2?,
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
