//! The NATS JetStream adapter against the server at `IDEM_TEST_NATS_URL`
//! (skipped without it, except under CI): durable pull consumers with
//! explicit acks and a 1 s ack wait, atomic mode on SQLite with a business
//! table, and JetStream's own redelivery of what was not settled.
//!
//! Every test creates a stream of its own in memory (named per run: the
//! server outlives runs), and deletes it when it ends, passed or failed.
//!
//! JetStream drops a second publish with a `Nats-Msg-Id` it saw in its
//! duplicate window, so the duplicates published on purpose here carry no
//! `Nats-Msg-Id`, or another one: those reach the consumer, and the record,
//! keyed by the payload's `/transfer_id`, is what applies them once.

#![allow(clippy::unwrap_used)] // tests: a panic is how a check fails

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer::PullConsumer, consumer::pull, stream};
use futures_util::StreamExt;
use idem_consumer::{Action, Claimed, ConsumeError, Consumer, KeySource, Processed, applied, nats};
use idem_core::{Policy, Scope, Store};
use idem_sqlite::SqliteStore;
use idem_testkit::CleanupOnDrop;
use rusqlite::params;

/// The durable consumers' ack wait: an unsettled delivery comes back after it.
const ACK_WAIT: Duration = Duration::from_secs(1);
/// How long a test waits for the server to deliver what it must.
const DEADLINE: Duration = Duration::from_secs(30);

fn nats_url() -> Option<String> {
    idem_testkit::backend_url("IDEM_TEST_NATS_URL", "NATS JetStream")
}

/// A stream of the test's own, deleted when this is dropped.
struct TestStream {
    js: jetstream::Context,
    name: String,
    subject: String,
    _cleanup: CleanupOnDrop,
}

impl TestStream {
    async fn create(url: &str, tag: &str) -> TestStream {
        let js = jetstream::new(async_nats::connect(url).await.unwrap());
        let name = idem_testkit::unique_name(tag);
        let subject = format!("{name}.transfers");
        js.create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::Memory,
            // A run that dies before its clean-up leaves little behind.
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .unwrap();
        // The test's client is gone with its runtime by the time this runs.
        let (url, stream) = (url.to_owned(), name.clone());
        let cleanup = CleanupOnDrop::new(move || async move {
            if let Ok(client) = async_nats::connect(url).await {
                let _ = jetstream::new(client).delete_stream(stream).await;
            }
        });
        TestStream {
            js,
            name,
            subject,
            _cleanup: cleanup,
        }
    }

    /// Publishes `payload` as JSON, with `msg_id` as its `Nats-Msg-Id` if
    /// given; answers whether the stream dropped it as a duplicate.
    async fn publish(&self, payload: String, msg_id: Option<&str>) -> bool {
        let mut headers = HeaderMap::new();
        headers.insert("Content-Type", "application/json");
        if let Some(id) = msg_id {
            headers.insert("Nats-Msg-Id", id);
        }
        let ack = self
            .js
            .publish_with_headers(self.subject.clone(), headers, payload.into())
            .await
            .unwrap()
            .await
            .unwrap();
        ack.duplicate
    }

    async fn len(&self) -> u64 {
        let mut stream = self.js.get_stream(&self.name).await.unwrap();
        stream.info().await.unwrap().state.messages
    }

    /// A durable pull consumer with explicit acks and a 1 s ack wait, on a
    /// connection of its own (as a consumer process has).
    async fn durable(&self, url: &str, name: &str) -> PullConsumer {
        let js = jetstream::new(async_nats::connect(url).await.unwrap());
        js.get_stream(&self.name)
            .await
            .unwrap()
            .get_or_create_consumer(
                name,
                pull::Config {
                    durable_name: Some(name.to_owned()),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: ACK_WAIT,
                    ..Default::default()
                },
            )
            .await
            .unwrap()
    }
}

fn transfer(id: &str, amount: i64) -> String {
    format!(r#"{{"transfer_id":"{id}","amount":{amount}}}"#)
}

/// The business database: the store's SQLite file, with a table of applied
/// transfers that the effect writes in the record's transaction.
struct Ledger {
    _dir: tempfile::TempDir,
    path: PathBuf,
    store: Arc<SqliteStore>,
}

impl Ledger {
    fn open() -> Ledger {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        // The store creates the file; the business table joins it.
        let store = Arc::new(SqliteStore::open(&path).unwrap());
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(
                "CREATE TABLE applied (transfer_id TEXT NOT NULL, amount INTEGER NOT NULL);",
            )
            .unwrap();
        Ledger {
            _dir: dir,
            path,
            store,
        }
    }

    fn consumer(&self, policy: Policy) -> Consumer {
        Consumer::new(
            self.store.clone() as Arc<dyn Store>,
            Scope::from_tenant(b"payments"),
            "apply-transfer",
            KeySource::JsonPointer("/transfer_id".into()),
        )
        .policy(policy)
    }

    /// How many times each transfer was applied, and with what amounts.
    fn applied(&self) -> BTreeMap<String, Vec<i64>> {
        let conn = rusqlite::Connection::open(&self.path).unwrap();
        let mut query = conn
            .prepare("SELECT transfer_id, amount FROM applied ORDER BY rowid")
            .unwrap();
        let mut applied = BTreeMap::<String, Vec<i64>>::new();
        for row in query
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .unwrap()
        {
            let (id, amount) = row.unwrap();
            applied.entry(id).or_default().push(amount);
        }
        applied
    }
}

type Outcome = Result<Processed, ConsumeError<rusqlite::Error>>;

/// Atomic mode: the transfer's row and its record commit together.
async fn apply(
    consumer: &Consumer,
    store: &Arc<SqliteStore>,
    delivery: &jetstream::Message,
) -> Outcome {
    let message = nats::message(delivery);
    let amount = serde_json::from_slice::<serde_json::Value>(&message.payload)
        .ok()
        .and_then(|v| v["amount"].as_i64())
        .unwrap_or(0);
    let store = store.clone();
    consumer
        .process_atomically(&message, move |claimed: Claimed| async move {
            let transfer = claimed.id().key.as_str().to_owned();
            store
                .complete_atomically(claimed.id(), claimed.fence(), move |conn| {
                    conn.execute(
                        "INSERT INTO applied (transfer_id, amount) VALUES (?1, ?2)",
                        params![transfer, amount],
                    )?;
                    Ok((b"applied".to_vec(), applied(b"applied".to_vec())))
                })
                .await
        })
        .await
}

fn action(outcome: &Outcome) -> Action {
    match outcome {
        Ok(processed) => processed.action(),
        Err(e) => e.action(),
    }
}

/// What a consumer saw, by outcome.
#[derive(Debug, Default)]
struct Tally {
    applied: usize,
    duplicate: usize,
    in_flight: usize,
    rejected: usize,
    /// Everything else (store errors, lost leases), with its text.
    other: Vec<String>,
}

impl Tally {
    fn count(&mut self, outcome: &Outcome) {
        match outcome {
            Ok(Processed::Applied(_)) => self.applied += 1,
            Ok(Processed::Duplicate(_)) => self.duplicate += 1,
            Err(ConsumeError::InFlight { .. }) => self.in_flight += 1,
            Err(ConsumeError::NoKey(_) | ConsumeError::KeyReused) => self.rejected += 1,
            other => self.other.push(format!("{other:?}")),
        }
    }
}

/// Whether `durable` has nothing left to deliver and nothing out unsettled.
async fn drained(durable: &mut PullConsumer) -> bool {
    let info = durable.info().await.unwrap();
    info.num_pending == 0 && info.num_ack_pending == 0
}

/// Consumes from `durable` in atomic mode, settling every delivery as the
/// consumer says, until the durable is drained; `inspect` sees each
/// delivery and its message first. Fails the test past the deadline.
async fn consume_all(
    durable: &mut PullConsumer,
    consumer: &Consumer,
    store: &Arc<SqliteStore>,
    mut inspect: impl FnMut(&jetstream::Message),
) -> Tally {
    let mut tally = Tally::default();
    let start = Instant::now();
    while !drained(durable).await {
        assert!(start.elapsed() < DEADLINE, "not drained in time: {tally:?}");
        let mut batch = durable
            .batch()
            .max_messages(64)
            .expires(Duration::from_millis(300))
            .messages()
            .await
            .unwrap();
        while let Some(delivery) = batch.next().await {
            let delivery = delivery.unwrap();
            inspect(&delivery);
            let outcome = apply(consumer, store, &delivery).await;
            tally.count(&outcome);
            nats::settle(&delivery, action(&outcome)).await.unwrap();
        }
    }
    tally
}

/// Fetches from `durable` until a batch has something or the deadline
/// passes: waits for the server's redelivery after the ack wait.
async fn next_batch(durable: &PullConsumer, at_least: usize) -> Vec<jetstream::Message> {
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < at_least {
        assert!(
            start.elapsed() < DEADLINE,
            "only {} of {at_least} delivered",
            got.len()
        );
        let mut batch = durable
            .batch()
            .max_messages(at_least - got.len())
            .expires(Duration::from_millis(300))
            .messages()
            .await
            .unwrap();
        while let Some(delivery) = batch.next().await {
            got.push(delivery.unwrap());
        }
    }
    got
}

fn short_lease() -> Policy {
    // No longer than the ack wait (see the module docs).
    Policy::builder().lease(ACK_WAIT).build().unwrap()
}

/// Producers publish a third of the transfers twice without a
/// `Nats-Msg-Id` and a third twice under two ids; the last third twice
/// under one id, which JetStream itself drops. Every transfer is applied
/// once, every delivery acknowledged.
#[tokio::test]
async fn duplicates_published_on_purpose_are_applied_once_and_all_acked() {
    let Some(url) = nats_url() else { return };
    let stream = TestStream::create(&url, "dups").await;
    const TRANSFERS: i64 = 120;
    let mut published_twice = 0;
    for i in 0..TRANSFERS {
        let id = format!("t-{i}");
        let payload = transfer(&id, i + 1);
        match i % 3 {
            0 => {
                assert!(!stream.publish(payload.clone(), None).await);
                assert!(!stream.publish(payload, None).await);
                published_twice += 1;
            }
            1 => {
                let (first, retry) = (format!("{id}-first"), format!("{id}-retry"));
                assert!(!stream.publish(payload.clone(), Some(&first)).await);
                assert!(!stream.publish(payload, Some(&retry)).await);
                published_twice += 1;
            }
            _ => {
                let once = format!("{id}-once");
                assert!(!stream.publish(payload.clone(), Some(&once)).await);
                // JetStream's duplicate window: never reaches a consumer.
                assert!(stream.publish(payload, Some(&once)).await);
            }
        }
    }
    let stored = stream.len().await;
    assert_eq!(stored, (TRANSFERS + published_twice) as u64);

    let ledger = Ledger::open();
    let consumer = ledger.consumer(Policy::default());
    let mut durable = stream.durable(&url, "apply").await;
    let mut with_id = 0;
    let tally = consume_all(&mut durable, &consumer, &ledger.store, |d| {
        let m = nats::message(d);
        assert_eq!(m.content_type.as_deref(), Some("application/json"));
        with_id += usize::from(m.id.is_some());
        // Nothing here is redelivered: every delivery is settled in time.
        assert_eq!(d.info().unwrap().delivered, 1);
    })
    .await;

    assert_eq!(tally.applied, TRANSFERS as usize, "{tally:?}");
    assert_eq!(tally.duplicate, published_twice as usize, "{tally:?}");
    assert!(tally.other.is_empty() && tally.rejected == 0, "{tally:?}");
    assert_eq!(with_id as i64, 2 * (TRANSFERS / 3) + TRANSFERS / 3);
    let applied = ledger.applied();
    assert_eq!(applied.len(), TRANSFERS as usize);
    for i in 0..TRANSFERS {
        assert_eq!(applied[&format!("t-{i}")], vec![i + 1], "t-{i}");
    }
    // Every delivery acknowledged: the ack floor is the stream's end.
    let info = durable.info().await.unwrap();
    assert_eq!(info.num_ack_pending, 0);
    assert_eq!(info.num_pending, 0);
    assert_eq!(info.ack_floor.stream_sequence, stored);
    assert_eq!(info.delivered.stream_sequence, stored);
}

/// A consumer takes two messages and settles neither: it never processes
/// the first, and commits the second's effect but dies before its ack. The
/// server delivers both again after the ack wait; a second consumer
/// applies the first and acknowledges the second as a duplicate.
#[tokio::test]
async fn unsettled_deliveries_come_back_after_the_ack_wait_and_apply_once() {
    let Some(url) = nats_url() else { return };
    let stream = TestStream::create(&url, "redeliver").await;
    stream.publish(transfer("t-held", 10), None).await;
    stream.publish(transfer("t-committed", 20), None).await;
    let ledger = Ledger::open();

    {
        let consumer = ledger.consumer(short_lease());
        let first = stream.durable(&url, "apply").await;
        let taken = next_batch(&first, 2).await;
        assert_eq!(nats::message(&taken[0]).payload, transfer("t-held", 10));
        let committed = apply(&consumer, &ledger.store, &taken[1]).await;
        assert!(
            matches!(committed, Ok(Processed::Applied(_))),
            "{committed:?}"
        );
        // The process dies here: no settle for either, its connection goes.
    }
    assert_eq!(ledger.applied().len(), 1);

    let consumer = ledger.consumer(short_lease());
    let mut second = stream.durable(&url, "apply").await;
    let again = next_batch(&second, 2).await;
    let mut outcomes = BTreeMap::new();
    for delivery in &again {
        assert_eq!(delivery.info().unwrap().delivered, 2, "a redelivery");
        let outcome = apply(&consumer, &ledger.store, delivery).await;
        nats::settle(delivery, action(&outcome)).await.unwrap();
        let key = consumer_key(delivery);
        outcomes.insert(key, outcome.unwrap());
    }
    assert_eq!(outcomes["t-held"], Processed::Applied(b"applied".to_vec()));
    assert_eq!(
        outcomes["t-committed"],
        Processed::Duplicate(b"applied".to_vec())
    );
    let applied = ledger.applied();
    assert_eq!(applied["t-held"], vec![10]);
    assert_eq!(applied["t-committed"], vec![20]);
    assert!(drained(&mut second).await);
}

fn consumer_key(delivery: &jetstream::Message) -> String {
    KeySource::JsonPointer("/transfer_id".into())
        .key_of(&nats::message(delivery))
        .unwrap()
        .as_str()
        .to_owned()
}

/// Two consumers on one shared store, each on a durable of its own over
/// the same stream (so each gets every message, duplicates included), race
/// on every transfer: one applies it, the other is told it is a duplicate
/// or in flight (negatively acknowledged with a delay, then a duplicate).
/// One effect each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_on_one_store_race_and_apply_each_transfer_once() {
    let Some(url) = nats_url() else { return };
    let stream = TestStream::create(&url, "race").await;
    const TRANSFERS: i64 = 80;
    for i in 0..TRANSFERS {
        stream
            .publish(transfer(&format!("t-{i}"), i + 1), None)
            .await;
        if i % 4 == 0 {
            stream
                .publish(transfer(&format!("t-{i}"), i + 1), None)
                .await;
        }
    }
    let stored = stream.len().await as usize;
    let ledger = Ledger::open();

    let mut racers = Vec::new();
    for name in ["left", "right"] {
        let mut durable = stream.durable(&url, name).await;
        let consumer = ledger.consumer(short_lease());
        let store = ledger.store.clone();
        racers.push(tokio::spawn(async move {
            consume_all(&mut durable, &consumer, &store, |_| {}).await
        }));
    }
    let mut total = Tally::default();
    for racer in racers {
        let tally = racer.await.unwrap();
        assert!(tally.other.is_empty(), "{tally:?}");
        total.applied += tally.applied;
        total.duplicate += tally.duplicate;
        total.in_flight += tally.in_flight;
    }
    // Each durable acknowledged every message of the stream once.
    assert_eq!(total.applied, TRANSFERS as usize, "{total:?}");
    assert_eq!(total.applied + total.duplicate, 2 * stored, "{total:?}");
    let applied = ledger.applied();
    assert_eq!(applied.len(), TRANSFERS as usize);
    for i in 0..TRANSFERS {
        assert_eq!(applied[&format!("t-{i}")], vec![i + 1], "t-{i}");
    }
    eprintln!("race: {total:?}");
}

/// Messages that cannot be deduplicated (no `/transfer_id`, not JSON) or
/// that reuse a key with another amount are terminated (`+TERM`), never
/// applied, delivered once, and announced by the server's advisory.
#[tokio::test]
async fn poison_messages_are_terminated_and_never_redelivered() {
    let Some(url) = nats_url() else { return };
    let stream = TestStream::create(&url, "poison").await;
    let advisories_client = async_nats::connect(&url).await.unwrap();
    let mut advisories = advisories_client
        .subscribe(format!(
            "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{}.apply",
            stream.name
        ))
        .await
        .unwrap();
    advisories_client.flush().await.unwrap();

    stream.publish(r#"{"amount": 5}"#.to_owned(), None).await;
    stream.publish("not json".to_owned(), None).await;
    stream.publish(transfer("t-1", 100), None).await;
    stream.publish(transfer("t-1", 999), None).await;
    let ledger = Ledger::open();
    let consumer = ledger.consumer(short_lease());
    let mut durable = stream.durable(&url, "apply").await;
    let tally = consume_all(&mut durable, &consumer, &ledger.store, |d| {
        assert_eq!(d.info().unwrap().delivered, 1, "delivered once");
    })
    .await;
    assert_eq!((tally.applied, tally.rejected), (1, 3), "{tally:?}");
    assert_eq!(
        ledger.applied(),
        BTreeMap::from([("t-1".to_owned(), vec![100])])
    );

    // The server announces each termination, with the stream sequence.
    let mut terminated = Vec::new();
    for _ in 0..3 {
        let advisory = tokio::time::timeout(DEADLINE, advisories.next())
            .await
            .unwrap()
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&advisory.payload).unwrap();
        terminated.push(body["stream_seq"].as_u64().unwrap());
    }
    terminated.sort_unstable();
    assert_eq!(terminated, vec![1, 2, 4]);

    // Past three ack waits, nothing comes back.
    let mut late = durable
        .batch()
        .max_messages(10)
        .expires(3 * ACK_WAIT)
        .messages()
        .await
        .unwrap();
    assert!(
        late.next().await.is_none(),
        "a terminated message came back"
    );
    assert!(drained(&mut durable).await);
}

/// Publishes `payload` to `subject` with a header value that is not UTF-8,
/// over a raw connection (async-nats cannot send one): the message a
/// foreign producer could put in the stream. `None` when the URL is not a
/// plain `nats://host:port`.
async fn publish_non_utf8_header(url: &str, subject: &str, payload: &[u8]) -> Option<()> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let address = url.strip_prefix("nats://")?;
    if address.contains(['@', ',', '/']) {
        return None;
    }
    let mut connection = BufReader::new(tokio::net::TcpStream::connect(address).await.ok()?);
    let mut line = String::new();
    connection.read_line(&mut line).await.unwrap(); // INFO
    let header = b"NATS/1.0\r\nX-Origin: \xff\xfe\r\n\r\n";
    let mut frame = format!(
        "CONNECT {{\"headers\":true,\"verbose\":false}}\r\nHPUB {subject} {} {}\r\n",
        header.len(),
        header.len() + payload.len()
    )
    .into_bytes();
    frame.extend_from_slice(header);
    frame.extend_from_slice(payload);
    frame.extend_from_slice(b"\r\nPING\r\n");
    connection.get_mut().write_all(&frame).await.unwrap();
    line.clear();
    connection.read_line(&mut line).await.unwrap();
    assert_eq!(line, "PONG\r\n", "the server refused the publish");
    Some(())
}

/// A message whose header is not UTF-8 never reaches the adapter: async-nats
/// drops its connection on it, and the server delivers it again after
/// every ack wait. The durable's `max_deliver` is what ends that (with a
/// `MAX_DELIVERIES` advisory); the messages behind it are applied once.
#[tokio::test]
async fn max_deliver_ends_a_message_the_client_cannot_read() {
    let Some(url) = nats_url() else { return };
    let stream = TestStream::create(&url, "unreadable").await;
    let advisories_client = async_nats::connect(&url).await.unwrap();
    let mut advisories = advisories_client
        .subscribe(format!(
            "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{}.apply",
            stream.name
        ))
        .await
        .unwrap();
    advisories_client.flush().await.unwrap();
    let unreadable = transfer("t-unreadable", 1);
    if publish_non_utf8_header(&url, &stream.subject, unreadable.as_bytes())
        .await
        .is_none()
    {
        eprintln!("skipped: {url} is not a plain nats://host:port");
        return;
    }
    stream.publish(transfer("t-behind", 2), None).await;
    assert_eq!(stream.len().await, 2);

    let js = jetstream::new(async_nats::connect(&url).await.unwrap());
    let mut durable: PullConsumer = js
        .get_stream(&stream.name)
        .await
        .unwrap()
        .create_consumer(pull::Config {
            durable_name: Some("apply".to_owned()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            max_deliver: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let ledger = Ledger::open();
    let consumer = ledger.consumer(short_lease());
    let mut tally = Tally::default();
    let start = Instant::now();
    // The client reconnects after each unreadable delivery: its pulls may
    // fail meanwhile, and are tried again. One message per pull: the
    // deliveries that share a pull with the unreadable one are lost with
    // the connection, and would use up their `max_deliver` too.
    while !matches!(durable.info().await, Ok(i) if i.num_pending == 0 && i.num_ack_pending == 0) {
        assert!(start.elapsed() < DEADLINE, "not drained in time: {tally:?}");
        let Ok(mut batch) = durable
            .batch()
            .max_messages(1)
            .expires(Duration::from_millis(300))
            .messages()
            .await
        else {
            continue;
        };
        // A pull lost with the connection ends only 5 s after its expiry
        // (async-nats' own timer): give up on it sooner.
        let pull_lost = Duration::from_secs(1);
        while let Ok(Some(Ok(delivery))) = tokio::time::timeout(pull_lost, batch.next()).await {
            let outcome = apply(&consumer, &ledger.store, &delivery).await;
            tally.count(&outcome);
            let _ = nats::settle(&delivery, action(&outcome)).await;
        }
    }
    assert_eq!(
        ledger.applied(),
        BTreeMap::from([("t-behind".to_owned(), vec![2])])
    );
    let advisory = tokio::time::timeout(DEADLINE, advisories.next())
        .await
        .unwrap()
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&advisory.payload).unwrap();
    assert_eq!(body["stream_seq"].as_u64(), Some(1), "{body}");
    assert_eq!(body["deliveries"].as_u64(), Some(2), "{body}");
}
