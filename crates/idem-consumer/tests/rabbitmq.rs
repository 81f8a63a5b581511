//! The RabbitMQ adapter against the broker at `IDEM_TEST_AMQP_URL`
//! (skipped without it, except under CI): manual acks, a prefetch of 32,
//! atomic mode on SQLite with a business table, and the broker's own
//! redelivery when a consumer's channel closes unacknowledged.
//!
//! Every test declares queues of its own (named per run: the broker
//! outlives runs) with an `x-expires` so that a failed run's queues go
//! away by themselves, and deletes them when it passes.

#![allow(clippy::unwrap_used)] // tests: a panic is how a check fails

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use idem_consumer::{
    Action, Claimed, ConsumeError, Consumer, KeySource, Processed, applied, rabbitmq,
};
use idem_core::Scope;
use idem_sqlite::SqliteStore;
use lapin::message::Delivery;
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use rusqlite::params;

/// The prefetch every consumer channel of these tests takes.
const PREFETCH: u16 = 32;
/// How long a test waits for the broker to deliver something it must.
const DELIVERY_DEADLINE: Duration = Duration::from_secs(30);

fn amqp_url() -> Option<String> {
    idem_testkit::backend_url("IDEM_TEST_AMQP_URL", "RabbitMQ")
}

async fn connect(url: &str) -> Connection {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap()
}

/// Declares queue `name`, removed by the broker a minute after its last
/// use if the test does not delete it; `arguments` are added.
async fn declare_queue(channel: &Channel, name: &str, mut arguments: FieldTable) {
    arguments.insert("x-expires".into(), AMQPValue::LongInt(60_000));
    channel
        .queue_declare(name.into(), QueueDeclareOptions::default(), arguments)
        .await
        .unwrap();
}

async fn delete_queues(channel: &Channel, names: &[&str]) {
    for name in names {
        channel
            .queue_delete((*name).into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
}

/// How many messages wait in `queue`, ready (not counting those delivered
/// and not yet acknowledged).
async fn ready(channel: &Channel, queue: &str) -> u32 {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap()
        .message_count()
}

/// A publisher channel with publisher confirms.
async fn publisher(connection: &Connection) -> Channel {
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    channel
}

/// Publishes `payload` as JSON to `exchange` with `routing_key`, under a
/// message id of its own (a producer's retry of the same intent may get a
/// new one: the key is the payload's `/transfer_id`), and waits for the
/// broker's confirm.
async fn publish(channel: &Channel, exchange: &str, routing_key: &str, payload: &str) {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id(format!("publish-{}", SEQ.fetch_add(1, Ordering::Relaxed)).into());
    let confirmation = channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            BasicPublishOptions::default(),
            payload.as_bytes(),
            properties,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirmation.is_ack(), "the broker refused a publish");
}

fn transfer(id: &str, amount: i64) -> String {
    format!(r#"{{"transfer_id":"{id}","amount":{amount}}}"#)
}

/// A consumer channel on `queue`: manual acks, a prefetch of [`PREFETCH`].
async fn subscribe(connection: &Connection, queue: &str) -> (Channel, lapin::Consumer) {
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await
        .unwrap();
    let deliveries = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions {
                no_ack: false,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    (channel, deliveries)
}

/// The next delivery, within [`DELIVERY_DEADLINE`].
async fn next_delivery(deliveries: &mut lapin::Consumer) -> Delivery {
    tokio::time::timeout(DELIVERY_DEADLINE, deliveries.next())
        .await
        .expect("no delivery within the deadline")
        .expect("the consumer was cancelled")
        .unwrap()
}

/// The business side: an SQLite store in a temporary file, with a table
/// `applied` (one row per applied transfer) and one `balances` row that
/// every transfer adds its amount to, both written in the record's
/// transaction.
struct Ledger {
    store: SqliteStore,
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Ledger {
    fn new() -> Ledger {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("consumer.db");
        let store = SqliteStore::open(&path).unwrap();
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(
                "CREATE TABLE applied (transfer_id TEXT NOT NULL, amount INTEGER NOT NULL);
                 CREATE TABLE balances (account TEXT PRIMARY KEY, balance INTEGER NOT NULL);
                 INSERT INTO balances VALUES ('acct', 0);",
            )
            .unwrap();
        Ledger {
            store,
            path,
            _dir: dir,
        }
    }

    fn consumer(&self) -> Consumer {
        Consumer::new(
            Arc::new(self.store.clone()),
            Scope::from_tenant(b"rabbitmq-tests"),
            "apply-transfer",
            KeySource::JsonPointer("/transfer_id".into()),
        )
    }

    /// Runs `delivery` through `consumer` in atomic mode: the transfer's
    /// row, the balance and the record commit together.
    async fn process(
        &self,
        consumer: &Consumer,
        delivery: &Delivery,
    ) -> Result<Processed, ConsumeError<rusqlite::Error>> {
        let message = rabbitmq::message(delivery);
        let store = self.store.clone();
        let payload = message.payload.clone();
        consumer
            .process_atomically(&message, |claimed: Claimed| async move {
                let fields: serde_json::Value = serde_json::from_slice(&payload).unwrap();
                let id = fields["transfer_id"].as_str().unwrap().to_owned();
                let amount = fields["amount"].as_i64().unwrap();
                store
                    .complete_atomically(claimed.id(), claimed.fence(), move |conn| {
                        conn.execute(
                            "INSERT INTO applied (transfer_id, amount) VALUES (?1, ?2)",
                            params![id, amount],
                        )?;
                        conn.execute(
                            "UPDATE balances SET balance = balance + ?1 WHERE account = 'acct'",
                            params![amount],
                        )?;
                        let result = format!("applied {id}").into_bytes();
                        Ok::<_, rusqlite::Error>((result.clone(), applied(result)))
                    })
                    .await
            })
            .await
    }

    fn query_i64(&self, sql: &str) -> i64 {
        rusqlite::Connection::open(&self.path)
            .unwrap()
            .query_row(sql, [], |r| r.get(0))
            .unwrap()
    }

    /// (applied rows, distinct transfers among them, the balance).
    fn totals(&self) -> (i64, i64, i64) {
        (
            self.query_i64("SELECT count(*) FROM applied"),
            self.query_i64("SELECT count(DISTINCT transfer_id) FROM applied"),
            self.query_i64("SELECT balance FROM balances WHERE account = 'acct'"),
        )
    }

    fn rows_of(&self, transfer_id: &str) -> i64 {
        rusqlite::Connection::open(&self.path)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM applied WHERE transfer_id = ?1",
                [transfer_id],
                |r| r.get(0),
            )
            .unwrap()
    }
}

/// What a consumer loop saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    applied: u32,
    duplicates: u32,
    rejected: u32,
    /// Requeued with `basic.nack` (another consumer held the claim...).
    requeued: u32,
}

impl Tally {
    /// Deliveries settled for good (acknowledged or rejected).
    fn settled(&self) -> u32 {
        self.applied + self.duplicates + self.rejected
    }
}

/// Consumes from `deliveries` until `settled` deliveries were settled for
/// good, processing each in atomic mode and settling it as its outcome
/// says.
async fn consume(
    ledger: &Ledger,
    consumer: &Consumer,
    deliveries: &mut lapin::Consumer,
    settled: u32,
) -> Tally {
    let mut tally = Tally::default();
    while tally.settled() < settled {
        let delivery = next_delivery(deliveries).await;
        let outcome = ledger.process(consumer, &delivery).await;
        let action = match &outcome {
            Ok(Processed::Applied(_)) => {
                tally.applied += 1;
                Action::Ack
            }
            Ok(processed @ Processed::Duplicate(_)) => {
                tally.duplicates += 1;
                processed.action()
            }
            Ok(Processed::Refused(reason)) => {
                panic!("nothing is refused here: {reason:?}")
            }
            Err(e) => {
                match e.action() {
                    Action::Reject => tally.rejected += 1,
                    Action::Redeliver { .. } => tally.requeued += 1,
                    Action::Ack => {}
                }
                e.action()
            }
        };
        rabbitmq::settle(&delivery, action).await.unwrap();
    }
    tally
}

#[tokio::test]
async fn a_real_delivery_maps_to_its_message() {
    let Some(url) = amqp_url() else { return };
    let connection = connect(&url).await;
    let admin = connection.create_channel().await.unwrap();
    let queue = idem_testkit::unique_name("map");
    declare_queue(&admin, &queue, FieldTable::default()).await;

    let mut headers = FieldTable::default();
    headers.insert("transfer-id".into(), AMQPValue::LongString("t-42".into()));
    headers.insert("attempt".into(), AMQPValue::LongInt(2));
    headers.insert(
        "raw".into(),
        AMQPValue::LongString(LongString::from(vec![0xff_u8])),
    );
    let properties = BasicProperties::default()
        .with_message_id("producer-id-1".into())
        .with_content_type("application/json".into())
        .with_headers(headers);
    let publishing = publisher(&connection).await;
    publishing
        .basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            br#"{"amount": 1}"#,
            properties,
        )
        .await
        .unwrap()
        .await
        .unwrap();

    let (channel, mut deliveries) = subscribe(&connection, &queue).await;
    let delivery = next_delivery(&mut deliveries).await;
    let message = rabbitmq::message(&delivery);
    assert_eq!(message.id.as_deref(), Some("producer-id-1"));
    assert_eq!(message.content_type.as_deref(), Some("application/json"));
    assert_eq!(&message.payload[..], br#"{"amount": 1}"#);
    assert_eq!(
        message.headers,
        vec![("transfer-id".to_owned(), "t-42".to_owned())],
        "only UTF-8 string headers"
    );
    assert_eq!(
        KeySource::Header("Transfer-Id".into())
            .key_of(&message)
            .unwrap()
            .as_str(),
        "t-42"
    );
    rabbitmq::settle(&delivery, Action::Ack).await.unwrap();
    channel.close(200, "done".into()).await.unwrap();
    assert_eq!(ready(&admin, &queue).await, 0, "acknowledged for good");
    delete_queues(&admin, &[&queue]).await;
}

#[tokio::test]
async fn duplicates_published_on_purpose_apply_once_and_every_delivery_is_acked() {
    let Some(url) = amqp_url() else { return };
    let connection = connect(&url).await;
    let admin = connection.create_channel().await.unwrap();
    let queue = idem_testkit::unique_name("duplicates");
    declare_queue(&admin, &queue, FieldTable::default()).await;

    // 200 transfers; every fourth is published twice by its producer, the
    // second time after later ones.
    let transfers: Vec<(String, i64)> = (0..200).map(|i| (format!("t-{i}"), i + 1)).collect();
    let publishing = publisher(&connection).await;
    let mut published = 0;
    for (i, (id, amount)) in transfers.iter().enumerate() {
        publish(&publishing, "", &queue, &transfer(id, *amount)).await;
        published += 1;
        if i % 4 == 3 {
            let (again, amount) = &transfers[i - 2];
            publish(&publishing, "", &queue, &transfer(again, *amount)).await;
            published += 1;
        }
    }
    assert_eq!(published, 250);

    let ledger = Ledger::new();
    let consumer = ledger.consumer();
    let (channel, mut deliveries) = subscribe(&connection, &queue).await;
    let tally = consume(&ledger, &consumer, &mut deliveries, published).await;
    assert_eq!(
        tally,
        Tally {
            applied: 200,
            duplicates: 50,
            rejected: 0,
            requeued: 0
        }
    );
    let expected_balance: i64 = transfers.iter().map(|(_, a)| a).sum();
    assert_eq!(ledger.totals(), (200, 200, expected_balance));

    // Closing the channel would requeue anything unacknowledged: nothing is.
    channel.close(200, "done".into()).await.unwrap();
    assert_eq!(ready(&admin, &queue).await, 0, "every delivery was acked");
    delete_queues(&admin, &[&queue]).await;
}

#[tokio::test]
async fn a_channel_closed_unacknowledged_gets_its_message_redelivered_and_applied_once() {
    let Some(url) = amqp_url() else { return };
    let connection = connect(&url).await;
    let admin = connection.create_channel().await.unwrap();
    let queue = idem_testkit::unique_name("redelivery");
    declare_queue(&admin, &queue, FieldTable::default()).await;
    let publishing = publisher(&connection).await;
    let ledger = Ledger::new();
    let consumer = ledger.consumer();

    // 1. A consumer takes the message and closes its channel without
    //    settling it (nor running the effect): the broker redelivers it to
    //    the next consumer, which applies it.
    publish(&publishing, "", &queue, &transfer("t-taken", 10)).await;
    let (first, mut deliveries) = subscribe(&connection, &queue).await;
    let taken = next_delivery(&mut deliveries).await;
    assert!(!taken.redelivered);
    first.close(200, "gone".into()).await.unwrap();

    let (second, mut deliveries) = subscribe(&connection, &queue).await;
    let again = next_delivery(&mut deliveries).await;
    assert!(again.redelivered, "the broker marks the redelivery");
    assert_eq!(rabbitmq::message(&again), rabbitmq::message(&taken));
    let outcome = ledger.process(&consumer, &again).await.unwrap();
    assert!(matches!(outcome, Processed::Applied(_)), "{outcome:?}");
    rabbitmq::settle(&again, outcome.action()).await.unwrap();
    second.close(200, "done".into()).await.unwrap();
    assert_eq!(ledger.rows_of("t-taken"), 1);

    // 2. A consumer commits the effect and dies before its ack: its
    //    connection goes, the broker redelivers, and the next consumer
    //    acknowledges it as a duplicate without applying it again.
    publish(&publishing, "", &queue, &transfer("t-ack-lost", 20)).await;
    let dying = connect(&url).await;
    let (_channel, mut deliveries) = subscribe(&dying, &queue).await;
    let delivery = next_delivery(&mut deliveries).await;
    let outcome = ledger.process(&consumer, &delivery).await.unwrap();
    assert!(matches!(outcome, Processed::Applied(_)), "{outcome:?}");
    assert_eq!(ledger.rows_of("t-ack-lost"), 1);
    dying
        .close(320, "crashed before the ack".into())
        .await
        .unwrap();

    let (third, mut deliveries) = subscribe(&connection, &queue).await;
    let redelivered = next_delivery(&mut deliveries).await;
    assert!(redelivered.redelivered);
    let outcome = ledger.process(&consumer, &redelivered).await.unwrap();
    assert_eq!(
        outcome,
        Processed::Duplicate(b"applied t-ack-lost".to_vec()),
        "the stored result, not a second run"
    );
    rabbitmq::settle(&redelivered, outcome.action())
        .await
        .unwrap();
    third.close(200, "done".into()).await.unwrap();

    assert_eq!(ledger.rows_of("t-ack-lost"), 1, "applied once");
    assert_eq!(ledger.totals(), (2, 2, 30));
    assert_eq!(ready(&admin, &queue).await, 0, "both acked for good");
    // A delivery whose channel closed cannot be settled any more (the
    // broker has requeued it already).
    assert!(rabbitmq::settle(&delivery, Action::Ack).await.is_err());
    delete_queues(&admin, &[&queue]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_on_one_store_racing_on_the_same_messages_apply_each_once() {
    let Some(url) = amqp_url() else { return };
    let connection = connect(&url).await;
    let admin = connection.create_channel().await.unwrap();
    // A fanout exchange gives every message to both consumers' queues.
    let exchange = idem_testkit::unique_name("race");
    admin
        .exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                auto_delete: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let queues = [
        idem_testkit::unique_name("race-a"),
        idem_testkit::unique_name("race-b"),
    ];
    for queue in &queues {
        declare_queue(&admin, queue, FieldTable::default()).await;
        admin
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }

    // 100 transfers, every fifth published twice: 120 deliveries per queue.
    let publishing = publisher(&connection).await;
    let mut published = 0;
    for i in 0..100_i64 {
        publish(&publishing, &exchange, "", &transfer(&format!("r-{i}"), i)).await;
        published += 1;
        if i % 5 == 4 {
            publish(&publishing, &exchange, "", &transfer(&format!("r-{i}"), i)).await;
            published += 1;
        }
    }

    // One store, shared by two consumers, each with its own connection,
    // channel and Consumer value.
    let ledger = Arc::new(Ledger::new());
    let mut tasks = Vec::new();
    for queue in &queues {
        let (ledger, queue, url) = (ledger.clone(), queue.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let connection = connect(&url).await;
            let consumer = ledger.consumer();
            let (channel, mut deliveries) = subscribe(&connection, &queue).await;
            let tally = consume(&ledger, &consumer, &mut deliveries, published).await;
            channel.close(200, "done".into()).await.unwrap();
            tally
        }));
    }
    let mut total = Tally::default();
    for task in tasks {
        let tally = task.await.unwrap();
        assert_eq!(tally.rejected, 0);
        assert_eq!(tally.applied + tally.duplicates, published);
        total.applied += tally.applied;
        total.duplicates += tally.duplicates;
        total.requeued += tally.requeued;
    }
    eprintln!(
        "race: {} applied, {} duplicates, {} requeued while the other held the claim",
        total.applied, total.duplicates, total.requeued
    );
    assert_eq!(total.applied, 100, "each transfer applied by one consumer");
    assert_eq!(total.duplicates, 2 * published - 100);
    let expected_balance: i64 = (0..100).sum();
    assert_eq!(ledger.totals(), (100, 100, expected_balance));
    for queue in &queues {
        assert_eq!(ready(&admin, queue).await, 0);
    }
    delete_queues(&admin, &[&queues[0], &queues[1]]).await;
}

#[tokio::test]
async fn poison_messages_are_rejected_to_the_dead_letter_queue_and_never_applied() {
    let Some(url) = amqp_url() else { return };
    let connection = connect(&url).await;
    let admin = connection.create_channel().await.unwrap();
    let queue = idem_testkit::unique_name("poison");
    let dead_letters = idem_testkit::unique_name("poison-dlq");
    declare_queue(&admin, &dead_letters, FieldTable::default()).await;
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    arguments.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(dead_letters.as_str().into()),
    );
    declare_queue(&admin, &queue, arguments).await;

    let good = transfer("t-good", 10);
    let poison = [
        r#"{"amount":5}"#.to_owned(), // no /transfer_id
        transfer("t-good", 999),      // the key reused with another amount
        "not json".to_owned(),        // no key either
    ];
    let publishing = publisher(&connection).await;
    publish(&publishing, "", &queue, &good).await;
    for p in &poison {
        publish(&publishing, "", &queue, p).await;
    }

    let ledger = Ledger::new();
    let consumer = ledger.consumer();
    let (channel, mut deliveries) = subscribe(&connection, &queue).await;
    let tally = consume(&ledger, &consumer, &mut deliveries, 4).await;
    assert_eq!(
        tally,
        Tally {
            applied: 1,
            duplicates: 0,
            rejected: 3,
            requeued: 0
        }
    );
    channel.close(200, "done".into()).await.unwrap();
    assert_eq!(ledger.totals(), (1, 1, 10), "the poison was never applied");
    assert_eq!(ready(&admin, &queue).await, 0, "not requeued");

    // The rejected messages are in the dead-letter queue (dead-lettering
    // is asynchronous: poll with a deadline), once each.
    let deadline = tokio::time::Instant::now() + DELIVERY_DEADLINE;
    let mut dead = BTreeSet::new();
    while dead.len() < poison.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "dead letters so far: {dead:?}"
        );
        match admin
            .basic_get(
                dead_letters.as_str().into(),
                BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap()
        {
            Some(m) => {
                assert!(dead.insert(String::from_utf8(m.delivery.data).unwrap()));
            }
            None => tokio::task::yield_now().await,
        }
    }
    assert_eq!(dead, poison.iter().cloned().collect::<BTreeSet<_>>());
    assert_eq!(ready(&admin, &dead_letters).await, 0);
    delete_queues(&admin, &[&queue, &dead_letters]).await;
}
