//! Judging MySQL's and MariaDB's durability settings
//! (`innodb_flush_log_at_trx_commit`, `sync_binlog`).

use idem_core::{Durability, DurabilityFinding, Verdict};

/// The query [`Store::durability`](idem_core::Store::durability) runs.
pub(crate) const SQL: &str = "SELECT CAST(@@innodb_flush_log_at_trx_commit AS CHAR), \
     CAST(@@sync_binlog AS CHAR)";

/// The report for these values of `innodb_flush_log_at_trx_commit` and
/// `sync_binlog`.
pub(crate) fn judge(flush_log: &str, sync_binlog: &str) -> Durability {
    let flush = if flush_log == "1" {
        Verdict::Keeps
    } else {
        Verdict::Loses("a crash forgets up to a second of acknowledged commits".into())
    };
    let binlog = if sync_binlog == "1" {
        Verdict::Keeps
    } else {
        Verdict::Risky(
            "the binary log is not synced on every commit: a replica may miss commits".into(),
        )
    };
    Durability::new(vec![
        DurabilityFinding::new("innodb_flush_log_at_trx_commit", flush_log, flush),
        DurabilityFinding::new("sync_binlog", sync_binlog, binlog),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_one_keeps_and_others_lose() {
        assert!(!judge("1", "0").loses_records());
        assert!(judge("2", "1").loses_records());
        assert!(judge("0", "1").loses_records());
    }
}
