//! Judging PostgreSQL's durability settings (`fsync`, `synchronous_commit`).

use idem_core::{Durability, DurabilityFinding, Verdict};

/// The query [`Store::durability`](idem_core::Store::durability) runs.
pub(crate) const SQL: &str =
    "SELECT current_setting('fsync'), current_setting('synchronous_commit')";

/// The report for these values of `fsync` and `synchronous_commit`.
pub(crate) fn judge(fsync: &str, synchronous_commit: &str) -> Durability {
    let fsync_verdict = if fsync == "off" {
        Verdict::Loses("a crash of the server's host can lose or corrupt committed records".into())
    } else {
        Verdict::Keeps
    };
    let commit_verdict = match synchronous_commit {
        "off" => Verdict::Loses("a server crash forgets the last acknowledged commits".into()),
        "local" => Verdict::Risky("a failover to a standby can forget acknowledged commits".into()),
        _ => Verdict::Keeps,
    };
    Durability::new(vec![
        DurabilityFinding::new("fsync", fsync, fsync_verdict),
        DurabilityFinding::new("synchronous_commit", synchronous_commit, commit_verdict),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_keep_and_off_loses() {
        assert!(!judge("on", "on").loses_records());
        assert!(judge("off", "on").loses_records());
        assert!(judge("on", "off").loses_records());
        assert!(!judge("on", "local").loses_records());
        assert!(!judge("on", "remote_write").loses_records());
    }
}
