//! How the probe tells that a request executed: a resource id at a JSON
//! pointer in the answer (`--id-pointer`), the `Location` header, or a
//! count read before and after (`--effect-url` + `--effect-pointer`).
//! Where none of them can tell, the outcome is [`Outcome::Unknown`]: the
//! check then says "could not tell", never guesses.

/// How executions are told apart.
#[derive(Clone, Default)]
pub struct Detection {
    /// A JSON pointer to a resource id in a successful answer.
    pub id_pointer: Option<String>,
    /// A URL (GET) whose answer holds a count of executions.
    pub effect_url: Option<url::Url>,
    /// The JSON pointer to that count (empty: the whole body is the number).
    pub effect_pointer: String,
}

impl std::fmt::Debug for Detection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The effect URL's secret query values are not shown.
        f.debug_struct("Detection")
            .field("id_pointer", &self.id_pointer)
            .field(
                "effect_url",
                &self.effect_url.as_ref().map(crate::target::redacted_url),
            )
            .field("effect_pointer", &self.effect_pointer)
            .finish()
    }
}

/// One answer, reduced to what the checks compare.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// `Content-Type`, if any.
    pub content_type: Option<String>,
    /// `Location`, if any.
    pub location: Option<String>,
    /// `Retry-After`, if any.
    pub retry_after: Option<String>,
    /// `Idempotent-Replayed`, if any.
    pub replayed: Option<String>,
    /// `Idempotency-Key-Expires`, if any (`Expires` is a cache header and
    /// says nothing of the key).
    pub expires: Option<String>,
    /// The body as text (lossy), whole.
    pub body: String,
    /// The resource id, from `--id-pointer` or else `Location`.
    pub id: Option<String>,
}

impl Answer {
    /// 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// A 4xx other than 408 and 429: the request was refused.
    pub fn is_refusal(&self) -> bool {
        (400..500).contains(&self.status) && !matches!(self.status, 408 | 429)
    }

    /// 401 or 403: refused by authentication or authorisation, which
    /// says nothing of how the key was handled (an expired credential
    /// would otherwise pass the checks that expect a refusal).
    pub fn is_auth_refusal(&self) -> bool {
        matches!(self.status, 401 | 403)
    }

    /// Marked as a replay by `Idempotent-Replayed: true` (or `?1`).
    pub fn marked_replay(&self) -> bool {
        self.replayed
            .as_deref()
            .is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "?1" | "1"))
    }

    /// Same status, body, `Location` and content type.
    pub fn same_as(&self, other: &Answer) -> bool {
        self.status == other.status
            && self.body == other.body
            && self.location == other.location
            && self.content_type == other.content_type
    }
}

/// What the checks that read the whole run keep of each answer: no body
/// (a run keeps one of these per request, whatever the answers' size).
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) status: u16,
    pub(crate) content_type: Option<String>,
    pub(crate) expires: Option<String>,
    /// An RFC 9457 problem: `application/problem+json` with `type`,
    /// `title` and the answer's `status`.
    pub(crate) problem: bool,
}

impl Seen {
    pub(crate) fn of(a: &Answer) -> Seen {
        Seen {
            status: a.status,
            content_type: a.content_type.clone(),
            expires: a.expires.clone(),
            problem: is_problem(a.content_type.as_deref(), &a.body, a.status),
        }
    }
}

fn is_problem(content_type: Option<&str>, body: &str, status: u16) -> bool {
    let media = content_type
        .and_then(|c| c.split(';').next())
        .map(|c| c.trim().to_ascii_lowercase());
    if media.as_deref() != Some("application/problem+json") {
        return false;
    }
    let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
        return false;
    };
    v.get("type").is_some_and(serde_json::Value::is_string)
        && v.get("title").is_some_and(serde_json::Value::is_string)
        && v.get("status").and_then(serde_json::Value::as_u64) == Some(u64::from(status))
}

/// The id at `pointer` in a JSON body, as text.
pub(crate) fn id_at(body: &str, pointer: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    match value.pointer(pointer)? {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// A count at `pointer` in a JSON body.
pub(crate) fn count_at(body: &str, pointer: &str) -> Option<i64> {
    let value: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
    let v = value.pointer(pointer)?;
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
}

/// What a second request with the same key did, relative to the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Refused with a 4xx: nothing ran, nothing replayed.
    Rejected,
    /// Answered from the first request: no new execution.
    Replayed,
    /// Executed on its own.
    Separate,
    /// Nothing available tells which.
    Unknown,
}

/// Judges `second` against a successful `first`; `delta` is the change of
/// the effect count across `second`, when one is read.
pub(crate) fn judge(first: &Answer, second: &Answer, delta: Option<i64>) -> Outcome {
    if second.is_auth_refusal() {
        return Outcome::Unknown;
    }
    if second.is_refusal() {
        return Outcome::Rejected;
    }
    if !second.is_success() {
        return Outcome::Unknown;
    }
    let ids = first.id.as_ref().zip(second.id.as_ref());
    if let Some(d) = delta {
        let by_count = match d {
            1.. => Outcome::Separate,
            0 => Outcome::Replayed,
            // The count went down: other traffic moved it; nothing told.
            _ => return Outcome::Unknown,
        };
        // A count that lags (a cache, a replica, an asynchronous worker)
        // must not overrule ids that say otherwise: nothing is told.
        return match ids {
            Some((a, b)) if (a == b) != (by_count == Outcome::Replayed) => Outcome::Unknown,
            _ => by_count,
        };
    }
    if let Some((a, b)) = ids {
        return if a == b {
            Outcome::Replayed
        } else {
            Outcome::Separate
        };
    }
    // The marker tells only where the first answer lacks it: an API that
    // marks every answer says nothing by it.
    if second.marked_replay() && !first.marked_replay() {
        return Outcome::Replayed;
    }
    Outcome::Unknown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, id: Option<&str>) -> Answer {
        Answer {
            status,
            content_type: None,
            location: None,
            retry_after: None,
            replayed: None,
            expires: None,
            body: String::new(),
            id: id.map(str::to_owned),
        }
    }

    #[test]
    fn outcomes() {
        let a = answer(201, Some("1"));
        assert_eq!(judge(&a, &answer(422, None), None), Outcome::Rejected);
        // An authentication refusal says nothing of the key.
        assert_eq!(judge(&a, &answer(401, None), None), Outcome::Unknown);
        assert_eq!(judge(&a, &answer(403, None), None), Outcome::Unknown);
        // A count that went down: other traffic, nothing told.
        assert_eq!(judge(&a, &answer(201, None), Some(-1)), Outcome::Unknown);
        assert_eq!(judge(&a, &answer(201, Some("1")), None), Outcome::Replayed);
        assert_eq!(judge(&a, &answer(201, Some("2")), None), Outcome::Separate);
        assert_eq!(judge(&a, &answer(201, None), None), Outcome::Unknown);
        assert_eq!(judge(&a, &answer(201, None), Some(1)), Outcome::Separate);
        // A count and ids that disagree tell nothing.
        assert_eq!(
            judge(&a, &answer(201, Some("2")), Some(0)),
            Outcome::Unknown
        );
        assert_eq!(
            judge(&a, &answer(201, Some("1")), Some(1)),
            Outcome::Unknown
        );
        assert_eq!(
            judge(&a, &answer(201, Some("1")), Some(0)),
            Outcome::Replayed
        );
        assert_eq!(judge(&a, &answer(500, None), Some(0)), Outcome::Unknown);
        assert_eq!(id_at(r#"{"a":{"id":7}}"#, "/a/id").as_deref(), Some("7"));
        assert_eq!(count_at("12", ""), Some(12));
    }
}
