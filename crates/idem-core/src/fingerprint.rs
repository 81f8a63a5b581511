//! The hash that binds a key to the request it was first used with.
//!
//! A retry must carry the same parameters as the first attempt; a client
//! that reuses a key for a different request has a bug, and replaying the
//! first answer to it would hide that bug. A route may hash only selected
//! fields (JSON pointers), for bodies that carry a timestamp or trace id
//! that changes on every attempt.
//!
//! # Version 2 (current)
//!
//! SHA-256 over a domain tag and, each prefixed by its length so that no
//! bytes can shift from one part to the next, the operation (method and
//! route), the request target (the path and `?query` exactly as received),
//! the media type of the body (without parameters), the kind of body hash,
//! and the body:
//!
//! - the target is bound because a route template such as
//!   `/accounts/{id}/transfers` names the operation, not the account: the
//!   same key and body sent to `/accounts/7/...` and `/accounts/8/...` are
//!   two requests, and so are `?to=alice` and `?to=mallory`;
//! - JSON bodies (`application/json` and any `+json` type) are parsed
//!   strictly and canonicalized by our own code (sorted keys, no
//!   whitespace, one spelling per string and per number). Numbers are kept
//!   exactly: `100`, `1.0e2` and `10000e-2` match, `9007199254740993` and
//!   `9007199254740992` do not (version 1 rounded them through a double).
//!   Duplicate keys, lone surrogates, nesting deeper than 128 and exponents
//!   beyond 64 bits make a body "not JSON";
//! - other bodies, and JSON-typed bodies that are not JSON, are hashed as
//!   bytes: the handler will refuse a broken body anyway, and the
//!   fingerprint stays deterministic.
//!
//! # Storage form and version 1
//!
//! [`Fingerprint::as_bytes`] is what stores keep: version 1 is the 32 hash
//! bytes, version 2 is the byte `0x02` followed by the 32 hash bytes.
//! [`Fingerprint::from_slice`] reads either back, so records written before
//! the upgrade stay readable. They no longer compare equal to a new request's
//! fingerprint, so a store answers `Mismatch`; the HTTP layer then reads the
//! record and, when its fingerprint is version 1 and equals
//! [`Fingerprint::compute_v1`] of the request, treats the request as a retry
//! with the same parameters. A change of algorithm thus never turns a
//! pending retry into a 422.
//!
//! Version 1 is SHA-256 over the operation and the body, with JSON
//! canonicalized by RFC 8785 (numbers rounded to doubles); it does not bind
//! the path or the query.

use std::fmt;

use serde_json::Value;

use crate::canonical_json;
use crate::digest::sha256_parts;
use crate::scope::Operation;

/// A versioned SHA-256 of an operation and its parameters.
///
/// Two fingerprints are equal when their versions and hashes are; a version
/// 1 fingerprint never equals a version 2 one.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(
    /// `[0]` is the version (1 or 2), `[1..]` the hash. For version 2 this
    /// is also the storage form, as the tag of version 2 is its number.
    [u8; 33],
);

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
    /// The legacy algorithm, see [`Fingerprint::compute_v1`].
    pub const VERSION_1: u8 = 1;
    /// The current algorithm, see [`Fingerprint::compute_request`].
    pub const VERSION_2: u8 = 2;

    /// The current-version fingerprint of a request whose target is not
    /// known: [`Fingerprint::compute_request`] with an empty target.
    ///
    /// `content_type` decides whether the body is treated as JSON
    /// (`application/json` and any `+json` type).
    pub fn compute(
        operation: &Operation,
        content_type: Option<&str>,
        body: &[u8],
        fields: &FieldSelection,
    ) -> Fingerprint {
        Fingerprint::compute_request(operation, "", content_type, body, fields)
    }

    /// The current-version (2) fingerprint of a request.
    ///
    /// `target` is the request's path plus `?query` exactly as received,
    /// such as `/accounts/7/transfers?to=alice`. `content_type` decides
    /// whether the body is treated as JSON (`application/json` and any
    /// `+json` type).
    pub fn compute_request(
        operation: &Operation,
        target: &str,
        content_type: Option<&str>,
        body: &[u8],
        fields: &FieldSelection,
    ) -> Fingerprint {
        // The media type selects how the body is read (a JSON Patch and a
        // merge patch with the same bytes are two requests); its parameters
        // (charset) do not.
        let media = media_type(content_type.unwrap_or(""));
        let canonical = if is_json(&media) {
            match fields {
                FieldSelection::Whole => canonical_json::canonicalize(body)
                    .ok()
                    .map(|c| (&b"json"[..], c)),
                FieldSelection::Fields(pointers) => {
                    canonical_json::canonicalize_fields(body, pointers)
                        .ok()
                        .map(|c| (&b"json-fields"[..], c))
                }
            }
        } else {
            None
        };
        let (kind, hashed): (&[u8], &[u8]) = match &canonical {
            Some((kind, c)) => (kind, c),
            None => (b"bytes", body),
        };
        let hash = sha256_parts(
            "idem-fp-v2",
            &[
                operation.as_str().as_bytes(),
                target.as_bytes(),
                media.as_bytes(),
                kind,
                hashed,
            ],
        );
        Fingerprint::with_version(Fingerprint::VERSION_2, hash)
    }

    /// The version 1 fingerprint of a request, to compare with records
    /// written before version 2: SHA-256 over the operation and the body
    /// (JSON canonicalized by RFC 8785, numbers rounded to doubles). It does
    /// not bind the path or query; never store it for new records.
    pub fn compute_v1(
        operation: &Operation,
        content_type: Option<&str>,
        body: &[u8],
        fields: &FieldSelection,
    ) -> Fingerprint {
        let op = operation.as_str().as_bytes();
        if content_type.is_some_and(|ct| is_json(&media_type(ct)))
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
                return Fingerprint::from_bytes(sha256_parts("idem-fp-json", &[op, &canonical]));
            }
        }
        Fingerprint::from_bytes(sha256_parts("idem-fp-bytes", &[op, body]))
    }

    const fn with_version(version: u8, hash: [u8; 32]) -> Fingerprint {
        let mut bytes = [0u8; 33];
        bytes[0] = version;
        let mut i = 0;
        while i < 32 {
            bytes[i + 1] = hash[i];
            i += 1;
        }
        Fingerprint(bytes)
    }

    /// A version 1 fingerprint from its 32 stored bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Fingerprint {
        Fingerprint::with_version(Fingerprint::VERSION_1, bytes)
    }

    /// A fingerprint from its storage form: 32 bytes are version 1, 33
    /// bytes starting with `0x02` are version 2; anything else is `None`.
    pub fn from_slice(bytes: &[u8]) -> Option<Fingerprint> {
        if let Ok(hash) = <[u8; 32]>::try_from(bytes) {
            return Some(Fingerprint::from_bytes(hash));
        }
        match bytes.split_first() {
            Some((&Fingerprint::VERSION_2, hash)) => <[u8; 32]>::try_from(hash)
                .ok()
                .map(|h| Fingerprint::with_version(Fingerprint::VERSION_2, h)),
            _ => None,
        }
    }

    /// The storage form: 32 bytes for version 1, `0x02` and 32 bytes for
    /// version 2.
    pub fn as_bytes(&self) -> &[u8] {
        if self.version() == Fingerprint::VERSION_2 {
            &self.0
        } else {
            &self.0[1..]
        }
    }

    /// The algorithm version: [`Fingerprint::VERSION_1`] or
    /// [`Fingerprint::VERSION_2`].
    pub const fn version(&self) -> u8 {
        self.0[0]
    }

    /// Lower-case hex of the storage form.
    pub fn to_hex(&self) -> String {
        hex::encode(self.as_bytes())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.to_hex();
        write!(f, "Fingerprint({})", hex.get(..12).unwrap_or(&hex))
    }
}

/// A content type's media type, lower-cased, without parameters.
fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Whether a media type (as [`media_type`] gives it) is JSON.
fn is_json(media: &str) -> bool {
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
        // Parameters and case of the media type do not count; the media
        // type does: a merge patch is not a JSON Patch.
        assert_eq!(
            a,
            fp(
                Some("Application/JSON"),
                r#"{"from":"a","meta":{"x":[1,2],"y":1},"to":"b","amount":100}"#
            )
        );
        let merge = |ct| fp(Some(ct), r#"{"a":1}"#);
        assert_ne!(
            merge("application/merge-patch+json"),
            merge("application/json-patch+json")
        );
        assert_ne!(
            merge("application/merge-patch+json"),
            fp(JSON, r#"{"a":1}"#)
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

    /// Version 1 values computed by the code before version 2 existed
    /// (commit c4fe368): the legacy algorithm must never change, or every
    /// record written before the upgrade would turn into a 422.
    #[test]
    fn version_1_is_pinned() {
        let op = Operation::new("POST", "/accounts/{id}/transfers");
        let sel =
            FieldSelection::Fields(vec!["/amount".into(), "/to/iban".into(), "/missing".into()]);
        for (ct, body, f, hex) in [
            (
                JSON,
                &br#"{"amount": 1.0e2, "to": {"iban": "DE89\u0041", "name": "n"}, "note": "caf\u00e9", "x": [1, 2.5, -0, true, null]}"#[..],
                &FieldSelection::Whole,
                "d94fce2c2ea07ce2eee7b836172c561952d156840465a7110d4add383c309027",
            ),
            (
                JSON,
                &br#"{"amount": 9007199254740993, "to": {"iban": "X"}}"#[..],
                &sel,
                "1fc6ad2a00606db0b3cc62bb9edadb348737fb294c9ea143b75466c4d44a1e41",
            ),
            (
                None,
                &b"amount=5&to=b"[..],
                &FieldSelection::Whole,
                "6d33b6e97ffde0912ec8d1280bfed5d13769f6afd704ed421e58e603871629fc",
            ),
            (
                JSON,
                &b"{broken"[..],
                &FieldSelection::Whole,
                "0fb82bd0d7448f54d905d0c95a0f1704ed810a98257f7f4f8d5bcb6c4608717c",
            ),
        ] {
            let v1 = Fingerprint::compute_v1(&op, ct, body, f);
            assert_eq!(v1.version(), Fingerprint::VERSION_1);
            assert_eq!(v1.to_hex(), hex);
            assert_eq!(v1.as_bytes().len(), 32);
            assert_ne!(v1, Fingerprint::compute(&op, ct, body, f));
        }
        // Version 1 rounds through a double; that is the bug version 2 fixes.
        let v1 = |b: &str| Fingerprint::compute_v1(&op, JSON, b.as_bytes(), &FieldSelection::Whole);
        assert_eq!(v1("9007199254740993"), v1("9007199254740992"));
    }

    #[test]
    fn storage_forms_round_trip() {
        let v2 = fp(JSON, r#"{"a":1}"#);
        assert_eq!(v2.version(), Fingerprint::VERSION_2);
        assert_eq!(v2.as_bytes().len(), 33);
        assert_eq!(v2.as_bytes()[0], 0x02);
        assert_eq!(Fingerprint::from_slice(v2.as_bytes()), Some(v2));
        assert_eq!(v2.to_hex(), hex::encode(v2.as_bytes()));
        assert!(v2.to_hex().starts_with("02"));

        let v1 = Fingerprint::compute_v1(
            &Operation::new("POST", "/transfers"),
            JSON,
            br#"{"a":1}"#,
            &FieldSelection::Whole,
        );
        assert_eq!(Fingerprint::from_slice(v1.as_bytes()), Some(v1));
        let raw: [u8; 32] = v1.as_bytes().try_into().unwrap();
        assert_eq!(Fingerprint::from_bytes(raw), v1);

        // The same 32 hash bytes as version 1 and version 2 are different.
        let as_v1 = Fingerprint::from_slice(&v2.as_bytes()[1..]).unwrap();
        assert_eq!(as_v1.version(), 1);
        assert_ne!(as_v1, v2);

        let mut bad = v2.as_bytes().to_vec();
        bad[0] = 0x01;
        assert_eq!(Fingerprint::from_slice(&bad), None);
        bad[0] = 0x03;
        assert_eq!(Fingerprint::from_slice(&bad), None);
        for len in [0, 1, 31, 34, 64] {
            assert_eq!(Fingerprint::from_slice(&vec![2u8; len]), None, "{len}");
        }
        assert_eq!(
            format!("{v2:?}"),
            format!("Fingerprint({})", &v2.to_hex()[..12])
        );
    }

    fn req(target: &str, ct: Option<&str>, body: &str) -> Fingerprint {
        Fingerprint::compute_request(
            &Operation::new("POST", "/accounts/{id}/transfers"),
            target,
            ct,
            body.as_bytes(),
            &FieldSelection::Whole,
        )
    }

    #[test]
    fn the_request_target_is_bound() {
        let body = r#"{"amount":5}"#;
        let a7 = req("/accounts/7/transfers", JSON, body);
        assert_eq!(
            a7,
            req("/accounts/7/transfers", JSON, r#"{ "amount" : 5.0 }"#)
        );
        assert_ne!(a7, req("/accounts/8/transfers", JSON, body));
        assert_ne!(
            req("/accounts/7/transfers?to=alice", JSON, body),
            req("/accounts/7/transfers?to=mallory", JSON, body)
        );
        assert_ne!(a7, req("/accounts/7/transfers?", JSON, body));
        assert_ne!(a7, req("/accounts/7/transfers?to=alice", JSON, body));
        assert_ne!(
            req("/accounts/7/transfers?to=alice", None, "x"),
            req("/accounts/7/transfers?to=mallory", None, "x")
        );
        // `compute` is the empty target.
        assert_eq!(req("", JSON, body), fp_op("/accounts/{id}/transfers", body));
        assert_ne!(req("/", JSON, body), req("", JSON, body));
    }

    fn fp_op(route: &str, body: &str) -> Fingerprint {
        Fingerprint::compute(
            &Operation::new("POST", route),
            JSON,
            body.as_bytes(),
            &FieldSelection::Whole,
        )
    }

    #[test]
    fn parts_cannot_shift_into_each_other() {
        // Bytes moved between target and body, or between operation and
        // target, give different fingerprints.
        assert_ne!(req("/a", None, "b"), req("/ab", None, ""));
        assert_ne!(req("/a", None, "b"), req("/", None, "ab"));
        let f = |route: &str, target: &str| {
            Fingerprint::compute_request(
                &Operation::new("POST", route),
                target,
                None,
                b"",
                &FieldSelection::Whole,
            )
        };
        assert_ne!(f("/x", "/y"), f("/x/", "y"));
        // A JSON body and a byte body that spells its canonical form differ.
        assert_ne!(req("/t", JSON, r#"{"a":1}"#), req("/t", None, r#"{"a":1}"#));
    }

    #[test]
    fn json_values_are_exact() {
        for (a, b) in [
            (
                r#"{"amount":9007199254740993}"#,
                r#"{"amount":9007199254740992}"#,
            ),
            (r#"{"amount":0.1}"#, r#"{"amount":0.10000000000000001}"#),
            (r#"{"amount":1}"#, r#"{"amount":1.5}"#),
            (r#"{"amount":"1"}"#, r#"{"amount":1}"#),
            (r#"{"amount":1}"#, r#"{"amount":-1}"#),
            (r#"{"amount":null}"#, r#"{}"#),
        ] {
            assert_ne!(fp(JSON, a), fp(JSON, b), "{a} vs {b}");
        }
        for (a, b) in [
            (r#"{"a":100}"#, r#"{"a":100.0}"#),
            (r#"{"a":100}"#, r#"{"a":1E+2}"#),
            (r#"{"a":100}"#, r#"{"a":10000e-2}"#),
            (r#"{"a":-0}"#, r#"{"a":0}"#),
            (r#"{"a":"\u0041"}"#, r#"{"a":"A"}"#),
            (
                r#"{"b":[1,{"y":2,"x":1}],"a":"\/"}"#,
                "{\n \"a\": \"/\",\n \"b\": [ 1, {\"x\":1,\"y\":2} ]\n}",
            ),
        ] {
            assert_eq!(fp(JSON, a), fp(JSON, b), "{a} vs {b}");
        }
    }

    #[test]
    fn bodies_that_are_not_json_by_the_v2_rules_are_bytes() {
        // Duplicate keys: hashed as bytes, so reordering them matters.
        assert_ne!(fp(JSON, r#"{"a":1,"a":2}"#), fp(JSON, r#"{"a":2,"a":1}"#));
        // Hashed as bytes: not canonical JSON, and whitespace counts.
        let deep = "[".repeat(100_000);
        for body in [
            r#"{"a":1,"a":2}"#,
            r#""\ud800""#,
            &deep,
            "1e99999999999999999999",
        ] {
            assert!(canonical_json::canonicalize(body.as_bytes()).is_err());
            assert_ne!(fp(JSON, body), fp(JSON, &format!("{body} ")));
        }
        // Big exponents that fit are numbers.
        assert_eq!(fp(JSON, "1e999999999999"), fp(JSON, "10e999999999998"));
    }

    #[test]
    fn selected_fields_are_exact_and_bound_to_the_target() {
        let sel = FieldSelection::Fields(vec!["/amount".into()]);
        let op = Operation::new("POST", "/accounts/{id}/transfers");
        let f = |t: &str, b: &str| Fingerprint::compute_request(&op, t, JSON, b.as_bytes(), &sel);
        assert_ne!(
            f(
                "/accounts/7/transfers",
                r#"{"amount":9007199254740993,"trace":1}"#
            ),
            f(
                "/accounts/7/transfers",
                r#"{"amount":9007199254740992,"trace":1}"#
            )
        );
        assert_eq!(
            f("/accounts/7/transfers", r#"{"amount":1e2,"trace":1}"#),
            f("/accounts/7/transfers", r#"{"trace":2,"amount":100}"#)
        );
        assert_ne!(
            f("/accounts/7/transfers", r#"{"amount":1}"#),
            f("/accounts/8/transfers", r#"{"amount":1}"#)
        );
        // A selection and the whole body are different kinds of hash.
        let whole = Fingerprint::compute_request(
            &op,
            "/t",
            JSON,
            br#"[["/amount",1]]"#,
            &FieldSelection::Whole,
        );
        assert_ne!(whole, f("/t", r#"{"amount":1}"#));
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
