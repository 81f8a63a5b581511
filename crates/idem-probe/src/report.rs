//! The report: one result per check, with its evidence, rendered as text
//! (colour only when asked, e.g. on a TTY), JSON (complete) or JUnit XML.

use std::fmt::Write as _;

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Verdict {
    /// The rule holds.
    Pass,
    /// The rule is broken; the evidence shows how.
    Fail,
    /// The check needs something not given (a second credential, a
    /// failing body) or was skipped.
    NotApplicable,
    /// The probe could not tell: no way to detect executions, a failed
    /// request, the budget spent, or an operation too fast to overlap.
    CouldNotTell,
}

impl Verdict {
    /// The word shown in text reports.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "FAIL",
            Verdict::NotApplicable => "n/a",
            Verdict::CouldNotTell => "could not tell",
        }
    }
}

/// One request sent and what came back, secrets redacted.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Exchange {
    /// `METHOD URL` and the headers that matter, redacted.
    pub request: String,
    /// The first bytes of the request body.
    pub request_body: String,
    /// The answer: status, headers that matter, first bytes of the body;
    /// or the transport error.
    pub answer: String,
}

/// One check's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckResult {
    /// The check's stable kebab-case name.
    pub name: &'static str,
    /// The rule it tests, in one line.
    pub rule: &'static str,
    /// Whether a failure (or could-not-tell) fails the run.
    pub required: bool,
    /// The verdict.
    pub verdict: Verdict,
    /// Why, in one or two sentences.
    pub reason: String,
    /// The requests sent and their answers.
    pub evidence: Vec<Exchange>,
}

impl CheckResult {
    /// Whether this result makes the run fail: a required check that
    /// failed or could not tell.
    pub fn fails_run(&self) -> bool {
        self.required && matches!(self.verdict, Verdict::Fail | Verdict::CouldNotTell)
    }
}

/// The whole run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// The URL probed (password redacted).
    pub target: String,
    /// One result per check, in run order.
    pub checks: Vec<CheckResult>,
    /// Requests sent to the target (the budget counts these).
    pub requests_sent: u32,
    /// GETs of `--effect-url`.
    pub effect_reads: u32,
    /// Executions the probe caused, as far as it can tell.
    pub mutations: Option<u64>,
    /// How `mutations` was counted, or why it is unknown.
    pub mutations_basis: String,
}

impl Report {
    /// Whether every required check passed (n/a counts as not run).
    pub fn passed(&self) -> bool {
        !self.checks.iter().any(CheckResult::fails_run)
    }

    /// The report as JSON: every field, plus `passed` ([`Report::passed`]).
    pub fn to_json(&self) -> String {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            map.insert("passed".to_owned(), self.passed().into());
        }
        serde_json::to_string_pretty(&value).unwrap_or_default()
    }

    /// The report as text: one line per check, then the evidence of those
    /// that did not pass. `colour` adds ANSI colours (use it on a TTY only).
    pub fn to_text(&self, colour: bool) -> String {
        let paint = |code: &str, s: &str| {
            if colour {
                format!("\x1b[{code}m{s}\x1b[0m")
            } else {
                s.to_owned()
            }
        };
        let mut out = format!("idem probe {}\n\n", self.target);
        for c in &self.checks {
            let word = match (c.verdict, c.required) {
                (Verdict::Pass, _) => paint("32", "pass"),
                (Verdict::Fail, true) => paint("1;31", "FAIL"),
                (Verdict::Fail, false) => paint("33", "warn"),
                (Verdict::NotApplicable, _) => paint("2", "n/a"),
                (Verdict::CouldNotTell, _) => paint("33", "could not tell"),
            };
            let tag = if c.required { "" } else { " (advisory)" };
            let _ = writeln!(out, "{word:>16}  {}{tag}: {}", c.name, printable(&c.reason));
        }
        for c in self.checks.iter().filter(|c| c.verdict != Verdict::Pass) {
            if c.evidence.is_empty() {
                continue;
            }
            let _ = writeln!(out, "\n{} ({})", c.name, c.rule);
            for e in &c.evidence {
                let (request, body) = (printable(&e.request), printable(&e.request_body));
                let _ = writeln!(out, "  > {request} {body}");
                let _ = writeln!(out, "  < {}", printable(&e.answer));
            }
        }
        let mutations = self
            .mutations
            .map_or_else(|| "unknown".to_owned(), |m| m.to_string());
        let _ = writeln!(
            out,
            "\n{} requests sent, {} effect reads, mutations caused: {mutations} ({})",
            self.requests_sent, self.effect_reads, self.mutations_basis
        );
        let summary = if self.passed() {
            paint("32", "every required check passed")
        } else {
            paint("1;31", "some required checks did not pass")
        };
        let _ = writeln!(out, "{summary}");
        out
    }

    /// The report as JUnit XML: one `<testcase>` per check; a failure for
    /// a required check that failed or could not tell, `<skipped>` for n/a
    /// and for advisory checks that did not pass.
    pub fn to_junit(&self) -> String {
        let failures = self.checks.iter().filter(|c| c.fails_run()).count();
        let skipped = self
            .checks
            .iter()
            .filter(|c| c.verdict != Verdict::Pass && !c.fails_run())
            .count();
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            out,
            "<testsuites><testsuite name=\"idem probe\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\">",
            self.checks.len()
        );
        for c in &self.checks {
            let _ = write!(
                out,
                "<testcase classname=\"idem.probe\" name=\"{}\">",
                xml(c.name)
            );
            let detail = evidence_text(c);
            if c.fails_run() {
                let _ = write!(
                    out,
                    "<failure message=\"{}: {}\">{}</failure>",
                    c.verdict.word(),
                    xml(&c.reason),
                    xml(&detail)
                );
            } else if c.verdict != Verdict::Pass {
                let _ = write!(
                    out,
                    "<skipped message=\"{}: {}\"/>",
                    c.verdict.word(),
                    xml(&c.reason)
                );
            }
            let _ = writeln!(out, "<system-out>{}</system-out></testcase>", xml(&detail));
        }
        out.push_str("</testsuite></testsuites>\n");
        out
    }
}

fn evidence_text(c: &CheckResult) -> String {
    let mut s = format!("{}\n{}\n", c.rule, c.reason);
    for e in &c.evidence {
        let _ = writeln!(s, "> {} {}\n< {}", e.request, e.request_body, e.answer);
    }
    s
}

/// Server text made safe for a terminal: control characters (an escape
/// sequence could hide a line or drive the terminal) shown as `\u{..}`.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Escapes text for XML attributes and content; drops characters XML 1.0
/// cannot carry.
pub(crate) fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let check = |name, required, verdict| CheckResult {
            name,
            rule: "a rule",
            required,
            verdict,
            reason: "because <this> & that".to_owned(),
            evidence: vec![Exchange {
                request: "POST http://h/x".to_owned(),
                request_body: "{}".to_owned(),
                answer: "201 {\"id\":1}".to_owned(),
            }],
        };
        Report {
            target: "http://h/x".to_owned(),
            checks: vec![
                check("a", true, Verdict::Pass),
                check("b", true, Verdict::Fail),
                check("c", false, Verdict::Fail),
                check("d", true, Verdict::NotApplicable),
                check("e", true, Verdict::CouldNotTell),
            ],
            requests_sent: 3,
            effect_reads: 0,
            mutations: Some(1),
            mutations_basis: "ids".to_owned(),
        }
    }

    #[test]
    fn colour_only_when_asked() {
        let r = report();
        assert!(!r.to_text(false).contains('\x1b'));
        assert!(r.to_text(true).contains("\x1b[1;31mFAIL"));
        assert!(r.to_text(false).contains("warn  c (advisory)"));
        assert!(!r.passed());
    }

    #[test]
    fn junit_counts_failures_and_skips() {
        let x = report().to_junit();
        assert!(
            x.contains("tests=\"5\" failures=\"2\" errors=\"0\" skipped=\"2\""),
            "{x}"
        );
        assert_eq!(x.matches("<failure ").count(), 2);
        assert!(x.contains("because &lt;this&gt; &amp; that"));
    }

    #[test]
    fn json_is_complete() {
        let v: serde_json::Value = serde_json::from_str(&report().to_json()).unwrap();
        assert_eq!(v["passed"], false);
        assert_eq!(v["checks"][1]["verdict"], "fail");
        assert_eq!(v["checks"][4]["verdict"], "could-not-tell");
        assert_eq!(v["checks"][0]["evidence"][0]["answer"], "201 {\"id\":1}");
    }

    #[test]
    fn xml_escapes() {
        assert_eq!(
            xml("<a href=\"x\">&'\u{1}"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&apos;?"
        );
    }

    #[test]
    fn server_text_cannot_drive_the_terminal() {
        let shown = printable("ok\u{1b}]52;c;ZXZpbA==\u{7}\u{1b}[2K");
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert!(shown.starts_with("ok"));
    }
}
