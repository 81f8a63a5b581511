//! The statements that find a record by its id reach it by the primary key
//! whatever the statistics say: never through the stale index (a scan of
//! every record in progress) and never by a scan of the table. The
//! statistics here say what they usually say in service: nearly every
//! record finished. Then 2,000 records in progress arrive, which they do
//! not know of (as between two automatic analyses, or after a crash left
//! leases behind).

use idem_testkit::IsolatedBackend;

use crate::schema::Statements;
use crate::tests::{TestPostgres, rt};

/// Finished records, analysed.
const FINISHED: i64 = 100_000;
/// Records in progress that the statistics do not know of.
const IN_PROGRESS: i64 = 2_000;
/// The fence of record `open-N` is `FENCE_BASE + N`.
const FENCE_BASE: i64 = 100_000;

fn open(n: i64) -> String {
    format!("open-{n}")
}

#[test]
fn keyed_statements_never_scan_the_stale_index_or_the_table() {
    let Some(url) = TestPostgres::url() else {
        return;
    };
    rt().block_on(async {
        let guarded = TestPostgres::fresh(&url).await;
        let store = guarded.store();
        let s = store.schema();
        let sql = Statements::new(s);
        let mut client = store.pool().get().await.unwrap();
        client
            .batch_execute(&format!(
                "INSERT INTO {s}.idem_records (scope, operation, key, fingerprint, status, fence, \
                 created_at, lease_until, expires_at, response_status) \
                 SELECT 's', 'POST /x', 'done-' || g, '\\x00', 1, g, 0, NULL, 9000000000000, 200 \
                 FROM generate_series(1, {FINISHED}) g; \
                 ANALYZE {s}.idem_records; \
                 INSERT INTO {s}.idem_records (scope, operation, key, fingerprint, status, fence, \
                 created_at, lease_until, expires_at) \
                 SELECT 's', 'POST /x', 'open-' || g, '\\x00', 0, {FENCE_BASE} + g, 0, \
                 8000000000000, 9000000000000 FROM generate_series(1, {IN_PROGRESS}) g;"
            ))
            .await
            .unwrap();
        for mode in ["force_generic_plan", "force_custom_plan"] {
            client
                .batch_execute(&format!("SET plan_cache_mode = {mode}"))
                .await
                .unwrap();
            let tx = client.transaction().await.unwrap();
            // The session's count before this mode's statements (its
            // inserts above are counted too).
            let pages_before: i64 = tx
                .query_one(
                    &format!(
                        "SELECT pg_stat_get_xact_blocks_fetched('{s}.idem_records_pkey'::regclass)"
                    ),
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            let (scope, op) = ("s", "POST /x");
            let (body, headers): (&[u8], &[u8]) = (b"{}", b"");
            let changed = |n: u64, what: &str| assert_eq!(n, 1, "{what} ({mode})");

            let key = open(1);
            let n = tx
                .execute(
                    &sql.complete,
                    &[
                        &scope,
                        &op,
                        &key,
                        &(FENCE_BASE + 1),
                        &1i16,
                        &None::<&str>,
                        &200i32,
                        &headers,
                        &body,
                    ],
                )
                .await
                .unwrap();
            changed(n, "complete");
            let key = open(2);
            let n = tx
                .execute(&sql.release, &[&scope, &op, &key, &(FENCE_BASE + 2)])
                .await
                .unwrap();
            changed(n, "release");
            let key = open(3);
            let n = tx
                .execute(
                    &sql.extend,
                    &[&scope, &op, &key, &(FENCE_BASE + 3), &8_500_000_000_000i64],
                )
                .await
                .unwrap();
            changed(n, "extend");
            let key = open(4);
            let rows = tx
                .query(&sql.lock, &[&scope, &op, &key, &(FENCE_BASE + 4)])
                .await
                .unwrap();
            assert_eq!(rows.len(), 1, "lock ({mode})");
            let key = open(5);
            let rows = tx
                .query(&sql.get, &[&scope, &op, &key, &0i64])
                .await
                .unwrap();
            assert_eq!(rows.len(), 1, "get ({mode})");
            // The look-up by (scope, key), through the primary key's
            // leading columns (version 6).
            let rows = tx
                .query(&sql.by_key, &[&scope, &key, &0i64, &10i64])
                .await
                .unwrap();
            assert_eq!(rows.len(), 1, "by_key ({mode})");

            // A batch of four completions and one of four releases.
            let batch = |first: i64| -> (Vec<&str>, Vec<&str>, Vec<String>, Vec<i64>) {
                let ns = first..first + 4;
                (
                    ns.clone().map(|_| scope).collect(),
                    ns.clone().map(|_| op).collect(),
                    ns.clone().map(open).collect(),
                    ns.map(|n| FENCE_BASE + n).collect(),
                )
            };
            let (scopes, ops, keys, fences) = batch(5);
            let rows = tx
                .query(
                    &sql.complete_many,
                    &[
                        &scopes,
                        &ops,
                        &keys,
                        &fences,
                        &vec![1i16; 4],
                        &vec![None::<&str>; 4],
                        &vec![200i32; 4],
                        &vec![headers; 4],
                        &vec![body; 4],
                    ],
                )
                .await
                .unwrap();
            let mut ords: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
            ords.sort_unstable();
            assert_eq!(ords, vec![1, 2, 3, 4], "complete_many ({mode})");
            let (scopes, ops, keys, fences) = batch(9);
            let rows = tx
                .query(&sql.release_many, &[&scopes, &ops, &keys, &fences])
                .await
                .unwrap();
            let mut ords: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
            ords.sort_unstable();
            assert_eq!(ords, vec![1, 2, 3, 4], "release_many ({mode})");

            // A claim of a key in flight: answered "in flight" (1).
            let key = open(13);
            let fingerprint: &[u8] = b"\x00";
            let row = tx
                .query_one(
                    &sql.claim,
                    &[
                        &scope,
                        &op,
                        &key,
                        &fingerprint,
                        &0i64,
                        &60_000i64,
                        &86_400_000i64,
                    ],
                )
                .await
                .unwrap();
            assert_eq!(row.get::<_, i16>(0), 1, "claim ({mode})");
            // A batch of claims: a new key, then two keys in flight.
            let keys = vec![format!("new-{mode}"), open(14), open(15)];
            let rows = tx
                .query(
                    &sql.claim_many,
                    &[
                        &vec![scope; 3],
                        &vec![op; 3],
                        &keys,
                        &vec![fingerprint; 3],
                        &vec![0i64; 3],
                        &vec![60_000i64; 3],
                        &vec![86_400_000i64; 3],
                    ],
                )
                .await
                .unwrap();
            let mut outcomes: Vec<(i64, i16)> =
                rows.iter().map(|r| (r.get(10), r.get(0))).collect();
            outcomes.sort_unstable();
            assert_eq!(
                outcomes,
                vec![(1, 0), (2, 1), (3, 1)],
                "claim_many ({mode})"
            );

            let scans = tx
                .query_one(
                    &format!(
                        "SELECT pg_stat_get_xact_numscans('{s}.idem_records_stale'::regclass), \
                         pg_stat_get_xact_numscans('{s}.idem_records'::regclass), \
                         pg_stat_get_xact_numscans('{s}.idem_records_expires_at'::regclass), \
                         pg_stat_get_xact_blocks_fetched('{s}.idem_records_pkey'::regclass)"
                    ),
                    &[],
                )
                .await
                .unwrap();
            let (stale_index_scans, table_scans, expiry_index_scans, primary_key_pages): (
                i64,
                i64,
                i64,
                i64,
            ) = (
                scans.get(0),
                scans.get(1),
                scans.get(2),
                scans.get::<_, i64>(3) - pages_before,
            );
            assert_eq!(
                stale_index_scans, 0,
                "a keyed statement scanned the stale index ({mode})"
            );
            assert_eq!(
                table_scans, 0,
                "a keyed statement scanned the table ({mode})"
            );
            assert_eq!(
                expiry_index_scans, 0,
                "a keyed statement scanned the expiry index ({mode})"
            );
            // Each statement read a root-to-leaf path of the primary key,
            // not a scope's worth of its leaves (a look-up by columns it
            // does not lead with reads them all: over 800 pages here).
            assert!(
                primary_key_pages < 400,
                "the keyed statements read {primary_key_pages} pages of the primary key ({mode})"
            );
            eprintln!("plan test ({mode}): {primary_key_pages} pages of the primary key");
            tx.rollback().await.unwrap();
        }
    });
}
