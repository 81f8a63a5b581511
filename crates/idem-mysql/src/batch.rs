//! Group commit: claims, completions and releases of concurrent requests
//! gathered by [`idem_core::batch::Batcher`] and sent as one transaction
//! each, in one round trip: a multi-statement text query `START
//! TRANSACTION; ...; COMMIT; SELECT 'idem-batch-committed'`; the last
//! set, the mark, says the COMMIT ran. A batch costs one round trip, one
//! transaction and one commit (one redo log flush) instead of one each
//! per call. Claims take two such steps ([`crate::batch_claims`]).
//!
//! Values go into the text as hex literals (`X'...'`, every column that
//! holds text or bytes is `VARBINARY` or `BLOB`) and integers formatted
//! by Rust: nothing a caller sends can end a literal, so nothing it sends
//! can become SQL.
//!
//! Each call gets the answer it would get alone:
//! - **claims**: [`crate::batch_claims`];
//! - **completions** are the fenced `UPDATE` of the single path, in id
//!   order, each also writing a token of its own call into `written_by`
//!   ([`tokens`]); one `SELECT` of the transaction's records before the
//!   `COMMIT` reads the tokens back: a call whose token is there completed
//!   its record, any other changed no row and is `StaleFence` (of two
//!   completions of one record, at most one matched its fence while it was
//!   in progress). One statement and one result set a call fewer than a
//!   `ROW_COUNT()` after each;
//! - **releases** are the fenced `DELETE`, each followed by `SELECT
//!   ROW_COUNT()` (a deleted row cannot be read back).
//!
//! A batch the server refuses (a deadlock with another transaction, a
//! value it cannot store) is rolled back and its calls are sent again
//! one at a time, so a poisoned call fails only itself. A batch whose
//! connection fails has an unknown outcome: every call in it fails
//! (closed: the caller does not execute; a claim that did commit lapses
//! with its lease, as a single claim cut off on the wire would).

use std::fmt::Write as _;
use std::sync::Arc;

use idem_core::batch::{BatchLost, OnRefusal, StoreBatchers, in_id_order, one_by_one};
use idem_core::{Settled, StoreError};
use mysql_async::Row;

use crate::batch_query::{
    batched, fenced, hex, id_tuple, one_row_each, query_limit, shape_error, tokens, transactions,
};
use crate::schema::quoted;
use crate::single::Inner;

/// The most batches in flight at once, each on a connection of its own.
const IN_FLIGHT: usize = 2;
/// The most calls in one batch.
const MAX_BATCH: usize = 128;
/// A completion whose statement alone is longer goes alone, as a
/// prepared statement (binary, not hex): a batch never carries one
/// response that could fill it.
const MAX_INLINE: usize = 256 << 10;

pub(crate) use idem_core::batch::{CompletionCall, ReleaseCall};

/// The store's three batchers, sending through `inner`'s pool. Must run
/// in a tokio runtime.
pub(crate) fn spawn(inner: &Arc<Inner>) -> StoreBatchers {
    let (i1, i2, i3) = (inner.clone(), inner.clone(), inner.clone());
    StoreBatchers::spawn(
        IN_FLIGHT,
        MAX_BATCH,
        move |calls| crate::batch_claims::claims(i1.clone(), calls, OnRefusal::OneAtATime),
        move |calls| completions(i2.clone(), calls, OnRefusal::OneAtATime),
        move |calls| releases(i3.clone(), calls, OnRefusal::OneAtATime),
    )
}

/// What a caller whose batch ended without its answer gets.
pub(crate) fn lost(e: BatchLost) -> StoreError {
    e.into_store_error("mysql")
}

/// A fenced statement's answer: its `ROW_COUNT()`.
fn row_count(row: &Row, what: &str) -> Result<Settled, StoreError> {
    match row.get_opt::<i64, _>(0) {
        Some(Ok(n)) => Ok(Settled::from_changed(u64::try_from(n).unwrap_or(0))),
        _ => Err(shape_error(what)),
    }
}

pub(crate) async fn completions(
    inner: Arc<Inner>,
    calls: Vec<CompletionCall>,
    on_refusal: OnRefusal,
) -> Vec<Result<Settled, StoreError>> {
    if calls.len() == 1 {
        return one_by_one(&calls, |(id, fence, c)| inner.complete_one(id, *fence, c)).await;
    }
    let table = format!("{}.idem_records", quoted(&inner.database));
    let headers: Vec<Vec<u8>> = calls
        .iter()
        .map(|(_, _, c)| c.response.encode_headers())
        .collect();
    // Call `i` writes the token `first + i`: a row read back with it is
    // the record that call completed, and no other call did.
    let first = tokens(calls.len());
    let statement = |out: &mut String, i: usize| {
        let (id, fence, c) = &calls[i];
        let _ = write!(
            out,
            "UPDATE {table} SET status = {}, resource_id = ",
            c.status().code()
        );
        match &c.resource_id {
            Some(r) => hex(out, r.as_bytes()),
            None => out.push_str("NULL"),
        }
        let _ = write!(
            out,
            ", response_status = {}, response_headers = ",
            c.response.status
        );
        hex(out, &headers[i]);
        out.push_str(", response_body = ");
        hex(out, &c.response.body);
        let token = first.wrapping_add(i as i64);
        let _ = write!(out, ", lease_until = NULL, written_by = {token}");
        fenced(out, id, *fence);
    };
    // One read of the transaction's records at its end, instead of a
    // `ROW_COUNT()` after each statement.
    let read_back = |carried: &[usize]| {
        let mut out =
            format!("SELECT written_by FROM {table} WHERE (scope, operation, record_key) IN (");
        for (n, &i) in carried.iter().enumerate() {
            out.push_str(if n == 0 { "(" } else { ",(" });
            id_tuple(&mut out, &calls[i].0);
        }
        out.push_str(");");
        out
    };
    let applied = |carried: &[usize], sets: Vec<Vec<Row>>| {
        let mut answers: Vec<Result<Settled, StoreError>> =
            carried.iter().map(|_| Ok(Settled::StaleFence)).collect();
        if sets.len() > 1 {
            return None;
        }
        for row in sets.iter().flatten() {
            let token = row.get_opt::<Option<i64>, usize>(0)?.ok()?;
            let Some(call) = token.and_then(|t| usize::try_from(t.wrapping_sub(first)).ok()) else {
                continue;
            };
            // A token of another transaction of this batch (an earlier
            // call of the id) answered its own call there.
            if let Some(at) = carried.iter().position(|&i| i == call) {
                answers[at] = Ok(Settled::Applied);
            }
        }
        Some(answers)
    };
    // A large answer goes alone (binary), the rest in batches.
    let size = |i: usize| 2 * (calls[i].2.response.body.len() + headers[i].len());
    let (inline, big): (Vec<usize>, Vec<usize>) = in_id_order(calls.iter().map(|(id, _, _)| id))
        .into_iter()
        .partition(|&i| size(i) <= MAX_INLINE);
    let txs = transactions(&inline, query_limit(&inner), statement, read_back);
    let mut answers = batched(
        &inner,
        &calls,
        txs,
        "completions",
        applied,
        |(id, fence, c)| inner.complete_one(id, *fence, c),
        on_refusal,
    )
    .await;
    for i in big {
        let (id, fence, c) = &calls[i];
        answers[i] = inner.complete_one(id, *fence, c).await;
    }
    answers
}

pub(crate) async fn releases(
    inner: Arc<Inner>,
    calls: Vec<ReleaseCall>,
    on_refusal: OnRefusal,
) -> Vec<Result<Settled, StoreError>> {
    if calls.len() == 1 {
        return one_by_one(&calls, |(id, fence)| inner.release_one(id, *fence)).await;
    }
    let table = format!("{}.idem_records", quoted(&inner.database));
    let statement = |out: &mut String, i: usize| {
        let (id, fence) = &calls[i];
        let _ = write!(out, "DELETE FROM {table}");
        fenced(out, id, *fence);
        out.push_str("SELECT ROW_COUNT();");
    };
    let order = in_id_order(calls.iter().map(|(id, _)| id));
    let txs = transactions(&order, query_limit(&inner), statement, |_| String::new());
    batched(
        &inner,
        &calls,
        txs,
        "releases",
        one_row_each(|_, row| row_count(row, "releases")),
        |(id, fence)| inner.release_one(id, *fence),
        on_refusal,
    )
    .await
}
