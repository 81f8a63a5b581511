//! Concurrent duplicates execute once; an in-flight duplicate gets 409
//! with `Retry-After`, or waits for the first and replays it.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::common::Finding;
use crate::detect::{Outcome, judge};
use crate::report::Verdict;
use crate::runner::Probe;

/// `concurrent-duplicates-execute-once`: `--concurrency` requests with one
/// key, all sent at once.
pub(crate) async fn execute_once(probe: &Probe) -> Finding {
    let n = probe.options.concurrency;
    if n < 2 {
        return Finding::new(Verdict::NotApplicable, "--concurrency is below 2");
    }
    if !probe.budget.take(n) {
        return Finding::new(
            Verdict::CouldNotTell,
            format!("the request budget cannot pay for {n} requests"),
        );
    }
    let ev = Mutex::default();
    let req = probe.req(Some(probe.key()));
    let before = probe.effect_count(&ev).await;
    let sends = (0..n).map(|_| probe.send_taken(&req, &ev));
    let results = futures_util::future::join_all(sends).await;
    let after = probe.effect_count(&ev).await;
    let answers: Vec<_> = results.iter().flatten().collect();
    let successes: Vec<_> = answers.iter().filter(|a| a.is_success()).collect();
    // A request that failed, or an answer that is neither a success nor a
    // conflict (a 5xx, a timeout), may have executed unseen: a pass then
    // proves nothing, while more than one execution seen is still a fail.
    let unclear = results.len() - answers.len()
        + answers
            .iter()
            .filter(|a| !a.is_success() && a.status != 409)
            .count()
        // With ids to judge by, a success without one may have executed
        // unseen.
        + if probe.detection.id_pointer.is_some() {
            successes.iter().filter(|a| a.id.is_none()).count()
        } else {
            0
        };
    let ids: HashSet<_> = successes.iter().filter_map(|a| a.id.as_ref()).collect();
    let mut by_id = false;
    let (verdict, reason) = if let Some(d) = before.zip(after).and_then(|(b, a)| a.checked_sub(b)) {
        match d {
            ..=0 => (
                Verdict::CouldNotTell,
                "the effect count did not move".to_owned(),
            ),
            1 if unclear > 0 => (
                Verdict::CouldNotTell,
                format!(
                    "effect count +1, but {unclear} of {n} requests failed or were answered neither 2xx nor 409"
                ),
            ),
            1 => (
                Verdict::Pass,
                format!("{n} requests, one execution (effect count +1)"),
            ),
            d => (
                Verdict::Fail,
                format!("{n} requests with one key executed {d} times (effect count)"),
            ),
        }
    } else if probe.detection.id_pointer.is_some()
        || successes.iter().all(|a| a.id.is_some()) && !successes.is_empty()
    {
        by_id = true;
        match ids.len() {
            0 => (
                Verdict::CouldNotTell,
                format!("no request succeeded ({} answers)", answers.len()),
            ),
            1 if unclear > 0 => (
                Verdict::CouldNotTell,
                format!(
                    "one resource answered, but {unclear} of {n} requests failed or were answered neither 2xx nor 409"
                ),
            ),
            1 => (
                Verdict::Pass,
                format!(
                    "{n} requests, {} answered with one resource",
                    successes.len()
                ),
            ),
            k => (
                Verdict::Fail,
                format!("{n} requests with one key created {k} resources"),
            ),
        }
    } else if successes.len() == 1 && unclear == 0 {
        (
            Verdict::Pass,
            "one request succeeded, the others got 409".to_owned(),
        )
    } else {
        (
            Verdict::CouldNotTell,
            "no --id-pointer, Location or --effect-url tells executions apart".to_owned(),
        )
    };
    let mut finding = Finding::with(verdict, reason, ev);
    finding.by_id = by_id && matches!(finding.verdict, Verdict::Pass | Verdict::Fail);
    finding
}

/// `in-flight-duplicate-conflicts`: a second request sent while the first
/// is running.
pub(crate) async fn in_flight(probe: &Probe) -> Finding {
    if probe.options.concurrency < 2 {
        return Finding::new(Verdict::NotApplicable, "--concurrency is below 2");
    }
    if !probe.budget.take(2) {
        return Finding::new(
            Verdict::CouldNotTell,
            "the request budget cannot pay for 2 requests",
        );
    }
    let ev = Mutex::default();
    let req = probe.req(Some(probe.key()));
    let first_done = AtomicBool::new(false);
    let first_done_before_second = AtomicBool::new(false);
    let (a, b) = tokio::join!(
        async {
            let a = probe.send_taken(&req, &ev).await;
            first_done.store(true, Ordering::SeqCst);
            a
        },
        async {
            tokio::task::yield_now().await;
            first_done_before_second.store(first_done.load(Ordering::SeqCst), Ordering::SeqCst);
            probe.send_taken(&req, &ev).await
        }
    );
    let (a, b) = match (a, b) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return Finding::with(Verdict::CouldNotTell, e, ev),
    };
    let conflict = [&a, &b].into_iter().find(|x| x.status == 409);
    let mut by_id = false;
    let (verdict, reason) = match conflict {
        Some(c) if c.retry_after.is_some() => (
            Verdict::Pass,
            "the duplicate got 409 with Retry-After".to_owned(),
        ),
        Some(_) => (
            Verdict::Fail,
            "the duplicate got 409 without Retry-After".to_owned(),
        ),
        // A limit, a credential or an outage says nothing of the key.
        None if [&a, &b]
            .iter()
            .any(|x| x.is_auth_refusal() || matches!(x.status, 408 | 429) || x.status >= 500) =>
        {
            (
                Verdict::CouldNotTell,
                format!(
                    "answered {} and {}: a limit, a credential or an outage, not the key",
                    a.status, b.status
                ),
            )
        }
        None if !a.is_success() || !b.is_success() => (
            Verdict::Fail,
            format!(
                "answered {} and {}: neither a conflict nor a replay",
                a.status, b.status
            ),
        ),
        None if first_done_before_second.load(Ordering::SeqCst) => (
            Verdict::CouldNotTell,
            "the operation was too fast to overlap with the duplicate".to_owned(),
        ),
        None => match judge(&a, &b, None) {
            Outcome::Replayed if a.id.is_some() && b.id.is_some() => {
                by_id = true;
                (
                    Verdict::Pass,
                    "the duplicate was answered with the first's result (same resource id)"
                        .to_owned(),
                )
            }
            Outcome::Replayed => (
                Verdict::Pass,
                "the duplicate was answered with the first's result".to_owned(),
            ),
            Outcome::Separate => (
                Verdict::CouldNotTell,
                "the duplicate executed on its own: concurrent-duplicates-execute-once's rule"
                    .to_owned(),
            ),
            _ => (
                Verdict::CouldNotTell,
                "nothing tells a replay from a new execution".to_owned(),
            ),
        },
    };
    let mut finding = Finding::with(verdict, reason, ev);
    finding.by_id = by_id;
    finding
}
