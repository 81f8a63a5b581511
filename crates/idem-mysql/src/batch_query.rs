//! One batch's query (`batch.rs`, `batch_claims.rs`): its text
//! (values as hex literals, transactions cut to a size, the commit mark),
//! sending it on a pooled connection, and reading each call's answer from
//! its result sets. Not what a batch holds or answers: that is the
//! batchers'.

use std::fmt::Write as _;

use idem_core::batch::OnRefusal;
use idem_core::{RecordId, StoreError, StoreErrorKind};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};

use crate::error::my_error;
use crate::single::Inner;

/// The most bytes of SQL text in one batch's query: completions past it
/// go in a further transaction (their bodies are in the text, as hex).
const MAX_QUERY: usize = 4 << 20;

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
pub(crate) fn fenced(out: &mut String, id: &RecordId, fence: i64) {
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
    // Each call's statement, by its position.
    let mut statements = vec![String::new(); order.iter().max().map_or(0, |m| m + 1)];
    for &i in order {
        statement(&mut statements[i], i);
    }
    transactions_of(
        order,
        limit,
        |i| statements[i].len(),
        |out, carried| {
            for &i in carried {
                out.push_str(&statements[i]);
            }
            out.push_str(&tail(carried));
        },
    )
}

/// `order`'s calls cut into transactions: each `START TRANSACTION;`, the
/// `body` of the calls it carries, `COMMIT;` and the commit mark, with
/// the positions it carries. A transaction takes calls while their
/// `size`s (what each adds to the body at most) stay within `limit`; a
/// call alone over it still gets one.
pub(crate) fn transactions_of(
    order: &[usize],
    limit: usize,
    size: impl Fn(usize) -> usize,
    body: impl Fn(&mut String, &[usize]),
) -> Vec<(String, Vec<usize>)> {
    let frame = "START TRANSACTION;COMMIT;".len() + COMMITTED.len();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut carried = Vec::new();
    let mut bytes = frame;
    for &i in order {
        let one = size(i);
        if !carried.is_empty() && bytes.saturating_add(one) > limit {
            groups.push(std::mem::take(&mut carried));
            bytes = frame;
        }
        carried.push(i);
        bytes = bytes.saturating_add(one);
    }
    if !carried.is_empty() {
        groups.push(carried);
    }
    groups
        .into_iter()
        .map(|carried| {
            let mut query = String::from("START TRANSACTION;");
            body(&mut query, &carried);
            query.push_str("COMMIT;");
            query.push_str(COMMITTED);
            (query, carried)
        })
        .collect()
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

/// `(scope, operation, record_key)`'s values for `id`, as hex literals,
/// and the closing parenthesis.
pub(crate) fn id_tuple(out: &mut String, id: &RecordId) {
    id_values(out, id);
    out.push(')');
}

/// `id`'s scope, operation and key as hex literals, between commas.
pub(crate) fn id_values(out: &mut String, id: &RecordId) {
    hex(out, id.scope.as_str().as_bytes());
    out.push(',');
    hex(out, id.operation.as_str().as_bytes());
    out.push(',');
    hex(out, id.key.as_str().as_bytes());
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
