//! PostgreSQL store for idem: many service or gateway instances share one
//! set of records, and the atomic mode commits a business mutation and its
//! idempotency result in one transaction.
//!
//! ```no_run
//! use idem_postgres::PostgresStore;
//!
//! # async fn run() -> Result<(), idem_core::StoreError> {
//! let store = PostgresStore::builder("postgres://app@db/payments")
//!     .schema("idem")
//!     .pool_size(16)
//!     .connect()
//!     .await?;
//! // `store` implements `idem_core::Store`.
//! # Ok(()) }
//! ```
//!
//! # Behavior
//!
//! - Every store operation is one statement and one round trip, through
//!   prepared statements cached per connection. A claim calls the
//!   `idem_claim` function (PL/pgSQL, created by the migration), which locks
//!   the record, decides by docs/contract.md, *Records and their state machine*, and writes, atomically.
//! - The schema (default `idem`) is created and migrated on connect, under
//!   an advisory lock, so instances that start together are safe. A schema
//!   newer than this code is refused. An instance built with
//!   `migrate(false)` only checks that the schema is at this code's version.
//!   A migration waits at most a second at a time for a table's lock (claims
//!   queue behind it), three tries, then the connect fails as
//!   `Unavailable` with nothing applied
//!   ([`migration_lock_wait`](PostgresStoreBuilder::migration_lock_wait)).
//!   A read whose prepared statement a migration changed under it (its
//!   columns' types) is prepared again, on every pooled connection.
//! - Fences come from one sequence, so they grow across every claim.
//! - Layout: one table, `idem_records`, keyed by (scope, key, operation),
//!   whose key columns compare as bytes (`COLLATE "C"`) and whose primary
//!   key's prefix serves the look-up by key whatever the operation
//!   (migration 6), with indexes on `expires_at` (purge) and on the lease
//!   end of in-progress records (the stale listing, migration 2); the `idem_fence`
//!   sequence; the `idem_claim` function; `idem_epoch` (migration 4), one
//!   row holding the store's epoch id and counter
//!   ([`Store::advance_epoch`](idem_core::Store::advance_epoch), place
//!   `store`), which no purge, stale listing or look-up touches; and
//!   `idem_migrations`, which records the applied versions.
//! - Purge deletes in bounded batches with `FOR UPDATE SKIP LOCKED`, so
//!   several instances can purge at once without waiting on each other or
//!   on traffic.
//! - Connection loss, server shutdown and pool timeouts are
//!   [`StoreErrorKind::Unavailable`]; the pool reconnects by itself when
//!   the server is back.
//! - Nothing waits without bound, and every limit fails closed with
//!   [`StoreErrorKind::Unavailable`] (the HTTP layer answers 503 and runs
//!   nothing): a call waits at most
//!   [`connect_timeout`](PostgresStoreBuilder::connect_timeout) (default
//!   5 s) for a pooled connection, and every statement runs under
//!   PostgreSQL's `statement_timeout`
//!   ([`statement_timeout`](PostgresStoreBuilder::statement_timeout),
//!   default 5 s, set on each connection the pool opens), so a stalled
//!   server or a row locked by another session does not hang callers.
//!   The statement timeout is enforced by the server; a server that
//!   vanishes from the network is noticed when the connection fails.
//!   Migrations run without it, on a connection closed afterwards.
//! - The server's clock is not used: `now` comes from the caller (see
//!   `idem_core::Timestamp`).
//!
//! # Atomic mode
//!
//! [`PostgresStore::complete_atomically`] runs your statements and the
//! completion of the record in one transaction, after locking the record
//! and checking the fence. If the process dies before commit, neither the
//! mutation nor the completion happened, and the retry (after the lease)
//! executes once. This is the only way to exactly-once effects without help
//! from downstream.
//!
//! ```no_run
//! # use idem_core::{Claim, Completion, Store, StoredResponse};
//! # use idem_postgres::{Atomic, PostgresStore};
//! # async fn run(store: PostgresStore, req: idem_core::ClaimRequest) -> Result<(), Box<dyn std::error::Error>> {
//! if let Claim::Acquired(lease) = store.claim(&req).await? {
//!     let outcome = store
//!         .complete_atomically(&req.id, lease.fence, |tx| {
//!             Box::pin(async move {
//!                 let row = tx
//!                     .query_one("INSERT INTO transfers (amount) VALUES (100) RETURNING id", &[])
//!                     .await?;
//!                 let id: i64 = row.get(0);
//!                 let response = StoredResponse { status: 201, headers: vec![], body: id.to_string().into_bytes(), ..Default::default() };
//!                 Ok::<_, tokio_postgres::Error>((id, Completion::completed(response).with_resource_id(id.to_string())))
//!             })
//!         })
//!         .await?;
//!     match outcome {
//!         Atomic::Committed(id) => println!("transfer {id} committed with its record"),
//!         Atomic::Failed(e) => println!("rolled back: {e}; release the claim"),
//!         Atomic::StaleFence => println!("lost the lease; nothing was written"),
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! [`StoreErrorKind::Unavailable`]: idem_core::StoreErrorKind::Unavailable

mod atomic;
mod batch;
mod builder;
mod durability;
mod error;
mod pooled;
mod row;
mod schema;
mod single;
mod store;
mod tls;

pub use builder::PostgresStoreBuilder;
pub use deadpool_postgres::{Client, GenericClient, Transaction};
pub use idem_core::Atomic;
pub use store::PostgresStore;
/// The PostgreSQL driver's error and parameter trait, for atomic-mode closures.
pub use tokio_postgres::{Error as PgError, types::ToSql};

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod migration_tests;
#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;

/// The README's examples, compiled (and run, unless `no_run`) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
