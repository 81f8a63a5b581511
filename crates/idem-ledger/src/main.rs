//! `idem-ledger [--listen ADDR] [--store sqlite:PATH|postgres://...] [--accounts N]`
//!
//! Serves the ledger example with `POST /transfers` protected by idem in
//! atomic mode. Defaults: 127.0.0.1:8081, `sqlite:ledger.db`, 100 accounts
//! of 10,000 each. Every 10 s it purges expired records and settles stale
//! transfers from its own rows (`idem_http::maintenance`).

use std::process::ExitCode;
use std::sync::Arc;

use idem_http::IdempotencyLayer;
use idem_http::maintenance::Maintenance;
#[cfg(feature = "postgres")]
use idem_ledger::PostgresLedger;
use idem_ledger::{Ledger, SqliteLedger, router, transfer_rule};

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
            "-h" | "--help" => return Err("usage: idem-ledger [--listen ADDR] [--store sqlite:PATH|postgres://...] [--accounts N]".into()),
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
        if let Some(path) = args.store.strip_prefix("sqlite:") {
            let ledger = SqliteLedger::open(path).map_err(|e| e.to_string())?;
            let store = ledger.store().clone();
            return serve(ledger, store, &args).await;
        }
        #[cfg(feature = "postgres")]
        if args.store.starts_with("postgres://") || args.store.starts_with("postgresql://") {
            let store = idem_postgres::PostgresStore::connect(&args.store)
                .await
                .map_err(|e| e.to_string())?;
            let ledger = PostgresLedger::new(store.clone())
                .await
                .map_err(|e| e.to_string())?;
            return serve(ledger, store, &args).await;
        }
        Err(format!(
            "--store must be sqlite:PATH or postgres://..., not {}",
            args.store
        ))
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
