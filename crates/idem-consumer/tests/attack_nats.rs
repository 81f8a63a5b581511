//! Review of issue 14's NATS adapter (attack tests), against the server at
//! `IDEM_TEST_NATS_URL`: a message whose claim a dead consumer holds is
//! negatively acknowledged every second (`IN_FLIGHT_RECHECK`) for the
//! whole lease, and each `-NAK` is a delivery `max_deliver` counts.
#![cfg(feature = "nats")]
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer::pull, stream};
use futures_util::StreamExt;
use idem_consumer::{ConsumeError, Consumer, Failure, KeySource, Message, Processed, nats};
use idem_core::{MemoryStore, Policy, Scope};

const PAYLOAD: &str = r#"{"transfer_id":"t-held","amount":5}"#;

fn consumer(store: Arc<MemoryStore>, lease: Duration) -> Consumer {
    Consumer::new(
        store,
        Scope::from_tenant(b"attack-14-nats"),
        "apply-transfer",
        KeySource::JsonPointer("/transfer_id".into()),
    )
    .policy(Policy::builder().lease(lease).build().unwrap())
}

/// A durable with `max_deliver: 3` (the module docs: "bound it
/// generously", counted in ack waits) and an ack wait longer than the
/// test: every redelivery below is a `-NAK`'s. The holder of the claim
/// died with a 4 s lease; `InFlight` naks with a 1 s delay, so the third
/// delivery comes at 2 s and the server gives up on the message before
/// the lease ends. Nothing applies it afterwards: lost.
#[tokio::test]
async fn a_message_held_by_a_dead_consumer_outlives_max_deliver() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_NATS_URL", "NATS JetStream") else {
        return;
    };
    let lease = Duration::from_secs(4);
    let store = Arc::new(MemoryStore::new());

    // The dead holder: claimed, effect never finished.
    let (started, claimed) = tokio::sync::oneshot::channel();
    let holder = consumer(store.clone(), lease);
    let task = tokio::spawn(async move {
        let message = Message::new(PAYLOAD).with_content_type("application/json");
        let _ = holder
            .process(&message, |_| async move {
                let _ = started.send(());
                futures_util::future::pending::<Result<Vec<u8>, Failure<&str>>>().await
            })
            .await;
    });
    claimed.await.unwrap();
    task.abort();

    let js = jetstream::new(async_nats::connect(&url).await.unwrap());
    let name = idem_testkit::unique_name("attack_max_deliver");
    let subject = format!("{name}.transfers");
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::Memory,
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("Content-Type", "application/json");
    js.publish_with_headers(subject, headers, PAYLOAD.into())
        .await
        .unwrap()
        .await
        .unwrap();
    let durable = stream
        .create_consumer(pull::Config {
            durable_name: Some(name.clone()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(60),
            max_deliver: 3,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = durable.messages().await.unwrap();

    let c = consumer(store, lease);
    let runs = AtomicU64::new(0);
    let mut delivered = 0;
    let deadline = Instant::now() + lease * 3;
    while Instant::now() < deadline {
        let Ok(Some(delivery)) =
            tokio::time::timeout(lease + Duration::from_secs(2), messages.next()).await
        else {
            break;
        };
        let delivery = delivery.unwrap();
        delivered += 1;
        let out = c
            .process(&nats::message(&delivery), |_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Failure<&str>>(b"applied".to_vec())
            })
            .await;
        let action = match &out {
            Ok(p) => p.action(),
            Err(e) => e.action(),
        };
        nats::settle(&delivery, action).await.unwrap();
        if matches!(out, Ok(Processed::Applied(_))) {
            break;
        }
        assert!(matches!(out, Err(ConsumeError::InFlight { .. })), "{out:?}");
    }
    let _ = js.delete_stream(&name).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the message was lost after {delivered} deliveries while a dead consumer's lease ran"
    );
}
