//! Converting between PostgreSQL rows and idem's types: decoding what a
//! query or the claim function returned; encoding a fence and a duration.

use std::time::Duration;

use idem_core::decode::{self, ClaimColumns, RecordColumns};
use idem_core::transition::FinishedParts;
use idem_core::{
    Claim, ClaimRequest, Key, Operation, Record, RecordId, Scope, StoreError, StoredResponse,
};
use tokio_postgres::Row;

use crate::error::{corrupt, pg_error};

/// The columns every record query selects, in this order.
pub(crate) const COLUMNS: &str = "fingerprint, status, fence, created_at, lease_until, expires_at, \
     resource_id, response_status, response_headers, response_body";

/// The claim from the row `idem_claim` returned for `req`.
pub(crate) fn claim_from_row(req: &ClaimRequest, row: &Row) -> Result<Claim, StoreError> {
    let get_err = |e| pg_error("reading the claim", e);
    let outcome: i16 = row.try_get(0).map_err(get_err)?;
    let answer = ClaimColumns {
        code: i64::from(outcome),
        fence: row.try_get(1).map_err(get_err)?,
        created_at: row.try_get(2).map_err(get_err)?,
        lease_until: row.try_get(3).map_err(get_err)?,
        expires_at: row.try_get(4).map_err(get_err)?,
    };
    let finished = || {
        let status: i16 = row.try_get(5).map_err(get_err)?;
        let status = decode::status(i64::from(status)).map_err(corrupt)?;
        let (resource_id, response) = finished_parts(row, "reading the claim")?;
        Ok(FinishedParts {
            status,
            resource_id,
            response,
        })
    };
    answer.into_claim(req, finished, corrupt)
}

/// A record from a row of [`COLUMNS`].
pub(crate) fn record_from_row(id: RecordId, row: &Row) -> Result<Record, StoreError> {
    let get_err = |e| pg_error("reading a record", e);
    let status: i16 = row.try_get(1).map_err(get_err)?;
    let (resource_id, response) = finished_parts(row, "reading a record")?;
    RecordColumns {
        fingerprint: row.try_get(0).map_err(get_err)?,
        status: i64::from(status),
        fence: row.try_get(2).map_err(get_err)?,
        created_at: row.try_get(3).map_err(get_err)?,
        lease_until: row.try_get(4).map_err(get_err)?,
        expires_at: row.try_get(5).map_err(get_err)?,
        resource_id,
        response,
    }
    .into_record(id)
    .map_err(corrupt)
}

/// A record from a row of [`COLUMNS`] followed by `scope, operation, key`
/// (the stale listing).
pub(crate) fn record_with_id_from_row(row: &Row) -> Result<Record, StoreError> {
    let get_err = |e| pg_error("listing stale records", e);
    let key = decode::key(row.try_get(12).map_err(get_err)?).map_err(corrupt)?;
    let id = RecordId::new(
        Scope::from_raw(row.try_get::<_, String>(10).map_err(get_err)?),
        Operation::from_raw(row.try_get::<_, String>(11).map_err(get_err)?),
        key,
    );
    record_from_row(id, row)
}

/// A record of `scope` and `key` from a row of [`COLUMNS`] followed by
/// `operation` (the look-up by key).
pub(crate) fn record_with_operation_from_row(
    scope: &Scope,
    key: &Key,
    row: &Row,
) -> Result<Record, StoreError> {
    let operation: String = row
        .try_get(10)
        .map_err(|e| pg_error("finding records by key", e))?;
    let id = RecordId::new(scope.clone(), Operation::from_raw(operation), key.clone());
    record_from_row(id, row)
}

/// The resource id and the stored response, at columns 6..=9 of a claim
/// row and of a row of [`COLUMNS`] alike.
fn finished_parts(
    row: &Row,
    context: &str,
) -> Result<(Option<String>, Option<StoredResponse>), StoreError> {
    let get_err = |e| pg_error(context, e);
    let resource_id = row.try_get(6).map_err(get_err)?;
    let status: Option<i32> = row.try_get(7).map_err(get_err)?;
    let response = decode::optional_response(
        status.map(i64::from),
        row.try_get(8).map_err(get_err)?,
        row.try_get(9).map_err(get_err)?,
    )
    .map_err(corrupt)?;
    Ok((resource_id, response))
}

/// A duration in milliseconds, as the schema and the claim function count
/// time.
pub(crate) fn millis(v: Duration) -> i64 {
    i64::try_from(v.as_millis()).unwrap_or(i64::MAX)
}
