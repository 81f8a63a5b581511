//! The catalogue of checks: each one's stable name, the rule it tests,
//! and whether it decides the exit code.

/// A check's stable name, its rule, and whether it is required.
#[derive(Debug, Clone, Copy)]
pub struct CheckInfo {
    /// Stable kebab-case name (for `--skip`).
    pub name: &'static str,
    /// The rule it tests.
    pub rule: &'static str,
    /// Whether it decides the exit code.
    pub required: bool,
}

const fn check(name: &'static str, rule: &'static str, required: bool) -> CheckInfo {
    CheckInfo {
        name,
        rule,
        required,
    }
}

/// Every check, in run order.
pub const CHECKS: &[CheckInfo] = &[
    check(
        "key-required",
        "a mutation without an Idempotency-Key is refused (4xx) and not executed",
        true,
    ),
    check(
        "retry-replays-response",
        "a retry with the same key and request is answered with the first status, body, Location and Content-Type, without executing again",
        true,
    ),
    check(
        "replay-marked",
        "a replay carries Idempotent-Replayed: true",
        false,
    ),
    check(
        "key-bound-to-body",
        "the same key with another body is not a replay: refused (422/409/400) or executed on its own",
        true,
    ),
    check(
        "key-bound-to-path",
        "the same key on another path is not a replay of the first path's answer",
        true,
    ),
    check(
        "key-bound-to-query",
        "the same key with another query is not a replay",
        true,
    ),
    check(
        "key-scoped-to-credential",
        "the same key under another tenant's credential is not a replay of the first tenant's answer",
        true,
    ),
    check(
        "big-number-precision",
        "bodies differing only in an integer beyond 2^53 are different requests",
        true,
    ),
    check(
        "reformatted-json-not-executed-twice",
        "the same JSON reformatted (whitespace, key order) is replayed or refused, never executed twice",
        true,
    ),
    check(
        "concurrent-duplicates-execute-once",
        "N concurrent requests with one key execute once",
        true,
    ),
    check(
        "in-flight-duplicate-conflicts",
        "a duplicate while the first runs gets 409 with Retry-After, or waits and gets the replay",
        false,
    ),
    check(
        "deterministic-failure-replayed",
        "a deterministic 4xx of the operation is stored and replayed",
        true,
    ),
    check(
        "transient-failure-not-stored",
        "a transient failure (5xx, 429) is not stored: the key can be used again",
        true,
    ),
    check(
        "expiry-advertised",
        "keyed answers say until when the key is kept (Idempotency-Key-Expires)",
        false,
    ),
    check(
        "problem-details",
        "error answers are RFC 9457 problem+json with type, title and status",
        false,
    ),
];

#[cfg(test)]
mod tests {
    use super::CHECKS;

    #[test]
    fn names_are_unique_kebab_case() {
        let mut names: Vec<_> = CHECKS.iter().map(|c| c.name).collect();
        assert!(
            names
                .iter()
                .all(|n| n.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
        );
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CHECKS.len());
    }
}
