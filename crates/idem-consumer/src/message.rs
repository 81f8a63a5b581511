//! A message as the consumer sees it, whatever broker delivered it, and
//! where its idempotency key comes from.

use bytes::Bytes;
use idem_core::{Key, KeyError};

/// One delivered message, broker-neutral. The adapters build it from a
/// NATS or AMQP delivery; tests build it directly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    /// The id the producer gave the message, if any: JetStream's
    /// `Nats-Msg-Id` header, AMQP's `message-id` property. Not the
    /// broker's delivery sequence, which differs between two publishes of
    /// the same intent.
    pub id: Option<String>,
    /// Headers, names as the broker gave them.
    pub headers: Vec<(String, String)>,
    /// The content type, if the producer set one (`application/json`
    /// makes the fingerprint compare JSON values, not bytes).
    pub content_type: Option<String>,
    /// The payload.
    pub payload: Bytes,
}

impl Message {
    /// A message with a payload and nothing else.
    pub fn new(payload: impl Into<Bytes>) -> Message {
        Message {
            payload: payload.into(),
            ..Message::default()
        }
    }

    /// Sets the producer's message id.
    #[must_use]
    pub fn with_id(mut self, id: impl Into<String>) -> Message {
        self.id = Some(id.into());
        self
    }

    /// Adds a header.
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Message {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets the content type.
    #[must_use]
    pub fn with_content_type(mut self, content_type: impl Into<String>) -> Message {
        self.content_type = Some(content_type.into());
        self
    }

    /// The values of header `name` (compared without regard to case).
    fn header(&self, name: &str) -> impl Iterator<Item = &str> {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Where a message's idempotency key comes from, chosen by the caller. The
/// key must name the producer's intent: two publishes of one intent must
/// carry the same key, two intents different ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The producer's message id ([`Message::id`]).
    MessageId,
    /// A header, present exactly once.
    Header(String),
    /// A field of the JSON payload, by JSON pointer (RFC 6901), such as
    /// `/transfer_id`: a string, or an integer (its decimal digits).
    JsonPointer(String),
}

/// Why no key could be taken from a message. Such a message cannot be
/// deduplicated, so it is never applied: the adapters reject it (to the
/// dead-letter queue, where the broker has one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MissingKey {
    /// The message has no producer id.
    #[error("the message has no message id")]
    NoMessageId,
    /// The header is missing.
    #[error("the message has no {0:?} header")]
    NoHeader(String),
    /// The header is there more than once: which one names the intent?
    #[error("the message has the {0:?} header more than once")]
    RepeatedHeader(String),
    /// The payload is not JSON.
    #[error("the payload is not JSON, so {0:?} cannot be read")]
    NotJson(String),
    /// The pointer names nothing, or a value that is not a string or an
    /// integer.
    #[error("the payload has no string or integer at {0:?}")]
    NoField(String),
    /// The value is not a valid key (empty, too long, or a character
    /// outside printable ASCII).
    #[error("the message's key is not valid: {0}")]
    Invalid(#[from] KeyError),
}

impl KeySource {
    /// The key of `message`.
    ///
    /// # Errors
    /// [`MissingKey`] saying what is missing or wrong.
    pub fn key_of(&self, message: &Message) -> Result<Key, MissingKey> {
        let raw = match self {
            KeySource::MessageId => message.id.clone().ok_or(MissingKey::NoMessageId)?,
            KeySource::Header(name) => {
                let mut values = message.header(name);
                let first = values
                    .next()
                    .ok_or_else(|| MissingKey::NoHeader(name.clone()))?;
                if values.next().is_some() {
                    return Err(MissingKey::RepeatedHeader(name.clone()));
                }
                first.to_owned()
            }
            KeySource::JsonPointer(pointer) => {
                // The fingerprint's strict reading first: a payload it does
                // not call JSON (a duplicate object key, say, which parsers
                // read differently) has no key either.
                if idem_core::canonicalize_json(&message.payload).is_none() {
                    return Err(MissingKey::NotJson(pointer.clone()));
                }
                let value: serde_json::Value = serde_json::from_slice(&message.payload)
                    .map_err(|_| MissingKey::NotJson(pointer.clone()))?;
                match value.pointer(pointer) {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
                    _ => return Err(MissingKey::NoField(pointer.clone())),
                }
            }
        };
        Ok(Key::new(raw)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_from_where_the_caller_says() {
        let m = Message::new(r#"{"transfer": {"id": "t-1"}, "n": 42, "f": 1.5, "b": true}"#)
            .with_id("msg-1")
            .with_header("Transfer-Id", "h-1");
        let key = |s: KeySource| s.key_of(&m).map(|k| k.as_str().to_owned());
        assert_eq!(key(KeySource::MessageId), Ok("msg-1".into()));
        assert_eq!(
            key(KeySource::Header("transfer-id".into())),
            Ok("h-1".into())
        );
        assert_eq!(
            key(KeySource::JsonPointer("/transfer/id".into())),
            Ok("t-1".into())
        );
        assert_eq!(key(KeySource::JsonPointer("/n".into())), Ok("42".into()));
        for missing in ["/f", "/b", "/nothing", "transfer"] {
            assert!(matches!(
                key(KeySource::JsonPointer(missing.into())),
                Err(MissingKey::NoField(_))
            ));
        }
        assert_eq!(
            key(KeySource::Header("x".into())),
            Err(MissingKey::NoHeader("x".into()))
        );
        let twice = m.clone().with_header("transfer-id", "h-2");
        assert_eq!(
            KeySource::Header("Transfer-Id".into()).key_of(&twice),
            Err(MissingKey::RepeatedHeader("Transfer-Id".into()))
        );
        assert_eq!(
            KeySource::MessageId.key_of(&Message::new("x")),
            Err(MissingKey::NoMessageId)
        );
        assert!(matches!(
            KeySource::JsonPointer("/a".into()).key_of(&Message::new("not json")),
            Err(MissingKey::NotJson(_))
        ));
        for bad in ["", "caf\u{e9}", "a\nb"] {
            assert!(matches!(
                KeySource::MessageId.key_of(&Message::new("x").with_id(bad)),
                Err(MissingKey::Invalid(_))
            ));
        }
    }
}
