//! Store URLs for idem: which store an operator's URL names, how it is
//! shown without its password, and opening it as a shared
//! [`idem_core::Store`]. The gateway (`idem serve`), `idem records`,
//! `idem demo` and the ledger example all read `--store` here, so a URL
//! means the same thing, and is refused with the same message, everywhere.
//!
//! | URL | Store |
//! |-----|-------|
//! | `memory:` | [`idem_core::MemoryStore`], in this process only |
//! | `sqlite:PATH`, `sqlite://PATH` | `idem_sqlite::SqliteStore` |
//! | `postgres://...`, `postgresql://...` | `idem_postgres::PostgresStore` (feature `postgres`) |
//! | `redis://`, `rediss://`, `redis-cluster://`, `rediss-cluster://` | `idem_redis::RedisStore` (feature `redis`) |
//! | `mysql://...` | `idem_mysql::MysqlStore` (feature `mysql`) |
//!
//! ```
//! use idem_stores::StoreUrl;
//!
//! let url: StoreUrl = "postgres://app:s3cret@db.internal/pay".parse()?;
//! assert_eq!(url.to_string(), "postgres://app:***@db.internal/pay");
//! # Ok::<(), idem_stores::StoreUrlError>(())
//! ```
//!
//! It is not a store and holds no connection: a [`StoreUrl`] is checked
//! when it is parsed (the driver reads it, so a bad port is a usage error
//! before anything starts) and connects only in [`StoreUrl::open`]. The
//! store settings a URL cannot carry (pool sizes, timeouts, the SQLite
//! sync mode) are the store crates' builders', for code that needs them.

mod open;
mod redact;
mod url;

pub use open::OpenError;
pub use redact::redact;
pub use url::{StoreUrl, StoreUrlError};

/// The README's examples, compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
