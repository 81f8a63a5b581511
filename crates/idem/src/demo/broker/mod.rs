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
mod nats;

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use idem_consumer::{Action, ConsumeError, Consumer, Failure, KeySource, Message, Processed};
use idem_core::{Atomic, Key, Operation, RecordId, Scope, Status, Store, Timestamp};
use idem_ledger::{Ledger, LedgerError, Outcome, TransferRequest};

use super::Plan;
use crate::cli::DemoArgs;

/// The consumer's records: scope and handler name.
const TENANT: &[u8] = b"idem-demo";
const HANDLER: &str = "apply-transfer";
/// Messages fetched and processed together.
const BATCH: usize = 64;

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
                crate::stores::redact(url)
            )
        }
    }
}

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
enum Pause {
    /// After `n` messages applied, between the effect's commit and its ack.
    BeforeAck(u64),
    /// After `n` messages applied, in the batch that reached it: every
    /// effect of the batch committed, half of its acks sent.
    MidBatch(u64),
}

impl Pause {
    /// `before-ack:N` or `mid-batch:N`, then `:one` or `:two` for the
    /// child's atomic mode.
    fn parse(text: &str) -> Option<(Pause, Commits)> {
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

    fn arg(self, commits: Commits) -> String {
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
const PAUSE_WAIT: Duration = Duration::from_secs(120);

/// The line a paused child prints.
const PAUSED: &str = "IDEM-DEMO-CONSUMER-PAUSED";

fn consumer_scope() -> Scope {
    Scope::from_tenant(TENANT)
}

fn record_id(transfer_id: &str) -> anyhow::Result<RecordId> {
    Ok(RecordId::new(
        consumer_scope(),
        Operation::new("CONSUME", HANDLER),
        Key::new(transfer_id).context("a transfer id")?,
    ))
}

/// The payload of a plan's message; `amount` overrides the plan's.
fn payload(plan: &Plan, amount: Option<i64>) -> Vec<u8> {
    let mut body = plan.body.clone();
    body["transfer_id"] = serde_json::json!(plan.key);
    if let Some(a) = amount {
        body["amount"] = serde_json::json!(a);
    }
    body.to_string().into_bytes()
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
            parent::<nats::Nats, L>(u, queue, ledger, store, store_arg, args).await
        }
        BrokerUrl::Amqp(u) => {
            parent::<amqp::Amqp, L>(u, queue, ledger, store, store_arg, args).await
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
            child(broker, pause, commits, ledger, store).await
        }
        BrokerUrl::Amqp(u) => {
            let broker = amqp::Amqp::open(u, queue, false).await?;
            child(broker, pause, commits, ledger, store).await
        }
    }
}

async fn parent<B: Broker, L: Ledger>(
    url: &str,
    queue: &str,
    ledger: Arc<L>,
    store: Arc<dyn Store>,
    store_arg: &str,
    args: &DemoArgs,
) -> anyhow::Result<ExitCode> {
    let accounts = args.clients.max(16);
    ledger
        .seed(accounts, super::START_BALANCE)
        .await
        .context("cannot seed accounts")?;
    let initial = ledger.total().await.context("cannot read the total")?;
    // Transfer ids of this run only: a store or ledger reused from an
    // earlier run must not answer for this one.
    let mut plans = super::plans(args, accounts);
    for plan in &mut plans {
        plan.key = format!("{queue}.{}", plan.key);
    }
    let transfers_before = ledger
        .transfer_count()
        .await
        .context("cannot count transfers")?;
    let broker = B::open(url, queue, true).await?;
    let started = Instant::now();

    // Publish: each intent once, duplicates again a little later (as a
    // producer's retry would), reused ids with another amount.
    let (mut duplicates, mut reuses) = (0u64, 0u64);
    let mut payloads = Vec::with_capacity(plans.len() * 11 / 10);
    let mut later: Vec<Vec<u8>> = Vec::new();
    for (i, plan) in plans.iter().enumerate() {
        payloads.push(payload(plan, None));
        if plan.duplicate {
            later.push(payload(plan, None));
            duplicates += 1;
        }
        if plan.reuse {
            let changed = plan.body["amount"].as_i64().unwrap_or(1) + 1;
            later.push(payload(plan, Some(changed)));
            reuses += 1;
        }
        if i % 50 == 49 {
            payloads.append(&mut later);
        }
    }
    payloads.append(&mut later);
    let published = payloads.len();
    broker.publish_all(payloads).await?;
    eprintln!(
        "idem demo: published {published} messages ({} intents, {duplicates} duplicates, {reuses} reused ids) to {queue}",
        plans.len()
    );

    // Consumers: `kills` children each stopped at a planned point and
    // killed, then one that runs to the end.
    let kills = args.kills;
    let step = (plans.len() as u64 / (u64::from(kills) + 1)).max(1);
    let mut killed = 0u32;
    for k in 0..kills {
        // Each pause with each atomic mode: one commit for kills 0, 1, 4,
        // two commits for kills 2, 3.
        let pause = if k % 2 == 0 {
            Pause::BeforeAck(step)
        } else {
            Pause::MidBatch(step)
        };
        let commits = if (k / 2) % 2 == 0 {
            Commits::One
        } else {
            Commits::Two
        };
        let mut child = spawn_child(url, queue, store_arg, Some((pause, commits)))?;
        let stdout = child.stdout.take().context("the child's output")?;
        let reading = tokio::task::spawn_blocking(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .any(|l| l.contains(PAUSED))
        });
        // A child that never reaches its pause (nothing left to apply) is
        // killed all the same, and the run fails below.
        let paused = matches!(
            tokio::time::timeout(PAUSE_WAIT, reading).await,
            Ok(Ok(true))
        );
        // SIGKILL: no destructor, no flush, no ack.
        child.kill().context("cannot kill the consumer")?;
        let _ = child.wait();
        if !paused {
            bail!("consumer child {k} exited before its planned pause");
        }
        killed += 1;
    }
    // The last consumer runs until everything is settled. A broker may
    // count the deliveries a live consumer holds unacknowledged only once
    // it is gone (RabbitMQ does): then another round takes them.
    let mut leftover = 0;
    for _round in 0..5 {
        let mut last = spawn_child(url, queue, store_arg, None)?;
        let settled = wait_settled(&broker, &*store, &plans, Duration::from_secs(600)).await;
        let _ = last.kill();
        let _ = last.wait();
        settled?;
        leftover = returned(&broker).await?;
        if leftover == 0 {
            break;
        }
    }
    let elapsed = started.elapsed();

    // The checks.
    let mut problems = Vec::new();
    let (mut applied, mut refused) = (0u64, 0u64);
    for plan in &plans {
        let rows = ledger
            .transfers_with_key(&plan.key)
            .await
            .context("cannot count transfers")?;
        let record = store
            .get(&record_id(&plan.key)?, Timestamp::now())
            .await
            .context("cannot read a record")?;
        match (record.map(|r| r.status), rows) {
            (Some(Status::Completed), 1) => applied += 1,
            (Some(Status::Failed), 0) => refused += 1,
            (status, rows) => {
                problems.push(format!("{}: record {status:?}, {rows} transfers", plan.key))
            }
        }
        if rows > 1 {
            problems.push(format!("{} applied {rows} times", plan.key));
        }
    }
    let made = ledger
        .transfer_count()
        .await
        .context("cannot count transfers")?
        - transfers_before;
    if u64::try_from(made).ok() != Some(applied) {
        problems.push(format!(
            "{made} transfers made in this run, {applied} intents applied"
        ));
    }
    let total = ledger.total().await.context("cannot read the total")?;
    if total != initial {
        problems.push(format!("money not conserved: {initial} then {total}"));
    }
    if leftover != 0 {
        problems.push(format!("{leftover} messages left unacknowledged"));
    }
    if killed < kills {
        problems.push(format!("{killed} of {kills} planned kills happened"));
    }
    broker.delete().await?;

    println!(
        "idem demo --broker: {} intents in {elapsed:.1?}",
        plans.len()
    );
    println!(
        "  messages published      {published} ({duplicates} duplicates, {reuses} reused ids)"
    );
    println!(
        "  consumer SIGKILLs       {killed} (after an effect before its ack, and mid-batch; one and two commits)"
    );
    println!("  applied once            {applied}");
    println!("  refused for funds       {refused}");
    println!(
        "  applied twice           {}",
        problems.iter().filter(|p| p.contains("times")).count()
    );
    println!("  money                   {initial} before, {total} after");
    println!("  unacknowledged at end   {leftover}");
    if problems.is_empty() {
        println!("OK: every message applied once, none lost, money conserved");
        Ok(ExitCode::SUCCESS)
    } else {
        for p in problems.iter().take(20) {
            println!("FAILED: {p}");
        }
        Ok(ExitCode::FAILURE)
    }
}

fn spawn_child(
    url: &str,
    queue: &str,
    store_arg: &str,
    pause: Option<(Pause, Commits)>,
) -> anyhow::Result<std::process::Child> {
    let exe = std::env::current_exe().context("cannot find the idem binary")?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "demo",
        "--broker",
        url,
        "--store",
        store_arg,
        "--consumer",
        queue,
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    if let Some((p, commits)) = pause {
        cmd.args(["--consumer-pause", &p.arg(commits)]);
    }
    cmd.spawn().context("cannot start a consumer child")
}

/// Messages back on the broker after the last consumer was killed: polled
/// for a second, as the broker learns of the closed connection.
async fn returned<B: Broker>(broker: &B) -> anyhow::Result<u64> {
    for _ in 0..10 {
        let n = broker.unsettled().await?;
        if n != 0 {
            return Ok(n);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(0)
}

/// Waits until every intent's record is settled and the broker holds
/// nothing unacknowledged.
async fn wait_settled<B: Broker>(
    broker: &B,
    store: &dyn Store,
    plans: &[Plan],
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    let mut next = 0;
    loop {
        // Records, once settled, stay settled: check from the first that
        // was not.
        while let Some(plan) = plans.get(next) {
            let record = store
                .get(&record_id(&plan.key)?, Timestamp::now())
                .await
                .context("cannot read a record")?;
            if !matches!(
                record.map(|r| r.status),
                Some(Status::Completed | Status::Failed)
            ) {
                break;
            }
            next += 1;
        }
        if next == plans.len() && broker.unsettled().await? == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "{} of {} intents settled after {limit:?}",
                next,
                plans.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The child: consume in batches, each message through the ledger's
/// atomic transfer; pause where told.
async fn child<B: Broker, L: Ledger>(
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

/// How a message reaches the ledger in atomic mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Commits {
    /// Claim, then the transfer with the completion: two commits.
    Two,
    /// The claim, the transfer and the completion in one commit.
    One,
}

/// One message through the ledger, atomically.
async fn apply_one<L: Ledger>(
    consumer: &Consumer,
    ledger: &L,
    message: Message,
    commits: Commits,
) -> Result<Processed, ConsumeError<LedgerError>> {
    let Ok(request) = serde_json::from_slice::<TransferRequest>(&message.payload) else {
        // Not a transfer: refused for good (stored, acknowledged), never
        // redelivered forever.
        return consumer
            .process(&message, |_| async {
                Err(Failure::Permanent(b"not a transfer".to_vec()))
            })
            .await;
    };
    match commits {
        Commits::One => {
            consumer
                .process_in_one_transaction(&message, |claim| {
                    let request = request.clone();
                    async move { ledger.transfer_claiming(&claim, request).await }
                })
                .await
        }
        Commits::Two => {
            consumer
                .process_atomically(&message, |claimed| async move {
                    match ledger
                        .transfer(claimed.id(), claimed.fence(), request)
                        .await
                    {
                        Ok(Outcome::Done(stored)) => Ok(Atomic::Committed(stored.body)),
                        Ok(Outcome::LostLease) => Ok(Atomic::StaleFence),
                        Err(e) => Ok(Atomic::Failed(e)),
                    }
                })
                .await
        }
    }
}

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
        BrokerUrl::Nats(u) => bench::<nats::Nats, L>(u, queue, ledger, store, args).await,
        BrokerUrl::Amqp(u) => bench::<amqp::Amqp, L>(u, queue, ledger, store, args).await,
    }
}

async fn bench<B: Broker, L: Ledger>(
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
