//! Failures: a deterministic 4xx of the operation is stored and replayed;
//! a transient one (5xx, 429) is not, so the key can be used again.

use std::sync::Mutex;

use super::common::Finding;
use crate::report::Verdict;
use crate::runner::{Probe, Req};

/// `deterministic-failure-replayed`: `--failing-body` twice with one key.
pub(crate) async fn deterministic_replayed(probe: &Probe) -> Finding {
    let Some(body) = probe.target.failing_body.clone() else {
        return Finding::new(
            Verdict::NotApplicable,
            "needs --failing-body (a body the operation refuses with a 4xx)",
        );
    };
    let ev = Mutex::default();
    let req = Req {
        body,
        ..probe.req(Some(probe.key()))
    };
    let first = match probe.send(&req, &ev).await {
        Ok(a) => a,
        Err(e) => return Finding::with(Verdict::CouldNotTell, e, ev),
    };
    if !first.is_refusal() || first.is_auth_refusal() {
        return Finding::with(
            Verdict::CouldNotTell,
            format!(
                "--failing-body was answered {}, not a deterministic 4xx of the operation (401 and 403 are the credential's)",
                first.status
            ),
            ev,
        );
    }
    let second = match probe.send(&req, &ev).await {
        Ok(a) => a,
        Err(e) => return Finding::with(Verdict::CouldNotTell, e, ev),
    };
    // The same answer first: a failure that is itself a 409 (a business
    // conflict) is rightly answered 409 again.
    let (verdict, reason) = if second.same_as(&first) && second.marked_replay() {
        (
            Verdict::Pass,
            format!("{} replayed and marked", first.status),
        )
    } else if second.same_as(&first) {
        (
            Verdict::Pass,
            format!(
                "the retry got the same {} (not marked as a replay)",
                first.status
            ),
        )
    } else if second.status == first.status {
        // A 4xx changed nothing: the same refusal computed again (a fresh
        // trace id or `instance` in its body) serves the client as well.
        (
            Verdict::Pass,
            format!(
                "the retry got {} again, its body not identical (computed again, not replayed)",
                first.status
            ),
        )
    } else if second.is_auth_refusal() || !second.is_refusal() && second.status != 409 {
        (
            Verdict::CouldNotTell,
            format!(
                "the retry got {} after {}: a credential, a limit or an outage, not the key",
                second.status, first.status
            ),
        )
    } else if second.status == 409 {
        (
            Verdict::Fail,
            "the retry got 409: the failure was not stored as an answer".to_owned(),
        )
    } else {
        (
            Verdict::Fail,
            format!("the retry got {} after {}", second.status, first.status),
        )
    };
    Finding::with(verdict, reason, ev)
}

/// `transient-failure-not-stored`: `--transient-body` with a key, then the
/// good body with the same key must execute.
pub(crate) async fn transient_not_stored(probe: &Probe) -> Finding {
    let Some(body) = probe.target.transient_body.clone() else {
        return Finding::new(
            Verdict::NotApplicable,
            "needs --transient-body (a body the operation fails with a 5xx or 429)",
        );
    };
    let ev = Mutex::default();
    let good = probe.req(Some(probe.key()));
    let failing = Req {
        body,
        ..good.clone()
    };
    let first = match probe.send(&failing, &ev).await {
        Ok(a) => a,
        Err(e) => return Finding::with(Verdict::CouldNotTell, e, ev),
    };
    if !(first.status >= 500 || first.status == 429 || first.status == 408) {
        return Finding::with(
            Verdict::CouldNotTell,
            format!(
                "--transient-body was answered {}, not a 5xx, 408 or 429",
                first.status
            ),
            ev,
        );
    }
    let second = match probe.send(&good, &ev).await {
        Ok(a) => a,
        Err(e) => return Finding::with(Verdict::CouldNotTell, e, ev),
    };
    let (verdict, reason) = if second.is_success() {
        (
            Verdict::Pass,
            "the key was released: the next request with it executed".to_owned(),
        )
    } else if second.same_as(&first) {
        (
            Verdict::Fail,
            format!("the transient {} was stored and replayed", first.status),
        )
    } else if second.is_refusal() && !second.is_auth_refusal() {
        (
            Verdict::Fail,
            format!(
                "the key stayed bound to the failed request: the next got {}",
                second.status
            ),
        )
    } else {
        // Another 5xx, 429 or 408 (an outage that lasts, a rate limit),
        // or a credential refused: nothing said about the key.
        (
            Verdict::CouldNotTell,
            format!(
                "the next request got {}: an outage, a limit or a credential, not the key",
                second.status
            ),
        )
    };
    Finding::with(verdict, reason, ev)
}
