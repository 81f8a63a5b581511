//! What one layer's services share: its fixed settings (with the rule a
//! request falls under), and the state that lives as long as the layer,
//! its store first, with the deadline every call to it runs under. The
//! layer builds it; the service, the request flow and the read path read
//! it. It knows none of them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, Response};
use idem_core::{KeyPolicy, Operation, Store, StoreError, Takeover};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::body::Body;
use crate::key_header::IDEMPOTENCY_KEY;
use crate::metrics::{InProgress, Meters, StoreOp};
use crate::pending::PendingCompletions;
use crate::rejection::Rejection;
use crate::replay_cache::ReplayCache;
use crate::rule::{RouteRule, ScopeSource};
use crate::store_watch::LossWindow;
use crate::wait::Waiters;

/// The layer's fixed settings: what its builder sets, read by every
/// request and never changed once the layer is built.
pub(crate) struct Settings {
    /// Shared with each request they match, not copied into it.
    pub(crate) rules: Vec<Arc<RouteRule>>,
    pub(crate) default_methods: Vec<Method>,
    /// The key requirement and policy of the default methods' requests,
    /// one rule for all of them (each names its own operation:
    /// [`Settings::operation`]).
    pub(crate) default_rule: Arc<RouteRule>,
    /// The request header that carries the key.
    pub(crate) key_header: HeaderName,
    pub(crate) key_policy: KeyPolicy,
    pub(crate) scope: ScopeSource,
    pub(crate) body_limit: usize,
    pub(crate) require_scope: bool,
    pub(crate) body_timeout: Duration,
    pub(crate) response_limit: usize,
    pub(crate) store_timeout: Duration,
    pub(crate) hold_unknown_outcomes: bool,
    pub(crate) in_flight_retry_after: Duration,
    pub(crate) unavailable_retry_after: Duration,
    /// Bytes of answers held while the store has not taken them.
    pub(crate) pending_budget: usize,
}

impl Default for Settings {
    /// The builder's defaults (documented on its methods).
    fn default() -> Settings {
        Settings {
            rules: Vec::new(),
            default_methods: vec![Method::POST, Method::PATCH],
            default_rule: Arc::new(RouteRule::for_default_methods()),
            key_header: IDEMPOTENCY_KEY,
            key_policy: KeyPolicy::default(),
            scope: ScopeSource::default(),
            body_limit: 1024 * 1024,
            require_scope: false,
            body_timeout: Duration::from_secs(30),
            response_limit: 8 * 1024 * 1024,
            store_timeout: Duration::from_secs(5),
            hold_unknown_outcomes: false,
            in_flight_retry_after: Duration::from_secs(1),
            unavailable_retry_after: Duration::from_secs(1),
            pending_budget: 64 * 1024 * 1024,
        }
    }
}

/// Everything one layer's services share: its settings, and the state
/// that lives as long as the layer (the store, the waiters, the
/// executions in progress, the meters, the shutdown, the replay cache, the
/// completions awaiting the store).
pub(crate) struct Shared {
    pub(crate) settings: Settings,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) waiters: Waiters,
    pub(crate) in_progress: InProgress,
    pub(crate) meters: Meters,
    pub(crate) shutdown: CancellationToken,
    pub(crate) tracker: TaskTracker,
    /// Finished records replayed before; `None`: off.
    pub(crate) replays: Option<ReplayCache>,
    /// Completions the store has not taken yet.
    pub(crate) pending: PendingCompletions,
    /// Releases the store did not take at once, retried in the
    /// background (`flow/release.rs`).
    pub(crate) owed_releases: std::sync::atomic::AtomicUsize,
    /// Open after the store lost records: new claims refused
    /// (`store_watch.rs`).
    pub(crate) loss_window: Arc<LossWindow>,
    /// Routes (method and axum route) already logged as claimed under the
    /// default rule: each is logged once.
    default_routes: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Settings {
    /// The longest lease any of the layer's rules gives: the shortest the
    /// loss window may be.
    pub(crate) fn longest_lease(&self) -> Duration {
        self.rules
            .iter()
            .chain(std::iter::once(&self.default_rule))
            .map(|r| r.policy.lease())
            .max()
            .unwrap_or_default()
    }

    /// The rule for a request: the first configured rule that matches, or
    /// the default rule for the default methods (POST and PATCH), whose
    /// operation is the literal path. `None`: pass through.
    pub(crate) fn rule_for(&self, method: &Method, path: &str) -> Option<Arc<RouteRule>> {
        self.rule_for_route(method, path, None)
    }

    /// [`Settings::rule_for`], where the router matched the request to
    /// `route` (axum's `MatchedPath`, the route as registered: a rule
    /// written as the same pattern is the route's, whatever the raw path,
    /// `{*rest}` included), before the raw path is tried.
    pub(crate) fn rule_for_route(
        &self,
        method: &Method,
        path: &str,
        route: Option<&str>,
    ) -> Option<Arc<RouteRule>> {
        if let Some(route) = route
            && let Some(rule) = self.rules.iter().find(|r| r.names_route(method, route))
        {
            return Some(rule.clone());
        }
        if let Some(rule) = self.rules.iter().find(|r| r.matches(method, path)) {
            return Some(rule.clone());
        }
        self.default_methods
            .contains(method)
            .then(|| self.default_rule.clone())
    }

    /// The takeover policy of the rule a record's operation was made by:
    /// the first configured rule that names it, or the default rule.
    pub(crate) fn takeover_of(&self, operation: &Operation) -> Takeover {
        self.rules
            .iter()
            .find(|r| r.operations().any(|o| o == *operation))
            .unwrap_or(&self.default_rule)
            .policy
            .takeover()
    }

    /// The operation of a request `rule_for` gave `rule`: its pattern's, or
    /// for the default rule, which every path shares, the request's path.
    /// Formed only once a request is keyed.
    pub(crate) fn operation(
        &self,
        rule: &Arc<RouteRule>,
        method: &Method,
        path: &str,
    ) -> Operation {
        if Arc::ptr_eq(rule, &self.default_rule) {
            RouteRule::default_operation(method, path)
        } else {
            rule.operation(method)
        }
    }
}

impl Shared {
    /// The state of a layer built with `settings` over `store`.
    pub(crate) fn new(
        settings: Settings,
        store: Arc<dyn Store>,
        replays: Option<ReplayCache>,
    ) -> Shared {
        Shared {
            store,
            waiters: Waiters::default(),
            in_progress: InProgress::default(),
            meters: Meters::default(),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            owed_releases: Default::default(),
            replays,
            pending: PendingCompletions::new(settings.pending_budget, settings.response_limit),
            loss_window: Arc::new(LossWindow::default()),
            default_routes: std::sync::Mutex::default(),
            settings,
        }
    }

    /// Logs, once per route, that the router's `route` is claimed under
    /// the default rule (no [`RouteRule`] names it): a key is required on
    /// it, with the default policy, which a `/login` or a route whose rule
    /// has a typo did not mean. Routes come from the router, not the
    /// client, so the set stays small; past 1,000 nothing more is logged.
    pub(crate) fn note_default_route(&self, rule: &Arc<RouteRule>, method: &Method, route: &str) {
        if !Arc::ptr_eq(rule, &self.settings.default_rule) {
            return;
        }
        let mut seen = self
            .default_routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.len() >= 1000 {
            return;
        }
        if seen.insert(format!("{method} {route}")) {
            tracing::warn!(%method, route, "no RouteRule names this route: its requests are claimed under the default rule (a key required, the default policy); name it with RouteRule::new, or leave its method out of default_methods");
        }
    }

    /// The answer to a refused request, and the one place a refusal is
    /// counted (`idem_requests_total` by outcome). Its detail names the
    /// configured key header, so a client of an API with another header
    /// name is told which one to send.
    pub(crate) fn reject(&self, r: Rejection) -> Response<Body> {
        self.meters.count(r.outcome());
        r.problem_naming(&self.settings.key_header).into_response()
    }
}

/// Runs a store call under the layer's deadline: past it, the call counts
/// as `Unavailable` (503, fail closed).
pub(crate) async fn store_call<T>(
    shared: &Shared,
    op: StoreOp,
    fut: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    // Timed around the deadline, so that a call that ran out of time is in
    // the histogram too (at the deadline), not left out as if it never was.
    // The deadline is set inside the timed span (the async block runs at
    // its first poll, after the clock started), so such a call is recorded
    // at the deadline or later, never just under it.
    shared
        .meters
        .timed(op, async {
            tokio::time::timeout(shared.settings.store_timeout, fut).await
        })
        .await
        .unwrap_or_else(|_| Err(StoreError::timed_out(op.as_str())))
        // A store met down may come back empty: check its epoch at once.
        .inspect_err(|e| {
            if e.is_unavailable() {
                shared.loss_window.suspect();
            }
        })
}
