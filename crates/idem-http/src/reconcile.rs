//! The reconciliation read path: a client asks what became of its key.

use base64::Engine;
use idem_core::{Record, RecordId, Status, Store, StoreError, Timestamp};
use serde::Serialize;

/// A record as JSON for its owner: status, resource id, expiry, and the
/// stored response. The fingerprint and fence are internal and left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecordView {
    /// The key.
    pub key: String,
    /// The operation (`POST /transfers`).
    pub operation: String,
    /// `in_progress`, `completed` or `failed`.
    pub status: &'static str,
    /// What the operation created, if the handler said.
    pub resource_id: Option<String>,
    /// RFC 3339 would need a date library; this is the HTTP-date the
    /// `Idempotency-Key-Expires` header carries.
    pub expires_at: String,
    /// Milliseconds since the Unix epoch, for machines.
    pub expires_at_ms: i64,
    /// The stored response, once finished.
    pub response: Option<ResponseView>,
}

/// A stored response as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResponseView {
    /// Status code.
    pub status: u16,
    /// Stored headers; values that are not UTF-8 are left out.
    pub headers: Vec<(String, String)>,
    /// The body as text when it is UTF-8.
    pub body: Option<String>,
    /// The body in base64 when it is not UTF-8.
    pub body_base64: Option<String>,
}

impl From<&Record> for RecordView {
    fn from(r: &Record) -> RecordView {
        RecordView {
            key: r.id.key.as_str().to_owned(),
            operation: r.id.operation.as_str().to_owned(),
            status: r.status.as_str(),
            resource_id: r.resource_id.clone(),
            expires_at: crate::replay::http_date(r.expires_at).unwrap_or_default(),
            expires_at_ms: r.expires_at.as_millis(),
            response: r
                .response
                .as_ref()
                .filter(|_| r.status != Status::InProgress)
                .map(|s| {
                    let text = std::str::from_utf8(&s.body).ok().map(str::to_owned);
                    ResponseView {
                        status: s.status,
                        headers: s
                            .headers
                            .iter()
                            .filter_map(|(n, v)| {
                                Some((n.clone(), String::from_utf8(v.clone()).ok()?))
                            })
                            .collect(),
                        body_base64: text
                            .is_none()
                            .then(|| base64::engine::general_purpose::STANDARD.encode(&s.body)),
                        body: text,
                    }
                }),
        }
    }
}

/// Reads the caller's own record: the scope in `id` must come from the
/// caller's credential, as the layer derives it.
///
/// # Errors
/// [`StoreError`] when the store does not answer.
pub async fn lookup(store: &dyn Store, id: &RecordId) -> Result<Option<RecordView>, StoreError> {
    Ok(store
        .get(id, Timestamp::now())
        .await?
        .as_ref()
        .map(RecordView::from))
}
