//! The ledger on PostgreSQL: the transfer runs inside the store's atomic
//! transaction, which holds the record's row lock.

use idem_core::{ClaimRequest, ClaimedAtomically, Fence, RecordId, StoreError};
use idem_postgres::{GenericClient, PgError, PostgresStore};

use crate::{
    Ledger, LedgerError, LockedAccounts, Outcome, Transfer, TransferRequest, TransferStatements,
    execute_transfer, moved_money, outcome, with_body, with_response,
};

/// The ledger in the store's PostgreSQL schema.
#[derive(Debug, Clone)]
pub struct PostgresLedger {
    store: PostgresStore,
}

impl PostgresLedger {
    /// Creates the ledger's tables beside the store's.
    ///
    /// # Errors
    /// When PostgreSQL fails.
    pub async fn new(store: PostgresStore) -> Result<PostgresLedger, LedgerError> {
        let s = store.schema();
        let client = store.pool().get().await.map_err(|e| {
            LedgerError::Store(idem_core::StoreError::new(
                idem_core::StoreErrorKind::Unavailable,
                e.to_string(),
            ))
        })?;
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {s}.accounts (id text PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0));
                 CREATE TABLE IF NOT EXISTS {s}.transfers (id bigserial PRIMARY KEY, idem_key text NOT NULL,
                     from_acct text NOT NULL, to_acct text NOT NULL, amount bigint NOT NULL);"
            ))
            .await?;
        Ok(PostgresLedger { store })
    }

    /// The idempotency store, for the layer.
    pub fn store(&self) -> &PostgresStore {
        &self.store
    }

    async fn scalar(
        &self,
        sql: &str,
        params: &[&(dyn idem_postgres::ToSql + Sync)],
    ) -> Result<Option<i64>, LedgerError> {
        let client = self.store.pool().get().await.map_err(|e| {
            LedgerError::Store(idem_core::StoreError::new(
                idem_core::StoreErrorKind::Unavailable,
                e.to_string(),
            ))
        })?;
        Ok(client.query_opt(sql, params).await?.map(|r| r.get(0)))
    }
}

/// The transfer's statements on a client inside a transaction, in the
/// store's schema.
struct PgStatements<'a, C> {
    client: &'a C,
    schema: &'a str,
}

impl<'a, C> PgStatements<'a, C> {
    fn new(client: &'a C, schema: &'a str) -> Self {
        PgStatements { client, schema }
    }
}

impl<C: GenericClient + Sync> TransferStatements for PgStatements<'_, C> {
    type Error = PgError;

    async fn lock_accounts(
        &mut self,
        debited: &str,
        credited: &str,
    ) -> Result<LockedAccounts, PgError> {
        let s = self.schema;
        let rows = self
            .client
            .query(
                &format!(
                    "SELECT id, balance FROM {s}.accounts WHERE id = ANY($1) ORDER BY id FOR UPDATE"
                ),
                &[&vec![debited.to_owned(), credited.to_owned()]],
            )
            .await?;
        Ok(LockedAccounts {
            debited_balance: rows
                .iter()
                .find(|r| r.get::<_, String>(0) == debited)
                .map(|r| r.get::<_, i64>(1)),
            both_exist: rows.len() == 2,
        })
    }

    async fn add_to_balance(&mut self, account: &str, amount: i64) -> Result<(), PgError> {
        let s = self.schema;
        self.client
            .execute(
                &format!("UPDATE {s}.accounts SET balance = balance + $2 WHERE id = $1"),
                &[&account, &amount],
            )
            .await?;
        Ok(())
    }

    async fn insert_transfer(&mut self, key: &str, req: &TransferRequest) -> Result<i64, PgError> {
        let s = self.schema;
        let row = self
            .client
            .query_one(
                &format!("INSERT INTO {s}.transfers (idem_key, from_acct, to_acct, amount) VALUES ($1, $2, $3, $4) RETURNING id"),
                &[&key, &req.from, &req.to, &req.amount],
            )
            .await?;
        Ok(row.get(0))
    }
}

impl Ledger for PostgresLedger {
    async fn seed(&self, n: usize, balance: i64) -> Result<(), LedgerError> {
        let ids: Vec<String> = (0..n).map(|i| format!("acct-{i}")).collect();
        let s = self.store.schema();
        let client = self.store.pool().get().await.map_err(|e| {
            LedgerError::Store(idem_core::StoreError::new(
                idem_core::StoreErrorKind::Unavailable,
                e.to_string(),
            ))
        })?;
        client
            .execute(
                &format!("INSERT INTO {s}.accounts (id, balance) SELECT unnest($1::text[]), $2 ON CONFLICT DO NOTHING"),
                &[&ids, &balance],
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
        let s = self.store.schema().to_owned();
        let done = self
            .store
            .complete_atomically(id, fence, move |tx| {
                Box::pin(async move {
                    let statements = PgStatements::new(tx, &s);
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
        let s = self.store.schema().to_owned();
        let out = self
            .store
            .claim_and_complete_atomically(req, move |tx, _fence| {
                Box::pin(async move {
                    let statements = PgStatements::new(tx, &s);
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
        let mut client = self.store.pool().get().await.map_err(|e| {
            LedgerError::Store(idem_core::StoreError::new(
                idem_core::StoreErrorKind::Unavailable,
                e.to_string(),
            ))
        })?;
        let tx = client.transaction().await?;
        let statements = PgStatements::new(&tx, self.store.schema());
        let completion = execute_transfer(statements, key, &req).await?;
        tx.commit().await?;
        Ok(moved_money(&completion))
    }

    async fn balance(&self, account: &str) -> Result<Option<i64>, LedgerError> {
        let sql = format!(
            "SELECT balance FROM {}.accounts WHERE id = $1",
            self.store.schema()
        );
        self.scalar(&sql, &[&account]).await
    }

    async fn total(&self) -> Result<i64, LedgerError> {
        let sql = format!(
            "SELECT coalesce(sum(balance), 0)::bigint FROM {}.accounts",
            self.store.schema()
        );
        Ok(self.scalar(&sql, &[]).await?.unwrap_or(0))
    }

    async fn transfers_with_key(&self, key: &str) -> Result<i64, LedgerError> {
        let sql = format!(
            "SELECT count(*) FROM {}.transfers WHERE idem_key = $1",
            self.store.schema()
        );
        Ok(self.scalar(&sql, &[&key]).await?.unwrap_or(0))
    }

    async fn transfer_count(&self) -> Result<i64, LedgerError> {
        let sql = format!("SELECT count(*) FROM {}.transfers", self.store.schema());
        Ok(self.scalar(&sql, &[]).await?.unwrap_or(0))
    }
}

impl PostgresLedger {
    /// The transfer made under `key`, if any.
    ///
    /// # Errors
    /// When PostgreSQL fails.
    pub async fn transfer_by_key(&self, key: &str) -> Result<Option<Transfer>, LedgerError> {
        let client = self.store.pool().get().await.map_err(|e| {
            LedgerError::Store(idem_core::StoreError::new(
                idem_core::StoreErrorKind::Unavailable,
                e.to_string(),
            ))
        })?;
        let sql = format!(
            "SELECT id, from_acct, to_acct, amount FROM {}.transfers WHERE idem_key = $1",
            self.store.schema()
        );
        Ok(client.query_opt(&sql, &[&key]).await?.map(|r| Transfer {
            id: r.get(0),
            from: r.get(1),
            to: r.get(2),
            amount: r.get(3),
        }))
    }
}

impl idem_core::Reconcile for PostgresLedger {
    fn resolve<'a>(
        &'a self,
        record: &'a idem_core::Record,
    ) -> idem_core::BoxFuture<'a, Result<idem_core::Resolution, crate::BoxError>> {
        Box::pin(async move {
            crate::resolve(record, self.transfer_by_key(record.id.key.as_str()).await?)
        })
    }
}
