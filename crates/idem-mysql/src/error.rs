//! Mapping MySQL driver failures onto store error kinds.

use idem_core::decode::CorruptValue;
use idem_core::{StoreError, StoreErrorKind};

/// Server error codes that mean "try again later": a lock wait timeout
/// (1205), a deadlock (1213), too many connections (1040), a server
/// shutting down (1053), a statement interrupted by its time limit (1317,
/// 1969 on MariaDB, 3024 on MySQL), the server gone (2006, 2013), an
/// auto-increment value not had in time (1467: the table's AUTO-INC lock
/// waited out, which InnoDB also reports for a deadlock on it; it is also
/// what a counter that fails for good says, which then answers 503 until
/// an operator looks: closed either way).
const UNAVAILABLE: &[u16] = &[1040, 1053, 1205, 1213, 1317, 1467, 1969, 2006, 2013, 3024];

/// A driver error: connection trouble and the codes above are
/// `Unavailable` (503 material); the rest is `Backend`.
pub(crate) fn my_error(context: &str, e: mysql_async::Error) -> StoreError {
    let unavailable = match &e {
        mysql_async::Error::Server(server) => UNAVAILABLE.contains(&server.code),
        mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => true,
        _ => false,
    };
    let kind = if unavailable {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Backend
    };
    StoreError::new(kind, format!("mysql store: {context}")).with_source(e)
}

/// Whether `e` is a deadlock, which a claim retries.
pub(crate) fn is_deadlock(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(server) if server.code == 1213)
}

/// A stored value that does not decode, as this store's `Corrupt` error.
pub(crate) fn corrupt(value: CorruptValue) -> StoreError {
    value.store_error("mysql")
}
