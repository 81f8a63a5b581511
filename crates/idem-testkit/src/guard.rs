//! A store together with what must live as long as it, and the clean-up
//! that removes it.

use idem_core::{ClaimRequest, Key, RecordId, Scope, Store, Timestamp};

/// A store together with whatever must live as long as it (a temporary
/// directory, a schema to drop). Dropped after the store.
pub struct Guarded<S> {
    store: S,
    _guard: Box<dyn Send + Sync>,
}

impl<S> std::fmt::Debug for Guarded<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Guarded")
    }
}

impl<S: Store> Guarded<S> {
    /// Keeps `guard` alive for as long as `store`.
    pub fn new(store: S, guard: impl Send + Sync + 'static) -> Guarded<S> {
        Guarded {
            store,
            _guard: Box::new(guard),
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }
}

impl<S: Store> Store for Guarded<S> {
    fn claim<'a>(
        &'a self,
        req: &'a ClaimRequest,
    ) -> idem_core::BoxFuture<'a, Result<idem_core::Claim, idem_core::StoreError>> {
        self.store.claim(req)
    }
    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        fence: idem_core::Fence,
        completion: idem_core::Completion,
        now: Timestamp,
    ) -> idem_core::BoxFuture<'a, Result<idem_core::Settled, idem_core::StoreError>> {
        self.store.complete(id, fence, completion, now)
    }
    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        fence: idem_core::Fence,
        now: Timestamp,
    ) -> idem_core::BoxFuture<'a, Result<idem_core::Settled, idem_core::StoreError>> {
        self.store.release(id, fence, now)
    }
    fn extend_lease<'a>(
        &'a self,
        id: &'a RecordId,
        fence: idem_core::Fence,
        lease_until: Timestamp,
        now: Timestamp,
    ) -> idem_core::BoxFuture<'a, Result<idem_core::Settled, idem_core::StoreError>> {
        self.store.extend_lease(id, fence, lease_until, now)
    }
    fn get<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> idem_core::BoxFuture<'a, Result<Option<idem_core::Record>, idem_core::StoreError>> {
        self.store.get(id, now)
    }
    fn purge_expired(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> idem_core::BoxFuture<'_, Result<usize, idem_core::StoreError>> {
        self.store.purge_expired(now, limit)
    }
    fn list_stale<'a>(
        &'a self,
        now: Timestamp,
        after: Option<&'a idem_core::StaleCursor>,
        limit: usize,
    ) -> idem_core::BoxFuture<'a, Result<Vec<idem_core::Record>, idem_core::StoreError>> {
        self.store.list_stale(now, after, limit)
    }
    fn find_by_key<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a Key,
        now: Timestamp,
        limit: usize,
    ) -> idem_core::BoxFuture<'a, Result<Vec<idem_core::Record>, idem_core::StoreError>> {
        self.store.find_by_key(scope, key, now, limit)
    }
    fn durability(
        &self,
    ) -> idem_core::BoxFuture<'_, Result<idem_core::Durability, idem_core::StoreError>> {
        self.store.durability()
    }
    fn advance_epoch<'a>(
        &'a self,
        candidate: &'a str,
    ) -> idem_core::BoxFuture<'a, Result<Vec<idem_core::EpochMark>, idem_core::StoreError>> {
        self.store.advance_epoch(candidate)
    }
}

type CleanupFn = Box<dyn FnOnce() -> idem_core::BoxFuture<'static, ()> + Send>;

/// Runs an async clean-up (drop a schema, delete a key prefix) when
/// dropped, on a runtime of its own: the test's runtime may be gone by then.
/// Errors in the clean-up are ignored; it is best effort.
pub struct CleanupOnDrop(std::sync::Mutex<Option<CleanupFn>>);

impl std::fmt::Debug for CleanupOnDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CleanupOnDrop")
    }
}

impl CleanupOnDrop {
    /// Will run `cleanup()` to completion on drop.
    pub fn new<F, Fut>(cleanup: F) -> CleanupOnDrop
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        CleanupOnDrop(std::sync::Mutex::new(Some(Box::new(move || {
            Box::pin(cleanup()) as idem_core::BoxFuture<'static, ()>
        }))))
    }
}

impl Drop for CleanupOnDrop {
    fn drop(&mut self) {
        let taken = self
            .0
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(cleanup) = taken {
            let _ = std::thread::spawn(move || {
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    rt.block_on(cleanup());
                }
            })
            .join();
        }
    }
}
