//! Why the gateway could not start, or stopped badly.

use idem_http::BoxError;

/// Why the gateway could not start, or stopped badly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
