//! Records and claims from result rows.

use idem_core::transition::{ClaimAnswer, ClaimCode, FinishedParts};
use idem_core::{
    Claim, ClaimRequest, Fence, Fingerprint, Key, Operation, Record, RecordId, Scope, Status,
    StoreError, StoredResponse, Timestamp,
};
use mysql_async::Row;
use mysql_async::prelude::FromValue;

use crate::error::corrupt;

/// Column `i` of `row` as a `T`; a missing or undecodable value is corrupt.
fn get<T: FromValue>(row: &Row, i: usize, what: &str) -> Result<T, StoreError> {
    match row.get_opt::<T, usize>(i) {
        Some(Ok(v)) => Ok(v),
        _ => Err(corrupt(what)),
    }
}

fn fence_from(v: i64) -> Result<Fence, StoreError> {
    u64::try_from(v)
        .map(Fence::new)
        .map_err(|_| corrupt("fence"))
}

fn text(bytes: Vec<u8>, what: &str) -> Result<String, StoreError> {
    String::from_utf8(bytes).map_err(|_| corrupt(what))
}

/// The claim from the row `idem_claim` returned for `req`.
pub(crate) fn claim_from_row(req: &ClaimRequest, row: &Row) -> Result<Claim, StoreError> {
    let outcome: i64 = get(row, 0, "claim outcome")?;
    let lease_until: Option<i64> = get(row, 3, "lease end")?;
    let answer = ClaimAnswer {
        code: ClaimCode::from_code(outcome).ok_or_else(|| corrupt("claim outcome"))?,
        fence: fence_from(get(row, 1, "fence")?)?,
        created_at: Timestamp::from_millis(get(row, 2, "creation time")?),
        lease_until: lease_until.map(Timestamp::from_millis),
        expires_at: Timestamp::from_millis(get(row, 4, "expiry")?),
    };
    let finished = || {
        let status: i64 = get(row, 5, "status")?;
        let status = Status::from_code(status).ok_or_else(|| corrupt("status"))?;
        let (resource_id, response) = finished_parts(row)?;
        Ok(FinishedParts {
            status,
            resource_id,
            response,
        })
    };
    answer.into_claim(req, finished, || corrupt("lease"))
}

/// A record from a row of [`crate::schema::COLUMNS`].
pub(crate) fn record_from_row(id: RecordId, row: &Row) -> Result<Record, StoreError> {
    let fp: Vec<u8> = get(row, 0, "fingerprint")?;
    let fingerprint = Fingerprint::from_slice(&fp).ok_or_else(|| corrupt("fingerprint"))?;
    let status: i64 = get(row, 1, "status")?;
    let status = Status::from_code(status).ok_or_else(|| corrupt("status"))?;
    let fence = fence_from(get(row, 2, "fence")?)?;
    let created_at = Timestamp::from_millis(get(row, 3, "creation time")?);
    let lease_until: Option<i64> = get(row, 4, "lease end")?;
    let expires_at = Timestamp::from_millis(get(row, 5, "expiry")?);
    let (resource_id, response) = finished_parts(row)?;
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

/// A record from a row of COLUMNS followed by `scope, operation,
/// record_key` (the stale listing).
pub(crate) fn record_with_id_from_row(row: &Row) -> Result<Record, StoreError> {
    let scope = text(get(row, 10, "scope")?, "scope")?;
    let operation = text(get(row, 11, "operation")?, "operation")?;
    let key = text(get(row, 12, "key")?, "key")?;
    let key = Key::new(key).map_err(|_| corrupt("key"))?;
    let id = RecordId::new(Scope::from_raw(scope), Operation::from_raw(operation), key);
    record_from_row(id, row)
}

/// A record of `scope` and `key` from a row of COLUMNS followed by
/// `operation` (the look-up by key).
pub(crate) fn record_with_operation_from_row(
    scope: &Scope,
    key: &Key,
    row: &Row,
) -> Result<Record, StoreError> {
    let operation = text(get(row, 10, "operation")?, "operation")?;
    let id = RecordId::new(scope.clone(), Operation::from_raw(operation), key.clone());
    record_from_row(id, row)
}

/// The resource id and the stored response, at columns 6..=9 of a claim
/// row and of a row of COLUMNS alike.
fn finished_parts(row: &Row) -> Result<(Option<String>, Option<StoredResponse>), StoreError> {
    let resource_id: Option<Vec<u8>> = get(row, 6, "resource id")?;
    let resource_id = resource_id.map(|r| text(r, "resource id")).transpose()?;
    let status: Option<i64> = get(row, 7, "response status")?;
    let headers: Option<Vec<u8>> = get(row, 8, "response headers")?;
    let body: Option<Vec<u8>> = get(row, 9, "response body")?;
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
