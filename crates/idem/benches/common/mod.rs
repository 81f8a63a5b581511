//! What the benches share: the handler every figure is measured against.

use axum::Router;
use axum::routing::post;

/// A minimal handler: `POST /orders` answers 201 with a small JSON body.
pub(crate) fn handler_app() -> Router {
    Router::new().route(
        "/orders",
        post(|body: String| async move {
            (
                axum::http::StatusCode::CREATED,
                [("content-type", "application/json")],
                format!("{{\"order\":1,\"len\":{}}}", body.len()),
            )
        }),
    )
}
