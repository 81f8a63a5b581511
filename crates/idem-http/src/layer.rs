//! The layer, its builder, and the handle that shuts it down.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
use idem_core::{KeyPolicy, Policy, Store};
use tower::Layer;

use crate::replay_cache::ReplayCache;
use crate::rule::{KeyRequirement, RouteRule, ScopeSource};
use crate::service::Idempotency;
use crate::shared::{Settings, Shared};

/// The replay cache's default size in bytes.
pub const DEFAULT_REPLAY_CACHE: usize = 16 * 1024 * 1024;

/// Adds the idempotency contract (docs/contract.md, *The HTTP contract*) to a service.
///
/// Cheap to clone; clones share the store, the waiters and the shutdown
/// handle.
///
/// With axum, add it with `Router::route_layer`, after the routes it
/// protects, not with `Router::layer`: `layer` also wraps the fallback,
/// so requests to unknown paths would be claimed and their 404s recorded
/// and replayed (see the crate docs, *With axum*).
///
/// # Metrics
///
/// The layer records through the `metrics` facade ([`crate::metrics`]). It
/// takes its handles from the recorder installed when it first records
/// something (its first keyed request, or [`LayerHandle::report_metrics`])
/// and keeps them: install the recorder before the layer serves, and do
/// not let the recorder drop idle series (Prometheus's `idle_timeout`),
/// since the layer would go on updating the dropped ones.
#[derive(Clone)]
pub struct IdempotencyLayer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("rules", &self.shared.settings.rules)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A builder over `store`.
    pub fn builder(store: impl Store) -> IdempotencyLayerBuilder {
        IdempotencyLayerBuilder::new(Arc::new(store))
    }

    /// A builder over a store already shared.
    pub fn builder_shared(store: Arc<dyn Store>) -> IdempotencyLayerBuilder {
        IdempotencyLayerBuilder::new(store)
    }

    /// The layer with every default, over `store`.
    pub fn new(store: impl Store) -> IdempotencyLayer {
        IdempotencyLayer::builder(store).build()
    }

    /// The reconciliation read path over this layer's store, scopes and
    /// rules: mount it at `/_idem/records/{key}` (see [`ReadPath`](crate::ReadPath)).
    pub fn read_path(&self) -> crate::read_path::ReadPath {
        crate::read_path::ReadPath::new(self.shared.clone())
    }

    /// A handle for shutdown and metrics.
    pub fn handle(&self) -> LayerHandle {
        LayerHandle {
            shared: self.shared.clone(),
        }
    }

    /// The request header the key is read from
    /// ([`IdempotencyLayerBuilder::key_header`]). A proxy behind the
    /// layer must pass it on as the client sent it (never strip it because
    /// a client's `Connection` names it): the upstream deduplicates on it.
    pub fn key_header(&self) -> &HeaderName {
        &self.shared.settings.key_header
    }

    /// The request headers the scope is read from
    /// ([`IdempotencyLayerBuilder::scope`]): `Authorization` by default,
    /// the named ones for [`ScopeSource::Header`] and
    /// [`ScopeSource::Headers`], none for [`ScopeSource::Custom`] (its
    /// function may read any; whoever sets it knows which). A proxy behind
    /// the layer must pass them on as the client sent them, or the
    /// upstream would act for another scope than the one the record was
    /// claimed under.
    pub fn scope_headers(&self) -> &[HeaderName] {
        static AUTHORIZATION: HeaderName = http::header::AUTHORIZATION;
        match &self.shared.settings.scope {
            ScopeSource::Authorization => std::slice::from_ref(&AUTHORIZATION),
            ScopeSource::Header(name) => std::slice::from_ref(name),
            ScopeSource::Headers(names) => names,
            ScopeSource::Custom(_) => &[],
        }
    }

    /// The largest response body the layer stores for replay
    /// ([`IdempotencyLayerBuilder::response_limit`]): it reads a keyed
    /// answer whole up to this many bytes (and one more) before it stores
    /// or streams it.
    pub fn response_limit(&self) -> usize {
        self.shared.settings.response_limit
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency::new(inner, self.shared.clone())
    }
}

/// Builds an [`IdempotencyLayer`].
pub struct IdempotencyLayerBuilder {
    settings: Settings,
    store: Arc<dyn Store>,
    replay_cache: usize,
}

impl std::fmt::Debug for IdempotencyLayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayerBuilder")
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayerBuilder {
    fn new(store: Arc<dyn Store>) -> IdempotencyLayerBuilder {
        IdempotencyLayerBuilder {
            settings: Settings::default(),
            store,
            replay_cache: DEFAULT_REPLAY_CACHE,
        }
    }

    /// Adds a route rule. Rules are tried in the order added; the first
    /// that matches wins.
    pub fn route(mut self, rule: RouteRule) -> Self {
        self.settings.rules.push(Arc::new(rule));
        self
    }

    /// Methods protected on paths no rule names, with the literal path as
    /// the operation. Default POST and PATCH; empty to protect only the
    /// configured routes.
    pub fn default_methods<I: IntoIterator<Item = Method>>(mut self, methods: I) -> Self {
        self.settings.default_methods = methods.into_iter().collect();
        self
    }

    /// Whether the default rule requires a key. Default required.
    pub fn default_key(mut self, key: KeyRequirement) -> Self {
        Arc::make_mut(&mut self.settings.default_rule).key = key;
        self
    }

    /// The default rule's policy. Default [`Policy::default`].
    pub fn default_policy(mut self, policy: Policy) -> Self {
        Arc::make_mut(&mut self.settings.default_rule).policy = policy;
        self
    }

    /// The request header that carries the key. Default
    /// [`Idempotency-Key`](crate::IDEMPOTENCY_KEY); name another for an API
    /// whose clients already send their keys under another name. Only this
    /// header is read: with another name, an `Idempotency-Key` header is an
    /// ordinary header, forwarded and never deduplicated on. Missing or
    /// repeated on a route that needs a key: 400, whose detail names this
    /// header. Responses keep the contract's `Idempotency-Key-Expires` and
    /// `Idempotent-Replayed`.
    ///
    /// Pick a header that reaches the layer as the client sent it and
    /// that no proxy in front rewrites or strips: not a hop-by-hop header,
    /// not `Authorization` (the key would be the credential, and is
    /// refused as such), and not a scope header.
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.settings.key_header = name;
        self
    }

    /// Key hygiene. Default [`KeyPolicy::default`] (16 characters minimum,
    /// no credentials, no JWTs).
    pub fn key_policy(mut self, policy: KeyPolicy) -> Self {
        self.settings.key_policy = policy;
        self
    }

    /// Where scopes come from. Default the `Authorization` header.
    pub fn scope(mut self, scope: ScopeSource) -> Self {
        self.settings.scope = scope;
        self
    }

    /// The largest request body read (413 beyond). Default 1 MiB.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.settings.body_limit = bytes;
        self
    }

    /// Refuse keyed requests whose scope is the anonymous one (no
    /// credential) with 401, instead of letting every such caller share one
    /// scope. Default off.
    pub fn require_scope(mut self, required: bool) -> Self {
        self.settings.require_scope = required;
        self
    }

    /// How long a keyed request's body may take to arrive (408 after,
    /// nothing executed). Default 30 s.
    pub fn body_timeout(mut self, d: Duration) -> Self {
        self.settings.body_timeout = d;
        self
    }

    /// The largest response body stored for replay. A larger response
    /// still reaches the client whole; its record keeps the status and a
    /// problem document (`response-not-stored`) that tells a retry the
    /// request was executed, so a retry never executes it again. Default
    /// 8 MiB.
    pub fn response_limit(mut self, bytes: usize) -> Self {
        self.settings.response_limit = bytes;
        self
    }

    /// The deadline of every store call; past it the call counts as
    /// unavailable (503 before execution: fail closed). Default 5 s.
    pub fn store_timeout(mut self, d: Duration) -> Self {
        self.settings.store_timeout = d;
        self
    }

    /// What happens to a claim whose outcome is unknown: the execution was
    /// cancelled by shutdown, or its response body failed half-way. `false`
    /// (the default, right for in-process handlers, which have stopped when
    /// cancelled): release it, so a retry executes again. `true` (right for
    /// a proxy, whose upstream may still commit): hold it until its lease
    /// ends. A response carrying [`OutcomeUnknown`](crate::OutcomeUnknown)
    /// is always held.
    pub fn hold_unknown_outcomes(mut self, hold: bool) -> Self {
        self.settings.hold_unknown_outcomes = hold;
        self
    }

    /// `Retry-After` on 409 in flight. Default 1 s.
    pub fn in_flight_retry_after(mut self, d: Duration) -> Self {
        self.settings.in_flight_retry_after = d;
        self
    }

    /// `Retry-After` on 503 store unavailable. Default 1 s.
    pub fn unavailable_retry_after(mut self, d: Duration) -> Self {
        self.settings.unavailable_retry_after = d;
        self
    }

    /// How many bytes of answers the layer may hold while the store has not
    /// taken their completion (it failed or timed out when the execution
    /// ended). Such a completion is retried in the background, with backoff,
    /// until the store takes it, while a retry of the key that reaches this
    /// process is answered from the held answer; the claim's lease is kept
    /// alive meanwhile. Past the budget the answer is held as its status and
    /// a `response-not-stored` problem instead of whole, so the key still
    /// never runs twice. Default 64 MiB.
    pub fn pending_completion_budget(mut self, bytes: usize) -> Self {
        self.settings.pending_budget = bytes;
        self
    }

    /// Keep finished records that were replayed, up to `bytes` in all, so
    /// that a key retried again is answered without the store. Safe with
    /// instances sharing a store: a finished record does not change until
    /// it expires, and a copy is never used past its expiry. Default
    /// 16 MiB; 0 turns it off.
    pub fn replay_cache(mut self, bytes: usize) -> Self {
        self.replay_cache = bytes;
        self
    }

    /// The layer.
    pub fn build(self) -> IdempotencyLayer {
        let replays = ReplayCache::new(self.replay_cache);
        IdempotencyLayer {
            shared: Arc::new(Shared::new(self.settings, self.store, replays)),
        }
    }
}

/// Shutdown and metrics for a layer's executions.
#[derive(Clone)]
pub struct LayerHandle {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for LayerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerHandle").finish_non_exhaustive()
    }
}

impl LayerHandle {
    /// Lets running handlers finish for up to `grace`, then cancels the
    /// rest: their claims are released (so a retry executes them again) and
    /// their clients get 503. Returns when every execution has ended.
    /// Requests that arrive afterwards are answered 503 with their claims
    /// released if the grace ran out, and still run if it did not; stop
    /// accepting first. Completions held while the store did not take
    /// them are retried through the grace, then tried once more; each one
    /// the store still did not take is logged (its key hashed) and counted
    /// in `idem_unrecorded_completions_total`. Owed releases are retried
    /// through the grace too, and then left to end with their leases.
    pub async fn shutdown(&self, grace: Duration) {
        let tracker = &self.shared.tracker;
        tracker.close();
        if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
            self.shared.shutdown.cancel();
            tracker.wait().await;
        }
    }

    /// How many of the layer's tasks are running: executions (started and
    /// not yet ended), held completions' retries and owed releases' retries
    /// (all on one tracker, so that the shutdown waits for each of them).
    pub fn executions(&self) -> usize {
        self.shared.tracker.len()
    }

    /// How many releases the store did not take at once and are being
    /// retried in the background, until the store takes them or their
    /// lease ends.
    pub fn owed_releases(&self) -> usize {
        self.shared
            .owed_releases
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Refreshes the in-progress gauges (the oldest age grows without any
    /// event); call it on a timer.
    pub fn report_metrics(&self) {
        self.shared.in_progress.report(&self.shared.meters);
        let pending = &self.shared.pending;
        self.shared.meters.pending(pending.len(), pending.bytes());
        self.shared.meters.owed_releases(self.owed_releases());
    }

    /// A reconciler that resolves stale records by their operation's
    /// takeover policy ([`ByTakeoverPolicy`](crate::maintenance::ByTakeoverPolicy)),
    /// for [`Maintenance::reconcile`](crate::maintenance::Maintenance::reconcile)
    /// where the application cannot look up what happened.
    pub fn takeover_reconciler(&self) -> crate::maintenance::ByTakeoverPolicy {
        crate::maintenance::ByTakeoverPolicy(self.shared.clone())
    }

    /// How many completions this layer holds because the store did not
    /// take them when their execution ended; each is being retried.
    pub fn pending_completions(&self) -> usize {
        self.shared.pending.len()
    }

    /// How many records have requests waiting on them in this process
    /// (wait mode). Entries live only while someone waits.
    pub fn waiting(&self) -> usize {
        self.shared.waiters.len()
    }

    /// The watch that notices the layer's store losing records and then
    /// refuses the layer's new claims for a window as long as its longest
    /// lease ([`StoreWatch`](crate::store_watch::StoreWatch)); run it with
    /// [`Maintenance::watch_store`](crate::maintenance::Maintenance::watch_store).
    /// Every watch of one layer opens the same window.
    pub fn store_watch(&self) -> crate::store_watch::StoreWatch {
        crate::store_watch::StoreWatch::new(
            self.shared.store.clone(),
            self.shared.loss_window.clone(),
            self.shared.settings.longest_lease(),
        )
    }

    /// The store the layer uses.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.shared.store
    }

    /// Whether the layer's new claims wait for its store watch: a store
    /// call found the store unavailable and a running watch has not
    /// checked the store's epoch since (the store may have come back
    /// empty). Claims answer 503 `store-unavailable` until the check
    /// passes, however well the store answers meanwhile; a readiness
    /// probe that only reads the store would call the layer ready while
    /// it refuses every new key. Without a running watch, never.
    pub fn awaiting_store_check(&self) -> bool {
        self.shared.loss_window.awaiting_check()
    }
}

#[cfg(test)]
mod tests {
    use idem_core::MemoryStore;

    use super::*;

    /// The default methods' requests share one rule, which carries what the
    /// builder set, each with its own path as the operation; a configured
    /// rule comes first, with its pattern's operation; other methods pass.
    #[test]
    fn the_default_rule_carries_the_builders_key_and_policy() {
        let policy = Policy::builder()
            .ttl(Duration::from_secs(60))
            .lease(Duration::from_secs(7))
            .build()
            .expect("a valid policy");
        let layer = IdempotencyLayer::builder(MemoryStore::new())
            .route(RouteRule::post("/orders/{id}"))
            .default_key(KeyRequirement::Optional)
            .default_policy(policy)
            .build();
        let shared = &layer.shared;

        let a = shared
            .settings
            .rule_for(&Method::POST, "/a")
            .expect("a default method");
        let b = shared
            .settings
            .rule_for(&Method::PATCH, "//b/c")
            .expect("a default method");
        assert_eq!(
            shared.settings.operation(&a, &Method::POST, "/a").as_str(),
            "POST /a"
        );
        assert_eq!(
            shared
                .settings
                .operation(&b, &Method::PATCH, "//b/c")
                .as_str(),
            "PATCH /b/c"
        );
        for rule in [&a, &b] {
            assert_eq!(rule.key, KeyRequirement::Optional);
            assert_eq!(rule.policy.ttl(), Duration::from_secs(60));
            assert_eq!(rule.policy.lease(), Duration::from_secs(7));
        }
        assert!(Arc::ptr_eq(&a, &b), "one default rule, not one a request");

        let routed = shared
            .settings
            .rule_for(&Method::POST, "/orders/7")
            .expect("the route");
        assert_eq!(
            shared
                .settings
                .operation(&routed, &Method::POST, "/orders/7")
                .as_str(),
            "POST /orders/{id}"
        );
        assert_eq!(routed.key, KeyRequirement::Required);
        assert_eq!(routed.policy.ttl(), Policy::default().ttl());

        assert!(shared.settings.rule_for(&Method::GET, "/a").is_none());
    }
}
