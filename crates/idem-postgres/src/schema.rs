//! The schema: its migrations, applied on connect, and the statements the
//! store runs against it.
//!
//! Migrations run under a transaction-scoped advisory lock keyed on the
//! schema name, so instances that start at the same moment apply each
//! migration once: the second waits for the first, then finds nothing to do.

use deadpool_postgres::Client;
use idem_core::{MigrationLockWaits, StoreError};
use tokio_postgres::error::SqlState;

use crate::error::pg_error;
use crate::row::COLUMNS;

/// Advisory lock namespace ("idem" in ASCII).
const LOCK_CLASS: i32 = 0x6964_656d;

/// The migrations, in order; `{s}` stands for the quoted schema name.
///
/// A migration may change the columns that reads return (instances of
/// this version on prepare those reads again, `forget_changed_plans`; the
/// previous version's must be restarted), but never the result of a
/// statement a claim, completion or release prepares (`idem_claim`'s and
/// the batch functions' `RETURNS TABLE`, a `RETURNING` list): the server
/// would refuse it on every connection of every running instance, and
/// those calls fail closed rather than try again. Such a change is a new
/// function beside the old one.
const MIGRATIONS: &[&str] = &[
    // 1: records, the fence sequence, and the claim function.
    r#"
CREATE TABLE {s}.idem_records (
    scope            text     NOT NULL,
    operation        text     NOT NULL,
    key              text     NOT NULL,
    fingerprint      bytea    NOT NULL,
    status           smallint NOT NULL,
    fence            bigint   NOT NULL,
    created_at       bigint   NOT NULL,
    lease_until      bigint,
    expires_at       bigint   NOT NULL,
    resource_id      text,
    response_status  integer,
    response_headers bytea,
    response_body    bytea,
    PRIMARY KEY (scope, operation, key)
);
CREATE INDEX idem_records_expires_at ON {s}.idem_records (expires_at);
CREATE SEQUENCE {s}.idem_fence;

-- Claim: docs/contract.md, *Records and their state machine* in one round trip. Outcomes:
-- 0 acquired, 1 in flight, 2 replay, 3 mismatch, 4 acquired by takeover.
CREATE FUNCTION {s}.idem_claim(
    p_scope text, p_operation text, p_key text, p_fingerprint bytea,
    p_now bigint, p_lease bigint, p_ttl bigint)
RETURNS TABLE (outcome smallint, fence bigint, created_at bigint, lease_until bigint,
               expires_at bigint, status smallint, resource_id text, response_status integer,
               response_headers bytea, response_body bytea)
LANGUAGE plpgsql AS $fn$
DECLARE
    r {s}.idem_records%ROWTYPE;
    f bigint;
    taken boolean := false;
BEGIN
    LOOP
        SELECT * INTO r FROM {s}.idem_records AS t
         WHERE t.scope = p_scope AND t.operation = p_operation AND t.key = p_key
         FOR UPDATE;
        IF NOT FOUND THEN
            f := nextval('{s}.idem_fence');
            INSERT INTO {s}.idem_records AS t (scope, operation, key, fingerprint, status, fence,
                                               created_at, lease_until, expires_at)
            VALUES (p_scope, p_operation, p_key, p_fingerprint, 0, f,
                    p_now, p_now + p_lease, p_now + p_ttl)
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                RETURN QUERY SELECT 0::smallint, f, p_now, p_now + p_lease, p_now + p_ttl,
                    0::smallint, NULL::text, NULL::integer, NULL::bytea, NULL::bytea;
                RETURN;
            END IF;
            -- Another claim inserted it first: lock and judge theirs.
            CONTINUE;
        END IF;
        IF r.expires_at > p_now THEN
            IF r.fingerprint <> p_fingerprint THEN
                RETURN QUERY SELECT 3::smallint, r.fence, r.created_at, r.lease_until, r.expires_at,
                    r.status, NULL::text, NULL::integer, NULL::bytea, NULL::bytea;
                RETURN;
            END IF;
            IF r.status <> 0 THEN
                RETURN QUERY SELECT 2::smallint, r.fence, r.created_at, r.lease_until, r.expires_at,
                    r.status, r.resource_id, r.response_status, r.response_headers, r.response_body;
                RETURN;
            END IF;
            IF r.lease_until > p_now THEN
                RETURN QUERY SELECT 1::smallint, r.fence, r.created_at, r.lease_until, r.expires_at,
                    r.status, NULL::text, NULL::integer, NULL::bytea, NULL::bytea;
                RETURN;
            END IF;
            taken := true;
        END IF;
        f := nextval('{s}.idem_fence');
        UPDATE {s}.idem_records AS t
           SET fingerprint = p_fingerprint, status = 0, fence = f, created_at = p_now,
               lease_until = p_now + p_lease, expires_at = p_now + p_ttl, resource_id = NULL,
               response_status = NULL, response_headers = NULL, response_body = NULL
         WHERE t.scope = p_scope AND t.operation = p_operation AND t.key = p_key;
        RETURN QUERY SELECT (CASE WHEN taken THEN 4 ELSE 0 END)::smallint, f, p_now,
            p_now + p_lease, p_now + p_ttl, 0::smallint, NULL::text, NULL::integer,
            NULL::bytea, NULL::bytea;
        RETURN;
    END LOOP;
END
$fn$;
"#,
    // 2: stale-record listing reads only in-progress records, in lease order.
    r#"
CREATE INDEX idem_records_stale ON {s}.idem_records (lease_until, scope, operation, key) WHERE status = 0;
"#,
    // 3: the look-up by (scope, key) whatever the operation (the
    // reconciliation read path, `Store::find_by_key`).
    r#"
CREATE INDEX idem_records_scope_key ON {s}.idem_records (scope, key);
"#,
    // 4: the store's epoch (`idem_core::EpochWatch`): one row per place
    // (this store has one, `store`), its id written once and its counter
    // advanced by every check. Not a record: no purge, stale listing or
    // look-up by key reads it, and it never expires.
    r#"
CREATE TABLE {s}.idem_epoch (
    place   text   PRIMARY KEY,
    epoch   text   NOT NULL,
    counter bigint NOT NULL
);
"#,
    // 5: a batch's claims, completions and releases (`batch.rs`).
    //
    // Claims, sorted by id (calls for one id together, in arrival order):
    // the first call of each id whose key has no record is inserted, all
    // by one statement, in that order, each with a fence of its own; every
    // other call (a key with a record, live or not, or a later call for
    // one id) is then judged by `idem_claim`, in the same order, as it
    // would be alone. Answers `idem_claim`'s columns and the 1-based
    // position of the call.
    //
    // Completions and releases: one statement per call, each finding its
    // record by the primary key. A join of the batch against the table
    // leaves the plan to the statistics: with few records in progress
    // (the usual state) it was planned as a scan of every in-progress
    // record through the stale index, per batch, and on a new table as a
    // scan of the whole table. "In progress" is written
    // `(t.status + 0) = 0` so that no plan can use that index
    // (`Statements::new`, docs/decisions.md). Each answers the 1-based
    // positions of the calls that changed their record.
    r#"
CREATE FUNCTION {s}.idem_claim_many(
    p_scope text[], p_operation text[], p_key text[], p_fingerprint bytea[],
    p_now bigint[], p_lease bigint[], p_ttl bigint[])
RETURNS TABLE (o_outcome smallint, o_fence bigint, o_created_at bigint, o_lease_until bigint,
               o_expires_at bigint, o_status smallint, o_resource_id text,
               o_response_status integer, o_response_headers bytea, o_response_body bytea,
               o_ord bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    c record;
    inserted bigint[] := '{}';
BEGIN
    -- Only the first call for each id is tried here (the calls come
    -- sorted by id, so later ones follow it): a later one inserted after
    -- the first met a record that then vanished would be answered to the
    -- first call, with the later call's fingerprint and times. Each row's
    -- fence is drawn as that row is inserted, never ahead of an insert of
    -- an earlier row that may wait on another transaction (a fence drawn
    -- early could be stored after a larger one handed out meanwhile).
    FOR c IN
        WITH ins AS (
            INSERT INTO {s}.idem_records AS t (scope, operation, key, fingerprint, status, fence,
                                               created_at, lease_until, expires_at)
            SELECT u.scope, u.operation, u.key, u.fingerprint, 0, nextval('{s}.idem_fence'),
                   u.now, u.now + u.lease, u.now + u.ttl
              FROM unnest(p_scope, p_operation, p_key, p_fingerprint, p_now, p_lease, p_ttl)
                   WITH ORDINALITY AS u(scope, operation, key, fingerprint, now, lease, ttl, ord)
             WHERE u.ord = 1
                OR (u.scope, u.operation, u.key) IS DISTINCT FROM
                   (p_scope[u.ord - 1], p_operation[u.ord - 1], p_key[u.ord - 1])
            ON CONFLICT DO NOTHING
            RETURNING t.scope, t.operation, t.key, t.fence, t.created_at, t.lease_until,
                      t.expires_at
        ), firsts AS (
            SELECT k.scope, k.operation, k.key, min(k.ord) AS ord
              FROM unnest(p_scope, p_operation, p_key) WITH ORDINALITY AS k(scope, operation, key, ord)
             GROUP BY k.scope, k.operation, k.key
        )
        SELECT f.ord, ins.fence, ins.created_at, ins.lease_until, ins.expires_at
          FROM ins JOIN firsts AS f
            ON f.scope = ins.scope AND f.operation = ins.operation AND f.key = ins.key
    LOOP
        inserted := inserted || c.ord;
        o_outcome := 0; o_fence := c.fence; o_created_at := c.created_at;
        o_lease_until := c.lease_until; o_expires_at := c.expires_at; o_status := 0;
        o_resource_id := NULL; o_response_status := NULL; o_response_headers := NULL;
        o_response_body := NULL; o_ord := c.ord;
        RETURN NEXT;
    END LOOP;
    FOR c IN
        SELECT u.* FROM unnest(p_scope, p_operation, p_key, p_fingerprint, p_now, p_lease, p_ttl)
                        WITH ORDINALITY AS u(scope, operation, key, fingerprint, now, lease, ttl, ord)
         WHERE u.ord <> ALL (inserted)
         ORDER BY u.ord
    LOOP
        RETURN QUERY SELECT r.*, c.ord
            FROM {s}.idem_claim(c.scope, c.operation, c.key, c.fingerprint, c.now, c.lease, c.ttl) AS r;
    END LOOP;
END
$fn$;

CREATE FUNCTION {s}.idem_complete_many(
    p_scope text[], p_operation text[], p_key text[], p_fence bigint[], p_status smallint[],
    p_resource_id text[], p_response_status integer[], p_response_headers bytea[],
    p_response_body bytea[])
RETURNS SETOF bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT * FROM unnest(p_scope, p_operation, p_key, p_fence, p_status, p_resource_id,
                                  p_response_status, p_response_headers, p_response_body)
                      WITH ORDINALITY AS u(scope, operation, key, fence, status, resource_id,
                                           response_status, response_headers, response_body, ord)
    LOOP
        UPDATE {s}.idem_records AS t
           SET status = c.status, resource_id = c.resource_id,
               response_status = c.response_status, response_headers = c.response_headers,
               response_body = c.response_body, lease_until = NULL
         WHERE t.scope = c.scope AND t.operation = c.operation AND t.key = c.key
           AND t.fence = c.fence AND (t.status + 0) = 0;
        IF FOUND THEN
            RETURN NEXT c.ord;
        END IF;
    END LOOP;
END
$fn$;

CREATE FUNCTION {s}.idem_release_many(
    p_scope text[], p_operation text[], p_key text[], p_fence bigint[])
RETURNS SETOF bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT * FROM unnest(p_scope, p_operation, p_key, p_fence)
                      WITH ORDINALITY AS u(scope, operation, key, fence, ord)
    LOOP
        DELETE FROM {s}.idem_records AS t
         WHERE t.scope = c.scope AND t.operation = c.operation AND t.key = c.key
           AND t.fence = c.fence AND (t.status + 0) = 0;
        IF FOUND THEN
            RETURN NEXT c.ord;
        END IF;
    END LOOP;
END
$fn$;
"#,
    // 6: keys compare as bytes, and the primary key leads with (scope,
    // key). The key columns take `COLLATE "C"`: equality is byte equality
    // under any deterministic collation, so no id changes meaning, and
    // every index on them compares with `memcmp` instead of the
    // database's locale (`strcoll`). The primary key becomes (scope, key,
    // operation), which also serves the look-up by (scope, key), so the
    // index of version 3 goes: an insert writes three index entries, not
    // four, and a completion (never a HOT update) two, not three. The indexes are
    // rebuilt inside the migration's transaction, holding the table's
    // lock while they are (docs/decisions.md, "Keys compare as bytes").
    // The index that goes is dropped first, so that the type change does
    // not rebuild it (about half the time the lock is held).
    r#"
DROP INDEX IF EXISTS {s}.idem_records_scope_key;
ALTER TABLE {s}.idem_records
    ALTER COLUMN scope TYPE text COLLATE "C",
    ALTER COLUMN operation TYPE text COLLATE "C",
    ALTER COLUMN key TYPE text COLLATE "C",
    DROP CONSTRAINT idem_records_pkey,
    ADD CONSTRAINT idem_records_pkey PRIMARY KEY (scope, key, operation);
"#,
];

/// "The record is in progress", in statements that find a record by its
/// id: `status` is 0, written so that the planner cannot take it for the
/// stale index's predicate (`WHERE status = 0`). Written plainly, a plan
/// could use that index whenever the statistics say few records are in
/// progress (most of the time), and read every in-progress record to find
/// the one (docs/decisions.md, "Keyed statements never scan the stale
/// index").
const IN_PROGRESS: &str = "(status + 0) = 0";

/// The newest schema version this code knows.
pub(crate) const VERSION: i32 = MIGRATIONS.len() as i32;

/// Whether `name` is a plain lower-case identifier (so it can be spliced
/// into SQL without quoting surprises).
pub(crate) fn valid_schema_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Creates the schema and applies missing migrations, in one transaction
/// under the migration lock (an advisory lock: instances that start
/// together migrate once, the others waiting for it as long as that
/// takes). The migrations are applied in a savepoint a try: a try that
/// cannot have a table's lock within `locks`' wait (a transaction holds a
/// record: atomic mode's execution, an operator's session) is rolled back
/// to it, which lets go of every table lock it took or queued for, and is
/// tried again after a pause, as [`MigrationLockWaits`] says; after the
/// last, the start fails as `Unavailable`, with nothing applied. The
/// migration lock is held through the pauses, so that claims pass during
/// them however many instances are starting (another instance's try
/// would otherwise take the pause's place in the table's lock queue).
pub(crate) async fn migrate(
    client: &mut Client,
    schema: &str,
    locks: MigrationLockWaits,
) -> Result<(), StoreError> {
    let mut tx = client
        .transaction()
        .await
        .map_err(|e| pg_error("beginning the migration", e))?;
    // The advisory lock waits for another instance's migration as long as
    // that takes, whatever `lock_timeout` the role or database sets; and
    // the transaction idles in the pauses, which a server's
    // `idle_in_transaction_session_timeout` must not cut off.
    tx.batch_execute(
        "SET LOCAL lock_timeout = 0; SET LOCAL idle_in_transaction_session_timeout = 0",
    )
    .await
    .map_err(|e| pg_error("preparing the migration", e))?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&LOCK_CLASS, &schema],
    )
    .await
    .map_err(|e| pg_error("taking the migration lock", e))?;
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = {}",
        locks.wait().as_millis()
    ))
    .await
    .map_err(|e| pg_error("bounding the migration's lock waits", e))?;
    let mut tries = 0;
    loop {
        tries += 1;
        let attempt = tx
            .savepoint("idem_migration_try")
            .await
            .map_err(|e| pg_error("beginning a try of the migration", e))?;
        match apply(&attempt, schema).await {
            Ok(()) => {
                attempt
                    .commit()
                    .await
                    .map_err(|e| pg_error("ending a try of the migration", e))?;
                break;
            }
            Err(e) if lock_not_available(&e) => {
                attempt
                    .rollback()
                    .await
                    .map_err(|e| pg_error("undoing a try of the migration", e))?;
                locks
                    .pause_or_give_up(tries, "postgres", &format!("schema {schema}"), e)
                    .await?;
            }
            Err(e) => return Err(e),
        }
    }
    tx.commit()
        .await
        .map_err(|e| pg_error("committing the migration", e))
}

/// Whether `e` is the server's "lock not available" (`lock_timeout`).
fn lock_not_available(e: &StoreError) -> bool {
    e.cause()
        .and_then(|c| c.downcast_ref::<tokio_postgres::Error>())
        .and_then(tokio_postgres::Error::code)
        == Some(&SqlState::LOCK_NOT_AVAILABLE)
}

/// Creates the schema and its migrations table if missing, and applies
/// the migrations after the version recorded, each recorded as it is.
async fn apply(tx: &deadpool_postgres::Transaction<'_>, schema: &str) -> Result<(), StoreError> {
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS {schema}.idem_migrations (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now());"
    ))
    .await
    .map_err(|e| pg_error("creating the schema", e))?;
    let current: i32 = tx
        .query_one(&version_sql(schema), &[])
        .await
        .map_err(|e| pg_error("reading the schema version", e))?
        .get(0);
    if current > VERSION {
        return Err(newer(schema, current));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let version = i as i32 + 1;
        tx.batch_execute(&sql.replace("{s}", schema))
            .await
            .map_err(|e| pg_error("applying a migration", e))?;
        tx.execute(
            &format!("INSERT INTO {schema}.idem_migrations (version) VALUES ($1)"),
            &[&version],
        )
        .await
        .map_err(|e| pg_error("recording a migration", e))?;
    }
    Ok(())
}

/// Checks, without the migration lock, that `schema` is at this code's
/// version: for an instance opened beside one that migrated it (a
/// gateway's serving threads).
pub(crate) async fn check_version(client: &Client, schema: &str) -> Result<(), StoreError> {
    let current: i32 = client
        .query_one(
            &version_sql(schema),
            &[],
        )
        .await
        .map_err(|e| match e.code() {
            // No such schema or table: nothing migrated it yet.
            Some(c) if *c == SqlState::UNDEFINED_TABLE || *c == SqlState::INVALID_SCHEMA_NAME => {
                StoreError::new(
                    idem_core::StoreErrorKind::Setup,
                    format!(
                        "postgres store: schema {schema} has not been created, and this instance does not migrate"
                    ),
                )
                .with_source(e)
            }
            _ => pg_error("reading the schema version", e),
        })?
        .get(0);
    match current {
        VERSION => Ok(()),
        newer_one if newer_one > VERSION => Err(newer(schema, current)),
        _ => Err(StoreError::new(
            idem_core::StoreErrorKind::Setup,
            format!(
                "postgres store: schema {schema} is at version {current}, older than this idem ({VERSION}), and this instance does not migrate"
            ),
        )),
    }
}

/// Reads a schema's version: the last migration applied to it (0 for
/// none).
fn version_sql(schema: &str) -> String {
    format!("SELECT coalesce(max(version), 0) FROM {schema}.idem_migrations")
}

/// A schema migrated by a newer idem than this one.
fn newer(schema: &str, current: i32) -> StoreError {
    StoreError::new(
        idem_core::StoreErrorKind::Setup,
        format!(
            "postgres store: schema {schema} is at version {current}, newer than this idem ({VERSION})"
        ),
    )
}

/// The text of every statement the store runs, with the schema name in it.
/// Each is prepared once per pooled connection (`prepare_cached`).
pub(crate) struct Statements {
    /// Calls `idem_claim`: the whole claim in one round trip.
    pub(crate) claim: String,
    /// Inside a transaction marked `idem.in_claim` (one-commit mode's
    /// `BEGIN`), inserts an in-progress record for a key that has none and returns
    /// its fence, lease end and expiry; returns no row if the key has a record (live or not),
    /// which `claim` then judges. The fast path of one-commit mode.
    pub(crate) claim_new: String,
    /// [`claim`](Self::claim) for each element of the arrays `$1`..`$7`
    /// (scope, operation, key, fingerprint, now, lease, ttl), in their
    /// order, in one statement (`idem_claim_many`: new keys inserted
    /// together, the rest judged by `idem_claim`): `idem_claim`'s
    /// columns, then the 1-based position of the call (`batch.rs`).
    pub(crate) claim_many: String,
    /// Stores a completion if the fence still holds the record.
    pub(crate) complete: String,
    /// [`complete`](Self::complete) for each element of the arrays
    /// `$1`..`$9`, one keyed update per call (`idem_complete_many`):
    /// answers the 1-based position of each call that changed its record.
    pub(crate) complete_many: String,
    /// [`complete`](Self::complete), raising division by zero (SQLSTATE
    /// 22012) when it changes no record, and marking the transaction with
    /// the fence (`idem.completed`) when it does: the pipelined `COMMIT` of
    /// one-commit mode checks that mark.
    pub(crate) complete_or_fail: String,
    /// Deletes the record if the fence still holds it.
    pub(crate) release: String,
    /// [`release`](Self::release) for each element of the arrays
    /// `$1`..`$4`, one keyed delete per call (`idem_release_many`):
    /// answers the 1-based position of each call that deleted its record.
    pub(crate) release_many: String,
    /// Moves the lease end to `$5`, never earlier, and raises `expires_at`
    /// to at least `$5`, if the fence still holds the record (a lease
    /// heartbeat).
    pub(crate) extend: String,
    /// The live record with an id ([`COLUMNS`]).
    pub(crate) get: String,
    /// Locks the record if the fence still holds it (atomic mode).
    pub(crate) lock: String,
    /// Deletes a bounded batch of expired records, skipping locked ones.
    pub(crate) purge: String,
    /// A page of stale records ([`COLUMNS`], then scope, operation, key).
    pub(crate) stale: String,
    /// The live records of a (scope, key), newest first ([`COLUMNS`], then
    /// operation).
    pub(crate) by_key: String,
    /// Advances the epoch of the place `$1`, writing `$2` with the counter
    /// at 1 if it has none, in one statement: answers the epoch, the
    /// counter, and whether this statement inserted the row (a row just
    /// inserted has no `xmax`; one updated by `ON CONFLICT` carries the
    /// updating transaction's).
    pub(crate) epoch: String,
}

impl Statements {
    /// The statements for the tables in schema `s`.
    pub(crate) fn new(s: &str) -> Statements {
        let complete = format!(
            "UPDATE {s}.idem_records SET status = $5, resource_id = $6, response_status = $7, \
             response_headers = $8, response_body = $9, lease_until = NULL \
             WHERE scope = $1 AND operation = $2 AND key = $3 AND fence = $4 AND {IN_PROGRESS}"
        );
        Statements {
            claim: format!("SELECT * FROM {s}.idem_claim($1, $2, $3, $4, $5, $6, $7)"),
            claim_many: format!(
                "SELECT * FROM {s}.idem_claim_many($1::text[], $2::text[], $3::text[], \
                 $4::bytea[], $5::bigint[], $6::bigint[], $7::bigint[])"
            ),
            complete_many: format!(
                "SELECT {s}.idem_complete_many($1::text[], $2::text[], $3::text[], \
                 $4::bigint[], $5::smallint[], $6::text[], $7::integer[], $8::bytea[], $9::bytea[])"
            ),
            release_many: format!(
                "SELECT {s}.idem_release_many($1::text[], $2::text[], $3::text[], $4::bigint[])"
            ),
            claim_new: format!(
                "INSERT INTO {s}.idem_records AS t (scope, operation, key, fingerprint, status, \
                 fence, created_at, lease_until, expires_at) \
                 SELECT $1::text, $2::text, $3::text, $4::bytea, 0, nextval('{s}.idem_fence'), \
                 $5::bigint, $5::bigint + $6::bigint, $5::bigint + $7::bigint \
                 WHERE current_setting('idem.in_claim', true) = 'on' \
                 ON CONFLICT DO NOTHING RETURNING fence, lease_until, expires_at"
            ),
            complete_or_fail: format!(
                "WITH done AS ({complete} RETURNING 1) \
                 SELECT 1 / count(*), set_config('idem.completed', $4::text, true) FROM done"
            ),
            complete,
            release: format!(
                "DELETE FROM {s}.idem_records \
                 WHERE scope = $1 AND operation = $2 AND key = $3 AND fence = $4 AND {IN_PROGRESS}"
            ),
            // GREATEST skips a NULL, which an in-progress record never has.
            // `expires_at` rises with the lease so the record outlives it;
            // left equal (the usual heartbeat, well inside the ttl), the
            // indexed column keeps the update HOT.
            extend: format!(
                "UPDATE {s}.idem_records SET lease_until = GREATEST(lease_until, $5), \
                 expires_at = GREATEST(expires_at, $5) \
                 WHERE scope = $1 AND operation = $2 AND key = $3 AND fence = $4 AND {IN_PROGRESS}"
            ),
            get: format!(
                "SELECT {COLUMNS} FROM {s}.idem_records \
                 WHERE scope = $1 AND operation = $2 AND key = $3 AND expires_at > $4"
            ),
            lock: format!(
                "SELECT 1 FROM {s}.idem_records \
                 WHERE scope = $1 AND operation = $2 AND key = $3 AND fence = $4 AND {IN_PROGRESS} \
                 FOR UPDATE"
            ),
            purge: format!(
                "DELETE FROM {s}.idem_records WHERE ctid = ANY (ARRAY( \
                 SELECT ctid FROM {s}.idem_records WHERE expires_at <= $1 \
                 LIMIT $2 FOR UPDATE SKIP LOCKED))"
            ),
            stale: format!(
                "SELECT {COLUMNS}, scope, operation, key \
                 FROM {s}.idem_records WHERE status = 0 AND lease_until <= $1 AND expires_at > $1 \
                 AND (lease_until, scope, operation, key) > ($2, $3, $4, $5) \
                 ORDER BY lease_until, scope, operation, key LIMIT $6"
            ),
            // Operations compare as bytes (`COLLATE "C"`), as in every other
            // store, whatever the database's collation.
            by_key: format!(
                "SELECT {COLUMNS}, operation \
                 FROM {s}.idem_records WHERE scope = $1 AND key = $2 AND expires_at > $3 \
                 ORDER BY created_at DESC, operation COLLATE \"C\" DESC LIMIT $4"
            ),
            epoch: format!(
                "INSERT INTO {s}.idem_epoch AS t (place, epoch, counter) VALUES ($1, $2, 1) \
                 ON CONFLICT (place) DO UPDATE SET counter = t.counter + 1 \
                 RETURNING t.epoch, t.counter, (t.xmax = 0) AS created"
            ),
        }
    }
}
