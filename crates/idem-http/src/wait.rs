//! Waking duplicates that wait for the first request (wait mode).
//!
//! Waiters in this process are woken by a `Notify` per record when the
//! executor finishes; no polling. Waiters whose executor runs in another
//! instance cannot be notified, so every waiter also re-reads the store on
//! a backoff (50 ms doubling to 1 s) until its wait limit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idem_core::RecordId;
use tokio::sync::Notify;

#[derive(Debug, Default)]
pub(crate) struct Waiters {
    map: Mutex<HashMap<RecordId, Arc<Notify>>>,
}

impl Waiters {
    /// The notifier for `id`, created if needed.
    pub(crate) fn subscribe(&self, id: &RecordId) -> Arc<Notify> {
        self.lock().entry(id.clone()).or_default().clone()
    }

    /// Wakes every waiter on `id`.
    pub(crate) fn wake(&self, id: &RecordId) {
        if let Some(n) = self.lock().remove(id) {
            n.notify_waiters();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RecordId, Arc<Notify>>> {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
