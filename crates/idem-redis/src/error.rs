//! Mapping Redis failures onto store error kinds.

use idem_core::decode::CorruptValue;
use idem_core::{StoreError, StoreErrorKind};

/// A Redis error: connection trouble, timeouts and a cluster that is
/// failing over or resharding are `Unavailable` (503 material); the rest
/// is `Backend`.
pub(crate) fn redis_error(context: &str, e: redis::RedisError) -> StoreError {
    use redis::{ErrorKind, ServerErrorKind};
    let in_transition = e.is_cluster_error()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::BusyLoading
            )
        );
    let kind = if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || in_transition
    {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Backend
    };
    StoreError::new(kind, format!("redis store: {context}")).with_source(e)
}

/// A stored value that does not decode, as this store's `Corrupt` error.
pub(crate) fn corrupt(value: CorruptValue) -> StoreError {
    value.store_error("redis")
}

/// Fewer replicas than asked for acknowledged a write in time. The write
/// stands on the master, but the store does not answer as if it would
/// survive a failover: it fails closed.
pub(crate) fn not_replicated(acked: i64, wait: crate::replica_wait::ReplicaWait) -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        format!(
            "redis store: a write reached {acked} of the {} replicas asked for within {} ms",
            wait.replicas,
            wait.timeout.as_millis()
        ),
    )
}
