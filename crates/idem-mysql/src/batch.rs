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
use idem_core::{RecordId, Settled, StoreError, StoreErrorKind};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};

use crate::error::my_error;
use crate::schema::quoted;
use crate::single::Inner;

/// The most batches in flight at once, each on a connection of its own.
const IN_FLIGHT: usize = 2;
/// The most calls in one batch.
const MAX_BATCH: usize = 128;
/// The most bytes of SQL text in one batch's query: completions past it
/// go in a further transaction (their bodies are in the text, as hex).
const MAX_QUERY: usize = 4 << 20;
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

/// `bytes` as a hex literal. Two digits a byte from a table: `write!`
/// with `{:02x}` went through the formatter for every byte, a few per
/// cent of the gateway's CPU a key under load (perf, BENCHMARKS.md).
pub(crate) fn hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(bytes.len() * 2 + 3);
    out.push_str("X'");
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out.push('\'');
}

/// `WHERE` of the fenced statements: the record's id and fence, in
/// progress.
fn fenced(out: &mut String, id: &RecordId, fence: i64) {
    out.push_str(" WHERE scope = ");
    hex(out, id.scope.as_str().as_bytes());
    out.push_str(" AND operation = ");
    hex(out, id.operation.as_str().as_bytes());
    out.push_str(" AND record_key = ");
    hex(out, id.key.as_str().as_bytes());
    let _ = write!(out, " AND fence = {fence} AND status = 0;");
}

/// How a batch's query ended.
pub(crate) enum Sent {
    /// The rows of each result set that has rows, in order.
    Sets(Vec<Vec<Row>>),
    /// The server refused a statement: the transaction was rolled back
    /// (nothing of it happened), so its calls can be sent again alone.
    Refused,
    /// No answer, or a broken one: the outcome is unknown.
    Down(StoreErrorKind, String),
}

/// Runs `query` (a whole transaction) on a pooled connection.
pub(crate) async fn send(inner: &Inner, query: &str, what: &str) -> Sent {
    let mut conn = match inner.conn().await {
        Ok(c) => c,
        Err(e) => return Sent::Down(e.kind(), e.to_string()),
    };
    // Past the bound the connection is dropped mid-query (it never serves
    // again) and the batch's outcome is unknown (`Inner::call_bound`).
    let ran = tokio::time::timeout(inner.call_bound(), run(&mut conn, query)).await;
    let Ok(ran) = ran else {
        // Closed, not handed back: the pool would read the rest of the
        // batch on it and hand it out again with whatever transaction the
        // rest left open. `disconnect` marks it gone before it writes.
        let bound = inner.call_bound();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(bound, conn.disconnect()).await;
        });
        return Sent::Down(
            StoreErrorKind::Unavailable,
            format!("mysql store: {what}: no answer in time"),
        );
    };
    let ran = ran.map(|mut sets| committed(&mut sets).then_some(sets));
    match ran {
        Ok(Some(sets)) => Sent::Sets(sets),
        // The server refused a statement: those after it did not run, the
        // COMMIT and its mark included (the driver does not always say
        // so with an error: the mark is what tells). Roll back what ran
        // before it; a connection that cannot is closed, and the server
        // rolls back with it.
        Ok(None) | Err(mysql_async::Error::Server(_)) => {
            if conn.query_drop("ROLLBACK").await.is_err() {
                let _ = conn.disconnect().await;
            }
            Sent::Refused
        }
        Err(e) => {
            let e = my_error(what, e);
            Sent::Down(e.kind(), e.to_string())
        }
    }
}

/// The mark a batch's query ends with, after its `COMMIT`: a set with
/// this one value says the COMMIT ran.
pub(crate) const COMMITTED: &str = "SELECT 'idem-batch-committed'";

/// Whether the last set is the commit mark (taken off `sets`).
fn committed(sets: &mut Vec<Vec<Row>>) -> bool {
    let marked = sets.last().is_some_and(|last| {
        last.len() == 1
            && last[0].len() == 1
            && last[0]
                .get_opt::<String, _>(0)
                .and_then(Result::ok)
                .as_deref()
                == Some("idem-batch-committed")
    });
    if marked {
        sets.pop();
    }
    marked
}

async fn run(conn: &mut Conn, query: &str) -> Result<Vec<Vec<Row>>, mysql_async::Error> {
    let mut result = conn.query_iter(query).await?;
    let mut sets = Vec::new();
    while !result.is_empty() {
        let rows: Vec<Row> = result.collect().await?;
        if !rows.is_empty() {
            sets.push(rows);
        }
    }
    // An error that ended the statements early is kept by the driver as
    // pending, not returned above: this returns it, and leaves the
    // connection ready for the ROLLBACK.
    result.drop_result().await?;
    Ok(sets)
}

/// The answers of the calls a transaction carried, in their order, read
/// from its result sets; `None` when the server answered another shape.
pub(crate) type Answers<T> = Option<Vec<Result<T, StoreError>>>;

/// Answers from one result set of one row per carried call, each read by
/// `read`.
pub(crate) fn one_row_each<T>(
    read: impl Fn(usize, &Row) -> Result<T, StoreError>,
) -> impl Fn(&[usize], Vec<Vec<Row>>) -> Answers<T> {
    move |carried, sets| {
        if sets.len() != carried.len() {
            return None;
        }
        carried
            .iter()
            .zip(sets)
            .map(|(&i, rows)| match rows.as_slice() {
                [row] => Some(read(i, row)),
                _ => None,
            })
            .collect()
    }
}

pub(crate) fn shape_error(what: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Backend,
        format!("mysql store: a batch of {what} got answers of another shape than its calls"),
    )
}

/// The first of `n` numbers no other batch uses (`written_by`): a random
/// start for the process, advanced by `n` a draw. Two processes collide
/// only if their ranges overlap: about one chance in 2^64 per number
/// drawn, and a collision needs the same record too.
pub(crate) fn tokens(n: usize) -> i64 {
    use std::hash::BuildHasher;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    let next = NEXT.get_or_init(|| {
        // `RandomState` is seeded from the operating system's randomness.
        AtomicU64::new(std::collections::hash_map::RandomState::new().hash_one(0u8))
    });
    // Wrapping, as the counter does: a token is a bit pattern, not a count.
    next.fetch_add(n as u64, Ordering::Relaxed) as i64
}

/// The most bytes of SQL text in one query on this server: [`MAX_QUERY`],
/// or half its `max_allowed_packet` if that is less (a query longer than
/// the packet limit is refused by the driver itself, as a broken
/// connection).
pub(crate) fn query_limit(inner: &Inner) -> usize {
    usize::try_from(inner.max_packet / 2)
        .unwrap_or(usize::MAX)
        .min(MAX_QUERY)
}

/// The statements of `calls` in `order`, cut into transactions of at
/// most `limit` bytes, each with the positions it carries and, before its
/// `COMMIT`, the `tail` of those positions (statements that read back
/// what the transaction did).
pub(crate) fn transactions(
    order: &[usize],
    limit: usize,
    mut statement: impl FnMut(&mut String, usize),
    tail: impl Fn(&[usize]) -> String,
) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    let mut query = String::from("START TRANSACTION;");
    let mut carried = Vec::new();
    for &i in order {
        let mut one = String::new();
        statement(&mut one, i);
        if !carried.is_empty() && query.len() + one.len() > limit {
            query.push_str(&tail(&carried));
            query.push_str("COMMIT;");
            query.push_str(COMMITTED);
            out.push((std::mem::take(&mut query), std::mem::take(&mut carried)));
            query.push_str("START TRANSACTION;");
        }
        query.push_str(&one);
        carried.push(i);
    }
    if !carried.is_empty() {
        query.push_str(&tail(&carried));
        query.push_str("COMMIT;");
        query.push_str(COMMITTED);
        out.push((query, carried));
    }
    out
}

/// Runs the transactions, the answers of the calls each carried read from
/// its result sets by `answers_of` (in the order of the calls it carried;
/// `None` for sets of another shape); a refused transaction's calls go
/// again alone (or fail, as `on_refusal` says), one that met the
/// connection down fails every call it carried.
pub(crate) async fn batched<'c, C, T, Fut>(
    inner: &Inner,
    calls: &'c [C],
    txs: Vec<(String, Vec<usize>)>,
    what: &str,
    answers_of: impl Fn(&[usize], Vec<Vec<Row>>) -> Answers<T>,
    alone: impl Fn(&'c C) -> Fut,
    on_refusal: OnRefusal,
) -> Vec<Result<T, StoreError>>
where
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut answers: Vec<Option<Result<T, StoreError>>> = calls.iter().map(|_| None).collect();
    for (query, carried) in txs {
        match send(inner, &query, what).await {
            Sent::Sets(sets) => match answers_of(&carried, sets) {
                Some(read) if read.len() == carried.len() => {
                    for (&i, answer) in carried.iter().zip(read) {
                        answers[i] = Some(answer);
                    }
                }
                Some(_) | None => {
                    for &i in &carried {
                        answers[i] = Some(Err(shape_error(what)));
                    }
                }
            },
            Sent::Refused => {
                for &i in &carried {
                    answers[i] = Some(on_refusal.answer("mysql", &calls[i], &alone).await);
                }
            }
            Sent::Down(kind, message) => {
                for &i in &carried {
                    answers[i] = Some(Err(StoreError::new(kind, message.clone())));
                }
            }
        }
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(shape_error(what))))
        .collect()
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

/// `(scope, operation, record_key)`'s values for `id`, as hex literals,
/// and the closing parenthesis.
pub(crate) fn id_tuple(out: &mut String, id: &RecordId) {
    hex(out, id.scope.as_str().as_bytes());
    out.push(',');
    hex(out, id.operation.as_str().as_bytes());
    out.push(',');
    hex(out, id.key.as_str().as_bytes());
    out.push(')');
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
mod hex_tests {
    /// Every byte value, and none: two lower-case digits a byte between
    /// `X'` and `'`, as the formatter writes them.
    #[test]
    fn every_byte_is_two_lower_case_digits() {
        let all: Vec<u8> = (0..=255).collect();
        let mut out = String::new();
        super::hex(&mut out, &all);
        let expected: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(out, format!("X'{expected}'"));
        let mut empty = String::new();
        super::hex(&mut empty, b"");
        assert_eq!(empty, "X''");
    }
}
