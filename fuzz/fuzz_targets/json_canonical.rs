//! JSON canonicalization (fingerprint version 2): never panics, its output
//! is JSON that canonicalizes to itself, and a body and its canonical form
//! fingerprint alike.
#![no_main]

use idem_core::{FieldSelection, Fingerprint, Operation, canonicalize_json};
use libfuzzer_sys::fuzz_target;

const JSON: Option<&str> = Some("application/json");

fuzz_target!(|data: &[u8]| {
    let op = Operation::new("POST", "/accounts/{id}/transfers");
    let target = "/accounts/7/transfers?to=alice";
    let fields =
        FieldSelection::Fields(vec!["/a".into(), "/a/0".into(), "/~1~0".into(), "".into()]);
    let whole = Fingerprint::compute_request(&op, target, JSON, data, &FieldSelection::Whole);
    let selected = Fingerprint::compute_request(&op, target, JSON, data, &fields);
    let _ = Fingerprint::compute_v1(&op, JSON, data, &FieldSelection::Whole);

    let Some(canonical) = canonicalize_json(data) else {
        // Not JSON: hashed as bytes, like any other body.
        assert_eq!(
            whole,
            Fingerprint::compute_request(&op, target, None, data, &FieldSelection::Whole)
        );
        return;
    };
    assert_eq!(
        canonicalize_json(&canonical).as_deref(),
        Some(&canonical[..])
    );
    match serde_json::from_slice::<serde_json::Value>(&canonical) {
        Ok(_) => {}
        // serde_json refuses numbers beyond f64; we keep them exactly.
        Err(e) => assert!(e.to_string().starts_with("number out of range"), "{e}"),
    }
    assert_eq!(
        whole,
        Fingerprint::compute_request(&op, target, JSON, &canonical, &FieldSelection::Whole)
    );
    assert_eq!(
        selected,
        Fingerprint::compute_request(&op, target, JSON, &canonical, &fields)
    );
});
