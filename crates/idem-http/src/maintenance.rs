//! Keeping a store tidy while it serves: expired records purged in bounded
//! batches, and stale claims (an executor died mid-request) handed to
//! recovery, on one interval, with metrics. The gateway runs exactly this;
//! a library user starts it with [`Maintenance::spawn`].
//!
//! Metrics: `idem_records_purged_total`, and `idem_reconciled_total{action}`
//! for what each recovery pass did (`completed`, `released`, `left`,
//! `superseded`: a late executor finished first).

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    BoxFuture, Reconcile, ReconcileReport, Record, Resolution, Store, StoreError, Takeover,
    Timestamp, reconcile_once,
};
use tokio::task::JoinHandle;

use crate::shared::Shared;
use crate::store_watch::StoreWatch;
/// What stops [`Maintenance::spawn`]'s task (tokio-util's, re-exported so
/// that starting maintenance needs no dependency of your own).
pub use tokio_util::sync::CancellationToken;

/// Reconciliation counter.
pub const RECONCILED: &str = "idem_reconciled_total";
/// Records purged.
pub const PURGED: &str = "idem_records_purged_total";

/// The `action` label values of [`RECONCILED`].
pub const RECONCILE_ACTIONS: [&str; 4] = ["completed", "released", "left", "superseded"];

/// Registers maintenance's series at zero, so that an alert on one that
/// has not moved yet still has a series to read. [`Maintenance::spawn`]
/// calls it.
pub fn register_metrics() {
    metrics::counter!(PURGED).increment(0);
    for action in RECONCILE_ACTIONS {
        metrics::counter!(RECONCILED, "action" => action).increment(0);
    }
}
/// Stale records resolved by their operation's takeover policy (what a
/// gateway, which cannot see whether its upstream acted, reconciles with):
/// released where the policy is `reexecute`, so that the next retry runs
/// at once; left where it is `hold` (for an operator: `idem records
/// release`) or `announce` (the next retry takes the key over and tells the
/// operation so). Made by [`LayerHandle::takeover_reconciler`](crate::LayerHandle::takeover_reconciler).
#[derive(Clone)]
pub struct ByTakeoverPolicy(pub(crate) Arc<Shared>);

impl std::fmt::Debug for ByTakeoverPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByTakeoverPolicy").finish_non_exhaustive()
    }
}

impl Reconcile for ByTakeoverPolicy {
    fn resolve<'a>(
        &'a self,
        record: &'a Record,
    ) -> BoxFuture<'a, Result<Resolution, Box<dyn std::error::Error + Send + Sync>>> {
        let resolution = match self.0.settings.takeover_of(&record.id.operation) {
            Takeover::Reexecute => Resolution::Release,
            _ => Resolution::Leave,
        };
        Box::pin(async move { Ok(resolution) })
    }
}

/// Records deleted per purge call.
pub const PURGE_BATCH: usize = 1000;
/// Stale records handed to recovery per pass.
const RECONCILE_BATCH: usize = 100;

/// Deletes every record expired at `cutoff`, `batch` at a time (each batch
/// one store call, so traffic is never blocked for long, and each under
/// `batch_timeout`); answers how many.
///
/// `cutoff` must not be later than now: a record whose expiry falls
/// between now and a future cutoff is still live, and deleting it lets its
/// next retry execute again.
///
/// # Errors
/// The first [`StoreError`] (a batch past its deadline counts as
/// unavailable); what was purged before it stays purged.
pub async fn purge_expired(
    store: &dyn Store,
    cutoff: Timestamp,
    batch: usize,
    batch_timeout: Duration,
) -> Result<usize, StoreError> {
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let n = tokio::time::timeout(batch_timeout, store.purge_expired(cutoff, batch))
            .await
            .unwrap_or_else(|_| Err(StoreError::timed_out("a purge batch")))?;
        metrics::counter!(PURGED).increment(n as u64);
        total += n;
        if n < batch {
            return Ok(total);
        }
    }
}

/// Adds a recovery pass's report to the metrics.
pub fn record(report: &ReconcileReport) {
    for (action, n) in [
        ("completed", report.completed),
        ("released", report.released),
        ("left", report.left),
        ("superseded", report.superseded),
    ] {
        if n > 0 {
            metrics::counter!(RECONCILED, "action" => action).increment(n);
        }
    }
}

/// The maintenance loops over one store: every `interval`, purge expired
/// records and, if a [`Reconcile`] is given, run one recovery pass (two
/// loops, so a slow purge never holds back recovery).
#[derive(Clone)]
pub struct Maintenance {
    store: Arc<dyn Store>,
    interval: Duration,
    store_timeout: Duration,
    reconcile: Option<Arc<dyn Reconcile>>,
    watch: Option<StoreWatch>,
}

impl std::fmt::Debug for Maintenance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Maintenance")
            .field("interval", &self.interval)
            .field("store_timeout", &self.store_timeout)
            .field("reconcile", &self.reconcile.is_some())
            .field("watch", &self.watch)
            .finish_non_exhaustive()
    }
}

impl Maintenance {
    /// Purging only, every 60 s, each store call bounded by 5 s.
    pub fn new(store: Arc<dyn Store>) -> Maintenance {
        Maintenance {
            store,
            interval: Duration::from_secs(60),
            store_timeout: Duration::from_secs(5),
            reconcile: None,
            watch: None,
        }
    }

    /// How often a pass runs. Default 60 s.
    pub fn interval(mut self, every: Duration) -> Maintenance {
        self.interval = every.max(Duration::from_millis(1));
        self
    }

    /// The longest one purge batch may take, and one recovery pass per
    /// stale record it handles; a stalled store is given up on and tried
    /// again at the next tick. Default 5 s.
    pub fn store_timeout(mut self, d: Duration) -> Maintenance {
        self.store_timeout = d;
        self
    }

    /// Hands stale claims to `reconcile` on each pass (the gateway uses
    /// [`idem_core::ReleaseAll`]; an application that can see its own state
    /// decides per record, as the ledger example does).
    pub fn reconcile(mut self, reconcile: Arc<dyn Reconcile>) -> Maintenance {
        self.reconcile = Some(reconcile);
        self
    }

    /// Also runs `watch` (from [`LayerHandle::store_watch`](crate::LayerHandle::store_watch)),
    /// on its own interval: a store that lost records is noticed, and the
    /// layer refuses new claims for the loss window.
    pub fn watch_store(mut self, watch: StoreWatch) -> Maintenance {
        self.watch = Some(watch);
        self
    }

    /// One pass: purge, then recovery. Failures are logged; the next pass
    /// tries again.
    pub async fn run_once(&self) {
        self.purge_pass().await;
        self.reconcile_pass().await;
    }

    async fn purge_pass(&self) {
        let purged = purge_expired(
            &*self.store,
            Timestamp::now(),
            PURGE_BATCH,
            self.store_timeout,
        )
        .await;
        if let Err(e) = purged {
            tracing::warn!(error = %e, "purge failed; retrying at the next pass");
        }
    }

    async fn reconcile_pass(&self) {
        let Some(reconcile) = &self.reconcile else {
            return;
        };
        // Listing, then one resolution per stale record.
        let calls = u32::try_from(RECONCILE_BATCH + 1).unwrap_or(u32::MAX);
        let pass = tokio::time::timeout(
            self.store_timeout.saturating_mul(calls),
            reconcile_once(
                &*self.store,
                &**reconcile,
                Timestamp::now(),
                RECONCILE_BATCH,
            ),
        )
        .await
        .unwrap_or_else(|_| Err(StoreError::timed_out("reconciliation")));
        match pass {
            Ok(report) => record(&report),
            Err(e) => {
                tracing::warn!(error = %e, "reconciliation failed; retrying at the next pass");
            }
        }
    }

    /// Runs the purge loop and the recovery loop, each every interval, until
    /// `stop` is cancelled.
    pub fn spawn(self, stop: CancellationToken) -> JoinHandle<()> {
        register_metrics();
        tokio::spawn(async move {
            let every = |this: Maintenance, stop: CancellationToken, reconcile: bool| async move {
                let mut tick = tokio::time::interval(this.interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        () = stop.cancelled() => return,
                    }
                    if reconcile {
                        this.reconcile_pass().await;
                    } else {
                        this.purge_pass().await;
                    }
                }
            };
            let watch = self.watch.clone().map(|w| w.run(stop.clone()));
            tokio::join!(
                every(self.clone(), stop.clone(), false),
                every(self, stop, true),
                async move {
                    if let Some(watch) = watch {
                        watch.await;
                    }
                }
            );
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{
        Claim, ClaimRequest, Fingerprint, Key, MemoryStore, Operation, RecordId, ReleaseAll, Scope,
    };

    fn claim(n: usize, now: Timestamp, lease: Duration, ttl: Duration) -> ClaimRequest {
        let op = Operation::new("POST", "/m");
        ClaimRequest {
            id: RecordId::new(
                Scope::anonymous(),
                op.clone(),
                Key::new(format!("maintenance-{n:08}")).unwrap(),
            ),
            fingerprint: Fingerprint::compute(&op, None, b"", &Default::default()),
            now,
            lease,
            ttl,
        }
    }

    #[tokio::test]
    async fn one_pass_purges_every_expired_record_and_settles_stale_claims() {
        let store = Arc::new(MemoryStore::new());
        let long_ago = Timestamp::now() - Duration::from_secs(7200);
        // 2,500 expired records: three purge batches.
        for n in 0..2500 {
            let req = claim(n, long_ago, Duration::from_secs(1), Duration::from_secs(60));
            assert!(matches!(
                store.claim(&req).await.unwrap(),
                Claim::Acquired(_)
            ));
        }
        // One live record whose executor died: lease over, ttl not.
        let stale = claim(
            9999,
            long_ago,
            Duration::from_secs(1),
            Duration::from_secs(86_400),
        );
        assert!(matches!(
            store.claim(&stale).await.unwrap(),
            Claim::Acquired(_)
        ));
        assert_eq!(store.len(), 2501);

        Maintenance::new(store.clone())
            .reconcile(Arc::new(ReleaseAll))
            .run_once()
            .await;
        assert_eq!(store.len(), 0, "expired purged, the stale claim released");
    }
}
