//! `idem demo --broker URL`: the ledger fed by a stream of transfer
//! messages instead of HTTP, through an at-least-once broker, with the
//! consumer process killed (SIGKILL) and restarted mid-stream.
//!
//! The parent seeds the ledger, publishes one message per intent (some
//! twice, as a producer that retried its publish; some followed by a
//! second message reusing the transfer id with another amount: whichever
//! of the two is consumed first is applied, the other rejected), then runs consumer children (`idem demo --broker ...
//! --consumer QUEUE`, hidden) one after another. Each child but the last
//! is told where to stop and wait: just after an effect committed and
//! before its acknowledgement, or in the middle of a batch whose effects
//! all committed and half of whose acknowledgements were sent, in either
//! atomic mode (claim then transfer: two commits; or all in one). The parent
//! kills it there with SIGKILL and starts the next, so every kill leaves
//! effects the broker will redeliver. Then the checks: every intent
//! settled (applied, or refused for funds) exactly once, money conserved, nothing left unacknowledged on the broker.

mod amqp;
mod apply;
mod bench;
mod child;
mod nats;
mod parent;
mod shared;

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use idem_core::Store;
use idem_ledger::Ledger;

use crate::cli::DemoArgs;
use apply::Commits;
use shared::{Broker, Pause};

/// Which broker `--broker` names.
#[derive(Debug, Clone)]
pub(crate) enum BrokerUrl {
    Nats(String),
    Amqp(String),
}

impl BrokerUrl {
    pub(crate) fn parse(url: &str) -> anyhow::Result<BrokerUrl> {
        if url.starts_with("nats://") {
            Ok(BrokerUrl::Nats(url.to_owned()))
        } else if url.starts_with("amqp://") {
            Ok(BrokerUrl::Amqp(url.to_owned()))
        } else {
            bail!(
                "--broker must be nats://HOST:PORT or amqp://USER:PASS@HOST:PORT/VHOST, not {}",
                idem_stores::redact(url)
            )
        }
    }
}

/// Runs the parent: publish, run and kill consumers, check.
pub(crate) async fn run_parent<L: Ledger>(
    url: &BrokerUrl,
    queue: &str,
    ledger: Arc<L>,
    store: Arc<dyn Store>,
    store_arg: &str,
    args: &DemoArgs,
) -> anyhow::Result<ExitCode> {
    match url {
        BrokerUrl::Nats(u) => {
            parent::run::<nats::Nats, L>(u, queue, ledger, store, store_arg, args).await
        }
        BrokerUrl::Amqp(u) => {
            parent::run::<amqp::Amqp, L>(u, queue, ledger, store, store_arg, args).await
        }
    }
}

/// Runs a child consumer until killed.
pub(crate) async fn run_child<L: Ledger>(
    url: &BrokerUrl,
    queue: &str,
    pause: Option<&str>,
    ledger: Arc<L>,
    store: Arc<dyn Store>,
) -> anyhow::Result<ExitCode> {
    let (pause, commits) = match pause {
        Some(p) => {
            let (pause, commits) = Pause::parse(p).context("--consumer-pause")?;
            (Some(pause), commits)
        }
        // The last consumer, which runs to the end.
        None => (None, Commits::One),
    };
    match url {
        BrokerUrl::Nats(u) => {
            let broker = nats::Nats::open(u, queue, false).await?;
            child::run(broker, pause, commits, ledger, store).await
        }
        BrokerUrl::Amqp(u) => {
            let broker = amqp::Amqp::open(u, queue, false).await?;
            child::run(broker, pause, commits, ledger, store).await
        }
    }
}

/// `idem demo --broker URL --bench`: messages per second through one
/// consumer that applies each transfer in its own transaction, without
/// idem and with idem's atomic mode, on the demo's store. Every message is
/// a new transfer (no duplicates: this measures the cost of the record).
pub(crate) async fn run_bench<L: Ledger>(
    url: &BrokerUrl,
    queue: &str,
    ledger: Arc<L>,
    store: Arc<dyn Store>,
    args: &DemoArgs,
) -> anyhow::Result<ExitCode> {
    match url {
        BrokerUrl::Nats(u) => bench::run::<nats::Nats, L>(u, queue, ledger, store, args).await,
        BrokerUrl::Amqp(u) => bench::run::<amqp::Amqp, L>(u, queue, ledger, store, args).await,
    }
}
