//! The idempotency contract of idem, with no I/O.
//!
//! An idempotency key names one client intent. A server claims the key
//! atomically, executes once, stores the result bound to a hash of the
//! parameters, and answers every retry with that result until the key
//! expires. This crate holds the pieces of that contract that do not depend
//! on HTTP or on a database:
//!
//! - [`Key`] and [`KeyPolicy`]: parsing the `Idempotency-Key` header value
//!   and refusing keys that are too short or look like secrets;
//! - [`Scope`], [`Operation`], [`RecordId`]: whose record, for what;
//! - [`Fingerprint`]: SHA-256 over the operation, the request target and the
//!   (canonical JSON) body;
//! - [`Record`], [`Status`], [`Fence`], [`Policy`];
//! - the [`Store`] trait and its state machine ([`transition`]);
//! - [`MemoryStore`], sharded and lock-per-shard;
//! - [`decode`]: turning the plain values a durable store read back into
//!   records and claim answers, the same way in every store.
//!
//! The conformance suite every store must pass is in the `idem-testkit`
//! crate of this workspace (not published; a dev-dependency only).
//!
//! It is not an HTTP layer (`idem-http`) nor a durable store (`idem-sqlite`,
//! `idem-postgres`, `idem-redis`).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use idem_core::*;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let policy = Policy::default();
//! let key = Key::parse("\"0c5b8a0e-6f0b-4b4e-9c55-3f1f1b7f9e21\"", &KeyPolicy::default(), None)?;
//! let op = Operation::new("POST", "/transfers");
//! let body = br#"{"from": "a", "to": "b", "amount": 100}"#;
//! let req = ClaimRequest {
//!     id: RecordId::new(Scope::from_credential(b"Bearer tok_123"), op.clone(), key),
//!     fingerprint: Fingerprint::compute(&op, Some("application/json"), body, &FieldSelection::Whole),
//!     now: Timestamp::now(),
//!     lease: policy.lease(),
//!     ttl: policy.ttl(),
//! };
//! match store.claim(&req).await? {
//!     Claim::Acquired(lease) => {
//!         // ... run the operation, then store what it answered:
//!         let response = StoredResponse { status: 201, headers: vec![], body: b"{}".to_vec(), ..Default::default() };
//!         let _ = store.complete(&req.id, lease.fence, Completion::completed(response), Timestamp::now()).await?;
//!     }
//!     Claim::Replay(record) => { /* answer with record.response */ }
//!     Claim::InFlight { .. } => { /* 409, or wait */ }
//!     Claim::Mismatch { .. } => { /* 422 */ }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! # Why `now` is a parameter
//!
//! Stores never read a clock. The caller passes `now`, so every backend
//! judges leases and expiry the same way and tests move time without
//! sleeping. See [`Timestamp`].

pub mod batch;
mod canonical_json;
pub mod decode;
mod digest;
mod durability;
mod epoch;
mod fingerprint;
pub mod header_names;
mod key;
mod memory;
mod migration_locks;
mod policy;
mod record;
mod recovery;
mod scope;
mod store;
mod time;
pub mod transition;

#[doc(hidden)]
pub use canonical_json::canonicalize_json;
pub use durability::{Durability, DurabilityFinding, Verdict};
pub use epoch::{EpochMark, EpochWatch, LOSS_CAUSES, LossCause, StoreLoss};
pub use fingerprint::{FieldSelection, Fingerprint};
pub use key::{Key, KeyError, KeyPolicy, MAX_KEY_LEN};
pub use memory::MemoryStore;
pub use migration_locks::MigrationLockWaits;
pub use policy::{Concurrency, Disposition, Policy, PolicyBuilder, PolicyError, Takeover};
pub use record::{DecodedFields, Fence, HeaderDecodeError, Record, Status, StoredResponse};
pub use recovery::{Reconcile, ReconcileReport, ReleaseAll, Resolution, reconcile_once};
pub use scope::{Operation, RecordId, Scope};
pub use store::{
    Atomic, BoxFuture, Claim, ClaimRequest, ClaimedAtomically, Completion, Lease, Settled,
    StaleCursor, Store, StoreError, StoreErrorKind,
};
pub use time::Timestamp;

/// The README's examples, compiled (and run, unless `no_run`) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
