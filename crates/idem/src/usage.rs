//! One line for a command line that clap refused, without the values typed
//! on it.
//!
//! clap quotes what it refuses: the unexpected argument, the invalid value,
//! the value given to a flag that takes none, the unknown subcommand. Any
//! of those may be a secret typed in the wrong place (a credential after
//! `--credential-stdin=`, the second word of an unquoted `Bearer TOKEN`),
//! and error lines end up in scrollback and CI logs. So a flag is named,
//! and a value never is: every value on the command line is blanked out of
//! the line, whatever kind of error quoted it. Control characters are
//! replaced too, so a typed escape sequence cannot reach the terminal.

use std::collections::BTreeSet;
use std::ffi::OsString;

use clap::CommandFactory;
use clap::error::{ContextKind, ContextValue, ErrorKind};

/// What stands for a value in an error line.
const HIDDEN: &str = "(a value, not shown)";

/// The line for `e`, raised while parsing `args` (the process's arguments,
/// the program name first).
pub(crate) fn error_line(e: &clap::Error, args: &[OsString]) -> String {
    let line = match e.kind() {
        ErrorKind::UnknownArgument => {
            let arg = match e.get(ContextKind::InvalidArg) {
                Some(ContextValue::String(arg)) => arg.as_str(),
                _ => "",
            };
            match flag_name(arg) {
                Some(flag) => format!("unexpected argument '{flag}'"),
                None => format!("unexpected argument {HIDDEN}"),
            }
        }
        // clap lists the missing arguments on the lines after its first.
        ErrorKind::MissingRequiredArgument => match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::Strings(names)) => format!(
                "the following required arguments were not provided: {}",
                names.join(", ")
            ),
            _ => first_line(e),
        },
        _ => first_line(e),
    };
    let line = blank_values(&line, args, &subcommand_names());
    line.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn first_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("invalid arguments");
    first.trim_start_matches("error: ").to_owned()
}

/// `line` with every value of `args` (an argument that is not a flag, or
/// what follows the `=` of one) replaced by [`HIDDEN`]. Subcommand names
/// are not values. A value is blanked where clap quotes it (`'VALUE'`),
/// and anywhere else when it is long enough (4 characters) not to match
/// the words of the message by chance.
fn blank_values(line: &str, args: &[OsString], subcommands: &BTreeSet<String>) -> String {
    let mut values: Vec<String> = Vec::new();
    for arg in args.iter().skip(1) {
        let arg = arg.to_string_lossy();
        let value = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with('-') => value,
            _ if flag_name(&arg) == Some(arg.as_ref()) => continue,
            _ => arg.as_ref(),
        };
        if value.is_empty() || subcommands.contains(value) {
            continue;
        }
        values.push(value.to_owned());
        // clap shows a value without its terminal escape sequences.
        let shown = without_escapes(value);
        if !shown.is_empty() && shown != value {
            values.push(shown);
        }
    }
    // Longest first, so that a value holding another is blanked whole.
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    let mut line = line.to_owned();
    for value in &values {
        line = line.replace(&format!("'{value}'"), &format!("'{HIDDEN}'"));
        if value.chars().count() >= 4 {
            line = line.replace(value.as_str(), HIDDEN);
        }
    }
    line
}

/// `value` without ANSI escape sequences (`ESC [ ... letter`, `ESC X`) and
/// control characters.
fn without_escapes(value: &str) -> String {
    let mut out = String::new();
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next_if_eq(&'[').is_some() {
                // Parameters and intermediates, then the final byte.
                for p in chars.by_ref() {
                    if ('@'..='~').contains(&p) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else if !c.is_control() {
            out.push(c);
        }
    }
    out
}

/// Every subcommand's name, at any depth.
fn subcommand_names() -> BTreeSet<String> {
    fn walk(cmd: &clap::Command, names: &mut BTreeSet<String>) {
        for sub in cmd.get_subcommands() {
            names.insert(sub.get_name().to_owned());
            walk(sub, names);
        }
    }
    let mut names = BTreeSet::new();
    walk(&crate::cli::Cli::command(), &mut names);
    names
}

/// The flag name of `arg` if it looks like one (`--name` or `-x`, without
/// anything after `=`), or `None` for a value.
fn flag_name(arg: &str) -> Option<&str> {
    let name = arg.split('=').next().unwrap_or_default();
    let is_flag = |rest: &str| {
        !rest.is_empty()
            && rest.len() <= 40
            && rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    match name.strip_prefix("--") {
        Some(rest) if is_flag(rest) => Some(name),
        Some(_) => None,
        None => match name.strip_prefix('-') {
            Some(rest) if is_flag(rest) => Some(name),
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        std::iter::once("idem")
            .chain(list.iter().copied())
            .map(OsString::from)
            .collect()
    }

    #[test]
    fn values_and_secret_shaped_flags_are_not_names() {
        assert_eq!(flag_name("--credential"), Some("--credential"));
        assert_eq!(
            flag_name("--credential=Bearer hunter2"),
            Some("--credential")
        );
        assert_eq!(flag_name("-x"), Some("-x"));
        for secret in [
            "hunter2",
            "Bearer abc",
            "--sk_live_51Habc",
            "-",
            "--",
            "--x y",
            "---------------------------------------------------------",
        ] {
            assert_eq!(flag_name(secret), None, "{secret}");
        }
    }

    #[test]
    fn every_value_is_blanked_wherever_it_is_quoted() {
        let subs = subcommand_names();
        let line = "invalid value 's3cret' for '--limit <LIMIT>': invalid digit in s3cret";
        let out = blank_values(
            line,
            &args(&["records", "stale", "--limit", "s3cret"]),
            &subs,
        );
        assert!(!out.contains("s3cret") && out.contains("--limit"), "{out}");
        let line = "unexpected value 'Bearer s3cret' for '--credential-stdin' found";
        let out = blank_values(line, &args(&["--credential-stdin=Bearer s3cret"]), &subs);
        assert!(
            !out.contains("s3cret") && out.contains("--credential-stdin"),
            "{out}"
        );
        // A short value is blanked where quoted, not inside other words.
        let line = "invalid value 'ab' for '--mode': a value like 'abc'";
        let out = blank_values(line, &args(&["--mode", "ab"]), &subs);
        assert_eq!(
            out,
            format!("invalid value '{HIDDEN}' for '--mode': a value like 'abc'")
        );
        // Subcommand names stay.
        let line = "unrecognized subcommand 'recrds'";
        let out = blank_values(line, &args(&["recrds", "stale"]), &subs);
        assert_eq!(out, format!("unrecognized subcommand '{HIDDEN}'"));
        assert!(
            subs.contains("records") && subs.contains("stale"),
            "{subs:?}"
        );
        // clap shows a value without its escape sequences; so is it blanked.
        let line = "unexpected value 's3cret' for '--credential-stdin' found";
        let out = blank_values(line, &args(&["--credential-stdin=\u{1b}[31ms3cret"]), &subs);
        assert!(!out.contains("s3cret"), "{out}");
        assert_eq!(without_escapes("\u{1b}[1;31mred\u{1b}[0m\u{7}!"), "red!");
    }
}
