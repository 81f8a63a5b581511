//! The message-consumer checks every store runs (from
//! [`conformance_tests!`](crate::conformance_tests)): the consumer entry
//! point of `idem-consumer` goes through the store's claim, complete and
//! release, so each store must give it the same answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_consumer::{
    Action, ConsumeError, Consumer, Failure, KeySource, Message, Processed, process_batch,
};
use idem_core::{Scope, Store};

/// A scope no other run or check uses (stores may outlive a test run).
fn fresh_scope(tag: &str) -> Scope {
    Scope::from_tenant(crate::backend::unique_name(&format!("consumer_{tag}")).as_bytes())
}

fn transfer(id: &str, amount: u64) -> Message {
    Message::new(format!(r#"{{"transfer_id":"{id}","amount":{amount}}}"#))
        .with_content_type("application/json")
}

type Outcome = Result<Processed, ConsumeError<&'static str>>;

/// Runs `message` through `consumer` with an effect that counts its runs
/// in `runs` and answers `answer`.
async fn apply(
    consumer: &Consumer,
    message: &Message,
    runs: &AtomicU64,
    answer: Result<&'static [u8], Failure<&'static str>>,
) -> Outcome {
    consumer
        .process(message, |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            answer.map(<[u8]>::to_vec)
        })
        .await
}

/// Every answer of the consumer entry point on one store: applied once,
/// duplicates acknowledged with the stored result, a reused key rejected,
/// transient failures and panics released and run again on redelivery,
/// permanent failures stored, a message without a key never applied, and
/// a batch whose middle message fails redelivers only that one.
pub async fn consumer_follows_the_record_contract(store: Arc<dyn Store>) {
    let consumer = Consumer::new(
        store,
        fresh_scope("contract"),
        "apply-transfer",
        KeySource::JsonPointer("/transfer_id".into()),
    );
    let runs = AtomicU64::new(0);

    // Applied once; a redelivery gets the stored result without a run.
    let m = transfer("t-applied", 100);
    assert_eq!(
        apply(&consumer, &m, &runs, Ok(b"r1")).await.unwrap(),
        Processed::Applied(b"r1".to_vec())
    );
    let again = apply(&consumer, &m, &runs, Ok(b"other")).await.unwrap();
    assert_eq!(again, Processed::Duplicate(b"r1".to_vec()));
    assert_eq!(again.action(), Action::Ack);
    // The same JSON value written differently is the same payload.
    let reordered = Message::new(r#"{ "amount": 100, "transfer_id": "t-applied" }"#)
        .with_content_type("application/json");
    assert_eq!(
        apply(&consumer, &reordered, &runs, Ok(b"other"))
            .await
            .unwrap(),
        Processed::Duplicate(b"r1".to_vec())
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // The key reused with another payload: rejected, never applied.
    let reused = apply(&consumer, &transfer("t-applied", 999), &runs, Ok(b"x"))
        .await
        .unwrap_err();
    assert!(matches!(reused, ConsumeError::KeyReused), "{reused:?}");
    assert_eq!(reused.action(), Action::Reject);

    // A transient failure releases: the redelivery runs it again.
    let m = transfer("t-transient", 5);
    let failed = apply(&consumer, &m, &runs, Err(Failure::Transient("down")))
        .await
        .unwrap_err();
    assert!(matches!(failed, ConsumeError::Effect("down")), "{failed:?}");
    assert!(matches!(failed.action(), Action::Redeliver { .. }));
    assert_eq!(
        apply(&consumer, &m, &runs, Ok(b"r2")).await.unwrap(),
        Processed::Applied(b"r2".to_vec())
    );

    // A panic releases too.
    let m = transfer("t-panic", 6);
    let panicked = consumer
        .process(&m, |_| async {
            if m.payload.len() > 1 {
                panic!("the effect panicked");
            }
            Ok::<_, Failure<&'static str>>(Vec::new())
        })
        .await
        .unwrap_err();
    assert!(matches!(panicked, ConsumeError::Panicked), "{panicked:?}");
    assert_eq!(
        apply(&consumer, &m, &runs, Ok(b"r3")).await.unwrap(),
        Processed::Applied(b"r3".to_vec())
    );

    // A permanent failure is stored and acknowledged, never run again.
    let m = transfer("t-refused", 7);
    let before = runs.load(Ordering::SeqCst);
    assert_eq!(
        apply(
            &consumer,
            &m,
            &runs,
            Err(Failure::Permanent(b"no such account".to_vec()))
        )
        .await
        .unwrap(),
        Processed::Refused(b"no such account".to_vec())
    );
    assert_eq!(
        apply(&consumer, &m, &runs, Ok(b"r4")).await.unwrap(),
        Processed::Refused(b"no such account".to_vec())
    );
    assert_eq!(runs.load(Ordering::SeqCst), before + 1);

    // No key: rejected before anything runs.
    let before = runs.load(Ordering::SeqCst);
    let no_key = apply(&consumer, &Message::new(r#"{"amount":1}"#), &runs, Ok(b"x"))
        .await
        .unwrap_err();
    assert!(matches!(no_key, ConsumeError::NoKey(_)), "{no_key:?}");
    assert_eq!(no_key.action(), Action::Reject);
    assert_eq!(runs.load(Ordering::SeqCst), before);

    // A batch: the second fails transiently; only it is redelivered, and
    // the redelivered batch runs only it.
    let batch = [
        transfer("t-b1", 1),
        transfer("t-b2", 2),
        transfer("t-b3", 3),
        transfer("t-b1", 1),
    ];
    let per_message: Vec<AtomicU64> = (0..3).map(|_| AtomicU64::new(0)).collect();
    let report = run_batch(&consumer, &batch, &per_message, true).await;
    assert_eq!(report.to_ack(), vec![0, 2, 3]);
    assert_eq!(report.to_redeliver(), vec![1]);
    assert!(report.to_reject().is_empty());
    let report = run_batch(&consumer, &batch, &per_message, false).await;
    assert_eq!(report.to_ack(), vec![0, 1, 2, 3]);
    assert!(matches!(report.outcomes[1], Ok(Processed::Applied(_))));
    assert!(matches!(report.outcomes[0], Ok(Processed::Duplicate(_))));
    let counts: Vec<u64> = per_message
        .iter()
        .map(|c| c.load(Ordering::SeqCst))
        .collect();
    assert_eq!(counts, vec![1, 2, 1], "only the failed message ran again");
}

/// Runs the batch of [`consumer_follows_the_record_contract`]: message `i`
/// (by payload, of the first three) counts its runs in `per_message[i]`,
/// and the second fails transiently if `fail_second`.
async fn run_batch(
    consumer: &Consumer,
    batch: &[Message],
    per_message: &[AtomicU64],
    fail_second: bool,
) -> idem_consumer::BatchReport<&'static str> {
    process_batch(batch, |m| async move {
        let i = batch[..3]
            .iter()
            .position(|b| b.payload == m.payload)
            .expect("a message of the batch");
        consumer
            .process(m, |_| async move {
                per_message[i].fetch_add(1, Ordering::SeqCst);
                if i == 1 && fail_second {
                    Err(Failure::Transient("busy"))
                } else {
                    Ok(vec![b'0' + u8::try_from(i).unwrap_or(0)])
                }
            })
            .await
    })
    .await
}

/// `tasks` consumers (spread over `stores`, as several processes would
/// hold) get the same message at once: the effect runs once; the others
/// are told to redeliver (in flight) or acknowledge (duplicate), and once
/// redelivered every one acknowledges without running it.
pub async fn consumer_race_one_message(stores: &[Arc<dyn Store>], tasks: usize) {
    assert!(!stores.is_empty(), "the race needs a store");
    let scope = fresh_scope("race");
    let consumers: Vec<Consumer> = stores
        .iter()
        .map(|s| Consumer::new(s.clone(), scope.clone(), "race", KeySource::MessageId))
        .collect();
    let message = Message::new("one intent").with_id("race-message-0001");
    let runs = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(tasks));
    let mut handles = Vec::with_capacity(tasks);
    for i in 0..tasks {
        let (consumer, message, runs, barrier) = (
            consumers[i % consumers.len()].clone(),
            message.clone(),
            runs.clone(),
            barrier.clone(),
        );
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            consumer
                .process(&message, |_| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Failure<&'static str>>(b"once".to_vec())
                })
                .await
        }));
    }
    let mut redeliver = Vec::new();
    for (i, h) in handles.into_iter().enumerate() {
        match h.await.expect("task panicked") {
            Ok(Processed::Applied(_) | Processed::Duplicate(_)) => {}
            Err(ConsumeError::InFlight { .. }) => redeliver.push(i),
            other => panic!("unexpected answer in the race: {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one effect");
    for i in redeliver {
        let consumer = &consumers[i % consumers.len()];
        let again = consumer
            .process(&message, |_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Failure<&'static str>>(Vec::new())
            })
            .await;
        assert!(
            matches!(&again, Ok(Processed::Duplicate(r)) if r == b"once"),
            "{again:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "still one effect");
}
