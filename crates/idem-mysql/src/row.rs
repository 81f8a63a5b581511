//! Records and claims from result rows: reading the columns; decoding
//! them is `idem_core::decode`'s.

use idem_core::decode::{self, ClaimColumns, CorruptValue, RecordColumns};
use idem_core::transition::FinishedParts;
use idem_core::{
    Claim, ClaimRequest, Key, Operation, Record, RecordId, Scope, StoreError, StoredResponse,
};
use mysql_async::Row;
use mysql_async::prelude::FromValue;

use crate::error::corrupt;

/// Column `i` of `row` as a `T`; a missing or undecodable value is corrupt.
fn get<T: FromValue>(row: &Row, i: usize, what: &'static str) -> Result<T, StoreError> {
    match row.get_opt::<T, usize>(i) {
        Some(Ok(v)) => Ok(v),
        _ => Err(corrupt(CorruptValue::new(what))),
    }
}

/// Column `i` of `row` as text stored in bytes.
fn text(row: &Row, i: usize, what: &'static str) -> Result<String, StoreError> {
    decode::text(get(row, i, what)?, what).map_err(corrupt)
}

/// The claim from the row `idem_claim` returned for `req` (none is a
/// corrupt answer).
pub(crate) fn claim_from_row(req: &ClaimRequest, row: Option<&Row>) -> Result<Claim, StoreError> {
    let row = row.ok_or_else(|| corrupt(CorruptValue::new("claim answer")))?;
    let answer = ClaimColumns {
        code: get(row, 0, "claim outcome")?,
        fence: get(row, 1, "fence")?,
        created_at: get(row, 2, "creation time")?,
        lease_until: get(row, 3, "lease end")?,
        expires_at: get(row, 4, "expiry")?,
    };
    let finished = || {
        let status = decode::status(get(row, 5, "status")?).map_err(corrupt)?;
        let (resource_id, response) = finished_parts(row)?;
        Ok(FinishedParts {
            status,
            resource_id,
            response,
        })
    };
    answer.into_claim(req, finished, corrupt)
}

/// A record from a row of [`crate::schema::COLUMNS`].
pub(crate) fn record_from_row(id: RecordId, row: &Row) -> Result<Record, StoreError> {
    let (resource_id, response) = finished_parts(row)?;
    RecordColumns {
        fingerprint: get(row, 0, "fingerprint")?,
        status: get(row, 1, "status")?,
        fence: get(row, 2, "fence")?,
        created_at: get(row, 3, "creation time")?,
        lease_until: get(row, 4, "lease end")?,
        expires_at: get(row, 5, "expiry")?,
        resource_id,
        response,
    }
    .into_record(id)
    .map_err(corrupt)
}

/// A record from a row of COLUMNS followed by `scope, operation,
/// record_key` (the stale listing).
pub(crate) fn record_with_id_from_row(row: &Row) -> Result<Record, StoreError> {
    let scope = text(row, 10, "scope")?;
    let operation = text(row, 11, "operation")?;
    let key = decode::key(text(row, 12, "key")?).map_err(corrupt)?;
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
    let operation = text(row, 10, "operation")?;
    let id = RecordId::new(scope.clone(), Operation::from_raw(operation), key.clone());
    record_from_row(id, row)
}

/// The resource id and the stored response, at columns 6..=9 of a claim
/// row and of a row of COLUMNS alike.
fn finished_parts(row: &Row) -> Result<(Option<String>, Option<StoredResponse>), StoreError> {
    let resource_id: Option<Vec<u8>> = get(row, 6, "resource id")?;
    let resource_id = resource_id
        .map(|r| decode::text(r, "resource id"))
        .transpose()
        .map_err(corrupt)?;
    let response = decode::optional_response(
        get(row, 7, "response status")?,
        get(row, 8, "response headers")?,
        get(row, 9, "response body")?,
    )
    .map_err(corrupt)?;
    Ok((resource_id, response))
}
