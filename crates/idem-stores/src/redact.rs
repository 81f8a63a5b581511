//! A URL as it may be shown in a message or a log: without its password.

/// The URL without its password: the password of the user info (up to
/// the last `@`, so a raw `@` in a password is covered too), a user info
/// without a password (it may be a token), and the value of any query
/// parameter whose name mentions a password. Text that is not a URL at all
/// (a libpq `key=value` string, a typo) may hold a password anywhere, so
/// none of it is shown.
///
/// ```
/// assert_eq!(
///     idem_stores::redact("postgres://u:s3cret@h/db?password=x&sslmode=require"),
///     "postgres://u:***@h/db?password=***&sslmode=require"
/// );
/// ```
pub fn redact(url: &str) -> String {
    let Some((scheme, after)) = url
        .split_once("://")
        .filter(|(scheme, _)| is_scheme(scheme))
    else {
        return "(not shown: not a URL)".to_owned();
    };
    let mut out = format!("{scheme}://");
    // Drivers differ on where the user info ends (the first '@', or the
    // last); hiding up to the last '@' covers a raw '@', '?' or '/' in a
    // password whichever they pick.
    let rest = match after.rfind('@') {
        Some(at) => {
            match after[..at].split_once(':') {
                Some((user, _)) if !user.contains(['/', '?', '&', '#', '=']) => {
                    out.push_str(user);
                    out.push_str(":***@");
                }
                // A lone user info may be a token: not shown either.
                _ => out.push_str("***@"),
            }
            &after[at + 1..]
        }
        None => after,
    };
    // Every `name=value` pair in what is left, wherever it stands (the
    // last '@' may have been inside the query), its value hidden when the
    // name is about a password.
    let mut pair_start = 0;
    for (i, c) in rest.char_indices().chain([(rest.len(), '&')]) {
        if matches!(c, '?' | '&' | ';' | '#') {
            out.push_str(&hide_password(&rest[pair_start..i]));
            if i < rest.len() {
                out.push(c);
            }
            pair_start = i + c.len_utf8();
        }
    }
    out
}

/// A URL scheme (RFC 3986): a letter, then letters, digits, `+`, `-`, `.`.
fn is_scheme(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// One `name=value` piece with its value hidden if the name is about a
/// password; anything else as it is.
fn hide_password(piece: &str) -> String {
    match piece.split_once('=') {
        Some((name, _)) if names_a_password(name) => format!("{name}=***"),
        _ => piece.to_owned(),
    }
}

/// Whether a query parameter's name, percent-decoded as drivers decode
/// it, is about a password.
fn names_a_password(name: &str) -> bool {
    percent_encoding::percent_decode_str(name)
        .decode_utf8_lossy()
        .to_ascii_lowercase()
        .contains("pass")
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        assert_eq!(redact("postgres://u:p@ss@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u:s3?cret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u:s3/cret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("redis://s3cret@h:6379"), "redis://***@h:6379");
        for hidden in [
            "postgres://h/db?%70assword=s3cret",
            "postgres://h/db?PASSWORD=s3cret&x=1",
            "host=h user=u password=s3cret",
            "s3cret",
            // The last '@' inside the query: the password after it.
            "postgres://u@h/db?options=a@b&password=s3cret",
            "postgres://u:s3cret@h/db?options=a@b",
            // Not a URL, with a `://` somewhere inside.
            "user=u password=s3cret host=h://x",
            " postgres://u:s3cret@h/db",
        ] {
            assert!(
                !redact(hidden).contains("s3cret"),
                "{hidden}: {}",
                redact(hidden)
            );
        }
        assert_eq!(
            redact("postgres://h/db?user=u&password=secret&sslmode=require"),
            "postgres://h/db?user=u&password=***&sslmode=require"
        );
    }

    proptest::proptest! {
        /// A password made of the characters that confuse URL parsers
        /// (`@ ? / & # = :`), in the user info or in the query, never
        /// shows.
        #[test]
        fn no_password_shows(
            pw in "Zq9[A-Za-z0-9@?/&#=:%]{4,24}",
            scheme in "(postgres|redis|mysql|rediss)",
            options in "[a-z@=&]{0,12}",
        ) {
            for url in [
                format!("{scheme}://app:{pw}@db.internal:5432/pay?{options}"),
                format!("{scheme}://app@db.internal/pay?{options}&password={pw}"),
                format!("{scheme}://db.internal/pay?password={pw}&{options}"),
                // A lone user info (a token), unless its ':' makes it a
                // user (shown) and a password.
                format!("{scheme}://{}@db.internal/pay", pw.replace(':', "")),
            ] {
                let shown = redact(&url);
                proptest::prop_assert!(!shown.contains(&pw), "{} -> {}", url, shown);
                proptest::prop_assert!(!shown.contains(&pw.replace(':', "")), "{} -> {}", url, shown);
            }
        }
    }
}
