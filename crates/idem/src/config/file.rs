//! The TOML configuration file, as written: its schema and its parser.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use serde::Deserialize;

/// The TOML file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    pub(super) upstream: Option<String>,
    pub(super) upstream_ca: Option<PathBuf>,
    pub(super) listen: Option<String>,
    pub(super) tls_cert: Option<PathBuf>,
    pub(super) tls_key: Option<PathBuf>,
    pub(super) admin_listen: Option<String>,
    pub(super) store: Option<String>,
    pub(super) store_ca: Option<PathBuf>,
    pub(super) ttl: Option<String>,
    pub(super) lease: Option<String>,
    pub(super) wait: Option<String>,
    pub(super) takeover: Option<String>,
    pub(super) max_body: Option<String>,
    pub(super) min_key_len: Option<usize>,
    pub(super) key_header: Option<String>,
    pub(super) tenant_header: Option<String>,
    pub(super) scope_header: Option<String>,
    pub(super) require_scope: Option<bool>,
    pub(super) anonymous_reads: Option<bool>,
    pub(super) trust_forwarded: Option<bool>,
    pub(super) accept_volatile_store: Option<bool>,
    pub(super) max_response: Option<String>,
    pub(super) replay_cache: Option<String>,
    pub(super) header_timeout: Option<String>,
    pub(super) body_timeout: Option<String>,
    pub(super) max_connections: Option<usize>,
    pub(super) threads: Option<usize>,
    pub(super) store_timeout: Option<String>,
    pub(super) store_migration_lock_wait: Option<String>,
    pub(super) upstream_timeout: Option<String>,
    pub(super) upstream_idle_timeout: Option<String>,
    pub(super) shutdown_grace: Option<String>,
    pub(super) sweep_interval: Option<String>,
    pub(super) upstream_protocol: Option<String>,
    pub(super) http2: Option<bool>,
    pub(super) h2_max_streams: Option<usize>,
    pub(super) h2_max_header_list: Option<String>,
    pub(super) h2_stream_window: Option<String>,
    pub(super) h2_connection_window: Option<String>,
    pub(super) h2_keepalive_interval: Option<String>,
    pub(super) h2_keepalive_timeout: Option<String>,
    pub(super) h2_idle_timeout: Option<String>,
    pub(super) h2_max_resets: Option<usize>,
    #[serde(default, rename = "route")]
    pub(super) routes: Vec<FileRoute>,
}

/// One `[[route]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileRoute {
    pub(super) method: Option<String>,
    #[serde(default)]
    pub(super) methods: Vec<String>,
    pub(super) path: String,
    /// `required` (default) or `optional`.
    pub(super) key: Option<String>,
    pub(super) ttl: Option<String>,
    pub(super) lease: Option<String>,
    pub(super) wait: Option<String>,
    /// `hold`, `announce` or `reexecute`; the gateway's by default.
    pub(super) takeover: Option<String>,
    #[serde(default)]
    pub(super) fingerprint_fields: Vec<String>,
    #[serde(default)]
    pub(super) store_headers: Vec<String>,
    pub(super) max_body: Option<String>,
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
