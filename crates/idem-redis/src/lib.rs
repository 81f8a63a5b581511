//! Redis store for idem: low latency, shared by many instances, on one
//! server or a Redis Cluster. Not a place for business data: it has no
//! atomic mode (below).
//!
//! ```no_run
//! use idem_redis::RedisStore;
//!
//! # async fn run() -> Result<(), idem_core::StoreError> {
//! let store = RedisStore::builder("redis://127.0.0.1:6379").prefix("idem").connect().await?;
//! // `store` implements `idem_core::Store`.
//!
//! // A cluster: any of its nodes (the rest are found through them), and
//! // optionally an acknowledgement from a replica before each answer.
//! let cluster = RedisStore::builder("redis-cluster://10.0.0.1:7000,10.0.0.2:7000")
//!     .wait_for_replicas(1, std::time::Duration::from_millis(500))
//!     .connect()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # Behavior
//!
//! - Each operation (claim, complete, release, lease extension, get, the
//!   stale listing, the look-up by key) is one Lua script, run
//!   atomically by the server in one round trip. Scripts are sent by SHA
//!   (`EVALSHA`); after a `SCRIPT FLUSH` or a server restart the first call
//!   gets `NOSCRIPT` and the script is loaded again, transparently.
//! - A record is a hash at `PREFIX:r:LEN:SCOPE:LEN:OPERATION:KEY`; its Redis
//!   TTL is set to the record's `expires_at` plus [`EXPIRY_MARGIN`]
//!   (`PEXPIREAT`), so Redis forgets expired records by itself, and a Redis
//!   clock up to that margin ahead of the callers' never drops a live
//!   record (whose retry would then execute again). The scripts compare
//!   `expires_at` with the caller's `now`, so logical expiry is exact
//!   whatever Redis's clock says. [`Store::purge_expired`] removes records that are logically
//!   expired but not yet dropped by Redis, in bounded `SCAN` batches.
//! - In-progress records are indexed in a sorted set by lease end
//!   (`PREFIX:in-progress`), for [`Store::list_stale`].
//! - The records of one scope and key, whatever their operation, are
//!   indexed in a sorted set at `PREFIX:k:LEN:SCOPE:KEY` whose members are
//!   the operations (the record key is derived from them) scored by
//!   `created_at`, for [`Store::find_by_key`]: newest first is the set's own
//!   reverse order, ties included, so a look-up reads only the records it
//!   answers with. The claim script writes it when it creates or takes over
//!   a record, in the same round trip, and extends its Redis TTL to at least
//!   the record's `expires_at`, so the index outlives every record it
//!   points at. Release and purge leave members behind; the look-up script
//!   skips members whose record is gone or expired and removes them. Records
//!   written by a version of idem without this index are not found by key
//!   (they are still found by id) until they expire.
//! - Fences come from one counter per prefix (`PREFIX:fence`), so they grow
//!   across every claim.
//! - The store's epoch ([`Store::advance_epoch`], for
//!   [`idem_core::EpochWatch`]) is a hash at `PREFIX:epoch` (fields `epoch`
//!   and `counter`, no TTL), one place named `store`, advanced by one
//!   script (and a `WAIT` when the store waits for replicas). It is not a
//!   record: no purge, stale listing or look-up reads it.
//! - One multiplexed connection (`ConnectionManager`) serves every task; it
//!   reconnects by itself when the server comes back. Connection failures
//!   and timeouts are [`StoreErrorKind::Unavailable`].
//!
//! # On a Redis Cluster
//!
//! The same scripts, with the keys laid out so that each script's keys
//! share one hash slot:
//!
//! - **Buckets.** A record lives in one of 1,024 buckets, chosen by a fixed
//!   hash (FNV-1a) of its scope and key, and every key of a bucket carries
//!   the bucket's hash tag: `PREFIX:{B}:r:...` (the record),
//!   `PREFIX:{B}:k:...` (its `(scope, key)` index), `PREFIX:{B}:f:...` (its
//!   fence) and `PREFIX:{B}:in-progress` (the bucket's in-progress index).
//!   The 1,024 tags spread over the cluster's slots, so records spread over
//!   every master. The prefix may not hold `{` or `}`.
//! - **An epoch per master**, a place named by the slots it serves
//!   (`slots 0-5460`), so that a replica promoted for them is the same
//!   place, and a promoted replica that was behind shows as a rollback. Its
//!   hash is at `PREFIX:{eN}:epoch`, with the first tag `e0`, `e1`, ...
//!   whose slot that master serves (not a bucket's tag, so no record
//!   pattern matches it). The masters and their slots are read from
//!   `CLUSTER SLOTS` at each advance; every place answers, or the advance
//!   fails.
//! - **A fence per record**, no global counter: the claim sets the record's
//!   fence to the larger of its last fence plus one and the server's clock
//!   in microseconds. The counter is kept as long as the record's keys
//!   (its Redis TTL is extended to the longest), so fences of one record
//!   grow across releases and takeovers; once it has expired with every
//!   record it fenced, the clock keeps the next fence above the old ones
//!   unless the master's clock went back by more than the TTL.
//! - **Across the cluster**: `list_stale` reads every bucket's index (64 at
//!   a time) and merges them; `purge_expired` and `delete_all` `SCAN` each
//!   master. The client follows `MOVED`/`ASK` and learns the slots again
//!   after a failover; a command that cannot be served within the store's
//!   timeout (the cluster is failing over, a slot has no master) is
//!   [`StoreErrorKind::Unavailable`].
//! - **Failover and `WAIT`.** Redis replicates asynchronously: a master
//!   answers a write before any replica has it, and a replica promoted
//!   after the master dies may not have the last writes. A claim lost that
//!   way lets a retry execute again; a completion lost that way leaves the
//!   record in progress (the retry waits out the lease, then executes
//!   again). With [`RedisStoreBuilder::wait_for_replicas`] (or
//!   `?wait_replicas=N` in the URL) the store sends `WAIT N timeout` after
//!   each write, checked to be on the write's connection: a claim that
//!   took a key, a completion, a release, a lease extension, and a replay
//!   (which writes the record's expiry again, so that the wait covers the
//!   completion it answers with). It answers only when N replicas have the write; if
//!   fewer acknowledge in time it fails closed with `Unavailable`, though
//!   the write stands on the master, and a repeated completion by the
//!   same fence waits again before it answers. With N equal to the
//!   replicas per master, a replica promoted by the cluster's own failover
//!   holds every write the store acknowledged. Still not a consensus
//!   system: a manual `CLUSTER FAILOVER TAKEOVER` of a lagging replica, or
//!   losing a master and all its acknowledging replicas at once, can lose
//!   writes. Cost: see BENCHMARKS.md.
//! - **Hostile keys** can crowd one bucket (the hash is not keyed): that
//!   loads one master more than the others, and changes nothing else.
//!
//! # What Redis cannot give
//!
//! - **No atomic mode.** Your business data does not live in Redis, so the
//!   mutation and the record cannot commit together. A crash between the
//!   mutation and the completion leaves the record in progress; after the
//!   lease a retry executes again. Use PostgreSQL or SQLite when the effect
//!   must happen exactly once, or make the downstream idempotent too.
//! - **Durability is the server's.** With the default `appendfsync everysec`
//!   a power loss can drop the last second of completions; with no AOF at
//!   all, a restart forgets every record. Run with `appendonly yes` and
//!   `appendfsync always` for the contract's durability, at a price.
//! - **No eviction.** Every record has a TTL, so the `volatile-*` and
//!   `allkeys-*` `maxmemory-policy` settings may evict live records, and
//!   the next claim of an evicted key executes again. Run the server with
//!   `maxmemory-policy noeviction`: a full Redis then refuses writes, which
//!   the store reports as unavailable (503, fail closed).
//!
//! [`StoreErrorKind::Unavailable`]: idem_core::StoreErrorKind::Unavailable
//! [`Store::purge_expired`]: idem_core::Store::purge_expired
//! [`Store::list_stale`]: idem_core::Store::list_stale
//! [`Store::find_by_key`]: idem_core::Store::find_by_key
//! [`Store::advance_epoch`]: idem_core::Store::advance_epoch

mod builder;
mod connection;
mod durability;
mod epoch;
mod error;
mod replica_wait;
mod row;
mod scripts;
mod store;

pub use builder::RedisStoreBuilder;
pub use store::{EXPIRY_MARGIN, RedisStore};

#[cfg(test)]
mod cluster_attack_tests;
#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;

/// The README's examples, compiled (and run, unless `no_run`) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
