//! Strict JSON parsing and one canonical serialisation, for fingerprints.
//!
//! Two bodies that carry the same JSON value must fingerprint alike, and
//! two bodies that carry different values must not. RFC 8785 gets the first
//! half right but reads every number as an IEEE double, so `9007199254740993`
//! and `9007199254740992` (or a 30-digit amount and its neighbour) collapse
//! into one. This module keeps numbers exactly, as a decimal digit string and
//! a 64-bit exponent, and defines its own canonical form:
//!
//! - no insignificant whitespace;
//! - object members sorted by the UTF-8 bytes of their (decoded) keys;
//! - strings with every escape decoded, then written with `\"`, `\\`,
//!   `\b`, `\f`, `\n`, `\r`, `\t`, `\u00xx` (lower-case hex) for the other
//!   control characters, and every other character as itself in UTF-8;
//! - numbers as `[-]D` followed either by `N` zeros (when the integer has at
//!   most 21 digits) or by `eN`, where `D` is the significant digits without
//!   leading or trailing zeros and `N` the decimal exponent; zero is `0`.
//!   So `100`, `100.0`, `1.0e2`, `1E+2` and `10000e-2` are all `100`,
//!   `-0` is `0`, `1.5` is `15e-1`, and `1e400` stays `1e400`.
//!
//! The parser is strict RFC 8259 plus three refusals that make the value
//! well-defined: duplicate keys (after decoding escapes), lone UTF-16
//! surrogates in `\u` escapes, and exponents that do not fit in an `i64`
//! after normalisation. Nesting is limited to [`MAX_DEPTH`] containers and
//! the parser keeps its own stack, so hostile input such as `[[[[...` never
//! recurses. The output of [`canonicalize`] is valid JSON and canonicalizes
//! to itself.

use std::borrow::Cow;

/// The deepest nesting of arrays and objects accepted.
pub(crate) const MAX_DEPTH: usize = 128;

/// Integers with at most this many digits are written without an exponent.
const MAX_PLAIN_DIGITS: i64 = 21;

/// Why a body is not JSON as far as fingerprints are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum JsonError {
    /// The body is not UTF-8.
    #[error("not UTF-8")]
    NotUtf8,
    /// The body does not follow the JSON grammar at this byte offset.
    #[error("invalid JSON at byte {0}")]
    Syntax(usize),
    /// More than [`MAX_DEPTH`] nested arrays and objects.
    #[error("nested deeper than {MAX_DEPTH}")]
    TooDeep,
    /// An object names the same key twice.
    #[error("duplicate object key")]
    DuplicateKey,
    /// A `\u` escape is half of a UTF-16 surrogate pair.
    #[error("lone UTF-16 surrogate in a string")]
    LoneSurrogate,
    /// A number's exponent does not fit in 64 bits.
    #[error("number exponent out of range")]
    ExponentOverflow,
}

/// A parsed JSON value with exact numbers and sorted, unique object keys.
/// Strings and digits borrow from the parsed text where they can (a string
/// without escapes, a number whose digits are one run of it), so a body is
/// not copied piece by piece on the way to its canonical form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Json<'a> {
    Null,
    Bool(bool),
    Number(Number<'a>),
    String(Cow<'a, str>),
    Array(Vec<Json<'a>>),
    /// Sorted by key (bytewise), keys unique.
    Object(Vec<(Cow<'a, str>, Json<'a>)>),
}

/// An exact decimal: `(-1)^negative × digits × 10^exponent`.
///
/// Normalised: `digits` holds ASCII digits without leading or trailing
/// zeros; zero is empty digits, not negative, exponent 0. So two numbers
/// are equal in value exactly when their fields are equal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Number<'a> {
    negative: bool,
    digits: Cow<'a, [u8]>,
    exponent: i64,
}

impl Number<'_> {
    fn zero() -> Number<'static> {
        Number {
            negative: false,
            digits: Cow::Borrowed(&[]),
            exponent: 0,
        }
    }
}

/// Parses `body` strictly and writes it in canonical form.
pub(crate) fn canonicalize(body: &[u8]) -> Result<Vec<u8>, JsonError> {
    let value = parse(body)?;
    let mut out = Vec::with_capacity(body.len());
    value.write_canonical(&mut out);
    Ok(out)
}

/// Parses `body` strictly and writes, in canonical form, the array of
/// `[pointer, value]` pairs for `pointers` (RFC 6901), in the order given;
/// a pointer that selects nothing selects `null`.
pub(crate) fn canonicalize_fields(body: &[u8], pointers: &[String]) -> Result<Vec<u8>, JsonError> {
    let value = parse(body)?;
    let mut out = Vec::new();
    out.push(b'[');
    for (i, pointer) in pointers.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'[');
        write_string(pointer, &mut out);
        out.push(b',');
        match value.pointer(pointer) {
            Some(selected) => selected.write_canonical(&mut out),
            None => out.extend_from_slice(b"null"),
        }
        out.push(b']');
    }
    out.push(b']');
    Ok(out)
}

/// The canonical form of a JSON body, or `None` when it is not JSON by the
/// rules of fingerprint version 2. Exposed for fuzzing and tests only.
#[doc(hidden)]
pub fn canonicalize_json(body: &[u8]) -> Option<Vec<u8>> {
    canonicalize(body).ok()
}

/// Parses one JSON text (surrounding whitespace allowed).
pub(crate) fn parse(body: &[u8]) -> Result<Json<'_>, JsonError> {
    let text = std::str::from_utf8(body).map_err(|_| JsonError::NotUtf8)?;
    Parser {
        text,
        s: body,
        pos: 0,
    }
    .document()
}

/// A container being parsed.
enum Frame<'a> {
    Array(Vec<Json<'a>>),
    /// Members so far, and the key of the member whose value comes next.
    Object(Vec<(Cow<'a, str>, Json<'a>)>, Cow<'a, str>),
}

struct Parser<'a> {
    /// The input, checked to be UTF-8; `s` is its bytes.
    text: &'a str,
    s: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, b: u8) -> Result<(), JsonError> {
        if self.eat(b) {
            Ok(())
        } else {
            Err(self.syntax())
        }
    }

    fn syntax(&self) -> JsonError {
        JsonError::Syntax(self.pos)
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn document(&mut self) -> Result<Json<'a>, JsonError> {
        let mut stack: Vec<Frame> = Vec::new();
        self.skip_ws();
        'value: loop {
            // Here a value starts.
            let mut value = match self.peek() {
                Some(open @ (b'[' | b'{')) => {
                    if stack.len() >= MAX_DEPTH {
                        return Err(JsonError::TooDeep);
                    }
                    self.pos += 1;
                    self.skip_ws();
                    if open == b'[' {
                        if self.eat(b']') {
                            Json::Array(Vec::new())
                        } else {
                            stack.push(Frame::Array(Vec::new()));
                            continue 'value;
                        }
                    } else if self.eat(b'}') {
                        Json::Object(Vec::new())
                    } else {
                        let key = self.member_key()?;
                        stack.push(Frame::Object(Vec::new(), key));
                        continue 'value;
                    }
                }
                _ => self.scalar()?,
            };
            // A value is complete: hand it to its container, closing
            // containers as long as their closing bracket follows.
            loop {
                self.skip_ws();
                let Some(frame) = stack.last_mut() else {
                    if self.pos == self.s.len() {
                        return Ok(value);
                    }
                    return Err(self.syntax());
                };
                match frame {
                    Frame::Array(items) => {
                        items.push(value);
                        if self.eat(b',') {
                            self.skip_ws();
                            continue 'value;
                        }
                        self.expect(b']')?;
                        let items = std::mem::take(items);
                        stack.pop();
                        value = Json::Array(items);
                    }
                    Frame::Object(members, key) => {
                        members.push((std::mem::take(key), value));
                        if self.eat(b',') {
                            self.skip_ws();
                            *key = self.member_key()?;
                            continue 'value;
                        }
                        self.expect(b'}')?;
                        let members = std::mem::take(members);
                        stack.pop();
                        value = object(members)?;
                    }
                }
            }
        }
    }

    /// `"key"` `:`, with the whitespace after each.
    fn member_key(&mut self) -> Result<Cow<'a, str>, JsonError> {
        if self.peek() != Some(b'"') {
            return Err(self.syntax());
        }
        let key = self.string()?;
        self.skip_ws();
        self.expect(b':')?;
        self.skip_ws();
        Ok(key)
    }

    fn scalar(&mut self) -> Result<Json<'a>, JsonError> {
        let rest = self.s.get(self.pos..).unwrap_or_default();
        for (word, value) in [
            (&b"null"[..], Json::Null),
            (b"true", Json::Bool(true)),
            (b"false", Json::Bool(false)),
        ] {
            if rest.starts_with(word) {
                self.pos += word.len();
                return Ok(value);
            }
        }
        match self.peek() {
            Some(b'"') => self.string().map(Json::String),
            Some(b'-' | b'0'..=b'9') => self.number().map(Json::Number),
            _ => Err(self.syntax()),
        }
    }

    /// Skips a run of ASCII digits; returns where it started.
    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        start
    }

    fn number(&mut self) -> Result<Number<'a>, JsonError> {
        let negative = self.eat(b'-');
        // The integer part's digits: none for a lone zero.
        let integer = match self.peek() {
            // A lone leading zero; a digit after it is left for the caller
            // to reject.
            Some(b'0') => {
                self.pos += 1;
                self.pos..self.pos
            }
            Some(b'1'..=b'9') => self.digits()..self.pos,
            _ => return Err(self.syntax()),
        };
        let mut fraction = self.pos..self.pos;
        if self.eat(b'.') {
            fraction = self.digits()..self.pos;
            if fraction.is_empty() {
                return Err(self.syntax());
            }
        }
        let mut exponent: i64 = 0;
        if self.eat(b'e') || self.eat(b'E') {
            let exp_negative = if self.eat(b'-') {
                true
            } else {
                self.eat(b'+');
                false
            };
            // Accumulated with its sign, so that i64::MIN is reachable.
            let mut any = false;
            while let Some(d @ b'0'..=b'9') = self.peek() {
                let d = i64::from(d - b'0');
                exponent = exponent
                    .checked_mul(10)
                    .and_then(|e| {
                        if exp_negative {
                            e.checked_sub(d)
                        } else {
                            e.checked_add(d)
                        }
                    })
                    .ok_or(JsonError::ExponentOverflow)?;
                self.pos += 1;
                any = true;
            }
            if !any {
                return Err(self.syntax());
            }
        }
        // value = digits × 10^(exponent − fraction_len), where digits are
        // the integer part's followed by the fraction's: one run of the
        // input unless both parts have some.
        let part = |r: std::ops::Range<usize>| self.s.get(r).unwrap_or_default();
        let mut digits: Cow<'a, [u8]> = if integer.is_empty() {
            Cow::Borrowed(part(fraction.clone()))
        } else if fraction.is_empty() {
            Cow::Borrowed(part(integer))
        } else {
            Cow::Owned([part(integer), part(fraction.clone())].concat())
        };
        let fraction_len =
            i64::try_from(fraction.len()).map_err(|_| JsonError::ExponentOverflow)?;
        let mut exponent = exponent
            .checked_sub(fraction_len)
            .ok_or(JsonError::ExponentOverflow)?;
        let leading = digits.iter().take_while(|&&d| d == b'0').count();
        let trailing = digits
            .iter()
            .skip(leading)
            .rev()
            .take_while(|&&d| d == b'0')
            .count();
        let significant = leading..digits.len() - trailing;
        if significant.is_empty() {
            return Ok(Number::zero());
        }
        digits = match digits {
            Cow::Borrowed(d) => Cow::Borrowed(d.get(significant).unwrap_or_default()),
            Cow::Owned(mut d) => {
                d.truncate(significant.end);
                d.drain(..significant.start);
                Cow::Owned(d)
            }
        };
        let trailing = i64::try_from(trailing).map_err(|_| JsonError::ExponentOverflow)?;
        exponent = exponent
            .checked_add(trailing)
            .ok_or(JsonError::ExponentOverflow)?;
        Ok(Number {
            negative,
            digits,
            exponent,
        })
    }

    /// A string starting at the opening quote, escapes decoded: borrowed
    /// from the input when it has none.
    fn string(&mut self) -> Result<Cow<'a, str>, JsonError> {
        self.expect(b'"')?;
        let mut out: Option<Vec<u8>> = None;
        loop {
            let start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            // The input is UTF-8 and it is cut at ASCII bytes only.
            let run = self.text.get(start..self.pos).ok_or(JsonError::NotUtf8)?;
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return match out {
                        None => Ok(Cow::Borrowed(run)),
                        Some(mut out) => {
                            out.extend_from_slice(run.as_bytes());
                            String::from_utf8(out)
                                .map(Cow::Owned)
                                .map_err(|_| JsonError::NotUtf8)
                        }
                    };
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let out = out.get_or_insert_with(Vec::new);
                    out.extend_from_slice(run.as_bytes());
                    self.escape(out)?;
                }
                // End of input, or an unescaped control character.
                _ => return Err(self.syntax()),
            }
        }
    }

    /// One escape, after its backslash.
    fn escape(&mut self, out: &mut Vec<u8>) -> Result<(), JsonError> {
        let Some(b) = self.peek() else {
            return Err(self.syntax());
        };
        self.pos += 1;
        let simple = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let unit = self.hex4()?;
                let code = match unit {
                    0xD800..=0xDBFF => {
                        if !(self.eat(b'\\') && self.eat(b'u')) {
                            return Err(JsonError::LoneSurrogate);
                        }
                        let low = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return Err(JsonError::LoneSurrogate);
                        }
                        0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                    }
                    0xDC00..=0xDFFF => return Err(JsonError::LoneSurrogate),
                    _ => unit,
                };
                let c = char::from_u32(code).ok_or(JsonError::LoneSurrogate)?;
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                return Ok(());
            }
            _ => return Err(JsonError::Syntax(self.pos - 1)),
        };
        out.push(simple);
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let mut unit = 0u32;
        for _ in 0..4 {
            let digit = match self.peek() {
                Some(d @ b'0'..=b'9') => d - b'0',
                Some(d @ b'a'..=b'f') => d - b'a' + 10,
                Some(d @ b'A'..=b'F') => d - b'A' + 10,
                _ => return Err(self.syntax()),
            };
            unit = unit * 16 + u32::from(digit);
            self.pos += 1;
        }
        Ok(unit)
    }
}

/// An object from its members in source order: sorted, duplicates refused.
fn object<'a>(mut members: Vec<(Cow<'a, str>, Json<'a>)>) -> Result<Json<'a>, JsonError> {
    members.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    if members.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(JsonError::DuplicateKey);
    }
    Ok(Json::Object(members))
}

impl<'a> Json<'a> {
    /// The value `pointer` (RFC 6901) selects, if any. `""` is the whole
    /// value; a pointer that does not start with `/`, has an escape other
    /// than `~0` and `~1`, or an array index that is not a plain decimal
    /// (no sign, no leading zero; `-` included) selects nothing.
    pub(crate) fn pointer(&self, pointer: &str) -> Option<&Json<'a>> {
        if pointer.is_empty() {
            return Some(self);
        }
        let mut current = self;
        for raw in pointer.strip_prefix('/')?.split('/') {
            let token = unescape_token(raw)?;
            current = match current {
                Json::Object(members) => {
                    let i = members.binary_search_by(|(k, _)| (**k).cmp(&*token)).ok()?;
                    &members.get(i)?.1
                }
                Json::Array(items) => items.get(array_index(&token)?)?,
                _ => return None,
            };
        }
        Some(current)
    }

    /// Appends the canonical form. Recursion is bounded by the depth the
    /// parser accepts (plus the two levels of a field selection).
    fn write_canonical(&self, out: &mut Vec<u8>) {
        match self {
            Json::Null => out.extend_from_slice(b"null"),
            Json::Bool(true) => out.extend_from_slice(b"true"),
            Json::Bool(false) => out.extend_from_slice(b"false"),
            Json::Number(n) => write_number(n, out),
            Json::String(s) => write_string(s, out),
            Json::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write_canonical(out);
                }
                out.push(b']');
            }
            Json::Object(members) => {
                out.push(b'{');
                for (i, (key, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_string(key, out);
                    out.push(b':');
                    value.write_canonical(out);
                }
                out.push(b'}');
            }
        }
    }
}

fn unescape_token(raw: &str) -> Option<Cow<'_, str>> {
    if !raw.contains('~') {
        return Some(Cow::Borrowed(raw));
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '~' {
            match chars.next() {
                Some('0') => out.push('~'),
                Some('1') => out.push('/'),
                _ => return None,
            }
        } else {
            out.push(c);
        }
    }
    Some(Cow::Owned(out))
}

fn array_index(token: &str) -> Option<usize> {
    let bytes = token.as_bytes();
    match bytes {
        [b'0'] => Some(0),
        [b'1'..=b'9', rest @ ..] if rest.iter().all(u8::is_ascii_digit) => token.parse().ok(),
        _ => None,
    }
}

fn write_number(n: &Number, out: &mut Vec<u8>) {
    if n.digits.is_empty() {
        out.push(b'0');
        return;
    }
    if n.negative {
        out.push(b'-');
    }
    out.extend_from_slice(&n.digits);
    if n.exponent == 0 {
        return;
    }
    let len = i64::try_from(n.digits.len()).unwrap_or(i64::MAX);
    if n.exponent > 0 && len.saturating_add(n.exponent) <= MAX_PLAIN_DIGITS {
        for _ in 0..n.exponent {
            out.push(b'0');
        }
    } else {
        out.push(b'e');
        out.extend_from_slice(n.exponent.to_string().as_bytes());
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut plain = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0c => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x00..=0x1f => &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ],
            _ => continue,
        };
        out.extend_from_slice(bytes.get(plain..i).unwrap_or_default());
        out.extend_from_slice(escaped);
        plain = i + 1;
    }
    out.extend_from_slice(bytes.get(plain..).unwrap_or_default());
    out.push(b'"');
}

#[cfg(test)]
mod tests;
