//! Recovery of records whose executor died.
//!
//! A record stays `in_progress` after its executor crashed until its client
//! retries or it expires; a client that never retries leaves it stuck, and
//! whatever the executor did is never told to anyone. Recovery asks the
//! application, which alone knows its own state, what became of each stale
//! record (in progress, lease over) and applies the answer with the
//! record's fence: a reconciler never overwrites a record that a late
//! executor finished in the meantime, and a late executor cannot finish a
//! record the reconciler released.

use std::error::Error as StdError;

use crate::record::Record;
use crate::store::{BoxFuture, Completion, Settled, StaleCursor, Store, StoreError};
use crate::time::Timestamp;

/// What became of a stale record's operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolution {
    /// It happened: store this response for replay.
    Complete(Completion),
    /// It did not happen: delete the claim, so a retry executes it.
    Release,
    /// Not known yet: look again next time.
    Leave,
}

/// The application's answer for stale records.
///
/// # Example
///
/// ```
/// use idem_core::{BoxFuture, Record, Reconcile, Resolution};
///
/// /// Nothing of ours outlives a crash, so every stale claim is released.
/// #[derive(Debug)]
/// struct ReleaseAll;
/// impl Reconcile for ReleaseAll {
///     fn resolve<'a>(&'a self, _: &'a Record) -> BoxFuture<'a, Result<Resolution, Box<dyn std::error::Error + Send + Sync>>> {
///         Box::pin(async { Ok(Resolution::Release) })
///     }
/// }
/// ```
pub trait Reconcile: Send + Sync + 'static {
    /// Looks at the application's own state for `record` (its scope,
    /// operation, key, fingerprint, resource id) and says what happened.
    /// An error leaves the record for the next pass.
    fn resolve<'a>(
        &'a self,
        record: &'a Record,
    ) -> BoxFuture<'a, Result<Resolution, Box<dyn StdError + Send + Sync>>>;
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Completed from the application's state.
    pub completed: u64,
    /// Released.
    pub released: u64,
    /// Left for later (by the application's answer or its error).
    pub left: u64,
    /// Finished by someone else (a late executor) before the reconciler's
    /// answer landed: the fence refused the reconciler's write.
    pub superseded: u64,
}

/// One pass over every stale record at `now`, in pages of `page` records.
///
/// # Errors
/// [`StoreError`] when the store fails; what was done before stays done.
pub async fn reconcile_once<S, R>(
    store: &S,
    reconcile: &R,
    now: Timestamp,
    page: usize,
) -> Result<ReconcileReport, StoreError>
where
    S: Store + ?Sized,
    R: Reconcile + ?Sized,
{
    let mut report = ReconcileReport::default();
    let mut cursor: Option<StaleCursor> = None;
    loop {
        let records = store.list_stale(now, cursor.as_ref(), page.max(1)).await?;
        let Some(last) = records.last() else { break };
        cursor = Some(StaleCursor::after(last));
        for record in &records {
            let settled = match reconcile.resolve(record).await {
                Ok(Resolution::Complete(completion)) => {
                    let s = store
                        .complete(&record.id, record.fence, completion, now)
                        .await?;
                    if s == Settled::Applied {
                        report.completed += 1;
                    }
                    s
                }
                Ok(Resolution::Release) => {
                    let s = store.release(&record.id, record.fence, now).await?;
                    if s == Settled::Applied {
                        report.released += 1;
                    }
                    s
                }
                Ok(Resolution::Leave) | Err(_) => {
                    report.left += 1;
                    Settled::Applied
                }
            };
            if settled == Settled::StaleFence {
                report.superseded += 1;
            }
        }
        if records.len() < page.max(1) {
            break;
        }
    }
    Ok(report)
}

/// Releases every stale record: for callers that cannot see whether the
/// operation happened (the gateway), so the next retry executes again and
/// the downstream, which got the same `Idempotency-Key`, may deduplicate.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReleaseAll;

impl Reconcile for ReleaseAll {
    fn resolve<'a>(
        &'a self,
        _: &'a Record,
    ) -> BoxFuture<'a, Result<Resolution, Box<dyn StdError + Send + Sync>>> {
        Box::pin(async { Ok(Resolution::Release) })
    }
}
