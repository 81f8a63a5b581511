//! A run: every check not skipped, in order, with a pause between them,
//! gathered into the report.

use std::sync::Mutex;

use crate::catalog::CHECKS;
use crate::checks::{self, Finding};
use crate::report::{CheckResult, Report, Verdict};
use crate::runner::Probe;
use crate::target::redacted_url;

impl Probe {
    /// Runs every check not skipped, in order, and returns the report.
    /// Never fails: a request that fails is a check's evidence.
    pub async fn run(&self) -> Report {
        let before = self.effect_count(&Mutex::default()).await;
        let mut findings = Vec::new();
        for (i, check) in CHECKS.iter().enumerate() {
            let finding = if self.options.skip.iter().any(|s| s == check.name) {
                Finding::new(Verdict::NotApplicable, "skipped (--skip)")
            } else {
                if i > 0 && !self.options.pause.is_zero() {
                    tokio::time::sleep(self.options.pause).await;
                }
                checks::run(check.name, self).await
            };
            findings.push((check, finding));
        }
        // Known only once every check has run: an API that answers one
        // id to different keys makes every verdict drawn from ids void.
        let ids_shared = self.ids_shared();
        let mut results = Vec::new();
        for (check, mut finding) in findings {
            if ids_shared && finding.by_id {
                finding.verdict = Verdict::CouldNotTell;
                finding.reason = format!(
                    "{}, judged by resource ids; but this API answered one id to different keys, so ids do not tell a replay from a new execution (give --effect-url)",
                    finding.reason
                );
            }
            results.push(CheckResult {
                name: check.name,
                rule: check.rule,
                required: check.required,
                verdict: finding.verdict,
                reason: self.redactor.redact(&finding.reason),
                evidence: finding.evidence.into_inner().unwrap_or_default(),
            });
        }
        let after = self.effect_count(&Mutex::default()).await;
        let (mutations, basis) = match (before, after) {
            (Some(b), Some(a)) => (
                a.checked_sub(b).and_then(|d| u64::try_from(d).ok()),
                "effect count before and after",
            ),
            _ if self.detection.id_pointer.is_some() => (
                Some(self.counts().2),
                "distinct resource ids answered: a lower bound when ids repeat across keys",
            ),
            _ => (None, "no --id-pointer or --effect-url to count with"),
        };
        Report {
            target: self.redactor.redact(&redacted_url(&self.target.url)),
            checks: results,
            requests_sent: self.counts().0,
            effect_reads: self.counts().1,
            mutations,
            mutations_basis: basis.to_owned(),
        }
    }
}
