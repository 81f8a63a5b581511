//! Converting between SQLite rows and records.

use idem_core::{
    Fence, Fingerprint, Record, RecordId, Status, StoreError, StoreErrorKind, StoredResponse,
    Timestamp,
};
use rusqlite::Row;

/// The columns every record query selects, in this order.
pub(crate) const COLUMNS: &str = "fingerprint, status, fence, created_at, lease_until, expires_at, \
     resource_id, response_status, response_headers, response_body";

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

/// Maps a SQLite error to a store error: busy and I/O failures are
/// transient (`Unavailable`), bad stored data is `Corrupt`.
pub(crate) fn store_error(context: &str, e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode as C;
    let kind = match &e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            C::DatabaseBusy
            | C::DatabaseLocked
            | C::SystemIoFailure
            | C::DiskFull
            | C::OutOfMemory => StoreErrorKind::Unavailable,
            C::DatabaseCorrupt | C::NotADatabase => StoreErrorKind::Corrupt,
            _ => StoreErrorKind::Backend,
        },
        rusqlite::Error::InvalidColumnType(..) | rusqlite::Error::FromSqlConversionFailure(..) => {
            StoreErrorKind::Corrupt
        }
        _ => StoreErrorKind::Backend,
    };
    StoreError::new(kind, format!("sqlite store: {context}")).with_source(e)
}

/// A fence as SQLite stores it. Fences above `i64::MAX` were never handed
/// out, so they are stale by construction.
pub(crate) fn fence_to_sql(fence: Fence) -> Option<i64> {
    i64::try_from(fence.get()).ok()
}
