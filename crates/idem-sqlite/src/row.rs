//! Converting between SQLite rows and records: decoding what a query
//! selected, encoding a fence.

use idem_core::{
    Fence, Fingerprint, Key, Operation, Record, RecordId, Scope, Status, StoredResponse, Timestamp,
};
use rusqlite::Row;

/// The record's columns, as text for `concat!`.
macro_rules! columns {
    () => {
        "fingerprint, status, fence, created_at, lease_until, expires_at, \
         resource_id, response_status, response_headers, response_body"
    };
}

/// The columns every record query selects, in this order.
pub(crate) const COLUMNS: &str = columns!();

/// The record `(?1, ?2, ?3)` (scope, operation, key), as [`COLUMNS`].
pub(crate) const BY_ID: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM idem_records WHERE scope = ?1 AND operation = ?2 AND key = ?3"
);

/// The records of scope `?1` and key `?2` whatever the operation, live at
/// `?3`, newest first, at most `?4`: [`COLUMNS`] and then `operation`. The
/// key index's prefix (scope, key) finds them; `+` keeps the planner off
/// the expiry index, whatever its statistics.
pub(crate) const BY_KEY: &str = concat!(
    "SELECT ",
    columns!(),
    ", operation FROM idem_records WHERE scope = ?1 AND key = ?2 AND +expires_at > ?3 \
     ORDER BY created_at DESC, operation DESC LIMIT ?4"
);

fn corrupt(what: &str) -> rusqlite::Error {
    rusqlite::Error::InvalidColumnType(0, what.to_owned(), rusqlite::types::Type::Null)
}

/// Reads a record from a row of [`COLUMNS`].
pub(crate) fn record_from_row(id: &RecordId, row: &Row<'_>) -> rusqlite::Result<Record> {
    let fp: Vec<u8> = row.get(0)?;
    let fingerprint = Fingerprint::from_slice(&fp).ok_or_else(|| corrupt("fingerprint"))?;
    let status = Status::from_code(row.get(1)?).ok_or_else(|| corrupt("status"))?;
    let fence: i64 = row.get(2)?;
    let response = match row.get::<_, Option<i64>>(7)? {
        Some(code) => {
            let headers: Vec<u8> = row.get::<_, Option<Vec<u8>>>(8)?.unwrap_or_default();
            Some(StoredResponse {
                status: u16::try_from(code).map_err(|_| corrupt("response_status"))?,
                headers: StoredResponse::decode_headers(&headers)
                    .map_err(|_| corrupt("response_headers"))?,
                body: row.get::<_, Option<Vec<u8>>>(9)?.unwrap_or_default(),
            })
        }
        None => None,
    };
    Ok(Record {
        id: id.clone(),
        fingerprint,
        status,
        response,
        resource_id: row.get(6)?,
        created_at: Timestamp::from_millis(row.get(3)?),
        lease_until: row.get::<_, Option<i64>>(4)?.map(Timestamp::from_millis),
        fence: Fence::new(u64::try_from(fence).map_err(|_| corrupt("fence"))?),
        expires_at: Timestamp::from_millis(row.get(5)?),
    })
}

/// Reads a record from a row of [`COLUMNS`] followed by `scope, operation,
/// key` (the stale listing).
pub(crate) fn record_with_id_from_row(row: &Row<'_>) -> rusqlite::Result<Record> {
    let key: String = row.get(12)?;
    let key = Key::new(key).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(12, rusqlite::types::Type::Text, Box::new(e))
    })?;
    let id = RecordId::new(
        Scope::from_raw(row.get::<_, String>(10)?),
        Operation::from_raw(row.get::<_, String>(11)?),
        key,
    );
    record_from_row(&id, row)
}

/// Reads a record of `scope` and `key` from a row of [`COLUMNS`] followed
/// by `operation` (the look-up by key).
pub(crate) fn record_with_operation_from_row(
    scope: &Scope,
    key: &Key,
    row: &Row<'_>,
) -> rusqlite::Result<Record> {
    let id = RecordId::new(
        scope.clone(),
        Operation::from_raw(row.get::<_, String>(10)?),
        key.clone(),
    );
    record_from_row(&id, row)
}
