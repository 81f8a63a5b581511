//! Opening the store a [`StoreUrl`] names.

use std::sync::Arc;

use idem_core::{MemoryStore, MigrationLockWaits, Store, StoreError};

use crate::url::StoreUrl;

/// Why a store could not be opened: its message names the store (without
/// its password), its source says why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// An SQLite file that could not be opened, created or migrated.
    #[error("cannot open store {url}")]
    Open {
        /// The store, as shown.
        url: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// A network store that could not be reached, or whose schema could
    /// not be created.
    #[error("cannot reach store {url}")]
    Unreachable {
        /// The store, as shown (password redacted).
        url: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
}

impl StoreUrl {
    /// Opens (or connects to) the store, creating or migrating its schema;
    /// `ca_pem` replaces the system's roots for a TLS connection to it
    /// (network stores only; see [`StoreUrl::check_ca`]).
    pub async fn open(&self, ca_pem: Option<&[u8]>) -> Result<Arc<dyn Store>, OpenError> {
        self.open_migrating(ca_pem, MigrationLockWaits::default())
            .await
    }

    /// As [`StoreUrl::open`], a PostgreSQL or MySQL schema's migration
    /// waiting for a table's lock as `locks` says (ignored by the other
    /// stores).
    async fn open_migrating(
        &self,
        ca_pem: Option<&[u8]>,
        locks: MigrationLockWaits,
    ) -> Result<Arc<dyn Store>, OpenError> {
        #[cfg(not(any(feature = "postgres", feature = "redis")))]
        let _ = ca_pem;
        #[cfg(not(any(feature = "postgres", feature = "mysql")))]
        let _ = locks;
        Ok(match self {
            StoreUrl::Memory => Arc::new(MemoryStore::new()),
            StoreUrl::Sqlite(path) => {
                Arc::new(idem_sqlite::SqliteStore::open(path).map_err(|source| {
                    OpenError::Open {
                        url: self.to_string(),
                        source,
                    }
                })?)
            }
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => {
                self.connected(postgres(url, ca_pem, locks).connect().await)?
            }
            #[cfg(feature = "redis")]
            StoreUrl::Redis(url) => self.connected(
                ca_pem
                    .into_iter()
                    .fold(idem_redis::RedisStore::builder(url), |b, ca| {
                        b.ca_pem(ca.to_vec())
                    })
                    .connect()
                    .await,
            )?,
            #[cfg(feature = "mysql")]
            StoreUrl::Mysql(url) => self.connected(mysql(url, locks).connect().await)?,
        })
    }

    /// Opens the main instance of a gateway with `threads` serving threads:
    /// the one that migrates, and that start-up, the sweeper and the admin
    /// listener use. Beside per-thread PostgreSQL or MySQL instances
    /// ([`StoreUrl::connection_per_thread`]) it keeps the smallest share
    /// (`PoolShare::smallest`: a pool of 4), so that the
    /// gateway holds about one pool in all; otherwise as [`StoreUrl::open`].
    /// A PostgreSQL or MySQL schema's migration waits for a table's lock
    /// as `locks` says.
    pub async fn open_main(
        &self,
        ca_pem: Option<&[u8]>,
        threads: usize,
        locks: MigrationLockWaits,
    ) -> Result<Arc<dyn Store>, OpenError> {
        match self {
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) if self.connection_per_thread(threads) => self.connected(
                postgres(url, ca_pem, locks)
                    .smallest_share()
                    .connect()
                    .await,
            ),
            #[cfg(feature = "mysql")]
            StoreUrl::Mysql(url) if self.connection_per_thread(threads) => {
                self.connected(mysql(url, locks).smallest_share().connect().await)
            }
            _ => {
                let _ = threads;
                self.open_migrating(ca_pem, locks).await
            }
        }
    }

    /// Opens the instance of one of `threads` serving threads that each
    /// open their own ([`StoreUrl::connection_per_thread`]), after the
    /// gateway's main instance was opened with [`StoreUrl::open_main`]. A
    /// PostgreSQL or MySQL instance gets its share of the connections and
    /// batches one instance would have (`PoolShare::thread_share`), so
    /// that the threads together hold about as many connections as one
    /// instance, and does not migrate: it checks that the main instance
    /// left the schema at this code's version. Any other store opens as
    /// [`StoreUrl::open`] opens it.
    pub async fn open_for_thread(
        &self,
        ca_pem: Option<&[u8]>,
        threads: usize,
    ) -> Result<Arc<dyn Store>, OpenError> {
        match self {
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(url) => self.connected(
                postgres(url, ca_pem, MigrationLockWaits::default())
                    .thread_share(threads)
                    .migrate(false)
                    .connect()
                    .await,
            ),
            #[cfg(feature = "mysql")]
            StoreUrl::Mysql(url) => self.connected(
                mysql(url, MigrationLockWaits::default())
                    .thread_share(threads)
                    .migrate(false)
                    .connect()
                    .await,
            ),
            _ => {
                let _ = threads;
                self.open(ca_pem).await
            }
        }
    }

    /// A store that `connect` opened, or why it could not.
    #[cfg(any(feature = "postgres", feature = "redis", feature = "mysql"))]
    fn connected<S: Store + 'static>(
        &self,
        store: Result<S, StoreError>,
    ) -> Result<Arc<dyn Store>, OpenError> {
        let store = store.map_err(|source| self.unreachable(source))?;
        Ok(Arc::new(store))
    }

    #[cfg(any(feature = "postgres", feature = "redis", feature = "mysql"))]
    fn unreachable(&self, source: StoreError) -> OpenError {
        OpenError::Unreachable {
            url: self.to_string(),
            source,
        }
    }
}

/// The MySQL builder for `url`, its migration waiting for a table's lock
/// as `locks` says.
#[cfg(feature = "mysql")]
fn mysql(url: &str, locks: MigrationLockWaits) -> idem_mysql::MysqlStoreBuilder {
    idem_mysql::MysqlStore::builder(url).migration_lock_wait(locks.wait(), locks.tries())
}

/// The PostgreSQL builder for `url`, trusting `ca_pem` if given, its
/// migration waiting for a table's lock as `locks` says.
#[cfg(feature = "postgres")]
fn postgres(
    url: &str,
    ca_pem: Option<&[u8]>,
    locks: MigrationLockWaits,
) -> idem_postgres::PostgresStoreBuilder {
    ca_pem
        .into_iter()
        .fold(idem_postgres::PostgresStore::builder(url), |b, ca| {
            b.ca_pem(ca.to_vec())
        })
        .migration_lock_wait(locks.wait(), locks.tries())
}
