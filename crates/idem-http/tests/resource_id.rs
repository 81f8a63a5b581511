//! A handler names what it created (`IdempotencyContext::set_resource_id`)
//! and the record keeps it, for the read path and a client that lost the
//! answer.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use idem_core::{Key, MemoryStore, Operation, RecordId, Scope, Store, Timestamp};
use idem_http::{IdempotencyContext, IdempotencyLayer, RouteRule};
use tower::{Layer, ServiceExt};

#[tokio::test]
async fn the_resource_id_a_handler_names_is_stored_with_the_record() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let layer = IdempotencyLayer::builder_shared(store.clone())
        .route(RouteRule::post("/payments"))
        .build();
    let svc = layer.layer(tower::service_fn(
        |req: Request<idem_http::Body>| async move {
            let ctx = req.extensions().get::<IdempotencyContext>().unwrap();
            ctx.set_resource_id("pay_0001");
            Ok::<_, Infallible>(
                Response::builder()
                    .status(StatusCode::CREATED)
                    .body(Full::new(Bytes::from_static(b"{\"id\":\"pay_0001\"}")))
                    .unwrap(),
            )
        },
    ));
    let key = "resource-id-key-00001";
    let request = Request::post("/payments")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    assert_eq!(
        svc.oneshot(request).await.unwrap().status(),
        StatusCode::CREATED
    );
    let id = RecordId::new(
        Scope::anonymous(),
        Operation::new("POST", "/payments"),
        Key::new(key).unwrap(),
    );
    let record = store.get(&id, Timestamp::now()).await.unwrap().unwrap();
    assert_eq!(record.resource_id.as_deref(), Some("pay_0001"));
    let view = idem_http::lookup(&*store, &id).await.unwrap().unwrap();
    let shown = serde_json::to_value(&view).unwrap();
    assert_eq!(shown["resource_id"], "pay_0001", "{shown}");
}

/// The read path's 401 for a caller without a credential speaks of
/// reading records, not of executing anything.
#[tokio::test]
async fn an_anonymous_read_is_refused_with_a_detail_about_reading() {
    use http_body_util::BodyExt;
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let request = Request::get("/_idem/records/resource-id-key-00001")
        .body(idem_http::Body::default())
        .unwrap();
    let response = layer.read_path().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8(body.to_vec()).unwrap();
    assert!(body.contains("credential-required"), "{body}");
    assert!(body.contains("Records are served to the caller"), "{body}");
    assert!(!body.contains("executed"), "{body}");
}
