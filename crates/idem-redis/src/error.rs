//! Mapping Redis failures onto store error kinds.

use idem_core::{StoreError, StoreErrorKind};

/// A Redis error: connection trouble and timeouts are `Unavailable` (503
/// material); the rest is `Backend`.
pub(crate) fn redis_error(context: &str, e: redis::RedisError) -> StoreError {
    let kind = if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
    {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Backend
    };
    StoreError::new(kind, format!("redis store: {context}")).with_source(e)
}

/// A stored value that does not decode.
pub(crate) fn corrupt(what: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Corrupt,
        format!("redis store: stored {what} is corrupt"),
    )
}
