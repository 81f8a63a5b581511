//! Opening a database file as a store: checks, pragmas, schema.
//!
//! A store file is marked with `PRAGMA application_id` and versioned with
//! `PRAGMA user_version`, so that opening some other SQLite file, or a file
//! written by a newer idem, fails with a clear error instead of writing into
//! it.

use std::path::Path;

use idem_core::StoreError;
use rusqlite::{Connection, OpenFlags};

use crate::error::{setup, setup_error};
use crate::synchronous::Synchronous;

/// "idem" in ASCII.
const APPLICATION_ID: i64 = 0x6964_656d;
/// The schema this code writes.
pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Migration `i` takes the schema from version `i` to `i + 1`, inside the
/// migration's transaction.
const MIGRATIONS: [fn(&Connection) -> rusqlite::Result<()>; 6] = [
    |c| c.execute_batch(SCHEMA_V1),
    |c| c.execute_batch(SCHEMA_V2),
    |c| c.execute_batch(SCHEMA_V3),
    |c| c.execute_batch(SCHEMA_V4),
    migrate_to_v5,
    |c| c.execute_batch(SCHEMA_V6),
];

const SCHEMA_V1: &str = "
CREATE TABLE idem_records (
    scope            TEXT    NOT NULL,
    operation        TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    fingerprint      BLOB    NOT NULL,
    status           INTEGER NOT NULL,
    fence            INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    lease_until      INTEGER,
    expires_at       INTEGER NOT NULL,
    resource_id      TEXT,
    response_status  INTEGER,
    response_headers BLOB,
    response_body    BLOB,
    PRIMARY KEY (scope, operation, key)
) WITHOUT ROWID;
CREATE INDEX idem_records_expires_at ON idem_records (expires_at);
CREATE TABLE idem_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO idem_meta (name, value) VALUES ('fence', 0);
";

/// Stale-record listing: only in-progress records, in lease order.
const SCHEMA_V2: &str = "
CREATE INDEX idem_records_stale ON idem_records (lease_until, scope, operation, key) WHERE status = 0;
";

/// Look-up by (scope, key) whatever the operation (the reconciliation read
/// path, `Store::find_by_key`).
const SCHEMA_V3: &str = "
CREATE INDEX idem_records_scope_key ON idem_records (scope, key);
";

/// The fence counter moves from `idem_meta` to `idem_counters`, raised
/// above the largest fence a record holds, and then (in a file that drew
/// any) by 2^20 more for the fences of records since released or purged (an
/// older idem with two processes on one file could lower the counter below
/// what it had drawn). An older idem still running on the file when it is
/// migrated then cannot draw a fence any more (its claims fail, closed)
/// instead of drawing from its own stale count.
///
/// Schema 4 also rebuilt the table keyed by (scope, key, operation), which
/// dropped schema 3's (scope, key) index. Schema 5 rebuilds it again, so a
/// file older than 4 gets only schema 5's rebuild, once: migration 4 is the
/// counter and the dropping of schema 3's index (idem's own here; in a
/// schema 4 file an index of that name would be the application's, which
/// schema 5's rebuild keeps).
const SCHEMA_V4: &str = "
DROP INDEX IF EXISTS idem_records_scope_key;
CREATE TABLE idem_counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO idem_counters (name, value)
SELECT 'fence', CASE WHEN drawn <= 0 THEN 0
    WHEN drawn > 9223372036854775807 - 1048576 THEN 9223372036854775807
    ELSE drawn + 1048576 END FROM (SELECT max(
    coalesce((SELECT value FROM idem_meta WHERE name = 'fence'), 0),
    coalesce((SELECT max(fence) FROM idem_records), 0)) AS drawn);
DROP TABLE idem_meta;
";

/// Records in the order they were written, found by key through a unique
/// index: a table with a rowid, where schema 4's table was keyed by (scope,
/// key, operation) itself.
///
/// With random keys, a new key's claim used to insert its whole row into a
/// random page of the table, and its completion rewrote that page in a
/// later commit: two WAL frames a request for the table alone. Now the
/// claim appends the row to the table's last pages, which every claim of
/// a batch shares, and puts only the key into a random page of the index;
/// the completion rewrites the row where the batch's other completions are
/// (docs/benchmarks-history.md, "The SQLite records in the order they were
/// written").
/// The index enforces the key's uniqueness as the primary key did, under
/// the same columns, so the statements that name the key do not change
/// (the purge now deletes by rowid). The rowid is implicit: no column is
/// added, and `SELECT *` reads what it read before.
const SCHEMA_V5: &str = "
CREATE TABLE idem_records_v5 (
    scope            TEXT    NOT NULL,
    operation        TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    fingerprint      BLOB    NOT NULL,
    status           INTEGER NOT NULL,
    fence            INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    lease_until      INTEGER,
    expires_at       INTEGER NOT NULL,
    resource_id      TEXT,
    response_status  INTEGER,
    response_headers BLOB,
    response_body    BLOB
);
INSERT INTO idem_records_v5 (scope, operation, key, fingerprint, status, fence, created_at,
    lease_until, expires_at, resource_id, response_status, response_headers, response_body)
SELECT scope, operation, key, fingerprint, status, fence, created_at,
    lease_until, expires_at, resource_id, response_status, response_headers, response_body
FROM idem_records ORDER BY created_at, scope, key, operation;
DROP TABLE idem_records;
ALTER TABLE idem_records_v5 RENAME TO idem_records;
CREATE UNIQUE INDEX idem_records_key ON idem_records (scope, key, operation);
CREATE INDEX idem_records_expires_at ON idem_records (expires_at);
CREATE INDEX idem_records_stale ON idem_records (lease_until, scope, operation, key) WHERE status = 0;
";

/// The store's epoch (`idem_core::EpochWatch`): one row per place (this
/// store has one, `store`), its id written once and its counter advanced
/// by every check (`Store::advance_epoch`). Not a record: no purge, stale
/// listing or look-up by key reads it, and it never expires.
const SCHEMA_V6: &str = "
CREATE TABLE idem_epoch (
    place   TEXT    PRIMARY KEY,
    epoch   TEXT    NOT NULL,
    counter INTEGER NOT NULL
) WITHOUT ROWID;
";

/// The indexes on the records that idem itself created before schema 5
/// (schema 3's (scope, key) index is gone by then: migration 4 drops it),
/// in lower case. Any other index on the records, and every trigger
/// (triggers have names of their own, which may be these), is the
/// application's, kept through the rebuild; an index named like schema 5's
/// own makes the migration fail (the name is taken), and the file stays
/// at the version it had.
const OWN_INDEXES: &str = "'idem_records_expires_at', 'idem_records_stale'";

/// Rebuilds the records table (schema 5), keeping what an
/// application put beside the records (atomic mode invites its tables into
/// the file): its triggers and indexes on the records table are saved and
/// created again, and the rename runs in SQLite's legacy mode, which
/// neither checks nor rewrites views (a view over the records would
/// otherwise fail the rename, and with it the migration).
fn migrate_to_v5(conn: &Connection) -> rusqlite::Result<()> {
    // Triggers and indexes of the application's on the records (names as
    // it wrote them, in any case); idem's own indexes are created again by
    // the migration itself.
    let kept: Vec<String> = conn
        .prepare(&format!(
            "SELECT sql FROM sqlite_schema \
             WHERE type IN ('trigger', 'index') AND tbl_name = 'idem_records' COLLATE NOCASE \
             AND sql IS NOT NULL AND NOT (type = 'index' AND lower(name) IN ({OWN_INDEXES}))"
        ))?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    conn.pragma_update(None, "legacy_alter_table", true)?;
    let rebuilt = conn
        .execute_batch(SCHEMA_V5)
        .and_then(|()| kept.iter().try_for_each(|sql| conn.execute_batch(sql)));
    let legacy_off = conn.pragma_update(None, "legacy_alter_table", false);
    rebuilt.and(legacy_off)
}

/// Opens the writer's connection, creating or checking the schema.
pub(crate) fn open_writer(path: &Path, sync: Synchronous) -> Result<Connection, StoreError> {
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().readonly()
    {
        return Err(setup(
            path,
            "the store file is read-only; idem needs to write to it",
        ));
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| setup_error(path, "cannot open the store file", e))?;
    if conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
        return Err(setup(path, "the store file is read-only"));
    }
    let app_id: i64 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(|e| setup_error(path, "cannot read the file", e))?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| setup_error(path, "cannot read the file", e))?;
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(|e| setup_error(path, "cannot read the file", e))?;

    match (app_id, version) {
        (0, 0) if tables == 0 => {}
        (APPLICATION_ID, v) if (1..=SCHEMA_VERSION).contains(&v) => {}
        (APPLICATION_ID, v) if v > SCHEMA_VERSION => {
            return Err(setup(
                path,
                &format!(
                    "the store was written by a newer idem (schema {v}; this one knows {SCHEMA_VERSION})"
                ),
            ));
        }
        _ => {
            return Err(setup(
                path,
                "the file is an SQLite database but not an idem store",
            ));
        }
    }

    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(|e| setup_error(path, "cannot switch to WAL", e))?;
    conn.pragma_update(None, "synchronous", sync.pragma())
        .map_err(|e| setup_error(path, "cannot set synchronous", e))?;
    // Checkpoint the WAL every 8,000 pages (32 MiB) instead of 1,000, so
    // checkpoints (each an fsync of the main file) are rarer. Durability is
    // unchanged: every commit still fsyncs the WAL. (A larger page cache was
    // tried: slower with ordered keys, as SQLite walks it on every
    // transaction end; with random keys one read call a request fewer, more
    // instructions, and req/s within the spread. BENCHMARKS.md.)
    conn.execute_batch("PRAGMA wal_autocheckpoint = 8000;")
        .map_err(|e| setup_error(path, "cannot set the checkpoint interval", e))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(|e| setup_error(path, "cannot set busy timeout", e))?;

    if tables == 0 || version < SCHEMA_VERSION {
        migrate(&conn).map_err(|e| setup_error(path, "cannot create or migrate the schema", e))?;
        if tables != 0 && version < 5 {
            // Schema 5 rewrote the whole table through the WAL (schema 4's
            // rebuild wrote about 1.7 times the file's size, BENCHMARKS.md;
            // a model of schema 5's about 1.5): copy it into the file
            // now and give the WAL's disk back. Only space is at stake: a
            // checkpoint that cannot finish (a reader of another process)
            // leaves it to the automatic ones.
            if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())) {
                tracing::debug!(error = %e, "sqlite store: the checkpoint after the migration did not run");
            }
        }
    }
    Ok(conn)
}

/// Opens a connection for reads only.
pub(crate) fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| setup_error(path, "cannot open a reader", e))?;
    conn.pragma_update(None, "query_only", true)
        .map_err(|e| setup_error(path, "cannot set query_only", e))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(|e| setup_error(path, "cannot set busy timeout", e))?;
    Ok(conn)
}

/// Applies the migrations this file lacks, in one write transaction that
/// first re-reads the version, so two processes opening a new file at once
/// do not both create it.
///
/// Foreign keys are off while it runs, as in SQLite's own procedure for
/// rebuilding a table: schema 5 drops the records table, and with them on
/// (the bundled SQLite's default) the drop would first delete every
/// record, and with the records, through an application's `ON DELETE
/// CASCADE`, the application's rows that reference them. They cannot be
/// switched inside a transaction, so they go off before it and come back
/// after it. The rebuild keeps every record, so no reference loses its
/// record; before the commit, the references are checked to still
/// resolve ([`references_resolve`]).
fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let enforced: bool = conn.query_row("PRAGMA foreign_keys", [], |r| r.get(0))?;
    if !enforced {
        return migrate_in_transaction(conn);
    }
    conn.pragma_update(None, "foreign_keys", false)?;
    let migrated = migrate_in_transaction(conn);
    let restored = conn.pragma_update(None, "foreign_keys", true);
    migrated.and(restored)
}

fn migrate_in_transaction(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| {
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        for step in MIGRATIONS
            .iter()
            .skip(usize::try_from(version).unwrap_or(0))
        {
            step(conn)?;
        }
        // Only a file with records was rebuilt: a new one has no
        // application tables yet, and one another process migrated while
        // this one waited for the lock ran no step.
        if (1..5).contains(&version) {
            references_resolve(conn)?;
        }
        conn.execute_batch(&format!(
            "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {SCHEMA_VERSION};"
        ))
    })();
    match result {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Fails with SQLite's "foreign key mismatch", naming the table, if an
/// application table with a foreign key into the records has a foreign key
/// SQLite cannot resolve against the rebuilt table (one to the primary key
/// schema 4's table had, say, where schema 5's has none): with foreign
/// keys on, every later purge would fail on it. Compiling the check is
/// enough (it reads no rows, so it costs nothing beside the rebuild); it
/// covers every foreign key of such a table, one to another table
/// included, which SQLite would refuse on any write to that table anyway.
fn references_resolve(conn: &Connection) -> rusqlite::Result<()> {
    let referencing: Vec<String> = conn
        .prepare(
            "SELECT DISTINCT m.name FROM sqlite_schema AS m, pragma_foreign_key_list(m.name) AS f \
             WHERE m.type = 'table' AND f.\"table\" = 'idem_records' COLLATE NOCASE",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for table in referencing {
        let quoted = table.replace('"', "\"\"");
        conn.prepare(&format!("EXPLAIN PRAGMA foreign_key_check(\"{quoted}\")"))?;
    }
    Ok(())
}
