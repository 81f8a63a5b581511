//! The idempotency record: what a store keeps for one (scope, operation, key).

use std::time::Duration;

use crate::fingerprint::Fingerprint;
use crate::scope::RecordId;
use crate::time::Timestamp;

/// Where a record is in its life (docs/contract.md, *Records and their state machine*).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Claimed; an executor holds the lease and is running the operation.
    InProgress,
    /// The operation finished and its response is stored for replay.
    Completed,
    /// The operation began and failed deterministically (a 4xx); its
    /// response is replayed like a success.
    Failed,
}

impl Status {
    /// The stored name: `in_progress`, `completed`, `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Failed => "failed",
        }
    }

    /// Parses a stored name.
    pub fn from_name(name: &str) -> Option<Status> {
        match name {
            "in_progress" => Some(Status::InProgress),
            "completed" => Some(Status::Completed),
            "failed" => Some(Status::Failed),
            _ => None,
        }
    }

    /// A small integer for compact storage: 0, 1, 2.
    pub fn code(self) -> i64 {
        match self {
            Status::InProgress => 0,
            Status::Completed => 1,
            Status::Failed => 2,
        }
    }

    /// The inverse of [`Status::code`].
    pub fn from_code(code: i64) -> Option<Status> {
        match code {
            0 => Some(Status::InProgress),
            1 => Some(Status::Completed),
            2 => Some(Status::Failed),
            _ => None,
        }
    }
}

/// The fencing token of one execution. Every claim and takeover gets a
/// larger one, and only the holder of the current fence may complete or
/// release the record, so an executor that lost its lease cannot overwrite
/// the work of the one that took over.
///
/// Stores draw fences from one counter per store, not per record, so a
/// fence is never reused even after a record is released or purged and
/// the key claimed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(u64);

impl Fence {
    /// A fence from its stored value.
    pub const fn new(value: u64) -> Fence {
        Fence(value)
    }

    /// The stored value.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The value as a signed 64-bit integer, as SQL columns hold it; `None`
    /// past `i64::MAX`, a fence no store ever issued (so no record can
    /// match it: the caller answers a stale fence).
    pub fn to_i64(self) -> Option<i64> {
        i64::try_from(self.0).ok()
    }
}

/// A response kept for replay: status, allowlisted headers, body and
/// allowlisted trailers (gRPC's `grpc-status`, say).
///
/// Core knows no HTTP; the HTTP layer decides which headers and trailers
/// go in.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredResponse {
    /// The status code.
    pub status: u16,
    /// Header names (lower case) and values, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
    /// Trailer names (lower case) and values, in order: the fields sent
    /// after the body (HTTP/2 and chunked HTTP/1.1). Empty for most.
    pub trailers: Vec<(String, Vec<u8>)>,
}

/// A stored header block that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stored response headers are corrupt")]
pub struct HeaderDecodeError;

/// The headers and the trailers of a stored response, as
/// [`StoredResponse::decode_headers`] reads them from one block.
pub type DecodedFields = (Vec<(String, Vec<u8>)>, Vec<(String, Vec<u8>)>);

/// Appends one field: a u16 name length, the name, a u32 value length
/// and the value, all big-endian.
fn encode_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(&u16::try_from(name.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.extend_from_slice(&name[..name.len().min(usize::from(u16::MAX))]);
    let vlen = u32::try_from(value.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&vlen.to_be_bytes());
    out.extend_from_slice(&value[..value.len().min(vlen as usize)]);
}

impl StoredResponse {
    /// Encodes the headers and trailers as one byte string, for stores
    /// that keep them in a single column: for each header, a u16 name
    /// length, the name, a u32 value length and the value, all
    /// big-endian; then, if there are trailers, one field with an empty
    /// name and value (no header has an empty name: fields without one
    /// are left out) and the trailers the same way. A block without trailers is what this wrote before
    /// trailers were kept, so records stored then decode as they were.
    pub fn encode_headers(&self) -> Vec<u8> {
        // A field without a name is no header (and would read as the mark).
        fn named(fields: &[(String, Vec<u8>)]) -> Vec<(&[u8], &[u8])> {
            fields
                .iter()
                .filter(|(name, _)| !name.is_empty())
                .map(|(n, v)| (n.as_bytes(), v.as_slice()))
                .collect()
        }
        let mut out = Vec::new();
        for (name, value) in named(&self.headers) {
            encode_field(&mut out, name, value);
        }
        let trailers = named(&self.trailers);
        if !trailers.is_empty() {
            encode_field(&mut out, b"", b"");
            for (name, value) in trailers {
                encode_field(&mut out, name, value);
            }
        }
        out
    }

    /// Decodes what [`StoredResponse::encode_headers`] wrote: the headers,
    /// then the trailers.
    ///
    /// # Errors
    /// [`HeaderDecodeError`] if the bytes are truncated, a name is not
    /// UTF-8, or the block names trailers twice or an empty trailer.
    pub fn decode_headers(mut bytes: &[u8]) -> Result<DecodedFields, HeaderDecodeError> {
        fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], HeaderDecodeError> {
            if bytes.len() < n {
                return Err(HeaderDecodeError);
            }
            let (head, tail) = bytes.split_at(n);
            *bytes = tail;
            Ok(head)
        }
        let mut headers = Vec::new();
        let mut trailers = Vec::new();
        let mut in_trailers = false;
        while !bytes.is_empty() {
            let nlen = u16::from_be_bytes(
                take(&mut bytes, 2)?
                    .try_into()
                    .map_err(|_| HeaderDecodeError)?,
            );
            let name = std::str::from_utf8(take(&mut bytes, usize::from(nlen))?)
                .map_err(|_| HeaderDecodeError)?
                .to_owned();
            let vlen = u32::from_be_bytes(
                take(&mut bytes, 4)?
                    .try_into()
                    .map_err(|_| HeaderDecodeError)?,
            );
            let value = take(&mut bytes, vlen as usize)?.to_vec();
            if name.is_empty() {
                // The mark before the trailers: once, with no value.
                if in_trailers || !value.is_empty() {
                    return Err(HeaderDecodeError);
                }
                in_trailers = true;
                continue;
            }
            if in_trailers {
                trailers.push((name, value));
            } else {
                headers.push((name, value));
            }
        }
        if in_trailers && trailers.is_empty() {
            return Err(HeaderDecodeError);
        }
        Ok((headers, trailers))
    }
}

/// One idempotency record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// (scope, operation, key).
    pub id: RecordId,
    /// The hash of the parameters the key was first used with.
    pub fingerprint: Fingerprint,
    /// Where the record is in its life.
    pub status: Status,
    /// The stored response, once completed or failed.
    pub response: Option<StoredResponse>,
    /// The id of what the operation created, for reconciliation.
    pub resource_id: Option<String>,
    /// When the current execution claimed the key.
    pub created_at: Timestamp,
    /// Until when the executor's lease runs; `None` once finished.
    pub lease_until: Option<Timestamp>,
    /// The current execution's fencing token.
    pub fence: Fence,
    /// When the record stops counting: after this, a claim executes again.
    pub expires_at: Timestamp,
}

impl Record {
    /// Whether the record still counts at `now`.
    pub fn is_live(&self, now: Timestamp) -> bool {
        now < self.expires_at
    }

    /// Whether an executor's lease is running at `now`.
    pub fn lease_is_live(&self, now: Timestamp) -> bool {
        self.status == Status::InProgress && self.lease_until.is_some_and(|l| now < l)
    }

    /// How much longer the record counts, from `now`.
    pub fn remaining(&self, now: Timestamp) -> Duration {
        self.expires_at.saturating_since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_codec_round_trips_and_refuses_truncation() {
        let r = StoredResponse {
            status: 201,
            headers: vec![
                ("content-type".into(), b"application/json".to_vec()),
                ("location".into(), b"/transfers/7".to_vec()),
                ("etag".into(), vec![]),
            ],
            body: b"{}".to_vec(),
            trailers: vec![],
        };
        let enc = r.encode_headers();
        assert_eq!(
            StoredResponse::decode_headers(&enc).unwrap(),
            (r.headers.clone(), vec![])
        );
        assert_eq!(
            StoredResponse::decode_headers(&enc[..enc.len() - 1]),
            Err(HeaderDecodeError)
        );
        assert_eq!(
            StoredResponse::decode_headers(&[]).unwrap(),
            (vec![], vec![])
        );
    }

    /// Trailers follow the headers behind an empty field; a block without
    /// them is byte for byte what was written before trailers were kept.
    #[test]
    fn trailers_round_trip_after_the_headers() {
        let mut r = StoredResponse {
            status: 200,
            headers: vec![("content-type".into(), b"application/grpc".to_vec())],
            body: vec![0, 0, 0, 0, 1, 7],
            trailers: vec![],
        };
        let without = r.encode_headers();
        r.trailers = vec![
            ("grpc-status".into(), b"0".to_vec()),
            ("grpc-message".into(), vec![]),
        ];
        let with = r.encode_headers();
        assert!(with.starts_with(&without));
        assert_eq!(
            StoredResponse::decode_headers(&with).unwrap(),
            (r.headers.clone(), r.trailers.clone())
        );
        // Trailers alone, no headers.
        r.headers.clear();
        let only = r.encode_headers();
        assert_eq!(
            StoredResponse::decode_headers(&only).unwrap(),
            (vec![], r.trailers.clone())
        );
        // A mark with nothing after it, two marks, a mark with a value.
        let mark = [0u8, 0, 0, 0, 0, 0];
        let mut dangling = without.clone();
        dangling.extend_from_slice(&mark);
        assert_eq!(
            StoredResponse::decode_headers(&dangling),
            Err(HeaderDecodeError)
        );
        let mut twice = with.clone();
        twice.extend_from_slice(&mark);
        assert_eq!(
            StoredResponse::decode_headers(&twice),
            Err(HeaderDecodeError)
        );
        let mut valued = without;
        valued.extend_from_slice(&[0, 0, 0, 0, 0, 1, b'x']);
        assert_eq!(
            StoredResponse::decode_headers(&valued),
            Err(HeaderDecodeError)
        );
        // A field without a name is left out, never written as the mark.
        let nameless = StoredResponse {
            headers: vec![("".into(), b"x".to_vec()), ("etag".into(), b"1".to_vec())],
            trailers: vec![("".into(), vec![])],
            ..StoredResponse::default()
        };
        assert_eq!(
            StoredResponse::decode_headers(&nameless.encode_headers()).unwrap(),
            (vec![("etag".into(), b"1".to_vec())], vec![])
        );
    }

    #[test]
    fn status_names_and_codes_round_trip() {
        for s in [Status::InProgress, Status::Completed, Status::Failed] {
            assert_eq!(Status::from_name(s.as_str()), Some(s));
            assert_eq!(Status::from_code(s.code()), Some(s));
        }
        assert_eq!(Status::from_code(9), None);
    }
}
