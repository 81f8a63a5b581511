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
//! - **completions** are one `UPDATE` a transaction, set-wise
//!   ([`SetWiseCompletion`]): the rows whose (id, fence) a call names, in
//!   progress, each given its call's answer and a token of its own call
//!   in `written_by` ([`tokens`]); one `SELECT` of the transaction's
//!   records before the `COMMIT` reads the tokens back: a call whose
//!   token is there completed its record, any other changed no row and is
//!   `StaleFence`. A call whose fence is already in the batch (the same
//!   completion twice, or a wrong fence) goes alone after it, as it would
//!   after the first: of two completions of one record at most one
//!   applies. MariaDB answers each statement of a query with a packet of
//!   its own, and parses and plans each: one statement for the batch
//!   instead of one a call;
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
    batched, fenced, hex, id_tuple, id_values, one_row_each, query_limit, shape_error, tokens,
    transactions, transactions_of,
};
use crate::schema::{RECORDS_BY_ID, quoted};
use crate::single::Inner;

/// The most batches of each kind in flight at once, each on a connection
/// of its own, unless a share of them is taken
/// (`MysqlStoreBuilder::thread_share`).
pub(crate) const IN_FLIGHT: usize = 2;
/// The most calls in one batch.
const MAX_BATCH: usize = 128;
/// A completion whose statement alone is longer goes alone, as a
/// prepared statement (binary, not hex): a batch never carries one
/// response that could fill it.
const MAX_INLINE: usize = 256 << 10;

pub(crate) use idem_core::batch::{CompletionCall, ReleaseCall};

/// The store's three batchers, sending through `inner`'s pool, at most
/// `in_flight` batches of each kind at once. Must run in a tokio runtime.
pub(crate) fn spawn(inner: &Arc<Inner>, in_flight: usize) -> StoreBatchers {
    let (i1, i2, i3) = (inner.clone(), inner.clone(), inner.clone());
    StoreBatchers::spawn(
        in_flight,
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
    let table = format!("{}.{RECORDS_BY_ID}", quoted(&inner.database));
    let headers: Vec<Vec<u8>> = calls
        .iter()
        .map(|(_, _, c)| c.response.encode_headers())
        .collect();
    // Call `i` writes the token `first + i`: a row read back with it is
    // the record that call completed, and no other call did.
    let first = tokens(calls.len());
    let size = |i: usize| 2 * (calls[i].2.response.body.len() + headers[i].len());
    // In id order: the set-wise statement locks its rows in that order,
    // as the calls alone would be sent.
    let mut inline = Vec::new();
    let mut after = Vec::new();
    let mut fences = std::collections::HashSet::new();
    for i in in_id_order(calls.iter().map(|(id, _, _)| id)) {
        // A fence already in the batch (the same completion sent twice,
        // or a caller's wrong fence) goes after the batch, alone, as it
        // would be sent after the first; so does a large answer (binary).
        let repeated = !fences.insert(calls[i].1);
        if repeated || size(i) > MAX_INLINE {
            after.push(i);
        } else {
            inline.push(i);
        }
    }
    let completion = SetWiseCompletion {
        table: &table,
        calls: &calls,
        headers: &headers,
        first,
    };
    let txs = transactions_of(
        &inline,
        query_limit(&inner).saturating_sub(FIXED_TEXT),
        |i| completion.most_text(i),
        |out, carried| completion.write(out, carried),
    );
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
    for i in after {
        let (id, fence, c) = &calls[i];
        answers[i] = inner.complete_one(id, *fence, c).await;
    }
    answers
}

/// Room left in a query for the text of a transaction of completions
/// that is not any one call's: the statements' words and the table's
/// name, twice.
const FIXED_TEXT: usize = 4096;

/// The text of a transaction of completions, set-wise: one `UPDATE` of
/// every record it completes, and one read of their tokens.
///
/// The `UPDATE` finds its rows by (id, fence), in progress, through the
/// primary key, and takes each column's new value from a `CASE` on the
/// row's fence. The fences of one transaction are distinct (a repeated
/// one goes alone, after), and a row matches only a pair of its own id
/// and fence, so the fence names the one call whose pair the row
/// matched: no row takes another call's answer, whatever fences callers
/// send. A row without a branch cannot happen; if it did, its `NULL`
/// status would be refused in strict mode and the batch would go again
/// call by call. The values are `CASE` results, not rows of a derived
/// table: MariaDB cut long literals of a derived table short without an
/// error (docs/decisions.md).
pub(crate) struct SetWiseCompletion<'a> {
    /// The records table, by id ([`RECORDS_BY_ID`]), with its database.
    pub(crate) table: &'a str,
    pub(crate) calls: &'a [CompletionCall],
    /// Each call's headers, encoded.
    pub(crate) headers: &'a [Vec<u8>],
    /// The token of the first call (`first + i` is call `i`'s).
    pub(crate) first: i64,
}

impl SetWiseCompletion<'_> {
    /// The most text call `i` adds to its transaction: its three values
    /// in hex, its id in hex twice (the `WHERE` and the read), and room
    /// for the rest (six branches of about 30 characters with a fence
    /// each, a token, two statuses, the id's punctuation: under 300).
    fn most_text(&self, i: usize) -> usize {
        let (id, _, c) = &self.calls[i];
        let id_bytes =
            id.scope.as_str().len() + id.operation.as_str().len() + id.key.as_str().len();
        let values = c.resource_id.as_ref().map_or(0, String::len)
            + self.headers[i].len()
            + c.response.body.len();
        4 * id_bytes + 2 * values + 512
    }

    /// The `UPDATE` of the `carried` calls (their fences distinct) and the
    /// read of their tokens.
    pub(crate) fn write(&self, out: &mut String, carried: &[usize]) {
        let table = self.table;
        let _ = write!(out, "UPDATE {table} SET written_by = CASE fence");
        self.branches(out, carried, |out, i| {
            let _ = write!(out, "{}", self.first.wrapping_add(i as i64));
        });
        out.push_str(" END, status = CASE fence");
        self.branches(out, carried, |out, i| {
            let _ = write!(out, "{}", self.calls[i].2.status().code());
        });
        out.push_str(" END, resource_id = CASE fence");
        self.branches(out, carried, |out, i| match &self.calls[i].2.resource_id {
            Some(r) => hex(out, r.as_bytes()),
            None => out.push_str("NULL"),
        });
        out.push_str(" END, response_status = CASE fence");
        self.branches(out, carried, |out, i| {
            let _ = write!(out, "{}", self.calls[i].2.response.status);
        });
        out.push_str(" END, response_headers = CASE fence");
        self.branches(out, carried, |out, i| hex(out, &self.headers[i]));
        out.push_str(" END, response_body = CASE fence");
        self.branches(out, carried, |out, i| {
            hex(out, &self.calls[i].2.response.body);
        });
        out.push_str(" END, lease_until = NULL WHERE (scope, operation, record_key, fence) IN (");
        for (n, &i) in carried.iter().enumerate() {
            let (id, fence, _) = &self.calls[i];
            out.push_str(if n == 0 { "(" } else { ",(" });
            id_values(out, id);
            let _ = write!(out, ",{fence})");
        }
        out.push_str(") AND status = 0;");
        // One read of the transaction's records at its end, instead of a
        // `ROW_COUNT()` after each statement.
        let _ = write!(
            out,
            "SELECT written_by FROM {table} WHERE (scope, operation, record_key) IN ("
        );
        for (n, &i) in carried.iter().enumerate() {
            out.push_str(if n == 0 { "(" } else { ",(" });
            id_tuple(out, &self.calls[i].0);
        }
        out.push_str(");");
    }

    /// ` WHEN {fence} THEN {value}` for each carried call.
    fn branches(&self, out: &mut String, carried: &[usize], value: impl Fn(&mut String, usize)) {
        for &i in carried {
            let _ = write!(out, " WHEN {} THEN ", self.calls[i].1);
            value(out, i);
        }
    }
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

#[cfg(test)]
mod set_wise_text_tests {
    use idem_core::{Completion, Key, Operation, RecordId, Scope};

    use super::{CompletionCall, FIXED_TEXT, SetWiseCompletion};

    /// What each call adds to a transaction's text stays within what
    /// `most_text` promised for it, and the rest within `FIXED_TEXT`, for
    /// ids at the columns' longest and shortest, answers of every kind
    /// (headers and resource ids in the KiB range, bodies up to 64 KiB),
    /// fences and tokens of every width, and a database name at MySQL's
    /// longest: a transaction is cut by those promises, and a query past
    /// the server's packet limit would fail the whole batch.
    #[test]
    fn each_call_stays_within_the_text_promised_for_it() {
        let mut calls: Vec<CompletionCall> = Vec::new();
        let ids = [
            ("s".to_owned(), "o".to_owned(), 1),
            ("S".repeat(512), format!("POST /{}", "o".repeat(1018)), 250),
        ];
        let mut n = 0usize;
        for (scope, operation, key_length) in &ids {
            for body in [0usize, 7, 64 << 10] {
                for resource in [None, Some(String::new()), Some("r".repeat(3000))] {
                    for fence in [0i64, -1, i64::MAX, i64::MIN] {
                        n += 1;
                        let key = format!("{n:0>key_length$}");
                        let id = RecordId::new(
                            Scope::from_raw(scope.clone()),
                            Operation::from_raw(operation.clone()),
                            Key::new(key).expect("key"),
                        );
                        let mut response = idem_testkit::response(599, &"h".repeat(n * 97 % 5000));
                        response.body = vec![0xff; body];
                        let done = Completion::failed(response);
                        let done = match &resource {
                            Some(r) => done.with_resource_id(r.clone()),
                            None => done,
                        };
                        calls.push((id, fence, done));
                    }
                }
            }
        }
        let headers: Vec<Vec<u8>> = calls
            .iter()
            .map(|(_, _, c)| c.response.encode_headers())
            .collect();
        let table = format!("`{}`.{}", "d".repeat(64), crate::schema::RECORDS_BY_ID);
        let all: Vec<usize> = (0..calls.len()).collect();
        for first in [0i64, i64::MAX, i64::MIN] {
            let completion = SetWiseCompletion {
                table: &table,
                calls: &calls,
                headers: &headers,
                first,
            };
            let text = |carried: &[usize]| {
                let mut out = String::new();
                completion.write(&mut out, carried);
                out.len()
            };
            let whole = text(&all);
            for &i in &all {
                let without: Vec<usize> = all.iter().copied().filter(|&j| j != i).collect();
                let added = whole - text(&without);
                let promised = completion.most_text(i);
                assert!(
                    added <= promised,
                    "call {i} added {added} bytes, {promised} promised"
                );
            }
            assert!(text(&all[..1]) - completion.most_text(0) <= FIXED_TEXT);
        }
    }
}
