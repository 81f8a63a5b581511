//! How an upstream answer is framed: whether it ends with its connection,
//! and the transfer codings it names.

use http::{HeaderMap, header};

/// Whether an answer with these headers ends when the upstream closes
/// the connection (RFC 9112 section 6.3): a transfer coding other than a
/// final `chunked`, or neither a coding nor a length. A cut there reads
/// the same as the end.
pub(super) fn ends_at_close(headers: &HeaderMap) -> bool {
    let mut codings = headers.get_all(header::TRANSFER_ENCODING).iter().peekable();
    if codings.peek().is_none() {
        return !headers.contains_key(header::CONTENT_LENGTH);
    }
    let last = codings
        .last()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit(',').next())
        .map(str::trim);
    !last.is_some_and(|c| c.eq_ignore_ascii_case("chunked"))
}

/// The elements the `name` lines of a message list, in order, each
/// trimmed; empty list elements left out (RFC 9110 section 5.6.1).
fn list_elements(headers: &HeaderMap, name: header::HeaderName) -> impl Iterator<Item = &[u8]> {
    headers
        .get_all(name)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty())
}

/// The transfer codings a message's `Transfer-Encoding` lines list.
pub(crate) fn transfer_codings(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    list_elements(headers, header::TRANSFER_ENCODING)
}

/// Whether a request's `TE` lists `trailers` (parameters aside).
pub(super) fn wants_trailers(headers: &HeaderMap) -> bool {
    list_elements(headers, header::TE)
        .map(|t| t.split(|b| *b == b';').next().unwrap_or(t).trim_ascii())
        .any(|t| t.eq_ignore_ascii_case(b"trailers"))
}

/// A transfer coding of an answer other than `chunked` (which hyper
/// decodes) and `identity` (which codes nothing), if it has one.
pub(super) fn unknown_coding(headers: &HeaderMap) -> Option<String> {
    transfer_codings(headers)
        .find(|c| !c.eq_ignore_ascii_case(b"chunked") && !c.eq_ignore_ascii_case(b"identity"))
        .map(|c| String::from_utf8_lossy(c).into_owned())
}
