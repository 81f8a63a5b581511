//! `idem demo --broker URL --bench`: messages per second through the
//! consumer, against the same transfers unrecorded.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use idem_consumer::{Action, Consumer, KeySource, Message};
use idem_core::Store;
use idem_ledger::{Ledger, TransferRequest};

use super::apply::{Commits, apply_one};
use super::shared::{BATCH, Broker, Delivery, HANDLER, consumer_scope};
use crate::cli::DemoArgs;

/// How a bench run consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The transfer in its own transaction, no idempotency record: the
    /// consumer without idem.
    Baseline,
    /// The same consumer, each message through idem's atomic mode.
    Atomic,
    /// Atomic mode with the claim in the transaction: one commit.
    OneCommit,
    /// The baseline with a fetched batch's messages run together, each in
    /// its own transaction, acked in order.
    BaselineBatched,
    /// One commit, a fetched batch's messages run together, acked in order.
    OneCommitBatched,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Baseline => "own transaction, no idem",
            Variant::Atomic => "idem atomic mode, two commits",
            Variant::OneCommit => "idem atomic mode, one commit",
            Variant::BaselineBatched => "own transaction, batch together",
            Variant::OneCommitBatched => "one commit, batch together",
        }
    }

    /// The row this one is compared with: the consumer without idem that
    /// consumes the same way (one at a time, or a batch together).
    fn baseline(self) -> Variant {
        match self {
            Variant::BaselineBatched | Variant::OneCommitBatched => Variant::BaselineBatched,
            Variant::Baseline | Variant::Atomic | Variant::OneCommit => Variant::Baseline,
        }
    }
}

pub(super) async fn run<B: Broker, L: Ledger>(
    url: &str,
    queue: &str,
    ledger: Arc<L>,
    store: Arc<dyn Store>,
    args: &DemoArgs,
) -> anyhow::Result<ExitCode> {
    const ACCOUNTS: usize = 16;
    ledger
        .seed(ACCOUNTS, 1_000_000_000)
        .await
        .context("cannot seed accounts")?;
    let consumer = Consumer::new(
        store,
        consumer_scope(),
        HANDLER,
        KeySource::JsonPointer("/transfer_id".into()),
    );
    let n = args.intents;
    let mut rates = Vec::new();
    // The one-at-a-time baseline runs first and again last: a drift of the
    // machine during the run (the database's own background work, another
    // load) shows as two different figures, and each row is compared with
    // their mean.
    let rows = [
        Variant::Baseline,
        Variant::Atomic,
        Variant::OneCommit,
        Variant::BaselineBatched,
        Variant::OneCommitBatched,
        Variant::Baseline,
    ];
    for (row, variant) in rows.into_iter().enumerate() {
        let name = format!("{queue}-{variant:?}-{row}").to_ascii_lowercase();
        let publisher = B::open(url, &name, true).await?;
        let payloads = (0..n)
            .map(|i| {
                serde_json::json!({
                    "transfer_id": format!("{name}-{i}"),
                    "from": format!("acct-{}", i % ACCOUNTS),
                    "to": format!("acct-{}", (i + 1) % ACCOUNTS),
                    "amount": 1,
                })
                .to_string()
                .into_bytes()
            })
            .collect();
        publisher.publish_all(payloads).await?;
        let mut broker = B::open(url, &name, false).await?;
        let started = Instant::now();
        let mut settled = 0;
        while settled < n {
            let batch = broker.next_batch(BATCH).await?;
            match variant {
                Variant::Baseline => {
                    for d in &batch {
                        transfer_unrecorded(&*ledger, d.message()).await?;
                        d.settle(Action::Ack).await?;
                    }
                }
                Variant::BaselineBatched => {
                    let done = futures_util::future::join_all(
                        batch
                            .iter()
                            .map(|d| transfer_unrecorded(&*ledger, d.message())),
                    )
                    .await;
                    for (d, done) in batch.iter().zip(done) {
                        done?;
                        d.settle(Action::Ack).await?;
                    }
                }
                Variant::Atomic | Variant::OneCommit => {
                    let commits = if variant == Variant::Atomic {
                        Commits::Two
                    } else {
                        Commits::One
                    };
                    for d in &batch {
                        let outcome = apply_one(&consumer, &*ledger, d.message(), commits).await;
                        let action = match outcome {
                            Ok(p) => p.action(),
                            Err(e) => e.action(),
                        };
                        d.settle(action).await?;
                    }
                }
                Variant::OneCommitBatched => {
                    let outcomes = futures_util::future::join_all(
                        batch
                            .iter()
                            .map(|d| apply_one(&consumer, &*ledger, d.message(), Commits::One)),
                    )
                    .await;
                    for (d, o) in batch.iter().zip(outcomes) {
                        let action = match o {
                            Ok(p) => p.action(),
                            Err(e) => e.action(),
                        };
                        d.settle(action).await?;
                    }
                }
            }
            settled += batch.len();
        }
        let elapsed = started.elapsed();
        publisher.delete().await?;
        let rate = n as f64 / elapsed.as_secs_f64();
        rates.push((variant, rate));
    }
    println!("idem demo --bench: {n} messages per row, one consumer");
    for &(variant, rate) in &rates {
        let baseline = variant.baseline();
        let base_rates: Vec<f64> = rates
            .iter()
            .filter(|(v, _)| *v == baseline)
            .map(|(_, r)| *r)
            .collect();
        let base_rate = base_rates.iter().sum::<f64>() / base_rates.len().max(1) as f64;
        println!(
            "  {:<34} {rate:>8.0} msg/s  {:.2}x {}",
            variant.name(),
            rate / base_rate,
            baseline.name()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The bench's consumer without idem: the message's transfer in its own
/// transaction, no record.
async fn transfer_unrecorded<L: Ledger>(ledger: &L, m: Message) -> anyhow::Result<()> {
    let req: TransferRequest = serde_json::from_slice(&m.payload).context("a bench message")?;
    let key = String::from_utf8_lossy(&m.payload).into_owned();
    ledger
        .transfer_unrecorded(&key, req)
        .await
        .context("baseline transfer")?;
    Ok(())
}
