//! The ledger on MySQL or MariaDB: the transfer runs inside the store's
//! atomic transaction, which holds the record's row lock.

use idem_core::{ClaimRequest, ClaimedAtomically, Fence, RecordId, StoreError};
use idem_mysql::{MysqlError, MysqlStore};
use mysql_async::prelude::Queryable;

use crate::{
    Ledger, LedgerError, LockedAccounts, Outcome, Transfer, TransferRequest, TransferStatements,
    execute_transfer, moved_money, outcome, with_body, with_response,
};

/// The ledger in the store's MySQL database.
#[derive(Debug, Clone)]
pub struct MysqlLedger {
    store: MysqlStore,
}

impl MysqlLedger {
    /// Creates the ledger's tables beside the store's.
    ///
    /// # Errors
    /// When MySQL fails.
    pub async fn new(store: MysqlStore) -> Result<MysqlLedger, LedgerError> {
        let d = store.database();
        let mut conn = store.pool().get_conn().await?;
        conn.query_drop(format!(
            "CREATE TABLE IF NOT EXISTS {d}.accounts (id VARCHAR(64) PRIMARY KEY, \
             balance BIGINT NOT NULL, CHECK (balance >= 0)) ENGINE = InnoDB"
        ))
        .await?;
        conn.query_drop(format!(
            "CREATE TABLE IF NOT EXISTS {d}.transfers (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
             idem_key VARCHAR(255) NOT NULL, from_acct VARCHAR(64) NOT NULL, \
             to_acct VARCHAR(64) NOT NULL, amount BIGINT NOT NULL, KEY (idem_key)) ENGINE = InnoDB"
        ))
        .await?;
        Ok(MysqlLedger { store })
    }

    /// The idempotency store, for the layer.
    pub fn store(&self) -> &MysqlStore {
        &self.store
    }

    async fn scalar(
        &self,
        sql: String,
        params: impl Into<mysql_async::Params> + Send,
    ) -> Result<Option<i64>, LedgerError> {
        let mut conn = self.store.pool().get_conn().await?;
        Ok(conn.exec_first(sql, params).await?)
    }
}

/// The transfer's statements on a connection inside a transaction, in
/// the store's database.
struct MysqlStatements<'a, Q> {
    conn: &'a mut Q,
    database: &'a str,
}

impl<'a, Q> MysqlStatements<'a, Q> {
    fn new(conn: &'a mut Q, database: &'a str) -> Self {
        MysqlStatements { conn, database }
    }
}

impl<Q: Queryable> TransferStatements for MysqlStatements<'_, Q> {
    type Error = MysqlError;

    async fn lock_accounts(
        &mut self,
        debited: &str,
        credited: &str,
    ) -> Result<LockedAccounts, MysqlError> {
        let d = self.database;
        let rows: Vec<(String, i64)> = self
            .conn
            .exec(
                format!(
                    "SELECT id, balance FROM {d}.accounts WHERE id IN (?, ?) ORDER BY id FOR UPDATE"
                ),
                (debited, credited),
            )
            .await?;
        Ok(LockedAccounts {
            debited_balance: rows.iter().find(|(id, _)| id == debited).map(|(_, b)| *b),
            both_exist: rows.len() == 2,
        })
    }

    async fn add_to_balance(&mut self, account: &str, amount: i64) -> Result<(), MysqlError> {
        let d = self.database;
        self.conn
            .exec_drop(
                format!("UPDATE {d}.accounts SET balance = balance + ? WHERE id = ?"),
                (amount, account),
            )
            .await
    }

    async fn insert_transfer(
        &mut self,
        key: &str,
        req: &TransferRequest,
    ) -> Result<i64, MysqlError> {
        let d = self.database;
        self.conn
            .exec_drop(
                format!(
                    "INSERT INTO {d}.transfers (idem_key, from_acct, to_acct, amount) VALUES (?, ?, ?, ?)"
                ),
                (key, req.from.as_str(), req.to.as_str(), req.amount),
            )
            .await?;
        let id: Option<i64> = self.conn.query_first("SELECT LAST_INSERT_ID()").await?;
        Ok(id.unwrap_or_default())
    }
}

impl Ledger for MysqlLedger {
    async fn seed(&self, n: usize, balance: i64) -> Result<(), LedgerError> {
        let d = self.store.database();
        let mut conn = self.store.pool().get_conn().await?;
        conn.exec_batch(
            format!("INSERT IGNORE INTO {d}.accounts (id, balance) VALUES (?, ?)"),
            (0..n).map(|i| (format!("acct-{i}"), balance)),
        )
        .await?;
        Ok(())
    }

    async fn transfer(
        &self,
        id: &RecordId,
        fence: Fence,
        req: TransferRequest,
    ) -> Result<Outcome, LedgerError> {
        let key = id.key.as_str().to_owned();
        let d = self.store.database().to_owned();
        let done = self
            .store
            .complete_atomically(id, fence, move |tx| {
                Box::pin(async move {
                    let statements = MysqlStatements::new(tx, &d);
                    execute_transfer(statements, &key, &req)
                        .await
                        .map(with_response)
                })
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
        let d = self.store.database().to_owned();
        let out = self
            .store
            .claim_and_complete_atomically(req, move |tx, _fence| {
                Box::pin(async move {
                    let statements = MysqlStatements::new(tx, &d);
                    execute_transfer(statements, &key, &transfer)
                        .await
                        .map(with_body)
                })
            })
            .await?;
        Ok(out.map_failed(LedgerError::from))
    }

    async fn transfer_unrecorded(
        &self,
        key: &str,
        req: TransferRequest,
    ) -> Result<bool, LedgerError> {
        let mut tx = self
            .store
            .pool()
            .start_transaction(mysql_async::TxOpts::default())
            .await?;
        let statements = MysqlStatements::new(&mut tx, self.store.database());
        let completion = execute_transfer(statements, key, &req).await?;
        tx.commit().await?;
        Ok(moved_money(&completion))
    }

    async fn balance(&self, account: &str) -> Result<Option<i64>, LedgerError> {
        let d = self.store.database();
        self.scalar(
            format!("SELECT balance FROM {d}.accounts WHERE id = ?"),
            (account,),
        )
        .await
    }

    async fn total(&self) -> Result<i64, LedgerError> {
        let d = self.store.database();
        let sql = format!("SELECT CAST(COALESCE(SUM(balance), 0) AS SIGNED) FROM {d}.accounts");
        Ok(self.scalar(sql, ()).await?.unwrap_or(0))
    }

    async fn transfers_with_key(&self, key: &str) -> Result<i64, LedgerError> {
        let d = self.store.database();
        let sql = format!("SELECT COUNT(*) FROM {d}.transfers WHERE idem_key = ?");
        Ok(self.scalar(sql, (key,)).await?.unwrap_or(0))
    }

    async fn transfer_count(&self) -> Result<i64, LedgerError> {
        let d = self.store.database();
        let sql = format!("SELECT COUNT(*) FROM {d}.transfers");
        Ok(self.scalar(sql, ()).await?.unwrap_or(0))
    }
}

impl MysqlLedger {
    /// The transfer made under `key`, if any.
    ///
    /// # Errors
    /// When MySQL fails.
    pub async fn transfer_by_key(&self, key: &str) -> Result<Option<Transfer>, LedgerError> {
        let d = self.store.database();
        let mut conn = self.store.pool().get_conn().await?;
        let row: Option<(i64, String, String, i64)> = conn
            .exec_first(
                format!(
                    "SELECT id, from_acct, to_acct, amount FROM {d}.transfers WHERE idem_key = ?"
                ),
                (key,),
            )
            .await?;
        Ok(row.map(|(id, from, to, amount)| Transfer {
            id,
            from,
            to,
            amount,
        }))
    }
}

impl idem_core::Reconcile for MysqlLedger {
    fn resolve<'a>(
        &'a self,
        record: &'a idem_core::Record,
    ) -> idem_core::BoxFuture<'a, Result<idem_core::Resolution, crate::BoxError>> {
        Box::pin(async move {
            crate::resolve(record, self.transfer_by_key(record.id.key.as_str()).await?)
        })
    }
}
