//! The ledger on SQLite: the transfer runs on the store's writer thread,
//! inside its group-commit transaction.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use idem_core::{ClaimRequest, ClaimedAtomically, Completion, Fence, RecordId, StoreError};
use idem_sqlite::SqliteStore;
use rusqlite::{Connection, OptionalExtension, params};

use crate::{
    Ledger, LedgerError, LockedAccounts, Outcome, Transfer, TransferRequest, TransferStatements,
    execute_transfer, moved_money, outcome, with_body, with_response,
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

/// The transfer's statements on a connection inside a transaction.
struct SqliteStatements<'c>(&'c Connection);

impl TransferStatements for SqliteStatements<'_> {
    type Error = rusqlite::Error;

    async fn lock_accounts(
        &mut self,
        debited: &str,
        credited: &str,
    ) -> rusqlite::Result<LockedAccounts> {
        // The transaction holds SQLite's one write lock: no row locks.
        let debited_balance: Option<i64> = self
            .0
            .query_row(
                "SELECT balance FROM accounts WHERE id = ?1",
                [debited],
                |r| r.get(0),
            )
            .optional()?;
        let credited_exists: Option<i64> = self
            .0
            .query_row("SELECT 1 FROM accounts WHERE id = ?1", [credited], |r| {
                r.get(0)
            })
            .optional()?;
        Ok(LockedAccounts {
            debited_balance,
            both_exist: debited_balance.is_some() && credited_exists.is_some(),
        })
    }

    async fn add_to_balance(&mut self, account: &str, amount: i64) -> rusqlite::Result<()> {
        self.0.execute(
            "UPDATE accounts SET balance = balance + ?2 WHERE id = ?1",
            params![account, amount],
        )?;
        Ok(())
    }

    async fn insert_transfer(&mut self, key: &str, req: &TransferRequest) -> rusqlite::Result<i64> {
        self.0.execute(
            "INSERT INTO transfers (idem_key, from_acct, to_acct, amount) VALUES (?1, ?2, ?3, ?4)",
            params![key, req.from, req.to, req.amount],
        )?;
        Ok(self.0.last_insert_rowid())
    }
}

/// The transfer, on the writer's connection (or the reader's, for
/// [`Ledger::transfer_unrecorded`]) inside its transaction.
fn transfer_on(
    conn: &Connection,
    key: &str,
    req: &TransferRequest,
) -> rusqlite::Result<Completion> {
    // rusqlite is synchronous: every statement's future is ready when first
    // polled, and so is the transfer's, which awaits nothing else.
    let transfer = std::pin::pin!(execute_transfer(SqliteStatements(conn), key, req));
    match transfer.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(done) => done,
        Poll::Pending => Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_MISUSE),
            Some("the ledger's SQLite transfer waited, which it never should".into()),
        )),
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
                transfer_on(conn, &key, &req).map(with_response)
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
                transfer_on(conn, &key, &transfer).map(with_body)
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
            match transfer_on(c, &key, &req).map(|completion| moved_money(&completion)) {
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
