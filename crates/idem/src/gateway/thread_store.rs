//! A store opened once per serving thread, for the network stores whose
//! connection is one multiplexed socket driven by a task (Redis): that
//! task then runs on the thread whose requests use it, so a store call
//! does not wake a thread of the main runtime and wait for it to wake the
//! serving thread back (BENCHMARKS.md, "A thread per CPU").
//!
//! Every instance talks to the same server, so they hold the same
//! records; only the connection differs. Calls from any other thread (the
//! sweeper, the admin listener, start-up) use the main instance. Not for
//! the memory store (an instance per thread would be a store per thread)
//! nor SQLite (one writer per file).

use std::cell::Cell;
use std::sync::{Arc, OnceLock};

use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Fence, Key, Record, RecordId, Scope, Settled,
    StaleCursor, Store, StoreError, Timestamp,
};

thread_local! {
    /// The serving thread this is, if it is one.
    static SERVING_THREAD: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Marks the calling thread as serving thread `index`, for
/// [`ThreadStores`]. Called once by each serving thread before it serves.
pub(crate) fn enter(index: usize) {
    SERVING_THREAD.with(|t| t.set(Some(index)));
}

/// The main instance and one per serving thread, each set by its thread.
pub(crate) struct ThreadStores {
    main: Arc<dyn Store>,
    threads: Vec<OnceLock<Arc<dyn Store>>>,
}

impl ThreadStores {
    pub(crate) fn new(main: Arc<dyn Store>, threads: usize) -> ThreadStores {
        ThreadStores {
            main,
            threads: (0..threads).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Sets serving thread `index`'s instance (opened on that thread). A
    /// second one for the same thread is ignored.
    pub(crate) fn set(&self, index: usize, store: Arc<dyn Store>) {
        if let Some(slot) = self.threads.get(index) {
            let _ = slot.set(store);
        }
    }

    /// The calling thread's instance, or the main one.
    fn here(&self) -> &dyn Store {
        SERVING_THREAD
            .with(Cell::get)
            .and_then(|i| self.threads.get(i))
            .and_then(OnceLock::get)
            .map_or(&*self.main, |s| &**s)
    }
}

impl Store for ThreadStores {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, StoreError>> {
        self.here().claim(req)
    }

    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        completion: Completion,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        self.here().complete(id, fence, completion, now)
    }

    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        self.here().release(id, fence, now)
    }

    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        self.here().get(id, now)
    }

    fn purge_expired(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'_, Result<usize, StoreError>> {
        self.here().purge_expired(now, limit)
    }

    fn list_stale<'a>(
        &'a self,
        now: Timestamp,
        after: Option<&'a StaleCursor>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        self.here().list_stale(now, after, limit)
    }

    fn find_by_key<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a Key,
        now: Timestamp,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, StoreError>> {
        self.here().find_by_key(scope, key, now, limit)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use idem_core::{MemoryStore, Store};

    use super::{ThreadStores, enter};

    /// Two distinct memory stores stand in for two connections: which one
    /// a call reaches shows which instance was picked.
    #[tokio::test]
    async fn each_serving_thread_uses_its_own_instance_and_others_the_main_one() {
        let main: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let mine: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let stores = Arc::new(ThreadStores::new(main.clone(), 2));
        stores.set(1, mine.clone());
        let probe = |s: Arc<ThreadStores>| async move {
            s.purge_expired(idem_core::Timestamp::from_millis(0), 10)
                .await
                .map(|_| std::ptr::from_ref(s.here()).cast::<()>() as usize)
        };
        let main_addr = Arc::as_ptr(&main).cast::<()>() as usize;
        let mine_addr = Arc::as_ptr(&mine).cast::<()>() as usize;

        // Not a serving thread: the main instance.
        assert_eq!(probe(stores.clone()).await.unwrap(), main_addr);
        let on = |index: usize| {
            let stores = stores.clone();
            std::thread::spawn(move || {
                enter(index);
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                rt.block_on(probe(stores)).unwrap()
            })
            .join()
            .unwrap()
        };
        assert_eq!(on(1), mine_addr, "thread 1 has its own");
        assert_eq!(on(0), main_addr, "thread 0 set none: the main one");
        assert_eq!(on(7), main_addr, "no such thread: the main one");
    }
}
