//! The problem collector: validation goes on past a problem, and every
//! independent one becomes a line of one [`ConfigError`].

use std::fmt;

/// Why a configuration was refused: every independent problem, one line
/// each, naming the setting (`--ttl`, `[[route]] #2 (/x)`, ...). Exit 2.
#[derive(Debug)]
pub(crate) struct ConfigError {
    problems: Vec<String>,
}

impl ConfigError {
    /// The problems, one line each, in the order the settings are checked.
    pub(crate) fn problems(&self) -> &[String] {
        &self.problems
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.problems.join("; "))
    }
}

impl std::error::Error for ConfigError {}

/// The problems found so far.
#[derive(Debug, Default)]
pub(super) struct Problems(Vec<String>);

impl Problems {
    /// Records a problem, on one line.
    pub(super) fn add(&mut self, problem: impl fmt::Display) {
        let text = problem.to_string();
        self.0
            .push(text.lines().map(str::trim).collect::<Vec<_>>().join(" "));
    }

    /// `r`'s value, or `None` with its error (and causes) recorded.
    pub(super) fn check<T>(&mut self, r: anyhow::Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.add(format!("{e:#}"));
                None
            }
        }
    }

    /// The configuration if nothing was refused.
    pub(super) fn finish<T>(mut self, built: Option<T>) -> Result<T, ConfigError> {
        match built {
            Some(v) if self.0.is_empty() => Ok(v),
            _ => {
                if self.0.is_empty() {
                    // Every setting left out was refused with a problem;
                    // this only guards against a check that forgot to say.
                    self.add("invalid configuration");
                }
                Err(ConfigError { problems: self.0 })
            }
        }
    }
}
