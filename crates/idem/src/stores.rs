//! Opening a store from its URL: `memory:`, `sqlite:PATH`,
//! `postgres://...`, `redis://...`.

use std::sync::Arc;

use anyhow::{Context, bail};
use idem_core::{MemoryStore, Store};

pub(crate) async fn open(url: &str) -> anyhow::Result<Arc<dyn Store>> {
    if url == "memory:" || url == "memory" {
        return Ok(Arc::new(MemoryStore::new()));
    }
    if let Some(path) = url.strip_prefix("sqlite:") {
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() {
            bail!("sqlite: needs a path, as in sqlite:idem.db");
        }
        let store = idem_sqlite::SqliteStore::open(path)
            .with_context(|| format!("cannot open store {url}"))?;
        return Ok(Arc::new(store));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = idem_postgres::PostgresStore::connect(url)
            .await
            .with_context(|| format!("cannot reach store {}", redact(url)))?;
        return Ok(Arc::new(store));
    }
    if url.starts_with("redis://") {
        let store = idem_redis::RedisStore::connect(url)
            .await
            .with_context(|| format!("cannot reach store {}", redact(url)))?;
        return Ok(Arc::new(store));
    }
    bail!("unknown store {url:?}: use memory:, sqlite:PATH, postgres://... or redis://...")
}

/// A URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            super::redact("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(super::redact("redis://h:6379"), "redis://h:6379");
    }
}
