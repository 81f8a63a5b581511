//! `LayerHandle::check_routes`: a layer's rules checked against the axum
//! router they are written for, without any handler, middleware or
//! fallback of the service running.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::{patch, post};
use http::{Method, Request, Response};
use idem_core::MemoryStore;
use idem_http::{IdempotencyLayer, RouteFinding, RouteProblem, RouteRule};

/// How often the service's own code ran: its handlers, its middleware,
/// its fallback.
#[derive(Default)]
struct Ran(AtomicUsize);

impl Ran {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A router of payments, refunds and files, with a counting middleware
/// (on every route, as `Router::layer` puts it) and a counting fallback;
/// the layer goes on with `route_layer`, as the README says.
fn router(layer: IdempotencyLayer, ran: &Arc<Ran>) -> Router {
    let handler = {
        let ran = ran.clone();
        move || {
            let ran = ran.clone();
            async move {
                ran.0.fetch_add(1, Ordering::SeqCst);
                "ran"
            }
        }
    };
    let middleware = {
        let ran = ran.clone();
        tower::layer::layer_fn(move |inner: axum::routing::Route| {
            let ran = ran.clone();
            tower::service_fn(move |req: Request<axum::body::Body>| {
                ran.0.fetch_add(1, Ordering::SeqCst);
                let mut inner = inner.clone();
                async move {
                    use tower::Service;
                    inner.call(req).await
                }
            })
        })
    };
    let fallback = {
        let ran = ran.clone();
        move || {
            let ran = ran.clone();
            async move {
                ran.0.fetch_add(1, Ordering::SeqCst);
                "fallback"
            }
        }
    };
    Router::new()
        .route("/payments", post(handler.clone()))
        .route("/payments/{payment_id}/refunds", post(handler.clone()))
        .route("/payments/{payment_id}", patch(handler.clone()))
        .route("/files/{*path}", post(handler))
        .route_layer(layer)
        .layer(middleware)
        .fallback(fallback)
}

fn layer(rules: Vec<RouteRule>) -> IdempotencyLayer {
    rules
        .into_iter()
        .fold(
            IdempotencyLayer::builder(MemoryStore::new()),
            idem_http::IdempotencyLayerBuilder::route,
        )
        .build()
}

#[tokio::test]
async fn rules_written_as_the_routes_or_matching_their_paths_have_no_finding() {
    let ran = Arc::new(Ran::default());
    let layer = layer(vec![
        RouteRule::post("/payments"),
        // Another name for the parameter: the path decides.
        RouteRule::post("/payments/{id}/refunds"),
        RouteRule::new(Method::PATCH, "/payments/{payment_id}"),
        // idem's final `*` against axum's `{*path}`.
        RouteRule::post("/files/*"),
    ]);
    let handle = layer.handle();
    let app = router(layer, &ran);
    assert_eq!(handle.check_routes(&app).await, Vec::<RouteFinding>::new());
    assert_eq!(ran.count(), 0, "the service's own code ran");
}

#[tokio::test]
async fn a_typo_and_a_shadowed_rule_are_found_and_nothing_of_the_service_runs() {
    let ran = Arc::new(Ran::default());
    let layer = layer(vec![
        RouteRule::post("/payments"),
        // A typo: no such route.
        RouteRule::post("/payment"),
        // An earlier rule matches every path of this one.
        RouteRule::post("/files/*"),
        RouteRule::post("/files/{name}"),
        // The method's route is elsewhere: `/payments` has no PUT, and
        // `/refunds` is not a route at all.
        RouteRule::new(Method::PUT, "/refunds"),
    ]);
    let handle = layer.handle();
    let app = router(layer, &ran);
    let findings = handle.check_routes(&app).await;
    let seen: Vec<(Method, &str, RouteProblem)> = findings
        .iter()
        .map(|f| (f.method.clone(), f.pattern.as_str(), f.problem.clone()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (Method::POST, "/payment", RouteProblem::NoRoute),
            (
                Method::POST,
                "/files/{name}",
                RouteProblem::Shadowed {
                    route: "/files/{*path}".to_owned(),
                    by: "/files/*".to_owned(),
                }
            ),
            (Method::PUT, "/refunds", RouteProblem::NoRoute),
        ]
    );
    assert!(findings[0].to_string().contains("matches no route"));
    assert_eq!(ran.count(), 0, "the service's own code ran");

    // The router itself is untouched: an unknown path still gets its
    // fallback.
    let served = tower::ServiceExt::oneshot(
        app.clone(),
        Request::post("/nowhere")
            .body(axum::body::Body::empty())
            .unwrap(),
    )
    .await
    .unwrap();
    let _: Response<_> = served;
    assert_eq!(ran.count(), 1, "the fallback ran");
}

#[tokio::test]
async fn a_router_without_routes_finds_every_rule_routeless() {
    let layer = layer(vec![RouteRule::post("/payments")]);
    let handle = layer.handle();
    let app: Router = Router::new().fallback(|| async { Ok::<_, Infallible>("fallback") });
    let findings = handle.check_routes(&app).await;
    assert_eq!(findings.len(), 1);
    assert_eq!(findings[0].problem, RouteProblem::NoRoute);
}

/// Nested and merged routers with fallbacks of their own: the rules are
/// checked through them, and neither fallback (nor the middleware on it)
/// runs, not even for a rule that reaches no route under the nest.
#[tokio::test]
async fn nested_and_merged_routers_fallbacks_do_not_run() {
    let ran = Arc::new(Ran::default());
    let counting = |ran: &Arc<Ran>| {
        let ran = ran.clone();
        move || {
            let ran = ran.clone();
            async move {
                ran.0.fetch_add(1, Ordering::SeqCst);
                "ran"
            }
        }
    };
    let layer = layer(vec![
        RouteRule::post("/api/pay"),
        RouteRule::post("/api/paytypo"),
        RouteRule::post("/other/refunds/"),
    ]);
    let handle = layer.handle();
    let api = Router::new()
        .route("/pay", post(counting(&ran)))
        .fallback(counting(&ran));
    let other = Router::new()
        .route("/other/refunds/", post(counting(&ran)))
        .fallback(counting(&ran));
    let app = Router::new()
        .nest("/api", api)
        .merge(other)
        .route_layer(layer);
    let findings = handle.check_routes(&app).await;
    let seen: Vec<(&str, RouteProblem)> = findings
        .iter()
        .map(|f| (f.pattern.as_str(), f.problem.clone()))
        .collect();
    assert_eq!(seen, vec![("/api/paytypo", RouteProblem::NoRoute)]);
    assert_eq!(ran.count(), 0, "the service's own code ran");
}
