//! The `Idempotency-Key` value and the hygiene rules it must pass.
//!
//! The header is an RFC 8941 Item whose value is a String (`"..."`), as
//! draft-ietf-httpapi-idempotency-key-header says. Many clients (Stripe's
//! libraries among them) send the key bare, without quotes, so a bare value
//! is accepted too. A bare value may hold any visible ASCII character except
//! `"`, `\`, `,` and `;`: a comma is what a proxy leaves when it folds two
//! `Idempotency-Key` headers into one, and a semicolon starts parameters,
//! so both are refused rather than guessed at.
//!
//! A quoted value must be a complete sf-string and nothing else: parameters
//! after the closing quote are refused, because a key whose meaning depends
//! on how a server treats parameters is not one key.
//!
//! Both forms name the same key: `"8e03978e-40d5"` and `8e03978e-40d5` are
//! one record, so a client that changes form between two attempts replays
//! instead of executing twice. Clients write the sf-string form
//! ([`Key::to_sf_string`]), as the draft does.

use std::fmt;

/// The longest key accepted, in characters, after parsing.
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key: 1 to 255 printable ASCII characters that
/// passed [`KeyPolicy`].
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

impl Key {
    /// Parses a raw `Idempotency-Key` header value and applies `policy`.
    ///
    /// `credential` is the request's credential without its scheme (the
    /// token after `Bearer `), if it has one; a key equal to it or holding
    /// it is refused.
    ///
    /// # Errors
    /// A [`KeyError`] naming the rule the value broke.
    pub fn parse(raw: &str, policy: &KeyPolicy, credential: Option<&str>) -> Result<Key, KeyError> {
        let value = parse_value(raw)?;
        policy.check(&value, credential)?;
        Ok(Key(value))
    }

    /// Builds a key from an already-validated string, checking only the
    /// character set and length (1 to 255 printable ASCII).
    ///
    /// Meant for stores and tools that read keys back; request paths use
    /// [`Key::parse`].
    ///
    /// # Errors
    /// [`KeyError::Empty`], [`KeyError::TooLong`] or [`KeyError::InvalidCharacter`].
    pub fn new(value: impl Into<String>) -> Result<Key, KeyError> {
        let value = value.into();
        check_charset(&value, |c| (0x20..=0x7e).contains(&c))?;
        Ok(Key(value))
    }

    /// Parses a raw header value for its syntax alone (an sf-string or a
    /// bare value, as [`Key::parse`] reads it), with no [`KeyPolicy`]: what
    /// a client does with a key its caller put on a request, before sending
    /// it on. Bytes outside ASCII are refused as [`KeyError::InvalidCharacter`].
    ///
    /// # Errors
    /// A [`KeyError`] naming the rule the value broke.
    pub fn from_header_value(raw: &[u8]) -> Result<Key, KeyError> {
        let text = std::str::from_utf8(raw).map_err(|e| {
            let at = e.valid_up_to();
            KeyError::InvalidCharacter {
                byte: raw.get(at).copied().unwrap_or(0),
                at,
            }
        })?;
        parse_value(text).map(Key)
    }

    /// The key as the client sent it, without quotes or escapes.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as an RFC 8941 sf-string, the form
    /// draft-ietf-httpapi-idempotency-key-header writes
    /// (`"8e03978e-40d5-43e8-bc93-6894a57f9324"`): the key between double
    /// quotes, with `"` and `\` escaped. Always a valid header value, since
    /// a key holds printable ASCII only; [`Key::parse`] reads it back as
    /// this key.
    pub fn to_sf_string(&self) -> String {
        let mut out = String::with_capacity(self.0.len() + 2);
        out.push('"');
        for c in self.0.chars() {
            if matches!(c, '"' | '\\') {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }

    /// A short, stable hash of the key, for logs: the key itself may be a
    /// guessable value that must not be written anywhere.
    pub fn log_id(&self) -> String {
        crate::digest::short_hex(self.0.as_bytes())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys never appear in logs in the clear.
        write!(f, "Key({})", self.log_id())
    }
}

/// Why a header value is not an acceptable key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The value is empty (or only whitespace).
    #[error("the Idempotency-Key is empty")]
    Empty,
    /// Longer than [`MAX_KEY_LEN`].
    #[error("the Idempotency-Key is {len} characters long; at most {MAX_KEY_LEN} are allowed")]
    TooLong {
        /// Length after parsing.
        len: usize,
    },
    /// Shorter than the policy's minimum.
    #[error("the Idempotency-Key is {len} characters long; at least {min} are required")]
    TooShort {
        /// Length after parsing.
        len: usize,
        /// The policy's minimum.
        min: usize,
    },
    /// A character outside the allowed set.
    #[error(
        "the Idempotency-Key holds a character that is not allowed (byte 0x{byte:02x} at {at})"
    )]
    InvalidCharacter {
        /// The offending byte.
        byte: u8,
        /// Its position in the parsed value.
        at: usize,
    },
    /// A quoted value that is not a well-formed RFC 8941 sf-string.
    #[error("the Idempotency-Key is not a valid structured-field string: {0}")]
    Malformed(&'static str),
    /// The key is, or holds, the request's credential.
    #[error("the Idempotency-Key contains the request's credential; use a random value instead")]
    ContainsCredential,
    /// The key looks like a JSON Web Token.
    #[error("the Idempotency-Key is shaped like a JWT; keys must not carry secrets")]
    JwtShaped,
    /// The request carries the key header more than once: which one names
    /// the intent?
    #[error("the request carries more than one Idempotency-Key header")]
    Repeated,
}

/// Hygiene rules a key must pass beyond its syntax.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPolicy {
    min_len: usize,
    reject_credential: bool,
    reject_jwt: bool,
}

impl Default for KeyPolicy {
    fn default() -> Self {
        KeyPolicy {
            min_len: 16,
            reject_credential: true,
            reject_jwt: true,
        }
    }
}

/// Credentials shorter than this are not searched for inside keys: a
/// four-letter token would reject innocent keys by chance.
const MIN_CREDENTIAL_LEN: usize = 8;

impl KeyPolicy {
    /// The minimum key length. Default 16, clamped to 1..=255.
    pub fn min_len(mut self, min: usize) -> Self {
        self.min_len = min.clamp(1, MAX_KEY_LEN);
        self
    }

    /// Whether a key equal to or containing the credential is refused.
    /// Default `true`.
    pub fn reject_credential(mut self, on: bool) -> Self {
        self.reject_credential = on;
        self
    }

    /// Whether a key shaped like a JWT is refused. Default `true`.
    pub fn reject_jwt(mut self, on: bool) -> Self {
        self.reject_jwt = on;
        self
    }

    /// The configured minimum length.
    pub fn minimum_len(&self) -> usize {
        self.min_len
    }

    fn check(&self, value: &str, credential: Option<&str>) -> Result<(), KeyError> {
        let len = value.len();
        if len < self.min_len {
            return Err(KeyError::TooShort {
                len,
                min: self.min_len,
            });
        }
        if self.reject_credential
            && let Some(cred) = credential.map(str::trim)
            && cred.len() >= MIN_CREDENTIAL_LEN.min(len)
            && !cred.is_empty()
            && value.contains(cred)
        {
            return Err(KeyError::ContainsCredential);
        }
        if self.reject_jwt && is_jwt_shaped(value) {
            return Err(KeyError::JwtShaped);
        }
        Ok(())
    }
}

/// Three base64url segments joined by dots, the first two non-empty (the
/// signature is empty for `alg: none`), and the first one the encoding of a
/// JSON object (`eyJ` is base64url for `{"`): every JWT header is one, and
/// the test keeps dotted keys such as `order.2026-11-30.42` usable.
fn is_jwt_shaped(value: &str) -> bool {
    let b64url = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    let mut parts = value.split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(h), Some(p), Some(s), None) => {
            h.starts_with("eyJ") && !p.is_empty() && b64url(h) && b64url(p) && b64url(s)
        }
        _ => false,
    }
}

fn check_charset(value: &str, allowed: impl Fn(u8) -> bool) -> Result<(), KeyError> {
    if value.is_empty() {
        return Err(KeyError::Empty);
    }
    if let Some((at, byte)) = value.bytes().enumerate().find(|&(_, b)| !allowed(b)) {
        return Err(KeyError::InvalidCharacter { byte, at });
    }
    if value.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong { len: value.len() });
    }
    Ok(())
}

/// Parses the header value: an sf-string or a bare value, after trimming
/// the optional whitespace HTTP allows around a field value.
fn parse_value(raw: &str) -> Result<String, KeyError> {
    let raw = raw.trim_matches([' ', '\t']);
    if raw.is_empty() {
        return Err(KeyError::Empty);
    }
    if raw.starts_with('"') {
        let value = parse_sf_string(raw)?;
        check_charset(&value, |c| (0x20..=0x7e).contains(&c))?;
        Ok(value)
    } else {
        check_charset(raw, |c| {
            (0x21..=0x7e).contains(&c) && !matches!(c, b'"' | b'\\' | b',' | b';')
        })?;
        Ok(raw.to_owned())
    }
}

/// RFC 8941 section 4.2.5: a DQUOTE, printable ASCII with `\"` and `\\`
/// as the only escapes, a closing DQUOTE, and nothing after it.
fn parse_sf_string(raw: &str) -> Result<String, KeyError> {
    let mut out = String::with_capacity(raw.len());
    let mut bytes = raw.bytes().skip(1);
    loop {
        match bytes.next() {
            None => return Err(KeyError::Malformed("missing closing quote")),
            Some(b'\\') => match bytes.next() {
                Some(c @ (b'"' | b'\\')) => out.push(char::from(c)),
                _ => return Err(KeyError::Malformed("only \\\" and \\\\ may be escaped")),
            },
            Some(b'"') => break,
            Some(c) if (0x20..=0x7e).contains(&c) => out.push(char::from(c)),
            Some(byte) => {
                return Err(KeyError::InvalidCharacter {
                    byte,
                    at: out.len(),
                });
            }
        }
    }
    if bytes.next().is_some() {
        return Err(KeyError::Malformed(
            "unexpected characters after the closing quote (parameters are not accepted)",
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> Result<Key, KeyError> {
        Key::parse(raw, &KeyPolicy::default(), Some("sk_live_abcdefgh12345678"))
    }

    #[test]
    fn quoted_and_bare_forms_give_the_same_key() {
        let a = parse("\"8e03978e-40d5-43e8-bc93-6894a57f9324\"").unwrap();
        let b = parse("8e03978e-40d5-43e8-bc93-6894a57f9324").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.as_str(), "8e03978e-40d5-43e8-bc93-6894a57f9324");
    }

    #[test]
    fn escapes_and_spaces_inside_quotes() {
        let k = parse(r#""order 42 \"retry\" \\ ok""#).unwrap();
        assert_eq!(k.as_str(), r#"order 42 "retry" \ ok"#);
        assert_eq!(
            parse(r#""bad escape \n here...""#),
            Err(KeyError::Malformed("only \\\" and \\\\ may be escaped"))
        );
    }

    #[test]
    fn malformed_values_are_refused_with_a_reason() {
        assert_eq!(parse(""), Err(KeyError::Empty));
        assert_eq!(parse("  \t"), Err(KeyError::Empty));
        assert_eq!(parse("\"\""), Err(KeyError::Empty));
        assert!(matches!(
            parse("\"abcdefghijklmnopq"),
            Err(KeyError::Malformed(_))
        ));
        assert!(matches!(
            parse("\"abcdefghijklmnopq\";p=1"),
            Err(KeyError::Malformed(_))
        ));
        // Two headers folded into one by a proxy.
        assert!(matches!(
            parse("abcdefghijklmnopq, abcdefghijklmnopq"),
            Err(KeyError::InvalidCharacter { byte: b',', .. })
        ));
        assert!(matches!(
            parse("\"abcdefghij\u{e9}klmnopq\""),
            Err(KeyError::InvalidCharacter { .. })
        ));
    }

    #[test]
    fn length_limits() {
        assert_eq!(
            parse("short-key"),
            Err(KeyError::TooShort { len: 9, min: 16 })
        );
        let max = "k".repeat(MAX_KEY_LEN);
        assert!(parse(&max).is_ok());
        assert_eq!(
            parse(&"k".repeat(MAX_KEY_LEN + 1)),
            Err(KeyError::TooLong { len: 256 })
        );
        let lenient = KeyPolicy::default().min_len(1);
        assert!(Key::parse("x", &lenient, None).is_ok());
    }

    #[test]
    fn secrets_are_refused() {
        assert_eq!(
            parse("sk_live_abcdefgh12345678"),
            Err(KeyError::ContainsCredential)
        );
        assert_eq!(
            parse("retry-sk_live_abcdefgh12345678-1"),
            Err(KeyError::ContainsCredential)
        );
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk";
        assert_eq!(parse(jwt), Err(KeyError::JwtShaped));
        let off = KeyPolicy::default()
            .reject_jwt(false)
            .reject_credential(false);
        assert!(Key::parse(jwt, &off, None).is_ok());
        assert!(
            Key::parse(
                "sk_live_abcdefgh12345678",
                &off,
                Some("sk_live_abcdefgh12345678")
            )
            .is_ok()
        );
        // A dotted key that is not three base64url segments passes.
        assert!(parse("order.2026-11-30.42").is_ok());
        assert!(parse("v1.order-12345678.step.2").is_ok());
    }

    #[test]
    fn debug_never_shows_the_key() {
        let k = parse("super-secret-looking-key-1").unwrap();
        assert!(!format!("{k:?}").contains("super-secret"));
    }

    #[test]
    fn the_sf_string_form_escapes_quotes_and_backslashes() {
        let k = Key::new(r#"order "42" \ retry"#).unwrap();
        assert_eq!(k.to_sf_string(), r#""order \"42\" \\ retry""#);
        let uuid = Key::new("8e03978e-40d5-43e8-bc93-6894a57f9324").unwrap();
        assert_eq!(
            uuid.to_sf_string(),
            "\"8e03978e-40d5-43e8-bc93-6894a57f9324\""
        );
    }

    #[test]
    fn header_values_are_read_for_their_syntax_alone() {
        // No policy: short keys and JWT shapes are the server's business.
        assert_eq!(Key::from_header_value(b"\"k\"").unwrap().as_str(), "k");
        assert_eq!(Key::from_header_value(b"k").unwrap().as_str(), "k");
        assert_eq!(
            Key::from_header_value(b"\"ab\xe9cd\""),
            Err(KeyError::InvalidCharacter { byte: 0xe9, at: 3 })
        );
        assert_eq!(
            Key::from_header_value("\"ab\u{e9}cd\"".as_bytes()),
            Err(KeyError::InvalidCharacter { byte: 0xc3, at: 2 })
        );
        assert!(matches!(
            Key::from_header_value(b"\"k"),
            Err(KeyError::Malformed(_))
        ));
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// The syntax alone: every policy rule off, any length.
        fn syntax() -> KeyPolicy {
            KeyPolicy::default()
                .min_len(1)
                .reject_credential(false)
                .reject_jwt(false)
        }

        fn parse(raw: &str) -> Result<Key, KeyError> {
            Key::parse(raw, &syntax(), None)
        }

        /// Printable ASCII, `"` and `\` included: any key.
        fn any_key() -> impl Strategy<Value = String> {
            "[ -~]{1,255}"
        }

        /// What a bare key may hold.
        fn bare_key() -> impl Strategy<Value = String> {
            "[!#-+\\--:<-\\[\\]-~]{1,255}"
        }

        /// The sf-string of `value` without its quotes: escaped units only.
        fn inner(value: &str) -> String {
            value.replace('\\', "\\\\").replace('"', "\\\"")
        }

        /// A character an sf-string may not hold: a control, DEL, or
        /// anything beyond ASCII.
        fn outside_printable_ascii() -> impl Strategy<Value = char> {
            prop_oneof![
                (0u8..0x20).prop_map(char::from),
                Just('\u{7f}'),
                any::<char>().prop_filter("beyond ASCII", |c| !c.is_ascii()),
            ]
        }

        proptest! {
            #[test]
            fn any_input_gives_a_key_or_an_error_and_keys_round_trip(raw in ".{0,300}") {
                if let Ok(key) = parse(&raw) {
                    let s = key.as_str();
                    prop_assert!((1..=MAX_KEY_LEN).contains(&s.len()));
                    prop_assert!(s.bytes().all(|b| (0x20..=0x7e).contains(&b)));
                    prop_assert_eq!(parse(&key.to_sf_string()), Ok(key));
                }
            }

            #[test]
            fn sf_string_like_input_gives_a_key_or_an_error(
                raw in "[ \t]{0,2}\"([ -~]|\\\\.|[\\x00-\\x1f\\x7f\u{e9}]){0,40}\"?[ -~\\t]{0,4}"
            ) {
                let parsed = parse(&raw);
                // The server's entry point and the client's agree.
                prop_assert_eq!(&Key::from_header_value(raw.as_bytes()), &parsed);
                if let Ok(key) = parsed {
                    prop_assert_eq!(parse(&key.to_sf_string()), Ok(key));
                }
            }

            #[test]
            fn every_key_reads_back_from_its_sf_string(value in any_key()) {
                let key = Key::new(value.clone()).unwrap();
                let quoted = key.to_sf_string();
                let parsed = parse(&quoted).unwrap();
                prop_assert_eq!(parsed.as_str(), value.as_str());
                prop_assert_eq!(Key::from_header_value(quoted.as_bytes()), Ok(key));
            }

            #[test]
            fn quoted_and_bare_name_the_same_key(value in bare_key()) {
                let bare = parse(&value).unwrap();
                let quoted = parse(&format!("\"{value}\"")).unwrap();
                prop_assert_eq!(&bare, &quoted);
                prop_assert_eq!(bare.to_sf_string(), format!("\"{value}\""));
            }

            #[test]
            fn an_unterminated_sf_string_is_malformed(value in any_key()) {
                let quoted = Key::new(value).unwrap().to_sf_string();
                let unterminated = &quoted[..quoted.len() - 1];
                prop_assert_eq!(
                    parse(unterminated),
                    Err(KeyError::Malformed("missing closing quote"))
                );
            }

            #[test]
            fn anything_after_the_closing_quote_is_malformed(
                value in any_key(),
                after in "[ \t]{0,2}[!-~][ -~]{0,8}",
            ) {
                let quoted = Key::new(value).unwrap().to_sf_string();
                let raw = format!("{quoted}{after}");
                let parsed = parse(&raw);
                prop_assert!(matches!(parsed, Err(KeyError::Malformed(_))), "{raw:?}: {parsed:?}");
            }

            #[test]
            fn an_escape_other_than_quote_or_backslash_is_malformed(
                before in "[ -~]{0,20}",
                escaped in "[ -!#-\\[\\]-~]",
                after in "[ -~]{0,20}",
            ) {
                let raw = format!("\"{}\\{escaped}{}\"", inner(&before), inner(&after));
                prop_assert_eq!(
                    parse(&raw),
                    Err(KeyError::Malformed("only \\\" and \\\\ may be escaped"))
                );
            }

            #[test]
            fn a_character_outside_printable_ascii_is_refused(
                before in "[ -~]{0,20}",
                bad in outside_printable_ascii(),
                after in "[ -~]{0,20}",
            ) {
                let raw = format!("\"{}{bad}{}\"", inner(&before), inner(&after));
                let at = before.len();
                let byte = raw.as_bytes()[inner(&before).len() + 1];
                prop_assert_eq!(parse(&raw), Err(KeyError::InvalidCharacter { byte, at }));
            }
        }
    }
}
