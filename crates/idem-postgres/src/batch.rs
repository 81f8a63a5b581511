//! Group commit: claims, completions and releases of concurrent requests
//! gathered by [`idem_core::batch::Batcher`] and sent as one statement
//! each (array parameters, one row of answer per call), so that a batch
//! costs one round trip, one transaction and one commit.
//!
//! Each call gets the answer it would get alone:
//! - **claims** (`idem_claim_many`) insert the keys that have no record
//!   in one statement, in the order of their ids; every other call (a
//!   key with a record, live, lapsed or expired, or the second of two
//!   calls for one key) then runs `idem_claim`, in the same order, and
//!   sees the inserts before it (the function's statements each take a
//!   fresh snapshot), so the second of two duplicates finds the first's
//!   claim in flight, as it would have a moment later alone. The one
//!   order makes deadlocks between two batches rare; one that happens is
//!   a refused batch (below).
//! - **completions and releases** run one fenced update or delete per
//!   call, finding the record by its primary key (`idem_complete_many`,
//!   `idem_release_many`; not a join, whose plan the statistics pick); a
//!   call whose fence no longer holds its record changes no row and is
//!   answered `StaleFence`, as alone.
//!
//! A batch the server refuses (one call's values poisoned it, a deadlock
//! with a transaction of someone else's) is sent again one call at a
//! time, so that a poisoned call fails only itself; a batch that meets
//! the connection down answers every call in it as that failure (fail
//! closed: the caller does not execute).

use std::sync::Arc;

use deadpool_postgres::Pool;
use idem_core::batch::{BatchLost, OnRefusal, StoreBatchers, all_failed, in_id_order, one_by_one};
use idem_core::{Claim, ClaimRequest, Settled, StoreError, StoreErrorKind};
use tokio_postgres::Row;

use crate::error::pg_error;
use crate::pooled::{Pooled, forget_changed_plans};
use crate::row::{self, millis};
use crate::schema::Statements;

/// The most batches of each kind in flight at once, each on a connection
/// of its own, unless the builder says otherwise (two against four:
/// fewer, bigger commits; docs/decisions.md).
pub(crate) const IN_FLIGHT: usize = 2;
/// The most batches of each kind the builder allows in flight.
pub(crate) const MOST_IN_FLIGHT: usize = 64;
/// The most calls in one batch.
const MAX_BATCH: usize = 256;

pub(crate) use idem_core::batch::{CompletionCall, ReleaseCall};

/// The store's three batchers, sending on `pool` with `sql`, at most
/// `in_flight` batches of each kind at once. Must run in a tokio runtime.
pub(crate) fn spawn(pool: &Pool, sql: &Arc<Statements>, in_flight: usize) -> StoreBatchers {
    let (p1, s1) = (pool.clone(), sql.clone());
    let (p2, s2) = (pool.clone(), sql.clone());
    let (p3, s3) = (pool.clone(), sql.clone());
    StoreBatchers::spawn(
        in_flight,
        MAX_BATCH,
        move |calls| claims(p1.clone(), s1.clone(), calls, OnRefusal::OneAtATime),
        move |calls| completions(p2.clone(), s2.clone(), calls, OnRefusal::OneAtATime),
        move |calls| releases(p3.clone(), s3.clone(), calls, OnRefusal::OneAtATime),
    )
}

/// What a caller whose batch ended without its answer gets.
pub(crate) fn lost(e: BatchLost) -> StoreError {
    e.into_store_error("postgres")
}

/// How a batch's statement ended.
enum Sent {
    /// Its rows.
    Rows(Vec<Row>),
    /// The server refused it: sent again one call at a time.
    Refused,
    /// No answer from the server (the connection, the pool): every call
    /// fails with a copy of this.
    Down(StoreErrorKind, String),
}

/// Sends `sql` with `params` on a pooled connection.
async fn send(
    pool: &Pool,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    what: &str,
) -> Sent {
    let client = match Pooled::get(pool).await {
        Ok(c) => c,
        Err(e) => return Sent::Down(e.kind(), e.to_string()),
    };
    let stmt = match client.prepare_cached(sql).await {
        Ok(stmt) => stmt,
        Err(e) => return client.answered(refused_or_down(what, e)),
    };
    let answer = client.query(&stmt, params).await;
    match client.answered(answer) {
        Ok(rows) => Sent::Rows(rows),
        Err(e) => {
            // A statement a migration changed under this connection: the
            // batch is refused (its calls go again alone, prepared again).
            forget_changed_plans(pool, &e);
            refused_or_down(what, e)
        }
    }
}

fn refused_or_down(what: &str, e: tokio_postgres::Error) -> Sent {
    if e.as_db_error().is_some() && !e.is_closed() {
        return Sent::Refused;
    }
    let e = pg_error(what, e);
    Sent::Down(e.kind(), e.to_string())
}

/// Each call's answer from the rows (`ord` in column `ord_at`, 1-based
/// in `order`), `missing` for calls without a row.
fn by_ordinal<T>(
    rows: &[Row],
    ord_at: usize,
    order: &[usize],
    answer: impl Fn(usize, &Row) -> Result<T, StoreError>,
    missing: impl Fn(usize) -> Result<T, StoreError>,
) -> Vec<Result<T, StoreError>> {
    let mut answers: Vec<Option<Result<T, StoreError>>> = order.iter().map(|_| None).collect();
    for row in rows {
        let position = row
            .try_get::<_, i64>(ord_at)
            .ok()
            .and_then(|ord| usize::try_from(ord).ok())
            .and_then(|ord| ord.checked_sub(1))
            .and_then(|ord| order.get(ord).copied());
        if let Some(i) = position
            && let Some(slot) = answers.get_mut(i)
        {
            *slot = Some(answer(i, row));
        }
    }
    answers
        .into_iter()
        .enumerate()
        .map(|(i, a)| a.unwrap_or_else(|| missing(i)))
        .collect()
}

/// A fenced update's or delete's answers: a call with a row applied, one
/// without found its fence stale.
fn settled(rows: &[Row], order: &[usize]) -> Vec<Result<Settled, StoreError>> {
    by_ordinal(
        rows,
        0,
        order,
        |_, _| Ok(Settled::Applied),
        |_| Ok(Settled::StaleFence),
    )
}

pub(crate) async fn claims(
    pool: Pool,
    sql: Arc<Statements>,
    calls: Vec<ClaimRequest>,
    on_refusal: OnRefusal,
) -> Vec<Result<Claim, StoreError>> {
    if calls.len() == 1 {
        return one_by_one(&calls, |req| crate::single::claim_one(&pool, &sql, req)).await;
    }
    let order = in_id_order(calls.iter().map(|c| &c.id));
    let ordered = || order.iter().map(|&i| &calls[i]);
    let scopes: Vec<&str> = ordered().map(|c| c.id.scope.as_str()).collect();
    let operations: Vec<&str> = ordered().map(|c| c.id.operation.as_str()).collect();
    let keys: Vec<&str> = ordered().map(|c| c.id.key.as_str()).collect();
    let fingerprints: Vec<&[u8]> = ordered().map(|c| c.fingerprint.as_bytes()).collect();
    let nows: Vec<i64> = ordered().map(|c| c.now.as_millis()).collect();
    let leases: Vec<i64> = ordered().map(|c| millis(c.lease)).collect();
    let ttls: Vec<i64> = ordered().map(|c| millis(c.ttl)).collect();
    let sent = send(
        &pool,
        &sql.claim_many,
        &[
            &scopes,
            &operations,
            &keys,
            &fingerprints,
            &nows,
            &leases,
            &ttls,
        ],
        "claiming (a batch)",
    )
    .await;
    match sent {
        Sent::Rows(rows) => by_ordinal(
            &rows,
            10,
            &order,
            |i, row| row::claim_from_row(&calls[i], row),
            |_| Err(missing("claim")),
        ),
        Sent::Refused => {
            one_by_one(&calls, |req| {
                on_refusal.answer("postgres", req, |req| {
                    crate::single::claim_one(&pool, &sql, req)
                })
            })
            .await
        }
        Sent::Down(kind, message) => all_failed(calls.len(), kind, &message),
    }
}

pub(crate) async fn completions(
    pool: Pool,
    sql: Arc<Statements>,
    calls: Vec<CompletionCall>,
    on_refusal: OnRefusal,
) -> Vec<Result<Settled, StoreError>> {
    if calls.len() == 1 {
        return one_by_one(&calls, |(id, fence, c)| {
            crate::single::complete_one(&pool, &sql, id, *fence, c)
        })
        .await;
    }
    let order = in_id_order(calls.iter().map(|(id, _, _)| id));
    let ordered = || order.iter().map(|&i| &calls[i]);
    let scopes: Vec<&str> = ordered().map(|(id, _, _)| id.scope.as_str()).collect();
    let operations: Vec<&str> = ordered().map(|(id, _, _)| id.operation.as_str()).collect();
    let keys: Vec<&str> = ordered().map(|(id, _, _)| id.key.as_str()).collect();
    let fences: Vec<i64> = ordered().map(|(_, f, _)| *f).collect();
    let statuses: Vec<i16> = ordered()
        .map(|(_, _, c)| c.status().code() as i16)
        .collect();
    let resource_ids: Vec<Option<&str>> = ordered()
        .map(|(_, _, c)| c.resource_id.as_deref())
        .collect();
    let response_statuses: Vec<i32> = ordered()
        .map(|(_, _, c)| i32::from(c.response.status))
        .collect();
    let headers: Vec<Vec<u8>> = ordered()
        .map(|(_, _, c)| c.response.encode_headers())
        .collect();
    let bodies: Vec<&[u8]> = ordered()
        .map(|(_, _, c)| c.response.body.as_slice())
        .collect();
    let sent = send(
        &pool,
        &sql.complete_many,
        &[
            &scopes,
            &operations,
            &keys,
            &fences,
            &statuses,
            &resource_ids,
            &response_statuses,
            &headers,
            &bodies,
        ],
        "completing (a batch)",
    )
    .await;
    match sent {
        Sent::Rows(rows) => settled(&rows, &order),
        Sent::Refused => {
            one_by_one(&calls, |call| {
                on_refusal.answer("postgres", call, |(id, fence, c)| {
                    crate::single::complete_one(&pool, &sql, id, *fence, c)
                })
            })
            .await
        }
        Sent::Down(kind, message) => all_failed(calls.len(), kind, &message),
    }
}

pub(crate) async fn releases(
    pool: Pool,
    sql: Arc<Statements>,
    calls: Vec<ReleaseCall>,
    on_refusal: OnRefusal,
) -> Vec<Result<Settled, StoreError>> {
    if calls.len() == 1 {
        return one_by_one(&calls, |(id, fence)| {
            crate::single::release_one(&pool, &sql, id, *fence)
        })
        .await;
    }
    let order = in_id_order(calls.iter().map(|(id, _)| id));
    let ordered = || order.iter().map(|&i| &calls[i]);
    let scopes: Vec<&str> = ordered().map(|(id, _)| id.scope.as_str()).collect();
    let operations: Vec<&str> = ordered().map(|(id, _)| id.operation.as_str()).collect();
    let keys: Vec<&str> = ordered().map(|(id, _)| id.key.as_str()).collect();
    let fences: Vec<i64> = ordered().map(|(_, f)| *f).collect();
    let sent = send(
        &pool,
        &sql.release_many,
        &[&scopes, &operations, &keys, &fences],
        "releasing (a batch)",
    )
    .await;
    match sent {
        Sent::Rows(rows) => settled(&rows, &order),
        Sent::Refused => {
            one_by_one(&calls, |call| {
                on_refusal.answer("postgres", call, |(id, fence)| {
                    crate::single::release_one(&pool, &sql, id, *fence)
                })
            })
            .await
        }
        Sent::Down(kind, message) => all_failed(calls.len(), kind, &message),
    }
}

fn missing(what: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Backend,
        format!("postgres store: a batched {what} got no row of answer"),
    )
}
