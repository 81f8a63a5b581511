//! Accepting client connections with every bound a hostile client needs:
//! a connection limit, a deadline for request headers (which also closes
//! idle keep-alive connections) and for a connection's setup (its TLS
//! handshake), graceful draining at shutdown. What is done to one socket
//! (its settings, the stall guard, TLS) is the gateway's [`Accept`] step
//! (`accept.rs`), which the loop here is generic over.
//!
//! axum's `serve` offers none of these knobs, so connections are served
//! here with hyper's servers directly (HTTP/1.1, HTTP/2 by ALPN, or either
//! by a plain connection's first bytes), by the gateway's own front
//! service (`front.rs`); HTTP/2's bounds are `h2_server.rs`'s.

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use idem_http::BoxError;

use crate::accept::{Accept, Accepted, Connecting};
use crate::error::Error;
use crate::front::{ConnectionService, Front};
use crate::h2_server::{StreamSlots, http2_bounds, sniff_h2c};
use crate::settings::ConnectionLimits;
use crate::spread::{Placed, Spread, spread};

/// The threads serving client connections, started by [`serve`].
pub(crate) struct Serving {
    threads: Vec<std::thread::JoinHandle<()>>,
    drained: Vec<tokio::sync::oneshot::Receiver<()>>,
    /// The gateway's shutdown, cancelled when a thread is lost.
    shutdown: CancellationToken,
    /// Stops the threads' accept loops: `shutdown`'s child, also cancelled
    /// when this is dropped (a start-up that failed part-way).
    stop: CancellationToken,
    /// Lets the threads end their runtimes.
    release: CancellationToken,
}

impl Serving {
    /// Resolves once every thread has stopped accepting and its
    /// connections are closed (or given up on after the grace). A thread
    /// that ends without saying so stops the others too: the process then
    /// exits as for a signal, and [`Serving::finish`] reports it (the
    /// thread's panic is its join error).
    pub(crate) async fn drained(&mut self) {
        let mut waits: FuturesUnordered<_> =
            std::mem::take(&mut self.drained).into_iter().collect();
        while let Some(done) = waits.next().await {
            if done.is_err() {
                tracing::error!("a serving thread stopped unexpectedly; stopping the gateway");
                self.shutdown.cancel();
            }
        }
    }

    /// Lets the threads end their runtimes, which drops whatever still runs
    /// on them: call it once the layer's executions are over. Waits for the
    /// threads (each ends its runtime within a second).
    pub(crate) async fn finish(mut self) -> Result<(), Error> {
        self.release.cancel();
        let threads = std::mem::take(&mut self.threads);
        let joined =
            tokio::task::spawn_blocking(move || threads.into_iter().all(|t| t.join().is_ok()));
        let all_ok = matches!(
            tokio::time::timeout(Duration::from_secs(3), joined).await,
            Ok(Ok(true))
        );
        if !all_ok {
            return Err(Error::Stopped);
        }
        Ok(())
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop.cancel();
        self.release.cancel();
    }
}

/// What a serving thread does before it serves, on its own runtime, given
/// its index (opening its own store connection, say); an error stops the
/// start-up.
pub(crate) type ThreadStart = Arc<
    dyn Fn(usize) -> futures_util::future::BoxFuture<'static, Result<(), BoxError>> + Send + Sync,
>;

/// Serves `fronts.len()` threads' worth of connections on `listener` until
/// `shutdown`, then stops accepting and gives open connections `grace` to
/// finish their requests. Each thread runs its own single-threaded event
/// loop with its own front service (and so its own upstream connection
/// pool): a request, its execution and its upstream exchange hand work to
/// each other on one thread, without waking another (BENCHMARKS.md). The
/// threads accept from one listening socket and pass a connection on to
/// the least loaded thread when the one that accepted it holds more
/// (`spread.rs`); a connection stays on the thread it was placed on, and
/// is set up there by `acceptor` (a TLS handshake within the header
/// timeout, holding a connection slot while it runs).
///
/// Every thread's runtime and listener is made before any thread starts,
/// so a failure to make one is a start-up error with nothing running.
pub(crate) async fn serve<A: Accept>(
    listener: TcpListener,
    fronts: Vec<Front>,
    acceptor: A,
    limits: ConnectionLimits,
    shutdown: &CancellationToken,
    grace: Duration,
    start: ThreadStart,
) -> Result<Serving, Error> {
    let listener = listener.into_std().map_err(Error::Start)?;
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let acceptor = Arc::new(acceptor);
    // The blocking pool (SQLite's reads) stays as large in all as one
    // multi-threaded runtime's.
    let blocking = (512 / fronts.len().max(1)).max(1);
    let mut prepared = Vec::with_capacity(fronts.len());
    let spreads = spread(fronts.len());
    for (front, spread) in fronts.into_iter().zip(spreads) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(blocking)
            .build()
            .map_err(Error::Start)?;
        let listener = {
            let _entered = runtime.enter();
            listener
                .try_clone()
                .and_then(TcpListener::from_std)
                .map_err(Error::Start)?
        };
        prepared.push((runtime, listener, front, spread));
    }
    let mut serving = Serving {
        threads: Vec::with_capacity(prepared.len()),
        drained: Vec::with_capacity(prepared.len()),
        shutdown: shutdown.clone(),
        stop: shutdown.child_token(),
        release: CancellationToken::new(),
    };
    // The threads serve once every one of them has started.
    let go = CancellationToken::new();
    let mut started = Vec::with_capacity(prepared.len());
    for (i, (runtime, listener, front, spread)) in prepared.into_iter().enumerate() {
        let (done, drained) = tokio::sync::oneshot::channel();
        let (ready, is_ready) = tokio::sync::oneshot::channel();
        started.push(is_ready);
        let (slots, acceptor, stop, release, go, start) = (
            slots.clone(),
            acceptor.clone(),
            serving.stop.clone(),
            serving.release.clone(),
            go.clone(),
            start.clone(),
        );
        // On an error here, dropping `serving` stops the threads started.
        let thread = std::thread::Builder::new()
            .name(format!("idem-serve-{i}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let _ = ready.send(start(i).await);
                    let serve = tokio::select! {
                        biased;
                        () = stop.cancelled() => false,
                        () = go.cancelled() => true,
                    };
                    if serve {
                        let with = ServeWith {
                            app: front,
                            acceptor,
                            slots,
                            limits,
                        };
                        accept(listener, spread, with, stop, grace).await;
                    }
                    let _ = done.send(());
                    // Executions spawned on this thread run until the
                    // layer's shutdown is over.
                    release.cancelled().await;
                });
                runtime.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(Error::Start)?;
        serving.threads.push(thread);
        serving.drained.push(drained);
    }
    // The first failure, whichever thread it is; on an error, dropping
    // `serving` stops every thread.
    let mut started: FuturesUnordered<_> = started
        .into_iter()
        .enumerate()
        .map(|(i, ready)| async move { (i, ready.await) })
        .collect();
    while let Some((i, ready)) = started.next().await {
        match ready {
            Ok(Ok(())) => {}
            Ok(Err(source)) => return Err(Error::ThreadStart { thread: i, source }),
            Err(_) => return Err(Error::ThreadLost(i)),
        }
    }
    go.cancel();
    Ok(serving)
}

/// What a thread serves its connections with.
struct ServeWith<A> {
    app: Front,
    acceptor: Arc<A>,
    slots: Arc<Semaphore>,
    limits: ConnectionLimits,
}

/// What ended one wait of the accept loop.
enum Next {
    Stop,
    Accepted(TcpStream, SocketAddr, OwnedSemaphorePermit),
    Handed(Option<Placed>),
}

/// A connection slot, then a connection in it. A failed accept (out of
/// descriptors, say) backs off instead of spinning. `None` once the
/// semaphore is closed.
async fn accept_one(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
) -> Option<(TcpStream, SocketAddr, OwnedSemaphorePermit)> {
    let permit = slots.clone().acquire_owned().await.ok()?;
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => return Some((stream, peer, permit)),
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One thread's accept loop and its connections, until `shutdown` and the
/// grace after it: those it accepts and keeps, and those other threads
/// hand it (`spread.rs`).
async fn accept<A: Accept>(
    listener: TcpListener,
    mut spread: Spread,
    with: ServeWith<A>,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let ServeWith {
        app,
        acceptor,
        slots,
        limits,
    } = with;
    let graceful = GracefulShutdown::new();
    // Every connection's task, so that those still open when the grace
    // runs out are ended here, before the thread says it is drained: after
    // that, no request of this thread can start an execution.
    let connections = TaskTracker::new();
    let cut_off = CancellationToken::new();
    loop {
        // Both waits give up cleanly when the other wins: a permit taken
        // for an accept that did not happen goes back.
        let next = tokio::select! {
            biased;
            () = shutdown.cancelled() => Next::Stop,
            placed = spread.handed() => Next::Handed(placed),
            accepted = accept_one(&listener, &slots) => match accepted {
                Some((stream, peer, permit)) => Next::Accepted(stream, peer, permit),
                None => Next::Stop,
            },
        };
        let placed = match next {
            Next::Stop => break,
            Next::Handed(placed) => placed,
            Next::Accepted(stream, peer, permit) => spread.place(stream, peer, permit),
        };
        let Some(Placed { stream, peer, slot }) = placed else {
            continue;
        };
        let app = app.for_peer(peer);
        let watcher = graceful.watcher();
        let tls = acceptor.is_tls();
        let acceptor = acceptor.clone();
        let shutdown = shutdown.clone();
        let cut_off = cut_off.clone();
        let serve = async move {
            let conn = Connecting::new(peer, limits);
            if let Some(accepted) = set_up(&*acceptor, stream, &conn, &shutdown).await {
                serve_connection(accepted, tls, app, limits, watcher, &shutdown).await;
            }
        };
        connections.spawn(async move {
            tokio::select! {
                () = serve => {}
                () = cut_off.cancelled() => {}
            }
            drop(slot);
        });
    }
    spread.close();
    drop(listener);
    // Idle connections close at once; busy ones after their response, or
    // when the grace runs out: then they are cut off (a request's own
    // future dropped; an execution it started runs on, in its own task).
    // A grace without bound (`Duration::MAX`) waits as long as they take.
    let wait = grace.saturating_add(Duration::from_secs(1));
    let _ = tokio::time::timeout(wait, graceful.shutdown()).await;
    cut_off.cancel();
    connections.close();
    connections.wait().await;
}

/// Sets one placed connection up with `acceptor`. A setup that is done on
/// its first poll (plain TCP) is taken as it is, without a timer; one that
/// waits for the client (a TLS handshake) gets the header timeout, and is
/// given up at shutdown: a client that never says hello holds neither its
/// slot nor the shutdown. `None` once it failed, timed out or was given up
/// (the connection is then closed).
async fn set_up<A: Accept>(
    acceptor: &A,
    stream: TcpStream,
    conn: &Connecting,
    shutdown: &CancellationToken,
) -> Option<Accepted<A::Io>> {
    let mut setup = std::pin::pin!(acceptor.accept(stream, conn));
    let first = std::future::poll_fn(|cx| Poll::Ready(setup.as_mut().poll(cx))).await;
    let done = match first {
        Poll::Ready(done) => done,
        Poll::Pending => {
            let bounded = tokio::time::timeout(conn.limits().header_timeout, setup);
            tokio::select! {
                biased;
                done = bounded => match done {
                    Ok(done) => done,
                    Err(_) => {
                        tracing::debug!("connection setup (a TLS handshake, say) timed out");
                        return None;
                    }
                },
                () = shutdown.cancelled() => return None,
            }
        }
    };
    match done {
        Ok(accepted) => Some(accepted),
        Err(e) => {
            tracing::debug!(error = %e, "connection setup (a TLS handshake, say) failed");
            None
        }
    }
}

/// Serves one connection, as its [`Accept`] step set it up: HTTP/2 when
/// TLS negotiated `h2`, HTTP/2 or HTTP/1.1 by the client's first bytes on
/// a plain connection (h2c with prior knowledge; those bytes must come
/// within the header timeout), HTTP/1.1 otherwise, or always when HTTP/2
/// is off. HTTP/1.1 has the header bound; HTTP/2 the bounds of
/// [`Http2Limits`](crate::Http2Limits), a bound on the executions its
/// streams may have running ([`StreamSlots`]), and the idle timeout.
async fn serve_connection<T>(
    accepted: Accepted<T>,
    tls: bool,
    app: ConnectionService,
    limits: ConnectionLimits,
    watcher: Watcher,
    shutdown: &CancellationToken,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let h2 = limits.http2;
    let negotiated_h2 = accepted.alpn_protocol() == Some(b"h2".as_slice());
    let ended = match (h2.enabled, tls) {
        (true, true) if negotiated_h2 => {
            serve_h2(accepted.into_inner(), app, &limits, watcher, shutdown).await
        }
        (true, false) => {
            let sniffed = tokio::select! {
                sniffed = sniff_h2c(accepted.into_inner(), limits.header_timeout) => sniffed,
                // A client that has sent nothing yet holds up no shutdown.
                () = shutdown.cancelled() => return,
            };
            match sniffed {
                Ok((true, io)) => serve_h2(io, app, &limits, watcher, shutdown).await,
                Ok((false, io)) => serve_h1(io, app, &limits, watcher).await,
                Err(e) => Err(e.into()),
            }
        }
        _ => serve_h1(accepted.into_inner(), app, &limits, watcher).await,
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// HTTP/1.1 on `io`, with the header bound.
async fn serve_h1<T>(
    io: T,
    app: ConnectionService,
    limits: &ConnectionLimits,
    watcher: Watcher,
) -> Result<(), BoxError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    watcher.watch(conn).await.map_err(BoxError::from)
}

/// HTTP/2 on `io`, with its bounds. At shutdown, or once it has had no
/// request open for the idle timeout, it is closed gracefully: GOAWAY,
/// then the streams it took up are served to their ends. `watcher` is
/// held until then, so the gateway's drain waits for it.
async fn serve_h2<T>(
    io: T,
    app: ConnectionService,
    limits: &ConnectionLimits,
    watcher: Watcher,
    shutdown: &CancellationToken,
) -> Result<(), BoxError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    http2_bounds!(builder, limits);
    let slotted = StreamSlots::new(app, limits.http2.max_concurrent_streams);
    let idle = slotted.idle_for(limits.http2.idle_timeout);
    let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(slotted));
    let (mut conn, mut idle) = (std::pin::pin!(conn), std::pin::pin!(idle));
    let mut closing = false;
    let ended = loop {
        tokio::select! {
            ended = conn.as_mut() => break ended,
            () = shutdown.cancelled(), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            () = idle.as_mut(), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    };
    drop(watcher);
    ended.map_err(BoxError::from)
}
