//! The OpenAPI document (`crates/idem/openapi/idem-gateway.json`): the admin listener
//! serves exactly the repository's file, and the file names every problem
//! type the code can emit, with the status the code gives it. The kinds are
//! read from the workspace's sources at test time, so a kind added to the
//! code and not to the document fails here.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The repository's copy of the document.
fn repository_document() -> String {
    let path = workspace_root().join("crates/idem/openapi/idem-gateway.json");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_serves_the_repository_document() {
    // Nothing is forwarded in this test: the upstream is never called.
    let g = support::gateway("http://127.0.0.1:9", "memory:", &[]).await;
    let response = reqwest::get(format!("{}/openapi.json", g.admin))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()[reqwest::header::CONTENT_TYPE],
        "application/json"
    );
    let served = response.text().await.unwrap();
    assert_eq!(served, repository_document());
    let doc: Value = serde_json::from_str(&served).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    // Not on the main listener: the upstream's paths are its own.
    let main = reqwest::get(format!("{}/openapi.json", g.base))
        .await
        .unwrap();
    assert_ne!(main.text().await.unwrap(), served);
}

/// How an emitted problem's status is given in the code.
#[derive(Debug, Clone, PartialEq, Eq)]
enum EmittedStatus {
    /// A `StatusCode` constant.
    Fixed(u16),
    /// A variable: the original response's status (`response-not-stored`).
    Original,
}

/// Every `(kind, status)` the workspace's library and binary code emits:
/// a kebab-case string literal right after a status argument, as in
/// `Problem::idem(StatusCode::NOT_FOUND, "record-not-found", ...)`, the
/// rejection table's `p(S::CONFLICT, "in-flight", ...)` or the gateway's
/// `problem(StatusCode::BAD_GATEWAY, "upstream-failed", ...)`; and
/// `Problem::idem(status, "kind", ...)` with the status in a variable.
/// Unit-test modules (inline ones, and `tests.rs` files) are left out.
fn emitted_problems() -> BTreeMap<String, Vec<EmittedStatus>> {
    let mut found: BTreeMap<String, Vec<EmittedStatus>> = BTreeMap::new();
    let mut files = Vec::new();
    for entry in std::fs::read_dir(workspace_root().join("crates")).unwrap() {
        rust_files(&entry.unwrap().path().join("src"), &mut files);
    }
    assert!(files.len() > 20, "the sources were not found: {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        // An inline test module ends the file's code; `#[cfg(test)] mod
        // tests;` (a file of its own) does not.
        let code = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or("");
        for (kind, status) in problems_in(code) {
            let statuses = found.entry(kind).or_default();
            if !statuses.contains(&status) {
                statuses.push(status);
            }
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_stem().is_some_and(|s| s != "tests")
        {
            out.push(path);
        }
    }
}

/// The `(kind, status)` pairs in one file's code.
fn problems_in(code: &str) -> Vec<(String, EmittedStatus)> {
    let mut out = Vec::new();
    for (open, literal) in string_literals(code) {
        if !is_kind(literal) {
            continue;
        }
        // The argument before the literal: `<status>,` with only
        // whitespace between.
        let Some(argument) = code[..open].trim_end().strip_suffix(',') else {
            continue;
        };
        let argument = argument.trim_end();
        let start = argument
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .map_or(0, |i| i + 1);
        let (call, token) = argument.split_at(start);
        let status = if let Some(name) = token
            .strip_prefix("StatusCode::")
            .or_else(|| token.strip_prefix("S::"))
        {
            EmittedStatus::Fixed(status_number(name))
        } else if token == "status" && call.trim_end().ends_with("Problem::idem(") {
            EmittedStatus::Original
        } else {
            continue;
        };
        out.push((literal.to_owned(), status));
    }
    out
}

/// The plain string literals of Rust source, each with the offset of its
/// opening quote and its raw contents; comments, character literals and
/// raw strings are stepped over so that their quotes do not count.
fn string_literals(code: &str) -> Vec<(usize, &str)> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                i = code[i..].find('\n').map_or(bytes.len(), |n| i + n);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = code[i + 2..]
                    .find("*/")
                    .map_or(bytes.len(), |n| i + 2 + n + 2);
            }
            b'r' if matches!(bytes.get(i + 1), Some(b'"' | b'#'))
                && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_')) =>
            {
                let hashes = bytes[i + 1..].iter().take_while(|&&b| b == b'#').count();
                if bytes.get(i + 1 + hashes) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let body = i + 2 + hashes;
                i = code[body..]
                    .find(&close)
                    .map_or(bytes.len(), |n| body + n + close.len());
            }
            b'\'' => {
                // A character literal ('"', '\\', '\'') or a lifetime ('a).
                if bytes.get(i + 1) == Some(&b'\\') {
                    i = code[i + 3..]
                        .find('\'')
                        .map_or(bytes.len(), |n| i + 3 + n + 1);
                } else if bytes.get(i + 2) == Some(&b'\'') {
                    i += 3;
                } else {
                    i += 1;
                }
            }
            b'"' => {
                let start = i;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                out.push((start, &code[start + 1..i.min(bytes.len())]));
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// A problem kind: lower-case words joined by hyphens.
fn is_kind(s: &str) -> bool {
    !s.is_empty()
        && s.split('-')
            .all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase()))
}

/// The number of a `StatusCode` constant's name; an unknown name fails the
/// test, so a new status cannot slip past.
fn status_number(name: &str) -> u16 {
    match name {
        "BAD_REQUEST" => 400,
        "UNAUTHORIZED" => 401,
        "FORBIDDEN" => 403,
        "NOT_FOUND" => 404,
        "METHOD_NOT_ALLOWED" => 405,
        "REQUEST_TIMEOUT" => 408,
        "CONFLICT" => 409,
        "PAYLOAD_TOO_LARGE" => 413,
        "EXPECTATION_FAILED" => 417,
        "UNPROCESSABLE_ENTITY" => 422,
        "TOO_MANY_REQUESTS" => 429,
        "INTERNAL_SERVER_ERROR" => 500,
        "NOT_IMPLEMENTED" => 501,
        "BAD_GATEWAY" => 502,
        "SERVICE_UNAVAILABLE" => 503,
        "GATEWAY_TIMEOUT" => 504,
        other => panic!("StatusCode::{other}: add its number to status_number"),
    }
}

#[test]
fn the_scan_finds_the_known_problems() {
    // Guards the scanner itself: if it stopped matching the code's shape,
    // the document test below would pass vacuously.
    let emitted = emitted_problems();
    for (kind, status) in [
        ("missing-key", EmittedStatus::Fixed(400)),
        ("in-flight", EmittedStatus::Fixed(409)),
        ("credential-required", EmittedStatus::Fixed(401)),
        ("record-not-found", EmittedStatus::Fixed(404)),
        ("upstream-timeout", EmittedStatus::Fixed(504)),
        ("invalid-path", EmittedStatus::Fixed(400)),
        ("response-not-stored", EmittedStatus::Original),
    ] {
        assert_eq!(emitted.get(kind), Some(&vec![status]), "{kind}");
    }
    assert!(emitted.len() >= 23, "{emitted:?}");
}

#[test]
fn every_problem_the_code_emits_is_in_the_document() {
    let text = repository_document();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let listed: BTreeMap<&str, &Value> = doc["x-idem-problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["type"].as_str().unwrap(), &p["status"]))
        .collect();
    let enumerated: Vec<&str> = doc["components"]["schemas"]["ProblemType"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let emitted = emitted_problems();
    for (kind, statuses) in &emitted {
        let urn = format!("urn:idem:problem:{kind}");
        let [status] = &statuses[..] else {
            panic!("{kind} is emitted with several statuses: {statuses:?}");
        };
        let expected = match status {
            EmittedStatus::Fixed(n) => Value::from(*n),
            EmittedStatus::Original => Value::Null,
        };
        assert_eq!(
            listed.get(urn.as_str()),
            Some(&&expected),
            "{urn} in x-idem-problems"
        );
        assert!(enumerated.contains(&urn.as_str()), "{urn} in ProblemType");
        let example = &doc["components"]["examples"][kind.as_str()]["value"];
        assert_eq!(example["type"], urn.as_str(), "the example of {kind}");
        if let EmittedStatus::Fixed(n) = status {
            assert_eq!(example["status"], *n, "the example of {kind}");
            // The example is used by the named response for its status.
            let reference = format!("#/components/examples/{kind}");
            let used = doc["components"]["responses"]
                .as_object()
                .unwrap()
                .values()
                .filter(|r| {
                    r["description"]
                        .as_str()
                        .unwrap()
                        .starts_with(&format!("{n}:"))
                })
                .any(|r| {
                    r["content"]["application/problem+json"]["examples"][kind.as_str()]["$ref"]
                        == reference.as_str()
                });
            assert!(used, "no {n} response shows {kind}");
        }
    }
    // And the other way: the document lists no kind the code lost.
    for urn in listed.keys() {
        let kind = urn.strip_prefix("urn:idem:problem:").unwrap();
        assert!(
            emitted.contains_key(kind),
            "{urn} is documented but not emitted"
        );
    }
    assert_eq!(listed.len(), emitted.len());
    assert_eq!(enumerated.len(), emitted.len());
}

/// `x-idem-grpc` gives every problem kind the gRPC status the layer
/// answers a gRPC call with (`idem_http::grpc::grpc_code_of`).
#[test]
fn every_problem_has_the_grpc_status_the_code_gives_it() {
    let doc: Value = serde_json::from_str(&repository_document()).unwrap();
    let statuses: BTreeMap<&str, u16> = doc["x-idem-problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let status = p["status"].as_u64().map_or(500, |s| s as u16);
            (p["type"].as_str().unwrap(), status)
        })
        .collect();
    let grpc: BTreeMap<&str, u64> = doc["x-idem-grpc"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["type"].as_str().unwrap(),
                p["grpc-status"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        statuses.keys().collect::<Vec<_>>(),
        grpc.keys().collect::<Vec<_>>(),
        "x-idem-grpc names every problem, and only those"
    );
    for (urn, code) in grpc {
        let kind = urn.strip_prefix("urn:idem:problem:").unwrap();
        let status = http::StatusCode::from_u16(statuses[urn]).unwrap();
        assert_eq!(
            u64::from(idem_http::grpc::grpc_code_of(kind, status)),
            code,
            "{urn}"
        );
    }
}

#[test]
fn the_document_describes_the_headers_and_the_read_path() {
    let doc: Value = serde_json::from_str(&repository_document()).unwrap();
    let components = &doc["components"];
    let key = &components["parameters"]["Idempotency-Key"];
    assert_eq!(key["name"], "Idempotency-Key");
    assert_eq!(key["in"], "header");
    for name in [
        "Idempotent-Replayed",
        "Idempotency-Key-Expires",
        "Retry-After",
    ] {
        assert!(
            components["headers"][name]["schema"].is_object(),
            "{name} header"
        );
    }
    let read = &doc["paths"]["/_idem/records/{key}"]["get"];
    for status in ["200", "400", "401", "404", "405", "503"] {
        assert!(read["responses"][status].is_object(), "read path {status}");
    }
    // The record view's fields, as `RecordView` and `ResponseView` are
    // serialised.
    let view = &components["schemas"]["RecordView"]["properties"];
    for field in [
        "key",
        "operation",
        "status",
        "resource_id",
        "expires_at",
        "expires_at_ms",
        "response",
    ] {
        assert!(view[field].is_object(), "RecordView.{field}");
    }
    let response = &components["schemas"]["ResponseView"]["properties"];
    for field in ["status", "headers", "body", "body_base64"] {
        assert!(response[field].is_object(), "ResponseView.{field}");
    }
}
