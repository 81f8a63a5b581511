//! HTTP throughput and p99, each as a ratio to a baseline measured in the
//! same run over loopback:
//!
//! 1. the idem-http layer in-process, in front of a minimal axum handler,
//!    against the same handler without it;
//! 2. `idem serve` (the release binary, its own process) in front of an
//!    upstream, against the same upstream reached directly.
//!
//! Each for new keys and replays, on the memory and SQLite stores; the
//! gateway also for passthrough (no key), with its CPU per request: the
//! process's utime+stime from `/proc/PID/stat` over the requests it served
//! (steadier than requests/s on a shared machine).
//! `IDEM_BENCH_SECS` (default 5) sets the seconds per figure;
//! `IDEM_BENCH_CONCURRENCY` (default 32) the client tasks;
//! `IDEM_BENCH_ONLY=gateway` skips the layer, `IDEM_BENCH_ONLY=layer` the
//! gateway; `IDEM_BENCH_ROUNDS` (default 1) measures the layer's table that
//! many times, each round against its own baseline, and prints medians; `IDEM_BENCH_BIN` runs another
//! `idem` binary as the gateway (an older build, for before/after). The load
//! generator is reqwest with keep-alive connections in this process, so
//! client, gateway and upstream share the 2 cores alike in every row.

mod common;

/// mimalloc, as in the `idem` binary: an application that puts the layer on
/// its hot path picks its allocator, and glibc's malloc makes the threads
/// of this process wait on its arena locks (docs/benchmarks-history.md,
/// 2026-12-01 late).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use common::handler_app;
use idem_core::{MemoryStore, Store};
use idem_http::IdempotencyLayer;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
    format!("http://{addr}")
}

#[derive(Clone, Copy)]
enum Keys {
    None,
    New,
    Replay,
}

/// Requests per second and p99 latency (ms) against `url`, and how many
/// requests were sent in all (warm-up included).
async fn load_counted(url: &str, keys: Keys, secs: u64, tasks: u64) -> ((f64, f64), u64) {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let client = reqwest::Client::new();
    let stop = Arc::new(AtomicBool::new(false));
    let warm = Instant::now() + Duration::from_millis(300);
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (client, url, stop) = (client.clone(), url.to_owned(), stop.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let mut req = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(r#"{"item":"book","qty":1}"#);
                    match keys {
                        Keys::None => {}
                        Keys::New => {
                            req =
                                req.header("idempotency-key", format!("bench-{run}-{t:04}-{n:010}"))
                        }
                        Keys::Replay => {
                            req = req
                                .header("idempotency-key", format!("bench-{run}-{t:04}-replayed"))
                        }
                    }
                    let start = Instant::now();
                    let resp = req.send().await.expect("request");
                    assert_eq!(resp.status(), 201, "unexpected status");
                    let _ = resp.bytes().await.expect("body");
                    if start > warm {
                        latencies.push(start.elapsed());
                    }
                }
                (latencies, n)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300) + Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut sent = 0;
    for h in handles {
        let (latencies, n) = h.await.expect("task");
        all.extend(latencies);
        sent += n;
    }
    all.sort();
    let p99 = all.get(all.len() * 99 / 100).copied().unwrap_or_default();
    (
        (all.len() as f64 / secs as f64, p99.as_secs_f64() * 1000.0),
        sent,
    )
}

/// Requests per second and p99 latency (ms) against `url`.
async fn load(url: &str, keys: Keys, secs: u64, tasks: u64) -> (f64, f64) {
    load_counted(url, keys, secs, tasks).await.0
}

/// utime+stime of process `pid` in seconds, from `/proc/PID/stat`.
fn cpu_seconds(pid: u32, ticks_per_second: f64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc stat");
    // Fields after the command name (which may hold spaces) start at 3.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields[i - 3].parse::<f64>().expect("ticks");
    (ticks(14) + ticks(15)) / ticks_per_second
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn header(title: &str, base: (f64, f64)) {
    println!("\n{title}\n");
    println!("| configuration | requests/s | ratio | p99 ms | p99 ratio | CPU µs/request |");
    println!("|---|---:|---:|---:|---:|---:|");
    row_cpu("baseline", base, base, None);
}

/// One figure of one round of the in-process table.
#[derive(Clone, Copy)]
struct Measured {
    per_second: f64,
    ratio: f64,
    p99_ms: f64,
    cpu_us: f64,
}

impl Measured {
    fn new(((per_second, p99_ms), cpu_us): ((f64, f64), f64), base_per_second: f64) -> Measured {
        Measured {
            per_second,
            ratio: per_second / base_per_second,
            p99_ms,
            cpu_us,
        }
    }
}

/// The median; of an even count, the mean of the middle two.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match (values.get(n.wrapping_sub(1) / 2), values.get(n / 2)) {
        (Some(a), Some(b)) => (a + b) / 2.0,
        _ => f64::NAN,
    }
}

/// Requests/s and p99 against `url`, with the CPU (utime+stime) process
/// `pid` spent per request sent.
async fn load_with_cpu(
    url: &str,
    keys: Keys,
    secs: u64,
    tasks: u64,
    pid: u32,
    hz: f64,
) -> ((f64, f64), f64) {
    let before = cpu_seconds(pid, hz);
    let (r, sent) = load_counted(url, keys, secs, tasks).await;
    (
        r,
        (cpu_seconds(pid, hz) - before) * 1e6 / sent.max(1) as f64,
    )
}

/// [`load_with_cpu`] of this whole process: load generator, server and
/// handler together, for the in-process table.
async fn load_in_process(
    url: &str,
    keys: Keys,
    secs: u64,
    tasks: u64,
    hz: f64,
) -> ((f64, f64), f64) {
    load_with_cpu(url, keys, secs, tasks, std::process::id(), hz).await
}

fn row_cpu(name: &str, r: (f64, f64), base: (f64, f64), cpu_us: Option<f64>) {
    println!(
        "| {name} | {:.0} | {:.2} | {:.2} | {:.2} | {} |",
        r.0,
        r.0 / base.0,
        r.1,
        r.1 / base.1,
        cpu_us.map_or(String::new(), |c| format!("{c:.0}"))
    );
}

struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `idem serve`; `config` is a TOML file making the key optional on
/// `POST /orders`, so keyless POSTs measure passthrough.
async fn start_gateway(upstream: &str, store: &str, config: &std::path::Path) -> (Gateway, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let gateway = Gateway(
        Command::new(
            std::env::var("IDEM_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_idem").into()),
        )
        .args(["serve", "--upstream", upstream, "--store", store])
        .arg("--config")
        .arg(config)
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-listen",
            &format!("127.0.0.1:{admin}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("idem serve"),
    );
    let health = format!("http://127.0.0.1:{admin}/healthz");
    for _ in 0..200 {
        if reqwest::get(&health)
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return (gateway, format!("http://127.0.0.1:{port}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("idem serve did not start");
}

fn main() {
    let secs = env_or("IDEM_BENCH_SECS", 5);
    let tasks = env_or("IDEM_BENCH_CONCURRENCY", 32);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");

        let only = std::env::var("IDEM_BENCH_ONLY").unwrap_or_default();
        let (only_gateway, only_layer) = (only == "gateway", only == "layer");
        let rounds = env_or("IDEM_BENCH_ROUNDS", 1).max(1);
        // 1. The layer, in-process.
        if !only_gateway {
            let plain = serve(handler_app()).await;
            let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
            let sqlite: Arc<dyn Store> = Arc::new(
                idem_sqlite::SqliteStore::open(dir.path().join("layer.db")).expect("sqlite"),
            );
            let with_memory =
                serve(handler_app().layer(IdempotencyLayer::builder_shared(memory).build())).await;
            let with_sqlite =
                serve(handler_app().layer(IdempotencyLayer::builder_shared(sqlite).build())).await;
            let hz = clock_ticks();
            let rows = [
                ("memory", "new keys", &with_memory, Keys::New),
                ("memory", "replays", &with_memory, Keys::Replay),
                ("sqlite", "new keys", &with_sqlite, Keys::New),
                ("sqlite", "replays", &with_sqlite, Keys::Replay),
            ];
            // Each round measures the baseline and every row: a row's ratio
            // is to the baseline of its own round, and the table shows
            // medians over the rounds.
            let mut measured: Vec<Vec<Measured>> = vec![Vec::new(); rows.len() + 1];
            for round in 0..rounds {
                // Figure 0 is the bare handler; each round starts one
                // figure later, so drift within a round lands on every row.
                let mut figures = vec![((0.0, 0.0), 0.0); rows.len() + 1];
                for n in 0..figures.len() {
                    let i = (n + round as usize) % figures.len();
                    figures[i] = match i.checked_sub(1).and_then(|r| rows.get(r)) {
                        None => {
                            load_in_process(&format!("{plain}/orders"), Keys::None, secs, tasks, hz)
                                .await
                        }
                        Some((_, _, url, keys)) => {
                            load_in_process(&format!("{url}/orders"), *keys, secs, tasks, hz).await
                        }
                    };
                }
                let base = figures[0].0.0;
                for (i, figure) in figures.into_iter().enumerate() {
                    measured[i].push(Measured::new(figure, base));
                }
            }
            println!(
                "\nidem-http layer in-process (baseline: the same axum handler without it; \
                 CPU is this whole process's, load generator included; each column the median of {rounds} \
                 round(s), each round's ratio to its own baseline)\n"
            );
            println!("| configuration | requests/s | ratio | p99 ms | CPU µs/request |");
            println!("|---|---:|---:|---:|---:|");
            let names = std::iter::once("baseline".to_owned()).chain(
                rows.iter()
                    .map(|(store, label, _, _)| format!("layer, {store}, {label}")),
            );
            for (name, m) in names.zip(&measured) {
                let med = |f: fn(&Measured) -> f64| median(m.iter().map(f).collect());
                println!(
                    "| {name} | {:.0} | {:.2} | {:.2} | {:.0} |",
                    med(|m| m.per_second),
                    med(|m| m.ratio),
                    med(|m| m.p99_ms),
                    med(|m| m.cpu_us),
                );
            }
        }
        if only_layer {
            return;
        }

        // 2. The gateway process.
        let upstream = serve(handler_app()).await;
        let base = load(&format!("{upstream}/orders"), Keys::None, secs, tasks).await;
        header(
            "idem serve (baseline: the same upstream reached directly)",
            base,
        );
        let sqlite_url = format!("sqlite:{}", dir.path().join("gateway.db").display());
        let hz = clock_ticks();
        let config = dir.path().join("gateway.toml");
        std::fs::write(
            &config,
            "[[route]]\nmethod = \"POST\"\npath = \"/orders\"\nkey = \"optional\"\n",
        )
        .expect("config");
        for (name, store) in [("memory", "memory:"), ("sqlite", sqlite_url.as_str())] {
            let (gateway, url) = start_gateway(&upstream, store, &config).await;
            let pid = gateway.0.id();
            for (label, keys) in [
                ("passthrough", Keys::None),
                ("new keys", Keys::New),
                ("replays", Keys::Replay),
            ] {
                let (r, cpu_us) =
                    load_with_cpu(&format!("{url}/orders"), keys, secs, tasks, pid, hz).await;
                row_cpu(
                    &format!("idem serve, {name}, {label}"),
                    r,
                    base,
                    Some(cpu_us),
                );
            }
        }
    });
}
