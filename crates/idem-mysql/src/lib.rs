//! MySQL and MariaDB store for idem: many service or gateway instances
//! share one set of records, kept where many payment and commerce teams
//! keep everything else.
//!
//! ```no_run
//! use idem_mysql::MysqlStore;
//!
//! # async fn run() -> Result<(), idem_core::StoreError> {
//! let store = MysqlStore::builder("mysql://app@db:3306/payments")
//!     .database("idem")
//!     .pool_size(16)
//!     .connect()
//!     .await?;
//! // `store` implements `idem_core::Store`.
//! # Ok(()) }
//! ```
//!
//! # Behavior
//!
//! - MySQL 8 and MariaDB 10.11 (InnoDB). Claims, completions and
//!   releases of concurrent requests are gathered into batches (group
//!   commit, `batch.rs`): one transaction, one round trip and one commit
//!   for many calls, each call answered as it would be alone; a call
//!   alone goes at once, without waiting for others. Every other
//!   operation is one statement and one round trip, prepared and cached
//!   per connection. A claim calls the `idem_claim` procedure (created by
//!   the migration), which locks the record, decides by docs/contract.md,
//!   *Records and their state machine*, and writes. A batch inserts its
//!   new keys in one statement and reads back the rows it wrote by a token
//!   of its own (`written_by`, migration 3); its other calls run
//!   `idem_claim_in_tx` (`batch_claims.rs`). A batch's completions are one
//!   `UPDATE`, each column a `CASE` on the record's fence, read back by
//!   token too. Statements that find records by id name the primary key
//!   (`USE INDEX (PRIMARY)`): MariaDB's optimiser otherwise weighs the
//!   other indexes with a dive into each for every id. A gateway opens an
//!   instance per serving thread, each with a share of the pool and the
//!   batches ([`thread_share`](MysqlStoreBuilder::thread_share)), beside
//!   the one that migrates; the threads' instances only check the
//!   schema's version ([`migrate(false)`](MysqlStoreBuilder::migrate)).
//! - The tables live in a database of their own (default `idem`), created
//!   and migrated on connect under a named lock (`GET_LOCK`), so instances
//!   that start together migrate once. A migration's statement waits for
//!   a table's lock at most 1 s a try, three tries
//!   ([`migration_lock_wait`](MysqlStoreBuilder::migration_lock_wait)),
//!   since claims queue behind it. A schema newer than this code is
//!   refused. Beside `idem_records` (schema 1) and `idem_migrations`,
//!   `idem_epoch` (schema 2) holds one row, the store's epoch id and
//!   counter ([`Store::advance_epoch`](idem_core::Store::advance_epoch),
//!   place `store`), which no purge, stale listing or look-up touches.
//! - Fences come from the records table's `AUTO_INCREMENT` (InnoDB keeps
//!   it across restarts): a new or taken-over record gets a new fence, and
//!   fences grow across every claim without a shared counter row.
//! - The pool's connections run at `READ COMMITTED`, so that claims of new
//!   keys take no gap locks, and with `innodb_lock_wait_timeout` set
//!   ([`lock_wait_timeout`](MysqlStoreBuilder::lock_wait_timeout), 5 s):
//!   a row another session holds fails the call with
//!   [`StoreErrorKind::Unavailable`] instead of hanging it. A claim, the
//!   epoch's advance or a purge that loses a deadlock (rolled back whole
//!   by the server) is run again, eight more times at most.
//! - Purge deletes expired records in bounded batches (`ORDER BY
//!   expires_at LIMIT n`).
//! - The server's clock is not used: `now` comes from the caller.
//!
//! It is not an HTTP layer: give the store to `idem_http::IdempotencyLayer`.
//!
//! [`StoreErrorKind::Unavailable`]: idem_core::StoreErrorKind::Unavailable

mod atomic;
mod batch;
mod batch_claims;
mod batch_query;
mod builder;
mod durability;
mod error;
mod row;
mod schema;
mod single;
mod store;

pub use atomic::MysqlTransaction;
pub use builder::MysqlStoreBuilder;
pub use idem_core::Atomic;
/// The driver's error, for atomic-mode closures.
pub use mysql_async::Error as MysqlError;
pub use store::MysqlStore;

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod tests;

/// The README's examples, compiled (and run, unless `no_run`) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
