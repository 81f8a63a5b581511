//! The hash that binds a key to the request it was first used with.
//!
//! A retry must carry the same parameters as the first attempt; a client
//! that reuses a key for a different request has a bug, and replaying the
//! first answer to it would hide that bug. The fingerprint is SHA-256 over
//! the operation and the body. JSON bodies are canonicalized first (RFC 8785:
//! sorted keys, no insignificant whitespace, one spelling per number), so a
//! client library that reorders fields between attempts is not punished.
//! A route may hash only selected fields (JSON pointers), for bodies that
//! carry a timestamp or trace id that changes on every attempt.
//!
//! A body whose content type says JSON but which does not parse is hashed
//! as bytes: the handler will refuse it anyway, and the fingerprint stays
//! deterministic.

use std::fmt;

use serde_json::Value;

use crate::digest::sha256_parts;
use crate::scope::Operation;

/// SHA-256 of an operation and its parameters.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// Which parts of a JSON body the fingerprint covers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FieldSelection {
    /// The whole body. The default.
    #[default]
    Whole,
    /// Only these JSON pointers (RFC 6901, such as `/amount` or
    /// `/payee/iban`); a pointer that matches nothing counts as `null`.
    /// Non-JSON bodies are still hashed whole.
    Fields(Vec<String>),
}

impl Fingerprint {
    /// Computes the fingerprint of a request.
    ///
    /// `content_type` decides whether the body is treated as JSON
    /// (`application/json` and any `+json` type).
    pub fn compute(
        operation: &Operation,
        content_type: Option<&str>,
        body: &[u8],
        fields: &FieldSelection,
    ) -> Fingerprint {
        let op = operation.as_str().as_bytes();
        if content_type.is_some_and(is_json_media_type)
            && let Ok(value) = serde_json::from_slice::<Value>(body)
        {
            let selected = match fields {
                FieldSelection::Whole => value,
                FieldSelection::Fields(pointers) => Value::Array(
                    pointers
                        .iter()
                        .map(|p| {
                            Value::Array(vec![
                                Value::String(p.clone()),
                                value.pointer(p).cloned().unwrap_or(Value::Null),
                            ])
                        })
                        .collect(),
                ),
            };
            if let Ok(canonical) = serde_json_canonicalizer::to_vec(&selected) {
                return Fingerprint(sha256_parts("idem-fp-json", &[op, &canonical]));
            }
        }
        Fingerprint(sha256_parts("idem-fp-bytes", &[op, body]))
    }

    /// A fingerprint from its 32 stored bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Fingerprint {
        Fingerprint(bytes)
    }

    /// A fingerprint from a stored byte slice; `None` unless it is 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Fingerprint> {
        bytes.try_into().ok().map(Fingerprint)
    }

    /// The 32 bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..12])
    }
}

fn is_json_media_type(content_type: &str) -> bool {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: Option<&str> = Some("application/json; charset=utf-8");

    fn fp(ct: Option<&str>, body: &str) -> Fingerprint {
        Fingerprint::compute(
            &Operation::new("POST", "/transfers"),
            ct,
            body.as_bytes(),
            &FieldSelection::Whole,
        )
    }

    #[test]
    fn json_key_order_and_whitespace_do_not_matter() {
        let a = fp(
            JSON,
            r#"{"amount": 100, "to": "b", "from": "a", "meta": {"y": 1, "x": [1, 2]}}"#,
        );
        let b = fp(
            JSON,
            r#"{"from":"a","meta":{"x":[1,2],"y":1},"to":"b","amount":100}"#,
        );
        assert_eq!(a, b);
        assert_eq!(
            a,
            fp(
                Some("application/merge-patch+json"),
                r#"{"from":"a","meta":{"x":[1,2],"y":1},"to":"b","amount":100}"#
            )
        );
    }

    #[test]
    fn json_values_and_array_order_do_matter() {
        let a = fp(JSON, r#"{"amount": 100, "to": "b"}"#);
        assert_ne!(a, fp(JSON, r#"{"amount": 101, "to": "b"}"#));
        assert_ne!(fp(JSON, "[1,2]"), fp(JSON, "[2,1]"));
    }

    #[test]
    fn number_spellings_are_canonical() {
        assert_eq!(fp(JSON, r#"{"a": 1.0e2}"#), fp(JSON, r#"{"a": 100}"#));
    }

    #[test]
    fn other_bodies_are_bytes_and_operation_counts() {
        assert_ne!(fp(None, r#"{"a":1,"b":2}"#), fp(None, r#"{"b":2,"a":1}"#));
        assert_ne!(fp(JSON, r#"{"a":1}"#), fp(None, r#"{"a":1}"#));
        let other_op = Fingerprint::compute(
            &Operation::new("POST", "/refunds"),
            JSON,
            br#"{"a":1}"#,
            &FieldSelection::Whole,
        );
        assert_ne!(other_op, fp(JSON, r#"{"a":1}"#));
        // Broken JSON is hashed as bytes, deterministically.
        assert_eq!(fp(JSON, "{broken"), fp(JSON, "{broken"));
    }

    #[test]
    fn selected_fields_ignore_the_rest() {
        let sel = FieldSelection::Fields(vec!["/amount".into(), "/to/iban".into()]);
        let op = Operation::new("POST", "/t");
        let f = |b: &str| Fingerprint::compute(&op, JSON, b.as_bytes(), &sel);
        assert_eq!(
            f(r#"{"amount":5,"to":{"iban":"X"},"trace":"1"}"#),
            f(r#"{"trace":"2","to":{"iban":"X","name":"n"},"amount":5}"#)
        );
        assert_ne!(
            f(r#"{"amount":5,"to":{"iban":"X"}}"#),
            f(r#"{"amount":6,"to":{"iban":"X"}}"#)
        );
        // Missing and null are the same selection.
        assert_eq!(
            f(r#"{"amount":5}"#),
            f(r#"{"amount":5,"to":{"iban":null}}"#)
        );
    }

    /// If any crate in the graph turned on serde_json's `preserve_order`,
    /// maps would iterate in insertion order. Canonicalization must not
    /// depend on that, and this guard tells us if the graph changed.
    #[test]
    fn serde_json_maps_are_sorted_not_insertion_ordered() {
        let v: Value = serde_json::from_str(r#"{"b":1,"a":2,"c":3}"#).unwrap();
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["a", "b", "c"]);
    }
}
