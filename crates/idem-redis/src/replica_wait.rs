//! How many replicas acknowledge each write, when the store waits for them.

/// How many replicas must acknowledge each write before the store answers
/// (`WAIT`), and for how long it waits for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaWait {
    pub(crate) replicas: u32,
    pub(crate) timeout: std::time::Duration,
}
