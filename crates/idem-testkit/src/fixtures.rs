//! The suite's fixtures: a fixed time, ids no other test uses, claim
//! requests with the suite's lease and ttl, and responses that hold bytes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::{
    ClaimRequest, FieldSelection, Fingerprint, Key, Operation, RecordId, Scope, StoredResponse,
    Timestamp,
};

/// The lease the suite claims with.
pub const LEASE: Duration = Duration::from_secs(30);
/// The ttl the suite claims with.
pub const TTL: Duration = Duration::from_secs(3600);

/// A fixed starting time, so that tests read the same on every run.
pub fn t0() -> Timestamp {
    Timestamp::from_millis(1_800_000_000_000)
}

/// A record id in a scope no other test uses.
pub fn unique_id(key: &str) -> RecordId {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let scope = Scope::from_raw(format!(
        "testkit-{}-{}-{n}",
        std::process::id(),
        Timestamp::now().as_millis()
    ));
    let key = Key::new(key).unwrap_or_else(|e| panic!("test key {key:?}: {e}"));
    RecordId::new(scope, Operation::new("POST", "/testkit"), key)
}

/// The fingerprint of a body under the suite's operation.
pub fn fingerprint(body: &str) -> Fingerprint {
    Fingerprint::compute(
        &Operation::new("POST", "/testkit"),
        Some("application/json"),
        body.as_bytes(),
        &FieldSelection::Whole,
    )
}

/// A claim request at `now` with the suite's lease and ttl.
pub fn request(id: &RecordId, body: &str, now: Timestamp) -> ClaimRequest {
    ClaimRequest {
        id: id.clone(),
        fingerprint: fingerprint(body),
        now,
        lease: LEASE,
        ttl: TTL,
    }
}

/// A response with a header value that is not UTF-8 and a binary body, so
/// that stores prove they keep bytes as bytes.
pub fn response(status: u16, tag: &str) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![
            ("content-type".into(), b"application/json".to_vec()),
            ("x-tag".into(), tag.as_bytes().to_vec()),
            ("x-raw".into(), vec![0xff, 0x00, 0x7f]),
        ],
        body: [tag.as_bytes(), &[0u8, 0xfe]].concat(),
        trailers: Vec::new(),
    }
}
