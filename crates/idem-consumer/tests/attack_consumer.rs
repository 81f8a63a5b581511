//! Review of issue 14's consumer entry point (attack tests): values a
//! producer or a caller controls, and the store failing at the wrong time.
//! Each test states the behaviour the contract asks for; a failing test is
//! a finding.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_consumer::{Action, ConsumeError, Consumer, KeySource, Message, MissingKey, Processed};
use idem_core::{MemoryStore, Policy, Scope, Store, StoreError, StoreErrorKind};
use idem_testkit::{Fault, FaultyStore, StoreOp};

fn json(payload: &str) -> Message {
    Message::new(payload.to_owned()).with_content_type("application/json")
}

fn consumer(store: Arc<dyn Store>) -> Consumer {
    Consumer::new(
        store,
        Scope::from_tenant(b"attack-14"),
        "apply-transfer",
        KeySource::JsonPointer("/transfer_id".into()),
    )
}

type Outcome = Result<Processed, ConsumeError<&'static str>>;

async fn run(consumer: &Consumer, message: &Message, runs: &AtomicU64) -> Outcome {
    consumer
        .process(message, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(b"applied".to_vec())
        })
        .await
}

fn action(outcome: &Outcome) -> Action {
    match outcome {
        Ok(p) => p.action(),
        Err(e) => e.action(),
    }
}

/// The fingerprint's parser calls a payload with a duplicate object key
/// "not JSON"; the key's parser takes the last value. An effect that reads
/// the payload with a first-wins parser then applies intent "a" under the
/// record of intent "b": the message keyed "a" applies it again.
#[test]
fn a_duplicate_object_key_is_not_a_key() {
    let payload = r#"{"transfer_id":"a","transfer_id":"b","amount":1}"#;
    assert!(idem_core::canonicalize_json(payload.as_bytes()).is_none());
    let key = KeySource::JsonPointer("/transfer_id".into()).key_of(&json(payload));
    assert!(
        matches!(key, Err(MissingKey::NotJson(_))),
        "the key was read from a payload the fingerprint calls not JSON: {key:?}"
    );
}

/// A panic or a transient failure that recurs on every delivery (a poison
/// message), or a store that is down, is redelivered at once, forever:
/// `-NAK` without a delay, an immediate AMQP requeue. With a bounded
/// `max_deliver` (NATS) or `x-delivery-limit` (RabbitMQ quorum queues) a
/// store outage of a second drops every message that arrives meanwhile.
#[test]
fn a_failing_effect_is_not_redelivered_at_once() {
    for e in [
        ConsumeError::<&str>::Panicked,
        ConsumeError::Effect("transient"),
        ConsumeError::Store(StoreError::new(StoreErrorKind::Unavailable, "down")),
    ] {
        let a = e.action();
        assert!(
            matches!(a, Action::Redeliver { after: Some(d) } if !d.is_zero()),
            "{e:?} -> {a:?}: a hot redelivery loop"
        );
    }
}

/// A [`MemoryStore`] whose first `complete` fails, as a store blip does.
fn complete_fails_once() -> FaultyStore {
    FaultyStore::with_faults(Arc::new(MemoryStore::new()), |call| {
        if call.op == StoreOp::Complete && call.nth == 0 {
            Fault::Fail(StoreError::new(StoreErrorKind::Unavailable, "blip"))
        } else {
            Fault::Pass
        }
    })
}

/// Plain mode: the effect ran, then one `complete` failed (a store blip).
/// The consumer retries the completion while its lease lasts, so the
/// effect is not run again by a redelivery after the lease.
#[tokio::test]
async fn a_store_blip_after_the_effect_does_not_run_it_twice() {
    let store = Arc::new(complete_fails_once());
    let c = consumer(store).policy(
        Policy::builder()
            .lease(Duration::from_millis(300))
            .build()
            .unwrap(),
    );
    let runs = AtomicU64::new(0);
    let m = json(r#"{"transfer_id":"t-blip","amount":5}"#);
    // The completion is retried while the lease lasts: settled at once.
    let first = run(&c, &m, &runs).await;
    assert!(matches!(first, Ok(Processed::Applied(_))), "{first:?}");
    // Redeliveries, as the broker would send them, until one settles.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = run(&c, &m, &runs).await;
        if matches!(action(&out), Action::Ack) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // a broker's redelivery delay
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the effect ran twice");
}

/// What holds (kept as a regression test): pointer escapes, numbers that
/// are not integers, non-UTF-8 payloads and content-type spellings.
#[tokio::test]
async fn edge_values_neither_collide_nor_panic() {
    let key = |pointer: &str, payload: &[u8]| {
        KeySource::JsonPointer(pointer.into())
            .key_of(&Message::new(payload.to_vec()))
            .map(|k| k.as_str().to_owned())
    };
    assert_eq!(key("/a~1b", br#"{"a/b":"x"}"#), Ok("x".into()));
    assert_eq!(key("/m~0n", br#"{"m~n":"y","m/n":"z"}"#), Ok("y".into()));
    assert_eq!(key("/m~01", br#"{"m~1":"w","m/":"v"}"#), Ok("w".into()));
    assert_eq!(
        key("/n", br#"{"n":18446744073709551615}"#),
        Ok("18446744073709551615".into())
    );
    for number in [
        "-0",
        "1e3",
        "1.0",
        "18446744073709551616",
        "-9223372036854775809",
    ] {
        let payload = format!(r#"{{"n":{number}}}"#);
        assert!(
            matches!(key("/n", payload.as_bytes()), Err(MissingKey::NoField(_))),
            "{number}"
        );
    }
    assert!(matches!(
        key("/n", b"{\"n\":\"\xff\"}"),
        Err(MissingKey::NotJson(_))
    ));

    let c = consumer(Arc::new(MemoryStore::new()));
    let runs = AtomicU64::new(0);
    let first = run(&c, &json(r#"{"transfer_id":"t-ct","amount":1}"#), &runs).await;
    assert!(matches!(first, Ok(Processed::Applied(_))), "{first:?}");
    let respelled = Message::new(" {\"amount\" : 1 ,\n \"transfer_id\":\"t-ct\"} ")
        .with_content_type("Application/JSON ; charset=utf-8");
    let again = run(&c, &respelled, &runs).await;
    assert!(matches!(again, Ok(Processed::Duplicate(_))), "{again:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
