//! Checks that read every answer of the run: expiry advertised, problem
//! bodies in RFC 9457 form. Advisory: the draft recommends, not requires.

use super::common::Finding;
use crate::report::Verdict;
use crate::runner::Probe;

/// `expiry-advertised`: some successful answer carries
/// `Idempotency-Key-Expires` (not `Expires`, a cache header).
pub(crate) fn expiry_advertised(probe: &Probe) -> Finding {
    let answers = probe.answers.lock().map(|a| a.clone()).unwrap_or_default();
    let successes: Vec<_> = answers.iter().filter(|a| a.is_success()).collect();
    if successes.is_empty() {
        return Finding::new(Verdict::CouldNotTell, "no successful answer in this run");
    }
    match successes.iter().find_map(|a| a.expires.as_ref()) {
        Some(e) => Finding::new(
            Verdict::Pass,
            format!("advertised: Idempotency-Key-Expires: {e}"),
        ),
        None => Finding::new(
            Verdict::Fail,
            format!(
                "none of {} successful answers says until when the key is kept",
                successes.len()
            ),
        ),
    }
}

/// `problem-details`: every 4xx and 5xx answer of the run is
/// `application/problem+json` with `type`, `title` and `status`.
pub(crate) fn problem_details(probe: &Probe) -> Finding {
    let answers = probe.answers.lock().map(|a| a.clone()).unwrap_or_default();
    let errors: Vec<_> = answers.iter().filter(|a| a.status >= 400).collect();
    if errors.is_empty() {
        return Finding::new(Verdict::CouldNotTell, "no error answer in this run");
    }
    let bad: Vec<String> = errors
        .iter()
        .filter(|a| !is_problem(a.content_type.as_deref(), &a.body, a.status))
        .map(|a| {
            format!(
                "{} {}",
                a.status,
                a.content_type.as_deref().unwrap_or("(no Content-Type)")
            )
        })
        .collect();
    if bad.is_empty() {
        Finding::new(
            Verdict::Pass,
            format!("{} error answers, all problem+json", errors.len()),
        )
    } else {
        Finding::new(
            Verdict::Fail,
            format!("not RFC 9457 problem+json: {}", bad.join(", ")),
        )
    }
}

fn is_problem(content_type: Option<&str>, body: &str, status: u16) -> bool {
    let media = content_type
        .and_then(|c| c.split(';').next())
        .map(|c| c.trim().to_ascii_lowercase());
    if media.as_deref() != Some("application/problem+json") {
        return false;
    }
    let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
        return false;
    };
    v.get("type").is_some_and(serde_json::Value::is_string)
        && v.get("title").is_some_and(serde_json::Value::is_string)
        && v.get("status").and_then(serde_json::Value::as_u64) == Some(u64::from(status))
}
