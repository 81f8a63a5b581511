//! The `key` fuzz target's check, shared with the regression tests in
//! `crates/idem-core/tests/fuzz_regressions.rs`.
//!
//! `Key::parse` with the default policy, with and without a credential.
//! Input: the header value, then optionally a NUL byte and the credential.

use idem_core::{Key, KeyPolicy, MAX_KEY_LEN};

/// Runs one input; panics when a property fails.
pub(crate) fn check(data: &[u8]) {
    let (raw, credential) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    let raw = String::from_utf8_lossy(raw);
    let credential = credential.map(String::from_utf8_lossy);
    let policy = KeyPolicy::default();

    let without = Key::parse(&raw, &policy, None);
    if let Ok(key) = &without {
        let s = key.as_str();
        assert!((policy.minimum_len()..=MAX_KEY_LEN).contains(&s.len()));
        assert!(s.bytes().all(|b| (0x20..=0x7e).contains(&b)));
        assert_eq!(Key::new(s).as_ref(), Ok(key));
        let _ = key.log_id();
    }
    if let Some(cred) = &credential {
        let with = Key::parse(&raw, &policy, Some(cred));
        if let Ok(key) = &with {
            // A credential only adds refusals.
            assert_eq!(without.as_ref(), Ok(key));
            let cred = cred.trim();
            if cred.len() >= 8 {
                assert!(!key.as_str().contains(cred));
            }
        }
    }
}
