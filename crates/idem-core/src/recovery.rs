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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::testkit::{LEASE, request, response, t0, unique_id};
    use crate::{Claim, MemoryStore, RecordId, Status};

    /// The application's state: which keys it knows the outcome of.
    #[derive(Default)]
    struct App {
        answers: Mutex<HashMap<RecordId, Resolution>>,
    }

    impl Reconcile for App {
        fn resolve<'a>(
            &'a self,
            r: &'a Record,
        ) -> BoxFuture<'a, Result<Resolution, Box<dyn StdError + Send + Sync>>> {
            let answer = self.answers.lock().unwrap().get(&r.id).cloned();
            Box::pin(async move { answer.ok_or_else(|| "unknown to the application".into()) })
        }
    }

    async fn claim(store: &MemoryStore, id: &RecordId) -> crate::Lease {
        match store.claim(&request(id, "{}", t0())).await.unwrap() {
            Claim::Acquired(l) => l,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn stale_records_are_completed_released_or_left_as_the_application_says() {
        let store = MemoryStore::new();
        let app = App::default();
        let ids: Vec<_> = (0..7)
            .map(|i| unique_id(&format!("recover-key-{i:05}")))
            .collect();
        for id in &ids {
            claim(&store, id).await;
        }
        {
            let mut a = app.answers.lock().unwrap();
            for id in &ids[0..3] {
                a.insert(
                    id.clone(),
                    Resolution::Complete(Completion::completed(response(201, "from state"))),
                );
            }
            for id in &ids[3..5] {
                a.insert(id.clone(), Resolution::Release);
            }
            a.insert(ids[5].clone(), Resolution::Leave);
            // ids[6]: the application errs.
        }
        // Before the lease ends there is nothing to do.
        assert_eq!(
            reconcile_once(&store, &app, t0(), 2).await.unwrap(),
            ReconcileReport::default()
        );
        let now = t0() + LEASE;
        let report = reconcile_once(&store, &app, now, 2).await.unwrap();
        assert_eq!(
            report,
            ReconcileReport {
                completed: 3,
                released: 2,
                left: 2,
                superseded: 0
            }
        );
        for id in &ids[0..3] {
            let r = store.get(id, now).await.unwrap().unwrap();
            assert_eq!(r.status, Status::Completed);
            assert_eq!(r.response, Some(response(201, "from state")));
        }
        for id in &ids[3..5] {
            assert_eq!(store.get(id, now).await.unwrap(), None);
        }
        for id in &ids[5..7] {
            assert_eq!(
                store.get(id, now).await.unwrap().unwrap().status,
                Status::InProgress
            );
        }
    }

    /// A late executor and the reconciler race for one record: whichever
    /// lands first wins, and the other changes nothing.
    #[tokio::test]
    async fn a_late_executor_and_the_reconciler_leave_exactly_one_outcome() {
        let now = t0() + LEASE + Duration::from_secs(1);
        // The executor finishes first: the reconciler's release is refused.
        let store = MemoryStore::new();
        let id = unique_id("race-late-exec-1");
        let lease = claim(&store, &id).await;
        let stale = store.list_stale(now, None, 10).await.unwrap();
        assert_eq!(stale.len(), 1);
        let done = Completion::completed(response(201, "executor"));
        assert_eq!(
            store.complete(&id, lease.fence, done, now).await.unwrap(),
            Settled::Applied
        );
        let app = App::default();
        app.answers
            .lock()
            .unwrap()
            .insert(id.clone(), Resolution::Release);
        // The reconciler acts on what it listed before the executor finished.
        let r = &stale[0];
        assert_eq!(
            store.release(&r.id, r.fence, now).await.unwrap(),
            Settled::StaleFence
        );
        assert_eq!(
            store.get(&id, now).await.unwrap().unwrap().response,
            Some(response(201, "executor"))
        );

        // The reconciler releases first: the late executor cannot complete.
        let id = unique_id("race-late-exec-2");
        let lease = claim(&store, &id).await;
        app.answers
            .lock()
            .unwrap()
            .insert(id.clone(), Resolution::Release);
        let report = reconcile_once(&store, &app, now, 10).await.unwrap();
        assert_eq!(report.released, 1);
        let late = Completion::completed(response(201, "too late"));
        assert_eq!(
            store.complete(&id, lease.fence, late, now).await.unwrap(),
            Settled::StaleFence
        );
        assert_eq!(store.get(&id, now).await.unwrap(), None);

        // Concurrently, many times: exactly one of the two wins each time.
        for round in 0..50 {
            let id = unique_id(&format!("race-conc-{round:05}"));
            let lease = claim(&store, &id).await;
            let store_ref = &store;
            let (exec, rec) = tokio::join!(
                async {
                    store_ref
                        .complete(
                            &id,
                            lease.fence,
                            Completion::completed(response(201, "x")),
                            now,
                        )
                        .await
                        .unwrap()
                },
                async { store_ref.release(&id, lease.fence, now).await.unwrap() },
            );
            assert_ne!(exec, rec, "round {round}: exactly one applied");
        }
    }
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
