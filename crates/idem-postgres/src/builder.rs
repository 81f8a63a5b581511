//! Options for connecting a store, and connecting it: the pool, the
//! migration, the statements.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{
    Hook, HookError, Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime,
};
use idem_core::batch::PoolShare;
use idem_core::{StoreError, StoreErrorKind};

use crate::error::{pg_error, pool_error};
use crate::row::millis;
use crate::schema::{self, Statements};
use crate::store::{Inner, PostgresStore};
use crate::tls::{self, Verification};
use tokio_postgres_rustls::MakeRustlsConnect;

/// Options for connecting a store.
#[derive(Clone)]
pub struct PostgresStoreBuilder {
    url: String,
    schema: String,
    /// The pool and the batches of each kind in flight.
    share: PoolShare,
    migrate: bool,
    migration_locks: idem_core::MigrationLockWaits,
    wait: Duration,
    statement_timeout: Duration,
    /// Trusted CA certificates (PEM) instead of the system's roots.
    ca_pem: Option<Vec<u8>>,
}

/// Without the URL, which may hold a password.
impl std::fmt::Debug for PostgresStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStoreBuilder")
            .field("schema", &self.schema)
            .field("share", &self.share)
            .field("migrate", &self.migrate)
            .field("migration_locks", &self.migration_locks)
            .field("wait", &self.wait)
            .field("statement_timeout", &self.statement_timeout)
            .field("ca_pem", &self.ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Options for connecting to `url` (`postgres://user@host:port/db`).
    pub fn builder(url: impl Into<String>) -> PostgresStoreBuilder {
        PostgresStoreBuilder::new(url.into())
    }

    /// Connects with the default options.
    ///
    /// # Errors
    /// As [`PostgresStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        PostgresStore::builder(url).connect().await
    }
}

impl PostgresStoreBuilder {
    /// The default options for `url`.
    pub(crate) fn new(url: String) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            url,
            schema: "idem".into(),
            share: PoolShare {
                pool_size: 16,
                batches_in_flight: crate::batch::IN_FLIGHT,
            },
            migrate: true,
            migration_locks: idem_core::MigrationLockWaits::default(),
            wait: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(5),
            ca_pem: None,
        }
    }

    /// The schema holding idem's tables. Default `idem`. Lower-case letters,
    /// digits and `_` only.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The most connections the pool opens. Default 16.
    pub fn pool_size(mut self, n: usize) -> Self {
        self.share.pool_size = n.max(1);
        self
    }

    /// The most batches of each kind (claims, completions, releases) in
    /// flight at once, each on a connection of its own, from 1 to 64.
    /// Default 2: one keeps the server idle while a batch's commit
    /// flushes, more make batches small and commits many
    /// (docs/decisions.md). Stores opened per serving thread take a share
    /// of it ([`thread_share`](Self::thread_share)).
    pub fn batches_in_flight(mut self, n: usize) -> Self {
        self.share.batches_in_flight = n.clamp(1, crate::batch::MOST_IN_FLIGHT);
        self
    }

    /// Makes this one of `threads` instances that share what one instance
    /// would hold (a gateway's serving threads, each with its own): the
    /// pool and the batches in flight as set so far (call it after
    /// [`pool_size`](Self::pool_size) and
    /// [`batches_in_flight`](Self::batches_in_flight)), divided as
    /// [`PoolShare::thread_share`] says. One thread (or 0) changes nothing.
    pub fn thread_share(mut self, threads: usize) -> Self {
        self.share = self.share.thread_share(threads);
        self
    }

    /// The least a share keeps ([`PoolShare::smallest`]): for an instance
    /// beside per-thread ones that serves few calls (a gateway's start-up,
    /// sweeper and admin listener).
    pub fn smallest_share(mut self) -> Self {
        self.share = PoolShare::smallest();
        self
    }

    /// The most threads whose [`thread_share`](Self::thread_share)s
    /// together hold no more than the pool (rounding aside): 4 with the
    /// default pool of 16.
    pub fn most_thread_shares(&self) -> usize {
        self.share.most_thread_shares()
    }

    /// Whether [`connect`](Self::connect) creates or migrates the schema
    /// (the default). Without, it only checks that the schema is at this
    /// code's version, and fails otherwise: for instances opened beside one
    /// that migrated (a gateway's serving threads), which then neither take
    /// the migration lock nor hold a connection waiting for it.
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// How long a migration waits for a table's lock at each try
    /// (`lock_timeout`), and how many tries it makes before
    /// [`connect`](Self::connect) fails as `Unavailable` with nothing of it
    /// applied. Claims queue behind a migration that waits for a lock, so
    /// each try holds them up at most `wait`; between tries they pass. A
    /// migration needs every transaction that holds a record (atomic
    /// mode's executions, an operator's session, a dump) to end within one
    /// `wait`: where some routinely take longer, raise it, or migrate from
    /// one instance at a quiet hour. Default 1 s, 3 tries; `wait` is taken
    /// within 1 ms to 1 h and `tries` within 1 to 100
    /// ([`MigrationLockWaits`](idem_core::MigrationLockWaits)).
    pub fn migration_lock_wait(mut self, wait: Duration, tries: u32) -> Self {
        self.migration_locks = idem_core::MigrationLockWaits::new(wait, tries);
        self
    }

    /// How long an operation waits for a connection (and for one to be
    /// opened) before failing with `Unavailable`. Default 5 s.
    pub fn connect_timeout(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// PostgreSQL's `statement_timeout` on the store's connections: a
    /// statement that runs longer (a stalled server, a row locked by
    /// another session) is cancelled by the server and the call fails with
    /// `Unavailable`. It applies to the statements of atomic-mode
    /// mutations too (a mutation may `SET LOCAL statement_timeout` for
    /// itself). Zero turns it off. Default 5 s.
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// Trust only these CA certificates (PEM, one or more) instead of the
    /// system's roots: for a server whose certificate a private CA signed.
    /// The URL's `sslmode` must be `verify-full`, `verify-ca`, or `require`
    /// (which, with a CA, checks the chain as `verify-ca` does, as libpq
    /// reads it); with `prefer`, `disable` or none the builder refuses.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Checks the URL and the schema name as [`connect`](Self::connect)
    /// reads them, without connecting (for configuration checks).
    ///
    /// # Errors
    /// [`StoreErrorKind::Setup`] for a URL the driver cannot read or a bad
    /// schema name. The message names what is wrong, never the URL.
    pub fn check(&self) -> Result<(), StoreError> {
        self.parsed().map(drop)
    }

    /// The driver's configuration, and the TLS connector that checks as
    /// much of the server's certificate as `sslmode` asks (see [`tls`]).
    fn parsed(&self) -> Result<(tokio_postgres::Config, MakeRustlsConnect), StoreError> {
        if !schema::valid_schema_name(&self.schema) {
            return Err(StoreError::new(
                StoreErrorKind::Setup,
                format!("postgres store: invalid schema name {:?}", self.schema),
            ));
        }
        let (url, verification) = tls::split_ssl_mode(&self.url);
        let config = tokio_postgres::Config::from_str(&url).map_err(|e| {
            StoreError::new(
                StoreErrorKind::Setup,
                "postgres store: invalid connection URL",
            )
            .with_source(e)
        })?;
        // A second `sslmode` (plain or percent-encoded) must not turn a
        // checked connection into a plain one.
        if verification != Verification::EncryptOnly
            && config.get_ssl_mode() != tokio_postgres::config::SslMode::Require
        {
            return Err(StoreError::new(
                StoreErrorKind::Setup,
                "postgres store: the URL gives sslmode more than once",
            ));
        }
        // A CA given is never ignored: with `require` it checks the chain
        // (libpq reads `require` with a root certificate as `verify-ca`);
        // with a mode that may not encrypt at all it is refused.
        let verification = match (verification, &self.ca_pem) {
            (Verification::EncryptOnly, Some(_))
                if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require =>
            {
                Verification::Ca
            }
            (Verification::EncryptOnly, Some(_)) => {
                return Err(StoreError::new(
                    StoreErrorKind::Setup,
                    "postgres store: a CA certificate needs sslmode=require, verify-ca or verify-full in the URL (with prefer or disable the connection may not be encrypted at all)",
                ));
            }
            (v, _) => v,
        };
        // The CA file is read now, so a bad one is a configuration error.
        let connector = tls::connector(verification, self.ca_pem.as_deref())?;
        Ok((config, connector))
    }

    /// Connects, then creates or migrates the schema (with
    /// [`migrate(false)`](Self::migrate), checks its version instead).
    ///
    /// Claims, completions and releases of concurrent calls are sent in
    /// batches by tasks spawned here, on the calling tokio runtime: keep
    /// that runtime running for as long as the store is used (calls from
    /// other runtimes are fine).
    ///
    /// # Errors
    /// [`StoreErrorKind::Setup`] for a bad URL or schema name, a schema
    /// newer than this code, or, without migration, a schema that is
    /// missing or older; [`StoreErrorKind::Unavailable`] when the server
    /// does not answer.
    pub async fn connect(self) -> Result<PostgresStore, StoreError> {
        let (config, tls) = self.parsed()?;
        let manager = Manager::from_config(
            config,
            tls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let statement_ms = millis(self.statement_timeout);
        let pool = Pool::builder(manager)
            .max_size(self.share.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(self.wait))
            .create_timeout(Some(self.wait))
            .recycle_timeout(Some(self.wait))
            .post_create(Hook::async_fn(move |client, _| {
                Box::pin(async move {
                    client
                        .batch_execute(&format!("SET statement_timeout = {statement_ms}"))
                        .await
                        .map_err(HookError::Backend)
                })
            }))
            .build()
            .map_err(|e| {
                StoreError::new(
                    StoreErrorKind::Setup,
                    "postgres store: cannot build the pool",
                )
                .with_source(e)
            })?;
        let mut client = pool.get().await.map_err(pool_error)?;
        if self.migrate {
            // Migrations may wait for another instance's migration lock and
            // build indexes: no statement timeout for them, on a connection
            // that is then closed rather than returned to the pool.
            client
                .batch_execute("SET statement_timeout = 0")
                .await
                .map_err(|e| pg_error("preparing the migration", e))?;
            let migrated = schema::migrate(&mut client, &self.schema, self.migration_locks).await;
            drop(Object::take(client));
            migrated?;
        } else {
            schema::check_version(&client, &self.schema).await?;
        }
        Ok(PostgresStore {
            inner: Arc::new({
                let sql = Arc::new(Statements::new(&self.schema));
                Inner {
                    batches: crate::batch::spawn(&pool, &sql, self.share.batches_in_flight),
                    sql,
                    pool,
                    schema: self.schema,
                }
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::PostgresStore;
    use idem_core::batch::KINDS;

    /// The builder takes its shares as `PoolShare` divides them
    /// (idem-core's tests hold the arithmetic).
    #[test]
    fn a_thread_share_is_the_pool_share_of_what_was_set() {
        let shared = |threads| {
            let b = PostgresStore::builder("postgres://u@h/db").thread_share(threads);
            (b.share.pool_size, b.share.batches_in_flight)
        };
        assert_eq!(shared(1), (16, 2));
        assert_eq!(shared(2), (8, 1));
        let set = PostgresStore::builder("postgres://u@h/db")
            .pool_size(40)
            .batches_in_flight(4)
            .thread_share(4);
        assert_eq!((set.share.pool_size, set.share.batches_in_flight), (10, 1));
        assert_eq!(
            PostgresStore::builder("postgres://u@h/db").most_thread_shares(),
            4
        );
        let least = PostgresStore::builder("postgres://u@h/db").smallest_share();
        assert_eq!(
            (least.share.pool_size, least.share.batches_in_flight),
            (KINDS + 1, 1)
        );
    }

    #[test]
    fn batches_in_flight_stay_between_one_and_the_most() {
        let b = |n| {
            PostgresStore::builder("postgres://u@h/db")
                .batches_in_flight(n)
                .share
                .batches_in_flight
        };
        assert_eq!(b(0), 1);
        assert_eq!(b(3), 3);
        assert_eq!(b(usize::MAX), crate::batch::MOST_IN_FLIGHT);
        // And a share of the most still fits a pool without overflow.
        let big = PostgresStore::builder("postgres://u@h/db")
            .pool_size(usize::MAX)
            .batches_in_flight(usize::MAX)
            .thread_share(2);
        assert_eq!(
            big.share.batches_in_flight,
            crate::batch::MOST_IN_FLIGHT / 2
        );
        assert_eq!(big.share.pool_size, usize::MAX.div_ceil(2));
    }
}
