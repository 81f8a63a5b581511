//! A driver for counting the layer's instructions per request under
//! `valgrind --tool=callgrind` (bench/layer-instructions.sh): requests go
//! through the service with `tower::ServiceExt::oneshot`, no sockets, one
//! thread, so the count is the same on every run and every machine load.
//!
//! `layer_instructions MODE N`: MODE is `bare` (the handler alone),
//! `memory-new` (the layer with the memory store, a new key each request),
//! `memory-replay` (one key for all), `sqlite-new` or `sqlite-replay`. Like
//! the gateway, it uses mimalloc and a Prometheus recorder. Not a timing:
//! run it under callgrind.

mod common;

use std::sync::Arc;

use axum::body::Body;
use common::handler_app;
use http::Request;
use idem_core::{MemoryStore, Store};
use idem_http::IdempotencyLayer;
use metrics_exporter_prometheus::PrometheusBuilder;
use tower::ServiceExt;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn request(key: Option<String>) -> Request<Body> {
    let mut req = Request::post("/orders").header("content-type", "application/json");
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.body(Body::from(r#"{"item":"book","qty":1}"#))
        .expect("request")
}

const WARM_UP: u64 = 100;

/// Where counting starts (`valgrind --tool=callgrind --zero-before=...`).
#[inline(never)]
fn start_counting() {
    std::hint::black_box(());
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "bare".into());
    let n: u64 = args.next().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    rt.block_on(async {
        let _prometheus = PrometheusBuilder::new()
            .install_recorder()
            .expect("recorder");
        let store: Option<Arc<dyn Store>> = match mode.as_str() {
            "bare" => None,
            "memory-new" | "memory-replay" => Some(Arc::new(MemoryStore::new())),
            "sqlite-new" | "sqlite-replay" => Some(Arc::new(
                idem_sqlite::SqliteStore::open(dir.path().join("bench.db")).expect("sqlite"),
            )),
            other => panic!("unknown mode {other}"),
        };
        let app = match store {
            None => handler_app(),
            Some(store) => handler_app().layer(IdempotencyLayer::builder_shared(store).build()),
        };
        // The first requests warm up what is done once (the replayed
        // record, the clock calibration of the metrics histogram); callgrind
        // runs with `--zero-before` on `start_counting`, so only the `n`
        // requests after it are counted.
        for i in 0..WARM_UP + n {
            if i == WARM_UP {
                start_counting();
            }
            let key = match mode.as_str() {
                "bare" => None,
                m if m.ends_with("-new") => Some(format!("bench-{i:010}")),
                _ => Some("bench-replayed-key".to_owned()),
            };
            let resp = app.clone().oneshot(request(key)).await.expect("infallible");
            assert_eq!(resp.status(), 201, "unexpected status");
            let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .expect("body");
            assert!(!body.is_empty());
        }
    });
}
