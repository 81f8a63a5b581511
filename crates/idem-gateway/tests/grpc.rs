//! gRPC unary calls protected end to end: a tonic client, the gateway
//! (h2c on both sides), and a tonic server. The key is the
//! `idempotency-key` metadata; the first call executes, its retry is
//! replayed byte for byte with its trailers, another message under the
//! key is refused, concurrent duplicates run once, a deterministic error
//! is replayed and `UNAVAILABLE` releases the key; idem's own refusals
//! are gRPC statuses.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use idem_core::MemoryStore;
use idem_gateway::{Gateway, Running, UpstreamProtocol, UpstreamSettings};
use idem_http::{IdempotencyLayer, KeyRequirement};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Messages as bytes: the gateway fingerprints what is sent, so the
/// test needs no protobuf.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

const PAY: &str = "/ledger.Ledger/Pay";

/// A tonic server over h2c: `Pay` answers `paid <n>: <message>`, or the
/// error a message names; it counts its executions.
async fn ledger(executed: Arc<AtomicUsize>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let executed = executed.clone();
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let executed = executed.clone();
                async move {
                    let pay = tower::service_fn(move |r: tonic::Request<Bytes>| {
                        let n = executed.fetch_add(1, Ordering::SeqCst) + 1;
                        async move {
                            let msg = r.into_inner();
                            match &msg[..] {
                                b"fail-invalid" => {
                                    Err(Status::invalid_argument("amount must be positive"))
                                }
                                b"fail-unavailable" => {
                                    Err(Status::unavailable("ledger restarting"))
                                }
                                _ => {
                                    let mut answer = format!("paid {n}: ").into_bytes();
                                    answer.extend_from_slice(&msg);
                                    Ok(tonic::Response::new(Bytes::from(answer)))
                                }
                            }
                        }
                    });
                    let mut grpc = tonic::server::Grpc::new(RawCodec);
                    Ok::<_, Infallible>(grpc.unary(pay, req).await)
                }
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service),
            );
        }
    });
    url
}

struct Setup {
    addr: SocketAddr,
    executed: Arc<AtomicUsize>,
    shutdown: CancellationToken,
    running: Running,
}

async fn setup() -> Setup {
    let executed = Arc::new(AtomicUsize::new(0));
    let url = ledger(executed.clone()).await;
    let mut upstream = UpstreamSettings::new(url.parse().unwrap());
    upstream.protocol = UpstreamProtocol::H2c;
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .default_key(KeyRequirement::Required)
        .hold_unknown_outcomes(true)
        .build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let running = Gateway::new(layer, upstream)
        .threads(2)
        .start(listener, &shutdown)
        .await
        .unwrap();
    Setup {
        addr,
        executed,
        shutdown,
        running,
    }
}

async fn channel(addr: SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn pay(
    channel: &Channel,
    key: Option<&str>,
    message: &'static [u8],
) -> Result<tonic::Response<Bytes>, Status> {
    let mut client = tonic::client::Grpc::new(channel.clone());
    client.ready().await.unwrap();
    let mut req = tonic::Request::new(Bytes::from_static(message));
    if let Some(key) = key {
        req.metadata_mut()
            .insert("idempotency-key", key.parse().unwrap());
    }
    client
        .unary(req, PathAndQuery::from_static(PAY), RawCodec)
        .await
}

fn replayed(r: &tonic::Response<Bytes>) -> bool {
    r.metadata()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

#[tokio::test]
async fn a_unary_call_executes_once_and_its_retry_is_replayed() {
    let s = setup().await;
    let ch = channel(s.addr).await;
    let first = pay(&ch, Some("grpc-key-000000000001"), b"10 EUR")
        .await
        .unwrap();
    assert!(!replayed(&first));
    assert_eq!(first.get_ref(), &Bytes::from_static(b"paid 1: 10 EUR"));
    let retry = pay(&ch, Some("grpc-key-000000000001"), b"10 EUR")
        .await
        .unwrap();
    assert!(replayed(&retry));
    assert_eq!(retry.get_ref(), first.get_ref());
    // On another connection too.
    let other = channel(s.addr).await;
    let elsewhere = pay(&other, Some("grpc-key-000000000001"), b"10 EUR")
        .await
        .unwrap();
    assert!(replayed(&elsewhere));
    assert_eq!(s.executed.load(Ordering::SeqCst), 1);

    // Another message under the key: refused, as FAILED_PRECONDITION.
    let mismatch = pay(&ch, Some("grpc-key-000000000001"), b"99 EUR")
        .await
        .unwrap_err();
    assert_eq!(mismatch.code(), Code::FailedPrecondition, "{mismatch:?}");
    // No key on a route that needs one: INVALID_ARGUMENT, nothing ran.
    let keyless = pay(&ch, None, b"10 EUR").await.unwrap_err();
    assert_eq!(keyless.code(), Code::InvalidArgument, "{keyless:?}");
    let bad_key = pay(&ch, Some("short"), b"10 EUR").await.unwrap_err();
    assert_eq!(bad_key.code(), Code::InvalidArgument, "{bad_key:?}");
    assert_eq!(s.executed.load(Ordering::SeqCst), 1);
    s.shutdown.cancel();
    s.running.wait().await.unwrap();
}

#[tokio::test]
async fn error_statuses_are_replayed_or_released_by_their_meaning() {
    let s = setup().await;
    let ch = channel(s.addr).await;
    // INVALID_ARGUMENT is the server's answer to this message: kept.
    for _ in 0..2 {
        let e = pay(&ch, Some("grpc-invalid-00000001"), b"fail-invalid")
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert_eq!(e.message(), "amount must be positive");
    }
    assert_eq!(
        s.executed.load(Ordering::SeqCst),
        1,
        "a kept error ran again"
    );
    // UNAVAILABLE says "retry": the key is released, the retry runs.
    for _ in 0..2 {
        let e = pay(&ch, Some("grpc-unavail-00000001"), b"fail-unavailable")
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unavailable);
    }
    assert_eq!(
        s.executed.load(Ordering::SeqCst),
        3,
        "a released key was not run again"
    );
    s.shutdown.cancel();
    s.running.wait().await.unwrap();
}

#[tokio::test]
async fn concurrent_duplicate_calls_run_once() {
    let s = setup().await;
    let channels = [channel(s.addr).await, channel(s.addr).await];
    let mut calls = Vec::new();
    for i in 0..12 {
        let ch = channels[i % 2].clone();
        calls.push(tokio::spawn(async move {
            pay(&ch, Some("grpc-dup-0000000001"), b"30 EUR").await
        }));
    }
    let mut answers = Vec::new();
    for c in calls {
        match c.await.unwrap() {
            Ok(r) => answers.push(r.into_inner()),
            Err(e) => assert_eq!(e.code(), Code::Aborted, "{e:?}"),
        }
    }
    assert_eq!(s.executed.load(Ordering::SeqCst), 1);
    assert!(!answers.is_empty());
    assert!(answers.iter().all(|a| a == "paid 1: 30 EUR"), "{answers:?}");
    s.shutdown.cancel();
    s.running.wait().await.unwrap();
}

/// One gRPC exchange over a raw h2c connection: the answer's status,
/// headers, body and trailers as sent.
async fn raw_call(
    addr: SocketAddr,
    key: &str,
    frame: &'static [u8],
    encoding: Option<&str>,
) -> (StatusCode, http::HeaderMap, Bytes, Option<http::HeaderMap>) {
    raw_call_to(addr, PAY, key, frame, encoding).await
}

async fn raw_call_to(
    addr: SocketAddr,
    path: &str,
    key: &str,
    frame: &'static [u8],
    encoding: Option<&str>,
) -> (StatusCode, http::HeaderMap, Bytes, Option<http::HeaderMap>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("idempotency-key", key);
    if let Some(e) = encoding {
        req = req.header("grpc-encoding", e);
    }
    let req = req.body(Full::new(Bytes::from_static(frame))).unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    (parts.status, parts.headers, collected.to_bytes(), trailers)
}

/// The replay is the first answer byte for byte: the framed message and
/// the trailers (status and message) as the server sent them.
#[tokio::test]
async fn the_replay_is_the_answer_byte_for_byte_with_its_trailers() {
    let s = setup().await;
    let frame = b"\0\0\0\0\x0640 EUR";
    let first = raw_call(s.addr, "grpc-raw-00000000001", frame, None).await;
    let retry = raw_call(s.addr, "grpc-raw-00000000001", frame, None).await;
    assert_eq!(first.0, StatusCode::OK);
    assert_eq!(first.2, retry.2);
    assert_eq!(&first.2[5..], b"paid 1: 40 EUR");
    let (t1, t2) = (first.3.unwrap(), retry.3.unwrap());
    assert_eq!(t1["grpc-status"], "0");
    assert_eq!(t1.get("grpc-status"), t2.get("grpc-status"));
    assert_eq!(t1.get("grpc-message"), t2.get("grpc-message"));
    assert_eq!(retry.1["idempotent-replayed"], "true");
    assert_eq!(s.executed.load(Ordering::SeqCst), 1);
    s.shutdown.cancel();
    s.running.wait().await.unwrap();
}

/// A compressed message cannot be fingerprinted as sent: refused as
/// UNIMPLEMENTED in a trailers-only answer, and nothing runs.
#[tokio::test]
async fn a_compressed_message_is_refused_unexecuted() {
    let s = setup().await;
    let (status, headers, body, trailers) = raw_call(
        s.addr,
        "grpc-gzip-0000000001",
        b"\x01\0\0\0\x01x",
        Some("gzip"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/grpc");
    assert_eq!(headers["grpc-status"], "12");
    assert!(body.is_empty());
    assert!(trailers.is_none());
    assert_eq!(s.executed.load(Ordering::SeqCst), 0);
    s.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), s.running.wait())
        .await
        .unwrap()
        .unwrap();
}

/// The gateway's own refusals before the layer (a path an upstream could
/// resolve elsewhere) are gRPC statuses too.
#[tokio::test]
async fn the_gateways_own_refusals_are_grpc_statuses() {
    let s = setup().await;
    let (status, headers, body, _) = raw_call_to(
        s.addr,
        "/ledger.Ledger/../Pay",
        "grpc-path-0000000001",
        b"\0\0\0\0\x01x",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["grpc-status"], "3");
    assert!(
        headers["grpc-message"]
            .to_str()
            .unwrap()
            .starts_with("Invalid path")
    );
    assert!(body.is_empty());
    assert_eq!(s.executed.load(Ordering::SeqCst), 0);
    s.shutdown.cancel();
    s.running.wait().await.unwrap();
}
