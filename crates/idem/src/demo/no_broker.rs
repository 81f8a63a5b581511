//! `idem demo --broker` in a binary built without the `brokers` feature:
//! the flag is refused with the reason, and no broker client is linked.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::bail;
use idem_core::Store;
use idem_ledger::Ledger;

use crate::cli::DemoArgs;

/// No broker can be named: this binary links no broker client.
#[derive(Debug, Clone)]
pub(crate) enum BrokerUrl {}

impl BrokerUrl {
    pub(crate) fn parse(_url: &str) -> anyhow::Result<BrokerUrl> {
        bail!(
            "--broker needs the `brokers` feature, which this idem was built without (it is on by default: cargo install idem-cli)"
        )
    }
}

pub(crate) async fn run_parent<L: Ledger>(
    url: &BrokerUrl,
    _queue: &str,
    _ledger: Arc<L>,
    _store: Arc<dyn Store>,
    _store_arg: &str,
    _args: &DemoArgs,
) -> anyhow::Result<ExitCode> {
    match *url {}
}

pub(crate) async fn run_child<L: Ledger>(
    url: &BrokerUrl,
    _queue: &str,
    _pause: Option<&str>,
    _ledger: Arc<L>,
    _store: Arc<dyn Store>,
) -> anyhow::Result<ExitCode> {
    match *url {}
}

pub(crate) async fn run_bench<L: Ledger>(
    url: &BrokerUrl,
    _queue: &str,
    _ledger: Arc<L>,
    _store: Arc<dyn Store>,
    _args: &DemoArgs,
) -> anyhow::Result<ExitCode> {
    match *url {}
}
