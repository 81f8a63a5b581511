//! `idem-ledger [--listen ADDR] [--store sqlite:PATH|postgres://...|mysql://...] [--accounts N]`
//!
//! Serves the ledger example with `POST /transfers` protected by idem in
//! atomic mode. `--store` is read as everywhere in idem (`idem_stores`).
//! Defaults: 127.0.0.1:8081, `sqlite:ledger.db`, 100 accounts
//! of 10,000 each. Every 10 s it purges expired records and settles stale
//! transfers from its own rows (`idem_http::maintenance`).

use std::process::ExitCode;
use std::sync::Arc;

use idem_http::IdempotencyLayer;
use idem_http::maintenance::Maintenance;
#[cfg(feature = "mysql")]
use idem_ledger::MysqlLedger;
#[cfg(feature = "postgres")]
use idem_ledger::PostgresLedger;
use idem_ledger::{Ledger, SqliteLedger, router, transfer_rule};
use idem_stores::StoreUrl;

/// The stores this build of the ledger runs on.
const SUPPORTED: &str = if cfg!(all(feature = "postgres", feature = "mysql")) {
    "sqlite:PATH, postgres://... or mysql://..."
} else if cfg!(feature = "postgres") {
    "sqlite:PATH or postgres://..."
} else if cfg!(feature = "mysql") {
    "sqlite:PATH or mysql://..."
} else {
    "sqlite:PATH"
};

struct Args {
    listen: String,
    store: String,
    accounts: usize,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        listen: "127.0.0.1:8081".into(),
        store: "sqlite:ledger.db".into(),
        accounts: 100,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => args.listen = value()?,
            "--store" => args.store = value()?,
            "--accounts" => args.accounts = value()?.parse().map_err(|_| "--accounts takes a number".to_owned())?,
            "-h" | "--help" => return Err("usage: idem-ledger [--listen ADDR] [--store sqlite:PATH|postgres://...|mysql://...] [--accounts N]".into()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

async fn serve<L: Ledger + idem_core::Reconcile>(
    ledger: L,
    layer_store: impl idem_core::Store,
    args: &Args,
) -> Result<(), String> {
    ledger
        .seed(args.accounts, 10_000)
        .await
        .map_err(|e| e.to_string())?;
    let store: Arc<dyn idem_core::Store> = Arc::new(layer_store);
    let layer = IdempotencyLayer::builder_shared(store.clone())
        .route(transfer_rule())
        .build();
    let ledger = Arc::new(ledger);
    // Expired records purged; stale transfers settled from the ledger's
    // own rows (completed if the transfer exists, released if not).
    Maintenance::new(store)
        .interval(std::time::Duration::from_secs(10))
        .reconcile(ledger.clone())
        .spawn(tokio_util::sync::CancellationToken::new());
    let app = router(ledger, layer);
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| format!("{}: {e}", args.listen))?;
    println!("ledger listening on http://{}", args.listen);
    axum::serve(listener, app).await.map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = async {
        let args = parse()?;
        let url: StoreUrl = args.store.parse().map_err(|e| format!("--store: {e}"))?;
        match &url {
            StoreUrl::Sqlite(path) => {
                let ledger = SqliteLedger::open(path).map_err(|e| e.to_string())?;
                let store = ledger.store().clone();
                serve(ledger, store, &args).await
            }
            #[cfg(feature = "postgres")]
            StoreUrl::Postgres(conn) => {
                let store = idem_postgres::PostgresStore::connect(conn)
                    .await
                    .map_err(|e| format!("cannot reach store {url}: {e}"))?;
                let ledger = PostgresLedger::new(store.clone())
                    .await
                    .map_err(|e| e.to_string())?;
                serve(ledger, store, &args).await
            }
            #[cfg(feature = "mysql")]
            StoreUrl::Mysql(conn) => {
                let store = idem_mysql::MysqlStore::connect(conn)
                    .await
                    .map_err(|e| format!("cannot reach store {url}: {e}"))?;
                let ledger = MysqlLedger::new(store.clone())
                    .await
                    .map_err(|e| e.to_string())?;
                serve(ledger, store, &args).await
            }
            // The ledger keeps its accounts in the same database as its
            // records (atomic mode): only the SQL stores can.
            other => Err(format!(
                "--store: the ledger runs on {SUPPORTED}, not {other}"
            )),
        }
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idem-ledger: {e}");
            ExitCode::FAILURE
        }
    }
}
