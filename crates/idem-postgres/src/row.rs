//! Converting between PostgreSQL rows and idem's types: decoding what a
//! query or the claim function returned; encoding a fence and a duration.

use std::time::Duration;

use idem_core::transition::{ClaimAnswer, ClaimCode, FinishedParts};
use idem_core::{
    Claim, ClaimRequest, Fence, Fingerprint, Key, Operation, Record, RecordId, Scope, Status,
    StoreError, StoredResponse, Timestamp,
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
    let lease_until: Option<i64> = row.try_get(3).map_err(get_err)?;
    let answer = ClaimAnswer {
        code: ClaimCode::from_code(i64::from(outcome)).ok_or_else(|| corrupt("claim outcome"))?,
        fence: fence_from(row.try_get(1).map_err(get_err)?)?,
        created_at: Timestamp::from_millis(row.try_get(2).map_err(get_err)?),
        lease_until: lease_until.map(Timestamp::from_millis),
        expires_at: Timestamp::from_millis(row.try_get(4).map_err(get_err)?),
    };
    let finished = || {
        let status: i16 = row.try_get(5).map_err(get_err)?;
        let status = Status::from_code(i64::from(status)).ok_or_else(|| corrupt("status"))?;
        let (resource_id, response) = finished_parts(row, "reading the claim")?;
        Ok(FinishedParts {
            status,
            resource_id,
            response,
        })
    };
    answer.into_claim(req, finished, || corrupt("lease"))
}

/// A record from a row of [`COLUMNS`].
pub(crate) fn record_from_row(id: RecordId, row: &Row) -> Result<Record, StoreError> {
    let get_err = |e| pg_error("reading a record", e);
    let fp: Vec<u8> = row.try_get(0).map_err(get_err)?;
    let status: i16 = row.try_get(1).map_err(get_err)?;
    let fingerprint = Fingerprint::from_slice(&fp).ok_or_else(|| corrupt("fingerprint"))?;
    let status = Status::from_code(i64::from(status)).ok_or_else(|| corrupt("status"))?;
    let fence = fence_from(row.try_get(2).map_err(get_err)?)?;
    let created_at = Timestamp::from_millis(row.try_get(3).map_err(get_err)?);
    let lease_until: Option<i64> = row.try_get(4).map_err(get_err)?;
    let expires_at = Timestamp::from_millis(row.try_get(5).map_err(get_err)?);
    let (resource_id, response) = finished_parts(row, "reading a record")?;
    Ok(Record {
        id,
        fingerprint,
        status,
        fence,
        created_at,
        lease_until: lease_until.map(Timestamp::from_millis),
        expires_at,
        resource_id,
        response,
    })
}

/// A record from a row of [`COLUMNS`] followed by `scope, operation, key`
/// (the stale listing).
pub(crate) fn record_with_id_from_row(row: &Row) -> Result<Record, StoreError> {
    let get_err = |e| pg_error("listing stale records", e);
    let key =
        Key::new(row.try_get::<_, String>(12).map_err(get_err)?).map_err(|_| corrupt("key"))?;
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
    let headers: Option<Vec<u8>> = row.try_get(8).map_err(get_err)?;
    let body: Option<Vec<u8>> = row.try_get(9).map_err(get_err)?;
    let Some(status) = status else {
        return Ok((resource_id, None));
    };
    let response = StoredResponse {
        status: u16::try_from(status).map_err(|_| corrupt("response status"))?,
        headers: StoredResponse::decode_headers(&headers.unwrap_or_default())
            .map_err(|_| corrupt("response headers"))?,
        body: body.unwrap_or_default(),
    };
    Ok((resource_id, Some(response)))
}

pub(crate) fn fence_from(v: i64) -> Result<Fence, StoreError> {
    u64::try_from(v)
        .map(Fence::new)
        .map_err(|_| corrupt("fence"))
}

/// A duration in milliseconds, as the schema and the claim function count
/// time.
pub(crate) fn millis(v: Duration) -> i64 {
    i64::try_from(v.as_millis()).unwrap_or(i64::MAX)
}
