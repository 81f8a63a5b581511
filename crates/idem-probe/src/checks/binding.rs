//! The key is bound to the request: another body, path, query or tenant
//! with the same key is not a replay; bodies differing beyond 2^53 are
//! different; reformatted JSON is never executed twice.

use std::sync::Mutex;

use super::common::{Finding, Refused, Variation, must_not_replay, pair, reformatted, with_field};
use crate::detect::Outcome;
use crate::report::Verdict;
use crate::runner::{Probe, Req};

/// `key-bound-to-body`: `--other-body`, or a field `idem_probe_variant`
/// added to the body.
pub(crate) async fn key_bound_to_body(probe: &Probe) -> Finding {
    let first = probe.req(Some(probe.key()));
    let body = match &probe.target.other_body {
        Some(b) => Some(b.clone()),
        None => with_field(&first.body, "idem_probe_variant", "\"other\""),
    };
    let v = body.map(|body| Variation {
        second: Req {
            body,
            ..first.clone()
        },
        first,
        refused: Refused::Passes,
        remedy: "--other-body (a body the operation accepts that differs in a field the API fingerprints)",
        counted: true,
    });
    must_not_replay(probe, v).await
}

/// `key-bound-to-path`: `--other-url`, or a segment `idem-probe-other`
/// appended to the path.
pub(crate) async fn key_bound_to_path(probe: &Probe) -> Finding {
    let first = probe.req(Some(probe.key()));
    let url = match &probe.target.other_url {
        Some(url) => url.clone(),
        None => {
            let mut url = first.url.clone();
            let path = format!("{}/idem-probe-other", url.path().trim_end_matches('/'));
            url.set_path(&path);
            url
        }
    };
    let v = Variation {
        second: Req {
            url,
            ..first.clone()
        },
        first,
        refused: Refused::Passes,
        remedy: "--other-url (another route that accepts the same body)",
        counted: false,
    };
    must_not_replay(probe, Some(v)).await
}

/// `key-bound-to-query`: `--other-query` in place of the URL's query, or
/// a parameter `idem_probe=other` added to it.
pub(crate) async fn key_bound_to_query(probe: &Probe) -> Finding {
    let first = probe.req(Some(probe.key()));
    let mut url = first.url.clone();
    match &probe.target.other_query {
        Some(q) => url.set_query(Some(q)),
        None => {
            url.query_pairs_mut().append_pair("idem_probe", "other");
        }
    }
    let v = Variation {
        second: Req {
            url,
            ..first.clone()
        },
        first,
        refused: Refused::Passes,
        remedy: "--other-query (a query the operation accepts that the API fingerprints)",
        counted: true,
    };
    must_not_replay(probe, Some(v)).await
}

/// `key-scoped-to-credential`: the second request under
/// `--second-credential`. A refusal fails here: when the same request
/// under a fresh key executes for the second tenant, the first tenant's
/// key was what refused it, so tenants share one key space (each can
/// block the other's keys and learn which are in use).
pub(crate) async fn key_scoped_to_credential(probe: &Probe) -> Finding {
    if probe.target.second_credential.is_none() {
        return Finding::new(
            Verdict::NotApplicable,
            "needs --second-credential (another tenant's)",
        );
    }
    let first = probe.req(Some(probe.key()));
    let v = Variation {
        second: Req {
            second_tenant: true,
            ..first.clone()
        },
        first,
        refused: Refused::Fails(
            "tenants share one key space (one tenant's key blocks another's request, and tells it the key is in use)",
        ),
        remedy: "a --second-credential allowed to perform the operation",
        counted: false,
    };
    must_not_replay(probe, Some(v)).await
}

/// `big-number-precision`: `9007199254740992` then `9007199254740993`
/// (equal as IEEE doubles) in a field `idem_probe_n`.
pub(crate) async fn big_number_precision(probe: &Probe) -> Finding {
    let base = probe.req(Some(probe.key()));
    let v = with_field(&base.body, "idem_probe_n", "9007199254740992")
        .zip(with_field(&base.body, "idem_probe_n", "9007199254740993"))
        .map(|(a, b)| Variation {
            first: Req {
                body: a,
                ..base.clone()
            },
            second: Req {
                body: b,
                ..base.clone()
            },
            refused: Refused::Passes,
            remedy: "--skip big-number-precision (the API refuses the probe's number field)",
            counted: true,
        });
    let mut finding = must_not_replay(probe, v).await;
    if finding.verdict == Verdict::Fail {
        finding.reason = format!(
            "{}: the body was compared as doubles, and 9007199254740993 == 9007199254740992",
            finding.reason
        );
    }
    finding
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
    let second = Req {
        body,
        ..first.clone()
    };
    let p = match pair(probe, &first, &second, true, &ev).await {
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
        Outcome::Unknown => (Verdict::CouldNotTell, p.unknown_reason()),
    };
    let mut finding = Finding::with(verdict, reason, ev);
    finding.by_id = p.by_id && matches!(p.outcome, Outcome::Separate | Outcome::Replayed);
    finding
}
