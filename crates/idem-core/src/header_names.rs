//! The header names of the idempotency contract, as they go on the wire.
//!
//! Server (`idem-http`) and client (`idem-retry`) must spell these the same
//! way, so they are named once, here. They are lowercase `&str`s because
//! this crate knows no HTTP types: the HTTP crates turn them into typed
//! headers (`http::HeaderName::from_static`, which accepts only lowercase).

/// `Idempotency-Key`: the client's name for one intent, sent unchanged on
/// every attempt.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// `Idempotent-Replayed: true`: the response is the replay of a stored one.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// `Idempotency-Key-Expires: <HTTP-date>`: until then a retry with the same
/// key is answered from the record; after it, a retry would execute again.
pub const IDEMPOTENCY_KEY_EXPIRES: &str = "idempotency-key-expires";

/// `Idem-Takeover: <key>`: sent by the server to the operation it runs
/// when this execution takes over an earlier one whose outcome is unknown
/// (the `announce` takeover policy). Never taken from a client.
pub const IDEM_TAKEOVER: &str = "idem-takeover";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lowercase_header_tokens() {
        for name in [
            IDEMPOTENCY_KEY,
            IDEMPOTENT_REPLAYED,
            IDEMPOTENCY_KEY_EXPIRES,
            IDEM_TAKEOVER,
        ] {
            assert!(!name.is_empty());
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "{name}"
            );
        }
    }
}
