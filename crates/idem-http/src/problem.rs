//! RFC 9457 problem documents: the one shape of every error answer idem
//! gives, from the layer, the gateway, or a service built on them.

use std::borrow::Cow;
use std::time::Duration;

use http::{HeaderValue, Response, StatusCode, header};
use idem_core::StoredResponse;

use crate::body::{Body, full};

/// The media type of a problem document.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An `application/problem+json` answer: status, type URI, title, detail,
/// and an optional `Retry-After`.
///
/// idem's own problem types are URNs, `urn:idem:problem:<kind>`
/// ([`Problem::idem`]): stable identifiers that need no web page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    status: StatusCode,
    type_uri: Cow<'static, str>,
    title: Cow<'static, str>,
    detail: String,
    retry_after: Option<Duration>,
}

impl Problem {
    /// A problem of any type.
    pub fn new(
        status: StatusCode,
        type_uri: impl Into<Cow<'static, str>>,
        title: impl Into<Cow<'static, str>>,
        detail: impl Into<String>,
    ) -> Problem {
        Problem {
            status,
            type_uri: type_uri.into(),
            title: title.into(),
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// One of idem's own problems: type `urn:idem:problem:<kind>`.
    pub fn idem(
        status: StatusCode,
        kind: &str,
        title: impl Into<Cow<'static, str>>,
        detail: impl Into<String>,
    ) -> Problem {
        Problem::new(status, format!("urn:idem:problem:{kind}"), title, detail)
    }

    /// Adds `Retry-After` (whole seconds, at least 1).
    pub fn with_retry_after(mut self, after: Duration) -> Problem {
        self.retry_after = Some(after);
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The problem type URI.
    pub fn type_uri(&self) -> &str {
        &self.type_uri
    }

    /// The title.
    pub fn title(&self) -> &str {
        &self.title
    }

    /// The detail.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The `Retry-After` it carries, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The problem a document of [`Problem::to_json`]'s shape describes,
    /// answered with `status`; `None` for anything else (its `type`,
    /// `title` and `detail` must be strings).
    pub fn from_json(status: StatusCode, json: &[u8]) -> Option<Problem> {
        let doc: serde_json::Value = serde_json::from_slice(json).ok()?;
        let text = |name: &str| doc.get(name)?.as_str().map(str::to_owned);
        Some(Problem::new(
            status,
            text("type")?,
            text("title")?,
            text("detail")?,
        ))
    }

    /// The JSON document.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::json!({
            "type": self.type_uri,
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        })
        .to_string()
        .into_bytes()
    }

    /// As a response to store and replay (its `Retry-After` is left out:
    /// a replay's wait would be stale).
    pub fn to_stored(&self) -> StoredResponse {
        StoredResponse {
            status: self.status.as_u16(),
            headers: vec![(
                header::CONTENT_TYPE.as_str().to_owned(),
                PROBLEM_JSON.as_bytes().to_vec(),
            )],
            body: self.to_json(),
            trailers: Vec::new(),
        }
    }

    /// The HTTP response.
    pub fn into_response(self) -> Response<Body> {
        let mut response = Response::new(full(self.to_json()));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(after) = self.retry_after {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(after.as_secs().max(1)),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_is_rfc_9457_json() {
        let p = Problem::idem(StatusCode::CONFLICT, "in-flight", "Busy", "later")
            .with_retry_after(Duration::from_millis(200));
        let r = p.clone().into_response();
        assert_eq!(r.status(), 409);
        assert_eq!(r.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let v: serde_json::Value = serde_json::from_slice(&p.to_json()).unwrap();
        assert_eq!(v["type"], "urn:idem:problem:in-flight");
        assert_eq!(v["status"], 409);
        assert_eq!(v["title"], "Busy");
        assert_eq!(v["detail"], "later");
        assert_eq!(p.to_stored().status, 409);
    }
}
