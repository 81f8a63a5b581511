//! The parsers of user input never panic, and accept what they should.
#![allow(clippy::unwrap_used, missing_docs)]

use idem_probe::{parse_body, parse_header, parse_pointer, parse_query, parse_url};
use proptest::prelude::*;

proptest! {
    #[test]
    fn header_parsing_never_panics(text in ".*") {
        if let Ok(h) = parse_header(&text) {
            prop_assert!(!h.name.is_empty());
            prop_assert!(!h.name.contains(':'));
            prop_assert_eq!(h.value.trim(), h.value.as_str());
        }
    }

    #[test]
    fn well_formed_headers_round_trip(name in "[A-Za-z][A-Za-z0-9-]{0,20}", value in "[ -~&&[^ ]]([ -~]{0,30}[!-~])?") {
        let h = parse_header(&format!("{name}: {value}")).unwrap();
        prop_assert_eq!(h.name, name);
        prop_assert_eq!(h.value, value);
    }

    #[test]
    fn body_parsing_accepts_json_and_refuses_the_rest(text in "[^@].*") {
        let is_json = serde_json::from_str::<serde_json::Value>(&text).is_ok();
        prop_assert_eq!(parse_body(&text).is_ok(), is_json);
    }

    #[test]
    fn json_values_are_accepted_byte_for_byte(n in any::<i64>(), s in ".*") {
        let text = serde_json::json!({ "n": n, "s": s }).to_string();
        prop_assert_eq!(parse_body(&text).unwrap(), text.into_bytes());
    }

    #[test]
    fn pointers_agree_with_serde_json(tokens in prop::collection::vec("[a-z~/01]{0,6}", 0..4)) {
        let pointer: String = tokens.iter().map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1"))).collect();
        prop_assert!(parse_pointer(&pointer).is_ok());
        // What it accepts, serde_json can resolve without panicking.
        let v = serde_json::json!({});
        let _ = v.pointer(&pointer);
    }

    #[test]
    fn pointer_and_url_parsing_never_panic(text in ".*") {
        let _ = parse_pointer(&text);
        let _ = parse_url(&text);
        let _ = parse_query(&text);
    }

    /// A refused URL or query is never shown: it may carry a secret (an
    /// api_key parameter, a password) into a CI log.
    #[test]
    fn refused_urls_and_queries_are_not_echoed(secret in "[A-Za-z0-9]{12,20}", shape in 0usize..5) {
        let text = match shape {
            0 => format!("http://user:{secret}@example.test/pay"),
            1 => format!("ftp://example.test/pay?api_key={secret}"),
            2 => format!("http:// bad host/{secret}"),
            3 => format!("not a url {secret}"),
            _ => format!("https://user{secret}@example.test/"),
        };
        let e = parse_url(&text).unwrap_err();
        prop_assert!(!e.to_string().contains(&secret), "{}", e);
        let e = parse_query(&format!("token={secret} #")).unwrap_err();
        prop_assert!(!e.to_string().contains(&secret), "{}", e);
    }
}

#[test]
fn urls_and_queries_that_are_accepted() {
    assert_eq!(
        parse_url("https://api.example.test/v1/pay?x=1")
            .unwrap()
            .scheme(),
        "https"
    );
    assert!(parse_url(" http://127.0.0.1:8080/pay ").is_ok());
    assert!(parse_url("http://").is_err());
    assert!(parse_url("/relative/path").is_err());
    assert_eq!(parse_query("?a=1&b=2").unwrap(), "a=1&b=2");
    assert!(parse_query("").is_err() && parse_query("?").is_err());
}

#[test]
fn at_file_bodies_are_read_and_missing_files_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("body.json");
    std::fs::write(&path, b"{\"a\":1}").unwrap();
    assert_eq!(
        parse_body(&format!("@{}", path.display())).unwrap(),
        b"{\"a\":1}"
    );
    let err = parse_body(&format!("@{}", dir.path().join("missing").display())).unwrap_err();
    assert!(err.is_usage());
    assert!(err.to_string().contains("missing"));
}
