//! What the parent, the consumer children and the bench share: the
//! broker interface (NATS JetStream and RabbitMQ each implement it), the
//! stream's names, the messages, and the pause protocol by which the
//! parent tells a child where to stop and wait to be killed.

use std::time::Duration;

use anyhow::Context;
use idem_consumer::{Action, Message};
use idem_core::{Key, Operation, RecordId, Scope};

use super::apply::Commits;
use crate::demo::plan::Plan;

/// The consumer's records: scope and handler name.
pub(super) const TENANT: &[u8] = b"idem-demo";
pub(super) const HANDLER: &str = "apply-transfer";
/// Messages fetched and processed together.
pub(super) const BATCH: usize = 64;

/// One delivery the child holds until it settles it.
pub(crate) trait Delivery: Send + Sync {
    fn message(&self) -> Message;
    fn settle(
        &self,
        action: Action,
    ) -> impl Future<Output = Result<(), idem_consumer::BrokerError>> + Send;
}

/// What the demo does with a broker.
pub(crate) trait Broker: Sized + Send + Sync {
    type Delivery: Delivery;
    /// Creates the stream or queue `name` (parent) or opens it (child).
    fn open(
        url: &str,
        name: &str,
        create: bool,
    ) -> impl Future<Output = anyhow::Result<Self>> + Send;
    /// Publishes JSON payloads in order, each confirmed by the broker
    /// (the confirmations are awaited in flights, not one by one).
    fn publish_all(
        &self,
        payloads: Vec<Vec<u8>>,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Messages not yet acknowledged (delivered or not).
    fn unsettled(&self) -> impl Future<Output = anyhow::Result<u64>> + Send;
    /// Up to `max` deliveries; an empty batch after a short wait when
    /// there is nothing.
    fn next_batch(
        &mut self,
        max: usize,
    ) -> impl Future<Output = anyhow::Result<Vec<Self::Delivery>>> + Send;
    /// Deletes the stream or queue.
    fn delete(self) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// Where a child stops and waits to be killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pause {
    /// After `n` messages applied, between the effect's commit and its ack.
    BeforeAck(u64),
    /// After `n` messages applied, in the batch that reached it: every
    /// effect of the batch committed, half of its acks sent.
    MidBatch(u64),
}

impl Pause {
    /// `before-ack:N` or `mid-batch:N`, then `:one` or `:two` for the
    /// child's atomic mode.
    pub(super) fn parse(text: &str) -> Option<(Pause, Commits)> {
        let mut parts = text.split(':');
        let (kind, n, commits) = (parts.next()?, parts.next()?, parts.next()?);
        let n = n.parse().ok()?;
        let pause = match kind {
            "before-ack" => Pause::BeforeAck(n),
            "mid-batch" => Pause::MidBatch(n),
            _ => return None,
        };
        let commits = match commits {
            "one" => Commits::One,
            "two" => Commits::Two,
            _ => return None,
        };
        Some((pause, commits))
    }

    pub(super) fn arg(self, commits: Commits) -> String {
        let commits = match commits {
            Commits::One => "one",
            Commits::Two => "two",
        };
        match self {
            Pause::BeforeAck(n) => format!("before-ack:{n}:{commits}"),
            Pause::MidBatch(n) => format!("mid-batch:{n}:{commits}"),
        }
    }
}

/// How long the parent waits for a child to reach its pause.
pub(super) const PAUSE_WAIT: Duration = Duration::from_secs(120);

/// The line a paused child prints.
pub(super) const PAUSED: &str = "IDEM-DEMO-CONSUMER-PAUSED";

pub(super) fn consumer_scope() -> Scope {
    Scope::from_tenant(TENANT)
}

pub(super) fn record_id(transfer_id: &str) -> anyhow::Result<RecordId> {
    Ok(RecordId::new(
        consumer_scope(),
        Operation::new("CONSUME", HANDLER),
        Key::new(transfer_id).context("a transfer id")?,
    ))
}

/// The payload of a plan's message; `amount` overrides the plan's.
pub(super) fn payload(plan: &Plan, amount: Option<i64>) -> Vec<u8> {
    let mut body = plan.body.clone();
    body["transfer_id"] = serde_json::json!(plan.key);
    if let Some(a) = amount {
        body["amount"] = serde_json::json!(a);
    }
    body.to_string().into_bytes()
}
