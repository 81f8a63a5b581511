//! The demo's progress line, its report table, and the invariant checks.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_ledger::Ledger;

use super::faults::FrontStats;
use super::store_faults::Summary;
use crate::cli::DemoArgs;

/// What became of one intent.
#[derive(Debug)]
pub(crate) struct Intent {
    pub(crate) key: String,
    pub(crate) body: serde_json::Value,
    /// Final status of the call (0: no answer).
    pub(crate) status: u16,
    pub(crate) response: String,
    pub(crate) latency: Duration,
    pub(crate) attempts: u32,
    pub(crate) denied_by_budget: u32,
    /// The concurrent duplicate's status and body, if one was sent.
    pub(crate) twin: Option<(u16, String)>,
    /// The key reused with a changed body: status, and whether it was the
    /// layer's key-reused refusal.
    pub(crate) reuse: Option<(u16, bool)>,
    /// Status after the final reconciliation, for calls that had no answer.
    pub(crate) reconciled: Option<u16>,
}

impl Intent {
    /// A definitive answer: made (201) or refused for funds (422).
    pub(crate) fn resolved(&self) -> bool {
        matches!(self.status, 201 | 422)
            && self.twin.as_ref().is_none_or(|t| matches!(t.0, 201 | 422))
    }

    fn final_status(&self) -> u16 {
        self.reconciled.unwrap_or(self.status)
    }
}

/// Prints progress until aborted: a bar on a terminal, lines otherwise.
pub(crate) async fn progress(done: Arc<AtomicUsize>, total: usize, tty: bool) {
    let mut tick = tokio::time::interval(Duration::from_millis(if tty { 200 } else { 2000 }));
    loop {
        tick.tick().await;
        let n = done.load(Ordering::Relaxed);
        let mut err = std::io::stderr();
        if tty {
            let width = 40;
            let filled = n * width / total.max(1);
            let _ = write!(
                err,
                "\r[{}{}] {n}/{total} intents",
                "#".repeat(filled),
                ".".repeat(width - filled)
            );
            let _ = err.flush();
        } else {
            let _ = writeln!(err, "progress: {n}/{total} intents");
        }
    }
}

#[derive(Debug)]
struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
}

pub(crate) struct Report {
    intents: Vec<Intent>,
    attempts: u64,
    executed: u64,
    replayed: u64,
    conflicts: u64,
    mismatches: u64,
    released: u64,
    injected_503: u64,
    dropped: u64,
    slowed: u64,
    elapsed: Duration,
    checks: Vec<Check>,
    store_faults: Option<Summary>,
}

impl Report {
    pub(crate) fn new(intents: Vec<Intent>, s: &FrontStats, elapsed: Duration) -> Report {
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        Report {
            intents,
            attempts: get(&s.attempts),
            executed: get(&s.executed),
            replayed: get(&s.replayed),
            conflicts: get(&s.conflicts),
            mismatches: get(&s.mismatches),
            released: get(&s.released),
            injected_503: get(&s.injected_503),
            dropped: get(&s.dropped),
            slowed: get(&s.slowed),
            elapsed,
            checks: Vec::new(),
            store_faults: None,
        }
    }

    pub(crate) fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }

    fn record(&mut self, name: &'static str, ok: bool, detail: String) {
        self.checks.push(Check { name, ok, detail });
    }

    /// Runs the invariant checks against the ledger.
    pub(crate) async fn check<L: Ledger>(
        &mut self,
        ledger: &L,
        initial: i64,
    ) -> anyhow::Result<()> {
        let unresolved: Vec<_> = self
            .intents
            .iter()
            .filter(|i| !matches!(i.final_status(), 201 | 422))
            .map(|i| i.key.clone())
            .collect();
        self.record(
            "every intent answered",
            unresolved.is_empty(),
            format!("{} unanswered even after reconciliation", unresolved.len()),
        );

        let mut wrong = Vec::new();
        let mut made = 0i64;
        for i in &self.intents {
            let rows = ledger.transfers_with_key(&i.key).await?;
            let expected = i64::from(i.final_status() == 201);
            made += expected;
            if rows != expected {
                wrong.push(format!(
                    "{} has {rows} transfers (answered {}, twin {:?}, reconciled {:?})",
                    i.key,
                    i.status,
                    i.twin.as_ref().map(|t| t.0),
                    i.reconciled
                ));
            }
        }
        let count = ledger.transfer_count().await?;
        self.record(
            "one transfer per intent",
            wrong.is_empty() && count == made,
            if wrong.is_empty() {
                format!("{count} transfers for {made} intents made")
            } else {
                wrong.join("; ")
            },
        );

        let total = ledger.total().await?;
        self.record(
            "money conserved",
            total == initial,
            format!("total {total}, started with {initial}"),
        );

        let twins: Vec<_> = self.intents.iter().filter(|i| i.twin.is_some()).collect();
        // Pairs where both calls got a definitive answer must have the same
        // one; a call the budget stopped early has none to compare.
        let diverged = twins
            .iter()
            .filter(|i| {
                i.resolved()
                    && i.twin
                        .as_ref()
                        .is_some_and(|(s, b)| *s != i.status || *b != i.response)
            })
            .count();
        self.record(
            "duplicates answered alike",
            diverged == 0,
            format!(
                "{} concurrent pairs, {} both answered, {diverged} differently",
                twins.len(),
                twins.iter().filter(|i| i.resolved()).count()
            ),
        );

        // A reuse whose own call hit injected faults until it gave up has
        // no answer to judge; every answer it did get must be the refusal.
        let reuses: Vec<_> = self.intents.iter().filter_map(|i| i.reuse).collect();
        let answered: Vec<_> = reuses.iter().filter(|(s, _)| *s != 0 && *s < 500).collect();
        let refused = answered
            .iter()
            .filter(|(s, typed)| *s == 422 && *typed)
            .count();
        self.record(
            "changed bodies refused",
            refused == answered.len(),
            format!(
                "{refused} of {} answered reuses got 422 key-reused ({} sent)",
                answered.len(),
                reuses.len()
            ),
        );
        Ok(())
    }

    /// `--store-faults`: what the schedule did, and one more invariant: the
    /// store's epoch showed no loss (`last`: the check after the run).
    pub(crate) fn store_faults(
        &mut self,
        summary: Summary,
        last: Result<(), idem_core::StoreError>,
    ) {
        let (ok, detail) = match (&last, summary.losses.first()) {
            (_, Some(loss)) => (false, loss.clone()),
            (Err(e), None) => (false, format!("the last epoch check failed: {e}")),
            (Ok(()), None) => (
                true,
                format!("{} epoch checks, no loss noticed", summary.checks),
            ),
        };
        self.record("store kept its records", ok, detail);
        self.store_faults = Some(summary);
    }

    fn print_store_faults(s: &Summary) {
        let phase = |p: Option<(usize, Duration)>| match p {
            Some((at, d)) => format!("{:.2} s, from {at} intents done", d.as_secs_f64()),
            None => "not reached (the run ended first)".to_owned(),
        };
        let rows = [
            ("freeze", phase(s.freeze)),
            (
                "  calls delayed",
                format!(
                    "{} ({} given up before the thaw: 503 or client gone)",
                    s.delayed, s.gave_up
                ),
            ),
            ("restart (closed, reopened)", phase(s.restart)),
            ("  calls failed (unavailable)", s.failed.to_string()),
            (
                "epoch",
                if s.losses.is_empty() {
                    format!("no loss noticed ({} checks)", s.checks)
                } else {
                    format!("LOSS NOTICED: {}", s.losses.join("; "))
                },
            ),
        ];
        println!("\nstore faults:");
        let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in &rows {
            println!("  {k:<w$}  {v}");
        }
    }

    pub(crate) fn print(&self, args: &DemoArgs) {
        let mut latencies: Vec<Duration> = self.intents.iter().map(|i| i.latency).collect();
        latencies.sort();
        let pct = |p: usize| {
            latencies
                .get((latencies.len() * p / 100).min(latencies.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        let client_attempts: u64 = self.intents.iter().map(|i| u64::from(i.attempts)).sum();
        let denied: u32 = self.intents.iter().map(|i| i.denied_by_budget).sum();
        let reconciled = self
            .intents
            .iter()
            .filter(|i| i.reconciled.is_some())
            .count();
        let made = self
            .intents
            .iter()
            .filter(|i| i.final_status() == 201)
            .count();
        let refused = self
            .intents
            .iter()
            .filter(|i| i.final_status() == 422)
            .count();
        let rows: Vec<(&str, String)> = vec![
            (
                "intents",
                format!(
                    "{} ({made} made, {refused} refused for funds)",
                    self.intents.len()
                ),
            ),
            ("clients", args.clients.to_string()),
            ("attempts (at the server)", self.attempts.to_string()),
            ("attempts (by the clients)", client_attempts.to_string()),
            ("executed", self.executed.to_string()),
            ("replayed", self.replayed.to_string()),
            ("conflicts (409 in flight)", self.conflicts.to_string()),
            ("mismatches rejected (422)", self.mismatches.to_string()),
            ("released (5xx)", self.released.to_string()),
            ("injected: 503 before commit", self.injected_503.to_string()),
            (
                "injected: answers lost after commit",
                self.dropped.to_string(),
            ),
            (
                "injected: answers after client timeout",
                self.slowed.to_string(),
            ),
            ("retries denied by budget", denied.to_string()),
            ("resolved by reconciliation", reconciled.to_string()),
            (
                "latency p50 / p99",
                format!("{:.1} ms / {:.1} ms", ms(pct(50)), ms(pct(99))),
            ),
            ("wall time", format!("{:.1} s", self.elapsed.as_secs_f64())),
        ];
        eprintln!();
        println!(
            "idem demo: {} intents through injected faults\n",
            self.intents.len()
        );
        let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in &rows {
            println!("  {k:<w$}  {v}");
        }
        if let Some(s) = &self.store_faults {
            Report::print_store_faults(s);
        }
        println!("\ninvariants:");
        for c in &self.checks {
            println!(
                "  [{}] {:<28} {}",
                if c.ok { " ok " } else { "FAIL" },
                c.name,
                c.detail
            );
        }
        println!(
            "\n{}",
            if self.ok() {
                "all invariants hold: one effect per intent"
            } else {
                "INVARIANTS VIOLATED"
            }
        );
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
