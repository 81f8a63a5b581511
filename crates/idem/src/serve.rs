//! `idem serve`: the gateway library (idem-gateway) with the binary's
//! configuration, metrics recorder, admin listener, maintenance and
//! signals around it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use idem_gateway::{ConnectionLimits, Gateway, ThreadStores, UpstreamSettings};
use idem_http::maintenance::Maintenance;
use idem_http::{IdempotencyLayer, ScopeSource};
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::net::TcpListener;

use crate::admin;
use crate::config::GatewayConfig;
use crate::tls::CaFile;

/// Buckets for every histogram, in seconds (store latency mostly).
const BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

pub(crate) async fn serve(cfg: GatewayConfig) -> anyhow::Result<()> {
    let prometheus = PrometheusBuilder::new()
        .set_buckets(&BUCKETS)
        .context("histogram buckets")?
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    let store = cfg
        .store
        .open_main(
            cfg.store_ca.as_ref().map(CaFile::pem),
            cfg.threads,
            cfg.store_migration_locks,
        )
        .await?;
    crate::durability::check(
        store.as_ref(),
        &cfg.store,
        cfg.accept_volatile_store,
        cfg.store_timeout,
    )
    .await?;
    let listener = TcpListener::bind(&cfg.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cfg.listen))?;
    let admin_listener = TcpListener::bind(&cfg.admin_listen)
        .await
        .with_context(|| format!("cannot listen on {} (admin)", cfg.admin_listen))?;

    let scope = match &cfg.scope_headers[..] {
        [] => ScopeSource::Authorization,
        [one] => ScopeSource::Header(one.clone()),
        many => ScopeSource::Headers(many.to_vec()),
    };
    // Redis, and PostgreSQL and MySQL up to the threads that can share
    // their pool: an instance per serving thread, each opened by its
    // thread (PostgreSQL's and MySQL's with a share of the pool).
    let thread_stores = cfg.store.connection_per_thread(cfg.threads).then(|| {
        let (url, ca, threads) = (cfg.store.clone(), cfg.store_ca.clone(), cfg.threads);
        let open: idem_gateway::OpenStore = Arc::new(move || {
            let (url, ca) = (url.clone(), ca.clone());
            Box::pin(async move {
                url.open_for_thread(ca.as_ref().map(CaFile::pem), threads)
                    .await
                    .map_err(Into::into)
            })
        });
        ThreadStores::new(store.clone(), cfg.threads, open)
    });
    let layer_store: Arc<dyn idem_core::Store> = match &thread_stores {
        Some(per_thread) => per_thread.clone(),
        None => store.clone(),
    };
    let mut builder = IdempotencyLayer::builder_shared(layer_store)
        .default_policy(cfg.default_policy.clone())
        .key_policy(cfg.key_policy.clone())
        .key_header(cfg.key_header.clone())
        .scope(scope)
        .require_scope(cfg.require_scope)
        .body_limit(cfg.max_body)
        .body_timeout(cfg.body_timeout)
        .response_limit(cfg.max_response)
        .replay_cache(cfg.replay_cache)
        .store_timeout(cfg.store_timeout)
        // The upstream may still commit what the gateway gave up on.
        .hold_unknown_outcomes(true);
    for rule in &cfg.routes {
        builder = builder.route(rule.clone());
    }
    let layer = builder.build();
    let handle = layer.handle();
    let mut gateway = Gateway::new(layer, upstream_settings(&cfg))
        .threads(cfg.threads)
        .limits(ConnectionLimits {
            max_connections: cfg.max_connections,
            header_timeout: cfg.header_timeout,
            stall_timeout: cfg.body_timeout,
            http2: cfg.http2,
        })
        .shutdown_grace(cfg.shutdown_grace)
        .anonymous_reads(cfg.anonymous_reads)
        .rule_methods(
            cfg.route_settings
                .iter()
                .flat_map(|r| r.methods.iter().cloned()),
        );
    if let Some(tls) = &cfg.tls {
        // h2 first when HTTP/2 is served: a client that offers both gets it.
        let mut config = (*tls.config).clone();
        config.alpn_protocols = if cfg.http2.enabled {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        gateway = gateway.tls(Arc::new(config));
    }
    if let Some(stores) = thread_stores {
        gateway = gateway.thread_stores(stores);
    }

    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(signals(shutdown.clone()));
    // Expired records are purged, and stale claims (a gateway died
    // mid-request) resolved by their route's takeover policy: released
    // after their lease where it is `reexecute` (the upstream got the same
    // Idempotency-Key to deduplicate the retry), left for an operator or
    // the next retry's takeover otherwise. The store's epoch is checked
    // every second: a store that lost records refuses new claims for at
    // least the longest lease (every forwarded request ends within its
    // route's lease: checked in the configuration).
    let watch = handle
        .store_watch()
        .window(cfg.upstream_timeout + cfg.store_timeout)
        .store_timeout(cfg.store_timeout);
    Maintenance::new(store.clone())
        .interval(cfg.sweep_interval)
        .store_timeout(cfg.store_timeout)
        .reconcile(Arc::new(handle.takeover_reconciler()))
        .watch_store(watch)
        .spawn(shutdown.clone());
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
    log_settings(&cfg);
    // The library's error says what could not start.
    let running = gateway.start(listener, &shutdown).await?;
    // After the serving threads: `/healthz` answers once they run.
    let admin = axum::serve(
        admin_listener,
        admin::router(store, prometheus, handle.clone()),
    )
    .with_graceful_shutdown(shutdown.clone().cancelled_owned());
    tokio::spawn(async move {
        if let Err(e) = admin.await {
            tracing::error!(error = %e, "admin listener failed");
        }
    });
    running.wait().await.context("serving")?;
    tracing::info!("stopped");
    Ok(())
}

/// What the gateway library needs to know of the upstream. The key
/// header, the scope headers and the response limit it takes from the
/// layer.
fn upstream_settings(cfg: &GatewayConfig) -> UpstreamSettings {
    UpstreamSettings {
        url: cfg.upstream.clone(),
        tls: cfg.upstream_tls.clone(),
        timeout: cfg.upstream_timeout,
        idle_timeout: cfg.upstream_idle_timeout,
        body_timeout: cfg.body_timeout,
        trust_forwarded: cfg.trust_forwarded,
        protected_headers: Vec::new(),
        protocol: cfg.upstream_protocol,
    }
}

/// The effective settings, once at start-up, without secrets: the store
/// URL is redacted (`StoreUrl`'s `Display`), the upstream shown without
/// user information, and scope header names are names, not values.
fn log_settings(cfg: &GatewayConfig) {
    let policy = &cfg.default_policy;
    let wait = match policy.concurrency() {
        idem_core::Concurrency::Wait { limit } => Some(format!("{limit:?}")),
        _ => None,
    };
    let scope = if cfg.scope_headers.is_empty() {
        "authorization".to_owned()
    } else {
        let names: Vec<&str> = cfg.scope_headers.iter().map(|h| h.as_str()).collect();
        names.join(",")
    };
    tracing::info!(
        listen = %cfg.listen,
        tls = cfg.tls.is_some(),
        admin = %cfg.admin_listen,
        upstream = %idem_stores::redact(&cfg.upstream.to_string()),
        upstream_ca = cfg.upstream_ca.as_ref().map(|p| p.display().to_string()),
        store = %cfg.store,
        store_ca = cfg.store_ca.as_ref().map(|c| c.path.display().to_string()),
        ttl = ?policy.ttl(),
        lease = ?policy.lease(),
        wait,
        upstream_timeout = ?cfg.upstream_timeout,
        upstream_idle_timeout = ?cfg.upstream_idle_timeout,
        store_timeout = ?cfg.store_timeout,
        header_timeout = ?cfg.header_timeout,
        body_timeout = ?cfg.body_timeout,
        shutdown_grace = ?cfg.shutdown_grace,
        sweep_interval = ?cfg.sweep_interval,
        max_body = cfg.max_body,
        max_response = cfg.max_response,
        replay_cache = cfg.replay_cache,
        max_connections = cfg.max_connections,
        threads = cfg.threads,
        key_header = %cfg.key_header,
        min_key_len = cfg.key_policy.minimum_len(),
        scope = %scope,
        require_scope = cfg.require_scope,
        anonymous_reads = cfg.anonymous_reads,
        trust_forwarded = cfg.trust_forwarded,
        accept_volatile_store = cfg.accept_volatile_store,
        routes = cfg.routes.len(),
        "forwarding requests"
    );
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
    tracing::info!("shutting down");
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_logged_upstream_has_no_password() {
        let shown = |u: &str| idem_stores::redact(&u.parse::<http::Uri>().unwrap().to_string());
        assert_eq!(
            shown("http://svc:s3cret@10.0.0.1:3000/api"),
            "http://svc:***@10.0.0.1:3000/api"
        );
        assert_eq!(shown("http://10.0.0.1:3000"), "http://10.0.0.1:3000/");
    }
}
