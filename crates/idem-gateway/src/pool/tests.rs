//! The pool against upstreams that misbehave, and the rule that decides
//! whether a connection is used again.

mod rule_tests {
    use http::{HeaderMap, HeaderValue, StatusCode, header};

    use crate::pool::{Sent, out_of_step};

    fn status(code: u16) -> StatusCode {
        StatusCode::from_u16(code).unwrap()
    }

    /// Every rule, and what stays in step: a bodiless request's final
    /// answer, and a success to a body handed over whole.
    #[test]
    fn exchanges_out_of_step_are_named() {
        let none = HeaderMap::new();
        let mut length = HeaderMap::new();
        length.insert(header::CONTENT_LENGTH, HeaderValue::from_static("40"));
        let mut zero = HeaderMap::new();
        zero.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        let mut coded = HeaderMap::new();
        coded.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        // hyper reads no length for a 204 or 304, so repeated ones need
        // not agree: any of them other than 0 announces a body.
        let mut zero_then_five = zero.clone();
        zero_then_five.append(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        let get = Sent {
            body_handed: None,
            head: false,
        };
        let handed = Sent {
            body_handed: Some(true),
            ..get
        };
        let early = Sent {
            body_handed: Some(false),
            ..get
        };
        let head = Sent { head: true, ..get };
        let cases = [
            (200, &none, get, None),
            (404, &length, get, None),
            (500, &length, get, None),
            (201, &length, handed, None),
            (204, &none, handed, None),
            (204, &zero, get, None),
            (304, &none, get, None),
            (101, &none, get, Some("not_final")),
            (600, &length, get, Some("not_final")),
            (999, &length, handed, Some("not_final")),
            (200, &length, early, Some("early_answer")),
            (401, &length, early, Some("early_answer")),
            (401, &length, handed, Some("refused_with_body")),
            (302, &none, handed, Some("refused_with_body")),
            (503, &length, handed, Some("refused_with_body")),
            (200, &length, head, Some("bodiless_answer")),
            (204, &length, get, Some("bodiless_answer")),
            (304, &coded, get, Some("bodiless_answer")),
            (204, &zero_then_five, get, Some("bodiless_answer")),
        ];
        for (code, headers, sent, expected) in cases {
            assert_eq!(
                out_of_step(status(code), headers, sent),
                expected,
                "{code} {headers:?} body {:?} head {}",
                sent.body_handed,
                sent.head
            );
        }
    }
}

mod exchanges {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use http::{HeaderValue, Request, StatusCode, Uri, header};
    use http_body_util::BodyExt as _;
    use idem_http::{Body, full};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::{Semaphore, mpsc};

    use crate::pool::{Pool, SendError};
    use crate::settings::UpstreamProtocol;

    /// What the hand-written upstream does after reading a request head.
    #[derive(Clone)]
    enum Then {
        /// Answers and keeps the connection.
        Answer,
        /// Answers, then closes the connection without saying so.
        AnswerAndClose,
        /// Closes the connection without answering.
        CloseUnanswered,
        /// Answers a connection's first request; closes it, unanswered,
        /// once it has read the second.
        AnswerOnceThenCloseUnanswered,
        /// Sends the answer's head, and its body once a permit is added.
        AnswerBodyWhenLetGo(Arc<Semaphore>),
    }

    /// An upstream on a raw socket that counts the connections it
    /// accepted and the request heads it read, and reports a
    /// connection's end on `closed` (its client closed it, or it closed
    /// it after answering).
    struct Upstream {
        origin: Uri,
        accepted: Arc<AtomicUsize>,
        requests: Arc<AtomicUsize>,
        closed: mpsc::UnboundedReceiver<()>,
    }

    async fn upstream(then: Then) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let (accepted, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (tell, closed) = mpsc::unbounded_channel();
        let (a, r) = (accepted.clone(), requests.clone());
        tokio::spawn(async move {
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                a.fetch_add(1, Ordering::SeqCst);
                let (then, r, tell) = (then.clone(), r.clone(), tell.clone());
                tokio::spawn(async move {
                    serve(socket, then, r).await;
                    let _ = tell.send(());
                });
            }
        });
        Upstream {
            origin,
            accepted,
            requests,
            closed,
        }
    }

    /// Serves one connection until either side closes it.
    async fn serve(mut socket: TcpStream, then: Then, requests: Arc<AtomicUsize>) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        loop {
            let n = socket.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&chunk[..n]);
            // Requests here have no body: a head ends one.
            while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                buf.drain(..end + 4);
                let seen = requests.fetch_add(1, Ordering::SeqCst) + 1;
                let head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n";
                let written = match &then {
                    Then::CloseUnanswered => return,
                    Then::AnswerOnceThenCloseUnanswered if seen > 1 => return,
                    Then::AnswerBodyWhenLetGo(gate) => {
                        let head_sent = socket.write_all(head).await;
                        let Ok(permit) = gate.acquire().await else {
                            return;
                        };
                        permit.forget();
                        match head_sent {
                            Ok(()) => socket.write_all(b"ok").await,
                            Err(e) => Err(e),
                        }
                    }
                    _ => socket.write_all(&[&head[..], b"ok"].concat()).await,
                };
                if written.is_err() {
                    return;
                }
                if let Then::AnswerAndClose = then {
                    return;
                }
            }
        }
    }

    fn pool(up: &Upstream, idle_timeout: Duration) -> Arc<Pool> {
        Pool::new(
            up.origin.clone(),
            None,
            UpstreamProtocol::Http1,
            Duration::from_secs(5),
            idle_timeout,
        )
    }

    fn get() -> Request<Body> {
        let mut request = Request::new(full(""));
        *request.uri_mut() = Uri::from_static("/x");
        request
            .headers_mut()
            .insert(header::HOST, HeaderValue::from_static("up"));
        request
    }

    /// A deadline no test here reaches.
    fn later() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(60)
    }

    async fn ok(pool: &Arc<Pool>) {
        let response = pool.send(get(), later()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
    }

    #[tokio::test]
    async fn one_connection_serves_requests_one_after_another() {
        let up = upstream(Then::Answer).await;
        let pool = pool(&up, Duration::from_secs(60));
        for _ in 0..5 {
            ok(&pool).await;
        }
        assert_eq!(up.requests.load(Ordering::SeqCst), 5);
        assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_count(), 1);
    }

    /// Requests at once each get a connection; afterwards every one is
    /// idle and reused, and none is opened again.
    #[tokio::test]
    async fn concurrent_requests_open_connections_that_are_then_reused() {
        let up = upstream(Then::Answer).await;
        let pool = pool(&up, Duration::from_secs(60));
        let at_once = futures_util::future::join_all((0..8).map(|_| ok(&pool)));
        at_once.await;
        let opened = up.accepted.load(Ordering::SeqCst);
        assert!((1..=8).contains(&opened), "{opened}");
        for _ in 0..8 {
            ok(&pool).await;
        }
        assert_eq!(up.accepted.load(Ordering::SeqCst), opened);
        assert_eq!(up.requests.load(Ordering::SeqCst), 16);
    }

    /// An upstream that closes each connection after its answer: every
    /// request is answered, each reaches it once, and no closed
    /// connection is kept.
    #[tokio::test]
    async fn connections_the_upstream_closes_are_not_reused() {
        let mut up = upstream(Then::AnswerAndClose).await;
        let pool = pool(&up, Duration::from_secs(60));
        for n in 1..=5 {
            ok(&pool).await;
            assert_eq!(up.requests.load(Ordering::SeqCst), n);
            a_connection_ends(&mut up).await;
        }
        assert_eq!(up.accepted.load(Ordering::SeqCst), 5);
    }

    /// A request the upstream read before the connection failed may have
    /// been acted on: it is reported, not sent again.
    #[tokio::test]
    async fn a_request_that_was_written_is_never_sent_again() {
        let up = upstream(Then::CloseUnanswered).await;
        let pool = pool(&up, Duration::from_secs(60));
        // Twice: the second on a fresh connection, as the first closed.
        for n in 1..=2 {
            match pool.send(get(), later()).await {
                Err(SendError::Failed(_)) => {}
                other => panic!("{:?}", other.map(|r| r.status())),
            }
            assert_eq!(up.requests.load(Ordering::SeqCst), n);
            assert_eq!(up.accepted.load(Ordering::SeqCst), n);
        }
    }

    /// The same on a connection that had served before, where an unsent
    /// request would be tried again: this one was written, so it is not.
    #[tokio::test]
    async fn a_request_written_on_a_reused_connection_is_never_sent_again() {
        let up = upstream(Then::AnswerOnceThenCloseUnanswered).await;
        let pool = pool(&up, Duration::from_secs(60));
        ok(&pool).await;
        match pool.send(get(), later()).await {
            Err(SendError::Failed(_)) => {}
            other => panic!("{:?}", other.map(|r| r.status())),
        }
        assert_eq!(up.requests.load(Ordering::SeqCst), 2);
        assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_upstream_that_is_not_listening_is_unreachable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let origin: Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        drop(listener);
        let pool = Pool::new(
            origin,
            None,
            UpstreamProtocol::Http1,
            Duration::from_secs(5),
            Duration::from_secs(60),
        );
        assert!(matches!(
            pool.send(get(), later()).await,
            Err(SendError::NotSent(_))
        ));
    }

    /// An upstream that takes the TCP connection but never finishes the
    /// TLS handshake (the connector's own timeout covers the TCP connect
    /// only) fails by the request's deadline as not sent: nothing of the
    /// request was written, so the gateway may release its key, where
    /// the request's timeout would have held it as of unknown outcome.
    #[tokio::test]
    async fn a_handshake_that_outlasts_the_deadline_is_not_sent() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin: Uri = format!("https://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let (took, mut taken) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            // Holds what it accepts, silent, until the test ends.
            let (socket, _) = listener.accept().await.unwrap();
            let _ = took.send(());
            let _held = socket;
            std::future::pending::<()>().await;
        });
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let pool = Pool::new(
            origin,
            Some(tls),
            UpstreamProtocol::Http1,
            Duration::from_secs(60),
            Duration::from_secs(60),
        );
        let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
        let sent = tokio::time::timeout(Duration::from_secs(30), pool.send(get(), deadline))
            .await
            .expect("the deadline ends the send");
        match sent {
            Err(SendError::NotSent(e)) => {
                assert!(e.to_string().contains("not ready within"), "{e}");
            }
            Err(SendError::Failed(e)) => panic!("reported as written: {e}"),
            Ok(r) => panic!("answered: {}", r.status()),
        }
        taken.recv().await.expect("the TCP connection was made");
    }

    /// A quiet pool closes its idle connections after the idle timeout:
    /// the upstream sees them end.
    #[tokio::test]
    async fn idle_connections_are_closed_after_the_idle_timeout() {
        let mut up = upstream(Then::Answer).await;
        let pool = pool(&up, Duration::from_millis(200));
        ok(&pool).await;
        assert_eq!(pool.idle_count(), 1);
        a_connection_ends(&mut up).await;
        assert_eq!(pool.idle_count(), 0);
        // And the next request opens a new one.
        ok(&pool).await;
        assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
    }

    /// Waits for the upstream to see a connection end; fails after 20 s.
    async fn a_connection_ends(up: &mut Upstream) {
        let ended = tokio::time::timeout(Duration::from_secs(20), up.closed.recv()).await;
        assert!(matches!(ended, Ok(Some(()))), "no connection ended");
    }

    /// Connections found idle for the idle timeout at a checkout (the
    /// closing task has not come round to them yet) are not used: the
    /// upstream may be closing them at that moment. The newest ready one
    /// tells, and it and every older one go.
    #[tokio::test]
    async fn a_checkout_passes_over_connections_idle_too_long() {
        let mut up = upstream(Then::Answer).await;
        // The closing task runs every 2.5 s; the test takes milliseconds.
        let timeout = Duration::from_secs(10);
        let pool = pool(&up, timeout);
        futures_util::future::join(ok(&pool), ok(&pool)).await;
        ok(&pool).await;
        assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
        assert_eq!(pool.idle_count(), 2);
        for entry in pool.idle.lock().unwrap().iter_mut() {
            entry.since = entry.since.checked_sub(timeout).unwrap();
        }
        ok(&pool).await;
        assert_eq!(up.accepted.load(Ordering::SeqCst), 3);
        a_connection_ends(&mut up).await;
        a_connection_ends(&mut up).await;
        assert_eq!(pool.idle_count(), 1);
    }

    /// An answer whose body comes after its head holds its connection
    /// until the body is dropped; read to its end, the connection is
    /// used again.
    #[tokio::test]
    async fn a_connection_goes_back_when_its_answer_is_read() {
        let gate = Arc::new(Semaphore::new(0));
        let up = upstream(Then::AnswerBodyWhenLetGo(gate.clone())).await;
        let pool = pool(&up, Duration::from_secs(60));
        for n in 1..=3 {
            let response = pool.send(get(), later()).await.unwrap();
            assert_eq!(pool.idle_count(), 0, "the connection is still in use");
            gate.add_permits(1);
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"ok");
            assert_eq!(pool.idle_count(), 1);
            assert_eq!(up.requests.load(Ordering::SeqCst), n);
        }
        assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
    }

    /// A connection counts as idle from when its answer's head came, not
    /// from when its body was read: hyper reads a body only as fast as
    /// the client takes it, so the upstream may have gone quiet (and
    /// started its own keep-alive clock) long before the end is read.
    #[tokio::test]
    async fn a_connection_is_idle_from_its_answers_head() {
        let gate = Arc::new(Semaphore::new(0));
        let up = upstream(Then::AnswerBodyWhenLetGo(gate.clone())).await;
        let pool = pool(&up, Duration::from_secs(60));
        let response = pool.send(get(), later()).await.unwrap();
        let head_seen = tokio::time::Instant::now();
        gate.add_permits(1);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
        let idle = pool.idle.lock().unwrap();
        assert_eq!(idle.len(), 1);
        assert!(idle[0].since <= head_seen, "idle from the body's end");
    }

    /// A connection that comes back idle for the idle timeout already
    /// (its answer's head came that long ago) is not kept, and one found
    /// idle that long at a checkout is dropped alone: the fresh ones
    /// returned before it stay in use.
    #[tokio::test]
    async fn a_connection_back_late_is_dropped_alone() {
        let up = upstream(Then::Answer).await;
        let timeout = Duration::from_secs(10);
        let pool = pool(&up, timeout);
        let long_ago = tokio::time::Instant::now().checked_sub(timeout).unwrap();
        let late = pool.connect().await.unwrap().unwrap();
        pool.put(late, long_ago);
        assert_eq!(pool.idle_count(), 0, "kept though idle too long");

        futures_util::future::join(ok(&pool), ok(&pool)).await;
        assert_eq!(up.accepted.load(Ordering::SeqCst), 3);
        assert_eq!(pool.idle_count(), 2);
        // The newest came back late: only it goes.
        pool.idle.lock().unwrap().last_mut().unwrap().since = long_ago;
        ok(&pool).await;
        assert_eq!(
            up.accepted.load(Ordering::SeqCst),
            3,
            "a fresh one was used"
        );
        assert_eq!(pool.idle_count(), 1);
    }

    /// A connection whose answer was dropped before its body came is not
    /// handed out while hyper is still finishing that answer: the next
    /// request, sent at once, gets a connection of its own and reaches
    /// the upstream once. (Were a checkout to offer it, hyper would
    /// refuse the request unsent and the pool would take the next
    /// connection: the readiness check saves that round.)
    #[tokio::test]
    async fn a_connection_whose_answer_was_dropped_unread_is_not_used_again() {
        let gate = Arc::new(Semaphore::new(0));
        let up = upstream(Then::AnswerBodyWhenLetGo(gate.clone())).await;
        let pool = pool(&up, Duration::from_secs(60));
        let response = pool.send(get(), later()).await.unwrap();
        assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
        drop(response);
        // Both bodies may be sent: the abandoned one, and the next's.
        gate.add_permits(2);
        let next = pool.send(get(), later()).await.unwrap();
        assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
        let body = next.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
        assert_eq!(up.requests.load(Ordering::SeqCst), 2);
    }
}
