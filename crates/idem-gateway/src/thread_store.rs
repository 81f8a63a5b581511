//! A store opened once per serving thread, for the network stores whose
//! connections are driven by tasks (Redis's one multiplexed socket,
//! PostgreSQL's and MySQL's pools and batches): those tasks then run on the thread
//! whose requests use them, so a store call does not wake a thread of the
//! main runtime and wait for it to wake the serving thread back
//! (docs/benchmarks-history.md, "A thread per CPU"; docs/decisions.md,
//! "A PostgreSQL instance per serving thread").
//!
//! Every instance talks to the same server, so they hold the same
//! records; only the connection differs. Calls from any other thread (the
//! sweeper, the admin listener, start-up) use the main instance. Not for
//! the memory store (an instance per thread would be a store per thread)
//! nor SQLite (one writer per file).

use std::cell::Cell;
use std::sync::{Arc, OnceLock};

use idem_http::BoxError;

use idem_core::{
    BoxFuture, Claim, ClaimRequest, Completion, Durability, Fence, Key, Record, RecordId, Scope,
    Settled, StaleCursor, Store, StoreError, Timestamp,
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

/// Opens one more instance of a store (its own connection to the same
/// server), on the thread that calls it.
pub type OpenStore =
    Arc<dyn Fn() -> BoxFuture<'static, Result<Arc<dyn Store>, BoxError>> + Send + Sync>;

/// A store with an instance per serving thread: give it to the layer as
/// its store, and to [`Gateway::thread_stores`](crate::Gateway::thread_stores),
/// whose threads each open their own instance before they serve.
pub struct ThreadStores {
    main: Arc<dyn Store>,
    threads: Vec<OnceLock<Arc<dyn Store>>>,
    open: OpenStore,
}

impl std::fmt::Debug for ThreadStores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadStores")
            .field("threads", &self.threads.len())
            .finish_non_exhaustive()
    }
}

impl ThreadStores {
    /// `main` for every thread that does not serve, and an instance that
    /// `open` makes for each of `threads` serving threads: the gateway's
    /// number ([`Gateway::threads`](crate::Gateway::threads)).
    /// [`Gateway::start`](crate::Gateway::start) refuses stores made for
    /// another number ([`Error::ThreadStores`](crate::Error::ThreadStores)).
    pub fn new(main: Arc<dyn Store>, threads: usize, open: OpenStore) -> Arc<ThreadStores> {
        Arc::new(ThreadStores {
            main,
            threads: (0..threads).map(|_| OnceLock::new()).collect(),
            open,
        })
    }

    /// The number of serving threads these were made for.
    pub(crate) fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Opens serving thread `index`'s instance, on that thread.
    pub(crate) async fn open_for(&self, index: usize) -> Result<(), BoxError> {
        let store = (self.open)().await?;
        self.set(index, store);
        Ok(())
    }

    /// Sets serving thread `index`'s instance (opened on that thread). A
    /// second one for the same thread is ignored.
    pub(crate) fn set(&self, index: usize, store: Arc<dyn Store>) {
        if let Some(slot) = self.threads.get(index) {
            let _ = slot.set(store);
        }
    }

    /// The calling thread's instance, or the main one on a thread that
    /// does not serve. Every serving thread sets its own before it serves
    /// (the gateway does not start otherwise).
    fn here(&self) -> &dyn Store {
        let Some(index) = SERVING_THREAD.with(Cell::get) else {
            return &*self.main;
        };
        let own = self.threads.get(index).and_then(OnceLock::get);
        debug_assert!(own.is_some(), "serving thread {index} has no store");
        own.map_or(&*self.main, |s| &**s)
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

    fn extend_lease<'a>(
        &'a self,
        id: &'a RecordId,
        fence: Fence,
        lease_until: Timestamp,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Settled, StoreError>> {
        self.here().extend_lease(id, fence, lease_until, now)
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

    /// The main instance's report: every instance talks to the same server.
    fn durability(&self) -> BoxFuture<'_, Result<Durability, StoreError>> {
        self.main.durability()
    }

    /// The main instance's epoch: every instance talks to the same server.
    fn advance_epoch<'a>(
        &'a self,
        candidate: &'a str,
    ) -> BoxFuture<'a, Result<Vec<idem_core::EpochMark>, StoreError>> {
        self.main.advance_epoch(candidate)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use idem_core::{
        ClaimRequest, FieldSelection, Fingerprint, Key, MemoryStore, Operation, RecordId, Scope,
        Store, Timestamp,
    };

    use super::{ThreadStores, enter};

    /// Two memory stores stand in for two connections: where a claim made
    /// through the per-thread stores lands shows which instance it reached.
    #[test]
    fn a_serving_thread_uses_its_own_instance_and_others_the_main_one() {
        let main = Arc::new(MemoryStore::new());
        let mine = Arc::new(MemoryStore::new());
        let never: super::OpenStore =
            Arc::new(|| Box::pin(async { Err("not opened here".into()) }));
        let stores = ThreadStores::new(main.clone(), 2, never);
        stores.set(1, mine.clone());
        let now = Timestamp::from_millis(1_800_000_000_000);
        let id = |key: &str| {
            RecordId::new(
                Scope::from_raw("thread-store-tests"),
                Operation::new("POST", "/x"),
                Key::new(key).unwrap(),
            )
        };
        let claim = |index: Option<usize>, id: RecordId| {
            let stores = stores.clone();
            std::thread::spawn(move || {
                if let Some(index) = index {
                    enter(index);
                }
                let request = ClaimRequest {
                    fingerprint: Fingerprint::compute(
                        &id.operation,
                        None,
                        b"{}",
                        &FieldSelection::Whole,
                    ),
                    id,
                    now,
                    lease: Duration::from_secs(30),
                    ttl: Duration::from_secs(3600),
                };
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                rt.block_on(stores.claim(&request)).unwrap();
            })
            .join()
            .unwrap();
        };
        let on = |store: &MemoryStore, id: &RecordId| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(store.get(id, now)).unwrap().is_some()
        };

        let served = id("claimed-on-serving-thread-1");
        claim(Some(1), served.clone());
        assert!(on(&mine, &served), "thread 1 reached its own instance");
        assert!(!on(&main, &served), "and not the main one");

        let other = id("claimed-on-another-thread");
        claim(None, other.clone());
        assert!(
            on(&main, &other),
            "a thread that does not serve: the main one"
        );
        assert!(!on(&mine, &other));
    }
}
