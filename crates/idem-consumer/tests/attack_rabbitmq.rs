//! Review of issue 14's RabbitMQ adapter (attack tests), against the broker
//! at `IDEM_TEST_AMQP_URL`: a message whose claim another consumer holds
//! is answered `InFlight`, `Redeliver { after }`, and `settle` requeues it
//! at once, ignoring `after`.
#![cfg(feature = "rabbitmq")]
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use idem_consumer::{ConsumeError, Consumer, Failure, KeySource, Message, Processed, rabbitmq};
use idem_core::{MemoryStore, Policy, Scope};
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

const PAYLOAD: &str = r#"{"transfer_id":"t-held","amount":5}"#;

fn consumer(store: Arc<MemoryStore>, lease: Duration) -> Consumer {
    Consumer::new(
        store,
        Scope::from_tenant(b"attack-14-amqp"),
        "apply-transfer",
        KeySource::JsonPointer("/transfer_id".into()),
    )
    .policy(Policy::builder().lease(lease).build().unwrap())
}

/// A queue of this run with `arguments`, one message published to it, and
/// a consumer channel (manual acks, prefetch 32) on it.
async fn setup(
    url: &str,
    tag: &str,
    mut arguments: FieldTable,
) -> (Channel, lapin::Consumer, String) {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let queue = idem_testkit::unique_name(tag);
    arguments.insert("x-expires".into(), AMQPValue::LongInt(60_000));
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await
        .unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    channel
        .basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            PAYLOAD.as_bytes(),
            BasicProperties::default().with_content_type("application/json".into()),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    channel
        .basic_qos(32, BasicQosOptions::default())
        .await
        .unwrap();
    let deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    (channel, deliveries, queue)
}

/// Takes the message's claim in another consumer whose effect never ends,
/// then abandons it (that consumer died): the claim stays for its lease.
async fn hold_claim(holder: Consumer) {
    let (started, claimed) = tokio::sync::oneshot::channel();
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
}

/// Runs deliveries through `consumer` and `rabbitmq::settle` until
/// `deadline`, or until none comes for `quiet`; counts the deliveries and
/// the effect's runs.
async fn consume(
    consumer: &Consumer,
    deliveries: &mut lapin::Consumer,
    deadline: Instant,
    quiet: Duration,
    runs: &AtomicU64,
) -> u64 {
    let mut delivered = 0;
    while Instant::now() < deadline {
        let Ok(Some(delivery)) = tokio::time::timeout(quiet, deliveries.next()).await else {
            break;
        };
        let delivery = delivery.unwrap();
        delivered += 1;
        let out = consumer
            .process(&rabbitmq::message(&delivery), |_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Failure<&str>>(b"applied".to_vec())
            })
            .await;
        let action = match &out {
            Ok(p) => p.action(),
            Err(e) => e.action(),
        };
        rabbitmq::settle(&delivery, action).await.unwrap();
        if matches!(out, Ok(Processed::Applied(_))) {
            break;
        }
        assert!(matches!(out, Err(ConsumeError::InFlight { .. })), "{out:?}");
    }
    delivered
}

/// The claim is held for 30 s; `InFlight` says "look again within 1 s",
/// but the requeue is immediate: one message cycles between the broker,
/// the consumer and the store as fast as they go.
#[tokio::test]
async fn a_message_held_elsewhere_does_not_cycle() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_AMQP_URL", "RabbitMQ") else {
        return;
    };
    let store = Arc::new(MemoryStore::new());
    hold_claim(consumer(store.clone(), Duration::from_secs(30))).await;
    let (channel, mut deliveries, queue) = setup(&url, "attack_cycle", FieldTable::default()).await;
    let runs = AtomicU64::new(0);
    let c = consumer(store, Duration::from_secs(30));
    let window = Duration::from_secs(1);
    let delivered = consume(&c, &mut deliveries, Instant::now() + window, window, &runs).await;
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    assert!(
        delivered <= 3,
        "one held message was delivered {delivered} times in {window:?}"
    );
}

/// A quorum queue with a delivery limit (RabbitMQ 4's default is 20): the
/// immediate requeues of `InFlight` use it up in milliseconds while the
/// claim's dead holder still has its lease, and the broker drops the
/// message. When the lease ends, nothing is left to apply: lost.
#[tokio::test]
async fn a_message_held_elsewhere_survives_a_delivery_limit() {
    let Some(url) = idem_testkit::backend_url("IDEM_TEST_AMQP_URL", "RabbitMQ") else {
        return;
    };
    let lease = Duration::from_secs(2);
    let store = Arc::new(MemoryStore::new());
    hold_claim(consumer(store.clone(), lease)).await;
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    arguments.insert("x-delivery-limit".into(), AMQPValue::LongInt(5));
    let (channel, mut deliveries, queue) = setup(&url, "attack_limit", arguments).await;
    let runs = AtomicU64::new(0);
    let c = consumer(store, lease);
    // Until the holder's lease has ended and a delivery applied it, or
    // nothing came for longer than the lease.
    let delivered = consume(
        &c,
        &mut deliveries,
        Instant::now() + lease * 5,
        lease * 2,
        &runs,
    )
    .await;
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the message was lost after {delivered} deliveries while another consumer's lease ran"
    );
}
