//! Review of issue 13's client keys (attack tests): each test states the
//! contract and fails while the bug it names is there.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response};
use http_body_util::Full;
use idem_retry::header_names::IDEMPOTENCY_KEY;
use idem_retry::{
    Backoff, CallSpec, Observation, Observed, Retrier, RetryError, RetryLayer, RetryPolicy, Step,
};
use tower::{Layer, ServiceExt};

fn fast() -> RetryPolicy {
    RetryPolicy::builder()
        .no_budget()
        .backoff(Backoff::new(
            Duration::from_millis(1),
            Duration::from_millis(5),
        ))
        .build()
}

/// The `Idempotency-Key` values of each request, in order.
type Seen = Arc<Mutex<Vec<Vec<HeaderValue>>>>;

/// A tower client that records the `Idempotency-Key` values of every
/// request it gets and answers 200.
fn recording() -> (
    impl tower::Service<
        Request<Full<Bytes>>,
        Response = Response<()>,
        Error = std::io::Error,
        Future = impl Send,
    > + Clone
    + Send
    + 'static,
    Seen,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let svc = tower::service_fn(move |req: Request<Full<Bytes>>| {
        let values = req
            .headers()
            .get_all(IDEMPOTENCY_KEY)
            .iter()
            .cloned()
            .collect();
        record.lock().unwrap().push(values);
        async { Ok::<_, std::io::Error>(Response::new(())) }
    });
    (svc, seen)
}

/// `Retrier::start` (the manual loop) takes a key `Key::new` refuses; the
/// docs tell the caller to send `Attempt::key_header_value`, which is
/// `None` for it, so the POST goes out without a key. The engine still
/// counts the call as keyed and retries it after an unknown outcome: a
/// second, unprotected execution.
#[tokio::test]
async fn a_manual_call_whose_key_cannot_be_sent_is_not_retried_unprotected() {
    let retrier = Retrier::new(fast());
    let mut call = retrier.start(CallSpec::for_method(&Method::POST).with_key("order-\u{e9}-42"));
    let attempt = call.next_attempt();
    let sent = attempt.key_header_value();
    let step = call.after(&Observation::of(Observed::Unknown)).await;
    assert!(
        sent.is_some() || !matches!(step, Step::Retry(_)),
        "POST sent with key header {sent:?}, and the engine answers {step:?}"
    );
}

/// A request carrying two `Idempotency-Key` headers is ambiguous; the
/// server refuses it (`RepeatedKey`). The client keeps the first silently
/// and sends one, so the caller's bug is hidden and one of the two keys is
/// used for the payment.
#[tokio::test]
async fn two_key_headers_on_a_request_are_refused_not_collapsed() {
    let (inner, seen) = recording();
    let svc = RetryLayer::new(fast()).layer(inner);
    let mut req = Request::post("http://upstream.invalid/payments")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    req.headers_mut()
        .append(IDEMPOTENCY_KEY, HeaderValue::from_static("order-0001-aaaa"));
    req.headers_mut()
        .append(IDEMPOTENCY_KEY, HeaderValue::from_static("order-0002-bbbb"));
    let result = svc.oneshot(req).await;
    assert!(
        matches!(result, Err(RetryError::InvalidKey(_))),
        "sent {:?}",
        seen.lock().unwrap()
    );
}

/// A key the caller put on the request goes out rewritten as an
/// sf-string: `order-42` becomes `"order-42"`. idem's server reads both as
/// one key, but a server that compares the header's bytes (most payment
/// APIs) sees a new key, so a call retried across an upgrade of this
/// client executes twice there.
#[tokio::test]
async fn a_key_the_caller_set_goes_out_as_the_caller_wrote_it() {
    let (inner, seen) = recording();
    let svc = RetryLayer::new(fast()).layer(inner);
    let req = Request::post("http://upstream.invalid/payments")
        .header(IDEMPOTENCY_KEY, "order-42-2026-12-01")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    svc.oneshot(req).await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![vec![HeaderValue::from_static("order-42-2026-12-01")]]
    );
}
