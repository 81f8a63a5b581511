//! A consumer child: consumes transfer messages idempotently until the end
//! of the stream, or until the point where the parent kills it.

use std::process::ExitCode;
use std::sync::Arc;

use idem_consumer::{Consumer, KeySource, Processed};
use idem_core::Store;
use idem_ledger::Ledger;

use super::apply::{Commits, apply_one};
use super::shared::{BATCH, Broker, Delivery, HANDLER, PAUSED, Pause, consumer_scope};

/// The child: consume in batches, each message through the ledger's
/// atomic transfer; pause where told.
pub(super) async fn run<B: Broker, L: Ledger>(
    mut broker: B,
    pause: Option<Pause>,
    commits: Commits,
    ledger: Arc<L>,
    store: Arc<dyn Store>,
) -> anyhow::Result<ExitCode> {
    let consumer = Consumer::new(
        store,
        consumer_scope(),
        HANDLER,
        KeySource::JsonPointer("/transfer_id".into()),
    );
    let mut applied = 0u64;
    loop {
        let batch = broker.next_batch(BATCH).await?;
        if batch.is_empty() {
            continue;
        }
        // The batch's messages run together (their records are
        // independent); their acks go out in order afterwards.
        let outcomes = futures_util::future::join_all(
            batch
                .iter()
                .map(|d| apply_one(&consumer, &*ledger, d.message(), commits)),
        )
        .await;
        for (i, (delivery, outcome)) in batch.iter().zip(&outcomes).enumerate() {
            let action = match outcome {
                Ok(p) => {
                    if matches!(p, Processed::Applied(_)) {
                        applied += 1;
                        if pause == Some(Pause::BeforeAck(applied)) {
                            wait_to_be_killed();
                        }
                    }
                    p.action()
                }
                Err(e) => e.action(),
            };
            if let Some(Pause::MidBatch(n)) = pause
                && applied >= n
                && i == batch.len() / 2
            {
                wait_to_be_killed();
            }
            // A failed ack leaves the message to be redelivered; its record
            // answers that.
            if let Err(e) = delivery.settle(action).await {
                tracing::warn!(error = %e, "settle failed");
            }
        }
    }
}

/// Says it paused, then waits for SIGKILL.
fn wait_to_be_killed() -> ! {
    println!("{PAUSED}");
    loop {
        std::thread::park();
    }
}
