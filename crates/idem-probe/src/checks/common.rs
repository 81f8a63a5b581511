//! What every check shares: its finding, and sending a pair of requests
//! with one key and judging the second.

use std::sync::Mutex;

use crate::detect::{Answer, Outcome, judge};
use crate::report::{Exchange, Verdict};
use crate::runner::{Probe, Req};

/// A check's verdict, reason and evidence.
#[derive(Debug)]
pub(crate) struct Finding {
    pub(crate) verdict: Verdict,
    pub(crate) reason: String,
    pub(crate) evidence: Mutex<Vec<Exchange>>,
}

impl Finding {
    pub(crate) fn new(verdict: Verdict, reason: impl Into<String>) -> Finding {
        Finding {
            verdict,
            reason: reason.into(),
            evidence: Mutex::default(),
        }
    }

    pub(crate) fn with(
        verdict: Verdict,
        reason: impl Into<String>,
        evidence: Mutex<Vec<Exchange>>,
    ) -> Finding {
        Finding {
            verdict,
            reason: reason.into(),
            evidence,
        }
    }
}

/// The result of a first request and a second with the same key.
pub(crate) struct Pair {
    pub(crate) first: Answer,
    pub(crate) second: Answer,
    pub(crate) outcome: Outcome,
}

/// Sends `first`, then `second` (the effect count read around `second`),
/// and judges the second. Fails with a could-not-tell finding when a
/// request fails or the first does not succeed.
pub(crate) async fn pair(
    probe: &Probe,
    first: &Req,
    second: &Req,
    ev: &Mutex<Vec<Exchange>>,
) -> Result<Pair, String> {
    let first = probe.send(first, ev).await?;
    if !first.is_success() {
        return Err(format!(
            "the first request did not succeed ({}): the probe needs a body the operation accepts",
            first.status
        ));
    }
    let before = probe.effect_count(ev).await;
    let second = probe.send(second, ev).await?;
    let after = probe.effect_count(ev).await;
    let delta = before.zip(after).and_then(|(b, a)| a.checked_sub(b));
    let outcome = judge(&first, &second, delta);
    Ok(Pair {
        first,
        second,
        outcome,
    })
}

/// The verdict for a second request that must not be a replay of the
/// first (another body, path, query, tenant, big number).
pub(crate) async fn must_not_replay(
    probe: &Probe,
    second: impl FnOnce(&Req) -> Option<Req>,
) -> Finding {
    let ev = Mutex::default();
    let first = probe.req(Some(probe.key()));
    let Some(second) = second(&first) else {
        return Finding::new(
            Verdict::NotApplicable,
            "the body is not a JSON object the probe can vary",
        );
    };
    let p = match pair(probe, &first, &second, &ev).await {
        Ok(p) => p,
        Err(e) => return Finding::with(Verdict::CouldNotTell, e, ev),
    };
    let (verdict, reason) = match p.outcome {
        Outcome::Rejected => (Verdict::Pass, format!("refused with {}", p.second.status)),
        Outcome::Separate => (Verdict::Pass, "executed on its own".to_owned()),
        Outcome::Replayed => (Verdict::Fail, format!("answered with the first request's result ({})", p.first.status)),
        Outcome::Unknown if p.second.same_as(&p.first) => (
            Verdict::CouldNotTell,
            "the same answer as the first, and no --id-pointer, Location or --effect-url tells a replay from a new execution".to_owned(),
        ),
        Outcome::Unknown => (Verdict::CouldNotTell, format!("answered {}: nothing tells whether it executed", p.second.status)),
    };
    Finding::with(verdict, reason, ev)
}

/// `body` (a JSON object) with `"name": raw` inserted first, keeping the
/// rest byte for byte. `None` when the body is not a JSON object.
pub(crate) fn with_field(body: &[u8], name: &str, raw: &str) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(body).ok()?;
    let map = serde_json::from_str::<serde_json::Value>(text).ok()?;
    let map = map.as_object()?;
    let open = text.find('{')?;
    let rest = &text[open + 1..];
    let sep = if map.is_empty() { "" } else { "," };
    Some(format!("{}{{\"{name}\":{raw}{sep}{rest}", &text[..open]).into_bytes())
}

/// The same JSON object, its top-level keys in reverse order and other
/// whitespace. `None` when the body is not a JSON object with a key, or
/// does not survive the round trip (numbers serde_json cannot hold exactly).
pub(crate) fn reformatted(body: &[u8]) -> Option<Vec<u8>> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let map = value.as_object()?;
    if map.is_empty() {
        return None;
    }
    let mut entries = Vec::new();
    for (k, v) in map.iter().rev() {
        entries.push(format!(
            "  {} :  {}",
            serde_json::to_string(k).ok()?,
            serde_json::to_string(v).ok()?
        ));
    }
    let text = format!("\n{{\n{}\n}}\n", entries.join(",\n"));
    let back: serde_json::Value = serde_json::from_str(&text).ok()?;
    (back == value && text.as_bytes() != body).then(|| text.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_variations() {
        assert_eq!(
            with_field(br#"{"a":1}"#, "x", "2").unwrap(),
            br#"{"x":2,"a":1}"#
        );
        assert_eq!(with_field(b" {} ", "x", "2").unwrap(), br#" {"x":2} "#);
        assert!(with_field(b"[1]", "x", "2").is_none());
        let r = reformatted(br#"{"a":1,"b":[2]}"#).unwrap();
        let r = String::from_utf8(r).unwrap();
        assert!(r.find("\"b\"") < r.find("\"a\""));
        assert!(reformatted(b"{}").is_none());
    }
}
