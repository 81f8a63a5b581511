//! Store URLs: parsed once, where a setting enters (`--store`, `IDEM_STORE`,
//! the config file), into a [`StoreUrl`] that every command opens the same
//! way. `memory:`, `sqlite:PATH` (or `sqlite://PATH`), `postgres://...`,
//! `redis://...` (`rediss://`), `redis-cluster://...` (`rediss-cluster://`)
//! and `mysql://...`; PostgreSQL, Redis and MySQL only when
//! the binary was built with their features (all on by default).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::Context;
use idem_core::{MemoryStore, Store};

use crate::tls::CaFile;

/// Where records are kept, as the operator named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoreUrl {
    /// In this process only; gone on exit.
    Memory,
    /// An SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL connection URL (may hold a password).
    #[cfg(feature = "postgres")]
    Postgres(String),
    /// A Redis or Redis Cluster URL (may hold a password).
    #[cfg(feature = "redis")]
    Redis(String),
    /// A MySQL or MariaDB URL (may hold a password); idem's tables live in
    /// the database `idem` on that server.
    #[cfg(feature = "mysql")]
    Mysql(String),
}

/// Why a store URL was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum StoreUrlError {
    #[error("sqlite: needs a path, as in sqlite:idem.db")]
    SqliteWithoutPath,
    #[cfg(not(all(feature = "postgres", feature = "redis", feature = "mysql")))]
    #[error(
        "{0} stores are not in this build of idem: build it with `--features {0}` (on by default)"
    )]
    NotBuiltIn(&'static str),
    #[error(
        "unknown store {0:?}: use memory:, sqlite:PATH, postgres://..., redis://..., rediss://..., redis-cluster://..., rediss-cluster://... or mysql://..."
    )]
    Unknown(String),
    /// The driver cannot read the URL (its message names the part, never
    /// the URL).
    #[cfg(any(feature = "postgres", feature = "redis", feature = "mysql"))]
    #[error("{0}")]
    Unreadable(String),
}

impl FromStr for StoreUrl {
    type Err = StoreUrlError;

    fn from_str(url: &str) -> Result<StoreUrl, StoreUrlError> {
        if url == "memory:" || url == "memory" {
            return Ok(StoreUrl::Memory);
        }
        if let Some(path) = url.strip_prefix("sqlite:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(StoreUrlError::SqliteWithoutPath);
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            #[cfg(feature = "postgres")]
            return idem_postgres::PostgresStore::builder(url)
                .check()
                .map(|()| StoreUrl::Postgres(url.to_owned()))
                .map_err(|e| StoreUrlError::Unreadable(e.to_string()));
            #[cfg(not(feature = "postgres"))]
            return Err(StoreUrlError::NotBuiltIn("postgres"));
        }
        if [
            "redis://",
            "rediss://",
            "redis-cluster://",
            "rediss-cluster://",
        ]
        .iter()
        .any(|scheme| url.starts_with(scheme))
        {
            #[cfg(feature = "redis")]
            return idem_redis::RedisStore::builder(url)
                .check()
                .map(|()| StoreUrl::Redis(url.to_owned()))
                .map_err(|e| StoreUrlError::Unreadable(e.to_string()));
            #[cfg(not(feature = "redis"))]
            return Err(StoreUrlError::NotBuiltIn("redis"));
        }
        if url.starts_with("mysql://") {
            #[cfg(feature = "mysql")]
            return idem_mysql::MysqlStore::builder(url)
                .check()
                .map(|()| StoreUrl::Mysql(url.to_owned()))
                .map_err(|e| StoreUrlError::Unreadable(e.to_string()));
            #[cfg(not(feature = "mysql"))]
            return Err(StoreUrlError::NotBuiltIn("mysql"));
        }
        Err(StoreUrlError::Unknown(redact(url)))
    }
}

/// Shows the URL without its password.
impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory:"),
            StoreUrl::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => f.write_str(&redact(url)),
            #[cfg(feature = "redis")]
            StoreUrl::Redis(url) => f.write_str(&redact(url)),
            #[cfg(feature = "mysql")]
            StoreUrl::Mysql(url) => f.write_str(&redact(url)),
        }
    }
}

impl StoreUrl {
    /// Whether the gateway opens one instance of the store per serving
    /// thread (idem-gateway's `ThreadStores`): Redis, whose connection is one
    /// multiplexed socket driven by a task. Not PostgreSQL or MySQL (a pool
    /// each would multiply the server's connections by the threads), nor
    /// the memory store or SQLite (an instance is the data, or its writer).
    pub(crate) fn connection_per_thread(&self) -> bool {
        match self {
            #[cfg(feature = "redis")]
            StoreUrl::Redis(_) => true,
            _ => false,
        }
    }

    /// Whether the store is reached over TLS where the URL asks for it
    /// (and so `--store-ca` applies). The MySQL store has no TLS yet.
    pub(crate) fn speaks_tls(&self) -> bool {
        match self {
            StoreUrl::Memory | StoreUrl::Sqlite(_) => false,
            #[cfg(feature = "mysql")]
            StoreUrl::Mysql(_) => false,
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(_) => true,
            #[cfg(feature = "redis")]
            StoreUrl::Redis(_) => true,
        }
    }

    /// Checks `ca` against the URL as the driver will use it: a CA the URL
    /// would ignore (PostgreSQL without `sslmode=require` or a `verify-*`
    /// mode, plain `redis://`) is refused, not dropped.
    pub(crate) fn check_ca(&self, ca: &CaFile) -> Result<(), StoreUrlError> {
        match self {
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => idem_postgres::PostgresStore::builder(url)
                .ca_pem(ca.pem.clone())
                .check()
                .map_err(|e| StoreUrlError::Unreadable(e.to_string())),
            #[cfg(feature = "redis")]
            StoreUrl::Redis(url) => idem_redis::RedisStore::builder(url)
                .ca_pem(ca.pem.clone())
                .check()
                .map_err(|e| StoreUrlError::Unreadable(e.to_string())),
            _ => {
                let _ = ca;
                Ok(())
            }
        }
    }

    /// Opens (or connects to) the store, creating or migrating its schema;
    /// `ca` replaces the system's roots for a TLS connection to it.
    pub(crate) async fn open(&self, ca: Option<&CaFile>) -> anyhow::Result<Arc<dyn Store>> {
        // Only network stores use it (and `--store-ca` is refused for others).
        #[cfg(not(any(feature = "postgres", feature = "redis")))]
        let _ = ca;
        Ok(match self {
            StoreUrl::Memory => Arc::new(MemoryStore::new()),
            StoreUrl::Sqlite(path) => Arc::new(
                idem_sqlite::SqliteStore::open(path)
                    .with_context(|| format!("cannot open store {self}"))?,
            ),
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => Arc::new(
                ca.into_iter()
                    .fold(idem_postgres::PostgresStore::builder(url), |b, ca| {
                        b.ca_pem(ca.pem.clone())
                    })
                    .connect()
                    .await
                    .with_context(|| format!("cannot reach store {self}"))?,
            ),
            #[cfg(feature = "redis")]
            StoreUrl::Redis(url) => Arc::new(
                ca.into_iter()
                    .fold(idem_redis::RedisStore::builder(url), |b, ca| {
                        b.ca_pem(ca.pem.clone())
                    })
                    .connect()
                    .await
                    .with_context(|| format!("cannot reach store {self}"))?,
            ),
            #[cfg(feature = "mysql")]
            StoreUrl::Mysql(url) => Arc::new(
                idem_mysql::MysqlStore::builder(url)
                    .connect()
                    .await
                    .with_context(|| format!("cannot reach store {self}"))?,
            ),
        })
    }
}

/// A URL without its password (see [`redact`]).
pub(crate) fn redact_uri(uri: &http::Uri) -> String {
    redact(&uri.to_string())
}

/// A URL without its password, for messages: the password of the user
/// info (up to the last `@`, so a raw `@` in a password is covered too) and
/// the value of any query parameter whose name mentions a password.
pub(crate) fn redact(url: &str) -> String {
    let Some(s) = url.find("://") else {
        // Not a URL (a libpq `key=value` string, a typo): it may hold a
        // password anywhere, so none of it is shown.
        return "(not shown: not a URL)".to_owned();
    };
    let (scheme, after) = url.split_at(s + 3);
    let mut out = scheme.to_owned();
    // Drivers differ on where the user info ends; the last '@' covers a
    // raw '@', '?' or '/' in a password whichever they pick.
    let rest = match after.rfind('@') {
        Some(at) => {
            match after[..at].split_once(':') {
                Some((user, _)) => {
                    out.push_str(user);
                    out.push_str(":***@");
                }
                // A lone user info may be a token: not shown either.
                None => out.push_str("***@"),
            }
            &after[at + 1..]
        }
        None => after,
    };
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    out.push_str(path);
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if names_a_password(k) => format!("{k}=***"),
                _ => p.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

/// Whether a query parameter's name, percent-decoded as drivers decode
/// it, is about a password.
fn names_a_password(name: &str) -> bool {
    percent_encoding::percent_decode_str(name)
        .decode_utf8_lossy()
        .to_ascii_lowercase()
        .contains("pass")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        assert_eq!(redact("postgres://u:p@ss@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u:s3?cret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u:s3/cret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("redis://s3cret@h:6379"), "redis://***@h:6379");
        for hidden in [
            "postgres://h/db?%70assword=s3cret",
            "postgres://h/db?PASSWORD=s3cret&x=1",
            "host=h user=u password=s3cret",
            "s3cret",
        ] {
            assert!(
                !redact(hidden).contains("s3cret"),
                "{hidden}: {}",
                redact(hidden)
            );
        }
        assert_eq!(
            redact("postgres://h/db?user=u&password=secret&sslmode=require"),
            "postgres://h/db?user=u&password=***&sslmode=require"
        );
        let url: StoreUrl = "postgres://u:secret@h/db".parse().unwrap();
        assert_eq!(url.to_string(), "postgres://u:***@h/db");
        let unknown = "mongodb://u:secret@h/db".parse::<StoreUrl>().unwrap_err();
        assert!(!unknown.to_string().contains("secret"), "{unknown}");
        #[cfg(feature = "mysql")]
        {
            let url: StoreUrl = "mysql://u:secret@h/db".parse().unwrap();
            assert_eq!(url.to_string(), "mysql://u:***@h/db");
        }
    }

    #[cfg(all(feature = "postgres", feature = "redis"))]
    #[test]
    fn urls_the_drivers_cannot_read_are_refused_without_their_password() {
        for url in [
            "postgres://u:s3cret@h:54x2/db",
            "postgres://u:s3cret@h/db?no_such_option=1",
            "redis://:s3cret@h:notaport",
        ] {
            let e = url.parse::<StoreUrl>().unwrap_err();
            assert!(matches!(e, StoreUrlError::Unreadable(_)), "{url}: {e:?}");
            assert!(!e.to_string().contains("s3cret"), "{url}: {e}");
        }
        assert!(
            "postgres://u:s3cret@h:5432/db?sslmode=disable"
                .parse::<StoreUrl>()
                .is_ok()
        );
        assert!("redis://:s3cret@h:6379/0".parse::<StoreUrl>().is_ok());
    }

    #[test]
    fn sqlite_urls_read_alike_everywhere() {
        for url in ["sqlite:dir/idem.db", "sqlite://dir/idem.db"] {
            assert_eq!(
                url.parse::<StoreUrl>(),
                Ok(StoreUrl::Sqlite(PathBuf::from("dir/idem.db")))
            );
        }
        assert_eq!(
            "sqlite:".parse::<StoreUrl>(),
            Err(StoreUrlError::SqliteWithoutPath)
        );
        assert_eq!("memory:".parse::<StoreUrl>(), Ok(StoreUrl::Memory));
        assert!(matches!(
            "file:idem.db".parse::<StoreUrl>(),
            Err(StoreUrlError::Unknown(_))
        ));
    }
}
