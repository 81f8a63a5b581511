//! Decoding what a store read back into idem's types, for every durable
//! store alike.
//!
//! The stores keep a record in the same columns (a fingerprint's bytes, a
//! status code, a fence, times in milliseconds, the response's status,
//! header block and body) and a backend that decides a claim itself
//! answers with the same numbers. This module turns those plain values
//! into a [`Record`], a [`ClaimAnswer`] and their parts, and names the
//! value that does not decode with a [`CorruptValue`], which a store turns
//! into its `Corrupt` error with [`CorruptValue::store_error`].
//!
//! It is not a driver layer: it takes plain Rust values (`i64`, `Vec<u8>`,
//! `Option<...>`). Reading a column or a script reply, and what a driver
//! reports when that fails, stays in each store crate.

use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::record::{Fence, Record, Status, StoredResponse};
use crate::scope::RecordId;
use crate::store::{Claim, ClaimRequest, StoreError, StoreErrorKind};
use crate::time::Timestamp;
use crate::transition::{ClaimAnswer, ClaimCode, FinishedParts};

/// A stored value that does not decode: which one (`fence`, `status`,
/// `response headers`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stored {what} is corrupt")]
pub struct CorruptValue {
    what: &'static str,
}

impl CorruptValue {
    /// The value named `what` does not decode.
    pub const fn new(what: &'static str) -> CorruptValue {
        CorruptValue { what }
    }

    /// Which value it is.
    pub const fn what(self) -> &'static str {
        self.what
    }

    /// The store's error for it: kind [`StoreErrorKind::Corrupt`], message
    /// `"{store_name} store: stored {what} is corrupt"` (for example
    /// `postgres store: stored fence is corrupt`).
    pub fn store_error(self, store_name: &str) -> StoreError {
        StoreError::new(
            StoreErrorKind::Corrupt,
            format!("{store_name} store: {self}"),
        )
    }
}

/// A fence from its stored signed value; a negative one is corrupt.
///
/// # Errors
/// [`CorruptValue`] `fence` for a negative value.
pub fn fence(stored: i64) -> Result<Fence, CorruptValue> {
    u64::try_from(stored)
        .map(Fence::new)
        .map_err(|_| CorruptValue::new("fence"))
}

/// A status from its stored code ([`Status::code`]).
///
/// # Errors
/// [`CorruptValue`] `status` for any other number.
pub fn status(code: i64) -> Result<Status, CorruptValue> {
    Status::from_code(code).ok_or(CorruptValue::new("status"))
}

/// A claim's outcome from the code a backend answered ([`ClaimCode`]).
///
/// # Errors
/// [`CorruptValue`] `claim outcome` for any other number.
pub fn claim_code(code: i64) -> Result<ClaimCode, CorruptValue> {
    ClaimCode::from_code(code).ok_or(CorruptValue::new("claim outcome"))
}

/// A fingerprint from its stored bytes ([`Fingerprint::as_bytes`]).
///
/// # Errors
/// [`CorruptValue`] `fingerprint` for bytes of no known version.
pub fn fingerprint(bytes: &[u8]) -> Result<Fingerprint, CorruptValue> {
    Fingerprint::from_slice(bytes).ok_or(CorruptValue::new("fingerprint"))
}

/// Text stored as bytes (`what` names it in the error).
///
/// # Errors
/// [`CorruptValue`] `what` for bytes that are not UTF-8.
pub fn text(bytes: Vec<u8>, what: &'static str) -> Result<String, CorruptValue> {
    String::from_utf8(bytes).map_err(|_| CorruptValue::new(what))
}

/// A record's key from its stored text.
///
/// # Errors
/// [`CorruptValue`] `key` for text that is not a valid key.
pub fn key(stored: String) -> Result<Key, CorruptValue> {
    Key::new(stored).map_err(|_| CorruptValue::new("key"))
}

/// A stored response from its columns: the status code, the header block
/// ([`StoredResponse::encode_headers`], trailers included) and the body.
///
/// # Errors
/// [`CorruptValue`] `response status` for a status outside `u16`,
/// `response headers` for a header block that does not decode.
pub fn response(
    status: i64,
    headers: &[u8],
    body: Vec<u8>,
) -> Result<StoredResponse, CorruptValue> {
    let (headers, trailers) = StoredResponse::decode_headers(headers)
        .map_err(|_| CorruptValue::new("response headers"))?;
    Ok(StoredResponse {
        status: u16::try_from(status).map_err(|_| CorruptValue::new("response status"))?,
        headers,
        body,
        trailers,
    })
}

/// The stored response of nullable columns: none without a status (the
/// record is in progress, or its response was not stored); missing
/// headers or body read as empty.
///
/// # Errors
/// As [`response`].
pub fn optional_response(
    status: Option<i64>,
    headers: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
) -> Result<Option<StoredResponse>, CorruptValue> {
    status
        .map(|status| {
            response(
                status,
                &headers.unwrap_or_default(),
                body.unwrap_or_default(),
            )
        })
        .transpose()
}

/// A record's columns as a store read them, before decoding: the
/// fingerprint's bytes, the status code, the stored fence and the times in
/// milliseconds. The resource id and the response come decoded (their
/// stored forms differ between stores; see [`optional_response`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordColumns {
    /// [`Fingerprint::as_bytes`].
    pub fingerprint: Vec<u8>,
    /// [`Status::code`].
    pub status: i64,
    /// The fence as a signed integer.
    pub fence: i64,
    /// When the current execution claimed the key.
    pub created_at: i64,
    /// The lease's end, while in progress.
    pub lease_until: Option<i64>,
    /// When the record expires.
    pub expires_at: i64,
    /// What the operation created.
    pub resource_id: Option<String>,
    /// The response to replay.
    pub response: Option<StoredResponse>,
}

impl RecordColumns {
    /// The record `id` these columns hold.
    ///
    /// # Errors
    /// [`CorruptValue`] for a fingerprint, status or fence that does not
    /// decode, in that order.
    pub fn into_record(self, id: RecordId) -> Result<Record, CorruptValue> {
        Ok(Record {
            id,
            fingerprint: fingerprint(&self.fingerprint)?,
            status: status(self.status)?,
            fence: fence(self.fence)?,
            created_at: Timestamp::from_millis(self.created_at),
            lease_until: self.lease_until.map(Timestamp::from_millis),
            expires_at: Timestamp::from_millis(self.expires_at),
            resource_id: self.resource_id,
            response: self.response,
        })
    }
}

/// What a backend that decides a claim itself (the PostgreSQL function,
/// the MySQL procedure, the Redis script) answered, as plain numbers:
/// the outcome code, the record's fence and its times in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimColumns {
    /// [`ClaimCode::code`].
    pub code: i64,
    /// The record's fence as a signed integer.
    pub fence: i64,
    /// When the record was created.
    pub created_at: i64,
    /// The lease's end, where the record has one.
    pub lease_until: Option<i64>,
    /// When the record expires.
    pub expires_at: i64,
}

impl ClaimColumns {
    /// The answer these numbers hold.
    ///
    /// # Errors
    /// [`CorruptValue`] `claim outcome` or `fence`.
    pub fn into_answer(self) -> Result<ClaimAnswer, CorruptValue> {
        Ok(ClaimAnswer {
            code: claim_code(self.code)?,
            fence: fence(self.fence)?,
            created_at: Timestamp::from_millis(self.created_at),
            lease_until: self.lease_until.map(Timestamp::from_millis),
            expires_at: Timestamp::from_millis(self.expires_at),
        })
    }

    /// The claim `req` is answered with ([`ClaimAnswer::into_claim`]):
    /// `finished` reads a replayed record's parts, and `corrupt` makes the
    /// store's error of a value that does not decode (an answer that
    /// acquires or is in flight without a lease end is a corrupt `lease`).
    ///
    /// # Errors
    /// What `finished` returns, or `corrupt`'s error.
    pub fn into_claim<E>(
        self,
        req: &ClaimRequest,
        finished: impl FnOnce() -> Result<FinishedParts, E>,
        corrupt: impl Fn(CorruptValue) -> E,
    ) -> Result<Claim, E> {
        let answer = self.into_answer().map_err(&corrupt)?;
        answer.into_claim(req, finished, || corrupt(CorruptValue::new("lease")))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::fingerprint::FieldSelection;
    use crate::scope::{Operation, Scope};

    fn id() -> RecordId {
        RecordId::new(
            Scope::anonymous(),
            Operation::new("POST", "/decode"),
            Key::new("decode-key-0001").unwrap(),
        )
    }

    fn fp() -> Fingerprint {
        Fingerprint::compute(
            &Operation::new("POST", "/decode"),
            None,
            b"{}",
            &FieldSelection::Whole,
        )
    }

    #[test]
    fn a_corrupt_value_names_the_store_and_the_value() {
        let e = fence(-1).unwrap_err().store_error("postgres");
        assert_eq!(e.kind(), StoreErrorKind::Corrupt);
        assert_eq!(e.to_string(), "postgres store: stored fence is corrupt");
        assert!(e.cause().is_none());
        assert_eq!(
            CorruptValue::new("claim answer")
                .store_error("mysql")
                .to_string(),
            "mysql store: stored claim answer is corrupt"
        );
    }

    #[test]
    fn each_value_names_itself_when_it_does_not_decode() {
        assert_eq!(fence(7), Ok(Fence::new(7)));
        assert_eq!(status(1), Ok(Status::Completed));
        assert_eq!(status(9).unwrap_err().what(), "status");
        assert_eq!(claim_code(4), Ok(ClaimCode::TakenOver));
        assert_eq!(claim_code(5).unwrap_err().what(), "claim outcome");
        assert_eq!(fingerprint(fp().as_bytes()), Ok(fp()));
        assert_eq!(fingerprint(b"short").unwrap_err().what(), "fingerprint");
        assert_eq!(text(b"op".to_vec(), "operation"), Ok("op".to_owned()));
        assert_eq!(
            text(vec![0xff], "operation").unwrap_err().what(),
            "operation"
        );
        assert_eq!(key(String::new()).unwrap_err().what(), "key");
        assert_eq!(key("k\nv".into()).unwrap_err().what(), "key");
    }

    #[test]
    fn a_response_decodes_from_its_columns() {
        let stored = StoredResponse {
            status: 201,
            headers: vec![("etag".into(), vec![0xff])],
            body: b"ok".to_vec(),
            trailers: Vec::new(),
        };
        let headers = stored.encode_headers();
        assert_eq!(
            optional_response(Some(201), Some(headers.clone()), Some(b"ok".to_vec())),
            Ok(Some(stored))
        );
        assert_eq!(optional_response(None, Some(headers), None), Ok(None));
        assert_eq!(
            optional_response(Some(204), None, None),
            Ok(Some(StoredResponse {
                status: 204,
                headers: vec![],
                body: vec![],
                trailers: Vec::new()
            }))
        );
        assert_eq!(
            response(70_000, &[], vec![]).unwrap_err().what(),
            "response status"
        );
        assert_eq!(
            response(200, &[0, 9], vec![]).unwrap_err().what(),
            "response headers"
        );
    }

    #[test]
    fn a_record_is_assembled_from_its_columns() {
        let columns = RecordColumns {
            fingerprint: fp().as_bytes().to_vec(),
            status: Status::InProgress.code(),
            fence: 3,
            created_at: 1_000,
            lease_until: Some(2_000),
            expires_at: 9_000,
            resource_id: None,
            response: None,
        };
        let record = columns.clone().into_record(id()).unwrap();
        assert_eq!(
            record,
            Record {
                id: id(),
                fingerprint: fp(),
                status: Status::InProgress,
                response: None,
                resource_id: None,
                created_at: Timestamp::from_millis(1_000),
                lease_until: Some(Timestamp::from_millis(2_000)),
                fence: Fence::new(3),
                expires_at: Timestamp::from_millis(9_000),
            }
        );
        let bad = RecordColumns {
            status: 7,
            fence: -1,
            ..columns
        };
        assert_eq!(bad.into_record(id()).unwrap_err().what(), "status");
    }

    #[test]
    fn a_claim_answer_without_a_lease_end_is_a_corrupt_lease() {
        let req = ClaimRequest {
            id: id(),
            fingerprint: fp(),
            now: Timestamp::from_millis(1_000),
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(60),
        };
        let columns = ClaimColumns {
            code: ClaimCode::Acquired.code(),
            fence: 5,
            created_at: 1_000,
            lease_until: Some(31_000),
            expires_at: 61_000,
        };
        let never = || -> Result<FinishedParts, StoreError> { panic!("not a replay") };
        let store_error = |e: CorruptValue| e.store_error("test");
        let claim = columns.into_claim(&req, never, store_error).unwrap();
        assert!(matches!(claim, Claim::Acquired(lease) if lease.fence == Fence::new(5)));
        let no_lease = ClaimColumns {
            lease_until: None,
            ..columns
        };
        let e = no_lease.into_claim(&req, never, store_error).unwrap_err();
        assert_eq!(e.to_string(), "test store: stored lease is corrupt");
        let bad_code = ClaimColumns { code: 9, ..columns };
        let e = bad_code.into_claim(&req, never, store_error).unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Corrupt);
        assert_eq!(e.to_string(), "test store: stored claim outcome is corrupt");
    }
}
