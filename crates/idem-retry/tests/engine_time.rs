//! The engine under paused tokio time: every delay's bounds, Retry-After in
//! both forms, its cap, the deadline, and the key's expiry. No network.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName};
use idem_retry::header_names::IDEMPOTENCY_KEY_EXPIRES;
use idem_retry::{
    Backoff, CallSpec, Jitter, Observation, ObserveError, ObserveResponse, Retrier, RetryError,
    RetryPolicy, Stop,
};
use tokio::time::Instant;

/// A fake response: a status and headers.
#[derive(Debug, Clone)]
struct Fake(u16, HeaderMap);

impl ObserveResponse for Fake {
    fn observe(&self) -> Observation {
        Observation::from_response(self.0, &self.1)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct NoError;
impl ObserveError for NoError {
    fn observe(&self) -> Observation {
        unreachable!()
    }
}

fn fake(status: u16, headers: &[(HeaderName, String)]) -> Fake {
    let mut h = HeaderMap::new();
    for (n, v) in headers {
        h.insert(n, v.parse().unwrap());
    }
    Fake(status, h)
}

/// Runs a call whose every attempt answers `answer(n)`; returns the
/// virtual instants of the attempts and the report.
async fn run(
    policy: RetryPolicy,
    answer: impl Fn(u32) -> Fake,
) -> (
    Vec<Duration>,
    Result<Fake, RetryError<NoError>>,
    idem_retry::CallReport,
) {
    let start = Instant::now();
    let times = Arc::new(Mutex::new(Vec::new()));
    let retrier = Retrier::new(policy);
    let (result, report) = retrier
        .call_with_report(CallSpec::keyed(), |a| {
            times.lock().unwrap().push(start.elapsed());
            let r = answer(a.number);
            async move { Ok::<_, NoError>(r) }
        })
        .await;
    let t = times.lock().unwrap().clone();
    (t, result, report)
}

fn gaps(times: &[Duration]) -> Vec<Duration> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}

const MS: Duration = Duration::from_millis(1);

#[tokio::test(start_paused = true)]
async fn every_jitter_mode_keeps_its_bounds() {
    for (jitter, lower_half) in [(Jitter::Full, false), (Jitter::Equal, true)] {
        for seed in 0..20 {
            let policy = RetryPolicy::builder()
                .max_attempts(6)
                .no_budget()
                .backoff(
                    Backoff::new(MS * 100, MS * 1000)
                        .jitter(jitter)
                        .seeded(seed),
                )
                .build();
            let (times, _, report) = run(policy, |_| fake(503, &[])).await;
            assert_eq!(report.attempts, 6);
            assert_eq!(report.stop, Stop::AttemptsExhausted);
            for (i, gap) in gaps(&times).into_iter().enumerate() {
                let bound = (MS * 100 * 2u32.pow(i as u32)).min(MS * 1000);
                assert!(
                    gap <= bound,
                    "{jitter:?} retry {}: {gap:?} > {bound:?}",
                    i + 1
                );
                if lower_half {
                    assert!(
                        gap >= bound / 2,
                        "{jitter:?} retry {}: {gap:?} < half of {bound:?}",
                        i + 1
                    );
                }
            }
        }
    }
    let policy = RetryPolicy::builder()
        .max_attempts(8)
        .no_budget()
        .backoff(
            Backoff::new(MS * 100, MS * 2000)
                .jitter(Jitter::Decorrelated)
                .seeded(3),
        )
        .build();
    let (times, _, _) = run(policy, |_| fake(503, &[])).await;
    let mut prev = MS * 100;
    for gap in gaps(&times) {
        assert!(
            gap >= MS * 100 && gap <= (prev * 3).min(MS * 2000),
            "{gap:?} after {prev:?}"
        );
        prev = gap;
    }
}

#[tokio::test(start_paused = true)]
async fn retry_after_seconds_replaces_the_backoff() {
    let policy = RetryPolicy::builder().no_budget().build();
    let (times, result, _) = run(policy, |n| {
        if n < 3 {
            fake(429, &[(RETRY_AFTER, "7".into())])
        } else {
            fake(201, &[])
        }
    })
    .await;
    assert_eq!(gaps(&times), [MS * 7000, MS * 7000]);
    assert_eq!(result.unwrap().0, 201);
}

#[tokio::test(start_paused = true)]
async fn retry_after_as_a_date_is_honoured() {
    let policy = RetryPolicy::builder().no_budget().build();
    let (times, _, _) = run(policy, |n| {
        if n == 1 {
            let at = SystemTime::now() + Duration::from_secs(5);
            fake(503, &[(RETRY_AFTER, httpdate::fmt_http_date(at))])
        } else {
            fake(200, &[])
        }
    })
    .await;
    let gap = gaps(&times)[0];
    // HTTP-dates have one-second resolution.
    assert!(gap >= MS * 4000 && gap <= MS * 5000, "{gap:?}");
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_capped() {
    let policy = RetryPolicy::builder()
        .no_budget()
        .max_retry_after(Duration::from_secs(30))
        .build();
    let (times, _, _) = run(policy, |n| {
        if n == 1 {
            fake(503, &[(RETRY_AFTER, "3600".into())])
        } else {
            fake(200, &[])
        }
    })
    .await;
    assert_eq!(gaps(&times), [Duration::from_secs(30)]);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_stops_the_call() {
    let policy = RetryPolicy::builder()
        .max_attempts(10)
        .no_budget()
        .deadline(Duration::from_secs(10))
        .build();
    let (times, result, report) = run(policy, |_| fake(503, &[(RETRY_AFTER, "4".into())])).await;
    assert_eq!(report.stop, Stop::Deadline);
    assert_eq!(
        times.len(),
        3,
        "attempts at 0, 4, 8 s; the next would pass 10 s"
    );
    assert_eq!(result.unwrap().0, 503, "the last answer is returned");
}

#[tokio::test(start_paused = true)]
async fn no_retry_is_sent_after_the_key_expires() {
    let policy = RetryPolicy::builder().no_budget().build();
    let expires = SystemTime::now() + Duration::from_secs(3);
    let (times, result, report) = run(policy, |_| {
        fake(
            503,
            &[
                (RETRY_AFTER, "5".into()),
                (
                    HeaderName::from_static(IDEMPOTENCY_KEY_EXPIRES),
                    httpdate::fmt_http_date(expires),
                ),
            ],
        )
    })
    .await;
    assert_eq!(times.len(), 1);
    assert_eq!(report.stop, Stop::KeyExpired);
    let err = result.unwrap_err();
    assert!(matches!(err, RetryError::KeyExpired { attempts: 1, .. }));
    assert!(err.to_string().contains("expires"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn the_same_key_is_sent_on_every_attempt() {
    let keys = Arc::new(Mutex::new(Vec::new()));
    let retrier = Retrier::new(RetryPolicy::builder().no_budget().build());
    let _ = retrier
        .call(CallSpec::keyed(), |a| {
            keys.lock().unwrap().push(a.key.clone().unwrap());
            async { Ok::<_, NoError>(fake(503, &[])) }
        })
        .await;
    let keys = keys.lock().unwrap();
    assert_eq!(keys.len(), 3);
    assert!(keys.iter().all(|k| k == &keys[0]));
    assert!(uuid::Uuid::parse_str(&keys[0]).is_ok_and(|u| u.get_version_num() == 4));
}
