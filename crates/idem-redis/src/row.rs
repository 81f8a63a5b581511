//! Decoding script replies into idem's types: claims and records.
//!
//! A reply is a flat list of values; each script's header comment in
//! `lua/` says what stands where. Reading the items is this module's;
//! decoding the values they hold is `idem_core::decode`'s.

use idem_core::decode::{self, ClaimColumns, CorruptValue, RecordColumns};
use idem_core::transition::FinishedParts;
use idem_core::{
    Claim, ClaimRequest, EpochMark, Key, Operation, Record, RecordId, Scope, Status, StoreError,
    StoredResponse,
};
use redis::Value;

use crate::error::corrupt;
use crate::scripts::Keys;

/// The claim from the reply of `claim.lua` for `req`.
pub(crate) fn claim_from_reply(req: &ClaimRequest, items: &[Value]) -> Result<Claim, StoreError> {
    let answer = ClaimColumns {
        code: need(int(items, 0)?, "outcome")?,
        fence: need(int(items, 1)?, "fence")?,
        created_at: need(int(items, 2)?, "created_at")?,
        lease_until: int(items, 3)?,
        expires_at: need(int(items, 4)?, "expires_at")?,
    };
    let finished = || {
        let (resource_id, response) = finished_parts(items)?;
        Ok(FinishedParts {
            status: status_of(int(items, 5)?)?,
            resource_id,
            response,
        })
    };
    answer.into_claim(req, finished, corrupt)
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
            let record_key = text(c, 0, "record key")?;
            let id = keys
                .id_of(&record_key)
                .ok_or_else(|| corrupt(CorruptValue::new("record key")))?;
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
            let op = text(c, 0, "operation")?;
            let id = RecordId::new(scope.clone(), Operation::from_raw(op), key.clone());
            record_from_reply(id, c.get(1..).unwrap_or_default())
        })
        .collect()
}

/// `place`'s mark from the reply of `epoch.lua`: epoch, counter, created.
pub(crate) fn epoch_from_reply(place: String, items: &[Value]) -> Result<EpochMark, StoreError> {
    let epoch = text(items, 0, "epoch")?;
    let counter = u64::try_from(need(int(items, 1)?, "epoch counter")?)
        .map_err(|_| corrupt(CorruptValue::new("epoch counter")))?;
    let created = need(int(items, 2)?, "epoch reply")? == 1;
    Ok(EpochMark::new(place, epoch, counter, created))
}

/// A record without resource id or response from items 0..=5:
/// fingerprint, status, fence, created_at, lease_until, expires_at.
fn unfinished_record(id: RecordId, items: &[Value]) -> Result<Record, StoreError> {
    RecordColumns {
        fingerprint: bytes(items, 0)?,
        status: need(int(items, 1)?, "status")?,
        fence: need(int(items, 2)?, "fence")?,
        created_at: need(int(items, 3)?, "created_at")?,
        lease_until: int(items, 4)?,
        expires_at: need(int(items, 5)?, "expires_at")?,
        resource_id: None,
        response: None,
    }
    .into_record(id)
    .map_err(corrupt)
}

/// Reads reply item `i` as bytes.
fn bytes(items: &[Value], i: usize) -> Result<Vec<u8>, StoreError> {
    match items.get(i) {
        Some(Value::BulkString(b)) => Ok(b.clone()),
        Some(Value::SimpleString(s)) => Ok(s.clone().into_bytes()),
        Some(Value::Int(n)) => Ok(n.to_string().into_bytes()),
        _ => Err(corrupt(CorruptValue::new("reply"))),
    }
}

/// Reads reply item `i` as text, `what` for the error.
fn text(items: &[Value], i: usize, what: &'static str) -> Result<String, StoreError> {
    decode::text(bytes(items, i)?, what).map_err(corrupt)
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
                .ok_or_else(|| corrupt(CorruptValue::new("number")))
        }
    }
}

/// A number the reply must hold (an empty string is corrupt `what`).
fn need(v: Option<i64>, what: &'static str) -> Result<i64, StoreError> {
    v.ok_or_else(|| corrupt(CorruptValue::new(what)))
}

fn status_of(v: Option<i64>) -> Result<Status, StoreError> {
    decode::status(need(v, "status")?).map_err(corrupt)
}

/// The stored response and resource id at items 6..=9. A resource id is
/// stored as `s` and the id; anything else is none.
fn finished_parts(items: &[Value]) -> Result<(Option<String>, Option<StoredResponse>), StoreError> {
    let rid = bytes(items, 6)?;
    let resource_id = match rid.split_first() {
        Some((b's', rest)) => Some(decode::text(rest.to_vec(), "resource id").map_err(corrupt)?),
        _ => None,
    };
    let response = match int(items, 7)? {
        Some(code) => {
            Some(decode::response(code, &bytes(items, 8)?, bytes(items, 9)?).map_err(corrupt)?)
        }
        None => None,
    };
    Ok((resource_id, response))
}
