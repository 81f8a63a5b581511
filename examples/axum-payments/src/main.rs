//! Serves the payments example: `cargo run` in this directory.
//!
//! `PAYMENTS_ADDR` (default `127.0.0.1:3000`) is where it listens,
//! `PAYMENTS_DB` (default `payments.db`) the SQLite file of its
//! idempotency records. Ctrl-C lets running requests finish for 10 s.

use std::process::ExitCode;
use std::time::Duration;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[tokio::main]
async fn main() -> ExitCode {
    let addr = env_or("PAYMENTS_ADDR", "127.0.0.1:3000");
    let db = env_or("PAYMENTS_DB", "payments.db");
    let store = match idem_sqlite::SqliteStore::open(&db) {
        Ok(store) => store,
        Err(e) => {
            eprintln!("axum-payments: cannot open {db}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (app, handle) = match axum_payments::app(store) {
        Ok(app) => app,
        Err(e) => {
            eprintln!("axum-payments: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Every RouteRule checked against the router (no handler runs): a
    // rule that names no route would leave its route under the default rule.
    for finding in handle.check_routes(&app).await {
        eprintln!("axum-payments: {finding}");
    }
    // Expired records purged (every minute by default), stale claims
    // resolved by their route's takeover policy, the store watched for
    // lost records: without this the SQLite file only grows.
    let stop = idem_http::maintenance::CancellationToken::new();
    let maintenance = axum_payments::maintenance(&handle).spawn(stop.clone());
    let listener = match tokio::net::TcpListener::bind(&addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("axum-payments: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("axum-payments: listening on http://{addr}, records in {db}");
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    // Handlers run in tasks of the layer's own: let them finish.
    handle.shutdown(Duration::from_secs(10)).await;
    stop.cancel();
    let _ = maintenance.await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("axum-payments: {e}");
            ExitCode::FAILURE
        }
    }
}
