//! What the broker adapters share: their error.

/// A broker call failed (an acknowledgement that did not reach it, a
/// connection lost). The delivery was not settled: the broker redelivers
/// it, and the record answers the redelivery.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct BrokerError {
    what: &'static str,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl BrokerError {
    /// `what` was being done when `source` happened.
    pub fn new(
        what: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> BrokerError {
        BrokerError {
            what,
            source: source.into(),
        }
    }
}
