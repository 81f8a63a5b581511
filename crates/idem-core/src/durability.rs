//! What a store's own settings say about keeping records: [`Durability`].
//!
//! idem's promise, one effect per intent, holds only while the store keeps
//! the records of completed intents. A store that forgets one (a Redis
//! restarted without persistence, a PostgreSQL with `fsync = off` after a
//! crash) lets the next retry of that intent execute again. Each store reads
//! the settings it depends on and judges them in a [`DurabilityFinding`];
//! the gateway logs every finding at start-up and refuses a store with a
//! finding that [`Verdict::Loses`] records unless the operator accepts it.

use std::fmt;

/// A store's report on its own durability settings, from
/// [`Store::durability`](crate::Store::durability).
///
/// An empty report means the store does not know (the default answer of a
/// wrapper or of a store that does not implement the check).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Durability {
    /// One finding per setting read, in the order the store read them.
    pub findings: Vec<DurabilityFinding>,
}

impl Durability {
    /// A report of these findings.
    pub fn new(findings: Vec<DurabilityFinding>) -> Durability {
        Durability { findings }
    }

    /// A report that knows nothing: no findings.
    pub fn unknown() -> Durability {
        Durability::default()
    }

    /// The findings whose verdict is [`Verdict::Loses`].
    pub fn losses(&self) -> impl Iterator<Item = &DurabilityFinding> {
        self.findings.iter().filter(|f| f.verdict.loses())
    }

    /// Whether any finding loses records.
    pub fn loses_records(&self) -> bool {
        self.losses().next().is_some()
    }
}

/// One setting of the store, its value, and what it means for records.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DurabilityFinding {
    /// The setting's name as the store spells it (`appendonly`, `fsync`,
    /// `innodb_flush_log_at_trx_commit`), with the server when there are
    /// several (`appendonly@10.0.0.1:6379`).
    pub setting: String,
    /// The value read, or `unknown` when the store refused to tell.
    pub value: String,
    /// What that value means for records.
    pub verdict: Verdict,
}

impl DurabilityFinding {
    /// A finding.
    pub fn new(setting: impl Into<String>, value: impl Into<String>, verdict: Verdict) -> Self {
        DurabilityFinding {
            setting: setting.into(),
            value: value.into(),
            verdict,
        }
    }
}

impl fmt::Display for DurabilityFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}: {}", self.setting, self.value, self.verdict)
    }
}

/// What a setting's value means for the records of completed intents.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Acknowledged records survive a crash of the store.
    Keeps,
    /// Records may be lost in some failures; the text says which.
    Risky(String),
    /// Records are lost in an ordinary failure (a crash, a restart, memory
    /// pressure); the text says how.
    Loses(String),
}

impl Verdict {
    /// Whether this verdict is [`Verdict::Loses`].
    pub fn loses(&self) -> bool {
        matches!(self, Verdict::Loses(_))
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Keeps => f.write_str("keeps records"),
            Verdict::Risky(why) => write!(f, "risky: {why}"),
            Verdict::Loses(why) => write!(f, "loses records: {why}"),
        }
    }
}
