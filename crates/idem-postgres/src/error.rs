//! Mapping PostgreSQL and pool failures onto store error kinds.

use idem_core::decode::CorruptValue;
use idem_core::{StoreError, StoreErrorKind};

/// A tokio-postgres error: connection trouble and server shutdown or
/// overload are `Unavailable` (503 material); the rest is `Backend`.
pub(crate) fn pg_error(context: &str, e: tokio_postgres::Error) -> StoreError {
    let unavailable = e.is_closed()
        || e.code().is_none_or(|code| {
            let c = code.code();
            // 08: connection exception; 53: insufficient resources;
            // 57P0x: admin or crash shutdown, cannot connect now;
            // 57014: cancelled (the statement timeout); 55P03: lock not
            // available (a lock timeout).
            c.starts_with("08")
                || c.starts_with("53")
                || c.starts_with("57P")
                || c == "57014"
                || c == "55P03"
        });
    let kind = if unavailable {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Backend
    };
    StoreError::new(kind, format!("postgres store: {context}")).with_source(e)
}

/// A pool failure: no connection could be had in time.
pub(crate) fn pool_error(e: deadpool_postgres::PoolError) -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        "postgres store: no connection available",
    )
    .with_source(e)
}

/// A stored value that does not decode, as this store's `Corrupt` error.
pub(crate) fn corrupt(value: CorruptValue) -> StoreError {
    value.store_error("postgres")
}
