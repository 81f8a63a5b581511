//! Each classification row against a real HTTP server (raw TCP, so it can
//! also drop a connection after reading the request), through the
//! reqwest-middleware and tower adapters and the plain engine.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use idem_retry::header_names::IDEMPOTENCY_KEY;
use idem_retry::{Backoff, CallSpec, Retrier, RetryLayer, RetryMiddleware, RetryPolicy, Stop};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};

/// What the server saw: (path, idempotency key, authorization) per request.
type Seen = Arc<Mutex<Vec<(String, Option<String>, Option<String>)>>>;

/// A raw HTTP/1.1 server. `/status/CODE[/RETRY_AFTER]` answers CODE;
/// `/drop` reads the request and closes the connection without a word;
/// `/auth` is 401 unless `Authorization: Bearer fresh`.
async fn server() -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let (sock, _) = listener.accept().await.unwrap();
            let log = log.clone();
            tokio::spawn(async move {
                let mut conn = BufReader::new(sock);
                loop {
                    let mut line = String::new();
                    if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    let (mut len, mut key, mut auth) = (0usize, None, None);
                    loop {
                        let mut h = String::new();
                        conn.read_line(&mut h).await.unwrap();
                        let h = h.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        let (name, value) = h.split_once(':').unwrap();
                        match name.to_ascii_lowercase().as_str() {
                            "content-length" => len = value.trim().parse().unwrap(),
                            IDEMPOTENCY_KEY => key = Some(value.trim().to_owned()),
                            "authorization" => auth = Some(value.trim().to_owned()),
                            _ => {}
                        }
                    }
                    let mut body = vec![0; len];
                    conn.read_exact(&mut body).await.unwrap();
                    log.lock().unwrap().push((path.clone(), key, auth.clone()));
                    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
                    let (code, extra) = match parts.as_slice() {
                        ["drop"] => return, // the request was read; no answer
                        ["auth"] if auth.as_deref() == Some("Bearer fresh") => (201, String::new()),
                        ["auth"] => (401, String::new()),
                        ["status", c] => (c.parse().unwrap(), String::new()),
                        ["status", c, ra] => (
                            c.parse().unwrap(),
                            format!("{}: {ra}\r\n", http::header::RETRY_AFTER),
                        ),
                        _ => (404, String::new()),
                    };
                    let resp = format!("HTTP/1.1 {code} X\r\ncontent-length: 2\r\n{extra}\r\nok");
                    if conn.get_mut().write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), seen)
}

fn fast_policy() -> RetryPolicy {
    RetryPolicy::builder()
        .no_budget()
        .backoff(Backoff::new(
            Duration::from_millis(1),
            Duration::from_millis(5),
        ))
        .build()
}

fn client(policy: RetryPolicy) -> reqwest_middleware::ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build()
}

fn count(seen: &Seen, path: &str) -> usize {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(p, _, _)| p == path)
        .count()
}

#[tokio::test]
async fn statuses_are_retried_as_the_table_says() {
    let (base, seen) = server().await;
    let c = client(fast_policy());
    // (status, attempts expected for a POST, which gets a key)
    let table = [
        (200, 1),
        (201, 1),
        (400, 1),
        (404, 1),
        (422, 1),
        (401, 1), // no refresh hook
        (409, 3),
        (429, 3),
        (502, 3),
        (503, 3),
        (504, 3),
        (408, 3),
        (425, 3),
        (500, 3), // other 5xx, with a key
    ];
    for (status, attempts) in table {
        let path = format!("/status/{status}");
        let r = c
            .post(format!("{base}{path}"))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status);
        assert_eq!(count(&seen, &path), attempts, "status {status}");
    }
    // Every attempt of a call carried the same generated key.
    let log = seen.lock().unwrap();
    let k503: Vec<_> = log
        .iter()
        .filter(|(p, _, _)| p == "/status/503")
        .map(|(_, k, _)| k.clone().unwrap())
        .collect();
    assert!(k503.iter().all(|k| k == &k503[0]));
    // A generated key is a UUID, sent as an sf-string.
    let uuid = k503[0].strip_prefix('"').and_then(|k| k.strip_suffix('"'));
    assert!(
        uuid.is_some_and(|u| uuid::Uuid::parse_str(u).is_ok()),
        "{}",
        k503[0]
    );
}

#[tokio::test]
async fn without_a_key_only_unsent_requests_are_retried() {
    let (base, seen) = server().await;
    let retrier = Retrier::new(fast_policy());
    let http = reqwest::Client::new();
    for path in ["/status/500", "/status/503", "/drop"] {
        let url = format!("{base}{path}");
        let (_, report) = retrier
            .call_with_report(CallSpec::keyed().without_key(), |_| {
                http.post(&url).body("{}").send()
            })
            .await;
        assert_eq!(report.attempts, 1, "{path}: a key-less POST is sent once");
        assert_eq!(count(&seen, path), 1);
    }
    // Nobody listens: the request is never sent, so it is retried.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let url = format!("http://{dead}/x");
    let (result, report) = retrier
        .call_with_report(CallSpec::keyed().without_key(), |_| {
            http.post(&url).body("{}").send()
        })
        .await;
    assert!(result.is_err());
    assert_eq!(report.attempts, 3);
    assert_eq!(report.stop, Stop::AttemptsExhausted);
}

#[tokio::test]
async fn an_unknown_result_is_retried_with_the_same_key() {
    let (base, seen) = server().await;
    let c = client(fast_policy());
    let r = c.post(format!("{base}/drop")).body("{}").send().await;
    assert!(r.is_err(), "never answered");
    assert_eq!(count(&seen, "/drop"), 3);
    let log = seen.lock().unwrap();
    let keys: Vec<_> = log.iter().map(|(_, k, _)| k.clone().unwrap()).collect();
    assert!(keys.iter().all(|k| k == &keys[0]));
}

#[tokio::test]
async fn a_caller_key_is_kept_and_gets_are_retried_without_one() {
    let (base, seen) = server().await;
    let c = client(fast_policy());
    // A key on the request, bare or as an sf-string (quotes and
    // backslashes escaped), is sent unchanged on every attempt.
    for (path, sent, on_the_wire) in [
        // The caller's header goes out as the caller wrote it, bare or
        // quoted: a server that compares bytes sees the caller's key.
        ("/status/503", "my-own-intent-0001", "my-own-intent-0001"),
        (
            "/status/502",
            r#""my-own-intent-0002""#,
            r#""my-own-intent-0002""#,
        ),
        (
            "/status/504",
            r#""say \"hi\" \\ again 3""#,
            r#""say \"hi\" \\ again 3""#,
        ),
    ] {
        let r = c
            .post(format!("{base}{path}"))
            .header(IDEMPOTENCY_KEY, sent)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_str(), &path[8..]);
        let log = seen.lock().unwrap();
        let keys: Vec<_> = log
            .iter()
            .filter(|(p, _, _)| p == path)
            .map(|(_, k, _)| k.as_deref())
            .collect();
        assert_eq!(keys, [Some(on_the_wire); 3], "{sent}");
    }
    let r = c.get(format!("{base}/status/500")).send().await.unwrap();
    assert_eq!(r.status(), 500);
    let log = seen.lock().unwrap();
    let gets: Vec<_> = log.iter().filter(|(p, _, _)| p == "/status/500").collect();
    assert_eq!(gets.len(), 3, "GET is idempotent: retried");
    assert!(
        gets.iter().all(|(_, k, _)| k.is_none()),
        "and sent without a key"
    );
}

#[tokio::test]
async fn a_refreshed_credential_is_retried_once_with_the_same_key() {
    let (base, seen) = server().await;
    let refreshes = Arc::new(Mutex::new(0));
    let n = refreshes.clone();
    let policy = RetryPolicy::builder()
        .no_budget()
        .refresh_credential(Arc::new(move || {
            *n.lock().unwrap() += 1;
            Box::pin(async { Some(http::HeaderValue::from_static("Bearer fresh")) })
        }))
        .build();
    let c = client(policy);
    let r = c
        .post(format!("{base}/auth"))
        .header("authorization", "Bearer stale")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(*refreshes.lock().unwrap(), 1);
    let log = seen.lock().unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].2.as_deref(), Some("Bearer stale"));
    assert_eq!(log[1].2.as_deref(), Some("Bearer fresh"));
    assert_eq!(log[0].1, log[1].1, "same key");
}

#[tokio::test]
async fn a_failed_refresh_stops_the_call() {
    let (base, seen) = server().await;
    let policy = RetryPolicy::builder()
        .refresh_credential(Arc::new(|| Box::pin(async { None })))
        .build();
    let r = client(policy)
        .post(format!("{base}/auth"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(count(&seen, "/auth"), 1);
}

#[tokio::test]
async fn the_tower_layer_retries_hyper_requests() {
    let (base, seen) = server().await;
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::new(fast_policy()))
        .service(hyper);
    let req = http::Request::post(format!("{base}/status/503/0"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let resp = svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(count(&seen, "/status/503/0"), 3);
    let req = http::Request::post(format!("{base}/drop"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    assert!(svc.ready().await.unwrap().call(req).await.is_err());
    assert_eq!(count(&seen, "/drop"), 3);
    let log = seen.lock().unwrap();
    let keys: Vec<_> = log
        .iter()
        .filter(|(p, _, _)| p == "/drop")
        .map(|(_, k, _)| k.clone())
        .collect();
    assert!(keys[0].is_some() && keys.iter().all(|k| k == &keys[0]));
}
