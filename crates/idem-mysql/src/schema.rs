//! The tables, the claim procedure, their migrations and the statements
//! the store runs. `{d}` stands for the database holding idem's tables.

use std::time::Duration;

use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use idem_core::{MigrationLockWaits, StoreError, StoreErrorKind};

use crate::error::my_error;

/// The migrations, in order; each is a list of statements (DDL commits
/// implicitly in MySQL, so each statement is written to be re-run safely
/// after a crash between two of them).
const MIGRATIONS: &[&[&str]] = &[
    // 1: records, and the claim procedure.
    &[
        r#"CREATE TABLE IF NOT EXISTS {d}.idem_records (
    fence            BIGINT         NOT NULL AUTO_INCREMENT,
    scope            VARBINARY(512) NOT NULL,
    operation        VARBINARY(1024) NOT NULL,
    record_key       VARBINARY(255) NOT NULL,
    fingerprint      VARBINARY(64)  NOT NULL,
    status           TINYINT        NOT NULL,
    created_at       BIGINT         NOT NULL,
    lease_until      BIGINT         NULL,
    expires_at       BIGINT         NOT NULL,
    resource_id      BLOB           NULL,
    response_status  INT            NULL,
    response_headers LONGBLOB       NULL,
    response_body    LONGBLOB       NULL,
    PRIMARY KEY (scope, operation, record_key),
    UNIQUE KEY idem_records_fence (fence),
    KEY idem_records_expires_at (expires_at),
    KEY idem_records_stale (status, lease_until),
    KEY idem_records_scope_key (scope, record_key)
) ENGINE = InnoDB"#,
        "DROP PROCEDURE IF EXISTS {d}.idem_claim",
        "{claim_procedure}",
        "DROP PROCEDURE IF EXISTS {d}.idem_claim_in_tx",
        "{claim_in_tx_procedure}",
    ],
    // 2: the store's epoch (`idem_core::EpochWatch`): one row per place
    // (this store has one, `store`), its id written once and its counter
    // advanced by every check. Not a record: no purge, stale listing or
    // look-up by key reads it, and it never expires.
    &[r#"CREATE TABLE IF NOT EXISTS {d}.idem_epoch (
    place   VARBINARY(255) NOT NULL,
    epoch   BLOB           NOT NULL,
    counter BIGINT         NOT NULL,
    PRIMARY KEY (place)
) ENGINE = InnoDB"#],
    // 3: the batch that inserted a record (`batch.rs`): a number drawn
    // for each batch of claims, written by its one insert of the keys
    // that have no record, so that the batch reads back its own rows and
    // no other's. A record claimed alone, taken over or renewed by the
    // claim procedure has none. Added as the last column (instant).
    // Run only where the column is missing ([`ADDED_COLUMNS`]): MySQL 8
    // has no `ADD COLUMN IF NOT EXISTS`.
    &["ALTER TABLE {d}.idem_records ADD COLUMN written_by BIGINT NULL"],
    // 4: the claim procedures run with their caller's privileges, not
    // their definer's (the account that migrated, which an operator may
    // drop: every call of a procedure whose definer is gone fails, 1449).
    // Their callers hold those privileges anyway: the store reads and
    // writes the records table directly. An `ALTER`, not a drop and a
    // create: the procedures exist throughout, and one whose definer is
    // already gone is repaired. New databases create them so (migration
    // 1's text).
    &[
        "ALTER PROCEDURE {d}.idem_claim SQL SECURITY INVOKER",
        "ALTER PROCEDURE {d}.idem_claim_in_tx SQL SECURITY INVOKER",
    ],
];

/// The statements of [`MIGRATIONS`] that add a column, each with the
/// table and the column: run only where the column is missing, so that a
/// migration cut off after the statement and before its record (a crash)
/// runs again. Matched by the whole statement, never by an error code (a
/// duplicate column in another statement is a mistake to report).
const ADDED_COLUMNS: &[(&str, &str, &str)] = &[(
    "ALTER TABLE {d}.idem_records ADD COLUMN written_by BIGINT NULL",
    "idem_records",
    "written_by",
)];

/// The claim procedure: docs/contract.md, *Records and their state
/// machine*, in one round trip. Outcomes as `idem_core::ClaimCode`:
/// 0 acquired, 1 in flight, 2 replay, 3 mismatch, 4 acquired by takeover.
/// Fences come from the records table's AUTO_INCREMENT, so a new or
/// taken-over record gets a new one (delete and insert) and they grow
/// across every claim.
///
/// `idem_claim` runs in a transaction of its own (`Store::claim`). After
/// losing an insert race it starts over in a new transaction: the
/// duplicate-key check left a shared lock on the winner's row, which two
/// losers could not both upgrade. `idem_claim_in_tx` runs in the caller's
/// transaction (one-commit mode) and cannot let go of that lock: a loser
/// may be chosen as a deadlock victim, before anything else ran in its
/// transaction, and the store runs it again.
pub(crate) fn claim_procedure(name: &str, own_transaction: bool) -> String {
    let (begin, commit, rollback, start_over) = if own_transaction {
        (
            "START TRANSACTION;",
            "COMMIT;",
            "ROLLBACK;",
            "ROLLBACK; START TRANSACTION;",
        )
    } else {
        ("", "", "", "")
    };
    CLAIM_PROCEDURE
        .replace("{name}", name)
        .replace("{begin}", begin)
        .replace("{commit}", commit)
        .replace("{rollback}", rollback)
        .replace("{start_over}", start_over)
}

const CLAIM_PROCEDURE: &str = r#"CREATE PROCEDURE {d}.{name}(
    IN p_scope VARBINARY(512), IN p_operation VARBINARY(1024), IN p_key VARBINARY(255),
    IN p_fingerprint VARBINARY(64), IN p_now BIGINT, IN p_lease BIGINT, IN p_ttl BIGINT)
SQL SECURITY INVOKER
BEGIN
    DECLARE v_found TINYINT DEFAULT 0;
    DECLARE v_fingerprint VARBINARY(64);
    DECLARE v_status TINYINT;
    DECLARE v_fence BIGINT;
    DECLARE v_created_at BIGINT;
    DECLARE v_lease_until BIGINT;
    DECLARE v_expires_at BIGINT;
    DECLARE v_taken TINYINT DEFAULT 0;
    DECLARE v_duplicate TINYINT DEFAULT 0;
    DECLARE CONTINUE HANDLER FOR 1062 SET v_duplicate = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN {rollback} RESIGNAL; END;
    {begin}
    claim: LOOP
        SET v_found = 0;
        SELECT 1, fingerprint, status, fence, created_at, lease_until, expires_at
          INTO v_found, v_fingerprint, v_status, v_fence, v_created_at, v_lease_until, v_expires_at
          FROM {d}.idem_records
         WHERE scope = p_scope AND operation = p_operation AND record_key = p_key
           FOR UPDATE;
        IF v_found = 0 THEN
            SET v_duplicate = 0;
            INSERT INTO {d}.idem_records
                   (scope, operation, record_key, fingerprint, status, created_at, lease_until, expires_at)
            VALUES (p_scope, p_operation, p_key, p_fingerprint, 0, p_now, p_now + p_lease, p_now + p_ttl);
            IF v_duplicate = 0 THEN
                SET v_fence = LAST_INSERT_ID();
                {commit}
                SELECT 0, v_fence, p_now, p_now + p_lease, p_now + p_ttl, 0,
                       NULL, NULL, NULL, NULL;
                LEAVE claim;
            END IF;
            -- Another claim inserted it first: lock and judge its record.
            {start_over}
            ITERATE claim;
        END IF;
        IF v_expires_at > p_now THEN
            IF v_fingerprint <> p_fingerprint THEN
                {commit}
                SELECT 3, v_fence, v_created_at, v_lease_until, v_expires_at, v_status,
                       NULL, NULL, NULL, NULL;
                LEAVE claim;
            END IF;
            IF v_status <> 0 THEN
                SELECT 2, fence, created_at, lease_until, expires_at, status,
                       resource_id, response_status, response_headers, response_body
                  FROM {d}.idem_records
                 WHERE scope = p_scope AND operation = p_operation AND record_key = p_key;
                {commit}
                LEAVE claim;
            END IF;
            IF v_lease_until > p_now THEN
                {commit}
                SELECT 1, v_fence, v_created_at, v_lease_until, v_expires_at, v_status,
                       NULL, NULL, NULL, NULL;
                LEAVE claim;
            END IF;
            SET v_taken = 1;
        END IF;
        DELETE FROM {d}.idem_records
         WHERE scope = p_scope AND operation = p_operation AND record_key = p_key;
        SET v_duplicate = 0;
        INSERT INTO {d}.idem_records
               (scope, operation, record_key, fingerprint, status, created_at, lease_until, expires_at)
        VALUES (p_scope, p_operation, p_key, p_fingerprint, 0, p_now, p_now + p_lease, p_now + p_ttl);
        IF v_duplicate = 1 THEN
            -- Only a fence collision (a restored or hand-written row) can
            -- get here: never answer with a fence that is not this row's.
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'idem_claim: the new fence collides with a stored one';
        END IF;
        SET v_fence = LAST_INSERT_ID();
        {commit}
        SELECT IF(v_taken = 1, 4, 0), v_fence, p_now, p_now + p_lease, p_now + p_ttl, 0,
               NULL, NULL, NULL, NULL;
        LEAVE claim;
    END LOOP;
END"#;

/// The newest schema version this code knows.
pub(crate) const VERSION: i32 = MIGRATIONS.len() as i32;

/// The records table, for a statement that finds its records by id
/// (scope, operation, key): through the primary key, named. Without the
/// hint the optimiser also weighs every other index the statement's
/// columns touch, (scope, record_key) for the id and (status,
/// lease_until) for `status = 0`, building a range tree for each and
/// diving into the B-tree to count each range's rows (the primary key's
/// ranges are one row each and need no dive). A batch's read-back of 100
/// ids cost MariaDB 3,070 µs of CPU that way against 380 with the hint
/// (BENCHMARKS.md, "MariaDB by the primary key, and completions by
/// `CASE`"). Not for a `DELETE`, which takes no index hint.
pub(crate) const RECORDS_BY_ID: &str = "idem_records USE INDEX (PRIMARY)";

/// The columns a record is read from, in [`crate::row`]'s order.
pub(crate) const COLUMNS: &str = "fingerprint, status, fence, created_at, lease_until, expires_at, \
     resource_id, response_status, response_headers, response_body";

/// `database` quoted for SQL (a valid name has no backquote in it, so any
/// word, `order` included, is safe).
pub(crate) fn quoted(database: &str) -> String {
    format!("`{database}`")
}

/// The server's `max_allowed_packet`, after refusing a server too old for
/// the store: fences come from `AUTO_INCREMENT`, which InnoDB keeps across
/// restarts only from MySQL 8.0 and MariaDB 10.2.4 on.
pub(crate) async fn check_server(conn: &mut Conn) -> Result<u64, StoreError> {
    let row: Option<(String, u64)> = conn
        .query_first("SELECT VERSION(), @@max_allowed_packet")
        .await
        .map_err(|e| my_error("reading the server version", e))?;
    let Some((version, max_packet)) = row else {
        return Err(StoreError::new(
            StoreErrorKind::Setup,
            "mysql store: the server did not say its version",
        ));
    };
    if !supported(&version) {
        return Err(StoreError::new(
            StoreErrorKind::Setup,
            format!(
                "mysql store: server {version} is too old: MySQL 8.0 or MariaDB 10.3 and later keep AUTO_INCREMENT across restarts, which fences need"
            ),
        ));
    }
    Ok(max_packet)
}

/// Whether a `VERSION()` string names MySQL 8+ or MariaDB 10.3+.
pub(crate) fn supported(version: &str) -> bool {
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if version.contains("MariaDB") {
        major > 10 || (major == 10 && minor >= 3)
    } else {
        major >= 8
    }
}

/// Whether `name` is a plain lower-case identifier (so it can be spliced
/// into SQL, quoted, without escaping).
pub(crate) fn valid_database_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Creates the database if needed and applies missing migrations, under a
/// named lock so that instances starting together migrate once. A
/// statement that waits for a table's metadata lock (an `ALTER` behind a
/// transaction that holds a record: atomic mode's execution, an
/// operator's session) waits at most `locks`' wait (`lock_wait_timeout`,
/// whole seconds rounded up): every later statement on the table queues
/// behind it meanwhile. Its migration is then tried again, as
/// [`MigrationLockWaits`] says (each statement is written to be re-run),
/// and after the last try the start fails as `Unavailable`. The
/// connection leaves with the pool's lock wait, `session_lock_wait`
/// seconds.
pub(crate) async fn migrate(
    conn: &mut Conn,
    database: &str,
    locks: MigrationLockWaits,
    session_lock_wait: u64,
) -> Result<(), StoreError> {
    let quoted = quoted(database);
    conn.query_drop(format!("CREATE DATABASE IF NOT EXISTS {quoted}"))
        .await
        .map_err(|e| my_error("creating the database", e))?;
    // GET_LOCK names are at most 64 characters on MySQL 8: a long database
    // name shares its lock with others of the same prefix, which only
    // serialises their migrations.
    let lock = format!("idem-migrate-{}", &database[..database.len().min(51)]);
    // The server waits in whole seconds: the tries, pauses and message go
    // by the wait it keeps.
    let seconds = locks.wait().as_secs() + u64::from(locks.wait().subsec_nanos() > 0);
    let locks = MigrationLockWaits::new(Duration::from_secs(seconds), locks.tries());
    // Another instance's migration may take all its tries and pauses:
    // wait that long for it, and a minute more (an estimate: a try of
    // several statements can wait once a statement, and the other
    // instance's waits may differ from this one's).
    let patience = locks.longest().as_secs().saturating_add(60);
    let locked: Option<i64> = conn
        .exec_first("SELECT GET_LOCK(?, ?)", (lock.as_str(), patience))
        .await
        .map_err(|e| my_error("taking the migration lock", e))?;
    if locked != Some(1) {
        return Err(StoreError::new(
            StoreErrorKind::Unavailable,
            format!(
                "mysql store: the migration lock was not had within {patience} s \
                 (another instance held it, or the wait was cut off)"
            ),
        ));
    }
    let applied = apply_in_tries(conn, database, &quoted, locks).await;
    let restored = conn
        .query_drop(format!(
            "SET SESSION lock_wait_timeout = {session_lock_wait}"
        ))
        .await
        .map_err(|e| my_error("restoring the session's lock wait", e));
    let released = conn
        .exec_drop("SELECT RELEASE_LOCK(?)", (lock.as_str(),))
        .await
        .map_err(|e| my_error("releasing the migration lock", e));
    applied.and(restored).and(released)
}

/// [`apply`] with its lock waits bounded at `locks`' wait (whole
/// seconds), tried again while they run out.
async fn apply_in_tries(
    conn: &mut Conn,
    name: &str,
    database: &str,
    locks: MigrationLockWaits,
) -> Result<(), StoreError> {
    conn.query_drop(format!(
        "SET SESSION lock_wait_timeout = {}",
        locks.wait().as_secs()
    ))
    .await
    .map_err(|e| my_error("bounding the migration's lock waits", e))?;
    let mut tries = 0;
    loop {
        tries += 1;
        match apply(conn, name, database).await {
            Err(e) if lock_wait_ran_out(&e) => {
                locks
                    .pause_or_give_up(tries, "mysql", &format!("database {name}"), e)
                    .await?;
            }
            answer => return answer,
        }
    }
}

/// Checks, without migrating, that database `database` is at this code's
/// schema version: for an instance opened beside one that migrated (a
/// gateway's serving threads), which then neither takes the migration
/// lock nor starts against a schema another idem changed meanwhile.
pub(crate) async fn check_version(conn: &mut Conn, database: &str) -> Result<(), StoreError> {
    let current = recorded_version(conn, &quoted(database))
        .await
        .map_err(|e| match e {
            // No such table (1146, MariaDB's answer for a missing database
            // too) or database (1049): nothing migrated it.
            mysql_async::Error::Server(ref server) if matches!(server.code, 1049 | 1146) => {
                StoreError::new(
                    StoreErrorKind::Setup,
                    format!(
                        "mysql store: database {database} has not been created, and this instance does not migrate"
                    ),
                )
                .with_source(e)
            }
            e => my_error("reading the schema version", e),
        })?;
    match current {
        VERSION => Ok(()),
        _ => Err(StoreError::new(
            StoreErrorKind::Setup,
            format!(
                "mysql store: database {database} is at schema version {current}, not this idem's ({VERSION}), and this instance does not migrate"
            ),
        )),
    }
}

/// The newest migration recorded in `quoted`'s migrations table (0 for
/// none).
async fn recorded_version(conn: &mut Conn, quoted: &str) -> Result<i32, mysql_async::Error> {
    let current: Option<i32> = conn
        .query_first(format!(
            "SELECT COALESCE(MAX(version), 0) FROM {quoted}.idem_migrations"
        ))
        .await?;
    Ok(current.unwrap_or(0))
}

/// Whether `e` is the server's "lock wait timeout exceeded" (1205): a
/// metadata lock (`lock_wait_timeout`) or a row lock
/// (`innodb_lock_wait_timeout`) waited out.
fn lock_wait_ran_out(e: &StoreError) -> bool {
    matches!(
        e.cause().and_then(|c| c.downcast_ref::<mysql_async::Error>()),
        Some(mysql_async::Error::Server(server)) if server.code == 1205
    )
}

async fn apply(conn: &mut Conn, name: &str, database: &str) -> Result<(), StoreError> {
    conn.query_drop(format!(
        "CREATE TABLE IF NOT EXISTS {database}.idem_migrations (
             version INT PRIMARY KEY,
             applied_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE = InnoDB"
    ))
    .await
    .map_err(|e| my_error("creating the migrations table", e))?;
    let current = recorded_version(conn, database)
        .await
        .map_err(|e| my_error("reading the schema version", e))?;
    if current > VERSION {
        return Err(StoreError::new(
            StoreErrorKind::Setup,
            format!(
                "mysql store: database {database} is at schema version {current}, newer than this idem ({VERSION})"
            ),
        ));
    }
    for (i, statements) in MIGRATIONS.iter().enumerate().skip(current.max(0) as usize) {
        for sql in *statements {
            if let Some((_, table, column)) = ADDED_COLUMNS.iter().find(|(s, _, _)| s == sql) {
                let there: Option<i64> = conn
                    .exec_first(
                        "SELECT COUNT(*) FROM information_schema.columns \
                         WHERE table_schema = ? AND table_name = ? AND column_name = ?",
                        (name, *table, *column),
                    )
                    .await
                    .map_err(|e| my_error("reading the tables' columns", e))?;
                if there.unwrap_or(0) > 0 {
                    continue;
                }
            }
            let sql = sql
                .replace("{claim_procedure}", &claim_procedure("idem_claim", true))
                .replace(
                    "{claim_in_tx_procedure}",
                    &claim_procedure("idem_claim_in_tx", false),
                )
                .replace("{d}", database);
            conn.query_drop(sql)
                .await
                .map_err(|e| my_error("applying a migration", e))?;
        }
        conn.exec_drop(
            format!("INSERT INTO {database}.idem_migrations (version) VALUES (?)"),
            (i as i32 + 1,),
        )
        .await
        .map_err(|e| my_error("recording a migration", e))?;
    }
    Ok(())
}

/// The text of every statement the store runs, with the database name in
/// it. mysql_async caches each prepared statement per connection.
#[derive(Debug)]
pub(crate) struct Statements {
    /// Calls `idem_claim`: the whole claim in one round trip.
    pub(crate) claim: String,
    /// Calls `idem_claim_in_tx`: the claim in the caller's transaction.
    pub(crate) claim_in_tx: String,
    /// Stores a completion if the fence still holds the record.
    pub(crate) complete: String,
    /// Deletes the record if the fence still holds it.
    pub(crate) release: String,
    /// Moves the lease end, never earlier, and raises `expires_at` to at
    /// least that end, if the fence still holds the record (a lease
    /// heartbeat): the new end three times, then the id and fence.
    pub(crate) extend: String,
    /// Whether the fence holds the record, changing nothing: `extend`'s
    /// second look when it changed no row.
    pub(crate) holds: String,
    /// The live record with an id ([`COLUMNS`]).
    pub(crate) get: String,
    /// Locks the record if the fence still holds it (atomic mode).
    pub(crate) lock: String,
    /// Deletes a bounded batch of expired records.
    pub(crate) purge: String,
    /// A page of stale records ([`COLUMNS`], then scope, operation, key).
    pub(crate) stale: String,
    /// The live records of a (scope, key), newest first ([`COLUMNS`], then
    /// operation).
    pub(crate) by_key: String,
    /// Writes the epoch of a place that has none (the place, the
    /// candidate), or adds one to its counter: one row affected when it
    /// inserted, two when it updated (the counter always changes, so never
    /// zero, whatever `CLIENT_FOUND_ROWS`).
    pub(crate) epoch_advance: String,
    /// The epoch and counter of a place, read after `epoch_advance` in its
    /// transaction (which holds the row's lock until the commit).
    pub(crate) epoch_read: String,
}

impl Statements {
    /// The statements for the tables in database `d`.
    pub(crate) fn new(database: &str) -> Statements {
        let d = quoted(database);
        let id = "scope = ? AND operation = ? AND record_key = ?";
        Statements {
            claim: format!("CALL {d}.idem_claim(?, ?, ?, ?, ?, ?, ?)"),
            claim_in_tx: format!("CALL {d}.idem_claim_in_tx(?, ?, ?, ?, ?, ?, ?)"),
            complete: format!(
                "UPDATE {d}.{RECORDS_BY_ID} SET status = ?, resource_id = ?, response_status = ?, \
                 response_headers = ?, response_body = ?, lease_until = NULL \
                 WHERE {id} AND fence = ? AND status = 0"
            ),
            release: format!(
                "DELETE FROM {d}.idem_records WHERE {id} AND fence = ? AND status = 0"
            ),
            // MySQL evaluates single-table assignments left to right, so
            // `expires_at` is raised from the new end itself (a parameter),
            // not from the `lease_until` just written.
            extend: format!(
                "UPDATE {d}.{RECORDS_BY_ID} SET lease_until = GREATEST(COALESCE(lease_until, ?), ?), \
                 expires_at = GREATEST(expires_at, ?) \
                 WHERE {id} AND fence = ? AND status = 0"
            ),
            holds: format!(
                "SELECT 1 FROM {d}.{RECORDS_BY_ID} WHERE {id} AND fence = ? AND status = 0"
            ),
            get: format!("SELECT {COLUMNS} FROM {d}.{RECORDS_BY_ID} WHERE {id} AND expires_at > ?"),
            lock: format!(
                "SELECT 1 FROM {d}.{RECORDS_BY_ID} WHERE {id} AND fence = ? AND status = 0 FOR UPDATE"
            ),
            purge: format!(
                "DELETE FROM {d}.idem_records WHERE expires_at <= ? ORDER BY expires_at LIMIT ?"
            ),
            stale: format!(
                "SELECT {COLUMNS}, scope, operation, record_key FROM {d}.idem_records \
                 WHERE status = 0 AND lease_until <= ? AND expires_at > ? \
                 AND (lease_until, scope, operation, record_key) > (?, ?, ?, ?) \
                 ORDER BY lease_until, scope, operation, record_key LIMIT ?"
            ),
            by_key: format!(
                "SELECT {COLUMNS}, operation FROM {d}.idem_records \
                 WHERE scope = ? AND record_key = ? AND expires_at > ? \
                 ORDER BY created_at DESC, operation DESC LIMIT ?"
            ),
            epoch_advance: format!(
                "INSERT INTO {d}.idem_epoch (place, epoch, counter) VALUES (?, ?, 1) \
                 ON DUPLICATE KEY UPDATE counter = counter + 1"
            ),
            epoch_read: format!("SELECT epoch, counter FROM {d}.idem_epoch WHERE place = ?"),
        }
    }
}
