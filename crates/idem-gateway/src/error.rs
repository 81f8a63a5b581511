//! Why the gateway could not start, or stopped badly.

use idem_http::BoxError;

/// Why the gateway could not start, or stopped badly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting is outside the bounds the gateway serves with (a
    /// connection limit of zero, a timeout whose deadline would overflow);
    /// nothing was started.
    #[error("{setting} must be {bound}, not {value}")]
    Setting {
        /// The setting, as `Type::field` or `Gateway::method`.
        setting: &'static str,
        /// What it must be.
        bound: String,
        /// What it was.
        value: String,
    },
    /// The [`ThreadStores`](crate::ThreadStores) given to
    /// [`Gateway::thread_stores`](crate::Gateway::thread_stores) were made
    /// for another number of serving threads than
    /// [`Gateway::threads`](crate::Gateway::threads); nothing was started.
    #[error(
        "ThreadStores were made for {stores} serving threads, but the gateway has {threads}: make them with the gateway's number of threads"
    )]
    ThreadStores {
        /// The number the stores were made for.
        stores: usize,
        /// The gateway's number of serving threads.
        threads: usize,
    },
    /// [`Gateway::tls`](crate::Gateway::tls) was set over an
    /// [`Accept`](crate::Accept) step that speaks TLS already, which would
    /// run TLS inside TLS; nothing was started.
    #[error(
        "the gateway's acceptor speaks TLS already (Accept::is_tls), and Gateway::tls would add TLS inside it: set one or the other"
    )]
    TlsOverTls,
    /// A serving thread, its runtime or its copy of the listening socket
    /// could not be made.
    #[error("cannot start the serving threads")]
    Start(#[source] std::io::Error),
    /// A serving thread's start-up (opening its store instance) failed.
    #[error("serving thread {thread} could not start")]
    ThreadStart {
        /// The thread's index.
        thread: usize,
        /// What failed.
        #[source]
        source: BoxError,
    },
    /// A serving thread ended while it started.
    #[error("serving thread {0} stopped while starting")]
    ThreadLost(usize),
    /// A serving thread ended without being asked to (it panicked).
    #[error("a serving thread stopped unexpectedly")]
    Stopped,
}
