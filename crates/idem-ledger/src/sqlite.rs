//! The ledger on SQLite: the transfer runs on the store's writer thread,
//! inside its group-commit transaction.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use idem_core::Completion;
use idem_core::{ClaimRequest, ClaimedAtomically, Fence, RecordId, StoreError};
use idem_sqlite::SqliteStore;
use rusqlite::{Connection, OptionalExtension, params};

use crate::{
    Ledger, LedgerError, Outcome, Transfer, TransferRequest, committed, insufficient, outcome,
    refused_invalid,
};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL CHECK (balance >= 0));
CREATE TABLE IF NOT EXISTS transfers (
    id INTEGER PRIMARY KEY, idem_key TEXT NOT NULL, from_acct TEXT NOT NULL,
    to_acct TEXT NOT NULL, amount INTEGER NOT NULL);
";

/// The ledger in one SQLite file shared with its idempotency records.
#[derive(Debug, Clone)]
pub struct SqliteLedger {
    store: SqliteStore,
    reader: Arc<Mutex<Connection>>,
    path: PathBuf,
}

impl SqliteLedger {
    /// Opens (or creates) the ledger and its store at `path`.
    ///
    /// # Errors
    /// When the file cannot be opened as a store.
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteLedger, LedgerError> {
        let path = path.as_ref().to_owned();
        let store = SqliteStore::open(&path)?;
        let conn = Connection::open(&path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        Ok(SqliteLedger {
            store,
            reader: Arc::new(Mutex::new(conn)),
            path,
        })
    }

    /// The idempotency store, for the layer.
    pub fn store(&self) -> &SqliteStore {
        &self.store
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, LedgerError> {
        let reader = self.reader.clone();
        tokio::task::spawn_blocking(move || {
            let conn = reader
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            f(&conn)
        })
        .await
        .map_err(|e| {
            LedgerError::Store(idem_core::StoreError::new(
                idem_core::StoreErrorKind::Backend,
                e.to_string(),
            ))
        })?
        .map_err(LedgerError::from)
    }
}

/// The transfer itself, on the writer's connection.
fn apply(conn: &Connection, key: &str, req: &TransferRequest) -> rusqlite::Result<Completion> {
    if let Some(why) = req.invalid() {
        return Ok(refused_invalid(why));
    }
    let balance: Option<i64> = conn
        .query_row(
            "SELECT balance FROM accounts WHERE id = ?1",
            [&req.from],
            |r| r.get(0),
        )
        .optional()?;
    let to_exists: Option<i64> = conn
        .query_row("SELECT 1 FROM accounts WHERE id = ?1", [&req.to], |r| {
            r.get(0)
        })
        .optional()?;
    match (balance, to_exists) {
        (Some(b), Some(_)) if b >= req.amount => {
            conn.execute(
                "UPDATE accounts SET balance = balance - ?2 WHERE id = ?1",
                params![req.from, req.amount],
            )?;
            conn.execute(
                "UPDATE accounts SET balance = balance + ?2 WHERE id = ?1",
                params![req.to, req.amount],
            )?;
            conn.execute(
                "INSERT INTO transfers (idem_key, from_acct, to_acct, amount) VALUES (?1, ?2, ?3, ?4)",
                params![key, req.from, req.to, req.amount],
            )?;
            let t = Transfer {
                id: conn.last_insert_rowid(),
                from: req.from.clone(),
                to: req.to.clone(),
                amount: req.amount,
            };
            Ok(committed(&t))
        }
        (b, _) => Ok(insufficient(b.unwrap_or(0), req)),
    }
}

impl Ledger for SqliteLedger {
    async fn seed(&self, n: usize, balance: i64) -> Result<(), LedgerError> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || -> rusqlite::Result<()> {
            let mut conn = Connection::open(path)?;
            conn.busy_timeout(std::time::Duration::from_secs(5))?;
            let tx = conn.transaction()?;
            for i in 0..n {
                tx.execute(
                    "INSERT OR IGNORE INTO accounts (id, balance) VALUES (?1, ?2)",
                    params![format!("acct-{i}"), balance],
                )?;
            }
            tx.commit()
        })
        .await
        .map_err(|e| {
            LedgerError::Store(idem_core::StoreError::new(
                idem_core::StoreErrorKind::Backend,
                e.to_string(),
            ))
        })??;
        Ok(())
    }

    async fn transfer(
        &self,
        id: &RecordId,
        fence: Fence,
        req: TransferRequest,
    ) -> Result<Outcome, LedgerError> {
        let key = id.key.as_str().to_owned();
        let done = self
            .store
            .complete_atomically(id, fence, move |conn| {
                let completion = apply(conn, &key, &req)?;
                Ok::<_, rusqlite::Error>((completion.response.clone(), completion))
            })
            .await?;
        Ok(outcome(done)?)
    }

    async fn transfer_claiming(
        &self,
        req: &ClaimRequest,
        transfer: TransferRequest,
    ) -> Result<ClaimedAtomically<Vec<u8>, LedgerError>, StoreError> {
        let key = req.id.key.as_str().to_owned();
        let out = self
            .store
            .claim_and_complete_atomically(req, move |conn, _fence| {
                let completion = apply(conn, &key, &transfer)?;
                Ok::<_, rusqlite::Error>((completion.response.body.clone(), completion))
            })
            .await?;
        Ok(out.map_failed(LedgerError::from))
    }

    async fn transfer_unrecorded(
        &self,
        key: &str,
        req: TransferRequest,
    ) -> Result<bool, LedgerError> {
        let key = key.to_owned();
        // On the reader's connection (WAL, synchronous=FULL as the store's):
        // one IMMEDIATE transaction, committed and synced.
        self.read(move |c| {
            c.execute_batch("PRAGMA synchronous = FULL; BEGIN IMMEDIATE")?;
            let done = apply(c, &key, &req)
                .map(|completion| completion.status() == idem_core::Status::Completed);
            match done {
                Ok(moved) => {
                    c.execute_batch("COMMIT")?;
                    Ok(moved)
                }
                Err(e) => {
                    let _ = c.execute_batch("ROLLBACK");
                    Err(e)
                }
            }
        })
        .await
    }

    async fn balance(&self, account: &str) -> Result<Option<i64>, LedgerError> {
        let account = account.to_owned();
        self.read(move |c| {
            c.query_row(
                "SELECT balance FROM accounts WHERE id = ?1",
                [account],
                |r| r.get(0),
            )
            .optional()
        })
        .await
    }

    async fn total(&self) -> Result<i64, LedgerError> {
        self.read(|c| {
            c.query_row("SELECT coalesce(sum(balance), 0) FROM accounts", [], |r| {
                r.get(0)
            })
        })
        .await
    }

    async fn transfers_with_key(&self, key: &str) -> Result<i64, LedgerError> {
        let key = key.to_owned();
        self.read(move |c| {
            c.query_row(
                "SELECT count(*) FROM transfers WHERE idem_key = ?1",
                [key],
                |r| r.get(0),
            )
        })
        .await
    }

    async fn transfer_count(&self) -> Result<i64, LedgerError> {
        self.read(|c| c.query_row("SELECT count(*) FROM transfers", [], |r| r.get(0)))
            .await
    }
}

impl SqliteLedger {
    /// The transfer made under `key`, if any.
    ///
    /// # Errors
    /// When SQLite fails.
    pub async fn transfer_by_key(&self, key: &str) -> Result<Option<Transfer>, LedgerError> {
        let key = key.to_owned();
        self.read(move |c| {
            c.query_row(
                "SELECT id, from_acct, to_acct, amount FROM transfers WHERE idem_key = ?1",
                [key],
                |r| {
                    Ok(Transfer {
                        id: r.get(0)?,
                        from: r.get(1)?,
                        to: r.get(2)?,
                        amount: r.get(3)?,
                    })
                },
            )
            .optional()
        })
        .await
    }
}

impl idem_core::Reconcile for SqliteLedger {
    fn resolve<'a>(
        &'a self,
        record: &'a idem_core::Record,
    ) -> idem_core::BoxFuture<'a, Result<idem_core::Resolution, crate::BoxError>> {
        Box::pin(async move {
            crate::resolve(record, self.transfer_by_key(record.id.key.as_str()).await?)
        })
    }
}
