//! Checks that read every answer of the run: expiry advertised, problem
//! bodies in RFC 9457 form. Advisory: the draft recommends, not requires.

use super::common::Finding;
use crate::report::Verdict;
use crate::runner::Probe;

/// `expiry-advertised`: some successful answer carries
/// `Idempotency-Key-Expires` (not `Expires`, a cache header).
pub(crate) fn expiry_advertised(probe: &Probe) -> Finding {
    let answers = probe.answers.lock().map(|a| a.clone()).unwrap_or_default();
    let successes: Vec<_> = answers
        .iter()
        .filter(|a| (200..300).contains(&a.status))
        .collect();
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
    // Each answer's form was judged when it came (its body is not kept).
    if errors.is_empty() {
        return Finding::new(Verdict::CouldNotTell, "no error answer in this run");
    }
    let bad: Vec<String> = errors
        .iter()
        .filter(|a| !a.problem)
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
