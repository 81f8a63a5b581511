//! What is probed: the request (URL, method, body, headers), the
//! credentials, and the parsers of the user's input. Secrets are kept
//! here and redacted by [`Redactor`] wherever they would be shown.

use crate::error::Error;

/// One header given as `Name: value`.
#[derive(Clone, PartialEq, Eq)]
pub struct Header {
    /// The header's name as given (compared case-insensitively).
    pub name: String,
    /// Its value.
    pub value: String,
}

impl std::fmt::Debug for Header {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A Debug print never shows a value: it may be a credential.
        write!(f, "{}: <redacted>", self.name)
    }
}

impl Header {
    /// The header as sent. Fails with the reason when the name or value
    /// cannot be sent (the parsers refuse such input before).
    pub(crate) fn to_http(&self) -> Result<(http::HeaderName, http::HeaderValue), String> {
        header_pair(&self.name, &self.value)
    }
}

/// `name: value` as sent, or the reason it cannot be (the value is never
/// shown: it may be a secret).
pub(crate) fn header_pair(
    name: &str,
    value: &str,
) -> Result<(http::HeaderName, http::HeaderValue), String> {
    let name = http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("{name:?} is not a valid header name"))?;
    let value = http::HeaderValue::from_str(value)
        .map_err(|_| format!("the value of {name} has characters HTTP does not allow"))?;
    Ok((name, value))
}

impl std::str::FromStr for Header {
    type Err = Error;

    /// Parses `Name: value`. Fails ([`crate::ErrorKind::Input`]) without a
    /// colon, with an empty or invalid name, or a value with control
    /// characters.
    fn from_str(text: &str) -> Result<Header, Error> {
        parse_header(text)
    }
}

/// Parses `Name: value` (the value is trimmed). Fails
/// ([`crate::ErrorKind::Input`]) without a colon, with an empty name, a name
/// that is not an HTTP token, or a value with characters HTTP does not allow.
pub fn parse_header(text: &str) -> Result<Header, Error> {
    // A refusal never shows the text: a header is often a secret, and a
    // typo (`X-Api-Key=...`) would print it into a CI log.
    let Some((name, value)) = text.split_once(':') else {
        return Err(Error::input(
            "a header must be `Name: value` (not shown: it may hold a secret)",
        ));
    };
    let name = name.trim();
    if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Err(Error::input(
            "a header's name is not a valid HTTP header name (not shown: it may hold a secret)",
        ));
    }
    let value = value.trim();
    if http::HeaderValue::from_str(value).is_err() {
        return Err(Error::input(format!(
            "the value of header {name} has characters HTTP does not allow"
        )));
    }
    Ok(Header {
        name: name.to_owned(),
        value: value.to_owned(),
    })
}

/// Parses a credential given as `Name: value`, as [`parse_header`] does,
/// but a refusal never shows the text: it is a secret, and a mistake in
/// it (no `Name:`) would otherwise print the token into a CI log.
pub fn parse_credential(text: &str) -> Result<Header, Error> {
    parse_header(text).map_err(|_| {
        Error::input(
            "a credential must be `Name: value` with a valid header name and value (not shown: it is a secret)",
        )
    })
}

/// Parses a body argument: `@path` reads the file (any bytes), anything
/// else must be JSON. Fails with [`crate::ErrorKind::File`] on an unreadable
/// file and [`crate::ErrorKind::Input`] on text that is not JSON.
pub fn parse_body(text: &str) -> Result<Vec<u8>, Error> {
    if let Some(path) = text.strip_prefix('@') {
        return std::fs::read(path).map_err(|e| Error::file(path, e));
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(_) => Ok(text.as_bytes().to_vec()),
        Err(e) => Err(Error::input(format!(
            "body is neither @file nor JSON ({e})"
        ))),
    }
}

/// Checks a JSON pointer (RFC 6901): empty, or `/` followed by reference
/// tokens where `~` is only `~0` or `~1`. Fails with
/// [`crate::ErrorKind::Input`].
pub fn parse_pointer(text: &str) -> Result<String, Error> {
    if !text.is_empty() && !text.starts_with('/') {
        return Err(Error::input(format!(
            "JSON pointer {:?} must be empty or start with /",
            shorten(text)
        )));
    }
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(Error::input(format!(
                "JSON pointer {:?}: `~` must be followed by 0 or 1",
                shorten(text)
            )));
        }
    }
    Ok(text.to_owned())
}

/// Parses an absolute `http://` or `https://` URL with a host. Fails with
/// [`crate::ErrorKind::Input`], also for a URL with a user name or
/// password (give credentials with `--credential`). The refusal never
/// shows the text: a URL may carry a secret in its query.
pub fn parse_url(text: &str) -> Result<url::Url, Error> {
    let url = url::Url::parse(text.trim()).map_err(|e| {
        Error::input(format!(
            "a URL is not an absolute URL ({e}; not shown: it may hold a secret)"
        ))
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(Error::input(
            "a URL must be http:// or https:// with a host (not shown: it may hold a secret)",
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Error::input(
            "a URL must not carry a user name or password: give the credential with --credential (not shown: it is a secret)",
        ));
    }
    Ok(url)
}

/// Parses a query string for `--other-query` (a leading `?` is dropped).
/// Fails with [`crate::ErrorKind::Input`] on whitespace, control
/// characters or `#`; the refusal never shows the text.
pub fn parse_query(text: &str) -> Result<String, Error> {
    let query = text.strip_prefix('?').unwrap_or(text);
    if query.is_empty() {
        return Err(Error::input("--other-query is empty"));
    }
    if query
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '#')
    {
        return Err(Error::input(
            "--other-query must be a URL query (percent-encode spaces, control characters and #; not shown: it may hold a secret)",
        ));
    }
    Ok(query.to_owned())
}

fn shorten(text: &str) -> String {
    text.chars().take(60).collect()
}

/// The request every check sends, with variations.
#[derive(Clone)]
pub struct Target {
    /// The mutation's URL.
    pub url: url::Url,
    /// Its method (default `POST`).
    pub method: http::Method,
    /// The body that succeeds (the probe varies it).
    pub body: Vec<u8>,
    /// Headers sent on every request (`Content-Type: application/json` is
    /// added unless one is given).
    pub headers: Vec<Header>,
    /// The caller's credential, redacted everywhere.
    pub credential: Option<Header>,
    /// A second tenant's credential, redacted everywhere (for
    /// `key-scoped-to-credential`).
    pub second_credential: Option<Header>,
    /// A body the operation refuses with a deterministic 4xx.
    pub failing_body: Option<Vec<u8>>,
    /// A body the operation fails with a transient 5xx or 429.
    pub transient_body: Option<Vec<u8>>,
    /// The key header's name (default `Idempotency-Key`).
    pub key_header: String,
    /// Another URL that accepts the same body, for `key-bound-to-path`
    /// (default: the URL with `/idem-probe-other` appended, which a router
    /// usually answers 404 before reading the key).
    pub other_url: Option<url::Url>,
    /// Another body the operation accepts, for `key-bound-to-body` and the
    /// control requests (default: the body with a field
    /// `idem_probe_variant` added). Give one that differs in a field the
    /// API fingerprints when it fingerprints chosen fields only, or
    /// refuses unknown fields.
    pub other_body: Option<Vec<u8>>,
    /// Another query, for `key-bound-to-query` (default: the URL's query
    /// with `idem_probe=other` added). Replaces the URL's query.
    pub other_query: Option<String>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never a secret: URLs redacted, bodies by length, headers by name.
        let redactor = self.redactor();
        f.debug_struct("Target")
            .field("url", &redactor.redact(&redacted_url(&self.url)))
            .field("method", &self.method)
            .field("body_bytes", &self.body.len())
            .field("headers", &self.headers)
            .field("credential", &self.credential)
            .field("second_credential", &self.second_credential)
            .field("key_header", &self.key_header)
            .field(
                "other_url",
                &self
                    .other_url
                    .as_ref()
                    .map(|u| redactor.redact(&redacted_url(u))),
            )
            .finish_non_exhaustive()
    }
}

impl Target {
    /// A target with the defaults: `POST`, no extra headers, no
    /// credentials, `Idempotency-Key`.
    pub fn new(url: url::Url, body: Vec<u8>) -> Target {
        Target {
            url,
            method: http::Method::POST,
            body,
            headers: Vec::new(),
            credential: None,
            second_credential: None,
            failing_body: None,
            transient_body: None,
            key_header: "Idempotency-Key".to_owned(),
            other_url: None,
            other_body: None,
            other_query: None,
        }
    }

    /// Refuses `--header`s the probe must set itself, or that would send
    /// a request other than the one described: the key header (a fixed
    /// key would be reused by every check and every run), the
    /// credentials' headers, and the framing headers. Also refuses a key
    /// header or credential header that names a framing header, the
    /// method `CONNECT`, and an other body equal to the body.
    ///
    /// # Errors
    /// [`crate::ErrorKind::Input`], naming the header.
    pub fn check(&self) -> Result<(), Error> {
        const FRAMING: [&str; 5] = [
            "host",
            "content-length",
            "transfer-encoding",
            "connection",
            "content-type",
        ];
        if http::HeaderName::from_bytes(self.key_header.as_bytes()).is_err() {
            return Err(Error::input(format!(
                "--key-header {:?} is not a valid HTTP header name",
                shorten(&self.key_header)
            )));
        }
        for name in std::iter::once(self.key_header.as_str()).chain(
            self.credential
                .iter()
                .chain(&self.second_credential)
                .map(|c| c.name.as_str()),
        ) {
            if FRAMING.iter().any(|f| name.eq_ignore_ascii_case(f)) {
                return Err(Error::input(format!(
                    "{name} cannot carry the key or a credential: it frames the request"
                )));
            }
        }
        if self.method == http::Method::CONNECT {
            return Err(Error::input(
                "--method CONNECT opens a tunnel, not a mutation",
            ));
        }
        if self.other_query.is_some() && self.other_query.as_deref() == self.url.query() {
            return Err(Error::input(
                "--other-query is the URL's own query: it must differ for key-bound-to-query to mean anything",
            ));
        }
        if self.other_body.as_ref() == Some(&self.body) {
            return Err(Error::input(
                "--other-body is the same as --body: it must differ for key-bound-to-body to mean anything",
            ));
        }
        let reserved = |name: &str| {
            name.eq_ignore_ascii_case(&self.key_header)
                || ["host", "content-length", "transfer-encoding", "connection"]
                    .iter()
                    .any(|r| name.eq_ignore_ascii_case(r))
                || self
                    .credential
                    .iter()
                    .chain(&self.second_credential)
                    .any(|c| name.eq_ignore_ascii_case(&c.name))
        };
        match self.headers.iter().find(|h| reserved(&h.name)) {
            Some(h) => Err(Error::input(format!(
                "--header {}: the probe sets this header itself (the key is fresh for every check; credentials go in --credential)",
                h.name
            ))),
            None => Ok(()),
        }
    }

    /// The redactor for this target's secrets.
    pub fn redactor(&self) -> Redactor {
        let mut secrets = Vec::new();
        let mut secret_value = |value: &str| {
            secrets.push(value.to_owned());
            // The token alone, after an auth scheme (`Bearer <token>`):
            // a server may echo it without the scheme.
            if let Some((_, token)) = value.split_once(' ') {
                let token = token.trim();
                if token.len() >= 8 {
                    secrets.push(token.to_owned());
                }
            }
        };
        for h in self.credential.iter().chain(&self.second_credential) {
            secret_value(&h.value);
        }
        for h in &self.headers {
            if is_sensitive(&h.name) {
                secret_value(&h.value);
            }
        }
        let queries = std::iter::once(&self.url)
            .chain(&self.other_url)
            .filter_map(|u| u.query())
            .chain(self.other_query.as_deref());
        for query in queries {
            for pair in query.split('&') {
                let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
                let decode = |raw: &str| {
                    form_urlencoded::parse(format!("x={raw}").as_bytes())
                        .next()
                        .map(|(_, v)| v.into_owned())
                        .unwrap_or_default()
                };
                if is_sensitive_query(&decode(raw_name)) {
                    // Both as written in the URL and decoded: an answer
                    // may echo either.
                    secrets.push(raw_value.to_owned());
                    secrets.push(decode(raw_value));
                }
            }
        }
        secrets.retain(|s| s.len() >= 3);
        // Longest first, so a secret containing another is hidden whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Redactor { secrets }
    }
}

/// Header names whose values are secrets even outside `--credential`:
/// anything named like an authorization, a cookie or session, a token, a
/// secret, a key (`X-Api-Key`, `X-Auth-Key`, `Ocp-Apim-Subscription-Key`,
/// `X-Functions-Key`), a signature, a password or a credential. Better one
/// value too many hidden than one secret in a CI log.
pub(crate) fn is_sensitive(name: &str) -> bool {
    let name = name.to_ascii_lowercase().replace('_', "-");
    matches!(name.as_str(), "cookie" | "set-cookie" | "key")
        || [
            "auth",
            "token",
            "secret",
            "apikey",
            "api-key",
            "signature",
            "password",
            "passwd",
            "session",
            "credential",
        ]
        .iter()
        .any(|word| name.contains(word))
        || name.ends_with("-key")
}

/// Query parameter names whose values are secrets (`?api_key=`,
/// `?access_token=`, `?signature=`).
pub(crate) fn is_sensitive_query(name: &str) -> bool {
    let name = name.to_ascii_lowercase().replace('_', "-");
    is_sensitive(&name) || name == "sig" || name == "code"
}

/// `url` with the values of secret query parameters replaced (the URL
/// holds no password: [`parse_url`] refuses one).
pub(crate) fn redacted_url(url: &url::Url) -> String {
    let mut u = url.clone();
    if u.query_pairs().any(|(name, _)| is_sensitive_query(&name)) {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(n, v)| {
                let v = if is_sensitive_query(&n) {
                    "redacted".into()
                } else {
                    v.into_owned()
                };
                (n.into_owned(), v)
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    u.to_string()
}

/// Replaces every secret with `<redacted>` in text shown to the user.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    /// `text` with every secret replaced.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), "<redacted>");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_parse_and_refuse() {
        let h = parse_header("Authorization:  Bearer abc ").unwrap();
        assert_eq!(
            (h.name.as_str(), h.value.as_str()),
            ("Authorization", "Bearer abc")
        );
        assert!(parse_header("no colon").is_err());
        assert!(parse_header(": value").is_err());
        assert!(parse_header("Bad Name: v").is_err());
        assert!(format!("{h:?}").contains("<redacted>"));
    }

    #[test]
    fn pointers() {
        assert!(parse_pointer("").is_ok());
        assert!(parse_pointer("/a/~0b/~1c").is_ok());
        assert!(parse_pointer("a").is_err());
        assert!(parse_pointer("/a~2").is_err());
        assert!(parse_pointer("/a~").is_err());
    }

    #[test]
    fn secrets_are_redacted() {
        let mut t = Target::new(parse_url("http://h/x").unwrap(), b"{}".to_vec());
        t.credential = Some(parse_header("Authorization: Bearer s3cret").unwrap());
        let r = t.redactor();
        assert_eq!(r.redact("a Bearer s3cret b"), "a <redacted> b");
        assert!(parse_url("http://u:pw123@h/x").is_err());
        assert!(parse_url("https://h/x").is_ok());
        assert!(parse_url("ftp://h/x").is_err());
    }

    /// A fixed key, a repeated credential header or a framing header in
    /// `--header` is refused: the probe sets those itself.
    #[test]
    fn headers_the_probe_sets_are_refused() {
        let url = parse_url("http://127.0.0.1:1/pay").unwrap();
        let mut t = Target::new(url, b"{}".to_vec());
        t.credential = Some(parse_credential("Authorization: Bearer abcdefgh123").unwrap());
        for name in ["idempotency-key", "AUTHORIZATION", "Host", "content-length"] {
            t.headers = vec![parse_header(&format!("{name}: x")).unwrap()];
            assert!(t.check().is_err(), "{name} accepted");
        }
        t.headers = vec![parse_header("X-Tenant: a").unwrap()];
        assert!(t.check().is_ok());
    }

    /// Secret-looking header names are redacted, the key header's value
    /// (shown on purpose) and plain headers are not.
    #[test]
    fn secret_header_names() {
        for name in [
            "Authorization",
            "X-Auth-Key",
            "Ocp-Apim-Subscription-Key",
            "X-Functions-Key",
            "X-Access-Key",
            "X-Signature",
            "X-Session-Id",
            "Cookie",
            "x_api_key",
        ] {
            assert!(is_sensitive(name), "{name}");
        }
        for name in ["Content-Type", "Accept", "X-Tenant", "X-Request-Id"] {
            assert!(!is_sensitive(name), "{name}");
        }
    }

    /// A malformed header's refusal never shows it.
    #[test]
    fn a_bad_header_is_not_echoed() {
        for text in ["X-Api-Key=sk_live_0123456789", "Bad sk_live_0123456789: v"] {
            let e = parse_header(text).unwrap_err().to_string();
            assert!(!e.contains("sk_live"), "{e}");
        }
    }

    /// A malformed credential's refusal never shows the credential.
    #[test]
    fn a_bad_credential_is_not_echoed() {
        let e = parse_credential("eyJhbGciOiJIUzI1NiJ9.secret-token-value").unwrap_err();
        assert!(!e.to_string().contains("secret-token"), "{e}");
        let e = parse_credential("Authorization Bearer a:b-secret").unwrap_err();
        assert!(!e.to_string().contains("b-secret"), "{e}");
    }

    /// The token after an auth scheme, and secret query parameters, are
    /// redacted on their own too.
    #[test]
    fn tokens_alone_and_query_secrets_are_redacted() {
        let url = parse_url("http://127.0.0.1:1/pay?api_key=qk-123456&x=1").unwrap();
        let mut t = Target::new(url, b"{}".to_vec());
        t.credential = Some(parse_credential("Authorization: Bearer tok-abcdefgh").unwrap());
        let r = t.redactor();
        assert_eq!(r.redact("echo tok-abcdefgh"), "echo <redacted>");
        assert_eq!(r.redact("key qk-123456"), "key <redacted>");
        assert!(!redacted_url(&t.url).contains("qk-123456"));
    }

    /// A secret query value is redacted as written in the URL
    /// (percent-encoded) and decoded, and never shows in Debug.
    #[test]
    fn encoded_query_secrets_and_debug_are_redacted() {
        let url = parse_url("https://h/pay?access_token=a%2Bsecret%2F99&x=1").unwrap();
        let mut t = Target::new(url, br#"{"card":"4242"}"#.to_vec());
        t.credential = Some(parse_credential("X-Api-Key: k-0123456789").unwrap());
        let r = t.redactor();
        assert_eq!(r.redact("echo a%2Bsecret%2F99"), "echo <redacted>");
        assert_eq!(r.redact("echo a+secret/99"), "echo <redacted>");
        let debug = format!("{t:?}");
        for secret in ["secret", "k-0123456789", "4242"] {
            assert!(!debug.contains(secret), "{debug}");
        }
    }

    /// The key or a credential in a framing header, CONNECT, and other
    /// variations equal to the originals are refused.
    #[test]
    fn targets_that_cannot_mean_anything_are_refused() {
        let url = parse_url("http://127.0.0.1:1/pay?a=1").unwrap();
        let t = Target::new(url, b"{}".to_vec());
        let refused = |f: &dyn Fn(&mut Target)| {
            let mut t = t.clone();
            f(&mut t);
            t.check().is_err()
        };
        assert!(refused(&|t| t.key_header = "Content-Length".into()));
        assert!(refused(&|t| t.key_header = "Bad Name".into()));
        assert!(refused(
            &|t| t.credential = Some(parse_header("Host: evil").unwrap())
        ));
        assert!(refused(&|t| t.method = http::Method::CONNECT));
        assert!(refused(&|t| t.other_body = Some(b"{}".to_vec())));
        assert!(refused(&|t| t.other_query = Some("a=1".into())));
        assert!(!refused(&|t| t.other_query = Some("a=2".into())));
        assert!(t.check().is_ok());
    }
}
