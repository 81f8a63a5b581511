//! Waking duplicates that wait for the first request (wait mode).
//!
//! Waiters in this process are woken by a `Notify` per record when the
//! executor finishes; no polling. Waiters whose executor runs in another
//! instance cannot be notified, so every waiter also re-reads the store on
//! a backoff (50 ms doubling to 1 s) until its wait limit.
//!
//! An entry lives only while someone waits on it: each [`Subscription`]
//! removes the entry when it is the last one to go, so a key that was
//! replayed, refused or executed leaves nothing behind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use idem_core::RecordId;
use tokio::sync::Notify;

#[derive(Debug, Default)]
pub(crate) struct Waiters {
    map: Mutex<HashMap<RecordId, Arc<Notify>>>,
}

/// A claim on `id`'s notifier; dropping the last one removes the entry.
#[derive(Debug)]
pub(crate) struct Subscription<'a> {
    waiters: &'a Waiters,
    id: RecordId,
    notify: Arc<Notify>,
}

impl Subscription<'_> {
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        let mut map = self.waiters.lock();
        // Clones are only made under this lock, so the count is exact: the
        // map's reference and ours mean no one else waits.
        if let Some(entry) = map.get(&self.id)
            && Arc::ptr_eq(entry, &self.notify)
            && Arc::strong_count(&self.notify) == 2
        {
            map.remove(&self.id);
        }
    }
}

impl Waiters {
    /// The notifier for `id`, created if needed.
    pub(crate) fn subscribe(&self, id: &RecordId) -> Subscription<'_> {
        let notify = self.lock().entry(id.clone()).or_default().clone();
        Subscription {
            waiters: self,
            id: id.clone(),
            notify,
        }
    }

    /// Wakes every waiter on `id`.
    pub(crate) fn wake(&self, id: &RecordId) {
        let mut map = self.lock();
        // Most finishes have no one waiting: skip hashing the id.
        if map.is_empty() {
            return;
        }
        if let Some(n) = map.remove(id) {
            drop(map);
            n.notify_waiters();
        }
    }

    /// How many records have waiters.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<RecordId, Arc<Notify>>> {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{Key, Operation, Scope};

    fn id(n: u32) -> RecordId {
        RecordId::new(
            Scope::anonymous(),
            Operation::new("POST", "/t"),
            Key::new(format!("key-{n:012}")).unwrap(),
        )
    }

    #[test]
    fn entries_go_with_their_last_subscriber() {
        let w = Waiters::default();
        for n in 0..1000 {
            drop(w.subscribe(&id(n)));
        }
        assert_eq!(w.len(), 0);
        let a = w.subscribe(&id(1));
        let b = w.subscribe(&id(1));
        assert_eq!(w.len(), 1);
        drop(a);
        assert_eq!(w.len(), 1, "b still waits");
        drop(b);
        assert_eq!(w.len(), 0);
        // Woken and removed, then the subscriber goes: nothing breaks, and a
        // new entry made meanwhile is not removed by the old subscriber.
        let old = w.subscribe(&id(2));
        w.wake(&id(2));
        let new = w.subscribe(&id(2));
        drop(old);
        assert_eq!(w.len(), 1);
        drop(new);
        assert_eq!(w.len(), 0);
    }
}
