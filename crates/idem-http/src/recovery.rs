//! Running recovery on an interval, with metrics.
//!
//! `idem_reconciled_total{action}` counts what each pass did: `completed`,
//! `released`, `left`, `superseded` (a late executor finished first).

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Reconcile, ReconcileReport, Store, Timestamp, reconcile_once};
use tokio_util::sync::CancellationToken;

/// Reconciliation counter.
pub const RECONCILED: &str = "idem_reconciled_total";

/// Runs [`reconcile_once`] every `interval` until `stop` is cancelled.
/// Store failures are logged and retried at the next tick.
pub async fn run_reconciler(
    store: Arc<dyn Store>,
    reconcile: Arc<dyn Reconcile>,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        match reconcile_once(&*store, &*reconcile, Timestamp::now(), 100).await {
            Ok(report) => record(&report),
            Err(e) => {
                tracing::warn!(error = %e, "reconciliation failed; retrying at the next tick")
            }
        }
    }
}

/// Adds a pass's report to the metrics.
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
