//! A batch of claims (`batch.rs`), in two steps, each one
//! transaction and one round trip:
//! - **new keys, set-wise**: the first call of each id is inserted by one
//!   multi-row `INSERT ... VALUES ... ON DUPLICATE KEY UPDATE` that leaves
//!   a key with a record as it is, every new row with the batch's token in
//!   `written_by`; the rows with that token are read back (their fences)
//!   in the same transaction, so the batch answers acquired exactly the
//!   calls whose rows it inserted, and no row another transaction wrote (a
//!   key another transaction inserts meanwhile makes this insert wait for
//!   it, and is then left as theirs);
//! - **the rest**: every other call (a key that has a record, live,
//!   lapsed or expired, or a later call of an id the first step inserted)
//!   calls `idem_claim_in_tx` in id order in one transaction, as the batch
//!   did for every call before, and gets the answer it would get a moment
//!   later alone (a later call of a new id finds its claim in flight).
//!
//! A step the server refuses goes a call at a time (or fails, as the
//! [`OnRefusal`] says); a step that meets the connection down fails every
//! call it carried (closed: a claim that did commit lapses with its
//! lease), and the second step does not run.

use std::fmt::Write as _;
use std::sync::Arc;

use idem_core::batch::{OnRefusal, in_id_order, one_by_one};
use idem_core::{Claim, ClaimRequest, StoreError};
use mysql_async::Row;

use crate::batch_query::{
    COMMITTED, Sent, batched, hex, id_tuple, one_row_each, query_limit, send, shape_error, tokens,
    transactions,
};
use crate::row;
use crate::schema::{RECORDS_BY_ID, quoted};
use crate::single::{Inner, claim_params};

pub(crate) async fn claims(
    inner: Arc<Inner>,
    calls: Vec<ClaimRequest>,
    on_refusal: OnRefusal,
) -> Vec<Result<Claim, StoreError>> {
    if calls.len() == 1 {
        return one_by_one(&calls, |req| inner.claim_one(req)).await;
    }
    let order = in_id_order(calls.iter().map(|c| &c.id));
    let mut answers: Vec<Option<Result<Claim, StoreError>>> = calls.iter().map(|_| None).collect();
    let new_keys = new_keys_query(&inner, &calls, &order);
    if new_keys.len() > query_limit(&inner) {
        return one_by_one(&calls, |req| inner.claim_one(req)).await;
    }
    match send(&inner, &new_keys, "claims").await {
        Sent::Sets(sets) => {
            if sets.len() > 1 {
                return calls.iter().map(|_| Err(shape_error("claims"))).collect();
            }
            for row in sets.iter().flatten() {
                match inserted_call(&calls, &order, row) {
                    Some(i) if answers[i].is_none() => {
                        answers[i] = Some(row::claim_from_row(&calls[i], Some(row)));
                    }
                    _ => return calls.iter().map(|_| Err(shape_error("claims"))).collect(),
                }
            }
        }
        Sent::Refused => {
            return one_by_one(&calls, |req| {
                on_refusal.answer("mysql", req, |r| inner.claim_one(r))
            })
            .await;
        }
        Sent::Down(kind, message) => {
            return calls
                .iter()
                .map(|_| Err(StoreError::new(kind, message.clone())))
                .collect();
        }
    }
    // Every other call (a key that had a record, or a later call of an id
    // the batch inserted) is judged by the claim procedure, in id order,
    // in a transaction of its own, as the call would be a moment later
    // alone.
    let rest: Vec<usize> = order
        .iter()
        .copied()
        .filter(|&i| answers[i].is_none())
        .collect();
    if !rest.is_empty() {
        let procedure = format!("{}.idem_claim_in_tx", quoted(&inner.database));
        let statement = |out: &mut String, i: usize| {
            let (scope, operation, key, fingerprint, now, lease, ttl) = claim_params(&calls[i]);
            let _ = write!(out, "CALL {procedure}(");
            for bytes in [
                scope.as_bytes(),
                operation.as_bytes(),
                key.as_bytes(),
                fingerprint,
            ] {
                hex(out, bytes);
                out.push(',');
            }
            let _ = write!(out, "{now},{lease},{ttl});");
        };
        // One transaction, whatever its size: a server whose packet limit
        // it passes gets each claim alone.
        let txs = transactions(&rest, usize::MAX, statement, |_| String::new());
        if txs
            .iter()
            .any(|(query, _)| query.len() > query_limit(&inner))
        {
            for &i in &rest {
                answers[i] = Some(inner.claim_one(&calls[i]).await);
            }
        } else {
            let judged = batched(
                &inner,
                &calls,
                txs,
                "claims",
                one_row_each(|i, row| row::claim_from_row(&calls[i], Some(row))),
                |req| inner.claim_one(req),
                on_refusal,
            )
            .await;
            for (answer, judged) in answers.iter_mut().zip(judged) {
                if answer.is_none() {
                    *answer = Some(judged);
                }
            }
        }
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(shape_error("claims"))))
        .collect()
}

/// The first step of a batch of claims, one transaction: the first call of
/// each id, inserted by one multi-row `INSERT ... VALUES` with this batch's
/// token (`written_by`), where a key that has a record (live or not, or
/// inserted meanwhile by another transaction, once that commits) is left
/// as it is (`ON DUPLICATE KEY UPDATE` of nothing: no row changes, and no
/// other error is turned into a warning, as `INSERT IGNORE` would); then
/// the rows with the token read back by their ids, in the columns of the
/// claim procedure's answer (acquired), with the id after them. A list of
/// values, not an `INSERT ... SELECT`: in lock mode 1 (MariaDB's
/// default) InnoDB holds its table-wide AUTO-INC lock for the whole of an
/// insert whose rows it cannot count ahead, which would hold every other
/// insert of the table behind a row this one waits for; a list of values
/// takes it only for a moment (in mode 0 every insert holds it to its
/// end, this one too).
pub(crate) fn new_keys_query(inner: &Inner, calls: &[ClaimRequest], order: &[usize]) -> String {
    let database = quoted(&inner.database);
    let table = format!("{database}.idem_records");
    let by_id = format!("{database}.{RECORDS_BY_ID}");
    let token = tokens(1);
    let mut values = String::new();
    let mut ids = String::new();
    let mut last: Option<&idem_core::RecordId> = None;
    for &i in order {
        let req = &calls[i];
        if last == Some(&req.id) {
            continue;
        }
        last = Some(&req.id);
        let (scope, operation, key, fingerprint, now, lease, ttl) = claim_params(req);
        let first = values.is_empty();
        values.push_str(if first { "(" } else { ",(" });
        ids.push_str(if first { "(" } else { ",(" });
        id_tuple(&mut ids, &req.id);
        for bytes in [
            scope.as_bytes(),
            operation.as_bytes(),
            key.as_bytes(),
            fingerprint,
        ] {
            hex(&mut values, bytes);
            values.push(',');
        }
        let _ = write!(values, "0,{now},{now}+{lease},{now}+{ttl},{token})");
    }
    let mut query = String::with_capacity(values.len() + ids.len() + 512);
    let _ = write!(
        query,
        "START TRANSACTION;\
         INSERT INTO {table} (scope, operation, record_key, fingerprint, status, created_at, \
         lease_until, expires_at, written_by) VALUES {values} \
         ON DUPLICATE KEY UPDATE status = status;\
         SELECT 0, fence, created_at, lease_until, expires_at, 0, NULL, NULL, NULL, NULL, \
         scope, operation, record_key FROM {by_id} \
         WHERE written_by = {token} AND (scope, operation, record_key) IN ({ids});\
         COMMIT;{COMMITTED}"
    );
    query
}

/// The call (the first of its id, in `order`) whose record a row read
/// back by [`new_keys_query`] is: matched by the id in its last three
/// columns.
fn inserted_call(calls: &[ClaimRequest], order: &[usize], row: &Row) -> Option<usize> {
    let column = |n: usize| row.get_opt::<Vec<u8>, usize>(n).and_then(Result::ok);
    let (scope, operation, key) = (column(10)?, column(11)?, column(12)?);
    let wanted = (scope.as_slice(), operation.as_slice(), key.as_slice());
    let id_of = |i: usize| {
        let id = &calls[i].id;
        (
            id.scope.as_str().as_bytes(),
            id.operation.as_str().as_bytes(),
            id.key.as_str().as_bytes(),
        )
    };
    // `order` is sorted by id (as bytes): the first call of the id.
    let at = order.partition_point(|&i| id_of(i) < wanted);
    order.get(at).copied().filter(|&i| id_of(i) == wanted)
}
