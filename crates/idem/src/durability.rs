//! The store's durability check at start-up: every finding of
//! [`Store::durability`] is logged, and a store whose settings lose records
//! is refused (exit 2) unless the operator passed `--accept-volatile-store`.
//!
//! Why refuse: a store that forgets the record of a completed intent lets
//! the next retry of that intent execute again, silently. The memory store
//! (`memory:`) is volatile by its name and never refused. A setting the
//! store would not show (a managed Redis refusing `CONFIG`) is risky, not
//! fatal: idem cannot know, so it warns. A store that cannot answer the
//! check at all is logged and not refused, for the same reason.

use idem_core::{Store, Verdict};
use idem_stores::StoreUrl;

use crate::exit::OrUsage;

/// Logs the store's findings and refuses one that loses records unless
/// `accept` is set.
///
/// # Errors
/// A usage error (exit 2) listing every finding that loses records and
/// naming the flag.
pub(crate) async fn check(
    store: &dyn Store,
    url: &StoreUrl,
    accept: bool,
    timeout: std::time::Duration,
) -> anyhow::Result<()> {
    let report = match tokio::time::timeout(timeout, store.durability()).await {
        Ok(Ok(report)) => report,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot read the store's durability settings");
            return Ok(());
        }
        Err(_) => {
            tracing::warn!(
                ?timeout,
                "the store's durability settings did not arrive in time"
            );
            return Ok(());
        }
    };
    for f in &report.findings {
        match &f.verdict {
            Verdict::Keeps => {
                tracing::info!(setting = %f.setting, value = %f.value, "store durability: keeps records");
            }
            Verdict::Risky(why) => {
                tracing::warn!(setting = %f.setting, value = %f.value, why = %why, "store durability: risky");
            }
            Verdict::Loses(why) => {
                tracing::warn!(setting = %f.setting, value = %f.value, why = %why, "store durability: loses records");
            }
            _ => {
                tracing::warn!(setting = %f.setting, value = %f.value, verdict = %f.verdict, "store durability");
            }
        }
    }
    if !report.loses_records() || accept || matches!(url, StoreUrl::Memory) {
        return Ok(());
    }
    let losses: Vec<String> = report.losses().map(ToString::to_string).collect();
    Err(anyhow::anyhow!(
        "the store's settings lose records ({}); a store that forgets a completed intent lets \
         its next retry execute again. Fix the store, or start with --accept-volatile-store \
         (IDEM_ACCEPT_VOLATILE_STORE=true, accept_volatile_store = true) to accept it",
        losses.join("; ")
    ))
    .or_usage()
}
