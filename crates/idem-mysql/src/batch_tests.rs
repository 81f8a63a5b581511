//! Group commit (`batch.rs`) against the MySQL or MariaDB named by
//! `IDEM_TEST_MYSQL_URL`, checked by idem-testkit's `batches`: each call
//! in a batch gets the answer it would get alone, and a call that poisons
//! its batch fails only itself.

use idem_core::{BoxFuture, Claim, ClaimRequest, Operation, RecordId, Settled, StoreError};
use idem_testkit::batches;
use idem_testkit::{IsolatedBackend, unique_id};

use crate::MysqlStore;
use idem_core::batch::OnRefusal;

use crate::batch::{self, CompletionCall, ReleaseCall};
use crate::tests::TestMysql;

/// The store's batch functions, called directly with a batch of the
/// check's choosing (the batcher forms its own from whatever arrives).
/// With `OnRefusal::FailAll`, a batch the server refused fails every
/// call, so that a check passes only on the batch's own answers (the
/// single path would give the same answers, and hide a broken batch).
fn claim_batch(
    store: &MysqlStore,
    on_refusal: OnRefusal,
) -> impl Fn(Vec<ClaimRequest>) -> BoxFuture<'static, Vec<Result<Claim, StoreError>>> {
    let inner = store.inner.clone();
    move |calls| {
        Box::pin(crate::batch_claims::claims(
            inner.clone(),
            calls,
            on_refusal,
        ))
    }
}

fn complete_batch(
    store: &MysqlStore,
) -> impl Fn(Vec<CompletionCall>) -> BoxFuture<'static, Vec<Result<Settled, StoreError>>> {
    let inner = store.inner.clone();
    move |calls| Box::pin(batch::completions(inner.clone(), calls, OnRefusal::FailAll))
}

fn release_batch(
    store: &MysqlStore,
) -> impl Fn(Vec<ReleaseCall>) -> BoxFuture<'static, Vec<Result<Settled, StoreError>>> {
    let inner = store.inner.clone();
    move |calls| Box::pin(batch::releases(inner.clone(), calls, OnRefusal::FailAll))
}

fn rt() -> tokio::runtime::Runtime {
    idem_testkit::runtime()
}

#[test]
fn a_mixed_batch_answers_each_claim_as_alone() {
    let Some(url) = TestMysql::url() else {
        return;
    };
    rt().block_on(async {
        let guard = TestMysql::fresh(&url).await;
        let store = guard.store();
        batches::a_mixed_batch_answers_each_claim_as_alone(
            store,
            &claim_batch(store, OnRefusal::FailAll),
        )
        .await;
    });
}

/// An operation longer than its column (strict mode refuses it; the
/// store's own check refuses it before a batch, which this skips).
#[test]
fn a_poisoned_claim_fails_only_itself() {
    let Some(url) = TestMysql::url() else {
        return;
    };
    rt().block_on(async {
        let guard = TestMysql::fresh(&url).await;
        let store = guard.store();
        let id = unique_id("poisoned-0000001");
        let long = Operation::from_raw(format!("POST /zz{}", "x".repeat(1100)));
        let poisoned = RecordId::new(id.scope, long, id.key);
        batches::a_poisoned_claim_fails_only_itself(
            &claim_batch(store, OnRefusal::OneAtATime),
            &poisoned,
        )
        .await;
    });
}

#[test]
fn a_borrowed_fence_in_a_batch_takes_no_other_answer() {
    let Some(url) = TestMysql::url() else {
        return;
    };
    rt().block_on(async {
        let guard = TestMysql::fresh(&url).await;
        let store = guard.store();
        batches::a_borrowed_fence_in_a_batch_takes_no_other_answer(store, &complete_batch(store))
            .await;
    });
}

#[test]
fn batched_completions_and_releases_apply_only_under_their_fence() {
    let Some(url) = TestMysql::url() else {
        return;
    };
    rt().block_on(async {
        let guard = TestMysql::fresh(&url).await;
        let store = guard.store();
        batches::batched_completions_and_releases_apply_only_under_their_fence(
            store,
            &complete_batch(store),
            &release_batch(store),
        )
        .await;
    });
}

/// Bytes no text literal could hold (quotes, backslashes, NUL, bytes
/// that are not UTF-8) in batched claims' ids and fingerprints and in
/// batched completions' answers (body, headers, resource id) come back
/// byte for byte: the hex literals carry every value, and nothing in one
/// can end it.
#[test]
fn batched_values_are_stored_byte_for_byte() {
    let Some(url) = TestMysql::url() else {
        return;
    };
    rt().block_on(async {
        use idem_core::{Completion, Store};
        let guard = TestMysql::fresh(&url).await;
        let store = guard.store();
        let hostile: Vec<u8> = b"'); DROP TABLE idem_records; -- \\\0\xff\xfe\"`".to_vec();
        let ids: Vec<RecordId> = (0..3)
            .map(|n| {
                let id = unique_id(&format!("hostile-'\\\"`;--{n:08}"));
                let op = Operation::from_raw(format!("POST /o'\\\"`;{n}"));
                RecordId::new(id.scope, op, id.key)
            })
            .collect();
        let requests: Vec<ClaimRequest> = ids
            .iter()
            .map(|id| idem_testkit::request(id, "{\"q\":\"'\\\\\"}", idem_testkit::t0()))
            .collect();
        let claimed = claim_batch(store, OnRefusal::FailAll)(requests.clone()).await;
        let mut calls = Vec::new();
        for ((id, answer), req) in ids.iter().zip(&claimed).zip(&requests) {
            let Ok(Claim::Acquired(lease)) = answer else {
                panic!("not acquired: {answer:?}");
            };
            // The fingerprint went in as hex and matches as the same bytes.
            assert!(matches!(store.claim(req).await, Ok(Claim::InFlight { .. })));
            let mut response = idem_testkit::response(201, "x");
            response.body = hostile.clone();
            response
                .headers
                .push(("x-hostile".to_owned(), b"'\\\"`; --\0\xff".to_vec()));
            let mut done = Completion::completed(response);
            done.resource_id = Some("r'\\\"`".to_owned());
            calls.push((id.clone(), lease.fence.to_i64().expect("fence"), done));
        }
        let expected: Vec<_> = calls.iter().map(|(_, _, c)| c.response.clone()).collect();
        let answers = complete_batch(store)(calls).await;
        assert!(
            answers.iter().all(|a| matches!(a, Ok(Settled::Applied))),
            "{answers:?}"
        );
        for (id, response) in ids.iter().zip(expected) {
            let record = store.get(id, idem_testkit::t0()).await.unwrap().unwrap();
            assert_eq!(record.response, Some(response));
            assert_eq!(record.resource_id.as_deref(), Some("r'\\\"`"));
        }
    });
}

/// One batch of 42 completions of 40 records, with answers of every
/// shape (empty, 7-byte and 120 KiB bodies, with and without resource
/// id, completed and failed), cut into several transactions by the query
/// limit (about 10 MB of hex against 4 MiB), and two records completed
/// twice: a stale fence and then the right one (the second applies), and
/// the right fence twice (the first applies). Each answer is the call's
/// own, and each record holds the answer of the call that applied, byte
/// for byte. (A set-wise completion, one `UPDATE` joined to a `UNION
/// ALL` of the values, failed this: MariaDB kept 57,344 bytes of a
/// 120 KiB body, without an error; docs/decisions.md.)
#[test]
fn batched_completions_store_answers_of_every_shape_whole() {
    let Some(url) = TestMysql::url() else {
        return;
    };
    rt().block_on(async {
        use idem_core::{Completion, Store};
        let guard = TestMysql::fresh(&url).await;
        let store = guard.store();
        let ids: Vec<RecordId> = (0..40)
            .map(|n| unique_id(&format!("every-shape-{n:08}")))
            .collect();
        let mut fences = Vec::new();
        for id in &ids {
            let Ok(Claim::Acquired(lease)) = store
                .claim(&idem_testkit::request(id, "{}", idem_testkit::t0()))
                .await
            else {
                panic!("not acquired");
            };
            fences.push(lease.fence.to_i64().expect("fence"));
        }
        let answer = |n: usize, tag: u8| {
            let mut response =
                idem_testkit::response(if n.is_multiple_of(2) { 201 } else { 422 }, "s");
            response.body = match n % 3 {
                0 => Vec::new(),
                1 => (0..120 * 1024).map(|b| (b * 31 + n) as u8 ^ tag).collect(),
                _ => vec![tag, 0, 0xff, b'\'', b'\\', b'"', 7],
            };
            let done = if n.is_multiple_of(2) {
                Completion::completed(response)
            } else {
                Completion::failed(response)
            };
            if n % 4 == 1 {
                done.with_resource_id(format!("res-{n}-{tag}"))
            } else {
                done
            }
        };
        let mut calls: Vec<CompletionCall> = (0..40)
            .map(|n| (ids[n].clone(), fences[n], answer(n, 1)))
            .collect();
        // Record 5: a stale fence first, then its own; record 6: its own
        // fence twice, the second with another answer.
        calls.insert(5, (ids[5].clone(), fences[5] + 1000, answer(5, 2)));
        calls.insert(8, (ids[6].clone(), fences[6], answer(6, 3)));
        let expected: Vec<Settled> = calls
            .iter()
            .enumerate()
            .map(|(i, _)| match i {
                5 | 8 => Settled::StaleFence,
                _ => Settled::Applied,
            })
            .collect();
        let answers = complete_batch(store)(calls.clone()).await;
        let answers: Vec<Settled> = answers
            .into_iter()
            .map(|a| a.expect("the batch's own answer"))
            .collect();
        assert_eq!(answers, expected);
        for (n, id) in ids.iter().enumerate() {
            let record = store.get(id, idem_testkit::t0()).await.unwrap().unwrap();
            let sent = answer(n, 1);
            assert_eq!(record.status, sent.status(), "record {n}");
            // Compared whole; shown by status, headers and body length
            // (a body is up to 120 KiB).
            let shown = |r: &idem_core::StoredResponse| (r.status, r.headers.clone(), r.body.len());
            let stored = record.response.as_ref().expect("a response");
            assert!(
                *stored == sent.response,
                "record {n}: stored {:?}, sent {:?}",
                shown(stored),
                shown(&sent.response)
            );
            assert_eq!(record.resource_id, sent.resource_id, "record {n}");
            assert_eq!(record.lease_until, None, "record {n}");
        }
    });
}

/// A batch whose new key another transaction has inserted and not yet
/// committed waits for that row alone: a claim of an unrelated key meanwhile
/// is not held up (an insert whose rows InnoDB cannot count ahead holds
/// the table's AUTO-INC lock while it waits, and held every insert of the
/// table, seen as a 4 s stall and then error 1467). When the other
/// transaction rolls back, the batch inserts its key and acquires both.
#[test]
fn a_batch_waiting_on_one_row_holds_up_no_other_insert() {
    let Some(url) = TestMysql::url() else {
        return;
    };
    rt().block_on(async {
        use idem_core::Store;
        use mysql_async::prelude::Queryable;
        let guard = TestMysql::fresh(&url).await;
        let store = guard.store();
        let database = store.database().to_owned();
        let held = unique_id("held-by-another");
        let beside = RecordId::new(
            held.scope.clone(),
            held.operation.clone(),
            idem_core::Key::new("beside").unwrap(),
        );
        let unrelated = unique_id("unrelated");
        // Another transaction inserts `held` and stays open.
        let mut other = store.conn().await.unwrap();
        other.query_drop("START TRANSACTION").await.unwrap();
        other
            .exec_drop(
                format!(
                    "INSERT INTO `{database}`.idem_records (scope, operation, record_key, \
                     fingerprint, status, created_at, lease_until, expires_at) \
                     VALUES (?, ?, ?, X'00', 0, 0, 1, 1)"
                ),
                (
                    held.scope.as_str(),
                    held.operation.as_str(),
                    held.key.as_str(),
                ),
            )
            .await
            .unwrap();
        let batch = claim_batch(store, OnRefusal::FailAll);
        let calls = vec![
            idem_testkit::request(&held, "{}", idem_testkit::t0()),
            idem_testkit::request(&beside, "{}", idem_testkit::t0()),
        ];
        let waiting = tokio::spawn(batch(calls));
        // Until the batch waits on the row (a bounded poll of the server's
        // transactions waiting for a lock in a statement on this test's
        // table: the test goes on only once the server says so; `innodb_trx`
        // is on MySQL 8 and MariaDB alike).
        let mut watcher = store.conn().await.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let table = format!("%{database}%idem_records%");
        loop {
            let waits: Option<i64> = watcher
                .exec_first(
                    "SELECT COUNT(*) FROM information_schema.innodb_trx \
                     WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE ?",
                    (table.as_str(),),
                )
                .await
                .unwrap();
            if waits.unwrap_or(0) > 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the batch never waited on the row"
            );
            // InnoDB refreshes what `innodb_trx` shows only when it was
            // not read for 100 ms: a tighter poll would read the same
            // stale picture for ever.
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        }
        // A claim of another key goes through while the batch waits, well
        // inside the lock wait timeout (5 s).
        let alone = tokio::time::timeout(
            std::time::Duration::from_secs(3),
            store.claim(&idem_testkit::request(&unrelated, "{}", idem_testkit::t0())),
        )
        .await
        .expect("a claim of another key was held up by the waiting batch");
        assert!(matches!(alone, Ok(Claim::Acquired(_))), "{alone:?}");
        other.query_drop("ROLLBACK").await.unwrap();
        let answers = waiting.await.unwrap();
        assert!(
            answers.iter().all(|a| matches!(a, Ok(Claim::Acquired(_)))),
            "{answers:?}"
        );
    });
}

/// Every statement that finds records by id offers MariaDB the primary
/// key alone: with the (scope, record_key) index, or (status,
/// lease_until) for `status = 0`, beside it, the optimiser builds a range
/// tree for each and dives into the B-tree for each range's rows (a
/// read-back of 100 ids cost 3,070 µs of server CPU against 380;
/// BENCHMARKS.md). Checked by `EXPLAIN` of the batches' statements as
/// they are sent and of the single path's prepared ones.
#[test]
fn statements_by_id_offer_the_primary_key_alone() {
    let Some(url) = TestMysql::url() else {
        return;
    };
    rt().block_on(async {
        use idem_core::{Completion, Store};
        use mysql_async::prelude::Queryable;
        let guard = TestMysql::fresh(&url).await;
        let store = guard.store();
        let inner = store.inner.clone();
        let requests: Vec<ClaimRequest> = (0..3)
            .map(|n| {
                let id = unique_id(&format!("explained-{n:08}"));
                idem_testkit::request(&id, "{}", idem_testkit::t0())
            })
            .collect();
        let mut calls: Vec<CompletionCall> = Vec::new();
        for req in &requests {
            let Ok(Claim::Acquired(lease)) = store.claim(req).await else {
                panic!("not acquired");
            };
            let done = Completion::completed(idem_testkit::response(201, "explained"));
            calls.push((req.id.clone(), lease.fence.to_i64().expect("fence"), done));
        }
        let mut texts = Vec::new();
        // The batch of completions: its UPDATE and its read-back.
        let table = format!(
            "{}.{}",
            crate::schema::quoted(&inner.database),
            crate::schema::RECORDS_BY_ID
        );
        let headers: Vec<Vec<u8>> = calls
            .iter()
            .map(|(_, _, c)| c.response.encode_headers())
            .collect();
        let completion = batch::SetWiseCompletion {
            table: &table,
            calls: &calls,
            headers: &headers,
            first: 1,
        };
        let mut text = String::new();
        completion.write(&mut text, &[0, 1, 2]);
        // The batch of new keys: its read-back (the INSERT names no key).
        text.push_str(&crate::batch_claims::new_keys_query(
            &inner,
            &requests,
            &[0, 1, 2],
        ));
        // Every value is a hex literal or a number: no `;` but the ends.
        for statement in text.split(';') {
            let by_id = statement.starts_with("UPDATE")
                || statement.starts_with("SELECT written_by")
                || statement.starts_with("SELECT 0,");
            if by_id {
                texts.push((statement.to_owned(), ()));
            }
        }
        assert_eq!(texts.len(), 3, "{text}");
        // The single path's, with the values of a record in progress (a
        // const look-up that finds no row shows no keys at all).
        use mysql_async::Value;
        let (id, fence, _) = &calls[0];
        let bytes = |s: &str| Value::Bytes(s.as_bytes().to_vec());
        let id = [
            bytes(id.scope.as_str()),
            bytes(id.operation.as_str()),
            bytes(id.key.as_str()),
        ];
        let fence = Value::Int(*fence);
        let now = Value::Int(idem_testkit::t0().as_millis());
        let sql = &inner.sql;
        let mut prepared: Vec<(String, Vec<Value>)> = vec![
            (
                sql.complete.clone(),
                [
                    Value::Int(1),
                    Value::NULL,
                    Value::Int(201),
                    bytes(""),
                    bytes(""),
                ]
                .into_iter()
                .chain(id.clone())
                .chain([fence.clone()])
                .collect(),
            ),
            (
                sql.extend.clone(),
                [now.clone(), now.clone(), now.clone()]
                    .into_iter()
                    .chain(id.clone())
                    .chain([fence.clone()])
                    .collect(),
            ),
            (
                sql.get.clone(),
                id.iter().cloned().chain([Value::Int(0)]).collect(),
            ),
        ];
        for statement in [&sql.holds, &sql.lock] {
            prepared.push((
                statement.clone(),
                id.iter().cloned().chain([fence.clone()]).collect(),
            ));
        }
        let mut conn = store.conn().await.unwrap();
        let texts = texts
            .into_iter()
            .map(|(text, _)| (text, Vec::new()))
            .chain(prepared);
        for (statement, values) in texts {
            assert_eq!(values.len(), statement.matches('?').count(), "{statement}");
            let plan: Vec<mysql_async::Row> = conn
                .exec(format!("EXPLAIN {statement}"), values)
                .await
                .unwrap_or_else(|e| panic!("EXPLAIN {statement}: {e}"));
            assert_eq!(plan.len(), 1, "{statement}");
            let offered: Option<String> = plan[0]
                .get_opt("possible_keys")
                .and_then(Result::ok)
                .flatten();
            assert_eq!(
                offered.as_deref(),
                Some("PRIMARY"),
                "{}",
                &statement[..statement.len().min(200)]
            );
        }
    });
}
