//! A pooled connection that goes back to the pool only when its call got
//! an answer.
//!
//! # Why
//!
//! A caller may give up on a store call (idem-http wraps each in a
//! deadline) while its statement is on the wire. Dropped there, a
//! connection would go back to the pool as if nothing happened, and
//! deadpool's `Fast` recycling only checks that it is not closed. When the
//! call was cut off because the server vanished without a word (a
//! failover to another machine, a partition that outlives the sockets:
//! packets dropped, no reset), the connection is dead but not closed, and
//! every later call handed it would time out too, until TCP gives up on
//! the socket, minutes later (`statement_timeout` is enforced by the
//! server that is gone). So a [`Pooled`] dropped before
//! [`answered`](Pooled::answered) takes its connection out of the pool and
//! closes it: the next call opens a new one. A call that got any answer,
//! an error included, gives its connection back. Nothing is added to a
//! call that finishes: no round trip, no check.

use std::ops::{Deref, DerefMut};

use deadpool_postgres::{Object, Pool};
use idem_core::StoreError;
use tokio_postgres::error::SqlState;

use crate::error::pool_error;

/// A pooled connection for one call. Dropped before
/// [`answered`](Self::answered) (the call was abandoned mid-flight), it
/// leaves the pool and closes.
pub(crate) struct Pooled(Option<Object>);

impl Pooled {
    /// A connection from `pool`.
    ///
    /// # Errors
    /// As the pool's (`Unavailable` when none comes in time).
    pub(crate) async fn get(pool: &Pool) -> Result<Pooled, StoreError> {
        pool.get()
            .await
            .map(|o| Pooled(Some(o)))
            .map_err(pool_error)
    }

    /// The call got `answer` (a result or an error from the server or the
    /// driver): the connection goes back to the pool.
    pub(crate) fn answered<T>(mut self, answer: T) -> T {
        drop(self.0.take());
        answer
    }
}

impl Deref for Pooled {
    type Target = Object;

    fn deref(&self) -> &Object {
        // Some until `answered` or drop, which consume it.
        self.0.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Object {
        self.0.as_mut().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(object) = self.0.take() {
            drop(Object::take(object));
        }
    }
}

/// Whether `e` is the server refusing a prepared statement whose result
/// changed type (SQLSTATE 0A000, "cached plan must not change result
/// type"): a migration by a newer instance changed a column the statement
/// returns (its type, its collation) since the connection prepared it. The
/// server refuses that statement on that connection for good, so when it
/// is, every pooled connection's statement cache is emptied (not only
/// this one's: the next call may be handed another), and each prepares
/// its statements again on its next call.
pub(crate) fn forget_changed_plans(pool: &Pool, e: &tokio_postgres::Error) -> bool {
    let changed = e.code() == Some(&SqlState::FEATURE_NOT_SUPPORTED);
    if changed {
        pool.manager().statement_caches.clear();
    }
    changed
}
