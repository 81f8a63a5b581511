//! The layer's metrics, read through a recorder installed for this test
//! binary alone.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::sync::Arc;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::{key, spawn_app};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_are_counted_and_keys_never_labelled() {
    // The layer is built before the recorder is installed, as an
    // application may build its router first: it takes its metric handles
    // on first use, from the recorder installed by then.
    let app = spawn_app(Arc::new(idem_core::MemoryStore::new()), |b| b).await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    let k = key();
    app.post("/orders", &k, r#"{"a":1}"#).send().await.unwrap(); // executed
    app.post("/orders", &k, r#"{"a":1}"#).send().await.unwrap(); // replayed
    app.post("/orders", &k, r#"{"a":1}"#).send().await.unwrap(); // replayed
    app.post("/orders", &k, r#"{"a":2}"#).send().await.unwrap(); // mismatch
    app.client.post(app.url("/orders")).send().await.unwrap(); // missing_key
    app.post("/orders", "short", "{}").send().await.unwrap(); // invalid_key
    app.post("/status/503", &key(), "{}").send().await.unwrap(); // released
    // A claim that runs out of time is timed too, at its deadline.
    let stalled = spawn_app(Arc::new(idem_testkit::FaultyStore::stalled()), |b| {
        b.store_timeout(std::time::Duration::from_millis(150))
    })
    .await;
    let r = stalled.post("/orders", &key(), "{}").send().await.unwrap();
    assert_eq!(r.status(), 503); // store_unavailable

    let mut outcomes = std::collections::HashMap::new();
    let mut saw_store_histogram = false;
    let mut slowest_claim = 0.0_f64;
    for (ck, _unit, _desc, value) in snapshotter.snapshot().into_vec() {
        let key = ck.key();
        for label in key.labels() {
            assert!(!label.value().contains(&k), "a key leaked into a label");
        }
        match (key.name(), value) {
            (idem_http::metrics::REQUESTS, DebugValue::Counter(n)) => {
                let outcome = key
                    .labels()
                    .find(|l| l.key() == "outcome")
                    .unwrap()
                    .value()
                    .to_owned();
                outcomes.insert(outcome, n);
            }
            (idem_http::metrics::STORE_DURATION, DebugValue::Histogram(v)) => {
                saw_store_histogram |= !v.is_empty();
                if key
                    .labels()
                    .any(|l| l.key() == "op" && l.value() == "claim")
                {
                    slowest_claim = v
                        .iter()
                        .map(|s| s.into_inner())
                        .fold(slowest_claim, f64::max);
                }
            }
            _ => {}
        }
    }
    let get = |o: &str| outcomes.get(o).copied().unwrap_or(0);
    assert_eq!(get("executed"), 1);
    assert_eq!(get("replayed"), 2);
    assert_eq!(get("mismatch"), 1);
    assert_eq!(get("missing_key"), 1);
    assert_eq!(get("invalid_key"), 1);
    assert_eq!(get("released"), 1);
    assert_eq!(get("store_unavailable"), 1);
    assert!(saw_store_histogram);
    assert!(
        slowest_claim >= 0.15,
        "the timed-out claim is missing from the histogram: slowest {slowest_claim}"
    );
}
