//! What turns one accepted client connection into the I/O the gateway
//! serves HTTP on: the [`Accept`] trait, what a step is told
//! ([`Connecting`]) and what it gives back ([`Accepted`]).
//!
//! The idea is axum's `serve::Listener` and its `ListenerExt::tap_io`:
//! TLS and per-socket settings as small wrappers rather than branches of
//! one long accept function. The gateway cannot wrap its *listener* as
//! axum does: its threads share one listening socket and hand raw
//! sockets to each other (`spread.rs`) before anything is done to them,
//! so a step is what is done to one accepted socket once it has reached
//! the thread that serves it. [`TcpAcceptor`](crate::TcpAcceptor) is the
//! plain one (`TCP_NODELAY`, the stall guard);
//! [`RustlsAcceptor`](crate::RustlsAcceptor) adds TLS over another.
//!
//! The accept loop is generic over the step, so the I/O hyper serves is
//! the step's own type: nothing is boxed, and no call is dynamic, per
//! read or write.

use std::future::Future;
use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::settings::ConnectionLimits;

/// Turns one accepted TCP connection into the I/O the gateway serves
/// HTTP on: the extension point for TLS and per-socket settings.
///
/// A step usually wraps another: it hands the socket to its inner step
/// and does its part before (a socket option) or after (a handshake over
/// the inner I/O, an I/O wrapper). [`TcpAcceptor`](crate::TcpAcceptor) is
/// the innermost one the gateway uses by default;
/// [`RustlsAcceptor`](crate::RustlsAcceptor) is TLS over another.
/// [`Gateway::acceptor`](crate::Gateway::acceptor) installs one.
///
/// # Behavior
///
/// [`accept`](Accept::accept) runs on the serving thread the connection
/// was placed on, in the connection's own task, holding its connection
/// slot. A step that finishes on its first poll (plain TCP) costs no
/// timer; one that waits on the client (a handshake) runs, all steps
/// together, under the header timeout
/// ([`ConnectionLimits::header_timeout`]) and is dropped when the
/// gateway's shutdown token is cancelled: a step needs no timeout of its
/// own. An error closes the connection unserved (logged at `debug`);
/// that is also how a step refuses a client.
///
/// # Example
///
/// A step that counts the connections it sets up and leaves the rest to
/// plain TCP:
///
/// ```
/// use std::io;
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// use idem_gateway::{Accept, Accepted, Connecting, TcpAcceptor};
/// use tokio::net::TcpStream;
///
/// #[derive(Debug, Default)]
/// struct Counted {
///     inner: TcpAcceptor,
///     connections: AtomicU64,
/// }
///
/// impl Accept for Counted {
///     type Io = <TcpAcceptor as Accept>::Io;
///
///     async fn accept(
///         &self,
///         stream: TcpStream,
///         conn: &Connecting,
///     ) -> io::Result<Accepted<Self::Io>> {
///         self.connections.fetch_add(1, Ordering::Relaxed);
///         self.inner.accept(stream, conn).await
///     }
///
///     fn is_tls(&self) -> bool {
///         self.inner.is_tls()
///     }
/// }
/// ```
pub trait Accept: Send + Sync + 'static {
    /// The I/O the gateway serves HTTP on.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// Sets up `stream`, accepted from `conn`'s peer, for serving. Fails
    /// with whatever I/O error the step met (a failed handshake, a
    /// refused client): the connection is then closed.
    fn accept(
        &self,
        stream: TcpStream,
        conn: &Connecting,
    ) -> impl Future<Output = io::Result<Accepted<Self::Io>>> + Send;

    /// Whether the connections this step sets up are TLS ones: the
    /// forwarding headers then tell the upstream the client used `https`.
    /// A wrapper that adds no TLS answers what its inner step answers.
    fn is_tls(&self) -> bool;
}

/// What an [`Accept`] step is told about the connection it sets up.
#[derive(Debug, Clone, Copy)]
pub struct Connecting {
    peer: SocketAddr,
    limits: ConnectionLimits,
}

impl Connecting {
    /// A connection from `peer`, served under `limits`. The gateway makes
    /// these; this is for testing a step on its own.
    pub fn new(peer: SocketAddr, limits: ConnectionLimits) -> Connecting {
        Connecting { peer, limits }
    }

    /// The client's address, as the socket has it (the forwarding
    /// headers are written from it).
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The gateway's connection limits: the stall timeout for an I/O
    /// wrapper, say.
    pub fn limits(&self) -> &ConnectionLimits {
        &self.limits
    }
}

/// A connection set up by an [`Accept`] step: the I/O to serve, and what
/// its setup negotiated.
///
/// The negotiated ALPN protocol chooses the server: HTTP/2 for `h2`,
/// HTTP/1.1 for anything else. A wrapper over
/// another step keeps it by changing the I/O with [`Accepted::map`].
#[derive(Debug)]
pub struct Accepted<Io> {
    io: Io,
    alpn_protocol: Option<Vec<u8>>,
}

impl<Io> Accepted<Io> {
    /// `io`, with no protocol negotiated.
    pub fn new(io: Io) -> Accepted<Io> {
        Accepted {
            io,
            alpn_protocol: None,
        }
    }

    /// Records the ALPN protocol the setup negotiated (`b"h2"`,
    /// `b"http/1.1"`).
    pub fn with_alpn_protocol(mut self, protocol: Vec<u8>) -> Accepted<Io> {
        self.alpn_protocol = Some(protocol);
        self
    }

    /// The ALPN protocol the setup negotiated, if any (a TLS client that
    /// offered none, or no TLS, leaves it `None`).
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        self.alpn_protocol.as_deref()
    }

    /// The I/O, to look at.
    pub fn get_ref(&self) -> &Io {
        &self.io
    }

    /// The I/O, to change.
    pub fn get_mut(&mut self) -> &mut Io {
        &mut self.io
    }

    /// The I/O, without what was negotiated.
    pub fn into_inner(self) -> Io {
        self.io
    }

    /// The I/O changed by `f` (wrapped, say), with what was negotiated.
    pub fn map<T>(self, f: impl FnOnce(Io) -> T) -> Accepted<T> {
        Accepted {
            io: f(self.io),
            alpn_protocol: self.alpn_protocol,
        }
    }
}
