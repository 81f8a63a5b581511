//! The key is bound to the request: another body, path, query or tenant
//! with the same key is not a replay; bodies differing beyond 2^53 are
//! different; reformatted JSON is never executed twice.

use std::sync::Mutex;

use super::common::{Finding, must_not_replay, pair, reformatted, with_field};
use crate::detect::Outcome;
use crate::report::Verdict;
use crate::runner::Probe;

/// `key-bound-to-body`: a field `idem_probe_variant` added to the body.
pub(crate) async fn key_bound_to_body(probe: &Probe) -> Finding {
    must_not_replay(probe, |first| {
        let body = with_field(&first.body, "idem_probe_variant", "\"other\"")?;
        Some(crate::runner::Req {
            body,
            ..first.clone()
        })
    })
    .await
}

/// `key-bound-to-path`: `other_url`, or a segment `idem-probe-other`
/// appended to the path.
pub(crate) async fn key_bound_to_path(probe: &Probe) -> Finding {
    let other = probe.target.other_url.clone();
    must_not_replay(probe, |first| {
        if let Some(url) = other {
            return Some(crate::runner::Req {
                url,
                ..first.clone()
            });
        }
        let mut url = first.url.clone();
        let path = format!("{}/idem-probe-other", url.path().trim_end_matches('/'));
        url.set_path(&path);
        Some(crate::runner::Req {
            url,
            ..first.clone()
        })
    })
    .await
}

/// `key-bound-to-query`: a parameter `idem_probe=other` added to the query.
pub(crate) async fn key_bound_to_query(probe: &Probe) -> Finding {
    must_not_replay(probe, |first| {
        let mut url = first.url.clone();
        url.query_pairs_mut().append_pair("idem_probe", "other");
        Some(crate::runner::Req {
            url,
            ..first.clone()
        })
    })
    .await
}

/// `key-scoped-to-credential`: the second request under
/// `--second-credential`.
pub(crate) async fn key_scoped_to_credential(probe: &Probe) -> Finding {
    if probe.target.second_credential.is_none() {
        return Finding::new(
            Verdict::NotApplicable,
            "needs --second-credential (another tenant's)",
        );
    }
    must_not_replay(probe, |first| {
        Some(crate::runner::Req {
            second_tenant: true,
            ..first.clone()
        })
    })
    .await
}

/// `big-number-precision`: `9007199254740992` then `9007199254740993`
/// (equal as IEEE doubles) in a field `idem_probe_n`.
pub(crate) async fn big_number_precision(probe: &Probe) -> Finding {
    let ev = Mutex::default();
    let key = Some(probe.key());
    let base = probe.req(key);
    let (Some(a), Some(b)) = (
        with_field(&base.body, "idem_probe_n", "9007199254740992"),
        with_field(&base.body, "idem_probe_n", "9007199254740993"),
    ) else {
        return Finding::new(
            Verdict::NotApplicable,
            "the body is not a JSON object the probe can vary",
        );
    };
    let first = crate::runner::Req {
        body: a,
        ..base.clone()
    };
    let second = crate::runner::Req { body: b, ..base };
    let p = match pair(probe, &first, &second, &ev).await {
        Ok(p) => p,
        Err(e) => return Finding::with(Verdict::CouldNotTell, e, ev),
    };
    let (verdict, reason) = match p.outcome {
        Outcome::Rejected => (Verdict::Pass, format!("refused with {}", p.second.status)),
        Outcome::Separate => (Verdict::Pass, "executed on its own".to_owned()),
        Outcome::Replayed => (
            Verdict::Fail,
            "replayed: the body was compared as doubles, and 9007199254740993 == 9007199254740992"
                .to_owned(),
        ),
        Outcome::Unknown => (
            Verdict::CouldNotTell,
            "nothing tells a replay from a new execution".to_owned(),
        ),
    };
    Finding::with(verdict, reason, ev)
}

/// `reformatted-json-not-executed-twice`: the body with its keys reversed
/// and other whitespace, same key. Replay or refusal pass.
pub(crate) async fn reformatted_json(probe: &Probe) -> Finding {
    let ev = Mutex::default();
    let first = probe.req(Some(probe.key()));
    let Some(body) = reformatted(&first.body) else {
        return Finding::new(
            Verdict::NotApplicable,
            "the body is not a JSON object with keys the probe can reorder",
        );
    };
    let second = crate::runner::Req {
        body,
        ..first.clone()
    };
    let p = match pair(probe, &first, &second, &ev).await {
        Ok(p) => p,
        Err(e) => return Finding::with(Verdict::CouldNotTell, e, ev),
    };
    let (verdict, reason) = match p.outcome {
        Outcome::Rejected => (
            Verdict::Pass,
            format!("refused with {} (bytes compared)", p.second.status),
        ),
        Outcome::Replayed => (Verdict::Pass, "replayed (JSON compared as JSON)".to_owned()),
        Outcome::Separate => (
            Verdict::Fail,
            "the equal JSON executed a second time".to_owned(),
        ),
        Outcome::Unknown => (
            Verdict::CouldNotTell,
            "nothing tells a replay from a new execution".to_owned(),
        ),
    };
    Finding::with(verdict, reason, ev)
}
