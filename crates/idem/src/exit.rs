//! Exit codes: one table for every command, and the error types that
//! choose a code. `main` reports an error with [`report`], which prints it
//! and returns its code.
//!
//! | Code | Meaning |
//! |------|---------|
//! | 0 | Success (`check-config`: the configuration is valid). |
//! | 1 | Runtime failure: the store could not be opened or reached, a port could not be bound, an I/O error; `demo`: an invariant failed. |
//! | 2 | Usage or configuration error: a flag, environment variable, config file or argument was refused. Nothing was done. |
//! | 3 | Not found: `records get` found no live record for that key. |
//!
//! An error is a usage error when it is a [`UsageError`], a
//! [`ConfigError`] or a [`StoreUrlError`] (a store URL that does not
//! parse), wherever it sits in the error's chain; [`NotFound`] is 3;
//! anything else is a runtime failure. Errors are classified by type, never
//! by their text.

use std::process::ExitCode;

use crate::config::ConfigError;
use idem_stores::StoreUrlError;

/// The exit code of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// 0: done.
    Success,
    /// 1: the command was valid but failed while running.
    Runtime,
    /// 2: the command's input was refused; nothing was done.
    Usage,
    /// 3: what was asked for does not exist.
    NotFound,
}

impl Exit {
    /// The code the process exits with.
    pub(crate) fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Runtime => 1,
            Exit::Usage => 2,
            Exit::NotFound => 3,
        }
    }

    /// The code for an error, from the types in its chain.
    pub(crate) fn of(error: &anyhow::Error) -> Exit {
        let is_usage = |e: &(dyn std::error::Error + 'static)| {
            e.is::<UsageError>() || e.is::<ConfigError>() || e.is::<StoreUrlError>()
        };
        if error.chain().any(is_usage) {
            Exit::Usage
        } else if error.chain().any(|e| e.is::<NotFound>()) {
            Exit::NotFound
        } else {
            Exit::Runtime
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

/// The operator's input was refused (exit 2). Wraps the error that says
/// why; its message is that error's.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub(crate) struct UsageError(anyhow::Error);

/// What was asked for does not exist (exit 3).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct NotFound(pub(crate) &'static str);

/// Marks a result's error as a usage error.
pub(crate) trait OrUsage<T> {
    /// `Err(e)` becomes a [`UsageError`] (exit 2).
    fn or_usage(self) -> anyhow::Result<T>;
}

impl<T, E: Into<anyhow::Error>> OrUsage<T> for Result<T, E> {
    fn or_usage(self) -> anyhow::Result<T> {
        self.map_err(|e| UsageError(e.into()).into())
    }
}

/// Prints an error on stderr and returns its exit code: one line per
/// configuration problem, otherwise one line with the error and its causes.
pub(crate) fn report(error: &anyhow::Error) -> ExitCode {
    if let Some(config) = error.downcast_ref::<ConfigError>() {
        for problem in config.problems() {
            crate::logging::print_error(&problem.to_string());
        }
    } else {
        let chain: Vec<String> = error.chain().map(ToString::to_string).collect();
        crate::logging::print_error(&chain.join(": "));
    }
    Exit::of(error).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::{Context, anyhow};

    #[test]
    fn errors_are_classified_by_type_through_their_context() {
        let usage: anyhow::Result<()> = Err(anyhow!("bad flag")).or_usage();
        let usage = usage.context("records get").unwrap_err();
        assert_eq!(Exit::of(&usage), Exit::Usage);
        assert_eq!(
            format!("{usage:#}"),
            "records get: bad flag",
            "the marker adds no text"
        );

        let url = "nope".parse::<idem_stores::StoreUrl>().context("--store");
        assert_eq!(Exit::of(&url.unwrap_err()), Exit::Usage);

        let missing = anyhow::Error::new(NotFound("no record")).context("records get");
        assert_eq!(Exit::of(&missing), Exit::NotFound);

        let io = anyhow::Error::new(std::io::Error::other("refused")).context("cannot reach");
        assert_eq!(Exit::of(&io), Exit::Runtime);
        assert_eq!(Exit::of(&anyhow!("anything else")), Exit::Runtime);
        assert_eq!(
            [Exit::Success, Exit::Runtime, Exit::Usage, Exit::NotFound].map(Exit::code),
            [0, 1, 2, 3]
        );
    }
}
