//! SHA-256 helpers shared by scopes, fingerprints and log ids.

use sha2::{Digest, Sha256};

/// SHA-256 of `parts`, each prefixed by its length so that no two
/// different sequences of parts hash alike.
pub(crate) fn sha256_parts(domain: &str, parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(domain.as_bytes());
    h.update([0]);
    for part in parts {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.finalize().into()
}

/// The first 12 hex digits of SHA-256: enough to tell keys apart in logs,
/// too little to recover them.
pub(crate) fn short_hex(data: &[u8]) -> String {
    let full = sha256_parts("idem-log", &[data]);
    hex::encode(&full[..6])
}
