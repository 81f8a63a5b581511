//! Who is asking, and what they are asking for: the two parts of a record's
//! identity besides the key.

use std::fmt;

use crate::digest::sha256_parts;
use crate::key::Key;

/// Whose records these are. Two scopes never see each other's records.
///
/// A scope is stored as an opaque string. Scopes built from a credential or
/// a tenant name are SHA-256 hashes, so a database dump does not hold
/// credentials, and so a scope has a bounded length whatever the input.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope(String);

impl Scope {
    /// The scope shared by every request without a credential.
    pub fn anonymous() -> Scope {
        Scope("anonymous".to_owned())
    }

    /// The scope of a credential (the full `Authorization` value).
    pub fn from_credential(credential: &[u8]) -> Scope {
        Scope(format!(
            "c:{}",
            hex::encode(sha256_parts("idem-scope-credential", &[credential]))
        ))
    }

    /// The scope of a named tenant or principal (from a header a trusted
    /// proxy sets, say): the raw bytes are hashed, so two values that differ
    /// in any byte are two scopes.
    pub fn from_tenant(tenant: &[u8]) -> Scope {
        Scope(format!(
            "t:{}",
            hex::encode(sha256_parts("idem-scope-tenant", &[tenant]))
        ))
    }

    /// The scope of several identifying values together (a tenant and a
    /// principal within it, say), in order. One value gives the same scope
    /// as [`Scope::from_tenant`].
    pub fn from_parts(values: &[&[u8]]) -> Scope {
        match values {
            [one] => Scope::from_tenant(one),
            many => Scope(format!(
                "p:{}",
                hex::encode(sha256_parts("idem-scope-parts", many))
            )),
        }
    }

    /// A scope read back from a store, or built by the application.
    pub fn from_raw(raw: impl Into<String>) -> Scope {
        Scope(raw.into())
    }

    /// The stored form.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self.0.get(..14).unwrap_or(&self.0);
        write!(f, "Scope({shown})")
    }
}

/// The operation a key belongs to: method plus route, such as
/// `POST /transfers`. The same key used on two operations names two intents.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Operation(String);

impl Operation {
    /// An operation from a method and a route template (or path). The
    /// method is kept exactly as given: methods are case-sensitive (RFC
    /// 9110 section 9.1), so `post` is another method than `POST`, and a
    /// record of one is never the other's.
    pub fn new(method: &str, route: &str) -> Operation {
        // Built by hand: `format!` was 700 instructions of every keyed
        // request (BENCHMARKS.md).
        let mut text = String::with_capacity(method.len() + 1 + route.len());
        text.push_str(method);
        text.push(' ');
        text.push_str(route);
        Operation(text)
    }

    /// An operation read back from a store.
    pub fn from_raw(raw: impl Into<String>) -> Operation {
        Operation(raw.into())
    }

    /// The stored form.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The identity of one record: (scope, operation, key).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId {
    /// Who is asking.
    pub scope: Scope,
    /// What they are asking for.
    pub operation: Operation,
    /// The client's idempotency key.
    pub key: Key,
}

impl RecordId {
    /// Groups the three parts.
    pub fn new(scope: Scope, operation: Operation, key: Key) -> RecordId {
        RecordId {
            scope,
            operation,
            key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_separate_credentials_and_tenants() {
        assert_eq!(
            Scope::from_credential(b"Bearer a"),
            Scope::from_credential(b"Bearer a")
        );
        assert_ne!(
            Scope::from_credential(b"Bearer a"),
            Scope::from_credential(b"Bearer b")
        );
        assert_ne!(Scope::from_credential(b"acme"), Scope::from_tenant(b"acme"));
        assert_ne!(
            Scope::from_tenant("café".as_bytes()),
            Scope::from_tenant(b"caf")
        );
        assert_eq!(Scope::from_parts(&[b"acme"]), Scope::from_tenant(b"acme"));
        // Parts are length-framed: bytes cannot move between them.
        assert_ne!(
            Scope::from_parts(&[b"ab", b"c"]),
            Scope::from_parts(&[b"a", b"bc"])
        );
        assert!(
            !Scope::from_credential(b"Bearer secret-token")
                .as_str()
                .contains("secret")
        );
    }

    #[test]
    fn operation_keeps_the_method_as_sent() {
        assert_ne!(Operation::new("post", "/a"), Operation::new("POST", "/a"));
        assert_eq!(Operation::new("post", "/a").as_str(), "post /a");
        // Any text, as the formatted version wrote it.
        for (method, route) in [
            ("pAtCh", "/accounts/{id}"),
            ("", ""),
            ("m\u{e9}thode", "/caf\u{e9} x"),
            ("GET", "/\u{1f600}/{a}/{b}"),
        ] {
            assert_eq!(
                Operation::new(method, route).as_str(),
                format!("{method} {route}"),
                "{method} {route}"
            );
        }
    }
}
