//! Fuzz findings kept as tests, for the parsers this crate owns: the key
//! (`fuzz/fuzz_targets/key.rs`) and canonical JSON
//! (`fuzz/fuzz_targets/json_canonical.rs`).
//!
//! Each fuzz target's check is one function in `fuzz/checks/`, compiled
//! here too: every file in `fuzz/regressions/<target>/` (an input that once
//! failed, as its exact bytes) and in `fuzz/corpus/<target>/` (the seeds)
//! goes through the very code `cargo fuzz` runs, so a crash found later is
//! kept by dropping its file into the target's `regressions/` directory.
//! The findings with a known answer are also pinned by name below.

#[path = "../../../fuzz/checks/inputs.rs"]
mod inputs;
#[path = "../../../fuzz/checks/json_canonical.rs"]
mod json_canonical;
#[path = "../../../fuzz/checks/key.rs"]
mod key;

use idem_core::{FieldSelection, Fingerprint, Operation, canonicalize_json};

#[test]
fn key_regressions_pass_the_fuzz_check() {
    inputs::run_all("regressions", "key", key::check);
}

#[test]
fn key_seeds_pass_the_fuzz_check() {
    assert!(inputs::run_all("corpus", "key", key::check) > 0);
}

#[test]
fn json_canonical_regressions_pass_the_fuzz_check() {
    assert!(inputs::run_all("regressions", "json_canonical", json_canonical::check) > 0);
}

#[test]
fn json_canonical_seeds_pass_the_fuzz_check() {
    assert!(inputs::run_all("corpus", "json_canonical", json_canonical::check) > 0);
}

/// Found while the JSON target was being written (docs/security.md,
/// "Fuzzing"): `0.1e-9223372036854775807` normalises its exponent to
/// `i64::MIN`, and the canonical form `1e-9223372036854775808` was refused
/// when read again, so canonicalization was not idempotent for it.
#[test]
fn an_exponent_normalised_to_i64_min_reads_back() {
    let (name, input) = inputs::files("regressions", "json_canonical")
        .into_iter()
        .find(|(name, _)| name == "exponent-normalised-to-i64-min")
        .unwrap();
    assert_eq!(input, b"0.1e-9223372036854775807", "{name}");
    let canonical = canonicalize_json(&input).unwrap();
    assert_eq!(canonical, b"1e-9223372036854775808");
    assert_eq!(canonicalize_json(&canonical), Some(canonical));
}

/// Found by the first CI run of the JSON target (issue 35), on its first
/// input, the empty body; every body that is not JSON failed alike. The
/// target's check was wrong, not the fingerprint: it expected a JSON-typed
/// body that is not JSON to fingerprint like the same bytes without a
/// content type, but the media type is bound (a JSON Patch and a merge
/// patch with the same bytes are two requests). What is documented: such a
/// body is hashed whole as bytes, whatever fields are selected.
#[test]
fn a_json_typed_body_that_is_not_json_is_hashed_whole_under_its_media_type() {
    let (_, input) = inputs::files("regressions", "json_canonical")
        .into_iter()
        .find(|(name, _)| name == "empty-body")
        .unwrap();
    assert!(input.is_empty());
    json_canonical::check(&input);
    assert_eq!(canonicalize_json(&input), None);
    let op = Operation::new("POST", "/transfers");
    let fp = |content_type, fields: &FieldSelection| {
        Fingerprint::compute_request(&op, "/transfers", content_type, &input, fields)
    };
    let whole = fp(Some("application/json"), &FieldSelection::Whole);
    let amount = FieldSelection::Fields(vec!["/amount".into()]);
    assert_eq!(whole, fp(Some("application/json"), &amount));
    assert_eq!(whole, fp(Some("application/json; charset=utf-8"), &amount));
    assert_ne!(whole, fp(None, &FieldSelection::Whole));
    assert_ne!(whole, fp(Some("application/merge-patch+json"), &amount));
}

/// Found by the seeds of issue 35: nesting exactly 128 deep (the most the
/// canonicalizer accepts) canonicalizes, and serde_json, whose limit is
/// 127, refuses the output. The target's check had it as "not JSON"; it
/// now allows serde_json's limit, as it allows its number range.
#[test]
fn nesting_128_deep_is_json_though_serde_json_stops_short() {
    for name in ["depth-128", "objects-depth-128"] {
        let (_, input) = inputs::files("regressions", "json_canonical")
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap();
        let canonical = canonicalize_json(&input).unwrap();
        assert_eq!(canonical, input, "{name} is already canonical");
        let e = serde_json::from_slice::<serde_json::Value>(&canonical).unwrap_err();
        assert!(e.to_string().starts_with("recursion limit exceeded"), "{e}");
        json_canonical::check(&input);
        // One level deeper is not JSON by our rules.
        let deeper = [b"[".as_slice(), &input, b"]"].concat();
        assert_eq!(canonicalize_json(&deeper), None);
    }
}
