//! Fresh, isolated stores on a test server named by an environment
//! variable: the harness the server-backed store crates (PostgreSQL,
//! MySQL, Redis) share.
//!
//! A crate says once how to open its store at a URL in a namespace of its
//! own (a schema, a database, a key prefix) and how to remove that
//! namespace, by implementing [`IsolatedBackend`]; the provided methods
//! then read the URL (skipping outside CI when it is absent, see
//! [`backend_url`]), give each test a store under a [`unique_name`], and
//! remove it when the test drops it. The conformance suite runs on it in
//! one line:
//!
//! ```ignore
//! idem_testkit::conformance_tests!(optional TestPostgres::fresh_if_configured());
//! ```
//!
//! It is not for stores without a server (SQLite keeps a temporary
//! directory per store, with [`Guarded`]) nor for servers the tests start
//! themselves (a test's own Redis Cluster has no URL variable; such tests
//! use [`IsolatedBackend::guarded`] alone).

use std::future::Future;

use idem_core::Store;

use crate::backend::{backend_url, unique_name};
use crate::guard::{CleanupOnDrop, Guarded};

/// A test server of one store crate, and how to open a store on it that
/// no other test sees.
pub trait IsolatedBackend: 'static {
    /// The store it opens.
    type Store: Store + Clone;

    /// The environment variable holding the server's URL
    /// (`IDEM_TEST_POSTGRES_URL`).
    const URL_VAR: &'static str;

    /// The server's name in the message that says why tests skip
    /// (`PostgreSQL`).
    const SERVER: &'static str;

    /// The tag of the namespaces [`fresh`](Self::fresh) opens
    /// ([`unique_name`]'s argument).
    const TAG: &'static str = "store";

    /// Opens a store at `url` in a namespace named `name` (a schema, a
    /// database, a key prefix) that nothing else uses. Panics if it cannot:
    /// the server is there, so a failure fails the test.
    fn open(url: &str, name: &str) -> impl Future<Output = Self::Store> + Send;

    /// Removes the store's namespace and everything in it. Best effort:
    /// errors are ignored.
    fn remove(store: Self::Store) -> impl Future<Output = ()> + Send;

    /// The server's URL, or `None` after printing why the tests skip;
    /// panics under CI instead (see [`backend_url`]).
    fn url() -> Option<String> {
        backend_url(Self::URL_VAR, Self::SERVER)
    }

    /// A store at `url` in a namespace of its own, removed when the
    /// returned store is dropped.
    fn fresh(url: &str) -> impl Future<Output = Guarded<Self::Store>> + Send {
        let name = unique_name(Self::TAG);
        async move { Self::guarded(Self::open(url, &name).await) }
    }

    /// [`fresh`](Self::fresh) at the configured server, or `None` (after
    /// saying why) when there is none: what `conformance_tests!(optional
    /// ...)` takes.
    fn fresh_if_configured() -> impl Future<Output = Option<Guarded<Self::Store>>> + Send {
        async {
            match Self::url() {
                Some(url) => Some(Self::fresh(&url).await),
                None => None,
            }
        }
    }

    /// `store`, whose namespace is removed when it is dropped.
    fn guarded(store: Self::Store) -> Guarded<Self::Store> {
        let cleanup = Self::cleanup(&store);
        Guarded::new(store, cleanup)
    }

    /// Removes `store`'s namespace when dropped, for harnesses that keep
    /// the store and its clean-up apart.
    fn cleanup(store: &Self::Store) -> CleanupOnDrop {
        let store = store.clone();
        CleanupOnDrop::new(move || Self::remove(store))
    }
}
