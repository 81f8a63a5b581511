//! Checking a layer's [`RouteRule`]s against the axum router they are
//! written for ([`LayerHandle::check_routes`]), so that a rule naming no
//! route (a typo, a route renamed since) is told at start-up instead of
//! its route's requests being claimed, silently, under the default rule.
//!
//! Each rule's method and an example of its path go through a copy of the
//! router in which every route answers at once with the route it matched
//! and every fallback (nested routers' too) is replaced by one that
//! answers 404: no handler, middleware of the service or fallback of the
//! user's runs, and nothing leaves the process. What it
//! cannot tell: whether the layer is on the route (the copy answers before
//! any layer), and a route that exists for other methods only (axum's
//! "method not allowed" answer is behind the same copy of the route).

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;

use axum::extract::MatchedPath;
use http::{Method, Request, Response, StatusCode};
use tower::ServiceExt;

use crate::layer::LayerHandle;
use crate::rule::RouteRule;

/// What [`LayerHandle::check_routes`] found wrong with one rule and one of
/// its methods.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteFinding {
    /// The rule's method.
    pub method: Method,
    /// The rule's path pattern.
    pub pattern: String,
    /// What is wrong.
    pub problem: RouteProblem,
}

/// Why a rule would not apply to the requests it was written for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RouteProblem {
    /// The router has no route for a path the rule matches (it answered
    /// its fallback): a typo, or a route renamed or removed.
    NoRoute,
    /// The router's route is named, or its paths matched, by an earlier
    /// rule, which applies instead.
    Shadowed {
        /// The route the router matched (as registered).
        route: String,
        /// The pattern of the rule that applies.
        by: String,
    },
}

impl fmt::Display for RouteFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (method, pattern) = (&self.method, &self.pattern);
        match &self.problem {
            RouteProblem::NoRoute => write!(
                f,
                "RouteRule {method} {pattern} matches no route of the router: its requests would not reach the layer (a typo, or a route renamed?)"
            ),
            RouteProblem::Shadowed { route, by } => write!(
                f,
                "RouteRule {method} {pattern} never applies: the router's route {route} falls under the earlier rule {by}"
            ),
        }
    }
}

/// The route a probe reached, put on its answer by the copy's routes.
#[derive(Debug, Clone)]
struct Reached(Option<String>);

impl LayerHandle {
    /// Checks every [`RouteRule`] of the layer against `router`, the axum
    /// router the layer serves (call it with the finished router, before
    /// serving). Each problem is logged (a warning) and returned; an empty
    /// list means that every rule's method and path reach a route of the
    /// router, and that the rule is the one that applies there.
    ///
    /// No request reaches a handler: each goes through a copy of the
    /// router whose routes answer at once. Not told: whether this layer is
    /// on the route, and a rule whose path has a route for other methods
    /// only (see the module documentation).
    pub async fn check_routes(&self, router: &axum::Router) -> Vec<RouteFinding> {
        let settings = &self.shared.settings;
        let copy = answering_copy(router);
        let mut findings = Vec::new();
        for rule in &settings.rules {
            for (method, _) in &rule.methods {
                let path = rule.path.example();
                let Some(problem) = probe(&copy, rule, method, &path, |route| {
                    settings.rule_for_route(method, &path, Some(route))
                })
                .await
                else {
                    continue;
                };
                let finding = RouteFinding {
                    method: method.clone(),
                    pattern: rule.path.as_str().to_owned(),
                    problem,
                };
                tracing::warn!("{finding}");
                findings.push(finding);
            }
        }
        findings
    }
}

/// `router` with every route answering at once with the route it matched
/// ([`Reached`]) and a fallback that answers 404.
fn answering_copy(router: &axum::Router) -> axum::Router {
    let copy = router.clone();
    let copy = if copy.has_routes() {
        copy.route_layer(tower::layer::layer_fn(|_route| {
            tower::service_fn(|req: Request<axum::body::Body>| async move {
                let route = req
                    .extensions()
                    .get::<MatchedPath>()
                    .map(|m| m.as_str().to_owned());
                let mut answer = Response::new(axum::body::Body::empty());
                answer.extensions_mut().insert(Reached(route));
                Ok::<_, Infallible>(answer)
            })
        }))
    } else {
        copy
    };
    // `reset_fallback` drops every fallback of the user's, nested routers'
    // included (they live in the outer router's fallback routes).
    copy.reset_fallback()
        .fallback(|| async { StatusCode::NOT_FOUND })
}

/// Sends `method path` through the copy; what is wrong, if anything.
/// `applies` is the rule the layer would apply on a route.
async fn probe(
    copy: &axum::Router,
    rule: &Arc<RouteRule>,
    method: &Method,
    path: &str,
    applies: impl FnOnce(&str) -> Option<Arc<RouteRule>>,
) -> Option<RouteProblem> {
    // A pattern that is no URI path matches no request.
    let Ok(request) = Request::builder()
        .method(method.clone())
        .uri(path)
        .body(axum::body::Body::empty())
    else {
        return Some(RouteProblem::NoRoute);
    };
    let answer = match copy.clone().oneshot(request).await {
        Ok(answer) => answer,
        Err(never) => match never {},
    };
    let route = match answer.extensions().get::<Reached>() {
        Some(Reached(Some(route))) => route.clone(),
        // A route without a matched path (a service nested whole): the
        // rule's path reaches it, and the raw path decides.
        Some(Reached(None)) => return None,
        None => return Some(RouteProblem::NoRoute),
    };
    match applies(&route) {
        Some(other) if !Arc::ptr_eq(&other, rule) => Some(RouteProblem::Shadowed {
            route,
            by: other.path.as_str().to_owned(),
        }),
        _ => None,
    }
}
