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

/// Whether `e` is a deadlock, which the claims, the epoch's advance and
/// purge run again ([`DeadlockRetries`]).
pub(crate) fn is_deadlock(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(server) if server.code == 1213)
}

/// How many times work that lost a deadlock is run again.
pub(crate) const DEADLOCK_RETRIES: usize = 8;

/// The one rule for running again what the server chose as a deadlock
/// victim: [`DEADLOCK_RETRIES`] more times at most; any other answer, and
/// the last deadlock, stands. Only for work the server rolls back whole
/// when it loses (one autocommitted statement, or a transaction begun
/// anew for each try): nothing of a lost try remains, so running it again
/// cannot do anything twice.
///
/// ```text
/// let mut retries = DeadlockRetries::default();
/// let answer = loop {
///     let answer = conn.exec_drop(&sql, params).await;
///     if !retries.again(&answer) {
///         break answer;
///     }
/// };
/// ```
#[derive(Debug, Default)]
pub(crate) struct DeadlockRetries {
    tries: usize,
}

impl DeadlockRetries {
    /// Whether the try that gave `answer` is to be run again.
    pub(crate) fn again<T>(&mut self, answer: &Result<T, mysql_async::Error>) -> bool {
        match answer {
            Err(e) if is_deadlock(e) && self.tries < DEADLOCK_RETRIES => {
                self.tries += 1;
                true
            }
            _ => false,
        }
    }
}

/// A stored value that does not decode, as this store's `Corrupt` error.
pub(crate) fn corrupt(value: CorruptValue) -> StoreError {
    value.store_error("mysql")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(code: u16) -> mysql_async::Error {
        mysql_async::Error::Server(mysql_async::ServerError {
            code,
            message: format!("error {code}"),
            state: "40001".into(),
        })
    }

    /// Tries whose first `deadlocks` answers are deadlocks and whose next
    /// is `then`, run under one [`DeadlockRetries`]: how many ran, and
    /// the code of the answer that stood.
    fn run(deadlocks: usize, then: Result<u32, u16>) -> (usize, Result<u32, u16>) {
        let mut retries = DeadlockRetries::default();
        let mut ran = 0;
        loop {
            ran += 1;
            let answer = if ran <= deadlocks {
                Err(server_error(1213))
            } else {
                then.map_err(server_error)
            };
            if !retries.again(&answer) {
                let answer = answer.map_err(|e| match e {
                    mysql_async::Error::Server(server) => server.code,
                    other => panic!("not a server error: {other}"),
                });
                return (ran, answer);
            }
        }
    }

    #[test]
    fn a_deadlock_victim_runs_again_until_it_gets_through() {
        assert_eq!(run(0, Ok(7)), (1, Ok(7)));
        assert_eq!(run(3, Ok(7)), (4, Ok(7)));
        assert_eq!(run(DEADLOCK_RETRIES, Ok(7)), (DEADLOCK_RETRIES + 1, Ok(7)));
    }

    #[test]
    fn deadlocks_past_the_retries_and_other_errors_stand() {
        assert_eq!(
            run(usize::MAX, Ok(7)),
            (DEADLOCK_RETRIES + 1, Err(1213)),
            "the last deadlock is the answer"
        );
        // A lock wait timeout is not a deadlock: the server rolled back
        // the statement, not the transaction (with
        // `innodb_rollback_on_timeout` off, the default), so it is never
        // run again.
        assert_eq!(run(0, Err(1205)), (1, Err(1205)));
        assert_eq!(run(2, Err(1205)), (3, Err(1205)));
    }
}
