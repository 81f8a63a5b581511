//! The parent: seeds, publishes, runs consumer children and kills them
//! (SIGKILL) where they were told to wait, then checks every intent.

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use idem_core::{Status, Store, Timestamp};
use idem_ledger::Ledger;

use super::apply::Commits;
use super::shared::{Broker, PAUSE_WAIT, PAUSED, Pause, payload, record_id};
use crate::cli::DemoArgs;
use crate::demo::plan::Plan;

pub(super) async fn run<B: Broker, L: Ledger>(
    url: &str,
    queue: &str,
    ledger: Arc<L>,
    store: Arc<dyn Store>,
    store_arg: &str,
    args: &DemoArgs,
) -> anyhow::Result<ExitCode> {
    let accounts = args.clients.max(16);
    ledger
        .seed(accounts, crate::demo::plan::START_BALANCE)
        .await
        .context("cannot seed accounts")?;
    let initial = ledger.total().await.context("cannot read the total")?;
    // Transfer ids of this run only: a store or ledger reused from an
    // earlier run must not answer for this one.
    let mut plans = crate::demo::plan::plans(args, accounts);
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
