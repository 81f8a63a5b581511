//! What a record keeps for an answer it could not keep whole: the status
//! and a `response-not-stored` problem that tells a retry the request ran
//! and where to read its record.

use http::StatusCode;
use idem_core::StoredResponse;

/// Why an executed answer's body was not stored.
#[derive(Debug, Clone, Copy)]
pub(super) enum NotStored {
    /// Over the replay limit.
    TooLarge,
    /// Its end could not be told from a cut ([`UnverifiedEnd`](super::execution::UnverifiedEnd)).
    UnverifiedEnd,
    /// The store failed to take it, and holding it whole until the store
    /// does would have gone over the layer's budget (`pending.rs`).
    HeldOverBudget,
}

/// What a record keeps for a response it could not store: the original
/// status, and a problem document saying the request was executed and
/// where its record can be read.
pub(super) fn not_stored(status: StatusCode, why: NotStored, limit: usize) -> StoredResponse {
    // One title for the type (RFC 9457: a title does not change between
    // occurrences); the detail says why.
    let reason = match why {
        NotStored::TooLarge => {
            format!("its response was over the replay limit of {limit} bytes and was not kept")
        }
        NotStored::UnverifiedEnd => "its response ended with its connection, so a cut could not be told from the end, and it was not kept".to_owned(),
        NotStored::HeldOverBudget => "its response could not be kept: the store was unavailable when it ended, and the server's memory for answers awaiting the store was full".to_owned(),
    };
    crate::problem::Problem::idem(
        status,
        "response-not-stored",
        "Response not stored",
        format!(
            "The request with this key was executed once; {reason}. Do not send it again as a new request: read GET /_idem/records/{{key}} for its status and resource id."
        ),
    )
    .to_stored()
}
