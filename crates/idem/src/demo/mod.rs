//! `idem demo`: the ledger example behind idem, driven by retrying clients
//! through injected faults, then checked: one effect per intent, money
//! conserved.
//!
//! Faults: answers lost after the commit, 503s before the ledger, answers
//! slower than the client's timeout, intents sent twice at once, and keys
//! reused with a changed body. Calls the retry budget refuses to retry are
//! resolved at the end with the same keys (a client's reconciliation),
//! which must not execute anything twice.

#[cfg(feature = "brokers")]
mod broker;
#[cfg(not(feature = "brokers"))]
#[path = "no_broker.rs"]
mod broker;
mod faults;
mod plan;
mod report;
mod store_faults;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::exit::OrUsage;
use anyhow::Context;
use idem_core::Store;
use idem_http::IdempotencyLayer;
#[cfg(feature = "postgres")]
use idem_ledger::PostgresLedger;
use idem_ledger::{Ledger, SqliteLedger, router, transfer_rule};
use idem_retry::{Backoff, CallSpec, Retrier, RetryBudget, RetryError, RetryPolicy, Stop};
use idem_stores::StoreUrl;
use tokio_util::sync::CancellationToken;

use crate::cli::DemoArgs;
use faults::{FaultRates, FrontStats};
use plan::{Plan, START_BALANCE, plans};
use report::{Intent, Report};
use store_faults::{FaultyStore, Reopen};

const CLIENT_TIMEOUT: Duration = Duration::from_millis(800);
/// The layer's store timeout with --store-faults: shorter than the freeze,
/// so that a frozen call is given up (503) rather than waited out, and
/// long enough that a slow but working store (an fsync on a loaded
/// machine) is not given up on after its claim landed.
const STORE_TIMEOUT_UNDER_FAULTS: Duration = Duration::from_secs(1);

/// Runs the demo. The rates and counts in `args` were checked by clap.
pub(crate) async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    // Parsed here, not in clap: clap would echo a refused URL, password
    // and all.
    let store = args
        .store
        .as_deref()
        .map(str::parse::<StoreUrl>)
        .transpose()
        .context("--store")?;
    let broker = args
        .broker
        .as_deref()
        .map(broker::BrokerUrl::parse)
        .transpose()
        .or_usage()?;
    // With a broker, the stream or queue is named once and the consumer
    // children are given its name (a PostgreSQL schema is named after it).
    let queue = match (&broker, &args.consumer) {
        (_, Some(q)) => q.clone(),
        (Some(_), None) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            format!("idem-demo-{}-{nanos}", std::process::id())
        }
        (None, None) => format!("idem-demo-{}", std::process::id()),
    };
    let mode = Mode {
        broker,
        queue,
        args: &args,
    };
    match &store {
        None => {
            let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
            let path = dir.path().join("demo.db");
            let ledger = SqliteLedger::open(&path).context("cannot open the demo ledger")?;
            let store = ledger.store().clone();
            eprintln!("idem demo: ledger on SQLite in {}", dir.path().display());
            let arg = format!("sqlite:{}", path.display());
            mode.dispatch(Arc::new(ledger), store, arg, reopen_sqlite(path))
                .await
        }
        Some(StoreUrl::Sqlite(path)) => {
            let ledger = SqliteLedger::open(path).context("cannot open the demo ledger")?;
            let store = ledger.store().clone();
            let arg = format!("sqlite:{}", path.display());
            mode.dispatch(Arc::new(ledger), store, arg, reopen_sqlite(path.clone()))
                .await
        }
        #[cfg(feature = "postgres")]
        Some(url @ StoreUrl::Postgres(conn)) => {
            let schema = mode.queue.replace('-', "_");
            let open = {
                let (conn, schema) = (conn.clone(), schema.clone());
                move || {
                    idem_postgres::PostgresStore::builder(conn.clone())
                        .schema(schema.clone())
                        .pool_size(16)
                        .connect()
                }
            };
            let store = open()
                .await
                .with_context(|| format!("cannot reach {url}"))?;
            let ledger = PostgresLedger::new(store.clone())
                .await
                .context("cannot create the demo ledger")?;
            // --store-faults: a new pool on the same schema.
            let reopen: Reopen = Box::new(move || {
                let connect = open();
                Box::pin(async move { Ok(Arc::new(connect.await?) as Arc<dyn Store>) })
            });
            let code = mode
                .dispatch(Arc::new(ledger), store.clone(), conn.clone(), reopen)
                .await;
            // Only the process that made the schema drops it: a consumer
            // child shares its parent's.
            if args.consumer.is_none() {
                store
                    .drop_schema()
                    .await
                    .context("cannot drop the demo schema")?;
            }
            code
        }
        #[cfg(feature = "mysql")]
        Some(url @ StoreUrl::Mysql(conn)) => {
            let database = mode.queue.replace('-', "_");
            let open = {
                let (conn, database) = (conn.clone(), database.clone());
                move || {
                    idem_mysql::MysqlStore::builder(conn.clone())
                        .database(database.clone())
                        .pool_size(16)
                        .connect()
                }
            };
            let store = open()
                .await
                .with_context(|| format!("cannot reach {url}"))?;
            let ledger = idem_ledger::MysqlLedger::new(store.clone())
                .await
                .context("cannot create the demo ledger")?;
            // --store-faults: a new pool on the same database.
            let reopen: Reopen = Box::new(move || {
                let connect = open();
                Box::pin(async move { Ok(Arc::new(connect.await?) as Arc<dyn Store>) })
            });
            let code = mode
                .dispatch(Arc::new(ledger), store.clone(), conn.clone(), reopen)
                .await;
            // Only the process that made the database drops it: a consumer
            // child shares its parent's.
            if args.consumer.is_none() {
                store
                    .drop_database()
                    .await
                    .context("cannot drop the demo database")?;
            }
            code
        }
        Some(other) => Err(anyhow::anyhow!(
            "--store for the demo must be sqlite:PATH, postgres://... or mysql://... (the ledger keeps its transfers in SQL), not {other}"
        ))
        .or_usage(),
    }
}

/// Opens the SQLite store at `path` again (`--store-faults`' restart).
fn reopen_sqlite(path: PathBuf) -> Reopen {
    Box::new(move || {
        let path = path.clone();
        Box::pin(async move {
            let store = tokio::task::spawn_blocking(move || idem_sqlite::SqliteStore::open(&path))
                .await??;
            Ok(Arc::new(store) as Arc<dyn Store>)
        })
    })
}

/// What the demo runs: over HTTP, or through a broker as the parent or a
/// consumer child.
struct Mode<'a> {
    broker: Option<broker::BrokerUrl>,
    queue: String,
    args: &'a DemoArgs,
}

impl Mode<'_> {
    async fn dispatch<L: Ledger, S: Store + Clone + 'static>(
        &self,
        ledger: Arc<L>,
        store: S,
        store_arg: String,
        reopen: Reopen,
    ) -> anyhow::Result<ExitCode> {
        match (&self.broker, &self.args.consumer) {
            (None, _) => drive(ledger, store, reopen, self.args).await,
            (Some(url), None) if self.args.bench => {
                broker::run_bench(url, &self.queue, ledger, Arc::new(store), self.args).await
            }
            (Some(url), None) => {
                broker::run_parent(
                    url,
                    &self.queue,
                    ledger,
                    Arc::new(store),
                    &store_arg,
                    self.args,
                )
                .await
            }
            (Some(url), Some(queue)) => {
                broker::run_child(
                    url,
                    queue,
                    self.args.consumer_pause.as_deref(),
                    ledger,
                    Arc::new(store),
                )
                .await
            }
        }
    }
}

async fn drive<L: Ledger>(
    ledger: Arc<L>,
    store: impl Store,
    reopen: Reopen,
    args: &DemoArgs,
) -> anyhow::Result<ExitCode> {
    let accounts = args.clients.max(16);
    ledger
        .seed(accounts, START_BALANCE)
        .await
        .context("cannot seed accounts")?;
    let initial = ledger.total().await.context("cannot read the total")?;
    // --store-faults: the layer's store behind the freeze and the restart,
    // and a store timeout the freeze outlasts and the client does not.
    let (layer_store, faulty): (Arc<dyn Store>, _) = if args.store_faults {
        let faulty = Arc::new(FaultyStore::new(Arc::new(store), reopen));
        (faulty.clone(), Some(faulty))
    } else {
        (Arc::new(store), None)
    };
    let mut builder = IdempotencyLayer::builder_shared(layer_store).route(transfer_rule());
    if faulty.is_some() {
        builder = builder.store_timeout(STORE_TIMEOUT_UNDER_FAULTS);
    }
    let layer = builder.build();
    // The watch reads the store's epoch through the faults: a durable
    // store restarted keeps it, and a loss noticed fails the run.
    let watch = faulty.as_ref().map(|_| layer.handle().store_watch());
    let stop_watch = CancellationToken::new();
    let watching = watch.clone().map(|w| w.spawn(stop_watch.clone()));
    let stats = Arc::new(FrontStats::default());
    let rates = FaultRates {
        drop: args.drop_rate,
        fail: args.fail_rate,
        slow: args.slow_rate,
        slow_by: CLIENT_TIMEOUT + Duration::from_millis(400),
    };
    let base = faults::serve(
        router(ledger.clone(), layer),
        rates,
        args.seed,
        stats.clone(),
    )
    .await?;
    let url = format!("{base}/transfers");

    let http = reqwest::Client::builder()
        .timeout(CLIENT_TIMEOUT)
        .build()
        .context("http client")?;
    // The demo injects faults into a third of first attempts, which a
    // default budget (10%) would read as an outage; it allows 50% here, so
    // that most faults are retried and some are still refused.
    let retrier = Retrier::new(
        RetryPolicy::builder()
            .max_attempts(4)
            .backoff(Backoff::new(
                Duration::from_millis(20),
                Duration::from_millis(500),
            ))
            .budget(Arc::new(RetryBudget::new(Duration::from_secs(10), 10, 0.5)))
            .build(),
    );
    let plans = Arc::new(plans(args, accounts));
    let done = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let progress = tokio::spawn(report::progress(
        done.clone(),
        args.intents,
        std::io::stderr().is_terminal(),
    ));
    let stop_faults = CancellationToken::new();
    let schedule = faulty.clone().map(|f| {
        tokio::spawn(store_faults::schedule(
            f,
            done.clone(),
            args.intents,
            stop_faults.clone(),
        ))
    });

    let workers: Vec<_> = (0..args.clients)
        .map(|_| {
            let (http, retrier, plans, url, done, next) = (
                http.clone(),
                retrier.clone(),
                plans.clone(),
                url.clone(),
                done.clone(),
                next.clone(),
            );
            tokio::spawn(async move {
                let mut intents = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(plan) = plans.get(i) else { break };
                    intents.push(run_intent(&http, &retrier, &url, plan).await);
                    done.fetch_add(1, Ordering::Relaxed);
                }
                intents
            })
        })
        .collect();
    let mut intents = Vec::with_capacity(args.intents);
    for w in workers {
        intents.extend(w.await.context("a client task failed")?);
    }
    progress.abort();
    // A phase begun runs to its end; one not begun is skipped.
    stop_faults.cancel();
    let phases = match schedule {
        Some(s) => Some(s.await.context("the store-fault schedule failed")??),
        None => None,
    };
    let elapsed = started.elapsed();

    // Calls that ended without an answer are resolved with their keys.
    let patient = Retrier::new(
        RetryPolicy::builder()
            .max_attempts(20)
            .no_budget()
            .backoff(Backoff::new(
                Duration::from_millis(20),
                Duration::from_millis(200),
            ))
            .build(),
    );
    for intent in intents.iter_mut().filter(|i| !i.resolved()) {
        let (status, _, _) = send(&http, &patient, &url, &intent.key, &intent.body).await;
        intent.reconciled = Some(status);
    }

    let mut report = Report::new(intents, &stats, elapsed);
    report.check(&*ledger, initial).await?;
    if let (Some(faulty), Some(phases), Some(watch)) = (faulty, phases, watch) {
        // One last check, after the run, with the loop stopped (one check
        // at a time: their answers are compared in order).
        stop_watch.cancel();
        if let Some(w) = watching {
            w.await.context("the store watch failed")?;
        }
        let last = watch.check_once().await.map(|_| ());
        report.store_faults(faulty.summary(phases), last);
    }
    report.print(args);
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Sends one logical call; returns (final status or 0, body, report).
async fn send(
    http: &reqwest::Client,
    retrier: &Retrier,
    url: &str,
    key: &str,
    body: &serde_json::Value,
) -> (u16, String, idem_retry::CallReport) {
    let (result, report) = retrier
        .call_with_report(CallSpec::keyed().with_key(key), |_| {
            http.post(url)
                .header(idem_http::IDEMPOTENCY_KEY, key)
                .json(body)
                .send()
        })
        .await;
    match result {
        Ok(resp) => {
            let status = resp.status().as_u16();
            (status, resp.text().await.unwrap_or_default(), report)
        }
        Err(RetryError::KeyExpired { .. }) | Err(_) => (0, String::new(), report),
    }
}

async fn run_intent(http: &reqwest::Client, retrier: &Retrier, url: &str, plan: &Plan) -> Intent {
    let start = Instant::now();
    let ((status, body, report), twin) = if plan.duplicate {
        let (a, b) = tokio::join!(
            send(http, retrier, url, &plan.key, &plan.body),
            send(http, retrier, url, &plan.key, &plan.body)
        );
        (a, Some((b.0, b.1, b.2)))
    } else {
        (send(http, retrier, url, &plan.key, &plan.body).await, None)
    };
    let latency = start.elapsed();
    let mut intent = Intent {
        key: plan.key.clone(),
        body: plan.body.clone(),
        status,
        response: body,
        latency,
        attempts: report.attempts + twin.as_ref().map_or(0, |t| t.2.attempts),
        denied_by_budget: u32::from(report.stop == Stop::BudgetExhausted)
            + twin
                .as_ref()
                .map_or(0, |t| u32::from(t.2.stop == Stop::BudgetExhausted)),
        twin: twin.map(|t| (t.0, t.1)),
        reuse: None,
        reconciled: None,
    };
    if plan.reuse && intent.resolved() {
        // The same key, once answered, with a changed amount: a client bug
        // that must be refused (422) and never executed.
        let mut changed = plan.body.clone();
        changed["amount"] = serde_json::json!(plan.body["amount"].as_i64().unwrap_or(1) + 1);
        let (status, text, _) = send(http, retrier, url, &plan.key, &changed).await;
        intent.reuse = Some((status, text.contains("urn:idem:problem:key-reused")));
    }
    intent
}
