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
    /// The verdict rests on resource ids alone: void where the API
    /// answers one id to different keys (see `Probe::ids_shared`).
    pub(crate) by_id: bool,
}

impl Finding {
    pub(crate) fn new(verdict: Verdict, reason: impl Into<String>) -> Finding {
        Finding {
            verdict,
            reason: reason.into(),
            evidence: Mutex::default(),
            by_id: false,
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
            by_id: false,
        }
    }
}

/// The result of a first request and a second with the same key.
pub(crate) struct Pair {
    pub(crate) first: Answer,
    pub(crate) second: Answer,
    pub(crate) outcome: Outcome,
    /// The outcome rests on comparing resource ids (no effect count).
    pub(crate) by_id: bool,
    /// The effect count's change across the second, when read.
    pub(crate) delta: Option<i64>,
}

impl Pair {
    /// Why nothing told a replay from a new execution.
    pub(crate) fn unknown_reason(&self) -> String {
        match self.delta {
            Some(d) if self.first.id.is_some() && self.second.id.is_some() => format!(
                "the effect count moved by {d} and the resource ids say otherwise: nothing told"
            ),
            Some(d) if d < 0 => "the effect count went down (other traffic): nothing told".to_owned(),
            _ if self.second.same_as(&self.first) => "the same answer as the first, and no --id-pointer, Location or --effect-url tells a replay from a new execution".to_owned(),
            _ => format!("answered {}: nothing tells whether it executed", self.second.status),
        }
    }
}

/// Sends `first`, then `second` (the effect count read around `second`
/// when `counted`), and judges the second. Fails with a could-not-tell
/// reason when a request fails or the first does not succeed.
///
/// `counted` is false where the effect count cannot see the second's
/// execution: another path's or another tenant's effect need not move the
/// count read with the first credential, and an unmoved count would read
/// as a replay.
pub(crate) async fn pair(
    probe: &Probe,
    first: &Req,
    second: &Req,
    counted: bool,
    ev: &Mutex<Vec<Exchange>>,
) -> Result<Pair, String> {
    let first = probe.send(first, ev).await?;
    if !first.is_success() {
        return Err(format!(
            "the first request did not succeed ({}): the probe needs a body the operation accepts",
            first.status
        ));
    }
    let before = if counted {
        probe.effect_count(ev).await
    } else {
        None
    };
    let second = probe.send(second, ev).await?;
    let after = if counted {
        probe.effect_count(ev).await
    } else {
        None
    };
    let delta = before.zip(after).and_then(|(b, a)| a.checked_sub(b));
    let outcome = judge(&first, &second, delta);
    let by_id = delta.is_none() && first.id.is_some() && second.id.is_some();
    Ok(Pair {
        first,
        second,
        outcome,
        by_id,
        delta,
    })
}

/// A second request that must not be a replay of the first, and how to
/// read a refusal of it.
pub(crate) struct Variation {
    /// The first request.
    pub(crate) first: Req,
    /// The varied request, sent with the same key.
    pub(crate) second: Req,
    /// What a refusal explained by the key means.
    pub(crate) refused: Refused,
    /// The flag that gives a variation the API accepts, named when the
    /// API refuses the variation itself.
    pub(crate) remedy: &'static str,
    /// Whether the effect count sees the second's execution (see [`pair`]).
    pub(crate) counted: bool,
}

/// What a refusal of the varied request means when the same request under
/// a fresh key executes (so the key, not the variation, was refused).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refused {
    /// A refusal keeps the two requests apart: the rule holds.
    Passes,
    /// A refusal is itself the defect, with this reason.
    Fails(&'static str),
}

/// The verdict for a second request that must not be a replay of the
/// first (another body, path, query, tenant, big number).
///
/// A refusal proves nothing by itself: an API that refuses the variation
/// for its own reasons (an unknown field, a path with no route) would
/// refuse it under any key. So a refused second request is followed by
/// a control: the same request under a fresh key. Only when the control
/// executes was the key what the API refused.
pub(crate) async fn must_not_replay(probe: &Probe, v: Option<Variation>) -> Finding {
    let ev = Mutex::default();
    let Some(v) = v else {
        return Finding::new(
            Verdict::NotApplicable,
            "the body is not a JSON object the probe can vary",
        );
    };
    let p = match pair(probe, &v.first, &v.second, v.counted, &ev).await {
        Ok(p) => p,
        Err(e) => return Finding::with(Verdict::CouldNotTell, e, ev),
    };
    let (verdict, reason) = match p.outcome {
        Outcome::Rejected => return control(probe, &v, &p, ev).await,
        // Another tenant's or another route's resources may be numbered
        // on their own: an equal id there is no proof of a replay.
        Outcome::Replayed if !v.counted && p.by_id && !p.second.marked_replay() => (
            Verdict::CouldNotTell,
            format!(
                "answered the first request's resource id ({}), which another tenant's or route's own numbering would give too, and no Idempotent-Replayed marks it a replay",
                p.second.status
            ),
        ),
        Outcome::Separate => (Verdict::Pass, "executed on its own".to_owned()),
        Outcome::Replayed => (
            Verdict::Fail,
            format!(
                "answered with the first request's result ({})",
                p.first.status
            ),
        ),
        Outcome::Unknown => (Verdict::CouldNotTell, p.unknown_reason()),
    };
    let mut finding = Finding::with(verdict, reason, ev);
    finding.by_id = p.by_id && matches!(finding.verdict, Verdict::Pass | Verdict::Fail);
    finding
}

/// The varied request again under a fresh key, after it was refused with
/// the first's key.
async fn control(probe: &Probe, v: &Variation, p: &Pair, ev: Mutex<Vec<Exchange>>) -> Finding {
    let refused = p.second.status;
    let control = Req {
        key: Some(probe.key()),
        ..v.second.clone()
    };
    let answer = match probe.send(&control, &ev).await {
        Ok(a) => a,
        Err(e) => {
            return Finding::with(
                Verdict::CouldNotTell,
                format!(
                    "refused with {refused}; the control under a fresh key could not be sent: {e}"
                ),
                ev,
            );
        }
    };
    let (verdict, reason) = if answer.is_success() {
        match v.refused {
            Refused::Passes => (
                Verdict::Pass,
                format!(
                    "refused with {refused}; the same request under a fresh key executed (control), so the key was refused"
                ),
            ),
            Refused::Fails(why) => (
                Verdict::Fail,
                format!(
                    "refused with {refused}, yet the same request under a fresh key executed (control): {why}"
                ),
            ),
        }
    } else {
        (
            Verdict::CouldNotTell,
            format!(
                "refused with {refused}, but the same request under a fresh key was answered {} too (control): the API refuses the variation itself, whatever the key; give {}",
                answer.status, v.remedy
            ),
        )
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

/// The same JSON object, its top-level members in reverse order and other
/// whitespace, each member's value kept byte for byte (numbers beyond
/// `f64` included). `None` when the body is not a JSON object with two
/// members or more, or names one member twice (which reordering would
/// change the meaning of).
pub(crate) fn reformatted(body: &[u8]) -> Option<Vec<u8>> {
    let Members(members) = serde_json::from_slice(body).ok()?;
    if members.len() < 2 {
        return None;
    }
    let mut names = std::collections::HashSet::new();
    if !members.iter().all(|(name, _)| names.insert(name.as_str())) {
        return None;
    }
    let mut entries = Vec::new();
    for (name, value) in members.iter().rev() {
        entries.push(format!(
            "  {} :  {}",
            serde_json::to_string(name).ok()?,
            value.get()
        ));
    }
    Some(format!("\n{{\n{}\n}}\n", entries.join(",\n")).into_bytes())
}

/// A JSON object's members in written order, values as written.
struct Members(Vec<(String, Box<serde_json::value::RawValue>)>);

impl<'de> serde::Deserialize<'de> for Members {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Members, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Members;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Members, M::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Visit)
    }
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
        assert!(reformatted(br#"{"a":1}"#).is_none());
        // Values byte for byte, beyond f64 too.
        let r = reformatted(br#"{"n":123456789012345678901234567890,"x":1.50}"#).unwrap();
        let r = String::from_utf8(r).unwrap();
        assert!(
            r.contains("123456789012345678901234567890") && r.contains("1.50"),
            "{r}"
        );
        // A name given twice: reordering would change which one counts.
        assert!(reformatted(br#"{"a":1,"a":2}"#).is_none());
        assert!(reformatted(b"[1,2]").is_none());
    }
}
