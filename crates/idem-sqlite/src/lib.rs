//! The embedded default store of idem: one SQLite file, durable and fast.
//!
//! ```no_run
//! use idem_sqlite::SqliteStore;
//!
//! # fn main() -> Result<(), idem_core::StoreError> {
//! let store = SqliteStore::open("idem.db")?;
//! // `store` implements `idem_core::Store`; share it behind an `Arc`
//! // or clone it (clones share one writer).
//! # Ok(()) }
//! ```
//!
//! # Why one writer thread
//!
//! SQLite allows one writer at a time, and with `synchronous=FULL` every
//! commit waits for an fsync. A store that committed each claim on its own
//! would top out at the disk's fsync rate, a few hundred per second on
//! ordinary hardware. Here every write goes to one thread that runs all the
//! operations queued at that moment in one transaction (group commit), and
//! answers each caller only once that transaction is on disk. Durability is
//! the same as one commit per operation: a completed record is never
//! reported before it is durable. Speed comes from sharing the fsync, not
//! from weakening it. See BENCHMARKS.md for the figures.
//!
//! The commit's sync is SQLite's own call. On Linux that is `fsync`
//! unless SQLite was compiled with `HAVE_FDATASYNC`, which this workspace
//! sets (`.cargo/config.toml`). An application whose SQLite comes from
//! rusqlite's `bundled` feature can set it the same way
//! (`LIBSQLITE3_FLAGS="-DHAVE_FDATASYNC=1"`, added to any flags it already
//! sets): on Linux fdatasync is as durable for the WAL, the main file and
//! the directory, and skips writing the files' timestamps.
//!
//! Reads ([`Store::get`], [`Store::list_stale`], [`Store::find_by_key`]) use
//! their own connections (WAL lets readers run beside the writer) on tokio's
//! blocking pool, so they never wait behind a batch.
//!
//! # Layout
//!
//! One table, `idem_records`, its rows in the order they were written
//! (schema 5: a table with a rowid, so a batch's claims append to the same
//! few pages), found by a unique index on (scope, key, operation) (the
//! look-up by key whatever the operation searches its prefix), with an
//! index on `expires_at` (purge) and a partial index on the lease end of
//! in-progress records (the stale listing, schema 2); and `idem_counters`,
//! which holds the fence counter: the highest fence any writer may have
//! drawn (writers reserve blocks of it, so two processes on one file never
//! draw the same fence); and `idem_epoch` (schema 6), one row holding the
//! store's epoch id and counter ([`Store::advance_epoch`], place `store`),
//! which no purge, stale listing or look-up touches, so that a watcher
//! notices a file emptied or restored from a backup. Older files are
//! migrated on open; schema 5 rebuilds the table once, keeping the
//! application's triggers, indexes and views on it, and the rows of its
//! tables that reference the records (it runs with foreign keys off, and fails, leaving the file as it was,
//! if SQLite cannot resolve a foreign key of such a table against the new
//! table). Stop every process using the file before an upgrade.
//!
//! An application table beside the records should not reference them by
//! foreign key: records expire and are purged, and an expired key's new
//! claim replaces its record. With `ON DELETE CASCADE` the application's
//! rows go with them; with `NO ACTION` the purge fails, and a claim that
//! replaces a record leaves the application's rows pointing at the new
//! record, another request's; with `RESTRICT` that claim fails too.
//! The rowid is not a record's identity: a replaced record gets a new one,
//! and `VACUUM` may renumber them.
//!
//! # Behavior
//!
//! - The file is created with its schema on first open, and marked as an
//!   idem store (`PRAGMA application_id`, `user_version`). Opening another
//!   kind of SQLite file, a file that is not SQLite, a read-only file, or a
//!   store with a newer schema fails with [`StoreErrorKind::Setup`] and a
//!   message naming the file and the reason.
//! - The store's methods must be called from inside a tokio runtime (reads
//!   use `spawn_blocking`).
//! - Dropping the last clone of a store lets the writer finish the queued
//!   work, then closes the file.
//! - Atomic mode: [`SqliteStore::complete_atomically`] commits a business
//!   mutation and the record's completion together.
//! - Busy and I/O failures are [`StoreErrorKind::Unavailable`]: the HTTP
//!   layer answers 503 and runs nothing.
//! - Atomic mode never commits part of a failed call: if anything after the
//!   mutation fails (the completion's UPDATE, the savepoint's release), the
//!   mutation is rolled back to its savepoint and the caller gets the error,
//!   while the other jobs of the batch commit.
//!
//! # Backpressure: a bounded queue and a write timeout
//!
//! A stalled disk stalls the writer, and must not let callers pile up
//! without bound. Two limits fail closed, with
//! [`StoreErrorKind::Unavailable`] (so the HTTP layer answers 503 and runs
//! nothing):
//!
//! - **Queue capacity** ([`SqliteStoreBuilder::max_queue`], default 10,000):
//!   write operations waiting for the writer (not yet in a batch). A call
//!   that finds the queue full fails at once and never reaches the writer.
//! - **Write timeout** ([`SqliteStoreBuilder::write_timeout`], default 5 s):
//!   how long a write call waits for the writer's answer. On expiry the
//!   caller gets `Unavailable`, but the job stays queued and **may still be
//!   applied later**. That is safe: a claim the caller never saw acquired
//!   stays in progress until its lease ends (retries get `InFlight`, then a
//!   takeover executes once); a late completion or release is what the
//!   caller asked for; a late atomic-mode call commits its mutation and its
//!   completion together, so a retry replays it.
//!
//! Write calls need a tokio runtime with its timer enabled. Reads are not
//! queued behind the writer and have no such limit.
//!
//! [`Store::advance_epoch`]: idem_core::Store::advance_epoch
//! [`Store::get`]: idem_core::Store::get
//! [`Store::list_stale`]: idem_core::Store::list_stale
//! [`Store::find_by_key`]: idem_core::Store::find_by_key
//! [`StoreErrorKind::Setup`]: idem_core::StoreErrorKind::Setup
//! [`StoreErrorKind::Unavailable`]: idem_core::StoreErrorKind::Unavailable

mod atomic;
mod builder;
mod epoch;
mod error;
mod row;
mod schema;
mod store;
mod synchronous;
mod writer;

pub use builder::SqliteStoreBuilder;
pub use store::SqliteStore;
pub use synchronous::Synchronous;

#[cfg(test)]
mod tests;

/// The README's examples, compiled (and run, unless `no_run`) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
