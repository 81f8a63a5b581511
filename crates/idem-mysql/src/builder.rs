//! Options for connecting a store, and connecting it: the pool, the
//! migration, the statements.

use std::sync::Arc;
use std::time::Duration;

use idem_core::batch::PoolShare;
use idem_core::{MigrationLockWaits, StoreError, StoreErrorKind};
use mysql_async::{Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts};

use crate::error::my_error;
use crate::schema::{self, Statements};
use crate::single::Inner;
use crate::store::MysqlStore;

/// Options for connecting a store.
#[derive(Clone)]
pub struct MysqlStoreBuilder {
    url: String,
    database: String,
    /// The pool and the batches of each kind in flight.
    share: PoolShare,
    migrate: bool,
    wait: Duration,
    lock_wait: Duration,
    migration_locks: MigrationLockWaits,
}

/// Without the URL, which may hold a password.
impl std::fmt::Debug for MysqlStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlStoreBuilder")
            .field("database", &self.database)
            .field("share", &self.share)
            .field("migrate", &self.migrate)
            .field("wait", &self.wait)
            .field("lock_wait", &self.lock_wait)
            .field("migration_locks", &self.migration_locks)
            .finish_non_exhaustive()
    }
}

impl MysqlStore {
    /// Options for connecting to `url` (`mysql://user@host:port/db`).
    pub fn builder(url: impl Into<String>) -> MysqlStoreBuilder {
        MysqlStoreBuilder::new(url.into())
    }

    /// Connects with the default options.
    ///
    /// # Errors
    /// As [`MysqlStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<MysqlStore, StoreError> {
        MysqlStore::builder(url).connect().await
    }
}

impl MysqlStoreBuilder {
    /// The default options for `url`.
    pub(crate) fn new(url: String) -> MysqlStoreBuilder {
        MysqlStoreBuilder {
            url,
            database: "idem".into(),
            share: PoolShare {
                pool_size: 16,
                batches_in_flight: crate::batch::IN_FLIGHT,
            },
            migrate: true,
            wait: Duration::from_secs(5),
            lock_wait: Duration::from_secs(5),
            migration_locks: MigrationLockWaits::default(),
        }
    }

    /// The database holding idem's tables, created if missing. Default
    /// `idem`. Lower-case letters, digits and `_` only.
    pub fn database(mut self, database: impl Into<String>) -> Self {
        self.database = database.into();
        self
    }

    /// Connections in the pool. Default 16.
    pub fn pool_size(mut self, n: usize) -> Self {
        self.share.pool_size = n.max(1);
        self
    }

    /// How long a call waits for a pooled connection before it fails with
    /// `Unavailable`. Default 5 s.
    pub fn connect_timeout(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// How long a statement waits for a row another session locked
    /// (`innodb_lock_wait_timeout`, whole seconds, at least 1) before it
    /// fails with `Unavailable`. Default 5 s.
    pub fn lock_wait_timeout(mut self, wait: Duration) -> Self {
        self.lock_wait = wait;
        self
    }

    /// How long a migration's statement waits for a table's lock at each
    /// try (`lock_wait_timeout`: whole seconds, rounded up, at least 1),
    /// and how many tries it makes before [`connect`](Self::connect)
    /// fails as `Unavailable`. Claims queue behind a statement that waits
    /// for a table's metadata lock, so each try holds them up at most
    /// `wait`; between tries they pass. A migration that adds a column
    /// needs every transaction that holds a record (atomic mode's
    /// executions, an operator's session) to end within one `wait`:
    /// where some routinely take longer, raise it, or migrate from one
    /// instance at a quiet hour. Default 1 s, 3 tries; `wait` is taken
    /// within 1 ms to 1 h (then rounded up) and `tries` within 1 to 100
    /// ([`MigrationLockWaits`]).
    pub fn migration_lock_wait(mut self, wait: Duration, tries: u32) -> Self {
        self.migration_locks = MigrationLockWaits::new(wait, tries);
        self
    }

    /// Checks the URL and the database name as [`connect`](Self::connect)
    /// reads them, without connecting. The message names what is wrong,
    /// never the URL.
    ///
    /// # Errors
    /// [`StoreErrorKind::Setup`] for a URL or database name that cannot be used.
    pub fn check(&self) -> Result<(), StoreError> {
        self.opts().map(|_| ())
    }

    fn opts(&self) -> Result<Opts, StoreError> {
        if !schema::valid_database_name(&self.database) {
            return Err(StoreError::new(
                StoreErrorKind::Setup,
                "mysql store: the database name must be lower-case letters, digits and _ (at most 64)",
            ));
        }
        let opts = Opts::from_url(&self.url).map_err(|_| {
            StoreError::new(
                StoreErrorKind::Setup,
                "mysql store: the URL does not parse (mysql://USER[:PASSWORD]@HOST[:PORT]/DB)",
            )
        })?;
        let constraints = PoolConstraints::new(0, self.share.pool_size).ok_or_else(|| {
            StoreError::new(StoreErrorKind::Setup, "mysql store: pool size out of range")
        })?;
        let lock_wait = self.session_lock_wait();
        // Connections stay in the pool (idle ones for 5 minutes) with their
        // session as set here and their prepared statements: no reset on
        // return, which would undo the settings and the statement cache.
        let pool = PoolOpts::default()
            .with_constraints(constraints)
            .with_inactive_connection_ttl(Duration::from_secs(300))
            .with_reset_connection(false);
        Ok(OptsBuilder::from_opts(opts)
            .pool_opts(pool)
            .init(vec![
                // Read committed: a claim's lookup of a missing key takes no
                // gap lock, so claims of new keys never deadlock on gaps.
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".to_owned(),
                // Strict: a value too long for its column is an error, never
                // truncated into another record's id (the claim procedure is
                // created, and so runs, under this mode too).
                "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION,ERROR_FOR_DIVISION_BY_ZERO'".to_owned(),
                "SET SESSION autocommit = 1".to_owned(),
                // Every row a statement reads, whatever limit the server's
                // default sets: a batch reads back one row a call.
                "SET SESSION sql_select_limit = 18446744073709551615".to_owned(),
                // Row locks and metadata locks (an ALTER, LOCK TABLES, a
                // backup's FLUSH TABLES WITH READ LOCK) alike.
                format!("SET SESSION innodb_lock_wait_timeout = {lock_wait}"),
                format!("SET SESSION lock_wait_timeout = {lock_wait}"),
            ])
            .into())
    }

    /// The sessions' lock waits (row and metadata locks), in the whole
    /// seconds the server takes.
    fn session_lock_wait(&self) -> u64 {
        self.lock_wait.as_secs().max(1)
    }

    /// Makes this one of `threads` instances that share what one instance
    /// would hold (a gateway's serving threads, each with its own): the
    /// pool as set so far (call it after
    /// [`pool_size`](Self::pool_size)) and the two batches of each kind in
    /// flight, divided as [`PoolShare::thread_share`] says. One thread (or
    /// 0) changes nothing.
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

    /// Whether [`connect`](Self::connect) creates or migrates the database
    /// (the default). Without, it only checks that the database is at this
    /// code's schema version, and fails otherwise: for instances opened
    /// beside one that migrated (a gateway's serving threads), which then
    /// neither take the migration lock nor hold a connection waiting for
    /// it.
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Connects, creates the database and migrates it.
    ///
    /// # Errors
    /// [`StoreErrorKind::Setup`] for a bad URL or database name or a schema
    /// newer than this code; [`StoreErrorKind::Unavailable`] when the server
    /// cannot be reached in time.
    pub async fn connect(self) -> Result<MysqlStore, StoreError> {
        let pool = Pool::new(self.opts()?);
        let mut conn = tokio::time::timeout(self.wait, pool.get_conn())
            .await
            .map_err(|_| {
                StoreError::new(
                    StoreErrorKind::Unavailable,
                    "mysql store: no connection in time",
                )
            })?
            .map_err(|e| my_error("connecting", e))?;
        let max_packet = schema::check_server(&mut conn).await?;
        if self.migrate {
            schema::migrate(
                &mut conn,
                &self.database,
                self.migration_locks,
                self.session_lock_wait(),
            )
            .await?;
        } else {
            schema::check_version(&mut conn, &self.database).await?;
        }
        drop(conn);
        let inner = Arc::new(Inner {
            pool,
            wait: self.wait,
            max_packet,
            sql: Statements::new(&self.database),
            database: self.database,
        });
        Ok(MysqlStore {
            batches: Arc::new(crate::batch::spawn(&inner, self.share.batches_in_flight)),
            inner,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::MysqlStore;
    use idem_core::batch::KINDS;

    /// The builder takes its shares as `PoolShare` divides them
    /// (idem-core's tests hold the arithmetic), from the pool set before,
    /// and its batches follow the share.
    #[test]
    fn a_thread_share_is_the_pool_share_of_what_was_set() {
        let shared = |threads| {
            let b = MysqlStore::builder("mysql://u@h/db").thread_share(threads);
            (b.share.pool_size, b.share.batches_in_flight)
        };
        assert_eq!(shared(1), (16, crate::batch::IN_FLIGHT));
        assert_eq!(shared(2), (8, 1));
        assert_eq!(shared(3), (6, 1));
        let set = MysqlStore::builder("mysql://u@h/db")
            .pool_size(40)
            .thread_share(4);
        assert_eq!((set.share.pool_size, set.share.batches_in_flight), (10, 1));
        assert_eq!(
            MysqlStore::builder("mysql://u@h/db").most_thread_shares(),
            4
        );
        let least = MysqlStore::builder("mysql://u@h/db").smallest_share();
        assert_eq!(
            (least.share.pool_size, least.share.batches_in_flight),
            (KINDS + 1, 1)
        );
    }
}
