//! Judging Redis's durability settings (`appendonly`, `appendfsync`,
//! `maxmemory-policy`), read with `CONFIG GET` from the one server or from
//! every master of a cluster.

use idem_core::{DurabilityFinding, Verdict};

/// The settings read, in the order reported.
pub(crate) const SETTINGS: [&str; 3] = ["appendonly", "appendfsync", "maxmemory-policy"];

/// The finding for `setting` with `value`; `None` means the server refused
/// to tell (a managed Redis that disables `CONFIG`, an ACL): risky, since
/// nothing is known, but not fatal.
pub(crate) fn judge(setting: &str, value: Option<&str>) -> DurabilityFinding {
    let Some(value) = value else {
        return DurabilityFinding::new(
            setting,
            "unknown",
            Verdict::Risky("the server refused CONFIG GET; check it by hand".into()),
        );
    };
    let verdict = match (setting, value) {
        ("appendonly", "yes") => Verdict::Keeps,
        ("appendonly", _) => Verdict::Loses(
            "a restart forgets every record written since the last snapshot".into(),
        ),
        ("appendfsync", "always") => Verdict::Keeps,
        ("appendfsync", "everysec") => {
            Verdict::Risky("a crash forgets up to a second of writes".into())
        }
        ("appendfsync", _) => Verdict::Loses(
            "the operating system decides when writes reach the disk".into(),
        ),
        ("maxmemory-policy", "noeviction") => Verdict::Keeps,
        ("maxmemory-policy", _) => Verdict::Loses(
            "under memory pressure Redis evicts records (idem's keys carry TTLs, so volatile-* policies evict them too)".into(),
        ),
        _ => Verdict::Risky("not a setting idem knows how to judge".into()),
    };
    DurabilityFinding::new(setting, value, verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        assert!(judge("appendonly", Some("no")).verdict.loses());
        assert_eq!(judge("appendonly", Some("yes")).verdict, Verdict::Keeps);
        assert!(matches!(
            judge("appendfsync", Some("everysec")).verdict,
            Verdict::Risky(_)
        ));
        assert!(
            judge("maxmemory-policy", Some("volatile-lru"))
                .verdict
                .loses()
        );
        let refused = judge("appendonly", None);
        assert_eq!(refused.value, "unknown");
        assert!(matches!(refused.verdict, Verdict::Risky(_)));
    }
}
