//! One call alone, on a pooled connection: the statements a batch of one
//! sends (`batch.rs` falls back to them), and the completion statement
//! atomic mode runs inside its transaction.

use deadpool_postgres::{GenericClient, Pool};
use idem_core::{Claim, ClaimRequest, Completion, RecordId, Settled, StoreError};
use tokio_postgres::Statement;

use crate::error::pg_error;
use crate::pooled::Pooled;
use crate::row::{self, millis};
use crate::schema::Statements;

/// The completion statement, on a plain client ([`Store::complete`]) or
/// inside the atomic-mode transaction; `fence` is one
/// [`Fence::to_i64`] accepted.
pub(crate) async fn complete_with<C: GenericClient + Sync>(
    client: &C,
    sql: &str,
    id: &RecordId,
    fence: i64,
    c: &Completion,
) -> Result<Settled, StoreError> {
    let stmt = client
        .prepare_cached(sql)
        .await
        .map_err(|e| pg_error("preparing complete", e))?;
    let n = client
        .execute(
            &stmt,
            &[
                &id.scope.as_str(),
                &id.operation.as_str(),
                &id.key.as_str(),
                &fence,
                &(c.status().code() as i16),
                &c.resource_id.as_deref(),
                &i32::from(c.response.status),
                &c.response.encode_headers(),
                &c.response.body,
            ],
        )
        .await
        .map_err(|e| pg_error("completing", e))?;
    Ok(Settled::from_changed(n))
}

/// One claim, alone: `idem_claim` on a pooled connection.
pub(crate) async fn claim_one(
    pool: &Pool,
    sql: &Statements,
    req: &ClaimRequest,
) -> Result<Claim, StoreError> {
    let (client, stmt) = prepared(pool, &sql.claim, "claim").await?;
    let answer = client
        .query_one(
            &stmt,
            &[
                &req.id.scope.as_str(),
                &req.id.operation.as_str(),
                &req.id.key.as_str(),
                &req.fingerprint.as_bytes(),
                &req.now.as_millis(),
                &millis(req.lease),
                &millis(req.ttl),
            ],
        )
        .await;
    let row = client
        .answered(answer)
        .map_err(|e| pg_error("claiming", e))?;
    row::claim_from_row(req, &row)
}

/// One completion, alone.
pub(crate) async fn complete_one(
    pool: &Pool,
    sql: &Statements,
    id: &RecordId,
    fence: i64,
    completion: &Completion,
) -> Result<Settled, StoreError> {
    let client = Pooled::get(pool).await?;
    let answer = complete_with(&*client, &sql.complete, id, fence, completion).await;
    client.answered(answer)
}

/// One release, alone.
pub(crate) async fn release_one(
    pool: &Pool,
    sql: &Statements,
    id: &RecordId,
    fence: i64,
) -> Result<Settled, StoreError> {
    let (client, stmt) = prepared(pool, &sql.release, "release").await?;
    let answer = client
        .execute(
            &stmt,
            &[
                &id.scope.as_str(),
                &id.operation.as_str(),
                &id.key.as_str(),
                &fence,
            ],
        )
        .await;
    let n = client
        .answered(answer)
        .map_err(|e| pg_error("releasing", e))?;
    Ok(Settled::from_changed(n))
}

/// A pooled connection with `sql` prepared on it (statements are cached
/// per connection, so this is a lookup after the first time). Dropped
/// before its call is [`answered`](Pooled::answered), the connection
/// leaves the pool (see [`crate::pooled`]).
pub(crate) async fn prepared(
    pool: &Pool,
    sql: &str,
    what: &str,
) -> Result<(Pooled, Statement), StoreError> {
    let client = Pooled::get(pool).await?;
    match client.prepare_cached(sql).await {
        Ok(stmt) => Ok((client, stmt)),
        Err(e) => Err(client.answered(pg_error(&format!("preparing {what}"), e))),
    }
}
