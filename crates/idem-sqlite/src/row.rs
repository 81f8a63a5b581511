//! Converting between SQLite rows and records: decoding what a query
//! selected, encoding a fence.

use idem_core::decode::{self, CorruptValue, RecordColumns};
use idem_core::{Key, Operation, Record, RecordId, Scope};
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

/// A stored value that does not decode, as an error of row mapping (which
/// must return rusqlite's errors): an invalid column type, which
/// `sqlite_error` makes `Corrupt`.
fn corrupt(value: CorruptValue) -> rusqlite::Error {
    rusqlite::Error::InvalidColumnType(0, value.what().to_owned(), rusqlite::types::Type::Null)
}

/// Reads a record from a row of [`COLUMNS`].
pub(crate) fn record_from_row(id: &RecordId, row: &Row<'_>) -> rusqlite::Result<Record> {
    let response = match row.get::<_, Option<i64>>(7)? {
        Some(code) => {
            let headers: Vec<u8> = row.get::<_, Option<Vec<u8>>>(8)?.unwrap_or_default();
            let body = row.get::<_, Option<Vec<u8>>>(9)?.unwrap_or_default();
            Some(decode::response(code, &headers, body).map_err(corrupt)?)
        }
        None => None,
    };
    RecordColumns {
        fingerprint: row.get(0)?,
        status: row.get(1)?,
        fence: row.get(2)?,
        created_at: row.get(3)?,
        lease_until: row.get(4)?,
        expires_at: row.get(5)?,
        resource_id: row.get(6)?,
        response,
    }
    .into_record(id.clone())
    .map_err(corrupt)
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
