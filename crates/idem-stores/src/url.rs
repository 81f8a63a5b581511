//! [`StoreUrl`]: a store URL parsed once, where a setting enters, into the
//! store it names.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::redact::redact;

/// Where records are kept, as the operator named it. Parsing checks the URL
/// as its driver will read it, without connecting; [`Display`](fmt::Display)
/// shows it without its password.
///
/// Network stores are variants only when their feature is on, so a match
/// on this enum needs a catch-all arm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
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

/// Why a store URL was refused. No message shows a password.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrlError {
    /// `sqlite:` with nothing after it.
    #[error("sqlite: needs a path, as in sqlite:idem.db")]
    SqliteWithoutPath,
    /// A known scheme whose store this build left out (its feature is off).
    #[error(
        "{0} stores are not in this build of idem: build it with `--features {0}` (on by default)"
    )]
    NotBuiltIn(&'static str),
    /// No store has this scheme (the URL is shown redacted).
    #[error(
        "unknown store {0:?}: use memory:, sqlite:PATH, postgres://..., redis://..., rediss://..., redis-cluster://..., rediss-cluster://... or mysql://..."
    )]
    Unknown(String),
    /// The driver cannot read the URL, or a CA given for it (its message
    /// names the part, never the URL).
    #[error("{0}")]
    Unreadable(String),
}

/// The schemes of each network store, and the feature that builds it.
const POSTGRES: &[&str] = &["postgres://", "postgresql://"];
const REDIS: &[&str] = &[
    "redis://",
    "rediss://",
    "redis-cluster://",
    "rediss-cluster://",
];
const MYSQL: &[&str] = &["mysql://"];

impl FromStr for StoreUrl {
    type Err = StoreUrlError;

    fn from_str(url: &str) -> Result<StoreUrl, StoreUrlError> {
        let has = |schemes: &[&str]| schemes.iter().any(|s| url.starts_with(s));
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
        if has(POSTGRES) {
            #[cfg(feature = "postgres")]
            return idem_postgres::PostgresStore::builder(url)
                .check()
                .map(|()| StoreUrl::Postgres(url.to_owned()))
                .map_err(unreadable);
            #[cfg(not(feature = "postgres"))]
            return Err(StoreUrlError::NotBuiltIn("postgres"));
        }
        if has(REDIS) {
            #[cfg(feature = "redis")]
            return idem_redis::RedisStore::builder(url)
                .check()
                .map(|()| StoreUrl::Redis(url.to_owned()))
                .map_err(unreadable);
            #[cfg(not(feature = "redis"))]
            return Err(StoreUrlError::NotBuiltIn("redis"));
        }
        if has(MYSQL) {
            #[cfg(feature = "mysql")]
            return idem_mysql::MysqlStore::builder(url)
                .check()
                .map(|()| StoreUrl::Mysql(url.to_owned()))
                .map_err(unreadable);
            #[cfg(not(feature = "mysql"))]
            return Err(StoreUrlError::NotBuiltIn("mysql"));
        }
        Err(StoreUrlError::Unknown(redact(url)))
    }
}

#[cfg(any(feature = "postgres", feature = "redis", feature = "mysql"))]
fn unreadable(e: impl fmt::Display) -> StoreUrlError {
    StoreUrlError::Unreadable(e.to_string())
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
    /// Whether a gateway with `threads` serving threads should open one
    /// instance of the store per thread (idem-gateway's `ThreadStores`,
    /// opened with [`StoreUrl::open_for_thread`]), so that the tasks
    /// driving its connections run on the thread whose requests they
    /// carry:
    /// - Redis, whose connection is one multiplexed socket driven by a
    ///   task;
    /// - PostgreSQL and MySQL, whose batches and connections are tasks
    ///   too, up to the threads that can share one pool (4 for the pool of
    ///   16: `PoolShare::most_thread_shares`); more would hold more
    ///   connections than one instance, and keep one instance.
    ///
    /// Not the memory store or SQLite (an instance is the data, or its
    /// writer).
    pub fn connection_per_thread(&self, threads: usize) -> bool {
        #[cfg(not(any(feature = "postgres", feature = "mysql")))]
        let _ = threads;
        match self {
            #[cfg(feature = "redis")]
            StoreUrl::Redis(_) => true,
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => {
                threads <= idem_postgres::PostgresStore::builder(url.as_str()).most_thread_shares()
            }
            #[cfg(feature = "mysql")]
            StoreUrl::Mysql(url) => {
                threads <= idem_mysql::MysqlStore::builder(url.as_str()).most_thread_shares()
            }
            _ => false,
        }
    }

    /// Whether opening the store creates or migrates a schema on a server
    /// (PostgreSQL, MySQL), whose migration may wait for a table's lock
    /// ([`idem_core::MigrationLockWaits`]).
    pub fn migrates_a_server_schema(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(_) => true,
            #[cfg(feature = "mysql")]
            StoreUrl::Mysql(_) => true,
            _ => false,
        }
    }

    /// Whether the store is reached over TLS where the URL asks for it (and
    /// so a CA for it applies). The MySQL store has no TLS yet.
    pub fn speaks_tls(&self) -> bool {
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

    /// Checks a CA (PEM) against the URL as the driver will use it: a CA
    /// the URL would ignore (PostgreSQL without `sslmode=require` or a
    /// `verify-*` mode, plain `redis://`) is refused, not dropped.
    pub fn check_ca(&self, ca_pem: &[u8]) -> Result<(), StoreUrlError> {
        match self {
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => idem_postgres::PostgresStore::builder(url)
                .ca_pem(ca_pem.to_vec())
                .check()
                .map_err(unreadable),
            #[cfg(feature = "redis")]
            StoreUrl::Redis(url) => idem_redis::RedisStore::builder(url)
                .ca_pem(ca_pem.to_vec())
                .check()
                .map_err(unreadable),
            _ => {
                let _ = ca_pem;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(feature = "postgres", feature = "redis", feature = "mysql"))]
    #[test]
    fn displayed_urls_hold_no_password() {
        let url: StoreUrl = "postgres://u:secret@h/db".parse().unwrap();
        assert_eq!(url.to_string(), "postgres://u:***@h/db");
        let unknown = "mongodb://u:secret@h/db".parse::<StoreUrl>().unwrap_err();
        assert!(!unknown.to_string().contains("secret"), "{unknown}");
        let url: StoreUrl = "mysql://u:secret@h/db".parse().unwrap();
        assert_eq!(url.to_string(), "mysql://u:***@h/db");
        let url: StoreUrl = "redis://:secret@h:6380".parse().unwrap();
        assert_eq!(url.to_string(), "redis://:***@h:6380");
    }

    #[cfg(all(feature = "postgres", feature = "redis", feature = "mysql"))]
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

    #[cfg(all(feature = "postgres", feature = "redis", feature = "mysql"))]
    #[test]
    fn only_network_stores_take_a_ca_and_redis_postgres_and_mysql_open_per_thread() {
        // (url, TLS, per thread with 2 threads, per thread with 5)
        let kinds = [
            ("memory:", false, false, false),
            ("sqlite:x.db", false, false, false),
            ("postgres://h/db", true, true, false),
            ("redis://h", true, true, true),
            ("mysql://h/db", false, true, false),
        ];
        for (url, tls, two, five) in kinds {
            let url: StoreUrl = url.parse().unwrap();
            assert_eq!(url.speaks_tls(), tls, "{url}");
            assert_eq!(url.connection_per_thread(2), two, "{url}");
            assert_eq!(url.connection_per_thread(5), five, "{url}");
        }
        for url in ["postgres://h/db", "mysql://h/db"] {
            let url: StoreUrl = url.parse().unwrap();
            assert!(url.connection_per_thread(4), "{url}");
        }
    }
}
