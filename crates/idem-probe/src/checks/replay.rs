//! The key is required, and a retry is answered with the first result.

use std::sync::Mutex;

use super::common::{Finding, pair};
use crate::detect::{Answer, Outcome};
use crate::report::Verdict;
use crate::runner::Probe;

/// `key-required`: the request without a key must be refused.
pub(crate) async fn key_required(probe: &Probe) -> Finding {
    let ev = Mutex::default();
    let answer = match probe.send(&probe.req(None), &ev).await {
        Ok(a) => a,
        Err(e) => return Finding::with(Verdict::CouldNotTell, e, ev),
    };
    let (verdict, reason) = if answer.is_auth_refusal() {
        (
            Verdict::CouldNotTell,
            format!(
                "refused with {} by authentication before the key could matter (give --credential)",
                answer.status
            ),
        )
    } else if answer.is_refusal() {
        (Verdict::Pass, format!("refused with {}", answer.status))
    } else if answer.is_success() {
        (
            Verdict::Fail,
            format!("executed without a key ({})", answer.status),
        )
    } else {
        (
            Verdict::CouldNotTell,
            format!(
                "answered {}, neither a refusal nor a success",
                answer.status
            ),
        )
    };
    Finding::with(verdict, reason, ev)
}

/// `retry-replays-response`: the same request and key twice.
pub(crate) async fn retry_replays_response(probe: &Probe) -> Finding {
    let ev = Mutex::default();
    let req = probe.req(Some(probe.key()));
    let p = match pair(probe, &req, &req, true, &ev).await {
        Ok(p) => p,
        Err(e) => return Finding::with(Verdict::CouldNotTell, e, ev),
    };
    // Only a retry told to be a replay has a marker to judge.
    if let (true, Ok(mut r)) = (p.outcome == Outcome::Replayed, probe.replay.lock()) {
        *r = Some((p.second.clone(), p.by_id));
    }
    let differences = differences(&p.first, &p.second);
    let (verdict, reason) = match p.outcome {
        Outcome::Separate => (Verdict::Fail, "the retry executed again".to_owned()),
        _ if p.second.status >= 500
            || matches!(p.second.status, 408 | 429)
            || p.second.is_auth_refusal() =>
        {
            (
                Verdict::CouldNotTell,
                format!(
                    "the retry got {}: an outage, a limit or a credential, which says nothing of the key",
                    p.second.status
                ),
            )
        }
        _ if !differences.is_empty() => (
            Verdict::Fail,
            format!("the retry's answer differs: {}", differences.join("; ")),
        ),
        Outcome::Replayed => (
            Verdict::Pass,
            format!("replayed {} with the same body and headers", p.first.status),
        ),
        _ => (Verdict::CouldNotTell, p.unknown_reason()),
    };
    let mut finding = Finding::with(verdict, reason, ev);
    // A difference in the answers fails whatever the ids say.
    finding.by_id = p.by_id
        && match p.outcome {
            Outcome::Separate => true,
            Outcome::Replayed => differences.is_empty(),
            _ => false,
        };
    finding
}

/// What differs between the first answer and its replay.
fn differences(first: &Answer, second: &Answer) -> Vec<String> {
    let mut d = Vec::new();
    if first.status != second.status {
        d.push(format!("status {} then {}", first.status, second.status));
    }
    if first.location != second.location {
        d.push(format!(
            "Location {:?} then {:?}",
            first.location, second.location
        ));
    }
    if first.content_type != second.content_type {
        d.push(format!(
            "Content-Type {:?} then {:?}",
            first.content_type, second.content_type
        ));
    }
    if first.body != second.body {
        d.push("the body".to_owned());
    }
    d
}

/// `replay-marked`: the replay seen by `retry-replays-response` carries
/// `Idempotent-Replayed: true`. Advisory: the draft does not require it.
pub(crate) fn replay_marked(probe: &Probe) -> Finding {
    let replay = probe.replay.lock().ok().and_then(|r| r.clone());
    let by_id = replay.as_ref().is_some_and(|(_, by_id)| *by_id);
    let mut finding = match replay.map(|(a, _)| a) {
        None => Finding::new(
            Verdict::CouldNotTell,
            "retry-replays-response did not run, or nothing told that its retry was a replay",
        ),
        Some(a) if a.marked_replay() => Finding::new(
            Verdict::Pass,
            "the replay carries Idempotent-Replayed: true",
        ),
        Some(a) if !a.is_success() => Finding::new(
            Verdict::CouldNotTell,
            format!("the retry was answered {}", a.status),
        ),
        Some(_) => Finding::new(
            Verdict::Fail,
            "the replay carries no Idempotent-Replayed header",
        ),
    };
    // Void with the retry's verdict where ids told it was a replay.
    finding.by_id = by_id && finding.verdict == Verdict::Fail;
    finding
}
