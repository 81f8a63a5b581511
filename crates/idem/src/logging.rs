//! The binary's logs: one `tracing` subscriber for every command, writing
//! to stderr (stdout is the commands' output), as text or as one JSON
//! object per line.
//!
//! # The filter
//!
//! `--log-level` wins over `RUST_LOG`, which wins over `info`. Either takes
//! a level (`debug`) or an `EnvFilter` list (`warn,idem_http=debug`). A bare
//! word must be a level: `EnvFilter` would read `inf` as a target and log
//! nothing else, so a typo would silence the gateway. A filter that does
//! not parse is a usage error, like every other bad setting.
//!
//! # What reaches the log
//!
//! Events of `tracing` only. The `log` crate is not bridged: tokio-postgres
//! logs its query parameters through it at debug, and those hold raw
//! idempotency keys; idem's own events name a key only by its short hash.

use std::str::FromStr;
use std::sync::OnceLock;

use anyhow::{Context, anyhow};
use tracing::level_filters::LevelFilter;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};

/// The format `init` installed; error lines printed outside the subscriber
/// follow it.
static INSTALLED_FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// The filter when neither `--log-level` nor `RUST_LOG` gives one.
const DEFAULT_FILTER: &str = "info";

/// How each event is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// One human-readable line: time, level, target, message, fields.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`,
    /// `message` and the event's fields at the top level, with the
    /// current span (`span`) and its parents (`spans`) when there are any.
    Json,
}

/// Installs the subscriber for the whole process. `level` is
/// `--log-level`; `RUST_LOG` is read here. Fails (a usage error) on a
/// filter that does not parse.
pub(crate) fn init(level: Option<&str>, format: LogFormat) -> anyhow::Result<()> {
    let rust_log = match std::env::var("RUST_LOG") {
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => return Err(anyhow!("RUST_LOG is not UTF-8")),
    };
    let (origin, spec) = chosen_filter(level, rust_log.as_deref());
    // A bare word on our own flag must be a level (a typo would otherwise
    // read as a target and silence every other log); RUST_LOG, shared with
    // other tools, takes the whole EnvFilter syntax.
    let strict = origin == "--log-level";
    let filter = parse_filter(spec, strict).with_context(|| format!("{origin} {spec:?}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    installed.map_err(|e| anyhow!("cannot install the log subscriber: {e}"))?;
    let _ = INSTALLED_FORMAT.set(format);
    Ok(())
}

/// Prints one error line to stderr for a command that failed: `idem: LINE`
/// as text, or, once `--log-format json` is installed, one JSON object like
/// the log's own (`timestamp`, `level` `ERROR`, `target` `idem`,
/// `message`). Written directly, not as a `tracing` event, so that a filter
/// of `off` cannot swallow the reason a command failed.
pub(crate) fn print_error(line: &str) {
    print_error_as(INSTALLED_FORMAT.get().copied(), line);
}

/// [`print_error`] in `format`, for a line printed before (or instead of)
/// installing the subscriber; `None` is text.
pub(crate) fn print_error_as(format: Option<LogFormat>, line: &str) {
    match format {
        Some(LogFormat::Json) => {
            let mut timestamp = String::new();
            // Formatting into a String cannot fail; an empty timestamp would
            // still leave the line valid JSON.
            let _ = SystemTime.format_time(&mut Writer::new(&mut timestamp));
            let object = serde_json::json!({
                "timestamp": timestamp,
                "level": "ERROR",
                "target": "idem",
                "message": line,
            });
            eprintln!("{object}");
        }
        Some(LogFormat::Text) | None => eprintln!("idem: {line}"),
    }
}

/// Which filter applies, and where it came from (for error messages). An
/// empty `RUST_LOG` counts as unset.
fn chosen_filter<'a>(level: Option<&'a str>, rust_log: Option<&'a str>) -> (&'static str, &'a str) {
    match (level, rust_log.filter(|v| !v.trim().is_empty())) {
        (Some(level), _) => ("--log-level", level),
        (None, Some(env)) => ("RUST_LOG", env),
        (None, None) => ("default filter", DEFAULT_FILTER),
    }
}

/// Parses a level or an `EnvFilter` directive list; `strict` refuses a
/// bare word that is not a level.
fn parse_filter(spec: &str, strict: bool) -> anyhow::Result<EnvFilter> {
    let directives: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return Err(anyhow!(
            "empty; give a level (error, warn, info, debug, trace, off)"
        ));
    }
    for d in &directives {
        let bare = !d.contains('=') && !d.contains('[');
        if strict && bare && LevelFilter::from_str(d).is_err() {
            return Err(anyhow!(
                "{d:?} is neither a level (error, warn, info, debug, trace, off) nor TARGET=LEVEL"
            ));
        }
    }
    EnvFilter::builder()
        .parse(directives.join(","))
        .map_err(|e| anyhow!("not a log filter: {e}"))
}

#[cfg(test)]
mod tests {
    use super::{chosen_filter, parse_filter};

    #[test]
    fn the_flag_wins_over_rust_log_which_wins_over_info() {
        assert_eq!(
            chosen_filter(Some("debug"), Some("warn")),
            ("--log-level", "debug")
        );
        assert_eq!(chosen_filter(None, Some("warn")), ("RUST_LOG", "warn"));
        assert_eq!(chosen_filter(None, Some("  ")), ("default filter", "info"));
        assert_eq!(chosen_filter(None, None), ("default filter", "info"));
    }

    #[test]
    fn levels_and_directive_lists_parse() {
        for ok in [
            "info",
            "DEBUG",
            "off",
            "warn,idem_http=debug",
            "idem=trace, hyper=off",
            "idem_http[request]=debug",
        ] {
            assert!(parse_filter(ok, true).is_ok(), "{ok}");
        }
    }

    #[test]
    fn typos_and_bad_levels_are_refused() {
        for bad in ["inf", "", " , ", "warn,verbose", "idem=loud"] {
            assert!(parse_filter(bad, true).is_err(), "{bad:?}");
        }
    }
}
