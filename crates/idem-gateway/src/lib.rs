//! The idem gateway as a library: a reverse proxy that puts an
//! [`IdempotencyLayer`] in front of any HTTP/1.1 or HTTP/2 service (gRPC
//! unary calls included: idem-http's `grpc` module). The `idem serve`
//! command is this crate with flags, a configuration file, metrics and an
//! admin listener around it; a Rust team can embed the same engine in a
//! binary of its own ([`Gateway`], and `examples/embed.rs`).
//!
//! Not here: parsing flags or files, installing a metrics recorder,
//! signals, or the admin endpoints (the binary's), nor the idempotency
//! rules themselves (idem-http's layer, over idem-core's store).
//!
//! # One keyed request, from accept to store and back
//!
//! 1. **Accept** ([`listener`](crate::listener)). [`Gateway::start`] runs
//!    one single-threaded runtime per serving thread, all accepting from one
//!    socket. A connection takes a slot of
//!    [`ConnectionLimits::max_connections`].
//! 2. **Spread** ([`spread`](crate::spread)). A thread that holds more
//!    connections than the least loaded one hands the new one over, as a
//!    raw socket; a connection then stays on its thread, so its requests,
//!    their executions and their upstream exchanges never wake another
//!    thread.
//! 3. **Set up** ([`Accept`]). On its thread, the gateway's step turns the
//!    socket into the I/O hyper serves: [`TcpAcceptor`] sets
//!    `TCP_NODELAY` and bounds writes by the stall timeout
//!    ([`StallGuard`]); with TLS, [`RustlsAcceptor`] runs the handshake
//!    over that, within the header timeout and given up at shutdown. A
//!    step of one's own wraps these ([`Gateway::acceptor`]); the accept
//!    loop is generic over it, so nothing is boxed per read or write.
//! 4. **Front** ([`front`](crate::front)). hyper reads the request head
//!    (within the header timeout) and calls the connection's front
//!    service, which refuses what an upstream could read otherwise than
//!    the layer does (an ambiguous path, a method that differs from a
//!    standard one only in case, an unknown transfer coding or
//!    expectation), answers the read path (`/_idem/records/{key}`), and
//!    hands everything else to the layer, tagged with the client's
//!    address.
//! 5. **Claim** (idem-http). The layer checks the key, reads and
//!    fingerprints the body, and claims the record in the store: a new
//!    claim executes; a finished record is replayed; a claim in flight is
//!    answered 409 (or waited for); a different fingerprint 422.
//! 6. **Forward** ([`proxy`](crate::proxy)). The execution is the proxy:
//!    it rewrites the headers ([`proxy::forwarding`](crate::proxy)), maps
//!    the path onto the upstream URL, and sends the request on an idle
//!    connection of the thread's [`pool`](crate::pool), or a new one. The
//!    keyed exchange runs under [`UpstreamSettings::timeout`], its answer
//!    body included up to the layer's response limit; a failure once the
//!    request was sent is marked as an unknown outcome (the key stays
//!    held).
//! 7. **Check the answer** ([`pool`](crate::pool), [`proxy`](crate::proxy)).
//!    A connection whose exchange was out of step (an answer before the
//!    body was sent, a refusal of a body, a status that is not final) is
//!    closed, never reused for another caller. An answer whose framing
//!    the gateway cannot vouch for is passed on but not stored.
//! 8. **Settle** (idem-http). The layer stores the answer with the record
//!    (or releases the key for a transient failure) and only then sends
//!    it; until the record expires, a retry with the key is answered from
//!    the store, never executed again. What is stored of an answer over
//!    the layer's response limit, or of one whose end cannot be verified
//!    (it ends when the upstream closes the connection), is its status
//!    and a `response-not-stored` problem: that answer is streamed to its
//!    first client, and a retry learns that the request ran (and where
//!    to read its record), not what it answered.
//!
//! With a store whose connections are driven by tasks (Redis's one
//! multiplexed socket, PostgreSQL's and MySQL's pools and batches), [`ThreadStores`]
//! gives each serving thread its own instance, opened on that thread.

mod accept;
mod error;
mod front;
mod h2_server;
mod listener;
mod pool;
mod proxy;
mod settings;
mod spread;
mod stall;
mod tcp;
mod thread_store;
mod tls;

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use idem_http::IdempotencyLayer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::Layer as _;

pub use accept::{Accept, Accepted, Connecting};
pub use error::Error;
pub use proxy::rewritten_on_the_way;
pub use settings::{ConnectionLimits, Http2Limits, UpstreamProtocol, UpstreamSettings};
pub use stall::StallGuard;
pub use tcp::TcpAcceptor;
pub use thread_store::{OpenStore, ThreadStores};
pub use tls::RustlsAcceptor;

/// The metric counting upstream connections closed because their last
/// exchange was out of step, by `reason`.
pub const UPSTREAM_CONNECTIONS_CLOSED: &str = pool::CLOSED;

/// A gateway: an idempotency layer in front of one upstream, served on
/// a number of threads. Build it, [`start`](Gateway::start) it on a
/// listening socket, and [`wait`](Running::wait) for it after cancelling
/// its shutdown token.
///
/// `A` is the [`Accept`] step that sets every client connection up
/// (plain TCP by default; see [`Gateway::acceptor`]).
pub struct Gateway<A = TcpAcceptor> {
    acceptor: A,
    layer: IdempotencyLayer,
    upstream: UpstreamSettings,
    threads: usize,
    limits: ConnectionLimits,
    /// TLS over `acceptor`, added when the gateway starts.
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown_grace: Duration,
    anonymous_reads: bool,
    rule_methods: Arc<[Method]>,
    thread_stores: Option<Arc<ThreadStores>>,
}

impl Gateway {
    /// `layer` in front of `upstream`, on one thread per CPU, with the
    /// default connection limits, plain HTTP over [`TcpAcceptor::new`], a
    /// 30 s shutdown grace, and the read path refused to requests without
    /// a scope.
    pub fn new(layer: IdempotencyLayer, upstream: UpstreamSettings) -> Gateway {
        Gateway {
            acceptor: TcpAcceptor::new(),
            layer,
            upstream,
            threads: std::thread::available_parallelism().map_or(1, usize::from),
            limits: ConnectionLimits::default(),
            tls: None,
            shutdown_grace: Duration::from_secs(30),
            anonymous_reads: false,
            rule_methods: Arc::from([]),
            thread_stores: None,
        }
    }
}

impl<A: Accept> Gateway<A> {
    /// Sets every client connection up with `acceptor` instead (default
    /// [`TcpAcceptor::new`]): TLS, socket settings or an I/O wrapper of
    /// one's own, composed over [`TcpAcceptor`] (which puts the stall
    /// guard around the socket). [`Gateway::tls`], if set, still adds TLS
    /// over it.
    ///
    /// # Example
    ///
    /// TLS over plain TCP without `TCP_NODELAY`; a step of one's own goes
    /// in place of the [`TcpAcceptor`] (see [`Accept`]'s example):
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use idem_gateway::{Gateway, RustlsAcceptor, TcpAcceptor, UpstreamSettings};
    /// # fn make(
    /// #     layer: idem_http::IdempotencyLayer,
    /// #     upstream: UpstreamSettings,
    /// #     config: Arc<rustls::ServerConfig>,
    /// # ) {
    /// let tcp = TcpAcceptor::new().nodelay(false);
    /// let gateway = Gateway::new(layer, upstream).acceptor(RustlsAcceptor::over(tcp, config));
    /// # }
    /// ```
    pub fn acceptor<B: Accept>(self, acceptor: B) -> Gateway<B> {
        self.with_acceptor(|_| acceptor)
    }

    /// The number of serving threads (default one per CPU). At least
    /// one: [`Gateway::start`] refuses 0 ([`Error::Setting`]).
    pub fn threads(mut self, threads: usize) -> Gateway<A> {
        self.threads = threads;
        self
    }

    /// The bounds on client connections (default
    /// [`ConnectionLimits::default`]); [`Gateway::start`] refuses one
    /// outside the bounds its fields name ([`Error::Setting`]).
    pub fn limits(mut self, limits: ConnectionLimits) -> Gateway<A> {
        self.limits = limits;
        self
    }

    /// Serves HTTPS with `config` (default: plain HTTP): when the gateway
    /// starts, a [`RustlsAcceptor`] goes over its step, so that this
    /// serves as `.acceptor(RustlsAcceptor::over(step, config))` would.
    /// Each handshake must finish within the header timeout. The ALPN
    /// list is the caller's: offer `h2` (first) when
    /// [`Http2Limits::enabled`], else `http/1.1` alone. Over a step
    /// that speaks TLS already ([`Accept::is_tls`]: a [`RustlsAcceptor`]
    /// given to [`Gateway::acceptor`]), [`Gateway::start`] refuses to run
    /// ([`Error::TlsOverTls`]).
    pub fn tls(mut self, config: Arc<rustls::ServerConfig>) -> Gateway<A> {
        self.tls = Some(config);
        self
    }

    /// How long running requests may finish once the shutdown token is
    /// cancelled (default 30 s; `Duration::MAX`: as long as they take).
    pub fn shutdown_grace(mut self, grace: Duration) -> Gateway<A> {
        self.shutdown_grace = grace;
        self
    }

    /// Whether the read path answers requests without a scope (see
    /// idem-http's `ReadPath::anonymous_reads`).
    pub fn anonymous_reads(mut self, allowed: bool) -> Gateway<A> {
        self.anonymous_reads = allowed;
        self
    }

    /// Methods the layer's route rules name besides the standard ones
    /// (`PURGE`, say): a request whose method differs from one of them
    /// only in case is refused (400), as for the standard ones.
    pub fn rule_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Gateway<A> {
        self.rule_methods = methods.into_iter().collect();
        self
    }

    /// Gives each serving thread its own instance of the layer's store,
    /// opened on that thread before it serves. `stores` must be the store
    /// the layer was built with, made for this gateway's number of
    /// threads: [`Gateway::start`] refuses stores made for another
    /// ([`Error::ThreadStores`]). One set of stores serves one gateway:
    /// an instance's tasks run on its thread's runtime and end with it,
    /// and a second gateway given the same set would keep the first's
    /// instances (each thread's is set once), whose calls then fail closed.
    pub fn thread_stores(mut self, stores: Arc<ThreadStores>) -> Gateway<A> {
        self.thread_stores = Some(stores);
        self
    }

    /// Starts the serving threads on `listener`. Once this returns they
    /// serve; on an error nothing runs. Cancelling `shutdown` stops them
    /// accepting and begins the drain that [`Running::wait`] finishes.
    ///
    /// Keep the [`Running`] it returns until then: dropping it stops the
    /// gateway at once, without the layer's drain (see [`Running`]).
    ///
    /// The proxy takes from the layer what it must agree with: the key
    /// header and the scope headers reach the upstream as the client sent
    /// them (a client's `Connection` cannot strip them), and a keyed
    /// answer is read whole under the upstream timeout up to the layer's
    /// response limit.
    ///
    /// # Errors
    ///
    /// [`Error::Setting`] for a setting outside its bounds (0 threads or
    /// connections, a timeout of zero or over 365 days),
    /// [`Error::ThreadStores`] for per-thread stores made for another
    /// number of threads, [`Error::TlsOverTls`] for [`Gateway::tls`] over
    /// a step that speaks TLS; [`Error::Start`], [`Error::ThreadStart`] or
    /// [`Error::ThreadLost`] when a serving thread could not be made or
    /// started.
    pub async fn start(
        mut self,
        listener: TcpListener,
        shutdown: &CancellationToken,
    ) -> Result<Running, Error> {
        self.check()?;
        match self.tls.take() {
            Some(config) => {
                self.with_acceptor(|inner| RustlsAcceptor::over(inner, config))
                    .launch(listener, shutdown)
                    .await
            }
            None => self.launch(listener, shutdown).await,
        }
    }

    /// Refuses settings the gateway cannot serve with, or that disagree.
    fn check(&self) -> Result<(), Error> {
        if self.threads == 0 {
            return Err(Error::Setting {
                setting: "Gateway::threads",
                bound: "at least 1".to_owned(),
                value: "0".to_owned(),
            });
        }
        self.limits.check()?;
        self.upstream.check()?;
        if let Some(stores) = &self.thread_stores
            && stores.threads() != self.threads
        {
            return Err(Error::ThreadStores {
                stores: stores.threads(),
                threads: self.threads,
            });
        }
        if self.tls.is_some() && self.acceptor.is_tls() {
            return Err(Error::TlsOverTls);
        }
        Ok(())
    }

    /// The same gateway over the step `wrap` makes of this one's.
    fn with_acceptor<B>(self, wrap: impl FnOnce(A) -> B) -> Gateway<B> {
        Gateway {
            acceptor: wrap(self.acceptor),
            layer: self.layer,
            upstream: self.upstream,
            threads: self.threads,
            limits: self.limits,
            tls: self.tls,
            shutdown_grace: self.shutdown_grace,
            anonymous_reads: self.anonymous_reads,
            rule_methods: self.rule_methods,
            thread_stores: self.thread_stores,
        }
    }

    /// [`Gateway::start`] once `tls` is in the step.
    async fn launch(
        self,
        listener: TcpListener,
        shutdown: &CancellationToken,
    ) -> Result<Running, Error> {
        register_metrics(&self.layer);
        let client_proto = if self.acceptor.is_tls() {
            "https"
        } else {
            "http"
        };
        // One front service per serving thread, each with its own upstream
        // connection pool: a pooled connection's task runs on the thread
        // that opened it, so sharing one pool would wake the other thread.
        let terms = proxy::LayerTerms::of(&self.layer);
        let fronts = (0..self.threads)
            .map(|_| {
                let proxied =
                    self.layer
                        .layer(proxy::Proxy::new(&self.upstream, &terms, client_proto));
                front::Front::new(
                    proxied,
                    self.layer.read_path().anonymous_reads(self.anonymous_reads),
                    self.rule_methods.clone(),
                )
            })
            .collect();
        let stores = self.thread_stores.clone();
        let thread_start: listener::ThreadStart = Arc::new(move |index| {
            thread_store::enter(index);
            let stores = stores.clone();
            Box::pin(async move {
                match stores {
                    Some(stores) => stores.open_for(index).await,
                    None => Ok(()),
                }
            })
        });
        let serving = listener::serve(
            listener,
            fronts,
            self.acceptor,
            self.limits,
            shutdown,
            self.shutdown_grace,
            thread_start,
        )
        .await?;
        Ok(Running {
            serving,
            layer: self.layer,
            shutdown: shutdown.clone(),
            grace: self.shutdown_grace,
        })
    }
}

impl<A: std::fmt::Debug> std::fmt::Debug for Gateway<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("acceptor", &self.acceptor)
            .field("upstream", &self.upstream)
            .field("threads", &self.threads)
            .field("limits", &self.limits)
            .field("tls", &self.tls.is_some())
            .field("shutdown_grace", &self.shutdown_grace)
            .field("anonymous_reads", &self.anonymous_reads)
            .field("rule_methods", &self.rule_methods)
            .field("thread_stores", &self.thread_stores.is_some())
            .finish_non_exhaustive()
    }
}

/// Registers every series the gateway and its layer record, at zero, so
/// that an alert on a counter that has not moved yet still has a series.
/// Install the metrics recorder before [`Gateway::start`], which calls it.
fn register_metrics(layer: &IdempotencyLayer) {
    layer.handle().report_metrics();
    for reason in pool::CLOSE_REASONS {
        metrics::counter!(pool::CLOSED, "reason" => reason).increment(0);
    }
}

/// A gateway that serves, until its shutdown token is cancelled.
///
/// Dropping it stops the gateway at once, without the layer's drain: the
/// serving threads stop accepting, close their connections (a request
/// being answered gets the grace), and end their runtimes, which drops
/// the executions still running on them (their claims are left to their
/// leases, as for a crash). The shutdown token is not cancelled. To stop
/// gracefully, cancel the token and [`wait`](Running::wait).
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # async fn f(
/// #     gateway: idem_gateway::Gateway,
/// #     listener: tokio::net::TcpListener,
/// #     shutdown: &tokio_util::sync::CancellationToken,
/// # ) -> Result<(), idem_gateway::Error> {
/// gateway.start(listener, shutdown).await?; // dropped: stopped at once
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping `Running` stops the gateway at once; keep it, cancel the shutdown token and `wait` for it"]
pub struct Running {
    serving: listener::Serving,
    layer: IdempotencyLayer,
    shutdown: CancellationToken,
    grace: Duration,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

impl Running {
    /// Waits for the shutdown token, then drains: the threads stop
    /// accepting and close their connections once their answers are sent,
    /// within the grace (and a second); the layer meanwhile gives running
    /// executions the grace, then cancels them (their keys released or
    /// held). A serving thread lost on the way cancels the token itself,
    /// and is reported here.
    pub async fn wait(mut self) -> Result<(), Error> {
        let handle = self.layer.handle();
        let grace = self.grace;
        let draining = async {
            self.shutdown.cancelled().await;
            let since = tokio::time::Instant::now();
            handle.shutdown(grace).await;
            since
        };
        let ((), since) = tokio::join!(self.serving.drained(), draining);
        // A request that was still being read when the layer's wait began
        // may have started its execution since (its client gone, say);
        // with every connection closed no more can start. They get what
        // is left of the grace: the threads' runtimes, which run them, end
        // after this.
        let late = handle.executions();
        if late > 0 {
            tracing::info!(
                executions = late,
                "waiting for executions that started while connections drained"
            );
        }
        handle.shutdown(grace.saturating_sub(since.elapsed())).await;
        self.serving.finish().await
    }
}

/// The README's examples, compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
