//! The `json_canonical` fuzz target's check, shared with the regression
//! tests in `crates/idem-core/tests/fuzz_regressions.rs`.
//!
//! JSON canonicalization (fingerprint version 2): never panics, its output
//! is JSON that canonicalizes to itself, a body and its canonical form
//! fingerprint alike, a body that is not JSON is hashed whole whatever the
//! field selection, and the media type's parameters do not count.

use idem_core::{FieldSelection, Fingerprint, Operation, canonicalize_json};

const JSON: Option<&str> = Some("application/json");
const JSON_UTF8: Option<&str> = Some("Application/JSON; charset=utf-8");

/// Runs one input; panics when a property fails.
pub(crate) fn check(data: &[u8]) {
    let op = Operation::new("POST", "/accounts/{id}/transfers");
    let target = "/accounts/7/transfers?to=alice";
    let fields =
        FieldSelection::Fields(vec!["/a".into(), "/a/0".into(), "/~1~0".into(), "".into()]);
    let whole = Fingerprint::compute_request(&op, target, JSON, data, &FieldSelection::Whole);
    let selected = Fingerprint::compute_request(&op, target, JSON, data, &fields);
    let _ = Fingerprint::compute_v1(&op, JSON, data, &FieldSelection::Whole);

    // The media type's parameters are not bound.
    assert_eq!(
        whole,
        Fingerprint::compute_request(&op, target, JSON_UTF8, data, &FieldSelection::Whole)
    );
    let Some(canonical) = canonicalize_json(data) else {
        // Not JSON: hashed whole as bytes (under its media type, which is
        // bound, so not as a body without one), whatever fields are
        // selected.
        assert_eq!(whole, selected);
        return;
    };
    assert_eq!(
        canonicalize_json(&canonical).as_deref(),
        Some(&canonical[..])
    );
    match serde_json::from_slice::<serde_json::Value>(&canonical) {
        Ok(_) => {}
        // serde_json refuses numbers beyond f64, which we keep exactly, and
        // nesting 128 deep, which we accept (up to MAX_DEPTH, 128).
        Err(e) => assert!(
            e.to_string().starts_with("number out of range")
                || e.to_string().starts_with("recursion limit exceeded"),
            "{e}"
        ),
    }
    assert_eq!(
        whole,
        Fingerprint::compute_request(&op, target, JSON, &canonical, &FieldSelection::Whole)
    );
    assert_eq!(
        selected,
        Fingerprint::compute_request(&op, target, JSON, &canonical, &fields)
    );
}
