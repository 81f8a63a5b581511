//! `idem serve`: the gateway.

mod admin;
mod proxy;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use idem_core::{Key, Operation, RecordId, Scope, Store, Timestamp};
use idem_http::{IdempotencyLayer, PathPattern, ScopeSource};
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::net::TcpListener;
use tower::Layer;

use crate::config::GatewayConfig;
use crate::stores;

/// Buckets for every histogram, in seconds (store latency mostly).
const BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Records purged by the sweeper.
const PURGED: &str = "idem_records_purged_total";

pub(crate) async fn serve(cfg: GatewayConfig) -> anyhow::Result<()> {
    let prometheus = PrometheusBuilder::new()
        .set_buckets(&BUCKETS)
        .context("histogram buckets")?
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    let store = stores::open(&cfg.store).await?;
    let listener = TcpListener::bind(&cfg.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cfg.listen))?;
    let admin_listener = TcpListener::bind(&cfg.admin_listen)
        .await
        .with_context(|| format!("cannot listen on {} (admin)", cfg.admin_listen))?;

    let scope = match &cfg.tenant_header {
        Some(h) => ScopeSource::Header(h.clone()),
        None => ScopeSource::Authorization,
    };
    let mut builder = IdempotencyLayer::builder_shared(store.clone())
        .default_policy(cfg.default_policy.clone())
        .key_policy(cfg.key_policy.clone())
        .scope(scope.clone())
        .body_limit(cfg.max_body);
    for rule in &cfg.routes {
        builder = builder.route(rule.clone());
    }
    let layer = builder.build();
    let handle = layer.handle();
    let proxied = layer.layer(proxy::Proxy::new(
        cfg.upstream.clone(),
        cfg.upstream_timeout,
    ));

    let lookup = Lookup {
        store: store.clone(),
        scope,
        operations: cfg.routes.iter().flat_map(|r| r.operations()).collect(),
    };
    let app = Router::new()
        .route("/_idem/records/{key}", get(read_record))
        .with_state(Arc::new(lookup))
        .fallback_service(proxied);

    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(signals(shutdown.clone()));
    tokio::spawn(sweep(store.clone(), cfg.sweep_interval, shutdown.clone()));
    // Stale claims (a gateway died mid-request) are released after their
    // lease: the gateway cannot see whether the upstream acted, and the
    // upstream got the same Idempotency-Key to deduplicate the retry.
    tokio::spawn(idem_http::recovery::run_reconciler(
        store.clone(),
        Arc::new(idem_core::ReleaseAll),
        cfg.sweep_interval,
        shutdown.clone(),
    ));
    {
        let (prometheus, handle, shutdown) = (prometheus.clone(), handle.clone(), shutdown.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            while tokio::select! { _ = tick.tick() => true, () = shutdown.cancelled() => false } {
                prometheus.run_upkeep();
                handle.report_metrics();
            }
        });
    }
    let admin = axum::serve(admin_listener, admin::router(store, prometheus))
        .with_graceful_shutdown(shutdown.clone().cancelled_owned());
    tokio::spawn(async move {
        if let Err(e) = admin.await {
            tracing::error!(error = %e, "admin listener failed");
        }
    });

    eprintln!(
        "idem: forwarding {} to {} (admin on {}, store {})",
        cfg.listen,
        cfg.upstream,
        cfg.admin_listen,
        stores::redact(&cfg.store)
    );
    let server = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let grace = cfg.shutdown_grace;
    let drained = async {
        shutdown.cancelled().await;
        // Running executions get the grace period; then they are cancelled
        // and their keys released.
        handle.shutdown(grace).await;
    };
    let (served, ()) = tokio::join!(
        async {
            // Connections still open after the grace (idle keep-alive ones,
            // or clients that never read) do not hold the process.
            tokio::select! {
                r = server => r.context("serving"),
                () = async { shutdown.cancelled().await; tokio::time::sleep(grace + Duration::from_secs(1)).await } => Ok(()),
            }
        },
        drained
    );
    served?;
    eprintln!("idem: stopped");
    Ok(())
}

async fn signals(shutdown: tokio_util::sync::CancellationToken) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    eprintln!("idem: shutting down");
    shutdown.cancel();
}

/// Purges expired records in batches of 1,000 every `interval`.
async fn sweep(
    store: Arc<dyn Store>,
    interval: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        loop {
            match store.purge_expired(Timestamp::now(), 1000).await {
                Ok(n) => {
                    metrics::counter!(PURGED).increment(n as u64);
                    if n < 1000 {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "purge failed; retrying at the next sweep");
                    break;
                }
            }
        }
    }
}

struct Lookup {
    store: Arc<dyn Store>,
    scope: ScopeSource,
    operations: Vec<Operation>,
}

#[derive(serde::Deserialize)]
struct OperationQuery {
    method: Option<String>,
    path: Option<String>,
}

fn problem(status: StatusCode, kind: &str, title: &str, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": format!("urn:idem:problem:{kind}"), "title": title, "status": status.as_u16(), "detail": detail,
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

/// `GET /_idem/records/{key}`: the caller's own record, as JSON.
async fn read_record(
    State(l): State<Arc<Lookup>>,
    Path(key): Path<String>,
    Query(q): Query<OperationQuery>,
    headers: HeaderMap,
) -> Response {
    let Ok(key) = Key::new(key) else {
        return problem(
            StatusCode::BAD_REQUEST,
            "invalid-key",
            "Invalid Idempotency-Key",
            "The key in the path is not 1 to 255 printable ASCII characters.",
        );
    };
    let mut req = http::Request::new(());
    *req.headers_mut() = headers;
    let (parts, ()) = req.into_parts();
    let scope: Scope = l.scope.scope_of(&parts);
    let operations = match (q.method, q.path) {
        (Some(m), Some(p)) => vec![Operation::new(&m, PathPattern::new(&p).as_str())],
        (None, None) if !l.operations.is_empty() => l.operations.clone(),
        _ => {
            return problem(
                StatusCode::BAD_REQUEST,
                "operation-required",
                "Operation required",
                "Say which operation the key was used on: ?method=POST&path=/transfers.",
            );
        }
    };
    for op in operations {
        let id = RecordId::new(scope.clone(), op, key.clone());
        match idem_http::lookup(&*l.store, &id).await {
            Ok(Some(view)) => return axum::Json(view).into_response(),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "record look-up failed");
                return problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store-unavailable",
                    "Idempotency store unavailable",
                    "Retry later.",
                );
            }
        }
    }
    problem(
        StatusCode::NOT_FOUND,
        "record-not-found",
        "No such record",
        "No live record for this key and credential.",
    )
}
