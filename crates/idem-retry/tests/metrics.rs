//! The client's metrics, read through a recorder installed for this test
//! binary alone.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use idem_retry::{
    Backoff, CallSpec, Observation, ObserveError, ObserveResponse, Retrier, RetryBudget,
    RetryPolicy, names,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[derive(Debug)]
struct Fake(u16);
impl ObserveResponse for Fake {
    fn observe(&self) -> Observation {
        Observation::from_response(self.0, &HeaderMap::new())
    }
}
#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;
impl ObserveError for Never {
    fn observe(&self) -> Observation {
        unreachable!()
    }
}

#[tokio::test(start_paused = true)]
async fn attempts_retries_budget_and_waiting_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    // No floor, and each first attempt buys one retry.
    let budget = Arc::new(RetryBudget::new(Duration::from_secs(10), 0, 1.0));
    let retrier = Retrier::new(
        RetryPolicy::builder()
            .budget(budget)
            .backoff(Backoff::new(Duration::from_millis(100), Duration::from_millis(100)).seeded(1))
            .build(),
    );
    let _ = retrier
        .call(CallSpec::keyed(), |_| async { Ok::<_, Never>(Fake(503)) })
        .await;
    let _ = retrier
        .call(CallSpec::keyed(), |_| async { Ok::<_, Never>(Fake(429)) })
        .await;

    let mut counters: HashMap<String, u64> = HashMap::new();
    let mut waited = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let k = key.key();
        let label = k
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect::<Vec<_>>()
            .join(",");
        match value {
            DebugValue::Counter(n) => {
                counters.insert(format!("{}{{{label}}}", k.name()), n);
            }
            DebugValue::Histogram(v) if k.name() == names::WAIT => waited = v.len(),
            _ => {}
        }
    }
    let get = |name: &str| counters.get(name).copied().unwrap_or(0);
    // Each call deposits one first attempt, which pays for one retry; the
    // second retry of each call is refused by the budget.
    assert_eq!(get(&format!("{}{{}}", names::ATTEMPTS)), 4, "{counters:?}");
    assert_eq!(
        get(&format!("{}{{reason=unavailable}}", names::RETRIES)),
        1,
        "{counters:?}"
    );
    assert_eq!(
        get(&format!("{}{{reason=throttled}}", names::RETRIES)),
        1,
        "{counters:?}"
    );
    assert_eq!(
        get(&format!("{}{{}}", names::BUDGET_EXHAUSTED)),
        2,
        "{counters:?}"
    );
    assert_eq!(waited, 2, "one wait recorded per retry");
}
