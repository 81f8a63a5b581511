//! Decoding script replies into idem's types: claims and records.
//!
//! A reply is a flat list of values; each script's header comment in
//! `lua/` says what stands where.

use idem_core::transition::{ClaimAnswer, ClaimCode, FinishedParts};
use idem_core::{
    Claim, ClaimRequest, Fence, Fingerprint, Key, Operation, Record, RecordId, Scope, Status,
    StoreError, StoredResponse, Timestamp,
};
use redis::Value;

use crate::error::corrupt;
use crate::scripts::Keys;

/// The claim from the reply of `claim.lua` for `req`.
pub(crate) fn claim_from_reply(req: &ClaimRequest, items: &[Value]) -> Result<Claim, StoreError> {
    let answer = ClaimAnswer {
        code: ClaimCode::from_code(need(int(items, 0)?, "outcome")?)
            .ok_or_else(|| corrupt("claim outcome"))?,
        fence: fence_of(int(items, 1)?)?,
        created_at: Timestamp::from_millis(need(int(items, 2)?, "created_at")?),
        lease_until: int(items, 3)?.map(Timestamp::from_millis),
        expires_at: Timestamp::from_millis(need(int(items, 4)?, "expires_at")?),
    };
    let finished = || {
        let (resource_id, response) = finished_parts(items)?;
        Ok(FinishedParts {
            status: status_of(int(items, 5)?)?,
            resource_id,
            response,
        })
    };
    answer.into_claim(req, finished, || corrupt("lease"))
}

/// A record from the reply of `get.lua` (and each entry of `find.lua` after
/// its operation): the fields [`unfinished_record`] reads, then the
/// finished parts at 6..=9.
pub(crate) fn record_from_reply(id: RecordId, items: &[Value]) -> Result<Record, StoreError> {
    let (resource_id, response) = finished_parts(items)?;
    Ok(Record {
        resource_id,
        response,
        ..unfinished_record(id, items)?
    })
}

/// The records of the reply of `stale.lua`: seven items each, the record
/// key first (named by `keys`), then the fields [`unfinished_record`]
/// reads (a stale record has no response).
pub(crate) fn stale_records_from_reply(
    keys: &Keys,
    items: &[Value],
) -> Result<Vec<Record>, StoreError> {
    items
        .chunks(7)
        .map(|c| {
            let record_key = String::from_utf8(bytes(c, 0)?).map_err(|_| corrupt("record key"))?;
            let id = keys
                .id_of(&record_key)
                .ok_or_else(|| corrupt("record key"))?;
            unfinished_record(id, c.get(1..).unwrap_or_default())
        })
        .collect()
}

/// The records of `scope` and `key` in the reply of `find.lua`: eleven
/// items each, the operation first, then a record as [`record_from_reply`]
/// reads it.
pub(crate) fn records_by_key_from_reply(
    scope: &Scope,
    key: &Key,
    items: &[Value],
) -> Result<Vec<Record>, StoreError> {
    items
        .chunks(11)
        .map(|c| {
            let op = String::from_utf8(bytes(c, 0)?).map_err(|_| corrupt("operation"))?;
            let id = RecordId::new(scope.clone(), Operation::from_raw(op), key.clone());
            record_from_reply(id, c.get(1..).unwrap_or_default())
        })
        .collect()
}

/// A record without resource id or response from items 0..=5:
/// fingerprint, status, fence, created_at, lease_until, expires_at.
fn unfinished_record(id: RecordId, items: &[Value]) -> Result<Record, StoreError> {
    Ok(Record {
        id,
        fingerprint: Fingerprint::from_slice(&bytes(items, 0)?)
            .ok_or_else(|| corrupt("fingerprint"))?,
        status: status_of(int(items, 1)?)?,
        fence: fence_of(int(items, 2)?)?,
        created_at: Timestamp::from_millis(need(int(items, 3)?, "created_at")?),
        lease_until: int(items, 4)?.map(Timestamp::from_millis),
        expires_at: Timestamp::from_millis(need(int(items, 5)?, "expires_at")?),
        resource_id: None,
        response: None,
    })
}

/// Reads reply item `i` as bytes.
fn bytes(items: &[Value], i: usize) -> Result<Vec<u8>, StoreError> {
    match items.get(i) {
        Some(Value::BulkString(b)) => Ok(b.clone()),
        Some(Value::SimpleString(s)) => Ok(s.clone().into_bytes()),
        Some(Value::Int(n)) => Ok(n.to_string().into_bytes()),
        _ => Err(corrupt("reply")),
    }
}

/// Reads reply item `i` as an integer; `None` for an empty string.
fn int(items: &[Value], i: usize) -> Result<Option<i64>, StoreError> {
    match items.get(i) {
        Some(Value::Int(n)) => Ok(Some(*n)),
        _ => {
            let b = bytes(items, i)?;
            if b.is_empty() {
                return Ok(None);
            }
            std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.parse().ok())
                .map(Some)
                .ok_or_else(|| corrupt("number"))
        }
    }
}

fn need(v: Option<i64>, what: &str) -> Result<i64, StoreError> {
    v.ok_or_else(|| corrupt(what))
}

fn fence_of(v: Option<i64>) -> Result<Fence, StoreError> {
    u64::try_from(need(v, "fence")?)
        .map(Fence::new)
        .map_err(|_| corrupt("fence"))
}

fn status_of(v: Option<i64>) -> Result<Status, StoreError> {
    Status::from_code(need(v, "status")?).ok_or_else(|| corrupt("status"))
}

/// The stored response and resource id at items 6..=9.
fn finished_parts(items: &[Value]) -> Result<(Option<String>, Option<StoredResponse>), StoreError> {
    let rid = bytes(items, 6)?;
    let resource_id = match rid.split_first() {
        Some((b's', rest)) => {
            Some(String::from_utf8(rest.to_vec()).map_err(|_| corrupt("resource id"))?)
        }
        _ => None,
    };
    let response = match int(items, 7)? {
        Some(code) => Some(StoredResponse {
            status: u16::try_from(code).map_err(|_| corrupt("response status"))?,
            headers: StoredResponse::decode_headers(&bytes(items, 8)?)
                .map_err(|_| corrupt("response headers"))?,
            body: bytes(items, 9)?,
        }),
        None => None,
    };
    Ok((resource_id, response))
}
