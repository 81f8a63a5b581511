//! What a reqwest caller gets when a call fails, against a real local axum
//! server: the engine's own failures are a `RetryError` found by
//! downcasting the `anyhow::Error` of `reqwest_middleware::Error::Middleware`
//! (one test per variant the middleware makes); transport failures come
//! back as reqwest gave them, retried or not.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::routing::post;
use idem_retry::header_names::{IDEMPOTENCY_KEY, IDEMPOTENCY_KEY_EXPIRES};
use idem_retry::{Backoff, KeyError, RetryBudget, RetryError, RetryMiddleware, RetryPolicy};

/// A server whose every POST is 503. On `/expiring` it says `Retry-After:
/// 5` and that the key expires in 2 s; on `/busy`, `Retry-After: 0`.
/// Gives its base URL and how many requests reached it.
async fn unavailable_server() -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let (expiring, busy) = (hits.clone(), hits.clone());
    let app = axum::Router::new()
        .route(
            "/expiring",
            post(move || async move {
                expiring.fetch_add(1, Ordering::SeqCst);
                let expires = SystemTime::now() + Duration::from_secs(2);
                let mut headers = HeaderMap::new();
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
                headers.insert(
                    IDEMPOTENCY_KEY_EXPIRES,
                    HeaderValue::from_str(&httpdate::fmt_http_date(expires)).unwrap(),
                );
                (StatusCode::SERVICE_UNAVAILABLE, headers)
            }),
        )
        .route(
            "/busy",
            post(move || async move {
                busy.fetch_add(1, Ordering::SeqCst);
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(header::RETRY_AFTER, "0")],
                )
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, hits)
}

fn client(policy: RetryPolicy) -> reqwest_middleware::ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build()
}

fn fast() -> RetryPolicy {
    RetryPolicy::builder()
        .no_budget()
        .backoff(Backoff::new(
            Duration::from_millis(1),
            Duration::from_millis(5),
        ))
        .build()
}

/// The `RetryError` inside a middleware error, as a caller finds it.
fn retry_error(err: &reqwest_middleware::Error) -> &RetryError {
    let reqwest_middleware::Error::Middleware(e) = err else {
        panic!("not a middleware error: {err:?}");
    };
    e.downcast_ref::<RetryError>()
        .unwrap_or_else(|| panic!("no RetryError in {e:?}"))
}

#[tokio::test]
async fn a_key_expiring_before_the_next_retry_is_key_expired() {
    let (base, hits) = unavailable_server().await;
    let err = client(fast())
        .post(format!("{base}/expiring"))
        .body("{}")
        .send()
        .await
        .unwrap_err();
    assert_eq!(hits.load(Ordering::SeqCst), 1, "no retry after the expiry");
    let RetryError::KeyExpired {
        expires_at,
        attempts,
        ..
    } = retry_error(&err)
    else {
        panic!("{err:?}");
    };
    assert_eq!(*attempts, 1);
    let left = expires_at
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    assert!(
        left <= Duration::from_secs(3),
        "the server's expiry: {left:?}"
    );
    assert!(err.to_string().contains("expires at"), "{err}");
}

#[tokio::test]
async fn a_malformed_key_on_the_request_is_invalid_key_and_nothing_is_sent() {
    let (base, hits) = unavailable_server().await;
    let url = format!("{base}/busy");
    let c = client(fast());
    /// Whether the error is the one expected.
    type Expected = fn(&KeyError) -> bool;
    let malformed: [(&[u8], Expected); 5] = [
        (b"\"unterminated-intent-0001", |e| {
            *e == KeyError::Malformed("missing closing quote")
        }),
        (b"\"intent-0001\";p=1", |e| {
            matches!(e, KeyError::Malformed(_))
        }),
        (b"\"intent \\n 0001\"", |e| {
            matches!(e, KeyError::Malformed(_))
        }),
        (b"\"intent-\xe9-0001\"", |e| {
            *e == KeyError::InvalidCharacter { byte: 0xe9, at: 8 }
        }),
        (b"two-keys-0001, two-keys-0002", |e| {
            matches!(e, KeyError::InvalidCharacter { byte: b',', .. })
        }),
    ];
    for (raw, expected) in malformed {
        let err = c
            .post(&url)
            .header(IDEMPOTENCY_KEY, HeaderValue::from_bytes(raw).unwrap())
            .body("{}")
            .send()
            .await
            .unwrap_err();
        let RetryError::InvalidKey(why) = retry_error(&err) else {
            panic!("{err:?}");
        };
        assert!(expected(why), "{}: {why:?}", String::from_utf8_lossy(raw));
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0, "nothing was sent");
}

#[tokio::test]
async fn transport_failures_come_back_as_reqwest_gave_them() {
    // Nobody listens: never sent, so retried, and the last error is
    // returned as it is.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let url = format!("http://{dead}/payments");
    let err = client(fast())
        .post(&url)
        .body("{}")
        .send()
        .await
        .unwrap_err();
    let reqwest_middleware::Error::Reqwest(e) = &err else {
        panic!("wrapped: {err:?}");
    };
    assert!(e.is_connect(), "{e}");

    // An empty budget stops the retries at once: still the transport's
    // own error, and the last answer when there was one.
    let empty = || {
        RetryPolicy::builder()
            .budget(Arc::new(RetryBudget::new(Duration::from_secs(10), 0, 0.0)))
            .build()
    };
    let err = client(empty())
        .post(&url)
        .body("{}")
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, reqwest_middleware::Error::Reqwest(e) if e.is_connect()),
        "{err:?}"
    );
    let (base, hits) = unavailable_server().await;
    let resp = client(empty())
        .post(format!("{base}/busy"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_tower_layer_and_the_engine_refuse_a_key_they_cannot_send() {
    use bytes::Bytes;
    use http_body_util::Full;
    use tower::{Service, ServiceBuilder, ServiceExt};

    let (base, hits) = unavailable_server().await;
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut svc = ServiceBuilder::new()
        .layer(idem_retry::RetryLayer::new(fast()))
        .service(hyper);
    let req = http::Request::post(format!("{base}/busy"))
        .header(IDEMPOTENCY_KEY, "\"unterminated-intent-0001")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let err = svc.ready().await.unwrap().call(req).await.unwrap_err();
    assert!(
        matches!(err, RetryError::InvalidKey(KeyError::Malformed(_))),
        "{err:?}"
    );

    // A key given to the engine that is not printable ASCII.
    let retrier = idem_retry::Retrier::new(fast());
    let http = reqwest::Client::new();
    let (result, report) = retrier
        .call_with_report(
            idem_retry::CallSpec::keyed().with_key("intent\n0001"),
            |_| http.post(format!("{base}/busy")).send(),
        )
        .await;
    assert!(matches!(
        result,
        Err(RetryError::InvalidKey(KeyError::InvalidCharacter {
            byte: b'\n',
            at: 6
        }))
    ));
    assert_eq!(report.attempts, 0);
    assert_eq!(report.stop, idem_retry::Stop::InvalidKey);
    assert_eq!(hits.load(Ordering::SeqCst), 0, "nothing was sent");
}

/// Client and server agree on keys: a key of the caller's own shorter than
/// the server's default minimum (16) is refused before anything is sent,
/// and the error says why; a policy set to the server's own minimum sends
/// it.
#[tokio::test]
async fn a_key_shorter_than_the_servers_minimum_is_not_sent() {
    let (base, hits) = unavailable_server().await;
    let http = reqwest::Client::new();
    let (result, report) = idem_retry::Retrier::new(fast())
        .call_with_report(idem_retry::CallSpec::keyed().with_key("ord-42"), |_| {
            http.post(format!("{base}/busy")).send()
        })
        .await;
    let Err(err) = result else {
        panic!("a 6-character key was sent")
    };
    assert!(
        matches!(
            err,
            RetryError::InvalidKey(KeyError::TooShort { len: 6, min: 16 })
        ),
        "{err:?}"
    );
    let shown = err.to_string();
    assert!(
        shown.contains("6 characters") && shown.contains("16"),
        "{shown}"
    );
    assert_eq!(report.attempts, 0);
    assert_eq!(hits.load(Ordering::SeqCst), 0, "nothing was sent");

    // A server with `--min-key-len 4`, and a client set alike.
    let lenient = RetryPolicy::builder()
        .no_budget()
        .backoff(Backoff::new(
            Duration::from_millis(1),
            Duration::from_millis(5),
        ))
        .min_key_len(4)
        .build();
    let (_, report) = idem_retry::Retrier::new(lenient)
        .call_with_report(idem_retry::CallSpec::keyed().with_key("ord-42"), |_| {
            http.post(format!("{base}/busy")).send()
        })
        .await;
    assert!(report.attempts >= 1);
    assert!(hits.load(Ordering::SeqCst) >= 1, "sent");
}
