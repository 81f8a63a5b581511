//! `idem check-config`: the gateway's settings (flags, environment and the
//! `--config` file together) validated as `idem serve` validates them, but
//! without binding a port, opening the store or contacting the upstream.
//!
//! Valid: the effective settings on stdout, in the config file's own
//! format, to read side by side with the file. Passwords in the store URL
//! are shown as `***`, so the output is not a config file to run with
//! when the store has one. Invalid: the [`ConfigError`]
//! reaches `main`, which prints one line per problem and exits 2.
//!
//! [`ConfigError`]: crate::config::ConfigError

use std::time::Duration;

use anyhow::Context;
use idem_core::{Concurrency, Policy};
use idem_http::KeyRequirement;
use serde::Serialize;

use crate::cli::ServeArgs;
use crate::config::{GatewayConfig, RouteSettings};

/// Validates and prints the effective settings.
pub(crate) fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let cfg = GatewayConfig::from_args(args)?;
    print!("{}", render(&cfg)?);
    Ok(())
}

/// The effective settings as a config file.
fn render(cfg: &GatewayConfig) -> anyhow::Result<String> {
    let text = toml::to_string(&Effective::from(cfg)).context("cannot show the settings")?;
    Ok(format!(
        "# idem check-config: valid. The effective settings (passwords shown as ***):\n{text}"
    ))
}

/// Every setting, named as in the config file, defaults filled in.
#[derive(Debug, Serialize)]
struct Effective {
    upstream: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_ca: Option<String>,
    listen: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_key: Option<String>,
    admin_listen: String,
    store: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    store_ca: Option<String>,
    key_header: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant_header: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scope_header: Option<String>,
    require_scope: bool,
    anonymous_reads: bool,
    trust_forwarded: bool,
    accept_volatile_store: bool,
    min_key_len: usize,
    ttl: String,
    lease: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    wait: Option<String>,
    max_body: String,
    max_response: String,
    replay_cache: String,
    max_connections: usize,
    threads: usize,
    header_timeout: String,
    body_timeout: String,
    store_timeout: String,
    /// Only for the stores that migrate a schema on a server.
    #[serde(skip_serializing_if = "Option::is_none")]
    store_migration_lock_wait: Option<String>,
    upstream_timeout: String,
    upstream_idle_timeout: String,
    shutdown_grace: String,
    sweep_interval: String,
    upstream_protocol: &'static str,
    http2: bool,
    h2_max_streams: u32,
    h2_max_header_list: String,
    h2_stream_window: String,
    h2_connection_window: String,
    h2_keepalive_interval: String,
    h2_keepalive_timeout: String,
    h2_idle_timeout: String,
    h2_max_resets: usize,
    #[serde(rename = "route", skip_serializing_if = "Vec::is_empty")]
    routes: Vec<EffectiveRoute>,
}

/// One `[[route]]` with what it inherits filled in.
#[derive(Debug, Serialize)]
struct EffectiveRoute {
    methods: Vec<String>,
    path: String,
    key: &'static str,
    ttl: String,
    lease: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    wait: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    fingerprint_fields: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    store_headers: Vec<String>,
    max_body: String,
}

impl From<&GatewayConfig> for Effective {
    fn from(cfg: &GatewayConfig) -> Effective {
        let policy = &cfg.default_policy;
        Effective {
            upstream: idem_stores::redact(&cfg.upstream.to_string()),
            upstream_ca: cfg.upstream_ca.as_deref().map(shown),
            listen: cfg.listen.clone(),
            tls_cert: cfg.tls.as_ref().map(|t| shown(&t.cert_path)),
            tls_key: cfg.tls.as_ref().map(|t| shown(&t.key_path)),
            admin_listen: cfg.admin_listen.clone(),
            // Display redacts the password.
            store: cfg.store.to_string(),
            store_ca: cfg.store_ca.as_ref().map(|c| shown(&c.path)),
            key_header: cfg.key_header.to_string(),
            tenant_header: cfg.tenant_header.as_ref().map(ToString::to_string),
            scope_header: cfg.scope_header.as_ref().map(ToString::to_string),
            require_scope: cfg.require_scope,
            anonymous_reads: cfg.anonymous_reads,
            trust_forwarded: cfg.trust_forwarded,
            accept_volatile_store: cfg.accept_volatile_store,
            min_key_len: cfg.key_policy.minimum_len(),
            ttl: duration(policy.ttl()),
            lease: duration(policy.lease()),
            wait: wait(policy),
            max_body: size(cfg.max_body),
            max_response: size(cfg.max_response),
            replay_cache: size(cfg.replay_cache),
            max_connections: cfg.max_connections,
            threads: cfg.threads,
            header_timeout: duration(cfg.header_timeout),
            body_timeout: duration(cfg.body_timeout),
            store_timeout: duration(cfg.store_timeout),
            store_migration_lock_wait: cfg
                .store
                .migrates_a_server_schema()
                .then(|| duration(cfg.store_migration_locks.wait())),
            upstream_timeout: duration(cfg.upstream_timeout),
            upstream_idle_timeout: duration(cfg.upstream_idle_timeout),
            shutdown_grace: duration(cfg.shutdown_grace),
            sweep_interval: duration(cfg.sweep_interval),
            upstream_protocol: match cfg.upstream_protocol {
                idem_gateway::UpstreamProtocol::Http1 => "http1",
                idem_gateway::UpstreamProtocol::H2 => "h2",
                idem_gateway::UpstreamProtocol::H2c => "h2c",
                idem_gateway::UpstreamProtocol::Auto => "auto",
            },
            http2: cfg.http2.enabled,
            h2_max_streams: cfg.http2.max_concurrent_streams,
            h2_max_header_list: size(cfg.http2.max_header_list_size as usize),
            h2_stream_window: size(cfg.http2.stream_window as usize),
            h2_connection_window: size(cfg.http2.connection_window as usize),
            h2_keepalive_interval: duration(cfg.http2.keep_alive_interval.unwrap_or_default()),
            h2_keepalive_timeout: duration(cfg.http2.keep_alive_timeout),
            h2_idle_timeout: duration(cfg.http2.idle_timeout),
            h2_max_resets: cfg.http2.max_pending_resets,
            routes: cfg
                .route_settings
                .iter()
                .map(|r| EffectiveRoute::new(r, cfg.max_body))
                .collect(),
        }
    }
}

/// A file's path as the settings named it.
fn shown(path: &std::path::Path) -> String {
    path.display().to_string()
}

impl EffectiveRoute {
    fn new(r: &RouteSettings, gateway_max_body: usize) -> EffectiveRoute {
        EffectiveRoute {
            methods: r.methods.iter().map(ToString::to_string).collect(),
            path: r.path.clone(),
            key: match r.key {
                KeyRequirement::Optional => "optional",
                _ => "required",
            },
            ttl: duration(r.policy.ttl()),
            lease: duration(r.policy.lease()),
            wait: wait(&r.policy),
            fingerprint_fields: r.fingerprint_fields.clone(),
            store_headers: r.store_headers.iter().map(ToString::to_string).collect(),
            max_body: size(r.max_body.unwrap_or(gateway_max_body)),
        }
    }
}

fn wait(policy: &Policy) -> Option<String> {
    match policy.concurrency() {
        Concurrency::Wait { limit } => Some(duration(limit)),
        _ => None,
    }
}

/// A duration in the largest unit that states it exactly, as the
/// settings are written: `24h`, `30s`, `1500ms`.
fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    for (unit, per) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms.is_multiple_of(per) {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

/// A size in the largest unit that states it exactly: `1MiB`, `512KiB`,
/// `1000` (bytes).
fn size(bytes: usize) -> String {
    match bytes {
        0 => "0".into(),
        b if b.is_multiple_of(1 << 20) => format!("{}MiB", b >> 20),
        b if b.is_multiple_of(1 << 10) => format!("{}KiB", b >> 10),
        b => b.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FileConfig;

    #[test]
    fn durations_and_sizes_read_back_as_written() {
        for (d, text) in [
            (Duration::from_secs(86_400), "1d"),
            (Duration::from_secs(3 * 3600), "3h"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(duration(d), text);
            assert_eq!(crate::units::duration(text).unwrap(), d);
        }
        for (n, text) in [
            (1 << 20, "1MiB"),
            (512 << 10, "512KiB"),
            (1000, "1000"),
            (0, "0"),
        ] {
            assert_eq!(size(n), text);
            assert_eq!(crate::units::size(text).unwrap(), n);
        }
    }

    /// What check-config prints is a config file that gives the same
    /// settings again.
    #[test]
    fn the_printed_settings_are_a_config_file_with_the_same_settings() {
        let text = r#"
            upstream = "http://127.0.0.1:3000"
            store = "memory:"
            key_header = "X-Request-Key"
            scope_header = "x-user"
            ttl = "2h"
            wait = "5s"
            max_body = "512KiB"
            [[route]]
            methods = ["post", "PUT"]
            path = "/accounts/{id}/transfers"
            key = "optional"
            lease = "1m"
            fingerprint_fields = ["/amount"]
            store_headers = ["x-ledger-id"]
            max_body = "2MiB"
        "#;
        let args = ServeArgs::default();
        let first = GatewayConfig::from_file(&args, &FileConfig::parse(text).unwrap()).unwrap();
        let shown = render(&first).unwrap();
        assert!(shown.contains("key_header = \"x-request-key\""), "{shown}");
        assert!(shown.contains("methods = [\"POST\", \"PUT\"]"), "{shown}");
        assert!(shown.contains("wait = \"5s\""), "{shown}");
        let again = GatewayConfig::from_file(&args, &FileConfig::parse(&shown).unwrap()).unwrap();
        assert_eq!(render(&again).unwrap(), shown);
    }
}
