//! Canonical JSON against examples and generated documents.

use super::*;
use proptest::prelude::*;
use serde_json::Value;

fn canon(s: &str) -> String {
    String::from_utf8(canonicalize(s.as_bytes()).unwrap()).unwrap()
}

fn err(s: &[u8]) -> JsonError {
    canonicalize(s).unwrap_err()
}

#[test]
fn number_spellings_of_one_value_match() {
    for group in [
        &[
            "100",
            "100.0",
            "1.0e2",
            "1E+2",
            "10000e-2",
            "1e2",
            "0.001e5",
            "100e0",
            // Leading and trailing zeros around one run of the input,
            // and across the point.
            "0.00100e5",
            "100.000",
            "10.00e1",
        ][..],
        &["0", "-0", "0.0", "-0.0e-5", "0e10", "0E-999"],
        &["1.5", "15e-1", "0.15E1", "1.50", "150e-2"],
        &["-12.5", "-125e-1", "-0.125e2"],
        &["12e-3", "0.0120", "0.012", "1.20e-2"],
        &["1e400", "10e399", "0.1e401"],
        &[
            "123456789012345678901234567890",
            "1.23456789012345678901234567890e29",
        ],
    ] {
        let first = canon(group[0]);
        for spelling in group {
            assert_eq!(canon(spelling), first, "{spelling}");
        }
    }
    assert_eq!(canon("100"), "100");
    assert_eq!(canon("-0"), "0");
    assert_eq!(canon("1.5"), "15e-1");
    assert_eq!(canon("1e20"), "100000000000000000000");
    assert_eq!(canon("1e21"), "1e21");
    assert_eq!(canon("-1e400"), "-1e400");
    assert_eq!(canon("1E-7"), "1e-7");
}

#[test]
fn different_numbers_never_match() {
    for (a, b) in [
        ("9007199254740993", "9007199254740992"),
        ("0.1", "0.10000000000000001"),
        ("1", "1.5"),
        ("1", "-1"),
        ("1e400", "1e401"),
        (
            "123456789012345678901234567891",
            "123456789012345678901234567890",
        ),
        ("1", "\"1\""),
        ("0", "false"),
        ("0", "null"),
    ] {
        assert_ne!(canon(a), canon(b), "{a} vs {b}");
    }
}

#[test]
fn exponents_out_of_range_are_not_json() {
    assert_eq!(canon("1e9223372036854775807"), "1e9223372036854775807");
    assert_eq!(canon("1e-9223372036854775807"), "1e-9223372036854775807");
    assert_eq!(err(b"1e9223372036854775808"), JsonError::ExponentOverflow);
    assert_eq!(
        err(b"1e99999999999999999999999"),
        JsonError::ExponentOverflow
    );
    // Normalisation moves the exponent past the edge.
    assert_eq!(err(b"10e9223372036854775807"), JsonError::ExponentOverflow);
    assert_eq!(canon("0.1e-9223372036854775807"), "1e-9223372036854775808");
    assert_eq!(canon("1e-9223372036854775808"), "1e-9223372036854775808");
    assert_eq!(
        err(b"0.01e-9223372036854775807"),
        JsonError::ExponentOverflow
    );
    assert_eq!(err(b"1e-9223372036854775809"), JsonError::ExponentOverflow);
    // Leading zeros in an exponent are allowed and cost nothing.
    assert_eq!(canon("1e000000000000000000000000000002"), "100");
}

#[test]
fn objects_are_sorted_and_whitespace_goes() {
    assert_eq!(
        canon(" {\"b\" : [ 1 , {\"d\":null, \"c\":true} ] ,\n\t\"a\":\"x\"}\r\n"),
        r#"{"a":"x","b":[1,{"c":true,"d":null}]}"#
    );
    // Bytewise order of the decoded keys.
    assert_eq!(
        canon(r#"{"é":1,"z":2,"Z":3,"":4,"a\u0000":5,"a":6}"#),
        "{\"\":4,\"Z\":3,\"a\":6,\"a\\u0000\":5,\"z\":2,\"é\":1}"
    );
    assert_eq!(canon("[]"), "[]");
    assert_eq!(canon("{ }"), "{}");
}

#[test]
fn strings_have_one_spelling() {
    assert_eq!(canon(r#""\u0041""#), canon(r#""A""#));
    assert_eq!(canon(r#""\/""#), canon(r#""/""#));
    assert_eq!(canon(r#""caf\u00E9""#), canon("\"café\""));
    assert_eq!(canon(r#""\ud83d\ude00""#), canon("\"😀\""));
    assert_eq!(canon(r#""\uD83D\uDE00""#), "\"😀\"");
    assert_eq!(
        canon(r#""\u0008\f\n\r\t\u0001\u001F\"\\\u007f\u2028""#),
        "\"\\b\\f\\n\\r\\t\\u0001\\u001f\\\"\\\\\u{7f}\u{2028}\""
    );
    assert_ne!(canon(r#""a""#), canon(r#""A""#));
    // Text on both sides of escapes, and an escape at either end.
    assert_eq!(canon(r#""ab\ncd\u0041ef""#), "\"ab\\ncdAef\"");
    assert_eq!(canon(r#""\tx\t""#), "\"\\tx\\t\"");
}

#[test]
fn lone_surrogates_are_not_json() {
    for s in [
        r#""\ud800""#,
        r#""\udc00""#,
        r#""\ud800x""#,
        r#""\ud800\n""#,
        r#""\ud800\u0041""#,
        r#""\ud800\ud800""#,
        r#""\ude00\ud83d""#,
    ] {
        assert_eq!(err(s.as_bytes()), JsonError::LoneSurrogate, "{s}");
    }
}

#[test]
fn duplicate_keys_are_not_json() {
    assert_eq!(err(br#"{"a":1,"a":1}"#), JsonError::DuplicateKey);
    assert_eq!(err(br#"{"a":1,"b":2,"a":3}"#), JsonError::DuplicateKey);
    assert_eq!(err(br#"{"a":1,"\u0061":2}"#), JsonError::DuplicateKey);
    assert_eq!(err(br#"[{"x":{"k":1,"k":2}}]"#), JsonError::DuplicateKey);
    assert!(canonicalize(br#"{"a":{"a":1},"b":{"a":1}}"#).is_ok());
}

#[test]
fn nesting_is_bounded_without_recursion() {
    let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert_eq!(canon(&ok), ok);
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    assert_eq!(err(deep.as_bytes()), JsonError::TooDeep);
    assert_eq!(err(&b"[".repeat(1_000_000)), JsonError::TooDeep);
    assert_eq!(err(&b"{\"a\":".repeat(1_000_000)), JsonError::TooDeep);
    assert_eq!(err(&b"[{\"\":".repeat(500_000)), JsonError::TooDeep);
    let objects = format!("{}1{}", "{\"a\":".repeat(MAX_DEPTH), "}".repeat(MAX_DEPTH));
    assert_eq!(canon(&objects), objects);
    // A long flat array is fine.
    let flat = format!("[{}1]", "1,".repeat(100_000));
    assert!(canonicalize(flat.as_bytes()).is_ok());
}

#[test]
fn grammar_is_strict() {
    for bad in [
        &b""[..],
        b" ",
        b"01",
        b"-01",
        b"1.",
        b".5",
        b"+1",
        b"-",
        b"1e",
        b"1e+",
        b"1.e3",
        b"0x10",
        b"NaN",
        b"Infinity",
        b"-Infinity",
        b"nul",
        b"True",
        b"'a'",
        b"[1,]",
        b"[,1]",
        b"[1 2]",
        b"{\"a\":1,}",
        b"{\"a\" 1}",
        b"{a:1}",
        b"{1:1}",
        b"[1]]",
        b"[1]x",
        b"1 2",
        b"\"abc",
        b"\"\t\"",
        b"\"\\x\"",
        b"\"\\u12\"",
        b"\"\\u12G4\"",
        b"\xEF\xBB\xBF{}",
        b"\"\xff\"",
        b"[\x0c]",
        b"\x00",
    ] {
        assert!(
            canonicalize(bad).is_err(),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    assert_eq!(err(b"\"\xff\""), JsonError::NotUtf8);
    for good in [
        "0",
        "-0",
        "\"\"",
        "null",
        " true ",
        "[false]",
        "\"\\u0000\"",
        "1E5",
        "1e-5",
    ] {
        assert!(canonicalize(good.as_bytes()).is_ok(), "{good}");
    }
}

#[test]
fn json_pointers_follow_rfc_6901() {
    let doc =
        parse(br#"{"a/b":1,"m~n":2,"arr":[10,11,{"x":"y"}],"":3,"01":4,"nested":{"k":{"l":5}}}"#)
            .unwrap();
    let at = |p: &str| {
        doc.pointer(p).map(|v| {
            let mut out = Vec::new();
            v.write_canonical(&mut out);
            String::from_utf8(out).unwrap()
        })
    };
    assert_eq!(at("/a~1b").as_deref(), Some("1"));
    assert_eq!(at("/m~0n").as_deref(), Some("2"));
    assert_eq!(at("/arr/0").as_deref(), Some("10"));
    assert_eq!(at("/arr/2/x").as_deref(), Some("\"y\""));
    assert_eq!(at("/").as_deref(), Some("3"));
    assert_eq!(at("/01").as_deref(), Some("4"));
    assert_eq!(at("/nested/k/l").as_deref(), Some("5"));
    assert!(at("").unwrap().starts_with('{'));
    for missing in [
        "/arr/01",
        "/arr/-",
        "/arr/3",
        "/arr/+1",
        "/arr/ 1",
        "/arr/a",
        "/a/b",
        "/m~2n",
        "/m~",
        "a",
        "/arr/0/x",
        "/nope",
        "/arr/99999999999999999999999",
    ] {
        assert_eq!(at(missing), None, "{missing}");
    }
}

#[test]
fn field_selections_are_pairs_and_missing_is_null() {
    let out = canonicalize_fields(
        br#"{"b":{"c":9007199254740993},"a":1.0}"#,
        &["/a".into(), "/b/c".into(), "/zz".into(), "/\"q".into()],
    )
    .unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"[["/a",1],["/b/c",9007199254740993],["/zz",null],["/\"q",null]]"#
    );
    assert_eq!(canonicalize_fields(b"[]", &[]).unwrap(), b"[]");
    assert!(canonicalize_fields(b"{", &["/a".into()]).is_err());
}

/// JSON values as serde_json sees them (f64 and integers, any strings).
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".*".prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(".*", inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Another spelling of `v`: members in reverse order, extra whitespace,
/// every string character as `\u` escapes, numbers as `m.m0E±x`.
fn write_odd(v: &Value, out: &mut String) {
    match v {
        Value::Null | Value::Bool(_) => out.push_str(&v.to_string()),
        Value::Number(n) => {
            let s = n.to_string();
            let (m, e) = s.split_once(['e', 'E']).unwrap_or((&s, "0"));
            let m = if m.contains('.') {
                format!("{m}0")
            } else {
                format!("{m}.0")
            };
            out.push_str(&format!("{m}E{e}"));
        }
        Value::String(s) => {
            out.push('"');
            for unit in s.encode_utf16() {
                out.push_str(&format!("\\u{unit:04X}"));
            }
            out.push('"');
        }
        Value::Array(items) => {
            out.push_str("[ ");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(" ,\n");
                }
                write_odd(item, out);
            }
            out.push_str(" ]");
        }
        Value::Object(members) => {
            out.push_str("{\t");
            for (i, (k, item)) in members.iter().rev().enumerate() {
                if i > 0 {
                    out.push_str(",\r\n ");
                }
                write_odd(&Value::String(k.clone()), out);
                out.push_str(" : ");
                write_odd(item, out);
            }
            out.push_str("\t}");
        }
    }
}

/// Bytes that look like JSON often enough to reach deep into the parser.
fn jsonish() -> impl Strategy<Value = Vec<u8>> {
    const TOKENS: &[&[u8]] = &[
        b"[",
        b"]",
        b"{",
        b"}",
        b",",
        b":",
        b"\"",
        b"\"k\":",
        b"\"a\":",
        b"\\",
        b"\\u",
        b"d83d",
        b"\\ude00",
        b"0",
        b"1",
        b"9",
        b"-",
        b".",
        b"e",
        b"E+",
        b"e-",
        b" ",
        b"\n",
        b"null",
        b"true",
        b"\xc3\xa9",
        b"\x00",
        b"\xff",
    ];
    let token = prop::sample::select(TOKENS);
    prop::collection::vec(token, 0..48).prop_map(|ts| ts.concat())
}

/// Whether serde_json finds `bytes` to be JSON; it refuses numbers
/// beyond f64, which we keep.
fn serde_accepts(bytes: &[u8]) -> bool {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(_) => true,
        Err(e) => e.to_string().starts_with("number out of range"),
    }
}

/// Every property the fuzz targets check, for one input.
pub(crate) fn check_canonicalize(input: &[u8]) {
    let Ok(once) = canonicalize(input) else {
        return;
    };
    assert_eq!(canonicalize(&once).as_ref(), Ok(&once), "not idempotent");
    assert!(
        serde_accepts(&once),
        "canonical output is not JSON: {:?}",
        String::from_utf8_lossy(&once)
    );
}

proptest! {
    #[test]
    fn spellings_of_one_value_canonicalize_alike(v in value()) {
        let compact = serde_json::to_vec(&v).unwrap();
        let pretty = serde_json::to_vec_pretty(&v).unwrap();
        let mut odd = String::new();
        write_odd(&v, &mut odd);
        let c = canonicalize(&compact).unwrap();
        prop_assert_eq!(&canonicalize(&pretty).unwrap(), &c);
        prop_assert_eq!(&canonicalize(odd.as_bytes()).unwrap(), &c);
        prop_assert_eq!(&canonicalize(&c).unwrap(), &c);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_canonical_is_a_fixed_point(
        input in prop::collection::vec(any::<u8>(), 0..256)
    ) {
        check_canonicalize(&input);
    }

    #[test]
    fn jsonish_bytes_never_panic_and_canonical_is_a_fixed_point(input in jsonish()) {
        check_canonicalize(&input);
        // Whatever we accept, serde_json accepts too.
        if canonicalize(&input).is_ok() {
            prop_assert!(serde_accepts(&input));
        }
    }
}
